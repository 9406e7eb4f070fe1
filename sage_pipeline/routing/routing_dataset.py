"""The routing dataset: one row per routing decision, versioned, split by session.

Built from ``trajectories.parquet`` (validated TRAJECTORY_STEP events) joined with the
``MODEL_ROUTING_DECISION`` and ``TOKEN_USAGE`` events the ingest kept beside it. SAGE's
``sage run`` journals hold no step per decision: their reviewer, debugger and circuit-breaker
steps are outcomes, and :func:`sage_workflow_decisions` reads the decisions they follow (the
coder's from the reviewer's step, the debugger's from its MODEL_ROUTING_DECISION) with their
outcomes, tokens, seconds and provenance, counting what cannot be joined (docs/architecture.md,
"Joining SAGE's journals"). Adds what
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
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sage_pipeline import artifacts
from sage_pipeline.routing import ingest
from sage_pipeline.routing.action_space import FILE_NAME as ACTION_SPACE_FILE, ActionSpace
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.reward import RewardSpec, apply_version, dataset_reward_spec, sage_composite_reward
from sage_pipeline.routing.schema import DATASET_COLUMNS, SCHEMA_VERSION
from sage_pipeline.sage.table import RoutingTable

if TYPE_CHECKING:  # task_outcomes imports this module: run_routing_dataset imports it when it runs
    from sage_pipeline.routing.task_outcomes import TaskOutcomeConfig, TaskOutcomes

PARQUET_NAME = f"routing_v{SCHEMA_VERSION}.parquet"
BUILD_REPORT_NAME = "build_report.json"  # BuildReport.to_dict(): joins, derivations and what was left out
JSONL_NAME = f"routing_v{SCHEMA_VERSION}.jsonl"


class DatasetConfig(BaseModel):
    """How the routing dataset is built from the ingested journals."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    reward: RewardSpec = Field(default_factory=RewardSpec, description="the reward every row carries (recorded in "
                               "the Parquet file's metadata)")
    eval_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="share of sessions in the eval split (by session "
                                 "hash), in (0, 1)")
    split_salt: str = Field("sage-routing", description="salt of the session hash that assigns the split")

    @field_validator("reward", mode="before")
    @classmethod
    def _reward(cls, v: Any) -> Any:
        """reward_v1/reward_v2: a plain RewardSpec (equal to the simulator's); reward_v3_tokens_seconds:
        a LocalCostRewardSpec (:func:`~sage_pipeline.routing.reward.dataset_reward_spec`)."""
        if cls.model_fields["reward"].annotation is not RewardSpec:  # a subclass's own section (the asset's config)
            return v
        return dataset_reward_spec(v) if isinstance(v, dict | BaseModel) else v


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


# ---------------------------------------------------------------- SAGE's `sage run` journals
# In `sage run`, TRAJECTORY_STEP comes only from the reviewer, the debugger and the orchestrator
# (orchestrator/workflow.py: verification_gate, debug_agent, circuit_breaker). None of them is
# the routing decision it follows; the decisions are read as follows (docs/architecture.md,
# "Joining SAGE's journals"):
# * the assigned agent's: the reviewer's step names the task's model (action.model_chosen =
#   task.model_used) and, for the coder, the UCB bandit's strategy key (agents/coder.py: the
#   coder never calls ModelRouter.select, so it logs no MODEL_ROUTING_DECISION); another
#   assigned agent (documentation, test_engineer) is its MODEL_ROUTING_DECISION of that model;
# * the debugger's: its MODEL_ROUTING_DECISION (agents/debugger.py select("debugger", c,
#   next_retry)), matched to the debugger's step that follows by complexity and retry;
# * outcomes: the next reviewer verdict of the task (PASS terminal, FAIL not), the debugger's
#   debug_status (no patch: the task goes back to its agent) and the circuit breaker
#   (failed_reason timeout / retry_limit, terminal).
ASSIGNED_ROLES = frozenset({"coder", "documentation", "test_engineer", "architect", "memory_optimizer"})
UNUSED_MRD_REASONS = {
    "planner": "planner: route_model/PlannerAgent choose the planner's model; no step of `sage run` is its outcome",
    "reviewer": "reviewer: its verdict is the assigned agent's outcome; no step credits the reviewer's own model",
    "debugger": "debugger: no debugger step of the same complexity and retry followed it in the session",
    "shell_router": "shell_router: the interactive shell's routing; no task, no outcome",
    "shell_chat": "shell_chat: the interactive shell's chat; no task, no outcome",
}
UNUSED_MRD_DEFAULT = "no reviewer step of its model, complexity and failure count followed it in the session"
_NO_AGENT = ("reviewer step whose assigned agent is unknown: no coder strategy key and no MODEL_ROUTING_DECISION "
             "of an assigned role with its model, complexity and failure count")
_NO_MODEL = "reviewer step without the assigned agent's model (model_chosen empty)"
_NO_DEBUG_MRD = "debugger step without its MODEL_ROUTING_DECISION (the debugger's model is unknown)"
_TIMEOUT = ("assigned agent's call timed out before SAGE recorded its model (circuit breaker 'timeout' with the "
            "task's new attempt unlogged)")
_DANGLING = "debugger decision with no later verdict or circuit breaker (the journal ends)"


def is_workflow_step(steps: pd.DataFrame) -> np.ndarray:
    """Steps SAGE's workflow writes as outcomes: the orchestrator's, a reviewer step with a
    verdict, a debugger step with debug_status or debug_retry. Every other step (SAGE's
    collect_synth, the project's collector) is the decision of its own agent."""
    none = pd.Series(False, index=steps.index)
    role = steps["role"].astype(str)
    verdict = steps["verdict"].notna() if "verdict" in steps else none
    dbg = (steps["debug_status"].notna() | steps["debug_retry"].notna()) if "debug_status" in steps else none
    return ((role == "orchestrator") | ((role == "reviewer") & verdict) | ((role == "debugger") & dbg)).to_numpy()


