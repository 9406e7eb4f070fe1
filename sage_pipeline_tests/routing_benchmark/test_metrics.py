"""The field's metrics: NDCH and AIQ (RouterBench), APGR and CPT (RouteLLM), decisions."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sage_pipeline.routing_benchmark import metrics as bm


def test_ndch_is_the_upper_non_decreasing_hull():
    cost = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 1.5])
    qual = np.array([0.2, 0.3, 0.8, 0.85, 0.7, 0.9])
    hc, hq = bm.ndch(cost, qual)
    # (1, 0.3) lies under the chord (0, 0.2)-(1.5, 0.9); past the best point (1.5, 0.9) the curve is flat
    assert hc.tolist() == [0.0, 1.5] and hq.tolist() == [0.2, 0.9]
    hc, hq = bm.ndch(np.array([0.0, 1.0, 2.0]), np.array([0.5, 0.9, 1.0]))
    assert hc.tolist() == [0.0, 1.0, 2.0]  # concave and rising: every point is on the hull
    assert np.all(np.diff(hq) >= 0)
    with pytest.raises(ValueError, match="finite"):
        bm.ndch(np.array([0.0, np.nan]), np.array([0.1, 0.2]))


def test_aiq_exact_areas():
    # the zero router of two models: the chord between them, area = mean of their qualities
    assert bm.aiq(np.array([1.0, 3.0]), np.array([0.4, 0.8]), 1.0, 3.0) == pytest.approx(0.6)
    # a point above the chord raises AIQ; dominated points do not change it
    with_mid = bm.aiq(np.array([1.0, 3.0, 2.0]), np.array([0.4, 0.8, 0.75]), 1.0, 3.0)
    assert with_mid == pytest.approx((0.5 * (0.4 + 0.75) + 0.5 * (0.75 + 0.8)) / 2)
    dominated = bm.aiq(np.array([1.0, 3.0, 2.0, 2.5]), np.array([0.4, 0.8, 0.75, 0.5]), 1.0, 3.0)
    assert dominated == pytest.approx(with_mid)
    # reaching the best quality early: flat after it
    assert bm.aiq(np.array([1.0, 2.0]), np.array([0.4, 0.8]), 1.0, 3.0) == pytest.approx((0.6 + 0.8) / 2)
    # a router that cannot operate below cost 2 gets nothing on [1, 2]
    assert bm.aiq(np.array([2.0, 3.0]), np.array([0.8, 0.8]), 1.0, 3.0) == pytest.approx(0.4)
    with pytest.raises(ValueError, match="c_max > c_min"):
        bm.aiq(np.array([1.0]), np.array([0.5]), 2.0, 2.0)


def test_decide_breaks_ties_to_the_cheaper_model_and_infinite_weight_picks_the_cheapest():
    u = np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.9]])
    c = np.array([[2.0, 1.0, 3.0], [1.0, 3.0, 2.0]])
    assert bm.decide(u, c, 0.0).tolist() == [1, 1]
    assert bm.decide(u, c, 0.2).tolist() == [1, 2]
    assert bm.decide(u, c, np.inf).tolist() == [1, 0]


def _routellm_reference(score, q_strong, q_weak):
    """RouteLLM's evaluate.py + benchmarks.py, transcribed (np.interp CPT, trapezoid APGR)."""
    _, thresholds = pd.qcut(score, 10, retbins=True)
    pts = []
    for i, t in enumerate(thresholds):
        sel = score >= t if i != len(thresholds) - 1 else score > t
        pts.append((sel.mean() * 100, np.where(sel, q_strong, q_weak).mean() * 100))
    df = pd.DataFrame(pts, columns=["strong_percentage", "accuracy"]).sort_values("strong_percentage")
    weak, strong = q_weak.mean() * 100, q_strong.mean() * 100
    auc = np.trapezoid(df["accuracy"], df["strong_percentage"] / 100)
    x = df["strong_percentage"] / 100
    apgr = (auc - np.trapezoid(np.full(len(df), weak), x)) / (np.trapezoid(np.full(len(df), strong), x)
                                                              - np.trapezoid(np.full(len(df), weak), x))
    cpt = [np.interp(p * (strong - weak) + weak, df["accuracy"], df["strong_percentage"]) / 100 for p in (0.5, 0.8)]
    return apgr, cpt


