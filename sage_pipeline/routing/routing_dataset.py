"""The routing dataset: one row per routing decision, versioned, split by session.

Built from ``trajectories.parquet`` (validated TRAJECTORY_STEP events) joined with the
``MODEL_ROUTING_DECISION`` and ``TOKEN_USAGE`` events the ingest kept beside it. Adds what
the learners and the evaluation need: the episode, the step (derived where SAGE did not
log one), the action index in the dataset's :class:`ActionSpace`, what the static table
would have chosen, the cost (logged, else priced by the catalogue, else ``unknown``), the
reward under the configured version, and a train/eval split by a stable hash of the
session id (no session is in both). Written as ``routing_v1.parquet`` and
``routing_v1.jsonl`` for SAGE's tooling, with the action space as ``action_space.json``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.reward import RewardSpec, apply_version
from sage_pipeline.routing.schema import DATASET_COLUMNS, SCHEMA_VERSION
from sage_pipeline.routing.table import RoutingTable

PARQUET_NAME = f"routing_v{SCHEMA_VERSION}.parquet"
JSONL_NAME = f"routing_v{SCHEMA_VERSION}.jsonl"


class DatasetConfig(BaseModel):
    """How the routing dataset is built from the ingested journals."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reward: RewardSpec = Field(default_factory=RewardSpec, description="the reward every row carries (recorded in "
                               "the Parquet file's metadata)")
    eval_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="share of sessions in the eval split (by session "
                                 "hash), in (0, 1)")
    split_salt: str = Field("sage-routing", description="salt of the session hash that assigns the split")


# The default read as a class attribute, as it could be when DatasetConfig was a dataclass
# (rl/policy_iteration.py does); pydantic keeps defaults in model_fields only.
DatasetConfig.eval_fraction = DatasetConfig.model_fields["eval_fraction"].default


def session_split(session_ids: pd.Series, eval_fraction: float, salt: str) -> np.ndarray:
    """'train' or 'eval' per row, from a stable hash of the session id.

    The same session always lands in the same split, whatever else is in the data.
    """
    uniq, inverse = np.unique(session_ids.to_numpy(dtype=object).astype(str), return_inverse=True)
    u = np.array([int.from_bytes(hashlib.sha256(f"{salt}:{s}".encode()).digest()[:8], "big") / 2.0**64
                  for s in uniq])
    return np.where(u[inverse] < eval_fraction, "eval", "train")


def _episode_complete(df: pd.DataFrame, logged_failures: pd.Series | None = None) -> np.ndarray:
    """Per row: its episode has steps 0..n-1 and exactly one terminal step, the last, and,
    where the log gave a failure count, it equals the step (derived steps are always 0..n-1:
    a lost attempt shows only there)."""
    g = df.groupby("episode_id", sort=False)
    n = g["step"].transform("size")
    ok = (g["step"].transform("min") == 0) & (g["step"].transform("max") == n - 1) \
        & (g["step"].transform("nunique") == n)
    term = df["terminal"].astype(bool)
    ok &= g["terminal"].transform("sum") == 1
    last = df["step"] == g["step"].transform("max")
    ok &= (term == last).groupby(df["episode_id"], sort=False).transform("all")
    if logged_failures is not None:
        gap = logged_failures.notna().to_numpy() & (logged_failures.to_numpy(dtype=float, na_value=-1) != df["step"])
        ok &= ~pd.Series(gap, index=df.index).groupby(df["episode_id"], sort=False).transform("any")
    return ok.to_numpy()


@dataclass
class BuildReport:
    """What building the dataset joined, derived and left out (asset metadata)."""

    excluded_roles: dict[str, int]  # role -> decisions of roles the routing table does not route
    dropped_no_complexity: int  # decisions of episodes with no task_complexity_score anywhere
    steps_derived: int  # decisions whose step was derived from timestamp, file and line order
    routing_decisions_joined: int  # decisions with their MODEL_ROUTING_DECISION
    token_usage_joined: int  # decisions with at least one TOKEN_USAGE event
    token_usage_unattributed: int  # TOKEN_USAGE events no later decision of the session used
    propensity_source: dict[str, int]
    cost_source: dict[str, int]
    models_without_price: list[str]

    def to_dict(self) -> dict:
        return asdict(self)


