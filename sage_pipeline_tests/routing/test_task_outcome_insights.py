"""SAGE's calls read from what SAGE really writes when it writes no TOKEN_USAGE (against Ollama and the
model world): its agents' AGENT_INSIGHT_EMITTED decisions, kept by the ingest in agent_insights.parquet,
and the time to the next journal line. On SAGE-written lines only: fixtures/sage_agent_decisions
(every model-calling agent's own code, each call 0.05 s) and fixtures/sage_world_run (SAGE's `sage run`
against the model world, with the world's record of each call); see their READMEs."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sage_pipeline.routing import ingest, routing_dataset as rd, task_outcomes as to

FIXTURES = Path(__file__).resolve().parent / "fixtures"
DECISIONS = FIXTURES / "sage_agent_decisions"
WORLD = FIXTURES / "sage_world_run"
WORLD_SESSIONS = [WORLD / "ws-0" / "memory" / "sessions", WORLD / "ws-1" / "memory" / "sessions"]
KEPT = {"TRAJECTORY_STEP", "MODEL_ROUTING_DECISION", "TOKEN_USAGE", "AGENT_INSIGHT_EMITTED"}
STUB_CALL_S = 0.05  # write_agent_decisions.py: each stood-in call waits this long
# SAGE's overhead a call (prompt building after the decision line, the HTTP round trip, parsing the
# answer before the next line), at most, in wall seconds: 10-30 ms a call, ~50 ms the planner's
# (test_world_clock.py); the bound of sage_world/test_task_outcome_calls.py, which says why
OVERHEAD_TOL_S = 0.1


def _ingest(dirs: list[Path], out: Path) -> ingest.IngestResult:
    return ingest.ingest(ingest.IngestConfig(dirs), out, progress=lambda m: None)


def _outcomes(res: ingest.IngestResult, config: to.TaskOutcomeConfig | None = None,
              insights: bool = True) -> to.TaskOutcomes:
    steps = pq.read_table(res.trajectories).to_pandas()
    read = lambda p: pq.read_table(p).to_pandas()  # noqa: E731
    return to.task_outcomes(steps[rd.is_workflow_step(steps)], read(res.routing_decisions), read(res.token_usage),
                            config, agent_insights=read(res.agent_insights) if insights else None)


def _raw(dirs: list[Path]) -> list[tuple[str, int, dict]]:
    """Every JSON line of the journals as (file, line, event)."""
    out = []
    for d in dirs:
        for f in sorted(d.glob("*.log"), key=ingest.journal_order):
            for i, ln in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
                if ln.startswith("{"):
                    out.append((str(f), i, json.loads(ln)))
    return out


def _ts(e: dict) -> datetime:
    return datetime.fromisoformat(e["timestamp"])


def _expected_gaps(dirs: list[Path]) -> dict[str, list[tuple[str, str, float]]]:
    """Per session, straight from the raw lines: each call SAGE's code marks (a decision insight, the
    documentation's routing decision) as (agent, model as SAGE's router or bandit chose it, seconds to
    the next kept line)."""
    by_session: dict[str, list[tuple[datetime, str, int, dict]]] = {}
    for f, i, e in _raw(dirs):
        if e["type"] in KEPT:
            by_session.setdefault(e["session_id"], []).append((_ts(e), f, i, e))
    out: dict[str, list[tuple[str, str, float]]] = {}
    for sid, evs in by_session.items():
        evs.sort(key=lambda x: (x[0], x[1], x[2]))
        calls = out.setdefault(sid, [])
        for (t, _, _, e), nxt in zip(evs, [*evs[1:], None]):
            if e["type"] == "AGENT_INSIGHT_EMITTED" and e["insight_type"] == "decision":
                model = e["content_preview"].split("model=", 1)[1].split(" ")[0].rstrip(",")
                calls.append((e["agent"], model, (nxt[0] - t).total_seconds()))
            elif e["type"] == "MODEL_ROUTING_DECISION" and e["agent_role"] == "documentation":
                calls.append(("documentation", e["selected_model"], (nxt[0] - t).total_seconds()))
    return out


@pytest.fixture(scope="module")
def decisions(tmp_path_factory) -> tuple[ingest.IngestResult, to.TaskOutcomes]:
    res = _ingest([DECISIONS / "memory" / "sessions"], tmp_path_factory.mktemp("dec"))
    return res, _outcomes(res)


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> tuple[ingest.IngestResult, to.TaskOutcomes, dict]:
    res = _ingest(WORLD_SESSIONS, tmp_path_factory.mktemp("world"))
    info = json.loads((WORLD / "world.json").read_text())
    return res, _outcomes(res, to.TaskOutcomeConfig(clock_scale=info["clock_scale"])), info


# ---------------------------------------------------------------------------- the ingest's side table
def test_every_agent_insight_sage_wrote_is_a_row_of_the_side_table(world):
    res, _, _ = world
    raw = [(f, i, e) for f, i, e in _raw(WORLD_SESSIONS) if e["type"] == "AGENT_INSIGHT_EMITTED"]
    table = pq.read_table(res.agent_insights)
    assert table.schema.equals(ingest.AGENT_INSIGHT_SCHEMA)
    assert tuple(table.column_names) == ingest.AGENT_INSIGHT_COLUMNS
    got = table.to_pandas().sort_values(["source_file", "source_line"]).reset_index(drop=True)
    assert res.stats.agent_insights == len(got) == len(raw) == 75 and res.stats.quarantined == 0
    assert res.stats.other_events["AGENT_INSIGHT_EMITTED"] == 75 and not res.stats.unusable_side_events
    keys = ("session_id", "timestamp", "task_id", "agent", "insight_type", "severity", "content_preview")
    want = pd.DataFrame([{"source_file": f, "source_line": i, **{k: e[k] for k in keys}} for f, i, e in raw])
    want = want.sort_values(["source_file", "source_line"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(got[want.columns], want, check_dtype=False)
    assert (got["timestamp_utc"] == pd.to_datetime(got["timestamp"], utc=True)).all()
    assert set(got["insight_type"]) == {"decision", "observation", "risk"}
    assert res.stats.to_dict()["agent_insights"] == 75
    assert res.agent_insights == res.trajectories.parent / ingest.AGENT_INSIGHTS_NAME


def _edit(src: Path, dst: Path, edits: dict[int, str | None]) -> Path:
    """A copy of the journal folder ``src`` with lines replaced (1-based line -> text; None drops it)."""
    shutil.copytree(src, dst)
    (f,) = dst.glob("*.log")
    lines = f.read_text(encoding="utf-8").splitlines()
    out = [edits.get(i, ln) for i, ln in enumerate(lines, 1)]
    f.write_text("".join(x + "\n" for x in out if x is not None), encoding="utf-8")
    return f


def _line(n: int) -> dict:
    """Line ``n`` of the agent-decisions journal, as SAGE wrote it."""
    (f,) = (DECISIONS / "memory" / "sessions").glob("*.log")
    return json.loads(f.read_text(encoding="utf-8").splitlines()[n - 1])


def test_a_damaged_insight_line_is_quarantined_and_an_unusable_one_counted_with_file_line_reason(tmp_path):
    long = {**_line(8), "content_preview": "x" * 600}  # longer than SAGE's own 500: cut, and counted
    f = _edit(DECISIONS / "memory" / "sessions", tmp_path / "s", {
        3: json.dumps(_line(3))[:70],  # cut short: damage
        6: json.dumps({**_line(6), "agent": 7}),  # wrong type
        11: json.dumps({k: v for k, v in _line(11).items() if k != "insight_type"}),  # a required field missing
        14: json.dumps({**_line(14), "timestamp": "yesterday"}),
        17: json.dumps({**_line(17), "agent": ""}),  # a required field empty
        8: json.dumps(long)})
    res = _ingest([tmp_path / "s"], tmp_path / "o")
    s = res.stats
    assert s.lines_read == s.accepted_lines + s.quarantined == 25
    (q,) = [json.loads(x) for x in res.quarantine.read_text().splitlines()]
    assert (q["file"], q["line"]) == (str(f), 3) and q["reason"].startswith("invalid JSON")
    assert s.unusable_side_events == Counter({"AGENT_INSIGHT_EMITTED": 4})
    ex = {e["line"]: e for e in s.unusable_side_examples}
    assert set(ex) == {6, 11, 14, 17} and all(e["file"] == str(f) and e["type"] == "AGENT_INSIGHT_EMITTED"
                                             for e in ex.values())
    assert ex[6]["reason"].startswith("wrong type") and "agent" in ex[6]["reason"]
    assert ex[11]["reason"] == "missing field insight_type"
    assert ex[14]["reason"].startswith("field timestamp = 'yesterday' is not ISO 8601")
    assert ex[17]["reason"] == "empty field agent"
    table = pq.read_table(res.agent_insights).to_pandas()
    raw = [e for _, _, e in _raw([DECISIONS / "memory" / "sessions"]) if e["type"] == "AGENT_INSIGHT_EMITTED"]
    assert len(raw) == 14 and len(table) == 14 - 5 and set(table["source_line"]).isdisjoint({3, 6, 11, 14, 17})
    cut = table.set_index("source_line").loc[8, "content_preview"]
    assert cut == "x" * ingest.CONTENT_PREVIEW_CHARS and s.content_previews_cut == 1


# ---------------------------------------------------------------------------- each agent's decision format
def test_each_agents_decision_names_the_model_its_call_asked_for(decisions):
    res, _ = decisions
    called = json.loads((DECISIONS / "calls.json").read_text())["calls"]
    ins = pq.read_table(res.agent_insights).to_pandas().sort_values("source_line")
    dec = ins[ins["insight_type"] == "decision"]
    got = [(a, to.decision_model(a, c)[0]) for a, c in zip(dec["agent"], dec["content_preview"], strict=True)]
    # every call but the documentation agent's has its decision, in call order
    assert got == [(c["agent"], c["model"]) for c in called if c["agent"] != "documentation"]
    assert {a for a, _ in got} == set(to.DECISION_FORMATS)  # each format met on SAGE's own line
    mrd = pq.read_table(res.routing_decisions).to_pandas()
    assert mrd.loc[mrd["agent_role"] == "documentation", "selected_model"].tolist() == [
        c["model"] for c in called if c["agent"] == "documentation"]


def test_decision_formats_refuse_what_names_no_model():
    assert to.decision_model("coder", "Coder strategy selected: strategy_key=coder:fallback:standard, "
                                      "model=qwen2.5-coder:14b-instruct-q4_K_M, temperature=0.10") == (
        "qwen2.5-coder:14b-instruct-q4_K_M", None)
    assert to.decision_model("planner", "Planner selected model= to generate Task DAG.") == (None, to.NOTE_NO_MODEL)
    assert to.decision_model("reviewer", "Reviewer selected model=m for LLM review") == (None, to.NOTE_NO_MODEL)
    assert to.decision_model("reviewer", None) == (None, to.NOTE_NO_MODEL)
    assert to.decision_model("shell_chat", "Shell selected model=m.") == (
        None, to.NOTE_NO_FORMAT.format(agent="shell_chat"))


# ---------------------------------------------------------------------------- calls and seconds
def test_every_call_is_read_with_its_gap_to_the_next_line(decisions):
    res, out = decisions
    called = json.loads((DECISIONS / "calls.json").read_text())["calls"]
    (t,) = out.frame.itertuples()
    assert (t.task_id, t.verified, t.ended, t.calls_from) == ("task_001", 1.0, "verified", to.DECISION_INSIGHTS)
    # the planner's (task id "planner"), the documentation's (no task id) and task_001's calls: all task_001's
    assert t.calls == len(called) == 8 and out.report["notes"] == {}
    assert json.loads(t.calls_by_model) == dict(Counter(c["model"] for c in called))
    (gaps,) = _expected_gaps([DECISIONS / "memory" / "sessions"]).values()
    assert [(a, m) for a, m, _ in gaps] == [(c["agent"], c["model"]) for c in called]
    assert t.gpu_seconds == pytest.approx(sum(g for _, _, g in gaps), abs=1e-9)
    by_model: Counter = Counter()
    for _, m, g in gaps:
        by_model[m] += g
    assert json.loads(t.gpu_seconds_by_model) == pytest.approx(dict(by_model), abs=1e-6)
    # each gap holds the stood-in call's 0.05 s, and SAGE's own few milliseconds around it
    assert all(STUB_CALL_S <= g < STUB_CALL_S + 0.25 for _, _, g in gaps), gaps
    assert np.isnan(t.prompt_tokens) and np.isnan(t.completion_tokens) and t.usd == 0
    assert out.report["sessions_by_calls_from"] == {to.DECISION_INSIGHTS: 1}


def test_what_cannot_be_read_is_counted_by_reason(tmp_path):
    d = _line(2)
    cases = {  # line edits -> (calls of task_001, notes)
        "no model": ({2: json.dumps({**d, "content_preview": "Planner selected model= to generate Task DAG."})},
                     7, {to.NOTE_NO_MODEL: 1}),
        "unknown agent": ({2: json.dumps({**d, "agent": "shell_chat"})},
                          7, {to.NOTE_NO_FORMAT.format(agent="shell_chat"): 1}),
        # coder.py:401: without the ollama module the coder writes this risk and makes no call
        "no ollama": ({23: json.dumps({**_line(23), "content_preview":
                                       "ollama module not available; cannot generate PatchRequest."})},
                      7, {to.NOTE_NO_OLLAMA: 1}),
        # the journal ends right after the coder's last decision: its call has no later line (0 s), task_001
        # is unfinished and keeps it (its episode is open); the documentation's call, after the last step,
        # has no task
        "cut after the last decision": ({23: None, 24: None, 25: None}, 7,
                                        {to.NOTE_NO_LATER: 1, to.NOTE_AFTER_LAST: 1, to.UNFINISHED: 1}),
    }
    base = _outcomes(_ingest([DECISIONS / "memory" / "sessions"], tmp_path / "base")).frame.iloc[0]
    for name, (edits, calls, notes) in cases.items():
        _edit(DECISIONS / "memory" / "sessions", tmp_path / name / "s", edits)
        out = _outcomes(_ingest([tmp_path / name / "s"], tmp_path / name / "o"))
        (t,) = out.frame.itertuples()
        assert (t.calls, out.report["notes"]) == (calls, notes), name
        assert t.gpu_seconds < base["gpu_seconds"], name  # the call not read costs no seconds
    # a call naming a task whose episode has ended, with no step of it after: no task (and no later line)
    late = {**_line(22), "timestamp": "2026-11-28T13:44:29+00:00"}
    _edit(DECISIONS / "memory" / "sessions", tmp_path / "late" / "s",
          {25: json.dumps(_line(25)) + "\n" + json.dumps(late)})
    out = _outcomes(_ingest([tmp_path / "late" / "s"], tmp_path / "late" / "o"))
    assert out.frame.iloc[0]["calls"] == 8 and out.report["notes"] == {to.NOTE_NAMED_NO_TASK: 1, to.NOTE_NO_LATER: 1}


def test_a_session_with_token_usage_keeps_reading_its_token_usage_lines(tmp_path):
    """A SAGE whose ollama client reports usage writes TOKEN_USAGE after each call (ollama_safe.py):
    then those lines are the calls, as before; the decision insight before one is its previous line."""
    coder = _line(7)
    usage = {"type": "TOKEN_USAGE", "timestamp": "2026-11-28T13:44:18.611275+00:00", "operation": "chat",
             "model": "qwen2.5-coder:1.5b", "prompt_tokens": 2100, "completion_tokens": 90, "total_tokens": 2190,
             "session_id": coder["session_id"]}  # ollama_safe.py's payload, through log_event
    _edit(DECISIONS / "memory" / "sessions", tmp_path / "s", {7: json.dumps(coder) + "\n" + json.dumps(usage)})
    out = _outcomes(_ingest([tmp_path / "s"], tmp_path / "o"))
    (t,) = out.frame.itertuples()
    assert (t.calls_from, t.calls, t.prompt_tokens, t.completion_tokens) == (to.TOKEN_USAGE_READING, 1, 2100, 90)
    assert t.gpu_seconds == pytest.approx(0.05, abs=1e-9)  # from the coder's decision line to the TOKEN_USAGE
    assert out.report["sessions_by_calls_from"] == {to.TOKEN_USAGE_READING: 1}


def test_the_journals_calls_are_the_worlds_calls_and_their_gpu_seconds(world):
    """SAGE's real `sage run` against the model world: per task, the calls read from the journal are the
    calls the world answered (by model), and their GPU-seconds (journal gap / clock_scale) are the world's
    recorded gpu_s for the 14B-and-up models within SAGE's overhead (OVERHEAD_TOL_S wall seconds a call).
    The 1.5B's calls (0.13-0.33 GPU-s) are of the order of that overhead at clock_scale 0.1: reported."""
    res, out, info = world
    truth = [json.loads(x) for x in (WORLD / "truth.jsonl").read_text().splitlines()]
    runs = {s: json.loads(x)["run"] for x in (WORLD / "runs.jsonl").read_text().splitlines()
            for s in json.loads(x)["sessions"]}
    scale, big = info["clock_scale"], {m for m, p in info["params_b"].items() if p is not None and p >= 14}
    f = out.frame
    assert len(f) == len(runs) == 6 and set(f["session_id"]) == set(runs) and (f["task_id"] == "task_001").all()
    assert (f["calls_from"] == to.DECISION_INSIGHTS).all() and out.report["notes"] == {}
    assert int(f["calls"].sum()) == len(truth)
    lines = []
    for t in f.itertuples():
        calls = [c for c in truth if c["run"] == runs[t.session_id]]
        assert t.calls == len(calls) and json.loads(t.calls_by_model) == dict(Counter(c["model"] for c in calls))
        s_by_model = json.loads(t.gpu_seconds_by_model)
        for size, models in (("14B+", big), ("1.5B", set(info["params_b"]) - big)):
            n = sum(c["model"] in models for c in calls)
            world_s = sum(c["gpu_s"] for c in calls if c["model"] in models)
            journal_s = sum(v for m, v in s_by_model.items() if m in models)
            bias = journal_s - world_s
            assert -1e-3 * n <= bias, (t.session_id, size)  # the world's pause is inside every gap
            if size == "14B+":
                assert n and bias <= n * OVERHEAD_TOL_S / scale, (t.session_id, journal_s, world_s)
            lines.append(f"{runs[t.session_id]} {size:5s} calls={n} world={world_s:7.3f} journal={journal_s:7.3f} "
                         f"bias={bias:+.3f} GPU-s ({100 * bias / world_s if world_s else 0:+.1f}%)")
    print("\n" + "\n".join(lines))


