"""The promotion gate and promotion: OPE decides, the metadata says why."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sage_pipeline.rl import offline_eval as oe, ope
from sage_pipeline.routing.reward import RewardSpec

N_EPISODES = 400
_RNG = np.random.default_rng(0)
NOISE = _RNG.standard_normal(N_EPISODES)  # shared by the hand-made evaluations below
NOISE = (NOISE - NOISE.mean()) / NOISE.std()  # mean 0, sd 1 exactly


def _eval(name: str, value: float | None, lo: float | None = None, hi: float | None = None,
          reason: str | None = None, terms: np.ndarray | None = None):
    """A hand-made evaluation; with ``terms`` (per-episode) its value and interval are theirs."""
    if terms is not None:
        value = float(terms.mean())
        se = float(terms.std(ddof=1) / np.sqrt(len(terms)))
        lo, hi = value - 1.96 * se, value + 1.96 * se
    units = np.array([f"e{i}" for i in range(N_EPISODES)])
    est = {k: ope.EstimatorResult(k, "episode", value, lo, hi, None,
                                  None if terms is None else ope.Estimate(k, value, terms), units)
           for k in ("pdis", "step_dr", "step_dr_clip")}
    return ope.PolicyEvaluation(policy=name, estimates=est, n_decisions=N_EPISODES, n_episodes=N_EPISODES,
                                n_bandit_rounds=N_EPISODES, ess=5.0, ess_episode=5.0, max_weight=1.0,
                                support_share=1.0, unsupported_mass=0.0, no_support_reason=reason,
                                config=ope.OPEConfig(n_boot=2000))


def test_value_gate_promotes_only_when_the_lower_bound_beats_the_static_estimate():
    evals = {"static_table": _eval("static_table", 0.80, 0.75, 0.85),
             "bc": _eval("bc", 0.82, 0.79, 0.85),  # lower bound below 0.80: not enough
             "cql": _eval("cql", 0.90, 0.83, 0.97)}
    gate = oe.promotion_gate(evals, gate=oe.PromotionGateConfig(rule="value"))
    assert gate.promoted == "cql" and gate.static_estimate == 0.80 and gate.rule == "value"
    assert gate.candidates["bc"]["passed"] is False
    assert "0.7900 <= static_table estimate 0.8000" in gate.candidates["bc"]["why"]
    evals["cql"] = _eval("cql", 0.90, 0.80, 0.97)  # a tie is not a win
    gate = oe.promotion_gate(evals, gate=oe.PromotionGateConfig(rule="value"))
    assert gate.promoted is None and gate.reason.startswith("no policy promoted")


def test_paired_gate_refuses_a_tie_the_value_gate_promoted():
    # Where two deterministic policies disagree, the logged action follows one or the other, so
    # their per-episode DR terms are anti-correlated: the candidate's own interval is narrow, but
    # the difference is twice as noisy. Here the candidate is +0.04 on these episodes by noise alone.
    static = _eval("static_table", None, terms=0.80 - 0.02 - 0.3 * NOISE)
    cand = _eval("cql", None, terms=0.80 + 0.02 + 0.3 * NOISE)
    evals = {"static_table": static, "cql": cand}
    old = oe.promotion_gate(evals, gate=oe.PromotionGateConfig(rule="value"))
    assert old.promoted == "cql"  # its lower bound 0.82 - 0.029 > the table's 0.78
    gate = oe.promotion_gate(evals)
    assert gate.rule == "paired" and gate.promoted is None
    c = gate.candidates["cql"]
    assert c["difference"] == pytest.approx(0.04) and c["difference_ci_low"] < 0 < c["difference_ci_high"]
    assert "paired difference with static_table +0.0400" in c["why"] and "<= 0" in c["why"]


def test_paired_gate_promotes_a_small_real_gain_the_value_gate_refused():
    # the two policies share their noise (they act alike in most episodes) and the candidate
    # gains 0.02 on every episode: the value gate sees only the candidate's wide interval
    base = 0.80 + 0.3 * NOISE
    evals = {"static_table": _eval("static_table", None, terms=base),
             "cql": _eval("cql", None, terms=base + 0.02 + 0.01 * np.roll(NOISE, 7))}
    assert oe.promotion_gate(evals, gate=oe.PromotionGateConfig(rule="value")).promoted is None
    gate = oe.promotion_gate(evals)
    assert gate.promoted == "cql" and gate.candidates["cql"]["difference_ci_low"] > 0.015
    # a bar of 3% of the table's value (0.024) is more than the gain's lower bound
    high = oe.promotion_gate(evals, gate=oe.PromotionGateConfig(min_gain=0.03))
    assert high.promoted is None and "0.03 x |static_table estimate| = 0.0240" in high.reason
    assert oe.promotion_gate(evals, gate=oe.PromotionGateConfig(min_gain=0.01)).promoted == "cql"
    with pytest.raises(ValueError, match="min_gain"):
        oe.PromotionGateConfig(min_gain=-0.1)
    with pytest.raises(ValueError, match="rule"):
        oe.PromotionGateConfig(rule="vibes")


def test_paired_gate_needs_per_episode_terms():
    evals = {"static_table": _eval("static_table", 0.80, 0.75, 0.85), "cql": _eval("cql", 0.90, 0.83, 0.97)}
    with pytest.raises(ValueError, match="no per-unit terms"):
        oe.promotion_gate(evals)


def test_gate_reads_the_clipped_step_wise_dr_not_plain_step_wise_dr():
    assert oe.GATE_ESTIMATOR == ope.HEADLINE_ESTIMATOR == "step_dr_clip"
    base = 0.80 + 0.3 * NOISE
    evals = {"static_table": _eval("static_table", None, terms=base), "cql": _eval("cql", None, terms=base + 0.001)}
    # plain step-wise DR above the table (its unclipped weights), the clipped estimate a tie
    heavy = base + 0.05
    evals["cql"].estimates["step_dr"] = ope.EstimatorResult("step_dr", "episode", float(heavy.mean()), None, None,
                                                            None, ope.Estimate("step_dr", float(heavy.mean()), heavy),
                                                            evals["cql"].estimates["step_dr"].units)
    gate = oe.promotion_gate(evals, gate=oe.PromotionGateConfig(min_gain=0.005))
    assert gate.promoted is None and gate.estimator == "step_dr_clip"
    assert oe.promotion_gate(evals, estimator="step_dr", gate=oe.PromotionGateConfig(min_gain=0.005)).promoted == "cql"


def test_gate_picks_the_best_lower_bound_and_reports_no_support():
    base = 0.80 + 0.3 * NOISE
    evals = {"static_table": _eval("static_table", None, terms=base),
             "a": _eval("a", None, terms=base + 0.15 + 0.8 * np.roll(NOISE, 3)),  # larger gain, far noisier
             "b": _eval("b", None, terms=base + 0.10 + 0.01 * np.roll(NOISE, 5)),
             "c": _eval("c", None, None, None, reason="no support: puts mass on coder->opus")}
    gate = oe.promotion_gate(evals)
    assert gate.promoted == "b" and gate.candidates["a"]["passed"]
    assert gate.candidates["a"]["difference_ci_low"] < gate.candidates["b"]["difference_ci_low"]
    assert gate.candidates["c"]["why"].startswith("no support")
    no_static = oe.promotion_gate({"static_table": _eval("static_table", None, None, None, reason="no support: x")})
    assert no_static.promoted is None and "static table has no step_dr_clip estimate" in no_static.reason


def test_promote_copies_atomically_and_keeps_the_last_promotion_when_none(tmp_path):
    src = tmp_path / "cql"
    src.mkdir()
    (src / "policy.json").write_text("{}")
    dest = tmp_path / "promoted"
    gate = oe.GateDecision("cql", "promoted cql: because")
    assert oe.promote(gate, {"cql": src}, dest, {"summary": []}) == dest
    assert json.loads((dest / "promotion.json").read_text())["reason"] == "promoted cql: because"
    assert oe.promote(oe.GateDecision(None, "no policy promoted: x"), {"cql": src}, dest, {}) is None
    assert (dest / "promotion.json").is_file()  # the previous promotion stays
    with pytest.raises(FileNotFoundError, match="checkpoint of promoted policy 'bc'"):
        oe.promote(oe.GateDecision("bc", "promoted bc"), {"bc": tmp_path / "missing"}, dest, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cql", "promoted"]


def test_regret_closure():
    assert oe.regret_closure(0.9, 0.8, 1.0) == pytest.approx(0.5)
    assert oe.regret_closure(0.7, 0.8, 1.0) == pytest.approx(-0.5)
    assert oe.regret_closure(0.9, 0.8, 0.8) is None


def test_ground_truth_of_the_oracle_is_the_optimum(sim):
    tasks = sim.sample_tasks(300, np.random.default_rng(0))
    from sage_pipeline.routing.policy import StaticTablePolicy
    gt = oe.ground_truth(sim, tasks, {"static_table": StaticTablePolicy(sim.table, sim.catalogue)})
    assert gt.episode_value["oracle"] == pytest.approx(sim.optimal_value(tasks).mean)
    assert gt.episode_value["oracle"] > gt.episode_value["static_table"]
    assert gt.n_tasks == 300


def test_eval_parts_split_eval_sessions_in_two_stable_disjoint_halves():
    import pandas as pd

    sessions = [f"s{i}" for i in range(400)]
    df = pd.DataFrame({"session_id": sessions * 2, "split": ["eval"] * 600 + ["train"] * 200})
    sel, rep = oe.eval_part(df, "select"), oe.eval_part(df, "report")
    assert set(sel["session_id"]).isdisjoint(rep["session_id"])
    assert len(sel) + len(rep) == 600 and (sel["split"] == "eval").all() and (rep["split"] == "eval").all()
    assert 0.35 < len(sel) / 600 < 0.65
    again = oe.eval_part(df.iloc[::-1], "select")  # stable whatever the row order or other rows
    assert set(again["session_id"]) == set(sel["session_id"])
    with pytest.raises(ValueError, match="part must be 'select' or 'report'"):
        oe.eval_part(df, "test")


@pytest.fixture(scope="module")
def logged_frame(tmp_path_factory):
    import pyarrow.parquet as pq

    from sage_pipeline.routing.catalogue import ModelCatalogue
    from sage_pipeline.routing.collector import CollectorConfig, collect
    from sage_pipeline.routing.ingest import IngestConfig, ingest
    from sage_pipeline.routing.routing_dataset import DatasetConfig, build_routing_dataset
    from sage_pipeline.routing.routing_simulator import RoutingSimulator
    from sage_pipeline.routing.table import RoutingTable

    tmp = tmp_path_factory.mktemp("logged")
    cat = ModelCatalogue.load()
    tab = RoutingTable.load()
    sim = RoutingSimulator(cat, tab)
    collect(sim, tmp / "sessions", CollectorConfig(episodes=4000, seed=5), progress=lambda s: None)
    traj = ingest(IngestConfig((tmp / "sessions",)), tmp / "routing")
    df = build_routing_dataset(pq.read_table(traj.trajectories).to_pandas(), tab, cat,
                               DatasetConfig(eval_fraction=0.5)).frame
    return sim, df


def test_selection_by_ope_ranks_by_the_criterion_and_never_reads_ground_truth(logged_frame):
    from sage_pipeline.routing.policy import StaticTablePolicy, UniformPolicy

    sim, df = logged_frame
    cat = sim.catalogue
    cands = {"static": StaticTablePolicy(sim.table, cat), "uniform": UniformPolicy(cat.actions, cat.role_mask()),
             "oracle": sim.oracle_policy()}
    select = oe.eval_part(df, "select")
    cfg = ope.OPEConfig(n_boot=100)
    for criterion in oe.SELECTION_CRITERIA:
        best, evals = oe.select_by_ope(cands, select, cat, cfg, criterion, progress=lambda s: None)
        key = oe.SELECTION_ESTIMATOR[criterion]
        scores = {n: (e.estimates[key].ci_low if criterion == "lower_bound" else e.estimates[key].value)
                  for n, e in evals.items()}
        assert best == max(scores, key=scores.get), (criterion, scores)
    # the oracle is clearly the best and the uniform policy the worst: FQE ranks all three right
    best, evals = oe.select_by_ope(cands, select, cat, cfg, "fqe", progress=lambda s: None)
    fqe = {n: e.estimates["fqe"].value for n, e in evals.items()}
    truth = {n: sim.policy_value(p, oe.eval_tasks(ope.LoggedData.from_frame(select, cat.actions))).mean
             for n, p in cands.items()}
    assert best == "oracle" and sorted(fqe, key=fqe.get) == sorted(truth, key=truth.get)
    with pytest.raises(ValueError, match="criterion must be one of"):
        oe.select_by_ope(cands, select, cat, cfg, "truth")


def test_train_select_cql_keeps_the_alpha_ope_prefers_and_tables_every_alpha(logged_frame):
    from sage_pipeline.rl import cql

    sim, df = logged_frame
    sel = oe.train_select_cql(df, sim.catalogue, cql.CQLConfig(steps=300), (0.01, 3.0),
                              ope.OPEConfig(n_boot=50), progress=lambda s: None)
    rows = {r["alpha"]: r for r in sel.table}
    assert set(rows) == {"alpha=0.01", "alpha=3"} and sum(r["chosen"] for r in rows.values()) == 1
    assert rows[sel.label]["fqe"] == max(r["fqe"] for r in rows.values())
    assert sel.result.config.alpha == float(sel.label.split("=")[1])
    assert sel.how == "fqe estimate on the eval split's select part"
    select = oe.eval_part(df, "select")
    assert sel.n_episodes == select["episode_id"].nunique()
    assert (sel.warning is None) == (sel.n_episodes >= oe.MIN_RELIABLE_EPISODES)


def test_sample_size_warning_names_the_count_and_what_to_do():
    assert oe.sample_size_warning(oe.MIN_RELIABLE_EPISODES, "report") is None
    w = oe.sample_size_warning(480, "select")
    assert "select half has 480 episodes" in w and "alpha chosen" in w and "eval_fraction" in w
    assert "estimates" in oe.sample_size_warning(10, "report")


def test_ground_truth_only_where_the_simulator_knows_every_judged_decision_and_model(tmp_path, sim):
    """Real journals beside the synthetic ones can add models the simulator does not know; when the judged
    half happened to hold synthetic sessions only, offline_eval handed the simulator policies over those
    models and crashed ("policy 'static_table' orders its actions ..."; found while building
    benchmarks/fault_injection.py). Now there is no ground truth, and the reason says why."""
    import pandas as pd

    from sage_pipeline.routing.collector import CollectorConfig, collect

    res = collect(sim, tmp_path / "sessions" / "synthetic", CollectorConfig(episodes=20), versions_dir=tmp_path / "v")
    synthetic = pd.DataFrame({"data_source": ["synthetic"] * 3})
    got, why = oe.ground_truth_simulator(res.manifest, sim.catalogue, sim.table, RewardSpec(), synthetic, sim.actions)
    assert got is not None and got.actions == sim.actions and why == "simulator"
    got, why = oe.ground_truth_simulator(res.manifest, sim.catalogue, sim.table, RewardSpec(), synthetic,
                                         (*sim.actions, "llama3.1:8b"))
    assert got is None and "the logs add ['llama3.1:8b']" in why
    mixed = pd.DataFrame({"data_source": ["synthetic", "real"]})
    assert oe.ground_truth_simulator(res.manifest, sim.catalogue, sim.table, RewardSpec(), mixed,
                                     sim.actions)[0] is None
    got, why = oe.ground_truth_simulator(tmp_path / "none.json", sim.catalogue, sim.table, RewardSpec(), synthetic,
                                         sim.actions)
    assert got is None and "no simulator manifest" in why
