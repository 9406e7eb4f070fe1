"""Off-policy evaluation: hand-computed examples, identities, bad input, and unbiasedness
and coverage against the routing simulator's exact ground truth."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from sage_pipeline.rl import ope
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.collector import CollectorConfig, collect, simulate_episodes
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.policy import EpsilonGreedyPolicy, StaticTablePolicy, UniformPolicy
from sage_pipeline.routing.routing_simulator import RoutingSimulator, Tasks
from sage_pipeline.sage.table import RoutingTable

# ---------------------------------------------------------------- a tiny bandit, by hand
# w = pi_e(a|x) / pscore = [1/0.5, 0.5/0.5, 0.25/0.8, 1/0.2] = [2, 1, 0.3125, 5]
REWARD = np.array([1.0, 0.0, 2.0, 1.0])
ACTION = np.array([0, 1, 0, 1])
PSCORE = np.array([0.5, 0.5, 0.8, 0.2])
PI = np.array([[1.0, 0.0], [0.5, 0.5], [0.25, 0.75], [0.0, 1.0]])
Q_HAT = np.array([[0.5, 1.0], [0.2, 0.4], [1.0, 0.0], [0.0, 0.6]])
# q_hat(x, pi) = [0.5, 0.3, 0.25, 0.6], sum 1.65; q_hat(x, a) = [0.5, 0.4, 1.0, 0.6]
# w (r - q_hat(x, a)) = [1.0, -0.4, 0.3125, 2.0], sum 2.9125; sum w = 8.3125; sum w r = 7.625


def test_bandit_estimators_match_hand_computation() -> None:
    assert ope.ips(REWARD, ACTION, PSCORE, PI).value == pytest.approx(7.625 / 4)
    assert ope.ips(REWARD, ACTION, PSCORE, PI, lambda_=3.0).value == pytest.approx((2 + 0 + 0.625 + 3) / 4)
    assert ope.snips(REWARD, ACTION, PSCORE, PI).value == pytest.approx(7.625 / 8.3125)
    assert ope.dm(PI, Q_HAT).value == pytest.approx(1.65 / 4)
    assert ope.dr(REWARD, ACTION, PSCORE, PI, Q_HAT).value == pytest.approx((1.65 + 2.9125) / 4)
    assert ope.sndr(REWARD, ACTION, PSCORE, PI, Q_HAT).value == pytest.approx(1.65 / 4 + 2.9125 / 8.3125)
    # lambda_ = 3 drops the last row's correction (w = 5): (1.65 + 1.0 - 0.4 + 0.3125) / 4
    assert ope.switch_dr(REWARD, ACTION, PSCORE, PI, Q_HAT, lambda_=3.0).value == pytest.approx(2.5625 / 4)
    assert ope.switch_dr(REWARD, ACTION, PSCORE, PI, Q_HAT).value == pytest.approx((1.65 + 2.9125) / 4)


def test_round_rewards_average_to_the_estimate() -> None:
    for est in (ope.ips(REWARD, ACTION, PSCORE, PI), ope.snips(REWARD, ACTION, PSCORE, PI),
                ope.dm(PI, Q_HAT), ope.dr(REWARD, ACTION, PSCORE, PI, Q_HAT),
                ope.sndr(REWARD, ACTION, PSCORE, PI, Q_HAT),
                ope.switch_dr(REWARD, ACTION, PSCORE, PI, Q_HAT)):
        assert est.round_rewards.shape == (4,)
        assert est.round_rewards.mean() == pytest.approx(est.value), est.name
        if est.ratio is not None:
            r = est.ratio
            assert (r.num.sum(axis=0) / r.den.sum(axis=0)).sum() == pytest.approx(est.value), est.name


def test_ips_equals_dr_when_q_hat_is_zero() -> None:
    rng = np.random.default_rng(3)
    n, k = 500, 5
    pi = rng.dirichlet(np.ones(k), n)
    pb = rng.dirichlet(np.ones(k), n)
    a = np.array([rng.choice(k, p=p) for p in pb])
    r = rng.normal(size=n)
    zero = np.zeros((n, k))
    assert ope.dr(r, a, pb[np.arange(n), a], pi, zero).value == ope.ips(r, a, pb[np.arange(n), a], pi).value
    np.testing.assert_array_equal(ope.dr(r, a, pb[np.arange(n), a], pi, zero).round_rewards,
                                  ope.ips(r, a, pb[np.arange(n), a], pi).round_rewards)


# ---------------------------------------------------------------- multi-step, by hand
# episode A: steps 0, 1 with rho = [1/0.5, 0.25/0.5] = [2, 0.5], so W = [2, 1]
# episode B: step 0 with rho = 0.25/0.5 = 0.5
# rows deliberately out of order: A1, B0, A0; every reward is 1
EP = np.array(["A", "B", "A"])
STEP = np.array([1, 0, 0])
R_EP = np.array([1.0, 1.0, 1.0])
P_EP = np.array([0.5, 0.5, 0.5])
PI_EP = np.array([0.25, 0.25, 1.0])


def test_pdis_matches_hand_computation() -> None:
    est = ope.pdis(R_EP, P_EP, PI_EP, EP, STEP)
    # A: 1 * 2 + 1 * 1 = 3 (trajectory-wise IS would give W_1 (1 + 1) = 2); B: 1 * 0.5
    np.testing.assert_allclose(est.round_rewards, [3.0, 0.5])
    assert est.value == pytest.approx(1.75)
    # gamma = 0.5: A: 2 + 0.5 * 1 = 2.5; B: 0.5
    assert ope.pdis(R_EP, P_EP, PI_EP, EP, STEP, gamma=0.5).value == pytest.approx(1.5)


def test_step_dr_matches_hand_computation() -> None:
    q = np.array([0.8, 0.9, 0.5])  # q_hat(s_t, a_t) of A1, B0, A0
    v = np.array([0.4, 0.7, 0.6])  # v_hat(s_t)
    est = ope.step_dr(R_EP, P_EP, PI_EP, q, v, EP, STEP)
    # A: t0: W_0 (1 - 0.5) + 1 * 0.6 = 1.6; t1: W_1 (1 - 0.8) + W_0 * 0.4 = 0.2 + 0.8 = 1.0 -> 2.6
    # B: 0.5 (1 - 0.9) + 0.7 = 0.75
    np.testing.assert_allclose(est.round_rewards, [2.6, 0.75])
    assert est.value == pytest.approx(1.675)
    # gamma = 0.5: A: 1.6 + 0.5 * 1.0 = 2.1
    discounted = ope.step_dr(R_EP, P_EP, PI_EP, q, v, EP, STEP, gamma=0.5)
    np.testing.assert_allclose(discounted.round_rewards, [2.1, 0.75])
    zero = np.zeros(3)
    np.testing.assert_allclose(ope.step_dr(R_EP, P_EP, PI_EP, zero, zero, EP, STEP).round_rewards,
                               ope.pdis(R_EP, P_EP, PI_EP, EP, STEP).round_rewards)


def test_step_wdr_matches_hand_computation() -> None:
    q = np.array([0.8, 0.9, 0.5])  # as in the step-wise DR example
    v = np.array([0.4, 0.7, 0.6])
    est = ope.step_wdr(R_EP, P_EP, PI_EP, q, v, EP, STEP)
    # W: A [2, 1], B [0.5, 0.5 (its weight stays past its end)]; W_prev: A [1, 2], B [1, 0.5]
    # t0: (2 (1 - 0.5) + 0.5 (1 - 0.9)) / 2.5 + (0.6 + 0.7) / 2 = 0.42 + 0.65
    # t1: (1 (1 - 0.8) + 0) / 1.5 + (2 * 0.4 + 0) / 2.5 = 0.1333 + 0.32
    assert est.value == pytest.approx(0.42 + 0.65 + 0.2 / 1.5 + 0.32)
    # per-episode terms use the full sample's normalisers: A 0.8 + 0.6 + 0.2 * 4/3 + 0.8 * 0.8, B 0.04 + 0.7
    np.testing.assert_allclose(est.round_rewards, [0.8 + 0.6 + 0.8 / 3 + 0.64, 0.74])
    r = est.ratio
    assert r.empty_is_zero and (r.num.sum(axis=0) / r.den.sum(axis=0)).sum() == pytest.approx(est.value)


def test_step_wdr_on_policy_is_step_dr_and_one_step_without_a_model_is_snips() -> None:
    rng = np.random.default_rng(5)
    n = 400
    ep = np.repeat(np.arange(n // 2), 2).astype(str)
    st = np.tile([0, 1], n // 2)
    r, q, v, p = rng.normal(size=n), rng.normal(size=n), rng.normal(size=n), rng.uniform(0.1, 1.0, n)
    # every ratio 1: every step's weights sum to the number of episodes, so WDR is step-wise DR
    assert ope.step_wdr(r, p, p, q, v, ep, st).value == pytest.approx(ope.step_dr(r, p, p, q, v, ep, st).value)
    # one-step episodes, no model: sum(w r) / sum(w), i.e. SNIPS
    a = rng.integers(0, 2, n)
    pi = np.column_stack([np.full(n, 0.3), np.full(n, 0.7)])
    pi_logged = pi[np.arange(n), a]
    zero = np.zeros(n)
    wdr = ope.step_wdr(r, p, pi_logged, zero, zero, np.arange(n).astype(str), np.zeros(n, dtype=np.int64))
    assert wdr.value == pytest.approx(ope.snips(r, a, p, pi).value)


def test_one_huge_weight_moves_wdr_by_its_share_not_by_its_weight() -> None:
    # 1,000 one-step episodes with rewards in [0, 1] and no model; one has weight 10,000
    rng = np.random.default_rng(2)
    n = 1000
    r = rng.uniform(0.0, 1.0, n)
    r[0] = 0.9
    p, pi_logged = np.full(n, 0.5), np.full(n, 0.5)
    p[0] = 1e-4
    ep, st, zero = np.arange(n).astype(str), np.zeros(n, dtype=np.int64), np.zeros(n)
    dr_, wdr = (f(r, p, pi_logged, zero, zero, ep, st).value for f in (ope.step_dr, ope.step_wdr))
    assert dr_ == pytest.approx((5000 * 0.9 + r[1:].sum()) / n) and dr_ > 4.0  # weight / n times its reward
    assert 0.0 <= wdr <= 1.0 and wdr == pytest.approx((5000 * r[0] + r[1:].sum()) / (5000 + n - 1))


def test_step_dr_clip_matches_hand_computation_and_is_step_dr_unclipped() -> None:
    q = np.array([0.8, 0.9, 0.5])  # as in the step-wise DR example: W = A [2, 1], B [0.5]
    v = np.array([0.4, 0.7, 0.6])
    # telescoped: A: v0 + W_0 (r_0 + v_1 - q_0) + W_1 (r_1 - q_1) = 0.6 + 2 (1 + 0.4 - 0.5) + 1 (1 - 0.8) = 2.6
    # B: 0.7 + 0.5 (1 - 0.9) = 0.75 (step-wise DR's terms); clip 1.5: A's W_0 becomes 1.5 -> 2.15
    np.testing.assert_allclose(ope.step_dr_clip(R_EP, P_EP, PI_EP, q, v, EP, STEP, clip=np.inf).round_rewards,
                               ope.step_dr(R_EP, P_EP, PI_EP, q, v, EP, STEP).round_rewards)
    est = ope.step_dr_clip(R_EP, P_EP, PI_EP, q, v, EP, STEP, clip=1.5)
    np.testing.assert_allclose(est.round_rewards, [0.6 + 1.5 * 0.9 + 0.2, 0.75])
    # gamma = 0.5: A: 0.6 + 2 (1 + 0.5 * 0.4 - 0.5) + 0.5 * 1 (1 - 0.8) = 2.1, as step-wise DR
    np.testing.assert_allclose(ope.step_dr_clip(R_EP, P_EP, PI_EP, q, v, EP, STEP, gamma=0.5, clip=np.inf)
                               .round_rewards, [2.1, 0.75])
    with pytest.raises(ValueError, match="clip must be >= 1"):
        ope.step_dr_clip(R_EP, P_EP, PI_EP, q, v, EP, STEP, clip=0.5)
    with pytest.raises(ValueError, match="clip_factor"):
        ope.OPEConfig(clip_factor=0.0)
    # the level: clip_factor times the largest single-decision weight the logs allow
    assert ope.clip_level(np.array([0.85, 0.15, 0.5]), 1.0) == pytest.approx(1 / 0.15)
    assert ope.clip_level(np.array([0.85, 0.15])) == pytest.approx(ope.OPEConfig().clip_factor / 0.15)
    assert ope.OPEConfig().clip_factor == 1.5  # binary logs (p = 0.15): one off-table decision whole, two capped
    assert ope.clip_level(np.array([0.85, 0.15]), 3.0) == pytest.approx(20.0)


def test_clipping_bounds_one_episode_and_keeps_the_truth_when_the_model_is_exact() -> None:
    # 2,000 two-step episodes; the behaviour takes the evaluated action with p = 0.15 at each
    # step, the evaluated policy always takes it; rewards r_t ~ Bernoulli(0.6) whatever the
    # action, so the exact Q is 0.6 + 0.6 at step 0 and 0.6 at step 1, and the truth is 1.2
    rng = np.random.default_rng(11)
    m = 2000
    ep, st = np.repeat(np.arange(m), 2).astype(str), np.tile([0, 1], m)
    took = rng.uniform(size=2 * m) < 0.15
    p = np.where(took, 0.15, 0.85)
    pi_logged = took.astype(float)
    r = (rng.uniform(size=2 * m) < 0.6).astype(float)
    q = np.where(st == 0, 1.2, 0.6)
    v = q
    clipped = ope.step_dr_clip(r, p, pi_logged, q, v, ep, st, clip=10.0)
    plain = ope.step_dr(r, p, pi_logged, q, v, ep, st)
    assert abs(clipped.value - 1.2) < 4 * clipped.round_rewards.std() / np.sqrt(m)
    assert clipped.round_rewards.std() < plain.round_rewards.std()
    # one episode's residuals count at most 10 times, whatever its weight: (44.4 here)
    assert np.abs(clipped.round_rewards - 1.2).max() <= 10 * (1.0 + 0.6) + 1e-9


def test_step_wdr_bootstrap_recomputes_every_steps_ratio() -> None:
    # constant rewards and no model: every resample's WDR is exactly 2 * 0.7 (two steps)
    rng = np.random.default_rng(1)
    m = 200
    ep, st = np.repeat(np.arange(m), 2).astype(str), np.tile([0, 1], m)
    p, pi_logged, zero = rng.uniform(0.2, 1.0, 2 * m), rng.uniform(0.0, 1.0, 2 * m), np.zeros(2 * m)
    est = ope.step_wdr(np.full(2 * m, 0.7), p, pi_logged, zero, zero, ep, st)
    ci = ope.bootstrap_ci(est, n_boot=200)
    assert est.value == pytest.approx(1.4) and ci.low == pytest.approx(1.4) and ci.high == pytest.approx(1.4)
    # a policy that never takes a logged action after step 0: step 1 has no weight and adds 0
    pi_logged[st == 1] = 0.0
    est = ope.step_wdr(np.full(2 * m, 0.7), p, pi_logged, zero, zero, ep, st)
    ci = ope.bootstrap_ci(est, n_boot=200)
    assert est.value == pytest.approx(0.7) and ci.low == pytest.approx(0.7) and ci.high == pytest.approx(0.7)


def test_incomplete_episode_is_an_error_naming_it() -> None:
    with pytest.raises(ValueError, match=r"episode 'A' has steps \[0, 2\].*episode_complete"):
        ope.pdis(np.zeros(3), np.ones(3), np.ones(3), np.array(["A", "A", "B"]), np.array([0, 2, 0]))
    with pytest.raises(ValueError, match=r"episode 'A' has steps \[0, 0\]"):
        ope.pdis(np.zeros(2), np.ones(2), np.ones(2), np.array(["A", "A"]), np.array([0, 0]))


# ---------------------------------------------------------------- bootstrap and ESS
def test_bootstrap_percentile_interval() -> None:
    ci = ope.bootstrap_ci(np.full(10, 3.0), n_boot=50)
    assert (ci.low, ci.high, ci.se) == (3.0, 3.0, 0.0)
    x = np.random.default_rng(0).normal(1.0, 1.0, 400)
    a, b = ope.bootstrap_ci(x, seed=1), ope.bootstrap_ci(x, seed=1)
    assert a == b and a != ope.bootstrap_ci(x, seed=2)
    assert a.low < x.mean() < a.high
    assert a.se == pytest.approx(x.std() / np.sqrt(len(x)), rel=0.15)
    assert a.high - a.low == pytest.approx(2 * 1.96 * a.se, rel=0.15)


def test_bootstrap_groups_resample_whole_groups() -> None:
    x = np.random.default_rng(0).normal(size=50)
    # every value twice, grouped in pairs: the same as resampling the 50 values
    twice = ope.bootstrap_ci(np.repeat(x, 2), seed=4, groups=np.repeat(np.arange(50), 2))
    assert twice == ope.bootstrap_ci(x, seed=4)


def test_bootstrap_recomputes_self_normalised_ratios() -> None:
    # a constant reward makes SNIPS exactly that constant on every resample, so its interval
    # has no width; obp's bootstrap of the round rewards r w / mean(w) (the full sample's
    # mean weight frozen) would report a wide one
    rng = np.random.default_rng(0)
    n = 300
    a = rng.integers(0, 2, n)
    pi = np.tile([0.9, 0.1], (n, 1))
    est = ope.snips(np.full(n, 0.7), a, np.full(n, 0.5), pi)
    ci = ope.bootstrap_ci(est, n_boot=200)
    assert est.value == pytest.approx(0.7)
    assert ci.low == pytest.approx(0.7) and ci.high == pytest.approx(0.7)
    frozen = ope.bootstrap_ci(est.round_rewards, n_boot=200)
    assert frozen.high - frozen.low > 0.1


def test_kish_ess() -> None:
    assert ope.kish_ess(np.ones(4)) == 4.0
    assert ope.kish_ess(np.array([3.0, 0.0, 0.0, 0.0])) == 1.0
    assert ope.kish_ess(np.array([2.0, 2.0, 0.0, 0.0])) == 2.0
    assert ope.kish_ess(np.zeros(3)) == 0.0


# ---------------------------------------------------------------- bad input
def test_bad_bandit_input_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="empty dataset"):
        ope.ips(np.array([]), np.array([], dtype=int), np.array([]), np.zeros((0, 2)))
    with pytest.raises(ValueError, match=r"propensity is 0\.0 at row 2"):
        ope.ips(REWARD, ACTION, np.array([0.5, 0.5, 0.0, 0.2]), PI)
    with pytest.raises(ValueError, match=r"propensity is missing in 1 rows, first at row 1"):
        ope.dr(REWARD, ACTION, np.array([0.5, np.nan, 0.8, 0.2]), PI, Q_HAT)
    with pytest.raises(ValueError, match=r"reward is NaN or infinite in 1 rows, first at row 3"):
        ope.snips(np.array([1.0, 0.0, 2.0, np.nan]), ACTION, PSCORE, PI)
    with pytest.raises(ValueError, match="action has 3 rows, reward has 4"):
        ope.ips(REWARD, ACTION[:3], PSCORE, PI)
    with pytest.raises(ValueError, match=r"action_dist must have shape \(n_rounds=4"):
        ope.ips(REWARD, ACTION, PSCORE, PI[:3])
    with pytest.raises(ValueError, match="q_hat has shape"):
        ope.dr(REWARD, ACTION, PSCORE, PI, Q_HAT[:, :1])
    with pytest.raises(ValueError, match="q_hat is NaN"):
        ope.dm(PI, np.where(Q_HAT == 0.4, np.nan, Q_HAT))
    with pytest.raises(ValueError, match="action_dist rows must sum to 1; row 0"):
        ope.ips(REWARD, ACTION, PSCORE, PI * 0.9)
    with pytest.raises(ValueError, match="integer"):
        ope.ips(REWARD, ACTION.astype(float), PSCORE, PI)
    with pytest.raises(ValueError, match="outside 0..1"):
        ope.ips(REWARD, np.array([0, 1, 2, 1]), PSCORE, PI)
    with pytest.raises(ope.NoSupportError, match="no mass on any logged action"):
        ope.snips(REWARD, ACTION, PSCORE, np.tile([0.0, 1.0], (4, 1)) * (ACTION == 0)[:, None]
                  + np.tile([1.0, 0.0], (4, 1)) * (ACTION == 1)[:, None])


def test_config_is_validated() -> None:
    with pytest.raises(ValueError, match="bandit_scope"):
        ope.OPEConfig(bandit_scope="everything")
    with pytest.raises(ValueError, match="n_folds"):
        ope.OPEConfig(n_folds=1)


# ---------------------------------------------------------------- the routing simulator
@pytest.fixture(scope="module")
def sim() -> RoutingSimulator:
    cat = ModelCatalogue.load()
    return RoutingSimulator(cat, RoutingTable.load())


def policies(sim: RoutingSimulator) -> dict[str, object]:
    static = StaticTablePolicy(sim.table, sim.catalogue)
    return {"static_table": static, "uniform": UniformPolicy(sim.actions, sim.role_mask),
            "behaviour": EpsilonGreedyPolicy(static, 0.3)}


def logged(sim: RoutingSimulator, episodes: int, seed: int, behaviour=None) -> tuple[Tasks, ope.LoggedData]:
    """Episodes collected like the synthetic collector does (static table, epsilon 0.3)."""
    rng = np.random.default_rng(seed)
    tasks = sim.sample_tasks(episodes, rng)
    rows = simulate_episodes(sim, tasks, behaviour or policies(sim)["behaviour"], rng)
    t = rows["task"]
    ctx = sim.contexts(Tasks(tasks.role[t], tasks.task_complexity_score[t], tasks.prompt_tokens[t]),
                       rows["step"], rows["primary_failure_count"])
    labels = np.array([f"t{i}/{s}" for i, s in zip(t, rows["step"], strict=True)])
    return tasks, ope.LoggedData(ctx, rows["action"].astype(np.int64), rows["reward"], rows["propensity"],
                                 t, sim.actions, labels=labels)


def true_q(sim: RoutingSimulator, ctx: Contexts) -> np.ndarray:
    """Exact E[reward | context, action] for every candidate action (0 for non-candidates)."""
    q = np.zeros((len(ctx), sim.K))
    for a in range(sim.K):
        ok = np.flatnonzero(sim.role_mask[ctx.role, a])
        q[ok, a] = sim.expected_reward(ctx.take(ok), np.full(len(ok), a))
    return q


def test_cross_fitting_never_predicts_a_row_from_its_own_episode(sim: RoutingSimulator) -> None:
    _, data = logged(sim, 400, seed=2)
    q = ope.cross_fit_q(data.contexts, data.action, data.reward, data.episode_id, sim.K, seed=0)
    # change every reward of one episode: only rows of other folds may move
    ep = data.episode_id[0]
    moved = ope.cross_fit_q(data.contexts, data.action, np.where(data.episode_id == ep, 50.0, data.reward),
                            data.episode_id, sim.K, seed=0)
    changed = np.abs(moved - q).max(axis=1) > 1e-9
    assert not changed[data.episode_id == ep].any()
    assert 0.6 < changed.mean() < 0.9  # the other four folds' models saw the change
    fqe = dict(next_row=ope.episode_layout(data.episode_id, data.step).next_row,
               pi=policies(sim)["uniform"].action_probs(data.contexts), horizon=4)
    q4 = ope.cross_fit_q(data.contexts, data.action, data.reward, data.episode_id, sim.K, **fqe)
    moved4 = ope.cross_fit_q(data.contexts, data.action, np.where(data.episode_id == ep, 50.0, data.reward),
                             data.episode_id, sim.K, **fqe)
    assert not (np.abs(moved4 - q4).max(axis=1) > 1e-9)[data.episode_id == ep].any()


def test_dm_equals_the_truth_with_the_true_reward_model(sim: RoutingSimulator) -> None:
    _, data = logged(sim, 1000, seed=0)
    ctx = data.contexts.take(np.flatnonzero(data.step == 0))
    q = true_q(sim, ctx)
    pols = policies(sim)
    # the table's value: the expected reward of the model it picks; the uniform policy's: the
    # mean over the role's candidates
    static_truth = sim.expected_reward(ctx, pols["static_table"].choose(ctx)).mean()
    cands = sim.role_mask[ctx.role]
    uniform_truth = np.mean([q[i, cands[i]].mean() for i in range(len(ctx))])
    assert ope.dm(pols["static_table"].action_probs(ctx), q).value == pytest.approx(static_truth, abs=1e-12)
    assert ope.dm(pols["uniform"].action_probs(ctx), q).value == pytest.approx(uniform_truth, abs=1e-12)


def test_bandit_ips_and_dr_are_unbiased_and_their_intervals_cover_the_truth(sim: RoutingSimulator) -> None:
    """20 logged datasets of each episode's first decision; truth = mean_i sum_a pi(a|x_i) E[r|x_i,a]."""
    seeds, pols = range(20), {k: v for k, v in policies(sim).items() if k != "behaviour"}
    errors = {(p, e): [] for p in pols for e in ("ips", "dr")}
    covered = {key: 0 for key in errors}
    for seed in seeds:
        _, data = logged(sim, 2000, seed=100 + seed)
        first = np.flatnonzero(data.step == 0)
        ctx, a, r, p = data.contexts.take(first), data.action[first], data.reward[first], data.pscore[first]
        q_true = true_q(sim, ctx)
        q_hat = ope.cross_fit_q(ctx, a, r, first, sim.K, seed=seed)
        for name, pol in pols.items():
            pi = pol.action_probs(ctx)
            truth = float((pi * q_true).sum(axis=1).mean())
            for est in (ope.ips(r, a, p, pi), ope.dr(r, a, p, pi, q_hat)):
                ci = ope.bootstrap_ci(est, n_boot=400, seed=seed)
                errors[name, est.name].append(est.value - truth)
                covered[name, est.name] += ci.low <= truth <= ci.high
    for key, errs in errors.items():
        errs = np.array(errs)
        assert abs(errs.mean()) < 3.5 * errs.std(ddof=1) / np.sqrt(len(errs)), (key, errs.mean())
        assert covered[key] >= 16, (key, covered[key])


