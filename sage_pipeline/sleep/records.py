"""Records of the nightly sleep cycle: tasks, their references, splits and task files.

A :class:`TaskRecord` is one replayable task: what was asked (``intent``, ``context``),
how an answer is judged (``reference_kind`` and ``reference``), ``tags``, the ``split``
(train / val / test: a stable hash of the id, so a task keeps its split across nights)
and ``origin`` (the log file and task, or the task file and line, it came from).

Reference kinds and their ``reference``:

- ``exact``: the expected answer, a string;
- ``rules``: a list of checks, each ``{"contains": "x"}``, ``{"not_contains": "x"}``,
  ``{"regex": "p"}``, ``{"not_regex": "p"}``, ``{"startswith": "x"}``, ``{"endswith": "x"}``,
  ``{"max_chars": n}``, ``{"min_chars": n}``, ``{"max_lines": n}`` or ``{"json": true}``
  (string checks take ``"ignore_case": true``);
- ``rubric``: the grading rubric, a string (graded by the backend);
- ``unit_tests``: ``{"entry_point": "f", "tests": [{"args": [...], "expected": ...}],
  "timeout_s": 5}``, run through the sandbox against the code in the answer; or, for test code
  (the tests SAGE's test engineer wrote, :mod:`sage_pipeline.sleep.sage_harvest`), ``"tests":
  [{"check": "<statement>", "setup": "<source>"}, ...]`` with one setup shared by every check: the
  sandbox's judge process runs the setup once, then each check, ``f`` there a proxy that calls the
  candidate in a process of its own (:mod:`sage_pipeline.sim.runner`, "external suites"); or, for
  a test module run as SAGE's gate runs it (what :mod:`~sage_pipeline.sleep.sage_harvest` harvests),
  one test ``{"command": "python -m pytest -q tests/test_m.py", "code_file": "m.py", "files":
  {"tests/test_m.py": "<source>"}}``: the answer's code is written to ``code_file``, the files beside
  it, and the command run there in the sandbox (:mod:`sage_pipeline.sim.runner`, "workspace jobs");
  ``f`` is then the name the tests import from the module (what the replay's prompt names).

A task file is JSON lines, one task per line (``id``, ``intent``, ``reference_kind``,
``reference``; optional ``context``, ``tags``, ``skill``, ``date``, ``meta``). Malformed
lines are quarantined with their file, line and reason; nothing else is lost.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

REFERENCE_KINDS = ("exact", "rules", "rubric", "unit_tests")
SPLITS = ("train", "val", "test")
STRING_CHECKS = ("contains", "not_contains", "startswith", "endswith")
REGEX_CHECKS = ("regex", "not_regex")
COUNT_CHECKS = ("max_chars", "min_chars", "max_lines")
CHECK_KINDS = STRING_CHECKS + REGEX_CHECKS + COUNT_CHECKS + ("json",)
TASK_FIELDS = ("id", "intent", "context", "reference_kind", "reference", "tags", "skill", "date", "meta")


class TaskRecordError(ValueError):
    """A task record is invalid: ``field`` says which part, the message what to do."""

    def __init__(self, field_name: str, problem: str) -> None:
        self.field = field_name
        super().__init__(f"{field_name}: {problem}")


class SplitSpec(BaseModel):
    """Shares of train and val; the rest is test. A task's split is a hash of its id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    train: float = Field(0.5, gt=0.0, lt=1.0, description="share of tasks in train, in (0, 1)")
    val: float = Field(0.25, gt=0.0, lt=1.0, description="share of tasks in val, in (0, 1); the rest is test")

    @model_validator(mode="after")
    def _test_keeps_a_share(self) -> SplitSpec:
        if self.train + self.val >= 1:
            raise ValueError(f"split shares train={self.train}, val={self.val}: train + val < 1 (the rest is test)")
        return self

    def of(self, task_id: str) -> str:
        h = int.from_bytes(hashlib.sha256(f"sleep-split:{task_id}".encode()).digest()[:8], "big") / 2**64
        return "train" if h < self.train else ("val" if h < self.train + self.val else "test")


DEFAULT_SPLIT = SplitSpec()


@dataclass(frozen=True)
class TaskRecord:
    id: str
    intent: str
    reference_kind: str
    reference: object
    context: str = ""
    tags: tuple[str, ...] = ()
    split: str = "train"
    origin: str = ""
    skill: str = ""  # "" = any skill (task files under a skill's own folder)
    date: str = ""  # "" = every night; else only the night of that date (YYYY-MM-DD)
    meta: dict = field(default_factory=dict, compare=False)  # never shown to the backend under test

    def content_key(self) -> str:
        """What the task asks, independent of its id: normalised intent and context."""
        norm = " ".join(f"{self.intent}\n{self.context}".casefold().split())
        return hashlib.sha256(norm.encode("utf-8")).hexdigest()[:16]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tags"] = list(self.tags)
        return d


