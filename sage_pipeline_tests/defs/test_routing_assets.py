"""In-process materialization of the offline routing chain, against a temporary root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline.definitions import ROUTING_ASSETS, defs
from sage_pipeline.defs import routing_assets, routing_checks
from sage_pipeline.defs.resources import SageResource

# 600 episodes leave about 40 in the report half: the default paired gate's interval is wider than
# any gain there, so this chain uses the older 'value' rule, which promotes on it, and the
# assets downstream of a promotion run. test_offline_eval tests both rules. SAGE's binary space is
# decided by the ledger (gate_mode 'ledger', the default): one night proposes, never promotes;
# test_per_night_mode_publishes_tonights_promotion_as_before runs the per-night mode on the same data.
SMALL = {"ops": {"synthetic_sessions": {"config": {"episodes": 600, "seed": 3}},
                 "cql_policy": {"config": {"steps": 300, "n_boot": 50}},
                 "bc_policy": {"config": {"epochs": 10}},
                 "offline_eval": {"config": {"n_boot": 200, "gate": {"rule": "value"}, "min_sessions": 10}}}}


def _run(root: Path, run_config: dict | None = None, raise_on_error: bool = True):
    # the routing simulator's journals alone (the routing_demo group): sage_week would put the shipped SAGE
    # week beside them, and these tests read the simulator's exact truth (test_sage_week.py runs the week)
    test_defs = dg.Definitions(
        assets=[a for a in ROUTING_ASSETS if a is not routing_assets.sage_week],
        asset_checks=[routing_checks.routing_dataset_contract, routing_checks.routing_dataset_volume],
        resources={"sage": SageResource(data_dir=str(root))},
    )
    job = test_defs.resolve_implicit_global_asset_job_def()
    return job.execute_in_process(run_config=run_config or SMALL, instance=dg.DagsterInstance.ephemeral(),
                                  raise_on_error=raise_on_error)


def _metadata(result, asset: str) -> dict:
    mats = result.asset_materializations_for_node(asset)
    assert mats, f"{asset} was not materialized"
    return {k: v.value for k, v in mats[-1].metadata.items()}


def _checks(result) -> dict[str, dg.AssetCheckEvaluation]:
    return {e.event_specific_data.check_name: e.event_specific_data
            for e in result.all_events if e.event_type_value == "ASSET_CHECK_EVALUATION"}


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    root = tmp_path_factory.mktemp("sage")
    return root, _run(root)


def test_chain_materializes_with_readable_metadata(chain):
    root, result = chain
    assert result.success
    traj = _metadata(result, "trajectories")
    assert traj["accepted_lines"] + traj["quarantined_lines"] == traj["lines_read"]
    assert traj["accepted + quarantined == lines read"] is True
    assert traj["quarantined_lines"] == 0
    assert set(traj["other_events"]) == {"SESSION_START", "MODEL_ROUTING_DECISION", "TOKEN_USAGE", "SESSION_END"}
    ds = _metadata(result, "routing_dataset")
    assert ds["dagster/row_count"] == traj["dagster/row_count"]
    assert ds["reward_version"] == "reward_v1"
    assert set(ds["rows_per_split"]) == {"train", "eval"}
    syn = _metadata(result, "synthetic_sessions")
    assert syn["oracle_value"] >= syn["static_table_value"]
    assert (root / "routing" / "routing_v1.parquet").is_file()
    assert (root / "routing" / "routing_v1.jsonl").is_file()
    report = json.loads((root / "reports" / "reward_report.json").read_text())
    assert report["overall"]["rows"] == ds["dagster/row_count"]
    rr = _metadata(result, "reward_report")
    assert "data:image/png;base64," in rr["reward_by_role"]


def test_checks_ran_and_contract_passed(chain):
    _, result = chain
    checks = _checks(result)
    assert checks["quarantine_below_threshold"].passed
    assert checks["routing_dataset_contract"].passed
    # 600 episodes give fewer than 500 rows per role: the volume check warns, nothing blocks
    vol = checks["routing_dataset_volume"]
    assert not vol.passed and vol.severity == dg.AssetCheckSeverity.WARN


def test_quarantine_above_threshold_blocks_downstream(tmp_path):
    real = tmp_path / "sessions" / "real"
    real.mkdir(parents=True)
    (real / "broken.jsonl").write_text("\n".join(['{"type": "TRAJECTORY_STEP", "agent": "coder"'] * 200) + "\n")
    result = _run(tmp_path, raise_on_error=False)
    checks = _checks(result)
    assert not checks["quarantine_below_threshold"].passed
    assert not result.asset_materializations_for_node("routing_dataset")
    quarantined = [json.loads(line) for line in (tmp_path / "routing" / "quarantine.jsonl").read_text().splitlines()]
    assert len(quarantined) == 200
    assert quarantined[0]["file"].endswith("broken.jsonl") and quarantined[0]["line"] == 1
    assert "invalid JSON" in quarantined[0]["reason"]


def test_missing_log_folder_names_path_and_setting(tmp_path):
    cfg = {"ops": {**SMALL["ops"], "trajectories": {"config": {"log_dirs": ["no_such_folder"]}}}}
    result = _run(tmp_path, cfg, raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    msg = str(failure.event_specific_data.error)
    assert "no_such_folder" in msg and "log_dirs" in msg


def test_reward_version_is_a_config_choice(tmp_path):
    cfg = {"ops": {**SMALL["ops"], "routing_dataset": {"config": {"reward": {"version": "reward_v2"}}}}}
    result = _run(tmp_path, cfg)
    assert _metadata(result, "routing_dataset")["reward_version"] == "reward_v2"
    import pandas as pd
    df = pd.read_parquet(tmp_path / "routing" / "routing_v1.parquet")
    assert (df["reward_version"] == "reward_v2").all()
    assert (df["reward"] <= df["logged_reward"]).all()
    from sage_pipeline.routing.routing_dataset import read_reward_spec
    spec = read_reward_spec(tmp_path / "routing" / "routing_v1.parquet")
    assert spec.version == "reward_v2" and spec.cost_weight == 5.0


def test_definitions_load_and_lineage_reads_left_to_right():
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert {"synthetic_sessions", "trajectories", "routing_dataset", "reward_report"} <= keys
    assert graph.get(dg.AssetKey("reward_report")).parent_keys == {dg.AssetKey("routing_dataset")}
    for key in graph.get_all_asset_keys():
        assert graph.get(key).description, f"{key} has no description"


def test_router_import_path_pays_for_no_dagster_or_gx():
    code = ("import sys, sage_pipeline.rl, sage_pipeline.routing.routing_simulator; "
            "bad = [m for m in ('dagster', 'great_expectations', 'docker') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_policies_and_offline_eval_with_gate(chain):
    root, result = chain
    for name in ("bc", "cql"):
        assert (root / "checkpoints" / name / "policy.json").is_file()
    meta = _metadata(result, "offline_eval")
    assert meta["ground_truth"] == "simulator"
    full = json.loads((root / "reports" / "offline_eval.json").read_text())
    assert meta["action_spaces"] == ["multi_model", "sage_binary"]
    report = full["multi_model"]
    assert {r["policy"] for r in report["summary"]} == {"static_table", "bc", "cql", "oracle"}
    gate = report["gate"]
    # the metadata says which policy was promoted or why none was, and the folder agrees
    assert meta["promotion"] == gate["reason"]
    promoted = root / "checkpoints" / "promoted"
    if gate["promoted"]:
        assert json.loads((promoted / "promotion.json").read_text())["policy"] == gate["promoted"]
        cand = gate["candidates"][gate["promoted"]]
        assert cand["ci_low"] > gate["static_estimate"]
    else:
        assert gate["reason"].startswith("no policy promoted") and not promoted.exists()
    # offline_eval staged its decision (checked, blocking) and promoted_policy published it
    checks = {e.event_specific_data.check_name: e.event_specific_data for e in result.all_events
              if e.event_type_value == "ASSET_CHECK_EVALUATION"}
    assert checks["gate_decision_is_consistent"].passed
    decision = json.loads((root / "checkpoints" / "gate" / "decision.json").read_text())
    assert decision["spaces"]["multi_model"]["promoted"] == gate["promoted"]
    assert decision["decided_at"] == meta["decided_at"]
    published = _metadata(result, "promoted_policy")
    assert published["decided_at"] == meta["decided_at"]
    assert published["multi_model"].startswith(gate["promoted"] or "none")
    cql_meta = _metadata(result, "cql_policy")
    assert "on the eval split" in cql_meta["selected_by"]
    # 600 episodes leave a few dozen per eval half: both assets say the numbers are not to be trusted
    assert 0 < cql_meta["select_episodes"] < 1000
    assert f"select half has {cql_meta['select_episodes']} episodes" in cql_meta["sample_size_warning"]
    assert "report half has" in meta["sample_size_warning"]
    assert report["sample_size_warning"] == meta["sample_size_warning"]


def test_sage_binary_space_judges_what_sage_serves(chain):
    """In SAGE's binary space the gate sees only the served composites (distilled classifiers
    behind the confidence floor, YAML below it), valued against the best binary policy."""
    root, result = chain
    for name in ("bc_sage_binary", "cql_sage_binary"):
        meta = json.loads((root / "checkpoints" / name / "policy.json").read_text())
        mask = meta["role_mask"]
        assert all(sum(row) <= 2 for row in mask)  # primary and fallback only
    full = json.loads((root / "reports" / "offline_eval.json").read_text())
    rep = full["sage_binary"]
    rows = {r["policy"]: r for r in rep["summary"]}
    assert set(rows) == {"static_table", "bc_trained", "cql_trained", "bc_served", "cql_served", "oracle"}
    gt = rep["ground_truth"]["episode_value"]
    # the binary oracle: no better than the multi-model one, no worse than the table
    assert gt["static_table"] <= gt["oracle"] <= full["multi_model"]["ground_truth"]["episode_value"]["oracle"] + 1e-12
    meta = _metadata(result, "offline_eval")
    assert "floor chosen by" in meta["served_floor_selection"]
    # one night of logs: the ledger proposes tonight's served candidates, pending against SAGE's table with
    # evidence 1 of the needed (judged from the next night on, on episodes logged after them); nothing deployed
    gate = rep["gate"]
    assert gate["mode"] == "ledger" and gate["promoted"] is None and meta["promoted_sage"] == "none"
    assert {r["name"] for r in gate["candidates"].values()} <= {"bc_served", "cql_served"} and gate["candidates"]
    for row in gate["candidates"].values():
        assert row["state"] == "pending" and f"evidence 1.00 of the {row['needed']:.0f} needed" in row["why"]
    assert meta["ledger_deploy"] == "SAGE's YAML table" and "| pending |" in meta["ledger_router"]
    assert "valid for one night only" in meta["promotion_sage_per_night"]
    published = _metadata(result, "promoted_policy")
    assert published["sage_binary"].startswith("none (the YAML table: the ledger deploys it")
    assert not (root / "checkpoints" / "promoted_sage" / "policy.joblib").exists()
    sage = _metadata(result, "sage_router_checkpoint")
    assert sage["written"] is False and not (root / "checkpoints" / "sage").exists()


def _copy(chain, tmp_path) -> Path:
    import shutil

    copy = tmp_path / "root"
    shutil.copytree(chain[0], copy, symlinks=True)  # the links are relative: they resolve in the copy
    return copy


def _rerun(root: Path, assets: list[str], ops: dict | None = None, raise_on_error: bool = True):
    job = dg.Definitions(assets=ROUTING_ASSETS, resources={"sage": SageResource(data_dir=str(root))}) \
        .resolve_implicit_global_asset_job_def().get_subset(asset_selection={dg.AssetKey(a) for a in assets})
    run_config = {"ops": {k: {"config": v} for k, v in (ops or {}).items()}}
    return job.execute_in_process(run_config=run_config, instance=dg.DagsterInstance.ephemeral(),
                                  raise_on_error=raise_on_error)


def test_per_night_mode_publishes_tonights_promotion_as_before(chain, tmp_path):
    """gate_mode 'per_night' (one-off comparisons and the benchmarks that measure it; valid for one night
    only): SAGE's binary space promoted on tonight's report half against the table, published as before."""
    copy = _copy(chain, tmp_path)
    ev_cfg = {**SMALL["ops"]["offline_eval"]["config"], "gate_mode": "per_night"}
    result = _rerun(copy, ["offline_eval", "promoted_policy", "sage_router_checkpoint"], {"offline_eval": ev_cfg})
    rep = json.loads((copy / "reports" / "offline_eval.json").read_text())["sage_binary"]
    meta = _metadata(result, "offline_eval")
    assert rep["gate"]["mode"] == "per_night" and meta["gate_mode"] == "per_night" and "ledger_router" not in meta
    assert set(rep["gate"]["candidates"]) <= {"bc_served", "cql_served"}
    sage = _metadata(result, "sage_router_checkpoint")
    if rep["gate"]["promoted"]:
        assert sage["written"] is True and (copy / "checkpoints" / "sage" / "policy.joblib").is_file()
        assert sage["decisions_checked_as_sage"] > 0
        assert "export SAGE_RL_POLICY=1" in sage["sage_env"]
        # the promoted copy names where SAGE finds it, not the staged version it was written into
        promoted = copy / "checkpoints" / "promoted_sage"
        manifest = json.loads((promoted / "manifest.json").read_text())
        env = manifest["sage_env"]
        assert env["SAGE_RL_CHECKPOINT"] == str(promoted / "policy.joblib") and promoted.is_symlink()
        # the gate's paired interval of the gain over the table travels with it (online_ab reads it)
        c, g = rep["gate"]["candidates"][rep["gate"]["promoted"]], manifest["gain_over_table"]
        assert g == {k: c.get(k) for k in ("difference", "difference_ci_low", "difference_ci_high")}
        assert set(g.values()) == {None}  # this chain's 'value' rule computes no paired difference
        # and reaches the copy SAGE loads, which online_ab reads
        assert json.loads((copy / "checkpoints" / "sage" / "manifest.json").read_text())["gain_over_table"] == g
    else:
        assert sage["written"] is False and not (copy / "checkpoints" / "sage").exists()


def test_publishing_follows_the_ledgers_deploy(chain, tmp_path):
    """promoted_policy and sage_router_checkpoint publish what the ledger deploys: a candidate once accepted
    (its content-addressed checkpoint, byte for byte; the exploring checkpoint explores around it), and
    SAGE's YAML table alone after its revert (no policy.joblib where SAGE looks). Here the ledger's states
    are set by hand (one night's logs support no accept); decisions/ holds the ledger's own tests."""
    from sage_pipeline.decisions.ledger import Ledger

    copy = _copy(chain, tmp_path)
    path = copy / "decisions" / "ledger.json"
    led = Ledger.load(path)
    cand, *others = led.of("router", "pending")
    led.transition(cand.id, "accepted", night="2099-01-01", reason="accepted by hand (the test)")
    led.save(path)
    # what offline_eval staged is no longer what the ledger deploys: promoted_policy refuses
    res = _rerun(copy, ["promoted_policy"], raise_on_error=False)
    err = str(res.get_step_failure_events()[0].event_specific_data.error)
    assert not res.success and f"now deploys {cand.key[:12]}" in err and "re-materialize offline_eval" in err
    ev_cfg = SMALL["ops"]["offline_eval"]["config"]
    result = _rerun(copy, ["offline_eval", "promoted_policy", "sage_router_checkpoint"], {"offline_eval": ev_cfg})
    assert _checks(result)["gate_decision_is_consistent"].passed
    ev = _metadata(result, "offline_eval")
    assert ev["ledger_deploy"].startswith(cand.id) and f"| {cand.id} |" in ev["ledger_router"]
    # a pending candidate proposed against the table is dropped: SAGE runs another policy now
    led = Ledger.load(path)
    assert led.get(cand.id).state == "accepted" and all(led.get(o.id).state == "dropped" for o in others)
    promoted = copy / "checkpoints" / "promoted_sage"
    from sage_pipeline.decisions import router as ledger_router

    assert ledger_router.folder_key(promoted) == cand.key  # the file SAGE loads, at the floor its env sets
    assert json.loads((promoted / "ledger_deploy.json").read_text())["deploy"]["candidate"] == cand.id
    assert _metadata(result, "promoted_policy")["sage_binary"].startswith(cand.id)
    sage = _metadata(result, "sage_router_checkpoint")
    manifest = json.loads((copy / "checkpoints" / "sage" / "manifest.json").read_text())
    assert sage["written"] is True and sage["kind"] == "deterministic" and cand.id in sage["deploy"]
    assert manifest["ledger_candidate"] == cand.id and manifest["ledger_key"] == cand.key
    assert "explore deploy <this folder>" in sage["sage_env"]
    # the exploring checkpoint explores around the top of the deployed stack
    result = _rerun(copy, ["sage_router_checkpoint"], {"sage_router_checkpoint": {"explore": True}})
    sage = _metadata(result, "sage_router_checkpoint")
    assert sage["kind"] == "exploring" and sage["exploration"]["target"] == cand.payload["name"]
    # the accepted candidate reverted: SAGE goes back to its YAML table, alone
    led = Ledger.load(path)
    led.transition(cand.id, "reverted", night="2099-01-02", reason="reverted by hand (the test)")
    led.save(path)
    result = _rerun(copy, ["offline_eval", "promoted_policy", "sage_router_checkpoint"], {"offline_eval": ev_cfg})
    assert _metadata(result, "offline_eval")["ledger_deploy"] == "SAGE's YAML table"
    assert not (promoted / "policy.joblib").exists()
    assert json.loads((promoted / "ledger_deploy.json").read_text())["deploy"]["key"] == "yaml_table"
    sage = _metadata(result, "sage_router_checkpoint")
    assert sage["written"] is False and sage["removed"] is True and "explore deploy --yaml" in sage["record"]
    assert (copy / "checkpoints" / "sage").is_dir() and not (copy / "checkpoints" / "sage" / "policy.joblib").exists()


def test_promoted_policy_refuses_a_stale_or_broken_gate_decision(chain, tmp_path):
    """promoted_policy publishes only a decision about the dataset there is now, whose staged
    policies load; otherwise it fails naming what to do, and the published folders stay."""
    import shutil

    root, _ = chain
    copy = tmp_path / "root"
    shutil.copytree(root, copy, symlinks=True)  # the links are relative: they resolve in the copy
    job = dg.Definitions(assets=ROUTING_ASSETS, resources={"sage": SageResource(data_dir=str(copy))}) \
        .resolve_implicit_global_asset_job_def().get_subset(asset_selection={dg.AssetKey("promoted_policy")})

    def run():
        res = job.execute_in_process(instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
        return res, "" if res.success else str(res.get_step_failure_events()[0].event_specific_data.error)

    ok, _ = run()
    assert ok.success
    decision_path = copy / "checkpoints" / "gate" / "decision.json"
    decision = json.loads(decision_path.read_text())
    before = {p.name: p.read_bytes() for p in (copy / "checkpoints" / "promoted").iterdir()} \
        if (copy / "checkpoints" / "promoted").exists() else {}
    decision_path.write_text(json.dumps(decision | {"dataset_sha256": "0" * 64}))
    res, err = run()
    assert not res.success and "the decision is for dataset 000000000000" in err and "offline_eval" in err
    after = {p.name: p.read_bytes() for p in (copy / "checkpoints" / "promoted").iterdir()} \
        if (copy / "checkpoints" / "promoted").exists() else {}
    assert after == before
    decision_path.write_text(json.dumps(decision))
    promoted = decision["spaces"]["multi_model"]["promoted"]
    if promoted:  # a staged policy that does not load is refused too
        (copy / "checkpoints" / "gate" / "multi_model" / "policy.json").write_text("{not json")
        res, err = run()
        assert not res.success and f"multi_model: the staged {promoted!r}" in err and "does not load" in err
    decision_path.write_text("{not json")
    res, err = run()
    assert not res.success and f"{decision_path}: not JSON" in err
    decision_path.unlink()
    res, err = run()
    assert not res.success and "materialize offline_eval first" in err


def test_logs_without_propensities_use_bc_estimates(tmp_path):
    """Real SAGE logs without propensities: BC estimates them and the report says so."""
    from sage_pipeline.routing import collector
    from sage_pipeline.routing.catalogue import SAGE_CATALOGUE, ModelCatalogue
    from sage_pipeline.routing.routing_simulator import RoutingSimulator
    from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable

    cat = ModelCatalogue.load(SAGE_CATALOGUE)  # the sage resource's default pair: SAGE's own table
    src = tmp_path / "src"
    collector.collect(RoutingSimulator(cat, RoutingTable.load(SAGE_TABLE)), src,
                      collector.CollectorConfig(episodes=800, seed=5))
    real = tmp_path / "sessions" / "real"
    real.mkdir(parents=True)
    for f in sorted(src.glob("*.log")):
        out = []
        for line in f.read_text().splitlines():
            ev = json.loads(line)
            ev.pop("propensity", None)
            ev.setdefault("extra", {})["synthetic"] = False
            out.append(json.dumps(ev))
        (real / f.name).write_text("\n".join(out) + "\n")
    cfg = {"ops": {**SMALL["ops"], "trajectories": {"config": {"log_dirs": ["sessions/real"]}}}}
    result = _run(tmp_path, cfg)
    ds = _metadata(result, "routing_dataset")
    assert ds["propensities_logged"] == 0.0
    meta = _metadata(result, "offline_eval")
    assert meta["propensities_estimated_by_bc"] > 0
    assert meta["ground_truth"].startswith("none")
    report = json.loads((tmp_path / "reports" / "offline_eval.json").read_text())
    assert report["multi_model"]["ground_truth"] is None
    assert report["propensities_estimated_by_bc"] == meta["propensities_estimated_by_bc"]


def test_support_rule_is_a_config_choice(tmp_path):
    """With support='behaviour' the support check is BC's model of the behaviour policy: every
    policy of the small run is evaluated (the logged-pairs rule may withhold some); a rule
    that does not exist is an error naming it."""
    ops = {**SMALL["ops"],
           "cql_policy": {"config": {**SMALL["ops"]["cql_policy"]["config"], "support": "behaviour"}},
           "offline_eval": {"config": {**SMALL["ops"]["offline_eval"]["config"], "support": "behaviour"}}}
    result = _run(tmp_path, {"ops": ops})
    report = json.loads((tmp_path / "reports" / "offline_eval.json").read_text())
    step = [r for r in report["multi_model"]["summary"] if r["policy"] in ("static_table", "bc", "cql")]
    assert step and all(r["no_support"] is None for r in step)
    assert _metadata(result, "offline_eval")["ground_truth"] == "simulator"
    bad = {"ops": {**ops, "offline_eval": {"config": {"support": "sample"}}}}
    failed = _run(tmp_path, bad, raise_on_error=False)
    assert not failed.success
    err = str(failed.get_step_failure_events()[0].event_specific_data.error)
    assert "support 'sample'" in err and "logged_pairs" in err


def test_multi_model_only_skips_sages_space_and_writes_no_sage_checkpoint(tmp_path):
    ops = {**SMALL["ops"],
           "bc_policy": {"config": {**SMALL["ops"]["bc_policy"]["config"], "action_spaces": ["multi_model"]}},
           "cql_policy": {"config": {**SMALL["ops"]["cql_policy"]["config"], "action_spaces": ["multi_model"]}}}
    result = _run(tmp_path, {"ops": ops})
    assert _metadata(result, "offline_eval")["action_spaces"] == ["multi_model"]
    sage = _metadata(result, "sage_router_checkpoint")
    assert sage["written"] is False and not (tmp_path / "checkpoints" / "sage").exists()
    bad = {"ops": {**ops, "bc_policy": {"config": {"action_spaces": ["sage_binary"]}}}}
    failed = _run(tmp_path, bad, raise_on_error=False)
    err = str(failed.get_step_failure_events()[0].event_specific_data.error)
    assert "list 'multi_model'" in err


WRITERS = ["trajectories", "routing_dataset", "reward_report", "bc_policy", "cql_policy", "offline_eval",
           "promoted_policy", "sage_router_checkpoint"]


@pytest.mark.parametrize("asset", WRITERS)
def test_a_writer_asset_writes_only_while_it_holds_its_lock(chain, monkeypatch, asset):
    """Each of these assets writes several files (or folders). Two runs of one at once must leave one
    run's whole set, not files of both (found by benchmarks/fault_injection.py: offline_eval's report
    from one run beside the other's promoted checkpoint): every atomic write of a run happens while it
    holds the asset's lock (artifacts.exclusive), so a second run waits for the first."""
    import contextlib

    from sage_pipeline import artifacts

    root, _ = chain
    held: list[str] = []
    writes: list[tuple[str, list[str]]] = []
    real_exclusive = artifacts.exclusive

    @contextlib.contextmanager
    def exclusive(where, name, *args, **kwargs):
        with real_exclusive(where, name, *args, **kwargs) as path:
            held.append(name)
            try:
                yield path
            finally:
                held.pop()

    def tracked(real):
        @contextlib.contextmanager
        def write(dest):
            writes.append((str(dest), list(held)))
            with real(dest) as tmp:
                yield tmp
        return write

    monkeypatch.setattr(artifacts, "exclusive", exclusive)
    monkeypatch.setattr(artifacts, "atomic_path", tracked(artifacts.atomic_path))
    monkeypatch.setattr(artifacts, "atomic_dir", tracked(artifacts.atomic_dir))
    test_defs = dg.Definitions(assets=ROUTING_ASSETS, resources={"sage": SageResource(data_dir=str(root))})
    job = test_defs.resolve_implicit_global_asset_job_def().get_subset(asset_selection={dg.AssetKey(asset)})
    ops = {k: v for k, v in SMALL["ops"].items() if k == asset}
    if asset == "sage_router_checkpoint":  # the ledger deploys nothing after one night: the exploring checkpoint
        ops = {asset: {"config": {"explore": True}}}
    result = job.execute_in_process(run_config={"ops": ops}, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    assert writes, f"{asset} wrote nothing"
    outside = [dest for dest, locks in writes if asset not in locks]
    assert not outside, f"{asset} wrote {outside[:3]} without holding its lock"


@pytest.mark.parametrize("shape", [["--rotate-mb", "0.02"], ["--rotate-mb", "0.02", "--no-session-id"]],
                         ids=["session_ids", "no_session_id"])
def test_journals_sage_wrote_pass_the_blocking_checks(tmp_path, shape):
    """Journals SAGE's own functions wrote (SAGE_PYTHON; skipped, saying why, without it): plain-text lines
    and empty-model circuit-breaker steps are SAGE's, so nothing is quarantined, the blocking check is green,
    and the volume warning judges only roles SAGE's `sage run` logs decisions with outcomes for."""
    from sage_pipeline_tests.sage_contract.sage_journals import require_sage, write_journals

    _, models = require_sage()
    summary = write_journals(tmp_path / "ws", "--days", "3", "--sessions-per-day", "2", "--tasks", "6", *shape)
    test_defs = dg.Definitions(
        assets=ROUTING_ASSETS,
        asset_checks=[routing_checks.routing_dataset_contract, routing_checks.routing_dataset_volume],
        resources={"sage": SageResource(data_dir=str(tmp_path / "root"), routing_table=str(models))},
    )
    run = {"ops": {"trajectories": {"config": {"log_dirs": [str(tmp_path / "ws" / "memory" / "sessions")]}}}}
    result = test_defs.resolve_implicit_global_asset_job_def().execute_in_process(
        run_config=run, instance=dg.DagsterInstance.ephemeral(),
        asset_selection=[dg.AssetKey("trajectories"), dg.AssetKey("routing_dataset")])
    assert result.success
    traj = _metadata(result, "trajectories")
    assert traj["quarantined_lines"] == 0 and traj["lines_read"] == sum(summary["lines"].values())
    n = summary["sessions"]  # each run ends with save_memory's two text lines
    assert traj["sage_text_lines"] == {"text_checkpoint": n, "text_token_summary": n}
    ds = _metadata(result, "routing_dataset")
    assert ds["decisions_by_source"]["reviewer_step"] > 0 and ds["decisions_by_source"]["routing_decision"] > 0
    assert all("timeout" in k for k in ds["joins_and_derivations"]["not_joined"])  # only calls that timed out
    checks = _checks(result)
    assert checks["quarantine_below_threshold"].passed and checks["routing_dataset_contract"].passed
    vol = {k: v.value for k, v in checks["routing_dataset_volume"].metadata.items()}
    assert "shell_router" not in vol["roles_judged"] and vol["roles_without_rows"]["shell_chat"] == "not in the logs"
    assert {"coder", "debugger"} <= set(vol["roles_judged"])
