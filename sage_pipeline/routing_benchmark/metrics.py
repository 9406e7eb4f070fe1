"""The routing field's metrics on full-information benchmark tables.

**Cost-quality curve.** A router with a willingness-to-pay knob is run at several values;
each gives one point ``(mean cost per prompt, mean quality)`` on the test prompts
(RouterBench, Hu et al. 2024, arXiv:2403.12031, sec. 3: the router maximises
``lambda * quality - cost``; here the equivalent ``quality - w * cost`` with cost weight
``w = 1 / lambda``, so ``w = 0`` buys the best predicted quality at any price).

**AIQ** (RouterBench's Average Improvement in Quality, sec. 3.3 of the paper and
``evaluation/AIQ.py`` in withmartian/routerbench): the router's points are replaced by their
*non-decreasing convex hull* (NDCH): the upper concave envelope of the points — any two
operating points can be mixed at random, so every point of a chord is reachable — made
non-decreasing (beyond the best point, more money buys nothing: the curve stays flat).
``AIQ = 1 / (c_max - c_min) * integral over [c_min, c_max] of the NDCH`` (the paper's
definition, eq. 3: the mean quality over the cost range). Here ``c_min`` and ``c_max`` are the
cheapest and the most expensive single model's mean costs, the same range for every router;
left of a router's cheapest point the curve is 0 (it cannot operate there), right of its
last point it stays at its best quality. This is the ``AIQ`` reported everywhere here.

RouterBench's *code* (``calc_AIQ`` in ``evaluation/AIQ.py``) computes something else, reported
beside it as ``AIQ (RouterBench code)`` (:func:`aiq_routerbench_code`): the trapezoid area of
the NDCH from the router's *own first point* to ``x_max`` (the largest cost on any compared
router's NDCH, the curve extended flat to it), divided by ``x_max`` rather than by the
range. For a router whose curve starts at ``c_min`` it equals ``AIQ * (c_max - c_min) / c_max``
when ``x_max = c_max``: smaller, by the cheapest model's share of the dearest one's cost (on
MMLU about 6%), and it does not penalise a router for starting above ``c_min``.

**Zero router**: the NDCH of the single models' points — what random mixtures of single
models reach without looking at the prompt (RouterBench sec. 3.2). A learned router is
useful only if its AIQ beats it.

**APGR and CPT** (RouteLLM, Ong et al. 2024, arXiv:2406.18665, sec. 4, and
``routellm/evals/evaluate.py`` + ``benchmarks.py`` in lm-sys/RouteLLM), for two-model tables
(a strong and a weak model): a router gives each prompt a score (its estimate that the
strong model is worth calling); thresholds at the 0, 10, ..., 100% quantiles of the scores
(``pd.qcut(scores, 10)``, prompts with score >= threshold go to the strong model, > for
the last threshold) give points (share of strong calls, quality).
``PGR = (quality - q_weak) / (q_strong - q_weak)``; ``APGR`` is the trapezoid area under
quality vs share of strong calls, minus the weak model's area, over the strong model's
minus the weak model's (``apgr_metric``); random routing scores about 0.5. The oracle's curve
is RouteLLM's optimal one (``get_optimal_accuracy`` at 0, 10, ..., 100% strong calls: strong
calls only where the weak model fails and the strong one succeeds), not its three-valued
score through the quantile thresholds, which never reaches the optimum; its APGR exceeds 1
whenever the strong model alone fails prompts the weak one gets right.

**The oracle's cost-quality curve** is the exact optimal frontier (:func:`optimal_frontier`):
for each budget, each prompt on the cheapest model that gets it right (for graded quality,
its own upper hull), budget spent where quality per USD is highest. ``CPT(x%)`` is
the share of strong calls at which the curve first reaches PGR = x (RouteLLM
interpolates with ``np.interp`` over the curve sorted by strong share, which assumes the
quality rises with it; here the first crossing of the piecewise-linear curve, which is the
same when it does and defined when it does not).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

# RouteLLM's published MMLU figures (GPT-4 strong, Mixtral-8x7B weak; routers trained on
# Chatbot Arena preferences, and on those augmented with MMLU-validation "golden" labels).
# Quoted from the paper's MMLU table as summarised by third parties: we could not open the
# paper's table itself, so treat these as approximate context, not a head-to-head result.
ROUTELLM_MMLU_PUBLISHED = {
    "source": "Ong et al. 2024, RouteLLM (arXiv:2406.18665), MMLU results table; approximate",
    "random": {"apgr": 0.50, "cpt50": 0.50, "cpt80": 0.80},
    "arena_only_routers": {"apgr": 0.50, "note": "about random"},
    "best_with_mmlu_labels": {"apgr": 0.60, "cpt50": 0.354, "cpt80": 0.703},
}


def ndch(cost: np.ndarray, quality: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-decreasing convex hull of points: (hull costs, hull qualities), costs increasing."""
    c, q = np.asarray(cost, dtype=np.float64), np.asarray(quality, dtype=np.float64)
    if c.shape != q.shape or c.ndim != 1 or len(c) == 0:
        raise ValueError(f"ndch needs equal-length 1-d cost and quality, got {c.shape} and {q.shape}")
    if not (np.isfinite(c).all() and np.isfinite(q).all()):
        raise ValueError("ndch: cost and quality must be finite")
    order = np.lexsort((-q, c))  # by cost, best quality first among equal costs
    c, q = c[order], q[order]
    keep = np.concatenate([[True], c[1:] != c[:-1]])  # one point per cost: the best
    c, q = c[keep], q[keep]
    hull: list[int] = []
    for i in range(len(c)):  # upper hull, monotone chain
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            cross = (c[b] - c[a]) * (q[i] - q[a]) - (q[b] - q[a]) * (c[i] - c[a])
            if cross >= 0:  # b is on or below the chord a-i
                hull.pop()
            else:
                break
        hull.append(i)
    h = np.asarray(hull)
    top = int(np.argmax(q[h]))  # first point of best quality: beyond it the curve is flat
    return c[h[: top + 1]], q[h[: top + 1]]


