"""The coding tasks of the simulator: generated from the families, verified by execution.

``generate_tasks(n_tasks, seed)`` spreads ``n_tasks`` over the families (the registry in
``sim/families``), draws each family's tasks from its own seeded stream (so adding a family
does not change the others' tasks), keeps only distinct ones (a different description,
hence different reference and tests), runs each reference in-process on its inputs to
get the expected values (JSON round-tripped), times it, and derives the timeout as
EvalPlus does: ``max(min_timeout_s, time_factor * reference runtime)`` (EvalPlus: factor 4,
floor 4 s; the floor here is 0.3 s so a hanging candidate costs little). Each task gets
its reference plus ``n_wrong`` wrong candidates (``sim.mutants``); about
``infinite_loop_share`` of the tasks carry an infinite loop and ``memory_blowup_share`` a
memory blow-up, since each of those costs its timeout or a trip to the memory limit.

``verify_tasks(tasks, run_jobs)`` executes every candidate in a sandbox: a task whose
reference fails is dropped (or generation raises when a whole family fails), a mutant that
passes every test is marked ``equivalent``, and a task left with fewer than ``min_wrong``
non-equivalent wrong candidates gets new ones (up to ``max_rounds``) or is dropped. The
report says what happened per family, difficulty level and candidate kind.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import random
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sage_pipeline.errors import ConfigError
from sage_pipeline.sim import mutants
from sage_pipeline.sim.families import FAMILIES, Family, FamilyError, TaskSpec
from sage_pipeline.sim.schema import (
    CANDIDATE_KINDS,
    DIFFICULTY_LEVELS,
    OUTCOME_KINDS,
    Candidate,
    ExecJob,
    ExecResult,
    TaskRecord,
    split_of,
)

DEFAULT_N_TASKS = 1200
TIME_FACTOR = 4.0  # EvalPlus's --gt-time-limit-factor
MIN_TIMEOUT_S = 0.3  # EvalPlus's --min-time-limit is 4 s; kept small so hanging candidates cost little
CONFIG = "sim_tasks config"

Log = Callable[[str], None]
RunJobs = Callable[[list[ExecJob]], list[ExecResult]]


class TaskGenerationError(RuntimeError):
    """A family cannot produce what was asked, or its references fail: a bug in the family."""


class GenerationConfig(BaseModel):
    """How many tasks, from which families, and what each carries. Bad values are a
    :class:`ConfigError` from :func:`generate_tasks` (a ValidationError when the model is made)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_tasks: int = Field(DEFAULT_N_TASKS, ge=1, description="tasks to generate, spread over the families (every "
                         "family needs at least one)")
    seed: int = Field(0, description="seed of the parameters and test inputs")
    families: list[str] | None = Field(None, description="the families to draw from, each once (null: every "
                                       "registered family)")
    n_wrong: int = Field(4, ge=3, le=7, description="wrong candidates per task, in [3, 7]: each task needs at least "
                         "3 that survive verification")
    infinite_loop_share: float = Field(0.12, ge=0.0, le=0.5, description="share of tasks carrying an infinite loop, "
                                       "in [0, 0.5]: each costs its timeout, so keep it a minority (0.1-0.15)")
    memory_blowup_share: float = Field(0.12, ge=0.0, le=0.5, description="share of tasks carrying a memory blow-up, "
                                       "in [0, 0.5]: each costs a trip to the memory limit, so keep it a minority "
                                       "(0.1-0.15)")
    time_factor: float = Field(TIME_FACTOR, ge=1.0, description="a task's timeout is this many times its "
                               "reference's runtime (EvalPlus: 4), >= 1 so correct code does not time out")
    min_timeout_s: float = Field(MIN_TIMEOUT_S, gt=0.0, description="and at least this many seconds (EvalPlus: 4 "
                                 "s; small here so hanging candidates cost little), > 0")

    @field_validator("families")
    @classmethod
    def _known_families(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return v
        unknown = [n for n in v if n not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown famil{'y' if len(unknown) == 1 else 'ies'} {', '.join(map(repr, unknown))} "
                             f"(known: {', '.join(FAMILIES)})")
        if not v:
            raise ValueError("is empty: name at least one family or leave it unset")
        dup = sorted(n for n, c in Counter(v).items() if c > 1)
        if dup:
            raise ValueError(f"names {', '.join(map(repr, dup))} more than once: list each family once")
        return v

    def chosen_families(self) -> list[Family]:
        """The families to draw from; every one of them gets at least one task."""
        names = list(self.families) if self.families is not None else list(FAMILIES)
        if self.n_tasks < len(names):
            raise ConfigError(CONFIG, "n_tasks", f"{self.n_tasks!r} is below the number of families ({len(names)})",
                              f"every family needs at least one task: raise n_tasks to {len(names)} or more, "
                              "or choose fewer families")
        return [FAMILIES[n] for n in names]


def generation_config(**options: Any) -> GenerationConfig:
    """A :class:`GenerationConfig`, or a :class:`ConfigError` naming the field, what was wrong and
    what is allowed."""
    try:
        return GenerationConfig(**options)
    except ValidationError as e:
        err = e.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else "sim_tasks"
        field = GenerationConfig.model_fields.get(name)
        raise ConfigError(CONFIG, name, f"{err['input']!r}: {err['msg'].removeprefix('Value error, ')}",
                          field.description if field is not None else "") from None


# ----------------------------------------------------------------------------- generation

@dataclass
class _Built:
    spec: TaskSpec  # its raw reference is what the family's variants substitute into
    task: TaskRecord  # without candidates and difficulty level yet


def _json(value: object, what: str) -> object:
    try:
        return json.loads(json.dumps(value))
    except (TypeError, ValueError) as e:
        raise FamilyError(f"{what} is not JSON ({e})") from e


def _fmt_call(entry: str, args: list) -> str:
    return f"{entry}({', '.join(repr(a) for a in args)})"


def _build(spec: TaskSpec, fam: Family, task_id: str, cfg: GenerationConfig) -> _Built:
    where = f"family {fam.name} ({fam.module}), task {task_id}, params {spec.params}"
    try:
        reference = mutants.normalise(spec.reference)
        tree = ast.parse(reference)
    except SyntaxError as e:
        raise FamilyError(f"{where}: the reference is not valid Python ({e})") from e
    namespace: dict = {"__name__": "reference"}
    exec(compile(reference, f"<{task_id} reference>", "exec"), namespace)  # noqa: S102 - our own generated code
    fn = namespace.get(spec.entry_point)
    if not callable(fn) or f"def {spec.entry_point}(" not in spec.signature:
        raise FamilyError(f"{where}: the reference does not define {spec.entry_point!r} as its signature "
                          "says")

    inputs, seen = [], set()
    for args in spec.edge_inputs + spec.random_inputs:
        key = json.dumps(args, sort_keys=True)
        if _json(args, f"{where}: arguments {args!r}") != args:
            raise FamilyError(f"{where}: arguments {args!r} change through JSON (use lists, str keys, no "
                              "floats)")
        if key not in seen:
            seen.add(key)
            inputs.append(key)

    def run_all() -> tuple[list, float]:
        out = []
        t0 = time.perf_counter()
        for key in inputs:
            args = json.loads(key)
            try:
                result = fn(*args)
            except Exception as e:  # the family's own reference: a bug to report, not a candidate's failure
                raise FamilyError(f"{where}: the reference raises {type(e).__name__}: {e} on "
                                  f"{_fmt_call(spec.entry_point, args)}") from e
            out.append(result)
        return out, time.perf_counter() - t0

    results, best = run_all()
    for _ in range(2):
        again, elapsed = run_all()
        best = min(best, elapsed)
        if again != results:
            raise FamilyError(f"{where}: the reference is not deterministic")
    tests = [{"args": json.loads(k), "expected": _json(r, f"{where}: result of {k}")}
             for k, r in zip(inputs, results)]
    for t in tests:
        if _has_float(t["expected"]):
            raise FamilyError(f"{where}: expected value {t['expected']!r} holds a float; return ints")

    size = len(list(ast.walk(tree)))
    difficulty = spec.difficulty + 0.15 * min(1.0, max(0.0, (size - 60) / 200))
    difficulty = round(min(0.98, max(0.02, difficulty)), 4)
    examples = [t for t in tests[len(spec.edge_inputs):] if len(repr(t["args"]) + repr(t["expected"])) < 110]
    shown = random.Random(task_id).sample(examples, min(2, len(examples)))
    prompt = (f"Write a Python function `{spec.entry_point}`. {spec.description}\n\n"
              + "".join(f"Example: {_fmt_call(spec.entry_point, t['args'])} == {t['expected']!r}\n"
                        for t in shown))
    task = TaskRecord(task_id=task_id, family=fam.name, difficulty=difficulty, difficulty_level="",
                      prompt=prompt.rstrip("\n"), signature=spec.signature, entry_point=spec.entry_point,
                      reference=reference, tests=tests,
                      timeout_s=round(max(cfg.min_timeout_s, cfg.time_factor * best), 3),
                      split=split_of(task_id))
    return _Built(spec=spec, task=task)


def _has_float(value: object) -> bool:
    if isinstance(value, float):
        return True
    if isinstance(value, list):
        return any(_has_float(v) for v in value)
    if isinstance(value, dict):
        return any(_has_float(v) for v in value.values())
    return False


def _quotas(n_tasks: int, fams: list[Family]) -> dict[str, int]:
    per, extra = divmod(n_tasks, len(fams))
    return {f.name: per + (i < extra) for i, f in enumerate(fams)}


def _draw_family(fam: Family, quota: int, cfg: GenerationConfig) -> list[_Built]:
    rng = random.Random(f"sim_tasks:{cfg.seed}:{fam.name}")
    built: list[_Built] = []
    descriptions: set[str] = set()
    tries, max_tries = 0, 60 * quota + 200
    while len(built) < quota:
        tries += 1
        if tries > max_tries:
            raise TaskGenerationError(
                f"family {fam.name} ({fam.module}) gave only {len(built)} distinct tasks in {max_tries} "
                f"draws, {quota} were asked: lower n_tasks, add families, or widen the family's parameters")
        spec = fam(rng)
        if spec.description in descriptions:
            continue
        descriptions.add(spec.description)
        built.append(_build(spec, fam, f"{fam.name}-{len(built):04d}", cfg))
    return built


def _candidates(b: _Built, cfg: GenerationConfig, forced: list[str], sites: dict) -> list[Candidate]:
    task = b.task
    where = f"family {task.family}, task {task.task_id}"
    variants = [mutants.Mutant(v.kind, mutants.apply_variant(b.spec.reference, v.old, v.new, where), v.note)
                for v in b.spec.variants]
    rng = random.Random(f"sim_tasks:{cfg.seed}:{task.task_id}:candidates")
    chosen = mutants.choose_mutants(task.reference, task.entry_point, rng, n=cfg.n_wrong, forced=forced,
                                    variants=variants, sites=sites)
    reference = Candidate(f"{task.task_id}/reference", "reference", task.reference)
    return [reference] + _with_ids(task.task_id, chosen, [])


def _with_ids(task_id: str, chosen: Sequence[mutants.Mutant],
              existing: Sequence[Candidate]) -> list[Candidate]:
    count = Counter(c.kind for c in existing)
    out = []
    for m in chosen:
        count[m.kind] += 1
        suffix = "" if count[m.kind] == 1 else f"-{count[m.kind]}"
        out.append(Candidate(f"{task_id}/{m.kind}{suffix}", m.kind, m.code))
    return out


def assign_levels(tasks: list[TaskRecord]) -> list[TaskRecord]:
    """easy / medium / hard by the terciles of the tasks' difficulties."""
    if not tasks:
        return []
    d = np.array([t.difficulty for t in tasks])
    q1, q2 = np.quantile(d, [1 / 3, 2 / 3])
    level = np.where(d <= q1, 0, np.where(d <= q2, 1, 2))
    return [dataclasses.replace(t, difficulty_level=DIFFICULTY_LEVELS[i]) for t, i in zip(tasks, level)]


def generate_tasks(n_tasks: int = DEFAULT_N_TASKS, seed: int = 0, *, log: Log | None = None,
                   **options: Any) -> list[TaskRecord]:
    """``n_tasks`` distinct tasks spread over the families (``options``: the other
    :class:`GenerationConfig` fields, e.g. ``families``), deterministic for ``seed``.

    Candidates are not yet verified: run :func:`verify_tasks` with a sandbox.
    """
    return generate(generation_config(n_tasks=n_tasks, seed=seed, **options), log)


def generate(cfg: GenerationConfig, log: Log | None = None) -> list[TaskRecord]:
    """The tasks ``cfg`` asks for (see :func:`generate_tasks`)."""
    fams = cfg.chosen_families()
    n_tasks, seed = cfg.n_tasks, cfg.seed
    t0 = time.perf_counter()
    quotas = _quotas(n_tasks, fams)
    built: list[_Built] = []
    for fam in fams:
        built += _draw_family(fam, quotas[fam.name], cfg)
        if log and len(built) and (fam is fams[-1] or len(built) % 300 < quotas[fam.name]):
            dt = time.perf_counter() - t0
            log(f"sim_tasks: {len(built)}/{n_tasks} tasks built ({len(built) / max(dt, 1e-9):.0f}/s)")

    # infinite loops go to tasks whose reference has a loop to break, so their share of all tasks is on target
    sites = [mutants.find_sites(b.task.reference, b.task.entry_point) for b in built]
    loopable = [bool(s["infinite_loop"]) for s in sites]
    p_loop = min(0.9, cfg.infinite_loop_share * len(built) / max(1, sum(loopable)))
    tasks = []
    for b, can_loop, task_sites in zip(built, loopable, sites):
        rng = random.Random(f"sim_tasks:{seed}:{b.task.task_id}:forced")
        forced = []
        if rng.random() < cfg.memory_blowup_share:
            forced.append("memory_blowup")
        if can_loop and rng.random() < p_loop:
            forced.append("infinite_loop")
        tasks.append(dataclasses.replace(b.task, candidates=_candidates(b, cfg, forced, task_sites)))
    tasks = assign_levels(tasks)
    if log:
        dt = time.perf_counter() - t0
        n_cand = sum(len(t.candidates) for t in tasks)
        log(f"sim_tasks: {len(tasks)} tasks, {n_cand} candidates from {len(fams)} families in {dt:.1f} s")
    return tasks


# ----------------------------------------------------------------------------- verification

@dataclass
class VerifyReport:
    tasks_in: int
    tasks_out: int = 0
    jobs: int = 0  # executions (distinct code and tests)
    rounds: int = 0
    seconds: float = 0.0
    per_family: dict[str, int] = field(default_factory=dict)  # tasks kept
    per_level: dict[str, int] = field(default_factory=dict)
    per_kind: dict[str, int] = field(default_factory=dict)  # usable (non-equivalent) wrong candidates
    equivalent: dict[str, int] = field(default_factory=dict)  # mutants that passed every test
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)  # candidate kind -> outcome -> count
    regenerated: list[str] = field(default_factory=list)  # tasks that needed new wrong candidates
    reference_retries: int = 0  # references run twice because the first run timed out or was killed
    dropped: list[dict] = field(default_factory=list)  # {"task_id", "family", "reason"}

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


