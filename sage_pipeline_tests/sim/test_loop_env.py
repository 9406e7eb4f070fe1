"""The SAGE-loop environment: SAGE's models as actions, the sandbox's feedback in the
observation, the budget ending episodes, the debugger's dependence on the feedback, the
hardness model of the coders, the Gymnasium VectorEnv contract, and the fast step being the
transition it documents."""

from __future__ import annotations

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AutoresetMode

from sage_pipeline.sim.env import TaskOutcomes
from sage_pipeline.sim.loop_config import SageLoopConfig, SageLoopConfigError, logit
from sage_pipeline.sim.loop_env import NO_CANDIDATE, PASS, SageLoopEnv, SageLoopSim, SageLoopVecEnv
from sage_pipeline.sim.obs import LAST_OUTCOMES, LoopObs
from sage_pipeline.sim.schema import OUTCOME_KINDS
from sage_pipeline_tests.sim.synthetic import synthetic_suite


@pytest.fixture(scope="module")
def config() -> SageLoopConfig:
    return SageLoopConfig.load()


@pytest.fixture(scope="module")
def suite():
    return synthetic_suite(60, seed=1)


@pytest.fixture(scope="module")
def sim(suite, config):
    return SageLoopSim.build(*suite, config)


def with_budget(config: SageLoopConfig, **budget) -> SageLoopConfig:
    return config.model_copy(update={"budget": config.budget.model_copy(update=budget)})


def hand_sim(config: SageLoopConfig, kinds: list[str], tests: list[tuple[int, int]], difficulty: float = 0.42):
    """One task with the given verified wrong candidates (outcome kind, tests passed/total)."""
    task = dataclasses.replace(synthetic_suite(1, seed=0)[0][0], difficulty=difficulty)
    w = len(kinds)
    outcomes = TaskOutcomes(ref_kind=np.array([PASS]), wrong_kind=np.array([[OUTCOME_KINDS.index(k) for k in kinds]]),
                            n_wrong=np.array([w]), wrong_ids=[[f"w{i}" for i in range(w)]],
                            wrong_tests_passed=np.array([[p for p, _ in tests]]),
                            wrong_tests_total=np.array([[t for _, t in tests]]))
    return SageLoopSim([task], outcomes, config, _table(config))


def _table(config):
    from sage_pipeline.sage.table import RoutingTable
    return RoutingTable.load(config.routing_table)


def test_the_actions_are_sages_models_and_the_static_policy_is_sages_table(sim, config):
    assert sim.actions == ("code:qwen2.5-coder:1.5b", "code:qwen2.5-coder:14b", "code:claude-sonnet-4-5",
                           "debug:qwen2.5-coder:14b", "debug:codestral:22b", "debug:claude-sonnet-4-5", "stop")
    coder, debugger = sim.table.routes["coder"], sim.table.routes["debugger"]
    assert (coder.primary, coder.fallback) == ("qwen2.5-coder:1.5b", "qwen2.5-coder:14b")
    assert (debugger.primary, debugger.fallback) == ("qwen2.5-coder:14b", "codestral:22b")
    # first call: the coder row (fallback when task_complexity_score > 0.7); then the debugger row,
    # its fallback once its primary failed (primary_failure_count >= 1)
    counts = np.zeros((4, sim.n_calls), dtype=np.int64)
    counts[2, 0] = 1
    counts[3, [0, 3]] = 1
    obs = sim.observe(np.zeros(4, dtype=np.int64), counts, np.array([-1, -1, 0, 0]))
    obs = dataclasses.replace(obs, difficulty=np.array([0.5, 0.75, 0.5, 0.5]))
    names = [sim.actions[a] for a in sim.static_action(obs)]
    assert names == ["code:qwen2.5-coder:1.5b", "code:qwen2.5-coder:14b", "debug:qwen2.5-coder:14b",
                     "debug:codestral:22b"]


def test_the_feedback_is_what_the_sandbox_recorded(suite, sim):
    tasks, df = suite
    env = SageLoopVecEnv(sim, n_envs=256, seed=3)
    env.step(np.zeros(256, dtype=np.int64))  # everyone writes a candidate with the 1.5B coder
    obs = env.observe()
    rows = np.flatnonzero(obs.candidate >= 0)
    assert len(rows) > 20
    frame = df.set_index("candidate_id")
    for r in rows[:40]:
        cand = sim.outcomes.wrong_ids[obs.task[r]][obs.candidate[r]]
        rec = frame.loc[cand]
        assert LAST_OUTCOMES[obs.last_outcome[r]] == rec["outcome"]
        assert obs.tests_passed[r] == pytest.approx(rec["tests_passed"] / rec["tests_total"])
    x = env.encode(rows)
    np.testing.assert_array_equal(x, sim.obs_spec.encode(obs.take(rows)))


