"""The simulator chain, part 1: sim_tasks -> sandbox_rollouts (sharded)."""
# No `from __future__ import annotations`: Dagster reads the real annotations.

from typing import Literal

import dagster as dg
import matplotlib
import pandas as pd
from pydantic import Field

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from sage_pipeline import artifacts, markdown
from sage_pipeline.defs.resources import SageResource, SandboxResource
from sage_pipeline.defs.sections import to_core
from sage_pipeline.sim import rollouts as ro, suites, tasks as task_gen
from sage_pipeline.sim.cache import CACHE_DIR, ExecutionCache
from sage_pipeline.sim.schema import OUTCOME_KINDS, TASKS_FILE, read_tasks, write_tasks

GROUP = "simulator"
N_SHARDS = 4
SHARDS = dg.StaticPartitionsDefinition(ro.shard_names(N_SHARDS))
POOL = "sage_sandbox"


class SimTasksConfig(dg.Config, task_gen.GenerationConfig):
    """The task set's run config: ``sage_pipeline.sim.tasks.GenerationConfig`` (generated tasks),
    or an external suite instead."""

    suite_path: str | None = Field(None, min_length=1, description="an external suite as the task set instead of "
                                   "generated tasks: a HumanEval-style or MBPP-style .jsonl or .jsonl.gz file (e.g. "
                                   "HumanEval.jsonl.gz, mbpp.jsonl). Runs in the Docker sandbox only; problems whose "
                                   "canonical solution fails there are excluded and listed in the metadata. The "
                                   "generation settings (n_tasks, ...) are then ignored; seed still splits the tasks")
    suite_format: Literal["auto", "humaneval", "mbpp"] = Field(
        "auto", description="auto (from the first problem's fields), humaneval or mbpp")


def _suite_tasks(context, config: SimTasksConfig, sandbox: SandboxResource):
    problems = suites.read_suite(config.suite_path, config.suite_format)
    context.log.info(f"{config.suite_path}: {len(problems)} {problems[0].suite} problems; running their canonical "
                     "solutions in the Docker sandbox (untrusted code: never the local backend)")
    with sandbox.open(context.log, untrusted=True) as sb:
        tasks, report = suites.suite_tasks(problems, lambda jobs: sb.run(jobs, log=context.log.info),
                                           seed=config.seed, log=context.log.info)
        described = sb.describe()
    for e in report.excluded:
        context.log.warning(f"excluded {e['task_id']} ({e['source']}): canonical solution {e['outcome']}: "
                            f"{e['why'][:150]}")
    if not tasks:
        raise dg.Failure(f"{config.suite_path}: no canonical solution passed in the sandbox "
                         f"({len(report.excluded)} excluded, e.g. {report.excluded[:2]}); check the file's format "
                         "and the sandbox's limits")
    return tasks, {"suite": problems[0].suite, "suite_path": dg.MetadataValue.path(config.suite_path),
                   "suite_problems": report.problems, "suite_excluded": len(report.excluded),
                   "suite_excluded_problems": dg.MetadataValue.json(report.excluded)}, described


@dg.asset(group_name=GROUP, kinds={"python", "docker"},
          description="Coding tasks from 15+ families of small Python functions: prompt, signature, reference, "
                      "tests from running the reference on seeded inputs (edge cases included), difficulty, and "
                      "candidate solutions (the reference and realistic wrong ones), verified by execution in "
                      "the sandbox: the reference passes, a mutant that passes every test is marked equivalent. "
                      "Or, with suite_path, an external HumanEval- or MBPP-style suite, judged outside the "
                      "candidate's process in the Docker sandbox only; problems whose canonical solution fails "
                      "are excluded and listed (suite_excluded_problems). datasets/sim/tasks.jsonl.")
