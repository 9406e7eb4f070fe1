"""The recommended router (issue 36) against the simple routers, over split seeds, side by side.

Run from the repository root::

    .venv/bin/python benchmarks/routing_recommended.py [--seeds 0 1 ... 9] [--tables mmlu syn11-binary syn11-hidden]
        [--features words words+chars words+chars+surface]

For each table and split seed, ``routing_benchmark.run.run_benchmark`` with the asset's defaults: the
recommended router is chosen on a validation part of the train split (never the test prompts) and then
scored on the held-out test prompts beside the zero router's hull, the random router and the per-eval_name
lookup (the router that reads nothing but which data set a prompt comes from). Printed per table:

* what was recommended, in how many splits;
* the recommended router's test AIQ and its paired margin over each simple router: the mean over splits with
  the 95% t-interval over splits, and in how many splits the run's own paired bootstrap interval (over the
  test prompts) lay above 0 / below 0;
* RouterBench's headline (the mean of the per-eval_name AIQ, each eval on its own hull) beside the pooled AIQ.

Tables: ``mmlu``, RouteLLM's MMLU as packaged (57 subjects: eval_name is the file's subject; 2 models);
``syn11-binary``, the synthetic 11-model table (SAGE's 8 roles as evals; the text shows most of each
prompt's complexity); ``syn11-hidden``, the same with the complexity hidden from the text (std 1.0 of
unobserved complexity), so within an eval the text tells little and eval_name is most of what there is to
know, the regime the held-out published tables were in. Results: ``benchmarks/.scratch/routing_recommended.json``.

``--features`` runs each table and seed once per prompt-feature variant of ``tfidf_svd`` (``words``: the
default word TF-IDF + SVD + log length; ``+chars``: a character 2..5-gram TF-IDF block beside the words';
``+surface``: the length featurizer's surface features) and prints each variant's paired AIQ difference
from the first, for the regression router (prompt features only) and for the recommended router.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

from routing_benchmark_quality import t_interval  # benchmarks/ is the script's folder: first on sys.path

from sage_pipeline.routing_benchmark import prompt_features as bfeat, routers as br, run as brun, synthetic as bs
from sage_pipeline.routing_benchmark.importer import ImportConfig, import_benchmark

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / ".scratch" / "routing_recommended.json"
BASES = ("zero_router", "random", br.LOOKUP)
HEADS = ("recommended", "zero_router", "random", br.LOOKUP, "regression", br.META, "oracle")
FEATURES = {"words": {}, "words+chars": {"char_ngram_max": 5},
            "words+chars+surface": {"char_ngram_max": 5, "add_surface": True}}


def load_table(name: str, folder: Path):
    if name == "mmlu":
        return import_benchmark(ImportConfig(), log=lambda s: None)
    k, kind = name.removeprefix("syn").split("-")  # synK-binary, synK-graded, synK-hidden (binary)
    regime = {"hidden_noise": 1.0} if kind == "hidden" else {}
    quality = "binary" if kind == "hidden" else kind
    path, _ = bs.write_synthetic(folder, bs.SyntheticConfig(n_models=int(k), quality=quality, **regime))
    return import_benchmark(ImportConfig(path=path, price_table=None), log=lambda s: None)


def one_run(table, seed: int, features: str = "words") -> dict:
    t0 = time.perf_counter()
    cfg = brun.BenchmarkConfig(seed=seed, tfidf_svd=bfeat.TfidfSvdConfig(**FEATURES[features]))
    res, _ = brun.run_benchmark(cfg, log=lambda s: None, table=table)
    return {"seed": seed, "features": features, "seconds": time.perf_counter() - t0, "recommended": res.recommended,
            "fallback": res.selection.fallback, "aiq": {n: res.aiq.get(n) for n in HEADS},
            "eval_mean": {n: res.aiq_eval_mean(n) for n in HEADS}, "n_evals": len(res.aiq_by_eval),
            "margin": {b: res.aiq["recommended"] - res.aiq[b] for b in BASES if b in res.aiq},
            "margin_ci": {b: list(v) for b, v in res.recommended_margins.items()},
            "eval_margin": {b: (res.aiq_eval_mean("recommended") or 0) - (res.aiq_eval_mean(b) or 0) for b in BASES},
            "validation_aiq": res.selection.validation_aiq}


def summarise(name: str, runs: list[dict]) -> dict:
    n = len(runs)
    print(f"\n### {name} ({n} splits)\n")
    print("recommended: " + ", ".join(f"{k} x{v}" for k, v in Counter(r["recommended"] for r in runs).most_common()))
    print("\n| vs | pooled AIQ margin, mean [95% t over splits] | own bootstrap interval > 0 | < 0 | "
          "per-eval mean margin [95% t] |")
    print("|---|---:|---:|---:|---:|")
    out = {"table": name, "splits": n, "recommended": Counter(r["recommended"] for r in runs)}
    for b in BASES:
        m, lo, hi = t_interval([r["margin"][b] for r in runs])
        above = sum(r["margin_ci"][b][0] > 0 for r in runs)
        below = sum(r["margin_ci"][b][1] < 0 for r in runs)
        em, elo, ehi = t_interval([r["eval_margin"][b] for r in runs])
        print(f"| {b} | {m:+.4f} [{lo:+.4f}, {hi:+.4f}] | {above}/{n} | {below}/{n} | {em:+.4f} [{elo:+.4f}, "
              f"{ehi:+.4f}] |")
        out[b] = {"margin": [m, lo, hi], "own_ci_above_0": above, "own_ci_below_0": below,
                  "eval_margin": [em, elo, ehi]}
    print("\n| router | pooled AIQ (mean ± sd) | per-eval mean AIQ (RouterBench's headline) |")
    print("|---|---:|---:|")
    for h in HEADS:
        a = [r["aiq"][h] for r in runs if r["aiq"][h] is not None]
        e = [r["eval_mean"][h] for r in runs if r["eval_mean"][h] is not None]
        if a:
            print(f"| {h} | {statistics.mean(a):.4f} ± {statistics.stdev(a) if len(a) > 1 else 0:.4f} | "
                  + (f"{statistics.mean(e):.4f}" if e else "—") + " |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--tables", nargs="+", default=["mmlu", "syn11-binary", "syn11-hidden"])
    ap.add_argument("--features", nargs="+", default=["words"], choices=list(FEATURES))
    args = ap.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.tables:
            table = load_table(name, Path(tmp))
            print(f"{name}: {len(table[0]):,} prompts x {len(table[0].models)} models", flush=True)
            runs[name] = []
            for feat, seed in [(f, s) for f in args.features for s in args.seeds]:
                r = one_run(table, seed, feat)
                runs[name].append(r)
                print(f"  {feat} seed {seed}: {r['seconds']:5.1f}s recommended {r['recommended']}: AIQ "
                      f"{r['aiq']['recommended']:.4f} (zero {r['aiq']['zero_router']:.4f}, random "
                      f"{r['aiq']['random']:.4f}, lookup {r['aiq'][br.LOOKUP]:.4f})", flush=True)
    load_after = os.getloadavg()
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f}; seeds {args.seeds}; median "
          f"{statistics.median(r['seconds'] for rs in runs.values() for r in rs):.1f} s per run")
    summary = [summarise(name, [r for r in rs if r["features"] == args.features[0]]) for name, rs in runs.items()]
    if len(args.features) > 1:
        print(f"\n### prompt features: paired AIQ difference from {args.features[0]}, mean [95% t over splits]\n")
        print("| table | features | regression | recommended | seconds per run |")
        print("|---|---|---:|---:|---:|")
        for name, rs in runs.items():
            first = {r["seed"]: r for r in rs if r["features"] == args.features[0]}
            for feat in args.features[1:]:
                mine = [r for r in rs if r["features"] == feat]
                cells = []
                for h in ("regression", "recommended"):
                    m, lo, hi = t_interval([r["aiq"][h] - first[r["seed"]]["aiq"][h] for r in mine])
                    cells.append(f"{m:+.4f} [{lo:+.4f}, {hi:+.4f}]")
                print(f"| {name} | {feat} | {cells[0]} | {cells[1]} | "
                      f"{statistics.median(r['seconds'] for r in mine):.1f} |")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"seeds": args.seeds, "load_before": load_before, "load_after": load_after,
                                   "summary": summary, "runs": runs}, indent=2, default=float))


if __name__ == "__main__":
    main()
