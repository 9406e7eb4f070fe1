"""The routing simulator's ground truth is exact: checked against Monte-Carlo and against
independent reference computations."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest
from pydantic import ValidationError

from sage_pipeline.routing.collector import simulate_episodes
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.policy import EpsilonGreedyPolicy, StaticTablePolicy, UniformPolicy, check_probs
from sage_pipeline.routing.reward import DatasetRewardSpec, RewardSpec
from sage_pipeline.routing.routing_simulator import RoutingSimulator, SimulatorConfig, Tasks
from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN, ROLE_INDEX, ROLES


@pytest.fixture(scope="module")
def tasks(sim) -> Tasks:
    return sim.sample_tasks(300, np.random.default_rng(11))


def make_ctx(rows: list[tuple[str, float, float, int, int]]) -> Contexts:
    """rows of (role, complexity, prompt_tokens, step, primary_failure_count); failure_count = step."""
    role, c, tok, step, pfc = zip(*rows)
    return Contexts(
        role=np.array([ROLE_INDEX[r] for r in role], dtype=np.int64),
        task_complexity_score=np.array(c, dtype=np.float64),
        prompt_tokens=np.array(tok, dtype=np.float64),
        step=np.array(step, dtype=np.int64),
        failure_count=np.array(step, dtype=np.int64),
        primary_failure_count=np.array(pfc, dtype=np.int64),
    )


# A few contexts that cover easy/hard tasks, retries, timeouts and context overflow.
CTX_ROWS = [
    ("coder", 0.35, 3000.0, 0, 0),
    ("debugger", 0.92, 9000.0, 2, 1),
    ("memory_optimizer", 0.5, 12000.0, 1, 1),  # llama-3.1-8b's 4k context overflows
    ("test_engineer", 0.7, 5000.0, 3, 2),
]
CTX_MODELS = ["gpt-4.1-mini", "claude-opus-4", "llama-3.1-8b", "qwen2.5-coder-32b"]


def reference_expected_reward(
    sim: RoutingSimulator, ctx: Contexts, action: np.ndarray, clamp: bool = True
) -> np.ndarray:
    """Scalar enumeration of every outcome (timeout / pass / fail, score k/10)."""
    spec = sim.config.reward
    pr = sim.outcome_probs(ctx, action)
    lo, hi = (REWARD_MIN, REWARD_MAX) if clamp else (-math.inf, math.inf)
    out = []
    for i in range(len(ctx)):
        a, step = int(action[i]), int(ctx.step[i])
        cost = float(sim.catalogue.cost_usd(np.array([a]), np.array([ctx.prompt_tokens[i]]))[0])

        def rew(r1: float, cost: float = cost) -> float:
            r1 = min(max(r1, lo), hi)
            if spec.version == "reward_v2":
                r1 = min(max(r1 - spec.cost_weight * cost, lo), hi)
            return r1

        tau, p = float(pr["p_timeout"][i]), float(pr["p_pass"][i])
        e = tau * rew(-spec.timeout_penalty - spec.retry_penalty * step)
        for passed, q, prob in (
            (True, pr["q_pass"][i], (1 - tau) * p),
            (False, pr["q_fail"][i], (1 - tau) * (1 - p)),
        ):
            for k in range(11):
                pk = math.comb(10, k) * q**k * (1 - q) ** (10 - k)
                r1 = (
                    k / 10
                    + (spec.verified_bonus if passed else -spec.failed_verification_penalty)
                    - spec.retry_penalty * step
                )
                e += prob * pk * rew(r1)
        out.append(e)
    return np.array(out)


REWARD_SPECS = {
    "v1": RewardSpec(),
    "v2": RewardSpec(version="reward_v2"),
    "v1_clamped": RewardSpec(timeout_penalty=3.0, retry_penalty=0.7),
    "v2_clamped": RewardSpec(version="reward_v2", cost_weight=50.0),
}


@pytest.mark.parametrize("spec_name", list(REWARD_SPECS))
def test_expected_reward_matches_exact_enumeration(spec_name, catalogue, table):
    sim = RoutingSimulator(catalogue, table, SimulatorConfig(reward=REWARD_SPECS[spec_name]))
    ctx = make_ctx(CTX_ROWS)
    action = np.array([catalogue.index[m] for m in CTX_MODELS])
    got = sim.expected_reward(ctx, action)
    np.testing.assert_allclose(got, reference_expected_reward(sim, ctx, action), rtol=0, atol=1e-12)


@pytest.mark.parametrize("spec_name", list(REWARD_SPECS))
def test_expected_reward_equals_monte_carlo_average(spec_name, catalogue, table):
    sim = RoutingSimulator(catalogue, table, SimulatorConfig(reward=REWARD_SPECS[spec_name]))
    ctx = make_ctx(CTX_ROWS)
    action = np.array([catalogue.index[m] for m in CTX_MODELS])
    exact = sim.expected_reward(ctx, action)
    n = 250_000
    big = ctx.take(np.repeat(np.arange(len(ctx)), n))
    out = sim.sample_outcome(big, np.repeat(action, n), np.random.default_rng(123))
    r = out["reward"].reshape(len(ctx), n)
    assert ((r >= REWARD_MIN) & (r <= REWARD_MAX)).all()
    mc, se = r.mean(axis=1), r.std(axis=1) / np.sqrt(n)
    assert se.max() < 2.5e-3
    assert (np.abs(mc - exact) < 4 * se + 1e-12).all(), (mc, exact, se)
    # the outcome frequencies match the outcome model as well
    pr = sim.outcome_probs(ctx, action)
    to = out["timed_out"].reshape(len(ctx), n).mean(axis=1)
    ver = out["verification_passed"].reshape(len(ctx), n).mean(axis=1)
    np.testing.assert_allclose(to, pr["p_timeout"], atol=4 * np.sqrt(0.25 / n))
    np.testing.assert_allclose(ver, (1 - pr["p_timeout"]) * pr["p_pass"], atol=4 * np.sqrt(0.25 / n))


def test_reward_v2_subtracts_cost_in_expectation(catalogue, table):
    ctx = make_ctx(CTX_ROWS)
    action = np.array([catalogue.index[m] for m in CTX_MODELS])
    v1 = RoutingSimulator(catalogue, table, SimulatorConfig(reward=RewardSpec())).expected_reward(ctx, action)
    v2 = RoutingSimulator(
        catalogue, table, SimulatorConfig(reward=RewardSpec(version="reward_v2"))
    ).expected_reward(ctx, action)
    cost = catalogue.cost_usd(action, ctx.prompt_tokens)
    # no outcome of these contexts is near the clamp, so v2 = v1 - 5 * cost exactly
    np.testing.assert_allclose(v2, v1 - 5.0 * cost, atol=1e-12)


def test_expected_reward_respects_the_clamp(catalogue, table):
    ctx = make_ctx(CTX_ROWS)
    action = np.array([catalogue.index[m] for m in CTX_MODELS])
    # every outcome is far below -2: the expectation is exactly -2
    sim = RoutingSimulator(catalogue, table, SimulatorConfig(reward=RewardSpec(retry_penalty=5.0)))
    ctx_late = make_ctx([(r, c, t, 3, p) for r, c, t, _, p in CTX_ROWS])
    np.testing.assert_array_equal(sim.expected_reward(ctx_late, action), np.full(4, -2.0))
    # every outcome is far above 2: exactly 2
    sim = RoutingSimulator(
        catalogue,
        table,
        SimulatorConfig(
            reward=RewardSpec(verified_bonus=5.0, failed_verification_penalty=-5.0, timeout_penalty=-5.0)
        ),
    )
    np.testing.assert_array_equal(sim.expected_reward(make_ctx(CTX_ROWS), action), np.full(4, 2.0))
    # partly clamped: the clamp applies per outcome, before the expectation
    sim = RoutingSimulator(catalogue, table, SimulatorConfig(reward=REWARD_SPECS["v1_clamped"]))
    got = sim.expected_reward(ctx, action)
    unclamped = reference_expected_reward(sim, ctx, action, clamp=False)
    assert (got >= REWARD_MIN).all() and (got <= REWARD_MAX).all()
    assert got[3] - unclamped[3] > 0.05  # step 3: timeouts and failures are clamped to -2
    np.testing.assert_allclose(got, reference_expected_reward(sim, ctx, action), atol=1e-12)


def test_expected_reward_refuses_non_candidate(sim, catalogue):
    ctx = make_ctx([("coder", 0.5, 3000.0, 0, 0), ("planner", 0.5, 3000.0, 0, 0)])
    action = np.array([catalogue.index["gpt-4.1"], catalogue.index["qwen2.5-coder-32b"]])
    with pytest.raises(
        ValueError,
        match=r"^model 'qwen2\.5-coder-32b' is not a candidate for role 'planner' "
        r"\(1 rows\)$",
    ):
        sim.expected_reward(ctx, action)


# ------------------------------------------------------------------ policy values
@dataclass(frozen=True)
class RandomTablePolicy:
    """A fixed random stochastic policy over (role, step, primary failures), masked."""

    actions: tuple[str, ...]
    role_mask: np.ndarray
    seed: int
    name: str = "random_table"

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        w = np.random.default_rng(self.seed).random((len(ROLES), 11, 11, len(self.actions))) ** 3
        p = w[ctx.role, np.minimum(ctx.step, 10), np.minimum(ctx.primary_failure_count, 10)]
        p = p * self.role_mask[ctx.role]
        return p / p.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class LeakyPolicy:
    actions: tuple[str, ...]
    role_mask: np.ndarray
    name: str = "leaky"

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        return np.full((len(ctx), len(self.actions)), 1.0 / len(self.actions))


def policies(sim: RoutingSimulator) -> dict:
    static = StaticTablePolicy(sim.table, sim.catalogue)
    out = {"static": static, "uniform": UniformPolicy(sim.actions, sim.role_mask)}
    for eps in (0.05, 0.3, 1.0):
        out[f"eps{eps}"] = EpsilonGreedyPolicy(static, eps)
    for seed in (1, 2):
        out[f"random{seed}"] = RandomTablePolicy(sim.actions, sim.role_mask, seed)
    return out


def test_policy_value_matches_simulated_episodes(sim, tasks):
    reps = 200  # 300 tasks x 200 = 60,000 episodes per policy
    big = Tasks(
        np.tile(tasks.role, reps),
        np.tile(tasks.task_complexity_score, reps),
        np.tile(tasks.prompt_tokens, reps),
    )
    for i, name in enumerate(("static", "eps0.3", "uniform", "random1")):
        pol = policies(sim)[name]
        exact = sim.policy_value(pol, tasks).mean
        rows = simulate_episodes(sim, big, pol, np.random.default_rng(100 + i))
        returns = np.bincount(rows["task"], weights=rows["reward"], minlength=len(big))
        assert np.bincount(rows["task"], minlength=len(big)).min() >= 1  # every episode has a decision
        se = returns.std() / np.sqrt(len(big))
        assert abs(returns.mean() - exact) < 3 * se, (name, returns.mean(), exact, se)
        assert se < 0.01


def test_policy_value_one_attempt_is_the_expected_reward(catalogue, table, tasks):
    sim = RoutingSimulator(catalogue, table, SimulatorConfig(max_attempts=1))
    static = StaticTablePolicy(table, catalogue)
    ctx = sim.contexts(tasks, np.zeros(len(tasks)), np.zeros(len(tasks)))
    want = sim.expected_reward(ctx, static.choose(ctx))
    np.testing.assert_allclose(sim.policy_value(static, tasks).per_task, want, atol=1e-12)
    q = sim.expected_reward(ctx.take(np.repeat(np.arange(len(ctx)), 0)), np.zeros(0, dtype=np.int64))
    assert q.shape == (0,)


def test_policy_value_two_attempts_by_hand(catalogue, table, tasks):
    """V = r(s0, a0) + P(fail) * r(s1, a1), with s1's primary failure count following a0."""
    sim = RoutingSimulator(catalogue, table, SimulatorConfig(max_attempts=2))
    static = StaticTablePolicy(table, catalogue)
    n = len(tasks)
    ctx0 = sim.contexts(tasks, np.zeros(n), np.zeros(n))
    a0 = static.choose(ctx0)
    pfc1 = (a0 == sim.primary[tasks.role]).astype(np.int64)
    ctx1 = sim.contexts(tasks, np.ones(n), pfc1)
    a1 = static.choose(ctx1)
    pr = sim.outcome_probs(ctx0, a0)
    p_fail = 1 - (1 - pr["p_timeout"]) * pr["p_pass"]
    want = sim.expected_reward(ctx0, a0) + p_fail * sim.expected_reward(ctx1, a1)
    np.testing.assert_allclose(sim.policy_value(static, tasks).per_task, want, atol=1e-12)
    np.testing.assert_array_equal(sim.continue_prob(ctx1, a1), np.zeros(n))


