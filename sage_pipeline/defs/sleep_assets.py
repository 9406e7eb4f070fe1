"""The nightly sleep cycle in Dagster: one daily-partitioned asset per skill (``sleep_cycle/<skill>``),
the ``nightly_sleep`` job and its schedule, and the ``sleep_rollback`` job.

Thin: the night is ``sage_pipeline.sleep.nightly.run_night``; this module maps config in
and the night's result out as metadata. The asset's config is the core's ``NightSettings``,
section by section (``openai``, ``cycle: {limits, gate}``, ``split``): each field, default,
description and check is declared once, in the core model, and inherited here.

The partitions and the schedule are built from :class:`SleepSchedule` (first night, time zone,
time of day), fixed in code, never read from the environment; a deployment that wants
another schedule builds its own with :func:`build_sleep_defs`, and stops or starts it in the UI
or with ``dagster schedule stop|start nightly_sleep_schedule``. Which skills have a night
asset is the one thing read when the code loads (it decides which assets exist):
``SAGE_SLEEP_SKILLS`` (comma-separated; default: the packaged skills).

A night that fails (``backend_error``, ``store_error``, ``input_error``, ...) fails its blocking
check ``night_completed`` and so its step and the run, after its metadata and diagnostics are
recorded; every skill is its own asset, so the other skills' nights in the same run still run
and keep what they wrote.

Two nights never run at once: every night asset is in the ``sleep_cycle`` pool (give the
pool a limit of 1: ``dagster instance concurrency set sleep_cycle 1``), the job's runs
carry the tag ``sage/sleep_cycle`` (for a run tag concurrency limit), and the core holds
a per-skill lock for the whole night whatever the instance says.
"""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import os
from datetime import date
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sage_pipeline import markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.sleep import report as sr
from sage_pipeline.sleep.backends import OpenAIConfig
from sage_pipeline.sleep.block import EditLimits
from sage_pipeline.sleep.cycle import ERROR_STATUSES, CycleConfig, NightResult
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.nightly import NightSettings, run_night
from sage_pipeline.sleep.records import SplitSpec
from sage_pipeline.sleep.store import PACKAGED_SKILLS, SkillStore

GROUP = POOL = "sleep_cycle"
RUN_TAG = {"sage/sleep_cycle": "night"}
HEALTHY = ("accepted", "rejected", "no_edits", "no_tasks")


def packaged_skills() -> list[str]:
    return sorted(p.stem for p in PACKAGED_SKILLS.glob("*.md") if not p.stem.endswith(".memory"))


class SleepSchedule(BaseModel):
    """What the night partitions and the nightly schedule are built from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    skills: list[str] = Field(default_factory=packaged_skills, min_length=1,
                              description="one night asset per skill (default: the packaged skills)")
    start_date: date = Field(date(2026, 11, 1), description="the first night (partition): the day the synthetic "
                             "session logs start on")
    timezone: str = Field("UTC", description="time zone of the days (partitions) and of the schedule")
    at: str = Field("03:17", pattern=r"^([01][0-9]|2[0-3]):[0-5][0-9]$",
                    description="HH:MM: when the schedule starts the night of the day that just ended")
    running: bool = Field(True, description="the schedule's default status (running, or stopped until started)")

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"time zone {v!r} is not an IANA zone name such as 'UTC' or 'Europe/Berlin'") from None
        return v

    def nights(self) -> dg.DailyPartitionsDefinition:
        return dg.DailyPartitionsDefinition(start_date=self.start_date.isoformat(), timezone=self.timezone)


def _skills_from_env() -> SleepSchedule:
    """The default schedule, for the skills ``SAGE_SLEEP_SKILLS`` names (if set)."""
    env = [s.strip() for s in os.environ.get("SAGE_SLEEP_SKILLS", "").split(",") if s.strip()]
    return SleepSchedule(skills=list(dict.fromkeys(env))) if env else SleepSchedule()


def _section(core: type[BaseModel], name: str, section: type) -> object:
    """A nested Dagster config section standing for ``core``'s field ``name`` (its description kept)."""
    return Field(default_factory=section, description=core.model_fields[name].description)


class OpenAISection(dg.Config, OpenAIConfig):
    """openai backend: ``sage_pipeline.sleep.backends.OpenAIConfig``."""


