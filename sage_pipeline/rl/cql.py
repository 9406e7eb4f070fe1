"""Discrete conservative Q-learning (CQL(H), Kumar et al. 2020) on logged routing decisions.

One file in the CleanRL manner: the hyperparameters in :class:`CQLConfig`, the update
loop in :func:`train_cql_grid`. Two modes:

* ``bandit``: every logged decision is a one-step problem; the TD target is the
  (normalised) immediate reward, no bootstrap, no target network.
* ``multistep``: decisions are linked through ``LoggedDecisions.next_index`` into
  episodes (a task retried after a failure); the target is the double-DQN one,
  ``r + gamma * (1 - done) * Q_target(s', argmax_{allowed a'} Q_online(s', a'))``, with
  ``done = next_index == -1`` and Polyak-averaged (or hard-copied) target critics.

Both minimise, per critic, ``Huber(Q(s, a_logged) - target)`` plus
``alpha * (logsumexp over the role's ALLOWED actions of Q(s, .) - Q(s, a_logged))``. The
conservative term pushes down every allowed action that the data does not support, so an
action never logged for a role does not become its greedy choice (with alpha > 0 and the
default budget; alpha = 0 lets the critics invent values for it from other roles, and
``metrics["unlogged_pairs"]`` lists such pairs). Masked actions get ``-inf`` everywhere
(logsumexp, argmax, serving): they are never chosen.

Rewards are normalised for training and the scaling is folded back into the last layer
of every exported critic, so the served Q-values are in reward units. In ``bandit`` mode
the rewards are standardised (shift and scale: the argmax of a one-step Q is invariant to
both). In ``multistep`` mode they are only scaled: subtracting a mean per step would add
a per-step bonus that changes which episode lengths, and so which actions, are best.

Several critics (``n_critics``) are trained as one batched ensemble; the served policy
is the greedy argmax of their MEAN (``MLPPolicy`` averages its nets). The bootstrap takes
the MIN over the target critics at the online critics' argmax by default (clipped double
Q): one more guard against the overestimation that offline bootstrapping compounds,
at no cost here (episodes are at most 4 attempts; on the default data ``min`` and
``mean`` gave the same ground-truth value within 0.005 of regret closure). Several alphas
are trained the same way in one run (:func:`train_cql_grid`), sharing every minibatch and
their initial weights, so their comparison is not blurred by seed noise. Choosing alpha
is OPE's job on the eval split (never the simulator's ground truth); this module only
trains for given alphas. Measured on 5,000 synthetic episodes (the collector's default is
now 20,000: docs/benchmarks.md, "Offline chain quality"), eps=0.3 exploration, so every
candidate is logged: alpha in 0..0.03 closes ~0.83 of the static
table's regret in both modes, 0.1 less (bandit ~0.77, multistep ~0.5), and alpha >= 0.3
gives back the table's own choices; on data with poorer coverage larger alphas matter.

The result's ``nets`` are numpy ``(weight (out, in), bias)`` layers for
:func:`sage_pipeline.rl.checkpoint.mlp_forward`; :meth:`CQLResult.save` writes the checkpoint
(``kind="cql"``, ``head="greedy"``) that :func:`sage_pipeline.rl.checkpoint.load_policy`
serves with numpy only.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.rl.checkpoint import CheckpointMeta, Layers, MLPPolicy, save_checkpoint
from sage_pipeline.rl.data import LoggedDecisions
from sage_pipeline.rl.nets import Ensemble, linear_init
from sage_pipeline.routing.features import FeatureSpec
from sage_pipeline.routing.schema import ROLES


class CQLConfig(BaseModel):
    """CQL's hyperparameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["bandit", "multistep"] = Field("multistep", description="'multistep' (episodes, double-DQN "
                                                 "target) or 'bandit' (one decision, no bootstrap)")
    alpha: float = Field(0.03, ge=0.0, allow_inf_nan=False, description="weight of the conservative term (on "
                         "normalised Q), a finite number >= 0; chosen by OPE on eval")
    hidden: list[Annotated[int, Field(ge=1)]] = Field([64, 64], min_length=1, description="hidden layer widths of "
                                                      "each critic (one or more, each >= 1)")
    lr: float = Field(1e-3, gt=0.0, description="AdamW learning rate")
    weight_decay: float = Field(1e-4, ge=0.0, description="AdamW decoupled weight decay")
    # ~85 epochs of 6k rows; more overfits the noisy rewards
    steps: int = Field(2000, ge=1, description="gradient steps, at least (see min_passes)")
    # large logs get ceil(min_passes * rows / batch_size) steps (2M episodes: ~9k), so they are not trained on a
    # fraction of themselves; at the default 20k episodes one pass is ~100 steps and `steps` binds
    # (docs/benchmarks.md, Scale)
    min_passes: float = Field(1.0, ge=0.0, allow_inf_nan=False, description="and at least this many passes over "
                              "the training rows (ceil(min_passes * rows / batch_size) steps; binds on large logs "
                              "only: about 9,000 steps at 2M episodes); 0 trains exactly `steps`")
    batch_size: int = Field(256, ge=1, description="rows per gradient step")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount in [0, 1]; 1.0: the value is the undiscounted "
                         "return of an episode (<= 4 attempts)")
    n_critics: int = Field(2, ge=1, description="critics trained as one ensemble; the policy is greedy in their "
                           "mean")
    target_tau: float = Field(0.01, gt=0.0, le=1.0, description="Polyak averaging of the target critics per step, "
                              "in (0, 1] ...")
    target_every: int = Field(0, ge=0, description="... or, when > 0, a hard copy every this many steps (0: Polyak "
                              "with target_tau)")
    target_reduce: Literal["min", "mean"] = Field("min", description="over the target critics: 'min' (pessimistic) "
                                                  "or 'mean'")
    # rewards are bimodal (fail ~0, pass ~1): a small delta fits nearer the median than the mean and biases Q;
    # 3 std clips only the rare extreme TD errors
    huber_delta: float = Field(3.0, gt=0.0, description="Huber loss threshold, in normalised units (> 0)")
    normalize_rewards: bool = Field(True, description="train on normalised rewards (folded back into the exported "
                                    "critics)")
    seed: int = Field(0, description="seed of the weights and the minibatches")
    torch_threads: int = Field(1, ge=0, description="torch intra-op threads while training (1 is fastest for small "
                               "MLPs); 0 leaves torch's default")
    log_every_s: float = Field(5.0, description="progress at most this often")

    def to_dict(self) -> dict:
        return self.model_dump()

    def n_steps(self, rows: int) -> int:
        """Gradient steps on ``rows`` training rows: ``steps``, or ``min_passes`` passes if that is more."""
        batch = max(1, min(self.batch_size, rows))
        return max(self.steps, math.ceil(self.min_passes * rows / batch))


