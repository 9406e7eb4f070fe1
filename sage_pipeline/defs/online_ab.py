"""online_ab: the promoted, served policy against the static table, online in the simulator
(SAGE's ``compare-policy`` with ground truth), and its checks."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import json

import dagster as dg

from sage_pipeline import artifacts, markdown
from sage_pipeline.defs.policy_assets import _space, offline_eval, sage_router_checkpoint
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.routing_assets import GROUP
from sage_pipeline.defs.sections import to_core
from sage_pipeline.rl import offline_eval as oe, online_ab as ab
from sage_pipeline.routing import routing_dataset as rd
from sage_pipeline.routing.policy import StaticTablePolicy
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.sage import checkpoint as sage_router

REPORT = ("reports", "online_ab.json")


class OnlineABAssetConfig(dg.Config, ab.OnlineABConfig):
    """online_ab's run config: ``sage_pipeline.rl.online_ab.OnlineABConfig`` (episodes, seed)."""


def _skip(context, sage: SageResource, reason: str) -> dg.MaterializeResult:
    context.log.warning(f"online_ab: {reason}")
    artifacts.write_json(sage.path(*REPORT), {"ran": False, "reason": reason})
    return dg.MaterializeResult(metadata={"ran": False, "reason": reason})


@dg.asset(group_name=GROUP, deps=[sage_router_checkpoint, offline_eval], kinds={"python", "json"},
          description="Online A/B in the routing simulator: the static YAML table against the served policy "
                      "(checkpoints/sage/: the promoted classifiers behind SAGE's confidence floor, YAML below it) "
                      "on the same simulated tasks with common random numbers. Each arm's return with its 95% "
                      "interval, the paired difference with its 95% interval, pass rate, cost and latency per "
                      "episode, both policies' exact values, and whether offline_eval's OPE estimates (the ones "
                      "recorded when the policy was promoted) lie inside the online intervals. Runs only on "
                      "simulated logs (the collector's simulator.json); nothing promoted: nothing to compare.")
def online_ab(context: dg.AssetExecutionContext, config: OnlineABAssetConfig,
              sage: SageResource) -> dg.MaterializeResult:
    ckpt = sage.path("checkpoints", "sage")
    manifest_path = sage.path("sessions", "synthetic", "simulator.json")
    if not (ckpt / sage_router.JOBLIB_NAME).is_file():
        return _skip(context, sage, "no served policy (checkpoints/sage/): nothing has passed the gate, SAGE keeps "
                                    "its table")
    if not manifest_path.is_file():
        return _skip(context, sage, f"no simulator ({manifest_path} is missing): the online A/B runs in the "
                                    "simulator that made the logs; with real logs only, run SAGE's own compare-policy")
    binary = _space(sage, "sage_binary")
    served = sage_router.load_sage_checkpoint(ckpt, sage.table, binary)
    manifest = sage_router.read_manifest(ckpt)
    parquet = sage.path("routing", rd.PARQUET_NAME)
    reward = (rd.read_reward_spec(parquet) if parquet.is_file() else None) or RewardSpec()
    sim = oe.simulator_from_manifest(manifest_path, sage.catalogue, sage.table, reward)
    if tuple(sim.actions) != tuple(binary.actions):
        return _skip(context, sage, f"the dataset's models {binary.actions} are not the simulator's {sim.actions}: "
                                    "the simulator cannot route them")
    name = manifest.get("policy", "served")
    gain = manifest.get("gain_over_table") or {}  # the gate's paired interval (checkpoints before it: none)
    est = ab.ope_estimates_from_summary(manifest.get("summary", []), name) | {
        k: gain.get(k) for k in ("difference_ci_low", "difference_ci_high")}
    rep = ab.online_ab(sim, StaticTablePolicy(sage.table, binary), served,
                       to_core(config, ab.OnlineABConfig), est, ("static_table", name))
    d = rep.difference
    context.log.info(f"online_ab: {name} - static_table = {d['mean']:+.4f} [{d['ci_low']:+.4f}, {d['ci_high']:+.4f}] "
                     f"over {rep.episodes} tasks each (exact {rep.true_difference:+.4f}); OPE predicted "
                     f"{rep.ope['difference']}")
    path = artifacts.write_json(sage.path(*REPORT), {"ran": True, "policy": name, "source": manifest.get("source"),
                                                     "min_confidence": served.min_confidence, **rep.to_dict()})
    return dg.MaterializeResult(metadata={
        "ran": True, "policy": name, "episodes_per_arm": rep.episodes,
        "difference": d["mean"], "difference_ci_low": d["ci_low"], "difference_ci_high": d["ci_high"],
        "true_difference": rep.true_difference,
        "ope_difference": rep.ope["difference"] if rep.ope["difference"] is not None else "unknown",
        "ope_difference_inside_interval": str(rep.ope_difference_inside),
        "ope_agrees_within_both_errors": str(rep.ope_agrees),
        "ope_value_inside_interval": str(rep.ope_value_inside),
        "same_first_decision": rep.identical_decisions,
        "arms": dg.MetadataValue.md(markdown.table(rep.rows())),
        "path": dg.MetadataValue.path(str(path)),
    })


