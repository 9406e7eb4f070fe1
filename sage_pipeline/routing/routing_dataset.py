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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sage_pipeline import artifacts
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.reward import RewardSpec, apply_version
from sage_pipeline.routing.schema import DATASET_COLUMNS, SCHEMA_VERSION
from sage_pipeline.routing.table import RoutingTable

PARQUET_NAME = f"routing_v{SCHEMA_VERSION}.parquet"
JSONL_NAME = f"routing_v{SCHEMA_VERSION}.jsonl"


@dataclass(frozen=True)
class DatasetConfig:
    reward: RewardSpec = RewardSpec()
    eval_fraction: float = 0.2
    split_salt: str = "sage-routing"

    def __post_init__(self) -> None:
        if not 0.0 < self.eval_fraction < 1.0:
            raise ValueError(f"eval_fraction must be in (0, 1), got {self.eval_fraction}")


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
    frame: pd.DataFrame  # one row per decision, DATASET_COLUMNS
    space: ActionSpace  # the multi-model action space of the frame (its action_index order)
    report: BuildReport


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
                          price_source: str = "the model catalogue") -> BuiltDataset:
    """Turn validated trajectory rows into the routing dataset (pure, no I/O).

    Joins (each documented in docs/architecture.md): ``routing_decisions`` gives each
    decision the table's primary/fallback as SAGE logged them, the matched triggers,
    ``policy_source`` and, for a ``learned`` decision that logged it, its propensity, and
    fills a missing complexity or primary-failure count; ``token_usage`` gives prompt
    tokens (and cost, when logged) where the step's state has none. Steps SAGE did not log
    are derived (timestamp, file, line). Returns the dataset, the action space it uses
    (roles from ``table``, models from the table and the logs) and what was derived.
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
    out_dir = Path(out_dir)
    parquet, jsonl = out_dir / PARQUET_NAME, out_dir / JSONL_NAME
    table = pa.Table.from_pandas(df, preserve_index=False)
    table = table.replace_schema_metadata({**(table.schema.metadata or {}),
                                           b"sage.schema_version": str(SCHEMA_VERSION).encode(),
                                           b"sage.reward_version": str(df["reward_version"].iat[0]).encode(),
                                           **({b"sage.reward_spec": json.dumps(asdict(reward)).encode()}
                                              if reward is not None else {})})
    with artifacts.atomic_path(parquet) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    enc = msgspec.json.Encoder()  # NaN and missing values are written as null
    with artifacts.atomic_open(jsonl, "wb") as fh:
        for batch in table.to_batches(max_chunksize=50_000):
            fh.write(enc.encode_lines(batch.to_pylist()))
    return DatasetFiles(parquet, jsonl, artifacts.file_sha256(parquet))


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
