"""Env steps per second of the code-task batch environments, today's code beside an earlier commit.

Issue 18 made both batch environments ``gymnasium.vector.VectorEnv`` subclasses and asked that
they not get slower (``ppo_vs_sb3.py`` steps them for both learners). This measures, side by
side in one run:

* the escalation env (``sim.env.CodeTaskVecEnv``) on ``--baseline`` (default: the commit before
  the VectorEnv change, whose env was a plain class) and on today's working tree, alternated
  ``--repeats`` times, each time in a fresh process, best of 3 timings each;
* the SAGE-loop env (``sim.loop_env.SageLoopVecEnv``, the ``ppo_policy`` asset's default; it
  did not exist at the baseline) on today's tree.

Each env steps ``--n-envs`` episodes with uniformly random actions for ``--steps`` steps on
the tests' synthetic suite (1,200 tasks; no sandbox needed). The baseline is checked out with
``git worktree`` into a temporary folder and removed afterwards.

    .venv/bin/python benchmarks/env_speed.py [--baseline 2252cb2~1] [--repeats 4] [--steps 400]
        [--n-envs 256] [--loop-envs 128]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Run in a fresh interpreter with the measured tree first on sys.path; prints one JSON line.
PROBE = r"""
import json, sys, time
root, env_name, n_envs, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
sys.path.insert(0, root)
import numpy as np
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.sage.table import RoutingTable
from sage_pipeline_tests.sim.synthetic import synthetic_suite
tasks, rollouts = synthetic_suite(1200, seed=0)
if env_name == "escalation":
    from sage_pipeline.sim.env import CodeTaskSim, CodeTaskVecEnv
    sim = CodeTaskSim.build(tasks, rollouts, ModelCatalogue.load(), RoutingTable.load())
    make = lambda: CodeTaskVecEnv(sim, n_envs=n_envs, seed=0)
else:
    from sage_pipeline.sim.loop_env import SageLoopSim, SageLoopVecEnv
    sim = SageLoopSim.build(tasks, rollouts)
    make = lambda: SageLoopVecEnv(sim, n_envs=n_envs, seed=0)
import sage_pipeline
assert sage_pipeline.__file__.startswith(root), (sage_pipeline.__file__, root)
rng = np.random.default_rng(0)
acts = rng.integers(0, len(sim.actions), size=(steps, n_envs))
best = 0.0
for _ in range(3):
    env = make()
    env.step(acts[0])  # first call outside the timing
    t0 = time.perf_counter()
    for a in acts:
        env.step(a)
    best = max(best, steps * n_envs / (time.perf_counter() - t0))
print(json.dumps({"env": env_name, "steps_per_s": best}))
"""


def probe(root: Path, env: str, n_envs: int, steps: int) -> float:
    out = subprocess.run([sys.executable, "-c", PROBE, str(root), env, str(n_envs), str(steps)], cwd=root,
                         check=True, capture_output=True, text=True, env=os.environ | {"OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout.strip().splitlines()[-1])["steps_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", default="2252cb2~1", help="git ref of the earlier code (default: before the "
                    "batch envs became VectorEnvs)")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--n-envs", type=int, default=256, help="escalation env: episodes stepped together")
    ap.add_argument("--loop-envs", type=int, default=128, help="SAGE-loop env: episodes stepped together")
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; baseline {a.baseline}")
    with tempfile.TemporaryDirectory(prefix="env_speed-") as tmp:
        base = Path(tmp) / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), a.baseline], cwd=ROOT, check=True)
        try:
            rows = {"baseline": [], "today": [], "loop": []}
            for i in range(a.repeats):  # alternated, so a change of load hits both sides
                rows["baseline"].append(probe(base, "escalation", a.n_envs, a.steps))
                rows["today"].append(probe(ROOT, "escalation", a.n_envs, a.steps))
                rows["loop"].append(probe(ROOT, "sage_loop", a.loop_envs, a.steps))
                print(f"repeat {i + 1}: escalation baseline {rows['baseline'][-1]:,.0f}, today "
                      f"{rows['today'][-1]:,.0f}; SAGE loop today {rows['loop'][-1]:,.0f} env steps/s", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    med = {k: statistics.median(v) for k, v in rows.items()}
    print(f"\nmedian env steps/s: escalation env ({a.n_envs} episodes) baseline {med['baseline']:,.0f} "
          f"[{min(rows['baseline']):,.0f}-{max(rows['baseline']):,.0f}], today {med['today']:,.0f} "
          f"[{min(rows['today']):,.0f}-{max(rows['today']):,.0f}]: ratio today / baseline "
          f"{med['today'] / med['baseline']:.2f}x; SAGE-loop env ({a.loop_envs} episodes) today {med['loop']:,.0f} "
          f"[{min(rows['loop']):,.0f}-{max(rows['loop']):,.0f}]; load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
