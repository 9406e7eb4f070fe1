"""Learn the coder's model from what SAGE logs: the lever no router checkpoint reaches.

SAGE's coder never asks the router (``agents/coder.py``): its UCB bandit picks one of four strategy
keys, two per model of the coder's row in ``models.yaml``, and the reviewer's ``TRAJECTORY_STEP``
records the key and the coder's model (``action.prompt_strategy_key``, ``action.model_chosen``). The
routing dataset reads that step as the coder's decision; the task outcomes (``routing/task_outcomes``)
say whether SAGE's gate passed the task and what its calls cost.

**What the logs identify, and under which assumption.** The bandit's choice is a function of its own
past rewards alone (``rl/ucb_bandit.py`` ``select`` reads the stats, never the task), so which model
wrote a task's first file is independent of that task's difficulty given the past: the tasks each
model got are draws from the same task stream. Then a model's mean objective over its tasks is an
unbiased estimate of the objective of a table that pins the coder to it (everything else as logged:
the reviewer's and debugger's routing, which the pin does not touch). The bandit's choices are
adaptive, so the interval (a bootstrap over sessions, each a ``sage run``) is approximate. It is
checked against the model world's exact truth in ``benchmarks/sage_loop_e2e.py`` and the tests.

**Support.** SAGE's bandit tries every untried key first in every fresh workspace, so a shipped SAGE
logs both of the coder's models from its first runs; once a pin is deployed, the other model gets no
more data and the decision stands until the pin is lifted (a table that keeps both models).

**The decision** (:func:`decide`, the loop's ``coder_decisions="bootstrap"`` mode). Pin the model whose
objective beats every other logged model's with the lower end of the paired-bootstrap interval of the
difference above 0, each model with at least ``min_tasks`` tasks of known verdict; else keep the table, and
say which condition failed and how many tasks it would take. **Valid for one night only**: re-decided every
night on a growing log, it pins one of two equal models in about 28% of months within 30 nights, and a pin
it made is never reverted (issue 47).

**The ledger's coder lever** (``decisions/coder.py``, the loop's default ``coder_decisions="ledger"``)
decides on randomised runs instead; :func:`ledger_runs` gives it one row per ``sage run`` from the same
frames (the run's task_v1 over its tasks of known verdict, the coder's first logged model, and the run's
draw id from :func:`traces_by_session`: SAGE's ``trace_id``, which ``trajectories.parquet`` keeps and the
routing dataset and task outcomes do not).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.decisions.coder import CoderRun
from sage_pipeline.sage.objective import TaskObjective


class CoderLeverConfig(BaseModel):
    """The coder lever's learner (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min_tasks: int = Field(30, ge=2, description="tasks of known verdict each model needs before a pin is judged")
    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="two-sided level of the bootstrap intervals")
    bootstrap: int = Field(2000, ge=100, description="bootstrap resamples (of sessions)")
    seed: int = Field(0, description="the bootstrap's seed")


@dataclass
class CoderLeverDecision:
    promote: bool
    model: str | None  # the coder model to pin (None: keep the table)
    reason: str
    per_model: dict = field(default_factory=dict)  # model -> {tasks, verified, gpu_seconds, usd, objective, ci}
    differences: dict = field(default_factory=dict)  # "a - b" -> {estimate, ci}
    tasks: int = 0
    unjoined: int = 0

    def to_dict(self) -> dict:
        return dict(vars(self))


