"""Versioned reward functions.

``reward_v1`` keeps SAGE's semantics: the reviewer score, +0.25 when verification
passed, -0.15 when it failed, a timeout penalty and a retry penalty per earlier attempt,
clamped to [-2, 2]. SAGE logs this value, so for logged data ``reward_v1`` *is* the
logged reward; :func:`sage_step_reward` computes it from the outcome for the simulator.
``reward_v2`` subtracts the call's cost (``cost_weight`` per USD) and clamps again: it
needs a price for every model, which SAGE's local Ollama models do not have.
``reward_v3_tokens_seconds`` is for them: reward_v1 minus ``tokens_weight`` per 1,000 tokens
(prompt + completion, from SAGE's ``TOKEN_USAGE`` lines) and ``seconds_weight`` per second of
the decision's model calls (from the journal's timestamps), clamped again; no price is needed.
Under reward_v1 the cost columns (tokens, seconds, USD where a model has a price) are
reported beside the reward but not subtracted. Every dataset row records the version that
produced its reward.

For SAGE's ``sage run`` journals the logged step reward is not reward_v1: the reviewer's
step logs ``review.score`` and the debugger's and the orchestrator's log 0
(orchestrator/workflow.py ``verification_gate``, ``debug_agent``, ``circuit_breaker``).
SAGE computes its reward_v1 when it exports (rl/reward.py ``composite_reward``), and
:func:`sage_composite_reward` is that function, vectorised, applied to each decision's outcome.
"""

from __future__ import annotations

from typing import Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_serializer

from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN

# the simulators' versions (sim/env.py, sim/loop_config.py): their rewards have a USD cost
RewardVersion = Literal["reward_v1", "reward_v2"]
# a dataset's versions: also the one for logs of models without prices (SAGE's local Ollama tags)
DatasetRewardVersion = Literal["reward_v1", "reward_v2", "reward_v3_tokens_seconds"]
REWARD_VERSIONS = get_args(DatasetRewardVersion)

# Declared once, used by RewardSpec and by DatasetRewardSpec (the part a dataset chooses)
_VERSION = Field("reward_v1", description="reward_v1: SAGE's reward as logged; reward_v2: reward_v1 minus "
                                          "cost_weight per USD of the call's cost, clamped again")
_DATASET_VERSION = Field("reward_v1", description="reward_v1: SAGE's reward (cost reported beside it, not "
                                                  "subtracted); reward_v2: reward_v1 minus cost_weight per USD of the "
                                                  "call's cost, clamped again (every model needs a price); "
                                                  "reward_v3_tokens_seconds: reward_v1 minus tokens_weight per 1,000 "
                                                  "tokens and seconds_weight per second of the decision's model "
                                                  "calls, clamped again (no price needed: SAGE's local models)")
_COST_WEIGHT = Field(5.0, ge=0.0, description="reward_v2: reward units subtracted per USD of cost (>= 0)")
_TOKENS_WEIGHT = Field(0.01, ge=0.0, description="reward_v3_tokens_seconds: reward units subtracted per 1,000 "
                                                "tokens (prompt + completion) of the decision's calls (>= 0)")
_SECONDS_WEIGHT = Field(0.002, ge=0.0, description="reward_v3_tokens_seconds: reward units subtracted per second "
                                                  "of the decision's model calls (>= 0)")
TOKENS_SECONDS = "reward_v3_tokens_seconds"


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


class LocalCostRewardSpec(RewardSpec):
    """:class:`RewardSpec` of a routing dataset, which may also be ``reward_v3_tokens_seconds``
    (for models without prices: cost is tokens and seconds). Serialised like a RewardSpec under
    reward_v1 and reward_v2 (the two weights only appear under reward_v3_tokens_seconds), and
    :func:`dataset_reward_spec` gives a plain RewardSpec for those, so a dataset's recorded spec
    still equals the simulator's."""

    version: DatasetRewardVersion = _DATASET_VERSION
    tokens_weight: float = _TOKENS_WEIGHT
    seconds_weight: float = _SECONDS_WEIGHT

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        out = handler(self)
        if self.version != TOKENS_SECONDS:
            out.pop("tokens_weight", None)
            out.pop("seconds_weight", None)
        return out


