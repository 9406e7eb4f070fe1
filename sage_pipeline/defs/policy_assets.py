"""The offline chain's learners and their proof:
routing_dataset -> bc_policy, cql_policy -> offline_eval (with the promotion gate)."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import dagster as dg
from pydantic import Field

from sage_pipeline import artifacts, markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.routing_assets import GROUP, reward_report, routing_dataset
from sage_pipeline.rl import bc, cql, offline_eval as oe, ope
from sage_pipeline.rl.checkpoint import load_policy
from sage_pipeline.rl.data import from_dataset
from sage_pipeline.rl.policy import StaticTablePolicy
from sage_pipeline.routing import routing_dataset as rd
from sage_pipeline.routing.features import FeatureSpec
from sage_pipeline.routing.reward import RewardSpec


def _dataset(sage: SageResource):
    path = sage.path("routing", rd.PARQUET_NAME)
    return path, rd.read_routing_dataset(path)


def _behaviour(support: str, bc_model):
    """The behaviour model OPE's support check uses, or None for the logged-pairs rule."""
    if support not in oe.SUPPORT_RULES:
        raise ValueError(f"support {support!r}: use one of {', '.join(oe.SUPPORT_RULES)}")
    return bc_model if support == "behaviour" else None


class BCPolicyConfig(dg.Config):
    epochs: int = Field(100, description="maximum training epochs (early stopping on held-out train sessions)")
    hidden: list[int] = Field([64, 64], description="hidden layer sizes")
    seed: int = 0


@dg.asset(group_name=GROUP, deps=[routing_dataset, reward_report], kinds={"pytorch"},
          description="Behaviour cloning of the logged routing decisions (torch MLP, masked per role), "
                      "calibrated by temperature scaling; also the propensity model for logs without "
                      "propensities. Checkpoint in checkpoints/bc/.")
def bc_policy(context: dg.AssetExecutionContext, config: BCPolicyConfig, sage: SageResource) -> dg.MaterializeResult:
    path, df = _dataset(sage)
    data = from_dataset(df, sage.catalogue).split_rows("train")
    res = bc.train_bc(data, FeatureSpec(), bc.BCConfig(epochs=config.epochs, hidden=tuple(config.hidden),
                                                       seed=config.seed), log=context.log.info)
    ck = res.save(sage.path("checkpoints", "bc"), training_data_sha256=artifacts.file_sha256(path))
    m = res.metrics
    keys = ("temperature", "epochs", "best_epoch", "holdout_accuracy", "holdout_nll_before", "holdout_nll_after",
            "holdout_ece_before", "holdout_ece_after", "holdout_propensity_mae", "seconds")
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(ck)), "train_rows": len(data),
        "calibration": dg.MetadataValue.md(markdown.table([{"metric": k, "value": m.get(k)} for k in keys if k in m])),
        "roles_with_one_action": dg.MetadataValue.json(m.get("roles_with_one_action", [])),
        "metrics": dg.MetadataValue.json(m),
    })


class CQLPolicyConfig(dg.Config):
    mode: str = Field("multistep", description="'multistep' (episodes, double-DQN target) or 'bandit' (one decision)")
    alphas: list[float] = Field(list(oe.DEFAULT_ALPHAS), description="conservative weights tried in one batched "
                                "run; OPE on the eval split keeps one (see selection)")
    selection: str = Field("fqe", description="how OPE on the eval split's select half ranks the alphas: 'fqe' "
                           "(default): the best fitted-Q evaluation estimate; 'estimate': the best step-wise DR "
                           "estimate; 'lower_bound': the best lower bound of its interval (favours policies near "
                           "the logs). See docs/benchmarks.md for how they compare")
    steps: int = Field(2000, description="gradient steps")
    n_critics: int = 2
    seed: int = 0
    n_boot: int = Field(300, description="bootstrap resamples for the alpha selection")
    support: str = Field("logged_pairs", description="support rule of the OPE that picks alpha: "
                         "'logged_pairs' ((role, model) pairs present in the evaluated logs) or 'behaviour' "
                         "(the behaviour policy's support as bc_policy models it); see docs/benchmarks.md")


@dg.asset(group_name=GROUP, deps=[routing_dataset, reward_report, bc_policy], kinds={"pytorch"},
          description="Discrete conservative Q-learning (CQL) on the train split, bandit or multi-step; "
                      "alpha chosen on the eval split by OPE (fitted-Q evaluation by default; BC's "
                      "propensities where the logs have none), never by simulator ground truth. Checkpoint in checkpoints/cql/.")
