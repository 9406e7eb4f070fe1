"""The recommended router (issue 36) against the simple routers, over split seeds, side by side; and the random
router as rounds 1-3 reported it (the hull of one draw's points) against its exact expectation (issue 43).

Run from the repository root::

    .venv/bin/python benchmarks/routing_recommended.py [--seeds 0 1 ... 9] [--tables mmlu syn11-binary syn11-hidden]
        [--features words words+chars words+chars+surface] [--random-tables slice syn8-binary ...]

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

**The random router, old vs new** (issue 43), on the same test prompts of every split: the figure rounds 1-3
reported (:func:`round3_random_curve`, the code as it was: one random draw per point, its hull), the figure
reported now (its exact expectation, the zero router's hull), the mean of ``random.draws`` draws each scored
on its own path (± its standard error) and of their hulls; pooled and on RouterBench's per-eval headline
(random rebuilt on each eval's own hull, as both rounds do). On the ``--tables`` the old bias is also set
against the recommended router's margin over random, and the per-eval intervals (bootstrap within each eval)
are summarised: the headline's intervals and in how many evals the recommended router's paired interval over
the zero router / the lookup includes 0. ``--random-tables`` measure the random router alone (no routers are
trained: fast): ``slice`` is the test suite's MMLU fixture, ``synK-binary|graded|hidden[-sharp]`` the
synthetic tables in RouterBench's layout (``-sharp``: sharpness 40, 0.02 unobserved complexity).
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

import numpy as np
from routing_benchmark_quality import t_interval  # benchmarks/ is the script's folder: first on sys.path

from sage_pipeline.routing_benchmark import (
    metrics as bm,
    prompt_features as bfeat,
    routers as br,
    run as brun,
    synthetic as bs,
)
from sage_pipeline.routing_benchmark.importer import ImportConfig, import_benchmark

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / ".scratch" / "routing_recommended.json"
BASES = ("zero_router", "random", br.LOOKUP)
HEADS = ("recommended", "zero_router", "random", br.LOOKUP, "regression", br.META, "oracle")
FEATURES = {"words": {}, "words+chars": {"char_ngram_max": 5},
            "words+chars+surface": {"char_ngram_max": 5, "add_surface": True}}


SLICE = ROOT / "sage_pipeline_tests" / "routing_benchmark" / "fixtures" / "routellm_mmlu_slice"


def load_table(name: str, folder: Path):
    if name == "mmlu":
        return import_benchmark(ImportConfig(), log=lambda s: None)
    if name == "slice":
        return import_benchmark(ImportConfig(path=SLICE), log=lambda s: None)
    k, kind, *sharp = name.removeprefix("syn").split("-")  # synK-binary, synK-graded, synK-hidden, ...-sharp
    regime = ({"hidden_noise": 1.0} if kind == "hidden" else {}) | (
        {"sharpness": 40.0, "hidden_noise": 0.02} if sharp == ["sharp"] else {})
    quality = "binary" if kind == "hidden" else kind
    path, _ = bs.write_synthetic(folder, bs.SyntheticConfig(n_models=int(k), quality=quality, **regime))
    return import_benchmark(ImportConfig(path=path, price_table=None), log=lambda s: None)


def round3_random_curve(quality, cost, seed: int = 0, points: int = 21) -> bm.Curve:
    """``routers.random_router_curve`` as rounds 1-3 ran it (before issue 43), kept here only to measure it:
    each prompt to a random model, mixing consecutive vertices of the zero router's hull, one draw per point;
    AIQ then took the hull of those noisy points."""
    c_mean, q_mean = cost.mean(axis=0), quality.mean(axis=0)
    hc, _ = bm.ndch(c_mean, q_mean)
    verts = [int(np.flatnonzero(c_mean == c)[np.argmax(q_mean[c_mean == c])]) for c in hc]
    rng = np.random.default_rng(seed)
    n = len(quality)
    t = np.linspace(0.0, 1.0, points)
    pos = t * (len(verts) - 1)
    choices = []
    for p in pos:
        j = min(int(np.floor(p)), len(verts) - 2) if len(verts) > 1 else 0
        frac = p - j
        a, b = verts[j], verts[min(j + 1, len(verts) - 1)]
        choices.append(np.where(rng.random(n) < frac, b, a))
    return bm.sweep("random", lambda w: choices[round(w)], np.arange(points, dtype=np.float64), quality, cost)


def random_old_new(table, seed: int, cfg: brun.BenchmarkConfig) -> dict:
    """The random router on one split's test prompts: as rounds 1-3 reported it and as it is reported now."""
    tab = table[0]
    te = tab.take(np.flatnonzero(brun.split_test(tab, cfg.test_fraction, seed)))
    Q, C = te.quality, te.cost
    lo, hi = bm.cost_range(C.mean(axis=0))
    zero = br.zero_router_curve(Q, C)
    new = br.random_router_curve(Q, C, cfg.random)
    summary = brun.random_summary(Q, C, cfg.model_copy(update={"seed": seed}), new.aiq(lo, hi))
    old_eval = bm.aiq_by_group({"zero_router": zero}, Q, C, te.eval_name, oracle=None,
                               recompute={"random": lambda q, c: round3_random_curve(q, c, seed=seed)})
    new_eval = bm.aiq_by_group({"zero_router": zero}, Q, C, te.eval_name, oracle=None,
                               recompute={"random": lambda q, c: br.random_router_curve(q, c, cfg.random)})
    mean = lambda d, n: float(np.mean([v[n] for v in d.values()])) if d else None  # noqa: E731
    return {"seed": seed, "zero": zero.aiq(lo, hi), "old": round3_random_curve(Q, C, seed=seed).aiq(lo, hi),
            "new": summary["aiq"], "draws_mean": summary["draws_mean"], "draws_se": summary["draws_se"],
            "hull_mean": summary["hull_of_one_draw_mean"], "eval_zero": mean(new_eval, "zero_router"),
            "eval_old": mean(old_eval, "random"), "eval_new": mean(new_eval, "random"), "n_evals": len(new_eval)}


