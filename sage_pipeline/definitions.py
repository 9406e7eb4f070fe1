"""The Definitions every entry point loads: ``dagster dev`` (workspace.yaml),
``dagster asset materialize -m sage_pipeline`` and ``dagster definitions validate``.

Each chain's module under ``defs/`` builds its own ``dg.Definitions`` fragment (assets,
checks, jobs, schedules); this file merges them and adds what is shared: the ``sage``
resource and the ``sage_main`` job.
"""

from __future__ import annotations

import dagster as dg

from sage_pipeline.defs import policy_assets, routing_assets, routing_checks
from sage_pipeline.defs.resources import SageResource

ROUTING_ASSETS = [routing_assets.synthetic_sessions, routing_assets.trajectories,
                  routing_assets.routing_dataset, routing_assets.reward_report,
                  policy_assets.bc_policy, policy_assets.cql_policy, policy_assets.offline_eval]

offline_routing_job = dg.define_asset_job(
    "offline_routing", selection=dg.AssetSelection.groups(routing_assets.GROUP),
    description="The offline routing chain: logs -> trajectories -> routing_dataset -> reward_report "
                "-> bc_policy, cql_policy -> offline_eval (with the promotion gate).")

offline_routing_defs = dg.Definitions(
    assets=ROUTING_ASSETS,
    asset_checks=[routing_checks.routing_dataset_contract, routing_checks.routing_dataset_volume],
    jobs=[offline_routing_job],
)

sage_main_job = dg.define_asset_job(
    "sage_main", selection=dg.AssetSelection.all(),
    description="Everything, on embedded defaults: what the README's first command runs.")

# One fragment per chain; add a chain's fragment here and nowhere else.
FRAGMENTS: list[dg.Definitions] = [
    offline_routing_defs,
]

defs = dg.Definitions.merge(
    *FRAGMENTS,
    dg.Definitions(jobs=[sage_main_job], resources={"sage": SageResource()}),
)