@pytest.fixture(scope="module")
def multistep(sim: RoutingSimulator) -> tuple[Tasks, ope.LoggedData, dict[str, ope.PolicyEvaluation]]:
    tasks, data = logged(sim, 4000, seed=7)
    cfg = ope.OPEConfig(n_boot=400)
    return tasks, data, {k: ope.evaluate_policy(data, p, cfg) for k, p in policies(sim).items()}


@pytest.mark.parametrize("name", ["static_table", "uniform", "behaviour"])
def test_episode_estimators_recover_the_exact_policy_value(sim: RoutingSimulator, multistep,
                                                            name: str) -> None:
    tasks, _, evals = multistep
    truth = sim.policy_value(policies(sim)[name], tasks).mean
    ev = evals[name]
    assert not ev.no_support and ev.support_share > 0
    for est in ("pdis", "step_dr", "step_wdr", "step_dr_clip"):
        e = ev.estimates[est]
        assert e.scope == "episode"
        assert abs(e.value - truth) < 4 * e.se, (est, e.value, truth, e.se)
        assert e.ci_low < e.value < e.ci_high
    # the fitted-Q baseline buys variance: step-wise DR is tighter than PDIS
    assert ev.estimates["step_dr"].se < ev.estimates["pdis"].se
    # self-normalising the weights buys more (bounded by each episode's share)
    assert ev.estimates["step_wdr"].se <= ev.estimates["step_dr"].se * 1.05
    assert ev.value == ev.estimates["step_dr_clip"].value
    assert ev.clip_weight == pytest.approx(ope.OPEConfig().clip_factor / data_pscore_min(multistep))
    # FQE (no weights) is tighter still, and near the truth: its model is close on these policies
    f = ev.estimates["fqe"]
    assert f.scope == "episode" and f.se < ev.estimates["step_dr"].se
    assert abs(f.value - truth) < 0.02, (f.value, truth)


