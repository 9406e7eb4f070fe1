"""Sandbox throughput, side by side in one run: the warm pool with 1 and 2 workers against
one `docker run --rm` container per execution (same hardening flags, same jobs), and
the whole rollout of every candidate of every task with a cold execution cache.

    .venv/bin/python benchmarks/sandbox_throughput.py [--tasks 1200] [--sample 400] [--per-container 40]

Goal (issue 5): >= 100 executions/s with 2 workers, >= 20x container-per-task; all
candidates of 1,200 tasks in under 2 minutes.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sage_pipeline.sim import rollouts as ro
from sage_pipeline.sim.cache import ExecutionCache
from sage_pipeline.sim.sandbox import SandboxConfig, docker_run_args, open_sandbox
from sage_pipeline.sim.schema import ExecJob
from sage_pipeline.sim.tasks import generate_tasks


def container_per_task(jobs: list[ExecJob], must_pass: bool = False) -> float:
    """Executions per second when every execution gets its own fresh `docker run --rm` container
    (the same hardening flags and runner). ``must_pass``: each answer must be a pass."""
    cfg = SandboxConfig()
    t0 = time.perf_counter()
    for i, job in enumerate(jobs):
        args = docker_run_args(cfg, f"sage-bench-{i}-{time.time_ns()}", "bench-per-task")
        req = json.dumps({"id": 0, "code": job.code, "entry_point": job.entry_point, "tests": job.tests,
                          "timeout_s": job.timeout_s}) + "\n"
        out = subprocess.run(args, input=req, capture_output=True, text=True, timeout=120)
        lines = out.stdout.splitlines()
        answer = json.loads(lines[1]) if len(lines) == 2 else {}
        if "outcome" not in answer or (must_pass and answer["outcome"] != "pass"):
            raise SystemExit(f"container-per-execution baseline: unexpected answer {lines[-1:]} {out.stderr[-300:]}")
    return len(jobs) / (time.perf_counter() - t0)


def pool_rate(jobs: list[ExecJob], workers: int) -> tuple[float, float]:
    with open_sandbox("docker", workers=workers) as sb:
        t0 = time.perf_counter()
        results = sb.run(jobs)
        rate = len(jobs) / (time.perf_counter() - t0)
    busy = sum(r.runtime_s for r in results)
    return rate, busy


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1200)
    ap.add_argument("--sample", type=int, default=400, help="executions in the pool comparison")
    ap.add_argument("--per-container", type=int, default=40, help="executions in the container-per-task baseline")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = time.perf_counter()
    tasks = generate_tasks(args.tasks, seed=args.seed)
    print(f"generated {len(tasks)} tasks in {time.perf_counter() - t0:.1f} s")
    all_jobs = [j for t in tasks for j in ro.jobs_for(t)]
    rng = np.random.default_rng(args.seed)
    sample = [all_jobs[i] for i in rng.choice(len(all_jobs), size=min(args.sample, len(all_jobs)), replace=False)]

    per_task = container_per_task(sample[: args.per_container])
    one, _ = pool_rate(sample, 1)
    two, _ = pool_rate(sample, 2)
    print(f"\nexecutions/s on the same {len(sample)} sampled candidates (timeouts included):")
    print(f"  docker run --rm per execution : {per_task:7.1f}/s  (first {args.per_container})")
    print(f"  warm pool, 1 worker           : {one:7.1f}/s  = {one / per_task:5.1f}x")
    print(f"  warm pool, 2 workers          : {two:7.1f}/s  = {two / per_task:5.1f}x  (goal >= 100/s and >= 20x)")

    with tempfile.TemporaryDirectory() as tmp, open_sandbox("docker", workers=2) as sb:
        cache = ExecutionCache(Path(tmp) / "cache")
        df, stats = ro.run_rollouts(tasks, sb.run, sb.backend, cache)
        _, again = ro.run_rollouts(tasks, sb.run, sb.backend, cache)
    kinds = df["outcome"].value_counts().to_dict()
    print(f"\nall candidates of {len(tasks)} tasks, cold cache, 2 workers: {len(df)} executions in "
          f"{stats['seconds']:.1f} s ({stats['executed_per_s']}/s; goal < 120 s); outcomes {kinds}")
    print(f"re-run with a warm cache: {again['executed']} executed, {again['hits']} hits, {again['seconds']:.2f} s")
    print(f"references failing in the sandbox: {len(ro.check_references(df))}")


if __name__ == "__main__":
    main()
