"""The end-to-end decision target's pure parts (``sage_world/ledger_nights.py``), without SAGE: each run's arm
reaches it through its environment (its models.yaml, its draw id), the journal's runs become the ledger's
evidence with the recorded exact probabilities (recomputed from the records alone), the journal checks count
what they should, and the truth's comparison says which decisions were right. SAGE's own runs are in
``test_decision_e2e_sage.py``."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from sage_pipeline.decisions import assign, coder as coder_ledger
from sage_pipeline.decisions.coder import CoderDecisionsConfig, CoderRun
from sage_pipeline.decisions.ledger import Ledger
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable, pin
from sage_pipeline.sage_world import ledger_nights as ln, loop as sl
from sage_pipeline.sage_world.harness import _run_env
from sage_pipeline.sage_world.world import ModelWorld, WorldConfig, build_world

TABLE = RoutingTable.load(SAGE_TABLE)
MODELS = tuple(dict.fromkeys((TABLE.routes["coder"].primary, TABLE.routes["coder"].fallback)))
CFG = CoderDecisionsConfig()


def _night(tmp_path, night: int, runs: int, seed: int = 0):
    """The plan and the draws of one night as the target makes them (``loop.coder_day``): the run ids, each
    run's environment, the records and the plans."""
    data, night_root = tmp_path / "data", tmp_path / "nights" / f"night-{night:02d}"
    _, plan, run_env = sl.coder_day(data, night_root, TABLE, MODELS, night, sl.LoopConfig(seed=seed))
    night_root.mkdir(parents=True, exist_ok=True)  # run_day makes it before it asks run_env
    ids = [f"d{night:02d}-r{i:03d}" for i in range(runs)]
    envs = {r: run_env(r, "task") for r in ids}
    plans, bad = coder_ledger.load_plans(coder_ledger.lever_dir(data / "decisions" / "ledger.json"))
    assert not bad
    return data, plan, envs, plans


def _records(tmp_path, plans, nights):
    draws = {}
    for n in nights:
        got, bad = assign.read_records(tmp_path / "nights" / f"night-{n:02d}" / assign.RECORDS_NAME, plans)
        assert not bad
        draws.update(got)
    return draws


