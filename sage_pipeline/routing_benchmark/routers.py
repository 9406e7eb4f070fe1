"""Routers and baselines for full-information benchmark tables, each swept over cost weights.

Every router decides ``argmax_k  U_k(x) - w * C_k(x)`` (or, for the grid-trained ones, uses
the policy trained for cost weight ``w``). The cost weight ``w`` (quality units per USD) is
swept from 0 (best predicted quality at any price) to the weight at which every prompt goes
to its cheapest model (:func:`cost_weights`): for the prediction-based routers over their own
predictions on the test prompts, for the grid routers over the train split's outcomes.

Baselines (no learning): each single model; the **zero router** (the non-decreasing convex
hull of the single models, RouterBench's "Zero"); **random** (each prompt to a model drawn
at random, mixing two adjacent vertices of the zero router's hull: reported as its expectation,
which is the zero router's hull, exactly; :func:`random_router_draws` gives single draws, each
scored on its own path, for their spread);
**oracle** (the exact optimal frontier: for every budget the best assignment of prompts to
models, i.e. the true best ``quality - w * cost`` per prompt at every ``w`` from 0 to infinity;
for binary quality, each prompt to the cheapest model that gets it right, as the budget
allows); **cost_only** (the train split's mean quality per model with the regression router's
predicted cost: what routing by price alone earns, so the learned routers' gain from *quality* prediction is visible).

Learned routers (fitted on the train split only):

* ``regression``: a direct quality-and-cost regression. Per model, a logistic regression of
  quality on the prompt features (ridge for non-binary qualities) and a ridge regression
  of log cost on the features and the log prompt length; ``U = predicted quality``,
  ``C = predicted cost``. One model serves every cost weight.
* ``bc``: behaviour cloning of the full-information oracle, one softmax policy per cost
  weight of the grid, trained together as one batched ensemble. Each train prompt's target
  is its best model at that weight (spread evenly over the models that tie for best); its
  loss weight is the mean regret of the other models (:func:`oracle_targets`; cost-sensitive
  classification: for two models the argmax of the weighted classifier is the Bayes-optimal
  decision, while an unweighted one collapses to the majority label).
* ``cql``: discrete CQL in bandit mode (``sage_pipeline.rl.cql``'s loss: Huber TD to the
  standardised reward plus ``alpha * (logsumexp_a Q - Q(a_logged))``) trained on *logged
  bandit feedback* (one model per train prompt, drawn by a behaviour policy:
  :mod:`logged_bandit`), with the logged reward ``quality - w * cost`` relabelled for
  every cost weight of the grid; critics per weight as one batched ensemble (rl.nets'
  ``Ensemble``), served as the greedy argmax of their mean.

The grid routers are trained by :mod:`train` (torch); this module and serving
(:func:`save_bundle` / :func:`load_bundle`) need numpy (and scikit-learn's tokenizer) only.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.rl.checkpoint import Layers, mlp_forward
from sage_pipeline.routing_benchmark import metrics as bm, prompt_features as bfeat

logger = logging.getLogger(__name__)

DEFAULT_WEIGHT_POINTS = 24  # members of the grid routers (BC, CQL): cost weights from 0 to the cheap end
DEFAULT_SWEEP_POINTS = 41  # cost weights a prediction-based router is swept over
BUNDLE_JSON = "router.json"


def cost_scale(cost_train: np.ndarray) -> float:
    """Median over prompts of (dearest - cheapest model's cost); the mean cost if that is 0."""
    spread = np.median(cost_train.max(axis=1) - cost_train.min(axis=1))
    return float(spread) if spread > 0 else float(max(cost_train.mean(), 1e-12))


def cost_weights(quality: np.ndarray, cost: np.ndarray, points: int = DEFAULT_WEIGHT_POINTS) -> np.ndarray:
    """Cost weights from 0 (best quality at any price) to the smallest weight at which
    ``argmax_k quality - w * cost`` is every prompt's cheapest model, in between at evenly spaced
    quantiles of the weights where some prompt's choice changes.

    Those weights are the knobs of :func:`metrics.optimal_frontier` on (quality, cost):
    on the train table's outcomes for the grid routers (each member is trained for one weight), on
    a router's own predictions for the prediction-based ones. So the sweep always reaches the cheap
    end (AIQ counts a curve as 0 left of its cheapest point) and spends its points where decisions
    change, whatever the table's prices or number of models.
    """
    if points < 2:
        raise ValueError(f"cost weights need at least 2 points (0 and the cheap end), got {points}")
    knobs = bm.optimal_frontier(quality, cost).knob[1:]
    knobs = knobs[np.isfinite(knobs) & (knobs > 0)]
    if len(knobs) == 0:  # the cheapest model is already the best everywhere
        return np.array([0.0, 1.0 / cost_scale(cost)])
    top = float(knobs.max()) * (1 + 1e-6)  # just past the last switch: every prompt on its cheapest model
    inner = np.quantile(knobs, np.linspace(0.0, 1.0, points - 1)[:-1]) if points > 2 else np.array([])
    return np.unique(np.concatenate([[0.0], inner, [top]]))


# ----------------------------------------------------------------------------- baselines
def single_model_curves(quality: np.ndarray, cost: np.ndarray, models: tuple[str, ...]) -> list[bm.Curve]:
    K, n = len(models), len(quality)
    return [bm.Curve(m, np.array([cost[:, k].mean()]), np.array([quality[:, k].mean()]), np.array([np.nan]),
                     np.eye(K)[k][None, :], np.full((1, n), k, dtype=np.int16)) for k, m in enumerate(models)]


def zero_router_curve(quality: np.ndarray, cost: np.ndarray) -> bm.Curve:
    """The single models' points; its NDCH is the zero router (mixtures of single models)."""
    K = quality.shape[1]
    return bm.Curve("zero_router", cost.mean(axis=0), quality.mean(axis=0), np.full(K, np.nan), np.eye(K),
                    np.repeat(np.arange(K, dtype=np.int16)[:, None], len(quality), axis=1))


class RandomRouterConfig(BaseModel):
    """The random router: each prompt to one of two adjacent vertices of the zero router's hull at random."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    points: int = Field(21, ge=2, description="points of its curve, evenly spread along the zero router's hull "
                        "from its cheapest vertex to its best, every vertex among them (>= 2)")
    draws: int = Field(200, ge=2, description="independent draws of it on the test prompts, each scored on its own "
                       "path (its points joined in order, no hull): their mean and spread are reported beside the "
                       "exact expectation (>= 2)")


def hull_vertices(quality: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """The models on the zero router's hull (the NDCH of the single models' mean points), cheapest first."""
    c_mean, q_mean = cost.mean(axis=0), quality.mean(axis=0)
    hc, _ = bm.ndch(c_mean, q_mean)
    return np.array([int(np.flatnonzero(c_mean == c)[np.argmax(q_mean[c_mean == c])]) for c in hc], dtype=np.int64)


def random_mixture(quality: np.ndarray, cost: np.ndarray, points: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each point of the random router as (model a, model b, share to b): positions evenly spread along the
    hull's vertices (``points`` of them, each vertex added), a point between vertices j and j+1 sending each
    prompt to j+1 with probability its fraction of the way. The first and the last point are pure vertices."""
    verts = hull_vertices(quality, cost)
    V = len(verts)
    pos = np.unique(np.round(np.concatenate([np.linspace(0.0, V - 1, points), np.arange(V)]), 12))
    j = np.minimum(np.floor(pos).astype(np.int64), max(V - 2, 0))
    return verts[j], verts[np.minimum(j + 1, V - 1)], pos - j


