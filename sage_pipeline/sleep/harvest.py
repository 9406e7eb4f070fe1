"""Harvest a night's tasks: from that day's session logs and from task files.

**Session logs** (SAGE JSON lines, ``*.jsonl`` / ``*.jsonl.gz`` under ``log_dirs``): the
events whose ``timestamp`` falls in the day are grouped by ``(session_id, task_id)``. A
task belongs to a skill when an event names it (``skill``, top level or in ``extra``) or,
without that, when an event's ``agent`` is the skill. It becomes a task when its events
carry what judging needs: ``intent`` and ``reference_kind`` + ``reference`` (top level or
in ``extra``; ``context`` and ``tags`` optional). Tasks without them are reported (count,
first ids and the reason), never invented. An invalid reference is quarantined with the
file, line and reason.

**Task files** (JSON lines, see :mod:`sage_pipeline.sleep.records`): every ``*.jsonl``
under ``<root>/sleep/tasks/`` (records with a ``skill`` field go to that skill only) and
``<root>/sleep/<skill>/tasks/``, plus the packaged ``data/tasks/<skill>.jsonl`` when
``embedded_tasks`` is on. A record with a ``date`` counts only on that night.

Task ids are unique per night: a later duplicate is reported and dropped.
"""

from __future__ import annotations

import gzip
import re
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import msgspec
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.sleep.records import (
    DEFAULT_SPLIT,
    Quarantined,
    SplitSpec,
    TaskRecord,
    TaskRecordError,
    read_task_file,
    task_from_dict,
)

PACKAGED_TASKS = Path(__file__).with_name("data") / "tasks"
TASK_KEYS = ("intent", "context", "reference_kind", "reference", "tags", "skill")
MAX_LISTED = 20


class LogEvent(msgspec.Struct):
    type: str = ""
    timestamp: str = ""
    session_id: str = ""
    task_id: str = ""
    agent: str = ""
    intent: Any = None
    context: Any = None
    reference_kind: Any = None
    reference: Any = None
    tags: Any = None
    skill: Any = None
    extra: Any = None


_decode = msgspec.json.Decoder(LogEvent).decode