def normalise_reference(kind: str, reference: object) -> object:
    """Validate a reference and return it in canonical form (rules as ``[{"check", "value", ...}]``)."""
    if kind not in REFERENCE_KINDS:
        raise TaskRecordError("reference_kind", f"{kind!r} is not one of {', '.join(REFERENCE_KINDS)}")
    if kind in ("exact", "rubric"):
        if not isinstance(reference, str) or not reference.strip():
            raise TaskRecordError("reference", f"a {kind} reference must be a non-empty string")
        return reference
    if kind == "rules":
        return [_normalise_check(i, c) for i, c in enumerate(_as_list(reference, "rules"))]
    return _normalise_unit_tests(reference)


def _as_list(reference: object, kind: str) -> list:
    if not isinstance(reference, list) or not reference:
        raise TaskRecordError("reference", f"a {kind} reference must be a non-empty list")
    return reference


def _normalise_check(i: int, c: object) -> dict:
    where = f"reference[{i}]"
    if not isinstance(c, dict):
        raise TaskRecordError(where, f"a check must be an object like {{\"contains\": \"x\"}}, got {c!r}")
    c = dict(c)
    ignore_case = c.pop("ignore_case", False)
    if "check" in c:  # canonical form
        kind, value = c.pop("check"), c.pop("value", None)
    else:
        kinds = [k for k in c if k in CHECK_KINDS]
        if len(kinds) != 1:
            raise TaskRecordError(where, f"needs exactly one of {', '.join(CHECK_KINDS)}, got keys {sorted(c)}")
        kind = kinds[0]
        value = c.pop(kind)
    if c:
        raise TaskRecordError(where, f"unknown keys {sorted(c)}")
    if kind not in CHECK_KINDS:
        raise TaskRecordError(where, f"unknown check {kind!r}; use one of {', '.join(CHECK_KINDS)}")
    if kind in STRING_CHECKS + REGEX_CHECKS and (not isinstance(value, str) or not value):
        raise TaskRecordError(where, f"{kind} needs a non-empty string")
    if kind in REGEX_CHECKS:
        try:
            re.compile(value)
        except re.error as e:
            raise TaskRecordError(where, f"{kind} {value!r} is not a valid regular expression ({e})") from e
    if kind in COUNT_CHECKS and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise TaskRecordError(where, f"{kind} needs a non-negative integer, got {value!r}")
    if kind == "json":
        value = True
    if not isinstance(ignore_case, bool):
        raise TaskRecordError(where, "ignore_case must be true or false")
    return {"check": kind, "value": value, "ignore_case": ignore_case}


def _normalise_unit_tests(reference: object) -> dict:
    if not isinstance(reference, dict):
        raise TaskRecordError("reference", "a unit_tests reference must be an object with entry_point and tests")
    entry = reference.get("entry_point")
    if not isinstance(entry, str) or not entry.isidentifier():
        raise TaskRecordError("reference.entry_point", f"must be a Python function name, got {entry!r}")
    tests = reference.get("tests")
    if not isinstance(tests, list) or not tests:
        raise TaskRecordError("reference.tests", "must be a non-empty list of {\"args\": [...], \"expected\": ...} "
                              "or of {\"check\": ..., \"setup\": ...}")
    checks = isinstance(tests[0], dict) and "check" in tests[0]
    if isinstance(tests[0], dict) and "command" in tests[0]:  # a test module, run as SAGE's gate runs it
        from sage_pipeline.sim.runner import workspace_problem

        problem = "one test only: the command runs the whole module" if len(tests) != 1 else \
            workspace_problem(tests[0])
        if problem:
            raise TaskRecordError("reference.tests[0]" if len(tests) == 1 else "reference.tests",
                                  f"a workspace test ({{\"command\", \"code_file\", \"files\"}}): {problem}")
        tests = []  # checked: nothing below applies
    for i, t in enumerate(tests):
        if checks:  # test code: the sandbox's judge runs the first test's setup once, then every check
            if (not isinstance(t, dict) or set(t) != {"check", "setup"} or not isinstance(t["check"], str)
                    or not t["check"].strip() or not isinstance(t["setup"], str)):
                raise TaskRecordError(f"reference.tests[{i}]", "must be {\"check\": \"<statement>\", \"setup\": "
                                      "\"<source>\"} like the first test")
            if t["setup"] != tests[0]["setup"]:
                raise TaskRecordError(f"reference.tests[{i}].setup", "differs from the first test's: the sandbox "
                                      "runs one setup for all the checks of a task")
        elif not isinstance(t, dict) or not isinstance(t.get("args"), list) or "expected" not in t:
            raise TaskRecordError(f"reference.tests[{i}]", "must be {\"args\": [...], \"expected\": ...}")
    timeout = reference.get("timeout_s", 5.0)
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout <= 120:
        raise TaskRecordError("reference.timeout_s", f"must be a number of seconds in (0, 120], got {timeout!r}")
    extra = set(reference) - {"entry_point", "tests", "timeout_s"}
    if extra:
        raise TaskRecordError("reference", f"unknown keys {sorted(extra)}")
    return {"entry_point": entry, "tests": reference["tests"], "timeout_s": float(timeout)}


