"""Run SAGE's own CLI, ``sage run``, against the model world: N tasks a day, each day in fresh SAGE
workspaces, journals left exactly as SAGE wrote them.

SAGE is the one installed from ``SAGE_SRC`` into a virtualenv of its own (``scripts/sage_venv.sh``;
``SAGE_PYTHON`` names its Python, the ``sage`` script sits beside it). Each run is

    sage run --auto --no-clarify --fresh "[sage-world run=<id>] <the task's prompt>"

in its worker's workspace (``<root>/day-NN/ws-<worker>``: one fresh SAGE workspace per worker and
day, since two concurrent runs in one workspace would share SAGE's bandit and memory files), with
an environment built from scratch: ``OLLAMA_HOST`` (the world), ``SAGE_NO_CLARIFY=1``, the served
checkpoint's ``SAGE_RL_POLICY=1``/``SAGE_RL_CHECKPOINT``/``SAGE_RL_MIN_CONFIDENCE`` when one is
deployed, ``SAGE_MODELS_YAML`` when the day runs a models.yaml of its own, ``SAGE_SKILLS_ROOT`` when it
runs a skills tree of its own (a version folder of the project's skills root), ``HOME`` inside the run
folder, and a ``PATH`` whose ``python`` is SAGE's (SAGE's verification command runs ``python -m
pytest``; SAGE's reviewer runs ruff/mypy only when they are on ``PATH``, so they are not, and the
world's verdicts are the reviewer's whole verdict).

How a run is started (``HarnessConfig.fresh_process``): by default each worker has a launcher
(:mod:`~sage_pipeline.sage_world.launcher`), SAGE's interpreter with SAGE already imported and the
day's environment, which forks the run and calls SAGE's console-script entry point in the
workspace, with every piece of import-time state a fresh process would read differently brought to
what it would read (the launcher's module doc lists them); ``fresh_process=True`` starts SAGE's
``sage`` script as a process of its own for every run (SAGE's imports and the interpreter's exit
again each time: ~3.5 s more CPU a run, ~5 s with a checkpoint deployed; ``benchmarks/sage_launcher.py``).
Both write the same journals.

**A run's own environment** (``run_day(run_env=...)``: the coder lever's recorded draw per run): a callable
gives each run, before any run starts and in run order, the variables it sets on top of the day's
(:data:`RUN_ENV_KEYS` only: ``SAGE_MODELS_YAML``, ``SAGE_SKILLS_ROOT``, ``SAGE_TRACE_ID``: all three read by
SAGE at call time, never at import). With ``fresh_process`` they are in the run's process environment; with
launchers, the worker's one launcher (started with the day's environment) sets them in the forked child
before SAGE's entry point (``SageLauncher.run(env=...)``), so the run has exactly the environment a fresh
one would: SAGE logs the run's own ``trace_id`` on every journal line either way. The harness also keeps
the session ids it read from the lines the run wrote (``RunResult.sessions``) beside the run's
``RunResult.trace_id``, a second join of a run to its draw. A launcher that dies or stops
answering is replaced and counted (``launcher_restarts``); the run it was serving is a failure, a
run it never started goes to the new one.

A run that exits non-zero or outlives its time limit is a failure, counted with its reason (the
last line SAGE printed to stderr, or the limit); the day goes on. A run past its limit is killed
with its whole process group (whatever SAGE started included). Each run's output is kept in
``<root>/day-NN/runs/<id>.log``.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.sage_world.launcher import LauncherError, SageLauncher, console_python
from sage_pipeline.sage_world.world import ModelWorld

log = logging.getLogger(__name__)


# the variables a run's own environment may set on top of the day's (run_day's run_env)
RUN_ENV_KEYS = ("SAGE_MODELS_YAML", "SAGE_SKILLS_ROOT", "SAGE_TRACE_ID")
RunEnv = Callable[[str, str], Mapping[str, str]]  # (run id, task id) -> the run's variables


class SageNotFound(RuntimeError):
    """SAGE's CLI is not where SAGE_PYTHON says; the message says how to install it."""