class HarvestConfig(BaseModel):
    """Where one night's tasks come from (folders resolved by the caller)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    log_dirs: tuple[Path, ...] = Field((), description="session-log folders harvested for the day")
    task_dirs: tuple[Path, ...] = Field((), description="task-file folders")
    embedded_tasks: bool = Field(True, description="also use the skill's packaged tasks")
    split: SplitSpec = Field(DEFAULT_SPLIT, description="shares of train and val")


@dataclass
class HarvestResult:
    tasks: list[TaskRecord] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    unusable: list[dict] = field(default_factory=list)  # first MAX_LISTED: {task, source, reason}
    unusable_count: int = 0
    duplicates: list[dict] = field(default_factory=list)
    sources: dict[str, int] = field(default_factory=dict)
    log_files: int = 0
    log_lines: int = 0
    log_events_in_day: int = 0
    bad_log_lines: int = 0  # lines near the day (they hold one of its dates) that are not JSON events
    missing_dirs: list[str] = field(default_factory=list)
    skipped_other_skill: int = 0
    skipped_other_date: int = 0
    seconds: float = 0.0

    def summary(self) -> dict:
        return {"tasks": len(self.tasks), "sources": dict(self.sources), "quarantined": len(self.quarantined),
                "unusable": self.unusable_count, "duplicates": len(self.duplicates),
                "log_files": self.log_files, "log_lines": self.log_lines,
                "log_events_in_day": self.log_events_in_day, "bad_log_lines": self.bad_log_lines,
                "skipped_other_skill": self.skipped_other_skill, "skipped_other_date": self.skipped_other_date,
                "missing_dirs": self.missing_dirs, "seconds": round(self.seconds, 3)}


def _files(dirs: Iterable[Path], patterns: tuple[str, ...], missing: list[str]) -> list[Path]:
    out: list[Path] = []
    for d in dirs:
        if not d.exists():
            missing.append(str(d))
            continue
        out += [p for pat in patterns for p in sorted(d.rglob(pat)) if p.is_file()] if d.is_dir() else [d]
    return out


def _parse_ts(ts: str) -> datetime | None:
    try:
        dt = datetime.fromisoformat(ts)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def _field(ev: LogEvent, key: str) -> Any:
    v = getattr(ev, key)
    if v is None and isinstance(ev.extra, dict):
        v = ev.extra.get(key)
    return v


def _open(path: Path):
    return gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb")


def harvest_logs(skill: str, start: datetime, end: datetime, dirs: Iterable[Path], out: HarvestResult,
                 split: SplitSpec = DEFAULT_SPLIT, log: Callable[[str], None] | None = None) -> list[TaskRecord]:
    """Tasks of ``skill`` from the events in [start, end) of every log under ``dirs``."""
    groups: dict[tuple[str, str], dict] = {}
    files = _files(dirs, ("*.jsonl", "*.jsonl.gz"), out.missing_dirs)
    # A line whose bytes hold none of the dates from the day before the window to the day after
    # it cannot carry an ISO timestamp inside the window, whatever its UTC offset: skip it undecoded.
    first, last = (start - timedelta(days=1)).date(), (end + timedelta(days=1)).date()
    in_range = re.compile(b"|".join((first + timedelta(days=i)).isoformat().encode()
                                    for i in range((last - first).days + 1))).search
    t0, last = time.monotonic(), time.monotonic()
    for f_i, path in enumerate(files):
        out.log_files += 1
        with _open(path) as fh:
            for lineno, raw in enumerate(fh, start=1):
                out.log_lines += 1
                if not in_range(raw):
                    continue
                try:
                    ev = _decode(raw)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    out.bad_log_lines += 1
                    continue
                ts = _parse_ts(ev.timestamp) if ev.timestamp else None
                if ts is None or not start <= ts < end:
                    continue
                out.log_events_in_day += 1
                if not ev.task_id:
                    continue
                g = groups.setdefault((ev.session_id, ev.task_id), {"agents": set(), "source": f"{path}:{lineno}"})
                if ev.agent:
                    g["agents"].add(ev.agent)
                for k in TASK_KEYS:
                    v = _field(ev, k)
                    if v is not None and k not in g:
                        g[k], g[f"{k}@"] = v, f"{path}:{lineno}"
        now = time.monotonic()
        if log is not None and now - last > 5:
            last = now
            log(f"harvest: {f_i + 1}/{len(files)} log files, {out.log_lines:,} lines "
                f"({out.log_lines / (now - t0):,.0f}/s)")
    tasks = []
    for (sid, tid), g in groups.items():
        owner = g.get("skill")
        belongs = owner == skill if isinstance(owner, str) and owner else skill in g["agents"]
        if not belongs:
            continue
        task_id = f"{sid}/{tid}" if sid else tid
        missing = [k for k in ("intent", "reference_kind", "reference") if k not in g]
        if missing:
            out.unusable_count += 1
            if len(out.unusable) < MAX_LISTED:
                out.unusable.append({"task": task_id, "source": g["source"],
                                     "reason": f"no {' / '.join(missing)} in the logs: cannot be judged"})
            continue
        rec = {"id": task_id, **{k: g[k] for k in TASK_KEYS if k in g and k != "skill"}}
        where = g.get("reference@", g["source"])
        try:
            tasks.append(task_from_dict(rec, f"{where} (session {sid}, task {tid})", split))
        except TaskRecordError as e:
            file, _, line = where.rpartition(":")
            out.quarantined.append(Quarantined(file, int(line), f"task {task_id}: {e}", e.field))
    return tasks


def harvest(skill: str, date: str, window: tuple[datetime, datetime] | None, config: HarvestConfig,
            log: Callable[[str], None] | None = None) -> HarvestResult:
    """The night's tasks for ``skill``: the day's logs (``window``), task files, packaged tasks."""
    t0 = time.monotonic()
    out = HarvestResult()
    seen: dict[str, str] = {}

    def add(tasks: Iterable[TaskRecord], source: str) -> None:
        n = 0
        for t in tasks:
            if t.skill and t.skill != skill:
                out.skipped_other_skill += 1
                continue
            if t.date and t.date != date:
                out.skipped_other_date += 1
                continue
            if t.id in seen:
                out.duplicates.append({"task": t.id, "kept": seen[t.id], "dropped": t.origin})
                continue
            seen[t.id] = t.origin
            out.tasks.append(t)
            n += 1
        if n:
            out.sources[source] = out.sources.get(source, 0) + n

    if window is not None and config.log_dirs:
        add(harvest_logs(skill, window[0], window[1], config.log_dirs, out, config.split, log), "session logs")
    for path in _files(config.task_dirs, ("*.jsonl",), out.missing_dirs):
        res = read_task_file(path, config.split)
        out.quarantined += res.quarantined
        add(res.tasks, f"task file {path}")
    packaged = PACKAGED_TASKS / f"{skill}.jsonl"
    if config.embedded_tasks and packaged.is_file():
        res = read_task_file(packaged, config.split)
        out.quarantined += res.quarantined
        add(res.tasks, "packaged tasks")
    out.seconds = time.monotonic() - t0
    if log is not None:
        log(f"harvest for {skill} on {date}: {len(out.tasks)} tasks ({out.sources}), {len(out.quarantined)} "
            f"quarantined, {out.unusable_count} unusable, {out.log_lines:,} log lines in {out.seconds:.1f} s")
    return out
