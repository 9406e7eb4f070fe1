"""The ``offline_eval`` asset's work: one night of off-policy evaluation on the artifact root, decided
and staged (:func:`run_offline_eval_night`).

It reads what the offline chain wrote under the root (the routing dataset, its action space, the
BC and CQL checkpoints, SAGE's task outcomes), judges the multi-model space (the static table, BC and
CQL) and, when BC and CQL were trained on this dataset in SAGE's binary space, what SAGE's router would
serve (:func:`sage_pipeline.rl.offline_eval.run_sage_binary_eval`), decided by the decision ledger's
router lever (``gate_mode`` ``"ledger"``) or by tonight's per-night gate. It writes offline_eval's
files as one set (:data:`OFFLINE_EVAL_FILES`: the report, its plot and the staged gate), saves the
router lever in the one ledger (``<root>/decisions/ledger.json``), and returns everything the asset
shows (:class:`OfflineEvalNight`), the problems of its blocking check included.

Ground truth: only a dataset whose rows come from the routing simulator (the synthetic collector's
journals: ``data_source`` ``synthetic``) is valued by the simulator its manifest describes
(``sessions/synthetic/simulator.json``). A dataset built from SAGE's own journals never loads the model
catalogue nor imports or builds the routing simulator (:func:`ground_truth_for`).

No dagster here: errors the asset shows as a failure are :class:`OfflineEvalError`.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path

import filelock
import pandas as pd

from sage_pipeline import artifacts
from sage_pipeline.decisions import router as ledger_router, skills as lever_skills
from sage_pipeline.decisions.ledger import Ledger, LedgerError
from sage_pipeline.rl import offline_eval as oe, ope
from sage_pipeline.rl.checkpoint import load_policy, read_meta
from sage_pipeline.rl.data import REQUIRED
from sage_pipeline.routing import routing_dataset as rd, task_outcomes as to
from sage_pipeline.routing.action_space import FILE_NAME as ACTION_SPACE_FILE, ActionSpace
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.features import FeatureSpec
from sage_pipeline.routing.policy import StaticTablePolicy
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.sage import checkpoint as sage_router
from sage_pipeline.sage.table import RoutingTable

# What the learners and estimators read; the provenance columns stay on disk.
POLICY_COLUMNS = (*REQUIRED, "decision_id", "data_source", "propensity_source")
# offline_eval's files, switched together: a report never names a decision the staged gate lacks
OFFLINE_EVAL_FILES = ("reports/offline_eval.json", "reports/offline_eval.png", "checkpoints/gate")
SIMULATOR_MANIFEST = ("sessions", "synthetic", "simulator.json")  # the synthetic collector's: the simulator's config
SYNTHETIC = "synthetic"  # data_source of a row the routing simulator's collector logged
# the router lever's files
CANDIDATES_DIR = ("checkpoints", "candidates")  # <sha256>/: each proposed checkpoint, written once, never rewritten
LEDGER_DEPLOY = "sage_binary_ledger.json"  # in checkpoints/gate/: the ledger's deploy, staged with the decision
DEPLOY_NOTE = "ledger_deploy.json"  # in checkpoints/promoted_sage/ (and checkpoints/sage/): what the ledger deploys


class OfflineEvalError(RuntimeError):
    """What stops a night: the ledger unreadable, or the checkpoint it deploys not the one kept."""


@dataclass(frozen=True)
class OfflineEvalSettings:
    """One night's settings, as the core's own configs (the asset's ``OfflineEvalConfig`` declares each
    default and description once)."""

    ope: ope.OPEConfig
    gate: oe.PromotionGateConfig  # the per-night gate: multi_model's, and sage_binary's in 'per_night' mode
    router_gate: ledger_router.RouterGateConfig  # the ledger mode's router contrast
    support: str  # oe.SUPPORT_RULES
    floor_selection: str  # oe.SELECTION_CRITERIA: how OPE picks each served policy's confidence floor
    gate_mode: str  # oe.GATE_MODES
    objective: str  # oe.OBJECTIVES
    night: str | None  # the ledger night (None: the UTC date of the decision)


@dataclass(frozen=True)
class LedgerNight:
    """What the ledger mode adds for SAGE's binary space."""

    path: Path  # the one ledger of every lever
    per_night: str  # tonight's per-night verdict, valid for one night only
    floor_notes: list[str]  # candidates kept at another floor than tonight's


