"""The ``sage_bundle`` asset's work: every lever SAGE runs unchanged, decided and written as one deployment
bundle (:mod:`sage_pipeline.sage.bundle`).

:func:`run_sage_bundle`, under the artifact root:

1. the bundle is refused unless the target's ``models.yaml`` is the table the logs were written with
   (``sage.checkpoint.check_table``);
2. the coder lever (:mod:`.coder_lever`) on the routing dataset and the task outcomes
   (``routing/routing_v1.parquet``, ``routing/task_outcomes.parquet``; without either, the coder keeps its
   table): the bundle's ``models.yaml`` pins the coder when the logs separate its models;
3. the router checkpoint: ``sage_router_checkpoint``'s (``checkpoints/sage``), else, with a rate above 0,
   an exploring one around SAGE's YAML, written into a scratch folder in the root (it lives in the bundle
   only), else none;
4. the skills (the sleep cycle's live version, given), the decision ledger (``decisions/ledger.json``)
   and the arms the levers' nights randomise (``decisions/assignment_plan.json``, ``assign.load_arms``:
   every part inside the root), each when it exists;
5. ``sage.bundle.build`` into ``checkpoints/bundle``, with why each part is what it is.

A refusal (another table than the logs', an arms file or a part that cannot be used) is a
:class:`SageBundleError` with the message of the check that refused it (the file, the field, what differs).
"""

from __future__ import annotations

import os
import shlex
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq

from sage_pipeline.decisions import assign
from sage_pipeline.decisions.ledger import LEDGER_NAME
from sage_pipeline.rl import coder_lever
from sage_pipeline.routing import routing_dataset as rd, task_outcomes as to
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage import bundle as bd, checkpoint as sage_router, explore as sage_explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable, pin

BUNDLE_DIR = ("checkpoints", "bundle")
ROUTER_CHECKPOINT = ("checkpoints", "sage")  # sage_router_checkpoint's SAGE checkpoint, when it wrote one
DECISIONS_DIR = "decisions"  # <data>/decisions/: the ledger and the arms file the levers' nights write
NO_LOGS = "no routing dataset with task outcomes yet: the coder keeps its table"


class SageBundleError(ValueError):
    """A bundle that cannot be built: another table than the logs', an arms file or a part refused."""


@dataclass
class SageBundleRun:
    """What :func:`run_sage_bundle` wrote and the figures the asset reports."""

    bundle: bd.Bundle  # read back from checkpoints/bundle
    table: RoutingTable  # the bundle's models.yaml (the coder pinned when the lever promoted it)
    decision: coder_lever.CoderLeverDecision | None  # None: no routing dataset with task outcomes yet
    kind: str  # the router checkpoint's kind, or "yaml" (none: SAGE's YAML)
    exploration: dict | None  # the checkpoint's exploration (its manifest's), None without one
    why: str
    coder: str  # the coder's row: its pinned model, or "primary / fallback (SAGE's bandit)"
    deploy_command: str
    coder_models: list[dict] = field(default_factory=list)  # per coder model logged: tasks, objective, interval
    arms: list[dict] = field(default_factory=list)  # per lever and arm: candidate, probability, threshold, part

    @property
    def coder_pinned_now(self) -> bool:
        return bool(self.decision is not None and self.decision.promote)


def coder_decision(root: Path, objective: TaskObjective, config: coder_lever.CoderLeverConfig,
                   current: str | None) -> coder_lever.CoderLeverDecision | None:
    """The coder lever on ``<root>/routing``'s dataset and task outcomes; None when either is missing."""
    ds_path, out_path = root / rd.DIR / rd.PARQUET_NAME, root / rd.DIR / to.TASK_OUTCOMES_NAME
    if not ds_path.is_file() or not out_path.is_file():
        return None
    cols = [c for c in ("role", "model", "session_id", "task_id", "episode_id", "step", "source_line")
            if c in pq.read_schema(ds_path).names]
    tasks, unjoined = coder_lever.coder_tasks(rd.read_routing_dataset(ds_path, cols), pd.read_parquet(out_path))
    decision = coder_lever.decide(tasks, objective, config, current)
    decision.unjoined = unjoined
    return decision


