"""A numpy-only router for deployments that can choose among many models.

It serves any policy of the contract (``sage_pipeline.rl.load_policy(path)`` for a
checkpoint) with the same rule as SAGE's hook: the policy acts only when it is confident
enough, else the YAML table decides. For K models, confidence is the policy's top
probability (for SAGE's two models, ``abs(p - 0.5) * 2`` is the same rule on another
scale). With ``epsilon > 0`` the router explores: with probability ``epsilon`` a uniform
candidate of the role. Every decision is journaled as SAGE's ``MODEL_ROUTING_DECISION``
plus ``propensity``, the exact probability of the model it took under this mixed rule, so
the next night's logs carry logged propensities for OPE.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from sage_pipeline.routing.features import Contexts


@dataclass(frozen=True)
class RouteDecision:
    model: str
    propensity: float  # probability of ``model`` under the router's rule (exploration included)
    policy_source: str  # "learned" (the policy was confident) or "yaml"
    confidence: float  # the policy's top probability for the role's candidates
    event: dict  # the MODEL_ROUTING_DECISION journaled


class Router:
    def __init__(self, policy, table, space, min_confidence: float = 0.55, epsilon: float = 0.0,
                 seed: int | None = None, journal: str | Path | None = None) -> None:
        if tuple(policy.actions) != tuple(space.actions):
            raise ValueError(f"policy actions {tuple(policy.actions)} differ from the action space's "
                             f"{tuple(space.actions)}: load the checkpoint trained on this routing dataset")
        if not 0.0 <= min_confidence <= 1.0 or not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"min_confidence and epsilon must lie in [0, 1], got {min_confidence}, {epsilon}")
        self.policy, self.table, self.space = policy, table, space
        self.min_confidence, self.epsilon = float(min_confidence), float(epsilon)
        self.rng = np.random.default_rng(seed)
        self.journal = Path(journal) if journal is not None else None

    def probabilities(self, role: str, task_complexity_score: float, primary_failure_count: int,
                      failure_count: int, step: int = 0, prompt_tokens: float | None = None) -> tuple[np.ndarray, str, float]:
        """The router's probability of each model for one decision, and who decides."""
        if role not in self.space.role_index:
            raise ValueError(f"role {role!r} is not routed by the table {self.table.source} "
                             f"(roles: {', '.join(self.space.roles)})")
        r = self.space.role_index[role]
        ctx = Contexts(role=np.array([r]), task_complexity_score=np.array([float(task_complexity_score)]),
                       prompt_tokens=np.array([np.nan if prompt_tokens is None else float(prompt_tokens)]),
                       step=np.array([int(step)]), failure_count=np.array([int(failure_count)]),
                       primary_failure_count=np.array([int(primary_failure_count)]))
        mask = self.space.mask[r]
        p = np.where(mask, self.policy.action_probs(ctx)[0], 0.0)
        confidence = float(p.max())
        if confidence >= self.min_confidence:
            base, source = np.eye(len(mask))[int(p.argmax())], "learned"
        else:
            yaml_col = self.table.choose(self.space, ctx.role, ctx.task_complexity_score, ctx.primary_failure_count,
                                         ctx.failure_count)[0]
            base, source = np.eye(len(mask))[yaml_col], "yaml"
        return (1.0 - self.epsilon) * base + self.epsilon * mask / mask.sum(), source, confidence

    def route(self, role: str, task_complexity_score: float, primary_failure_count: int, failure_count: int,
              step: int = 0, prompt_tokens: float | None = None) -> RouteDecision:
        probs, source, confidence = self.probabilities(role, task_complexity_score, primary_failure_count,
                                                       failure_count, step, prompt_tokens)
        a = int(self.rng.choice(len(probs), p=probs))
        r = self.space.role_index[role]
        values = {"task_complexity_score": np.array([task_complexity_score]),
                  "primary_failure_count": np.array([primary_failure_count]),
                  "failure_count": np.array([failure_count])}
        route = self.table.routes[role]
        explored = probs.max() < 1.0 and a != int(np.argmax(probs))
        event = {"type": "MODEL_ROUTING_DECISION", "timestamp": datetime.now(timezone.utc).isoformat(),
                 "agent_role": role, "task_complexity_score": float(task_complexity_score),
                 "primary_failure_count": int(primary_failure_count),
                 "primary_model": self.space.actions[self.space.primary[r]],
                 "fallback_model": self.space.actions[self.space.fallback[r]],
                 "selected_model": self.space.actions[a],
                 "matched_fallback_triggers": [str(t) for t in route.triggers if t.fires(values)[0]],
                 "policy_source": "learned" if (source == "learned" or explored) else "yaml",
                 "propensity": float(probs[a])}
        if self.journal is not None:
            self._append(event)
        return RouteDecision(self.space.actions[a], float(probs[a]), event["policy_source"], confidence, event)

    def _append(self, event: dict) -> None:
        """One JSON line appended with a single write (O_APPEND), as SAGE appends its journal."""
        self.journal.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(event) + "\n").encode("utf-8"))
        finally:
            os.close(fd)
