"""The offline chain's learners and their proof:
routing_dataset -> bc_policy, cql_policy -> offline_eval (with the promotion gate)."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import json
import os
import shutil
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

import dagster as dg
import filelock
import pandas as pd
from pydantic import Field, model_validator

from sage_pipeline import artifacts, markdown
from sage_pipeline.decisions import router as ledger_router
from sage_pipeline.decisions.ledger import LEDGER_NAME, Ledger, LedgerError
from sage_pipeline.defs.decision_assets import LEDGER_DIR
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.routing_assets import GROUP, reward_report, routing_dataset
from sage_pipeline.defs.sections import to_core
from sage_pipeline.rl import bc, cql, offline_eval as oe, ope
from sage_pipeline.rl.checkpoint import load_policy, read_meta
from sage_pipeline.rl.data import REQUIRED, from_dataset
from sage_pipeline.routing import routing_dataset as rd, task_outcomes as to
from sage_pipeline.routing.action_space import FILE_NAME as ACTION_SPACE_FILE, SPACES, ActionSpace
from sage_pipeline.routing.features import FeatureSpec
from sage_pipeline.routing.policy import StaticTablePolicy
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.sage import checkpoint as sage_router, explore as sage_explore

# What the learners and estimators read; the provenance columns stay on disk.
POLICY_COLUMNS = (*REQUIRED, "decision_id", "data_source", "propensity_source")


def _dataset(sage: SageResource):
    path = sage.path("routing", rd.PARQUET_NAME)
    return path, rd.read_routing_dataset(path, POLICY_COLUMNS)


def _space(sage: SageResource, name: str = "multi_model") -> ActionSpace:
    """The action space routing_dataset built (roles from the table, models from table and logs)."""
    return ActionSpace.load(sage.path("routing", ACTION_SPACE_FILE), name)


def _checkpoint_rel(kind: str, space: str) -> str:
    """checkpoints/<kind> for the multi-model space, checkpoints/<kind>_sage_binary for SAGE's."""
    return f"checkpoints/{kind if space == 'multi_model' else f'{kind}_{space}'}"


def _checkpoint_dir(sage: SageResource, kind: str, space: str):
    return sage.root() / _checkpoint_rel(kind, space)


def _check_spaces(spaces: list[str]) -> list[str]:
    bad = [s for s in spaces if s not in SPACES]
    if bad or "multi_model" not in spaces:
        raise ValueError(f"action_spaces {spaces}: list 'multi_model' (BC's behaviour model, OPE's propensities) "
                         f"and optionally 'sage_binary'; unknown: {bad}")
    return list(dict.fromkeys(spaces))


def _behaviour(support: str, bc_model):
    """The behaviour model OPE's support check uses, or None for the logged-pairs rule."""
    if support not in oe.SUPPORT_RULES:
        raise ValueError(f"support {support!r}: use one of {', '.join(oe.SUPPORT_RULES)}")
    return bc_model if support == "behaviour" else None


# offline_eval's files, switched together: a report never names a decision the staged gate lacks
OFFLINE_EVAL_FILES = ("reports/offline_eval.json", "reports/offline_eval.png", "checkpoints/gate")
# promoted_policy's: what passed the gate, published (a space that promoted nothing keeps its last one)
PROMOTED_FILES = tuple(f"checkpoints/{d}" for d in oe.GATE_SPACES.values())
GATE_CHECK = "gate_decision_is_consistent"

SPACES_FIELD = Field(list(SPACES), description="action spaces to train: 'multi_model' (any logged model per "
                     "role) and 'sage_binary' (the table's primary or fallback, what SAGE's router executes)")


class BCPolicyConfig(dg.Config, bc.BCConfig):
    """bc_policy's run config: ``sage_pipeline.rl.bc.BCConfig`` and the action spaces to train."""

    action_spaces: list[str] = SPACES_FIELD


@dg.asset(group_name=GROUP, deps=[routing_dataset, reward_report], kinds={"pytorch"},
          description="Behaviour cloning of the logged routing decisions (torch MLP, masked per role), "
                      "calibrated by temperature scaling, per action space: checkpoints/bc/ (multi-model; also "
                      "the propensity model for logs without propensities) and checkpoints/bc_sage_binary/ "
                      "(primary or fallback, from the decisions that took one of them).")
def bc_policy(context: dg.AssetExecutionContext, config: BCPolicyConfig, sage: SageResource) -> dg.MaterializeResult:
    path, df = _dataset(sage)
    keys = ("temperature", "epochs", "best_epoch", "updates", "holdout_accuracy", "holdout_nll_before",
            "holdout_nll_after",
            "holdout_ece_before", "holdout_ece_after", "holdout_propensity_mae", "seconds")
    meta = {}
    with sage.writing("bc_policy", [_checkpoint_rel("bc", s) for s in SPACES], context.log.info) as stage:
        for name in _check_spaces(config.action_spaces):
            space = _space(sage, name)
            data = from_dataset(df, space).split_rows("train").restrict(space)
            res = bc.train_bc(data, FeatureSpec(roles=space.roles), to_core(config, bc.BCConfig), log=context.log.info)
            ck = stage.public(res.save(stage.path(_checkpoint_rel("bc", name)),
                                       training_data_sha256=artifacts.file_sha256(path)))
            m = res.metrics
            sfx = "" if name == "multi_model" else f"_{name}"
            meta |= {f"path{sfx}": dg.MetadataValue.path(str(ck)), f"train_rows{sfx}": len(data),
                     f"calibration{sfx}": dg.MetadataValue.md(
                         markdown.table([{"metric": k, "value": m.get(k)} for k in keys if k in m])),
                     f"roles_with_one_action{sfx}": dg.MetadataValue.json(m.get("roles_with_one_action", [])),
                     f"metrics{sfx}": dg.MetadataValue.json(m)}
    return dg.MaterializeResult(metadata=meta)


