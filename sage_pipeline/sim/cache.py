"""The execution cache: what the sandbox verified, keyed by the candidate's code and tests.

Re-runs and later on-line rollouts execute only what is new. The cache is a folder of
append-only JSON-lines segments (``datasets/sim/cache/``): every writer (a rollout shard,
an environment) adds its own segment atomically, so shards running at once on several
machines never write the same file. Readers merge all segments. An entry records the
backend that produced it; a Docker sandbox does not trust entries made by the unisolated
local backend (they are executed again), while the local backend accepts both.

A verdict holds only for the sandbox that made it: every stored key is the job's key
(:attr:`ExecJob.key`) and the sandbox's ``ISOLATION_VERSION`` (``<key>@isolation-<n>``), so
entries written before a change of isolation are never found again (counted in ``stale``,
dropped by :meth:`ExecutionCache.compact`) and those jobs are executed anew.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from sage_pipeline import artifacts
from sage_pipeline.sim.sandbox import ISOLATION_VERSION
from sage_pipeline.sim.schema import OUTCOME_KINDS, ExecJob, ExecResult

CACHE_DIR = "cache"
SEGMENT_GLOB = "segment-*.jsonl"
KEY_SUFFIX = f"@isolation-{ISOLATION_VERSION}"


def stored_key(key: str) -> str:
    """The key an entry is stored under: the job's key and the sandbox's isolation version."""
    return key + KEY_SUFFIX


class ExecutionCache:
    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self._entries: dict[str, tuple[ExecResult, str]] = {}
        self._pending: dict[str, tuple[ExecResult, str]] = {}
        self.bad_lines = 0
        self.stale = 0  # entries made under another isolation version: never trusted
        self.reload()

    def reload(self) -> None:
        self._entries.clear()
        self.bad_lines = self.stale = 0
        if not self.folder.is_dir():
            return
        for seg in sorted(self.folder.glob(SEGMENT_GLOB)):
            with open(seg, encoding="utf-8") as fh:
                for line in fh:
                    try:
                        d = json.loads(line)
                        res = ExecResult(**d["result"])
                        if res.outcome not in OUTCOME_KINDS:
                            raise ValueError(res.outcome)
                        if not d["key"].endswith(KEY_SUFFIX):
                            self.stale += 1
                            continue
                        self._entries[d["key"]] = (res, d["backend"])
                    except (ValueError, KeyError, TypeError):
                        self.bad_lines += 1  # a damaged entry is executed again, never trusted

    def __len__(self) -> int:
        return len(self._entries) + len(self._pending)

    def get(self, key: str, backend: str) -> ExecResult | None:
        """The verdict on job ``key`` made by this sandbox's isolation version, if any (a Docker
        sandbox takes only Docker's verdicts)."""
        key = stored_key(key)
        hit = self._pending.get(key) or self._entries.get(key)
        if hit is None:
            return None
        res, made_by = hit
        if backend == "docker" and made_by != "docker":
            return None
        return res

    def put(self, key: str, result: ExecResult, backend: str) -> None:
        self._pending[stored_key(key)] = (result, backend)

    def flush(self) -> Path | None:
        """Write what was added since the last flush as a new segment (atomically)."""
        if not self._pending:
            return None
        # Names sort by creation time (nanoseconds), so on reload a later answer wins.
        name = f"segment-{time.time_ns():020d}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
        path = self.folder / name
        with artifacts.atomic_open(path) as fh:
            for key, (res, backend) in self._pending.items():
                fh.write(json.dumps({"key": key, "backend": backend, "result": asdict(res)},
                                    separators=(",", ":")) + "\n")
        self._entries.update(self._pending)
        self._pending.clear()
        return path

    def compact(self) -> Path | None:
        """Merge every segment into one (fewer files to read); atomic, safe to re-run."""
        self.flush()
        segments = sorted(self.folder.glob(SEGMENT_GLOB))
        if len(segments) <= 1:
            return segments[0] if segments else None
        self._pending = dict(self._entries)
        path = self.flush()
        for seg in segments:
            seg.unlink()
        return path


def execute_cached(run: Callable[[list[ExecJob]], list[ExecResult]], backend: str, cache: ExecutionCache,
                   jobs: Sequence[ExecJob]) -> tuple[list[ExecResult], dict]:
    """Results for every job: from the cache where possible, the rest through ``run``.

    Identical jobs are executed once. Returns the results (in order) and counts:
    ``hits``, ``executed``.
    """
    keys = [j.key for j in jobs]
    results: list[ExecResult | None] = [cache.get(k, backend) for k in keys]
    todo: dict[str, ExecJob] = {}
    for k, j, r in zip(keys, jobs, results):
        if r is None and k not in todo:
            todo[k] = j
    if todo:
        fresh = run(list(todo.values()))
        for k, r in zip(todo, fresh):
            cache.put(k, r, backend)
        cache.flush()
        results = [r if r is not None else cache.get(k, backend) for k, r in zip(keys, results)]
    hits = sum(1 for k in keys if k not in todo)
    return results, {"hits": hits, "executed": len(todo)}  # type: ignore[return-value]
