"""Exact ground truth of the SAGE loop: values checked by hand on a one-task simulator, against
Monte Carlo in the environment, and between the policy classes (the oracle above everything,
the feedback-blind plan above the one-step route above the single arm); the best plan's value
is the backward induction's value of that plan."""

from __future__ import annotations

import numpy as np
import pytest

from sage_pipeline.rl.checkpoint import CheckpointError, CheckpointMeta, MLPPolicy
from sage_pipeline.sim.loop_config import SageLoopConfig, logit
from sage_pipeline.sim.loop_env import SageLoopSim, SageLoopVecEnv
from sage_pipeline.sim.loop_truth import LoopGroundTruth, regret_closure
from sage_pipeline.sim.obs import ObsSpec
from sage_pipeline_tests.sim.synthetic import synthetic_suite
from sage_pipeline_tests.sim.test_loop_env import hand_sim, with_budget


@pytest.fixture(scope="module")
def config() -> SageLoopConfig:
    return SageLoopConfig.load()


@pytest.fixture(scope="module")
def sim(config):
    return SageLoopSim.build(*synthetic_suite(40, seed=2), config)


@pytest.fixture(scope="module")
def gt(sim):
    return LoopGroundTruth(sim)


def sig(x: float) -> float:
    return 1.0 / (1.0 + np.exp(-x))


def by_hand(config: SageLoopConfig, sim: SageLoopSim):
    """Rewards and chances of the one-task simulator, from the config's numbers directly."""
    a, d = config.assumed, 0.42
    cw, lw = config.cost_weight, config.latency_weight

    def reward(action: str, level: int, kind: str) -> float:
        role, model = action.split(":", 1)
        cost = cw * config.usd_per_call(model, role) + lw * config.models[model].latency_s
        base = {"pass": 1.25, "timeout": -0.5}.get(kind, -0.15)
        return float(np.clip(base - 0.1 * level - cost, -2, 2))

    def p_code(model: str) -> float:
        return sig(logit(config.models[model].humaneval.value) - a["difficulty_slope"] * (d - a["difficulty_ref"]))

    def p_debug(model: str, kind: str, share: float) -> float:
        return sig(config.models[model].debug_logit - a["difficulty_slope"] * (d - a["difficulty_ref"])
                   + a["debug_kind_gain"][kind] + a["debug_tests_gain"] * (share - a["tests_ref"]))

    return reward, p_code, p_debug


def test_one_call_by_hand(config):
    sim = hand_sim(with_budget(config, calls=1), ["wrong_answer"], [(1, 2)])
    reward, p_code, _ = by_hand(config, sim)
    q = {}
    for action in sim.call_actions:
        role, model = action.split(":", 1)
        q[action] = (p_code(model) * reward(action, 0, "pass") + (1 - p_code(model)) * reward(action, 0, "wrong_answer")
                     if role == "code" else reward(action, 0, "no_candidate"))
    gt = LoopGroundTruth(sim)
    assert gt.optimal_value().value == pytest.approx(max(0.0, *q.values()))
    assert gt.q_star()[0, gt.state_index(np.zeros((1, sim.n_calls), dtype=np.int64))[0], 0, :-1] == pytest.approx(
        [q[a] for a in sim.call_actions])


def test_sages_table_over_two_calls_by_hand(config):
    sim = hand_sim(with_budget(config, calls=2), ["wrong_answer"], [(1, 2)])
    reward, p_code, p_debug = by_hand(config, sim)
    p1, pd = p_code("qwen2.5-coder:1.5b"), p_debug("qwen2.5-coder:14b", "wrong_answer", 0.5)
    code, dbg = "code:qwen2.5-coder:1.5b", "debug:qwen2.5-coder:14b"
    want = {"return": p1 * reward(code, 0, "pass") + (1 - p1) * (reward(code, 0, "wrong_answer") + pd * reward(
                dbg, 1, "pass") + (1 - pd) * reward(dbg, 1, "wrong_answer")),
            "pass_rate": p1 + (1 - p1) * pd,
            "latency_s": config.models["qwen2.5-coder:1.5b"].latency_s
            + (1 - p1) * config.models["qwen2.5-coder:14b"].latency_s,
            "calls": 1 + (1 - p1)}
    gt = LoopGroundTruth(sim)
    v = gt.policy_value(gt.static_policy())
    for channel, value in want.items():
        assert v.mean(channel) == pytest.approx(value), channel