def curve_at(hull_cost: np.ndarray, hull_quality: np.ndarray, x: np.ndarray) -> np.ndarray:
    """The NDCH's quality at costs ``x`` (0 left of its first point, flat right of its last)."""
    y = np.interp(x, hull_cost, hull_quality)
    return np.where(x < hull_cost[0], 0.0, y)


def aiq(cost: np.ndarray, quality: np.ndarray, c_min: float, c_max: float) -> float:
    """RouterBench's AIQ of a router's points over the cost range [c_min, c_max] (exact area)."""
    if not c_max > c_min:
        raise ValueError(f"aiq needs c_max > c_min, got [{c_min}, {c_max}]")
    hc, hq = ndch(cost, quality)
    lo = max(c_min, float(hc[0]))  # left of the router's cheapest point the curve is 0
    if lo >= c_max:
        return 0.0
    xs = np.unique(np.concatenate([[lo, c_max], hc[(hc > lo) & (hc < c_max)]]))
    area = np.trapezoid(np.interp(xs, hc, hq), xs)
    return float(area / (c_max - c_min))


def aiq_routerbench_code(cost: np.ndarray, quality: np.ndarray, x_max: float) -> float:
    """AIQ as RouterBench's ``calc_AIQ`` computes it: the NDCH's trapezoid area from its first
    point to ``x_max`` (flat after its last point), divided by ``x_max``."""
    if not x_max > 0:
        raise ValueError(f"aiq_routerbench_code needs x_max > 0, got {x_max}")
    hc, hq = ndch(cost, quality)
    if x_max > hc[-1]:
        hc, hq = np.append(hc, x_max), np.append(hq, hq[-1])
    return float(np.trapezoid(hq, hc) / x_max)


def gap_closed(cost: np.ndarray, quality: np.ndarray, best_cost: float, best_quality: float,
               oracle_cost: np.ndarray, oracle_quality: np.ndarray) -> float:
    """Share of the gap from the best single model to the oracle that a router closes at the best
    model's cost: ``(router(c) - q_best) / (oracle(c) - q_best)`` with ``c`` the best model's
    mean cost and each curve its NDCH (negative: below the best model there)."""
    at = float(curve_at(*ndch(cost, quality), np.array([best_cost]))[0])
    top = float(curve_at(*ndch(oracle_cost, oracle_quality), np.array([best_cost]))[0])
    return (at - best_quality) / (top - best_quality) if top > best_quality else float("nan")


def cost_range(single_cost: np.ndarray) -> tuple[float, float]:
    """The AIQ range: the cheapest and the most expensive single model's mean cost."""
    single_cost = np.asarray(single_cost, dtype=np.float64)
    return float(single_cost.min()), float(single_cost.max())


