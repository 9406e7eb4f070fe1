"""decisions/decision_ledger in Dagster: an absent ledger says nothing has been proposed; a ledger with
candidates shows each one's state, interval, standing and why, and the plot; a damaged ledger fails
naming the file and field."""

from __future__ import annotations

import json

import dagster as dg
import numpy as np

from sage_pipeline.decisions import evidence as ev
from sage_pipeline.decisions.ledger import Ledger
from sage_pipeline.definitions import defs
from sage_pipeline.defs import decision_assets as da
from sage_pipeline.defs.resources import SageResource

NODE = "decisions__decision_ledger"


def _run(root):
    return dg.materialize([da.decision_ledger], resources={"sage": SageResource(data_dir=str(root))},
                          instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def _meta(result) -> dict:
    (mat,) = result.asset_materializations_for_node(NODE)
    return {k: v.value for k, v in mat.metadata.items()}


def test_the_asset_is_in_its_own_group_and_not_in_sage_main():
    node = defs.resolve_asset_graph().get(dg.AssetKey(["decisions", "decision_ledger"]))
    assert node.group_name == "decisions"
    job = defs.resolve_job_def("sage_main")
    assert NODE not in {n.name for n in job.graph.nodes}


def test_no_ledger_yet_says_so(tmp_path):
    r = _run(tmp_path)
    assert r.success
    m = _meta(r)
    assert m["exists"] is False and m["candidates"] == 0
    assert "nothing has been proposed" in m["ledger"]


def test_a_ledger_with_candidates_shows_each_decision(tmp_path):
    led = Ledger.load(tmp_path / "decisions" / "ledger.json")
    rng = np.random.default_rng(0)
    good, _ = led.propose("skills", "coder/SKILL.md::write the test first", night="n0",
                          description="coder/SKILL.md: write the test first")
    pin, _ = led.propose("coder", "qwen2.5-coder:14b", night="n0", description="pin the coder to the 14B")
    for night in range(1, 4):
        a = (rng.random((25, 16)) < 0.75).mean(1)
        b = (rng.random((25, 16)) < 0.6).mean(1)
        x, lo, hi = ev.paired_difference(a, b)
        led.add_evidence(good.id, "replay", x, lo, hi, [f"{night}/{i}" for i in range(25)])
        led.decide(good.id, f"n{night}")
    led.decide(pin.id, "n1")
    led.save()
    r = _run(tmp_path)
    assert r.success
    m = _meta(r)
    assert m["candidates"] == 2 and m["by_lever"]["skills"]["accepted"] == 1
    assert "skills-0001" in m["ledger"] and "accepted" in m["ledger"]
    assert "pending: evidence 1.0 of the 22 needed; no evidence yet" in m["ledger"]  # the coder: 1 / 0.045
    assert "data:image/png;base64" in m["plot"]
    assert (tmp_path / "reports" / "decision_ledger.png").is_file()


def test_a_damaged_ledger_fails_naming_the_file_and_field(tmp_path):
    p = tmp_path / "decisions" / "ledger.json"
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps({"schema_version": 1, "candidates": [{"id": 3}]}))
    r = _run(tmp_path)
    assert not r.success
    err = str(r.failure_data_for_node(NODE).error.message) if r.failure_data_for_node(NODE) else ""
    assert "ledger.json: field 'candidates.0" in err
