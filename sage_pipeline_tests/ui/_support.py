"""What the UI and storage tests share: a small real materialization, free loopback ports,
system binaries that must exist (a missing one FAILS the test, naming the fix), and
stopping a process group we started by its id."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from sage_pipeline.defs import routing_assets as ra
from sage_pipeline.defs.resources import SageResource

REPO = Path(__file__).resolve().parents[2]
SYSTEM_DEPS = ".ci/system_deps.sh"

# The offline chain's data assets, up to the report with PNG plots in markdown metadata.
SELECTION = [ra.synthetic_sessions, ra.trajectories, ra.routing_dataset, ra.reward_report]
SELECTION_NAMES = ("synthetic_sessions", "trajectories", "routing_dataset", "reward_report")
SMALL = {"ops": {"synthetic_sessions": {"config": {"episodes": 300, "seed": 3}}}}


def artifacts_dir(name: str) -> Path:
    """Where a test keeps what a person looks at afterwards (screenshots, server logs):
    ``$SAGE_TEST_ARTIFACTS/<name>``, default ``test-artifacts/<name>`` in the repo (git-ignored)."""
    root = Path(os.environ.get("SAGE_TEST_ARTIFACTS") or REPO / "test-artifacts")
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    return out


def materialize_small(instance: dg.DagsterInstance, data_dir: Path) -> dg.ExecuteInProcessResult:
    """Materialize SELECTION (300 simulated episodes, ~2 s) into ``instance``, artifacts under ``data_dir``."""
    result = dg.materialize(SELECTION, instance=instance, run_config=SMALL,
                            resources={"sage": SageResource(data_dir=str(data_dir))})
    assert result.success, f"materializing {SELECTION_NAMES} failed"
    return result


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def require_file(path: str | Path, what: str, env: str) -> Path:
    """``path`` if it is an executable file, else a failure (never a skip) saying how to get it."""
    p = Path(path)
    if not (p.is_file() and os.access(p, os.X_OK)):
        raise AssertionError(
            f"{what} not found at {p}. Install the system packages the UI tests need with "
            f"`sudo {SYSTEM_DEPS}` (Debian: chromium chromium-driver postgresql redis-server), or point "
            f"${env} at it.")
    return p


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in process group ``pgid``, read from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...; comm may contain spaces, so split after the last ')'
        fields = stat[stat.rfind(")") + 2:].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def stop_process_group(proc: subprocess.Popen, grace_s: float = 30.0,
                       log: Callable[[str], None] = print) -> None:
    """Stop a process started with ``start_new_session=True`` by its PID and process group:
    SIGTERM to the leader (``dagster dev`` then shuts its webserver, daemon and code servers
    down), wait, then SIGKILL whatever is left in the group. Never by name."""
    pgid = proc.pid
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            log(f"process {proc.pid} ignored SIGTERM for {grace_s:.0f} s: killing its group")
    # children whose parent is gone (code servers) exit on their own heartbeat timeout; do not wait for it
    for sig, wait_s in ((signal.SIGTERM, 0.5), (signal.SIGKILL, 5.0)):
        deadline = time.monotonic() + wait_s
        while group_members(pgid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = group_members(pgid)
        if not left:
            break
        log(f"sending {sig.name} to what is left of process group {pgid}: {left}")
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
    if proc.poll() is None:
        proc.wait(timeout=10)