# ----------------------------------------------------------------------------- sweeps
def decide(utility: np.ndarray, cost: np.ndarray, weight: float) -> np.ndarray:
    """argmax_k utility - weight * cost, per row; ties go to the cheaper model."""
    score = utility - weight * cost if np.isfinite(weight) else -cost
    best = score.max(axis=1, keepdims=True)
    tied = score >= best - 1e-12
    return np.where(tied, cost, np.inf).argmin(axis=1)


def outcome(choice: np.ndarray, quality: np.ndarray, cost: np.ndarray) -> tuple[float, float]:
    """(mean cost, mean quality) of routing row i to model choice[i], by the table's truth."""
    rows = np.arange(len(choice))
    return float(cost[rows, choice].mean()), float(quality[rows, choice].mean())


@dataclass(frozen=True)
class Curve:
    """A router's cost-quality points over its sweep."""

    name: str
    cost: np.ndarray  # mean cost per prompt at each point
    quality: np.ndarray  # mean quality at each point
    knob: np.ndarray  # the cost weight (or mixture share) of each point
    share: np.ndarray  # (points, K) share of prompts routed to each model
    choice: np.ndarray | None = None  # (points, n) the model of each test prompt at each point (for the bootstrap)

    def aiq(self, c_min: float, c_max: float) -> float:
        return aiq(self.cost, self.quality, c_min, c_max)


def sweep(name: str, decide_at, weights: np.ndarray, quality: np.ndarray, cost: np.ndarray) -> Curve:
    """Run ``decide_at(w) -> model per prompt`` at every weight; score by the table's truth."""
    K = quality.shape[1]
    pts, shares, choices = [], [], []
    for w in weights:
        choice = decide_at(float(w))
        pts.append(outcome(choice, quality, cost))
        shares.append(np.bincount(choice, minlength=K) / len(choice))
        choices.append(choice)
    arr = np.asarray(pts)
    return Curve(name, arr[:, 0], arr[:, 1], np.asarray(weights, dtype=np.float64), np.asarray(shares),
                 np.asarray(choices, dtype=np.int16 if K < 32768 else np.int32))


def bootstrap_aiq(curves: dict[str, Curve], quality: np.ndarray, cost: np.ndarray, n_boot: int = 200,
                  seed: int = 0, chunk: int = 25) -> dict[str, np.ndarray]:
    """Each curve's AIQ on ``n_boot`` resamples of the test prompts (with replacement), every router on
    the same resamples (so differences are paired), each router's decisions held fixed (its
    ``choice``), the AIQ range recomputed from the single models' mean costs on each resample.
    Curves without recorded choices are skipped."""
    n, K = quality.shape
    rng = np.random.default_rng(seed)
    named = {k: c for k, c in curves.items() if c.choice is not None}
    rows = np.arange(n)
    per_point = {k: (quality[rows, c.choice], cost[rows, c.choice]) for k, c in named.items()}  # (P, n) each
    out = {k: np.empty(n_boot) for k in named}
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=b).astype(np.float64) / n  # (b, n) resample weights
        single_cost = w @ cost  # (b, K)
        qs = {k: (w @ pq.T, w @ pc.T) for k, (pq, pc) in per_point.items()}  # (b, P) quality, cost
        for j in range(b):
            c_min, c_max = float(single_cost[j].min()), float(single_cost[j].max())
            for k, (mq, mc) in qs.items():
                out[k][start + j] = aiq(mc[j], mq[j], c_min, c_max)
    return out


