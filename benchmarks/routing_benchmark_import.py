"""Routing-benchmark import at RouterBench scale: a 400k-row table imported in under a minute?

Run from the repository root::

    .venv/bin/python benchmarks/routing_benchmark_import.py [--rows 400000] [--models 11] [--repeats 3]

The table is generated from the packaged RouteLLM MMLU outcomes in RouterBench's wide layout
(``sample_id``, ``prompt``, ``eval_name``, a quality column per model, ``<model>|total_cost``,
``<model>|model_response``, ``oracle_model_to_route_to``): the 13,932 MMLU prompts repeated
with a variant suffix up to ``--rows`` prompts, ``--models`` models whose correctness mixes
the two real models' outcomes (model j answers like GPT-4 with probability j / (models - 1),
else like Mixtral, 5% flipped), costs from per-token prices and a random response length.
0.1% of the rows are made bad (a non-numeric quality, a negative cost, a repeated
``sample_id``) so that the validation's drop path runs too. The same table is written as CSV and
as Parquet, and in the long layout (one row per prompt and model) as Parquet with
``--rows`` rows in all; files are cached under ``benchmarks/.scratch/routing_benchmark/``.

Contenders, each timed in a fresh subprocess (peak RSS is its own), interleaved and repeated:

* ``pyarrow_read`` (baseline): ``pyarrow.csv.read_csv`` / ``pyarrow.parquet.read_table`` of
  the file and nothing else: the floor for any importer.
* ``pandas_read`` (baseline): ``pandas.read_csv`` / ``read_parquet``: what a notebook does.
* ``import_benchmark``: ``sage_pipeline.routing_benchmark.importer.import_benchmark``: read,
  layout detection, validation of every quality and cost cell, duplicates, the price table
  for missing costs, assembly into the (prompts x models) arrays, and the report.

Results go to ``benchmarks/.scratch/routing_benchmark_import.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "benchmarks" / ".scratch" / "routing_benchmark"
RESULTS = ROOT / "benchmarks" / ".scratch" / "routing_benchmark_import.json"
CONTENDERS = ("pyarrow_read", "pandas_read", "import_benchmark")
GOAL_S = 60.0


def generate(rows: int, n_models: int, seed: int = 0) -> dict[str, Path]:
    """Write (or reuse) the wide CSV, wide Parquet and long Parquet tables."""
    import numpy as np
    import pandas as pd
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from sage_pipeline.routing_benchmark.importer import ImportConfig, import_benchmark

    SCRATCH.mkdir(parents=True, exist_ok=True)
    stem = f"routerbench_{rows}x{n_models}_s{seed}"
    paths = {"wide_csv": SCRATCH / f"{stem}.csv", "wide_parquet": SCRATCH / f"{stem}.parquet",
             "long_parquet": SCRATCH / f"{stem}_long.parquet"}
    if all(p.is_file() for p in paths.values()):
        return paths
    t0 = time.perf_counter()
    mmlu, _ = import_benchmark(ImportConfig(), log=lambda s: None)
    rng = np.random.default_rng(seed)
    base = np.arange(rows) % len(mmlu)
    variant = np.arange(rows) // len(mmlu)
    prompt = np.array([p if v == 0 else f"{p}\n(variant {v})" for p, v in zip(mmlu.prompt[base], variant)],
                      dtype=object)
    df = {"sample_id": [f"{e}.{i}" for e, i in zip(mmlu.eval_name[base], range(rows))], "prompt": prompt,
          "eval_name": mmlu.eval_name[base]}
    weak, strong = mmlu.quality[base, 0], mmlu.quality[base, 1]
    tokens = np.ceil(np.array([len(p) for p in prompt]) / 4.0)
    names = [f"model-{j:02d}" for j in range(n_models)]
    quality = np.empty((rows, n_models))
    for j, m in enumerate(names):
        p_strong = j / max(n_models - 1, 1)
        q = np.where(rng.random(rows) < p_strong, strong, weak)
        q = np.where(rng.random(rows) < 0.05, 1.0 - q, q)
        price_in, price_out = 0.1 * 1.6 ** j, 0.3 * 1.6 ** j  # USD per 1M tokens
        out_tokens = rng.integers(1, 40, rows)
        df[m] = q
        df[f"{m}|model_response"] = np.array(["A", "B", "C", "D"], dtype=object)[rng.integers(0, 4, rows)]
        df[f"{m}|total_cost"] = (tokens * price_in + out_tokens * price_out) / 1e6
        quality[:, j] = q
    df["oracle_model_to_route_to"] = np.array(names, dtype=object)[quality.argmax(axis=1)]
    frame = pd.DataFrame(df)
    bad = rng.choice(rows, size=max(3, rows // 1000), replace=False)
    third = len(bad) // 3
    frame[names[1]] = frame[names[1]].astype(object)
    frame.loc[bad[:third], names[1]] = "n/a?"
    frame.loc[bad[third:2 * third], f"{names[2]}|total_cost"] = -1.0
    frame.loc[bad[2 * third:], "sample_id"] = frame["sample_id"].iloc[0]
    frame[names[1]] = frame[names[1]].astype(str)
    table = pa.Table.from_pandas(frame, preserve_index=False)
    pacsv.write_csv(table, paths["wide_csv"])
    pq.write_table(table, paths["wide_parquet"])
    per = max(rows // n_models, 1)
    long = pd.DataFrame({"prompt_id": np.repeat(frame["sample_id"].to_numpy()[:per], n_models),
                         "model": np.tile(names, per),
                         "quality": quality[:per].ravel(),
                         "cost": np.column_stack([df[f"{m}|total_cost"][:per] for m in names]).ravel(),
                         "prompt": np.repeat(prompt[:per], n_models)})
    pq.write_table(pa.Table.from_pandas(long, preserve_index=False), paths["long_parquet"])
    print(f"generated {rows:,}-row tables in {time.perf_counter() - t0:.1f}s: "
          + ", ".join(f"{k} {p.stat().st_size / 1e6:.0f} MB" for k, p in paths.items()), flush=True)
    return paths


def _rss_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def child(name: str, path: Path) -> dict:
    import pandas as pd
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from sage_pipeline.routing_benchmark.importer import ImportConfig, import_benchmark

    t0 = time.perf_counter()  # after the imports: every contender is timed on its work alone
    parquet = path.suffix == ".parquet"
    if name == "pyarrow_read":
        t = pq.read_table(path) if parquet else pacsv.read_csv(
            path, parse_options=pacsv.ParseOptions(newlines_in_values=True))
        rows, extra = t.num_rows, {}
    elif name == "pandas_read":
        df = pd.read_parquet(path) if parquet else pd.read_csv(path)
        rows, extra = len(df), {}
    else:
        tab, rep = import_benchmark(ImportConfig(path=path, exclude_prompts=None), log=lambda s: None)
        rows, extra = rep.rows_read, {"prompts_kept": len(tab), "models": len(tab.models),
                                      "dropped_rows": dict(rep.dropped_rows)}
    return {"seconds": time.perf_counter() - t0, "rows": rows, "rss_kib": _rss_kib()} | extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--models", type=int, default=11)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", nargs=2, metavar=("CONTENDER", "PATH"), help=argparse.SUPPRESS)
    ap.add_argument("--generate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], Path(args.child[1]))))
        return
    if args.generate:
        print(json.dumps({k: str(v) for k, v in generate(args.rows, args.models).items()}))
        return
    # generated in a subprocess too: this parent stays small, so a child's ru_maxrss is its own
    gen = subprocess.run([sys.executable, __file__, "--generate", "--rows", str(args.rows), "--models",
                          str(args.models)], check=True, capture_output=True, text=True, cwd=ROOT)
    print(gen.stdout.strip().splitlines()[0] if len(gen.stdout.strip().splitlines()) > 1 else "tables cached")
    paths = {k: Path(v) for k, v in json.loads(gen.stdout.strip().splitlines()[-1]).items()}
    load_before = os.getloadavg()
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.repeats):
        for kind, path in paths.items():
            order = CONTENDERS[r % 3:] + CONTENDERS[:r % 3]
            for name in order:
                out = subprocess.run([sys.executable, __file__, "--child", name, str(path)], check=True,
                                     capture_output=True, text=True, cwd=ROOT)
                res = json.loads(out.stdout.strip().splitlines()[-1])
                runs.setdefault((kind, name), []).append(res)
                print(f"repeat {r + 1} {kind:13s} {name:17s} {res['seconds']:7.2f}s "
                      f"{res['rss_kib'] / 1024:7.0f} MiB", flush=True)
    load_after = os.getloadavg()
    print(f"\nload average before {load_before[0]:.2f}, after {load_after[0]:.2f}; "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}\n")
    print("| table | contender | rows | best s | median s | rows/s (median) | peak RSS MiB "
          "| vs pyarrow_read (median) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    summary = []
    for kind in paths:
        base = statistics.median(x["seconds"] for x in runs[(kind, "pyarrow_read")])
        for name in CONTENDERS:
            xs = runs[(kind, name)]
            secs = [x["seconds"] for x in xs]
            med = statistics.median(secs)
            row = {"table": kind, "contender": name, "rows": xs[0]["rows"], "best_s": min(secs), "median_s": med,
                   "rows_per_s": xs[0]["rows"] / med, "peak_rss_mib": max(x["rss_kib"] for x in xs) / 1024,
                   "vs_pyarrow_read": med / base}
            summary.append(row | {k: v for k, v in xs[0].items() if k in ("prompts_kept", "dropped_rows", "models")})
            print(f"| {kind} | {name} | {row['rows']:,} | {row['best_s']:.2f} | {med:.2f} | {row['rows_per_s']:,.0f} "
                  f"| {row['peak_rss_mib']:.0f} | {row['vs_pyarrow_read']:.2f}x |")
    worst = max(r["median_s"] for r in summary if r["contender"] == "import_benchmark")
    print(f"\nslowest import_benchmark median: {worst:.1f}s (goal: under {GOAL_S:.0f}s) -> "
          + ("met" if worst < GOAL_S else "NOT met"))
    for r in summary:
        if r["contender"] == "import_benchmark":
            print(f"  {r['table']}: {r['prompts_kept']:,} prompts x {r['models']} models kept; "
                  f"dropped {r['dropped_rows']}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": args.rows, "models": args.models, "repeats": args.repeats,
                                   "load_before": load_before, "load_after": load_after, "cpus": os.cpu_count(),
                                   "python": platform.python_version(), "summary": summary,
                                   "runs": {f"{k}/{n}": v for (k, n), v in runs.items()}}, indent=2))


if __name__ == "__main__":
    main()