def random_router_curve(quality: np.ndarray, cost: np.ndarray, cfg: RandomRouterConfig | None = None) -> bm.Curve:
    """The random router's expected curve: each point mixes two adjacent vertices of the zero router's hull,
    so its expected cost and quality lie on the hull's chord between them and its AIQ is the zero router's,
    exactly (a ``mixture`` curve: the bootstrap recomputes its expectation on each resample)."""
    a, b, f = random_mixture(quality, cost, (cfg or RandomRouterConfig()).points)
    K = quality.shape[1]
    share = np.zeros((len(f), K))
    np.add.at(share, (np.arange(len(f)), a), 1.0 - f)
    np.add.at(share, (np.arange(len(f)), b), f)
    return bm.Curve("random", share @ cost.mean(axis=0), share @ quality.mean(axis=0), np.arange(len(f), dtype=float),
                    share, mixture=True)


def random_router_draws(quality: np.ndarray, cost: np.ndarray, cfg: RandomRouterConfig | None = None,
                        seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``cfg.draws`` independent draws of the random router on these prompts: (draws, points) mean cost and
    mean quality of each draw at each point of :func:`random_router_curve` (every prompt's model drawn anew
    for every point and draw). Score a draw on its own path (``metrics.path_aiq``): the hull of its points
    (what rounds 1-3 reported) picks the lucky points and lies above the expectation."""
    cfg = cfg or RandomRouterConfig()
    a, b, f = random_mixture(quality, cost, cfg.points)
    n, P = len(quality), len(f)
    qa, ca = quality[:, a], cost[:, a]  # (n, P)
    dq, dc = quality[:, b] - qa, cost[:, b] - ca
    rng = np.random.default_rng(seed)
    out_c, out_q = np.empty((cfg.draws, P)), np.empty((cfg.draws, P))
    step = max(1, (1 << 22) // (P * n))  # draws per chunk: about 32 MB of uniforms
    for s in range(0, cfg.draws, step):
        to_b = (rng.random((min(step, cfg.draws - s), P, n)) < f[None, :, None]).astype(np.float64)
        out_c[s:s + step] = ca.mean(axis=0) + np.einsum("dpn,np->dp", to_b, dc) / n
        out_q[s:s + step] = qa.mean(axis=0) + np.einsum("dpn,np->dp", to_b, dq) / n
    return out_c, out_q


def oracle_curve(quality: np.ndarray, cost: np.ndarray, max_points: int = 2001) -> bm.Curve:
    """The exact optimal frontier (:func:`metrics.optimal_frontier`): every budget's best
    assignment; at most ``max_points`` of its vertices, evenly spaced along it, first and last kept
    (each a deterministic assignment on the frontier)."""
    fr = bm.optimal_frontier(quality, cost)
    keep = np.unique(np.linspace(0, len(fr.cost) - 1, min(max_points, len(fr.cost))).round().astype(np.int64))
    return bm.Curve("oracle", fr.cost[keep], fr.quality[keep], fr.knob[keep],
                    fr.choice_counts[keep] / len(quality))


# ----------------------------------------------------------------------------- regression router
class RegressionConfig(BaseModel):
    """The regression router's quality and cost models."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    C: float = Field(1.0, gt=0.0, description="inverse L2 strength of the logistic quality models (features are "
                     "standardised)")
    ridge: float = Field(1.0, ge=0.0, description="L2 of the ridge models (non-binary quality, log cost)")
    max_iter: int = Field(3000, ge=1, description="iterations of the logistic regressions at most")


