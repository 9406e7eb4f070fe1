"""Streaming ingest: every bad input line is quarantined with its file, line and reason,
the good lines around it are kept, and lines_read == accepted_lines + quarantined_lines."""

from __future__ import annotations

import gzip
import json
import tracemalloc
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from sage_pipeline.routing import ingest
from sage_pipeline.routing.catalogue import DEFAULT_CATALOGUE
from sage_pipeline.routing.collector import CollectorConfig, collect
from sage_pipeline.routing.ingest import IngestConfig, LogFolderMissing, iter_blocks
from sage_pipeline.routing.schema import ROLES, TRAJECTORY_COLUMNS
from sage_pipeline.routing.simulator import RoutingSimulator
from sage_pipeline.routing.table import RoutingTable

CAT = str(DEFAULT_CATALOGUE)


def event(session="s1", task="t1", step=0, role="coder", model="gpt-4.1-mini", **over) -> dict:
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
        # the invariant every run keeps
        assert self.stats.lines_read == self.stats.accepted_lines + self.stats.quarantined
        assert self.stats.quarantined == len(self.quarantine)
        assert self.stats.steps_accepted == len(self.rows)
        assert sum(self.stats.quarantine_reasons.values()) == self.stats.quarantined
        d = self.stats.to_dict()
        assert d["lines_read"] == d["accepted_lines"] + d["quarantined_lines"]


def run(catalogue, log_dir: Path, out_dir: Path | None = None, **cfg) -> Run:
    out_dir = out_dir or log_dir.parent / (log_dir.name + "_out")
    return Run(ingest.ingest(IngestConfig((log_dir,), **cfg), catalogue, out_dir, progress=lambda m: None))


def write(path: Path, lines: list[bytes], end: bytes = b"\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\n".join(lines) + end)
    return path


def one_bad(tmp_path, catalogue, bad: bytes, **cfg) -> tuple[Run, Path]:
    """good, bad, good in one file: the bad line is quarantined as line 2, both good lines kept."""
    path = write(tmp_path / "logs" / "session.jsonl", [GOOD_BEFORE, bad, GOOD_AFTER])
    r = run(catalogue, tmp_path / "logs", **cfg)
    assert r.stats.lines_read == 3
    assert r.stats.steps_accepted == 2 and r.stats.quarantined == 1
    assert r.rows["task_id"].tolist() == ["before", "after"]
    assert r.rows["source_line"].tolist() == [1, 3]
    assert r.rows["source_file"].tolist() == [str(path)] * 2
    q = r.quarantine[0]
    assert q["file"] == str(path) and q["line"] == 2
    return r, path


def assert_one_bad(tmp_path, catalogue, bad: bytes, reason: str, cls: str, **cfg) -> dict:
    r, _ = one_bad(tmp_path, catalogue, bad, **cfg)
    q = r.quarantine[0]
    assert q["reason"] == reason
    assert dict(r.stats.quarantine_reasons) == {cls: 1}
    return q


# ------------------------------------------------------------------ happy path
def test_good_lines_become_rows(tmp_path, catalogue):
    path = write(
        tmp_path / "logs" / "a.jsonl",
        [
            line({"type": "SESSION_START", "timestamp": "t", "session_id": "s1"}),
            line(event(step=0, terminal=False, extra={"synthetic": True})),
            line(event(step=1, propensity=1.0)),
        ],
    )
    r = run(catalogue, tmp_path / "logs")
    assert r.stats.files == [str(path)]
    assert r.stats.bytes_read == path.stat().st_size
    assert r.stats.lines_read == 3 and r.stats.steps_accepted == 2 and r.stats.quarantined == 0
    assert dict(r.stats.other_events) == {"SESSION_START": 1}
    assert dict(r.stats.rows_by_source) == {"synthetic": 1, "real": 1}
    assert tuple(r.rows.columns) == TRAJECTORY_COLUMNS
    row = pq.read_table(r.res.trajectories).to_pylist()[0]
    assert row == {
        "timestamp": "2026-11-01T00:00:00.000Z",
        "session_id": "s1",
        "task_id": "t1",
        "role": "coder",
        "step": 0,
        "model": "gpt-4.1-mini",
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
        "data_source": "synthetic",
        "source_file": str(path),
        "source_line": 2,
    }
    assert r.rows["propensity"].tolist() == [0.5, 1.0]  # propensity exactly 1 is valid
    assert r.res.trajectories == tmp_path / "logs_out" / "trajectories.parquet"
    assert r.res.quarantine.read_bytes() == b""