def file_rank(files: pd.Series) -> pd.Series:
    """Each journal file's place in SAGE's writing order (:func:`ingest.journal_order`: a day's
    rotated parts by number, then the part still written)."""
    codes, uniq = pd.factorize(files, sort=False)
    order = sorted(range(len(uniq)), key=lambda i: ingest.journal_order(str(uniq[i])))
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[order] = np.arange(len(uniq))
    return pd.Series(rank[codes], index=files.index)


def _ref(row) -> str:
    return f"{Path(row.source_file).name}:{int(row.source_line)}"


def _same(a, b) -> bool:
    return a is not None and b is not None and abs(float(a) - float(b)) < 1e-9


class _Decision:
    def __init__(self, role: str, model: str, row, source: str, base: dict, mrd=None, tus=None,
                 c=None, fc=None, strategy=None) -> None:
        self.role, self.model, self.row, self.source, self.mrd = role, model, row, source, mrd
        self.tus = list(tus or [])
        self.c, self.fc, self.strategy = c, fc, strategy
        self.task_id, self.episode, self.session, self.data_source = (base["task_id"], base["episode"],
                                                                       base["session"], base["data_source"])
        self.outcome: str | None = None  # verdict, no_patch or circuit_breaker
        self.outcome_refs: list[str] = []
        self.verdict_passed: bool | None = None
        self.reward = 0.0
        self.terminal = False
        self.failed_reason: str | None = None
        self.dropped_episode = False


class _Task:
    def __init__(self, episode: int = 0) -> None:
        self.episode, self.decisions, self.author_open = episode, [], True
        self.pending: _Decision | None = None
        self.ended = self.dropped = False


def _take_mrd(open_mrds: list[dict], roles, model, c, fc) -> dict | None:
    """The latest open MODEL_ROUTING_DECISION of one of ``roles`` (and ``model`` when given) with
    this complexity and failure count; it is taken (one decision, one outcome)."""
    for m in reversed(open_mrds):
        r = m["row"]
        if r.agent_role in roles and (model is None or r.selected_model == model) \
                and _same(r.task_complexity_score, c) and (fc is None or _same(r.primary_failure_count, fc)):
            open_mrds.remove(m)
            return m
    return None


def _from_mrd(m: dict, base: dict, used: set) -> _Decision:
    r = m["row"]
    used.add((str(r.source_file), int(r.source_line)))
    return _Decision(r.agent_role, r.selected_model, r, "routing_decision", base, mrd=r, tus=m["tus"],
                     c=r.task_complexity_score, fc=r.primary_failure_count)


def _set_verdict(d: _Decision, r) -> None:
    d.outcome, d.reward = "verdict", float(r.logged_reward or 0.0)
    d.verdict_passed = str(r.verdict).upper() == "PASS"
    d.outcome_refs.append(_ref(r))


def sage_workflow_decisions(steps: pd.DataFrame, mrd: pd.DataFrame | None,
                            tu: pd.DataFrame | None) -> tuple[pd.DataFrame | None, dict]:
    """The routing decisions of SAGE's ``sage run`` journals with their outcomes (pure).

    ``steps``: the workflow steps (:func:`is_workflow_step`) of some sessions; ``mrd``, ``tu``:
    the MODEL_ROUTING_DECISION and TOKEN_USAGE rows of the same sessions. Each session is read
    in SAGE's writing order (timestamp, then journal file in rotation order, then line). Returns
    one row per decision with an outcome, in :func:`build_routing_dataset`'s joined shape with
    ``provenance`` (the lines that made the row), and what could not be joined, by reason.
    """
    frames = []
    for kind, df in (("S", steps), ("M", mrd), ("U", tu)):
        if df is not None and not df.empty:
            frames.append(df.assign(ev_kind=kind))
    ev = pd.concat(frames, ignore_index=True, sort=False)
    ts = pd.to_datetime(ev["timestamp_utc"], utc=True)
    ev["ev_ts"] = ((ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "us")).astype("int64")  # microseconds
    ev["ev_rank"] = file_rank(ev["source_file"])
    ev = ev.sort_values(["session_id", "ev_ts", "ev_rank", "source_line"], kind="stable")
    for col in ("agent_role", "selected_model", "verdict", "debug_status", "debug_retry", "failed_reason",
                "prompt_strategy_key", "prompt_tokens", "completion_tokens", "cost_usd", "task_id", "role", "model",
                "task_complexity_score", "primary_failure_count", "logged_reward", "terminal", "data_source"):
        if col not in ev:
            ev[col] = None
    ev = ev.astype(object).where(ev.notna(), None)
    out: list[_Decision] = []
    all_tasks: list[_Task] = []
    unjoined: Counter = Counter()
    used: set[tuple[str, int]] = set()
    notes: Counter = Counter()  # outcomes read that start no decision of their own, token usage by owner
    claimed: list[dict] = []  # every MRD with the TOKEN_USAGE it claimed
    for sid, sess in ev.groupby("session_id", sort=False):
        tasks: dict[str, _Task] = {}
        open_mrds: list[dict] = []  # MODEL_ROUTING_DECISIONs since the session's last step
        loose: list[dict] = []  # TOKEN_USAGE since the last step that no open MRD claimed
        prev_ts = None
        for r in sess.itertuples(index=False):
            if r.ev_kind == "M":
                open_mrds.append({"row": r, "tus": []})
                claimed.append(open_mrds[-1])
            elif r.ev_kind == "U":
                rec = {"row": r, "s": (r.ev_ts - prev_ts) / 1e6 if prev_ts is not None else None}
                # each agent calls select once, then chat once: the latest open MRD of this model without a call
                owner = next((m for m in reversed(open_mrds) if m["row"].selected_model == r.model and not m["tus"]),
                             None)
                (owner["tus"] if owner is not None else loose).append(rec)
            else:
                _step(r, sid, tasks, all_tasks, open_mrds, loose, used, unjoined, notes, out)
                open_mrds, loose = [], []  # an agent's select, chat and step come in that order
            prev_ts = r.ev_ts
        for t in tasks.values():
            if t.pending is not None:
                unjoined[_DANGLING] += 1
                t.decisions.remove(t.pending)
                out.remove(t.pending)
                t.pending, t.dropped = None, True
    for t in all_tasks:
        for d in t.decisions:
            d.dropped_episode = t.dropped
    unused: Counter = Counter()
    claimed_unused = sum(len(m["tus"]) for m in claimed
                         if (str(m["row"].source_file), int(m["row"].source_line)) not in used)
    if mrd is not None and not mrd.empty:
        for role, f, ln in zip(mrd["agent_role"].astype(str), mrd["source_file"].astype(str),
                               mrd["source_line"].astype("int64")):
            if (f, int(ln)) not in used:
                unused[UNUSED_MRD_REASONS.get(role, f"{role}: {UNUSED_MRD_DEFAULT}")] += 1
    attributed = sum(len(d.tus) for d in out)
    n_tu = 0 if tu is None else len(tu)
    notes["TOKEN_USAGE of a decision with a row"] += attributed
    notes["TOKEN_USAGE of a MODEL_ROUTING_DECISION without a row (its own call: planner, reviewer, ...)"] += \
        claimed_unused
    report = {"decisions": len(out), "by_role": dict(Counter(d.role for d in out)),
              "by_source": dict(Counter(d.source for d in out)), "not_joined": dict(unjoined),
              "routing_decisions_unused": dict(unused), "token_usage_attributed": attributed,
              "token_usage_unattributed": n_tu - attributed - claimed_unused,
              "notes": {k: v for k, v in notes.items() if v}}
    return _decision_frame(out), report