def sim_tasks(context: dg.AssetExecutionContext, config: SimTasksConfig, sage: SageResource,
              sandbox: SandboxResource) -> dg.MaterializeResult:
    if config.suite_path is not None:
        tasks, suite_md, described = _suite_tasks(context, config, sandbox)
        path = write_tasks(sage.path("sim", TASKS_FILE), tasks, seed=config.seed)
        summary = task_gen.summarize(tasks)
        return dg.MaterializeResult(metadata={
            "path": dg.MetadataValue.path(str(path)), "sha256": artifacts.file_sha256(path), "n_tasks": len(tasks),
            "families": len(summary["families"]), "candidates": sum(len(t.candidates) for t in tasks),
            "candidates_per_kind": dg.MetadataValue.json(summary["candidates"]), **suite_md,
            "sandbox_backend": described["backend"], "sandbox_isolated": described["isolated"]})
    tasks = task_gen.generate(to_core(config, task_gen.GenerationConfig), log=context.log.info)
    context.log.info(f"generated {len(tasks)} tasks, {sum(len(t.candidates) for t in tasks)} candidates; verifying")
    with sandbox.open(context.log) as sb:  # verification is the generator's own: not cached
        tasks, report = task_gen.verify_tasks(tasks, lambda jobs: sb.run(jobs, log=context.log.info),
                                              log=context.log.info)
        described = sb.describe()
    path = write_tasks(sage.path("sim", TASKS_FILE), tasks, seed=config.seed)
    summary = task_gen.summarize(tasks)
    return dg.MaterializeResult(metadata={
        "path": dg.MetadataValue.path(str(path)), "sha256": artifacts.file_sha256(path),
        "n_tasks": len(tasks), "families": len(summary["families"]),
        "candidates": sum(len(t.candidates) for t in tasks),
        "per_family_and_difficulty": dg.MetadataValue.md(markdown.table(summary["rows"])),
        "candidates_per_kind": dg.MetadataValue.json(summary["candidates"]),
        "equivalent_mutants": dg.MetadataValue.json(summary["equivalent"]),
        "dropped": len(report.dropped), "verify_seconds": round(report.seconds, 1),
        "verification": dg.MetadataValue.json(report.to_dict()),
        "sandbox_backend": described["backend"], "sandbox_isolated": described["isolated"],
    })


def _outcome_plot(tab) -> bytes:
    fig, ax = plt.subplots(figsize=(7, 3.2))
    bottom = None
    for k in OUTCOME_KINDS:
        vals = tab[k].to_numpy()
        ax.barh(tab.index, vals, left=bottom, label=k)
        bottom = vals if bottom is None else bottom + vals
    ax.set_xlabel("candidates")
    ax.set_title("sandbox outcome per candidate kind")
    ax.legend(fontsize=7, ncols=3, loc="lower right")
    fig.tight_layout()
    return artifacts.png_bytes(fig)


@dg.asset(group_name=GROUP, deps=[sim_tasks], partitions_def=SHARDS, pool=POOL, kinds={"docker", "parquet"},
          backfill_policy=dg.BackfillPolicy.single_run(),
          description="Every candidate of every task executed in the sandbox, one row per (task, candidate): "
                      "passed, tests passed/total, runtime, outcome kind (pass, wrong_answer, exception, timeout, "
                      "oom, killed), output excerpt. Partitioned by shard (a stable hash of the task id); an "
                      "execution cache keyed by code and tests means only what is new runs. "
                      "datasets/sim/rollouts/shard-XX.parquet.")
def sandbox_rollouts(context: dg.AssetExecutionContext, sage: SageResource,
                     sandbox: SandboxResource) -> dg.MaterializeResult:
    tasks = read_tasks(sage.path("sim", TASKS_FILE))
    shards = context.partition_keys
    frames, stats = [], {}
    untrusted = any(t.family in suites.SUITE_FORMATS for t in tasks)  # an external suite's: Docker only
    with sandbox.open(context.log, untrusted=untrusted) as sb:
        cache = ExecutionCache(sage.path("sim", CACHE_DIR))
        for shard in shards:
            mine = [t for t in tasks if ro.shard_of(t.task_id, N_SHARDS) == shard]
            df, stats[shard] = ro.run_rollouts(mine, lambda jobs: sb.run(jobs, log=context.log.info), sb.backend,
                                               cache, log=context.log.info)
            bad = ro.check_references(df)
            if bad:
                raise dg.Failure(f"{len(bad)} reference solutions failed in the sandbox (e.g. {bad[:3]}): the "
                                 "sandbox disagrees with the task generator's verification; check its limits")
            ro.write_rollouts(df, sage.path("sim", ro.ROLLOUTS_DIR), shard)
            frames.append(df)
        described = sb.describe()
    df = pd.concat(frames, ignore_index=True)
    tab = ro.summary(df)
    rows = [{"candidate_kind": k, **{o: int(tab.loc[k, o]) for o in OUTCOME_KINDS}} for k in tab.index]
    return dg.MaterializeResult(metadata={
        "shards": ", ".join(shards), "tasks": int(df["task_id"].nunique()), "executions": len(df),
        "executed_now": sum(s["executed"] for s in stats.values()),
        "from_cache": sum(s["hits"] for s in stats.values()),
        "seconds": round(sum(s["seconds"] for s in stats.values()), 2),
        "outcomes": dg.MetadataValue.md(markdown.table(rows) + "\n\n" + markdown.image(_outcome_plot(tab),
                                                                                      "outcomes")),
        "path": dg.MetadataValue.path(str(sage.path("sim", ro.ROLLOUTS_DIR))),
        "sandbox": dg.MetadataValue.json(described),
        "sandbox_isolated": described["isolated"],
    })


simulator_rollout_defs = dg.Definitions(assets=[sim_tasks, sandbox_rollouts])
