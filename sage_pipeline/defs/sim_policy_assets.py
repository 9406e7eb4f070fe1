"""The simulator chain, part 2: sim_tasks, sandbox_rollouts -> ppo_policy."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import json

import dagster as dg
from pydantic import Field

from sage_pipeline import artifacts, markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.sections import section, to_core
from sage_pipeline.rl import ppo_policy as pp
from sage_pipeline.rl.ppo import PPOConfig
from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sim.env import CodeTaskSim, EscalationRewardSpec, SimConfig
from sage_pipeline.sim.loop_config import DEFAULT_CONFIG, SageLoopConfig
from sage_pipeline.sim.loop_env import SageLoopSim
from sage_pipeline.sim.obs import EnvName
from sage_pipeline.sim.rollouts import ROLLOUTS_DIR, read_rollouts
from sage_pipeline.sim.schema import TASKS_FILE, read_tasks

GROUP = "simulator"
REPORT = pp.REPORT


class EscalationRewardSection(dg.Config, EscalationRewardSpec):
    """``sage_pipeline.sim.env.EscalationRewardSpec``: the escalation env's reward (reward_v2 by default)."""


class EscalationSection(dg.Config, SimConfig):
    """``sage_pipeline.sim.env.SimConfig``: the escalation env's outcome model and reward."""

    reward: EscalationRewardSection = section(SimConfig, "reward", EscalationRewardSection)


class PPOPolicyConfig(dg.Config, PPOConfig):
    """ppo_policy's run config: ``sage_pipeline.rl.ppo.PPOConfig`` (total_timesteps, num_envs, ...,
    flat), which environment, the online bandit baseline's budget, the SAGE loop's calibration and
    table, and the escalation env's settings (section ``escalation``, ``sage_pipeline.sim.env.SimConfig``)."""

    env: EnvName = Field("sage_loop", description="'sage_loop' (SAGE's coder/debugger loop with the sandbox's "
                            "feedback and a per-task budget) or 'escalation' (one coder model per attempt, the "
                            "earlier env)")
    bandit_steps: int = Field(100_000, ge=0, description="sage_loop: decisions the online LinUCB bandit "
                              "(rl/bandit.py) learns from before it is valued (0: skip this baseline)")
    calibration: str | None = Field(None, min_length=1, description="sage_loop: the calibration file (models, "
                                    "sources, budget, reward, assumptions); null: the packaged "
                                    f"{DEFAULT_CONFIG.name}")
    routing_table: str | None = Field(None, min_length=1, description="sage_loop: SAGE's models.yaml whose coder "
                                      "and debugger rows are the static policy; null: the one the calibration file "
                                      "names")
    escalation: EscalationSection = Field(default_factory=EscalationSection, description="escalation: the env's "
                                          "outcome model and reward (sage_pipeline.sim.env.SimConfig); sage_loop "
                                          "reads them from the calibration file")


def _sim(config: PPOPolicyConfig, sage: SageResource, log):
    tasks, rollouts = read_tasks(sage.path("sim", TASKS_FILE)), read_rollouts(sage.path("sim", ROLLOUTS_DIR))
    if config.env == "escalation":
        sim_cfg = to_core(config.escalation, SimConfig)
        return CodeTaskSim.build(tasks, rollouts, sage.catalogue, sage.table, sim_cfg, log=log)
    loop = SageLoopConfig.load(config.calibration or DEFAULT_CONFIG)
    table = RoutingTable.load(config.routing_table or loop.routing_table)
    return SageLoopSim.build(tasks, rollouts, loop, table, log=log)


@dg.asset(group_name=GROUP, deps=[dg.AssetKey("sim_tasks"), dg.AssetKey("sandbox_rollouts")], kinds={"pytorch"},
          description="PPO on the coding-task simulator, by default SAGE's coder/debugger loop: each step writes a "
                      "candidate or repairs the failing one with one of SAGE's models (calibrated from published "
                      "pass rates, cited in the calibration file) or stops; the feedback (outcome kind, tests "
                      "passed/total) is what the sandbox verified; a per-task budget of calls, dollars and seconds. "
                      "Trained on the train split's tasks, judged on the held-out ones by exact ground truth beside "
                      "SAGE's static table, the oracle, the best policies that ignore the feedback and an online "
                      "bandit: value, regret closure, pass rate, cost; learning curve; env steps/s. Checkpoint in "
                      "checkpoints/ppo/ (the common policy format), its learning curve and report in reports/, "
                      "switched together (one set).")
def ppo_policy(context: dg.AssetExecutionContext, config: PPOPolicyConfig, sage: SageResource) -> dg.MaterializeResult:
    sim = _sim(config, sage, context.log.info)
    run = pp.train_and_evaluate(sim, to_core(config, PPOConfig), log=context.log.info, bandit_steps=config.bandit_steps)
    sha256 = artifacts.file_sha256(sage.path("sim", TASKS_FILE))
    with sage.writing("ppo_policy", pp.MEMBERS, context.log.info) as stage:  # checkpoint, curve, report: one set
        ck, out, png = pp.write_outputs(run, sim, stage.path(), sha256)
        ck, out = stage.public(ck), stage.public(out)
    s = run.summary
    extra = {}
    if isinstance(sim, SageLoopSim):
        extra = {"calibration": dg.MetadataValue.md(markdown.table(sim.config.table_rows(), digits=4)),
                 "calibration_file": dg.MetadataValue.path(sim.config.source),
                 "static_table_pass_rate": s["static_table_pass_rate"], "oracle_pass_rate": s["oracle_pass_rate"],
                 **{k: s[k] for k in s if k.startswith("closure_")}}
    return dg.MaterializeResult(metadata={
        "heldout": dg.MetadataValue.md(markdown.table(run.rows, digits=4)),
        "learning_curve": dg.MetadataValue.md(markdown.image(png, "held-out exact value during training")),
        "env": run.env, "heldout_regret_closure": s["heldout_regret_closure"], "heldout_value": s["heldout_value"],
        "heldout_pass_rate": s["heldout_pass_rate"], **extra,
        "static_table_value": s["static_table_value"], "oracle_value": s["oracle_value"],
        "env_steps": s["env_steps"], "env_steps_per_s": round(s["env_steps_per_s"], 1),
        "train_seconds": round(s["train_seconds"], 2), "train_tasks": run.n_train, "heldout_tasks": run.n_test,
        "skipped_tasks": dg.MetadataValue.json(sim.skipped), "outcomes_executed_now": sim.outcomes.executed,
        "path": dg.MetadataValue.path(str(ck)), "report": dg.MetadataValue.path(str(out)),
    })


@dg.asset_check(asset=ppo_policy, blocking=False,
                description="PPO beats SAGE's static table on the held-out tasks (exact ground truth): regret "
                            "closure above 0. A warning: the checkpoint is written either way; the goal is 0.85.")
def ppo_policy_beats_static_table(sage: SageResource) -> dg.AssetCheckResult:
    summary = json.loads(sage.path(*REPORT).read_text(encoding="utf-8"))["summary"]
    closure = summary["heldout_regret_closure"]
    return dg.AssetCheckResult(
        passed=closure is not None and closure > 0.0, severity=dg.AssetCheckSeverity.WARN,
        metadata={"heldout_regret_closure": closure if closure is not None else "undefined (oracle == table)",
                  "heldout_value": summary["heldout_value"], "static_table_value": summary["static_table_value"],
                  "oracle_value": summary["oracle_value"]})


sim_policy_defs = dg.Definitions(assets=[ppo_policy], asset_checks=[ppo_policy_beats_static_table])
