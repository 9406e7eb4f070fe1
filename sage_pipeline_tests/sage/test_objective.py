"""The per-task objective: a repaired failure never above a first-try pass, costs never raise it."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from sage_pipeline.routing.reward import sage_composite_reward
from sage_pipeline.sage.objective import OBJECTIVE_NAME, TaskObjective, score


def _reward_v1_sum(steps: list[tuple[float, bool, bool]]) -> float:
    """reward_v1 summed over a task's decisions: (reviewer score, verification passed, terminal) per decision."""
    r = np.array([s for s, _, _ in steps])
    v = np.array([1.0 if p else 0.0 for _, p, _ in steps])
    t = np.array([term for _, _, term in steps])
    return float(sage_composite_reward(r, v, t, np.array([None] * len(steps), dtype=object)).sum())


def test_a_repaired_failure_never_scores_above_a_first_try_pass_with_the_same_calls():
    obj = TaskObjective()
    rng = np.random.default_rng(0)
    for _ in range(200):
        calls_s = rng.uniform(0, 600)
        usd = rng.uniform(0, 2)
        first_try = obj.score(1, calls_s, usd)
        repaired = obj.score(1, calls_s, usd)  # the same calls
        assert repaired <= first_try
        assert obj.score(1, calls_s + rng.uniform(0, 600), usd) <= first_try  # the repair's calls cost
    # reward_v1 summed over the task ranks them the other way: the reason it is not the objective
    first = _reward_v1_sum([(0.9, True, True)])
    rep = _reward_v1_sum([(0.3, False, False), (0.9, True, True)])
    assert rep > first


def test_more_cost_never_raises_the_objective_and_verified_dominates_small_costs():
    obj = TaskObjective(gpu_second_weight=0.001, usd_weight=0.5)
    s = np.linspace(0, 500, 11)
    vals = obj.score(np.ones_like(s), s, np.zeros_like(s))
    assert np.all(np.diff(vals) < 0)
    assert obj.score(1, 100, 0.1) > obj.score(0, 0, 0)
    assert score(obj, [1, 0], [3600, 0], [0, 0]) == pytest.approx([1 - 3.6, 0])


def test_default_weights_and_name():
    obj = TaskObjective()
    assert obj.name == OBJECTIVE_NAME == "task_v1"
    assert obj.score(1, 3600, 0) == pytest.approx(0.0)  # an hour of GPU is worth one verified task
    assert obj.score(1, 0, 5) == pytest.approx(0.0)  # five dollars likewise
    assert "GPU-seconds" in obj.describe()


def test_unknown_verdicts_score_nan_and_shares_score_their_expectation():
    obj = TaskObjective()
    assert np.isnan(obj.score(np.nan, 10, 0))
    assert obj.score(0.75, 36, 0) == pytest.approx(0.75 - 0.01)  # a verified share: the mean objective


@pytest.mark.parametrize(("kw", "match"), [({"gpu_seconds": [-1]}, "gpu_seconds must be finite and >= 0"),
                                           ({"usd": [np.inf]}, "usd must be finite"),
                                           ({"verified": [1.5]}, "verified must be 0 or 1 for a task")])
def test_bad_outcomes_are_refused(kw, match):
    args = {"verified": [1], "gpu_seconds": [1], "usd": [0]} | kw
    with pytest.raises(ValueError, match=match):
        score(TaskObjective(), **args)


@pytest.mark.parametrize("kw", [{"gpu_second_weight": -1}, {"usd_weight": float("nan")}, {"name": "reward_v1"},
                                {"lambda_s": 1}])
def test_bad_weights_are_refused(kw):
    with pytest.raises(ValidationError):
        TaskObjective(**kw)
