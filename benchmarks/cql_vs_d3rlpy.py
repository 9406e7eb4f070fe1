"""Discrete CQL: ``sage_pipeline.rl.cql`` side by side with d3rlpy 2.8.1's ``DiscreteCQL``.

Both learn from the *same* transitions (the train split of the default synthetic data:
collector, ingest, routing_dataset, ``LoggedDecisions``), with the same network (the
hidden layers of ``CQLConfig``), gradient steps, batch size, gamma, optimiser and reward
scaling, one alpha. The script prints, per learner, the wall-clock training time (same
torch thread count in both, default 1) and the exact ground-truth value of its greedy
policy on the eval split's tasks (routing simulator, backward induction), next to the
static YAML table's and the oracle's values and each one's regret closure
``(V - V_static) / (V_oracle - V_static)``; then the ratios (our time / d3rlpy's time,
our value - d3rlpy's value). Results go to ``benchmarks/.scratch/cql_vs_d3rlpy.json``.

How the settings map (``CQLConfig`` -> ``DiscreteCQLConfig``):

* network: ``hidden`` -> ``VectorEncoderFactory(hidden_units=hidden)`` (ReLU) plus d3rlpy's
  linear Q head: the same ``in -> 64 -> 64 -> K`` MLP per critic, torch's default init;
  ``n_critics`` -> ``n_critics`` (2). Both serve the argmax of the critics' mean.
* ``steps``, ``batch_size``, ``gamma`` -> ``n_steps``, ``batch_size``, ``gamma`` (same values);
  one d3rlpy epoch of ``steps`` steps, no evaluators, no logging to disk.
* ``lr``, ``weight_decay`` (AdamW) -> ``learning_rate``, ``AdamWFactory(weight_decay=...)``.
* rewards: ours divides rewards by their std in multistep mode (no shift) ->
  ``MultiplyRewardScaler(1 / std)``, so both critics and alpha live in the same units.
* TD loss: both use Huber with delta 1 on (normalised) rewards, summed over critics, and the
  double-DQN target: the online critics' mean picks the next action, the MIN over the target
  critics values it (ours: ``target_reduce="min"``; d3rlpy's DoubleDQN: ``reduction="min"``).
* alpha: ours adds ``alpha * (logsumexp(Q_j) - Q_j(a))`` to EACH critic j; d3rlpy adds
  ``alpha_d * (logsumexp(mean_j Q_j) - mean_j Q_j(a))`` once, whose gradient reaches each
  critic divided by ``n_critics``. So ``alpha_d = n_critics * alpha`` (equal gradients while
  the critics agree).
* target network: ours Polyak-averages with ``target_tau`` per step; d3rlpy only has a hard
  copy every ``target_update_interval`` steps -> ``round(1 / target_tau)`` (100 for tau 0.01:
  the same mean lag of the target behind the online critics). If ``target_every > 0`` (ours
  hard-copies too) it is used as it is.
* done: ``next_index == -1`` (the end of a logged episode) -> ``terminals = 1``, every other row
  links to the next row of its episode, exactly the transitions our multistep target sees.
* d3rlpy has NO per-role action mask: its logsumexp, its next-state argmax and its greedy
  policy range over all K models, including the ones a role may not use. Its greedy policy is
  therefore evaluated with the role mask applied at serving (argmax over the role's allowed
  models of its Q-values, the way our ``MLPPolicy`` serves), and the script reports how often
  its unmasked argmax picks a disallowed model.

d3rlpy is not a project dependency and this script installs nothing. It needs d3rlpy in a
separate virtualenv (torch first, so pip takes the local CPU wheel and never resolves
torch itself; d3rlpy 2.8.1 asks for ``torch>=2.5.0``, which the constraint pins to the
installed 2.13.0)::

    python3 -m venv benchmarks/.scratch/d3rlpy-venv
    benchmarks/.scratch/d3rlpy-venv/bin/pip install torch==2.13.0
    benchmarks/.scratch/d3rlpy-venv/bin/pip install -c <(echo torch==2.13.0+cpu) d3rlpy==2.8.1

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/cql_vs_d3rlpy.py [--episodes 5000] [--seed 0] [--learner-seed SEED]
        [--alpha 0.03] [--threads 1] [--d3rlpy-python PATH]

``--seed`` seeds the collector (the data) and, unless ``--learner-seed`` is given, both
learners (``CQLConfig.seed`` for ours, ``d3rlpy.seed`` for d3rlpy).

The project side generates the data, trains ours, writes the d3rlpy inputs (observations
``FeatureSpec().encode(contexts)``, actions, rewards, terminals and the hyperparameters) to
``benchmarks/.scratch/cql_vs_d3rlpy_inputs.npz`` and runs this same file with
``--d3rlpy-side`` in the d3rlpy virtualenv, which imports numpy, torch and d3rlpy only and
returns the trained critics' weights as numpy arrays; the project side serves them with the
role mask and values them with the simulator. Takes about 25 s on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "benchmarks" / ".scratch"
D3RLPY_PYTHON = SCRATCH / "d3rlpy-venv" / "bin" / "python"
WORK = SCRATCH / "cql_vs_d3rlpy"


# ---------------------------------------------------------------- d3rlpy side (d3rlpy virtualenv)
def d3rlpy_side(inputs: Path, output: Path) -> None:
    import torch

    d = np.load(inputs)
    hp = json.loads(str(d["hparams"]))
    torch.set_num_threads(int(hp["threads"]))

    import d3rlpy
    from d3rlpy.dataset import MDPDataset
    from d3rlpy.logging import NoopAdapterFactory
    from d3rlpy.models.encoders import VectorEncoderFactory
    from d3rlpy.optimizers import AdamWFactory
    from d3rlpy.preprocessing import MultiplyRewardScaler

    d3rlpy.seed(int(hp["seed"]))
    obs, act, rew, term = d["observations"], d["actions"], d["rewards"], d["terminals"]
    K = int(hp["action_size"])

    t0 = time.perf_counter()
    dataset = MDPDataset(observations=obs, actions=act, rewards=rew, terminals=term,
                         action_space=d3rlpy.ActionSpace.DISCRETE, action_size=K)
    algo = d3rlpy.algos.DiscreteCQLConfig(
        learning_rate=hp["lr"], optim_factory=AdamWFactory(weight_decay=hp["weight_decay"]),
        encoder_factory=VectorEncoderFactory(hidden_units=list(hp["hidden"]), activation="relu"),
        reward_scaler=MultiplyRewardScaler(hp["reward_multiplier"]),
        batch_size=hp["batch_size"], gamma=hp["gamma"], n_critics=hp["n_critics"],
        target_update_interval=hp["target_update_interval"], alpha=hp["alpha"],
    ).create(device=False)
    t1 = time.perf_counter()
    metrics: dict = {}
    for _, metrics in algo.fitter(  # noqa: B007 (the last epoch's metrics are read below)
                                  dataset, n_steps=hp["steps"], n_steps_per_epoch=hp["steps"],
                                  logger_adapter=NoopAdapterFactory(), show_progress=False,
                                  save_interval=10**9):
        pass
    t2 = time.perf_counter()

    # export the critics as numpy (weight (out, in), bias) layers, in normalised reward units
    nets = []
    for q_func in algo.impl.q_function:
        linears = [m for m in q_func._encoder._layers if isinstance(m, torch.nn.Linear)] + [q_func._fc]
        nets.append([(m.weight.detach().numpy().copy(), m.bias.detach().numpy().copy()) for m in linears])

    def forward(layers, x):
        h = x
        for i, (w, b) in enumerate(layers):
            h = h @ w.T + b
            if i < len(layers) - 1:
                h = np.maximum(h, 0.0)
        return h

    q_np = np.mean([forward(layers, obs) for layers in nets], axis=0)
    q_d3 = np.stack([algo.predict_value(obs, np.full(len(obs), a)) for a in range(K)], axis=1)
    export_diff = float(np.abs(q_np - q_d3).max())
    if export_diff > 1e-4:
        raise SystemExit(f"exported critics differ from d3rlpy's predict_value by {export_diff}")
    greedy_d3 = algo.predict(obs)
    arrays = {f"n{j}_{kind}{i}": arr for j, layers in enumerate(nets)
              for i, (w, b) in enumerate(layers) for kind, arr in (("w", w), ("b", b))}
    np.savez(output, n_nets=len(nets), n_layers=len(nets[0]), greedy_train=greedy_d3, **arrays)
    meta = {"d3rlpy_version": d3rlpy.__version__, "torch_version": torch.__version__,
            "numpy_version": np.__version__, "torch_threads": torch.get_num_threads(),
            "transitions": int(dataset.transition_count), "episodes": len(dataset.episodes),
            "setup_seconds": t1 - t0, "fit_seconds": t2 - t1, "steps_per_s": hp["steps"] / (t2 - t1),
            "last_epoch_metrics": {k: float(v) for k, v in metrics.items()},
            "export_max_abs_diff": export_diff,
            "config": json.loads(algo.config.serialize()) if hasattr(algo.config, "serialize") else None}
    output.with_suffix(".json").write_text(json.dumps(meta, indent=2, default=str))


# ---------------------------------------------------------------- project side
def make_data(episodes: int, seed: int):
    import pyarrow.parquet as pq

    from sage_pipeline.rl.data import from_dataset
    from sage_pipeline.rl.offline_eval import simulator_from_manifest
    from sage_pipeline.routing import ingest
    from sage_pipeline.routing.catalogue import ModelCatalogue
    from sage_pipeline.routing.collector import CollectorConfig, collect
    from sage_pipeline.routing.reward import RewardSpec
    from sage_pipeline.routing.routing_dataset import build_routing_dataset
    from sage_pipeline.routing.routing_simulator import RoutingSimulator
    from sage_pipeline.sage.table import RoutingTable

    cat = ModelCatalogue.load()
    tab = RoutingTable.load()
    work = WORK / f"ep{episodes}_seed{seed}"

    def quiet(_: str) -> None:
        pass

    res = collect(RoutingSimulator(cat, tab), work / "logs", CollectorConfig(episodes=episodes, seed=seed),
                  progress=quiet)
    ing = ingest.ingest(ingest.IngestConfig((work / "logs",)), work / "routing", progress=quiet)
    df = build_routing_dataset(pq.read_table(ing.trajectories).to_pandas(), tab, cat).frame
    data = from_dataset(df, cat)
    sim = simulator_from_manifest(res.manifest, cat, tab, RewardSpec())
    return cat, tab, sim, data


def greedy_unmasked(nets, x: np.ndarray) -> np.ndarray:
    from sage_pipeline.rl.checkpoint import mlp_forward

    return np.mean([mlp_forward(layers, x) for layers in nets], axis=0).argmax(1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=5000, help="collector episodes (default 5000)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the collector (the data)")
    ap.add_argument("--learner-seed", type=int, default=None, help="seed of both learners (default: --seed)")
    ap.add_argument("--alpha", type=float, default=None, help="our alpha (default: CQLConfig's)")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads in both (default 1)")
    ap.add_argument("--d3rlpy-python", type=Path, default=D3RLPY_PYTHON)
    ap.add_argument("--d3rlpy-side", nargs=2, type=Path, metavar=("INPUTS", "OUTPUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.d3rlpy_side:
        d3rlpy_side(*args.d3rlpy_side)
        return 0

    import torch

    from sage_pipeline.rl.checkpoint import CheckpointMeta, MLPPolicy
    from sage_pipeline.rl.cql import CQLConfig, train_cql
    from sage_pipeline.rl.offline_eval import eval_tasks, regret_closure
    from sage_pipeline.routing.features import FeatureSpec
    from sage_pipeline.routing.policy import StaticTablePolicy

    if not args.d3rlpy_python.exists():
        print(f"d3rlpy virtualenv not found at {args.d3rlpy_python}: create it with the commands at the top "
              f"of {Path(__file__).relative_to(ROOT)}", file=sys.stderr)
        return 2
    SCRATCH.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    t_start = time.perf_counter()

    # ---- data: collector -> ingest -> routing dataset -> LoggedDecisions
    cat, tab, sim, data = make_data(args.episodes, args.seed)
    train, ev = data.split_rows("train"), data.split_rows("eval")
    spec = FeatureSpec()
    lseed = args.seed if args.learner_seed is None else args.learner_seed
    cfg = CQLConfig(mode="multistep", seed=lseed, torch_threads=args.threads,
                    **({} if args.alpha is None else {"alpha": args.alpha}))
    nxt = train.next_index
    links = nxt[nxt >= 0]
    if not (links == np.flatnonzero(nxt >= 0) + 1).all():
        raise SystemExit("train rows are not in episode order: next_index must be i + 1 or -1")
    done = nxt < 0
    print(f"data: {args.episodes} episodes (seed {args.seed}), {len(data)} decisions; train {len(train)} "
          f"decisions ({int(done.sum())} episode ends, {int((done & ~train.terminal).sum())} of them not "
          f"logged terminal), eval {len(ev)} decisions; K={len(train.actions)} models, "
          f"{int(train.role_mask.sum(1).min())}-{int(train.role_mask.sum(1).max())} allowed per role "
          f"({time.perf_counter() - t_start:.1f}s)")

    # ---- ours
    torch.manual_seed(lseed)
    t0 = time.perf_counter()
    ours = train_cql(train, spec, cfg, log=lambda m: None)
    ours_seconds = time.perf_counter() - t0
    print(f"ours: {ours_seconds:.2f}s ({cfg.steps / ours_seconds:.0f} steps/s)")

    # ---- d3rlpy, in its own virtualenv, on the same transitions
    X = spec.encode(train.contexts)
    scale = float(train.reward.std()) if cfg.normalize_rewards else 1.0
    scale = scale if scale > 1e-8 else 1.0
    hp = {"seed": lseed, "threads": args.threads, "action_size": len(train.actions),
          "hidden": [int(h) for h in cfg.hidden], "lr": cfg.lr, "weight_decay": cfg.weight_decay,
          "steps": cfg.steps, "batch_size": cfg.batch_size, "gamma": cfg.gamma, "n_critics": cfg.n_critics,
          "alpha": cfg.alpha * cfg.n_critics,
          "target_update_interval": cfg.target_every or max(1, round(1.0 / cfg.target_tau)),
          "reward_multiplier": 1.0 / scale}
    inputs, output = SCRATCH / "cql_vs_d3rlpy_inputs.npz", SCRATCH / "cql_vs_d3rlpy_d3rlpy.npz"
    np.savez(inputs, observations=X, actions=train.action.astype(np.int64),
             rewards=train.reward.astype(np.float32), terminals=done.astype(np.float32),
             hparams=np.array(json.dumps(hp)))
    t0 = time.perf_counter()
    proc = subprocess.run([str(args.d3rlpy_python), __file__, "--d3rlpy-side", str(inputs), str(output)],
                          check=False, capture_output=True, text=True)
    d3_wall = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stdout[-4000:], proc.stderr[-4000:], sep="\n", file=sys.stderr)
        return 2
    d3 = json.loads(output.with_suffix(".json").read_text())
    w = np.load(output)
    nets = [[(w[f"n{j}_w{i}"], w[f"n{j}_b{i}"]) for i in range(int(w["n_layers"]))]
            for j in range(int(w["n_nets"]))]
    # back to reward units (argmax-invariant), as ours folds its scaling into the last layer
    nets = [layers[:-1] + [(layers[-1][0] * scale, layers[-1][1] * scale)] for layers in nets]
    per_step = d3["last_epoch_metrics"]
    print(f"d3rlpy {d3['d3rlpy_version']}: fit {d3['fit_seconds']:.2f}s ({d3['steps_per_s']:.0f} steps/s: "
          f"{1e3 * per_step.get('time_sample_batch', float('nan')):.2f} ms sampling + "
          f"{1e3 * per_step.get('time_algorithm_update', float('nan')):.2f} ms update per step), "
          f"dataset + create {d3['setup_seconds']:.2f}s, subprocess {d3_wall:.1f}s")
    d3_policy = MLPPolicy(CheckpointMeta(kind="d3rlpy_discrete_cql", feature_spec=spec.to_dict(),
                                         actions=list(train.actions), role_mask=train.role_mask.tolist(),
                                         head="greedy"), nets, name="d3rlpy_masked")

    # ---- ground truth on the eval split's tasks
    tasks = eval_tasks(ev)
    static = StaticTablePolicy(tab, cat)
    v_static = sim.policy_value(static, tasks).mean
    v_oracle = sim.optimal_value(tasks).mean
    v_ours = sim.policy_value(ours.policy(), tasks).mean
    v_d3 = sim.policy_value(d3_policy, tasks).mean

    # ---- d3rlpy without the mask: how often its argmax is a model the role may not use
    def disallowed(decisions) -> float:
        g = greedy_unmasked(nets, spec.encode(decisions.contexts))
        return float((~decisions.mask[np.arange(len(decisions)), g]).mean())

    q_ev = d3_policy.outputs(ev.contexts)  # reward units
    has_off = (~ev.mask).any(1)
    margin = (np.where(ev.mask, q_ev, -np.inf).max(1) - np.where(ev.mask, -np.inf, q_ev).max(1))[has_off]

    ctx0 = sim.contexts(tasks, np.zeros(len(tasks), np.int64), np.zeros(len(tasks), np.int64))
    g0 = greedy_unmasked(nets, spec.encode(ctx0))
    dis = {"eval_decisions": disallowed(ev), "train_decisions": disallowed(train),
           "eval_first_attempts": float((~sim.role_mask[ctx0.role, g0]).mean())}
    if not np.array_equal(greedy_unmasked(nets, X), w["greedy_train"]):
        print("note: numpy argmax differs from d3rlpy's predict on some train rows (ties/rounding)")
    choice_ours = ours.policy().action_probs(ev.contexts).argmax(1)
    choice_d3 = d3_policy.action_probs(ev.contexts).argmax(1)
    agreement = float((choice_ours == choice_d3).mean())
    load_after = os.getloadavg()

    rows = [("static_table", v_static, None), ("oracle", v_oracle, None),
            ("ours (sage_pipeline.rl.cql)", v_ours, ours_seconds),
            ("d3rlpy DiscreteCQL, masked at serving", v_d3, d3["fit_seconds"])]
    print(f"\nground truth on the eval split's {len(tasks)} tasks (exact expected episode return); "
          f"learner seed {lseed}, alpha {cfg.alpha:g} (d3rlpy {hp['alpha']:g}), "
          f"{cfg.steps} steps of {cfg.batch_size}, "
          f"{args.threads} torch thread(s)\n")
    print(f"{'policy':40s} {'value':>8s} {'regret closure':>15s} {'train s':>8s}")
    for name, v, s in rows:
        rc = regret_closure(v, v_static, v_oracle)
        print(f"{name:40s} {v:8.4f} {rc:15.3f} {'' if s is None else f'{s:8.2f}':>8s}")
    print(f"\nours / d3rlpy training time: {ours_seconds / d3['fit_seconds']:.3f} "
          f"(d3rlpy incl. dataset + create: {ours_seconds / (d3['fit_seconds'] + d3['setup_seconds']):.3f})")
    rc_ours, rc_d3 = regret_closure(v_ours, v_static, v_oracle), regret_closure(v_d3, v_static, v_oracle)
    print(f"ours - d3rlpy value: {v_ours - v_d3:+.4f} (regret closure {rc_ours - rc_d3:+.3f})")
    print("d3rlpy unmasked argmax picks a disallowed model on: "
          + ", ".join(f"{k} {v:.1%}" for k, v in dis.items()))
    print(f"  (best allowed minus best disallowed Q on the {int(has_off.sum())} eval decisions whose role "
          f"has disallowed models: min {margin.min():+.3f}, median {np.median(margin):+.3f} reward units)")
    print(f"greedy choices equal on eval decisions: {agreement:.1%}")
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after; "
          f"whole run {time.perf_counter() - t_start:.0f}s")

    report = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "torch": torch.__version__,
                    "load_before": load_before, "load_after": load_after},
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "data": {"decisions": len(data), "train": len(train), "eval": len(ev), "eval_tasks": len(tasks),
                 "K": len(train.actions), "train_episode_ends": int(done.sum()), "reward_std": scale},
        "ours": {"config": cfg.to_dict(), "seconds": ours_seconds, "seconds_inside": ours.metrics["seconds"],
                 "value": v_ours, "regret_closure": rc_ours,
                 "td_loss": ours.metrics["td_loss"], "conservative_gap": ours.metrics["conservative_gap"]},
        "d3rlpy": {**d3, "hparams": hp, "subprocess_seconds": d3_wall, "value_masked": v_d3,
                   "regret_closure_masked": rc_d3,
                   "unmasked_argmax_disallowed": dis,
                   "allowed_minus_disallowed_q_eval": {"rows": int(has_off.sum()), "min": float(margin.min()),
                                                       "median": float(np.median(margin))}},
        "static_table": v_static, "oracle": v_oracle,
        "time_ratio_ours_over_d3rlpy_fit": ours_seconds / d3["fit_seconds"],
        "time_ratio_ours_over_d3rlpy_setup_and_fit": ours_seconds / (d3["fit_seconds"] + d3["setup_seconds"]),
        "value_ours_minus_d3rlpy": v_ours - v_d3, "greedy_agreement_eval": agreement,
    }
    (SCRATCH / "cql_vs_d3rlpy.json").write_text(json.dumps(report, indent=2, default=float))
    print(f"results: {(SCRATCH / 'cql_vs_d3rlpy.json').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