@dataclass(frozen=True)
class RegressionRouter:
    """Per model: quality = link(X @ wq + bq); log cost = [X, log1p(chars)] @ wc + bc."""

    models: tuple[str, ...]
    wq: np.ndarray  # (K, d)
    bq: np.ndarray  # (K,)
    link: str  # "logistic" or "identity"
    wc: np.ndarray  # (K, d + 1)
    bc: np.ndarray  # (K,)
    name: str = "regression"

    def quality(self, x: np.ndarray) -> np.ndarray:
        z = x.astype(np.float64) @ self.wq.T + self.bq
        return 1.0 / (1.0 + np.exp(-z)) if self.link == "logistic" else z

    def cost(self, x: np.ndarray, prompt_chars: np.ndarray) -> np.ndarray:
        design = np.column_stack([x.astype(np.float64), np.log1p(prompt_chars)])
        return np.exp(design @ self.wc.T + self.bc)

    def decide(self, x: np.ndarray, prompt_chars: np.ndarray, w: float) -> np.ndarray:
        return bm.decide(self.quality(x), self.cost(x, prompt_chars), w)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"wq": self.wq, "bq": self.bq, "wc": self.wc, "bc": self.bc}


def fit_regression(x: np.ndarray, quality: np.ndarray, cost: np.ndarray, prompt_chars: np.ndarray,
                   models: tuple[str, ...], cfg: RegressionConfig = RegressionConfig()) -> RegressionRouter:
    from sklearn.linear_model import LogisticRegression, Ridge

    x = x.astype(np.float64)
    binary = bool(np.isin(quality, (0.0, 1.0)).all())
    K, d = quality.shape[1], x.shape[1]
    wq, bq, wc, bc = np.zeros((K, d)), np.zeros(K), np.zeros((K, d + 1)), np.zeros(K)
    design = np.column_stack([x, np.log1p(prompt_chars)])
    for k in range(K):
        y = quality[:, k]
        if binary and 0 < y.mean() < 1:
            m = LogisticRegression(C=cfg.C, max_iter=cfg.max_iter).fit(x, y)
            wq[k], bq[k] = m.coef_[0], m.intercept_[0]
        elif binary:  # one class only: a constant probability (clipped off 0 and 1)
            p = min(max(y.mean(), 1e-3), 1 - 1e-3)
            bq[k] = math.log(p / (1 - p))
        else:
            m = Ridge(alpha=cfg.ridge).fit(x, y)
            wq[k], bq[k] = m.coef_, m.intercept_
        m = Ridge(alpha=cfg.ridge).fit(design, np.log(np.maximum(cost[:, k], 1e-12)))
        wc[k], bc[k] = m.coef_, m.intercept_
    return RegressionRouter(models, wq, bq, "logistic" if binary else "identity", wc, bc)


