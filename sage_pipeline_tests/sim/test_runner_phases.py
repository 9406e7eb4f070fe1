"""The runner's main, phase by phase, where a phase needs no zygote: its settings and the answer
it builds from what the zygote and the judge reported (the whole runner runs in the sandbox tests)."""

from __future__ import annotations

import json
import os

from sage_pipeline.sim import runner

TESTS = [{"args": [1], "expected": 2}, {"args": [2], "expected": 3}]


def test_config_defaults_and_no_uid_to_drop_to_without_root():
    cfg = runner._config(["runner"])
    assert (cfg["workroot"], cfg["memory_bytes"], cfg["nproc"]) == ("/tmp", 384 << 20, 64)
    if os.geteuid() == 0:
        assert (cfg["drop_uid"], cfg["judge_uid"]) == (65534, 65533)
    else:
        assert (cfg["drop_uid"], cfg["judge_uid"]) == (None, None)
    mine = runner._config(["runner", json.dumps({"workroot": "/w", "drop_uid": None, "judge_uid": 7})])
    assert mine["workroot"] == "/w" and (mine["drop_uid"], mine["judge_uid"]) == (None, None)


def _done(lines, status=0, output="", setup=""):
    return {"result": "\n".join(json.dumps(x) for x in lines), "status": status, "output": output, "setup": setup}


def test_reply_is_the_verdict_with_id_runtime_output_and_why_the_runner_is_dirty():
    req = {"id": 7, "tests": TESTS}
    ok = runner._reply(req, False, _done([{"i": 0, "out": 2}, {"i": 1, "out": 3}], output="hi"), None, False,
                       0.25, [])
    assert ok == {"outcome": "pass", "tests_passed": 2, "tests_total": 2, "id": 7, "runtime_s": 0.25,
                  "output": "output: hi"}
    wrong = runner._reply(req, False, _done([{"i": 0, "out": 2}, {"i": 1, "out": 9}]), None, False, 0.1,
                          ["1 processes survived the sweep"])
    assert wrong["outcome"] == "wrong_answer" and wrong["output"] == "test 1: returned 9"
    assert wrong["dirty"] == "1 processes survived the sweep"
    late = runner._reply(req, False, _done([{"i": 0, "out": 2}]), None, True, 3.0, [])
    assert late["outcome"] == "timeout" and late["tests_passed"] == 1


def test_a_failed_set_up_is_an_infra_error_not_a_verdict():
    said = runner._reply({"id": 1, "tests": TESTS}, False, _done([], setup="cannot setrlimit"), None, False, 0.1,
                         ["2 entries left in /tmp (a, b)"])
    assert said == {"id": 1, "infra_error": "sandbox child set-up failed: cannot setrlimit",
                    "dirty": "2 entries left in /tmp (a, b)"}


def test_a_suite_job_is_judged_by_the_judges_result_and_a_candidate_outliving_it_is_not_blamed():
    judged = {"result": "", "judge_status": 0, "judge_setup": "", "candidate_stopped": True}
    done = _done([], status=9)
    verdict = runner._reply({"id": 2, "tests": [{"check": "assert f(1) == 2"}]}, True, done, judged, False, 0.5, [])
    assert done["status"] is None and done["judge_status"] == 0  # what the judge said replaced the candidate's
    assert verdict["id"] == 2 and verdict["tests_total"] == 1 and "outcome" in verdict
