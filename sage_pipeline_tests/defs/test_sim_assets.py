"""sim_tasks -> sandbox_rollouts, materialized in process on the local backend (small), and
the Docker configuration errors the assets must surface instead of scoring."""

from __future__ import annotations

import json

import dagster as dg
import pytest

from sage_pipeline.defs import sim_assets
from sage_pipeline.defs.resources import SageResource, SandboxResource
from sage_pipeline.sim import rollouts as ro
from sage_pipeline.sim.schema import TASKS_FILE, TasksFileError, read_tasks

N_TASKS = 40


def _resources(tmp_path, backend="local"):
    return {"sage": SageResource(data_dir=str(tmp_path)), "sandbox": SandboxResource(backend=backend, workers=2)}


def _materialize(tmp_path, backend="local", **kw):
    return dg.materialize([sim_assets.sim_tasks, sim_assets.sandbox_rollouts], resources=_resources(tmp_path, backend),
                          raise_on_error=False, **kw)


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sim")
    res = _materialize(tmp, selection=[sim_assets.sim_tasks],
                       run_config={"ops": {"sim_tasks": {"config": {"n_tasks": N_TASKS, "seed": 3}}}})
    assert res.success
    runs = [_materialize(tmp, selection=[sim_assets.sandbox_rollouts], partition_key=p)
            for p in sim_assets.SHARDS.get_partition_keys()]
    assert all(r.success for r in runs)
    return tmp, res, runs


def test_sim_tasks_writes_verified_tasks(chain):
    tmp, res, _ = chain
    tasks = read_tasks(tmp / "sim" / TASKS_FILE)
    assert len(tasks) >= N_TASKS * 0.9
    md = res.asset_materializations_for_node("sim_tasks")[0].metadata
    assert md["n_tasks"].value == len(tasks) and md["sandbox_isolated"].value is False
    assert md["families"].value >= 15
    for t in tasks:
        assert any(c.kind == "reference" for c in t.candidates)
        assert len(t.wrong_candidates()) >= 3


def test_rollouts_cover_every_candidate_once_with_the_right_columns(chain):
    tmp, _, runs = chain
    tasks = read_tasks(tmp / "sim" / TASKS_FILE)
    df = ro.read_rollouts(tmp / "sim" / ro.ROLLOUTS_DIR)
    assert list(df.columns) == list(ro.COLUMNS)
    assert sorted(df["candidate_id"]) == sorted(c.candidate_id for t in tasks for c in t.candidates)
    assert df["candidate_id"].is_unique
    # The task generator's verification agrees with the rollouts.
    ref = df[df["candidate_kind"] == "reference"]
    assert ref["passed"].all()
    wrong_ids = {c.candidate_id for t in tasks for c in t.wrong_candidates()}
    assert not df[df["candidate_id"].isin(wrong_ids)]["passed"].any()
    # Each shard holds exactly its tasks.
    for shard in sim_assets.SHARDS.get_partition_keys():
        part = ro.read_rollouts(tmp / "sim" / ro.ROLLOUTS_DIR)
        part = part[part["task_id"].map(lambda t: ro.shard_of(t, sim_assets.N_SHARDS)) == shard]
        mine = {t.task_id for t in tasks if ro.shard_of(t.task_id, sim_assets.N_SHARDS) == shard}
        assert set(part["task_id"]) == mine
    mds = [r.asset_materializations_for_node("sandbox_rollouts")[0].metadata for r in runs]
    assert sum(m["executed_now"].value for m in mds) == df["cache_key"].nunique()
    assert "outcomes" in mds[0] and "data:image/png;base64" in mds[0]["outcomes"].value
    # A re-run executes nothing: everything comes from the execution cache.
    again = _materialize(tmp, selection=[sim_assets.sandbox_rollouts], partition_key="shard-02")
    md = again.asset_materializations_for_node("sandbox_rollouts")[0].metadata
    assert md["executed_now"].value == 0
    in_shard = int((df["task_id"].map(lambda t: ro.shard_of(t, sim_assets.N_SHARDS)) == "shard-02").sum())
    assert in_shard > 0 and md["from_cache"].value == in_shard


def test_a_tasks_file_from_another_version_is_refused(tmp_path):
    path = tmp_path / "sim" / TASKS_FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"tasks_version": 0}) + "\n")
    with pytest.raises(TasksFileError, match="tasks_version 0.*re-materialize sim_tasks"):
        read_tasks(path)
    res = _materialize(tmp_path, selection=[sim_assets.sandbox_rollouts], partition_key="shard-00")
    assert not res.success
    assert not (tmp_path / "sim" / ro.ROLLOUTS_DIR).exists()


def test_rollouts_without_tasks_say_what_to_materialize(tmp_path):
    res = _materialize(tmp_path, selection=[sim_assets.sandbox_rollouts], partition_key="shard-01")
    assert not res.success
    err = str(res.get_step_failure_events()[0].event_specific_data.error)
    assert "materialize the sim_tasks asset first" in err


def test_docker_configured_and_down_fails_with_how_to_start_it(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    res = _materialize(tmp_path, backend="docker", selection=[sim_assets.sim_tasks],
                       run_config={"ops": {"sim_tasks": {"config": {"n_tasks": N_TASKS}}}})
    assert not res.success
    err = str(res.get_step_failure_events()[0].event_specific_data.error)
    assert "does not answer" in err and "dockerd" in err
    assert not (tmp_path / "sim" / TASKS_FILE).exists()  # nothing scored, nothing written


def test_auto_falls_back_to_local_loudly(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    warnings = []

    class Log:
        def warning(self, msg):
            warnings.append(msg)

    assert SandboxResource(backend="auto").resolve_backend(Log()) == "local"
    assert warnings and "UNISOLATED" in warnings[0]
