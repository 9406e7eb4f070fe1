"""Streaming ingest: SAGE's session journals exactly as SAGE writes them go through with
nothing quarantined; every bad input line is quarantined with its file, line and reason,
the good lines around it are kept, and lines_read == accepted_lines + quarantined_lines."""

from __future__ import annotations

import gzip
import json
import random
import tracemalloc
import zlib
from collections import Counter
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from sage_pipeline.routing import ingest
from sage_pipeline.routing.collector import CollectorConfig, collect
from sage_pipeline.routing.ingest import IngestConfig, LogFolderMissing, file_stem, iter_blocks
from sage_pipeline.routing.schema import ROUTING_DECISION_COLUMNS, TOKEN_USAGE_COLUMNS, TRAJECTORY_COLUMNS

UTC = timezone.utc


def event(session="s1", task="t1", step=0, role="coder", model="gpt-4.1-mini", **over) -> dict:
    """A TRAJECTORY_STEP with every optional extension this project reads (session_id, step,
    propensity, the full state), as the synthetic collector writes it."""
    ev = {
        "type": "TRAJECTORY_STEP",
        "timestamp": "2026-11-01T00:00:00.000Z",
        "session_id": session,
        "task_id": task,
        "agent": role,
        "step": step,
        "action": {"model_chosen": model},
        "propensity": 0.5,
        "state": {
            "task_complexity_score": 0.5,
            "primary_failure_count": 0,
            "failure_count": step,
            "prompt_tokens": 3000,
            "verification_passed": True,
            "timed_out": False,
            "failed_reason": None,
            "reviewer_score": 0.8,
            "latency_s": 3.5,
            "cost_usd": 0.003,
        },
        "reward": 1.05,
        "terminal": True,
        "extra": {"synthetic": False},
    }
    ev.update(over)
    return ev


def line(obj: object) -> bytes:
    return json.dumps(obj).encode()


GOOD_BEFORE = line(event(task="before"))
GOOD_AFTER = line(event(task="after"))


class Run:
    def __init__(self, res: ingest.IngestResult) -> None:
        self.res, self.stats = res, res.stats
        raw = res.quarantine.read_bytes()
        self.quarantine = [json.loads(x) for x in raw.splitlines()]
        self.rows = pq.read_table(res.trajectories).to_pandas()
        self.mrd = pq.read_table(res.routing_decisions)
        self.tu = pq.read_table(res.token_usage)
        # the invariants every run keeps
        assert self.stats.lines_read == self.stats.accepted_lines + self.stats.quarantined
        assert self.stats.quarantined == len(self.quarantine)
        assert self.stats.steps_accepted == len(self.rows)
        assert sum(self.stats.quarantine_reasons.values()) == self.stats.quarantined
        assert (
            self.stats.routing_decisions == self.mrd.num_rows and self.stats.token_usage == self.tu.num_rows
        )
        assert tuple(self.rows.columns) == TRAJECTORY_COLUMNS
        assert tuple(self.mrd.column_names) == ROUTING_DECISION_COLUMNS
        assert tuple(self.tu.column_names) == TOKEN_USAGE_COLUMNS
        assert pq.read_schema(res.trajectories).equals(ingest.TRAJECTORY_SCHEMA)
        assert self.mrd.schema.equals(ingest.ROUTING_DECISION_SCHEMA)
        assert self.tu.schema.equals(ingest.TOKEN_USAGE_SCHEMA)
        # a side event is counted among the other events, usable or not
        for typ, n in self.stats.unusable_side_events.items():
            assert self.stats.other_events[typ] >= n
        assert self.stats.other_events["MODEL_ROUTING_DECISION"] == (
            self.mrd.num_rows + self.stats.unusable_side_events["MODEL_ROUTING_DECISION"]
        )
        assert self.stats.other_events["TOKEN_USAGE"] == (
            self.tu.num_rows + self.stats.unusable_side_events["TOKEN_USAGE"]
        )
        assert self.stats.steps_without_step == int(self.rows["step"].isna().sum())
        d = self.stats.to_dict()
        assert d["lines_read"] == d["accepted_lines"] + d["quarantined_lines"]


def run(log_dir: Path, out_dir: Path | None = None, **cfg) -> Run:
    out_dir = out_dir or log_dir.parent / (log_dir.name + "_out")
    return Run(ingest.ingest(IngestConfig((log_dir,), **cfg), out_dir, progress=lambda m: None))