def test_each_run_gets_its_arms_models_yaml_and_its_draw_id_through_its_environment(tmp_path):
    _, plan, envs, plans = _night(tmp_path, 1, 40)
    draws = _records(tmp_path, plans, [1])
    assert len(draws) == 40 and list(draws) == [e["SAGE_TRACE_ID"] for e in envs.values()]  # recorded in run order
    arms = {a.name: a for a in plan.levers["coder"]}
    led = Ledger.load(tmp_path / "data" / "decisions" / "ledger.json")
    assert {a.threshold for a in arms.values()} == {assign.SCALE // 2}  # a round pending: exactly 1/2 each
    for run, env in envs.items():
        assert set(env) == {"SAGE_MODELS_YAML", "SAGE_TRACE_ID"} and _run_env(run, env) == env  # the harness takes it
        d = draws[env["SAGE_TRACE_ID"]]
        arm = arms[d["levers"]["coder"]["arm"]]
        assert env["SAGE_MODELS_YAML"] == arm.env["SAGE_MODELS_YAML"]
        assert Fraction(d["levers"]["coder"]["probability"]) == Fraction(arm.threshold, assign.SCALE)
        assert ln.pinned_model(env["SAGE_MODELS_YAML"]) == coder_ledger.model_of(led.get(arm.candidate))
    assert {ln.pinned_model(e["SAGE_MODELS_YAML"]) for e in envs.values()} == set(MODELS)  # both arms drawn
    with pytest.raises(ValueError, match="not a table that pins the coder"):
        ln.pinned_model(SAGE_TABLE)


def _journal(envs, draws, plans, led, y_by_model, rng):
    """A journal's runs: each drawn run's task_v1 from its arm's model (a Bernoulli verified share), and one
    run without a draw (SAGE's bandit chose it: never evidence)."""
    out = []
    for i, env in enumerate(envs.values()):
        d = draws[env["SAGE_TRACE_ID"]]
        m = coder_ledger.model_of(led.get(d["levers"]["coder"]["candidate"]))
        out.append(CoderRun(f"s{i}", env["SAGE_TRACE_ID"], float(rng.random() < y_by_model[m]), m))
    out.append(CoderRun("s-bandit", None, 1.0, MODELS[0]))
    return out


def test_the_journals_runs_are_evidence_with_the_recorded_probabilities_and_recompute_exactly(tmp_path):
    """After a pin the plan is 70/30; the ledger's evidence of every candidate, recomputed from the records'
    thresholds and the journal's outcomes alone, is the ledger's to the last bit, on every unit in record order;
    a record whose threshold was changed after the draw is refused by name and its run is no evidence."""
    rng = np.random.default_rng(3)
    _, _, envs1, plans = _night(tmp_path, 1, 30)
    path = tmp_path / "data" / "decisions" / "ledger.json"
    led = Ledger.load(path)
    draws = _records(tmp_path, plans, [1])
    j1 = _journal(envs1, draws, plans, led, {MODELS[0]: 0.6, MODELS[1]: 0.95}, rng)
    added = coder_ledger.add_runs(led, j1, draws, plans, CFG)
    assert added["with_draw"] == 30 and sum(added["left_out"].values()) == 1  # the bandit's run, counted
    strong = next(c for c in led.of("coder") if coder_ledger.model_of(c) == MODELS[1])
    led.transition(strong.id, "accepted", night="day-01", reason="test: a pin, so the next plan is 70/30")
    led.transition(coder_ledger.sibling(led, strong).id, "dropped", night="day-01", reason="a round pins one model")
    led.save(path)
    _, plan2, envs2, plans = _night(tmp_path, 2, 30)
    assert sorted(a.probability for a in plan2.levers["coder"]) == pytest.approx([CFG.explore_share,
                                                                                  1 - CFG.explore_share])
    led = Ledger.load(path)
    draws = _records(tmp_path, plans, [1, 2])
    j2 = _journal(envs2, draws, plans, led, {MODELS[0]: 0.6, MODELS[1]: 0.95}, rng)
    coder_ledger.add_runs(led, j2, draws, plans, CFG)
    got = ln.recompute_online(led, j1 + j2, draws, plans, CFG)
    p = got[strong.id]
    assert p["units_equal"] and p["units"] == 60 and p["difference"] == 0.0
    shares = {str(Fraction(t, assign.SCALE)) for a in plan2.levers["coder"] for t in [a.threshold]}
    assert {x for pair in p["probabilities"] for x in pair} == {"1/2"} | shares  # exact fractions, both plans
    # the pin's probation stream was fed the night-2 runs only
    assert led.standing(strong.id)["probation_n"] == 30
    # a threshold edited after the draw: read_records names the line, the draw is no evidence
    rec = tmp_path / "nights" / "night-02" / assign.RECORDS_NAME
    lines = rec.read_text().splitlines()
    first = json.loads(lines[0])
    first["arms"]["coder"]["threshold"] += 1
    rec.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n")
    _, bad = assign.read_records(rec, plans)
    assert len(bad) == 1 and f"{rec}:1" in bad[0]


def test_the_journal_checks_count_a_wrong_trace_a_wrong_model_and_a_run_without_a_coder(tmp_path):
    _, _, envs, plans = _night(tmp_path, 1, 6)
    led = Ledger.load(tmp_path / "data" / "decisions" / "ledger.json")
    draws = _records(tmp_path, plans, [1])
    runs, traces, journal = [], {}, []
    for i, (run, env) in enumerate(envs.items()):
        m = coder_ledger.model_of(led.get(draws[env["SAGE_TRACE_ID"]]["levers"]["coder"]["candidate"]))
        runs.append({"run": run, "env": env, "sessions": [f"s{i}"]})
        traces[f"s{i}"] = env["SAGE_TRACE_ID"] if i != 1 else "another"  # run 1: its journal logged another id
        logged = (MODELS[0] if m == MODELS[1] else MODELS[1]) if i == 2 else (None if i == 3 else m)
        journal.append(CoderRun(f"s{i}", traces[f"s{i}"], 1.0, logged))
    runs.append({"run": "no-draw", "env": {}, "sessions": ["x"]})
    got = ln.journal_checks(runs, traces, journal, draws, plans)
    c = got["counts"]
    assert c[ln.DRAWN] == 6 and c["runs without a draw"] == 1
    assert c[ln.TRACE_OK] == 5 and c["trace: journal lacks or differs"] == 1
    assert c[ln.MODEL_OK] == 4 and c["model: journal's coder differs"] == 1 and c[ln.NO_CODER] == 1
    assert any("another" in p for p in got["problems"]) and any("SAGE's coder logged" in p for p in got["problems"])


def test_the_world_shift_moves_to_the_stronger_model_at_the_drift_night():
    cfg = ln.DecisionE2EConfig(coder_gap=0.5, drift_night=3)
    assert [ln.world_shift(cfg, n, "w", "s") for n in (1, 2, 3, 9)] == [{"w": -0.5}] * 2 + [{"s": -0.5}] * 2
    assert ln.world_shift(cfg.model_copy(update={"drift_night": None}), 9, "w", "s") == {"w": -0.5}
    assert ln.world_shift(cfg.model_copy(update={"coder_gap": 0.0}), 1, "w", "s") == {}
    with pytest.raises(ValueError):
        ln.DecisionE2EConfig(coder_gap=1.5)


def test_each_transition_is_judged_against_the_exact_truth(tmp_path):
    led = Ledger()
    a, b = coder_ledger.open_round(led, MODELS, "day-00")
    truth = {"models": {MODELS[0]: {"task_v1": 0.70}, MODELS[1]: {"task_v1": 0.90}}}
    moves = [{"id": b.id, "to": "accepted", "reason": "evidence"},
             {"id": a.id, "to": "dropped", "reason": f"{b.id} pinned the coder: a round pins one model"},
             {"id": a.id, "to": "accepted", "reason": "evidence"}, {"id": b.id, "to": "reverted", "reason": "x"},
             {"id": a.id, "to": "reverted", "reason": "x"}, {"id": a.id, "to": "pending", "reason": "proposed"}]
    got = ln.judge(moves, led, truth, 0.031)
    assert [g["right"] for g in got] == [True, True, False, False, True, None]
    assert got[0]["true_gain"] == pytest.approx(0.2) and got[2]["true_gain"] == pytest.approx(-0.2)
    assert ln.judge(moves[:1], led, {"runs": 0}, 0.031)[0]["right"] is None  # no valued run: no verdict


@pytest.fixture(scope="module")
def world() -> ModelWorld:
    return build_world(SAGE_TABLE, n_tasks=21, task_seed=5, config=WorldConfig())


def test_the_arms_truth_is_each_pinned_tables_exact_value_under_the_nights_world(world):
    runs = [{"run": f"r{i}", "task_id": t.task_id, "complexity": 0.4, "worker": i % 2, "trace_id": f"d{i}"}
            for i, t in enumerate(world.tasks)] + [{"run": "cut", "task_id": world.tasks[0].task_id,
                                                    "complexity": None, "trace_id": "dx"}]
    weak, strong = ln.ranked(world, MODELS)
    assert weak == "qwen2.5-coder:1.5b"
    world.config = WorldConfig()
    calm = ln.arm_truth(world, runs, TABLE, MODELS, ln.DecisionE2EConfig().objective)
    assert calm["runs"] == len(world.tasks) and "dx" not in calm["per_run"]  # a run without complexity: not valued
    from sage_pipeline.sage_world import truth as T

    for m in MODELS:  # the mean of the per-run values is the pinned bundle's exact value
        b = T.bundle_value(world, ln.truth_rows(runs), T.BundleSpec(T.SagePolicy(pin(TABLE, "coder", m)), None, m),
                           ln.DecisionE2EConfig().objective)
        assert calm["models"][m]["task_v1"] == pytest.approx(b.objective, abs=1e-12)
        assert np.mean([v[m] for v in calm["per_run"].values()]) == pytest.approx(b.objective, abs=1e-12)
    world.config = WorldConfig(coder_shift={strong: -0.65})
    turned = ln.arm_truth(world, runs, TABLE, MODELS, ln.DecisionE2EConfig().objective)
    world.config = WorldConfig()
    assert turned["models"][weak] == calm["models"][weak]
    assert turned["models"][strong]["verified"] < calm["models"][strong]["verified"] - 0.1
    assert ln.arm_truth(world, runs[-1:], TABLE, MODELS, ln.DecisionE2EConfig().objective) == {"runs": 0}


def test_the_summary_finds_the_accept_the_revert_after_the_drift_and_counts_wrong_ones():
    def night(n, moves, counts=None):
        cands = [{"state": "pending", "state_before": "pending", "interval": [-0.1, 0.3],
                  "true_mean_gain_on_its_runs": 0.2 if n != 3 else 0.4},
                 {"state": "dropped", "state_before": "dropped", "interval": [-1, 1], "true_mean_gain_on_its_runs": 2}]
        return {"night": n, "transitions": moves, "journal": {"counts": counts or {ln.DRAWN: 2, ln.TRACE_OK: 2}},
                "candidates": cands,
                "recomputed": {"c": {"units_equal": True, "difference": 0.0}}, "records_problems": [],
                "runs": {"runs": 2, "finished": 2}, "seconds": {"runs": 3.0, "night": 1.0}}
    rep = {"config": {"drift_night": 4}, "seconds": 20.0, "nights": [
        night(1, []), night(2, [{"id": "coder-0002", "to": "accepted", "right": True, "true_gain": 0.2,
                                 "model": "14b", "reason": ""}]),
        night(3, []), night(4, []),
        night(5, [{"id": "coder-0002", "to": "reverted", "right": True, "true_gain": -0.1, "model": "14b",
                   "reason": ""}, {"id": "coder-0004", "to": "accepted", "right": False, "true_gain": -0.1,
                                   "model": "1.5b", "reason": ""}])]}
    s = ln.summary(rep)
    assert s["first_accept"]["night"] == 2 and s["first_accept"]["right"] is True
    assert s["revert_after_drift"] == {"night": 5, "id": "coder-0002", "nights_after_drift": 2, "right": True,
                                       "true_gain": -0.1}
    assert (s["transitions_judged"], s["transitions_wrong"]) == (3, 1) and s["runs"] == 10
    assert s["checks"][ln.TRACE_OK] == 10 and s["evidence_recomputed_max_difference"] == 0.0
    assert math.isclose(s["runs_per_minute"], 40.0)
    assert s["confidence_sequence_covers_truth"] == "4 of 5 candidate-nights"  # a closed one is not counted


def test_the_night_table_shows_arms_truth_candidates_and_checks():
    weak, strong = MODELS
    cand = {"id": "coder-0002", "model": strong, "state": "reverted", "state_before": "accepted", "estimate": 0.09,
            "interval": [-0.07, 0.26], "evidence": 7.3, "needed": 125.0, "revert_evidence": 50.8,
            "revert_needed": 20.0, "true_mean_gain_on_its_runs": 0.061}
    closed = {**cand, "id": "coder-0001", "state": "dropped", "state_before": "dropped"}
    rep = {"models": {"weak": weak, "strong": strong}, "nights": [{
        "night": 8, "world": {"coder_shift": {strong: -0.65}},
        "arms": [{"model": strong, "probability": 0.7, "runs": 31}, {"model": weak, "probability": 0.3, "runs": 9}],
        "truth": {"models": {strong: {"verified": 0.746, "gpu_seconds": 15.7}, weak: {"verified": 0.907,
                                                                                     "gpu_seconds": 6.8}}},
        "true_gap_strong_minus_weak": -0.163, "candidates": [cand, closed],
        "transitions": [{"id": "coder-0002", "to": "reverted", "right": True},
                        {"id": "coder-0003", "to": "pending", "right": None}],
        "pinned_after": None, "journal": {"counts": {ln.DRAWN: 40, ln.TRACE_OK: 40, ln.MODEL_OK: 39, ln.NO_CODER: 1}},
        "recomputed": {"coder-0002": {"difference": None}, "coder-0003": {"difference": 0.0}}}]}
    row = ln.night_table(rep)[0]
    assert row["world"] == "14B -0.65" and row["arms (p exact, runs)"] == "14B 0.70 (31); 1.5B 0.30 (9)"
    assert row["true verified 14B/1.5B"] == "0.746/0.907" and row["true task_v1 gap"] == "-0.163"
    led = row["ledger (estimate [CS], evidence/needed, true mean gain on its runs)"]
    assert "revert 50.8/20" in led and "coder-0001" not in led  # the night's revert shown, a long-closed one not
    assert row["transitions (right?)"] == "coder-0002 reverted (right); coder-0003 pending"
    assert (row["trace ids in journal"], row["coder = arm's pin"]) == ("40/40", "39/39")
    assert row["evidence recomputed, max diff"] == "0.0" and row["pinned"] == "none"