def test_optimal_value_dominates_every_policy_on_every_task(sim, tasks):
    opt = sim.optimal_value(tasks).per_task
    assert opt.shape == (len(tasks),)
    for name, pol in policies(sim).items():
        v = sim.policy_value(pol, tasks).per_task
        assert (opt >= v - 1e-9).all(), name
    static = sim.policy_value(policies(sim)["static"], tasks)
    # the default table leaves value on the table: the oracle strictly beats it on average
    assert sim.optimal_value(tasks).mean - static.mean > 0.02


def test_oracle_policy_is_optimal(sim, tasks):
    oracle = sim.oracle_policy()
    assert oracle.name == "oracle" and oracle.actions == sim.actions
    v = sim.policy_value(oracle, tasks)  # valued by one backward induction (its value is the optimum's) ...
    np.testing.assert_allclose(v.per_task, sim.optimal_value(tasks).per_task, rtol=0, atol=1e-12)
    # ... which its actions, valued as any other policy's, confirm
    by_actions = SimpleNamespace(name="oracle_by_actions", actions=oracle.actions, action_probs=oracle.action_probs)
    v_actions = sim.policy_value(by_actions, tasks)
    assert v_actions.name == "oracle_by_actions"
    np.testing.assert_allclose(v_actions.per_task, v.per_task, rtol=0, atol=1e-12)
    # its probabilities are valid one-hot rows on candidates
    ctx = sim.contexts(tasks, np.full(len(tasks), 2), np.ones(len(tasks)))
    probs = check_probs(oracle, ctx, oracle.action_probs(ctx))
    assert set(np.unique(probs).tolist()) == {0.0, 1.0}
    # and it picks the argmax of Q* at that (attempt, primary failures)
    q = sim.q_star(tasks)
    assert q.shape == (len(tasks), 4, 5, len(sim.actions))
    np.testing.assert_array_equal(probs.argmax(axis=1), q[:, 2, 1].argmax(axis=1))
    assert np.isneginf(q[~sim.role_mask[tasks.role][:, None, None, :].repeat(4, 1).repeat(5, 2)]).all()


