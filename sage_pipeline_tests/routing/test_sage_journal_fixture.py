"""The SAGE journal fixture is what SAGE's code writes (checked here with plain json, not the
ingest, against facts read in SAGE's source; the contract suite regenerates it with SAGE
itself and compares byte for byte): the folder the offline chain is tested on."""

from __future__ import annotations

import json
import operator
import re
from collections import Counter
from datetime import datetime, timedelta
from functools import cache
from pathlib import Path

import yaml

from sage_pipeline.sage.table import RoutingTable

FIXTURE = Path(__file__).with_name("fixtures") / "sage_journal"
SESSIONS = FIXTURE / "memory" / "sessions"
STEP, MRD, TU = "TRAJECTORY_STEP", "MODEL_ROUTING_DECISION", "TOKEN_USAGE"
OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le, "==": operator.eq,
       "!=": operator.ne}
# sage/orchestrator/model_router.py: the MODEL_ROUTING_DECISION payload, in its order
MRD_KEYS = ["type", "timestamp", "agent_role", "task_complexity_score", "primary_failure_count", "primary_model",
            "fallback_model", "selected_model", "matched_fallback_triggers", "policy_source"]
# sage/observability/trajectory_logger.py: record_trajectory_step's payload, in its order
STEP_KEYS = ["type", "timestamp", "task_id", "agent", "action", "reward", "terminal", "state"]
TEXT_LINES = (re.compile(r"\[\d{4}-\d\d-\d\dT[\d:.]+\+00:00\] CHECKPOINT completed=\d+ pending=\d+"),
              re.compile(r"\[TOKEN_SUMMARY\] total_tokens=\d+ prompt=\d+ completion=\d+ calls=\d+"))


def _files() -> list[Path]:
    return sorted(SESSIONS.iterdir())


@cache
def _table() -> dict:
    return yaml.safe_load((FIXTURE / "models.yaml").read_text(encoding="utf-8"))["routing"]


@cache
def _lines() -> tuple[tuple[str, str], ...]:
    out = []
    for p in _files():
        raw = p.read_bytes()
        assert raw.endswith(b"\n"), f"{p.name}: SAGE appends whole lines"
        out += [(p.name, line) for line in raw.decode("utf-8").split("\n")[:-1]]
    return tuple(out)


@cache
def _events() -> tuple[tuple[str, dict], ...]:
    return tuple((name, json.loads(line)) for name, line in _lines() if line.startswith("{"))


def _of(kind: str) -> list[dict]:
    return [e for _, e in _events() if e["type"] == kind]


def _ids(e: dict) -> list[str]:
    return [k for k in ("session_id", "trace_id") if k in e]


def test_files_are_sage_journals_rotated_as_sages_manager_rotates_them():
    names = [p.name for p in _files()]
    assert all(re.fullmatch(r"2026-11-\d\d(\.\d+)?\.log", n) for n in names)
    assert {"2026-11-16.1.log", "2026-11-16.log", "2026-11-21.log"} <= set(names)
    assert sorted(p.name for p in FIXTURE.iterdir()) == ["README.md", "SAGE_LICENSE", "memory", "models.yaml"]
    assert sum(p.stat().st_size for p in SESSIONS.iterdir()) < 2 * 1024 * 1024


def test_every_line_is_a_sage_event_or_one_of_sages_two_text_lines():
    text = [line for _, line in _lines() if not line.startswith("{")]
    assert text and all(any(r.fullmatch(t) for r in TEXT_LINES) for t in text)
    assert len(text) == 2 * 48  # one CHECKPOINT and one TOKEN_SUMMARY per session (save_memory)
    for name, e in _events():
        t = datetime.fromisoformat(e["timestamp"])
        assert t.isoformat() == e["timestamp"] and t.utcoffset() == timedelta(0)  # log_event's UTC isoformat
        assert t.date().isoformat() == name[:10]


