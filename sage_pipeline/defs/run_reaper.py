"""Mark runs whose process is gone as failed and free their pool slots, on a local instance.

A run executed in-process by ``dagster asset materialize`` (what ``make run`` does) has no
code server or daemon watching it: killed with -9 it stays STARTED and keeps its
concurrency-pool slots, so the next run of the pool (``sleep_cycle``, ``sage_sandbox``)
waits forever ("1/1 slots occupied"). Dagster's run monitoring cannot health-check such a
run (the DefaultRunLauncher has no worker check). This does, for a SQLite instance, which
lives on one machine: a run whose RUN_START was logged by a process that no longer exists
(or whose PID now belongs to a process started after the run) is reported failed and its
slots are freed. A Postgres instance is shared by several machines, where a PID says
nothing, so it is left alone (run monitoring with a health-checking launcher is the answer
there).

Nobody has to run it by hand: every run of the project's jobs reaps its instance before its
steps claim pool slots (:func:`reaping`, the executor of ``sage_pipeline.definitions``), so the
next ``dagster asset materialize`` after a ``kill -9`` frees the dead run's slots itself and
says so in one line. ``make dev`` and scripts/materialize_all.sh (``make run``) also run it
first, and it can be run alone::

    .venv/bin/python -m sage_pipeline.defs.run_reaper      # DAGSTER_HOME as for the CLI
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

import dagster as dg

ACTIVE = (dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING)


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds), None when there is no such process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        with open("/proc/stat", "rb") as fh:
            btime = next(int(ln.split()[1]) for ln in fh if ln.startswith(b"btime"))
        return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")
    except (OSError, StopIteration, IndexError, ValueError):
        return 0.0  # alive, start unknown: never reaped


def _is_local(instance: dg.DagsterInstance) -> bool:
    return type(instance.run_storage).__name__.startswith("SqliteRunStorage")


def reap(instance: dg.DagsterInstance, log: Callable[[str], None] = print) -> list[str]:
    """Report every active run whose process is gone as failed and free its slots; the run ids."""
    if not _is_local(instance):
        log(f"run_reaper: {type(instance.run_storage).__name__} is shared by several machines: left alone")
        return []
    reaped = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=list(ACTIVE))):
        starts = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.RUN_START)
        pid = starts[0].dagster_event.pid if starts and starts[0].dagster_event else None
        if pid is None:
            continue  # not started by a process yet (queued or launching): run monitoring's job
        entry = starts[0]
        began = _process_start(pid)
        if began is not None and began <= entry.timestamp + 1.0:
            continue  # its process is alive
        why = (f"its process {pid} is gone" if began is None else
               f"its PID {pid} now belongs to a process started after the run")
        instance.report_run_failed(run, f"run_reaper: marked failed: {why} (killed?); pool slots freed")
        instance.event_log_storage.free_concurrency_slots_for_run(run.run_id)
        log(f"run_reaper: run {run.run_id} ({run.job_name}, started "
            f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(entry.timestamp))}): {why}; "
            "marked failed, slots freed")
        reaped.append(run.run_id)
    return reaped


def reaping(executor: dg.ExecutorDefinition) -> dg.ExecutorDefinition:
    """``executor``, reaping its instance's dead runs (:func:`reap`) when a run creates it: in the
    run's own process, before any step claims a pool slot, whatever launched the run (the CLI,
    ``dagster dev``, a schedule). A reaped run is reported on stderr and in its own event log."""

    def create(init_context):
        try:
            reap(init_context.instance, log=lambda m: print(m, file=sys.stderr, flush=True))
        except Exception as e:  # never fail a run for this: say what to run instead
            print(f"run_reaper: could not check for dead runs ({type(e).__name__}: {e}); if a step waits on "
                  "'blocked by limit for pool', run: python -m sage_pipeline.defs.run_reaper", file=sys.stderr)
        return executor.executor_creation_fn(init_context)

    return dg.ExecutorDefinition(name=executor.name, config_schema=executor.config_schema,
                                 executor_creation_fn=create, description=executor.description,
                                 requirements=executor._requirements_fn)  # noqa: SLF001 (copy_for_configured's)


def main() -> int:
    with dg.DagsterInstance.get() as instance:
        reap(instance)
    return 0


if __name__ == "__main__":
    sys.exit(main())
