"""The shared encoding blocks (routing.features): what a prompt size and a count become, and
that the routing contexts and the code-task observations encode them the same way."""

from __future__ import annotations

import numpy as np
import pytest

from sage_pipeline.routing.features import (
    Contexts,
    FeatureSpec,
    OneHot,
    assemble,
    check_rows,
    log_tokens,
    scaled_count,
    spec_diff,
)
from sage_pipeline.sim.obs import CodeTaskObs, ObsSpec


def _ctx(tokens, steps=(0, 1, 9), roles=(0, 3, 7)) -> Contexts:
    n = len(tokens)
    return Contexts(role=np.array(roles[:n]), task_complexity_score=np.linspace(0.1, 0.9, n),
                    prompt_tokens=np.array(tokens, dtype=np.float64), step=np.array(steps[:n]),
                    failure_count=np.array(steps[:n]), primary_failure_count=np.zeros(n, np.int64))


def test_prompt_sizes_and_counts_as_features():
    np.testing.assert_allclose(log_tokens(np.array([np.nan, 0.0, 65536.0])), [0.0, 0.0, 1.0])
    assert log_tokens(np.array([2.0**20]))[0] == pytest.approx(np.log1p(2.0**20) / np.log1p(65536.0))  # not clipped
    np.testing.assert_allclose(scaled_count(np.array([0, 4, 8, 30]), 8), [0.0, 0.5, 1.0, 1.0])


def test_feature_spec_encodes_exact_values():
    x = FeatureSpec().encode(_ctx([np.nan, 1000.0, 70000.0]))
    assert x.shape == (3, len(FeatureSpec().roles) + 5) and x.dtype == np.float32
    assert x[0, 0] == 1 and x[1, 3] == 1 and x[2, 7] == 1 and x[:, :8].sum() == 3
    nr = 8
    np.testing.assert_allclose(x[:, nr], [0.1, 0.5, 0.9], rtol=1e-6)
    np.testing.assert_allclose(x[:, nr + 1], np.log1p([0.0, 1000.0, 70000.0]) / np.log1p(65536.0), rtol=1e-6)
    np.testing.assert_allclose(x[:, nr + 2], [0.0, 1 / 8, 1.0])


def test_routing_and_code_task_observations_share_the_numbers():
    tokens = np.array([300.0, 5000.0, 90000.0])
    obs = CodeTaskObs(role=np.zeros(3, np.int64), task=np.arange(3), family=np.array([0, 1, 0]),
                      difficulty=np.array([0.2, 0.5, 0.8]), prompt_tokens=tokens, step=np.array([0, 2, 12]),
                      failure_count=np.array([0, 2, 12]), primary_failure_count=np.array([0, 1, 3]),
                      last_outcome=np.array([0, 1, 2]))
    cols = obs.columns(8)
    np.testing.assert_allclose(cols["log_prompt_tokens"], log_tokens(tokens))
    np.testing.assert_allclose(cols["step"], scaled_count(np.array([0, 2, 12]), 8))
    x = ObsSpec(families=("lists", "strings")).encode(obs)
    np.testing.assert_allclose(x[:, 3], log_tokens(tokens), rtol=1e-6)  # after the 2 family columns and difficulty
    assert x[2, -len(ObsSpec().last_outcomes) + 2] == 1


def test_bad_batches_are_errors_that_name_the_column_and_row():
    with pytest.raises(ValueError, match=r"non-finite feature 'task_complexity_score' at row 1"):
        ctx = _ctx([10.0, 20.0])
        bad = Contexts(**{**ctx.__dict__, "task_complexity_score": np.array([0.5, np.inf])})
        FeatureSpec().encode(bad)
    with pytest.raises(ValueError, match=r"role index 9 at row 1 is outside its 8 values"):
        assemble(2, [OneHot("role", np.array([0, 9]), 8)])
    with pytest.raises(ValueError, match=r"Contexts.step has 2 rows, role has 3"):
        Contexts(role=np.zeros(3, np.int64), task_complexity_score=np.zeros(3), prompt_tokens=np.zeros(3),
                 step=np.zeros(2, np.int64), failure_count=np.zeros(3, np.int64),
                 primary_failure_count=np.zeros(3, np.int64))
    check_rows(_ctx([1.0, 2.0]))  # a consistent batch passes
    assert spec_diff({"a": 1, "b": 2}, {"a": 1, "b": 3}) == ["b: 2 != 3"]
    assert FeatureSpec().diff(FeatureSpec(max_count=4)) == ["max_count: 8 != 4"]
