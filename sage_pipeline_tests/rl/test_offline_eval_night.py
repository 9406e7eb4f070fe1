"""The offline_eval and sage_router_checkpoint assets' core, called without dagster: what a bare root
gives, and that the night's module never imports the routing simulator (the chain on SAGE's journals,
defs/test_sage_journal_chain.py, runs the night itself, the simulator refused)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sage_pipeline.decisions import router as ledger_router
from sage_pipeline.rl import offline_eval as oe, offline_eval_night as oen, ope, sage_router_checkpoint as rc
from sage_pipeline.sage.table import DEFAULT_TABLE, RoutingTable

FIXTURE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_journal"


def settings() -> oen.OfflineEvalSettings:
    return oen.OfflineEvalSettings(ope=ope.OPEConfig(n_boot=50), gate=oe.PromotionGateConfig(),
                                   router_gate=ledger_router.RouterGateConfig(), support="logged_pairs",
                                   floor_selection="fqe", gate_mode="ledger", objective="task", night=None)


def test_a_root_without_a_routing_dataset_names_the_file_and_what_to_materialize(tmp_path):
    table = RoutingTable.load(FIXTURE / "models.yaml")
    with pytest.raises(FileNotFoundError) as err:
        oen.run_offline_eval_night(tmp_path, table, tmp_path / "no_catalogue.yaml", settings())
    path = tmp_path / "routing" / "routing_v1.parquet"
    assert str(path) in str(err.value) and "materialize routing_dataset first" in str(err.value)
    assert not (tmp_path / "reports").exists() and not (tmp_path / "checkpoints").exists()


def test_the_nights_module_imports_no_routing_simulator_nor_dagster():
    code = ("import sys; import sage_pipeline.rl.offline_eval_night, sage_pipeline.rl.sage_router_checkpoint; "
            "print(sorted(m for m in sys.modules if m.endswith('routing_simulator') or m.split('.')[0] == 'dagster'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_nothing_deployed_and_no_exploring_writes_nothing(tmp_path):
    table = RoutingTable.load(FIXTURE / "models.yaml")
    res = rc.write_sage_router_checkpoint(tmp_path, table, FIXTURE / "models.yaml")
    assert res.written is False and res.deploy == "SAGE's YAML table" and not res.removed
    assert res.reason.startswith("no sage_binary policy promoted") and "SAGE keeps its YAML table" in res.warning
    assert not (tmp_path / "checkpoints").exists()


def test_the_first_exploring_checkpoint_from_the_table_alone(tmp_path):
    table = RoutingTable.load(FIXTURE / "models.yaml")
    said = []
    res = rc.write_sage_router_checkpoint(tmp_path, table, FIXTURE / "models.yaml", explore=True,
                                          exploration_rate=0.2, log=said.append)
    assert res.written is True and res.kind == "exploring" and res.path == tmp_path / "checkpoints" / "sage" / \
        "policy.joblib" and res.path.is_file()
    assert res.decisions_checked > 0 and res.deploy == "explored around SAGE's YAML table"
    assert res.manifest["exploration"]["rate_requested"] == 0.2 and res.source == f"SAGE's YAML ({table.source})"
    assert any("decisions checked as SAGE makes them" in m for m in said)


def test_a_checkpoint_for_another_table_than_sage_runs_is_refused_saying_what_to_do(tmp_path):
    table = RoutingTable.load(FIXTURE / "models.yaml")
    with pytest.raises(rc.RouterCheckpointError) as err:
        rc.write_sage_router_checkpoint(tmp_path, table, DEFAULT_TABLE, explore=True)
    assert "SAGE runs" in str(err.value) and "Fix:" in str(err.value)
    assert not (tmp_path / "checkpoints" / "sage").exists()
