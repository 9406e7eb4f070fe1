"""The loop's truth, judging and coder lever, timed two ways side by side on the same synthetic days:
the previous one-run-at-a-time implementation (``sage_pipeline_tests/sage_world/truth_reference.py``,
kept verbatim as the reference) and today's vectorised one (``sage_pipeline/sage_world/truth.py``).

The days are what `sage_loop_e2e.py --days 7 --tasks 100` feeds the truth, without running SAGE: the
world over --pool generated tasks (seed --seed), each day's tasks as the loop draws them
(``loop.day_tasks``), run ids ``dNN-rMMM`` and 3 workspaces as the harness names them, each run's
complexity computed by SAGE's own planner function (``sage.agents.planner._compute_task_complexity_score``,
run in SAGE's virtualenv: SAGE_PYTHON or --sage-python) on the description the world's planner writes,
the coder's model drawn through SAGE's UCB bandit (fresh workspaces each day) under the deployed
exploring checkpoint (rate 0.1, around SAGE's YAML, as the chain writes it), the coder pinned to the 14B
from day --pin-day on (the lever's promotion of the measured run, on the night before).

Each day, both ways make the calls the loop makes on that day's truth (``loop.run_loop`` and what it
calls): the deployed policy's, SAGE's YAML's and the best expressible policy's values; ``bundle_truth``
(deployed, shipped with the bandit drawn 32 times, the best bundle: two exact searches); ``truth_check``'s
expected return of each run; ``_judge``'s true values of SAGE's YAML and two deterministic checkpoints
(stand-ins for the gate's served candidates) on the report episodes (a seeded third of the runs so far);
``coder_night``'s exact value of the pinned bundle on every run so far, and on the promotion night the
deployed bundle's too. What reads the chain's artifacts is left out: the same in both ways.

Prints per day the seconds of each way and their ratio, then the totals, and the largest absolute
difference between the two ways over every value (per kind of value): exact means 0 up to float noise.

    .venv/bin/python benchmarks/sage_truth_speed.py [--days 7] [--tasks 100] [--pool 300] [--seed 0]
        [--sage-python PATH] [--no-reference] [--out FILE]

Results: printed, and benchmarks/.scratch/sage_truth_speed.json (unless --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMALL, BIG = "qwen2.5-coder:1.5b", "qwen2.5-coder:14b-instruct-q4_K_M"
WORKERS = 3  # HarnessConfig's default: the runs' workspaces


def sage_complexities(world, runs: list[tuple[str, str]], sage_python: str) -> list[float]:
    """SAGE's task_complexity_score of each run's coder task: the world's planner writes the task's
    description (with the run's mark), SAGE's planner scores it (planner.py's _validate_dag)."""
    descs = []
    for run, task_id in runs:
        world.assign(run, task_id)
        content, _ = world.answer("planner", [{"role": "user", "content": "Generate a Task DAG for the following "
                                               f"goal. [sage-world run={run}] {task_id}"}])
        descs.append(json.loads(content)["dag"]["nodes"][0]["description"])
    code = ("import json, sys\nfrom sage.agents.planner import _compute_task_complexity_score as f\n"
            "print(json.dumps([f(d) for d in json.load(sys.stdin)]))")
    out = subprocess.run([sage_python, "-c", code], input=json.dumps(descs), capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"SAGE's complexity function did not run in {sage_python}: {out.stderr.strip()[-400:]} (install SAGE "
                 "with scripts/sage_venv.sh and pass its python as --sage-python or SAGE_PYTHON)")
    return json.loads(out.stdout)


def make_days(world, days: int, tasks: int, seed: int, pin_day: int, sage_python: str) -> list[dict]:
    """The synthetic days (see the module doc)."""
    import numpy as np

    from sage_pipeline.routing.action_space import ActionSpace
    from sage_pipeline.sage import bandit_state, explore as sage_explore
    from sage_pipeline.sage.table import pin
    from sage_pipeline.sage_world import loop as sl, truth as T

    out, table = [], world.table
    for day in range(1, days + 1):
        if day == pin_day:
            table = pin(world.table, "coder", BIG)
        ex = sage_explore.build_exploring(table, ActionSpace.build(table).binary(), sage_explore.ExploreConfig())
        policy = T.SagePolicy(table, dict(ex.models), sage_explore.EXPLORE_FLOOR, "exploring around SAGE's YAML")
        runs = [(f"d{day:02d}-r{i:03d}", t) for i, t in enumerate(sl.day_tasks(world, day, tasks, seed))]
        rng = np.random.default_rng([seed, day])
        route, stats, day_runs = table.routes["coder"], {}, []
        for i, ((run, task_id), c) in enumerate(zip(runs, sage_complexities(world, runs, sage_python), strict=True)):
            st = stats.setdefault(i % WORKERS, {})
            key = bandit_state.select(st, T.coder_candidates(table, c))
            model = route.primary if bandit_state.side_of(key) == "primary" else route.fallback
            for x in T.draw_run(world, world.by_id[task_id], model, c, policy, rng)[1]:
                bandit_state.update(st, key, x)
            day_runs.append({"run": run, "task_id": task_id, "worker": i % WORKERS, "coder_model": model,
                             "complexity": c, "tests_at_start": False, "sessions": [run]})
        out.append({"day": day, "table": table, "policy": policy, "runs": day_runs})
    return out


def candidates(table) -> list:
    """Two deterministic checkpoints (decision trees on SAGE's two inputs, as the chain distils them)."""
    import numpy as np
    from sklearn.tree import DecisionTreeClassifier

    from sage_pipeline.sage_world import truth as T

    pols = []
    for seed in (1, 2):
        rng = np.random.default_rng(seed)
        models = {}
        for role in ("debugger", "reviewer", "test_engineer", "planner"):
            x = np.column_stack([rng.random(300), rng.integers(0, 6, 300)])
            y = ((x[:, 1] >= rng.integers(1, 4)) ^ (x[:, 0] > rng.uniform(0.03, 0.12))).astype(int)
            models[role] = DecisionTreeClassifier(max_depth=3, random_state=0).fit(x, y)
        pols.append(T.SagePolicy(table, models, 0.55, f"served{seed}"))
    return pols


def day_truth(M, fast: bool, world, d: dict, all_runs: list[dict], pin_day: int, objective) -> dict[str, float]:
    """One day's truth through module ``M`` (the truth or its reference): the calls the loop makes, every
    value they give, by name."""
    import numpy as np

    from sage_pipeline.sage.table import pin
    from sage_pipeline.sage_world import loop as sl, truth as T

    vals: dict[str, float] = {}

    def put(prefix: str, v) -> None:
        for k, x in vars(v).items():
            vals[f"{prefix}.{k}"] = float(x)

    def put_bundle(prefix: str, b) -> None:
        put(prefix, b.value)
        vals[f"{prefix}.objective"], vals[f"{prefix}.objective_se"] = b.objective, b.objective_se
        for m, s in b.coder_share.items():
            vals[f"{prefix}.share.{m}"] = s

    runs, policy, shipped = d["runs"], d["policy"], world.table
    yaml = T.SagePolicy(shipped)
    # run_loop: the day's true values
    put("day.deployed", M.policy_value(world, runs, policy))
    put("day.yaml", M.policy_value(world, runs, yaml))
    put("day.best_expressible", M.best_expressible(world, runs, by_complexity=False)[1])
    # bundle_truth
    tr = sl._truth_runs(runs)
    put_bundle("bundle.deployed", M.bundle_value(world, tr, T.BundleSpec(policy, None, "deployed"), objective,
                                                 draws=32))
    put_bundle("bundle.shipped", M.bundle_value(world, tr, T.BundleSpec(T.SagePolicy(shipped), None, "SAGE shipped"),
                                                objective, draws=32))
    _, best, cands = M.best_bundle(world, tr, objective, (SMALL, BIG))
    put_bundle("bundle.best", best)
    for i, c in enumerate(cands):
        put_bundle(f"bundle.candidate{i}", c)
    # truth_check: each run's expected return
    if fast:
        expected = T.run_values(world, runs, policy)[:, 0]
    else:
        expected = np.array([M.run_value(world, world.by_id[r["task_id"]], r["coder_model"], r["complexity"], policy,
                                         r["tests_at_start"]).ret for r in runs])
    for r, e in zip(runs, expected, strict=True):
        vals[f"truth_check.{r['run']}"] = float(e)
    # _judge: the report episodes' true values
    rng = np.random.default_rng([d["day"], 41])
    report = [r for r in all_runs if rng.random() < 1 / 3]
    vals["judge.static_table"] = M.policy_value(world, report, T.SagePolicy(d["table"])).ret
    for c in candidates(d["table"]):
        vals[f"judge.{c.name}"] = M.policy_value(world, report, c).ret
    # coder_night: the lead bundle on every run so far, and the deployed one on the promotion night
    every = sl._truth_runs(all_runs)
    lead = T.BundleSpec(T.SagePolicy(pin(d["table"], "coder", BIG), policy.models, policy.min_confidence), None, "lead")
    vals["coder_night.lead"] = M.bundle_value(world, every, lead, objective).objective
    if d["day"] == pin_day - 1:
        now = M.bundle_value(world, every, T.BundleSpec(policy, None, "deployed"), objective, draws=32)
        vals["coder_night.deployed"], vals["coder_night.deployed_se"] = now.objective, now.objective_se
    return vals


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=count, default=7)
    ap.add_argument("--tasks", type=count, default=100, help="runs a day")
    ap.add_argument("--pool", type=count, default=300, help="generated tasks the days draw from")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--pin-day", type=count, default=4, help="the first day SAGE runs the coder pinned to the 14B")
    ap.add_argument("--sage-python", default=os.environ.get("SAGE_PYTHON") or str(ROOT / ".sage" / "venv" / "bin" /
                                                                                  "python"),
                    help="SAGE's virtualenv's python (its complexity function scores the runs' tasks)")
    ap.add_argument("--no-reference", action="store_true", help="time today's truth only (the reference takes "
                    "about 2 minutes a day)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / ".scratch" / "sage_truth_speed.json"))
    a = ap.parse_args(argv)

    from sage_pipeline import artifacts
    from sage_pipeline.sage.objective import TaskObjective
    from sage_pipeline.sage.table import SAGE_TABLE
    from sage_pipeline.sage_world import truth as T
    from sage_pipeline.sage_world.world import build_world
    from sage_pipeline_tests.sage_world import truth_reference as R

    t0 = time.perf_counter()
    world = build_world(SAGE_TABLE, n_tasks=a.pool, task_seed=a.seed)
    print(f"world: {len(world.tasks)} tasks ({time.perf_counter() - t0:.0f} s)", flush=True)
    t0 = time.perf_counter()
    days = make_days(world, a.days, a.tasks, a.seed, a.pin_day, a.sage_python)
    print(f"{a.days} days x {a.tasks} runs ({time.perf_counter() - t0:.0f} s); load average {os.getloadavg()}\n",
          flush=True)
    objective = TaskObjective()
    rows, diffs, all_runs = [], {}, []
    print("day | runs so far | reference s | today s | ratio | max |difference|", flush=True)
    for d in days:
        all_runs = all_runs + d["runs"]
        t = time.perf_counter()
        new = day_truth(T, True, world, d, all_runs, a.pin_day, objective)
        s_new = time.perf_counter() - t
        s_old, gap = None, None
        if not a.no_reference:
            t = time.perf_counter()
            old = day_truth(R, False, world, d, all_runs, a.pin_day, objective)
            s_old = time.perf_counter() - t
            if set(old) != set(new):
                sys.exit(f"day {d['day']}: the two ways gave different values: {sorted(set(old) ^ set(new))[:5]}")
            for k in new:
                kind = k.split(".")[0] + "." + (k.split(".")[1] if not k.startswith("truth_check") else "run")
                diffs[kind] = max(diffs.get(kind, 0.0), abs(new[k] - old[k]))
            gap = max(abs(new[k] - old[k]) for k in new)
        rows.append({"day": d["day"], "runs_so_far": len(all_runs), "reference_s": s_old, "today_s": s_new,
                     "max_abs_difference": gap, "values": len(new)})
        ratio = f"{s_old / s_new:.0f}x" if s_old else "-"
        print(f"{d['day']} | {len(all_runs)} | {'-' if s_old is None else f'{s_old:.1f}'} | {s_new:.2f} | {ratio} | "
              f"{'-' if gap is None else f'{gap:.1e}'}", flush=True)
    tot_new = sum(r["today_s"] for r in rows)
    tot_old = None if a.no_reference else sum(r["reference_s"] for r in rows)
    print(f"\n{a.days} days: reference {'-' if tot_old is None else f'{tot_old:.0f} s ({tot_old / 60:.1f} min)'}, "
          f"today {tot_new:.1f} s" + (f", ratio {tot_old / tot_new:.0f}x" if tot_old else "")
          + f" (goal: under 120 s); load average {os.getloadavg()}")
    if diffs:
        print("largest |today - reference| by value (exact: 0 up to float noise):")
        for k, v in sorted(diffs.items()):
            print(f"  {k}: {v:.1e}")
    res = {"argv": sys.argv[1:], "machine": platform.node(), "cpus": os.cpu_count(), "load": os.getloadavg(),
           "days": rows, "today_s": tot_new, "reference_s": tot_old, "max_abs_difference_by_value": diffs,
           "values_per_day": [r["values"] for r in rows]}
    artifacts.write_json(Path(a.out), res)
    print(f"\nresults: {a.out}")


if __name__ == "__main__":
    main()
