"""Off-policy evaluation (OPE): what a routing policy would have scored on the logged decisions.

Bandit estimators (one routing decision = one round) use the same formulas as the Open
Bandit Pipeline (obp 0.5.7, ``obp.ope.estimators``; ``benchmarks/ope_vs_obp.py`` checks
them against obp to 1e-8). With ``w_i = pi_e(a_i|x_i) / pi_b(a_i|x_i)`` and a reward
model ``q_hat``:

    IPS        mean(w r)                                   (obp InverseProbabilityWeighting)
    SNIPS      sum(w r) / sum(w)                           (SelfNormalizedInverseProbabilityWeighting)
    DM         mean(q_hat(x, pi_e))                        (DirectMethod)
    DR         mean(q_hat(x, pi_e) + w (r - q_hat(x, a)))  (DoublyRobust)
    SNDR       mean(q_hat(x, pi_e)) + sum(w (r - q_hat(x, a))) / sum(w)   (SelfNormalizedDoublyRobust)
    Switch-DR  DR with the correction dropped where w > lambda_            (SwitchDoublyRobust)

where ``q_hat(x, pi_e) = sum_a pi_e(a|x) q_hat(x, a)``. Multi-step episodes (a task's
attempts) have per-decision importance sampling (PDIS, Precup et al. 2000), step-wise
doubly robust (Jiang & Li 2016; Thomas & Brunskill 2016), its weighted (self-normalised)
form WDR (Thomas & Brunskill 2016), step-wise DR with clipped trajectory weights, and
fitted-Q evaluation (FQE, Le
et al. 2019: the direct method of episodes, no importance weights), whose target is the
expected episode return: the quantity the routing simulator's ``policy_value(...).mean``
gives. FQE has far less variance than the weighted estimators and a bias from its model:
it is what ranks candidate policies (CQL's alpha, see ``offline_eval.select_by_ope``).
Step-wise DR with its trajectory weights clipped on the residual terms at the largest
single-decision weight of the logs (``step_dr_clip``, :data:`HEADLINE_ESTIMATOR`,
``OPEConfig.clip_factor``) is what reports and gates: unbiased where the fitted Q-function
is right, and no single episode of a deterministic policy far from the logs can move it by
more than ``clip / n`` times its residuals
(plain step-wise DR was off by up to 65% in SAGE's binary space for that reason,
docs/benchmarks.md). The intervals of DM and
FQE hold the fitted model fixed and resample only the rows, so they ignore the model's
bias and cover the truth far less often than 95% (measured 32% to 76% on the simulator,
docs/benchmarks.md): read them as sampling noise, not as confidence intervals.

Every estimator returns an :class:`Estimate`: the value and the per-round (or
per-episode) terms that :func:`bootstrap_ci` resamples. :func:`evaluate_policy` runs all
of them on a :class:`LoggedData` with a cross-fitted reward model (:class:`LinearQ`, a
ridge regression; fitted-Q evaluation of the policy for step-wise DR), percentile-bootstrap
CIs, Kish effective sample sizes and a support check, and withholds every number when the
logs cannot support the policy (it puts mass on actions the behaviour policy never took
there). The episode-level step-wise DR is the headline: its target is the ground truth.
Intervals resample sessions (a cluster bootstrap: a session's decisions are one draw), and none is
computed below ``OPESettings.min_sessions`` sessions: ``PolicyEvaluation.interval_reason`` says how
many there are and are needed.

Pure numpy; imports no dagster, torch or obp.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Literal, Protocol

import numpy as np
from pydantic import BaseModel, ConfigDict, Field
from threadpoolctl import ThreadpoolController

from sage_pipeline.routing.features import Contexts, FeatureSpec
from sage_pipeline.routing.schema import ROLES

log = logging.getLogger(__name__)

BANDIT_ESTIMATORS = ("ips", "snips", "dm", "dr", "sndr", "switch_dr")
EPISODE_ESTIMATORS = ("pdis", "step_dr", "step_wdr", "step_dr_clip", "fqe")
# The episode-return estimate every report leads with and the promotion gate reads.
HEADLINE_ESTIMATOR = "step_dr_clip"
# policy_source of decisions no routing policy reaches: SAGE's coder is chosen by its UCB bandit
# (sage/agents/coder.py: ModelRouter.select is never called), so every policy follows the log there
FOLLOWS_LOG_SOURCES = ("ucb_bandit",)
DETERMINISTIC_PSCORE = 1.0 - 1e-9  # a logged propensity this close to 1: the behaviour had no other choice


class OPESettings(BaseModel):
    """The settings of off-policy evaluation a user may set (offline_eval's run config inherits
    them); :class:`OPEConfig` adds how a context is encoded."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_boot: int = Field(1000, ge=1, description="bootstrap replicates per estimator")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="1 - the confidence level of the percentile intervals")
    seed: int = Field(0, description="seed of the cross-fitting folds and the bootstrap")
    n_folds: int = Field(5, ge=2, description="cross-fitting folds, grouped by session (or episode)")
    ridge: float = Field(1.0, gt=0.0, description="L2 penalty of the reward model's slopes (intercepts get 1/100 "
                         "of it)")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount of the episode return")
    # The collector's smallest propensity is 0.3 / 6 candidates = 0.05 (w = 20), so 10 hands the
    # rows that only exploration reaches to the reward model; obp's default is inf (= DR).
    switch_lambda: float = Field(10.0, ge=0.0, description="Switch-DR: rows with an importance weight above this "
                                 "use the reward model only")
    # One off-table decision keeps its whole weight, products of several (1 / 0.15^4 = 1975 in
    # SAGE's binary space, which let one episode move plain step-wise DR by 35%) are capped. 1.5
    # was chosen on 50 binary and 38 multi-model seeds and checked on 50 fresh seeds of each
    # (docs/benchmarks.md, "Clipped step-wise DR").
    clip_factor: float = Field(1.5, ge=1.0, description="step-wise DR's trajectory weights are clipped on the "
                               "residual terms at this many times the largest single-decision weight of the logs "
                               "(1 / the smallest propensity): step_dr_clip, the estimate reports lead with and the "
                               "gate reads; .inf gives plain step-wise DR")
    bandit_scope: Literal["first_step", "all_decisions"] = Field(
        "first_step", description="the bandit estimators' rounds: each episode's first decision, or every decision")
    max_unsupported_mass: float = Field(1e-3, ge=0.0, description="above this mean probability mass off the logged "
                                        "support, an estimator gives no number")
    min_behaviour_prob: float = Field(0.005, ge=0.0, description="with a behaviour model (BC) the support is the "
                                      "behaviour policy's: an action is unsupported where the model gives it less "
                                      "than this probability (without one, a (role, model) pair absent from the "
                                      "evaluated logs is unsupported)")
    # A session's decisions share a day, a user and a code base: they are one draw, not many. The
    # percentile bootstrap over few such clusters covers far less than its nominal 95%. Measured (the
    # mean of ~20 episodes a session with a session effect, 400 draws each): 2 sessions 51%, 3 74%,
    # 5 85%, 10 90%, 15 93%, 20 94%, 30 and 50 93%: from 20 on it covers as well as it ever does. Below
    # this many the report gives estimates without intervals and says how many sessions it has and
    # needs; the promotion gate refuses then.
    min_sessions: int = Field(20, ge=2, description="sessions (the units the bootstrap resamples; episodes when "
                              "the logs name no session) below which no interval is computed: the report says how "
                              "many it has and needs, and the promotion gate refuses")


