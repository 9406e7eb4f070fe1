"""Proximal policy optimisation (PPO, Schulman et al. 2017) on a numpy batch of episodes.

One file in the CleanRL manner (``ppo.py`` of vwxyzjn/cleanrl): the hyperparameters in
:class:`PPOConfig`, the whole update loop in :func:`train_ppo`. What it does, as CleanRL:
separate actor and critic ReLU MLPs with orthogonal init (hidden gain sqrt(2), actor head
0.01, critic head 1); rollouts of ``num_steps`` steps on ``num_envs`` environments;
generalised advantage estimation (GAE); ``update_epochs`` epochs of shuffled minibatches
with per-minibatch advantage normalisation, the clipped surrogate objective, the clipped
value loss, an entropy bonus and global gradient-norm clipping; Adam with linear
learning-rate annealing; optional early stop on approximate KL. Actions are sampled with the
Gumbel-max trick from a seeded torch generator; the environment is seeded by its caller, so
a run is reproducible given both seeds (single torch thread).

**How it is fast, with the same arithmetic.** The networks are small (two 64x64 MLPs), so a
PPO step costs more in framework overhead than in floating point. Three things cut it:

* the actor and the critic are evaluated together: each layer of both is one batched matrix
  product (``baddbmm``) of their stacked weights (:class:`ActorCritic`);
* the loss's gradient is written out (:func:`ppo_grads`) instead of recorded by autograd:
  the clipped surrogate, the entropy bonus and the clipped value loss differentiate in
  closed form with respect to the logits and the value, and back-propagation through ReLU
  layers is a few matrix products. It is the gradient autograd computes, ties included
  (``sage_pipeline_tests/rl/test_ppo.py`` compares them on random batches);
* the rollout runs the same forward pass on plain tensors (no autograd, no distribution
  objects; the Gumbel noise of a whole rollout drawn at once), Adam is torch's fused kernel
  called directly (:class:`FusedAdam`), and numbers are read back once per update.

The environment is a Gymnasium-style vector env with ``num_envs``, ``n_actions``,
``obs_dim``, ``obs_spec`` (``to_dict()``, ``spec_kind``), ``actions``, ``role_mask``,
``reset() -> (obs, info)`` and ``step(actions) -> (obs, reward, terminated, truncated,
info)`` with numpy arrays and same-step autoreset (:class:`sage_pipeline.sim.env.CodeTaskVecEnv`,
:class:`sage_pipeline.sim.loop_env.SageLoopVecEnv`). Episodes there end only at true
terminals, so a truncated step is treated like a terminal one (no bootstrap), as CleanRL does.

The actor is exported as numpy layers: :meth:`PPOResult.save` writes a checkpoint in the
common policy format (``kind="ppo"``, the environment's observation spec with its
``spec_kind``, ``head="greedy"`` by default or ``"softmax"`` for the stochastic policy
trained), which :func:`sage_pipeline.rl.checkpoint.load_policy` serves with numpy only.
``evaluate`` (optional) is called every ``eval_every`` updates with the current policy
(an :class:`MLPPolicy`, greedy and softmax) and returns numbers for the learning curve;
its time is excluded from the training time and from the env steps/s.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator
from threadpoolctl import threadpool_limits

from sage_pipeline.rl.checkpoint import HEADS, CheckpointMeta, Layers, MLPPolicy, save_checkpoint

Head = Literal[HEADS]  # what a checkpoint serves: "softmax" or "greedy"


class PPOConfig(BaseModel):
    """PPO's hyperparameters (CleanRL's names). Checked when made, never while training: the
    training loop only reads them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = Field(0, description="seed of the weights, the action sampling and the minibatches (the "
                      "environment is seeded by its caller)")
    total_timesteps: int = Field(200_000, ge=1, description="env steps over the whole run (calls and stops); at "
                                 "least one rollout, num_envs x num_steps")
    learning_rate: float = Field(2.5e-3, gt=0.0, allow_inf_nan=False, description="Adam learning rate, annealed "
                                 "linearly to 0 when anneal_lr")
    num_envs: int = Field(128, ge=1, description="episodes stepped together by the numpy vector environment")
    num_steps: int = Field(16, ge=1, description="steps per environment per rollout")
    anneal_lr: bool = Field(True, description="anneal the learning rate linearly to 0 over the run")
    gamma: float = Field(1.0, ge=0.0, le=1.0, description="discount in [0, 1]; 1: episodes are a few calls long, "
                         "no discounting")
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0, description="GAE's lambda, in [0, 1]")
    num_minibatches: int = Field(4, ge=1, description="minibatches per epoch; must divide num_envs x num_steps")
    update_epochs: int = Field(4, ge=1, description="epochs over each rollout")
    norm_adv: bool = Field(True, description="normalise the advantages per minibatch")
    clip_coef: float = Field(0.2, gt=0.0, allow_inf_nan=False, description="clip range of the surrogate's ratio "
                             "(and of the value when clip_vloss)")
    clip_vloss: bool = Field(True, description="clip the value loss as CleanRL does")
    ent_coef: float = Field(0.01, ge=0.0, allow_inf_nan=False, description="entropy bonus")
    vf_coef: float = Field(0.5, ge=0.0, allow_inf_nan=False, description="weight of the value loss")
    max_grad_norm: float = Field(0.5, gt=0.0, description="global gradient-norm clipping")
    target_kl: float | None = Field(None, gt=0.0, description="stop an update's epochs early when the approximate "
                                    "KL exceeds this; null: never")
    hidden: list[Annotated[int, Field(ge=1)]] = Field([64, 64], min_length=1, description="hidden layer widths of "
                                                      "the actor and the critic, ReLU MLPs (the checkpoint's numpy "
                                                      "forward is ReLU)")
    head: Head = Field("greedy", description="what the checkpoint serves: 'greedy' (argmax of the logits) or "
                       "'softmax' (sampled)")
    eval_every: int = Field(10, ge=0, description="updates between learning-curve evaluations (0: only after the "
                            "first and the last)")
    num_threads: int = Field(1, ge=0, description="torch and numpy-BLAS threads while training (restored "
                             "afterwards); 0: their defaults")
    log_every_s: float = Field(5.0, ge=0.0, description="progress at most this often")

    @model_validator(mode="after")
    def _whole_rollouts(self) -> PPOConfig:
        if self.batch_size % self.num_minibatches:
            raise ValueError(f"num_envs x num_steps ({self.num_envs} x {self.num_steps} = {self.batch_size}) must be "
                             f"divisible by num_minibatches ({self.num_minibatches})")
        if self.total_timesteps < self.batch_size:
            raise ValueError(f"total_timesteps ({self.total_timesteps}) is less than one rollout (num_envs x "
                             f"num_steps = {self.batch_size}): raise total_timesteps or lower num_envs / num_steps")
        return self

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


