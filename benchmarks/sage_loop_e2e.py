"""SAGE in the loop, end to end: SAGE's own `sage run` (installed from a SAGE checkout into a
virtualenv of its own) against the model world for --days days of --tasks tasks, the offline chain
(the project's Dagster assets) and its gate every night, the promoted checkpoint deployed back.

Prints, per day, side by side: runs finished and failures with their cause, journal lines; the true
value (the world's exact expected episode return) of the deployed policy, of SAGE's YAML and of the
best policy SAGE's router can express, and the share of that gap the deployment closes; the gate's
candidate: its OPE estimate (clipped step-wise DR, 95% interval) beside its true value on the same
report episodes, the ratio of the two, and whether the gate was right; and the truth's own check
(the mean return the routing dataset made of SAGE's journals against the world's expectation).
Then the issue's goals, measured.

    .venv/bin/python benchmarks/sage_loop_e2e.py --sage-src ../shared/upstream/sage [--days 7] [--tasks 100]
        [--workers 3] [--pool 300] [--start explore|yaml] [--fresh-process] [--out DIR]

Results: printed; the report (benchmarks/.scratch/sage_loop_e2e/sage_loop.json unless --out) and every
day's journals, runs and world truth beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


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


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sage-src", default=None, help="a SAGE checkout (CI: ../shared/upstream/sage)")
    ap.add_argument("--days", type=count, default=7)
    ap.add_argument("--tasks", type=count, default=100, help="`sage run`s a day")
    ap.add_argument("--workers", type=count, default=None, help="`sage run`s at once (default: HarnessConfig's)")
    ap.add_argument("--fresh-process", action="store_true", help="start every `sage run` as a process of its own "
                    "(SAGE imported each time) instead of forking it from a launcher (benchmarks/sage_launcher.py)")
    ap.add_argument("--pool", type=count, default=300, help="generated tasks the days draw from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", choices=("explore", "yaml"), default="explore")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / ".scratch" / "sage_loop_e2e"))
    a = ap.parse_args(argv)

    import logging

    logging.getLogger("dagster").setLevel(logging.WARNING)
    from sage_pipeline.defs.sage_loop_assets import clock_scale, offline_chain
    from sage_pipeline.sage_world import loop as sl
    from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall

    install = SageInstall.find(sage_python(a.sage_src))
    out = Path(a.out)
    if out.exists():
        shutil.rmtree(out)
    t0 = time.perf_counter()

    harness = HarnessConfig(fresh_process=a.fresh_process, **({} if a.workers is None else {"workers": a.workers}))
    cfg = sl.LoopConfig(days=a.days, tasks_per_day=a.tasks, pool=a.pool, seed=a.seed, start=a.start, harness=harness)
    # the task outcomes read GPU-seconds from the journals' time: divided by the world's clock scale
    ops = {"routing_dataset": {"task_outcomes": {"clock_scale": clock_scale(cfg)}}}

    def chain(data, dirs, rate):
        t = time.perf_counter()
        meta = offline_chain(data, dirs, rate, install.models_yaml, ops)
        print(f"  offline chain: {time.perf_counter() - t:.0f} s", flush=True)
        return meta

    report = sl.run_loop(install, out, chain, cfg, progress=lambda m: print(m, flush=True))
    secs = time.perf_counter() - t0
    how = "a process per run" if a.fresh_process else "forked from a launcher"
    runs_s = sum(d["runs"]["seconds"] for d in report.days)
    restarts = sum(d["runs"].get("launcher_restarts", 0) for d in report.days)
    print(f"\nSAGE's runs ({how}): {runs_s / 60:.1f} min of the days' time; launchers replaced: {restarts}")
    print(f"\nSAGE {install.cli} ({a.days} days x {a.tasks} tasks, {harness.workers} workers): {secs / 60:.1f} min "
          f"(goal <= 30 min: ratio {secs / 1800:.2f} of the budget)\n")
    keys = ("day", "finished", "failures", "V deployed", "V yaml", "V best", "gap closed", "candidate", "judged on",
            "OPE", "OPE 95% CI", "true", "OPE error", "promoted", "gate right")
    print(" | ".join(keys))
    for d in report.days:
        row = sl.day_row(d)
        print(" | ".join(str(row[k]) for k in keys))
    print(f"\nthe objective ({cfg.objective.describe()}), exact on each day's runs; the coder lever's estimate of the "
          "bundle it leads with beside that bundle's exact value on every run so far:")
    keys = ("day", "objective deployed", "objective shipped", "objective best", "verified deployed/shipped/best",
            "GPU-s deployed/shipped/best", "objective gap closed", "coder lever", "coder OPE", "coder true",
            "coder OPE error")
    print(" | ".join(keys))
    for d in report.days:
        row = sl.day_row(d)
        print(" | ".join(str(row[k]) for k in keys))
    print("\nSAGE's own Phase-5 tools on the same journals (`sage rl export`, `train-bc`, `train-cql`, "
          "`eval-offline`): SAGE's claimed delta, the rows it averages, and the exact truth of SAGE serving "
          "each checkpoint (sage_world/phase5.py says what SAGE's number is):")
    keys = ["day", "SAGE rows"] + [f"SAGE {k} {c}" for k in ("bc", "cql") for c in (
        "claim delta", "rows agreeing", "true return delta", "true objective vs YAML", "direction right")]
    print(" | ".join(keys))
    for d in report.days:
        row = sl.day_row(d)
        print(" | ".join(str(row.get(k)) for k in keys))
    print("\ntruth check (mean return from SAGE's journals vs the world's expectation, per day):")
    for d in report.days:
        c = d.get("truth_check", {})
        if c.get("runs"):
            print(f"  day {d['day']}: realized {c['realized_mean']:.4f}, expected {c['expected_mean']:.4f}, "
                  f"difference {c['difference']:+.4f} [{c['difference_ci'][0]:+.4f}, {c['difference_ci'][1]:+.4f}]"
                  f" -> {'agrees' if c['agrees'] else 'DISAGREES'}")
    failures: dict[str, int] = {}
    for d in report.days:
        for k, v in d["runs"]["failures"].items():
            failures[k] = failures.get(k, 0) + v
    print(f"\nfailures by cause: {failures or 'none'}")
    print("journal lines SAGE wrote / kept / quarantined: see each day's chain metadata in", out / sl.REPORT_NAME)
    print("\ngoals:", json.dumps(report.goals(), indent=1))


if __name__ == "__main__":
    main()