def test_oracle_matches_simulation(sim, tasks):
    reps = 50
    big = Tasks(
        np.tile(tasks.role, reps),
        np.tile(tasks.task_complexity_score, reps),
        np.tile(tasks.prompt_tokens, reps),
    )
    rows = simulate_episodes(sim, big, sim.oracle_policy(), np.random.default_rng(5))
    returns = np.bincount(rows["task"], weights=rows["reward"], minlength=len(big))
    se = returns.std() / np.sqrt(len(big))
    assert abs(returns.mean() - sim.optimal_value(tasks).mean) < 3 * se


def test_policy_value_by_role(sim, tasks):
    v = sim.policy_value(policies(sim)["static"], tasks)
    by_role = v.by_role(tasks)
    assert set(by_role) == {ROLES[i] for i in np.unique(tasks.role)}
    for r, val in by_role.items():
        assert val == pytest.approx(v.per_task[tasks.role == ROLE_INDEX[r]].mean(), abs=1e-15)


def test_valuing_a_policy_with_mass_on_a_non_candidate_raises(sim, tasks):
    with pytest.raises(
        ValueError,
        match=r"^policy 'leaky' puts mass on a model that is not a candidate for the "
        r"role; the simulator cannot value it$",
    ):
        sim.policy_value(LeakyPolicy(sim.actions, sim.role_mask), tasks)


