"""Ground truth of the code-task simulator: exact values against Monte Carlo and against an
independent scalar recursion; the oracle is optimal; bad policies are refused."""

from __future__ import annotations

from functools import cache

import numpy as np
import pytest

from sage_pipeline.routing.policy import sample_actions
from sage_pipeline.sim.env import PASS, CodeTaskSim, CodeTaskVecEnv, SimConfig
from sage_pipeline.sim.ground_truth import CHANNELS, GroundTruth, regret_closure
from sage_pipeline.sim.obs import LAST_OUTCOMES
from sage_pipeline_tests.sim.synthetic import synthetic_suite


@pytest.fixture(scope="module")
def sim(catalogue, table):
    return CodeTaskSim.build(*synthetic_suite(40, seed=2), catalogue, table)


@pytest.fixture(scope="module")
def gt(sim):
    return GroundTruth(sim)


class UniformPolicy:
    name = "uniform"

    def __init__(self, sim):
        self.actions, self.role_mask = sim.actions, sim.role_mask

    def action_probs(self, obs):
        return np.full((len(obs), len(self.actions)), 1.0 / len(self.actions))


class LookupPolicy:
    """A stochastic policy that depends on every observed state variable (and the task)."""

    name = "lookup"

    def __init__(self, sim, seed):
        self.actions, self.role_mask = sim.actions, sim.role_mask
        T = sim.config.max_attempts
        self.table = np.random.default_rng(seed).dirichlet(np.ones(len(sim.actions)),
                                                            size=(len(sim), T, T, len(LAST_OUTCOMES)))

    def action_probs(self, obs):
        return self.table[obs.task, obs.step, obs.primary_failure_count, obs.last_outcome]


def monte_carlo(sim, policy, episodes_per_env=60, n_envs=2000, seed=0):
    """Mean return, pass indicator and cost per episode, by simulation (tasks drawn uniformly)."""
    env = CodeTaskVecEnv(sim, n_envs=n_envs, seed=seed)
    rng = np.random.default_rng(seed + 1)
    ret, passed, cost = np.zeros(n_envs), np.zeros(n_envs), np.zeros(n_envs)
    out = {"return": [], "pass_rate": [], "cost_usd": []}
    while len(out["return"]) < episodes_per_env * n_envs:
        a = sample_actions(policy.action_probs(env.observe()), rng)
        _, r, done, _, info = env.step(a)
        ret += r
        passed += info["passed"]
        cost += info["cost_usd"]
        out["return"] += ret[done].tolist()
        out["pass_rate"] += passed[done].tolist()
        out["cost_usd"] += cost[done].tolist()
        ret[done] = passed[done] = cost[done] = 0.0
    return {k: np.asarray(v) for k, v in out.items()}


@pytest.mark.parametrize("which", ["static_table", "uniform", "oracle", "lookup"])
def test_exact_values_match_monte_carlo(sim, gt, which):
    policy = {"static_table": gt.static_policy(), "uniform": UniformPolicy(sim), "oracle": gt.oracle_policy(),
              "lookup": LookupPolicy(sim, seed=0)}[which]
    exact = gt.optimal_value() if which == "oracle" else gt.policy_value(policy)
    mc = monte_carlo(sim, policy)
    for channel in ("return", "pass_rate", "cost_usd"):
        x = mc[channel]
        se = x.std() / np.sqrt(len(x))
        assert abs(x.mean() - exact.mean(channel)) < 4.5 * se + 1e-9, (channel, x.mean(),
                                                                       exact.mean(channel), se)


def _scalar_values(sim, i, policy):
    """An independent recursion over one task, state by state in plain Python (optimal when
    ``policy`` is None): what the vectorised backward induction must reproduce."""
    T, n_models = sim.config.max_attempts, sim.stop
    task = np.array([i])

    @cache
    def v(t, pfc, last):
        qs = []
        for a in range(n_models):
            m, s, lst = np.array([a]), np.array([t]), np.array([last])
            pk = sim.kind_probs(task, m, s, lst)[0]
            cost, lat = sim.call_cost(task, m, s)
            q = 0.0
            for k, p in enumerate(pk):
                if p == 0.0:
                    continue
                r = sim.reward(np.array([k]), s, cost, lat)[0]
                cont = v(t + 1, pfc + (a == sim.primary), k) if k != PASS and t + 1 < T else 0.0
                q += p * (r + cont)
            qs.append(q)
        qs.append(0.0)  # stop
        if policy is None:
            return max(qs)
        probs = policy.action_probs(sim.observe(task, t, pfc, last))[0]
        return float(np.dot(probs, qs))

    return v(0, 0, 0)