class OPEConfig(OPESettings):
    """:class:`OPESettings` and the encoding of a context for the fitted reward and Q models."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

    feature_spec: FeatureSpec = FeatureSpec()


class NoSupportError(ValueError):
    """The logged data cannot support the evaluation policy, so there is no number to give."""


# ---------------------------------------------------------------------------- results
@dataclass(frozen=True)
class RatioTerms:
    """How a self-normalised estimator is resampled: value = sum_j sum(num[:, j]) / sum(den[:, j]).

    SNIPS has one ratio, SNDR two (the direct term over a count of ones), weighted step-wise
    DR two per step. ``empty_is_zero``: a ratio whose denominator sums to 0 (its numerator
    is then 0 too) counts 0, as in weighted DR, where no episode's weight reaching a step
    means that step adds nothing; otherwise such a bootstrap replicate is dropped.
    """

    num: np.ndarray  # (m, J)
    den: np.ndarray  # (m, J)
    empty_is_zero: bool = False

    def __post_init__(self) -> None:
        if np.ndim(self.num) != 2 or np.shape(self.num) != np.shape(self.den):
            raise ValueError(f"RatioTerms needs num and den of one (m, J) shape, got {np.shape(self.num)} "
                             f"and {np.shape(self.den)}")


@dataclass(frozen=True)
class Estimate:
    """An estimator's value and the per-round terms whose mean it is (obp's ``_estimate_round_rewards``).

    ``ratio`` is set for SNIPS and SNDR, whose round rewards divide by the full-sample
    mean weight; the bootstrap resamples the (weight, term) pairs instead.
    """

    name: str
    value: float
    round_rewards: np.ndarray
    ratio: RatioTerms | None = None


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    se: float  # standard deviation of the bootstrap replicates


# ---------------------------------------------------------------------------- input checks
def _where(i: int, labels: np.ndarray | None) -> str:
    return f"row {i}" + (f" (decision {str(labels[i])!r})" if labels is not None else "")


def _first(bad: np.ndarray) -> int:
    return int(np.flatnonzero(bad)[0])


def _vector(name: str, x, n: int | None = None, ref: str = "reward") -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1:
        raise ValueError(f"{name} must be 1-dimensional (one value per logged decision), got shape {x.shape}")
    if n is not None and len(x) != n:
        raise ValueError(f"{name} has {len(x)} rows, {ref} has {n}: every input needs one row per decision")
    return x


def _check_finite(name: str, x: np.ndarray, labels: np.ndarray | None = None, what: str = "") -> None:
    bad = ~np.isfinite(x)
    if bad.any():
        bad_rows = bad.reshape(len(x), -1).any(axis=1)
        raise ValueError(f"{name} is NaN or infinite in {int(bad_rows.sum())} rows, first at "
                         f"{_where(_first(bad_rows), labels)}{what}")


def _check_pscore(pscore: np.ndarray, labels: np.ndarray | None = None) -> None:
    missing = np.isnan(pscore)
    if missing.any():
        raise ValueError(
            f"propensity is missing in {int(missing.sum())} rows, first at "
            f"{_where(_first(missing), labels)}: OPE needs the behaviour policy's probability of each "
            "logged action. Log `propensity` with each TRAJECTORY_STEP, or estimate propensities (BC) and "
            "say so in the report")
    _check_finite("propensity", pscore, labels)
    bad = (pscore <= 0.0) | (pscore > 1.0 + 1e-9)
    if bad.any():
        i = _first(bad)
        raise ValueError(
            f"propensity is {float(pscore[i])!r} at {_where(i, labels)} ({int(bad.sum())} rows outside "
            "(0, 1]): a logged action must have had positive probability under the behaviour policy. The "
            "log is corrupt or its propensity was rounded to 0; fix or drop these rows")


def _check_action_dist(name: str, action_dist: np.ndarray, n: int, labels: np.ndarray | None = None) -> None:
    if action_dist.ndim != 2 or action_dist.shape[0] != n:
        raise ValueError(f"{name} must have shape (n_rounds={n}, n_actions), got {action_dist.shape}")
    _check_finite(name, action_dist, labels)
    neg = (action_dist < 0).any(axis=1)
    if neg.any():
        raise ValueError(f"{name} has negative probabilities at {_where(_first(neg), labels)}")
    off = ~np.isclose(action_dist.sum(axis=1), 1.0, rtol=0.0, atol=1e-6)
    if off.any():
        i = _first(off)
        raise ValueError(f"{name} rows must sum to 1; {_where(i, labels)} sums to {action_dist[i].sum():.8f}")


def _check_bandit(reward, action, pscore, action_dist, q_hat=None) -> tuple[np.ndarray, ...]:
    """Validate the obp-style bandit inputs; returns them as float/int arrays."""
    reward = _vector("reward", reward).astype(np.float64)
    n = len(reward)
    if n == 0:
        raise ValueError("empty dataset: there are no logged decisions to evaluate")
    _check_finite("reward", reward)
    out = [reward]
    if action is not None:
        action = _vector("action", action, n)
        if not np.issubdtype(action.dtype, np.integer):
            raise ValueError(f"action must be integer indices into the action tuple, got {action.dtype}")
        out.append(action.astype(np.int64))
    if pscore is not None:
        pscore = _vector("pscore", pscore, n).astype(np.float64)
        _check_pscore(pscore)
        out.append(pscore)
    action_dist = np.asarray(action_dist, dtype=np.float64)
    _check_action_dist("action_dist", action_dist, n)
    if action is not None and ((out[1] < 0) | (out[1] >= action_dist.shape[1])).any():
        i = _first((out[1] < 0) | (out[1] >= action_dist.shape[1]))
        raise ValueError(f"action {int(out[1][i])} at row {i} is outside 0..{action_dist.shape[1] - 1}")
    out.append(action_dist)
    if q_hat is not None:
        q_hat = np.asarray(q_hat, dtype=np.float64)
        if q_hat.shape != action_dist.shape:
            raise ValueError(f"q_hat has shape {q_hat.shape} but action_dist has {action_dist.shape}")
        _check_finite("q_hat", q_hat)
        out.append(q_hat)
    return tuple(out)


# ---------------------------------------------------------------------------- bandit estimators
def importance_weights(action: np.ndarray, pscore: np.ndarray, action_dist: np.ndarray) -> np.ndarray:
    """w_i = pi_e(a_i|x_i) / pi_b(a_i|x_i)."""
    return action_dist[np.arange(len(action)), action] / pscore


def _policy_q(action_dist: np.ndarray, q_hat: np.ndarray) -> np.ndarray:
    # obp: np.average(q_hat, weights=action_dist, axis=1), i.e. renormalised by the row sum
    return np.average(q_hat, weights=action_dist, axis=1)


def ips(reward, action, pscore, action_dist, *, lambda_: float = np.inf) -> Estimate:
    """Inverse propensity scoring; ``lambda_`` clips the weights as obp's ``lambda_`` does."""
    reward, action, pscore, action_dist = _check_bandit(reward, action, pscore, action_dist)
    w = np.minimum(importance_weights(action, pscore, action_dist), lambda_)
    rr = reward * w
    return Estimate("ips", float(rr.mean()), rr)


def snips(reward, action, pscore, action_dist) -> Estimate:
    """Self-normalised IPS: sum(w r) / sum(w)."""
    reward, action, pscore, action_dist = _check_bandit(reward, action, pscore, action_dist)
    w = importance_weights(action, pscore, action_dist)
    if w.sum() <= 0:
        raise NoSupportError("SNIPS is undefined: the evaluation policy puts no mass on any logged action")
    rr = reward * w / w.mean()
    return Estimate("snips", float(rr.mean()), rr, RatioTerms((reward * w)[:, None], w[:, None]))


def dm(action_dist, q_hat) -> Estimate:
    """Direct method: the reward model averaged over the evaluation policy."""
    action_dist = np.asarray(action_dist, dtype=np.float64)
    if action_dist.ndim != 2 or len(action_dist) == 0:
        raise ValueError(f"action_dist must be a non-empty (n_rounds, n_actions) array: {action_dist.shape}")
    _, action_dist, q_hat = _check_bandit(np.zeros(len(action_dist)), None, None, action_dist, q_hat)
    rr = _policy_q(action_dist, q_hat)
    return Estimate("dm", float(rr.mean()), rr)


def dr(reward, action, pscore, action_dist, q_hat, *, lambda_: float = np.inf) -> Estimate:
    """Doubly robust (Dudik et al. 2014); ``lambda_`` clips the weights as obp's does."""
    reward, action, pscore, action_dist, q_hat = _check_bandit(reward, action, pscore, action_dist, q_hat)
    n = len(reward)
    w = np.minimum(importance_weights(action, pscore, action_dist), lambda_)
    rr = _policy_q(action_dist, q_hat) + w * (reward - q_hat[np.arange(n), action])
    return Estimate("dr", float(rr.mean()), rr)


def sndr(reward, action, pscore, action_dist, q_hat) -> Estimate:
    """Self-normalised DR: mean(q_hat(x, pi_e)) + sum(w (r - q_hat(x, a))) / sum(w)."""
    reward, action, pscore, action_dist, q_hat = _check_bandit(reward, action, pscore, action_dist, q_hat)
    n = len(reward)
    w = importance_weights(action, pscore, action_dist)
    if w.sum() <= 0:
        raise NoSupportError("SNDR is undefined: the evaluation policy puts no mass on any logged action")
    direct = _policy_q(action_dist, q_hat)
    correction = w * (reward - q_hat[np.arange(n), action])
    rr = direct + correction / w.mean()
    return Estimate("sndr", float(rr.mean()), rr,
                    RatioTerms(np.column_stack([direct, correction]), np.column_stack([np.ones(n), w])))


