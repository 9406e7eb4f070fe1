"""The synthetic collector: runs SAGE's static table with epsilon-exploration in the
routing simulator and writes SAGE-format session logs (JSON lines).

Each session is one orchestrator run: ``SESSION_START``, then per task and attempt an
``AGENT_MESSAGE`` and a ``TRAJECTORY_STEP`` (with ``propensity`` and ``step``), then
``SESSION_END``. The logs go through exactly the same ingest as real logs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import msgspec
import numpy as np

from sage_pipeline import artifacts
from sage_pipeline.rl.policy import EpsilonGreedyPolicy, StaticTablePolicy, UniformPolicy, sample_actions
from sage_pipeline.routing.schema import ROLES, TRAJECTORY_STEP
from sage_pipeline.routing.simulator import RoutingSimulator, Tasks

log = logging.getLogger(__name__)

FILE_PREFIX = "synthetic_"
MANIFEST = "simulator.json"


@dataclass(frozen=True)
class CollectorConfig:
    # 20,000 episodes (5,000 sessions): the eval split's two halves then hold ~2,000 tasks each,
    # which OPE needs to rank CQL's alphas and to estimate a greedy policy within a few percent;
    # at 5,000 it could do neither reliably (docs/benchmarks.md, "Offline chain quality")
    episodes: int = 20_000
    seed: int = 0
    epsilon: float = 0.3
    sessions_per_file: int = 250
    mean_tasks_per_session: float = 4.0
    start_time: str = "2026-11-01T00:00:00+00:00"

    def __post_init__(self) -> None:
        if self.episodes < 1:
            raise ValueError(f"episodes must be >= 1, got {self.episodes}")
        if not 0.0 < self.epsilon <= 1.0:
            raise ValueError(f"epsilon must be in (0, 1] so every candidate has support, got {self.epsilon}")
        if self.sessions_per_file < 1:
            raise ValueError(f"sessions_per_file must be >= 1, got {self.sessions_per_file}")


@dataclass(frozen=True)
class CollectResult:
    files: list[Path]
    manifest: Path
    episodes: int
    sessions: int
    decisions: int
    events: int
    ground_truth: dict[str, float]
    ground_truth_by_role: dict[str, dict[str, float]]


def _session_sizes(n_tasks: int, mean: float, rng: np.random.Generator) -> np.ndarray:
    sizes = 1 + rng.poisson(max(mean - 1.0, 0.0), size=n_tasks)
    cut = int(np.searchsorted(np.cumsum(sizes), n_tasks)) + 1
    sizes = sizes[:cut]
    sizes[-1] -= int(sizes.sum()) - n_tasks
    return sizes[sizes > 0]


def simulate_episodes(sim: RoutingSimulator, tasks: Tasks, behaviour, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Roll every task's episode under ``behaviour``; returns one row per decision."""
    n, T = len(tasks), sim.config.max_attempts
    pfc = np.zeros(n, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    cols: dict[str, list[np.ndarray]] = {}
    for t in range(T):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        sub = Tasks(tasks.role[idx], tasks.task_complexity_score[idx], tasks.prompt_tokens[idx])
        ctx = sim.contexts(sub, np.full(idx.size, t), pfc[idx])
        probs = behaviour.action_probs(ctx)
        a = sample_actions(probs, rng)
        out = sim.sample_outcome(ctx, a, rng)
        terminal = out["verification_passed"] | (t == T - 1)
        row = {"task": idx, "step": ctx.step, "action": a, "propensity": probs[np.arange(idx.size), a],
               "primary_failure_count": ctx.primary_failure_count, "failure_count": ctx.failure_count,
               "prompt_tokens": ctx.prompt_tokens, "terminal": terminal, **out}
        for k, v in row.items():
            cols.setdefault(k, []).append(np.asarray(v))
        failed = ~out["verification_passed"]
        pfc[idx] += failed & (a == sim.primary[sub.role])
        active[idx[terminal]] = False
    return {k: np.concatenate(v) for k, v in cols.items()}


def collect(sim: RoutingSimulator, out_dir: str | Path, config: CollectorConfig = CollectorConfig(),
            progress: Callable[[str], None] = log.info) -> CollectResult:
    """Simulate ``config.episodes`` episodes and write them as SAGE session logs."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(config.seed)
    static = StaticTablePolicy(sim.table, sim.catalogue)
    behaviour = EpsilonGreedyPolicy(static, config.epsilon)
    tasks = sim.sample_tasks(config.episodes, rng)
    rows = simulate_episodes(sim, tasks, behaviour, rng)
    sizes = _session_sizes(config.episodes, config.mean_tasks_per_session, rng)
    first_task = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    progress(f"simulated {config.episodes} episodes, {len(rows['task'])} decisions, {len(sizes)} sessions")

    order = np.lexsort((rows["step"], rows["task"]))  # by task, then attempt
    rows = {k: v[order] for k, v in rows.items()}
    bounds = np.searchsorted(rows["task"], np.arange(config.episodes + 1))
    t0 = datetime.fromisoformat(config.start_time).astimezone(timezone.utc)
    enc = msgspec.json.Encoder()
    actions = sim.actions
    files: list[Path] = []
    n_events = 0
    n_files = (len(sizes) + config.sessions_per_file - 1) // config.sessions_per_file
    for f_i in range(n_files):
        lines: list[bytes] = []
        for s in range(f_i * config.sessions_per_file, min((f_i + 1) * config.sessions_per_file, len(sizes))):
            sid = f"syn-{config.seed}-{s:06d}"
            clock = t0 + timedelta(minutes=7 * s)
            stamp = lambda c: c.isoformat(timespec="milliseconds").replace("+00:00", "Z")  # noqa: E731
            lines.append(enc.encode({"type": "SESSION_START", "timestamp": stamp(clock), "session_id": sid,
                                     "extra": {"synthetic": True, "collector": "sage_pipeline.routing.collector"}}))
            for j in range(sizes[s]):
                task = first_task[s] + j
                role = ROLES[tasks.role[task]]
                tid = f"{sid}-t{j:02d}"
                for r in range(bounds[task], bounds[task + 1]):
                    clock += timedelta(seconds=float(rows["latency_s"][r]))
                    model = actions[rows["action"][r]]
                    timed_out = bool(rows["timed_out"][r])
                    passed = bool(rows["verification_passed"][r])
                    lines.append(enc.encode({
                        "type": "AGENT_MESSAGE", "timestamp": stamp(clock), "session_id": sid, "task_id": tid,
                        "agent": role, "content": f"{role} attempt {int(rows['step'][r])} on {tid} via {model}"}))
                    lines.append(enc.encode({
                        "type": TRAJECTORY_STEP, "timestamp": stamp(clock), "session_id": sid, "task_id": tid,
                        "agent": role, "step": int(rows["step"][r]),
                        "action": {"model_chosen": model},
                        "propensity": round(float(rows["propensity"][r]), 10),
                        "state": {
                            "task_complexity_score": float(tasks.task_complexity_score[task]),
                            "primary_failure_count": int(rows["primary_failure_count"][r]),
                            "failure_count": int(rows["failure_count"][r]),
                            "prompt_tokens": int(rows["prompt_tokens"][r]),
                            "verification_passed": passed,
                            "timed_out": timed_out,
                            "failed_reason": "timeout" if timed_out else (None if passed else "verification_failed"),
                            "reviewer_score": float(rows["reviewer_score"][r]),
                            "latency_s": round(float(rows["latency_s"][r]), 3),
                            "cost_usd": round(float(rows["cost_usd"][r]), 6),
                        },
                        "reward": round(float(rows["reward_v1"][r]), 6),
                        "terminal": bool(rows["terminal"][r]),
                        "extra": {"synthetic": True, "reward_version": "reward_v1"},
                    }))
            lines.append(enc.encode({"type": "SESSION_END", "timestamp": stamp(clock), "session_id": sid}))
        path = out_dir / f"{FILE_PREFIX}seed{config.seed}_part{f_i:04d}.jsonl"
        artifacts.write_bytes(path, b"\n".join(lines) + b"\n")
        files.append(path)
        n_events += len(lines)
    for stale in sorted(set(out_dir.glob(f"{FILE_PREFIX}*.jsonl")) - set(files)):
        stale.unlink()
    progress(f"wrote {n_events} events to {len(files)} files in {out_dir}")

    values = {
        "static_table": sim.policy_value(static, tasks),
        "behaviour": sim.policy_value(behaviour, tasks),
        "uniform": sim.policy_value(UniformPolicy(actions, sim.role_mask), tasks),
        "oracle": sim.optimal_value(tasks),
    }
    gt = {k: v.mean for k, v in values.items()}
    by_role = {k: v.by_role(tasks) for k, v in values.items()}
    manifest = artifacts.write_json(out_dir / MANIFEST, {
        "collector": asdict(config),
        "simulator": sim.config.to_dict(),
        "model_catalogue": {"path": sim.catalogue.source, "sha256": _sha(sim.catalogue.source)},
        "routing_table": {"path": sim.table.source, "sha256": _sha(sim.table.source)},
        "episodes": config.episodes, "sessions": int(len(sizes)), "decisions": int(len(rows["task"])),
        "files": [p.name for p in files],
        "ground_truth_value": gt, "ground_truth_value_by_role": by_role,
    })
    return CollectResult(files, manifest, config.episodes, int(len(sizes)), int(len(rows["task"])), n_events, gt, by_role)


def _sha(path: str) -> str | None:
    p = Path(path)
    return artifacts.file_sha256(p) if p.is_file() else None
