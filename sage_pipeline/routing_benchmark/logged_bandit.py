"""Logged bandit feedback simulated from a full-information benchmark table, with exact ground truth.

A behaviour policy picks one model per prompt (``static``: always one model, propensity 1;
``uniform``: 1/K each; ``epsilon``: the static model with probability 1 - epsilon, else a
uniform one). The log keeps only the chosen model's quality and cost, and the
propensity: what a deployed router's logs would hold. Because the table has every model's
outcome, the exact value of any routing policy on those prompts is known:
``V(pi) = mean_i sum_k pi(k|x_i) (quality_ik - w cost_ik)``.

On such logs the offline chain's machinery runs unchanged: ``sage_pipeline.rl.ope``'s
estimators (IPS, SNIPS, DM, DR, SNDR, Switch-DR, obp's formulas) with its percentile
bootstrap, Kish ESS and support check, its reward model (``ope.LinearQ``, cross-fitted
over prompt folds; with one "role" it is a per-model linear model of the prompt
features); ``rl.bc``'s temperature scaling and calibration metrics for propensities
estimated by behaviour cloning (logs without propensities), floored like
``rl.bc.estimate_propensities``; and bandit CQL (:mod:`routers`) learns from the
train split's logs. Every estimate is reported next to the exact value.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.rl import bc as rl_bc, nets, ope
from sage_pipeline.rl.checkpoint import masked_softmax, mlp_forward
from sage_pipeline.routing.policy import sample_actions

logger = logging.getLogger(__name__)


class BehaviourSpec(BaseModel):
    """A behaviour policy that logs one model per prompt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["static", "uniform", "epsilon"] = Field(
        "uniform", description="static: always one model (propensity 1); uniform: 1/K each; epsilon: the static "
                               "model with probability 1 - epsilon, else a uniform one")
    model: str | None = Field(None, description="the static and epsilon behaviours' model; null: the dearest model "
                              "on average")
    epsilon: float = Field(0.3, ge=0.0, le=1.0, description="exploration of the epsilon behaviour, in [0, 1]")

    def resolve_model(self, models: tuple[str, ...], mean_cost: np.ndarray) -> int:
        if self.model is None:
            return int(np.argmax(mean_cost))
        if self.model not in models:
            raise ValueError(f"behaviour model {self.model!r} is not in the table's models {list(models)}")
        return models.index(self.model)

    def label(self, models: tuple[str, ...], mean_cost: np.ndarray) -> str:
        if self.kind == "uniform":
            return "uniform"
        m = models[self.resolve_model(models, mean_cost)]
        return f"static({m})" if self.kind == "static" else f"epsilon({m}, {self.epsilon:g})"

    def probs(self, n: int, models: tuple[str, ...], mean_cost: np.ndarray) -> np.ndarray:
        K = len(models)
        uniform = np.full((n, K), 1.0 / K)
        if self.kind == "uniform":
            return uniform
        static = np.zeros((n, K))
        static[:, self.resolve_model(models, mean_cost)] = 1.0
        eps = 0.0 if self.kind == "static" else self.epsilon
        return (1.0 - eps) * static + eps * uniform


@dataclass(frozen=True)
class BanditLog:
    """One logged decision per prompt: the chosen model, its propensity, its quality and cost."""

    behaviour: str
    action: np.ndarray  # (n,) int
    pscore: np.ndarray  # (n,) propensity of the logged action
    probs: np.ndarray  # (n, K) the behaviour's full distribution (for the support check)
    quality: np.ndarray  # (n,) of the logged model
    cost: np.ndarray  # (n,) of the logged model

    def __len__(self) -> int:
        return len(self.action)

    def reward(self, w: float) -> np.ndarray:
        return self.quality - w * self.cost


def simulate_logs(quality: np.ndarray, cost: np.ndarray, models: tuple[str, ...], spec: BehaviourSpec,
                  seed: int = 0, mean_cost: np.ndarray | None = None) -> BanditLog:
    """Draw the behaviour's model for every prompt of the table (seeded) and keep only its outcome."""
    n = len(quality)
    mean_cost = cost.mean(axis=0) if mean_cost is None else mean_cost
    probs = spec.probs(n, models, mean_cost)
    action = sample_actions(probs, np.random.default_rng(seed))
    rows = np.arange(n)
    return BanditLog(spec.label(models, mean_cost), action, probs[rows, action], probs,
                     quality[rows, action], cost[rows, action])


