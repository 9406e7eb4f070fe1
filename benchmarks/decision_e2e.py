"""Decisions end to end with SAGE's real `sage run` (issue 47, "Done when: end to end"): SAGE's unchanged
`sage run` (installed from a SAGE checkout into a virtualenv of its own, never the project's) in the model world
for --nights nights of --runs runs, the coder's model decided by the decision ledger on runs it assigned at random
through SAGE_MODELS_YAML, a drift injected at --drift-night, every decision beside the world's exact truth.

Each night (``sage_world/ledger_nights.py`` says it step by step): the ledger's plan (50/50 between two models.yaml
files that pin SAGE's coder while a round is pending, 70/30 after a pin) gives every run a recorded draw of exact
probability (integer thresholds out of 2**32, one line in assignments.jsonl before any run starts), exported to the
run as SAGE_MODELS_YAML and SAGE_TRACE_ID; SAGE runs the night's tasks; the project's own ingest reads the
journals SAGE wrote (routing.ingest, the routing dataset, the task outcomes); each session's trace_id as SAGE
logged it joins the run to its draw; the ledger adds the randomised runs as evidence, decides and is saved.
Only the coder lever is randomised: SAGE's YAML router and its packaged skills hold on every run, so no other
lever changes on the same runs.

**The world's settings, and why.** With the world's calibrated coder gap (the 14B about +0.06 in verified share
over the 1.5B) one pin needs about 900 runs (issue 47), more than 10 nights x 40. So the world handicaps one
coder model (``WorldConfig.coder_shift``): its chance of a right first file is its calibrated chance minus
--coder-gap (0.65). Before --drift-night (5) the handicap is on the 1.5B (the 14B then verifies about 0.25 more
of the tasks), from it on on the 14B, the 1.5B back at its calibrated chance (the 14B then verifies about 0.14
fewer): a pin of the 14B turns harmful under it. The reviewer's and debugger's figures are the calibration's.
These settings were chosen before the run, from the exact truth of the two pinned tables on the task pool, so
that an accept and a revert are possible within the nights; what the ledger did is reported as it happened.
The ledger, the coder lever and their levels are the shipped defaults (``LedgerConfig``,
``CoderDecisionsConfig``).

Prints, night by night: the world; the arms with their exact probability and the runs drawn to each; each arm's
exact verified share and GPU-seconds on that night's runs and the exact task_v1 gap; each candidate's state,
estimate and confidence sequence (task_v1), evidence of needed (on probation: the revert's), beside the exact
mean gain over the runs it was judged on; the transitions, each right or wrong against the truth; and the
checks: every run's journal carries its draw's trace id, SAGE's coder ran the model its arm's models.yaml pins,
and each candidate's evidence recomputed from the records and journals alone equals the ledger's.

    .venv/bin/python benchmarks/decision_e2e.py --sage-src ../shared/upstream/sage [--nights 10] [--runs 40]
        [--coder-gap 0.65] [--drift-night 5] [--pool 300] [--seed 0] [--workers 3] [--out DIR]

Results: printed, and written under --out (benchmarks/.scratch/decision_e2e/: decision_e2e.json, decision_e2e.md,
the ledger, every night's workspaces, records and ingest); docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from _cli import count  # benchmarks/ is the script's folder: first on sys.path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sage_pipeline import artifacts, markdown  # noqa: E402
from sage_pipeline.sage_world import ledger_nights as ln  # noqa: E402
from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall  # noqa: E402


def sage_python(src: str | None) -> str:
    """SAGE's Python: installed from ``src`` into .sage/venv by scripts/sage_venv.sh, else SAGE_PYTHON."""
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


def unit(text: str) -> float:
    x = float(text)
    if not 0.0 <= x <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1], got {x}")
    return x


def markdown_report(report: dict, s: dict, command: str) -> str:
    cfg = report["config"]
    lines = [f"# Decisions end to end with SAGE's real `sage run` ({report['finished_at']})", "",
             f"Command: `{command}`", "",
             f"World seed {cfg['seed']}, pool {cfg['pool']}, coder gap {cfg['coder_gap']} (first file), drift at "
             f"night {cfg['drift_night']}; {cfg['harness']['workers']} workers; wall {s['seconds'] / 60:.1f} min "
             f"(SAGE's runs {s['runs_seconds'] / 60:.1f} min, {s['runs_per_minute']} runs a minute).", "",
             markdown.table(ln.night_table(report)), "", "```json", json.dumps(s, indent=1), "```", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sage-src", default=None, help="a SAGE checkout (CI: ../shared/upstream/sage)")
    ap.add_argument("--nights", type=count, default=ln.DecisionE2EConfig().nights)
    ap.add_argument("--runs", type=count, default=ln.DecisionE2EConfig().runs_per_night, help="`sage run`s a night")
    ap.add_argument("--coder-gap", type=unit, default=ln.DecisionE2EConfig().coder_gap,
                    help="the handicapped coder model's first-file chance is its calibrated one minus this")
    ap.add_argument("--drift-night", type=int, default=ln.DecisionE2EConfig().drift_night,
                    help="the first night of the turned world (0: no drift)")
    ap.add_argument("--pool", type=count, default=ln.DecisionE2EConfig().pool,
                    help="generated tasks the nights draw from")
    ap.add_argument("--seed", type=int, default=ln.DecisionE2EConfig().seed)
    ap.add_argument("--workers", type=count, default=None, help="`sage run`s at once (default: HarnessConfig's)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / ".scratch" / "decision_e2e"))
    ap.add_argument("--render", default=None, metavar="JSON", help="only write the markdown (and the summary) again "
                    "from a report this script wrote (its decision_e2e.json), beside it; SAGE is not run")
    a = ap.parse_args(argv)
    if a.render:
        path = Path(a.render)
        report = json.loads(path.read_text(encoding="utf-8"))
        report["summary"] = s = ln.summary(report)
        artifacts.write_json(path, report)
        md = markdown_report(report, s, report.get("command", "?"))
        artifacts.write_text(path.with_suffix(".md"), md)
        print(md)
        return
    if a.drift_night is not None and a.drift_night < 0:
        ap.error("--drift-night: a night number >= 1, or 0 for no drift")

    install = SageInstall.find(sage_python(a.sage_src))
    out = Path(a.out)
    if out.exists():
        shutil.rmtree(out)
    harness = HarnessConfig(**({} if a.workers is None else {"workers": a.workers}))
    cfg = ln.DecisionE2EConfig(nights=a.nights, runs_per_night=a.runs, pool=a.pool, seed=a.seed,
                               coder_gap=a.coder_gap, drift_night=a.drift_night or None, harness=harness)
    t0 = time.perf_counter()
    report = ln.run(install, out, cfg, progress=lambda m: print(m, flush=True))
    report["finished_at"] = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    s = ln.summary(report)
    report["summary"] = s
    artifacts.write_json(out / ln.REPORT_NAME, report)
    report["command"] = command = "python benchmarks/decision_e2e.py " + " ".join(sys.argv[1:] if argv is None
                                                                                  else argv)
    artifacts.write_json(out / ln.REPORT_NAME, report)
    md = markdown_report(report, s, command)
    artifacts.write_text(out / "decision_e2e.md", md)
    print("\n" + md)
    print(f"report: {out / ln.REPORT_NAME}, {out / 'decision_e2e.md'}")


if __name__ == "__main__":
    main()
