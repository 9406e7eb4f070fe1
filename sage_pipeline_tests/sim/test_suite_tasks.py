"""An external suite as the simulator's task set (issue 15): sim_tasks with ``suite_path``,
then sandbox_rollouts and ppo_policy, materialized in process against the real Docker sandbox; a problem
whose canonical solution fails is reported and excluded; ``auto`` never falls back to the
unisolated local backend for a suite."""

from __future__ import annotations

import json

import dagster as dg

from sage_pipeline.defs import sim_assets, sim_policy_assets
from sage_pipeline.defs.resources import SageResource, SandboxResource
from sage_pipeline.sim import rollouts as ro
from sage_pipeline.sim.schema import TASKS_FILE, read_tasks
from sage_pipeline.sim.suites import SAMPLE_FILES


def _suite_with_a_failing_canonical(tmp_path):
    lines = SAMPLE_FILES["mbpp"].read_text().splitlines()
    bad = json.loads(lines[0])
    bad.update(task_id=999, code=bad["code"].replace("sorted(", "sorted(reverse=True, iterable="))
    path = tmp_path / "mbpp.jsonl"
    path.write_text("\n".join(lines + [json.dumps(bad)]) + "\n")
    return path, len(lines) + 1


def _run(tmp_path, selection, backend="docker", config=None, partition_key=None):
    return dg.materialize([sim_assets.sim_tasks, sim_assets.sandbox_rollouts, sim_policy_assets.ppo_policy],
                          selection=selection,
                          resources={"sage": SageResource(data_dir=str(tmp_path / "data")),
                                     "sandbox": SandboxResource(backend=backend, workers=2)},
                          run_config={"ops": config} if config else None,
                          partition_key=partition_key, raise_on_error=False)


def test_an_external_suite_as_the_task_set(docker_ready, tmp_path):
    path, n_lines = _suite_with_a_failing_canonical(tmp_path)
    res = _run(tmp_path, [sim_assets.sim_tasks], config={"sim_tasks": {"config": {"suite_path": str(path), "seed": 1}}})
    assert res.success
    md = res.asset_materializations_for_node("sim_tasks")[0].metadata
    assert md["suite"].value == "mbpp" and md["suite_problems"].value == n_lines
    assert md["suite_excluded"].value == 1 and md["sandbox_isolated"].value is True
    excluded = md["suite_excluded_problems"].value
    assert excluded[0]["task_id"] == "999" and excluded[0]["source"] == f"{path}:{n_lines}"
    tasks = read_tasks(tmp_path / "data" / "sim" / TASKS_FILE)
    assert len(tasks) == n_lines - 1 and {t.family for t in tasks} == {"mbpp"}
    for t in tasks:
        assert t.tests[0].keys() == {"check", "setup"} and len(t.wrong_candidates()) >= 1
    runs = [_run(tmp_path, [sim_assets.sandbox_rollouts], partition_key=p)
            for p in sim_assets.SHARDS.get_partition_keys()]
    assert all(r.success for r in runs)
    df = ro.read_rollouts(tmp_path / "data" / "sim" / ro.ROLLOUTS_DIR)
    assert df[df["candidate_kind"] == "reference"]["passed"].all()
    assert not df[df["candidate_kind"] == "wrong_type"]["passed"].any()
    assert set(df["backend"]) == {"docker"}
    # the rest of the chain runs on the suite's tasks as on generated ones
    ppo = _run(tmp_path, [sim_policy_assets.ppo_policy],
               config={"ppo_policy": {"config": {"total_timesteps": 2000, "num_envs": 8}}})
    assert ppo.success
    assert ppo.asset_materializations_for_node("ppo_policy")[0].metadata["train_tasks"].value >= 1


def test_auto_does_not_run_a_suite_unisolated(tmp_path, monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    res = _run(tmp_path, [sim_assets.sim_tasks], backend="auto",
               config={"sim_tasks": {"config": {"suite_path": str(SAMPLE_FILES["humaneval"])}}})
    assert not res.success
    err = res.get_step_failure_events()[0].event_specific_data.error
    assert "never runs in the unisolated local backend" in str(err.message) + str(err.cause and err.cause.message)
    assert not (tmp_path / "data" / "sim" / TASKS_FILE).exists()
