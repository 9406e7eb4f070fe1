"""The SAGE journal fixture has SAGE's shape (checked with plain json, not the ingest): the
folder the offline chain is tested on must look exactly like what SAGE writes."""

from __future__ import annotations

import gzip
import json
import operator
from collections import Counter
from datetime import datetime, timedelta
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from sage_pipeline.routing.table import RoutingTable

FIXTURE = Path(__file__).with_name("fixtures") / "sage_journal"
SESSIONS = FIXTURE / "memory" / "sessions"
STEP, MRD, TU = "TRAJECTORY_STEP", "MODEL_ROUTING_DECISION", "TOKEN_USAGE"
AGENT_ROLES = {"planner", "architect", "coder", "debugger", "reviewer", "test_engineer", "documentation",
               "memory_optimizer"}
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq,
       "!=": operator.ne}


def _files() -> list[Path]:
    return sorted(SESSIONS.iterdir())


@cache
def _table() -> dict:
    return yaml.safe_load((FIXTURE / "models.yaml").read_text(encoding="utf-8"))["routing"]


@cache
def _events(path: Path) -> tuple[dict, ...]:
    raw = gzip.decompress(path.read_bytes()) if path.name.endswith(".gz") else path.read_bytes()
    assert raw.endswith(b"\n"), f"{path.name}: SAGE appends whole lines"
    out = []
    for i, line in enumerate(raw.decode("utf-8").split("\n")[:-1], 1):
        e = json.loads(line)
        assert isinstance(e, dict) and isinstance(e.get("type"), str), f"{path.name}:{i}"
        out.append(e)
    return tuple(out)


def _all() -> list[tuple[Path, dict]]:
    return [(p, e) for p in _files() for e in _events(p)]


def _steps() -> list[dict]:
    return [e for _, e in _all() if e["type"] == STEP]


def _fired(role: str, values: dict) -> list[str]:
    out = []
    for trig in _table()[role]["fallback_triggers"]:
        var, op, num = trig.split()
        if OPS[op](values[var], float(num)):
            out.append(trig)
    return out


def _tasks() -> list[list[tuple[dict, dict]]]:
    """Per task (file, task_id): its (routing decision, step) pairs in file order."""
    tasks: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for path in _files():
        mrd = None
        for e in _events(path):
            if e["type"] == MRD:
                mrd = e
            elif e["type"] == STEP:
                tasks.setdefault((path.name, e["task_id"]), []).append((mrd, e))
    return list(tasks.values())


def test_files_are_date_named_journals_one_gzipped():
    names = [p.name for p in _files()]
    assert names == [f"2026-11-{d}.log" for d in range(16, 21)] + ["2026-11-21.log.gz"]
    assert sorted(p.name for p in FIXTURE.iterdir()) == ["README.md", "memory", "models.yaml"]
    size = sum(p.stat().st_size for p in FIXTURE.rglob("*") if p.is_file())
    assert size < 2 * 1024 * 1024


def test_timestamps_are_pythons_isoformat_with_offset_and_dated_by_their_file():
    for path, e in _all():
        ts = e["timestamp"]
        t = datetime.fromisoformat(ts)
        assert t.isoformat() == ts  # exactly datetime.isoformat(): microseconds unless zero, "+00:00"
        assert t.utcoffset() == timedelta(0) and ts.endswith("+00:00")
        assert t.date().isoformat() == path.name.split(".")[0]
    assert any("." not in e["timestamp"] for _, e in _all())  # a whole second has no fraction


def test_session_and_trace_ids_are_on_every_line_of_a_day_or_on_none():
    with_ids, without_ids = 0, 0
    for path in _files():
        events = _events(path)
        has = {("session_id" in e, "trace_id" in e) for e in events}
        assert has in ({(True, True)}, {(False, False)})  # SAGE_SESSION_ID/SAGE_TRACE_ID set for a run or not
        with_ids += has == {(True, True)}
        without_ids += has == {(False, False)}
        if has == {(True, True)}:
            sessions = [e for e in events if e["type"] == "SESSION_START"]
            assert len({e["session_id"] for e in sessions}) == len(sessions) > 1
    assert with_ids == 3 and without_ids == 3


