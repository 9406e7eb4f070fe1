"""The deployment bundle SAGE runs unchanged: its models.yaml (the coder's model learned from SAGE's
own logs), the router checkpoint, the decision ledger and the randomised arms, and how to deploy them as
one (``sage_pipeline.sage.bundle``); the asset's work is ``sage_pipeline.rl.sage_bundle.run_sage_bundle``."""

# No `from __future__ import annotations`: Dagster reads the real annotations.
import os
import shlex

import dagster as dg
from pydantic import Field

from sage_pipeline import markdown
from sage_pipeline.defs.policy_assets import sage_router_checkpoint
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.routing_assets import GROUP, ObjectiveSection
from sage_pipeline.defs.sections import to_core
from sage_pipeline.rl import coder_lever, sage_bundle as sb
from sage_pipeline.sage import bundle as bd, explore as sage_explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sleep.sage_night import SKILLS_ROOT_DIR, live_skills


class CoderLeverSection(dg.Config, coder_lever.CoderLeverConfig):
    """``sage_pipeline.rl.coder_lever.CoderLeverConfig``: when the logs pin the coder's model."""


class SageBundleConfig(dg.Config):
    """sage_bundle's run config."""

    sage_models_yaml: str | None = Field(
        None, description="the models.yaml the target SAGE runs (default: SAGE_MODELS_YAML, else the sage resource's "
                          "routing table); the bundle is refused when it is not the table the logs were written with")
    objective: ObjectiveSection = Field(default_factory=ObjectiveSection,
                                        description="the per-task objective the bundle is chosen under (task_v1)")
    coder: CoderLeverSection = Field(default_factory=CoderLeverSection,
                                     description="the coder lever's learner: when SAGE's logs pin the coder's model")
    exploration_rate: float | None = Field(None, ge=0.0, le=sage_explore.MAX_RATE,
                                           description="with no checkpoint from sage_router_checkpoint: the exploring "
                                                       "checkpoint's rate around SAGE's YAML (unset: "
                                                       "sage_explore.ExploreConfig's; 0: no checkpoint, SAGE's YAML)")


@dg.asset(group_name=GROUP, deps=[sage_router_checkpoint], kinds={"python", "yaml"},
          description="Every lever SAGE runs unchanged, as one deployment bundle (checkpoints/bundle): a models.yaml "
                      "for SAGE_MODELS_YAML (the coder pinned to the model SAGE's own logs show best under the task_v1 "
                      "objective, when they separate it), the router checkpoint (the promoted one, else the exploring "
                      "one around SAGE's YAML), the decision ledger (decisions/ledger.json) and the arms the levers' "
                      "nights randomise (decisions/assignment_plan.json), bound to the table the logs were written "
                      "with. Deploy it with `python -m sage_pipeline.sage.bundle deploy`: one switch, refused for a "
                      "SAGE running another table; with arms, SAGE is started through <deploy root>/sage-run.")
def sage_bundle(context: dg.AssetExecutionContext, config: SageBundleConfig,
                sage: SageResource) -> dg.MaterializeResult:
    objective = to_core(config.objective, TaskObjective)
    target = config.sage_models_yaml or os.environ.get("SAGE_MODELS_YAML") or str(sage.table_path())
    explore = (sage_explore.ExploreConfig() if config.exploration_rate is None
               else sage_explore.ExploreConfig(rate=config.exploration_rate))
    skills = live_skills(sage.path(*SKILLS_ROOT_DIR))  # the sleep cycle's SAGE skills root, when it exists
    try:
        run = sb.run_sage_bundle(sage.root(), sage.table, target, objective=objective, explore=explore,
                                 coder=to_core(config.coder, coder_lever.CoderLeverConfig), skills=skills,
                                 progress=context.log.info)
    except sb.SageBundleError as exc:
        raise dg.Failure(f"sage_bundle: {exc}") from exc
    b = run.bundle
    return dg.MaterializeResult(metadata={
        "bundle_path": dg.MetadataValue.path(str(b.folder)), "bundle_id": b.id, "kind": run.kind,
        "coder": run.coder, "coder_pinned_now": run.coder_pinned_now, "why": run.why,
        "objective": objective.describe(),
        "coder_models": dg.MetadataValue.md(markdown.table(run.coder_models) if run.coder_models
                                            else "no coder decisions logged"),
        "exploration": dg.MetadataValue.json(run.exploration or {}),
        "learned_for": dg.MetadataValue.json({k: b.manifest["learned_for"][k] for k in ("path", "routing_sha256")}),
        "deploy_command": run.deploy_command,
        "sage_env": dg.MetadataValue.md("```bash\n" + "\n".join(f"export {k}={shlex.quote(v)}"
                                                              for k, v in b.env().items()) + "\n```"),
        "decisions": (dg.MetadataValue.path(str(b.folder / bd.LEDGER_FILE)) if b.part("decisions") is not None
                      else "no ledger yet"),
        "arms": dg.MetadataValue.md(markdown.table(run.arms) if b.arms else "no arms: nothing randomised"),
        "plan": b.plan().id if b.arms else "",
    })


bundle_defs = dg.Definitions(assets=[sage_bundle])
