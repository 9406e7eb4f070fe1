"""Replay: run every task of a split under a (skill, memory) pair through the backend and judge it.

``samples`` replays each task that many times (the gate's repeated draws above temperature 0):
the results hold every task once, then every task again, and so on, each replay judged on its
own. Answers come first (in parallel over ``workers`` threads for a remote backend), then the
judges: exact and rules in process, rubrics by the backend, unit tests in one sandbox
batch. A :class:`~sage_pipeline.sleep.backends.BackendError` or
:class:`~sage_pipeline.sleep.judges.JudgeError` propagates: a failed call is never a score.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from sage_pipeline.sleep.backends import Backend
from sage_pipeline.sleep.judges import Judgement, UnitTestJudge, judge_exact, judge_rubric, judge_rules
from sage_pipeline.sleep.records import TaskRecord, TaskResult

HEAD = 160


def map_workers(fn: Callable, items: Sequence, workers: int) -> list:
    """``[fn(x) for x in items]``, over ``workers`` threads when more than one; the first error cancels the rest."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=workers) as ex:
        futures = [ex.submit(fn, x) for x in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def replay(tasks: Sequence[TaskRecord], skill: str, memory: str, backend: Backend, unit: UnitTestJudge,
           workers: int = 1, log: Callable[[str], None] | None = None, label: str = "",
           samples: int = 1) -> list[TaskResult]:
    """Every task answered under (skill, memory) and judged, in the order of ``tasks``, ``samples``
    times over."""
    if samples < 1:
        raise ValueError(f"samples={samples}: replay each task at least once")
    if not tasks:
        return []
    n_tasks = len(tasks)
    tasks = list(tasks) * samples
    t0 = time.monotonic()
    replies = map_workers(lambda t: backend.solve(t, skill, memory), tasks, workers)
    verdicts: list[Judgement | None] = [None] * len(tasks)
    rubric = [i for i, t in enumerate(tasks) if t.reference_kind == "rubric"]
    code = [i for i, t in enumerate(tasks) if t.reference_kind == "unit_tests"]
    for i, t in enumerate(tasks):
        if t.reference_kind == "exact":
            verdicts[i] = judge_exact(t.reference, replies[i].text)
        elif t.reference_kind == "rules":
            verdicts[i] = judge_rules(t.reference, replies[i].text)
    for i, v in zip(rubric, map_workers(lambda i: judge_rubric(tasks[i], replies[i].text, backend), rubric, workers),
                    strict=True):
        verdicts[i] = v
    if code:
        for i, v in zip(code, unit.run([(tasks[i], replies[i].text) for i in code]), strict=True):
            verdicts[i] = v
    out = [TaskResult(t.id, t.split, v.hard, v.soft, r.text[:HEAD], v.why, r.prompt_tokens + r.completion_tokens)
           for t, r, v in zip(tasks, replies, verdicts, strict=True)]
    if log is not None:
        dt = time.monotonic() - t0
        times = f" x {samples} samples" if samples > 1 else ""
        log(f"replayed {n_tasks} {label} tasks{times} in {dt:.1f} s ({len(tasks) / max(dt, 1e-9):.0f}/s): "
            f"hard {np.mean([r.hard for r in out]):.3f}, soft {np.mean([r.soft for r in out]):.3f}")
    return out
