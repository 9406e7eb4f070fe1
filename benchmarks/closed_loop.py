"""A simulated month of deploy -> log -> retrain -> gate -> promote, over many seeds (issue 19).

For every seed and world (stationary; drifting: one model's quality -30% on day 10, another's
price x2 on day 20), ``sage_pipeline.rl.policy_iteration.run_month`` runs side by side on the
same days and tasks: the static table forever, the online bandit (SAGE's Tier 1), the nightly
offline chain with the gate (journals -> ingest -> routing dataset -> CQL -> SAGE's served
classifiers -> gate against the deployed policy) and the oracle (the best binary policy of
each day's world). Each promotion is A/B-tested online against the policy it replaces
(``rl.online_ab``, common random numbers) with the gate's OPE estimates. The bandit's own
journals of the last days are evaluated offline by the same OPE.

Goals (issue 19), over 20 seeds:
- stationary: the nightly loop's cumulative regret over 30 days <= 40% of the static table's,
  0 wrong promotions;
- drifting: within 3 days of each change the deployed policy's true value is within 5% of the
  new oracle's;
- the bandit's regret beside both, its logs evaluated by OPE within 5% of the true value;
- online A/B's interval contains OPE's estimate in >= 90% of seeds.

    .venv/bin/python benchmarks/closed_loop.py [--seeds 20] [--first-seed 0] [--workers 2] [--days 30]
        [--worlds stationary drifting] [--episodes-per-day 2000] [--cql-steps 500] [--epsilon 0.1]
        [--window-days 3] [--bandit thompson|linucb]
    .venv/bin/python benchmarks/closed_loop.py --online-ab [--seeds 20] [--ab-episodes 2000]

``--online-ab`` answers the last goal at the assets' default size: the offline chain in SAGE's
binary space on 20,000 logged episodes, then the promoted served policy against the table
online, with offline_eval's estimates.

Results: printed (a markdown table for docs/benchmarks.md), every seed's days in
``benchmarks/.scratch/closed_loop.json`` and the value-by-day plot of the first seed in
``benchmarks/.scratch/closed_loop_<world>.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCRATCH = ROOT / "benchmarks" / ".scratch"


def run_one(seed: int, world: str, kw: dict) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from sage_pipeline.rl import policy_iteration as pi
    from sage_pipeline.rl.bandit import BanditConfig

    t0 = time.perf_counter()
    cfg = pi.LoopConfig(seed=seed, world=pi.WorldConfig(drift=world == "drifting"),
                        bandit=BanditConfig(algorithm=kw.pop("bandit")), **kw)
    res = pi.run_month(cfg, progress=lambda *_: None)
    return {"seed": seed, "world": world, "seconds": time.perf_counter() - t0, "summary": res.summary,
            "bandit_ope": res.bandit_ope, "days": res.days}


def ab_seed(seed: int, episodes: int, ab_episodes: int) -> dict:
    """The online_ab asset's question at the assets' default size: the offline chain in SAGE's binary
    space (collector, ingest, routing dataset, BC and CQL, served composites, offline_eval's report and
    gate, exactly as ``benchmarks/offline_quality.py --action-space sage_binary``), then the promoted
    served policy against the table online (``rl.online_ab``) with offline_eval's estimates."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import tempfile

    import pyarrow.parquet as pq

    from sage_pipeline.rl import bc, cql, offline_eval as oe, online_ab as ab, ope
    from sage_pipeline.rl.data import from_dataset
    from sage_pipeline.routing import collector, ingest
    from sage_pipeline.routing.catalogue import ModelCatalogue
    from sage_pipeline.routing.features import FeatureSpec
    from sage_pipeline.routing.policy import StaticTablePolicy
    from sage_pipeline.routing.routing_dataset import DatasetConfig, build_routing_dataset
    from sage_pipeline.routing.routing_simulator import RoutingSimulator
    from sage_pipeline.routing.table import RoutingTable

    t0, quiet = time.perf_counter(), (lambda *_: None)
    cat, tab = ModelCatalogue.load(), RoutingTable.load()
    sim = RoutingSimulator(cat, tab)
    with tempfile.TemporaryDirectory(dir=SCRATCH) as tmp:
        tmp = Path(tmp)
        collector.collect(sim, tmp / "sessions", collector.CollectorConfig(episodes=episodes, seed=seed,
                                                                          action_space="sage_binary"), progress=quiet)
        res = ingest.ingest(ingest.IngestConfig((tmp / "sessions",)), tmp / "routing", progress=quiet)
        built = build_routing_dataset(pq.read_table(res.trajectories).to_pandas(), tab, cat, DatasetConfig(),
                                      pq.read_table(res.routing_decisions).to_pandas(),
                                      pq.read_table(res.token_usage).to_pandas())
    df, space = built.frame, built.space.binary()
    bc_pol = bc.train_bc(from_dataset(df, space).split_rows("train").restrict(space), FeatureSpec(roles=space.roles),
                         bc.BCConfig(seed=seed), log=quiet).policy()
    sel = oe.train_select_cql(df, space, cql.CQLConfig(seed=seed), oe.DEFAULT_ALPHAS,
                              ope.OPEConfig(n_boot=300, seed=seed),
                              progress=quiet)
    report, served = oe.run_sage_binary_eval(df, oe.eval_part(df, "report"), space, tab,
                                             {"bc": bc_pol, "cql": sel.result.policy()},
                                             ope.OPEConfig(n_boot=1000, seed=seed), sim, quiet)
    out = {"seed": seed, "promoted": report.gate.promoted}
    if report.gate.promoted is not None:
        est = ab.ope_estimates_from_summary(report.summary(), report.gate.promoted)
        rep = ab.online_ab(sim, StaticTablePolicy(tab, space), served[report.gate.promoted].policy,
                           ab.OnlineABConfig(ab_episodes, seed), est, ("static_table", report.gate.promoted))
        out |= {"ope": rep.ope, "difference": rep.difference, "true_difference": rep.true_difference,
                "value": rep.arms[report.gate.promoted]["value"],
                "true_value": rep.arms[report.gate.promoted]["true_value"],
                "ope_difference_inside": rep.ope_difference_inside, "ope_value_inside": rep.ope_value_inside}
    out["seconds"] = time.perf_counter() - t0
    return out