def test_policy_value_uses_reward_version(catalogue, table, tasks):
    static = StaticTablePolicy(table, catalogue)
    v1 = RoutingSimulator(catalogue, table).policy_value(static, tasks).per_task
    v2 = (
        RoutingSimulator(catalogue, table, SimulatorConfig(reward=RewardSpec(version="reward_v2")))
        .policy_value(static, tasks)
        .per_task
    )
    assert (v2 < v1).all()  # every call costs something


# ------------------------------------------------------------------ tasks, determinism
def test_sample_tasks_ranges_and_determinism(sim):
    a = sim.sample_tasks(5000, np.random.default_rng(3))
    b = sim.sample_tasks(5000, np.random.default_rng(3))
    for f in ("role", "task_complexity_score", "prompt_tokens"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f))
    assert a.role.dtype == np.int64 and set(np.unique(a.role).tolist()) == set(range(len(ROLES)))
    assert ((a.task_complexity_score >= 0) & (a.task_complexity_score <= 1)).all()
    assert a.prompt_tokens.min() >= 200 and a.prompt_tokens.max() <= 64000
    assert np.bincount(a.role).min() / 5000 > 0.09  # every role gets >= ~11% of tasks
    c = sim.sample_tasks(5000, np.random.default_rng(4))
    assert not np.array_equal(a.task_complexity_score, c.task_complexity_score)


