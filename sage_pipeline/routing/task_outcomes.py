"""Each ``sage run`` task's outcome and cost, read from SAGE's journals (pure: frames in, frames out).

**Verified** is read the way SAGE's workflow writes it (``orchestrator/workflow.py``):

* the reviewer's ``TRAJECTORY_STEP`` with ``terminal: true`` and ``state.verification_passed: true``
  is written once, after "All gates passed" (the reviewer's PASS and SAGE's verification command):
  the task is **verified**;
* the orchestrator's terminal step (the circuit breaker: ``failed_reason`` ``retry_limit``,
  ``timeout``, ...) or any other terminal step without a pass: **not verified**;
* a task whose journal ends before either (a killed run, a journal cut short): **unknown**, counted
  by reason and never scored as 0.

A task is a task id of a session (SAGE's ``session_id``, a fresh uuid per ``sage run``; the file's
stem without one), a new episode when the id starts again after its episode ended, as the routing
dataset reads it.

**Calls and their cost** are read one of two ways per session. The *journal events* below are the
lines the ingest keeps: workflow steps, ``MODEL_ROUTING_DECISION``, ``TOKEN_USAGE`` and
``AGENT_INSIGHT_EMITTED`` (SAGE's other lines, e.g. ``CONTEXT_CLAMPED``, which ``chat_with_timeout``
writes before its call, are not read), ordered by time, then file and line.

*A session with* ``TOKEN_USAGE`` *lines* (``llm/ollama_safe.py`` writes one after a call returns,
when the ``ollama`` client's response has a ``usage`` attribute): every ``TOKEN_USAGE`` is one call.
It belongs to the task of the first workflow step written after it in the session (the step the
call led to); calls after a session's last step belong to no task and are counted. Its seconds: the
time from the previous journal event of the session to its ``TOKEN_USAGE`` (the model's answer time
plus SAGE's own prompt building, which is milliseconds). A session's first event has no time before
it: its seconds are unknown (counted) and taken as 0.

*A session without* ``TOKEN_USAGE`` (real SAGE against Ollama, and against the model world: the
``ollama`` client SAGE installs returns a ``ChatResponse`` without ``usage``, so SAGE writes none):
every agent that calls a model writes an ``AGENT_INSIGHT_EMITTED`` ``decision`` naming the model just
before its one ``chat_with_timeout`` call (``orchestrator/intelligence_feed.py`` logs every insight),
in the agent's own words (:data:`DECISION_FORMATS`, each with the SAGE file:line that writes it). One
such decision is one call of the model it names; the documentation agent writes no decision, and
its call is its ``MODEL_ROUTING_DECISION`` (``agents/documentation.py``: ``router.select`` at line
106, the call at 124). Its seconds: the time from that line to the session's next journal event
(of any kind: the agent's own insight after the answer, in SAGE's code), which holds the call and
SAGE's few milliseconds of prompt building and parsing. A call belongs to the task SAGE's insight
names (``task_id``; the documentation's routing decision names none), else (``""``, or the
planner's ``"planner"``: ``agents/planner.py:571``, "no task_id yet at DAG time") to the first
workflow step after it, as above; a named task's calls go to its episode of the next step of that
task, else, at the journal's end, to its episode still open, else to no task (counted). What cannot
be read is counted by reason and is no call: a decision of an agent without a known format, one
whose content names no model, one followed by the agent's "ollama module not available" risk (no
call was made). A call with no later journal event in its session has unknown seconds (counted,
taken as 0). These sessions carry no tokens: the tasks' token columns are NaN.

Either way, a call of a model with an API price costs dollars (its tokens at the price; unknown,
counted and taken as 0, without ``TOKEN_USAGE``) and no GPU time; any other model is the user's
local model and costs the call's **seconds**, divided by ``clock_scale`` (1 for a real SAGE; the
model world's scaled clock otherwise). In the model world one ``sage run`` plans one task, so every
call of the run is its task's.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_pipeline import artifacts, markdown
from sage_pipeline.routing.routing_dataset import file_rank, is_workflow_step as rd_is_workflow_step
from sage_pipeline.sage.objective import TaskObjective, score

TASK_OUTCOMES_NAME = "task_outcomes.parquet"
UNFINISHED = "unknown: the journal ends before SAGE's gate passed the task or its circuit breaker ended it"


class TaskOutcomeConfig(BaseModel):
    """How a task's cost is read from its calls (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    objective: TaskObjective = Field(default_factory=TaskObjective)
    clock_scale: float = Field(1.0, gt=0, allow_inf_nan=False,
                               description="journal seconds per model second: 1 for a real SAGE, the model world's "
                                           "clock_scale for its journals")
    # SAGE's models.yaml names claude-sonnet-4-5 (the memory optimizer's fallback): Anthropic's list price,
    # $3 / $15 per million prompt / completion tokens
    usd_per_million_prompt: dict[str, float] = Field(
        default_factory=lambda: {"claude-sonnet-4-5": 3.0},
        description="model -> USD per million prompt tokens, for models called through a paid API (no GPU time)")
    usd_per_million_completion: dict[str, float] = Field(
        default_factory=lambda: {"claude-sonnet-4-5": 15.0},
        description="model -> USD per million completion tokens; the same models as usd_per_million_prompt")

    @model_validator(mode="after")
    def _same_models(self) -> TaskOutcomeConfig:
        a, b = set(self.usd_per_million_prompt), set(self.usd_per_million_completion)
        if a != b:
            raise ValueError(f"usd_per_million_prompt and usd_per_million_completion must price the same models; "
                             f"only one prices {sorted(a ^ b)}: give each API model both prices")
        bad = {f"{which}[{m}]": v for which, d in (("usd_per_million_prompt", self.usd_per_million_prompt),
                                                  ("usd_per_million_completion", self.usd_per_million_completion))
               for m, v in d.items() if not (v >= 0 and np.isfinite(v))}
        if bad:
            raise ValueError(f"API prices must be finite and >= 0: {bad}")
        return self

    @property
    def api_prices(self) -> dict[str, tuple[float, float]]:
        return {m: (self.usd_per_million_prompt[m], self.usd_per_million_completion[m])
                for m in self.usd_per_million_prompt}


