"""Sandbox throughput, side by side in one run: the warm pool with 1 and 2 workers against
one `docker run --rm` container per execution (same hardening flags, same jobs), and
the whole rollout of every candidate of every task with a cold execution cache.

    .venv/bin/python benchmarks/sandbox_throughput.py [--tasks 1200] [--sample 400] [--per-container 40]

Goal (issues 5 and 34): >= 100 executions/s with 2 workers, >= 30x container-per-task; all
candidates of 1,200 tasks in under 2 minutes.

It also says where the CPU of one execution goes (issue 34), which depends far less on the
machine's load than a rate: this process (the host's client), dockerd, containerd and the
containers' shims (the host <-> container round trips), and inside the containers (their
cpuacct cgroups) the runner, its forked helpers (judges, clean-ups), the zygote and the
tasks. Timeouts are left out of it: a candidate that loops until killed burns its whole
timeout, which is its own CPU, not the sandbox's. Needs a local daemon and root (it reads
/proc and /sys/fs/cgroup); prints "n/a" where it cannot read.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu(pid: int) -> tuple[int, float, float]:
    """(parent pid, own CPU s, reaped children's CPU s) of a process."""
    f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(f[1]), (int(f[11]) + int(f[12])) / TICK, (int(f[13]) + int(f[14])) / TICK


def _pids_named(comm: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "comm").read_text().strip() == comm:
                    out.append(int(d.name))
            except OSError:
                pass
    return out


def _container_cgroup(cid: str) -> Path | None:
    for path in (Path(f"/sys/fs/cgroup/cpuacct/docker/{cid}"), Path(f"/sys/fs/cgroup/system.slice/docker-{cid}.scope")):
        if path.is_dir():
            return path
    return None


def cpu_snapshot(sb) -> dict[str, float]:
    """Cumulative CPU seconds by where they are spent (see the module's docstring); NaN where
    they cannot be read (no root, a remote daemon, another cgroup layout)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    snap = {"host client": ru.ru_utime + ru.ru_stime}
    for comm in ("dockerd", "containerd"):
        snap[comm] = sum(_proc_cpu(p)[1] for p in _pids_named(comm)) if _pids_named(comm) else float("nan")
    nan = float("nan")
    snap.update({"shims": 0.0, "containers": 0.0, "runner": 0.0, "runner's helpers": 0.0, "zygote": 0.0,
                 "tasks": 0.0})
    shims = {}
    for p in _pids_named("containerd-shim"):
        try:
            shims[p] = Path(f"/proc/{p}/cmdline").read_bytes()
        except OSError:
            pass
    for w in sb.workers:
        cid = w.container.id
        snap["shims"] += sum(_proc_cpu(p)[1] for p, cmd in shims.items() if cid.encode() in cmd)
        cg = _container_cgroup(cid)
        if cg is None:
            return {k: (v if k in ("host client", "dockerd", "containerd") else nan) for k, v in snap.items()}
        if (cg / "cpuacct.usage").exists():
            snap["containers"] += int((cg / "cpuacct.usage").read_text()) / 1e9
        else:
            usage = dict(line.split() for line in (cg / "cpu.stat").read_text().splitlines())
            snap["containers"] += int(usage["usage_usec"]) / 1e6
        procs = {}
        for p in (int(x) for x in (cg / "cgroup.procs").read_text().split()):
            try:
                if Path(f"/proc/{p}/comm").read_text().startswith("python"):
                    procs[p] = _proc_cpu(p)
            except OSError:
                pass
        for parent, own, reaped in procs.values():  # between runs: the runner and its zygote only
            if parent not in procs:  # the runner (its parent is the container's init)
                snap["runner"] += own
                snap["runner's helpers"] += reaped
            elif procs[parent][0] not in procs:  # the zygote, forked by the runner
                snap["zygote"] += own
                snap["tasks"] += reaped
    return snap


def cpu_per_execution(jobs: list[ExecJob], workers: int = 2, **options) -> tuple[str, list]:
    """A line saying how many ms of CPU one execution costs and where: ``jobs`` run once to warm
    the pool and find the timeouts, then once more (timeouts left out) between two snapshots."""
    with open_sandbox("docker", workers=workers, **options) as sb:
        first = sb.run(jobs)
        jobs = [j for j, r in zip(jobs, first) if r.outcome != "timeout"]
        generations = [w.generation for w in sb.workers]
        before = cpu_snapshot(sb)
        t0 = time.perf_counter()
        results = sb.run(jobs)
        wall = time.perf_counter() - t0
        after = cpu_snapshot(sb)
        if [w.generation for w in sb.workers] != generations:
            return "CPU per execution: n/a (a worker was replaced during the measurement)", results
    n = len(jobs)
    per = {k: 1000 * (after[k] - before[k]) / n for k in before}
    total = sum(per[k] for k in ("host client", "dockerd", "containerd", "shims", "containers"))
    inside = ", ".join(f"{k} {per[k]:.2f}" for k in ("runner", "runner's helpers", "zygote", "tasks"))
    return (f"CPU per execution ({n} executions, timeouts left out, {n / wall:.1f}/s): {total:.2f} ms = "
            + ", ".join(f"{k} {per[k]:.2f}" for k in ("host client", "dockerd", "containerd", "shims", "containers"))
            + f" (in the containers: {inside}); load average {os.getloadavg()[0]:.2f}"), results


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
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU-per-execution breakdown")
    args = ap.parse_args()

    t0 = time.perf_counter()
    tasks = generate_tasks(args.tasks, seed=args.seed)
    print(f"generated {len(tasks)} tasks in {time.perf_counter() - t0:.1f} s")
    all_jobs = [j for t in tasks for j in ro.jobs_for(t)]
    rng = np.random.default_rng(args.seed)
    sample = [all_jobs[i] for i in rng.choice(len(all_jobs), size=min(args.sample, len(all_jobs)), replace=False)]

    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.no_cpu:
        print(cpu_per_execution(sample)[0])
    per_task = container_per_task(sample[: args.per_container])
    one, _ = pool_rate(sample, 1)
    two, _ = pool_rate(sample, 2)
    print(f"\nexecutions/s on the same {len(sample)} sampled candidates (timeouts included):")
    print(f"  docker run --rm per execution : {per_task:7.1f}/s  (first {args.per_container})")
    print(f"  warm pool, 1 worker           : {one:7.1f}/s  = {one / per_task:5.1f}x")
    print(f"  warm pool, 2 workers          : {two:7.1f}/s  = {two / per_task:5.1f}x  (goal >= 100/s and >= 30x)")

    with tempfile.TemporaryDirectory() as tmp, open_sandbox("docker", workers=2) as sb:
        cache = ExecutionCache(Path(tmp) / "cache")
        df, stats = ro.run_rollouts(tasks, sb.run, sb.backend, cache)
        _, again = ro.run_rollouts(tasks, sb.run, sb.backend, cache)
    kinds = df["outcome"].value_counts().to_dict()
    print(f"\nall candidates of {len(tasks)} tasks, cold cache, 2 workers: {len(df)} executions in "
          f"{stats['seconds']:.1f} s ({stats['executed_per_s']}/s; goal < 120 s); outcomes {kinds}")
    print(f"re-run with a warm cache: {again['executed']} executed, {again['hits']} hits, {again['seconds']:.2f} s")
    print(f"references failing in the sandbox: {len(ro.check_references(df))}")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
