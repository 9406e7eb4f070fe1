"""The recommended router: every candidate scored on a validation part of the train split, never on the test split.

Round 2 reported the learned router with the best AIQ *on the test prompts*, which flatters it, and on
published tables nothing learned beat the simple routers: a lookup that reads only ``eval_name`` beat every
learned router on a multi-eval table. So the benchmark now recommends one router the way a user would pick
it, with the test split left untouched:

1. split the train prompts again by a stable hash of their text (salted differently from the train/test
   split): ``fit`` and ``validation``;
2. fit every candidate on ``fit``: the per-eval lookup, the prompt-feature routers (regression, predictive,
   kNN), the regression with the table's metadata (``eval_name`` one-hot beside the prompt features), the
   price-only router, and blends ``s * lookup + (1 - s) * router`` of the lookup with each prompt-feature
   router; the zero router's hull needs no fitting (the random router is not a candidate: in expectation it
   is the zero router's hull, exactly);
3. score each on the validation prompts: AIQ (RouterBench's paper), and its paired bootstrap margin over the
   zero router (a normal interval from the bootstrap's spread, Bonferroni-adjusted for the number of
   candidates: the best of m noisy candidates is the one judged);
4. recommend the candidate with the best validation AIQ if that margin's interval lies above 0; else the
   zero router's hull (nothing beat it within its interval);
5. the recommended router is then the same candidate fitted on the whole train split, and it alone is judged
   on the test prompts.

The prompt features are the train split's (fitted on train text only; the validation labels are never
used to fit them). Metadata: a table's ``eval_name`` (the importer's one categorical column; RouterBench's
``oracle_model_to_route_to`` is an outcome, never a feature). An eval the fit part never saw gets the
pooled means (lookup) and a zero one-hot (regression).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.routing_benchmark import metrics as bm, routers as br
from sage_pipeline.routing_benchmark.routers import (
    LOOKUP,
    META,
    LookupRouter,
    MetaRegressionRouter,
    eval_categories,
    fit_lookup,
    fit_meta_regression,
)

PROMPT_ROUTERS = ("regression", "predictive", "knn")  # read the prompt features only
ZERO, COST_ONLY = "zero_router", "cost_only"


class RecommendConfig(BaseModel):
    """How the recommended router is chosen (on a validation part of the train split)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    validation_fraction: float = Field(0.25, gt=0.0, lt=1.0, description="share of the train prompts (by a stable "
                                       "hash of their text, salted apart from the test split) the candidates are "
                                       "scored on; they are fitted on the rest")
    blend_shares: list[Annotated[float, Field(gt=0.0, lt=1.0)]] = Field(
        [0.25, 0.5, 0.75], description="the lookup's share s in each blend s * eval_lookup + (1 - s) * router of "
                                       "predicted qualities, each in (0, 1)")
    boot: int = Field(200, ge=20, description="bootstrap resamples of the validation prompts for each candidate's "
                      "paired margin over the zero router")
    level: float = Field(0.95, gt=0.5, lt=1.0, description="a candidate replaces the zero router's hull only if "
                         "this two-sided interval of its validation margin over it lies above 0 (Bonferroni-"
                         "adjusted for the number of candidates, since the best of them is the one judged)")


