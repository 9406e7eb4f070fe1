"""The sage_bundle asset's work (``rl.sage_bundle.run_sage_bundle``) called without Dagster: the bundle under
the artifact root, why each part is what it is, the ledger and the arms when the levers' nights wrote them, and
refusals named (defs/test_bundle_assets.py materializes the asset over the same layout)."""

from __future__ import annotations

import json

import pytest

from sage_pipeline.decisions import assign
from sage_pipeline.decisions.ledger import Ledger
from sage_pipeline.rl.coder_lever import CoderLeverConfig
from sage_pipeline.rl.sage_bundle import NO_LOGS, SageBundleError, run_sage_bundle
from sage_pipeline.sage import bundle as bd, checkpoint as sage_router
from sage_pipeline.sage.explore import ExploreConfig
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable, pin

BIG = "qwen2.5-coder:14b-instruct-q4_K_M"


def _run(root, explore: ExploreConfig | None = None, target=SAGE_TABLE, progress=None):
    return run_sage_bundle(root, RoutingTable.load(SAGE_TABLE), target, objective=TaskObjective(),
                           coder=CoderLeverConfig(), explore=explore or ExploreConfig(), progress=progress)


def test_with_no_logs_the_bundle_explores_around_sages_yaml(tmp_path):
    said: list[str] = []
    run = _run(tmp_path, progress=said.append)
    b = bd.read(tmp_path / "checkpoints" / "bundle")
    assert b.id == run.bundle.id and run.bundle.folder == b.folder
    assert run.decision is None and not run.coder_pinned_now and run.coder_models == []
    assert run.kind == sage_router.KIND_EXPLORING and run.exploration["rate_requested"] == ExploreConfig().rate
    assert run.why == f"{NO_LOGS}; router: exploring checkpoint; skills: SAGE's own"
    coder = RoutingTable.load(SAGE_TABLE).routes["coder"]
    assert run.coder == f"{coder.primary} / {coder.fallback} (SAGE's bandit)"
    assert run.arms == [] and "`. <deploy root>/sage.env`" in run.deploy_command
    assert said == [f"bundle {b.id[:12]} at {b.folder}: {run.why}"]
    assert not list(tmp_path.glob(".sage_bundle.tmp-*"))  # the exploring checkpoint's scratch folder is gone

    run = _run(tmp_path, explore=ExploreConfig(rate=0.0))  # no checkpoint: SAGE's YAML
    assert run.kind == "yaml" and run.exploration is None and "router: SAGE's YAML (no checkpoint)" in run.why
    assert bd.read(tmp_path / "checkpoints" / "bundle").part("checkpoint") is None


def test_the_ledger_and_the_arms_go_in_and_a_bad_arms_file_is_refused_naming_the_field(tmp_path):
    dec = tmp_path / "decisions"
    led = Ledger.load(dec / "ledger.json")
    led.propose("coder", BIG, night="2026-12-01")
    led.save()
    pin(RoutingTable.load(SAGE_TABLE), "coder", BIG).write(dec / "coder" / "pin.yaml")
    assign.save_lever_arms(dec / assign.ARMS_FILE, "coder", [("incumbent", None, 0.75, None),
                                                             ("pin", "coder-0001", 0.25, "decisions/coder/pin.yaml")])
    run = _run(tmp_path)
    assert run.why.endswith("; arms of coder randomised") and "sage-run" in run.deploy_command
    assert [(a["arm"], a["candidate"], a["probability"]) for a in run.arms] == [
        ("incumbent", "incumbent", 0.75), ("pin", "coder-0001", 0.25)]
    assert Ledger.load(run.bundle.folder / bd.LEDGER_FILE).get("coder-0001").key == BIG

    doc = json.loads((dec / assign.ARMS_FILE).read_text())
    doc["levers"]["coder"][1]["part"] = "../elsewhere.yaml"  # outside the data root
    (dec / assign.ARMS_FILE).write_text(json.dumps(doc))
    with pytest.raises(SageBundleError) as err:
        _run(tmp_path)
    assert assign.ARMS_FILE in str(err.value) and "levers.coder.1.part" in str(err.value)
    assert bd.read(tmp_path / "checkpoints" / "bundle").id == run.bundle.id  # the last bundle stays


def test_a_target_running_another_table_is_refused_before_anything_is_written(tmp_path):
    other = pin(RoutingTable.load(SAGE_TABLE), "coder", BIG).write(tmp_path / "other.yaml")
    with pytest.raises(SageBundleError, match="SAGE_MODELS_YAML="):
        _run(tmp_path, target=other)
    assert not (tmp_path / "checkpoints").exists()
