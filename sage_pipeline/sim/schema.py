"""Records of the coding-task simulator, shared by task generation, the sandbox, the
rollouts and the code-task environment.

A task is a small Python function: a prompt, a signature, a reference solution, test
cases (``args`` -> ``expected``, computed by running the reference) and candidate
solutions (the reference plus realistic wrong ones). Tests and expected values are JSON:
the sandbox compares ``json.loads(json.dumps(result))`` with ``expected`` (floats with a
1e-9 tolerance), so a result of the wrong type is a wrong answer, not a crash.

``datasets/sim/tasks.jsonl`` holds one :class:`TaskRecord` per line; its first line is a
header ``{"tasks_version": ..., "seed": ..., "n_tasks": ...}`` so a file from another
version is recognised and refused with a clear error. Reading checks every line (UTF-8
JSON object, each field of its type, unique task ids): a bad line is an error naming the
file, the line and the field.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

from sage_pipeline import artifacts

TASKS_VERSION = 1
TASKS_FILE = "tasks.jsonl"

# What running a candidate can end in. ``pass`` is the only success.
OUTCOME_KINDS = ("pass", "wrong_answer", "exception", "timeout", "oom", "killed")
# Kinds of candidate solutions (``reference`` is correct by construction and verified).
CANDIDATE_KINDS = ("reference", "off_by_one", "wrong_operator", "missed_edge_case", "exception",
                   "infinite_loop", "memory_blowup", "wrong_type")
DIFFICULTY_LEVELS = ("easy", "medium", "hard")


class TasksFileError(ValueError):
    """A tasks file is missing, from another version, or has a malformed line."""


@dataclass(frozen=True)
class Candidate:
    candidate_id: str  # "<task_id>/<kind>[-n]"
    kind: str  # one of CANDIDATE_KINDS
    code: str  # a module defining the task's entry point
    equivalent: bool = False  # a mutant that passed every test: not used as a wrong answer

    @property
    def code_sha256(self) -> str:
        return hashlib.sha256(self.code.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class TaskRecord:
    task_id: str  # "<family>-<nnnn>"
    family: str
    difficulty: float  # in [0, 1]; the simulated models' pass probability falls with it
    difficulty_level: str  # easy / medium / hard (terciles of difficulty)
    prompt: str
    signature: str  # "def f(xs: list[int]) -> int"
    entry_point: str  # the function name
    reference: str  # the reference solution's code
    tests: list[dict]  # [{"args": [...], "expected": ...}], JSON values
    timeout_s: float  # wall-clock limit per execution, from the reference's measured runtime
    candidates: list[Candidate] = field(default_factory=list)
    split: str = "train"  # train / test, a stable hash of the task id

    @property
    def prompt_tokens(self) -> int:
        """A rough token count of the prompt plus signature (4 characters a token)."""
        return max(1, (len(self.prompt) + len(self.signature)) // 4)

    def wrong_candidates(self) -> list[Candidate]:
        return [c for c in self.candidates if c.kind != "reference" and not c.equivalent]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TaskRecord":
        d = dict(d)
        d["candidates"] = [Candidate(**c) for c in d.get("candidates", [])]
        return cls(**d)


def tests_sha256(entry_point: str, tests: list[dict]) -> str:
    blob = json.dumps({"entry_point": entry_point, "tests": tests}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def cache_key(code: str, entry_point: str, tests: list[dict]) -> str:
    """The execution cache's key: the candidate's code and the tests it runs against."""
    h = hashlib.sha256()
    h.update(hashlib.sha256(code.encode("utf-8")).digest())
    h.update(tests_sha256(entry_point, tests).encode("ascii"))
    return h.hexdigest()


def split_of(task_id: str, test_share: float = 0.25) -> str:
    """A stable train/test split: a hash of the id, so a task keeps its split across runs."""
    h = int.from_bytes(hashlib.sha256(task_id.encode("utf-8")).digest()[:8], "big")
    return "test" if h / 2**64 < test_share else "train"


def write_tasks(path: str | Path, tasks: Iterable[TaskRecord], seed: int) -> Path:
    tasks = list(tasks)
    with artifacts.atomic_open(path) as fh:
        fh.write(json.dumps({"tasks_version": TASKS_VERSION, "seed": seed, "n_tasks": len(tasks)}) + "\n")
        for t in tasks:
            fh.write(json.dumps(t.to_dict(), separators=(",", ":")) + "\n")
    return Path(path)


_REGENERATE = "re-materialize sim_tasks to regenerate the file"
_NUMBER = (int, float)
_TYPE_NAMES = {str: "a string", list: "a list", bool: "true or false", _NUMBER: "a number"}
# the JSON type of each field of a task record and of a candidate, checked on reading
_TASK_TYPES = {"task_id": str, "family": str, "difficulty": _NUMBER, "difficulty_level": str, "prompt": str,
               "signature": str, "entry_point": str, "reference": str, "tests": list, "timeout_s": _NUMBER,
               "candidates": list, "split": str}
_CANDIDATE_TYPES = {"candidate_id": str, "kind": str, "code": str, "equivalent": bool}


def _check_type(where: str, name: str, value, kind) -> None:
    """Raise unless ``value`` is of ``kind`` (bool is not a number here, though Python says so)."""
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise TasksFileError(f"{where}: field {name!r} is {json.dumps(value)[:60]}, expected "
                             f"{_TYPE_NAMES[kind]} ({_REGENERATE})")


def _check_fields(where: str, d: dict, cls, types: dict, prefix: str = "") -> None:
    """Every required field of dataclass ``cls`` present, no unknown field, each of its JSON type."""
    for f in fields(cls):
        if f.name not in d and f.default is MISSING and f.default_factory is MISSING:
            raise TasksFileError(f"{where}: field {prefix + f.name!r} is missing ({_REGENERATE})")
    for name, value in d.items():
        if name not in types:
            raise TasksFileError(f"{where}: field {prefix + name!r} is unknown to a {cls.__name__} "
                                 f"({_REGENERATE})")
        _check_type(where, prefix + name, value, types[name])


def _check_record(where: str, d) -> None:
    """Raise a TasksFileError naming the field unless ``d`` is a well-typed task record."""
    if not isinstance(d, dict):
        raise TasksFileError(f"{where}: a task record must be a JSON object, got {json.dumps(d)[:60]} "
                             f"({_REGENERATE})")
    _check_fields(where, d, TaskRecord, _TASK_TYPES)
    for i, t in enumerate(d["tests"]):
        # an external suite's test (sage_pipeline.sim.suites): trusted code the sandbox's judge runs
        suite_test = isinstance(t, dict) and isinstance(t.get("check"), str) and isinstance(t.get("setup"), str)
        if not suite_test and (not isinstance(t, dict) or not isinstance(t.get("args"), list) or "expected" not in t):
            raise TasksFileError(f"{where}: field 'tests[{i}]' is {json.dumps(t)[:60]}, expected an object "
                                 f"{{\"args\": [...], \"expected\": ...}} or {{\"check\": ..., \"setup\": ...}} "
                                 f"({_REGENERATE})")
    for i, c in enumerate(d.get("candidates", [])):
        if not isinstance(c, dict):
            raise TasksFileError(f"{where}: field 'candidates[{i}]' is {json.dumps(c)[:60]}, "
                                 f"expected an object ({_REGENERATE})")
        _check_fields(where, c, Candidate, _CANDIDATE_TYPES, prefix=f"candidates[{i}].")


def _json_line(where: str, raw: bytes, what: str):
    """One line of the file decoded as UTF-8 JSON, or a TasksFileError naming the line."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise TasksFileError(f"{where}: {what} is not UTF-8 (byte {raw[e.start:e.start + 1]!r} at column "
                             f"{e.start + 1}); the file is damaged, {_REGENERATE}") from e
    except json.JSONDecodeError as e:
        raise TasksFileError(f"{where}: {what} is not JSON ({e}); the file is damaged, {_REGENERATE}") from e