def switch_dr(reward, action, pscore, action_dist, q_hat, *, lambda_: float = np.inf) -> Estimate:
    """Switch-DR (Wang et al. 2017): the DR correction only where w <= lambda_ (obp's ``lambda_``)."""
    reward, action, pscore, action_dist, q_hat = _check_bandit(reward, action, pscore, action_dist, q_hat)
    n = len(reward)
    w = importance_weights(action, pscore, action_dist)
    rr = _policy_q(action_dist, q_hat) + (w <= lambda_) * w * (reward - q_hat[np.arange(n), action])
    return Estimate("switch_dr", float(rr.mean()), rr)


# ---------------------------------------------------------------------------- bootstrap
def bootstrap_ci(samples: Estimate | np.ndarray, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
                 *, groups: np.ndarray | None = None) -> Interval:
    """Percentile bootstrap interval of an estimate (or of the mean of ``samples``).

    Like obp's ``estimate_confidence_interval_by_bootstrap``: resample rounds with
    replacement, recompute, take the alpha/2 and 1-alpha/2 percentiles (linear
    interpolation). Two differences, both deliberate:

    * Ratio estimators (SNIPS, SNDR) are recomputed as ratios on each resample. obp
      resamples its round rewards ``w r / mean(w)``, whose denominator is the *full*
      sample's mean weight, so its interval ignores the denominator's variability and the
      covariance between numerator and denominator (too wide when rewards are far from 0).
    * ``groups`` (e.g. session ids) resamples whole groups: rows of one group are dependent.

    Replicates whose ratio denominator is 0 (no weight in the resample) are dropped; the
    random stream is numpy's ``default_rng(seed)``, not obp's ``RandomState``.
    """
    return bootstrap_cis([samples], n_boot, alpha, seed, groups=groups)[0]


def _columns(samples: Estimate | np.ndarray) -> tuple[np.ndarray, RatioTerms | None]:
    """The per-unit columns whose resampled sums give ``samples``' statistic."""
    ratio = samples.ratio if isinstance(samples, Estimate) else None
    if ratio is not None:
        return np.column_stack([ratio.num, ratio.den]).astype(np.float64), ratio
    rr = samples.round_rewards if isinstance(samples, Estimate) else np.asarray(samples, dtype=np.float64)
    return _vector("samples", rr).astype(np.float64)[:, None], None


def _statistic(sums: np.ndarray, count: np.ndarray, ratio: RatioTerms | None) -> np.ndarray:
    """One estimate per resample from its columns' sums (b, columns) and the rows drawn (b,)."""
    if ratio is None:
        return sums[:, 0] / count
    j = ratio.num.shape[1]
    num, den = sums[:, :j], sums[:, j:2 * j]
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = num / den
    if ratio.empty_is_zero:
        terms = np.where(den == 0, 0.0, terms)
    return terms.sum(axis=1)


