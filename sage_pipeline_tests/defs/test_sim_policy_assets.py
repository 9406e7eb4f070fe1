"""In-process materialization of ppo_policy (and its check) against a temporary root holding
a synthetic tasks file and rollout shards."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline.defs.resources import SageResource
from sage_pipeline.defs.sections import to_core
from sage_pipeline.defs.sim_policy_assets import PPOPolicyConfig, ppo_policy, ppo_policy_beats_static_table
from sage_pipeline.rl.checkpoint import load_policy, read_meta
from sage_pipeline.rl.ppo import PPOConfig
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.sim.env import SimConfig
from sage_pipeline.sim.schema import write_tasks
from sage_pipeline_tests.sim.synthetic import synthetic_suite, write_rollouts

SMALL = {"ops": {"ppo_policy": {"config": {"total_timesteps": 30_000, "num_envs": 64, "eval_every": 5,
                                           "bandit_steps": 6_400}}}}


def _root(tmp: Path, n_tasks: int = 120) -> Path:
    tasks, df = synthetic_suite(n_tasks, seed=6)
    write_tasks(tmp / "sim" / "tasks.jsonl", tasks, seed=6)
    write_rollouts(df, tmp / "sim" / "rollouts", shards=2)
    return tmp


def _run(root: Path, raise_on_error: bool = True, **config):
    defs = dg.Definitions(assets=[ppo_policy], asset_checks=[ppo_policy_beats_static_table],
                          resources={"sage": SageResource(data_dir=str(root))})
    job = defs.resolve_implicit_global_asset_job_def()
    run_config = {"ops": {"ppo_policy": {"config": SMALL["ops"]["ppo_policy"]["config"] | config}}}
    return job.execute_in_process(run_config=run_config, instance=dg.DagsterInstance.ephemeral(),
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
    assert md["env"] == "sage_loop" and md["oracle_value"] > md["static_table_value"]
    assert md["heldout_regret_closure"] > 0.5
    assert 0 < md["static_table_pass_rate"] < md["oracle_pass_rate"] <= 1 and 0 < md["heldout_pass_rate"] <= 1
    assert md["env_steps"] == 29 * 1024 and md["env_steps_per_s"] > 0
    assert md["train_tasks"] + md["heldout_tasks"] <= 120
    assert "data:image/png;base64," in md["learning_curve"]
    for policy in ("static_table", "oracle", "best feedback-blind plan", "best one-step route", "best single arm",
                   "learned one-step route", "learned feedback-blind plan", "online bandit (LinUCB, greedy)",
                   "ppo (greedy, served)", "ppo (softmax)"):
        assert policy in md["heldout"]
    for c in ("closure_best_feedback_blind_plan", "closure_best_one_step_route", "closure_best_single_arm"):
        assert md[c] <= 1 + 1e-9
    # what is learned from the task's observation cannot beat the per-task optimum of its class
    assert md["closure_learned_one_step_route"] <= md["closure_best_one_step_route"] + 1e-9
    assert md["closure_learned_feedback_blind_plan"] <= md["closure_best_feedback_blind_plan"] + 1e-9
    # the calibration table names every model of SAGE's table the loop calls, with its sources
    for model in ("qwen2.5-coder:1.5b", "qwen2.5-coder:14b", "codestral:22b", "claude-sonnet-4-5"):
        assert model in md["calibration"]
    assert "qwen25coder" in md["calibration"] and "aider" in md["calibration"]
    report = json.loads((root / "reports" / "ppo_policy.json").read_text())
    assert report["summary"]["heldout_regret_closure"] == pytest.approx(md["heldout_regret_closure"])
    assert report["calibration"]["budget"]["calls"] >= 1 and report["calibration"]["sources"]["aider"]["url"]
    assert len(report["curve"]) >= 5 and (root / "reports" / "ppo_learning_curve.png").is_file()
    meta = read_meta(root / "checkpoints" / "ppo")
    assert meta.kind == "ppo" and meta.spec_kind == "code_task" and meta.feature_spec["env"] == "sage_loop"
    assert meta.metrics == report["summary"]  # the training metrics and the held-out figures (a superset of them)
    assert meta.config == PPOConfig(total_timesteps=30_000, num_envs=64, eval_every=5).model_dump()
    pol = load_policy(root / "checkpoints" / "ppo")
    assert pol.actions[-1] == "stop" and pol.actions[0] == "code:qwen2.5-coder:1.5b"
    checks = [e.event_specific_data for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"]
    assert [c.check_name for c in checks] == ["ppo_policy_beats_static_table"] and checks[0].passed


@pytest.mark.slow
def test_the_escalation_env_still_materializes(tmp_path):
    root = _root(tmp_path, n_tasks=60)
    result = _run(root, env="escalation", total_timesteps=4096, eval_every=2, escalation={"max_attempts": 3})
    md = {k: v.value for k, v in result.asset_materializations_for_node("ppo_policy")[-1].metadata.items()}
    assert md["env"] == "escalation" and "gpt-4.1-mini" not in md["heldout"]  # rows are policies, not models
    sim_config = json.loads((root / "reports" / "ppo_policy.json").read_text())["sim_config"]
    assert sim_config == SimConfig(max_attempts=3).model_dump() and sim_config["reward"]["version"] == "reward_v2"
    assert read_meta(root / "checkpoints" / "ppo").feature_spec["env"] == "escalation"
    assert load_policy(root / "checkpoints" / "ppo").actions[-1] == "stop"


def test_the_run_config_is_ppo_config_flat_and_the_escalation_env_in_a_section():
    """Each default is the core's: PPOConfig's keys flat (as before), SimConfig's under
    ``escalation``; a given setting reaches the core as given."""
    cfg = PPOPolicyConfig()
    assert to_core(cfg, PPOConfig) == PPOConfig() and to_core(cfg.escalation, SimConfig) == SimConfig()
    assert (cfg.env, cfg.calibration, cfg.routing_table) == ("sage_loop", None, None)
    assert to_core(cfg.escalation, SimConfig).reward == RewardSpec(version="reward_v2")
    given = PPOPolicyConfig(total_timesteps=4096, num_steps=8, target_kl=0.05, hidden=[32],
                            escalation={"max_attempts": 2, "latency_weight": 0.0, "reward": {"version": "reward_v1"}})
    assert to_core(given, PPOConfig) == PPOConfig(total_timesteps=4096, num_steps=8, target_kl=0.05, hidden=[32])
    assert to_core(given.escalation, SimConfig) == SimConfig(max_attempts=2, latency_weight=0.0,
                                                             reward=RewardSpec(version="reward_v1"))


def test_an_unknown_env_or_an_old_key_is_refused_before_the_run(tmp_path):
    root = _root(tmp_path, n_tasks=12)
    with pytest.raises(dg.DagsterInvalidConfigError) as ei:
        _run(root, env="gridworld")
    said = str(ei.value)
    assert "config:env" in said and "'sage_loop', 'escalation'" in said and "got gridworld" in said
    # the escalation env's flat keys of the old config moved into its section: refused, not ignored
    for old in ("max_attempts", "latency_weight", "reward_version"):
        with pytest.raises(dg.DagsterInvalidConfigError, match=f'unexpected config entry "{old}"'):
            _run(root, **{old: 2})


def test_a_value_the_core_refuses_fails_the_step_naming_the_field(tmp_path):
    root = _root(tmp_path, n_tasks=12)
    for config, field, rule in [
        ({"escalation": {"max_attempts": 11}}, "escalation.max_attempts", "less than or equal to 10"),
        ({"escalation": {"feedback_gain": {"none": 0.0}}}, "escalation.feedback_gain", "needs exactly the keys"),
        ({"num_envs": 10, "num_steps": 3}, "num_envs x num_steps (10 x 3 = 30)", "divisible by num_minibatches"),
        ({"learning_rate": 0.0}, "learning_rate", "greater than 0"),
        ({"calibration": ""}, "calibration", "at least 1 character"),  # unset is null, never ''
    ]:
        result = _run(root, raise_on_error=False, **config)
        assert not result.success
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        error = str(failure.event_specific_data.error)
        assert field in error and rule in error, (config, error)
    assert not (root / "checkpoints" / "ppo").exists()


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
