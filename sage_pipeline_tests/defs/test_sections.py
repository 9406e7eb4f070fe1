"""The Dagster configs made from the core's models (defs/sections.py): left out, a setting has the
core's default; given, it reaches the core as given; a bad one is refused naming it; nothing is
read from the environment when the code loads."""

from __future__ import annotations

from pathlib import Path

import dagster as dg
import pytest
from pydantic import ValidationError

from sage_pipeline.defs import policy_assets as pa, routing_assets as ra, sim_assets as sa
from sage_pipeline.defs.resources import SageResource, SandboxResource
from sage_pipeline.defs.sections import to_core
from sage_pipeline.rl.bc import BCConfig
from sage_pipeline.rl.cql import CQLConfig
from sage_pipeline.routing import routing_dataset as rd
from sage_pipeline.routing.collector import CollectorConfig
from sage_pipeline.routing.ingest import IngestConfig
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.routing.routing_simulator import OutcomeSpec
from sage_pipeline.sim.sandbox import SandboxConfig
from sage_pipeline.sim.tasks import GenerationConfig


def test_synthetic_sessions_keeps_its_flat_keys_from_two_cores():
    cfg = ra.SyntheticSessionsConfig(episodes=600, seed=3, max_attempts=2, action_space="sage_binary")
    assert to_core(cfg, CollectorConfig) == CollectorConfig(episodes=600, seed=3, action_space="sage_binary")
    assert to_core(cfg, OutcomeSpec) == OutcomeSpec(max_attempts=2)
    assert to_core(ra.SyntheticSessionsConfig(), CollectorConfig) == CollectorConfig()
    assert not set(CollectorConfig.model_fields) & set(OutcomeSpec.model_fields)  # flat side by side: no clash
    with pytest.raises(ValidationError, match=r"\nmax_attempts\n  Input should be less than or equal to 10 "):
        ra.SyntheticSessionsConfig(max_attempts=11)


def test_trajectories_resolves_log_dirs_under_the_artifact_root(tmp_path):
    cfg = to_core(ra.TrajectoriesConfig(log_dirs=["sessions/real", str(tmp_path / "abs")]), IngestConfig)
    assert cfg.under(tmp_path / "root").log_dirs == [str(tmp_path / "root" / "sessions" / "real"),
                                                     str(tmp_path / "abs")]
    assert to_core(ra.TrajectoriesConfig(), IngestConfig) == IngestConfig()
    with pytest.raises(ValidationError, match=r"\nmax_line_bytes\n  Input should be greater than or equal to 1024"):
        ra.TrajectoriesConfig(max_line_bytes=10)


def test_routing_dataset_chooses_the_reward_in_a_section_and_nothing_else_of_it():
    cfg = to_core(ra.RoutingDatasetConfig(reward={"version": "reward_v2", "cost_weight": 2.0}, eval_fraction=0.3),
                  rd.DatasetConfig)
    assert cfg == rd.DatasetConfig(reward=RewardSpec(version="reward_v2", cost_weight=2.0), eval_fraction=0.3)
    assert to_core(ra.RoutingDatasetConfig(), rd.DatasetConfig) == rd.DatasetConfig()
    with pytest.raises(ValidationError, match=r"verified_bonus\n  Extra inputs are not permitted"):
        ra.RoutingDatasetConfig(reward={"verified_bonus": 1.0})  # reward_v1's components are SAGE's
    with pytest.raises(ValidationError, match=r"reward_version\n  Extra inputs are not permitted"):
        ra.RoutingDatasetConfig(reward_version="reward_v2")  # the flat key of the old config


