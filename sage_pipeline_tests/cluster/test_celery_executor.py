"""The graph on a real distributed executor: dagster-celery on a Redis broker, Postgres run,
event and schedule storage, and two separate Celery worker processes standing in for two
machines (each its own working directory, DAGSTER_HOME, process group and node name; both
share SAGE_DATA_DIR and Dagster's storage folder, as docs/scaling.md says for a cluster).

A slice is materialized with the Dagster CLI through ``sage_pipeline.defs.celery_definitions``:
the offline chain up to ``offline_eval`` (with ``sim_tasks``), the four ``sandbox_rollouts``
shards as four concurrent runs, and one night of the sleep cycle (SAGE's skills root on the
shipped SAGE week), with docs/scaling.md's pool limits set first. The runs' events must show
steps executed on both workers, and the artifacts must equal an in-process run's with the same
seeds, written to the same path. (The sleep cycle is one asset now, so a night is one step: the
sleep_cycle pool's limit of 1 across runs is exercised by benchmarks/fault_injection.py's pool
trial, a queued night taking the slot a killed one held; two nights at once here would commit
the root's versions in either order, so their artifacts could not be compared.)

Missing redis-server or PostgreSQL binaries FAIL (never skip): run `.ci/system_deps.sh` as root.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

import dagster as dg
import pandas as pd
import pytest

from sage_pipeline.definitions import defs as project_defs
from sage_pipeline.defs.sim_assets import SHARDS
from sage_pipeline_tests import services
from sage_pipeline_tests.ui import _support as sup

pytestmark = pytest.mark.slow

DEPLOY = sup.REPO / "deploy" / "celery"
BIN = Path(sys.executable).parent
MODULE = "sage_pipeline.defs.celery_definitions"
WORKERS = ("worker-a", "worker-b")
NIGHT = "2026-11-01"  # the first day of the synthetic session logs
OFFLINE = ["sage_week", "trajectories", "routing_dataset", "reward_report", "bc_policy", "cql_policy",
           "offline_eval", "sim_tasks"]  # on SAGE's own journals: the shipped SAGE week (make run's default)
RUN_CONFIG = {
    "ops": {"sage_week": {"config": {"live_day": "off"}},  # the shipped week alone, whatever SAGE_PYTHON says
            "bc_policy": {"config": {"epochs": 10}},
            "cql_policy": {"config": {"steps": 300, "n_boot": 50}},
            "offline_eval": {"config": {"n_boot": 200}},
            "sim_tasks": {"config": {"n_tasks": 40, "seed": 3}}},
    # the project's own generated tasks only: the same unisolated backend in both runs, Docker or not
    "resources": {"sandbox": {"config": {"backend": "local"}}},
}
SHARD_CONFIG = {"resources": RUN_CONFIG["resources"]}

# Fields that measure wall-clock time or say when something was written: the only ones
# allowed to differ between the Celery run and the in-process run.
CLOCK_KEYS = {"created_at", "started_at", "finished_at", "decided_at", "seconds", "steps_per_s",
              "at", "since"}  # at: a ledger transition's time (decisions/ledger.json); since: a skills version's
LIMIT_OUTCOMES = {"timeout", "oom", "killed"}


def worker_command(name: str) -> list[str]:
    """The worker command docs/scaling.md shows (one pool process: a worker runs one step at a
    time; the project imported before the pool forks, so a step does not pay for it)."""
    return ["celery", "-A", "dagster_celery.app", "worker", "-l", "INFO", "-n", f"{name}@%h", "-c", "1", "-I", MODULE]


# ---------------------------------------------------------------------------------------------
# the in-process reference


def materialize_in_process(data: Path, monkeypatch) -> None:
    """The same selections, configuration and seeds, in this process, with artifacts under ``data``."""
    monkeypatch.setenv("SAGE_DATA_DIR", str(data))
    assets = [*project_defs.assets, *project_defs.asset_checks]
    resources = dict(project_defs.resources)
    instance = dg.DagsterInstance.ephemeral()

    def run(selection, run_config=None, partition=None):
        r = dg.materialize(assets, selection=selection, run_config=run_config, resources=resources,
                           partition_key=partition, instance=instance)
        assert r.success

    run(OFFLINE, RUN_CONFIG)
    for shard in SHARDS.get_partition_keys():
        run(["sandbox_rollouts"], SHARD_CONFIG, shard)
    run(dg.AssetSelection.groups("sleep_cycle"), None, NIGHT)


# ---------------------------------------------------------------------------------------------
# the cluster


class Cluster:
    """Postgres + Redis + two Celery workers, all on loopback, all stopped by PID on exit."""

    def __init__(self, root: Path, logs: Path):
        self.root, self.logs = root, logs
        self.stack = ExitStack()
        self.workers: dict[str, subprocess.Popen] = {}
        self.workdirs: dict[str, Path] = {}
        self.node_names: dict[str, str] = {}

    def __enter__(self) -> Cluster:
        try:
            self.pg = self.stack.enter_context(services.postgres())
            self.redis = self.stack.enter_context(services.redis(self.root / "redis"))
            self.shared = self.root / "shared"
            self.env = {
                **os.environ,
                "DAGSTER_PG_HOST": self.pg.host, "DAGSTER_PG_PORT": str(self.pg.port),
                "DAGSTER_PG_PASSWORD": self.pg.password,
                "DAGSTER_SHARED_STORAGE": str(self.shared / "dagster_storage"),
                "SAGE_DATA_DIR": str(self.shared / "sage_data"),
                "SAGE_CELERY_BROKER": self.redis.url(0), "SAGE_CELERY_BACKEND": self.redis.url(1),
                "GX_ANALYTICS_ENABLED": "false",
            }
            for name in WORKERS:
                self.start_worker(name)
            self.home = self._home(self.root / "coordinator")
            self.wait_for_workers()
        except BaseException:
            self.stack.close()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stack.close()

    @staticmethod
    def _home(folder: Path) -> Path:
        folder.mkdir(parents=True)
        shutil.copy(DEPLOY / "dagster.yaml", folder / "dagster.yaml")
        return folder

    def start_worker(self, name: str) -> None:
        """A worker as docs/scaling.md starts one: its own folder holding dagster.yaml and
        dagster_celery_config.py (DAGSTER_HOME and PYTHONPATH), its own session and process group."""
        wd = self._home(self.root / name)
        shutil.copy(DEPLOY / "dagster_celery_config.py", wd / "dagster_celery_config.py")
        env = {**self.env, "DAGSTER_HOME": str(wd), "PYTHONPATH": str(wd)}
        log = open(self.logs / f"{name}.log", "wb")  # noqa: SIM115 - closed by the exit stack
        self.stack.callback(log.close)
        cmd = worker_command(name)
        proc = subprocess.Popen([str(BIN / cmd[0]), *cmd[1:]],
                                cwd=wd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.stack.callback(sup.stop_process_group, proc, 60.0)
        self.workers[name], self.workdirs[name] = proc, wd

    def wait_for_workers(self, timeout_s: float = 120.0) -> None:
        from celery import Celery

        app = Celery("ping", broker=self.redis.url(0), backend=self.redis.url(1))
        deadline = time.monotonic() + timeout_s
        answered: set[str] = set()
        while len(answered) < len(WORKERS):
            for name, proc in self.workers.items():
                if proc.poll() is not None:
                    raise AssertionError(f"celery worker {name} exited with {proc.returncode}:\n"
                                         f"{self.log_tail(name)}")
            if time.monotonic() > deadline:
                raise AssertionError(f"celery workers did not answer a ping within {timeout_s:.0f} s "
                                     f"(answered: {answered})\n" + "\n".join(map(self.log_tail, WORKERS)))
            answered = {node for reply in app.control.ping(timeout=1.0) for node in reply}
        app.close()
        for name in WORKERS:
            self.node_names[name] = next(n for n in answered if n.startswith(f"{name}@"))

    def log_tail(self, name: str, n: int = 4000) -> str:
        path = self.logs / f"{name}.log"
        return f"--- {path} ---\n" + (path.read_text(errors="replace")[-n:] if path.is_file() else "(no log)")

    def dagster(self, label: str, *args: str) -> str:
        """A ``dagster`` command from the coordinator's DAGSTER_HOME; fails with its output."""
        cmd = [str(BIN / "dagster"), *args]
        with open(self.logs / f"{label}.log", "wb") as log:
            proc = subprocess.Popen(cmd, cwd=sup.REPO, env={**self.env, "DAGSTER_HOME": str(self.home)},
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                rc = proc.wait(timeout=300)
            finally:
                sup.stop_process_group(proc, grace_s=10)
        out = (self.logs / f"{label}.log").read_text(errors="replace")
        assert rc == 0, (f"{' '.join(cmd)} failed ({rc}):\n{out[-6000:]}\n"
                         + "\n".join(map(self.log_tail, WORKERS)))
        return out

    def materialize(self, label: str, select: str, partition: str | None = None,
                    run_config: dict | None = None) -> float:
        """``dagster asset materialize -m sage_pipeline.defs.celery_definitions`` from the coordinator's
        DAGSTER_HOME; its output goes to the test's log folder. Returns the wall time."""
        args = ["asset", "materialize", "-m", MODULE, "--select", select]
        if partition:
            args += ["--partition", partition]
        if run_config:
            args += ["--config-json", json.dumps(run_config)]
        t0 = time.monotonic()
        self.dagster(f"run-{label}", *args)
        return time.monotonic() - t0

    def worker_of_pid(self, pid: int) -> str | None:
        """The worker whose process group holds ``pid`` (its pool process), from /proc."""
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        pgrp = int(stat[stat.rfind(")") + 2:].split()[2])
        return next((n for n, p in self.workers.items() if p.pid == pgrp), None)


# ---------------------------------------------------------------------------------------------
# artifacts, compared


def _strip_clock(obj):
    if isinstance(obj, dict):
        return {k: _strip_clock(v) for k, v in obj.items() if k not in CLOCK_KEYS}
    if isinstance(obj, list):
        return [_strip_clock(v) for v in obj]
    return obj


def _files(root: Path) -> dict[str, Path]:
    """Every file under ``root`` by relative path, following the sessions/synthetic link and the
    links of each asset's set; the folders behind them (.synthetic_versions/ and .sets/, with
    timestamped names) are compared through those links."""
    out = {}
    for folder, dirs, files in os.walk(root, followlinks=True):
        dirs[:] = [d for d in dirs if d not in (".synthetic_versions", ".sets")]
        for f in files:
            p = Path(folder) / f
            out[str(p.relative_to(root))] = p
    return out


def _rollout_rows(df: pd.DataFrame) -> pd.DataFrame:
    """Rollout rows without what the sandbox's clock decides: the runtime, and what a candidate
    stopped by a limit had printed when it was stopped (its outcome must still match)."""
    df = df.drop(columns=["runtime_s"]).copy()
    df.loc[df["outcome"].isin(LIMIT_OUTCOMES), "output_excerpt"] = "<stopped by a limit>"
    return df.reset_index(drop=True)


def _cache_entries(files: dict[str, Path]) -> list[str]:
    """The execution cache's entries, whatever segment (one per writer process) holds them."""
    rows = []
    for rel, p in files.items():
        if rel.startswith("sim/cache/segment-"):
            for line in p.read_text().splitlines():
                e = json.loads(line)
                res = {k: v for k, v in e["result"].items() if k != "runtime_s"}
                if res["outcome"] in LIMIT_OUTCOMES:
                    res["output_excerpt"] = "<stopped by a limit>"
                rows.append(json.dumps({**e, "result": res}, sort_keys=True))
    return sorted(rows)


def compare_artifacts(reference: Path, cluster: Path) -> tuple[list[str], dict[str, int]]:
    """Differences between two artifact roots: every file byte for byte, except JSON without
    CLOCK_KEYS, report.md without its 'Took N s', rollouts without their clock columns and the
    cache's segments by entry. Returns (differences, how many files were compared each way)."""
    a, b = _files(reference), _files(cluster)
    diffs = [f"only in the in-process run: {k}" for k in sorted(set(a) - set(b)) if "sim/cache/segment-" not in k]
    diffs += [f"only in the Celery run: {k}" for k in sorted(set(b) - set(a)) if "sim/cache/segment-" not in k]
    how: dict[str, int] = defaultdict(int)
    if _cache_entries(a) != _cache_entries(b):
        diffs.append("sim/cache: the execution cache's entries differ")
    how["cache entries"] = len(_cache_entries(a))
    for rel in sorted(set(a) & set(b)):
        if rel.startswith("sim/cache/segment-"):
            continue
        x, y = a[rel], b[rel]
        if x.read_bytes() == y.read_bytes():
            how["byte-identical"] += 1
            continue
        if rel.startswith("sim/rollouts/") and rel.endswith(".parquet"):
            same = _rollout_rows(pd.read_parquet(x)).equals(_rollout_rows(pd.read_parquet(y)))
            kind = "rollouts without clock columns"
        elif rel.endswith(".json"):
            same = _strip_clock(json.loads(x.read_text())) == _strip_clock(json.loads(y.read_text()))
            kind = "JSON without clock fields"
        elif rel == "checkpoints/sage_deployments.jsonl":  # names each checkpoint's copy by its path in its root
            same = ([_strip_clock(json.loads(line)) for line in x.read_text().replace(str(reference), "<root>")
                     .splitlines()] == [_strip_clock(json.loads(line)) for line in
                                        y.read_text().replace(str(cluster), "<root>").splitlines()])
            kind = "the deployments record, paths relative to the root"
        elif rel.endswith(".jsonl"):
            same = ([_strip_clock(json.loads(line)) for line in x.read_text().splitlines()]
                    == [_strip_clock(json.loads(line)) for line in y.read_text().splitlines()])
            kind = "JSON lines without clock fields"
        elif rel.endswith("report.md"):
            took = re.compile(r"Took [0-9.]+ s\.")
            same = took.sub("Took N s.", x.read_text()) == took.sub("Took N s.", y.read_text())
            kind = "report without its duration"
        else:
            same, kind = False, "bytes"
        if same:
            how[kind] += 1
        else:
            diffs.append(f"{rel}: differs ({kind})")
    return diffs, dict(how)


# ---------------------------------------------------------------------------------------------
# the test


def _step_workers(instance: dg.DagsterInstance, run_id: str, cluster: Cluster) -> dict[str, str]:
    """step key -> worker, from the run's own events: the STEP_START event's pid must be a process
    of a worker's process group (read from /proc while the workers run), and the engine event the
    Celery task itself reports before running the step must name that worker's node."""
    by_pid, by_node = {}, {}
    for e in instance.all_logs(run_id):
        ev = e.dagster_event
        if ev is None:
            continue
        if ev.event_type_value == "STEP_START":
            by_pid[e.step_key] = cluster.worker_of_pid(ev.pid)
            assert by_pid[e.step_key] is not None, (
                f"run {run_id}: step {e.step_key} started in pid {ev.pid}, which is in no worker's process group")
        elif ev.event_type_value == "ENGINE_EVENT" and "in celery worker" in (ev.message or ""):
            by_node[e.step_key] = ev.event_specific_data.metadata["Celery worker"].value
    assert by_pid, f"run {run_id}: no step started"
    assert set(by_node) == set(by_pid), f"run {run_id}: celery engine events for {set(by_node)}, steps {set(by_pid)}"
    for step, worker in by_pid.items():
        assert by_node[step] == cluster.node_names[worker], (
            f"run {run_id}: step {step} ran in {worker}'s process group but the Celery task says {by_node[step]}")
    return by_pid


def _step_spans(instance: dg.DagsterInstance, run_id: str) -> dict[str, tuple[float, float]]:
    """step key -> (STEP_START, STEP_SUCCESS) timestamps, as the workers recorded them."""
    start, end = {}, {}
    for e in instance.all_logs(run_id):
        if e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_START":
            start[e.step_key] = e.timestamp
        elif e.dagster_event is not None and e.dagster_event.event_type_value == "STEP_SUCCESS":
            end[e.step_key] = e.timestamp
    assert set(start) == set(end), f"run {run_id}: started {set(start)}, succeeded {set(end)}"
    return {k: (start[k], end[k]) for k in start}


def test_slice_runs_on_two_celery_workers_with_in_process_results(tmp_path, monkeypatch):
    t_start = time.monotonic()
    logs = sup.artifacts_dir("celery")
    for old in logs.glob("*.log"):
        old.unlink()
    # the Celery run writes to <root>/shared/sage_data; the reference is written to the same path
    # first and moved aside, so absolute paths inside the artifacts are the same in both
    root = tmp_path / "cluster"
    data = root / "shared" / "sage_data"
    t0 = time.monotonic()
    materialize_in_process(data, monkeypatch)
    reference = tmp_path / "in_process"
    data.rename(reference)
    t_reference = time.monotonic() - t0

    with Cluster(root, logs) as cluster:
        assert Path(cluster.env["SAGE_DATA_DIR"]) == data
        for k in ("DAGSTER_PG_HOST", "DAGSTER_PG_PORT", "DAGSTER_PG_PASSWORD", "DAGSTER_SHARED_STORAGE"):
            monkeypatch.setenv(k, cluster.env[k])
        # the pool limits of docs/scaling.md, set once for every machine before runs use the pools
        # (runs that meet a pool first all at once race to create its default limit in Postgres)
        cluster.dagster("pool-sandbox", "instance", "concurrency", "set", "sage_sandbox", "4")
        cluster.dagster("pool-sleep", "instance", "concurrency", "set", "sleep_cycle", "1")
        timings = {"offline": cluster.materialize("offline", ",".join(OFFLINE), run_config=RUN_CONFIG)}
        t0 = time.monotonic()
        shards = SHARDS.get_partition_keys()
        with ThreadPoolExecutor(len(shards)) as pool:
            list(pool.map(lambda s: cluster.materialize(s, "sandbox_rollouts", s, SHARD_CONFIG), shards))
        timings["rollouts (4 shard runs at once)"] = time.monotonic() - t0
        timings["night"] = cluster.materialize("night", "group:sleep_cycle", NIGHT)

        with dg.DagsterInstance.from_config(str(cluster.home)) as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
            runs = instance.get_runs()
            assert len(runs) == 6, [r.run_id for r in runs]
            assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), [(r.run_id, r.status) for r in runs]
            phases: dict[str, dict[str, str]] = defaultdict(dict)
            for r in runs:
                part = r.tags.get("dagster/partition")
                phase = "offline" if part is None else ("night" if part == NIGHT else "rollouts")
                steps = _step_workers(instance, r.run_id, cluster)
                phases[phase] |= {f"{s}[{part}]" if part else s: w for s, w in steps.items()}
                if phase == "night":
                    night_spans = _step_spans(instance, r.run_id)
        # the pool processes are alive until here: worker_of_pid read /proc above

    expected_steps = {
        "offline": {*OFFLINE, "routing_dataset_routing_dataset_contract", "routing_dataset_routing_dataset_volume"},
        "rollouts": {f"sandbox_rollouts[{s}]" for s in shards},
        "night": {"sleep_cycle__sage_skills[2026-11-01]"},  # the one night: SAGE's skills root
    }
    assert {p: set(s) for p, s in phases.items()} == expected_steps
    for phase in ("offline", "rollouts"):
        # these put two or more steps on the queue at once while both workers are idle, and a
        # worker holds only the step it runs (dagster_celery_config.py): both must take one
        used = sorted(set(phases[phase].values()))
        assert used == sorted(WORKERS), f"{phase}: steps ran on {used}: {phases[phase]}"
    assert len(night_spans) == 1, f"one night is one step of the one sleep asset: {night_spans}"

    diffs, compared = compare_artifacts(reference, data)
    assert not diffs, "the Celery run's artifacts differ from the in-process run's:\n" + "\n".join(diffs)
    assert compared["byte-identical"] >= 30 and compared["cache entries"] > 0, compared
    # the artifacts that must be byte-identical are, weights and datasets included
    for rel in ("routing/routing_v1.parquet", "checkpoints/bc/weights.npz", "checkpoints/cql/weights.npz",
                "reports/offline_eval.json", "sim/tasks.jsonl"):
        assert (reference / rel).read_bytes() == (data / rel).read_bytes(), rel
    # the night left the same live version of SAGE's skills root (a version id is its content's hash)
    live = [json.loads((d / "sleep" / "sage_skills" / "live.json").read_text())["version"] for d in (reference, data)]
    assert live[0] == live[1], live
    # step logs went to the shared Dagster storage the workers wrote to
    assert list((root / "shared" / "dagster_storage").rglob("compute_logs/*.complete"))

    by_worker = defaultdict(list)
    for phase in phases.values():
        for step, worker in phase.items():
            by_worker[worker].append(step)
    print(f"\nin-process reference {t_reference:.1f} s; Celery runs: "
          + ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
          + f"; artifacts compared: {compared}; steps per worker: {dict(by_worker)}; "
          f"total {time.monotonic() - t_start:.1f} s")


