"""The sleep cycle in Dagster: ``sleep_cycle/sage_skills``, one night per day partition on the project's SAGE
skills root, the ``nightly_sleep`` job and its schedule, and the ``sleep_rollback`` job.

Thin: the work is ``sage_pipeline.sleep.sage_night.run_sage_skills`` (the online check of the deployed edits on
SAGE's journals, the harvest of SAGE's runs, one night on the root SAGE reads through ``SAGE_SKILLS_ROOT``); this
module maps config in and the outcome out as metadata. The config is the core's ``SageSkillsSettings``, section
by section, each default declared once there. With no SAGE workspaces, journals or goal ledgers given (run
config, or ``$SAGE_WORKSPACES`` / ``$SAGE_JOURNALS`` / ``$SAGE_GOAL_LEDGERS``) the nights read the shipped week
of SAGE's own runs (``sage_pipeline.sage.week.embedded_week``); with no model configured (``$SAGE_SLEEP_MODEL``)
a night harvests and ends ``no_model``: the root's live version (SAGE's tree as shipped on a new root) stays,
and the check passes.

The partitions and the schedule are built from :class:`SleepSchedule` (first night, time zone, time of day),
fixed in code, never read from the environment; a deployment that wants another schedule builds its own with
:func:`build_sleep_defs`, and stops or starts it in the UI or with ``dagster schedule stop|start
nightly_sleep_schedule``. :func:`default_nights` names the nights ``make run`` materializes: the days of the
embedded week's runs (oldest first), else the first partitions.

A night that fails (``backend_error``, ``store_error``, ``input_error``, ...) fails its blocking check
``sage_skills_night_completed`` and so its step and the run, after its metadata and diagnostics are recorded.
Two nights never run at once: the asset is in the ``sleep_cycle`` pool (give the pool a limit of 1: ``dagster
instance concurrency set sleep_cycle 1``), the jobs' runs carry the tag ``sage/sleep_cycle`` (for a run tag
concurrency limit), and the core holds the root's night lock for the whole night whatever the instance says.
"""
# No `from __future__ import annotations`: Dagster reads the real annotations.

from datetime import date
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import dagster as dg
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sage_pipeline import markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.sections import section
from sage_pipeline.sleep.backends import OllamaConfig, OpenAIConfig
from sage_pipeline.sleep.block import EditLimits
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.records import SplitSpec
from sage_pipeline.sleep.sage_night import (
    ERROR_STATUSES,
    SageNightConfig,
    SageSkillsOutcome,
    SageSkillsSettings,
    run_sage_skills,
)
from sage_pipeline.sleep.sage_online import OnlineCheckConfig
from sage_pipeline.sleep.sage_skills import SageSkillsRoot

GROUP = POOL = "sleep_cycle"
RUN_TAG = {"sage/sleep_cycle": "night"}
KEY = dg.AssetKey([GROUP, "sage_skills"])
CHECK = "sage_skills_night_completed"