# ----------------------------------------------------------------------------- metadata routers (eval_name)
LOOKUP, META = "eval_lookup", "regression_meta"
def eval_categories(eval_name: np.ndarray) -> tuple[str, ...]:
    return tuple(sorted({str(e) for e in eval_name}))


def one_hot(eval_name: np.ndarray, categories: tuple[str, ...]) -> np.ndarray:
    """(n, E) indicator of each prompt's eval among ``categories`` (all zeros for one not among them)."""
    index = {c: i for i, c in enumerate(categories)}
    out = np.zeros((len(eval_name), len(categories)), dtype=np.float32)
    cols = np.fromiter((index.get(str(e), -1) for e in eval_name), dtype=np.int64, count=len(eval_name))
    hit = cols >= 0
    out[np.flatnonzero(hit), cols[hit]] = 1.0
    return out


@dataclass(frozen=True)
class LookupRouter:
    """Each model's mean train quality per ``eval_name``: the router that reads nothing but which data set
    a prompt comes from (the pooled means for an eval it never saw)."""

    models: tuple[str, ...]
    categories: tuple[str, ...]
    table: np.ndarray  # (E, K) mean quality per eval and model
    pooled: np.ndarray  # (K,)
    name: str = LOOKUP

    def quality(self, eval_name: np.ndarray) -> np.ndarray:
        oh = one_hot(eval_name, self.categories).astype(np.float64)
        seen = oh.sum(axis=1, keepdims=True)
        return oh @ self.table + (1.0 - seen) * self.pooled

    def arrays(self) -> dict[str, np.ndarray]:
        return {"table": self.table, "pooled": self.pooled}


def fit_lookup(eval_name: np.ndarray, quality: np.ndarray, models: tuple[str, ...]) -> LookupRouter:
    cats = eval_categories(eval_name)
    oh = one_hot(eval_name, cats).astype(np.float64)  # every prompt's eval is among cats: counts >= 1
    table = (oh.T @ quality) / oh.sum(axis=0)[:, None]
    return LookupRouter(models, cats, table, quality.mean(axis=0))


@dataclass(frozen=True)
class MetaRegressionRouter:
    """The regression router on ``[prompt features, eval_name one-hot]``: with one intercept per eval and
    model it can represent the lookup, and the prompt features move each prompt off its eval's mean."""

    categories: tuple[str, ...]
    regression: RegressionRouter
    name: str = META

    def design(self, x: np.ndarray, eval_name: np.ndarray) -> np.ndarray:
        return np.hstack([np.asarray(x, dtype=np.float64), one_hot(eval_name, self.categories)])

    def quality(self, x: np.ndarray, eval_name: np.ndarray) -> np.ndarray:
        return self.regression.quality(self.design(x, eval_name))


def fit_meta_regression(x: np.ndarray, eval_name: np.ndarray, quality: np.ndarray, cost: np.ndarray,
                        chars: np.ndarray, models: tuple[str, ...], cfg: RegressionConfig) -> MetaRegressionRouter:
    cats = eval_categories(eval_name)
    design = np.hstack([np.asarray(x, dtype=np.float64), one_hot(eval_name, cats)])
    return MetaRegressionRouter(cats, fit_regression(design, quality, cost, chars, models, cfg))


# ----------------------------------------------------------------------------- predictive and kNN routers
def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(z, -50, 50)))


