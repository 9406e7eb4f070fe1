"""In-process materialization of ppo_policy (and its check) against a temporary root holding
a synthetic tasks file and rollout shards."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.sim_policy_assets import ppo_policy, ppo_policy_beats_static_table
from sage_pipeline.rl.checkpoint import load_policy, read_meta
from sage_pipeline.sim.schema import write_tasks
from sage_pipeline_tests.sim.synthetic import synthetic_suite, write_rollouts

SMALL = {"ops": {"ppo_policy": {"config": {"total_timesteps": 30_000, "num_envs": 64, "eval_every": 5}}}}


def _root(tmp: Path, n_tasks: int = 120) -> Path:
    tasks, df = synthetic_suite(n_tasks, seed=6)
    write_tasks(tmp / "sim" / "tasks.jsonl", tasks, seed=6)
    write_rollouts(df, tmp / "sim" / "rollouts", shards=2)
    return tmp


def _run(root: Path, raise_on_error: bool = True):
    defs = dg.Definitions(assets=[ppo_policy], asset_checks=[ppo_policy_beats_static_table],
                          resources={"sage": SageResource(data_dir=str(root))})
    job = defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(run_config=SMALL, instance=dg.DagsterInstance.ephemeral(),
                                  raise_on_error=raise_on_error)


@pytest.fixture(scope="module")
def materialized(tmp_path_factory):
    root = _root(tmp_path_factory.mktemp("sage"))
    return root, _run(root)


@pytest.mark.slow
def test_ppo_policy_materializes_with_heldout_ground_truth(materialized):
    root, result = materialized
    assert result.success
    md = {k: v.value for k, v in result.asset_materializations_for_node("ppo_policy")[-1].metadata.items()}
    assert md["oracle_value"] > md["static_table_value"]
    assert md["heldout_regret_closure"] > 0.5
    assert 0 < md["heldout_pass_rate"] <= 1 and md["heldout_mean_cost_usd"] > 0
    assert md["env_steps"] == 29 * 1024 and md["env_steps_per_s"] > 0
    assert md["train_tasks"] + md["heldout_tasks"] <= 120
    assert "data:image/png;base64," in md["learning_curve"]
    for policy in ("static_table", "oracle", "ppo (greedy, served)", "ppo (softmax)"):
        assert policy in md["heldout"]
    report = json.loads((root / "reports" / "ppo_policy.json").read_text())
    assert report["summary"]["heldout_regret_closure"] == pytest.approx(md["heldout_regret_closure"])
    assert len(report["curve"]) >= 5 and (root / "reports" / "ppo_learning_curve.png").is_file()
    meta = read_meta(root / "checkpoints" / "ppo")
    assert meta.kind == "ppo" and meta.spec_kind == "code_task" and meta.metrics["heldout_tasks"] > 0
    pol = load_policy(root / "checkpoints" / "ppo")
    assert pol.actions[-1] == "stop"
    checks = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert [c.check_name for c in checks] == ["ppo_policy_beats_static_table"] and checks[0].passed


def test_a_tasks_file_from_another_version_fails_with_a_clear_error(tmp_path):
    root = _root(tmp_path, n_tasks=12)
    path = root / "sim" / "tasks.jsonl"
    lines = path.read_text().splitlines()
    path.write_text("\n".join(['{"tasks_version": 0, "seed": 6, "n_tasks": 12}', *lines[1:]]) + "\n")
    result = _run(root, raise_on_error=False)
    assert not result.success
    msg = result.failure_data_for_node("ppo_policy").error.cause.message
    assert "tasks.jsonl:1: tasks_version 0" in msg and "re-materialize sim_tasks" in msg
    assert not (root / "checkpoints" / "ppo").exists()


def test_an_empty_rollout_cache_fails_with_a_clear_error(tmp_path):
    root = _root(tmp_path, n_tasks=12)
    for f in (root / "sim" / "rollouts").iterdir():
        f.unlink()
    result = _run(root, raise_on_error=False)
    assert not result.success
    msg = result.failure_data_for_node("ppo_policy").error.cause.message
    assert "no rollouts" in msg and "sandbox_rollouts" in msg
