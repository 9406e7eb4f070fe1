"""The offline routing chain at growing data sizes: each asset's wall time and peak RSS.

    .venv/bin/python benchmarks/scale.py                        # 20k, 200k and 2M episodes
    .venv/bin/python benchmarks/scale.py --episodes 20000 200000

For each size, a fresh artifact root gets the whole offline chain in lineage order:
synthetic_sessions -> trajectories -> routing_dataset -> its GX checks -> reward_report ->
bc_policy -> cql_policy -> offline_eval -> promoted_policy -> sage_router_checkpoint. Every step is materialized
by Dagster in-process (``execute_in_process``, the asset's own code and metadata) in its OWN
child process, so its peak RSS is that child's ``ru_maxrss`` (read with ``os.wait4``), not
the benchmark's. Prints a table per asset and size, the growth exponent of each asset's time
and memory between consecutive sizes (log-log slope: 1.0 is linear), and CQL's served
regret closure from offline_eval, which must hold as the data grows.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# (label, asset selection, with checks?) in lineage order.
STEPS = [
    ("synthetic_sessions", ["synthetic_sessions"], False),
    ("trajectories", ["trajectories"], True),
    ("routing_dataset", ["routing_dataset"], False),
    ("routing_dataset checks", ["routing_dataset"], "only"),
    ("reward_report", ["reward_report"], False),
    ("bc_policy", ["bc_policy"], False),
    ("cql_policy", ["cql_policy"], False),
    ("offline_eval", ["offline_eval"], True),
    ("promoted_policy", ["promoted_policy"], False),
    ("sage_router_checkpoint", ["sage_router_checkpoint"], False),
]


def _child(root: str, label: str, episodes: int, out: str, extra: str = "{}") -> None:
    """Materialize one step of the chain in this process and write its metadata to ``out``."""
    import dagster as dg

    from sage_pipeline.defs import policy_assets as pa, routing_assets as ra, routing_checks as rc
    from sage_pipeline.defs.resources import SageResource

    keys, checks = next((k, c) for lab, k, c in STEPS if lab == label)
    sel = dg.AssetSelection.assets(*keys)
    sel = sel.without_checks() if checks is False else sel
    sel = dg.AssetSelection.checks_for_assets(*keys) if checks == "only" else sel
    assets = [ra.synthetic_sessions, ra.trajectories, ra.routing_dataset, ra.reward_report, pa.bc_policy,
              pa.cql_policy, pa.offline_eval, pa.promoted_policy, pa.sage_router_checkpoint]
    defs = dg.Definitions(assets=assets, asset_checks=[rc.routing_dataset_contract, rc.routing_dataset_volume],
                          resources={"sage": SageResource(data_dir=root)})
    job = dg.define_asset_job("scale_step", selection=sel)
    defs = dg.Definitions.merge(defs, dg.Definitions(jobs=[job]))
    config = {"ops": {"synthetic_sessions": {"config": {"episodes": episodes, "seed": 0}}}}
    config = config if label == "synthetic_sessions" else {}
    config = {"ops": {**config.get("ops", {}), **json.loads(extra)}}  # --cql-seeds: cql_policy's, offline_eval's
    result = defs.get_job_def("scale_step").execute_in_process(
        run_config=config, instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    meta: dict = {}
    for node in keys:
        for m in result.asset_materializations_for_node(node):
            meta.update({k: v.value for k, v in m.metadata.items()
                         if isinstance(v.value, (int, float, str, bool))})
    checks = {e.event_specific_data.check_name: e.event_specific_data.passed for e in result.all_events
              if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    Path(out).write_text(json.dumps({"success": result.success, "checks": checks, "meta": meta},
                                    default=str))


def run_step(root: Path, label: str, episodes: int, ops: dict | None = None) -> dict:
    out = root / f".scale_{label.replace(' ', '_')}.json"
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, __file__, "--child", str(root), label, str(episodes), str(out),
                             json.dumps(ops or {})],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    stderr = proc.stderr.read() if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0 or not out.exists():
        sys.exit(f"scale: {label} at {episodes} episodes failed (exit {proc.returncode}):\n{stderr[-3000:]}")
    res = json.loads(out.read_text())
    # the blocking checks must pass; the volume check is a warning (few rows at small sizes)
    blocking_failed = [c for c, ok in res["checks"].items() if not ok and c != "routing_dataset_volume"]
    if not res["success"] or blocking_failed:
        sys.exit(f"scale: {label} at {episodes} episodes did not succeed:\n{stderr[-3000:]}")
    return {"wall_s": wall, "rss_mb": usage.ru_maxrss / 1024, "meta": res["meta"]}


def served_closures(root: Path) -> dict[str, float]:
    """CQL's regret closure (V - V_static) / (V_oracle - V_static) from offline_eval's report:
    the multi-model policy, and the composite SAGE's router serves in the binary space."""
    report = json.loads((root / "reports" / "offline_eval.json").read_text())
    out = {}
    for space, key in (("multi_model", "cql"), ("sage_binary", "cql_served")):
        v = report.get(space, {}).get("ground_truth", {}).get("episode_value", {})
        if key in v:
            out[f"{space} {key}"] = (v[key] - v["static_table"]) / (v["oracle"] - v["static_table"])
    return out


