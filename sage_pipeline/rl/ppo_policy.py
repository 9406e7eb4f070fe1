"""What the ``ppo_policy`` asset does, without Dagster: train PPO on the train split's tasks
and judge it on the held-out (test split) tasks by the simulator's exact ground truth, beside
every baseline.

Two environments (``sage_pipeline.sim.obs.ENVS``): ``"sage_loop"`` (the default,
:mod:`sage_pipeline.sim.loop_env`: SAGE's coder / debugger loop with the sandbox's feedback and a
per-task budget) and ``"escalation"`` (:mod:`sage_pipeline.sim.env`: one coder model per attempt,
no budget).

Held-out rows (all exact, no sampling): expected return per task (``value``), regret
closure ``(V - V_static) / (V_oracle - V_static)``, pass rate, mean cost and latency per
task, calls per task, for

* SAGE's static table and the oracle (backward induction over the feedback states);
* on the SAGE loop, the policies that ignore the feedback, each its exact per-task optimum:
  the best single arm (one action for the whole task), the best one-step route (a first
  call, then one action repeated: one routing decision per task, what a contextual bandit
  makes) and the best feedback-blind plan (any fixed sequence; an upper bound on every
  policy that does not read the feedback). Each of them knows the task's own wrong candidates;
* on the SAGE loop, the same two classes as policies of the task's observation only (its
  family and difficulty): the learned one-step route and the learned feedback-blind plan, one
  plan per family and difficulty bin, fitted with full information on the train tasks
  (``LoopGroundTruth.learned_blind``): the best one-step learner that sees the task;
* on the SAGE loop, the online bandit of :mod:`sage_pipeline.rl.bandit` (LinUCB on SAGE's
  routing features, which hold no feedback) after ``bandit_steps`` decisions on the train tasks,
  valued greedily;
* PPO as served (the checkpoint's head) and PPO's other head.

The learning curve evaluates the held-out value every ``eval_every`` updates; nothing is
selected on it (the last network is the one saved), so the held-out numbers stay unbiased.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sage_pipeline import artifacts
from sage_pipeline.rl.ppo import PPOConfig, PPOResult, train_ppo
from sage_pipeline.sim.env import CodeTaskVecEnv
from sage_pipeline.sim.ground_truth import GroundTruth
from sage_pipeline.sim.loop_env import SageLoopSim, SageLoopVecEnv
from sage_pipeline.sim.loop_truth import LoopGroundTruth, regret_closure
from sage_pipeline.sim.obs import LoopObs

BLIND = ("best single arm", "best one-step route", "best feedback-blind plan",  # per task: they know its candidates
         "learned one-step route", "learned feedback-blind plan")  # from the task's observation, on the train tasks
BANDIT = "online bandit (LinUCB, greedy)"
# what the asset writes, relative to the artifact root: one set (artifacts.atomic_set), so a run
# killed or failing between its files never leaves the checkpoint of one run beside the report of another
CHECKPOINT = ("checkpoints", "ppo")
CURVE = ("reports", "ppo_learning_curve.png")
REPORT = ("reports", "ppo_policy.json")
MEMBERS = tuple("/".join(p) for p in (CHECKPOINT, CURVE, REPORT))


@dataclass(frozen=True)
class PPOPolicyRun:
    result: PPOResult
    rows: list[dict]  # held-out comparison, one row per policy
    summary: dict  # the served policy's held-out figures and the training figures
    n_train: int
    n_test: int
    env: str


def _finite(d: dict) -> dict:
    """JSON-safe: NaN/inf become None (artifacts.write_json refuses them)."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in d.items()}


def env_name(sim) -> str:
    return "sage_loop" if isinstance(sim, SageLoopSim) else "escalation"


def make_env(sim, task_idx: np.ndarray, n_envs: int, seed: int):
    """The numpy VectorEnv of ``sim``'s environment on ``task_idx``."""
    cls = SageLoopVecEnv if isinstance(sim, SageLoopSim) else CodeTaskVecEnv
    return cls(sim, task_idx, n_envs=n_envs, seed=seed)


