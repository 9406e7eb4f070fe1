"""Streaming ingest of SAGE's session journals into ``trajectories.parquet`` and three side tables.

What SAGE writes: ``memory/sessions/<YYYY-MM-DD>.log`` (rotated to ``<date>.<N>.log`` under
``SAGE_SESSION_LOG_MAX_MB``, memory/manager.py), one JSON object per line,
``{"type": ..., "timestamp": <ISO 8601>, ...payload}``, and the workflow's own plain-text lines
``[<ts>] CHECKPOINT completed=N pending=M`` and ``[TOKEN_SUMMARY] ...`` (orchestrator/workflow.py
save_memory: counted by kind in ``text_lines``, never quarantined; see :data:`SAGE_TEXT_LINES`).
``session_id`` and ``trace_id`` are there only when SAGE's environment sets ``SAGE_SESSION_ID`` /
``SAGE_TRACE_ID`` (``sage run`` sets a fresh session id per run); otherwise the session is the
journal's day, the file's stem without the rotation number (:func:`file_stem`). Every ``*.log``,
``*.log.gz``, ``*.jsonl`` and ``*.jsonl.gz`` file under the configured folders (recursively) is
read exactly once, in SAGE's writing order (:func:`journal_order`), in bounded memory (a few MB
of buffer plus one row group per output table):

Every kept row has ``timestamp_utc`` (the ``timestamp``, required, parsed as ISO 8601 with
or without an offset, naive meaning UTC, "Z" allowed, in years 1678-2261), its
``session_id`` (as logged, else the file's stem) and its ``source_file``/``source_line``.

* ``TRAJECTORY_STEP`` events that pass validation become rows of ``trajectories.parquet``
  (:data:`~sage_pipeline.routing.schema.TRAJECTORY_COLUMNS`). Required: ``timestamp``,
  ``task_id``, ``agent`` (the role), ``action.model_chosen``, ``reward`` (finite, in
  [-2, 2]) and ``terminal``; ids and role non-empty strings; the model a string, where SAGE's
  ``""`` (``task.model_used`` never set: the circuit breaker's step after a timed-out call) is
  kept as null and counted per role in ``steps_without_model``. Optional (null when
  absent): ``session_id`` (``session_id_source`` says ``logged`` or ``file_stem``),
  ``trace_id``, ``action.prompt_strategy_key``, ``extra.synthetic`` (``data_source``),
  every ``state`` key (``task_complexity_score`` in [0, 1], ``primary_failure_count`` >= 0,
  ``verification_passed``, ``failed_reason``, ...; keys the dataset does not read are
  skipped, whatever their type) and the two extensions SAGE itself never writes,
  ``step`` (>= 0) and ``propensity`` (in (0, 1]); ``verdict`` (the reviewer's PASS/FAIL,
  which SAGE spreads from the step's extra), ``state.debug_retry`` and ``state.debug_status``
  (the debugger's). Roles and models are any strings (Ollama
  tags, ``shell_router``, ...): no catalogue is consulted here.
* ``MODEL_ROUTING_DECISION`` events become rows of ``routing_decisions.parquet``
  (:data:`~sage_pipeline.routing.schema.ROUTING_DECISION_COLUMNS`; required ``agent_role``
  and ``selected_model``). The routing dataset joins them to the steps for the table's
  primary/fallback, the matched triggers, ``policy_source``, a learned router's
  ``propensity`` and the complexity or failure count a step's state lacks.
* ``TOKEN_USAGE`` events become rows of ``token_usage.parquet``
  (:data:`~sage_pipeline.routing.schema.TOKEN_USAGE_COLUMNS`; required ``model``). The
  routing dataset joins them for prompt/completion tokens and logged cost.
* ``AGENT_INSIGHT_EMITTED`` events become rows of ``agent_insights.parquet``
  (:data:`AGENT_INSIGHT_COLUMNS`; required ``agent`` and ``insight_type``, non-empty).
  SAGE's ``OrchestratorIntelligenceFeed.ingest`` (orchestrator/intelligence_feed.py) logs one for
  every insight an agent emits, with ``task_id``, ``agent``, ``insight_type``, ``severity`` and
  ``content_preview`` (the content's first 500 characters, SAGE's own bound; a longer one is cut
  to :data:`CONTENT_PREVIEW_CHARS` here); ``task_id`` is kept as logged (SAGE writes ``""`` for a
  task without an id and ``"planner"`` for the planner's). Each agent writes a ``decision`` insight
  naming its model just before its model call, which is how the task outcomes read SAGE's calls
  when it writes no ``TOKEN_USAGE`` (:mod:`sage_pipeline.routing.task_outcomes`).
* Every event type other than ``TRAJECTORY_STEP`` (the three above included) is counted per
  type in ``other_events`` and is never an error. A ``MODEL_ROUTING_DECISION``,
  ``TOKEN_USAGE`` or ``AGENT_INSIGHT_EMITTED`` line that cannot be used (wrong types, a required
  field missing or empty, a bad timestamp, out-of-range numbers) is a valid SAGE line all the
  same: it is counted in ``unusable_side_events``, the first few with file, line and reason in
  ``unusable_side_examples``, and left out of its side table, not quarantined.
* Anything else is damage (truncated JSON, not an object, no string ``type``, a
  non-JSON line other than SAGE's two text lines whole, a ``TRAJECTORY_STEP``
  with wrong types, missing or empty required fields, a timestamp that is not ISO 8601,
  non-finite or out-of-range numbers, duplicate steps, non-UTF-8 bytes, over-long lines)
  goes to ``quarantine.jsonl`` with its file, line number and reason.

A step is a duplicate when its key was accepted before: ``(session_id, task_id, step)``
when the step is logged, else ``(session_id, task_id, role, timestamp)`` (the timestamp
as a UTC instant).

``lines_read == accepted_lines + quarantined_lines`` holds for every run, where accepted
lines are the trajectory rows, the other events (side events included), SAGE's text lines
and blank lines. Only quarantined lines count toward the trajectories asset's blocking check.

The hot path decodes each line once with one typed msgspec decoder (types are checked in
C; unknown keys are skipped), validates values column-wise with numpy/pyarrow and parses
timestamps once per block with pandas; only lines the decoder refuses take the slow path
that works out a precise reason. Parquet row groups are written on a second thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import json
import logging
import os
import re
import stat
import time
import zlib
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Any, Union

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sage_pipeline import artifacts
from sage_pipeline.routing.schema import (
    MODEL_ROUTING_DECISION,
    REWARD_MAX,
    REWARD_MIN,
    ROUTING_DECISION_COLUMNS,
    TOKEN_USAGE,
    TOKEN_USAGE_COLUMNS,
    TRAJECTORY_COLUMNS,
    TRAJECTORY_STEP,
)
from sage_pipeline.untrusted import kind_of

log = logging.getLogger(__name__)

LOG_PATTERNS = ("*.log", "*.log.gz", "*.jsonl", "*.jsonl.gz")
RAW_HEAD = 240  # characters of a bad line kept in the quarantine record
# SAGE's agents' insights (orchestrator/intelligence_feed.py logs each as AGENT_INSIGHT_EMITTED),
# kept in agent_insights.parquet beside the steps
AGENT_INSIGHT_EMITTED = "AGENT_INSIGHT_EMITTED"
CONTENT_PREVIEW_CHARS = 500  # SAGE's own bound: intelligence_feed.py logs (insight.content or "")[:500]
# Columns of agent_insights.parquet (one row per usable AGENT_INSIGHT_EMITTED event).
AGENT_INSIGHT_COLUMNS: tuple[str, ...] = (
    "source_file",
    "source_line",
    "session_id",  # as logged, else the journal file's stem
    "trace_id",
    "timestamp",  # as logged
    "timestamp_utc",
    "task_id",  # as logged: "" for a task without an id, "planner" for the planner's (agents/planner.py)
    "agent",
    "insight_type",  # SAGE's AgentInsight: uncertainty, risk, decision or observation
    "severity",  # low, medium or high
    "content_preview",  # at most CONTENT_PREVIEW_CHARS characters
)
ROW_GROUP_ROWS = 1 << 16  # rows per Parquet row group (per output file; at most two held each)
MAX_UNUSABLE_EXAMPLES = 20  # unusable side events listed (file, line, reason) in the stats
TIMESTAMP_EXAMPLE = "2026-11-20T14:03:22.123456+00:00"
TIMESTAMP_YEARS = "1678-2261"  # inside pandas' nanosecond range
_TS_MIN_US = int(np.datetime64("1678-01-01", "us").astype(np.int64))  # microseconds since 1970, UTC
_TS_END_US = int(np.datetime64("2262-01-01", "us").astype(np.int64))


# ---------------------------------------------------------------- event schema
class Action(msgspec.Struct, gc=False, frozen=True):
    model_chosen: Union[str, None] = None
    prompt_strategy_key: Union[str, None] = None


class State(msgspec.Struct, gc=False, frozen=True):
    """The ``state`` keys the dataset reads; SAGE's state is free-form, other keys are skipped."""

    task_complexity_score: Union[float, None] = None
    primary_failure_count: Union[int, None] = None
    failure_count: Union[int, None] = None
    prompt_tokens: Union[int, None] = None
    verification_passed: Union[bool, None] = None
    failed_reason: Union[str, None] = None
    timed_out: Union[bool, None] = None
    reviewer_score: Union[float, None] = None
    latency_s: Union[float, None] = None
    cost_usd: Union[float, None] = None
    debug_retry: Union[int, None] = None  # the debugger's step (workflow.py debug_agent)
    debug_status: Union[str, None] = None