class CQLPolicyConfig(dg.Config, cql.CQLConfig):
    """cql_policy's run config: ``sage_pipeline.rl.cql.CQLConfig`` (every field but alpha: the
    alphas are a grid, one chosen by OPE) and how the alpha is chosen."""

    action_spaces: list[str] = SPACES_FIELD
    alphas: list[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] = Field(
        list(oe.DEFAULT_ALPHAS), min_length=1, description="conservative weights tried in one batched run, each >= 0; "
        "OPE on the eval split keeps one (see selection)")
    selection: str = Field("fqe", description="how OPE on the eval split's select half ranks the alphas: 'fqe' "
                           "(default): the best fitted-Q evaluation estimate; 'estimate': the best estimate of the "
                           "gate's clipped step-wise DR; 'lower_bound': the best lower bound of its interval "
                           "(favours policies near "
                           "the logs). See docs/benchmarks.md for how they compare")
    n_boot: int = Field(300, description="bootstrap resamples for the alpha selection")
    support: str = Field("logged_pairs", description="support rule of the OPE that picks alpha: "
                         "'logged_pairs' ((role, model) pairs present in the evaluated logs) or 'behaviour' "
                         "(the behaviour policy's support as bc_policy models it); see docs/benchmarks.md")

    @model_validator(mode="after")
    def _alphas_not_alpha(self) -> "CQLPolicyConfig":
        if "alpha" in self.model_fields_set:
            raise ValueError("cql_policy trains every alpha in `alphas` and OPE keeps one: set alphas (e.g. [0.03]) "
                             "instead of alpha")
        return self


@dg.asset(group_name=GROUP, deps=[routing_dataset, reward_report, bc_policy], kinds={"pytorch"},
          description="Discrete conservative Q-learning (CQL) on the train split, bandit or multi-step; "
                      "alpha chosen on the eval split by OPE (fitted-Q evaluation by default; BC's "
                      "propensities where the logs have none), never by simulator ground truth. "
                      "Checkpoint in checkpoints/cql/.")
def cql_policy(context: dg.AssetExecutionContext, config: CQLPolicyConfig, sage: SageResource) -> dg.MaterializeResult:
    path, df = _dataset(sage)
    multi = _space(sage)
    bc_model = load_policy(sage.path("checkpoints", "bc"), FeatureSpec(roles=multi.roles), multi.actions)
    df, n_estimated = oe.fill_missing_propensities(df, bc_model)
    cfg = to_core(config, cql.CQLConfig)
    meta = {"mode": config.mode, "propensities_estimated_by_bc": n_estimated}
    with sage.writing("cql_policy", [_checkpoint_rel("cql", s) for s in SPACES], context.log.info) as stage:
        for name in _check_spaces(config.action_spaces):
            sel = oe.train_select_cql(df, multi.of(name), cfg, config.alphas,
                                      ope.OPEConfig(n_boot=config.n_boot, seed=config.seed), config.selection,
                                      progress=context.log.info, behaviour=_behaviour(config.support, bc_model))
            chosen, how, table = sel.result, sel.how, sel.table
            ck = stage.public(chosen.save(stage.path(_checkpoint_rel("cql", name)), artifacts.file_sha256(path),
                                          metrics={"alpha_selection": table, "selected_by": how}))
            sfx = "" if name == "multi_model" else f"_{name}"
            meta |= {
                f"path{sfx}": dg.MetadataValue.path(str(ck)), f"alpha{sfx}": chosen.config.alpha,
                f"steps{sfx}": chosen.metrics["steps"], f"selected_by{sfx}": how,
                f"select_episodes{sfx}": sel.n_episodes,
                f"sample_size_warning{sfx}": sel.warning or "none",
                f"alpha_selection{sfx}": dg.MetadataValue.md(
                    f"Chosen by {how}. These estimates are optimistic for the winner (it was chosen on "
                    "them); offline_eval re-estimates every policy on the eval split's other half.\n\n"
                    + markdown.table(table)),
                f"training{sfx}": dg.MetadataValue.json(
                    {k: v for k, v in chosen.metrics.items() if not isinstance(v, list)}),
            }
    return dg.MaterializeResult(metadata=meta)


class PromotionGateSection(dg.Config, oe.PromotionGateConfig):
    """``sage_pipeline.rl.offline_eval.PromotionGateConfig``: the gate's rule and its bar."""


class RouterGateSection(dg.Config, ledger_router.RouterGateConfig):
    """``sage_pipeline.decisions.router.RouterGateConfig``: the router contrast's stated bounds."""


GATE_MODE_FIELD = Field(oe.GATE_MODE, description="how SAGE's binary space is decided: 'ledger' (default): through "
                        "the decision ledger's router lever (<data>/decisions/ledger.json): each candidate against "
                        "the policy SAGE runs now, on exploring logs written after it was proposed, evidence carried "
                        "across nights, one false-accept level over every night and candidate, the deployed policy "
                        "kept on probation and reverted when its advantage is excluded; 'per_night': tonight's "
                        "verdict against the table on tonight's report half, valid for one night only (a test "
                        "repeated every night on a growing log accepts wrongly most months: one-off comparisons "
                        "and benchmarks only)")


