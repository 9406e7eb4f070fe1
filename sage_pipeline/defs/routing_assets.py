"""The offline routing chain's data assets:
sage_week -> trajectories -> routing_dataset -> reward_report.

``sage_week`` puts SAGE's own journals where ``trajectories`` reads by default (``sessions/sage/``): the week SAGE's
unchanged ``sage run`` wrote in the model world, shipped with the project (``sage_pipeline.sage.week``), and, with
SAGE at hand (``SAGE_PYTHON``), one live SAGE day first. The routing simulator's synthetic journals
(``synthetic_sessions``, a shape SAGE never writes) are a demo, group ``routing_demo``: not in ``make run``, read
by ``trajectories`` only when materialized into the same artifact root.

Thin on purpose: read config, call the pure core, write artifacts, return metadata.
"""
# No `from __future__ import annotations` here: Dagster resolves Config and resource
# types from the real annotations of asset functions.


import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

import dagster as dg
from pydantic import Field

from sage_pipeline import artifacts, markdown
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.sections import section, to_core
from sage_pipeline.routing import collector, ingest, reward_report as rr, routing_dataset as rd, task_outcomes as to
from sage_pipeline.routing.reward import DatasetRewardSpec
from sage_pipeline.routing.routing_simulator import OutcomeSpec, RoutingSimulator, SimulatorConfig
from sage_pipeline.routing.schema import DATASET_COLUMNS, ROLES
from sage_pipeline.sage import week as W
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage_world.sage_week import WeekConfig

GROUP = "offline_routing"
DEMO_GROUP = "routing_demo"  # the routing simulator's synthetic journals: not in make run
SAGE_SESSIONS = ("sessions", "sage")  # where sage_week puts SAGE's journals (links), under the default log_dirs
LIVE_DIR = "sage_week_live"  # the live SAGE days, one folder each
JOURNAL_CLOCK = "journal_clock.json"  # in SAGE_SESSIONS: the clock the model world's journals were written at


class SyntheticSessionsConfig(dg.Config, collector.CollectorConfig, OutcomeSpec):
    """The synthetic collector's run config: ``sage_pipeline.routing.collector.CollectorConfig``
    (episodes, exploration, sessions) and the routing simulator's outcome model
    (``sage_pipeline.routing.routing_simulator.OutcomeSpec``: max_attempts, ...), side by side.
    The simulator logs SAGE's reward, reward_v1 (SimulatorConfig's default)."""


@dg.asset(group_name=DEMO_GROUP, kinds={"python", "jsonl"},
          description="A demo, not in make run (group routing_demo, job routing_demo): session journals in SAGE's "
                      "event vocabulary but not the shape `sage run` writes (sessions/synthetic/YYYY-MM-DD.log: "
                      "MODEL_ROUTING_DECISION, TOKEN_USAGE and TRAJECTORY_STEP events, no step) from the "
                      "routing simulator: the static YAML table with epsilon-exploration, with propensities "
                      "as an extension key; and the simulator's exact ground-truth policy values. The set "
                      "is replaced as one: each run writes a fresh folder in .synthetic_versions/ (outside "
                      "sessions/, so the ingest never reads it) and then switches the link sessions/synthetic "
                      "to it in one step. Materialized into the same artifact root, trajectories reads them beside "
                      "SAGE's (its default log_dirs is sessions/): use a root of its own.")