class Extra(msgspec.Struct, gc=False, frozen=True):
    synthetic: Union[bool, None] = None


class _Envelope(msgspec.Struct, gc=False):
    """What every SAGE event carries (session_id and trace_id only when SAGE's env sets them)."""

    type: str
    timestamp: Union[str, None] = None
    session_id: Union[str, None] = None
    trace_id: Union[str, None] = None


class Event(_Envelope, gc=False):
    """The fields of a SAGE event that the ingest reads, for the four event types it keeps;
    other keys (and every field of other types) are ignored."""

    # TRAJECTORY_STEP
    task_id: Union[str, None] = None
    agent: Union[str, None] = None  # also TOKEN_USAGE's (optional) agent
    step: Union[int, None] = None
    action: Action = Action()  # frozen shared defaults: no allocation for other event types
    propensity: Union[float, None] = None  # also MODEL_ROUTING_DECISION's (optional) propensity
    state: State = State()
    reward: Union[float, None] = None
    terminal: Union[bool, None] = None
    extra: Extra = Extra()
    verdict: Union[str, None] = None  # the reviewer's step: PASS or FAIL (record_trajectory_step spreads extra)
    # MODEL_ROUTING_DECISION
    agent_role: Union[str, None] = None
    task_complexity_score: Union[float, None] = None
    primary_failure_count: Union[int, None] = None
    primary_model: Union[str, None] = None
    fallback_model: Union[str, None] = None
    selected_model: Union[str, None] = None
    matched_fallback_triggers: Union[list[str], None] = None
    policy_source: Union[str, None] = None
    # TOKEN_USAGE
    model: Union[str, None] = None
    prompt_tokens: Union[int, None] = None
    completion_tokens: Union[int, None] = None
    cost_usd: Union[float, None] = None
    # AGENT_INSIGHT_EMITTED (its task_id and agent are the step's fields above)
    insight_type: Union[str, None] = None
    severity: Union[str, None] = None
    content_preview: Union[str, None] = None


# The slow path checks a line the union decoder refused against its own type's fields only,
# so a stray key of another type's name (a step's extra "model": 3) is no reason to refuse it.
class StepEvent(_Envelope, gc=False):
    task_id: Union[str, None] = None
    agent: Union[str, None] = None
    step: Union[int, None] = None
    action: Action = Action()
    propensity: Union[float, None] = None
    state: State = State()
    reward: Union[float, None] = None
    terminal: Union[bool, None] = None
    extra: Extra = Extra()
    verdict: Union[str, None] = None


class RoutingDecisionEvent(_Envelope, gc=False):
    agent_role: Union[str, None] = None
    task_complexity_score: Union[float, None] = None
    primary_failure_count: Union[int, None] = None
    primary_model: Union[str, None] = None
    fallback_model: Union[str, None] = None
    selected_model: Union[str, None] = None
    matched_fallback_triggers: Union[list[str], None] = None
    policy_source: Union[str, None] = None
    propensity: Union[float, None] = None


class TokenUsageEvent(_Envelope, gc=False):
    agent: Union[str, None] = None
    model: Union[str, None] = None
    prompt_tokens: Union[int, None] = None
    completion_tokens: Union[int, None] = None
    cost_usd: Union[float, None] = None


class AgentInsightEvent(_Envelope, gc=False):
    task_id: Union[str, None] = None
    agent: Union[str, None] = None
    insight_type: Union[str, None] = None
    severity: Union[str, None] = None
    content_preview: Union[str, None] = None


# SAGE's own plain-text journal lines: ``save_memory`` writes them with ``append_session_log``
# (orchestrator/workflow.py, around line 2504). Only a whole line in exactly one of these
# shapes is SAGE's text; any other line that is not JSON (a JSON object cut short starts with
# "{", and cannot match) is damage and is quarantined.
SAGE_TEXT_LINES = {
    "text_checkpoint": re.compile(r"\[\d{4}-\d{2}-\d{2}T[0-9:.+\-]+Z?\] CHECKPOINT completed=\d+ pending=\d+"),
    "text_token_summary": re.compile(
        r"\[TOKEN_SUMMARY\] total_tokens=[0-9.]+ prompt=[0-9.]+ completion=[0-9.]+ calls=[0-9.]+"),
}

_SLOW_TYPES = {TRAJECTORY_STEP: StepEvent, MODEL_ROUTING_DECISION: RoutingDecisionEvent,
               TOKEN_USAGE: TokenUsageEvent, AGENT_INSIGHT_EMITTED: AgentInsightEvent}

_Fields = dict[str, tuple[str, pa.DataType, bool]]  # column -> (attribute path, arrow type, required)

# the fields of each kept event type
_STEP_FIELDS: _Fields = {
    "timestamp": ("timestamp", pa.string(), True),
    "session_id": ("session_id", pa.string(), False),  # absent: the file's stem
    "trace_id": ("trace_id", pa.string(), False),
    "task_id": ("task_id", pa.string(), True),
    "role": ("agent", pa.string(), True),
    "step": ("step", pa.int64(), False),
    "model": ("action.model_chosen", pa.string(), True),
    "prompt_strategy_key": ("action.prompt_strategy_key", pa.string(), False),
    "propensity": ("propensity", pa.float64(), False),
    "task_complexity_score": ("state.task_complexity_score", pa.float64(), False),
    "primary_failure_count": ("state.primary_failure_count", pa.int64(), False),
    "failure_count": ("state.failure_count", pa.int64(), False),
    "prompt_tokens": ("state.prompt_tokens", pa.int64(), False),
    "verification_passed": ("state.verification_passed", pa.bool_(), False),
    "failed_reason": ("state.failed_reason", pa.string(), False),
    "timed_out": ("state.timed_out", pa.bool_(), False),
    "reviewer_score": ("state.reviewer_score", pa.float64(), False),
    "latency_s": ("state.latency_s", pa.float64(), False),
    "cost_usd": ("state.cost_usd", pa.float64(), False),
    "logged_reward": ("reward", pa.float64(), True),
    "terminal": ("terminal", pa.bool_(), True),
    "verdict": ("verdict", pa.string(), False),
    "debug_retry": ("state.debug_retry", pa.int64(), False),
    "debug_status": ("state.debug_status", pa.string(), False),
}
_MRD_FIELDS: _Fields = {
    "timestamp": ("timestamp", pa.string(), True),
    "session_id": ("session_id", pa.string(), False),
    "trace_id": ("trace_id", pa.string(), False),
    "agent_role": ("agent_role", pa.string(), True),
    "task_complexity_score": ("task_complexity_score", pa.float64(), False),
    "primary_failure_count": ("primary_failure_count", pa.int64(), False),
    "primary_model": ("primary_model", pa.string(), False),
    "fallback_model": ("fallback_model", pa.string(), False),
    "selected_model": ("selected_model", pa.string(), True),
    "matched_fallback_triggers": ("matched_fallback_triggers", pa.list_(pa.string()), False),
    "policy_source": ("policy_source", pa.string(), False),
    "propensity": ("propensity", pa.float64(), False),
}
_TU_FIELDS: _Fields = {
    "timestamp": ("timestamp", pa.string(), True),
    "session_id": ("session_id", pa.string(), False),
    "trace_id": ("trace_id", pa.string(), False),
    "agent": ("agent", pa.string(), False),
    "model": ("model", pa.string(), True),
    "prompt_tokens": ("prompt_tokens", pa.int64(), False),
    "completion_tokens": ("completion_tokens", pa.int64(), False),
    "cost_usd": ("cost_usd", pa.float64(), False),
}
_AI_FIELDS: _Fields = {
    "timestamp": ("timestamp", pa.string(), True),
    "session_id": ("session_id", pa.string(), False),
    "trace_id": ("trace_id", pa.string(), False),
    "task_id": ("task_id", pa.string(), False),
    "agent": ("agent", pa.string(), True),
    "insight_type": ("insight_type", pa.string(), True),
    "severity": ("severity", pa.string(), False),
    "content_preview": ("content_preview", pa.string(), False),
}
# the columns every table adds to what it decodes
_DERIVED = {
    "timestamp_utc": pa.timestamp("us", tz="UTC"),
    "session_id_source": pa.string(),
    "data_source": pa.string(),
    "source_file": pa.string(),
    "source_line": pa.int64(),
}