class SleepSchedule(BaseModel):
    """What the night partitions and the nightly schedule are built from."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start_date: date = Field(date(2026, 11, 1), description="the first night (partition)")
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


class OllamaSection(dg.Config, OllamaConfig):
    """the ollama client: ``sage_pipeline.sleep.backends.OllamaConfig``."""


class OpenAISection(dg.Config, OpenAIConfig):
    """the openai client: ``sage_pipeline.sleep.backends.OpenAIConfig``."""


class EditLimitsSection(dg.Config, EditLimits):
    """``sage_pipeline.sleep.block.EditLimits``."""


class GateSection(dg.Config, GateConfig):
    """``sage_pipeline.sleep.gate.GateConfig``."""


class SplitSection(dg.Config, SplitSpec):
    """``sage_pipeline.sleep.records.SplitSpec``."""


class SageNightSection(dg.Config, SageNightConfig):
    """``sage_pipeline.sleep.sage_night.SageNightConfig``."""

    limits: EditLimitsSection = section(SageNightConfig, "limits", EditLimitsSection)
    gate: GateSection = section(SageNightConfig, "gate", GateSection)
    split: SplitSection = section(SageNightConfig, "split", SplitSection)


class OnlineCheckSection(dg.Config, OnlineCheckConfig):
    """``sage_pipeline.sleep.sage_online.OnlineCheckConfig``."""


class SageSkillsAssetConfig(dg.Config, SageSkillsSettings):
    """The run config of ``sleep_cycle/sage_skills``: ``sage_pipeline.sleep.sage_night.SageSkillsSettings``."""

    ollama: OllamaSection = section(SageSkillsSettings, "ollama", OllamaSection)
    openai: OpenAISection = section(SageSkillsSettings, "openai", OpenAISection)
    night: SageNightSection = section(SageSkillsSettings, "night", SageNightSection)
    online: OnlineCheckSection = section(SageSkillsSettings, "online", OnlineCheckSection)

    def settings(self) -> SageSkillsSettings:
        return SageSkillsSettings.model_validate(self.model_dump())


def _md(rows: list[dict], empty: str) -> dg.MetadataValue:
    return dg.MetadataValue.md(markdown.table(rows) if rows else empty)


def _sandbox(d: dict) -> str:
    """Which backend ran SAGE's tests, and whether unisolated by the override."""
    if not d:
        return "-"
    if d.get("sandbox") == "local":
        return ("local: UNISOLATED, SAGE's model-written tests run by the override allow_untrusted_local"
                if d.get("allow_untrusted_local") else "local (unisolated)")
    return f"{d.get('sandbox')} (isolated{', untrusted code' if d.get('untrusted') else ''})"


def sage_skills_metadata(o: SageSkillsOutcome) -> dict:
    """What the UI shows at a glance: the live version and its per-skill shas, the night's decision, the
    online check's table."""
    n, live = o.night, o.live
    changed = set((n.diff if n else {}) or {})
    meta = {
        "status": n.status if n else "not_configured", "message": o.message, "reason": o.message,
        "live_version": f"v{live['seq']}={live['version']}" if live else "-",
        "live_path": dg.MetadataValue.path(live.get("path", "")) if live else "-",
        "skills": _md([{"skill": s, "sha16": h, "changed tonight": s in changed}
                       for s, h in (live.get("shas") or {}).items()], "no skills root yet"),
        "skills_root": dg.MetadataValue.path(o.root),
        "deploy": (f"export SAGE_SKILLS_ROOT={live['path']}" if live else "-"),
        "inputs": o.inputs or "-",
    }
    if o.online is not None:
        meta.update({
            "online_check": o.online.summary(),
            "online_versions": _md(o.online.texts, "no run of SAGE's with the role's skills yet"),
            "online_edits": _md([{k: e[k] for k in ("version", "skill", "runs_new", "verified_new", "runs_parent",
                                                    "verified_parent", "p_value", "decision", "action")}
                                 for e in o.online.edits], "no edit to check"),
            "rollbacks": len(o.online.rollbacks),
        })
    if o.online_error:
        meta["online_error"] = o.online_error
    if n is None:
        return meta
    s = n.scores
    meta.update({
        "decision": n.gate_action, "reason": n.reason, "cause": n.cause or "-",
        "versions": dg.MetadataValue.json(n.versions),
        "scores": _md([{"split": k, **{f: (s.get(k) or {}).get(f) for f in ("score", "hard", "tasks", "samples")}}
                       for k in ("baseline_val", "candidate_val", "train", "test_before", "test_after")], "-"),
        "trials": _md([{"edits": "; ".join(t["edits"])[:140], "baseline": t["baseline"], "candidate": t["candidate"],
                        "verdict": t["verdict"], "p_value": t.get("p_value")} for t in n.trials], "no trial"),
        "edits": _md([{"target": e["target"], "content": e["content"][:120], "status": e["status"],
                       "why": e["reason"][:140]} for e in n.edits], "no edit proposed"),
        "diff": dg.MetadataValue.md("\n".join(f"```diff\n{d}```" for d in n.diff.values()) or "no change"),
        "tasks": dg.MetadataValue.json({k: v for k, v in n.tasks.items() if not k.endswith("_ids")}),
        "harvest": dg.MetadataValue.json({k: o.harvest.get(k) for k in ("sessions", "outside_window", "tasks",
                                                                          "validated", "reasons", "missing",
                                                                          "unsafe")}),
        "sandbox": _sandbox(n.sandbox),
        "diagnostics": dg.MetadataValue.path(n.diagnostics),
    })
    if n.ledger:  # ledger mode: every skill candidate's standing (the decisions/decision_ledger asset shows all levers)
        meta["ledger"] = _md([{"candidate": c["id"], "change": (c.get("change") or c["key"])[:90], "state": c["state"],
                               "estimate": c["estimate"], "interval": "—" if c["interval"][0] is None else
                               f"[{c['interval'][0]:+.3f}, {c['interval'][1]:+.3f}]", "standing": c["standing"],
                               "why": c["history"][-1]["reason"][:140] if c["history"] else ""}
                              for c in n.ledger.get("candidates", [])], "no candidate yet")
        meta["ledger_guarantee"] = n.ledger.get("guarantee", "-")
        plan = n.ledger.get("plan")
        meta["next_plan"] = dg.MetadataValue.json(plan if isinstance(plan, dict) else {"plan": str(plan or "-")})
    return meta


