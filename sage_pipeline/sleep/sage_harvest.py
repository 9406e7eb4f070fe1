"""Harvest sleep-cycle tasks from what SAGE's ``sage run`` leaves behind: its workspaces and journals.

What one ``sage run "<goal>"`` writes, read in SAGE's code (``../shared/upstream/sage``, commit 83287e4):

* **The journal**, ``<workspace>/memory/sessions/<YYYY-MM-DD>.log`` (rotated ``<date>.<N>.log``): one JSON
  object per line, ``{"type", "timestamp", ...payload, "session_id"}`` (``log_event``,
  observability/structured_logger.py; ``cmd_run`` sets a fresh ``SAGE_SESSION_ID`` per run,
  cli/run_cmd.py:130-132, and ``trace_id`` when the caller sets ``SAGE_TRACE_ID``), plus the
  workflow's plain-text ``CHECKPOINT`` / ``TOKEN_SUMMARY`` lines. Read by the routing ingest's
  reader (:func:`~sage_pipeline.routing.ingest.iter_blocks`, in :func:`~sage_pipeline.routing.ingest.journal_order`).
  The events read here:

  - ``TOOL_EXECUTED`` ``{task_id, operation, file, tool_status}``: every patch ``tool_executor``
    applied (workflow.py ~1690). It does not say which agent wrote it: the agent's own insight just
    before it does. The test engineer's is ``AGENT_INSIGHT_EMITTED`` ``"Generated test PatchRequest:
    file=<f>"`` (agents/test_engineer.py:224); every other ``ok`` write is the task's source artifact
    (``artifacts_by_task``: workflow.py ~1705, the last write whose source is not the test engineer).
  - ``TRAJECTORY_STEP``: the reviewer's verdicts (``verdict`` PASS/FAIL; the gate's pass is the
    reviewer's terminal step with ``state.verification_passed: true``, written after "All gates
    passed", workflow.py ~2027), the debugger's repairs (``state.debug_status``, ``debug_retry``,
    workflow.py ~2247) and the circuit breaker's end (agent ``orchestrator``, terminal,
    ``state.failed_reason`` ``retry_limit`` / ``timeout``, workflow.py ~2347, ~2377).
  - ``AGENT_INSIGHT_EMITTED`` from agent ``verifier``: the gate's verification command failed
    (``"Verification failed (rc=N): ..."``, workflow.py ~1985); the planner's ``"Planner DAG ready with N
    node(s)."`` (agents/planner.py:756).
  - ``SKILL_INJECTION`` ``{agent_role, skill_ids, content_sha256_16, per_skill_chars}``: one per role call
    whose prefix got skills (prompt_engine/skill_injector.py:258; no task id): which version (the sha256
    of the injected, capped text, first 16 hex) of which skill each call saw.

* **The workspace**: the files the patches wrote (the coder's module, ``tests/test_<stem>.py`` from the
  test engineer, relative to the workspace: ``sage run`` works in its cwd), ``memory/system_state.json``,
  ``.sage/last_run_metrics.json`` (its ``run_id`` is the last run's session id), ``memory/tasks.db``.

What ``sage run`` does **not** write, so the harvest cannot read it there:

* **The goal.** The CLI's task string lives only in the run's state (``user_prompt``, cli/run_cmd.py:140):
  no event carries it, and ``memory/handoff.json`` (which would) is written only when a run is
  interrupted and removed by the next clean end. Goals come from a **goal ledger** the caller keeps
  (JSON lines ``{"session_id" or "trace_id": ..., "goal": ...}``: the session id from the run's journal
  lines or its ``.sage/last_run_metrics.json``, or a ``SAGE_TRACE_ID`` the caller set);
  :func:`write_goal_ledger`. A session without one is counted ``goal_not_found``.
* **The verification command.** The gate runs the planner's ``task.verification``
  (``VerificationEngine().run``, workflow.py ~1970); the DAG is written to ``.sage/last_plan.json``
  only in research mode or ``--plan-only``, never by ``sage run --auto``. What the journal shows is the
  gate's own rule: before it runs the command, ``tests/test_<artifact stem>.py`` must exist and be
  non-empty, else it asks the test engineer for it (workflow.py ~1895-1950). That file is the task's
  reference, judged by the command a coder task's plan carries, ``python -m pytest -q
  tests/test_<stem>.py`` (:func:`gate_command`; ``meta["sage"]["verification_command"]``, with why).

**A task** is one session (one ``sage run``) with exactly one task whose source artifact is a Python
module, that reached SAGE's gate: its ``intent`` is the goal; its reference (``unit_tests``) is the gate's
test file **unchanged**, run as SAGE's gate runs it: a workspace test (:mod:`sage_pipeline.sleep.records`)
that writes the answer's code to SAGE's file (the artifact's path), the test file to
``tests/test_<stem>.py`` beside it, and runs SAGE's verification command there in the sandbox (pytest,
fixtures, ``TestClient`` and all: the image carries what SAGE's templates steer its agents to,
``sim/README.md``), passing on exit 0; :func:`read_gate_tests` reads only the names the tests import
(``entry_point``, the first), the tests and the asserts from it. ``meta["sage"]`` holds the verdicts (verified or not,
reviews, verification failures, debugger calls and repairs), the skill versions each role call saw, the
goal's source and the provenance (workspace, journal file and line of every fact, session id).

**The reference is validated**: when SAGE's gate passed the task, its tests must pass the code SAGE
ended with (the artifact as the journal last wrote it, still on disk), run in the same sandbox the
unit-test judge uses (:class:`~sage_pipeline.sleep.judges.UnitTestJudge`); a task whose test file pytest
cannot collect there (an import the image lacks: pytest's exit 2-5) is counted ``tests_not_runnable``, one
whose tests fail it ``reference_not_reproducible`` (a test that depended on the workspace, or on a version
of a package the image has another of). A task the gate never passed has no code its tests are known to
accept: it is counted
``gate_never_passed`` unless ``keep_unverified`` (then kept, marked unvalidated).

**A workspace is hostile** (an LLM wrote it): every file the harvest reads from it goes through the guard
(:mod:`sage_pipeline.untrusted`): inside the workspace with links resolved, a regular file (a FIFO or a
device is never opened), a test or code file at most ``max_file_bytes``. The code must be named inside the
workspace (``code_outside_workspace``: an absolute or ``../`` path in the journal, or a link out); a refused
test or code file is ``unsafe_tests_file`` / ``unsafe_code_file``, a refused journal is listed in
``missing``; each with the guard's message (file, root, reason) and counted by the guard's reason in
``unsafe``. The validation's sandbox is opened for untrusted code (:func:`untrusted_judge`): Docker, or the
local backend only with ``allow_untrusted_local``.

Everything that does not become a task is counted by one reason (:data:`REASONS`, the first that
applies, in that order); ``sessions == tasks + sum(reasons)``. Damaged journal lines are quarantined
with file, line and reason, and a damaged file, line or missing folder never stops the harvest.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import inspect
import json
import os
import re
import stat
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts, untrusted as ut
from sage_pipeline.routing.ingest import SAGE_TEXT_LINES, IngestConfig, discover_logs, iter_blocks, journal_order
from sage_pipeline.sage.table import ROLES
from sage_pipeline.sim.runner import workspace_problem
from sage_pipeline.sim.sandbox import SandboxConfig
from sage_pipeline.sleep.records import (
    DEFAULT_SPLIT,
    Quarantined,
    SplitSpec,
    TaskRecord,
    TaskRecordError,
    task_from_dict,
)

if TYPE_CHECKING:  # the judge (and its sandbox) is imported only when validation runs
    from sage_pipeline.sleep.judges import UnitTestJudge

# Why a session is not a task: the first that applies, in this order.
REASONS: dict[str, str] = {
    "no_workspace": "its journal lies under none of the workspaces given: the files it wrote cannot be read",
    "no_code_task": "no task of the run wrote a Python module (a plan-only, documentation or failed-coder run)",
    "several_code_tasks": "more than one task wrote a Python module: the unit-test judge runs one module per task",
    "role_not_called": "the role being harvested for was never called in the run",
    "journal_ends_before_gate": "the journal ends before SAGE's gate passed the code task or its circuit breaker "
                                "ended it (an interrupted or killed run, or a truncated journal)",
    "gate_never_passed": "SAGE's circuit breaker ended the task: no code is known to pass its tests "
                         "(kept, unvalidated, with keep_unverified)",
    "goal_not_found": "no goal for the session in the goal ledgers (SAGE logs none)",
    "code_outside_workspace": "the journal names the code SAGE ended with outside the workspace (an absolute or "
                              "../ path, or through a link out): never read",
    "no_tests_written": "no journal line shows SAGE's test engineer writing the gate's test file",
    "tests_not_from_test_engineer": "the gate's test file was last written by another agent (the coder or the "
                                    "debugger) before the gate's verdict",
    "tests_overwritten_later": "a later write replaced the gate's test file: the tests the gate ran are gone",
    "tests_missing_on_disk": "the gate's test file is not in the workspace any more",
    "unsafe_tests_file": "the gate's test file is not a regular file inside the workspace within max_file_bytes (a "
                         "link out or dangling, a FIFO, a device, too large: the guard's reason in the detail); "
                         "never read",
    "tests_not_runnable": "pytest cannot run the gate's test file: not valid Python, or, found when validation runs "
                          "it on SAGE's verified code in the sandbox, pytest could not collect it there (an import "
                          "the sandbox image lacks, a collection error, no test collected: pytest's exit code and "
                          "words in the detail)",
    "tests_assert_nothing": "the tests assert nothing: any importable code would pass them",
    "code_overwritten_later": "a later write replaced the code SAGE ended with: the reference cannot be validated",
    "code_missing_on_disk": "the code SAGE ended with is not in the workspace any more",
    "unsafe_code_file": "the code SAGE ended with is not a regular file inside the workspace within max_file_bytes "
                        "(a link out or dangling, a FIFO, a device, too large: the guard's reason in the detail); "
                        "never read",
    "reference_not_reproducible": "the tests fail SAGE's own verified code in the sandbox",
    "duplicate_task": "the same goal, or the same tests of the same entry point, was harvested from an earlier run",
}
TEST_ENGINEER_WROTE = re.compile(r"Generated test PatchRequest: file=(?P<file>.+)")  # agents/test_engineer.py:224
DAG_READY = re.compile(r"Planner DAG ready with (?P<n>\d+) node\(s\)\.")  # agents/planner.py:756
VERIFICATION_FAILED = "Verification failed"  # workflow.py ~1985, the verifier's risk insight
VERIFICATION_COMMAND_WHY = ("SAGE logs no verification command: its gate runs the planner's task.verification "
                            "(orchestrator/workflow.py verification_gate), and `sage run --auto` writes the plan "
                            "nowhere; the judge runs the gate's test file as a coder task's plan does "
                            "(`python -m pytest -q tests/test_<module>.py`, gate_command)")
# pytest's exit codes 2, 4 and 5 (errors during collection, usage error, no tests collected), as the sandbox's
# workspace job names them (sim/runner.py _judge_workspace): the file could not be run at all. Not 3 (pytest's
# internal error): code that exhausts the memory takes pytest down with it, a verdict on the code.
NOT_COLLECTED = re.compile(r"exit [245] \(pytest: ")


class SageHarvestError(ValueError):
    """The harvest was asked something it cannot do (an unknown role); the message says what to do."""


class SageHarvestConfig(BaseModel):
    """How tasks are harvested from SAGE's workspaces and journals (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    goal_ledgers: tuple[Path, ...] = Field((), description="JSON-lines files {\"session_id\" or \"trace_id\", "
                                           "\"goal\"} written by whoever started `sage run` (SAGE logs no goal)")
    validate_reference: bool = Field(True, description="run each verified task's tests against the code SAGE ended "
                                     "with in the sandbox; a task they fail is counted reference_not_reproducible")
    sandbox: Literal["docker", "local"] = Field("docker", description="where validation runs SAGE's tests and code "
                                                "(model-written: the sandbox is opened untrusted): 'docker' "
                                                "(isolated) or 'local' (unisolated: refused unless "
                                                "allow_untrusted_local)")
    allow_untrusted_local: bool = Field(False, description="let sandbox 'local' run SAGE's model-written tests and "
                                        "code. RISK: unisolated, they run as you and can read or write whatever you "
                                        "can (a hostile test can write files on this machine); only for a throwaway "
                                        "machine or workspaces whose code you trust (the model world's)")
    max_file_bytes: int = Field(ut.DEFAULT_MAX_BYTES, ge=1, description="the largest test file or code file read "
                                "from a workspace; a larger one is counted unsafe_tests_file / unsafe_code_file "
                                "(too_large) and never read")
    sandbox_workers: int = Field(SandboxConfig.model_fields["workers"].default, ge=1,
                                 description="sandbox workers for validation (default: the sandbox's own)")
    local_python: str | None = Field(None, min_length=1, description="sandbox 'local' only: the interpreter that runs "
                                     "SAGE's verification command (SAGE's own virtualenv's, which has what its tests "
                                     "import: FastAPI, httpx); null: the pipeline's own. Docker runs the image's")
    timeout_s: float = Field(10.0, gt=0, le=120, description="the sandbox's limit for a task's verification command "
                             "(pytest's start included), seconds")
    keep_unverified: bool = Field(False, description="keep tasks SAGE's circuit breaker ended (their tests are "
                                  "unvalidated: no code is known to pass them)")
    since: datetime | None = Field(None, description="only runs that started at or after this time (UTC if naive)")
    until: datetime | None = Field(None, description="only runs that started before this time (UTC if naive)")
    split: SplitSpec = Field(DEFAULT_SPLIT, description="shares of train and val (a task's split is a hash of its id)")
    max_line_bytes: int = Field(1 << 20, ge=1024, description="longer journal lines are quarantined, never held whole")
    read_chunk_bytes: int = Field(1 << 21, ge=1, description="bytes read from a journal at a time")
    max_listed: int = Field(20, ge=0, description="examples kept per reason and of quarantined lines")