@dataclass
class OfflineEvalNight:
    """One night of offline_eval: the reports, the gate decisions in them, the files written and the
    blocking check's problems (empty: the staged decision is for this dataset and every policy loads)."""

    reports: dict[str, oe.OfflineEvalReport]  # per action space evaluated ("multi_model", maybe "sage_binary")
    served: dict[str, oe.ServedSelection]  # sage_binary's served candidates ({} when it was not evaluated)
    ledger: LedgerNight | None  # set when sage_binary was decided by the ledger
    ground_truth: str  # "simulator", or "none (<why>)"
    propensities_estimated_by_bc: int
    objective: dict  # oe.objective_rows' account: judged_on, why, episode counts
    decided_at: str
    report_path: Path  # reports/offline_eval.json (its public path)
    plot: bytes  # reports/offline_eval.png
    gate_dir: Path  # checkpoints/gate (public)
    problems: list[str] = field(default_factory=list)


def checkpoint_rel(kind: str, space: str) -> str:
    """checkpoints/<kind> for the multi-model space, checkpoints/<kind>_sage_binary for SAGE's."""
    return f"checkpoints/{kind if space == 'multi_model' else f'{kind}_{space}'}"


def load_space(root: str | os.PathLike[str], name: str = "multi_model") -> ActionSpace:
    """The action space routing_dataset built (roles from the table, models from table and logs)."""
    return ActionSpace.load(Path(root) / "routing" / ACTION_SPACE_FILE, name)


def ledger_path(root: str | os.PathLike[str]) -> Path:
    """The one ledger of every lever (what decisions/decision_ledger reads)."""
    return lever_skills.ledger_path(root)


def behaviour_model(support: str, bc_model):
    """The behaviour model OPE's support check uses, or None for the logged-pairs rule."""
    if support not in oe.SUPPORT_RULES:
        raise ValueError(f"support {support!r}: use one of {', '.join(oe.SUPPORT_RULES)}")
    return bc_model if support == "behaviour" else None


def simulated(df: pd.DataFrame) -> bool:
    """Whether any row of the dataset comes from the routing simulator (the synthetic collector's
    journals); a dataset of SAGE's own journals has none."""
    return bool((df["data_source"] == SYNTHETIC).any())


def ground_truth_for(root: str | os.PathLike[str], df: pd.DataFrame, df_eval: pd.DataFrame, table: RoutingTable,
                     catalogue: str | os.PathLike[str], actions: tuple[str, ...]):
    """(simulator, "simulator") or (None, why): the simulator of the synthetic collector's manifest, for
    a dataset whose rows come from it (:func:`simulated`) and when every judged decision does
    (:func:`sage_pipeline.rl.offline_eval.ground_truth_simulator`). For any other dataset (SAGE's own
    journals) neither the ``catalogue`` (a path) is loaded nor the routing simulator imported."""
    if not simulated(df):
        return None, "not simulated data"
    path = Path(root) / "routing" / rd.PARQUET_NAME
    return oe.ground_truth_simulator(Path(root).joinpath(*SIMULATOR_MANIFEST), ModelCatalogue.load(catalogue),
                                     table, rd.read_reward_spec(path) or RewardSpec(), df_eval, actions)