def test_bc_and_cql_policies_take_every_core_setting():
    bc = to_core(pa.BCPolicyConfig(epochs=7, hidden=[8], lr=0.01, action_spaces=["multi_model"]), BCConfig)
    assert bc == BCConfig(epochs=7, hidden=[8], lr=0.01)
    cql = to_core(pa.CQLPolicyConfig(mode="bandit", steps=30, min_passes=0.0, alphas=[0.1]), CQLConfig)
    assert cql == CQLConfig(mode="bandit", steps=30, min_passes=0.0)
    assert to_core(pa.CQLPolicyConfig(), CQLConfig) == CQLConfig()
    with pytest.raises(ValidationError, match="set alphas .* instead of alpha"):
        pa.CQLPolicyConfig(alpha=0.1)  # cql_policy trains a grid of alphas: a single one would be ignored
    with pytest.raises(ValidationError, match=r"\nalphas.1\n  Input should be greater than or equal to 0"):
        pa.CQLPolicyConfig(alphas=[0.1, -0.1])  # refused with the run config, not when training starts
    with pytest.raises(ValidationError, match=r"\nalphas\n  List should have at least 1 item"):
        pa.CQLPolicyConfig(alphas=[])
    with pytest.raises(ValidationError, match=r"\nhidden\n  List should have at least 1 item"):
        pa.BCPolicyConfig(hidden=[])


def test_sim_tasks_takes_the_generation_settings():
    cfg = sa.SimTasksConfig(n_tasks=40, seed=2, n_wrong=5, families=["rpn", "bits"])
    assert to_core(cfg, GenerationConfig) == GenerationConfig(n_tasks=40, seed=2, n_wrong=5, families=["rpn", "bits"])
    assert sa.SimTasksConfig().suite_path is None
    with pytest.raises(ValidationError, match=r"\nfamilies\n  Value error, unknown family 'nope'"):
        sa.SimTasksConfig(families=["nope"])
    with pytest.raises(ValidationError, match=r"\nsuite_path\n  String should have at least 1 character"):
        sa.SimTasksConfig(suite_path="")  # unset is null now, never ''


def test_sandbox_resource_is_the_sandbox_config_with_auto():
    res = SandboxResource(workers=3, memory_mb=256)
    assert {k: getattr(res, k) for k in SandboxConfig.model_fields if k != "backend"} == {
        k: v for k, v in SandboxConfig(workers=3, memory_mb=256).model_dump().items() if k != "backend"}
    assert res.backend == "auto" and SandboxConfig().backend == "docker"
    with pytest.raises(ValidationError, match=r"\nbackend\n  Input should be 'auto', 'docker' or 'local'"):
        SandboxResource(backend="podman")


def test_sage_resource_reads_the_environment_when_a_run_uses_it(tmp_path, monkeypatch):
    """Unset paths are resolved at use, from the environment the run sees, never when the
    resource (or the code) is made; an empty string is refused instead of meaning 'unset'."""
    monkeypatch.delenv("SAGE_DATA_DIR", raising=False)
    monkeypatch.delenv("SAGE_ROUTING_TABLE", raising=False)
    res = SageResource()
    monkeypatch.setenv("SAGE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("SAGE_ROUTING_TABLE", str(tmp_path / "models.yaml"))
    assert res.root() == (tmp_path / "data").resolve()
    assert res.table_path() == tmp_path / "models.yaml"
    assert SageResource(data_dir=str(tmp_path / "x")).root() == (tmp_path / "x").resolve()
    monkeypatch.delenv("SAGE_DATA_DIR")
    assert res.root() == Path("datasets").resolve()
    for field in ("data_dir", "routing_table", "model_catalogue"):
        with pytest.raises(ValidationError, match=rf"\n{field}\n  String should have at least 1 character"):
            SageResource(**{field: ""})


def test_a_materialization_reads_sage_data_dir_at_run_time(tmp_path, monkeypatch):
    """The Definitions' resource is made when the code loads; the root still follows the
    variable as the run sees it."""
    monkeypatch.delenv("SAGE_DATA_DIR", raising=False)
    defs = dg.Definitions(assets=[ra.synthetic_sessions], resources={"sage": SageResource()})
    monkeypatch.setenv("SAGE_DATA_DIR", str(tmp_path))
    job = defs.get_implicit_global_asset_job_def()
    res = job.execute_in_process(run_config={"ops": {"synthetic_sessions": {"config": {"episodes": 40}}}},
                                 instance=dg.DagsterInstance.ephemeral())
    assert res.success and (tmp_path / "sessions" / "synthetic" / "simulator.json").is_file()
