"""Our PPO vs Stable-Baselines3's PPO on the same code-task environment, same budget.

Both learners get the same environment (our numpy batch of episodes; SB3 through a thin
``VecEnv`` adapter, so neither pays for a slower environment), the same env-step budget,
the same hyperparameters (rollout length, minibatch size, epochs, learning rate and its
linear annealing, gamma, GAE lambda, clip ranges for the policy and the value, entropy
and value coefficients, gradient clipping, Adam eps, ReLU 64x64 actor and critic with
orthogonal init) and one torch thread each. Every few updates the greedy policy of each
is valued exactly on the held-out tasks by the simulator's ground truth (that time is
not counted). The target is SB3's final held-out value, less a tolerance (default 1% of
the oracle-static gap: "matches" means within 0.01 of regret closure; late in training
both learners' greedy policies move by about that much from one update to the next).
Reported per seed, in wall-clock
and in process CPU seconds (the machine is shared; CPU time is less disturbed by other
processes): both learners' total training time and their time to first reach the target,
and three ratios:

* goal ratio = SB3's total training time / our time to the target (the issue's goal:
  ">= 2x": our PPO matches SB3's final value at least twice as fast);
* same-target ratio = SB3's own time to the target / ours (both stop at the first
  learning-curve point at or above the target: the like-for-like speed-up);
* same-budget ratio = SB3's total / our total (cost per env step).

Then our PPO with default settings over 5 seeds: regret closure on held-out tasks (goal
>= 0.9 on every seed).

Data: ``<data-dir>/sim/tasks.jsonl`` and the ``sandbox_rollouts`` shards when they exist
(materialize ``sim_tasks`` and ``sandbox_rollouts`` first), else (or with ``--synthetic``)
the tests' synthetic suite, whose tasks are harder (said in the output).

    .venv/bin/python benchmarks/ppo_vs_sb3.py [--data-dir datasets] [--synthetic] [--seeds 3]
        [--closure-seeds 5] [--timesteps N] [--eval-every 2] [--match-tolerance 0.01]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sage_pipeline.rl.ppo import PPOConfig, train_ppo
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.table import RoutingTable
from sage_pipeline.sim.env import CodeTaskSim, CodeTaskVecEnv
from sage_pipeline.sim.ground_truth import GroundTruth, regret_closure
from sage_pipeline.sim.rollouts import read_rollouts
from sage_pipeline.sim.schema import read_tasks

SCRATCH = ROOT / "benchmarks" / ".scratch"


def load_sim(data_dir: Path) -> tuple[CodeTaskSim, str]:
    cat = ModelCatalogue.load()
    table = RoutingTable.load()
    tasks_file, shards = data_dir / "sim" / "tasks.jsonl", data_dir / "sim" / "rollouts"
    if tasks_file.is_file() and shards.is_dir() and any(shards.glob("shard-*.parquet")):
        return CodeTaskSim.build(read_tasks(tasks_file), read_rollouts(shards), cat, table), f"{tasks_file} + {shards}"
    from sage_pipeline_tests.sim.synthetic import synthetic_suite
    tasks, df = synthetic_suite(1200, seed=0)
    return CodeTaskSim.build(tasks, df, cat, table), "synthetic suite (1,200 tasks; sim_tasks not materialized)"


# ----------------------------------------------------------- SB3 adapters
def sb3_vecenv(env: CodeTaskVecEnv):
    import gymnasium as gym
    from stable_baselines3.common.vec_env import VecEnv

    class NumpyVecEnv(VecEnv):
        def __init__(self) -> None:
            super().__init__(env.num_envs, gym.spaces.Box(0.0, 1.0, (env.obs_dim,), np.float32),
                             gym.spaces.Discrete(env.n_actions))

        def reset(self):
            return env.reset()

        def step_async(self, actions):
            self._actions = np.asarray(actions, dtype=np.int64)

        def step_wait(self):
            obs, r, term, trunc, _ = env.step(self._actions)
            # episodes end at true terminals only: SB3 needs no terminal_observation
            return obs, r.astype(np.float32), term | trunc, [{} for _ in range(env.num_envs)]

        def close(self):
            pass

        def get_attr(self, attr_name, indices=None):
            return [getattr(env, attr_name)] * env.num_envs

        def set_attr(self, attr_name, value, indices=None):
            setattr(env, attr_name, value)

        def env_method(self, method_name, *args, indices=None, **kwargs):
            return [getattr(env, method_name)(*args, **kwargs)] * env.num_envs

        def env_is_wrapped(self, wrapper_class, indices=None):
            return [False] * env.num_envs

    return NumpyVecEnv()


class SB3Policy:
    """SB3's actor as a policy of the contract (greedy or softmax over its logits)."""

    def __init__(self, model, sim: CodeTaskSim, greedy: bool = True) -> None:
        self.model, self.sim, self.greedy = model, sim, greedy
        self.actions, self.role_mask, self.name = sim.actions, sim.role_mask, "sb3_ppo"

    @torch.no_grad()
    def action_probs(self, obs) -> np.ndarray:
        x = torch.as_tensor(self.sim.obs_spec.encode(obs))
        probs = self.model.policy.get_distribution(x).distribution.probs.double().numpy()
        if not self.greedy:
            return probs
        out = np.zeros_like(probs)
        out[np.arange(len(probs)), probs.argmax(1)] = 1.0
        return out