# ------------------------------------------------------------------ the night
def run_offline_eval_night(root: str | os.PathLike[str], table: RoutingTable, catalogue: str | os.PathLike[str],
                           settings: OfflineEvalSettings,
                           log: Callable[[str], None] = lambda m: None) -> OfflineEvalNight:
    """offline_eval on the artifact ``root`` for SAGE's routing ``table`` (``catalogue``: the model
    catalogue's path, read only for the routing simulator's data): the report half of the eval split
    judged in every space trained on this dataset, the decisions staged in checkpoints/gate/ with
    the report (one set, :data:`OFFLINE_EVAL_FILES`), the router lever saved in the ledger in
    'ledger' mode; ``log`` hears the progress. Missing inputs (the dataset, its action space, the BC
    and CQL checkpoints) are errors that name the file and the asset to materialize."""
    root = Path(root)
    path = root / "routing" / rd.PARQUET_NAME
    # who decided (the support sentences), and when (the ledger judges episodes logged after a proposal)
    df = rd.read_routing_dataset(path, (*POLICY_COLUMNS, "policy_source", "timestamp"))
    df_seen = df  # what tonight's candidates were trained and selected on: every row, before the objective
    multi = load_space(root)
    spec = FeatureSpec(roles=multi.roles)
    bc_model = load_policy(root / "checkpoints" / "bc", spec, multi.actions)
    df_eval, n_estimated = oe.fill_missing_propensities(oe.eval_part(df, "report"), bc_model)
    sim, truth = ground_truth_for(root, df, df_eval, table, catalogue, multi.actions)
    outcomes = root / "routing" / to.TASK_OUTCOMES_NAME
    df, judged = oe.objective_rows(df, pd.read_parquet(outcomes) if outcomes.is_file() else None, settings.objective,
                                   simulated=sim is not None)
    if judged["judged_on"] != "reward_v1":  # the report half again, on the rows the objective scores
        df_eval, n_estimated = oe.fill_missing_propensities(oe.eval_part(df, "report"), bc_model)
    log(f"offline_eval judges {judged['judged_on']}: {judged['why']}")
    no_interval = oe.one_outcome_reason(df_eval)  # all report tasks ended alike: no interval can show the other
    ope_cfg, gate = settings.ope, settings.gate
    behaviour = behaviour_model(settings.support, bc_model)
    evidence = {"dataset_sha256": artifacts.file_sha256(path)}
    reports, served, ledger = {}, {}, None
    # the multi-model space: the static table, BC and CQL as trained
    ckpts = {"bc": root / "checkpoints" / "bc", "cql": root / "checkpoints" / "cql"}
    policies = {"static_table": StaticTablePolicy(table, multi), "bc": bc_model,
                "cql": load_policy(ckpts["cql"], spec, multi.actions)}
    rep = reports["multi_model"] = oe.run_offline_eval(df_eval, policies, multi, ope_cfg, sim=sim, progress=log,
                                                       behaviour=behaviour, gate=gate, evidence=df,
                                                       no_interval=no_interval)
    decided_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with artifacts.exclusive_set(root, "offline_eval", list(OFFLINE_EVAL_FILES), log) as stage:
        gate_dir = stage.path("checkpoints", "gate")
        gate_dir.mkdir(parents=True, exist_ok=True)
        oe.promote(rep.gate, ckpts, gate_dir / "multi_model", evidence | {"summary": rep.summary()})
        # SAGE's binary space, when trained on this dataset: judge what SAGE's router would run
        binary = multi.binary()
        trained = {k: root / checkpoint_rel(k, "sage_binary") for k in ("bc", "cql")}
        fresh = all((p / "policy.json").is_file() and read_meta(p).training_data_sha256 == evidence["dataset_sha256"]
                    for p in trained.values())
        if not fresh:
            log("sage_binary: no BC and CQL checkpoints trained on this dataset (add 'sage_binary' to "
                "bc_policy's and cql_policy's action_spaces); only the multi-model space is evaluated")
        else:
            df_binary = oe.fill_missing_propensities(df, bc_model)[0]
            rep, served = oe.run_sage_binary_eval(
                df_binary, df_eval, binary, table,
                {k: load_policy(p, spec, binary.actions) for k, p in trained.items()}, ope_cfg, sim,
                log, behaviour, settings.floor_selection, gate, no_interval, mode="per_night")
            if settings.gate_mode == "ledger":
                rep, ledger = _ledger_gate(root, table, settings, rep, served, df_seen, df_binary, binary, evidence,
                                           decided_at, log)
                deploy = rep.gate.ledger["deploy"]
                if deploy["key"] != ledger_router.TABLE:  # staged for promoted_policy, byte for byte
                    _stage_deployed(gate_dir, root, deploy, evidence | {
                        "reason": rep.gate.reason, "ledger_candidate": deploy["candidate"],
                        "summary": rep.summary()})
                artifacts.write_json(gate_dir / LEDGER_DEPLOY, {
                    "mode": "ledger", "night": rep.gate.ledger["night"], "decided_at": decided_at,
                    "deploy": deploy, "ledger": str(ledger.path), "reason": rep.gate.reason,
                    "accepted": rep.gate.ledger["accepted"], "reverted": rep.gate.ledger["reverted"]})
            else:  # staged with the path SAGE will be pointed at once promoted_policy publishes it
                oe.promote_served(rep.gate, served, gate_dir / "sage_binary", evidence | {"summary": rep.summary()},
                                  served_at=root / "checkpoints" / oe.GATE_SPACES["sage_binary"])
            reports["sage_binary"] = rep
            oe.keep_candidates(served, gate_dir / oe.CANDIDATES_DIR, evidence,  # what the gate judged, for audit
                               served_at=root / "checkpoints" / "gate" / oe.CANDIDATES_DIR)
        oe.write_decision(gate_dir, decided_at, evidence["dataset_sha256"], {k: r.gate for k, r in reports.items()})
        out = stage.public(artifacts.write_json(
            stage.path("reports", "offline_eval.json"),
            {k: r.to_dict() for k, r in reports.items()} | {"propensities_estimated_by_bc": n_estimated,
                                                            "objective": judged}))
        png = oe.plot_offline_eval(reports["multi_model"])
        artifacts.write_bytes(stage.path("reports", "offline_eval.png"), png)
    for name, r in reports.items():
        log(f"{name}: {r.gate.reason}")
    gate_dir = root / "checkpoints" / "gate"
    problems = (oe.check_decision(gate_dir, evidence["dataset_sha256"], staged_loaders(root, table))
                + ledger_stage_problems(gate_dir, staged_loaders(root, table)))
    return OfflineEvalNight(reports, served, ledger, "simulator" if sim is not None else f"none ({truth})",
                            n_estimated, judged, decided_at, out, png, gate_dir, problems)


