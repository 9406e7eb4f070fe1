"""The deployment bundle SAGE runs unchanged: its models.yaml (the coder's model learned from SAGE's
own logs), the router checkpoint, the decision ledger and the randomised arms, and how to deploy them as
one (``sage_pipeline.sage.bundle``)."""

# No `from __future__ import annotations`: Dagster reads the real annotations.
import os
import shlex
import tempfile
from pathlib import Path

import dagster as dg
import pandas as pd
import pyarrow.parquet as pq
from pydantic import Field

from sage_pipeline import markdown
from sage_pipeline.decisions import assign
from sage_pipeline.decisions.ledger import LEDGER_NAME
from sage_pipeline.defs.policy_assets import sage_router_checkpoint
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.routing_assets import GROUP, ObjectiveSection
from sage_pipeline.defs.sections import to_core
from sage_pipeline.rl import coder_lever
from sage_pipeline.routing import routing_dataset as rd, task_outcomes as to
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage import bundle as bd, checkpoint as sage_router, explore as sage_explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import pin
from sage_pipeline.sleep.sage_night import SKILLS_ROOT_DIR, live_skills

BUNDLE_DIR = ("checkpoints", "bundle")
DECISIONS_DIR = "decisions"  # <data>/decisions/: the ledger and the arms file the levers' nights write


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


def _coder_decision(sage: SageResource, objective: TaskObjective, config: coder_lever.CoderLeverConfig,
                    current: str | None) -> coder_lever.CoderLeverDecision | None:
    ds_path, out_path = sage.path("routing", rd.PARQUET_NAME), sage.path("routing", to.TASK_OUTCOMES_NAME)
    if not ds_path.is_file() or not out_path.is_file():
        return None
    cols = [c for c in ("role", "model", "session_id", "task_id", "episode_id", "step", "source_line")
            if c in pq.read_schema(ds_path).names]
    tasks, unjoined = coder_lever.coder_tasks(rd.read_routing_dataset(ds_path, cols), pd.read_parquet(out_path))
    decision = coder_lever.decide(tasks, objective, config, current)
    decision.unjoined = unjoined
    return decision


def _decisions(sage: SageResource) -> tuple[Path | None, dict | None]:
    """The ledger (``<data>/decisions/ledger.json``) and the arms (``<data>/decisions/assignment_plan.json``,
    ``assign.load_arms``: every part inside the data root), each None when its file does not exist."""
    ledger = sage.path(DECISIONS_DIR, LEDGER_NAME)
    arms_file = sage.path(DECISIONS_DIR, assign.ARMS_FILE)
    try:
        arms = assign.load_arms(arms_file, sage.root()) if os.path.lexists(arms_file) else None
    except assign.AssignError as exc:
        raise dg.Failure(f"sage_bundle: {exc}") from exc
    return (ledger if os.path.lexists(ledger) else None), arms