# ----------------------------------------------------------------------------- candidates
@dataclass(frozen=True)
class Fitted:
    """Every candidate fitted on one part of the prompts (``fit`` for validation, the train split for test)."""

    regression: br.RegressionRouter  # also the cost model every prediction-based candidate decides with
    predictive: br.PredictiveRouter
    knn: br.KNNRouter
    lookup: LookupRouter
    meta: MetaRegressionRouter | None  # None: one eval only
    mean_quality: np.ndarray  # (K,) cost_only's

    def predictions(self, x: np.ndarray, eval_name: np.ndarray, chars: np.ndarray,
                    blend_shares: list[float]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Predicted quality per candidate (name -> (n, K)) and the predicted cost (n, K)."""
        n = len(x)
        q = {COST_ONLY: np.broadcast_to(self.mean_quality, (n, len(self.mean_quality))),
             LOOKUP: self.lookup.quality(eval_name),
             "regression": self.regression.quality(x), "predictive": self.predictive.quality(x),
             "knn": self.knn.quality(x)}
        if self.meta is not None:
            q[META] = self.meta.quality(x, eval_name)
        for base in [n_ for n_ in (*PROMPT_ROUTERS, META) if n_ in q]:
            for s in blend_shares:
                q[blend_name(base, s)] = s * q[LOOKUP] + (1.0 - s) * q[base]
        return q, self.regression.cost(x, chars)


def blend_name(base: str, share: float) -> str:
    return f"blend({LOOKUP} {share:g}, {base})"


def serving_spec(name: str, blend_shares: list[float]) -> dict:
    """How a bundle serves the candidate ``name`` (routers.RouterBundle.route's ``recommended``)."""
    for base in (*PROMPT_ROUTERS, META):
        for s in blend_shares:
            if name == blend_name(base, s):
                return {"router": "blend", "name": name, "base": base, "share": float(s)}
    return {"router": name, "name": name}


def fit_candidates(x: np.ndarray, eval_name: np.ndarray, quality: np.ndarray, cost: np.ndarray, chars: np.ndarray,
                   models: tuple[str, ...], regression: br.RegressionConfig, predictive: br.PredictiveConfig,
                   knn: br.KNNConfig, trained: dict | None = None) -> Fitted:
    """Every candidate on these prompts; ``trained`` reuses routers already fitted on them."""
    trained = trained or {}
    reg = trained.get("regression") or br.fit_regression(x, quality, cost, chars, models, regression)
    pred = trained.get("predictive") or br.fit_predictive(x, quality, models, predictive)
    kn = trained.get("knn") or br.fit_knn(x, quality, models, knn)
    meta = (fit_meta_regression(x, eval_name, quality, cost, chars, models, regression)
            if len(eval_categories(eval_name)) > 1 else None)
    return Fitted(reg, pred, kn, fit_lookup(eval_name, quality, models), meta, quality.mean(axis=0))


def candidate_curves(q_hat: dict[str, np.ndarray], c_hat: np.ndarray, quality: np.ndarray, cost: np.ndarray,
                     sweep_points: int) -> dict[str, bm.Curve]:
    """The zero router and every prediction-based candidate swept over cost weights on these prompts."""
    curves = {ZERO: br.zero_router_curve(quality, cost)}
    for name, q in q_hat.items():
        curves[name] = bm.sweep(name, lambda w, q=q: bm.decide(q, c_hat, w),
                                br.cost_weights(q, c_hat, sweep_points), quality, cost)
    return curves


# ----------------------------------------------------------------------------- selection
def validation_mask(group_key: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """Validation prompts of the train split: a stable hash of the text, salted apart from the test split's."""
    key = f"val{seed:013d}"[-16:]
    h = pd.util.hash_array(np.asarray(group_key).astype(object), hash_key=key)
    return (h % np.uint64(1_000_000)).astype(np.float64) / 1e6 < fraction


@dataclass(frozen=True)
class Selection:
    recommended: str  # a candidate's name, or the zero router's
    best_candidate: str  # the candidate with the best validation AIQ (maybe not recommended)
    fallback: bool  # the zero router's hull, because nothing beat it within its interval
    n_fit: int
    n_validation: int
    validation_aiq: dict[str, float]
    margin_vs_zero_ci: dict[str, tuple[float, float]]

    def table(self) -> list[dict]:
        rows = [{"candidate": n, "validation AIQ": a, "- zero router (interval)": _ci(self.margin_vs_zero_ci.get(n)),
                 "recommended": "yes" if n == self.recommended else ""}
                for n, a in sorted(self.validation_aiq.items(), key=lambda kv: -kv[1])]
        return rows

    def to_dict(self) -> dict:
        return {"recommended": self.recommended, "best_candidate": self.best_candidate, "fallback": self.fallback,
                "n_fit": self.n_fit, "n_validation": self.n_validation, "validation_aiq": self.validation_aiq,
                "margin_vs_zero_router_ci": {k: list(v) for k, v in self.margin_vs_zero_ci.items()}}


def _ci(ci: tuple[float, float] | None) -> str:
    return "" if ci is None else f"[{ci[0]:+.4f}, {ci[1]:+.4f}]"


def select(curves: dict[str, bm.Curve], quality: np.ndarray, cost: np.ndarray, cfg: RecommendConfig, seed: int,
           n_fit: int) -> Selection:
    """Step 3-4: the candidates' validation AIQ and paired margins over the zero router; the recommendation."""
    c_min, c_max = bm.cost_range(cost.mean(axis=0))
    aiq = {n: c.aiq(c_min, c_max) for n, c in curves.items()}
    from scipy.stats import norm

    boot = bm.bootstrap_aiq(curves, quality, cost, cfg.boot, seed)
    # the best of m candidates is judged: Bonferroni over them, normal intervals from the bootstrap's spread
    m = max(1, len(curves) - 1)
    z = float(norm.ppf(1 - (1 - cfg.level) / (2 * m)))
    margin = {n: (aiq[n] - aiq[ZERO] - z * float(np.std(v - boot[ZERO])),
                  aiq[n] - aiq[ZERO] + z * float(np.std(v - boot[ZERO])))
              for n, v in boot.items() if n != ZERO}
    best = max((n for n in aiq if n != ZERO), key=lambda n: (aiq[n], n))
    fallback = not (aiq[best] > aiq[ZERO] and margin[best][0] > 0)
    return Selection(ZERO if fallback else best, best, fallback, n_fit, len(quality), aiq, margin)


def choose(tr_x: np.ndarray, tr_eval: np.ndarray, tr_quality: np.ndarray, tr_cost: np.ndarray, tr_chars: np.ndarray,
           group_key: np.ndarray, models: tuple[str, ...], configs: dict, cfg: RecommendConfig, sweep_points: int,
           seed: int, log: Callable[[str], None]) -> Selection:
    """Steps 1-4 on the train split alone. ``configs``: the regression, predictive and knn configs."""
    val = validation_mask(group_key, cfg.validation_fraction, seed)
    if val.sum() < 10 or (~val).sum() < 10:
        raise ValueError(f"recommending a router needs at least 10 fit and 10 validation prompts; the train split's "
                         f"{len(val)} prompts gave {int((~val).sum())} and {int(val.sum())} (validation_fraction "
                         f"{cfg.validation_fraction}): use a larger table or a larger test split's complement")
    f, v = np.flatnonzero(~val), np.flatnonzero(val)
    fitted = fit_candidates(tr_x[f], tr_eval[f], tr_quality[f], tr_cost[f], tr_chars[f], models,
                            configs["regression"], configs["predictive"], configs["knn"])
    q_hat, c_hat = fitted.predictions(tr_x[v], tr_eval[v], tr_chars[v], cfg.blend_shares)
    curves = candidate_curves(q_hat, c_hat, tr_quality[v], tr_cost[v], sweep_points)
    sel = select(curves, tr_quality[v], tr_cost[v], cfg, seed, len(f))
    log(f"routing benchmark: {len(curves)} candidates on {len(v):,} validation prompts (fitted on {len(f):,}); best "
        f"{sel.best_candidate} AIQ {sel.validation_aiq[sel.best_candidate]:.4f} vs zero router "
        f"{sel.validation_aiq[ZERO]:.4f}, margin {_ci(sel.margin_vs_zero_ci[sel.best_candidate])}: recommended "
        f"{sel.recommended}" + (" (nothing beat the zero router within its interval)" if sel.fallback else ""))
    return sel
