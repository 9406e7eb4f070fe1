"""What the ``ppo_policy`` asset does, without Dagster: train PPO on the train split's
tasks and judge it on the held-out (test split) tasks by the simulator's exact ground
truth, beside SAGE's static table and the oracle.

Held-out rows (all exact, no sampling): expected return per task (``value``), regret
closure ``(V - V_static) / (V_oracle - V_static)``, pass rate, mean cost (USD) and
latency per task, model calls per task, for the served policy (the checkpoint's head)
and for the other head of the same network. The learning curve evaluates the held-out
value every ``eval_every`` updates; nothing is selected on it (the last network is the
one saved), so the held-out numbers stay unbiased.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from sage_pipeline import artifacts
from sage_pipeline.rl.ppo import PPOConfig, PPOResult, train_ppo
from sage_pipeline.sim.env import CodeTaskSim, CodeTaskVecEnv
from sage_pipeline.sim.ground_truth import GroundTruth, regret_closure


@dataclass(frozen=True)
class PPOPolicyRun:
    result: PPOResult
    rows: list[dict]  # held-out comparison, one row per policy
    summary: dict  # the served policy's held-out figures and the training figures
    n_train: int
    n_test: int


def _finite(d: dict) -> dict:
    """JSON-safe: NaN/inf become None (artifacts.write_json refuses them)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def train_and_evaluate(sim: CodeTaskSim, config: PPOConfig | None = None,
                       log: Callable[[str], None] | None = None) -> PPOPolicyRun:
    config = config or PPOConfig()
    gt = GroundTruth(sim)
    train, test = sim.split_index("train"), sim.split_index("test")
    v_static = gt.policy_value(gt.static_policy(), test).value
    v_oracle = gt.optimal_value(test).value
    if log:
        log(f"{len(train)} train / {len(test)} held-out tasks ({len(sim.skipped)} skipped); held-out exact "
            f"value: static table {v_static:.4f}, oracle {v_oracle:.4f}")

    def evaluate(greedy, softmax) -> dict:
        vg, vs = gt.policy_value(greedy, test).value, gt.policy_value(softmax, test).value
        return {"heldout_value_greedy": vg, "heldout_value_softmax": vs,
                "heldout_closure_greedy": regret_closure(vg, v_static, v_oracle),
                "heldout_closure_softmax": regret_closure(vs, v_static, v_oracle)}

    env = CodeTaskVecEnv(sim, train, n_envs=config.num_envs, seed=config.seed)
    result = train_ppo(env, config, evaluate=evaluate, log=log)
    other = "softmax" if config.head == "greedy" else "greedy"
    rows = gt.compare({f"ppo ({config.head}, served)": result.policy(config.head),
                       f"ppo ({other})": result.policy(other)}, test)
    served = rows[2]
    summary = _finite({
        "heldout_value": served["value"], "heldout_regret_closure": served["regret_closure"],
        "heldout_pass_rate": served["pass_rate"], "heldout_mean_cost_usd": served["mean_cost_usd"],
        "static_table_value": v_static, "oracle_value": v_oracle, "head": config.head,
        "train_tasks": len(train), "heldout_tasks": len(test), "skipped_tasks": len(sim.skipped),
        **result.metrics})
    return PPOPolicyRun(result, [_finite(r) for r in rows], summary, len(train), len(test))


def report(run: PPOPolicyRun, sim: CodeTaskSim) -> dict:
    return {"summary": run.summary, "heldout": run.rows, "curve": [_finite(r) for r in run.result.curve],
            "sim_config": sim.config.to_dict(),
            "actions": list(sim.actions), "obs_spec": sim.obs_spec.to_dict(), "skipped": sim.skipped}


def plot_learning_curve(run: PPOPolicyRun) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = run.result.curve
    fig, ax = plt.subplots(figsize=(7, 4))
    x = [r["env_steps"] for r in curve]
    for head, style in (("greedy", "-"), ("softmax", "--")):
        ax.plot(x, [r[f"heldout_value_{head}"] for r in curve], style, marker=".", label=f"PPO ({head})")
    ax.axhline(run.summary["static_table_value"], color="grey", ls=":", label="static table")
    ax.axhline(run.summary["oracle_value"], color="black", ls="-.", label="oracle")
    ax.set_xlabel("env steps (attempts)")
    ax.set_ylabel("exact value per held-out task")
    ax.set_title(f"PPO on the code-task simulator: {run.n_train} train / {run.n_test} held-out tasks")
    ax.legend(loc="lower right")
    ax.grid(alpha=0.3)
    return artifacts.png_bytes(fig)
