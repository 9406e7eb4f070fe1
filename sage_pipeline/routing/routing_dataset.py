"""The routing dataset: one row per routing decision, versioned, split by session.

Built from ``trajectories.parquet`` (validated TRAJECTORY_STEP events). Adds what the
learners and the evaluation need: the episode, the action index in the catalogue's
order, what the static table would have chosen, the reward under the configured
version, and a train/eval split by a stable hash of the session id (no session is in
both). Written as ``routing_v1.parquet`` and as ``routing_v1.jsonl`` for SAGE's tooling.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from sage_pipeline import artifacts
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.reward import RewardSpec, apply_version
from sage_pipeline.routing.schema import DATASET_COLUMNS, ROLE_INDEX, SCHEMA_VERSION
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


def _episode_complete(df: pd.DataFrame) -> np.ndarray:
    """Per row: its episode has steps 0..n-1 and exactly one terminal step, the last."""
    g = df.groupby("episode_id", sort=False)
    n = g["step"].transform("size")
    ok = (g["step"].transform("min") == 0) & (g["step"].transform("max") == n - 1) \
        & (g["step"].transform("nunique") == n)
    term = df["terminal"].astype(bool)
    ok &= g["terminal"].transform("sum") == 1
    last = df["step"] == g["step"].transform("max")
    ok &= (term == last).groupby(df["episode_id"], sort=False).transform("all")
    return ok.to_numpy()


def build_routing_dataset(trajectories: pd.DataFrame, catalogue: ModelCatalogue, table: RoutingTable,
                          config: DatasetConfig = DatasetConfig()) -> pd.DataFrame:
    """Turn validated trajectory rows into the routing dataset (pure, no I/O)."""
    if trajectories.empty:
        raise ValueError("no trajectory rows to build the routing dataset from: the trajectories asset "
                         "accepted nothing (see its quarantine.jsonl and metadata)")
    df = trajectories.sort_values(["session_id", "task_id", "step"], kind="stable").reset_index(drop=True)
    out = pd.DataFrame({
        "decision_id": df["session_id"] + "/" + df["task_id"] + "/" + df["step"].astype(str),
        "episode_id": df["session_id"] + "/" + df["task_id"],
        "session_id": df["session_id"], "task_id": df["task_id"],
        "step": df["step"].astype("int64"), "role": df["role"], "model": df["model"],
    })
    action_index = out["model"].map(catalogue.index)
    role_idx = out["role"].map(ROLE_INDEX).to_numpy(dtype=np.int64)
    out["action_index"] = action_index.astype("int64")
    # SAGE logs that lack failure_count: every earlier attempt of the episode failed
    failure_count = df["failure_count"].fillna(df["step"]).astype("int64")
    fired = table.fallback_fires(role_idx, df["task_complexity_score"].to_numpy(),
                                 df["primary_failure_count"].to_numpy(), failure_count.to_numpy())
    chosen = np.where(fired, table.fallback_index(catalogue)[role_idx], table.primary_index(catalogue)[role_idx])
    out["table_model"] = np.asarray(catalogue.actions, dtype=object)[chosen]
    out["fallback_triggered"] = fired
    followed = out["model"].to_numpy(dtype=object) == out["table_model"].to_numpy(dtype=object)
    out["action_kind"] = np.where(~followed, "explore", np.where(fired, "fallback", "primary"))
    out["propensity"] = df["propensity"].astype("float64")
    out["propensity_source"] = np.where(df["propensity"].isna(), "missing", "logged")
    out["task_complexity_score"] = df["task_complexity_score"].astype("float64")
    out["primary_failure_count"] = df["primary_failure_count"].astype("int64")
    out["failure_count"] = failure_count
    out["prompt_tokens"] = df["prompt_tokens"].astype("Int64")
    out["verification_passed"] = df["verification_passed"].astype("boolean")
    out["timed_out"] = df["timed_out"].astype("boolean").fillna(False).astype(bool)
    out["reviewer_score"] = df["reviewer_score"].astype("float64")
    # a prompt size the log does not record is assumed (ASSUMED_PROMPT_TOKENS), as in the simulator
    catalogue_cost = catalogue.cost_usd(action_index.to_numpy(dtype=np.int64),
                                        df["prompt_tokens"].astype("float64").to_numpy(na_value=np.nan))
    out["cost_usd"] = df["cost_usd"].astype("float64").fillna(pd.Series(catalogue_cost)).to_numpy()
    out["cost_source"] = np.where(df["cost_usd"].isna(), "catalogue", "logged")
    out["latency_s"] = df["latency_s"].astype("float64")
    out["logged_reward"] = df["logged_reward"].astype("float64")
    out["reward"] = apply_version(out["logged_reward"].to_numpy(), out["cost_usd"].to_numpy(), config.reward)
    out["reward_version"] = config.reward.version
    out["schema_version"] = SCHEMA_VERSION
    out["terminal"] = df["terminal"].astype(bool)
    out["episode_complete"] = _episode_complete(out)
    out["split"] = session_split(out["session_id"], config.eval_fraction, config.split_salt)
    out["data_source"] = df["data_source"]
    out["timestamp"] = df["timestamp"]
    out["source_file"] = df["source_file"]
    out["source_line"] = df["source_line"].astype("int64")
    missing = [c for c in DATASET_COLUMNS if c not in out.columns]
    assert not missing, f"routing dataset lacks documented columns {missing}"
    return out


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


def read_routing_dataset(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"routing dataset {path} not found: materialize routing_dataset first")
    return pq.read_table(path).to_pandas()
