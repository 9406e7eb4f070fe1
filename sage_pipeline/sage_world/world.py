"""The model world: what every LLM that SAGE's ``sage run`` calls would answer, drawn from the
project's verified coding tasks with the calibrated chances of ``sim/data/sage_loop.yaml``, and
the exact expected outcome of each routed call (pure: no HTTP, no dagster).

SAGE's agents are told apart by their user message (SAGE's own templates: ``planner.py:626``,
``coder.py:414``, ``debugger.py:406``, ``reviewer.py:477``, ``test_engineer.py:170``,
``documentation.py:131``, ``architect.py:152``). The harness starts each ``sage run`` with a goal
that names the run (``[sage-world run=<id>]``); the world's planner copies that mark into the one
coder task it plans, so every later agent's prompt names the run and the world knows the task.

What each agent gets back (SAGE's parsers accept exactly these shapes):

* **planner**: one coder task writing ``<module>.py`` (a root-level module, so SAGE's reviewer
  calls its model) with ``verification: python -m pytest -q tests/test_<module>.py``. Its content
  does not depend on the planner's model (an assumption: no published planning figure).
* **coder** (model chosen by SAGE's UCB bandit): the task's reference solution with the
  calibrated first-attempt chance of that model (``SageLoopSim.p_code``), else one of the task's
  verified wrong candidates, uniformly.
* **reviewer**: the right verdict with probability ``0.5 + 0.5 * p_code(reviewer model)`` (an
  assumption: a model that would write the solution recognises a right or wrong one; otherwise
  it guesses). PASS scores ``review_pass_score``, FAIL ``review_fail_score``.
* **test_engineer**: the task's own verified tests as ``tests/test_<module>.py`` (guarded by a
  time and memory limit), so SAGE's verification command really runs the candidate.
* **debugger**: a wrong file is repaired with the calibrated chance of that model for that wrong
  candidate (``SageLoopSim.p_debug``: its outcome kind and share of tests passed); a failed
  repair leaves it as it was. A right file (a reviewer's false FAIL) stays right.
* documentation and architect (never planned by the world): a valid minimal answer.

Draws are seeded by (seed, run, agent, call number): the same seed gives the same world whatever
order concurrent runs reach the server in.

**Truth.** Every call the world answers is recorded (never in SAGE's journals): the run, the task,
the agent, the model, the file before and after, and the chance of a right file under each model
of the role's row in SAGE's table. From these chances and SAGE's control flow,
:mod:`sage_pipeline.sage_world.truth` gives the exact value of any policy SAGE's router can serve.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sim.loop_config import SageLoopConfig
from sage_pipeline.sim.loop_env import SageLoopSim
from sage_pipeline.sim.schema import OUTCOME_KINDS, TaskRecord

AGENTS = ("planner", "coder", "debugger", "reviewer", "test_engineer", "documentation", "architect")
# SAGE's user-message templates, by agent (the first words SAGE writes).
_PREFIX = (("Generate a Task DAG for the following goal.", "planner"),
           ("Implement the following task.", "coder"),
           ("Fix the following error.", "debugger"),
           ("Review this file for task: ", "reviewer"),
           ("Generate pytest tests for ", "test_engineer"),
           ("Produce the markdown PatchRequest for ", "documentation"),
           ("Design the project blueprint for:", "architect"))
RUN_MARK = re.compile(r"\[sage-world run=(?P<run>[A-Za-z0-9_.:-]+)\]")
MAX_RETRIES = 5  # `sage run`'s max_retries (cli/run_cmd.py:165): at most five debugger calls per task


class WorldError(ValueError):
    """A request the world cannot answer; the message says what was wrong."""


class WorldConfig(BaseModel):
    """The model world's settings (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = Field(0, description="seeds every draw: the same seed gives the same world")
    aliases: dict[str, str] = Field(
        default_factory=lambda: {"qwen2.5-coder:14b-instruct-q4_K_M": "qwen2.5-coder:14b"},
        description="SAGE's Ollama tag -> the calibrated model it is (Ollama's qwen2.5-coder:14b is the "
                    "14b-instruct-q4_K_M build; Aider's row for it names that tag)")
    review_pass_score: float = Field(0.9, ge=0.5, le=1.0, description="the reviewer's score with a PASS verdict")
    review_fail_score: float = Field(0.3, ge=0.0, lt=0.5, description="the reviewer's score with a FAIL verdict")
    chars_per_token: float = Field(4.0, gt=0, description="tokens reported = characters / this")
    adopt_unmarked: bool = Field(False, description="a planner goal without a run mark (SAGE's own `sage bench` "
                                 "prompts) becomes a run of a task chosen by a hash of the goal; off, it is refused")


