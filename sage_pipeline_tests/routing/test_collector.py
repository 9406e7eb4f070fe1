"""The synthetic collector writes journals in SAGE's own shape (date-named .log files,
MODEL_ROUTING_DECISION and TOKEN_USAGE before each TRAJECTORY_STEP, no step) whose
propensities and episodes are exactly those of its behaviour policy in the simulator."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import time
from collections import Counter
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sage_pipeline.routing import collector
from sage_pipeline.routing.catalogue import DEFAULT_CATALOGUE
from sage_pipeline.routing.collector import CollectorConfig, collect
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.ingest import IngestConfig, ingest
from sage_pipeline.routing.policy import EpsilonGreedyPolicy, StaticTablePolicy, UniformPolicy
from sage_pipeline.routing.reward import sage_step_reward
from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN, ROLE_INDEX, ROLES, TRAJECTORY_STEP
from sage_pipeline.sage.table import DEFAULT_TABLE

CONFIG = CollectorConfig(episodes=400, seed=3, epsilon=0.3, sessions_per_day=30)
STATE_FIELDS = {
    "task_complexity_score",
    "primary_failure_count",
    "failure_count",
    "prompt_tokens",
    "verification_passed",
    "timed_out",
    "failed_reason",
    "reviewer_score",
    "latency_s",
    "cost_usd",
}


@pytest.fixture(scope="module")
def collected(sim, tmp_path_factory):
    out = tmp_path_factory.mktemp("synthetic")
    messages: list[str] = []
    res = collect(sim, out, CONFIG, progress=messages.append)
    return out, res, messages


def read_events(files: list[Path]) -> list[dict]:
    events = []
    for f in files:
        raw = f.read_bytes()
        assert raw.endswith(b"\n")
        for line in raw.decode("utf-8").split("\n")[:-1]:
            obj = json.loads(line)
            assert isinstance(obj, dict)
            events.append(obj)
    return events


@pytest.fixture(scope="module")
def events(collected) -> list[dict]:
    return read_events(collected[1].files)


@pytest.fixture(scope="module")
def steps(events) -> list[dict]:
    return [e for e in events if e["type"] == TRAJECTORY_STEP]


def attempt(e: dict) -> int:
    """The attempt index of a TRAJECTORY_STEP: SAGE logs no step; the state's failure count is it."""
    return e["state"]["failure_count"]


