"""Our PPO vs Stable-Baselines3's PPO on SAGE's coder / debugger loop, beside every baseline.

The environment is :class:`sage_pipeline.sim.loop_env.SageLoopVecEnv` on the project's tasks
(``<data-dir>/sim/tasks.jsonl`` and the ``sandbox_rollouts`` shards; materialize ``sim_tasks``
and ``sandbox_rollouts`` first), or ``--synthetic`` on the tests' synthetic suite. Every value is
exact (backward induction over the feedback states), on the held-out tasks:

* SAGE's static table and the oracle;
* the policies that ignore the feedback, each its exact per-task optimum: the best single arm,
  the best one-step route (one routing decision per task: a first call, then one action
  repeated) and the best feedback-blind plan (any fixed sequence; an upper bound);
* the online bandit of ``sage_pipeline/rl/bandit.py`` (LinUCB on SAGE's routing features),
  learning on the train tasks, valued greedily;
* SB3's PPO and our PPO, same environment, budget and hyperparameters.

**Like for like.** SB3 steps the same numpy vector env through a thin ``VecEnv`` adapter (no
slower environment for either), with the same rollout length, minibatch size, epochs,
learning rate and its linear annealing, gamma, GAE lambda, clip ranges for the policy and the
value, entropy and value coefficients, gradient clipping, ReLU 64x64 actor and critic with
orthogonal init, Adam with eps 1e-5 -- torch's fused Adam kernel for both -- and one torch
thread each. Both learners run once untimed first (one-time imports and allocations, e.g.
``torch._dynamo`` that creating a torch optimizer imports). Seeds interleave (SB3 then ours).
Every ``--eval-every`` updates each greedy policy is valued exactly (not counted in the times).

Per seed, in wall and process-CPU seconds (the machine is shared; CPU time is less disturbed):

* goal ratio = SB3's total training time / our time to first reach SB3's final held-out value
  (less ``--match-tolerance`` of the oracle-static gap): the issue's ">= 2x" ("our PPO reaches
  SB3's final value in <= half of SB3's wall time");
* same-budget ratio = SB3's training time / ours for the same env steps, measured in a second
  pair of runs without the learning curve's evaluations (their pauses disturb caches): env
  steps per second like for like (the issue's ">= 2x");
* same-target ratio = SB3's own time to that target / ours.

``--profile`` prints where each learner's time goes (cProfile of one run each).

    .venv/bin/python benchmarks/ppo_vs_sb3.py [--data-dir datasets] [--synthetic] [--seeds 5]
        [--timesteps N] [--eval-every 2] [--bandit-steps 100000] [--match-tolerance 0.01] [--profile]

Stable-Baselines3 is not a dependency of the project: install it into the virtualenv for this
benchmark only (``.venv/bin/pip install stable-baselines3==2.9.2 -c constraints.txt``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import platform
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

from sage_pipeline.rl.ppo import PPOConfig, train_ppo
from sage_pipeline.rl.ppo_policy import BANDIT, BLIND, run_online_bandit
from sage_pipeline.sim.loop_env import SageLoopSim, SageLoopVecEnv
from sage_pipeline.sim.loop_truth import LoopGroundTruth, regret_closure
from sage_pipeline.sim.rollouts import read_rollouts
from sage_pipeline.sim.schema import read_tasks

SCRATCH = ROOT / "benchmarks" / ".scratch"


def load_suite(data_dir: Path, synthetic: bool) -> tuple[list, object, str]:
    """The tasks and their rollouts: the project's (``make run`` materializes them in the sandbox),
    or the tests' synthetic suite when there are none or ``synthetic``."""
    tasks_file, shards = data_dir / "sim" / "tasks.jsonl", data_dir / "sim" / "rollouts"
    if not synthetic and tasks_file.is_file() and shards.is_dir() and any(shards.glob("shard-*.parquet")):
        return read_tasks(tasks_file), read_rollouts(shards), f"{tasks_file} + {shards}"
    from sage_pipeline_tests.sim.synthetic import synthetic_suite
    return *synthetic_suite(1200, seed=0), "synthetic suite (1,200 tasks)"


def load_sim(data_dir: Path, synthetic: bool) -> tuple[SageLoopSim, str]:
    tasks, rollouts, source = load_suite(data_dir, synthetic)
    return SageLoopSim.build(tasks, rollouts), source


