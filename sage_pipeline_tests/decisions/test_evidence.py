"""The e-processes' guarantee, measured at a fixed seed on many independent streams at once (the batch
axis): under no gain the chance of ever crossing 1/alpha stays below alpha over a long horizon, the
confidence sequence covers the truth at every step at once, a real gain is found, and bounds are
enforced."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sage_pipeline.decisions import evidence as ev

CFG = ev.EvidenceConfig()


def _ever_crossed(delta: float, n: int, batch: int, seed: int, alpha: float = 0.05, p0: float = 0.7):
    """Randomised live runs, 50/50, outcome Bernoulli(p0 + delta on the candidate); whether K+(0) ever
    reached 1/alpha and whether the CS ever missed delta, per stream."""
    rng = np.random.default_rng(seed)
    nulls = ev.grid(CFG, (0.03,))
    s = ev.Stream.start(nulls, batch)
    crossed = np.zeros(batch, bool)
    missed = np.zeros(batch, bool)
    total, count = np.zeros(batch), np.zeros(batch)
    i0 = ev.at(nulls, 0.0)
    for _ in range(n):
        z = rng.random(batch) < 0.5
        y = (rng.random(batch) < p0 + delta * z).astype(float)
        centre = np.where(count > 0, total / np.maximum(count, 1), 0.5)
        x, lo, hi = ev.ipw_difference(y, z, 0.5, centre)
        s.update(x, lo, hi, CFG)
        total += y
        count += 1
        crossed |= s.log_plus[:, i0] >= math.log(1 / alpha)
        lo_, hi_, _ = ev.confidence_sequence(nulls, s.log_plus, s.log_minus, alpha)
        missed |= ~((lo_ <= delta + 1e-9) & (hi_ >= delta - 1e-9))
    return crossed, missed


def test_no_gain_is_almost_never_accepted_however_long_it_is_watched():
    crossed, missed = _ever_crossed(0.0, n=600, batch=400, seed=3)
    # Ville: P(ever) <= 0.05; with 400 streams the share's 99.9% upper band at 0.05 is ~0.09
    assert crossed.mean() <= 0.09
    assert missed.mean() <= 0.09


def test_a_real_gain_is_found_and_the_sequence_covers_it():
    crossed, missed = _ever_crossed(0.15, n=600, batch=200, seed=4)
    assert crossed.mean() >= 0.8
    assert missed.mean() <= 0.1


def test_paired_replays_accumulate():
    rng = np.random.default_rng(0)
    nulls = ev.grid(CFG)
    s = ev.Stream.start(nulls)
    a = (rng.random((60, 8)) < 0.65).mean(1)
    b = (rng.random((60, 8)) < 0.5).mean(1)
    x, lo, hi = ev.paired_difference(a, b)
    s.feed(x[:30], lo, hi, CFG)
    first = s.log_plus[0, ev.at(nulls, 0.0)]
    s.feed(x[30:], lo, hi, CFG)
    assert s.log_plus[0, ev.at(nulls, 0.0)] > first > 0


def test_an_observation_outside_its_stated_bounds_is_refused():
    s = ev.Stream.start(ev.grid(CFG))
    with pytest.raises(ValueError, match="outside the bounds"):
        s.update(np.array([1.5]), -1.0, 1.0, CFG)


def test_assignment_probabilities_must_allow_both_arms():
    with pytest.raises(ValueError, match="probability"):
        ev.ipw_difference([1.0], [1], 1.0, 0.5)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ev.ipw_difference([2.0], [1], 0.5, 0.5)


def test_ipw_contrast_is_unbiased_with_a_third_arm_and_any_fixed_centre():
    rng = np.random.default_rng(1)
    n = 400_000
    arm = rng.choice(3, size=n, p=[0.6, 0.3, 0.1])
    mean = np.array([0.5, 0.6, 0.9])[arm]
    y = (rng.random(n) < mean).astype(float)
    for centre in (0.0, 0.4, 1.0):
        x, lo, hi = ev.ipw_contrast(y, arm == 1, arm == 0, 0.3, 0.6, centre)
        assert abs(x.mean() - 0.1) < 0.01
        assert (x >= lo).all() and (x <= hi).all()


def test_the_state_round_trips():
    s = ev.Stream.start(ev.grid(CFG))
    s.feed([0.2, -0.1, 0.4], -1, 1, CFG)
    t = ev.Stream.from_dict(s.to_dict())
    for k in ("log_plus", "log_minus", "w", "s1", "s2", "n", "total"):
        np.testing.assert_array_equal(getattr(s, k), getattr(t, k))


def test_observations_needed_is_infinite_when_the_effect_points_the_other_way():
    s = ev.Stream.start(ev.grid(CFG))
    s.feed([-0.3] * 20, -1, 1, CFG)
    g = ev.growth_per_observation(s, 0.0)
    assert np.isinf(ev.observations_needed(s.log_plus[:, ev.at(s.nulls, 0.0)], 40.0, g)).all()
    s2 = ev.Stream.start(ev.grid(CFG))
    s2.feed([0.3, 0.1] * 5, -1, 1, CFG)
    need = ev.observations_needed(s2.log_plus[:, ev.at(s2.nulls, 0.0)], 1e6, ev.growth_per_observation(s2, 0.0))
    assert np.isfinite(need).all() and need[0] > 0


# ---------------------------------------------------------------------------------------------- the mixture bet
MIX = ev.EvidenceConfig(bet="mixture")


def _coder_like(delta: float, n: int, batch: int, seed: int, cfg: ev.EvidenceConfig, nulls: np.ndarray,
                p0: float = 0.93) -> tuple[ev.Stream, np.ndarray]:
    """Randomised runs at 50/50 with outcomes near the coder's (Bernoulli(p0), the candidate + delta), centred
    by the running mean as coder.add_runs does; returns the stream and whether K+(0) ever reached 1/0.05."""
    rng = np.random.default_rng(seed)
    s = ev.Stream.start(nulls, batch, cfg.components())
    crossed, any_component = np.zeros(batch, bool), np.zeros(batch, bool)
    total, count = np.full(batch, 0.5), np.ones(batch)
    i0 = ev.at(nulls, 0.0)
    for _ in range(n):
        z = rng.random(batch) < 0.5
        y = (rng.random(batch) < p0 + delta * z).astype(float)
        x, lo, hi = ev.ipw_difference(y, z, 0.5, total / count)
        s.update(x, lo, hi, cfg)
        total, count = total + y, count + 1
        crossed |= s.log_plus[:, i0] >= math.log(1 / 0.05)
        if s.comp_plus is not None:
            any_component |= s.comp_plus[:, i0, :].max(axis=1) >= math.log(1 / 0.05)
    return crossed, any_component


def test_the_mixture_never_crosses_more_than_alpha_under_no_gain():
    """Ville's bound for the average of the mixture's e-processes: 2,000 null streams of 1,500 runs (25 nights of
    60) at alpha 0.05. The share's standard error is 0.005, so 0.065 is three of them above alpha: a bet that broke
    the bound by that much fails here at this seed (the check below shows this simulation can fail: the maximum
    over the same components, not an e-process, crosses more often)."""
    nulls = np.array([-0.03, 0.0, 0.03])
    crossed, any_component = _coder_like(0.0, n=1500, batch=2000, seed=11, cfg=MIX, nulls=nulls)
    assert crossed.mean() <= 0.065
    # the same components read as their maximum (the best gain chosen after the fact, not an e-process) cross
    # more often on the same draws: the simulation tells a valid bet from one that is not
    assert any_component.mean() > crossed.mean() + 0.01


def test_the_mixture_confidence_sequence_covers_at_every_step():
    rng = np.random.default_rng(12)
    nulls = np.round(np.linspace(-0.3, 0.3, 21), 10)
    s = ev.Stream.start(nulls, 1000, MIX.components())
    missed = np.zeros(1000, bool)
    delta = 0.06
    for _ in range(600):
        a = rng.random(1000)
        x = np.clip(delta + 0.4 * (a - 0.5) * 2, -1, 1)  # mean delta, range [-1, 1]
        s.update(x, -1.0, 1.0, MIX)
        lo_, hi_, _ = ev.confidence_sequence(nulls, s.log_plus, s.log_minus, 0.05)
        missed |= ~((lo_ <= delta + 1e-9) & (hi_ >= delta - 1e-9))
    assert missed.mean() <= 0.065


def test_the_mixture_pins_the_coder_gap_sooner_than_the_plug_in():
    """A +0.06 gap on 0.85 at 50/50 (variance ~0.5 per run), 840 runs (14 nights of 60): the mixture reaches
    1/0.05 in more streams than aGRAPA's plug-in on the same draws (0.65 against 0.45 at this seed; the
    standard error of each share is 0.016; the benchmark's measure on the model world is in docs/benchmarks.md)."""
    nulls = np.array([0.0, 0.03])
    mix, _ = _coder_like(0.06, n=840, batch=1000, seed=13, cfg=MIX, nulls=nulls, p0=0.85)
    plug, _ = _coder_like(0.06, n=840, batch=1000, seed=13, cfg=CFG, nulls=nulls, p0=0.85)
    assert mix.mean() >= plug.mean() + 0.1