def bootstrap_cis(samples: list[Estimate | np.ndarray], n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
                  *, groups: np.ndarray | None = None) -> list[Interval]:
    """:func:`bootstrap_ci` of several estimates over the same rows, in one pass: each gets the
    interval it would get alone (the same ``default_rng(seed)`` resamples; sums differ from a
    one-at-a-time pass by float rounding only). A resample is drawn as indices, counted per unit
    (``bincount``) and applied to every estimate's columns as one matrix product: one draw for
    eleven estimators instead of eleven gathers of (resamples x units) rows."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, got {n_boot}")
    parts = [_columns(x) for x in samples]
    if not parts or len(parts[0][0]) == 0:
        raise ValueError("empty dataset: nothing to bootstrap")
    if len({len(c) for c, _ in parts}) > 1:
        raise ValueError(f"the estimates cover different rows ({sorted({len(c) for c, _ in parts})}): "
                         "bootstrap each on its own")
    cols = np.column_stack([c for c, _ in parts] + [np.ones(len(parts[0][0]))])  # last column counts rows
    _check_finite("bootstrap samples", cols)
    if groups is not None:
        g = np.unique(_vector("groups", groups, len(cols), ref="samples"), return_inverse=True)[1]
        n_groups = int(g.max()) + 1
        cols = np.column_stack([np.bincount(g, weights=cols[:, j], minlength=n_groups) for j in range(cols.shape[1])])

    rng = np.random.default_rng(seed)
    n_units = len(cols)
    reps = np.empty((n_boot, len(parts)))
    chunk = max(1, 4_000_000 // n_units)
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        idx = rng.integers(0, n_units, size=(b, n_units))
        counts = np.bincount((idx + (np.arange(b) * n_units)[:, None]).ravel(), minlength=b * n_units)
        sums = counts.reshape(b, n_units).astype(np.float64) @ cols
        at = 0
        for k, (c, ratio) in enumerate(parts):
            reps[start:start + b, k] = _statistic(sums[:, at:at + c.shape[1]], sums[:, -1], ratio)
            at += c.shape[1]
    out = []
    for k in range(len(parts)):
        r = reps[:, k][np.isfinite(reps[:, k])]
        if r.size == 0:
            out.append(Interval(float("nan"), float("nan"), float("nan")))
            continue
        low, high = np.percentile(r, [100.0 * alpha / 2.0, 100.0 * (1.0 - alpha / 2.0)])
        out.append(Interval(float(low), float(high), float(r.std(ddof=1)) if r.size > 1 else 0.0))
    return out


# ---------------------------------------------------------------------------- diagnostics
def kish_ess(weights: np.ndarray) -> float:
    """Kish effective sample size (sum w)^2 / sum w^2; 0 when every weight is 0."""
    w = np.asarray(weights, dtype=np.float64)
    s2 = float((w * w).sum())
    return float(w.sum() ** 2 / s2) if s2 > 0 else 0.0


@dataclass(frozen=True)
class Support:
    share: float  # fraction of logged decisions where pi_e(a_i|x_i) > 0
    unsupported_mass: float  # mean over decisions of pi_e's mass on actions pi_b could not take there
    unsupported_rows: int  # decisions with any such mass
    reason: str | None  # why no number can be given, or None

    @property
    def no_support(self) -> bool:
        return self.reason is not None


def check_support(action_dist: np.ndarray, action: np.ndarray, pscore: np.ndarray, *,
                  role: np.ndarray | None = None, behaviour_probs: np.ndarray | None = None,
                  actions: tuple[str, ...] | None = None, roles: tuple[str, ...] = ROLES,
                  policy_name: str = "policy",
                  max_unsupported_mass: float = 1e-3, min_behaviour_prob: float = 0.0,
                  supported: np.ndarray | None = None) -> Support:
    """Does the logged data support the evaluation policy?

    An action ``a`` at decision ``i`` is unsupported when the behaviour policy could not
    (or, in these logs, did not) take it there:

    * ``behaviour_probs[i, a] <= min_behaviour_prob`` when the behaviour policy's full
      distribution (or a model of it, e.g. BC) is given: the behaviour policy's support;
    * every ``a != a_i`` when the logged propensity is 1 (a deterministic behaviour, e.g.
      SAGE's static table without exploration);
    * without ``behaviour_probs``, ``(role_i, a)`` never logged at all (with ``role``):
      nothing in the sample says the behaviour policy could take it;
    * ``supported[i, a]`` False, where given: the caller's own evidence of where the behaviour
      could act otherwise (``offline_eval.logged_support``: a decision's exact context also logged
      with ``a``, or a known exploration probability), which a propensity estimated from
      deterministic logs (BC's near 0 or 1) must not stand in for.

    Importance weighting is blind to such mass (it is never sampled), so above
    ``max_unsupported_mass`` every estimate is withheld and ``reason`` says why.
    """
    n, k = action_dist.shape
    unsupported = np.zeros((n, k), dtype=bool)
    if behaviour_probs is not None:
        behaviour_probs = np.asarray(behaviour_probs, dtype=np.float64)
        if behaviour_probs.shape != (n, k):
            raise ValueError(f"behaviour_probs has shape {behaviour_probs.shape}, expected {(n, k)}")
        unsupported |= behaviour_probs <= min_behaviour_prob
    if supported is not None:
        supported = np.asarray(supported, dtype=bool)
        if supported.shape != (n, k):
            raise ValueError(f"supported has shape {supported.shape}, expected {(n, k)}")
        unsupported |= ~supported
    deterministic = pscore >= DETERMINISTIC_PSCORE
    unsupported[deterministic] = True
    unsupported[np.flatnonzero(deterministic), action[deterministic]] = False
    if role is not None and behaviour_probs is None:
        logged = np.zeros((int(role.max()) + 1, k), dtype=bool)
        logged[role, action] = True
        unsupported |= ~logged[role]
    mass = (action_dist * unsupported).sum(axis=1)
    share = float((action_dist[np.arange(n), action] > 0).mean())
    unsupported_mass = float(mass.mean())
    n_rows = int((mass > 1e-12).sum())
    reason = None
    if share == 0.0:
        reason = (f"no support: policy {policy_name!r} puts no probability on any logged action, so the logs "
                  "say nothing about it")
    elif unsupported_mass > max_unsupported_mass:
        worst = _worst_pairs(action_dist * unsupported, role, actions, roles)
        reason = (f"no support: policy {policy_name!r} puts {unsupported_mass:.1%} of its probability mass "
                  f"on actions the behaviour policy never took in those contexts ({n_rows} of {n} decisions"
                  f"{worst}); the logs cannot say how they would have done. Collect logs that explore these "
                  "models, or evaluate a policy restricted to them")
    return Support(share, unsupported_mass, n_rows, reason)


def _worst_pairs(mass: np.ndarray, role: np.ndarray | None, actions: tuple[str, ...] | None,
                 roles: tuple[str, ...]) -> str:
    """The (role, model) pairs with the most unsupported mass, for the no-support message."""
    if role is None:
        return ""
    by_pair = np.zeros((len(roles), mass.shape[1]))
    np.add.at(by_pair, role, mass)
    top = np.unravel_index(np.argsort(by_pair, axis=None)[::-1][:3], by_pair.shape)
    names = [f"{roles[r]}->{actions[a] if actions else a}"
             for r, a in zip(*top, strict=True) if by_pair[r, a] > 0]
    return "; mostly " + ", ".join(names) if names else ""


# ---------------------------------------------------------------------------- multi-step estimators
@dataclass(frozen=True)
class EpisodeLayout:
    """Decisions grouped into episodes: row i is step ``step[i]`` of episode ``episode[i]``."""

    episode: np.ndarray  # (n,) int, 0..n_episodes-1
    step: np.ndarray  # (n,) int
    next_row: np.ndarray  # (n,) row of the next step of the same episode, -1 at the last step
    lengths: np.ndarray  # (n_episodes,)
    first_row: np.ndarray  # (n_episodes,) the row of each episode's step 0

    @property
    def n_episodes(self) -> int:
        return len(self.lengths)

    @property
    def horizon(self) -> int:
        return int(self.lengths.max())

    def grid(self, x: np.ndarray, fill: float = 0.0) -> np.ndarray:
        """(n_episodes, horizon) array with x at [episode, step] and ``fill`` past each episode's end."""
        out = np.full((self.n_episodes, self.horizon), fill, dtype=np.float64)
        out[self.episode, self.step] = x
        return out


def episode_layout(episode_id, step, labels: np.ndarray | None = None) -> EpisodeLayout:
    """Check that every episode has steps 0..len-1 exactly once and index them."""
    episode_id = _vector("episode_id", episode_id)
    step = _vector("step", step, len(episode_id))
    if len(episode_id) == 0:
        raise ValueError("empty dataset: there are no logged decisions to evaluate")
    if not np.issubdtype(step.dtype, np.integer):
        raise ValueError(f"step must be integer attempt indices, got dtype {step.dtype}")
    uniq, episode = np.unique(episode_id, return_inverse=True)
    order = np.lexsort((step, episode))
    ep_sorted = episode[order]
    lengths = np.bincount(episode, minlength=len(uniq))
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    expected = np.arange(len(order)) - starts[ep_sorted]
    bad = step[order] != expected
    if bad.any():
        e = int(ep_sorted[_first(bad)])
        steps = sorted(int(s) for s in step[episode == e])
        raise ValueError(f"episode {str(uniq[e])!r} has steps {steps}; every episode needs steps 0..n-1 "
                         "exactly once. Keep complete episodes only (routing dataset column "
                         "`episode_complete`)")
    next_sorted = np.full(len(order), -1)
    same = ep_sorted[1:] == ep_sorted[:-1]
    next_sorted[:-1][same] = order[1:][same]
    next_row = np.empty_like(next_sorted)
    next_row[order] = next_sorted
    return EpisodeLayout(episode.astype(np.int64), step.astype(np.int64), next_row, lengths, order[starts])


def _check_episode_inputs(n: int, **arrays) -> dict[str, np.ndarray]:
    out = {}
    for name, x in arrays.items():
        x = _vector(name, x, n).astype(np.float64)
        _check_finite(name, x)
        out[name] = x
    return out


def _step_ratios(pscore, pi_logged, n: int) -> np.ndarray:
    pscore = _vector("pscore", pscore, n).astype(np.float64)
    _check_pscore(pscore)
    pi_logged = _vector("pi_logged", pi_logged, n).astype(np.float64)
    _check_finite("pi_logged", pi_logged)
    bad = (pi_logged < 0) | (pi_logged > 1 + 1e-9)
    if bad.any():
        i = _first(bad)
        raise ValueError(f"pi_logged must be probabilities in [0, 1]; row {i} is {pi_logged[i]}")
    return pi_logged / pscore


def pdis(reward, pscore, pi_logged, episode_id, step, *, gamma: float = 1.0) -> Estimate:
    """Per-decision importance sampling: mean over episodes of sum_t gamma^t W_t r_t, W_t = prod_{k<=t} w_k.

    ``pi_logged`` is the evaluation policy's probability of each logged action. The
    round rewards are the per-episode returns, so the bootstrap resamples episodes.
    """
    lay = episode_layout(episode_id, step)
    r = _check_episode_inputs(len(lay.step), reward=reward)["reward"]
    W = np.cumprod(lay.grid(_step_ratios(pscore, pi_logged, len(r)), fill=1.0), axis=1)
    G = (gamma ** np.arange(lay.horizon) * W * lay.grid(r)).sum(axis=1)
    return Estimate("pdis", float(G.mean()), G)


def step_dr(reward, pscore, pi_logged, q_logged, v_hat, episode_id, step, *, gamma: float = 1.0) -> Estimate:
    """Step-wise doubly robust (Jiang & Li 2016; Thomas & Brunskill 2016).

    Per episode: sum_t gamma^t [W_t (r_t - q_hat(s_t, a_t)) + W_{t-1} v_hat(s_t)], with
    W_{-1} = 1 and v_hat(s) = sum_a pi_e(a|s) q_hat(s, a). Unbiased for any q_hat; the
    closer q_hat is to the evaluation policy's Q-function, the smaller its variance.
    """
    lay = episode_layout(episode_id, step)
    x = _check_episode_inputs(len(lay.step), reward=reward, q_logged=q_logged, v_hat=v_hat)
    W = np.cumprod(lay.grid(_step_ratios(pscore, pi_logged, len(lay.step)), fill=1.0), axis=1)
    W_prev = np.concatenate([np.ones((lay.n_episodes, 1)), W[:, :-1]], axis=1)
    terms = W * (lay.grid(x["reward"]) - lay.grid(x["q_logged"])) + W_prev * lay.grid(x["v_hat"])
    G = (gamma ** np.arange(lay.horizon) * terms).sum(axis=1)
    return Estimate("step_dr", float(G.mean()), G)


def step_wdr(reward, pscore, pi_logged, q_logged, v_hat, episode_id, step, *, gamma: float = 1.0) -> Estimate:
    """Weighted (self-normalised) step-wise doubly robust, WDR (Thomas & Brunskill 2016, eq. 9).

    Step-wise DR with each step's trajectory weights divided by their sum over episodes:
    sum_t gamma^t [sum_i W_t^i (r_t^i - q_hat_t^i) / sum_i W_t^i + sum_i W_{t-1}^i v_hat_t^i /
    sum_i W_{t-1}^i], W_{-1} = 1. Past an episode's end its weight stays and its terms are 0
    (an absorbing state). Biased in small samples, consistent, and bounded: no single
    episode can move the estimate by more than its own (normalised) share, where step-wise
    DR lets one episode of trajectory weight ``w`` move it by ``w / n`` times its residual.
    The round rewards are per-episode terms whose mean is the estimate (full-sample
    normalisers); the bootstrap recomputes every step's ratio on each resample.
    """
    lay = episode_layout(episode_id, step)
    x = _check_episode_inputs(len(lay.step), reward=reward, q_logged=q_logged, v_hat=v_hat)
    W = np.cumprod(lay.grid(_step_ratios(pscore, pi_logged, len(lay.step)), fill=1.0), axis=1)
    W_prev = np.concatenate([np.ones((lay.n_episodes, 1)), W[:, :-1]], axis=1)
    disc = gamma ** np.arange(lay.horizon)
    num = np.concatenate([disc * W * (lay.grid(x["reward"]) - lay.grid(x["q_logged"])),
                          disc * W_prev * lay.grid(x["v_hat"])], axis=1)
    den = np.concatenate([W, W_prev], axis=1)
    total = den.sum(axis=0)
    scale = np.divide(len(den), total, out=np.zeros_like(total), where=total > 0)
    G = (num * scale).sum(axis=1)
    return Estimate("step_wdr", float(G.mean()), G, RatioTerms(num, den, empty_is_zero=True))


def clip_level(pscore, clip_factor: float = OPESettings.model_fields["clip_factor"].default) -> float:
    """The trajectory weight :func:`step_dr_clip` clips at: ``clip_factor`` times the largest
    single-decision weight the logs allow, 1 / (smallest logged propensity)."""
    return float(clip_factor / np.min(pscore))


def step_dr_clip(reward, pscore, pi_logged, q_logged, v_hat, episode_id, step, *, gamma: float = 1.0,
                 clip: float) -> Estimate:
    """Step-wise DR with its trajectory weights clipped at ``clip`` where they multiply a residual.

    Step-wise DR telescopes to v_hat(s_0) + sum_t gamma^t W_t (r_t + gamma v_hat(s_{t+1}) -
    q_hat(s_t, a_t)) (v_hat = 0 after the last step); here W_t becomes min(W_t, clip). Each
    residual has conditional mean 0 when q_hat is the evaluated policy's Q-function, so the
    clip adds bias only through the model's error on the clipped episodes (the argument of
    Su et al. 2020 for clipped DR), while one episode can no longer move the estimate by more
    than ``clip / n`` times its residuals. ``clip = np.inf`` is :func:`step_dr` exactly.
    """
    if not clip >= 1.0:
        raise ValueError(f"clip must be >= 1 (np.inf: no clipping), got {clip}")
    lay = episode_layout(episode_id, step)
    x = _check_episode_inputs(len(lay.step), reward=reward, q_logged=q_logged, v_hat=v_hat)
    W = np.cumprod(lay.grid(_step_ratios(pscore, pi_logged, len(lay.step)), fill=1.0), axis=1)
    v_next = np.where(lay.next_row >= 0, x["v_hat"][lay.next_row], 0.0)
    residual = lay.grid(x["reward"] + gamma * v_next - x["q_logged"])
    G = x["v_hat"][lay.first_row] + (gamma ** np.arange(lay.horizon) * np.minimum(W, clip) * residual).sum(axis=1)
    return Estimate("step_dr_clip", float(G.mean()), G)


def fqe(v_hat, episode_id, step) -> Estimate:
    """Fitted-Q evaluation's estimate of the episode return: mean over episodes of
    ``v_hat(s_0) = sum_a pi_e(a|s_0) q_hat(s_0, a)``, with ``q_hat`` the fitted Q-function of
    the evaluated policy (:func:`cross_fit_q` with ``horizon > 1``). No importance weights,
    so low variance; biased wherever ``q_hat`` is."""
    lay = episode_layout(episode_id, step)
    v = _check_episode_inputs(len(lay.step), v_hat=v_hat)["v_hat"]
    G = v[lay.first_row]
    return Estimate("fqe", float(G.mean()), G)


# ---------------------------------------------------------------------------- reward model
def reward_basis(ctx: Contexts, spec: FeatureSpec = FeatureSpec()) -> np.ndarray:
    """The numeric part of ``spec.encode`` plus complexity^2 (bends the logistic success curve)."""
    x = spec.encode(ctx).astype(np.float64)
    numeric = x[:, len(spec.roles):]
    extra = [numeric[:, spec.numeric.index("task_complexity_score")] ** 2] \
        if "task_complexity_score" in spec.numeric else []
    return np.column_stack([numeric, *extra])


@dataclass(frozen=True)
class LinearQ:
    """q(x, a) = mean + alpha[role, a] + basis(x) . (beta[role] + gamma[a]).

    A (role, model) intercept plus slopes shared by the role's models and by the model's
    roles: cells that only exploration reaches (a few dozen rows each) borrow their
    slopes from the well-logged ones instead of being shrunk towards an unrelated mean.
    """

    mean: float
    alpha: np.ndarray  # (n_roles, K)
    beta: np.ndarray  # (n_roles, p)
    gamma: np.ndarray  # (K, p)

    def predict(self, role: np.ndarray, basis: np.ndarray) -> np.ndarray:
        shared = (basis * self.beta[role]).sum(axis=1, keepdims=True)
        return self.mean + self.alpha[role] + shared + basis @ self.gamma.T

    @classmethod
    def fit(cls, role: np.ndarray, action: np.ndarray, basis: np.ndarray, y: np.ndarray, n_roles: int,
            n_actions: int, ridge: float) -> LinearQ:
        """Ridge regression; intercepts are penalised 100x less than slopes.

        The design [cell one-hot | role one-hot x basis | action one-hot x basis] is never
        built: its normal equations are assembled from per-(role, action) sums, O(n p^2).
        """
        R, K, p = n_roles, n_actions, basis.shape[1]
        mean = float(y.mean())
        y = y - mean
        cell = role * K + action

        def per_cell(x: np.ndarray) -> np.ndarray:  # sum of x's rows by cell, (R, K, ...)
            flat = x.reshape(len(x), -1)
            sums = [np.bincount(cell, weights=col, minlength=R * K) for col in flat.T]
            return np.stack(sums, axis=1).reshape(R, K, *x.shape[1:])

        count = np.bincount(cell, minlength=R * K).astype(np.float64)
        sy = np.bincount(cell, weights=y, minlength=R * K)
        s1 = per_cell(basis)  # per cell: sum of basis
        s2 = per_cell(basis[:, :, None] * basis[:, None, :])  # per cell: sum of basis outer products
        syb = per_cell(y[:, None] * basis)

        a0, b0 = R * K, R * K + R * p  # offsets of the role-slope and action-slope blocks
        dim = b0 + K * p
        A = np.zeros((dim, dim))
        A[np.arange(a0), np.arange(a0)] = count
        for r in range(R):
            rs = slice(a0 + r * p, a0 + (r + 1) * p)
            A[rs, rs] = s2[r].sum(axis=0)
            for a in range(K):
                c, as_ = r * K + a, slice(b0 + a * p, b0 + (a + 1) * p)
                A[c, rs] = A[rs, c] = s1[r, a]
                A[c, as_] = A[as_, c] = s1[r, a]
                A[rs, as_] = s2[r, a]
                A[as_, rs] = s2[r, a].T
        for a in range(K):
            as_ = slice(b0 + a * p, b0 + (a + 1) * p)
            A[as_, as_] = s2[:, a].sum(axis=0)
        rhs = np.concatenate([sy, syb.sum(axis=1).ravel(), syb.sum(axis=0).ravel()])
        penalty = np.full(dim, ridge)
        penalty[:a0] = ridge / 100.0
        coef = np.linalg.solve(A + np.diag(penalty), rhs)
        return cls(mean, coef[:a0].reshape(R, K), coef[a0:b0].reshape(R, p), coef[b0:].reshape(K, p))


def _fitted_q(role: np.ndarray, action: np.ndarray, basis: np.ndarray, reward: np.ndarray, train: np.ndarray,
              n_roles: int, n_actions: int, ridge: float, next_row: np.ndarray | None, pi: np.ndarray | None,
              horizon: int, gamma: float) -> LinearQ:
    """The :class:`LinearQ` fitted on the ``train`` rows: the immediate reward (``horizon=1``) or
    ``horizon`` sweeps of fitted-Q evaluation of ``pi``, whose targets are computed on every row."""
    if horizon > 1 and (next_row is None or pi is None):
        raise ValueError("fitted-Q evaluation (horizon > 1) needs next_row and pi")
    has_next = next_row >= 0 if next_row is not None else np.zeros(len(reward), dtype=bool)
    y = reward
    for h in range(horizon):
        model = LinearQ.fit(role[train], action[train], basis[train], y[train], n_roles, n_actions, ridge)
        if h < horizon - 1:
            q = model.predict(role, basis)
            y = reward + gamma * np.where(has_next, (pi[next_row] * q[next_row]).sum(axis=1), 0.0)
    return model


def cross_fit_q(ctx: Contexts, action: np.ndarray, reward: np.ndarray, groups: np.ndarray, n_actions: int, *,
                next_row: np.ndarray | None = None, pi: np.ndarray | None = None, horizon: int = 1,
                gamma: float = 1.0, n_folds: int = 5, ridge: float = 1.0, seed: int = 0,
                spec: FeatureSpec = FeatureSpec()) -> np.ndarray:
    """Cross-fitted q_hat(x, a) for every row and action, (n, K), from :class:`LinearQ`.

    Folds are whole groups (sessions or episodes), so no episode is both in the data a
    model is fitted on and in the rows it predicts. ``horizon=1``: the immediate reward.
    ``horizon=H`` with ``next_row`` and ``pi``: fitted-Q evaluation of the policy ``pi``,
    H sweeps of y = r + gamma * sum_a pi(a|s') q(s', a) (0 after an episode's last step),
    each fold's targets computed from its own training model.
    """
    n = len(ctx)
    basis = reward_basis(ctx, spec)
    g = np.unique(groups, return_inverse=True)[1]
    n_groups = int(g.max()) + 1
    if n_groups < 2:
        raise ValueError("cross-fitting needs at least 2 sessions or episodes, got 1")
    k = min(n_folds, n_groups)
    fold = (np.random.default_rng(seed).permutation(n_groups) % k)[g]
    q_hat = np.empty((n, n_actions))
    for f in range(k):
        model = _fitted_q(ctx.role, action, basis, reward, fold != f, len(spec.roles), n_actions, ridge, next_row,
                          pi, horizon, gamma)
        q_hat[fold == f] = model.predict(ctx.role[fold == f], basis[fold == f])
    return q_hat


def fit_q(data: LoggedData, policy: ActionProbs, config: OPEConfig = OPEConfig()) -> LinearQ:
    """Fitted-Q evaluation of ``policy`` on every row of ``data`` (no cross-fitting): the model of
    its Q-function that :func:`evaluate_policy` uses for step-wise DR, fitted once on all the logs, to
    predict on new contexts (``LinearQ.predict(ctx.role, reward_basis(ctx, spec))`` with ``spec``
    the config's feature spec over ``data.roles``)."""
    data.validate()
    lay = episode_layout(data.episode_id, data.step, data.labels)
    spec = replace(config.feature_spec, roles=tuple(data.roles))
    return _fitted_q(data.contexts.role, data.action, reward_basis(data.contexts, spec),
                     np.asarray(data.reward, dtype=np.float64), np.ones(len(data), dtype=bool), len(spec.roles),
                     len(data.actions), config.ridge, lay.next_row, policy_probs(policy, data), lay.horizon,
                     config.gamma)


# ---------------------------------------------------------------------------- evaluate a policy
class ActionProbs(Protocol):
    def action_probs(self, ctx: Contexts) -> np.ndarray: ...


@dataclass(frozen=True)
class LoggedData:
    """Logged routing decisions, one row each, in any order."""

    contexts: Contexts
    action: np.ndarray  # int64 index into ``actions``
    reward: np.ndarray  # float64
    pscore: np.ndarray  # float64, the behaviour policy's probability of the logged action
    episode_id: np.ndarray  # one id per episode (a task's attempts)
    actions: tuple[str, ...]  # the action order (the catalogue's)
    session_id: np.ndarray | None = None  # when given, folds and the bootstrap group by session
    labels: np.ndarray | None = None  # decision ids, for error messages
    roles: tuple[str, ...] = ROLES  # what contexts.role indexes (the action space's roles)
    # decisions no evaluated policy can change (SAGE's coder: its UCB bandit chooses, no router checkpoint
    # is consulted): every policy does what the log did there (probability 1 on the logged action, and the
    # propensity 1: the policy's choice *is* the behaviour's), so they add their reward and no weight
    follows_log: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.action)

    @property
    def step(self) -> np.ndarray:
        return self.contexts.step

    @property
    def groups(self) -> np.ndarray:
        return self.session_id if self.session_id is not None else self.episode_id

    @classmethod
    def from_frame(cls, df, actions: tuple[str, ...], roles: tuple[str, ...] = ROLES) -> LoggedData:
        """From routing dataset rows (``routing_dataset.build_routing_dataset``); rows whose
        ``policy_source`` is one of :data:`FOLLOWS_LOG_SOURCES` follow the log (``follows_log``)."""
        follows = (df["policy_source"].isin(FOLLOWS_LOG_SOURCES).to_numpy(dtype=bool) if "policy_source" in df
                   else None)
        pscore = df["propensity"].astype("float64").to_numpy(na_value=np.nan)
        if follows is not None and follows.any():
            pscore = np.where(follows, 1.0, pscore)
        else:
            follows = None
        return cls(
            contexts=Contexts.from_frame(df, roles),
            action=df["action_index"].to_numpy(dtype=np.int64),
            reward=df["reward"].to_numpy(dtype=np.float64),
            pscore=pscore,
            follows_log=follows,
            episode_id=df["episode_id"].to_numpy(dtype=object).astype(str),
            actions=tuple(actions),
            session_id=df["session_id"].to_numpy(dtype=object).astype(str) if "session_id" in df else None,
            labels=df["decision_id"].to_numpy(dtype=object) if "decision_id" in df else None,
            roles=tuple(roles),
        )

    def validate(self) -> None:
        n = len(self.contexts)
        if n == 0:
            raise ValueError("empty dataset: there are no logged decisions to evaluate")
        for name in ("action", "reward", "pscore", "episode_id", "session_id", "labels", "follows_log"):
            x = getattr(self, name)
            if x is not None and (np.ndim(x) != 1 or len(x) != n):
                raise ValueError(f"LoggedData.{name} has shape {np.shape(x)}, contexts have {n} rows")
        if not np.issubdtype(np.asarray(self.action).dtype, np.integer):
            raise ValueError(f"LoggedData.action must be integer action indices, got {self.action.dtype}")
        out = (self.action < 0) | (self.action >= len(self.actions))
        if out.any():
            i = _first(out)
            raise ValueError(f"action {int(self.action[i])} at {_where(i, self.labels)} is outside "
                             f"0..{len(self.actions) - 1}")
        _check_finite("reward", np.asarray(self.reward, dtype=np.float64), self.labels,
                      ": drop or repair these rows before evaluating")
        _check_pscore(np.asarray(self.pscore, dtype=np.float64), self.labels)


@dataclass(frozen=True)
class EstimatorResult:
    name: str
    scope: str  # "decision" (per-decision reward) or "episode" (episode return)
    value: float | None  # None: withheld (no support)
    ci_low: float | None
    ci_high: float | None
    se: float | None  # bootstrap standard error
    # The per-round (bandit) or per-episode terms the value is the mean (or ratio) of, the
    # units they belong to (episode ids, or the decision ids of the rounds) and the clusters
    # the bootstrap resampled: what :func:`paired_difference` needs to compare two policies on
    # the same logs. Not part of the report (``to_dict`` leaves them out).
    terms: Estimate | None = field(default=None, repr=False, compare=False)
    units: np.ndarray | None = field(default=None, repr=False, compare=False)
    groups: np.ndarray | None = field(default=None, repr=False, compare=False)

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _TERM_FIELDS}

    def format(self) -> str:
        if self.value is None:
            return f"{self.name}: no support"
        if self.ci_low is None:
            return f"{self.name}: {self.value:.4f} (no interval computed)"
        return f"{self.name}: {self.value:.4f} [{self.ci_low:.4f}, {self.ci_high:.4f}]"


