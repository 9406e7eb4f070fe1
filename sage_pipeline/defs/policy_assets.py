"""The offline chain's learners and their proof:
routing_dataset -> bc_policy, cql_policy -> offline_eval (with the promotion gate) -> promoted_policy
-> sage_router_checkpoint.

offline_eval and sage_router_checkpoint are thin: their work is the core's
``sage_pipeline.rl.offline_eval_night.run_offline_eval_night`` and
``sage_pipeline.rl.sage_router_checkpoint.write_sage_router_checkpoint``; this module maps the run config
and the ``sage`` resource in, and the result out as metadata and the blocking check."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import json
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated, Literal

import dagster as dg
from pydantic import Field, model_validator

from sage_pipeline import artifacts, markdown
from sage_pipeline.decisions import router as ledger_router
from sage_pipeline.decisions.ledger import Ledger, LedgerError
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.routing_assets import GROUP, reward_report, routing_dataset
from sage_pipeline.defs.sections import to_core
from sage_pipeline.rl import (
    bc,
    cql,
    offline_eval as oe,
    offline_eval_night as oen,
    ope,
    sage_router_checkpoint as router_ckpt,
)
from sage_pipeline.rl.checkpoint import load_policy
from sage_pipeline.rl.data import from_dataset
from sage_pipeline.routing import routing_dataset as rd
from sage_pipeline.routing.action_space import SPACES, ActionSpace
from sage_pipeline.routing.features import FeatureSpec
from sage_pipeline.sage import explore as sage_explore


def _dataset(sage: SageResource):
    path = sage.path("routing", rd.PARQUET_NAME)
    return path, rd.read_routing_dataset(path, oen.POLICY_COLUMNS)


def _space(sage: SageResource, name: str = "multi_model") -> ActionSpace:
    """The action space routing_dataset built (roles from the table, models from table and logs)."""
    return oen.load_space(sage.root(), name)


def _check_spaces(spaces: list[str]) -> list[str]:
    bad = [s for s in spaces if s not in SPACES]
    if bad or "multi_model" not in spaces:
        raise ValueError(f"action_spaces {spaces}: list 'multi_model' (BC's behaviour model, OPE's propensities) "
                         f"and optionally 'sage_binary'; unknown: {bad}")
    return list(dict.fromkeys(spaces))


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
    with sage.writing("bc_policy", [oen.checkpoint_rel("bc", s) for s in SPACES], context.log.info) as stage:
        for name in _check_spaces(config.action_spaces):
            space = _space(sage, name)
            data = from_dataset(df, space).split_rows("train").restrict(space)
            res = bc.train_bc(data, FeatureSpec(roles=space.roles), to_core(config, bc.BCConfig), log=context.log.info)
            ck = stage.public(res.save(stage.path(oen.checkpoint_rel("bc", name)),
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
    with sage.writing("cql_policy", [oen.checkpoint_rel("cql", s) for s in SPACES], context.log.info) as stage:
        for name in _check_spaces(config.action_spaces):
            sel = oe.train_select_cql(df, multi.of(name), cfg, config.alphas,
                                      ope.OPEConfig(n_boot=config.n_boot, seed=config.seed), config.selection,
                                      progress=context.log.info,
                                      behaviour=oen.behaviour_model(config.support, bc_model))
            chosen, how, table = sel.result, sel.how, sel.table
            ck = stage.public(chosen.save(stage.path(oen.checkpoint_rel("cql", name)), artifacts.file_sha256(path),
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
    settings = oen.OfflineEvalSettings(
        ope=to_core(config, ope.OPEConfig), gate=to_core(config.gate, oe.PromotionGateConfig),
        router_gate=to_core(config.router_gate, ledger_router.RouterGateConfig), support=config.support,
        floor_selection=config.floor_selection, gate_mode=config.gate_mode, objective=config.objective,
        night=config.night)
    try:
        night = oen.run_offline_eval_night(sage.root(), sage.table, sage.catalogue_path(), settings, context.log.info)
    except oen.OfflineEvalError as exc:
        raise dg.Failure(f"offline_eval: {exc}") from exc
    problems = night.problems
    return dg.MaterializeResult(metadata=_offline_eval_metadata(night, config.gate_mode), check_results=[
        dg.AssetCheckResult(
            check_name=GATE_CHECK, passed=not problems, severity=dg.AssetCheckSeverity.ERROR,
            description="; ".join(problems)
            or "the staged decision is for this dataset and every promoted policy loads",
            metadata={"decided_at": night.decided_at, "problems": len(problems)})])


def _offline_eval_metadata(night: oen.OfflineEvalNight, gate_mode: str) -> dict:
    """offline_eval's metadata, from the night's result."""
    multi = night.reports["multi_model"]
    meta = {"gate_mode": gate_mode, "promoted": multi.gate.promoted or "none", "promotion": multi.gate.reason}
    rep = night.reports.get("sage_binary")
    if rep is not None and night.ledger is not None:
        deploy = rep.gate.ledger["deploy"]
        meta |= {"ledger_path": dg.MetadataValue.path(str(night.ledger.path)),
                 "ledger_deploy": ("SAGE's YAML table" if deploy["key"] == ledger_router.TABLE
                                   else f"{deploy['candidate']} ({deploy['name']}, {deploy['key'][:12]})"),
                 "ledger_router": dg.MetadataValue.md(_ledger_rows(rep.gate.candidates, rep.gate.ledger["night"])),
                 "promotion_sage_per_night": night.ledger.per_night,
                 "ledger_tonight": dg.MetadataValue.json({k: rep.gate.ledger[k] for k in (
                     "night", "accepted", "reverted", "dropped", "episodes", "episodes_without_timestamp",
                     "weight_bound")} | {"floor_notes": list(night.ledger.floor_notes)})}
    if rep is not None:
        meta |= {"promoted_sage": rep.gate.promoted or "none", "promotion_sage": rep.gate.reason,
                 "served_floor_selection": dg.MetadataValue.md("\n\n".join(
                     f"**{n}** (from {s.source}; floor chosen by {s.how}; agreement with the network on eval "
                     f"states: {s.agreement_eval})\n\n{markdown.table(s.table)}" for n, s in night.served.items()))}
    for name, r in night.reports.items():
        sfx = "" if name == "multi_model" else f"_{name}"
        meta |= {f"summary{sfx}": dg.MetadataValue.md(markdown.table(r.summary())),
                 f"estimates{sfx}": dg.MetadataValue.md(markdown.table(r.rows())),
                 f"sample_size_warning{sfx}": r.warning or "none",
                 f"sessions{sfx}": r.n_sessions, f"intervals{sfx}": r.interval_reason or "given",
                 f"support_by_role{sfx}": dg.MetadataValue.md(markdown.table(r.support_table()) or "no decisions")}
    judged = night.objective
    return meta | {
        "action_spaces": list(night.reports),
        "plot": dg.MetadataValue.md(markdown.image(night.plot,
                                                   "OPE estimates with 95% intervals; ground truth dashed")),
        "ground_truth": night.ground_truth,
        "propensities_estimated_by_bc": night.propensities_estimated_by_bc,
        "objective": f"{judged['judged_on']}: {judged['why']}",
        "objective_episodes": dg.MetadataValue.json(judged),
        "decided_at": night.decided_at,
        "path": dg.MetadataValue.path(str(night.report_path)),
    }


def _publish_ledger_deploy(sage: SageResource, gate_dir: Path, dest: Path, loaders: dict) -> str:
    """checkpoints/promoted_sage/ as the ledger deploys it: its checkpoint (copied from the staged
    gate/sage_binary, the ledger key's bytes) or, for SAGE's YAML table, a folder holding only
    ledger_deploy.json (no policy.joblib: SAGE, and sage_router_checkpoint, run the YAML). Refused when the
    ledger deploys something else than offline_eval staged (it changed since: re-materialize offline_eval)."""
    d = oen.read_ledger_deploy(gate_dir)
    deploy = d["deploy"]
    try:
        now = ledger_router.deployed_key(Ledger.load(oen.ledger_path(sage.root())))
    except LedgerError as exc:
        raise dg.Failure(f"promoted_policy: {exc}") from exc
    if now != deploy["key"]:
        raise dg.Failure(f"promoted_policy: offline_eval staged {deploy['candidate'] or 'the YAML table'} "
                         f"({deploy['key'][:12]}) on night {d['night']}, the ledger {oen.ledger_path(sage.root())} "
                         f"now deploys {now[:12]}: re-materialize offline_eval, which stages what the ledger deploys")
    note = d | {"published_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    with artifacts.atomic_dir(dest) as tmp:
        if deploy["key"] != ledger_router.TABLE:
            problems = oen.ledger_stage_problems(gate_dir, loaders)
            if problems:
                raise dg.Failure("promoted_policy: " + "; ".join(problems))
            shutil.copytree(gate_dir / "sage_binary", tmp, dirs_exist_ok=True, symlinks=False)
        artifacts.write_json(tmp / oen.DEPLOY_NOTE, note)
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
    loaders, meta = oen.staged_loaders(sage.root(), sage.table), {"decided_at": decision["decided_at"]}
    # run on its own, after the dataset changed, it must not publish a decision about other data
    problems = oe.check_decision(gate_dir, artifacts.file_sha256(sage.path("routing", rd.PARQUET_NAME)), loaders)
    if problems:
        raise dg.Failure(f"promoted_policy: the gate decision staged in {gate_dir} cannot be published: "
                         + "; ".join(problems))
    ledger = oen.read_ledger_deploy(gate_dir)
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
    try:
        res = router_ckpt.write_sage_router_checkpoint(
            sage.root(), sage.table, config.sage_models_yaml or os.environ.get("SAGE_MODELS_YAML") or sage.table_path(),
            config.explore, config.exploration_rate, context.log.info)
    except router_ckpt.RouterCheckpointError as exc:
        raise dg.Failure(f"sage_router_checkpoint: {exc}") from exc
    if res.warning:
        context.log.warning(res.warning)
    if not res.written:
        return dg.MaterializeResult(metadata={"written": False, **({"removed": True} if res.removed else {}),
                                              "deploy": res.deploy, "reason": res.reason,
                                              **({"record": res.record} if res.record else {})})
    written = res.manifest
    return dg.MaterializeResult(metadata={
        "written": True, "kind": res.kind, "path": dg.MetadataValue.path(str(res.path)),
        "manifest": dg.MetadataValue.path(str(res.manifest_path)), "sha256": res.sha256,
        "min_confidence": res.min_confidence, "roles": res.roles,
        "yaml_roles": list(written["yaml_roles"]), "source": res.source, "deploy": res.deploy,
        "sage_table": dg.MetadataValue.json({k: written["sage_table"][k] for k in ("path", "sha256", "routing_sha256",
                                                                                  "roles")}),
        "exploration": dg.MetadataValue.json(written.get("exploration", {})),
        "agreement_on_eval_states": dg.MetadataValue.json(res.agreement_eval),
        "agreement_on_train_states": dg.MetadataValue.json(res.agreement),
        "sage_env": dg.MetadataValue.md("Set in SAGE's environment:\n\n```bash\n" + "\n".join(
            f"export {k}={v}" for k, v in written["sage_env"].items()) + "\n```\n\n" + router_ckpt.RECORD.format(
            what="<this folder>", extra=" for its kept copy")),
        "decisions_checked_as_sage": res.decisions_checked,
        "roles_sage_never_consults": dg.MetadataValue.md(
            "none" if not written["roles_sage_never_consults"] else
            f"{', '.join(written['roles_sage_never_consults'])}: SAGE never asks the checkpoint for these roles "
            "(the coder's model comes from its UCB bandit, sage/agents/coder.py), so their classifiers change "
            "nothing SAGE does"),
    })
