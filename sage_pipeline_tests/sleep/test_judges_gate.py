"""Judges (exact, rules, rubric through a backend, unit tests through the sandbox) and the gate."""

from __future__ import annotations

import pytest

from sage_pipeline.sleep.backends import BackendError, OpenAIBackend, OpenAIConfig
from sage_pipeline.sleep.gate import GateConfig, compare, summary
from sage_pipeline.sleep.judges import UnitTestJudge, extract_code, judge_exact, judge_rubric, judge_rules
from sage_pipeline.sleep.records import TaskRecord, TaskResult, normalise_reference


def test_exact_matches_whole_answer_or_last_line_and_gives_partial_credit():
    assert judge_exact("404", " 404. ").hard == 1.0
    assert judge_exact("404", "The status is:\n404").hard == 1.0
    j = judge_exact("exit status 2", "exit status 1")
    assert j.hard == 0.0 and 0.6 < j.soft < 0.7 and "expected 'exit status 2'" in j.why


def test_rules_each_check_and_soft_share():
    checks = normalise_reference("rules", [
        {"contains": "SQL injection", "ignore_case": True}, {"not_contains": "LGTM"}, {"regex": r"\bline 12\b"},
        {"not_regex": "you"}, {"startswith": "major:"}, {"endswith": "."}, {"max_chars": 80}, {"min_chars": 10},
        {"max_lines": 1}])
    good = "major: sql injection on line 12: pass the name as a parameter."
    assert judge_rules(checks, good).hard == 1.0
    j = judge_rules(checks, "LGTM, you did fine")
    assert j.hard == 0.0 and j.soft == pytest.approx(3 / 9)  # only the three size checks pass
    assert "contains 'SQL injection' failed" in j.why and "not_contains 'LGTM' failed" in j.why
    js = normalise_reference("rules", [{"json": True}])
    assert judge_rules(js, '{"a": 1}').hard == 1.0 and judge_rules(js, "{a: 1}").hard == 0.0


def test_rubric_is_graded_by_the_backend_and_a_bad_grade_is_a_backend_error(chat_server):
    task = TaskRecord("r1", "Explain", "rubric", "Passes if it mentions the logger.")
    b = OpenAIBackend(OpenAIConfig(base_url=chat_server.base_url, model="m", max_retries=0), sleep=lambda s: None)
    chat_server.script = [("ok", '```json\n{"score": 0.9, "pass": true, "why": "ok"}\n```')]
    j = judge_rubric(task, "use the logger", b)
    assert (j.hard, j.soft) == (1.0, 0.9)
    assert "Passes if it mentions the logger." in chat_server.requests[0]["body"]["messages"][1]["content"]
    chat_server.script = [("ok", '{"score": 0.9, "pass": true}'), ("ok", "I'd give it a 7/10")]
    with pytest.raises(BackendError, match="rubric judge reply is not valid JSON") as ei:
        judge_rubric(task, "another answer", b)
    assert ei.value.kind == "reply"
    chat_server.script = [("ok", '{"score": 7, "pass": true}')]
    with pytest.raises(BackendError, match=r"score 7 is not a number in \[0, 1\]"):
        judge_rubric(task, "third answer", b)


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
