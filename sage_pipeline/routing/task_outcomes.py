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

**Calls and their cost.** Every ``TOKEN_USAGE`` is one model call (``llm/ollama_safe.py`` writes it
after the call returns). It belongs to the task of the first workflow step written after it in the
session (the step the call led to); calls after a session's last step belong to no task and are
counted. In the model world one ``sage run`` plans one task, so every call of the run is its task's.
A call of a model with an API price costs dollars (its tokens at the price) and no GPU time; any
other model is the user's local model and costs the call's **seconds**: the time from the previous
journal event of the session to its ``TOKEN_USAGE`` (the model's answer time plus SAGE's own prompt
building, which is milliseconds), divided by ``clock_scale`` (1 for a real SAGE; the model world's
scaled clock otherwise). A session's first event has no time before it: its seconds are unknown
(counted) and taken as 0.
"""

from __future__ import annotations

import json
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


def _events(steps: pd.DataFrame, others: list[pd.DataFrame | None]) -> pd.DataFrame:
    frames = [steps.assign(ev_kind="S")]
    for kind, df in zip(("M", "U"), others, strict=True):
        if df is not None and not df.empty:
            frames.append(df.assign(ev_kind=kind))
    ev = pd.concat(frames, ignore_index=True, sort=False)
    for col in ("task_id", "role", "terminal", "verification_passed", "failed_reason", "model", "prompt_tokens",
                "completion_tokens"):
        if col not in ev:
            ev[col] = None
    ts = pd.to_datetime(ev["timestamp_utc"], utc=True)
    ev["ev_ts"] = ((ts - pd.Timestamp(0, tz="UTC")) // pd.Timedelta(1, "us")).astype("int64")
    ev["ev_rank"] = file_rank(ev["source_file"].astype(str))
    return ev.sort_values(["session_id", "ev_ts", "ev_rank", "source_line"], kind="stable").reset_index(drop=True)


def task_outcomes(steps: pd.DataFrame, routing_decisions: pd.DataFrame | None, token_usage: pd.DataFrame | None,
                  config: TaskOutcomeConfig | None = None) -> TaskOutcomes:
    """Per task of SAGE's ``sage run`` journals: ``verified`` (1, 0, NaN unknown), how it ended, its
    calls (in all and by model), tokens, GPU-seconds, dollars and the objective's value.

    ``steps``: SAGE's workflow steps (``routing_dataset.is_workflow_step`` of the ingest's
    trajectories); ``routing_decisions`` and ``token_usage``: the ingest's rows of the same sessions
    (every journal event counts for the time before a call)."""
    config = config or TaskOutcomeConfig()
    rows: list[dict] = []
    report: Counter = Counter()
    if steps.empty:
        return TaskOutcomes(pd.DataFrame(columns=list(COLUMNS)), {"tasks": 0})
    ev = _events(steps, [routing_decisions, token_usage])
    prices = config.api_prices
    for sid, sess in ev.groupby("session_id", sort=False):
        tasks: dict[str, dict] = {}
        pending: list[dict] = []  # calls since the session's last workflow step
        prev = None
        for r in sess.itertuples(index=False):
            if r.ev_kind == "U":
                model = str(r.model)
                pt = float(r.prompt_tokens or 0) if pd.notna(r.prompt_tokens) else 0.0
                ct = float(r.completion_tokens or 0) if pd.notna(r.completion_tokens) else 0.0
                call = {"model": model, "prompt_tokens": pt, "completion_tokens": ct, "usd": 0.0, "s": 0.0}
                if model in prices:
                    call["usd"] = (pt * prices[model][0] + ct * prices[model][1]) / 1e6
                elif prev is None:
                    report["calls whose time is unknown (the first event of its session): 0 s"] += 1
                else:
                    call["s"] = (r.ev_ts - prev) / 1e6 / config.clock_scale
                pending.append(call)
            elif r.ev_kind == "S":
                t = tasks.get(r.task_id)
                if t is None or t["end"] is not None:
                    t = tasks[r.task_id] = {"task_id": r.task_id, "episode": 0 if t is None else t["episode"] + 1,
                                            "calls": [], "steps": 0, "end": None, "verified": np.nan}
                    rows.append({"session_id": sid, "_t": t})
                t["calls"] += pending
                pending = []
                t["steps"] += 1
                if bool(r.terminal):
                    passed = r.role == "reviewer" and r.verification_passed is True
                    t["verified"] = 1.0 if passed else 0.0
                    t["end"] = "verified" if passed else (
                        f"circuit_breaker: {r.failed_reason}" if r.role == "orchestrator" and r.failed_reason
                        else f"terminal {r.role} step without verification passed")
            prev = r.ev_ts
        if pending:
            report["calls after the session's last workflow step (no task)"] += len(pending)
    out = []
    for row in rows:
        t = row["_t"]
        calls = t["calls"]
        if t["end"] is None:
            report[UNFINISHED] += 1
        by_model = Counter(c["model"] for c in calls)
        out.append({
            "session_id": str(row["session_id"]), "task_id": str(t["task_id"]), "episode": int(t["episode"]),
            "verified": t["verified"], "ended": t["end"] or "unfinished", "workflow_steps": t["steps"],
            "calls": len(calls), "calls_by_model": json.dumps(dict(sorted(by_model.items()))),
            "prompt_tokens": float(sum(c["prompt_tokens"] for c in calls)),
            "completion_tokens": float(sum(c["completion_tokens"] for c in calls)),
            "gpu_seconds": float(sum(c["s"] for c in calls)), "usd": float(sum(c["usd"] for c in calls)),
        })
    frame = pd.DataFrame(out, columns=[c for c in COLUMNS if c not in ("objective_name", "objective")])
    frame["objective_name"] = config.objective.name
    frame["objective"] = score(config.objective, frame["verified"].to_numpy(dtype=np.float64),
                               frame["gpu_seconds"].to_numpy(dtype=np.float64), frame["usd"].to_numpy(dtype=np.float64))
    known = frame["verified"].notna()
    summary = {"tasks": len(frame), "tasks_verified": int((frame["verified"] == 1).sum()),
               "tasks_not_verified": int((frame["verified"] == 0).sum()), "tasks_unknown": int((~known).sum()),
               "sessions": int(frame["session_id"].nunique()), "objective": config.objective.describe(),
               "clock_scale": config.clock_scale, "notes": dict(report)}
    return TaskOutcomes(frame, summary)


COLUMNS = {
    "session_id": "SAGE's session (one `sage run`)",
    "task_id": "the task's id in SAGE's plan",
    "episode": "0, or n when the id started again after its episode ended",
    "verified": "1: SAGE's gate passed it; 0: SAGE gave up; NaN: the journal does not say",
    "ended": "verified, circuit_breaker: <reason>, or unfinished",
    "workflow_steps": "SAGE's workflow steps of the task (reviewer, debugger, orchestrator)",
    "calls": "model calls (TOKEN_USAGE lines) that led to the task's steps",
    "calls_by_model": "JSON: model -> calls",
    "prompt_tokens": "prompt tokens of those calls",
    "completion_tokens": "completion tokens of those calls",
    "gpu_seconds": "local models' seconds on those calls (journal time / clock_scale)",
    "usd": "API models' dollars on those calls (tokens at the configured prices)",
    "objective_name": "the objective's versioned name",
    "objective": "the objective's value for the task (NaN when verified is unknown)",
}


def task_outcome_files(trajectories: str | Path, routing_decisions: str | Path | None, token_usage: str | Path | None,
                       out: str | Path, config: TaskOutcomeConfig | None = None) -> TaskOutcomes:
    """:func:`task_outcomes` from the ingest's Parquet files, written atomically to ``out``. Only
    sessions with SAGE's workflow steps (``sage run``) have tasks; other logs give an empty table."""
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
    res = task_outcomes(steps, read(routing_decisions, base),
                        read(token_usage, [*base, "model", "prompt_tokens", "completion_tokens"]), config)
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
    notes = "".join(f"\n- {k}: {v}" for k, v in r.get("notes", {}).items())
    return f"{r['objective']} (journal clock scale {r['clock_scale']:g})\n\n{markdown.table(rows)}{notes}"