@dataclass(frozen=True)
class CQLResult:
    nets: list[Layers]  # one MLP per critic, Q in reward units; served as their mean
    config: CQLConfig
    spec: FeatureSpec
    actions: tuple[str, ...]
    role_mask: np.ndarray
    metrics: dict = field(default_factory=dict)
    critics: torch.nn.Module | None = field(default=None, repr=False, compare=False)  # the trained ensemble
    members: tuple[int, int] = (0, 0)  # this result's critics in it: members[0] <= m < members[1]

    def torch_q(self, x: np.ndarray) -> np.ndarray:
        """Q-values in reward units straight from the torch critics (mean over this result's
        critics), for checking the exported numpy nets; (n, K)."""
        if self.critics is None:
            raise ValueError("this CQLResult carries no torch critics (it was not returned by train_cql)")
        with torch.no_grad():
            q = self.critics(torch.from_numpy(np.asarray(x, dtype=np.float32)))
        q = q[self.members[0]:self.members[1]]
        m = self.metrics
        return (q.mean(0).double() * m["reward_scale"] + m["reward_shift"]).numpy()

    def meta(self, training_data_sha256: str | None = None, metrics: dict | None = None) -> CheckpointMeta:
        """The checkpoint metadata: ``kind="cql"``, greedy head over the critics' mean."""
        return CheckpointMeta(kind="cql", feature_spec=self.spec.to_dict(), actions=list(self.actions),
                              role_mask=self.role_mask.tolist(), head="greedy",
                              training_data_sha256=training_data_sha256,
                              metrics={**self.metrics, **(metrics or {})}, config=self.config.to_dict())

    def policy(self) -> MLPPolicy:
        """The trained policy served in numpy, exactly as it will be after save and load."""
        return MLPPolicy(self.meta(), self.nets, name="cql")

    def save(self, path: str | Path, training_data_sha256: str | None = None, metrics: dict | None = None) -> Path:
        """Write the checkpoint folder atomically (:func:`~sage_pipeline.rl.checkpoint.save_checkpoint`);
        ``metrics`` adds to the training ones."""
        return save_checkpoint(path, self.meta(training_data_sha256, metrics), self.nets)