class BuiltDataset(NamedTuple):
    frame: pd.DataFrame | None  # one row per decision, DATASET_COLUMNS (None: an empty chunk, empty_ok)
    space: ActionSpace | None  # the multi-model action space of the frame (its action_index order)
    report: BuildReport


def _merge_reports(reports: list[BuildReport], extra_unattributed: int) -> BuildReport:
    """The report of the whole dataset from its chunks' reports (sums, unions)."""
    def add(dicts: list[dict[str, int]]) -> dict[str, int]:
        out: dict[str, int] = {}
        for d in dicts:
            for k, v in d.items():
                out[k] = out.get(k, 0) + int(v)
        return out

    return BuildReport(
        excluded_roles=add([r.excluded_roles for r in reports]),
        dropped_no_complexity=sum(r.dropped_no_complexity for r in reports),
        steps_derived=sum(r.steps_derived for r in reports),
        routing_decisions_joined=sum(r.routing_decisions_joined for r in reports),
        token_usage_joined=sum(r.token_usage_joined for r in reports),
        token_usage_unattributed=sum(r.token_usage_unattributed for r in reports) + extra_unattributed,
        propensity_source=add([r.propensity_source for r in reports]),
        cost_source=add([r.cost_source for r in reports]),
        models_without_price=sorted({m for r in reports for m in r.models_without_price}))


def _join_routing_decisions(df: pd.DataFrame, mrd: pd.DataFrame | None) -> pd.DataFrame:
    """Each decision's MODEL_ROUTING_DECISION: the latest one before it in the same file and
    session, for the same role and the selected model; one routing decision serves one step."""
    cols = ("mrd_line", "mrd_primary", "mrd_fallback", "mrd_triggers", "mrd_policy_source",
            "mrd_propensity", "mrd_task_complexity_score", "mrd_primary_failure_count")
    if mrd is None or mrd.empty:
        return df.assign(**{c: pd.Series([None] * len(df), index=df.index, dtype=object) for c in cols})
    right = pd.DataFrame({
        "source_file": mrd["source_file"].astype(str), "session_id": mrd["session_id"].astype(str),
        "role": mrd["agent_role"].astype(str), "model": mrd["selected_model"].astype(str),
        "mrd_line": mrd["source_line"].astype("int64"), "mrd_primary": mrd["primary_model"],
        "mrd_fallback": mrd["fallback_model"],
        "mrd_triggers": mrd["matched_fallback_triggers"].map(
            lambda t: None if t is None else json.dumps(list(t))),
        "mrd_policy_source": mrd["policy_source"], "mrd_propensity": mrd["propensity"],
        "mrd_task_complexity_score": mrd["task_complexity_score"],
        "mrd_primary_failure_count": mrd["primary_failure_count"],
    }).sort_values("mrd_line", kind="stable")
    left = df[["source_file", "session_id", "role", "model", "source_line"]].reset_index()
    left = left.sort_values("source_line", kind="stable")
    m = pd.merge_asof(left, right, left_on="source_line", right_on="mrd_line",
                      by=["source_file", "session_id", "role", "model"], direction="backward")
    # an MRD matched by several steps (a step that logged none reuses an older one): keep the first
    m = m.sort_values("source_line", kind="stable")
    reused = m["mrd_line"].notna() & m.duplicated(["source_file", "session_id", "role", "model", "mrd_line"])
    m.loc[reused, list(cols)] = None
    return df.join(m.set_index("index")[list(cols)])