def ab_main(a) -> None:
    t0, runs = time.perf_counter(), []
    with ProcessPoolExecutor(max_workers=a.workers) as pool:
        for f in as_completed([pool.submit(ab_seed, s, a.ab_log_episodes, a.ab_episodes)
                               for s in range(a.first_seed, a.first_seed + a.seeds)]):
            r = f.result()
            runs.append(r)
            print(f"seed {r['seed']:>3} {r['seconds']:5.0f} s promoted {r['promoted']}: difference "
                  f"{r.get('difference')} OPE {r.get('ope')} inside {r.get('ope_difference_inside')} "
                  f"(value inside {r.get('ope_value_inside')})", flush=True)
    tested = [r for r in runs if r["promoted"] is not None]
    summary = {"seeds": len(runs), "promoted": len(tested), "episodes_per_arm": a.ab_episodes,
               "ope_difference_inside": _share(r["ope_difference_inside"] for r in tested),
               "ope_value_inside": _share(r["ope_value_inside"] for r in tested),
               "true_difference_inside": _share(r["difference"]["ci_low"] <= r["true_difference"]
                                                <= r["difference"]["ci_high"] for r in tested),
               "wall_s": time.perf_counter() - t0}
    Path(a.out).write_text(json.dumps({"args": vars(a), "summary": summary, "runs": runs}, default=str))
    print(json.dumps(summary, indent=1))


def _share(xs) -> str:
    xs = [bool(x) for x in xs]
    return f"{sum(xs)}/{len(xs)}"


def summarise(runs: list[dict]) -> dict:
    out = {}
    for world in sorted({r["world"] for r in runs}):
        rs = [r for r in runs if r["world"] == world]
        s = [r["summary"] for r in rs]
        reg = {a: [x["cumulative_regret"][a] for x in s] for a in s[0]["cumulative_regret"]}
        share = [x["nightly_regret_share_of_static"] for x in s]
        w = {"seeds": len(rs), "regret_mean": {a: statistics.fmean(v) for a, v in reg.items()},
             "regret_min_max": {a: (min(v), max(v)) for a, v in reg.items()},
             "nightly_share_of_static": {"mean": statistics.fmean(share), "max": max(share),
                                         "seeds_le_0.4": _share(x <= 0.4 for x in share)},
             "bandit_share_of_static": statistics.fmean(x["cumulative_regret"]["bandit"]
                                                        / x["cumulative_regret"]["static_table"] for x in s),
             "promotions": sum(x["promotions"] for x in s), "wrong_promotions": sum(x["wrong_promotions"] for x in s),
             "seeds_with_a_promotion": _share(x["promotions"] > 0 for x in s),
             "online_ab_promotions_inside": f"{sum(x['online_ab']['ope_difference_inside'] for x in s)}/"
                                            f"{sum(x['online_ab']['promotions_tested'] for x in s)}",
             "online_ab_first_promotion_inside": _share(x["online_ab"]["first_from_static_inside"]
                                                        for x in s if x["online_ab"]["first_from_static_inside"]
                                                        is not None),
             "seconds_mean": statistics.fmean(r["seconds"] for r in rs)}
        errs = {p: [r["bandit_ope"][p]["relative_error"] for r in rs if p in r["bandit_ope"]
                    and r["bandit_ope"][p]["relative_error"] is not None] for p in ("bandit_final", "static_table")}
        w["bandit_logs_ope"] = {p: {"mean_rel_error": statistics.fmean(e) if e else None,
                                    "max_rel_error": max(e) if e else None,
                                    "within_5pct": _share(x <= 0.05 for x in e)} for p, e in errs.items()}
        if world == "drifting":
            rec = {}
            for change in ("10", "20"):
                gaps = [x["recovery"][change]["gap_on_day_3"] for x in s]
                rec[change] = {"within_5pct_by_day_3": _share(x["recovery"][change]["within_5pct_by_day_3"] for x in s),
                               "gap_on_day_3_mean": statistics.fmean(g for g in gaps if g is not None),
                               "days_to_within_5pct": [x["recovery"][change]["days_to_within_5pct"] for x in s]}
            w["recovery"] = rec
            # the same criterion for the bandit and the table, for comparison
            for arm in ("bandit", "static_table"):
                w[f"{arm}_within_5pct_by_day_3"] = {
                    c: _share(any((d["oracle"] - d[arm]) / abs(d["oracle"]) <= 0.05 for d in r["days"]
                                  if int(c) <= d["day"] <= int(c) + 3) for r in rs) for c in ("10", "20")}
        out[world] = w
    return out