@dataclass
class TaskOutcomes:
    frame: pd.DataFrame  # one row per task (columns: see :func:`task_outcomes`)
    report: dict = field(default_factory=dict)


# How each SAGE agent's "decision" insight names the model it then calls: the content its ``_emit``
# writes (src/sage/agents/<agent>.py at SAGE commit 83287e4), as a whole-string pattern, with the
# file:line of that content. ``intelligence_feed.py`` logs the content's first 500 characters.
DECISION_FORMATS: dict[str, tuple[re.Pattern[str], str]] = {
    "planner": (re.compile(r"Planner selected model=(?P<model>.*) to generate Task DAG\."),
                "agents/planner.py:590"),
    "architect": (re.compile(r"Architect selected model=(?P<model>.*) for blueprint generation\."),
                  "agents/architect.py:123"),
    "coder": (re.compile(r"Coder strategy selected: strategy_key=(?P<strategy_key>.*?), model=(?P<model>.*), "
                         r"temperature=\S+"), "agents/coder.py:358-359"),
    "reviewer": (re.compile(r"Reviewer selected model=(?P<model>.*) for LLM review\."), "agents/reviewer.py:466"),
    "debugger": (re.compile(r"Debugger selected model=(?P<model>.*) for error fix\."), "agents/debugger.py:377"),
    "test_engineer": (re.compile(r"Test engineer selected model=(?P<model>.*) for test generation\."),
                      "agents/test_engineer.py:150"),
}
# agents whose call is marked by their MODEL_ROUTING_DECISION: they write no decision insight
CALL_BY_ROUTING_DECISION = {"documentation": "agents/documentation.py:106 (router.select), :124 (the call)"}
# task ids SAGE writes on an insight that name no task of its plan: (agent, task_id) -> where
NOT_A_TASK = {("planner", "planner"): "agents/planner.py:571"}
# the risk an agent writes instead of calling when the ollama module is missing (no call was made):
# architect.py:139, coder.py:401, debugger.py:384, planner.py:610
NO_OLLAMA = "ollama module not available"