def write(path: Path, lines: list[bytes], end: bytes = b"\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + end)
    return path


def one_bad(tmp_path, bad: bytes, **cfg) -> tuple[Run, Path]:
    """good, bad, good in one file: the bad line is quarantined as line 2, both good lines kept."""
    path = write(tmp_path / "logs" / "session.jsonl", [GOOD_BEFORE, bad, GOOD_AFTER])
    r = run(tmp_path / "logs", **cfg)
    assert r.stats.lines_read == 3
    assert r.stats.steps_accepted == 2 and r.stats.quarantined == 1
    assert r.rows["task_id"].tolist() == ["before", "after"]
    assert r.rows["source_line"].tolist() == [1, 3]
    assert r.rows["source_file"].tolist() == [str(path)] * 2
    q = r.quarantine[0]
    assert q["file"] == str(path) and q["line"] == 2
    return r, path


def assert_one_bad(tmp_path, bad: bytes, reason: str, cls: str, **cfg) -> dict:
    r, _ = one_bad(tmp_path, bad, **cfg)
    q = r.quarantine[0]
    assert q["reason"] == reason
    assert dict(r.stats.quarantine_reasons) == {cls: 1}
    return q


def one_good(tmp_path, obj: dict) -> Run:
    """One line that must be accepted as one row."""
    r = run(write(tmp_path / "logs" / "a.jsonl", [line(obj)]).parent)
    assert r.stats.steps_accepted == 1 and r.stats.quarantined == 0, r.quarantine
    return r


# ------------------------------------------------------------------ SAGE's exact journal shape
def ts(hour: int, minute: int, second: int, micro: int, offset_h: int = 0) -> str:
    """A timestamp as SAGE writes it: datetime.now(tz).isoformat(), microseconds and offset."""
    tz = timezone(timedelta(hours=offset_h))
    return datetime(2026, 11, 20, hour, minute, second, micro, tzinfo=UTC).astimezone(tz).isoformat()


def sage_step(
    when: str,
    task: str,
    role: str,
    model: str,
    *,
    reward: float = 0.5,
    terminal: bool = True,
    state: dict | None = None,
    **over,
) -> dict:
    """A TRAJECTORY_STEP exactly as SAGE writes it: no step, no propensity, no session_id."""
    ev = {
        "type": "TRAJECTORY_STEP",
        "timestamp": when,
        "task_id": task,
        "agent": role,
        "action": {"model_chosen": model, "prompt_strategy_key": "default"},
        "reward": reward,
        "terminal": terminal,
        "state": state
        if state is not None
        else {
            "task_complexity_score": 0.42,
            "primary_failure_count": 0,
            "verification_passed": True,
            "failed_reason": None,
        },
    }
    ev.update(over)
    return ev


def mrd(
    when: str,
    role: str,
    selected: str,
    *,
    primary: str = "qwen2.5-coder:1.5b",
    fallback: str = "codestral:22b",
    triggers: list | None = None,
    **over,
) -> dict:
    ev = {
        "type": "MODEL_ROUTING_DECISION",
        "timestamp": when,
        "agent_role": role,
        "task_complexity_score": 0.42,
        "primary_failure_count": 0,
        "primary_model": primary,
        "fallback_model": fallback,
        "selected_model": selected,
        "matched_fallback_triggers": triggers or [],
        "policy_source": "yaml",
    }
    ev.update(over)
    return ev


def usage(when: str, model: str, prompt: int, completion: int, **over) -> dict:
    ev = {
        "type": "TOKEN_USAGE",
        "timestamp": when,
        "model": model,
        "prompt_tokens": prompt,
        "completion_tokens": completion,
    }
    ev.update(over)
    return ev


def with_ids(ev: dict, session: str, trace: str) -> dict:
    """What SAGE adds when SAGE_SESSION_ID and SAGE_TRACE_ID are set."""
    return {"type": ev["type"], "timestamp": ev["timestamp"], "session_id": session, "trace_id": trace} | ev


def day_20() -> list[dict]:
    """2026-11-20.log: no SAGE_SESSION_ID, "+00:00" offsets, every event type mixed in."""
    return [
        {"type": "SESSION_START", "timestamp": ts(9, 0, 0, 1), "cwd": "/home/dev/proj"},
        mrd(ts(9, 0, 1, 123456), "coder", "qwen2.5-coder:1.5b"),
        usage(ts(9, 0, 2, 500000), "qwen2.5-coder:1.5b", 812, 95),
        sage_step(
            ts(9, 0, 3, 7),
            "t-1",
            "coder",
            "qwen2.5-coder:1.5b",
            reward=-0.15,
            terminal=False,
            state={
                "task_complexity_score": 0.42,
                "primary_failure_count": 0,
                "verification_passed": False,
                "failed_reason": "tests_failed",
                "files": ["a.py", {"lines": [1, 2]}],
                "retry": None,
                "model_scores": {"codestral:22b": 0.7},
                "note": "free-form",
            },
        ),
        {"type": "PROMPT_QUALITY_DELTA", "timestamp": ts(9, 0, 4, 0), "agent": "coder", "delta": -0.05},
        mrd(
            ts(9, 0, 5, 1),
            "coder",
            "codestral:22b",
            triggers=["primary_failure_count >= 1"],
            primary_failure_count=1,
        ),
        {
            "type": "CONTEXT_CLAMPED",
            "timestamp": ts(9, 0, 5, 2),
            "original_tokens": 40000,
            "clamped_tokens": 32000,
        },
        usage(ts(9, 0, 6, 999999), "codestral:22b", 32000, 410, cost_usd=0.0, agent="coder"),
        sage_step(
            ts(9, 0, 7, 0),
            "t-1",
            "coder",
            "codestral:22b",
            reward=1.25,
            state={
                "task_complexity_score": 0.42,
                "primary_failure_count": 1,
                "verification_passed": True,
                "failed_reason": None,
            },
        ),
        {
            "type": "ROUTING_POLICY_ERROR",
            "timestamp": ts(9, 1, 0, 0),
            "error": "checkpoint missing",
            "fallback": "yaml",
        },
        mrd(
            ts(9, 2, 0, 0),
            "shell_router",
            "qwen3:14b-q4_K_M",
            primary="qwen3:14b-q4_K_M",
            fallback="claude-sonnet-4-5",
        ),
        sage_step(
            ts(9, 2, 1, 250000),
            "t-2",
            "shell_router",
            "qwen3:14b-q4_K_M",
            reward=0.0,
            state={"note": "no complexity logged"},
            extra={"synthetic": True},
        ),
    ]


def day_21() -> list[dict]:
    """2026-11-21.log: SAGE_SESSION_ID and SAGE_TRACE_ID set, "+02:00" offsets."""
    evs = [
        mrd(
            ts(10, 0, 0, 1, 2),
            "shell_chat",
            "claude-sonnet-4-5",
            primary="qwen3:14b-q4_K_M",
            fallback="claude-sonnet-4-5",
            triggers=["task_complexity_score > 0.8"],
            task_complexity_score=0.91,
            policy_source="learned",
            propensity=0.85,
        ),
        usage(ts(10, 0, 1, 2, 2), "claude-sonnet-4-5", 2048, 512, cost_usd=0.01382, agent="shell_chat"),
        sage_step(
            ts(10, 0, 2, 3, 2),
            "t-9",
            "shell_chat",
            "claude-sonnet-4-5",
            reward=1.0,
            state={
                "task_complexity_score": 0.91,
                "primary_failure_count": 0,
                "verification_passed": True,
                "failed_reason": None,
                "extra_metric": 3.5,
            },
        ),
    ]
    return [with_ids(e, "sess-abc", "trace-123") for e in evs]


def day_22() -> list[dict]:
    """2026-11-22.log.gz: no ids, a step with an optional extension (step, propensity)."""
    return [
        mrd(
            "2026-11-22T08:00:00.000001+00:00",
            "planner",
            "qwen3:14b-q4_K_M",
            primary="qwen3:14b-q4_K_M",
            fallback="claude-sonnet-4-5",
        ),
        sage_step(
            "2026-11-22T08:00:01.000002+00:00", "t-1", "planner", "qwen3:14b-q4_K_M", step=0, propensity=0.7
        ),
    ]


def write_sage_journals(root: Path) -> dict[str, Path]:
    sessions = root / "memory" / "sessions"
    sessions.mkdir(parents=True)
    paths = {
        "20": write(sessions / "2026-11-20.log", [line(e) for e in day_20()]),
        "21": write(sessions / "2026-11-21.log", [line(e) for e in day_21()]),
    }
    paths["22"] = sessions / "2026-11-22.log.gz"
    with gzip.open(paths["22"], "wb") as fh:
        fh.write(b"\n".join(line(e) for e in day_22()) + b"\n")
    return paths


def utc(day: int, hour: int, minute: int, second: int, micro: int) -> datetime:
    return datetime(2026, 11, day, hour, minute, second, micro, tzinfo=UTC)


def test_sage_journals_in_their_exact_shape_go_through(tmp_path):
    paths = write_sage_journals(tmp_path)
    f20, f21, f22 = (str(paths[k]) for k in ("20", "21", "22"))
    r = run(tmp_path / "memory" / "sessions")
    s = r.stats
    assert s.files == [f20, f21, f22]
    assert s.lines_read == 12 + 3 + 2 and s.quarantined == 0 and r.quarantine == []
    assert s.steps_accepted == 5
    assert dict(s.other_events) == {
        "SESSION_START": 1,
        "MODEL_ROUTING_DECISION": 5,
        "TOKEN_USAGE": 3,
        "PROMPT_QUALITY_DELTA": 1,
        "CONTEXT_CLAMPED": 1,
        "ROUTING_POLICY_ERROR": 1,
    }
    assert s.routing_decisions == 5 and s.token_usage == 3 and dict(s.unusable_side_events) == {}
    assert s.steps_without_step == 4
    assert s.sessions_from_file_stem == 2 and s.steps_session_from_file_stem == 4
    assert dict(s.rows_by_source) == {"real": 4, "synthetic": 1}

    rows = pq.read_table(r.res.trajectories).to_pylist()
    assert [(x["source_file"], x["source_line"]) for x in rows] == [
        (f20, 4),
        (f20, 9),
        (f20, 12),
        (f21, 3),
        (f22, 2),
    ]
    assert [(x["session_id"], x["session_id_source"], x["trace_id"]) for x in rows] == [
        ("2026-11-20", "file_stem", None),
        ("2026-11-20", "file_stem", None),
        ("2026-11-20", "file_stem", None),
        ("sess-abc", "logged", "trace-123"),
        ("2026-11-22", "file_stem", None),
    ]
    assert [x["role"] for x in rows] == ["coder", "coder", "shell_router", "shell_chat", "planner"]
    assert [x["model"] for x in rows] == [
        "qwen2.5-coder:1.5b",
        "codestral:22b",
        "qwen3:14b-q4_K_M",
        "claude-sonnet-4-5",
        "qwen3:14b-q4_K_M",
    ]
    assert [x["timestamp_utc"] for x in rows] == [
        utc(20, 9, 0, 3, 7),
        utc(20, 9, 0, 7, 0),
        utc(20, 9, 2, 1, 250000),
        utc(20, 10, 0, 2, 3),
        utc(22, 8, 0, 1, 2),
    ]
    assert rows[3]["timestamp"] == "2026-11-20T12:00:02.000003+02:00"  # kept as logged
    assert [x["step"] for x in rows] == [None, None, None, None, 0]
    assert [x["propensity"] for x in rows] == [None, None, None, None, 0.7]
    assert [x["task_complexity_score"] for x in rows] == [0.42, 0.42, None, 0.91, 0.42]
    assert [x["primary_failure_count"] for x in rows] == [0, 1, None, 0, 0]
    assert [x["verification_passed"] for x in rows] == [False, True, None, True, True]
    assert [x["failed_reason"] for x in rows] == ["tests_failed", None, None, None, None]
    assert [x["logged_reward"] for x in rows] == [-0.15, 1.25, 0.0, 1.0, 0.5]
    assert [x["terminal"] for x in rows] == [False, True, True, True, True]
    assert [x["prompt_strategy_key"] for x in rows] == ["default"] * 5
    assert [x["data_source"] for x in rows] == ["real", "real", "synthetic", "real", "real"]
    for col in ("failure_count", "prompt_tokens", "timed_out", "reviewer_score", "latency_s", "cost_usd"):
        assert [x[col] for x in rows] == [None] * 5, col

    assert r.mrd.to_pylist() == [
        {
            "source_file": f20,
            "source_line": 2,
            "session_id": "2026-11-20",
            "trace_id": None,
            "timestamp_utc": utc(20, 9, 0, 1, 123456),
            "agent_role": "coder",
            "task_complexity_score": 0.42,
            "primary_failure_count": 0,
            "primary_model": "qwen2.5-coder:1.5b",
            "fallback_model": "codestral:22b",
            "selected_model": "qwen2.5-coder:1.5b",
            "matched_fallback_triggers": [],
            "policy_source": "yaml",
            "propensity": None,
        },
        {
            "source_file": f20,
            "source_line": 6,
            "session_id": "2026-11-20",
            "trace_id": None,
            "timestamp_utc": utc(20, 9, 0, 5, 1),
            "agent_role": "coder",
            "task_complexity_score": 0.42,
            "primary_failure_count": 1,
            "primary_model": "qwen2.5-coder:1.5b",
            "fallback_model": "codestral:22b",
            "selected_model": "codestral:22b",
            "matched_fallback_triggers": ["primary_failure_count >= 1"],
            "policy_source": "yaml",
            "propensity": None,
        },
        {
            "source_file": f20,
            "source_line": 11,
            "session_id": "2026-11-20",
            "trace_id": None,
            "timestamp_utc": utc(20, 9, 2, 0, 0),
            "agent_role": "shell_router",
            "task_complexity_score": 0.42,
            "primary_failure_count": 0,
            "primary_model": "qwen3:14b-q4_K_M",
            "fallback_model": "claude-sonnet-4-5",
            "selected_model": "qwen3:14b-q4_K_M",
            "matched_fallback_triggers": [],
            "policy_source": "yaml",
            "propensity": None,
        },
        {
            "source_file": f21,
            "source_line": 1,
            "session_id": "sess-abc",
            "trace_id": "trace-123",
            "timestamp_utc": utc(20, 10, 0, 0, 1),
            "agent_role": "shell_chat",
            "task_complexity_score": 0.91,
            "primary_failure_count": 0,
            "primary_model": "qwen3:14b-q4_K_M",
            "fallback_model": "claude-sonnet-4-5",
            "selected_model": "claude-sonnet-4-5",
            "matched_fallback_triggers": ["task_complexity_score > 0.8"],
            "policy_source": "learned",
            "propensity": 0.85,
        },
        {
            "source_file": f22,
            "source_line": 1,
            "session_id": "2026-11-22",
            "trace_id": None,
            "timestamp_utc": utc(22, 8, 0, 0, 1),
            "agent_role": "planner",
            "task_complexity_score": 0.42,
            "primary_failure_count": 0,
            "primary_model": "qwen3:14b-q4_K_M",
            "fallback_model": "claude-sonnet-4-5",
            "selected_model": "qwen3:14b-q4_K_M",
            "matched_fallback_triggers": [],
            "policy_source": "yaml",
            "propensity": None,
        },
    ]
    assert r.tu.to_pylist() == [
        {
            "source_file": f20,
            "source_line": 3,
            "session_id": "2026-11-20",
            "trace_id": None,
            "timestamp_utc": utc(20, 9, 0, 2, 500000),
            "agent": None,
            "model": "qwen2.5-coder:1.5b",
            "prompt_tokens": 812,
            "completion_tokens": 95,
            "cost_usd": None,
        },
        {
            "source_file": f20,
            "source_line": 8,
            "session_id": "2026-11-20",
            "trace_id": None,
            "timestamp_utc": utc(20, 9, 0, 6, 999999),
            "agent": "coder",
            "model": "codestral:22b",
            "prompt_tokens": 32000,
            "completion_tokens": 410,
            "cost_usd": 0.0,
        },
        {
            "source_file": f21,
            "source_line": 2,
            "session_id": "sess-abc",
            "trace_id": "trace-123",
            "timestamp_utc": utc(20, 10, 0, 1, 2),
            "agent": "shell_chat",
            "model": "claude-sonnet-4-5",
            "prompt_tokens": 2048,
            "completion_tokens": 512,
            "cost_usd": 0.01382,
        },
    ]
    out = tmp_path / "memory" / "sessions_out"
    assert (r.res.trajectories, r.res.routing_decisions, r.res.token_usage, r.res.quarantine) == (
        out / "trajectories.parquet",
        out / "routing_decisions.parquet",
        out / "token_usage.parquet",
        out / "quarantine.jsonl",
    )
    assert sorted(p.name for p in out.iterdir()) == [  # no temporary files left behind
        "agent_insights.parquet",
        "quarantine.jsonl",
        "routing_decisions.parquet",
        "token_usage.parquet",
        "trajectories.parquet",
    ]
    d = s.to_dict()
    assert {
        k: d[k]
        for k in (
            "routing_decisions",
            "token_usage",
            "unusable_side_events",
            "unusable_side_examples",
            "steps_without_step",
            "sessions_from_file_stem",
            "steps_session_from_file_stem",
        )
    } == {
        "routing_decisions": 5,
        "token_usage": 3,
        "unusable_side_events": {},
        "unusable_side_examples": [],
        "steps_without_step": 4,
        "sessions_from_file_stem": 2,
        "steps_session_from_file_stem": 4,
    }
    json.dumps(d)  # metadata: plain JSON


def test_sage_journals_do_not_depend_on_read_chunk_bytes(tmp_path):
    write_sage_journals(tmp_path)
    base = run(tmp_path / "memory" / "sessions", tmp_path / "base")
    for chunk in (1, 97, 1000):
        r = run(tmp_path / "memory" / "sessions", tmp_path / f"out{chunk}", read_chunk_bytes=chunk)
        assert r.rows.equals(base.rows), chunk
        assert r.mrd.equals(base.mrd) and r.tu.equals(base.tu), chunk
        d, b = r.stats.to_dict(), base.stats.to_dict()
        d.pop("seconds"), b.pop("seconds")
        assert d == b, chunk


def test_session_id_per_line_stem_or_logged(tmp_path):
    """Within one file, each line's session is its own session_id, else the file's stem."""
    evs = [
        sage_step(ts(9, 0, 0, 1), "a", "coder", "m"),
        with_ids(sage_step(ts(9, 0, 0, 2), "a", "coder", "m"), "S", "T"),
        sage_step(ts(9, 0, 0, 3), "b", "coder", "m", session_id=None, trace_id=None),
    ]
    r = run(write(tmp_path / "logs" / "2026-11-20.jsonl", [line(e) for e in evs]).parent)
    assert r.stats.quarantined == 0
    assert r.rows["session_id"].tolist() == ["2026-11-20", "S", "2026-11-20"]
    assert r.rows["session_id_source"].tolist() == ["file_stem", "logged", "file_stem"]
    assert pq.read_table(r.res.trajectories)["trace_id"].to_pylist() == [None, "T", None]
    assert r.stats.sessions_from_file_stem == 1 and r.stats.steps_session_from_file_stem == 2


@pytest.mark.parametrize(
    ("name", "stem"),
    [
        ("2026-11-20.log", "2026-11-20"),
        ("2026-11-20.log.gz", "2026-11-20"),
        ("a.jsonl", "a"),
        ("a.jsonl.gz", "a"),
        ("x.y.log", "x.y"),
        ("/deep/memory/sessions/2026-01-02.log.gz", "2026-01-02"),
    ],
)
def test_file_stem(name, stem):
    assert file_stem(name) == stem
    assert file_stem(Path(name)) == stem


def test_discovery_patterns_are_recursive(tmp_path):
    logs = tmp_path / "logs"
    good = line(sage_step(ts(9, 0, 0, 0), "t", "coder", "m"))
    found = [
        write(logs / "2026-11-20.log", [good]),
        write(logs / "b.jsonl", [good]),
        write(logs / "deep" / "er" / "2026-11-21.log", [good]),
    ]
    for name in ("2026-11-22.log.gz", "c.jsonl.gz"):
        with gzip.open(logs / "deep" / name, "wb") as fh:
            fh.write(good + b"\n")
        found.append(logs / "deep" / name)
    for name in ("notes.json", "2026-11-23.log.bak", "x.txt", "y.gz", "z.logs"):
        write(logs / name, [good])
    r = run(logs)
    assert r.stats.files == sorted(str(p) for p in found)
    assert r.stats.steps_accepted == 5 and r.stats.sessions_from_file_stem == 5
    assert sorted(r.rows["session_id"]) == ["2026-11-20", "2026-11-21", "2026-11-22", "b", "c"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2026-11-20T14:03:22.123456+00:00", utc(20, 14, 3, 22, 123456)),
        ("2026-11-20T16:03:22.123456+02:00", utc(20, 14, 3, 22, 123456)),
        ("2026-11-20T09:03:22-05:00", utc(20, 14, 3, 22, 0)),
        ("2026-11-20T14:03:22Z", utc(20, 14, 3, 22, 0)),
        ("2026-11-20T14:03:22.5", utc(20, 14, 3, 22, 500000)),  # naive: UTC
        ("2026-11-20 14:03:22", utc(20, 14, 3, 22, 0)),
        ("2026-11-20", utc(20, 0, 0, 0, 0)),
        ("2026-11-20T14:03:22.123456789+00:00", utc(20, 14, 3, 22, 123456)),  # nanoseconds: truncated to us
    ],
)
def test_iso8601_timestamps_are_parsed_to_utc(tmp_path, raw, expected):
    r = one_good(tmp_path, sage_step(raw, "t", "coder", "m"))
    row = pq.read_table(r.res.trajectories).to_pylist()[0]
    assert row["timestamp"] == raw and row["timestamp_utc"] == expected