def data_pscore_min(multistep) -> float:
    return float(np.min(multistep[1].pscore))


def test_fqe_is_the_mean_of_the_first_steps_fitted_value() -> None:
    # two episodes (rows given out of order): e1 = rows 2, 0; e2 = row 1
    v_hat = np.array([5.0, 0.4, 0.8])
    est = ope.fqe(v_hat, np.array(["e1", "e2", "e1"]), np.array([1, 0, 0]))
    assert est.value == pytest.approx((0.8 + 0.4) / 2) and sorted(est.round_rewards) == [0.4, 0.8]
    with pytest.raises(ValueError, match="v_hat"):
        ope.fqe(np.array([np.nan, 0.4, 0.8]), np.array(["e1", "e2", "e1"]), np.array([1, 0, 0]))


def test_evaluation_diagnostics(multistep) -> None:
    _, data, evals = multistep
    on = evals["behaviour"]  # the behaviour policy itself: every weight is 1
    assert on.ess == pytest.approx(on.n_bandit_rounds) and on.ess_episode == pytest.approx(on.n_episodes)
    assert on.estimates["ips"].value == pytest.approx(on.estimates["snips"].value)
    static = evals["static_table"]
    assert 0 < static.ess < static.n_bandit_rounds and static.ess_episode < static.n_episodes
    # the table puts mass on the logged action where the behaviour exploited (70%) or explored
    # onto the table's choice (30% / 4-6 candidates)
    assert static.support_share == pytest.approx((data.action == static_choice(data)).mean())
    assert 0.7 < static.support_share < 0.85
    assert evals["uniform"].support_share == 1.0
    assert set(static.estimates) == set(ope.BANDIT_ESTIMATORS + ope.EPISODE_ESTIMATORS)
    doc = json.loads(json.dumps(static.to_dict()))
    assert doc["no_support"] is False and doc["estimates"]["dr"]["value"] == static.estimates["dr"].value
    assert "step_dr" in static.format()