def aiq_by_group(curves: dict[str, Curve], quality: np.ndarray, cost: np.ndarray, groups: np.ndarray,
                 min_prompts: int = 10, oracle: str | None = "oracle",
                 recompute: dict | None = None) -> dict[str, dict[str, float]]:
    """Each router's AIQ on each group's prompts alone (RouterBench reports AIQ per ``eval_name`` and
    averages them): the router's decisions held fixed (``recompute``: name -> f(quality, cost) -> Curve, a
    router rebuilt on the group's prompts instead, as the random router mixes the group's own hull), the cost
    range from the single models' mean
    costs in the group; ``oracle`` names the exact optimal frontier recomputed per group. Groups
    with fewer than ``min_prompts`` prompts, or whose models all cost the same, are left out."""
    out: dict[str, dict[str, float]] = {}
    for g in pd.unique(groups):
        idx = np.flatnonzero(groups == g)
        if len(idx) < min_prompts:
            continue
        q, c = quality[idx], cost[idx]
        single = c.mean(axis=0)
        c_min, c_max = float(single.min()), float(single.max())
        if not c_max > c_min:
            continue
        rows = np.arange(len(idx))
        res = {}
        for name, make in (recompute or {}).items():  # a router defined by the group's own hull (random)
            curve = make(q, c)
            res[name] = aiq(curve.cost, curve.quality, c_min, c_max)
        for name, curve in curves.items():
            if curve.choice is not None and name not in res:
                ch = curve.choice[:, idx]
                res[name] = aiq(c[rows, ch].mean(axis=1), q[rows, ch].mean(axis=1), c_min, c_max)
        if oracle:
            fr = optimal_frontier(q, c)
            res[oracle] = aiq(fr.cost, fr.quality, c_min, c_max)
        out[str(g)] = res
    return out


# ----------------------------------------------------------------------------- the oracle's frontier
@dataclass(frozen=True)
class Frontier:
    """The exact best (mean cost, mean quality) any prompt-by-prompt assignment reaches, as vertices."""

    cost: np.ndarray  # (V,) increasing
    quality: np.ndarray  # (V,)
    knob: np.ndarray  # (V,) the largest cost weight w (quality per USD) at which each vertex is optimal:
    # the slope of the step that reached it (inf at the start, all prompts on their cheapest model)
    choice_counts: np.ndarray  # (V, K) prompts sent to each model at each vertex


def optimal_frontier(quality: np.ndarray, cost: np.ndarray) -> Frontier:
    """The oracle's cost-quality frontier: for every budget, the most quality any assignment buys.

    Each prompt starts at its cheapest model (the best of those if several cost the same) and
    climbs its own upper convex hull of (cost, quality) points; for binary quality that is one
    step, to the cheapest model that gets the prompt right (none if the cheapest already does
    or no model does). Spending a budget optimally takes the steps of all prompts in order of
    quality gained per USD (a greedy fractional knapsack, exact because each prompt's steps
    come in decreasing slope), so the frontier's vertices are the cumulative sums of the
    sorted steps: every vertex is a deterministic assignment, every point between two a mix
    of them. This is RouteLLM's optimal curve (``get_optimal_accuracy``: strong calls only
    where the weak model fails and the strong one succeeds) with dollars on the x-axis and
    any number of models.
    """
    q, c = np.asarray(quality, dtype=np.float64), np.asarray(cost, dtype=np.float64)
    n, K = q.shape
    rows = np.arange(n)
    cheapest = c.min(axis=1, keepdims=True)
    cur = np.where(c <= cheapest, q, -np.inf).argmax(axis=1)
    start = cur.copy()
    seg_i, seg_from, seg_to, seg_dc, seg_dq = [], [], [], [], []
    for _ in range(K - 1):
        dq = q - q[rows, cur][:, None]
        dc = c - c[rows, cur][:, None]
        up = (dq > 0) & (dc > 0)
        if not up.any():
            break
        slope = np.where(up, dq / np.where(up, dc, 1.0), -np.inf)
        top = slope.max(axis=1, keepdims=True)
        nxt = np.where(up & (slope >= top * (1 - 1e-12)), dq, -np.inf).argmax(axis=1)  # collinear: the farthest
        moving = np.flatnonzero(up.any(axis=1))
        seg_i.append(moving)
        seg_from.append(cur[moving])
        seg_to.append(nxt[moving])
        seg_dc.append(dc[moving, nxt[moving]])
        seg_dq.append(dq[moving, nxt[moving]])
        cur = np.where(up.any(axis=1), nxt, cur)
    cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.zeros(0, dtype=dt))
    f, t = cat(seg_from, np.int64), cat(seg_to, np.int64)
    dcs, dqs = cat(seg_dc, np.float64), cat(seg_dq, np.float64)
    order = np.argsort(-(dqs / dcs), kind="stable")  # steepest first; within a prompt slopes decrease
    f, t, dcs, dqs = f[order], t[order], dcs[order], dqs[order]
    c0, q0 = c[rows, start].mean(), q[rows, start].mean()
    cost_v = np.concatenate([[c0], c0 + np.cumsum(dcs) / n])
    qual_v = np.concatenate([[q0], q0 + np.cumsum(dqs) / n])
    knob = np.concatenate([[np.inf], dqs / dcs])
    counts = np.zeros((len(f) + 1, K), dtype=np.int64)
    counts[0] = np.bincount(start, minlength=K)
    for k in range(K):
        counts[1:, k] = counts[0, k] + np.cumsum(t == k) - np.cumsum(f == k)
    return Frontier(cost_v, qual_v, knob, counts)


