"""The paired gate's decisions on constructed val results: a clear gain, noise, drops, too few tasks,
the night's level split over its trials, and the config it refuses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom

from sage_pipeline.sleep.gate import (
    GateConfig,
    compare,
    drop_bound,
    drop_p_values,
    sign_flip_p,
    summary,
)
from sage_pipeline.sleep.records import TaskResult

HARD = GateConfig(metric="hard")


def arm(scores: np.ndarray) -> list[TaskResult]:
    """Replays of tasks t0..t(n-1): ``scores`` is (tasks, samples) of hard results, replay-major
    like ``replay(samples=k)`` returns them."""
    scores = np.asarray(scores, float)
    scores = scores[:, None] if scores.ndim == 1 else scores
    n, k = scores.shape
    return [TaskResult(f"t{i}", "val", float(scores[i, j]), float(scores[i, j]), "", "") for j in range(k)
            for i in range(n)]


def test_a_clear_gain_is_accepted_with_its_exact_p_value():
    base, cand = np.zeros(30), np.zeros(30)
    cand[:12] = 1.0  # 12 tasks now pass, none got worse
    t = compare(arm(base), arm(cand), HARD, ["add x"])
    assert t.accepted and t.verdict == "better" and t.exact
    assert t.p_value == pytest.approx(2.0 ** -12) and t.level == pytest.approx(0.05)
    assert t.improved == [f"t{i}" for i in range(12)] and t.regressed == [] and t.tasks == 30 and t.samples == 1
    assert "with one sample per task no single task's drop can be told from chance" in t.reason


@pytest.mark.slow  # 400 nights' worth of tests (about 1 s)
def test_noise_is_rejected_and_the_false_accept_rate_holds_its_level():
    rng = np.random.default_rng(7)
    accepted = 0
    for _ in range(400):  # a whole-prompt model with no real effect: every replay redraws each task
        p = rng.uniform(0.3, 0.7, 40)
        b = rng.binomial(1, np.clip(p + rng.normal(0, 0.1, 40), 0, 1))
        c = rng.binomial(1, np.clip(p + rng.normal(0, 0.1, 40), 0, 1))
        t = compare(arm(b), arm(c), HARD)
        accepted += t.accepted
        assert t.verdict in ("better", "cannot_tell", "worse", "tie")
    assert accepted / 400 <= 0.05 + 2 * math.sqrt(0.05 * 0.95 / 400)  # at most alpha, up to sampling error
    # the old mean-only rule accepts such noise about half the time
    mean_only = GateConfig(test="strict", metric="hard", no_regression=False)
    b, c = rng.binomial(1, 0.5, (200, 40)), rng.binomial(1, 0.5, (200, 40))
    assert np.mean([compare(arm(x), arm(y), mean_only).accepted for x, y in zip(b, c, strict=True)]) > 0.3


def test_a_gain_with_too_many_significant_drops_is_a_regression():
    k, n = 4, 40
    base = np.zeros((n, k))
    cand = np.ones((n, k))  # every task gains...
    base[:6], cand[:6] = 1.0, 0.0  # ...but 6 go from 4/4 to 0/4 (each p = 1/70 for "worse")
    bound = drop_bound(n, 0.05, 0.05)
    assert bound < 6
    t = compare(arm(base), arm(cand), HARD)
    assert not t.accepted and t.verdict == "regression" and t.dropped == [f"t{i}" for i in range(6)]
    assert t.max_dropped == bound and f"chance explains at most {bound}" in t.reason
    off = compare(arm(base), arm(cand), GateConfig(metric="hard", no_regression=False))
    assert off.accepted and off.dropped == []  # no bound asked for
    # as many drops as chance explains are allowed
    base2, cand2 = np.zeros((n, k)), np.ones((n, k))
    base2[:bound], cand2[:bound] = 1.0, 0.0
    ok = compare(arm(base2), arm(cand2), HARD)
    assert ok.accepted and len(ok.dropped) == bound and f"at most {bound} allowed" in ok.reason


def test_a_night_with_too_few_tasks_says_it_cannot_tell_and_how_many_it_would_need():
    d = np.array([1.0, 1.0, 0, 0, 0, -1.0, 1.0, 0, 0, 0])
    base, cand = (-d).clip(0), d.clip(0)  # 3 tasks rose, 1 fell
    t = compare(arm(base), arm(cand), HARD)
    assert not t.accepted and t.verdict == "cannot_tell" and t.p_value > t.level
    assert t.needed_tasks is not None and t.needed_tasks > 10 and t.detectable > d.mean()
    assert f"needs about {t.needed_tasks} val tasks" in t.reason
    # the same pattern at the size it asked for is resolved
    reps = math.ceil(t.needed_tasks / 10)
    big = compare(arm(np.tile(base, reps)), arm(np.tile(cand, reps)), HARD)
    assert big.accepted and big.tasks >= t.needed_tasks


def test_the_nights_level_is_split_over_its_trials():
    base, cand = np.zeros(20), np.zeros(20)
    cand[:5] = 1.0  # p = 1/32: below 0.05, above 0.05 / 3
    one = compare(arm(base), arm(cand), HARD, trials=1)
    three = compare(arm(base), arm(cand), HARD, trials=3)
    assert one.accepted and one.p_value == pytest.approx(1 / 32)
    assert not three.accepted and three.verdict == "cannot_tell" and three.level == pytest.approx(0.05 / 3)
    assert "alpha 0.05 / 3 trial(s)" in three.reason
    with pytest.raises(ValueError, match="at least one group"):
        compare(arm(base), arm(cand), HARD, trials=0)


def test_ties_and_losses_are_rejected_and_mode_off_accepts():
    base = np.array([1.0, 0, 1, 0])
    tie = compare(arm(base), arm(base), HARD)
    assert not tie.accepted and tie.verdict == "tie" and "no val task changed" in tie.reason
    worse = compare(arm(base), arm(np.zeros(4)), HARD)
    assert not worse.accepted and worse.verdict == "worse"
    off = compare(arm(base), arm(np.zeros(4)), GateConfig(mode="off"))
    assert off.accepted and off.verdict == "gate_off"


@pytest.mark.slow  # Monte Carlo flips and a reference of 50,000 (about 1 s)
def test_sign_flip_p_is_exact_and_falls_back_to_reproducible_monte_carlo():
    d = np.array([0.5, 1.0, -0.5, 0.0, 1.0, 0.25])
    p, exact = sign_flip_p(d, 20000)
    nz = np.abs(d[d != 0])
    signs = np.array([[1 if (m >> i) & 1 else -1 for i in range(nz.size)] for m in range(2 ** nz.size)])
    assert exact and p == pytest.approx(np.mean(signs @ nz >= d.sum() - 1e-12))  # all 2^5 sign patterns
    binary = np.r_[np.ones(140), -np.ones(60), np.zeros(50)]  # pass/fail: the exact sign test
    p_bin, exact_bin = sign_flip_p(binary, 20000)
    assert exact_bin and p_bin == pytest.approx(binom.sf(139, 200, 0.5), rel=1e-9)
    rng = np.random.default_rng(5)
    spread = rng.normal(0.1, 1.0, 60)  # 60 distinct magnitudes: too many sums to keep exactly
    p_mc, exact_mc = sign_flip_p(spread, 20000)
    assert not exact_mc and p_mc == sign_flip_p(spread, 20000)[0]  # seeded by the data
    flips = rng.choice([-1.0, 1.0], size=(50000, 60)) @ np.abs(spread)
    assert p_mc == pytest.approx(np.mean(flips >= spread.sum()), abs=0.01)
    assert sign_flip_p(np.zeros(5), 20000) == (1.0, True)


def test_per_task_drop_test_is_exact_over_the_splits():
    base = np.array([[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]], float)
    cand = np.array([[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 1]], float)
    p = drop_p_values(base, cand, 20000)
    assert p[0] == pytest.approx(1 / 70) and p[1] == pytest.approx(5 / 70) and p[2] == pytest.approx(1.0)
    b = drop_bound(40, 0.05, 0.05)
    assert binom.sf(b, 40, 0.05) <= 0.05 < binom.sf(b - 1, 40, 0.05)
    rng = np.random.default_rng(3)  # past 8 samples: Monte Carlo, still about the exact value
    big_b, big_c = np.ones((2, 10)), np.zeros((2, 10))
    big_c[1] = rng.binomial(1, 0.5, 10)
    pm = drop_p_values(big_b, big_c, 20000)
    assert pm[0] == pytest.approx(1 / math.comb(20, 10), abs=1e-3) and pm[1] > pm[0]


def test_replays_are_grouped_by_task_and_must_match():
    k = 3
    base, cand = np.zeros((4, k)), np.ones((4, k))
    t = compare(arm(base), arm(cand), HARD)
    assert t.tasks == 4 and t.samples == k and summary(arm(cand), HARD) == {
        "hard": 1.0, "soft": 1.0, "score": 1.0, "tasks": 4, "samples": k}
    with pytest.raises(ValueError, match="same val tasks .*t9"):
        compare(arm(base), arm(cand)[:-1] + [TaskResult("t9", "val", 1, 1, "", "")], HARD)
    with pytest.raises(ValueError, match="replayed unequally often"):
        compare(arm(base), arm(cand)[:-1], HARD)
    with pytest.raises(ValueError, match="no val results"):
        compare([], [], HARD)


def test_replays_per_arm_follow_the_backend():
    cfg = GateConfig(samples=6)
    assert cfg.replays(draws_fresh=True) == 6 and cfg.replays(draws_fresh=False) == 1
    assert GateConfig(test="strict", samples=6).replays(True) == 1  # the old rule replays once
    assert GateConfig(mode="off").replays(True) == 1


@pytest.mark.parametrize("kw,message", [
    ({"test": "bayes"}, "'paired' or 'strict'"), ({"alpha": 0.0}, "greater than 0"),
    ({"alpha": 0.5}, "less than 0.5"), ({"samples": 0}, "greater than or equal to 1"),
    ({"samples": 100}, "less than or equal to 64"), ({"permutations": 10}, "greater than or equal to 1000"),
    ({"power": 1.0}, "less than 1"), ({"drop_alpha": 0}, "greater than 0"),
    ({"drop_tolerance": 1.5}, "less than 1"), ({"nonsense": 1}, "Extra inputs are not permitted")])
def test_gate_config_refuses_bad_values_naming_the_field(kw, message):
    with pytest.raises(ValueError) as ei:
        GateConfig(**kw)
    assert f"\n{next(iter(kw))}\n" in str(ei.value) and message in str(ei.value), str(ei.value)


def test_too_few_tasks_that_all_rose_alike_still_get_a_needed_count():
    t = compare(arm(np.zeros(3)), arm(np.ones(3)), HARD)  # 3 of 3 rose: p = 1/8
    assert t.verdict == "cannot_tell" and t.p_value == pytest.approx(1 / 8) and t.detectable is None
    assert t.needed_tasks == math.ceil(math.log2(1 / 0.05))  # the sign test needs 5 tasks rising alike
    assert "resolve a change of" not in t.reason and "needs about 5 val tasks" in t.reason
    assert compare(arm(np.zeros(5)), arm(np.ones(5)), HARD).accepted  # and 5 do