# ----------------------------------------------------------- SB3 adapters
def sb3_vecenv(env: SageLoopVecEnv):
    from stable_baselines3.common.vec_env import VecEnv

    class NumpyVecEnv(VecEnv):
        """SB3's VecEnv interface over our Gymnasium VectorEnv (episodes end at true terminals:
        SB3 needs no terminal_observation)."""

        def __init__(self) -> None:
            super().__init__(env.num_envs, env.single_observation_space, env.single_action_space)
            self._infos = [{} for _ in range(env.num_envs)]

        def reset(self):
            return env.reset()[0]

        def step_async(self, actions):
            self._actions = np.asarray(actions, dtype=np.int64)

        def step_wait(self):
            obs, r, term, trunc, _ = env.step(self._actions)
            return obs, r.astype(np.float32), term | trunc, self._infos

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
    """SB3's actor as a policy of the contract (greedy over its action probabilities)."""

    def __init__(self, model, sim: SageLoopSim) -> None:
        self.model, self.sim = model, sim
        self.actions, self.role_mask, self.name = sim.actions, sim.role_mask, "sb3_ppo"

    @torch.no_grad()
    def action_probs(self, obs) -> np.ndarray:
        x = torch.as_tensor(self.sim.obs_spec.encode(obs))
        probs = self.model.policy.get_distribution(x).distribution.probs.double().numpy()
        out = np.zeros_like(probs)
        out[np.arange(len(probs)), probs.argmax(1)] = 1.0
        return out


def make_sb3(sim, train_idx, cfg: PPOConfig):
    from stable_baselines3 import PPO

    env = SageLoopVecEnv(sim, train_idx, n_envs=cfg.num_envs, seed=cfg.seed)
    lr0 = cfg.learning_rate
    return PPO("MlpPolicy", sb3_vecenv(env), learning_rate=lambda progress: progress * lr0, n_steps=cfg.num_steps,
               batch_size=cfg.minibatch_size, n_epochs=cfg.update_epochs, gamma=cfg.gamma,
               gae_lambda=cfg.gae_lambda, clip_range=cfg.clip_coef, clip_range_vf=cfg.clip_coef,
               normalize_advantage=cfg.norm_adv, ent_coef=cfg.ent_coef, vf_coef=cfg.vf_coef,
               max_grad_norm=cfg.max_grad_norm, seed=cfg.seed, device="cpu", verbose=0,
               policy_kwargs={"net_arch": {"pi": list(cfg.hidden), "vf": list(cfg.hidden)},
                              "activation_fn": torch.nn.ReLU, "ortho_init": True,
                              "optimizer_kwargs": {"eps": 1e-5, "fused": True}})


def run_sb3(sim, train_idx, cfg: PPOConfig, value_of) -> dict:
    from stable_baselines3.common.callbacks import BaseCallback

    class Curve(BaseCallback):
        """Exact held-out value every eval_every updates; its time is not counted."""

        def __init__(self):
            super().__init__()
            self.rows, self.eval_s, self.eval_cpu, self.updates = [], 0.0, 0.0, 0

        def _on_training_start(self):
            self.t0, self.c0 = time.perf_counter(), time.process_time()

        def _on_rollout_start(self):  # i.e. after the previous update
            if value_of and (self.updates == 1 or (self.updates and self.updates % cfg.eval_every == 0)):
                self.evaluate()

        def _on_rollout_end(self):
            self.updates += 1

        def evaluate(self):
            t, c = time.perf_counter(), time.process_time()
            self.rows.append({"env_steps": self.num_timesteps, "train_seconds": t - self.t0 - self.eval_s,
                              "train_cpu_seconds": c - self.c0 - self.eval_cpu,
                              "value": value_of(SB3Policy(self.model, sim)) if value_of else float("nan")})
            self.eval_s += time.perf_counter() - t
            self.eval_cpu += time.process_time() - c

        def _on_step(self):
            return True

    torch.set_num_threads(1)
    model = make_sb3(sim, train_idx, cfg)
    cb = Curve()
    model.learn(total_timesteps=cfg.num_updates * cfg.batch_size, callback=cb)
    cb.evaluate()  # the final policy
    last = cb.rows[-1]
    return {"train_seconds": last["train_seconds"], "train_cpu_seconds": last["train_cpu_seconds"],
            "final_value": last["value"], "curve": cb.rows, "env_steps": model.num_timesteps,
            "policy": SB3Policy(model, sim)}


def run_ours(sim, train_idx, cfg: PPOConfig, value_of) -> dict:
    env = SageLoopVecEnv(sim, train_idx, n_envs=cfg.num_envs, seed=cfg.seed)
    res = train_ppo(env, cfg, evaluate=(lambda greedy, soft: {"value": value_of(greedy)}) if value_of else None)
    curve = [{k: r[k] for k in ("env_steps", "train_seconds", "train_cpu_seconds", "value")} for r in res.curve]
    return {"train_seconds": res.metrics["train_seconds"], "train_cpu_seconds": res.metrics["train_cpu_seconds"],
            "final_value": curve[-1]["value"] if curve else float("nan"), "curve": curve,
            "env_steps": res.metrics["env_steps"], "policy": res.policy()}


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


