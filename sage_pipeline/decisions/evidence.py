"""Evidence that stays valid however often it is looked at: betting e-processes and the confidence
sequence they give (Waudby-Smith & Ramdas, "Estimating means of bounded random variables by
betting", JRSS-B 2023), in the CleanRL manner: the settings in one dataclass, the update on one screen.

**What is tested.** A stream of observations ``x_t``, each bounded in a range ``[lo_t, hi_t]`` known
before it is seen, whose conditional mean given the past is the candidate's effect ``delta`` (the
gain in the objective over the incumbent). Two kinds feed it:

- a randomised live run (:func:`ipw_difference`): ``x = (Z/p - (1-Z)/(1-p)) * (y - c)`` with ``Z`` the
  recorded draw (1: the candidate), ``p`` its exact probability and ``c`` a centre fixed before the run
  (the running mean of the outcomes): ``E[x | past] = E[y | cand] - E[y | incumbent]`` whatever ``c``;
- a paired replay of one task (:func:`paired_difference`): the candidate's mean pass minus the
  incumbent's on a task no selection looked at, in ``[-1, 1]``.

**The guarantee.** For each null value ``d`` on a grid, ``K+_t(d) = prod (1 + l_i (x_i - d))`` (bets on
``delta > d``) and ``K-_t(d) = prod (1 + l_i (d - x_i))`` (bets on ``delta < d``), each ``l_i >= 0``
chosen from the past only and small enough that no factor is negative. Under ``delta <= d``
(resp. ``>= d``) ``K+`` (resp. ``K-``) is a non-negative supermartingale starting at 1, so by Ville's
inequality **the chance it ever reaches 1/a, on any night of an unbounded sequence, is at most a**.
That is the sentence a user can check: *an accept at level a needs K+(0) >= 1/a, and the chance that
a candidate with no gain is ever accepted, however many nights it is looked at, is at most a.*
The confidence sequence ``{d : (K+(d) + K-(d)) / 2 < 1/a}`` covers ``delta`` at every night at once
with probability ``1 - a``. Streams of different kinds on the same candidate multiply (each factor has
conditional mean <= 1 given everything before it, whichever stream it came from).

**The bets** (``EvidenceConfig.bet``; validity never depends on the bets, power does), each capped at
``cap`` times the largest safe bet:

- ``plug_in``: aGRAPA's plug-in ``l = m / (v + m^2)``, ``m`` and ``v`` the past mean of ``x - d`` and
  variance of ``x``, discounted with a half-life so an effect that turns is followed. Its bet is noisy while
  ``m`` is: about half a nat of log-wealth lost per e-fold of observations against the best fixed bet.
- ``mixture``: the average, with equal weights, of one e-process per gain ``g`` of ``mixture_gaps`` (a gain
  above the null ``d``, or below it for ``K-``), each betting ``l_g = g / (v + g^2)`` with ``v`` the same
  past variance: a mixture SPRT over the gains worth finding (from the minimum useful gain up), the
  variance the only thing learnt. An average of e-processes is an e-process, so Ville's bound holds as
  for one; against a gain near the grid it loses at most ``log(len(mixture_gaps))`` nats, not a growing
  regret. ``Stream.comp_plus``/``comp_minus`` keep each component's log-wealth; ``log_plus``/``log_minus``
  are the mixture's.

numpy only; the state is arrays with a leading batch axis, so a benchmark runs 200 months at once
and the ledger runs one (batch 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator


class EvidenceConfig(BaseModel):
    """How one candidate's evidence is kept (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    grid_low: float = Field(-1.0, ge=-10.0, le=0.0, description="lowest effect on the confidence sequence's grid")
    grid_high: float = Field(1.0, ge=0.0, le=10.0, description="highest effect on the grid")
    grid_points: int = Field(201, ge=11, le=2001, description="grid points (0 and the minimum useful gain are "
                             "always on it)")
    cap: float = Field(0.9, gt=0.0, lt=1.0, description="largest bet, as a share of the largest safe one (0.9: a "
                       "paired replay's best bet is past the safe one, and 0.9 keeps a strong rule in 112 runs where "
                       "0.5 took 148, with no more false accepts: benchmarks/decision_month.py)")
    half_life: float = Field(400.0, gt=0.0, description="observations after which a past observation counts "
                             "half in the bets' plug-in (how fast the bets follow an effect that turns)")
    prior_mean: float = Field(0.0, description="the plug-in's prior mean of x (weight prior_weight)")
    prior_var: float = Field(0.25, gt=0.0, description="the plug-in's prior variance of x")
    prior_weight: float = Field(2.0, gt=0.0, description="observations' worth of the prior in the plug-in")
    bet: Literal["plug_in", "mixture"] = Field("plug_in", description="how each bet is chosen: aGRAPA's plug-in "
                                               "of the past mean, or the mixture over mixture_gaps (the module doc)")
    mixture_gaps: tuple[float, ...] = Field((0.03, 0.04, 0.05, 0.06, 0.08), description="the mixture's gains above "
                                            "the null, one e-process each, equal weights: from the ledger's minimum "
                                            "useful gain (0.03) to 2.7 times it (a larger gain is found fast "
                                            "anyway). On the coder's randomised runs this grid needed 650 runs "
                                            "where the plug-in needed 764 and 0.03 to 0.24 needed 689 "
                                            "(benchmarks/decision_month.py)")

    @field_validator("mixture_gaps")
    @classmethod
    def _gaps(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if not 1 <= len(v) <= 32 or any(not (0.0 < g <= 10.0) for g in v) or len(set(v)) != len(v):
            raise ValueError("mixture_gaps: 1 to 32 distinct gains in (0, 10]")
        return v

    def components(self) -> int:
        """Component e-processes per null: ``len(mixture_gaps)`` for the mixture, 0 for the plug-in."""
        return len(self.mixture_gaps) if self.bet == "mixture" else 0


def grid(cfg: EvidenceConfig, extra: tuple[float, ...] = ()) -> np.ndarray:
    """The nulls tested at once: ``grid_points`` evenly spaced, plus ``0`` and ``extra`` (sorted, unique)."""
    g = np.linspace(cfg.grid_low, cfg.grid_high, cfg.grid_points)
    return np.unique(np.concatenate([g, [0.0], np.asarray(extra, dtype=np.float64)]))


@dataclass
class Stream:
    """One evidence source's betting state, for ``batch`` independent copies (benchmark months).

    ``log_plus``/``log_minus``: (batch, G) log-wealth against ``delta <= d`` / ``delta >= d`` for each
    grid null ``d``; ``w``, ``s1``, ``s2``: (batch,) discounted count, sum and sum of squares of x (the
    plug-in's memory); ``n``: (batch,) observations seen; ``total``: (batch,) their undiscounted sum;
    ``comp_plus``/``comp_minus``: (batch, G, K) each mixture component's log-wealth (None for the plug-in:
    a stream is fed with the one bet it was started with)."""

    nulls: np.ndarray
    log_plus: np.ndarray
    log_minus: np.ndarray
    w: np.ndarray
    s1: np.ndarray
    s2: np.ndarray
    n: np.ndarray
    total: np.ndarray
    comp_plus: np.ndarray | None = None
    comp_minus: np.ndarray | None = None

    @classmethod
    def start(cls, nulls: np.ndarray, batch: int = 1, components: int = 0) -> Stream:
        """A fresh stream; ``components``: :meth:`EvidenceConfig.components` of the config it will be fed with."""
        z = np.zeros(batch)
        G = len(nulls)
        comp = (np.zeros((batch, G, components)), np.zeros((batch, G, components))) if components else (None, None)
        return cls(np.asarray(nulls, dtype=np.float64), np.zeros((batch, G)), np.zeros((batch, G)),
                   z.copy(), z.copy(), z.copy(), z.copy(), z.copy(), *comp)

    def components(self) -> int:
        return 0 if self.comp_plus is None else int(self.comp_plus.shape[2])

    def update(self, x, lo, hi, cfg: EvidenceConfig, valid=None) -> None:
        """One observation per batch row: ``x`` (batch,), its bounds ``lo``/``hi`` (scalars or (batch,),
        fixed before it was seen), ``valid`` (batch,) bool: rows without an observation this step."""
        if cfg.components() != self.components():
            raise ValueError(f"a stream started with {self.components() or 'the plug-in'} bet components fed with "
                             f"bet={cfg.bet!r} ({cfg.components()} components): feed a stream with the config it "
                             "was started with")
        b = self.w.shape[0]
        x = np.broadcast_to(np.asarray(x, dtype=np.float64), (b,))
        lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), (b,))
        hi = np.broadcast_to(np.asarray(hi, dtype=np.float64), (b,))
        ok = np.ones(b, bool) if valid is None else np.asarray(valid, bool)
        if not ok.any():
            return
        if np.any((x[ok] < lo[ok] - 1e-9) | (x[ok] > hi[ok] + 1e-9)):
            raise ValueError("an observation outside the bounds stated before it was seen: the bets would not be safe")
        pw, pm, pv = cfg.prior_weight, cfg.prior_mean, cfg.prior_var
        W = self.w + pw
        mean = (self.s1 + pw * pm) / W
        var = np.maximum((self.s2 + pw * (pv + pm * pm)) / W - mean * mean, 1e-6)
        d = self.nulls[None, :]
        safe_plus = 1.0 / np.maximum(d - lo[:, None], 1e-12)  # 1 + l (x - d) >= 0 for x >= lo
        safe_minus = 1.0 / np.maximum(hi[:, None] - d, 1e-12)
        xc = x[:, None]
        if self.comp_plus is None:
            m_plus = mean[:, None] - d  # the past mean of x - d
            l_plus = np.clip(m_plus / (var[:, None] + m_plus ** 2), 0.0, cfg.cap * safe_plus)
            m_minus = -m_plus
            l_minus = np.clip(m_minus / (var[:, None] + m_minus ** 2), 0.0, cfg.cap * safe_minus)
            # a null outside [lo, hi] cannot be bet against past its bound: the clip keeps factors >= 1 - cap
            fp = np.log1p(np.maximum(l_plus * (xc - d), -cfg.cap))
            fm = np.log1p(np.maximum(l_minus * (d - xc), -cfg.cap))
        else:
            g = np.asarray(cfg.mixture_gaps, dtype=np.float64)[None, None, :]
            lg = g / (var[:, None, None] + g * g)  # (batch, 1, K): the same bet at every null, then capped
            l_plus = np.minimum(lg, cfg.cap * safe_plus[:, :, None])
            l_minus = np.minimum(lg, cfg.cap * safe_minus[:, :, None])
            cp = self.comp_plus + np.log1p(np.maximum(l_plus * (xc - d)[:, :, None], -cfg.cap))
            cm = self.comp_minus + np.log1p(np.maximum(l_minus * (d - xc)[:, :, None], -cfg.cap))
            self.comp_plus = np.where(ok[:, None, None], cp, self.comp_plus)
            self.comp_minus = np.where(ok[:, None, None], cm, self.comp_minus)
            K = g.shape[2]
            fp = _mean_exp(self.comp_plus, K) - self.log_plus  # so log_plus becomes the mixture's log-wealth
            fm = _mean_exp(self.comp_minus, K) - self.log_minus
        self.log_plus = np.where(ok[:, None], self.log_plus + fp, self.log_plus)
        self.log_minus = np.where(ok[:, None], self.log_minus + fm, self.log_minus)
        keep = 0.5 ** (1.0 / cfg.half_life)
        self.w = np.where(ok, keep * self.w + 1.0, self.w)
        self.s1 = np.where(ok, keep * self.s1 + x, self.s1)
        self.s2 = np.where(ok, keep * self.s2 + x * x, self.s2)
        self.n = self.n + ok
        self.total = self.total + np.where(ok, x, 0.0)

    def feed(self, xs, lo, hi, cfg: EvidenceConfig) -> None:
        """A sequence of observations for a batch of one (the ledger's use): ``xs``, ``lo``, ``hi`` 1-d."""
        xs = np.asarray(xs, dtype=np.float64).ravel()
        lo = np.broadcast_to(np.asarray(lo, dtype=np.float64), xs.shape)
        hi = np.broadcast_to(np.asarray(hi, dtype=np.float64), xs.shape)
        for i in range(len(xs)):
            self.update(xs[i:i + 1], lo[i:i + 1], hi[i:i + 1], cfg)

    FIELDS = ("nulls", "log_plus", "log_minus", "w", "s1", "s2", "n", "total")

    def to_dict(self) -> dict:
        out = {k: np.asarray(getattr(self, k)).tolist() for k in self.FIELDS}
        if self.comp_plus is not None:
            out["comp_plus"], out["comp_minus"] = self.comp_plus.tolist(), self.comp_minus.tolist()
        return out

    @classmethod
    def from_dict(cls, d: dict) -> Stream:
        comp = tuple(np.asarray(d[k], dtype=np.float64) for k in ("comp_plus", "comp_minus")) \
            if "comp_plus" in d else (None, None)
        return cls(*(np.asarray(d[k], dtype=np.float64) for k in cls.FIELDS), *comp)


