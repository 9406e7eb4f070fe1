"""External coding suites: HumanEval-style and MBPP-style JSONL files, run with the judge
outside the candidate's process.

Formats, exactly as published, so the real files import unchanged:

- **HumanEval** (``HumanEval.jsonl.gz``): ``task_id``, ``prompt`` (imports, helpers, the entry
  point's signature and docstring), ``canonical_solution`` (the body that completes the
  prompt), ``test`` (defines ``METADATA`` and ``def check(candidate)``), ``entry_point``. A
  candidate program is ``prompt + completion``; the test is ``check(candidate)``.
- **MBPP** (``mbpp.jsonl``): ``task_id`` (an int), ``text``, ``code`` (a whole program),
  ``test_list`` (assert lines calling the function by name), ``test_setup_code`` (usually
  ""), ``challenge_test_list`` (kept, not run: the published evaluation runs ``test_list``).
  The entry point is the first function the asserts call that ``code`` defines.

Files may be gzip-compressed (``.gz``). A malformed problem is a :class:`SuiteFileError`
naming the file, the line and the field.

How a suite problem runs (``sage_pipeline/sim/runner.py``, "external suites"): the suite's
test code is trusted and runs in a judge process (HumanEval: ``prompt`` then ``test``, so
helpers the prompt defines, such as ``poly`` or ``encode_cyclic``, are there; MBPP:
``test_setup_code``); each check (``check(candidate)``, or one assert line) is one test. In
the judge, ``candidate`` and the entry point's name are a proxy that calls into the
candidate's own sandboxed process through a type-preserving codec of plain values (never
pickle). A job is an ordinary :class:`ExecJob` whose tests are
``[{"check": statement, "setup": source}, ...]``.

:func:`verify_suite` runs every canonical solution in the sandbox: those that fail are
reported and excluded, never silently. :data:`FORGERS` are candidates that try to pass
without solving anything; none may pass.
"""

from __future__ import annotations

import ast
import gzip
import json
import keyword
import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sage_pipeline.sim.schema import ExecJob, ExecResult

SUITE_FORMATS = ("humaneval", "mbpp")
HUMANEVAL_FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
MBPP_FIELDS = ("task_id", "text", "code", "test_list", "test_setup_code", "challenge_test_list")
# the sanitized subset (sanitized-mbpp.json): prompt instead of text, test_imports, no test_setup_code
SANITIZED_MBPP_FIELDS = ("task_id", "prompt", "code", "test_list")
SAMPLES_DIR = Path(__file__).resolve().parents[2] / "sim" / "suites"
SAMPLE_FILES = {"humaneval": SAMPLES_DIR / "humaneval_sample.jsonl", "mbpp": SAMPLES_DIR / "mbpp_sample.jsonl"}
VERIFY_TIMEOUT_S = 20.0  # a canonical solution's first run (the whole check() of a problem)
MIN_TIMEOUT_S = 3.0  # a problem's timeout: max(this, TIME_FACTOR x its canonical runtime)
TIME_FACTOR = 4.0


class SuiteFileError(ValueError):
    """A suite file is missing, not JSONL, of an unknown format, or has a malformed problem."""


@dataclass(frozen=True)
class SuiteProblem:
    suite: str  # humaneval | mbpp
    task_id: str  # as in the file (MBPP's int as text)
    prompt: str  # HumanEval's prompt; MBPP's text
    entry_point: str
    canonical: str  # the canonical solution as a whole program
    setup: str  # trusted test code, run in the judge before the checks
    checks: list[str]  # trusted statements, one test each, run in the judge
    source: str  # "file:line"
    extra: dict = field(default_factory=dict)  # e.g. MBPP's challenge_test_list

    def program(self, completion: str) -> str:
        """A candidate's whole program: HumanEval completes the prompt; MBPP's is whole."""
        return self.prompt + completion if self.suite == "humaneval" else completion

    @property
    def tests(self) -> list[dict]:
        return [{"check": c, "setup": self.setup} for c in self.checks]

    def job(self, code: str, timeout_s: float) -> ExecJob:
        return ExecJob(code, self.entry_point, self.tests, timeout_s)


# -- reading --------------------------------------------------------------------------------

def _lines(path: Path) -> Iterable[tuple[int, bytes]]:
    if not path.is_file():
        raise SuiteFileError(f"{path}: no such suite file (give the path of a HumanEval-style or MBPP-style "
                             ".jsonl or .jsonl.gz file)")
    with open(path, "rb") as fh:
        gz = fh.read(2) == b"\x1f\x8b"
    try:
        with (gzip.open(path, "rb") if gz else open(path, "rb")) as fh:
            yield from enumerate(fh, start=1)
    except (OSError, EOFError) as e:  # a damaged or truncated .gz
        raise SuiteFileError(f"{path}: cannot be read as {'gzip' if gz else 'a file'} ({e}); "
                             "download it again") from e


