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
    from sage_pipeline.sage.table import RoutingTable

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


# ---------------------------------------------------------------- any journal set SAGE writes (issue 32)
def _report(evals: dict, **kw) -> oe.OfflineEvalReport:
    return oe.OfflineEvalReport(evals, None, oe.GateDecision(None, "no policy promoted: x"), **kw)


def test_plot_draws_intervals_that_exclude_or_lack_their_estimate():
    """A percentile interval over few sessions can exclude its own estimate (a ratio), and too few sessions
    give none: the plot raised "'yerr' must not contain negative values"; now it draws what there is."""
    evals = {"static_table": _eval("static_table", 0.80, 0.82, 0.90),  # the estimate below its interval
             "cql": _eval("cql", 0.85, None, None),  # no interval (too few sessions)
             "bc": _eval("bc", None, None, None, reason="no support: x")}
    assert oe.plot_offline_eval(_report(evals))[:8] == b"\x89PNG\r\n\x1a\n"
    assert oe.plot_offline_eval(_report({}, interval_reason="0 sessions; a 95% interval needs at least 20"))[:4] \
        == b"\x89PNG"


def test_sample_size_warning_counts_sessions_not_only_episodes():
    assert oe.sample_size_warning(5000, "report", n_sessions=oe.MIN_SESSIONS) is None
    w = oe.sample_size_warning(5000, "report", n_sessions=3)
    assert "report half has 3 sessions, under the 20 a 95% interval needs" in w
    assert "no interval is given and the gate refuses" in w and "SAGE_SESSION_ID" in w
    both = oe.sample_size_warning(76, "select", n_sessions=4, min_sessions=30)
    assert "select half has 76 episodes" in both and "and 4 sessions, under the 30" in both
    assert oe.MIN_SESSIONS == ope.OPESettings.model_fields["min_sessions"].default  # declared once


def test_an_empty_report_half_is_a_report_that_says_so_not_an_error(logged_frame):
    """An eval split (or its report half) without sessions raised "the eval split is empty"."""
    from sage_pipeline.routing.policy import StaticTablePolicy

    sim, df = logged_frame
    rep = oe.run_offline_eval(df.iloc[:0], {"static_table": StaticTablePolicy(sim.table, sim.catalogue)},
                              sim.catalogue, ope.OPEConfig(n_boot=20), progress=lambda s: None)
    assert rep.gate.promoted is None and rep.n_sessions == 0 and rep.evaluations == {}
    assert "report half is empty: 0 sessions; a 95% interval needs at least 20" in rep.gate.reason
    d = rep.to_dict()
    assert d["sessions"]["n_sessions"] == 0 and d["sessions"]["intervals"].startswith("the eval split's report half")
    assert "report half has 0 episodes" in d["sample_size_warning"]
    static = {"s": StaticTablePolicy(sim.table, sim.catalogue)}
    assert oe.select_by_ope(static, df.iloc[:0], sim.catalogue) == (None, {})
    assert oe.plot_offline_eval(rep)[:4] == b"\x89PNG"


def test_few_sessions_give_estimates_and_a_gate_that_says_how_many_it_needs(logged_frame):
    """Three sessions in the report half (three days of SAGE journals without SAGE_SESSION_ID): the
    estimates stand, no interval is given, and both gate rules refuse with that sentence."""
    from sage_pipeline.routing.collector import binary_mask
    from sage_pipeline.routing.policy import StaticTablePolicy

    sim, df = logged_frame
    rep_half = oe.eval_part(df, "report")
    day = {s: f"day{i % 3}" for i, s in enumerate(rep_half["session_id"].unique())}
    three = rep_half.assign(session_id=rep_half["session_id"].map(day))  # each day's journal is one session
    pols = {"static_table": StaticTablePolicy(sim.table, sim.catalogue), "oracle": sim.oracle_policy(binary_mask(sim))}
    for rule in ("paired", "value"):
        rep = oe.run_offline_eval(three, pols, sim.catalogue, ope.OPEConfig(n_boot=50), progress=lambda s: None,
                                  gate=oe.PromotionGateConfig(rule=rule))
        assert rep.n_sessions == 3 and rep.gate.promoted is None
        assert rep.interval_reason.startswith("3 sessions; a 95% interval needs at least 20")
        why = rep.gate.candidates["oracle"]["why"]
        assert "no interval: 3 sessions; a 95% interval needs at least 20" in why, why
        assert all(r["sessions"] == 3 and r["ci_low"] is None for r in rep.summary())
        assert rep.evaluations["oracle"].value is not None
        assert rep.to_dict()["sessions"] == {"n_sessions": 3, "n_episodes": int(three["episode_id"].nunique()),
                                             "min_sessions": 20, "intervals": rep.interval_reason}