def test_routellm_metrics_match_the_reference_when_the_curve_rises():
    rng = np.random.default_rng(0)
    n = 4000
    gain = rng.random(n)
    q_weak = (rng.random(n) < 0.6).astype(float)
    q_strong = np.maximum(q_weak, (rng.random(n) < gain).astype(float))  # the strong model helps where gain is high
    score = gain + 0.3 * rng.random(n)
    m = bm.routellm_metrics(score, q_strong, q_weak)
    apgr, (cpt50, cpt80) = _routellm_reference(score, q_strong, q_weak)
    assert np.all(np.diff(m.quality) >= 0)
    assert m.apgr == pytest.approx(apgr) and m.cpt50 == pytest.approx(cpt50) and m.cpt80 == pytest.approx(cpt80)
    assert m.apgr > 0.6 and m.cpt50 < 0.4
    rand = bm.routellm_metrics(rng.random(n), q_strong, q_weak)
    assert rand.apgr == pytest.approx(0.5, abs=0.05) and rand.cpt50 == pytest.approx(0.5, abs=0.07)


def test_routellm_metrics_need_a_better_strong_model():
    q = np.array([1.0, 0.0, 1.0, 0.0])
    with pytest.raises(ValueError, match="strong model to beat the weak one"):
        bm.routellm_metrics(np.arange(4.0), q, q)


def test_first_crossing_is_defined_on_a_falling_curve():
    x, y = np.array([0.0, 0.5, 0.6, 1.0]), np.array([0.0, 0.8, 0.4, 1.0])
    assert bm.first_crossing(x, y, 0.4) == pytest.approx(0.25)
    assert np.isnan(bm.first_crossing(x, y, 1.5))


def test_sweep_scores_decisions_by_the_truth():
    q = np.array([[0.0, 1.0], [1.0, 1.0]])
    c = np.array([[1.0, 3.0], [1.0, 3.0]])
    curve = bm.sweep("t", lambda w: bm.decide(q, c, w), np.array([0.0, 1.0]), q, c)
    assert curve.cost.tolist() == [2.0, 1.0] and curve.quality.tolist() == [1.0, 0.5]
    assert curve.share.tolist() == [[0.5, 0.5], [1.0, 0.0]]


def _routellm_optimal_reference(q_strong, q_weak, strong_percent):
    """RouteLLM's MMLU get_optimal_accuracy (routellm/evals/benchmarks.py), transcribed."""
    total = len(q_weak)
    strong_calls = total * strong_percent
    weak_correct = int((q_weak == 1).sum())
    strong_bonus = min(strong_calls, int(((q_weak == 0) & (q_strong == 1)).sum()))
    return (weak_correct + strong_bonus) / total


def test_oracle_apgr_and_cpt_follow_routellms_optimal_curve_on_a_hand_computed_table():
    # 10 prompts: the weak model right on 6, the strong on 7; 3 only the strong gets right, 2 only the weak
    q_weak = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0, 0], dtype=float)
    q_strong = np.array([1, 1, 1, 1, 0, 0, 1, 1, 1, 0], dtype=float)
    m = bm.routellm_metrics(None, q_strong, q_weak)
    # by hand: 0.6 + min(share, 0.3) at shares 0, 0.1, ..., 1
    assert m.strong_share.tolist() == pytest.approx(np.linspace(0, 1, 11).tolist())
    assert m.quality.tolist() == pytest.approx([0.6, 0.7, 0.8] + [0.9] * 8)
    assert m.quality.tolist() == pytest.approx([_routellm_optimal_reference(q_strong, q_weak, p / 100)
                                                for p in range(0, 101, 10)])
    # trapezoid area 0.1 * (9.3 - (0.6 + 0.9) / 2) = 0.855; APGR = (0.855 - 0.6) / (0.7 - 0.6) = 2.55
    assert m.apgr == pytest.approx(2.55)
    assert m.cpt50 == pytest.approx(0.05) and m.cpt80 == pytest.approx(0.08)
    # what it replaced: the oracle's three-valued score through qcut never reaches its own optimum
    qcut = bm.routellm_metrics(q_strong - q_weak, q_strong, q_weak)
    assert qcut.apgr < m.apgr and qcut.quality.max() == pytest.approx(0.9)
    # graded quality: the largest positive gains first (RouteLLM's MT-Bench optimum), fractional calls
    share, qual = bm.routellm_optimal_curve(np.array([9.0, 5.0, 2.0, 8.0]), np.array([1.0, 6.0, 3.0, 8.0]), 4)
    assert qual.tolist() == pytest.approx([4.5, 6.5, 6.5, 6.5, 6.5])


