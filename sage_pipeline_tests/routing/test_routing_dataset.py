"""The routing dataset: one row per decision, versioned rewards, a stable split by session."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from sage_pipeline.routing import ingest
from sage_pipeline.routing.catalogue import ASSUMED_PROMPT_TOKENS
from sage_pipeline.routing.collector import CollectorConfig, collect
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.routing.routing_dataset import (
    JSONL_NAME,
    PARQUET_NAME,
    DatasetConfig,
    build_routing_dataset,
    read_routing_dataset,
    session_split,
    write_routing_dataset,
)
from sage_pipeline.routing.routing_simulator import RoutingSimulator
from sage_pipeline.routing.schema import DATASET_COLUMNS, ROLE_INDEX, SCHEMA_VERSION


@pytest.fixture(scope="module")
def collected(catalogue, table, tmp_path_factory):
    root = tmp_path_factory.mktemp("ds")
    sim = RoutingSimulator(catalogue, table)
    res = collect(
        sim,
        root / "logs",
        CollectorConfig(episodes=600, seed=8, sessions_per_day=40),
        progress=lambda m: None,
    )
    ing = ingest.ingest(
        ingest.IngestConfig((root / "logs",)), root / "routing", progress=lambda m: None
    )
    assert ing.stats.quarantined == 0
    return res, pq.read_table(ing.trajectories).to_pandas()


@pytest.fixture(scope="module")
def trajectories(collected) -> pd.DataFrame:
    return collected[1]


@pytest.fixture(scope="module")
def ds(trajectories, catalogue, table) -> pd.DataFrame:
    return build_routing_dataset(trajectories, table, catalogue).frame


def test_one_row_per_decision(ds, collected, trajectories):
    res, _ = collected
    assert len(ds) == res.decisions == len(trajectories)
    assert ds["decision_id"].is_unique
    assert (ds["decision_id"] == ds["session_id"] + "/" + ds["task_id"] + "/" + ds["step"].astype(str)).all()
    assert (ds["episode_id"] == ds["session_id"] + "/" + ds["task_id"]).all()
    assert ds["episode_id"].nunique() == 600
    assert set(ds.columns) == set(DATASET_COLUMNS)
    # sorted by session, task, step
    keys = list(zip(ds["session_id"], ds["task_id"], ds["step"]))
    assert keys == sorted(keys)
    assert (ds["schema_version"] == SCHEMA_VERSION).all() and (ds["reward_version"] == "reward_v1").all()
    assert (ds["data_source"] == "synthetic").all() and (ds["propensity_source"] == "logged").all()
    assert (
        ds["action_index"]
        == ds["model"].map(
            ds_index := {
                m: i
                for i, m in enumerate(
                    (
                        "claude-opus-4",
                        "claude-sonnet-4",
                        "gpt-4.1",
                        "gpt-4.1-mini",
                        "qwen2.5-coder-32b",
                        "llama-3.1-8b",
                    )
                )
            }
        )
    ).all()
    assert ds_index  # the catalogue's action order
    # the source of every row is traceable to its log line
    merged = ds.merge(trajectories, on=["source_file", "source_line"], suffixes=("", "_t"))
    assert len(merged) == len(ds)
    assert (merged["session_id"] == merged["session_id_t"]).all() and (merged["task_id"] == merged["task_id_t"]).all()
    assert (merged["model"] == merged["model_t"]).all()
    # SAGE logs no step: every step is derived from the timestamps, and equals the attempt index
    assert merged["step_t"].isna().all() and (ds["step_source"] == "derived").all()
    assert (merged["step"] == merged["failure_count_t"]).all()


def test_build_is_pure_and_order_independent(ds, trajectories, catalogue, table):
    shuffled = trajectories.sample(frac=1.0, random_state=0).reset_index(drop=True)
    again = build_routing_dataset(shuffled, table, catalogue).frame
    pd.testing.assert_frame_equal(again, ds)


# ------------------------------------------------------------------ split
def test_split_is_by_session(ds):
    per_session = ds.groupby("session_id")["split"].nunique()
    assert (per_session == 1).all()
    assert set(ds["split"]) == {"train", "eval"}
    sessions = ds.drop_duplicates("session_id")
    frac = (sessions["split"] == "eval").mean()
    assert 0.08 < frac < 0.35, frac


def test_split_is_the_documented_hash(ds):
    for sid, split in ds.drop_duplicates("session_id")[["session_id", "split"]].itertuples(index=False):
        u = int.from_bytes(hashlib.sha256(f"sage-routing:{sid}".encode()).digest()[:8], "big") / 2.0**64
        assert split == ("eval" if u < 0.2 else "train")


def test_split_is_stable_across_runs_and_subsets(ds, trajectories, catalogue, table):
    again = build_routing_dataset(trajectories, table, catalogue).frame
    assert again["split"].tolist() == ds["split"].tolist()
    sessions = sorted(trajectories["session_id"].unique())
    for subset in (sessions[::3], sessions[1::2], sessions[-5:]):
        sub = build_routing_dataset(
            trajectories[trajectories["session_id"].isin(subset)].reset_index(drop=True), table, catalogue
        ).frame
        want = ds.set_index("decision_id").loc[sub["decision_id"], "split"]
        assert sub["split"].tolist() == want.tolist()
    # the split function alone: a session's split does not depend on the others
    ids = pd.Series(["a", "b", "c", "a", "zz"])
    full = session_split(ids, 0.5, "salt")
    assert full[0] == full[3]
    for i, s in enumerate(ids):
        assert session_split(pd.Series([s]), 0.5, "salt")[0] == full[i]


def test_split_depends_on_salt_and_fraction(ds, trajectories, catalogue, table):
    sessions = pd.Series(sorted(trajectories["session_id"].unique()))
    a = session_split(sessions, 0.2, "sage-routing")
    b = session_split(sessions, 0.2, "other-salt")
    assert (a != b).any()
    # a larger eval fraction only moves sessions from train into eval
    c = session_split(sessions, 0.5, "sage-routing")
    assert ((a == "eval") <= (c == "eval")).all() and (c == "eval").sum() > (a == "eval").sum()
    wide = build_routing_dataset(trajectories, table, catalogue, DatasetConfig(eval_fraction=0.5)).frame
    assert (wide.groupby("session_id")["split"].nunique() == 1).all()


# ------------------------------------------------------------------ rewards
def test_reward_v1_is_the_logged_reward(ds):
    assert (ds["reward"] == ds["logged_reward"]).all()
    assert ds["reward"].between(-2, 2).all()


def test_reward_v2_subtracts_weighted_cost_and_clamps(trajectories, catalogue, table):
    cfg = DatasetConfig(reward=RewardSpec(version="reward_v2", cost_weight=5.0))
    v2 = build_routing_dataset(trajectories, table, catalogue, cfg).frame
    assert (v2["reward_version"] == "reward_v2").all()
    want = np.clip(v2["logged_reward"] - 5.0 * v2["cost_usd"], -2.0, 2.0)
    np.testing.assert_allclose(v2["reward"], want, rtol=0, atol=1e-12)
    assert (v2["reward"] < v2["logged_reward"]).all()
    # clamping, on hand-made rows
    rows = trajectories.iloc[:3].copy()
    rows["logged_reward"] = [-1.95, 2.0, 1.0]
    rows["cost_usd"] = [0.1, 0.0, 0.02]
    out = build_routing_dataset(
        rows.reset_index(drop=True),
        table,
        catalogue,
        DatasetConfig(reward=RewardSpec(version="reward_v2", cost_weight=5.0)),
    ).frame
    assert out.sort_values("source_line")["reward"].tolist() == pytest.approx([-2.0, 2.0, 0.9], abs=1e-12)
    heavy = build_routing_dataset(
        rows.reset_index(drop=True),
        table,
        catalogue,
        DatasetConfig(reward=RewardSpec(version="reward_v2", cost_weight=200.0)),
    ).frame
    assert heavy.sort_values("source_line")["reward"].tolist() == pytest.approx([-2.0, 2.0, -2.0], abs=1e-12)


# ------------------------------------------------------------------ action kinds
def test_action_kind_is_consistent_with_the_table(ds, table, catalogue):
    primary = ds["role"].map({r: route.primary for r, route in table.routes.items()})
    fallback = ds["role"].map({r: route.fallback for r, route in table.routes.items()})
    # table_model is what SAGE's table would have routed in the logged state
    role = ds["role"].map(ROLE_INDEX).to_numpy()
    fired = table.fallback_fires(
        role, ds["task_complexity_score"], ds["primary_failure_count"], ds["failure_count"]
    )
    assert (ds["table_model"] == np.where(fired, fallback, primary)).all()
    assert (ds["fallback_triggered"] == fired).all()
    assert 0.05 < fired.mean() < 0.95
    # primary / fallback: the table's choice was followed (and which it was); explore: it was not
    kind = ds["action_kind"]
    follows = ds["model"] == ds["table_model"]
    assert ((kind == "explore") == ~follows).all()
    assert ((kind == "primary") == (follows & ~fired)).all()
    assert ((kind == "fallback") == (follows & fired)).all()
    assert (ds.loc[kind == "primary", "model"] == primary[kind == "primary"]).all()
    assert (ds.loc[kind == "fallback", "model"] == fallback[kind == "fallback"]).all()
    # exploration that happens to pick the role's primary (or fallback) model is still exploration
    assert ((kind == "explore") & (ds["model"] == primary)).any()
    assert ((kind == "explore") & (ds["model"] == fallback)).any()
    # under epsilon = 0.3 most decisions follow the table, and explore ones carry eps/k propensities
    assert 0.6 < follows.mean() < 0.95
    k = catalogue.role_mask()[role].sum(axis=1)
    np.testing.assert_allclose(ds.loc[~follows, "propensity"], (0.3 / k)[~follows.to_numpy()], atol=1e-9)


# ------------------------------------------------------------------ episodes
def test_collected_episodes_are_complete(ds):
    assert ds["episode_complete"].all()
    assert (ds.groupby("episode_id")["terminal"].sum() == 1).all()
    assert (ds["step"] > 0).any()


def _multi_step_episode(trajectories: pd.DataFrame, n: int = 3) -> tuple[str, str]:
    counts = trajectories.groupby(["session_id", "task_id"]).size()
    return counts[counts >= n].index[0]


def test_episode_with_a_missing_step_is_incomplete(trajectories, catalogue, table):
    """SAGE logs no step; a lost attempt shows where the state's failure count says an earlier
    attempt is missing (the collector logs failure_count = the attempt index)."""
    sid, tid = _multi_step_episode(trajectories)
    hole = (
        (trajectories["session_id"] == sid) & (trajectories["task_id"] == tid) & (trajectories["failure_count"] == 1)
    )
    out = build_routing_dataset(trajectories[~hole].reset_index(drop=True), table, catalogue).frame
    mine = out["episode_id"] == f"{sid}/{tid}"
    assert mine.sum() >= 2
    assert not out.loc[mine, "episode_complete"].any()
    assert out.loc[~mine, "episode_complete"].all()


@pytest.mark.parametrize("damage", ["no_terminal", "two_terminals", "missing_first", "missing_last"])
def test_other_broken_episodes_are_incomplete(damage, trajectories, catalogue, table):
    sid, tid = _multi_step_episode(trajectories)
    df = trajectories.copy()
    ep = (df["session_id"] == sid) & (df["task_id"] == tid)
    attempt = df["failure_count"]  # the attempt index, as the collector logs it
    last = int(attempt[ep].max())
    if damage == "no_terminal":
        df.loc[ep, "terminal"] = False
    elif damage == "two_terminals":
        df.loc[ep & (attempt == 0), "terminal"] = True
    elif damage == "missing_first":
        df = df[~(ep & (attempt == 0))]
    else:  # the terminal step is lost: what is left has no terminal
        df = df[~(ep & (attempt == last))]
    out = build_routing_dataset(df.reset_index(drop=True), table, catalogue).frame
    mine = out["episode_id"] == f"{sid}/{tid}"
    assert not out.loc[mine, "episode_complete"].any()
    assert out.loc[~mine, "episode_complete"].all()


# ------------------------------------------------------------------ costs, missing fields
def test_cost_from_catalogue_when_not_logged(trajectories, catalogue, table):
    df = trajectories.copy()
    drop = df.index % 3 == 0
    df.loc[drop, "cost_usd"] = np.nan
    no_tokens = df.index % 6 == 0  # among the dropped costs, some have no prompt size either
    df["prompt_tokens"] = df["prompt_tokens"].astype("Int64")
    df.loc[no_tokens, "prompt_tokens"] = pd.NA
    out = build_routing_dataset(df, table, catalogue).frame
    by_line = out.set_index(["source_file", "source_line"])
    key = list(zip(df["source_file"], df["source_line"]))
    src = by_line.loc[key, "cost_source"].to_numpy()
    cost = by_line.loc[key, "cost_usd"].to_numpy()
    assert (src[drop] == "catalogue").all() and (src[~drop] == "logged").all()
    np.testing.assert_array_equal(cost[~drop], trajectories["cost_usd"].to_numpy()[~drop])
    action = df["model"].map(catalogue.index).to_numpy()
    tokens = df["prompt_tokens"].astype("float64").fillna(ASSUMED_PROMPT_TOKENS).to_numpy()
    np.testing.assert_allclose(cost[drop], catalogue.cost_usd(action, tokens)[drop], rtol=0, atol=1e-15)
    # with the prompt size logged the catalogue cost is close to what the simulator logged
    both = drop & ~no_tokens
    np.testing.assert_allclose(cost[both], trajectories["cost_usd"].to_numpy()[both], atol=1e-6)
    # no prompt size: the assumed size, as in the simulator
    assumed = catalogue.array("cost_per_call")[action] \
        + catalogue.array("cost_per_1k_prompt_tokens")[action] * ASSUMED_PROMPT_TOKENS / 1000
    np.testing.assert_allclose(cost[no_tokens], assumed[no_tokens], atol=1e-15)


def test_missing_propensity_and_failure_count(trajectories, catalogue, table):
    df = trajectories.copy()
    df["propensity"] = np.nan
    df["failure_count"] = pd.array([None] * len(df), dtype="Int64")
    out = build_routing_dataset(df, table, catalogue).frame
    assert (out["propensity_source"] == "missing").all() and out["propensity"].isna().all()
    assert (out["failure_count"] == out["step"]).all()
    assert out["failure_count"].dtype == np.int64


# ------------------------------------------------------------------ files
def _norm(v):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return v


def test_parquet_and_jsonl_have_the_same_rows(ds, tmp_path):
    files = write_routing_dataset(ds, tmp_path / "routing")
    assert files.parquet == tmp_path / "routing" / PARQUET_NAME == tmp_path / "routing" / "routing_v1.parquet"
    assert files.jsonl == tmp_path / "routing" / JSONL_NAME == tmp_path / "routing" / "routing_v1.jsonl"
    assert files.parquet_sha256 == hashlib.sha256(files.parquet.read_bytes()).hexdigest()
    pq_rows = [{k: _norm(v) for k, v in r.items()} for r in pq.read_table(files.parquet).to_pylist()]
    js_rows = [json.loads(x) for x in files.jsonl.read_text(encoding="utf-8").splitlines()]
    assert len(pq_rows) == len(js_rows) == len(ds)
    assert pq_rows == js_rows
    assert list(js_rows[0]) == list(ds.columns)
    meta = pq.read_schema(files.parquet).metadata
    assert meta[b"sage.schema_version"] == b"1" and meta[b"sage.reward_version"] == b"reward_v1"
    back = read_routing_dataset(files.parquet)
    pd.testing.assert_frame_equal(back, ds, check_dtype=False)
    assert not list((tmp_path / "routing").glob(".*.tmp"))


def test_jsonl_writes_missing_values_as_null(trajectories, catalogue, table, tmp_path):
    df = trajectories.iloc[:5].copy()
    df["propensity"] = np.nan
    df["prompt_tokens"] = pd.array([None] * 5, dtype="Int64")
    out = build_routing_dataset(df.reset_index(drop=True), table, catalogue).frame
    files = write_routing_dataset(out, tmp_path)
    rows = [json.loads(x) for x in files.jsonl.read_text().splitlines()]
    assert all(r["propensity"] is None and r["prompt_tokens"] is None for r in rows)
    assert all(r["propensity_source"] == "missing" for r in rows)


def test_read_only_the_columns_asked_for(ds, tmp_path):
    files = write_routing_dataset(ds, tmp_path / "routing")
    part = read_routing_dataset(files.parquet, ["reward", "decision_id", "reward"])
    assert list(part.columns) == ["reward", "decision_id"]
    pd.testing.assert_frame_equal(part, ds[["reward", "decision_id"]], check_dtype=False)
    with pytest.raises(ValueError, match=r"routing dataset .*routing_v1\.parquet lacks columns \['nope'\]: "
                                         r"rematerialize routing_dataset"):
        read_routing_dataset(files.parquet, ["reward", "nope"])


def test_read_missing_dataset(tmp_path):
    with pytest.raises(
        FileNotFoundError,
        match=r"routing dataset .*routing_v1\.parquet not found: materialize "
        r"routing_dataset first",
    ):
        read_routing_dataset(tmp_path / "routing_v1.parquet")


def test_empty_input_raises_a_clear_error(trajectories, catalogue, table):
    with pytest.raises(ValueError) as err:
        build_routing_dataset(trajectories.iloc[:0], table, catalogue)
    assert str(err.value) == (
        "no trajectory rows to build the routing dataset from: the trajectories asset "
        "accepted nothing (see its quarantine.jsonl and metadata)"
    )


@pytest.mark.parametrize("frac", [0.0, 1.0, -0.1])
def test_dataset_config_validation(frac):
    bound = "greater than 0" if frac <= 0 else "less than 1"
    with pytest.raises(ValidationError, match=rf"\neval_fraction\n  Input should be {bound} .*input_value={frac},"):
        DatasetConfig(eval_fraction=frac)
    assert DatasetConfig.eval_fraction == DatasetConfig().eval_fraction == 0.2  # read as a class attribute too


# ------------------------------------------------------------------ SAGE's own shape: joins and derivations
SAGE_TABLE = {"routing": {
    "coder": {"primary": "qwen2.5-coder:1.5b", "fallback": "codestral:22b",
              "fallback_triggers": ["task_complexity_score > 0.8", "primary_failure_count >= 2"]},
    "shell_chat": {"primary": "qwen3:14b-q4_K_M", "fallback": "claude-sonnet-4-5"},
}}


def _sage_rows(rows: list[dict]) -> pd.DataFrame:
    """Trajectory rows as the ingest writes them for SAGE journals (no step, no propensity)."""
    base = {"session_id_source": "file_stem", "trace_id": None, "step": None, "propensity": None,
            "prompt_strategy_key": "default", "primary_failure_count": None, "failure_count": None,
            "prompt_tokens": None, "verification_passed": None, "failed_reason": None, "timed_out": None,
            "reviewer_score": None, "latency_s": None, "cost_usd": None, "terminal": False,
            "data_source": "real", "source_file": "/s/2026-11-20.log", "session_id": "2026-11-20"}
    df = pd.DataFrame([base | r for r in rows])
    df["timestamp_utc"] = pd.to_datetime(df["timestamp"], utc=True, format="ISO8601")
    for c in ("step", "primary_failure_count", "failure_count", "prompt_tokens"):
        df[c] = df[c].astype("Int64")
    for c in ("propensity", "task_complexity_score", "reviewer_score", "latency_s", "cost_usd", "logged_reward"):
        df[c] = df[c].astype("float64")
    return df


def _mrd(rows: list[dict]) -> pd.DataFrame:
    base = {"source_file": "/s/2026-11-20.log", "session_id": "2026-11-20", "trace_id": None,
            "matched_fallback_triggers": [], "policy_source": "yaml", "propensity": None,
            "task_complexity_score": None, "primary_failure_count": None}
    df = pd.DataFrame([base | r for r in rows])
    df["propensity"] = df["propensity"].astype("float64")
    return df


def _tu(rows: list[dict]) -> pd.DataFrame:
    base = {"source_file": "/s/2026-11-20.log", "session_id": "2026-11-20", "trace_id": None, "agent": None,
            "cost_usd": None}
    df = pd.DataFrame([base | r for r in rows])
    df["cost_usd"] = df["cost_usd"].astype("float64")
    return df


@pytest.fixture()
def sage_day():
    from sage_pipeline.sage.table import RoutingTable

    table = RoutingTable.from_dict(SAGE_TABLE, source="models.yaml")
    traj = _sage_rows([
        # task t1: primary fails twice (lines 3, 7), then the fallback passes (line 11); logged out of order
        {"task_id": "t1", "role": "coder", "model": "codestral:22b", "timestamp": "2026-11-20T10:00:09+00:00",
         "source_line": 11, "task_complexity_score": 0.5, "verification_passed": True, "logged_reward": 1.0,
         "terminal": True},
        {"task_id": "t1", "role": "coder", "model": "qwen2.5-coder:1.5b", "timestamp": "2026-11-20T10:00:01+00:00",
         "source_line": 3, "task_complexity_score": 0.5, "verification_passed": False, "logged_reward": 0.1},
        {"task_id": "t1", "role": "coder", "model": "qwen2.5-coder:1.5b", "timestamp": "2026-11-20T12:00:05+02:00",
         "source_line": 7, "task_complexity_score": None, "verification_passed": False, "logged_reward": 0.0},
        # task t2: a shell_chat decision whose complexity and tokens come only from the side events
        {"task_id": "t2", "role": "shell_chat", "model": "claude-sonnet-4-5",
         "timestamp": "2026-11-20T10:01:00+00:00", "source_line": 15, "task_complexity_score": None,
         "verification_passed": True, "logged_reward": 0.9, "terminal": True},
        # a role the table does not route: kept in trajectories, left out of the dataset
        {"task_id": "t3", "role": "ghost", "model": "x:1b", "timestamp": "2026-11-20T10:02:00+00:00",
         "source_line": 17, "task_complexity_score": 0.3, "logged_reward": 0.5, "terminal": True},
    ])
    mrd = _mrd([
        {"source_line": 2, "agent_role": "coder", "selected_model": "qwen2.5-coder:1.5b",
         "primary_model": "qwen2.5-coder:1.5b", "fallback_model": "codestral:22b"},
        {"source_line": 6, "agent_role": "coder", "selected_model": "qwen2.5-coder:1.5b",
         "primary_model": "qwen2.5-coder:1.5b", "fallback_model": "codestral:22b",
         "task_complexity_score": 0.5, "primary_failure_count": 1},
        {"source_line": 10, "agent_role": "coder", "selected_model": "codestral:22b",
         "primary_model": "qwen2.5-coder:1.5b", "fallback_model": "codestral:22b",
         "matched_fallback_triggers": ["primary_failure_count >= 2"]},
        {"source_line": 13, "agent_role": "shell_chat", "selected_model": "claude-sonnet-4-5",
         "primary_model": "qwen3:14b-q4_K_M", "fallback_model": "claude-sonnet-4-5", "policy_source": "learned",
         "propensity": 0.7, "task_complexity_score": 0.42, "primary_failure_count": 0},
    ])
    tu = _tu([
        {"source_line": 14, "model": "claude-sonnet-4-5", "prompt_tokens": 1200, "completion_tokens": 300},
        {"source_line": 14, "model": "claude-sonnet-4-5", "prompt_tokens": 100, "completion_tokens": 20,
         "cost_usd": 0.01},
        {"source_line": 16, "model": "claude-sonnet-4-5", "prompt_tokens": 5, "completion_tokens": 5},  # no step after
    ])
    return table, traj, mrd, tu


def test_sage_journal_rows_join_derive_and_keep_unknown_models(sage_day, catalogue):
    table, traj, mrd, tu = sage_day
    built = build_routing_dataset(traj, table, catalogue, DatasetConfig(), mrd, tu)
    df, space, rep = built.frame, built.space, built.report
    assert space.roles == ("coder", "shell_chat")
    assert set(space.actions) == {"qwen2.5-coder:1.5b", "codestral:22b", "qwen3:14b-q4_K_M", "claude-sonnet-4-5"}
    assert rep.excluded_roles == {"ghost": 1} and rep.dropped_no_complexity == 0
    t1 = df[df["task_id"] == "t1"].set_index("step")
    # steps derived by time (the +02:00 stamp is 10:00:05 UTC), not by file line
    assert t1["source_line"].tolist() == [3, 7, 11] and (t1["step_source"] == "derived").all()
    assert t1["task_complexity_score"].tolist() == [0.5, 0.5, 0.5]  # the second from its routing decision
    assert t1["primary_failure_count"].tolist() == [0, 1, 2]  # derived, then the MRD's, then derived
    assert t1["failure_count"].tolist() == [0, 1, 2]
    assert t1["action_kind"].tolist() == ["primary", "primary", "fallback"]
    assert t1["matched_fallback_triggers"].iat[2] == '["primary_failure_count >= 2"]'
    assert t1["episode_complete"].all() and (t1["policy_source"] == "yaml").all()
    t2 = df[df["task_id"] == "t2"].iloc[0]
    assert t2["task_complexity_score"] == 0.42 and t2["policy_source"] == "learned"
    assert t2["propensity"] == 0.7 and t2["propensity_source"] == "logged_routing_decision"
    assert t2["prompt_tokens"] == 1300 and t2["completion_tokens"] == 320
    assert t2["cost_usd"] == 0.01 and t2["cost_source"] == "logged"
    assert rep.token_usage_unattributed == 1 and rep.routing_decisions_joined == 4
    # Ollama models have no price in the catalogue: unknown, never a reason to drop a row
    assert set(df.loc[df["cost_source"] == "unknown", "model"]) == {"qwen2.5-coder:1.5b", "codestral:22b"}
    assert df["cost_usd"].isna().sum() == 3
    assert (df.loc[df["propensity_source"] == "missing", "propensity"].isna()).all()


def test_reward_v2_with_unknown_prices_names_the_models(sage_day, catalogue):
    table, traj, mrd, tu = sage_day
    cfg = DatasetConfig(reward=RewardSpec(version="reward_v2"))
    with pytest.raises(ValueError) as err:
        build_routing_dataset(traj, table, catalogue, cfg, mrd, tu, price_source="prices.yaml")
    assert ("reward_v2 subtracts each call's cost, but models ['codestral:22b', 'qwen2.5-coder:1.5b'] have no "
            "logged cost_usd and no price in prices.yaml") in str(err.value)


def test_a_routing_decision_serves_one_step_only(sage_day, catalogue):
    table, traj, mrd, tu = sage_day
    traj = traj.copy()
    traj.loc[traj["source_line"] == 7, "task_complexity_score"] = 0.5
    built = build_routing_dataset(traj, table, catalogue, DatasetConfig(), mrd[mrd["source_line"] != 6], tu)
    t1 = built.frame[built.frame["task_id"] == "t1"].set_index("step")
    # without its own MRD the second attempt does not reuse the first's (line 2)
    assert t1["policy_source"].isna().tolist() == [False, True, False]
    assert t1["primary_failure_count"].tolist() == [0, 1, 2]  # derived from the earlier failed primaries


def test_episode_without_complexity_is_left_out_and_counted(sage_day, catalogue):
    table, traj, mrd, tu = sage_day
    built = build_routing_dataset(traj, table, catalogue, DatasetConfig(), mrd[mrd["source_line"] != 6], tu)
    # t1's second attempt has no complexity in its state nor a routing decision: t1 goes, t2 stays
    assert built.report.dropped_no_complexity == 3
    assert built.frame["task_id"].tolist() == ["t2"]
    with pytest.raises(ValueError, match="no decision has a task_complexity_score"):
        build_routing_dataset(traj, table, catalogue, DatasetConfig(), None, None)


def test_no_routed_role_is_an_error_naming_the_table(catalogue):
    from sage_pipeline.sage.table import RoutingTable

    table = RoutingTable.from_dict(SAGE_TABLE, source="models.yaml")
    traj = _sage_rows([{"task_id": "t", "role": "ghost", "model": "m", "timestamp": "2026-11-20T10:00:00+00:00",
                        "source_line": 1, "task_complexity_score": 0.2, "logged_reward": 0.1, "terminal": True}])
    with pytest.raises(ValueError, match=r"no decision of the logs is for a role the routing table models\.yaml "
                                         r"routes \(logged roles: \['ghost'\]"):
        build_routing_dataset(traj, table, catalogue)


def test_a_build_in_session_chunks_writes_the_same_files(tmp_path, catalogue, table):
    """The logs cut into runs of whole sessions and built one run at a time give the same
    rows, order, dtypes, action space and report as one build of everything, with edge
    cases spread over the runs: a session of a role the table does not route, an episode
    with no complexity anywhere, token usage of a session with no decision, a model only
    one run logs (its action_index is the whole space's)."""
    from sage_pipeline.routing.collector import CollectorConfig, collect
    from sage_pipeline.routing.ingest import IngestConfig, ingest
    from sage_pipeline.routing.routing_dataset import DatasetConfig, build_routing_dataset_files
    from sage_pipeline.routing.routing_simulator import RoutingSimulator

    collect(RoutingSimulator(catalogue, table), tmp_path / "sessions", CollectorConfig(episodes=400, seed=5))
    res = ingest(IngestConfig((tmp_path / "sessions",)), tmp_path / "in")
    traj = pq.read_table(res.trajectories).to_pandas()
    sessions = sorted(traj["session_id"].unique())
    traj.loc[traj["session_id"] == sessions[3], "role"] = "not_a_table_role"
    first_task = traj.loc[traj["session_id"] == sessions[7], "task_id"].iloc[0]
    traj.loc[(traj["session_id"] == sessions[7]) & (traj["task_id"] == first_task), "task_complexity_score"] = np.nan
    late = traj["session_id"] == sessions[-2]
    traj.loc[late & (traj["role"] == traj.loc[late, "role"].iloc[0]), "model"] = "a-model-only-one-run-logs"
    pq.write_table(pa.Table.from_pandas(traj, preserve_index=False), res.trajectories)
    tu_path = tmp_path / "in" / "token_usage.parquet"
    tu = pq.read_table(tu_path).to_pandas()
    extra = tu.iloc[:3].copy()
    extra["session_id"] = "no-decisions-here"
    pq.write_table(pa.Table.from_pandas(pd.concat([tu, extra], ignore_index=True), preserve_index=False), tu_path)
    mrd_path = tmp_path / "in" / "routing_decisions.parquet"
    mrd = pq.read_table(mrd_path).to_pandas()
    mrd.loc[mrd["session_id"] == sessions[7], "task_complexity_score"] = np.nan
    pq.write_table(pa.Table.from_pandas(mrd, preserve_index=False), mrd_path)

    def build(out: str, chunk_rows: int):
        return build_routing_dataset_files(res.trajectories, table, catalogue, DatasetConfig(), tmp_path / out,
                                           mrd_path, tu_path, chunk_rows=chunk_rows)

    (whole, space_w, rep_w), (parts, space_p, rep_p) = build("whole", 10**9), build("parts", 97)
    assert rep_w.excluded_roles == {"not_a_table_role": int((traj["role"] == "not_a_table_role").sum())}
    assert rep_w.dropped_no_complexity > 0 and rep_w.token_usage_unattributed >= 3
    assert rep_p == rep_w
    assert space_p.to_dict() == space_w.to_dict() and "a-model-only-one-run-logs" in space_w.actions
    a, b = read_routing_dataset(whole.parquet), read_routing_dataset(parts.parquet)
    assert len(b) > 5 * 97
    pd.testing.assert_frame_equal(b, a)
    assert parts.jsonl.read_bytes() == whole.jsonl.read_bytes()
    assert pq.read_schema(parts.parquet).metadata[b"sage.reward_spec"] == \
        pq.read_schema(whole.parquet).metadata[b"sage.reward_spec"]
    assert not list((tmp_path / "parts").glob(".*parts*"))      # the chunks' folder is gone


SAGE_JOURNAL = Path(__file__).resolve().parent / "fixtures" / "sage_journal"  # SAGE's shape, its models.yaml


def test_the_assets_work_writes_the_set_and_reports_its_figures(tmp_path):
    """run_routing_dataset (the routing_dataset asset's work), called without Dagster on SAGE's journals
    ingested into <root>/routing/: the dataset's files, the action space, the build report and the task
    outcomes, at the paths readers know; the figures are the files'; the clock sage_week declares is used."""
    from sage_pipeline import artifacts
    from sage_pipeline.routing import task_outcomes as to
    from sage_pipeline.routing.action_space import FILE_NAME
    from sage_pipeline.routing.catalogue import SAGE_CATALOGUE, ModelCatalogue
    from sage_pipeline.routing.routing_dataset import BUILD_REPORT_NAME, run_routing_dataset
    from sage_pipeline.sage.table import RoutingTable

    ing = ingest.ingest(ingest.IngestConfig([SAGE_JOURNAL / "memory" / "sessions"]), tmp_path / "routing",
                        progress=lambda m: None)
    assert ing.stats.quarantined == 0
    clock = tmp_path / "journal_clock.json"
    clock.write_text(json.dumps({"clock_scale": 4.0}))
    said: list[str] = []
    run = run_routing_dataset(tmp_path, RoutingTable.load(SAGE_JOURNAL / "models.yaml"),
                              ModelCatalogue.load(SAGE_CATALOGUE), DatasetConfig(), to.TaskOutcomeConfig(),
                              journal_clock=clock, progress=said.append)
    out = tmp_path / "routing"
    assert (run.parquet, run.jsonl) == (out / PARQUET_NAME, out / JSONL_NAME)
    for name in (PARQUET_NAME, JSONL_NAME, FILE_NAME, BUILD_REPORT_NAME, to.TASK_OUTCOMES_NAME):
        assert (out / name).is_file(), name
    df = read_routing_dataset(run.parquet)
    assert run.rows == len(df) > 0 and run.sha256 == artifacts.file_sha256(run.parquet)
    assert (run.episodes, run.sessions) == (df["episode_id"].nunique(), df["session_id"].nunique())
    assert set(run.rows_per_role) == set(run.space.roles) and sum(run.rows_per_role.values()) == run.rows
    assert run.rows_per_split == df["split"].value_counts().to_dict()
    assert run.schema_version == SCHEMA_VERSION and run.reward_version == DatasetConfig().reward.version
    assert set(run.column_types) == set(DATASET_COLUMNS)
    assert run.clock_scale == 4.0 and run.tasks.report["tasks"] == len(pd.read_parquet(out / to.TASK_OUTCOMES_NAME))
    assert run.tasks.report["tasks"] > 0
    assert json.loads((out / BUILD_REPORT_NAME).read_text()) == json.loads(json.dumps(run.report.to_dict()))
    assert any(f"journal clock 4 (declared by sage_week in {clock})" in m for m in said)
    assert any(m.startswith(f"routing dataset: {run.rows:,} decisions") for m in said)


def test_the_assets_work_without_trajectories_names_the_file_and_writes_nothing(tmp_path, catalogue, table):
    from sage_pipeline.routing import task_outcomes as to
    from sage_pipeline.routing.routing_dataset import run_routing_dataset

    with pytest.raises(FileNotFoundError, match="materialize trajectories first") as err:
        run_routing_dataset(tmp_path, table, catalogue, DatasetConfig(), to.TaskOutcomeConfig())
    assert str(tmp_path / "routing" / "trajectories.parquet") in str(err.value)
    assert not list(tmp_path.iterdir())  # no lock, no set, no folder
