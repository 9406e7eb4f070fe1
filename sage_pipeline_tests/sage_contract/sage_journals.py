"""SAGE's own code for tests: the Python that ``SAGE_PYTHON`` names (SAGE installed from
``SAGE_SRC`` in a virtualenv of its own by scripts/sage_venv.sh, never the project's), and journals
its functions write (``write_sage_journals.py`` run with it).

One rule for every test that needs SAGE (``require_sage``; conftest's ``sage_python`` and
``sage_journals`` fixtures use it): ``SAGE_PYTHON`` unset is a skip that pytest's summary counts
(:data:`SAGE_SKIP`); set but broken, or ``SAGE_SRC`` set without it, is a failure, so a run that
means to test against SAGE can never skip silently.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

GENERATOR = Path(__file__).resolve().with_name("write_sage_journals.py")
SAGE_SKIP = ("SAGE contract test did not run: SAGE_PYTHON is unset. Run `make test SAGE_SRC=<a SAGE checkout>` "
             "or `make sage-contract SAGE_SRC=<a SAGE checkout>` (CI sets SAGE_SRC=../shared/upstream/sage)")


@cache
def sage_python() -> tuple[str | None, str]:
    """(the Python that can import sage, or None; why not)."""
    py = os.environ.get("SAGE_PYTHON", "").strip()
    if not py:
        return None, ("SAGE_SRC is set but SAGE_PYTHON is not: run the tests through `make test` or `make "
                      "sage-contract`, which build SAGE's virtualenv (scripts/sage_venv.sh) and export it")
    try:
        out = subprocess.run([py, "-c", "import sage.orchestrator.model_router, sage.rl.policy, os; "
                              "print(os.path.dirname(sage.__file__))"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"SAGE_PYTHON={py} cannot run: {exc}"
    if out.returncode != 0:
        return None, f"SAGE_PYTHON={py} cannot import SAGE: {out.stderr.strip()[-300:]}"
    return py, out.stdout.strip()


def require_sage() -> tuple[str, Path]:
    """The SAGE Python and SAGE's bundled models.yaml, else skip or fail by the rule above."""
    py, where = sage_python()
    if py is None:
        if os.environ.get("SAGE_PYTHON", "").strip() or os.environ.get("SAGE_SRC", "").strip():
            pytest.fail(where)
        pytest.skip(SAGE_SKIP)
    return py, Path(where) / "config" / "models.yaml"


def flags(**options) -> list[str]:
    """The writer's flags from keyword options: ``days=3`` -> ``--days 3``, ``no_session_id=True``
    -> ``--no-session-id``; False and None are left out."""
    out: list[str] = []
    for k, v in options.items():
        if v is True:
            out.append("--" + k.replace("_", "-"))
        elif v not in (False, None):
            out += ["--" + k.replace("_", "-"), str(v)]
    return out


def write_journals(workspace: Path, *args: str, **options) -> dict:
    """Run the generator into ``workspace`` (memory/sessions/*.log) with ``args`` and ``options``
    (:func:`flags`); returns its summary line."""
    py, _ = require_sage()
    out = subprocess.run([py, str(GENERATOR), "--workspace", str(workspace), *args, *flags(**options)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"SAGE's journal writer failed: {out.stderr[-2000:]}"
    return json.loads(out.stdout.strip().splitlines()[-1])


def raw_events(sessions: Path) -> list[tuple[str, int, dict | str]]:
    """Every line of the journals as (file, line, JSON object or text), in SAGE's writing order."""
    from sage_pipeline.routing.ingest import journal_order

    out = []
    for f in sorted(sessions.glob("*.log"), key=journal_order):
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            out.append((f.name, i, json.loads(line) if line.startswith("{") else line))
    return out


def expected_decisions(sessions: Path) -> dict:
    """What the dataset must hold, counted straight from the journals: every reviewer verdict is the
    outcome of the assigned agent's decision (coder or documentation) unless it verifies a debugger's
    patch; every debugger MODEL_ROUTING_DECISION is the debugger's decision; every circuit breaker
    'timeout' is a decision SAGE did not log (the call timed out before task.model_used was set)."""
    last: dict[tuple[str, str], dict] = {}
    author = Counter()
    timeouts = 0
    debugger_mrds = 0
    for _, _, e in raw_events(sessions):
        if not isinstance(e, dict):
            continue
        sid = e.get("session_id") or "day"
        if e["type"] == "MODEL_ROUTING_DECISION" and e["agent_role"] == "debugger":
            debugger_mrds += 1
        if e["type"] != "TRAJECTORY_STEP":
            continue
        key = (sid, e["task_id"])
        prev = last.get(key)
        if e["agent"] == "reviewer":
            patch = prev is not None and prev["agent"] == "debugger" and prev["state"]["debug_status"] == "patch_ready"
            if not patch:
                author["coder" if e["action"]["prompt_strategy_key"].startswith("coder:") else "documentation"] += 1
        if e["agent"] == "orchestrator" and e["state"]["failed_reason"] == "timeout":
            timeouts += 1
        if e["terminal"]:
            last.pop(key, None)  # the task's episode ended: the same id again is a new episode
        else:
            last[key] = e
    return {"coder": author["coder"], "documentation": author["documentation"], "debugger": debugger_mrds,
            "timeouts": timeouts}