def test_report_tasks_that_all_ended_alike_give_estimates_without_intervals_and_no_promotion(logged_frame):
    """Every report task verified (as 60 tasks at a 5% failure rate are, one day in twenty): a bootstrap over
    them cannot show a failure, so the interval would sit around a value the truth is below (day 2 of the 7 x 100
    loop: [0.9961, 0.9986] against 0.947). The estimates stay, the intervals go, the gate says why."""
    from sage_pipeline.routing.collector import binary_mask
    from sage_pipeline.routing.policy import StaticTablePolicy

    sim, df = logged_frame
    rep_half = oe.eval_part(df, "report")
    assert oe.one_outcome_reason(rep_half) is None  # no task outcomes joined: nothing to say
    mixed = rep_half.assign(task_verified=(rep_half["episode_id"].rank(method="dense") % 2).astype(float))
    assert oe.one_outcome_reason(mixed) is None
    alike = rep_half.assign(task_verified=1.0)
    why = oe.one_outcome_reason(alike)
    assert why.startswith(f"every one of the report half's {rep_half['episode_id'].nunique()} tasks ended verified")
    assert "ended not verified" in oe.one_outcome_reason(rep_half.assign(task_verified=0.0))
    pols = {"static_table": StaticTablePolicy(sim.table, sim.catalogue), "oracle": sim.oracle_policy(binary_mask(sim))}
    free = oe.run_offline_eval(alike, pols, sim.catalogue, ope.OPEConfig(n_boot=50), progress=lambda s: None)
    rep = oe.run_offline_eval(alike, pols, sim.catalogue, ope.OPEConfig(n_boot=50), progress=lambda s: None,
                              no_interval=why)
    assert free.evaluations["oracle"].estimates["step_dr_clip"].ci_low is not None
    assert rep.gate.promoted is None and rep.gate.reason == f"no policy promoted: {why}"
    assert not any(c["passed"] for c in rep.gate.candidates.values())
    for name, ev in rep.evaluations.items():
        assert ev.interval_reason == why
        for est, e in ev.estimates.items():
            assert e.value == free.evaluations[name].estimates[est].value and e.ci_low is None and e.ci_high is None


class _NearlyTheTable:
    """What BC learns from deterministic logs: the table's choice with probability 0.98."""

    def __init__(self, sim):
        from sage_pipeline.routing.features import FeatureSpec
        from sage_pipeline.routing.policy import StaticTablePolicy

        self.static, self.spec = StaticTablePolicy(sim.table, sim.catalogue), FeatureSpec(roles=sim.catalogue.roles)
        self.mask = sim.role_mask

    def action_probs(self, ctx):
        uniform = self.mask[ctx.role] / self.mask[ctx.role].sum(axis=1, keepdims=True)
        return 0.98 * self.static.action_probs(ctx) + 0.02 * uniform


class _LowerThreshold:
    """The table with its complexity trigger moved down by 0.15: primary or fallback only, pairs the
    logs hold, so no (role, model) pair is missing; it changes the decisions between the thresholds."""

    name = "lower_threshold"

    def __init__(self, sim):
        from sage_pipeline.routing.policy import StaticTablePolicy

        self.static, self.actions = StaticTablePolicy(sim.table, sim.catalogue), sim.actions

    def action_probs(self, ctx):
        from dataclasses import replace

        return self.static.action_probs(replace(ctx, task_complexity_score=np.minimum(
            ctx.task_complexity_score + 0.15, 1.0)))


def _yaml_only(sim, df):
    """The logs SAGE writes with its YAML table: every decision the table's, no propensity (episodes that
    explored are dropped whole, so each kept episode is complete)."""
    followed = (df["model"] == df["table_model"]).groupby(df["episode_id"]).transform("all")
    out = df[followed].copy()
    out["propensity"] = np.nan
    out["propensity_source"] = "missing"
    out["policy_source"] = "yaml"
    return out