def test_files_in_and_out_with_and_without_the_insight_table(world, tmp_path):
    res, out, info = world
    cfg = to.TaskOutcomeConfig(clock_scale=info["clock_scale"])
    got = to.task_outcome_files(res.trajectories, res.routing_decisions, res.token_usage, tmp_path / "t.parquet", cfg,
                                agent_insights=res.agent_insights)
    back = pq.read_table(tmp_path / "t.parquet").to_pandas()
    assert list(back.columns) == list(to.COLUMNS)
    pd.testing.assert_frame_equal(back, out.frame.reset_index(drop=True), check_like=False)
    assert "decision_insights: 6 sessions" in to.summary_markdown(got)
    # without the insight table a session with no TOKEN_USAGE shows no calls: said, never silent
    blind = to.task_outcome_files(res.trajectories, res.routing_decisions, res.token_usage, tmp_path / "b.parquet",
                                  cfg)
    assert (blind.frame["calls"] == 0).all() and blind.report["notes"] == {to.NOTE_NO_INSIGHTS: 6}
    # the TOKEN_USAGE fixture reads as before, its sessions said to be read from TOKEN_USAGE
    tu = _ingest([FIXTURES / "sage_run_lines" / "memory" / "sessions"], tmp_path / "tu")
    old = to.task_outcome_files(tu.trajectories, tu.routing_decisions, tu.token_usage, tmp_path / "o.parquet",
                                agent_insights=tu.agent_insights)
    assert (old.frame["calls_from"] == to.TOKEN_USAGE_READING).all() and old.frame["prompt_tokens"].notna().all()
    assert pq.read_table(tu.agent_insights).num_rows == 0