def _step(r, sid, tasks: dict, all_tasks: list, open_mrds: list, loose: list, used: set, unjoined: Counter,
          notes: Counter, out: list) -> None:
    """One workflow step of session ``sid``: a decision revealed, an outcome, or both."""
    t = tasks.get(r.task_id)
    if t is None or t.ended:  # a task id seen again after its episode ended: a new episode
        t = tasks[r.task_id] = _Task(0 if t is None else t.episode + 1)
        all_tasks.append(t)
    base = {"task_id": r.task_id, "episode": t.episode, "session": sid, "data_source": r.data_source}
    if r.role == "reviewer":
        if t.pending is not None:  # the debugger's patch was verified: the verdict is its outcome
            _set_verdict(t.pending, r)
            t.pending = None
        elif t.author_open:
            t.author_open = False
            d = _author_decision(r, open_mrds, loose, base, used, unjoined)
            if d is None:
                t.dropped = True
            else:
                _set_verdict(d, r)
                t.decisions.append(d)
                out.append(d)
        elif t.decisions:  # a further verdict with no decision in between (e.g. a fix pattern applied)
            t.decisions[-1].outcome_refs.append(_ref(r))
            notes["reviewer verdict with no new decision since the last (added to the last decision's provenance)"] += 1
        if bool(r.terminal):
            t.ended = True
            if t.decisions:
                t.decisions[-1].terminal = True
    elif r.role == "debugger":
        status = str(r.debug_status or "")
        if t.pending is not None:  # the last patch failed verification without a reviewer step
            # (verification_gate: the verify command failed, "Verification failed (rc=...)", logs no step)
            t.pending.outcome, t.pending.verdict_passed, t.pending.reward = "failed_unreviewed", False, 0.0
            t.pending = None
        m = _take_mrd(open_mrds, ("debugger",), None, r.task_complexity_score, r.debug_retry)
        if m is None:
            unjoined[_NO_DEBUG_MRD] += 1
            t.dropped = True
        else:
            d = _from_mrd(m, base, used)
            d.outcome_refs.append(_ref(r))
            if status == "patch_ready":
                t.pending = d  # its outcome is the next verdict of the task (or the circuit breaker)
            else:  # no patch: the task goes back to its agent (debug_agent sets it pending)
                d.outcome, d.reward, d.verdict_passed = "no_patch", float(r.logged_reward or 0.0), None
                d.failed_reason = f"debugger_{status or 'no_patch'}"
            t.decisions.append(d)
            out.append(d)
        t.author_open = status != "patch_ready"
    else:  # the orchestrator's circuit breaker: the task failed
        reason = str(r.failed_reason or "")
        if t.pending is not None:  # the patch never reached verification
            t.pending.outcome, t.pending.verdict_passed = "circuit_breaker", None
            t.pending.reward = float(r.logged_reward or 0.0)
            t.pending = None
        if t.author_open and t.decisions and "timeout" in reason:
            unjoined[_TIMEOUT] += 1
        if t.decisions:
            last = t.decisions[-1]
            last.terminal, last.failed_reason = True, reason or last.failed_reason
            last.outcome_refs.append(_ref(r))
        else:
            unjoined[f"circuit breaker ({reason or 'no reason'}) of a task with no observed decision: the assigned "
                     "agent's model was never recorded"] += 1
        t.ended = True


def _author_decision(r, open_mrds: list, loose: list, base: dict, used: set, unjoined: Counter) -> _Decision | None:
    """The assigned agent's decision a reviewer verdict reveals, or None (counted)."""
    if r.model is None:
        unjoined[_NO_MODEL] += 1
        return None
    key = str(r.prompt_strategy_key or "")
    if key.startswith("coder:"):  # the coder's UCB bandit (agents/coder.py): no MODEL_ROUTING_DECISION
        # CoderAgent.run calls chat once: its call is the latest one of its model that no MRD claimed
        tus = [u for u in loose if u["row"].model == r.model][-1:]
        for u in tus:
            loose.remove(u)
        return _Decision("coder", r.model, r, "reviewer_step", base, tus=tus, c=r.task_complexity_score,
                         fc=r.primary_failure_count, strategy=key)
    m = _take_mrd(open_mrds, ASSIGNED_ROLES, r.model, r.task_complexity_score, r.primary_failure_count)
    if m is None:
        unjoined[_NO_AGENT] += 1
        return None
    d = _from_mrd(m, base, used)
    d.strategy = key or None
    return d