def dataset_reward_spec(spec: dict | RewardSpec) -> RewardSpec:
    """A dataset's reward spec: a plain :class:`RewardSpec` for reward_v1 and reward_v2 (equal to
    the simulator's), a :class:`LocalCostRewardSpec` for reward_v3_tokens_seconds."""
    data = spec.model_dump() if isinstance(spec, BaseModel) else dict(spec)
    if data.get("version") == TOKENS_SECONDS:
        return LocalCostRewardSpec(**data)
    data.pop("tokens_weight", None)  # a DatasetRewardSpec's: they mean nothing under the other versions
    data.pop("seconds_weight", None)
    return RewardSpec(**data)


class DatasetRewardSpec(BaseModel):
    """The part of :class:`RewardSpec` a dataset chooses: the version, reward_v2's cost weight and
    reward_v3_tokens_seconds' weights. reward_v1's components are SAGE's, already in the logged
    reward; a dataset never sets them (``dataset_reward_spec(choice)`` is the whole spec)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: DatasetRewardVersion = _DATASET_VERSION
    cost_weight: float = _COST_WEIGHT
    tokens_weight: float = _TOKENS_WEIGHT
    seconds_weight: float = _SECONDS_WEIGHT


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


def sage_composite_reward(trajectory_reward: np.ndarray, verification_passed: np.ndarray, terminal: np.ndarray,
                          failed_reason: np.ndarray) -> np.ndarray:
    """SAGE's reward_v1, ``sage.rl.reward.composite_reward`` with its defaults (retry_penalty
    0.05, timeout_penalty 1.0), vectorised: the step reward, +0.25 when verification passed,
    -0.15 when it failed (NaN: not verified, neither), -1.0 when ``failed_reason`` contains
    "timeout", -0.1 when it contains "retry", -0.2 more on a terminal step whose reason
    contains "fail"; clamped to [-2, 2]. ``failed_reason``: strings or None (case-insensitive)."""
    r = np.asarray(trajectory_reward, dtype=np.float64).copy()
    vp = np.asarray(verification_passed, dtype=np.float64)
    r += 0.25 * (vp == 1.0) - 0.15 * (vp == 0.0)
    fr = np.array([str(x or "").lower() for x in failed_reason], dtype=object)
    has = lambda word: np.array([word in x for x in fr], dtype=bool)  # noqa: E731
    retry = np.array([("retry" in x) or x == "retry_limit" for x in fr], dtype=bool)
    r -= 1.0 * has("timeout") + 0.05 * 2.0 * retry + 0.2 * (np.asarray(terminal, dtype=bool) & has("fail"))
    return np.clip(r, REWARD_MIN, REWARD_MAX)


def apply_version(reward_v1: np.ndarray, cost_usd: np.ndarray, spec: RewardSpec,
                  tokens: np.ndarray | None = None, seconds: np.ndarray | None = None) -> np.ndarray:
    """The reward under ``spec.version`` given the SAGE (v1) reward and the call's cost: USD
    (reward_v2), or ``tokens`` and ``seconds`` (reward_v3_tokens_seconds; NaN counts as 0: a
    decision whose calls left no TOKEN_USAGE, e.g. a timed-out call)."""
    r1 = np.asarray(reward_v1, dtype=np.float64)
    if spec.version == "reward_v1":
        return r1
    if spec.version == TOKENS_SECONDS:
        if tokens is None or seconds is None:
            raise ValueError("reward_v3_tokens_seconds needs each decision's tokens and seconds (the routing dataset "
                             "has them from TOKEN_USAGE and timestamps); use reward_v1 or reward_v2 here")
        tok = np.nan_to_num(np.asarray(tokens, dtype=np.float64), nan=0.0)
        sec = np.nan_to_num(np.asarray(seconds, dtype=np.float64), nan=0.0)
        return np.clip(r1 - spec.tokens_weight * tok / 1000.0 - spec.seconds_weight * sec, REWARD_MIN, REWARD_MAX)
    return np.clip(r1 - spec.cost_weight * np.asarray(cost_usd, dtype=np.float64), REWARD_MIN, REWARD_MAX)
