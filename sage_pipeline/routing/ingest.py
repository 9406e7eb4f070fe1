"""Streaming ingest of SAGE session logs (JSON lines) into ``trajectories.parquet``.

Every line of every ``*.jsonl`` / ``*.jsonl.gz`` file under the configured folders is
read exactly once, in bounded memory (a few MB of buffer plus one batch of rows):

* ``TRAJECTORY_STEP`` events that pass validation become rows;
* other SAGE event types are counted per type and skipped (never an error);
* anything else (truncated JSON, not an object, wrong types, non-finite or out-of-range
  numbers, missing fields, unknown role or model, propensity outside (0, 1], duplicate
  events, non-UTF-8 bytes, over-long lines) goes to ``quarantine.jsonl`` with its file,
  line number and reason.

``lines_read == accepted_lines + quarantined_lines`` holds for every run, where accepted
lines are the trajectory rows, the other events and blank lines.

The hot path decodes each line once with a typed msgspec decoder (types are checked in
C) and validates values column-wise with numpy; only bad lines take the slow path that
works out a precise reason.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Union

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sage_pipeline import artifacts
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN, ROLES, TRAJECTORY_STEP

log = logging.getLogger(__name__)

LOG_PATTERNS = ("*.jsonl", "*.jsonl.gz")
RAW_HEAD = 240  # characters of a bad line kept in the quarantine record
ROW_GROUP_ROWS = 1 << 17  # rows per Parquet row group


# ---------------------------------------------------------------- event schema
class Action(msgspec.Struct, gc=False, frozen=True):
    model_chosen: Union[str, None] = None


class State(msgspec.Struct, gc=False, frozen=True):
    task_complexity_score: Union[float, None] = None
    primary_failure_count: Union[int, None] = None
    failure_count: Union[int, None] = None
    prompt_tokens: Union[int, None] = None
    verification_passed: Union[bool, None] = None
    failed_reason: Union[str, None] = None
    timed_out: Union[bool, None] = None
    reviewer_score: Union[float, None] = None
    latency_s: Union[float, None] = None
    cost_usd: Union[float, None] = None


class Extra(msgspec.Struct, gc=False, frozen=True):
    synthetic: Union[bool, None] = None


class Event(msgspec.Struct, gc=False):
    """The fields of a SAGE event that the routing dataset reads; others are ignored."""

    type: str
    timestamp: Union[str, None] = None
    session_id: Union[str, None] = None
    task_id: Union[str, None] = None
    agent: Union[str, None] = None
    step: Union[int, None] = None
    action: Action = Action()  # frozen shared defaults: no allocation for other event types
    propensity: Union[float, None] = None
    state: State = State()
    reward: Union[float, None] = None
    terminal: Union[bool, None] = None
    extra: Extra = Extra()


# column name -> (attribute path, arrow type, required)
_FIELDS: dict[str, tuple[str, pa.DataType, bool]] = {
    "timestamp": ("timestamp", pa.string(), True),
    "session_id": ("session_id", pa.string(), True),
    "task_id": ("task_id", pa.string(), True),
    "role": ("agent", pa.string(), True),
    "step": ("step", pa.int64(), True),
    "model": ("action.model_chosen", pa.string(), True),
    "propensity": ("propensity", pa.float64(), False),
    "task_complexity_score": ("state.task_complexity_score", pa.float64(), True),
    "primary_failure_count": ("state.primary_failure_count", pa.int64(), True),
    "failure_count": ("state.failure_count", pa.int64(), False),
    "prompt_tokens": ("state.prompt_tokens", pa.int64(), False),
    "verification_passed": ("state.verification_passed", pa.bool_(), False),
    "failed_reason": ("state.failed_reason", pa.string(), False),
    "timed_out": ("state.timed_out", pa.bool_(), False),
    "reviewer_score": ("state.reviewer_score", pa.float64(), False),
    "latency_s": ("state.latency_s", pa.float64(), False),
    "cost_usd": ("state.cost_usd", pa.float64(), False),
    "logged_reward": ("reward", pa.float64(), True),
    "terminal": ("terminal", pa.bool_(), True),
}
_DECODE = msgspec.json.Decoder(Event).decode
_TYPE = attrgetter("type")
_ACTION, _STATE, _EXTRA, _SYN = (attrgetter("action"), attrgetter("state"), attrgetter("extra"),
                                  attrgetter("synthetic"))

TRAJECTORY_SCHEMA = pa.schema(
    [(col, typ) for col, (_, typ, _) in _FIELDS.items()]
    + [("data_source", pa.string()), ("source_file", pa.string()), ("source_line", pa.int64())]
)


# ---------------------------------------------------------------- config/result
@dataclass(frozen=True)
class IngestConfig:
    log_dirs: tuple[Path, ...]
    max_line_bytes: int = 1 << 20
    read_chunk_bytes: int = 1 << 21
    setting: str = "log_dirs"  # the setting that names the folders, for error messages

    def __post_init__(self) -> None:
        if self.max_line_bytes < 1024:
            raise ValueError(f"max_line_bytes must be >= 1024, got {self.max_line_bytes}")
        if self.read_chunk_bytes < 1:  # 0 would read nothing, a negative size whole files
            raise ValueError(f"read_chunk_bytes must be >= 1, got {self.read_chunk_bytes}")


@dataclass
class IngestStats:
    files: list[str] = field(default_factory=list)
    empty_files: list[str] = field(default_factory=list)
    bytes_read: int = 0
    lines_read: int = 0
    steps_accepted: int = 0
    blank_lines: int = 0
    other_events: Counter = field(default_factory=Counter)
    quarantined: int = 0
    quarantine_reasons: Counter = field(default_factory=Counter)
    rows_by_source: Counter = field(default_factory=Counter)
    seconds: float = 0.0

    @property
    def accepted_lines(self) -> int:
        return self.steps_accepted + self.blank_lines + sum(self.other_events.values())

    @property
    def quarantined_fraction(self) -> float:
        return self.quarantined / self.lines_read if self.lines_read else 0.0

    def to_dict(self) -> dict:
        return {
            "files": len(self.files), "empty_files": self.empty_files,
            "bytes_read": self.bytes_read, "lines_read": self.lines_read,
            "accepted_lines": self.accepted_lines, "trajectory_steps": self.steps_accepted,
            "other_events": dict(self.other_events), "blank_lines": self.blank_lines,
            "quarantined_lines": self.quarantined, "quarantined_fraction": self.quarantined_fraction,
            "quarantine_reasons": dict(self.quarantine_reasons.most_common()),
            "rows_by_source": dict(self.rows_by_source), "seconds": round(self.seconds, 3),
        }


@dataclass(frozen=True)
class IngestResult:
    trajectories: Path
    quarantine: Path
    stats: IngestStats


class LogFolderMissing(FileNotFoundError):
    pass


class NoTrajectorySteps(ValueError):
    pass


# ---------------------------------------------------------------- reading
def find_logs(config: IngestConfig) -> list[Path]:
    """Every log file under the configured folders, sorted; a missing folder is an error."""
    files: set[Path] = set()
    for d in config.log_dirs:
        d = Path(d)
        if not d.is_dir():
            raise LogFolderMissing(
                f"log folder {d} does not exist (it is listed in the '{config.setting}' setting). "
                f"Create it, point '{config.setting}' at the folder that holds your SAGE session logs, "
                f"or materialize synthetic_sessions first.")
        for pattern in LOG_PATTERNS:
            files.update(p for p in d.rglob(pattern) if p.is_file())
    return sorted(files)


def _utf8_errors(parts: list[bytes], data: bytes, cut: int) -> list[int]:
    """Indices of ``parts`` that are not valid UTF-8 (one fast check for the common case)."""
    try:
        str(memoryview(data)[:cut], "utf-8")
        return []
    except UnicodeDecodeError:
        bad = []
        for i, p in enumerate(parts):
            try:
                p.decode("utf-8")
            except UnicodeDecodeError:
                bad.append(i)
        return bad


# ---------------------------------------------------------------- validation
def _decode_batch(decode: Callable[[bytes], Event], lines: list[bytes]) -> tuple[list[Event], list[int]]:
    """Decode every line in C (``map``), resuming after each line the decoder refuses.

    Returns the decoded events (in line order, without the refused lines) and the
    indices of the refused lines, which the slow path explains.
    """
    out: list[Event] = []
    slow: list[int] = []
    it = iter(lines)
    while True:
        try:
            out.extend(map(decode, it))
            return out, slow
        except msgspec.DecodeError:
            slow.append(len(out) + len(slow))  # ``it`` has moved past the refused line


def _head(line: bytes) -> str:
    return line[:RAW_HEAD * 4].decode("utf-8", errors="replace")[:RAW_HEAD]


def _slow_path(line: bytes) -> tuple[str, object]:
    """Classify a line the fast decoder refused: ('blank'|'other'|'step'|'bad', payload)."""
    if not line.strip():
        return "blank", None
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return "bad", f"not valid UTF-8: byte 0x{line[exc.start]:02x} at offset {exc.start}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return "bad", f"invalid JSON (truncated or malformed): {exc.msg} (column {exc.colno})"
    if not isinstance(obj, dict):
        return "bad", f"not a JSON object (got {type(obj).__name__})"
    typ = obj.get("type")
    if not isinstance(typ, str):
        return "bad", "missing or non-string field 'type'"
    if typ != TRAJECTORY_STEP:
        return "other", typ
    try:
        return "step", msgspec.convert(obj, Event)
    except msgspec.ValidationError as exc:
        return "bad", f"wrong type: {exc}"


class _Validator:
    """Column-wise checks on a batch of decoded TRAJECTORY_STEP events."""

    def __init__(self, catalogue: ModelCatalogue) -> None:
        self.models = set(catalogue.actions)
        self.allowed = {f"{r}\x1f{m}" for r in ROLES for m in catalogue.candidates(r)}
        self.catalogue_source = catalogue.source

    def check(self, cols: dict[str, pa.Array], ts_col: list) -> tuple[np.ndarray, list[str | None]]:
        n = len(ts_col)
        bad = np.zeros(n, dtype=bool)
        reasons: list[str | None] = [None] * n

        def flag(mask: np.ndarray, why: Callable[[int], str]) -> None:
            new = mask & ~bad
            for i in np.flatnonzero(new):
                reasons[i] = why(int(i))
            bad[:] |= new

        def num(col: str) -> np.ndarray:
            return cols[col].to_numpy(zero_copy_only=False).astype(np.float64, copy=False)

        for col, (path, _, required) in _FIELDS.items():
            if required and cols[col].null_count:
                flag(np.asarray(cols[col].is_null()), lambda i, p=path: f"missing field {p}")
        for col, path in (("session_id", "session_id"), ("task_id", "task_id")):
            vals = cols[col]
            flag(np.asarray(vals.fill_null("x").to_numpy(zero_copy_only=False) == ""),
                 lambda i, p=path: f"empty field {p}")
        role = cols["role"].to_numpy(zero_copy_only=False)
        model = cols["model"].to_numpy(zero_copy_only=False)
        flag(~np.isin(role, ROLES), lambda i: f"unknown role {role[i]!r} in field agent (roles: {', '.join(ROLES)})")
        flag(~np.isin(model, list(self.models)),
             lambda i: f"unknown model {model[i]!r} in field action.model_chosen (not in {self.catalogue_source})")
        pair = np.char.add(np.char.add(role.astype(str), "\x1f"), model.astype(str))
        flag(~np.isin(pair, list(self.allowed)),
             lambda i: f"model {model[i]!r} is not a candidate for role {role[i]!r} "
                       f"(no capability for it in {self.catalogue_source})")

        def rng_check(col: str, path: str, lo: float, hi: float, *, lo_open: bool = False,
                      optional: bool = False) -> None:
            x = num(col)
            missing = np.isnan(x) & np.asarray(cols[col].is_null())
            finite = np.isfinite(x)
            ok = finite & ((x > lo) if lo_open else (x >= lo)) & (x <= hi)
            if optional:
                ok |= missing
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            flag(~ok, lambda i: (f"field {path} = {float(x[i])} is not finite" if not finite[i]
                                 else f"field {path} = {float(x[i]):g} outside {interval}"))

        rng_check("task_complexity_score", "state.task_complexity_score", 0.0, 1.0)
        rng_check("logged_reward", "reward", REWARD_MIN, REWARD_MAX)
        rng_check("propensity", "propensity", 0.0, 1.0, lo_open=True, optional=True)
        rng_check("step", "step", 0, np.inf)
        rng_check("primary_failure_count", "state.primary_failure_count", 0, np.inf)
        rng_check("failure_count", "state.failure_count", 0, np.inf, optional=True)
        rng_check("prompt_tokens", "state.prompt_tokens", 0, np.inf, optional=True)
        rng_check("reviewer_score", "state.reviewer_score", 0.0, 1.0, optional=True)
        rng_check("latency_s", "state.latency_s", 0.0, np.inf, optional=True)
        rng_check("cost_usd", "state.cost_usd", 0.0, np.inf, optional=True)
        return bad, reasons


# ---------------------------------------------------------------- ingest
@dataclass
class _Block:
    """Complete lines of one file, as read by the parent: ``first`` is the 1-based number
    of the first line; over-long lines are already replaced by empty lines."""

    fname: str
    first: int
    data: bytes
    too_long: list[tuple[int, int]]


@dataclass
class _BlockResult:
    fname: str
    lines: int
    table: pa.Table | None  # valid rows, not yet checked for duplicates
    keys: np.ndarray  # uint64 key hash per table row
    quarantined: list[tuple[int, str, str]]  # (line, reason, head)
    other_events: Counter
    blank_lines: int


def iter_blocks(path: Path, max_line_bytes: int, chunk_bytes: int) -> Iterator[_Block]:
    """Read ``path`` in chunks of complete lines, in bounded memory.

    A line longer than ``max_line_bytes`` that spans chunks is never held whole: it is
    counted while skipped and handed on as an empty line plus a ``too_long`` record.
    """
    opener = gzip.open if path.suffix == ".gz" else open
    fname = str(path)
    line_no = 1
    with opener(path, "rb") as fh:
        buf = b""
        skipping = 0  # bytes of an over-long line skipped so far
        while chunk := fh.read(chunk_bytes):
            if skipping:
                nl = chunk.find(b"\n")
                if nl < 0:
                    skipping += len(chunk)
                    continue
                yield _Block(fname, line_no, b"\n", [(line_no, skipping + nl)])
                line_no += 1
                skipping = 0
                chunk = chunk[nl + 1:]
            buf = buf + chunk if buf else chunk
            cut = buf.rfind(b"\n")
            if cut < 0:
                if len(buf) > max_line_bytes:
                    skipping, buf = len(buf), b""
                continue
            block, buf = buf[:cut + 1], buf[cut + 1:]
            yield _Block(fname, line_no, block, [])
            line_no += block.count(b"\n")
            if len(buf) > max_line_bytes:
                skipping, buf = len(buf), b""
        if skipping:
            yield _Block(fname, line_no, b"\n", [(line_no, skipping)])
        elif buf:
            yield _Block(fname, line_no, buf + b"\n", [])


def process_block(block: _Block, validator: "_Validator", max_line_bytes: int) -> _BlockResult:
    """Decode, validate and columnarise one block of lines (everything but duplicates)."""
    lines = block.data.split(b"\n")
    lines.pop()  # the block ends with a newline
    first, fname = block.first, block.fname
    quarantined: list[tuple[int, str, str]] = []
    special: dict[int, str] = {}  # line index -> reason known before decoding
    for ln, nbytes in block.too_long:
        special[ln - first] = (f"line is {nbytes} bytes, over max_line_bytes={max_line_bytes} "
                               "(raise the max_line_bytes setting if it is real)")
    if max(map(len, lines), default=0) > max_line_bytes:
        for i, line in enumerate(lines):
            if len(line) > max_line_bytes:
                special[i] = (f"line is {len(line)} bytes, over max_line_bytes={max_line_bytes} "
                              "(raise the max_line_bytes setting if it is real)")
    bad_utf8 = {i: lines[i] for i in _utf8_errors(lines, block.data, len(block.data))}
    for i in list(special) + list(bad_utf8):
        lines[i] = b""  # refused by the fast decoder; explained on the slow path
    decoded, slow = _decode_batch(_DECODE, lines)
    types = np.array(list(map(_TYPE, decoded)), dtype=object)
    is_step = types == TRAJECTORY_STEP
    ok_pos = np.delete(np.arange(len(lines)), slow) if slow else np.arange(len(lines))
    step_idx = np.flatnonzero(is_step)
    events = [decoded[i] for i in step_idx]
    pos = ok_pos[step_idx].tolist()
    other = Counter(types[~is_step].tolist()) if len(step_idx) < len(types) else Counter()
    blank = 0
    for i in slow:
        if i in special:
            quarantined.append((first + i, special[i], ""))
            continue
        raw = bad_utf8.get(i, lines[i])
        kind, payload = _slow_path(raw)
        if kind == "blank":
            blank += 1
        elif kind == "other":
            other[payload] += 1
        elif kind == "step":
            events.append(payload)
            pos.append(i)
        else:
            quarantined.append((first + i, payload, _head(raw)))
    table, keys = None, np.empty(0, dtype=np.uint64)
    if events:
        pos_arr = np.asarray(pos, dtype=np.int64)
        order = np.argsort(pos_arr, kind="stable")  # slow-path events were appended last
        if (order != np.arange(len(order))).any():
            events = [events[i] for i in order]
            pos_arr = pos_arr[order]
        cols = _columns(events)
        bad, reasons = validator.check(cols, events)
        for i in np.flatnonzero(bad):
            quarantined.append((first + int(pos_arr[i]), reasons[i], _head(lines[pos_arr[i]])))
        keep = ~bad
        if keep.any():
            mask = pa.array(keep)
            synthetic = cols["_synthetic"].fill_null(False).to_numpy(zero_copy_only=False)[keep]
            arrays = [cols[c].filter(mask) for c in _FIELDS]
            n = int(keep.sum())
            arrays += [pa.array(np.where(synthetic, "synthetic", "real"), type=pa.string()),
                       pa.array(np.full(n, fname, dtype=object), type=pa.string()),
                       pa.array(first + pos_arr[keep])]
            table = pa.Table.from_arrays(arrays, schema=TRAJECTORY_SCHEMA)
            keys = _key_hashes(table["session_id"], table["task_id"], table["step"])
    return _BlockResult(fname, len(lines), table, keys, quarantined, other, blank)


def ingest(config: IngestConfig, catalogue: ModelCatalogue, out_dir: str | Path,
           progress: Callable[[str], None] = log.info, progress_every_s: float = 5.0) -> IngestResult:
    """Ingest every log under ``config.log_dirs``; write trajectories and quarantine."""
    out_dir = Path(out_dir)
    files = find_logs(config)
    stats = IngestStats(files=[str(f) for f in files])
    seen = _SeenKeys()
    t_start = last_report = time.perf_counter()
    traj_path, quar_path = out_dir / "trajectories.parquet", out_dir / "quarantine.jsonl"
    q_enc = msgspec.json.Encoder()

    def blocks() -> Iterator[_Block]:
        for path in files:
            size = os.path.getsize(path)
            stats.bytes_read += size
            if size == 0:
                stats.empty_files.append(str(path))
                continue
            yield from iter_blocks(path, config.max_line_bytes, config.read_chunk_bytes)

    validator = _Validator(catalogue)
    results = (process_block(b, validator, config.max_line_bytes) for b in blocks())

    with artifacts.atomic_path(traj_path) as traj_tmp, artifacts.atomic_open(quar_path, "wb") as quar:
        writer = pq.ParquetWriter(traj_tmp, TRAJECTORY_SCHEMA, compression="snappy")
        pending: list[pa.Table] = []
        pending_rows = 0
        try:
            for res in results:
                stats.lines_read += res.lines
                stats.blank_lines += res.blank_lines
                stats.other_events.update(res.other_events)
                quarantined = res.quarantined
                table = res.table
                if table is not None:
                    dup = _duplicates(res.keys, seen)
                    if dup.any():
                        for row in table.filter(pa.array(dup)).to_pylist():
                            quarantined.append((row["source_line"], (
                                f"duplicate TRAJECTORY_STEP: session_id={row['session_id']!r} task_id="
                                f"{row['task_id']!r} step={row['step']} was already ingested"),
                                json.dumps({k: row[k] for k in ("session_id", "task_id", "step", "role", "model")})))
                        table = table.filter(pa.array(~dup))
                    seen.add(res.keys[~dup])
                    pending.append(table)
                    pending_rows += table.num_rows
                    if pending_rows >= ROW_GROUP_ROWS:
                        writer.write_table(pa.concat_tables(pending))
                        pending, pending_rows = [], 0
                    stats.steps_accepted += table.num_rows
                    n_syn = int(pc.sum(pc.equal(table["data_source"], "synthetic")).as_py() or 0)
                    stats.rows_by_source.update({"synthetic": n_syn, "real": table.num_rows - n_syn})
                for line_no, reason, head in sorted(quarantined):
                    stats.quarantined += 1
                    stats.quarantine_reasons[_reason_class(reason)] += 1
                    quar.write(q_enc.encode({"file": res.fname, "line": line_no, "reason": reason,
                                             "raw_head": head}))
                    quar.write(b"\n")
                now = time.perf_counter()
                if now - last_report >= progress_every_s:
                    el = now - t_start
                    progress(f"ingest: {stats.lines_read:,} lines ({stats.lines_read / el:,.0f}/s, "
                             f"{stats.bytes_read / el / 1e6:,.1f} MB/s), {stats.steps_accepted:,} steps, "
                             f"{stats.quarantined:,} quarantined; at {Path(res.fname).name}")
                    last_report = now
            if pending:
                writer.write_table(pa.concat_tables(pending))
        finally:
            writer.close()
    stats.seconds = time.perf_counter() - t_start
    progress(f"ingest done: {stats.lines_read:,} lines from {len(files)} files in {stats.seconds:.1f}s "
             f"({stats.lines_read / max(stats.seconds, 1e-9):,.0f} lines/s); {stats.steps_accepted:,} steps accepted, "
             f"{stats.quarantined:,} quarantined")
    return IngestResult(traj_path, quar_path, stats)


def _duplicates(keys: np.ndarray, seen: "_SeenKeys") -> np.ndarray:
    """Rows whose key was accepted before, or appears earlier in this block."""
    _, first_idx = np.unique(keys, return_index=True)
    dup = np.ones(len(keys), dtype=bool)
    dup[first_idx] = False
    return dup | seen.contains(keys)


class _SeenKeys:
    """Hashes of every (session_id, task_id, step) accepted so far: 8 bytes per row.

    Two sorted arrays: a large one merged rarely and a small recent one merged on every
    add, so a lookup is two binary searches.
    """

    def __init__(self) -> None:
        self.main = np.empty(0, dtype=np.uint64)
        self.recent = np.empty(0, dtype=np.uint64)

    @staticmethod
    def _in(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
        if not len(sorted_keys):
            return np.zeros(len(keys), dtype=bool)
        at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
        return sorted_keys[at] == keys

    def contains(self, keys: np.ndarray) -> np.ndarray:
        return self._in(self.main, keys) | self._in(self.recent, keys)

    def add(self, keys: np.ndarray) -> None:
        self.recent = np.sort(np.concatenate([self.recent, keys]))
        if len(self.recent) > max(1 << 16, len(self.main) // 8):
            self.main = np.sort(np.concatenate([self.main, self.recent]))
            self.recent = np.empty(0, dtype=np.uint64)


def _key_hashes(session_id: pa.Array, task_id: pa.Array, step: pa.Array) -> np.ndarray:
    """64-bit hashes of (session_id, task_id, step), vectorised."""
    joined = pc.binary_join_element_wise(session_id.fill_null(""), task_id.fill_null(""),
                                         pc.cast(step.fill_null(-1), pa.string()), "\x1f")
    return pd.util.hash_array(joined.to_numpy(zero_copy_only=False), categorize=False)


def _columns(events: list[Event]) -> dict[str, pa.Array]:
    """Column-wise extraction of the dataset fields (C-level maps, no Python loop body)."""
    parts = {"": events, "action.": list(map(_ACTION, events)), "state.": list(map(_STATE, events)),
             "extra.": list(map(_EXTRA, events))}
    cols = {}
    for col, (path, typ, _) in _FIELDS.items():
        prefix, _, name = path.rpartition(".")
        src = parts[prefix + "." if prefix else ""]
        cols[col] = pa.array(list(map(attrgetter(name), src)), type=typ)
    cols["_synthetic"] = pa.array(list(map(_SYN, parts["extra."])), type=pa.bool_())
    return cols


def _reason_class(reason: str) -> str:
    """A short class for counting reasons in metadata."""
    for prefix, cls in (("not valid UTF-8", "non_utf8"), ("invalid JSON", "invalid_json"),
                        ("not a JSON object", "not_an_object"), ("missing or non-string field 'type'", "no_type"),
                        ("wrong type", "wrong_type"), ("missing field", "missing_field"),
                        ("empty field", "missing_field"), ("unknown role", "unknown_role"),
                        ("unknown model", "unknown_model"), ("model ", "model_not_candidate"),
                        ("duplicate", "duplicate"), ("line is", "line_too_long")):
        if reason.startswith(prefix):
            return cls
    if "not finite" in reason:
        return "non_finite"
    if "outside" in reason:
        return "out_of_range"
    return "other"