@pytest.mark.parametrize(
    "raw",
    [
        "yesterday",
        "2026-13-01T00:00:00Z",
        "2026-11-31T10:00:00+00:00",
        "",
        "14:03:22",
        "2026-11-20T25:00:00",
        "0001-01-01T00:00:00Z",
        "9999-12-31T00:00:00+00:00",
        "1677-12-31T23:59:59.999999Z",
        "2262-01-01T00:00:00Z",
    ],
)
def test_timestamp_that_is_not_iso8601(tmp_path, raw):
    assert_one_bad(
        tmp_path,
        line(event(timestamp=raw)),
        f"field timestamp = {raw!r} is not ISO 8601 in years 1678-2261 "
        "(e.g. '2026-11-20T14:03:22.123456+00:00'; naive means UTC)",
        "bad_timestamp",
    )


@pytest.mark.parametrize(
    "neighbour",
    [
        None,  # a block of offset-qualified times only (Arrow's parser)
        "2026-11-20T14:03:22.123456789Z",  # 9 fractional digits: pandas, at ns resolution
        "2026-11-20T14:03:22.5",  # naive: pandas, at us resolution
        "not a time",  # refused: pandas
    ],
)
def test_timestamp_checks_do_not_depend_on_the_other_lines_of_a_block(tmp_path, neighbour):
    """Each line gets the same timestamp_utc, or the same refusal, whatever shares its block."""
    stamps = {
        "offset": "2026-11-20T16:03:22.250001+02:00",
        "zulu": "2026-11-20T14:03:22Z",
        "old": "1500-01-01T00:00:00Z",  # outside 1678-2261: refused in every block
        "edge": "1678-01-01T00:00:00+00:00",
        "late": "2261-12-31T23:59:59.999999Z",
        "ancient": "0001-01-01T00:00:00Z",
    }
    if neighbour is not None:
        stamps["neighbour"] = neighbour
    write(tmp_path / "logs" / "a.jsonl", [line(event(task=k, timestamp=v)) for k, v in stamps.items()])
    together = run(tmp_path / "logs", tmp_path / "together")
    alone = run(tmp_path / "logs", tmp_path / "alone", read_chunk_bytes=1)  # one line per block
    kept = ["offset", "zulu", "edge", "late"] + ([] if neighbour in (None, "not a time") else ["neighbour"])
    for r in (together, alone):
        assert r.rows["task_id"].tolist() == kept
        assert [q["reason"].split(" is ")[0] for q in r.quarantine] == [
            f"field timestamp = {stamps[k]!r}" for k in stamps if k not in kept
        ]
    assert pq.read_table(together.res.trajectories)["timestamp_utc"].to_pylist()[:4] == [
        utc(20, 14, 3, 22, 250001),
        utc(20, 14, 3, 22, 0),
        datetime(1678, 1, 1, tzinfo=UTC),
        datetime(2261, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    ]
    assert together.rows.equals(alone.rows)
    assert together.res.quarantine.read_bytes() == alone.res.quarantine.read_bytes()


def test_unknown_models_and_roles_are_accepted(tmp_path):
    evs = [
        event(task="a", role="shell_router", model="qwen2.5-coder:1.5b"),
        event(task="b", role="shell_chat", model="qwen3:14b-q4_K_M"),
        event(task="c", role="wizard", model="gpt-9"),
        event(task="d", role="planner", model="qwen2.5-coder-32b"),
    ]
    r = run(write(tmp_path / "logs" / "a.jsonl", [line(e) for e in evs]).parent)
    assert r.stats.quarantined == 0
    assert r.rows["role"].tolist() == ["shell_router", "shell_chat", "wizard", "planner"]
    assert r.rows["model"].tolist() == [
        "qwen2.5-coder:1.5b",
        "qwen3:14b-q4_K_M",
        "gpt-9",
        "qwen2.5-coder-32b",
    ]


def test_state_is_free_form(tmp_path):
    st = {
        "task_complexity_score": 0.3,
        "primary_failure_count": 1,
        "anything": [1, "x", {"y": None}],
        "nested": {"deep": {"deeper": [True, 2.5]}},
        "n": None,
        "s": "text",
        "b": False,
        "i": 12,
    }
    r = one_good(tmp_path, event(state=st))
    row = r.rows.iloc[0]
    assert row["task_complexity_score"] == 0.3 and row["primary_failure_count"] == 1


@pytest.mark.parametrize(
    "path",
    [
        "session_id",
        "step",
        "propensity",
        "state",
        "state.primary_failure_count",
        "state.task_complexity_score",
        "extra",
        "action.prompt_strategy_key",
    ],
)
def test_optional_fields_may_be_missing(tmp_path, path):
    ev = _without(path) if path != "action.prompt_strategy_key" else event()
    r = one_good(tmp_path, ev)
    row = r.rows.iloc[0]
    col = {
        "session_id": "session_id",
        "state": "task_complexity_score",
        "extra": "data_source",
        "action.prompt_strategy_key": "prompt_strategy_key",
    }.get(path, path.rpartition(".")[2])
    if path == "session_id":
        assert row["session_id"] == "a" and row["session_id_source"] == "file_stem"
    elif path == "extra":
        assert row["data_source"] == "real"
    else:
        assert pd.isna(row[col])


def test_missing_propensity_is_accepted(tmp_path):
    ev = event()
    del ev["propensity"]
    r = run(write(tmp_path / "logs" / "a.jsonl", [line(ev), line(event(task="t2", propensity=None))]).parent)
    assert r.stats.steps_accepted == 2 and r.stats.quarantined == 0
    assert r.rows["propensity"].isna().all()


def test_optional_state_fields_may_be_missing(tmp_path):
    ev = event()
    ev["state"] = {"task_complexity_score": 0.3, "primary_failure_count": 1}
    del ev["extra"], ev["propensity"]
    r = one_good(tmp_path, ev)
    row = r.rows.iloc[0]
    assert pd.isna(row["failure_count"]) and pd.isna(row["cost_usd"]) and pd.isna(row["prompt_tokens"])
    assert (
        pd.isna(row["propensity"]) and pd.isna(row["verification_passed"]) and pd.isna(row["reviewer_score"])
    )
    assert row["data_source"] == "real"  # no extra.synthetic: real


def test_stray_key_named_like_another_types_field_is_ignored(tmp_path):
    # "model" is a TOKEN_USAGE field and "selected_model" a MODEL_ROUTING_DECISION one; on a
    # TRAJECTORY_STEP they are just extra keys, whatever their type
    r = one_good(
        tmp_path, event(model_name="x", selected_model=3, prompt_tokens="many", matched_fallback_triggers=7)
    )
    assert r.rows["model"].tolist() == ["gpt-4.1-mini"]


# ------------------------------------------------------------------ side events
def side_run(tmp_path, evs: list[dict], name: str = "2026-11-20.log") -> tuple[Run, Path]:
    path = write(tmp_path / "logs" / name, [line(e) for e in evs])
    return run(tmp_path / "logs"), path


def test_unusable_side_events_are_counted_not_quarantined(tmp_path):
    when = ts(9, 0, 0, 0)
    good_mrd, good_tu = mrd(when, "coder", "m"), usage(when, "m", 10, 2)
    evs = [
        good_mrd,  # 1 usable
        mrd(when, "coder", 3),  # 2 wrong type
        mrd(when, "coder", "m", matched_fallback_triggers=["a", 1]),  # 3 wrong type in the list
        mrd(when, "coder", "m", matched_fallback_triggers="a > 1"),  # 4 wrong type
        {k: v for k, v in good_mrd.items() if k != "selected_model"},  # 5 missing selected_model
        mrd(when, "", "m"),  # 6 empty agent_role
        mrd("not a time", "coder", "m"),  # 7 bad timestamp
        mrd(when, "coder", "m", propensity=0.0),  # 8 out of range
        mrd(when, "coder", "m", task_complexity_score=1.5),  # 9 out of range
        mrd(when, "coder", "m", step="x", state=[], action="a"),  # 10 usable: not MRD fields
        with_ids(mrd(when, "coder", "m"), "", "t"),  # 11 empty session_id
        good_tu,  # 12 usable
        usage(when, "m", "12", 2),  # 13 wrong type
        usage(when, "m", 12, -1),  # 14 negative
        usage(when, None, 1, 1),  # 15 missing model
        {k: v for k, v in good_tu.items() if k != "timestamp"},  # 16 missing timestamp
        usage(when, "m", 1, 1, cost_usd=-0.5),  # 17 negative cost
        sage_step(when, "t", "coder", "m"),  # 18 a step
    ]
    r, path = side_run(tmp_path, evs)
    assert r.stats.quarantined == 0 and r.stats.steps_accepted == 1
    assert r.stats.lines_read == 18 == r.stats.accepted_lines
    assert dict(r.stats.other_events) == {"MODEL_ROUTING_DECISION": 11, "TOKEN_USAGE": 6}
    assert dict(r.stats.unusable_side_events) == {"MODEL_ROUTING_DECISION": 9, "TOKEN_USAGE": 5}
    assert r.mrd["source_line"].to_pylist() == [1, 10] and r.tu["source_line"].to_pylist() == [12]
    ex = [(e["file"], e["line"], e["type"], e["reason"]) for e in r.stats.unusable_side_examples]
    mrd_t, tu_t, f = "MODEL_ROUTING_DECISION", "TOKEN_USAGE", str(path)
    assert ex == [
        (f, 2, mrd_t, "wrong type: Expected `str | null`, got `int` - at `$.selected_model`"),
        (f, 3, mrd_t, "wrong type: Expected `str`, got `int` - at `$.matched_fallback_triggers[1]`"),
        (f, 4, mrd_t, "wrong type: Expected `array | null`, got `str` - at `$.matched_fallback_triggers`"),
        (f, 5, mrd_t, "missing field selected_model"),
        (f, 6, mrd_t, "empty field agent_role"),
        (
            f,
            7,
            mrd_t,
            (
                "field timestamp = 'not a time' is not ISO 8601 in years 1678-2261 "
                "(e.g. '2026-11-20T14:03:22.123456+00:00'; naive means UTC)"
            ),
        ),
        (f, 8, mrd_t, "field propensity = 0 outside (0, 1]"),
        (f, 9, mrd_t, "field task_complexity_score = 1.5 outside [0, 1]"),
        (f, 11, mrd_t, "empty field session_id"),
        (f, 13, tu_t, "wrong type: Expected `int | null`, got `str` - at `$.prompt_tokens`"),
        (f, 14, tu_t, "field completion_tokens = -1 outside [0, inf]"),
        (f, 15, tu_t, "missing field model"),
        (f, 16, tu_t, "missing field timestamp"),
        (f, 17, tu_t, "field cost_usd = -0.5 outside [0, inf]"),
    ]
    assert r.stats.to_dict()["unusable_side_events"] == {"MODEL_ROUTING_DECISION": 9, "TOKEN_USAGE": 5}


def test_unusable_side_examples_are_capped(tmp_path):
    evs = [mrd(ts(9, 0, 0, i), "coder", i) for i in range(ingest.MAX_UNUSABLE_EXAMPLES + 5)]
    r, _ = side_run(tmp_path, evs)
    assert r.stats.unusable_side_events["MODEL_ROUTING_DECISION"] == ingest.MAX_UNUSABLE_EXAMPLES + 5
    assert [e["line"] for e in r.stats.unusable_side_examples] == list(
        range(1, ingest.MAX_UNUSABLE_EXAMPLES + 1)
    )


def test_side_event_with_bad_json_is_still_quarantined(tmp_path):
    bad = line(mrd(ts(9, 0, 0, 0), "coder", "m"))[:-5]
    r, path = side_run(tmp_path, [])  # an empty-ish file first, to reuse the helper's folder
    path.write_bytes(bad + b"\n")
    r = run(tmp_path / "logs")
    assert r.stats.quarantined == 1 and dict(r.stats.other_events) == {}
    assert r.quarantine[0]["reason"].startswith("invalid JSON (truncated or malformed): ")


def test_side_tables_are_empty_with_their_schema_when_nothing_is_logged(tmp_path):
    r = one_good(tmp_path, event())
    assert r.mrd.num_rows == 0 and r.tu.num_rows == 0
    assert r.stats.routing_decisions == 0 and r.stats.token_usage == 0


def test_collector_logs_ingest_without_quarantine(tmp_path, sim):
    res = collect(
        sim,
        tmp_path / "logs",
        CollectorConfig(episodes=150, seed=2),
        progress=lambda m: None,
    )
    r = run(tmp_path / "logs")
    assert r.stats.lines_read == res.events and r.stats.quarantined == 0
    assert r.stats.steps_accepted == res.decisions
    events = [json.loads(x) for p in res.files for x in p.read_bytes().splitlines()]
    types = Counter(e["type"] for e in events)
    assert dict(r.stats.other_events) == {t: n for t, n in types.items() if t != "TRAJECTORY_STEP"}
    assert dict(r.stats.unusable_side_events) == {}
    assert r.stats.routing_decisions == types["MODEL_ROUTING_DECISION"]
    assert r.stats.token_usage == types["TOKEN_USAGE"]
    assert r.stats.steps_without_step == sum(
        e["type"] == "TRAJECTORY_STEP" and "step" not in e for e in events
    )
    assert dict(r.stats.rows_by_source) == {"synthetic": res.decisions, "real": 0}
    assert r.stats.files == [str(p) for p in res.files]  # simulator.json is not a log


# ------------------------------------------------------------------ the bad-input list
def test_good_lines_become_rows(tmp_path):
    path = write(
        tmp_path / "logs" / "a.jsonl",
        [
            line({"type": "SESSION_START", "timestamp": "t", "session_id": "s1"}),
            line(event(step=0, terminal=False, extra={"synthetic": True})),
            line(event(step=1, propensity=1.0)),
        ],
    )
    r = run(tmp_path / "logs")
    assert r.stats.files == [str(path)]
    assert r.stats.bytes_read == path.stat().st_size
    assert r.stats.lines_read == 3 and r.stats.steps_accepted == 2 and r.stats.quarantined == 0
    assert dict(r.stats.other_events) == {"SESSION_START": 1}
    assert dict(r.stats.rows_by_source) == {"synthetic": 1, "real": 1}
    assert r.stats.steps_without_step == 0 and r.stats.sessions_from_file_stem == 0
    row = pq.read_table(r.res.trajectories).to_pylist()[0]
    assert row == {
        "timestamp": "2026-11-01T00:00:00.000Z",
        "timestamp_utc": datetime(2026, 11, 1, tzinfo=UTC),
        "session_id": "s1",
        "session_id_source": "logged",
        "trace_id": None,
        "task_id": "t1",
        "role": "coder",
        "step": 0,
        "model": "gpt-4.1-mini",
        "prompt_strategy_key": None,
        "propensity": 0.5,
        "task_complexity_score": 0.5,
        "primary_failure_count": 0,
        "failure_count": 0,
        "prompt_tokens": 3000,
        "verification_passed": True,
        "failed_reason": None,
        "timed_out": False,
        "reviewer_score": 0.8,
        "latency_s": 3.5,
        "cost_usd": 0.003,
        "logged_reward": 1.05,
        "terminal": False,
        "verdict": None,
        "debug_retry": None,
        "debug_status": None,
        "data_source": "synthetic",
        "source_file": str(path),
        "source_line": 2,
    }
    assert r.rows["propensity"].tolist() == [0.5, 1.0]  # propensity exactly 1 is valid
    assert r.res.trajectories == tmp_path / "logs_out" / "trajectories.parquet"
    assert r.res.quarantine.read_bytes() == b""


def test_truncated_json(tmp_path):
    q = assert_one_bad(
        tmp_path,
        GOOD_BEFORE[:60],
        "invalid JSON (truncated or malformed): Unterminated string starting at (column 42)",
        "invalid_json",
    )
    assert q["raw_head"] == GOOD_BEFORE[:60].decode()


def test_truncated_json_at_end_of_file_without_newline(tmp_path):
    path = write(tmp_path / "logs" / "a.jsonl", [GOOD_BEFORE, GOOD_AFTER[:-1]], end=b"")
    r = run(tmp_path / "logs")
    assert r.stats.lines_read == 2 and r.stats.steps_accepted == 1
    assert r.quarantine == [
        {
            "file": str(path),
            "line": 2,
            "raw_head": GOOD_AFTER[:-1].decode()[:240],
            "reason": "invalid JSON (truncated or malformed): Expecting ',' delimiter (column "
            f"{len(GOOD_AFTER)})",
        }
    ]


@pytest.mark.parametrize(
    ("raw", "name"),
    [(b"[1, 2, 3]", "list"), (b'"hello"', "str"), (b"42", "int"), (b"null", "NoneType"), (b"true", "bool")],
)
def test_line_that_is_not_an_object(tmp_path, raw, name):
    q = assert_one_bad(tmp_path, raw, f"not a JSON object (got {name})", "not_an_object")
    assert q["raw_head"] == raw.decode()


@pytest.mark.parametrize(
    ("obj", "reason"),
    [
        (event(step="0"), "wrong type: Expected `int | null`, got `str` - at `$.step`"),
        (event(step=1.5), "wrong type: Expected `int | null`, got `float` - at `$.step`"),
        (event(terminal="yes"), "wrong type: Expected `bool | null`, got `str` - at `$.terminal`"),
        (event(state=[]), "wrong type: Expected `object`, got `array` - at `$.state`"),
        (event(action="gpt-4.1"), "wrong type: Expected `object`, got `str` - at `$.action`"),
        (event(reward="1.0"), "wrong type: Expected `float | null`, got `str` - at `$.reward`"),
        (event(session_id=7), "wrong type: Expected `str | null`, got `int` - at `$.session_id`"),
        (event(timestamp=1732111402), "wrong type: Expected `str | null`, got `int` - at `$.timestamp`"),
        (event(trace_id=["x"]), "wrong type: Expected `str | null`, got `array` - at `$.trace_id`"),
        (
            event(action={"model_chosen": "m", "prompt_strategy_key": 1}),
            "wrong type: Expected `str | null`, got `int` - at `$.action.prompt_strategy_key`",
        ),
        (
            event(state={"task_complexity_score": 0.5, "primary_failure_count": True}),
            "wrong type: Expected `int | null`, got `bool` - at `$.state.primary_failure_count`",
        ),
    ],
)
def test_wrong_types(tmp_path, obj, reason):
    assert_one_bad(tmp_path, line(obj), reason, "wrong_type")


@pytest.mark.parametrize(
    ("raw", "shown"), [(b"NaN", "nan"), (b"Infinity", "inf"), (b"-Infinity", "-inf"), (b"1e999", "inf")]
)
def test_non_finite_reward(tmp_path, raw, shown):
    bad = line(event(reward=0.123456)).replace(b"0.123456", raw)
    q = assert_one_bad(tmp_path, bad, f"field reward = {shown} is not finite", "non_finite")
    assert q["raw_head"] == bad.decode()[:240]


def test_non_finite_propensity_and_complexity(tmp_path):
    bad = line(event(propensity=0.123456)).replace(b"0.123456", b"NaN")
    assert_one_bad(tmp_path, bad, "field propensity = nan is not finite", "non_finite")


@pytest.mark.parametrize(
    ("obj", "reason", "cls"),
    [
        (event(reward=2.5), "field reward = 2.5 outside [-2, 2]", "out_of_range"),
        (event(step=-1), "field step = -1 outside [0, inf]", "out_of_range"),
        (
            event(state={"task_complexity_score": 1.5, "primary_failure_count": 0}),
            "field state.task_complexity_score = 1.5 outside [0, 1]",
            "out_of_range",
        ),
        (
            event(state={"task_complexity_score": -0.1}),
            "field state.task_complexity_score = -0.1 outside [0, 1]",
            "out_of_range",
        ),
        (
            event(state={"primary_failure_count": -2}),
            "field state.primary_failure_count = -2 outside [0, inf]",
            "out_of_range",
        ),
        (
            event(state={"task_complexity_score": 0.5, "primary_failure_count": 0, "reviewer_score": 1.2}),
            "field state.reviewer_score = 1.2 outside [0, 1]",
            "out_of_range",
        ),
        (
            event(state={"task_complexity_score": 0.5, "primary_failure_count": 0, "cost_usd": -0.01}),
            "field state.cost_usd = -0.01 outside [0, inf]",
            "out_of_range",
        ),
    ],
)
def test_out_of_range_values(tmp_path, obj, reason, cls):
    assert_one_bad(tmp_path, line(obj), reason, cls)


def _without(path: str) -> dict:
    ev = event()
    *parents, leaf = path.split(".")
    node = ev
    for p in parents:
        node = node[p]
    del node[leaf]
    return ev


@pytest.mark.parametrize(
    ("path", "reason", "cls"),
    [
        ("reward", "missing field reward", "missing_field"),
        ("terminal", "missing field terminal", "missing_field"),
        ("task_id", "missing field task_id", "missing_field"),
        ("agent", "missing field agent", "missing_field"),
        ("timestamp", "missing field timestamp", "missing_field"),
        ("action", "missing field action.model_chosen", "missing_field"),
        ("action.model_chosen", "missing field action.model_chosen", "missing_field"),
        ("type", "missing or non-string field 'type'", "no_type"),
    ],
)
def test_missing_fields(tmp_path, path, reason, cls):
    assert_one_bad(tmp_path, line(_without(path)), reason, cls)


def test_missing_agent_in_sage_shape(tmp_path):
    ev = sage_step(ts(9, 0, 0, 1), "t", "coder", "m")
    del ev["agent"]
    path = write(tmp_path / "logs" / "2026-11-20.log", [line(mrd(ts(9, 0, 0, 0), "coder", "m")), line(ev)])
    r = run(tmp_path / "logs")
    assert r.stats.steps_accepted == 0 and r.stats.routing_decisions == 1
    assert [(q["file"], q["line"], q["reason"]) for q in r.quarantine] == [
        (str(path), 2, "missing field agent")
    ]


@pytest.mark.parametrize(
    ("over", "reason"),
    [
        ({"session": ""}, "empty field session_id"),
        ({"task": ""}, "empty field task_id"),
        ({"role": ""}, "empty field agent"),
        ({"role": None}, "missing field agent"),
    ],
)
def test_empty_ids(tmp_path, over, reason):
    assert_one_bad(tmp_path, line(event(**over)), reason, "missing_field")


def test_an_empty_model_is_sages_and_kept_without_one(tmp_path):
    """SAGE writes model_chosen = ``task.model_used or ""`` (workflow.py circuit_breaker, debug_agent):
    an empty model is SAGE's own line, kept with a null model and counted by role, never quarantined."""
    write(tmp_path / "logs" / "session.jsonl", [GOOD_BEFORE, line(event(model="")), GOOD_AFTER])
    r = run(tmp_path / "logs")
    assert r.stats.quarantined == 0 and r.stats.steps_accepted == 3
    assert dict(r.stats.steps_without_model) == {"coder": 1}
    assert r.rows["model"].isna().tolist() == [False, True, False]


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (0.0, "0"), (1.5, "1.5"), (-0.2, "-0.2")])
def test_propensity_out_of_range(tmp_path, value, shown):
    assert_one_bad(
        tmp_path,
        line(event(propensity=value)),
        f"field propensity = {shown} outside (0, 1]",
        "out_of_range",
    )