# ----------------------------------------------------------------------------- RouteLLM (two models)
@dataclass(frozen=True)
class RouteLLMMetrics:
    apgr: float
    cpt50: float  # share of strong calls (0..1) to recover 50% of the gap
    cpt80: float
    strong_share: np.ndarray  # the curve: share of strong calls ...
    quality: np.ndarray  # ... and quality


def routellm_curve(score: np.ndarray, q_strong: np.ndarray, q_weak: np.ndarray,
                   num_results: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """RouteLLM's evaluation sweep: thresholds at the score's quantiles (``pd.qcut``)."""
    score = np.asarray(score, dtype=np.float64)
    _, thresholds = pd.qcut(score, num_results, retbins=True, duplicates="drop")
    share, qual = [], []
    for i, t in enumerate(thresholds):
        strong = score >= t if i != len(thresholds) - 1 else score > t
        share.append(strong.mean())
        qual.append(np.where(strong, q_strong, q_weak).mean())
    order = np.argsort(share, kind="stable")
    return np.asarray(share)[order], np.asarray(qual)[order]


def routellm_optimal_curve(q_strong: np.ndarray, q_weak: np.ndarray,
                           num_results: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """RouteLLM's optimal curve (``get_optimal_accuracy`` in ``routellm/evals/benchmarks.py``) at
    strong-call shares 0, 1/num_results, ..., 1 (``evaluate.py`` plots 0, 10, ..., 100%): a budget
    of ``share * n`` strong calls goes to the prompts where the strong model gains most over the
    weak one, never where it gains nothing. For binary quality this is RouteLLM's MMLU/GSM8K
    formula exactly (weak correct + min(strong calls, prompts only the strong model gets right),
    fractional calls included); for graded quality its MT-Bench one (the largest positive
    differences first), here with a fractional last call where RouteLLM rounds the budget down.
    """
    gain = np.sort(np.maximum(np.asarray(q_strong, float) - np.asarray(q_weak, float), 0.0))[::-1]
    n = len(gain)
    share = np.linspace(0.0, 1.0, num_results + 1)
    cum = np.concatenate([[0.0], np.cumsum(gain)])
    bonus = np.interp(share * n, np.arange(n + 1), cum)
    return share, float(np.mean(q_weak)) + bonus / n


def first_crossing(x: np.ndarray, y: np.ndarray, target: float) -> float:
    """Smallest x where the piecewise-linear curve (x, y), x sorted, reaches ``target``; NaN if never."""
    if y[0] >= target:
        return float(x[0])
    for i in range(1, len(x)):
        if y[i] >= target:
            if y[i] == y[i - 1]:
                return float(x[i])
            return float(x[i - 1] + (target - y[i - 1]) * (x[i] - x[i - 1]) / (y[i] - y[i - 1]))
    return float("nan")


def routellm_metrics(score: np.ndarray | None, q_strong: np.ndarray, q_weak: np.ndarray,
                     num_results: int = 10) -> RouteLLMMetrics:
    """APGR, CPT(50%) and CPT(80%) of a strong-vs-weak router's scores on the test prompts;
    ``score=None``: of RouteLLM's optimal curve (:func:`routellm_optimal_curve`), the oracle's."""
    share, qual = (routellm_curve(score, q_strong, q_weak, num_results) if score is not None
                   else routellm_optimal_curve(q_strong, q_weak, num_results))
    weak, strong = float(np.mean(q_weak)), float(np.mean(q_strong))
    if not strong > weak:
        raise ValueError(f"APGR needs the strong model to beat the weak one on these prompts "
                         f"(strong {strong:.4f}, weak {weak:.4f})")
    auc = np.trapezoid(qual, share)
    span = share[-1] - share[0]
    apgr = (auc - weak * span) / ((strong - weak) * span) if span > 0 else float("nan")
    cpt = {p: first_crossing(share, qual, weak + p * (strong - weak)) for p in (0.5, 0.8)}
    return RouteLLMMetrics(float(apgr), cpt[0.5], cpt[0.8], share, qual)
