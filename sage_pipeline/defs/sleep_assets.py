"""The nightly sleep cycle in Dagster: one daily-partitioned asset per skill (``sleep_cycle/<skill>``),
the ``nightly_sleep`` job and its schedule, and the ``sleep_rollback`` job.

Thin: the night is ``sage_pipeline.sleep.nightly.run_night``; this module maps config in
and the night's result out as metadata. Set at load time from the environment:
``SAGE_SLEEP_SKILLS`` (default: the packaged skills), ``SAGE_SLEEP_TIMEZONE`` (UTC),
``SAGE_SLEEP_AT`` (03:17), ``SAGE_SLEEP_START_DATE`` (2026-11-01) and
``SAGE_SLEEP_SCHEDULE_RUNNING`` (1: the schedule starts on).

Two nights never run at once: every night asset is in the ``sleep_cycle`` pool (give the
pool a limit of 1: ``dagster instance concurrency set sleep_cycle 1``), the job's runs
carry the tag ``sage/sleep_cycle`` (for a run tag concurrency limit), and the core holds
a per-skill lock for the whole night whatever the instance says.
"""
# No `from __future__ import annotations`: Dagster reads the real annotations.

import os

import dagster as dg
from pydantic import Field

from sage_pipeline import markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.sleep import report as sr
from sage_pipeline.sleep.backends import OpenAIConfig
from sage_pipeline.sleep.block import EditLimits
from sage_pipeline.sleep.cycle import ERROR_STATUSES, CycleConfig, NightResult
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.nightly import NightSettings, run_night
from sage_pipeline.sleep.store import PACKAGED_SKILLS, SkillStore

GROUP = POOL = "sleep_cycle"
RUN_TAG = {"sage/sleep_cycle": "night"}
HEALTHY = ("accepted", "rejected", "no_edits", "no_tasks")


def _skills() -> tuple[str, ...]:
    env = os.environ.get("SAGE_SLEEP_SKILLS", "")
    if env.strip():
        return tuple(dict.fromkeys(s.strip() for s in env.split(",") if s.strip()))
    return tuple(sorted(p.stem for p in PACKAGED_SKILLS.glob("*.md") if not p.stem.endswith(".memory")))


SKILLS = _skills()
TIMEZONE = os.environ.get("SAGE_SLEEP_TIMEZONE", "UTC")
HOUR, MINUTE = (int(x) for x in os.environ.get("SAGE_SLEEP_AT", "03:17").split(":"))
NIGHTS = dg.DailyPartitionsDefinition(start_date=os.environ.get("SAGE_SLEEP_START_DATE", "2026-11-01"),
                                      timezone=TIMEZONE)


def default_nights(n: int = 3) -> list[str]:
    """The first ``n`` nights (partition keys, oldest first): the days the synthetic session
    logs start on; what ``make run`` materializes one after the other."""
    if n < 0:
        raise ValueError(f"number of nights must be >= 0, got {n}")
    return NIGHTS.get_partition_keys()[:n]