def test_first_reason_wins(tmp_path):
    # missing reward, an empty agent and a bad timestamp: the missing field is reported
    ev = _without("reward")
    ev["agent"] = ""
    ev["timestamp"] = "soon"
    assert_one_bad(tmp_path, line(ev), "missing field reward", "missing_field")
    # then the empty field before the timestamp, and the timestamp before the ranges
    ev = event(role="", timestamp="soon", reward=9.0)
    assert_one_bad(tmp_path / "2", line(ev), "empty field agent", "missing_field")
    ev = event(timestamp="soon", reward=9.0)
    assert_one_bad(
        tmp_path / "3",
        line(ev),
        "field timestamp = 'soon' is not ISO 8601 in years 1678-2261 "
        "(e.g. '2026-11-20T14:03:22.123456+00:00'; naive means UTC)",
        "bad_timestamp",
    )


def test_duplicate_event_in_one_file(tmp_path):
    dup = line(event(task="before", reward=0.0))  # same (session, task, step) as line 1
    q = assert_one_bad(
        tmp_path,
        dup,
        "duplicate TRAJECTORY_STEP: session_id='s1' task_id='before' step=0 was already ingested",
        "duplicate",
    )
    assert json.loads(q["raw_head"]) == {
        "session_id": "s1",
        "task_id": "before",
        "step": 0,
        "role": "coder",
        "model": "gpt-4.1-mini",
        "timestamp": "2026-11-01T00:00:00.000Z",
    }


