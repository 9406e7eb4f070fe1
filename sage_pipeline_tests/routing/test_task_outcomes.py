"""Each `sage run` task's outcome and cost from SAGE's own journal lines (fixtures/sage_run_lines)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sage_pipeline.routing import ingest, routing_dataset as rd, task_outcomes as to
from sage_pipeline.sage.objective import TaskObjective

SESSIONS = Path(__file__).resolve().parent / "fixtures" / "sage_run_lines" / "memory" / "sessions"


def _outcomes(folder: Path, out: Path, config: to.TaskOutcomeConfig | None = None) -> to.TaskOutcomes:
    res = ingest.ingest(ingest.IngestConfig([folder]), out, progress=lambda m: None)
    steps = pq.read_table(res.trajectories).to_pandas()
    read = lambda p: pq.read_table(p).to_pandas()  # noqa: E731
    return to.task_outcomes(steps[rd.is_workflow_step(steps)], read(res.routing_decisions), read(res.token_usage),
                            config, agent_insights=read(res.agent_insights))


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> to.TaskOutcomes:
    return _outcomes(SESSIONS, tmp_path_factory.mktemp("to"))


def test_verified_is_read_from_sages_gate_and_its_circuit_breaker(outcomes):
    f = outcomes.frame.set_index("task_id")
    assert f.loc[["task_001", "task_002", "task_004", "task_005"], "verified"].tolist() == [1.0] * 4
    assert f.loc["task_003", "ended"] == "circuit_breaker: timeout" and f.loc["task_003", "verified"] == 0
    assert f.loc["task_006", "ended"] == "circuit_breaker: retry_limit" and f.loc["task_006", "verified"] == 0
    assert outcomes.report["tasks"] == 6 and outcomes.report["tasks_verified"] == 4
    assert outcomes.report["tasks_unknown"] == 0


def test_every_call_sage_logged_is_one_tasks(outcomes, tmp_path):
    res = ingest.ingest(ingest.IngestConfig([SESSIONS]), tmp_path, progress=lambda m: None)
    tu = pq.read_table(res.token_usage).to_pandas()
    f = outcomes.frame
    after = outcomes.report["notes"].get("calls after the session's last workflow step (no task)", 0)
    assert int(f["calls"].sum()) + after == len(tu)
    assert f["prompt_tokens"].sum() == tu["prompt_tokens"].sum()  # here every call led to a step
    by_model = pd.DataFrame([json.loads(x) for x in f["calls_by_model"]]).fillna(0).sum()
    assert by_model.to_dict() == tu["model"].value_counts().to_dict()
    # local models only: seconds, no dollars; the seconds are the journal's gaps
    assert (f["usd"] == 0).all() and (f.loc[f["calls"] > 0, "gpu_seconds"] > 0).all()


def test_a_repaired_task_scores_below_a_first_try_pass(outcomes):
    f = outcomes.frame.set_index("task_id")
    first, repaired = f.loc["task_001"], f.loc["task_002"]  # PASS at once; FAIL, debug, FAIL, debug, PASS
    assert first["verified"] == repaired["verified"] == 1
    assert repaired["calls"] > first["calls"] and repaired["objective"] < first["objective"]
    # with the same calls they would tie: the objective depends on nothing else
    obj = TaskObjective()
    assert obj.score(1, first["gpu_seconds"], 0) == pytest.approx(first["objective"])


def test_clock_scale_and_api_prices(tmp_path):
    base = _outcomes(SESSIONS, tmp_path / "a").frame
    scaled = _outcomes(SESSIONS, tmp_path / "b", to.TaskOutcomeConfig(clock_scale=0.01)).frame
    assert np.allclose(scaled["gpu_seconds"], base["gpu_seconds"] * 100)
    priced = _outcomes(SESSIONS, tmp_path / "c", to.TaskOutcomeConfig(
        usd_per_million_prompt={"qwen2.5-coder:14b-instruct-q4_K_M": 1.0},
        usd_per_million_completion={"qwen2.5-coder:14b-instruct-q4_K_M": 2.0})).frame.set_index("task_id")
    assert priced.loc["task_002", "usd"] > 0 and priced.loc["task_001", "usd"] == 0
    assert priced.loc["task_002", "gpu_seconds"] < base.set_index("task_id").loc["task_002", "gpu_seconds"]


def test_a_journal_cut_short_leaves_the_task_unknown_not_failed(tmp_path):
    folder = tmp_path / "sessions"
    shutil.copytree(SESSIONS, folder)
    last = sorted(folder.glob("*.log"), key=ingest.journal_order)[-1]
    lines = last.read_text(encoding="utf-8").splitlines(keepends=True)
    # drop task_006's final orchestrator step: the run was killed before SAGE's breaker fired
    keep = [x for x in lines if not ('"agent": "orchestrator"' in x and "retry_limit" in x)]
    assert len(keep) == len(lines) - 1
    last.write_text("".join(keep), encoding="utf-8")
    out = _outcomes(folder, tmp_path / "o")
    t6 = out.frame.set_index("task_id").loc["task_006"]
    assert np.isnan(t6["verified"]) and np.isnan(t6["objective"]) and t6["ended"] == "unfinished"
    assert out.report["tasks_unknown"] == 1 and out.report["notes"][to.UNFINISHED] == 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        to.TaskOutcomeConfig(clock_scale=0)
    with pytest.raises(ValueError):
        to.TaskOutcomeConfig(objective={"gpu_second_weight": -1})
    with pytest.raises(ValueError, match="must price the same models"):
        to.TaskOutcomeConfig(usd_per_million_prompt={"m": 1.0})
    with pytest.raises(ValueError, match="finite and >= 0"):
        to.TaskOutcomeConfig(usd_per_million_prompt={"m": -1.0}, usd_per_million_completion={"m": 1.0})


def test_files_in_and_out(tmp_path):
    res = ingest.ingest(ingest.IngestConfig([SESSIONS]), tmp_path / "r", progress=lambda m: None)
    out = tmp_path / "task_outcomes.parquet"
    got = to.task_outcome_files(res.trajectories, res.routing_decisions, res.token_usage, out,
                                agent_insights=res.agent_insights)
    back = pq.read_table(out).to_pandas()
    assert len(back) == 6 and back["verified"].sum() == 4 and list(back.columns) == list(to.COLUMNS)
    # SAGE wrote TOKEN_USAGE here: the calls are those lines, with their tokens
    assert (back["calls_from"] == to.TOKEN_USAGE_READING).all() and back["prompt_tokens"].notna().all()
    assert got.report["sessions_by_calls_from"] == {to.TOKEN_USAGE_READING: 1}
    md = to.summary_markdown(got)
    assert "task_v1" in md and "verified share" in md
    # logs with no `sage run` workflow step: an empty table that says so
    empty = to.task_outcomes(pd.DataFrame(columns=["session_id"]), None, None)
    assert empty.frame.empty and "no `sage run` task" in to.summary_markdown(empty)