def profile(sim, train_idx, cfg: PPOConfig) -> None:
    """Where each learner's time goes: the top entries of cProfile, by own time."""
    for name, fn in (("ours", lambda: run_ours(sim, train_idx, cfg, None)),
                     ("SB3", lambda: run_sb3(sim, train_idx, cfg, None))):
        prof = cProfile.Profile()
        prof.enable()
        fn()
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(14)
        print(f"\n--- profile: {name} ({cfg.num_updates * cfg.batch_size:,} env steps)\n" +
              "\n".join(out.getvalue().splitlines()[4:28]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=count, default=5)
    ap.add_argument("--timesteps", type=int, default=PPOConfig().total_timesteps)
    ap.add_argument("--eval-every", type=int, default=2, help="updates between learning-curve points")
    ap.add_argument("--bandit-steps", type=int, default=100_000)
    ap.add_argument("--data-dir", default=os.environ.get("SAGE_DATA_DIR", str(ROOT / "datasets")))
    ap.add_argument("--synthetic", action="store_true", help="the tests' synthetic suite instead of the project's")
    ap.add_argument("--match-tolerance", type=float, default=0.01,
                    help="'matches' = within this share of the oracle-static gap of the target value")
    ap.add_argument("--profile", action="store_true", help="print where each learner's time goes, then exit")
    args = ap.parse_args()

    sim, source = load_sim(Path(args.data_dir), args.synthetic)
    gt = LoopGroundTruth(sim)
    train, test = sim.split_index("train"), sim.split_index("test")
    cfg0 = PPOConfig(total_timesteps=args.timesteps, eval_every=args.eval_every)
    # warm up both learners untimed: one-time imports (creating a torch optimizer imports torch._dynamo)
    warm = PPOConfig(**cfg0.model_dump() | {"total_timesteps": cfg0.batch_size, "eval_every": 0})
    run_sb3(sim, train, warm, None)
    run_ours(sim, train, warm, None)
    if args.profile:
        profile(sim, train, PPOConfig(**cfg0.model_dump() | {"eval_every": 0}))
        return

    fixed = {r["policy"]: r for r in gt.compare({}, test, train_idx=train)}
    v_static, v_oracle = fixed["static_table"]["value"], fixed["oracle"]["value"]
    value_of = lambda pol: gt.policy_value(pol, test).value  # noqa: E731
    load = os.getloadavg()
    print(f"data: {source}; {len(train)} train / {len(test)} held-out tasks; actions {sim.actions}")
    print(f"load average {load[0]:.2f} on {os.cpu_count()} cores; python {platform.python_version()}, "
          f"torch {torch.__version__}")
    results = {"source": source, "machine": platform.platform(), "cpus": os.cpu_count(), "load_before": load,
               "torch": torch.__version__, "match_tolerance": args.match_tolerance, "fixed": fixed, "seeds": []}

    print("\n| seed | policy | value | regret closure | pass rate | mean USD | mean seconds | calls/task |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    speed = []
    for seed in range(args.seeds):
        cfg = PPOConfig(**cfg0.model_dump() | {"seed": seed})
        sb3 = run_sb3(sim, train, cfg, value_of)  # interleaved: SB3 then ours, seed by seed
        ours = run_ours(sim, train, cfg, value_of)
        # throughput like for like: the same budget again, without the learning curve's pauses
        thr_cfg = PPOConfig(**cfg.model_dump() | {"eval_every": 0})
        thr_sb3, thr_ours = run_sb3(sim, train, thr_cfg, None), run_ours(sim, train, thr_cfg, None)
        bandit, _ = run_online_bandit(sim, train, args.bandit_steps, seed=seed)
        rows = {r["policy"]: r for r in gt.compare({BANDIT: bandit, "SB3 PPO": sb3.pop("policy"),
                                                    "our PPO": ours.pop("policy")}, test, blind=False)}
        rows = {**{k: fixed[k] for k in ("static_table", *BLIND)}, **rows}
        for name, r in rows.items():
            print(f"| {seed} | {name} | {r['value']:.4f} | {r['regret_closure']:.3f} | {r['pass_rate']:.3f} | "
                  f"{r['mean_cost_usd']:.5f} | {r['mean_latency_s']:.1f} | {r['calls_per_task']:.2f} |", flush=True)
        target = sb3["final_value"] - args.match_tolerance * (v_oracle - v_static)
        thr = {"sb3": {k: thr_sb3[k] for k in ("train_seconds", "train_cpu_seconds", "env_steps")},
               "ours": {k: thr_ours[k] for k in ("train_seconds", "train_cpu_seconds", "env_steps")}}
        row = {"seed": seed, "rows": rows, "sb3": sb3, "ours": ours, "target": target, "throughput": thr}
        for clock in ("train_seconds", "train_cpu_seconds"):
            o_reach, s_reach = time_to_reach(ours["curve"], target, clock), time_to_reach(sb3["curve"], target, clock)
            row[clock] = {"ours_to_target": o_reach, "sb3_to_target": s_reach,
                          "goal_ratio": ratio(sb3[clock], o_reach), "same_target_ratio": ratio(s_reach, o_reach),
                          "same_budget_ratio": ratio(thr_sb3[clock], thr_ours[clock])}
        results["seeds"].append(row)
        speed.append(row)

    print(f"\nSpeed: {cfg0.num_updates * cfg0.batch_size:,} env steps each; target = SB3's final held-out value "
          f"minus {args.match_tolerance:g} x (oracle - static); training times only, wall / process CPU seconds; "
          "steps/s and the same-budget ratio from the runs without evaluations")
    print("| seed | SB3 final (closure) | ours final (closure) | SB3 total s | ours total s | SB3 steps/s "
          "| ours steps/s | ours s to target | SB3 s to target | goal ratio | same-budget ratio | same-target ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    f = lambda x: "never" if x is None else f"{x:.1f}"  # noqa: E731
    for row in speed:
        sb3, ours, w, c = row["sb3"], row["ours"], row["train_seconds"], row["train_cpu_seconds"]
        t_sb3, t_ours = row["throughput"]["sb3"], row["throughput"]["ours"]
        steps = t_ours["env_steps"]
        closure = lambda v: regret_closure(v, v_static, v_oracle)  # noqa: E731
        print(f"| {row['seed']} | {sb3['final_value']:.4f} ({closure(sb3['final_value']):.3f}) "
              f"| {ours['final_value']:.4f} ({closure(ours['final_value']):.3f}) "
              f"| {sb3['train_seconds']:.1f} / {sb3['train_cpu_seconds']:.1f} "
              f"| {ours['train_seconds']:.1f} / {ours['train_cpu_seconds']:.1f} "
              f"| {steps / t_sb3['train_seconds']:,.0f} | {steps / t_ours['train_seconds']:,.0f} "
              f"| {f(w['ours_to_target'])} / {f(c['ours_to_target'])} | {f(w['sb3_to_target'])} / "
              f"{f(c['sb3_to_target'])} | {w['goal_ratio']:.1f}x / {c['goal_ratio']:.1f}x "
              f"| {w['same_budget_ratio']:.2f}x / {c['same_budget_ratio']:.2f}x "
              f"| {w['same_target_ratio']:.1f}x / {c['same_target_ratio']:.1f}x |", flush=True)
    results["load_after"] = os.getloadavg()
    closures = {name: [r["rows"][name]["regret_closure"] for r in speed] for name in speed[0]["rows"]}
    summary = {"closure_min": {k: min(v) for k, v in closures.items()},
               "closure_mean": {k: float(np.mean(v)) for k, v in closures.items()}}
    for clock, tag in (("train_seconds", "wall"), ("train_cpu_seconds", "cpu")):
        for k in ("goal_ratio", "same_budget_ratio", "same_target_ratio"):
            v = [r[clock][k] for r in speed]
            summary[f"{k} ({tag})"] = {"min": min(v), "median": float(np.median(v))}
    results["summary"] = summary
    st, orc = fixed["static_table"], fixed["oracle"]
    print(f"\nstatic table: pass {st['pass_rate']:.3f}, ${st['mean_cost_usd']:.5f}, "
          f"{st['mean_latency_s']:.1f} s per task; "
          f"oracle: pass {orc['pass_rate']:.3f}, ${orc['mean_cost_usd']:.5f}, {orc['mean_latency_s']:.1f} s per task")
    print("regret closure over seeds (min / mean): " + "; ".join(
        f"{k} {summary['closure_min'][k]:.3f} / {summary['closure_mean'][k]:.3f}" for k in closures))
    print("ratios over seeds (min / median): " + "; ".join(
        f"{k} {v['min']:.2f}x / {v['median']:.2f}x" for k, v in summary.items() if "ratio" in k))
    print(f"goals: our PPO closure >= 0.85 on every seed; the one-step policy <= 0.6; goal ratio and same-budget "
          f"ratio >= 2x; load average after {results['load_after'][0]:.2f}")
    SCRATCH.mkdir(parents=True, exist_ok=True)
    out = SCRATCH / ("ppo_vs_sb3_synthetic.json" if args.synthetic else "ppo_vs_sb3.json")
    for r in results["seeds"]:
        for k in ("sb3", "ours"):
            r[k] = {kk: vv for kk, vv in r[k].items() if kk != "policy"}
    out.write_text(json.dumps(results, indent=1, default=float))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
