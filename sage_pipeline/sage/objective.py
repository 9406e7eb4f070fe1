"""The objective SAGE's users are judged by: one ``sage run`` task, verified or not, and what it cost.

``task_v1`` scores a task as

    verified - gpu_second_weight * GPU-seconds - usd_weight * USD

``verified`` is 1 when SAGE's verification gate passed every task of the run (``orchestrator/
workflow.py``: the reviewer's terminal ``TRAJECTORY_STEP`` with ``state.verification_passed`` true,
written after "All gates passed"), 0 when SAGE gave up (a circuit breaker's terminal step, or a
terminal step without a pass). GPU-seconds are the user's local models' time on the task's calls;
USD is what the task's calls to priced (API) models cost.

Why this and not reward_v1: reward_v1 is SAGE's per-decision ``composite_reward`` (``rl/reward.py``),
kept exact for SAGE's own exporter and learners. Summed over a task it pays a file that fails review
and is repaired (0.3 - 0.15, then 0.9 + 0.25: 1.30) more than a first-try pass (1.15), so a router
that makes the coder fail more would look better. Under ``task_v1`` a repaired failure is worth the
same verified point and costs the extra calls, so it is never above the first-try pass
(:func:`score` is monotone: more calls, more seconds or more dollars never raise it).

The default weights (the user sets both):

* ``gpu_second_weight = 1/3600``: an hour of the user's GPU is worth one verified task. SAGE's users
  run local models, so time is what they pay; at that weight time decides between configurations of
  equal verified share, and outweighs one verified point only at an hour of GPU time a task.
* ``usd_weight = 0.2``: a verified task is worth five dollars of API calls.
"""

from __future__ import annotations

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

OBJECTIVE_NAME = "task_v1"


class TaskObjective(BaseModel):
    """The per-task objective (``task_v1``) and its two prices, each default declared here once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(OBJECTIVE_NAME, pattern=f"^{OBJECTIVE_NAME}$", description="the objective's versioned name")
    gpu_second_weight: float = Field(1.0 / 3600.0, ge=0.0, allow_inf_nan=False,
                                     description="verified tasks one GPU-second is worth (default: one per GPU-hour)")
    usd_weight: float = Field(0.2, ge=0.0, allow_inf_nan=False,
                              description="verified tasks one US dollar is worth (default: a task is worth $5)")

    def score(self, verified, gpu_seconds, usd) -> np.ndarray:
        """Vectorised: the objective of tasks with these outcomes (``verified`` 0/1 or bool)."""
        return score(self, verified, gpu_seconds, usd)

    def describe(self) -> str:
        return (f"{self.name}: verified - {self.gpu_second_weight:.6g} x GPU-seconds - {self.usd_weight:.6g} x USD "
                "per sage run task")


def score(objective: TaskObjective, verified, gpu_seconds, usd) -> np.ndarray:
    """``verified - w_s * gpu_seconds - w_usd * usd`` per task (or per expectation: a verified share and
    mean costs give the mean objective, the objective being linear). Costs must be finite and >= 0; a
    task whose verdict is unknown (NaN) scores NaN, never 0."""
    v = np.asarray(verified, dtype=np.float64)
    s = np.asarray(gpu_seconds, dtype=np.float64)
    d = np.asarray(usd, dtype=np.float64)
    for name, x in (("gpu_seconds", s), ("usd", d)):
        bad = ~np.isfinite(x) | (x < 0)
        if bad.any():
            raise ValueError(f"{objective.name}: {name} must be finite and >= 0; got {x[bad][:3].tolist()} "
                             f"({int(bad.sum())} tasks): fix the task outcomes before scoring them")
    known = np.isnan(v) | ((v >= 0) & (v <= 1))
    if not known.all():
        raise ValueError(f"{objective.name}: verified must be 0 or 1 for a task, a share in [0, 1] for an expectation, "
                         f"or NaN (unknown); got {v[~known][:3].tolist()}")
    return v - objective.gpu_second_weight * s - objective.usd_weight * d