def _schema(columns: tuple[str, ...], fields: _Fields) -> pa.Schema:
    types = {c: t for c, (_, t, _) in fields.items()} | _DERIVED
    return pa.schema([(c, types[c]) for c in columns])


TRAJECTORY_SCHEMA = _schema(TRAJECTORY_COLUMNS, _STEP_FIELDS)
ROUTING_DECISION_SCHEMA = _schema(ROUTING_DECISION_COLUMNS, _MRD_FIELDS)
TOKEN_USAGE_SCHEMA = _schema(TOKEN_USAGE_COLUMNS, _TU_FIELDS)
AGENT_INSIGHT_SCHEMA = _schema(AGENT_INSIGHT_COLUMNS, _AI_FIELDS)

_DECODE = msgspec.json.Decoder(Event).decode
_TYPE = attrgetter("type")
_SYN, _EXTRA = attrgetter("synthetic"), attrgetter("extra")


# ---------------------------------------------------------------- config/result
class IngestConfig(BaseModel):
    """Which folders the ingest reads and how. ``log_dirs`` may be given positionally:
    ``IngestConfig([folder])``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    log_dirs: list[str] = Field(["sessions"], min_length=1, description="folders searched recursively for SAGE "
                                "journals: *.log, *.jsonl and their .gz forms (SAGE's own folder is "
                                "<SAGE>/memory/sessions); relative ones are relative to the artifact root (see "
                                "under()), absolute ones stay")
    max_line_bytes: int = Field(1 << 20, ge=1024, description="longer lines are quarantined, never held whole "
                                "(>= 1024)")
    read_chunk_bytes: int = Field(1 << 21, ge=1, description="bytes read from a journal at a time (>= 1: 0 would "
                                  "read nothing)")

    def __init__(self, log_dirs: Sequence[str | os.PathLike[str]] | None = None, /, **data: Any) -> None:
        if log_dirs is not None:
            data["log_dirs"] = log_dirs
        super().__init__(**data)

    @field_validator("log_dirs", mode="before")
    @classmethod
    def _paths_as_text(cls, v: Any) -> Any:
        return [os.fspath(d) for d in v] if isinstance(v, list | tuple) else v

    def under(self, root: str | os.PathLike[str]) -> IngestConfig:
        """This config with relative ``log_dirs`` resolved against ``root`` (absolute ones kept)."""
        return self.model_copy(update={"log_dirs": [str(Path(root) / d) for d in self.log_dirs]})


@dataclass
class IngestStats:
    files: list[str] = field(default_factory=list)
    empty_files: list[str] = field(default_factory=list)
    # files read only up to a point, or not at all ({"file", "line", "reason"}; the unread rest
    # is one quarantined line), and paths that could not be listed ({"path", "reason"})
    damaged_files: list[dict] = field(default_factory=list)
    skipped_paths: list[dict] = field(default_factory=list)
    bytes_read: int = 0
    lines_read: int = 0
    steps_accepted: int = 0
    blank_lines: int = 0
    text_lines: Counter = field(default_factory=Counter)  # SAGE's plain-text lines by kind (not events)
    steps_without_model: Counter = field(default_factory=Counter)  # role -> steps SAGE logged with model ""
    other_events: Counter = field(default_factory=Counter)  # every type but TRAJECTORY_STEP
    quarantined: int = 0
    quarantine_reasons: Counter = field(default_factory=Counter)
    rows_by_source: Counter = field(default_factory=Counter)
    routing_decisions: int = 0  # rows of routing_decisions.parquet
    token_usage: int = 0  # rows of token_usage.parquet
    agent_insights: int = 0  # rows of agent_insights.parquet
    content_previews_cut: int = 0  # insights whose content_preview was over CONTENT_PREVIEW_CHARS (cut to it)
    unusable_side_events: Counter = field(default_factory=Counter)  # type -> lines left out of a side table
    unusable_side_examples: list[dict] = field(default_factory=list)  # first few: file, line, type, reason
    steps_without_step: int = 0  # accepted steps that logged no ``step`` (SAGE never does)
    steps_session_from_file_stem: int = 0  # accepted steps whose session is their file's stem
    file_stem_sessions: set = field(default_factory=set)  # those sessions
    seconds: float = 0.0

    @property
    def accepted_lines(self) -> int:
        return (self.steps_accepted + self.blank_lines + sum(self.other_events.values())
                + sum(self.text_lines.values()))

    @property
    def quarantined_fraction(self) -> float:
        return self.quarantined / self.lines_read if self.lines_read else 0.0

    @property
    def skipped_fraction(self) -> float:
        """Files and folders that could not be read, or only in part, over every one found."""
        bad = len(self.damaged_files) + len(self.skipped_paths)
        return bad / (len(self.files) + len(self.skipped_paths)) if bad else 0.0

    @property
    def sessions_from_file_stem(self) -> int:
        return len(self.file_stem_sessions)

    def count_steps(self, table: pa.Table) -> None:
        """Add a batch of accepted trajectory rows to the counts."""
        self.steps_accepted += table.num_rows
        n_syn = int(pc.sum(pc.equal(table["data_source"], "synthetic")).as_py() or 0)
        self.rows_by_source.update({"synthetic": n_syn, "real": table.num_rows - n_syn})
        self.steps_without_step += table["step"].null_count
        if table["model"].null_count:
            roles = table["role"].filter(table["model"].is_null())
            self.steps_without_model.update({d["values"]: d["counts"] for d in pc.value_counts(roles).to_pylist()})
        from_stem = pc.equal(table["session_id_source"], "file_stem")
        n_stem = int(pc.sum(from_stem).as_py() or 0)
        if n_stem:
            self.steps_session_from_file_stem += n_stem
            self.file_stem_sessions.update(pc.unique(table["session_id"].filter(from_stem)).to_pylist())

    def to_dict(self) -> dict:
        return {
            "files": len(self.files), "empty_files": self.empty_files,
            "damaged_files": list(self.damaged_files), "skipped_paths": list(self.skipped_paths),
            "skipped_fraction": self.skipped_fraction,
            "bytes_read": self.bytes_read, "lines_read": self.lines_read,
            "accepted_lines": self.accepted_lines, "trajectory_steps": self.steps_accepted,
            "other_events": dict(self.other_events), "blank_lines": self.blank_lines,
            "text_lines": dict(self.text_lines), "steps_without_model": dict(self.steps_without_model),
            "quarantined_lines": self.quarantined, "quarantined_fraction": self.quarantined_fraction,
            "quarantine_reasons": dict(self.quarantine_reasons.most_common()),
            "rows_by_source": dict(self.rows_by_source),
            "routing_decisions": self.routing_decisions, "token_usage": self.token_usage,
            "agent_insights": self.agent_insights, "content_previews_cut": self.content_previews_cut,
            "unusable_side_events": dict(self.unusable_side_events),
            "unusable_side_examples": list(self.unusable_side_examples),
            "steps_without_step": self.steps_without_step,
            "sessions_from_file_stem": self.sessions_from_file_stem,
            "steps_session_from_file_stem": self.steps_session_from_file_stem,
            "rotated_journal_parts": sum(bool(_ROTATED.fullmatch(Path(Path(f).name.removesuffix(".gz")).stem))
                                         for f in self.files),
            "seconds": round(self.seconds, 3),
        }


# what the ingest writes into its output folder
AGENT_INSIGHTS_NAME = "agent_insights.parquet"
OUTPUT_FILES = ("trajectories.parquet", "routing_decisions.parquet", "token_usage.parquet", AGENT_INSIGHTS_NAME,
                "quarantine.jsonl")


@dataclass(frozen=True)
class IngestResult:
    trajectories: Path
    quarantine: Path
    routing_decisions: Path
    token_usage: Path
    agent_insights: Path
    stats: IngestStats

    def published(self, where: Callable[[Path], Path]) -> IngestResult:
        """The same result with each path mapped by ``where`` (a staged path to where readers find it)."""
        return dataclasses.replace(self, trajectories=where(self.trajectories), quarantine=where(self.quarantine),
                                   routing_decisions=where(self.routing_decisions),
                                   token_usage=where(self.token_usage),
                                   agent_insights=where(self.agent_insights))


class LogFolderMissing(FileNotFoundError):
    pass


class NoTrajectorySteps(ValueError):
    pass


# ---------------------------------------------------------------- reading
def find_logs(config: IngestConfig, setting: str = "log_dirs") -> list[Path]:
    """Every journal file under the configured folders, in :func:`journal_order`; a missing folder is an error."""
    return discover_logs(config, setting)[0]


def discover_logs(config: IngestConfig, setting: str = "log_dirs") -> tuple[list[Path], list[dict]]:
    """Every journal file under the configured folders (sorted), following symlinked folders
    (each real folder once, so a link loop ends), and every path that could not be listed
    (``{"path", "reason"}``): never a silent skip. A path named like a journal that is not a regular
    file (a FIFO, a device, a socket; a journal may be anything) is listed there and never opened. A
    missing top folder is an error that names ``setting``, the setting that lists the folders (the
    asset's: ``trajectories config log_dirs``)."""
    files: set[Path] = set()
    skipped: list[dict] = []
    seen: set[tuple[int, int]] = set()
    for d in config.log_dirs:
        d = Path(d)
        if not d.is_dir():
            raise LogFolderMissing(
                f"log folder {d} does not exist (it is listed in the '{setting}' setting). "
                f"Create it, point '{setting}' at the folder that holds SAGE's session journals "
                f"(SAGE writes them to memory/sessions/<YYYY-MM-DD>.log), "
                f"or materialize synthetic_sessions first.")

        def unreadable(exc: OSError, top: Path = d) -> None:
            skipped.append({"path": str(exc.filename or top),
                            "reason": f"cannot list the folder: {exc.strerror or exc}"})

        for root, dirs, names in os.walk(d, onerror=unreadable, followlinks=True):
            try:
                st = os.stat(root)
            except OSError as exc:  # removed since os.walk listed it
                skipped.append({"path": root, "reason": f"removed while listing: {exc.strerror or exc}"})
                dirs[:] = []
                continue
            if (st.st_dev, st.st_ino) in seen:  # reached again through a link: already listed
                dirs[:] = []
                continue
            seen.add((st.st_dev, st.st_ino))
            for name in names:
                path = Path(root) / name
                if any(fnmatch.fnmatchcase(name, pattern) for pattern in LOG_PATTERNS):
                    try:
                        mode = os.stat(path).st_mode  # never opened here: a FIFO would block an open
                    except FileNotFoundError:
                        skipped.append({"path": str(path), "reason": "a broken link or a file removed while listing"})
                        continue
                    except OSError as exc:
                        skipped.append({"path": str(path), "reason": f"cannot be read: {exc.strerror or exc}"})
                        continue
                    if stat.S_ISREG(mode):
                        files.add(path)
                    else:
                        skipped.append({"path": str(path), "reason": _not_regular_reason(mode)})
                elif path.is_symlink() and not path.exists():  # it may have pointed at a journal: say so
                    skipped.append({"path": str(path), "reason": _broken_link_reason(path)})
    return sorted(files, key=journal_order), sorted(skipped, key=lambda sk: sk["path"])


def _not_regular_reason(mode: int) -> str:
    return (f"not a regular file ({kind_of(mode)}), named like a journal: never opened (a FIFO would hang the "
            "reader, a device never ends); replace it by the journal file itself")


def _broken_link_reason(path: Path) -> str:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return (f"a broken link (to {target}) whose name matches no journal pattern ({', '.join(LOG_PATTERNS)}): "
            "if it should point at a journal, fix the link; otherwise remove it")


_ROTATED = re.compile(r"(\d{4}-\d{2}-\d{2})\.(\d+)")  # manager.py: f"{today}.{i}.log", today %Y-%m-%d


def file_stem(path: str | Path) -> str:
    """The session id of a journal line without ``session_id``: the day of its journal.

    SAGE's exporter (rl/export_dataset.py ``load_all_events``) uses ``lp.stem``; this is the file
    name without ``.gz`` and its extension (``2026-11-20.log.gz`` -> ``2026-11-20``), and
    without the rotation number ``MemoryManager.append_session_log`` adds (memory/manager.py:
    ``<date>.log`` is renamed ``<date>.<i>.log`` when it would pass ``SAGE_SESSION_LOG_MAX_MB``):
    ``2026-11-20.3.log`` -> ``2026-11-20``. A day's rotated parts are one journal cut in pieces,
    so without a logged session id they are one session, as the un-rotated file would be
    (``lp.stem`` would make ``2026-11-20.3`` a session of its own and cut the runs in it)."""
    stem = Path(Path(path).name.removesuffix(".gz")).stem
    m = _ROTATED.fullmatch(stem)
    return m.group(1) if m else stem


def journal_order(path: str | Path) -> tuple:
    """Sort key of journal files in the order SAGE wrote them: by folder, then day, then
    rotation part: ``<date>.1.log`` (the oldest, renamed first), ``<date>.2.log``, ...,
    then ``<date>.log`` (the part still being written). Other names sort by name."""
    p = Path(path)
    stem = Path(p.name.removesuffix(".gz")).stem
    m = _ROTATED.fullmatch(stem)
    if m:
        return (str(p.parent), m.group(1), 0, int(m.group(2)), p.name)
    return (str(p.parent), stem, 1, 0, p.name)


def _utf8_errors(parts: list[bytes], data: bytes, cut: int) -> list[int]:
    """Indices of ``parts`` that are not valid UTF-8 (one fast check for the common case)."""
    try:
        str(memoryview(data)[:cut], "utf-8")
        return []
    except UnicodeDecodeError:
        bad = []
        for i, p in enumerate(parts):
            try:
                p.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(i)
        return bad


# ---------------------------------------------------------------- decoding
def _decode_batch(decode: Callable[[bytes], Event], lines: list[bytes]) -> tuple[list[Event], list[int]]:
    """Decode every line in C (``map``), resuming after each line the decoder refuses.

    Returns the decoded events (in line order, without the refused lines) and the
    indices of the refused lines, which the slow path explains.
    """
    out: list[Event] = []
    slow: list[int] = []
    it = iter(lines)
    while True:
        try:
            out.extend(map(decode, it))
            return out, slow
        except (msgspec.DecodeError, RecursionError):  # RecursionError: nested deeper than msgspec's limit
            slow.append(len(out) + len(slow))  # ``it`` has moved past the refused line


def _head(line: bytes) -> str:
    return line[:RAW_HEAD * 4].decode("utf-8", errors="replace")[:RAW_HEAD]


def _slow_path(line: bytes) -> tuple[str, object, str | None]:
    """Classify a line the fast decoder refused: ``(kind, payload, type)`` with kind one of
    'blank', 'text' (one of SAGE's own plain-text lines, payload its kind: see
    :data:`SAGE_TEXT_LINES`), 'other' (any type the ingest does not keep), 'event' (a step or side event,
    payload the decoded struct), 'unusable' (a side event with wrong types, payload the
    reason) or 'bad' (payload the quarantine reason)."""
    if not line.strip():
        return "blank", None, None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "bad", f"not valid UTF-8: byte 0x{line[exc.start]:02x} at offset {exc.start}", None
    if text[:1] == "[":
        for kind, pattern in SAGE_TEXT_LINES.items():
            if pattern.fullmatch(text):
                return "text", kind, None
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return "bad", f"invalid JSON (truncated or malformed): {exc.msg} (column {exc.colno})", None
    except RecursionError:
        return "bad", "JSON nested too deeply to decode (thousands of levels): not a SAGE event", None
    except ValueError as exc:  # e.g. an integer literal past Python's digit limit
        return "bad", f"invalid JSON number: {exc}", None
    if not isinstance(obj, dict):
        return "bad", f"not a JSON object (got {type(obj).__name__})", None
    typ = obj.get("type")
    if not isinstance(typ, str):
        return "bad", "missing or non-string field 'type'", None
    struct = _SLOW_TYPES.get(typ)
    if struct is None:
        return "other", None, typ
    try:
        return "event", msgspec.convert(obj, struct), typ
    except msgspec.ValidationError as exc:
        return ("bad" if typ == TRAJECTORY_STEP else "unusable"), f"wrong type: {exc}", typ
    except RecursionError:
        return ("bad" if typ == TRAJECTORY_STEP else "unusable"), "a field is nested too deeply to decode", typ


# ---------------------------------------------------------------- validation
class _Flags:
    """Per-row first reason a row is refused, filled by successive column-wise checks."""

    def __init__(self, n: int) -> None:
        self.bad = np.zeros(n, dtype=bool)
        self.reasons: list[str | None] = [None] * n

    def flag(self, mask: np.ndarray, why: Callable[[int], str]) -> None:
        new = mask & ~self.bad
        for i in np.flatnonzero(new):
            self.reasons[i] = why(int(i))
        self.bad |= new


_NOT_A_TIME = np.iinfo(np.int64).min


def _timestamps_us(raw: pa.Array) -> np.ndarray:
    """ISO 8601 strings as microseconds since 1970 UTC (naive = UTC); ``_NOT_A_TIME`` where
    missing or unparseable.

    pandas' ISO 8601 parser decides what is accepted. Arrow's parser is tried first, being
    several times faster: it takes only offset-qualified times, refuses the whole block on
    any other string, and agrees with pandas on every string it takes (checked on ~12,700
    variants of dates, separators, fractions and offsets), so the result of a string does
    not depend on its block. pandas parses a block at ns resolution when a value has 9
    fractional digits, and at us otherwise; callers accept only years 1678-2261, inside
    both, for the same reason.
    """
    try:
        ts = pc.cast(raw, _DERIVED["timestamp_utc"])
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        parsed = pd.to_datetime(raw.to_numpy(zero_copy_only=False), format="ISO8601", utc=True,
                                errors="coerce")
        return parsed.as_unit("us").asi8  # NaT is int64 min
    return pc.cast(ts, pa.int64()).fill_null(_NOT_A_TIME).to_numpy()


def _num(col: pa.Array) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False)