def test_duplicate_event_across_two_files(tmp_path):
    a = write(tmp_path / "logs" / "a.jsonl", [line(event(task="t1")), line(event(task="t2"))])
    b = write(
        tmp_path / "logs" / "sub" / "b.jsonl",
        [line(event(task="t3")), line(event(task="t2")), line(event(task="t4"))],
    )
    r = run(tmp_path / "logs")
    assert r.stats.files == [str(a), str(b)]
    assert r.stats.lines_read == 5 and r.stats.steps_accepted == 4
    assert r.rows["task_id"].tolist() == ["t1", "t2", "t3", "t4"]
    assert r.rows["source_file"].tolist() == [str(a), str(a), str(b), str(b)]
    assert r.rows["source_line"].tolist() == [1, 2, 1, 3]
    assert [(q["file"], q["line"], q["reason"]) for q in r.quarantine] == [
        (str(b), 2, "duplicate TRAJECTORY_STEP: session_id='s1' task_id='t2' step=0 was already ingested")
    ]


def test_same_task_in_other_session_or_step_is_not_a_duplicate(tmp_path):
    write(
        tmp_path / "logs" / "a.jsonl",
        [line(event()), line(event(session="s2")), line(event(step=1)), line(event(task="t1\x1f0"))],
    )
    r = run(tmp_path / "logs")
    assert r.stats.steps_accepted == 4 and r.stats.quarantined == 0


def test_duplicate_without_step_is_keyed_by_role_and_timestamp(tmp_path):
    t0, t1 = ts(9, 0, 0, 123456), ts(9, 0, 0, 123457)
    evs = [
        sage_step(t0, "t", "coder", "m"),  # 1 kept
        sage_step(t0, "t", "coder", "other-model", reward=1.0),  # 2 duplicate: same session, task, role, time
        sage_step(t1, "t", "coder", "m"),  # 3 kept: a microsecond later
        sage_step(t0, "t", "reviewer", "m"),  # 4 kept: other role
        sage_step(t0, "u", "coder", "m"),  # 5 kept: other task
        sage_step(ts(9, 0, 0, 123456, 2), "t", "coder", "m"),  # 6 duplicate: the same instant as 1 (+02:00)
        sage_step(t0, "t", "coder", "m", step=0),  # 7 kept: a logged step is keyed by step
        sage_step(t1, "t", "coder", "m", step=0),  # 8 duplicate of 7 (session, task, step)
        with_ids(sage_step(t0, "t", "coder", "m"), "S", "T"),  # 9 kept: other session
    ]
    path = write(tmp_path / "logs" / "2026-11-20.log", [line(e) for e in evs])
    other_day = write(tmp_path / "logs" / "2026-11-21.log", [line(evs[0])])  # other stem: other session
    r = run(tmp_path / "logs")
    assert r.stats.steps_accepted == 7 and r.stats.steps_without_step == 6
    assert list(zip(r.rows["source_file"], r.rows["source_line"], strict=True)) == [
        (str(path), 1),
        (str(path), 3),
        (str(path), 4),
        (str(path), 5),
        (str(path), 7),
        (str(path), 9),
        (str(other_day), 1),
    ]
    assert [(q["line"], q["reason"]) for q in r.quarantine] == [
        (
            2,
            (
                "duplicate TRAJECTORY_STEP: session_id='2026-11-20' task_id='t' role='coder' "
                f"timestamp={t0!r} was already ingested "
                "(no step logged: the key is session, task, role and timestamp)"
            ),
        ),
        (
            6,
            (
                "duplicate TRAJECTORY_STEP: session_id='2026-11-20' task_id='t' role='coder' "
                "timestamp='2026-11-20T11:00:00.123456+02:00' was already ingested "
                "(no step logged: the key is session, task, role and timestamp)"
            ),
        ),
        (8, "duplicate TRAJECTORY_STEP: session_id='2026-11-20' task_id='t' step=0 was already ingested"),
    ]
    assert json.loads(r.quarantine[0]["raw_head"]) == {
        "session_id": "2026-11-20",
        "task_id": "t",
        "step": None,
        "role": "coder",
        "model": "other-model",
        "timestamp": t0,
    }
    assert dict(r.stats.quarantine_reasons) == {"duplicate": 3}