def test_optimal_frontier_by_hand_binary_and_graded():
    c = np.array([[1.0, 2.0, 4.0]] * 4)
    q = np.array([[0, 1, 1], [0, 0, 1], [1, 1, 1], [0, 0, 0]], dtype=float)
    fr = bm.optimal_frontier(q, c)
    # start: everyone on the cheapest model; then the cheapest model that gets each prompt right,
    # steepest step first: prompt 0 to model 1 (+1 quality for +1 USD), prompt 1 to model 2 (+1 for +3)
    assert fr.cost.tolist() == pytest.approx([1.0, 1.25, 2.0])
    assert fr.quality.tolist() == pytest.approx([0.25, 0.5, 0.75])
    assert fr.knob.tolist() == pytest.approx([np.inf, 1.0, 1 / 3])  # the cost weight below which each step pays
    assert fr.choice_counts.tolist() == [[4, 0, 0], [3, 1, 0], [2, 1, 1]]
    # graded: a model under the chord is skipped (0.3 at 2 USD lies under 0.2 at 1 -> 0.9 at 4)
    fr = bm.optimal_frontier(np.array([[0.2, 0.3, 0.9], [0.2, 0.5, 0.9]]), np.array([[1.0, 2.0, 4.0]] * 2))
    # steps: p1 0->1 slope 0.3, p0 0->2 slope 0.7/3, p1 1->2 slope 0.2
    assert fr.cost.tolist() == pytest.approx([1.0, 1.5, 3.0, 4.0])
    assert fr.quality.tolist() == pytest.approx([0.2, 0.35, 0.7, 0.9])
    assert fr.choice_counts[-1].tolist() == [0, 0, 2]


def test_optimal_frontier_contains_every_cost_weights_best_assignment():
    rng = np.random.default_rng(3)
    n, K = 300, 6
    c = rng.lognormal(-6, 1, (n, K))
    for q in (rng.random((n, K)), (rng.random((n, K)) < 0.6).astype(float)):
        fr = bm.optimal_frontier(q, c)
        assert np.all(np.diff(fr.cost) > 0) and np.all(np.diff(fr.quality) > 0)
        for w in np.concatenate([[0.0], np.geomspace(1, 1e5, 40)]):
            cost, qual = bm.outcome(bm.decide(q, c, w), q, c)
            on = np.interp(cost, fr.cost, fr.quality)
            assert qual <= on + 1e-9 and qual == pytest.approx(on, abs=1e-9)
        # its AIQ bounds any router's: the best-quality-per-prompt point is its last vertex
        assert fr.quality[-1] == pytest.approx(q.max(axis=1).mean())


def test_aiq_normalisations_paper_and_routerbench_code():
    # two models at cost 1 (quality 0.4) and 3 (0.8): the zero router's chord
    cost, qual = np.array([1.0, 3.0]), np.array([0.4, 0.8])
    assert bm.aiq(cost, qual, 1.0, 3.0) == pytest.approx(0.6)  # paper: area 1.2 over the range 2
    assert bm.aiq_routerbench_code(cost, qual, 3.0) == pytest.approx(1.2 / 3.0)  # code: area over x_max
    # = AIQ * (c_max - c_min) / c_max when the curve starts at c_min
    assert bm.aiq_routerbench_code(cost, qual, 3.0) == pytest.approx(0.6 * 2 / 3)
    # a router starting above c_min: 0 there in the paper's AIQ, not counted at all by the code
    late = (np.array([2.0, 3.0]), np.array([0.8, 0.8]))
    assert bm.aiq(*late, 1.0, 3.0) == pytest.approx(0.4)
    assert bm.aiq_routerbench_code(*late, 3.0) == pytest.approx(0.8 / 3.0)
    # extended flat to the largest cost of the routers compared
    assert bm.aiq_routerbench_code(cost, qual, 4.0) == pytest.approx((1.2 + 0.8) / 4.0)


