"""The gate: a candidate edit survives only if val says it helps beyond what chance explains.

A model whose answers depend on the whole prompt (any OpenAI-compatible model at temperature
0 is a fixed function of it; above 0 it draws afresh) changes answers on tasks an edit has
nothing to do with, so "strictly better mean and no val task worse" (the old default) has no
power against it, and "strictly better mean" alone accepts useless edits about half the time
(issue 42). The default test therefore has a stated false-accept rate.

**The paired test** (``test="paired"``, the default). Every val task is replayed under the
state the candidate would replace (the baseline) and under the candidate: ``samples`` times
each when the backend draws fresh answers (``Backend.draws_fresh``: temperature above 0),
once when it answers deterministically (more replays of the same prompt would repeat the
answer). A task's score is the gate metric averaged over its samples and ``d_i`` is the
candidate's score minus the baseline's. The statistic is ``S = sum(d_i)`` and the test is a
one-sided sign-flip (paired permutation) test over tasks: if the edit has no real effect,
each task's baseline and candidate replays are exchangeable (both are draws of a prompt the
task's answer does not systematically prefer), so ``d_i`` is symmetric about 0 and ``S`` is
distributed as ``sum(+-|d_i|)``. The p-value is exact (that distribution convolved over the
changed tasks' distinct magnitudes: with pass/fail scores, the exact sign test) unless its
support passes ``EXACT_SUPPORT`` points, then ``permutations`` Monte Carlo flips with
``p = (1 + #{S* >= S}) / (1 + B)`` (a valid p-value), seeded by the data so a decision is
reproducible. Tasks whose score did not change carry no evidence either way.

Level. ``alpha`` is the night's family-wise false-accept level. The SAGE night
(``sage_night._Night._gate``, ``decisions="per_night"``) gates each of tonight's screened edit
groups at ``alpha / trials``, ``trials`` their count, fixed after screening and before any is
tested (Bonferroni, valid whatever the dependence between the trials; a bundle is one trial at
``alpha``), so on a night where no edit has a real effect the gate accepts anything with
probability at most ``alpha``. That holds for one night; the default, ``decisions="ledger"``,
decides through :mod:`sage_pipeline.decisions` instead, at one level over every night. Each accepted group becomes
the baseline of the next one and the live documents the baseline of the next night; those
baselines were selected for scoring well on val, which only makes later tests conservative.
At temperature 0 a rule rejected tonight and proposed again on the same documents and the
same val tasks meets the same answers: new evidence comes from new val tasks (each day's
harvest) or from fresh samples above temperature 0, never from asking again.

Single tasks. ``no_regression`` (default on) bounds how many val tasks may drop
*significantly*, instead of refusing any task that scores lower (at temperature 0 about half
the tasks change under any edit, so "none worse" refuses real gains). With ``k >= 2`` fresh
samples per arm a task has dropped when a one-sided exact permutation test of its ``2k``
replays (``C(2k, k)`` splits; Monte Carlo past ``k = 8``) says the candidate is worse at
``drop_alpha``; a candidate is refused when more tasks dropped than ``b``, the smallest count
with ``P(Binomial(n, drop_alpha) > b) <= drop_tolerance``: a candidate that hurts no task is
refused by this rule on at most ``drop_tolerance`` of nights. With one sample per task no
single task's drop can be told from chance, and the trial says so.

Cannot tell. A candidate with a positive mean change that the test cannot separate from
chance is ``cannot_tell``; the trial gives the number of val tasks a test at this level would
need (power ``power``) for the observed change, and the smallest change this night's tasks
resolve, from the spread of the ``d_i``.

**The strict test** (``test="strict"``, the old default, for comparison): accepted when the
mean is strictly above the baseline's (ties reject) and, with ``no_regression``, no val task
scores lower; ``no_regression=False`` is SkillOpt's mean-only gate. Each val task is replayed
once. ``mode="off"`` accepts every applicable edit (comparison only). The test split never
enters here.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from itertools import combinations
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.sleep.records import TaskResult

EPS = 1e-9
EXACT_SUPPORT = 1 << 18  # the exact sign-flip distribution is kept up to this many distinct sums
EXACT_SPLITS_MAX_SAMPLES = 8  # per-task drop test: C(2k, k) splits enumerated up to k = 8 (12,870)
VERDICTS = ("better", "cannot_tell", "tie", "worse", "regression", "gate_off")


class GateConfig(BaseModel):
    """How the gate scores val and when a candidate survives."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    test: Literal["paired", "strict"] = Field(
        "paired", description="'paired': a one-sided sign-flip test over val tasks at a stated false-accept "
                              "level; 'strict': the old rule (strictly better mean, and with no_regression no "
                              "val task worse), for comparison")
    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="'paired': the most a night on which no edit has a "
                         "real effect may accept anything (each of tonight's screened edits is tested at alpha / "
                         "their count)")
    samples: int = Field(4, ge=1, le=64, description="'paired': replays of each val task per arm when the backend "
                         "draws fresh answers (temperature > 0); a deterministic backend is replayed once")
    permutations: int = Field(20000, ge=1000, description="'paired': Monte Carlo sign flips when the exact "
                              "null distribution would be too large (many distinct score changes)")
    power: float = Field(0.8, gt=0.0, lt=1.0, description="'paired': the power at which a night that cannot "
                         "tell reports the val tasks it would need")
    drop_alpha: float = Field(0.05, gt=0.0, lt=1.0, description="'paired' with no_regression: a val task has "
                              "dropped when its replays say the candidate is worse at this level")
    drop_tolerance: float = Field(0.05, gt=0.0, lt=1.0, description="'paired' with no_regression: how often a "
                                  "candidate that hurts no task may be refused by the bound on dropped tasks")
    metric: Literal["hard", "soft", "mixed"] = Field(
        "mixed", description="a task's score: its hard result, its soft result, or hard_weight * hard + "
                             "(1 - hard_weight) * soft")
    hard_weight: float = Field(0.5, ge=0.0, le=1.0, description="weight of hard in the mixed metric, in [0, 1]")
    no_regression: bool = Field(True, description="protect single val tasks: 'paired': refuse a candidate under "
                                "which more val tasks drop significantly than chance explains; 'strict': refuse "
                                "one that lowers any single val task, even if the mean rises")
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

    def replays(self, draws_fresh: bool) -> int:
        """Replays of each val task per arm: ``samples`` for the paired test against a backend that
        draws fresh answers, else 1."""
        return self.samples if self.test == "paired" and self.mode == "on" and draws_fresh else 1