def test_duplicate_without_step_across_files_of_one_session(tmp_path):
    # SAGE_SESSION_ID set: two files, one session; the same step logged in both
    ev = with_ids(sage_step(ts(9, 0, 0, 1), "t", "coder", "m"), "S", "T")
    write(tmp_path / "logs" / "2026-11-20.log", [line(ev)])
    b = write(tmp_path / "logs" / "2026-11-21.log", [line(ev)])
    r = run(tmp_path / "logs")
    assert r.stats.steps_accepted == 1
    assert [(q["file"], q["line"], q["reason"].split(":")[0]) for q in r.quarantine] == [
        (str(b), 1, "duplicate TRAJECTORY_STEP")
    ]


def test_non_utf8_bytes(tmp_path):
    bad = line(event(task="XX")).replace(b"XX", b"X\xff")
    offset = bad.index(b"\xff")
    q = assert_one_bad(tmp_path, bad, f"not valid UTF-8: byte 0xff at offset {offset}", "non_utf8")
    assert "\ufffd" in q["raw_head"]


def test_non_utf8_in_other_event_is_quarantined_too(tmp_path):
    bad = b'{"type": "AGENT_MESSAGE", "session_id": "s1", "content": "caf\xe9"}'
    assert_one_bad(
        tmp_path,
        bad,
        f"not valid UTF-8: byte 0xe9 at offset {bad.index(bytes([0xE9]))}",
        "non_utf8",
    )


def _huge_line(nbytes: int) -> bytes:
    head = b'{"type": "AGENT_MESSAGE", "session_id": "s1", "content": "'
    return head + b"x" * (nbytes - len(head) - 2) + b'"}'


def test_ten_megabyte_line_is_skipped_in_bounded_memory(tmp_path):
    huge = _huge_line(10_000_000)
    assert len(huge) == 10_000_000
    path = write(tmp_path / "logs" / "a.jsonl", [GOOD_BEFORE, huge, GOOD_AFTER])
    del huge
    cfg = {"max_line_bytes": 64 * 1024, "read_chunk_bytes": 64 * 1024}
    # the reader never holds the line: no block is longer than a chunk plus max_line_bytes
    blocks = list(iter_blocks(path, cfg["max_line_bytes"], cfg["read_chunk_bytes"]))
    assert max(len(b.data) for b in blocks) <= 2 * 64 * 1024
    assert [t for b in blocks for t in b.too_long] == [(2, 10_000_000)]
    tracemalloc.start()
    try:
        r = run(tmp_path / "logs", **cfg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 2_000_000, f"ingest peaked at {peak} bytes for a 10 MB line"
    assert r.stats.lines_read == 3 and r.stats.steps_accepted == 2
    assert r.rows["source_line"].tolist() == [1, 3]
    assert r.quarantine == [
        {
            "file": str(path),
            "line": 2,
            "raw_head": "",
            "reason": "line is 10000000 bytes, over max_line_bytes=65536 (raise the max_line_bytes "
            "setting if it is real)",
        }
    ]
    assert dict(r.stats.quarantine_reasons) == {"line_too_long": 1}
    assert r.stats.bytes_read == path.stat().st_size


def test_over_long_line_within_one_chunk(tmp_path):
    # default 2 MiB chunks hold the whole 1.5 MB line; it is refused all the same
    assert_one_bad(
        tmp_path,
        _huge_line(1_500_000),
        "line is 1500000 bytes, over max_line_bytes=1048576 (raise the max_line_bytes setting if it is real)",
        "line_too_long",
    )


def test_over_long_last_line_without_newline(tmp_path):
    path = write(tmp_path / "logs" / "a.jsonl", [GOOD_BEFORE, _huge_line(5000)], end=b"")
    r = run(tmp_path / "logs", max_line_bytes=1024, read_chunk_bytes=512)
    assert r.stats.lines_read == 2 and r.stats.steps_accepted == 1
    assert [(q["file"], q["line"], q["reason"]) for q in r.quarantine] == [
        (
            str(path),
            2,
            "line is 5000 bytes, over max_line_bytes=1024 (raise the max_line_bytes setting if it is real)",
        )
    ]


def test_line_of_exactly_max_line_bytes_is_kept(tmp_path):
    ev = event(task="")
    ev["task_id"] = "t" * (1024 - len(line(ev)))
    exact = line(ev)
    assert len(exact) == 1024
    over = line(event(task="y" * 1100))
    write(tmp_path / "logs" / "a.jsonl", [exact, over])
    r = run(tmp_path / "logs", max_line_bytes=1024, read_chunk_bytes=100)
    assert r.stats.steps_accepted == 1 and r.stats.quarantined == 1
    assert r.rows["task_id"].tolist() == [ev["task_id"]]
    assert r.quarantine[0]["line"] == 2
    assert r.quarantine[0]["reason"].startswith(f"line is {len(over)} bytes, over max_line_bytes=1024")


def test_empty_file_is_listed_not_an_error(tmp_path):
    empty = tmp_path / "logs" / "empty.jsonl"
    good = write(tmp_path / "logs" / "good.jsonl", [GOOD_BEFORE])
    empty.write_bytes(b"")
    r = run(tmp_path / "logs")
    assert r.stats.empty_files == [str(empty)]
    assert r.stats.files == [str(empty), str(good)]
    assert r.stats.lines_read == 1 and r.stats.steps_accepted == 1 and r.stats.quarantined == 0
    assert r.stats.to_dict()["empty_files"] == [str(empty)]


def test_only_empty_files(tmp_path):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.jsonl").write_bytes(b"")
    (tmp_path / "logs" / "2026-11-20.log").write_bytes(b"")
    r = run(tmp_path / "logs")
    assert r.stats.lines_read == 0 and len(r.rows) == 0 and r.mrd.num_rows == 0 and r.tu.num_rows == 0
    assert tuple(r.rows.columns) == TRAJECTORY_COLUMNS


def test_missing_log_folder_names_path_and_setting(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(LogFolderMissing) as err:
        ingest.ingest(IngestConfig((missing,)), tmp_path / "out", setting="sage.log_dirs")
    assert str(err.value) == (
        f"log folder {missing} does not exist (it is listed in the 'sage.log_dirs' setting). "
        "Create it, point 'sage.log_dirs' at the folder that holds SAGE's session journals "
        "(SAGE writes them to memory/sessions/<YYYY-MM-DD>.log), or materialize synthetic_sessions first."
    )
    assert isinstance(err.value, FileNotFoundError)
    assert not (tmp_path / "out" / "trajectories.parquet").exists()


def test_a_failed_run_leaves_no_partial_outputs(tmp_path, monkeypatch):
    write_sage_journals(tmp_path)
    calls = []

    def boom(block, max_line_bytes):
        calls.append(block.fname)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real(block, max_line_bytes)

    real = ingest.process_block
    monkeypatch.setattr(ingest, "process_block", boom)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="killed"):
        ingest.ingest(IngestConfig((tmp_path / "memory" / "sessions",)), out, progress=lambda m: None)
    assert list(out.iterdir()) == []  # no output and no temporary file


def test_blank_lines_are_accepted(tmp_path):
    path = tmp_path / "logs" / "a.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"\n" + GOOD_BEFORE + b"\n   \n\t\r\n" + GOOD_AFTER + b"\r\n\n")
    r = run(tmp_path / "logs")
    assert r.stats.lines_read == 6 and r.stats.blank_lines == 4 and r.stats.steps_accepted == 2
    assert r.stats.quarantined == 0
    assert r.rows["source_line"].tolist() == [2, 5]


def test_other_event_types_are_counted_per_type(tmp_path):
    write(
        tmp_path / "logs" / "a.jsonl",
        [
            line({"type": "SESSION_START", "session_id": "s1"}),
            line({"type": "AGENT_MESSAGE", "content": "hi"}),
            line(
                {"type": "AGENT_MESSAGE", "step": "not an int", "state": "whatever"}
            ),  # others are not validated
            GOOD_BEFORE,
            line({"type": "TOOL_CALL", "tool": "pytest", "action": ["x"]}),
            line({"type": "SESSION_END"}),
            line({"type": "PROMPT_QUALITY_DELTA", "timestamp": 5, "session_id": 3}),
            line({"type": "ROUTING_POLICY_ERROR", "selected_model": {"no": "str"}}),
            line({"type": "CONTEXT_CLAMPED", "model": 1, "prompt_tokens": "many"}),
        ],
    )
    r = run(tmp_path / "logs")
    expected = {
        "SESSION_START": 1,
        "AGENT_MESSAGE": 2,
        "TOOL_CALL": 1,
        "SESSION_END": 1,
        "PROMPT_QUALITY_DELTA": 1,
        "ROUTING_POLICY_ERROR": 1,
        "CONTEXT_CLAMPED": 1,
    }
    assert dict(r.stats.other_events) == expected
    assert r.stats.lines_read == 9 and r.stats.steps_accepted == 1 and r.stats.quarantined == 0
    assert r.stats.to_dict()["other_events"] == expected
    assert dict(r.stats.unusable_side_events) == {}


def test_non_string_type_is_quarantined(tmp_path):
    assert_one_bad(tmp_path, line({"type": 3}), "missing or non-string field 'type'", "no_type")


def test_gzip_input(tmp_path):
    path = tmp_path / "logs" / "a.jsonl.gz"
    path.parent.mkdir()
    with gzip.open(path, "wb") as fh:
        fh.write(GOOD_BEFORE + b"\n{broken\n" + GOOD_AFTER + b"\n")
    (tmp_path / "logs" / "notes.json").write_text("[]")  # not a log
    r = run(tmp_path / "logs")
    assert r.stats.files == [str(path)]
    assert r.stats.lines_read == 3 and r.stats.steps_accepted == 2
    assert r.rows["source_file"].tolist() == [str(path)] * 2
    assert [(q["file"], q["line"]) for q in r.quarantine] == [(str(path), 2)]
    assert r.quarantine[0]["reason"].startswith("invalid JSON (truncated or malformed): ")


def _all_bad_inputs() -> list[bytes]:
    return [
        GOOD_BEFORE[:60],  # 1 invalid_json
        b"[1]",  # 2 not_an_object
        line(event(task="w", step="0")),  # 3 wrong_type
        line(event(task="n", reward=0.123)).replace(b"0.123", b"NaN"),  # 4 non_finite
        line(_without("reward")),  # 5 missing_field
        line(event(task="ts", timestamp="yesterday")),  # 6 bad_timestamp
        line(event(task="r", role="")),  # 7 missing_field (empty)
        line(event(task="s", step=-1)),  # 8 out_of_range
        line(event(task="p", propensity=0)),  # 9 out_of_range
        line(event(task="d")),  # 10 kept
        line(event(task="d")),  # 11 duplicate
        line(event(task="u")).replace(b'"u"', b'"\xff"'),  # 12 non_utf8
        b"",  # 13 blank
        b"   ",  # 14 blank
        line({"type": "AGENT_MESSAGE"}),  # 15 other
        _huge_line(3000),  # 16 line_too_long
        line(mrd("2026-11-01T00:00:00Z", "coder", 7)),  # 17 unusable side event
    ]


def test_output_does_not_depend_on_read_chunk_bytes(tmp_path, sim):
    res = collect(
        sim,
        tmp_path / "logs",
        CollectorConfig(episodes=60, seed=4),
        progress=lambda m: None,
    )
    write_sage_journals(tmp_path / "logs")
    write(tmp_path / "logs" / "zz_bad.jsonl", _all_bad_inputs(), end=b"")
    with gzip.open(tmp_path / "logs" / "zz_bad2.jsonl.gz", "wb") as fh:
        fh.write(b"\n".join(_all_bad_inputs()))
    runs = {}
    for chunk in (64, 1000, 1 << 21):
        runs[chunk] = run(
            tmp_path / "logs",
            tmp_path / f"out{chunk}",
            read_chunk_bytes=chunk,
            max_line_bytes=2048,
        )
    base = runs[1 << 21]
    # 12 bad lines per file; the gz file's first "d" duplicates the plain file's as well
    assert base.stats.quarantined == 12 + 13 and base.stats.steps_accepted == res.decisions + 5 + 1
    types = Counter(json.loads(x)["type"] for p in res.files for x in p.read_bytes().splitlines())
    assert base.stats.routing_decisions == types["MODEL_ROUTING_DECISION"] + 5
    assert base.stats.token_usage == types["TOKEN_USAGE"] + 3
    assert dict(base.stats.unusable_side_events) == {"MODEL_ROUTING_DECISION": 2}
    for chunk, r in runs.items():
        assert r.rows.drop(columns="source_file").equals(base.rows.drop(columns="source_file")), chunk
        assert r.rows["source_file"].tolist() == base.rows["source_file"].tolist()
        assert r.mrd.equals(base.mrd) and r.tu.equals(base.tu), chunk
        assert r.res.quarantine.read_bytes() == base.res.quarantine.read_bytes(), chunk
        d, b = r.stats.to_dict(), base.stats.to_dict()
        d.pop("seconds"), b.pop("seconds")
        assert d == b, chunk


def test_every_bad_input_gets_its_reason_class(tmp_path):
    path = write(tmp_path / "logs" / "bad.jsonl", _all_bad_inputs())
    r = run(tmp_path / "logs", max_line_bytes=2048)
    assert (
        r.stats.lines_read == 17
        and r.stats.blank_lines == 2
        and dict(r.stats.other_events) == {"AGENT_MESSAGE": 1, "MODEL_ROUTING_DECISION": 1}
    )
    assert r.rows["task_id"].tolist() == ["d"]
    assert dict(r.stats.quarantine_reasons) == {
        "invalid_json": 1,
        "not_an_object": 1,
        "wrong_type": 1,
        "non_finite": 1,
        "missing_field": 2,
        "bad_timestamp": 1,
        "out_of_range": 2,
        "duplicate": 1,
        "non_utf8": 1,
        "line_too_long": 1,
    }
    assert [q["line"] for q in r.quarantine] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 16]
    assert r.stats.quarantined_fraction == pytest.approx(12 / 17)
    assert dict(r.stats.unusable_side_events) == {"MODEL_ROUTING_DECISION": 1}
    assert r.stats.unusable_side_examples == [
        {
            "file": str(path),
            "line": 17,
            "type": "MODEL_ROUTING_DECISION",
            "reason": "wrong type: Expected `str | null`, got `int` - at `$.selected_model`",
        }
    ]