def _decision_frame(ds: list[_Decision]) -> pd.DataFrame | None:
    """Decisions as rows of :func:`build_routing_dataset`'s joined frame."""
    if not ds:
        return None

    def tok(d, k):
        v = [getattr(u["row"], k) for u in d.tus if getattr(u["row"], k) is not None]
        return float(sum(v)) if v else np.nan

    def secs(d):
        v = [u["s"] for u in d.tus if u["s"] is not None]
        return float(sum(v)) if v else np.nan

    rows = []
    for d in ds:
        r, m = d.row, d.mrd
        prov = {"decision": _ref(r), "decision_source": d.source, "outcome": d.outcome_refs,
                "token_usage": [_ref(u["row"]) for u in d.tus]}
        rows.append({
            "role": d.role, "model": d.model, "session_id": d.session, "task_id": d.task_id,
            "episode_key": d.task_id if d.episode == 0 else f"{d.task_id}#{d.episode}",
            "step": None, "timestamp": r.timestamp, "timestamp_utc": r.timestamp_utc,
            "source_file": r.source_file, "source_line": int(r.source_line),
            "task_complexity_score": d.c, "primary_failure_count": d.fc, "failure_count": d.fc,
            "prompt_tokens": np.nan, "verification_passed": d.verdict_passed,
            "timed_out": d.terminal and "timeout" in str(d.failed_reason or ""),
            "reviewer_score": d.reward if d.outcome == "verdict" else np.nan, "latency_s": secs(d),
            "cost_usd": np.nan, "logged_reward": d.reward, "terminal": d.terminal, "propensity": np.nan,
            "data_source": d.data_source or "real", "failed_reason": d.failed_reason,
            "prompt_strategy_key": d.strategy, "decision_source": d.source, "provenance": json.dumps(prov),
            "episode_dropped": d.dropped_episode, "outcome": d.outcome,
            "mrd_line": None if m is None else int(m.source_line),
            "mrd_primary": None if m is None else m.primary_model,
            "mrd_fallback": None if m is None else m.fallback_model,
            "mrd_triggers": None if m is None or m.matched_fallback_triggers is None
            else json.dumps(list(m.matched_fallback_triggers)),
            "mrd_policy_source": "ucb_bandit" if d.source == "reviewer_step"
            else (None if m is None else m.policy_source),
            "mrd_propensity": None if m is None else m.propensity,
            "mrd_task_complexity_score": d.c, "mrd_primary_failure_count": d.fc,
            "tu_prompt_tokens": tok(d, "prompt_tokens"), "tu_completion_tokens": tok(d, "completion_tokens"),
            "tu_cost_usd": tok(d, "cost_usd"),
        })
    return pd.DataFrame(rows)


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
    # SAGE's `sage run` journals (sage_workflow_decisions): what was read and what could not be joined
    decisions_by_source: dict[str, int] = field(default_factory=dict)  # trajectory_step, reviewer_step, ...
    not_joined: dict[str, int] = field(default_factory=dict)  # reason -> decisions (or steps) left out
    routing_decisions_unused: dict[str, int] = field(default_factory=dict)  # reason -> MRDs no row is made of
    steps_without_model: dict[str, int] = field(default_factory=dict)  # role -> decision steps with model ""
    notes: dict[str, int] = field(default_factory=dict)
    roles_logged: list[str] = field(default_factory=list)  # roles any step or MRD of the logs names
    propensity_unknown: dict[str, int] = field(default_factory=dict)  # why a decision has no propensity -> count
    # reconstructed propensities by where they come from: 'yaml' or the deployed checkpoint's sha256
    propensity_from: dict[str, int] = field(default_factory=dict)

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
        models_without_price=sorted({m for r in reports for m in r.models_without_price}),
        decisions_by_source=add([r.decisions_by_source for r in reports]),
        not_joined=add([r.not_joined for r in reports]),
        propensity_unknown=add([r.propensity_unknown for r in reports]),
        propensity_from=add([r.propensity_from for r in reports]),
        routing_decisions_unused=add([r.routing_decisions_unused for r in reports]),
        steps_without_model=add([r.steps_without_model for r in reports]),
        notes=add([r.notes for r in reports]),
        roles_logged=sorted({x for r in reports for x in r.roles_logged}))


def _join_routing_decisions(df: pd.DataFrame, mrd: pd.DataFrame | None) -> pd.DataFrame:
    """Each decision's MODEL_ROUTING_DECISION: the latest one before it in the same session (in
    SAGE's writing order: journal file in rotation order, then line), for the same role and the
    selected model; one routing decision serves one step."""
    cols = ("mrd_line", "mrd_primary", "mrd_fallback", "mrd_triggers", "mrd_policy_source",
            "mrd_propensity", "mrd_task_complexity_score", "mrd_primary_failure_count")
    if mrd is None or mrd.empty:
        return df.assign(**{c: pd.Series([None] * len(df), index=df.index, dtype=object) for c in cols})
    right = pd.DataFrame({
        "_pos": _position(mrd), "session_id": mrd["session_id"].astype(str),
        "role": mrd["agent_role"].astype(str), "model": mrd["selected_model"].astype(str),
        "mrd_line": mrd["source_line"].astype("int64"), "mrd_primary": mrd["primary_model"],
        "mrd_fallback": mrd["fallback_model"],
        "mrd_triggers": mrd["matched_fallback_triggers"].map(
            lambda t: None if t is None else json.dumps(list(t))),
        "mrd_policy_source": mrd["policy_source"], "mrd_propensity": mrd["propensity"],
        "mrd_task_complexity_score": mrd["task_complexity_score"],
        "mrd_primary_failure_count": mrd["primary_failure_count"],
    }).sort_values("_pos", kind="stable")
    left = df[["session_id", "role", "model"]].assign(_at=_position(df)).reset_index()
    left = left.sort_values("_at", kind="stable")
    m = pd.merge_asof(left, right, left_on="_at", right_on="_pos",
                      by=["session_id", "role", "model"], direction="backward")
    # an MRD matched by several steps (a step that logged none reuses an older one): keep the first
    m = m.sort_values("_at", kind="stable")
    reused = m["_pos"].notna() & m.duplicated(["session_id", "role", "model", "_pos"])
    m.loc[reused, list(cols)] = None
    return df.join(m.set_index("index")[list(cols)])