class SleepNightConfig(dg.Config):
    backend: str = Field("simulated", description="'simulated' (deterministic, embedded default) or 'openai' "
                         "(any OpenAI-compatible chat-completions server)")
    sim_seed: int = Field(0, description="seed of the simulated backend")
    base_url: str = Field("", description="openai: base URL ending in /v1 ('' = $SAGE_SLEEP_BASE_URL, else "
                          "http://127.0.0.1:8000/v1)")
    model: str = Field("", description="openai: model name ('' = $SAGE_SLEEP_MODEL)")
    api_key_env: str = Field("SAGE_SLEEP_API_KEY", description="openai: environment variable holding the API key")
    timeout_s: float = Field(60.0, description="openai: seconds per call")
    max_retries: int = Field(4, description="openai: retries of a transient failure (timeout, 429, 5xx, empty reply)")
    workers: int = Field(1, description="parallel backend calls while replaying")
    edit_budget: int = Field(4, description="at most this many edits per night")
    block_max_chars: int = Field(1500, description="size cap of each learned block: past it, edits must replace "
                                 "or delete")
    gate_metric: str = Field("mixed", description="'hard', 'soft' or 'mixed' (hard_weight * hard + rest * soft)")
    hard_weight: float = Field(0.5, description="weight of hard in the mixed metric")
    no_regression: bool = Field(True, description="reject a candidate that lowers any single val task, even if "
                                "the mean rises")
    gate_granularity: str = Field("edit", description="'edit': gate each edit on its own; 'bundle': all together")
    evolve_skill: bool = Field(True, description="let the night edit the skill document's learned block")
    evolve_memory: bool = Field(True, description="let the night edit the memory's learned block")
    log_dirs: list[str] = Field(["sessions"], description="session-log folders (relative to the artifact root, or "
                                "absolute) harvested for the night's day")
    task_dirs: list[str] = Field([], description="more task-file folders (sleep/tasks and sleep/<skill>/tasks "
                                 "are always read)")
    embedded_tasks: bool = Field(True, description="also use the skill's packaged tasks")
    skill_path: str = Field("", description="the live skill document ('' = <root>/sleep/<skill>/SKILL.md)")
    memory_path: str = Field("", description="the live memory document ('' = <root>/sleep/<skill>/MEMORY.md)")
    sandbox: str = Field("auto", description="unit-test sandbox: 'auto' (local for the simulated backend's own "
                         "answers, docker otherwise), 'local' or 'docker'")

    def settings(self) -> NightSettings:
        return NightSettings(
            backend=self.backend, sim_seed=self.sim_seed,
            openai=OpenAIConfig(base_url=self.base_url, model=self.model, api_key_env=self.api_key_env,
                                timeout_s=self.timeout_s, max_retries=self.max_retries),
            cycle=CycleConfig(limits=EditLimits(edit_budget=self.edit_budget, block_max_chars=self.block_max_chars),
                              gate=GateConfig(metric=self.gate_metric, hard_weight=self.hard_weight,
                                              no_regression=self.no_regression, granularity=self.gate_granularity),
                              evolve_skill=self.evolve_skill, evolve_memory=self.evolve_memory, workers=self.workers),
            log_dirs=tuple(self.log_dirs), task_dirs=tuple(self.task_dirs), embedded_tasks=self.embedded_tasks,
            skill_path=self.skill_path, memory_path=self.memory_path, sandbox=self.sandbox)


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


def sleep_cycle_asset(skill: str) -> dg.AssetsDefinition:
    """The night asset of one skill: partition = the day whose tasks are harvested."""
    key = dg.AssetKey([GROUP, skill])

    @dg.asset(key=key, group_name=GROUP, partitions_def=NIGHTS, pool=POOL, kinds={"python", "markdown"},
              description=f"One night of the sleep cycle for the {skill!r} skill: harvest the day's tasks, replay, "
                          "reflect, edit the protected learned block, keep an edit only if it strictly improves "
                          "val, then score test. Writes sleep/" + skill + "/ (live SKILL.md and MEMORY.md, "
                          "versions/, nights/<date>/diagnostics.json and report.md).",
              check_specs=[dg.AssetCheckSpec("night_completed", asset=key,
                                             description="Fails when the night could not do its job: backend or "
                                                         "judge error, unreadable input (ERROR), or a conflict, an "
                                                         "unusable reflect reply, an unverified gate (WARN).")])
    def _night(context: dg.AssetExecutionContext, config: SleepNightConfig, sage: SageResource) -> dg.MaterializeResult:
        window = context.partition_time_window
        r, files = run_night(sage.root(), skill, context.partition_key, (window.start, window.end),
                             config.settings(), log=context.log.info)
        if r.status in ERROR_STATUSES:
            context.log.error(f"night {r.date} of {skill}: {r.status}: {r.cause}")
        return dg.MaterializeResult(metadata=night_metadata(r, files), check_results=[_health(r, key)])

    return _night


SLEEP_ASSETS = [sleep_cycle_asset(s) for s in SKILLS]

nightly_sleep_job = dg.define_asset_job(
    "nightly_sleep", selection=dg.AssetSelection.groups(GROUP), tags=RUN_TAG,
    description="The nightly sleep cycle of every skill for one day (a partition).")

nightly_sleep_schedule = dg.build_schedule_from_partitioned_job(
    nightly_sleep_job, name="nightly_sleep_schedule", hour_of_day=HOUR, minute_of_hour=MINUTE,
    description=f"Every day at {HOUR:02d}:{MINUTE:02d} {TIMEZONE}: the night of the day that just ended.",
    default_status=(dg.DefaultScheduleStatus.RUNNING if os.environ.get("SAGE_SLEEP_SCHEDULE_RUNNING", "1") == "1"
                    else dg.DefaultScheduleStatus.STOPPED))


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


sleep_defs = dg.Definitions(assets=SLEEP_ASSETS, jobs=[nightly_sleep_job, sleep_rollback_job],
                            schedules=[nightly_sleep_schedule])