def _opt_str(d: dict, key: str) -> str:
    v = d.get(key, "")
    if v is None:
        return ""
    if not isinstance(v, str):
        raise TaskRecordError(key, f"must be a string, got {type(v).__name__}")
    return v


def task_from_dict(d: object, origin: str, split: SplitSpec = DEFAULT_SPLIT) -> TaskRecord:
    """Build a validated task from a JSON object; raises :class:`TaskRecordError` naming the field."""
    if not isinstance(d, dict):
        raise TaskRecordError("record", f"must be a JSON object, got {type(d).__name__}")
    unknown = set(d) - set(TASK_FIELDS) - {"split", "origin", "reference_kind"}
    if unknown:
        raise TaskRecordError("record", f"unknown fields {sorted(unknown)}; known: {', '.join(TASK_FIELDS)}")
    tid = d.get("id")
    if not isinstance(tid, str) or not tid.strip():
        raise TaskRecordError("id", "missing or empty (a task needs a stable id: its split is a hash of it)")
    intent = d.get("intent")
    if not isinstance(intent, str) or not intent.strip():
        raise TaskRecordError("intent", "missing or empty (what was asked)")
    if "reference" not in d or "reference_kind" not in d:
        raise TaskRecordError("reference", "missing: a task needs reference_kind and reference to be judged")
    kind = d["reference_kind"]
    reference = normalise_reference(kind, d["reference"])
    tags = d.get("tags", [])
    if not isinstance(tags, list) or not all(isinstance(t, str) for t in tags):
        raise TaskRecordError("tags", "must be a list of strings")
    date = _opt_str(d, "date")
    if date and not re.fullmatch(r"\d{4}-\d{2}-\d{2}", date):
        raise TaskRecordError("date", f"{date!r} is not YYYY-MM-DD")
    meta = d.get("meta", {})
    if not isinstance(meta, dict):
        raise TaskRecordError("meta", "must be an object")
    return TaskRecord(id=tid.strip(), intent=intent, reference_kind=kind, reference=reference,
                      context=_opt_str(d, "context"), tags=tuple(tags), split=split.of(tid.strip()),
                      origin=origin, skill=_opt_str(d, "skill"), date=date, meta=meta)


@dataclass(frozen=True)
class Quarantined:
    file: str
    line: int
    reason: str
    field: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class TaskFileResult:
    tasks: list[TaskRecord] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    lines: int = 0


def read_task_file(path: str | Path, split: SplitSpec = DEFAULT_SPLIT) -> TaskFileResult:
    """Every valid task of a JSON-lines task file; bad lines are quarantined with line and reason."""
    path = Path(path)
    out = TaskFileResult()
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            out.lines += 1
            if not raw.strip():
                continue
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                out.quarantined.append(Quarantined(str(path), lineno, f"not UTF-8 (byte {raw[e.start]:#04x} at "
                                                   f"column {e.start + 1}); re-save the file as UTF-8", "line"))
                continue
            try:
                obj = json.loads(text)
            except json.JSONDecodeError as e:
                out.quarantined.append(Quarantined(str(path), lineno, f"invalid JSON ({e.msg} at column {e.colno})",
                                                   "line"))
                continue
            try:
                out.tasks.append(task_from_dict(obj, f"{path}:{lineno}", split))
            except TaskRecordError as e:
                out.quarantined.append(Quarantined(str(path), lineno, str(e), e.field))
    return out


def write_task_file(path: str | Path, tasks: Iterable[TaskRecord]) -> Path:
    """Tasks as JSON lines (split and origin left out: they are derived when read)."""
    from sage_pipeline import artifacts

    lines = []
    for t in tasks:
        d = t.to_dict()
        for k in ("split", "origin"):
            d.pop(k)
        for k in ("context", "skill", "date"):
            if not d[k]:
                d.pop(k)
        if not d["meta"]:
            d.pop("meta")
        lines.append(json.dumps(d, ensure_ascii=False, separators=(",", ":")))
    return artifacts.write_text(path, "\n".join(lines) + ("\n" if lines else ""))


@dataclass(frozen=True)
class TaskResult:
    """One task replayed under one (skill, memory) pair, judged."""

    task_id: str
    split: str
    hard: float  # 1.0 pass, 0.0 fail
    soft: float  # partial credit in [0, 1]
    response_head: str
    why: str  # why it failed ("" when it passed)
    tokens: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class ReflectRequest:
    """What reflect sees: train failures and successes, the learned blocks and the limits."""

    skill_name: str
    documents: dict[str, str]  # target ("skill" / "memory") -> the whole document
    blocks: dict[str, tuple[str, ...]]  # target -> the learned block's rules
    failures: list[tuple[TaskRecord, TaskResult]]
    successes: list[tuple[TaskRecord, TaskResult]]
    edit_budget: int
    block_max_chars: int
    max_rule_chars: int
    room: dict[str, int]  # target -> characters left in its block