@dataclass
class SageHarvestResult:
    tasks: list[TaskRecord] = field(default_factory=list)
    sessions: int = 0  # `sage run`s read (inside the window): tasks + sum(reasons)
    reasons: Counter = field(default_factory=Counter)  # reason -> sessions
    examples: dict[str, list[dict]] = field(default_factory=dict)  # reason -> first max_listed {session, where, detail}
    quarantined: list[Quarantined] = field(default_factory=list)  # first max_listed journal / ledger lines
    quarantined_lines: int = 0
    journal_files: list[str] = field(default_factory=list)
    lines: int = 0
    text_lines: Counter = field(default_factory=Counter)  # SAGE's plain-text lines, by kind
    lines_without_session: int = 0  # JSON events with no session_id: not written by `sage run`
    outside_window: int = 0  # sessions left out by since / until (not in ``sessions``)
    missing: list[dict] = field(default_factory=list)  # {path, reason}: folders and files that could not be read
    unsafe: Counter = field(default_factory=Counter)  # the guard's reason -> workspace files refused (never read)
    goals: int = 0  # goal ledger entries read
    validated: int = 0  # tasks whose tests passed SAGE's verified code in the sandbox
    seconds: float = 0.0

    def count(self, reason: str, session: str, where: str, detail: str, max_listed: int) -> None:
        self.reasons[reason] += 1
        ex = self.examples.setdefault(reason, [])
        if len(ex) < max_listed:
            ex.append({"session": session, "where": where, "detail": detail})

    def quarantine(self, q: Quarantined, max_listed: int) -> None:
        self.quarantined_lines += 1
        if len(self.quarantined) < max_listed:
            self.quarantined.append(q)

    def summary(self) -> dict:
        return {"sessions": self.sessions, "tasks": len(self.tasks), "validated": self.validated,
                "reasons": dict(self.reasons), "quarantined_lines": self.quarantined_lines,
                "journal_files": len(self.journal_files), "lines": self.lines, "text_lines": dict(self.text_lines),
                "lines_without_session": self.lines_without_session, "outside_window": self.outside_window,
                "missing": self.missing, "unsafe": dict(self.unsafe), "goals": self.goals,
                "seconds": round(self.seconds, 3)}

    def refused(self, e: ut.Untrusted) -> str:
        """Count a file the guard refused by its reason; the refusal's message (file, root, reason, what to do)."""
        self.unsafe[e.reason] += 1
        return str(e)


