"""Versioned reward functions.

``reward_v1`` keeps SAGE's semantics: the reviewer score, +0.25 when verification
passed, -0.15 when it failed, a timeout penalty and a retry penalty per earlier attempt,
clamped to [-2, 2]. SAGE logs this value, so for logged data ``reward_v1`` *is* the
logged reward; :func:`sage_step_reward` computes it from the outcome for the simulator.
``reward_v2`` subtracts the call's cost (``cost_weight`` per USD) and clamps again.
Every dataset row records the version that produced its reward.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN

REWARD_VERSIONS = ("reward_v1", "reward_v2")


@dataclass(frozen=True)
class RewardSpec:
    version: str = "reward_v1"
    verified_bonus: float = 0.25
    failed_verification_penalty: float = 0.15
    timeout_penalty: float = 0.5
    retry_penalty: float = 0.1  # per earlier attempt of the same task
    cost_weight: float = 5.0  # reward_v2: reward units per USD

    def __post_init__(self) -> None:
        if self.version not in REWARD_VERSIONS:
            raise ValueError(f"unknown reward_version {self.version!r}; choose one of {', '.join(REWARD_VERSIONS)}")
        if self.cost_weight < 0:
            raise ValueError(f"cost_weight must be >= 0, got {self.cost_weight}")


def sage_step_reward(reviewer_score: np.ndarray, verification_passed: np.ndarray, timed_out: np.ndarray,
                     step: np.ndarray, spec: RewardSpec = RewardSpec()) -> np.ndarray:
    """SAGE's step reward (reward_v1) from an attempt's outcome, vectorised.

    A timed-out attempt scores 0 and takes the timeout penalty instead of the verification
    bonus or penalty (SAGE logs it with ``verification_passed: false``).
    """
    score = np.where(timed_out, 0.0, np.asarray(reviewer_score, dtype=np.float64))
    passed = np.asarray(verification_passed, dtype=bool) & ~np.asarray(timed_out, dtype=bool)
    failed = ~np.asarray(verification_passed, dtype=bool) & ~np.asarray(timed_out, dtype=bool)
    r = (score + spec.verified_bonus * passed - spec.failed_verification_penalty * failed
         - spec.timeout_penalty * np.asarray(timed_out, dtype=bool)
         - spec.retry_penalty * np.asarray(step, dtype=np.float64))
    return np.clip(r, REWARD_MIN, REWARD_MAX)


def apply_version(reward_v1: np.ndarray, cost_usd: np.ndarray, spec: RewardSpec) -> np.ndarray:
    """The reward under ``spec.version`` given the SAGE (v1) reward and the call's cost."""
    r1 = np.asarray(reward_v1, dtype=np.float64)
    if spec.version == "reward_v1":
        return r1
    return np.clip(r1 - spec.cost_weight * np.asarray(cost_usd, dtype=np.float64), REWARD_MIN, REWARD_MAX)