class PredictiveConfig(BaseModel):
    """The predictive router's quality MLP (scikit-learn's MLPRegressor)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden: list[Annotated[int, Field(ge=1)]] = Field([64], description="hidden layer widths, shared by the per-LLM "
                                                      "outputs")
    # on the synthetic 11-model table (128 SVD features, 4,500 train prompts) the mean squared error of the
    # predicted success probability was 0.025 at 0.01, 0.017 at 1, 0.009 at 10 (logistic regression: 0.010)
    alpha: float = Field(10.0, ge=0.0, description="L2 penalty")
    max_iter: int = Field(200, ge=1, description="epochs at most (early stopping usually ends sooner)")
    validation_fraction: float = Field(0.15, gt=0.0, lt=1.0, description="early stopping on this share of the train "
                                       "prompts")
    seed: int = Field(0, description="seed of the weights and the validation split")


@dataclass(frozen=True)
class PredictiveRouter:
    """RouterBench's predictive router (Hu et al. 2024, sec. 4.1): a quality model for every LLM on
    the prompt features, then ``argmax_k q_k(x) - w * c_k(x)``. The quality models are one
    scikit-learn ``MLPRegressor`` with a shared hidden layer and one output per LLM, trained on
    squared error (the Brier score for binary quality; it gave better-calibrated probabilities
    than ``MLPClassifier``, whose early stopping watches subset accuracy) and early-stopped on
    held-out train prompts; its outputs clipped to the train qualities' range; served by a numpy
    forward pass. The cost of each call comes from the regression router's per-model cost model."""

    models: tuple[str, ...]
    layers: Layers  # (out, in) weights, as rl.checkpoint.mlp_forward takes them
    low: float  # the train qualities' range: predictions are clipped to it
    high: float
    name: str = "predictive"

    def quality(self, x: np.ndarray) -> np.ndarray:
        return np.clip(mlp_forward(self.layers, x).astype(np.float64), self.low, self.high)

    def arrays(self) -> dict[str, np.ndarray]:
        return {f"{kind}{i}": arr for i, (w, b) in enumerate(self.layers) for kind, arr in (("w", w), ("b", b))} | {
            "range": np.array([self.low, self.high])}

    @classmethod
    def from_arrays(cls, models: tuple[str, ...], z: dict) -> PredictiveRouter:
        n = sum(1 for k in z if k.startswith("w"))
        return cls(models, [(z[f"w{i}"], z[f"b{i}"]) for i in range(n)], float(z["range"][0]), float(z["range"][1]))


def fit_predictive(x: np.ndarray, quality: np.ndarray, models: tuple[str, ...],
                   cfg: PredictiveConfig = PredictiveConfig()) -> PredictiveRouter:
    import warnings

    from sklearn.exceptions import ConvergenceWarning
    from sklearn.neural_network import MLPRegressor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # early stopping ends it; max_iter only bounds time
        m = MLPRegressor(hidden_layer_sizes=tuple(cfg.hidden), alpha=cfg.alpha, max_iter=cfg.max_iter,
                         early_stopping=True, validation_fraction=cfg.validation_fraction,
                         random_state=cfg.seed).fit(x, quality)
    layers = [(w.T.astype(np.float32), b.astype(np.float32)) for w, b in zip(m.coefs_, m.intercepts_)]
    return PredictiveRouter(models, layers, float(quality.min()), float(quality.max()))


