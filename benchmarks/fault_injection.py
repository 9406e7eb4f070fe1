"""Fault injection: bad lines and files, kill -9, concurrent runs, a misbehaving LLM server.

Issue 17's acceptance run. Eight categories of trials, each checked against what must hold:

1. ``fuzz``: sets of SAGE-shaped session journals (``TRAJECTORY_STEP``,
   ``MODEL_ROUTING_DECISION``, ``TOKEN_USAGE``, ``SESSION_START``/``END``, other types, blank
   and CRLF lines) with poison lines (integers past 2**63, escaped lone surrogates, 10,000
   levels of nesting, 5,000-digit numbers, non-UTF-8 bytes, truncated lines, NaN, over-long
   lines, duplicates, wrong types), ``.jsonl.gz`` files that are intact, truncated, corrupt,
   not gzip or followed by garbage, a symlinked folder, a link loop and an unreadable folder
   (when run as root, the ingest runs as ``nobody`` so the folder really is unreadable).
   Through ``sage_pipeline.routing.ingest``: it must not raise; ``accepted + quarantined ==
   read``; ``read`` equals the lines an exact reader finds (a damaged gzip: the complete
   lines a byte-by-byte decompressor recovers, plus one record for the rest); every valid
   line written (and recoverable) is accepted and every poison line quarantined; damaged
   files and the unreadable folder are named.
2. ``kill``: ``kill -9`` of a materialization's process group at a random delay, per writer
   asset (synthetic_sessions, trajectories, routing_dataset, reward_report, bc_policy,
   cql_policy, offline_eval, sage_router_checkpoint, sim_tasks, sandbox_rollouts on the
   Docker and on the local sandbox, ppo_policy and routing_benchmark (issue 35: each writes its
   checkpoint, plot and report as one set), and ``sleep_cycle/sage_skills``, SAGE's night on the
   project's SAGE skills root, on the shipped SAGE week), on a temporary
   ``SAGE_DATA_DIR`` and ``DAGSTER_HOME``. Each run is the real asset
   materialized by ``dagster.materialize`` on that instance, in a process forked from a
   runner that imported the definitions once (so a trial takes the asset's time, not
   Dagster's import time); the fork calls ``setsid`` first, exactly as
   ``start_new_session=True`` does, and the kill is ``os.killpg(pid, SIGKILL)``: on even
   trials at a delay drawn uniformly from 30-100% of the asset's last complete run, on odd
   trials 0-20 ms after the run's first temporary file or folder appears (a write has
   begun). For the assets named in ``--cli-assets`` the last trial kills the ``dagster asset
   materialize`` CLI itself, started with ``start_new_session=True``, and re-runs with the
   CLI. After the kill every artifact
   must read completely (Parquet, JSON, JSON lines, PNG, npz, joblib; checkpoints through
   ``rl.load_policy``; the synthetic set against its ``simulator.json``; the SAGE skills root
   whole: its history, every version folder's files hashing to the version's id, the live
   pointer at the history's last version or the one before, a switch the next change
   finishes) and be the old version or the new one (what a plain
   re-run with the same config writes), and all of an asset's files one run's set (no
   mix of old and new files); the plain re-run must succeed with no clean-up, and
   afterwards no temporary file or folder may be left anywhere under the root. For the
   assets that run code in a sandbox, within 20 s of the kill no container labelled by the
   killed run and no local runner of a dead host may remain, and after the re-run no
   local work folder of a dead host.

   Ported for issue 48 (the generic sleep engine and its ``sleep_cycle/reviewer`` and
   ``sleep_cycle/coder`` assets were removed): the asset's night runs on the shipped week with
   no model configured, so it harvests and ends ``no_model`` (``no_tasks`` while the week
   ships no goal ledger, SAGE logging no goal) and commits nothing; a kill lands in the week's
   verification, the online check's report, the harvest, the decision ledger and the skills
   lever's plan, and the night's diagnostics. The coder's night that judged candidate code in
   the sandbox has no equivalent there (the SAGE night replays the coder only on harvested
   tasks, and the harvest validates SAGE's tests in the sandbox only when it has tasks); the
   asset stays in the sandbox checks for when it has. What a kill *inside a commit* does is
   the ``sage night commit`` kill trials' (``--night-kills``): ``run_sage_night`` in a child on
   SAGE-shaped tasks (as ``sage_pipeline_tests/sleep/test_sage_night.py`` builds them; a
   scripted chat whose answers a rule improves and a scripted judge, so nothing runs code)
   whose per-night gate accepts a rule and commits it, killed on even trials at 30-100% of a
   complete night, on odd ones 0-20 ms after the commit's version folder starts being
   written: the live version must be whole and the old or the new one, and the plain re-run
   of the night must succeed with no clean-up, leaving the new version live and nothing
   temporary behind.
3. ``concurrent``: two materializations of the same asset at once (two configs where the
   asset has one): both must succeed, and every artifact must then be one run's complete
   version, with no temporary files left.
4. ``backend``: SAGE nights (``run_sage_night`` on SAGE-shaped tasks, through the ``openai``
   client ``SageSkillsSettings(backend="openai", openai=...)`` makes) against an
   OpenAI-compatible server on 127.0.0.1 that trickles its
   body or its headers, answers 500, 429 with a day-long Retry-After, non-JSON, non-UTF-8,
   an empty body, a cut-off body, resets the connection, never answers, or replies with
   ``"usage": 5``, no ``choices``, a non-string ``content`` or 100,000 levels of nesting,
   and a port nobody listens on: each night must end ``backend_error`` within its bound
   (``(max_retries + 1) * timeout_s`` plus the capped waits, plus 1.5 s), its
   ``diagnostics.json`` must say so with the cause and the calls' errors (not an earlier
   night's healthy result), the root's live version must be unchanged and whole, and the
   root's night lock free. (The generic night called its model on its own documents; the
   SAGE night calls it only with harvested tasks, and the asset's on the shipped week has
   none, so the trial calls ``run_sage_night`` itself with the client the asset's config
   makes, on the benchmark's SAGE-shaped tasks.)
   ``night`` (new with the port): another night of the same root holds its night lock (a
   process of its own): the night waits its ``lock_timeout_s`` and ends with the recorded
   status ``conflict`` (the generic cycle raised), diagnostics saying so, the live version
   unchanged, and the next night runs once the lock is free; and each of 10 bad configs of
   ``sleep_cycle/sage_skills`` (``SageSkillsSettings``, which the asset's Dagster config is,
   section by section) is refused with an error naming the field.
5. ``pool``: a ``sleep_cycle/sage_skills`` night launched through a ``dagster-daemon`` (run
   monitoring as shipped in ``.dagster_home/dagster.yaml``, its poll interval and slot
   delay shortened) holds the ``sleep_cycle`` pool's only slot while it hangs; its run
   worker is killed with -9; the dead run must be marked failed and the night queued behind
   it must then get the slot and succeed. The night hangs on its root's night lock, which
   the benchmark holds and lets go right after the kill (the generic night hung on its LLM
   call; the SAGE night on the shipped week reaches no model call, having no task). Only
   with ``--pool`` (a minute or two: the daemon, its code server and two run workers each
   load the definitions); the same case with
   a toy pooled job runs in the test suite (``sage_pipeline_tests/defs/test_run_monitoring.py``).
   A pooled run executed inside the CLI (``dagster asset materialize``) and killed with -9 has
   no code server to notice: the next run's executor reaps it (``cli_pool``, below); the kill
   trials use an instance without the pool limit.

6. ``disk`` (issue 35): a full disk, as root on a real tmpfs filled but for a random few KB:
   a set of files written as one (``artifacts.atomic_set``) for ``trajectories`` and
   ``routing_dataset`` must fail with an error naming the path and the asset (never a bare
   ``[Errno 28]``), leave the previous set whole and leave no version half-written; for
   ``sleep_cycle/sage_skills`` (whose night writes single files, no set: the generic night's
   set is gone) a commit of its SAGE skills root, a version folder written whole, must fail
   the same way and leave the live version whole and unchanged, no staging folder left, and
   go through once the disk is freed. Skipped (and said so) when not root.
7. ``cli_pool`` (issue 35): a pooled ``dagster asset materialize`` run (a toy asset in a pool of
   one slot, on the project's executor, ``run_reaper.reaping``) is killed with -9 while it holds
   the slot; the next plain CLI run must finish within 60 s, with the dead run marked failed.

Results: the table is printed and written with every trial to ``<scratch>/fault_injection.json``;
``--scratch`` (default: a fresh temporary folder) is where everything is written, so the
benchmark runs from a read-only clone.

    .venv/bin/python benchmarks/fault_injection.py [--trials-per-asset 5] [--concurrent-per-asset 2]
        [--fuzz-trials 120] [--backend-rounds 2] [--cli-assets A,B|all] [--no-cli] [--pool]
        [--disk-trials 30] [--cli-pool-trials 2] [--night-kills 5] [--quick] [--seed 0] [--keep]
        [--scratch DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import hashlib
import json
import os
import platform
import random
import re
import select
import shutil
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import zlib
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from sage_pipeline import artifacts  # noqa: E402 - after the path is set; no heavy imports

BIN = Path(sys.executable).parent
NOBODY = 65534


@dataclasses.dataclass
class Trial:
    """One trial: what was done, whether everything checked held, and what did not."""

    category: str
    name: str
    ok: bool
    detail: str = ""
    seconds: float = 0.0
    facts: dict = dataclasses.field(default_factory=dict)


# =============================================================================================
# 1. fuzzed journals
# =============================================================================================

MAX_LINE = 4096  # the fuzz ingest's max_line_bytes: an over-long line costs 5 KB, not 1 MB
MODELS = ("gpt-4.1-mini", "claude-sonnet-4", "qwen2.5-coder:32b", "llama3.1:8b")
ROLES = ("planner", "architect", "coder", "debugger", "reviewer", "test_engineer")
POISONS = ("int_past_2_63", "lone_surrogate", "nesting_10000", "digits_5000", "non_utf8", "truncated",
           "nan", "infinity", "over_long", "duplicate", "not_an_object", "no_type", "bad_timestamp",
           "reward_out_of_range", "wrong_type", "missing_field", "side_event_non_utf8", "side_event_truncated")
GZ_DAMAGE = ("intact", "truncated", "corrupt", "not_gzip", "trailing_garbage")


def _ts(rng: random.Random, i: int) -> str:
    sec = i % 60
    forms = (f"2026-11-01T00:{i // 60 % 60:02d}:{sec:02d}.{i % 1000:03d}Z",
             f"2026-11-01T02:{i // 60 % 60:02d}:{sec:02d}.{i % 1000:03d}+02:00",
             f"2026-11-01T00:{i // 60 % 60:02d}:{sec:02d}.{i % 1000:06d}")
    return rng.choice(forms)


class Journal:
    """The lines of one fuzzed journal and what each must become: ``valid`` (accepted),
    ``poison`` (quarantined) or ``blank``; TRAJECTORY_STEP ids are unique per trial."""

    def __init__(self, rng: random.Random, trial: int, tag: str, models: tuple[str, ...] = MODELS) -> None:
        self.rng, self.trial, self.tag, self.models = rng, trial, tag, models
        self.lines: list[tuple[bytes, str, str]] = []  # (bytes, kind, task id of a valid step or "")
        self.n = 0

    def _id(self) -> str:
        self.n += 1
        return f"fz{self.trial}-{self.tag}-{self.n}"

    def step(self, **over) -> dict:
        rng = self.rng
        ev = {"type": "TRAJECTORY_STEP", "timestamp": _ts(rng, self.n), "task_id": self._id(),
              "agent": rng.choice(ROLES), "action": {"model_chosen": rng.choice(self.models)},
              "state": {"task_complexity_score": round(rng.random(), 3), "primary_failure_count": rng.randint(0, 3),
                        "verification_passed": rng.random() < 0.6, "failed_reason": None},
              "reward": round(rng.uniform(-2, 2), 4), "terminal": rng.random() < 0.5,
              "extra": {"synthetic": False}}
        if rng.random() < 0.5:
            ev["session_id"] = f"sess-{self.trial}-{self.tag}-{rng.randint(0, 9)}"
        if rng.random() < 0.2:
            ev["step"] = rng.randint(0, 5)
            ev["task_id"] += f"-s{ev['step']}"
        if rng.random() < 0.2:
            ev["propensity"] = round(rng.uniform(0.05, 1.0), 3)
        if rng.random() < 0.1:
            ev["trace_id"] = "trace-" + ev["task_id"]
        if rng.random() < 0.1:  # keys the ingest does not read, of any type
            ev["extra"]["notes"] = {"deep": [[[1, 2, {"x": None}]]], "big": 2 ** 70, "s": "\U0001f600"}
        ev.update(over)
        return ev

    def add_valid(self) -> None:
        rng = self.rng
        r = rng.random()
        if r < 0.55:
            ev = self.step()
            if rng.random() < 0.15:  # non-ASCII ids, raw or as escapes (a valid surrogate pair included)
                ev["task_id"] += rng.choice(["-tâche-é", "-\U0001f600", "-日本"])
            text = json.dumps(ev, ensure_ascii=rng.random() < 0.5).encode("utf-8")
            if rng.random() < 0.05:
                text += b"\r"  # a CRLF journal
            self.lines.append((text, "valid", ev["task_id"]))
            return
        ts = _ts(rng, self.n)
        if r < 0.70:
            ev = {"type": "MODEL_ROUTING_DECISION", "timestamp": ts, "agent_role": rng.choice(ROLES),
                  "selected_model": rng.choice(self.models), "primary": self.models[0], "fallback": self.models[-1],
                  "matched_triggers": ["task_complexity_score > 0.8"], "policy_source": "yaml"}
        elif r < 0.82:
            ev = {"type": "TOKEN_USAGE", "timestamp": ts, "model": rng.choice(self.models),
                  "prompt_tokens": rng.randint(10, 9000), "completion_tokens": rng.randint(1, 900)}
        elif r < 0.90:
            ev = {"type": rng.choice(["SESSION_START", "SESSION_END", "AGENT_MESSAGE", "TOOL_CALL"]), "timestamp": ts}
        elif r < 0.95:  # a side event the dataset cannot use is still a valid SAGE line
            ev = {"type": "TOKEN_USAGE", "timestamp": ts, "model": 5}
        else:
            self.lines.append((b"", "blank", ""))
            return
        self.lines.append((json.dumps(ev).encode("utf-8"), "valid", ""))

    def add_poison(self, what: str) -> None:
        rng = self.rng
        good = json.dumps(self.step()).encode()
        if what == "int_past_2_63":
            field = rng.choice(["reward", "step", "primary_failure_count"])
            big = str(2 ** rng.randint(63, 200) + rng.randint(0, 10 ** 6))
            ev = self.step()
            if field == "primary_failure_count":
                ev["state"]["primary_failure_count"] = 0
                line = json.dumps(ev).replace('"primary_failure_count": 0', '"primary_failure_count": ' + big)
            else:
                ev[field] = 0
                line = json.dumps(ev).replace(f'"{field}": 0', f'"{field}": {big}', 1)
            text = line.encode()
        elif what == "lone_surrogate":
            field = rng.choice(["task_id", "agent", "failed_reason"])
            ev = self.step()
            if field == "failed_reason":
                ev["state"]["failed_reason"] = "@@"
            else:
                ev[field] = "@@"
            text = json.dumps(ev).replace('"@@"', '"x\\ud800y"' if rng.random() < 0.5 else '"\\udfff"').encode()
        elif what == "nesting_10000":
            deep = "[" * 10_000 + "]" * 10_000
            text = (json.dumps(self.step(state="@@")).replace('"@@"', deep) if rng.random() < 0.5 else deep).encode()
        elif what == "digits_5000":
            field = rng.choice(["reward", "step"])
            text = json.dumps(self.step(**{field: "@@"})).replace('"@@"', "9" * 5000).encode()
        elif what == "non_utf8":
            cut = rng.randint(1, len(good) - 2)
            text = good[:cut] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80"]) + good[cut:]
        elif what == "truncated":
            text = good[:rng.randint(1, len(good) - 1)].rstrip(b" ")
        elif what in ("nan", "infinity"):
            token = "NaN" if what == "nan" else rng.choice(["Infinity", "-Infinity", "1e400"])
            text = json.dumps(self.step(reward="@@")).replace('"@@"', token).encode()
        elif what == "over_long":
            text = json.dumps(self.step(extra={"synthetic": False, "pad": "p" * (MAX_LINE + 100)})).encode()
        elif what == "duplicate":
            prior = [(t, tid) for t, k, tid in self.lines if k == "valid" and tid]
            if not prior:
                return self.add_poison("wrong_type")
            text, tid = rng.choice(prior)
            self.lines.append((text.rstrip(b"\r"), "poison", f"duplicate:{tid}"))  # the same step again
            return
        elif what == "not_an_object":
            text = rng.choice([b"[1, 2, 3]", b'"TRAJECTORY_STEP"', b"42", b"null", b"true"])
        elif what == "no_type":
            ev = self.step()
            del ev["type"]
            text = json.dumps(ev if rng.random() < 0.5 else {**ev, "type": 7}).encode()
        elif what == "bad_timestamp":
            text = json.dumps(self.step(timestamp=rng.choice(["yesterday", "2026-13-45T99:00:00Z", "", 17]))).encode()
        elif what == "reward_out_of_range":
            text = json.dumps(self.step(reward=rng.choice([2.5, -3.0, 1e9]))).encode()
        elif what == "wrong_type":
            field, value = rng.choice([("task_id", 5), ("agent", ["coder"]), ("terminal", "yes"), ("reward", "1.0"),
                                       ("action", "gpt-4.1-mini"), ("state", [0.5])])
            text = json.dumps(self.step(**{field: value})).encode()
        elif what == "missing_field":
            ev = self.step()
            del ev[rng.choice(["task_id", "agent", "action", "reward", "terminal", "timestamp"])]
            text = json.dumps(ev).encode()
        elif what == "side_event_non_utf8":
            text = b'{"type": "TOKEN_USAGE", "timestamp": "2026-11-01T00:00:00Z", "model": "gpt\xff"}'
        elif what == "side_event_truncated":
            text = b'{"type": "MODEL_ROUTING_DECISION", "timestamp": "2026-11-01T00:00:00Z", "agent_role": "co'
        else:
            raise ValueError(what)
        self.lines.append((text, "poison", what))

    def data(self, final_newline: bool) -> bytes:
        body = b"\n".join(t for t, _, _ in self.lines)
        return body + b"\n" if final_newline else body


def _gz_recoverable(data: bytes) -> tuple[bytes, bool]:
    """What an exact reader recovers from a gzip file: the data a byte-by-byte decompressor
    yields up to the first error (every member), and whether the file ends cleanly there."""
    out: list[bytes] = []
    if data[:2] != b"\x1f\x8b":
        return b"", False
    d, i = zlib.decompressobj(wbits=31), 0
    while i < len(data):
        try:
            out.append(d.decompress(data[i:i + 1]))
        except zlib.error:
            return b"".join(out), False
        i += 1
        if d.eof:
            rest = d.unused_data + data[i:]
            stripped = rest.lstrip(b"\x00")
            if not stripped:
                return b"".join(out), True
            if stripped[:2] != b"\x1f\x8b":
                return b"".join(out), False
            i = len(data) - len(stripped)
            d = zlib.decompressobj(wbits=31)
    return b"".join(out), d.eof and not d.unconsumed_tail


def _damage(rng: random.Random, raw: bytes, how: str) -> bytes:
    gz = gzip.compress(raw, mtime=0)
    if how == "intact":
        return gz
    if how == "truncated":
        return gz[:rng.randint(12, len(gz) - 1)]
    if how == "corrupt":
        b = bytearray(gz)
        at = rng.randint(12, len(b) - 9)
        for j in range(at, min(len(b) - 8, at + rng.randint(1, 64))):
            b[j] ^= rng.randint(1, 255)
        return bytes(b)
    if how == "not_gzip":
        return raw
    if how == "trailing_garbage":
        return gz + rng.choice([b"garbage after the stream", b"\x00" * 7 + b"PK\x03\x04", b"\x1f"])
    raise ValueError(how)


def _expect_file(lines: list[tuple[bytes, str, str]], data_read: bytes, damaged: bool) -> dict:
    """What the ingest must report for one file whose readable data is ``data_read`` (all of
    it for a plain file): lines read, the valid and poison lines among them (a line that differs
    from what was written, in a corrupt gzip, may go either way), and the step ids it must keep.
    A duplicate counts as poison only if the step it repeats was itself read as written."""
    if damaged:  # the complete lines before the damage, then one record for the unreadable rest
        complete = data_read.split(b"\n")[:-1]
    elif not data_read:
        complete = []
    else:  # the final newline ends the last line; a last line without one is a line all the same
        complete = data_read.split(b"\n")
        if data_read.endswith(b"\n"):
            complete = complete[:-1]
    want_valid, want_poison, either, ids = 0, 0, 0, []
    for j, got in enumerate(complete):
        if j >= len(lines) or got != lines[j][0]:
            either += 1  # damaged data that decompressed into something else
            continue
        _, kind, what = lines[j]
        if kind == "poison" and what.startswith("duplicate:") and what.split(":", 1)[1] not in ids:
            kind, what = "valid", what.split(":", 1)[1]  # what it repeats was not read: it is the first
        if kind == "poison":
            want_poison += 1
        else:
            want_valid += 1
            if what:
                ids.append(what)
    if damaged:
        want_poison += 1
    return {"read": len(complete) + damaged, "valid": want_valid, "poison": want_poison, "either": either, "ids": ids}


def build_fuzz_set(base: Path, seed: int, unreadable: bool) -> dict:
    """Write one trial's journals under ``base`` and return what the ingest must find."""
    rng = random.Random(seed)
    logs, elsewhere = base / "logs", base / "elsewhere"
    for d in (logs / "sub", elsewhere / "deep"):
        d.mkdir(parents=True, exist_ok=True)
    (logs / "linked").symlink_to(elsewhere, target_is_directory=True)  # a symlinked folder
    (logs / "sub" / "loop").symlink_to(logs, target_is_directory=True)  # and a loop back up
    folders = [logs, logs / "sub", elsewhere, elsewhere / "deep"]
    expect = {"read": 0, "valid": 0, "poison": 0, "either": 0, "ids": [], "damaged": [], "files": [],
              "skipped": [], "poisons": {}, "gz": {}, "valid_written": 0}
    n_files = rng.randint(4, 8)
    for f in range(n_files):
        j = Journal(rng, seed, f"f{f}")
        for _ in range(rng.randint(20, 120)):
            if rng.random() < 0.25:
                what = rng.choice(POISONS)
                j.add_poison(what)
            else:
                j.add_valid()
        for _, kind, what in j.lines:
            if kind == "poison":
                what = what.split(":")[0]
                expect["poisons"][what] = expect["poisons"].get(what, 0) + 1
        expect["valid_written"] += sum(1 for _, k, _ in j.lines if k != "poison")
        folder = rng.choice(folders)
        gz = rng.random() < 0.4
        name = f"2026-11-{f + 1:02d}" + rng.choice([".log", ".jsonl"]) + (".gz" if gz else "")
        path = folder / name
        final_nl = rng.random() < 0.85
        raw = j.data(final_nl)
        if gz:
            how = rng.choice(GZ_DAMAGE)
            data = _damage(rng, raw, how)
            path.write_bytes(data)
            readable, clean = _gz_recoverable(data)
            if clean and readable != raw:  # a damage zlib cannot see (it never happens with CRC32): say so
                raise AssertionError(f"{path}: damaged data decompressed cleanly")
            e = _expect_file(j.lines, readable, damaged=not clean)
            expect["gz"][how] = expect["gz"].get(how, 0) + 1
            if not clean:
                expect["damaged"].append(str(_listed(path, logs, elsewhere)))
        else:
            path.write_bytes(raw)
            e = _expect_file(j.lines, raw, damaged=False)
        expect["files"].append(str(_listed(path, logs, elsewhere)))
        for k in ("read", "valid", "poison", "either"):
            expect[k] += e[k]
        expect["ids"] += e["ids"]
    if unreadable:
        locked = logs / "locked"
        j = Journal(rng, seed, "locked")
        for _ in range(30):
            j.add_valid()
        locked.mkdir()
        (locked / "2026-11-30.log").write_bytes(j.data(True))
        locked.chmod(0)
        expect["skipped"].append(str(locked))
    (logs / "2026-12-01.log").symlink_to(base / "gone.log")  # a broken link named like a journal
    expect["skipped"].append(str(logs / "2026-12-01.log"))
    return expect