class HarnessConfig(BaseModel):
    """How SAGE is run (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workers: int = Field(3, ge=1, le=64, description="`sage run` processes at once (one workspace each; 3 on 2 "
                         "cores: a run waits on its verification subprocess and the world part of the time)")
    run_timeout_s: float = Field(300.0, gt=0, description="a run still going after this is killed and counted")
    min_confidence: float = Field(0.55, ge=0.0, le=1.0,
                                  description="SAGE_RL_MIN_CONFIDENCE with a deployed checkpoint (SAGE's default)")
    fresh_process: bool = Field(False, description="start SAGE's `sage` script as a process of its own for every "
                                "run (SAGE's imports: ~3-5 s of CPU each time), instead of forking it from a launcher "
                                "that has imported SAGE once per worker and day")
    launcher_start_failures: int = Field(3, ge=1, description="launchers in a row that fail to start before the "
                                         "day stops with the reason (then set fresh_process)")


@dataclass(frozen=True)
class SageInstall:
    """SAGE's Python, its ``sage`` script and the models.yaml its router reads."""

    python: Path
    cli: Path
    models_yaml: Path

    @classmethod
    def find(cls, python: str | os.PathLike[str] | None = None) -> SageInstall:
        py = str(python or os.environ.get("SAGE_PYTHON", "")).strip()
        if not py:
            raise SageNotFound("SAGE_PYTHON is unset: install SAGE with `scripts/sage_venv.sh <SAGE checkout>` "
                               "(or `make sage-venv SAGE_SRC=<checkout>`) and export the Python it prints")
        cli = Path(py).parent / "sage"
        if not cli.is_file():
            raise SageNotFound(f"SAGE_PYTHON={py}: no `sage` script beside it ({cli}); reinstall SAGE with "
                               "scripts/sage_venv.sh")
        try:
            out = subprocess.run([py, "-c", "from sage.config.paths import bundled_models_yaml as b; print(b())"],
                                 capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise SageNotFound(f"SAGE_PYTHON={py} cannot run: {exc}") from exc
        if out.returncode != 0:
            raise SageNotFound(f"SAGE_PYTHON={py} cannot import SAGE: {out.stderr.strip()[-300:]}")
        yaml_path = Path(out.stdout.strip())
        if not yaml_path.is_file():
            raise SageNotFound(f"SAGE's bundled models.yaml {yaml_path} is missing: install SAGE editable "
                               "(scripts/sage_venv.sh does)")
        return cls(Path(py), cli, yaml_path)


@dataclass
class RunResult:
    run: str
    task_id: str
    worker: int
    returncode: int | None
    seconds: float
    failure: str | None  # None: SAGE finished (exit 0)
    task_right: bool  # the file SAGE ended with is the task's right solution (the world's truth)
    sessions: list[str] = field(default_factory=list)  # SAGE's session ids in the lines this run wrote
    complexity: float | None = None  # the task's task_complexity_score, as SAGE's reviewer routing logged it
    coder_model: str | None = None  # the model SAGE's UCB bandit gave the coder (the world saw the call)
    journal_lines: int = 0
    tests_at_start: bool = False  # the workspace already held the task's tests (an earlier run of the same task)
    cpu_s: float | None = None  # CPU of the run and what it waited for (launcher path: wait4; fresh: not measured)
    trace_id: str | None = None  # the run's own SAGE_TRACE_ID (its draw id), when run_env gave it one
    env: dict = field(default_factory=dict)  # the run's own variables (run_env), SAGE_TRACE_ID included

    def to_dict(self) -> dict:
        return dict(vars(self))


@dataclass
class DayResult:
    day: int
    root: Path
    runs: list[RunResult] = field(default_factory=list)
    seconds: float = 0.0
    process: str = "launcher"  # how runs were started: "launcher" (forked from an imported SAGE) or "fresh"
    launcher_restarts: int = 0  # launchers that died or hung and were replaced

    @property
    def sessions_dirs(self) -> list[Path]:
        return sorted(p for p in self.root.glob("ws-*/memory/sessions") if p.is_dir())

    @property
    def finished(self) -> int:
        return sum(r.failure is None for r in self.runs)

    @property
    def failures(self) -> dict[str, int]:
        return dict(Counter(r.failure for r in self.runs if r.failure is not None))

    def summary(self) -> dict:
        n = len(self.runs)
        return {"day": self.day, "runs": n, "finished": self.finished, "failures": self.failures,
                "tasks_right": sum(r.task_right for r in self.runs),
                "journal_lines": sum(r.journal_lines for r in self.runs),
                "seconds": round(self.seconds, 1), "runs_per_minute": round(60 * n / max(self.seconds, 1e-9), 1),
                "process": self.process, "launcher_restarts": self.launcher_restarts}


def sage_env(install: SageInstall, ollama_host: str, home: Path, bindir: Path,
             checkpoint: str | os.PathLike[str] | None = None, min_confidence: float = 0.55,
             models_yaml: str | os.PathLike[str] | None = None,
             skills_root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The environment of every ``sage run``: built from scratch, nothing inherited but the locale;
    ``models_yaml``: the user-level models.yaml SAGE reads instead of its bundled one (``SAGE_MODELS_YAML``);
    ``skills_root``: the skills tree SAGE injects instead of its packaged one (``SAGE_SKILLS_ROOT``)."""
    bindir.mkdir(parents=True, exist_ok=True)
    py = bindir / "python"
    if not py.exists():
        py.symlink_to(install.python)
    home.mkdir(parents=True, exist_ok=True)
    env = {"PATH": f"{bindir}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "OLLAMA_HOST": ollama_host, "SAGE_NO_CLARIFY": "1", "SAGE_DISABLE_OLLAMA_SPINNER": "1",
           "SAGE_RL_POLICY": "0"}  # bytecode is written (a fresh process's imports read it)
    if checkpoint is not None:
        env.update(SAGE_RL_POLICY="1", SAGE_RL_CHECKPOINT=str(Path(checkpoint).resolve()),
                   SAGE_RL_MIN_CONFIDENCE=str(min_confidence))
    if models_yaml is not None:
        env["SAGE_MODELS_YAML"] = str(Path(models_yaml).resolve())
    if skills_root is not None:
        env["SAGE_SKILLS_ROOT"] = str(Path(skills_root).resolve())
    return env


def goal(run: str, prompt: str) -> str:
    return f"[sage-world run={run}] {prompt}"


def run_day(world: ModelWorld, ollama_host: str, install: SageInstall, day: int, task_ids: Sequence[str],
            root: str | os.PathLike[str], config: HarnessConfig | None = None,
            checkpoint: str | os.PathLike[str] | None = None, min_confidence: float | None = None,
            progress: Callable[[str], None] = log.info,
            models_yaml: str | os.PathLike[str] | None = None,
            skills_root: str | os.PathLike[str] | None = None, run_env: RunEnv | None = None) -> DayResult:
    """Run ``sage run`` once per task of ``task_ids`` (run ids ``dNN-rMMM``) into ``root`` (a fresh
    folder: SAGE's workspaces are new each day), with ``checkpoint`` at ``min_confidence`` (default
    the config's) when given: the floor the deployment was recorded with, or the logged decisions'
    probabilities would not be the ones reconstructed; with ``models_yaml`` (``SAGE_MODELS_YAML``)
    when given, else SAGE's bundled table; with ``skills_root`` (``SAGE_SKILLS_ROOT``) when given, else SAGE's
    packaged skills; with ``run_env``, each run's own variables on top of those (see the module doc: called
    once per run, in run order, before any run starts). Returns what each run did."""
    cfg = config or HarnessConfig()
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: each day runs SAGE in fresh workspaces; pick a new folder")
    (root / "runs").mkdir(parents=True, exist_ok=True)
    env = sage_env(install, ollama_host, root / "home", root / "bin", checkpoint,
                   cfg.min_confidence if min_confidence is None else min_confidence, models_yaml, skills_root)
    runs = [(f"d{day:02d}-r{i:03d}", t) for i, t in enumerate(task_ids)]
    for i, (run, t) in enumerate(runs):  # worker w runs runs[w::workers], in its own workspace ws-w
        world.assign(run, t, workspace=str(root / f"ws-{i % cfg.workers}"))
    own = {run: _run_env(run, run_env(run, t)) for run, t in runs} if run_env is not None else {}
    result = DayResult(day, root, process="fresh" if cfg.fresh_process else "launcher")
    lock, t0 = threading.Lock(), time.perf_counter()
    offsets: dict[Path, int] = {}
    launchers = _Launchers(install, env, root / "launchers", cfg, result, lock, progress)

    def one(worker: int, run: str, task_id: str) -> RunResult:
        ws = root / f"ws-{worker}"
        ws.mkdir(exist_ok=True)
        argv = ["run", "--auto", "--no-clarify", "--fresh", goal(run, world.tasks[world.by_id[task_id]].prompt)]
        start = time.perf_counter()
        mine = own.get(run, {})
        if cfg.fresh_process:
            rc, stdout, stderr, failure, cpu = _run_fresh(install, {**env, **mine}, ws, argv, cfg.run_timeout_s)
        else:
            rc, stdout, stderr, failure, cpu = launchers.run(worker, run, ws, argv, root / "runs", mine)
        secs = time.perf_counter() - start
        artifacts.write_text(root / "runs" / f"{run}.log",
                             f"$ sage run (cwd {ws}) rc={rc} {secs:.2f}s\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
        lines = _new_lines(ws / "memory" / "sessions", offsets)
        r = RunResult(run, task_id, worker, rc, secs, failure, world.final_right(run), journal_lines=len(lines),
                      coder_model=world.coder_model(run), tests_at_start=world.tests_at_start(run), cpu_s=cpu,
                      trace_id=mine.get("SAGE_TRACE_ID"), env=dict(mine), **_run_facts(lines))
        with lock:
            result.runs.append(r)
            n = len(result.runs)
            if n % 10 == 0 or n == len(runs) or failure:
                el = time.perf_counter() - t0
                progress(f"day {day}: {n}/{len(runs)} runs ({n / el * 60:.1f}/min), "
                         f"{sum(x.failure is not None for x in result.runs)} failed"
                         + (f"; {run}: {failure}" if failure else ""))
        return r

    def worker(w: int) -> None:
        try:
            for run, t in runs[w::cfg.workers]:
                one(w, run, t)
        finally:
            launchers.close(w)

    try:
        with ThreadPoolExecutor(cfg.workers) as ex:
            for f in [ex.submit(worker, w) for w in range(min(cfg.workers, len(runs)))]:
                f.result()
    finally:
        launchers.close_all()
    result.runs.sort(key=lambda r: r.run)
    result.seconds = time.perf_counter() - t0
    return result


def _run_env(run: str, extra: Mapping[str, str]) -> dict[str, str]:
    """A run's own variables, checked: only :data:`RUN_ENV_KEYS`, strings without a NUL; paths resolved."""
    out = {}
    for k, v in dict(extra or {}).items():
        if k not in RUN_ENV_KEYS:
            raise ValueError(f"run {run}: run_env set {k!r}; a run's own environment may set only "
                             f"{', '.join(RUN_ENV_KEYS)} (the day's environment holds the rest)")
        if not isinstance(v, str) or not v or "\x00" in v:
            raise ValueError(f"run {run}: run_env's {k} must be a non-empty string without a NUL byte")
        out[k] = v if k == "SAGE_TRACE_ID" else str(Path(v).resolve())
    return out


def _outcome(rc: int | None, stdout: str, stderr: str) -> str | None:
    why = _last_line(stderr) or _last_line(stdout) or "no output"
    return None if rc == 0 else f"exit {rc}: {why}"


def _run_fresh(install: SageInstall, env: dict[str, str], ws: Path, argv: list[str], timeout: float
               ) -> tuple[int | None, str, str, str | None, float | None]:
    """SAGE's ``sage`` script as a process of its own (rc, stdout, stderr, failure, CPU: not measured)."""
    try:  # its own process group: a run past its limit is killed with everything it started
        proc = subprocess.Popen([str(install.cli), *argv], cwd=ws, env=env, stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    except OSError as exc:
        return None, "", str(exc), f"could not start sage: {exc}", None
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
        return proc.returncode, stdout, stderr, _outcome(proc.returncode, stdout, stderr), None
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        return None, stdout, stderr, f"killed after the {timeout:g} s limit", None


class _Launchers:
    """One launcher per worker (started at its first run), replaced when lost, counted in the day's result."""

    def __init__(self, install: SageInstall, env: dict[str, str], home: Path, cfg: HarnessConfig, result: DayResult,
                 lock: threading.Lock, progress: Callable[[str], None]) -> None:
        self.python = console_python(install.cli, install.python)
        self.install, self.env, self.home, self.cfg = install, env, home, cfg
        self.result, self.lock, self.progress = result, lock, progress
        self.by_worker: dict[int, SageLauncher] = {}  # worker -> its launcher (the day's environment)
        self.failed_starts = 0  # in a row, all workers together

    def _launcher(self, worker: int) -> SageLauncher:
        la = self.by_worker.get(worker)
        if la is not None and la.alive:
            return la
        if la is not None:  # died between two runs
            self._replaced(worker, "it exited between runs")
        la = SageLauncher(self.python, self.install.cli, dict(self.env), self.home, name=f"launcher-{worker}")
        try:
            la.start()
        except LauncherError:
            with self.lock:
                self.failed_starts += 1
            raise
        with self.lock:
            self.failed_starts = 0
        self.by_worker[worker] = la
        return la

    def _replaced(self, worker: int, why: str) -> None:
        self.by_worker.pop(worker, None)
        with self.lock:
            self.result.launcher_restarts += 1
        self.progress(f"day {self.result.day}: SAGE launcher of worker {worker} lost ({why}); starting another")

    def run(self, worker: int, run: str, ws: Path, argv: list[str], out_dir: Path,
            extra: Mapping[str, str] | None = None) -> tuple[int | None, str, str, str | None, float | None]:
        out, err = out_dir / f"{run}.stdout", out_dir / f"{run}.stderr"
        for attempt in (1, 2):
            try:
                la = self._launcher(worker)
            except LauncherError as exc:
                if self.failed_starts >= self.cfg.launcher_start_failures:
                    raise LauncherError(f"{self.failed_starts} SAGE launchers in a row did not start; the last: "
                                        f"{exc}") from exc
                return None, "", str(exc), f"launcher did not start: {exc}", None
            try:
                rc, cpu, killed = la.run(run, ws, argv, out, err, self.cfg.run_timeout_s, env=dict(extra or {}))
            except LauncherError as exc:
                started = la.current_pid is not None
                self._replaced(worker, str(exc))
                if not started and attempt == 1:
                    continue  # SAGE never ran: the run goes to the next launcher
                stdout, stderr = _read_and_remove(out), _read_and_remove(err)
                return None, stdout, stderr, f"launcher lost during the run: {exc}", None
            imp_out, imp_err = la.import_output
            stdout, stderr = imp_out + _read_and_remove(out), imp_err + _read_and_remove(err)
            if killed:
                return None, stdout, stderr, f"killed after the {self.cfg.run_timeout_s:g} s limit", cpu
            return rc, stdout, stderr, _outcome(rc, stdout, stderr), cpu
        raise AssertionError("unreachable: the second attempt returns")

    def close(self, worker: int) -> None:
        la = self.by_worker.pop(worker, None)
        if la is not None:
            la.close()

    def close_all(self) -> None:
        for w in list(self.by_worker):
            self.close(w)


def _read_and_remove(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    path.unlink()
    return text


def _new_lines(sessions: Path, offsets: dict[Path, int]) -> list[str]:
    """The journal lines written since the last call (one worker's workspace: its runs are sequential)."""
    out: list[str] = []
    for f in sorted(sessions.glob("*.log")) if sessions.is_dir() else []:
        with open(f, "rb") as fh:
            fh.seek(offsets.get(f, 0))
            data = fh.read()
        cut = data.rfind(b"\n") + 1
        offsets[f] = offsets.get(f, 0) + cut
        out += data[:cut].decode("utf-8", "replace").splitlines()
    return out


def _run_facts(lines: list[str]) -> dict:
    """The session ids of a run's journal lines and its task's complexity (the reviewer's
    MODEL_ROUTING_DECISION: the planner's own routing scores the goal, not the task)."""
    sessions: dict[str, None] = {}
    complexity = None
    for ln in lines:
        if not ln.startswith("{"):
            continue  # SAGE's plain-text lines ([ts] CHECKPOINT ..., [TOKEN_SUMMARY] ...)
        try:
            ev = json.loads(ln)
        except json.JSONDecodeError:
            continue
        if ev.get("session_id"):
            sessions.setdefault(str(ev["session_id"]))
        if complexity is None and ev.get("type") == "MODEL_ROUTING_DECISION" and ev.get("agent_role") in (
                "reviewer", "debugger"):
            complexity = float(ev.get("task_complexity_score") or 0.0)
    return {"sessions": list(sessions), "complexity": complexity}


def _text(b: bytes | str | None) -> str:
    if b is None:
        return ""
    return b.decode("utf-8", "replace") if isinstance(b, bytes) else b


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""