def ground_truth(sim) -> LoopGroundTruth | GroundTruth:
    return LoopGroundTruth(sim) if isinstance(sim, SageLoopSim) else GroundTruth(sim)


# ---------------------------------------------------------------------- the online bandit
class BanditPolicy:
    """A :class:`~sage_pipeline.rl.bandit.LinearBandit` driving the SAGE loop through SAGE's
    routing features (difficulty as ``task_complexity_score``, calls as ``step`` and
    ``failure_count``, failed calls of the coder's primary as ``primary_failure_count``): it
    never sees the feedback. ``greedy``: without its exploration floor."""

    def __init__(self, sim: SageLoopSim, bandit, greedy: bool = True) -> None:
        self.sim, self.bandit, self.greedy = sim, bandit, greedy
        self.actions, self.role_mask, self.name = sim.actions, sim.role_mask, BANDIT
        self._primary = sim.static_routes[0][1]

    def contexts(self, obs: LoopObs):
        from sage_pipeline.routing.features import Contexts

        calls = obs.counts.sum(axis=1)
        return Contexts(role=np.zeros(len(obs), dtype=np.int64), task_complexity_score=obs.difficulty,
                        prompt_tokens=np.full(len(obs), np.nan), step=calls, failure_count=calls,
                        primary_failure_count=obs.counts[:, self._primary])

    def action_probs(self, obs: LoopObs) -> np.ndarray:
        ctx = self.contexts(obs)
        return self.bandit.greedy_probs(ctx) if self.greedy else self.bandit.action_probs(ctx)


def run_online_bandit(sim: SageLoopSim, task_idx: np.ndarray, steps: int, seed: int = 0, n_envs: int = 128,
                      log: Callable[[str], None] | None = None) -> tuple[BanditPolicy, dict]:
    """LinUCB (:mod:`sage_pipeline.rl.bandit`) learning on-line from each call's reward for
    ``steps`` decisions on ``task_idx``, every action a candidate of one role; returns the
    learned policy and its throughput."""
    from sage_pipeline.rl.bandit import BanditConfig, LinearBandit

    bandit = LinearBandit(sim.actions, ("coder",), np.ones((1, len(sim.actions)), dtype=bool),
                          BanditConfig(algorithm="linucb", seed=seed), name=BANDIT)
    policy = BanditPolicy(sim, bandit, greedy=False)
    env = make_env(sim, task_idx, n_envs, seed)
    t0, done_steps = time.perf_counter(), 0
    while done_steps < steps:
        ctx = policy.contexts(env.observe())
        action, _ = bandit.act(ctx)
        _, reward, *_ = env.step(action)
        bandit.update(ctx, action, reward)
        done_steps += n_envs
    seconds = time.perf_counter() - t0
    if log:
        log(f"online bandit (LinUCB): {done_steps:,} decisions in {seconds:.1f}s")
    return BanditPolicy(sim, bandit, greedy=True), {"bandit_steps": done_steps, "bandit_seconds": seconds}