def _listed(path: Path, logs: Path, elsewhere: Path) -> Path:
    """The path the ingest names a file by: files under the symlinked folder are found through it."""
    try:
        return logs / "linked" / path.relative_to(elsewhere)
    except ValueError:
        return path


def fuzz_trial(workdir: Path, seed: int, unreadable: bool = True) -> Trial:
    """One fuzzed set of journals through the ingest, in this process (see :func:`fuzz_trials`)."""
    import pyarrow.parquet as pq

    from sage_pipeline.routing import ingest

    base = Path(tempfile.mkdtemp(prefix=f"fuzz-{seed}-", dir=workdir))
    t0 = time.perf_counter()
    expect = build_fuzz_set(base, seed, unreadable)
    problems: list[str] = []
    facts = {k: expect[k] for k in ("read", "valid", "poison", "either", "valid_written")}
    facts.update(poisons=expect["poisons"], gz=expect["gz"])
    try:
        res = ingest.ingest(ingest.IngestConfig((base / "logs",), max_line_bytes=MAX_LINE, read_chunk_bytes=1 << 14),
                            base / "out", progress=lambda m: None)
    except BaseException as exc:  # noqa: BLE001 - a crash of the ingest is what this trial looks for
        _unlock(base)
        return Trial("fuzz", f"seed {seed}", False, f"the ingest raised {type(exc).__name__}: {str(exc)[:300]}",
                     time.perf_counter() - t0, facts)
    s = res.stats
    facts.update(lines_read=s.lines_read, accepted=s.accepted_lines, quarantined=s.quarantined)
    if s.lines_read != s.accepted_lines + s.quarantined:
        problems.append(f"accepted {s.accepted_lines} + quarantined {s.quarantined} != read {s.lines_read}")
    if s.lines_read != expect["read"]:
        problems.append(f"read {s.lines_read} lines, an exact reader finds {expect['read']}")
    lo_acc, hi_acc = expect["valid"], expect["valid"] + expect["either"]
    if not lo_acc <= s.accepted_lines <= hi_acc:
        problems.append(f"accepted {s.accepted_lines} lines, expected {lo_acc}"
                        + (f"..{hi_acc}" if hi_acc > lo_acc else ""))
    lo_q, hi_q = expect["poison"], expect["poison"] + expect["either"]
    if not lo_q <= s.quarantined <= hi_q:
        problems.append(f"quarantined {s.quarantined} lines, expected {lo_q}" + (f"..{hi_q}" if hi_q > lo_q else ""))
    kept = set(pq.read_table(res.trajectories, columns=["task_id"]).column("task_id").to_pylist())
    lost = [t for t in expect["ids"] if t not in kept]
    facts["valid_steps_lost"] = len(lost)
    if lost:
        problems.append(f"{len(lost)} valid steps lost, e.g. {lost[:3]}")
    quarantined = [json.loads(x) for x in res.quarantine.read_bytes().splitlines()]
    if len(quarantined) != s.quarantined or any(not q.get("reason") or not q.get("file") or not q.get("line")
                                                for q in quarantined):
        problems.append("a quarantine record lacks its file, line or reason")
    damaged = sorted(d["file"] for d in s.damaged_files)
    if damaged != sorted(expect["damaged"]):
        problems.append(f"damaged files reported {damaged}, expected {sorted(expect['damaged'])}")
    if sorted(s.files) != sorted(expect["files"]):
        problems.append(f"files read {len(s.files)} ({sorted(set(s.files) ^ set(expect['files']))[:3]} differ)")
    skipped = sorted(d["path"] for d in s.skipped_paths)
    if skipped != sorted(expect["skipped"]):
        problems.append(f"skipped paths reported {skipped}, expected {sorted(expect['skipped'])}")
    _unlock(base)
    shutil.rmtree(base, ignore_errors=True)
    return Trial("fuzz", f"seed {seed}", not problems, "; ".join(problems), time.perf_counter() - t0, facts)