def _monte_carlo(sim, policy, task_idx, episodes: int, seed: int, sample: bool = False) -> tuple[float, float]:
    """The first episode of each of ``episodes`` env rows (later ones would over-weight short
    episodes: more of them finish in the same number of steps)."""
    env = SageLoopVecEnv(sim, task_idx, n_envs=episodes, seed=seed)
    rng = np.random.default_rng(seed)
    first = np.full(episodes, np.nan)
    while np.isnan(first).any():
        probs = policy.action_probs(env.observe())
        a = (probs.cumsum(1) > rng.random((len(probs), 1))).argmax(1) if sample else probs.argmax(1)
        _, _, done, _, info = env.step(a)
        new = done & np.isnan(first)
        first[new] = info["episode_return"][new]
    return float(first.mean()), float(first.std() / np.sqrt(episodes))


class Uniform:
    name = "uniform"

    def __init__(self, sim):
        self.actions, self.role_mask = sim.actions, sim.role_mask

    def action_probs(self, obs):
        return np.full((len(obs), len(self.actions)), 1.0 / len(self.actions))


def test_exact_values_agree_with_monte_carlo(sim, gt):
    tasks = np.arange(12)  # tasks are drawn uniformly: the mean value over them is the expected return
    for policy, sample in ((gt.static_policy(), False), (gt.oracle_policy(), False), (Uniform(sim), True)):
        exact = gt.policy_value(policy, tasks).value
        mc, se = _monte_carlo(sim, policy, tasks, 30_000, seed=3, sample=sample)
        assert abs(mc - exact) < 4 * se + 1e-3, (policy.name, mc, exact, se)


def test_the_policy_classes_are_ordered_task_by_task(sim, gt):
    oracle = gt.optimal_value().per_task[:, 0]
    blind, _ = gt.best_blind()
    plan, route, arm = (blind[k].per_task[:, 0] for k in ("best feedback-blind plan", "best one-step route",
                                                          "best single arm"))
    static = gt.policy_value(gt.static_policy()).per_task[:, 0]
    uniform = gt.policy_value(Uniform(sim)).per_task[:, 0]
    tol = 1e-9
    assert (oracle >= plan - tol).all() and (plan >= route - tol).all() and (route >= arm - tol).all()
    assert (arm >= -tol).all()  # stopping at once is an arm
    assert (oracle >= static - tol).all() and (oracle >= uniform - tol).all()


def test_the_feedback_is_worth_something_when_candidates_differ(config):
    # a near miss (repair it) or a timeout (write a new one): only the feedback tells which
    mixed = LoopGroundTruth(hand_sim(config, ["wrong_answer", "timeout"], [(9, 10), (0, 10)], difficulty=0.6))
    blind, _ = mixed.best_blind()
    assert mixed.optimal_value().value > blind["best feedback-blind plan"].value + 0.02
    # with one kind of candidate the feedback says nothing new: the best plan is the oracle
    same = LoopGroundTruth(hand_sim(config, ["wrong_answer"], [(9, 10)], difficulty=0.6))
    blind, _ = same.best_blind()
    assert same.optimal_value().value == pytest.approx(blind["best feedback-blind plan"].value)


class PlanPolicy:
    """Follows a fixed plan per task (action names), then stops: an open-loop policy."""

    name = "plan"

    def __init__(self, sim, plans):
        self.sim, self.actions, self.role_mask = sim, sim.actions, sim.role_mask
        self.plans = [[sim.actions.index(a) for a in p] for p in plans]

    def action_probs(self, obs):
        calls = obs.counts.sum(axis=1)
        out = np.zeros((len(obs), len(self.actions)))
        a = [self.plans[t][c] if c < len(self.plans[t]) else self.sim.stop for t, c in zip(obs.task, calls)]
        out[np.arange(len(obs)), a] = 1.0
        return out


def test_the_best_blind_plan_is_worth_what_backward_induction_says(sim, gt):
    blind, names = gt.best_blind()
    v = gt.policy_value(PlanPolicy(sim, names["plans"])).per_task
    np.testing.assert_allclose(v, blind["best feedback-blind plan"].per_task, atol=1e-9)
    routes = [(r[0], *[r[1]] * (sim.budget.calls - 1)) if len(r) > 1 else r for r in names["routes"]]
    v = gt.policy_value(PlanPolicy(sim, routes)).per_task  # a route repeats its follow-up until refused
    np.testing.assert_allclose(v, blind["best one-step route"].per_task, atol=1e-9)