def test_simulate_episodes_is_deterministic_and_well_formed(sim, tasks):
    pol = policies(sim)["eps0.3"]
    a = simulate_episodes(sim, tasks, pol, np.random.default_rng(9))
    b = simulate_episodes(sim, tasks, pol, np.random.default_rng(9))
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    T = sim.config.max_attempts
    assert a["step"].max() == T - 1 and (a["step"] > 0).any()
    # each task: steps 0..n-1, terminal exactly at the last, which passed or was the last attempt
    order = np.lexsort((a["step"], a["task"]))
    task, step, term, ver = (
        a["task"][order],
        a["step"][order],
        a["terminal"][order],
        a["verification_passed"][order],
    )
    last = np.r_[task[1:] != task[:-1], True]
    np.testing.assert_array_equal(term, last)
    assert (ver[last] | (step[last] == T - 1)).all()
    assert not ver[~last].any()
    assert np.unique(task).size == len(tasks)
    np.testing.assert_array_equal(a["failure_count"], a["step"])


def test_sample_outcome_is_seeded(sim, catalogue):
    ctx = make_ctx(CTX_ROWS * 50)
    action = np.array([catalogue.index[m] for m in CTX_MODELS * 50])
    a = sim.sample_outcome(ctx, action, np.random.default_rng(1))
    b = sim.sample_outcome(ctx, action, np.random.default_rng(1))
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])
    assert not a["reviewer_score"][a["timed_out"]].any()
    assert set(np.round(a["reviewer_score"] * 10, 9).tolist()) <= set(map(float, range(11)))


def test_simulator_config_validation():
    with pytest.raises(ValidationError, match=r"\nmax_attempts\n  Input should be greater than or equal to 1 "):
        SimulatorConfig(max_attempts=0)
    with pytest.raises(ValidationError, match=r"\nmax_attempts\n  Input should be less than or equal to 10 "):
        SimulatorConfig(max_attempts=11)
    with pytest.raises(ValidationError, match=r"\nversion\n  Input should be 'reward_v1' or 'reward_v2' .*'reward_v9'"):
        RewardSpec(version="reward_v9")
    with pytest.raises(ValidationError, match=r"\ncost_weight\n  Input should be greater than or equal to 0 "):
        RewardSpec(cost_weight=-1)
    with pytest.raises(ValidationError, match=r"\nverified_bonus\n  Extra inputs are not permitted"):
        DatasetRewardSpec(verified_bonus=1.0)  # a dataset chooses the version and the cost weight only


