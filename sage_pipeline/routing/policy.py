"""The policy contract and the policies that need no training.

A policy has an ordered tuple of actions (model ids, the catalogue's order), a per-role
mask of allowed actions, and ``action_probs(contexts) -> (n, K)`` whose rows sum to 1
and put no mass on masked actions. The static YAML table, the learned policies, the
simulators' oracle and the behaviour policy all implement it; OPE, ground truth and the
promotion gate consume nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.features import Contexts
from sage_pipeline.sage.table import RoutingTable


@runtime_checkable
class Policy(Protocol):
    name: str
    actions: tuple[str, ...]
    role_mask: np.ndarray  # (n_roles, K) bool

    def action_probs(self, ctx: Contexts) -> np.ndarray: ...


def check_probs(policy: Policy, ctx: Contexts, probs: np.ndarray, atol: float = 1e-6) -> np.ndarray:
    """Validate a policy's output: shape, finiteness, rows summing to 1, mask respected."""
    n, k = len(ctx), len(policy.actions)
    if probs.shape != (n, k):
        raise ValueError(f"policy {policy.name!r} returned shape {probs.shape}, expected {(n, k)}")
    if not np.isfinite(probs).all() or (probs < -atol).any():
        raise ValueError(f"policy {policy.name!r} returned non-finite or negative probabilities")
    if not np.allclose(probs.sum(axis=1), 1.0, atol=atol):
        raise ValueError(f"policy {policy.name!r}: probability rows do not sum to 1")
    masked = ~policy.role_mask[ctx.role]
    if (probs[masked] > atol).any():
        raise ValueError(f"policy {policy.name!r} puts mass on actions that are not candidates for the role")
    return probs


@dataclass(frozen=True)
class StaticTablePolicy:
    """SAGE's static YAML table: the primary, or the fallback when a trigger fires."""

    table: RoutingTable
    catalogue: ModelCatalogue
    name: str = "static_table"

    @property
    def actions(self) -> tuple[str, ...]:
        return self.catalogue.actions

    @property
    def role_mask(self) -> np.ndarray:
        return self.catalogue.role_mask()

    def choose(self, ctx: Contexts) -> np.ndarray:
        return self.table.choose(self.catalogue, ctx.role, ctx.task_complexity_score,
                                 ctx.primary_failure_count, ctx.failure_count)

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        out = np.zeros((len(ctx), len(self.actions)))
        out[np.arange(len(ctx)), self.choose(ctx)] = 1.0
        return out


@dataclass(frozen=True)
class UniformPolicy:
    """Uniform over the role's candidate models."""

    actions: tuple[str, ...]
    role_mask: np.ndarray
    name: str = "uniform"

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        m = self.role_mask[ctx.role].astype(np.float64)
        return m / m.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class EpsilonGreedyPolicy:
    """With probability epsilon a uniform candidate, else the base policy's choice.

    This is the synthetic collector's behaviour policy; its probabilities are the logged
    propensities.
    """

    base: Policy
    epsilon: float
    name: str = "behaviour"

    def __post_init__(self) -> None:
        if not 0.0 <= self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {self.epsilon}")

    @property
    def actions(self) -> tuple[str, ...]:
        return self.base.actions

    @property
    def role_mask(self) -> np.ndarray:
        return self.base.role_mask

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        uniform = UniformPolicy(self.actions, self.role_mask).action_probs(ctx)
        return (1.0 - self.epsilon) * self.base.action_probs(ctx) + self.epsilon * uniform


def sample_actions(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One action per row by inverse CDF, vectorised."""
    cdf = np.cumsum(probs, axis=1)
    u = (1.0 - rng.random((probs.shape[0], 1))) * cdf[:, -1:]  # in (0, total]: never a zero-mass action
    return np.minimum((u > cdf).sum(axis=1), probs.shape[1] - 1)
