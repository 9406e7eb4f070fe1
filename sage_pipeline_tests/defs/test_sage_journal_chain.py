"""The whole offline chain on a journal folder in SAGE's exact shape, with SAGE's own kind of
models.yaml (Ollama tags, shell_router and shell_chat), and the checkpoint handed back."""

from __future__ import annotations

import json
from pathlib import Path

import dagster as dg
import joblib
import pytest

from sage_pipeline.definitions import ROUTING_ASSETS
from sage_pipeline.defs import bundle_assets, routing_checks
from sage_pipeline.defs.resources import SageResource

FIXTURE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_journal"
SESSIONS = FIXTURE / "memory" / "sessions"
RUN = {"ops": {"trajectories": {"config": {"log_dirs": [str(SESSIONS)]}},
               "sage_bundle": {"config": {"coder": {"min_tasks": 10}}},
               "cql_policy": {"config": {"steps": 300, "n_boot": 50}},
               "bc_policy": {"config": {"epochs": 15}},
               "offline_eval": {"config": {"n_boot": 200}}}}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("sage_real")
    test_defs = dg.Definitions(
        assets=[*ROUTING_ASSETS, bundle_assets.sage_bundle],
        asset_checks=[routing_checks.routing_dataset_contract, routing_checks.routing_dataset_volume],
        resources={"sage": SageResource(data_dir=str(root), routing_table=str(FIXTURE / "models.yaml"))},
    )
    job = test_defs.resolve_implicit_global_asset_job_def()
    selection = [dg.AssetKey(k) for k in ("trajectories", "routing_dataset", "reward_report", "bc_policy",
                                          "cql_policy", "offline_eval", "promoted_policy",
                                          "sage_router_checkpoint", "sage_bundle")]
    result = job.execute_in_process(run_config=RUN, instance=dg.DagsterInstance.ephemeral(),
                                    asset_selection=selection)
    return root, result


def _metadata(result, asset: str) -> dict:
    mats = result.asset_materializations_for_node(asset)
    assert mats, f"{asset} was not materialized"
    return {k: v.value for k, v in mats[-1].metadata.items()}


