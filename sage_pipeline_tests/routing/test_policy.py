"""The policies that need no training: rows sum to 1, the per-role mask holds, and
sample_actions draws with the given probabilities."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from sage_pipeline.rl import EpsilonGreedyPolicy, Policy, StaticTablePolicy, UniformPolicy
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.policy import check_probs, sample_actions
from sage_pipeline.routing.schema import ROLE_INDEX, ROLES


@pytest.fixture(scope="module")
def ctx() -> Contexts:
    rng = np.random.default_rng(0)
    n = 3000
    step = rng.integers(0, 4, n)
    return Contexts(
        role=rng.integers(0, len(ROLES), n),
        task_complexity_score=rng.random(n),
        prompt_tokens=rng.integers(200, 20000, n).astype(np.float64),
        step=step,
        failure_count=step,
        primary_failure_count=np.minimum(rng.integers(0, 4, n), step),
    )


def all_policies(table, catalogue) -> list:
    static = StaticTablePolicy(table, catalogue)
    return [
        static,
        UniformPolicy(catalogue.actions, catalogue.role_mask()),
        EpsilonGreedyPolicy(static, 0.0),
        EpsilonGreedyPolicy(static, 0.3),
        EpsilonGreedyPolicy(static, 1.0),
    ]


def test_rows_sum_to_one_and_respect_the_mask(table, catalogue, ctx):
    mask = catalogue.role_mask()[ctx.role]
    for pol in all_policies(table, catalogue):
        assert isinstance(pol, Policy)
        assert pol.actions == catalogue.actions
        np.testing.assert_array_equal(pol.role_mask, catalogue.role_mask())
        p = pol.action_probs(ctx)
        assert p.shape == (len(ctx), len(catalogue.actions))
        np.testing.assert_allclose(p.sum(axis=1), 1.0, rtol=0, atol=1e-12)
        assert (p >= 0).all()
        assert (p[~mask] == 0).all(), pol.name
        assert check_probs(pol, ctx, p) is p


def test_static_table_policy_is_one_hot_on_the_table_choice(table, catalogue, ctx):
    pol = StaticTablePolicy(table, catalogue)
    assert pol.name == "static_table"
    p = pol.action_probs(ctx)
    want = table.choose(
        catalogue, ctx.role, ctx.task_complexity_score, ctx.primary_failure_count, ctx.failure_count
    )
    np.testing.assert_array_equal(pol.choose(ctx), want)
    np.testing.assert_array_equal(p.argmax(axis=1), want)
    np.testing.assert_array_equal(p.max(axis=1), 1.0)
    assert ((p == 0) | (p == 1)).all()


def test_uniform_policy(catalogue, ctx):
    pol = UniformPolicy(catalogue.actions, catalogue.role_mask())
    p = pol.action_probs(ctx)
    k = catalogue.role_mask()[ctx.role].sum(axis=1)
    for i in range(50):
        cands = catalogue.candidates(ROLES[ctx.role[i]])
        assert {catalogue.actions[j] for j in np.flatnonzero(p[i])} == set(cands)
        np.testing.assert_allclose(p[i][p[i] > 0], 1.0 / len(cands))
    np.testing.assert_allclose(p.max(axis=1), 1.0 / k)
    # architect has 4 candidates, coder 5, planner 5
    one = Contexts(
        role=np.array([ROLE_INDEX["architect"]]),
        task_complexity_score=np.array([0.5]),
        prompt_tokens=np.array([1000.0]),
        step=np.array([0]),
        failure_count=np.array([0]),
        primary_failure_count=np.array([0]),
    )
    assert pol.action_probs(one).tolist() == [[0.25, 0.25, 0.25, 0.25, 0.0, 0.0]]


def test_epsilon_greedy_mixes_table_and_uniform(table, catalogue, ctx):
    static = StaticTablePolicy(table, catalogue)
    uni = UniformPolicy(catalogue.actions, catalogue.role_mask())
    for eps in (0.0, 0.3, 1.0):
        pol = EpsilonGreedyPolicy(static, eps)
        assert pol.name == "behaviour"
        np.testing.assert_allclose(
            pol.action_probs(ctx),
            (1 - eps) * static.action_probs(ctx) + eps * uni.action_probs(ctx),
            atol=1e-15,
        )
    p = EpsilonGreedyPolicy(static, 0.3).action_probs(ctx)
    k = catalogue.role_mask()[ctx.role].sum(axis=1)
    choice = static.choose(ctx)
    np.testing.assert_allclose(p[np.arange(len(ctx)), choice], 0.7 + 0.3 / k, atol=1e-15)
    # every candidate has support when eps > 0
    assert (p[catalogue.role_mask()[ctx.role]] > 0).all()


@pytest.mark.parametrize("eps", [-0.1, 1.1])
def test_epsilon_out_of_range(eps, table, catalogue):
    with pytest.raises(ValueError, match=rf"^epsilon must be in \[0, 1\], got {eps}$"):
        EpsilonGreedyPolicy(StaticTablePolicy(table, catalogue), eps)


def test_sample_actions_frequencies_match_probabilities():
    probs = np.array(
        [
            [0.0, 0.1, 0.0, 0.6, 0.3, 0.0],
            [0.2, 0.2, 0.2, 0.2, 0.2, 0.0],
            [0.0, 0.0, 0.0, 0.0, 0.0, 1.0],
            [0.5, 0.0, 0.0, 0.0, 0.0, 0.5],
        ]
    )
    n = 100_000
    big = np.repeat(probs, n, axis=0)
    a = sample_actions(big, np.random.default_rng(42)).reshape(len(probs), n)
    for i, row in enumerate(probs):
        freq = np.bincount(a[i], minlength=6) / n
        se = np.sqrt(row * (1 - row) / n)
        assert (np.abs(freq - row) <= 4 * se + 1e-12).all(), (i, freq, row)
        assert (freq[row == 0] == 0).all()  # never an action without mass


def test_sample_actions_on_policy_rows(table, catalogue, ctx):
    pol = EpsilonGreedyPolicy(StaticTablePolicy(table, catalogue), 0.3)
    p = pol.action_probs(ctx)
    reps = 60
    a = sample_actions(np.tile(p, (reps, 1)), np.random.default_rng(1))
    assert catalogue.role_mask()[np.tile(ctx.role, reps), a].all()
    # expected vs observed counts per action, pooled over the batch
    counts = np.bincount(a, minlength=p.shape[1])
    expected = reps * p.sum(axis=0)
    sd = np.sqrt(reps * (p * (1 - p)).sum(axis=0))
    assert (np.abs(counts - expected) <= 4 * sd).all()
    # seeded: the same draws again
    np.testing.assert_array_equal(sample_actions(np.tile(p, (reps, 1)), np.random.default_rng(1)), a)


def test_sample_actions_tolerates_rows_that_do_not_sum_exactly_to_one():
    probs = np.array([[0.3, 0.3, 0.4 - 1e-12], [1.0 + 1e-12, 0.0, 0.0]])
    a = sample_actions(np.repeat(probs, 1000, axis=0), np.random.default_rng(0))
    assert a.min() >= 0 and a.max() <= 2
    assert (a[1000:] == 0).all()


@dataclass(frozen=True)
class _Bad:
    actions: tuple
    role_mask: np.ndarray
    name: str = "bad"

    def action_probs(self, ctx):  # a wrong output: one column short
        return np.full((len(ctx), len(self.actions) - 1), 1.0 / (len(self.actions) - 1))


def test_check_probs_rejects_invalid_output(catalogue, ctx):
    pol = _Bad(catalogue.actions, catalogue.role_mask())
    n, k = len(ctx), len(catalogue.actions)
    with pytest.raises(ValueError, match=r"^policy 'bad' returned shape \(3000, 5\), expected \(3000, 6\)$"):
        check_probs(pol, ctx, np.full((n, k - 1), 0.2))
    with pytest.raises(ValueError, match=r"^policy 'bad': probability rows do not sum to 1$"):
        check_probs(pol, ctx, np.full((n, k), 0.5))
    bad = UniformPolicy(catalogue.actions, catalogue.role_mask()).action_probs(ctx)
    bad[0, 0] = np.nan
    with pytest.raises(ValueError, match=r"^policy 'bad' returned non-finite or negative probabilities$"):
        check_probs(pol, ctx, bad)
    with pytest.raises(
        ValueError, match=r"^policy 'bad' puts mass on actions that are not candidates for the role$"
    ):
        check_probs(pol, ctx, np.full((n, k), 1.0 / k))