def test_sage_run_days_carry_a_fresh_session_id_per_run_the_others_none():
    by_day: dict[str, set] = {}
    for name, e in _events():
        by_day.setdefault(name[:10], set()).add(e.get("session_id"))
    for day in ("2026-11-16", "2026-11-17", "2026-11-18"):
        assert len(by_day[day]) == 12 and all(re.fullmatch(r"[0-9a-f]{32}", s or "") for s in by_day[day])
    for day in ("2026-11-19", "2026-11-20", "2026-11-21"):
        assert by_day[day] == {None}  # SAGE_SESSION_ID unset: the file's stem is the session
    assert not any("trace_id" in e for _, e in _events())


def test_steps_come_from_reviewer_debugger_and_orchestrator_with_the_task_s_model():
    steps = _of(STEP)
    assert Counter(e["agent"] for e in steps).keys() == {"reviewer", "debugger", "orchestrator"}
    for e in steps:
        keys = [k for k in e if k not in ("session_id", "trace_id")]
        assert keys[:len(STEP_KEYS)] == STEP_KEYS and set(e["action"]) == {"model_chosen", "prompt_strategy_key"}
        assert set(keys[len(STEP_KEYS):]) <= {"verdict", "patch_preview", "error"}  # record_trajectory_step's extra
        assert "step" not in e and "propensity" not in e  # SAGE writes neither
    reviewer = [e for e in steps if e["agent"] == "reviewer"]
    assert {e["verdict"] for e in reviewer} == {"PASS", "FAIL"}
    assert all(e["terminal"] == (e["verdict"] == "PASS") for e in reviewer)
    assert all(e["reward"] == 0.0 and not e["terminal"] for e in steps if e["agent"] == "debugger")
    orchestrator = [e for e in steps if e["agent"] == "orchestrator"]
    assert {e["state"]["failed_reason"] for e in orchestrator} == {"timeout", "retry_limit"}
    assert any(e["action"]["model_chosen"] == "" for e in orchestrator)  # timed out before any model was used


def test_the_coder_logs_no_routing_decision_its_bandit_s_choice_is_in_the_reviewer_s_step():
    coder = _table()["coder"]
    decided = Counter(e["agent_role"] for e in _of(MRD))
    assert "coder" not in decided and {"planner", "documentation", "reviewer", "debugger"} <= decided.keys()
    strategies = Counter()
    for e in _of(STEP):
        key = e["action"]["prompt_strategy_key"]
        if key.startswith("coder:"):
            strategies[key.split(":")[1]] += 1
            assert e["action"]["model_chosen"] == coder["primary" if ":primary:" in key else "fallback"]
    assert strategies["primary"] > 0 and strategies["fallback"] > 0  # the UCB bandit tries both


def test_routing_decisions_are_sages_yaml_decisions():
    table = RoutingTable.load(FIXTURE / "models.yaml")
    assert set(table.roles) == set(_table())
    for e in _of(MRD):
        assert [k for k in e if k not in ("session_id", "trace_id")] == MRD_KEYS
        route = _table()[e["agent_role"]]
        values = {"task_complexity_score": e["task_complexity_score"],
                  "primary_failure_count": e["primary_failure_count"], "failure_count": e["primary_failure_count"]}
        fired = [t for t in route["fallback_triggers"]
                 if OPS[t.split()[1]](values[t.split()[0]], float(t.split()[2]))]
        assert e["matched_fallback_triggers"] == fired and e["policy_source"] == "yaml"
        assert e["selected_model"] == (route["fallback"] if fired else route["primary"])
        assert (e["primary_model"], e["fallback_model"]) == (route["primary"], route["fallback"])


def test_token_usage_follows_every_model_call_and_the_readme_counts_are_the_fixture_s():
    assert all(e["operation"] == "chat" and e["total_tokens"] == e["prompt_tokens"] + e["completion_tokens"]
               for e in _of(TU))
    types = Counter(e["type"] for _, e in _events())
    readme = (FIXTURE / "README.md").read_text(encoding="utf-8")
    assert f"{len(_lines()):,} lines ({types[STEP]:,} steps, {types[MRD]:,} routing decisions)" in readme
