"""SAGE's own A/B, ``sage bench --compare-policy``, against the model world, beside the world's truth
for the same checkpoint.

What SAGE's bench is (``sage/benchmarks/runner.py``, read in SAGE's source): its six fixed prompts
(``benchmarks/tasks/*.yaml``) each run once through the whole ``sage run`` workflow with
``SAGE_RL_POLICY=0`` (the "static" arm), then once more with ``SAGE_RL_POLICY=1`` (the "learned"
arm: ``SAGE_RL_CHECKPOINT``), all twelve in one folder; it prints the mean of eight metrics per arm
and their difference, with no interval and no repeat. Its ``test_pass_rate`` is the share of the
plan's tasks that SAGE's verification gate completed. The arms are not alike: the learned arm runs
second, in the folder the static arm left, so SAGE's coder bandit (which no checkpoint reaches) has
moved on to other models and the arm finds the static arm's files (in the world: the tests its test
engineer wrote, so SAGE's gate skips the test engineer and its second review). Both are given: the
exact difference as SAGE ran the arms, and like for like (each case's learned run with the static
run's coder model and no file of it), which is the checkpoint's own effect.

The world cannot know those prompts' tasks, so with ``adopt_unmarked`` it makes each prompt a run of
one of its verified tasks (by a hash of the prompt: the same task in both arms), and its planner
plans that task; everything after is SAGE's flow as in ``sage run``. Then, per arm: SAGE's reported
``test_pass_rate``, the share of those runs that ended with the right file (the world saw it), and
their exact expected chance of ending verified under the arm's policy (:mod:`truth`); and for the
difference: SAGE's delta, a paired bootstrap interval over its six cases (SAGE reports none), and
the exact difference on the same six tasks.
"""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sage_pipeline import artifacts
from sage_pipeline.sage_world import truth as T
from sage_pipeline.sage_world.harness import SageInstall, sage_env
from sage_pipeline.sage_world.world import ModelWorld

log = logging.getLogger(__name__)
METRIC = "test_pass_rate"


def _sessions_in_order(sessions: Path) -> list[dict]:
    """Per SAGE session of the folder's journals, in order of first line: its id and the complexity
    its reviewer routing logged."""
    out: dict[str, dict] = {}
    for f in sorted(sessions.glob("*.log")):
        for ln in f.read_text(encoding="utf-8", errors="replace").splitlines():
            if not ln.startswith("{"):
                continue  # SAGE's plain-text lines ([ts] CHECKPOINT ...)
            try:
                ev = json.loads(ln)
            except json.JSONDecodeError:
                continue  # a torn line tells nothing about sessions; the pairing check below counts what is left
            sid = ev.get("session_id")
            if not sid:
                continue
            rec = out.setdefault(sid, {"session": sid, "complexity": None})
            if (rec["complexity"] is None and ev.get("type") == "MODEL_ROUTING_DECISION"
                    and ev.get("agent_role") in ("reviewer", "debugger")):
                rec["complexity"] = float(ev.get("task_complexity_score") or 0.0)
    return list(out.values())