def plot_first(runs: list[dict]) -> None:
    from sage_pipeline.rl.policy_iteration import plot_days

    for world in {r["world"] for r in runs}:
        first = min((r for r in runs if r["world"] == world), key=lambda r: r["seed"])
        (SCRATCH / f"closed_loop_{world}.png").write_bytes(plot_days(first["days"], f"{world} world, seed "
                                                                                     f"{first['seed']}"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--worlds", nargs="+", default=["stationary", "drifting"], choices=["stationary", "drifting"])
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--episodes-per-day", type=int, default=2000)
    ap.add_argument("--cql-steps", type=int, default=500)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.03, 0.1, 0.3, 1.0])
    ap.add_argument("--floors", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.55])
    ap.add_argument("--epsilon", type=float, default=0.1)
    ap.add_argument("--window-days", type=int, default=3)
    ap.add_argument("--bandit", default="thompson", choices=["thompson", "linucb"])
    ap.add_argument("--online-ab", action="store_true", help="instead of the month: the online_ab asset's "
                    "question over seeds, at the assets' default size (offline chain in SAGE's binary space, then "
                    "the promoted served policy against the table online)")
    ap.add_argument("--ab-log-episodes", type=int, default=20_000, help="--online-ab: logged episodes per seed")
    ap.add_argument("--ab-episodes", type=int, default=2000, help="--online-ab: simulated tasks per arm")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    SCRATCH.mkdir(parents=True, exist_ok=True)
    if a.online_ab:
        a.out = a.out or str(SCRATCH / "closed_loop_online_ab.json")
        return ab_main(a)
    a.out = a.out or str(SCRATCH / "closed_loop.json")
    kw = {"days": a.days, "episodes_per_day": a.episodes_per_day, "cql_steps": a.cql_steps,
          "alphas": tuple(a.alphas), "floors": tuple(a.floors), "epsilon": a.epsilon, "window_days": a.window_days,
          "bandit": a.bandit}
    jobs = [(s, w) for s in range(a.first_seed, a.first_seed + a.seeds) for w in a.worlds]
    t0, runs = time.perf_counter(), []
    with ProcessPoolExecutor(max_workers=a.workers) as pool:
        futs = {pool.submit(run_one, s, w, dict(kw)): (s, w) for s, w in jobs}
        for f in as_completed(futs):
            r = f.result()
            runs.append(r)
            x = r["summary"]
            print(f"seed {r['seed']:>3} {r['world']:<10} {r['seconds']:6.0f} s  regret table "
                  f"{x['cumulative_regret']['static_table']:.3f} bandit {x['cumulative_regret']['bandit']:.3f} "
                  f"nightly {x['cumulative_regret']['nightly']:.3f} (share {x['nightly_regret_share_of_static']:.2f}), "
                  f"promotions {x['promotions']} wrong {x['wrong_promotions']}, recovery "
                  f"{ {k: v['days_to_within_5pct'] for k, v in x['recovery'].items()} }", flush=True)
            Path(a.out).write_text(json.dumps({"args": vars(a), "runs": runs}, default=str))
    summary = summarise(runs)
    Path(a.out).write_text(json.dumps({"args": vars(a), "wall_s": time.perf_counter() - t0, "summary": summary,
                                       "runs": runs}, default=str))
    plot_first(runs)
    print(json.dumps(summary, indent=1, default=str))
    print(f"wall {time.perf_counter() - t0:.0f} s; {a.seeds} seeds x {len(a.worlds)} worlds, {a.workers} workers")


if __name__ == "__main__":
    main()
