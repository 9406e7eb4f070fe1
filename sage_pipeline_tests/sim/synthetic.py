"""Small synthetic task suites for the environment's tests (and the benchmark when
``sim_tasks``/``sandbox_rollouts`` have not been materialized): TaskRecords and a rollout
frame whose outcome kinds follow each candidate's kind. Nothing is executed; the
environment only reads outcome kinds from the cache, so this is all it needs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from sage_pipeline.sim.schema import Candidate, TaskRecord, cache_key, split_of

FAMILIES = ("strings", "lists", "dicts", "parsing", "arithmetic", "recursion")
KIND_OUTCOME = {"reference": "pass", "off_by_one": "wrong_answer", "wrong_operator": "wrong_answer",
                "missed_edge_case": "wrong_answer", "wrong_type": "wrong_answer", "exception": "exception",
                "infinite_loop": "timeout", "memory_blowup": "oom"}
WRONG_KINDS = tuple(k for k in KIND_OUTCOME if k != "reference")


def synthetic_suite(n_tasks: int = 120, seed: int = 0, families: tuple[str, ...] = FAMILIES,
                    equivalent_share: float = 0.1) -> tuple[list[TaskRecord], pd.DataFrame]:
    rng = np.random.default_rng(seed)
    tasks, rows = [], []
    for i in range(n_tasks):
        fam = families[i % len(families)]
        task_id = f"{fam}-{i:04d}"
        d = float(np.round(rng.beta(1.6, 1.6), 4))
        prompt = f"Write f for task {task_id}. " + "Explain the edge cases. " * int(rng.integers(2, 40))
        tests = [{"args": [j], "expected": j + i} for j in range(3)]
        kinds = rng.choice(WRONG_KINDS, size=int(rng.integers(3, 6)), replace=False)
        cands = [Candidate(f"{task_id}/reference", "reference", f"def f(x):\n    return x + {i}\n")]
        for m, k in enumerate(kinds):
            eq = bool(rng.random() < equivalent_share)
            cands.append(Candidate(f"{task_id}/{k}", str(k), f"def f(x):\n    return x + {i}  # {k} {m}\n", eq))
        t = TaskRecord(task_id=task_id, family=fam, difficulty=d, difficulty_level=("easy", "medium", "hard")[
            min(2, int(d * 3))], prompt=prompt, signature="def f(x: int) -> int", entry_point="f",
            reference=cands[0].code, tests=tests, timeout_s=1.0, candidates=cands, split=split_of(task_id))
        tasks.append(t)
        for c in cands:
            outcome = "pass" if c.equivalent else KIND_OUTCOME[c.kind]
            rows.append({"task_id": task_id, "candidate_id": c.candidate_id, "candidate_kind": c.kind,
                         "equivalent": c.equivalent, "cache_key": cache_key(c.code, t.entry_point, t.tests),
                         "outcome": outcome,
                         "passed": outcome == "pass", "tests_passed": 3 if outcome == "pass" else 1,
                         "tests_total": 3, "runtime_s": 0.01, "output_excerpt": "", "backend": "synthetic"})
    return tasks, pd.DataFrame(rows)


def write_rollouts(df: pd.DataFrame, folder: Path, shards: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for s, part in enumerate(np.array_split(np.arange(len(df)), shards)):
        df.iloc[part].to_parquet(folder / f"shard-{s:03d}.parquet", index=False)
    return folder