_TERM_FIELDS = ("terms", "units", "groups")


@dataclass(frozen=True)
class Difference:
    """``b - a`` of one estimator for two policies on the same logs, with a paired interval.

    The value is the mean over the same episodes (or rounds) of b's terms minus a's, so it
    equals ``b.value - a.value``; the bootstrap resamples the units (sessions when known)
    once for both, so what both policies share (the logged rewards where they act alike)
    cancels in the interval too.
    """

    estimator: str
    a: str
    b: str
    value: float | None  # None: one of the two estimates was withheld
    ci_low: float | None  # None: no interval (too few sessions), ``reason`` says why
    ci_high: float | None
    se: float | None
    n_units: int
    reason: str | None = None  # why there is no value, or no interval

    def format(self) -> str:
        if self.value is None:
            return f"{self.estimator} {self.b} - {self.a}: {self.reason}"
        if self.ci_low is None:
            return f"{self.estimator} {self.b} - {self.a}: {self.value:+.4f} ({self.reason})"
        return f"{self.estimator} {self.b} - {self.a}: {self.value:+.4f} [{self.ci_low:+.4f}, {self.ci_high:+.4f}]"


def _as_ratio(est: Estimate) -> RatioTerms:
    """Any estimate as ratio terms: a plain mean is sum(terms) / sum(ones)."""
    if est.ratio is not None:
        return est.ratio
    rr = np.asarray(est.round_rewards, dtype=np.float64)
    return RatioTerms(rr[:, None], np.ones((len(rr), 1)))


