"""Journals SAGE's own functions write (sage_contract/write_sage_journals.py, run with SAGE_PYTHON),
in the shapes `sage run` produces, through the ingest and the routing dataset: nothing SAGE wrote is
quarantined, and every coder and debugger decision is a row with its outcome or counted with a
reason. Skipped, saying why, where no SAGE virtualenv is named (test_sage_run_journals.py checks
the same rules on SAGE lines copied into the repository)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from sage_pipeline.routing import expectations, ingest, routing_dataset as rd
from sage_pipeline.sage.table import RoutingTable
from sage_pipeline_tests.sage_contract.sage_journals import expected_decisions, require_sage, write_journals

SHAPES = {
    "sessions_a_day_rotated": ["--days", "3", "--sessions-per-day", "2", "--tasks", "6", "--rotate-mb", "0.02"],
    "no_session_id_rotated": ["--days", "3", "--sessions-per-day", "2", "--tasks", "6", "--rotate-mb", "0.02",
                              "--no-session-id", "--seed", "1"],
    "many_runs_a_day_no_session_id": ["--days", "2", "--sessions-per-day", "5", "--tasks", "8", "--rotate-mb",
                                      "0.05", "--no-session-id", "--timeout-rate", "0.15", "--seed", "2"],
    "timeouts_and_documentation": ["--days", "2", "--sessions-per-day", "3", "--tasks", "10", "--timeout-rate",
                                   "0.2", "--documentation-share", "0.4", "--seed", "3", "--trace-id", "t-1"],
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shape(request, tmp_path_factory):
    _, models = require_sage()
    root = tmp_path_factory.mktemp(request.param)
    summary = write_journals(root / "ws", *SHAPES[request.param])
    sessions = root / "ws" / "memory" / "sessions"
    res = ingest.ingest(ingest.IngestConfig([sessions]), root / "routing", progress=lambda m: None)
    read = lambda p: pq.read_table(p).to_pandas()  # noqa: E731
    built = rd.build_routing_dataset(read(res.trajectories), RoutingTable.load(models), None, rd.DatasetConfig(),
                                     read(res.routing_decisions), read(res.token_usage))
    return request.param, summary, sessions, res, built


def test_nothing_sage_wrote_is_quarantined(shape):
    name, summary, _, res, _ = shape
    s = res.stats
    assert s.quarantined == 0 and s.accepted_lines == s.lines_read == sum(summary["lines"].values())
    assert s.text_lines["text_checkpoint"] == summary["lines"]["text:CHECKPOINT"] == summary["sessions"]
    assert s.text_lines["text_token_summary"] == summary["lines"]["text:TOKEN_SUMMARY"]
    assert s.steps_accepted == summary["lines"]["TRAJECTORY_STEP"]
    if "rotated" in name:
        assert any(f.count(".") == 2 for f in summary["files"])  # <date>.N.log parts exist
    if "no_session_id" in name:
        assert s.sessions_from_file_stem == len({f.split(".")[0] for f in summary["files"]})


def test_every_coder_and_debugger_decision_is_a_row_or_counted(shape):
    _, summary, sessions, _, built = shape
    want = expected_decisions(sessions)
    rows = built.frame["role"].value_counts().to_dict()
    assert rows.get("coder", 0) == want["coder"] > 0
    assert rows.get("documentation", 0) == want["documentation"]
    assert rows.get("debugger", 0) == want["debugger"]  # every debugger MODEL_ROUTING_DECISION
    timeouts = sum(v for k, v in built.report.not_joined.items() if "timed out" in k or "(timeout)" in k)
    assert timeouts == want["timeouts"] == summary["timeouts"]
    assert sum(built.report.not_joined.values()) == want["timeouts"]  # nothing else is left out
    assert built.report.token_usage_unattributed == 0  # every model call is a decision's


def test_every_row_has_its_outcome_and_provenance(shape):
    _, _, _, _, built = shape
    df = built.frame
    has_outcome = df["verification_passed"].notna() | df["failed_reason"].notna()
    assert has_outcome.all()
    assert df["episode_complete"].all() and df["decision_id"].is_unique
    for p in df["provenance"]:
        prov = json.loads(p)
        assert prov["decision"] and prov["outcome"]
    assert (df["prompt_tokens"].notna() & df["latency_s"].notna()).all()  # every decision's call is joined
    assert set(df.loc[df["role"] == "coder", "policy_source"]) == {"ucb_bandit"}
    assert expectations.validate_contract(df, built.space).success


def test_the_volume_warning_judges_only_roles_sage_run_logs(shape):
    _, _, _, _, built = shape
    judged, without = expectations.roles_to_judge(built.frame, built.space.roles, built.report.to_dict())
    assert "shell_router" not in judged and "shell_chat" not in judged
    assert without["shell_router"] == "not in the logs"
    assert {"coder", "debugger"} <= set(judged)
