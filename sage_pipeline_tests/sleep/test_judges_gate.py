"""Judges (exact, rules, rubric through a backend, unit tests through the sandbox) and the gate."""

from __future__ import annotations

import pytest

from sage_pipeline.sleep.gate import GateConfig, compare, summary
from sage_pipeline.sleep.judges import UnitTestJudge, extract_code
from sage_pipeline.sleep.records import TaskRecord, TaskResult, normalise_reference


def test_extract_code_takes_the_fenced_block():
    assert extract_code("Here:\n```python\ndef f():\n    return 1\n```\nDone") == "def f():\n    return 1\n"
    assert extract_code("def f(): return 1") == "def f(): return 1"


def test_unit_tests_run_in_the_sandbox_and_are_cached():
    ref = normalise_reference("unit_tests", {"entry_point": "half", "tests": [
        {"args": [7], "expected": 3}, {"args": [-3], "expected": -2}], "timeout_s": 5})
    task = TaskRecord("u1", "Write half", "unit_tests", ref)
    judge = UnitTestJudge(sandbox="local")
    try:
        good, bad, crash = judge.run([(task, "```python\ndef half(n):\n    return n // 2\n```"),
                                      (task, "def half(n):\n    return int(n / 2)\n"),
                                      (task, "def half(n):\n    raise ValueError('no')\n")])
        assert (good.hard, good.soft) == (1.0, 1.0)
        assert bad.hard == 0.0 and bad.soft == 0.5 and bad.why.startswith("wrong_answer: 1/2 tests")
        assert crash.hard == 0.0 and crash.why.startswith("exception")
        assert judge.executed == 3
        judge.run([(task, "def half(n):\n    return int(n / 2)\n")])
        assert judge.executed == 3  # same code and tests: cached verdict
        assert judge.describe()["isolated"] is False and "unisolated" in judge.describe()["note"]
    finally:
        judge.close()


def _results(scores: dict[str, tuple[float, float]]) -> list[TaskResult]:
    return [TaskResult(t, "val", h, s, "", "") for t, (h, s) in scores.items()]


def test_gate_accepts_only_strict_improvement_and_ties_reject():
    # the old rule, kept as test="strict" for comparison (the paired default: test_gate.py)
    base = _results({"a": (0, 0.5), "b": (1, 1), "c": (0, 0)})
    better = _results({"a": (1, 1), "b": (1, 1), "c": (0, 0)})
    cfg = GateConfig(test="strict", metric="hard")
    t = compare(base, better, cfg, ["add x"])
    assert t.accepted and t.verdict == "better" and t.improved == ["a"] and t.regressed == []
    tie = compare(base, base, cfg)
    assert not tie.accepted and tie.verdict == "tie" and "strictly better" in tie.reason
    worse = compare(better, base, cfg)
    assert not worse.accepted and worse.verdict == "worse"


def test_gate_metric_decides_what_counts():
    base = _results({"a": (0, 0.2), "b": (0, 0.2)})
    soft_only = _results({"a": (0, 0.9), "b": (0, 0.2)})
    assert not compare(base, soft_only, GateConfig(test="strict", metric="hard")).accepted
    assert compare(base, soft_only, GateConfig(test="strict", metric="soft")).accepted
    assert compare(base, soft_only, GateConfig(test="strict", metric="mixed", hard_weight=0.5)).accepted
    assert not compare(base, soft_only, GateConfig(test="strict", metric="mixed", hard_weight=1.0)).accepted
    assert summary(soft_only, GateConfig(test="strict", metric="mixed"))["score"] == pytest.approx((0.45 + 0.1) / 2)


def test_no_regression_catches_a_drop_the_mean_hides():
    base = _results({"a": (0, 0), "b": (0, 0), "c": (1, 1)})
    cand = _results({"a": (1, 1), "b": (1, 1), "c": (0, 0)})  # mean 1/3 -> 2/3, but c breaks
    on = compare(base, cand, GateConfig(test="strict", metric="hard", no_regression=True))
    assert not on.accepted and on.verdict == "regression" and on.regressed == ["c"] and "c" in on.reason
    off = compare(base, cand, GateConfig(test="strict", metric="hard", no_regression=False))
    assert off.accepted and off.regressed == ["c"] and "got worse (c)" in off.reason
    assert compare(base, base, GateConfig(test="strict", mode="off")).accepted  # comparison mode only


def test_gate_config_refuses_nonsense():
    for kw, allowed in [({"metric": "f1"}, "'hard', 'soft' or 'mixed'"),
                        ({"hard_weight": 2}, "less than or equal to 1"),
                        ({"granularity": "all"}, "'edit' or 'bundle'"), ({"mode": "maybe"}, "'on' or 'off'")]:
        with pytest.raises(ValueError) as ei:  # the field, then what is allowed
            GateConfig(**kw)
        field = next(iter(kw))
        assert f"\n{field}\n" in str(ei.value) and allowed in str(ei.value), str(ei.value)
    with pytest.raises(ValueError, match="same val tasks"):
        compare(_results({"a": (0, 0)}), _results({"b": (0, 0)}), GateConfig())