def true_value(pi: np.ndarray, quality: np.ndarray, cost: np.ndarray, w: float) -> float:
    """Exact value of the policy ``pi`` (n, K) on these prompts: mean expected quality - w cost."""
    return float((pi * (quality - w * cost)).sum(axis=1).mean())


# ----------------------------------------------------------------------------- OPE
class BanditOPEConfig(BaseModel):
    """The bandit estimators' settings (rl.ope's, on one-step logs)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_boot: int = Field(200, ge=1, description="bootstrap resamples per interval")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="1 - the intervals' level")
    n_folds: int = Field(5, ge=1, description="cross-fitting folds of the reward model (by prompt; at least 2 are "
                         "used)")
    ridge: float = Field(1.0, ge=0.0, description="L2 of the reward model")
    basis_dim: int = Field(32, ge=1, description="principal components of the prompt features the reward model uses")
    switch_lambda: float = Field(10.0, ge=0.0, description="Switch-DR's importance-weight threshold")
    max_unsupported_mass: float = Field(1e-3, ge=0.0, description="a policy putting more probability than this on "
                                        "actions the behaviour never takes has no support")
    seed: int = Field(0, description="seed of the folds and the bootstrap")


def reward_basis(x: np.ndarray, prompt_chars: np.ndarray, dim: int = 32) -> np.ndarray:
    """The reward model's inputs: the first ``dim`` principal components of the features and the
    log prompt length. ``ope.LinearQ`` assembles p x p sums per row, so p stays small."""
    x = np.asarray(x, dtype=np.float64)
    xc = x - x.mean(axis=0)
    if x.shape[1] > dim:
        _, _, vt = np.linalg.svd(xc, full_matrices=False)
        xc = xc @ vt[:dim].T
    return np.column_stack([xc, np.log1p(np.asarray(prompt_chars, dtype=np.float64))])


def reward_model(basis: np.ndarray, action: np.ndarray, reward: np.ndarray, n_actions: int,
                 cfg: BanditOPEConfig = BanditOPEConfig()) -> np.ndarray:
    """Cross-fitted q_hat(x, k) (n, K) from ``ope.LinearQ`` with a single role, folds by prompt."""
    n = len(action)
    role = np.zeros(n, dtype=np.int64)
    k = max(2, min(cfg.n_folds, n))
    fold = np.random.default_rng(cfg.seed).permutation(n) % k
    q_hat = np.empty((n, n_actions))
    for f in range(k):
        train = fold != f
        m = ope.LinearQ.fit(role[train], action[train], basis[train], reward[train], 1, n_actions, cfg.ridge)
        q_hat[fold == f] = m.predict(role[fold == f], basis[fold == f])
    return q_hat


def evaluate(log: BanditLog, pi: np.ndarray, q_hat: Callable[[], np.ndarray], w: float, policy: str,
             models: tuple[str, ...], cfg: BanditOPEConfig = BanditOPEConfig(),
             pscore: np.ndarray | None = None) -> dict:
    """Every bandit estimator of rl.ope for ``pi`` on ``log`` (reward ``quality - w cost``), with
    95% bootstrap intervals, ESS and the support check; ``q_hat()`` gives the reward model (only
    called when the policy is supported); ``pscore`` overrides the logged propensities."""
    p = log.pscore if pscore is None else pscore
    r, a = log.reward(w), log.action
    sup = ope.check_support(pi, a, p, behaviour_probs=log.probs if pscore is None else None, actions=models,
                            policy_name=policy, max_unsupported_mass=cfg.max_unsupported_mass)
    wts = ope.importance_weights(a, p, pi)
    out = {"policy": policy, "behaviour": log.behaviour, "support_share": sup.share,
           "unsupported_mass": sup.unsupported_mass, "ess": ope.kish_ess(wts), "n": len(log),
           "no_support": sup.reason, "estimates": {}}
    if sup.no_support:
        return out
    qh = q_hat()
    ests = [ope.ips(r, a, p, pi), ope.snips(r, a, p, pi), ope.dm(pi, qh), ope.dr(r, a, p, pi, qh),
            ope.sndr(r, a, p, pi, qh), ope.switch_dr(r, a, p, pi, qh, lambda_=cfg.switch_lambda)]
    for e in ests:
        ci = ope.bootstrap_ci(e, cfg.n_boot, cfg.alpha, cfg.seed)
        out["estimates"][e.name] = {"value": e.value, "low": ci.low, "high": ci.high}
    return out


# ----------------------------------------------------------------------------- propensities by BC
class PropensityBCConfig(BaseModel):
    """Behaviour cloning of the logged actions, for logs without propensities."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden: list[Annotated[int, Field(ge=1)]] = Field([], description="hidden layer widths; empty: a linear softmax "
                                                      "(the simulated behaviours do not depend on the prompt)")
    lr: float = Field(3e-3, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(1e-4, ge=0.0, description="AdamW decoupled weight decay")
    steps: int = Field(300, ge=1, description="gradient steps")
    batch_size: int = Field(256, ge=1, description="rows per step")
    holdout_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="share of the logged prompts held out for "
                                    "temperature scaling and calibration")
    seed: int = Field(0, description="seed of the holdout, the weights and the minibatches")
    floor: float = Field(rl_bc.PROPENSITY_FLOOR, gt=0.0, le=1.0, description="estimated propensities below this "
                         "are raised to it")