def test_ingest_config_validation():
    with pytest.raises(ValidationError, match=r"\nmax_line_bytes\n  Input should be greater than or equal to 1024 "
                                              r".*input_value=10,"):
        IngestConfig((Path("."),), max_line_bytes=10)
    # 0 would silently read nothing from a non-empty file, a negative size whole files at once
    for bad in (0, -1):
        with pytest.raises(ValidationError, match=rf"\nread_chunk_bytes\n  Input should be greater than or equal "
                                                  rf"to 1 .*input_value={bad},"):
            IngestConfig((Path("."),), read_chunk_bytes=bad)
    with pytest.raises(ValidationError, match=r"\nlog_dirs\n  List should have at least 1 item"):
        IngestConfig([])


def test_ingest_config_takes_folders_as_paths_or_text_and_resolves_relative_ones_under_a_root(tmp_path):
    """log_dirs positionally or by name, as Paths or text; under(root) resolves relative entries
    against the root (the asset's artifact root) and keeps absolute ones."""
    cfg = IngestConfig((Path("sessions"), tmp_path / "abs"))
    assert cfg == IngestConfig(log_dirs=["sessions", str(tmp_path / "abs")])
    assert IngestConfig().log_dirs == ["sessions"]
    assert cfg.under(tmp_path / "root").log_dirs == [str(tmp_path / "root" / "sessions"), str(tmp_path / "abs")]


def test_one_byte_chunks(tmp_path):
    write(tmp_path / "logs" / "a.jsonl", [GOOD_BEFORE, b"", b"{oops", GOOD_AFTER])
    r = run(tmp_path / "logs", read_chunk_bytes=1)
    assert r.stats.lines_read == 4 and r.stats.steps_accepted == 2 and r.stats.blank_lines == 1
    assert [q["line"] for q in r.quarantine] == [3]


def test_row_groups_split_large_outputs(tmp_path, monkeypatch):
    """More rows than one row group: every table is written in several groups, rows in order."""
    monkeypatch.setattr(ingest, "ROW_GROUP_ROWS", 7)
    evs = []
    for i in range(30):
        when = ts(9, 0, i, 0)
        evs += [mrd(when, "coder", "m"), usage(when, "m", i, 1), sage_step(when, f"t{i}", "coder", "m")]
    write(tmp_path / "logs" / "2026-11-20.log", [line(e) for e in evs])
    r = run(tmp_path / "logs", read_chunk_bytes=2000)
    assert r.stats.steps_accepted == 30 and r.stats.routing_decisions == 30 and r.stats.token_usage == 30
    assert r.rows["task_id"].tolist() == [f"t{i}" for i in range(30)]
    assert r.tu["prompt_tokens"].to_pylist() == list(range(30))
    for p in (r.res.trajectories, r.res.routing_decisions, r.res.token_usage):
        assert pq.ParquetFile(p).num_row_groups > 1
    assert r.mrd["timestamp_utc"].type == pa.timestamp("us", tz="UTC")


# ------------------------------------------------------------------ poisoned lines and damaged files
DEEP = b"[" * 10_000 + b"]" * 10_000


@pytest.mark.parametrize(
    ("bad", "reason", "cls"),
    [
        # an integer past 64 bits in an integer field: Arrow cannot store it
        (line(event(task="x")).replace(b'"primary_failure_count": 0', b'"primary_failure_count": ' + b"9" * 30),
         "an integer does not fit in 64 bits (Python int too large to convert to C long)", "integer_overflow"),
        (line(event(task="x")).replace(b'"step": 0', b'"step": -' + b"9" * 25),
         "an integer does not fit in 64 bits (Python int too large to convert to C long)", "integer_overflow"),
        # an escaped lone surrogate decodes to a str that is not Unicode
        (line(event(task="x")).replace(b'"coder"', b'"cod\\ud800er"'),
         "a string is not valid Unicode (a lone UTF-16 surrogate such as \\ud800): it cannot be stored as UTF-8",
         "lone_surrogate"),
        (line(event(task="x", model="m\\udfffx")).replace(b"m\\\\udfffx", b"m\\udfffx"),
         "a string is not valid Unicode (a lone UTF-16 surrogate such as \\udfff): it cannot be stored as UTF-8",
         "lone_surrogate"),
        # 10,000 levels of nesting: past the decoders' recursion limits
        (line(event(task="x"))[:-1] + b', "deep": ' + DEEP + b"}",
         "JSON nested too deeply to decode (thousands of levels): not a SAGE event", "too_deep"),
        (line(event(task="x")).replace(b'"state": {', b'"state": {"junk": ' + DEEP + b", "),
         "JSON nested too deeply to decode (thousands of levels): not a SAGE event", "too_deep"),
        (DEEP, "JSON nested too deeply to decode (thousands of levels): not a SAGE event", "too_deep"),
        # an integer literal past Python's digit limit
        (line(event(task="x")).replace(b'"reward": 1.05', b'"reward": ' + b"1" * 5000),
         "invalid JSON number: ", "invalid_json"),
    ],
    ids=["int_over_64_bits", "negative_step_over_64_bits", "lone_high_surrogate", "lone_low_surrogate_in_model",
         "nested_extra_key", "nested_state_key", "nested_array", "int_past_digit_limit"],
)
def test_one_poisoned_line_is_quarantined_not_fatal(tmp_path, bad, reason, cls):
    r, _ = one_bad(tmp_path, bad)
    q = r.quarantine[0]
    assert q["reason"].startswith(reason) and dict(r.stats.quarantine_reasons) == {cls: 1}


def test_a_valid_surrogate_pair_is_kept(tmp_path):
    # json.dumps writes characters outside the BMP as a surrogate pair: valid Unicode
    r = one_good(tmp_path, event(task="emoji \U0001F600"))
    assert line(event(task="emoji \U0001F600")).count(b"\\ud83d\\ude00") == 1
    assert r.rows["task_id"].tolist() == ["emoji \U0001F600"]


def test_poisoned_side_events_are_unusable_not_fatal(tmp_path):
    good_mrd = {"type": "MODEL_ROUTING_DECISION", "timestamp": "2026-11-01T00:00:00Z", "agent_role": "coder",
                "primary_model": "a", "fallback_model": "b", "selected_model": "a", "policy_source": "yaml",
                "task_complexity_score": 0.5, "primary_failure_count": 0}
    bad_mrd = line(good_mrd).replace(b'"primary_failure_count": 0', b'"primary_failure_count": ' + b"9" * 30)
    bad_tu = line({"type": "TOKEN_USAGE", "timestamp": "2026-11-01T00:00:00Z", "model": "x\\ud800",
                   "prompt_tokens": 1, "completion_tokens": 2}).replace(b"x\\\\ud800", b"x\\ud800")
    write(tmp_path / "logs" / "a.log", [GOOD_BEFORE, bad_mrd, line(good_mrd), bad_tu, GOOD_AFTER])
    r = run(tmp_path / "logs")
    assert r.stats.steps_accepted == 2 and r.stats.quarantined == 0 and r.mrd.num_rows == 1
    assert dict(r.stats.unusable_side_events) == {"MODEL_ROUTING_DECISION": 1, "TOKEN_USAGE": 1}
    reasons = sorted(x["reason"] for x in r.stats.unusable_side_examples)
    assert reasons[0].startswith("a string is not valid Unicode") and reasons[1].startswith("an integer does not")


def _steps(n: int, start: int = 0) -> list[bytes]:
    return [line(event(task=f"t{i}")) for i in range(start, start + n)]