class OfflineEvalConfig(dg.Config, ope.OPESettings):
    """offline_eval's run config: OPE's settings (``sage_pipeline.rl.ope.OPESettings``: n_boot, alpha,
    seed, clip_factor, ...), the promotion gate as the section ``gate: {rule, min_gain}``, the gate's
    mode for SAGE's binary space, the router lever's bounds and the asset's own fields."""

    support: str = Field("logged_pairs", description="support rule: 'logged_pairs' or 'behaviour' (as cql_policy)")
    floor_selection: str = Field("fqe", description="how OPE on the eval split's select half picks SAGE's confidence "
                                 "floor for each served sage_binary policy: 'fqe', 'estimate' or 'lower_bound' (as "
                                 "cql_policy's selection; see docs/benchmarks.md)")
    gate: PromotionGateSection = Field(default_factory=PromotionGateSection,
                                       description="the per-night promotion gate (PromotionGateConfig): rule and "
                                       "min_gain; the multi-model space's gate, and sage_binary's in 'per_night' mode")
    gate_mode: Literal["ledger", "per_night"] = GATE_MODE_FIELD
    router_gate: RouterGateSection = Field(default_factory=RouterGateSection,
                                           description="the ledger mode's router contrast (decisions.router."
                                           "RouterGateConfig): objective bounds, the exploring checkpoint's rate "
                                           "(min_propensity) and the randomised decisions re-weighted per task")
    night: str | None = Field(None, description="the ledger night this run decides (default: the UTC date of the "
                              "run); two runs with one night label count as one night of a pending candidate")
    objective: str = Field("task", description="what an episode's return is: 'task' (its `sage run` task's "
                           "objective from routing/task_outcomes.parquet, task_v1 by default; reward_v1 only on the "
                           "routing simulator's sessions or journals without SAGE's tasks, said in the metadata) or "
                           "'reward_v1' (SAGE's per-decision reward summed: comparison only)")


# ------------------------------------------------------------------ the router lever's files
CANDIDATES_DIR = ("checkpoints", "candidates")  # <sha256>/: each proposed checkpoint, written once, never rewritten
LEDGER_DEPLOY = "sage_binary_ledger.json"  # in checkpoints/gate/: the ledger's deploy, staged with the decision
DEPLOY_NOTE = "ledger_deploy.json"  # in checkpoints/promoted_sage/ (and checkpoints/sage/): what the ledger deploys


def _ledger_path(sage: SageResource) -> Path:
    """The one ledger of every lever (what decisions/decision_ledger reads)."""
    return sage.path(LEDGER_DIR, LEDGER_NAME)


def _trained_until(df: pd.DataFrame) -> tuple[pd.Timestamp | None, tuple[str, ...]]:
    """(latest log time, episode ids) of what tonight's candidates were trained and selected on: the train
    split (BC, CQL, the distilled classifiers) and the eval split's select part (CQL's alpha, the floor)."""
    seen = pd.concat([df[df["split"] == "train"], oe.eval_part(df, "select")])
    ts = pd.to_datetime(seen["timestamp"], utc=True, errors="coerce", format="ISO8601")
    return (None if ts.isna().all() else ts.max()), tuple(sorted(seen["episode_id"].astype(str).unique()))


def _keep_addressed(sage: SageResource, served: dict, evidence: dict) -> tuple[dict, dict, list[str]]:
    """Each served candidate as the checkpoint SAGE would load, at checkpoints/candidates/<key>/ (the ledger key:
    its policy.joblib's sha256 with the floor SAGE applies, ``router.candidate_key``), written once: a key already
    kept is never rewritten. Returns (keys, paths) by served name, and a note per key kept at another floor
    (only a key written before the floor was part of it can be)."""
    keys, paths, notes = {}, {}, []
    for name, sel in served.items():
        key = oe.served_key(sel.policy)
        folder = sage.path(*CANDIDATES_DIR, key)
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


def _kept_at(sage: SageResource, key: str, path: str | None) -> Path:
    """Where candidate ``key`` is kept: checkpoints/candidates/<key>/ under this root, else the path its ledger
    payload recorded (a root moved or copied keeps working: the folder is checked against the key)."""
    here = sage.path(*CANDIDATES_DIR, key)
    return here if (here / sage_router.JOBLIB_NAME).is_file() or not path else Path(path)


def _candidate_loader(sage: SageResource):
    """LedgerGateInputs.load: a candidate of an earlier night, read back from its content address
    (:func:`_kept_at`) and checked against its key."""
    table, binary = sage.table, _space(sage, "sage_binary")

    def load(key: str, payload: dict):
        folder = _kept_at(sage, key, payload.get("path"))
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


def _stage_deployed(gate_dir: Path, sage: SageResource, deploy: dict, facts: dict) -> None:
    """The ledger's deployed checkpoint staged as gate/sage_binary (its policy.joblib copied byte for byte, so
    its sha256 stays the ledger key; the manifest names tonight's dataset and where SAGE will find it)."""
    src = _kept_at(sage, deploy["key"], deploy["path"])
    if not ledger_router.folder_matches(src, deploy["key"]):
        raise dg.Failure(f"offline_eval: {src / sage_router.JOBLIB_NAME} is not the checkpoint the ledger deploys "
                         f"({deploy['key'][:12]}): restore it from the bundle that deployed it")
    manifest = sage_router.read_manifest(src)
    served_at = Path(os.path.abspath(sage.path("checkpoints", oe.GATE_SPACES["sage_binary"])))
    env = {**manifest.get("sage_env", {}), "SAGE_RL_CHECKPOINT": str(served_at / sage_router.JOBLIB_NAME)}
    with artifacts.atomic_dir(gate_dir / "sage_binary") as tmp:
        shutil.copyfile(src / sage_router.JOBLIB_NAME, tmp / sage_router.JOBLIB_NAME)
        artifacts.write_json(tmp / sage_router.MANIFEST_NAME, {**manifest, **facts, "sage_env": env})


LEFT_OUT = {"before_proposal": "before its proposal", "selected_on": "selected on", "already_judged": "already judged",
            "inexact": "inexact propensity", "below_bound": "explored below min_propensity"}


