"""Routers and baselines on a synthetic full-information table whose best model depends on the prompt."""

from __future__ import annotations

import numpy as np
import pytest

from sage_pipeline.rl.cql import CQLConfig
from sage_pipeline.routing_benchmark import (
    logged_bandit as bb,
    metrics as bm,
    prompt_features as bfeat,
    routers as br,
    train as bt,
)
from sage_pipeline.routing_benchmark.importer import BenchmarkTable

MODELS = ("cheap", "strong")


def synthetic_table(n: int = 1200, seed: int = 0) -> BenchmarkTable:
    """'algebra' prompts: the cheap model fails 80% of the time; 'history' prompts: it is as good as the
    strong one. The strong model costs 10x per token; prompt lengths vary."""
    rng = np.random.default_rng(seed)
    topic = rng.random(n) < 0.5
    filler = rng.integers(1, 30, n)
    prompt = np.array([("solve the algebra equation x " if t else "which king ruled in history ") + "word " * f
                       + f"#{i}" for i, (t, f) in enumerate(zip(topic, filler))], dtype=object)
    q_strong = (rng.random(n) < 0.9).astype(float)
    q_cheap = np.where(topic, rng.random(n) < 0.2, rng.random(n) < 0.88).astype(float)
    tokens = np.ceil(np.array([len(p) for p in prompt]) / 4)
    cost = np.column_stack([tokens * 1e-7, tokens * 1e-6])
    return BenchmarkTable(prompt_id=np.array([f"p{i}" for i in range(n)], dtype=object), prompt=prompt,
                          eval_name=np.full(n, "synthetic", dtype=object), models=MODELS,
                          quality=np.column_stack([q_cheap, q_strong]), cost=cost,
                          cost_source=np.zeros((n, 2), dtype=np.int8), file=np.zeros(n, dtype=np.int32),
                          row=np.arange(1, n + 1), files=("synthetic",))


@pytest.fixture(scope="module")
def split():
    tab = synthetic_table()
    tr, te = tab.take(np.arange(900)), tab.take(np.arange(900, 1200))
    feat = bfeat.make_featurizer("tfidf_svd", n_components=16)
    x_tr = feat.fit_transform(tr.prompt)
    return tr, te, feat, x_tr, feat.transform(te.prompt)


def _chars(t: BenchmarkTable) -> np.ndarray:
    return np.array([len(p) for p in t.prompt], dtype=np.float64)


def _aiq(curve: bm.Curve, te: BenchmarkTable) -> float:
    return curve.aiq(*bm.cost_range(te.cost.mean(axis=0)))


def test_baselines_bracket_the_learned_routers(split):
    tr, te, _, x_tr, x_te = split
    zero = _aiq(br.zero_router_curve(te.quality, te.cost), te)
    oracle = _aiq(br.oracle_curve(te.quality, te.cost), te)
    rand = br.random_router_curve(te.quality, te.cost)
    assert rand.share[0].tolist() == [1.0, 0.0] and rand.share[-1].tolist() == [0.0, 1.0] and rand.mixture
    assert _aiq(rand, te) == pytest.approx(zero, abs=1e-12)  # its expectation: the zero router's hull
    reg = br.fit_regression(x_tr, tr.quality, tr.cost, _chars(tr), MODELS)
    q_hat, c_hat = reg.quality(x_te), reg.cost(x_te, _chars(te))
    assert reg.link == "logistic" and np.corrcoef(np.log(c_hat[:, 1]), np.log(te.cost[:, 1]))[0, 1] > 0.95
    weights = br.cost_weights(q_hat, c_hat, 41)  # over the router's own predictions
    learned = _aiq(bm.sweep("regression", lambda w: bm.decide(q_hat, c_hat, w), weights, te.quality, te.cost), te)
    assert zero + 0.05 < learned <= oracle
    algebra = np.array(["algebra" in p for p in te.prompt])
    assert q_hat[algebra, 0].mean() < 0.35 and q_hat[~algebra, 0].mean() > 0.8


