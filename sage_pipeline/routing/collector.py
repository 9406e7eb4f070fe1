"""The synthetic collector: runs SAGE's static table with epsilon-exploration in the
routing simulator and writes session journals in SAGE's own shape.

SAGE appends to ``memory/sessions/YYYY-MM-DD.log``, one JSON object per line; so does this
collector, one file per simulated day. Each session is one orchestrator run:
``SESSION_START``, then per task and attempt, in SAGE's order, a ``MODEL_ROUTING_DECISION``
(the table's primary and fallback, the triggers that fired, ``policy_source``), a
``TOKEN_USAGE`` and a ``TRAJECTORY_STEP`` with no ``step`` (the ingest derives it from the
timestamps, as for SAGE's own journals), then ``SESSION_END``. ``session_id`` is written as
SAGE does when ``SAGE_SESSION_ID`` is set. The one extension is ``propensity`` (on the step
and the routing decision): the behaviour policy's probability of the logged model, a key a
SAGE patch could add; every other key is SAGE's. The logs go through exactly the same
ingest as real journals.

``action_space``: ``multi_model`` explores every candidate model of the role (the
catalogue's capabilities); ``sage_binary`` explores only the role's primary and fallback,
what SAGE's router can execute.

The set (every day file and ``simulator.json``) is replaced as one: each run writes a fresh
version folder ``<versions>/<run>.partial/``, renames it ``<run>/`` when complete and then
points ``out_dir`` (a symlink) at it by renaming a new link over the old one, so readers see
the old set or the new one, never a mix. ``<versions>`` must lie outside every folder the
ingest reads (the asset keeps ``<root>/.synthetic_versions/`` beside ``<root>/sessions/``).
A run holds an exclusive ``flock`` on its folder until it has switched, so another run's
sweep tells a live run's folder (kept) from a killed run's (removed). After a switch the
version it replaced is kept until the next switch (a reader may still be in it); older
ones are removed. A real ``out_dir`` folder of an older collector is moved into
``<versions>`` once, as ``legacy-<time>/``, and removed like a superseded version unless it
holds files the collector does not write.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import fnmatch
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

import msgspec
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.routing.policy import EpsilonGreedyPolicy, StaticTablePolicy, UniformPolicy, sample_actions
from sage_pipeline.routing.routing_simulator import RoutingSimulator, Tasks
from sage_pipeline.routing.schema import ROLES, TRAJECTORY_STEP

log = logging.getLogger(__name__)

MANIFEST = "simulator.json"
LAYOUT = "sage_journal"  # YYYY-MM-DD.log files, SAGE's event shapes
COMPLETION_TOKENS_PER_CALL = 600  # TOKEN_USAGE's completion tokens (the simulator models prompts only)
VERSIONS_SUFFIX = ".versions"  # default versions folder: .<out_dir name>.versions beside out_dir
PARTIAL_SUFFIX = ".partial"  # a version still being written, or left by a killed run
LEGACY_PREFIX = "legacy-"  # a real out_dir folder of an older collector, moved into the versions once
SWITCH_PREFIX = ".switch-"  # the fresh link renamed over out_dir
LOCK_NAME = ".lock"  # the versions folder's lock: creating, switching and sweeping take it
OWNED_PATTERNS = ("*.log", "synthetic_*.jsonl", MANIFEST, ".*.tmp")  # what a legacy folder may hold


class CollectorConfig(BaseModel):
    """What the synthetic collector logs: how many episodes, how the behaviour policy explores,
    and how they fall into sessions and days."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # 20,000 episodes (5,000 sessions): the eval split's two halves then hold ~2,000 tasks each,
    # which OPE needs to rank CQL's alphas and to estimate a greedy policy within a few percent;
    # at 5,000 it could do neither reliably (docs/benchmarks.md, "Offline chain quality")
    episodes: int = Field(20_000, ge=1, description="episodes (tasks) to simulate; the default gives OPE enough eval "
                          "sessions to rank and estimate policies (docs/benchmarks.md)")
    seed: int = Field(0, description="random seed of the simulated tasks, outcomes and exploration")
    epsilon: float = Field(0.3, gt=0.0, le=1.0, description="exploration rate over each role's candidate models, "
                           "in (0, 1] so every candidate has support")
    sessions_per_day: int = Field(250, ge=1, description="sessions per day, i.e. per YYYY-MM-DD.log journal file")
    mean_tasks_per_session: float = Field(4.0, description="mean tasks per session (1 + Poisson)")
    start_time: str = Field("2026-11-01T00:00:00+00:00", description="ISO time of the first session")
    action_space: Literal["multi_model", "sage_binary"] = Field(
        "multi_model", description="what the behaviour policy explores: 'multi_model' (every candidate model of "
                                   "the role) or 'sage_binary' (only the table's primary and fallback, what SAGE's "
                                   "router can execute)")


