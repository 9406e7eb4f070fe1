"""SAGE's `sage run` journals read by SAGE's code, without SAGE installed.

The lines are SAGE's own (``fixtures/sage_run_lines``: one session written by SAGE's functions in
the order ``orchestrator/workflow.py`` calls them, copied verbatim; see its README), or single
lines copied from them. ``test_sage_generated_journals.py`` runs the same checks on journals SAGE
writes during the test, where a SAGE virtualenv is available (``SAGE_PYTHON``).
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from sage_pipeline.routing import expectations, ingest, routing_dataset as rd
from sage_pipeline.routing.reward import (
    LocalCostRewardSpec,
    RewardSpec,
    apply_version,
    dataset_reward_spec,
    sage_composite_reward,
)
from sage_pipeline.sage.table import RoutingTable

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "sage_run_lines"
SESSIONS = FIXTURE / "memory" / "sessions"
SID = "e3e70682c2094cac629f6fbed82c07cd"

# verbatim SAGE lines (workflow.py save_memory; circuit_breaker; verification_gate)
CHECKPOINT = "[2026-11-01T08:04:31.232870+00:00] CHECKPOINT completed=4 pending=2"
TOKEN_SUMMARY = "[TOKEN_SUMMARY] total_tokens=36082 prompt=25295 completion=10787 calls=24"
ORCH_NO_MODEL = (
    '{"type": "TRAJECTORY_STEP", "timestamp": "2026-11-01T08:01:47.153709+00:00", "task_id": "task_003", '
    '"agent": "orchestrator", "action": {"model_chosen": "", "prompt_strategy_key": ""}, "reward": 0.0, '
    '"terminal": true, "state": {"failed_reason": "timeout"}, "error": "ollama.chat timeout after 30s", '
    f'"session_id": "{SID}"}}')
REVIEWER_PASS = (
    '{"type": "TRAJECTORY_STEP", "timestamp": "2026-11-01T08:00:31.078810+00:00", "task_id": "task_001", '
    '"agent": "reviewer", "action": {"model_chosen": "qwen2.5-coder:1.5b", "prompt_strategy_key": '
    '"coder:primary:conservative"}, "reward": 0.969, "terminal": true, "state": {"verification_passed": true, '
    '"task_complexity_score": 0.918, "primary_failure_count": 0}, "verdict": "PASS", '
    f'"session_id": "{SID}"}}')


@pytest.fixture(scope="module")
def sage_table() -> RoutingTable:
    return RoutingTable.load(FIXTURE / "models.yaml")


def _ingest(folder: Path, out: Path) -> ingest.IngestResult:
    return ingest.ingest(ingest.IngestConfig([folder]), out, progress=lambda m: None)


def _build(res: ingest.IngestResult, table: RoutingTable, config: rd.DatasetConfig = rd.DatasetConfig()):
    read = lambda p: pq.read_table(p).to_pandas()  # noqa: E731
    return rd.build_routing_dataset(read(res.trajectories), table, None, config, read(res.routing_decisions),
                                    read(res.token_usage))


def _write(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    out = tmp_path_factory.mktemp("sage_run")
    res = _ingest(SESSIONS, out / "routing")
    return res


# ------------------------------------------------------------------ ingest
def test_every_line_sage_wrote_is_read_and_none_quarantined(session):
    s = session.stats
    assert s.lines_read == 75 and s.quarantined == 0 and s.accepted_lines == s.lines_read
    assert dict(s.text_lines) == {"text_checkpoint": 1, "text_token_summary": 1}
    assert dict(s.steps_without_model) == {"orchestrator": 1}  # task_003's timeout: model_chosen ""
    assert s.steps_accepted == 18  # 10 reviewer, 6 debugger, 2 orchestrator
    assert session.quarantine.read_bytes() == b""
    assert dict(s.quarantine_reasons) == {}


def test_sage_text_lines_are_counted_not_quarantined(tmp_path):
    path = _write(tmp_path / "logs" / "2026-11-01.log", [REVIEWER_PASS, CHECKPOINT, TOKEN_SUMMARY, ORCH_NO_MODEL])
    r = _ingest(tmp_path / "logs", tmp_path / "out")
    assert r.stats.quarantined == 0 and r.stats.lines_read == 4 and r.stats.accepted_lines == 4
    assert dict(r.stats.text_lines) == {"text_checkpoint": 1, "text_token_summary": 1}
    rows = pq.read_table(r.trajectories).to_pandas()
    assert rows["role"].tolist() == ["reviewer", "orchestrator"]
    assert rows["verdict"].tolist()[0] == "PASS" and pd.isna(rows["model"].iloc[1])
    assert rows["failed_reason"].tolist()[1] == "timeout" and path.name in rows["source_file"].iloc[0]


@pytest.mark.parametrize("damaged", [
    REVIEWER_PASS[:120],  # a JSON object cut short (a crash mid-write)
    CHECKPOINT[:40],  # a text line cut short: not one of SAGE's two formats
    "[2026-11-01T08:04:31] CHECKPOINT completed=4",  # SAGE's text, but not whole
    "CHECKPOINT completed=4 pending=2",
    "[TOKEN_SUMMARY] total_tokens=1 prompt=1 completion=0",
    '[{"type": "TRAJECTORY_STEP"}]',  # JSON, but not an object
    "[not SAGE] anything",
])
def test_damage_is_still_quarantined_with_file_line_and_reason(tmp_path, damaged):
    path = _write(tmp_path / "logs" / "2026-11-01.log", [REVIEWER_PASS, damaged, CHECKPOINT])
    r = _ingest(tmp_path / "logs", tmp_path / "out")
    assert r.stats.quarantined == 1 and r.stats.lines_read == 3
    q = [json.loads(x) for x in r.quarantine.read_text().splitlines()]
    assert [(x["file"], x["line"]) for x in q] == [(str(path), 2)]
    assert q[0]["reason"] and q[0]["raw_head"] == damaged[:240]


def test_truncated_json_is_quarantined_as_invalid_json(tmp_path):
    path = _write(tmp_path / "logs" / "2026-11-01.log", [ORCH_NO_MODEL, REVIEWER_PASS[:-30]])
    r = _ingest(tmp_path / "logs", tmp_path / "out")
    q = [json.loads(x) for x in r.quarantine.read_text().splitlines()]
    assert [(x["file"], x["line"]) for x in q] == [(str(path), 2)]
    assert q[0]["reason"].startswith("invalid JSON (truncated or malformed)")
    assert dict(r.stats.quarantine_reasons) == {"invalid_json": 1}


def test_a_missing_model_is_still_damage(tmp_path):
    line = json.loads(REVIEWER_PASS)
    del line["action"]["model_chosen"]
    _write(tmp_path / "logs" / "2026-11-01.log", [json.dumps(line)])
    r = _ingest(tmp_path / "logs", tmp_path / "out")
    q = [json.loads(x) for x in r.quarantine.read_text().splitlines()]
    assert [x["reason"] for x in q] == ["missing field action.model_chosen"]


def test_rotated_parts_are_one_day_in_writing_order(tmp_path):
    logs = tmp_path / "logs"
    for name in ("2026-11-01.log", "2026-11-01.10.log", "2026-11-01.2.log", "2026-11-01.1.log", "2026-11-02.log"):
        _write(logs / name, [CHECKPOINT])
    files, _ = ingest.discover_logs(ingest.IngestConfig([logs]))
    assert [f.name for f in files] == ["2026-11-01.1.log", "2026-11-01.2.log", "2026-11-01.10.log",
                                       "2026-11-01.log", "2026-11-02.log"]
    assert {ingest.file_stem(f) for f in files} == {"2026-11-01", "2026-11-02"}
    assert ingest.file_stem("x/2026-11-01.3.log.gz") == "2026-11-01"
    assert ingest.file_stem("x/session.jsonl") == "session"  # other names: the stem, as SAGE's exporter


# ------------------------------------------------------------------ the routing dataset
@pytest.fixture(scope="module")
def built(session, sage_table):
    return _build(session, sage_table)


def _episode(df: pd.DataFrame, task: str) -> pd.DataFrame:
    return df[df["episode_id"] == f"{SID}/{task}"].sort_values("step")


def test_the_coder_is_read_from_the_reviewer_step(built):
    df = built.frame
    t1 = _episode(df, "task_001")
    assert t1[["role", "model", "decision_source", "policy_source"]].values.tolist() == [
        ["coder", "qwen2.5-coder:1.5b", "reviewer_step", "ucb_bandit"]]
    row = t1.iloc[0]
    assert row["verification_passed"] and row["terminal"] and row["logged_reward"] == pytest.approx(0.969)
    assert row["reward"] == pytest.approx(0.969 + 0.25)  # SAGE's composite_reward: verified
    prov = json.loads(row["provenance"])
    assert prov == {"decision": "2026-11-01.1.log:7", "decision_source": "reviewer_step",
                    "outcome": ["2026-11-01.1.log:7"], "token_usage": ["2026-11-01.1.log:3"]}
    # the coder's call is line 3 (no MODEL_ROUTING_DECISION before it); line 2 is the planner's call
    assert row["prompt_tokens"] == 933 and row["completion_tokens"] == 647
    assert row["latency_s"] == pytest.approx(27.862973 - 9.975590)
    assert row["cost_usd"] is None or np.isnan(row["cost_usd"])
    assert row["cost_source"] == "unknown"


def test_debugger_decisions_are_their_routing_decisions_and_the_next_verdict(built):
    t2 = _episode(built.frame, "task_002")
    assert t2["role"].tolist() == ["coder", "debugger", "debugger"]
    dbg = t2[t2["role"] == "debugger"]
    # the debugger's model is its MODEL_ROUTING_DECISION's, not the step's (the task's model)
    assert set(dbg["model"]) == {"qwen2.5-coder:14b-instruct-q4_K_M"}
    assert dbg["failure_count"].tolist() == [1, 2] and dbg["primary_failure_count"].tolist() == [1, 2]
    assert dbg["verification_passed"].tolist() == [False, True] and dbg["terminal"].tolist() == [False, True]
    assert json.loads(dbg.iloc[0]["provenance"])["outcome"] == ["2026-11-01.1.log:15", "2026-11-01.1.log:19"]
    assert dbg["policy_source"].tolist() == ["yaml", "yaml"]
    assert dbg["action_kind"].tolist() == ["fallback", "fallback"]  # primary_failure_count >= 1
    assert t2["episode_complete"].all()


def test_a_debugger_without_a_patch_sends_the_task_back_to_its_agent(built):
    t4 = _episode(built.frame, "task_004")
    assert t4["role"].tolist() == ["coder", "debugger", "coder"]
    assert t4["failure_count"].tolist() == [0, 1, 1]  # the coder runs again with failure_count = retry
    nopatch = t4.iloc[1]
    assert nopatch["failed_reason"] == "debugger_error" and pd.isna(nopatch["verification_passed"])
    assert nopatch["reward"] == 0.0 and not nopatch["terminal"]
    assert t4["terminal"].tolist() == [False, False, True] and t4["episode_complete"].all()


def test_documentation_decisions_and_the_circuit_breaker(built):
    t6 = _episode(built.frame, "task_006")
    assert t6["role"].tolist() == ["documentation", "debugger", "documentation", "debugger", "debugger"]
    assert t6["decision_source"].tolist()[0] == "routing_decision"
    last = t6.iloc[-1]
    assert last["terminal"] and last["failed_reason"] == "retry_limit"
    assert last["reward"] == pytest.approx(-0.1)  # composite_reward: retry_limit, not verified
    assert json.loads(last["provenance"])["outcome"][-1] == "2026-11-01.2.log:13"  # across the rotation
    assert t6["episode_complete"].all()


def test_what_cannot_be_joined_is_counted_with_its_reason(built):
    rep = built.report
    assert sum(rep.not_joined.values()) == 1  # task_003: the call timed out before SAGE recorded a model
    (reason,) = rep.not_joined
    assert "timeout" in reason and "no observed decision" in reason
    unused = rep.routing_decisions_unused
    assert sum(v for k, v in unused.items() if k.startswith("planner")) == 1
    assert sum(v for k, v in unused.items() if k.startswith("reviewer")) == 10
    assert not any(k.startswith("debugger") for k in unused)
    assert rep.decisions_by_source == {"reviewer_step": 5, "routing_decision": 8}
    assert rep.token_usage_unattributed == 0
    assert rep.roles_logged == ["debugger", "documentation", "planner", "reviewer"]


def test_every_debugger_decision_sage_logged_is_a_row_or_counted(built):
    raw = [json.loads(x) for f in sorted(SESSIONS.glob("*.log")) for x in f.read_text().splitlines()
           if x.startswith("{")]
    n_mrd = Counter(e["agent_role"] for e in raw if e["type"] == "MODEL_ROUTING_DECISION")
    rows = built.frame["role"].value_counts().to_dict()
    assert rows["debugger"] == n_mrd["debugger"] == 6
    assert rows["documentation"] == n_mrd["documentation"] == 2


def test_the_dataset_satisfies_its_contract(built):
    res = expectations.validate_contract(built.frame, built.space)
    assert res.success, res.to_markdown(failures_only=True)
    assert built.frame["decision_id"].is_unique


def _without_session_id(hours: int = 0) -> dict[str, list[str]]:
    """The fixture's parts as SAGE writes them without SAGE_SESSION_ID, the clock moved by ``hours``."""
    out = {}
    for f in sorted(SESSIONS.glob("*.log")):
        lines = []
        for x in f.read_text().splitlines():
            if x.startswith("{"):
                e = json.loads(x)
                e.pop("session_id")
                e["timestamp"] = (pd.Timestamp(e["timestamp"]) + pd.Timedelta(hours=hours)).isoformat()
                x = json.dumps(e)
            lines.append(x)
        out[f.name] = lines
    return out