# ---------------------------------------------------------------- paired differences
def test_per_episode_terms_average_to_each_estimate_and_the_difference_is_paired(multistep) -> None:
    _, data, evals = multistep
    a, b = evals["static_table"], evals["uniform"]
    for name in ope.BANDIT_ESTIMATORS + ope.EPISODE_ESTIMATORS:
        ea, eb = a.estimates[name], b.estimates[name]
        # the kept terms are the estimate's own: their mean is the value (the ratio's, for SNIPS/SNDR/WDR)
        assert ea.terms.round_rewards.mean() == pytest.approx(ea.value, abs=1e-12), name
        assert len(ea.units) == len(ea.terms.round_rewards) == (a.n_episodes if ea.scope == "episode"
                                                                 else a.n_bandit_rounds)
        d = ope.paired_difference(a, b, name, n_boot=200)
        assert d.value == pytest.approx(eb.value - ea.value, abs=1e-12), name
        assert d.ci_low < d.value < d.ci_high and d.n_units == len(ea.units)
        if ea.terms.ratio is None:
            assert (eb.terms.round_rewards - ea.terms.round_rewards).mean() == pytest.approx(d.value, abs=1e-12)
    # the terms stay out of the report
    assert "terms" not in json.loads(json.dumps(a.to_dict()))["estimates"]["step_dr_clip"]


