"""Routing benchmark quality on RouteLLM's MMLU table: do the learned routers beat the zero router?

Run from the repository root::

    .venv/bin/python benchmarks/routing_benchmark_quality.py [--seeds 0 1 2] [--featurizers tfidf_svd length]

For each split seed (a different 75/25 train/test split of the prompts) and featurizer, runs
``sage_pipeline.routing.benchmark_run.run_benchmark`` on the packaged table (contaminated prompts
excluded, duplicates dropped) with the asset's defaults, side by side with the baselines it
computes on the same held-out prompts: every single model, the zero router, random, the
oracle and ``cost_only`` (each model's mean quality with the predicted price: what routing by
price alone earns). Prints, over seeds:

* AIQ (RouterBench) of every router and its margin over the zero router's (mean, min, seeds
  beaten);
* APGR, CPT(50%), CPT(80%) (RouteLLM) next to RouteLLM's published MMLU range;
* off-policy evaluation: per behaviour and estimator, the mean absolute error against the
  exact value and the share of 95% intervals that cover it (over seeds x routers).

Results go to ``benchmarks/.scratch/routing_benchmark_quality.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

from sage_pipeline.routing import benchmark_metrics as bm
from sage_pipeline.routing import benchmark_run as brun
from sage_pipeline.routing.benchmark_import import ImportConfig, import_benchmark

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / ".scratch" / "routing_benchmark_quality.json"


def _ms(xs: list[float], digits: int = 4) -> str:
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    if not xs:
        return "—"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f}" if len(xs) > 1 else f"{xs[0]:.{digits}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--featurizers", nargs="+", default=["tfidf_svd", "length"])
    args = ap.parse_args()
    table = import_benchmark(ImportConfig(), log=lambda s: None)
    print(f"table: {len(table[0]):,} prompts x {len(table[0].models)} models; "
          f"{table[1].excluded} contaminated excluded, {table[1].n_dropped} duplicates dropped", flush=True)
    load_before = os.getloadavg()
    runs = []
    for feat in args.featurizers:
        for seed in args.seeds:
            t0 = time.perf_counter()
            res, _ = brun.run_benchmark(brun.BenchmarkConfig(seed=seed, featurizer=feat), log=lambda s: None,
                                        table=table)
            secs = time.perf_counter() - t0
            runs.append({"featurizer": feat, "seed": seed, "seconds": secs, "aiq": res.aiq,
                         "routellm": {n: {"apgr": m.apgr, "cpt50": m.cpt50, "cpt80": m.cpt80}
                                      for n, m in res.routellm.items()},
                         "ope": res.ope_rows, "n_test": res.n_test, "timings": res.timings})
            print(f"{feat:9s} seed {seed}: {secs:5.1f}s  " + "  ".join(
                f"{n} {res.aiq[n]:.4f}" for n in ("zero_router", "cost_only", "regression", "bc", "cql", "oracle")),
                flush=True)
    load_after = os.getloadavg()

    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f}; {os.cpu_count()} CPUs; "
          f"Python {platform.python_version()}; seeds {args.seeds}\n")
    routers = ("zero_router", "random", "cost_only", "regression", "bc", "cql", "oracle")
    print("| featurizer | router | AIQ | AIQ - zero router | min over seeds | seeds beating zero | APGR | CPT(50%) | CPT(80%) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    summary = []
    for feat in args.featurizers:
        rs = [r for r in runs if r["featurizer"] == feat]
        for n in routers:
            a = [r["aiq"][n] for r in rs]
            d = [r["aiq"][n] - r["aiq"]["zero_router"] for r in rs]
            rl = [r["routellm"].get(n) for r in rs]
            row = {"featurizer": feat, "router": n, "aiq": a, "margin": d,
                   "apgr": [m["apgr"] for m in rl if m], "cpt50": [m["cpt50"] for m in rl if m],
                   "cpt80": [m["cpt80"] for m in rl if m]}
            summary.append(row)
            beats = sum(x > 0 for x in d)
            print(f"| {feat} | {n} | {_ms(a)} | {_ms(d)} | {min(d):+.4f} | {beats}/{len(d)} | {_ms(row['apgr'], 3)} "
                  f"| {_ms(row['cpt50'], 3)} | {_ms(row['cpt80'], 3)} |")
    pub = bm.ROUTELLM_MMLU_PUBLISHED
    print(f"\nRouteLLM published MMLU ({pub['source']}): random APGR 0.50 / CPT(50%) 50% / CPT(80%) 80%; "
          "best with MMLU labels APGR ~0.60, CPT(50%) ~35%, CPT(80%) ~70%")

    print("\nOPE on the test prompts (tfidf_svd runs; every router at the OPE cost weight):\n")
    print("| behaviour | propensities | estimator | mean abs error | 95% interval coverage | n |")
    print("|---|---|---|---:|---:|---:|")
    ope = defaultdict(list)
    for r in runs:
        if r["featurizer"] != args.featurizers[0]:
            continue
        for row in r["ope"]:
            if row["estimate"] is not None:
                ope[(row["behaviour"], row["propensities"], row["estimator"])].append(row)
    ope_summary = []
    for (beh, prop, est), rows in sorted(ope.items()):
        err = statistics.mean(abs(x["error"]) for x in rows)
        cov = statistics.mean(bool(x["covered"]) for x in rows)
        ope_summary.append({"behaviour": beh, "propensities": prop, "estimator": est, "mae": err, "coverage": cov,
                            "n": len(rows)})
        print(f"| {beh} | {prop} | {est} | {err:.4f} | {cov:.0%} | {len(rows)} |")
    print(f"\nmedian seconds per run: {statistics.median(r['seconds'] for r in runs):.1f}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"seeds": args.seeds, "featurizers": args.featurizers, "load_before": load_before,
                                   "load_after": load_after, "summary": summary, "ope": ope_summary,
                                   "runs": [{k: v for k, v in r.items() if k != "ope"} for r in runs]}, indent=2,
                                  default=float))


if __name__ == "__main__":
    main()