def slope(x0: float, x1: float, y0: float, y1: float) -> float:
    return math.log(y1 / y0) / math.log(x1 / x0) if min(x0, x1, y0, y1) > 0 and x0 != x1 else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--episodes", type=int, nargs="+", default=[20_000, 200_000, 2_000_000])
    ap.add_argument("--keep", action="store_true", help="keep each size's artifact root")
    ap.add_argument("--cql-seeds", type=int, default=1, help="train and judge CQL with this many seeds per size "
                    "(cql_policy and offline_eval again for seeds 1..N-1 on the same data): closure mean and spread")
    ap.add_argument("--cql-steps", type=int, default=0, help="CQL gradient steps (0: the asset's default)")
    ap.add_argument("--cql-min-passes", type=float, nargs="+", default=None,
                    help="CQL's min_passes (default: the asset's); several values: each seed is trained and judged "
                    "with each, on the same data, side by side (the first value is the chain's own)")
    args = ap.parse_args()
    passes = args.cql_min_passes or [None]
    steps = {"steps": args.cql_steps} if args.cql_steps else {}
    steps |= {"min_passes": passes[0]} if passes[0] is not None else {}
    sizes = sorted(args.episodes)
    results: dict[int, dict[str, dict]] = {}
    closures: dict[int, dict[str, float]] = {}
    seeds: dict[int, list[dict[str, float]]] = {}
    for n in sizes:
        root = Path(tempfile.mkdtemp(prefix=f"sage_scale_{n}_"))
        results[n] = {}
        print(f"== {n:,} episodes (artifact root {root})", flush=True)
        for label, _, _ in STEPS:
            ops = {"cql_policy": {"config": steps}} if label == "cql_policy" and steps else None
            r = results[n][label] = run_step(root, label, n, ops)
            print(f"  {label:24s} {r['wall_s']:8.1f} s  {r['rss_mb']:8.0f} MB", flush=True)
        closures[n] = served_closures(root)
        seeds[n] = [closures[n] | {"min_passes": passes[0], "seed": 0}]
        for seed in range(args.cql_seeds):  # the same data, CQL (and OPE's choices) with another seed / rule
            for p in passes:
                if seed == 0 and p == passes[0]:
                    continue  # the chain's own run
                cfg = {**steps, "seed": seed} | ({"min_passes": p} if p is not None else {})
                r = run_step(root, "cql_policy", n, {"cql_policy": {"config": cfg}})
                run_step(root, "offline_eval", n, {"offline_eval": {"config": {"seed": seed}}})
                seeds[n].append(served_closures(root) | {"min_passes": p, "seed": seed})
                print(f"  CQL seed {seed}, min_passes {p if p is not None else 'default'} "
                      f"({r['meta'].get('steps', '?')} steps, {r['wall_s']:.0f} s): "
                      + ", ".join(f"{k} {v:.3f}" for k, v in seeds[n][-1].items()
                                  if k not in ("min_passes", "seed")), flush=True)
        if not args.keep:
            subprocess.run(["rm", "-rf", str(root)], check=True)
    decisions = {n: results[n]["routing_dataset"]["meta"].get("dagster/row_count") for n in sizes}
    print("\n| asset | " + " | ".join(f"{n:,} ep: s / peak MB" for n in sizes) +
          "".join(f" | slope {a:,}->{b:,} time / RSS" for a, b in zip(sizes, sizes[1:])) + " |")
    print("|---|" + "---|" * (len(sizes) + len(sizes) - 1))
    for label, _, _ in [*STEPS, ("whole chain", None, None)]:
        def get(n: int, key: str, label: str = label) -> float:
            if label == "whole chain":
                vals = [results[n][lab][key] for lab, _, _ in STEPS]
                return sum(vals) if key == "wall_s" else max(vals)
            return results[n][label][key]
        cells = [f"{get(n, 'wall_s'):.1f} / {get(n, 'rss_mb'):.0f}" for n in sizes]
        cells += [f"{slope(a, b, get(a, 'wall_s'), get(b, 'wall_s')):.2f} / "
                  f"{slope(a, b, get(a, 'rss_mb'), get(b, 'rss_mb')):.2f}" for a, b in zip(sizes, sizes[1:])]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("\ndecisions: " + ", ".join(f"{n:,} ep -> {decisions[n]:,}" for n in sizes if decisions[n]))
    for n in sizes:
        print(f"regret closure at {n:,} episodes (ground truth): "
              + ", ".join(f"{k} {v:.3f}" for k, v in closures[n].items())
              + f"; promoted: {results[n]['offline_eval']['meta'].get('promoted')}")
    if args.cql_seeds > 1 or len(passes) > 1:
        print(f"\nCQL over {args.cql_seeds} seed(s) (steps: {args.cql_steps or 'default'}): mean [min, max]")
        for n in sizes:
            for p in passes:
                runs = [c for c in seeds[n] if c["min_passes"] == p]
                keys = [k for k in runs[0] if k not in ("min_passes", "seed")]
                print(f"  {n:,} episodes, min_passes {p if p is not None else 'default'}: " + ", ".join(
                    f"{k} {sum(c[k] for c in runs) / len(runs):.3f} "
                    f"[{min(c[k] for c in runs):.3f}, {max(c[k] for c in runs):.3f}]" for k in keys))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        _child(*sys.argv[2:4], int(sys.argv[4]), *sys.argv[5:7])
    else:
        main()