def test_sage_journals_go_through_with_nothing_quarantined(chain):
    """Every line SAGE's code wrote is read: events used or counted, its text lines and its
    model-less circuit-breaker steps skipped as SAGE's, nothing quarantined."""
    root, result = chain
    assert result.success
    traj = _metadata(result, "trajectories")
    assert traj["quarantined_lines"] == 0 and traj["lines_read"] == traj["accepted_lines"] == 3379
    assert traj["files"] == 9  # rotated <date>.1.log parts included
    ingest = traj["ingest"]
    assert ingest["text_lines"] == {"text_checkpoint": 48, "text_token_summary": 48}
    assert ingest["sessions_from_file_stem"] > 0
    for other in ("MODEL_ROUTING_DECISION", "TOKEN_USAGE", "PROMPT_QUALITY_DELTA", "CIRCUIT_BREAKER_ACTIVATED",
                  "MEMORY_CHECKPOINT"):
        assert traj["other_events"][other] > 0
    checks = {e.event_specific_data.check_name: e.event_specific_data
              for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert checks["quarantine_below_threshold"].passed and checks["routing_dataset_contract"].passed


def test_every_coder_and_debugger_decision_is_a_row_with_its_outcome_or_counted(chain):
    """The coder's model (its UCB bandit's choice, in the reviewer's step) and each debugger and
    documentation MODEL_ROUTING_DECISION are rows; what has no row is counted with its reason."""
    root, result = chain
    ds = _metadata(result, "routing_dataset")
    assert ds["dagster/row_count"] == 565 and ds["rows_per_role"]["coder"] == 303
    assert ds["decisions_by_source"] == {"reviewer_step": 303, "routing_decision": 262}
    report = json.loads((root / "routing" / "build_report.json").read_text())
    assert sum(report["not_joined"].values()) == 15 and all("timeout" in k or "timed out" in k
                                                            for k in report["not_joined"])
    assert set(report["routing_decisions_unused"]) == {k for k in report["routing_decisions_unused"]
                                                       if k.startswith(("planner:", "reviewer:"))}
    # YAML decisions get their exact probability back (1: SAGE's router is deterministic); the coder's
    # bandit leaves no probability in the journal, and that is said
    assert report["propensity_source"] == {"reconstructed": 262, "missing": 303}
    assert report["propensity_from"] == {"yaml": 262}
    assert list(report["propensity_unknown"].values()) == [303] and "UCB bandit" in next(
        iter(report["propensity_unknown"]))
    space = json.loads((root / "routing" / "action_space.json").read_text())
    assert {"shell_router", "shell_chat"} <= set(space["roles"])
    assert "qwen2.5-coder:1.5b" in space["actions"] and "qwen2.5-coder:14b-instruct-q4_K_M" in space["actions"]


def test_each_sage_run_task_has_its_outcome_and_cost(chain):
    """routing/task_outcomes.parquet: every task SAGE's workflow ran, verified read from SAGE's gate and
    circuit breaker, its calls and seconds from its TOKEN_USAGE lines, in the asset's metadata."""
    import pyarrow.parquet as pq

    root, result = chain
    ds = _metadata(result, "routing_dataset")
    tasks = pq.read_table(root / "routing" / "task_outcomes.parquet").to_pandas()
    assert ds["tasks"] == len(tasks) > 0 and ds["tasks_verdict_unknown"] == int(tasks["verified"].isna().sum())
    assert set(tasks["verified"].dropna().unique()) <= {0.0, 1.0} and (tasks["verified"] == 1).any()
    assert (tasks["verified"] == 0).sum() == tasks["ended"].str.startswith(("circuit_breaker", "terminal")).sum()
    assert (tasks["calls"] > 0).mean() > 0.9 and (tasks["gpu_seconds"] >= 0).all()
    assert "task_v1" in ds["task_outcomes"] and "verified share" in ds["task_outcomes"]


def test_the_bundle_is_bound_to_sages_table_and_pins_the_coder_only_when_the_logs_separate_it(chain, tmp_path):
    """sage_bundle: SAGE's journals through the chain end in a bundle for SAGE's table; the coder lever reads
    the reviewer steps' coder models and the tasks' outcomes; deploying it to a SAGE on another table is
    refused, naming the difference."""
    from sage_pipeline.sage import bundle as bd
    from sage_pipeline.sage.checkpoint import table_differences
    from sage_pipeline.sage.table import RoutingTable

    root, result = chain
    meta = _metadata(result, "sage_bundle")
    b = bd.read(meta["bundle_path"])
    sage_table = RoutingTable.load(FIXTURE / "models.yaml")
    assert table_differences(b.learned_for, sage_table) == [] and meta["bundle_id"] == b.id
    assert "coder model" in meta["coder_models"] and "task_v1" in meta["objective"]
    coder = b.table.routes["coder"]
    assert meta["coder_pinned_now"] == (coder.primary == coder.fallback != sage_table.routes["coder"].primary
                                        or (coder.primary == coder.fallback and sage_table.routes["coder"].primary
                                            != sage_table.routes["coder"].fallback))
    assert meta["kind"] in ("yaml", "exploring", "deterministic") and "sage_pipeline.sage.bundle deploy" in \
        meta["deploy_command"]
    other = sage_table.with_route("reviewer", primary="llama3:8b")
    with pytest.raises(bd.BundleRefused, match="reviewer"):
        bd.deploy(b, tmp_path / "deploy", target=other)
    bd.deploy(b, tmp_path / "deploy", target=sage_table)


def test_offline_eval_refuses_what_sages_logs_cannot_support_and_says_why(chain):
    """SAGE's own logs: the debugger and documentation decisions come from its deterministic YAML
    table, the coder's from its UCB bandit. No change of decision can be valued there, and the
    report half has 3 sessions: the report says so, in words a SAGE user can act on."""
    root, result = chain
    ev = _metadata(result, "offline_eval")
    assert ev["action_spaces"] == ["multi_model", "sage_binary"]
    assert ev["ground_truth"] == "none (not simulated data)"
    report = json.loads((root / "reports" / "offline_eval.json").read_text())
    # SAGE's tasks have outcomes: each episode's return is its task's objective, never summed reward_v1
    assert ev["objective"].startswith("task_v1: each episode's return is its task's objective")
    assert report["objective"]["judged_on"] == "task_v1" and report["objective"]["scored"] > 0
    binary = report["sage_binary"]
    assert {r["policy"] for r in binary["summary"]} == {"static_table", "bc_trained", "cql_trained", "bc_served",
                                                       "cql_served"}
    gate = binary["gate"]
    # the ledger's answer on one night (gate_mode 'ledger'): tonight's served candidates are proposed, pending
    # against SAGE's table with evidence 1 of the needed, to be judged on exploring episodes logged after them
    assert gate["promoted"] is None and gate["mode"] == "ledger"
    assert gate["ledger"]["deploy"]["key"] == "yaml_table" and ev["ledger_deploy"] == "SAGE's YAML table"
    assert {r["name"] for r in gate["candidates"].values()} <= {"bc_served", "cql_served"} and gate["candidates"]
    for cid, row in gate["candidates"].items():
        assert cid.startswith("router-") and row["state"] == "pending" and row["against"] == "SAGE's YAML table"
        assert f"evidence 1.00 of the {row['needed']:.0f} needed; no episode yet" in row["why"]
        assert row["why"] in ev["ledger_router"] and "(valid for one night only)" in row["per_night"]
    # tonight's one-night verdict stays beside, and says what the logs cannot support, in words a user can act on
    per_night = ev["promotion_sage_per_night"]
    assert "deterministic YAML table" in per_night and "deploy the exploring checkpoint" in per_night
    # the coder: its UCB bandit decides and no checkpoint reaches it, so every policy follows the log there
    # (ope.LoggedData.follows_log): no candidate is refused for, or credited with, a coder change
    assert "coder" not in per_night
    assert binary["sessions"]["n_sessions"] == 3 and "needs at least 20" in binary["sessions"]["intervals"]
    roles = {r["role"]: r for r in binary["support_by_role"]["roles"]}
    assert roles["debugger"]["deterministic"] and roles["documentation"]["deterministic"]
    assert roles["debugger"]["policy_sources"] == {"yaml": roles["debugger"]["decisions"]}
    assert roles["coder"]["policy_sources"] == {"ucb_bandit": roles["coder"]["decisions"]}


def test_the_ledger_keeps_each_candidate_at_its_content_address(chain):
    """offline_eval loads and saves the one ledger (decisions/ledger.json, what decisions/decision_ledger
    reads); each router candidate's key is the policy.joblib SAGE would load with the floor SAGE applies
    (router.folder_key), kept at checkpoints/candidates/<key>/, judged only on episodes logged after the latest
    one it was trained or selected on, never on those (kept as the ledger's id set beside it)."""
    import pandas as pd

    from sage_pipeline.decisions import router
    from sage_pipeline.decisions.ledger import Ledger
    from sage_pipeline.routing.action_space import ActionSpace
    from sage_pipeline.sage import checkpoint as sage_router
    from sage_pipeline.sage.table import RoutingTable

    root, _ = chain
    led = Ledger.load(root / "decisions" / "ledger.json")
    cands = led.of("router")
    assert cands and all(c.state == "pending" for c in cands)
    df = pd.read_parquet(root / "routing" / "routing_v1.parquet", columns=["episode_id", "split", "timestamp"])
    ts = pd.to_datetime(df["timestamp"], utc=True, errors="coerce", format="ISO8601")
    table = RoutingTable.load(FIXTURE / "models.yaml")
    space = ActionSpace.load(root / "routing" / "action_space.json", "sage_binary")
    for c in cands:
        folder = root / "checkpoints" / "candidates" / c.key
        assert c.payload["path"] == str(folder) and c.payload["incumbent"] == "yaml_table"
        assert sage_router.load_sage_checkpoint(folder, table, space).models
        assert router.folder_key(folder) == c.key and c.selected_on == [] and c.selected_on_ids is not None
        # trained on the train split, selected on the select part: its proposal time is their latest log time
        assert pd.Timestamp(c.payload["proposed_at"]) <= ts.max()
        assert set(df.loc[df["split"] == "train", "episode_id"].astype(str)) <= led.selected(c)
        assert not set(df.loc[ts > pd.Timestamp(c.payload["proposed_at"]), "episode_id"].astype(str)) & led.selected(c)


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


def test_offline_eval_keeps_every_candidate_it_judged(chain):
    """Promoted or not, each served candidate the gate judged is kept as the file SAGE would load."""
    from sage_pipeline.rl import offline_eval as oe
    from sage_pipeline.routing.action_space import ActionSpace
    from sage_pipeline.sage import checkpoint as sage_router
    from sage_pipeline.sage.table import RoutingTable

    root, _ = chain
    table = RoutingTable.load(FIXTURE / "models.yaml")
    space = ActionSpace.load(root / "routing" / "action_space.json", "sage_binary")
    for name in ("bc_served", "cql_served"):
        folder = root / "checkpoints" / "gate" / oe.CANDIDATES_DIR / name
        served = sage_router.load_sage_checkpoint(folder, table, space)
        assert sage_router.read_manifest(folder)["policy"] == name and served.models


def test_the_first_exploring_checkpoint_needs_no_logs(tmp_path):
    """Day one of exploration: nothing promoted and no routing dataset yet, the exploring checkpoint
    around SAGE's YAML is written from the table alone, and loads as what it says."""
    from sage_pipeline.defs import policy_assets
    from sage_pipeline.routing.action_space import ActionSpace
    from sage_pipeline.sage import explore as sage_explore
    from sage_pipeline.sage.table import RoutingTable

    table_path = FIXTURE / "models.yaml"
    result = dg.materialize([policy_assets.sage_router_checkpoint],
                            resources={"sage": SageResource(data_dir=str(tmp_path), routing_table=str(table_path))},
                            run_config={"ops": {"sage_router_checkpoint": {"config": {
                                "explore": True, "sage_models_yaml": str(table_path)}}}},
                            instance=dg.DagsterInstance.ephemeral())
    assert result.success
    meta = _metadata(result, "sage_router_checkpoint")
    assert meta["written"] is True and meta["kind"] == "exploring"
    table = RoutingTable.load(table_path)
    pol = sage_explore.load_exploring_checkpoint(tmp_path / "checkpoints" / "sage", table,
                                                 ActionSpace.build(table).binary())
    p = pol.fallback_probs("debugger", 0.1, 1)  # YAML takes the fallback there; the checkpoint explores
    assert 0.5 < float(p[0]) < 1.0


def test_the_nights_core_alone_never_reaches_the_routing_simulator(chain, tmp_path, monkeypatch):
    """offline_eval's core (rl/offline_eval_night.py) called without dagster on a copy of this chain's root:
    SAGE's journals are no simulator's data, so neither the model catalogue is read nor the routing simulator
    built (each raises here), and the night reports what the asset reported."""
    import shutil

    from sage_pipeline.decisions import router as ledger_router
    from sage_pipeline.rl import offline_eval as oe, offline_eval_night as oen, ope
    from sage_pipeline.routing import catalogue, routing_simulator
    from sage_pipeline.sage.table import RoutingTable

    def refused(*args, **kwargs):
        raise AssertionError("the routing simulator (or its catalogue) was reached for SAGE's journals")

    monkeypatch.setattr(oe, "simulator_from_manifest", refused)
    monkeypatch.setattr(routing_simulator.RoutingSimulator, "__init__", refused)
    monkeypatch.setattr(catalogue.ModelCatalogue, "load", refused)
    root, result = chain
    copy = tmp_path / "root"
    shutil.copytree(root, copy, symlinks=True)  # the links are relative: they resolve in the copy
    cfg = ope.OPEConfig.model_validate(ope.OPESettings(n_boot=RUN["ops"]["offline_eval"]["config"]["n_boot"])
                                       .model_dump(include=set(ope.OPEConfig.model_fields)))
    settings = oen.OfflineEvalSettings(ope=cfg, gate=oe.PromotionGateConfig(),
                                       router_gate=ledger_router.RouterGateConfig(), support="logged_pairs",
                                       floor_selection="fqe", gate_mode="ledger", objective="task",
                                       night=None)
    said = []
    night = oen.run_offline_eval_night(copy, RoutingTable.load(FIXTURE / "models.yaml"), copy / "no_catalogue.yaml",
                                       settings, said.append)
    ev = _metadata(result, "offline_eval")
    assert night.ground_truth == ev["ground_truth"] == "none (not simulated data)"
    assert list(night.reports) == ev["action_spaces"] and night.problems == []
    assert night.report_path == copy / "reports" / "offline_eval.json"
    assert (copy / "reports" / "offline_eval.png").is_file() and (night.gate_dir / "decision.json").is_file()
    assert night.ledger is not None and night.ledger.path == copy / "decisions" / "ledger.json"
    assert f"{night.objective['judged_on']}: {night.objective['why']}" == ev["objective"]
    # the same dataset and checkpoints: the same reports as the asset's (the ledger's rows aside: a second run)
    mine, theirs = (json.loads((r / "reports" / "offline_eval.json").read_text()) for r in (copy, root))
    assert mine["multi_model"] == theirs["multi_model"]
    assert mine["sage_binary"]["summary"] == theirs["sage_binary"]["summary"]
    assert any(m.startswith("offline_eval judges task_v1") for m in said)
    assert any(m.startswith("sage_binary: ") for m in said)