def test_bootstrap_aiq_is_paired_and_centred_on_the_point_estimate():
    rng = np.random.default_rng(0)
    n = 2000
    q = np.column_stack([(rng.random(n) < 0.6), (rng.random(n) < 0.8)]).astype(float)
    c = np.column_stack([np.full(n, 1.0), np.full(n, 4.0)])
    good = np.where(q[:, 0] == 1, 0, 1)  # knows when the cheap model suffices
    policies = [np.ones(n, dtype=int), good, np.zeros(n, dtype=int)]
    weights = np.arange(3.0)
    curves = {"zero": bm.Curve("zero", c.mean(0), q.mean(0), np.full(2, np.nan), np.eye(2),
                               np.repeat(np.arange(2, dtype=np.int16)[:, None], n, axis=1)),
              "good": bm.sweep("good", lambda w: policies[int(w)], weights, q, c),
              "copy": bm.sweep("copy", lambda w: policies[int(w)], weights, q, c),
              "no_choice": bm.Curve("no_choice", np.array([1.0]), np.array([0.5]), np.array([0.0]), np.eye(2)[:1])}
    boot = bm.bootstrap_aiq(curves, q, c, n_boot=120, seed=1)
    assert set(boot) == {"zero", "good", "copy"}  # a curve without recorded choices is skipped
    lo, hi = np.percentile(boot["good"], [2.5, 97.5])
    point = curves["good"].aiq(*bm.cost_range(c.mean(0)))
    assert lo < point < hi and hi - lo < 0.05
    margin = boot["good"] - boot["zero"]
    assert np.percentile(margin, 2.5) > 0  # paired: the same resamples for every router
    # the same router twice: every resample gives it the same AIQ
    assert np.array_equal(boot["good"], boot["copy"])


def test_aiq_by_group_equals_the_aiq_of_each_groups_prompts_alone():
    rng = np.random.default_rng(4)
    n, K = 600, 3
    q = (rng.random((n, K)) < [0.5, 0.7, 0.85]).astype(float)
    c = np.tile([1.0, 3.0, 10.0], (n, 1)) * rng.lognormal(0, 0.2, (n, 1))
    groups = np.where(np.arange(n) < 400, "mmlu", "gsm8k")
    groups[-5:] = "tiny"  # fewer than min_prompts: left out
    choice = np.stack([np.where(rng.random(n) < t, 2, 0) for t in np.linspace(0, 1, 5)])
    curve = bm.Curve("r", np.zeros(5), np.zeros(5), np.zeros(5), np.zeros((5, K)), choice.astype(np.int16))
    out = bm.aiq_by_group({"r": curve}, q, c, groups)
    assert set(out) == {"mmlu", "gsm8k"} and set(out["mmlu"]) == {"r", "oracle"}
    idx = np.flatnonzero(groups == "gsm8k")
    sub = bm.sweep("r", lambda w: choice[int(w), idx], np.arange(5.0), q[idx], c[idx])
    assert out["gsm8k"]["r"] == pytest.approx(sub.aiq(*bm.cost_range(c[idx].mean(axis=0))))
    fr = bm.optimal_frontier(q[idx], c[idx])
    assert out["gsm8k"]["oracle"] == pytest.approx(bm.aiq(fr.cost, fr.quality, *bm.cost_range(c[idx].mean(axis=0))))
    assert out["gsm8k"]["oracle"] >= out["gsm8k"]["r"]