def test_paired_interval_covers_the_true_difference_and_cancels_shared_noise(sim: RoutingSimulator,
                                                                           multistep) -> None:
    tasks, data, evals = multistep
    pols = policies(sim)
    static, behaviour = evals["static_table"], evals["behaviour"]
    truth = sim.policy_value(pols["behaviour"], tasks).mean - sim.policy_value(pols["static_table"], tasks).mean
    d = ope.paired_difference(static, behaviour, n_boot=400)
    assert abs(d.value - truth) < 4 * d.se, (d, truth)
    # the two policies act alike in most decisions: resampling the episodes once for both
    # cancels that shared noise, so the difference is sharper than either value, and about half
    # as wide as the two values' intervals combined as if they were independent
    sb, ss = behaviour.estimates["step_dr_clip"].se, static.estimates["step_dr_clip"].se
    assert d.se < 0.8 * min(sb, ss), (d.se, sb, ss)
    assert d.se < 0.55 * np.hypot(sb, ss)


def test_paired_difference_refuses_other_logs_and_withheld_estimates(sim: RoutingSimulator, multistep) -> None:
    _, data, evals = multistep
    _, other = logged(sim, 1000, seed=8)
    elsewhere = ope.evaluate_policy(other, policies(sim)["static_table"], ope.OPEConfig(n_boot=20))
    assert not elsewhere.no_support
    with pytest.raises(ValueError, match="different logs"):
        ope.paired_difference(evals["static_table"], elsewhere)
    with pytest.raises(ValueError, match="not one of"):
        ope.paired_difference(evals["static_table"], evals["uniform"], "nope")
    static = policies(sim)["static_table"]
    _, det = logged(sim, 300, seed=5, behaviour=static)  # SAGE's logs without exploration
    cfg = ope.OPEConfig(n_boot=20)
    none = ope.paired_difference(ope.evaluate_policy(det, static, cfg),
                                 ope.evaluate_policy(det, policies(sim)["uniform"], cfg))
    assert none.value is None and none.ci_low is None and "no support" in none.reason
    # results built without terms (e.g. read back from a report) cannot be paired
    bare = {k: ope.EstimatorResult(e.name, e.scope, e.value, e.ci_low, e.ci_high, e.se)
            for k, e in evals["uniform"].estimates.items()}
    from dataclasses import replace as dc_replace

    with pytest.raises(ValueError, match="no per-unit terms"):
        ope.paired_difference(evals["static_table"], dc_replace(evals["uniform"], estimates=bare))
    # nor results evaluated with keep_terms=False (a selection's), whose values are the same
    light = ope.evaluate_policy(data, policies(sim)["uniform"], evals["uniform"].config, keep_terms=False)
    assert all(e.terms is None and e.units is None for e in light.estimates.values())
    assert {k: e.value for k, e in light.estimates.items()} == {
        k: e.value for k, e in evals["uniform"].estimates.items()}
    with pytest.raises(ValueError, match="keep_terms=True"):
        ope.paired_difference(evals["static_table"], light)


