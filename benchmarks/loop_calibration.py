"""Can the SAGE loop's assumptions be set so that both structure goals of issue 20 hold?

The calibration (``sage_pipeline/sim/data/sage_loop.yaml``) keeps every published figure and
varies only what nothing publishes (``KNOBS``): the per-task seconds and calls budgets, the
latency and dollar weights of the reward, how much the share of tests passed helps a repair,
the logit lost per unit of difficulty, and a repair's gain after a timeout / out-of-memory / killed
run. For every combination, on the held-out tasks, exactly (``sim/loop_truth.py``):

- SAGE's static table's pass rate (goal <= 85%) and the oracle's (goal >= 95%);
- the closure of the best one-step route and the best feedback-blind plan per task (they
  know each task's own wrong candidates), and of the same classes learned from the task's
  observation on the train tasks (``LoopGroundTruth.learned_blind``) (goal: a one-step policy
  closes <= 0.6);
- whether the table's own fallback (the coder's primary, then the debugger's primary) fits in
  the budget.

Combinations are a grid (one flag per knob; a knob not given keeps the file's value) or, with
``--sample N``, N draws of every knob at once, uniform over ``SAMPLE_RANGES`` (a grid flag beside
it is refused).

    .venv/bin/python benchmarks/loop_calibration.py [--seconds 50 56 70] [--latency-weights 0.01 0.015]
        [--cost-weights 15 20] [--tests-gains 10 20] [--calls 4] [--slopes 6] [--timeout-gains -2.5]
        [--sample N [--sample-seed S]] [--synthetic] [--out F]

Prints a markdown table (every row, goals marked) and a summary, and writes the rows as JSON
(``--out``, default ``benchmarks/.scratch/loop_calibration.json``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

# knob -> (its flag, the calibration's field it sets, its --sample range)
KNOBS = {
    "seconds": ("--seconds", "budget.seconds", (60.0, 80.0)),
    "calls": ("--calls", "budget.calls", (3, 6)),
    "latency_weight": ("--latency-weights", "reward.latency_weight", (0.005, 0.02)),
    "cost_weight": ("--cost-weights", "reward.cost_weight", (5.0, 120.0)),
    "tests_gain": ("--tests-gains", "assumptions.debug_tests_gain", (5.0, 20.0)),
    "difficulty_slope": ("--slopes", "assumptions.difficulty_slope", (3.0, 9.0)),
    "timeout_gain": ("--timeout-gains", "assumptions.debug_kind_gain.{timeout,oom,killed}", (-5.0, 0.0)),
}
SAMPLE_RANGES = {k: v[2] for k, v in KNOBS.items()}
SILENT = ("timeout", "oom", "killed")  # the outcome kinds whose feedback says nothing about the bug


def configured(base, knobs: dict):
    """``base`` with the knobs set, each through the calibration's own validation (a bad value
    raises pydantic's ValidationError naming the field)."""
    def with_(part, **values):
        return type(part).model_validate(part.model_dump() | values)

    a, upd = base.assumptions, {}
    if "tests_gain" in knobs:
        upd["debug_tests_gain"] = with_(a.debug_tests_gain, value=knobs["tests_gain"])
    if "difficulty_slope" in knobs:
        upd["difficulty_slope"] = with_(a.difficulty_slope, value=knobs["difficulty_slope"])
    if "timeout_gain" in knobs:
        gains = dict(a.debug_kind_gain.value) | dict.fromkeys(SILENT, knobs["timeout_gain"])
        upd["debug_kind_gain"] = with_(a.debug_kind_gain, value=gains)
    return base.model_copy(update={
        "budget": with_(base.budget, **{k: knobs[k] for k in ("seconds", "calls") if k in knobs}),
        "reward": with_(base.reward, **{k: knobs[k] for k in ("latency_weight", "cost_weight") if k in knobs}),
        "assumptions": a.model_copy(update=upd)})


def file_values(base) -> dict:
    """Every knob's value in the calibration file."""
    a = base.assumed
    return {"seconds": base.budget.seconds, "calls": base.budget.calls, "latency_weight": base.latency_weight,
            "cost_weight": base.cost_weight, "tests_gain": a["debug_tests_gain"],
            "difficulty_slope": a["difficulty_slope"], "timeout_gain": a["debug_kind_gain"]["timeout"]}


def evaluate(tasks, rollouts, base, knobs: dict) -> dict:
    from sage_pipeline.sim.loop_env import SageLoopSim
    from sage_pipeline.sim.loop_truth import LoopGroundTruth

    cfg = configured(base, knobs)
    sim = SageLoopSim.build(tasks, rollouts, cfg)
    gt = LoopGroundTruth(sim)
    rows = {r["policy"]: r for r in gt.compare({}, sim.split_index("test"), train_idx=sim.split_index("train"))}
    first, follow = (sim.actions.index(a) for a in (f"code:{cfg.actions.code[0]}", f"debug:{cfg.actions.debug[0]}"))
    st, orc = rows["static_table"], rows["oracle"]
    out = {**file_values(base), **knobs,
           "table_fallback_fits": bool(sim.seconds[first] + sim.seconds[follow] <= cfg.budget.seconds + 1e-9),
           "static_pass": st["pass_rate"], "oracle_pass": orc["pass_rate"], "static_usd": st["mean_cost_usd"],
           "oracle_usd": orc["mean_cost_usd"], "static_s": st["mean_latency_s"], "oracle_s": orc["mean_latency_s"]}
    for name in ("best one-step route", "best feedback-blind plan", "learned one-step route",
                 "learned feedback-blind plan"):
        out[name] = rows[name]["regret_closure"]
    out["table_and_oracle"] = bool(out["static_pass"] <= 0.85 and out["oracle_pass"] >= 0.95)
    # with the one-step policy as the per-task optimum (it knows the task's candidates), and as learned
    out["goals_met"] = bool(out["table_and_oracle"] and out["best one-step route"] <= 0.6)
    out["goals_met_learned"] = bool(out["table_and_oracle"] and out["learned one-step route"] <= 0.6)
    return out