def test_missing_propensity_is_accepted(tmp_path, catalogue):
    ev = event()
    del ev["propensity"]
    r = run(
        catalogue,
        write(tmp_path / "logs" / "a.jsonl", [line(ev), line(event(task="t2", propensity=None))]).parent,
    )
    assert r.stats.steps_accepted == 2 and r.stats.quarantined == 0
    assert r.rows["propensity"].isna().all()


def test_optional_state_fields_may_be_missing(tmp_path, catalogue):
    ev = event()
    ev["state"] = {"task_complexity_score": 0.3, "primary_failure_count": 1}
    del ev["extra"], ev["propensity"]
    r = run(catalogue, write(tmp_path / "logs" / "a.jsonl", [line(ev)]).parent)
    assert r.stats.steps_accepted == 1
    row = r.rows.iloc[0]
    assert pd.isna(row["failure_count"]) and pd.isna(row["cost_usd"]) and pd.isna(row["prompt_tokens"])
    assert (
        pd.isna(row["propensity"]) and pd.isna(row["verification_passed"]) and pd.isna(row["reviewer_score"])
    )
    assert row["data_source"] == "real"  # no extra.synthetic: real


def test_collector_logs_ingest_without_quarantine(tmp_path, catalogue):
    sim = RoutingSimulator(catalogue, RoutingTable.load(catalogue=catalogue))
    res = collect(
        sim,
        tmp_path / "logs",
        CollectorConfig(episodes=150, seed=2, sessions_per_file=10),
        progress=lambda m: None,
    )
    r = run(catalogue, tmp_path / "logs")
    assert r.stats.lines_read == res.events and r.stats.quarantined == 0
    assert r.stats.steps_accepted == res.decisions
    assert dict(r.stats.other_events) == {
        "SESSION_START": res.sessions,
        "SESSION_END": res.sessions,
        "AGENT_MESSAGE": res.decisions,
    }
    assert dict(r.stats.rows_by_source) == {"synthetic": res.decisions, "real": 0}
    assert r.stats.files == [str(p) for p in res.files]  # simulator.json is not a log


# ------------------------------------------------------------------ the bad-input list
def test_truncated_json(tmp_path, catalogue):
    q = assert_one_bad(
        tmp_path,
        catalogue,
        GOOD_BEFORE[:60],
        "invalid JSON (truncated or malformed): Unterminated string starting at (column 42)",
        "invalid_json",
    )
    assert q["raw_head"] == GOOD_BEFORE[:60].decode()


def test_truncated_json_at_end_of_file_without_newline(tmp_path, catalogue):
    path = write(tmp_path / "logs" / "a.jsonl", [GOOD_BEFORE, GOOD_AFTER[:-1]], end=b"")
    r = run(catalogue, tmp_path / "logs")
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
def test_line_that_is_not_an_object(tmp_path, catalogue, raw, name):
    q = assert_one_bad(tmp_path, catalogue, raw, f"not a JSON object (got {name})", "not_an_object")
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
        (
            event(state={"task_complexity_score": 0.5, "primary_failure_count": True}),
            "wrong type: Expected `int | null`, got `bool` - at `$.state.primary_failure_count`",
        ),
    ],
)
def test_wrong_types(tmp_path, catalogue, obj, reason):
    assert_one_bad(tmp_path, catalogue, line(obj), reason, "wrong_type")


