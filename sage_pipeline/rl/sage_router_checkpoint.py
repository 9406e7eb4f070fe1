"""The ``sage_router_checkpoint`` asset's work (:func:`write_sage_router_checkpoint`): the deployed
sage_binary policy (``checkpoints/promoted_sage/``, what promoted_policy published), or, with
``explore``, the exploring checkpoint around it (around SAGE's YAML when none is deployed), written as
the file SAGE's router loads unchanged (``checkpoints/sage/policy.joblib`` + ``manifest.json``),
bound to the table SAGE runs and checked as SAGE loads it.

When nothing is deployed and nothing explores, SAGE runs its YAML alone: nothing is written, except
that a checkpoint left in checkpoints/sage/ is replaced by a folder without policy.joblib when the
ledger deploys SAGE's table (a revert). No dagster here: errors the asset shows as a failure are
:class:`RouterCheckpointError`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sage_pipeline import artifacts
from sage_pipeline.decisions import router as ledger_router
from sage_pipeline.rl.offline_eval_night import DEPLOY_NOTE, load_space
from sage_pipeline.routing.action_space import FILE_NAME as ACTION_SPACE_FILE, ActionSpace
from sage_pipeline.sage import checkpoint as sage_router, explore as sage_explore
from sage_pipeline.sage.table import RoutingTable

RECORD = ("Once SAGE runs it, record the deployment (`python -m sage_pipeline.sage.explore deploy {what}`, which "
          "prints the exports{extra}) so each logged decision's probability can be reconstructed.")


class RouterCheckpointError(RuntimeError):
    """The checkpoint cannot be written for the table SAGE runs."""


@dataclass(frozen=True)
class SageRouterCheckpoint:
    """What was written (``written``), or why nothing was; the rest describes the written checkpoint."""

    written: bool
    deploy: str  # what SAGE runs: "SAGE's YAML table", or the policy (explored around)
    reason: str | None = None  # why nothing was written
    removed: bool = False  # checkpoints/sage's checkpoint replaced by a folder without policy.joblib
    record: str | None = None  # with removed: how to record the YAML deployment
    warning: str | None = None  # what the asset warns of
    kind: str | None = None
    path: Path | None = None  # policy.joblib
    manifest_path: Path | None = None
    sha256: str | None = None
    min_confidence: float | None = None
    roles: list[str] = field(default_factory=list)  # roles with a classifier
    manifest: dict = field(default_factory=dict)  # the manifest as written (sage_table, sage_env, exploration, ...)
    source: str = "unknown"
    agreement_eval: dict = field(default_factory=dict)
    agreement: dict = field(default_factory=dict)
    decisions_checked: int = 0  # decisions checked as SAGE makes them


def _yaml_alone(root: Path, dest: Path, note: dict | None, log) -> SageRouterCheckpoint:
    """SAGE runs its YAML alone. When the ledger deploys the table (a revert, or nothing accepted) and
    checkpoints/sage holds a checkpoint, that folder is replaced by one without policy.joblib (SAGE's loader
    then finds no file and routes by its YAML); nothing is written where no checkpoint was."""
    by_ledger = note is not None and note["deploy"]["key"] == ledger_router.TABLE
    if by_ledger and (dest / sage_router.JOBLIB_NAME).is_file():
        with artifacts.exclusive(root, "sage_router_checkpoint", log):
            with artifacts.atomic_dir(dest) as tmp:
                artifacts.write_json(tmp / DEPLOY_NOTE, note | {"sage_runs": "its YAML table (no policy.joblib "
                                                                "here: SAGE_RL_POLICY may be unset)"})
        return SageRouterCheckpoint(
            False, "SAGE's YAML table", f"the ledger deploys SAGE's YAML table: {note['reason']}", removed=True,
            record=RECORD.format(what="--yaml", extra=""),
            warning=f"the ledger deploys SAGE's YAML table ({note['reason']}): {dest} no longer holds a checkpoint")
    reason = (f"the ledger deploys SAGE's YAML table: {note['reason']}" if by_ledger
              else "no sage_binary policy promoted (see offline_eval's promotion_sage)")
    return SageRouterCheckpoint(False, "SAGE's YAML table", reason,
                                warning="no sage_binary policy is deployed: SAGE keeps its YAML table")


def _deployed_label(note: dict | None, manifest: dict, promoted: bool) -> str:
    if not promoted:
        return "SAGE's YAML table"
    if note is not None:
        return f"{note['deploy']['candidate']} ({note['deploy']['name']}, {note['deploy']['key'][:12]}: the ledger's)"
    return f"{manifest.get('policy', 'the promoted policy')} (the last per-night promotion)"


def write_sage_router_checkpoint(root: str | os.PathLike[str], table: RoutingTable,
                                 sage_models_yaml: str | os.PathLike[str], explore: bool = False,
                                 exploration_rate: float | None = None,
                                 log: Callable[[str], None] = lambda m: None) -> SageRouterCheckpoint:
    """checkpoints/sage/ under ``root`` for the policy trained on ``table``: written only if
    ``sage_models_yaml`` (the models.yaml SAGE runs) routes as ``table`` does; with ``explore`` the
    exploring checkpoint (``exploration_rate``, None: ``sage_explore.ExploreConfig``'s)."""
    root = Path(root)
    src, dest = root / "checkpoints" / "promoted_sage", root / "checkpoints" / "sage"
    promoted = (src / sage_router.JOBLIB_NAME).is_file()
    note = json.loads((src / DEPLOY_NOTE).read_text(encoding="utf-8")) if (src / DEPLOY_NOTE).is_file() else None
    # exploring around SAGE's YAML needs no logs yet (a first deployment): the table's own binary space
    binary = (load_space(root, "sage_binary") if promoted or (root / "routing" / ACTION_SPACE_FILE).is_file()
              else ActionSpace.build(table).binary())
    if not promoted and not explore:
        return _yaml_alone(root, dest, note, log)
    try:  # written only for the table SAGE runs
        sage_table = sage_router.check_table(table, sage_models_yaml)
    except ValueError as exc:
        raise RouterCheckpointError(str(exc)) from exc
    manifest = sage_router.read_manifest(src) if promoted else {"source": f"SAGE's YAML ({table.source})"}
    served = sage_router.load_sage_checkpoint(src, table, binary).with_every_role() if promoted else table
    if explore:
        cfg = (sage_explore.ExploreConfig() if exploration_rate is None
               else sage_explore.ExploreConfig(rate=exploration_rate))
        served = sage_explore.build_exploring(served, binary, cfg, table=table)
    ledger = {} if note is None else {"ledger_candidate": note["deploy"]["candidate"],
                                      "ledger_key": note["deploy"]["key"], "ledger_night": note["night"]}
    with artifacts.exclusive(root, "sage_router_checkpoint", log):  # both files: one run's
        paths = sage_router.write_sage_checkpoint(dest, served, {k: v for k, v in manifest.items()
                                                                 if k in sage_router.CARRIED_MANIFEST_KEYS} | ledger,
                                                  sage_table=sage_table)
        checked = (sage_explore.check_loads(paths[0], served, binary) if explore
                   else sage_router.check_loads_as_sage(paths[0], served, binary))
        written = sage_router.read_manifest(dest)
        sha256 = artifacts.file_sha256(paths[0])
    log(f"SAGE router checkpoint {paths[0]}: {checked} decisions checked as SAGE makes them")
    return SageRouterCheckpoint(
        True, ("explored around " if explore else "") + _deployed_label(note, manifest, promoted),
        kind=written["kind"], path=paths[0], manifest_path=paths[1], sha256=sha256,
        min_confidence=served.min_confidence, roles=sorted(served.models), manifest=written,
        source=manifest.get("source", "unknown"), agreement_eval=manifest.get("agreement_eval", {}),
        agreement=manifest.get("agreement", {}), decisions_checked=checked)
