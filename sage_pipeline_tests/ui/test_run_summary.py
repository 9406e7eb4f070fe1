"""scripts/run_summary.py, the end of `make run`: it reads the instance, so an asset that
was never materialized is a failure that names it, and a run on the unisolated backend is
called out."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg

REPO = Path(__file__).resolve().parents[2]


def _summary(home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "run_summary.py")], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_an_empty_instance_fails_naming_every_asset(tmp_path):
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    proc = _summary(tmp_path)
    assert proc.returncode == 1
    # every asset but the on-demand ones (the simulated month, SAGE in the loop, the routing demo)
    assert "assets materialized: 0 of 17" in proc.stdout
    assert "sage_bundle:" not in proc.stdout  # no bundle in this instance: no line about one
    assert "not part of make run: policy_iteration" in proc.stdout
    assert "not part of make run: synthetic_sessions (dagster job execute -m sage_pipeline.definitions -j " \
           "routing_demo)" in proc.stdout  # the routing simulator's journals: a demo, off make run's path
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("never materialized: "))
    assert {"offline_eval", "sandbox_rollouts", "sleep_cycle/sage_skills", "sim_tasks", "sage_week",
            "sage_bundle", "decisions/decision_ledger"} <= set(
        line.removeprefix("never materialized: ").split(", "))


def test_the_local_backend_is_called_out(tmp_path, monkeypatch):
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization(
            "sim_tasks", metadata={"sandbox_backend": "local", "sandbox_isolated": False}))
    proc = _summary(tmp_path)
    assert "sandbox: local (sandbox_isolated: false)" in proc.stdout
    assert "WARNING: the simulator ran in unisolated local processes" in proc.stderr
    assert proc.returncode == 1     # the rest of the graph was never materialized


DEPLOY = ("python -m sage_pipeline.sage.bundle deploy /data/checkpoints/bundle <deploy root> --sage-python "
          "<SAGE's python>")


def _bundle_summary(tmp_path, monkeypatch, **meta) -> list[str]:
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    with dg.DagsterInstance.get() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("sage_bundle", metadata={
            "bundle_path": dg.MetadataValue.path("/data/checkpoints/bundle"), "bundle_id": "ab12cd34",
            "deploy_command": DEPLOY, **meta}))
    proc = _summary(tmp_path)
    assert "sage_bundle" not in proc.stderr  # materialized: not among the missing
    return proc.stdout.rstrip("\n").splitlines()


def test_it_ends_with_the_bundle_to_deploy_and_its_value_in_the_model_world(tmp_path, monkeypatch):
    """The bundle's line, its deploy command, then the world's exact value of what it carries beside SAGE as
    shipped, read from the SAGE week's manifest (the coder pinned to the 14b model, the router exploring around
    SAGE's YAML at the week's rate)."""
    truth = json.loads((REPO / "sage_pipeline" / "sage" / "data" / "sage_week.json").read_text())["truth"]
    coder = truth["coder_models"][-1]
    lines = _bundle_summary(tmp_path, monkeypatch, kind="exploring", coder=coder, exploration=dg.MetadataValue.json(
        {"target": "yaml:/somewhere/models.yaml", "rate_requested": truth["exploration_rate"]}))
    mine, shipped = truth["week"][f"coder={coder},router=explore"], truth["week"]["coder=shipped,router=yaml"]
    assert lines[-4:-2] == ["sage_bundle: /data/checkpoints/bundle (kind: exploring, id: ab12cd34)",
                            f"deploy it with: {DEPLOY}"]
    value, note = lines[-2:]
    assert value.startswith(f"its value in the model world (coder {coder}, router exploring around SAGE's YAML at "
                            f"{truth['exploration_rate']:g}; task_v1")
    assert f"on the SAGE week's {truth['runs_valued']} runs): {mine['objective']:.4f}" in value
    assert f"vs SAGE as shipped {shipped['objective']:.4f}" in value
    assert value.endswith(f": {mine['objective'] - shipped['objective']:+.4f}")
    assert "not a measurement of your SAGE" in note


def test_a_bundle_the_week_did_not_value_gets_no_number(tmp_path, monkeypatch):
    """A router the week's truth does not hold (a promoted deterministic checkpoint) is said so, with no value."""
    lines = _bundle_summary(tmp_path, monkeypatch, kind="deterministic", coder="qwen2.5-coder:1.5b")
    assert lines[-1].startswith("its value in the model world: not in the SAGE week's truth (coder "
                                "qwen2.5-coder:1.5b, router deterministic")
    assert lines[-2] == f"deploy it with: {DEPLOY}"