def _check(cols: dict[str, pa.Array], fields: _Fields, nonempty: tuple[str, ...],
           ranges: tuple[tuple[str, float, float, bool], ...]) -> tuple[_Flags, pa.Array]:
    """Required fields, non-empty strings, the timestamp and numeric ranges, in that order
    (the first failing check is the row's reason). Returns the flags and ``timestamp_utc``.

    ``ranges``: (column, lo, hi, lo_open); every range check also refuses non-finite values;
    a null passes unless the field is required (then it was refused as missing already).
    """
    n = len(cols["timestamp"])
    f = _Flags(n)
    for col, (path, _, required) in fields.items():
        if required and cols[col].null_count:
            f.flag(np.asarray(cols[col].is_null()), lambda i, p=path: f"missing field {p}")
    for col in nonempty:
        empty = np.asarray(pc.equal(cols[col], "").fill_null(False))
        f.flag(empty, lambda i, p=fields[col][0]: f"empty field {p}")
    us = _timestamps_us(cols["timestamp"])
    bad = (us < _TS_MIN_US) | (us >= _TS_END_US)  # includes unparseable and missing
    if bad.any():  # a missing timestamp was refused above; the others here
        raw = cols["timestamp"]
        f.flag(bad, lambda i: (f"field timestamp = {raw[i].as_py()!r} is not ISO 8601 in years "
                               f"{TIMESTAMP_YEARS} (e.g. {TIMESTAMP_EXAMPLE!r}; naive means UTC)"))
    ts_utc = pa.array(us, type=pa.int64(), mask=bad).cast(_DERIVED["timestamp_utc"])
    for col, lo, hi, lo_open in ranges:
        path = fields[col][0]
        x = _num(cols[col])
        missing = np.asarray(cols[col].is_null()) if cols[col].null_count else np.zeros(n, dtype=bool)
        finite = np.isfinite(x)
        ok = (finite & ((x > lo) if lo_open else (x >= lo)) & (x <= hi)) | missing
        interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        f.flag(~ok, lambda i, p=path, x=x, finite=finite, interval=interval: (
            f"field {p} = {float(x[i])} is not finite" if not finite[i]
            else f"field {p} = {float(x[i]):g} outside {interval}"))
    return f, ts_utc


