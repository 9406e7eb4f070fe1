"""OPE on logs of SAGE's router running the exploring checkpoint: is a candidate's estimate within
5% of its true value in >= 90% of 20 seeds?

Per seed, on the packaged routing simulator (exact ground truth) in SAGE's binary space:

* the **behaviour** is what SAGE's unchanged router does with the exploring checkpoint around its
  YAML table (``sage_explore.build_exploring``: the stock VotingClassifier SAGE loads; its
  probabilities are the ones the contract test matches against SAGE's own router over 20,000
  decisions), rate ``--rate`` (default the setting's default);
* ``--episodes`` tasks are rolled under it (``collector.simulate_episodes``) and each decision's
  propensity is the exploring checkpoint's exact probability of the logged model, i.e. what
  ``sage_explore.reconstruct_propensities`` gives back from SAGE's MODEL_ROUTING_DECISION line
  (checked here on a sample of rows);
* the **candidates** are policies SAGE's router can execute: the YAML table itself, the best
  binary policy distilled into SAGE's per-role classifiers (``sage_router.distill``, every role
  covered, floor 0), and the same served policy exploring at the rate (what the next night
  would deploy); each is valued by OPE (step-wise DR, weighted step-wise DR and PDIS with 95%
  bootstrap intervals, sessions as clusters) and exactly by the simulator.

The same with deterministic YAML logs (``--rate 0``) shows what no estimator can do: the
served candidate deviates from the table where the logs never tried its choice, and OPE says
"no support" instead of a number.

    .venv/bin/python benchmarks/exploring_ope.py [--seeds 20] [--workers 2] [--episodes 20000] [--rate R]
    .venv/bin/python benchmarks/offline_quality.py --exploring-sage [--seeds 20] [--exploration-rate R]  (the same)

Results: printed, and every seed's figures in ``benchmarks/.scratch/exploring_ope.json``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCRATCH = ROOT / "benchmarks" / ".scratch"
ESTIMATORS = ("step_dr", "step_wdr", "pdis")
TASKS_PER_SESSION = 4


def run_seed(seed: int, episodes: int, rate: float | None) -> dict:
    import numpy as np

    from sage_pipeline.rl import ope
    from sage_pipeline.routing.action_space import ActionSpace
    from sage_pipeline.routing.catalogue import ModelCatalogue
    from sage_pipeline.routing.collector import simulate_episodes
    from sage_pipeline.routing.features import Contexts
    from sage_pipeline.routing.policy import StaticTablePolicy
    from sage_pipeline.routing.routing_simulator import RoutingSimulator
    from sage_pipeline.sage import checkpoint as sr, explore as se
    from sage_pipeline.sage.table import RoutingTable

    t0 = time.perf_counter()
    cat, tab = ModelCatalogue.load(), RoutingTable.load()
    sim = RoutingSimulator(cat, tab)
    sp = ActionSpace.build(tab, catalogue=cat).binary()
    cfg = se.ExploreConfig() if rate is None else se.ExploreConfig(rate=rate)
    behaviour = se.build_exploring(tab, sp, cfg)
    rng = np.random.default_rng(seed)
    tasks = sim.sample_tasks(episodes, rng)
    rows = simulate_episodes(sim, tasks, behaviour, rng)
    ctx = Contexts(role=tasks.role[rows["task"]], task_complexity_score=tasks.task_complexity_score[rows["task"]],
                   prompt_tokens=rows["prompt_tokens"].astype(np.float64), step=rows["step"],
                   failure_count=rows["failure_count"], primary_failure_count=rows["primary_failure_count"])
    data = ope.LoggedData(contexts=ctx, action=rows["action"], reward=rows["reward"].astype(np.float64),
                          pscore=rows["propensity"].astype(np.float64),
                          episode_id=rows["task"].astype(str), actions=tuple(sp.actions),
                          session_id=(rows["task"] // TASKS_PER_SESSION).astype(str), roles=tuple(sp.roles))

    # the logged propensity is what reconstruction gives back from the decision SAGE would log
    sample = rng.choice(len(rows["task"]), size=min(200, len(rows["task"])), replace=False)
    p_fb = np.array([behaviour.fallback_probs(sp.roles[ctx.role[i]], ctx.task_complexity_score[i],
                                              ctx.primary_failure_count[i])[0] for i in sample])
    took_fb = rows["action"][sample] == sp.fallback[ctx.role[sample]]
    same = sp.fallback[ctx.role[sample]] == sp.primary[ctx.role[sample]]
    recon = np.where(same, 1.0, np.where(took_fb, p_fb, 1.0 - p_fb))
    assert np.allclose(recon, rows["propensity"][sample]), "logged propensities differ from the checkpoint's"

    first = sim.contexts(tasks, np.zeros(len(tasks), dtype=np.int64), np.zeros(len(tasks), dtype=np.int64))
    served = sr.ServedSagePolicy.from_distilled(sr.distill(sim.oracle_policy(sp.mask), first, sp), tab, sp, 0.0,
                                                name="served_best_binary")
    candidates = {"yaml_table": StaticTablePolicy(tab, sp), "served_best_binary": served,
                  "served_exploring": se.build_exploring(served, sp, cfg)}
    truth = {n: float(sim.policy_value(p, tasks).mean) for n, p in candidates.items()}
    truth["behaviour"] = float(sim.policy_value(behaviour, tasks).mean)
    out = {}
    for name, pol in candidates.items():
        ev = ope.evaluate_policy(data, pol, ope.OPEConfig(n_boot=500, seed=seed), progress=lambda *_: None,
                                 keep_terms=False, intervals=ESTIMATORS)
        out[name] = {"no_support": ev.no_support_reason}
        for est in ESTIMATORS:
            e = ev.estimates.get(est)
            if e is None or e.value is None:
                out[name][est] = None
                continue
            t = truth[name]
            out[name][est] = {"estimate": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high,
                              "relative_error": abs(e.value - t) / abs(t), "covered": e.ci_low <= t <= e.ci_high}
    return {"seed": seed, "episodes": episodes, "decisions": int(len(rows["task"])), "rate": cfg.rate,
            "truth": truth, "estimates": out, "seconds": time.perf_counter() - t0}


def summarise(runs: list[dict]) -> dict:
    out = {"seeds": len(runs), "rate": runs[0]["rate"],
           "behaviour_minus_yaml": statistics.fmean(r["truth"]["behaviour"] - r["truth"]["yaml_table"] for r in runs)}
    for name in runs[0]["estimates"]:
        out[name] = {"true_value": statistics.fmean(r["truth"][name] for r in runs),
                     "no_support": sum(r["estimates"][name]["no_support"] is not None for r in runs)}
        for est in ESTIMATORS:
            cells = [r["estimates"][name][est] for r in runs if r["estimates"][name][est] is not None]
            if not cells:
                out[name][est] = None
                continue
            err = [c["relative_error"] for c in cells]
            out[name][est] = {"evaluated": len(cells), "within_5pct": sum(e <= 0.05 for e in err),
                              "mean_rel_error": statistics.fmean(err), "max_rel_error": max(err),
                              "covered": sum(c["covered"] for c in cells)}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=count, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--workers", type=count, default=2)
    ap.add_argument("--episodes", type=count, default=20_000)
    ap.add_argument("--rate", type=float, default=None, help="exploration rate (default: ExploreConfig's); "
                    "0 is SAGE's deterministic YAML logging")
    ap.add_argument("--out", default="exploring_ope.json", help="file name under benchmarks/.scratch/")
    args = ap.parse_args(argv)
    if args.rate is not None and not 0.0 <= args.rate <= 0.5:
        ap.error(f"--rate must be in [0, 0.5], got {args.rate}")
    SCRATCH.mkdir(parents=True, exist_ok=True)
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    t0 = time.perf_counter()
    with ProcessPoolExecutor(args.workers) as pool:
        runs = list(pool.map(run_seed, seeds, [args.episodes] * args.seeds, [args.rate] * args.seeds))
    summary = summarise(runs)
    (SCRATCH / args.out).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1))
    print(f"{args.seeds} seeds x {args.episodes} episodes, rate {summary['rate']}, {time.perf_counter() - t0:.0f} s")
    print(f"exploring around the table, true value change: {summary['behaviour_minus_yaml']:+.4f}")
    for name in runs[0]["estimates"]:
        s = summary[name]
        print(f"{name}: true value {s['true_value']:.4f}, no support in {s['no_support']} of {args.seeds} seeds")
        for est in ESTIMATORS:
            c = s[est]
            if c is None:
                print(f"  {est:9s} no number (no support)")
                continue
            print(f"  {est:9s} within 5% in {c['within_5pct']}/{c['evaluated']} seeds, mean error "
                  f"{c['mean_rel_error']:.2%}, max {c['max_rel_error']:.2%}, interval covers {c['covered']}/"
                  f"{c['evaluated']}")


if __name__ == "__main__":
    main()