def _tonight(feed: dict | None, proposed: str | None, night: str) -> str:
    """What a candidate's evidence got tonight, and what was left out (decisions.router.Feed). A candidate
    proposed again tonight (the same checkpoint) has its row rewritten by the proposal, without the feed."""
    if feed is None:
        return "proposed tonight" if proposed == night else "proposed again tonight (the same checkpoint)"
    out = [f"+{feed['fed']} episodes"] + [f"{feed[k]} {v}" for k, v in LEFT_OUT.items() if feed.get(k)]
    return "; ".join(out + (["unsupported"] if feed.get("unsupported") else []))


def _ledger_rows(rows: dict, night: str) -> str:
    """The router lever's rows as the UI shows them: state, estimate and interval, evidence of needed, why."""
    def num(x, fmt="+.4f"):
        return "-" if x is None else format(x, fmt)
    out = [{"candidate": r.get("candidate", cid), "policy": r.get("name") or "", "state": r["state"]
            + (" (deployed)" if r.get("deployed") else ""), "against": r.get("against"),
            "estimate": num(r.get("estimate")), "interval": f"[{num(r['ci'][0])}, {num(r['ci'][1])}]",
            "evidence": f"{r['evidence']:.2f} of {r['needed']:.0f}", "episodes": r.get("episodes", 0),
            "tonight": _tonight(r.get("tonight"), r.get("proposed"), night), "why": r.get("why", "")}
           for cid, r in rows.items()]
    return markdown.table(out) if out else "_no router candidate yet_"


def _ledger_gate(sage: SageResource, config: OfflineEvalConfig, rep, served: dict, df_seen: pd.DataFrame,
                 df: pd.DataFrame, binary: ActionSpace, evidence: dict, decided_at: str, log):
    """SAGE's binary space through the ledger's router lever (oe.ledger_gate): tonight's candidates kept at
    their content addresses, the ledger loaded, judged, tonight's candidates proposed, the lever saved."""
    keys, paths, notes = _keep_addressed(sage, served, evidence)
    until, seen = _trained_until(df_seen)
    if until is None:
        log("no parsable log time in the train and select episodes: tonight's candidates are judged on episodes "
            f"logged after {decided_at}")
    path = _ledger_path(sage)
    try:
        led = Ledger.load(path)
    except LedgerError as exc:
        raise dg.Failure(f"offline_eval: {exc}") from exc
    inputs = oe.LedgerGateInputs(led, config.night or decided_at[:10], until if until is not None else decided_at,
                                 keys, paths, _candidate_loader(sage), seen,
                                 to_core(config.router_gate, ledger_router.RouterGateConfig))
    gate = oe.ledger_gate(rep.gate, {n: s.policy for n, s in served.items()}, df, binary, sage.table, inputs)
    _save_router_lever(led, path)
    log(f"ledger {path}: {gate.reason}")
    per_night = f"tonight's per-night verdict (valid for one night only): {rep.gate.reason}"
    return replace(rep, gate=gate), [*notes, per_night]


@dg.asset(group_name=GROUP, deps=[bc_policy, cql_policy], kinds={"python", "json"},
          description="Off-policy evaluation on the eval split's report half (the half no choice was made on): "
                      "IPS, SNIPS, DM, DR, SNDR, Switch-DR, PDIS, step-wise DR (plain, weighted, and with "
                      "clipped trajectory weights) and FQE with 95% bootstrap "
                      "intervals over sessions (none below min_sessions: the report says how many it has and "
                      "needs), ESS and support, per role the share of decisions whose context also saw another "
                      "model (deterministic logging named); ground truth and regret closure when the data is "
                      "simulated. "
                      "Per action space: multi_model judges the static table, BC and CQL; sage_binary judges "
                      "what SAGE's router would run (each policy distilled into per-role classifiers behind "
                      "SAGE's confidence floor, chosen by OPE, with the YAML fallback), the networks shown "
                      "beside. multi_model's promotion gate (one night's test): a policy passes (staged in "
                      "checkpoints/gate/ with decision.json; promoted_policy publishes it) only if the lower bound "
                      "of its gain over the table (clipped step-wise DR, paired on the same report sessions) "
                      "exceeds gate.min_gain (0) of the table's estimate, and it changes no decision where the logs "
                      "hold no other model (said per role). sage_binary (gate_mode 'ledger', the default): the "
                      "decision ledger's router lever (datasets/decisions/ledger.json) judges each earlier candidate "
                      "against the policy SAGE runs now on the exploring episodes logged since it was proposed, "
                      "accepts, keeps on probation or reverts, and proposes tonight's served candidates (kept at "
                      "checkpoints/candidates/<sha256>/); the staged decision is what the ledger deploys (a "
                      "checkpoint, or SAGE's YAML table); the metadata shows the lever's rows. "
                      f"Blocking check {GATE_CHECK}: the staged decision is for this dataset and its "
                      "policies load.",
          check_specs=[dg.AssetCheckSpec(GATE_CHECK, asset="offline_eval", blocking=True,
                                         description="the staged gate decision is for the current dataset and "
                                         "every promoted policy in it loads, and the checkpoint the ledger deploys "
                                         "is staged with its ledger key (promoted_policy runs only then)")])