def test_event_types_and_counts():
    types = Counter(e["type"] for _, e in _all())
    assert types[MRD] == types[TU] == types[STEP]
    assert 1500 <= types[STEP] <= 3000  # enough for the offline chain to train on
    for other in ("SESSION_START", "SESSION_END", "PROMPT_QUALITY_DELTA", "ROUTING_POLICY_ERROR", "CONTEXT_CLAMPED"):
        assert types[other] > 0, other
    # the README's numbers are the fixture's
    readme = (FIXTURE / "README.md").read_text(encoding="utf-8")
    assert f"{types[STEP]:,} decisions in {sum(types.values()):,} lines" in readme


def test_trajectory_steps_have_sages_shape():
    state_keys = Counter()
    for e in _steps():
        assert "step" not in e and "propensity" not in e  # SAGE writes neither
        assert {"type", "timestamp", "task_id", "agent", "action", "reward", "terminal", "state"} <= e.keys()
        assert set(e["action"]) == {"model_chosen", "prompt_strategy_key"}
        assert isinstance(e["reward"], float | int) and -2.0 <= e["reward"] <= 2.0
        assert isinstance(e["terminal"], bool)
        state_keys.update(e["state"].keys())
        assert "failure_count" not in e["state"]
    assert {"task_complexity_score", "primary_failure_count", "verification_passed", "failed_reason"} <= {
        k for k, n in state_keys.items() if n == len(_steps())}
    assert state_keys["files_touched"] > 0 and state_keys["plan_depth"] > 0  # free-form extra keys
    assert any(set(e) - {"type", "timestamp", "session_id", "trace_id", "task_id", "agent", "action", "reward",
                         "terminal", "state"} for e in _steps())  # an extra top-level key


def test_roles_and_models_are_exactly_the_tables():
    table = _table()
    RoutingTable.load(FIXTURE / "models.yaml")  # comments, Ollama tags and shell roles load as SAGE's do
    assert (FIXTURE / "models.yaml").read_text(encoding="utf-8").startswith("#")
    assert set(table) == AGENT_ROLES | {"shell_router", "shell_chat"}
    models = {m for r in table.values() for m in (r["primary"], r["fallback"])}
    assert models == {"qwen2.5-coder:1.5b", "qwen2.5-coder:14b", "qwen3:14b-q4_K_M", "codestral:22b", "llama3.2:3b",
                      "claude-sonnet-4-5"}
    for r in table.values():
        for trig in r["fallback_triggers"]:
            assert trig.split()[0] in ("task_complexity_score", "primary_failure_count", "failure_count")
    events = [e for _, e in _all()]
    assert {e["agent"] for e in events if e["type"] == STEP} == set(table)
    assert {e["agent_role"] for e in events if e["type"] == MRD} == set(table)
    assert {e["action"]["model_chosen"] for e in events if e["type"] == STEP} == models
    assert {e["selected_model"] for e in events if e["type"] == MRD} == models
    assert {e["model"] for e in events if e["type"] == TU} <= models


def test_each_step_follows_its_routing_decision_and_token_usage_in_the_same_file():
    for path in _files():
        mrd = tu = None
        for e in _events(path):
            if e["type"] == MRD:
                mrd, tu = e, None
            elif e["type"] == TU:
                tu = e
            elif e["type"] == STEP:
                assert mrd is not None and tu is not None, f"{path.name}: {e['task_id']}"
                model = e["action"]["model_chosen"]
                assert (mrd["agent_role"], mrd["selected_model"], tu["model"]) == (e["agent"], model, model)
                assert mrd["task_complexity_score"] == e["state"]["task_complexity_score"]
                assert mrd["primary_failure_count"] == e["state"]["primary_failure_count"]
                assert mrd.get("session_id") == e.get("session_id")
                assert mrd["timestamp"] <= tu["timestamp"] <= e["timestamp"]
                mrd = tu = None


