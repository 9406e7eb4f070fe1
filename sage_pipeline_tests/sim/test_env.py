"""The code-task environment: dynamics, observations, rewards, seeding, outcomes from the
rollout cache (or the executor), and clear errors on bad input."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pandas as pd
import pytest
from gymnasium.utils.env_checker import check_env
from pydantic import ValidationError

from sage_pipeline.sim.env import STOP, CodeTaskEnv, CodeTaskSim, CodeTaskVecEnv, SimConfig
from sage_pipeline.sim.obs import LAST_OUTCOMES, ObsSpec
from sage_pipeline.sim.rollouts import RolloutsError, read_rollouts
from sage_pipeline.sim.schema import OUTCOME_KINDS, ExecResult, TasksFileError, read_tasks, write_tasks
from sage_pipeline_tests.sim.synthetic import synthetic_suite, write_rollouts


@pytest.fixture(scope="module")
def suite():
    return synthetic_suite(60, seed=1)


@pytest.fixture(scope="module")
def sim(suite, catalogue, table):
    return CodeTaskSim.build(*suite, catalogue, table)


def _run(env: CodeTaskVecEnv, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        a = rng.integers(0, env.n_actions, env.num_envs)
        obs, r, term, _trunc, info = env.step(a)
        out.append((obs.copy(), r.copy(), term.copy(), info["outcome"].copy(), info["task"].copy()))
    return out


def test_actions_are_the_coder_candidates_and_stop(sim, catalogue):
    assert sim.actions == (*catalogue.candidates("coder"), STOP)
    assert "llama-3.1-8b" not in sim.actions  # no coder capability in the catalogue
    assert sim.actions[sim.primary] == "gpt-4.1-mini" and sim.actions[sim.fallback] == "claude-sonnet-4"
    assert sim.role_mask.sum() == len(sim.actions) and sim.role_mask[2].all()  # coder's row only


def test_vec_env_is_seeded_and_reproducible(sim):
    a = _run(CodeTaskVecEnv(sim, n_envs=16, seed=3), 40)
    b = _run(CodeTaskVecEnv(sim, n_envs=16, seed=3), 40)
    c = _run(CodeTaskVecEnv(sim, n_envs=16, seed=4), 40)
    for x, y in zip(a, b):
        for u, v in zip(x, y):
            np.testing.assert_array_equal(u, v)
    assert any(not np.array_equal(x[1], z[1]) for x, z in zip(a, c))


def test_an_episode_step_by_step(sim):
    env = CodeTaskVecEnv(sim, n_envs=1, seed=0)
    task = int(env.task[0])
    o0 = env.observe()
    assert (o0.step[0], o0.failure_count[0], o0.primary_failure_count[0], o0.last_outcome[0]) == (0, 0, 0, 0)
    assert o0.prompt_tokens[0] == sim.tasks[task].prompt_tokens
    # the primary (the weakest coder) until it fails, then check the observation after the failure
    for _ in range(200):
        _, r, done, _, info = env.step(np.array([sim.primary]))
        if not done[0]:
            break
        task = int(env.task[0])
    else:
        pytest.fail("the primary never failed in 200 episodes")
    o1 = env.observe()
    kind = int(info["outcome"][0])
    assert OUTCOME_KINDS[kind] != "pass"
    assert (o1.step[0], o1.failure_count[0], o1.primary_failure_count[0]) == (1, 1, 1)
    assert LAST_OUTCOMES[o1.last_outcome[0]] == OUTCOME_KINDS[kind]
    assert o1.prompt_tokens[0] == sim.tasks[task].prompt_tokens + sim.config.feedback_tokens
    x = sim.obs_spec.encode(o1)[0]
    nf = len(sim.families)
    assert x[sim.families.index(sim.tasks[task].family)] == 1.0 and x[:nf].sum() == 1.0
    assert x[nf] == pytest.approx(sim.tasks[task].difficulty)
    assert x[nf + 5 + kind] == 1.0 and x[nf + 5:].sum() == 1.0
    # the failure's reward: -0.15 (or -0.5 for a timeout) minus cost and latency at attempt 0
    cost, lat = sim.call_cost(np.array([task]), np.array([sim.primary]), np.array([0]))
    base = -0.5 if OUTCOME_KINDS[kind] == "timeout" else -0.15
    assert r[0] == pytest.approx(base - 5.0 * cost[0] - 0.01 * lat[0])
    # stop ends the episode with reward 0 and the next task starts at attempt 0
    _, r, done, _, info = env.step(np.array([sim.stop]))
    assert done[0] and r[0] == 0.0 and info["outcome"][0] == -1 and info["episode_length"][0] == 2
    assert env.observe().step[0] == 0


def test_reward_of_a_pass_follows_reward_v2_and_latency(sim):
    task, model, step = np.array([0, 0]), np.array([0, 3]), np.array([0, 2])
    cost, lat = sim.call_cost(task, model, step)
    r = sim.reward(np.array([OUTCOME_KINDS.index("pass")] * 2), step, cost, lat)
    np.testing.assert_allclose(r, 1.25 - 0.1 * step - 5.0 * cost - 0.01 * lat)
    v1 = SimConfig(**sim.config.model_dump() | {"reward": {"version": "reward_v1"}, "latency_weight": 0.0})
    sim1 = CodeTaskSim(sim.tasks, sim.outcomes, sim.catalogue, sim.table, v1)
    np.testing.assert_allclose(sim1.reward(np.array([0, 0]), step, cost, lat), 1.25 - 0.1 * step)


def test_episodes_end_after_max_attempts(sim):
    env = CodeTaskVecEnv(sim, n_envs=64, seed=1)
    lengths = []
    for _ in range(60):
        _, _, done, _, info = env.step(np.full(64, sim.primary))
        lengths += info["episode_length"][done].tolist()
    assert max(lengths) == sim.config.max_attempts and min(lengths) >= 1


def test_first_attempt_pass_rate_matches_capability_minus_difficulty(suite, catalogue, table):
    tasks, df = suite
    # one task whose reference passes and whose wrong candidates never pass
    sim = CodeTaskSim.build(tasks, df, catalogue, table)
    i = next(i for i in range(len(sim)) if sim.ref_dist[i, 0] == 1 and sim.wrong_dist[i, 0] == 0)
    env = CodeTaskVecEnv(sim, np.array([i]), n_envs=4000, seed=2)
    for model in (sim.primary, sim.fallback):
        env.reset()
        _, _, _, _, info = env.step(np.full(4000, model))
        p = sim.p_correct(np.array([i]), np.array([model]), np.array([0]), np.array([0]))[0]
        assert info["passed"].mean() == pytest.approx(p, abs=4 * np.sqrt(p * (1 - p) / 4000) + 1e-3)


def test_wrong_candidates_bring_the_outcome_the_sandbox_recorded(suite, catalogue, table):
    tasks, df = suite
    df = df.copy()
    t = tasks[0]
    wrong = [c.candidate_id for c in t.wrong_candidates()]
    df.loc[df["candidate_id"].isin(wrong), "outcome"] = "killed"
    sim = CodeTaskSim.build(tasks, df, catalogue, table)
    env = CodeTaskVecEnv(sim, np.array([0]), n_envs=2000, seed=5)
    _, _, _, _, info = env.step(np.full(2000, sim.primary))
    kinds = {OUTCOME_KINDS[k] for k in info["outcome"]}
    assert kinds == {"pass", "killed"}
    assert (info["candidate"][~info["correct"]] >= 0).all()


def test_gymnasium_env_passes_the_checker_and_is_seeded(sim):
    env = CodeTaskEnv(sim)
    check_env(env, skip_render_check=True)
    assert isinstance(env.action_space, gym.spaces.Discrete) and env.action_space.n == len(sim.actions)

    def episode(seed):
        obs, info = env.reset(seed=seed)
        trace = [obs]
        done = False
        while not done:
            obs, r, done, _trunc, step_info = env.step(sim.primary)
            trace += [obs, r, step_info["outcome"]]
        return info["task_id"], trace

    a, b = episode(11), episode(11)
    assert a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
    with pytest.raises(RuntimeError, match="reset"):
        CodeTaskEnv(sim).step(0)
    assert env.reset(options={"task": 5})[1]["task_id"] == sim.tasks[5].task_id
    with pytest.raises(ValueError, match="not a task index"):
        env.reset(options={"task": len(sim)})


def test_invalid_actions_are_refused(sim):
    env = CodeTaskVecEnv(sim, n_envs=2)
    with pytest.raises(ValueError, match=r"ints in \[0, 5\]"):
        env.step(np.array([0, 6]))


def test_missing_outcomes_go_through_the_executor_once(suite, catalogue, table):
    tasks, df = suite
    t0 = tasks[0]
    dropped = {c.candidate_id for c in t0.candidates}
    calls = []

    def execute(jobs):
        calls.append(jobs)
        return [ExecResult("pass" if j.code == t0.reference else "exception", 0, 3, 0.01) for j in jobs]

    sim = CodeTaskSim.build(tasks, df[~df["candidate_id"].isin(dropped)], catalogue, table, execute=execute)
    assert len(calls) == 1 and sim.outcomes.executed == len(calls[0]) == 1 + len(t0.wrong_candidates())
    assert {j.code for j in calls[0]} == {c.code for c in [t0.candidates[0], *t0.wrong_candidates()]}
    assert set(sim.outcomes.wrong_kind[0][: sim.outcomes.n_wrong[0]]) == {OUTCOME_KINDS.index("exception")}


def test_missing_outcomes_without_an_executor_are_a_clear_error(suite, catalogue, table):
    tasks, df = suite
    with pytest.raises(RolloutsError, match=r"1 candidate\(s\).*task 'strings-0000' candidate 'strings-0000/"
                                            r"reference'.*Materialize sandbox_rollouts"):
        CodeTaskSim.build(tasks, df[df["candidate_id"] != "strings-0000/reference"], catalogue, table)
    with pytest.raises(RolloutsError, match="the rollout cache is empty"):
        CodeTaskSim.build(tasks, df.iloc[:0], catalogue, table)


def test_an_empty_rollout_cache_is_a_clear_error(tmp_path, suite):
    with pytest.raises(RolloutsError, match="no rollouts.*materialize"):
        read_rollouts(tmp_path / "rollouts")
    (tmp_path / "rollouts").mkdir()
    suite[1].iloc[:0].to_parquet(tmp_path / "rollouts" / "shard-00.parquet")
    with pytest.raises(RolloutsError, match="hold no rows"):
        read_rollouts(tmp_path / "rollouts")


def test_an_unknown_outcome_names_the_candidate_and_field(suite, catalogue, table):
    tasks, df = suite
    df = df.copy()
    df.loc[3, "outcome"] = "exploded"
    with pytest.raises(RolloutsError, match=rf"row 3 \(candidate '{df.loc[3, 'candidate_id']}'\): field "
                                            r"'outcome' is 'exploded'"):
        CodeTaskSim.build(tasks, df, catalogue, table)


def test_tasks_without_a_wrong_candidate_are_skipped_with_the_reason(suite, catalogue, table):
    tasks, df = suite
    t = tasks[1]
    only_equivalent = dataclasses.replace(t, candidates=[c if c.kind == "reference" else
                                                         dataclasses.replace(c, equivalent=True)
                                                         for c in t.candidates])
    sim = CodeTaskSim.build([tasks[0], only_equivalent, *tasks[2:]], df, catalogue, table)
    assert len(sim) == len(tasks) - 1 and "equivalent" in sim.skipped[t.task_id]


def test_a_tasks_file_from_another_version_is_refused(tmp_path, suite):
    path = write_tasks(tmp_path / "tasks.jsonl", suite[0][:3], seed=0)
    assert len(read_tasks(path)) == 3
    lines = path.read_text().splitlines()
    path.write_text("\n".join(['{"tasks_version": 99, "seed": 0, "n_tasks": 3}', *lines[1:]]) + "\n")
    with pytest.raises(TasksFileError, match=r"tasks.jsonl:1: tasks_version 99.*re-materialize sim_tasks"):
        read_tasks(path)


def _edit(d: dict, **kw) -> bytes:
    return json.dumps({**d, **kw}).encode()


def _set_candidate(d: dict, **kw) -> dict:
    return [{**d["candidates"][0], **kw}, *d["candidates"][1:]]


@pytest.mark.parametrize("line, bad, match", [
    (3, lambda d, raw: b'"just a string"',
     r"tasks.jsonl:3: a task record must be a JSON object, got \"just a"),
    (3, lambda d, raw: raw.replace(b'"prompt":"', b'"prompt":"\xff'),
     r"tasks.jsonl:3: task record is not UTF-8"),
    (1, lambda d, raw: b'{"tasks_version": 1\xe9}', r"tasks.jsonl:1: header is not UTF-8"),
    (3, lambda d, raw: raw[:-5], r"tasks.jsonl:3: task record is not JSON"),
    (3, lambda d, raw: _edit(d, tests=5), r"tasks.jsonl:3: field 'tests' is 5, expected a list"),
    (3, lambda d, raw: _edit(d, tests=[5]), r"tasks.jsonl:3: field 'tests\[0\]' is 5, expected an object"),
    (3, lambda d, raw: _edit(d, difficulty=True),
     r"tasks.jsonl:3: field 'difficulty' is true, expected a number"),
    (3, lambda d, raw: _edit({k: v for k, v in d.items() if k != "prompt"}),
     r"tasks.jsonl:3: field 'prompt' is missing"),
    (3, lambda d, raw: _edit(d, promt="typo"), r"tasks.jsonl:3: field 'promt' is unknown to a TaskRecord"),
    (3, lambda d, raw: _edit(d, candidates=_set_candidate(d, equivalent="no")),
     r"tasks.jsonl:3: field 'candidates\[0\].equivalent' is \"no\", expected true or false"),
    (4, lambda d, raw: raw + b"\n" + raw,  # the last task twice: line 5 repeats line 4
     r"tasks.jsonl:5: field 'task_id' '.+' repeats the task of line 4"),
], ids=["bare-string", "non-utf8", "header-non-utf8", "truncated", "tests-not-a-list", "test-not-an-object",
        "bool-difficulty", "missing-field", "unknown-field", "candidate-field", "duplicate-id"])
def test_a_bad_line_in_the_tasks_file_names_the_file_line_and_field(tmp_path, suite, line, bad, match):
    path = write_tasks(tmp_path / "tasks.jsonl", suite[0][:3], seed=0)
    lines = path.read_bytes().splitlines()
    lines[line - 1] = bad(json.loads(lines[line - 1]), lines[line - 1])
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(TasksFileError, match=match) as err:
        read_tasks(path)
    assert "re-materialize sim_tasks" in str(err.value)


def test_the_reports_sim_config_is_written_as_before():
    """ppo_policy.json's sim_config (escalation env) is SimConfig.to_dict(): byte for byte what
    the dataclass wrote (the reward as its fields), so existing readers and reports agree."""
    assert json.dumps(SimConfig().to_dict()) == (
        '{"role": "coder", "max_attempts": 4, "sharpness": 8.0, "bias": 0.0, "retry_gain": 0.3, "feedback_gain": '
        '{"none": 0.0, "wrong_answer": 0.4, "exception": 0.3, "timeout": -0.2, "oom": 0.0, "killed": 0.0}, '
        '"context_penalty": 1.5, "feedback_tokens": 200, "reward": {"version": "reward_v2", "verified_bonus": 0.25, '
        '"failed_verification_penalty": 0.15, "timeout_penalty": 0.5, "retry_penalty": 0.1, "cost_weight": 5.0}, '
        '"latency_weight": 0.01}')
    raw = json.loads(json.dumps(SimConfig(max_attempts=2, reward={"version": "reward_v1"}).to_dict()))
    assert SimConfig(**raw) == SimConfig(max_attempts=2, reward={"version": "reward_v1"})  # reads back


def test_bad_config_and_difficulty(suite, sim, catalogue, table):
    for bad, match in [
        ({"feedback_gain": {"none": 0.0}}, r"\nfeedback_gain\n  Value error, needs exactly the keys \['none', "
                                           r"'wrong_answer', 'exception', 'timeout', 'oom', 'killed'\], "
                                           r"got \['none'\]"),
        ({"role": "boss"}, r"\nrole\n  Input should be 'planner', 'architect', 'coder', .* input_value='boss'"),
        ({"max_attempts": 0}, r"\nmax_attempts\n  Input should be greater than or equal to 1 "),
        ({"max_attempts": 11}, r"\nmax_attempts\n  Input should be less than or equal to 10 "),
        ({"latency_weight": -0.1}, r"\nlatency_weight\n  Input should be greater than or equal to 0 "),
        ({"feedback_tokens": -1}, r"\nfeedback_tokens\n  Input should be greater than or equal to 0 "),
        ({"reward": {"version": "reward_v9"}}, r"\nreward\.version\n  Input should be 'reward_v1' or 'reward_v2'"),
        ({"max_attempt": 3}, r"\nmax_attempt\n  Extra inputs are not permitted"),
    ]:
        with pytest.raises(ValidationError, match=match):
            SimConfig(**bad)
    bad = dataclasses.replace(suite[0][0], difficulty=1.5)
    with pytest.raises(ValueError, match=r"task 'strings-0000': field 'difficulty' is 1.5"):
        CodeTaskSim.build([bad, *suite[0][1:]], suite[1], catalogue, table)
    with pytest.raises(ValueError, match="family index"):
        ObsSpec(families=("a",)).encode(sim.observe(np.array([1]), 0, 0, 0))


def test_rollouts_written_as_shards_read_back(tmp_path, suite, catalogue, table):
    folder = write_rollouts(suite[1], tmp_path / "rollouts", shards=3)
    df = read_rollouts(folder)
    assert len(df) == len(suite[1])
    sim = CodeTaskSim.build(suite[0], df, catalogue, table)
    assert len(sim) == len(suite[0]) and isinstance(df, pd.DataFrame)


def test_the_batch_env_is_a_gymnasium_vector_env(sim):
    from gymnasium.vector import AutoresetMode

    env = CodeTaskVecEnv(sim, n_envs=8, seed=0)
    assert isinstance(env, gym.vector.VectorEnv) and env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, info = env.reset(seed=4)
    assert info == {} and env.observation_space.contains(obs)
    wrapped = gym.wrappers.vector.RecordEpisodeStatistics(env)
    wrapped.reset(seed=4)
    env.action_space.seed(0)
    seen = 0
    for _ in range(30):
        obs, r, term, trunc, info = wrapped.step(env.action_space.sample())
        assert env.observation_space.contains(obs) and not trunc.any()
        if term.any():
            seen += int(term.sum())
            assert info["_final_obs"].tolist() == term.tolist()
            np.testing.assert_allclose(info["episode"]["r"][term], info["episode_return"][term])
            # the final observation is the finished episode's, the returned one the next episode's first
            assert (obs[term][:, len(sim.families) + 2] == 0).all()  # step column of a fresh episode
    assert seen > 10


def test_the_batch_envs_direct_encoding_is_the_specs(sim):
    env = CodeTaskVecEnv(sim, n_envs=64, seed=2)
    rng = np.random.default_rng(0)
    for _ in range(30):
        np.testing.assert_array_equal(env.encode(), sim.obs_spec.encode(env.observe()))
        obs, _, done, _, info = env.step(rng.integers(0, env.n_actions, 64))
        np.testing.assert_array_equal(obs, sim.obs_spec.encode(env.observe()))
        rows = np.flatnonzero(done)
        np.testing.assert_array_equal(env.encode(rows), sim.obs_spec.encode(env.observe().take(rows)))