@pytest.mark.parametrize(
    ("raw", "shown"), [(b"NaN", "nan"), (b"Infinity", "inf"), (b"-Infinity", "-inf"), (b"1e999", "inf")]
)
def test_non_finite_reward(tmp_path, catalogue, raw, shown):
    bad = line(event(reward=0.123456)).replace(b"0.123456", raw)
    q = assert_one_bad(tmp_path, catalogue, bad, f"field reward = {shown} is not finite", "non_finite")
    assert q["raw_head"] == bad.decode()[:240]


def test_non_finite_propensity_and_complexity(tmp_path, catalogue):
    bad = line(event(propensity=0.123456)).replace(b"0.123456", b"NaN")
    assert_one_bad(tmp_path, catalogue, bad, "field propensity = nan is not finite", "non_finite")


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
def test_out_of_range_values(tmp_path, catalogue, obj, reason, cls):
    assert_one_bad(tmp_path, catalogue, line(obj), reason, cls)


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
        ("session_id", "missing field session_id", "missing_field"),
        ("task_id", "missing field task_id", "missing_field"),
        ("agent", "missing field agent", "missing_field"),
        ("step", "missing field step", "missing_field"),
        ("timestamp", "missing field timestamp", "missing_field"),
        ("action", "missing field action.model_chosen", "missing_field"),
        ("action.model_chosen", "missing field action.model_chosen", "missing_field"),
        ("state", "missing field state.task_complexity_score", "missing_field"),
        ("state.primary_failure_count", "missing field state.primary_failure_count", "missing_field"),
        ("type", "missing or non-string field 'type'", "no_type"),
    ],
)
def test_missing_fields(tmp_path, catalogue, path, reason, cls):
    assert_one_bad(tmp_path, catalogue, line(_without(path)), reason, cls)


def test_empty_ids(tmp_path, catalogue):
    assert_one_bad(tmp_path, catalogue, line(event(session="")), "empty field session_id", "missing_field")


def test_unknown_role(tmp_path, catalogue):
    assert_one_bad(
        tmp_path,
        catalogue,
        line(event(role="wizard")),
        f"unknown role 'wizard' in field agent (roles: {', '.join(ROLES)})",
        "unknown_role",
    )


def test_unknown_model(tmp_path, catalogue):
    assert_one_bad(
        tmp_path,
        catalogue,
        line(event(model="gpt-9")),
        f"unknown model 'gpt-9' in field action.model_chosen (not in {CAT})",
        "unknown_model",
    )


def test_model_not_a_candidate_for_the_role(tmp_path, catalogue):
    assert_one_bad(
        tmp_path,
        catalogue,
        line(event(role="planner", model="qwen2.5-coder-32b")),
        f"model 'qwen2.5-coder-32b' is not a candidate for role 'planner' (no capability for it in {CAT})",
        "model_not_candidate",
    )


@pytest.mark.parametrize(("value", "shown"), [(0, "0"), (0.0, "0"), (1.5, "1.5"), (-0.2, "-0.2")])
def test_propensity_out_of_range(tmp_path, catalogue, value, shown):
    assert_one_bad(
        tmp_path,
        catalogue,
        line(event(propensity=value)),
        f"field propensity = {shown} outside (0, 1]",
        "out_of_range",
    )


def test_first_reason_wins(tmp_path, catalogue):
    # missing reward and an unknown role: the missing field is reported
    ev = _without("reward")
    ev["agent"] = "wizard"
    assert_one_bad(tmp_path, catalogue, line(ev), "missing field reward", "missing_field")


def test_duplicate_event_in_one_file(tmp_path, catalogue):
    dup = line(event(task="before", reward=0.0))  # same (session, task, step) as line 1
    q = assert_one_bad(
        tmp_path,
        catalogue,
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
    }