def summarise_random(name: str, rows: list[dict], runs: list[dict] | None = None) -> dict:
    """Old vs new random AIQ over splits; with the full runs, the old bias against the recommended router's margin."""
    n = len(rows)
    col = lambda k: [r[k] for r in rows]  # noqa: E731
    diff = [r["old"] - r["new"] for r in rows]
    m, lo, hi = t_interval(diff)
    em, elo, ehi = t_interval([r["eval_old"] - r["eval_new"] for r in rows])
    z_err = max(abs(r["new"] - r["zero"]) for r in rows)
    z_draws = [(r["draws_mean"] - r["new"]) / r["draws_se"] for r in rows]
    out = {"table": name, "splits": n, "zero": statistics.mean(col("zero")), "old": statistics.mean(col("old")),
           "new": statistics.mean(col("new")), "old_minus_new": [m, lo, hi], "max_abs_new_minus_zero": z_err,
           "draws_mean_minus_new_in_se": [min(z_draws), max(z_draws)],
           "hull_mean_minus_new": statistics.mean(r["hull_mean"] - r["new"] for r in rows),
           "old_above_zero_splits": sum(r["old"] > r["zero"] for r in rows), "eval_old_minus_new": [em, elo, ehi],
           "eval_old": statistics.mean(col("eval_old")), "eval_new": statistics.mean(col("eval_new")),
           "n_evals": rows[0]["n_evals"]}
    line = (f"| {name} | {n} | {out['zero']:.4f} | {out['old']:.4f} | {out['new']:.4f} | {m:+.4f} [{lo:+.4f}, "
            f"{hi:+.4f}] | {out['old_above_zero_splits']}/{n} | {z_err:.1e} | {min(z_draws):+.1f} .. "
            f"{max(z_draws):+.1f} | {out['hull_mean_minus_new']:+.4f} | {rows[0]['n_evals']} | "
            f"{out['eval_old']:.4f} / {out['eval_new']:.4f} | {em:+.4f} [{elo:+.4f}, {ehi:+.4f}] |")
    if runs:
        shares = [(r["old"] - r["new"]) / (x["aiq"]["recommended"] - r["new"]) for r, x in zip(rows, runs)
                  if x["aiq"]["recommended"] != r["new"]]
        out["old_bias_share_of_recommended_margin"] = statistics.mean(shares) if shares else None
        line += f" {statistics.mean(shares):.1%} |" if shares else " — |"
    else:
        line += " — |"
    print(line)
    return out