def test_gap_closed_at_the_best_models_cost():
    # best model at cost 2, quality 0.7; oracle's hull reaches 0.9 there; a router's hull 0.8
    oracle = (np.array([1.0, 2.0]), np.array([0.5, 0.9]))
    router = (np.array([1.0, 3.0]), np.array([0.5, 1.1]))  # at cost 2: 0.8 on the chord
    assert bm.gap_closed(*router, 2.0, 0.7, *oracle) == pytest.approx(0.5)
    assert bm.gap_closed(np.array([1.0]), np.array([0.5]), 2.0, 0.7, *oracle) == pytest.approx(-1.0)


def test_aiq_batch_is_aiq_row_by_row():
    """The vectorised AIQ the bootstraps use gives :func:`aiq`'s number on every row: ties in cost, repeated
    points, dominated points, curves starting right of c_min or past c_max, rows padded with NaN."""
    rng = np.random.default_rng(7)
    for trial in range(300):
        P = int(rng.integers(1, 25))
        c = rng.random((4, P)) * 3
        q = rng.random((4, P))
        c[1], q[1] = np.round(c[1], 1), np.round(q[1], 1)  # ties
        q[2] = np.sort(q[2])  # rising: every point on the front
        c[3, : P // 2], q[3, : P // 2] = c[3, -1], q[3, -1]  # one point repeated
        lo = rng.random(4) * 0.5
        hi = lo + 0.01 + rng.random(4) * 3
        got = bm.aiq_batch(c, q, lo, hi)
        want = [bm.aiq(c[i], q[i], lo[i], hi[i]) for i in range(4)]
        assert got == pytest.approx(want, abs=1e-12), trial
    padded = np.array([[1.0, 3.0, np.nan], [1.0, 2.0, 3.0]]), np.array([[0.4, 0.8, np.nan], [0.4, 0.75, 0.8]])
    assert bm.aiq_batch(*padded, 1.0, 3.0) == pytest.approx([0.6, (0.5 * 1.15 + 0.5 * 1.55) / 2])
    with pytest.raises(ValueError, match="c_max > c_min in every row, got 1 rows without"):
        bm.aiq_batch(*padded, np.array([1.0, 3.0]), np.array([3.0, 3.0]))
    with pytest.raises(ValueError, match="a row has no finite"):
        bm.aiq_batch(np.array([[np.nan]]), np.array([[0.5]]), 0.0, 1.0)
    with pytest.raises(ValueError, match="one shape"):
        bm.aiq_batch(np.ones((2, 3)), np.ones((2, 2)), 0.0, 1.0)


def test_path_aiq_joins_the_points_in_order_without_a_hull():
    # a point above the chord counts as it is; one below is not lifted to the chord (the hull would be)
    up = bm.path_aiq(np.array([[1.0, 2.0, 3.0]]), np.array([[0.4, 0.75, 0.8]]), 1.0, 3.0)
    down = bm.path_aiq(np.array([[1.0, 2.0, 3.0]]), np.array([[0.4, 0.5, 0.8]]), 1.0, 3.0)
    assert up == pytest.approx([(0.5 * 1.15 + 0.5 * 1.55) / 2]) and down == pytest.approx([(0.45 + 0.65) / 2])
    hull = bm.aiq(np.array([1.0, 2.0, 3.0]), np.array([0.4, 0.5, 0.8]), 1.0, 3.0)
    assert hull == pytest.approx(0.6) and hull > down[0]
    # flat from its last point to c_max
    assert bm.path_aiq(np.array([[1.0, 2.0]]), np.array([[0.4, 0.8]]), 1.0, 3.0) == pytest.approx([(0.6 + 0.8) / 2])
    with pytest.raises(ValueError, match="c_max > c_min"):
        bm.path_aiq(np.ones((1, 2)), np.ones((1, 2)), 1.0, 1.0)


def test_a_resampled_frontier_is_the_frontier_of_the_resampled_prompts():
    rng = np.random.default_rng(2)
    n, K = 90, 4
    c = rng.lognormal(0, 1, (n, K))
    for q in ((rng.random((n, K)) < 0.6).astype(float), rng.random((n, K))):
        fr = bm.optimal_frontier(q, c)
        for _ in range(5):
            idx = rng.integers(0, n, n)
            fc, fq = fr.resampled(np.bincount(idx, minlength=n)[None, :] / n)
            direct = bm.optimal_frontier(q[idx], c[idx])
            x = np.linspace(direct.cost[0], direct.cost[-1], 50)
            assert fc[0, 0] == pytest.approx(direct.cost[0]) and fc[0, -1] == pytest.approx(direct.cost[-1])
            assert np.interp(x, fc[0], fq[0]) == pytest.approx(np.interp(x, direct.cost, direct.quality))


def test_bootstrap_of_a_mixture_and_of_the_oracle():
    """A mixture curve (the random router's expectation) is recomputed on each resample, never lifted above the
    zero router's hull; the oracle's frontier is recomputed exactly on each resample."""
    rng = np.random.default_rng(5)
    n = 400
    q = (rng.random((n, 3)) < [0.5, 0.7, 0.85]).astype(float)
    c = np.tile([1.0, 3.0, 10.0], (n, 1)) * rng.lognormal(0, 0.3, (n, 1))
    zero = bm.Curve("zero", c.mean(0), q.mean(0), np.full(3, np.nan), np.eye(3),
                    np.repeat(np.arange(3, dtype=np.int16)[:, None], n, axis=1))
    share = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 1.0]])
    mix = bm.Curve("mix", share @ c.mean(0), share @ q.mean(0), np.arange(5.0), share, mixture=True)
    fr = bm.optimal_frontier(q, c)
    boot = bm.bootstrap_aiq({"zero": zero, "mix": mix}, q, c, n_boot=60, seed=3, frontiers={"oracle": fr})
    assert set(boot) == {"zero", "mix", "oracle"}
    assert np.all(boot["zero"] - boot["mix"] >= -1e-12)  # a mixture of single models is never above their hull
    assert np.all(boot["oracle"] >= boot["zero"])
    # replay the resamples: the oracle's replicate is the AIQ of the resampled prompts' own frontier
    rng2 = np.random.default_rng(3)
    w = rng2.multinomial(n, np.full(n, 1.0 / n), size=25).astype(np.float64) / n
    idx = np.repeat(np.arange(n), (w[0] * n).round().astype(int))
    direct = bm.optimal_frontier(q[idx], c[idx])
    assert boot["oracle"][0] == pytest.approx(bm.aiq(direct.cost, direct.quality, *bm.cost_range(c[idx].mean(0))))
    assert boot["mix"][0] == pytest.approx(mix.on(q, c, idx).aiq(*bm.cost_range(c[idx].mean(0))))