def _unlock(base: Path) -> None:
    with contextlib.suppress(OSError):
        (base / "logs" / "locked").chmod(0o755)


def fuzz_trials(workdir: Path, seeds: list[int]) -> list[Trial]:
    """Fuzz trials. As root they run in a fresh worker process that gives up root (uid
    ``nobody``) once it has imported what it needs, since root reads a folder with mode 000 and
    the unreadable folder would not be unreadable."""
    if not seeds or os.geteuid() != 0:
        return [fuzz_trial(workdir, s) for s in seeds]
    # a folder nobody can reach: the system's temporary folder (``workdir`` may sit in a private one)
    sub = Path(tempfile.mkdtemp(prefix="fault_injection-fuzz-"))
    try:
        sub.chmod(0o777)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--fuzz-worker", str(sub), ",".join(map(str, seeds))]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, start_new_session=True, cwd=ROOT)
        out = sub / "results.json"
        if proc.returncode != 0 or not out.is_file():
            return [Trial("fuzz", f"seeds {seeds[0]}..{seeds[-1]}", False,
                          f"the fuzz worker exited {proc.returncode}: {proc.stderr[-800:]}")]
        return [Trial(**t) for t in json.loads(out.read_text())]
    finally:
        shutil.rmtree(sub, ignore_errors=True)


def _fuzz_worker(workdir: str, seeds: str) -> None:
    work = Path(workdir)
    if os.geteuid() == 0:
        warm = fuzz_trial(work, -1, unreadable=False)  # every lazy import happens now, as root
        if not warm.ok:
            raise SystemExit(f"the warm-up fuzz trial failed: {warm.detail}")
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    out = [dataclasses.asdict(fuzz_trial(work, int(s))) for s in seeds.split(",")]
    (work / "results.json").write_text(json.dumps(out))


# =============================================================================================
# 2-3. kill -9 and concurrent materializations
# =============================================================================================

class Broken(Exception):
    """An artifact that does not read completely, or a set that is not consistent."""


_TEMP_FILE = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")  # artifacts.atomic_path
# artifacts.atomic_dir's temporary and moved-aside folders; routing_dataset's part folders
_TEMP_DIR = re.compile(r"\..+\.(?:tmp-[a-z0-9_]{8}|old(?:-[a-z0-9_]{8})?|parts\.[a-z0-9_]{8})")
# artifacts.atomic_set's links made and not yet renamed into place
_TEMP_LINK = re.compile(r"\..+\.link-[0-9a-f]{8}|\.(?:current|previous)\.[0-9a-f]{8}")
# times inside otherwise equal JSON
VOLATILE = {"seconds", "created_at", "started_at", "finished_at", "at", "decided_at",
            "timings_s"}  # routing_benchmark: seconds per stage


def _volatile(key: str) -> bool:
    return key in VOLATILE or key.endswith(("_per_s", "_seconds"))


def leftovers(root: Path) -> list[str]:
    """Temporary files and folders anywhere under ``root`` (none may survive a completed run)."""
    found = []
    for dirpath, dirs, files in os.walk(root):
        for name in list(dirs) + files:
            p = Path(dirpath) / name
            if ((_TEMP_FILE.fullmatch(name) and name in files) or (_TEMP_DIR.fullmatch(name) and name in dirs)
                    or name.endswith(".partial") or name.startswith(".switch-") or _TEMP_LINK.fullmatch(name)
                    or (name == "pending.json" and name in files)):  # a sleep-store switch not finished
                found.append(str(p.relative_to(root)))
        dirs[:] = [d for d in dirs if not _TEMP_DIR.fullmatch(d)]
    homes = [root / ".synthetic_versions"]
    if (root / artifacts.SETS_DIR).is_dir():
        homes += [p for p in (root / artifacts.SETS_DIR).iterdir() if p.is_dir()]
    for versions in homes:
        if versions.is_dir():
            sets = [p for p in versions.iterdir() if p.is_dir() and not p.is_symlink()
                    and not p.name.endswith(".partial")]  # (a partial one is named above)
            if len(sets) > 2:  # the current set and the one it replaced
                found.append(f"{versions.relative_to(root)} holds {len(sets)} sets")
    return sorted(found)


def _writing(root: Path) -> bool:
    """Whether a temporary file or folder of an atomic write (or a synthetic set being written) exists."""
    stack = [root]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            if _TEMP_FILE.fullmatch(e.name) or _TEMP_DIR.fullmatch(e.name):
                return True
            if e.name.endswith(".partial") and Path(e.path).parent.parent.name != artifacts.SETS_DIR:
                return True  # a synthetic set being written (an asset's set: its files' writes count)
            if e.is_dir(follow_symlinks=False) and e.name != ".locks":
                stack.append(Path(e.path))
    return False