# ---------------------------------------------------------------------- train and judge
def train_and_evaluate(sim, config: PPOConfig | None = None, log: Callable[[str], None] | None = None,
                       bandit_steps: int = 0) -> PPOPolicyRun:
    config = config or PPOConfig()
    gt = ground_truth(sim)
    train, test = sim.split_index("train"), sim.split_index("test")
    v_static = gt.policy_value(gt.static_policy(), test).value
    v_oracle = gt.optimal_value(test).value
    if log:
        log(f"{env_name(sim)}: {len(train)} train / {len(test)} held-out tasks ({len(sim.skipped)} skipped); "
            f"held-out exact value: static table {v_static:.4f}, oracle {v_oracle:.4f}")

    def evaluate(greedy, softmax) -> dict:
        vg, vs = gt.policy_value(greedy, test).value, gt.policy_value(softmax, test).value
        return {"heldout_value_greedy": vg, "heldout_value_softmax": vs,
                "heldout_closure_greedy": regret_closure(vg, v_static, v_oracle),
                "heldout_closure_softmax": regret_closure(vs, v_static, v_oracle)}

    result = train_ppo(make_env(sim, train, config.num_envs, config.seed), config, evaluate=evaluate, log=log)
    other = "softmax" if config.head == "greedy" else "greedy"
    served = f"ppo ({config.head}, served)"
    policies, extra = {served: result.policy(config.head), f"ppo ({other})": result.policy(other)}, {}
    if isinstance(sim, SageLoopSim) and bandit_steps > 0:
        bandit, extra = run_online_bandit(sim, train, bandit_steps, seed=config.seed, log=log)
        policies = {BANDIT: bandit, **policies}
    learned = {"train_idx": train} if isinstance(gt, LoopGroundTruth) else {}  # feedback-blind policies learned on it
    rows = gt.compare(policies, test, **learned)
    by = {r["policy"]: r for r in rows}
    cost = {"heldout_mean_cost_usd": by[served]["mean_cost_usd"],
            "heldout_mean_latency_s": by[served]["mean_latency_s"]}
    summary = _finite({
        "env": env_name(sim), "heldout_value": by[served]["value"],
        "heldout_regret_closure": by[served]["regret_closure"], "heldout_pass_rate": by[served]["pass_rate"],
        **cost, "static_table_value": v_static, "oracle_value": v_oracle,
        "static_table_pass_rate": by["static_table"]["pass_rate"], "oracle_pass_rate": by["oracle"]["pass_rate"],
        **{f"closure_{k.replace(' ', '_').replace('-', '_')}": by[k]["regret_closure"] for k in (*BLIND, BANDIT)
           if k in by},
        "head": config.head, "train_tasks": len(train), "heldout_tasks": len(test),
        "skipped_tasks": len(sim.skipped), **extra, **result.metrics})
    if log:
        log("held-out regret closure: " + ", ".join(f"{r['policy']} {r['regret_closure']:.3f}" for r in rows))
    return PPOPolicyRun(result, [_finite(r) for r in rows], summary, len(train), len(test), env_name(sim))


def report(run: PPOPolicyRun, sim) -> dict:
    out = {"summary": run.summary, "heldout": run.rows, "curve": [_finite(r) for r in run.result.curve],
           "actions": list(sim.actions), "obs_spec": sim.obs_spec.to_dict(), "skipped": sim.skipped}
    if isinstance(sim, SageLoopSim):
        return out | {"calibration": sim.config.to_dict()}
    return out | {"sim_config": sim.config.to_dict()}


def write_outputs(run: PPOPolicyRun, sim, root: Path, training_data_sha256: str) -> tuple[Path, Path, bytes]:
    """Write the checkpoint, the learning curve and the report (:data:`MEMBERS`) under ``root``
    (an ``artifacts.atomic_set`` version, laid out like the artifact root): the checkpoint's
    folder, the report's path and the curve's PNG bytes."""
    ck = run.result.save(root.joinpath(*CHECKPOINT), training_data_sha256=training_data_sha256, metrics=run.summary)
    png = plot_learning_curve(run)
    artifacts.write_bytes(root.joinpath(*CURVE), png)
    return ck, artifacts.write_json(root.joinpath(*REPORT), report(run, sim)), png


def plot_learning_curve(run: PPOPolicyRun) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = run.result.curve
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    x = [r["env_steps"] for r in curve]
    for head, style in (("greedy", "-"), ("softmax", "--")):
        ax.plot(x, [r[f"heldout_value_{head}"] for r in curve], style, marker=".", label=f"PPO ({head})")
    by = {r["policy"]: r["value"] for r in run.rows}
    lines = [("static_table", "grey", ":"), ("oracle", "black", "-."), ("best feedback-blind plan", "tab:red", ":"),
             ("best one-step route", "tab:purple", ":"), (BANDIT, "tab:brown", ":")]
    for name, color, ls in lines:
        if by.get(name) is not None:
            ax.axhline(by[name], color=color, ls=ls, label=name.replace("static_table", "static table"))
    ax.set_xlabel("env steps (model calls and stops)")
    ax.set_ylabel("exact value per held-out task")
    ax.set_title(f"PPO on the {run.env} simulator: {run.n_train} train / {run.n_test} held-out tasks")
    ax.legend(loc="lower right", fontsize=7)
    ax.grid(alpha=0.3)
    return artifacts.png_bytes(fig)