def _gz_run(tmp_path, data: bytes, **cfg) -> tuple[Run, Path]:
    path = tmp_path / "logs" / "2026-11-20.log.gz"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    write(tmp_path / "logs" / "2026-11-21.log", [line(event(task="other-file"))])
    return run(tmp_path / "logs", **cfg), path


def test_truncated_gzip_keeps_its_readable_prefix_and_names_the_file(tmp_path):
    raw = b"\n".join(_steps(3000)) + b"\n"
    gz = gzip.compress(raw)
    r, path = _gz_run(tmp_path, gz[: len(gz) * 2 // 3], read_chunk_bytes=4096)
    (damaged,) = r.stats.damaged_files
    kept = r.stats.steps_accepted - 1  # the other file's step
    assert 1000 < kept < 3000 and damaged["file"] == str(path) and damaged["line"] == kept + 1
    assert r.rows[r.rows["source_file"] == str(path)]["task_id"].tolist() == [f"t{i}" for i in range(kept)]
    (q,) = r.quarantine
    assert q["file"] == str(path) and q["line"] == kept + 1 and "truncated" in q["reason"]
    assert q["reason"].startswith(f"the file is unreadable from this line on ({kept} lines before it were read")
    assert dict(r.stats.quarantine_reasons) == {"unreadable_file": 1}
    assert r.stats.to_dict()["damaged_files"] == [damaged] and r.stats.skipped_fraction == 0.5


def test_gzip_with_trailing_garbage_keeps_every_member_before_it(tmp_path):
    gz = gzip.compress(b"\n".join(_steps(50)) + b"\n") + gzip.compress(b"\n".join(_steps(50, 50)) + b"\n")
    r, _ = _gz_run(tmp_path, gz + b"\x00" * 8 + b"garbage")
    assert r.stats.steps_accepted == 101
    assert r.stats.damaged_files[0]["line"] == 101 and "trailing data" in r.stats.damaged_files[0]["reason"]
    r, _ = _gz_run(tmp_path / "padded", gz + b"\x00" * 100)  # zero padding is not damage
    assert r.stats.steps_accepted == 101 and r.stats.damaged_files == [] and r.stats.quarantined == 0


def test_corrupt_gzip_keeps_what_precedes_the_damage(tmp_path):
    raw = b"\n".join(_steps(4000)) + b"\n"
    gz = bytearray(gzip.compress(raw))
    mid = len(gz) // 2
    gz[mid:mid + 32] = bytes(b ^ 0xFF for b in gz[mid:mid + 32])
    r, path = _gz_run(tmp_path, bytes(gz))
    (damaged,) = r.stats.damaged_files
    good = r.rows[r.rows["source_file"] == str(path)]["task_id"].tolist()
    assert len(good) > 1500 and good == [f"t{i}" for i in range(len(good))]  # the prefix, in order
    assert damaged["file"] == str(path) and ("corrupt compressed data" in damaged["reason"]
                                            or "truncated" in damaged["reason"])


def _decodable_lines(data: bytes) -> int:
    """Complete lines a byte-by-byte decompressor gets out of ``data`` before zlib reports an error."""
    d, out = zlib.decompressobj(wbits=31), []
    for i in range(len(data)):
        try:
            out.append(d.decompress(data[i:i + 1]))
        except zlib.error:
            break
    return b"".join(out).count(b"\n")


def test_a_gzip_whose_checksum_is_wrong_keeps_every_line_it_decoded(tmp_path):
    """zlib finds a wrong CRC only after the last byte of data: every line was decoded before it
    (found by benchmarks/fault_injection.py: the last KiB of compressed input was dropped)."""
    raw = b"\n".join(_steps(3000)) + b"\n"
    gz = bytearray(gzip.compress(raw))
    gz[-8] ^= 0xFF  # the CRC32 of the trailer
    r, path = _gz_run(tmp_path, bytes(gz))
    (damaged,) = r.stats.damaged_files
    assert "incorrect data check" in damaged["reason"] and damaged["line"] == 3001
    assert r.stats.steps_accepted == 3000 + 1  # every step, and the other file's
    assert r.stats.lines_read == 3000 + 1 + 1  # and one quarantined record for the damage


@pytest.mark.parametrize("seed", range(8))
def test_corrupt_gzip_keeps_each_line_decoded_before_the_damage(tmp_path, seed):
    """Damage anywhere: the ingest reads exactly the complete lines an exact (byte-by-byte) reader
    decodes before zlib reports the error, and the steps among them that are unchanged are kept."""
    rng = random.Random(seed)
    raw = b"\n".join(_steps(2000)) + b"\n"
    gz = bytearray(gzip.compress(raw, mtime=0))
    at = rng.randint(20, len(gz) - 9)
    for j in range(at, min(len(gz) - 8, at + rng.randint(1, 16))):
        gz[j] ^= rng.randint(1, 255)
    want = _decodable_lines(bytes(gz))
    r, path = _gz_run(tmp_path, bytes(gz))
    (damaged,) = r.stats.damaged_files
    assert damaged["file"] == str(path) and damaged["line"] == want + 1
    assert r.stats.lines_read == want + 1 + 1


def test_a_file_named_gz_that_is_not_gzip_is_one_quarantined_record(tmp_path):
    r, path = _gz_run(tmp_path, b"\n".join(_steps(3)) + b"\n")
    assert r.stats.steps_accepted == 1
    (q,) = r.quarantine
    assert q["file"] == str(path) and q["line"] == 1
    assert "not a gzip file (it starts with b'{\"type\":')" in q["reason"] and "rename it without .gz" in q["reason"]


def test_symlinked_folders_are_followed_once_and_loops_end(tmp_path):
    logs, elsewhere = tmp_path / "logs", tmp_path / "elsewhere"
    write(logs / "2026-11-20.log", [line(event(task="a"))])
    write(elsewhere / "deep" / "2026-11-21.log", [line(event(task="b"))])
    (logs / "linked").symlink_to(elsewhere, target_is_directory=True)
    (logs / "loop").symlink_to(logs, target_is_directory=True)  # a cycle
    (elsewhere / "back").symlink_to(logs, target_is_directory=True)  # and another
    r = run(logs)
    assert sorted(r.rows["task_id"]) == ["a", "b"] and r.stats.quarantined == 0
    assert len(r.stats.files) == 2 and r.stats.skipped_paths == []


def test_unlistable_folders_and_broken_links_are_reported(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    write(logs / "2026-11-20.log", [GOOD_BEFORE])
    write(logs / "locked" / "2026-11-21.log", [GOOD_AFTER])
    (logs / "2026-11-22.log").symlink_to(tmp_path / "gone.log")  # a broken link named like a journal
    real_scandir = ingest.os.scandir

    def scandir(path):  # root reads every folder, so the refusal is simulated
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(ingest.os, "scandir", scandir)
    r = run(logs)
    assert r.stats.steps_accepted == 1
    assert r.stats.skipped_paths == [  # sorted by path
        {"path": str(logs / "2026-11-22.log"), "reason": "a broken link or a file removed while listing"},
        {"path": str(logs / "locked"), "reason": "cannot list the folder: Permission denied"},
    ]
    assert r.stats.skipped_fraction == pytest.approx(2 / 3)


def test_a_file_removed_after_listing_is_recorded_and_the_rest_read(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    write(logs / "2026-11-20.log", [GOOD_BEFORE])
    gone = write(logs / "2026-11-21.log", [GOOD_AFTER])
    listed = ingest.discover_logs(IngestConfig((logs,)))
    gone.unlink()
    monkeypatch.setattr(ingest, "discover_logs", lambda config, setting="log_dirs": listed)
    r = run(logs)
    assert r.stats.steps_accepted == 1
    (damaged,) = r.stats.damaged_files
    assert damaged["file"] == str(gone) and damaged["reason"].startswith("the file cannot be opened: FileNotFoundError")


def test_a_folder_removed_while_listing_is_reported_not_fatal(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    write(logs / "2026-11-20.log", [GOOD_BEFORE])
    write(logs / "gone" / "2026-11-21.log", [GOOD_AFTER])
    real_stat = ingest.os.stat

    def stat(path, *args, **kwargs):  # os.walk listed "gone", then it vanished
        if Path(path).name == "gone":
            raise FileNotFoundError(2, "No such file or directory", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(ingest.os, "stat", stat)
    files, skipped = ingest.discover_logs(IngestConfig((logs,)))
    assert files == [logs / "2026-11-20.log"]
    assert skipped == [{"path": str(logs / "gone"), "reason": "removed while listing: No such file or directory"}]


# ------------------------------------------------------------------ issue 35: BOM, dangling links
@pytest.mark.parametrize("suffix", [".log", ".jsonl.gz"])
@pytest.mark.parametrize("chunk_bytes", [1, 2, 4096])
def test_a_utf8_bom_at_the_start_of_a_journal_is_read_not_quarantined(tmp_path, suffix, chunk_bytes):
    data = b"\xef\xbb\xbf" + GOOD_BEFORE + b"\n" + GOOD_AFTER + b"\n"
    path = tmp_path / "logs" / f"2026-11-20{suffix}"
    path.parent.mkdir(parents=True)
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    r = run(tmp_path / "logs", read_chunk_bytes=chunk_bytes)
    assert r.stats.quarantined == 0, r.quarantine
    assert r.rows["task_id"].tolist() == ["before", "after"]
    assert r.rows["source_line"].tolist() == [1, 2]


def test_a_bom_elsewhere_than_the_start_of_the_file_is_still_quarantined(tmp_path):
    r, _ = one_bad(tmp_path, b"\xef\xbb\xbf" + GOOD_AFTER)
    assert r.quarantine[0]["line"] == 2


def test_a_file_that_is_only_a_bom_or_shorter_reads_as_empty(tmp_path):
    write(tmp_path / "logs" / "a.log", [GOOD_BEFORE])
    (tmp_path / "logs" / "b.log").write_bytes(b"\xef\xbb\xbf")
    (tmp_path / "logs" / "c.log").write_bytes(b"\xef\xbb")  # not a BOM: a damaged line
    r = run(tmp_path / "logs")
    assert r.stats.steps_accepted == 1
    assert [q["file"] for q in r.quarantine] == [str(tmp_path / "logs" / "c.log")]


def test_a_dangling_link_without_a_journal_suffix_is_listed_in_skipped_paths(tmp_path):
    logs = tmp_path / "logs"
    write(logs / "2026-11-20.log", [GOOD_BEFORE])
    (logs / "latest").symlink_to(tmp_path / "2026-11-21.log")  # dangling, no journal suffix
    (logs / "notes.txt").write_text("not a journal")  # a plain non-journal file: not listed
    (logs / "ok-link").symlink_to(logs / "notes.txt")  # a working link to a non-journal: not listed
    r = run(logs)
    assert r.stats.steps_accepted == 1
    assert r.stats.skipped_paths == [{
        "path": str(logs / "latest"),
        "reason": f"a broken link (to {tmp_path / '2026-11-21.log'}) whose name matches no journal pattern "
                  "(*.log, *.log.gz, *.jsonl, *.jsonl.gz): if it should point at a journal, fix the link; "
                  "otherwise remove it"}]
