"""Make the SAGE week ``make run`` learns from by default: days of SAGE's own ``sage run`` in the model world,
packed as one archive and its manifest under ``sage_pipeline/sage/data/``.

    make sage-week SAGE_SRC=<a SAGE checkout> [DAYS=5 RUNS=40]
    .venv/bin/python scripts/make_sage_week.py --sage-src ../shared/upstream/sage [--days 5] [--runs 40]

SAGE is installed from the checkout into its own virtualenv (``scripts/sage_venv.sh`` -> ``.sage/venv``, never
``.venv``) with its models.yaml as shipped; the days are :func:`sage_pipeline.sage_world.sage_week.run_days`'s (its
module doc says what SAGE runs: the router exploring around SAGE's YAML, the coder drawn 50/50 per run, both
recorded). Written:

* ``sage_week.tar.xz``: ``workspaces/day-NN/ws-W/`` every file of each SAGE workspace as SAGE left it (its
  journals in ``memory/sessions/``, the task's code and tests, SAGE's memory and bandit state), byte for byte,
  but the caches of the Python that runs SAGE's verification command (``__pycache__/``, ``.pytest_cache/``);
  ``records/day-NN/runs.jsonl`` (the harness's record of each run: its task, sessions, coder model, verdict),
  ``goals.jsonl`` (the goal ledger: the exact goal each ``sage run`` was given, by SAGE session id, as
  ``sleep.sage_harvest.write_goal_ledger`` writes it: SAGE logs no goal) and ``assignments.jsonl`` (each run's
  recorded coder draw); ``records/pins/`` the two coder arms' models.yaml;
  ``checkpoint/`` the exploring checkpoint SAGE ran and ``deployments.jsonl`` its windows (paths relative to the
  week's root). Members sorted, owner 0, mtime the generation's, so the archive is the same for the same files.
* ``sage_week.json``: the manifest (:data:`sage_pipeline.sage.week.MANIFEST_NAME`): the archive's sha256 and size,
  each member's sha256 and size, SAGE's source (commit, version, the sha256 of its models.yaml), the days and
  runs, the world's seed and settings, the settings SAGE ran with, and the world's exact truth per day and over
  the week (``sage_week.truth_of``).

The scratch folder (``--scratch``, default a temporary one) is removed unless ``--keep``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import lzma
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sage_pipeline import artifacts  # noqa: E402
from sage_pipeline.sage import week as W  # noqa: E402
from sage_pipeline.sleep.sage_harvest import write_goal_ledger  # noqa: E402


def sage_python(src: str | None) -> str:
    if src:
        out = subprocess.run([str(ROOT / "scripts" / "sage_venv.sh"), src, str(ROOT / ".sage")],
                             capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"could not install SAGE from {src}: {out.stderr.strip()[-500:]}")
        return out.stdout.strip().splitlines()[-1]
    py = os.environ.get("SAGE_PYTHON", "")
    if not py:
        sys.exit("give --sage-src <a SAGE checkout> (or SAGE_PYTHON): SAGE is installed into .sage/venv, never .venv")
    return py


def sage_source(src: str | None, python: str) -> dict:
    """What SAGE the week was written with: its commit (git, else the commit a README beside the checkout
    names), its installed version, and its source tree's hash (scripts/sage_venv.sh's stamp)."""
    out: dict = {"src": src}
    if src:
        git = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True, text=True)
        if git.returncode == 0 and git.stdout.strip():
            out["commit"], out["commit_from"] = git.stdout.strip(), "git rev-parse HEAD"
        else:
            readme = Path(src).resolve().parent / "README.md"
            m = re.search(r"commit\s+([0-9a-f]{40})", readme.read_text(encoding="utf-8")) if readme.is_file() else None
            if m:
                out["commit"], out["commit_from"] = m.group(1), str(readme.name) + " beside the checkout"
    stamp = ROOT / ".sage" / "stamp"
    if stamp.is_file():
        out["source_tree_hash"] = stamp.read_text(encoding="utf-8").strip()
    ver = subprocess.run([python, "-c", "import importlib.metadata as m; print(m.version('sage'))"],
                         capture_output=True, text=True)
    out["version"] = ver.stdout.strip() if ver.returncode == 0 else None
    return out


# written in a workspace by the Python that runs SAGE's verification command (pytest's caches, bytecode), not by
# SAGE: no SAGE format, and bytecode names the scratch folder; left out
NOT_SAGES = {"__pycache__", ".pytest_cache"}


def members(res, scratch: Path) -> list[tuple[str, Path]]:
    """(name in the archive, file) for everything the week ships, sorted by name."""
    from sage_pipeline.sage_world import sage_week as SW

    out: list[tuple[str, Path]] = []
    for d in res.days:
        folder, day = Path(d["folder"]), f"day-{d['day']:02d}"
        for ws in sorted(folder.glob("ws-*")):
            for f in sorted(ws.rglob("*")):
                if f.is_symlink():
                    raise SystemExit(f"{f}: SAGE's workspace holds a link; the week ships regular files only")
                if f.is_file() and not set(f.relative_to(ws).parts) & NOT_SAGES:
                    out.append((f"{W.WORKSPACES}/{day}/{f.relative_to(folder)}", f))
        runs = SW.write_runs(scratch / "records" / day / "runs.jsonl", d["runs"], res.root)
        out.append((f"{W.RECORDS}/{day}/runs.jsonl", runs))
        goals = write_goal_ledger(scratch / "records" / day / W.GOALS_NAME, d["goals"])
        out.append((f"{W.RECORDS}/{day}/{W.GOALS_NAME}", goals))
        if (folder / "assignments.jsonl").is_file():
            out.append((f"{W.RECORDS}/{day}/assignments.jsonl", folder / "assignments.jsonl"))
    for f in sorted((res.root / "data" / "decisions").rglob("pins/*.yaml")):
        out.append((f"{W.RECORDS}/pins/{f.name}", f))
    for name in ("policy.joblib", "manifest.json"):
        out.append((f"{W.CHECKPOINT}/{name}", res.checkpoint / name))
    deps = SW.write_deployments(res, scratch / "deployments.jsonl", res.root, f"{W.CHECKPOINT}/policy.joblib")
    out.append((W.DEPLOYMENTS, deps))
    return sorted(out)


def pack(files: list[tuple[str, Path]], archive: Path, mtime: int) -> dict:
    """The tar.xz of ``files`` (deterministic headers), written atomically; each member's sha256 and size."""
    listing = {}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, path in files:
            data = path.read_bytes()
            info = tarfile.TarInfo(f"{W.TOP}/{name}")
            info.size, info.mtime, info.mode, info.uid, info.gid = len(data), mtime, 0o644, 0, 0
            tar.addfile(info, io.BytesIO(data))
            listing[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    xz = lzma.compress(buf.getvalue(), preset=9 | lzma.PRESET_EXTREME)
    with artifacts.atomic_open(archive, "wb") as fh:
        fh.write(xz)
    return listing


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sage-src", default=None, help="a SAGE checkout (CI: ../shared/upstream/sage)")
    ap.add_argument("--days", type=int, default=None, help="days (default WeekConfig's)")
    ap.add_argument("--runs", type=int, default=None, help="`sage run`s a day (default WeekConfig's)")
    ap.add_argument("--pool", type=int, default=None, help="generated tasks the days draw from")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--out-dir", default=str(W.DATA_DIR), help="where the archive and manifest go")
    ap.add_argument("--scratch", default=None, help="the folder SAGE works in (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep the scratch folder")
    a = ap.parse_args(argv)

    from sage_pipeline.sage_world import sage_week as SW
    from sage_pipeline.sage_world.harness import SageInstall

    install = SageInstall.find(sage_python(a.sage_src))
    given = {k: v for k, v in {"days": a.days, "runs_per_day": a.runs, "pool": a.pool, "seed": a.seed}.items()
             if v is not None}
    cfg = SW.WeekConfig(**given)
    scratch = Path(a.scratch or tempfile.mkdtemp(prefix="sage_week."))
    t0 = time.perf_counter()
    try:
        res = SW.run_days(install, scratch / "days", cfg, progress=lambda m: print(m, flush=True))
        files = members(res, scratch)
        out_dir = Path(a.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        archive = out_dir / W.ARCHIVE_NAME
        listing = pack(files, archive, int(time.time()))
        runs = [r for d in res.days for r in d["runs"]]
        manifest = {
            "format": W.FORMAT, "archive": W.ARCHIVE_NAME, "archive_sha256": artifacts.file_sha256(archive),
            "archive_bytes": archive.stat().st_size, "top": W.TOP,
            "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "generated_by": "scripts/make_sage_week.py (make sage-week)",
            "sage": {**sage_source(a.sage_src, str(install.python)),
                     "models_yaml_sha256": artifacts.file_sha256(install.models_yaml), "models_yaml": "as shipped"},
            "settings": cfg.model_dump(), "world": res.world,
            "days": [f"day-{d['day']:02d}" for d in res.days],
            "runs": len(runs), "runs_per_day": {f"day-{d['day']:02d}": len(d["runs"]) for d in res.days},
            "finished_per_day": {f"day-{d['day']:02d}": d["summary"]["finished"] for d in res.days},
            "failures": {f"day-{d['day']:02d}": d["summary"]["failures"] for d in res.days},
            "journal_lines": sum(r["journal_lines"] for r in runs),
            "sessions": sum(len(r["sessions"]) for r in runs),
            "coder_runs": {m: sum(r.get("coder_model") == m for r in runs) for m in res.coder_models},
            "deployments": [{**d, "path": f"{W.CHECKPOINT}/policy.joblib"} for d in res.deployments],
            "truth": res.truth, "files": listing, "seconds": round(time.perf_counter() - t0, 1)}
        artifacts.write_json(out_dir / W.MANIFEST_NAME, manifest)
        print(f"\nthe SAGE week: {archive} ({archive.stat().st_size / 1e6:.2f} MB, {len(listing)} files, "
              f"{len(runs)} runs over {len(res.days)} days, {manifest['journal_lines']} journal lines) and "
              f"{out_dir / W.MANIFEST_NAME}; {manifest['seconds'] / 60:.1f} min")
    finally:
        if not a.keep and a.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
        elif a.keep:
            print(f"scratch kept: {scratch}")


if __name__ == "__main__":
    main()