DECISION_INSIGHTS = "decision_insights"
TOKEN_USAGE_READING = "token_usage"
NOTE_NO_FORMAT = "decision insights of an agent without a known decision format (no call read): {agent}"
NOTE_NO_MODEL = "decision insights whose content names no model (no call read)"
NOTE_NO_OLLAMA = "decision insights followed by the agent's 'ollama module not available' risk (no call made)"
NOTE_NO_LATER = "calls with no later journal event in their session (seconds unknown: 0)"
NOTE_FIRST = "calls whose time is unknown (the first event of its session): 0 s"
NOTE_AFTER_LAST = "calls after the session's last workflow step (no task)"
NOTE_NAMED_NO_TASK = "calls naming a task with no workflow step after them (no task)"
NOTE_NO_INSIGHTS = ("sessions without TOKEN_USAGE read without the agent insights table (only the documentation "
                    "agent's calls can be seen): pass agent_insights")
NOTE_API_NO_TOKENS = "API model calls read from decision insights (no tokens in the journal): dollars unknown, 0"


def decision_model(agent: str, content: str | None) -> tuple[str | None, str | None]:
    """The model an agent's decision insight names, or (None, the reason it names none)."""
    fmt = DECISION_FORMATS.get(agent)
    if fmt is None:
        return None, NOTE_NO_FORMAT.format(agent=agent)
    m = fmt[0].fullmatch(content or "")
    if m is None or not m["model"]:
        return None, NOTE_NO_MODEL
    return m["model"], None


def _events(steps: pd.DataFrame, others: list[pd.DataFrame | None]) -> pd.DataFrame:
    frames = [steps.assign(ev_kind="S")]
    for kind, df in zip(("M", "U", "I"), others, strict=True):
        if df is not None and not df.empty:
            frames.append(df.assign(ev_kind=kind))
    ev = pd.concat(frames, ignore_index=True, sort=False)
    for col in ("task_id", "role", "terminal", "verification_passed", "failed_reason", "model", "prompt_tokens",
                "completion_tokens", "agent", "agent_role", "selected_model", "insight_type", "content_preview"):
        if col not in ev:
            ev[col] = None
    ts = pd.to_datetime(ev["timestamp_utc"], utc=True)
    ev["ev_ts"] = ((ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "us")).astype("int64")
    ev["ev_rank"] = file_rank(ev["source_file"].astype(str))
    return ev.sort_values(["session_id", "ev_ts", "ev_rank", "source_line"], kind="stable").reset_index(drop=True)


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)