def summary(results: Sequence[TaskResult], cfg: GateConfig) -> dict | None:
    """hard, soft and gate score of a replayed split (None when the split is empty); ``tasks`` counts
    distinct tasks, ``samples`` the replays of each."""
    if not results:
        return None
    tasks = len({r.task_id for r in results})
    return {"hard": float(np.mean([r.hard for r in results])), "soft": float(np.mean([r.soft for r in results])),
            "score": cfg.score(results), "tasks": tasks, "samples": len(results) // tasks}


@dataclass
class Trial:
    """One gate decision: a candidate (some edits) against the state it would replace."""

    edits: list[str]
    baseline: float
    candidate: float
    accepted: bool
    verdict: str  # one of VERDICTS
    reason: str
    improved: list[str] = field(default_factory=list)
    regressed: list[str] = field(default_factory=list)
    test: str = "strict"
    tasks: int = 0
    samples: int = 1
    p_value: float | None = None
    level: float | None = None  # the level this trial was tested at (alpha / trials)
    exact: bool | None = None  # p-value enumerated exactly (else Monte Carlo)
    dropped: list[str] = field(default_factory=list)  # val tasks that dropped significantly
    max_dropped: int | None = None  # the bound on them (None: not testable or not asked)
    needed_tasks: int | None = None  # cannot_tell: val tasks a test would need for the observed change
    detectable: float | None = None  # the smallest mean change this night's tasks resolve

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Paired:
    """Per-task scores of both arms: ``base`` and ``cand`` are (tasks, samples) arrays."""

    ids: list[str]
    base: np.ndarray
    cand: np.ndarray

    @property
    def diff(self) -> np.ndarray:
        return self.cand.mean(axis=1) - self.base.mean(axis=1)


def pair(base: Sequence[TaskResult], cand: Sequence[TaskResult], cfg: GateConfig) -> Paired:
    """Groups each arm's replays by task (samples of one task share its id) and checks that both arms
    replayed the same tasks the same number of times."""
    def grouped(results: Sequence[TaskResult]) -> dict[str, list[float]]:
        out: dict[str, list[float]] = {}
        for r, s in zip(results, cfg.task_scores(results), strict=True):
            out.setdefault(r.task_id, []).append(float(s))
        return out

    b, c = grouped(base), grouped(cand)
    if not b and not c:
        raise ValueError("no val results to compare: the gate needs at least one val task replayed in both arms")
    if set(b) != set(c):
        only = sorted(set(b) ^ set(c))[:5]
        raise ValueError(f"baseline and candidate were not replayed on the same val tasks (differ in "
                         f"{', '.join(only)}): replay both arms on one val split")
    counts = {len(v) for v in b.values()} | {len(v) for v in c.values()}
    if len(counts) > 1:
        raise ValueError(f"val tasks were replayed unequally often ({sorted(counts)} samples): replay every task "
                         "the same number of times in both arms")
    ids = list(b)
    return Paired(ids, np.array([b[i] for i in ids], float), np.array([c[i] for i in ids], float))


def sign_flip_p(d: np.ndarray, permutations: int) -> tuple[float, bool]:
    """One-sided p-value of ``sum(d) > 0`` under sign symmetry, and whether it is exact.

    Exact: the changed tasks grouped by magnitude ``v`` (``n_v`` of them), ``S`` under the null is
    ``sum_v v * (2 * Binomial(n_v, 1/2) - n_v)``, convolved group by group on its distinct sums
    (binary scores give one group per sample fraction, so this is the exact sign test); when that
    support passes ``EXACT_SUPPORT`` points (many distinct magnitudes), ``permutations`` Monte Carlo
    sign flips instead."""
    from scipy.stats import binom

    changed = d[np.abs(d) > EPS]
    if changed.size == 0:
        return 1.0, True
    nz, s = np.abs(changed), float(changed.sum())
    mags, counts = np.unique(np.round(nz, 9), return_counts=True)
    sums, probs = np.zeros(1), np.ones(1)
    for v, n in zip(mags, counts, strict=True):
        j = np.arange(n + 1)
        sums = (sums[:, None] + v * (2.0 * j - n)[None, :]).ravel()
        probs = (probs[:, None] * binom.pmf(j, n, 0.5)[None, :]).ravel()
        sums, inverse = np.unique(np.round(sums, 9), return_inverse=True)
        probs = np.bincount(inverse, probs)
        if sums.size > EXACT_SUPPORT:
            break
    else:
        return float(min(1.0, probs[sums >= s - 1e-7].sum())), True
    seed = int.from_bytes(hashlib.sha256(np.round(d, 9).tobytes()).digest()[:8], "big")
    rng = np.random.default_rng(seed)
    hits, done, chunk = 0, 0, 4096
    while done < permutations:
        n = min(chunk, permutations - done)
        signs = rng.integers(0, 2, size=(n, nz.size), dtype=np.int8) * 2 - 1
        hits += int(np.count_nonzero(signs @ nz >= s - EPS))
        done += n
    return (1 + hits) / (1 + permutations), False


def drop_p_values(base: np.ndarray, cand: np.ndarray, permutations: int) -> np.ndarray:
    """Per task, the one-sided p-value of "the candidate scores lower" from a permutation test of its
    ``2k`` replays (exact over the ``C(2k, k)`` splits up to k = 8, else Monte Carlo)."""
    n, k = base.shape
    pooled = np.concatenate([base, cand], axis=1)  # (n, 2k)
    observed = base.mean(axis=1) - cand.mean(axis=1)
    total = pooled.sum(axis=1)
    if k <= EXACT_SPLITS_MAX_SAMPLES:
        masks = np.zeros((math.comb(2 * k, k), 2 * k))
        for row, cols in enumerate(combinations(range(2 * k), k)):
            masks[row, list(cols)] = 1.0
        as_base = pooled @ masks.T  # (n, splits): the sum of the replays labelled baseline
        stats = (2.0 * as_base - total[:, None]) / k  # mean(base) - mean(cand) of each split
        return np.mean(stats >= observed[:, None] - EPS, axis=1)
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(np.round(pooled, 9).tobytes()).digest()[:8], "big"))
    reps = min(permutations, 4000)
    perms = np.argsort(rng.random((reps, 2 * k)), axis=1)[:, :k]  # which replays are labelled baseline
    as_base = pooled[:, perms].sum(axis=2)  # (n, reps)
    stats = (2.0 * as_base - total[:, None]) / k
    return (1 + np.sum(stats >= observed[:, None] - EPS, axis=1)) / (1 + reps)