def coder_tasks(dataset: pd.DataFrame, outcomes: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """One row per task: the model of the coder's first decision (the file the task started from) joined
    to the task's outcome. ``dataset``: the routing dataset (role, model, session_id, task_id,
    episode_id = ``<session>/<task>[#n]``, step); ``outcomes``: the task outcomes. Returns the rows and
    how many coder tasks found no outcome."""
    coder = dataset[dataset["role"].astype(str) == "coder"]
    if coder.empty:
        cols = dict.fromkeys(["session_id", "task_id", "episode", "model", *outcomes.columns])
        return pd.DataFrame(columns=list(cols)), 0
    ep = coder["episode_id"].astype(str).str.extract(r"#(\d+)$")[0]
    ep = pd.to_numeric(ep, errors="coerce").fillna(0).astype(int)
    coder = coder.assign(episode=ep, session_id=coder["session_id"].astype(str), task_id=coder["task_id"].astype(str))
    order = [c for c in ("step", "timestamp_utc", "source_line") if c in coder]
    first = coder.sort_values(order, kind="stable").groupby(["session_id", "task_id", "episode"], sort=False).head(1)
    out = outcomes.assign(session_id=outcomes["session_id"].astype(str), task_id=outcomes["task_id"].astype(str))
    joined = first[["session_id", "task_id", "episode", "model"]].merge(
        out, on=["session_id", "task_id", "episode"], how="left", suffixes=("", "_outcome"))
    unjoined = int(joined["ended"].isna().sum()) if "ended" in joined else len(joined)
    return joined[joined["ended"].notna()].reset_index(drop=True), unjoined


def decide(tasks: pd.DataFrame, objective: TaskObjective, config: CoderLeverConfig | None = None,
           current: str | None = None) -> CoderLeverDecision:
    """The coder lever's decision from :func:`coder_tasks`' rows (see the module doc). ``current``: the
    model the table already pins (a pin to it again is no promotion).

    **Valid for one night only.** The interval is a one-look interval on all logs so far, the logs are the
    adaptive choices of SAGE's bandit, and a pin stops the other model's data: decided every night it pins
    one of two equal models in about 28% of months within 30 nights and never reverts. Use the ledger's
    coder lever (``sage_pipeline.decisions.coder``) for a decision that holds for a month."""
    cfg = config or CoderLeverConfig()
    known = tasks[tasks["verified"].notna()]
    score = objective.score(known["verified"].to_numpy(float), known["gpu_seconds"].to_numpy(float),
                            known["usd"].to_numpy(float))
    known = known.assign(objective=score)
    models = sorted(known["model"].astype(str).unique())
    alpha = 1.0 - cfg.confidence
    rng = np.random.default_rng(cfg.seed)
    sessions = known["session_id"].astype(str).to_numpy()
    uniq, inv = np.unique(sessions, return_inverse=True)
    # one bootstrap of sessions, shared by every model and difference (paired)
    weights = rng.multinomial(len(uniq), np.full(len(uniq), 1.0 / len(uniq)), size=cfg.bootstrap)[:, inv] \
        if len(uniq) else np.zeros((cfg.bootstrap, 0))
    per, boot = {}, {}
    for m in models:
        sel = (known["model"].astype(str) == m).to_numpy()
        sub = known[sel]
        w = weights[:, sel]
        tot = w.sum(axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):
            b = (w * sub["objective"].to_numpy()).sum(axis=1) / tot
        boot[m] = b
        lo, hi = np.nanquantile(b, [alpha / 2, 1 - alpha / 2]) if np.isfinite(b).any() else (np.nan, np.nan)
        per[m] = {"tasks": int(sel.sum()), "verified": float(sub["verified"].mean()),
                  "gpu_seconds": float(sub["gpu_seconds"].mean()), "usd": float(sub["usd"].mean()),
                  "calls": float(sub["calls"].mean()), "objective": float(sub["objective"].mean()),
                  "ci": [float(lo), float(hi)]}
    diffs = {}
    for a in models:
        for b in models:
            if a < b:
                d = boot[a] - boot[b]
                lo, hi = np.nanquantile(d, [alpha / 2, 1 - alpha / 2]) if np.isfinite(d).any() else (np.nan, np.nan)
                diffs[f"{a} - {b}"] = {"estimate": per[a]["objective"] - per[b]["objective"],
                                       "ci": [float(lo), float(hi)]}
    base = CoderLeverDecision(False, None, "", per, diffs, int(len(known)))
    if not models:
        base.reason = ("no coder decision joined to a task outcome (the coder's model is read from the reviewer "
                       "steps of SAGE's `sage run` journals): nothing to learn about the coder yet")
        return base
    if len(models) < 2:
        base.reason = (f"the logs hold the coder on {models[0]} only: nothing to compare. SAGE's bandit tries both "
                       "of the coder's models in a fresh workspace; a table that pins the coder logs one")
        return base
    best = max(models, key=lambda m: per[m]["objective"])
    short = {m: cfg.min_tasks - per[m]["tasks"] for m in models if per[m]["tasks"] < cfg.min_tasks}
    if short:
        base.reason = ("too few tasks to judge the coder's model: " + ", ".join(
            f"{m} needs {n} more" for m, n in short.items()) + f" (min_tasks {cfg.min_tasks})")
        return base
    lows = {}
    for m in models:
        if m == best:
            continue
        key = f"{best} - {m}" if best < m else f"{m} - {best}"
        ci = diffs[key]["ci"]
        lows[m] = ci[0] if best < m else -ci[1]
    losing = {m: lo for m, lo in lows.items() if not lo > 0}
    if losing:
        m, lo = next(iter(losing.items()))
        key = f"{best} - {m}" if best < m else f"{m} - {best}"
        half = (diffs[key]["ci"][1] - diffs[key]["ci"][0]) / 2
        gap = per[best]["objective"] - per[m]["objective"]
        n_now = min(per[best]["tasks"], per[m]["tasks"])
        # the interval's half-width shrinks as 1/sqrt(n): the tasks per model at which it would equal the gap
        need = int(np.ceil(n_now * (half / gap) ** 2)) if gap > 0 and np.isfinite(half) else None
        base.reason = (f"{best} is ahead ({per[best]['objective']:.4f} vs {per[m]['objective']:.4f} under "
                       f"{objective.name}) but the {cfg.confidence:.0%} interval of the difference reaches "
                       f"{lo:.4f}: not separated" + (f"; about {need} tasks per model would separate a gap this "
                                                    f"size (now {n_now})" if need else ""))
        return base
    if best == current:
        base.reason = f"{best} is the best coder model and the table already pins it"
        base.model = best
        return base
    base.promote, base.model = True, best
    base.reason = (f"pin the coder to {best}: {objective.name} {per[best]['objective']:.4f} vs "
                   + ", ".join(f"{m} {per[m]['objective']:.4f}" for m in models if m != best)
                   + f", the difference's {cfg.confidence:.0%} interval above 0 (lower end "
                   + ", ".join(f"{lo:.4f}" for lo in lows.values()) + ")")
    return base


def traces_by_session(trajectories: pd.DataFrame) -> dict[str, str]:
    """Session id -> SAGE's ``trace_id`` (the ``SAGE_TRACE_ID`` a run was started with: the draw id of the
    launcher that assigned it) from ``trajectories.parquet``'s ``session_id`` and ``trace_id`` columns; sessions
    without one are left out. A session logged with two trace ids is an error (one ``sage run``, one env)."""
    if trajectories.empty or "trace_id" not in trajectories:
        return {}
    t = trajectories[["session_id", "trace_id"]].dropna()
    t = t[t["trace_id"].astype(str).str.strip() != ""].astype(str).drop_duplicates()
    dup = t[t["session_id"].duplicated(keep=False)]
    if not dup.empty:
        sid = dup["session_id"].iloc[0]
        raise ValueError(f"session {sid} was logged with trace ids {sorted(dup[dup['session_id'] == sid]['trace_id'])}"
                         ": one sage run has one SAGE_TRACE_ID; its journal mixes runs")
    return dict(zip(t["session_id"], t["trace_id"]))


def ledger_runs(dataset: pd.DataFrame, outcomes: pd.DataFrame, objective: TaskObjective,
                traces: dict[str, str]) -> list[CoderRun]:
    """One :class:`~sage_pipeline.decisions.coder.CoderRun` per session of ``outcomes`` (a ``sage run``): its
    task_v1 (``objective.score``) averaged over its tasks of known verdict (None when none is known), the model
    of its first coder task (:func:`coder_tasks`; None when SAGE never reached the coder), and its draw id
    ``traces[session]`` (None: not randomised). Every task of the run counts, the coder's or not: the draw
    assigned the run (intent to treat)."""
    if outcomes.empty:
        return []
    tasks, _ = coder_tasks(dataset, outcomes)
    first = {}
    if not tasks.empty:
        t = tasks.sort_values(["session_id", "episode"], kind="stable")
        first = t.groupby("session_id", sort=False)["model"].first().astype(str).to_dict()
    o = outcomes.assign(session_id=outcomes["session_id"].astype(str))
    known = o[o["verified"].notna()]
    score = objective.score(known["verified"].to_numpy(float), known["gpu_seconds"].to_numpy(float),
                            known["usd"].to_numpy(float))
    mean = pd.Series(score, index=known.index).groupby(known["session_id"]).mean().to_dict()
    size = o.groupby("session_id").size().to_dict()
    return [CoderRun(sid, traces.get(sid), mean.get(sid), first.get(sid), int(size[sid]))
            for sid in dict.fromkeys(o["session_id"])]