Verified = tuple[list[TaskRecord], VerifyReport]  # the tasks kept, and what happened


def _excerpt(r: ExecResult) -> str:
    text = " ".join(r.output_excerpt.split())
    return text[:160] + ("..." if len(text) > 160 else "")


def _job(task: TaskRecord, code: str) -> ExecJob:
    return ExecJob(code=code, entry_point=task.entry_point, tests=task.tests, timeout_s=task.timeout_s)


class _Runner:
    """Runs jobs once each (by cache key), in chunks so progress can be logged."""

    def __init__(self, run_jobs: RunJobs, log: Log | None, chunk: int) -> None:
        self.run_jobs, self.log, self.chunk = run_jobs, log, chunk
        self.results: dict[str, ExecResult] = {}
        self.t0 = time.perf_counter()

    def run(self, jobs: list[ExecJob]) -> None:
        todo = list({j.key: j for j in jobs if j.key not in self.results}.values())
        for start in range(0, len(todo), self.chunk):
            batch = todo[start:start + self.chunk]
            results = self.run_jobs(batch)
            if len(results) != len(batch):
                raise RuntimeError(f"run_jobs returned {len(results)} results for {len(batch)} jobs")
            for job, res in zip(batch, results):
                if res.outcome not in OUTCOME_KINDS:
                    raise RuntimeError(f"run_jobs returned outcome {res.outcome!r}, not one of "
                                       f"{OUTCOME_KINDS}")
                self.results[job.key] = res
            if self.log:
                dt = time.perf_counter() - self.t0
                self.log(f"verify_tasks: {len(self.results)} executions "
                         f"({len(self.results) / max(dt, 1e-9):.0f}/s)")

    def rerun(self, jobs: list[ExecJob]) -> int:
        """Run ``jobs`` once more (bypassing the results already held); the new results replace the old."""
        jobs = list({j.key: j for j in jobs}.values())
        if jobs:
            results = self.run_jobs(jobs)
            if len(results) != len(jobs):
                raise RuntimeError(f"run_jobs returned {len(results)} results for {len(jobs)} jobs")
            self.results.update({j.key: r for j, r in zip(jobs, results)})
        return len(jobs)

    def __getitem__(self, job: ExecJob) -> ExecResult:
        return self.results[job.key]


