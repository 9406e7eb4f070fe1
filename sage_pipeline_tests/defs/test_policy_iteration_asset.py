"""policy_iteration materialized in-process on a tiny month: its metadata, its plot, its report file,
and its own job."""

from __future__ import annotations

import json

import dagster as dg

from sage_pipeline.definitions import defs
from sage_pipeline.defs.policy_iteration import policy_iteration
from sage_pipeline.defs.resources import SageResource

TINY = {"days": 3, "episodes_per_day": 200, "eval_tasks": 200, "cql_steps": 50, "alphas": [0.1], "floors": [0.0],
        "worlds": ["stationary", "drifting"], "gate": {"min_gain": 0.01}}


def test_a_tiny_month_materializes_with_its_figures(tmp_path):
    result = dg.materialize([policy_iteration], resources={"sage": SageResource(data_dir=str(tmp_path))},
                            run_config={"ops": {"policy_iteration": {"config": TINY}}},
                            instance=dg.DagsterInstance.ephemeral())
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("policy_iteration")[-1].metadata.items()}
    for world in ("stationary", "drifting"):
        regret = meta[f"{world}_cumulative_regret"]
        assert set(regret) == {"static_table", "bandit", "nightly"} and all(v >= -1e-9 for v in regret.values())
        assert "data:image/png;base64," in meta[f"{world}_value_by_day"]
        assert meta[f"{world}_wrong_promotions"] >= 0
        assert meta[f"{world}_rejected_online"] == meta[f"{world}_offline_gate_passed"] - meta[f"{world}_promotions"]
    report = json.loads((tmp_path / "policy_iteration" / "policy_iteration.json").read_text())
    assert [d["day"] for d in report["drifting"]["days"]] == [0, 1, 2]
    assert (tmp_path / "policy_iteration" / "drifting.png").is_file()
    loop = report["stationary"]["config"]["loop"]
    assert loop["exploration"]["rule"] == "gap" and loop["gate"] == {"rule": "paired", "min_gain": 0.01,
                                                                         "confirm_online": True}
    assert all(0.0 < d["exploration"]["leave_probability"] < 0.3 for d in report["stationary"]["days"])
    assert loop["change"] == {"enabled": True, "z": 5.0, "explore_days": 1}  # the core's defaults, as a section
    # the drifting world's models are the sage resource's default catalogue's (SAGE's own table)
    world = report["drifting"]["config"]["loop"]["world"]
    assert (world["drift"], world["quality_model"], world["price_model"]) == (
        True, "qwen2.5-coder:14b-instruct-q4_K_M", "claude-sonnet-4-5")
    drifting = report["drifting"]["days"]
    assert meta["drifting_changes_detected"] == [d["day"] for d in drifting if d.get("change_detected")]


def test_change_detection_is_set_from_the_run_config(tmp_path):
    config = {**TINY, "worlds": ["stationary"], "days": 2, "change": {"enabled": False, "explore_days": 3}}
    result = dg.materialize([policy_iteration], resources={"sage": SageResource(data_dir=str(tmp_path))},
                            run_config={"ops": {"policy_iteration": {"config": config}}},
                            instance=dg.DagsterInstance.ephemeral())
    report = json.loads((tmp_path / "policy_iteration" / "policy_iteration.json").read_text())
    assert result.success and report["stationary"]["config"]["loop"]["change"] == {"enabled": False, "z": 5.0,
                                                                                   "explore_days": 3}


def test_bad_world_is_refused(tmp_path):
    result = dg.materialize([policy_iteration], resources={"sage": SageResource(data_dir=str(tmp_path))},
                            run_config={"ops": {"policy_iteration": {"config": {**TINY, "worlds": ["windy"]}}}},
                            instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    assert "list 'stationary' and/or 'drifting'" in str(result.get_step_failure_events()[0].event_specific_data.error)


def test_its_own_job_and_group():
    job = defs.resolve_job_def("simulated_month")
    assert job.asset_layer.executable_asset_keys == {dg.AssetKey("policy_iteration")}
    assert defs.resolve_asset_graph().get(dg.AssetKey("policy_iteration")).group_name == "closed_loop"
    offline = defs.resolve_job_def("offline_routing").asset_layer.executable_asset_keys
    assert dg.AssetKey("policy_iteration") not in offline and dg.AssetKey("online_ab") in offline


def test_the_months_gate_keeps_its_own_bar():
    """offline_eval's one gate against the table promotes any gain above 0; the month, which gates
    every night between near-equal policies, keeps a bar of 0.5% in its core and its run config."""
    from sage_pipeline.defs.policy_assets import OfflineEvalConfig
    from sage_pipeline.defs.policy_iteration import PolicyIterationConfig
    from sage_pipeline.rl import offline_eval as oe, policy_iteration as pi

    assert oe.PromotionGateConfig().min_gain == OfflineEvalConfig().gate.min_gain == 0.0
    assert pi.LoopConfig().gate.min_gain == PolicyIterationConfig().gate.min_gain == pi.LOOP_MIN_GAIN == 0.005