class KNNConfig(BaseModel):
    """The kNN router."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ks: list[Annotated[int, Field(ge=1)]] = Field([5, 10, 20, 40, 80], min_length=1, description="neighbourhood "
                                                  "sizes tried (leave-one-out on the train prompts)")
    metric: str = Field("cosine", description="the distance (scikit-learn's NearestNeighbors metric; RouterBench's "
                        "kNN router: cosine)")


@dataclass
class KNNRouter:
    """RouterBench's kNN router: an LLM's predicted quality on a prompt is its mean quality on the
    ``k`` nearest train prompts (scikit-learn ``NearestNeighbors``); ``k`` chosen by leave-one-out
    squared error on the train prompts; routes by ``q_k(x) - w * c_k(x)`` like the predictive one."""

    models: tuple[str, ...]
    x_train: np.ndarray  # (n, d) float32
    q_train: np.ndarray  # (n, K) float32
    k: int
    metric: str = "cosine"
    name: str = "knn"
    _index: object = field(default=None, repr=False)

    def _nn(self):
        if self._index is None:
            from sklearn.neighbors import NearestNeighbors

            self._index = NearestNeighbors(n_neighbors=self.k, metric=self.metric).fit(self.x_train)
        return self._index

    def quality(self, x: np.ndarray) -> np.ndarray:
        idx = self._nn().kneighbors(np.asarray(x, dtype=np.float32), return_distance=False)
        return self.q_train[idx].mean(axis=1).astype(np.float64)

    def arrays(self) -> dict[str, np.ndarray]:
        return {"x_train": self.x_train, "q_train": self.q_train, "k": np.array(self.k)}


def fit_knn(x: np.ndarray, quality: np.ndarray, models: tuple[str, ...], cfg: KNNConfig = KNNConfig()) -> KNNRouter:
    from sklearn.neighbors import NearestNeighbors

    x = np.asarray(x, dtype=np.float32)
    ks = sorted(k for k in cfg.ks if 1 <= k < len(x))
    if not ks:
        raise ValueError(f"kNN router: no neighbourhood size in {cfg.ks} fits {len(x)} train prompts")
    idx = NearestNeighbors(n_neighbors=ks[-1] + 1, metric=cfg.metric).fit(x).kneighbors(x, return_distance=False)
    rows = np.arange(len(x))[:, None]
    others = np.where(idx == rows, -1, idx)  # leave the prompt itself out (wherever it ranks)
    others = np.array([r[r >= 0][: ks[-1]] for r in others])
    cum = np.cumsum(quality[others], axis=1)  # (n, k_max, K)
    err = {k: float(((cum[:, k - 1] / k - quality) ** 2).mean()) for k in ks}
    best = min(ks, key=lambda k: (err[k], k))
    return KNNRouter(models, x, quality.astype(np.float32), best, cfg.metric)


# ----------------------------------------------------------------------------- grid-trained routers
@dataclass(frozen=True)
class GridRouter:
    """One policy per cost weight: ``nets[g]`` (averaged) gives logits (bc) or Q-values (cql)."""

    name: str
    models: tuple[str, ...]
    weights: np.ndarray  # (G,) cost weight of each member
    nets: list[list[Layers]]  # nets[g][j]: critic/net j of member g
    metrics: dict = field(default_factory=dict)

    def member(self, w: float) -> int:
        """The member trained for the cost weight nearest ``w`` (on a log scale)."""
        if not np.isfinite(w):
            return len(self.weights) - 1
        return int(np.argmin(np.abs(np.log1p(self.weights) - np.log1p(w))))

    def outputs(self, x: np.ndarray, g: int) -> np.ndarray:
        return np.mean([mlp_forward(layers, x) for layers in self.nets[g]], axis=0).astype(np.float64)

    def decide(self, x: np.ndarray, w: float) -> np.ndarray:
        return self.outputs(x, self.member(w)).argmax(axis=1)

    def arrays(self) -> dict[str, np.ndarray]:
        return {f"m{g}_n{j}_{kind}{i}": arr for g, member in enumerate(self.nets) for j, layers in enumerate(member)
                for i, (w, b) in enumerate(layers) for kind, arr in (("w", w), ("b", b))}

    @classmethod
    def from_arrays(cls, name: str, models: tuple[str, ...], weights: np.ndarray, z: dict) -> GridRouter:
        nets = []
        for g in range(len(weights)):
            member = []
            j = 0
            while f"m{g}_n{j}_w0" in z:
                n_layers = sum(1 for k in z if k.startswith(f"m{g}_n{j}_w"))
                member.append([(z[f"m{g}_n{j}_w{i}"], z[f"m{g}_n{j}_b{i}"]) for i in range(n_layers)])
                j += 1
            nets.append(member)
        return cls(name, models, np.asarray(weights), nets)


def oracle_targets(quality: np.ndarray, cost: np.ndarray, w: float, tol: float = 1e-12
                   ) -> tuple[np.ndarray, np.ndarray]:
    """BC's targets at cost weight w: (n, K) bool, the models of best utility ``quality - w * cost``
    (all of them where several tie), and each prompt's weight, the mean regret of the other
    models ``sum_k (u_best - u_k) / (K - 1)``.

    For two models the weight is the gap between them, so the weighted classifier's argmax is the
    Bayes-optimal decision (cost-sensitive classification). For more it stays positive whenever
    choosing wrongly costs anything: weighting by the gap to the runner-up instead gives 0 to
    every prompt where two models tie (on an 11-model binary table, all but 0.5% of them).
    """
    u = quality - w * cost if np.isfinite(w) else -cost
    best = u.max(axis=1, keepdims=True)
    tied = u >= best - tol
    K = u.shape[1]
    return tied, (best - u).sum(axis=1) / max(K - 1, 1)


# ----------------------------------------------------------------------------- bundle (save / serve)
@dataclass
class RouterBundle:
    """The trained routers with their featurizer, served with numpy (+ scikit-learn's tokenizer)."""

    featurizer: bfeat.PromptFeaturizer
    models: tuple[str, ...]
    regression: RegressionRouter
    grids: dict[str, GridRouter]  # "bc", "cql"
    manifest: dict
    predictors: dict[str, PredictiveRouter | KNNRouter] = field(default_factory=dict)  # "predictive", "knn"
    lookup: LookupRouter | None = None  # eval_lookup (reads eval_name)
    meta: MetaRegressionRouter | None = None  # regression_meta (prompt features + eval_name)
    # the recommended router: {"router": a name above} or {"router": "blend", "share": s, "base": a name}
    recommended: dict | None = None

    def features(self, prompts, embeddings=None) -> np.ndarray:
        if bfeat.takes_embeddings(self.featurizer):
            if embeddings is None:
                raise ValueError(f"the {self.featurizer.name} featurizer reads precomputed prompt embeddings: pass "
                                 "embeddings=(n, d) array")
            return self.featurizer.transform(np.asarray(embeddings, dtype=np.float32))
        return self.featurizer.transform(np.asarray(prompts, dtype=object))

    def route(self, prompts, cost_weight: float, router: str = "regression", embeddings=None,
              eval_names=None) -> list[str]:
        """The model each prompt goes to at ``cost_weight`` (quality units per USD); ``embeddings``:
        the prompts' precomputed embeddings, for a bundle trained on them; ``eval_names``: each prompt's
        eval_name, for the routers that read it (eval_lookup, regression_meta, blends; "recommended" is
        whichever the benchmark recommended)."""
        prompts = np.asarray(prompts, dtype=object)
        if router == "recommended":
            if self.recommended is None:
                raise ValueError("this bundle has no recommended router (written before issue 36): re-materialize "
                                 "routing_benchmark")
            spec = self.recommended
            if spec["router"] in ("zero_router", "random"):
                raise ValueError(f"the recommended router is the {spec['router']}: no learned router beat the zero "
                                 "router on the validation prompts, so route every prompt to one model of its hull "
                                 f"(manifest's zero_router_hull: {self.manifest.get('zero_router_hull')})")
            router = spec["router"]
        x = self.features(prompts, embeddings)
        chars = np.fromiter((len(p) for p in prompts), dtype=np.float64, count=len(prompts))
        reads_eval = router in (LOOKUP, META, "blend")
        if reads_eval and eval_names is None:
            raise ValueError(f"the {router} router reads each prompt's eval_name: pass eval_names=[...] (one per "
                             "prompt)")
        ev = None if eval_names is None else np.asarray(eval_names, dtype=object)
        if ev is not None and len(ev) != len(prompts):
            raise ValueError(f"eval_names has {len(ev)} entries for {len(prompts)} prompts")
        if router == "regression":
            choice = self.regression.decide(x, chars, cost_weight)
        elif router == "blend":
            share, base = float(self.recommended["share"]), self.recommended["base"]
            q = share * self._quality(LOOKUP, x, ev) + (1 - share) * self._quality(base, x, ev)
            choice = bm.decide(q, self.regression.cost(x, chars), cost_weight)
        elif router in (LOOKUP, META, "cost_only", *self.predictors):
            choice = bm.decide(self._quality(router, x, ev), self.regression.cost(x, chars), cost_weight)
        elif router in self.grids:
            choice = self.grids[router].decide(x, cost_weight)
        else:
            raise ValueError(f"unknown router {router!r}: use one of "
                             f"{sorted(['regression', 'recommended', *self.predictors, *self.grids, *self._meta()])}")
        return [self.models[k] for k in choice]

    def _meta(self) -> list[str]:
        return [n for n, r in ((LOOKUP, self.lookup), (META, self.meta)) if r is not None]

    def _quality(self, name: str, x: np.ndarray, ev: np.ndarray | None) -> np.ndarray:
        if name == "regression":
            return self.regression.quality(x)
        if name in self.predictors:
            return self.predictors[name].quality(x)
        if name == LOOKUP and self.lookup is not None:
            return self.lookup.quality(ev)
        if name == "cost_only" and self.lookup is not None:  # each model's pooled mean quality
            return np.broadcast_to(self.lookup.pooled, (len(x), len(self.models)))
        if name == META and self.meta is not None:
            return self.meta.quality(x, ev)
        raise ValueError(f"this bundle has no {name} router (one eval only, or written before issue 36)")


def save_bundle(folder: str | Path, bundle: RouterBundle) -> Path:
    """Write the featurizer, the routers' weights and ``router.json`` into ``folder`` atomically."""
    folder = Path(folder)
    with artifacts.atomic_dir(folder) as tmp:
        bfeat.save_featurizer(tmp, bundle.featurizer)
        with artifacts.atomic_open(tmp / "regression.npz", "wb") as fh:
            np.savez(fh, **bundle.regression.arrays())
        for name, grid in bundle.grids.items():
            with artifacts.atomic_open(tmp / f"{name}.npz", "wb") as fh:
                np.savez(fh, **grid.arrays())
        for name, pred in bundle.predictors.items():
            with artifacts.atomic_open(tmp / f"{name}.npz", "wb") as fh:
                np.savez(fh, **pred.arrays())
        meta_routers = {LOOKUP: bundle.lookup, META: bundle.meta}
        for name, r in meta_routers.items():
            if r is not None:
                with artifacts.atomic_open(tmp / f"{name}.npz", "wb") as fh:
                    np.savez(fh, **(r.arrays() if name == LOOKUP else r.regression.arrays()))
        manifest = dict(bundle.manifest) | {
            "eval_routers": {n: {"categories": list(r.categories)} for n, r in meta_routers.items() if r is not None},
            "recommended": bundle.recommended,
            "models": list(bundle.models), "link": bundle.regression.link,
            "predictors": {n: {"kind": type(p).__name__, "metric": getattr(p, "metric", None),
                               "k": getattr(p, "k", None)}
                           for n, p in bundle.predictors.items()},
            "grids": {n: {"weights": g.weights.tolist(), "metrics": _jsonable(g.metrics)}
                      for n, g in bundle.grids.items()}}
        artifacts.write_json(tmp / BUNDLE_JSON, manifest)
    return folder


def load_bundle(folder: str | Path) -> RouterBundle:
    folder = Path(folder)
    pj = folder / BUNDLE_JSON
    if not pj.is_file():
        raise FileNotFoundError(f"{folder}: {BUNDLE_JSON} not found (materialize routing_benchmark first)")
    manifest = json.loads(pj.read_text(encoding="utf-8"))
    models = tuple(manifest["models"])
    with np.load(folder / "regression.npz") as z:
        reg = RegressionRouter(models, z["wq"], z["bq"], manifest["link"], z["wc"], z["bc"])
    grids = {}
    for name, spec in manifest.get("grids", {}).items():
        with np.load(folder / f"{name}.npz") as z:
            grids[name] = GridRouter.from_arrays(name, models, np.asarray(spec["weights"]), {k: z[k] for k in z.files})
    predictors: dict[str, PredictiveRouter | KNNRouter] = {}
    for name, spec in manifest.get("predictors", {}).items():
        with np.load(folder / f"{name}.npz") as z:
            arrays = {k: z[k] for k in z.files}
        if spec["kind"] == "KNNRouter":
            predictors[name] = KNNRouter(models, arrays["x_train"], arrays["q_train"], int(arrays["k"]),
                                         spec["metric"], name)
        else:
            predictors[name] = PredictiveRouter.from_arrays(models, arrays)
    lookup = meta = None
    for name, spec in manifest.get("eval_routers", {}).items():
        cats = tuple(spec["categories"])
        with np.load(folder / f"{name}.npz") as z:
            if name == LOOKUP:
                lookup = LookupRouter(models, cats, z["table"], z["pooled"])
            else:
                meta = MetaRegressionRouter(cats, RegressionRouter(models, z["wq"], z["bq"], manifest["link"], z["wc"],
                                                                   z["bc"], META))
    return RouterBundle(bfeat.load_featurizer(folder), models, reg, grids, manifest, predictors, lookup, meta,
                        manifest.get("recommended"))


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _jsonable(obj.tolist())
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return _jsonable(obj.item())
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


__all__ = ["GridRouter", "KNNConfig", "KNNRouter", "LookupRouter", "MetaRegressionRouter",
           "PredictiveConfig", "PredictiveRouter", "RandomRouterConfig", "RegressionConfig",
           "RegressionRouter", "RouterBundle", "cost_weights", "fit_knn", "fit_predictive", "fit_regression",
           "hull_vertices", "load_bundle", "oracle_curve", "oracle_targets", "random_mixture", "random_router_curve",
           "random_router_draws", "save_bundle", "single_model_curves", "zero_router_curve"]