DOC = sup.REPO / "docs" / "scaling.md"
DOC_MARKER = "<!-- tested: sage_pipeline_tests/cluster/test_celery_executor.py"


def test_scaling_docs_show_the_files_and_commands_tested_here():
    """docs/scaling.md section 2 shows deploy/celery/dagster.yaml and dagster_celery_config.py as
    they are, and the worker and pool commands this test runs."""
    text = DOC.read_text()
    assert DOC_MARKER in text, f"{DOC}: the marker {DOC_MARKER!r} before the Celery deployment is gone"
    after = text[text.index(DOC_MARKER):]
    yaml_block = re.search(r"```yaml\n(.*?)```", after, re.DOTALL)
    py_block = re.search(r"```python\n# deploy/celery/dagster_celery_config.py\n(.*?)```", after, re.DOTALL)
    assert yaml_block and yaml_block.group(1) == (DEPLOY / "dagster.yaml").read_text(), \
        "docs/scaling.md's Celery dagster.yaml is not deploy/celery/dagster.yaml"
    assert py_block and py_block.group(1) == (DEPLOY / "dagster_celery_config.py").read_text(), \
        "docs/scaling.md's worker settings are not deploy/celery/dagster_celery_config.py"
    assert " ".join(worker_command("worker-a")) in after
    for pool, limit in (("sage_sandbox", 4), ("sleep_cycle", 1)):
        assert f"dagster instance concurrency set {pool} {limit}" in after
    assert f"-m {MODULE}" in after