def static_choice(data: ope.LoggedData) -> np.ndarray:
    cat = ModelCatalogue.load()
    return StaticTablePolicy(RoutingTable.load(), cat).choose(data.contexts)


def test_all_decisions_scope_estimates_the_per_decision_value(sim: RoutingSimulator) -> None:
    _, data = logged(sim, 2000, seed=11)
    uniform = policies(sim)["uniform"]
    ev = ope.evaluate_policy(data, uniform, ope.OPEConfig(n_boot=300, bandit_scope="all_decisions"))
    truth = float((uniform.action_probs(data.contexts) * true_q(sim, data.contexts)).sum(axis=1).mean())
    assert ev.n_bandit_rounds == len(data)
    for est in ("ips", "dr", "sndr"):
        assert abs(ev.estimates[est].value - truth) < 4 * ev.estimates[est].se, est


# ---------------------------------------------------------------- support
def test_no_support_withholds_every_number(sim: RoutingSimulator) -> None:
    # SAGE's own logs: the static table without exploration, every propensity 1
    static = policies(sim)["static_table"]
    _, data = logged(sim, 600, seed=5, behaviour=static)
    assert (data.pscore == 1.0).all()
    ev = ope.evaluate_policy(data, policies(sim)["uniform"], ope.OPEConfig(n_boot=50))
    assert ev.no_support and ev.unsupported_mass > 0.5
    assert "no support" in ev.no_support_reason and "never took" in ev.no_support_reason
    assert all(e.value is None and e.ci_low is None for e in ev.estimates.values())
    assert ev.value is None and "no support" in ev.format()
    assert json.loads(json.dumps(ev.to_dict()))["estimates"]["ips"]["value"] is None
    # the table itself is supported by its own logs and is valued at the on-policy mean
    own = ope.evaluate_policy(data, static, ope.OPEConfig(n_boot=50))
    assert not own.no_support and own.support_share == 1.0
    assert own.estimates["ips"].value == pytest.approx(data.reward[data.step == 0].mean())


def test_support_check_with_the_behaviour_distribution() -> None:
    pb = np.array([[0.5, 0.5, 0.0], [0.5, 0.5, 0.0]])
    pi = np.array([[0.0, 0.5, 0.5], [0.0, 1.0, 0.0]])
    sup = ope.check_support(pi, np.array([0, 1]), np.array([0.5, 0.5]), behaviour_probs=pb)
    assert sup.no_support and sup.unsupported_mass == pytest.approx(0.25) and sup.unsupported_rows == 1
    assert sup.share == 0.5
    ok = ope.check_support(pi[1:], np.array([1]), np.array([0.5]), behaviour_probs=pb[1:])
    assert not ok.no_support and ok.unsupported_mass == 0.0
    # a logged propensity of 1: the behaviour could take nothing else in that context
    det = ope.check_support(np.array([[0.5, 0.5], [0.0, 1.0]]), np.array([0, 1]), np.array([1.0, 1.0]))
    assert det.no_support and det.unsupported_mass == pytest.approx(0.25) and det.unsupported_rows == 1
    assert not ope.check_support(np.array([[0.5, 0.5]]), np.array([0]), np.array([0.5])).no_support
    tolerated = ope.check_support(pi, np.array([0, 1]), np.array([0.5, 0.5]), behaviour_probs=pb,
                                  max_unsupported_mass=0.3)
    assert not tolerated.no_support


def test_support_is_the_behaviour_models_when_one_is_given() -> None:
    # Role 0 logged only model 0; the policy puts mass on model 1 there.
    role, action, pscore = np.array([0, 0, 1]), np.array([0, 0, 1]), np.array([0.5, 0.5, 0.5])
    pi = np.array([[0.2, 0.8], [0.2, 0.8], [0.0, 1.0]])
    # From the sample alone: (role 0, model 1) was never logged, so nothing is known of it.
    assert ope.check_support(pi, action, pscore, role=role).no_support
    # A behaviour model that gives model 1 real probability in role 0: the behaviour policy
    # could take it there (it just did not in this sample), so the estimate stands.
    pb = np.array([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])
    sup = ope.check_support(pi, action, pscore, role=role, behaviour_probs=pb, min_behaviour_prob=0.005)
    assert not sup.no_support
    # A behaviour model that (almost) never takes it: unsupported, and the reason says so.
    pb_rare = np.array([[0.999, 0.001], [0.999, 0.001], [0.5, 0.5]])
    sup = ope.check_support(pi, action, pscore, role=role, behaviour_probs=pb_rare, min_behaviour_prob=0.005)
    assert sup.no_support and "never took" in sup.reason


def test_logged_data_errors_name_the_decision(sim: RoutingSimulator) -> None:
    _, data = logged(sim, 50, seed=1)
    uniform = policies(sim)["uniform"]
    pscore = data.pscore.copy()
    pscore[3] = 0.0
    with pytest.raises(ValueError, match=rf"propensity is 0\.0 at row 3 \(decision '{data.labels[3]}'\)"):
        ope.evaluate_policy(replace(data, pscore=pscore), uniform)
    pscore[3] = np.nan
    with pytest.raises(ValueError, match=r"propensity is missing in 1 rows, first at row 3 .*\(BC\)"):
        ope.evaluate_policy(replace(data, pscore=pscore), uniform)
    reward = data.reward.copy()
    reward[5] = np.nan
    with pytest.raises(ValueError, match=r"reward is NaN or infinite in 1 rows, first at row 5 \(decision"):
        ope.evaluate_policy(replace(data, reward=reward), uniform)
    with pytest.raises(ValueError, match="LoggedData.reward has shape"):
        ope.evaluate_policy(replace(data, reward=data.reward[:-1]), uniform)
    with pytest.raises(ValueError, match="orders its actions"):
        ope.evaluate_policy(data, UniformPolicy(sim.actions[::-1], sim.role_mask[:, ::-1]))
    with pytest.raises(ValueError, match="empty dataset"):
        ope.evaluate_policy(replace(data, contexts=data.contexts.take(np.array([], dtype=int)),
                                    action=data.action[:0], reward=data.reward[:0], pscore=data.pscore[:0],
                                    episode_id=data.episode_id[:0], labels=None), uniform)