def _where(path: Path, lineno: int) -> str:
    return f"{path}:{lineno}"


def _require(where: str, d: dict, fields_: Sequence[str], fmt: str, types: dict) -> None:
    for f in fields_:
        if f not in d:
            raise SuiteFileError(f"{where}: field {f!r} is missing (a {fmt} problem has {', '.join(fields_)})")
    for f, kind in types.items():
        v = d[f]
        ok = isinstance(v, kind) and not (kind is not bool and isinstance(v, bool))
        if not ok:
            names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise SuiteFileError(f"{where}: field {f!r} is {json.dumps(v)[:60]}, expected {names} ({fmt} format)")


def _compile(where: str, name: str, source: str, mode: str = "exec") -> ast.AST:
    try:
        return ast.parse(source, mode=mode)
    except SyntaxError as e:
        raise SuiteFileError(f"{where}: field {name!r} is not valid Python (line {e.lineno}: {e.msg})") from e


def _detect(where: str, d: dict) -> str:
    if "canonical_solution" in d or "entry_point" in d:
        return "humaneval"
    if "test_list" in d or "code" in d:
        return "mbpp"  # the full release (text, test_setup_code) or the sanitized one (prompt, test_imports)
    raise SuiteFileError(f"{where}: neither a HumanEval problem ({', '.join(HUMANEVAL_FIELDS)}) nor an MBPP "
                         f"problem ({', '.join(MBPP_FIELDS)}); its fields are {sorted(d)[:8]}")


def _humaneval(where: str, d: dict) -> SuiteProblem:
    _require(where, d, HUMANEVAL_FIELDS, "HumanEval", {f: str for f in HUMANEVAL_FIELDS})
    ep = d["entry_point"]
    if not ep.isidentifier() or keyword.iskeyword(ep):
        raise SuiteFileError(f"{where}: field 'entry_point' is {ep!r}, not a function name")
    _compile(where, "prompt", d["prompt"])
    test = _compile(where, "test", d["test"])
    if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in test.body):
        raise SuiteFileError(f"{where}: field 'test' defines no `def check(candidate)` (HumanEval format)")
    _compile(where, "canonical_solution", d["prompt"] + d["canonical_solution"])
    return SuiteProblem("humaneval", d["task_id"], d["prompt"], ep, d["prompt"] + d["canonical_solution"],
                        d["prompt"] + "\n" + d["test"], ["check(candidate)"], where)


def _called_names(tree: ast.AST) -> list[str]:
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    calls.sort(key=lambda n: (n.lineno, n.col_offset))
    return [c.func.id for c in calls]