def _parse_task(where: str, raw: bytes, seen: dict[str, int]) -> TaskRecord:
    d = _json_line(where, raw, "task record")
    _check_record(where, d)
    if d["task_id"] in seen:
        raise TasksFileError(f"{where}: field 'task_id' {d['task_id']!r} repeats the task of line "
                             f"{seen[d['task_id']]}; task ids must be unique ({_REGENERATE})")
    try:
        return TaskRecord.from_dict(d)
    except (TypeError, KeyError, ValueError) as e:
        raise TasksFileError(f"{where}: malformed task record ({e}); {_REGENERATE}") from e


def iter_tasks(path: str | Path) -> Iterator[TaskRecord]:
    path = Path(path)
    if not path.is_file():
        raise TasksFileError(f"{path}: no tasks file (materialize the sim_tasks asset first)")
    with open(path, "rb") as fh:
        header = _json_line(f"{path}:1", fh.readline(), "header")
        version = header.get("tasks_version") if isinstance(header, dict) else None
        if version != TASKS_VERSION:
            raise TasksFileError(
                f"{path}:1: tasks_version {version!r}, this code reads version {TASKS_VERSION} "
                "(re-materialize sim_tasks to regenerate the file)")
        seen: dict[str, int] = {}
        for lineno, raw in enumerate(fh, start=2):
            if not raw.strip():
                continue
            task = _parse_task(f"{path}:{lineno}", raw, seen)
            seen[task.task_id] = lineno
            yield task


def read_tasks(path: str | Path) -> list[TaskRecord]:
    tasks = list(iter_tasks(path))
    if not tasks:
        raise TasksFileError(f"{path}: holds no tasks (re-materialize sim_tasks)")
    return tasks


@dataclass(frozen=True)
class ExecJob:
    """One execution: a candidate's code run against a task's tests."""

    code: str
    entry_point: str
    tests: list[dict]
    timeout_s: float  # wall-clock limit for the whole job (all its tests)

    @property
    def key(self) -> str:
        return cache_key(self.code, self.entry_point, self.tests)


@dataclass(frozen=True)
class ExecResult:
    """What the sandbox verified. Infrastructure failures are never an ExecResult: they raise."""

    outcome: str  # one of OUTCOME_KINDS
    tests_passed: int
    tests_total: int
    runtime_s: float
    output_excerpt: str = ""  # head of stdout/stderr or the exception, for humans

    @property
    def passed(self) -> bool:
        return self.outcome == "pass"
