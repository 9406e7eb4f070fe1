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


def _rows(outcomes: pd.DataFrame) -> pd.DataFrame:
    """Routing rows for each task of ``outcomes`` (three decisions each) plus one episode with no task."""
    eps = list(to.episode_ids(outcomes)) + ["orphan/task_x"]
    return pd.DataFrame([{"episode_id": e, "session_id": e.split("/")[0], "step": s, "reward": 1.15,
                          "reward_version": "reward_v1"} for e in eps for s in (2, 0, 1)])


def test_objective_rewards_make_each_episodes_return_its_tasks_objective(outcomes):
    f = outcomes.frame.copy()
    f.loc[f["task_id"] == "task_006", "verified"] = np.nan  # a task whose journal was cut short
    out, report = to.objective_rewards(_rows(f), f)
    ret = out.groupby("episode_id")["reward"].sum()
    known = f[f["verified"].notna()]
    assert ret.to_dict() == pytest.approx(dict(zip(to.episode_ids(known), known["objective"])))
    # the objective sits on each episode's last decision; every other decision carries 0
    last = out.groupby("episode_id")["step"].transform("max") == out["step"]
    assert (out.loc[~last, "reward"] == 0).all() and (out["reward_version"] == "task_v1").all()
    verdict = dict(zip(to.episode_ids(known), known["verified"]))
    assert out["task_verified"].tolist() == out["episode_id"].map(verdict).tolist()
    assert report == {"episodes": 7, "scored": 5, to.OBJECTIVE_UNKNOWN: 1, to.OBJECTIVE_NO_OUTCOME: 1}
    # a repaired failure's return is below a first-try pass's (summed reward_v1 had them the other way)
    ep = dict(zip(f["task_id"], to.episode_ids(f)))
    assert ret[ep["task_002"]] < ret[ep["task_001"]]


def test_objective_rewards_refuse_outcomes_they_cannot_join(outcomes):
    with pytest.raises(ValueError, match="lack the columns.*objective"):
        to.objective_rewards(_rows(outcomes.frame), outcomes.frame.drop(columns=["objective"]))
    twice = pd.concat([outcomes.frame, outcomes.frame.iloc[:1]])
    with pytest.raises(ValueError, match="same episode twice"):
        to.objective_rewards(_rows(outcomes.frame), twice)


def test_offline_eval_judges_the_task_objective_and_says_when_it_cannot(outcomes):
    from sage_pipeline.rl import offline_eval as oe

    rows, f = _rows(outcomes.frame), outcomes.frame
    out, judged = oe.objective_rows(rows, f)
    assert judged["judged_on"] == "task_v1" and judged["scored"] == 6 and len(out) == 18
    same, why = oe.objective_rows(rows, f, simulated=True)  # the routing simulator's truth is in reward_v1
    assert same is rows and why["judged_on"] == "reward_v1" and "simulator" in why["why"]
    same, why = oe.objective_rows(rows, None)
    assert same is rows and "no `sage run` task" in why["why"]
    same, why = oe.objective_rows(rows, f, "reward_v1")
    assert same is rows and "comparison only" in why["why"]
    with pytest.raises(ValueError, match="objective must be one of"):
        oe.objective_rows(rows, f, "return")