def test_compare_reports_every_policy_with_regret_closure(sim, gt):
    test = np.arange(10)
    rows = {r["policy"]: r for r in gt.compare({"uniform": Uniform(sim)}, test)}
    assert set(rows) == {"static_table", "oracle", "best feedback-blind plan", "best one-step route",
                         "best single arm", "uniform"}
    assert rows["static_table"]["regret_closure"] == 0.0 and rows["oracle"]["regret_closure"] == 1.0
    vs, vo = rows["static_table"]["value"], rows["oracle"]["value"]
    assert rows["uniform"]["regret_closure"] == pytest.approx(regret_closure(rows["uniform"]["value"], vs, vo))
    for r in rows.values():
        assert 0 <= r["pass_rate"] <= 1 and r["mean_cost_usd"] >= 0 and r["calls_per_task"] <= sim.budget.calls


def test_policies_that_do_not_fit_are_refused(sim, gt, config):
    class Short(Uniform):
        def __init__(self, sim):
            super().__init__(sim)
            self.actions = sim.actions[:-1]

    with pytest.raises(ValueError, match="has actions"):
        gt.policy_value(Short(sim))

    class Bad(Uniform):
        def action_probs(self, obs):
            return np.ones((len(obs), len(self.actions)))

    with pytest.raises(ValueError, match="not summing to 1"):
        gt.policy_value(Bad(sim))
    escalation = ObsSpec(families=sim.families)  # a checkpoint of the other environment
    meta = CheckpointMeta("ppo", escalation.to_dict(), list(sim.actions), sim.role_mask.tolist(), head="greedy",
                          spec_kind="code_task")
    with pytest.raises(CheckpointError, match="env: 'escalation' != 'sage_loop'"):
        gt.policy_value(MLPPolicy(meta, [[(np.zeros((len(sim.actions), escalation.dim), np.float32),
                                           np.zeros(len(sim.actions), np.float32))]]))
    with pytest.raises(ValueError, match="not a reachable state"):
        gt.state_index(np.full((1, sim.n_calls), sim.budget.calls))


def test_a_smaller_budget_is_worth_less_to_the_oracle(config):
    tasks, df = synthetic_suite(20, seed=4)
    small = LoopGroundTruth(SageLoopSim.build(tasks, df, with_budget(config, calls=1))).optimal_value().value
    full = LoopGroundTruth(SageLoopSim.build(tasks, df, config)).optimal_value().value
    assert full > small > 0
    tight = config.model_copy(update={"budget": config.budget.model_copy(update={"seconds": 20.0})})
    sim = SageLoopSim.build(tasks, df, tight)
    gt = LoopGroundTruth(sim)
    assert (gt.counts @ sim.seconds <= 20.0 + 1e-9).all()  # only reachable states are enumerated


def test_the_learned_blind_plan_is_the_best_plan_per_family_and_difficulty_bin(sim, gt):
    every = np.arange(len(sim))
    pv = gt.plan_values(every)
    assert pv.plans[0] == () and pv.route[0] and pv.arm[0] and (pv.values[:, 0] == 0).all()  # stop at once
    # fitted and valued on the same tasks with one bin: per family, the plan with the best mean value there
    fitted = gt.learned_blind(every, every, bins=(1,))
    learned, info = fitted["learned feedback-blind plan"]
    expected = sum(pv.values[sim.family == f, :, 0].mean(axis=0).max() * (sim.family == f).sum()
                   for f in np.unique(sim.family)) / len(sim)
    assert info["bins"] == 1 and learned.value == pytest.approx(expected)
    route, _ = fitted["learned one-step route"]
    assert route.name == "learned one-step route" and route.value <= learned.value + 1e-12
    # a policy of the observation cannot beat the per-task optimum of its class, task by task
    best = gt.best_blind(every)[0]
    assert (learned.per_task[:, 0] <= best["best feedback-blind plan"].per_task[:, 0] + 1e-9).all()
    assert (route.per_task[:, 0] <= best["best one-step route"].per_task[:, 0] + 1e-9).all()
    # held-out tasks are valued with the plans fitted on the others; the bins are chosen by cross-validation
    held, info = gt.learned_blind(every[::2], every[1::2], bins=(1, 2))["learned feedback-blind plan"]
    assert len(held.per_task) == len(every[1::2]) and info["bins"] in (1, 2) and set(info["cv_value"]) == {1, 2}
    rows = {r["policy"]: r for r in gt.compare({}, every[1::2], train_idx=every[::2])}
    assert rows["learned feedback-blind plan"]["value"] == pytest.approx(held.value)


def test_plan_values_in_chunks_equal_one_enumeration(sim, gt, monkeypatch):
    import sage_pipeline.sim.loop_truth as lt

    whole = gt.plan_values()
    monkeypatch.setattr(lt, "CHUNK", 5)
    chunked = gt.plan_values()
    assert chunked.plans == whole.plans and (chunked.route == whole.route).all()
    np.testing.assert_allclose(chunked.values, whole.values, atol=1e-12)