def drop_bound(n: int, drop_alpha: float, tolerance: float) -> int:
    """The smallest b with P(Binomial(n, drop_alpha) > b) <= tolerance."""
    from scipy.stats import binom

    return int(binom.ppf(1.0 - tolerance, n, drop_alpha))


def needed_tasks(d: np.ndarray, effect: float, level: float, power: float) -> int | None:
    """Val tasks a one-sided test at ``level`` would need to resolve a mean change ``effect`` with
    probability ``power``, from the spread of ``d`` (normal approximation), and never fewer than
    the sign-flip test's floor (``log2(1 / level)`` changed tasks, at this night's share of changed
    tasks). None when ``effect <= 0``."""
    if effect <= EPS:
        return None
    z = NormalDist().inv_cdf(1.0 - level) + NormalDist().inv_cdf(power)
    sd = float(np.std(d, ddof=1)) if d.size > 1 else 0.0
    normal = math.ceil((z * sd / effect) ** 2)
    changed = float(np.mean(np.abs(d) > EPS))
    floor = math.ceil(math.log2(1.0 / level) / changed) if changed > 0 else 0
    return max(normal, floor, d.size + 1)


def detectable(d: np.ndarray, level: float, power: float) -> float | None:
    """The smallest mean change ``d.size`` tasks resolve at ``level`` with probability ``power`` (None
    when the changes do not spread: fewer than two tasks, or all alike)."""
    sd = float(np.std(d, ddof=1)) if d.size > 1 else 0.0
    if sd <= EPS:
        return None
    z = NormalDist().inv_cdf(1.0 - level) + NormalDist().inv_cdf(power)
    return float(z * sd / math.sqrt(d.size))