def _strip(obj):
    if isinstance(obj, dict):
        return {k: _strip(v) for k, v in obj.items() if not _volatile(k)}
    if isinstance(obj, list):
        return [_strip(v) for v in obj]
    return obj


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def read_artifact(path: Path) -> str:
    """Read ``path`` completely in its format; its content hash (JSON without run times); Broken if it does not read."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise Broken(f"{path}: {e}") from None
    name = path.name
    try:
        if name.endswith(".parquet"):
            import pyarrow.parquet as pq

            pq.read_table(path)
        elif name.endswith(".json"):
            return _sha(json.dumps(_strip(json.loads(data)), sort_keys=True).encode())
        elif name.endswith((".jsonl", ".log")):
            if data and not data.endswith(b"\n"):
                raise Broken(f"{path}: the last line has no newline (cut short)")
            for line in data.splitlines():
                if line.strip():
                    json.loads(line)
        elif name.endswith(".png"):
            if not data.startswith(b"\x89PNG\r\n\x1a\n") or not data.endswith(b"IEND\xaeB`\x82"):
                raise Broken(f"{path}: not a complete PNG")
        elif name.endswith(".npz"):
            import numpy as np

            with np.load(path) as z:
                for k in z.files:
                    z[k]
        elif name.endswith(".joblib"):
            import joblib

            joblib.load(path)
        elif name.endswith(".md"):
            data.decode("utf-8")
    except Broken:
        raise
    except Exception as e:  # noqa: BLE001 - any reader's error means the file is not complete
        raise Broken(f"{path}: does not read: {type(e).__name__}: {str(e)[:200]}") from None
    return _sha(data)


def _files(root: Path, rels: list[str]) -> dict[str, str]:
    return {rel: read_artifact(root / rel) if (root / rel).exists() else "absent" for rel in rels}


def _tree(root: Path, rel: str) -> dict[str, str]:
    """Every file of a folder artifact, read completely."""
    folder = root / rel
    if not folder.exists():
        return {rel: "absent"}
    return {f"{rel}/{p.relative_to(folder)}": read_artifact(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def _checkpoint(root: Path, rel: str) -> dict[str, str]:
    from sage_pipeline.rl.checkpoint import CheckpointError, load_policy

    folder = root / rel
    if not folder.exists():
        return {rel: "absent"}
    try:
        load_policy(folder)
    except CheckpointError as e:
        raise Broken(f"{folder}: load_policy: {e}") from None
    return {f"{rel}/{p.name}": read_artifact(p) for p in sorted(folder.iterdir())}


def _sage_checkpoint(root: Path, rel: str) -> dict[str, str]:
    """SAGE's folder: policy.joblib and the manifest.json that carries its sha256 (checked here).

    The old-or-new comparison reads the policy by what it decides (each role's classifier on a
    grid of SAGE's two inputs), not by its bytes: a pickled scikit-learn tree carries the
    uninitialised padding of its node records, so two saves of one policy differ in a few bytes,
    and with them the manifest's sha256."""
    import joblib

    folder = root / rel
    if not folder.exists():
        return {rel: "absent"}
    for p in sorted(folder.iterdir()):
        read_artifact(p)
    manifest = json.loads((folder / "manifest.json").read_bytes())
    if manifest.get("sha256") != hashlib.sha256((folder / "policy.joblib").read_bytes()).hexdigest():
        raise Broken(f"{folder}: manifest.json's sha256 is not policy.joblib's (files of two saves)")
    obj = joblib.load(folder / "policy.joblib")
    grid = [[c / 20, f] for c in range(21) for f in range(5)]
    decided = {role: [round(float(x), 9) for x in clf.predict_proba(grid).ravel()]
               for role, clf in sorted(obj["models"].items())}
    return {f"{rel}/policy.joblib": _sha(json.dumps([obj["feature_keys"], decided]).encode()),
            f"{rel}/manifest.json": _sha(json.dumps(_strip({k: v for k, v in manifest.items() if k != "sha256"}),
                                                    sort_keys=True).encode())}


def fp_synthetic(root: Path) -> dict[str, str]:
    link = root / "sessions" / "synthetic"
    if not os.path.lexists(link):
        return {"sessions/synthetic": "absent"}
    folder = link.resolve()
    if not folder.is_dir():
        raise Broken(f"{link} points at {folder}, which is not a folder")
    try:
        manifest = json.loads((folder / "simulator.json").read_bytes())
    except (OSError, ValueError) as e:
        raise Broken(f"{folder}/simulator.json: {e}") from None
    logs = sorted(p.name for p in folder.iterdir() if p.name.endswith(".log"))
    if logs != sorted(manifest["files"]):
        raise Broken(f"{folder}: journals {logs} are not the manifest's {manifest['files']}")
    steps, sessions, h = 0, set(), hashlib.sha256()
    for name in logs:
        data = (folder / name).read_bytes()
        read_artifact(folder / name)
        h.update(name.encode() + data)
        for line in data.splitlines():
            ev = json.loads(line)
            if ev["type"] == "TRAJECTORY_STEP":
                steps += 1
            elif ev["type"] == "SESSION_START":
                sessions.add(ev.get("session_id"))
    if steps != manifest["decisions"] or len(sessions) != manifest["sessions"]:
        raise Broken(f"{folder}: {steps} steps in {len(sessions)} sessions, simulator.json says "
                     f"{manifest['decisions']} in {manifest['sessions']} (logs of another seed)")
    return {"sessions/synthetic": h.hexdigest()[:16] + f"/seed{manifest['collector']['seed']}",
            "simulator.json": read_artifact(folder / "simulator.json")}


def fp_rollouts(root: Path) -> dict[str, str]:
    """Each shard's Parquet reads whole, and the execution cache loads (every segment whole).
    A re-run re-executes nothing the cache holds, so outcomes are compared, not run times."""
    import pandas as pd

    from sage_pipeline.sim.cache import CACHE_DIR, ExecutionCache

    out = {}
    for path in sorted((root / "sim" / "rollouts").glob("shard-*.parquet")):
        read_artifact(path)
        df = pd.read_parquet(path)
        out[str(path.relative_to(root))] = _sha(df[["task_id", "candidate_id", "outcome"]].to_csv().encode()) \
            if {"task_id", "candidate_id", "outcome"} <= set(df.columns) else _sha(path.read_bytes())
    try:
        cache = ExecutionCache(root / "sim" / CACHE_DIR)
    except Exception as e:  # noqa: BLE001 - a cache that does not load is a broken artifact
        raise Broken(f"the execution cache does not load: {type(e).__name__}: {e}") from None
    out["sim/cache entries"] = str(len(cache))
    return out


def sandbox_leftovers(pid: int, grace_s: float = 20.0) -> list[str]:
    """What a killed run's sandbox left: containers labelled by the run's process (the label
    is ``<pid>-<random>``), still there ``grace_s`` after the kill, and live local runner
    processes of a sandbox folder no run holds."""
    found: list[str] = []
    end = time.monotonic() + grace_s
    while True:
        found = []
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(["docker", "ps", "-a", "--format", '{{.Names}} {{.Label "sage.sandbox"}}'],
                                 capture_output=True, text=True, timeout=30).stdout
            found += [f"container {line.split()[0]}" for line in out.splitlines()
                      if len(line.split()) == 2 and line.split()[1].startswith(f"{pid}-")]
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                cwd = os.readlink(proc / "cwd")
                if "/sage-sim-local-" in cwd and not os.path.exists(cwd.split(" (deleted)")[0]):
                    found.append(f"local runner process {proc.name} in a removed folder")
                elif "/sage-sim-local-" in cwd and _owner_gone(cwd):
                    found.append(f"local runner process {proc.name} in {cwd}")
        if not found or time.monotonic() > end:
            return found
        time.sleep(1.0)


def stale_local_workroots() -> list[str]:
    """The local sandbox's work folders no live host holds (a killed host's; the next local
    sandbox removes them)."""
    from sage_pipeline.sim.sandbox import LOCAL_PREFIX

    return [str(p) for p in Path(tempfile.gettempdir()).glob(f"{LOCAL_PREFIX}*")
            if p.is_dir() and not artifacts.folder_in_use(p)]


def _owner_gone(cwd: str) -> bool:
    """Whether no process but local runners holds the sandbox folder ``cwd`` (its host is dead)."""
    root = "/".join(cwd.split("/")[:3])  # /tmp/sage-sim-local-XXXX
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            with contextlib.suppress(OSError):
                if not os.readlink(proc / "cwd").startswith(root):
                    for fd in (proc / "fd").iterdir():
                        if os.readlink(fd).startswith(root):
                            return False
    return True


SKILLS_ROOT = ("sleep", "sage_skills")  # the asset's SAGE skills root, under the artifact root


def check_skills_root(folder: Path, base: Path | None = None) -> dict[str, str]:
    """A SAGE skills root (``sleep.sage_skills.SageSkillsRoot``) must be whole: every history and staged line
    valid, every version folder's nine files hashing to its id (``version_id``), the live pointer naming a stored
    version that is the history's last (or the one before it: a switch the next change finishes), and every file
    of the nights' diagnostics and online reports complete. (live version, versions, history length, each night
    file's content hash); Broken otherwise. ``base``: what the file names are relative to."""
    from sage_pipeline.sage.skills import SkillsError
    from sage_pipeline.sleep.sage_skills import LIVE_FILE, STAGING, SageSkillsRoot, version_id

    base = base or folder
    if not (folder / LIVE_FILE).is_file():
        return {str(folder.relative_to(base)): "absent"}
    try:
        root = SageSkillsRoot(folder)
        entries = root.versions()
        staged = root.staged()
        stored = {p.name for p in root.versions_dir.iterdir() if p.is_dir() and not STAGING.fullmatch(p.name)}
        for vid in stored:
            if version_id(root.files(vid)) != vid:
                raise Broken(f"{root.versions_dir / vid}: its files are not version {vid} (a tree cut short)")
        live = root.live()
    except SkillsError as e:
        raise Broken(str(e)) from None
    if any(v.version not in stored for v in [*entries, *staged]):
        raise Broken(f"{root.history_file} or {root.staged_file}: names a version with no whole folder")
    if live not in stored or live not in [e.version for e in entries[-2:]]:
        raise Broken(f"{root.live_file}: live version {live} is not the history's last (nor the one before)")
    out = {"live": live, "versions": ",".join(sorted(stored)), "history": str(len(entries))}
    for sub in ("nights", "online"):
        for p in sorted((folder / sub).rglob("*")) if (folder / sub).is_dir() else []:
            if p.is_file() and not _TEMP_FILE.fullmatch(p.name):
                out[str(p.relative_to(base))] = read_artifact(p)
    return out


def fp_sage_skills(root: Path) -> dict[str, str]:
    """``sleep_cycle/sage_skills``: its skills root whole (:func:`check_skills_root`), and the decision ledger and
    the skills lever's plan (what a night writes after its decisions) complete."""
    out = check_skills_root(root.joinpath(*SKILLS_ROOT), root)
    decisions = root / "decisions"
    for p in sorted(decisions.rglob("*")) if decisions.is_dir() else []:
        if p.is_file() and p.suffix in (".json", ".jsonl") and not _TEMP_FILE.fullmatch(p.name):
            out[str(p.relative_to(root))] = read_artifact(p)
    return out


@dataclasses.dataclass
class AssetSpec:
    """A writer asset: how to run it (key, op name, config variants, partitions) and how to read
    what it writes (``fingerprint``: artifact -> content hash, Broken if anything is partial)."""

    name: str
    key: str
    op: str
    configs: tuple[dict, ...]
    fingerprint: Callable[[Path], dict[str, str]]
    partitions: tuple[str, ...] = ()
    prepare: Callable[[Path, int], None] | None = None
    exact: bool = True  # "old or new" compares content; False: the sleep store is checked for consistency
    resources: dict | None = None  # run config of resources (the sandbox's backend)

    def variant(self, i: int) -> int:
        """Which version trial ``i`` writes: its config, or (``prepare``) its input."""
        return i % (2 if self.prepare else len(self.configs))

    def config(self, i: int) -> dict:
        return self.configs[i % len(self.configs)]

    def partition(self, i: int) -> str | None:
        return self.partitions[i % len(self.partitions)] if self.partitions else None

    def run_config(self, i: int) -> dict | None:
        cfg = self.config(i)
        out = ({"ops": {self.op: {"config": cfg}}} if cfg else {}) | (
            {"resources": self.resources} if self.resources else {})
        return out or None


def _extra_journal(root: Path, i: int) -> None:
    """trajectories' input alternates: an extra real journal present on odd trials."""
    extra = root / "sessions" / "real" / "2026-11-01.log"
    if i % 2:
        j = Journal(random.Random(1000 + i), 9000, "extra", models=("gpt-4.1-mini", "claude-sonnet-4"))
        for _ in range(40):
            j.add_valid()
        extra.parent.mkdir(parents=True, exist_ok=True)
        extra.write_bytes(j.data(True))
    elif extra.exists():
        extra.unlink()


EPISODES = 600
ASSETS = [
    # first: it reads no other asset (so --assets sleep_cycle/sage_skills runs it alone). Issue 48: the one night
    # left, SAGE's, on the project's SAGE skills root, the shipped week as its input (no model configured: it
    # harvests and ends no_model, or no_tasks while the week ships no goal ledger); its harvest validates SAGE's
    # tests in the Docker sandbox when the week gives it tasks
    AssetSpec("sleep_cycle/sage_skills", "sleep_cycle/sage_skills", "sleep_cycle__sage_skills", ({},), fp_sage_skills,
              partitions=("2026-11-01", "2026-11-02", "2026-11-03"), exact=False),
    AssetSpec("synthetic_sessions", "synthetic_sessions", "synthetic_sessions",
              ({"episodes": EPISODES, "seed": 1, "sessions_per_day": 50},
               {"episodes": EPISODES, "seed": 2, "sessions_per_day": 50}), fp_synthetic),
    AssetSpec("trajectories", "trajectories", "trajectories", ({},),
              lambda r: _files(r, [f"routing/{n}" for n in ("trajectories.parquet", "routing_decisions.parquet",
                                                             "token_usage.parquet", "quarantine.jsonl")]),
              prepare=_extra_journal),
    AssetSpec("routing_dataset", "routing_dataset", "routing_dataset",
              ({"eval_fraction": 0.3}, {"eval_fraction": 0.35}),
              lambda r: _files(r, ["routing/routing_v1.parquet", "routing/routing_v1.jsonl",
                                   "routing/action_space.json"])),
    AssetSpec("reward_report", "reward_report", "reward_report", ({},),
              lambda r: _files(r, ["reports/reward_report.json", "reports/reward_by_role.png",
                                   "reports/reward_vs_complexity.png"])),
    AssetSpec("bc_policy", "bc_policy", "bc_policy", ({"epochs": 5, "seed": 0}, {"epochs": 5, "seed": 1}),
              lambda r: {**_checkpoint(r, "checkpoints/bc"), **_checkpoint(r, "checkpoints/bc_sage_binary")}),
    AssetSpec("cql_policy", "cql_policy", "cql_policy",
              ({"steps": 200, "n_boot": 30, "seed": 0}, {"steps": 200, "n_boot": 30, "seed": 1}),
              lambda r: {**_checkpoint(r, "checkpoints/cql"), **_checkpoint(r, "checkpoints/cql_sage_binary")}),
    AssetSpec("offline_eval", "offline_eval", "offline_eval", ({"n_boot": 100, "seed": 0}, {"n_boot": 100, "seed": 1}),
              lambda r: {**_files(r, ["reports/offline_eval.json", "reports/offline_eval.png",
                                      "checkpoints/gate/decision.json"]),
                         **_checkpoint(r, "checkpoints/gate/multi_model"),
                         **_sage_checkpoint(r, "checkpoints/gate/sage_binary")}),
    AssetSpec("promoted_policy", "promoted_policy", "promoted_policy", ({},),
              lambda r: {**_checkpoint(r, "checkpoints/promoted"), **_sage_checkpoint(r, "checkpoints/promoted_sage")}),
    AssetSpec("sage_router_checkpoint", "sage_router_checkpoint", "sage_router_checkpoint", ({},),
              lambda r: _sage_checkpoint(r, "checkpoints/sage")),
    AssetSpec("sim_tasks", "sim_tasks", "sim_tasks", ({"n_tasks": 40, "seed": 0}, {"n_tasks": 40, "seed": 1}),
              lambda r: _files(r, ["sim/tasks.jsonl"])),
    AssetSpec("sandbox_rollouts", "sandbox_rollouts", "sandbox_rollouts", ({},), fp_rollouts,
              partitions=("shard-00", "shard-01"), exact=False),
    AssetSpec("sandbox_rollouts[local]", "sandbox_rollouts", "sandbox_rollouts", ({},), fp_rollouts,
              partitions=("shard-02", "shard-03"), exact=False,
              resources={"sandbox": {"config": {"backend": "local"}}}),
    # issue 35: the simulator's learner, its checkpoint, curve and report one set (it reads all four shards)
    AssetSpec("ppo_policy", "ppo_policy", "ppo_policy",
              tuple({"total_timesteps": 4096, "num_envs": 64, "eval_every": 2, "bandit_steps": 0, "seed": s,
                     "num_threads": 1} for s in (0, 1)),
              lambda r: {**_checkpoint(r, "checkpoints/ppo"),
                         **_files(r, ["reports/ppo_policy.json", "reports/ppo_learning_curve.png"])}),
    # issue 35: the routing benchmark on the test suite's slice of RouteLLM's MMLU table: report, plot, routers
    AssetSpec("routing_benchmark", "routing_benchmark", "routing_benchmark",
              tuple({"table": {"path": str(ROOT / "sage_pipeline_tests" / "routing_benchmark" / "fixtures"
                                           / "routellm_mmlu_slice")}, "tfidf_svd": {"n_components": 32},
                     "bc": {"steps": 80}, "cql": {"steps": 80}, "ope": {"n_boot": 30}, "aiq_boot": 30, "seed": s}
                    for s in (0, 1)),
              lambda r: {**_files(r, ["reports/routing_benchmark.json", "reports/routing_benchmark.png"]),
                         **_tree(r, "checkpoints/routing_benchmark")}),
]
SANDBOX_ASSETS = ("sim_tasks", "sandbox_rollouts", "sleep_cycle/sage_skills")  # their kills also check the sandbox


class Runner:
    """Materializations in processes forked from one that imported the definitions once.

    Protocol on the runner's stdin/stdout, one JSON object a line: ``start`` (asset, run
    config, partition, log file) answers the child's pid once the child has called
    ``setsid`` (its process group id is its pid); ``wait`` (pid, timeout) answers how it
    ended. Children are reaped only on ``wait``, so a pid is never reused before the
    benchmark's ``killpg`` of it."""

    def __init__(self, env: dict, log: Path) -> None:
        self._err = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--runner"], env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True,
                                     start_new_session=True, cwd=ROOT)
        ready = self._read(600)
        if ready.get("ready") is not True:
            raise RuntimeError(f"the runner did not start: {ready}")
        self.children: set[int] = set()

    def _read(self, timeout: float) -> dict:
        r, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not r:
            raise TimeoutError("the runner did not answer")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the runner exited ({self.proc.poll()}); see its log")
        return json.loads(line)

    def _ask(self, req: dict, timeout: float) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        return self._read(timeout)

    def start(self, spec: AssetSpec, i: int, log: Path) -> int:
        pid = self._ask({"op": "start", "key": spec.key, "run_config": spec.run_config(i),
                         "partition": spec.partition(i), "log": str(log)}, 120)["pid"]
        self.children.add(pid)
        return pid

    def wait(self, pid: int, timeout: float) -> tuple[str, int | None]:
        ans = self._ask({"op": "wait", "pid": pid, "timeout": timeout}, timeout + 60)
        if ans["status"] != "running":
            self.children.discard(pid)
        return ans["status"], ans.get("code")

    def close(self) -> None:
        for pid in list(self.children):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            with contextlib.suppress(Exception):
                self.wait(pid, 10)
        with contextlib.suppress(Exception):
            self._ask({"op": "exit"}, 10)
        with contextlib.suppress(Exception):
            self.proc.wait(10)
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._err.close()


def _runner_main() -> None:
    """The runner: import once, then fork one child per materialization."""
    import warnings

    warnings.filterwarnings("ignore")
    proto = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # stray prints must not reach the protocol
    import dagster as dg

    from sage_pipeline.definitions import defs

    assets = {"/".join(k.path): defs.resolve_assets_def(k) for k in defs.resolve_asset_graph().get_all_asset_keys()}
    proto.write(json.dumps({"ready": True}) + "\n")
    proto.flush()
    for line in sys.stdin:
        req = json.loads(line)
        if req["op"] == "exit":
            break
        if req["op"] == "start":
            sys.stdout.flush()
            sys.stderr.flush()
            r, w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: a process group of its own, then the run
                code = 70
                try:
                    os.setsid()
                    os.close(r)
                    os.write(w, b"1")
                    os.close(w)
                    fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    os.dup2(fd, 1)
                    os.dup2(fd, 2)
                    null = os.open(os.devnull, os.O_RDONLY)
                    os.dup2(null, 0)
                    res = dg.materialize([assets[req["key"]]], instance=dg.DagsterInstance.get(),
                                         run_config=req["run_config"], partition_key=req["partition"],
                                         raise_on_error=False)
                    code = 0 if res.success else 1
                    if not res.success:
                        for ev in res.all_events:
                            if ev.event_type_value == "STEP_FAILURE":
                                print("STEP_FAILURE:", ev.event_specific_data.error.to_string(), flush=True)
                except BaseException:  # noqa: BLE001 - the child reports and exits, never returns
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            os.close(w)
            os.read(r, 1)  # the child has its own process group now
            os.close(r)
            proto.write(json.dumps({"pid": pid}) + "\n")
        elif req["op"] == "wait":
            deadline = time.monotonic() + req["timeout"]
            while True:
                try:
                    done, status = os.waitpid(req["pid"], os.WNOHANG)
                except ChildProcessError:  # reaped by an earlier wait: say so rather than die
                    ans = {"status": "gone"}
                    break
                if done:
                    ans = ({"status": "signal", "code": os.WTERMSIG(status)} if os.WIFSIGNALED(status)
                           else {"status": "exit", "code": os.WEXITSTATUS(status)})
                    break
                if time.monotonic() >= deadline:
                    ans = {"status": "running"}
                    break
                time.sleep(0.005)
            proto.write(json.dumps(ans) + "\n")
        proto.flush()