def offline_eval(context: dg.AssetExecutionContext, config: OfflineEvalConfig,
                 sage: SageResource) -> dg.MaterializeResult:
    path = sage.path("routing", rd.PARQUET_NAME)
    # who decided (the support sentences), and when (the ledger judges episodes logged after a proposal)
    df = rd.read_routing_dataset(path, (*POLICY_COLUMNS, "policy_source", "timestamp"))
    df_seen = df  # what tonight's candidates were trained and selected on: every row, before the objective
    multi, table = _space(sage), sage.table
    spec = FeatureSpec(roles=multi.roles)
    bc_model = load_policy(sage.path("checkpoints", "bc"), spec, multi.actions)
    df_eval, n_estimated = oe.fill_missing_propensities(oe.eval_part(df, "report"), bc_model)
    manifest = sage.path("sessions", "synthetic", "simulator.json")
    sim, truth = oe.ground_truth_simulator(manifest, sage.catalogue, table, rd.read_reward_spec(path) or RewardSpec(),
                                           df_eval, multi.actions)
    outcomes = sage.path("routing", to.TASK_OUTCOMES_NAME)
    df, judged = oe.objective_rows(df, pd.read_parquet(outcomes) if outcomes.is_file() else None, config.objective,
                                   simulated=sim is not None)
    if judged["judged_on"] != "reward_v1":  # the report half again, on the rows the objective scores
        df_eval, n_estimated = oe.fill_missing_propensities(oe.eval_part(df, "report"), bc_model)
    context.log.info(f"offline_eval judges {judged['judged_on']}: {judged['why']}")
    no_interval = oe.one_outcome_reason(df_eval)  # all report tasks ended alike: no interval can show the other
    ope_cfg, gate = to_core(config, ope.OPEConfig), to_core(config.gate, oe.PromotionGateConfig)
    behaviour = _behaviour(config.support, bc_model)
    evidence = {"dataset_sha256": artifacts.file_sha256(path)}
    reports, meta = {}, {"gate_mode": config.gate_mode}
    # the multi-model space: the static table, BC and CQL as trained
    ckpts = {"bc": sage.path("checkpoints", "bc"), "cql": sage.path("checkpoints", "cql")}
    policies = {"static_table": StaticTablePolicy(table, multi), "bc": bc_model,
                "cql": load_policy(ckpts["cql"], spec, multi.actions)}
    rep = reports["multi_model"] = oe.run_offline_eval(df_eval, policies, multi, ope_cfg, sim=sim,
                                                       progress=context.log.info, behaviour=behaviour, gate=gate,
                                                       evidence=df, no_interval=no_interval)
    decided_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with sage.writing("offline_eval", list(OFFLINE_EVAL_FILES), context.log.info) as stage:
        gate_dir = stage.path("checkpoints", "gate")
        gate_dir.mkdir(parents=True, exist_ok=True)
        oe.promote(rep.gate, ckpts, gate_dir / "multi_model", evidence | {"summary": rep.summary()})
        meta |= {"promoted": rep.gate.promoted or "none", "promotion": rep.gate.reason}
        # SAGE's binary space, when trained on this dataset: judge what SAGE's router would run
        binary = multi.binary()
        trained = {k: _checkpoint_dir(sage, k, "sage_binary") for k in ("bc", "cql")}
        fresh = all((p / "policy.json").is_file() and read_meta(p).training_data_sha256 == evidence["dataset_sha256"]
                    for p in trained.values())
        if not fresh:
            context.log.info("sage_binary: no BC and CQL checkpoints trained on this dataset (add 'sage_binary' to "
                             "bc_policy's and cql_policy's action_spaces); only the multi-model space is evaluated")
        else:
            df_binary = oe.fill_missing_propensities(df, bc_model)[0]
            rep, served = oe.run_sage_binary_eval(
                df_binary, df_eval, binary, table,
                {k: load_policy(p, spec, binary.actions) for k, p in trained.items()}, ope_cfg, sim,
                context.log.info, behaviour, config.floor_selection, gate, no_interval, mode="per_night")
            if config.gate_mode == "ledger":
                rep, notes = _ledger_gate(sage, config, rep, served, df_seen, df_binary, binary, evidence, decided_at,
                                          context.log.info)
                deploy = rep.gate.ledger["deploy"]
                if deploy["key"] != ledger_router.TABLE:  # staged for promoted_policy, byte for byte
                    _stage_deployed(gate_dir, sage, deploy, evidence | {
                        "reason": rep.gate.reason, "ledger_candidate": deploy["candidate"],
                        "summary": rep.summary()})
                artifacts.write_json(gate_dir / LEDGER_DEPLOY, {
                    "mode": "ledger", "night": rep.gate.ledger["night"], "decided_at": decided_at,
                    "deploy": deploy, "ledger": str(_ledger_path(sage)), "reason": rep.gate.reason,
                    "accepted": rep.gate.ledger["accepted"], "reverted": rep.gate.ledger["reverted"]})
                meta |= {"ledger_path": dg.MetadataValue.path(str(_ledger_path(sage))),
                         "ledger_deploy": ("SAGE's YAML table" if deploy["key"] == ledger_router.TABLE
                                           else f"{deploy['candidate']} ({deploy['name']}, {deploy['key'][:12]})"),
                         "ledger_router": dg.MetadataValue.md(_ledger_rows(rep.gate.candidates,
                                                                          rep.gate.ledger["night"])),
                         "promotion_sage_per_night": notes.pop(),
                         "ledger_tonight": dg.MetadataValue.json({k: rep.gate.ledger[k] for k in (
                             "night", "accepted", "reverted", "dropped", "episodes", "episodes_without_timestamp",
                             "weight_bound")} | {"floor_notes": notes})}
            else:  # staged with the path SAGE will be pointed at once promoted_policy publishes it
                oe.promote_served(rep.gate, served, gate_dir / "sage_binary", evidence | {"summary": rep.summary()},
                                  served_at=sage.path("checkpoints", oe.GATE_SPACES["sage_binary"]))
            reports["sage_binary"] = rep
            oe.keep_candidates(served, gate_dir / oe.CANDIDATES_DIR, evidence,  # what the gate judged, for audit
                               served_at=sage.path("checkpoints", "gate", oe.CANDIDATES_DIR))
            meta |= {"promoted_sage": rep.gate.promoted or "none", "promotion_sage": rep.gate.reason,
                     "served_floor_selection": dg.MetadataValue.md("\n\n".join(
                         f"**{n}** (from {s.source}; floor chosen by {s.how}; agreement with the network on eval "
                         f"states: {s.agreement_eval})\n\n{markdown.table(s.table)}" for n, s in served.items()))}
        oe.write_decision(gate_dir, decided_at, evidence["dataset_sha256"],
                          {k: r.gate for k, r in reports.items()})
        out = stage.public(artifacts.write_json(
            stage.path("reports", "offline_eval.json"),
            {k: r.to_dict() for k, r in reports.items()} | {"propensities_estimated_by_bc": n_estimated,
                                                            "objective": judged}))
        png = oe.plot_offline_eval(reports["multi_model"])
        artifacts.write_bytes(stage.path("reports", "offline_eval.png"), png)
    for name, r in reports.items():
        context.log.info(f"{name}: {r.gate.reason}")
        sfx = "" if name == "multi_model" else f"_{name}"
        meta |= {f"summary{sfx}": dg.MetadataValue.md(markdown.table(r.summary())),
                 f"estimates{sfx}": dg.MetadataValue.md(markdown.table(r.rows())),
                 f"sample_size_warning{sfx}": r.warning or "none",
                 f"sessions{sfx}": r.n_sessions, f"intervals{sfx}": r.interval_reason or "given",
                 f"support_by_role{sfx}": dg.MetadataValue.md(markdown.table(r.support_table()) or "no decisions")}
    gate_dir = sage.path("checkpoints", "gate")
    problems = (oe.check_decision(gate_dir, evidence["dataset_sha256"], _staged_loaders(sage))
                + _ledger_stage_problems(gate_dir, _staged_loaders(sage)))
    return dg.MaterializeResult(metadata=meta | {
        "action_spaces": list(reports),
        "plot": dg.MetadataValue.md(markdown.image(png, "OPE estimates with 95% intervals; ground truth dashed")),
        "ground_truth": "simulator" if sim is not None else f"none ({truth})",
        "propensities_estimated_by_bc": n_estimated,
        "objective": f"{judged['judged_on']}: {judged['why']}",
        "objective_episodes": dg.MetadataValue.json(judged),
        "decided_at": decided_at,
        "path": dg.MetadataValue.path(str(out)),
    }, check_results=[dg.AssetCheckResult(
        check_name=GATE_CHECK, passed=not problems, severity=dg.AssetCheckSeverity.ERROR,
        description="; ".join(problems) or "the staged decision is for this dataset and every promoted policy loads",
        metadata={"decided_at": decided_at, "problems": len(problems)})])


