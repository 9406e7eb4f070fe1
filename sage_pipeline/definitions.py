"""The Definitions every entry point loads: ``dagster dev`` (workspace.yaml),
``dagster asset materialize -m sage_pipeline`` and ``dagster definitions validate``.

Each chain's module under ``defs/`` builds its own ``dg.Definitions`` fragment (assets,
checks, jobs, schedules); this file merges them and adds what is shared: the ``sage``
resource and the ``sage_main`` job.
"""

from __future__ import annotations

import dagster as dg

from sage_pipeline.defs import online_ab, policy_assets, routing_assets, routing_checks, sim_assets
from sage_pipeline.defs.benchmark_assets import routing_benchmark_defs
from sage_pipeline.defs.policy_iteration import policy_iteration_defs
from sage_pipeline.defs.resources import SageResource, SandboxResource
from sage_pipeline.defs.sim_policy_assets import sim_policy_defs
from sage_pipeline.defs.sleep_assets import sleep_defs

ROUTING_ASSETS = [routing_assets.synthetic_sessions, routing_assets.trajectories,
                  routing_assets.routing_dataset, routing_assets.reward_report,
                  policy_assets.bc_policy, policy_assets.cql_policy, policy_assets.offline_eval,
                  policy_assets.sage_router_checkpoint]

offline_routing_job = dg.define_asset_job(
    "offline_routing", selection=dg.AssetSelection.groups(routing_assets.GROUP),
    description="The offline routing chain: logs -> trajectories -> routing_dataset -> reward_report "
                "-> bc_policy, cql_policy -> offline_eval (with the promotion gate) -> sage_router_checkpoint "
                "-> online_ab (the served policy against the table, online in the simulator).")

offline_routing_defs = dg.Definitions(
    assets=ROUTING_ASSETS,
    asset_checks=[routing_checks.routing_dataset_contract, routing_checks.routing_dataset_volume],
    jobs=[offline_routing_job],
)

sage_main_job = dg.define_asset_job(
    "sage_main", selection=dg.AssetSelection.all() - dg.AssetSelection.groups("sleep_cycle", "closed_loop")
    - dg.AssetSelection.assets("sandbox_rollouts", "ppo_policy"),
    description="Every unpartitioned asset upstream of the partitioned ones: the offline routing chain, the "
                "routing-benchmark import and sim_tasks (not the simulated month, group closed_loop: its own job "
                "simulated_month). A job cannot mix partitions definitions: "
                "sandbox_rollouts (shards), ppo_policy and the sleep cycle (nights) follow in "
                "scripts/materialize_all.sh, which is what the README's `make run` calls.")

# The promoted policy against the table, online in the simulator (in the offline_routing group and job)
online_ab_defs = dg.Definitions(assets=[online_ab.online_ab], asset_checks=online_ab.ONLINE_AB_CHECKS)

# One fragment per chain; add a chain's fragment here and nowhere else.
FRAGMENTS: list[dg.Definitions] = [
    sleep_defs,
    offline_routing_defs,
    online_ab_defs,
    sim_assets.simulator_rollout_defs,
    sim_policy_defs,
    routing_benchmark_defs,
    policy_iteration_defs,
]

defs = dg.Definitions.merge(
    *FRAGMENTS,
    dg.Definitions(jobs=[sage_main_job], resources={"sage": SageResource(), "sandbox": SandboxResource()}),
)
