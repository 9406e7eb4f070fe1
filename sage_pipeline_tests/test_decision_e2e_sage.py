"""The end-to-end decision target with SAGE's own code (marked sage_contract by the ``sage_python`` fixture): two
nights of six `sage run`s each in the model world, the coder's model drawn per run by the decision ledger's plan.
What SAGE wrote is read here straight from its journal files (not through the project's ingest): every JSON line
of a run carries the trace id its draw gave it; the coder's model SAGE logged is the one the arm's models.yaml
pins; and the ledger's evidence is exactly the recorded draws, with their exact probabilities."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import pytest

from sage_pipeline.decisions import assign, coder as coder_ledger
from sage_pipeline.decisions.ledger import Ledger
from sage_pipeline.sage_world import ledger_nights as ln
from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall


@pytest.fixture(scope="module")
def nights(sage_python, tmp_path_factory):
    root = tmp_path_factory.mktemp("decision_e2e")
    cfg = ln.DecisionE2EConfig(nights=2, runs_per_night=6, pool=24, drift_night=2, harness=HarnessConfig(workers=2))
    report = ln.run(SageInstall.find(sage_python), root, cfg)
    return root, report


def _lines_by_session(night_root: Path) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for f in sorted(night_root.glob("ws-*/memory/sessions/*.log")):
        for ln_ in f.read_text(encoding="utf-8").splitlines():
            if ln_.startswith("{"):
                e = json.loads(ln_)
                out.setdefault(str(e.get("session_id")), []).append(e)
    return out


def _plans(root: Path) -> dict[str, assign.Plan]:
    plans, bad = coder_ledger.load_plans(coder_ledger.lever_dir(root / "data" / "decisions" / "ledger.json"))
    assert not bad
    return plans


def test_every_runs_journal_carries_the_trace_id_its_draw_gave_it(nights):
    root, report = nights
    plans = _plans(root)
    for n in (1, 2):
        night_root = root / "nights" / f"night-{n:02d}"
        draws, bad = assign.read_records(night_root / assign.RECORDS_NAME, plans)
        assert not bad and len(draws) == 6
        runs = [json.loads(x) for x in (night_root / "runs.jsonl").read_text().splitlines()]
        assert all(r["failure"] is None for r in runs), [r["failure"] for r in runs]
        lines = _lines_by_session(night_root)
        assert sorted(r["env"]["SAGE_TRACE_ID"] for r in runs) == sorted(draws)  # one draw per run, each recorded
        for r in runs:
            mine = [e for s in r["sessions"] for e in lines[s]]
            assert mine and {e.get("trace_id") for e in mine} == {r["env"]["SAGE_TRACE_ID"]}, r["run"]
        assert report["nights"][n - 1]["journal"]["counts"][ln.TRACE_OK] == 6


def test_each_run_used_the_models_yaml_its_arm_says_as_sages_journal_shows(nights):
    root, _ = nights
    plans = _plans(root)
    seen = set()
    for n in (1, 2):
        night_root = root / "nights" / f"night-{n:02d}"
        draws, _ = assign.read_records(night_root / assign.RECORDS_NAME, plans)
        lines = _lines_by_session(night_root)
        for r in (json.loads(x) for x in (night_root / "runs.jsonl").read_text().splitlines()):
            d = draws[r["env"]["SAGE_TRACE_ID"]]
            arm = next(a for a in plans[d["plan"]].levers["coder"] if a.name == d["levers"]["coder"]["arm"])
            pinned = ln.pinned_model(arm.env["SAGE_MODELS_YAML"])  # what the arm's file pins, read from the file
            coder = {e["action"]["model_chosen"] for s in r["sessions"] for e in lines[s]
                     if e["type"] == "TRAJECTORY_STEP" and e.get("action", {}).get("model_chosen")}
            assert coder <= {pinned}, (r["run"], coder, pinned)  # empty only if SAGE never reached its reviewer
            if coder:
                seen.add(pinned)
    assert len(seen) == 2  # both arms ran (6 + 6 draws at 1/2 each: a miss has chance 2 * 2**-12)


def test_the_ledgers_evidence_is_the_recorded_draws_with_their_exact_probabilities(nights):
    root, report = nights
    plans = _plans(root)
    led = Ledger.load(root / "data" / "decisions" / "ledger.json")
    draws: dict = {}
    for n in (1, 2):
        got, bad = assign.read_records(root / "nights" / f"night-{n:02d}" / assign.RECORDS_NAME, plans)
        assert not bad
        draws.update(got)
    for d in draws.values():  # each record's arm and threshold are its plan's; the probability is exactly 1/2
        arm = next(a for a in plans[d["plan"]].levers["coder"] if a.name == d["levers"]["coder"]["arm"])
        assert Fraction(d["levers"]["coder"]["probability"]) == Fraction(arm.threshold, assign.SCALE) == Fraction(1, 2)
    known = {r.trace_id for r in _journal(root) if r.objective is not None}
    for c in led.of(coder_ledger.LEVER):
        if c.proposed != "day-00":
            continue
        want = [did for did in draws if did in known]  # every recorded draw of the round with a known verdict
        got = c.judged_on[coder_ledger.ONLINE]
        assert got == (want if c.state in ("pending", "accepted") else want[:len(got)])  # a closed one: until then
    for n in report["nights"]:
        for v in n["recomputed"].values():
            assert v["units_equal"] and v["difference"] in (None, 0.0)


def _journal(root: Path):
    import pandas as pd

    from sage_pipeline.routing import routing_dataset as rd

    out = []
    for n in (1, 2):
        ing = root / "nights" / f"night-{n:02d}" / "ingest"
        frames = {"dataset": rd.read_routing_dataset(ing / rd.PARQUET_NAME, ["role", "model", "session_id", "task_id",
                                                                             "episode_id", "step", "source_line"]),
                  "outcomes": pd.read_parquet(ing / "task_outcomes.parquet"),
                  "trajectories": pd.read_parquet(ing / "trajectories.parquet", columns=["session_id", "trace_id"])}
        out += ln.journal_runs(frames, ln.DecisionE2EConfig().objective)[0]
    return out
