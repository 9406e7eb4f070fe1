"""The night's judge: score a coder's answer by the task's tests, hard (pass 1 / fail 0) and soft (partial
credit in [0, 1]).

The code in the answer (a fenced block, else the whole answer) runs against the tests in the sandbox
(``sage_pipeline.sim.sandbox``); soft is the share of tests passed. A sandbox failure raises
:class:`JudgeError`: infrastructure, not a verdict. A test module SAGE's test engineer wrote (a workspace
test, :mod:`sage_pipeline.sleep.records`) is run unchanged by SAGE's verification command in the sandbox,
the answer's code in the module's file: hard is the command's verdict (exit 0 with pytest's report of
passed tests), soft the share of pytest's tests that passed (below 1 unless hard is 1).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from sage_pipeline.sleep.records import TaskRecord


class JudgeError(RuntimeError):
    """A judge could not give a verdict (sandbox down): the night stops, nothing is scored."""


@dataclass(frozen=True)
class Judgement:
    hard: float
    soft: float
    why: str = ""


def extract_code(response: str) -> str:
    """The code of an answer: its first ```python (or bare ```) block, else the whole answer."""
    m = re.search(r"```(?:python|py)?[ \t]*\n(.*?)```", response, re.DOTALL)
    return m.group(1) if m else response


def _is_workspace(tests: list) -> bool:
    return len(tests) == 1 and isinstance(tests[0], dict) and "command" in tests[0]


def _pytest_share(excerpt: str) -> float:
    """The share of pytest's tests that passed, from the verdict's head (``exit 1: 3 passed, 1 failed``)."""
    head = excerpt.split(" | ", 1)[0]
    counts = {w: int(n) for n, w in re.findall(r"(\d+) (passed|failed|error)\b", head)}
    total = sum(counts.values())
    return counts.get("passed", 0) / total if total else 0.0


@dataclass
class UnitTestJudge:
    """Runs answers' code through the sandbox, opened on first use; results are cached by
    (code, tests), so an unchanged answer is not run twice."""

    sandbox: str = "local"  # local | docker
    workers: int = 1
    log: Callable[[str], None] | None = None
    cache: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)  # more SandboxConfig fields (image, memory_mb, docker, ...)
    executed: int = 0
    _cm: object = None
    _sb: object = None

    def run(self, items: list[tuple[TaskRecord, str]], raw: bool = False) -> list[Judgement]:
        """The verdicts on (task, answer) pairs; ``raw``: each answer is the code itself (a file's text),
        never cut to its first fenced block."""
        jobs = [self._job(t, resp if raw else extract_code(resp)) for t, resp in items]
        todo = {j.key: j for j in jobs if j.key not in self.cache}
        if todo:
            from sage_pipeline.sim.sandbox import SandboxError

            try:
                results = self._sandbox().run(list(todo.values()), log=self.log)
            except SandboxError as e:
                raise JudgeError(f"unit-test judge: the {self.sandbox} sandbox failed: {e}") from e
            self.executed += len(todo)
            self.cache.update(zip(todo, results, strict=True))
        out = []
        for j in jobs:
            r = self.cache[j.key]
            if _is_workspace(j.tests):  # one command: pytest's own counts give the partial credit
                soft = 1.0 if r.passed else min(_pytest_share(r.output_excerpt), 0.999)
                why = "" if r.passed else f"{r.outcome}: {j.tests[0]['command']}: {r.output_excerpt[:200]}"
            else:
                soft = r.tests_passed / r.tests_total if r.tests_total else 0.0
                why = "" if r.passed else (f"{r.outcome}: {r.tests_passed}/{r.tests_total} tests; "
                                           f"{r.output_excerpt[:120]}")
            out.append(Judgement(1.0 if r.passed else 0.0, soft, why))
        return out

    @staticmethod
    def _job(t: TaskRecord, code: str):
        from sage_pipeline.sim.schema import ExecJob

        tests = t.reference["tests"]
        entry = tests[0]["code_file"] if _is_workspace(tests) else t.reference["entry_point"]
        return ExecJob(code=code, entry_point=entry, tests=tests, timeout_s=float(t.reference["timeout_s"]))

    def _sandbox(self):
        if self._sb is None:
            from sage_pipeline.sim.sandbox import SandboxError, open_sandbox

            cm = open_sandbox(backend=self.sandbox, workers=self.workers, **self.options)
            try:
                self._sb = cm.__enter__()
            except SandboxError as e:
                raise JudgeError(f"unit-test judge: the {self.sandbox} sandbox did not start: {e}") from e
            self._cm = cm
        return self._sb

    def describe(self) -> dict:
        d = {"sandbox": self.sandbox, "executions": self.executed, "cached_results": len(self.cache),
             "untrusted": bool(self.options.get("untrusted")),
             "allow_untrusted_local": bool(self.options.get("allow_untrusted_local"))}
        if self._sb is not None:
            d["isolated"] = self._sb.isolated
        if self.sandbox == "local":
            d["note"] = ("local sandbox: UNISOLATED processes running code the project did not write, by the explicit "
                         "override allow_untrusted_local" if d["untrusted"] else
                         "local sandbox: unisolated processes, for the simulated backend's own answers only")
        return d

    def close(self) -> None:
        if self._cm is not None:
            cm, self._cm, self._sb = self._cm, None, None
            cm.__exit__(None, None, None)
