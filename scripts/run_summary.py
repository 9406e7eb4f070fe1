"""What `make run` produced, at a glance, read back from the Dagster instance (DAGSTER_HOME):
each asset's latest materialization, the sandbox the simulator really used, the promotion
gate's decision and the sleep cycle's nights, and last the deployment bundle (sage_bundle: its
folder, its kind and the command that deploys it), when the instance has one, with the model world's
exact value of deploying it beside SAGE as shipped (:func:`bundle_value_lines`). Exits 1 when an
asset of the graph was never materialized. Called at the end of scripts/materialize_all.sh.
"""

from __future__ import annotations

import sys

import dagster as dg

from sage_pipeline.definitions import defs
from sage_pipeline.sage import week as W
from sage_pipeline.sage_world.sage_week import SHIPPED, bundle_key

# group -> its job: the groups make run leaves out (scripts/materialize_all.sh)
ON_DEMAND = {"closed_loop": "simulated_month", "sage_in_the_loop": "sage_in_the_loop", "routing_demo": "routing_demo"}


def bundle_value_lines(bundle: dict, manifest: dict) -> list[str]:
    """The world's exact value of deploying the bundle beside SAGE as shipped, from the SAGE week's manifest
    (``truth.week``: every coder x router bundle valued by the model world on the week's runs, under task_v1).

    The bundle is looked up by what it carries: its coder (``coder``: the pinned model, else SAGE's table and its
    bandit, "shipped") and its router (``kind`` 'yaml': SAGE's YAML; 'exploring' around SAGE's YAML at the week's
    exploration rate: the exploring checkpoint the week valued). SAGE as shipped is the coder "shipped" with the
    YAML router. A bundle the week did not value (a promoted router checkpoint, another rate) is said so, with no
    number. It is the model world's truth (its calibrated rates on the week's tasks), not a measurement of a
    user's SAGE."""
    truth = manifest.get("truth") or {}
    values = truth.get("week") or {}
    coder = str(bundle.get("coder") or "")
    coder_key = SHIPPED if "(SAGE's bandit)" in coder else coder
    kind, expl = bundle.get("kind"), bundle.get("exploration") or {}
    router = None
    if kind == "yaml":
        router = "yaml"
    elif (kind == "exploring" and str(expl.get("target", "")).startswith("yaml:")
          and expl.get("rate_requested") == truth.get("exploration_rate")):
        router = "explore"
    shipped = values.get(bundle_key(SHIPPED, "yaml"))
    mine = values.get(bundle_key(coder_key, router)) if router else None
    if shipped is None or mine is None:
        what = f"coder {coder or '?'}, router {kind or '?'}"
        return [f"its value in the model world: not in the SAGE week's truth ({what}: the week valued SAGE's YAML "
                "and the exploring checkpoint around it, for the coder as shipped and pinned to each model)"]
    n, obj = truth.get("runs_valued"), truth.get("objective", "task_v1")
    gain = mine["objective"] - shipped["objective"]
    carries = (f"coder {coder_key if coder_key != SHIPPED else 'as shipped'}, router "
               + ("SAGE's YAML" if router == "yaml" else f"exploring around SAGE's YAML at {expl['rate_requested']:g}"))
    return [f"its value in the model world ({carries}; {obj}, exact, on the SAGE week's {n} runs): "
            f"{mine['objective']:.4f} "
            f"(verified {mine['p_verified']:.3f}, {mine['gpu_seconds']:.2f} GPU-s a task) vs SAGE as shipped "
            f"{shipped['objective']:.4f} (its table and UCB bandit, its YAML router; +/- {shipped['objective_se']:.4f} "
            f"over the bandit's drawn paths): {gain:+.4f}",
            "  (the model world's truth, from its calibrated rates; not a measurement of your SAGE)"]


def _meta(instance: dg.DagsterInstance, key: dg.AssetKey) -> tuple[dg.EventLogRecord | None, dict]:
    recs = instance.fetch_materializations(key, limit=1).records
    if not recs:
        return None, {}
    mat = recs[0].asset_materialization
    return recs[0], {k: v.value for k, v in mat.metadata.items()} if mat else {}


def main() -> int:
    instance = dg.DagsterInstance.get()
    graph = defs.resolve_asset_graph()
    # the simulated month (group closed_loop) is run on demand, not by make run
    on_demand = sorted((k for k in graph.get_all_asset_keys() if graph.get(k).group_name in ON_DEMAND),
                       key=lambda k: k.to_user_string())
    keys = sorted((k for k in graph.get_all_asset_keys() if graph.get(k).group_name not in ON_DEMAND),
                  key=lambda k: k.to_user_string())
    missing = []
    print("\n== summary (from the instance at $DAGSTER_HOME)")
    for key in keys:
        rec, _ = _meta(instance, key)
        if rec is None:
            missing.append(key.to_user_string())
    _, sim = _meta(instance, dg.AssetKey("sim_tasks"))
    _, roll = _meta(instance, dg.AssetKey("sandbox_rollouts"))
    if sim or roll:
        backend = roll.get("sandbox", {}).get("backend") if isinstance(roll.get("sandbox"), dict) else None
        isolated = roll.get("sandbox_isolated", sim.get("sandbox_isolated"))
        print(f"sandbox: {backend or sim.get('sandbox_backend')} (sandbox_isolated: {str(isolated).lower()})")
        if isolated is not True:
            print("WARNING: the simulator ran in unisolated local processes, not the Docker sandbox: "
                  "run sim/setup_docker.sh (as root it installs and starts Docker) and make run again",
                  file=sys.stderr)
    _, ev = _meta(instance, dg.AssetKey("offline_eval"))
    if ev:
        print(f"offline_eval: {ev.get('promotion')}")
        print(f"offline_eval, SAGE's router space: {ev.get('promotion_sage')}")
    _, pp = _meta(instance, dg.AssetKey("promoted_policy"))
    if pp:
        print(f"promoted_policy: multi_model {pp.get('multi_model')}; sage_binary {pp.get('sage_binary')}")
    _, ck = _meta(instance, dg.AssetKey("sage_router_checkpoint"))
    if ck:
        print(f"sage_router_checkpoint: {ck.get('path') if ck.get('written') else 'not written'} "
              f"(from {ck.get('source')}; for the table {(ck.get('sage_table') or {}).get('path')}; deploy it "
              "with `python -m sage_pipeline.sage.explore deploy <its folder>`, which prints SAGE's exports)")
    for key in keys:
        if key.path[0] == "sleep_cycle":
            rec, night = _meta(instance, key)
            if night:
                part = rec.asset_materialization.partition if rec and rec.asset_materialization else None
                print(f"{key.to_user_string()}: night {part}, {night.get('status')}: {night.get('reason')}")
    print(f"assets materialized: {len(keys) - len(missing)} of {len(keys)}")
    for k in on_demand:
        job = ON_DEMAND[graph.get(k).group_name]
        print(f"not part of make run: {k.to_user_string()} (dagster job execute -m sage_pipeline.definitions -j {job})")
    # last: what a SAGE user deploys (absent from an instance that never materialized sage_bundle)
    _, bundle = _meta(instance, dg.AssetKey("sage_bundle"))
    if bundle:
        print(f"sage_bundle: {bundle.get('bundle_path')} (kind: {bundle.get('kind')}, id: {bundle.get('bundle_id')})")
        print(f"deploy it with: {bundle.get('deploy_command')}")
        try:
            for line in bundle_value_lines(bundle, W.load_manifest()):
                print(line)
        except W.WeekError as exc:
            print(f"its value in the model world: unknown ({exc})")
    if missing:
        print(f"never materialized: {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