def agent_of(messages: Sequence[dict]) -> str:
    """Which SAGE agent sent ``messages`` (its user message's template), or WorldError."""
    user = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), None)
    if user is None:
        raise WorldError("chat request without a user message: SAGE's agents always send one")
    for prefix, agent in _PREFIX:
        if user.startswith(prefix):
            return agent
    raise WorldError(f"no SAGE agent writes a user message starting {user[:60]!r}")


def module_of(task: TaskRecord) -> str:
    """The module the world's plan writes the task's function into: one per task (tasks of a family
    share their function's name, and runs in one SAGE workspace share its files), never a stdlib name."""
    return "sol_" + re.sub(r"\W", "_", task.task_id)


def _draw(seed: int, *key: object) -> np.random.Generator:
    digest = hashlib.sha256(json.dumps([seed, *map(str, key)]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


@dataclass
class _Run:
    """What the world knows about one `sage run`: its task, the file it wrote, the calls so far."""

    run: str
    task: int  # index into the world's tasks
    workspace: str | None = None
    slot: int = -2  # the file's candidate: -1 the reference, w >= 0 wrong candidate w, -2 none yet
    tests_written: bool = False
    tests_at_start: bool = False  # the workspace held this task's tests before the run (an earlier run of it)
    calls: dict[str, int] = field(default_factory=dict)


def verified_tests(task: TaskRecord) -> str:
    """The task's verified tests as a pytest module that cannot hang or exhaust the machine: the
    candidate gets the task's time limit per test and 2 GiB of address space."""
    mod = module_of(task)
    seconds = max(2, math.ceil(task.timeout_s * max(1, len(task.tests)) + 1))
    return (f'"""Tests of {task.entry_point} ({task.task_id}): the task\'s verified cases."""\n'
            "import json\nimport resource\nimport signal\n\n"
            "resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
            f"signal.alarm({seconds})\n\n"
            f"from {mod} import {task.entry_point}\n\n"
            f"CASES = json.loads({json.dumps(json.dumps(task.tests))})\n\n\n"
            "def _same(got, want):\n"
            "    if isinstance(want, float) or isinstance(got, float):\n"
            "        return isinstance(got, (int, float)) and abs(got - want) <= 1e-9 * max(1.0, abs(want))\n"
            "    if isinstance(want, list):\n"
            "        return isinstance(got, list) and len(got) == len(want) and all(map(_same, got, want))\n"
            "    if isinstance(want, dict):\n"
            "        return (isinstance(got, dict) and got.keys() == want.keys()\n"
            "                and all(_same(got[k], want[k]) for k in want))\n"
            "    return type(got) is type(want) and got == want\n\n\n"
            f"def test_{task.entry_point}():\n"
            "    for case in CASES:\n"
            f"        got = json.loads(json.dumps({task.entry_point}(*case['args'])))\n"
            "        assert _same(got, case['expected']), (case['args'], got, case['expected'])\n")


class ModelWorld:
    """The world over ``sim``'s tasks (a :class:`SageLoopSim`: the calibrated chances), answering
    as SAGE's models would; ``table`` is SAGE's own models.yaml (its rows are the routed
    alternatives the truth covers). Thread-safe: one server serves concurrent runs."""

    def __init__(self, sim: SageLoopSim, table: RoutingTable, config: WorldConfig | None = None) -> None:
        self.sim, self.table, self.config = sim, table, config or WorldConfig()
        self.tasks = sim.tasks
        self.by_id = {t.task_id: i for i, t in enumerate(self.tasks)}
        self._runs: dict[str, _Run] = {}
        self._assigned: dict[str, int] = {}
        self._workspace: dict[str, str | None] = {}
        self._tests_in: set[tuple[str, int]] = set()  # (workspace, task) whose tests SAGE wrote there
        self._lock = threading.Lock()
        self.truth: list[dict] = []
        self.adopted: list[dict] = []  # runs made for unmarked goals, in the order SAGE planned them
        calibrated = set(sim.code_models) | set(sim.debug_models)
        for role in ("coder", "debugger", "reviewer"):
            for m in self.row(role):
                if self.calibrated(m) not in calibrated:
                    raise WorldError(f"{table.source}: routing.{role} names {m!r}, which the calibration "
                                     f"({sim.config.source}) has no figures for; add an alias in WorldConfig.aliases "
                                     f"to one of {sorted(calibrated)}")
        self._code = {m: j for j, m in enumerate(sim.code_models)}
        self._p_code: dict[tuple[int, str], float] = {}  # (task, model) -> chance: the truth asks often
        self._debug = {m: j for j, m in enumerate(sim.debug_models)}

    # ------------------------------------------------------------------ models and chances
    def calibrated(self, model: str) -> str:
        return self.config.aliases.get(model, model)

    def row(self, role: str) -> tuple[str, str]:
        r = self.table.routes[role]
        return (r.primary, r.fallback)

    def p_code(self, task: int, model: str) -> float:
        """The chance that ``model``'s first attempt at ``task`` is right (the calibration's coder)."""
        got = self._p_code.get((task, model))
        if got is None:
            m = self.calibrated(model)
            if m not in self._code:
                raise WorldError(f"model {model!r} has no coder figures in {self.sim.config.source}")
            counts = np.zeros((1, self.sim.n_calls), dtype=np.int64)
            got = self._p_code[task, model] = float(self.sim.p_code(np.array([task]), counts)[0, self._code[m]])
        return got

    def p_fix(self, task: int, slot: int, model: str) -> float:
        """The chance that ``model``'s repair of the file in ``slot`` is right (1 for a right file)."""
        if slot == -1:
            return 1.0
        m = self.calibrated(model)
        if m not in self._debug:
            raise WorldError(f"model {model!r} has no debugger figures in {self.sim.config.source}")
        return float(self.sim.p_debug[task, slot, self._debug[m]])

    def review_accuracy(self, task: int, model: str) -> float:
        return 0.5 + 0.5 * self.p_code(task, model)

    # ------------------------------------------------------------------ runs
    def assign(self, run: str, task_id: str, workspace: str | None = None) -> None:
        """Tell the world which task run ``run`` is (the harness does, before starting SAGE) and in
        which SAGE workspace it runs (runs there share files: a task's tests written by an earlier run
        are still there)."""
        if task_id not in self.by_id:
            raise WorldError(f"run {run!r}: unknown task {task_id!r}")
        with self._lock:
            self._assigned[run] = self.by_id[task_id]
            self._workspace[run] = workspace

    def _run_of(self, text: str, agent: str) -> _Run:
        m = RUN_MARK.search(text)
        if m is None:
            raise WorldError(f"{agent} request names no run (no '[sage-world run=...]' mark): the harness puts "
                             "it in the goal of `sage run`")
        run = m["run"]
        r = self._runs.get(run)
        if r is None:
            if run not in self._assigned:
                raise WorldError(f"run {run!r} was never assigned a task (ModelWorld.assign)")
            ws, task = self._workspace.get(run), self._assigned[run]
            there = ws is not None and (ws, task) in self._tests_in
            r = self._runs[run] = _Run(run, task, ws, tests_written=there, tests_at_start=there)
        return r

    def _file(self, task: TaskRecord, slot: int) -> str:
        code = task.reference if slot == -1 else task.wrong_candidates()[slot].code
        # a header line keeps every candidate >= 3 lines (SAGE's reviewer fails shorter files unread)
        return f'"""{task.entry_point}: solution for task {task.task_id}."""\n\n{code.rstrip()}\n'

    def answer(self, model: str, messages: Sequence[dict]) -> tuple[str, dict]:
        """The content of ``model``'s reply to ``messages`` and its truth record."""
        agent = agent_of(messages)
        text = "\n".join(str(m.get("content") or "") for m in messages)
        with self._lock:
            if agent == "planner":
                return self._planner(text, model)
            if agent in ("documentation", "architect"):
                return self._other(agent, model)
            r = self._run_of(text, agent)
            n = r.calls.get(agent, 0)
            r.calls[agent] = n + 1
            rng = _draw(self.config.seed, r.run, agent, n)
            return getattr(self, f"_{agent}")(r, model, n, rng)

    def _adopt(self, text: str) -> str:
        """A run for a goal the harness did not mark (``sage bench``): its task by a hash of the goal's
        first paragraph (SAGE may append fix patterns after it), a new run per time it is seen."""
        goal = text.split("GOAL: ", 1)[-1].split("\n\n", 1)[0].strip()
        h = hashlib.sha256(goal.encode()).hexdigest()
        n = sum(1 for r in self.adopted if r["hash"] == h)
        run = f"adopt-{h[:10]}-{n}"
        self._assigned[run] = int(h, 16) % len(self.tasks)
        self._workspace[run] = "adopted"  # `sage bench` runs all its prompts, both arms, in one folder
        self.adopted.append({"run": run, "hash": h, "goal": goal[:200],
                             "task_id": self.tasks[self._assigned[run]].task_id})
        return run

    def _planner(self, text: str, model: str) -> tuple[str, dict]:
        m = RUN_MARK.search(text)
        if m is None and self.config.adopt_unmarked:
            run = self._adopt(text)
        elif m is None or m["run"] not in self._assigned:
            raise WorldError("planner goal names no assigned run: start `sage run` through the harness")
        else:
            run = m["run"]
        task = self.tasks[self._assigned[run]]
        mod = module_of(task)
        desc = (f"[sage-world run={run}] Implement `{task.signature}` in {mod}.py at the project root. "
                + task.prompt.replace("\n", " "))
        dag = {"brainstorm_questions": [], "confirmed": True, "dag": {"nodes": [
            {"id": "task_001", "description": desc, "dependencies": [], "assigned_agent": "coder",
             "verification": f"python -m pytest -q tests/test_{mod}.py"}]}}
        return json.dumps(dag), {"run": run, "task_id": task.task_id, "agent": "planner", "model": model}

    def _other(self, agent: str, model: str) -> tuple[str, dict]:
        if agent == "documentation":
            body = {"file": "README.md", "operation": "create",
                    "patch": "# Project\n\nWritten by the model world.\n\nSee the modules at the project root.\n"}
        else:
            body = {"folders": [], "files": [], "tech_decisions": {}, "summary": "single-module task"}
        return json.dumps(body), {"agent": agent, "model": model}

    def _base(self, r: _Run, agent: str, model: str, n: int) -> dict:
        return {"run": r.run, "task_id": self.tasks[r.task].task_id, "agent": agent, "model": model,
                "call": n, "slot_before": r.slot}

    def _coder(self, r: _Run, model: str, n: int, rng: np.random.Generator) -> tuple[str, dict]:
        task = self.tasks[r.task]
        p = self.p_code(r.task, model)
        rec = self._base(r, "coder", model, n)
        r.slot = -1 if rng.random() < p else int(rng.integers(len(task.wrong_candidates())))
        rec.update(p_right={m: self.p_code(r.task, m) for m in self.row("coder")}, slot_after=r.slot)
        mod = module_of(task)
        return json.dumps({"file": f"{mod}.py", "operation": "create", "patch": self._file(task, r.slot),
                           "reason": f"implement {task.entry_point}", "epistemic_flags": []}), rec

    def _reviewer(self, r: _Run, model: str, n: int, rng: np.random.Generator) -> tuple[str, dict]:
        right = r.slot == -1
        acc = self.review_accuracy(r.task, model)
        says_pass = right if rng.random() < acc else not right
        rec = self._base(r, "reviewer", model, n)
        rec.update(accuracy=acc, right=right, verdict="PASS" if says_pass else "FAIL")
        c = self.config
        if says_pass:
            body = {"verdict": "PASS", "score": c.review_pass_score, "issues": [], "suggestion": ""}
        else:
            body = {"verdict": "FAIL", "score": c.review_fail_score,
                    "issues": ["HIGH: the function does not meet the task's examples"],
                    "suggestion": "Check the edge cases against the task's examples."}
        return json.dumps(body), rec

    def _test_engineer(self, r: _Run, model: str, n: int, rng: np.random.Generator) -> tuple[str, dict]:
        task = self.tasks[r.task]
        r.tests_written = True
        if r.workspace is not None:
            self._tests_in.add((r.workspace, r.task))
        rec = self._base(r, "test_engineer", model, n)
        return json.dumps({"file": f"tests/test_{module_of(task)}.py", "operation": "create",
                           "patch": verified_tests(task), "reason": "the task's verified cases"}), rec

    def _debugger(self, r: _Run, model: str, n: int, rng: np.random.Generator) -> tuple[str, dict]:
        task = self.tasks[r.task]
        k = n + 1  # SAGE's failure count for its k-th debugger call (next_retry)
        rec = self._base(r, "debugger", model, n)
        rec.update(failure_count=k, tests_written=r.tests_written,
                   p_right={m: self.p_fix(r.task, r.slot, m) for m in self.row("debugger")})
        if r.slot == -2:  # nothing written yet (the coder's reply was unusable): write a first attempt
            right = rng.random() < self.p_code(r.task, model)
            r.slot = -1 if right else int(rng.integers(len(task.wrong_candidates())))
        elif r.slot >= 0 and rng.random() < self.p_fix(r.task, r.slot, model):
            r.slot = -1
        rec["slot_after"] = r.slot
        patch = {"file": f"{module_of(task)}.py", "operation": "edit", "patch": self._file(task, r.slot),
                 "reason": "repair", "suspected_cause": "the failing case (0.60)", "epistemic_flags": []}
        return json.dumps({"phase_3_hypothesize": {"most_likely_cause": "the failing case", "confidence": 0.6,
                                                   "reasoning": "the error names the failing check"},
                           "phase_4_patch": patch}), rec

    def final_right(self, run: str) -> bool:
        """Whether the file run ``run`` ended with is the task's right solution."""
        with self._lock:
            r = self._runs.get(run)
            return r is not None and r.slot == -1

    def tests_at_start(self, run: str) -> bool:
        with self._lock:
            r = self._runs.get(run)
            return r is not None and r.tests_at_start

    def coder_model(self, run: str) -> str | None:
        """The model the coder of run ``run`` called (SAGE's bandit chose it), or None."""
        with self._lock:
            return next((t["model"] for t in self.truth if t.get("run") == run and t.get("agent") == "coder"), None)

    # ------------------------------------------------------------------ reporting
    def tokens(self, messages: Sequence[dict], content: str) -> tuple[int, int]:
        cpt = self.config.chars_per_token
        prompt = sum(len(str(m.get("content") or "")) for m in messages)
        return max(1, math.ceil(prompt / cpt)), max(1, math.ceil(len(content) / cpt))

    def latency_s(self, model: str) -> float:
        """The calibrated seconds of one call (Aider's seconds per exercise over its calls), or 0
        for a model without figures."""
        m = self.sim.config.models.get(self.calibrated(model))
        return float(m.latency_s) if m is not None else 0.0

    def outcome_kind(self, task: int, slot: int) -> str:
        if slot == -1:
            return "pass"
        if slot < 0:
            return "none"
        return OUTCOME_KINDS[int(self.sim.outcomes.wrong_kind[task, slot])]


def build_world(table: str | Path, n_tasks: int = 300, task_seed: int = 0, config: WorldConfig | None = None,
                workers: int = 2,
                progress=lambda msg: None) -> ModelWorld:
    """The world over ``n_tasks`` generated coding tasks (``sim.tasks.generate_tasks``), each verified
    and its wrong candidates' outcomes measured by the local sandbox (the tasks are the project's
    own, trusted code), with the calibration of ``sim/data/sage_loop.yaml``; ``table``: SAGE's own
    models.yaml, the one its router reads (``SageInstall.models_yaml``)."""
    from sage_pipeline.sim import tasks as task_gen
    from sage_pipeline.sim.env import resolve_outcomes
    from sage_pipeline.sim.sandbox import open_sandbox

    tasks = task_gen.generate_tasks(n_tasks, seed=task_seed)
    with open_sandbox("local", workers=workers) as sb:
        run = lambda jobs: sb.run(jobs)  # noqa: E731
        tasks, report = task_gen.verify_tasks(tasks, run)
        progress(f"model world: {len(tasks)} of {n_tasks} tasks verified")
        usable, outcomes, skipped = resolve_outcomes(tasks, None, run)
    sim = SageLoopSim(usable, outcomes, SageLoopConfig.load(), RoutingTable.load(SageLoopConfig.load().routing_table),
                      skipped)
    for i, t in enumerate(sim.tasks):  # the world indexes wrong candidates as the outcomes do
        if [c.candidate_id for c in t.wrong_candidates()] != list(outcomes.wrong_ids[i]):
            raise WorldError(f"task {t.task_id}: wrong candidates out of order with their outcomes")
    progress(f"model world: {len(sim.tasks)} tasks with verified wrong candidates ({len(skipped)} skipped)")
    return ModelWorld(sim, RoutingTable.load(table), config)


def write_truth(records: Sequence[dict], path: str | Path) -> Path:
    from sage_pipeline import artifacts

    return artifacts.write_text(Path(path), "".join(json.dumps(r, sort_keys=True) + "\n" for r in records))


def world_info(world: ModelWorld) -> dict[str, Any]:
    """What the truth file's readers need besides the records: the rows and the settings."""
    return {"seed": world.config.seed, "config": world.config.model_dump(), "table": str(world.table.source),
            "calibration": world.sim.config.source,
            "rows": {r: world.row(r) for r in ("coder", "debugger", "reviewer")},
            "tasks": len(world.tasks), "max_retries": MAX_RETRIES}