# ------------------------------------------------------------------ the router lever
def _trained_until(df: pd.DataFrame) -> tuple[pd.Timestamp | None, tuple[str, ...]]:
    """(latest log time, episode ids) of what tonight's candidates were trained and selected on: the train
    split (BC, CQL, the distilled classifiers) and the eval split's select part (CQL's alpha, the floor)."""
    seen = pd.concat([df[df["split"] == "train"], oe.eval_part(df, "select")])
    ts = pd.to_datetime(seen["timestamp"], utc=True, errors="coerce", format="ISO8601")
    return (None if ts.isna().all() else ts.max()), tuple(sorted(seen["episode_id"].astype(str).unique()))


def _keep_addressed(root: Path, served: dict, evidence: dict) -> tuple[dict, dict, list[str]]:
    """Each served candidate as the checkpoint SAGE would load, at checkpoints/candidates/<key>/ (the ledger key:
    its policy.joblib's sha256 with the floor SAGE applies, ``router.candidate_key``), written once: a key already
    kept is never rewritten. Returns (keys, paths) by served name, and a note per key kept at another floor
    (only a key written before the floor was part of it can be)."""
    keys, paths, notes = {}, {}, []
    for name, sel in served.items():
        key = oe.served_key(sel.policy)
        folder = root.joinpath(*CANDIDATES_DIR, key)
        if not (folder / sage_router.JOBLIB_NAME).is_file():
            sage_router.write_sage_checkpoint(folder, sel.policy, {
                "policy": name, "source": sel.source, "min_confidence_selected_by": sel.how,
                "agreement_eval": sel.agreement_eval, "ledger_key": key, **evidence})
            got = ledger_router.folder_key(folder)
            if got != key:
                raise RuntimeError(f"{folder}: its policy.joblib and floor give key {got[:12]}, not its ledger key "
                                   f"{key[:12]} (oe.served_key): the candidate could not be kept at its content "
                                   "address")
        elif float(sage_router.read_manifest(folder)["min_confidence"]) != float(sel.policy.min_confidence):
            notes.append(f"{name}: the classifiers of {key[:12]} were kept at floor "
                         f"{sage_router.read_manifest(folder)['min_confidence']}, tonight's floor is "
                         f"{sel.policy.min_confidence}: the ledger values the one kept")
        keys[name], paths[name] = key, str(folder)
    return keys, paths, notes