# action.model_chosen may be "": SAGE writes ``getattr(task, "model_used", "") or ""`` (workflow.py
# circuit_breaker, debug_agent); such a step is kept with a null model (see _rows), never refused
_STEP_NONEMPTY = ("session_id", "task_id", "role")
_STEP_RANGES = (
    ("task_complexity_score", 0.0, 1.0, False),
    ("logged_reward", REWARD_MIN, REWARD_MAX, False),
    ("propensity", 0.0, 1.0, True),
    ("step", 0, np.inf, False),
    ("primary_failure_count", 0, np.inf, False),
    ("failure_count", 0, np.inf, False),
    ("prompt_tokens", 0, np.inf, False),
    ("reviewer_score", 0.0, 1.0, False),
    ("latency_s", 0.0, np.inf, False),
    ("cost_usd", 0.0, np.inf, False),
)
_MRD_NONEMPTY = ("session_id", "agent_role", "selected_model")
_MRD_RANGES = (
    ("task_complexity_score", 0.0, 1.0, False),
    ("primary_failure_count", 0, np.inf, False),
    ("propensity", 0.0, 1.0, True),
)
_TU_NONEMPTY = ("session_id", "model")
_TU_RANGES = (
    ("prompt_tokens", 0, np.inf, False),
    ("completion_tokens", 0, np.inf, False),
    ("cost_usd", 0.0, np.inf, False),
)
_AI_NONEMPTY = ("session_id", "agent", "insight_type")


def _columns(events: list, fields: _Fields, synthetic: bool = False) -> dict[str, pa.Array]:
    """Column-wise extraction of ``fields`` (C-level maps, no Python loop body), and of
    ``extra.synthetic`` as ``_synthetic`` when asked."""
    parts: dict[str, list] = {"": events}
    n = len(events)
    cols = {}
    for col, (path, typ, _) in fields.items():
        prefix, _, name = path.rpartition(".")
        if prefix not in parts:
            parts[prefix] = list(map(attrgetter(prefix), events))
        vals = list(map(attrgetter(name), parts[prefix]))
        # SAGE leaves many fields out (step, propensity, most state keys): skip converting Nones
        all_null = vals[0] is None and vals.count(None) == n
        cols[col] = pa.nulls(n, typ) if all_null else pa.array(vals, type=typ)
    if synthetic:
        cols["_synthetic"] = pa.array(list(map(_SYN, map(_EXTRA, events))), type=pa.bool_())
    return cols


# What Arrow raises for a value it cannot store: a lone UTF-16 surrogate ("\ud800" decodes to
# a str that is not valid Unicode), an integer outside 64 bits, ...
_UNSTORABLE = (UnicodeEncodeError, OverflowError, ValueError, TypeError, pa.ArrowException)


def _unstorable_reason(exc: Exception) -> str:
    if isinstance(exc, UnicodeEncodeError):
        return (f"a string is not valid Unicode (a lone UTF-16 surrogate such as \\u{ord(exc.object[exc.start]):04x}"
                "): it cannot be stored as UTF-8")
    if isinstance(exc, OverflowError):
        return f"an integer does not fit in 64 bits ({exc})"
    return f"a value cannot be stored: {type(exc).__name__}: {exc}"


def _columns_or_refuse(events: list, fields: _Fields, synthetic: bool) -> tuple[dict[str, pa.Array], dict[int, str]]:
    """:func:`_columns`, and where a value cannot be stored, the events that hold one
    (index -> reason), found one by one and left out of the columns (rare: only then is
    there a per-event loop)."""
    try:
        return _columns(events, fields, synthetic), {}
    except _UNSTORABLE:
        pass
    refused: dict[int, str] = {}
    for i, event in enumerate(events):
        try:
            _columns([event], fields, synthetic)
        except _UNSTORABLE as exc:
            refused[i] = _unstorable_reason(exc)
    keep = [e for i, e in enumerate(events) if i not in refused]
    return (_columns(keep, fields, synthetic) if keep else {}), refused


_LOGGED, _FILE_STEM = pa.scalar("logged", pa.string()), pa.scalar("file_stem", pa.string())


def _session(sid: pa.Array, stem: str) -> tuple[pa.Array, pa.Array]:
    """The session id (the file's stem where none was logged) and its source."""
    if not sid.null_count:
        return sid, pa.repeat(_LOGGED, len(sid))
    return sid.fill_null(stem), pc.if_else(sid.is_valid(), _LOGGED, _FILE_STEM)


# ---------------------------------------------------------------- ingest
@dataclass
class _Block:
    """Complete lines of one file, as read by the parent: ``first`` is the 1-based number
    of the first line; over-long lines are already replaced by empty lines."""

    fname: str
    first: int
    data: bytes
    too_long: list[tuple[int, int]]
    lines: list[bytes] | None = None  # ``data`` split at newlines, without the last (empty) part
    damaged: str | None = None  # the file cannot be read from this line on (data is then one empty line)

    def split(self) -> list[bytes]:
        if self.lines is None:
            self.lines = self.data.split(b"\n")
            self.lines.pop()  # the block ends with a newline
        return self.lines


@dataclass
class _BlockResult:
    fname: str
    lines: int
    table: pa.Table | None  # valid TRAJECTORY_STEP rows, not yet checked for duplicates
    keys: np.ndarray  # uint64 key hash per table row
    quarantined: list[tuple[int, str, str]]  # (line, reason, head)
    other_events: Counter
    blank_lines: int
    routing_decisions: pa.Table | None = None  # usable MODEL_ROUTING_DECISION rows
    token_usage: pa.Table | None = None  # usable TOKEN_USAGE rows
    agent_insights: pa.Table | None = None  # usable AGENT_INSIGHT_EMITTED rows
    previews_cut: int = 0  # of those, content_previews cut to CONTENT_PREVIEW_CHARS
    unusable: list[tuple[int, str, str]] = field(default_factory=list)  # (line, type, reason)
    damaged: tuple[int, str] | None = None  # (line, reason): the file is unreadable from there on
    text_lines: Counter = field(default_factory=Counter)  # SAGE's plain-text lines, by kind


