"""Rollouts: every candidate of every task executed in the sandbox, one row per (task,
candidate), written per shard to ``datasets/sim/rollouts/shard-XX.parquet``.

Shards are a stable hash of the task id, so a shard always holds the same tasks and
shards can run on different machines at once (each adds its own execution-cache segment).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import pandas as pd

from sage_pipeline import artifacts
from sage_pipeline.sim.cache import ExecutionCache, execute_cached
from sage_pipeline.sim.schema import OUTCOME_KINDS, ExecJob, ExecResult, TaskRecord

ROLLOUTS_DIR = "rollouts"
COLUMNS = ("task_id", "candidate_id", "candidate_kind", "equivalent", "cache_key", "outcome", "passed",
           "tests_passed", "tests_total", "runtime_s", "output_excerpt", "backend")


class RolloutsError(ValueError):
    """Rollouts are missing or do not fit the tasks they are used with."""


def shard_names(n_shards: int) -> list[str]:
    return [f"shard-{i:02d}" for i in range(n_shards)]


def shard_of(task_id: str, n_shards: int) -> str:
    h = int.from_bytes(hashlib.sha256(task_id.encode("utf-8")).digest()[:8], "big")
    return f"shard-{h % n_shards:02d}"


def jobs_for(task: TaskRecord) -> list[ExecJob]:
    return [ExecJob(c.code, task.entry_point, task.tests, task.timeout_s) for c in task.candidates]


def run_rollouts(tasks: Sequence[TaskRecord], run: Callable[[list[ExecJob]], list[ExecResult]], backend: str,
                 cache: ExecutionCache, log: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, dict]:
    """Execute every candidate of ``tasks`` (what the cache already holds is not run again)."""
    pairs = [(t, c) for t in tasks for c in t.candidates]
    jobs = [ExecJob(c.code, t.entry_point, t.tests, t.timeout_s) for t, c in pairs]
    t0 = time.perf_counter()
    results, counts = execute_cached(run, backend, cache, jobs)
    # A reference passed verification, so a timeout (or a kill) is more likely a load spike
    # than a verdict: run it once more, bypassing the cache, and keep the second answer.
    again = [i for i, ((_, c), r) in enumerate(zip(pairs, results, strict=True))
             if c.kind == "reference" and r.outcome in ("timeout", "killed")]
    if again:
        fresh = run([jobs[i] for i in again])
        for i, r in zip(again, fresh, strict=True):
            results[i] = r
            cache.put(jobs[i].key, r, backend)
        cache.flush()
        if log:
            log(f"rollouts: re-ran {len(again)} reference(s) that timed out or were killed; "
                f"{sum(r.passed for r in fresh)} passed the second time")
    counts["reference_reruns"] = len(again)
    seconds = time.perf_counter() - t0
    rows = [{
        "task_id": t.task_id, "candidate_id": c.candidate_id, "candidate_kind": c.kind,
        "equivalent": c.equivalent, "cache_key": j.key, "outcome": r.outcome, "passed": r.passed,
        "tests_passed": r.tests_passed, "tests_total": r.tests_total, "runtime_s": r.runtime_s,
        "output_excerpt": r.output_excerpt, "backend": backend,
    } for (t, c), j, r in zip(pairs, jobs, results)]
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    stats = {**counts, "executions": len(jobs), "tasks": len(tasks), "seconds": round(seconds, 3),
             "executed_per_s": round(counts["executed"] / seconds, 1) if counts["executed"] else None}
    if log:
        log(f"rollouts: {len(tasks)} tasks, {len(jobs)} candidates, {counts['executed']} executed, "
            f"{counts['hits']} from the cache, in {seconds:.1f} s")
    return df, stats


def check_references(df: pd.DataFrame) -> list[str]:
    """Reference solutions that did not pass: the task generator verified them, so this means
    the sandbox disagrees with it (limits too tight, a broken image): worth stopping for."""
    bad = df[(df["candidate_kind"] == "reference") & ~df["passed"]]
    return [f"{r.task_id}: {r.outcome} ({r.output_excerpt[:80]})" for r in bad.itertuples()]


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """Outcome counts per candidate kind (rows) and outcome (columns)."""
    tab = pd.crosstab(df["candidate_kind"], df["outcome"])
    for k in OUTCOME_KINDS:
        if k not in tab.columns:
            tab[k] = 0
    return tab[list(OUTCOME_KINDS)]


def write_rollouts(df: pd.DataFrame, folder: str | Path, shard: str) -> Path:
    path = Path(folder) / f"{shard}.parquet"
    with artifacts.atomic_path(path) as tmp:
        df.to_parquet(tmp, index=False)
    return path


def read_rollouts(folder: str | Path) -> pd.DataFrame:
    folder = Path(folder)
    files = sorted(folder.glob("shard-*.parquet"))
    if not files:
        raise RolloutsError(f"{folder}: no rollouts (materialize every partition of sandbox_rollouts first)")
    df = pd.concat([pd.read_parquet(f) for f in files], ignore_index=True)
    missing = [c for c in COLUMNS if c not in df.columns]
    if missing:
        raise RolloutsError(f"{folder}: rollouts lack columns {missing} (re-materialize sandbox_rollouts)")
    if df.empty:
        raise RolloutsError(f"{folder}: the rollouts hold no rows (re-materialize sandbox_rollouts)")
    return df
