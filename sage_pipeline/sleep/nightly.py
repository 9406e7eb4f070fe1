"""A whole night for one skill: lock, live documents, harvest, backend, cycle, files.

:func:`run_night` is what the Dagster asset and ``python -m sage_pipeline.sleep run-night``
call. It never raises for a night that went wrong in a way the report can explain
(backend down, unreadable skill file, a live document that is a folder, empty day): it
returns the :class:`NightResult` with the status and cause, and writes ``diagnostics.json``
and ``report.md`` either way. Only where those cannot be written at all (``nights/<date>``
is a file) does it raise, a :class:`~sage_pipeline.sleep.store.StoreError` naming the path
and what to do. A lost ``index.jsonl`` or live document is recovered from the version
folders first, and the night's notes say so (:meth:`SkillStore.recover_lost`).

What is on disk under ``nights/<date>/`` is always this run's: before any work the folder
says ``running`` (an earlier run's files move to ``previous/``), so a night killed outright
leaves that, never an older report. An unexpected exception ends the night as
``internal_error`` (returned, with its traceback), an interrupt (KeyboardInterrupt,
SystemExit) as ``aborted`` (recorded, then raised again).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.sleep import report
from sage_pipeline.sleep.backends import Backend, BackendError, OpenAIBackend, OpenAIConfig
from sage_pipeline.sleep.block import DocumentError, decode_document, parse_document
from sage_pipeline.sleep.cycle import CycleConfig, NightResult, run_cycle
from sage_pipeline.sleep.harvest import HarvestConfig, harvest
from sage_pipeline.sleep.judges import UnitTestJudge
from sage_pipeline.sleep.records import DEFAULT_SPLIT, SplitSpec
from sage_pipeline.sleep.simulated_backend import SimulatedBackend, SimWorld
from sage_pipeline.sleep.store import LiveChanged, SkillStore, StoreError


class NightSettings(BaseModel):
    """Everything one night of one skill is run with (the Dagster asset's config is this model,
    section by section: ``sage_pipeline.defs.sleep_assets.SleepNightConfig``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["simulated", "openai"] = Field(
        "simulated", description="'simulated' (deterministic, embedded default) or 'openai' (any OpenAI-compatible "
                                 "chat-completions server)")
    sim_seed: int = Field(0, description="seed of the simulated backend")
    openai: OpenAIConfig = Field(default_factory=OpenAIConfig, description="the openai backend's server")
    cycle: CycleConfig = Field(default_factory=CycleConfig, description="the night's consolidation")
    log_dirs: list[str] = Field(["sessions"], description="session-log folders (relative to the artifact root, "
                                "or absolute) harvested for the night's day")
    task_dirs: list[str] = Field([], description="more task-file folders (sleep/tasks and sleep/<skill>/tasks are "
                                 "always read)")
    embedded_tasks: bool = Field(True, description="also use the skill's packaged tasks (data/tasks/<skill>.jsonl)")
    skill_path: str | None = Field(None, description="the live skill document (default <root>/sleep/<skill>/SKILL.md)")
    memory_path: str | None = Field(None, description="the live memory document (default "
                                    "<root>/sleep/<skill>/MEMORY.md)")
    sandbox: Literal["auto", "local", "docker"] = Field(
        "auto", description="unit-test sandbox: 'auto' (local for the simulated backend's own answers, docker "
                            "otherwise), 'local' or 'docker'")
    sandbox_workers: int = Field(1, ge=1, description="parallel sandbox workers of the unit-test judge")
    lock_timeout_s: float = Field(3600.0, ge=0, description="how long a night waits for another night of the same "
                                  "skill before it gives up")
    split: SplitSpec = Field(DEFAULT_SPLIT, description="shares of train and val (the rest is test)")
    extra_notes: list[str] = Field([], description="notes copied into the night's report")

    def sandbox_backend(self) -> str:
        if self.sandbox != "auto":
            return self.sandbox
        return "local" if self.backend == "simulated" else "docker"


def make_backend(settings: NightSettings, skill: str, date: str) -> Backend:
    if settings.backend == "simulated":
        return SimulatedBackend(SimWorld.load(skill), seed=settings.sim_seed, night=date)
    return OpenAIBackend(settings.openai)


def day_window(date: str, tz: str = "UTC") -> tuple[datetime, datetime]:
    """[00:00, next 00:00) of ``date`` in the time zone ``tz``."""
    from datetime import timedelta
    from zoneinfo import ZoneInfo

    start = datetime.fromisoformat(date).replace(tzinfo=ZoneInfo(tz))
    return start, (start + timedelta(days=1)).replace(tzinfo=ZoneInfo(tz))


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def run_night(data_root: str | Path, skill: str, date: str, window: tuple[datetime, datetime] | None,
              settings: NightSettings | None = None, log: Callable[[str], None] = lambda m: None,
              backend: Backend | None = None, unit_cache: dict | None = None) -> tuple[NightResult, report.NightFiles]:
    """Run the night of ``date`` for ``skill``; returns the result and the files written.

    ``backend`` overrides the one the settings name; ``unit_cache`` (a dict) keeps sandbox
    verdicts by (code, tests) across nights run in one process.
    """
    settings = settings if settings is not None else NightSettings()
    root = Path(data_root)
    store = SkillStore(root / "sleep", skill, settings.skill_path or None, settings.memory_path or None)
    r = NightResult(skill=skill, date=date, started_at=_now(), notes=list(settings.extra_notes))
    r.live = {k: str(p) for k, p in store.paths().items()}
    t0 = time.monotonic()
    interrupted: BaseException | None = None
    with store.night_lock(settings.lock_timeout_s, log, date):
        report.write_started(r, store.root)
        try:
            _run_locked(store, root, r, window, settings, log, backend, unit_cache)
        except Exception as e:  # noqa: BLE001 - a bug still leaves a record that says the night failed
            _stopped_by(r, e, "internal_error", log)
        except BaseException as e:  # interrupted: record it, then let it go on
            _stopped_by(r, e, "aborted", log)
            interrupted = e
        r.seconds = round(time.monotonic() - t0, 3)
        r.finished_at = _now()
        files = report.write_night(r, store.root)
    log(f"night {date} of {skill}: {r.status} ({r.reason}) in {r.seconds:.1f} s; {files.diagnostics}")
    if interrupted is not None:
        raise interrupted
    return r, files


def _stopped_by(r: NightResult, e: BaseException, status: str, log: Callable[[str], None]) -> None:
    """Record an exception no step handled: status, cause (type, message, innermost frame), traceback."""
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    phase = r.phase or "setup"
    r.status, r.cause = status, f"{type(e).__name__}: {e}"[:1000] + at
    r.traceback = "".join(traceback.format_exception(e))[-4000:]
    r.reason = (f"the night was interrupted during {phase}" if status == "aborted" else
                f"an unexpected error stopped the night during {phase} (a bug: report it with this night's "
                "diagnostics.json)") + ": nothing after this point was scored"
    if r.versions.get("after"):
        r.reason += f"; version {r.versions['after']} had already been committed"
    log(f"night {r.date} of {r.skill}: {status}: {r.cause}\n{r.traceback}")


def _run_locked(store: SkillStore, root: Path, r: NightResult, window, settings: NightSettings,
                log: Callable[[str], None], backend: Backend | None, unit_cache: dict | None) -> None:
    # 1. the live documents, with their learned blocks
    try:
        r.notes += store.ensure_live()
        snap = store.read()
        texts = {"skill": decode_document(snap.skill, store.skill_path),
                 "memory": decode_document(snap.memory, store.memory_path)}
        docs = {k: parse_document(v, store.paths()[k]) for k, v in texts.items()}
        r.versions["before"] = store.register(snap, r.date).version
        created = [k for k, d in docs.items() if d.created_block]
        if created:
            new = {k: d.render() for k, d in docs.items()}
            v = store.commit(new["skill"], new["memory"], snap, "block_created", r.date,
                             f"appended an empty learned block to {', '.join(created)}; nothing else changed")
            snap = store.read()
            docs = {k: parse_document(decode_document(getattr(snap, k), store.paths()[k]), store.paths()[k])
                    for k in ("skill", "memory")}
            r.versions["before"] = v.version
            r.notes.append(f"created the learned block in {', '.join(str(store.paths()[k]) for k in created)} "
                           "(appended at the end; nothing else changed)")
    except (DocumentError, StoreError, OSError) as e:
        r.status, r.phase, r.cause = "input_error", "read live documents", str(e)
        r.reason = "a live document or the version history cannot be used as it is; nothing was changed"
        return
    except LiveChanged as e:
        r.status, r.phase, r.reason = "conflict", "create the learned block", str(e)
        return
    r.block = {"created": created, "cap": settings.cycle.limits.block_max_chars,
               "chars": {k: d.block_chars() for k, d in docs.items()},
               "rules": {k: len(d.rules) for k, d in docs.items()}}

    # 2. the night's tasks
    sleep_root = root / "sleep"
    default_dirs = [p for p in (sleep_root / "tasks", store.root / "tasks") if p.is_dir()]
    cfg = HarvestConfig(log_dirs=tuple(root / d for d in settings.log_dirs),
                        task_dirs=tuple(default_dirs) + tuple(root / d for d in settings.task_dirs),
                        embedded_tasks=settings.embedded_tasks, split=settings.split)
    h = harvest(store.skill, r.date, window, cfg, log)
    r.harvest = h.summary()
    r.quarantined = [q.to_dict() for q in h.quarantined]
    r.unusable = h.unusable + [{"task": d["task"], "source": d["dropped"], "reason": f"duplicate id (kept {d['kept']})"}
                               for d in h.duplicates[:10]]

    # 3. the backend and the judges, then the cycle
    try:
        backend = backend or make_backend(settings, store.skill, r.date)
    except (BackendError, KeyError) as e:
        r.status, r.phase = "backend_error", "start the backend"
        r.cause = e.cause if isinstance(e, BackendError) else str(e.args[0])
        r.reason = "the backend could not be set up: no task was run"
        return
    r.backend = backend.describe()
    unit = UnitTestJudge(sandbox=settings.sandbox_backend(), workers=settings.sandbox_workers, log=log,
                         cache={} if unit_cache is None else unit_cache)

    def commit(new: dict[str, str]) -> str:
        v = store.commit(new["skill"], new["memory"], snap, "accepted", r.date,
                         f"night {r.date}: {len(r.edits_with('accepted'))} edit(s) accepted")
        return v.version

    try:
        run_cycle(h.tasks, docs, backend, unit, settings.cycle, r, commit, log)
    finally:
        r.sandbox = unit.describe()
        unit.close()
    if not r.versions["after"]:
        r.versions["after"] = r.versions["before"]
    final = store.paths()
    r.block["chars_after"] = {}
    for k in ("skill", "memory"):
        try:
            r.block["chars_after"][k] = parse_document(final[k].read_text(encoding="utf-8"), final[k]).block_chars()
        except (OSError, UnicodeDecodeError, DocumentError):
            r.block["chars_after"][k] = None