def _join_token_usage(df: pd.DataFrame, tu: pd.DataFrame | None) -> tuple[pd.DataFrame, int]:
    """TOKEN_USAGE events summed onto the next decision of the same session (in writing order)
    that used the same model (SAGE logs a call's usage before the step it belongs to)."""
    cols = {"tu_prompt_tokens": np.nan, "tu_completion_tokens": np.nan, "tu_cost_usd": np.nan}
    if tu is None or tu.empty:
        return df.assign(**cols), 0
    left = pd.DataFrame({"session_id": tu["session_id"].astype(str),
                         "model": tu["model"].astype(str), "line": _position(tu),
                         "p": tu["prompt_tokens"].astype("float64"), "c": tu["completion_tokens"].astype("float64"),
                         "usd": tu["cost_usd"].astype("float64")}).sort_values("line", kind="stable")
    right = df[["session_id", "model"]].assign(_at=_position(df)).reset_index().sort_values(
        "_at", kind="stable").rename(columns={"index": "row"})
    m = pd.merge_asof(left, right, left_on="line", right_on="_at",
                      by=["session_id", "model"], direction="forward")
    unattributed = int(m["row"].isna().sum())
    g = m.dropna(subset=["row"]).groupby("row")
    sums = pd.DataFrame({"tu_prompt_tokens": g["p"].sum(min_count=1), "tu_completion_tokens": g["c"].sum(min_count=1),
                         "tu_cost_usd": g["usd"].sum(min_count=1)})
    sums.index = sums.index.astype(df.index.dtype)
    return df.join(sums), unattributed


_POS_LINES = 1 << 40  # lines per journal file in a writing position (file rank * this + line)


def _position(df: pd.DataFrame) -> pd.Series:
    """Each row's place in SAGE's writing order across its journal files: the file's rank
    (:func:`file_rank`: a day's rotated parts by number, then the current one), then the line."""
    return file_rank(df["source_file"]) * _POS_LINES + df["source_line"].astype("int64")


