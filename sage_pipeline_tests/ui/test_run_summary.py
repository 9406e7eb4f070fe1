"""scripts/run_summary.py, the end of `make run`: it reads the instance, so an asset that
was never materialized is a failure that names it, and a run on the unisolated backend is
called out."""
from __future__ import annotations

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
    # every asset but the on-demand ones (the simulated month, SAGE in the loop)
    assert "assets materialized: 0 of 19" in proc.stdout
    assert "sage_bundle:" not in proc.stdout  # no bundle in this instance: no line about one
    assert "not part of make run: policy_iteration" in proc.stdout
    line = next(ln for ln in proc.stderr.splitlines() if ln.startswith("never materialized: "))
    assert {"offline_eval", "sandbox_rollouts", "sleep_cycle/sage_skills", "sim_tasks",
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


def test_it_ends_with_the_bundle_to_deploy(tmp_path, monkeypatch):
    (tmp_path / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    deploy = ("python -m sage_pipeline.sage.bundle deploy /data/checkpoints/bundle <deploy root> --sage-python "
              "<SAGE's python>")
    with dg.DagsterInstance.get() as instance:
        instance.report_runless_asset_event(dg.AssetMaterialization("sage_bundle", metadata={
            "bundle_path": dg.MetadataValue.path("/data/checkpoints/bundle"), "bundle_id": "ab12cd34",
            "kind": "exploring", "deploy_command": deploy}))
    proc = _summary(tmp_path)
    assert proc.stdout.rstrip("\n").splitlines()[-2:] == [
        "sage_bundle: /data/checkpoints/bundle (kind: exploring, id: ab12cd34)",
        f"deploy it with: {deploy}"]
    assert "sage_bundle" not in proc.stderr  # materialized: not among the missing