class _Session:
    """One session's tasks and calls, read in journal order."""

    def __init__(self, sid: str, rows: list[dict], report: Counter, config: TaskOutcomeConfig, reading: str) -> None:
        self.sid, self.rows, self.report, self.config, self.reading = sid, rows, report, config, reading
        self.prices = config.api_prices
        self.tasks: dict[str, dict] = {}
        self.pending: list[dict] = []  # calls since the last workflow step that name no task
        self.pending_by_task: dict[str, list[dict]] = {}  # calls naming a task, until that task's next step
        self.open_calls: list[tuple[dict, int]] = []  # insight calls waiting for the next event: (call, ts)

    def call(self, model: str, tokens: tuple[float, float] | None = None) -> dict:
        call = {"model": model, "prompt_tokens": np.nan, "completion_tokens": np.nan, "usd": 0.0, "s": 0.0}
        if tokens is not None:
            call["prompt_tokens"], call["completion_tokens"] = tokens
        if model in self.prices:
            if tokens is None:
                self.report[NOTE_API_NO_TOKENS] += 1
            else:
                call["usd"] = (tokens[0] * self.prices[model][0] + tokens[1] * self.prices[model][1]) / 1e6
        return call

    def step(self, r) -> None:
        t = self.tasks.get(r.task_id)
        if t is None or t["end"] is not None:
            t = self.tasks[r.task_id] = {"task_id": r.task_id, "episode": 0 if t is None else t["episode"] + 1,
                                         "calls": [], "steps": 0, "end": None, "verified": np.nan}
            self.rows.append({"session_id": self.sid, "reading": self.reading, "_t": t})
        t["calls"] += self.pending + self.pending_by_task.pop(r.task_id, [])
        self.pending = []
        t["steps"] += 1
        if bool(r.terminal):
            passed = r.role == "reviewer" and r.verification_passed is True
            t["verified"] = 1.0 if passed else 0.0
            t["end"] = "verified" if passed else (
                f"circuit_breaker: {r.failed_reason}" if r.role == "orchestrator" and r.failed_reason
                else f"terminal {r.role} step without verification passed")

    def close(self, ts: int | None) -> None:
        """The insight calls waiting for a later event end at ``ts`` (None: the session ended first)."""
        for call, start in self.open_calls:
            if ts is None:
                self.report[NOTE_NO_LATER] += 1
            elif call["model"] not in self.prices:
                call["s"] = (ts - start) / 1e6 / self.config.clock_scale
        self.open_calls = []

    def insight_call(self, r, model: str, task_id: str | None) -> None:
        call = self.call(model)
        self.open_calls.append((call, r.ev_ts))
        if task_id:
            self.pending_by_task.setdefault(task_id, []).append(call)
        else:
            self.pending.append(call)

    def end(self) -> None:
        self.close(None)
        if self.pending:
            self.report[NOTE_AFTER_LAST] += len(self.pending)
        for task_id, calls in self.pending_by_task.items():
            t = self.tasks.get(task_id)
            if t is not None and t["end"] is None:  # the task's episode was still open when the journal ended
                t["calls"] += calls
            else:
                self.report[NOTE_NAMED_NO_TASK] += len(calls)


def _read_token_usage(s: _Session, sess: pd.DataFrame) -> None:
    prev = None
    for r in sess.itertuples(index=False):
        if r.ev_kind == "U":
            pt = float(r.prompt_tokens) if pd.notna(r.prompt_tokens) else 0.0
            ct = float(r.completion_tokens) if pd.notna(r.completion_tokens) else 0.0
            call = s.call(str(r.model), (pt, ct))
            if str(r.model) not in s.prices:  # a local model: its seconds
                if prev is None:
                    s.report[NOTE_FIRST] += 1
                else:
                    call["s"] = (r.ev_ts - prev) / 1e6 / s.config.clock_scale
            s.pending.append(call)
        elif r.ev_kind == "S":
            s.step(r)
        prev = r.ev_ts
    s.end()


def _read_decision_insights(s: _Session, sess: pd.DataFrame) -> None:
    rows = list(sess.itertuples(index=False))
    for i, r in enumerate(rows):
        s.close(r.ev_ts)
        if r.ev_kind == "S":
            s.step(r)
        elif r.ev_kind == "M" and _text(r.agent_role) in CALL_BY_ROUTING_DECISION and _text(r.selected_model):
            s.insight_call(r, _text(r.selected_model), None)
        elif r.ev_kind == "I" and r.insight_type == "decision":
            agent = _text(r.agent)
            model, why = decision_model(agent, _text(r.content_preview))
            if model is None:
                s.report[why] += 1
                continue
            nxt = rows[i + 1] if i + 1 < len(rows) else None
            if (nxt is not None and nxt.ev_kind == "I" and _text(nxt.agent) == agent
                    and _text(nxt.content_preview).startswith(NO_OLLAMA)):
                s.report[NOTE_NO_OLLAMA] += 1
                continue
            task_id = _text(r.task_id)
            if (agent, task_id) in NOT_A_TASK:
                task_id = ""
            s.insight_call(r, model, task_id or None)
    s.end()