def _derive_steps(df: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """The step index of every decision, and ``logged``/``derived``: an episode whose steps are
    all logged keeps them; any other is ordered by timestamp, then journal file in writing order
    (rotated parts by number), then line."""
    ep = [df["session_id"], df["episode_key"]]
    logged = df["step"].notna().groupby(ep).transform("all")
    order = df.assign(_rank=file_rank(df["source_file"])).sort_values(
        ["session_id", "episode_key", "timestamp_utc", "_rank", "source_line"], kind="stable")
    derived = order.groupby(["session_id", "episode_key"], sort=False).cumcount().reindex(df.index)
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


def _empty_report(excluded: dict, dropped: int, tu_unattributed: int, wf: dict, no_model: dict,
                  roles_logged: list[str]) -> BuildReport:
    return BuildReport({str(k): int(v) for k, v in excluded.items()}, dropped, 0, 0, 0, tu_unattributed, {}, {}, [],
                       not_joined=wf.get("not_joined", {}),
                       routing_decisions_unused=wf.get("routing_decisions_unused", {}),
                       steps_without_model=no_model, notes=wf.get("notes", {}), roles_logged=roles_logged)


def _by_session(df: pd.DataFrame | None, sessions: set) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    """``df``'s rows of ``sessions``, and the others."""
    if df is None or df.empty:
        return None, df
    inside = df["session_id"].astype(str).isin(sessions)
    return df[inside].reset_index(drop=True), df[~inside].reset_index(drop=True)


# decisions (ROUTING_DECISION_COLUMNS) -> propensity (NaN: unknown) and propensity_note, same index
PropensityOf = Callable[[pd.DataFrame], pd.DataFrame]
BANDIT_NOTE = ("the coder's model is chosen by SAGE's UCB bandit (sage/rl/ucb_bandit.py), deterministic given a "
               "history the journal does not hold, so its probability is unknown")


def _reconstruct(df: pd.DataFrame, out: pd.DataFrame,
                 propensity_of: PropensityOf | None) -> tuple[dict[str, int], dict[str, int]]:
    """Fill ``out``'s missing propensities of decisions that have their MODEL_ROUTING_DECISION
    with ``propensity_of``; returns why the rest stay unknown (reason -> decisions) and where the
    reconstructed ones come from ('yaml' or a checkpoint's sha256 -> decisions)."""
    missing = out["propensity"].isna().to_numpy()
    bandit = missing & (df["mrd_policy_source"] == "ucb_bandit").to_numpy()
    unknown: dict[str, int] = {BANDIT_NOTE: int(bandit.sum())} if bandit.any() else {}
    sources: dict[str, int] = {}
    todo = missing & ~bandit & df["mrd_line"].notna().to_numpy()
    if propensity_of is not None and todo.any():
        rows = df.loc[todo]
        decisions = pd.DataFrame({
            "timestamp_utc": rows["timestamp_utc"], "agent_role": rows["role"],
            "task_complexity_score": rows["mrd_task_complexity_score"].astype("float64"),
            "primary_failure_count": rows["mrd_primary_failure_count"].astype("float64"),
            "primary_model": rows["mrd_primary"], "fallback_model": rows["mrd_fallback"],
            "selected_model": rows["model"], "matched_fallback_triggers": rows["mrd_triggers"],
            "policy_source": rows["mrd_policy_source"]}, index=rows.index)
        got = propensity_of(decisions)
        p = got["propensity"].astype("float64")
        known = p.notna()
        out.loc[known[known].index, "propensity"] = p[known]
        out.loc[known[known].index, "propensity_source"] = "reconstructed"
        if "propensity_checkpoint" in got:
            sources = {str(k): int(v) for k, v in got.loc[known, "propensity_checkpoint"].value_counts().items()}
        for note, n in got.loc[~known, "propensity_note"].value_counts().items():
            unknown[str(note)] = unknown.get(str(note), 0) + int(n)
    elif todo.any():
        unknown["not reconstructed (no deployments record was given)"] = int(todo.sum())
    no_mrd = int((missing & ~bandit & df["mrd_line"].isna().to_numpy()).sum())
    if no_mrd:
        unknown["no MODEL_ROUTING_DECISION to reconstruct it from"] = no_mrd
    return unknown, sources


def build_routing_dataset(trajectories: pd.DataFrame, table: RoutingTable, catalogue: ModelCatalogue | None = None,
                          config: DatasetConfig = DatasetConfig(), routing_decisions: pd.DataFrame | None = None,
                          token_usage: pd.DataFrame | None = None,
                          price_source: str = "the model catalogue", empty_ok: bool = False,
                          propensity_of: PropensityOf | None = None) -> BuiltDataset:
    """Turn validated trajectory rows into the routing dataset (pure, no I/O).

    ``propensity_of`` (the routing_dataset asset passes ``sage_explore.reconstruct_propensities``
    with the deployments record) gives a decision joined to its MODEL_ROUTING_DECISION and with
    no logged propensity the exact probability SAGE's router had of that choice, from the line
    and the checkpoint deployed then (``propensity_source = reconstructed``; 1.0 for a YAML-only
    router): a frame of :data:`~sage_pipeline.routing.schema.ROUTING_DECISION_COLUMNS` in, one of
    ``propensity`` and ``propensity_note`` on the same index out. What stays unknown is counted
    by reason in ``propensity_unknown``.

    Two kinds of steps (docs/architecture.md, "Joining SAGE's journals"):

    * SAGE's ``sage run`` workflow steps (reviewer verdicts, debugger and orchestrator steps,
      :func:`is_workflow_step`) are outcomes, not decisions: :func:`sage_workflow_decisions`
      reads the decisions they follow (the coder's from the reviewer step's model and strategy
      key, the debugger's and any other assigned agent's from their MODEL_ROUTING_DECISION)
      and joins each to its outcome, tokens and seconds; what cannot be joined is counted by
      reason. Their ``reward_v1`` is SAGE's (``rl/reward.py composite_reward``) of the outcome.
    * Every other step (SAGE's ``collect_synth``, the project's collector) is its agent's own
      decision, joined to the latest MODEL_ROUTING_DECISION of its session, role and model
      before it and to the TOKEN_USAGE of its model since the previous decision; its logged
      reward is reward_v1.

    Steps SAGE did not log are derived (timestamp, then journal file in writing order, then
    line) per episode: a task of a session, a new one when the task id starts again after its
    episode ended (journals without session ids hold every run of the day). Returns the dataset,
    the action space it uses (roles from ``table``, models from the table and the logs) and
    what was joined, derived and left out. ``empty_ok`` (a chunk of the logs, see
    :func:`build_routing_dataset_files`): no routable decision gives ``frame=None`` and what
    was left out, not an error.
    """
    if trajectories.empty:
        raise ValueError("no trajectory rows to build the routing dataset from: the trajectories asset "
                         "accepted nothing (see its quarantine.jsonl and metadata)")
    df = trajectories.reset_index(drop=True)
    if "timestamp_utc" not in df:
        df["timestamp_utc"] = pd.to_datetime(df["timestamp"], utc=True, format="ISO8601", errors="coerce")
    for col in ("verdict", "debug_retry", "debug_status", "failed_reason", "prompt_strategy_key"):
        if col not in df:
            df[col] = None
    roles_logged = set(df["role"].astype(str)) - {"orchestrator"}
    if routing_decisions is not None and not routing_decisions.empty:
        roles_logged |= set(routing_decisions["agent_role"].astype(str))
    roles_logged = sorted(roles_logged)
    wf_mask = is_workflow_step(df)
    wf_steps, df = df[wf_mask].reset_index(drop=True), df[~wf_mask].reset_index(drop=True)
    wf_report: dict = {}
    wf_frame = None
    if not wf_steps.empty:
        sessions = set(wf_steps["session_id"].astype(str))
        wf_mrd, routing_decisions = _by_session(routing_decisions, sessions)
        wf_tu, token_usage = _by_session(token_usage, sessions)
        wf_frame, wf_report = sage_workflow_decisions(wf_steps, wf_mrd, wf_tu)
    no_model = df["model"].isna()  # SAGE logged model_chosen "": its exporter skips such a step too
    steps_without_model = {str(k): int(v) for k, v in df.loc[no_model, "role"].value_counts().items()}
    df = df[~no_model].reset_index(drop=True)
    routed = df["role"].isin(table.roles)
    excluded = Counter({str(k): int(v) for k, v in df.loc[~routed, "role"].value_counts().items()})
    df = df[routed].reset_index(drop=True)
    tu_unattributed = 0
    if not df.empty:
        df = _join_routing_decisions(df, routing_decisions)
        df, tu_unattributed = _join_token_usage(df, token_usage)
        df = df.assign(episode_key=df["task_id"], decision_source="trajectory_step", provenance=None,
                       episode_dropped=False, outcome=None, reward_v1=df["logged_reward"].astype("float64"))
    elif token_usage is not None:
        tu_unattributed = len(token_usage)
    tu_unattributed += int(wf_report.get("token_usage_unattributed", 0))
    if wf_frame is not None:
        wf_frame["reward_v1"] = sage_composite_reward(
            wf_frame["logged_reward"].to_numpy(dtype=np.float64),
            wf_frame["verification_passed"].map({True: 1.0, False: 0.0}).to_numpy(dtype=np.float64, na_value=np.nan),
            wf_frame["terminal"].to_numpy(dtype=bool), wf_frame["failed_reason"].to_numpy(dtype=object))
        wf_routed = wf_frame["role"].isin(table.roles)
        excluded.update({str(k): int(v) for k, v in wf_frame.loc[~wf_routed, "role"].value_counts().items()})
        wf_frame = wf_frame[wf_routed]
        df = wf_frame.reset_index(drop=True) if df.empty else pd.concat([df, wf_frame], ignore_index=True, sort=False)
    if df.empty and empty_ok:
        return BuiltDataset(None, None, _empty_report(excluded, 0, tu_unattributed, wf_report, steps_without_model,
                                                      roles_logged))
    if df.empty:
        raise ValueError(f"no decision of the logs is for a role the routing table {table.source} routes "
                         f"(logged roles: {sorted(excluded) or roles_logged}; table roles: {', '.join(table.roles)}; "
                         f"not joined: {wf_report.get('not_joined') or 'none'}): point SAGE_ROUTING_TABLE at the "
                         "models.yaml the logs were made with")
    df["task_complexity_score"] = df["task_complexity_score"].astype("float64").fillna(
        df["mrd_task_complexity_score"].astype("float64"))
    df["primary_failure_count"] = df["primary_failure_count"].astype("Float64").fillna(
        df["mrd_primary_failure_count"].astype("Float64"))
    # an episode with a decision of unknown complexity cannot be replayed: leave it out, counted
    no_cx = df["task_complexity_score"].isna().groupby([df["session_id"], df["episode_key"]]).transform("any")
    dropped = int(no_cx.sum())
    df = df[~no_cx].reset_index(drop=True)
    if df.empty and empty_ok:
        return BuiltDataset(None, None, _empty_report(excluded, dropped, tu_unattributed, wf_report,
                                                      steps_without_model, roles_logged))
    if df.empty:
        raise ValueError("no decision has a task_complexity_score (in its state or its MODEL_ROUTING_DECISION): "
                         "the routing dataset needs it for every decision")
    step, step_source = _derive_steps(df)
    df["step"], df["step_source"] = step, step_source
    df = df.sort_values(["session_id", "episode_key", "step"], kind="stable").reset_index(drop=True)
    workflow = df["decision_source"].to_numpy(dtype=object) != "trajectory_step"
    logged_pairs = list(df[["role", "model"]].drop_duplicates().itertuples(index=False, name=None))
    space = ActionSpace.build(table, logged_pairs, catalogue)
    role_idx = df["role"].map(space.role_index).to_numpy(dtype=np.int64)
    episode = df["session_id"] + "/" + df["episode_key"]
    out = pd.DataFrame({
        "decision_id": episode + "/" + df["step"].astype(str),
        "episode_id": episode,
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
    earlier = prim_fail.groupby([df["session_id"], df["episode_key"]]).cumsum() - prim_fail
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
    unknown, reconstructed_from = _reconstruct(df, out, propensity_of)
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
    # pandas' string dtype (missing: NaN), as the Parquet file reads back
    out["failed_reason"] = df["failed_reason"].astype(object).where(df["failed_reason"].notna(), None).astype("str")
    out["decision_source"] = df["decision_source"].astype("str")
    out["provenance"] = df["provenance"].astype(object).where(df["provenance"].notna(), None).astype("str")
    if config.reward.version == "reward_v2" and unpriced:
        raise ValueError(f"{config.reward.version} subtracts each call's cost, but models {unpriced} have no logged "
                         f"cost_usd and no price in {price_source}: add them there (models.<name>.cost_per_call "
                         "and cost_per_1k_prompt_tokens; 0 for local models) or use reward_version reward_v1")
    tokens_total = (out["prompt_tokens"].astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
                    + out["completion_tokens"].astype("Float64").fillna(0).to_numpy(dtype=np.float64, na_value=0.0))
    out["reward"] = apply_version(df["reward_v1"].to_numpy(dtype=np.float64), out["cost_usd"].to_numpy(), config.reward,
                                  tokens=tokens_total, seconds=out["latency_s"].to_numpy(dtype=np.float64))
    out["reward_version"] = config.reward.version
    out["schema_version"] = SCHEMA_VERSION
    out["terminal"] = df["terminal"].astype(bool)
    # SAGE's workflow decisions carry the router's failure count, which is not their step
    logged_fc = df["failure_count"].astype("Float64").mask(pd.Series(workflow, index=df.index))
    dropped_ep = df["episode_dropped"].astype(bool).groupby([df["session_id"], df["episode_key"]]).transform("any")
    out["episode_complete"] = _episode_complete(out, logged_fc) & ~dropped_ep.to_numpy()
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
        cost_source=out["cost_source"].value_counts().to_dict(), models_without_price=unpriced,
        propensity_unknown=unknown, propensity_from=reconstructed_from,
        decisions_by_source=out["decision_source"].value_counts().to_dict(),
        not_joined=wf_report.get("not_joined", {}),
        routing_decisions_unused=wf_report.get("routing_decisions_unused", {}),
        steps_without_model=steps_without_model, notes=wf_report.get("notes", {}), roles_logged=roles_logged)
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
                                chunk_rows: int = CHUNK_ROWS,
                                propensity_of: PropensityOf | None = None) -> tuple[DatasetFiles, ActionSpace,
                                                                                 BuildReport]:
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
                                      read(token_usage), price_source=price_source, propensity_of=propensity_of)
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
                price_source=price_source, empty_ok=True, propensity_of=propensity_of)
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
    return dataset_reward_spec(json.loads(raw)) if raw else None


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