def test_deterministic_yaml_logs_refuse_the_gate_naming_support(logged_frame):
    """On logs from SAGE's YAML table, BC's near-0/1 propensities gave a policy that changes decisions a
    tight interval (measured before this change: the table moved to 0.65 got [0.896, 0.930] and a paired
    difference of -0.0016 [-0.0076, ...] while the truth is +0.006). Now every number of such a policy is
    withheld, each role is reported deterministic, and the gate refuses in one sentence naming support."""
    from sage_pipeline.routing.policy import StaticTablePolicy

    sim, df = logged_frame
    yaml_df, n_filled = oe.fill_missing_propensities(_yaml_only(sim, df), _NearlyTheTable(sim))
    assert n_filled == len(yaml_df) and (yaml_df["propensity_source"] == "estimated_bc").all()
    report_half = oe.eval_part(yaml_df, "report")
    pols = {"static_table": StaticTablePolicy(sim.table, sim.catalogue), "lower_threshold": _LowerThreshold(sim)}
    rep = oe.run_offline_eval(report_half, pols, sim.catalogue, ope.OPEConfig(n_boot=100), progress=lambda s: None)
    assert all(e.value is None and e.ci_low is None for e in rep.evaluations["lower_threshold"].estimates.values())
    assert rep.gate.promoted is None
    why = rep.gate.candidates["lower_threshold"]["why"]
    assert why.startswith("no support: role ") and "every logged decision was made by SAGE's deterministic YAML " \
        "table, so the logs cannot say what" in why and "Deploy the exploring checkpoint" in why
    assert "lower_threshold changes" in why
    assert rep.n_sessions >= 20 and rep.interval_reason is None  # not a matter of sample size
    # the whole dataset as evidence (offline_eval's): still deterministic
    wide = oe.run_offline_eval(report_half, pols, sim.catalogue, ope.OPEConfig(n_boot=20), progress=lambda s: None,
                               evidence=yaml_df)
    assert wide.gate.candidates["lower_threshold"]["why"] == why
    # a candidate that changes nothing is refused too, and the reason still names support
    same = oe.run_offline_eval(report_half, {"static_table": pols["static_table"],
                                             "table_again": StaticTablePolicy(sim.table, sim.catalogue)},
                               sim.catalogue, ope.OPEConfig(n_boot=20), progress=lambda s: None)
    assert same.gate.promoted is None and "lower bound +0.0000 <= 0" in same.gate.reason
    assert "Support: roles planner, " in same.gate.reason and "were logged by SAGE's deterministic YAML table: no " \
        "change of decision there can be valued; deploy the exploring checkpoint" in same.gate.reason
    static = rep.evaluations["static_table"].estimates["step_dr_clip"]
    assert static.value is not None and static.ci_low is not None  # the table itself is on-policy: valued
    roles = rep.to_dict()["support_by_role"]["roles"]
    assert roles and all(r["deterministic"] and r["share_with_support"] == 0.0 for r in roles)
    assert all(r["policy_sources"] == {"yaml": r["decisions"]} for r in roles)


def test_exploring_logs_have_support_in_every_role(logged_frame):
    sim, df = logged_frame
    sup = oe.logged_support(oe.eval_part(df, "report"), sim.catalogue, df)
    assert sup.roles and all(r.share == 1.0 and not r.deterministic for r in sup.roles.values())
    assert sup.refusal("oracle", sim.oracle_policy().action_probs(
        ope.LoggedData.from_frame(oe.eval_part(df, "report"), sim.actions).contexts), 1e-3) is None


def test_support_buckets_are_exact_contexts_and_estimated_propensities_are_no_evidence():
    """A deterministic threshold router logs both models only on either side of its threshold: any
    bucket wider than the exact score would show 'both' there. Same exact context: support."""
    import pandas as pd

    from sage_pipeline.routing.catalogue import ModelCatalogue

    cat = ModelCatalogue.load()
    role = cat.roles[2]
    a, b = [i for i in range(len(cat.actions)) if cat.role_mask()[2, i]][:2]
    frame = pd.DataFrame({
        "role": role, "task_complexity_score": [0.79, 0.8100001, 0.9, 0.9, 0.5, 0.5],
        "primary_failure_count": [0, 0, 0, 0, 0, 1], "failure_count": [0, 0, 0, 0, 0, 1],
        "step": 0, "prompt_tokens": 1000, "action_index": [a, b, a, b, a, b],
        "propensity": [0.97, 0.03, 0.97, 0.03, 0.97, 0.03], "propensity_source": "estimated_bc"})
    sup = oe.logged_support(frame, cat)
    other = sup.supported.sum(axis=1) > 1
    assert other.tolist() == [False, False, True, True, False, False]  # 0.9 saw both; 0.5 differs in failures
    assert sup.roles[role].with_support == 2 and not sup.roles[role].deterministic
    logged = frame.assign(propensity_source="logged")  # a known exploration probability: every candidate
    assert oe.logged_support(logged, cat).roles[role].share == 1.0
    assert oe.context_keys(frame.assign(task_complexity_score=0.9 + 1e-9))[0] == oe.context_keys(frame)[2]