def synthetic_sessions(context: dg.AssetExecutionContext, config: SyntheticSessionsConfig,
                       sage: SageResource) -> dg.MaterializeResult:
    sim = RoutingSimulator(sage.catalogue, sage.table, SimulatorConfig(**to_core(config, OutcomeSpec).model_dump()))
    res = collector.collect(sim, sage.path("sessions", "synthetic"), to_core(config, collector.CollectorConfig),
                            progress=context.log.info, versions_dir=sage.path(".synthetic_versions"))
    gt = [{"policy": k, "value (all roles)": v, **{r: res.ground_truth_by_role[k].get(r) for r in ROLES}}
          for k, v in res.ground_truth.items()]
    return dg.MaterializeResult(metadata={
        "episodes": res.episodes, "sessions": res.sessions, "decisions": res.decisions,
        "events": res.events, "files": len(res.files),
        "path": dg.MetadataValue.path(str(res.manifest.parent)),
        "manifest": dg.MetadataValue.path(str(res.manifest)),
        "version": dg.MetadataValue.path(str(res.version)),
        "ground_truth": dg.MetadataValue.md(
            "Exact expected return per episode (simulator ground truth):\n\n" + markdown.table(gt)),
        "static_table_value": res.ground_truth["static_table"],
        "oracle_value": res.ground_truth["oracle"],
    })


class SageWeekConfig(dg.Config):
    """sage_week's run config: whether a live SAGE day is run first, and how many runs it has."""

    live_day: Literal["auto", "on", "off"] = Field(
        "auto", description="run one live SAGE day in the model world first and add it: 'auto' when SAGE_PYTHON is "
                            "set (make run SAGE_SRC=... exports it), 'on' always (SAGE_PYTHON must name SAGE's "
                            "Python), 'off' never (the shipped week alone)")
    live_runs: int = Field(WeekConfig.model_fields["runs_per_day"].default, ge=1,
                           description="`sage run`s of the live day")