def _join_token_usage(df: pd.DataFrame, tu: pd.DataFrame | None) -> tuple[pd.DataFrame, int]:
    """TOKEN_USAGE events summed onto the next decision of the same file and session that
    used the same model (SAGE logs a call's usage before the step it belongs to)."""
    cols = {"tu_prompt_tokens": np.nan, "tu_completion_tokens": np.nan, "tu_cost_usd": np.nan}
    if tu is None or tu.empty:
        return df.assign(**cols), 0
    left = pd.DataFrame({"source_file": tu["source_file"].astype(str), "session_id": tu["session_id"].astype(str),
                         "model": tu["model"].astype(str), "line": tu["source_line"].astype("int64"),
                         "p": tu["prompt_tokens"].astype("float64"), "c": tu["completion_tokens"].astype("float64"),
                         "usd": tu["cost_usd"].astype("float64")}).sort_values("line", kind="stable")
    right = df[["source_file", "session_id", "model", "source_line"]].reset_index().sort_values(
        "source_line", kind="stable").rename(columns={"index": "row"})
    m = pd.merge_asof(left, right, left_on="line", right_on="source_line",
                      by=["source_file", "session_id", "model"], direction="forward")
    unattributed = int(m["row"].isna().sum())
    g = m.dropna(subset=["row"]).groupby("row")
    sums = pd.DataFrame({"tu_prompt_tokens": g["p"].sum(min_count=1), "tu_completion_tokens": g["c"].sum(min_count=1),
                         "tu_cost_usd": g["usd"].sum(min_count=1)})
    sums.index = sums.index.astype(df.index.dtype)
    return df.join(sums), unattributed