def kept_at(root: str | os.PathLike[str], key: str, path: str | None) -> Path:
    """Where candidate ``key`` is kept: checkpoints/candidates/<key>/ under this root, else the path its ledger
    payload recorded (a root moved or copied keeps working: the folder is checked against the key)."""
    here = Path(root).joinpath(*CANDIDATES_DIR, key)
    return here if (here / sage_router.JOBLIB_NAME).is_file() or not path else Path(path)


def _candidate_loader(root: Path, table: RoutingTable):
    """LedgerGateInputs.load: a candidate of an earlier night, read back from its content address
    (:func:`kept_at`) and checked against its key."""
    binary = load_space(root, "sage_binary")

    def load(key: str, payload: dict):
        folder = kept_at(root, key, payload.get("path"))
        policy = sage_router.load_sage_checkpoint(folder, table, binary)
        if not ledger_router.folder_matches(folder, key):
            raise ValueError(f"{folder}: its policy.joblib and floor give key {ledger_router.folder_key(folder)[:12]}, "
                             f"not the ledger's key {key[:12]}: the kept checkpoint changed; restore it from the "
                             "bundle that deployed it")
        return policy
    return load


def _save_router_lever(led: Ledger, path: Path) -> Path:
    """Save the router lever's candidates as ``led`` has them and every other lever's as the file has them
    now (another lever's night may have saved meanwhile), under ``<ledger>.lock`` (the lock
    decisions.skills.save_merged takes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with filelock.FileLock(str(path) + ".lock"):
        if path.exists():
            disk = Ledger.load(path)
            led.data.candidates = ([c for c in disk.data.candidates if c.lever != ledger_router.LEVER]
                                   + [c for c in led.data.candidates if c.lever == ledger_router.LEVER])
            led.data.next_index = {**disk.data.next_index,
                                   ledger_router.LEVER: led.data.next_index.get(ledger_router.LEVER, 1)}
            led.data.seq = max(led.data.seq, disk.data.seq)
        return led.save(path)


def _stage_deployed(gate_dir: Path, root: Path, deploy: dict, facts: dict) -> None:
    """The ledger's deployed checkpoint staged as gate/sage_binary (its policy.joblib copied byte for byte, so
    its sha256 stays the ledger key; the manifest names tonight's dataset and where SAGE will find it)."""
    src = kept_at(root, deploy["key"], deploy["path"])
    if not ledger_router.folder_matches(src, deploy["key"]):
        raise OfflineEvalError(f"{src / sage_router.JOBLIB_NAME} is not the checkpoint the ledger deploys "
                               f"({deploy['key'][:12]}): restore it from the bundle that deployed it")
    manifest = sage_router.read_manifest(src)
    served_at = Path(os.path.abspath(root / "checkpoints" / oe.GATE_SPACES["sage_binary"]))
    env = {**manifest.get("sage_env", {}), "SAGE_RL_CHECKPOINT": str(served_at / sage_router.JOBLIB_NAME)}
    with artifacts.atomic_dir(gate_dir / "sage_binary") as tmp:
        shutil.copyfile(src / sage_router.JOBLIB_NAME, tmp / sage_router.JOBLIB_NAME)
        artifacts.write_json(tmp / sage_router.MANIFEST_NAME, {**manifest, **facts, "sage_env": env})