def test_bootstrap_by_group_resamples_each_group_alone():
    rng = np.random.default_rng(4)
    n, K = 600, 3
    q = (rng.random((n, K)) < [0.5, 0.7, 0.85]).astype(float)
    c = np.tile([1.0, 3.0, 10.0], (n, 1)) * rng.lognormal(0, 0.2, (n, 1))
    groups = np.where(np.arange(n) < 400, "mmlu", "gsm8k")
    groups[-5:] = "tiny"
    choice = np.stack([np.where(rng.random(n) < t, 2, 0) for t in np.linspace(0, 1, 5)]).astype(np.int16)
    curve = bm.Curve("r", np.zeros(5), np.zeros(5), np.zeros(5), np.zeros((5, K)), choice)
    point = bm.aiq_by_group({"r": curve}, q, c, groups)
    boot = bm.bootstrap_aiq_by_group({"r": curve}, q, c, groups, n_boot=80, seed=1)
    assert set(boot) == {"mmlu", "gsm8k"} and set(boot["gsm8k"]) == {"r", "oracle"}
    for g in boot:
        for name in ("r", "oracle"):
            lo, hi = np.percentile(boot[g][name], [2.5, 97.5])
            assert lo <= point[g][name] + 1e-9 and point[g][name] <= hi + 1e-9 and hi - lo < 0.2, (g, name)
    # the same group alone, the same seed stream: the same replicates (each group's resamples are its own)
    idx = np.flatnonzero(groups == "gsm8k")
    alone = bm.bootstrap_aiq({"r": curve.on(q, c, idx)}, q[idx], c[idx], 80, (1, 1))
    assert np.allclose(alone["r"], boot["gsm8k"]["r"])