class EditLimitsSection(dg.Config, EditLimits):
    """``sage_pipeline.sleep.block.EditLimits``."""


class GateSection(dg.Config, GateConfig):
    """``sage_pipeline.sleep.gate.GateConfig``."""


class CycleSection(dg.Config, CycleConfig):
    """``sage_pipeline.sleep.cycle.CycleConfig``."""

    limits: EditLimitsSection = _section(CycleConfig, "limits", EditLimitsSection)
    gate: GateSection = _section(CycleConfig, "gate", GateSection)


class SplitSection(dg.Config, SplitSpec):
    """``sage_pipeline.sleep.records.SplitSpec``."""


class SleepNightConfig(dg.Config, NightSettings):
    """A night's run config: ``sage_pipeline.sleep.nightly.NightSettings``, nested sections included."""

    openai: OpenAISection = _section(NightSettings, "openai", OpenAISection)
    cycle: CycleSection = _section(NightSettings, "cycle", CycleSection)
    split: SplitSection = _section(NightSettings, "split", SplitSection)

    def settings(self) -> NightSettings:
        return NightSettings.model_validate(self.model_dump())


def _score(r: NightResult, key: str) -> dg.MetadataValue:
    s = r.scores.get(key) or {}
    return dg.MetadataValue.float(float(s["score"])) if s.get("score") is not None else dg.MetadataValue.text("-")


def night_metadata(r: NightResult, files: sr.NightFiles) -> dict:
    groups = sr.edit_groups(r)
    errors = [{k: e.get(k) for k in ("purpose", "attempt", "final", "error")} for e in r.call_errors[:30]]
    return {
        "status": r.status, "gate_action": r.gate_action, "reason": r.reason, "cause": r.cause or "-",
        "baseline_val_score": _score(r, "baseline_val"), "candidate_val_score": _score(r, "candidate_val"),
        "test_before_score": _score(r, "test_before"), "test_after_score": _score(r, "test_after"),
        "scores": dg.MetadataValue.md(markdown.table(sr.score_rows(r))),
        **{f"{k}_edits": len(v) for k, v in groups.items()},
        **{f"{k}_edits_table": dg.MetadataValue.md(markdown.table(sr.edit_rows(v))) for k, v in groups.items()},
        "per_task": dg.MetadataValue.md(markdown.table(sr.task_rows(r))),
        "reflect_reply_head": dg.MetadataValue.md(f"```\n{(r.reflect.get('reply_head') or '(no reply)')[:600]}\n```"),
        "backend_call_errors": dg.MetadataValue.md(markdown.table(errors)),
        "token_use": dg.MetadataValue.json(r.calls or {}),
        "tasks": dg.MetadataValue.json(r.tasks), "harvest": dg.MetadataValue.json(r.harvest),
        "quarantined": len(r.quarantined),
        "versions": dg.MetadataValue.json(r.versions),
        "report": dg.MetadataValue.md(sr.report_markdown(r, markdown.image(files.png, "scores per night"))),
        "diagnostics": dg.MetadataValue.path(str(files.diagnostics)),
        "report_path": dg.MetadataValue.path(str(files.report)),
        "live_skill": dg.MetadataValue.path(r.live.get("skill", "")),
        "seconds": r.seconds,
    }


def _health(r: NightResult, key: dg.AssetKey) -> dg.AssetCheckResult:
    return dg.AssetCheckResult(
        check_name="night_completed", asset_key=key, passed=r.status in HEALTHY,
        severity=dg.AssetCheckSeverity.ERROR if r.status in ERROR_STATUSES else dg.AssetCheckSeverity.WARN,
        description=f"{r.status}: {r.reason}" + (f" Cause: {r.cause}" if r.cause else ""),
        metadata={"status": r.status, "cause": r.cause or "-"})