class Bench:
    """The temporary instance and artifact root the kill and concurrency trials share."""

    def __init__(self, workdir: Path, seed: int) -> None:
        self.work = workdir
        self.root = workdir / "data"
        self.home = workdir / "dagster_home"
        self.logs = workdir / "logs"
        for d in (self.root, self.home, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        # the shipped instance settings, without the pool limit (a pooled run killed in-process is
        # the pool trial's subject, see pool_trial; here it would only stall the next trial)
        import yaml

        shipped = yaml.safe_load((ROOT / ".dagster_home" / "dagster.yaml").read_text())
        shipped.pop("concurrency", None)
        (self.home / "dagster.yaml").write_text(yaml.safe_dump(shipped, sort_keys=False))
        self.env = {**os.environ, "DAGSTER_HOME": str(self.home), "SAGE_DATA_DIR": str(self.root),
                    "GX_ANALYTICS_ENABLED": "false", "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
        self.rng = random.Random(seed)
        self.seconds: dict[str, float] = {}  # each asset's last full run, for the kill delays
        self.versions: dict[tuple[str, int], dict] = {}  # (asset, config variant) -> its complete artifacts
        self.runner = Runner(self.env, self.logs / "runner.log")
        self.n = 0
        self.cli_overhead = 0.0

    def close(self) -> None:
        self.runner.close()

    def log(self, label: str) -> Path:
        self.n += 1
        return self.logs / f"{self.n:04d}-{label.replace('/', '_')}.log"

    def run(self, spec: AssetSpec, i: int, timeout: float = 600) -> tuple[bool, str]:
        """One complete materialization through the runner; (succeeded, why not)."""
        log = self.log(spec.name)
        t0 = time.perf_counter()
        pid = self.runner.start(spec, i, log)
        status, code = self.runner.wait(pid, timeout)
        if status == "running":
            os.killpg(pid, signal.SIGKILL)
            self.runner.wait(pid, 30)
            return False, f"did not finish in {timeout:.0f} s (killed); log {log}"
        self.seconds[spec.name] = time.perf_counter() - t0
        if (status, code) != ("exit", 0):
            return False, f"{status} {code}: {_failure(log)}"
        self.versions[(spec.name, spec.variant(i))] = spec.fingerprint(self.root)
        return True, ""

    def calibrate_cli(self, spec: AssetSpec) -> None:
        """How much longer the CLI takes than the runner for the same run (its imports): the CLI
        kill trials add it to their delay, so the kill lands in the run, not in the imports."""
        t0 = time.perf_counter()
        proc = self.cli(spec, 0)
        if proc.wait(timeout=600) != 0:
            raise RuntimeError(f"dagster asset materialize --select {spec.key} failed; see {self.logs}")
        wall = time.perf_counter() - t0
        ok, why = self.run(spec, 0)
        if not ok:
            raise RuntimeError(why)
        self.cli_overhead = max(0.0, wall - self.seconds[spec.name])

    def cli(self, spec: AssetSpec, i: int) -> subprocess.Popen:
        """``dagster asset materialize`` for ``spec``, in its own session (killable as a group)."""
        cmd = [str(BIN / "dagster"), "asset", "materialize", "-m", "sage_pipeline.definitions", "--select", spec.key]
        if spec.run_config(i):
            cmd += ["--config-json", json.dumps(spec.run_config(i))]
        if spec.partition(i):
            cmd += ["--partition", spec.partition(i)]
        log = open(self.log(spec.name + "-cli"), "wb")  # noqa: SIM115 - the child holds it
        try:
            return subprocess.Popen(cmd, env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()


def _failure(log: Path) -> str:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no log)"
    m = [ln for ln in text.splitlines() if "Error" in ln or "error" in ln or "STEP_FAILURE" in ln]
    return (m[-1] if m else text[-300:])[:400] + f" (log {log})"


def _compare(spec: AssetSpec, after: dict, old: dict, new: dict) -> list[str]:
    """Every artifact must be the old or the new version; sleep: the store was checked whole."""
    if not spec.exact:
        return []
    bad = [f"{a} is neither the old nor the new version" for a in sorted(after)
           if after[a] not in (old.get(a, "absent"), new.get(a, "absent"))]
    return bad


def _set_of(after: dict, versions: list[dict]) -> bool:
    """Whether all of an asset's artifacts come from one of the given complete versions."""
    return any(after == v for v in versions)


def kill_trial(bench: Bench, spec: AssetSpec, i: int, cli: bool = False) -> Trial:
    """Start ``spec`` with config variant ``i``, SIGKILL its process group at a random delay,
    check what is left, re-run it plainly and check again."""
    t0 = time.perf_counter()
    if spec.prepare:
        spec.prepare(bench.root, i)
    try:
        old = spec.fingerprint(bench.root)
    except Broken as e:
        return Trial("kill", f"{spec.name} #{i}", False, f"the state before the trial is broken: {e}")
    full = bench.seconds.get(spec.name, 1.0)  # the asset's last complete run, start to exit
    at_write = i % 2 == 1
    if cli:
        proc = bench.cli(spec, i)
        pid = proc.pid

        def finished() -> bool:
            return proc.poll() is not None
    else:
        pid = bench.runner.start(spec, i, bench.log(spec.name + "-killed"))
        ended: list[tuple] = []  # the runner reaps a child on the first wait that sees it end

        def finished() -> bool:
            if not ended and (status := bench.runner.wait(pid, 0.0))[0] != "running":
                ended.append(status)
            return bool(ended)
    start = time.monotonic() + (bench.cli_overhead if cli else 0.0)
    if at_write:  # the moment the run's first temporary file or folder appears, plus 0-20 ms
        end = start + 3 * full + 30
        while time.monotonic() < end and not _writing(bench.root):
            if finished():
                break
            time.sleep(0.001)
        time.sleep(bench.rng.uniform(0.0, 0.02))
    else:  # past the first 30% (mostly process and Dagster start-up), so the kill lands in the asset's work
        time.sleep(max(0.0, start + bench.rng.uniform(0.3 * full, full) - time.monotonic()))
    killed = not finished()
    if killed:
        os.killpg(pid, signal.SIGKILL)
        if cli:
            proc.wait()
        else:
            bench.runner.wait(pid, 60)
    elif cli:
        proc.wait()
    delay = time.monotonic() - start + (bench.cli_overhead if cli else 0.0)
    left_by_kill = leftovers(bench.root)
    problems_sandbox = []
    if killed and spec.name.startswith(SANDBOX_ASSETS) and (stray := sandbox_leftovers(pid)):
        problems_sandbox.append(f"the killed run's sandbox left {stray[:3]}")
    facts = {"delay_s": round(delay, 3), "killed": killed, "left_by_kill": left_by_kill, "cli": cli,
             "at_write": at_write}
    problems = problems_sandbox
    try:
        after = spec.fingerprint(bench.root)
    except Broken as e:
        after = None
        problems.append(f"after the kill: {e}")
    # a plain re-run, same config: it must succeed with no clean-up, and leave no temporary file
    if cli:
        rerun = bench.cli(spec, i)
        t1 = time.perf_counter()
        try:
            rc = rerun.wait(timeout=600)
        except subprocess.TimeoutExpired:
            os.killpg(rerun.pid, signal.SIGKILL)
            rc = rerun.wait()
        bench.cli_overhead = max(0.0, time.perf_counter() - t1 - bench.seconds.get(spec.name, 0.0))
        ok, why = rc == 0, f"dagster asset materialize exited {rc}"
        if ok:
            bench.versions[(spec.name, spec.variant(i))] = spec.fingerprint(bench.root)
    else:
        ok, why = bench.run(spec, i)
    if not ok:
        problems.append(f"the re-run failed: {why}")
    try:
        new = spec.fingerprint(bench.root)
    except Broken as e:
        new = {}
        problems.append(f"after the re-run: {e}")
    if after is not None and new:
        problems += _compare(spec, after, old, new)
        facts["one_version"] = (not spec.exact) or _set_of(after, [old, new])
        if not facts["one_version"] and not problems:
            problems.append("its files come from both runs (each file whole, the set mixed)")
    left = leftovers(bench.root)
    if spec.name.startswith(SANDBOX_ASSETS):
        left += stale_local_workroots()
    if left:
        problems.append(f"left after the re-run: {left[:4]}")
    facts["left_after_rerun"] = left
    return Trial("kill", f"{spec.name} #{i}" + (" (CLI)" if cli else ""), not problems, "; ".join(problems),
                 time.perf_counter() - t0, facts)


def concurrent_trial(bench: Bench, spec: AssetSpec, i: int) -> Trial:
    """Two materializations of ``spec`` at once (variants i and i+1): both succeed, and the
    artifacts are one run's complete version."""
    t0 = time.perf_counter()
    if spec.prepare:
        spec.prepare(bench.root, 0)
    logs = [bench.log(f"{spec.name}-concurrent{k}") for k in (0, 1)]
    pids = [bench.runner.start(spec, i + k, logs[k]) for k in (0, 1)]
    problems = []
    for k, pid in enumerate(pids):
        status, code = bench.runner.wait(pid, 600)
        if status == "running":
            os.killpg(pid, signal.SIGKILL)
            bench.runner.wait(pid, 30)
        if (status, code) != ("exit", 0):
            problems.append(f"run {k + 1} failed ({status} {code}): {_failure(logs[k])}")
    try:
        after = spec.fingerprint(bench.root)
    except Broken as e:
        after = None
        problems.append(str(e))
    facts = {}
    if after is not None and spec.exact:  # (an asset whose input varies sees input 0 in both runs)
        both = [bench.versions.get((spec.name, spec.variant(i + k) if not spec.prepare else 0)) for k in (0, 1)]
        both = [v for v in both if v is not None]
        bad = [a for a in sorted(after) if all(after[a] != v.get(a, "absent") for v in both)]
        if bad:
            problems.append(f"{bad[:3]}: neither run's complete version")
        facts["one_version"] = _set_of(after, both)
        if not facts["one_version"] and not bad:
            problems.append("its files come from both runs (each file whole, the set mixed)")
    left = leftovers(bench.root)
    if left:
        problems.append(f"left: {left[:4]}")
    return Trial("concurrent", f"{spec.name} #{i}", not problems, "; ".join(problems), time.perf_counter() - t0, facts)


# =============================================================================================
# 4. a misbehaving LLM server
# =============================================================================================

OK_CHOICES = [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}]
BACKEND_MODES = ("trickle_body", "trickle_headers", "http_500", "http_429_day_retry_after", "non_json", "non_utf8",
                 "empty_body", "cut_body", "reset", "never_answers", "usage_5", "no_choices",
                 "content_not_string", "nesting_100000", "refused")


def _json_reply(obj) -> bytes:
    body = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    return (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n" + body)


class FaultServer(socketserver.ThreadingTCPServer):
    """An OpenAI-compatible endpoint on 127.0.0.1 that fails in one way (``mode``)."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str) -> None:
        self.mode, self.stop, self.requests = mode, threading.Event(), 0
        super().__init__(("127.0.0.1", 0), _FaultHandler)
        self.thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"

    def close(self) -> None:
        self.stop.set()
        self.shutdown()
        self.server_close()


class _FaultHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        srv: FaultServer = self.server
        sock: socket.socket = self.request
        sock.settimeout(5)
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = sock.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, body = data.split(b"\r\n\r\n", 1)
            n = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))
            while len(body) < n:
                body += sock.recv(65536)
            srv.requests += 1
            self._act(srv, sock)
        except OSError:
            return

    def _trickle(self, srv: FaultServer, sock: socket.socket, data: bytes, every: float) -> None:
        for b in data:
            sock.sendall(bytes([b]))
            if srv.stop.wait(every):
                return

    def _act(self, srv: FaultServer, sock: socket.socket) -> None:
        m = srv.mode
        if m == "trickle_body":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n")
            self._trickle(srv, sock, b'{"choices": [{"message": {"content": "' + b"x" * 900, 0.25)
        elif m == "trickle_headers":
            self._trickle(srv, sock, b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 900, 0.25)
        elif m == "http_500":
            body = b'{"error": {"message": "internal error"}}'
            sock.sendall(b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\nContent-Length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body)
        elif m == "http_429_day_retry_after":
            sock.sendall(b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 86400\r\nContent-Length: 0\r\n\r\n")
        elif m == "non_json":
            body = b"<html><body>502 Bad Gateway</body></html>"
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
        elif m == "non_utf8":
            sock.sendall(_json_reply(b'{"choices": [{"message": {"content": "\xff\xfe"}}]}'))
        elif m == "empty_body":
            sock.sendall(_json_reply(b""))
        elif m == "cut_body":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
                         + b'{"choices": [{"message": {"cont')
        elif m == "reset":  # linger 0: close sends RST, not FIN
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            sock.close()
        elif m == "never_answers":
            srv.stop.wait(120)
        elif m == "usage_5":
            sock.sendall(_json_reply({"choices": OK_CHOICES, "usage": 5}))
        elif m == "no_choices":
            sock.sendall(_json_reply({"id": "x", "object": "chat.completion", "usage": {}}))
        elif m == "content_not_string":
            sock.sendall(_json_reply({"choices": [{"message": {"content": {"text": "4"}}}]}))
        elif m == "nesting_100000":
            sock.sendall(_json_reply(b"[" * 100_000 + b"]" * 100_000))
        else:
            raise ValueError(m)


SAGE_NIGHT = "2026-11-05"
RULE = "Run the function by hand on every example of the task before answering."
RIGHT = "def f(x):\n    return x + 1\n"
WRONG = "def f(x):\n    return x\n"


def sage_tasks(n: int = 48) -> list:
    """Tasks of the SAGE harvest's shape (``sleep.sage_harvest``: a goal, SAGE's file, the tests the gate ran), as
    ``sage_pipeline_tests/sleep/test_sage_night.py`` builds them: f(x) = x + 1 in ``sol_<i>.py``."""
    from sage_pipeline.sleep.records import task_from_dict

    return [task_from_dict({"id": f"sage/s{i:03d}", "intent": f"[run {i}] write f(x) = x + 1, case {i}",
                            "reference_kind": "unit_tests",
                            "reference": {"entry_point": "f", "tests": [{"args": [1], "expected": 2},
                                                                       {"args": [5], "expected": 6}], "timeout_s": 5},
                            "meta": {"sage": {"artifact": f"sol_{i}.py", "entry_point": "f"}}}, f"fault:{i}")
            for i in range(n)]


class ScriptedChat:
    """A chat backend that draws fresh answers: SAGE's coder writes the right file with chance 0.95 when ``RULE``
    is among the skills in its system message, else 0.3; reflect proposes ``RULE`` for the TDD skill. ``delay_s``
    per call (so a night lasts long enough to be killed inside)."""

    draws_fresh = True

    def __init__(self, seed: int = 0, delay_s: float = 0.0) -> None:
        import numpy as np

        from sage_pipeline.sleep.backends import CallLog

        self.rng, self.delay_s, self.calls = np.random.default_rng(seed), delay_s, CallLog()

    def complete(self, messages: list[dict], purpose: str, max_tokens: int):
        from sage_pipeline.sage import skills as sk
        from sage_pipeline.sleep.backends import Reply

        if self.delay_s:
            time.sleep(self.delay_s)
        if purpose == "reflect":
            text = json.dumps({"edits": [{"op": "add", "target": "discipline/test-driven-development/SKILL.md",
                                          "content": RULE, "anchor": "", "rationale": "the failures"}]})
        else:
            skills = messages[0]["content"].partition(sk.PREFIX_HEADING)[2].partition("\n\n# Coder Instructions")[0]
            code = RIGHT if self.rng.random() < (0.95 if RULE in skills else 0.3) else WRONG
            text = json.dumps({"file": "sol.py", "operation": "create", "patch": code, "reason": "f",
                               "epistemic_flags": []})
        reply = Reply(text, 100, 20)
        self.calls.record(purpose, reply)
        return reply

    def describe(self) -> dict:
        return {"name": "scripted chat (fault injection)"}


class ScriptedJudge:
    """Passes exactly the right file: what the sandbox says of these two files, without running them."""

    def run(self, items):
        from sage_pipeline.sleep.judges import Judgement

        return [Judgement(1.0, 1.0) if code == RIGHT else Judgement(0.0, 0.5, "failed: 1/2 tests") for _, code in items]

    def describe(self) -> dict:
        return {"sandbox": "scripted"}

    def close(self) -> None:
        pass


def _lock_free(folder: Path) -> str:
    """'' when the root's night lock can be taken now, else why not."""
    import filelock

    from sage_pipeline.sleep.sage_night import NIGHT_LOCK

    lock = filelock.FileLock(folder / NIGHT_LOCK)
    try:
        lock.acquire(timeout=0.5)
    except filelock.Timeout:
        return f"the root's night lock {folder / NIGHT_LOCK} is still held"
    lock.release()
    return ""


def backend_trial(workdir: Path, mode: str, timeout_s: float, max_retries: int) -> Trial:
    """One SAGE night (``run_sage_night`` on SAGE-shaped tasks, the ``openai`` client of ``SageSkillsSettings``
    pointed at a server failing in ``mode``): ``backend_error`` within the bound, with its cause and the calls'
    errors on disk (over an earlier healthy result of the same night), the live version unchanged and whole, the
    night lock free."""
    from sage_pipeline.sleep.backends import OpenAIConfig
    from sage_pipeline.sleep.sage_harvest import untrusted_judge
    from sage_pipeline.sleep.sage_night import SageSkillsSettings, run_sage_night
    from sage_pipeline.sleep.sage_skills import SageSkillsRoot

    label = f"{mode} (timeout {timeout_s:g} s, {max_retries} retries)"
    work = Path(tempfile.mkdtemp(prefix=f"backend-{mode}-", dir=workdir))
    server = None if mode == "refused" else FaultServer(mode)
    if server is None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"  # closed again: nobody listens there
    else:
        url = server.base_url
    cfg = OpenAIConfig(base_url=url, model="m", timeout_s=timeout_s, max_retries=max_retries, backoff_s=0.05,
                       backoff_max_s=0.2, max_retry_after_s=0.5)
    settings = SageSkillsSettings(backend="openai", openai=cfg, sandbox="local", allow_untrusted_local=True)
    bound = (max_retries + 1) * timeout_s + max_retries * max(cfg.backoff_max_s, cfg.max_retry_after_s) + 1.5
    root = SageSkillsRoot(work / "skills")
    # the benchmark's own tasks (f(x) = x + 1), so the unisolated local sandbox is safe; never reached here
    unit = untrusted_judge("local", allow_untrusted_local=True)
    problems: list[str] = []
    try:
        first = run_sage_night(root, [], settings.make_backend(), unit, settings.night, date=SAGE_NIGHT)
        if first.status != "no_tasks":  # an earlier, healthy result of the same night on disk
            problems.append(f"the earlier night ended {first.status!r}, not no_tasks ({first.reason})")
        before = check_skills_root(root.folder)
        t0 = time.monotonic()
        try:
            r = run_sage_night(root, sage_tasks(), settings.make_backend(), unit, settings.night, date=SAGE_NIGHT)
        except BaseException as e:  # noqa: BLE001 - a night must end with a status, never raise
            return Trial("backend", label, False, f"the night raised {type(e).__name__}: {e}", time.monotonic() - t0)
        took = time.monotonic() - t0
    finally:
        if server:
            server.close()
        unit.close()
    if r.status != "backend_error":
        problems.append(f"ended {r.status!r}, not backend_error ({r.cause})")
    if took > bound:
        problems.append(f"took {took:.2f} s, past its bound {bound:.2f} s")
    on_disk = json.loads(Path(r.diagnostics).read_text())
    if on_disk.get("status") != "backend_error" or not on_disk.get("cause") or not on_disk.get("call_errors"):
        problems.append(f"the night's diagnostics.json says {on_disk.get('status')!r} (cause {on_disk.get('cause')!r}, "
                        f"{len(on_disk.get('call_errors') or [])} call errors)")
    try:
        after = check_skills_root(root.folder)
        if after["live"] != before["live"] or r.versions["after"] != before["live"]:
            problems.append(f"the live version changed: {before['live']} -> {after['live']}")
    except Broken as e:
        problems.append(f"the skills root is broken: {e}")
    if why := _lock_free(root.folder):
        problems.append(why)
    shutil.rmtree(work, ignore_errors=True)
    return Trial("backend", label, not problems, "; ".join(problems), took,
                 {"bound_s": round(bound, 2), "cause": (r.cause or "")[:160], "phase": r.phase,
                  "requests": server.requests if server else 0})


def night_lock_trial(workdir: Path, wait_s: float = 0.5) -> Trial:
    """Another night of the same root holds its night lock (a process of its own): this night waits
    ``lock_timeout_s``, then ends with the recorded status ``conflict`` (never an exception), its diagnostics say
    so, the live version is unchanged; once the other lets go, the next night runs."""
    from sage_pipeline.sleep.sage_night import NIGHT_LOCK, SageNightConfig, run_sage_night
    from sage_pipeline.sleep.sage_skills import SageSkillsRoot

    work = Path(tempfile.mkdtemp(prefix="night-lock-", dir=workdir))
    root = SageSkillsRoot(work / "skills")
    live = root.live()
    hold = "import filelock, sys\nlock = filelock.FileLock(sys.argv[1])\nlock.acquire()\nprint('held', flush=True)\n" \
           "sys.stdin.read()"
    holder = subprocess.Popen([sys.executable, "-c", hold, str(root.folder / NIGHT_LOCK)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
    problems: list[str] = []
    t0 = time.monotonic()
    try:
        if holder.stdout.readline().strip() != "held":
            return Trial("night", "night lock held by another night", False, "the lock holder did not start")
        t0 = time.monotonic()
        try:
            r = run_sage_night(root, sage_tasks(), ScriptedChat(), ScriptedJudge(),
                               SageNightConfig(lock_timeout_s=wait_s), date=SAGE_NIGHT)
        except BaseException as e:  # noqa: BLE001 - a conflict is a status now, never an exception
            return Trial("night", "night lock held by another night", False,
                         f"the night raised {type(e).__name__}: {e}", time.monotonic() - t0)
        took = time.monotonic() - t0
    finally:
        holder.stdin.close()
        holder.wait(10)
    if r.status != "conflict" or "another night of this skills root" not in r.reason:
        problems.append(f"ended {r.status!r}, not conflict ({r.reason})")
    if took < wait_s:
        problems.append(f"gave up after {took:.2f} s, before its lock_timeout_s {wait_s:g} s")
    on_disk = json.loads(Path(r.diagnostics).read_text())
    if on_disk.get("status") != "conflict" or not on_disk.get("finished_at"):
        problems.append(f"the night's diagnostics.json says {on_disk.get('status')!r}")
    if root.live() != live or r.calls:
        problems.append(f"the night changed the live version or called the backend ({r.calls})")
    nxt = run_sage_night(root, sage_tasks(), ScriptedChat(), ScriptedJudge(), SageNightConfig(), date=SAGE_NIGHT)
    if not nxt.ok or nxt.status == "conflict":
        problems.append(f"the next night, the lock free, ended {nxt.status!r} ({nxt.reason})")
    shutil.rmtree(work, ignore_errors=True)
    return Trial("night", "night lock held by another night", not problems, "; ".join(problems), took,
                 {"next_night": nxt.status})


BAD_CONFIGS = (  # (the asset's config, the field its error must name)
    ({"night": {"lock_timeout_s": -1}}, "night.lock_timeout_s"),
    ({"night": {"role": "reviewer"}}, "night.role"),
    ({"night": {"workers": 0}}, "night.workers"),
    ({"night": {"split": {"train": 0.6, "val": 0.5}}}, "night.split"),
    ({"night": {"samples": 3}}, "night.samples"),
    ({"openai": {"timeout_s": "soon"}}, "openai.timeout_s"),
    ({"ollama": {"max_retries": -2}}, "ollama.max_retries"),
    ({"backend": "grpc"}, "backend"),
    ({"sandbox": "vm"}, "sandbox"),
    ({"embedded_first_night": "Nov 1"}, "embedded_first_night"),
)


def bad_config_trial() -> Trial:
    """Each bad config of ``sleep_cycle/sage_skills`` (``SageSkillsSettings``, which the asset's Dagster config
    is, section by section) is refused before any night, its error naming the field."""
    from pydantic import ValidationError

    from sage_pipeline.sleep.sage_night import SageSkillsSettings

    t0 = time.monotonic()
    problems = []
    for cfg, fld in BAD_CONFIGS:
        try:
            SageSkillsSettings.model_validate(cfg)
        except ValidationError as e:
            if fld not in str(e):
                problems.append(f"{json.dumps(cfg)}: the error does not name {fld}: {str(e)[:200]}")
        else:
            problems.append(f"{json.dumps(cfg)} was accepted")
    return Trial("night", "bad configs", not problems, "; ".join(problems), time.monotonic() - t0,
                 {"configs": len(BAD_CONFIGS)})


def _night_worker(folder: str, seed: str) -> None:
    """A child of :func:`night_kill_trial`: one per-night SAGE night on ``folder`` whose gate accepts ``RULE`` and
    commits it; 'ready' on stdout once imported, then the night (its status on stdout)."""
    from sage_pipeline.sleep.gate import GateConfig
    from sage_pipeline.sleep.sage_night import SageNightConfig, run_sage_night
    from sage_pipeline.sleep.sage_skills import SageSkillsRoot

    root = SageSkillsRoot(folder)
    print("ready", flush=True)
    r = run_sage_night(root, sage_tasks(), ScriptedChat(int(seed), delay_s=0.002), ScriptedJudge(),
                       SageNightConfig(decisions="per_night", gate=GateConfig(samples=4)), date=SAGE_NIGHT)
    print(json.dumps({"status": r.status, "after": r.versions["after"], "seconds": r.seconds}), flush=True)


def _night_child(folder: Path, seed: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--night-worker", str(folder), str(seed)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True,
                            cwd=ROOT, start_new_session=True)
    if proc.stdout.readline().strip() != "ready":
        proc.wait(30)
        raise RuntimeError(f"the night worker did not start ({proc.returncode})")
    return proc


def night_calibrate(workdir: Path, seed: int = 0) -> dict:
    """A complete night in a child on a fresh root: the version it commits (the trials' "new") and its time."""
    folder = Path(tempfile.mkdtemp(prefix="night-calibrate-", dir=workdir)) / "skills"
    proc = _night_child(folder, seed)
    t0 = time.monotonic()  # from 'ready' (imported) to its end, as the trials' delays are
    out, _ = proc.communicate(timeout=600)
    done = json.loads(out.strip().splitlines()[-1])
    if done["status"] != "accepted":
        raise RuntimeError(f"the calibration night ended {done['status']}, not accepted")
    return {"new": done["after"], "seconds": time.monotonic() - t0}


def night_kill_trial(workdir: Path, i: int, cal: dict, rng: random.Random) -> Trial:
    """``kill -9`` of a SAGE night (``run_sage_night``) that commits: on even trials at a delay drawn from 30-100%
    of a complete night, on odd ones 0-20 ms after its commit's version folder starts being written. The root's live
    version must then be whole and the old or the new one, the history and the version folders consistent; the
    plain re-run of the night must succeed with no clean-up, leave the new version live and no staging folder or
    temporary file behind, and free the night lock."""
    from sage_pipeline.sleep.gate import GateConfig
    from sage_pipeline.sleep.sage_night import HEALTHY, SageNightConfig, run_sage_night
    from sage_pipeline.sleep.sage_skills import STAGING, SageSkillsRoot

    t0 = time.perf_counter()
    name = f"sage night commit (run_sage_night) #{i}"
    folder = Path(tempfile.mkdtemp(prefix=f"night-kill-{i}-", dir=workdir)) / "skills"
    old = SageSkillsRoot(folder).live()
    at_write = i % 2 == 1
    proc = _night_child(folder, 0)
    start = time.monotonic()
    if at_write:
        versions, end = folder / "versions", start + 3 * cal["seconds"] + 30
        while time.monotonic() < end and proc.poll() is None:
            with contextlib.suppress(OSError):
                if any(STAGING.fullmatch(e.name) for e in os.scandir(versions)):
                    break
            time.sleep(0.001)
        time.sleep(rng.uniform(0.0, 0.02))
    else:
        time.sleep(max(0.0, start + rng.uniform(0.3 * cal["seconds"], cal["seconds"]) - time.monotonic()))
    killed = proc.poll() is None
    if killed:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    facts = {"delay_s": round(time.monotonic() - start, 3), "killed": killed, "at_write": at_write,
             "left_by_kill": leftovers(folder)}
    problems: list[str] = []
    try:
        after = check_skills_root(folder)
        facts["live_after_kill"] = "new" if after["live"] == cal["new"] else "old" if after["live"] == old else "?"
        if facts["live_after_kill"] == "?":
            problems.append(f"after the kill the live version {after['live']} is neither the old nor the new one")
        diag = folder / "nights" / SAGE_NIGHT / "coder" / "diagnostics.json"
        if diag.exists():
            facts["diagnostics_after_kill"] = json.loads(diag.read_text()).get("status")
    except Broken as e:
        problems.append(f"after the kill: {e}")
    try:
        r = run_sage_night(SageSkillsRoot(folder), sage_tasks(), ScriptedChat(0), ScriptedJudge(),
                           SageNightConfig(decisions="per_night", gate=GateConfig(samples=4), lock_timeout_s=10),
                           date=SAGE_NIGHT)
        facts["rerun"] = r.status
        if r.status not in HEALTHY:
            problems.append(f"the re-run ended {r.status!r}: {r.reason} {r.cause}")
        final = check_skills_root(folder)
        if final["live"] != cal["new"]:
            problems.append(f"after the re-run the live version is {final['live']}, not the night's {cal['new']}")
    except Broken as e:
        problems.append(f"after the re-run: {e}")
    left = leftovers(folder)
    if left:
        problems.append(f"left after the re-run: {left[:4]}")
    if why := _lock_free(folder):
        problems.append(why)
    facts["left_after_rerun"] = left
    shutil.rmtree(folder.parent, ignore_errors=True)
    return Trial("kill", name, not problems, "; ".join(problems), time.perf_counter() - t0, facts)


# =============================================================================================
# 5. a killed night holding the pool's only slot (dagster-daemon, run monitoring)
# =============================================================================================

def _engine_pid(instance, run_id: str) -> int | None:
    """The pid of the process executing a run's steps (its ENGINE_EVENT says so)."""
    from dagster import DagsterEventType

    for rec in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT):
        md = rec.dagster_event.event_specific_data.metadata or {}
        if "pid" in md:
            return int(md["pid"].value)
    return None


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                kids = [int(x) for x in (task / "children").read_text().split()]
                out += kids
                todo += kids
    return out


def _waits_on_night_lock(instance, run_id: str, root: Path) -> bool:
    """Whether the run's night is past its harvest (logged) and has not started its night (the night writes its
    ``diagnostics.json`` as soon as it holds the root's night lock): it waits on the lock."""
    harvested = any("harvest_sage for " in (rec.user_message or "") for rec in instance.all_logs(run_id))
    return harvested and not any((root / "nights").rglob("diagnostics.json"))


def pool_trial(workdir: Path) -> Trial:
    """A ``sleep_cycle/sage_skills`` night launched by the daemon hangs while holding the sleep_cycle pool's only
    slot; its run worker (and what it started) is killed with -9; the next night must get the slot and run.

    The night hangs on its root's night lock, which the benchmark holds (its ``lock_timeout_s`` 600 s), where the
    generic night this trial was written for hung on its LLM call: the SAGE night reaches the model only with
    harvested tasks, and the shipped week ships no goal ledger, so it has none (the night's backend is configured
    at a never-answering server all the same). The benchmark lets the lock go right after the kill."""
    import filelock
    import yaml
    from dagster import DagsterInstance, DagsterRunStatus, RunsFilter

    from sage_pipeline.sleep.sage_night import NIGHT_LOCK

    t0 = time.monotonic()
    home = workdir / "pool_home"
    home.mkdir()
    data = workdir / "pool_data"
    lock_path = data.joinpath(*SKILLS_ROOT) / NIGHT_LOCK
    lock_path.parent.mkdir(parents=True)
    night_lock = filelock.FileLock(lock_path)
    night_lock.acquire()
    cfg = yaml.safe_load((ROOT / ".dagster_home" / "dagster.yaml").read_text())
    assert cfg["concurrency"]["pools"]["default_limit"] == 1 and cfg["run_monitoring"]["enabled"]
    cfg["run_monitoring"].update(poll_interval_seconds=2, free_slots_after_run_end_seconds=1)
    (home / "dagster.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    server = FaultServer("never_answers")
    env = {**os.environ, "DAGSTER_HOME": str(home), "SAGE_DATA_DIR": str(data), "GX_ANALYTICS_ENABLED": "false",
           "PYTHONWARNINGS": "ignore"}
    instance = DagsterInstance.from_config(str(home))
    log = open(workdir / "pool_daemon.log", "wb")  # noqa: SIM115
    daemon = subprocess.Popen([str(BIN / "dagster-daemon"), "run", "-w", str(ROOT / "workspace.yaml")], cwd=ROOT,
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    problems, facts = [], {}

    def wait(what, pred, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            v = pred()
            if v:
                return v
            if daemon.poll() is not None:
                raise RuntimeError(f"dagster-daemon exited {daemon.returncode} while waiting for {what}")
            time.sleep(0.5)
        raise TimeoutError(f"waited {timeout:.0f} s for {what}")

    def launch(tag: str, config: dict) -> None:
        run_config = {"ops": {"sleep_cycle__sage_skills": {"config": config}}}
        subprocess.run([str(BIN / "dagster"), "job", "launch", "-w", str(ROOT / "workspace.yaml"),
                        "-j", "nightly_sleep",
                        "--config-json", json.dumps(run_config),
                        "--tags", json.dumps({"dagster/partition": "2026-11-01", "fault_injection": tag})],
                       env=env, cwd=ROOT, check=True, capture_output=True, timeout=120, start_new_session=True)

    def run_of(tag):
        runs = instance.get_runs(filters=RunsFilter(tags={"fault_injection": tag}))
        return runs[0] if runs else None

    try:
        wait("the daemon's heartbeats", lambda: {"MONITORING", "QUEUED_RUN_COORDINATOR"}
             <= set(instance.get_daemon_heartbeats()), 90)
        launch("hung", {"backend": "openai", "openai": {"base_url": server.base_url, "model": "m", "timeout_s": 600,
                                                        "max_retries": 0}, "night": {"lock_timeout_s": 600}})
        first = wait("the first night's run", lambda: run_of("hung"), 60)
        wait("the first night to wait on its root's night lock",
             lambda: _waits_on_night_lock(instance, first.run_id, lock_path.parent), 180)
        time.sleep(2)
        facts["first_waited_on_lock"] = _waits_on_night_lock(instance, first.run_id, lock_path.parent)
        claimed = instance.event_log_storage.get_concurrency_info("sleep_cycle").claimed_slots
        facts["slot_holder_is_first"] = [s.run_id for s in claimed] == [first.run_id]
        launch("next", {})
        time.sleep(3)
        facts["second_waited"] = run_of("next").status != DagsterRunStatus.SUCCESS
        pid = _engine_pid(instance, first.run_id)
        if pid is None:
            raise RuntimeError("no engine pid recorded for the first run")
        victims = [pid, *_descendants(pid)]
        facts["killed_pids"] = len(victims)
        for p in victims:  # the run worker and its step process: by pid (the daemon shares their group)
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        killed_at = time.monotonic()
        night_lock.release()
        wait("the dead run to be marked failed", lambda: run_of("hung").status == DagsterRunStatus.FAILURE, 120)
        wait("the next night to get the slot and succeed",
             lambda: run_of("next").status == DagsterRunStatus.SUCCESS, 180)
        facts["freed_after_s"] = round(time.monotonic() - killed_at, 1)
        if instance.event_log_storage.get_concurrency_info("sleep_cycle").claimed_slots:
            problems.append("a slot is still claimed after both runs ended")
        if not facts["slot_holder_is_first"] or not facts["second_waited"] or not facts["first_waited_on_lock"]:
            problems.append(f"the setup did not hold the slot as meant: {facts}")
        try:
            check_skills_root(data.joinpath(*SKILLS_ROOT))
        except Broken as e:
            problems.append(f"the skills root after both nights: {e}")
    except Exception as e:  # noqa: BLE001 - reported as the trial's failure
        problems.append(f"{type(e).__name__}: {e}")
    finally:
        if night_lock.is_locked:
            night_lock.release()
        server.close()
        instance.dispose()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if daemon.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(daemon.pid, sig)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    daemon.wait(20)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(daemon.pid, signal.SIGKILL)
        log.close()
    return Trial("pool", "sleep_cycle/sage_skills night killed holding the pool slot", not problems,
                 "; ".join(problems), time.monotonic() - t0, facts)


# =============================================================================================
# the run
# =============================================================================================

CHECKED = {
    "fuzz": "ingest never raises; accepted + quarantined == read == an exact reader's count; every valid "
            "(recoverable) line accepted, every poison line quarantined; damaged .gz files, the unreadable "
            "folder and a broken link named; files behind a symlinked folder (and a loop) read once",
    "kill": "after kill -9 of the run's process group: every artifact reads completely and is the old or the "
            "new version, all of an asset's files one run's set (sage_skills: the skills root's history, version "
            "folders and live pointer whole; a SAGE night killed in its commit: live version old or new, the "
            "re-run commits the new); "
            "sandbox assets: no container of the killed run and no local runner of a dead host within 20 s; a "
            "plain re-run succeeds; no temp file/folder left (nor a dead host's local sandbox folder)",
    "concurrent": "both runs succeed; every artifact one run's complete version; no temp file/folder left",
    "backend": "the SAGE night (run_sage_night, the openai client of SageSkillsSettings) ends backend_error within "
               "(retries+1)*timeout + capped waits + 1.5 s; its diagnostics.json says so with the cause and the calls' "
               "errors (over an earlier healthy result); the live version unchanged and whole; the night lock free",
    "night": "a night whose root's night lock another night holds ends with the recorded status conflict after its "
             "lock_timeout_s (no exception, diagnostics say so, live version unchanged) and the next night runs; each "
             "bad config of sleep_cycle/sage_skills is refused, its error naming the field",
    "pool": "the dead run is marked failed; the night queued behind it gets the slot and succeeds; the root whole",
    "disk": "a set written to a full tmpfs fails naming the path and the asset (not a bare [Errno 28]); the "
            "previous set reads whole; no half-written version left (sage_skills: a commit of its skills root, the "
            "live version whole and unchanged, then the same commit goes through once the disk is freed)",
    "cli_pool": "after kill -9 of a pooled CLI run holding the slot, the next plain CLI run finishes within 60 s "
                "and the dead run is marked failed (no reaper run by hand)",
}


# =============================================================================================
# 6. a full disk; 7. a killed pooled CLI run
# =============================================================================================

DISK_ASSETS = {"trajectories": ["routing/trajectories.parquet", "routing/quarantine.jsonl"],
               "routing_dataset": ["routing/routing_v1.parquet", "routing/routing_v1.jsonl",
                                   "routing/action_space.json"],
               "sleep_cycle/sage_skills": None}  # a commit of the SAGE skills root: disk_trial_skills


def disk_trial(workdir: Path, asset: str, seed: int) -> Trial:
    if DISK_ASSETS[asset] is None:
        return disk_trial_skills(workdir, seed)
    t0, rng = time.monotonic(), random.Random(seed)
    mnt = workdir / f"disk-{seed}"
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        return Trial("disk", f"{asset} #{seed}", False, f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        members = DISK_ASSETS[asset]
        with artifacts.writer(asset), artifacts.atomic_set(mnt, asset.replace("/", "__"), members) as stage:
            for m in members:
                artifacts.write_text(stage.path(m), f"old {m}\n")
        old = {m: (mnt / m).read_text() for m in members}
        with open(mnt / "filler", "ab", buffering=0) as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 4096)
        left = rng.randint(0, 48) * 1024
        os.truncate(mnt / "filler", max(0, os.path.getsize(mnt / "filler") - left))
        problems, msg = [], ""
        try:
            with artifacts.writer(asset), artifacts.atomic_set(mnt, asset.replace("/", "__"), members) as stage:
                for m in members:
                    artifacts.write_bytes(stage.path(m), os.urandom(rng.randint(20, 200) * 1024))
            problems.append("the write did not fail on a full disk")
        except artifacts.ArtifactWriteError as e:
            msg = str(e)
            if f"asset {asset}" not in msg or f"could not write {mnt}" not in msg or "No space left" not in msg:
                problems.append(f"the error does not name the path and the asset: {msg}")
        except OSError as e:
            problems.append(f"a bare OSError: {e}")
        now = {m: (mnt / m).read_text() for m in members}
        if now != old:
            problems.append("the previous set changed")
        partial = [p.name for p in (mnt / artifacts.SETS_DIR).rglob("*.partial")]
        if partial:
            problems.append(f"half-written versions left: {partial}")
        return Trial("disk", f"{asset} #{seed}", not problems, "; ".join(problems), time.monotonic() - t0,
                     {"left_kb": left // 1024, "message": msg})
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def disk_trial_skills(workdir: Path, seed: int) -> Trial:
    """``sleep_cycle/sage_skills`` on a full disk: a commit of its SAGE skills root (a new version folder, written
    whole by ``artifacts.atomic_dir``, then the history and the pointer) into a real tmpfs filled but for 0-48 KB
    must fail naming the path and the asset, leave the live version whole and unchanged, and leave no staging
    folder (a version folder written whole before the history's write failed may stay, referenced by nothing: the
    root never removes one); with the disk freed the same commit must then go through. The night's own files are
    single atomic writes (``artifacts.write_json``): the set the old trial wrote is no longer one."""
    from sage_pipeline.sleep.sage_skills import STAGING, SageSkillsRoot

    asset = "sleep_cycle/sage_skills"
    t0, rng = time.monotonic(), random.Random(seed)
    mnt = workdir / f"disk-{seed}"
    mnt.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if r.returncode:
        return Trial("disk", f"{asset} #{seed}", False, f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        with artifacts.writer(asset):
            root = SageSkillsRoot(mnt.joinpath(*SKILLS_ROOT))
        tdd = "discipline/test-driven-development/SKILL.md"
        old = check_skills_root(root.folder, mnt)
        with open(mnt / "filler", "ab", buffering=0) as fh, contextlib.suppress(OSError):
            while True:
                fh.write(b"\0" * 4096)
        left = rng.randint(0, 48) * 1024
        os.truncate(mnt / "filler", max(0, os.path.getsize(mnt / "filler") - left))
        problems, msg = [], ""
        try:
            with artifacts.writer(asset):
                root.commit({tdd: root.text("live", tdd) + f"\n- {RULE}\n"}, "fault injection: a full disk")
            problems.append("the commit did not fail on a full disk")
        except artifacts.ArtifactWriteError as e:
            msg = str(e)
            if f"asset {asset}" not in msg or f"could not write {mnt}" not in msg or "No space left" not in msg:
                problems.append(f"the error does not name the path and the asset: {msg}")
        except OSError as e:
            problems.append(f"a bare OSError: {e}")
        orphan = []
        try:
            now = check_skills_root(root.folder, mnt)
            if (now["live"], now["history"]) != (old["live"], old["history"]):
                problems.append(f"the root changed: live {old['live']} -> {now['live']}, history {old['history']} "
                                f"-> {now['history']} lines")
            # a version folder written whole before the history's write failed stays, referenced by nothing (the
            # root never removes a version folder); check_skills_root has checked that its files are its id's
            orphan = sorted(set(now["versions"].split(",")) - set(old["versions"].split(",")))
            changed = [k for k in set(old) | set(now) if k != "versions" and old.get(k) != now.get(k)]
            if changed:
                problems.append(f"changed by the failed commit: {sorted(changed)[:4]}")
        except Broken as e:
            problems.append(f"the root is broken: {e}")
        partial = [p.name for p in root.versions_dir.iterdir() if STAGING.fullmatch(p.name)]
        if partial:
            problems.append(f"half-written versions left: {partial}")
        os.unlink(mnt / "filler")  # the disk freed, the same commit goes through with no clean-up
        try:
            with artifacts.writer(asset):
                entry = root.commit({tdd: root.text("live", tdd) + f"\n- {RULE}\n"}, "fault injection: disk freed")
            if check_skills_root(root.folder, mnt)["live"] != entry.version or entry.version == old["live"]:
                problems.append("the commit after the disk was freed did not make its version live")
        except (OSError, Broken, ValueError) as e:
            problems.append(f"the commit after the disk was freed failed: {e}")
        return Trial("disk", f"{asset} #{seed}", not problems, "; ".join(problems), time.monotonic() - t0,
                     {"left_kb": left // 1024, "message": msg, "whole_unreferenced_version": bool(orphan)})
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


POOL_TOY = '''
import os, time
import dagster as dg
from sage_pipeline.defs.run_reaper import reaping

@dg.asset(pool="toy_pool")
def slow() -> None:
    time.sleep(float(os.environ.get("TOY_SLEEP", "0")))

defs = dg.Definitions(assets=[slow], executor=reaping(dg.multiprocess_executor))
'''


def cli_pool_trial(workdir: Path, i: int) -> Trial:
    """kill -9 of a pooled CLI run holding the only slot; the next CLI run must finish within 60 s."""
    import dagster as dg

    t0 = time.monotonic()
    home = workdir / f"cli_pool-{i}"
    home.mkdir(parents=True)
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\nconcurrency:\n  pools:\n    default_limit: 1\n")
    (home / "toy.py").write_text(POOL_TOY)
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(ROOT)}

    def cli(sleep: float, **kw) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / "dagster"), "asset", "materialize", "-f", str(home / "toy.py"),
                                 "--select", "slow"], env=env | {"TOY_SLEEP": str(sleep)}, cwd=home,
                                start_new_session=True, **kw)

    problems: list[str] = []
    with dg.DagsterInstance.from_config(str(home)) as inst:
        first = cli(600, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        run = None
        try:
            end = time.monotonic() + 120
            while time.monotonic() < end and run is None:
                runs = inst.get_runs(filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED]))
                if runs and inst.all_logs(runs[0].run_id, of_type=dg.DagsterEventType.STEP_START):
                    run = runs[0]
                time.sleep(0.3)
            time.sleep(random.Random(i).uniform(0, 1.0))
        finally:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait()
        if run is None:
            return Trial("cli_pool", f"pooled CLI run #{i}", False, "the first run's step never started")
        t1 = time.monotonic()
        second = cli(0, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = second.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)
            out, _ = second.communicate()
            problems.append("the next CLI run did not finish within 60 s")
        took = time.monotonic() - t1
        if second.returncode != 0:
            problems.append(f"the next CLI run failed: {out[-500:]}")
        if inst.get_run_by_id(run.run_id).status != dg.DagsterRunStatus.FAILURE:
            problems.append("the killed run was not marked failed")
    return Trial("cli_pool", f"pooled CLI run #{i}", not problems, "; ".join(problems), time.monotonic() - t0,
                 {"next_run_s": round(took, 1)})


def summarize(trials: list[Trial]) -> list[dict]:
    rows = []
    for cat in CHECKED:
        ts = [t for t in trials if t.category == cat]
        if not ts:
            continue
        groups: dict[str, list[Trial]] = {}
        for t in ts:
            key = (t.name.split(" #")[0].split(" (")[0] if cat in ("kill", "concurrent", "backend", "disk", "cli_pool")
                   else "SAGE journal sets" if cat == "fuzz" else t.name)
            groups.setdefault(key, []).append(t)
        for key, g in groups.items():
            extra = ""
            if cat == "kill":
                hit = sum(1 for t in g if t.facts.get("left_by_kill"))
                mixed = sum(1 for t in g if t.facts.get("one_version") is False)
                cli = sum(1 for t in g if t.facts.get("cli"))
                aimed = sum(1 for t in g if t.facts.get("at_write") and t.facts.get("killed"))
                extra = (f"; {sum(t.facts.get('killed', False) for t in g)} killed mid-run ({aimed} as a write began), "
                         f"{hit} left temporary files (all swept by the re-run)"
                         + (f", {mixed} left some files old and some new (each whole)" if mixed else "")
                         + (f"; {cli} through the dagster CLI" if cli else ""))
            elif cat == "fuzz":
                extra = (f"; {sum(t.facts.get('lines_read', 0) for t in g):,} lines read, "
                         f"{sum(sum(t.facts.get('poisons', {}).values()) for t in g):,} poison lines, "
                         f"{sum(sum(t.facts.get('gz', {}).values()) for t in g)} .gz files")
            elif cat == "backend":
                bound = max(t.facts.get("bound_s", 0) for t in g)
                extra = f"; slowest {max(t.seconds for t in g):.2f} s of bound {bound:.2f} s"
            rows.append({"category": cat, "what": key, "trials": len(g), "failures": sum(not t.ok for t in g),
                         "notes": extra.lstrip("; ")})
    return rows


def print_table(rows: list[dict], trials: list[Trial]) -> str:
    lines = ["| category | what | trials | failures | notes |", "|---|---|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['category']} | {r['what']} | {r['trials']} | {r['failures']} | {r['notes']} |")
    total, failed = len(trials), sum(not t.ok for t in trials)
    lines.append(f"| **total** | | **{total}** | **{failed}** | |")
    out = "\n".join(lines)
    out += "\n\nChecked per category:\n" + "\n".join(f"- {k}: {v}" for k, v in CHECKED.items()
                                                       if any(t.category == k for t in trials))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials-per-asset", type=int, default=5, help="kill -9 trials per writer asset")
    ap.add_argument("--concurrent-per-asset", type=int, default=2, help="pairs of concurrent runs per asset")
    ap.add_argument("--fuzz-trials", type=int, default=120, help="fuzzed journal sets")
    ap.add_argument("--backend-rounds", type=int, default=2, help="rounds over every LLM-server failure mode")
    ap.add_argument("--quick", action="store_true", help="a few trials of each, no CLI trials")
    ap.add_argument("--cli-assets", default="synthetic_sessions,offline_eval,sleep_cycle/sage_skills",
                    help="assets whose last kill trial kills `dagster asset materialize` and re-runs with it "
                         "('all', or a comma list; each CLI call pays Dagster's import, seconds)")
    ap.add_argument("--no-cli", action="store_true", help="no trial through the dagster asset materialize CLI")
    ap.add_argument("--pool", action="store_true", help="also the dagster-daemon pool trial (1-2 minutes; the "
                    "same case with a toy job is sage_pipeline_tests/defs/test_run_monitoring.py)")
    ap.add_argument("--assets", default="all", help="writer assets for the kill and concurrent trials ('all', "
                    "or a comma list; the inputs of the first one are materialized first)")
    ap.add_argument("--disk-trials", type=int, default=30, help="full-disk trials (root only: a tmpfs each)")
    ap.add_argument("--cli-pool-trials", type=int, default=2, help="kill -9 of a pooled CLI run, then the next")
    ap.add_argument("--night-kills", type=int, default=5, help="kill -9 trials of a SAGE night inside its commit "
                    "(run_sage_night in a child; with sleep_cycle/sage_skills among --assets)")
    ap.add_argument("--no-kill", action="store_true", help="skip the kill and concurrent trials (the longest)")
    ap.add_argument("--scratch", type=Path, default=None, help="where everything is written (default: a fresh "
                    "temporary folder; never inside the clone, which may be read-only)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", action="store_true", help="keep the temporary folders (printed)")
    args = ap.parse_args()
    if args.quick:
        args.trials_per_asset, args.concurrent_per_asset, args.fuzz_trials, args.backend_rounds = 2, 1, 20, 1
        args.no_cli = True
        args.disk_trials, args.cli_pool_trials, args.night_kills = 3, 1, 2
    chosen = {s.name for s in ASSETS} if args.assets == "all" else set(args.assets.split(","))
    if chosen - {s.name for s in ASSETS}:
        ap.error(f"--assets: unknown {sorted(chosen - {s.name for s in ASSETS})}; use {[s.name for s in ASSETS]}")
    cli_assets = {s.name for s in ASSETS} if args.cli_assets == "all" else set(args.cli_assets.split(","))
    unknown = cli_assets - {s.name for s in ASSETS}
    if unknown:
        ap.error(f"--cli-assets: unknown {sorted(unknown)}; use asset names from {[s.name for s in ASSETS]}")
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="fault_injection-scratch-"))
    scratch.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fault_injection-", dir=scratch))
    work.chmod(0o755)
    print(f"fault injection on {platform.node()} ({os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}), "
          f"work folder {work}", flush=True)
    trials: list[Trial] = []
    t_start = time.monotonic()

    def report(t: Trial) -> None:
        trials.append(t)
        if not t.ok:
            print(f"  FAILED {t.category} {t.name}: {t.detail}", flush=True)

    # 1. fuzz
    t0 = time.monotonic()
    for t in fuzz_trials(work, list(range(args.seed * 10_000, args.seed * 10_000 + args.fuzz_trials))):
        report(t)
    print(f"fuzz: {args.fuzz_trials} sets in {time.monotonic() - t0:.0f} s", flush=True)

    # 2-3. kills and concurrent runs, asset by asset in lineage order
    bench = Bench(work / "kill", args.seed)
    if args.no_kill:
        chosen = set()
    try:
        last_chosen = max((i for i, sp in enumerate(ASSETS) if sp.name in chosen), default=-1)
        for spec in ASSETS[:last_chosen + 1]:  # and what they read, in lineage order
            t0 = time.monotonic()
            for i in (0, 1):  # both config variants once, complete: the versions the trials compare with
                if spec.prepare:
                    spec.prepare(bench.root, i)
                ok, why = bench.run(spec, i)
                if not ok:
                    raise RuntimeError(f"{spec.name} does not materialize: {why}")
            if not args.no_cli and spec.name in cli_assets and not bench.cli_overhead:
                bench.calibrate_cli(spec)
                print(f"dagster asset materialize takes {bench.cli_overhead:.1f} s more than a forked run", flush=True)
            if spec.name not in chosen:
                continue  # materialized above as the next assets' input only
            for i in range(args.trials_per_asset):
                last = i == args.trials_per_asset - 1
                report(kill_trial(bench, spec, i, cli=last and not args.no_cli and spec.name in cli_assets))
            for i in range(args.concurrent_per_asset):
                report(concurrent_trial(bench, spec, 2 * i))
            if spec.prepare:  # leave the inputs of the next asset as variant 0 had them
                spec.prepare(bench.root, 0)
                bench.run(spec, 0)
            print(f"{spec.name}: {args.trials_per_asset} kills, {args.concurrent_per_asset} concurrent pairs in "
                  f"{time.monotonic() - t0:.0f} s (full run {bench.seconds.get(spec.name, 0):.2f} s)", flush=True)
    finally:
        bench.close()

    # 2b. kill -9 of a SAGE night inside its commit (the asset's nights above commit nothing: no model, no task)
    if args.night_kills and "sleep_cycle/sage_skills" in chosen:
        t0 = time.monotonic()
        cal = night_calibrate(work)
        rng = random.Random(args.seed)
        for i in range(args.night_kills):
            report(night_kill_trial(work, i, cal, rng))
        print(f"sage night commit: {args.night_kills} kills in {time.monotonic() - t0:.0f} s (a complete night "
              f"{cal['seconds']:.2f} s)", flush=True)

    # 4. the LLM server; the night lock and bad configs
    t0 = time.monotonic()
    for rnd in range(args.backend_rounds):
        for mode in BACKEND_MODES:
            report(backend_trial(work, mode, timeout_s=1.0, max_retries=rnd % 2))
    if args.backend_rounds:
        report(night_lock_trial(work))
        report(bad_config_trial())
    print(f"backend: {args.backend_rounds * len(BACKEND_MODES)} nights in {time.monotonic() - t0:.0f} s", flush=True)

    # 5. the pool slot
    if args.pool:
        t0 = time.monotonic()
        report(pool_trial(work))
        print(f"pool: 1 trial in {time.monotonic() - t0:.0f} s", flush=True)

    # 6. a full disk
    if args.disk_trials and os.geteuid() != 0:
        print("disk: skipped (mounting a tmpfs needs root)", flush=True)
    elif args.disk_trials:
        t0 = time.monotonic()
        for k in range(args.disk_trials):
            report(disk_trial(work, list(DISK_ASSETS)[k % len(DISK_ASSETS)], args.seed * 10_000 + k))
        print(f"disk: {args.disk_trials} trials in {time.monotonic() - t0:.0f} s", flush=True)

    # 7. a killed pooled CLI run
    t0 = time.monotonic()
    for k in range(args.cli_pool_trials):
        report(cli_pool_trial(work, k))
    print(f"cli_pool: {args.cli_pool_trials} trials in {time.monotonic() - t0:.0f} s", flush=True)

    rows = summarize(trials)
    table = print_table(rows, trials)
    took = time.monotonic() - t_start
    print(f"\n{len(trials)} trials in {took:.0f} s, {sum(not t.ok for t in trials)} failed\n")
    print(table)
    (scratch / "fault_injection.json").write_text(json.dumps({
        "machine": {"node": platform.node(), "cores": os.cpu_count(), "python": platform.python_version()},
        "args": vars(args), "seconds": round(took, 1), "rows": rows,
        "trials": [dataclasses.asdict(t) for t in trials]}, indent=1, default=str))
    print(f"results: {scratch / 'fault_injection.json'}")
    if args.keep:
        print(f"\nkept {work}")
    else:
        subprocess.run(["chmod", "-R", "u+rwx", str(work)], check=False)
        shutil.rmtree(work, ignore_errors=True)
    return 1 if any(not t.ok for t in trials) else 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--runner":
        _runner_main()
    elif len(sys.argv) > 1 and sys.argv[1] == "--night-worker":
        _night_worker(sys.argv[2], sys.argv[3])
    elif len(sys.argv) > 1 and sys.argv[1] == "--fuzz-worker":
        _fuzz_worker(sys.argv[2], sys.argv[3])
    else:
        sys.exit(main())
