"""Proximal policy optimisation (PPO, Schulman et al. 2017) on a numpy batch of episodes.

One file in the CleanRL manner (``ppo.py`` of vwxyzjn/cleanrl): the hyperparameters in
:class:`PPOConfig`, the whole update loop in :func:`train_ppo`. What it does, as CleanRL:
separate actor and critic MLPs with orthogonal init (hidden gain sqrt(2), actor head
0.01, critic head 1); rollouts of ``num_steps`` steps on ``num_envs`` environments;
generalised advantage estimation (GAE); ``update_epochs`` epochs of shuffled minibatches
with per-minibatch advantage normalisation, the clipped surrogate objective, the clipped
value loss, an entropy bonus and global gradient-norm clipping; linear learning-rate
annealing; optional early stop on approximate KL. Actions are sampled with the Gumbel-max
trick from a seeded torch generator; the environment is seeded by its caller, so a run is
reproducible given both seeds (single torch thread).

The environment is anything with ``num_envs``, ``n_actions``, ``obs_dim``, ``obs_spec``
(``to_dict()``, ``spec_kind``), ``actions``, ``role_mask``, ``reset() -> obs`` and
``step(actions) -> (obs, reward, terminated, truncated, info)`` with numpy arrays and
same-step auto-reset (:class:`sage_pipeline.sim.env.CodeTaskVecEnv`). Episodes here end
only at true terminals, so a truncated step is treated like a terminal one (no
bootstrap), as CleanRL does.

The actor is exported as numpy layers: :meth:`PPOResult.save` writes a checkpoint in the
common policy format (``kind="ppo"``, the environment's observation spec with its
``spec_kind``, ``head="greedy"`` by default or ``"softmax"`` for the stochastic policy
trained), which :func:`sage_pipeline.rl.checkpoint.load_policy` serves with numpy only.
``evaluate`` (optional) is called every ``eval_every`` updates with the current policy
(an :class:`MLPPolicy`, greedy and softmax) and returns numbers for the learning curve;
its time is excluded from the training time and from the env steps/s.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits
from torch import nn

from sage_pipeline.rl.checkpoint import HEADS, CheckpointMeta, Layers, MLPPolicy, save_checkpoint


@dataclass(frozen=True)
class PPOConfig:
    seed: int = 0
    total_timesteps: int = 200_000  # env steps (attempts) over the whole run
    learning_rate: float = 2.5e-3  # Adam, annealed linearly to 0 when anneal_lr
    num_envs: int = 128
    num_steps: int = 16  # steps per environment per rollout
    anneal_lr: bool = True
    gamma: float = 1.0  # episodes are at most max_attempts long: no discounting
    gae_lambda: float = 0.95
    num_minibatches: int = 4
    update_epochs: int = 4
    norm_adv: bool = True
    clip_coef: float = 0.2
    clip_vloss: bool = True
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    target_kl: float | None = None
    hidden: tuple[int, ...] = (64, 64)  # ReLU MLPs (the checkpoint's numpy forward is ReLU)
    head: str = "greedy"  # what the checkpoint serves: "greedy" (argmax of the logits) or "softmax"
    eval_every: int = 10  # updates between learning-curve evaluations (0: only after the first and last)
    num_threads: int = 1  # torch and numpy-BLAS threads while training (restored afterwards); 0: defaults
    log_every_s: float = 5.0

    def __post_init__(self) -> None:
        if self.num_envs < 1 or self.num_steps < 1 or self.num_minibatches < 1 or self.update_epochs < 1:
            raise ValueError("num_envs, num_steps, num_minibatches and update_epochs must be >= 1")
        if self.batch_size % self.num_minibatches:
            raise ValueError(f"num_envs * num_steps ({self.batch_size}) must be divisible by num_minibatches "
                             f"({self.num_minibatches})")
        if self.total_timesteps < self.batch_size:
            raise ValueError(f"total_timesteps ({self.total_timesteps}) is less than one rollout "
                             f"(num_envs * num_steps = {self.batch_size})")
        if self.head not in HEADS:
            raise ValueError(f"head must be one of {HEADS}, got {self.head!r}")
        if not self.hidden or any(int(h) < 1 for h in self.hidden):
            raise ValueError(f"hidden must be one or more positive layer widths, got {self.hidden!r}")
        if not (self.learning_rate > 0 and 0 <= self.gamma <= 1 and 0 <= self.gae_lambda <= 1):
            raise ValueError("learning_rate must be > 0 and gamma, gae_lambda in [0, 1]")

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


def layer_init(layer: nn.Linear, std: float = math.sqrt(2), bias_const: float = 0.0) -> nn.Linear:
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias_const)
    return layer


def mlp(in_dim: int, hidden: tuple[int, ...], out_dim: int, out_std: float) -> nn.Sequential:
    dims, layers = (in_dim, *hidden), []
    for a, b in itertools.pairwise(dims):
        layers += [layer_init(nn.Linear(a, b)), nn.ReLU()]
    return nn.Sequential(*layers, layer_init(nn.Linear(dims[-1], out_dim), std=out_std))


class Agent(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...]) -> None:
        super().__init__()
        self.critic = mlp(obs_dim, hidden, 1, out_std=1.0)
        self.actor = mlp(obs_dim, hidden, n_actions, out_std=0.01)

    def get_value(self, x: torch.Tensor) -> torch.Tensor:
        return self.critic(x).squeeze(-1)

    def evaluate(self, x: torch.Tensor, action: torch.Tensor):
        """log-prob of ``action``, entropy and value: what the update needs."""
        logp_all = torch.log_softmax(self.actor(x), dim=-1)
        logp = logp_all.gather(1, action[:, None]).squeeze(1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        return logp, entropy, self.get_value(x)


def export_layers(net: nn.Sequential) -> Layers:
    as_np = lambda t: t.detach().cpu().numpy().astype(np.float32).copy()
    return [(as_np(m.weight), as_np(m.bias)) for m in net if isinstance(m, nn.Linear)]


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
        return CheckpointMeta(kind="ppo", spec_kind=self.spec_kind, feature_spec=self.obs_spec,
                              actions=list(self.actions), role_mask=self.role_mask.tolist(),
                              head=head or self.config.head, metrics=metrics if metrics is not None else self.metrics,
                              config=asdict(self.config), training_data_sha256=training_data_sha256)

    def policy(self, head: str | None = None) -> MLPPolicy:
        """The policy exactly as a saved checkpoint serves it (numpy)."""
        return MLPPolicy(self.meta(head), self.nets, name=f"ppo_{head or self.config.head}")

    def save(self, path: str | Path, training_data_sha256: str | None = None, metrics: dict | None = None) -> Path:
        return save_checkpoint(path, self.meta(None, training_data_sha256, metrics), self.nets)


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
        agent = Agent(envs.obs_dim, envs.n_actions, tuple(args.hidden))
        params = list(agent.parameters())
        optimizer = torch.optim.Adam(params, lr=args.learning_rate, eps=1e-5, fused=True)
        n, S, A = args.num_envs, args.num_steps, envs.n_actions
        if envs.num_envs != n:
            raise ValueError(f"the environment runs {envs.num_envs} episodes at once, config.num_envs is {n}")
        obs = torch.zeros((S, n, envs.obs_dim))
        actions = torch.zeros((S, n), dtype=torch.long)
        logprobs, rewards, dones, values = (torch.zeros((S, n)) for _ in range(4))

        def snapshot(head: str) -> MLPPolicy:
            res = PPOResult([export_layers(agent.actor)], args, envs.obs_spec.to_dict(), envs.obs_spec.spec_kind,
                            tuple(envs.actions), np.asarray(envs.role_mask), {})
            return res.policy(head)

        curve: list[dict] = []
        train_s, train_cpu, eval_s, global_step, ep_returns = 0.0, 0.0, 0.0, 0, []
        last_log = time.perf_counter()
        next_obs = torch.from_numpy(envs.reset())
        next_done = torch.zeros(n)
        stats: dict = {}
        for update in range(1, args.num_updates + 1):
            t0, c0 = time.perf_counter(), time.process_time()
            if args.anneal_lr:
                optimizer.param_groups[0]["lr"] = (1.0 - (update - 1.0) / args.num_updates) * args.learning_rate

            # ---- rollout
            for step in range(S):
                global_step += n
                obs[step], dones[step] = next_obs, next_done
                with torch.no_grad():
                    logits = agent.actor(next_obs)
                    values[step] = agent.get_value(next_obs)
                    gumbel = -torch.log(-torch.log(torch.rand((n, A), generator=gen).clamp_min(1e-20)))
                    action = (logits + gumbel).argmax(dim=1)
                    logprobs[step] = torch.log_softmax(logits, dim=1).gather(1, action[:, None]).squeeze(1)
                actions[step] = action
                o, r, term, trunc, info = envs.step(action.numpy())
                rewards[step] = torch.from_numpy(np.asarray(r, dtype=np.float32))
                next_obs = torch.from_numpy(o)
                next_done = torch.from_numpy((term | trunc).astype(np.float32))
                finished = info.get("episode_return")
                if finished is not None:
                    ep_returns.extend(finished[~np.isnan(finished)].tolist())

            # ---- GAE
            with torch.no_grad():
                next_value = agent.get_value(next_obs)
                advantages = torch.zeros_like(rewards)
                lastgaelam = torch.zeros(n)
                for t in reversed(range(S)):
                    if t == S - 1:
                        nextnonterminal, nextvalues = 1.0 - next_done, next_value
                    else:
                        nextnonterminal, nextvalues = 1.0 - dones[t + 1], values[t + 1]
                    delta = rewards[t] + args.gamma * nextvalues * nextnonterminal - values[t]
                    lastgaelam = delta + args.gamma * args.gae_lambda * nextnonterminal * lastgaelam
                    advantages[t] = lastgaelam
                returns = advantages + values

            # ---- optimise the policy and value network
            b_obs, b_actions = obs.reshape(-1, envs.obs_dim), actions.reshape(-1)
            b_logprobs, b_advantages = logprobs.reshape(-1), advantages.reshape(-1)
            b_returns, b_values = returns.reshape(-1), values.reshape(-1)
            clipfracs = []
            for _epoch in range(args.update_epochs):
                b_inds = torch.randperm(args.batch_size, generator=gen)
                for start in range(0, args.batch_size, args.minibatch_size):
                    mb = b_inds[start:start + args.minibatch_size]
                    newlogprob, entropy, newvalue = agent.evaluate(b_obs[mb], b_actions[mb])
                    logratio = newlogprob - b_logprobs[mb]
                    ratio = logratio.exp()
                    with torch.no_grad():
                        approx_kl = ((ratio - 1) - logratio).mean()
                        clipfracs.append(((ratio - 1.0).abs() > args.clip_coef).float().mean().item())
                    mb_adv = b_advantages[mb]
                    if args.norm_adv:
                        mb_adv = (mb_adv - mb_adv.mean()) / (mb_adv.std() + 1e-8)
                    pg_loss = torch.max(-mb_adv * ratio,
                                        -mb_adv * torch.clamp(ratio, 1 - args.clip_coef, 1 + args.clip_coef)).mean()
                    if args.clip_vloss:
                        v_unclipped = (newvalue - b_returns[mb]) ** 2
                        v_clipped = b_values[mb] + torch.clamp(newvalue - b_values[mb], -args.clip_coef, args.clip_coef)
                        v_loss = 0.5 * torch.max(v_unclipped, (v_clipped - b_returns[mb]) ** 2).mean()
                    else:
                        v_loss = 0.5 * ((newvalue - b_returns[mb]) ** 2).mean()
                    entropy_loss = entropy.mean()
                    loss = pg_loss - args.ent_coef * entropy_loss + v_loss * args.vf_coef
                    optimizer.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(params, args.max_grad_norm)
                    optimizer.step()
                if args.target_kl is not None and approx_kl > args.target_kl:
                    break
            y_pred, y_true = b_values.numpy(), b_returns.numpy()
            var_y = np.var(y_true)
            stats = {"update": update, "env_steps": global_step, "lr": optimizer.param_groups[0]["lr"],
                     "policy_loss": pg_loss.item(), "value_loss": v_loss.item(), "entropy": entropy_loss.item(),
                     "approx_kl": approx_kl.item(), "clipfrac": float(np.mean(clipfracs)),
                     "explained_variance": float("nan") if var_y == 0 else float(1 - np.var(y_true - y_pred) / var_y),
                     "episode_return": float(np.mean(ep_returns[-2000:])) if ep_returns else float("nan")}
            train_s += time.perf_counter() - t0
            train_cpu += time.process_time() - c0

            # ---- learning curve (not timed) and progress
            last = update == args.num_updates
            if evaluate is not None and (last or update == 1 or (args.eval_every and update % args.eval_every == 0)):
                t1 = time.perf_counter()
                curve.append(stats | {"train_seconds": train_s, "train_cpu_seconds": train_cpu}
                             | evaluate(snapshot("greedy"), snapshot("softmax")))
                eval_s += time.perf_counter() - t1
            if log and (last or time.perf_counter() - last_log >= args.log_every_s):
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
        return PPOResult([export_layers(agent.actor)], args, envs.obs_spec.to_dict(), envs.obs_spec.spec_kind,
                         tuple(envs.actions), np.asarray(envs.role_mask), metrics, curve)
    finally:
        torch.set_num_threads(prev_threads)
        if blas is not None:
            blas.restore_original_limits()