def test_duplicate_event_across_two_files(tmp_path, catalogue):
    a = write(tmp_path / "logs" / "a.jsonl", [line(event(task="t1")), line(event(task="t2"))])
    b = write(
        tmp_path / "logs" / "sub" / "b.jsonl",
        [line(event(task="t3")), line(event(task="t2")), line(event(task="t4"))],
    )
    r = run(catalogue, tmp_path / "logs")
    assert r.stats.files == [str(a), str(b)]
    assert r.stats.lines_read == 5 and r.stats.steps_accepted == 4
    assert r.rows["task_id"].tolist() == ["t1", "t2", "t3", "t4"]
    assert r.rows["source_file"].tolist() == [str(a), str(a), str(b), str(b)]
    assert r.rows["source_line"].tolist() == [1, 2, 1, 3]
    assert [(q["file"], q["line"], q["reason"]) for q in r.quarantine] == [
        (str(b), 2, "duplicate TRAJECTORY_STEP: session_id='s1' task_id='t2' step=0 was already ingested")
    ]


def test_same_task_in_other_session_or_step_is_not_a_duplicate(tmp_path, catalogue):
    write(
        tmp_path / "logs" / "a.jsonl",
        [line(event()), line(event(session="s2")), line(event(step=1)), line(event(task="t1\x1f0"))],
    )
    r = run(catalogue, tmp_path / "logs")
    assert r.stats.steps_accepted == 4 and r.stats.quarantined == 0


def test_non_utf8_bytes(tmp_path, catalogue):
    bad = line(event(task="XX")).replace(b"XX", b"X\xff")
    offset = bad.index(b"\xff")
    q = assert_one_bad(tmp_path, catalogue, bad, f"not valid UTF-8: byte 0xff at offset {offset}", "non_utf8")
    assert "\ufffd" in q["raw_head"]


def test_non_utf8_in_other_event_is_quarantined_too(tmp_path, catalogue):
    bad = b'{"type": "AGENT_MESSAGE", "session_id": "s1", "content": "caf\xe9"}'
    assert_one_bad(
        tmp_path,
        catalogue,
        bad,
        f"not valid UTF-8: byte 0xe9 at offset {bad.index(bytes([0xE9]))}",
        "non_utf8",
    )


def _huge_line(nbytes: int) -> bytes:
    head = b'{"type": "AGENT_MESSAGE", "session_id": "s1", "content": "'
    return head + b"x" * (nbytes - len(head) - 2) + b'"}'


def test_ten_megabyte_line_is_skipped_in_bounded_memory(tmp_path, catalogue):
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
        r = run(catalogue, tmp_path / "logs", **cfg)
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


def test_over_long_line_within_one_chunk(tmp_path, catalogue):
    # default 2 MiB chunks hold the whole 1.5 MB line; it is refused all the same
    assert_one_bad(
        tmp_path,
        catalogue,
        _huge_line(1_500_000),
        "line is 1500000 bytes, over max_line_bytes=1048576 (raise the max_line_bytes setting if it is real)",
        "line_too_long",
    )


def test_over_long_last_line_without_newline(tmp_path, catalogue):
    path = write(tmp_path / "logs" / "a.jsonl", [GOOD_BEFORE, _huge_line(5000)], end=b"")
    r = run(catalogue, tmp_path / "logs", max_line_bytes=1024, read_chunk_bytes=512)
    assert r.stats.lines_read == 2 and r.stats.steps_accepted == 1
    assert [(q["file"], q["line"], q["reason"]) for q in r.quarantine] == [
        (
            str(path),
            2,
            "line is 5000 bytes, over max_line_bytes=1024 (raise the max_line_bytes setting if it is real)",
        )
    ]


def test_line_of_exactly_max_line_bytes_is_kept(tmp_path, catalogue):
    ev = event(task="")
    ev["task_id"] = "t" * (1024 - len(line(ev)))
    exact = line(ev)
    assert len(exact) == 1024
    over = line(event(task="y" * 1100))
    write(tmp_path / "logs" / "a.jsonl", [exact, over])
    r = run(catalogue, tmp_path / "logs", max_line_bytes=1024, read_chunk_bytes=100)
    assert r.stats.steps_accepted == 1 and r.stats.quarantined == 1
    assert r.rows["task_id"].tolist() == [ev["task_id"]]
    assert r.quarantine[0]["line"] == 2
    assert r.quarantine[0]["reason"].startswith(f"line is {len(over)} bytes, over max_line_bytes=1024")