# ---------------------------------------------------------------- the goal ledger
def write_goal_ledger(path: str | os.PathLike[str], entries: Iterable[dict]) -> Path:
    """Write a goal ledger atomically: one ``{"session_id" or "trace_id", "goal"}`` per entry (other keys kept)."""
    lines = []
    for i, e in enumerate(entries):
        if not isinstance(e.get("goal"), str) or not e["goal"].strip():
            raise SageHarvestError(f"goal ledger entry {i}: 'goal' must be a non-empty string, got {e.get('goal')!r}")
        if not any(isinstance(e.get(k), str) and e[k] for k in ("session_id", "trace_id")):
            raise SageHarvestError(f"goal ledger entry {i}: needs a 'session_id' or a 'trace_id' (SAGE's run id)")
        lines.append(json.dumps(e, ensure_ascii=False))
    return artifacts.write_text(path, "".join(line + "\n" for line in lines))


def read_goal_ledgers(paths: Sequence[Path], out: SageHarvestResult, max_listed: int
                      ) -> dict[tuple[str, str], tuple[str, str]]:
    """(``"session_id"`` or ``"trace_id"``, id) -> (goal, ``file:line``); bad lines are quarantined and
    missing files listed."""
    goals: dict[tuple[str, str], tuple[str, str]] = {}
    for path in paths:
        path = Path(path)
        if not path.is_file():
            out.missing.append({"path": str(path), "reason": "goal ledger not found (no goals read from it)"})
            continue
        with open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                if not raw.strip():
                    continue
                why, entry = _ledger_entry(raw)
                if entry is None:
                    out.quarantine(Quarantined(str(path), lineno, why, "line"), max_listed)
                    continue
                for key in ("session_id", "trace_id"):
                    if isinstance(entry.get(key), str) and entry[key]:
                        k = (key, entry[key])
                        if k in goals and goals[k][0] != entry["goal"]:
                            out.quarantine(Quarantined(str(path), lineno, f"{key} {entry[key]} already has another "
                                                       f"goal at {goals[k][1]}: one goal per run", key), max_listed)
                            continue
                        goals.setdefault(k, (entry["goal"], f"{path}:{lineno}"))
                        out.goals += 1
    return goals