class _Damaged(Exception):
    """The rest of a file cannot be read; the message says why."""


_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_SALVAGE_BYTES = 1024  # compressed bytes per step when salvaging what precedes corrupt data (then 1)


def _plain_chunks(fh, chunk_bytes: int) -> Iterator[bytes]:
    while chunk := fh.read(chunk_bytes):
        yield chunk


def _at_least(fh, raw: bytes, chunk_bytes: int, n: int = len(_GZIP_MAGIC)) -> bytes:
    """``raw`` extended by further reads until it holds ``n`` bytes or the file ends."""
    while raw and len(raw) < n and (more := fh.read(chunk_bytes)):
        raw += more
    return raw


def _salvage(d, raw: bytes) -> Iterator[bytes]:
    """Everything ``d`` decodes from ``raw`` before the byte where zlib finds the damage.

    A ``decompress`` call that fails returns nothing of what it had decoded, so the input goes
    again 1 KiB at a time, and the piece that fails one byte at a time: every byte of output
    zlib produces before the error is kept (then the damage is one quarantined record)."""
    for i in range(0, len(raw), _SALVAGE_BYTES):
        piece = raw[i:i + _SALVAGE_BYTES]
        before = d.copy()
        try:
            out = d.decompress(piece)
        except zlib.error:
            d = before
            for j in range(len(piece)):
                try:
                    out = d.decompress(piece[j:j + 1])
                except zlib.error:
                    return
                if out:
                    yield out
            return
        if out:
            yield out


def _gzip_chunks(fh, chunk_bytes: int) -> Iterator[bytes]:
    """The decompressed data of a gzip file, every member, in pieces of at most
    ``chunk_bytes``; everything readable is yielded before :class:`_Damaged` says why the
    rest is not (truncated, corrupt, not gzip, trailing garbage). ``gzip.open`` raises
    instead, dropping what it had decompressed in the same read."""
    raw = _at_least(fh, fh.read(chunk_bytes), chunk_bytes)
    if raw[:2] != _GZIP_MAGIC:
        raise _Damaged(f"not a gzip file (it starts with {raw[:8]!r}): rename it without .gz if it is plain text")
    d = zlib.decompressobj(wbits=31)  # gzip framing; checks each member's CRC and length
    while True:
        if not raw:
            raw = fh.read(chunk_bytes)
            if not raw:
                if d.eof:
                    return
                raise _Damaged("truncated: the compressed data ends before the end of the gzip stream")
        before = d.copy()
        try:
            out = d.decompress(raw, chunk_bytes)
        except zlib.error as exc:
            yield from _salvage(before, raw)
            raise _Damaged(f"corrupt compressed data ({exc})") from None
        raw = d.unconsumed_tail
        if out:
            yield out
        if d.eof:  # a member ended: another member, zero padding, end of file, or garbage
            # the leftover input is unused_data alone (zlib leaves a stale unconsumed_tail here)
            raw = d.unused_data or fh.read(chunk_bytes)
            while raw and not raw.lstrip(b"\x00"):  # zero padding after the last member
                raw = fh.read(chunk_bytes)
            raw = _at_least(fh, raw.lstrip(b"\x00"), chunk_bytes)
            if not raw:
                return
            if raw[:2] != _GZIP_MAGIC:
                raise _Damaged(f"trailing data after the gzip stream is not gzip (starts with {raw[:8]!r})")
            d = zlib.decompressobj(wbits=31)