RANDOM_HEADER = ("| table | splits | zero router | random, old (hull of one draw) | random, new (exact) | old - new "
                 "[95% t over splits] | old above zero | max abs(new - zero) | draws' mean - new (in SE) | "
                 "hull of one draw, mean over draws - new | evals | per-eval headline, old / new | per-eval old - new "
                 "[95% t] | old bias / recommended's margin over random |\n"
                 "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def one_run(table, seed: int, features: str = "words") -> dict:
    t0 = time.perf_counter()
    cfg = brun.BenchmarkConfig(seed=seed, tfidf_svd=bfeat.TfidfSvdConfig(**FEATURES[features]))
    res, _ = brun.run_benchmark(cfg, log=lambda s: None, table=table)
    iv = res.eval_intervals
    widths = [hi - lo for e in iv.aiq.values() for n, (lo, hi) in e.items() if n == "recommended"] if iv else []
    return {"seed": seed, "features": features, "seconds": time.perf_counter() - t0, "recommended": res.recommended,
            "verdict_vs_random": res.verdict_vs_random,
            "eval_intervals": {"mean_ci": iv.mean, "mean_margins": iv.mean_margins,
                               "not_separated": {b: len(iv.not_separated(b)) for b in BASES},
                               "n_evals": len(iv.margins), "median_width_recommended": float(np.median(widths))}
            if iv else None,
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
    ivs = [r["eval_intervals"] for r in runs if r["eval_intervals"]]
    if ivs:
        print(f"\nper-eval intervals ({ivs[0]['n_evals']} evals; bootstrap within each eval; mean over splits of each "
              "bound): headline " + ", ".join(
                  f"{h} [{statistics.mean(iv['mean_ci'][h][0] for iv in ivs):.4f}, "
                  f"{statistics.mean(iv['mean_ci'][h][1] for iv in ivs):.4f}]" for h in brun.EVAL_HEADS
                  if all(h in iv["mean_ci"] for iv in ivs))
              + "; recommended's headline margin over " + ", ".join(
                  f"{b} [{statistics.mean(iv['mean_margins'][b][0] for iv in ivs):+.4f}, "
                  f"{statistics.mean(iv['mean_margins'][b][1] for iv in ivs):+.4f}]" for b in BASES)
              + "; evals whose paired interval includes 0 (mean over splits): " + ", ".join(
                  f"vs {b} {statistics.mean(iv['not_separated'][b] for iv in ivs):.1f}" for b in BASES)
              + f"; median width of the recommended router's per-eval interval "
                f"{statistics.mean(iv['median_width_recommended'] for iv in ivs):.4f}")
        out["eval_intervals"] = ivs
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(range(10)))
    ap.add_argument("--tables", nargs="*", default=["mmlu", "syn11-binary", "syn11-hidden"])
    ap.add_argument("--features", nargs="+", default=["words"], choices=list(FEATURES))
    ap.add_argument("--random-tables", nargs="*", default=["slice", "syn8-binary", "syn8-graded", "syn11-graded",
                                                            "syn8-binary-sharp", "syn11-binary-sharp"])
    args = ap.parse_args()
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {}
    randoms: dict[str, list[dict]] = {}
    base = brun.BenchmarkConfig()
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.random_tables:
            table = load_table(name, Path(tmp))
            randoms[name] = [random_old_new(table, seed, base) for seed in args.seeds]
            print(f"{name} (random router only): old {statistics.mean(r['old'] for r in randoms[name]):.4f}, new "
                  f"{statistics.mean(r['new'] for r in randoms[name]):.4f}", flush=True)
        for name in args.tables:
            table = load_table(name, Path(tmp))
            print(f"{name}: {len(table[0]):,} prompts x {len(table[0].models)} models", flush=True)
            randoms[name] = [random_old_new(table, seed, base) for seed in args.seeds]
            runs[name] = []
            for feat, seed in [(f, s) for f in args.features for s in args.seeds]:
                r = one_run(table, seed, feat)
                runs[name].append(r)
                print(f"  {feat} seed {seed}: {r['seconds']:5.1f}s recommended {r['recommended']}: AIQ "
                      f"{r['aiq']['recommended']:.4f} (zero {r['aiq']['zero_router']:.4f}, random "
                      f"{r['aiq']['random']:.4f}, lookup {r['aiq'][br.LOOKUP]:.4f})", flush=True)
    load_after = os.getloadavg()
    secs = [r["seconds"] for rs in runs.values() for r in rs]
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f}; seeds {args.seeds}"
          + (f"; median {statistics.median(secs):.1f} s per run" if secs else ""))
    summary = [summarise(name, [r for r in rs if r["features"] == args.features[0]]) for name, rs in runs.items()]
    print("\n### The random router: as rounds 1-3 reported it (old) and now (its exact expectation)\n")
    print(RANDOM_HEADER)
    random_summary = [summarise_random(name, rows, [r for r in runs[name] if r["features"] == args.features[0]]
                                       if name in runs else None) for name, rows in randoms.items()]
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
                                   "summary": summary, "random_router": random_summary, "random_runs": randoms,
                                   "runs": runs}, indent=2, default=float))


if __name__ == "__main__":
    main()