def task_outcomes(steps: pd.DataFrame, routing_decisions: pd.DataFrame | None, token_usage: pd.DataFrame | None,
                  config: TaskOutcomeConfig | None = None, *,
                  agent_insights: pd.DataFrame | None = None) -> TaskOutcomes:
    """Per task of SAGE's ``sage run`` journals: ``verified`` (1, 0, NaN unknown), how it ended, its
    calls (in all and by model), tokens, GPU-seconds, dollars and the objective's value.

    ``steps``: SAGE's workflow steps (``routing_dataset.is_workflow_step`` of the ingest's
    trajectories); ``routing_decisions``, ``token_usage`` and ``agent_insights``: the ingest's rows of
    the same sessions (every journal event counts for the time around a call; a session's calls are
    its ``TOKEN_USAGE`` lines when it has any, else its agents' decision insights: see the module)."""
    config = config or TaskOutcomeConfig()
    rows: list[dict] = []
    report: Counter = Counter()
    if steps.empty:
        return TaskOutcomes(pd.DataFrame(columns=list(COLUMNS)), {"tasks": 0})
    ev = _events(steps, [routing_decisions, token_usage, agent_insights])
    readings: Counter = Counter()
    for sid, sess in ev.groupby("session_id", sort=False):
        reading = TOKEN_USAGE_READING if (sess["ev_kind"] == "U").any() else DECISION_INSIGHTS
        readings[reading] += 1
        if reading == DECISION_INSIGHTS and agent_insights is None:
            report[NOTE_NO_INSIGHTS] += 1
        s = _Session(str(sid), rows, report, config, reading)
        (_read_token_usage if reading == TOKEN_USAGE_READING else _read_decision_insights)(s, sess)
    out = []
    for row in rows:
        t = row["_t"]
        calls = t["calls"]
        if t["end"] is None:
            report[UNFINISHED] += 1
        by_model = Counter(c["model"] for c in calls)
        s_by_model: Counter = Counter()
        for c in calls:
            if c["model"] not in config.api_prices:
                s_by_model[c["model"]] += c["s"]
        tokens = row["reading"] == TOKEN_USAGE_READING
        out.append({
            "session_id": str(row["session_id"]), "task_id": str(t["task_id"]), "episode": int(t["episode"]),
            "verified": t["verified"], "ended": t["end"] or "unfinished", "workflow_steps": t["steps"],
            "calls_from": row["reading"], "calls": len(calls),
            "calls_by_model": json.dumps(dict(sorted(by_model.items()))),
            "prompt_tokens": float(sum(c["prompt_tokens"] for c in calls)) if tokens else np.nan,
            "completion_tokens": float(sum(c["completion_tokens"] for c in calls)) if tokens else np.nan,
            "gpu_seconds": float(sum(c["s"] for c in calls)),
            "gpu_seconds_by_model": json.dumps({m: round(v, 6) for m, v in sorted(s_by_model.items())}),
            "usd": float(sum(c["usd"] for c in calls)),
        })
    frame = pd.DataFrame(out, columns=[c for c in COLUMNS if c not in ("objective_name", "objective")])
    frame["objective_name"] = config.objective.name
    frame["objective"] = score(config.objective, frame["verified"].to_numpy(dtype=np.float64),
                               frame["gpu_seconds"].to_numpy(dtype=np.float64), frame["usd"].to_numpy(dtype=np.float64))
    known = frame["verified"].notna()
    summary = {"tasks": len(frame), "tasks_verified": int((frame["verified"] == 1).sum()),
               "tasks_not_verified": int((frame["verified"] == 0).sum()), "tasks_unknown": int((~known).sum()),
               "sessions": int(frame["session_id"].nunique()), "sessions_by_calls_from": dict(readings),
               "objective": config.objective.describe(), "clock_scale": config.clock_scale, "notes": dict(report)}
    return TaskOutcomes(frame, summary)


