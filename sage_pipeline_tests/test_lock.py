"""constraints.txt is the lock file: every package that sage_pipeline[dev] needs, transitively, is
pinned there to exactly one version, and that is the version installed here (what the tests ran
against). A dependency added to pyproject.toml without regenerating the lock (scripts/lock.sh)
fails here."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

LOCK = Path(__file__).resolve().parents[1] / "constraints.txt"


def _pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for n, line in enumerate(LOCK.read_text().splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        assert m, f"constraints.txt:{n}: {line!r} is not an exact pin 'name==version' (regenerate with scripts/lock.sh)"
        name = canonicalize_name(m.group(1))
        assert name not in pins, f"constraints.txt:{n}: {m.group(1)} is pinned twice"
        pins[name] = m.group(2)
    return pins


def _closure(root: str, extras: set[str]) -> dict[str, set[str]]:
    """Every distribution ``root[extras]`` requires on this interpreter, with who requires it."""
    need: dict[str, set[str]] = {}
    todo = [(canonicalize_name(root), frozenset(extras), "")]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        name, ex, parent = todo.pop()
        need.setdefault(name, set()).add(parent)
        if (name, ex) in seen:
            continue
        seen.add((name, ex))
        for spec in metadata.requires(name) or []:
            req = Requirement(spec)
            envs = [{"extra": e} for e in ex] or [{"extra": ""}]
            if req.marker is None or any(req.marker.evaluate(e) for e in envs):
                todo.append((canonicalize_name(req.name), frozenset(req.extras), name))
    return need


def test_the_lock_pins_every_dependency_to_the_installed_version():
    pins = _pins()
    need = _closure("sage_pipeline", {"dev", "celery"})
    need.pop(canonicalize_name("sage_pipeline"))
    missing = sorted(f"{n} (required by {', '.join(sorted(p))})" for n, p in need.items() if n not in pins)
    assert not missing, f"not pinned in constraints.txt (regenerate with scripts/lock.sh): {missing}"
    drift = sorted(f"{n}: locked {pins[n]}, installed {metadata.version(n)}" for n in need
                   if Version(metadata.version(n)).public != Version(pins[n]).public)
    assert not drift, f"the installed set is not the locked one (make install, or regenerate the lock): {drift}"


def test_torch_stays_pinned_to_the_cpu_build_the_makefile_installs():
    assert _pins()["torch"] == "2.13.0"
    makefile = (LOCK.parent / "Makefile").read_text()
    assert "torch==2.13.0" in makefile, "the Makefile no longer installs torch==2.13.0 before the project"