def _without_bom(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """``chunks`` without a UTF-8 byte order mark at the very start of the file (legal there,
    and not part of the first line); a BOM anywhere else stays, and is quarantined with its line."""
    head = b""
    for chunk in chunks:
        head += chunk
        if len(head) >= len(_UTF8_BOM):
            break
    head = head.removeprefix(_UTF8_BOM)
    if head:
        yield head
    yield from chunks


def iter_blocks(path: Path, max_line_bytes: int, chunk_bytes: int) -> Iterator[_Block]:
    """Read ``path`` in chunks of complete lines, in bounded memory.

    A line longer than ``max_line_bytes`` that spans chunks is never held whole: it is
    counted while skipped and handed on as an empty line plus a ``too_long`` record. A file
    that cannot be opened, or whose data cannot be read past some point (a truncated or
    corrupt ``.gz``), ends with a ``damaged`` block at the first line it could not read:
    every complete line before it is kept. A UTF-8 byte order mark at the start of the
    file (of the decompressed data for ``.gz``) is dropped: it is legal there.
    """
    fname = str(path)
    line_no = 1
    try:  # non-blocking, so a FIFO swapped in since the listing cannot hang the open; checked on the descriptor
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        yield _Block(fname, line_no, b"\n", [], damaged=f"the file cannot be opened: {type(exc).__name__}: {exc}")
        return
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        yield _Block(fname, line_no, b"\n", [], damaged=_not_regular_reason(mode))
        return
    os.set_blocking(fd, True)
    fh = os.fdopen(fd, "rb")
    with fh:
        chunks = _without_bom((_gzip_chunks if path.suffix == ".gz" else _plain_chunks)(fh, chunk_bytes))
        buf = b""
        skipping = 0  # bytes of an over-long line skipped so far
        while True:
            try:
                chunk = next(chunks, b"")
            except (_Damaged, OSError) as exc:
                why = str(exc) if isinstance(exc, _Damaged) else f"{type(exc).__name__}: {exc}"
                partial = f", and {len(buf) or skipping} bytes of an incomplete line" if buf or skipping else ""
                yield _Block(fname, line_no, b"\n", [], damaged=(
                    f"the file is unreadable from this line on ({line_no - 1} lines before it were read"
                    f"{partial}): {why}"))
                return
            if not chunk:
                break
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    skipping += len(chunk)
                    continue
                yield _Block(fname, line_no, b"\n", [(line_no, skipping + nl)])
                line_no += 1
                skipping = 0
                chunk = chunk[nl + 1:]
            buf = buf + chunk if buf else chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                if len(buf) > max_line_bytes:
                    skipping, buf = len(buf), b""
                continue
            if cut == len(buf) - 1:  # the common case: whole lines, no copy
                block, buf = buf, b""
            else:
                block, buf = buf[:cut + 1], buf[cut + 1:]
            out = _Block(fname, line_no, block, [])
            line_no += len(out.split())  # split once here: it counts the lines too
            yield out
            if len(buf) > max_line_bytes:
                skipping, buf = len(buf), b""
        if skipping:
            yield _Block(fname, line_no, b"\n", [(line_no, skipping)])
        elif buf:
            yield _Block(fname, line_no, buf + b"\n", [])


def _in_line_order(events: list, pos: list[int]) -> tuple[list, np.ndarray]:
    """Events and their line indices in line order (slow-path events were appended last)."""
    pos_arr = np.asarray(pos, dtype=np.int64)
    order = np.argsort(pos_arr, kind="stable")
    if (order != np.arange(len(order))).any():
        return [events[i] for i in order], pos_arr[order]
    return events, pos_arr


@dataclass(frozen=True)
class _Kind:
    """How one kept event type becomes rows: its fields and checks, and its table's schema."""

    fields: _Fields
    nonempty: tuple[str, ...]
    ranges: tuple[tuple[str, float, float, bool], ...]
    schema: pa.Schema
    bounded: tuple[tuple[str, int], ...] = ()  # (text column, most characters kept): longer values are cut


_KINDS = {
    TRAJECTORY_STEP: _Kind(_STEP_FIELDS, _STEP_NONEMPTY, _STEP_RANGES, TRAJECTORY_SCHEMA),
    MODEL_ROUTING_DECISION: _Kind(_MRD_FIELDS, _MRD_NONEMPTY, _MRD_RANGES, ROUTING_DECISION_SCHEMA),
    TOKEN_USAGE: _Kind(_TU_FIELDS, _TU_NONEMPTY, _TU_RANGES, TOKEN_USAGE_SCHEMA),
    AGENT_INSIGHT_EMITTED: _Kind(_AI_FIELDS, _AI_NONEMPTY, (), AGENT_INSIGHT_SCHEMA,
                                 (("content_preview", CONTENT_PREVIEW_CHARS),)),
}
_SIDE_KINDS = (MODEL_ROUTING_DECISION, TOKEN_USAGE, AGENT_INSIGHT_EMITTED)


def _bound(cols: dict[str, pa.Array], bounded: tuple[tuple[str, int], ...]) -> int:
    """Cut each bounded text column to its most characters; returns how many values were cut."""
    cut = 0
    for col, most in bounded:
        over = pc.greater(pc.utf8_length(cols[col]), most).fill_null(False)
        n = int(pc.sum(over).as_py() or 0)
        if n:
            cols[col] = pc.utf8_slice_codeunits(cols[col], 0, most)
            cut += n
    return cut


def _rows(typ: str, events: list, pos: list[int], stem: str, fname: str,
          first: int) -> tuple[pa.Table | None, list[tuple[int, int, str]], int]:
    """The valid rows of one kept event type, in line order, the refused ones as
    ``(line index in the block, line number, reason)``, and how many bounded values were cut."""
    if not events:
        return None, [], 0
    kind = _KINDS[typ]
    events, pos_arr = _in_line_order(events, pos)
    is_step = typ == TRAJECTORY_STEP
    cols, unstorable = _columns_or_refuse(events, kind.fields, is_step)
    refused = [(int(pos_arr[i]), first + int(pos_arr[i]), why) for i, why in unstorable.items()]
    if unstorable:
        pos_arr = np.delete(pos_arr, list(unstorable))
        if not len(pos_arr):
            return None, refused, 0
    flags, cols["timestamp_utc"] = _check(cols, kind.fields, kind.nonempty, kind.ranges)
    refused += [(int(pos_arr[i]), first + int(pos_arr[i]), flags.reasons[i])
                for i in np.flatnonzero(flags.bad)]
    keep = ~flags.bad
    n = int(keep.sum())
    if not n:
        return None, refused, 0
    cols["session_id"], cols["session_id_source"] = _session(cols["session_id"], stem)
    if is_step:
        cols["data_source"] = pc.if_else(cols.pop("_synthetic").fill_null(False), "synthetic", "real")
        no_model = pc.equal(cols["model"], "").fill_null(False)
        if pc.any(no_model).as_py():  # SAGE's "" (task.model_used never set): null, counted by role
            cols["model"] = pc.if_else(no_model, pa.scalar(None, pa.string()), cols["model"])
    if n < len(keep):
        mask = pa.array(keep)
        cols = {c: cols[c].filter(mask) for c in kind.schema.names if c in cols}
    cut = _bound(cols, kind.bounded) if kind.bounded else 0
    cols["source_file"] = pa.repeat(pa.scalar(fname, pa.string()), n)
    cols["source_line"] = pa.array(first + pos_arr[keep], type=pa.int64())
    return pa.Table.from_arrays([cols[c] for c in kind.schema.names], schema=kind.schema), refused, cut


def process_block(block: _Block, max_line_bytes: int) -> _BlockResult:
    """Decode, validate and columnarise one block of lines (everything but duplicates)."""
    lines = list(block.split())  # a copy: bad lines are blanked below
    first, fname = block.first, block.fname
    quarantined: list[tuple[int, str, str]] = []
    special: dict[int, str] = {}  # line index -> reason known before decoding
    for ln, nbytes in block.too_long:
        special[ln - first] = (f"line is {nbytes} bytes, over max_line_bytes={max_line_bytes} "
                               "(raise the max_line_bytes setting if it is real)")
    if block.damaged:
        special[0] = block.damaged
    if max(map(len, lines), default=0) > max_line_bytes:
        for i, line in enumerate(lines):
            if len(line) > max_line_bytes:
                special[i] = (f"line is {len(line)} bytes, over max_line_bytes={max_line_bytes} "
                              "(raise the max_line_bytes setting if it is real)")
    bad_utf8 = {i: lines[i] for i in _utf8_errors(lines, block.data, len(block.data))}
    for i in list(special) + list(bad_utf8):
        lines[i] = b""  # refused by the fast decoder; explained on the slow path
    decoded, slow = _decode_batch(_DECODE, lines)
    types = np.array(list(map(_TYPE, decoded)), dtype=object)
    ok_pos = np.delete(np.arange(len(lines)), slow) if slow else np.arange(len(lines))
    kept: dict[str, tuple[list, list[int]]] = {}  # type -> (events, line indices)
    for typ in _KINDS:
        idx = np.flatnonzero(types == typ)
        kept[typ] = (list(map(decoded.__getitem__, idx.tolist())), ok_pos[idx].tolist())
    other = Counter(types.tolist()) if len(kept[TRAJECTORY_STEP][0]) < len(types) else Counter()
    other.pop(TRAJECTORY_STEP, None)
    blank = 0
    text: Counter = Counter()
    unusable: list[tuple[int, str, str]] = []
    for i in slow:
        if i in special:
            quarantined.append((first + i, special[i], ""))
            continue
        raw = bad_utf8.get(i, lines[i])
        kind, payload, typ = _slow_path(raw)
        if typ is not None and typ != TRAJECTORY_STEP:
            other[typ] += 1
        if kind == "blank":
            blank += 1
        elif kind == "text":
            text[payload] += 1
        elif kind == "event":
            kept[typ][0].append(payload)
            kept[typ][1].append(i)
        elif kind == "unusable":
            unusable.append((first + i, typ, payload))
        elif kind == "bad":
            quarantined.append((first + i, payload, _head(raw)))
    stem = file_stem(fname)
    table, refused, _ = _rows(TRAJECTORY_STEP, *kept[TRAJECTORY_STEP], stem, fname, first)
    quarantined += [(line_no, reason, _head(lines[i])) for i, line_no, reason in refused]
    keys = _key_hashes(table) if table is not None else np.empty(0, dtype=np.uint64)
    side, cut = {}, 0
    for typ in _SIDE_KINDS:
        side[typ], refused, n_cut = _rows(typ, *kept[typ], stem, fname, first)
        cut += n_cut
        unusable += [(line_no, typ, reason) for _, line_no, reason in refused]
    return _BlockResult(fname, len(lines), table, keys, quarantined, other, blank,
                        side[MODEL_ROUTING_DECISION], side[TOKEN_USAGE], side[AGENT_INSIGHT_EMITTED], cut,
                        sorted(unusable), (first, block.damaged) if block.damaged else None, text)


# Parquet encoding: dictionaries only where values repeat (ids, roles, models, flags; on
# timestamps, task ids and line numbers they cost time and save nothing), statistics only
# on the columns readers filter on. Measured: about a third less writing time, same size.
_DICTIONARY_COLUMNS = frozenset({
    "session_id", "session_id_source", "trace_id", "role", "model", "prompt_strategy_key", "failed_reason",
    "data_source", "source_file", "agent_role", "primary_model", "fallback_model", "selected_model",
    "matched_fallback_triggers", "policy_source", "agent", "verification_passed", "terminal", "timed_out",
    "verdict", "debug_status", "debug_retry", "insight_type", "severity",
    "primary_failure_count", "failure_count", "task_complexity_score"})
_STATISTICS_COLUMNS = ("timestamp_utc", "session_id", "source_file", "source_line")


class _ParquetOut:
    """One Parquet file written atomically, in row groups of about ROW_GROUP_ROWS rows.

    Row groups are encoded and written on ``pool``'s thread (pyarrow releases the GIL), at
    most one in flight per file, so writing overlaps decoding on a second core and memory
    stays bounded.
    """

    def __init__(self, stack: contextlib.ExitStack, dest: Path, schema: pa.Schema,
                 pool: ThreadPoolExecutor) -> None:
        tmp = stack.enter_context(artifacts.atomic_path(dest))
        self.writer = pq.ParquetWriter(
            tmp, schema, compression="snappy",
            use_dictionary=[c for c in schema.names if c in _DICTIONARY_COLUMNS],
            write_statistics=[c for c in schema.names if c in _STATISTICS_COLUMNS])
        stack.callback(self.close)  # closed before atomic_path fsyncs and renames
        self.pool = pool
        self.in_flight: Future | None = None
        self.pending: list[pa.Table] = []
        self.rows = 0
        self.pending_rows = 0

    def _wait(self) -> None:
        if self.in_flight is not None:
            fut, self.in_flight = self.in_flight, None
            fut.result()  # re-raises a failed write here

    def close(self) -> None:
        try:
            self._wait()
        finally:
            self.writer.close()

    def add(self, table: pa.Table | None) -> None:
        if table is None or not table.num_rows:
            return
        self.pending.append(table)
        self.rows += table.num_rows
        self.pending_rows += table.num_rows
        if self.pending_rows >= ROW_GROUP_ROWS:
            self.flush()

    def flush(self) -> None:
        if self.pending:
            self._wait()
            self.in_flight = self.pool.submit(self.writer.write_table, pa.concat_tables(self.pending))
            self.pending, self.pending_rows = [], 0


def ingest(config: IngestConfig, out_dir: str | Path, progress: Callable[[str], None] = log.info,
           progress_every_s: float = 5.0, setting: str = "log_dirs") -> IngestResult:
    """Ingest every journal under ``config.log_dirs`` into ``out_dir``: ``trajectories.parquet``,
    ``routing_decisions.parquet``, ``token_usage.parquet``, ``agent_insights.parquet`` and
    ``quarantine.jsonl`` (:data:`OUTPUT_FILES`). ``setting`` names the folders' setting in errors."""
    out_dir = Path(out_dir)
    files, skipped = discover_logs(config, setting)
    stats = IngestStats(files=[str(f) for f in files], skipped_paths=skipped)
    for sk in skipped:
        progress(f"WARNING: skipped {sk['path']}: {sk['reason']}")
    seen = _SeenKeys()
    t_start = last_report = time.perf_counter()
    traj_path, mrd_path, tu_path, ai_path, quar_path = (out_dir / n for n in OUTPUT_FILES)
    q_enc = msgspec.json.Encoder()

    def blocks() -> Iterator[_Block]:
        for path in files:
            try:
                size = os.path.getsize(path)
            except OSError:  # removed since it was listed: iter_blocks records it as unreadable
                size = -1
            stats.bytes_read += max(size, 0)
            if size == 0:
                stats.empty_files.append(str(path))
                continue
            yield from iter_blocks(path, config.max_line_bytes, config.read_chunk_bytes)

    results = (process_block(b, config.max_line_bytes) for b in blocks())

    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="ingest-parquet"))
        quar = stack.enter_context(artifacts.atomic_open(quar_path, "wb"))
        traj_out = _ParquetOut(stack, traj_path, TRAJECTORY_SCHEMA, pool)
        mrd_out = _ParquetOut(stack, mrd_path, ROUTING_DECISION_SCHEMA, pool)
        tu_out = _ParquetOut(stack, tu_path, TOKEN_USAGE_SCHEMA, pool)
        ai_out = _ParquetOut(stack, ai_path, AGENT_INSIGHT_SCHEMA, pool)
        for res in results:
            stats.lines_read += res.lines
            stats.blank_lines += res.blank_lines
            stats.text_lines.update(res.text_lines)
            stats.other_events.update(res.other_events)
            if res.damaged:
                stats.damaged_files.append({"file": res.fname, "line": res.damaged[0], "reason": res.damaged[1]})
                progress(f"WARNING: {res.fname}, line {res.damaged[0]}: {res.damaged[1]}")
            quarantined = res.quarantined
            if res.table is not None:
                table = _drop_duplicates(res.table, res.keys, seen, quarantined)
                traj_out.add(table)
                stats.count_steps(table)
            mrd_out.add(res.routing_decisions)
            tu_out.add(res.token_usage)
            ai_out.add(res.agent_insights)
            stats.content_previews_cut += res.previews_cut
            for line_no, typ, reason in res.unusable:
                stats.unusable_side_events[typ] += 1
                if len(stats.unusable_side_examples) < MAX_UNUSABLE_EXAMPLES:
                    stats.unusable_side_examples.append({"file": res.fname, "line": line_no, "type": typ,
                                                         "reason": reason})
            for line_no, reason, head in sorted(quarantined):
                stats.quarantined += 1
                stats.quarantine_reasons[_reason_class(reason)] += 1
                quar.write(q_enc.encode({"file": res.fname, "line": line_no, "reason": reason,
                                         "raw_head": head}))
                quar.write(b"\n")
            now = time.perf_counter()
            if now - last_report >= progress_every_s:
                el = now - t_start
                progress(f"ingest: {stats.lines_read:,} lines ({stats.lines_read / el:,.0f}/s, "
                         f"{stats.bytes_read / el / 1e6:,.1f} MB/s), {stats.steps_accepted:,} steps, "
                         f"{mrd_out.rows:,} routing decisions, {tu_out.rows:,} token usages, "
                         f"{ai_out.rows:,} agent insights, {stats.quarantined:,} quarantined; "
                         f"at {Path(res.fname).name}")
                last_report = now
        for out in (traj_out, mrd_out, tu_out, ai_out):
            out.flush()
        stats.routing_decisions, stats.token_usage, stats.agent_insights = mrd_out.rows, tu_out.rows, ai_out.rows
    stats.seconds = time.perf_counter() - t_start
    unusable = sum(stats.unusable_side_events.values())
    rate = stats.lines_read / max(stats.seconds, 1e-9)
    progress(f"ingest done: {stats.lines_read:,} lines from {len(files)} files in {stats.seconds:.1f}s "
             f"({rate:,.0f} lines/s); {stats.steps_accepted:,} steps accepted ({stats.steps_without_step:,} "
             f"without a logged step, {stats.steps_session_from_file_stem:,} with the file's stem as "
             "session), "
             f"{stats.routing_decisions:,} routing decisions, {stats.token_usage:,} token usages, "
             f"{stats.agent_insights:,} agent insights ({unusable:,} side events unusable), "
             f"{stats.quarantined:,} quarantined")
    return IngestResult(traj_path, quar_path, mrd_path, tu_path, ai_path, stats)