def test_the_trajectories_asset_publishes_the_insight_table_and_routing_dataset_reads_it(world, tmp_path):
    """The ingest's side table is a member of the trajectories asset's set (listed in its metadata), and
    routing_dataset hands it to the task outcomes: the same calls as read here."""
    import dagster as dg

    from sage_pipeline.defs import routing_assets
    from sage_pipeline.defs.resources import SageResource

    _, out, info = world
    root = tmp_path / "data"
    sage = SageResource(data_dir=str(root), routing_table=str(WORLD / "models.yaml"))
    defs = dg.Definitions(assets=[routing_assets.trajectories, routing_assets.routing_dataset],
                          resources={"sage": sage})
    run = {"ops": {"trajectories": {"config": {"log_dirs": [str(p) for p in WORLD_SESSIONS]}},
                   "routing_dataset": {"config": {"task_outcomes": {"clock_scale": info["clock_scale"]}}}}}
    result = defs.resolve_implicit_global_asset_job_def().execute_in_process(
        run_config=run, instance=dg.DagsterInstance.ephemeral(),
        asset_selection=[dg.AssetKey("trajectories"), dg.AssetKey("routing_dataset")])
    assert result.success
    meta = {k: v.value for k, v in result.asset_materializations_for_node("trajectories")[-1].metadata.items()}
    published = root / "routing" / ingest.AGENT_INSIGHTS_NAME
    assert meta["side_tables"][ingest.AGENT_INSIGHTS_NAME] == pq.read_table(published).num_rows == 75
    assert meta["agent_insights"] == str(published) and meta["ingest"]["agent_insights"] == 75
    tasks = pq.read_table(root / "routing" / to.TASK_OUTCOMES_NAME).to_pandas()
    key = ["session_id", "task_id"]
    pd.testing.assert_frame_equal(tasks.sort_values(key).reset_index(drop=True),
                                  out.frame.sort_values(key).reset_index(drop=True))
    ds = {k: v.value for k, v in result.asset_materializations_for_node("routing_dataset")[-1].metadata.items()}
    assert "decision_insights: 6 sessions" in ds["task_outcomes"]