# ----------------------------------------------------------------------------- checks
def _check_data(data: LoggedDecisions, spec: FeatureSpec) -> None:
    if len(data) == 0:
        raise ValueError("CQL got no logged decisions to learn from (is the train split empty? "
                         "materialize routing_dataset with more sessions or a smaller eval_fraction)")
    bad = ~np.isfinite(data.reward)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"CQL: reward is not finite ({data.reward[i]}) at row {i} "
                         f"(episode {data.episode[i]}, step {data.step[i]}) and {int(bad.sum()) - 1} other "
                         "rows; fix or drop those decisions in routing_dataset")
    K = len(data.actions)
    if data.role_mask.shape != (len(spec.roles), K):
        raise ValueError(f"CQL: role_mask has shape {data.role_mask.shape}, expected "
                         f"{(len(spec.roles), K)} (roles of the feature spec x actions)")
    if ((data.action < 0) | (data.action >= K)).any():
        raise ValueError(f"CQL: logged action index outside 0..{K - 1}")
    off = ~data.mask[np.arange(len(data)), data.action]
    if off.any():
        i = int(np.argmax(off))
        raise ValueError(f"CQL: row {i} logs model {data.actions[data.action[i]]!r}, which is not a "
                         f"candidate for role {spec.roles[data.contexts.role[i]]!r} "
                         f"({int(off.sum())} such rows)")
    nxt = data.next_index
    if ((nxt < -1) | (nxt >= len(data))).any():
        raise ValueError("CQL: next_index points outside the data; "
                         "build subsets with LoggedDecisions.subset")


def unlogged_pairs(data: LoggedDecisions, roles: Sequence[str] = ROLES) -> list[str]:
    """'role/model' for every allowed model never logged for a role that has data."""
    seen = np.zeros(data.role_mask.shape, dtype=bool)
    seen[data.contexts.role, data.action] = True
    has = np.bincount(data.contexts.role, minlength=len(roles)) > 0
    never = data.role_mask & ~seen & has[:, None]
    return [f"{roles[r]}/{data.actions[a]}" for r, a in zip(*np.nonzero(never))]


# ------------------------------------------------------------------------------ train
def train_cql(data_train: LoggedDecisions, spec: FeatureSpec, config: CQLConfig = CQLConfig(),
              log: Callable[[str], None] = print) -> CQLResult:
    """Train discrete CQL with ``config.alpha`` on the train split's logged decisions."""
    return train_cql_grid(data_train, spec, config, [config.alpha], log=log)[0]


