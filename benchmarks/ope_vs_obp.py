"""OPE parity check: ``sage_pipeline.rl.ope`` side by side with the Open Bandit Pipeline (obp 0.5.7).

Both compute IPS, SNIPS, DM, DR, SNDR and Switch-DR on the *same* inputs (reward,
action, pscore, the evaluation policy's action_dist and the same q_hat), and the script
prints the largest absolute difference per estimator, in the policy value and in the
per-round rewards. The target is <= 1e-8; the script exits 1 above it. It also prints
both libraries' bootstrap intervals (different random streams, and obp freezes the
self-normalised denominators; see ``ope.bootstrap_ci``), for information only.

obp is not a project dependency and this script installs nothing. It needs obp in a
separate virtualenv (obp 0.5.7 pins old versions, hence --no-deps; torch first, so pip
takes the local CPU wheel and never resolves torch itself)::

    python3 -m venv benchmarks/.scratch/obp-venv
    benchmarks/.scratch/obp-venv/bin/pip install torch==2.13.0
    benchmarks/.scratch/obp-venv/bin/pip install numpy scipy scikit-learn pandas matplotlib seaborn \
        tqdm pyyaml
    benchmarks/.scratch/obp-venv/bin/pip install --no-deps --ignore-requires-python obp==0.5.7

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/ope_vs_obp.py [--episodes 5000] [--seed 0] [--obp-python PATH]

The project side builds the inputs from the routing simulator (the synthetic collector's
behaviour: static table with epsilon 0.3) and a cross-fitted q_hat, writes them to
``benchmarks/.scratch/ope_vs_obp_inputs.npz``, and runs this same file with
``--obp-side`` in the obp virtualenv, which imports numpy and obp only. Results go to
``benchmarks/.scratch/ope_vs_obp.json``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "benchmarks" / ".scratch"
OBP_PYTHON = SCRATCH / "obp-venv" / "bin" / "python"
TOLERANCE = 1e-8
CLIP = 3.0  # a finite weight clip / switch threshold, so lambda_ is exercised too
SWITCH = 10.0
N_BOOT = 2000

# estimator -> (obp class, obp kwargs, needs q_hat)
OBP_ESTIMATORS = {
    "ips": ("InverseProbabilityWeighting", {}, False),
    "ips_clip3": ("InverseProbabilityWeighting", {"lambda_": CLIP}, False),
    "snips": ("SelfNormalizedInverseProbabilityWeighting", {}, False),
    "dm": ("DirectMethod", {}, True),
    "dr": ("DoublyRobust", {}, True),
    "dr_clip3": ("DoublyRobust", {"lambda_": CLIP}, True),
    "sndr": ("SelfNormalizedDoublyRobust", {}, True),
    "switch_dr": ("SwitchDoublyRobust", {}, True),
    "switch_dr_10": ("SwitchDoublyRobust", {"lambda_": SWITCH}, True),
    "switch_dr_clip3": ("SwitchDoublyRobust", {"lambda_": CLIP}, True),
}


# ---------------------------------------------------------------- obp side (obp virtualenv)
def obp_side(inputs: Path, output: Path) -> None:
    import obp
    from obp import ope as obp_ope

    d = np.load(inputs)
    policies = [str(p) for p in d["policies"]]
    out: dict[str, np.ndarray] = {}
    meta = {"obp_version": obp.__version__, "numpy": np.__version__}
    for p in policies:
        action_dist = d[f"pi_{p}"][:, :, None]  # obp: (n_rounds, n_actions, len_list)
        q_hat = d["q_hat"][:, :, None]
        for name, (cls, kwargs, needs_q) in OBP_ESTIMATORS.items():
            est = getattr(obp_ope, cls)(**kwargs)
            args = dict(action_dist=action_dist)
            if needs_q:
                args["estimated_rewards_by_reg_model"] = q_hat
            if name != "dm":
                args |= dict(reward=d["reward"], action=d["action"], pscore=d["pscore"])
            out[f"{p}/{name}/value"] = np.array(est.estimate_policy_value(**args))
            # estimate_policy_value is the mean of these; position 0 is what obp uses when None
            out[f"{p}/{name}/round"] = est._estimate_round_rewards(
                **args, position=np.zeros(len(action_dist), dtype=int))
            if name in ("ips", "snips", "dr", "sndr"):
                ci = est.estimate_interval(**args, alpha=0.05, n_bootstrap_samples=N_BOOT, random_state=0)
                out[f"{p}/{name}/ci"] = np.array([v for k, v in ci.items() if "CI" in k])
    np.savez(output, **out)
    print(json.dumps(meta))


# ---------------------------------------------------------------- project side
def make_inputs(episodes: int, seed: int) -> dict[str, np.ndarray]:
    from sage_pipeline.rl import ope
    from sage_pipeline.routing.catalogue import ModelCatalogue
    from sage_pipeline.routing.collector import simulate_episodes
    from sage_pipeline.routing.policy import EpsilonGreedyPolicy, StaticTablePolicy, UniformPolicy
    from sage_pipeline.routing.routing_simulator import RoutingSimulator, Tasks
    from sage_pipeline.sage.table import RoutingTable

    cat = ModelCatalogue.load()
    sim = RoutingSimulator(cat, RoutingTable.load())
    rng = np.random.default_rng(seed)
    tasks = sim.sample_tasks(episodes, rng)
    static = StaticTablePolicy(sim.table, cat)
    rows = simulate_episodes(sim, tasks, EpsilonGreedyPolicy(static, 0.3), rng)
    t = rows["task"]
    ctx = sim.contexts(Tasks(tasks.role[t], tasks.task_complexity_score[t], tasks.prompt_tokens[t]),
                       rows["step"], rows["primary_failure_count"])
    action = rows["action"].astype(np.int64)
    q_hat = ope.cross_fit_q(ctx, action, rows["reward"], t, sim.K, seed=seed)
    # a stochastic policy with uneven weights: softmax of noise over each role's candidates
    logits = np.where(sim.role_mask[ctx.role], rng.normal(0.0, 1.5, (len(ctx), sim.K)), -np.inf)
    soft = np.exp(logits - logits.max(axis=1, keepdims=True))
    pis = {"static_table": static.action_probs(ctx),
           "uniform": UniformPolicy(sim.actions, sim.role_mask).action_probs(ctx),
           "oracle": sim.oracle_policy().action_probs(ctx),
           "softmax_noise": soft / soft.sum(axis=1, keepdims=True)}
    return {"reward": rows["reward"], "action": action, "pscore": rows["propensity"], "q_hat": q_hat,
            "policies": np.array(list(pis)), **{f"pi_{k}": v for k, v in pis.items()}}


def ours(d: dict[str, np.ndarray], policy: str) -> dict[str, object]:
    from sage_pipeline.rl import ope

    r, a, p, q, pi = d["reward"], d["action"], d["pscore"], d["q_hat"], d[f"pi_{policy}"]
    return {
        "ips": ope.ips(r, a, p, pi), "ips_clip3": ope.ips(r, a, p, pi, lambda_=CLIP),
        "snips": ope.snips(r, a, p, pi),
        "dm": ope.dm(pi, q), "dr": ope.dr(r, a, p, pi, q), "dr_clip3": ope.dr(r, a, p, pi, q, lambda_=CLIP),
        "sndr": ope.sndr(r, a, p, pi, q), "switch_dr": ope.switch_dr(r, a, p, pi, q),
        "switch_dr_10": ope.switch_dr(r, a, p, pi, q, lambda_=SWITCH),
        "switch_dr_clip3": ope.switch_dr(r, a, p, pi, q, lambda_=CLIP),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--obp-python", type=Path, default=OBP_PYTHON)
    ap.add_argument("--obp-side", nargs=2, type=Path, metavar=("INPUTS", "OUTPUT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.obp_side:
        obp_side(*args.obp_side)
        return 0

    from sage_pipeline.rl import ope

    if not args.obp_python.exists():
        print(f"obp virtualenv not found at {args.obp_python}: create it with the commands at the top of "
              f"{Path(__file__).relative_to(ROOT)}", file=sys.stderr)
        return 2
    SCRATCH.mkdir(parents=True, exist_ok=True)
    inputs, output = SCRATCH / "ope_vs_obp_inputs.npz", SCRATCH / "ope_vs_obp_obp.npz"
    d = make_inputs(args.episodes, args.seed)
    np.savez(inputs, **d)
    proc = subprocess.run([str(args.obp_python), __file__, "--obp-side", str(inputs), str(output)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout, proc.stderr, sep="\n", file=sys.stderr)
        return 2
    meta = json.loads(proc.stdout.strip().splitlines()[-1])
    theirs = np.load(output)
    policies = [str(p) for p in d["policies"]]
    n = len(d["reward"])
    print(f"obp {meta['obp_version']} vs sage_pipeline.rl.ope on {n} logged decisions "
          f"({args.episodes} episodes, seed {args.seed}), policies: {', '.join(policies)}\n")
    print(f"{'estimator':16s} {'max |value diff|':>17s} {'max |round diff|':>17s}")
    report: dict[str, dict] = {"obp": meta, "decisions": n, "episodes": args.episodes, "seed": args.seed,
                               "estimators": {}, "values": {}, "intervals": {}}
    worst = 0.0
    ours_all = {p: ours(d, p) for p in policies}
    for name in OBP_ESTIMATORS:
        dv = max(abs(ours_all[p][name].value - float(theirs[f"{p}/{name}/value"])) for p in policies)
        dr_ = max(float(np.abs(ours_all[p][name].round_rewards - theirs[f"{p}/{name}/round"]).max())
                  for p in policies)
        worst = max(worst, dv, dr_)
        report["estimators"][name] = {"max_abs_value_diff": dv, "max_abs_round_diff": dr_}
        print(f"{name:16s} {dv:17.3e} {dr_:17.3e}")
    print("\nvalues (ours):")
    for p in policies:
        report["values"][p] = {k: e.value for k, e in ours_all[p].items()}
        print(f"  {p:14s} " + "  ".join(f"{k} {e.value:.4f}" for k, e in ours_all[p].items() if "_" not in k))
    print(f"\n95% bootstrap intervals, {N_BOOT} replicates (information only: different random streams; "
          "obp resamples SNIPS/SNDR round rewards with the full-sample mean weight frozen, "
          "ours recomputes the ratio)")
    for p in policies:
        for name in ("ips", "snips", "dr", "sndr"):
            ci = ope.bootstrap_ci(ours_all[p][name], n_boot=N_BOOT, seed=0)
            lo, hi = (float(x) for x in theirs[f"{p}/{name}/ci"])
            report["intervals"][f"{p}/{name}"] = {"ours": [ci.low, ci.high], "obp": [lo, hi]}
            print(f"  {p:14s} {name:6s} ours [{ci.low:.4f}, {ci.high:.4f}] width {ci.high - ci.low:.4f}   "
                  f"obp [{lo:.4f}, {hi:.4f}] width {hi - lo:.4f}")
    report["max_abs_diff"] = worst
    report["tolerance"] = TOLERANCE
    (SCRATCH / "ope_vs_obp.json").write_text(json.dumps(report, indent=2))
    verdict = "OK" if worst <= TOLERANCE else "FAIL"
    print(f"\nlargest difference {worst:.3e} (tolerance {TOLERANCE:g}): {verdict}")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(main())
