"""The whole offline chain on a journal folder in SAGE's exact shape, with SAGE's own kind of
models.yaml (Ollama tags, shell_router and shell_chat), and the checkpoint handed back."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import joblib
import pytest

from sage_pipeline.definitions import ROUTING_ASSETS
from sage_pipeline.defs import routing_checks
from sage_pipeline.defs.resources import SageResource

FIXTURE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_journal"
SESSIONS = FIXTURE / "memory" / "sessions"
RUN = {"ops": {"trajectories": {"config": {"log_dirs": [str(SESSIONS)]}},
               "cql_policy": {"config": {"steps": 300, "n_boot": 50}},
               "bc_policy": {"config": {"epochs": 15}},
               "offline_eval": {"config": {"n_boot": 200}}}}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("sage_real")
    test_defs = dg.Definitions(
        assets=ROUTING_ASSETS,
        asset_checks=[routing_checks.routing_dataset_contract, routing_checks.routing_dataset_volume],
        resources={"sage": SageResource(data_dir=str(root), routing_table=str(FIXTURE / "models.yaml"))},
    )
    job = test_defs.resolve_implicit_global_asset_job_def()
    selection = [dg.AssetKey(k) for k in ("trajectories", "routing_dataset", "reward_report", "bc_policy",
                                          "cql_policy", "offline_eval", "promoted_policy",
                                          "sage_router_checkpoint")]
    result = job.execute_in_process(run_config=RUN, instance=dg.DagsterInstance.ephemeral(),
                                    asset_selection=selection)
    return root, result


def _metadata(result, asset: str) -> dict:
    mats = result.asset_materializations_for_node(asset)
    assert mats, f"{asset} was not materialized"
    return {k: v.value for k, v in mats[-1].metadata.items()}


def test_sage_journals_go_through_with_nothing_quarantined(chain):
    root, result = chain
    assert result.success
    traj = _metadata(result, "trajectories")
    assert traj["quarantined_lines"] == 0 and traj["lines_read"] == traj["accepted_lines"]
    assert traj["files"] >= 5
    ingest = traj["ingest"]
    assert ingest["sessions_from_file_stem"] > 0 and ingest["steps_without_step"] == traj["dagster/row_count"]
    for other in ("PROMPT_QUALITY_DELTA", "ROUTING_POLICY_ERROR", "CONTEXT_CLAMPED"):
        assert traj["other_events"][other] > 0
    ds = _metadata(result, "routing_dataset")
    joins = ds["joins_and_derivations"]
    assert joins["excluded_roles"] == {} and joins["dropped_no_complexity"] == 0
    assert joins["steps_derived"] == ds["dagster/row_count"]  # SAGE logs no step: every one derived
    assert joins["routing_decisions_joined"] == ds["dagster/row_count"]  # each step has its MRD
    space = json.loads((root / "routing" / "action_space.json").read_text())
    assert {"shell_router", "shell_chat"} <= set(space["roles"])
    assert "qwen2.5-coder:1.5b" in space["actions"] and "claude-sonnet-4-5" in space["actions"]
    checks = {e.event_specific_data.check_name: e.event_specific_data
              for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert checks["quarantine_below_threshold"].passed and checks["routing_dataset_contract"].passed


def test_offline_eval_reports_both_spaces_on_real_shaped_logs(chain):
    root, result = chain
    ev = _metadata(result, "offline_eval")
    assert ev["action_spaces"] == ["multi_model", "sage_binary"]
    assert ev["ground_truth"] == "none (not simulated data)"
    report = json.loads((root / "reports" / "offline_eval.json").read_text())
    served = {r["policy"] for r in report["sage_binary"]["summary"]}
    assert served == {"static_table", "bc_trained", "cql_trained", "bc_served", "cql_served"}
    gate = report["sage_binary"]["gate"]
    assert set(gate["candidates"]) == {"bc_served", "cql_served"}  # never the networks behind them


def test_sage_router_checkpoint_says_what_it_did(chain):
    root, result = chain
    meta = _metadata(result, "sage_router_checkpoint")
    ev = _metadata(result, "offline_eval")
    path = root / "checkpoints" / "sage" / "policy.joblib"
    if ev["promoted_sage"] == "none":
        assert meta["written"] is False and not path.exists()
        return
    assert meta["written"] is True and path.is_file()
    obj = joblib.load(path)
    assert set(obj) == {"models", "feature_keys"}
    assert "SAGE_RL_CHECKPOINT=" + str(path) in meta["sage_env"]