def _ledger_entry(raw: bytes) -> tuple[str, dict | None]:
    try:
        entry = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        return f"not UTF-8 (byte 0x{raw[e.start]:02x} at column {e.start + 1})", None
    except json.JSONDecodeError as e:
        return f"invalid JSON ({e.msg} at column {e.colno})", None
    if not isinstance(entry, dict):
        return f"not a JSON object (got {type(entry).__name__})", None
    if not isinstance(entry.get("goal"), str) or not entry["goal"].strip():
        return "field 'goal' missing or empty: the goal `sage run` was given", None
    if not any(isinstance(entry.get(k), str) and entry[k] for k in ("session_id", "trace_id")):
        return "needs a non-empty 'session_id' or 'trace_id' naming the run", None
    return "", entry


# ---------------------------------------------------------------- reading SAGE's journals
class _Envelope(msgspec.Struct):
    type: str
    timestamp: str | None = None
    session_id: str | None = None
    trace_id: str | None = None


class _Tool(msgspec.Struct):
    task_id: str = ""
    operation: str = ""
    file: str = ""
    tool_status: str = ""


class _Insight(msgspec.Struct):
    task_id: str = ""
    agent: str = ""
    insight_type: str = ""
    content_preview: str = ""


class _Skills(msgspec.Struct):
    agent_role: str = ""
    skill_ids: list[str] = []
    content_sha256_16: list[str] = []


class _Step(msgspec.Struct):
    task_id: str
    agent: str
    terminal: bool = False
    verdict: str | None = None
    state: dict = {}


_ENVELOPE = msgspec.json.Decoder(_Envelope).decode
_PAYLOADS = {"TOOL_EXECUTED": msgspec.json.Decoder(_Tool).decode,
             "AGENT_INSIGHT_EMITTED": msgspec.json.Decoder(_Insight).decode,
             "SKILL_INJECTION": msgspec.json.Decoder(_Skills).decode,
             "TRAJECTORY_STEP": msgspec.json.Decoder(_Step).decode}


@dataclass
class _Write:
    pos: int  # order within the workspace's journals
    session: str
    task: str
    file: str  # normalised, relative to the workspace
    op: str
    writer: str  # "test_engineer" or "source"
    where: str


@dataclass
class _Session:
    sid: str
    workspace: Path | None
    first: str  # file:line of its first event
    start: datetime | None
    trace_id: str = ""
    last: str = ""
    last_pos: int = 0
    files: list[str] = field(default_factory=list)
    dag_nodes: int | None = None
    te_named: dict[str, tuple[str, int]] = field(default_factory=dict)  # task -> (file the TE named, pos)
    source_writes: dict[str, list[_Write]] = field(default_factory=dict)  # task -> its non-test-engineer writes
    steps: dict[str, list[tuple[int, str, _Step]]] = field(default_factory=dict)  # task -> (pos, where, step)
    verification_failures: Counter = field(default_factory=Counter)  # task -> the gate's failed commands
    skills: list[dict] = field(default_factory=list)  # one per role call: {role, at, skills: {id: sha16}}
    roles: set[str] = field(default_factory=set)
    damaged_lines: int = 0  # lines of this session with a known type but unusable fields


@dataclass
class _Workspace:
    path: Path | None
    files: list[Path] = field(default_factory=list)
    writes: dict[str, list[_Write]] = field(default_factory=dict)  # file -> its ok writes, in writing order
    sessions: dict[str, _Session] = field(default_factory=dict)


def _norm(file: str) -> str:
    return os.path.normpath(file.strip()) if file.strip() else ""


def _parse_ts(ts: str | None) -> datetime | None:
    if not ts:
        return None
    try:
        dt = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _bad_line_reason(line: bytes) -> str:
    """Why a journal line that is not one of SAGE's events cannot be read (SAGE's text lines are not asked)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"not valid UTF-8: byte 0x{line[e.start]:02x} at offset {e.start}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        return f"invalid JSON (truncated or malformed): {e.msg} (column {e.colno})"
    except (RecursionError, ValueError) as e:
        return f"invalid JSON: {type(e).__name__}"
    if not isinstance(obj, dict):
        return f"not a JSON object (got {type(obj).__name__})"
    return "missing or non-string field 'type'"


def _read_workspace(ws: _Workspace, out: SageHarvestResult, cfg: SageHarvestConfig) -> None:
    """Every line of the workspace's journals, in SAGE's writing order, into its sessions and writes."""
    pos = 0
    for path in ws.files:
        out.journal_files.append(str(path))
        for block in iter_blocks(path, cfg.max_line_bytes, cfg.read_chunk_bytes):
            if block.damaged:
                out.quarantine(Quarantined(block.fname, block.first, block.damaged, "file"), cfg.max_listed)
                continue
            too_long = dict(block.too_long)
            for i, line in enumerate(block.split()):
                lineno, pos = block.first + i, pos + 1
                out.lines += 1
                where = f"{block.fname}:{lineno}"
                if lineno in too_long:
                    out.quarantine(Quarantined(block.fname, lineno, f"line of {too_long[lineno]:,} bytes is over "
                                               f"max_line_bytes ({cfg.max_line_bytes:,}): skipped unread", "line"),
                                   cfg.max_listed)
                    continue
                if not line.strip():
                    continue
                if line[:1] == b"[":
                    kind = next((k for k, p in SAGE_TEXT_LINES.items()
                                 if p.fullmatch(line.decode("utf-8", "replace").rstrip("\r"))), None)
                    if kind is not None:
                        out.text_lines[kind] += 1
                        continue
                try:
                    env = _ENVELOPE(line)
                except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                    out.quarantine(Quarantined(block.fname, lineno, _bad_line_reason(line), "line"), cfg.max_listed)
                    continue
                if not env.session_id:
                    out.lines_without_session += 1
                    continue
                s = ws.sessions.get(env.session_id)
                if s is None:
                    s = ws.sessions[env.session_id] = _Session(env.session_id, ws.path, where,
                                                               _parse_ts(env.timestamp))
                s.last, s.last_pos = where, pos
                if str(path) not in s.files:
                    s.files.append(str(path))
                if env.trace_id and not s.trace_id:
                    s.trace_id = env.trace_id
                decode = _PAYLOADS.get(env.type)
                if decode is None:
                    continue
                try:
                    payload = decode(line)
                except (msgspec.DecodeError, msgspec.ValidationError) as e:
                    s.damaged_lines += 1
                    out.quarantine(Quarantined(block.fname, lineno, f"{env.type} with a field SAGE never writes so: "
                                               f"{e}", "line"), cfg.max_listed)
                    continue
                _take(ws, s, env.type, payload, pos, where)


def _take(ws: _Workspace, s: _Session, typ: str, p, pos: int, where: str) -> None:
    if typ == "SKILL_INJECTION":
        s.roles.add(p.agent_role)
        s.skills.append({"role": p.agent_role, "at": where,
                         "skills": dict(zip(p.skill_ids, p.content_sha256_16, strict=False))})
    elif typ == "AGENT_INSIGHT_EMITTED":
        if p.agent:
            s.roles.add(p.agent)
        if p.agent == "test_engineer" and (m := TEST_ENGINEER_WROTE.fullmatch(p.content_preview.strip())):
            s.te_named[p.task_id] = (_norm(m["file"]), pos)
        elif p.agent == "planner" and (m := DAG_READY.fullmatch(p.content_preview.strip())):
            s.dag_nodes = int(m["n"])
        elif p.agent == "verifier" and p.content_preview.startswith(VERIFICATION_FAILED):
            s.verification_failures[p.task_id] += 1
    elif typ == "TOOL_EXECUTED":
        named = s.te_named.pop(p.task_id, None)  # the test engineer's patch is the next one applied
        if p.tool_status != "ok" or not p.file.strip():
            return
        f = _norm(p.file)
        writer = "test_engineer" if named is not None and named[0] == f else "source"
        w = _Write(pos, s.sid, p.task_id, f, p.operation, writer, where)
        ws.writes.setdefault(f, []).append(w)
        if writer == "source":
            s.source_writes.setdefault(p.task_id, []).append(w)
    elif typ == "TRAJECTORY_STEP":
        s.steps.setdefault(p.task_id, []).append((pos, where, p))


# ---------------------------------------------------------------- SAGE's tests, run as SAGE's gate runs them
class NotRunnable(ValueError):
    """A test module pytest cannot run (not valid Python, nested past what the parser takes); the message names
    the line and why."""


@dataclass(frozen=True)
class GateTests:
    """What the harvest reads from the gate's test module before it is run unchanged (never rewritten)."""

    entry_point: str  # the first name the tests take from the module under test (what the replay's prompt names)
    imports: tuple[str, ...]  # every name they take from it, in source order
    names: tuple[str, ...]  # the tests pytest would collect, as written (``test_a``, ``TestA.test_b``)
    asserts: int  # assert statements, unittest's assert* and fail, pytest.raises / warns / fail, raise AssertionError


