"""A numpy-only router for deployments that can choose among many models.

It serves any policy of the contract (``sage_pipeline.rl.load_policy(path)`` for a
checkpoint) with the same rule as SAGE's hook: the policy acts only when it is confident
enough, else the YAML table decides.

* **Confidence** for K models is the policy's top probability among the role's candidates
  (for SAGE's two models ``abs(p - 0.5) * 2`` is the same ordering on another scale:
  top probability ``q`` is ``abs(p - 0.5) * 2 == 2q - 1``). At or above ``min_confidence``
  the router takes the policy's argmax, below it the table's choice.
* **Exploration**: with ``epsilon > 0`` the router takes that rule's model with probability
  ``1 - epsilon`` and a uniform candidate of the role with probability ``epsilon``. The
  logged ``propensity`` is the exact probability of the model taken under that mixed rule,
  ``(1 - epsilon) * [model == rule's model] + epsilon / n_candidates``.

Every decision can be journaled as SAGE's ``MODEL_ROUTING_DECISION`` plus the extension key
``propensity``, one JSON line appended to a session journal, so the next night's logs carry
logged propensities for OPE. ``policy_source`` is ``"yaml"`` when the table's rule decided
and the router took the table's model, else ``"learned"`` (the confident policy, or
exploration, chose).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from sage_pipeline.routing.features import Contexts

MRD = "MODEL_ROUTING_DECISION"


@dataclass(frozen=True)
class RouterConfig:
    min_confidence: float = 0.55  # SAGE's default floor, here on the top-probability scale
    epsilon: float = 0.0  # exploration: uniform over the role's candidates
    seed: int | None = None

    def __post_init__(self) -> None:
        for k in ("min_confidence", "epsilon"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and 0.0 <= v <= 1.0):
                raise ValueError(f"{k} must lie in [0, 1], got {v!r}")


@dataclass(frozen=True)
class RouteDecision:
    model: str
    probability: float  # of ``model`` under the router's rule, exploration included (the propensity)
    policy_source: str  # "learned" or "yaml" (see the module doc)
    confidence: float  # the policy's top probability among the role's candidates
    yaml_model: str  # what the table alone would have chosen
    explored: bool  # the model differs from the rule's (exploration took it)
    event: dict  # the MODEL_ROUTING_DECISION journaled

    @property
    def propensity(self) -> float:
        return self.probability


class Router:
    """``route(role, ...)`` for one decision at a time; see the module doc for the rule."""

    def __init__(self, policy, table, space, min_confidence: float = 0.55, epsilon: float = 0.0,
                 seed: int | None = None, journal: str | Path | None = None) -> None:
        self.config = RouterConfig(min_confidence, epsilon, seed)
        name = getattr(policy, "name", type(policy).__name__)
        if tuple(policy.actions) != tuple(space.actions):
            raise ValueError(f"policy {name!r} actions {tuple(policy.actions)} differ from the action space's "
                             f"{tuple(space.actions)}: load the checkpoint trained on this routing dataset")
        if tuple(space.roles) != tuple(table.roles):
            raise ValueError(f"action space {space.source} roles {space.roles} differ from the table "
                             f"{table.source}'s {table.roles}: build the space from this table")
        role_mask = np.asarray(policy.role_mask, dtype=bool)
        if role_mask.shape != space.mask.shape:
            raise ValueError(f"policy {name!r} role_mask has shape {role_mask.shape}, the action space "
                             f"{space.source} {space.mask.shape} (roles x models): not a policy of this space")
        extra = np.argwhere(role_mask & ~space.mask)
        if len(extra):
            r, k = extra[0]
            raise ValueError(f"policy {name!r} may choose {space.actions[k]!r} for role {space.roles[r]!r}, which "
                             f"the action space {space.source} does not allow ({len(extra)} such pairs)")
        self.policy, self.table, self.space = policy, table, space
        self.min_confidence, self.epsilon = float(min_confidence), float(epsilon)
        self.rng = np.random.default_rng(seed)
        self.journal = Path(journal) if journal is not None else None
        self._primary = table.primary_index(space)
        self._fallback = table.fallback_index(space)

    # ------------------------------------------------------------------ the rule
    def _context(self, role: str, task_complexity_score: float, primary_failure_count: int, failure_count: int,
                 step: int, prompt_tokens: float | None) -> Contexts:
        if role not in self.space.role_index:
            raise ValueError(f"role {role!r} is not routed by the table {self.table.source} "
                             f"(roles: {', '.join(self.space.roles)})")
        tcs = float(task_complexity_score)
        if not (math.isfinite(tcs) and 0.0 <= tcs <= 1.0):
            raise ValueError(f"task_complexity_score must lie in [0, 1], got {task_complexity_score!r} "
                             f"(role {role!r})")
        counts = {"primary_failure_count": primary_failure_count, "failure_count": failure_count, "step": step}
        for k, v in counts.items():
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 0:
                raise ValueError(f"{k} must be an integer >= 0, got {v!r} (role {role!r})")
        tokens = np.nan if prompt_tokens is None else float(prompt_tokens)
        return Contexts(role=np.array([self.space.role_index[role]]), task_complexity_score=np.array([tcs]),
                        prompt_tokens=np.array([tokens]), step=np.array([int(step)]),
                        failure_count=np.array([int(failure_count)]),
                        primary_failure_count=np.array([int(primary_failure_count)]))

    def _rule(self, ctx: Contexts) -> tuple[np.ndarray, int, str, float, int]:
        """(role mask, the rule's column, "learned"/"yaml", confidence, the table's column)."""
        mask = self.space.mask[ctx.role[0]]
        p = np.where(mask, np.asarray(self.policy.action_probs(ctx), dtype=np.float64)[0], 0.0)
        confidence = float(p.max())
        yaml_col = int(self.table.choose(self.space, ctx.role, ctx.task_complexity_score,
                                         ctx.primary_failure_count, ctx.failure_count)[0])
        if confidence >= self.min_confidence:
            return mask, int(p.argmax()), "learned", confidence, yaml_col
        return mask, yaml_col, "yaml", confidence, yaml_col

    def _mix(self, mask: np.ndarray, rule_col: int) -> np.ndarray:
        return (1.0 - self.epsilon) * np.eye(len(mask))[rule_col] + self.epsilon * mask / mask.sum()

    def probabilities(self, role: str, task_complexity_score: float, primary_failure_count: int,
                      failure_count: int, step: int = 0, prompt_tokens: float | None = None) -> np.ndarray:
        """(K,) the router's probability of each model for one decision, exploration included."""
        ctx = self._context(role, task_complexity_score, primary_failure_count, failure_count, step, prompt_tokens)
        mask, rule_col, *_ = self._rule(ctx)
        return self._mix(mask, rule_col)

    def route(self, role: str, task_complexity_score: float, primary_failure_count: int, failure_count: int,
              step: int = 0, prompt_tokens: float | None = None) -> RouteDecision:
        ctx = self._context(role, task_complexity_score, primary_failure_count, failure_count, step, prompt_tokens)
        mask, rule_col, source, confidence, yaml_col = self._rule(ctx)
        probs = self._mix(mask, rule_col)
        a = int(self.rng.choice(len(probs), p=probs))
        explored = a != rule_col
        source = "yaml" if source == "yaml" and a == yaml_col else "learned"
        event = self.event(role, task_complexity_score, primary_failure_count, failure_count,
                           self.space.actions[a], source, float(probs[a]))
        if self.journal is not None:
            self._append(event)
        return RouteDecision(self.space.actions[a], float(probs[a]), source, confidence,
                             self.space.actions[yaml_col], explored, event)

    # ------------------------------------------------------------------ the journal
    def event(self, role: str, task_complexity_score: float, primary_failure_count: int, failure_count: int,
              selected: str, policy_source: str, propensity: float) -> dict:
        """SAGE's MODEL_ROUTING_DECISION for one decision, plus ``propensity``, shaped as SAGE's
        ``log_event`` shapes it: UTC timestamp, payload, then the ids from the environment."""
        r = self.space.role_index[role]
        values = {"task_complexity_score": np.array([float(task_complexity_score)]),
                  "primary_failure_count": np.array([int(primary_failure_count)]),
                  "failure_count": np.array([int(failure_count)])}
        event = {"type": MRD, "timestamp": datetime.now(timezone.utc).isoformat(),
                 "agent_role": role, "task_complexity_score": float(task_complexity_score),
                 "primary_failure_count": int(primary_failure_count),
                 "primary_model": self.space.actions[self._primary[r]],
                 "fallback_model": self.space.actions[self._fallback[r]],
                 "selected_model": selected,
                 "matched_fallback_triggers": [str(t) for t in self.table.routes[role].triggers
                                               if t.fires(values)[0]],
                 "policy_source": policy_source, "propensity": propensity}
        return with_sage_ids(event)

    def _append(self, event: dict) -> None:
        """One JSON line appended with a single write (O_APPEND), as SAGE appends its journal;
        like SAGE's ``log_event``, also to ``SAGE_JSON_LOG_EXTRA_PATH`` when that is set."""
        line = (json.dumps(event, allow_nan=False) + "\n").encode("utf-8")
        extra = (os.environ.get("SAGE_JSON_LOG_EXTRA_PATH") or "").strip()
        for path in (self.journal, *([Path(extra)] if extra else [])):
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)


def with_sage_ids(event: dict) -> dict:
    """``event`` with the ids SAGE's ``log_event`` adds from its environment, after the payload
    and in its order: ``session_id`` when ``SAGE_SESSION_ID`` is set and not empty (``sage run``
    sets a fresh uuid per run), ``trace_id`` when ``SAGE_TRACE_ID`` is not blank (stripped).
    Without them the ingest can only join the line by its file's stem, and under ``sage run``
    every other line of the session carries the id."""
    out = dict(event)
    session_id = os.environ.get("SAGE_SESSION_ID")
    if session_id:
        out["session_id"] = session_id
    trace_id = (os.environ.get("SAGE_TRACE_ID") or "").strip()
    if trace_id:
        out["trace_id"] = trace_id
    return out