def test_binary_oracle_is_the_best_primary_or_fallback_policy(sim, tasks, catalogue, table):
    from sage_pipeline.routing.action_space import ActionSpace

    space = ActionSpace.build(table, [(r, m) for r in ROLES for m in catalogue.candidates(r)], catalogue)
    binary = space.binary().mask
    full, best_binary = sim.optimal_value(tasks).per_task, sim.optimal_value(tasks, binary).per_task
    static = sim.policy_value(StaticTablePolicy(table, catalogue), tasks).per_task
    # restricted to primary/fallback the optimum can only be worse, and never below the table (one of them)
    assert (best_binary <= full + 1e-12).all() and (best_binary >= static - 1e-12).all()
    assert best_binary.mean() < full.mean()  # the catalogue has better third models for some tasks
    oracle = sim.oracle_policy(binary)
    ctx = sim.contexts(tasks, np.zeros(len(tasks), dtype=np.int64), np.zeros(len(tasks), dtype=np.int64))
    probs = check_probs(oracle, ctx, oracle.action_probs(ctx))
    assert (probs[~binary[ctx.role]] == 0).all()
    assert sim.policy_value(oracle, tasks).per_task == pytest.approx(best_binary)
    by_actions = SimpleNamespace(name="by_actions", actions=oracle.actions, action_probs=oracle.action_probs)
    assert sim.policy_value(by_actions, tasks).per_task == pytest.approx(best_binary)


def test_simulator_refuses_a_table_with_other_roles(catalogue):
    from sage_pipeline.sage.table import RoutingTable

    t = RoutingTable.from_dict({"routing": {"shell_chat": {"primary": "gpt-4.1", "fallback": "gpt-4.1"}}},
                               source="sage.yaml")
    with pytest.raises(ValueError, match="the table sage.yaml routes shell_chat"):
        RoutingSimulator(catalogue, t)


def test_values_in_chunks_equal_one_backward_pass(sim, tasks, monkeypatch):
    """policy_value / optimal_value value VALUE_CHUNK tasks at a time (bounded memory on
    large logs); every task's induction is its own, so the values are the same."""
    import sage_pipeline.routing.routing_simulator as simulator

    static = StaticTablePolicy(sim.table, sim.catalogue)
    eps = EpsilonGreedyPolicy(static, 0.3)
    whole = {"static": sim.policy_value(static, tasks).per_task, "eps": sim.policy_value(eps, tasks).per_task,
             "oracle": sim.optimal_value(tasks).per_task, "q": sim._backward(tasks, None)[1]}
    monkeypatch.setattr(simulator, "VALUE_CHUNK", 37)
    np.testing.assert_array_equal(sim.policy_value(static, tasks).per_task, whole["static"])
    np.testing.assert_array_equal(sim.policy_value(eps, tasks).per_task, whole["eps"])
    np.testing.assert_array_equal(sim.optimal_value(tasks).per_task, whole["oracle"])
    np.testing.assert_array_equal(whole["oracle"], whole["q"])
    assert len(whole["static"]) == len(tasks) == 300


def test_the_recorded_configs_are_written_as_before():
    """The collector's manifest records SimulatorConfig.to_dict() and datasets record the
    RewardSpec as JSON: byte for byte what the dataclasses wrote, so existing readers and
    existing files agree."""
    assert json.dumps(SimulatorConfig().to_dict()) == (
        '{"max_attempts": 4, "sharpness": 8.0, "bias": 0.0, "retry_gain": 0.3, "context_penalty": 1.5, '
        '"prompt_growth_tokens": 800, "tokens_sigma": 0.6, "reward": {"version": "reward_v1", "verified_bonus": 0.25, '
        '"failed_verification_penalty": 0.15, "timeout_penalty": 0.5, "retry_penalty": 0.1, "cost_weight": 5.0}}')
    raw = SimulatorConfig(max_attempts=3, reward=RewardSpec(version="reward_v2")).to_dict()
    assert SimulatorConfig(**json.loads(json.dumps(raw))) == SimulatorConfig(max_attempts=3,
                                                                              reward=RewardSpec(version="reward_v2"))