# ---------------------------------------------------------------- the routing_dataset asset's work
DIR = "routing"  # under the artifact root: the ingest's files (trajectories), the dataset's, the task outcomes
SET_NAME = "routing_dataset"  # the set's name: <root>/.locks/routing_dataset.lock, <root>/.sets/routing_dataset/
FRAME_COLUMNS = ("role", "split", "episode_id", "session_id", "episode_complete", "propensity_source",
                 "schema_version")  # what the run's figures are read from


@dataclass
class RoutingDatasetRun:
    """What :func:`run_routing_dataset` wrote (paths where they are read after the switch) and its figures."""

    parquet: Path  # <root>/routing/routing_v1.parquet
    jsonl: Path  # <root>/routing/routing_v1.jsonl
    sha256: str  # the Parquet file's content hash
    space: ActionSpace
    report: BuildReport  # joins, derivations and what was left out (also build_report.json)
    tasks: TaskOutcomes  # each `sage run` task's outcome and cost (task_outcomes.parquet)
    clock_scale: float  # the task outcomes' journal clock: the one sage_week declared, else the config's
    reward_version: str
    rows: int
    episodes: int
    sessions: int
    rows_per_role: dict[str, int]  # every role of the action space, 0 where it has no row
    rows_per_split: dict[str, int]
    incomplete_episodes: int
    schema_version: int
    propensities_logged: float  # share of rows whose propensity is known (logged or reconstructed)
    propensity_source: dict[str, int]
    column_types: dict[str, str]  # each column's dtype as the file reads back into pandas


