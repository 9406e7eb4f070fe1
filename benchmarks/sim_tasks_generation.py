"""Task generation and its verification, side by side in one run.

1. Generation speed: ``generate_tasks(1200)`` (no sandbox), repeated; wall and CPU seconds.
2. Candidate quality and sandbox cost on the same tasks, verified by the same sandbox:
   - ``sim_tasks``: the candidates generate_tasks picks (loop-guarded generic mutations,
     hand-written variants, infinite loops and memory blow-ups on ~12% of tasks each);
   - ``plain mutation`` (baseline): 4 mutants per task drawn uniformly from every generic
     site, loops unprotected (what plain mutation testing does).
   For each: executions, sandbox seconds, equivalent (passing) share, timeout share, share
   of candidates whose outcome matches their kind, tasks left with < 3 wrong candidates.

    .venv/bin/python benchmarks/sim_tasks_generation.py [--tasks 1200] [--verify-tasks 400]
        [--repeats 3] [--backend local] [--workers 2]

Goal (issue 5): 1,200 tasks generated in seconds, not minutes; every task keeps >= 3
verified wrong candidates; hanging candidates a minority, so verification stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

from sage_pipeline.sim import mutants
from sage_pipeline.sim.sandbox import open_sandbox
from sage_pipeline.sim.schema import ExecJob, TaskRecord
from sage_pipeline.sim.tasks import generate_tasks

SCRATCH = Path(__file__).resolve().parent / ".scratch"
# the outcome a candidate of each kind is meant to end in
EXPECTED = {"off_by_one": {"wrong_answer", "exception"}, "wrong_operator": {"wrong_answer", "exception"},
            "missed_edge_case": {"wrong_answer", "exception"}, "exception": {"exception"},
            "infinite_loop": {"timeout"}, "memory_blowup": {"oom", "killed"}, "wrong_type": {"wrong_answer"}}


def plain_mutants(task: TaskRecord, n: int = 4) -> list[mutants.Mutant]:
    """The baseline: n distinct mutants drawn uniformly from every generic site, loops unprotected."""
    rng = random.Random(f"plain:{task.task_id}")
    sites = [s for ss in mutants.find_sites(task.reference, task.entry_point, protect_loops=False).values()
             for s in ss]
    rng.shuffle(sites)
    out, seen = [], {task.reference}
    for s in sites:
        code = mutants.apply_site(task.reference, s)
        if code not in seen:
            seen.add(code)
            out.append(mutants.Mutant(s.kind, code, s.note))
        if len(out) == n:
            break
    return out


def measure(name: str, tasks: list[TaskRecord], cands: dict[str, list[mutants.Mutant]], sb) -> dict:
    jobs, meta = [], []
    for t in tasks:
        for m in cands[t.task_id]:
            jobs.append(ExecJob(m.code, t.entry_point, t.tests, t.timeout_s))
            meta.append((t.task_id, m.kind))
    t0 = time.perf_counter()
    results = sb.run(jobs)
    seconds = time.perf_counter() - t0
    wrong = Counter(tid for (tid, _), r in zip(meta, results) if not r.passed)
    as_kind = sum(r.outcome in EXPECTED[k] for (_, k), r in zip(meta, results))
    outcomes = Counter(r.outcome for r in results)
    return {"name": name, "executions": len(jobs), "seconds": round(seconds, 1),
            "executions_per_s": round(len(jobs) / seconds, 1),
            "equivalent_share": round(outcomes["pass"] / len(jobs), 4),
            "timeout_share": round(outcomes["timeout"] / len(jobs), 4),
            "outcome_matches_kind": round(as_kind / len(jobs), 4),
            "timeout_seconds": round(sum(r.runtime_s for r in results if r.outcome == "timeout"), 1),
            "tasks_short_of_3_wrong": sum(wrong[t.task_id] < 3 for t in tasks),
            "kinds": dict(Counter(k for _, k in meta)), "outcomes": dict(outcomes),
            "outcomes_by_kind": {k: dict(Counter(r.outcome for (_, kk), r in zip(meta, results) if kk == k))
                                 for k in EXPECTED}}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=1200)
    ap.add_argument("--verify-tasks", type=int, default=400,
                    help="tasks (every family) verified per contender")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--backend", default="local", choices=["local", "docker"])
    ap.add_argument("--workers", type=count, default=2)
    args = ap.parse_args()
    load = os.getloadavg()[0]

    walls, cpus = [], []
    for _ in range(args.repeats):
        w, c = time.perf_counter(), time.process_time()
        tasks = generate_tasks(args.tasks, seed=0)
        walls.append(time.perf_counter() - w)
        cpus.append(time.process_time() - c)
    n_cand = sum(len(t.candidates) for t in tasks)
    print(f"generation: {len(tasks)} tasks, {n_cand} candidates; wall best {min(walls):.2f} s "
          f"median {statistics.median(walls):.2f} s; CPU best {min(cpus):.2f} s "
          f"({len(tasks) / min(cpus):.0f} tasks per CPU-second); load {load:.1f}")

    step = max(1, len(tasks) // args.verify_tasks)
    subset = tasks[::step][:args.verify_tasks]
    ours = {t.task_id: [mutants.Mutant(c.kind, c.code, "") for c in t.candidates if c.kind != "reference"]
            for t in subset}
    plain = {t.task_id: plain_mutants(t) for t in subset}
    rows = []
    with open_sandbox(args.backend, workers=args.workers) as sb:
        for name, cands in (("plain mutation", plain), ("sim_tasks", ours), ("plain mutation", plain),
                            ("sim_tasks", ours)):
            rows.append(measure(name, subset, cands, sb))
            print(json.dumps({k: v for k, v in rows[-1].items() if k not in ("kinds", "outcomes")}))
    for name in ("sim_tasks", "plain mutation"):
        r = next(r for r in rows if r["name"] == name)
        print(f"{name}: outcomes per kind {json.dumps(r['outcomes_by_kind'])}")
    best = {name: min((r for r in rows if r["name"] == name), key=lambda r: r["seconds"])
            for name in ("sim_tasks", "plain mutation")}
    cols = ["executions", "seconds", "executions_per_s", "equivalent_share", "timeout_share",
            "timeout_seconds",
            "outcome_matches_kind", "tasks_short_of_3_wrong"]
    print(f"\n{len(subset)} tasks, backend {args.backend}, {args.workers} workers (best of 2 runs each)")
    print("| contender | " + " | ".join(cols) + " |")
    print("|---|" + "---|" * len(cols))
    for name, r in best.items():
        print(f"| {name} | " + " | ".join(str(r[c]) for c in cols) + " |")
    p, o = best["plain mutation"], best["sim_tasks"]
    print(f"\nsandbox seconds plain/sim_tasks: {p['seconds'] / o['seconds']:.2f}x; "
          f"equivalents plain/sim_tasks: {p['equivalent_share'] / max(o['equivalent_share'], 1e-9):.2f}x")
    SCRATCH.mkdir(exist_ok=True)
    out = {"load": load, "generation": {"wall_s": walls, "cpu_s": cpus, "tasks": len(tasks),
                                        "candidates": n_cand},
           "runs": rows, "args": vars(args)}
    (SCRATCH / "sim_tasks_generation.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
