"""A pooled run executed by `dagster asset materialize` and killed with -9 keeps its pool
slot (no daemon or code server watches it); the reaper marks it failed and frees the slot,
so the next run of the pool goes through. Fails without the reaper: the second run waits."""
from __future__ import annotations

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


def test_a_killed_cli_run_is_reaped_and_its_slot_freed(tmp_path, monkeypatch):
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\nconcurrency:\n  pools:\n"
                                           "    default_limit: 1\n")
    toy = tmp_path / "toy.py"
    toy.write_text(TOY)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        first = _materialize(tmp_path, toy, 600)
        try:
            def holding():
                runs = instance.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
                return runs and instance.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.STEP_START) and runs[0]
            run = _wait(holding, 120, "the first run's step to start")
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