def _derive_steps(df: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The step index of every decision, and ``logged``/``derived``: an episode whose steps are
    all logged keeps them; any other is ordered by timestamp, then file, then line."""
    logged = df["step"].notna().groupby([df["session_id"], df["task_id"]]).transform("all")
    order = df.sort_values(["session_id", "task_id", "timestamp_utc", "source_file", "source_line"], kind="stable")
    derived = order.groupby(["session_id", "task_id"], sort=False).cumcount().reindex(df.index)
    step = np.where(logged, df["step"].fillna(-1), derived).astype(np.int64)
    return pd.Series(step, index=df.index), pd.Series(np.where(logged, "logged", "derived"), index=df.index)


def _catalogue_cost(models: pd.Series, prompt_tokens: pd.Series, catalogue: ModelCatalogue | None) -> np.ndarray:
    """Catalogue price of each call (NaN for models the catalogue does not list)."""
    out = np.full(len(models), np.nan)
    if catalogue is None:
        return out
    idx = models.map(catalogue.index)
    known = idx.notna().to_numpy()
    if known.any():
        out[known] = catalogue.cost_usd(idx[known].to_numpy(dtype=np.int64),
                                        prompt_tokens[known].astype("float64").to_numpy(na_value=np.nan))
    return out


def build_routing_dataset(trajectories: pd.DataFrame, table: RoutingTable, catalogue: ModelCatalogue | None = None,
                          config: DatasetConfig = DatasetConfig(), routing_decisions: pd.DataFrame | None = None,
                          token_usage: pd.DataFrame | None = None,
                          price_source: str = "the model catalogue", empty_ok: bool = False) -> BuiltDataset:
    """Turn validated trajectory rows into the routing dataset (pure, no I/O).

    Joins (each documented in docs/architecture.md): ``routing_decisions`` gives each
    decision the table's primary/fallback as SAGE logged them, the matched triggers,
    ``policy_source`` and, for a ``learned`` decision that logged it, its propensity, and
    fills a missing complexity or primary-failure count; ``token_usage`` gives prompt
    tokens (and cost, when logged) where the step's state has none. Steps SAGE did not log
    are derived (timestamp, file, line). Returns the dataset, the action space it uses
    (roles from ``table``, models from the table and the logs) and what was derived.
    ``empty_ok`` (a chunk of the logs, see :func:`build_routing_dataset_files`): no routable
    decision gives ``frame=None`` and what was left out, not an error.
    """
    if trajectories.empty:
        raise ValueError("no trajectory rows to build the routing dataset from: the trajectories asset "
                         "accepted nothing (see its quarantine.jsonl and metadata)")
    df = trajectories.reset_index(drop=True)
    if "timestamp_utc" not in df:
        df["timestamp_utc"] = pd.to_datetime(df["timestamp"], utc=True, format="ISO8601", errors="coerce")
    routed = df["role"].isin(table.roles)
    excluded = df.loc[~routed, "role"].value_counts().to_dict()
    df = df[routed].reset_index(drop=True)
    if df.empty and empty_ok:
        return BuiltDataset(None, None, BuildReport({str(k): int(v) for k, v in excluded.items()}, 0, 0, 0, 0,
                                                    0 if token_usage is None else len(token_usage), {}, {}, []))
    if df.empty:
        raise ValueError(f"no decision of the logs is for a role the routing table {table.source} routes "
                         f"(logged roles: {sorted(excluded)}; table roles: {', '.join(table.roles)}): "
                         "point SAGE_ROUTING_TABLE at the models.yaml the logs were made with")
    df = _join_routing_decisions(df, routing_decisions)
    df, tu_unattributed = _join_token_usage(df, token_usage)
    df["task_complexity_score"] = df["task_complexity_score"].astype("float64").fillna(
        df["mrd_task_complexity_score"].astype("float64"))
    df["primary_failure_count"] = df["primary_failure_count"].astype("Float64").fillna(
        df["mrd_primary_failure_count"].astype("Float64"))
    # an episode with a decision of unknown complexity cannot be replayed: leave it out, counted
    no_cx = df["task_complexity_score"].isna().groupby([df["session_id"], df["task_id"]]).transform("any")
    dropped = int(no_cx.sum())
    df = df[~no_cx].reset_index(drop=True)
    if df.empty and empty_ok:
        return BuiltDataset(None, None, BuildReport({str(k): int(v) for k, v in excluded.items()}, dropped, 0, 0, 0,
                                                    tu_unattributed, {}, {}, []))
    if df.empty:
        raise ValueError("no decision has a task_complexity_score (in its state or its MODEL_ROUTING_DECISION): "
                         "the routing dataset needs it for every decision")
    step, step_source = _derive_steps(df)
    df["step"], df["step_source"] = step, step_source
    df = df.sort_values(["session_id", "task_id", "step"], kind="stable").reset_index(drop=True)
    logged_pairs = list(df[["role", "model"]].drop_duplicates().itertuples(index=False, name=None))
    space = ActionSpace.build(table, logged_pairs, catalogue)
    role_idx = df["role"].map(space.role_index).to_numpy(dtype=np.int64)
    out = pd.DataFrame({
        "decision_id": df["session_id"] + "/" + df["task_id"] + "/" + df["step"].astype(str),
        "episode_id": df["session_id"] + "/" + df["task_id"],
        "session_id": df["session_id"], "task_id": df["task_id"],
        "step": df["step"].astype("int64"), "step_source": df["step_source"], "role": df["role"], "model": df["model"],
    })
    out["action_index"] = out["model"].map(space.index).astype("int64")
    # SAGE logs that lack failure_count: every earlier attempt of the episode failed
    failure_count = df["failure_count"].astype("Float64").fillna(df["step"].astype("Float64")).astype("int64")
    # and that lack primary_failure_count: the earlier failed attempts that used the role's primary
    primary_model = np.asarray(space.actions, dtype=object)[space.primary[role_idx]]
    prim_fail = pd.Series((df["model"].to_numpy(dtype=object) == primary_model)
                          & ~df["verification_passed"].astype("boolean").fillna(False).to_numpy(dtype=bool))
    earlier = prim_fail.groupby([df["session_id"], df["task_id"]]).cumsum() - prim_fail
    pfc = df["primary_failure_count"].fillna(earlier.astype("Float64")).astype("int64")
    fired = table.fallback_fires(role_idx, df["task_complexity_score"].to_numpy(), pfc.to_numpy(),
                                 failure_count.to_numpy())
    chosen = np.where(fired, space.fallback[role_idx], space.primary[role_idx])
    out["table_model"] = np.asarray(space.actions, dtype=object)[chosen]
    out["fallback_triggered"] = fired
    followed = out["model"].to_numpy(dtype=object) == out["table_model"].to_numpy(dtype=object)
    out["action_kind"] = np.where(~followed, "explore", np.where(fired, "fallback", "primary"))
    learned_p = df["mrd_propensity"].where(df["mrd_policy_source"] == "learned").astype("float64")
    out["propensity"] = df["propensity"].astype("float64").fillna(learned_p)
    out["propensity_source"] = np.where(df["propensity"].notna(), "logged",
                                        np.where(learned_p.notna(), "logged_routing_decision", "missing"))
    out["policy_source"] = df["mrd_policy_source"].astype(object)
    out["matched_fallback_triggers"] = df["mrd_triggers"].astype(object)
    out["task_complexity_score"] = df["task_complexity_score"].astype("float64")
    out["primary_failure_count"] = pfc
    out["failure_count"] = failure_count
    tokens = df["prompt_tokens"].astype("Float64").fillna(df["tu_prompt_tokens"].astype("Float64"))
    out["prompt_tokens"] = tokens.round().astype("Int64")
    out["completion_tokens"] = df["tu_completion_tokens"].astype("Float64").round().astype("Int64")
    out["verification_passed"] = df["verification_passed"].astype("boolean")
    out["timed_out"] = df["timed_out"].astype("boolean").fillna(False).astype(bool)
    out["reviewer_score"] = df["reviewer_score"].astype("float64")
    logged_cost = df["cost_usd"].astype("float64").fillna(df["tu_cost_usd"].astype("float64"))
    # a prompt size the log does not record is assumed (ASSUMED_PROMPT_TOKENS), as in the simulator
    price = _catalogue_cost(out["model"], out["prompt_tokens"], catalogue)
    out["cost_usd"] = logged_cost.fillna(pd.Series(price)).to_numpy()
    out["cost_source"] = np.where(logged_cost.notna(), "logged", np.where(np.isfinite(price), "catalogue", "unknown"))
    unpriced = sorted(set(out.loc[out["cost_source"] == "unknown", "model"]))
    out["latency_s"] = df["latency_s"].astype("float64")
    out["logged_reward"] = df["logged_reward"].astype("float64")
    if config.reward.version != "reward_v1" and unpriced:
        raise ValueError(f"{config.reward.version} subtracts each call's cost, but models {unpriced} have no logged "
                         f"cost_usd and no price in {price_source}: add them there (models.<name>.cost_per_call "
                         "and cost_per_1k_prompt_tokens; 0 for local models) or use reward_version reward_v1")
    out["reward"] = apply_version(out["logged_reward"].to_numpy(), out["cost_usd"].to_numpy(), config.reward)
    out["reward_version"] = config.reward.version
    out["schema_version"] = SCHEMA_VERSION
    out["terminal"] = df["terminal"].astype(bool)
    out["episode_complete"] = _episode_complete(out, df["failure_count"].astype("Float64"))
    out["split"] = session_split(out["session_id"], config.eval_fraction, config.split_salt)
    out["data_source"] = df["data_source"]
    out["timestamp"] = df["timestamp"]
    out["source_file"] = df["source_file"]
    out["source_line"] = df["source_line"].astype("int64")
    missing = [c for c in DATASET_COLUMNS if c not in out.columns]
    assert not missing, f"routing dataset lacks documented columns {missing}"
    report = BuildReport(
        excluded_roles={str(k): int(v) for k, v in excluded.items()}, dropped_no_complexity=dropped,
        steps_derived=int((out["step_source"] == "derived").sum()),
        routing_decisions_joined=int(df["mrd_line"].notna().sum()),
        token_usage_joined=int(df["tu_prompt_tokens"].notna().sum()), token_usage_unattributed=tu_unattributed,
        propensity_source=out["propensity_source"].value_counts().to_dict(),
        cost_source=out["cost_source"].value_counts().to_dict(), models_without_price=unpriced)
    return BuiltDataset(out, space, report)


@dataclass(frozen=True)
class DatasetFiles:
    parquet: Path
    jsonl: Path
    parquet_sha256: str


def write_routing_dataset(df: pd.DataFrame, out_dir: str | Path, reward: RewardSpec | None = None) -> DatasetFiles:
    """Write the dataset as Parquet and JSON lines, each atomically.

    The Parquet file's metadata records the schema version and the full reward spec
    (``sage.reward_spec``), so a reader can rebuild exactly the reward that was used.
    """
    table = pa.Table.from_pandas(df, preserve_index=False)
    return write_routing_dataset_tables([table], table.schema, out_dir, reward)


def write_routing_dataset_tables(tables, schema: pa.Schema, out_dir: str | Path,
                                 reward: RewardSpec | None = None) -> DatasetFiles:
    """Write Arrow tables of ``schema`` (consumed one at a time) as the dataset's Parquet
    and JSON-lines files, each atomically."""
    out_dir = Path(out_dir)
    parquet, jsonl = out_dir / PARQUET_NAME, out_dir / JSONL_NAME
    version = None
    enc = msgspec.json.Encoder()  # NaN and missing values are written as null
    with artifacts.atomic_path(parquet) as tmp, artifacts.atomic_open(jsonl, "wb") as fh:
        writer = None
        try:
            for table in tables:
                if writer is None:
                    version = str(table.column("reward_version")[0]) if table.num_rows else \
                        (reward.version if reward is not None else "")
                    meta = {**(schema.metadata or {}), b"sage.schema_version": str(SCHEMA_VERSION).encode(),
                            b"sage.reward_version": str(version).encode(),
                            **({b"sage.reward_spec": json.dumps(reward.model_dump()).encode()}
                               if reward is not None else {})}
                    schema = schema.with_metadata(meta)
                    writer = pq.ParquetWriter(tmp, schema, compression="zstd")
                table = table.replace_schema_metadata(schema.metadata)
                writer.write_table(table)
                for batch in table.to_batches(max_chunksize=50_000):
                    fh.write(enc.encode_lines(batch.to_pylist()))
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise ValueError(f"no rows to write to {parquet}")
    return DatasetFiles(parquet, jsonl, artifacts.file_sha256(parquet))


CHUNK_ROWS = 500_000  # decisions built at a time by build_routing_dataset_files


def _session_chunks(sessions: pd.Series, chunk_rows: int) -> list[np.ndarray]:
    """Sorted session ids cut into consecutive runs of about ``chunk_rows`` decisions (a
    session is never cut): built in this order, the chunks concatenate to the dataset's
    own order (session, task, step)."""
    counts = sessions.value_counts(sort=False).sort_index()
    ids, sizes = counts.index.to_numpy(dtype=object), counts.to_numpy()
    cut = np.cumsum(sizes) // max(chunk_rows, 1)
    return [ids[cut == c] for c in np.unique(cut)]


def _read_sessions(path: Path | None, sessions: np.ndarray) -> pd.DataFrame | None:
    if path is None or not Path(path).is_file():
        return None
    return pq.read_table(path, filters=[("session_id", "in", list(sessions))]).to_pandas()


def build_routing_dataset_files(trajectories: str | Path, table: RoutingTable, catalogue: ModelCatalogue | None,
                                config: DatasetConfig, out_dir: str | Path,
                                routing_decisions: str | Path | None = None, token_usage: str | Path | None = None,
                                price_source: str = "the model catalogue",
                                chunk_rows: int = CHUNK_ROWS) -> tuple[DatasetFiles, ActionSpace, BuildReport]:
    """:func:`build_routing_dataset` from the ingest's Parquet files to the dataset's files,
    ``chunk_rows`` decisions at a time, so memory does not grow with the logs.

    Every join and derivation is per session, so the logs are cut into runs of whole
    sessions in session order and each run is built alone; the runs' rows, concatenated,
    are the rows one build of everything gives, in the same order. The action space is
    built from every run's (role, model) pairs, and ``action_index`` set from it. Logs of
    at most ``chunk_rows`` decisions are built in one piece."""
    trajectories, out_dir = Path(trajectories), Path(out_dir)
    sessions = pq.read_table(trajectories, columns=["session_id"]).column(0).to_pandas()
    chunks = _session_chunks(sessions, chunk_rows)
    if len(chunks) <= 1:
        read = lambda p: pq.read_table(p).to_pandas() if p is not None and Path(p).is_file() else None  # noqa: E731
        built = build_routing_dataset(read(trajectories), table, catalogue, config, read(routing_decisions),
                                      read(token_usage), price_source=price_source)
        return write_routing_dataset(built.frame, out_dir, config.reward), built.space, built.report
    # token usage of sessions with no decision at all: no chunk sees it, a build of everything leaves it unattributed
    orphan_tu = 0
    if token_usage is not None and Path(token_usage).is_file():
        tu_sessions = pq.read_table(token_usage, columns=["session_id"]).column(0).to_pandas()
        orphan_tu = int((~tu_sessions.isin(sessions.unique())).sum())
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob(f".{PARQUET_NAME}.parts.*"):  # what a killed build left
        if old.is_dir() and not artifacts.folder_in_use(old):
            shutil.rmtree(old, ignore_errors=True)
    parts_dir = Path(tempfile.mkdtemp(prefix=f".{PARQUET_NAME}.parts.", dir=out_dir))
    hold = artifacts.hold_folder(parts_dir)
    parts, reports, pairs = [], [], []
    try:
        for i, ids in enumerate(chunks):
            built = build_routing_dataset(
                pq.read_table(trajectories, filters=[("session_id", "in", list(ids))]).to_pandas(), table,
                catalogue, config, _read_sessions(routing_decisions, ids), _read_sessions(token_usage, ids),
                price_source=price_source, empty_ok=True)
            reports.append(built.report)
            if built.frame is None:
                continue
            pairs += list(built.frame[["role", "model"]].drop_duplicates().itertuples(index=False, name=None))
            part = parts_dir / f"part-{i:05d}.parquet"
            pq.write_table(pa.Table.from_pandas(built.frame, preserve_index=False), part)
            parts.append(part)
        if not parts:  # nothing routable anywhere: the one-piece build says why
            build_routing_dataset(pq.read_table(trajectories).to_pandas(), table, catalogue, config,
                                  price_source=price_source)
        space = ActionSpace.build(table, pairs, catalogue)
        files = _write_parts(parts, space, out_dir, config.reward)
    finally:
        artifacts.release_folder(hold)
        shutil.rmtree(parts_dir, ignore_errors=True)
    return files, space, _merge_reports(reports, orphan_tu)


def _write_parts(parts: list[Path], space: ActionSpace, out_dir: Path, reward: RewardSpec) -> DatasetFiles:
    """The chunks' part files as the dataset's Parquet and JSON-lines files, one part in
    memory at a time: ``action_index`` from the whole dataset's action space, and one schema
    (a column that is null in one part and typed in another takes the type)."""
    schema = pa.unify_schemas([pq.read_schema(p) for p in parts], promote_options="permissive")
    schema = schema.with_metadata(pq.read_schema(parts[0]).metadata)
    index = {m: i for i, m in enumerate(space.actions)}

    def tables():
        for p in parts:
            t = pq.read_table(p)
            ai = pa.array(t.column("model").to_pandas().map(index).to_numpy(dtype=np.int64))
            t = t.set_column(t.schema.get_field_index("action_index"), "action_index", ai)
            yield t.cast(schema)

    return write_routing_dataset_tables(tables(), schema, out_dir, reward)


def read_reward_spec(path: str | Path) -> RewardSpec | None:
    """The reward spec recorded in a routing dataset's Parquet metadata, if any."""
    meta = pq.read_schema(path).metadata or {}
    raw = meta.get(b"sage.reward_spec")
    return RewardSpec(**json.loads(raw)) if raw else None


def read_routing_dataset(path: str | Path, columns: list[str] | tuple[str, ...] | None = None) -> pd.DataFrame:
    """The dataset as a frame; ``columns`` reads only those (what a learner needs: on large
    logs the provenance columns, e.g. ``source_file`` and ``timestamp``, are most of the memory)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"routing dataset {path} not found: materialize routing_dataset first")
    if columns is not None:
        missing = sorted(set(columns) - set(pq.read_schema(path).names))
        if missing:
            raise ValueError(f"routing dataset {path} lacks columns {missing}: rematerialize routing_dataset")
        columns = list(dict.fromkeys(columns))
    return pq.read_table(path, columns=columns).to_pandas()