@dataclass(frozen=True)
class CollectResult:
    files: list[Path]
    manifest: Path
    episodes: int
    sessions: int
    decisions: int
    events: int
    ground_truth: dict[str, float]
    ground_truth_by_role: dict[str, dict[str, float]]
    version: Path  # the folder out_dir now points to


def _session_sizes(n_tasks: int, mean: float, rng: np.random.Generator) -> np.ndarray:
    sizes = 1 + rng.poisson(max(mean - 1.0, 0.0), size=n_tasks)
    cut = int(np.searchsorted(np.cumsum(sizes), n_tasks)) + 1
    sizes = sizes[:cut]
    sizes[-1] -= int(sizes.sum()) - n_tasks
    return sizes[sizes > 0]


def simulate_episodes(sim: RoutingSimulator, tasks: Tasks, behaviour,
                      rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Roll every task's episode under ``behaviour``; returns one row per decision."""
    n, T = len(tasks), sim.config.max_attempts
    pfc = np.zeros(n, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    cols: dict[str, list[np.ndarray]] = {}
    for t in range(T):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        sub = Tasks(tasks.role[idx], tasks.task_complexity_score[idx], tasks.prompt_tokens[idx])
        ctx = sim.contexts(sub, np.full(idx.size, t), pfc[idx])
        probs = behaviour.action_probs(ctx)
        a = sample_actions(probs, rng)
        out = sim.sample_outcome(ctx, a, rng)
        terminal = out["verification_passed"] | (t == T - 1)
        row = {"task": idx, "step": ctx.step, "action": a, "propensity": probs[np.arange(idx.size), a],
               "primary_failure_count": ctx.primary_failure_count, "failure_count": ctx.failure_count,
               "prompt_tokens": ctx.prompt_tokens, "terminal": terminal, **out}
        for k, v in row.items():
            cols.setdefault(k, []).append(np.asarray(v))
        failed = ~out["verification_passed"]
        pfc[idx] += failed & (a == sim.primary[sub.role])
        active[idx[terminal]] = False
    return {k: np.concatenate(v) for k, v in cols.items()}


@dataclass(frozen=True)
class _Restricted:
    """A policy whose candidates are ``role_mask`` (so epsilon-exploration stays inside it)."""

    base: object
    role_mask: np.ndarray
    name: str = "static_table"

    @property
    def actions(self) -> tuple[str, ...]:
        return self.base.actions

    def action_probs(self, ctx) -> np.ndarray:
        return self.base.action_probs(ctx)


def binary_mask(sim: RoutingSimulator) -> np.ndarray:
    """(n_roles, K): each role's primary and fallback, what SAGE's router can execute."""
    m = np.zeros_like(sim.role_mask)
    r = np.arange(len(m))  # the simulated roles: the table's first ones (its shell roles get no tasks)
    m[r, sim.table.primary_index(sim.catalogue)[r]] = m[r, sim.table.fallback_index(sim.catalogue)[r]] = True
    return m


def _stamp(t: datetime) -> str:
    """ISO 8601 with microseconds and offset, as SAGE's datetime.isoformat() writes it."""
    return t.isoformat(timespec="microseconds")


def _fired(sim: RoutingSimulator, tasks: Tasks, rows: dict[str, np.ndarray]) -> list[list[str]]:
    """Per decision: the table triggers that fired, as SAGE lists them."""
    role = tasks.role[rows["task"]]
    values = {"task_complexity_score": tasks.task_complexity_score[rows["task"]],
              "primary_failure_count": rows["primary_failure_count"], "failure_count": rows["failure_count"]}
    out: list[list[str]] = [[] for _ in range(len(role))]
    for r_i, r in enumerate(sim.table.roles):
        for trig in sim.table.routes[r].triggers:
            for i in np.flatnonzero((role == r_i) & trig.fires(values)):
                out[i].append(str(trig))
    return out


def default_versions_dir(out_dir: str | Path) -> Path:
    """``.<name>.versions`` beside ``out_dir``: right when the ingest reads ``out_dir`` itself, wrong
    when it reads ``out_dir``'s parent (pass ``versions_dir`` outside it, as the asset does)."""
    out_dir = Path(out_dir)
    return out_dir.parent / f".{out_dir.name}{VERSIONS_SUFFIX}"


def collect(sim: RoutingSimulator, out_dir: str | Path, config: CollectorConfig = CollectorConfig(),
            progress: Callable[[str], None] = log.info,
            versions_dir: str | Path | None = None) -> CollectResult:
    """Simulate ``config.episodes`` episodes and write them as SAGE session journals.

    The whole set goes to a fresh folder in ``versions_dir`` (default
    :func:`default_versions_dir`); ``out_dir`` becomes a symlink switched to it in one step
    once it is complete. Returned paths go through ``out_dir``."""
    out_dir = Path(out_dir)
    versions = Path(versions_dir) if versions_dir is not None else default_versions_dir(out_dir)
    stage, hold = _begin(out_dir, versions, f"seed{config.seed}", progress)
    try:
        try:
            res = _write_set(sim, stage, config, progress)
        except BaseException:
            shutil.rmtree(stage, ignore_errors=True)
            raise
        version = _commit(out_dir, versions, stage, progress)
    finally:
        artifacts.release_folder(hold)  # the folder's lock: held until out_dir points to it
    files = [out_dir / p.name for p in res.files]
    return CollectResult(files, out_dir / MANIFEST, res.episodes, res.sessions, res.decisions, res.events,
                         res.ground_truth, res.ground_truth_by_role, version)


def _write_set(sim: RoutingSimulator, out_dir: Path, config: CollectorConfig,
               progress: Callable[[str], None]) -> CollectResult:
    """Write the journals and the manifest into ``out_dir`` (a fresh, empty folder)."""
    ep = _simulate(sim, config)
    progress(f"simulated {config.episodes} episodes, {ep.decisions} decisions, {len(ep.sizes)} sessions "
             f"({config.action_space})")
    files, n_events = _write_journals(sim, ep, config, out_dir)
    progress(f"wrote {n_events} events to {len(files)} journals in {out_dir}")
    gt, by_role = _ground_truth(sim, ep, config)
    manifest = artifacts.write_json(out_dir / MANIFEST, {
        "collector": config.model_dump(), "layout": LAYOUT,
        "simulator": sim.config.to_dict(),
        "model_catalogue": {"path": sim.catalogue.source, "sha256": _sha(sim.catalogue.source)},
        "routing_table": {"path": sim.table.source, "sha256": _sha(sim.table.source)},
        "episodes": config.episodes, "sessions": int(len(ep.sizes)), "decisions": ep.decisions,
        "files": [p.name for p in files],
        "ground_truth_value": gt, "ground_truth_value_by_role": by_role,
    })
    return CollectResult(files, manifest, config.episodes, int(len(ep.sizes)), ep.decisions, n_events,
                         gt, by_role, out_dir)


@dataclass(frozen=True)
class Episodes:
    """What the behaviour policy did, before anything is written: the tasks, one row per decision
    (``simulate_episodes``'s columns) sorted by task then attempt, and the sessions' sizes."""

    tasks: Tasks
    rows: dict[str, np.ndarray]
    sizes: np.ndarray  # tasks per session, in task order
    static: StaticTablePolicy
    behaviour: EpsilonGreedyPolicy
    mask: np.ndarray  # (n_roles, K): the candidates the behaviour policy explores

    @property
    def decisions(self) -> int:
        return int(len(self.rows["task"]))

    @property
    def first_task(self) -> np.ndarray:
        """Per session, its first task."""
        return np.concatenate([[0], np.cumsum(self.sizes)[:-1]])

    @property
    def bounds(self) -> np.ndarray:
        """Task ``i``'s decisions are rows ``bounds[i]:bounds[i + 1]``."""
        return np.searchsorted(self.rows["task"], np.arange(len(self.tasks) + 1))


def _simulate(sim: RoutingSimulator, config: CollectorConfig) -> Episodes:
    """Phase 1: sample the tasks, roll them under the epsilon-greedy table, cut them into sessions
    (one seeded generator, drawn in that order)."""
    rng = np.random.default_rng(config.seed)
    static = StaticTablePolicy(sim.table, sim.catalogue)
    mask = sim.role_mask if config.action_space == "multi_model" else binary_mask(sim)
    behaviour = EpsilonGreedyPolicy(_Restricted(static, mask), config.epsilon)
    tasks = sim.sample_tasks(config.episodes, rng)
    rows = simulate_episodes(sim, tasks, behaviour, rng)
    sizes = _session_sizes(config.episodes, config.mean_tasks_per_session, rng)
    order = np.lexsort((rows["step"], rows["task"]))  # by task, then attempt
    return Episodes(tasks, {k: v[order] for k, v in rows.items()}, sizes, static, behaviour, mask)


def _write_journals(sim: RoutingSimulator, ep: Episodes, config: CollectorConfig,
                    out_dir: Path) -> tuple[list[Path], int]:
    """Phase 2: one ``YYYY-MM-DD.log`` per simulated day, ``sessions_per_day`` sessions each, spread
    over 90% of the day. Returns the files and the number of events."""
    journal = _Journal(sim, ep, _fired(sim, ep.tasks, ep.rows), sim.table.fallback_index(sim.catalogue), ep.bounds)
    t0 = datetime.fromisoformat(config.start_time).astimezone(timezone.utc)
    spacing = timedelta(seconds=0.9 * 86400 / config.sessions_per_day)  # every session ends on its day
    enc = msgspec.json.Encoder()
    first, per_day = ep.first_task, config.sessions_per_day
    files: list[Path] = []
    n_events = 0
    for day in range((len(ep.sizes) + per_day - 1) // per_day):
        lines: list[bytes] = []
        for s in range(day * per_day, min((day + 1) * per_day, len(ep.sizes))):
            clock = t0 + timedelta(days=day) + spacing * (s - day * per_day)
            events = journal.session(f"syn-{config.seed}-{s:06d}", first[s], int(ep.sizes[s]), clock)
            lines += [enc.encode(e) for e in events]
        path = out_dir / f"{(t0 + timedelta(days=day)).date().isoformat()}.log"
        artifacts.write_bytes(path, b"\n".join(lines) + b"\n")
        files.append(path)
        n_events += len(lines)
    return files, n_events


@dataclass(frozen=True)
class _Journal:
    """Simulated decisions as SAGE's events, session by session (phase 2's per-session work)."""

    sim: RoutingSimulator
    ep: Episodes
    fired: list[list[str]]  # per decision row: the table triggers that fired
    fallback: np.ndarray  # per role: the table's fallback model
    bounds: np.ndarray  # Episodes.bounds

    def session(self, sid: str, first_task: int, n_tasks: int, clock: datetime) -> list[dict]:
        """``SESSION_START``, every decision of the session's tasks in order, ``SESSION_END``."""
        events = [{"type": "SESSION_START", "timestamp": _stamp(clock), "session_id": sid,
                   "extra": {"synthetic": True, "collector": "sage_pipeline.routing.collector"}}]
        for j in range(n_tasks):
            task = first_task + j
            for r in range(self.bounds[task], self.bounds[task + 1]):
                decision, clock = self.decision(task, r, sid, f"{sid}-t{j:02d}", clock)
                events += decision
        clock += timedelta(milliseconds=1)
        return [*events, {"type": "SESSION_END", "timestamp": _stamp(clock), "session_id": sid}]

    def decision(self, task: int, r: int, sid: str, tid: str, clock: datetime) -> tuple[list[dict], datetime]:
        """Decision row ``r`` (of ``task``) as ``MODEL_ROUTING_DECISION``, ``TOKEN_USAGE`` and
        ``TRAJECTORY_STEP``; returns them and the clock after them."""
        sim, rows, tasks = self.sim, self.ep.rows, self.ep.tasks
        r_i = int(tasks.role[task])
        role, model = ROLES[r_i], sim.actions[rows["action"][r]]
        primary, fallback = sim.primary[r_i], self.fallback[r_i]
        timed_out, passed = bool(rows["timed_out"][r]), bool(rows["verification_passed"][r])
        propensity = round(float(rows["propensity"][r]), 10)
        tcs, pfc = float(tasks.task_complexity_score[task]), int(rows["primary_failure_count"][r])
        table_choice = fallback if self.fired[r] else primary
        clock += timedelta(milliseconds=5)
        decision = {
            "type": "MODEL_ROUTING_DECISION", "timestamp": _stamp(clock), "session_id": sid,
            "agent_role": role, "task_complexity_score": tcs, "primary_failure_count": pfc,
            "primary_model": sim.actions[primary], "fallback_model": sim.actions[fallback],
            "selected_model": model, "matched_fallback_triggers": self.fired[r],
            "policy_source": "yaml" if rows["action"][r] == table_choice else "learned", "propensity": propensity}
        clock += timedelta(seconds=float(rows["latency_s"][r]))
        usage = {"type": "TOKEN_USAGE", "timestamp": _stamp(clock), "session_id": sid, "model": model,
                 "prompt_tokens": int(rows["prompt_tokens"][r]),
                 "completion_tokens": 0 if timed_out else COMPLETION_TOKENS_PER_CALL}
        clock += timedelta(milliseconds=5)
        step = {
            "type": TRAJECTORY_STEP, "timestamp": _stamp(clock), "session_id": sid, "task_id": tid, "agent": role,
            "action": {"model_chosen": model, "prompt_strategy_key": "default"},
            "propensity": propensity,
            "state": {
                "task_complexity_score": tcs,
                "primary_failure_count": pfc,
                "failure_count": int(rows["failure_count"][r]),
                "prompt_tokens": int(rows["prompt_tokens"][r]),
                "verification_passed": passed,
                "timed_out": timed_out,
                "failed_reason": "timeout" if timed_out else (None if passed else "verification_failed"),
                "reviewer_score": float(rows["reviewer_score"][r]),
                "latency_s": round(float(rows["latency_s"][r]), 3),
                "cost_usd": round(float(rows["cost_usd"][r]), 6),
            },
            "reward": round(float(rows["reward_v1"][r]), 6),
            "terminal": bool(rows["terminal"][r]),
            "extra": {"synthetic": True},
        }
        return [decision, usage, step], clock


def _ground_truth(sim: RoutingSimulator, ep: Episodes,
                  config: CollectorConfig) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
    """Phase 3: the exact value of the table, the behaviour policy, uniform and the oracle on these
    tasks (and the best binary policy in ``sage_binary``), overall and per role."""
    values = {
        "static_table": sim.policy_value(ep.static, ep.tasks),
        "behaviour": sim.policy_value(ep.behaviour, ep.tasks),
        "uniform": sim.policy_value(UniformPolicy(sim.actions, ep.mask), ep.tasks),
        "oracle": sim.optimal_value(ep.tasks),
    }
    if config.action_space == "sage_binary":
        values["binary_oracle"] = sim.optimal_value(ep.tasks, ep.mask)
    return {k: v.mean for k, v in values.items()}, {k: v.by_role(ep.tasks) for k, v in values.items()}


def _sha(path: str) -> str | None:
    p = Path(path)
    return artifacts.file_sha256(p) if p.is_file() else None


# ------------------------------------------------------------------ versions and the switch
@contextlib.contextmanager
def _versions_lock(versions: Path) -> Iterator[None]:
    """Short exclusive lock of the versions folder: one run at a time creates, switches or sweeps."""
    with open(versions / LOCK_NAME, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _current(out_dir: Path) -> Path | None:
    """The real folder ``out_dir`` links to, or None when it is no link."""
    return Path(os.path.realpath(out_dir)) if out_dir.is_symlink() else None


def _stamp_now() -> str:
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())


def _begin(out_dir: Path, versions: Path, label: str,
           progress: Callable[[str], None]) -> tuple[Path, int | None]:
    """Sweep what killed runs left, then create and lock this run's folder
    ``<versions>/<time>-<label>-<random>.partial``."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    versions.mkdir(parents=True, exist_ok=True)
    with _versions_lock(versions):
        _sweep(out_dir, versions, progress)
        stage = Path(tempfile.mkdtemp(prefix=f"{_stamp_now()}-{label}-", suffix=PARTIAL_SUFFIX, dir=versions))
        os.chmod(stage, 0o777 & ~artifacts.current_umask())  # mkdtemp makes it private; artifacts are not
        return stage, artifacts.hold_folder(stage)  # taken under the versions lock: no sweep sees it unheld


def _commit(out_dir: Path, versions: Path, stage: Path, progress: Callable[[str], None]) -> Path:
    """Mark ``stage`` complete, switch ``out_dir`` to it, then remove the versions nobody needs."""
    version = stage.with_name(stage.name.removesuffix(PARTIAL_SUFFIX))
    with _versions_lock(versions):
        os.rename(stage, version)  # the same inode: this run's lock on it holds
        artifacts.fsync_dir(versions)
        try:
            previous = _switch(out_dir, version, versions, progress)
        except BaseException:
            shutil.rmtree(version, ignore_errors=True)
            raise
        kept = "" if previous is None else f" (the set it replaced, {previous}, is kept until the next run)"
        progress(f"switched {out_dir} to {version}{kept}")
        _sweep(out_dir, versions, progress, keep={version.resolve(), previous})
    return version


def _switch(out_dir: Path, version: Path, versions: Path, progress: Callable[[str], None]) -> Path | None:
    """Point ``out_dir`` at ``version`` in one step: a fresh relative link renamed over it. Returns the
    folder it pointed to before (a real folder of an older collector is first moved into ``versions``)."""
    target = os.path.relpath(version.resolve(), out_dir.parent.resolve())
    previous = _current(out_dir)
    link = versions / f"{SWITCH_PREFIX}{version.name}"  # outside the ingest's folders while it waits
    legacy = None
    os.symlink(target, link)
    try:
        if out_dir.is_dir() and not out_dir.is_symlink():
            previous = legacy = _move_legacy(out_dir, versions, progress)
        elif out_dir.exists() and not out_dir.is_symlink():
            raise FileExistsError(f"{out_dir} is a file, not the collector's folder or link: move it away "
                                  "and run the collector again")
        try:
            os.replace(link, out_dir)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            link.unlink()  # the versions live on another filesystem: the link waits beside out_dir
            link = out_dir.parent / f".{out_dir.name}{SWITCH_PREFIX}{version.name}"
            os.symlink(target, link)
            os.replace(link, out_dir)
    except BaseException:
        link.unlink(missing_ok=True)
        if legacy is not None and not os.path.lexists(out_dir):
            os.rename(legacy, out_dir)
        raise
    artifacts.fsync_dir(out_dir.parent)
    return previous


def _move_legacy(out_dir: Path, versions: Path, progress: Callable[[str], None]) -> Path | None:
    """Move the real ``out_dir`` of an older collector into ``versions`` (once; an empty one is removed)."""
    if not any(out_dir.iterdir()):
        out_dir.rmdir()
        return None
    dest = versions / f"{LEGACY_PREFIX}{_stamp_now()}-{os.getpid()}"
    try:
        os.rename(out_dir, dest)
    except OSError as exc:
        if exc.errno == errno.EXDEV:
            raise OSError(exc.errno, f"cannot move the old collector folder {out_dir} into {versions} "
                          f"(another filesystem) to replace it with a link: move or delete {out_dir} "
                          "yourself, or pass a versions folder on its filesystem, and run again") from exc
        raise
    progress(f"moved the old collector folder {out_dir} to {dest}; {out_dir} is now a link to the current "
             "set")
    return dest.resolve()


def _foreign(folder: Path) -> list[str]:
    """Names in ``folder`` the collector never writes (a legacy folder holding them is kept)."""
    return sorted(p.name for p in folder.iterdir()
                  if not (p.is_file() and any(fnmatch.fnmatchcase(p.name, pat) for pat in OWNED_PATTERNS)))


def _sweep(out_dir: Path, versions: Path, progress: Callable[[str], None],
           keep: set[Path | None] | None = None) -> None:
    """Under the versions lock: remove killed runs' ``*.partial`` folders and leftover switch links;
    with ``keep`` (after a switch) also every complete version but the current one and ``keep``.
    A folder a live run holds is never touched. Failures are reported, never raised: the switch
    already succeeded or the run has not started."""
    current = _current(out_dir)
    leftovers = [*versions.glob(f"{SWITCH_PREFIX}*"),
                 *out_dir.parent.glob(f".{out_dir.name}{SWITCH_PREFIX}*")]
    for link in leftovers:  # a run killed between making its link and renaming it over out_dir
        if link.is_symlink():
            try:
                link.unlink(missing_ok=True)
            except OSError as exc:
                progress(f"WARNING: could not remove the leftover link {link}: {exc}; the next run tries "
                         "again")
    for entry in sorted(versions.iterdir()):
        if entry.is_symlink() or not entry.is_dir():
            continue
        real = entry.resolve()
        partial = entry.name.endswith(PARTIAL_SUFFIX)
        if real == current or (keep is None and not partial) or (keep is not None and real in keep):
            continue
        try:
            if artifacts.folder_in_use(entry):
                continue  # another run is writing it, or about to switch to it
            if entry.name.startswith(LEGACY_PREFIX) and (foreign := _foreign(entry)):
                more = ", ..." if len(foreign) > 5 else ""
                progress(f"kept {entry}: the old collector folder holds files the collector does not write "
                         f"({', '.join(foreign[:5])}{more}); move what you need and delete it")
                continue
            shutil.rmtree(entry)
        except OSError as exc:
            progress(f"WARNING: could not remove {entry}: {exc}; the next run tries again")
            continue
        progress(f"removed {entry} ({'left by a killed run' if partial else 'superseded'})")