def changes(base: Sequence[TaskResult], cand: Sequence[TaskResult], cfg: GateConfig) -> tuple[list[str], list[str]]:
    """Val tasks whose mean score rose, and those whose mean score fell."""
    p = pair(base, cand, cfg)
    ids = np.array(p.ids, dtype=object)
    return [str(x) for x in ids[p.diff > EPS]], [str(x) for x in ids[p.diff < -EPS]]


def compare(base: Sequence[TaskResult], cand: Sequence[TaskResult], cfg: GateConfig,
            edits: list[str] | None = None, trials: int = 1) -> Trial:
    """Decide on a candidate from the val results of the state it would replace and its own.

    Replays of one task share its id. ``trials``: the size of the night's family of trials (the
    paired test runs this one at ``alpha / trials``)."""
    if trials < 1:
        raise ValueError(f"trials={trials}: a night gates at least one group")
    p = pair(base, cand, cfg)
    d = p.diff
    ids = np.array(p.ids, dtype=object)
    improved, regressed = [str(x) for x in ids[d > EPS]], [str(x) for x in ids[d < -EPS]]
    mb, mc = float(p.base.mean()), float(p.cand.mean())
    n, k = p.base.shape
    common = {"improved": improved, "regressed": regressed, "test": cfg.test, "tasks": n, "samples": k}
    edits = edits or []
    if cfg.mode == "off":
        return Trial(edits, mb, mc, True, "gate_off", f"gate off: accepted without a check (val {mb:.3f} -> "
                     f"{mc:.3f})", **common)
    if cfg.test == "strict":
        return _strict(edits, mb, mc, cfg, common)
    return _paired(edits, mb, mc, p, cfg, trials, common)


