"""External coding suites in the Docker sandbox, with the judge outside the candidate's process
(issue 15): a HumanEval-style and an MBPP-style suite, every canonical solution (all must
pass), a broken variant of each (`return None`: none may pass) and every forger of
``sage_pipeline.sim.suites.FORGERS`` (none may pass); then executions per second with the
warm pool (2 workers) against one `docker run --rm` container per problem.

    .venv/bin/python benchmarks/external_suite.py [--humaneval HumanEval.jsonl.gz] [--mbpp mbpp.jsonl]
                                                  [--rounds 10] [--per-container 20]

Without paths, the project's samples (sim/suites/). Goals (issue 34): HumanEval >= 80
problems/s with 2 workers, every rate >= 50/s and >= 20x the container per problem. Also the
CPU of one HumanEval execution and where it goes (see benchmarks/sandbox_throughput.py).
Exit status 1 when a goal or a check fails.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the baseline of sandbox_throughput.py

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)
from sandbox_throughput import container_per_task, cpu_per_execution

from sage_pipeline.sim.sandbox import open_sandbox
from sage_pipeline.sim.suites import FORGERS, SAMPLE_FILES, broken, forger, read_suite, verify_suite


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--humaneval", type=Path, default=SAMPLE_FILES["humaneval"])
    ap.add_argument("--mbpp", type=Path, default=SAMPLE_FILES["mbpp"])
    ap.add_argument("--workers", type=count, default=2)
    ap.add_argument("--rounds", type=int, default=10, help="times the canonical solutions are run for the rate")
    ap.add_argument("--per-container", type=int, default=20, help="problems in the docker-run-per-problem baseline")
    ap.add_argument("--no-cpu", action="store_true", help="skip the CPU-per-execution breakdown")
    args = ap.parse_args()
    print(f"load average at the start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")

    ok = True
    suites = {"humaneval": read_suite(args.humaneval, "humaneval"), "mbpp": read_suite(args.mbpp, "mbpp")}
    for name, path in (("humaneval", args.humaneval), ("mbpp", args.mbpp)):
        print(f"{name}: {len(suites[name])} problems from {path}")
    with open_sandbox("docker", workers=args.workers, untrusted=True) as sb:
        kept: dict[str, list] = {}
        for name, problems in suites.items():
            report = verify_suite(problems, sb.run)
            kept[name] = [(p, report.timeouts[p.task_id]) for p in problems if p.task_id in report.timeouts]
            print(f"\n{name}: canonical solutions passing {len(report.kept)}/{report.problems}")
            for e in report.excluded[:10]:
                print(f"  excluded {e['task_id']} ({e['source']}): {e['outcome']}: {e['why'][:100]}")
            if report.excluded and args.humaneval == SAMPLE_FILES["humaneval"] and args.mbpp == SAMPLE_FILES["mbpp"]:
                ok = False  # the project's own samples must all pass
            rows = [("broken (return None)", [p.job(broken(p), t) for p, t in kept[name]])]
            rows += [(f"forger {f}", [p.job(forger(f, p), t) for p, t in kept[name]]) for f in sorted(FORGERS)]
            for label, jobs in rows:
                results = sb.run(jobs)
                passed = sum(r.passed for r in results)
                kinds: dict[str, int] = {}
                for r in results:
                    kinds[r.outcome] = kinds.get(r.outcome, 0) + 1
                print(f"  {label:28s} passed {passed}/{len(jobs)}  {kinds}")
                ok &= passed == 0

        # the rate: canonical solutions, broken variants and forgers, as one mixed batch
        mixed = [p.job(c, t) for plist in kept.values() for p, t in plist
                 for c in (p.canonical, broken(p), *(forger(f, p) for f in sorted(FORGERS)))]
        canon = [p.job(p.canonical, t) for plist in kept.values() for p, t in plist] * args.rounds
        t0 = time.perf_counter()
        results = sb.run(canon)
        canon_rate = len(canon) / (time.perf_counter() - t0)
        ok &= all(r.passed for r in results)
        humaneval = [p.job(p.canonical, t) for p, t in kept["humaneval"]] * args.rounds
        t0 = time.perf_counter()
        results = sb.run(humaneval)
        humaneval_rate = len(humaneval) / (time.perf_counter() - t0)
        ok &= all(r.passed for r in results)
        t0 = time.perf_counter()
        sb.run(mixed)
        mixed_rate = len(mixed) / (time.perf_counter() - t0)
    if not args.no_cpu:
        print(cpu_per_execution(humaneval, workers=args.workers, untrusted=True)[0].replace(
            "CPU per execution", "CPU per HumanEval execution"))
    base_jobs = [p.job(p.canonical, t) for plist in kept.values() for p, t in plist][: args.per_container]
    per_problem = container_per_task(base_jobs, must_pass=True)
    print(f"\nexecutions/s, {args.workers} workers (the judge and the candidate in separate processes):")
    print(f"  docker run --rm per problem           : {per_problem:7.1f}/s  (first {len(base_jobs)} canonical)")
    print(f"  warm pool, canonical solutions        : {canon_rate:7.1f}/s  = {canon_rate / per_problem:5.1f}x  "
          f"({len(canon)} executions)")
    print(f"  warm pool, canonical+broken+forgers   : {mixed_rate:7.1f}/s  = {mixed_rate / per_problem:5.1f}x  "
          f"({len(mixed)} executions)   goal >= 50/s and >= 20x")
    print(f"  warm pool, HumanEval canonical        : {humaneval_rate:7.1f}/s  = {humaneval_rate / per_problem:5.1f}x  "
          f"({len(humaneval)} executions)   goal >= 80/s")
    print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rates = (canon_rate, mixed_rate, humaneval_rate)
    goal = min(rates) >= 50 and min(rates) / per_problem >= 20 and humaneval_rate >= 80
    print("goals met" if ok and goal else "GOALS NOT MET" if ok else "A CHECK FAILED (see above)")
    return 0 if ok and goal else 1


if __name__ == "__main__":
    sys.exit(main())
