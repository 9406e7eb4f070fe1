"""The Definitions every entry point loads: ``dagster dev`` (workspace.yaml),
``dagster asset materialize -m sage_pipeline.definitions`` and ``dagster definitions validate``.

Each chain's module under ``defs/`` builds its own ``dg.Definitions`` fragment (assets,
checks, jobs, schedules); this file merges them and adds what is shared: the ``sage``
resource and the ``sage_main`` job.
"""

from __future__ import annotations

import dagster as dg

# The chains' fragments through their modules, never as names here: `dagster ... -m
# sage_pipeline.definitions` needs `defs` to be the only Definitions object at module scope.
from sage_pipeline.defs import (
    benchmark_assets,
    bundle_assets,
    decision_assets,
    online_ab,
    policy_assets,
    policy_iteration,
    routing_assets,
    routing_checks,
    run_reaper,
    sage_loop_assets,
    sim_assets,
    sim_policy_assets,
    sleep_assets,
)
from sage_pipeline.defs.resources import SageResource, SandboxResource

ROUTING_ASSETS = [routing_assets.sage_week, routing_assets.synthetic_sessions, routing_assets.trajectories,
                  routing_assets.routing_dataset, routing_assets.reward_report,
                  policy_assets.bc_policy, policy_assets.cql_policy, policy_assets.offline_eval,
                  policy_assets.promoted_policy, policy_assets.sage_router_checkpoint]

offline_routing_job = dg.define_asset_job(
    "offline_routing", selection=dg.AssetSelection.groups(routing_assets.GROUP),
    description="The offline routing chain: SAGE's journals (sage_week: the shipped SAGE week, and a live SAGE "
                "day with SAGE_PYTHON) -> trajectories -> routing_dataset -> reward_report "
                "-> bc_policy, cql_policy -> offline_eval (with the promotion gate) -> promoted_policy -> "
                "sage_router_checkpoint -> sage_bundle (the deployment bundle) "
                "-> online_ab (the served policy against the table, online in the simulator).")

routing_demo_job = dg.define_asset_job(
    "routing_demo", selection=dg.AssetSelection.groups(routing_assets.DEMO_GROUP),
    description="A demo, not in make run: the routing simulator's synthetic journals (synthetic_sessions), in SAGE's "
                "event vocabulary but not the shape `sage run` writes, with the simulator's exact policy values. "
                "Materialize it into an artifact root of its own (SAGE_DATA_DIR): trajectories reads every folder "
                "under sessions/.")

sage_main_job = dg.define_asset_job(
    "sage_main", selection=dg.AssetSelection.all() - dg.AssetSelection.groups("sleep_cycle", "closed_loop",
                                                                        sage_loop_assets.GROUP, decision_assets.GROUP,
                                                                        routing_assets.DEMO_GROUP)
    - dg.AssetSelection.assets("sandbox_rollouts", "ppo_policy"),
    description="Every unpartitioned asset upstream of the partitioned ones: the offline routing chain, the "
                "routing-benchmark import and sim_tasks (not the simulated month, group closed_loop: its own job "
                "simulated_month; not SAGE in the loop, group sage_in_the_loop: its own job; not the routing "
                "simulator's demo journals, group routing_demo: its own job; not the decision "
                "ledger, group decisions: it reads what the nights wrote, last). "
                "A job cannot mix partitions definitions: "
                "sandbox_rollouts (shards), ppo_policy and the sleep cycle (nights) follow in "
                "scripts/materialize_all.sh, which is what the README's `make run` calls.")


def _forkserver(config: dict) -> dict:
    return {"start_method": {"forkserver": {"preload_modules": [__name__]}}, **config}


# Dagster's multiprocess executor (each step in its own process), its processes forked from a
# server that imported this module once: a step starts in ~0.8 s instead of the
# ~5 s a fresh interpreter takes to import dagster, torch, pandas and the chains (make run has 25
# steps: README, "make run"). Jobs that name their own executor (the Celery job of
# docs/scaling.md) keep it.
# Each run first marks the instance's dead runs (kill -9) failed and frees their pool slots
# (defs/run_reaper.py), so a killed CLI run never leaves the next run blocked on its pool.
executor = run_reaper.reaping(dg.multiprocess_executor.configured(
    _forkserver, name="multiprocess_forkserver",
    config_schema={"max_concurrent": dg.Field(int, is_required=False,
                                              description="steps at once (default: the machine's CPU count)")}))

# Everything but the executor: one fragment per chain (add a chain's fragment here and nowhere
# else) and what they share. A deployment module (e.g. defs/celery_definitions.py) merges these
# with its own executor: the project's `defs` already carries one, and Definitions.merge refuses two.
FRAGMENTS: list[dg.Definitions] = [
    sleep_assets.sleep_defs,  # the nights on SAGE's own skills root (group sleep_cycle: nightly_sleep)
    dg.Definitions(  # the offline routing chain
        assets=ROUTING_ASSETS,
        asset_checks=[routing_checks.routing_dataset_contract, routing_checks.routing_dataset_volume],
        jobs=[offline_routing_job, routing_demo_job],
    ),
    # the promoted policy against the table, online in the simulator (in the offline_routing group and job)
    dg.Definitions(assets=[online_ab.online_ab], asset_checks=online_ab.ONLINE_AB_CHECKS),
    bundle_assets.bundle_defs,  # every lever SAGE runs unchanged, as one deployment (offline_routing group)
    sim_assets.simulator_rollout_defs,
    sim_policy_assets.sim_policy_defs,
    benchmark_assets.routing_benchmark_defs,
    policy_iteration.policy_iteration_defs,
    sage_loop_assets.sage_loop_defs,
    decision_assets.decision_defs,  # the decision ledger of every lever (group decisions)
    dg.Definitions(jobs=[sage_main_job], resources={"sage": SageResource(), "sandbox": SandboxResource()}),
]

defs = dg.Definitions.merge(*FRAGMENTS, dg.Definitions(executor=executor))