def _strict(edits: list[str], mb: float, mc: float, cfg: GateConfig, common: dict) -> Trial:
    regressed = common["regressed"]
    if mc <= mb + EPS:
        word = "tie" if abs(mc - mb) <= EPS else "worse"
        return Trial(edits, mb, mc, False, word, f"{word}: val {cfg.metric} {mb:.3f} -> {mc:.3f} (accepted only "
                     "if strictly better)", **common)
    if cfg.no_regression and regressed:
        return Trial(edits, mb, mc, False, "regression", f"val {cfg.metric} rose {mb:.3f} -> {mc:.3f} but "
                     f"{len(regressed)} val task(s) got worse ({', '.join(regressed[:5])}): no_regression rejects",
                     **common)
    note = f"; {len(regressed)} val task(s) got worse ({', '.join(regressed[:5])})" if regressed else ""
    return Trial(edits, mb, mc, True, "better", f"strictly better: val {cfg.metric} {mb:.3f} -> {mc:.3f}{note}",
                 **common)


def _paired(edits: list[str], mb: float, mc: float, p: Paired, cfg: GateConfig, trials: int,
            common: dict) -> Trial:
    d = p.diff
    n, k = p.base.shape
    level = cfg.alpha / trials
    pv, exact = sign_flip_p(d, cfg.permutations)
    mde = detectable(d, level, cfg.power)
    stats = {"p_value": pv, "level": level, "exact": exact, "detectable": mde}
    head = (f"val {cfg.metric} {mb:.3f} -> {mc:.3f} over {n} task(s) x {k} sample(s), mean change {d.mean():+.3f}, "
            f"p = {pv:.3g} ({'exact' if exact else f'{cfg.permutations} sign flips'}) against level {level:.3g} "
            f"(alpha {cfg.alpha:g} / {trials} trial(s))")
    changed = int(np.count_nonzero(np.abs(d) > EPS))
    if changed == 0:
        return Trial(edits, mb, mc, False, "tie", f"tie: no val task changed ({head})", **common, **stats)
    if d.mean() <= EPS:
        return Trial(edits, mb, mc, False, "worse", f"worse: {head}", **common, **stats)
    if pv > level:
        need = needed_tasks(d, float(d.mean()), level, cfg.power)
        mde_note = f"; {n} tasks resolve a change of {mde:+.3f} or more" if mde is not None else ""
        return Trial(edits, mb, mc, False, "cannot_tell",
                     f"cannot tell: {head}; a change of {d.mean():+.3f} needs about {need} val tasks at "
                     f"{cfg.power:.0%} power{mde_note}", **common, **stats, needed_tasks=need)
    dropped: list[str] = []
    bound: int | None = None
    drop_note = ""
    if cfg.no_regression and k >= 2:
        pd_ = drop_p_values(p.base, p.cand, cfg.permutations)
        dropped = [p.ids[i] for i in np.flatnonzero(pd_ <= cfg.drop_alpha)]
        bound = drop_bound(n, cfg.drop_alpha, cfg.drop_tolerance)
        if len(dropped) > bound:
            return Trial(edits, mb, mc, False, "regression",
                         f"regression: {head}, but {len(dropped)} val task(s) dropped significantly (at "
                         f"{cfg.drop_alpha:g}; chance explains at most {bound}): {', '.join(dropped[:5])}",
                         **common, **stats, dropped=dropped, max_dropped=bound)
        drop_note = f"; {len(dropped)} val task(s) dropped significantly (at most {bound} allowed)"
    elif cfg.no_regression:
        drop_note = "; with one sample per task no single task's drop can be told from chance"
    return Trial(edits, mb, mc, True, "better", f"better: {head}{drop_note}", **common, **stats,
                 dropped=dropped, max_dropped=bound)