def test_empty_file_is_listed_not_an_error(tmp_path, catalogue):
    empty = tmp_path / "logs" / "empty.jsonl"
    good = write(tmp_path / "logs" / "good.jsonl", [GOOD_BEFORE])
    empty.write_bytes(b"")
    r = run(catalogue, tmp_path / "logs")
    assert r.stats.empty_files == [str(empty)]
    assert r.stats.files == [str(empty), str(good)]
    assert r.stats.lines_read == 1 and r.stats.steps_accepted == 1 and r.stats.quarantined == 0
    assert r.stats.to_dict()["empty_files"] == [str(empty)]


def test_only_empty_files(tmp_path, catalogue):
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.jsonl").write_bytes(b"")
    r = run(catalogue, tmp_path / "logs")
    assert r.stats.lines_read == 0 and len(r.rows) == 0
    assert tuple(r.rows.columns) == TRAJECTORY_COLUMNS


def test_missing_log_folder_names_path_and_setting(tmp_path, catalogue):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(LogFolderMissing) as err:
        ingest.ingest(IngestConfig((missing,), setting="sage.log_dirs"), catalogue, tmp_path / "out")
    assert str(err.value) == (
        f"log folder {missing} does not exist (it is listed in the 'sage.log_dirs' setting). "
        "Create it, point 'sage.log_dirs' at the folder that holds your SAGE session logs, "
        "or materialize synthetic_sessions first."
    )
    assert isinstance(err.value, FileNotFoundError)
    assert not (tmp_path / "out" / "trajectories.parquet").exists()


def test_blank_lines_are_accepted(tmp_path, catalogue):
    path = tmp_path / "logs" / "a.jsonl"
    path.parent.mkdir()
    path.write_bytes(b"\n" + GOOD_BEFORE + b"\n   \n\t\r\n" + GOOD_AFTER + b"\r\n\n")
    r = run(catalogue, tmp_path / "logs")
    assert r.stats.lines_read == 6 and r.stats.blank_lines == 4 and r.stats.steps_accepted == 2
    assert r.stats.quarantined == 0
    assert r.rows["source_line"].tolist() == [2, 5]


def test_other_event_types_are_counted_per_type(tmp_path, catalogue):
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
        ],
    )
    r = run(catalogue, tmp_path / "logs")
    assert dict(r.stats.other_events) == {
        "SESSION_START": 1,
        "AGENT_MESSAGE": 2,
        "TOOL_CALL": 1,
        "SESSION_END": 1,
    }
    assert r.stats.lines_read == 6 and r.stats.steps_accepted == 1 and r.stats.quarantined == 0
    assert r.stats.to_dict()["other_events"] == {
        "SESSION_START": 1,
        "AGENT_MESSAGE": 2,
        "TOOL_CALL": 1,
        "SESSION_END": 1,
    }


def test_non_string_type_is_quarantined(tmp_path, catalogue):
    assert_one_bad(tmp_path, catalogue, line({"type": 3}), "missing or non-string field 'type'", "no_type")


def test_gzip_input(tmp_path, catalogue):
    path = tmp_path / "logs" / "a.jsonl.gz"
    path.parent.mkdir()
    with gzip.open(path, "wb") as fh:
        fh.write(GOOD_BEFORE + b"\n{broken\n" + GOOD_AFTER + b"\n")
    (tmp_path / "logs" / "notes.json").write_text("[]")  # not a log
    r = run(catalogue, tmp_path / "logs")
    assert r.stats.files == [str(path)]
    assert r.stats.lines_read == 3 and r.stats.steps_accepted == 2
    assert r.rows["source_file"].tolist() == [str(path)] * 2
    assert [(q["file"], q["line"]) for q in r.quarantine] == [(str(path), 2)]
    assert r.quarantine[0]["reason"].startswith("invalid JSON (truncated or malformed): ")