def test_the_budget_ends_episodes(config):
    # seconds: the 1.5B call (16 s) fits, a 14B debug (39.6 s) after it does not under 50 s
    sim = hand_sim(with_budget(config, seconds=50.0, calls=4), ["wrong_answer"], [(0, 4)], difficulty=0.95)
    env = SageLoopVecEnv(sim, n_envs=500, seed=0)
    env.step(np.zeros(500, dtype=np.int64))
    alive = env.used[:, 0] == 1
    assert alive.any()
    _, r, done, _, info = env.step(np.full(500, sim.actions.index("debug:qwen2.5-coder:14b")))
    assert info["refused"][alive].all() and done[alive].all() and (r[alive] == 0).all()
    assert (info["latency_s"][alive] == 0).all() and (info["cost_usd"][alive] == 0).all()
    # calls: the episode ends after the last call the budget allows
    sim = hand_sim(with_budget(config, calls=2, seconds=1e4, usd=1.0), ["timeout"], [(0, 4)], difficulty=0.99)
    env = SageLoopVecEnv(sim, n_envs=400, seed=1)
    lengths = []
    for _ in range(8):
        _, _, done, _, info = env.step(np.zeros(400, dtype=np.int64))
        lengths += info["episode_length"][done].tolist()
    assert max(lengths) == 2
    # dollars: a budget of 1.5 frontier calls: the second is refused
    f = config.call_actions.index("code:claude-sonnet-4-5")
    one = hand_sim(config, ["timeout"], [(0, 4)]).usd[f]
    sim = hand_sim(with_budget(config, calls=4, usd=1.5 * one, seconds=1e4), ["timeout"], [(0, 4)], difficulty=0.99)
    env = SageLoopVecEnv(sim, n_envs=400, seed=2)
    frontier = np.full(400, f)
    env.step(frontier)
    alive = env.used[:, 0] == 1
    _, _, done, _, info = env.step(frontier)
    assert info["refused"][alive].all() and done[alive].all()


def test_the_debuggers_chance_depends_on_the_feedback(config):
    kinds = ["wrong_answer", "wrong_answer", "exception", "timeout"]
    sim = hand_sim(config, kinds, [(9, 10), (1, 10), (9, 10), (0, 10)])
    p = sim.p_debug[0]  # (candidates, debuggers)
    assert (p[0] > p[1]).all()  # a near miss is easier to repair than a wrong approach
    # at the same share of tests: a traceback > a failing assertion (the published repair rates, 77% vs 45%)
    # > a timeout
    assert (p[2] > p[0]).all() and (p[0] > p[3]).all()
    # and the environment repairs with that chance, keeping the candidate when it fails
    n, d = 6000, sim.actions.index("debug:qwen2.5-coder:14b")
    for j in (0, 3):
        env = SageLoopVecEnv(sim, n_envs=n, seed=4 + j)
        counts = np.zeros((n, sim.n_calls), dtype=np.int64)
        counts[:, 0] = 1  # as after a failed first attempt with the 1.5B coder
        env.set_state(np.arange(n), counts, np.full(n, j))
        _, _, _, _, info = env.step(np.full(n, d))
        expected = p[j, 0]
        assert info["passed"].mean() == pytest.approx(expected, abs=4 * np.sqrt(expected * (1 - expected) / n) + 1e-3)
        kept = ~info["passed"] & (env.used[:, 0] == 2)
        assert (env.candidate[kept] == j).all()


def test_a_debug_call_before_any_candidate_costs_the_call_and_changes_nothing(config):
    sim = hand_sim(config, ["wrong_answer"], [(5, 10)])
    env = SageLoopVecEnv(sim, n_envs=8, seed=0)
    d = sim.actions.index("debug:codestral:22b")
    _, r, done, _, info = env.step(np.full(8, d))
    assert not info["passed"].any() and not done.any() and (info["outcome"] == NO_CANDIDATE).all()
    assert (env.candidate == -1).all() and (env.used[:, 0] == 1).all()
    expected = sim.call_reward(np.array([d]), np.array([NO_CANDIDATE]), np.array([0]))[0]
    np.testing.assert_allclose(r, expected)
    assert expected == pytest.approx(-0.15 - config.cost_weight * sim.usd[d] - config.latency_weight * sim.seconds[d])