def test_without_session_ids_a_day_is_one_session_and_repeated_task_ids_are_new_episodes(tmp_path, sage_table):
    one = tmp_path / "one"
    for name, lines in _without_session_id().items():
        _write(one / name, lines)
    r = _ingest(one, tmp_path / "out")
    assert r.stats.quarantined == 0 and r.stats.sessions_from_file_stem == 1
    once = _build(r, sage_table).frame
    assert set(once["session_id"]) == {"2026-11-01"} and len(once) == 13
    # a second `sage run` the same day, two hours later: its lines go on in 2026-11-01.log
    two = tmp_path / "two"
    for name, lines in _without_session_id().items():
        _write(two / name, lines)
    later = _without_session_id(hours=2)
    _write(two / "2026-11-01.log", later["2026-11-01.1.log"] + later["2026-11-01.2.log"])
    twice = _build(_ingest(two, tmp_path / "out2"), sage_table).frame
    assert len(twice) == 2 * len(once) and twice["decision_id"].is_unique
    assert set(twice["episode_id"]) == set(once["episode_id"]) | {e + "#1" for e in once["episode_id"]}
    assert twice["episode_complete"].all()


def test_a_debugger_decision_with_no_later_verdict_is_counted(tmp_path, sage_table):
    lines = (SESSIONS / "2026-11-01.1.log").read_text().splitlines()[:15]  # ends after task_002's first patch
    _write(tmp_path / "logs" / "2026-11-01.log", lines)
    b = _build(_ingest(tmp_path / "logs", tmp_path / "out"), sage_table)
    assert b.report.not_joined == {rd._DANGLING: 1}
    t2 = b.frame[b.frame["task_id"] == "task_002"]
    assert t2["role"].tolist() == ["coder"] and not t2["episode_complete"].any()