def combinations(args, base) -> list[dict]:
    """The grid of the knobs' flags (a knob not given: the file's value), or ``--sample`` draws."""
    if args.sample:
        import numpy as np

        rng = np.random.default_rng(args.sample_seed)
        draws = []
        for _ in range(args.sample):
            d = {k: float(f"{rng.uniform(lo, hi):.3g}") for k, (lo, hi) in SAMPLE_RANGES.items() if k != "calls"}
            lo, hi = SAMPLE_RANGES["calls"]
            draws.append({"calls": int(rng.integers(lo, hi + 1)), **d})
        return draws
    grid = {k: getattr(args, k) or [file_values(base)[k]] for k in KNOBS}
    return [dict(zip(grid, combo, strict=True)) for combo in itertools.product(*grid.values())]


def summary(rows: list[dict]) -> list[str]:
    lines = []
    for key, what in (("goals_met", "the best one-step route per task"), ("goals_met_learned", "the learned one")):
        met = [r for r in rows if r[key]]
        lines.append(f"all three goals met with {what} in {len(met)} of {len(rows)} combinations"
                     + (f", the table's fallback fitting the budget in {sum(r['table_fallback_fits'] for r in met)}"
                        if met else ""))
    ok = [r for r in rows if r["table_and_oracle"]]
    if ok:
        lines.append(f"where the table passes <= 85% and the oracle >= 95% ({len(ok)} combinations), the one-step "
                     "route closes (min / median / max):")
        for name in ("best one-step route", "learned one-step route"):
            v = [r[name] for r in ok]
            lines.append(f"  {name}: {min(v):.3f} / {statistics.median(v):.3f} / {max(v):.3f}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for knob, (flag, field, _) in KNOBS.items():
        ap.add_argument(flag, dest=knob, type=int if knob == "calls" else float, nargs="+",
                        help=f"values of {field} (default: the file's)")
    ap.add_argument("--sample", type=int, default=0, help="N random combinations of every knob (SAMPLE_RANGES) "
                    "instead of the grid")
    ap.add_argument("--sample-seed", type=int, default=0)
    ap.add_argument("--data-dir", default=os.environ.get("SAGE_DATA_DIR", str(ROOT / "datasets")))
    ap.add_argument("--synthetic", action="store_true", help="the tests' synthetic suite instead of the project's")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / ".scratch" / "loop_calibration.json"))
    args = ap.parse_args()
    if args.sample < 0:
        ap.error(f"--sample {args.sample}: expected a number of combinations >= 0")
    given = [KNOBS[k][0] for k in KNOBS if getattr(args, k) is not None]
    if args.sample and given:  # the draws set every knob: a grid flag beside them would be ignored
        ap.error(f"--sample draws every knob from SAMPLE_RANGES: drop {', '.join(given)}, or drop --sample for a grid")

    from ppo_vs_sb3 import load_suite
    from pydantic import ValidationError

    from sage_pipeline.sim.loop_config import SageLoopConfig

    tasks, rollouts, source = load_suite(Path(args.data_dir), args.synthetic)
    base = SageLoopConfig.load()
    print(f"data: {source}; calibration {base.source}")
    print("| seconds | calls | latency w | cost w | tests gain | slope | timeout gain | table's fallback fits | "
          "table pass | oracle pass | oracle $ | best route | best plan | learned route | learned plan | goals |")
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    t0, rows = time.perf_counter(), []
    for knobs in combinations(args, base):
        try:
            r = evaluate(tasks, rollouts, base, knobs)
        except ValidationError as exc:  # e.g. a budget <= 0: the calibration names the field
            ap.error(", ".join(f"{k.replace('_', ' ')} {v:g}" for k, v in knobs.items()) + f": {exc}")
        rows.append(r)
        print(f"| {r['seconds']:g} | {r['calls']} | {r['latency_weight']:g} | {r['cost_weight']:g} | "
              f"{r['tests_gain']:g} | {r['difficulty_slope']:g} | {r['timeout_gain']:g} | "
              f"{'yes' if r['table_fallback_fits'] else 'no'} | {r['static_pass']:.3f} | {r['oracle_pass']:.3f} | "
              f"{r['oracle_usd']:.5f} | {r['best one-step route']:.3f} | {r['best feedback-blind plan']:.3f} | "
              f"{r['learned one-step route']:.3f} | {r['learned feedback-blind plan']:.3f} | "
              f"{'all met' if r['goals_met'] else 'met with the learned route' if r['goals_met_learned'] else ''} |",
              flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"source": source, "rows": rows}, indent=1))
    print("\n".join(summary(rows)))
    print(f"{time.perf_counter() - t0:.1f} s")


if __name__ == "__main__":
    main()
