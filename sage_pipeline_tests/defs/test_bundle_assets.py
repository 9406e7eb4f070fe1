"""sage_bundle carries the decision ledger (``<data>/decisions/ledger.json``) and the arms the levers' nights
write (``<data>/decisions/assignment_plan.json``, parts inside the data root), and its metadata shows the
env as the env file is: shell-quoted exports."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline.decisions import assign
from sage_pipeline.decisions.ledger import Ledger
from sage_pipeline.defs.bundle_assets import sage_bundle
from sage_pipeline.defs.resources import SageResource
from sage_pipeline.sage import bundle as bd
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable, pin

BIG = "qwen2.5-coder:14b-instruct-q4_K_M"


@pytest.fixture(autouse=True)
def _no_sage_env(monkeypatch):
    for name in ("SAGE_MODELS_YAML", "SAGE_WORKSPACES", "SAGE_JOURNALS", "SAGE_DATA_DIR"):
        monkeypatch.delenv(name, raising=False)


def _materialize(root: Path, ok: bool = True):
    res = dg.materialize([sage_bundle], resources={"sage": SageResource(data_dir=str(root))},
                         instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    if not ok:
        assert not res.success
        (event,) = [e for e in res.all_events if e.is_step_failure]
        return event.step_failure_data.error.message
    assert res.success
    (mat,) = res.asset_materializations_for_node("sage_bundle")
    return {k: v.value for k, v in mat.metadata.items()}


@pytest.mark.slow  # materializes in process (a few seconds each)
def test_the_bundle_carries_the_ledger_and_the_nights_arms(tmp_path):
    root = tmp_path / "data dir 'q' $(x)"
    dec = root / "decisions"
    dec.mkdir(parents=True)
    meta = _materialize(root)  # nothing decided yet: no ledger, no arms
    assert meta["decisions"] == "no ledger yet" and "nothing randomised" in meta["arms"] and meta["plan"] == ""
    b = bd.read(meta["bundle_path"])
    assert "decisions" not in b.manifest["parts"] and b.plan() is None
    for line in meta["sage_env"].strip("`\n").removeprefix("bash\n").splitlines():  # quoted as the env file is
        name, _, value = line.removeprefix("export ").partition("=")
        assert value == shlex.quote(b.env()[name]), line
    assert "'" in meta["sage_env"]  # the data root's name needs the quotes

    led = Ledger.load(dec / "ledger.json")
    led.propose("coder", BIG, night="2026-12-01")
    led.save()
    pin(RoutingTable.load(SAGE_TABLE), "coder", BIG).write(dec / "coder" / "pin.yaml")
    assign.save_lever_arms(dec / assign.ARMS_FILE, "coder", [("incumbent", None, 0.75, None),
                                                             ("pin", "coder-0001", 0.25, "decisions/coder/pin.yaml")])
    meta = _materialize(root)
    b = bd.read(meta["bundle_path"])
    assert Ledger.load(b.folder / "ledger.json").get("coder-0001").key == BIG
    assert meta["decisions"] == str(b.folder / "ledger.json")
    assert b.plan().probability("coder", "pin") == 0.25 and meta["plan"] == b.plan().id
    assert "| coder | pin | coder-0001 | 0.250 |" in meta["arms"] and "sage-run" in meta["deploy_command"]
    assert (b.folder / "arms/coder/pin/models.yaml").read_bytes() == (dec / "coder" / "pin.yaml").read_bytes()

    # a part outside the data root fails the asset, naming the arms file and the field
    doc = json.loads((dec / assign.ARMS_FILE).read_text())
    doc["levers"]["coder"][1]["part"] = "../elsewhere.yaml"
    (dec / assign.ARMS_FILE).write_text(json.dumps(doc))
    msg = _materialize(root, ok=False)
    assert assign.ARMS_FILE in msg and "levers.coder.1.part" in msg