def _all_bad_inputs() -> list[bytes]:
    return [
        GOOD_BEFORE[:60],
        b"[1]",
        line(event(task="w", step="0")),
        line(event(task="n", reward=0.123)).replace(b"0.123", b"NaN"),
        line(_without("reward")),
        line(event(task="r", role="wizard")),
        line(event(task="m", model="gpt-9")),
        line(event(task="c", role="planner", model="qwen2.5-coder-32b")),
        line(event(task="p", propensity=0)),
        line(event(task="d")),
        line(event(task="d")),
        line(event(task="u")).replace(b'"u"', b'"\xff"'),
        b"",
        b"   ",
        line({"type": "AGENT_MESSAGE"}),
        _huge_line(3000),
    ]


def test_output_does_not_depend_on_read_chunk_bytes(tmp_path, catalogue):
    sim = RoutingSimulator(catalogue, RoutingTable.load(catalogue=catalogue))
    res = collect(
        sim,
        tmp_path / "logs",
        CollectorConfig(episodes=60, seed=4, sessions_per_file=6),
        progress=lambda m: None,
    )
    write(tmp_path / "logs" / "zz_bad.jsonl", _all_bad_inputs(), end=b"")
    with gzip.open(tmp_path / "logs" / "zz_bad2.jsonl.gz", "wb") as fh:
        fh.write(b"\n".join(_all_bad_inputs()))
    runs = {}
    for chunk in (64, 1000, 1 << 21):
        runs[chunk] = run(
            catalogue,
            tmp_path / "logs",
            tmp_path / f"out{chunk}",
            read_chunk_bytes=chunk,
            max_line_bytes=2048,
        )
    base = runs[1 << 21]
    # 12 bad lines per file; the gz file's first "d" duplicates the plain file's as well
    assert base.stats.quarantined == 12 + 13 and base.stats.steps_accepted == res.decisions + 1
    for chunk, r in runs.items():
        assert r.rows.drop(columns="source_file").equals(base.rows.drop(columns="source_file")), chunk
        assert r.rows["source_file"].tolist() == base.rows["source_file"].tolist()
        assert r.res.quarantine.read_bytes() == base.res.quarantine.read_bytes(), chunk
        d, b = r.stats.to_dict(), base.stats.to_dict()
        d.pop("seconds"), b.pop("seconds")
        assert d == b, chunk


def test_every_bad_input_gets_its_reason_class(tmp_path, catalogue):
    write(tmp_path / "logs" / "bad.jsonl", _all_bad_inputs())
    r = run(catalogue, tmp_path / "logs", max_line_bytes=2048)
    assert (
        r.stats.lines_read == 16
        and r.stats.blank_lines == 2
        and dict(r.stats.other_events) == {"AGENT_MESSAGE": 1}
    )
    assert r.rows["task_id"].tolist() == ["d"]
    assert dict(r.stats.quarantine_reasons) == {
        "invalid_json": 1,
        "not_an_object": 1,
        "wrong_type": 1,
        "non_finite": 1,
        "missing_field": 1,
        "unknown_role": 1,
        "unknown_model": 1,
        "model_not_candidate": 1,
        "out_of_range": 1,
        "duplicate": 1,
        "non_utf8": 1,
        "line_too_long": 1,
    }
    assert [q["line"] for q in r.quarantine] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 12, 16]
    assert r.stats.quarantined_fraction == pytest.approx(12 / 16)


def test_ingest_config_validation():
    with pytest.raises(ValueError, match=r"^max_line_bytes must be >= 1024, got 10$"):
        IngestConfig((Path("."),), max_line_bytes=10)
    # 0 would silently read nothing from a non-empty file, a negative size whole files at once
    for bad in (0, -1):
        with pytest.raises(ValueError, match=rf"^read_chunk_bytes must be >= 1, got {bad}$"):
            IngestConfig((Path("."),), read_chunk_bytes=bad)


def test_one_byte_chunks(tmp_path, catalogue):
    write(tmp_path / "logs" / "a.jsonl", [GOOD_BEFORE, b"", b"{oops", GOOD_AFTER])
    r = run(catalogue, tmp_path / "logs", read_chunk_bytes=1)
    assert r.stats.lines_read == 4 and r.stats.steps_accepted == 2 and r.stats.blank_lines == 1
    assert [q["line"] for q in r.quarantine] == [3]
