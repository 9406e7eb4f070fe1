"""A simulated month of deploy -> log -> retrain -> gate -> promote, over many seeds (issue 19).

For every seed and world (stationary; drifting: one model's quality -30% on day 10, another's
price x2 on day 20), ``sage_pipeline.rl.policy_iteration.run_month`` runs side by side on the
same days and tasks: the static table forever, the online bandit (SAGE's Tier 1), the nightly
offline chain with the gate (journals -> ingest -> routing dataset -> CQL -> SAGE's served
classifiers -> gate against the deployed policy) and the oracle (the best binary policy of
each day's world). Each candidate the offline gate passes is A/B-tested online against the
deployed policy (``rl.online_ab``, common random numbers) with the gate's OPE estimates, and
deployed only if the online interval of its gain lies above 0 (``--no-confirm-online``: the
offline gate alone decides). When a day's logged return drops against the day before (same
deployed policy and exploration; one-sided z > ``--change-z``), the loop takes it for a change:
the window restarts that day and the router explores at ``--epsilon-max`` for
``--explore-days`` days (``--no-change-detection``: it does not react). The bandit's own
journals of the last days are evaluated offline by the same OPE.

Goals (issue 19), over 20 seeds:
- stationary: the nightly loop's cumulative regret over 30 days <= 40% of the static table's,
  0 wrong promotions;
- drifting: within 3 days of each change the deployed policy's true value is within 5% of the
  new oracle's;
- the bandit's regret beside both, its logs evaluated by OPE within 5% of the true value;
- online A/B's interval contains OPE's estimate in >= 90% of seeds.

    .venv/bin/python benchmarks/closed_loop.py [--seeds 20] [--first-seed 0] [--workers 2] [--days 30]
        [--worlds stationary drifting] [--episodes-per-day 2000] [--cql-steps 500]
        [--exploration gap|uniform] [--epsilon-max 0.3] [--epsilon-min 0.02] [--epsilon 0.1]
        [--gate-rule paired|value] [--min-gain 0.005] [--no-confirm-online] [--window-days 2] [--fit-days 1]
        [--no-change-detection] [--change-z 5] [--explore-days 1]
        [--bandit thompson|linucb]
    .venv/bin/python benchmarks/closed_loop.py --online-ab [--seeds 20] [--ab-episodes 2000]

``--online-ab`` answers the last goal at the assets' default size: the offline chain in SAGE's
binary space on 20,000 logged episodes, then the promoted served policy against the table
online, with offline_eval's estimates.

The gate measured here is the per-night one (``offline_eval.run_sage_binary_eval(...,
mode="per_night")``: tonight's paired verdict on tonight's report half, valid for one night only).
The offline_eval asset decides SAGE's binary space through the decision ledger by default
(``mode="ledger"``, issue 47), which issue 47's month benchmark measures.

Results: printed (a markdown table for docs/benchmarks.md), every seed's days in
``benchmarks/.scratch/closed_loop.json`` (``--out``) and the value-by-day plot of the first seed
beside it, ``closed_loop_<world>.png``.
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

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SCRATCH = ROOT / "benchmarks" / ".scratch"


# the loop's config field (section.field, as pydantic's error locates it) -> the flag that sets it
FLAGS = {"days": "--days", "episodes_per_day": "--episodes-per-day", "cql_steps": "--cql-steps",
         "alphas": "--alphas", "floors": "--floors", "window_days": "--window-days",
         "change.z": "--change-z", "change.explore_days": "--explore-days", "gate.min_gain": "--min-gain",
         "exploration.epsilon": "--epsilon", "exploration.epsilon_max": "--epsilon-max",
         "exploration.epsilon_min": "--epsilon-min", "exploration.fit_days": "--fit-days"}


def month_config(seed: int, world: str, kw: dict):
    """The month's ``LoopConfig`` from the flags' values (``kw`` as ``main`` builds it); a bad value
    raises pydantic's ValidationError, located at the config's field."""
    from sage_pipeline.rl import policy_iteration as pi
    from sage_pipeline.rl.bandit import BanditConfig

    kw = dict(kw)
    return pi.LoopConfig(seed=seed, world=pi.WorldConfig(drift=world == "drifting"),
                         bandit=BanditConfig(algorithm=kw.pop("bandit")), **kw)


def config_error(exc) -> str:
    """A ValidationError as one line per field: the flag that set it, the field, what is wrong."""
    out = []
    for e in exc.errors():
        field = ".".join(str(part) for part in e["loc"] if not isinstance(part, int))
        out.append(f"{FLAGS.get(field, field)} (the loop's {field}): {e['msg']}, got {e['input']!r}")
    return "; ".join(out)


def run_one(seed: int, world: str, kw: dict) -> dict:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from sage_pipeline.rl import policy_iteration as pi

    t0 = time.perf_counter()
    res = pi.run_month(month_config(seed, world, kw), progress=lambda *_: None)
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
    from sage_pipeline.sage.table import RoutingTable

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
                                             ope.OPEConfig(n_boot=1000, seed=seed), sim, quiet,
                                             mode="per_night")  # the one-night gate this benchmark measures
    out = {"seed": seed, "promoted": report.gate.promoted}
    prom = report.gate.promoted
    if prom is not None:
        static, b = StaticTablePolicy(tab, space), served[prom].policy
        cand = report.gate.candidates[prom]  # OPE's paired interval of the gain, as online_ab reads it
        est = ab.ope_estimates_from_summary(report.summary(), prom) | {
            k: cand[k] for k in ("difference_ci_low", "difference_ci_high")}
        rep = ab.online_ab(sim, static, b, ab.OnlineABConfig(episodes=ab_episodes, seed=seed), est,
                           ("static_table", prom))
        gt = report.truth.episode_value
        data = ope.LoggedData.from_frame(oe.eval_part(df, "report"), space.actions, space.roles)
        out |= {"ope": rep.ope, "difference": rep.difference, "true_difference": rep.true_difference,
                "value": rep.arms[prom]["value"], "true_value": rep.arms[prom]["true_value"],
                "ope_difference_inside": rep.ope_difference_inside, "ope_value_inside": rep.ope_value_inside,
                "ope_agrees": rep.ope_agrees,
                # OPE's own paired interval of the gain, and the gain on the report half's tasks
                "ope_gain_interval": [cand["difference_ci_low"], cand["difference_ci_high"]],
                "true_gain_report_tasks": gt[prom] - gt["static_table"],
                # the same estimator with the simulator's exact Q-functions in place of the fitted ones
                "ope_gain_exact_q": exact_q_gain(sim, data, static, b)}
    out["seconds"] = time.perf_counter() - t0
    return out


def exact_q_gain(sim, data, a, b) -> float:
    """Clipped step-wise DR of ``b - a`` on ``data`` with each policy's exact Q-function (the
    simulator's backward induction) as its model: what the gate's estimator would read if its
    fitted-Q model had no error. Its remaining error is the importance-weighted reward noise."""
    import numpy as np

    from sage_pipeline.rl import ope

    lay = ope.episode_layout(data.episode_id, data.step)
    clip, rows, T = ope.clip_level(data.pscore), np.arange(len(data)), sim.config.max_attempts
    t = np.minimum(data.contexts.failure_count, T - 1)
    pfc = np.minimum(data.contexts.primary_failure_count, t)
    terms = []
    for pol in (a, b):
        q = sim._backward(sim.tasks_of(data.contexts), pol)[0][rows, t, pfc]  # Q^pol at each logged state
        q = np.where(np.isfinite(q), q, 0.0)
        pi = ope.policy_probs(pol, data)
        terms.append(ope.step_dr_clip(data.reward, data.pscore, pi[rows, data.action], q[rows, data.action],
                                      (pi * q).sum(axis=1), lay.episode, lay.step, clip=clip).round_rewards)
    return float((terms[1] - terms[0]).mean())


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
    if not tested:  # nothing to compare online: say so instead of failing on empty statistics
        Path(a.out).write_text(json.dumps({"args": vars(a), "summary": {"seeds": len(runs), "promoted": 0},
                                           "runs": runs}, default=str))
        print(f"no seed promoted a policy ({len(runs)} seeds): nothing was A/B-tested; log more episodes "
              "(--ab-log-episodes)")
        return
    def inside(key):
        return _share(r["difference"]["ci_low"] <= key(r) <= r["difference"]["ci_high"] for r in tested)

    err = [r["ope"]["difference"] - r["true_gain_report_tasks"] for r in tested]
    summary = {"seeds": len(runs), "promoted": len(tested), "episodes_per_arm": a.ab_episodes,
               "ope_difference_inside": _share(r["ope_difference_inside"] for r in tested),
               # what OPE could do at best on these logs: with exact Q-functions, and the exact gain itself
               "exact_q_ope_difference_inside": inside(lambda r: r["ope_gain_exact_q"]),
               "report_tasks_true_gain_inside": inside(lambda r: r["true_gain_report_tasks"]),
               "ope_gain_error": {"mean": statistics.fmean(err), "sd": statistics.stdev(err) if len(err) > 1 else None},
               "ope_gain_error_exact_q": {
                   "mean": statistics.fmean(r["ope_gain_exact_q"] - r["true_gain_report_tasks"] for r in tested),
                   "sd": statistics.stdev(r["ope_gain_exact_q"] - r["true_gain_report_tasks"] for r in tested)
                   if len(tested) > 1 else None},
               "ope_gain_interval_covers_true_gain": _share(r["ope_gain_interval"][0] <= r["true_gain_report_tasks"]
                                                            <= r["ope_gain_interval"][1] for r in tested),
               "ope_gain_interval_half_width": statistics.fmean(
                   (r["ope_gain_interval"][1] - r["ope_gain_interval"][0]) / 2 for r in tested),
               "online_half_width": statistics.fmean((r["difference"]["ci_high"] - r["difference"]["ci_low"]) / 2
                                                     for r in tested),
               # agreement with both errors counted: OPE's gain and the online gain differ by less than
               # 1.96 x the standard error of their difference (OPE's from its paired bootstrap interval)
               "agree_with_both_errors": _share(r["ope_agrees"] for r in tested),
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
             # what the offline gate alone passed, before the online A/B confirmed or stopped it
             "offline_gate_passed": sum(x["offline_gate_passed"] for x in s),
             "offline_gate_wrong": sum(x["offline_gate_wrong"] for x in s),
             "rejected_online": sum(x["rejected_online"] for x in s),
             "seeds_with_a_promotion": _share(x["promotions"] > 0 for x in s),
             "online_ab_promotions_inside": f"{sum(x['online_ab']['ope_difference_inside'] for x in s)}/"
                                            f"{sum(x['online_ab']['promotions_tested'] for x in s)}",
             "online_ab_first_promotion_inside": _share(x["online_ab"]["first_from_static_inside"]
                                                        for x in s if x["online_ab"]["first_from_static_inside"]
                                                        is not None),
             "seconds_mean": statistics.fmean(r["seconds"] for r in rs)}
        # where the nightly loop's regret goes: its exploration, and the served policy's gap to the oracle
        w["nightly_regret_parts"] = {
            "exploration": statistics.fmean(sum(d["nightly_deployed"] - d["nightly"] for d in r["days"]) for r in rs),
            "served_gap": statistics.fmean(sum(d["oracle"] - d["nightly_deployed"] for d in r["days"]) for r in rs)}
        # the days the loop took a drop in its logged return for a change (none is right in the stationary world)
        w["changes_detected"] = {r["seed"]: r["summary"]["changes_detected"]
                                 for r in sorted(rs, key=lambda r: r["seed"])}
        w["first_promotion_night"] = [next((d["day"] for d in r["days"] if d.get("promoted")), None)
                                      for r in sorted(rs, key=lambda r: r["seed"])]
        # the gate's paired interval against the candidate's true gain (on the fixed eval tasks), every night
        nights = [d for r in rs for d in r["days"] if (d.get("gate_difference") or {}).get("difference") is not None]
        covered = [d["gate_difference"]["difference_ci_low"] <= d["candidate_true_value"] - d["nightly_deployed"]
                   <= d["gate_difference"]["difference_ci_high"] for d in nights]
        w["gate_interval_covers_true_gain"] = _share(covered)
        w["wrong_promotion_sizes"] = [round(d["candidate_true_value"] - d["nightly_deployed"], 5)
                                      for r in rs for d in r["days"] if d.get("wrong_promotion")]
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
                               "gap_on_day_3_mean": (statistics.fmean(g for g in gaps if g is not None)
                                                     if any(g is not None for g in gaps) else None),
                               "days_to_within_5pct": [x["recovery"][change]["days_to_within_5pct"] for x in s]}
            w["recovery"] = rec
            # the same criterion for the bandit and the table, for comparison
            for arm in ("bandit", "static_table"):
                w[f"{arm}_within_5pct_by_day_3"] = {
                    c: _share(any((d["oracle"] - d[arm]) / abs(d["oracle"]) <= 0.05 for d in r["days"]
                                  if int(c) <= d["day"] <= int(c) + 3) for r in rs) for c in ("10", "20")}
        out[world] = w
    return out


def plot_first(runs: list[dict], folder: Path = SCRATCH) -> None:
    from sage_pipeline.rl.policy_iteration import plot_days

    for world in {r["world"] for r in runs}:
        first = min((r for r in runs if r["world"] == world), key=lambda r: r["seed"])
        (folder / f"closed_loop_{world}.png").write_bytes(plot_days(first["days"], f"{world} world, seed "
                                                                                     f"{first['seed']}"))


def main() -> None:
    from sage_pipeline.rl.policy_iteration import LoopConfig

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=count, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--workers", type=count, default=2)
    ap.add_argument("--worlds", nargs="+", default=["stationary", "drifting"], choices=["stationary", "drifting"])
    d, x = LoopConfig(), LoopConfig().exploration  # the defaults are the loop's own
    ap.add_argument("--days", type=int, default=d.days)
    ap.add_argument("--episodes-per-day", type=int, default=d.episodes_per_day)
    ap.add_argument("--cql-steps", type=int, default=d.cql_steps)
    ap.add_argument("--alphas", type=float, nargs="+", default=list(d.alphas))
    ap.add_argument("--floors", type=float, nargs="+", default=list(d.floors))
    ap.add_argument("--exploration", default=x.rule, choices=["gap", "uniform"],
                    help="the deployed router's exploration (policy_iteration.ExplorationConfig)")
    ap.add_argument("--epsilon", type=float, default=x.epsilon, help="uniform exploration's rate")
    ap.add_argument("--epsilon-max", type=float, default=x.epsilon_max, help="gap exploration's rate at a tie")
    ap.add_argument("--epsilon-min", type=float, default=x.epsilon_min, help="gap exploration's floor")
    ap.add_argument("--fit-days", type=int, default=x.fit_days,
                    help="gap exploration: days of journals its Q-function is fitted on")
    ap.add_argument("--gate-rule", default=d.gate.rule, choices=["paired", "value"],
                    help="paired: the gain's paired lower bound; value: the candidate's lower bound against the "
                         "deployed estimate (the gate before issue 19)")
    ap.add_argument("--min-gain", type=float, default=d.gate.min_gain,
                    help="the gate's bar (share of the deployed value)")
    ap.add_argument("--no-confirm-online", action="store_true",
                    help="the offline gate alone promotes (no online A/B confirmation before deploying)")
    ap.add_argument("--window-days", type=int, default=d.window_days)
    ap.add_argument("--no-change-detection", action="store_true",
                    help="the loop does not react to a drop in its logged return (policy_iteration.ChangeConfig)")
    ap.add_argument("--change-z", type=float, default=d.change.z,
                    help="the one-sided z of a day's drop in logged return that counts as a change")
    ap.add_argument("--explore-days", type=int, default=d.change.explore_days,
                    help="days after a detected change that explore at --epsilon-max everywhere")
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
          "alphas": tuple(a.alphas), "floors": tuple(a.floors), "window_days": a.window_days, "bandit": a.bandit,
          "change": {"enabled": not a.no_change_detection, "z": a.change_z, "explore_days": a.explore_days},
          "gate": {"rule": a.gate_rule, "min_gain": a.min_gain, "confirm_online": not a.no_confirm_online},
          "exploration": {"rule": a.exploration, "epsilon": a.epsilon, "epsilon_max": a.epsilon_max,
                          "epsilon_min": a.epsilon_min, "fit_days": a.fit_days}}
    from pydantic import ValidationError

    try:  # refused here, naming the flag, not in a worker's traceback
        month_config(a.first_seed, a.worlds[0], kw)
    except ValidationError as exc:
        ap.error(config_error(exc))
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
                  f"promotions {x['promotions']} wrong {x['wrong_promotions']} (offline gate passed "
                  f"{x['offline_gate_passed']}, wrong {x['offline_gate_wrong']}), recovery "
                  f"{ {k: v['days_to_within_5pct'] for k, v in x['recovery'].items()} }", flush=True)
            Path(a.out).write_text(json.dumps({"args": vars(a), "runs": runs}, default=str))
    summary = summarise(runs)
    Path(a.out).write_text(json.dumps({"args": vars(a), "wall_s": time.perf_counter() - t0, "summary": summary,
                                       "runs": runs}, default=str))
    plot_first(runs, Path(a.out).parent)  # beside the results
    print(json.dumps(summary, indent=1, default=str))
    print(f"wall {time.perf_counter() - t0:.0f} s; {a.seeds} seeds x {len(a.worlds)} worlds, {a.workers} workers")


if __name__ == "__main__":
    main()