def _ledger_gate(root: Path, table: RoutingTable, settings: OfflineEvalSettings, rep, served: dict,
                 df_seen: pd.DataFrame, df: pd.DataFrame, binary: ActionSpace, evidence: dict, decided_at: str,
                 log) -> tuple[oe.OfflineEvalReport, LedgerNight]:
    """SAGE's binary space through the ledger's router lever (oe.ledger_gate): tonight's candidates kept at
    their content addresses, the ledger loaded, judged, tonight's candidates proposed, the lever saved."""
    keys, paths, notes = _keep_addressed(root, served, evidence)
    until, seen = _trained_until(df_seen)
    if until is None:
        log("no parsable log time in the train and select episodes: tonight's candidates are judged on episodes "
            f"logged after {decided_at}")
    path = ledger_path(root)
    try:
        led = Ledger.load(path)
    except LedgerError as exc:
        raise OfflineEvalError(str(exc)) from exc
    inputs = oe.LedgerGateInputs(led, settings.night or decided_at[:10], until if until is not None else decided_at,
                                 keys, paths, _candidate_loader(root, table), seen, settings.router_gate)
    gate = oe.ledger_gate(rep.gate, {n: s.policy for n, s in served.items()}, df, binary, table, inputs)
    _save_router_lever(led, path)
    log(f"ledger {path}: {gate.reason}")
    per_night = f"tonight's per-night verdict (valid for one night only): {rep.gate.reason}"
    return replace(rep, gate=gate), LedgerNight(path, per_night, notes)


# ------------------------------------------------------------------ what the blocking check reads
def staged_loaders(root: str | os.PathLike[str], table: RoutingTable) -> dict:
    """How each space's staged (or published) policy is loaded, to check it."""
    multi = load_space(root)
    return {"multi_model": lambda p: load_policy(p, FeatureSpec(roles=multi.roles), multi.actions),
            "sage_binary": lambda p: sage_router.load_sage_checkpoint(p, table, load_space(root, "sage_binary"))}


def read_ledger_deploy(gate_dir: Path) -> dict | None:
    """The ledger's deploy staged by offline_eval (None: the last offline_eval ran in 'per_night' mode, or
    judged no sage_binary space)."""
    p = gate_dir / LEDGER_DEPLOY
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def ledger_stage_problems(gate_dir: Path, loaders: dict) -> list[str]:
    """What is wrong with the ledger's staged deploy: a checkpoint it deploys must be staged, load, and be
    the very file the ledger keys (its sha256)."""
    try:
        d = read_ledger_deploy(gate_dir)
    except (OSError, ValueError) as e:
        return [f"{gate_dir / LEDGER_DEPLOY}: unreadable ({e}); re-materialize offline_eval"]
    if d is None or d["deploy"]["key"] == ledger_router.TABLE:
        return []
    folder = gate_dir / "sage_binary"
    try:
        loaders["sage_binary"](folder)
        got = ledger_router.folder_key(folder)
        same = ledger_router.folder_matches(folder, d["deploy"]["key"])
    except Exception as e:  # noqa: BLE001 - any failure to load is the finding
        return [f"sage_binary: the ledger's deployed {d['deploy']['candidate']} staged at {folder} does not load: {e}"]
    if not same:
        return [f"sage_binary: the staged {folder} (its policy.joblib and floor) has key {got[:12]}, the ledger "
                f"deploys {d['deploy']['key'][:12]}; re-materialize offline_eval"]
    return []