def test_a_coders_chance_is_its_published_pass_rate_moved_by_difficulty_and_failures(config):
    sim = hand_sim(config, ["wrong_answer"], [(5, 10)], difficulty=0.6)
    a = config.assumed
    counts = np.zeros((1, sim.n_calls), dtype=np.int64)
    first = sim.p_code(np.array([0]), counts)[0]
    for m, name in enumerate(sim.code_models):
        want = 1 / (1 + np.exp(-(logit(config.models[name].humaneval.value) - a["difficulty_slope"] * (0.6 - 0.42))))
        assert first[m] == pytest.approx(want)
    # a retry of the model that failed: the posterior chance of the one-hardness model
    counts[0, 0] = 1
    after = sim.p_code(np.array([0]), counts)[0]
    s, q = sim.reach[0, 0], sim.q[0, 0]
    assert after[0] == pytest.approx(s * q * (1 - q) / (s * (1 - q) + 1 - s))
    assert (after < first).all()  # a task one model failed is harder for every model
    # the table the fast step reads is the same function
    combo = sim.fail_combo[counts[0, :sim.n_code] @ sim.fail_radix]
    np.testing.assert_allclose(sim.p_code_table[0, combo], after)


def test_the_first_attempts_pass_rate_matches_in_the_environment(config):
    sim = hand_sim(config, ["wrong_answer"], [(5, 10)])
    n = 8000
    env = SageLoopVecEnv(sim, n_envs=n, seed=9)
    for m in range(sim.n_code):
        env.reset(seed=10 + m)
        _, _, _, _, info = env.step(np.full(n, m))
        p = sim.p_code(np.array([0]), np.zeros((1, sim.n_calls), dtype=np.int64))[0, m]
        assert info["passed"].mean() == pytest.approx(p, abs=4 * np.sqrt(p * (1 - p) / n) + 1e-3)


def test_the_fast_step_is_the_documented_transition(sim):
    class Recording:  # the env's generator, keeping the uniforms each step draws
        def __init__(self, rng):
            self.rng, self.draws = rng, []

        def random(self, *args, **kw):
            self.draws.append(self.rng.random(*args, **kw))
            return self.draws[-1].copy()

        def __getattr__(self, name):
            return getattr(self.rng, name)

    env = SageLoopVecEnv(sim, n_envs=64, seed=5)
    env.rng = Recording(env.rng)
    draws = env.rng.draws
    rng = np.random.default_rng(0)
    for _ in range(60):
        task, counts, cand = env.task.copy(), env.counts.copy(), env.candidate.copy()
        x_before = env.encode(np.arange(64))
        np.testing.assert_array_equal(x_before, sim.obs_spec.encode(sim.observe(task, counts, cand)))
        a = rng.integers(0, len(sim.actions), 64)
        _, r, done, _, info = env.step(a)
        tr = sim.transition(task, counts, cand, a, draws[-1])
        np.testing.assert_allclose(r, tr["reward"])
        np.testing.assert_array_equal(done, tr["done"])
        np.testing.assert_array_equal(info["passed"], tr["passed"])
        np.testing.assert_array_equal(info["outcome"], tr["outcome"])
        live = ~done
        np.testing.assert_array_equal(env.counts[live], tr["counts"][live])
        np.testing.assert_array_equal(env.candidate[live], tr["candidate"][live])
        if done.any():
            final = info["final_obs"][done]
            np.testing.assert_array_equal(final, sim.obs_spec.encode(sim.observe(
                task[done], tr["counts"][done], tr["candidate"][done])))
    # the reward table is call_reward
    a, lv, k = np.meshgrid(np.arange(sim.n_calls), np.arange(sim.budget.calls + 1), [PASS, 1, 3, NO_CANDIDATE],
                           indexing="ij")
    table = sim.reward_table[a, lv, np.where(k == NO_CANDIDATE, sim.reward_table.shape[2] - 1, k)]
    np.testing.assert_allclose(table, sim.call_reward(a, k, lv))