def _check(o: SageSkillsOutcome) -> dg.AssetCheckResult:
    status = o.night.status if o.night else "not_configured"
    return dg.AssetCheckResult(
        check_name=CHECK, asset_key=KEY, passed=o.healthy,
        severity=dg.AssetCheckSeverity.ERROR if status in ERROR_STATUSES else dg.AssetCheckSeverity.WARN,
        description=o.message + (f" Cause: {o.night.cause}" if o.night and o.night.cause else ""),
        metadata={"status": status})


def sage_skills_asset(nights: dg.PartitionsDefinition) -> dg.AssetsDefinition:
    @dg.asset(key=KEY, group_name=GROUP, partitions_def=nights, pool=POOL, kinds={"python", "markdown"},
              description="One night of the sleep cycle on SAGE's own skills: the online check of the deployed edits "
                          "on SAGE's journals (an edit that hurt beyond chance is rolled back), the harvest of SAGE's "
                          "runs (the configured ones, else the shipped week of SAGE's runs; tasks judged by the tests "
                          "SAGE's test engineer wrote, run as SAGE's gate runs them), the coder replayed as SAGE would "
                          "with the candidate skills injected, the decision ledger (or the per-night gate), an "
                          "accepted rule committed as the live version of sleep/sage_skills (SAGE_SKILLS_ROOT). With "
                          "no model configured: harvested, nothing replayed ('no_model').",
              check_specs=[dg.AssetCheckSpec(CHECK, asset=KEY, blocking=True,
                                             description="Fails when the night on SAGE's skills could not do its job: "
                                                         "a backend, judge, store or input error or a bug (ERROR, "
                                                         "blocking) or a conflict or unusable reflect reply (WARN). "
                                                         "Passes for no_model and when nothing is configured.")])
    def sage_skills(context: dg.AssetExecutionContext, config: SageSkillsAssetConfig,
                    sage: SageResource) -> dg.MaterializeResult:
        window = context.partition_time_window
        o = run_sage_skills(sage.root(), context.partition_key, (window.start, window.end), config.settings(),
                            log=context.log.info)
        if not o.configured:
            context.log.info(o.message)
        elif not o.healthy:
            context.log.error(f"sage_skills {context.partition_key}: {o.message}")
        return dg.MaterializeResult(metadata=sage_skills_metadata(o), check_results=[_check(o)])

    return sage_skills


class RollbackConfig(dg.Config):
    skill: str = Field(description="the skill to roll back: its id (discipline/test-driven-development/SKILL.md) or "
                                   "its folder name (test-driven-development)")
    to: str = Field("", description="the version to take its text from: an id, a unique prefix (>= 4 characters), "
                    "v<seq>; empty: the skill as it was before its last change. List them with "
                    "`python -m sage_pipeline.sleep versions`")
    note: str = Field("", description="why (recorded in the root's history)")