def _mbpp(where: str, d: dict) -> SuiteProblem:
    if "text" not in d and "prompt" in d:  # sanitized MBPP: prompt, test_imports, no test_setup_code
        _require(where, d, SANITIZED_MBPP_FIELDS, "sanitized MBPP", {
            "task_id": (int, str), "prompt": str, "code": str, "test_list": list})
        imports = d.get("test_imports", [])
        if not isinstance(imports, list) or not all(isinstance(x, str) for x in imports):
            raise SuiteFileError(f"{where}: field 'test_imports' is {json.dumps(imports)[:60]}, expected a list of "
                                 "import lines (sanitized MBPP format)")
        setup = "\n".join(imports + [d.get("test_setup_code") or ""]).strip("\n")
        d = {**d, "text": d["prompt"], "test_setup_code": setup}
    _require(where, d, MBPP_FIELDS[:5], "MBPP", {"task_id": (int, str), "text": str, "code": str,
                                                 "test_list": list, "test_setup_code": str})
    challenge = d.get("challenge_test_list", [])
    for name, lines in (("test_list", d["test_list"]), ("challenge_test_list", challenge)):
        if not isinstance(lines, list):
            raise SuiteFileError(f"{where}: field {name!r} is {json.dumps(lines)[:60]}, expected a list of "
                                 "assert lines")
        for i, line in enumerate(lines):
            if not isinstance(line, str):
                raise SuiteFileError(f"{where}: field '{name}[{i}]' is {json.dumps(line)[:60]}, expected an "
                                     "assert line")
            tree = _compile(where, f"{name}[{i}]", line)
            if not tree.body or not all(isinstance(s, ast.Assert) for s in tree.body):
                raise SuiteFileError(f"{where}: field '{name}[{i}]' is {line[:60]!r}, expected an assert "
                                     "statement (MBPP format)")
    if not d["test_list"]:
        raise SuiteFileError(f"{where}: field 'test_list' is empty: a problem needs at least one assert")
    code = _compile(where, "code", d["code"])
    _compile(where, "test_setup_code", d["test_setup_code"])
    defined = {n.name for n in ast.walk(code) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    called = [n for line in d["test_list"] for n in _called_names(ast.parse(line))]
    entry = next((n for n in called if n in defined), None)
    if entry is None:
        raise SuiteFileError(f"{where}: field 'test_list' calls {sorted(set(called))[:5]}, none of which field "
                             f"'code' defines ({sorted(defined)[:5]}): no entry point")
    return SuiteProblem("mbpp", str(d["task_id"]), d["text"], entry, d["code"], d["test_setup_code"],
                        list(d["test_list"]), where, {"challenge_test_list": list(challenge)})


def _records(path: Path) -> Iterable[tuple[str, int, object]]:
    """(where, number, decoded object) per problem: one per line of a JSONL file, or one per
    element of a file holding a single JSON array (as sanitized-mbpp.json ships)."""
    lines = _lines(path)
    first = next(lines, None)
    if first is not None and first[1].lstrip().startswith(b"["):
        raw = first[1] + b"".join(line for _, line in lines)
        try:
            items = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SuiteFileError(f"{path}: starts with '[' but is not a JSON array of problems ({e})") from e
        if not isinstance(items, list):
            raise SuiteFileError(f"{path}: starts with '[' but is not a JSON array of problems")
        for i, d in enumerate(items):
            yield f"{path}: problem [{i}]", i, d
        return
    for lineno, raw in ([first] if first is not None else []) + list(lines):
        where = _where(path, lineno)
        if not raw.strip():
            continue
        try:
            d = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise SuiteFileError(f"{where}: not UTF-8 (byte {raw[e.start:e.start + 1]!r} at column "
                                 f"{e.start + 1})") from e
        except json.JSONDecodeError as e:
            raise SuiteFileError(f"{where}: not a JSON line ({e})") from e
        yield where, lineno, d


def read_suite(path: str | Path, fmt: str = "auto") -> list[SuiteProblem]:
    """Every problem of a HumanEval-style or MBPP-style JSONL (or .jsonl.gz) file, or of a
    file holding one JSON array of problems (sanitized-mbpp.json)."""
    path = Path(path)
    if fmt not in ("auto", *SUITE_FORMATS):
        raise ValueError(f"suite format {fmt!r}: use auto, {', '.join(SUITE_FORMATS)}")
    problems: list[SuiteProblem] = []
    seen: dict[str, int] = {}
    for where, lineno, d in _records(path):
        if not isinstance(d, dict):
            raise SuiteFileError(f"{where}: a problem must be a JSON object, got {json.dumps(d)[:60]}")
        kind = _detect(where, d) if fmt == "auto" else fmt
        if fmt == "auto":
            fmt = kind  # one format per file: the first problem decides
        p = _humaneval(where, d) if kind == "humaneval" else _mbpp(where, d)
        if p.task_id in seen:
            raise SuiteFileError(f"{where}: field 'task_id' {p.task_id!r} repeats the problem of line "
                                 f"{seen[p.task_id]}; task ids must be unique")
        seen[p.task_id] = lineno
        problems.append(p)
    if not problems:
        raise SuiteFileError(f"{path}: holds no problems")
    return problems


# -- candidates that must not pass ---------------------------------------------------------

def broken(problem: SuiteProblem) -> str:
    """The canonical program with the entry point returning None straight away."""
    tree = ast.parse(problem.canonical)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == problem.entry_point:
            node.body = [ast.Return(ast.Constant(None))]
            break
    return ast.unparse(tree) + "\n"


# Candidates that try to pass without solving anything. ``{ep}`` is the entry point.
# ``test_reader`` looks for the suite's assert lines in its own process (frames, every
# object) and answers from them: the candidate's process never holds the test code.
FORGERS = {
    "fd_writes": '''
import json, os
def {ep}(*args, **kwargs):
    lines = [json.dumps({{"i": i, "ok": True}}) for i in range(64)]
    lines += [json.dumps({{"n": n, "ok": True}}) for n in range(64)]
    lines += [json.dumps({{"id": n, "outcome": "pass", "tests_passed": 1, "tests_total": 1, "runtime_s": 0.0,
                          "output": ""}}) for n in range(64)]
    blob = ("\\n".join(lines) + "\\n").encode()
    for fd in range(0, 256):
        try:
            os.write(fd, blob)
        except OSError:
            pass
    return None
''',
    "eq_always_true": '''
class Anything:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    def __lt__(self, other):
        return True
    __le__ = __gt__ = __ge__ = __lt__
    def __bool__(self):
        return True
    def __hash__(self):
        return 0
    def __abs__(self):
        return 0
    def __sub__(self, other):
        return 0
    __rsub__ = __add__ = __radd__ = __sub__
    def __len__(self):
        return 0
    def __iter__(self):
        return iter(())
    def __getitem__(self, i):
        return self
def {ep}(*args, **kwargs):
    return Anything()
''',
    "eq_subclass": '''
class Everything(list):
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
def {ep}(*args, **kwargs):
    return Everything()
''',
    "sys_exit": '''
import sys
def {ep}(*args, **kwargs):
    sys.exit(0)
''',
    "os_exit": '''
import os
def {ep}(*args, **kwargs):
    os._exit(0)
''',
    "patched_builtins": '''
import builtins
class _Quiet(Exception):
    pass
builtins.AssertionError = _Quiet
builtins.isinstance = lambda *a: True
builtins.abs = lambda x: 0
builtins.len = lambda x: 0
builtins.print = lambda *a, **k: None
def {ep}(*args, **kwargs):
    raise AssertionError("patched away")
''',
    "kill_the_judge": '''
import os, signal
def {ep}(*args, **kwargs):
    for pid in range(1, 4096):
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return None
''',
    "test_reader": '''
import ast, gc, sys
def _texts():
    found = set()
    def wanted(x):
        return isinstance(x, str) and len(x) < 20000 and (x.lstrip().startswith("assert ") or "def check(" in x)
    def take(v):
        if wanted(v):
            found.add(v)
        elif isinstance(v, (list, tuple)) and len(v) < 10000:
            found.update(x for x in v if wanted(x))
        elif isinstance(v, dict) and len(v) < 10000:
            for x in list(v.values()):
                if wanted(x):
                    found.add(x)
                elif isinstance(x, (list, tuple)) and len(x) < 10000:
                    found.update(y for y in x if wanted(y))
    f = sys._getframe()
    while f is not None:
        for v in list(f.f_locals.values()):
            take(v)
        f = f.f_back
    for o in gc.get_objects():
        if isinstance(o, dict):
            take(o)
    return found
def _table():
    table = {{}}
    for text in _texts():
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq)
                    and isinstance(node.left, ast.Call)):
                try:
                    args = tuple(ast.literal_eval(a) for a in node.left.args)
                    table[repr(args)] = ast.literal_eval(node.comparators[0])
                except Exception:
                    pass
    return table
TABLE = []
def {ep}(*args, **kwargs):
    if not TABLE:
        TABLE.append(_table())
    return TABLE[0].get(repr(args))
''',
    "read_the_judge": '''
import os
def {ep}(*args, **kwargs):
    found = []
    for pid in os.listdir('/proc'):
        if pid.isdigit():
            for what in ('mem', 'environ', 'fd/3'):
                try:
                    with open('/proc/%s/%s' % (pid, what), 'rb') as fh:
                        found.append(fh.read(16))
                except OSError:
                    pass
    return found
''',
}


def forger(name: str, problem: SuiteProblem) -> str:
    return FORGERS[name].format(ep=problem.entry_point).lstrip()


# -- verification -------------------------------------------------------------------------

@dataclass
class SuiteReport:
    problems: int
    kept: list[str]
    excluded: list[dict]  # {"task_id", "outcome", "why", "source"}
    timeouts: dict[str, float]  # per kept problem
    seconds: float

    def to_dict(self) -> dict:
        return {"problems": self.problems, "kept": len(self.kept), "excluded": self.excluded,
                "seconds": round(self.seconds, 2)}


def verify_suite(problems: Sequence[SuiteProblem], run: Callable[[list[ExecJob]], list[ExecResult]],
                 log: Callable[[str], None] | None = None) -> SuiteReport:
    """Run every canonical solution once in the sandbox. Those that do not pass are excluded
    and reported (outcome, why, where in the file); each kept problem gets its timeout:
    ``max(MIN_TIMEOUT_S, TIME_FACTOR x`` its canonical runtime ``)``."""
    t0 = time.perf_counter()
    results = run([p.job(p.canonical, VERIFY_TIMEOUT_S) for p in problems])
    kept, excluded, timeouts = [], [], {}
    for p, r in zip(problems, results, strict=True):
        if r.passed:
            kept.append(p.task_id)
            timeouts[p.task_id] = round(max(MIN_TIMEOUT_S, TIME_FACTOR * r.runtime_s), 2)
        else:
            excluded.append({"task_id": p.task_id, "outcome": r.outcome, "why": r.output_excerpt[:200],
                             "source": p.source})
    if log:
        log(f"suite: {len(kept)} of {len(problems)} canonical solutions pass in the sandbox; "
            f"{len(excluded)} excluded" + (f" (e.g. {excluded[0]['task_id']}: {excluded[0]['outcome']})"
                                           if excluded else ""))
    return SuiteReport(len(problems), kept, excluded, timeouts, time.perf_counter() - t0)


def sample_mutants(problem: SuiteProblem, rng: random.Random, n: int = 3) -> list:
    """Realistic wrong candidates (AST mutants of the canonical program, as for the project's
    own tasks); empty when the canonical program offers no mutation site."""
    from sage_pipeline.sim import mutants

    try:
        ref = mutants.normalise(problem.canonical)
        return mutants.choose_mutants(ref, problem.entry_point, rng, n)
    except (mutants.MutationError, SyntaxError, ValueError, KeyError, RecursionError):
        return []


# -- an external suite as the simulator's task set ------------------------------------------

def _signature(program: str, entry_point: str) -> str:
    for line in program.splitlines():
        if line.lstrip().startswith(f"def {entry_point}("):
            return line.strip().rstrip(":")
    return f"def {entry_point}(...)"


def suite_tasks(problems: Sequence[SuiteProblem], run: Callable[[list[ExecJob]], list[ExecResult]], seed: int = 0,
                n_mutants: int = 3, log: Callable[[str], None] | None = None) -> tuple[list, SuiteReport]:
    """The problems as the simulator's tasks (``TaskRecord``; family = the suite's format).

    Canonical solutions run first (:func:`verify_suite`); problems whose canonical solution
    fails are left out and listed in the report. Candidates: the canonical solution
    (``reference``), its ``return None`` variant (``wrong_type``) and up to ``n_mutants`` AST
    mutants of it (as for the project's tasks); each runs once and a mutant that passes
    every check is marked equivalent. Difficulty is a proxy (no suite publishes one): the
    rank of the canonical program's length, in [0, 1]; its level is the tercile."""
    from sage_pipeline.sim.schema import Candidate, TaskRecord, split_of

    report = verify_suite(problems, run, log=log)
    rng = random.Random(seed)
    kept = [p for p in problems if p.task_id in report.timeouts]
    cands: dict[str, list[Candidate]] = {}
    jobs: list[tuple[str, Candidate, ExecJob]] = []
    for p in kept:
        tid = f"{p.suite}-{p.task_id}".replace("/", "-")
        own = [Candidate(f"{tid}/reference", "reference", p.canonical), Candidate(f"{tid}/wrong_type", "wrong_type",
                                                                                broken(p))]
        for k, m in enumerate(sample_mutants(p, rng, n_mutants)):
            own.append(Candidate(f"{tid}/{m.kind}-{k}", m.kind, m.code))
        cands[tid] = own
        jobs += [(tid, c, p.job(c.code, report.timeouts[p.task_id])) for c in own[1:]]
    results = run([j for _, _, j in jobs]) if jobs else []
    passed = {(tid, c.candidate_id) for (tid, c, _), r in zip(jobs, results, strict=True) if r.passed}
    order = sorted(kept, key=lambda p: len(p.canonical))
    rank = {p.task_id: (i / (len(order) - 1) if len(order) > 1 else 0.5) for i, p in enumerate(order)}
    tasks = []
    for p in kept:
        tid = f"{p.suite}-{p.task_id}".replace("/", "-")
        d = rank[p.task_id]
        tasks.append(TaskRecord(
            task_id=tid, family=p.suite, difficulty=round(d, 4),
            difficulty_level="easy" if d < 1 / 3 else "medium" if d < 2 / 3 else "hard",
            prompt=p.prompt, signature=_signature(p.canonical, p.entry_point), entry_point=p.entry_point,
            reference=p.canonical, tests=p.tests, timeout_s=report.timeouts[p.task_id],
            candidates=[Candidate(c.candidate_id, c.kind, c.code, equivalent=(tid, c.candidate_id) in passed)
                        for c in cands[tid]],
            split=split_of(tid)))
    if log:
        log(f"suite: {len(tasks)} tasks, {sum(len(t.candidates) for t in tasks)} candidates "
            f"({len(passed)} mutants passed every check: marked equivalent)")
    return tasks, report