def train_cql_grid(data_train: LoggedDecisions, spec: FeatureSpec, config: CQLConfig = CQLConfig(),
                   alphas: Sequence[float] | None = None,
                   log: Callable[[str], None] = print) -> list[CQLResult]:
    """Train one CQL agent per alpha in a single batched run (same minibatches, same initial
    critics); returns their results in the order of ``alphas``. Costs about
    ``len(alphas) * n_critics`` small MLPs per step, far less than separate runs."""
    alphas = [config.alpha] if alphas is None else [float(a) for a in alphas]
    if not alphas:
        raise ValueError("train_cql_grid needs at least one alpha")
    configs = [CQLConfig.model_validate(config.model_dump() | {"alpha": a}) for a in alphas]  # validates each
    _check_data(data_train, spec)
    threads = torch.get_num_threads()
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    try:
        return _train(data_train, spec, config, alphas, configs, log)
    finally:
        torch.set_num_threads(threads)


def _train(data_train: LoggedDecisions, spec: FeatureSpec, config: CQLConfig, alphas: list[float],
           configs: list[CQLConfig], log: Callable[[str], None]) -> list[CQLResult]:
    t_start = time.perf_counter()
    c, G, C, K = config, len(alphas), config.n_critics, len(data_train.actions)
    M = G * C  # ensemble members: member g * C + j is critic j of alpha g

    # ---- data as tensors
    X = torch.from_numpy(spec.encode(data_train.contexts))
    A = torch.from_numpy(data_train.action)
    r = data_train.reward.astype(np.float64)
    multistep = c.mode == "multistep"
    shift = float(r.mean()) if (c.normalize_rewards and not multistep) else 0.0
    scale = float(r.std()) if c.normalize_rewards else 1.0
    scale = scale if scale > 1e-8 else 1.0
    R = torch.from_numpy(((r - shift) / scale).astype(np.float32))
    MASK = torch.from_numpy(data_train.mask)
    nxt = data_train.next_index
    NOT_DONE = torch.from_numpy((nxt >= 0).astype(np.float32))
    NXT = torch.from_numpy(np.maximum(nxt, 0))
    alpha = torch.tensor(alphas, dtype=torch.float32).repeat_interleave(C)[:, None]  # (M, 1)
    n_eval = int((np.asarray(data_train.split) == "eval").sum())
    if n_eval:
        log(f"cql: WARNING: the training data holds {n_eval} eval-split rows; pass data.split_rows('train') "
            "so that OPE on the eval split stays honest")
    unlogged = unlogged_pairs(data_train, spec.roles)
    if unlogged:
        log(f"cql: {len(unlogged)} allowed (role, model) pairs never logged, kept low by the conservative "
            f"term: {', '.join(unlogged[:8])}{' ...' if len(unlogged) > 8 else ''}"
            + (" -- WARNING: alpha=0 gives them arbitrary values" if min(alphas) == 0 else ""))

    # ---- critics, targets, optimiser (seeded)
    sizes = [spec.dim, *map(int, c.hidden), K]
    inits = [linear_init(sizes, c.seed * 1009 + j) for _ in range(G) for j in range(C)]  # critic j: same start
    # for every alpha
    q = Ensemble(inits)
    q_target = Ensemble(inits).requires_grad_(False)
    opt = torch.optim.AdamW(q.parameters(), lr=c.lr, weight_decay=c.weight_decay)
    gen = torch.Generator().manual_seed(c.seed)
    n, B = len(data_train), min(c.batch_size, len(data_train))
    n_steps = c.n_steps(n)
    log(f"cql[{c.mode}]: {n} decisions, {K} actions, alphas {alphas}, {C} critics, {n_steps} steps of {B} "
        f"({n_steps * B / n:.1f} passes; steps >= {c.steps} and >= {c.min_passes:g} passes)")

    # ---- update loop
    # The last 100 steps' losses only: a list of every step's small tensors, each kept between a
    # step's large temporaries, fragmented the heap by ~80 KB a step (3.2 GB more peak RSS at 9,000
    # steps; benchmarks/scale.py, docs/benchmarks.md)
    td_hist, gap_hist = deque(maxlen=100), deque(maxlen=100)
    last_log = time.perf_counter()
    for step in range(1, n_steps + 1):
        idx = torch.randint(0, n, (B,), generator=gen)
        x, a, mask = X[idx], A[idx], MASK[idx]
        with torch.no_grad():
            if multistep:
                j = NXT[idx]
                xn, mn = X[j], MASK[j]
                qn_online = q(xn).view(G, C, B, K).mean(1).masked_fill(~mn, -torch.inf)  # (G, B, K)
                a_star = qn_online.argmax(-1)  # double DQN: the online critics choose ...
                qn = q_target(xn).view(G, C, B, K).gather(3, a_star[:, None, :, None].expand(G, C, B, 1))
                qn = qn[..., 0]  # (G, C, B)
                qn = qn.min(1).values if c.target_reduce == "min" else qn.mean(1)  # ... the targets value it
                y = R[idx] + c.gamma * NOT_DONE[idx] * qn.repeat_interleave(C, 0)  # (M, B)
            else:
                y = R[idx].expand(M, B).contiguous()
        qs = q(x)  # (M, B, K)
        q_data = qs.gather(2, a[None, :, None].expand(M, B, 1))[..., 0]  # (M, B)
        td = F.huber_loss(q_data, y, delta=c.huber_delta, reduction="none").mean(1)  # (M,)
        gap = (torch.logsumexp(qs.masked_fill(~mask, -torch.inf), dim=2) - q_data).mean(1)  # (M,)
        loss = (td + alpha[:, 0] * gap).sum()  # members are independent: the sum trains each on its own
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if multistep:
            with torch.no_grad():
                if c.target_every:
                    if step % c.target_every == 0:
                        for p_t, p in zip(q_target.parameters(), q.parameters()):
                            p_t.copy_(p)
                else:
                    for p_t, p in zip(q_target.parameters(), q.parameters()):
                        p_t.lerp_(p, c.target_tau)
        td_hist.append(td.detach())
        gap_hist.append(gap.detach())
        if time.perf_counter() - last_log >= c.log_every_s or step == n_steps:
            last_log = time.perf_counter()
            rate = step / (last_log - t_start)
            td_g = torch.stack(list(td_hist)).mean(0).view(G, C).mean(1)
            gap_g = torch.stack(list(gap_hist)).mean(0).view(G, C).mean(1)
            per_alpha = zip(alphas, td_g.tolist(), gap_g.tolist())
            log(f"cql[{c.mode}] step {step}/{n_steps}  "
                + "  ".join(f"alpha={al:g}: td={t:.4f} gap={gp:.3f}" for al, t, gp in per_alpha)
                + f"  {rate:.0f} steps/s")

    # ---- export: numpy layers with the reward scaling folded into the last layer
    seconds = time.perf_counter() - t_start
    td_last = torch.stack(list(td_hist)).mean(0).view(G, C).mean(1).tolist()
    gap_last = torch.stack(list(gap_hist)).mean(0).view(G, C).mean(1).tolist()
    results = []
    for g, cfg in enumerate(configs):
        nets = q.export(range(g * C, (g + 1) * C), [scale] * C, [shift] * C)
        metrics = {
            "mode": c.mode, "alpha": cfg.alpha, "rows": n, "steps": n_steps, "passes": n_steps * B / n,
            "td_loss": td_last[g], "conservative_gap": gap_last[g],  # last 100 steps, normalised units
            "reward_mean": float(r.mean()), "reward_std": float(r.std()),
            "reward_shift": shift, "reward_scale": scale,  # trained on (r - shift) / scale; undone in nets
            "steps_per_s": n_steps / seconds, "seconds": seconds, "alphas_trained_together": G,
            "unlogged_pairs": unlogged,
        }
        res = CQLResult(nets, cfg, spec, tuple(data_train.actions), np.asarray(data_train.role_mask, bool),
                        metrics, critics=q.eval(), members=(g * C, (g + 1) * C))
        greedy = res.policy().action_probs(data_train.contexts).argmax(1)
        res.metrics["agreement_with_logged"] = float((greedy == data_train.action).mean())
        results.append(res)
    log(f"cql[{c.mode}]: trained {G} alpha(s) x {C} critics in {seconds:.1f}s "
        f"({n_steps / seconds:.0f} steps/s)")
    return results
