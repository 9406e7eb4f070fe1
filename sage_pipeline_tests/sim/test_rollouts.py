"""Rollouts: shards, the reference re-run, and what the cache keeps."""

from __future__ import annotations

import pytest

from sage_pipeline.sim import rollouts as ro
from sage_pipeline.sim.cache import ExecutionCache
from sage_pipeline.sim.schema import Candidate, ExecResult, TaskRecord

TESTS = [{"args": [1], "expected": 2}]


def _task(i: int) -> TaskRecord:
    ref = Candidate(f"t-{i}/reference", "reference", f"def f(x):\n    return 2 * x  # {i}\n")
    wrong = Candidate(f"t-{i}/off_by_one", "off_by_one", f"def f(x):\n    return 2 * x + 1  # {i}\n")
    return TaskRecord(f"t-{i}", "fam", 0.5, "medium", "double x", "def f(x: int) -> int", "f", ref.code,
                      TESTS, 0.3, [ref, wrong])


def test_shards_are_stable_and_cover_every_task():
    ids = [f"task-{i}" for i in range(200)]
    shards = [ro.shard_of(t, 4) for t in ids]
    assert set(shards) == set(ro.shard_names(4))
    assert shards == [ro.shard_of(t, 4) for t in ids]


def test_a_reference_that_timed_out_is_run_again_and_the_second_answer_kept(tmp_path):
    calls = []

    def run(jobs):
        calls.append(len(jobs))
        out = []
        for j in jobs:
            if "2 * x +" in j.code:
                out.append(ExecResult("wrong_answer", 0, 1, 0.01))
            elif len(calls) == 1:  # a load spike on the first pass
                out.append(ExecResult("timeout", 0, 1, 0.3))
            else:
                out.append(ExecResult("pass", 1, 1, 0.01))
        return out

    cache = ExecutionCache(tmp_path / "cache")
    df, stats = ro.run_rollouts([_task(0), _task(1)], run, "local", cache)
    assert calls == [4, 2] and stats["reference_reruns"] == 2
    assert df.set_index("candidate_kind").loc["reference", "passed"].all()
    assert ro.check_references(df) == []
    # The cache holds the second answer: a re-run executes nothing.
    df2, stats2 = ro.run_rollouts([_task(0), _task(1)], run, "local", ExecutionCache(tmp_path / "cache"))
    assert stats2["executed"] == 0 and calls == [4, 2] and df2["passed"].sum() == 2


def test_reading_rollouts_that_are_not_there_says_what_to_do(tmp_path):
    with pytest.raises(ro.RolloutsError, match="materialize every partition of sandbox_rollouts"):
        ro.read_rollouts(tmp_path)