def test_decisions_follow_the_table_with_a_learned_minority():
    table = _table()
    sources = Counter()
    fallback_after_failures = 0
    for task in _tasks():
        for attempt, (mrd, e) in enumerate(task):
            route = table[e["agent"]]
            assert (mrd["primary_model"], mrd["fallback_model"]) == (route["primary"], route["fallback"])
            values = {"task_complexity_score": mrd["task_complexity_score"],
                      "primary_failure_count": mrd["primary_failure_count"], "failure_count": attempt}
            fired = _fired(e["agent"], values)
            assert mrd["matched_fallback_triggers"] == fired
            yaml_model = route["fallback"] if fired else route["primary"]
            other = route["primary"] if fired else route["fallback"]
            assert mrd["selected_model"] == (yaml_model if mrd["policy_source"] == "yaml" else other)
            assert "propensity" not in mrd or (mrd["policy_source"] == "learned" and 0 < mrd["propensity"] <= 1)
            sources[mrd["policy_source"]] += 1
            fallback_after_failures += (mrd["policy_source"] == "yaml" and mrd["selected_model"] == route["fallback"]
                                        and any(t.startswith("primary_failure_count") for t in fired))
    assert set(sources) == {"yaml", "learned"}
    assert 0.15 <= sources["learned"] / sum(sources.values()) <= 0.25
    assert fallback_after_failures > 0
    assert 0 < sum("propensity" in e for _, e in _all() if e["type"] == MRD) < sources["learned"]


def test_tasks_are_multi_attempt_episodes():
    table = _table()
    lengths = Counter(len(t) for t in _tasks())
    assert set(lengths) == {1, 2, 3, 4} and lengths[4] > 0
    roles_multi = set()
    for task in _tasks():
        steps = [e for _, e in task]
        assert len({(e["agent"], e["state"]["task_complexity_score"]) for e in steps}) == 1
        assert [e["terminal"] for e in steps] == [False] * (len(steps) - 1) + [True]
        assert not any(e["state"]["verification_passed"] for e in steps[:-1])
        assert steps[-1]["state"]["verification_passed"] or len(steps) == 4
        stamps = [datetime.fromisoformat(e["timestamp"]) for e in steps]
        assert all(a < b for a, b in pairwise(stamps))
        pfc = 0
        for e in steps:
            assert e["state"]["primary_failure_count"] == pfc
            failed = not e["state"]["verification_passed"]
            pfc += failed and e["action"]["model_chosen"] == table[e["agent"]]["primary"]
        if len(steps) > 1:
            roles_multi.add(steps[0]["agent"])
    assert roles_multi == set(table)


@pytest.mark.parametrize("outcome", ["passed", "failed", "timeout"])
def test_rewards_are_consistent_with_reward_v1(outcome):
    """reviewer score in [0, 1], +0.25 verified, -0.15 failed, -0.5 (score 0) on timeout, -0.1 per
    earlier attempt, clamped to [-2, 2]."""
    n = 0
    for task in _tasks():
        for attempt, (_, e) in enumerate(task):
            s, r = e["state"], e["reward"]
            kind = ("timeout" if s["failed_reason"] == "timeout" else
                    "passed" if s["verification_passed"] else "failed")
            if kind != outcome:
                continue
            n += 1
            if kind == "timeout":
                assert not s["verification_passed"] and r == pytest.approx(-0.5 - 0.1 * attempt, abs=1e-9)
            else:
                bonus = 0.25 if kind == "passed" else -0.15
                assert bonus - 0.1 * attempt - 1e-9 <= r <= 1.0 + bonus - 0.1 * attempt + 1e-9
                assert (s["failed_reason"] is None) == (kind == "passed")
    assert n > 0