def module_names(artifact: str) -> set[str]:
    """The names a test may import the artifact by: ``src/app.py`` -> {app, src.app}."""
    p = Path(artifact).with_suffix("")
    parts = [x for x in p.parts if x not in (".", "")]
    names = {p.name, ".".join(parts)}
    if parts and parts[0] == "src":
        names.add(".".join(parts[1:]))
    return {n for n in names if n}


def gate_command(test_file: str) -> str:
    """SAGE's verification command for the gate's test file: the plan's ``verification`` of a coder task
    (the model world's planner writes exactly this; SAGE's planner template asks for pytest on the test file)."""
    return f"python -m pytest -q {test_file}"


def _asserting(n: ast.AST) -> bool:
    if isinstance(n, ast.Assert):
        return True
    if isinstance(n, ast.Raise) and isinstance(n.exc, ast.Call | ast.Name):
        return "AssertionError" in ast.unparse(n.exc)
    if not isinstance(n, ast.Call):
        return False
    f = n.func
    name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
    return name.startswith("assert") or name in ("fail", "raises", "warns", "deprecated_call")


def read_gate_tests(source: str, artifact: str, where: str = "") -> GateTests:
    """The gate's test module as SAGE's test engineer wrote it: the names it takes from the module under test
    (``from m import f``, ``import m as x`` then ``x.f``), the tests pytest would collect and its asserts; it is
    run unchanged. Raises :class:`NotRunnable` (line and why) for a module pytest could not even parse."""
    at = f"{where}:" if where else "line "
    try:
        tree = ast.parse(source)
    except SyntaxError as e:  # a NUL byte is one too, with no line
        raise NotRunnable(f"{at}{e.lineno or 1}: not valid Python ({e.msg})") from e
    except (ValueError, RecursionError, MemoryError) as e:  # a NUL byte (older Pythons); nested too deeply
        raise NotRunnable(f"{at}1: not valid Python or nested too deeply to read ({type(e).__name__})") from None
    try:
        return _read_gate_tests(tree, artifact)
    except (RecursionError, MemoryError) as e:  # a hostile file nested past what a walk takes
        raise NotRunnable(f"{at}1: nested too deeply to read ({type(e).__name__})") from None


def _read_gate_tests(tree: ast.Module, artifact: str) -> GateTests:
    mods = module_names(artifact)
    imports: dict[str, int] = {}  # name taken from the module under test -> line
    aliases: set[str] = set()  # `import mod as m`
    nodes = list(ast.walk(tree))
    for n in nodes:
        if isinstance(n, ast.ImportFrom) and n.level == 0 and n.module in mods:
            for a in n.names:
                if a.name != "*":
                    imports[a.name] = min(imports.get(a.name, n.lineno), n.lineno)
        elif isinstance(n, ast.Import):
            aliases.update(a.asname or a.name for a in n.names if a.name in mods)
    for n in nodes:  # `import mod as m`: the names the tests use on it
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in aliases:
            imports[n.attr] = min(imports.get(n.attr, n.lineno), n.lineno)
    names = []
    for n in tree.body:
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name.startswith("test"):
            names.append(n.name)
        elif isinstance(n, ast.ClassDef):
            names += [f"{n.name}.{m.name}" for m in n.body
                      if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef) and m.name.startswith("test")]
    ordered = tuple(sorted(imports, key=lambda k: imports[k]))
    stem = re.sub(r"\W", "_", Path(artifact).stem) or "module"
    entry = next((k for k in ordered if k.isidentifier()), stem if stem.isidentifier() else f"m_{stem}")
    return GateTests(entry, ordered, tuple(names), sum(map(_asserting, nodes)))