def sleep_cycle_asset(skill: str, nights: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    """The night asset of one skill: partition = the day whose tasks are harvested."""
    key = dg.AssetKey([GROUP, skill])

    @dg.asset(key=key, group_name=GROUP, partitions_def=nights, pool=POOL, kinds={"python", "markdown"},
              description=f"One night of the sleep cycle for the {skill!r} skill: harvest the day's tasks, replay, "
                          "reflect, edit the protected learned block, keep an edit only if a paired test on val "
                          "says it helps at the night's stated false-accept level, then score test. Writes "
                          "sleep/" + skill + "/ (live SKILL.md and MEMORY.md, "
                          "versions/, nights/<date>/diagnostics.json and report.md).",
              check_specs=[dg.AssetCheckSpec("night_completed", asset=key, blocking=True,
                                             description="Fails when the night could not do its job. Blocking: "
                                                         "a backend, judge, store or input error or a bug (ERROR) "
                                                         "fails the night's step and so the run, after its "
                                                         "diagnostics are recorded; a conflict, an unusable reflect "
                                                         "reply or an unverified gate (WARN) does not.")])
    def _night(context: dg.AssetExecutionContext, config: SleepNightConfig, sage: SageResource) -> dg.MaterializeResult:
        window = context.partition_time_window
        r, files = run_night(sage.root(), skill, context.partition_key, (window.start, window.end),
                             config.settings(), log=context.log.info)
        if r.status in ERROR_STATUSES:
            context.log.error(f"night {r.date} of {skill}: {r.status}: {r.cause}")
        return dg.MaterializeResult(metadata=night_metadata(r, files), check_results=[_health(r, key)])

    return _night


class RollbackConfig(dg.Config):
    skill: str = Field(description="the skill to roll back")
    version: str = Field(description="a stored version: its id, a unique prefix (>= 4 characters) or v<seq>; "
                         "list them with `python -m sage_pipeline.sleep versions --skill <skill>`")
    note: str = Field("", description="why (recorded in the version history)")


@dg.op(description="Make a stored version of a skill's documents live again (atomically; the current live "
                   "documents are stored first, so the rollback can itself be undone).")
def rollback_skill(context: dg.OpExecutionContext, config: RollbackConfig, sage: SageResource) -> None:
    store = SkillStore(sage.path("sleep"), config.skill)
    before = store.current()
    v = store.restore(config.version, note=config.note)
    context.log.info(f"{config.skill}: live documents at {v.version} (v{v.seq}), were {before}")
    context.log_event(dg.AssetObservation(asset_key=dg.AssetKey([GROUP, config.skill]), metadata={
        "rollback_to": v.version, "rolled_back_from": before, "seq": v.seq, "note": v.note,
        "live_skill": dg.MetadataValue.path(str(store.skill_path))}))


@dg.job(name="sleep_rollback", tags=RUN_TAG,
        description="Roll a skill back to a named version (config: skill, version).")
def sleep_rollback_job():
    rollback_skill()


nightly_sleep_job = dg.define_asset_job(
    "nightly_sleep", selection=dg.AssetSelection.groups(GROUP), tags=RUN_TAG,
    description="The nightly sleep cycle of every skill for one day (a partition).")


def nightly_schedule(schedule: SleepSchedule) -> dg.ScheduleDefinition:
    hour, minute = (int(x) for x in schedule.at.split(":"))
    return dg.build_schedule_from_partitioned_job(
        nightly_sleep_job, name="nightly_sleep_schedule", hour_of_day=hour, minute_of_hour=minute,
        description=f"Every day at {schedule.at} {schedule.timezone}: the night of the day that just ended.",
        default_status=dg.DefaultScheduleStatus.RUNNING if schedule.running else dg.DefaultScheduleStatus.STOPPED)


def build_sleep_defs(schedule: SleepSchedule) -> dg.Definitions:
    """The sleep cycle's assets, jobs and schedule for ``schedule``."""
    nights = schedule.nights()
    return dg.Definitions(assets=[sleep_cycle_asset(s, nights) for s in schedule.skills],
                          jobs=[nightly_sleep_job, sleep_rollback_job], schedules=[nightly_schedule(schedule)])


SCHEDULE = _skills_from_env()
NIGHTS = SCHEDULE.nights()
sleep_defs = build_sleep_defs(SCHEDULE)
SLEEP_ASSETS = list(sleep_defs.assets)
nightly_sleep_schedule = next(iter(sleep_defs.schedules))


def default_nights(n: int = 3) -> list[str]:
    """The first ``n`` nights (partition keys, oldest first): the days the synthetic session
    logs start on; what ``make run`` materializes one after the other."""
    if n < 0:
        raise ValueError(f"number of nights must be >= 0, got {n}")
    return NIGHTS.get_partition_keys()[:n]