def difference_estimate(a: Estimate, b: Estimate) -> Estimate:
    """The estimate of ``b - a`` on the same units: per-unit terms ``b - a`` (plain means), or, when
    either is a ratio estimator, the ratios of both with a's numerators negated, so one bootstrap
    replicate recomputes both on the same resample."""
    if len(a.round_rewards) != len(b.round_rewards):
        raise ValueError(f"{a.name} and {b.name} have {len(a.round_rewards)} and {len(b.round_rewards)} terms: "
                         "a paired difference needs both estimates on the same logged units")
    rr = np.asarray(b.round_rewards, dtype=np.float64) - np.asarray(a.round_rewards, dtype=np.float64)
    if a.ratio is None and b.ratio is None:
        return Estimate(f"{b.name}-{a.name}", b.value - a.value, rr)
    ra, rb = _as_ratio(a), _as_ratio(b)
    ratio = RatioTerms(np.column_stack([rb.num, -ra.num]), np.column_stack([rb.den, ra.den]),
                       empty_is_zero=ra.empty_is_zero and rb.empty_is_zero)
    return Estimate(f"{b.name}-{a.name}", b.value - a.value, rr, ratio)


@dataclass(frozen=True)
class PolicyEvaluation:
    policy: str
    estimates: dict[str, EstimatorResult]  # BANDIT_ESTIMATORS then EPISODE_ESTIMATORS
    n_decisions: int
    n_episodes: int
    n_bandit_rounds: int
    ess: float  # Kish ESS of the bandit rounds' importance weights
    ess_episode: float  # Kish ESS of the episodes' trajectory weights prod_t w_t
    max_weight: float
    support_share: float
    unsupported_mass: float
    no_support_reason: str | None
    config: OPEConfig
    clip_weight: float = np.inf  # the trajectory weight step_dr_clip clipped at (clip_level)
    n_sessions: int = 0  # the units the bootstrap resampled: sessions, or episodes where the logs name none
    interval_reason: str | None = None  # why no interval was computed (too few sessions), or None

    headline_estimator = HEADLINE_ESTIMATOR  # the episode-return estimate to compare with ground truth

    @property
    def no_support(self) -> bool:
        return self.no_support_reason is not None

    @property
    def value(self) -> float | None:
        return self.estimates[self.headline_estimator].value

    def to_dict(self) -> dict:
        d = asdict(replace(self, estimates={}, config=None))
        d["config"] = self.config.model_dump()  # the feature spec, a dataclass, becomes a dict too
        d["estimates"] = {k: e.to_dict() for k, e in self.estimates.items()}
        d["no_support"] = self.no_support
        return d

    def format(self) -> str:
        head = (f"{self.policy}: {self.n_decisions} decisions, {self.n_episodes} episodes, {self.n_sessions} sessions, "
                f"ESS {self.ess:.0f}/{self.n_bandit_rounds} "
                f"(episodes {self.ess_episode:.0f}/{self.n_episodes}), "
                f"support share {self.support_share:.1%}")
        if self.no_support:
            return f"{head}\n  {self.no_support_reason}"
        return head + (f"\n  no intervals: {self.interval_reason}" if self.interval_reason else "") \
            + "".join(f"\n  {e.format()}" for e in self.estimates.values())