# ---------------------------------------------------------------- sessions to tasks
@dataclass
class _Candidate:
    session: _Session
    record: TaskRecord | None  # None once validation failed
    code: str | None  # SAGE's verified code, to validate the reference against (None: not validated)
    tests_key: str


def _is_test_file(f: str) -> bool:
    name = Path(f).name.lower()
    return name.startswith("test_") or name.endswith("_test.py")


def _later_write(ws: _Workspace, file: str, after: int) -> _Write | None:
    writes = ws.writes.get(file, [])
    i = bisect.bisect_right([w.pos for w in writes], after)
    return writes[i] if i < len(writes) else None


def _last_write_before(ws: _Workspace, file: str, before: int) -> _Write | None:
    writes = ws.writes.get(file, [])
    i = bisect.bisect_left([w.pos for w in writes], before)
    return writes[i - 1] if i else None


def _verdicts(s: _Session, task: str) -> tuple[dict, tuple[int, str] | None]:
    """The task's verdicts as its steps say, and (pos, where) of its terminal step (None: the journal ends first)."""
    reviews, debugger, repairs, end, v = [], 0, 0, None, {"verified": None, "failed_reason": None}
    for pos, where, st in s.steps.get(task, []):
        if st.agent == "reviewer" and st.verdict in ("PASS", "FAIL"):
            reviews.append({"verdict": st.verdict, "at": where})
            if st.terminal and st.state.get("verification_passed") is True:
                v["verified"], end = True, (pos, where)
                break
        elif st.agent == "debugger":
            debugger += 1
            repairs += st.state.get("debug_status") == "patch_ready"
        elif st.agent == "orchestrator" and st.terminal:
            v.update(verified=False, failed_reason=st.state.get("failed_reason"))
            end = (pos, where)
            break
    v.update(reviews=reviews, reviewer_fails=sum(r["verdict"] == "FAIL" for r in reviews),
             verification_failures=s.verification_failures.get(task, 0), debugger_calls=debugger, repairs=repairs,
             terminal_step=end[1] if end else None)
    return v, end


def _skills_by_role(s: _Session) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    for call in s.skills:
        for sid, sha in call["skills"].items():
            shas = out.setdefault(call["role"], {}).setdefault(sid, [])
            if sha not in shas:
                shas.append(sha)
    return out


def _read_text(root: Path, file: str, max_bytes: int, out: SageHarvestResult) -> tuple[str | None, str, bool]:
    """(the text, "", False), or (None, why, unsafe): a file of the workspace read through the guard
    (:mod:`sage_pipeline.untrusted`); ``unsafe`` when the guard refused it (counted in ``out.unsafe``) for
    anything but its absence."""
    try:
        return ut.read_bytes(root, root / file, max_bytes).decode("utf-8"), "", False  # named in full when refused
    except ut.Untrusted as e:
        if e.reason == "missing":
            return None, "missing", False
        return None, out.refused(e), True
    except UnicodeDecodeError as e:
        return None, f"not UTF-8 (byte at offset {e.start})", False