def run_routing_dataset(root: str | Path, table: RoutingTable, catalogue: ModelCatalogue, config: DatasetConfig,
                        outcomes: TaskOutcomeConfig, *, price_source: str = "the model catalogue",
                        chunk_rows: int = CHUNK_ROWS, journal_clock: str | Path | None = None,
                        progress: Callable[[str], None] | None = None) -> RoutingDatasetRun:
    """The ``routing_dataset`` asset's work, under the artifact root ``root``: the dataset
    (:func:`build_routing_dataset_files` from the ingest's files in ``<root>/routing/``, each decision's
    probability reconstructed from the deployments record, ``explore.DEPLOYMENTS_FILE``), its action space
    and build report, and the task outcomes (under ``outcomes``, its clock replaced by the one
    ``journal_clock``, a JSON file with ``clock_scale``, declares when that file exists), written as one
    set (:func:`artifacts.exclusive_set`: one run at a time, switched together).

    A missing ``trajectories.parquet`` is a FileNotFoundError naming it, before anything is written.
    ``progress`` gets the journal clock used, a wait for another run, and the dataset's counts."""
    from sage_pipeline.routing import task_outcomes as to  # here: task_outcomes imports this module
    from sage_pipeline.sage import explore  # here: it loads joblib, which reading a dataset does not need

    log = progress or (lambda _msg: None)
    root = Path(root)
    where = root / DIR
    trajectories, decisions, tokens = (where / "trajectories.parquet", where / "routing_decisions.parquet",
                                       where / "token_usage.parquet")
    if not trajectories.is_file():
        raise FileNotFoundError(f"no trajectories at {trajectories}: materialize trajectories first (it ingests "
                                "SAGE's journals into routing/)")
    if journal_clock is not None and Path(journal_clock).is_file():
        declared = json.loads(Path(journal_clock).read_text(encoding="utf-8")).get("clock_scale")
        outcomes = to.TaskOutcomeConfig(**{**outcomes.model_dump(), "clock_scale": declared})
        log(f"task outcomes: journal clock {declared:g} (declared by sage_week in {journal_clock})")
    members = [f"{DIR}/{n}" for n in (PARQUET_NAME, JSONL_NAME, ACTION_SPACE_FILE, BUILD_REPORT_NAME,
                                      to.TASK_OUTCOMES_NAME)]
    with artifacts.exclusive_set(root, SET_NAME, members, log) as stage:
        files, space, built = build_routing_dataset_files(
            trajectories, table, catalogue, config, stage.path(DIR), decisions, tokens, price_source=price_source,
            chunk_rows=chunk_rows,
            propensity_of=explore.propensity_reconstructor(root.joinpath(*explore.DEPLOYMENTS_FILE), decisions))
        space.save(stage.path(DIR, ACTION_SPACE_FILE))
        artifacts.write_json(stage.path(DIR, BUILD_REPORT_NAME), built.to_dict())
        tasks = to.task_outcome_files(trajectories, decisions, tokens, stage.path(DIR, to.TASK_OUTCOMES_NAME),
                                      outcomes, agent_insights=where / ingest.AGENT_INSIGHTS_NAME)
        df = read_routing_dataset(files.parquet, list(FRAME_COLUMNS))
        schema = pq.read_schema(files.parquet)
        parquet, jsonl = stage.public(files.parquet), stage.public(files.jsonl)
    log(f"routing dataset: {len(df):,} decisions, {df['episode_id'].nunique():,} episodes; "
        f"{built.steps_derived:,} steps derived, {built.routing_decisions_joined:,} routing decisions "
        f"joined; roles left out (not in the table): {built.excluded_roles or 'none'}; decisions not "
        f"joined: {sum(built.not_joined.values()):,} ({built.not_joined or 'none'})")
    dtypes = schema.empty_table().to_pandas().dtypes  # the frame's dtypes, from the file
    per_role = df.groupby("role").size().reindex(list(space.roles), fill_value=0)
    return RoutingDatasetRun(
        parquet=parquet, jsonl=jsonl, sha256=files.parquet_sha256, space=space, report=built, tasks=tasks,
        clock_scale=outcomes.clock_scale, reward_version=config.reward.version, rows=len(df),
        episodes=int(df["episode_id"].nunique()), sessions=int(df["session_id"].nunique()),
        rows_per_role={r: int(n) for r, n in per_role.items()},
        rows_per_split=df["split"].value_counts().to_dict(),
        incomplete_episodes=int((~df["episode_complete"]).groupby(df["episode_id"]).any().sum()),
        schema_version=int(df["schema_version"].iat[0]),
        propensities_logged=float((df["propensity_source"] != "missing").mean()),
        propensity_source=df["propensity_source"].value_counts().to_dict(),
        column_types={c: str(dtypes[c]) for c in DATASET_COLUMNS})
