"""Contract: every SAGE agent that calls a model marks the call the way task_outcomes reads it, run
afresh with SAGE's own code (write_agent_decisions.py in SAGE's virtualenv; skipped or failed by the
rule in sage_contract/sage_journals.py), and fixtures/sage_agent_decisions is what SAGE writes."""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sage_pipeline.routing import ingest, routing_dataset as rd, task_outcomes as to

HERE = Path(__file__).resolve().parent
WRITER = HERE / "write_agent_decisions.py"
FIXTURE = HERE / "fixtures" / "sage_agent_decisions" / "memory" / "sessions"
CALL_S = 0.05


@pytest.fixture(scope="module")
def fresh(sage_python, tmp_path_factory) -> tuple[Path, dict]:
    ws = tmp_path_factory.mktemp("agent_decisions")
    out = subprocess.run([sage_python, str(WRITER), "--workspace", str(ws), "--call-s", str(CALL_S)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return ws / "memory" / "sessions", json.loads(out.stdout.strip().splitlines()[-1])


def _shape(sessions: Path) -> list[tuple]:
    """The journal's lines without their times and ids: what SAGE's code decides, not the clock."""
    (f,) = sessions.glob("*.log")
    keys = ("type", "task_id", "agent", "agent_role", "insight_type", "severity", "content_preview", "selected_model",
            "primary_model", "fallback_model", "terminal", "verdict")
    return [tuple(json.loads(ln).get(k) for k in keys) for ln in f.read_text(encoding="utf-8").splitlines()]


def test_each_agents_decision_names_the_model_sage_called_and_each_call_is_read(fresh, tmp_path):
    sessions, printed = fresh
    called = printed["calls"]
    assert [c["agent"] for c in called] == ["planner", "architect", "coder", "reviewer", "test_engineer", "debugger",
                                            "documentation", "coder"]
    res = ingest.ingest(ingest.IngestConfig([sessions]), tmp_path, progress=lambda m: None)
    assert res.stats.quarantined == 0 and not res.stats.unusable_side_events
    ins = pq.read_table(res.agent_insights).to_pandas().sort_values("source_line")
    dec = ins[ins["insight_type"] == "decision"]
    assert [(a, to.decision_model(a, c)[0]) for a, c in zip(dec["agent"], dec["content_preview"], strict=True)] == [
        (c["agent"], c["model"]) for c in called if c["agent"] != "documentation"]
    steps = pq.read_table(res.trajectories).to_pandas()
    read = lambda p: pq.read_table(p).to_pandas()  # noqa: E731
    out = to.task_outcomes(steps[rd.is_workflow_step(steps)], read(res.routing_decisions), read(res.token_usage),
                           agent_insights=read(res.agent_insights))
    (t,) = out.frame.itertuples()
    assert (t.session_id, t.task_id, t.verified, t.calls) == (printed["session_id"], "task_001", 1.0, 8)
    assert json.loads(t.calls_by_model) == dict(Counter(c["model"] for c in called))
    assert out.report["notes"] == {} and 8 * CALL_S <= t.gpu_seconds < 8 * (CALL_S + 0.25)


def test_the_fixture_is_what_sage_writes(fresh):
    """fixtures/sage_agent_decisions holds the same lines as a fresh run, but for times and ids."""
    sessions, _ = fresh
    assert _shape(sessions) == _shape(FIXTURE)