def test_backward_induction_matches_a_scalar_recursion(sim, gt):
    idx = np.arange(0, len(sim), 7)
    pol = LookupPolicy(sim, seed=1)
    exact = gt.policy_value(pol, idx).per_task[:, 0]
    opt = gt.optimal_value(idx).per_task[:, 0]
    static = gt.policy_value(gt.static_policy(), idx).per_task[:, 0]
    for j, i in enumerate(idx):
        assert exact[j] == pytest.approx(_scalar_values(sim, i, pol), abs=1e-10)
        assert opt[j] == pytest.approx(_scalar_values(sim, i, None), abs=1e-10)
        assert static[j] == pytest.approx(_scalar_values(sim, i, gt.static_policy()), abs=1e-10)


def test_the_oracle_is_optimal_and_consistent(sim, gt):
    opt = gt.optimal_value().per_task[:, 0]
    for p in (gt.static_policy(), UniformPolicy(sim), *(LookupPolicy(sim, s) for s in range(5))):
        assert (gt.policy_value(p).per_task[:, 0] <= opt + 1e-12).all()
    np.testing.assert_allclose(gt.policy_value(gt.oracle_policy()).per_task, gt.optimal_value().per_task)
    assert opt.mean() > gt.policy_value(gt.static_policy()).value  # there is regret to close


def test_stop_is_optimal_when_no_model_can_pass(catalogue, table):
    tasks, df = synthetic_suite(12, seed=3)
    sim = CodeTaskSim.build(tasks, df, catalogue, table, SimConfig(bias=-30.0))  # nothing is ever correct
    gt = GroundTruth(sim)
    np.testing.assert_allclose(gt.optimal_value().per_task, 0.0)  # stop at once: reward 0, no calls
    static = gt.policy_value(gt.static_policy())
    assert static.value < 0 and static.mean("pass_rate") < 1e-9
    assert static.mean("calls") == pytest.approx(sim.config.max_attempts)


def test_regret_closure_and_summary_rows(sim, gt):
    assert regret_closure(1.0, 0.5, 1.5) == 0.5 and np.isnan(regret_closure(1.0, 1.0, 1.0))
    rows = gt.compare({"uniform": UniformPolicy(sim)})
    assert [r["policy"] for r in rows] == ["static_table", "oracle", "uniform"]
    assert rows[0]["regret_closure"] == 0.0 and rows[1]["regret_closure"] == 1.0
    assert set(rows[2]) >= {"value", "pass_rate", "mean_cost_usd", "mean_latency_s", "calls_per_task"}
    assert len(CHANNELS) == gt.optimal_value().per_task.shape[1]


def test_a_policy_with_other_actions_or_bad_probabilities_is_refused(sim, gt):
    bad = UniformPolicy(sim)
    bad.actions = sim.actions[:-1]
    with pytest.raises(ValueError, match="has actions"):
        gt.policy_value(bad)

    class Broken(UniformPolicy):
        def action_probs(self, obs):
            return np.ones((len(obs), len(self.actions)))

    with pytest.raises(ValueError, match="not summing to 1"):
        gt.policy_value(Broken(sim))


def test_values_depend_on_the_reward_version(sim):
    v1 = SimConfig(**sim.config.model_dump() | {"reward": {"version": "reward_v1"}, "latency_weight": 0.0})
    gt1 = GroundTruth(CodeTaskSim(sim.tasks, sim.outcomes, sim.catalogue, sim.table, v1))
    gt2 = GroundTruth(sim)
    # without cost and latency penalties the oracle is worth more and calls the strongest models more
    assert gt1.optimal_value().value > gt2.optimal_value().value
    assert gt1.optimal_value().mean("cost_usd") > gt2.optimal_value().mean("cost_usd")