# ------------------------------------------------------------------ the ledger mode of the gate (issue 47)
class _PlannerEarlier:
    """SAGE's table, except that the planner falls back from a complexity of 0.5 (the table: above 0.85)."""

    def __init__(self, table, space):
        from sage_pipeline.routing.policy import StaticTablePolicy

        self.base, self.space = StaticTablePolicy(table, space), space
        self.actions = tuple(space.actions)

    def action_probs(self, ctx):
        out = self.base.action_probs(ctx)
        r = self.space.roles.index("planner")
        rows = (ctx.role == r) & (ctx.task_complexity_score > 0.5)
        out[rows] = 0.0
        out[rows, self.space.fallback[r]] = 1.0
        return out


def _planner_world(night: int, deployed, space, n: int, rng):
    """``n`` tasks of one night: a planner then a reviewer decision, logged by SAGE's router exploring around
    ``deployed`` (P(the other model) = 0.3, exact); the task passes with 0.4 + 0.3 when the planner fell back
    exactly where complexity > 0.5 (the table misses (0.5, 0.85]: the earlier fallback gains 0.105)."""
    import pandas as pd

    from sage_pipeline.routing.features import Contexts

    roles = np.array([space.roles.index("planner"), space.roles.index("reviewer")] * n)
    score = np.repeat(rng.uniform(0, 1, n), 2)
    zeros = np.zeros(2 * n, dtype=np.int64)
    ctx = Contexts(roles, score, np.full(2 * n, np.nan), np.tile([0, 1], n), zeros, zeros)
    target = deployed.action_probs(ctx).argmax(axis=1)
    other = np.where(target == space.primary[roles], space.fallback[roles], space.primary[roles])
    explore = rng.random(2 * n) < 0.3
    action = np.where(explore, other, target)
    good = (action == space.fallback[roles]) == (score > 0.5)
    passed = rng.random(n) < 0.4 + 0.3 * good[0::2]
    ids = np.repeat([f"s{night}-{i}/task" for i in range(n)], 2)
    ts = pd.Timestamp("2026-12-01T00:00:00Z") + pd.Timedelta(days=night) + pd.to_timedelta(
        np.repeat(np.arange(n), 2), unit="s") + pd.to_timedelta(np.tile([0, 100], n), unit="ms")
    return pd.DataFrame({
        "episode_id": ids, "session_id": ids, "step": np.tile([0, 1], n),
        "role": np.array(space.roles)[roles], "task_complexity_score": score, "primary_failure_count": zeros,
        "failure_count": zeros, "prompt_tokens": np.nan, "action_index": action,
        "propensity": np.where(explore, 0.3, 0.7), "propensity_source": "reconstructed", "policy_source": "learned",
        "reward": np.column_stack([np.zeros(n), passed.astype(float)]).ravel(),
        "timestamp": [t.isoformat() for t in ts]})


def test_ledger_gate_judges_against_the_deployed_policy_across_nights_and_accepts_through_the_ledger(tmp_path):
    import pandas as pd

    from sage_pipeline.decisions import router
    from sage_pipeline.decisions.ledger import Ledger
    from sage_pipeline.routing.action_space import ActionSpace
    from sage_pipeline.routing.policy import StaticTablePolicy
    from sage_pipeline.sage.table import RoutingTable

    table = RoutingTable.load()
    space = ActionSpace.build(table).binary()
    cand, static = _PlannerEarlier(table, space), StaticTablePolicy(table, space)
    rng = np.random.default_rng(3)
    led = Ledger()
    cfg = router.RouterGateConfig(objective_low=0.0, objective_high=1.0, min_propensity=0.3, max_randomised=2)
    per_night = oe.GateDecision(None, "no policy promoted: cql_served: step_dr_clip paired difference ...",
                                candidates={"cql_served": {"passed": False, "why": "lower bound -0.01 <= 0"}})
    frames, decisions = [], []
    for night in range(8):
        deployed = cand if router.deployed_key(led) == "c" * 64 else static
        frames.append(_planner_world(night, deployed, space, 300, rng))
        df = pd.concat(frames, ignore_index=True)
        inputs = oe.LedgerGateInputs(led, f"2026-12-{night + 1:02d}", pd.Timestamp("2026-12-01T23:00:00Z")
                                     + pd.Timedelta(days=night), keys={"cql_served": "c" * 64},
                                     paths={"cql_served": "/kept/cql"}, load=lambda k, payload: cand, config=cfg)
        served = {"cql_served": cand} if night == 0 else {}  # proposed once; later nights judge it
        decisions.append(oe.ledger_gate(per_night, served, df, space, table, inputs))
        if decisions[-1].promoted:
            break
    first = decisions[0]
    assert first.mode == "ledger" and first.promoted is None and first.ledger["deploy"]["key"] == router.TABLE
    row = first.candidates["router-0001"]
    assert row["state"] == "pending" and "no episode yet" in row["why"] and row["name"] == "cql_served"
    assert row["per_night"] == "lower bound -0.01 <= 0 (valid for one night only)"
    last = decisions[-1]
    assert last.promoted == "router-0001" and 2 <= len(decisions) <= 6, [d.reason for d in decisions]
    assert last.ledger["deploy"] == {"key": "c" * 64, "candidate": "router-0001", "name": "cql_served",
                                     "path": "/kept/cql"}
    assert last.reason.startswith("ledger: router-0001 accepted tonight, evidence ")
    row = last.candidates["router-0001"]
    assert row["state"] == "accepted" and row["evidence"] >= row["needed"] == pytest.approx(40.0)
    assert row["estimate"] > 0 and row["ci"][1] > 0 and row["why"].startswith("deployed since 2026-12-")
    # its evidence came only from tasks logged after it was proposed (night 0's are before)
    assert not any(u.startswith("s0-") for u in led.get("router-0001").judged_on[router.STREAM])
    # a ledger decision names what to deploy; tonight's served candidates are not it
    with pytest.raises(ValueError, match="accepted by the ledger"):
        oe.promote_served(last, {}, tmp_path / "promoted_sage", {})


def test_ledger_mode_without_a_ledger_promotes_nothing_and_says_so():
    from sage_pipeline.routing.action_space import ActionSpace
    from sage_pipeline.sage.table import RoutingTable

    table = RoutingTable.load()
    space = ActionSpace.build(table).binary()
    per_night = oe.GateDecision("cql_served", "promoted cql_served: lower bound +0.004 > 0",
                                candidates={"cql_served": {"passed": True, "why": "lower bound +0.004 > 0"}})
    d = oe.ledger_gate(per_night, {}, None, space, table, None)
    assert d.promoted is None and d.mode == "ledger" and d.reason.startswith(oe.NO_LEDGER)
    assert "promoted cql_served" in d.reason  # tonight's one-night verdict, said, not acted on
    assert d.candidates["cql_served"]["passed"] is False
    assert d.candidates["cql_served"]["per_night"].endswith("(valid for one night only)")
    with pytest.raises(ValueError, match="gate mode 'weekly': use one of ledger, per_night"):
        oe.run_sage_binary_eval(None, None, space, table, {}, mode="weekly")


def test_served_key_is_the_sha256_of_the_checkpoint_sage_loads(tmp_path):
    from sage_pipeline import artifacts
    from sage_pipeline.routing.action_space import ActionSpace
    from sage_pipeline.sage import checkpoint as sr
    from sage_pipeline.sage.table import RoutingTable

    table = RoutingTable.load()
    space = ActionSpace.build(table).binary()
    served = sr.ServedSagePolicy(table, space, {r: sr.yaml_classifier(table.routes[r]) for r in ("planner",)})
    sr.write_sage_checkpoint(tmp_path / "ck", served, {})
    from sage_pipeline.decisions import router as ledger_router

    # the file's sha256 with the floor SAGE applies to it (SAGE_RL_MIN_CONFIDENCE, not in the file)
    sha = artifacts.file_sha256(tmp_path / "ck" / sr.JOBLIB_NAME)
    assert oe.served_key(served) == ledger_router.folder_key(tmp_path / "ck") == ledger_router.candidate_key(sha, 0.55)
