"""Every lever SAGE runs unchanged, as one deployment bundle, switched atomically.

SAGE's outcomes change only through what it reads (docs/architecture.md, "Serving back to SAGE"):

* ``models.yaml`` through ``SAGE_MODELS_YAML`` (``config/paths.py``): every role's primary, fallback and
  triggers, the coder's included (its UCB bandit chooses between the coder's two models);
* the router checkpoint through ``SAGE_RL_POLICY=1``, ``SAGE_RL_CHECKPOINT`` and
  ``SAGE_RL_MIN_CONFIDENCE`` (``rl/policy.py``; never the coder);
* the skills tree through ``SAGE_SKILLS_ROOT`` (``prompt_engine/skill_injector.py``);
* the coder's bandit state, ``memory/rl/ucb_bandit.json`` in each workspace (:mod:`.bandit_state`).

A **bundle** is a folder holding those parts and ``bundle.json``: each part's file and sha256, the
table the bundle was learned for (the one SAGE ran when its logs were written: a bundle is bound to
it), the objective it was chosen under, its exploration, and why. Its id is the sha256 of its parts.

**Deploying** (:func:`deploy`, ``python -m sage_pipeline.sage.bundle deploy``) to a root folder:

1. the target SAGE's table is read the way SAGE reads it (with ``--sage-python``, by SAGE's own
   ``ModelRouter`` under the target's environment, test profiles included), and the bundle is
   refused, naming every role and model that differ, when it is not the table the bundle was learned
   for (or the bundle's own table: deploying the same bundle twice is a no-op);
2. the bundle is copied to ``<root>/versions/<id>/`` (never rewritten afterwards);
3. ``<root>/sage.env`` is replaced in one rename: the ``export`` lines naming that version's files. A
   SAGE started with ``. <root>/sage.env`` reads the whole of one version for its whole run: the old
   bundle or the new one, never a mix (the file is replaced, never edited, and the paths in it never
   change content);
4. ``<root>/current`` is switched to the version (a symlink replaced in one rename), for people;
5. the bandit state, when the bundle has one, is written into each workspace named (atomically per
   file). It is not part of the switch: SAGE reads it once when it starts and rewrites it after every
   verdict, so it is the workspace's own memory, and a SAGE already running in that workspace
   overwrites it; deploy to workspaces no SAGE is running in;
6. the deployment is recorded: ``<root>/deployments.jsonl`` (bundle id, time, parts), and the
   checkpoint in the routing dataset's deployments record (``explore.record_deployment``), so every
   decision SAGE logs from then on gets its exact probability back.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from sage_pipeline import artifacts
from sage_pipeline.sage import bandit_state, checkpoint as ck, explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable

FORMAT = 1
MANIFEST = "bundle.json"
MODELS_YAML = "models.yaml"
CHECKPOINT_DIR = "checkpoint"
BANDIT_FILE = "ucb_bandit.json"
SKILLS_DIR = "skills"
ENV_FILE = "sage.env"
RECORD = "deployments.jsonl"


class BundleError(ValueError):
    """A bundle that cannot be built, read or deployed; the message says what and what to do."""


class BundleRefused(BundleError):
    """The target SAGE runs another table than the one the bundle was learned for."""

    def __init__(self, bundle: str, target: str, differences: list[str]) -> None:
        self.differences = differences
        super().__init__(
            f"bundle {bundle} was learned for another table than the one SAGE runs ({target}): "
            + "; ".join(differences) + ". Deploying it would change SAGE's behaviour in ways nobody measured. "
            "Fix: run the chain on the journals of the SAGE you deploy to (its table), or point that SAGE at the "
            "bundle's table first (SAGE_MODELS_YAML).")


@dataclass(frozen=True)
class Bundle:
    folder: Path
    manifest: dict

    @property
    def id(self) -> str:
        return self.manifest["id"]

    def part(self, name: str) -> Path | None:
        p = self.manifest["parts"].get(name)
        return None if p is None else self.folder / p["path"]

    @property
    def table(self) -> RoutingTable:
        return RoutingTable.load(self.folder / MODELS_YAML)

    @property
    def learned_for(self) -> RoutingTable:
        return RoutingTable.from_dict({"routing": self.manifest["learned_for"]["routing"]},
                                      source=self.manifest["learned_for"]["path"])

    def env(self, folder: Path | None = None) -> dict[str, str]:
        """The environment that makes SAGE run this bundle from ``folder`` (default: its own)."""
        base = Path(os.path.abspath(folder or self.folder))
        out = {"SAGE_MODELS_YAML": str(base / MODELS_YAML)}
        cp = self.manifest["parts"].get("checkpoint")
        if cp is not None:
            out |= {"SAGE_RL_POLICY": "1", "SAGE_RL_CHECKPOINT": str(base / cp["path"] / ck.JOBLIB_NAME),
                    "SAGE_RL_MIN_CONFIDENCE": repr(float(cp["min_confidence"]))}
        if self.manifest["parts"].get("skills") is not None:
            out["SAGE_SKILLS_ROOT"] = str(base / SKILLS_DIR)
        return out


def _tree_sha256(path: Path) -> str:
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode() + b"\0")
        h.update(artifacts.file_sha256(f).encode() + b"\0")
    return h.hexdigest()


def _hook_roles(table: RoutingTable) -> RoutingTable:
    return RoutingTable({r: v for r, v in table.routes.items() if r in ck.SAGE_HOOK_ROLES}, source=table.source)


def build(out: str | Path, table: RoutingTable, learned_for: RoutingTable, *, objective: TaskObjective,
          checkpoint: str | Path | None = None, min_confidence: float | None = None,
          bandit: dict | None = None, skills: str | Path | None = None, exploration: dict | None = None,
          why: str = "") -> Bundle:
    """Write a bundle to ``out`` (atomically: a killed build leaves the old folder or none). ``table``:
    the models.yaml SAGE will run; ``learned_for``: the table SAGE ran when the logs it was learned
    from were written; ``checkpoint``: a SAGE checkpoint folder written for ``table``; ``bandit``: the
    coder's bandit stats (:func:`bandit_state.warm_start`); ``skills``: a skills root (SAGE's three
    folders of ``SKILL.md``); ``exploration``: what the bundle explores and what that costs."""
    parts: dict[str, dict | None] = {"models_yaml": None, "checkpoint": None, "bandit_state": None, "skills": None}
    with artifacts.atomic_dir(out) as tmp:
        table.write(tmp / MODELS_YAML, header="SAGE's models.yaml, written by sage_pipeline (a deployment bundle: "
                    "bundle.json beside this file says what it was learned for and why).")
        parts["models_yaml"] = {"path": MODELS_YAML}
        if checkpoint is not None:
            src = ck._folder(checkpoint)
            manifest = ck.read_manifest(src)
            # the roles SAGE asks the checkpoint about must route as the checkpoint's table does; the coder
            # (its bandit) and the memory optimizer never ask it, so a pinned coder keeps the checkpoint valid
            written_for = RoutingTable.from_dict({"routing": manifest["sage_table"]["routing"]},
                                                 source=f"{src}'s table")
            ck.check_table(_hook_roles(written_for), _hook_roles(table))
            shutil.copytree(src, tmp / CHECKPOINT_DIR)
            floor = float(manifest["min_confidence"] if min_confidence is None else min_confidence)
            parts["checkpoint"] = {"path": CHECKPOINT_DIR, "min_confidence": floor, "kind": manifest.get("kind"),
                                   "policy_sha256": manifest.get("sha256")}
        if bandit is not None:
            bandit_state.write(tmp / BANDIT_FILE, bandit)
            parts["bandit_state"] = {"path": BANDIT_FILE}
        if skills is not None:
            src = Path(skills)
            if not any(src.glob("*/*/SKILL.md")) and not any(src.glob("*/SKILL.md")):
                raise BundleError(f"{src}: no SKILL.md under it; SAGE_SKILLS_ROOT mirrors SAGE's "
                                  "assets/skills/{discipline,workflow,planning}/<skill>/SKILL.md")
            shutil.copytree(src, tmp / SKILLS_DIR)
            parts["skills"] = {"path": SKILLS_DIR}
        for p in parts.values():
            if p is not None:
                p["sha256"] = _tree_sha256(tmp / p["path"])
        ident = hashlib.sha256(json.dumps({k: None if v is None else v["sha256"] for k, v in parts.items()},
                                          sort_keys=True).encode()).hexdigest()
        manifest = {"format": FORMAT, "id": ident, "created": datetime.now(timezone.utc).isoformat(),
                    "parts": parts, "learned_for": ck.table_digest(learned_for), "objective": objective.model_dump(),
                    "exploration": exploration, "why": why}
        artifacts.write_json(tmp / MANIFEST, manifest)
    return read(out)


def read(folder: str | Path) -> Bundle:
    """A bundle, every part checked against its sha256 (a part changed since it was built is refused)."""
    folder = Path(folder)
    path = folder / MANIFEST
    if not path.is_file():
        raise BundleError(f"{folder} is not a bundle (no {MANIFEST}): build one (make run writes "
                          "datasets/checkpoints/bundle)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BundleError(f"{path}: not JSON ({exc.msg}, line {exc.lineno}): build the bundle again") from exc
    if manifest.get("format") != FORMAT:
        raise BundleError(f"{path}: field 'format' is {manifest.get('format')!r}, this version reads {FORMAT}")
    for key in ("id", "parts", "learned_for", "objective"):
        if key not in manifest:
            raise BundleError(f"{path}: field {key!r} is missing: build the bundle again")
    if not isinstance(manifest["parts"], dict):
        raise BundleError(f"{path}: field 'parts' must map each part's name to its path and sha256")
    for name, p in manifest["parts"].items():
        if p is None:
            continue
        if not (isinstance(p, dict) and isinstance(p.get("path"), str) and isinstance(p.get("sha256"), str)):
            raise BundleError(f"{path}: field 'parts.{name}' needs a 'path' and a 'sha256': build the bundle again")
        where = folder / p["path"]
        if not where.exists():
            raise BundleError(f"{path}: part {name!r} ({where}) is missing: build the bundle again")
        if _tree_sha256(where) != p["sha256"]:
            raise BundleError(f"{path}: part {name!r} ({where}) changed since the bundle was built (sha256 differs): "
                              "build the bundle again instead of editing it")
    return Bundle(folder, manifest)


def target_table(sage_python: str | None = None, env: dict | None = None) -> RoutingTable:
    """The table the target SAGE runs. With ``sage_python``: asked of SAGE's own code under ``env``
    (``ModelRouter().config``: ``SAGE_MODELS_YAML``, the user's config dir, the packaged file, test
    profiles applied). Without: ``SAGE_MODELS_YAML`` or the user's config dir, as ``config/paths.py``
    resolves them; SAGE's packaged table needs ``sage_python`` to be found."""
    env = dict(os.environ if env is None else env)
    if sage_python:
        code = ("import json\nfrom sage.orchestrator.model_router import ModelRouter\n"
                "from sage.config.paths import resolved_models_yaml_path as p\n"
                "print(json.dumps({'path': str(p()), 'config': ModelRouter().config}))")
        out = subprocess.run([sage_python, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise BundleError(f"{sage_python} could not read SAGE's table: {out.stderr.strip()[-400:]}")
        got = json.loads(out.stdout.strip().splitlines()[-1])
        return RoutingTable.from_dict(got["config"], source=got["path"])
    override = (env.get("SAGE_MODELS_YAML") or "").strip()
    if override:
        return RoutingTable.load(Path(override).expanduser())
    xdg = (env.get("XDG_CONFIG_HOME") or "").strip()
    user = (Path(xdg) if xdg else Path(env.get("HOME", str(Path.home()))) / ".config") / "sage" / "models.yaml"
    if user.is_file():
        return RoutingTable.load(user)
    raise BundleError("the target SAGE reads its packaged models.yaml (no SAGE_MODELS_YAML, no "
                      f"{user}): give --sage-python (the target SAGE's interpreter) so its table can be read")


def read_env_file(path: str | Path) -> dict[str, str]:
    """The ``export K=V`` lines of a deployed ``sage.env``."""
    out = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            out[k] = v
    return out


def deploy(bundle: str | Path | Bundle, root: str | Path, *, target: RoutingTable,
           workspaces: tuple[str | Path, ...] = (), data_dir: str | Path | None = None,
           deployed_from: datetime | None = None) -> dict:
    """Deploy ``bundle`` under ``root`` for a SAGE running ``target`` (see the module doc). Returns
    the deployment's record line."""
    b = bundle if isinstance(bundle, Bundle) else read(bundle)
    root = Path(os.path.abspath(root))
    problems = ck.table_differences(b.learned_for, target)
    if problems and ck.table_differences(b.table, target):
        raise BundleRefused(b.id[:12], str(target.source), problems)
    version = root / "versions" / b.id
    if not (version / MANIFEST).is_file():
        with artifacts.atomic_dir(version) as tmp:
            shutil.copytree(b.folder, tmp, dirs_exist_ok=True)
    read(version)  # the copy is whole
    env = b.env(version)
    now = deployed_from or datetime.now(timezone.utc)
    header = (f"# SAGE's deployment bundle {b.id} (deployed {now.isoformat()}). Start SAGE with "
              f"`. {root / ENV_FILE}`:\n# every path below is a version that never changes, so one SAGE run "
              "reads one whole bundle.\n")
    unset = [k for k in ("SAGE_RL_POLICY", "SAGE_RL_CHECKPOINT", "SAGE_RL_MIN_CONFIDENCE", "SAGE_SKILLS_ROOT")
             if k not in env]
    text = header + "".join(f"unset {k}\n" for k in unset) + "".join(f"export {k}={v}\n" for k, v in env.items())
    artifacts.write_text(root / ENV_FILE, text)
    link = root / f".current.tmp-{os.getpid()}"
    if link.is_symlink() or link.exists():
        link.unlink()
    os.symlink(Path("versions") / b.id, link)
    os.replace(link, root / "current")
    installed = []
    src = b.part("bandit_state")
    for ws in workspaces:
        if src is None:
            break
        dest = Path(ws).joinpath(*bandit_state.STATE_PATH)
        dest.parent.mkdir(parents=True, exist_ok=True)
        artifacts.write_bytes(dest, src.read_bytes())
        installed.append(str(dest))
    dep = None
    if data_dir is not None:
        cp = b.manifest["parts"].get("checkpoint")
        dep = explore.record_deployment(data_dir, None if cp is None else version / cp["path"], now,
                                        None if cp is None else cp["min_confidence"])
    line = {"bundle": b.id, "deployed_from": now.isoformat(), "version": str(version), "env": env,
            "bandit_state_written_to": installed, "routing_record": None if dep is None else dep.to_dict(),
            "learned_for": b.manifest["learned_for"]["routing_sha256"]}
    rec = root / RECORD
    old = rec.read_text(encoding="utf-8") if rec.is_file() else ""
    artifacts.write_text(rec, old + json.dumps(line) + "\n")
    return line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m sage_pipeline.sage.bundle",
                                 description="SAGE's deployment bundle: models.yaml, router checkpoint, coder "
                                             "bandit state and skills root, switched as one.")
    sub = ap.add_subparsers(dest="command", required=True)
    d = sub.add_parser("deploy", help="deploy BUNDLE under ROOT (then start SAGE with `. ROOT/sage.env`)")
    d.add_argument("bundle", help="the bundle folder (make run writes datasets/checkpoints/bundle)")
    d.add_argument("root", help="where deployed versions, sage.env and the record live")
    d.add_argument("--sage-python", default=os.environ.get("SAGE_PYTHON"),
                   help="the target SAGE's interpreter: its own code reads the table it runs (default: SAGE_PYTHON)")
    d.add_argument("--target-env", default=None, help="an env file the target SAGE runs with (default: ROOT/sage.env "
                   "when it exists, else this process's environment)")
    d.add_argument("--workspace", action="append", default=[], help="a SAGE workspace to write the bandit state into")
    d.add_argument("--data-dir", default=os.environ.get("SAGE_DATA_DIR"),
                   help="the pipeline's artifact root, to record the checkpoint for the routing dataset")
    s = sub.add_parser("show", help="print a bundle's manifest")
    s.add_argument("bundle")
    args = ap.parse_args(argv)
    try:
        if args.command == "show":
            print(json.dumps(read(args.bundle).manifest, indent=2))
            return 0
        env = dict(os.environ)
        env_file = Path(args.target_env) if args.target_env else Path(args.root) / ENV_FILE
        if env_file.is_file():
            env.update(read_env_file(env_file))
        target = target_table(args.sage_python, env)
        line = deploy(args.bundle, args.root, target=target, workspaces=tuple(args.workspace),
                      data_dir=args.data_dir)
    except (BundleError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"deployed bundle {line['bundle'][:12]} under {args.root}; start SAGE with: . {Path(args.root) / ENV_FILE}")
    for k, v in line["env"].items():
        print(f"export {k}={v}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
