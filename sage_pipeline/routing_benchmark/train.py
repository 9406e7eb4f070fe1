"""Training of the grid routers (torch): cost-sensitive BC and bandit CQL, one policy per cost weight.

Both train every cost weight of the grid together as one batched ensemble
(``sage_pipeline.rl.nets.Ensemble``: the members share every minibatch, as ``rl.cql`` trains
its alphas), and return a numpy :class:`~sage_pipeline.routing_benchmark.routers.GridRouter`.
See :mod:`routers` for what the routers learn.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.rl.cql import CQLConfig
from sage_pipeline.rl.nets import Ensemble, linear_init
from sage_pipeline.routing_benchmark.routers import GridRouter, oracle_targets

logger = logging.getLogger(__name__)


class BCGridConfig(BaseModel):
    """The BC grid router's training."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # [] is a linear softmax policy: on MMLU it generalised better than [32] or [64, 64], which
    # memorised the train prompts (AIQ 0.761 vs 0.754 and 0.749 on the held-out prompts)
    hidden: list[Annotated[int, Field(ge=1)]] = Field([], description="hidden layer widths; empty: a linear "
                                                      "softmax policy")
    lr: float = Field(3e-3, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(1e-4, ge=0.0, description="AdamW decoupled weight decay")
    steps: int = Field(600, ge=1, description="gradient steps (all cost weights at once)")
    batch_size: int = Field(256, ge=1, description="prompts per step")
    seed: int = Field(0, description="seed of the weights and the minibatches")
    torch_threads: int = Field(1, ge=0, description="torch intra-op threads while training; 0 leaves torch's "
                               "default")
    log_every_s: float = Field(5.0, description="progress at most this often")


class BenchmarkCQLConfig(CQLConfig):
    """CQL as the benchmark trains it: bandit critics on logged feedback, small ones
    ((64, 64) x 1500 steps memorised the logged prompts: AIQ 0.741 vs 0.750)."""

    mode: Literal["bandit", "multistep"] = Field("bandit", description="the benchmark's CQL is bandit CQL (one "
                                                 "decision per prompt)")
    hidden: list[Annotated[int, Field(ge=1)]] = Field([16], min_length=1, description="hidden layer widths of "
                                                      "each critic")
    steps: int = Field(600, ge=1, description="gradient steps (all cost weights at once)")


@contextlib.contextmanager
def _torch_threads(n: int) -> Iterator[None]:
    """torch intra-op threads while training (1 is fastest for these small nets on a shared host)."""
    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def train_bc_grid(x: np.ndarray, quality: np.ndarray, cost: np.ndarray, weights: np.ndarray,
                  models: tuple[str, ...], cfg: BCGridConfig = BCGridConfig(),
                  log: Callable[[str], None] = logger.info) -> GridRouter:
    """Cost-sensitive behaviour cloning of the oracle, one softmax policy per cost weight."""
    t0 = time.perf_counter()
    G, (n, K) = len(weights), quality.shape
    tied, regret = zip(*(oracle_targets(quality, cost, float(w)) for w in weights))
    tied = np.stack(tied)  # (G, n, K): the best models at each weight
    T = torch.as_tensor(tied / tied.sum(axis=2, keepdims=True), dtype=torch.float32)  # soft targets over ties
    reg = np.stack(regret)  # (G, n): mean regret of the other models
    reg = reg / np.where(reg.mean(axis=1, keepdims=True) > 0, reg.mean(axis=1, keepdims=True), 1.0)
    Wt = torch.as_tensor(np.where(reg.sum(axis=1, keepdims=True) > 0, reg, 1.0), dtype=torch.float32)
    X = torch.as_tensor(x, dtype=torch.float32)
    with _torch_threads(cfg.torch_threads):
        gen = torch.Generator().manual_seed(cfg.seed)
        sizes = [x.shape[1], *map(int, cfg.hidden), K]
        net = Ensemble([linear_init(sizes, cfg.seed * 1009 + g) for g in range(G)])
        opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        B, last, loss_hist = min(cfg.batch_size, n), time.perf_counter(), deque(maxlen=100)  # see rl/cql.py
        log(f"bc grid: {n} train prompts, {K} models, {G} cost weights, {cfg.steps} steps of {B}")
        for step in range(1, cfg.steps + 1):
            idx = torch.randint(0, n, (B,), generator=gen)
            logits = net(X[idx])  # (G, B, K)
            ce = -(T[:, idx] * F.log_softmax(logits, dim=2)).sum(dim=2)  # (G, B)
            loss = (ce * Wt[:, idx]).mean(dim=1)
            opt.zero_grad(set_to_none=True)
            loss.sum().backward()
            opt.step()
            loss_hist.append(loss.detach())
            if time.perf_counter() - last > cfg.log_every_s or step == cfg.steps:
                last = time.perf_counter()
                log(f"bc grid: step {step}/{cfg.steps} mean weighted loss "
                    f"{float(torch.stack(list(loss_hist)).mean()):.4f} {step / (last - t0):.0f} steps/s")
    nets = [[layers] for layers in net.export(range(G))]
    router = GridRouter("bc", models, np.asarray(weights, dtype=np.float64), nets)
    agree = [float(tied[g][np.arange(n), router.outputs(x, g).argmax(1)].mean()) for g in range(G)]
    router.metrics.update({"steps": cfg.steps, "seconds": time.perf_counter() - t0, "train_agreement": agree,
                           "weighted_share": (np.stack(regret) > 0).mean(axis=1).tolist(),
                           "config": cfg.model_dump()})
    return router


def train_cql_grid_bandit(x: np.ndarray, action: np.ndarray, quality: np.ndarray, cost: np.ndarray,
                          weights: np.ndarray, models: tuple[str, ...], cfg: CQLConfig | None = None,
                          log: Callable[[str], None] = logger.info) -> GridRouter:
    """Bandit CQL on logged feedback (``quality``/``cost`` of the logged ``action`` per prompt),
    the reward ``quality - w * cost`` relabelled for each cost weight; one critic set per weight."""
    cfg = cfg or CQLConfig(mode="bandit")
    if cfg.mode != "bandit":
        raise ValueError(f"train_cql_grid_bandit trains bandit CQL; got mode {cfg.mode!r}")
    t0 = time.perf_counter()
    G, C, K, n = len(weights), cfg.n_critics, len(models), len(action)
    M = G * C
    r = quality[None, :] - np.asarray(weights)[:, None] * cost[None, :]  # (G, n)
    shift = r.mean(axis=1) if cfg.normalize_rewards else np.zeros(G)
    scale = r.std(axis=1) if cfg.normalize_rewards else np.ones(G)
    scale = np.where(scale > 1e-8, scale, 1.0)
    R = torch.as_tensor(((r - shift[:, None]) / scale[:, None]).repeat(C, axis=0), dtype=torch.float32)  # (M, n)
    X, A = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(action, dtype=torch.int64)
    with _torch_threads(cfg.torch_threads):
        gen = torch.Generator().manual_seed(cfg.seed)
        sizes = [x.shape[1], *map(int, cfg.hidden), K]
        # critic j of every weight starts from the same init (as rl.cql does across alphas)
        inits = [linear_init(sizes, cfg.seed * 1009 + j) for _ in range(G) for j in range(C)]
        q = Ensemble(inits)
        opt = torch.optim.AdamW(q.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        B, last, hist = min(cfg.batch_size, n), time.perf_counter(), deque(maxlen=100)
        log(f"cql grid (bandit): {n} logged prompts, {K} models, {G} cost weights x {C} critics, "
            f"alpha {cfg.alpha}, {cfg.steps} steps of {B}")
        for step in range(1, cfg.steps + 1):
            idx = torch.randint(0, n, (B,), generator=gen)
            qs = q(X[idx])  # (M, B, K)
            q_data = qs.gather(2, A[idx][None, :, None].expand(M, B, 1))[..., 0]
            td = F.huber_loss(q_data, R[:, idx], delta=cfg.huber_delta, reduction="none").mean(1)
            gap = (torch.logsumexp(qs, dim=2) - q_data).mean(1)
            loss = (td + cfg.alpha * gap).sum()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            hist.append(torch.stack([td.mean(), gap.mean()]).detach())
            if time.perf_counter() - last > cfg.log_every_s or step == cfg.steps:
                last = time.perf_counter()
                td_m, gap_m = torch.stack(list(hist)).mean(0).tolist()
                log(f"cql grid: step {step}/{cfg.steps} td {td_m:.4f} gap {gap_m:.3f} "
                    f"{step / (last - t0):.0f} steps/s")
    member_scale, member_shift = np.repeat(scale, C), np.repeat(shift, C)
    flat = q.export(range(M), member_scale, member_shift)
    nets = [flat[g * C:(g + 1) * C] for g in range(G)]
    router = GridRouter("cql", models, np.asarray(weights, dtype=np.float64), nets)
    router.metrics.update({"steps": cfg.steps, "seconds": time.perf_counter() - t0, "alpha": cfg.alpha,
                           "logged_prompts": n, "logged_share": (np.bincount(action, minlength=K) / n).tolist(),
                           "config": cfg.to_dict()})
    return router
