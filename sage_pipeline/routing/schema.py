"""Names and versions shared by the log ingest, the routing dataset and its checks."""

from __future__ import annotations

ROLES: tuple[str, ...] = (
    "planner",
    "architect",
    "coder",
    "debugger",
    "reviewer",
    "test_engineer",
    "documentation",
    "memory_optimizer",
)
ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}

TRAJECTORY_STEP = "TRAJECTORY_STEP"
SCHEMA_VERSION = 1

# SAGE clamps every step reward to this interval.
REWARD_MIN, REWARD_MAX = -2.0, 2.0

DATA_SOURCES = ("real", "synthetic")
SPLITS = ("train", "eval")

# Columns of trajectories.parquet (one row per accepted TRAJECTORY_STEP event).
TRAJECTORY_COLUMNS: tuple[str, ...] = (
    "timestamp",
    "session_id",
    "task_id",
    "role",
    "step",
    "model",
    "propensity",
    "task_complexity_score",
    "primary_failure_count",
    "failure_count",
    "prompt_tokens",
    "verification_passed",
    "failed_reason",
    "timed_out",
    "reviewer_score",
    "latency_s",
    "cost_usd",
    "logged_reward",
    "terminal",
    "data_source",
    "source_file",
    "source_line",
)

# Columns of routing_v1.parquet (one row per routing decision), with their meaning.
DATASET_COLUMNS: dict[str, str] = {
    "decision_id": "stable id: <session_id>/<task_id>/<step>",
    "episode_id": "stable id of the task's episode: <session_id>/<task_id>",
    "session_id": "SAGE session id",
    "task_id": "SAGE task id",
    "step": "index of the decision within its episode (0-based)",
    "role": "agent role the decision routed",
    "model": "model chosen (the logged action)",
    "action_index": "index of the model in the catalogue's ordered action tuple",
    "table_model": "model the static YAML table would choose in this state",
    "fallback_triggered": "whether a fallback trigger of the static table fired in this state",
    "action_kind": "primary or fallback: the table's choice was followed (and which it was); "
                   "explore: the logged model differs from the table's choice",
    "propensity": "behaviour policy's probability of the logged action; null if not logged",
    "propensity_source": "logged or missing",
    "task_complexity_score": "task complexity in [0, 1]",
    "primary_failure_count": "failures of the role's primary model so far in the episode",
    "failure_count": "failures so far in the episode",
    "prompt_tokens": "prompt size in tokens (null if not logged)",
    "verification_passed": "whether the attempt passed verification (null if not logged)",
    "timed_out": "whether the attempt timed out",
    "reviewer_score": "reviewer score in [0, 1] (null if not logged)",
    "cost_usd": "cost of the call in USD (from the log, else the catalogue)",
    "cost_source": "logged or catalogue",
    "latency_s": "latency of the call in seconds (null if not logged)",
    "logged_reward": "reward as logged by SAGE",
    "reward": "reward under reward_version",
    "reward_version": "reward function that produced `reward`",
    "schema_version": "version of this table's schema",
    "terminal": "whether the decision ended its episode",
    "episode_complete": "episode steps are 0..n-1 with a single terminal last step",
    "split": "train or eval, by a stable hash of the session id",
    "data_source": "real or synthetic",
    "timestamp": "event timestamp as logged",
    "source_file": "log file the event came from",
    "source_line": "1-based line number in source_file",
}