def run_sb3(sim, train_idx, cfg: PPOConfig, value_of) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    class Curve(BaseCallback):
        """Exact held-out value every eval_every updates; its time is not counted."""

        def __init__(self):
            super().__init__()
            self.rows, self.eval_s, self.eval_cpu, self.updates = [], 0.0, 0.0, 0

        def _on_training_start(self):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def _on_rollout_start(self):  # i.e. after the previous update
            if self.updates == 1 or (self.updates and self.updates % cfg.eval_every == 0):  # as train_ppo
                self.evaluate()

        def _on_rollout_end(self):
            self.updates += 1

        def evaluate(self):
            t, c = time.perf_counter(), time.process_time()
            self.rows.append({"env_steps": self.num_timesteps, "train_seconds": t - self.t0 - self.eval_s,
                              "train_cpu_seconds": c - self.c0 - self.eval_cpu,
                              "value": value_of(SB3Policy(self.model, sim))})
            self.eval_s += time.perf_counter() - t
            self.eval_cpu += time.process_time() - c

        def _on_step(self):
            return True

    env = CodeTaskVecEnv(sim, train_idx, n_envs=cfg.num_envs, seed=cfg.seed)
    torch.set_num_threads(1)
    lr0 = cfg.learning_rate
    model = PPO("MlpPolicy", sb3_vecenv(env), learning_rate=lambda progress: progress * lr0, n_steps=cfg.num_steps,
                batch_size=cfg.minibatch_size, n_epochs=cfg.update_epochs, gamma=cfg.gamma,
                gae_lambda=cfg.gae_lambda, clip_range=cfg.clip_coef, clip_range_vf=cfg.clip_coef,
                normalize_advantage=cfg.norm_adv, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef,
                max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, device="cpu", verbose=0,
                policy_kwargs={"net_arch": {"pi": list(cfg.hidden), "vf": list(cfg.hidden)},
                               "activation_fn": torch.nn.ReLU, "ortho_init": True})
    cb = Curve()
    model.learn(total_timesteps=cfg.num_updates * cfg.batch_size, callback=cb)
    cb.evaluate()  # the final policy
    last = cb.rows[-1]
    return {"train_seconds": last["train_seconds"], "train_cpu_seconds": last["train_cpu_seconds"],
            "final_value": last["value"], "curve": cb.rows, "env_steps": model.num_timesteps}