def _link(dest: Path, target: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(os.path.relpath(target, dest.parent), dest, target_is_directory=True)


@dg.asset(group_name=GROUP, kinds={"python", "jsonl"},
          description="SAGE's own journals, where trajectories reads by default (sessions/sage/: links, switched as "
                      "one folder): the SAGE week the project ships (sage_pipeline/sage/data/sage_week.tar.xz: days "
                      "of SAGE's unchanged `sage run` in the model world, journals and workspaces as SAGE wrote "
                      "them, extracted once under sage_week/<sha256>/ and verified against its manifest), its "
                      "exploring checkpoint's windows added to checkpoints/sage_deployments.jsonl (each decision's "
                      "probability reconstructed), and, with SAGE at hand (SAGE_PYTHON, live_day), one live SAGE day "
                      "in the model world first (sage_week_live/<when>/), added the same way. Metadata: the days and "
                      "runs, SAGE's source, the world's exact truth of SAGE as shipped and of each coder model.")
def sage_week(context: dg.AssetExecutionContext, config: SageWeekConfig, sage: SageResource) -> dg.MaterializeResult:
    root = sage.root()
    try:
        week = W.embedded_week(root)
        W.record_deployments(week, root)
    except W.WeekError as exc:
        raise dg.Failure(f"sage_week: {exc}") from exc
    m = week.manifest
    links = {"week": week.journals}
    live = {}
    if config.live_day == "on" or (config.live_day == "auto" and os.environ.get("SAGE_PYTHON")):
        live = _live_day(context, config, sage, week, links)
    dest = sage.path(*SAGE_SESSIONS)
    clock = float(m["settings"]["world"]["clock_scale"]) or 1.0
    with artifacts.exclusive(root, "sage_week", context.log.info), artifacts.atomic_dir(dest) as tmp:
        for name, target in links.items():
            _link(tmp / name, Path(target))
        artifacts.write_json(tmp / JOURNAL_CLOCK, {
            "clock_scale": clock, "why": "the model world's server sleeps clock_scale wall seconds per calibrated "
            "GPU-second (WorldConfig.clock_scale): the task outcomes divide the journals' time by it"})
    others = sorted(p.name for p in sage.path("sessions").iterdir() if p.name != SAGE_SESSIONS[-1])
    if others:
        context.log.warning(f"sessions/ holds other journal folders too ({', '.join(others)}): trajectories reads "
                            "them beside SAGE's (its default log_dirs is sessions/); remove them or set log_dirs")
    truth = m["truth"]["week"]
    head = [{"bundle": k, "objective": round(v["objective"], 4), "verified": round(v["p_verified"], 4),
             "GPU-s": round(v["gpu_seconds"], 2)} for k, v in truth.items()]
    return dg.MaterializeResult(metadata={
        "days": len(week.days) + bool(live), "runs": m["runs"] + live.get("runs", 0), "shipped_days": len(week.days),
        "shipped_runs": m["runs"], "journal_lines_shipped": m["journal_lines"],
        "archive_bytes": m["archive_bytes"], "archive_sha256": m["archive_sha256"],
        "sage": dg.MetadataValue.json(m["sage"]), "world_seed": m["world"]["seed"],
        "path": dg.MetadataValue.path(str(dest)), "week": dg.MetadataValue.path(str(week.root)),
        "live_day": dg.MetadataValue.json(live or {"ran": False, "why": "SAGE_PYTHON unset (make run SAGE_SRC=... "
                                                   "runs one)" if config.live_day == "auto" else "live_day off"}),
        "other_journal_folders": dg.MetadataValue.json(others), "journal_clock_scale": clock,
        "truth": dg.MetadataValue.md(f"The model world's exact value under {m['truth']['objective']} on the shipped "
                                     f"week's {m['truth']['runs_valued']} runs (not a measurement of a user's SAGE):"
                                     "\n\n" + markdown.table(head)),
    })


def _live_day(context, config: SageWeekConfig, sage: SageResource, week: W.Week, links: dict) -> dict:
    """One live SAGE day in the model world (the week's world settings), its windows recorded, its journals linked."""
    from sage_pipeline.sage_world import sage_week as SW
    from sage_pipeline.sage_world.harness import SageInstall, SageNotFound

    try:
        install = SageInstall.find()
    except SageNotFound as exc:
        raise dg.Failure(f"sage_week: live_day {config.live_day!r}: {exc}") from exc
    settings = {**week.manifest["settings"], "days": 1, "runs_per_day": config.live_runs}
    folder = sage.path(LIVE_DIR, datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + f"-{context.run_id[:8]}")
    day = len(week.days) + 1
    context.log.info(f"sage_week: a live SAGE day ({config.live_runs} runs, SAGE {install.cli}) into {folder}")
    res = SW.run_days(install, folder, SW.WeekConfig(**settings), first_day=day, progress=context.log.info)
    try:
        W.record_windows(SW.write_deployments(res, folder / W.DEPLOYMENTS, folder), folder, sage.root())
    except W.WeekError as exc:
        raise dg.Failure(f"sage_week: {exc}") from exc
    for p in res.sessions_dirs:  # each workspace's memory/sessions (the day folder holds the harness's own logs)
        links[f"live/{p.parent.parent.name}"] = p
    summary = res.days[0]["summary"]
    artifacts.write_json(folder / "truth.json", res.truth)
    return {"ran": True, "folder": str(folder), "day": day, "runs": summary["runs"], "finished": summary["finished"],
            "failures": summary["failures"], "seconds": round(res.seconds, 1),
            "truth_objective": {k: v["objective"] for k, v in res.truth["week"].items()}}


class TrajectoriesConfig(dg.Config, ingest.IngestConfig):
    """The ingest's run config: ``sage_pipeline.routing.ingest.IngestConfig`` (log_dirs relative to
    the artifact root), and the blocking check's threshold."""

    max_quarantined_fraction: float = Field(0.01, ge=0.0, le=1.0, description="the blocking check fails above this "
                                            "share of quarantined lines (or of unreadable journal files)")


@dg.asset(group_name=GROUP, deps=[sage_week, synthetic_sessions], kinds={"python", "parquet"},
          description="Every TRAJECTORY_STEP event of every SAGE session journal under log_dirs (default sessions/: "
                      "SAGE's own, which sage_week puts at sessions/sage/; the routing_demo group's synthetic ones "
                      "only where that demo was materialized into the same root), validated, with provenance "
                      "(data_source, file, line); MODEL_ROUTING_DECISION, TOKEN_USAGE and AGENT_INSIGHT_EMITTED "
                      "events kept beside it (routing_decisions.parquet, token_usage.parquet, "
                      "agent_insights.parquet) for the dataset's joins and the tasks' calls. Damaged lines go "
                      "to routing/quarantine.jsonl with the "
                      "reason; other SAGE event types and SAGE's own plain-text lines ([ts] CHECKPOINT, "
                      "[TOKEN_SUMMARY]) are counted and skipped; a step SAGE logged with an empty model (the "
                      "circuit breaker's, before any model was used) is kept as an outcome and counted.",
          check_specs=[dg.AssetCheckSpec("quarantine_below_threshold", asset="trajectories", blocking=True,
                                         description="Fails when the quarantined share of log lines (damaged "
                                                     "lines only: never SAGE's own text lines or empty-model "
                                                     "steps), or the share of journal files and folders that "
                                                     "could not be read (or only in part), exceeds "
                                                     "max_quarantined_fraction (default 1%).")])
def trajectories(context: dg.AssetExecutionContext, config: TrajectoriesConfig,
                 sage: SageResource) -> dg.MaterializeResult:
    cfg = to_core(config, ingest.IngestConfig).under(sage.root())  # absolute entries stay absolute
    dirs = cfg.log_dirs
    with sage.writing("trajectories", [f"routing/{n}" for n in ingest.OUTPUT_FILES], context.log.info) as stage:
        res = ingest.ingest(cfg, stage.path("routing"), progress=context.log.info,
                            setting="trajectories config log_dirs")
        res = res.published(stage.public)
    s = res.stats
    if s.steps_accepted == 0:
        raise ingest.NoTrajectorySteps(
            f"no valid TRAJECTORY_STEP events in {', '.join(map(str, dirs))} ({s.lines_read} lines read, "
            f"{s.quarantined} quarantined: see {res.quarantine}). Point log_dirs at SAGE session logs.")
    frac, skipped = s.quarantined_fraction, s.skipped_fraction
    reasons = [{"reason": k, "lines": v} for k, v in s.quarantine_reasons.most_common()]
    unread = [{"path": d["file"], "from line": d["line"], "reason": d["reason"]} for d in s.damaged_files] + [
        {"path": d["path"], "from line": "-", "reason": d["reason"]} for d in s.skipped_paths]
    return dg.MaterializeResult(
        metadata={
            "dagster/row_count": s.steps_accepted, "lines_read": s.lines_read,
            "accepted_lines": s.accepted_lines, "quarantined_lines": s.quarantined,
            "quarantined_fraction": frac, "accepted + quarantined == lines read":
                s.accepted_lines + s.quarantined == s.lines_read,
            "other_events": dg.MetadataValue.json(dict(s.other_events)),
            "sage_text_lines": dg.MetadataValue.json(dict(s.text_lines)),
            "steps_without_model": dg.MetadataValue.json(dict(s.steps_without_model)),
            "ingest": dg.MetadataValue.json(s.to_dict()),
            "rows_by_source": dg.MetadataValue.json(dict(s.rows_by_source)),
            "quarantine_reasons": dg.MetadataValue.md(markdown.table(reasons)),
            "empty_files": dg.MetadataValue.json(s.empty_files), "files": len(s.files),
            "unreadable_paths": dg.MetadataValue.md(markdown.table(unread) if unread else "none"),
            "skipped_fraction": skipped,
            "lines_per_s": s.lines_read / max(s.seconds, 1e-9), "MB_per_s": s.bytes_read / 1e6 / max(s.seconds, 1e-9),
            "path": dg.MetadataValue.path(str(res.trajectories)),
            "quarantine": dg.MetadataValue.path(str(res.quarantine)),
            "side_tables": dg.MetadataValue.json({
                "routing_decisions.parquet": s.routing_decisions, "token_usage.parquet": s.token_usage,
                ingest.AGENT_INSIGHTS_NAME: s.agent_insights}),
            "agent_insights": dg.MetadataValue.path(str(res.agent_insights)),
        },
        check_results=[dg.AssetCheckResult(
            check_name="quarantine_below_threshold",
            passed=frac <= config.max_quarantined_fraction and skipped <= config.max_quarantined_fraction,
            metadata={"quarantined_fraction": frac, "skipped_fraction": skipped,
                      "threshold": config.max_quarantined_fraction,
                      "quarantine": dg.MetadataValue.path(str(res.quarantine))},
            description=f"{s.quarantined} of {s.lines_read} lines quarantined; {len(unread)} of "
                        f"{len(s.files) + len(s.skipped_paths)} journal files and folders unreadable or read in "
                        f"part; see {res.quarantine} and the unreadable_paths metadata")],
    )


class RewardSection(dg.Config, DatasetRewardSpec):
    """``sage_pipeline.routing.reward.DatasetRewardSpec``: the reward's version and cost weight."""


class ObjectiveSection(dg.Config, TaskObjective):
    """``sage_pipeline.sage.objective.TaskObjective``: the per-task objective's weights."""


class TaskOutcomeSection(dg.Config, to.TaskOutcomeConfig):
    """``sage_pipeline.routing.task_outcomes.TaskOutcomeConfig``: the objective, the journal clock, API prices."""

    objective: ObjectiveSection = section(to.TaskOutcomeConfig, "objective", ObjectiveSection)


class RoutingDatasetConfig(dg.Config, rd.DatasetConfig):
    """The routing dataset's run config: ``sage_pipeline.routing.routing_dataset.DatasetConfig``,
    its reward a nested section (``reward: {version, cost_weight}``; reward_v1's components are
    SAGE's, in the logged reward), and how each task's outcome and cost are read (``task_outcomes``)."""

    reward: RewardSection = section(rd.DatasetConfig, "reward", RewardSection)
    task_outcomes: TaskOutcomeSection = Field(default_factory=TaskOutcomeSection,
                                              description="each sage run task's outcome and cost: the objective "
                                                          "(task_v1), the journal clock, API prices")
    chunk_rows: int = Field(rd.CHUNK_ROWS, ge=1, description="decisions built at a time (whole sessions, in session "
                            "order; the result does not depend on it): bounds memory on large logs")
    journal_clock: bool = Field(True, description="where sage_week declared the clock its model-world journals were "
                                "written at (sessions/sage/journal_clock.json), the task outcomes use it instead of "
                                "task_outcomes.clock_scale; set false for a real SAGE's journals in the same root")


@dg.asset(group_name=GROUP, deps=[trajectories], kinds={"python", "parquet"},
          description="One row per routing decision, versioned (schema_version, reward_version), with "
                      "the static table's choice, the action kind and a train/eval split by session "
                      "hash. From SAGE's `sage run` journals: the coder's decision from the reviewer's step "
                      "(model, strategy key), the debugger's and other agents' from their "
                      "MODEL_ROUTING_DECISION, each joined to its outcome (verdict, debugger status, circuit "
                      "breaker), tokens and seconds, with provenance; decisions that cannot be joined are "
                      "counted by reason. Written as routing/routing_v1.parquet and routing_v1.jsonl (and "
                      "build_report.json), with routing/task_outcomes.parquet: each `sage run` task's verdict "
                      "from SAGE's gate and its calls and GPU-seconds (from TOKEN_USAGE lines, or where SAGE "
                      "wrote none, from its agents' decision insights).")
def routing_dataset(context: dg.AssetExecutionContext, config: RoutingDatasetConfig,
                    sage: SageResource) -> dg.MaterializeResult:
    clock = sage.path(*SAGE_SESSIONS, JOURNAL_CLOCK) if config.journal_clock else None  # sage_week's, if there
    run = rd.run_routing_dataset(  # the reward's other components: RewardSpec's (SAGE's)
        sage.root(), sage.table, sage.catalogue, to_core(config, rd.DatasetConfig),
        to_core(config.task_outcomes, to.TaskOutcomeConfig), price_source=str(sage.catalogue_path()),
        chunk_rows=config.chunk_rows, journal_clock=clock, progress=context.log.info)
    built = run.report
    return dg.MaterializeResult(metadata={
        "dagster/row_count": run.rows,
        "dagster/column_schema": dg.TableSchema(columns=[
            dg.TableColumn(c, run.column_types[c], description=d) for c, d in DATASET_COLUMNS.items()]),
        "episodes": run.episodes, "sessions": run.sessions,
        "rows_per_role": dg.MetadataValue.json(run.rows_per_role),
        "rows_per_split": dg.MetadataValue.json(run.rows_per_split),
        "incomplete_episodes": run.incomplete_episodes,
        "reward_version": run.reward_version, "schema_version": run.schema_version,
        "propensities_logged": run.propensities_logged,
        "propensity_source": dg.MetadataValue.json(run.propensity_source),
        "propensity_unknown": dg.MetadataValue.md(markdown.table(
            [{"reason": k, "decisions": v} for k, v in built.propensity_unknown.items()])
            if built.propensity_unknown else "none"),
        "propensity_reconstructed_from": dg.MetadataValue.json(built.propensity_from),
        "joins_and_derivations": dg.MetadataValue.json(built.to_dict()),
        "decisions_by_source": dg.MetadataValue.json(built.decisions_by_source),
        "decisions_not_joined": dg.MetadataValue.md(markdown.table(
            [{"reason": k, "count": v} for k, v in built.not_joined.items()]) if built.not_joined else "none"),
        "routing_decisions_without_row": dg.MetadataValue.md(markdown.table(
            [{"reason": k, "count": v} for k, v in built.routing_decisions_unused.items()])
            if built.routing_decisions_unused else "none"),
        "action_space": dg.MetadataValue.json(run.space.describe()),
        "journal_clock_scale": run.clock_scale,
        "tasks": run.tasks.report["tasks"], "tasks_verdict_unknown": run.tasks.report.get("tasks_unknown", 0),
        "task_outcomes": dg.MetadataValue.md(to.summary_markdown(run.tasks)),
        "path": dg.MetadataValue.path(str(run.parquet)), "jsonl": dg.MetadataValue.path(str(run.jsonl)),
        "sha256": run.sha256,
    })


@dg.asset(group_name=GROUP, deps=[routing_dataset], kinds={"python", "json"},
          description="Rewards per role, per model and per action kind (counts, mean, quantiles, "
                      "success and fallback rates, reward vs complexity), as reports/reward_report.json "
                      "with tables and plots in the metadata.")
def reward_report(context: dg.AssetExecutionContext, sage: SageResource) -> dg.MaterializeResult:
    df = rd.read_routing_dataset(sage.path("routing", rd.PARQUET_NAME))
    report = rr.compute_reward_report(df)
    pngs = {"reward_by_role": rr.plot_reward_by_role(df), "reward_vs_complexity": rr.plot_reward_vs_complexity(report)}
    members = [f"reports/{n}" for n in (rr.REPORT_NAME, *(f"{k}.png" for k in pngs))]
    with sage.writing("reward_report", members, context.log.info) as stage:
        paths = {k: stage.public(p) for k, p in rr.write_reward_report(report, pngs, stage.path("reports")).items()}
    context.log.info(f"reward report over {len(df):,} decisions written to {paths['reward_report']}")
    return dg.MaterializeResult(metadata={
        "report": dg.MetadataValue.md(rr.report_markdown(report)),
        "reward_by_role": dg.MetadataValue.md(markdown.image(pngs["reward_by_role"], "reward by role")),
        "reward_vs_complexity": dg.MetadataValue.md(
            markdown.image(pngs["reward_vs_complexity"], "mean reward vs task complexity per model")),
        "mean_reward": report["overall"]["mean"], "rows": report["overall"]["rows"],
        "path": dg.MetadataValue.path(str(paths["reward_report"])),
    })
