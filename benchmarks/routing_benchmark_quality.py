"""Routing benchmark quality: do the learned routers beat the random router, on MMLU and on many-model tables?

Run from the repository root::

    .venv/bin/python benchmarks/routing_benchmark_quality.py [--seeds 0 1 ... 9]
        [--tables mmlu syn8-binary syn11-binary syn11-graded syn8-binary-sharp syn11-binary-sharp]
        [--featurizers tfidf_svd length]

Tables: ``mmlu`` is the packaged RouteLLM MMLU table (2 models, contaminated prompts excluded,
duplicates dropped); ``synK-binary`` / ``synK-graded`` are synthetic tables with K models from
the routing simulator's catalogue (``sage_pipeline.routing_benchmark.synthetic``: 6,000 prompts,
SAGE roles as topics, latent complexity, the simulator's success law with its sharpness 8;
``-sharp``: sharpness 40 and less hidden complexity, so outcomes are nearly predictable from the
text and the oracle nearly achievable), written as RouterBench wide CSVs with pandas' index
and imported as shipped. For each split seed (a different 75/25
train/test split by prompt) and featurizer, ``routing_benchmark.run.run_benchmark`` with the asset's
defaults; side by side on the same held-out prompts: every single model, the zero router,
random, the oracle, ``cost_only`` and, on synthetic tables, ``bayes`` (routing by the true
success probability: the best any router can do without seeing outcomes). Prints, per table:

* every router's AIQ (mean ± sd over splits), its margin over the random router with a 95%
  t-interval over splits, how many splits its own bootstrap check passed (the asset check
  ``learned_router_beats_random_router``), the share of the gap from the best single model to
  the oracle it closes at that model's cost, and AIQ as RouterBench's code computes it;
* on MMLU: APGR, CPT(50%), CPT(80%) (RouteLLM) and off-policy evaluation errors.

Results go to ``benchmarks/.scratch/routing_benchmark_quality.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
from scipy import stats

from sage_pipeline.routing_benchmark import (
    metrics as bm,
    routers as br,
    run as brun,
    synthetic as bs,
)
from sage_pipeline.routing_benchmark.importer import ImportConfig, import_benchmark

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / ".scratch" / "routing_benchmark_quality.json"
LEARNED = brun.LEARNED
BASELINES = ("zero_router", "random", "cost_only", "bayes", "oracle")


def _ms(xs: list[float], digits: int = 4) -> str:
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    if not xs:
        return "—"
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f}"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}"


def t_interval(xs: list[float]) -> tuple[float, float, float]:
    """(mean, low, high): the 95% t-interval of the mean over splits."""
    x = np.asarray(xs, dtype=np.float64)
    m = float(x.mean())
    if len(x) < 2:
        return m, float("nan"), float("nan")
    half = float(stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)))
    return m, m - half, m + half


def load_table(name: str, folder: Path) -> tuple[tuple, np.ndarray | None]:
    if name == "mmlu":
        return import_benchmark(ImportConfig(), log=lambda s: None), None
    k, quality, *sharp = name.removeprefix("syn").split("-")
    regime = {"sharpness": 40.0, "hidden_noise": 0.02} if sharp == ["sharp"] else {}
    path, p = bs.write_synthetic(folder, bs.SyntheticConfig(n_models=int(k), quality=quality, **regime))
    return import_benchmark(ImportConfig(path=path, price_table=None), log=lambda s: None), p


def one_run(table, p, seed: int, feat: str) -> dict:
    tab, _ = table
    t0 = time.perf_counter()
    res, _ = brun.run_benchmark(brun.BenchmarkConfig(seed=seed, featurizer=feat), log=lambda s: None, table=table)
    secs = time.perf_counter() - t0
    aiq, gap, code = dict(res.aiq), {n: res.gap_closed(n) for n in res.curves}, dict(res.aiq_code)
    margin = {n: aiq[n] - aiq["random"] for n in aiq}
    if p is not None:  # the Bayes router on the same test prompts
        te = np.flatnonzero(brun.split_test(tab, 0.25, seed))
        P, Q, C = p[te], tab.quality[te], tab.cost[te]
        bayes = bm.sweep("bayes", lambda w: bm.decide(P, C, w), br.cost_weights(P, C, 81), Q, C)
        aiq["bayes"] = bayes.aiq(*res.c_range)
        margin["bayes"] = aiq["bayes"] - aiq["random"]
        o = res.curves["oracle"]
        best = max(res.models, key=lambda m: res.curves[m].quality[0])
        gap["bayes"] = bm.gap_closed(bayes.cost, bayes.quality, float(res.curves[best].cost[0]),
                                     float(res.curves[best].quality[0]), o.cost, o.quality)
    return {"seed": seed, "featurizer": feat, "seconds": secs, "aiq": aiq, "margin_vs_random": margin,
            "gap_closed": gap, "aiq_routerbench_code": code, "best_learned": res.best_learned,
            "beats_random_router": res.beats_random_router, "aiq_ci": res.aiq_ci,
            "margin_ci": res.margin_vs_random_ci,
            "check_passed": {n: bool(n in res.aiq_ci and res.aiq_ci[n][0] > res.aiq["random"]
                                     and res.margin_vs_random_ci[n][0] > 0) for n in LEARNED},
            "aiq_eval_mean": {n: res.aiq_eval_mean(n) for n in res.curves},
            "routellm": {n: {"apgr": m.apgr, "cpt50": m.cpt50, "cpt80": m.cpt80} for n, m in res.routellm.items()},
            "ope": res.ope_rows, "n_test": res.n_test, "timings": res.timings}


def summarise(name: str, runs: list[dict], featurizers: list[str]) -> list[dict]:
    rows = []
    print(f"\n### {name}\n")
    print("| features | router | AIQ | AIQ - random, 95% interval over splits | own check passed | "
          "gap closed at best model's cost | AIQ (RouterBench code) | AIQ mean over eval_name | APGR | CPT(50%) | "
          "CPT(80%) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for feat in featurizers:
        rs = [r for r in runs if r["featurizer"] == feat]
        for n in (*BASELINES, *LEARNED):
            if n not in rs[0]["aiq"]:
                continue
            a = [r["aiq"][n] for r in rs]
            m, lo, hi = t_interval([r["margin_vs_random"][n] for r in rs])
            gap = [r["gap_closed"].get(n) for r in rs]
            code = [r["aiq_routerbench_code"].get(n) for r in rs]
            ev = [r["aiq_eval_mean"].get(n) for r in rs]
            rl = [r["routellm"].get(n) for r in rs]
            passed = sum(r["check_passed"].get(n, False) for r in rs) if n in LEARNED else None
            row = {"table": name, "featurizer": feat, "router": n, "aiq": a, "margin_mean": m, "margin_low": lo,
                   "margin_high": hi, "check_passed": passed, "gap_closed": gap, "aiq_code": code, "aiq_eval_mean": ev,
                   "apgr": [x["apgr"] for x in rl if x], "cpt50": [x["cpt50"] for x in rl if x],
                   "cpt80": [x["cpt80"] for x in rl if x]}
            rows.append(row)
            margin = "" if n == "random" else f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]"
            print(f"| {feat} | {n} | {_ms(a)} | {margin} | "
                  f"{'' if passed is None else f'{passed}/{len(rs)}'} | {_ms(gap, 2)} | {_ms(code)} | {_ms(ev)} | "
                  f"{_ms(row['apgr'], 3)} | {_ms(row['cpt50'], 3)} | {_ms(row['cpt80'], 3)} |")
        learned = [r for r in rows if r["featurizer"] == feat and r["router"] in LEARNED]
        best = max(learned, key=lambda r: statistics.mean(r["aiq"]))
        print(f"\nbest learned ({feat}, by mean AIQ over splits): {best['router']}, margin over random "
              f"{best['margin_mean']:+.4f} [{best['margin_low']:+.4f}, {best['margin_high']:+.4f}] -> interval "
              f"{'excludes' if best['margin_low'] > 0 else 'does NOT exclude'} 0; gap closed "
              f"{statistics.mean(best['gap_closed']):.2f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--tables", nargs="+", default=["mmlu", "syn8-binary", "syn11-binary", "syn11-graded",
                                                     "syn8-binary-sharp", "syn11-binary-sharp"])
    ap.add_argument("--featurizers", nargs="+", default=["tfidf_svd"])
    args = ap.parse_args()
    load_before = os.getloadavg()
    all_rows, all_runs, ope = [], {}, defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.tables:
            table, p = load_table(name, Path(tmp))
            tab, rep = table
            print(f"{name}: {len(tab):,} prompts x {len(tab.models)} models; {rep.excluded} excluded, "
                  f"{rep.n_dropped} dropped, index columns dropped: {len(rep.dropped_index_columns)}", flush=True)
            runs = []
            for feat in args.featurizers:
                for seed in args.seeds:
                    r = one_run(table, p, seed, feat)
                    runs.append(r)
                    print(f"  {feat:9s} seed {seed}: {r['seconds']:5.1f}s  " + "  ".join(
                        f"{n} {r['aiq'][n]:.4f}" for n in ("random", "regression", "predictive", "knn", "bc", "cql",
                                                           "bayes", "oracle") if n in r["aiq"]), flush=True)
            all_runs[name] = runs
            if name == "mmlu":
                for r in runs:
                    if r["featurizer"] == args.featurizers[0]:
                        for row in r["ope"]:
                            if row["estimate"] is not None:
                                ope[(row["behaviour"], row["propensities"], row["estimator"])].append(row)
    load_after = os.getloadavg()
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} CPUs; "
          f"Python {platform.python_version()}; seeds {args.seeds}")
    for name, runs in all_runs.items():
        all_rows += summarise(name, runs, args.featurizers)
    if ope:
        print("\nOPE on the MMLU test prompts (every learned router at the OPE cost weight):\n")
        print("| behaviour | propensities | estimator | mean abs error | 95% interval coverage | n |")
        print("|---|---|---|---:|---:|---:|")
    ope_summary = []
    for (beh, prop, est), rows in sorted(ope.items()):
        err = statistics.mean(abs(x["error"]) for x in rows)
        cov = statistics.mean(bool(x["covered"]) for x in rows)
        ope_summary.append({"behaviour": beh, "propensities": prop, "estimator": est, "mae": err, "coverage": cov,
                            "n": len(rows)})
        print(f"| {beh} | {prop} | {est} | {err:.4f} | {cov:.0%} | {len(rows)} |")
    secs = [r["seconds"] for runs in all_runs.values() for r in runs]
    print(f"\nmedian seconds per run: {statistics.median(secs):.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"seeds": args.seeds, "tables": args.tables, "featurizers": args.featurizers,
                                   "load_before": load_before, "load_after": load_after, "summary": all_rows,
                                   "ope": ope_summary,
                                   "runs": {k: [{x: v for x, v in r.items() if x != "ope"} for r in runs]
                                            for k, runs in all_runs.items()}}, indent=2, default=float))


if __name__ == "__main__":
    main()