def test_steps_of_their_own_agent_are_read_as_before(tmp_path, sage_table):
    """SAGE's collect_synth (rl/collect_synth.py) writes a step per decision of its own agent, no verdict."""
    step = {"type": "TRAJECTORY_STEP", "timestamp": "2026-11-01T08:00:00+00:00", "task_id": "synth_coder_000001",
            "agent": "coder", "action": {"model_chosen": "qwen2.5-coder:1.5b", "prompt_strategy_key": ""},
            "reward": 0.5, "terminal": True, "state": {"task_complexity_score": 0.4, "primary_failure_count": 0,
                                                       "verification_passed": True}, "extra": {"synthetic": True}}
    _write(tmp_path / "logs" / "2026-11-01.log", [json.dumps(step)])
    b = _build(_ingest(tmp_path / "logs", tmp_path / "out"), sage_table)
    assert b.frame[["role", "decision_source", "reward"]].values.tolist() == [["coder", "trajectory_step", 0.5]]


# ------------------------------------------------------------------ cost and reward
def test_sage_composite_reward_is_sages():
    """rl/reward.py composite_reward with its defaults, value by value."""
    r = sage_composite_reward(np.array([0.9, 0.3, 0.0, 0.0, 0.5]), np.array([1.0, 0.0, np.nan, np.nan, np.nan]),
                              np.array([True, False, True, True, True]),
                              np.array([None, None, "timeout", "retry_limit", "verification_failed"], dtype=object))
    assert r.tolist() == pytest.approx([1.15, 0.15, -1.0, -0.1, 0.3])


