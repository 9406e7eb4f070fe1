"""Offline chain quality over many seeds: does CQL beat the static table in ground truth,
how wrong is DR, and do the 95% intervals cover the truth?

For each seed, exactly what the assets do on embedded defaults: the collector writes the
default number of simulated episodes (static table + epsilon 0.3), the ingest and the
routing dataset build the train/eval split, BC is trained on the train split, CQL is
trained for every default alpha and the alpha is chosen by OPE on the eval split's select
half (``offline_eval.train_select_cql``, the asset's default criterion), then
``run_offline_eval`` evaluates the static table, BC, CQL and (as a stress test, far from
the logs) the uniform policy on the report half, and the simulator gives each one's exact
value. Ground truth is only read here, after every choice is made.

Goals (issue 3): CQL regret closure >= 0.7; DR relative error <= 5%; 95% intervals cover
the ground truth in at least 90% of 50 seeds.

``--action-space sage_binary`` measures what SAGE's router would run: the collector explores
only each role's primary and fallback, BC and CQL learn in that space, each is distilled
into per-role classifiers served behind SAGE's confidence floor (chosen by OPE on the
select half) with the YAML fallback (``offline_eval.distill_select_served``), and the
report, the ground truth and the gate judge those served composites, against the best
binary policy (the simulator's exact optimum restricted to primary/fallback) as the
oracle. Goals (issue 13): the served composite closes >= 0.6 of the regret; step-wise DR
within 5% in >= 90% of seeds; no wrong promotion.
The gate it counts promotions of is the per-night one (``run_sage_binary_eval(...,
mode="per_night")``: one night's paired verdict against the table, valid for one night only), as
it measured before issue 47; the asset decides through the decision ledger by default
(``mode="ledger"``), which issue 47's month benchmark measures.

    .venv/bin/python benchmarks/offline_quality.py [--seeds 50] [--workers 2] [--episodes N]
        [--criterion fqe|estimate|lower_bound] [--support logged_pairs|behaviour] [--eval-fraction F]
        [--action-space multi_model|sage_binary] [--clip-factors 1 1.5 2 3 inf]
    .venv/bin/python benchmarks/offline_quality.py --exploring-sage [--seeds 20] [--exploration-rate R]

Results: printed, and every seed's figures in ``benchmarks/.scratch/offline_quality.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCRATCH = ROOT / "benchmarks" / ".scratch"


def run_seed(seed: int, episodes: int, criterion: str = "fqe", eval_fraction: float | None = None,
             support: str = "logged_pairs", action_space: str = "multi_model", floor_criterion: str = "fqe",
             clip_factors: tuple[float, ...] = ()) -> dict:
    import pyarrow.parquet as pq

    from sage_pipeline.rl import bc, cql, offline_eval as oe, ope
    from sage_pipeline.rl.data import from_dataset
    from sage_pipeline.routing import collector, ingest
    from sage_pipeline.routing.catalogue import ModelCatalogue
    from sage_pipeline.routing.features import FeatureSpec
    from sage_pipeline.routing.policy import StaticTablePolicy, UniformPolicy
    from sage_pipeline.routing.routing_dataset import DatasetConfig, build_routing_dataset
    from sage_pipeline.routing.routing_simulator import RoutingSimulator
    from sage_pipeline.sage.table import RoutingTable

    t0 = time.perf_counter()
    quiet = lambda *_: None  # noqa: E731
    cat = ModelCatalogue.load()
    tab = RoutingTable.load()
    sim = RoutingSimulator(cat, tab)
    with tempfile.TemporaryDirectory(dir=SCRATCH) as tmp:
        tmp = Path(tmp)
        collector.collect(sim, tmp / "sessions", collector.CollectorConfig(episodes=episodes, seed=seed,
                                                                          action_space=action_space), progress=quiet)
        res = ingest.ingest(ingest.IngestConfig((tmp / "sessions",)), tmp / "routing", progress=quiet)
        cfg = DatasetConfig() if eval_fraction is None else DatasetConfig(eval_fraction=eval_fraction)
        built = build_routing_dataset(pq.read_table(res.trajectories).to_pandas(), tab, cat, cfg,
                                      pq.read_table(res.routing_decisions).to_pandas(),
                                      pq.read_table(res.token_usage).to_pandas())
    df, space = built.frame, built.space.of(action_space)
    spec = FeatureSpec(roles=space.roles)
    # BC on the train split, as the bc_policy asset; with --support behaviour it is also the
    # behaviour model of the support rule, as in the assets
    bc_policy = bc.train_bc(from_dataset(df, space).split_rows("train").restrict(space), spec,
                            bc.BCConfig(seed=seed), log=quiet).policy()
    behaviour = bc_policy if support == "behaviour" else None
    sel = oe.train_select_cql(df, space, cql.CQLConfig(seed=seed), oe.DEFAULT_ALPHAS,
                              ope.OPEConfig(n_boot=300, seed=seed), criterion=criterion, progress=quiet,
                              behaviour=behaviour)
    report_cfg = ope.OPEConfig(n_boot=1000, seed=seed)
    if action_space == "sage_binary":
        # exactly the offline_eval asset's path: served composites judged, networks beside them
        report, served = oe.run_sage_binary_eval(df, oe.eval_part(df, "report"), space, tab,
                                                 {"bc": bc_policy, "cql": sel.result.policy()}, report_cfg, sim,
                                                 quiet, behaviour, floor_criterion, mode="per_night")
        policies, subject = report.evaluations, "cql_served"
        subject_policy = served[subject].policy
        extra = {"min_confidence": {n: s.policy.min_confidence for n, s in served.items()},
                 "agreement_eval": {n: s.agreement_eval for n, s in served.items()}}
    else:
        policies = {"static_table": StaticTablePolicy(tab, space), "bc": bc_policy, "cql": sel.result.policy(),
                    "uniform": UniformPolicy(space.actions, space.role_mask())}
        report = oe.run_offline_eval(oe.eval_part(df, "report"), policies, space, report_cfg, sim=sim,
                                     progress=quiet, behaviour=behaviour)
        subject, extra = "cql", {}
        subject_policy = policies[subject]
    gt = report.truth.episode_value
    # the gate as it would decide with each episode estimator (the asset's is oe.GATE_ESTIMATOR, paired),
    # and with the rule before issue 19 (the candidate's lower bound against the table's estimate)
    if clip_factors:  # the subject's clipped step-wise DR at every clip, on the same report episodes
        extra["clip_factors"] = clip_sweep(oe.eval_part(df, "report"), space, subject_policy, behaviour,
                                           seed, clip_factors)
    cands = tuple(n for n in policies if n.endswith("_served")) if action_space == "sage_binary" else None
    gates = {est: oe.promotion_gate(report.evaluations, estimator=est, candidates=cands).promoted
             for est in ("step_dr", "step_wdr", "step_dr_clip")}
    gates["step_dr_clip, value rule"] = oe.promotion_gate(report.evaluations, candidates=cands,
                                                          gate=oe.PromotionGateConfig(rule="value")).promoted
    return {
        "seed": seed, "seconds": time.perf_counter() - t0, "alpha": sel.label, "selected_by": sel.how,
        "action_space": action_space, "subject": subject, "ground_truth": gt,
        "regret_closure": {p: oe.regret_closure(gt[p], gt["static_table"], gt["oracle"]) for p in policies},
        "estimates": report.rows(), "promoted": report.gate.promoted, "gate": report.gate.reason,
        "promoted_by": gates, "gate_candidates": report.gate.candidates, **extra,
    }


def clip_sweep(df_report, space, policy, behaviour, seed: int, clip_factors: tuple[float, ...]) -> dict:
    """``step_dr_clip`` of ``policy`` with each clip factor (``inf``: plain step-wise DR), each
    with its bootstrap interval, on the report half: how ``OPEConfig.clip_factor`` was chosen."""
    from sage_pipeline.rl import ope

    data = ope.LoggedData.from_frame(df_report, space.actions, space.roles)
    bp = ope.policy_probs(behaviour, data) if behaviour is not None else None
    out = {}
    for f in clip_factors:
        e = ope.evaluate_policy(data, policy, ope.OPEConfig(n_boot=1000, seed=seed, clip_factor=f),
                                behaviour_probs=bp, progress=lambda *_: None, keep_terms=False,
                                intervals=("step_dr_clip",)).estimates["step_dr_clip"]
        out[f"{f:g}"] = {"estimate": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high}
    return out


def summarise_clips(runs: list[dict]) -> dict:
    """Per clip factor, over the seeds: the subject's relative error (mean, max, share within
    5%) and how often the 95% interval covers its true value."""
    out = {}
    for f in runs[0]["clip_factors"]:
        cells = [(r["clip_factors"][f], r["ground_truth"][r["subject"]]) for r in runs
                 if r["clip_factors"][f]["estimate"] is not None]
        err = [abs(c["estimate"] - t) / abs(t) for c, t in cells]
        out[f] = {"evaluated": len(cells), "mean_rel_error": statistics.fmean(err) if err else None,
                  "max_rel_error": max(err, default=None),
                  "share_within_5pct": sum(e <= 0.05 for e in err) / len(err) if err else None,
                  "coverage": sum(c["ci_low"] <= t <= c["ci_high"] for c, t in cells) / len(cells) if cells else None}
    return out


def summarise(runs: list[dict]) -> dict:
    subject = runs[0]["subject"]
    rc = [r["regret_closure"][subject] for r in runs]
    out = {"seeds": len(runs), "subject": subject,
           "regret_closure": {"mean": statistics.fmean(rc), "median": statistics.median(rc), "min": min(rc),
                              "share_ge_0.7": sum(x >= 0.7 for x in rc) / len(rc),
                              "share_ge_0.6": sum(x >= 0.6 for x in rc) / len(rc)},
           "promoted_share": {str(p): sum(r["promoted"] == p for r in runs) / len(runs)
                              for p in sorted({r["promoted"] for r in runs}, key=str)},
           "alphas": {a: sum(r["alpha"] == a for r in runs) for a in sorted({r["alpha"] for r in runs})},
           "wrong_promotions": sum(r["promoted"] is not None
                                   and r["ground_truth"][r["promoted"]] <= r["ground_truth"]["static_table"]
                                   for r in runs),
           "wrong_promotions_by": {est: sum(p is not None and r["ground_truth"][p] <= r["ground_truth"]["static_table"]
                                            for r in runs for e, p in r["promoted_by"].items() if e == est)
                                   for est in runs[0]["promoted_by"]},
           "promotions_by": {est: sum(r["promoted_by"][est] is not None for r in runs)
                             for est in runs[0]["promoted_by"]}}
    # the gate's paired interval of each candidate's gain over the table against the true gain
    gains = [(c, r["ground_truth"][n] - r["ground_truth"]["static_table"]) for r in runs
             for n, c in r["gate_candidates"].items() if c.get("difference") is not None]
    out["gate_gain_interval"] = {
        "candidates": len(gains),
        "covers_true_gain": sum(c["difference_ci_low"] <= g <= c["difference_ci_high"] for c, g in gains),
        "mean_error": statistics.fmean(c["difference"] - g for c, g in gains) if gains else None,
        "mean_half_width": statistics.fmean((c["difference_ci_high"] - c["difference_ci_low"]) / 2
                                            for c, g in gains) if gains else None}
    cells: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        for e in r["estimates"]:
            cells.setdefault((e["policy"], e["estimator"]), []).append(e)
    if "clip_factors" in runs[0]:
        out["clip_factors"] = summarise_clips(runs)
    out["estimators"] = {}
    for (pol, est), rows in cells.items():
        ok = [e for e in rows if e["estimate"] is not None]
        out["estimators"][f"{pol}/{est}"] = {
            "scope": rows[0]["scope"], "evaluated": len(ok),
            "coverage": sum(bool(e["covered"]) for e in ok) / len(ok) if ok else None,
            "mean_rel_error": statistics.fmean(e["relative_error"] for e in ok) if ok else None,
            "max_rel_error": max(e["relative_error"] for e in ok) if ok else None,
            "share_within_5pct": sum(e["relative_error"] <= 0.05 for e in ok) / len(ok) if ok else None,
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=count, default=50)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--workers", type=count, default=2)
    ap.add_argument("--episodes", type=int, default=None, help="default: the collector's default")
    ap.add_argument("--criterion", default="fqe", choices=("fqe", "estimate", "lower_bound"),
                    help="how OPE picks CQL's alpha (the cql_policy asset's default: fqe)")
    ap.add_argument("--eval-fraction", type=float, default=None,
                    help="share of sessions in the eval split (default: the routing_dataset default)")
    ap.add_argument("--support", default="logged_pairs", choices=("logged_pairs", "behaviour"),
                    help="support rule: (role, model) pairs present in the evaluated logs, or the behaviour "
                         "policy's support as BC (trained on the train split) models it")
    ap.add_argument("--action-space", default="multi_model", choices=("multi_model", "sage_binary"),
                    help="sage_binary: SAGE's primary/fallback space, judged as served (distilled classifiers, "
                         "confidence floor, YAML fallback) against the best binary policy")
    ap.add_argument("--floor-criterion", default="fqe", choices=("fqe", "estimate", "lower_bound"),
                    help="sage_binary: how OPE on the select half picks the served composite's confidence floor")
    ap.add_argument("--clip-factors", type=float, nargs="*", default=[],
                    help="also evaluate the subject with step_dr_clip at each of these clip factors (inf: plain "
                         "step-wise DR) on the same report episodes, e.g. 1 1.5 2 3 inf")
    ap.add_argument("--exploring-sage", action="store_true",
                    help="the logs of SAGE's unchanged router running the exploring checkpoint around its YAML "
                         "table: OPE of SAGE-executable candidates against the truth (benchmarks/exploring_ope.py, "
                         "which takes --seeds, --first-seed, --workers, --episodes and --exploration-rate)")
    ap.add_argument("--exploration-rate", type=float, default=None,
                    help="--exploring-sage: the exploring checkpoint's rate (default: ExploreConfig's; 0 is "
                         "SAGE's deterministic YAML logging)")
    ap.add_argument("--out", default=None, help="file name under benchmarks/.scratch/ "
                    "(default offline_quality[_sage_binary].json)")
    args = ap.parse_args()
    if args.exploring_sage:
        import exploring_ope

        argv = ["--seeds", str(args.seeds), "--first-seed", str(args.first_seed), "--workers", str(args.workers)]
        argv += ["--episodes", str(args.episodes)] if args.episodes is not None else []
        argv += ["--rate", str(args.exploration_rate)] if args.exploration_rate is not None else []
        argv += ["--out", args.out] if args.out else []
        return exploring_ope.main(argv)
    SCRATCH.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.episodes is None:
        from sage_pipeline.routing.collector import CollectorConfig

        args.episodes = CollectorConfig().episodes
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    t0 = time.perf_counter()
    runs = []
    with ProcessPoolExecutor(args.workers) as pool:
        n = len(seeds)
        for r in pool.map(run_seed, seeds, [args.episodes] * n, [args.criterion] * n, [args.eval_fraction] * n,
                          [args.support] * n, [args.action_space] * n, [args.floor_criterion] * n,
                          [tuple(args.clip_factors)] * n):
            runs.append(r)
            subj = r["subject"]
            print(f"seed {r['seed']:3d}: cql {r['alpha']:<10} {subj} regret closure {r['regret_closure'][subj]:.3f}  "
                  f"truth static {r['ground_truth']['static_table']:.4f} {subj} {r['ground_truth'][subj]:.4f} "
                  f"oracle {r['ground_truth']['oracle']:.4f}  promoted {r['promoted']}  ({r['seconds']:.0f}s)"
                  + (f"  floors {r['min_confidence']}" if "min_confidence" in r else ""), flush=True)
    s = summarise(runs)
    print(f"\n{s['seeds']} seeds in {time.perf_counter() - t0:.0f}s ({args.action_space})")
    rc = s["regret_closure"]
    print(f"{s['subject']} regret closure: mean {rc['mean']:.3f}, median {rc['median']:.3f}, min {rc['min']:.3f}, "
          f">= 0.7 in {rc['share_ge_0.7']:.0%}, >= 0.6 in {rc['share_ge_0.6']:.0%} of seeds")
    print(f"alphas chosen: {s['alphas']}")
    print(f"promoted: {s['promoted_share']}; promoted but not truly better than the table: {s['wrong_promotions']}")
    for est, k in s["promotions_by"].items():
        print(f"gate on {est}: {k} promotions, {s['wrong_promotions_by'][est]} not truly better than the table")
    print(f"the gate's paired interval of the gain over the table: {s['gate_gain_interval']}")
    for f, v in s.get("clip_factors", {}).items():
        print(f"{s['subject']} step_dr_clip at clip factor {f}: mean rel err {v['mean_rel_error']:.2%}, max "
              f"{v['max_rel_error']:.2%}, within 5% in {v['share_within_5pct']:.0%}, coverage {v['coverage']:.0%} "
              f"({v['evaluated']} seeds)")
    print(f"\n{'policy/estimator':<30}{'scope':<10}{'coverage':>10}{'mean rel err':>14}{'max rel err':>13}"
          f"{'<=5%':>7}")
    for k, v in s["estimators"].items():
        if v["coverage"] is None:
            print(f"{k:<30}{v['scope']:<10}{'no support':>10}")
            continue
        print(f"{k:<30}{v['scope']:<10}{v['coverage']:>10.0%}{v['mean_rel_error']:>14.2%}{v['max_rel_error']:>13.2%}"
              f"{v['share_within_5pct']:>7.0%}")
    out = SCRATCH / (args.out or ("offline_quality.json" if args.action_space == "multi_model"
                                  else f"offline_quality_{args.action_space}.json"))
    out.write_text(json.dumps({"args": vars(args), "summary": s, "runs": runs}, indent=1))
    print(f"\nresults: {out}")


if __name__ == "__main__":
    main()