COLUMNS = {
    "session_id": "SAGE's session (one `sage run`)",
    "task_id": "the task's id in SAGE's plan",
    "episode": "0, or n when the id started again after its episode ended",
    "verified": "1: SAGE's gate passed it; 0: SAGE gave up; NaN: the journal does not say",
    "ended": "verified, circuit_breaker: <reason>, or unfinished",
    "workflow_steps": "SAGE's workflow steps of the task (reviewer, debugger, orchestrator)",
    "calls_from": "how the session's calls were read: token_usage (its TOKEN_USAGE lines) or decision_insights "
                  "(its agents' decision insights naming a model, and the documentation agent's routing decisions: "
                  "SAGE wrote no TOKEN_USAGE)",
    "calls": "the task's model calls",
    "calls_by_model": "JSON: model -> calls",
    "prompt_tokens": "prompt tokens of those calls (NaN when read from decision insights: no tokens logged)",
    "completion_tokens": "completion tokens of those calls (NaN when read from decision insights)",
    "gpu_seconds": "local models' seconds on those calls (journal time / clock_scale: before a TOKEN_USAGE, or "
                   "from a decision to the next journal event)",
    "gpu_seconds_by_model": "JSON: local model -> its seconds on those calls (rounded to the microsecond)",
    "usd": "API models' dollars on those calls (tokens at the configured prices; 0 without tokens, counted)",
    "objective_name": "the objective's versioned name",
    "objective": "the objective's value for the task (NaN when verified is unknown)",
}


def task_outcome_files(trajectories: str | Path, routing_decisions: str | Path | None, token_usage: str | Path | None,
                       out: str | Path, config: TaskOutcomeConfig | None = None, *,
                       agent_insights: str | Path | None = None) -> TaskOutcomes:
    """:func:`task_outcomes` from the ingest's Parquet files (``agent_insights``: its
    ``agent_insights.parquet``, without which a session with no TOKEN_USAGE shows no calls), written
    atomically to ``out``. Only sessions with SAGE's workflow steps (``sage run``) have tasks; other
    logs give an empty table."""
    cols = ["timestamp_utc", "session_id", "task_id", "role", "terminal", "verification_passed", "failed_reason",
            "verdict", "debug_status", "debug_retry", "source_file", "source_line"]
    have = set(pq.read_schema(trajectories).names)
    steps = pq.read_table(trajectories, columns=[c for c in cols if c in have]).to_pandas()
    steps = steps[rd_is_workflow_step(steps)].reset_index(drop=True)
    sessions = list(steps["session_id"].astype(str).unique())

    def read(path, columns):
        if path is None or not Path(path).is_file() or not sessions:
            return None
        return pq.read_table(path, columns=columns, filters=[("session_id", "in", sessions)]).to_pandas()

    base = ["timestamp_utc", "session_id", "source_file", "source_line"]
    res = task_outcomes(steps, read(routing_decisions, [*base, "agent_role", "selected_model"]),
                        read(token_usage, [*base, "model", "prompt_tokens", "completion_tokens"]), config,
                        agent_insights=read(agent_insights, [*base, "task_id", "agent", "insight_type",
                                                             "content_preview"]))
    table = pa.Table.from_pandas(res.frame, preserve_index=False)
    with artifacts.atomic_path(out) as tmp:
        pq.write_table(table, tmp)
    return res


def summary_markdown(res: TaskOutcomes) -> str:
    """The tasks' outcome and cost at a glance (the routing_dataset asset's metadata)."""
    f, r = res.frame, res.report
    if f.empty:
        return ("no `sage run` task in these journals (no reviewer, debugger or orchestrator step of SAGE's "
                "workflow): nothing to score under the objective")
    known = f[f["verified"].notna()]
    rows = [{"tasks": len(f), "verified": int((f["verified"] == 1).sum()),
             "not verified": int((f["verified"] == 0).sum()), "verdict unknown": int(f["verified"].isna().sum()),
             "verified share": f"{known['verified'].mean():.3f}" if len(known) else "n/a",
             "calls / task": f"{f['calls'].mean():.2f}", "GPU-s / task": f"{f['gpu_seconds'].mean():.1f}",
             "USD / task": f"{f['usd'].mean():.4f}",
             "objective / task": f"{known['objective'].mean():.4f}" if len(known) else "n/a"}]
    read = ", ".join(f"{k}: {v} sessions" for k, v in sorted(r.get("sessions_by_calls_from", {}).items()))
    notes = "".join(f"\n- {k}: {v}" for k, v in r.get("notes", {}).items())
    return (f"{r['objective']} (journal clock scale {r['clock_scale']:g}; calls read from {read or 'n/a'})\n\n"
            f"{markdown.table(rows)}{notes}")


