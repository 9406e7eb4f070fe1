"""Task generation (spread, determinism, distinct tasks, edge-case tests, EvalPlus-style timeouts,
candidates) and verification by execution in the real local sandbox (equivalent mutants, failing
references, regeneration)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections import Counter

import pytest

from sage_pipeline.errors import ConfigError
from sage_pipeline.sim import mutants
from sage_pipeline.sim.families import FAMILIES, FamilyError
from sage_pipeline.sim.families.base import Family, spec
from sage_pipeline.sim.schema import (
    CANDIDATE_KINDS,
    DIFFICULTY_LEVELS,
    Candidate,
    ExecResult,
    TaskRecord,
    split_of,
)
from sage_pipeline.sim.tasks import (
    TaskGenerationError,
    generate_tasks,
    summarize,
    verify_tasks,
)

N_FAM = len(FAMILIES)


@pytest.fixture(scope="module")
def tasks():
    return generate_tasks(2 * N_FAM + 3, seed=11)


def _run(task, args):
    ns: dict = {}
    exec(compile(task.reference, "<reference>", "exec"), ns)  # noqa: S102 - our own generated code
    return json.loads(json.dumps(ns[task.entry_point](*json.loads(json.dumps(args)))))


def test_tasks_are_spread_over_every_family_with_ids_splits_and_levels(tasks):
    assert len(tasks) == 2 * N_FAM + 3
    per = Counter(t.family for t in tasks)
    assert set(per) == set(FAMILIES) and set(per.values()) == {2, 3}
    assert len({t.task_id for t in tasks}) == len(tasks)
    for t in tasks:
        assert re.fullmatch(rf"{t.family}-\d{{4}}", t.task_id)
        assert t.split == split_of(t.task_id)
        assert 0.0 <= t.difficulty <= 1.0 and t.difficulty_level in DIFFICULTY_LEVELS
        assert t.entry_point in t.signature and t.entry_point in t.prompt
    levels = Counter(t.difficulty_level for t in tasks)
    assert all(abs(levels[lvl] - len(tasks) / 3) <= 3 for lvl in DIFFICULTY_LEVELS), levels
    # levels are terciles of difficulty: every easy task is at most as hard as every hard one
    assert max(t.difficulty for t in tasks if t.difficulty_level == "easy") <= \
        min(t.difficulty for t in tasks if t.difficulty_level == "hard")


def test_generation_is_deterministic_for_a_seed():
    a = [t.to_dict() for t in generate_tasks(N_FAM, seed=5)]
    b = [t.to_dict() for t in generate_tasks(N_FAM, seed=5)]
    for x, y in zip(a, b):
        x.pop("timeout_s"), y.pop("timeout_s")  # measured: the only field allowed to vary
    assert a == b
    c = generate_tasks(N_FAM, seed=6)
    assert [t["prompt"] for t in a] != [t.prompt for t in c]


def test_tasks_are_distinct(tasks):
    assert len({t.prompt for t in tasks}) == len(tasks)
    assert len({(t.reference, json.dumps(t.tests)) for t in tasks}) == len(tasks)


def test_tests_come_from_the_reference_are_json_and_include_edge_cases(tasks):
    for t in tasks:
        assert len(t.tests) >= 8
        for case in t.tests:
            assert json.loads(json.dumps(case)) == case
            assert _run(t, case["args"]) == case["expected"]
        flat = json.dumps([c["args"] for c in t.tests[:4]])
        assert any(tok in flat for tok in ("[]", '""', "-", "[0]", '"a"', "[1]")) or \
            any(len(set(map(str, c["args"]))) == 1 and len(c["args"]) > 1 for c in t.tests[:4]), \
            f"{t.task_id}: no edge case among the first tests {flat}"


def test_timeouts_follow_evalplus_a_factor_of_the_reference_runtime_with_a_floor(tasks):
    assert all(t.timeout_s >= 0.3 for t in tasks)
    high_floor = generate_tasks(N_FAM, seed=11, min_timeout_s=2.0)
    assert {t.timeout_s for t in high_floor} == {2.0}  # the references take far less than 2 s / 4
    no_floor = generate_tasks(N_FAM, seed=11, min_timeout_s=1e-6, time_factor=50.0)
    assert all(1e-6 <= t.timeout_s < 2.0 for t in no_floor)
    assert len({t.timeout_s for t in no_floor}) > 1  # measured, not a constant


def test_each_task_has_its_reference_and_distinct_wrong_candidates(tasks):
    for t in tasks:
        kinds = [c.kind for c in t.candidates]
        assert kinds[0] == "reference" and t.candidates[0].code == t.reference
        assert len(t.wrong_candidates()) == 4 and set(kinds) <= set(CANDIDATE_KINDS)
        assert len({c.candidate_id for c in t.candidates}) == len(t.candidates)
        for c in t.candidates:
            assert re.fullmatch(rf"{re.escape(t.task_id)}/{c.kind}(-\d+)?", c.candidate_id)
        # mutants really differ: from the reference and from each other, as ASTs
        assert len({mutants.fingerprint(c.code) for c in t.candidates}) == len(t.candidates)


def test_infinite_loops_and_memory_blowups_are_a_minority():
    many = generate_tasks(10 * N_FAM, seed=2)
    share = {k: sum(any(c.kind == k for c in t.candidates) for t in many) / len(many)
             for k in ("infinite_loop", "memory_blowup")}
    assert all(0.05 <= v <= 0.22 for v in share.values()), share
    none = generate_tasks(N_FAM, seed=2, infinite_loop_share=0.0, memory_blowup_share=0.0)
    assert not any(c.kind in ("infinite_loop", "memory_blowup") for t in none for c in t.candidates)


def test_a_subset_of_families():
    out = generate_tasks(5, families=["rpn", "bits"])
    assert Counter(t.family for t in out) == {"rpn": 3, "bits": 2}


@pytest.mark.parametrize("kwargs, field, text", [
    ({"n_tasks": N_FAM - 1}, "n_tasks", "below the number of families"),
    ({"n_tasks": 3, "families": ["rpn", "nope"]}, "families", "unknown family 'nope'"),
    ({"n_tasks": 3, "families": ["rpn", "rpn"]}, "families", "more than once"),
    ({"n_tasks": 3, "families": []}, "families", "is empty"),
    ({"n_tasks": N_FAM, "n_wrong": 2}, "n_wrong", "2: Input should be greater than or equal to 3 (wrong candidates "
                                                  "per task, in [3, 7]"),
    ({"n_tasks": N_FAM, "infinite_loop_share": 0.9}, "infinite_loop_share", "0.9: Input should be less than or "
                                                                            "equal to 0.5 (share of tasks"),
    ({"n_tasks": N_FAM, "time_factor": 0.5}, "time_factor", "greater than or equal to 1"),
    ({"n_tasks": N_FAM, "n_wrongs": 4}, "n_wrongs", "Extra inputs are not permitted"),
])
def test_bad_config_is_a_clear_error(kwargs, field, text):
    with pytest.raises(ConfigError) as e:
        generate_tasks(**kwargs)
    assert e.value.field == field and text in str(e.value) and "sim_tasks config" in str(e.value)
    if field == "families" and "unknown" in text:
        assert "known: " in str(e.value) and "rpn" in str(e.value).split("known: ")[1]


def _tiny(rng, n_params: int = 2, broken: bool = False):
    k = rng.randrange(n_params)
    body = "1 // x" if broken else f"x + {k}"
    code = f"def add_k(x: int) -> int:\n    return {body}\n"
    return spec("tiny_test", {"k": k}, f"Return x plus {k}.", "add_k", "def add_k(x: int) -> int", code,
                [[0], [-1], [1], [5]], [[rng.randint(-9, 9)] for _ in range(6)], 0.1)


def test_a_family_that_cannot_fill_its_quota_or_whose_reference_raises_fails_generation(monkeypatch):
    monkeypatch.setitem(FAMILIES, "tiny_test", Family("tiny_test", "arithmetic", 0.1, _tiny, __name__))
    with pytest.raises(TaskGenerationError,
                       match=r"family tiny_test .* gave only 2 distinct tasks .* 5 were asked"):
        generate_tasks(5, families=["tiny_test"])
    broken = Family("tiny_test", "arithmetic", 0.1, lambda rng: _tiny(rng, broken=True), __name__)
    monkeypatch.setitem(FAMILIES, "tiny_test", broken)
    with pytest.raises(FamilyError, match=r"family tiny_test .* raises ZeroDivisionError.* on add_k\(0\)"):
        generate_tasks(1, families=["tiny_test"])


def test_summarize_counts_per_family_and_level(tasks):
    s = summarize(tasks)
    assert s["tasks"] == len(tasks) == sum(s["families"].values()) == sum(s["levels"].values())
    assert s["families"] == dict(Counter(t.family for t in tasks))
    assert all(sum(v.values()) == s["families"][f] for f, v in s["family_levels"].items())
    assert s["candidates"]["reference"] == len(tasks)
    assert len(s["rows"]) == N_FAM and {"family", "tasks", *DIFFICULTY_LEVELS} <= set(s["rows"][0])
    json.dumps(s)


# ----------------------------------------------------------------------------- verification (real sandbox)

def _noop(code: str, i: int) -> str:
    """Behaves exactly like ``code`` (an unused module constant): an equivalent mutant."""
    return mutants.normalise(f"{code}\n\nUNUSED_{i} = {i}\n")


def test_verify_marks_equivalents_drops_failing_references_and_regenerates(local_sandbox):
    ts = generate_tasks(6, seed=3, families=["filtered_aggregate", "to_base", "set_algebra"],
                        infinite_loop_share=0.0, memory_blowup_share=0.0)
    a, b, c = ts[0], ts[2], ts[4]  # one task of each family
    ts[0] = dataclasses.replace(a, candidates=a.candidates + [
        Candidate(f"{a.task_id}/wrong_operator-9", "wrong_operator", _noop(a.reference, 0))])
    broken_ref = b.reference.replace("return sign + ", "return sign + '~' + ", 1)  # a stray character
    assert broken_ref != b.reference
    ts[2] = dataclasses.replace(b, candidates=[Candidate(f"{b.task_id}/reference", "reference", broken_ref)]
                                + b.candidates[1:])
    ts[4] = dataclasses.replace(c, candidates=[c.candidates[0]] + [
        Candidate(f"{c.task_id}/off_by_one-{i}", "off_by_one", _noop(c.reference, i)) for i in range(3)])

    kept, report = verify_tasks(ts, local_sandbox.run)
    by_id = {t.task_id: t for t in kept}
    assert b.task_id not in by_id and len(kept) == 5
    (drop,) = report.dropped
    assert drop["task_id"] == b.task_id and drop["family"] == "to_base"
    assert drop["reason"].startswith(("reference wrong_answer", "reference exception"))
    # the on-purpose equivalent mutant is kept, marked, and not a wrong answer
    va = by_id[a.task_id]
    eq = next(x for x in va.candidates if x.candidate_id.endswith("/wrong_operator-9"))
    assert eq.equivalent and eq not in va.wrong_candidates()
    # the task whose wrong candidates were all equivalent got new ones and kept at least 3
    vc = by_id[c.task_id]
    assert c.task_id in report.regenerated and len(vc.wrong_candidates()) >= 3
    assert sum(x.equivalent for x in vc.candidates) == 3
    assert report.outcomes["reference"]["pass"] == 5 and sum(report.outcomes["reference"].values()) == 6
    assert report.equivalent["off_by_one"] >= 3 and report.equivalent["wrong_operator"] >= 1
    assert report.tasks_in == 6 and report.tasks_out == 5 and report.rounds >= 2
    assert report.per_family == {"filtered_aggregate": 2, "to_base": 1, "set_algebra": 2}
    assert sum(report.per_level.values()) == 5
    json.dumps(report.to_dict())


def test_verify_raises_when_a_family_is_broken(local_sandbox):
    ts = generate_tasks(3, seed=4, families=["digit_stat"])
    broken = [dataclasses.replace(t, candidates=[Candidate(f"{t.task_id}/reference", "reference",
                                                           t.reference.replace("return", "return 7 + ", 1))])
              for t in ts[:2]] + [dataclasses.replace(ts[2], candidates=ts[2].candidates[:1])]
    with pytest.raises(TaskGenerationError, match=r"family digit_stat is broken: 2 of 3 references failed"):
        verify_tasks(broken, local_sandbox.run)


def test_verify_refuses_a_runner_that_loses_results():
    ts = generate_tasks(1, families=["bits"])
    with pytest.raises(RuntimeError, match=r"returned 0 results for 5 jobs"):
        verify_tasks(ts, lambda jobs: [])


def test_verify_suspects_the_sandbox_when_references_fail_across_families(local_sandbox):
    ts = generate_tasks(4, seed=4, families=["digit_stat", "bits"])
    broken = [dataclasses.replace(t, candidates=[Candidate(f"{t.task_id}/reference", "reference",
                                                           t.reference.replace("return", "return 7 + ", 1))])
              for t in ts]
    with pytest.raises(TaskGenerationError,
                       match=r"4 of 4 references failed .* in 2 families .* suspect the sandbox"):
        verify_tasks(broken, local_sandbox.run)


def test_verify_drops_a_task_that_cannot_get_three_wrong_candidates(local_sandbox):
    ref = mutants.normalise("def one() -> str:\n    return 'x'\n")
    task = TaskRecord(task_id="tiny-0000", family="tiny", difficulty=0.1, difficulty_level="easy", prompt="p",
                      signature="def one() -> str", entry_point="one", reference=ref,
                      tests=[{"args": [], "expected": "x"}], timeout_s=0.3,
                      candidates=[Candidate("tiny-0000/reference", "reference", ref)])
    kept, report = verify_tasks([task], local_sandbox.run)
    assert kept == []
    (drop,) = report.dropped
    assert drop["task_id"] == "tiny-0000" and "only 1 non-equivalent wrong candidates" in drop["reason"]
    assert report.regenerated == ["tiny-0000"]


def test_a_reference_timeout_is_run_again_before_the_task_is_dropped(local_sandbox):
    ts = generate_tasks(2, seed=5, families=["bits"], infinite_loop_share=0.0, memory_blowup_share=0.0)
    slow_ref = mutants.normalise("import time\n\n\n" + ts[1].reference.replace(
        "def bit_op(x: int) -> int:\n", "def bit_op(x: int) -> int:\n    time.sleep(1)\n", 1))
    assert "time.sleep(1)" in slow_ref
    slow = Candidate(f"{ts[1].task_id}/reference", "reference", slow_ref)
    ts[1] = dataclasses.replace(ts[1], candidates=[slow] + ts[1].candidates[1:])
    spiked = {ts[0].reference}  # the first run of this reference "meets a load spike"

    def spiky_run(jobs):
        results = local_sandbox.run(jobs)
        for i, j in enumerate(jobs):
            if j.code in spiked:
                spiked.discard(j.code)
                results[i] = ExecResult("timeout", 0, len(j.tests), j.timeout_s, "")
        return results

    kept, report = verify_tasks(ts, spiky_run)
    # the spike cost nothing; the reference that is really too slow is dropped after its second run
    assert [t.task_id for t in kept] == [ts[0].task_id]
    assert report.reference_retries == 2
    (drop,) = report.dropped
    assert drop["task_id"] == ts[1].task_id and drop["reason"].startswith("reference timeout")


# verify_tasks's phases one at a time ---------------------------------------------------------------

def _verification(results_by_code: dict[str, str]):
    from sage_pipeline.sim.tasks import VerifyReport, _Runner, _Verification

    def run(jobs):
        return [ExecResult(results_by_code.get(j.code, "wrong_answer"), 0, 1, 0.0) for j in jobs]

    return _Verification(_Runner(run, None, 100), VerifyReport(tasks_in=1))


def test_mark_flags_equivalent_mutants_and_counts_each_outcome_once_after_the_first_round():
    t = generate_tasks(1, seed=2, families=["bits"])[0]
    mutant = next(c for c in t.candidates if c.kind != "reference")
    v = _verification({mutant.code: "pass"})
    v.runner.run([_job_of(t, c.code) for c in t.candidates])
    marked = v.mark(t, first_round=True)
    assert [c.candidate_id for c in marked.candidates if c.equivalent] == [mutant.candidate_id]
    n_wrong = sum(1 for c in t.candidates if c.kind != "reference")
    assert sum(sum(k.values()) for k in v.outcomes.values()) == n_wrong
    v.mark(marked, first_round=False)  # nothing new: nothing counted again
    assert sum(sum(k.values()) for k in v.outcomes.values()) == n_wrong


def test_keep_drops_a_task_short_of_wrong_candidates_with_the_reason_and_keeps_the_input_order():
    ts = generate_tasks(3, seed=2, families=["bits"])
    v = _verification({})
    v.report.rounds = 3
    short = dataclasses.replace(ts[1], candidates=ts[1].candidates[:2])
    kept = v.keep(ts, {ts[2].task_id: ts[2], ts[0].task_id: ts[0], short.task_id: short}, min_wrong=3)
    assert [t.task_id for t in kept] == [ts[0].task_id, ts[2].task_id]
    assert v.report.dropped == [{"task_id": short.task_id, "family": "bits",
                                 "reason": "only 1 non-equivalent wrong candidates after 3 rounds (need 3)"}]


def test_broken_families_raise_naming_the_family_or_the_sandbox():
    from sage_pipeline.sim.tasks import _raise_for_broken_families

    _raise_for_broken_families({"bits": [("b-1", "x")]}, Counter(bits=3), 3)  # one failure is not a broken family
    with pytest.raises(TaskGenerationError, match=r"family bits is broken: 2 of 3 references failed .*b-1: x"):
        _raise_for_broken_families({"bits": [("b-1", "x"), ("b-2", "y")]}, Counter(bits=3), 3)
    with pytest.raises(TaskGenerationError, match=r"4 of 5 references failed in the sandbox, in 2 families"):
        _raise_for_broken_families({"bits": [("b-1", "x"), ("b-2", "y")], "digit_stat": [("d-1", "z"), ("d-2", "z")]},
                                   Counter(bits=2, digit_stat=3), 5)


def _job_of(task, code):
    from sage_pipeline.sim.tasks import _job

    return _job(task, code)