def _candidate(ws: _Workspace, s: _Session, role: str, goals: dict, cfg: SageHarvestConfig, out: SageHarvestResult
               ) -> tuple[_Candidate | None, str, str, str]:
    """The session as a task, or (None, reason, where, detail)."""
    if ws.path is None:
        return None, "no_workspace", s.first, f"journal {s.files[0]}"
    code_tasks = {}
    for task, writes in s.source_writes.items():
        last = writes[-1]
        if last.file.endswith(".py") and not _is_test_file(last.file) and last.op != "delete":
            code_tasks[task] = writes
    if not code_tasks:
        return None, "no_code_task", s.first, f"{s.dag_nodes} planned node(s)" if s.dag_nodes is not None else ""
    if len(code_tasks) > 1:
        return None, "several_code_tasks", s.first, ", ".join(f"{t}: {w[-1].file}" for t, w in code_tasks.items())
    task, writes = next(iter(code_tasks.items()))
    if role not in s.roles:
        return None, "role_not_called", s.first, f"roles called: {', '.join(sorted(s.roles)) or 'none'}"
    verdicts, end = _verdicts(s, task)
    if end is None:
        return None, "journal_ends_before_gate", s.last, f"task {task}: last line of the session"
    end_pos, end_where = end
    if verdicts["verified"] is False and not cfg.keep_unverified:
        return None, "gate_never_passed", end_where, f"task {task}: circuit breaker ({verdicts['failed_reason']})"
    goal = goals.get(("session_id", s.sid)) or (goals.get(("trace_id", s.trace_id)) if s.trace_id else None)
    if goal is None:
        return None, "goal_not_found", s.first, f"session {s.sid}" + (f", trace {s.trace_id}" if s.trace_id else "")
    code_writes = [w for w in writes if w.pos < end_pos]
    artifact = (code_writes or writes)[-1]
    try:  # the journal is model-driven: the code must be named inside the workspace, never through a link out
        ut.resolve_inside(ws.path, ws.path / artifact.file)
    except ut.Untrusted as e:
        return None, "code_outside_workspace", artifact.where, out.refused(e)
    gate_tests = _norm(str(Path("tests") / f"test_{Path(artifact.file).stem}.py"))  # workflow.py verification_gate
    tw = _last_write_before(ws, gate_tests, end_pos)
    if tw is None or tw.op == "delete":
        return None, "no_tests_written", end_where, f"task {task}: {gate_tests}"
    if tw.writer != "test_engineer":
        return None, "tests_not_from_test_engineer", tw.where, f"{gate_tests} last written by a {tw.writer} patch"
    later = _later_write(ws, gate_tests, end_pos)
    if later is not None:
        return None, "tests_overwritten_later", later.where, f"{gate_tests} rewritten in session {later.session}"
    source, why, unsafe = _read_text(ws.path, gate_tests, cfg.max_file_bytes, out)
    if source is None:
        if unsafe:
            return None, "unsafe_tests_file", tw.where, why
        reason = "tests_missing_on_disk" if why == "missing" else "tests_not_runnable"
        return None, reason, tw.where, f"{ws.path / gate_tests}: {why}"
    try:
        conv = read_gate_tests(source, artifact.file, str(ws.path / gate_tests))
    except NotRunnable as e:
        return None, "tests_not_runnable", tw.where, str(e)
    command = gate_command(gate_tests)
    problem = workspace_problem({"command": command, "code_file": artifact.file, "files": {gate_tests: source}})
    if problem:  # a path the sandbox cannot lay out as SAGE's workspace does (a backslash, too deep)
        return None, "tests_not_runnable", tw.where, f"{ws.path / gate_tests}: {problem}"
    if conv.asserts == 0:
        return None, "tests_assert_nothing", tw.where, (f"{ws.path / gate_tests}: no assert in "
                                                        f"{', '.join(conv.names) or 'the module'}")
    code = None
    if verdicts["verified"] and cfg.validate_reference:
        later = _later_write(ws, artifact.file, end_pos)
        if later is not None:
            return None, "code_overwritten_later", later.where, f"{artifact.file} rewritten in session {later.session}"
        code, why, unsafe = _read_text(ws.path, artifact.file, cfg.max_file_bytes, out)
        if code is None:
            if unsafe:
                return None, "unsafe_code_file", artifact.where, why
            return None, "code_missing_on_disk", artifact.where, f"{ws.path / artifact.file}: {why}"
    # the gate's test file, unchanged, run by the gate's command with the answer's code in SAGE's file
    reference = {"entry_point": conv.entry_point, "timeout_s": cfg.timeout_s,
                 "tests": [{"command": command, "code_file": artifact.file, "files": {gate_tests: source}}]}
    tests_sha = hashlib.sha256(json.dumps(reference["tests"], sort_keys=True).encode()).hexdigest()
    by_role = _skills_by_role(s)
    meta = {"sage": {
        "session_id": s.sid, "trace_id": s.trace_id or None, "workspace": str(ws.path),
        "started": s.start.isoformat() if s.start else None, "goal_source": goal[1], "task_id": task,
        "dag_nodes": s.dag_nodes, "artifact": artifact.file, "entry_point": conv.entry_point,
        "gate_test_file": gate_tests, "tests": list(conv.names), "asserts": conv.asserts, "imports": list(conv.imports),
        "tests_sha256": tests_sha, "verification_command": command,
        "verification_command_why": VERIFICATION_COMMAND_WHY,
        "verdicts": verdicts, "role": role, "role_skills": by_role.get(role, {}),
        "skills": {"calls": s.skills, "by_role": by_role},
        "reference_validated": False,
        "provenance": {"workspace": str(ws.path), "journal_files": s.files, "session_id": s.sid,
                       "first_line": s.first, "last_line": s.last, "terminal_step": end_where,
                       "code_write": artifact.where, "tests_write": tw.where, "tests_written_in_session": tw.session,
                       "damaged_lines": s.damaged_lines},
    }}
    rec = {"id": f"sage/{s.sid}", "intent": goal[0], "reference_kind": "unit_tests", "reference": reference,
           "tags": ["sage", f"role:{role}", "verified" if verdicts["verified"] else "unverified"], "meta": meta}
    try:
        record = task_from_dict(rec, f"{end_where} (session {s.sid}, task {task})", cfg.split)
    except TaskRecordError as e:  # the checks as built are always valid; a goal of only spaces is not
        return None, "goal_not_found", goal[1], f"the ledger's goal is unusable: {e}"
    return _Candidate(s, record, code, f"{conv.entry_point}:{tests_sha}"), "", "", ""


def _workspaces(workspaces: Sequence[Path], journals: Sequence[Path] | None, out: SageHarvestResult
                ) -> list[_Workspace]:
    found: list[_Workspace] = []
    for w in workspaces:
        w = Path(w)
        if not w.is_dir():
            out.missing.append({"path": str(w), "reason": "workspace folder not found"})
            continue
        found.append(_Workspace(w.resolve()))
    if journals is None:
        for ws in found:
            sessions = ws.path / "memory" / "sessions"
            if not sessions.is_dir():
                out.missing.append({"path": str(sessions), "reason": "no journal folder: SAGE has not run here"})
                continue
            files, skipped = discover_logs(IngestConfig([sessions]))
            out.missing += skipped
            for f in files:  # a journal is streamed (no size cap) but must lie in its workspace
                try:
                    ut.check(ws.path, f, sys.maxsize)
                except ut.Untrusted as e:
                    out.missing.append({"path": str(f), "reason": out.refused(e)})
                    continue
                ws.files.append(f)
        return found
    orphans = _Workspace(None)
    for j in journals:
        j = Path(j)
        try:
            mode = os.stat(j).st_mode
        except OSError:
            out.missing.append({"path": str(j), "reason": "journal file or folder not found"})
            continue
        if stat.S_ISREG(mode):
            files = [j]
        elif stat.S_ISDIR(mode):
            files, skipped = discover_logs(IngestConfig([j]))
            out.missing += skipped
        else:
            out.missing.append({"path": str(j), "reason": f"not a regular file ({ut.kind_of(mode)}): never opened"})
            out.unsafe["not_regular"] += 1
            continue
        for f in files:
            rf = f.resolve()  # one file named twice (a folder and the file in it) is read once
            owners = [ws for ws in found if rf.is_relative_to(ws.path)]
            owner = max(owners, key=lambda ws: len(ws.path.parts)) if owners else orphans
            if rf not in owner.files:
                owner.files.append(rf)
    for ws in [*found, orphans]:
        ws.files.sort(key=journal_order)
    return [*found, orphans] if orphans.files else found


def _in_window(start: datetime | None, since: datetime | None, until: datetime | None) -> bool:
    if since is None and until is None:
        return True
    return start is not None and (since is None or start >= since) and (until is None or start < until)