# ---------------------------------------------------------------------- the networks
class ActorCritic:
    """The actor and the critic: two ReLU MLPs of the same hidden widths, stored stacked so
    one pass evaluates both. ``w[k]`` (2, h_k-1, h_k) -- stored input-major, ``h @ w``, which
    makes the weight gradients' products faster -- and ``b[k]`` (2, h_k) for every hidden layer
    (index 0 the actor's, 1 the critic's; ``h_-1`` is the observation size); ``head_a``
    (n_actions, h_last) and ``head_c`` (1, h_last) the output layers. Orthogonal init as
    CleanRL's ``layer_init``, per layer of each network."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...], gen: torch.Generator) -> None:
        def ortho(rows: int, cols: int, gain: float) -> torch.Tensor:
            q, r = torch.linalg.qr(torch.randn(max(rows, cols), min(rows, cols), generator=gen))
            q = q * torch.sign(torch.diagonal(r))  # as nn.init.orthogonal_, from our generator
            return (q if rows >= cols else q.T).contiguous() * gain

        g, h = math.sqrt(2.0), tuple(int(x) for x in hidden)
        sizes = (obs_dim, *h)
        self.w = [torch.stack([ortho(b, a, g).T, ortho(b, a, g).T]).contiguous()
                  for a, b in zip(sizes[:-1], sizes[1:], strict=True)]
        self.b = [torch.zeros(2, b) for b in h]
        self.head_a, self.head_ab = ortho(n_actions, h[-1], 0.01), torch.zeros(n_actions)
        self.head_c, self.head_cb = ortho(1, h[-1], 1.0), torch.zeros(1)

    @property
    def params(self) -> list[torch.Tensor]:
        return [*self.w, *self.b, self.head_a, self.head_ab, self.head_c, self.head_cb]

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """(logits (B, A), value (B,), hidden activations per layer, each (2, B, h))."""
        h, hs = x.expand(2, *x.shape), []
        for w, b in zip(self.w, self.b, strict=True):
            h = torch.baddbmm(b[:, None, :], h, w).relu_()
            hs.append(h)
        logits = torch.addmm(self.head_ab, h[0], self.head_a.T)
        value = torch.addmm(self.head_cb, h[1], self.head_c.T)[:, 0]
        return logits, value, hs

    def backward(self, x: torch.Tensor, hs: list[torch.Tensor], d_logits: torch.Tensor,
                 d_value: torch.Tensor) -> list[torch.Tensor]:
        """Gradients of every parameter (``params`` order) given the loss's gradient with respect
        to the logits and the value: back-propagation through the ReLU layers (the ReLU's
        backward is aten's ``threshold_backward``, the kernel autograd runs for it)."""
        last = hs[-1]
        g_head_a, g_head_ab = d_logits.T @ last[0], d_logits.sum(0)
        g_head_c, g_head_cb = d_value[None, :] @ last[1], d_value.sum(0, keepdim=True)
        dh = torch.stack([d_logits @ self.head_a, d_value[:, None] * self.head_c])  # (2, B, h_last)
        gw, gb = [None] * len(self.w), [None] * len(self.b)
        for k in range(len(self.w) - 1, -1, -1):
            dz = torch.ops.aten.threshold_backward(dh, hs[k], 0.0)
            below = hs[k - 1] if k else x.expand(2, *x.shape)
            gw[k], gb[k] = torch.bmm(below.transpose(1, 2), dz), dz.sum(1)
            if k:
                dh = torch.bmm(dz, self.w[k].transpose(1, 2))
        return [*gw, *gb, g_head_a, g_head_ab, g_head_c, g_head_cb]

    def actor_layers(self) -> Layers:
        """The actor as numpy (weight (out, in), bias) layers: what a checkpoint serves."""
        as_np = lambda t: t.detach().cpu().numpy().astype(np.float32).copy()  # noqa: E731
        layers = [(as_np(w[0].T), as_np(b[0])) for w, b in zip(self.w, self.b, strict=True)]
        return [*layers, (as_np(self.head_a), as_np(self.head_ab))]


def log_softmax(z: torch.Tensor) -> torch.Tensor:
    """``torch.log_softmax(z, dim=-1)``, written out: on a few actions per row the fused kernel
    is slower than these four element-wise steps (the same numbers to float precision)."""
    z = z - z.amax(dim=-1, keepdim=True)
    return z - z.exp().sum(dim=-1, keepdim=True).log()


def ppo_grads(ac: ActorCritic, x: torch.Tensor, actions: torch.Tensor, old_logp: torch.Tensor,
              adv: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor, args: PPOConfig,
              terms: bool = True) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """The PPO loss's gradient on one minibatch, in closed form, and (``terms``) the loss's
    terms as tensors; the clipped fraction always.

    With ``r = exp(logp(a) - old_logp)`` and ``A`` the (normalised) advantage, the loss is
    ``mean(max(-A r, -A clip(r, 1 +- c))) - ent_coef mean(H) + vf_coef * 0.5 mean(max((v - R)^2,
    (V + clip(v - V, +-c) - R)^2))``. Its derivative: ``-A r [-A r >= -A clip(r)] / B`` with
    respect to ``logp(a)``, which is ``onehot(a) - softmax`` with respect to the logits; the
    entropy's ``-p (log p + H)``; the value loss's ``(v - R)`` where the unclipped term is the
    larger, else ``(V + clip(v - V) - R) [|v - V| <= c]`` (ties split as torch's ``max``)."""
    B, c = x.shape[0], args.clip_coef
    logits, value, hs = ac.forward(x)
    logp_all = log_softmax(logits)
    p = logp_all.exp()
    logratio = logp_all.gather(1, actions[:, None])[:, 0] - old_logp
    ratio = logratio.exp()
    if args.norm_adv:
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    pg1, pg2 = -adv * ratio, -adv * ratio.clamp(1 - c, 1 + c)
    entropy = -(p * logp_all).sum(1)
    # d loss / d logits: the surrogate's (through logp(a)), then the entropy bonus's
    d_logp = torch.where(pg1 >= pg2, pg1, 0.0) / B
    d_logits = p * ((args.ent_coef / B) * (logp_all + entropy[:, None]) - d_logp[:, None])
    d_logits.scatter_add_(1, actions[:, None], d_logp[:, None])
    diff = value - returns
    if args.clip_vloss:
        v_clip = old_values + (value - old_values).clamp(-c, c)
        unclipped, clipped_sq = diff * diff, (v_clip - returns) ** 2
        d_value = torch.where(unclipped >= clipped_sq, diff, (v_clip - returns) * ((value - old_values).abs() <= c))
    else:
        d_value = diff
    out = {"clipfrac": ((ratio - 1.0).abs() > c).float().mean()}
    if terms:
        v_loss = 0.5 * (torch.maximum(unclipped, clipped_sq) if args.clip_vloss else diff * diff).mean()
        out |= {"policy_loss": torch.maximum(pg1, pg2).mean(), "value_loss": v_loss, "entropy": entropy.mean(),
                "approx_kl": ((ratio - 1) - logratio).mean()}
    return ac.backward(x, hs, d_logits, d_value * (args.vf_coef / B)), out


class FusedAdam:
    """Adam exactly as ``torch.optim.Adam(params, lr, eps=eps, fused=True)`` steps it: the same
    kernel (aten's ``_fused_adam_``) and step counters, without the optimizer wrapper's per-step
    Python (tested equal, update by update)."""

    def __init__(self, params: list[torch.Tensor], lr: float, eps: float, betas=(0.9, 0.999)) -> None:
        self.params, self.lr, self.eps, self.betas = params, lr, eps, betas
        self.exp_avg = [torch.zeros_like(p) for p in params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in params]
        self.steps = [torch.zeros((), dtype=torch.float32) for _ in params]

    def step(self, grads: list[torch.Tensor]) -> None:
        torch._foreach_add_(self.steps, 1)
        torch._fused_adam_(self.params, grads, self.exp_avg, self.exp_avg_sq, [], self.steps, lr=self.lr,
                           beta1=self.betas[0], beta2=self.betas[1], weight_decay=0.0, eps=self.eps,
                           amsgrad=False, maximize=False)


def clip_grad_norm(grads: list[torch.Tensor], max_norm: float) -> None:
    """Scale ``grads`` in place to a global L2 norm of at most ``max_norm``: the computation of
    ``nn.utils.clip_grad_norm_(foreach=True)``, on gradient tensors."""
    total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
    torch._foreach_mul_(grads, (max_norm / (total + 1e-6)).clamp(max=1.0))


# ---------------------------------------------------------------------- the result
@dataclass(frozen=True)
class PPOResult:
    nets: list[Layers]  # the actor, as numpy layers
    config: PPOConfig
    obs_spec: dict
    spec_kind: str
    actions: tuple[str, ...]
    role_mask: np.ndarray
    metrics: dict
    curve: list[dict] = field(default_factory=list)  # one row per evaluation

    def meta(self, head: str | None = None, training_data_sha256: str | None = None,
             metrics: dict | None = None) -> CheckpointMeta:
        """Checkpoint metadata; ``metrics`` add to the training ones (as BC's and CQL's do)."""
        return CheckpointMeta(kind="ppo", spec_kind=self.spec_kind, feature_spec=self.obs_spec,
                              actions=list(self.actions), role_mask=self.role_mask.tolist(),
                              head=head or self.config.head, metrics={**self.metrics, **(metrics or {})},
                              config=self.config.model_dump(), training_data_sha256=training_data_sha256)

    def policy(self, head: str | None = None) -> MLPPolicy:
        """The policy exactly as a saved checkpoint serves it (numpy)."""
        return MLPPolicy(self.meta(head), self.nets, name=f"ppo_{head or self.config.head}")

    def save(self, path: str | Path, training_data_sha256: str | None = None, metrics: dict | None = None) -> Path:
        """Write the checkpoint folder atomically (:func:`~sage_pipeline.rl.checkpoint.save_checkpoint`);
        ``metrics`` add to the training metrics."""
        return save_checkpoint(path, self.meta(None, training_data_sha256, metrics), self.nets)


# ---------------------------------------------------------------------- training
def train_ppo(envs, config: PPOConfig = PPOConfig(),
              evaluate: Callable[[MLPPolicy, MLPPolicy], dict] | None = None,
              log: Callable[[str], None] | None = None) -> PPOResult:
    args = config
    prev_threads = torch.get_num_threads()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    # numpy's BLAS too (the evaluations serve the policy with numpy): on a busy 2-core host
    # a multi-threaded OpenBLAS made the small matmuls of the numpy forward ~5x slower
    blas = threadpool_limits(limits=args.num_threads, user_api="blas") if args.num_threads else None
    try:
        torch.manual_seed(args.seed)
        gen = torch.Generator().manual_seed(args.seed)
        n, S, A, D = args.num_envs, args.num_steps, envs.n_actions, envs.obs_dim
        if envs.num_envs != n:
            raise ValueError(f"the environment runs {envs.num_envs} episodes at once, config.num_envs is {n}")
        ac = ActorCritic(D, A, tuple(args.hidden), gen)
        params = ac.params
        optimizer = FusedAdam(params, lr=args.learning_rate, eps=1e-5)
        obs, logits = torch.zeros((S, n, D)), torch.zeros((S, n, A))
        actions, values = torch.zeros((S, n), dtype=torch.long), torch.zeros((S + 1, n))
        rewards, dones = np.zeros((S, n), dtype=np.float32), np.zeros((S + 1, n), dtype=np.float32)

        def snapshot(head: str) -> MLPPolicy:
            res = PPOResult([ac.actor_layers()], args, envs.obs_spec.to_dict(), envs.obs_spec.spec_kind,
                            tuple(envs.actions), np.asarray(envs.role_mask), {})
            return res.policy(head)

        curve: list[dict] = []
        train_s, train_cpu, eval_s, global_step, ep_returns = 0.0, 0.0, 0.0, 0, []
        last_log = time.perf_counter()
        next_obs = torch.from_numpy(envs.reset()[0])
        next_done = np.zeros(n, dtype=np.float32)
        stats, terms = {}, {}
        for update in range(1, args.num_updates + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            if args.anneal_lr:
                optimizer.lr = (1.0 - (update - 1.0) / args.num_updates) * args.learning_rate

            # ---- rollout (plain tensors: no autograd, no distribution objects; Gumbel-max sampling)
            gumbel = -torch.log(-torch.log(torch.rand((S, n, A), generator=gen).clamp_min(1e-20)))
            for step in range(S):
                global_step += n
                obs[step], dones[step] = next_obs, next_done
                logits[step], values[step], _ = ac.forward(next_obs)
                action = torch.argmax(logits[step] + gumbel[step], dim=1)
                actions[step] = action
                o, rewards[step], term, trunc, info = envs.step(action.numpy())
                next_obs = torch.from_numpy(o)
                next_done = (term | trunc).astype(np.float32)
                finished = info.get("episode_return")
                if finished is not None:
                    ep_returns.extend(finished[~np.isnan(finished)].tolist())
            dones[S] = next_done
            values[S] = ac.forward(next_obs)[1]
            logprobs = log_softmax(logits).gather(2, actions[..., None])[..., 0]

            # ---- GAE (numpy: the rewards and dones are numpy already)
            v = values.numpy()
            advantages = np.zeros((S, n), dtype=np.float32)
            lastgaelam = np.zeros(n, dtype=np.float32)
            for t in reversed(range(S)):
                nextnonterminal = 1.0 - dones[t + 1]
                delta = rewards[t] + args.gamma * v[t + 1] * nextnonterminal - v[t]
                lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                advantages[t] = lastgaelam
            advantages = torch.from_numpy(advantages)
            returns = advantages + values[:S]

            # ---- optimise the policy and value network (closed-form gradients, fused Adam)
            batch = (obs.reshape(-1, D), actions.reshape(-1), logprobs.reshape(-1), advantages.reshape(-1),
                     returns.reshape(-1), values[:S].reshape(-1))
            clipfracs, n_mb = [], args.batch_size // args.minibatch_size
            for epoch in range(args.update_epochs):
                b_inds = torch.randperm(args.batch_size, generator=gen)
                shuffled = [t[b_inds] for t in batch]  # one gather per epoch; minibatches are slices
                for i, start in enumerate(range(0, args.batch_size, args.minibatch_size)):
                    final = i == n_mb - 1 and (epoch == args.update_epochs - 1 or args.target_kl is not None)
                    grads, out = ppo_grads(ac, *(t[start:start + args.minibatch_size] for t in shuffled), args,
                                           terms=final)
                    clip_grad_norm(grads, args.max_grad_norm)
                    optimizer.step(grads)
                    clipfracs.append(out["clipfrac"])
                    terms = out if final else terms
                if args.target_kl is not None and terms["approx_kl"].item() > args.target_kl:
                    break
            y_pred, y_true = batch[5].numpy(), batch[4].numpy()
            var_y = np.var(y_true)
            last = {k: float(v) for k, v in terms.items()}
            stats = {"update": update, "env_steps": global_step, "lr": optimizer.lr,
                     "policy_loss": last["policy_loss"], "value_loss": last["value_loss"],
                     "entropy": last["entropy"], "approx_kl": last["approx_kl"],
                     "clipfrac": float(torch.stack(clipfracs).mean()),
                     "explained_variance": float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y),
                     "episode_return": float(np.mean(ep_returns[-2000:])) if ep_returns else float("nan")}
            train_s += time.perf_counter() - t0
            train_cpu += time.process_time() - c0

            # ---- learning curve (not timed) and progress
            last_update = update == args.num_updates
            if evaluate is not None and (last_update or update == 1
                                         or (args.eval_every and update % args.eval_every == 0)):
                t1 = time.perf_counter()
                curve.append(stats | {"train_seconds": train_s, "train_cpu_seconds": train_cpu}
                             | evaluate(snapshot("greedy"), snapshot("softmax")))
                eval_s += time.perf_counter() - t1
            if log and (last_update or time.perf_counter() - last_log >= args.log_every_s):
                last_log = time.perf_counter()
                extra = {k: v for k, v in (curve[-1] if curve else {}).items()
                         if k not in stats and not k.startswith("train_")}
                log(f"ppo update {update}/{args.num_updates}: {global_step:,} env steps in {train_s:.1f}s "
                    f"({global_step / max(train_s, 1e-9):,.0f} steps/s), training episode return "
                    f"{stats['episode_return']:.3f}, entropy {stats['entropy']:.3f}"
                    + "".join(f", {k} {v:.3f}" for k, v in extra.items() if isinstance(v, float)))
        metrics = {"env_steps": global_step, "updates": args.num_updates, "train_seconds": train_s,
                   "train_cpu_seconds": train_cpu,
                   "eval_seconds": eval_s, "env_steps_per_s": global_step / max(train_s, 1e-9),
                   "episodes": len(ep_returns)} | {f"final_{k}": v for k, v in stats.items()
                                                   if k not in ("update", "env_steps")}
        metrics = {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in metrics.items()}
        return PPOResult([ac.actor_layers()], args, envs.obs_spec.to_dict(), envs.obs_spec.spec_kind,
                         tuple(envs.actions), np.asarray(envs.role_mask), metrics, curve)
    finally:
        torch.set_num_threads(prev_threads)
        if blas is not None:
            blas.restore_original_limits()