def replace(data: ope.LoggedData, **changes) -> ope.LoggedData:
    from dataclasses import replace as dc_replace

    return dc_replace(data, **changes)


# ---------------------------------------------------------------- end to end, from the logs
def test_evaluate_policy_on_the_routing_dataset(tmp_path) -> None:
    from sage_pipeline.routing.ingest import IngestConfig, ingest
    from sage_pipeline.routing.routing_dataset import build_routing_dataset

    cat = ModelCatalogue.load()
    tab = RoutingTable.load()
    sim = RoutingSimulator(cat, tab)
    res = collect(sim, tmp_path / "sessions", CollectorConfig(episodes=1500, seed=3), progress=lambda s: None)
    traj = ingest(IngestConfig((tmp_path / "sessions",)), tmp_path / "routing")
    df = build_routing_dataset(pq.read_table(traj.trajectories).to_pandas(), tab, cat).frame
    data = ope.LoggedData.from_frame(df, cat.actions)
    assert data.session_id is not None and len(data) == res.decisions
    ev = ope.evaluate_policy(data, StaticTablePolicy(tab, cat), ope.OPEConfig(n_boot=300))
    truth = res.ground_truth["static_table"]
    for est in ("pdis", "step_dr"):
        e = ev.estimates[est]
        assert abs(e.value - truth) < 4 * e.se, (est, e, truth)
    assert abs(ev.estimates["fqe"].value - truth) < 0.03


def test_module_imports_only_numpy_and_the_routing_core() -> None:
    heavy = ("torch", "dagster", "obp", "sklearn", "great_expectations")
    code = f"import sys, sage_pipeline.rl.ope; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_intervals_limits_the_bootstraps_to_the_named_estimators(sim: RoutingSimulator, multistep) -> None:
    _, data, evals = multistep
    full = evals["uniform"]
    only = ope.evaluate_policy(data, policies(sim)["uniform"], full.config, keep_terms=False,
                               intervals=("step_dr_clip",))
    # every value is computed; the named interval is the full evaluation's to the bit (each
    # bootstrap is seeded alike), the others are left out and say so
    assert {k: e.value for k, e in only.estimates.items()} == {k: e.value for k, e in full.estimates.items()}
    clip, whole = only.estimates["step_dr_clip"], full.estimates["step_dr_clip"]
    assert (clip.ci_low, clip.ci_high, clip.se) == (whole.ci_low, whole.ci_high, whole.se)
    rest = [e for k, e in only.estimates.items() if k != "step_dr_clip"]
    assert rest and all(e.ci_low is None and e.ci_high is None and e.se is None for e in rest)
    assert "no interval computed" in only.estimates["fqe"].format()
    with pytest.raises(ValueError, match=r"unknown estimators \['step_drr'\]"):
        ope.evaluate_policy(data, policies(sim)["uniform"], full.config, intervals=("step_drr",))


def test_bootstrap_cis_gives_each_estimate_its_own_interval(sim: RoutingSimulator, multistep) -> None:
    _, data, evals = multistep
    terms = [evals["uniform"].estimates[k].terms for k in ("snips", "dr", "sndr")]
    groups = evals["uniform"].estimates["dr"].groups
    together = ope.bootstrap_cis(terms, 300, 0.05, 3, groups=groups)
    for t, ci in zip(terms, together):
        alone = ope.bootstrap_ci(t, 300, 0.05, 3, groups=groups)
        assert (ci.low, ci.high, ci.se) == pytest.approx((alone.low, alone.high, alone.se), rel=1e-9, abs=1e-12)
    # estimates over other rows cannot share a resample
    with pytest.raises(ValueError, match="different rows"):
        ope.bootstrap_cis([np.ones(5), np.ones(6)])
    with pytest.raises(ValueError, match="nothing to bootstrap"):
        ope.bootstrap_cis([np.ones(0)])


def test_evaluation_runs_on_one_blas_thread(sim: RoutingSimulator, multistep) -> None:
    """BLAS threads spin-waiting for a core another process holds made offline_eval 3x slower:
    an evaluation holds BLAS to one thread while it runs, and gives the setting back."""
    from threadpoolctl import threadpool_info

    def blas_threads() -> set[int]:
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    _, data, _ = multistep
    uniform = policies(sim)["uniform"]
    seen: list[set[int]] = []

    class Watching:
        name, actions = "watching", uniform.actions

        def action_probs(self, ctx):
            seen.append(blas_threads())
            return uniform.action_probs(ctx)

    before = blas_threads()
    ope.evaluate_policy(data, Watching(), ope.OPEConfig(n_boot=20), keep_terms=False)
    assert seen and all(s == {1} for s in seen), seen
    assert blas_threads() == before


# ---------------------------------------------------------------- few sessions (issue 32)
def _sessions(data: ope.LoggedData, n: int) -> ope.LoggedData:
    """``data`` with its episodes dealt into ``n`` sessions (SAGE without SAGE_SESSION_ID: one a day)."""
    ep = np.unique(data.episode_id, return_inverse=True)[1]
    return replace(data, session_id=np.array([f"day{i % n}" for i in ep]))