def harvest_sage(workspaces: Sequence[str | os.PathLike[str]], journals: Sequence[str | os.PathLike[str]] | None,
                 role: str, config: SageHarvestConfig | None = None, judge: UnitTestJudge | None = None,
                 log: Callable[[str], None] | None = None) -> SageHarvestResult:
    """Tasks for ``role`` from SAGE's ``workspaces`` and their journals (``journals`` None: each workspace's
    ``memory/sessions``; else those files or folders, each belonging to the workspace it lies in).

    ``judge`` validates the references (a :class:`~sage_pipeline.sleep.judges.UnitTestJudge` opened for
    untrusted code, :func:`untrusted_judge`; None: one is opened on ``config.sandbox`` and closed here). A
    damaged line, file or a missing folder is counted, every workspace file is read through the guard
    (:mod:`sage_pipeline.untrusted`: a refused one is counted by reason, never read) and the harvest goes
    on; only a sandbox that fails or refuses (no verdict) raises, and a judge not opened for untrusted code
    is a :class:`SageHarvestError`."""
    cfg = config or SageHarvestConfig()
    if role not in ROLES:
        raise SageHarvestError(f"role {role!r} is not one of SAGE's agent roles ({', '.join(ROLES)})")
    t0 = time.monotonic()
    out = SageHarvestResult()
    goals = read_goal_ledgers(cfg.goal_ledgers, out, cfg.max_listed)
    since = cfg.since if cfg.since is None or cfg.since.tzinfo else cfg.since.replace(tzinfo=UTC)
    until = cfg.until if cfg.until is None or cfg.until.tzinfo else cfg.until.replace(tzinfo=UTC)
    candidates: list[_Candidate] = []
    logged = t0
    spaces = _workspaces([Path(w) for w in workspaces], None if journals is None else [Path(j) for j in journals],
                         out)
    for i, ws in enumerate(spaces):
        _read_workspace(ws, out, cfg)
        for s in ws.sessions.values():
            if not _in_window(s.start, since, until):
                out.outside_window += 1
                continue
            out.sessions += 1
            cand, reason, where, detail = _candidate(ws, s, role, goals, cfg, out)
            if cand is None:
                out.count(reason, s.sid, where, detail, cfg.max_listed)
            else:
                candidates.append(cand)
        if log is not None and (time.monotonic() - logged > 5 or i + 1 == len(spaces)):
            logged = time.monotonic()
            log(f"harvest_sage: {i + 1}/{len(spaces)} workspaces, {out.lines:,} lines "
                f"({out.lines / max(logged - t0, 1e-9):,.0f}/s), {out.sessions} runs, {len(candidates)} candidates")
    candidates.sort(key=lambda c: (c.session.start or datetime.max.replace(tzinfo=UTC), c.session.sid))
    _validate(candidates, cfg, out, judge, log)
    seen: dict[str, str] = {}
    for c in candidates:
        if c.record is None:
            continue
        dup = seen.get(c.record.content_key()) or seen.get(c.tests_key)
        if dup is not None:
            out.count("duplicate_task", c.session.sid, c.record.origin, f"same task as {dup}", cfg.max_listed)
            continue
        seen[c.record.content_key()] = seen[c.tests_key] = c.record.id
        out.tasks.append(c.record)
    out.seconds = time.monotonic() - t0
    if log is not None:
        log(f"harvest_sage for {role}: {len(out.tasks)} tasks of {out.sessions} runs ({dict(out.reasons)}), "
            f"{out.quarantined_lines} quarantined lines, {out.lines:,} lines in {out.seconds:.1f} s")
    return out


def untrusted_judge(sandbox: str, workers: int = 1, allow_untrusted_local: bool = False,
                    log: Callable[[str], None] | None = None, **options) -> UnitTestJudge:
    """The unit-test judge for SAGE's harvested tasks: their tests (and the code judged by them) are
    model-written, so its sandbox is opened ``untrusted=True``: Docker only, unless
    ``allow_untrusted_local`` lets the unisolated local backend run them (the sandbox's describe, and so
    the night's diagnostics, say so). ``options``: more :class:`~sage_pipeline.sim.sandbox.SandboxConfig`
    fields."""
    from sage_pipeline.sleep.judges import UnitTestJudge

    return UnitTestJudge(sandbox=sandbox, workers=workers, log=log,
                         options={**options, "untrusted": True, "allow_untrusted_local": allow_untrusted_local})


def require_untrusted(judge: object, who: str) -> None:
    """Raise :class:`SageHarvestError` unless ``judge`` opens its sandbox for untrusted code (a judge with
    ``options``, as :class:`~sage_pipeline.sleep.judges.UnitTestJudge` has; a judge without runs nothing)."""
    opts = getattr(judge, "options", None)
    if isinstance(opts, dict) and not opts.get("untrusted"):
        raise SageHarvestError(f"{who}: the unit-test judge opens its {getattr(judge, 'sandbox', '?')!r} sandbox "
                               "without untrusted=True, but SAGE's harvested tests are model-written; make it with "
                               "sage_harvest.untrusted_judge(...) (the local backend then needs "
                               "allow_untrusted_local=True, knowing the tests run as you)")


def _validate(candidates: list[_Candidate], cfg: SageHarvestConfig, out: SageHarvestResult, judge: UnitTestJudge | None,
              log: Callable[[str], None] | None) -> None:
    """Each verified candidate's checks against SAGE's own final code, in one sandbox batch opened for
    untrusted code (:func:`untrusted_judge`); a failure replaces the record by None and is counted
    ``reference_not_reproducible``."""
    todo = [c for c in candidates if c.code is not None]
    if not todo:
        return
    own = judge is None
    if own:
        judge = untrusted_judge(cfg.sandbox, cfg.sandbox_workers, cfg.allow_untrusted_local, log,
                                **({"local_python": cfg.local_python} if cfg.local_python else {}))
    else:
        require_untrusted(judge, "harvest_sage")
    try:
        items = [(c.record, c.code) for c in todo]
        # the file as SAGE left it (never cut to a fenced block), where the judge can be told so
        raw = "raw" in inspect.signature(judge.run).parameters
        verdicts = judge.run(items, raw=True) if raw else judge.run(items)
    finally:
        if own:
            judge.close()
    for c, v in zip(todo, verdicts, strict=True):
        sage = c.record.meta["sage"]
        if v.hard == 1.0:
            sage["reference_validated"] = True
            sage["validation"] = (f"`{sage['verification_command']}` passed SAGE's verified code ({sage['artifact']}) "
                                  f"in the {judge.sandbox} sandbox")
            out.validated += 1
        else:  # pytest could not collect the file there (an import the image lacks): not runnable, else failing
            reason = "tests_not_runnable" if NOT_COLLECTED.search(v.why) else "reference_not_reproducible"
            out.count(reason, c.session.sid, sage["provenance"]["tests_write"],
                      f"{sage['gate_test_file']} against {sage['artifact']}: {v.why}", cfg.max_listed)
            c.record = None