def verify_tasks(tasks: Sequence[TaskRecord], run_jobs: RunJobs, log: Log | None = None, *,
                 min_wrong: int = 3, max_rounds: int = 3, chunk: int = 500) -> Verified:
    """Execute every candidate; keep the tasks whose reference passes and that keep ``min_wrong`` wrong ones.

    ``run_jobs`` executes jobs in a sandbox and returns one ExecResult per job, in order
    (e.g. ``open_sandbox("local").run``). Raises TaskGenerationError when more than half
    of a family's references fail (the family is broken, or the sandbox is).
    """
    t0 = time.perf_counter()
    v = _Verification(_Runner(run_jobs, log, chunk), VerifyReport(tasks_in=len(tasks)))
    v.runner.run([_job(t, c.code) for t in tasks for c in t.candidates])
    v.report.rounds = 1
    alive = v.references(tasks)
    alive = v.top_up(alive, min_wrong, max_rounds)
    kept = v.keep(tasks, alive, min_wrong)
    v.finish(kept, time.perf_counter() - t0, log)
    return kept, v.report


class _Verification:
    """The phases of :func:`verify_tasks` over one runner (its results by job) and one report."""

    def __init__(self, runner: _Runner, report: VerifyReport) -> None:
        self.runner, self.report = runner, report
        self.outcomes: dict[str, Counter] = defaultdict(Counter)  # candidate kind -> outcome -> count
        self.counted: set[str] = set()  # candidates marked so far

    def references(self, tasks: Sequence[TaskRecord]) -> dict[str, TaskRecord]:
        """The tasks whose reference passes (one that timed out or was killed gets a second run: a
        load spike is not a broken task); the others are dropped, or raise if a family is broken."""
        refs = {t.task_id: next((c for c in t.candidates if c.kind == "reference"), None) for t in tasks}
        again = [_job(t, refs[t.task_id].code) for t in tasks if refs[t.task_id] is not None
                 and self.runner[_job(t, refs[t.task_id].code)].outcome in ("timeout", "killed")]
        self.report.reference_retries = self.runner.rerun(again)
        alive: dict[str, TaskRecord] = {}
        failed: dict[str, list[tuple[str, str]]] = defaultdict(list)
        for t in tasks:
            ref = refs[t.task_id]
            if ref is None:
                failed[t.family].append((t.task_id, "no reference candidate"))
                continue
            r = self.runner[_job(t, ref.code)]
            self.outcomes["reference"][r.outcome] += 1
            if r.passed:
                alive[t.task_id] = t
            else:
                why = f"reference {r.outcome}: {r.tests_passed}/{r.tests_total} tests passed ({_excerpt(r)})"
                failed[t.family].append((t.task_id, why))
        _raise_for_broken_families(failed, Counter(t.family for t in tasks), len(tasks))
        for fam, fails in failed.items():
            self.report.dropped += [{"task_id": tid, "family": fam, "reason": why} for tid, why in fails]
        return alive

    def mark(self, t: TaskRecord, first_round: bool) -> TaskRecord:
        """``t`` with each executed wrong candidate marked equivalent when it passed every test. Every
        outcome of the first round is counted; later, only those of candidates not marked before."""
        cands = []
        for c in t.candidates:
            if c.kind == "reference" or c.equivalent:
                cands.append(c)
                continue
            r = self.runner[_job(t, c.code)]
            if first_round or c.candidate_id not in self.counted:
                self.outcomes[c.kind][r.outcome] += 1
            cands.append(dataclasses.replace(c, equivalent=r.passed))
        self.counted.update(c.candidate_id for c in t.candidates)
        return dataclasses.replace(t, candidates=cands)

    def top_up(self, alive: dict[str, TaskRecord], min_wrong: int, max_rounds: int) -> dict[str, TaskRecord]:
        """Marks equivalent mutants, then, for up to ``max_rounds`` rounds in all, gives the tasks short
        of ``min_wrong`` wrong candidates new mutants and runs them."""
        alive = {tid: self.mark(t, True) for tid, t in alive.items()}
        for rnd in range(2, max_rounds + 1):
            short = [t for t in alive.values() if len(t.wrong_candidates()) < min_wrong]
            if not short:
                break
            self.report.rounds = rnd
            jobs = []
            for t in short:
                t, added = self._with_new_mutants(t, min_wrong, rnd)
                if added:
                    alive[t.task_id] = t
                    jobs += [_job(t, c.code) for c in added]
            if not jobs:
                break
            self.runner.run(jobs)
            alive = {tid: self.mark(t, False) for tid, t in alive.items()}
        return alive

    def _with_new_mutants(self, t: TaskRecord, min_wrong: int, rnd: int) -> tuple[TaskRecord, list]:
        rng = random.Random(f"verify:{t.task_id}:{rnd}")
        need = min_wrong - len(t.wrong_candidates()) + 1
        extra = mutants.choose_mutants(t.reference, t.entry_point, rng, n=need, exclude=[c.code for c in t.candidates])
        if not extra:
            return t, []
        added = _with_ids(t.task_id, extra, t.candidates)
        if t.task_id not in self.report.regenerated:
            self.report.regenerated.append(t.task_id)
        return dataclasses.replace(t, candidates=list(t.candidates) + added), added

    def keep(self, tasks: Sequence[TaskRecord], alive: dict[str, TaskRecord], min_wrong: int) -> list[TaskRecord]:
        """The alive tasks, in their input order, that have ``min_wrong`` wrong candidates; the rest dropped."""
        kept = []
        for t in tasks:
            t = alive.get(t.task_id)
            if t is None:
                continue
            n_wrong = len(t.wrong_candidates())
            if n_wrong < min_wrong:
                self.report.dropped.append({"task_id": t.task_id, "family": t.family,
                                            "reason": f"only {n_wrong} non-equivalent wrong candidates after "
                                                      f"{self.report.rounds} rounds (need {min_wrong})"})
                continue
            kept.append(t)
        return kept

    def finish(self, kept: list[TaskRecord], seconds: float, log: Log | None) -> None:
        """The report's counts of what was kept, and a closing log line."""
        report = self.report
        report.tasks_out = len(kept)
        report.jobs = len(self.runner.results)
        report.per_family = dict(Counter(t.family for t in kept))
        report.per_level = {lvl: sum(t.difficulty_level == lvl for t in kept) for lvl in DIFFICULTY_LEVELS}
        report.per_kind = {k: sum(1 for t in kept for c in t.wrong_candidates() if c.kind == k)
                           for k in CANDIDATE_KINDS if k != "reference"}
        report.equivalent = {k: sum(1 for t in kept for c in t.candidates if c.equivalent and c.kind == k)
                             for k in CANDIDATE_KINDS if k != "reference"}
        report.outcomes = {k: dict(v) for k, v in self.outcomes.items()}
        report.seconds = round(seconds, 2)
        if log:
            log(f"verify_tasks: kept {len(kept)}/{report.tasks_in} tasks, {report.jobs} executions, "
                f"{sum(report.equivalent.values())} equivalent mutants, {len(report.dropped)} dropped, "
                f"{report.seconds:.1f} s")