def test_a_mixture_stream_round_trips_and_refuses_another_bet():
    nulls = ev.grid(MIX)
    s = ev.Stream.start(nulls, components=MIX.components())
    s.feed([0.2, -0.1, 0.4], -1, 1, MIX)
    t = ev.Stream.from_dict(json_round(s.to_dict()))
    for k in ("log_plus", "log_minus", "w", "s1", "s2", "n", "total", "comp_plus", "comp_minus"):
        np.testing.assert_array_equal(getattr(s, k), getattr(t, k))
    # the mixture's log-wealth is the log of the components' average
    i0 = ev.at(nulls, 0.0)
    want = math.log(np.mean(np.exp(s.comp_plus[0, i0])))
    assert abs(s.log_plus[0, i0] - want) < 1e-12
    with pytest.raises(ValueError, match="feed a stream with the config it was started with"):
        t.update(np.array([0.1]), -1.0, 1.0, CFG)
    with pytest.raises(ValueError, match="feed a stream with the config it was started with"):
        ev.Stream.start(nulls).update(np.array([0.1]), -1.0, 1.0, MIX)


def json_round(d: dict) -> dict:
    import json

    return json.loads(json.dumps(d))


@pytest.mark.parametrize("gaps", [(), (0.0, 0.1), (0.03, 0.03), (-0.1,), tuple(0.01 * (k + 1) for k in range(40))])
def test_mixture_gaps_are_checked(gaps):
    with pytest.raises(ValueError, match="mixture_gaps"):
        ev.EvidenceConfig(bet="mixture", mixture_gaps=gaps)
