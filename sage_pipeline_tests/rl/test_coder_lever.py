"""The coder lever's learner: the coder's first model per task joined to the task's outcome, per-model
objective with session-bootstrap intervals, a pin only when the difference is separated."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sage_pipeline.rl import coder_lever as cl
from sage_pipeline.sage.objective import TaskObjective

A, B = "qwen2.5-coder:1.5b", "qwen2.5-coder:14b-instruct-q4_K_M"


def _frames(n: int, p: dict, seed: int = 0, secs: dict | None = None):
    rng = np.random.default_rng(seed)
    models = rng.choice([A, B], size=n)
    ds, out = [], []
    for i, m in enumerate(models):
        sid = f"s{i}"
        ds.append({"role": "coder", "model": m, "session_id": sid, "task_id": "task_001",
                   "episode_id": f"{sid}/task_001", "step": 0, "source_line": 1})
        # a second coder decision of the same task (after a debugger without a patch) with the other model
        ds.append({"role": "coder", "model": A if m == B else B, "session_id": sid, "task_id": "task_001",
                   "episode_id": f"{sid}/task_001", "step": 2, "source_line": 9})
        ds.append({"role": "debugger", "model": "codestral:22b", "session_id": sid, "task_id": "task_001",
                   "episode_id": f"{sid}/task_001", "step": 1, "source_line": 5})
        v = float(rng.random() < p[m])
        out.append({"session_id": sid, "task_id": "task_001", "episode": 0, "verified": v, "ended": "verified",
                    "gpu_seconds": (secs or {}).get(m, 5.0), "usd": 0.0, "calls": 6})
    return pd.DataFrame(ds), pd.DataFrame(out)


def test_the_first_coder_model_of_each_task_is_joined_to_its_outcome():
    ds, out = _frames(50, {A: 0.5, B: 0.5})
    tasks, unjoined = cl.coder_tasks(ds, out)
    assert len(tasks) == 50 and unjoined == 0
    first = ds[ds["source_line"] == 1].set_index("session_id")["model"]
    assert (tasks.set_index("session_id")["model"] == first.reindex(tasks["session_id"]).to_numpy()).all()
    tasks2, unjoined2 = cl.coder_tasks(ds, out.iloc[:40])
    assert len(tasks2) == 40 and unjoined2 == 10


def test_a_clearly_better_model_is_pinned():
    ds, out = _frames(600, {A: 0.85, B: 0.97})
    d = cl.decide(cl.coder_tasks(ds, out)[0], TaskObjective())
    assert d.promote and d.model == B and "pin the coder" in d.reason
    assert d.per_model[B]["ci"][0] < d.per_model[B]["objective"] < d.per_model[B]["ci"][1]
    assert d.differences[f"{A} - {B}"]["ci"][1] < 0
    assert not cl.decide(cl.coder_tasks(ds, out)[0], TaskObjective(), current=B).promote  # already pinned


def test_no_difference_no_pin_and_few_tasks_say_how_many_more():
    ds, out = _frames(400, {A: 0.9, B: 0.9}, seed=3)
    d = cl.decide(cl.coder_tasks(ds, out)[0], TaskObjective())
    assert not d.promote and "not separated" in d.reason
    ds, out = _frames(20, {A: 0.5, B: 0.99}, seed=1)
    d = cl.decide(cl.coder_tasks(ds, out)[0], TaskObjective())
    assert not d.promote and "needs" in d.reason and "min_tasks 30" in d.reason


def test_gpu_time_can_outweigh_a_small_gain():
    ds, out = _frames(3000, {A: 0.90, B: 0.95}, seed=2, secs={A: 5.0, B: 600.0})
    tasks = cl.coder_tasks(ds, out)[0]
    assert cl.decide(tasks, TaskObjective(gpu_second_weight=0.0)).model == B
    d = cl.decide(tasks, TaskObjective(gpu_second_weight=1 / 3600))
    assert d.promote and d.model == A  # 595 more GPU-seconds a task (0.165 at the default price) outweigh 0.05


def test_one_model_logged_is_said():
    ds, out = _frames(100, {A: 0.9, B: 0.9})
    ds = ds[ds["model"] != B]
    out = out[out["session_id"].isin(ds["session_id"])]
    d = cl.decide(cl.coder_tasks(ds, out)[0], TaskObjective())
    assert not d.promote and "nothing to compare" in d.reason
    none = cl.decide(cl.coder_tasks(ds[ds["role"] != "coder"], out)[0], TaskObjective())
    assert not none.promote and none.model is None and "no coder decision" in none.reason


def test_bad_settings():
    with pytest.raises(ValueError):
        cl.CoderLeverConfig(confidence=1.2)
    with pytest.raises(ValueError):
        cl.CoderLeverConfig(min_tasks=1)


def test_ledger_runs_one_row_per_run_with_its_draw_id_and_task_v1():
    """The ledger's rows: one per sage run (session), task_v1 over its tasks of known verdict, the coder's first
    model, and the run's draw id from SAGE's trace_id (trajectories.parquet keeps it; the routing dataset not)."""
    ds, out = _frames(6, {A: 0.5, B: 0.5}, seed=4)
    out.loc[out["session_id"] == "s5", "verified"] = np.nan  # a run cut short: no verdict known
    traj = pd.DataFrame({"session_id": ["s0", "s0", "s1", "s2"], "trace_id": ["t0", "t0", "t1", None]})
    traces = cl.traces_by_session(traj)
    assert traces == {"s0": "t0", "s1": "t1"}
    runs = cl.ledger_runs(ds, out, TaskObjective(), traces)
    assert [r.session_id for r in runs] == [f"s{i}" for i in range(6)]
    first = ds[ds["source_line"] == 1].set_index("session_id")["model"]
    for r in runs:
        assert r.logged_model == first[r.session_id] and r.trace_id == traces.get(r.session_id)
        v = out.set_index("session_id").loc[r.session_id]
        assert (r.objective is None) == bool(np.isnan(v["verified"]))
        if r.objective is not None:
            assert r.objective == pytest.approx(v["verified"] - v["gpu_seconds"] / 3600)
    with pytest.raises(ValueError, match="one SAGE_TRACE_ID"):
        cl.traces_by_session(pd.DataFrame({"session_id": ["s0", "s0"], "trace_id": ["a", "b"]}))
    assert cl.traces_by_session(pd.DataFrame({"session_id": ["s0"]})) == {}


def test_decide_says_it_is_valid_for_one_night_only():
    assert "Valid for one night only" in cl.decide.__doc__ and "decisions.coder" in cl.decide.__doc__