def run_sage_bench(world: ModelWorld, ollama_host: str, install: SageInstall, root: str | Path,
                   checkpoint: str | Path, min_confidence: float, timeout_s: float = 900.0,
                   n_boot: int = 2000, seed: int = 0, progress: Callable[[str], None] = log.info) -> dict:
    """Run ``sage bench --compare-policy --out`` in ``root`` (a fresh folder) against the world (which
    must adopt unmarked goals) with ``checkpoint`` for the learned arm; returns SAGE's result beside
    the world's."""
    if not world.config.adopt_unmarked:
        raise ValueError("the world must adopt unmarked goals (WorldConfig(adopt_unmarked=True)): SAGE's bench "
                         "prompts carry no run mark")
    root = Path(root)
    ws = root / "ws"
    ws.mkdir(parents=True)
    env = sage_env(install, ollama_host, root / "home", root / "bin", checkpoint, min_confidence)
    start = len(world.adopted)
    progress(f"sage bench --compare-policy against the model world, learned arm {checkpoint}")
    out = subprocess.run([str(install.cli), "bench", "--compare-policy", "--out", str(root / "bench.json")],
                         cwd=ws, env=env, capture_output=True, text=True, timeout=timeout_s)
    artifacts.write_text(root / "bench.log",
                         f"rc={out.returncode}\n--- stdout\n{out.stdout}\n--- stderr\n{out.stderr}\n")
    if out.returncode != 0 or not (root / "bench.json").is_file():
        raise RuntimeError(f"sage bench failed (exit {out.returncode}): {(out.stderr or out.stdout).strip()[-300:]}; "
                           f"see {root / 'bench.log'}")
    result = json.loads((root / "bench.json").read_text(encoding="utf-8"))
    arms = {a: result["compare"][a]["benchmarks"] for a in ("static", "learned")}
    runs = world.adopted[start:]
    sessions = _sessions_in_order(ws / "memory" / "sessions")
    n_cases = len(arms["static"])
    if len(runs) != 2 * n_cases or len(sessions) != 2 * n_cases:
        raise RuntimeError(f"sage bench ran {len(runs)} planned runs and {len(sessions)} sessions for "
                           f"{n_cases} cases x 2 arms: cannot pair them (see {root / 'bench.log'})")
    policies = {"static": T.SagePolicy(world.table),
                "learned": T.SagePolicy.load(world.table, checkpoint, min_confidence, name=str(checkpoint))}
    per_arm: dict[str, dict] = {}
    for k, arm in enumerate(("static", "learned")):
        rows = []
        for i, case in enumerate(arms[arm]):
            run, sess = runs[k * n_cases + i], sessions[k * n_cases + i]
            coder, tests = world.coder_model(run["run"]), world.tests_at_start(run["run"])
            known = coder is not None and sess["complexity"] is not None

            exp = (T.run_value(world, world.by_id[run["task_id"]], coder, sess["complexity"], policies[arm],
                               tests).p_verified if known else None)
            rows.append({"case": case["name"], "run": run["run"], "task_id": run["task_id"],
                         "sage_" + METRIC: float(case["metrics"][METRIC]), "status": case["status"],
                         "right_file": world.final_right(run["run"]), "coder_model": coder,
                         "complexity": sess["complexity"], "tests_at_start": tests, "expected_verified": exp})
        per_arm[arm] = {"cases": rows}
    # like for like: each case's learned run as if it had the static run's coder model (SAGE's bandit, which
    # the checkpoint never reaches, moved on between the arms) and found no file of it: the checkpoint's effect
    for arm in ("static", "learned"):
        for r, s in zip(per_arm[arm]["cases"], per_arm["static"]["cases"], strict=True):
            ok = s["coder_model"] is not None and s["complexity"] is not None
            r["expected_verified_fresh"] = (T.run_value(world, world.by_id[s["task_id"]], s["coder_model"],
                                                        s["complexity"], policies[arm]).p_verified if ok else None)
    for arm in ("static", "learned"):
        rows = per_arm[arm]["cases"]
        per_arm[arm] |= {"sage_mean": float(np.mean([r["sage_" + METRIC] for r in rows])),
                         "right_share": float(np.mean([r["right_file"] for r in rows]))}
        for key in ("expected_verified", "expected_verified_fresh"):
            vals = [r[key] for r in rows]
            per_arm[arm][key.replace("verified", "mean")] = (float(np.mean(vals)) if None not in vals else None)
    d = np.array([b["sage_" + METRIC] - a["sage_" + METRIC]
                  for a, b in zip(per_arm["static"]["cases"], per_arm["learned"]["cases"], strict=True)])
    rng = np.random.default_rng(seed)
    boot = d[rng.integers(0, len(d), size=(n_boot, len(d)))].mean(axis=1)
    lo, hi = (float(x) for x in np.quantile(boot, [0.025, 0.975]))
    def delta(key: str) -> float | None:
        a, b = per_arm["static"][key], per_arm["learned"][key]
        return None if a is None or b is None else b - a

    true_delta = delta("expected_mean")
    report = {"metric": METRIC, "cases": n_cases, "arms": per_arm,
              "sage_delta": float(result["compare"]["summary"][METRIC]["delta"]),
              "sage_reports_interval": False,
              "bootstrap_ci_of_sage_delta": [lo, hi], "true_delta_same_tasks": true_delta,
              # SAGE runs the learned arm second, in the static arm's folder: its coder bandit has moved on and it
              # finds that arm's files; like for like, the checkpoint's own effect on the same tasks
              "true_delta_same_tasks_fresh": delta("expected_mean_fresh"),
              "agrees": None if true_delta is None else bool(lo <= true_delta <= hi),
              "sage_output": str(root / "bench.json")}
    artifacts.write_json(root / "comparison.json", report)
    return report


