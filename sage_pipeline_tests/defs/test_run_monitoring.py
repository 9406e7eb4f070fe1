"""Run monitoring on the instance the project ships (`.dagster_home/dagster.yaml`).

The problem: a run in a pool limited to one slot (`concurrency.pools.default_limit: 1`,
the `sleep_cycle` and `sage_sandbox` pools) is killed with -9. Its step's pool slot stays
claimed, so the next run of the pool waits forever on "1/1 slots occupied".

What Dagster does here (1.13, DefaultRunLauncher): the launcher cannot health-check a run
worker (`RunLauncher.supports_check_run_worker_health` is False and DefaultRunLauncher does
not override it), but the code server that spawned the worker notices the dead process and
marks the run FAILED (`DagsterApiServer._check_for_orphaned_runs`). Nothing frees the dead
run's slot unless run monitoring is on with `free_slots_after_run_end_seconds`
(`execute_concurrency_slots_iteration`, run by the monitoring daemon).

`test_dead_run_worker_frees_its_pool_slot` runs a real `dagster-daemon` on a temporary
DAGSTER_HOME holding the shipped dagster.yaml (only the poll interval and the slot delay
shortened), kills a run worker holding the pool's only slot, and asserts that the run ends
FAILED and that the run queued behind it then runs to SUCCESS. Without the `run_monitoring`
block the second run never gets the slot and the test fails.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

REPO = Path(__file__).resolve().parents[2]
SHIPPED_YAML = REPO / ".dagster_home" / "dagster.yaml"
BIN = Path(sys.executable).parent
POOL = "sleep_cycle"  # any pool gets default_limit: 1; this one mirrors the project's
RUN_TAG = "sage_test/run_monitoring"

JOB_MODULE = textwrap.dedent(
    f'''
    """A one-op job in the pool {POOL!r}; the op runs in the run worker process itself."""
    import os
    import time
    from pathlib import Path

    import dagster as dg


    @dg.op(pool={POOL!r}, config_schema={{"sleep_seconds": float, "pid_file": str}})
    def hold_pool_slot(context):
        Path(context.op_config["pid_file"]).write_text(str(os.getpid()))
        time.sleep(context.op_config["sleep_seconds"])


    @dg.job(executor_def=dg.in_process_executor)
    def pooled_job():
        hold_pool_slot()


    defs = dg.Definitions(jobs=[pooled_job])
    '''
)


def _shipped_config() -> dict:
    return yaml.safe_load(SHIPPED_YAML.read_text())


def test_shipped_instance_enables_run_monitoring(tmp_path):
    """The shipped dagster.yaml loads through Dagster's instance schema with run monitoring on,
    no resume attempts (the DefaultRunLauncher cannot resume) and pool slots freed after a run
    ends; the monitoring daemon is then one the instance requires."""
    (tmp_path / "dagster.yaml").write_text(SHIPPED_YAML.read_text())
    with DagsterInstance.from_config(str(tmp_path)) as instance:
        assert instance.run_monitoring_enabled
        assert instance.run_monitoring_max_resume_run_attempts == 0
        assert 0 < instance.run_monitoring_poll_interval_seconds <= 30
        assert instance.run_monitoring_start_timeout_seconds > 0
        assert instance.run_monitoring_cancel_timeout_seconds > 0
        assert instance.run_monitoring_settings.get("free_slots_after_run_end_seconds", 0) > 0
        assert "MONITORING" in instance.get_required_daemon_types()
        assert instance.get_concurrency_config().pool_config.default_pool_limit == 1


def _wait(what: str, predicate, timeout: float, daemon: subprocess.Popen, log: Path, poll: float = 0.5):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if daemon.poll() is not None:
            pytest.fail(f"dagster-daemon exited ({daemon.returncode}) while waiting for {what}:\n"
                        f"{log.read_text()[-4000:]}")
        time.sleep(poll)
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; daemon log tail:\n{log.read_text()[-4000:]}")


def _launch(home: Path, workspace: Path, name: str, sleep_seconds: float, pid_file: Path) -> None:
    config = {"ops": {"hold_pool_slot": {"config": {"sleep_seconds": sleep_seconds, "pid_file": str(pid_file)}}}}
    result = subprocess.run(
        [str(BIN / "dagster"), "job", "launch", "-w", str(workspace), "-j", "pooled_job",
         "--config-json", json.dumps(config), "--tags", json.dumps({RUN_TAG: name})],
        cwd=workspace.parent, env={**os.environ, "DAGSTER_HOME": str(home)},
        capture_output=True, text=True, timeout=60, start_new_session=True,
    )
    assert result.returncode == 0, f"dagster job launch failed:\n{result.stdout}\n{result.stderr}"


def _run(instance: DagsterInstance, name: str):
    runs = instance.get_runs(filters=RunsFilter(tags={RUN_TAG: name}))
    return runs[0] if runs else None


def _status(instance: DagsterInstance, name: str):
    run = _run(instance, name)
    return run.status if run else None


@pytest.mark.slow
def test_dead_run_worker_frees_its_pool_slot(tmp_path):
    daemon_bin = BIN / "dagster-daemon"  # installed with dagster: its absence is a broken install, not a skip
    assert daemon_bin.exists(), f"dagster-daemon is not installed next to {sys.executable}: run make install"

    home = tmp_path / "home"
    home.mkdir()
    config = _shipped_config()
    assert config.get("run_monitoring", {}).get("enabled"), "the shipped dagster.yaml has run monitoring off"
    # only the timings shrink, so the test takes seconds rather than minutes
    config["run_monitoring"].update(poll_interval_seconds=2, free_slots_after_run_end_seconds=1)
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))

    code = tmp_path / "code"
    code.mkdir()
    (code / "pooled_job.py").write_text(JOB_MODULE)
    workspace = code / "workspace.yaml"
    workspace.write_text(yaml.safe_dump({"load_from": [
        {"python_file": {"relative_path": "pooled_job.py", "location_name": "run_monitoring_test"}}]}))
    first_pid, second_pid = tmp_path / "first.pid", tmp_path / "second.pid"

    # create the SQLite storage before the daemon opens it (two processes creating it race)
    instance = DagsterInstance.from_config(str(home))
    log = tmp_path / "daemon.log"
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    with open(log, "w") as log_fh:
        try:
            daemon = subprocess.Popen([str(daemon_bin), "run", "-w", str(workspace)], cwd=code, env=env,
                                      stdout=log_fh, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError:
            instance.dispose()
            raise
    pgid = daemon.pid  # start_new_session: the daemon leads its own process group

    try:
        _wait("the monitoring and run-queue daemons' heartbeats",
              lambda: {"MONITORING", "QUEUED_RUN_COORDINATOR"} <= set(instance.get_daemon_heartbeats()),
              60, daemon, log)

        # run 1 takes the pool's only slot and holds it
        _launch(home, workspace, "first", 600, first_pid)
        _wait("run 1 to start and its op to write its pid",
              lambda: first_pid.exists() and first_pid.read_text().strip()
              and _status(instance, "first") == DagsterRunStatus.STARTED, 60, daemon, log)
        claimed = instance.event_log_storage.get_concurrency_info(POOL).claimed_slots
        assert [slot.run_id for slot in claimed] == [_run(instance, "first").run_id]

        # run 2 is queued behind it and does not get the slot
        _launch(home, workspace, "second", 0.5, second_pid)
        time.sleep(8)
        assert not second_pid.exists(), "run 2 ran while run 1 held the pool's only slot"

        # kill -9 run 1's worker: the op runs in it (in-process executor), so its pid is the worker's
        worker = int(first_pid.read_text())
        assert os.getpgid(worker) == pgid, "the run worker is not in the daemon's process group"
        os.kill(worker, signal.SIGKILL)

        failed = _wait("run 1 to be marked FAILED",
                       lambda: _status(instance, "first") == DagsterRunStatus.FAILURE, 90, daemon, log)
        assert failed
        _wait("run 2 to get the freed slot and succeed",
              lambda: _status(instance, "second") == DagsterRunStatus.SUCCESS, 60, daemon, log)
        assert second_pid.exists()
        assert instance.event_log_storage.get_concurrency_info(POOL).claimed_slots == []
    finally:
        instance.dispose()
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            if daemon.poll() is not None:
                break
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                daemon.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                continue
        # the daemon's code server and any run worker share its process group
        try:
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass
