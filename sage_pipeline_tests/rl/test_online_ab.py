"""Online A/B with common random numbers: each arm follows the simulator's outcome model exactly,
identical policies differ by exactly 0, and the paired interval is about the true difference."""

from __future__ import annotations

import numpy as np
import pytest

from sage_pipeline.rl import online_ab as ab
from sage_pipeline.routing.policy import StaticTablePolicy, UniformPolicy


def test_each_arm_follows_the_simulators_outcome_model(sim, table, catalogue):
    rng = np.random.default_rng(0)
    tasks = sim.sample_tasks(20_000, rng)
    u = ab.CommonNumbers.draw(len(tasks), sim.config.max_attempts, rng)
    for pol in (StaticTablePolicy(table, catalogue), UniformPolicy(sim.actions, sim.role_mask)):
        res = ab.run_arm(sim, tasks, pol, u)
        iv = ab.mean_interval(res.returns)
        truth = sim.policy_value(pol, tasks).mean
        assert abs(iv["mean"] - truth) <= 4 * iv["se"], (pol.name, iv, truth)
        assert ((res.attempts >= 1) & (res.attempts <= sim.config.max_attempts)).all()
        assert (res.passed | (res.attempts == sim.config.max_attempts)).all()  # an episode ends verified or spent


def test_binomial_inverse_is_binomial():
    rng = np.random.default_rng(1)
    q = np.full(200_000, 0.37)
    k = np.rint(ab._binomial_inverse(rng.random(len(q)), q) * 10).astype(int)
    freq = np.bincount(k, minlength=11) / len(k)
    ref = np.bincount(rng.binomial(10, 0.37, size=len(q)), minlength=11) / len(q)
    assert np.abs(freq - ref).max() < 0.006


def test_identical_policies_differ_by_exactly_zero(sim, table, catalogue):
    static = StaticTablePolicy(table, catalogue)
    rep = ab.online_ab(sim, static, static, ab.OnlineABConfig(episodes=300, seed=2))
    assert rep.difference["mean"] == 0.0 and rep.difference["ci_low"] == rep.difference["ci_high"] == 0.0
    assert rep.true_difference == 0.0 and rep.identical_decisions == 1.0


def test_paired_interval_is_tight_and_about_the_truth(sim, table, catalogue):
    static, oracle = StaticTablePolicy(table, catalogue), sim.oracle_policy()
    rep = ab.online_ab(sim, static, oracle, ab.OnlineABConfig(episodes=3000, seed=3),
                       {"b": 10.0, "a": 0.0}, names=("static_table", "oracle"))
    d = rep.difference
    assert d["ci_low"] <= rep.true_difference <= d["ci_high"]
    width_paired = d["ci_high"] - d["ci_low"]
    se = [rep.arms[n]["value"]["se"] for n in ("oracle", "static_table")]
    width_unpaired = 2 * ab.Z95 * np.hypot(*se)  # two independent samples' difference
    assert width_paired < 0.8 * width_unpaired  # common random numbers sharpen the difference
    assert rep.ope_value_inside is False and rep.ope_difference_inside is False  # 10.0 is far off
    rep2 = ab.online_ab(sim, static, oracle, ab.OnlineABConfig(episodes=3000, seed=3),
                        {"b": rep.arms["oracle"]["true_value"], "a": rep.arms["static_table"]["true_value"]},
                        names=("static_table", "oracle"))
    assert rep2.ope_difference_inside is True and rep2.ope_value_inside is True
    assert rep.arms["oracle"]["pass_rate"] >= rep.arms["static_table"]["pass_rate"]


def test_agreement_within_both_errors():
    online = {"mean": 0.060, "ci_low": 0.0515, "ci_high": 0.0685, "se": 0.0043}
    wide = {"difference": 0.072, "difference_ci_low": 0.048, "difference_ci_high": 0.096}  # se 0.0122
    assert not ab.inside(wide["difference"], online) and ab.agrees(wide, online)  # gap 0.012 < 1.96 x 0.0130
    far = {"difference": 0.100, "difference_ci_low": 0.095, "difference_ci_high": 0.105}  # gap 0.040
    assert ab.agrees(far, online) is False
    assert ab.agrees({"difference": 0.07}, online) is None and ab.agrees({"difference": None}, online) is None


def test_config_and_summary_reading():
    with pytest.raises(ValueError, match=r"episodes\n  Input should be greater than or equal to 30"):
        ab.OnlineABConfig(episodes=5)
    summary = [{"policy": "static_table", "step_dr_clip": 0.9}, {"policy": "cql_served", "step_dr_clip": 0.95}]
    assert ab.ope_estimates_from_summary(summary, "cql_served") == {"b": 0.95, "a": 0.9}
    assert ab.ope_estimates_from_summary([], "cql_served") == {"b": None, "a": None}