def _report(sage: SageResource) -> dict | None:
    p = sage.path(*REPORT)
    rep = json.loads(p.read_text(encoding="utf-8")) if p.is_file() else None
    return rep if rep and rep.get("ran") else None


@dg.asset_check(asset=online_ab, blocking=False,
                description="offline_eval's estimate of the served policy's gain over the table (clipped step-wise "
                            "DR, recorded at promotion) agrees with the online A/B's: their gap is within 1.96 "
                            "standard errors of their difference, OPE's from the gate's paired interval (checkpoints "
                            "without it: OPE's estimate inside the online 95% interval). The metadata also says "
                            "whether OPE's estimate lies inside the online interval, which the sharper online test "
                            "often excludes an honest OPE from. A warning: OPE and the online test disagree, so "
                            "trust neither until you know why.")
def online_ab_agrees_with_offline_eval(sage: SageResource) -> dg.AssetCheckResult:
    rep = _report(sage)
    if rep is None or rep["ope_difference_inside"] is None:
        why = "the online A/B did not run" if rep is None else "no OPE estimate recorded with the checkpoint"
        return dg.AssetCheckResult(passed=True, severity=dg.AssetCheckSeverity.WARN, metadata={"checked": False,
                                                                                              "reason": why})
    d = rep["difference"]
    return dg.AssetCheckResult(
        passed=bool(rep["ope_difference_inside"] if rep.get("ope_agrees") is None else rep["ope_agrees"]),
        severity=dg.AssetCheckSeverity.WARN,
        metadata={"checked": True, "rule": "inside the online interval" if rep.get("ope_agrees") is None else
                  "within both errors", "ope_agrees_within_both_errors": str(rep.get("ope_agrees")),
                  "ope_difference_inside_interval": str(rep["ope_difference_inside"]),
                  "ope_difference_ci_low": rep["ope"].get("difference_ci_low"),
                  "ope_difference_ci_high": rep["ope"].get("difference_ci_high"),
                  "ope_difference": rep["ope"]["difference"], "online_ci_low": d["ci_low"],
                  "online_ci_high": d["ci_high"], "true_difference": rep["true_difference"],
                  "ope_value_inside_value_interval": str(rep["ope_value_inside"])})


@dg.asset_check(asset=online_ab, blocking=False,
                description="The served policy is not worse than the static table online: the upper end of the "
                            "paired 95% interval of (served - table) is >= 0. Fails when the promoted policy "
                            "loses to the table online: roll SAGE back to its table (unset SAGE_RL_POLICY).")
def online_ab_served_not_worse(sage: SageResource) -> dg.AssetCheckResult:
    rep = _report(sage)
    if rep is None:
        return dg.AssetCheckResult(passed=True, metadata={"checked": False, "reason": "the online A/B did not run"})
    d = rep["difference"]
    return dg.AssetCheckResult(passed=bool(d["ci_high"] >= 0.0),
                               metadata={"checked": True, "difference": d["mean"], "ci_low": d["ci_low"],
                                         "ci_high": d["ci_high"], "true_difference": rep["true_difference"]})


ONLINE_AB_CHECKS = [online_ab_agrees_with_offline_eval, online_ab_served_not_worse]
