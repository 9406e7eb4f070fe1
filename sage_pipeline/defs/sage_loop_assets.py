"""sage_loop (group and job sage_in_the_loop): SAGE's own ``sage run`` against the model world, day after day, with the
offline chain's promotions deployed back to it (core: sage_pipeline.sage_world.loop).

The offline chain each day is the project's own assets (trajectories -> routing_dataset ->
reward_report -> bc_policy, cql_policy -> offline_eval -> promoted_policy ->
sage_router_checkpoint, exploring), run in process on the loop's own artifact root, never on the
instance's ``datasets/``: :func:`offline_chain`."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import os
from pathlib import Path

import dagster as dg
from pydantic import Field

from sage_pipeline import markdown
from sage_pipeline.defs import policy_assets, routing_assets, routing_checks
from sage_pipeline.defs.bundle_assets import CoderLeverSection
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.routing_assets import ObjectiveSection
from sage_pipeline.defs.sections import section, to_core
from sage_pipeline.sage_world import loop as sl
from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, SageNotFound
from sage_pipeline.sage_world.world import WorldConfig

GROUP = "sage_in_the_loop"
CHAIN = [routing_assets.trajectories, routing_assets.routing_dataset, routing_assets.reward_report,
         policy_assets.bc_policy, policy_assets.cql_policy, policy_assets.offline_eval,
         policy_assets.promoted_policy, policy_assets.sage_router_checkpoint]


def offline_chain(data_root: Path, log_dirs: list[Path] | None, exploration_rate: float,
                  table: Path | None = None, ops: dict | None = None) -> dict:
    """The offline chain's assets materialized in process (an ephemeral instance) into ``data_root``
    on SAGE's journals ``log_dirs``, with SAGE's models.yaml ``table``; the exploring checkpoint is
    written around what the gate promoted (around SAGE's YAML while nothing is). ``log_dirs`` None:
    only that checkpoint (day 1). ``ops``: run config per asset, merged over the defaults. Returns
    what each asset's metadata says about the gate and the checkpoint."""
    table = table or Path(os.environ.get("SAGE_ROUTING_TABLE", ""))
    resources = {"sage": SageResource(data_dir=str(data_root), routing_table=str(table))}
    run_ops = {"sage_router_checkpoint": {"config": {"explore": True, "exploration_rate": exploration_rate,
                                                     "sage_models_yaml": str(table)}}}
    keys = ["sage_router_checkpoint"]
    if log_dirs is not None:
        run_ops["trajectories"] = {"config": {"log_dirs": [str(p) for p in log_dirs]}}
        keys = [a.key.path[-1] for a in CHAIN]
    for k, v in (ops or {}).items():
        run_ops.setdefault(k, {"config": {}})["config"].update(v)
    defs = dg.Definitions(assets=CHAIN, asset_checks=[routing_checks.routing_dataset_contract], resources=resources)
    job = defs.resolve_implicit_global_asset_job_def()
    result = job.execute_in_process(run_config={"ops": {k: v for k, v in run_ops.items() if k in keys}},
                                    instance=dg.DagsterInstance.ephemeral(),
                                    asset_selection=[dg.AssetKey(k) for k in keys], raise_on_error=True)
    wanted = {"trajectories": ("lines_read", "accepted_lines", "quarantined_lines", "sage_text_lines", "other_events",
                               "steps_without_model", "files"),
              "routing_dataset": ("dagster/row_count", "rows_per_role", "propensity_source", "decisions_by_source"),
              "offline_eval": ("promoted_sage", "promotion_sage"),
              "sage_router_checkpoint": ("written", "kind", "sha256", "source")}
    out = {}
    for k, fields in wanted.items():
        mats = result.asset_materializations_for_node(k) if k in keys else []
        if mats:
            meta = {m: v.value for m, v in mats[-1].metadata.items()}
            out[k] = {m: meta[m] for m in fields if m in meta}
    return out


def clock_scale(cfg: sl.LoopConfig) -> float:
    """The journal clock the task outcomes divide by: the world's scaled clock (1 when it answers at once,
    where the journal's time is SAGE's own and no model time is shown)."""
    return cfg.world.clock_scale or 1.0


class LoopHarnessSection(dg.Config, HarnessConfig):
    """``sage_pipeline.sage_world.harness.HarnessConfig``: how SAGE is run."""


class WorldSection(dg.Config, WorldConfig):
    """``sage_pipeline.sage_world.world.WorldConfig``: the model world's seed, aliases and scores."""


class SageLoopConfig(dg.Config, sl.LoopConfig):
    """``sage_pipeline.sage_world.loop.LoopConfig`` (days, tasks a day, the task pool, seed, day 1's
    start, the exploration rate; the harness a nested section). SAGE is the one SAGE_PYTHON names."""

    harness: LoopHarnessSection = section(sl.LoopConfig, "harness", LoopHarnessSection)
    world: WorldSection = section(sl.LoopConfig, "world", WorldSection)
    objective: ObjectiveSection = section(sl.LoopConfig, "objective", ObjectiveSection)
    coder: CoderLeverSection = section(sl.LoopConfig, "coder", CoderLeverSection)
    chain_steps: dict = Field(default_factory=dict, description="run config per offline-chain asset, merged "
                              "over its defaults, e.g. {'cql_policy': {'steps': 300}}")


@dg.asset(group_name=GROUP, kinds={"python"},
          description="SAGE's own `sage run` (installed from SAGE_SRC, SAGE_PYTHON) against the model world, "
                      "for `days` days of `tasks_per_day` tasks: day 1 with the exploring checkpoint around SAGE's "
                      "YAML, then each night the offline chain on every journal SAGE wrote so far, its gate, and "
                      "the promoted policy (exploring) deployed back. Per day: runs finished and each failure's "
                      "cause; the deployed policy's true value beside the YAML's and the best SAGE's router can "
                      "express; the gate's decision, its candidates' OPE estimates beside their true values, and "
                      "whether it was right. Written under sage_loop/ (its own artifact root in data/).")
def sage_loop(context: dg.AssetExecutionContext, config: SageLoopConfig,
              sage: SageResource) -> dg.MaterializeResult:
    try:
        install = SageInstall.find()
    except SageNotFound as exc:
        raise dg.Failure(str(exc)) from exc
    root = sage.path("sage_loop", context.run_id)
    cfg = to_core(config, sl.LoopConfig)
    ops = {**config.chain_steps, "routing_dataset": {**config.chain_steps.get("routing_dataset", {}),
                                                     "task_outcomes": {"clock_scale": clock_scale(cfg)}}}
    report = sl.run_loop(install, root, lambda d, dirs, rate: offline_chain(
        d, dirs, rate, install.models_yaml, ops), cfg, progress=context.log.info)
    rows = [sl.day_row(d) for d in report.days]
    goals = report.goals()
    return dg.MaterializeResult(metadata={
        "days": dg.MetadataValue.md(markdown.table(rows)), "goals": dg.MetadataValue.json(goals),
        "finished_share": goals["finished_share"], "wrong_promotions": goals["wrong_promotions"],
        "report": dg.MetadataValue.path(str(root / sl.REPORT_NAME)), "seconds": round(report.seconds, 1)})


sage_loop_job = dg.define_asset_job(
    "sage_in_the_loop", selection=dg.AssetSelection.groups(GROUP),
    description="On demand: SAGE's real `sage run` in the loop against the model world (README, 'Run SAGE "
                "against the model world'). Needs SAGE_PYTHON (scripts/sage_venv.sh).")

sage_loop_defs = dg.Definitions(assets=[sage_loop], jobs=[sage_loop_job])