def test_oracle_targets_share_ties_and_weigh_by_mean_regret():
    q = np.array([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    c = np.array([[1.0, 5.0], [1.0, 5.0], [1.0, 5.0]])
    tied, weight = br.oracle_targets(q, c, 0.0)
    assert tied.tolist() == [[True, True], [False, True], [True, False]]
    assert weight.tolist() == [0.0, 1.0, 1.0]  # a tie costs nothing at w = 0
    tied, weight = br.oracle_targets(q, c, 0.1)
    # two models: the gap
    assert tied[:, 0].tolist() == [True, False, True] and weight == pytest.approx([0.4, 0.6, 1.4])
    # many models: two tie for best, the others' regrets still weigh the prompt (the runner-up gap is 0)
    q = np.array([[1.0, 1.0, 0.0, 0.0, 0.0]])
    tied, weight = br.oracle_targets(q, np.ones((1, 5)), 0.0)
    assert tied.tolist() == [[True, True, False, False, False]] and weight.tolist() == [pytest.approx(3 / 4)]


def _many_model_table(n: int = 1500, K: int = 8, seed: int = 0):
    """Binary quality, K models with many ties: model 0 is right 88% of the time, the others 50-75%."""
    rng = np.random.default_rng(seed)
    acc = np.concatenate([[0.88], np.linspace(0.5, 0.75, K - 1)])
    q = (rng.random((n, K)) < acc).astype(float)
    x = rng.normal(size=(n, 6)).astype(np.float32)  # features that carry nothing
    cost = np.tile(np.geomspace(1e-4, 1e-2, K)[rng.permutation(K)], (n, 1))
    return x, q, cost


def test_bc_on_many_models_with_ties_finds_the_best_model_at_cost_weight_zero():
    """With weights by the runner-up gap, 8-model binary ties left about 2% of prompts any weight and BC's
    best-quality member fell far below the best single model; by mean regret every prompt that some model
    gets wrong counts."""
    x, q, cost = _many_model_table()
    weights = br.cost_weights(q, cost, 6)
    bc = bt.train_bc_grid(x, q, cost, weights, tuple(f"m{k}" for k in range(q.shape[1])),
                          bt.BCGridConfig(steps=300), log=lambda s: None)
    assert bc.metrics["weighted_share"][0] > 0.5
    best_quality = q[np.arange(len(q)), bc.decide(x, 0.0)].mean()
    assert best_quality > q.mean(axis=0).max() - 0.02
    # at the cheap end: every prompt on the cheapest model
    assert (bc.decide(x, float(weights[-1])) == int(np.argmin(cost[0]))).mean() > 0.95


def test_cost_weights_reach_the_cheap_end_on_many_model_tables():
    _, q, cost = _many_model_table()
    w = br.cost_weights(q, cost, 12)
    # prices per model, not per prompt: few distinct switching weights, each kept once
    assert w[0] == 0.0 and 3 <= len(w) <= 12 and np.all(np.diff(w) > 0)
    cheapest = int(np.argmin(cost[0]))
    assert (bm.decide(q, cost, float(w[-1])) == cheapest).all()  # the last weight: all to the cheapest model
    assert not (bm.decide(q, cost, float(w[-1]) * 0.99) == cheapest).all()  # and it is the smallest such
    # prices that vary by prompt: as many weights as asked
    cost2 = cost * np.random.default_rng(2).lognormal(0, 0.3, cost.shape)
    assert len(br.cost_weights(q, cost2, 12)) == 12
    # a prediction-based router's sweep ends at the cheapest model's cost: its curve covers the AIQ range
    q_hat = np.clip(q.mean(axis=0) + np.random.default_rng(1).normal(0, 0.05, q.shape), 0, 1)
    curve = bm.sweep("r", lambda v: bm.decide(q_hat, cost, v), br.cost_weights(q_hat, cost, 41), q, cost)
    assert curve.cost.min() == pytest.approx(cost[0].min())
    with pytest.raises(ValueError, match="at least 2 points"):
        br.cost_weights(q, cost, 1)


def test_bc_and_cql_grids_learn_the_topic_and_serve_after_save_and_load(split, tmp_path):
    tr, te, feat, x_tr, x_te = split
    weights = np.array([0.0, 0.05, 0.3, 3.0]) / br.cost_scale(tr.cost)
    bc = bt.train_bc_grid(x_tr, tr.quality, tr.cost, weights, MODELS, bt.BCGridConfig(steps=300), log=lambda s: None)
    logs = bb.simulate_logs(tr.quality, tr.cost, MODELS, bb.BehaviourSpec(kind="uniform"), seed=1)
    cql = bt.train_cql_grid_bandit(x_tr, logs.action, logs.quality, logs.cost, weights, MODELS,
                                   CQLConfig(mode="bandit", hidden=(16,), steps=300, alpha=0.03), log=lambda s: None)
    algebra = np.array(["algebra" in p for p in te.prompt])
    w_mid = float(weights[2])
    for router in (bc, cql):
        choice = router.decide(x_te, w_mid)
        # at a moderate cost weight: the strong model for algebra, the cheap one for history
        assert (choice[algebra] == 1).mean() > 0.8 and (choice[~algebra] == 0).mean() > 0.8, router.name
        assert (router.decide(x_te, float(weights[-1])) == 0).mean() > 0.9  # expensive: the cheap model
    assert len(cql.nets[0]) == 2 and len(bc.nets) == 4
    reg = br.fit_regression(x_tr, tr.quality, tr.cost, _chars(tr), MODELS)
    bundle = br.RouterBundle(feat, MODELS, reg, {"bc": bc, "cql": cql}, {"note": "test"})
    br.save_bundle(tmp_path / "ck", bundle)
    loaded = br.load_bundle(tmp_path / "ck")
    prompts = list(te.prompt[:50])
    for name in ("regression", "bc", "cql"):
        assert loaded.route(prompts, w_mid, name) == bundle.route(prompts, w_mid, name)
    assert np.allclose(loaded.grids["cql"].outputs(x_te, 1), cql.outputs(x_te, 1), atol=1e-5)
    with pytest.raises(ValueError, match="unknown router 'knn'"):
        loaded.route(prompts, w_mid, "knn")


def test_cql_grid_wants_bandit_mode(split):
    tr, _, _, x_tr, _ = split
    with pytest.raises(ValueError, match="bandit CQL"):
        bt.train_cql_grid_bandit(x_tr, np.zeros(len(tr), dtype=int), tr.quality[:, 0], tr.cost[:, 0],
                                 np.array([0.0]), MODELS, CQLConfig(mode="multistep"))


def test_serving_a_saved_router_imports_no_torch_or_dagster():
    import subprocess
    import sys

    code = ("import sys; from sage_pipeline.routing_benchmark.routers import load_bundle; "
            "print(sorted(m for m in ('torch', 'dagster', 'great_expectations') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_predictive_and_knn_routers_learn_the_topic_and_serve_after_save_and_load(split, tmp_path):
    tr, te, feat, x_tr, x_te = split
    algebra = np.array(["algebra" in p for p in te.prompt])
    pred = br.fit_predictive(x_tr, tr.quality, MODELS, br.PredictiveConfig(seed=0))
    knn = br.fit_knn(x_tr, tr.quality, MODELS)
    assert (pred.low, pred.high) == (0.0, 1.0) and knn.k in br.KNNConfig().ks
    for router in (pred, knn):
        q_hat = router.quality(x_te)
        # the cheap model's predicted quality: low on algebra (20% right), high on history (88%)
        assert q_hat[algebra, 0].mean() < 0.4 and q_hat[~algebra, 0].mean() > 0.75, router.name
        assert np.abs(q_hat[:, 1] - 0.9).mean() < 0.1, router.name
        curve = bm.sweep(router.name, lambda w, q=q_hat: bm.decide(q, te.cost, w), br.cost_weights(q_hat, te.cost),
                         te.quality, te.cost)
        zero = _aiq(br.zero_router_curve(te.quality, te.cost), te)
        assert _aiq(curve, te) > zero + 0.05, router.name
    # graded quality: predictions stay in the train qualities' range
    graded = br.fit_predictive(x_tr, tr.quality * 0.5 + 0.25, MODELS).quality(x_te)
    assert graded.shape == (len(te), 2) and graded.min() >= 0.25 and graded.max() <= 0.75
    reg = br.fit_regression(x_tr, tr.quality, tr.cost, _chars(tr), MODELS)
    bundle = br.RouterBundle(feat, MODELS, reg, {}, {"note": "test"}, {"predictive": pred, "knn": knn})
    br.save_bundle(tmp_path / "ck", bundle)
    loaded = br.load_bundle(tmp_path / "ck")
    prompts = list(te.prompt[:60])
    for name in ("predictive", "knn"):
        assert loaded.route(prompts, 1e4, name) == bundle.route(prompts, 1e4, name)
    assert np.allclose(loaded.predictors["predictive"].quality(x_te), pred.quality(x_te), atol=1e-5)


def test_knn_picks_its_neighbourhood_by_leave_one_out():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(400, 4)).astype(np.float32)
    q = (x[:, :1] > 0).astype(float) * np.ones((1, 2))  # quality is a function of the first feature
    small = br.fit_knn(x, q, MODELS, br.KNNConfig(ks=(5, 200), metric="euclidean"))
    assert small.k == 5  # a local rule: small neighbourhoods predict it better
    noise = (rng.random((400, 2)) < 0.5).astype(float)  # nothing to learn: the largest neighbourhood averages best
    assert br.fit_knn(x, noise, MODELS, br.KNNConfig(ks=(5, 200), metric="euclidean")).k == 200


def test_the_random_router_is_its_expectation_not_the_hull_of_one_draw():
    """Few prompts, noisy outcomes: the hull of one random draw's points (what rounds 1-3 reported) lies
    visibly above the zero router in nearly every draw. The random router's curve is its exact expectation,
    on the zero router's hull, and draws scored on their own paths average to it within their error."""
    rng = np.random.default_rng(0)
    n = 60
    q = (rng.random((n, 4)) < [0.45, 0.6, 0.7, 0.8]).astype(float)
    c = np.tile([1.0, 2.0, 4.0, 8.0], (n, 1)) * rng.lognormal(0, 0.3, (n, 1))
    lo, hi = bm.cost_range(c.mean(axis=0))
    zero_curve = br.zero_router_curve(q, c)
    zero = zero_curve.aiq(lo, hi)
    cfg = br.RandomRouterConfig(draws=400)
    dc, dq = br.random_router_draws(q, c, cfg, seed=0)
    one_draw = bm.aiq_batch(dc, dq, lo, hi)
    assert one_draw.mean() > zero + 0.01 and (one_draw > zero).mean() > 0.95
    rand = br.random_router_curve(q, c, cfg)
    assert rand.aiq(lo, hi) == pytest.approx(zero, abs=1e-12)
    assert rand.quality == pytest.approx(np.interp(rand.cost, *bm.ndch(zero_curve.cost, zero_curve.quality)))
    path = bm.path_aiq(dc, dq, lo, hi)
    assert abs(path.mean() - zero) < 4 * path.std(ddof=1) / np.sqrt(len(path))
    # every hull vertex is a pure point of the curve; the first and last points of every draw are fixed
    verts = br.hull_vertices(q, c)
    a, b, f = br.random_mixture(q, c, cfg.points)
    assert len(verts) >= 3 and set(verts) <= {int(m) for m, x in zip(a, f) if x == 0} | {int(b[-1])}
    assert dc[:, 0] == pytest.approx(np.full(400, c[:, verts[0]].mean()), abs=1e-12)
    assert dq[:, -1] == pytest.approx(np.full(400, q[:, verts[-1]].mean()), abs=1e-12)


def test_the_random_router_with_one_model_on_the_hull():
    """The cheapest model is also the best: the hull is one point, and so is the random router."""
    q = np.column_stack([np.ones(20), np.zeros(20)])
    c = np.column_stack([np.ones(20), np.full(20, 2.0)])
    rand = br.random_router_curve(q, c)
    assert rand.cost.tolist() == [1.0] and rand.quality.tolist() == [1.0] and rand.share.tolist() == [[1.0, 0.0]]
    dc, dq = br.random_router_draws(q, c, br.RandomRouterConfig(draws=3))
    assert dc.shape == (3, 1) and np.all(dq == 1.0)
    with pytest.raises(ValueError, match="greater than or equal to 2"):
        br.RandomRouterConfig(draws=1)