def test_result_and_files(collected, events, steps):
    out, res, messages = collected
    assert res.episodes == 400
    n_days = -(-res.sessions // 30)
    days = [(datetime(2026, 11, 1) + timedelta(days=d)).date().isoformat() for d in range(n_days)]
    assert [p.name for p in res.files] == [f"{d}.log" for d in days]  # SAGE's memory/sessions/YYYY-MM-DD.log
    assert sorted(out.glob("*.log")) == res.files
    assert res.events == len(events)
    assert res.decisions == len(steps)
    counts = Counter(e["type"] for e in events)
    assert counts == {"SESSION_START": res.sessions, "SESSION_END": res.sessions,
                      "MODEL_ROUTING_DECISION": res.decisions, "TOKEN_USAGE": res.decisions,
                      TRAJECTORY_STEP: res.decisions}
    assert len({(e["session_id"], e["task_id"]) for e in steps}) == 400
    assert messages[0] == (f"simulated 400 episodes, {res.decisions} decisions, {res.sessions} sessions "
                           "(multi_model)")
    assert messages[1] == (f"wrote {res.events} events to {len(res.files)} journals in "
                           f"{res.version}{collector.PARTIAL_SUFFIX}")
    assert messages[2] == f"switched {out} to {res.version}"
    assert out.is_symlink() and out.resolve() == res.version.resolve()
    # every event of a day's file is dated that day, as SAGE appends by date
    for f in res.files:
        for e in read_events([f]):
            assert datetime.fromisoformat(e["timestamp"]).date().isoformat() == f.stem


def test_sessions_are_framed_and_each_step_follows_its_routing_decision(events, table):
    by_session: dict[str, list[dict]] = {}
    for e in events:
        assert {"type", "timestamp", "session_id"} <= e.keys()
        by_session.setdefault(e["session_id"], []).append(e)
    for evs in by_session.values():
        assert evs[0]["type"] == "SESSION_START" and evs[-1]["type"] == "SESSION_END"
        assert evs[0]["extra"]["synthetic"] is True
        stamps = [datetime.fromisoformat(e["timestamp"]) for e in evs]
        assert all(a < b for a, b in pairwise(stamps))  # strictly increasing within a session
        assert all(t.utcoffset() == timedelta(0) for t in stamps)
        assert all(e["timestamp"].endswith("+00:00") and "." in e["timestamp"] for e in evs)
        body = evs[1:-1]
        assert len(body) % 3 == 0
        for mrd, tu, e in zip(body[0::3], body[1::3], body[2::3]):
            assert (mrd["type"], tu["type"], e["type"]) == ("MODEL_ROUTING_DECISION", "TOKEN_USAGE", TRAJECTORY_STEP)
            model, role = e["action"]["model_chosen"], e["agent"]
            assert mrd["agent_role"] == role and mrd["selected_model"] == model and tu["model"] == model
            route = table.routes[role]
            assert (mrd["primary_model"], mrd["fallback_model"]) == (route.primary, route.fallback)
            assert mrd["task_complexity_score"] == e["state"]["task_complexity_score"]
            assert mrd["primary_failure_count"] == e["state"]["primary_failure_count"]
            assert mrd["propensity"] == e["propensity"]
            assert tu["prompt_tokens"] == e["state"]["prompt_tokens"]
            values = {"task_complexity_score": np.array([e["state"]["task_complexity_score"]]),
                      "primary_failure_count": np.array([e["state"]["primary_failure_count"]]),
                      "failure_count": np.array([e["state"]["failure_count"]])}
            fired = [str(t) for t in route.triggers if t.fires(values)[0]]
            assert mrd["matched_fallback_triggers"] == fired
            table_model = route.fallback if fired else route.primary
            assert mrd["policy_source"] == ("yaml" if model == table_model else "learned")
    assert min(by_session) == "syn-3-000000"


def test_trajectory_steps_have_sages_shape(steps, catalogue):
    for e in steps:
        # no step: SAGE writes none; propensity is the one extension key
        assert e.keys() == {"type", "timestamp", "session_id", "task_id", "agent", "action", "propensity",
                            "state", "reward", "terminal", "extra"}
        assert e["agent"] in ROLES
        assert e["action"]["model_chosen"] in catalogue.candidates(e["agent"])
        assert e["action"]["prompt_strategy_key"] == "default"
        assert isinstance(e["propensity"], float) and 0.0 < e["propensity"] <= 1.0
        assert isinstance(e["reward"], float) and REWARD_MIN <= e["reward"] <= REWARD_MAX
        assert isinstance(e["terminal"], bool)
        assert e["state"].keys() == STATE_FIELDS
        s = e["state"]
        assert 0.0 <= s["task_complexity_score"] <= 1.0
        assert isinstance(s["primary_failure_count"], int) and isinstance(s["failure_count"], int)
        assert isinstance(s["prompt_tokens"], int)
        assert isinstance(s["verification_passed"], bool) and isinstance(s["timed_out"], bool)
        assert s["failed_reason"] == (
            "timeout" if s["timed_out"] else None if s["verification_passed"] else "verification_failed"
        )
        assert not (s["timed_out"] and s["verification_passed"])
        assert e["extra"] == {"synthetic": True}
        assert e["task_id"].startswith(e["session_id"] + "-t")


def _contexts(steps: list[dict]) -> Contexts:
    return Contexts(
        role=np.array([ROLE_INDEX[e["agent"]] for e in steps], dtype=np.int64),
        task_complexity_score=np.array([e["state"]["task_complexity_score"] for e in steps]),
        prompt_tokens=np.array([e["state"]["prompt_tokens"] for e in steps], dtype=np.float64),
        step=np.array([attempt(e) for e in steps], dtype=np.int64),
        failure_count=np.array([e["state"]["failure_count"] for e in steps], dtype=np.int64),
        primary_failure_count=np.array([e["state"]["primary_failure_count"] for e in steps], dtype=np.int64),
    )


def test_logged_propensity_is_the_behaviour_probability_of_the_logged_action(steps, catalogue, table):
    behaviour = EpsilonGreedyPolicy(StaticTablePolicy(table, catalogue), CONFIG.epsilon)
    ctx = _contexts(steps)
    probs = behaviour.action_probs(ctx)
    action = np.array([catalogue.index[e["action"]["model_chosen"]] for e in steps])
    logged = np.array([e["propensity"] for e in steps])
    np.testing.assert_allclose(logged, probs[np.arange(len(steps)), action], rtol=0, atol=1e-9)
    # the table's choice carries 1 - eps + eps/k, an exploration eps/k
    table_choice = StaticTablePolicy(table, catalogue).choose(ctx)
    k = catalogue.role_mask()[ctx.role].sum(axis=1)
    greedy = action == table_choice
    np.testing.assert_allclose(logged[greedy], (1 - 0.3 + 0.3 / k)[greedy], atol=1e-9)
    np.testing.assert_allclose(logged[~greedy], (0.3 / k)[~greedy], atol=1e-9)
    # exploration happens about as often as the behaviour policy says
    expected_explore = (0.3 * (1 - 1 / k)).sum()
    sd = np.sqrt((0.3 * (1 - 1 / k) * (1 - 0.3 * (1 - 1 / k))).sum())
    assert abs((~greedy).sum() - expected_explore) < 4 * sd


def _episodes(steps: list[dict]) -> dict[tuple[str, str], list[dict]]:
    eps: dict[tuple[str, str], list[dict]] = {}
    for e in steps:
        eps.setdefault((e["session_id"], e["task_id"]), []).append(e)
    return eps


def test_episodes_are_multi_step_and_stop_at_success_or_max_attempts(steps, sim, table):
    T = sim.config.max_attempts
    episodes = _episodes(steps)
    assert len(episodes) == 400
    lengths = Counter(len(v) for v in episodes.values())
    assert lengths[1] < 400 and max(lengths) == T and min(lengths) == 1  # some are multi-step
    assert any(attempt(e) > 0 for e in steps)
    for ep in episodes.values():
        assert [attempt(e) for e in ep] == list(range(len(ep)))  # in file order, times increasing
        assert [e["terminal"] for e in ep] == [False] * (len(ep) - 1) + [True]
        last = ep[-1]
        assert last["state"]["verification_passed"] or attempt(last) == T - 1
        assert not any(e["state"]["verification_passed"] for e in ep[:-1])
        # the task is fixed; its state evolves as the simulator says
        assert len({(e["agent"], e["state"]["task_complexity_score"]) for e in ep}) == 1
        pfc = 0
        primary = table.routes[ep[0]["agent"]].primary
        for e in ep:
            s = e["state"]
            assert s["primary_failure_count"] == pfc
            assert s["prompt_tokens"] == ep[0]["state"]["prompt_tokens"] + 800 * attempt(e)
            pfc += (not s["verification_passed"]) and e["action"]["model_chosen"] == primary


def test_logged_reward_and_cost_follow_the_outcome(steps, catalogue):
    score = np.array([e["state"]["reviewer_score"] for e in steps])
    passed = np.array([e["state"]["verification_passed"] for e in steps])
    timed_out = np.array([e["state"]["timed_out"] for e in steps])
    step = np.array([attempt(e) for e in steps])
    want = np.round(sage_step_reward(score, passed, timed_out, step), 6)
    np.testing.assert_allclose([e["reward"] for e in steps], want, atol=1e-12)
    action = np.array([catalogue.index[e["action"]["model_chosen"]] for e in steps])
    tokens = np.array([e["state"]["prompt_tokens"] for e in steps], dtype=np.float64)
    np.testing.assert_allclose(
        [e["state"]["cost_usd"] for e in steps], catalogue.cost_usd(action, tokens), atol=5e-7
    )
    assert (score[timed_out] == 0).all()


def test_manifest_has_ground_truth(collected, sim, table, catalogue):
    out, res, _ = collected
    assert res.manifest == out / "simulator.json"
    m = json.loads(res.manifest.read_text())
    assert m["episodes"] == 400 and m["sessions"] == res.sessions and m["decisions"] == res.decisions
    assert m["files"] == [p.name for p in res.files] and m["layout"] == "sage_journal"
    assert m["collector"]["seed"] == 3 and m["collector"]["epsilon"] == 0.3
    assert m["simulator"]["max_attempts"] == sim.config.max_attempts
    assert m["model_catalogue"]["path"] == str(DEFAULT_CATALOGUE)
    assert len(m["model_catalogue"]["sha256"]) == 64 and len(m["routing_table"]["sha256"]) == 64
    assert m["routing_table"]["path"] == str(DEFAULT_TABLE)
    gt = m["ground_truth_value"]
    assert gt == res.ground_truth
    assert set(gt) == {"static_table", "behaviour", "uniform", "oracle"}
    assert (
        gt["oracle"] >= gt["static_table"]
        and gt["oracle"] >= gt["behaviour"]
        and gt["oracle"] >= gt["uniform"]
    )
    assert gt["oracle"] - gt["static_table"] > 0.02
    # the values are exact values of the collector's tasks (its rng's first draw)
    tasks = sim.sample_tasks(400, np.random.default_rng(3))
    static = StaticTablePolicy(table, catalogue)
    assert gt["static_table"] == pytest.approx(sim.policy_value(static, tasks).mean, abs=1e-12)
    assert gt["uniform"] == pytest.approx(
        sim.policy_value(UniformPolicy(catalogue.actions, catalogue.role_mask()), tasks).mean, abs=1e-12
    )
    assert gt["behaviour"] == pytest.approx(
        sim.policy_value(EpsilonGreedyPolicy(static, 0.3), tasks).mean, abs=1e-12
    )
    assert gt["oracle"] == pytest.approx(sim.optimal_value(tasks).mean, abs=1e-12)
    by_role = m["ground_truth_value_by_role"]
    assert set(by_role["oracle"]) == set(ROLES)
    for r in ROLES:
        assert by_role["oracle"][r] >= by_role["static_table"][r] - 1e-9


def test_logged_tasks_are_the_simulated_tasks(steps, sim):
    tasks = sim.sample_tasks(400, np.random.default_rng(3))
    first = [e for e in steps if attempt(e) == 0]
    assert len(first) == 400
    first.sort(key=lambda e: (e["session_id"], e["task_id"]))
    assert [ROLE_INDEX[e["agent"]] for e in first] == tasks.role.tolist()
    assert [e["state"]["task_complexity_score"] for e in first] == tasks.task_complexity_score.tolist()
    assert [e["state"]["prompt_tokens"] for e in first] == tasks.prompt_tokens.astype(int).tolist()


def test_same_seed_same_bytes_and_other_seed_differs(sim, tmp_path):
    cfg = CollectorConfig(episodes=60, seed=5, sessions_per_day=4)
    a = collect(sim, tmp_path / "a", cfg, progress=lambda m: None)
    b = collect(sim, tmp_path / "b", cfg, progress=lambda m: None)
    assert [p.name for p in a.files] == [p.name for p in b.files]
    for pa_, pb in zip(a.files, b.files):
        assert pa_.read_bytes() == pb.read_bytes()
    c = collect(sim, tmp_path / "c", CollectorConfig(episodes=60, seed=6, sessions_per_day=4), progress=lambda m: None)
    assert c.files[0].name == "2026-11-01.log"
    assert c.files[0].read_bytes() != a.files[0].read_bytes()


def test_rerun_with_fewer_episodes_replaces_the_whole_set(sim, tmp_path):
    out = tmp_path / "synthetic"
    big = collect(sim, out, CollectorConfig(episodes=200, seed=1, sessions_per_day=5), progress=lambda m: None)
    assert len(big.files) > 3
    big_names = [p.name for p in big.files]
    (out / "notes.txt").write_text("written into the set: it goes with it")
    small = collect(sim, out, CollectorConfig(episodes=10, seed=1, sessions_per_day=5), progress=lambda m: None)
    assert len(small.files) < len(big.files)
    # nothing of the earlier set and no temporary files: out_dir is exactly the new set
    assert sorted(out.iterdir()) == sorted([*small.files, out / "simulator.json"])
    assert json.loads((out / "simulator.json").read_text())["files"] == [p.name for p in small.files]
    assert sum(1 for e in read_events(small.files) if e["type"] == TRAJECTORY_STEP) == small.decisions
    # the set it replaced stays whole beside (a reader may still be in it) until the next run
    versions = collector.default_versions_dir(out)
    assert sorted(p.name for p in big.version.glob("*.log")) == big_names
    third = collect(sim, out, CollectorConfig(episodes=10, seed=2, sessions_per_day=5), progress=lambda m: None)
    assert not big.version.exists()
    assert sorted(versions.iterdir()) == sorted([versions / ".lock", small.version, third.version])


def test_sage_binary_explores_only_primary_and_fallback(sim, table, catalogue, tmp_path):
    res = collect(sim, tmp_path, CollectorConfig(episodes=300, seed=4, action_space="sage_binary"),
                  progress=lambda m: None)
    events = read_events(res.files)
    steps = [e for e in events if e["type"] == TRAJECTORY_STEP]
    pairs = Counter((e["agent"], e["action"]["model_chosen"]) for e in steps)
    for (role, model) in pairs:
        assert model in (table.routes[role].primary, table.routes[role].fallback)
    for e in events:
        if e["type"] == "MODEL_ROUTING_DECISION":
            assert e["selected_model"] in (e["primary_model"], e["fallback_model"])
    # both of a role's two models are logged (epsilon explores the one the table did not choose)
    assert sum(1 for (r, _) in pairs if r == "coder") == 2
    # propensities: 1 - eps/2 for the table's choice, eps/2 for the other (k = 2)
    assert {round(e["propensity"], 9) for e in steps} == {0.85, 0.15}
    mask = collector.binary_mask(sim)
    assert (mask.sum(axis=1) == 2).all() and not (mask & ~catalogue.role_mask()).any()
    behaviour = EpsilonGreedyPolicy(collector._Restricted(StaticTablePolicy(table, catalogue), mask), 0.3)
    ctx = _contexts(steps)
    action = np.array([catalogue.index[e["action"]["model_chosen"]] for e in steps])
    np.testing.assert_allclose([e["propensity"] for e in steps],
                               behaviour.action_probs(ctx)[np.arange(len(steps)), action], atol=1e-9)
    # the manifest's truth: the binary space's uniform, behaviour and exact optimum
    m = json.loads(res.manifest.read_text())
    assert m["collector"]["action_space"] == "sage_binary" and m["layout"] == "sage_journal"
    gt = m["ground_truth_value"]
    assert gt == res.ground_truth
    assert set(gt) == {"static_table", "behaviour", "uniform", "oracle", "binary_oracle"}
    tasks = sim.sample_tasks(300, np.random.default_rng(4))
    assert gt["binary_oracle"] == pytest.approx(sim.optimal_value(tasks, mask).mean, abs=1e-12)
    assert gt["uniform"] == pytest.approx(sim.policy_value(UniformPolicy(catalogue.actions, mask), tasks).mean,
                                          abs=1e-12)
    assert gt["behaviour"] == pytest.approx(sim.policy_value(behaviour, tasks).mean, abs=1e-12)
    assert gt["static_table"] <= gt["binary_oracle"] <= gt["oracle"] + 1e-12
    for role, v in m["ground_truth_value_by_role"]["binary_oracle"].items():
        assert m["ground_truth_value_by_role"]["static_table"][role] <= v + 1e-9


def test_journals_ingest_with_every_step_derived_and_the_propensity_kept(collected, steps, tmp_path):
    """Through the project's own ingest (``ingest(config, out_dir)``), as SAGE's journals go."""
    import pyarrow.parquet as pq

    out, res, _ = collected
    r = ingest(IngestConfig(log_dirs=(out,)), tmp_path, progress=lambda m: None)
    assert r.stats.files == [str(p) for p in res.files]  # simulator.json is not a journal
    assert r.stats.lines_read == res.events and r.stats.quarantined == 0
    assert r.stats.steps_accepted == res.decisions == r.stats.steps_without_step  # no step logged
    assert r.stats.routing_decisions == r.stats.token_usage == res.decisions
    assert r.stats.sessions_from_file_stem == 0  # session_id is logged, as with SAGE_SESSION_ID set
    assert dict(r.stats.other_events) == {"SESSION_START": res.sessions, "SESSION_END": res.sessions,
                                          "MODEL_ROUTING_DECISION": res.decisions, "TOKEN_USAGE": res.decisions}
    traj = pq.read_table(r.trajectories).to_pandas()
    assert traj["step"].isna().all() and (traj["session_id_source"] == "logged").all()
    assert (traj["data_source"] == "synthetic").all()
    logged = {(e["session_id"], e["task_id"], e["timestamp"]): e["propensity"] for e in steps}
    got = {(s, t, ts): p for s, t, ts, p in traj[["session_id", "task_id", "timestamp", "propensity"]].itertuples(
        index=False)}
    assert got == logged
    mrd = pq.read_table(r.routing_decisions).to_pandas()
    assert set(mrd["policy_source"]) == {"yaml", "learned"}


def test_session_sizes_cover_every_task_once():
    rng = np.random.default_rng(0)
    for n in (1, 2, 7, 400, 5000):
        sizes = collector._session_sizes(n, 4.0, rng)
        assert sizes.sum() == n and (sizes >= 1).all()
    assert collector._session_sizes(50, 1.0, rng).tolist() == [1] * 50


# ------------------------------------------------------------------ the phases of a collection
def test_simulate_phase_sorts_decisions_by_task_then_attempt_and_frames_sessions(sim):
    cfg = CollectorConfig(episodes=300, seed=4)
    ep = collector._simulate(sim, cfg)
    assert len(ep.tasks) == 300 and ep.sizes.sum() == 300 and (ep.sizes >= 1).all()
    key = ep.rows["task"] * 10 + ep.rows["step"]
    assert (np.diff(key) > 0).all()  # by task, then attempt, each (task, attempt) once
    assert ep.bounds[0] == 0 and ep.bounds[-1] == ep.decisions and len(ep.bounds) == 301
    for t in (0, 17, 299):  # a task's rows, attempts 0..n-1, the last one terminal
        rows = slice(ep.bounds[t], ep.bounds[t + 1])
        assert (ep.rows["task"][rows] == t).all()
        assert ep.rows["step"][rows].tolist() == list(range(rows.stop - rows.start))
        assert ep.rows["terminal"][rows].tolist()[-1] and not ep.rows["terminal"][rows][:-1].any()
    assert ep.first_task.tolist() == np.concatenate([[0], np.cumsum(ep.sizes)[:-1]]).tolist()
    again = collector._simulate(sim, cfg)  # seeded: the same draws
    assert all(np.array_equal(ep.rows[k], again.rows[k]) for k in ep.rows) and np.array_equal(ep.sizes, again.sizes)
    binary = collector._simulate(sim, CollectorConfig(episodes=300, seed=4, action_space="sage_binary"))
    assert binary.mask[binary.tasks.role[binary.rows["task"]], binary.rows["action"]].all()  # primary or fallback


def test_a_decision_is_three_events_on_a_clock_that_moves_by_the_latency(sim):
    ep = collector._simulate(sim, CollectorConfig(episodes=200, seed=2))
    journal = collector._Journal(sim, ep, collector._fired(sim, ep.tasks, ep.rows),
                                 sim.table.fallback_index(sim.catalogue), ep.bounds)
    start = datetime(2026, 11, 1, 12, 0, 0).astimezone()
    r = int(np.flatnonzero(ep.rows["step"] > 0)[0])  # a retry: its primary failure count is logged
    task = int(ep.rows["task"][r])
    (mrd, usage, step), clock = journal.decision(task, r, "s1", "s1-t00", start)
    assert [e["type"] for e in (mrd, usage, step)] == ["MODEL_ROUTING_DECISION", "TOKEN_USAGE", TRAJECTORY_STEP]
    latency = timedelta(seconds=float(ep.rows["latency_s"][r]))
    assert clock == start + timedelta(milliseconds=10) + latency
    assert [datetime.fromisoformat(e["timestamp"]) for e in (mrd, usage, step)] == [
        start + timedelta(milliseconds=5), start + timedelta(milliseconds=5) + latency, clock]
    model = sim.actions[ep.rows["action"][r]]
    assert mrd["selected_model"] == usage["model"] == step["action"]["model_chosen"] == model
    assert mrd["propensity"] == step["propensity"] == round(float(ep.rows["propensity"][r]), 10)
    assert step["state"]["primary_failure_count"] == mrd["primary_failure_count"] == ep.rows["primary_failure_count"][r]
    table_choice = journal.fallback[ep.tasks.role[task]] if journal.fired[r] else sim.primary[ep.tasks.role[task]]
    assert mrd["policy_source"] == ("yaml" if ep.rows["action"][r] == table_choice else "learned")


def test_a_session_is_framed_and_holds_its_tasks_decisions_in_order(sim):
    ep = collector._simulate(sim, CollectorConfig(episodes=200, seed=2))
    journal = collector._Journal(sim, ep, collector._fired(sim, ep.tasks, ep.rows),
                                 sim.table.fallback_index(sim.catalogue), ep.bounds)
    s = 3
    first, n = int(ep.first_task[s]), int(ep.sizes[s])
    events = journal.session("syn-0-000003", first, n, datetime(2026, 11, 1).astimezone())
    assert events[0]["type"] == "SESSION_START" and events[-1]["type"] == "SESSION_END"
    assert len(events) == 2 + 3 * int(ep.bounds[first + n] - ep.bounds[first])
    steps = [e for e in events if e["type"] == TRAJECTORY_STEP]
    assert [e["task_id"] for e in steps] == [f"syn-0-000003-t{j:02d}" for j in range(n)
                                             for _ in range(ep.bounds[first + j + 1] - ep.bounds[first + j])]
    stamps = [datetime.fromisoformat(e["timestamp"]) for e in events]
    assert stamps == sorted(stamps) and {e["session_id"] for e in events} == {"syn-0-000003"}


def test_ground_truth_phase_values_the_policies_on_the_simulated_tasks(sim):
    ep = collector._simulate(sim, CollectorConfig(episodes=400, seed=1))
    gt, by_role = collector._ground_truth(sim, ep, CollectorConfig(episodes=400, seed=1))
    assert set(gt) == set(by_role) == {"static_table", "behaviour", "uniform", "oracle"}
    assert gt["static_table"] == pytest.approx(sim.policy_value(ep.static, ep.tasks).mean)
    assert gt["oracle"] >= max(gt["static_table"], gt["behaviour"], gt["uniform"])
    cfg = CollectorConfig(episodes=400, seed=1, action_space="sage_binary")
    gt_b, _ = collector._ground_truth(sim, collector._simulate(sim, cfg), cfg)
    assert gt_b["static_table"] <= gt_b["binary_oracle"] <= gt_b["oracle"]


@pytest.mark.parametrize(
    ("kwargs", "msg"),
    [
        ({"episodes": 0}, r"\nepisodes\n  Input should be greater than or equal to 1 .*input_value=0,"),
        ({"epsilon": 0.0}, r"\nepsilon\n  Input should be greater than 0 .*input_value=0\.0,"),
        ({"epsilon": 1.5}, r"\nepsilon\n  Input should be less than or equal to 1 .*input_value=1\.5,"),
        ({"sessions_per_day": 0}, r"\nsessions_per_day\n  Input should be greater than or equal to 1 "),
        ({"action_space": "any"}, r"\naction_space\n  Input should be 'multi_model' or 'sage_binary' .*'any'"),
    ],
)
def test_collector_config_validation(kwargs, msg):
    """A bad setting is refused naming the field, what is allowed and the value given."""
    with pytest.raises(ValidationError, match=msg):
        CollectorConfig(**kwargs)
    assert CollectorConfig.model_fields["epsilon"].description.endswith("so every candidate has support")


# ------------------------------------------------------------------ the set is replaced as one
VERSIONS = ".synthetic_versions"  # where the synthetic_sessions asset keeps the versions, beside sessions/
FORK = multiprocessing.get_context("fork")  # a child starts in milliseconds, with the simulator built


def collect_as_asset(sim, root: Path, seed: int, episodes: int):
    """``collect`` as the synthetic_sessions asset calls it, under the artifact root ``root``."""
    cfg = CollectorConfig(episodes=episodes, seed=seed, sessions_per_day=1)
    return collect(sim, root / "sessions" / "synthetic", cfg, progress=lambda m: None, versions_dir=root / VERSIONS)


def _run_in_child(sim, root: Path, seed: int, episodes: int, pause_s: float, die_after: int | None) -> None:
    write = collector.artifacts.write_bytes
    written = 0

    def slow_write(dest, data):  # one day file per session: the set takes a while, a kill lands inside it
        nonlocal written
        if written == die_after:
            os.kill(os.getpid(), signal.SIGKILL)
        written += 1
        time.sleep(pause_s)
        return write(dest, data)

    collector.artifacts.write_bytes = slow_write
    collect_as_asset(sim, root, seed, episodes)


def start_run(sim, root: Path, seed: int, episodes: int, pause_s: float = 0.004,
              die_after: int | None = None):
    """A run in a child process; with ``die_after`` it SIGKILLs itself before that day file."""
    p = FORK.Process(target=_run_in_child, args=(sim, root, seed, episodes, pause_s, die_after))
    p.start()
    return p


def complete_set(folder: Path) -> int:
    """The seed of the set in ``folder``, checked complete: its logs are exactly the manifest's files and
    hold exactly the manifest's seed, sessions, decisions and episodes."""
    folder = Path(os.path.realpath(folder))  # one snapshot, even if a switch came now
    m = json.loads((folder / "simulator.json").read_text())
    assert sorted(p.name for p in folder.glob("*.log")) == sorted(m["files"])
    events = read_events([folder / name for name in m["files"]])
    seed = m["collector"]["seed"]
    assert {e["session_id"].split("-")[1] for e in events} == {str(seed)}, "the logs of two runs are mixed"
    counts = Counter(e["type"] for e in events)
    assert counts["SESSION_START"] == counts["SESSION_END"] == m["sessions"]
    assert counts[TRAJECTORY_STEP] == counts["MODEL_ROUTING_DECISION"] == m["decisions"]
    assert len({e["task_id"] for e in events if e["type"] == TRAJECTORY_STEP}) == m["episodes"]
    return seed


def test_a_killed_run_leaves_the_old_set_or_the_new_one_and_the_next_run_sweeps_it(sim, tmp_path):
    out, versions = tmp_path / "sessions" / "synthetic", tmp_path / VERSIONS
    collect_as_asset(sim, tmp_path, 100, 30)
    current, rng, partials_left = 100, random.Random(11), 0
    for trial in range(6):
        seed = trial + 1
        # the first dies after 3 of its ~15 day files, surely inside the set; the others at a random moment
        p = start_run(sim, tmp_path, seed, 60 + 5 * trial, die_after=3 if trial == 0 else None)
        if trial:
            time.sleep(rng.uniform(0.0, 0.15))
            os.kill(p.pid, signal.SIGKILL)
        p.join(30)
        assert p.exitcode in (-signal.SIGKILL, 0)
        assert complete_set(out) in (current, seed)  # the old set or the new one, never a mix
        partials_left += any(d.name.endswith(".partial") for d in versions.iterdir())
        current = 200 + trial
        collect_as_asset(sim, tmp_path, current, 20)  # the next run succeeds...
        assert complete_set(out) == current
        left = sorted(d.name for d in versions.iterdir() if d.name != ".lock")
        assert not [n for n in left if n.endswith(".partial")]  # ...and sweeps the killed run's folder
        assert len(left) <= 2  # the current set and the one it replaced
    assert partials_left >= 1


def test_two_concurrent_runs_both_succeed_and_the_last_switch_wins(sim, tmp_path):
    out, versions = tmp_path / "sessions" / "synthetic", tmp_path / VERSIONS
    collect_as_asset(sim, tmp_path, 100, 30)
    runs = [start_run(sim, tmp_path, 1, 90), start_run(sim, tmp_path, 2, 60)]
    for p in runs:
        p.join(30)
    assert [p.exitcode for p in runs] == [0, 0]
    assert complete_set(out) in (1, 2)
    # neither deleted the other's files: both sets are whole (the first switched to is kept as the previous)
    assert sorted(complete_set(d) for d in versions.iterdir() if d.is_dir()) == [1, 2]


def test_ingest_of_sessions_reads_exactly_the_current_set_after_several_runs(sim, tmp_path):
    """The ingest reads every journal under sessions/, following links: the versions must stay out of it."""
    import pyarrow.parquet as pq

    root = tmp_path / "root"

    def reads_exactly(res, seed: int) -> None:
        r = ingest(IngestConfig(log_dirs=(root / "sessions",)), tmp_path / "ingest", progress=lambda m: None)
        assert r.stats.files == [str(p) for p in res.files]
        assert r.stats.lines_read == res.events and r.stats.quarantined == 0
        assert r.stats.steps_accepted == res.decisions
        traj = pq.read_table(r.trajectories, columns=["session_id", "task_id", "timestamp"]).to_pandas()
        assert traj["session_id"].str.startswith(f"syn-{seed}-").all() and not traj.duplicated().any()

    first = collect_as_asset(sim, root, 1, 80)
    reads_exactly(first, 1)
    killed = start_run(sim, root, 2, 60, die_after=4)
    killed.join(30)
    assert killed.exitcode == -signal.SIGKILL
    reads_exactly(first, 1)
    for seed, episodes in ((3, 40), (4, 50), (5, 30)):
        reads_exactly(collect_as_asset(sim, root, seed, episodes), seed)


@pytest.mark.parametrize("foreign", [False, True])
def test_an_old_real_folder_is_moved_aside_once_and_replaced_by_the_link(sim, tmp_path, foreign):
    out, versions = tmp_path / "sessions" / "synthetic", tmp_path / VERSIONS
    out.mkdir(parents=True)  # what older collectors left: journals and a manifest in a real folder
    (out / "2026-11-01.log").write_text('{"type": "SESSION_START"}\n')
    (out / "synthetic_seed1_part0000.jsonl").write_text("{}\n")
    (out / "simulator.json").write_text("{}\n")
    if foreign:
        (out / "notes.txt").write_text("not the collector's")
    messages: list[str] = []
    first = collect(sim, out, CollectorConfig(episodes=20, seed=1), messages.append, versions_dir=versions)
    assert out.is_symlink() and complete_set(out) == 1
    assert os.readlink(out) == os.path.join("..", VERSIONS, first.version.name)  # relative: the root can move
    [legacy] = versions.glob("legacy-*")
    old_names = ["2026-11-01.log", "synthetic_seed1_part0000.jsonl", "simulator.json"]
    assert sorted(p.name for p in legacy.iterdir()) == sorted(old_names + (["notes.txt"] if foreign else []))
    assert f"moved the old collector folder {out} to {legacy}; {out} is now a link to the current set" in (
        messages)
    messages.clear()
    second = collect(sim, out, CollectorConfig(episodes=20, seed=2), messages.append, versions_dir=versions)
    assert complete_set(out) == 2
    kept = sorted(versions.iterdir())
    if foreign:  # files the collector never wrote are not its to delete
        assert kept == sorted([versions / ".lock", legacy, first.version, second.version])
        assert any(m.startswith(f"kept {legacy}: ") and "notes.txt" in m for m in messages)
    else:
        assert kept == sorted([versions / ".lock", first.version, second.version])
        assert f"removed {legacy} (superseded)" in messages