def session_shortfall(n_sessions: int, min_sessions: int, named: bool = True) -> str | None:
    """Why an interval over ``n_sessions`` bootstrap clusters is not given (None: it is), in words a user
    acts on. ``named``: the logs name sessions (else each episode is its own)."""
    if n_sessions >= min_sessions:
        return None
    unit = ("session" if n_sessions == 1 else "sessions") if named else \
        ("episode" if n_sessions == 1 else "episodes") + " (the logs name no session)"
    return (f"{n_sessions} {unit}; a 95% interval needs at least {min_sessions} (OPE setting min_sessions: a "
            "session's decisions are one draw, and the bootstrap over fewer covers far less than 95%). Log more "
            "sessions: SAGE writes one session per journal file (a day) unless SAGE_SESSION_ID is set, as `sage "
            "run` does per run; or raise routing_dataset's eval_fraction")


def _defined(estimator: Callable[..., Estimate], *args, withheld: set[str]) -> Estimate:
    """``estimator(*args)``; where it is undefined (NoSupportError) its name goes to ``withheld`` and a NaN
    stand-in keeps the list's order: ``evaluate_policy`` reports every withheld estimator as None."""
    try:
        return estimator(*args)
    except NoSupportError:
        withheld.add(estimator.__name__)
        return Estimate(estimator.__name__, float("nan"), np.zeros(len(args[0])))


def policy_probs(policy: ActionProbs, data: LoggedData) -> np.ndarray:
    """The evaluation policy's (n, K) probabilities on the logged contexts, checked."""
    name = getattr(policy, "name", type(policy).__name__)
    own = getattr(policy, "actions", None)
    if own is not None and tuple(own) != tuple(data.actions):
        raise ValueError(f"policy {name!r} orders its actions {tuple(own)}, the logged data "
                         f"{tuple(data.actions)}: evaluate it on data built with the same model catalogue")
    probs = np.asarray(policy.action_probs(data.contexts), dtype=np.float64)
    if probs.shape != (len(data), len(data.actions)):
        raise ValueError(f"policy {name!r} returned probabilities of shape {probs.shape}, "
                         f"expected {(len(data), len(data.actions))}")
    _check_action_dist(f"policy {name!r} probabilities", probs, len(data), data.labels)
    if data.follows_log is not None:  # what no policy can change: the logged action, with probability 1
        rows = np.flatnonzero(data.follows_log)
        probs = probs.copy()
        probs[rows] = 0.0
        probs[rows, np.asarray(data.action)[rows]] = 1.0
    return probs