def _raise_for_broken_families(failed: dict[str, list[tuple[str, str]]], family_size: Counter, n_tasks: int) -> None:
    """TaskGenerationError when more than half of a family's references failed (at least two), naming
    the sandbox as the suspect when that happened in several families and to most tasks."""
    broken = [f for f, fails in failed.items() if len(fails) >= 2 and len(fails) > family_size[f] / 2]
    n_failed = sum(len(v) for v in failed.values())
    if len(broken) > 1 and n_failed > n_tasks / 2:
        first = failed[broken[0]][0]
        raise TaskGenerationError(
            f"{n_failed} of {n_tasks} references failed in the sandbox, in {len(broken)} families "
            f"(first: {first[0]}: {first[1]}); with so many, suspect the sandbox (its timeouts, memory "
            "limit or Python) before the families")
    if broken:
        fam, fails = broken[0], failed[broken[0]]
        module = FAMILIES[fam].module if fam in FAMILIES else "an unregistered family"
        raise TaskGenerationError(
            f"family {fam} is broken: {len(fails)} of {family_size[fam]} references failed in the sandbox "
            f"(first: {fails[0][0]}: {fails[0][1]}); fix its reference template in {module}")


# ----------------------------------------------------------------------------- summary

def summarize(tasks: Sequence[TaskRecord]) -> dict:
    """Counts per family and difficulty level (and candidates per kind) for asset metadata.

    ``rows`` is one dict per family, ready for ``sage_pipeline.markdown.table``.
    """
    by_family: dict[str, list[TaskRecord]] = defaultdict(list)
    for t in tasks:
        by_family[t.family].append(t)
    rows = []
    for fam in sorted(by_family):
        ts = by_family[fam]
        lv = Counter(t.difficulty_level for t in ts)
        rows.append({"family": fam, "topic": FAMILIES[fam].topic if fam in FAMILIES else "",
                     "tasks": len(ts), **{lvl: lv.get(lvl, 0) for lvl in DIFFICULTY_LEVELS},
                     "difficulty": round(statistics.fmean(t.difficulty for t in ts), 3),
                     "tests/task": round(statistics.fmean(len(t.tests) for t in ts), 1),
                     "wrong/task": round(statistics.fmean(len(t.wrong_candidates()) for t in ts), 2)})
    kinds = Counter(c.kind for t in tasks for c in t.candidates)
    equivalent = Counter(c.kind for t in tasks for c in t.candidates if c.equivalent)
    timeouts = sorted(t.timeout_s for t in tasks)
    return {
        "tasks": len(tasks),
        "families": {fam: len(ts) for fam, ts in sorted(by_family.items())},
        "levels": {lvl: sum(t.difficulty_level == lvl for t in tasks) for lvl in DIFFICULTY_LEVELS},
        "family_levels": {fam: {lvl: sum(t.difficulty_level == lvl for t in ts) for lvl in DIFFICULTY_LEVELS}
                          for fam, ts in sorted(by_family.items())},
        "splits": dict(Counter(t.split for t in tasks)),
        "candidates": {k: kinds.get(k, 0) for k in CANDIDATE_KINDS},
        "equivalent": {k: equivalent.get(k, 0) for k in CANDIDATE_KINDS if k != "reference"},
        "tests": sum(len(t.tests) for t in tasks),
        "timeout_s": ({"min": timeouts[0], "median": timeouts[len(timeouts) // 2], "max": timeouts[-1]}
                      if timeouts else {}),
        "rows": rows,
    }