def cql_policy(context: dg.AssetExecutionContext, config: CQLPolicyConfig, sage: SageResource) -> dg.MaterializeResult:
    path, df = _dataset(sage)
    bc_model = load_policy(sage.path("checkpoints", "bc"), FeatureSpec(), sage.catalogue.actions)
    df, n_estimated = oe.fill_missing_propensities(df, bc_model)
    cfg = cql.CQLConfig(mode=config.mode, steps=config.steps, n_critics=config.n_critics, seed=config.seed)
    sel = oe.train_select_cql(df, sage.catalogue, cfg, config.alphas,
                              ope.OPEConfig(n_boot=config.n_boot, seed=config.seed), config.selection,
                              progress=context.log.info, behaviour=_behaviour(config.support, bc_model))
    chosen, how, table = sel.result, sel.how, sel.table
    ck = cql.save_cql(sage.path("checkpoints", "cql"), chosen, artifacts.file_sha256(path),
                      metrics={"alpha_selection": table, "selected_by": how})
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(ck)), "mode": config.mode, "alpha": chosen.config.alpha,
        "selected_by": how, "propensities_estimated_by_bc": n_estimated,
        "select_episodes": sel.n_episodes, "sample_size_warning": sel.warning or "none",
        "alpha_selection": dg.MetadataValue.md(
            f"Chosen by {how}. These estimates are optimistic for the winner (it was chosen on "
            "them); offline_eval re-estimates every policy on the eval split's other half.\n\n"
            + markdown.table(table)),
        "training": dg.MetadataValue.json({k: v for k, v in chosen.metrics.items() if not isinstance(v, list)}),
    })


class OfflineEvalConfig(dg.Config):
    n_boot: int = Field(1000, description="bootstrap resamples per estimator")
    seed: int = 0
    support: str = Field("logged_pairs", description="support rule: 'logged_pairs' or 'behaviour' (as cql_policy)")


@dg.asset(group_name=GROUP, deps=[bc_policy, cql_policy], kinds={"python", "json"},
          description="Off-policy evaluation of the static table, BC and CQL on the eval split's report half "
                      "(the half CQL's alpha was not chosen on): IPS, SNIPS, "
                      "DM, DR, SNDR, Switch-DR, PDIS, step-wise DR and FQE with 95% bootstrap intervals, ESS and "
                      "support; a warning when a half is too small to trust; ground truth and regret closure when the data is simulated. Promotion gate: "
                      "a policy goes to checkpoints/promoted/ only if its DR lower bound beats the table's DR.")
def offline_eval(context: dg.AssetExecutionContext, config: OfflineEvalConfig, sage: SageResource) -> dg.MaterializeResult:
    path, df = _dataset(sage)
    cat, spec = sage.catalogue, FeatureSpec()
    ckpts = {"bc": sage.path("checkpoints", "bc"), "cql": sage.path("checkpoints", "cql")}
    policies = {"static_table": StaticTablePolicy(sage.table, cat)} | {
        n: load_policy(p, spec, cat.actions) for n, p in ckpts.items()}
    df_eval, n_estimated = oe.fill_missing_propensities(oe.eval_part(df, "report"), policies["bc"])
    manifest = sage.path("sessions", "synthetic", "simulator.json")
    sim = (oe.simulator_from_manifest(manifest, cat, sage.table, rd.read_reward_spec(path) or RewardSpec())
           if manifest.is_file() and (df_eval["data_source"] == "synthetic").all() else None)
    report = oe.run_offline_eval(df_eval, policies, cat, ope.OPEConfig(n_boot=config.n_boot, seed=config.seed),
                                 sim=sim, progress=context.log.info,
                                 behaviour=_behaviour(config.support, policies["bc"]))
    promoted = oe.promote(report.gate, ckpts, sage.path("checkpoints", "promoted"),
                          {"summary": report.summary(), "dataset_sha256": artifacts.file_sha256(path)})
    out = artifacts.write_json(sage.path("reports", "offline_eval.json"),
                               report.to_dict() | {"propensities_estimated_by_bc": n_estimated})
    png = oe.plot_offline_eval(report)
    artifacts.write_bytes(sage.path("reports", "offline_eval.png"), png)
    context.log.info(report.gate.reason)
    return dg.MaterializeResult(metadata={
        "summary": dg.MetadataValue.md(markdown.table(report.summary())),
        "estimates": dg.MetadataValue.md(markdown.table(report.rows())),
        "plot": dg.MetadataValue.md(markdown.image(png, "OPE estimates with 95% intervals; ground truth dashed")),
        "promotion": report.gate.reason, "promoted": report.gate.promoted or "none",
        "promoted_path": dg.MetadataValue.path(str(promoted)) if promoted else "none",
        "ground_truth": "simulator" if sim is not None else "none (not simulated data)",
        "sample_size_warning": report.warning or "none",
        "propensities_estimated_by_bc": n_estimated,
        "path": dg.MetadataValue.path(str(out)),
    })
