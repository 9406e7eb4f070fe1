"""Names and versions shared by the log ingest, the routing dataset and its checks."""

from __future__ import annotations

from sage_pipeline.sage.table import ROLES

ROLE_INDEX = {r: i for i, r in enumerate(ROLES)}

TRAJECTORY_STEP = "TRAJECTORY_STEP"
SCHEMA_VERSION = 1

# SAGE clamps every step reward to this interval.
REWARD_MIN, REWARD_MAX = -2.0, 2.0

DATA_SOURCES = ("real", "synthetic")
SPLITS = ("train", "eval")

# Columns of trajectories.parquet (one row per accepted TRAJECTORY_STEP event), in file order.
# Nullable: trace_id, step, prompt_strategy_key, propensity and every state field (SAGE logs
# no step and no propensity; the routing dataset derives or joins what is missing).
TRAJECTORY_COLUMNS: tuple[str, ...] = (
    "timestamp",  # as logged
    "timestamp_utc",  # parsed ISO 8601, as a UTC instant (naive timestamps are UTC)
    "session_id",  # as logged, else the journal file's stem (SAGE's exporter's rule)
    "session_id_source",  # logged or file_stem
    "trace_id",
    "task_id",
    "role",  # the event's agent
    "step",
    "model",  # action.model_chosen; null where SAGE logged "" (task.model_used never set: kept as an outcome)
    "prompt_strategy_key",  # action.prompt_strategy_key
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
    "logged_reward",  # reward
    "terminal",
    "verdict",  # the reviewer's PASS/FAIL (SAGE spreads the step's extra into the event)
    "debug_retry",  # the debugger's step: state.debug_retry (the retry it works on)
    "debug_status",  # the debugger's step: state.debug_status (patch_ready, error, ...)
    "data_source",  # synthetic when extra.synthetic is true, else real
    "source_file",
    "source_line",
)

# SAGE event types the ingest keeps beside the steps, for the routing dataset's joins.
MODEL_ROUTING_DECISION = "MODEL_ROUTING_DECISION"
TOKEN_USAGE = "TOKEN_USAGE"

# Columns of routing_decisions.parquet (one row per usable MODEL_ROUTING_DECISION event).
ROUTING_DECISION_COLUMNS: tuple[str, ...] = (
    "source_file",
    "source_line",
    "session_id",  # as logged, else the journal file's stem
    "trace_id",
    "timestamp_utc",
    "agent_role",
    "task_complexity_score",
    "primary_failure_count",
    "primary_model",
    "fallback_model",
    "selected_model",
    "matched_fallback_triggers",  # list of strings
    "policy_source",  # yaml or learned, as logged
    "propensity",  # extension: the selected model's probability (this project's router)
)

# Columns of token_usage.parquet (one row per usable TOKEN_USAGE event).
TOKEN_USAGE_COLUMNS: tuple[str, ...] = (
    "source_file",
    "source_line",
    "session_id",  # as logged, else the journal file's stem
    "trace_id",
    "timestamp_utc",
    "agent",
    "model",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
)

# Columns of routing_v1.parquet (one row per routing decision), with their meaning.
DATASET_COLUMNS: dict[str, str] = {
    "decision_id": "stable id: <episode_id>/<step>",
    "episode_id": "stable id of the task's episode: <session_id>/<task_id>, or <session_id>/<task_id>#<n> for the "
                  "n-th later episode of a task id seen again after its episode ended (a journal without session "
                  "ids holds every run of its day)",
    "session_id": "SAGE session id",
    "task_id": "SAGE task id",
    "step": "index of the decision within its episode (0-based)",
    "step_source": "logged, or derived (SAGE logs no step: ordered by timestamp, then file and line)",
    "role": "agent role the decision routed",
    "model": "model chosen (the logged action; for SAGE's coder, the reviewer step's model_chosen, task.model_used)",
    "action_index": "index of the model in the action space's ordered action tuple (action_space.json)",
    "table_model": "model the static YAML table would choose in this state",
    "fallback_triggered": "whether a fallback trigger of the static table fired in this state",
    "action_kind": "primary or fallback: the table's choice was followed (and which it was); "
                   "explore: the logged model differs from the table's choice",
    "propensity": "behaviour policy's probability of the logged action; null if not logged",
    "propensity_source": "logged (on the step), logged_routing_decision (a learned MODEL_ROUTING_DECISION's "
                         "propensity), or missing",
    "policy_source": "yaml or learned, from the joined MODEL_ROUTING_DECISION; ucb_bandit for SAGE's coder (its UCB "
                     "bandit chose the strategy key inside the YAML's allowed set; no MODEL_ROUTING_DECISION); null "
                     "when none was logged",
    "matched_fallback_triggers": "JSON list of the triggers SAGE logged as fired (null when no routing decision)",
    "task_complexity_score": "task complexity in [0, 1]",
    "primary_failure_count": "failures of the role's primary model so far in the episode",
    "failure_count": "failures so far in the episode",
    "prompt_tokens": "prompt size in tokens (the step's state, else the decision's TOKEN_USAGE; null if neither)",
    "completion_tokens": "completion tokens from the decision's TOKEN_USAGE events (null if none)",
    "verification_passed": "whether the attempt passed verification (null if not logged)",
    "timed_out": "whether the attempt timed out",
    "reviewer_score": "reviewer score in [0, 1] (null if not logged)",
    "cost_usd": "cost of the call in USD (from the log, else the catalogue's price; null if unknown: SAGE's local "
                "Ollama models have no price, their cost is prompt/completion tokens and latency_s)",
    "cost_source": "logged, catalogue or unknown",
    "latency_s": "seconds of the decision's model calls: the step's state, else, for SAGE's journals, each of the "
                 "decision's TOKEN_USAGE lines' timestamp minus the previous kept line's of its session (null if "
                 "none)",
    "logged_reward": "reward of the decision's outcome step as logged by SAGE (for `sage run`: the reviewer's "
                     "review.score, 0 for the debugger's and the circuit breaker's steps)",
    "reward": "reward under reward_version (reward_v1: the logged reward, or for SAGE's `sage run` journals "
              "SAGE's rl/reward.py composite_reward of the outcome)",
    "reward_version": "reward function that produced `reward`",
    "schema_version": "version of this table's schema",
    "terminal": "whether the decision ended its episode",
    "episode_complete": "episode steps are 0..n-1 with a single terminal last step",
    "split": "train or eval, by a stable hash of the session id",
    "data_source": "real or synthetic",
    "failed_reason": "why the outcome failed: timeout / retry_limit (SAGE's circuit breaker), debugger_<status> "
                     "(no patch), verification_failed; null otherwise",
    "decision_source": "how the decision was read: trajectory_step (a step of the deciding agent), reviewer_step "
                       "(SAGE's coder: the reviewer step's model and strategy key) or routing_decision (the "
                       "agent's MODEL_ROUTING_DECISION, e.g. SAGE's debugger)",
    "provenance": "JSON of the journal lines (file name:line) that made the row: decision, outcome steps, "
                  "token_usage; null for a trajectory_step row (source_file/source_line is the step)",
    "timestamp": "event timestamp as logged",
    "source_file": "log file the event came from (SAGE's coder: the reviewer step; MRD-read decisions: the MRD)",
    "source_line": "1-based line number in source_file",
}
