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
useful only if its AIQ beats it. **The random router is the zero router in expectation**: a
router that sends each prompt to model k with probability s_k, whatever the prompt, has expected
cost and quality linear in the shares, so its expected points lie on the chords of the zero
router's hull. Its curve here is that expectation (a ``mixture`` curve, exact), never the hull of
one random draw's points: the upper envelope of noisy points lies above the line they scatter
around, so that hull overstated random by the noise it picked (:func:`path_aiq` scores a draw on
its own path, without a hull, unbiasedly).

**Intervals.** :func:`bootstrap_aiq` resamples the test prompts (every router on the same
resamples, so differences are paired; a ``mixture`` curve's expected points and the oracle's
frontier recomputed on each); :func:`bootstrap_aiq_by_group` does the same within each
``eval_name``. :func:`aiq_batch` is :func:`aiq` for many short curves at once (the resamples).

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

import dataclasses
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


def aiq_batch(cost: np.ndarray, quality: np.ndarray, c_min, c_max) -> np.ndarray:
    """:func:`aiq` of many routers' points at once, row by row: ``cost`` and ``quality`` are (B, P) (NaN:
    no point), ``c_min`` and ``c_max`` scalars or (B,). The same numbers as :func:`aiq` (tested): each
    row's NDCH is the upper hull of its Pareto front (a point some cheaper one matches is never on it),
    found by the slope test (a point is a vertex when every slope from a point left of it is steeper
    than every slope to a point right of it), all rows together. Memory is O(B P^2): for short curves
    (sweeps, bootstrap resamples); one long curve, :func:`aiq`."""
    c, q = np.atleast_2d(np.asarray(cost, dtype=np.float64)), np.atleast_2d(np.asarray(quality, dtype=np.float64))
    if c.shape != q.shape or c.ndim != 2:
        raise ValueError(f"aiq_batch needs (rows, points) cost and quality of one shape, got {c.shape} and {q.shape}")
    B, P = c.shape
    lo = np.broadcast_to(np.asarray(c_min, dtype=np.float64), (B,))
    hi = np.broadcast_to(np.asarray(c_max, dtype=np.float64), (B,))
    if not np.all(hi > lo):
        raise ValueError(f"aiq_batch needs c_max > c_min in every row, got {int((~(hi > lo)).sum())} rows without")
    valid = np.isfinite(c) & np.isfinite(q)
    if not valid.any(axis=1).all():
        raise ValueError("aiq_batch: a row has no finite (cost, quality) point")
    out = np.empty(B)
    step = max(1, (1 << 22) // max(P * P, 1))  # rows per chunk: the slope matrices stay near 32 MB
    for s in range(0, B, step):
        out[s:s + step] = _hull_aiq(c[s:s + step], q[s:s + step], valid[s:s + step], lo[s:s + step],
                                    hi[s:s + step])
    return out


def _hull_aiq(c: np.ndarray, q: np.ndarray, valid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    B, P = c.shape
    ck, qk = np.where(valid, c, np.inf), np.where(valid, q, -np.inf)
    order = np.lexsort((-qk, ck), axis=-1)  # by cost, best quality first among equal costs; no point last
    cs, qs = np.take_along_axis(ck, order, 1), np.take_along_axis(qk, order, 1)
    best_before = np.maximum.accumulate(qs, axis=1)
    front = np.isfinite(cs) & np.concatenate([np.ones((B, 1), dtype=bool), qs[:, 1:] > best_before[:, :-1]], axis=1)
    first = np.argsort(~front, axis=1, kind="stable")[:, :int(front.sum(axis=1).max())]  # the front, in order
    front, cs, qs = (np.take_along_axis(a, first, 1) for a in (front, cs, qs))
    P = front.shape[1]
    x, y = np.where(front, cs, 0.0), np.where(front, qs, 0.0)  # front: cost and quality strictly increasing
    dx = x[:, None, :] - x[:, :, None]  # [b, i, j] = x_j - x_i
    pair = front[:, :, None] & front[:, None, :] & (np.arange(P)[:, None] < np.arange(P)[None, :])
    slope = np.divide(y[:, None, :] - y[:, :, None], dx, out=np.zeros_like(dx), where=pair)
    into = np.where(pair, slope, np.inf).min(axis=1)  # [b, k]: the flattest slope from a point left of k
    out_of = np.where(pair, slope, -np.inf).max(axis=2)  # [b, k]: the steepest slope to a point right of k
    return _polyline_area(x, y, front & (out_of < into), lo, hi) / (hi - lo)


def _polyline_area(x: np.ndarray, y: np.ndarray, vertex: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per row, the area over [lo, hi] under the line through the marked vertices (``x`` increasing among
    them): 0 left of the first, flat right of the last."""
    B, P = x.shape
    at = np.where(vertex, np.arange(P), P)
    after = np.concatenate([np.minimum.accumulate(at[:, ::-1], axis=1)[:, ::-1][:, 1:], np.full((B, 1), P)], axis=1)
    seg = vertex & (after < P)  # each vertex with a next one: the segment to it
    nxt = np.minimum(after, P - 1)
    x1, y1 = np.take_along_axis(x, nxt, 1), np.take_along_axis(y, nxt, 1)
    a, b = np.clip(x, lo[:, None], hi[:, None]), np.clip(x1, lo[:, None], hi[:, None])
    slope = np.divide(y1 - y, x1 - x, out=np.zeros_like(x), where=seg & (x1 > x))
    area = np.where(seg & (b > a), (b - a) * (y + slope * ((a + b) / 2 - x)), 0.0).sum(axis=1)
    last = P - 1 - np.argmax(vertex[:, ::-1], axis=1)
    rows = np.arange(B)
    return area + np.maximum(hi - np.maximum(x[rows, last], lo), 0.0) * y[rows, last]


def path_aiq(cost: np.ndarray, quality: np.ndarray, c_min: float, c_max: float) -> np.ndarray:
    """AIQ of each row's points joined in their order, *without* a hull: the line integral of quality over
    cost along the path (flat from its last point to ``c_max``), over the range. For a path that starts
    and ends at fixed points with independent random points between (one draw of the random router per
    row), its expectation is exactly the AIQ of the expected path, where the hull of a draw's points is
    biased upwards."""
    c, q = np.atleast_2d(np.asarray(cost, dtype=np.float64)), np.atleast_2d(np.asarray(quality, dtype=np.float64))
    if c.shape != q.shape or c.shape[1] < 1:
        raise ValueError(f"path_aiq needs (rows, points) cost and quality of one shape, got {c.shape} and {q.shape}")
    if not c_max > c_min:
        raise ValueError(f"path_aiq needs c_max > c_min, got [{c_min}, {c_max}]")
    area = (np.diff(c, axis=1) * (q[:, 1:] + q[:, :-1]) / 2).sum(axis=1) + (c_max - c[:, -1]) * q[:, -1]
    return area / (c_max - c_min)


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
    # True: a router that sends each prompt to model k with probability share[p, k] whatever the prompt (the
    # random router); its points are the expectation, share @ the models' mean cost and quality, on any prompts
    mixture: bool = False

    def aiq(self, c_min: float, c_max: float) -> float:
        return aiq(self.cost, self.quality, c_min, c_max)

    def on(self, quality: np.ndarray, cost: np.ndarray, rows: np.ndarray) -> Curve | None:
        """This router's curve on the prompts ``rows`` (its decisions held, a mixture's shares held); None for a
        curve without either (the oracle's is recomputed, not held)."""
        if self.mixture:
            return dataclasses.replace(self, cost=self.share @ cost[rows].mean(axis=0),
                                       quality=self.share @ quality[rows].mean(axis=0))
        if self.choice is None:
            return None
        ch, at, K = self.choice[:, rows], np.arange(len(rows)), quality.shape[1]
        q, c = quality[rows], cost[rows]
        return dataclasses.replace(self, cost=c[at, ch].mean(axis=1), quality=q[at, ch].mean(axis=1),
                                   share=np.stack([np.bincount(r, minlength=K) for r in ch]) / len(rows), choice=ch)


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
                  seed: int | tuple[int, ...] = 0, chunk: int = 25,
                  frontiers: dict[str, Frontier] | None = None) -> dict[str, np.ndarray]:
    """Each curve's AIQ on ``n_boot`` resamples of the prompts (with replacement), every router on the same
    resamples (so differences are paired), the AIQ range recomputed from the single models' mean costs on
    each resample: a router's decisions held fixed (its ``choice``), a mixture's expected points recomputed
    (its shares held), each ``frontiers`` entry (the oracle's) recomputed exactly on the resample. Curves
    with neither choices nor shares are skipped."""
    n, K = quality.shape
    rng = np.random.default_rng(seed)
    rows = np.arange(n)
    held = {k: c for k, c in curves.items() if c.mixture or c.choice is not None}
    per_point = {k: (quality[rows, c.choice], cost[rows, c.choice]) for k, c in held.items() if not c.mixture}
    out = {k: np.empty(n_boot) for k in (*held, *(frontiers or {}))}
    for start in range(0, n_boot, chunk):
        b = min(chunk, n_boot - start)
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=b).astype(np.float64) / n  # (b, n) resample weights
        single_q, single_c = w @ quality, w @ cost  # (b, K)
        lo, hi = single_c.min(axis=1), single_c.max(axis=1)
        for k, c in held.items():
            if c.mixture:
                mc, mq = single_c @ c.share.T, single_q @ c.share.T
            else:
                mq, mc = w @ per_point[k][0].T, w @ per_point[k][1].T  # (b, points)
            out[k][start:start + b] = aiq_batch(mc, mq, lo, hi)
        for k, fr in (frontiers or {}).items():
            fc, fq = fr.resampled(w)
            out[k][start:start + b] = _polyline_area(fc, fq, np.ones(fc.shape, dtype=bool), lo, hi) / (hi - lo)
    return out


def _groups(groups: np.ndarray, cost: np.ndarray, min_prompts: int):
    """(group, its rows) for each group with at least ``min_prompts`` prompts whose models' costs differ."""
    for g in pd.unique(groups):
        idx = np.flatnonzero(groups == g)
        single = cost[idx].mean(axis=0)
        if len(idx) >= min_prompts and single.max() > single.min():
            yield str(g), idx


def _group_curves(curves: dict[str, Curve], quality: np.ndarray, cost: np.ndarray, idx: np.ndarray,
                  recompute: dict | None) -> dict[str, Curve]:
    out = {name: make(quality[idx], cost[idx]) for name, make in (recompute or {}).items()}
    for name, curve in curves.items():
        if name not in out and (held := curve.on(quality, cost, idx)) is not None:
            out[name] = held
    return out


def aiq_by_group(curves: dict[str, Curve], quality: np.ndarray, cost: np.ndarray, groups: np.ndarray,
                 min_prompts: int = 10, oracle: str | None = "oracle",
                 recompute: dict | None = None) -> dict[str, dict[str, float]]:
    """Each router's AIQ on each group's prompts alone (RouterBench reports AIQ per ``eval_name`` and
    averages them): the router's decisions held fixed (a mixture's shares held; ``recompute``: name ->
    f(quality, cost) -> Curve, a router rebuilt on the group's prompts instead, as the random router mixes the
    group's own hull), the cost range from the single models' mean costs in the group; ``oracle`` names the
    exact optimal frontier recomputed per group. Groups with fewer than ``min_prompts`` prompts, or whose
    models all cost the same, are left out."""
    out: dict[str, dict[str, float]] = {}
    for g, idx in _groups(groups, cost, min_prompts):
        q, c = quality[idx], cost[idx]
        c_min, c_max = cost_range(c.mean(axis=0))
        res = {name: curve.aiq(c_min, c_max) for name, curve in _group_curves(curves, quality, cost, idx,
                                                                              recompute).items()}
        if oracle:
            fr = optimal_frontier(q, c)
            res[oracle] = aiq(fr.cost, fr.quality, c_min, c_max)
        out[g] = res
    return out


def bootstrap_aiq_by_group(curves: dict[str, Curve], quality: np.ndarray, cost: np.ndarray, groups: np.ndarray,
                           n_boot: int = 200, seed: int = 0, min_prompts: int = 10, oracle: str | None = "oracle",
                           recompute: dict | None = None) -> dict[str, dict[str, np.ndarray]]:
    """:func:`bootstrap_aiq` within each group of :func:`aiq_by_group` (the same groups, curves and oracle):
    group -> router -> (n_boot,) AIQ on resamples of that group's prompts, paired across routers; each group
    resampled on its own (its own seed), so a mean over groups resamples each group independently."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for i, (g, idx) in enumerate(_groups(groups, cost, min_prompts)):
        q, c = quality[idx], cost[idx]
        out[g] = bootstrap_aiq(_group_curves(curves, quality, cost, idx, recompute), q, c, n_boot, (seed, i),
                               frontiers={oracle: optimal_frontier(q, c)} if oracle else None)
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
    start_cost: np.ndarray | None = None  # (n,) each prompt's cost and quality on its cheapest model ...
    start_quality: np.ndarray | None = None
    step_prompt: np.ndarray | None = None  # (V - 1,) ... and the prompt, cost and quality of each step, in order
    step_cost: np.ndarray | None = None
    step_quality: np.ndarray | None = None

    def resampled(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The frontier's vertices on resamples of its prompts, ``w`` (b, n) each prompt's weight (rows summing
        to 1): (b, V) costs and qualities, exactly the frontier of the resampled prompts (a copied prompt's
        steps are taken together, at the same slope; a dropped prompt's steps add nothing)."""
        if self.step_prompt is None:
            raise ValueError("this frontier has no per-step record: build it with optimal_frontier")
        wp, c0, q0 = w[:, self.step_prompt], (w @ self.start_cost)[:, None], (w @ self.start_quality)[:, None]
        return (np.hstack([c0, c0 + np.cumsum(wp * self.step_cost, axis=1)]),
                np.hstack([q0, q0 + np.cumsum(wp * self.step_quality, axis=1)]))


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
    f, t, who = cat(seg_from, np.int64), cat(seg_to, np.int64), cat(seg_i, np.int64)
    dcs, dqs = cat(seg_dc, np.float64), cat(seg_dq, np.float64)
    order = np.argsort(-(dqs / dcs), kind="stable")  # steepest first; within a prompt slopes decrease
    f, t, who, dcs, dqs = f[order], t[order], who[order], dcs[order], dqs[order]
    c0, q0 = c[rows, start].mean(), q[rows, start].mean()
    cost_v = np.concatenate([[c0], c0 + np.cumsum(dcs) / n])
    qual_v = np.concatenate([[q0], q0 + np.cumsum(dqs) / n])
    knob = np.concatenate([[np.inf], dqs / dcs])
    counts = np.zeros((len(f) + 1, K), dtype=np.int64)
    counts[0] = np.bincount(start, minlength=K)
    for k in range(K):
        counts[1:, k] = counts[0, k] + np.cumsum(t == k) - np.cumsum(f == k)
    return Frontier(cost_v, qual_v, knob, counts, c[rows, start], q[rows, start], who, dcs, dqs)


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


def routellm_random_curve(q_strong: np.ndarray, q_weak: np.ndarray,
                          num_results: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """The random router's RouteLLM curve, in expectation: a random share s of strong calls has expected
    quality ``(1 - s) * q_weak + s * q_strong`` (APGR 0.5, CPT(x) = x), at shares 0, 1/num_results, ..., 1."""
    share = np.linspace(0.0, 1.0, num_results + 1)
    return share, (1.0 - share) * float(np.mean(q_weak)) + share * float(np.mean(q_strong))


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
    return routellm_metrics_of(share, qual, q_strong, q_weak)


def routellm_metrics_of(share: np.ndarray, qual: np.ndarray, q_strong: np.ndarray,
                        q_weak: np.ndarray) -> RouteLLMMetrics:
    """APGR, CPT(50%) and CPT(80%) of a curve of (share of strong calls, quality), shares increasing."""
    weak, strong = float(np.mean(q_weak)), float(np.mean(q_strong))
    if not strong > weak:
        raise ValueError(f"APGR needs the strong model to beat the weak one on these prompts "
                         f"(strong {strong:.4f}, weak {weak:.4f})")
    auc = np.trapezoid(qual, share)
    span = share[-1] - share[0]
    apgr = (auc - weak * span) / ((strong - weak) * span) if span > 0 else float("nan")
    cpt = {p: first_crossing(share, qual, weak + p * (strong - weak)) for p in (0.5, 0.8)}
    return RouteLLMMetrics(float(apgr), cpt[0.5], cpt[0.8], share, qual)