def _staged_loaders(sage: SageResource) -> dict:
    """How each space's staged (or published) policy is loaded, to check it."""
    multi = _space(sage)
    return {"multi_model": lambda p: load_policy(p, FeatureSpec(roles=multi.roles), multi.actions),
            "sage_binary": lambda p: sage_router.load_sage_checkpoint(p, sage.table, _space(sage, "sage_binary"))}


def _read_ledger_deploy(gate_dir: Path) -> dict | None:
    """The ledger's deploy staged by offline_eval (None: the last offline_eval ran in 'per_night' mode, or
    judged no sage_binary space)."""
    p = gate_dir / LEDGER_DEPLOY
    return json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None


def _ledger_stage_problems(gate_dir: Path, loaders: dict) -> list[str]:
    """What is wrong with the ledger's staged deploy: a checkpoint it deploys must be staged, load, and be
    the very file the ledger keys (its sha256)."""
    try:
        d = _read_ledger_deploy(gate_dir)
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


def _publish_ledger_deploy(sage: SageResource, gate_dir: Path, dest: Path, loaders: dict) -> str:
    """checkpoints/promoted_sage/ as the ledger deploys it: its checkpoint (copied from the staged
    gate/sage_binary, the ledger key's bytes) or, for SAGE's YAML table, a folder holding only
    ledger_deploy.json (no policy.joblib: SAGE, and sage_router_checkpoint, run the YAML). Refused when the
    ledger deploys something else than offline_eval staged (it changed since: re-materialize offline_eval)."""
    d = _read_ledger_deploy(gate_dir)
    deploy = d["deploy"]
    try:
        now = ledger_router.deployed_key(Ledger.load(_ledger_path(sage)))
    except LedgerError as exc:
        raise dg.Failure(f"promoted_policy: {exc}") from exc
    if now != deploy["key"]:
        raise dg.Failure(f"promoted_policy: offline_eval staged {deploy['candidate'] or 'the YAML table'} "
                         f"({deploy['key'][:12]}) on night {d['night']}, the ledger {_ledger_path(sage)} now deploys "
                         f"{now[:12]}: re-materialize offline_eval, which stages what the ledger deploys")
    note = d | {"published_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with artifacts.atomic_dir(dest) as tmp:
        if deploy["key"] != ledger_router.TABLE:
            problems = _ledger_stage_problems(gate_dir, loaders)
            if problems:
                raise dg.Failure("promoted_policy: " + "; ".join(problems))
            shutil.copytree(gate_dir / "sage_binary", tmp, dirs_exist_ok=True, symlinks=False)
        artifacts.write_json(tmp / DEPLOY_NOTE, note)
    if deploy["key"] == ledger_router.TABLE:
        return f"none (the YAML table: the ledger deploys it, night {d['night']})"
    return f"{deploy['candidate']} ({deploy['name']}, {deploy['key'][:12]}; the ledger deploys it, night {d['night']})"


@dg.asset(group_name=GROUP, deps=[offline_eval], kinds={"python", "json"},
          description="What offline_eval decided, published: checkpoints/promoted/ (the multi-model policy that "
                      "passed its gate, with promotion.json) and checkpoints/promoted_sage/ (the served composite "
                      "SAGE's router loads, with its manifest). sage_binary in the ledger mode (the default) follows "
                      "the ledger's deploy: the checkpoint on top of the deployed stack, or, when the ledger deploys "
                      "SAGE's YAML table (nothing accepted yet, or a revert), a folder without policy.joblib "
                      "(ledger_deploy.json says why). In the per-night mode a space whose gate promoted nothing "
                      "tonight keeps its last promotion. Runs only when offline_eval's blocking check "
                      f"{GATE_CHECK} passes; the metadata says which policy is published in each space, since when "
                      "and why.")
def promoted_policy(context: dg.AssetExecutionContext, sage: SageResource) -> dg.MaterializeResult:
    gate_dir = sage.path("checkpoints", "gate")
    decision = oe.read_decision(gate_dir)
    loaders, meta = _staged_loaders(sage), {"decided_at": decision["decided_at"]}
    # run on its own, after the dataset changed, it must not publish a decision about other data
    problems = oe.check_decision(gate_dir, artifacts.file_sha256(sage.path("routing", rd.PARQUET_NAME)), loaders)
    if problems:
        raise dg.Failure(f"promoted_policy: the gate decision staged in {gate_dir} cannot be published: "
                         + "; ".join(problems))
    ledger = _read_ledger_deploy(gate_dir)
    with sage.writing("promoted_policy", list(PROMOTED_FILES), context.log.info) as stage:
        for space, folder in oe.GATE_SPACES.items():
            entry, public = decision["spaces"].get(space), sage.path("checkpoints", folder)
            if entry is None:
                meta[space] = "not evaluated by the last offline_eval"
            elif space == "sage_binary" and ledger is not None:
                meta[space] = _publish_ledger_deploy(sage, gate_dir, stage.path("checkpoints", folder), loaders)
                context.log.info(f"{space}: {meta[space]}")
            elif entry["promoted"]:
                loaders[space](oe.publish(gate_dir, space, stage.path("checkpoints", folder)))
                meta[space] = f"{entry['promoted']} (promoted {decision['decided_at']})"
                context.log.info(f"{space}: published {entry['promoted']} to {public}")
            else:
                kept = _promoted_name(public)
                meta[space] = f"{kept} (kept: tonight's gate promoted nothing)" if kept else "none (the YAML table)"
            if entry is not None:
                meta[f"reason_{space}"] = entry["reason"]
    return dg.MaterializeResult(metadata=meta | {
        f"path_{space}": dg.MetadataValue.path(str(sage.path("checkpoints", folder)))
        for space, folder in oe.GATE_SPACES.items() if sage.path("checkpoints", folder).exists()})


def _promoted_name(folder) -> str | None:
    for name in ("promotion.json", "manifest.json"):
        if (folder / name).is_file():
            return json.loads((folder / name).read_text(encoding="utf-8")).get("policy")
    return None


class SageRouterCheckpointConfig(dg.Config):
    """sage_router_checkpoint's run config: the table SAGE runs, and whether to explore."""

    sage_models_yaml: str | None = Field(
        None,
        description="the models.yaml SAGE runs (default: SAGE_MODELS_YAML, else the sage resource's routing "
                    "table). The checkpoint is written only if it routes as the table the policy was trained on")
    explore: bool = Field(False, description="write the exploring checkpoint (sage_explore): SAGE's router then "
                          "takes the other model with probability exploration_rate in every context, around the "
                          "deployed policy (the top of the ledger's deployed stack, or the last promotion in the "
                          "per-night mode), or around SAGE's YAML when none is. The ledger judges a router candidate "
                          "only on episodes logged under an exploring checkpoint")
    exploration_rate: float | None = Field(None, ge=0.0, le=sage_explore.MAX_RATE,
                                           description="P(the model the target does not choose) per decision "
                                           "(unset: sage_explore.ExploreConfig's rate); it costs rate x the target's "
                                           "mean advantage over the other model in value")


RECORD = ("Once SAGE runs it, record the deployment (`python -m sage_pipeline.sage.explore deploy {what}`, which "
          "prints the exports{extra}) so each logged decision's probability can be reconstructed.")


def _yaml_alone(context, sage: SageResource, dest: Path, note: dict | None) -> dg.MaterializeResult:
    """SAGE runs its YAML alone. When the ledger deploys the table (a revert, or nothing accepted) and
    checkpoints/sage holds a checkpoint, that folder is replaced by one without policy.joblib (SAGE's loader
    then finds no file and routes by its YAML); nothing is written where no checkpoint was."""
    by_ledger = note is not None and note["deploy"]["key"] == ledger_router.TABLE
    record = RECORD.format(what="--yaml", extra="")
    if by_ledger and (dest / sage_router.JOBLIB_NAME).is_file():
        with artifacts.exclusive(sage.root(), "sage_router_checkpoint", context.log.info):
            with artifacts.atomic_dir(dest) as tmp:
                artifacts.write_json(tmp / DEPLOY_NOTE, note | {"sage_runs": "its YAML table (no policy.joblib "
                                                                "here: SAGE_RL_POLICY may be unset)"})
        context.log.warning(f"the ledger deploys SAGE's YAML table ({note['reason']}): {dest} no longer holds a "
                            "checkpoint")
        return dg.MaterializeResult(metadata={"written": False, "removed": True, "deploy": "SAGE's YAML table",
                                              "reason": f"the ledger deploys SAGE's YAML table: {note['reason']}",
                                              "record": record})
    context.log.warning("no sage_binary policy is deployed: SAGE keeps its YAML table")
    reason = (f"the ledger deploys SAGE's YAML table: {note['reason']}" if by_ledger
              else "no sage_binary policy promoted (see offline_eval's promotion_sage)")
    return dg.MaterializeResult(metadata={"written": False, "deploy": "SAGE's YAML table", "reason": reason})


def _deployed_label(note: dict | None, manifest: dict, promoted: bool) -> str:
    if not promoted:
        return "SAGE's YAML table"
    if note is not None:
        return f"{note['deploy']['candidate']} ({note['deploy']['name']}, {note['deploy']['key'][:12]}: the ledger's)"
    return f"{manifest.get('policy', 'the promoted policy')} (the last per-night promotion)"


@dg.asset(group_name=GROUP, deps=[promoted_policy], kinds={"python", "sklearn"},
          description="The deployed sage_binary policy (checkpoints/promoted_sage/: the top of the ledger's "
                      "deployed stack, or the last per-night promotion) as the file SAGE's router loads unchanged "
                      "(checkpoints/sage/policy.joblib: {'models': {role: classifier}, 'feature_keys': [...]}) "
                      "plus manifest.json (kind, versions, source, agreement per role, min_confidence, the ledger "
                      "candidate, and the routing table it is bound to: its sha256, its routing section's sha256, its "
                      "roles); the metadata shows the environment variables to set in SAGE and the command that "
                      "records the deployment. Written only for the table SAGE runs (sage_models_yaml); every role "
                      "with a choice has a classifier, so no floor moves a role off its YAML. With explore: the "
                      "exploring checkpoint (SAGE randomises with a known probability, around the deployed policy or "
                      "the YAML). The ledger deploying SAGE's YAML and no exploring: checkpoints/sage holds no "
                      "policy.joblib (SAGE runs its table alone).")
def sage_router_checkpoint(context: dg.AssetExecutionContext, config: SageRouterCheckpointConfig,
                           sage: SageResource) -> dg.MaterializeResult:
    src, dest = sage.path("checkpoints", "promoted_sage"), sage.path("checkpoints", "sage")
    promoted = (src / sage_router.JOBLIB_NAME).is_file()
    note = json.loads((src / DEPLOY_NOTE).read_text(encoding="utf-8")) if (src / DEPLOY_NOTE).is_file() else None
    # exploring around SAGE's YAML needs no logs yet (a first deployment): the table's own binary space
    binary = (_space(sage, "sage_binary") if promoted or sage.path("routing", ACTION_SPACE_FILE).is_file()
              else ActionSpace.build(sage.table).binary())
    if not promoted and not config.explore:
        return _yaml_alone(context, sage, dest, note)
    try:  # written only for the table SAGE runs
        sage_table = sage_router.check_table(sage.table, config.sage_models_yaml or os.environ.get("SAGE_MODELS_YAML")
                                             or sage.table_path())
    except ValueError as exc:
        raise dg.Failure(f"sage_router_checkpoint: {exc}") from exc
    manifest = sage_router.read_manifest(src) if promoted else {"source": f"SAGE's YAML ({sage.table.source})"}
    served = sage_router.load_sage_checkpoint(src, sage.table, binary).with_every_role() if promoted else sage.table
    if config.explore:
        explore = (sage_explore.ExploreConfig() if config.exploration_rate is None
                   else sage_explore.ExploreConfig(rate=config.exploration_rate))
        served = sage_explore.build_exploring(served, binary, explore, table=sage.table)
    ledger = {} if note is None else {"ledger_candidate": note["deploy"]["candidate"],
                                      "ledger_key": note["deploy"]["key"], "ledger_night": note["night"]}
    with artifacts.exclusive(sage.root(), "sage_router_checkpoint", context.log.info):  # both files: one run's
        paths = sage_router.write_sage_checkpoint(dest, served, {k: v for k, v in manifest.items()
                                                                 if k in sage_router.CARRIED_MANIFEST_KEYS} | ledger,
                                                  sage_table=sage_table)
        checked = (sage_explore.check_loads(paths[0], served, binary) if config.explore
                   else sage_router.check_loads_as_sage(paths[0], served, binary))
        written = sage_router.read_manifest(dest)
        sha256 = artifacts.file_sha256(paths[0])
    context.log.info(f"SAGE router checkpoint {paths[0]}: {checked} decisions checked as SAGE makes them")
    return dg.MaterializeResult(metadata={
        "written": True, "kind": written["kind"], "path": dg.MetadataValue.path(str(paths[0])),
        "manifest": dg.MetadataValue.path(str(paths[1])), "sha256": sha256,
        "min_confidence": served.min_confidence, "roles": sorted(served.models),
        "yaml_roles": list(written["yaml_roles"]), "source": manifest.get("source", "unknown"),
        "deploy": (("explored around " if config.explore else "") + _deployed_label(note, manifest, promoted)),
        "sage_table": dg.MetadataValue.json({k: written["sage_table"][k] for k in ("path", "sha256", "routing_sha256",
                                                                                  "roles")}),
        "exploration": dg.MetadataValue.json(written.get("exploration", {})),
        "agreement_on_eval_states": dg.MetadataValue.json(manifest.get("agreement_eval", {})),
        "agreement_on_train_states": dg.MetadataValue.json(manifest.get("agreement", {})),
        "sage_env": dg.MetadataValue.md("Set in SAGE's environment:\n\n```bash\n" + "\n".join(
            f"export {k}={v}" for k, v in written["sage_env"].items()) + "\n```\n\n" + RECORD.format(
            what="<this folder>", extra=" for its kept copy")),
        "decisions_checked_as_sage": checked,
        "roles_sage_never_consults": dg.MetadataValue.md(
            "none" if not written["roles_sage_never_consults"] else
            f"{', '.join(written['roles_sage_never_consults'])}: SAGE never asks the checkpoint for these roles "
            "(the coder's model comes from its UCB bandit, sage/agents/coder.py), so their classifiers change "
            "nothing SAGE does"),
    })