def _mean_exp(comp: np.ndarray, K: int) -> np.ndarray:
    """log of the equal-weight average of ``exp(comp)`` over the last axis (stable)."""
    top = comp.max(axis=2)
    return top + np.log(np.exp(comp - top[:, :, None]).sum(axis=2)) - math.log(K)


def combined(streams: list[Stream]) -> tuple[np.ndarray, np.ndarray]:
    """log K+ and log K- of the product of ``streams`` (same grid): (batch, G) each."""
    if not streams:
        raise ValueError("no evidence stream")
    return sum(s.log_plus for s in streams), sum(s.log_minus for s in streams)


def at(nulls: np.ndarray, value: float) -> int:
    """The grid index of ``value`` (it must be on the grid: :func:`grid` puts 0 and the extras there)."""
    i = int(np.argmin(np.abs(nulls - value)))
    if abs(nulls[i] - value) > 1e-12:
        raise ValueError(f"{value} is not on the evidence grid")
    return i


def confidence_sequence(nulls: np.ndarray, log_plus: np.ndarray, log_minus: np.ndarray, alpha: float
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(low, high, centre) per batch row: the grid's nulls not rejected by the two-sided hedged
    process ``(K+ + K-)/2 < 1/alpha``; the centre is the null least rejected. A row that rejects every
    null (the grid is too narrow) gives NaN."""
    two = np.logaddexp(log_plus, log_minus) - math.log(2.0)
    keep = two < math.log(1.0 / alpha)
    lo = np.where(keep.any(axis=1), np.where(keep, nulls[None, :], np.inf).min(axis=1), np.nan)
    hi = np.where(keep.any(axis=1), np.where(keep, nulls[None, :], -np.inf).max(axis=1), np.nan)
    centre = nulls[np.argmin(two, axis=1)]
    return lo, hi, centre


def ipw_contrast(y, on_a, on_b, p_a, p_b, centre) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, lo, hi) of randomised runs for the contrast ``a - b``: ``y`` each run's outcome in [0, 1];
    ``on_a``/``on_b`` whether the run's recorded draw gave arm a / arm b (a run on a third arm has
    both False and gives ``x = 0``); ``p_a``/``p_b`` the draw's exact probabilities of a and b;
    ``centre`` a value in [0, 1] fixed before the run. ``E[x | past] = E[y | a] - E[y | b]``."""
    y = np.asarray(y, dtype=np.float64)
    za, zb = np.asarray(on_a, dtype=np.float64), np.asarray(on_b, dtype=np.float64)
    pa, pb = np.asarray(p_a, dtype=np.float64), np.asarray(p_b, dtype=np.float64)
    c = np.asarray(centre, dtype=np.float64)
    if np.any((pa <= 0) | (pb <= 0) | (pa + pb > 1 + 1e-12)):
        raise ValueError("both arms need a probability above 0 (and together at most 1) to be compared")
    if np.any(za * zb > 0):
        raise ValueError("a run cannot be on both arms")
    if np.any((y < 0) | (y > 1)) or np.any((c < 0) | (c > 1)):
        raise ValueError("outcomes and the centre must lie in [0, 1] (rescale the objective by its stated bounds)")
    x = (za / pa - zb / pb) * (y - c)
    # |y - c| <= max(c, 1 - c) and a run's weight is at most 1 / min(p_a, p_b): bounds known before the run
    r = np.maximum(c, 1.0 - c) / np.minimum(pa, pb)
    return x, -r, r


def ipw_difference(y, arm, p_candidate, centre) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`ipw_contrast` of two arms: ``arm`` 1 for the candidate (probability ``p_candidate``), 0 for
    the incumbent."""
    z = np.asarray(arm, dtype=np.float64)
    p = np.asarray(p_candidate, dtype=np.float64)
    return ipw_contrast(y, z == 1, z == 0, p, 1.0 - p, centre)


def paired_difference(candidate_pass, incumbent_pass) -> tuple[np.ndarray, float, float]:
    """(x, -1, 1) of paired replays: each task's candidate mean pass minus the incumbent's."""
    a = np.asarray(candidate_pass, dtype=np.float64)
    b = np.asarray(incumbent_pass, dtype=np.float64)
    return a - b, -1.0, 1.0


def growth_per_observation(stream: Stream, null: float, side: str = "plus") -> np.ndarray:
    """The log-wealth a further observation adds at the current (discounted) mean and variance, about
    ``m^2 / (2 v)``: what :func:`observations_needed` divides by."""
    W = stream.w + 1e-12
    mean = stream.s1 / W
    var = np.maximum(stream.s2 / W - mean * mean, 1e-6)
    m = mean - null if side == "plus" else null - mean
    return np.where(m > 0, m * m / (2.0 * var), 0.0)


def observations_needed(log_now: np.ndarray, threshold: float, growth: np.ndarray) -> np.ndarray:
    """About how many more observations at ``growth`` per observation bring ``log_now`` to
    ``log(threshold)``; inf when the current effect is on the other side."""
    gap = math.log(threshold) - np.asarray(log_now)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(gap <= 0, 0.0, np.where(growth > 0, np.ceil(gap / growth), np.inf))