@dg.op(description="Roll one skill of the project's SAGE skills root back: a new live version with the skill's text "
                   "from an earlier version (a rollback is itself a version, so it can be undone).")
def rollback_skill(context: dg.OpExecutionContext, config: RollbackConfig, sage: SageResource) -> None:
    from sage_pipeline.sleep.__main__ import CliError, previous_text_version, skill_id
    from sage_pipeline.sleep.sage_skills import LIVE_FILE

    folder = SageSkillsSettings().root_path(sage.root())
    if not (folder / LIVE_FILE).is_file():
        raise dg.Failure(f"{folder} is not a SAGE skills root (no {LIVE_FILE}): no night has run yet")
    root = SageSkillsRoot(folder)
    try:
        sid = skill_id(config.skill)
        before = root.live()
        to = root.find(config.to) if config.to else previous_text_version(root, sid)
    except CliError as e:
        raise dg.Failure(str(e)) from None
    v = root.rollback(sid, to, config.note)
    context.log.info(f"{sid}: rolled back to its text in {to}; live v{v.seq}={v.version}, was {before}")
    context.log_event(dg.AssetObservation(asset_key=KEY, metadata={
        "rollback_skill": sid, "rollback_to": to, "rolled_back_from": before, "live_version": f"v{v.seq}={v.version}",
        "note": config.note, "live_path": dg.MetadataValue.path(str(root.live_path()))}))


@dg.job(name="sleep_rollback", tags=RUN_TAG,
        description="Roll one skill of the SAGE skills root back (config: skill, to, note).")
def sleep_rollback_job():
    rollback_skill()


nightly_sleep_job = dg.define_asset_job(
    "nightly_sleep", selection=dg.AssetSelection.groups(GROUP), tags=RUN_TAG,
    description="The nightly sleep cycle on SAGE's skills root for one day (a partition).")


def nightly_schedule(schedule: SleepSchedule) -> dg.ScheduleDefinition:
    hour, minute = (int(x) for x in schedule.at.split(":"))
    return dg.build_schedule_from_partitioned_job(
        nightly_sleep_job, name="nightly_sleep_schedule", hour_of_day=hour, minute_of_hour=minute,
        description=f"Every day at {schedule.at} {schedule.timezone}: the night of the day that just ended.",
        default_status=dg.DefaultScheduleStatus.RUNNING if schedule.running else dg.DefaultScheduleStatus.STOPPED)


def build_sleep_defs(schedule: SleepSchedule) -> dg.Definitions:
    """The sleep cycle's asset, jobs and schedule for ``schedule``."""
    return dg.Definitions(assets=[sage_skills_asset(schedule.nights())], jobs=[nightly_sleep_job, sleep_rollback_job],
                          schedules=[nightly_schedule(schedule)])


SCHEDULE = SleepSchedule()
NIGHTS = SCHEDULE.nights()
sleep_defs = build_sleep_defs(SCHEDULE)
SLEEP_ASSETS = list(sleep_defs.assets)
sage_skills = SLEEP_ASSETS[0]
nightly_sleep_schedule = next(iter(sleep_defs.schedules))


def default_nights(n: int = 3) -> list[str]:
    """The nights ``make run`` materializes (partition keys, oldest first, at most ``n``): one per day of the shipped
    SAGE week (its manifest's ``days``), from ``SageSkillsSettings.embedded_first_night``; the first ``n``
    partitions when no week is shipped."""
    from datetime import date as Date, timedelta

    if n < 0:
        raise ValueError(f"number of nights must be >= 0, got {n}")
    try:
        from sage_pipeline.sage.week import WeekError, load_manifest
    except ImportError:
        return NIGHTS.get_partition_keys()[:n]
    try:
        days = list(load_manifest()["days"])
    except (WeekError, OSError, KeyError, TypeError):
        return NIGHTS.get_partition_keys()[:n]
    first = Date.fromisoformat(SageSkillsSettings.model_fields["embedded_first_night"].default)
    keys = set(NIGHTS.get_partition_keys())
    return [k for k in ((first + timedelta(days=i)).isoformat() for i in range(len(days))) if k in keys][:n]
