"""Logged bandit feedback simulated from a full table: propensities, exact values, OPE against them."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from sage_pipeline.routing_benchmark import logged_bandit as bb, prompt_features as bfeat
from sage_pipeline_tests.routing_benchmark.test_routers import MODELS, synthetic_table

W = 2e4  # cost weight (quality per USD): about 0.1-0.5 quality per strong call here


def test_behaviour_probabilities_and_sampled_logs():
    tab = synthetic_table(2000)
    mean_cost = tab.cost.mean(axis=0)
    assert bb.BehaviourSpec(kind="static").probs(2, MODELS, mean_cost).tolist() == [[0.0, 1.0]] * 2  # the dearest
    eps = bb.BehaviourSpec(kind="epsilon", model="cheap", epsilon=0.3)
    assert eps.probs(1, MODELS, mean_cost).tolist() == [[0.85, 0.15]]
    assert eps.label(MODELS, mean_cost) == "epsilon(cheap, 0.3)"
    log = bb.simulate_logs(tab.quality, tab.cost, MODELS, eps, seed=3)
    assert set(np.round(log.pscore, 6)) == {0.85, 0.15}
    assert log.pscore.tolist() == log.probs[np.arange(len(log)), log.action].tolist()
    assert abs((log.action == 1).mean() - 0.15) < 0.03
    rows = np.arange(len(log))
    assert np.array_equal(log.quality, tab.quality[rows, log.action])
    assert np.array_equal(log.reward(W), tab.quality[rows, log.action] - W * tab.cost[rows, log.action])
    with pytest.raises(ValueError, match="not in the table's models"):
        bb.BehaviourSpec(kind="static", model="gpt-5").probs(1, MODELS, mean_cost)
    with pytest.raises(ValidationError, match=r"\nkind\n  Input should be 'static', 'uniform' or 'epsilon' .*'greedy'"):
        bb.BehaviourSpec(kind="greedy")
    with pytest.raises(ValidationError, match=r"\nepsilon\n  Input should be less than or equal to 1 "):
        bb.BehaviourSpec(kind="epsilon", epsilon=1.5)


def test_true_value_is_the_mean_expected_utility():
    q = np.array([[1.0, 0.0], [0.0, 1.0]])
    c = np.array([[0.1, 0.3], [0.1, 0.3]])
    pi = np.array([[1.0, 0.0], [0.5, 0.5]])
    assert bb.true_value(pi, q, c, 1.0) == pytest.approx(((1 - 0.1) + 0.5 * (0 - 0.1) + 0.5 * (1 - 0.3)) / 2)


@pytest.fixture(scope="module")
def logged():
    tab = synthetic_table(3000, seed=1)
    x = bfeat.make_featurizer("tfidf_svd", n_components=8).fit_transform(tab.prompt)
    algebra = np.array(["algebra" in p for p in tab.prompt])
    pi = np.eye(2)[algebra.astype(int)]  # strong for algebra, cheap for history
    basis = bb.reward_basis(x, np.array([len(p) for p in tab.prompt]), dim=4)
    return tab, x, pi, basis


def test_ope_estimates_cover_the_exact_value_under_uniform_logs(logged):
    tab, _, pi, basis = logged
    truth = bb.true_value(pi, tab.quality, tab.cost, W)
    log = bb.simulate_logs(tab.quality, tab.cost, MODELS, bb.BehaviourSpec(kind="uniform"), seed=5)
    q_hat = bb.reward_model(basis, log.action, log.reward(W), 2)
    res = bb.evaluate(log, pi, lambda: q_hat, W, "topic", MODELS, bb.BanditOPEConfig(n_boot=200))
    assert res["no_support"] is None and res["support_share"] == pytest.approx((log.action == pi.argmax(1)).mean())
    assert set(res["estimates"]) == {"ips", "snips", "dm", "dr", "sndr", "switch_dr"}
    for name, e in res["estimates"].items():
        assert e["low"] <= truth <= e["high"], name
        assert abs(e["value"] - truth) < 0.05, name
    rows = bb.summarise([res | {"propensities": "logged"}], {"topic": truth})
    assert len(rows) == 6 and all(r["covered"] for r in rows) and rows[0]["truth"] == truth


def test_static_logs_support_only_the_static_policy(logged):
    tab, _, pi, _ = logged
    log = bb.simulate_logs(tab.quality, tab.cost, MODELS, bb.BehaviourSpec(kind="static"), seed=5)
    assert (log.pscore == 1.0).all() and (log.action == 1).all()
    called = []

    def q_hat():
        called.append(1)
        return np.zeros((len(log), 2))

    res = bb.evaluate(log, pi, q_hat, W, "topic", MODELS)
    assert res["no_support"].startswith("no support: policy 'topic'") and res["estimates"] == {}
    assert not called  # no reward model is fitted for a policy the logs cannot support
    always_strong = np.tile([0.0, 1.0], (len(log), 1))
    ok = bb.evaluate(log, always_strong, q_hat, W, "static", MODELS, bb.BanditOPEConfig(n_boot=20))
    truth = bb.true_value(always_strong, tab.quality, tab.cost, W)
    assert ok["no_support"] is None and ok["estimates"]["ips"]["value"] == pytest.approx(truth)


def test_bc_propensities_recover_the_epsilon_behaviour(logged):
    tab, x, _, _ = logged
    spec = bb.BehaviourSpec(kind="epsilon", model="strong", epsilon=0.3)
    log = bb.simulate_logs(tab.quality, tab.cost, MODELS, spec, seed=7)
    predict, metrics = bb.fit_propensities(x[:2000], log.action[:2000], 2, log=lambda s: None)
    p_hat = bb.floored(predict(x[2000:])[np.arange(1000), log.action[2000:]])
    assert np.abs(p_hat - log.pscore[2000:]).mean() < 0.05
    assert metrics["holdout_nll_after"] <= metrics["holdout_nll_before"] + 1e-9
    assert bb.floored(np.array([0.0, 0.5]), 0.01).tolist() == [0.01, 0.5]