# One BLAS thread for every evaluation: its products (the cross-fitted ridge models, the bootstrap's
# counts x columns) are small or memory-bound, and BLAS threads spin-waiting for a core another
# process holds (a second Dagster step, a benchmark beside it) made offline_eval 3x slower at 200k
# episodes (64 s against 19 s with one thread, measured with a niced job on the other core).
@ThreadpoolController().wrap(limits=1, user_api="blas")
def evaluate_policy(data: LoggedData, policy: ActionProbs, config: OPEConfig = OPEConfig(), *,
                    behaviour_probs: np.ndarray | None = None,
                    progress: Callable[[str], None] = log.info, keep_terms: bool = True,
                    intervals: Collection[str] | None = None,
                    supported: np.ndarray | None = None) -> PolicyEvaluation:
    """Every estimator, its percentile-bootstrap CI, the ESS and the support check for ``policy``.

    Bandit estimators treat each of ``config.bandit_scope``'s decisions as a round, with an
    immediate-reward model; PDIS, step-wise DR and FQE estimate the expected episode return,
    the last two with fitted-Q evaluation of ``policy``. Both models are cross-fitted by
    session. When the logs do not support the policy no estimate is computed: every value
    is None and ``no_support_reason`` says why. ``keep_terms=False`` drops each estimator's
    per-unit terms once its interval is computed (no :func:`paired_difference` on the result
    then): a ranking of many candidates on large logs need not hold them all. ``intervals``: the
    estimators whose bootstrap interval is computed (default: all); the others get their value
    only (``ci_low``/``ci_high``/``se`` None): a ranking that reads one estimator's interval need
    not pay for eleven bootstraps (each seeded alike, so a computed interval does not depend on
    which others are). ``supported``: (n, K), the actions the logs support at each decision beyond
    what propensities say (:func:`check_support`). Below ``config.min_sessions`` sessions every
    estimate keeps its value and no interval is computed: ``interval_reason`` says how many sessions
    there are and how many are needed. SNIPS and SNDR are withheld (None) where undefined.
    """
    if intervals is not None and (unknown := set(intervals) - set(BANDIT_ESTIMATORS) - set(EPISODE_ESTIMATORS)):
        raise ValueError(f"intervals names unknown estimators {sorted(unknown)}; known: "
                         f"{', '.join((*BANDIT_ESTIMATORS, *EPISODE_ESTIMATORS))}")
    data.validate()
    name = getattr(policy, "name", type(policy).__name__)
    pi = policy_probs(policy, data)
    lay = episode_layout(data.episode_id, data.step, data.labels)
    reward = np.asarray(data.reward, dtype=np.float64)
    pscore = np.asarray(data.pscore, dtype=np.float64)
    n = len(data)

    support = check_support(pi, data.action, pscore, role=data.contexts.role, behaviour_probs=behaviour_probs,
                            actions=data.actions, roles=data.roles, policy_name=name,
                            max_unsupported_mass=config.max_unsupported_mass,
                            min_behaviour_prob=config.min_behaviour_prob, supported=supported)
    w = importance_weights(data.action, pscore, pi)
    rounds = lay.first_row if config.bandit_scope == "first_step" else np.arange(n)
    clip = clip_level(pscore, config.clip_factor)
    traj_w = np.cumprod(lay.grid(w, fill=1.0), axis=1)[:, -1]
    # the bootstrap resamples sessions when known (their decisions are dependent), else episodes
    n_sessions = int(len(np.unique(data.groups)))
    interval_reason = session_shortfall(n_sessions, config.min_sessions, data.session_id is not None)
    undefined: set[str] = set()  # estimators undefined on these logs (SNIPS, SNDR with no weight)
    clustered = data.session_id is not None or config.bandit_scope != "first_step"
    boot_groups = data.groups[rounds] if clustered else None
    episode_groups = data.session_id[lay.first_row] if data.session_id is not None else None
    # what a paired difference checks: both policies' terms belong to the same episodes and rounds
    episode_units = np.asarray(data.episode_id)[lay.first_row]
    round_units = np.asarray(data.labels if data.labels is not None else np.arange(n))[rounds]

    def results(scope: str, ests: list[Estimate], groups: np.ndarray | None) -> dict[str, EstimatorResult]:
        wanted = [e for e in ests if (intervals is None or e.name in intervals) and e.name not in undefined
                  and interval_reason is None]
        cis = dict(zip([e.name for e in wanted], bootstrap_cis(wanted, config.n_boot, config.alpha, config.seed,
                                                                groups=groups) if wanted else []))
        units = episode_units if scope == "episode" else round_units
        out = {}
        for est in ests:
            if est.name in undefined:
                out[est.name] = EstimatorResult(est.name, scope, None, None, None, None)
                continue
            ci = cis.get(est.name)
            # a bootstrap whose every replicate was undefined (a ratio with no weight) has no interval
            low, high, se = ((ci.low, ci.high, ci.se) if ci is not None and np.isfinite(ci.low) and np.isfinite(ci.high)
                             else (None, None, None))
            out[est.name] = (EstimatorResult(est.name, scope, est.value, low, high, se, est, units, groups)
                             if keep_terms else EstimatorResult(est.name, scope, est.value, low, high, se))
        return out

    if support.no_support is False and lay.n_episodes < 2:
        support = replace(support, reason=f"no estimate: {lay.n_episodes} episode; cross-fitted models need at "
                          "least 2 (log more tasks)")
    if support.no_support:
        progress(f"OPE {name}: {support.reason}")
        estimates = {k: EstimatorResult(k, "decision", None, None, None, None) for k in BANDIT_ESTIMATORS}
        estimates |= {k: EstimatorResult(k, "episode", None, None, None, None) for k in EPISODE_ESTIMATORS}
    else:
        K = len(data.actions)
        spec = replace(config.feature_spec, roles=tuple(data.roles))  # the one-hot follows the data's roles
        fit = dict(n_folds=config.n_folds, ridge=config.ridge, seed=config.seed, spec=spec)
        # folds are sessions; logs of one session (SAGE without SAGE_SESSION_ID, one day) fold by episode
        folds = data.groups if n_sessions >= 2 else np.asarray(data.episode_id)
        q_reward = cross_fit_q(data.contexts, data.action, reward, folds, K, **fit)
        q_return = cross_fit_q(data.contexts, data.action, reward, folds, K, next_row=lay.next_row,
                               pi=pi, horizon=lay.horizon, gamma=config.gamma, **fit)
        r, a, p, d, q = reward[rounds], data.action[rounds], pscore[rounds], pi[rounds], q_reward[rounds]
        # SNIPS and SNDR are undefined where the policy puts no weight on any round's logged action
        # (it can still have support on later steps): those two are withheld, the others stand
        bandit = [ips(r, a, p, d), _defined(snips, r, a, p, d, withheld=undefined), dm(d, q), dr(r, a, p, d, q),
                  _defined(sndr, r, a, p, d, q, withheld=undefined),
                  switch_dr(r, a, p, d, q, lambda_=config.switch_lambda)]
        pi_logged = pi[np.arange(n), data.action]
        q_logged = q_return[np.arange(n), data.action]
        v_hat = (pi * q_return).sum(axis=1)
        ep, st, g = lay.episode, lay.step, config.gamma
        episode = [pdis(reward, pscore, pi_logged, ep, st, gamma=g),
                   step_dr(reward, pscore, pi_logged, q_logged, v_hat, ep, st, gamma=g),
                   step_wdr(reward, pscore, pi_logged, q_logged, v_hat, ep, st, gamma=g),
                   step_dr_clip(reward, pscore, pi_logged, q_logged, v_hat, ep, st, gamma=g, clip=clip),
                   fqe(v_hat, ep, st)]
        estimates = results("decision", bandit, boot_groups) | results("episode", episode, episode_groups)
        progress(f"OPE {name}: {n} decisions, {lay.n_episodes} episodes, {n_sessions} sessions; "
                 + ", ".join(f"{k} {v.value:.4f}" for k, v in estimates.items() if v.value is not None)
                 + (f"; no intervals: {interval_reason}" if interval_reason else ""))

    return PolicyEvaluation(
        policy=name, estimates=estimates, n_decisions=n, n_episodes=lay.n_episodes,
        n_bandit_rounds=len(rounds), ess=kish_ess(w[rounds]), ess_episode=kish_ess(traj_w),
        max_weight=float(w.max()), support_share=support.share, unsupported_mass=support.unsupported_mass,
        no_support_reason=support.reason, config=config, clip_weight=clip, n_sessions=n_sessions,
        interval_reason=interval_reason)


def paired_difference(a: PolicyEvaluation, b: PolicyEvaluation, estimator: str = HEADLINE_ESTIMATOR, *,
                      n_boot: int | None = None, alpha: float | None = None, seed: int | None = None) -> Difference:
    """``b - a`` of ``estimator`` for two evaluations of the same logs (:func:`evaluate_policy` on one
    :class:`LoggedData`), with a percentile-bootstrap interval that resamples the episodes (sessions
    when known) once for both: the interval of the difference, not of either value. ``n_boot``,
    ``alpha``, ``seed``: default ``b``'s OPE config. No value (``reason`` says why) when either
    estimate was withheld."""
    ea, eb = a.estimates.get(estimator), b.estimates.get(estimator)
    if ea is None or eb is None:
        raise ValueError(f"estimator {estimator!r} is not one of {', '.join(b.estimates)}")
    cfg = b.config
    n_boot, alpha, seed = (cfg.n_boot if n_boot is None else n_boot, cfg.alpha if alpha is None else alpha,
                           cfg.seed if seed is None else seed)
    missing = [ev.policy for ev, e in ((a, ea), (b, eb)) if e.value is None]
    if missing:
        reasons = "; ".join(f"{ev.policy}: {ev.no_support_reason or 'withheld'}" for ev in (a, b)
                            if ev.policy in missing)
        return Difference(estimator, a.policy, b.policy, None, None, None, None, 0, f"no difference: {reasons}")
    if ea.terms is None or eb.terms is None:
        raise ValueError(f"the {estimator} results of {a.policy!r} and {b.policy!r} carry no per-unit terms: "
                         "evaluate both with ope.evaluate_policy (keep_terms=True, the default) to compare them paired")
    if ea.units is None or eb.units is None or len(ea.units) != len(eb.units) or (ea.units != eb.units).any():
        raise ValueError(f"{a.policy!r} and {b.policy!r} were evaluated on different logs "
                         f"({len(ea.terms.round_rewards)} and {len(eb.terms.round_rewards)} units, or other "
                         "episodes): a paired difference needs both evaluated on the same LoggedData")
    est = difference_estimate(ea.terms, eb.terms)
    short = b.interval_reason or a.interval_reason
    if short is not None:  # too few sessions: the difference, no interval, and why
        return Difference(estimator, a.policy, b.policy, est.value, None, None, None, len(est.round_rewards),
                          f"no interval: {short}")
    ci = bootstrap_ci(est, n_boot, alpha, seed, groups=eb.groups)
    if not (np.isfinite(ci.low) and np.isfinite(ci.high)):
        return Difference(estimator, a.policy, b.policy, est.value, None, None, None, len(est.round_rewards),
                          "no interval: every bootstrap replicate of the difference was undefined")
    return Difference(estimator, a.policy, b.policy, est.value, ci.low, ci.high, ci.se, len(est.round_rewards))