def test_too_few_sessions_give_estimates_without_intervals_and_say_how_many_are_needed(sim, multistep) -> None:
    """Journals without SAGE_SESSION_ID hold one session a day: the bootstrap over 3 sessions was far too
    narrow, and with 1 session cross-fitting raised ("cross-fitting needs at least 2 sessions")."""
    _, data, _ = multistep
    uniform = policies(sim)["uniform"]
    cfg = ope.OPEConfig(n_boot=50)
    assert cfg.min_sessions == ope.OPESettings.model_fields["min_sessions"].default == 20
    for n in (1, 3):
        ev = ope.evaluate_policy(_sessions(data, n), uniform, cfg, progress=lambda s: None)
        assert ev.n_sessions == n and ev.value is not None
        assert all(e.ci_low is None and e.ci_high is None for e in ev.estimates.values())
        unit = "session" if n == 1 else "sessions"
        assert ev.interval_reason.startswith(f"{n} {unit}; a 95% interval needs at least 20")
        assert "SAGE_SESSION_ID" in ev.interval_reason and f"no intervals: {n} {unit}" in ev.format()
        d = ope.paired_difference(ope.evaluate_policy(_sessions(data, n), policies(sim)["static_table"], cfg,
                                                      progress=lambda s: None), ev)
        assert d.value is not None and d.ci_low is None and d.reason.startswith(f"no interval: {n} {unit}")
    # at min_sessions the interval is back, resampling sessions
    ev = ope.evaluate_policy(_sessions(data, 20), uniform, cfg, progress=lambda s: None)
    assert ev.n_sessions == 20 and ev.interval_reason is None and ev.estimates["step_dr_clip"].ci_low is not None
    # without session ids, each episode is its own unit
    episodes = len(np.unique(data.episode_id))
    assert ope.evaluate_policy(data, uniform, cfg, progress=lambda s: None).n_sessions == episodes
    with pytest.raises(ValueError, match="min_sessions"):
        ope.OPEConfig(min_sessions=1)


def test_cluster_bootstrap_over_sessions_is_wider_than_over_episodes(sim, multistep) -> None:
    """The interval resamples whole sessions: decisions of a day that share an effect are one draw."""
    _, data, _ = multistep
    ep = np.unique(data.episode_id, return_inverse=True)[1]
    day = ep % 25
    shifted = replace(data, reward=data.reward + np.random.default_rng(0).normal(0, 0.5, 25)[day],
                      session_id=np.array([f"d{d}" for d in day]))
    cfg = ope.OPEConfig(n_boot=300)
    static = policies(sim)["static_table"]
    by_session = ope.evaluate_policy(shifted, static, cfg, progress=lambda s: None).estimates["step_dr_clip"]
    by_episode = ope.evaluate_policy(replace(shifted, session_id=None), static, cfg,
                                     progress=lambda s: None).estimates["step_dr_clip"]
    assert by_session.value == pytest.approx(by_episode.value, abs=0.01)  # the folds differ, not the estimator
    assert (by_session.ci_high - by_session.ci_low) > 2 * (by_episode.ci_high - by_episode.ci_low)


def test_snips_undefined_on_the_rounds_is_withheld_not_raised() -> None:
    """The policy puts no weight on any first decision's logged action, but has support on the retries:
    evaluate_policy raised "NoSupportError: SNIPS is undefined"; now SNIPS and SNDR are withheld."""
    from sage_pipeline.routing.features import Contexts

    n_ep = 30
    role = np.zeros(2 * n_ep, dtype=np.int64)
    step = np.tile([0, 1], n_ep)
    ctx = Contexts(role=role, task_complexity_score=np.linspace(0, 1, 2 * n_ep), prompt_tokens=np.full(2 * n_ep, 900.0),
                   step=step, failure_count=step, primary_failure_count=step)
    data = ope.LoggedData(ctx, np.tile([0, 1], n_ep).astype(np.int64), np.linspace(0, 1, 2 * n_ep),
                          np.full(2 * n_ep, 0.5), np.repeat(np.arange(n_ep), 2), ("a", "b"), roles=("coder",))

    class AlwaysB:
        name, actions = "always_b", ("a", "b")

        def action_probs(self, c):
            return np.tile([0.0, 1.0], (len(c), 1))

    ev = ope.evaluate_policy(data, AlwaysB(), ope.OPEConfig(n_boot=20), progress=lambda s: None)
    assert ev.estimates["snips"].value is None and ev.estimates["sndr"].value is None
    assert ev.estimates["ips"].value == 0.0 and ev.estimates["step_dr_clip"].value is not None
    assert "snips" not in ev.format() or "snips: no support" in ev.format()


def test_support_the_caller_names_is_added_to_the_check() -> None:
    pi = np.array([[0.0, 1.0], [1.0, 0.0]])
    action, pscore = np.array([0, 0]), np.array([0.9, 0.9])
    assert not ope.check_support(pi, action, pscore).no_support
    sup = ope.check_support(pi, action, pscore, supported=np.array([[True, False], [True, False]]))
    assert sup.no_support and sup.unsupported_mass == 0.5 and sup.unsupported_rows == 1
    with pytest.raises(ValueError, match="supported has shape"):
        ope.check_support(pi, action, pscore, supported=np.ones((3, 2), dtype=bool))


def test_decisions_no_policy_reaches_follow_the_log(sim: RoutingSimulator) -> None:
    """SAGE's coder decisions (policy_source ucb_bandit: its UCB bandit chooses, no router checkpoint is
    consulted) are what every evaluated policy does: probability 1 on the logged action, propensity 1.
    Two policies that differ only there get the same estimates; the rows' rewards still count."""
    import dataclasses

    _, data = logged(sim, 600, seed=3)
    coder = sim.table.roles.index("coder")
    fixed = data.contexts.role == coder
    assert fixed.any() and (~fixed).any()
    followed = dataclasses.replace(data, follows_log=fixed, pscore=np.where(fixed, 1.0, data.pscore))
    static, uniform = policies(sim)["static_table"], policies(sim)["uniform"]
    pi = ope.policy_probs(uniform, followed)
    assert (pi[fixed, data.action[fixed]] == 1.0).all() and np.allclose(pi[fixed].sum(axis=1), 1.0)
    assert np.allclose(pi[~fixed], ope.policy_probs(uniform, data)[~fixed])

    class StaticButCoder:  # the table everywhere but the coder, where it takes the other models
        name, actions = "static_but_coder", static.actions

        def action_probs(self, ctx):
            p = static.action_probs(ctx)
            q = uniform.action_probs(ctx)
            return np.where((ctx.role == coder)[:, None], q, p)

    cfg = ope.OPEConfig(n_boot=50)
    a = ope.evaluate_policy(followed, static, cfg)
    b = ope.evaluate_policy(followed, StaticButCoder(), cfg)
    for est in ("dm", "dr", "step_dr_clip", "fqe"):
        assert a.estimates[est].value == pytest.approx(b.estimates[est].value)
    # from a routing dataset frame: the ucb_bandit rows are the ones that follow the log
    import pandas as pd

    frame = pd.DataFrame({"action_index": [0, 1], "reward": [1.0, 0.5], "propensity": [np.nan, 0.9],
                          "episode_id": ["e", "e"], "step": [0, 1], "role": ["coder", "debugger"],
                          "task_complexity_score": [0.1, 0.1], "prompt_tokens": [10, 10], "failure_count": [0, 1],
                          "primary_failure_count": [0, 1], "policy_source": ["ucb_bandit", "learned"]})
    d = ope.LoggedData.from_frame(frame, tuple(sim.actions), tuple(sim.table.roles))
    assert d.follows_log.tolist() == [True, False] and d.pscore.tolist() == [1.0, 0.9]