def test_reward_versions_for_models_without_prices(session, sage_table):
    v1 = _build(session, sage_table).frame
    with pytest.raises(ValueError, match="reward_v2 subtracts each call's cost.*no price"):
        _build(session, sage_table, rd.DatasetConfig(reward=RewardSpec(version="reward_v2")))
    spec = LocalCostRewardSpec(version="reward_v3_tokens_seconds", tokens_weight=0.1, seconds_weight=0.01)
    v3 = _build(session, sage_table, rd.DatasetConfig(reward=spec)).frame
    assert set(v3["reward_version"]) == {"reward_v3_tokens_seconds"}
    tokens = v1["prompt_tokens"].astype(float) + v1["completion_tokens"].astype(float)
    expect = np.clip(v1["reward"] - 0.1 * tokens / 1000 - 0.01 * v1["latency_s"], -2, 2)
    assert v3["reward"].to_numpy() == pytest.approx(expect.to_numpy())
    assert (v3["reward"] < v1["reward"]).all()
    # the spec of the other versions serialises as it did before reward_v3 existed
    assert "tokens_weight" not in RewardSpec().model_dump()
    assert dataset_reward_spec(spec.model_dump()) == spec and "tokens_weight" not in LocalCostRewardSpec().model_dump()
    with pytest.raises(ValueError, match="needs each decision's tokens and seconds"):
        apply_version(np.zeros(1), np.zeros(1), spec)


# ------------------------------------------------------------------ the volume warning
def test_volume_judges_only_roles_with_rows_and_says_why_the_others_have_none(built, sage_table):
    judged, without = expectations.roles_to_judge(built.frame, tuple(sage_table.roles),
                                                  built.report.to_dict())
    assert judged == ("coder", "debugger", "documentation")
    assert without["shell_router"] == without["shell_chat"] == "not in the logs"
    assert without["planner"].startswith("logged, but no decision") and without["reviewer"].startswith("logged")
    res = expectations.validate_volume(built.frame, judged, 2)
    assert res.success and set(res.counts) == set(judged)


def test_fixture_is_where_the_readme_says(tmp_path):
    assert (FIXTURE / "README.md").is_file() and (FIXTURE / "SAGE_LICENSE").is_file()
    shutil.copytree(SESSIONS, tmp_path / "copy")
    assert sorted(p.name for p in (tmp_path / "copy").iterdir()) == ["2026-11-01.1.log", "2026-11-01.2.log"]