def _drop_duplicates(table: pa.Table, keys: np.ndarray, seen: "_SeenKeys",
                     quarantined: list[tuple[int, str, str]]) -> pa.Table:
    """``table`` without the steps whose key was accepted before (those go to ``quarantined``);
    the keys of the rest join ``seen``."""
    dup = _duplicates(keys, seen)
    if dup.any():
        for row in table.filter(pa.array(dup)).to_pylist():
            head = {k: row[k] for k in ("session_id", "task_id", "step", "role", "model", "timestamp")}
            quarantined.append((row["source_line"], _duplicate_reason(row), json.dumps(head)))
        table = table.filter(pa.array(~dup))
    seen.add(keys[~dup])
    return table


def _duplicate_reason(row: dict) -> str:
    if row["step"] is not None:
        return (f"duplicate TRAJECTORY_STEP: session_id={row['session_id']!r} task_id={row['task_id']!r} "
                f"step={row['step']} was already ingested")
    return (f"duplicate TRAJECTORY_STEP: session_id={row['session_id']!r} task_id={row['task_id']!r} "
            f"role={row['role']!r} timestamp={row['timestamp']!r} was already ingested "
            "(no step logged: the key is session, task, role and timestamp)")


def _duplicates(keys: np.ndarray, seen: "_SeenKeys") -> np.ndarray:
    """Rows whose key was accepted before, or appears earlier in this block."""
    _, first_idx = np.unique(keys, return_index=True)
    dup = np.ones(len(keys), dtype=bool)
    dup[first_idx] = False
    return dup | seen.contains(keys)


class _SeenKeys:
    """Hashes of every step key accepted so far: 8 bytes per row.

    Two sorted arrays: a large one merged rarely and a small recent one merged on every
    add, so a lookup is two binary searches.
    """

    def __init__(self) -> None:
        self.main = np.empty(0, dtype=np.uint64)
        self.recent = np.empty(0, dtype=np.uint64)

    @staticmethod
    def _in(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
        if not len(sorted_keys):
            return np.zeros(len(keys), dtype=bool)
        at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
        return sorted_keys[at] == keys

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self._in(self.main, keys) | self._in(self.recent, keys)

    def add(self, keys: np.ndarray) -> None:
        self.recent = np.sort(np.concatenate([self.recent, keys]))
        if len(self.recent) > max(1 << 16, len(self.main) // 8):
            self.main = np.sort(np.concatenate([self.main, self.recent]))
            self.recent = np.empty(0, dtype=np.uint64)


_KEY_STEP, _KEY_TIME = pa.scalar("s"), pa.scalar("t")


def _key_hashes(table: pa.Table) -> np.ndarray:
    """64-bit hashes of each step's key, vectorised: (session_id, task_id, step) when the step
    is logged, else (session_id, task_id, role, timestamp as UTC microseconds)."""
    sid, tid, step = table["session_id"], table["task_id"], table["step"]
    by_step = pc.binary_join_element_wise(_KEY_STEP, sid, tid, pc.cast(step, pa.string()), "\x1f")
    if step.null_count:
        ts = pc.cast(pc.cast(table["timestamp_utc"], pa.int64()), pa.string())
        by_time = pc.binary_join_element_wise(_KEY_TIME, sid, tid, table["role"], ts, "\x1f")
        by_step = pc.coalesce(by_step, by_time)
    return pd.util.hash_array(by_step.to_numpy(zero_copy_only=False), categorize=False)


def _reason_class(reason: str) -> str:
    """A short class for counting reasons in metadata."""
    for prefix, cls in (("not valid UTF-8", "non_utf8"), ("invalid JSON", "invalid_json"),
                        ("not a JSON object", "not_an_object"),
                        ("missing or non-string field 'type'", "no_type"),
                        ("wrong type", "wrong_type"), ("missing field", "missing_field"),
                        ("empty field", "missing_field"), ("field timestamp", "bad_timestamp"),
                        ("duplicate", "duplicate"), ("line is", "line_too_long"),
                        ("JSON nested too deeply", "too_deep"), ("a field is nested too deeply", "too_deep"),
                        ("a string is not valid Unicode", "lone_surrogate"),
                        ("an integer does not fit", "integer_overflow"), ("a value cannot be stored", "unstorable"),
                        ("the file", "unreadable_file")):
        if reason.startswith(prefix):
            return cls
    if "not finite" in reason:
        return "non_finite"
    if "outside" in reason:
        return "out_of_range"
    return "other"