def _arms_table(b: bd.Bundle) -> list[dict]:
    return [{"lever": lever, "arm": a["name"], "candidate": a["candidate"] or "incumbent",
             "probability": a["threshold"] / assign.SCALE, "threshold (of 2**32)": a["threshold"],
             "part": a["path"] or "the bundle's own"} for lever, arms in b.arms.items() for a in arms]


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
    learned_for = sage.table
    target = config.sage_models_yaml or os.environ.get("SAGE_MODELS_YAML") or str(sage.table_path())
    try:
        sage_router.check_table(learned_for, target)
    except ValueError as exc:
        raise dg.Failure(f"sage_bundle: {exc}") from exc
    coder = learned_for.routes.get("coder")
    current = coder.primary if coder is not None and coder.primary == coder.fallback else None
    decision = _coder_decision(sage, objective, to_core(config.coder, coder_lever.CoderLeverConfig), current)
    table = pin(learned_for, "coder", decision.model) if decision is not None and decision.promote else learned_for
    explore = (sage_explore.ExploreConfig() if config.exploration_rate is None
               else sage_explore.ExploreConfig(rate=config.exploration_rate))
    why = (decision.reason if decision is not None else "no routing dataset with task outcomes yet: the coder "
           "keeps its table")
    # a scratch folder named as the artifacts layer names its temporaries (.<name>.tmp-<8>): removed on exit
    with tempfile.TemporaryDirectory(prefix=".sage_bundle.tmp-", dir=sage.root()) as tmp:
        ck, kind = sage.path("checkpoints", "sage"), "yaml"
        if (ck / sage_router.JOBLIB_NAME).is_file():
            kind = sage_router.read_manifest(ck).get("kind", sage_router.KIND_DETERMINISTIC)
        elif explore.rate > 0:  # the exploring checkpoint lives in the bundle only (one artifact: the bundle)
            served = sage_explore.build_exploring(learned_for, ActionSpace.build(learned_for).binary(), explore)
            ck = Path(tmp) / "exploring"
            sage_router.write_sage_checkpoint(ck, served, {"source": f"SAGE's YAML ({learned_for.source})"})
            kind = sage_router.KIND_EXPLORING
        else:
            ck = None
        exploration = sage_router.read_manifest(ck).get("exploration") if ck is not None else None
        why += f"; router: {kind} checkpoint" if ck is not None else "; router: SAGE's YAML (no checkpoint)"
        skills = live_skills(sage.path(*SKILLS_ROOT_DIR))  # the sleep cycle's SAGE skills root, when it exists
        why += f"; skills: live version {skills.name} of {skills.parent.parent}" if skills else "; skills: SAGE's own"
        ledger, arms = _decisions(sage)
        why += f"; arms of {', '.join(arms)} randomised" if arms else ""
        try:
            b = bd.build(sage.path(*BUNDLE_DIR), table, learned_for, objective=objective, checkpoint=ck,
                         exploration=exploration, skills=skills, why=why, ledger=ledger, arms=arms)
        except bd.BundleError as exc:
            raise dg.Failure(f"sage_bundle: {exc}") from exc
    context.log.info(f"bundle {b.id[:12]} at {b.folder}: {why}")
    start = ("`<deploy root>/sage-run \"<prompt>\"` instead of `sage run \"<prompt>\"` (each run's arms drawn and "
             "recorded in <deploy root>/assignments.jsonl)" if b.arms else "`. <deploy root>/sage.env`")
    deploy = (f"python -m sage_pipeline.sage.bundle deploy {shlex.quote(str(b.folder))} <deploy root> --sage-python "
              f"<SAGE's python> (then start SAGE with {start})")
    per_model = [] if decision is None else [
        {"coder model": m, **{k: v for k, v in e.items() if k != "ci"}, "interval": e["ci"]}
        for m, e in decision.per_model.items()]
    return dg.MaterializeResult(metadata={
        "bundle_path": dg.MetadataValue.path(str(b.folder)), "bundle_id": b.id, "kind": kind,
        "coder": table.routes["coder"].primary if table.routes["coder"].primary == table.routes["coder"].fallback
        else f"{table.routes['coder'].primary} / {table.routes['coder'].fallback} (SAGE's bandit)",
        "coder_pinned_now": bool(decision is not None and decision.promote),
        "why": why, "objective": objective.describe(),
        "coder_models": dg.MetadataValue.md(markdown.table(per_model) if per_model else "no coder decisions logged"),
        "exploration": dg.MetadataValue.json(exploration or {}),
        "learned_for": dg.MetadataValue.json({k: b.manifest["learned_for"][k] for k in ("path", "routing_sha256")}),
        "deploy_command": deploy,
        "sage_env": dg.MetadataValue.md("```bash\n" + "\n".join(f"export {k}={shlex.quote(v)}"
                                                              for k, v in b.env().items()) + "\n```"),
        "decisions": (dg.MetadataValue.path(str(b.folder / bd.LEDGER_FILE)) if b.part("decisions") is not None
                      else "no ledger yet"),
        "arms": dg.MetadataValue.md(markdown.table(_arms_table(b)) if b.arms else "no arms: nothing randomised"),
        "plan": b.plan().id if b.arms else "",
    })


bundle_defs = dg.Definitions(assets=[sage_bundle])