def run_ours(sim, train_idx, cfg: PPOConfig, value_of) -> dict:
    env = CodeTaskVecEnv(sim, train_idx, n_envs=cfg.num_envs, seed=cfg.seed)
    res = train_ppo(env, cfg, evaluate=lambda greedy, soft: {"value": value_of(greedy)})
    curve = [{k: r[k] for k in ("env_steps", "train_seconds", "train_cpu_seconds", "value")} for r in res.curve]
    return {"train_seconds": res.metrics["train_seconds"], "train_cpu_seconds": res.metrics["train_cpu_seconds"],
            "final_value": curve[-1]["value"], "curve": curve, "env_steps": res.metrics["env_steps"],
            "env_steps_per_s": res.metrics["env_steps_per_s"]}


def time_to_reach(curve: list[dict], target: float, clock: str = "train_seconds") -> float | None:
    """Training time at the first learning-curve point whose value is at least ``target``."""
    for row in curve:
        if row["value"] >= target - 1e-12:
            return row[clock]
    return None


def ratio(a: float | None, b: float | None) -> float:
    """a / b; 0 when b never happened (our PPO never reached the target: the goal failed)."""
    if b is None:
        return 0.0
    return a / b if a else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the SB3 comparison")
    ap.add_argument("--closure-seeds", type=int, default=5, help="seeds of the default-settings closure check")
    ap.add_argument("--timesteps", type=int, default=PPOConfig().total_timesteps)
    ap.add_argument("--eval-every", type=int, default=2, help="updates between learning-curve points")
    ap.add_argument("--data-dir", default=os.environ.get("SAGE_DATA_DIR", str(ROOT / "datasets")))
    ap.add_argument("--synthetic", action="store_true", help="use the tests' synthetic suite (harder tasks)")
    ap.add_argument("--match-tolerance", type=float, default=0.01,
                    help="'matches' = within this share of the oracle-static gap of the target value")
    args = ap.parse_args()

    sim, source = load_sim(Path("/nonexistent") if args.synthetic else Path(args.data_dir))
    gt = GroundTruth(sim)
    train, test = sim.split_index("train"), sim.split_index("test")
    v_static, v_oracle = gt.policy_value(gt.static_policy(), test).value, gt.optimal_value(test).value
    value_of = lambda pol: gt.policy_value(pol, test).value
    load = os.getloadavg()
    print(f"data: {source}; {len(train)} train / {len(test)} held-out tasks; actions {sim.actions}")
    print(f"held-out exact values: static table {v_static:.4f}, oracle {v_oracle:.4f}; load average {load[0]:.2f}")

    results = {"source": source, "match_tolerance": args.match_tolerance, "machine": platform.platform(),
               "cpus": os.cpu_count(), "load_before": load,
               "python": platform.python_version(), "torch": torch.__version__, "v_static": v_static,
               "v_oracle": v_oracle, "comparison": [], "closure": []}
    cfg0 = PPOConfig(total_timesteps=args.timesteps, eval_every=args.eval_every)
    print(f"\nSB3 comparison: {cfg0.num_updates * cfg0.batch_size:,} env steps each, same hyperparameters; "
          f"target = SB3's final held-out value minus {args.match_tolerance:g} x (oracle - static); "
          "times are training only (wall / process CPU seconds)")
    print("| seed | SB3 final value (closure) | ours final value (closure) | SB3 total s | ours total s "
          "| ours s to target | SB3 s to target | goal ratio: SB3 total / ours to target | same-target ratio "
          "| same-budget ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in range(args.seeds):
        cfg = PPOConfig(**{**cfg0.__dict__, "seed": seed})
        sb3 = run_sb3(sim, train, cfg, value_of)  # interleaved: SB3 then ours, seed by seed
        ours = run_ours(sim, train, cfg, value_of)
        target = sb3["final_value"] - args.match_tolerance * (v_oracle - v_static)
        row = {"seed": seed, "sb3": sb3, "ours": ours, "target": target}
        for clock in ("train_seconds", "train_cpu_seconds"):
            o_reach, s_reach = time_to_reach(ours["curve"], target, clock), time_to_reach(sb3["curve"], target, clock)
            row[clock] = {"ours_to_target": o_reach, "sb3_to_target": s_reach,
                          "goal_ratio": ratio(sb3[clock], o_reach), "same_target_ratio": ratio(s_reach, o_reach),
                          "same_budget_ratio": ratio(sb3[clock], ours[clock])}
        results["comparison"].append(row)
        w, c = row["train_seconds"], row["train_cpu_seconds"]
        f = lambda x: "never" if x is None else f"{x:.1f}"
        print(f"| {seed} | {sb3['final_value']:.4f} ({regret_closure(sb3['final_value'], v_static, v_oracle):.3f}) "
              f"| {ours['final_value']:.4f} ({regret_closure(ours['final_value'], v_static, v_oracle):.3f}) "
              f"| {sb3['train_seconds']:.1f} / {sb3['train_cpu_seconds']:.1f} "
              f"| {ours['train_seconds']:.1f} / {ours['train_cpu_seconds']:.1f} "
              f"| {f(w['ours_to_target'])} / {f(c['ours_to_target'])} | {f(w['sb3_to_target'])} / "
              f"{f(c['sb3_to_target'])} | {w['goal_ratio']:.1f}x / {c['goal_ratio']:.1f}x "
              f"| {w['same_target_ratio']:.1f}x / {c['same_target_ratio']:.1f}x "
              f"| {w['same_budget_ratio']:.2f}x / {c['same_budget_ratio']:.2f}x |", flush=True)

    print(f"\nOur PPO, default settings ({PPOConfig().total_timesteps:,} env steps), {args.closure_seeds} seeds, "
          "held-out tasks:")
    print("| seed | value | regret closure | pass rate | mean cost USD | calls per task | train s | env steps/s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for seed in range(args.closure_seeds):
        cfg = PPOConfig(seed=seed, eval_every=0)
        res = train_ppo(CodeTaskVecEnv(sim, train, n_envs=cfg.num_envs, seed=seed), cfg)
        pv = gt.policy_value(res.policy(), test)
        rc = regret_closure(pv.value, v_static, v_oracle)
        results["closure"].append({"seed": seed, **pv.summary(), "regret_closure": rc, **res.metrics})
        print(f"| {seed} | {pv.value:.4f} | {rc:.3f} | {pv.mean('pass_rate'):.4f} | {pv.mean('cost_usd'):.5f} | "
              f"{pv.mean('calls'):.3f} | {res.metrics['train_seconds']:.1f} | "
              f"{res.metrics['env_steps_per_s']:,.0f} |", flush=True)
    results["load_after"] = os.getloadavg()
    summary = {}
    for clock in ("train_seconds", "train_cpu_seconds"):
        for k in ("goal_ratio", "same_target_ratio", "same_budget_ratio"):
            v = [r[clock][k] for r in results["comparison"]]
            summary[f"{k} ({'wall' if clock == 'train_seconds' else 'cpu'})"] = (min(v), float(np.median(v)))
    rc = [r["regret_closure"] for r in results["closure"]]
    results["summary"] = {k: list(v) for k, v in summary.items()} | {"closure_min": min(rc),
                                                                      "closure_mean": float(np.mean(rc))}
    print("\nratios over seeds (min, median): " + "; ".join(f"{k} {a:.2f}x, {b:.2f}x" for k, (a, b) in summary.items()))
    print(f"goal: SB3 total / ours to SB3's final value >= 2x; regret closure min {min(rc):.3f}, mean "
          f"{np.mean(rc):.3f} (goal >= 0.9 on each seed); load average after {results['load_after'][0]:.2f}")
    SCRATCH.mkdir(parents=True, exist_ok=True)
    out = SCRATCH / ("ppo_vs_sb3_synthetic.json" if source.startswith("synthetic") else "ppo_vs_sb3.json")
    out.write_text(json.dumps(results, indent=1, default=float))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
