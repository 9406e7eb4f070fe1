"""One short day of SAGE's own `sage run` against the model world, end to end: SAGE writes its
journals, the offline chain (the project's assets) ingests them, a checkpoint is written, and SAGE
loads it. Runs SAGE from SAGE_PYTHON (`make test SAGE_SRC=...`; skipped or failed by the rule in
sage_contract/sage_journals.py)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from sage_pipeline.routing import routing_dataset as rd
from sage_pipeline.sage_world import loop as sl
from sage_pipeline.sage_world.harness import SageInstall
from sage_pipeline.sage_world.world import build_world

TASKS = 6
FAST = {"cql_policy": {"steps": 200, "n_boot": 30}, "bc_policy": {"epochs": 10}, "offline_eval": {"n_boot": 100}}


@pytest.fixture(scope="module")
def day(sage_python, tmp_path_factory):
    from sage_pipeline.defs.sage_loop_assets import offline_chain

    install = SageInstall.find(sage_python)
    root = tmp_path_factory.mktemp("sage_loop") / "loop"
    world = build_world(install.models_yaml, n_tasks=24, task_seed=1)
    cfg = sl.LoopConfig(days=1, tasks_per_day=TASKS, pool=24, seed=1, sage_bench=False)
    report = sl.run_loop(install, root, lambda d, dirs, rate: offline_chain(d, dirs, rate, install.models_yaml, FAST),
                         cfg, world=world)
    return install, root, world, report


def _journal_events(root: Path) -> list[dict]:
    out = []
    for f in sorted(root.glob("days/day-01/ws-*/memory/sessions/*.log")):
        out += [json.loads(ln) for ln in f.read_text().splitlines() if ln.startswith("{")]
    return out


def test_every_sage_run_finishes_and_writes_its_journal(day):
    install, root, world, report = day
    d = report.days[0]
    assert d["runs"]["runs"] == TASKS and d["runs"]["finished"] == TASKS and d["runs"]["failures"] == {}
    events = _journal_events(root)
    assert d["runs"]["journal_lines"] >= len(events) > 0
    # one SAGE session per run (`sage run` sets a fresh SAGE_SESSION_ID): the runs' sessions are the journals'
    runs = [json.loads(ln) for ln in (root / "days" / "day-01" / "runs.jsonl").read_text().splitlines()]
    assert [len(r["sessions"]) for r in runs] == [1] * TASKS
    assert {r["sessions"][0] for r in runs} == {e["session_id"] for e in events}
    assert all(r["coder_model"] and r["complexity"] is not None for r in runs) and d["runs_valued"] == TASKS
    # the truth is beside the run, never in SAGE's journals
    truth = [json.loads(ln) for ln in (root / "truth" / "day-01.jsonl").read_text().splitlines()]
    assert {t["run"] for t in truth if t.get("run")} == {f"d01-r{i:03d}" for i in range(TASKS)}
    assert not any("p_right" in e or "slot_after" in e for e in events)


def test_sage_ran_the_exploring_checkpoint_it_was_given(day):
    """Day 1's checkpoint explores at SAGE_RL_MIN_CONFIDENCE 0.1: every draw is confident, so every
    decision of a role SAGE consults is 'learned' (SAGE loaded it); the coder logs none."""
    install, root, world, report = day
    mrd = [e for e in _journal_events(root) if e["type"] == "MODEL_ROUTING_DECISION"]
    assert mrd and {e["policy_source"] for e in mrd if e["agent_role"] in ("reviewer", "debugger")} == {"learned"}
    assert not any(e["agent_role"] == "coder" for e in mrd)


def test_the_offline_chain_ingested_sages_journals_and_reconstructed_their_probabilities(day):
    install, root, world, report = day
    data = root / "data"
    quarantine = data / "routing" / "quarantine.jsonl"
    assert not quarantine.exists() or quarantine.read_text().strip() == ""  # no valid SAGE line quarantined
    df = rd.read_routing_dataset(data / "routing" / rd.PARQUET_NAME)
    assert (df["role"] == "coder").sum() > 0
    assert set(df.loc[df["role"] == "coder", "policy_source"]) == {"ucb_bandit"}
    routed = df[df["role"] != "coder"]
    assert (routed["propensity_source"] == "reconstructed").all() and routed["propensity"].notna().all()
    # the truth's check reads the same rows: every decision belongs to one of the day's runs
    check = report.days[0]["truth_check"]
    assert check["runs"] == TASKS and check["realized_mean"] == pytest.approx(df["reward"].sum() / TASKS)


def test_a_checkpoint_is_written_and_sage_loads_it(day):
    install, root, world, report = day
    ckpt = root / "data" / "checkpoints" / "sage" / "policy.joblib"
    assert ckpt.is_file()
    manifest = json.loads((ckpt.parent / "manifest.json").read_text())
    env = {**os.environ, "SAGE_RL_POLICY": "1", "SAGE_RL_CHECKPOINT": str(ckpt),
           "SAGE_RL_MIN_CONFIDENCE": str(manifest["min_confidence"])}
    out = subprocess.run([str(install.python), "-c", "from sage.rl.policy import get_routing_policy as g; p = g(); "
                          "print(p is not None, p.predict_proba_fallback('debugger', 0.1, 1))"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded, probs = out.stdout.strip().split(" ", 1)
    assert loaded == "True" and probs.startswith("(")
    assert report.days[0]["chain"]["sage_router_checkpoint"]["written"] is True


def test_sages_own_bench_runs_against_the_world_beside_the_truth(day, tmp_path):
    """`sage bench --compare-policy`: SAGE's six prompts become world tasks (the same task in both
    arms), and its per-arm pass rate stands beside what the world saw and its exact expectation."""
    from sage_pipeline.sage_world.bench import run_sage_bench
    from sage_pipeline.sage_world.server import WorldServer

    install, root, world, report = day
    world.config = world.config.model_copy(update={"adopt_unmarked": True})
    ckpt = root / "data" / "checkpoints" / "sage"
    with WorldServer(world) as srv:
        rep = run_sage_bench(world, srv.url, install, tmp_path / "bench", ckpt, 0.1)
    assert rep["cases"] == 6 and rep["sage_reports_interval"] is False
    static, learned = rep["arms"]["static"]["cases"], rep["arms"]["learned"]["cases"]
    assert [c["task_id"] for c in static] == [c["task_id"] for c in learned]  # paired by prompt
    for c in static + learned:
        # SAGE completes a task only through its verification gate: never with a wrong file (a right one can
        # still fail, if its reviewer says FAIL at every try)
        assert c["sage_test_pass_rate"] <= float(c["right_file"]) and 0 < c["expected_verified"] <= 1
    # like for like (the learned run with the static run's coder model and none of its files): the checkpoint's
    # own effect; as SAGE ran them the arms also differ by its coder bandit's state and the files left behind
    assert all(c["expected_verified_fresh"] is not None for c in static + learned)
    assert rep["true_delta_same_tasks_fresh"] == pytest.approx(
        sum(c["expected_verified_fresh"] for c in learned) / 6 - sum(c["expected_verified"] for c in static) / 6)
    lo, hi = rep["bootstrap_ci_of_sage_delta"]
    assert lo <= rep["sage_delta"] <= hi and rep["agrees"] == (lo <= rep["true_delta_same_tasks"] <= hi)


def test_each_day_reports_the_objective_of_the_deployed_shipped_and_best_bundles(day):
    _, _, _, report = day
    d = report.days[0]
    b = d["bundle"]
    assert b["runs"] == d["runs_valued"] > 0
    for k in ("deployed", "shipped", "best"):
        assert 0 <= b[k]["p_verified"] <= 1 and b[k]["gpu_seconds"] > 0 and b[k]["calls"] >= 3
    assert b["best"]["objective"] >= max(c["objective"] for c in b["candidates"]) - 1e-12
    lever = d["coder_lever"]
    assert lever["promoted"] is False and lever["reason"]  # six tasks never separate a coder model
    goals = report.goals()
    assert {"last_day_objective_gap_closed", "bundle_promotions", "wrong_bundle_promotions"} <= set(goals)


def test_a_pinned_coder_reaches_sage_through_its_models_yaml(sage_python, tmp_path, monkeypatch):
    """When the coder lever promotes, the next day SAGE's unchanged `sage run` reads the bundle's models.yaml
    (SAGE_MODELS_YAML) and its coder writes every file with the pinned model."""
    from sage_pipeline.defs.sage_loop_assets import offline_chain
    from sage_pipeline.rl import coder_lever

    big = "qwen2.5-coder:14b-instruct-q4_K_M"
    real = coder_lever.decide

    def promote(tasks, objective, config=None, current=None):
        d = real(tasks, objective, config, current)
        if current is None:
            d.promote, d.model, d.reason = True, big, "forced by the test"
        return d

    monkeypatch.setattr(coder_lever, "decide", promote)
    install = SageInstall.find(sage_python)
    world = build_world(install.models_yaml, n_tasks=24, task_seed=2)
    # 10 runs a day: SAGE's session ids are random and routing_dataset puts a fifth of sessions in eval, and
    # bc_policy needs 2 train sessions; with 4 runs it got fewer one night in ~35 (CI saw it), with 10 ~1 in 10^5
    cfg = sl.LoopConfig(days=2, tasks_per_day=10, pool=24, seed=2, sage_bench=False, start="yaml",
                        coder_decisions="bootstrap")  # the one-night rule this test forces (the ledger's: decisions/)
    report = sl.run_loop(install, tmp_path / "loop", lambda d, dirs, rate: offline_chain(
        d, dirs, rate, install.models_yaml, FAST), cfg, world=world)
    assert report.days[0]["coder_lever"]["promoted"] is True
    assert (tmp_path / "loop" / "bundles" / "day-02" / "models.yaml").is_file()
    runs = [json.loads(x) for x in (tmp_path / "loop" / "days" / "day-02" / "runs.jsonl").read_text().splitlines()]
    assert runs and all(r["coder_model"] == big for r in runs if r["coder_model"])
    assert report.days[1]["bundle"]["deployed"]["coder_share"] == {big: 1.0}


def test_each_night_judges_the_task_objective_and_runs_sages_own_phase5_tools(day):
    """The router checkpoint's candidate is judged under task_v1 (offline_eval's objective), its truth
    the same quantity; SAGE's own `sage rl` tools ran on the same journals and their claim is recorded."""
    _, _, _, report = day
    d = report.days[0]
    assert d["judged_on"] == "task_v1"
    p5 = d["sage_phase5"]
    assert p5["rows_exported"] > 0 and set(p5["checkpoints"]) == {"bc", "cql"}
    row = sl.day_row(d)
    assert row["judged on"] == "task_v1" and row["SAGE rows"] == p5["rows_exported"]
