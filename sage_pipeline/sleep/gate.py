"""The gate: a candidate survives only if it is strictly better on the val split.

The score of a task is its ``hard`` result, its ``soft`` result, or the mix
``hard_weight * hard + (1 - hard_weight) * soft``; a split's score is the mean. A
candidate is accepted only when its mean is strictly above the baseline's (ties reject)
and, with ``no_regression`` (the default), when no single val task scores lower: an
average that rises while one task falls is rejected, and the report names the task.
The test split never enters here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.sleep.records import TaskResult

EPS = 1e-9


class GateConfig(BaseModel):
    """How the gate scores val and when a candidate survives."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    metric: Literal["hard", "soft", "mixed"] = Field(
        "mixed", description="a task's score: its hard result, its soft result, or hard_weight * hard + "
                             "(1 - hard_weight) * soft")
    hard_weight: float = Field(0.5, ge=0.0, le=1.0, description="weight of hard in the mixed metric, in [0, 1]")
    no_regression: bool = Field(True, description="reject a candidate that lowers any single val task, even if "
                                "the mean rises")
    granularity: Literal["edit", "bundle"] = Field(
        "edit", description="'edit': gate each edit on its own, in order; 'bundle': all together")
    mode: Literal["on", "off"] = Field(
        "on", description="'off' accepts every applicable edit (for comparison only; never the default)")

    def task_scores(self, results: Sequence[TaskResult]) -> np.ndarray:
        hard = np.fromiter((r.hard for r in results), float, len(results))
        soft = np.fromiter((r.soft for r in results), float, len(results))
        if self.metric == "hard":
            return hard
        if self.metric == "soft":
            return soft
        return self.hard_weight * hard + (1.0 - self.hard_weight) * soft

    def score(self, results: Sequence[TaskResult]) -> float | None:
        return float(self.task_scores(results).mean()) if results else None


def summary(results: Sequence[TaskResult], cfg: GateConfig) -> dict | None:
    """hard, soft and gate score of a replayed split (None when the split is empty)."""
    if not results:
        return None
    return {"hard": float(np.mean([r.hard for r in results])), "soft": float(np.mean([r.soft for r in results])),
            "score": cfg.score(results), "tasks": len(results)}


@dataclass
class Trial:
    """One gate decision: a candidate (some edits) against the state it would replace."""

    edits: list[str]
    baseline: float
    candidate: float
    accepted: bool
    verdict: str  # better | tie | worse | regression | gate_off
    reason: str
    improved: list[str] = field(default_factory=list)
    regressed: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def compare(base: Sequence[TaskResult], cand: Sequence[TaskResult], cfg: GateConfig,
            edits: list[str] | None = None) -> Trial:
    """Decide on a candidate from the val results of the state it would replace and its own."""
    if [r.task_id for r in base] != [r.task_id for r in cand]:
        raise ValueError("baseline and candidate were not replayed on the same val tasks")
    b, c = cfg.task_scores(base), cfg.task_scores(cand)
    ids = np.array([r.task_id for r in base], dtype=object)
    improved = [str(x) for x in ids[c > b + EPS]]
    regressed = [str(x) for x in ids[c < b - EPS]]
    mb, mc = float(b.mean()), float(c.mean())
    if cfg.mode == "off":
        return Trial(edits or [], mb, mc, True, "gate_off",
                     f"gate off: accepted without a check (val {mb:.3f} -> {mc:.3f})", improved, regressed)
    if mc <= mb + EPS:
        word = "tie" if abs(mc - mb) <= EPS else "worse"
        return Trial(edits or [], mb, mc, False, word,
                     f"{word}: val {cfg.metric} {mb:.3f} -> {mc:.3f} (accepted only if strictly better)",
                     improved, regressed)
    if cfg.no_regression and regressed:
        return Trial(edits or [], mb, mc, False, "regression",
                     f"val {cfg.metric} rose {mb:.3f} -> {mc:.3f} but {len(regressed)} "
                     f"val task(s) got worse ({', '.join(regressed[:5])}): no_regression rejects", improved, regressed)
    note = f"; {len(regressed)} val task(s) got worse ({', '.join(regressed[:5])})" if regressed else ""
    return Trial(edits or [], mb, mc, True, "better", f"strictly better: val {cfg.metric} {mb:.3f} -> {mc:.3f}{note}",
                 improved, regressed)
