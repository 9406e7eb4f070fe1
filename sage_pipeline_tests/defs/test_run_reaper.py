"""A pooled run executed by `dagster asset materialize` and killed with -9 keeps its pool
slot (no daemon or code server watches it); the reaper marks it failed and frees the slot,
so the next run of the pool goes through. Fails without the reaper: the second run waits."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

from sage_pipeline.defs.run_reaper import reap

REPO = Path(__file__).resolve().parents[2]
TOY = '''
import os, time
import dagster as dg

@dg.asset(pool="toy_pool")
def slow() -> None:
    time.sleep(float(os.environ.get("TOY_SLEEP", "0")))

defs = dg.Definitions(assets=[slow])
'''


def _materialize(home: Path, toy: Path, sleep: float) -> subprocess.Popen:
    env = {**os.environ, "DAGSTER_HOME": str(home), "TOY_SLEEP": str(sleep)}
    return subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-f", str(toy),
                             "--select", "slow"], env=env, cwd=home, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _wait(cond, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (v := cond()):
            return v
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _pool_home(tmp_path, monkeypatch, source: str):
    """An instance whose pools hold one slot each, with the toy code location ``source``."""
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\nconcurrency:\n  pools:\n"
                                           "    default_limit: 1\n")
    toy = tmp_path / "toy.py"
    toy.write_text(source)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    return toy


def _holding_run(instance):
    """The started run whose step has begun (and so holds the pool's slot), or None."""
    runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
    return runs and instance.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.STEP_START) and runs[0]


def test_a_killed_cli_run_is_reaped_and_its_slot_freed(tmp_path, monkeypatch):
    toy = _pool_home(tmp_path, monkeypatch, TOY)
    with dg.DagsterInstance.get() as instance:
        first = _materialize(tmp_path, toy, 600)
        try:
            run = _wait(lambda: _holding_run(instance), 120, "the first run's step to start")
            assert instance.event_log_storage.get_concurrency_info("toy_pool").claimed_slots
            assert reap(instance, log=lambda m: None) == []          # alive: left alone
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED   # what Dagster leaves
        lines: list[str] = []
        assert reap(instance, log=lines.append) == [run.run_id]
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
        assert "is gone" in lines[0] and run.run_id in lines[0]
        assert not instance.event_log_storage.get_concurrency_info("toy_pool").claimed_slots
        second = _materialize(tmp_path, toy, 0)
        try:
            assert second.wait(timeout=120) == 0
        finally:
            if second.poll() is None:
                os.killpg(second.pid, signal.SIGKILL)
        assert reap(instance, log=lambda m: None) == []


def test_a_shared_instance_is_left_alone():
    class Shared:
        run_storage = type("PostgresRunStorage", (), {})()
    lines: list[str] = []
    assert reap(Shared(), log=lines.append) == []
    assert "shared by several machines" in lines[0]


REAPING_TOY = TOY.replace("defs = dg.Definitions(assets=[slow])", '''
from sage_pipeline.defs.run_reaper import reaping

defs = dg.Definitions(assets=[slow], executor=reaping(dg.multiprocess_executor))''')


def test_the_next_cli_run_frees_a_killed_cli_runs_slot_by_itself(tmp_path, monkeypatch):
    """Issue 35: nobody runs the reaper. A CLI run holding the pool's only slot is killed with -9;
    the next plain `dagster asset materialize` (the project's executor, run_reaper.reaping) marks it
    failed, frees its slot and succeeds within 60 s, saying what it did in one line. Without
    reaping the second run waits on "blocked by limit for pool toy_pool" until killed."""
    toy = _pool_home(tmp_path, monkeypatch, REAPING_TOY)
    with dg.DagsterInstance.get() as instance:
        first = _materialize(tmp_path, toy, 600)
        try:
            run = _wait(lambda: _holding_run(instance), 120, "the first run's step to start")
            assert instance.event_log_storage.get_concurrency_info("toy_pool").claimed_slots
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.STARTED
        env = {**os.environ, "DAGSTER_HOME": str(tmp_path), "TOY_SLEEP": "0"}
        t0 = time.monotonic()
        second = subprocess.Popen([str(Path(sys.executable).parent / "dagster"), "asset", "materialize", "-f",
                                   str(toy), "--select", "slow"], env=env, cwd=tmp_path, start_new_session=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = second.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            out, _ = second.communicate()
            raise AssertionError(f"the next CLI run did not finish within 60 s:\n{out[-3000:]}") from None
        assert second.returncode == 0, out[-3000:]
        assert time.monotonic() - t0 < 60
        assert instance.get_run_by_id(run.run_id).status == dg.DagsterRunStatus.FAILURE
        assert [ln for ln in out.splitlines() if ln.startswith("run_reaper:") and run.run_id in ln], out[-3000:]
        assert not instance.event_log_storage.get_concurrency_info("toy_pool").claimed_slots


def test_every_job_of_the_project_reaps_before_its_steps_claim_slots(monkeypatch):
    """The CLI path (`dagster asset materialize -m sage_pipeline.definitions`), make run's steps and the
    jobs dagster dev launches all create the project's executor: it reaps the instance first."""
    from sage_pipeline import definitions
    from sage_pipeline.defs import run_reaper

    called = []
    monkeypatch.setattr(run_reaper, "reap", lambda instance, log=print: called.append(instance) or [])
    for job in [definitions.defs.resolve_implicit_global_asset_job_def(),
                *(definitions.defs.resolve_job_def(n) for n in ("sage_main", "offline_routing"))]:
        ex = job.executor_def
        assert ex.name == "multiprocess_forkserver" and ex.executor_creation_fn.__qualname__.startswith("reaping.")
    with dg.instance_for_test() as instance:
        ctx = type("Init", (), {"instance": instance})()
        fn = definitions.executor.executor_creation_fn
        with contextlib.suppress(Exception):  # the wrapped executor needs a real init context; reaping came first
            fn(ctx)
    assert called == [instance]