def test_the_vector_env_keeps_gymnasiums_contract(sim):
    env = SageLoopVecEnv(sim, n_envs=16, seed=0)
    assert isinstance(env, gym.vector.VectorEnv)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, info = env.reset(seed=7)
    assert info == {} and env.observation_space.contains(obs) and obs.dtype == np.float32
    env.action_space.seed(0)
    wrapped = gym.wrappers.vector.RecordEpisodeStatistics(env)
    wrapped.reset(seed=7)
    ours, theirs = [], []
    for _ in range(40):
        obs, r, term, trunc, info = wrapped.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and r.shape == term.shape == trunc.shape == (16,)
        assert not trunc.any()
        if term.any():
            assert info["_final_obs"].tolist() == term.tolist() and info["final_obs"].shape == obs.shape
            ours += info["episode_return"][term].tolist()
            theirs += info["episode"]["r"][term].tolist()
    assert len(ours) > 20
    np.testing.assert_allclose(ours, theirs)
    # reset(seed=...) re-seeds: the same seed and actions give the same episodes
    a = np.random.default_rng(1).integers(0, len(sim.actions), (30, 16))
    runs = []
    for _ in range(2):
        env.reset(seed=11)
        runs.append([env.step(x)[1].copy() for x in a])
    np.testing.assert_array_equal(np.array(runs[0]), np.array(runs[1]))


def test_the_single_env_passes_gymnasiums_checker(sim):
    env = SageLoopEnv(sim)
    check_env(env, skip_render_check=True)
    obs, info = env.reset(seed=3, options={"task": 2})
    assert info["task_id"] == sim.tasks[2].task_id
    x = sim.obs_spec.encode(sim.observe(np.array([2]), np.zeros((1, sim.n_calls), dtype=np.int64), np.array([-1])))
    np.testing.assert_array_equal(obs, x[0])
    _, r, done, _, info = env.step(sim.stop)
    assert done and r == 0.0 and info["outcome"] == "stop"
    with pytest.raises(ValueError, match="not a task index"):
        env.reset(options={"task": len(sim)})


def test_bad_actions_and_tables_are_clear_errors(sim, config, suite):
    env = SageLoopVecEnv(sim, n_envs=4, seed=0)
    with pytest.raises(ValueError, match=r"actions must be \(4,\) ints in \[0, 6\]"):
        env.step(np.array([0, 1, 2, 7]))
    with pytest.raises(ValueError, match=r"actions must be \(4,\) ints"):
        env.step(np.array([0, 1, -1, 2]))
    with pytest.raises(ValueError, match="n_envs must be >= 1"):
        SageLoopVecEnv(sim, n_envs=0)
    no_coder = config.model_copy(update={"static_roles": ["planner_x", "debugger"]})
    with pytest.raises(SageLoopConfigError, match=r"field 'static_roles\[0\]': role 'planner_x' is not routed"):
        SageLoopSim.build(*suite, no_coder)
    narrow = config.model_copy(update={"actions": config.actions.model_copy(update={"debug": ["claude-sonnet-4-5"]})})
    with pytest.raises(SageLoopConfigError,
                       match="routes debugger.primary to 'qwen2.5-coder:14b', which is not a debug action"):
        SageLoopSim.build(*suite, narrow)


def test_a_wrong_candidate_that_passed_in_the_rollouts_skips_its_task(suite, config):
    tasks, df = suite
    df = df.copy()
    wrong = tasks[3].wrong_candidates()[0].candidate_id
    df.loc[df["candidate_id"] == wrong, "outcome"] = "pass"
    sim = SageLoopSim.build(tasks, df, config)
    assert tasks[3].task_id in sim.skipped and "passed in the rollouts" in sim.skipped[tasks[3].task_id]
    assert len(sim) == len(tasks) - 1 - sum("every mutant" in v for v in sim.skipped.values())


def test_loop_obs_rows_must_agree(sim):
    obs = sim.observe(np.array([0, 1]), np.zeros((2, sim.n_calls), dtype=np.int64), np.array([-1, -1]))
    with pytest.raises(ValueError, match=r"LoopObs.counts has shape \(2, 2\)"):
        dataclasses.replace(obs, counts=np.zeros((2, 2), dtype=np.int64))
    assert isinstance(obs.take(np.array([1])), LoopObs) and len(obs.take(np.array([1]))) == 1