def decisions(root: Path) -> tuple[Path | None, dict | None]:
    """The ledger (``<root>/decisions/ledger.json``) and the arms (``<root>/decisions/assignment_plan.json``,
    ``assign.load_arms``: every part inside the root), each None when its file does not exist."""
    ledger = root / DECISIONS_DIR / LEDGER_NAME
    arms_file = root / DECISIONS_DIR / assign.ARMS_FILE
    try:
        arms = assign.load_arms(arms_file, root) if os.path.lexists(arms_file) else None
    except assign.AssignError as exc:
        raise SageBundleError(str(exc)) from exc
    return (ledger if os.path.lexists(ledger) else None), arms


def arms_table(b: bd.Bundle) -> list[dict]:
    """The bundle's arms, one row per lever and arm."""
    return [{"lever": lever, "arm": a["name"], "candidate": a["candidate"] or "incumbent",
             "probability": a["threshold"] / assign.SCALE, "threshold (of 2**32)": a["threshold"],
             "part": a["path"] or "the bundle's own"} for lever, arms in b.arms.items() for a in arms]


def run_sage_bundle(root: str | Path, learned_for: RoutingTable, target: str | Path, *, objective: TaskObjective,
                    coder: coder_lever.CoderLeverConfig, explore: sage_explore.ExploreConfig,
                    skills: Path | None = None,
                    progress: Callable[[str], None] | None = None) -> SageBundleRun:
    """Build the deployment bundle under the artifact root ``root`` (module docstring): ``learned_for``, the
    table SAGE ran when its logs were written; ``target``, the ``models.yaml`` the target SAGE runs (refused
    when it is not ``learned_for``); ``skills``, the sleep cycle's live skills version (None: SAGE's own).
    ``progress`` gets the bundle's id, folder and why. A refusal is a :class:`SageBundleError`."""
    root = Path(root)
    try:
        sage_router.check_table(learned_for, target)
    except ValueError as exc:
        raise SageBundleError(str(exc)) from exc
    row = learned_for.routes.get("coder")
    current = row.primary if row is not None and row.primary == row.fallback else None
    decision = coder_decision(root, objective, coder, current)
    table = pin(learned_for, "coder", decision.model) if decision is not None and decision.promote else learned_for
    why = decision.reason if decision is not None else NO_LOGS
    # a scratch folder named as the artifacts layer names its temporaries (.<name>.tmp-<8>): removed on exit
    with tempfile.TemporaryDirectory(prefix=".sage_bundle.tmp-", dir=root) as tmp:
        ck, kind = root.joinpath(*ROUTER_CHECKPOINT), "yaml"
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
        why += f"; skills: live version {skills.name} of {skills.parent.parent}" if skills else "; skills: SAGE's own"
        ledger, arms = decisions(root)
        why += f"; arms of {', '.join(arms)} randomised" if arms else ""
        try:
            b = bd.build(root.joinpath(*BUNDLE_DIR), table, learned_for, objective=objective, checkpoint=ck,
                         exploration=exploration, skills=skills, why=why, ledger=ledger, arms=arms)
        except bd.BundleError as exc:
            raise SageBundleError(str(exc)) from exc
    if progress is not None:
        progress(f"bundle {b.id[:12]} at {b.folder}: {why}")
    start = ("`<deploy root>/sage-run \"<prompt>\"` instead of `sage run \"<prompt>\"` (each run's arms drawn and "
             "recorded in <deploy root>/assignments.jsonl)" if b.arms else "`. <deploy root>/sage.env`")
    deploy = (f"python -m sage_pipeline.sage.bundle deploy {shlex.quote(str(b.folder))} <deploy root> --sage-python "
              f"<SAGE's python> (then start SAGE with {start})")
    per_model = [] if decision is None else [
        {"coder model": m, **{k: v for k, v in e.items() if k != "ci"}, "interval": e["ci"]}
        for m, e in decision.per_model.items()]
    pinned = table.routes["coder"]
    return SageBundleRun(
        bundle=b, table=table, decision=decision, kind=kind, exploration=exploration, why=why,
        coder=pinned.primary if pinned.primary == pinned.fallback
        else f"{pinned.primary} / {pinned.fallback} (SAGE's bandit)",
        deploy_command=deploy, coder_models=per_model, arms=arms_table(b) if b.arms else [])
