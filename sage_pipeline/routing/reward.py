"""Versioned reward functions.

``reward_v1`` keeps SAGE's semantics: the reviewer score, +0.25 when verification
passed, -0.15 when it failed, a timeout penalty and a retry penalty per earlier attempt,
clamped to [-2, 2]. SAGE logs this value, so for logged data ``reward_v1`` *is* the
logged reward; :func:`sage_step_reward` computes it from the outcome for the simulator.
``reward_v2`` subtracts the call's cost (``cost_weight`` per USD) and clamps again.
Every dataset row records the version that produced its reward.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN

RewardVersion = Literal["reward_v1", "reward_v2"]
REWARD_VERSIONS = get_args(RewardVersion)

# Declared once, used by RewardSpec and by DatasetRewardSpec (the part a dataset chooses)
_VERSION = Field("reward_v1", description="reward_v1: SAGE's reward as logged; reward_v2: reward_v1 minus "
                                          "cost_weight per USD of the call's cost, clamped again")
_COST_WEIGHT = Field(5.0, ge=0.0, description="reward_v2: reward units subtracted per USD of cost (>= 0)")


class RewardSpec(BaseModel):
    """A reward function: its version and reward_v1's components (what SAGE computes and the
    routing simulator reproduces). Its JSON form (``model_dump``) is what datasets record."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: RewardVersion = _VERSION
    verified_bonus: float = Field(0.25, description="reward_v1: added when verification passed")
    failed_verification_penalty: float = Field(0.15, description="reward_v1: subtracted when verification failed")
    timeout_penalty: float = Field(0.5, description="reward_v1: subtracted when the attempt timed out (instead of "
                                   "the verification bonus or penalty)")
    retry_penalty: float = Field(0.1, description="reward_v1: subtracted per earlier attempt of the same task")
    cost_weight: float = _COST_WEIGHT


class DatasetRewardSpec(BaseModel):
    """The part of :class:`RewardSpec` a dataset chooses: the version and reward_v2's cost weight.
    reward_v1's components are SAGE's, already in the logged reward; a dataset never sets them
    (``RewardSpec(**choice.model_dump())`` is the whole spec)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: RewardVersion = _VERSION
    cost_weight: float = _COST_WEIGHT


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