OBJECTIVE_NO_OUTCOME = "episodes with no task in task_outcomes (no SAGE workflow step of theirs was read)"
OBJECTIVE_UNKNOWN = "episodes whose task's verdict is unknown (the journal ends first)"


def episode_ids(outcomes: pd.DataFrame) -> pd.Series:
    """The routing dataset's ``episode_id`` of each task row (``session/task`` or ``session/task#n``)."""
    ep = outcomes["episode"].astype("int64")
    key = outcomes["task_id"].astype(str).where(ep == 0, outcomes["task_id"].astype(str) + "#" + ep.astype(str))
    return outcomes["session_id"].astype(str) + "/" + key


def objective_rewards(rows: pd.DataFrame, outcomes: pd.DataFrame) -> tuple[pd.DataFrame, dict]:
    """Routing dataset ``rows`` whose ``reward`` is the per-task objective: 0 on every decision of an
    episode but its last (highest ``step``), which carries the task's ``objective`` (verified minus its
    priced calls, :mod:`sage_pipeline.sage.objective`). An episode's return is then exactly its task's
    objective, so every episode-level OPE estimator and the gate judge the objective, never summed
    reward_v1 (``reward_version`` names the objective; ``task_verified`` carries the task's verdict). Episodes
    whose task has no row in ``outcomes`` or an unknown verdict are left out and counted (``report``), never
    scored 0."""
    need = {"session_id", "task_id", "episode", "verified", "objective", "objective_name"}
    missing = need - set(outcomes.columns)
    if missing:
        raise ValueError(f"task outcomes lack the columns {sorted(missing)}: rebuild them with the routing_dataset "
                         f"asset ({TASK_OUTCOMES_NAME})")
    known = outcomes[outcomes["verified"].notna()]
    value = pd.Series(known["objective"].to_numpy(dtype=np.float64), index=episode_ids(known).to_numpy())
    if value.index.has_duplicates:
        dup = value.index[value.index.duplicated()][:3].tolist()
        raise ValueError(f"task outcomes hold the same episode twice ({dup}): rebuild them with the routing_dataset "
                         "asset")
    unknown = set(episode_ids(outcomes[outcomes["verified"].isna()]))
    ep = rows["episode_id"].astype(str)
    has = ep.isin(value.index)
    episodes = ep.unique()
    report = {"episodes": int(len(episodes)), "scored": int(ep[has].nunique()),
              OBJECTIVE_UNKNOWN: int(sum(e in unknown for e in episodes)),
              OBJECTIVE_NO_OUTCOME: int(sum(e not in unknown and e not in value.index for e in episodes))}
    out = rows[has.to_numpy()].copy()
    if out.empty:
        return out, report
    last = out.groupby("episode_id", sort=False)["step"].transform("max").to_numpy() == out["step"].to_numpy()
    if (out[last].groupby("episode_id")["step"].size() != 1).any():
        raise ValueError("an episode has two decisions at its last step: the routing dataset's steps must be unique "
                         "per episode")
    out["reward"] = np.where(last, out["episode_id"].astype(str).map(value).to_numpy(dtype=np.float64), 0.0)
    out["reward_version"] = str(known["objective_name"].iloc[0])
    out["task_verified"] = out["episode_id"].astype(str).map(
        pd.Series(known["verified"].to_numpy(dtype=np.float64), index=value.index)).to_numpy(dtype=np.float64)
    return out, report
