"""Behaviour cloning (BC), calibrated: the logging policy learnt back from its decisions.

A ReLU MLP maps ``FeatureSpec.encode(contexts)`` to one logit per model; logits of models
that are not candidates for the row's role are masked out, and the loss is the
cross-entropy of the logged model. Part of the *train* split, grouped by session, is
held out (never the eval split): it stops training early and fits a temperature
``T > 0`` that divides the logits (temperature scaling, Guo et al. 2017, "On Calibration
of Modern Neural Networks"), so that the probabilities are calibrated. Calibrated BC
probabilities are the estimated propensities of logs that lack them
(:func:`estimate_propensities`).

Calibration is reported before and after scaling, on the held-out rows:

* ``nll``: mean negative log-likelihood of the logged model;
* ``ece``: expected calibration error over every candidate (row, model) pair, 10 equal
  bins of the predicted probability: ``sum_b n_b/N |mean p - freq(logged == model)|``
  (the classwise / static calibration error, Nixon et al. 2019). This is the error that
  matters for a propensity: when BC says 0.06, the model was logged 6% of the time;
* ``ece_top``: Guo et al.'s top-class ECE (confidence of the argmax vs accuracy).

The trained net is exported as plain arrays and served by
:class:`sage_pipeline.rl.checkpoint.MLPPolicy` (numpy only, ``head="softmax"`` with the
fitted temperature); training checks that the numpy-served probabilities equal the torch
ones to 1e-5.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp
from torch import nn

from sage_pipeline.rl import nets
from sage_pipeline.rl.checkpoint import CheckpointMeta, Layers, MLPPolicy, masked_softmax, save_checkpoint
from sage_pipeline.rl.data import LoggedDecisions
from sage_pipeline.routing.features import Contexts, FeatureSpec

logger = logging.getLogger(__name__)

PROPENSITY_FLOOR = 1e-3  # estimated propensities below this are raised to it: IPS weights stay <= 1000
SERVING_ATOL = 1e-5  # numpy-served vs torch probabilities
T_BOUNDS = (0.05, 20.0)  # search interval of the temperature
T_XATOL = 1e-10  # absolute tolerance of the search on log T


class BCConfig(BaseModel):
    """BC's hyperparameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    hidden: list[Annotated[int, Field(ge=1)]] = Field([64, 64], min_length=1, description="hidden layer widths of "
                                                      "the ReLU MLP (one or more, each >= 1)")
    lr: float = Field(3e-3, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(1e-4, ge=0.0, description="AdamW decoupled weight decay")
    epochs: int = Field(100, ge=1, description="maximum training epochs (early stopping on held-out train sessions "
                        "usually ends sooner)")
    batch_size: int = Field(64, ge=1, description="rows per gradient update")
    # Does not bind at the default data size (about 290 updates per epoch).
    max_updates: int = Field(40_000, ge=0, description="at most this many gradient updates in all (0: no budget), "
                             "so training time stops growing with the data: on large logs an epoch is long and one "
                             "or two suffice; does not bind at the default size")
    patience: int = Field(20, ge=0, description="epochs without a better held-out NLL before stopping; 0 = run "
                          "every epoch")
    holdout_fraction: float = Field(0.2, gt=0.0, le=0.5, description="share of the train split's sessions held out "
                                    "for early stopping and the temperature, in (0, 0.5]")
    ece_bins: int = Field(10, ge=1, description="bins of the expected calibration error")
    seed: int = Field(0, description="seed of the weights, the holdout and the minibatches")
    device: str = Field("cpu", description="torch device")
    # One thread is fastest for an MLP this small: on a loaded 2-core host the default
    # (2 threads) trained 35-60x slower in our measurements.
    num_threads: int = Field(1, ge=0, description="torch intra-op threads while training (restored afterwards); 0 "
                             "leaves torch's default")
    log_every_s: float = Field(5.0, description="progress inside an epoch at most this often (and after every "
                               "epoch)")


@dataclass(frozen=True)
class BCResult:
    nets: list[Layers]  # one MLP: [(weight (out, in), bias (out,)), ...] as mlp_forward expects
    temperature: float
    metrics: dict
    config: BCConfig
    feature_spec: dict
    actions: tuple[str, ...]
    role_mask: np.ndarray
    training_data_sha256: str  # of the decisions it was trained on (see data_sha256)
    net: nn.Module | None = field(default=None, repr=False, compare=False)  # the torch model, not saved

    def meta(self, training_data_sha256: str | None = None, metrics: dict | None = None) -> CheckpointMeta:
        """Checkpoint metadata; pass the routing dataset file's hash to record it instead of the
        decisions' own, and ``metrics`` to add to the training ones."""
        return CheckpointMeta(kind="bc", head="softmax", temperature=self.temperature,
                              feature_spec=self.feature_spec, actions=list(self.actions),
                              role_mask=self.role_mask.tolist(), metrics={**self.metrics, **(metrics or {})},
                              config=self.config.model_dump(),
                              training_data_sha256=training_data_sha256 or self.training_data_sha256)

    def policy(self) -> MLPPolicy:
        """The policy exactly as a saved checkpoint serves it (numpy)."""
        return MLPPolicy(self.meta(), self.nets, name="bc")

    def save(self, path: str | Path, training_data_sha256: str | None = None, metrics: dict | None = None) -> Path:
        """Write the checkpoint folder atomically (:func:`~sage_pipeline.rl.checkpoint.save_checkpoint`)."""
        return save_checkpoint(path, self.meta(training_data_sha256, metrics), self.nets)


# ------------------------------------------------------------------ network
def masked_logits(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(~mask, -math.inf)


@torch.no_grad()
def torch_action_probs(net: nn.Module, spec: FeatureSpec, ctx: Contexts, role_mask: np.ndarray,
                       temperature: float) -> np.ndarray:
    """The torch model's probabilities (what the served checkpoint must reproduce)."""
    dev = next(net.parameters()).device
    x = torch.as_tensor(spec.encode(ctx), device=dev)
    mask = torch.as_tensor(role_mask[ctx.role], device=dev)
    return torch.softmax(masked_logits(net(x), mask) / temperature, dim=1).double().cpu().numpy()


# ------------------------------------------------------- calibration tools
def _nll(logits: np.ndarray, mask: np.ndarray, y: np.ndarray, temperature: float) -> float:
    z = np.where(mask, logits.astype(np.float64) / temperature, -np.inf)
    return float(np.mean(logsumexp(z, axis=1) - z[np.arange(len(y)), y]))


def fit_temperature(logits: np.ndarray, mask: np.ndarray, y: np.ndarray) -> float:
    """argmin_T NLL(logits / T) over ``T_BOUNDS``: bounded Brent search on log T (NLL is convex
    in 1/T), to ``T_XATOL`` in log T."""
    res = minimize_scalar(lambda log_t: _nll(logits, mask, y, math.exp(log_t)), method="bounded",
                          bounds=(math.log(T_BOUNDS[0]), math.log(T_BOUNDS[1])), options={"xatol": T_XATOL})
    if not res.success:
        raise RuntimeError(f"bc: temperature search did not converge ({res.message}); the held-out logits "
                           "are not finite or the held-out rows are empty")
    return float(math.exp(res.x))


def _ece(p: np.ndarray, hit: np.ndarray, bins: int) -> float:
    if p.size == 0:
        return float("nan")
    b = np.minimum((p * bins).astype(np.int64), bins - 1)
    gap = np.bincount(b, weights=p - hit, minlength=bins)
    return float(np.abs(gap).sum() / p.size)


def calibration_metrics(probs: np.ndarray, mask: np.ndarray, y: np.ndarray,
                        bins: int = 10) -> dict[str, float]:
    """NLL, accuracy, ECE over every candidate (row, model) pair, and top-class ECE."""
    n = len(y)
    p_y = probs[np.arange(n), y]
    hit = np.zeros(probs.shape, dtype=np.float64)
    hit[np.arange(n), y] = 1.0
    top = probs.argmax(axis=1)
    return {
        "nll": float(-np.mean(np.log(np.maximum(p_y, 1e-300)))),
        "accuracy": float(np.mean(top == y)),
        "ece": _ece(probs[mask], hit[mask], bins),
        "ece_top": _ece(probs.max(axis=1), (top == y).astype(np.float64), bins),
    }


# ------------------------------------------------------------------ helpers
def data_sha256(data: LoggedDecisions) -> str:
    """Content hash of the decisions (contexts, logged actions, sessions, action set)."""
    h = hashlib.sha256(repr(data.actions).encode())
    c = data.contexts
    for arr in (c.role, c.task_complexity_score, c.prompt_tokens, c.step, c.failure_count,
                c.primary_failure_count, data.action, data.session, data.role_mask):
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def holdout_rows(data: LoggedDecisions, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    """(fit rows, held-out rows, grouping): whole sessions held out, or whole episodes when
    the train split has a single session."""
    groups, by = data.session, "session"
    if len(np.unique(groups)) < 2:
        groups, by = data.episode, "episode"
    uniq = np.unique(groups)
    if len(uniq) < 2:
        raise ValueError("train_bc needs at least 2 sessions (or episodes) in the train split to hold one "
                         f"out for early stopping and calibration; got {len(data)} decisions of one episode")
    n_hold = min(max(1, round(fraction * len(uniq))), len(uniq) - 1)
    held = np.random.default_rng(seed).permutation(uniq)[:n_hold]
    is_held = np.isin(groups, held)
    return np.flatnonzero(~is_held), np.flatnonzero(is_held), by


def _check_input(data: LoggedDecisions) -> None:
    if len(data) == 0:
        raise ValueError("train_bc got no logged decisions: the train split is empty "
                         "(materialize routing_dataset from logs with TRAJECTORY_STEP events)")
    evals = int(np.sum(data.split == "eval"))
    if evals:
        raise ValueError(f"train_bc got {evals} eval-split decisions: pass data.split_rows('train'); "
                         "the eval split is kept for offline_eval")
    bad = ~data.mask[np.arange(len(data)), data.action]
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"logged model {data.actions[data.action[i]]!r} at row {i} is not a candidate for "
                         f"role {data.roles[data.contexts.role[i]]!r} ({int(bad.sum())} rows): fix the catalogue "
                         "or the logs")


# ------------------------------------------------------------------ training
def train_bc(data: LoggedDecisions, spec: FeatureSpec, config: BCConfig = BCConfig(),
             log: Callable[[str], None] = logger.info) -> BCResult:
    """Clone the behaviour policy from the train split ``data``; calibrate it by temperature."""
    _check_input(data)
    threads = torch.get_num_threads()
    if config.num_threads:
        torch.set_num_threads(config.num_threads)
    try:
        return _train(data, spec, config, log)
    finally:
        torch.set_num_threads(threads)


def _train(data: LoggedDecisions, spec: FeatureSpec, config: BCConfig,
           log: Callable[[str], None]) -> BCResult:
    t0 = time.perf_counter()
    torch.manual_seed(config.seed)
    dev = torch.device(config.device)
    x = torch.as_tensor(spec.encode(data.contexts), device=dev)  # raises on a non-finite feature, naming it
    mask = torch.as_tensor(data.mask, device=dev)
    y = torch.as_tensor(data.action, device=dev)
    fit_idx, hold_idx, grouped_by = holdout_rows(data, config.holdout_fraction, config.seed)
    fit_t, hold_t = torch.as_tensor(fit_idx, device=dev), torch.as_tensor(hold_idx, device=dev)
    net = nets.mlp(spec.dim, config.hidden, len(data.actions)).to(dev)
    opt = torch.optim.AdamW(net.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    gen = torch.Generator().manual_seed(config.seed)
    log(f"bc: {len(fit_idx)} decisions to fit, {len(hold_idx)} held out by {grouped_by}, "
        f"{len(data.actions)} models, up to {config.epochs} epochs")

    def holdout_nll() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(masked_logits(net(x[hold_t]), mask[hold_t]), y[hold_t]))

    best = (math.inf, 0, {k: v.clone() for k, v in net.state_dict().items()})
    last_log, seen, epoch, updates = time.perf_counter(), 0, 0, 0
    for epoch in range(1, config.epochs + 1):
        net.train()
        perm = fit_t[torch.randperm(len(fit_t), generator=gen).to(dev)]
        total, seen_before = 0.0, seen
        for start in range(0, len(perm), config.batch_size):
            if config.max_updates and updates >= config.max_updates:
                break
            updates += 1
            b = perm[start:start + config.batch_size]
            loss = F.cross_entropy(masked_logits(net(x[b]), mask[b]), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(b)
            seen += len(b)
            if time.perf_counter() - last_log > config.log_every_s:
                last_log = time.perf_counter()
                log(f"bc: epoch {epoch} batch loss {float(loss.detach()):.4f} "
                    f"{seen / (last_log - t0):,.0f} rows/s")
        net.eval()
        h = holdout_nll()
        improved = h < best[0] - 1e-6
        if improved:
            best = (h, epoch, {k: v.clone() for k, v in net.state_dict().items()})
        last_log = time.perf_counter()
        log(f"bc: epoch {epoch}/{config.epochs} loss {total / max(seen - seen_before, 1):.4f} holdout_nll {h:.4f}"
            f"{' *' if improved else ''} {seen / (last_log - t0):,.0f} rows/s")
        if config.max_updates and updates >= config.max_updates:
            log(f"bc: update budget reached after {updates:,} updates (epoch {epoch}); best epoch {best[1]}")
            break
        if config.patience and epoch - best[1] >= config.patience:
            log(f"bc: early stop after epoch {epoch}: no better held-out NLL since epoch {best[1]}")
            break
    net.load_state_dict(best[2])
    net.eval()

    # temperature scaling on the held-out rows
    with torch.no_grad():
        logits = net(x).double().cpu().numpy()
    m_np, y_np = data.mask, data.action
    T = fit_temperature(logits[hold_idx], m_np[hold_idx], y_np[hold_idx])
    metrics: dict = {"temperature": T, "epochs": epoch, "best_epoch": best[1], "updates": updates, "rows": len(data),
                     "fit_rows": len(fit_idx), "holdout_rows": len(hold_idx),
                     "holdout_grouped_by": grouped_by}
    for part, rows in (("train", fit_idx), ("holdout", hold_idx)):
        for when, temp in (("before", 1.0), ("after", T)):  # accuracy: the same both ways
            cal = calibration_metrics(masked_softmax(logits[rows], m_np[rows], temp), m_np[rows], y_np[rows],
                                      config.ece_bins)
            metrics[f"{part}_accuracy"] = cal.pop("accuracy")
            metrics |= {f"{part}_{k}_{when}": v for k, v in cal.items()}

    # roles whose logs hold a single model: BC puts (almost) all mass on it; probability 1
    # exactly where the role has a single candidate
    one = [data.roles[r] for r in np.unique(data.contexts.role)
           if len(np.unique(data.action[data.contexts.role == r])) == 1]
    metrics["roles_with_one_action"] = one
    metrics["roles_without_data"] = [r for i, r in enumerate(data.roles) if not (data.contexts.role == i).any()]

    layers = nets.export_layers(net)
    result = BCResult(nets=[layers], temperature=T, metrics=metrics, config=config,
                      feature_spec=spec.to_dict(), actions=tuple(data.actions),
                      role_mask=np.asarray(data.role_mask),
                      training_data_sha256=data_sha256(data), net=net)
    served = result.policy().action_probs(data.contexts)
    diff = float(np.abs(served - torch_action_probs(net, spec, data.contexts, data.role_mask, T)).max())
    if diff > SERVING_ATOL:
        raise RuntimeError(f"bc: numpy-served probabilities differ from torch by {diff:.2e} > {SERVING_ATOL}")
    metrics["serving_max_abs_diff"] = diff
    logged = np.isfinite(data.pscore[hold_idx])
    if logged.any():  # the logs carry propensities: how well BC recovers them on unseen sessions
        p_hat = served[hold_idx[logged], data.action[hold_idx[logged]]]
        metrics["holdout_propensity_mae"] = float(np.mean(np.abs(p_hat - data.pscore[hold_idx[logged]])))
    metrics["seconds"] = time.perf_counter() - t0
    log(f"bc: T={T:.3f}; held-out nll {metrics['holdout_nll_before']:.4f} -> "
        f"{metrics['holdout_nll_after']:.4f}, ece {metrics['holdout_ece_before']:.4f} -> "
        f"{metrics['holdout_ece_after']:.4f}, "
        f"accuracy {metrics['holdout_accuracy']:.3f}; {metrics['seconds']:.1f}s")
    return result


def estimate_propensities(policy, data: LoggedDecisions, floor: float = PROPENSITY_FLOOR,
                          log: Callable[[str], None] = logger.warning) -> np.ndarray:
    """``policy``'s probability of each logged action, for logs that lack propensities.

    Probabilities below ``floor`` (default 1e-3) are raised to it, so the result is never 0
    and inverse-propensity weights stay bounded; the rows floored are exactly those with
    ``result == floor`` and their count is logged.
    """
    if not 0.0 < floor < 1.0:
        raise ValueError(f"floor must be in (0, 1), got {floor}")
    if tuple(policy.actions) != tuple(data.actions):
        raise ValueError(f"policy {getattr(policy, 'name', 'policy')!r} has actions {list(policy.actions)}, "
                         f"the data {list(data.actions)}: use a policy trained on this catalogue")
    if len(data) == 0:
        return np.zeros(0)
    p = policy.action_probs(data.contexts)[np.arange(len(data)), data.action].astype(np.float64)
    low = ~(p >= floor)  # NaN counts as floored
    if low.any():
        log(f"estimated propensity below {floor} in {int(low.sum())} of {len(p)} decisions: "
            f"floored to {floor}")
    return np.where(low, floor, p)