def fit_propensities(x_train: np.ndarray, action_train: np.ndarray, n_actions: int,
                     cfg: PropensityBCConfig = PropensityBCConfig(),
                     log: Callable[[str], None] = logger.info) -> tuple[Callable[[np.ndarray], np.ndarray], dict]:
    """Behaviour cloning of logged actions (rl.bc's MLP, temperature-scaled on a holdout):
    ``(predict(x) -> (n, K) probabilities, calibration metrics)``."""
    n = len(action_train)
    rng = np.random.default_rng(cfg.seed)
    hold = rng.random(n) < cfg.holdout_fraction
    if hold.all() or not hold.any():
        hold = np.arange(n) % 5 == 0
    torch.manual_seed(cfg.seed)
    X = torch.as_tensor(x_train, dtype=torch.float32)
    Y = torch.as_tensor(action_train, dtype=torch.int64)
    fit_idx = torch.as_tensor(np.flatnonzero(~hold))
    net = nets.mlp(x_train.shape[1], cfg.hidden, n_actions)
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    gen = torch.Generator().manual_seed(cfg.seed)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(cfg.steps):
            b = fit_idx[torch.randint(0, len(fit_idx), (min(cfg.batch_size, len(fit_idx)),), generator=gen)]
            loss = F.cross_entropy(net(X[b]), Y[b])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        with torch.no_grad():
            logits = net(X).double().numpy()
    finally:
        torch.set_num_threads(old)
    mask = np.ones((n, n_actions), dtype=bool)
    T = rl_bc.fit_temperature(logits[hold], mask[hold], action_train[hold])
    layers = nets.export_layers(net)
    before = rl_bc.calibration_metrics(masked_softmax(logits[hold], mask[hold], 1.0), mask[hold],
                                       action_train[hold])
    after = rl_bc.calibration_metrics(masked_softmax(logits[hold], mask[hold], T), mask[hold],
                                      action_train[hold])
    metrics = {"temperature": T, "holdout_rows": int(hold.sum()), "holdout_nll_before": before["nll"],
               "holdout_nll_after": after["nll"], "holdout_ece_after": after["ece"], "config": cfg.model_dump()}
    log(f"propensity BC: T={T:.3f}, held-out nll {before['nll']:.4f} -> {after['nll']:.4f}")

    def predict(x: np.ndarray) -> np.ndarray:
        z = mlp_forward(layers, x.astype(np.float32)).astype(np.float64)
        return masked_softmax(z, np.ones(z.shape, dtype=bool), T)

    return predict, metrics


def floored(p: np.ndarray, floor: float = rl_bc.PROPENSITY_FLOOR) -> np.ndarray:
    return np.where(p >= floor, p, floor)


def summarise(rows: list[dict], truth: dict[str, float]) -> list[dict]:
    """Flat rows for a table: one per (behaviour, policy, estimator) with the truth and the error."""
    out = []
    for r in rows:
        t = truth[r["policy"]]
        if r["no_support"]:
            out.append({"behaviour": r["behaviour"], "policy": r["policy"], "estimator": "all",
                        "propensities": r.get("propensities", "logged"), "estimate": None, "low": None,
                        "high": None, "truth": t, "error": None, "covered": None, "ess": r["ess"],
                        "note": "no support"})
            continue
        for name, e in r["estimates"].items():
            covered = e["low"] <= t <= e["high"] if math.isfinite(e["low"]) else None
            out.append({"behaviour": r["behaviour"], "policy": r["policy"], "estimator": name,
                        "propensities": r.get("propensities", "logged"), "estimate": e["value"],
                        "low": e["low"], "high": e["high"], "truth": t, "error": e["value"] - t,
                        "covered": covered, "ess": r["ess"], "note": ""})
    return out
