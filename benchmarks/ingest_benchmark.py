"""Ingest benchmark: the project's streaming ingest side by side with a plain ``json.loads`` loop.

Run from the repository root::

    .venv/bin/python benchmarks/ingest_benchmark.py [--events 1000000] [--repeats 3]

Contenders, all over the same generated journals in SAGE's exact shape (``generate_journals``
below): date-named ``YYYY-MM-DD.log`` files, one JSON object per line, no ``step`` and no
``propensity`` anywhere, ``session_id``/``trace_id`` on every line of half the files and
on none of the other half (there the file's stem is the session), per attempt a
``MODEL_ROUTING_DECISION``, a ``TOKEN_USAGE`` and a ``TRAJECTORY_STEP`` (Ollama model tags,
``shell_router``/``shell_chat`` among the roles, free-form ``state`` with extra keys), plus
``SESSION_START``, ``PROMPT_QUALITY_DELTA``, ``CONTEXT_CLAMPED`` and ``ROUTING_POLICY_ERROR``
lines, timestamps with microseconds and ``+00:00``/``+02:00`` offsets:

* ``json_loads``      the baseline: ``with open(path) as f: for line in f: json.loads(line)``
                      over every line of every log file; parses only.
* ``ingest``          ``sage_pipeline.routing.ingest.ingest``: decode, validation,
                      columnarisation, dedupe, Parquet writing and quarantine.
* ``decode_only``     breakdown: read + split + msgspec-decode every line with
                      ``ingest.Event`` (the first stage of ``ingest``), nothing else.
* ``process_blocks``  breakdown: ``iter_blocks`` + ``process_block`` as ``ingest`` calls them
                      (decode + validation + timestamp parsing + columnarisation of the
                      steps and both side tables + key hashing), without the dedupe,
                      Parquet writing and quarantine that follow.

Every timed run is a fresh subprocess of this script (``--child NAME``), so each
contender's peak RSS (``resource.getrusage(RUSAGE_SELF).ru_maxrss``, KiB on Linux) is its
own; the contenders are interleaved (rotated each repeat) and repeated, and the best and
median are reported. The run is done at two log sizes (``--small-events``, default 100k,
and ``--events``) to show whether ingest memory grows with the size of the logs;
``--memory-events N ...`` adds sizes at which only ``ingest`` is run, for its peak RSS.

Generated journals are cached under ``benchmarks/.scratch/logs/`` keyed by events, seed and
sessions per file, and reused; results go to ``benchmarks/.scratch/ingest_results.json``.

The parent process imports only the standard library and never holds the data, so a
child's ``ru_maxrss`` (which Linux carries over ``execve`` from the forking process)
reflects the child alone; ``VmHWM`` from ``/proc/self/status`` is reported as a cross-check.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRATCH = ROOT / "benchmarks" / ".scratch"
RESULTS = SCRATCH / "ingest_results.json"
MANIFEST = "manifest.json"  # written last by the generator; not a journal (*.log)
RATE_GOAL = 300_000  # lines/s the ingest must sustain on SAGE-shaped journals
BASELINE = "json_loads"
CONTENDERS = ("json_loads", "ingest", "decode_only", "process_blocks")
DESCRIPTION = {
    "json_loads": "baseline: plain json.loads loop (parse only)",
    "ingest": "ingest(): decode+validate+columnarise+dedupe+3 Parquet files+quarantine",
    "decode_only": "breakdown: read+split+msgspec decode (Event)",
    "process_blocks": "breakdown: iter_blocks+process_block (decode+validate+columnarise, 3 tables)",
}


# ---------------------------------------------------------------- children (one contender each)
def _log_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.log"))


def _rss() -> dict[str, int]:
    hwm = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        pass
    return {"ru_maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "vmhwm_kib": hwm}


def child_json_loads(logs: Path, out: Path) -> dict:
    t0 = time.perf_counter()
    n = 0
    for path in _log_files(logs):
        with open(path, encoding="utf-8") as f:
            for line in f:
                json.loads(line)
                n += 1
    return {"seconds": time.perf_counter() - t0, "lines": n}


def child_decode_only(logs: Path, out: Path) -> dict:
    import msgspec

    from sage_pipeline.routing.ingest import Event

    decode = msgspec.json.Decoder(Event).decode
    start = _rss()
    t0 = time.perf_counter()
    n = 0
    for path in _log_files(logs):
        with open(path, "rb") as f:
            data = f.read()
        lines = data.split(b"\n")
        if lines and not lines[-1]:
            lines.pop()
        events = list(map(decode, lines))
        n += len(events)
        del events, lines, data
    return {"seconds": time.perf_counter() - t0, "lines": n, "rss_start": start}


def child_process_blocks(logs: Path, out: Path) -> dict:
    from sage_pipeline.routing.ingest import IngestConfig, find_logs, iter_blocks, process_block

    config = IngestConfig((logs,))
    start = _rss()
    t0 = time.perf_counter()
    n = rows = side_rows = quarantined = 0
    for path in find_logs(config):
        for block in iter_blocks(path, config.max_line_bytes, config.read_chunk_bytes):
            res = process_block(block, config.max_line_bytes)
            n += res.lines
            rows += res.table.num_rows if res.table is not None else 0
            side_rows += sum(t.num_rows for t in (res.routing_decisions, res.token_usage) if t is not None)
            quarantined += len(res.quarantined)
    return {"seconds": time.perf_counter() - t0, "lines": n, "rss_start": start,
            "rows_before_dedupe": rows, "side_rows": side_rows, "quarantined_before_dedupe": quarantined}


def child_ingest(logs: Path, out: Path) -> dict:
    import msgspec
    import pyarrow

    from sage_pipeline.routing.ingest import IngestConfig, ingest

    out.mkdir(parents=True, exist_ok=True)
    start = _rss()
    t0 = time.perf_counter()
    res = ingest(IngestConfig((logs,)), out, progress=lambda msg: None)
    seconds = time.perf_counter() - t0
    s = res.stats
    return {"seconds": seconds, "lines": s.lines_read, "rss_start": start,
            "accepted_lines": s.accepted_lines, "quarantined_lines": s.quarantined,
            "trajectory_steps": s.steps_accepted, "other_events": dict(s.other_events),
            "routing_decisions": s.routing_decisions, "token_usage": s.token_usage,
            "unusable_side_events": dict(s.unusable_side_events), "steps_without_step": s.steps_without_step,
            "sessions_from_file_stem": s.sessions_from_file_stem,
            "parquet_bytes": sum(p.stat().st_size for p in (res.trajectories, res.routing_decisions,
                                                            res.token_usage)),
            "arrow_pool_max_bytes": pyarrow.default_memory_pool().max_memory(),
            "versions": {"msgspec": msgspec.__version__, "pyarrow": pyarrow.__version__}}


CHILDREN = {"json_loads": child_json_loads, "ingest": child_ingest,
            "decode_only": child_decode_only, "process_blocks": child_process_blocks}


# SAGE-like routing table: role -> (primary, fallback); Ollama tags and one hosted model
SAGE_TABLE = {
    "planner": ("qwen3:14b-q4_K_M", "claude-sonnet-4-5"),
    "architect": ("qwen3:14b-q4_K_M", "claude-sonnet-4-5"),
    "coder": ("qwen2.5-coder:1.5b", "codestral:22b"),
    "debugger": ("qwen2.5-coder:7b", "codestral:22b"),
    "reviewer": ("qwen3:14b-q4_K_M", "claude-sonnet-4-5"),
    "test_engineer": ("qwen2.5-coder:1.5b", "codestral:22b"),
    "documentation": ("llama3.2:3b", "qwen3:14b-q4_K_M"),
    "memory_optimizer": ("llama3.2:3b", "qwen3:14b-q4_K_M"),
    "shell_router": ("qwen2.5-coder:1.5b", "qwen3:14b-q4_K_M"),
    "shell_chat": ("qwen3:14b-q4_K_M", "claude-sonnet-4-5"),
}


def generate_journals(folder: Path, events: int, seed: int, sessions_per_file: int) -> dict:
    """Write about ``events`` lines of SAGE journals to ``folder`` (``YYYY-MM-DD.log``, one per day).

    Even days carry ``session_id``/``trace_id`` on every line (SAGE_SESSION_ID/SAGE_TRACE_ID
    set), odd days none (the file's stem is the session). Per task 1-3 attempts, each logged
    as MODEL_ROUTING_DECISION, TOKEN_USAGE, TRAJECTORY_STEP (SAGE's order); no step, no
    propensity. Deterministic in ``seed``.
    """
    import random
    from datetime import datetime, timedelta, timezone

    import msgspec

    rng = random.Random(seed)
    enc = msgspec.json.Encoder()
    roles = list(SAGE_TABLE)
    tz2 = timezone(timedelta(hours=2))
    folder.mkdir(parents=True, exist_ok=True)
    day0 = datetime(2026, 1, 1, 8, 0, tzinfo=timezone.utc)
    n = files = steps = 0
    counts: dict[str, int] = {}
    names: list[str] = []
    cur: dict = {}  # the day being written: its clock, offset and lines

    def emit(ev: dict, sid: str | None, trace: str | None) -> None:
        """One line as SAGE writes it: type, timestamp, the ids when set, then the payload."""
        cur["clock"] += timedelta(microseconds=rng.randrange(1, 4_000_000))
        stamp = cur["clock"].astimezone(cur["tz"]).isoformat(timespec="microseconds")
        head = {"type": ev.pop("type"), "timestamp": stamp}
        if sid is not None:
            head["session_id"], head["trace_id"] = sid, trace
        head.update(ev)
        cur["lines"].append(enc.encode(head))
        counts[head["type"]] = counts.get(head["type"], 0) + 1

    d = 0
    while n < events:
        day = day0 + timedelta(days=d)
        name = f"{day:%Y-%m-%d}.log"
        logged = d % 2 == 0  # SAGE_SESSION_ID set on even days
        lines: list[bytes] = []
        # some days written with a +02:00 offset
        cur.update(clock=day, tz=tz2 if d % 4 == 1 else timezone.utc, lines=lines)

        for s_i in range(sessions_per_file):
            if n + len(lines) >= events:
                break
            sid = f"sess-{day:%Y%m%d}-{s_i:04d}" if logged else None
            trace = f"trace-{seed}-{d}-{s_i}" if logged else None
            emit({"type": "SESSION_START", "cwd": "/home/dev/project", "pid": 4242 + s_i}, sid, trace)
            for t_i in range(1 + int(rng.expovariate(1 / 3.0))):
                role = rng.choice(roles)
                primary, fallback = SAGE_TABLE[role]
                tid = f"task-{d:04d}-{s_i:04d}-{t_i:02d}"
                complexity = round(rng.random(), 4)
                pfc = 0
                attempts = rng.choice((1, 1, 1, 2, 2, 3))
                for a in range(attempts):
                    triggers = (["task_complexity_score > 0.8"] if complexity > 0.8 else []) + (
                        ["primary_failure_count >= 2"] if pfc >= 2 else [])
                    model = fallback if triggers else primary
                    emit({"type": "MODEL_ROUTING_DECISION", "agent_role": role,
                          "task_complexity_score": complexity, "primary_failure_count": pfc,
                          "primary_model": primary, "fallback_model": fallback, "selected_model": model,
                          "matched_fallback_triggers": triggers, "policy_source": "yaml"}, sid, trace)
                    p_tok, c_tok = rng.randrange(200, 12000), rng.randrange(20, 2000)
                    usage = {"type": "TOKEN_USAGE", "model": model, "prompt_tokens": p_tok,
                             "completion_tokens": c_tok, "agent": role}
                    if model == "claude-sonnet-4-5":
                        usage["cost_usd"] = round(p_tok * 3e-6 + c_tok * 15e-6, 6)
                    emit(usage, sid, trace)
                    if rng.random() < 0.05:
                        emit({"type": "CONTEXT_CLAMPED", "agent": role, "original_tokens": p_tok + 9000,
                              "clamped_tokens": p_tok}, sid, trace)
                    last = a == attempts - 1
                    passed = last and rng.random() < 0.8
                    failed = None if passed else ("verification_failed" if rng.random() < 0.7 else "timeout")
                    step = {"type": "TRAJECTORY_STEP", "task_id": tid, "agent": role,
                            "action": {"model_chosen": model, "prompt_strategy_key": rng.choice(
                                ("default", "chain_of_thought", "few_shot"))},
                            "reward": round(rng.uniform(-1.0, 1.5), 4), "terminal": last,
                            "state": {"task_complexity_score": complexity, "primary_failure_count": pfc,
                                      "verification_passed": passed, "failed_reason": failed,
                                      "attempt": a, "files_touched": ["src/app.py"][:a + 1],
                                      "skills": {"python": 0.7}}}
                    if rng.random() < 0.5:
                        step["extra"] = {"synthetic": True}
                    emit(step, sid, trace)
                    steps += 1
                    if not passed:
                        pfc += 1
                if rng.random() < 0.3:
                    emit({"type": "PROMPT_QUALITY_DELTA", "agent": role, "prompt_strategy_key": "default",
                          "delta": round(rng.uniform(-0.2, 0.2), 4)}, sid, trace)
            if rng.random() < 0.02:
                emit({"type": "ROUTING_POLICY_ERROR", "error": "checkpoint not found",
                      "fallback": "yaml"}, sid, trace)
        (folder / name).write_bytes(b"\n".join(lines) + b"\n")
        names.append(name)
        n += len(lines)
        files += 1
        d += 1
    manifest = {"events": n, "files": names, "trajectory_steps": steps, "types": counts, "seed": seed,
                "sessions_per_file": sessions_per_file}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))
    return manifest


def child_generate(logs: Path, events: int, seed: int, sessions_per_file: int) -> dict:
    t0 = time.perf_counter()
    m = generate_journals(logs, events, seed, sessions_per_file)
    return {"seconds": time.perf_counter() - t0, "events": m["events"], "files": len(m["files"])}


def run_child(argv: list[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--child", required=True)
    p.add_argument("--logs", type=Path, required=True)
    p.add_argument("--out", type=Path)
    p.add_argument("--events", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--sessions-per-file", type=int)
    a = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if a.child == "generate":
        result = child_generate(a.logs, a.events, a.seed, a.sessions_per_file)
    else:
        start = _rss()
        result = CHILDREN[a.child](a.logs, a.out)
        result.setdefault("rss_start", start)  # after this contender's imports, before its work
        result["rss_end"] = _rss()
    print("RESULT " + json.dumps(result), flush=True)


# ---------------------------------------------------------------- parent
def _spawn(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], cwd=ROOT,
                          stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {' '.join(args)} failed with exit status {proc.returncode}")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"child {' '.join(args)} printed no RESULT line:\n{proc.stdout}")


def ensure_logs(events: int, seed: int, sessions_per_file: int) -> tuple[Path, dict]:
    """Generated journals of about ``events`` lines, cached by events, seed and sessions per file."""
    folder = SCRATCH / "logs" / f"sage_events{events}_seed{seed}_spf{sessions_per_file}"
    manifest = folder / MANIFEST  # the generator writes it last
    complete = False
    if manifest.is_file():
        names = json.loads(manifest.read_text()).get("files", [])
        complete = bool(names) and all((folder / n).is_file() for n in names)
    if complete:
        print(f"using cached logs {folder.relative_to(ROOT)}")
    else:
        print(f"generating SAGE journals: {events:,} lines, seed {seed} -> {folder.relative_to(ROOT)}")
        info = _spawn(["--child", "generate", "--logs", str(folder), "--events", str(events),
                       "--seed", str(seed), "--sessions-per-file", str(sessions_per_file)])
        print(f"  generated {info['events']:,} events in {info['files']} files in {info['seconds']:.1f}s")
    # Flush the generated logs to disk now: otherwise the fsync in ingest's atomic writes waits
    # for their writeback and the first repeats measure the disk, not the ingest.
    os.sync()
    # Count lines and bytes, which also pulls every file into the page cache before timing.
    files = _log_files(folder)
    n_lines = n_bytes = 0
    for path in files:
        data = path.read_bytes()
        n_bytes += len(data)
        n_lines += data.count(b"\n") + (1 if data and not data.endswith(b"\n") else 0)
    types = json.loads(manifest.read_text())["types"]
    return folder, {"folder": str(folder.relative_to(ROOT)), "types": types, "seed": seed,
                    "sessions_per_file": sessions_per_file, "files": len(files), "lines": n_lines,
                    "bytes": n_bytes}


def _summary(runs: list[dict], data: dict) -> dict:
    secs = [r["seconds"] for r in runs]
    best, med = min(secs), statistics.median(secs)
    peak = [r["rss_end"]["ru_maxrss_kib"] for r in runs]
    start = [r["rss_start"]["ru_maxrss_kib"] for r in runs]
    hwm = [r["rss_end"]["vmhwm_kib"] for r in runs if r["rss_end"]["vmhwm_kib"] is not None]
    return {
        "seconds": secs, "best_s": best, "median_s": med,
        "best_events_per_s": data["lines"] / best, "median_events_per_s": data["lines"] / med,
        "best_mb_per_s": data["bytes"] / 1e6 / best, "median_mb_per_s": data["bytes"] / 1e6 / med,
        "peak_rss_kib": max(peak), "rss_after_imports_kib": max(start),
        "peak_vmhwm_kib": max(hwm) if hwm else None,
    }


def _fmt_load(load: tuple[float, float, float]) -> str:
    return "/".join(f"{x:.2f}" for x in load)


def measure(folder: Path, data: dict, repeats: int, tag: str) -> dict:
    runs: dict[str, list[dict]] = {c: [] for c in CONTENDERS}
    out = SCRATCH / "ingest_out" / tag
    load_before = os.getloadavg()
    for r in range(repeats):
        order = CONTENDERS[r % len(CONTENDERS):] + CONTENDERS[:r % len(CONTENDERS)]
        for name in order:
            res = _spawn(["--child", name, "--logs", str(folder), "--out", str(out / name)])
            if res["lines"] != data["lines"]:
                raise SystemExit(f"{name} saw {res['lines']} lines, the logs have {data['lines']}")
            runs[name].append(res)
            print(f"  [{tag} repeat {r + 1}/{repeats}] {name:<15} {res['seconds']:7.2f} s  "
                  f"{data['lines'] / res['seconds']:>11,.0f} events/s  "
                  f"peak RSS {res['rss_end']['ru_maxrss_kib'] / 1024:7.1f} MiB", flush=True)
    load_after = os.getloadavg()
    print(f"  load average (1/5/15 min) before {_fmt_load(load_before)}, after {_fmt_load(load_after)} "
          f"on {os.cpu_count()} CPUs (other processes on the machine skew timings)")
    summary = {c: _summary(runs[c], data) for c in CONTENDERS}
    last_ingest = runs["ingest"][-1]
    keep = ("accepted_lines", "quarantined_lines", "trajectory_steps", "other_events", "parquet_bytes",
            "routing_decisions", "token_usage", "unusable_side_events", "steps_without_step",
            "sessions_from_file_stem")
    summary["ingest"].update({k: last_ingest[k] for k in keep})
    summary["ingest"]["arrow_pool_max_bytes"] = max(r["arrow_pool_max_bytes"] for r in runs["ingest"])
    base = summary[BASELINE]
    ratios = {c: {"best": base["best_s"] / summary[c]["best_s"],
                  "median": base["median_s"] / summary[c]["median_s"]}
              for c in CONTENDERS if c != BASELINE}
    ing = summary["ingest"]["median_s"]
    shares = {"decode_only": summary["decode_only"]["median_s"] / ing,
              "process_blocks": summary["process_blocks"]["median_s"] / ing}
    return {"data": data, "runs": runs, "summary": summary, "throughput_ratio_vs_baseline": ratios,
            "share_of_ingest_median_time": shares,
            "loadavg_before": load_before, "loadavg_after": load_after,
            "versions": last_ingest.get("versions", {})}


def print_table(res: dict, title: str) -> None:
    d = res["data"]
    print(f"\n{title}: {d['lines']:,} events, {d['bytes'] / 1e6:,.1f} MB in {d['files']} files")
    hdr = (f"{'contender':<15} {'best s':>8} {'median s':>9} {'best ev/s':>11} {'median ev/s':>12} "
           f"{'best MB/s':>10} {'median MB/s':>12} {'peak RSS MiB':>13} {'x baseline (best/median)':>25}")
    print(hdr)
    print("-" * len(hdr))
    for c in CONTENDERS:
        s = res["summary"][c]
        ratio = res["throughput_ratio_vs_baseline"].get(c)
        rtxt = "1.00 / 1.00 (baseline)" if ratio is None else f"{ratio['best']:.2f} / {ratio['median']:.2f}"
        print(f"{c:<15} {s['best_s']:8.2f} {s['median_s']:9.2f} {s['best_events_per_s']:11,.0f} "
              f"{s['median_events_per_s']:12,.0f} {s['best_mb_per_s']:10.1f} {s['median_mb_per_s']:12.1f} "
              f"{s['peak_rss_kib'] / 1024:13.1f} {rtxt:>25}")
    ing = res["summary"]["ingest"]
    print(f"ingest lines: {ing['accepted_lines']:,} accepted, {ing['quarantined_lines']:,} quarantined; "
          f"rows written: {ing['trajectory_steps']:,} trajectories ({ing['steps_without_step']:,} without "
          f"step, {ing['sessions_from_file_stem']:,} sessions from file stems), {ing['routing_decisions']:,} "
          f"routing decisions, {ing['token_usage']:,} token usages; unusable side events "
          f"{ing['unusable_side_events'] or 0}; Parquet {ing['parquet_bytes'] / 1e6:.1f} MB (3 files)")
    print(f"event types: {json.dumps(d['types'])}")


def _machine() -> dict:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) * 1024
    except OSError:
        pass
    cpu = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), cpu)
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "memory_bytes": mem, "cpu": cpu, "python": platform.python_version(),
            "platform": platform.platform()}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=lambda s: int(float(s)), default=1_000_000,
                   help="about how many log events (lines) to ingest (default 1,000,000)")
    p.add_argument("--small-events", type=lambda s: int(float(s)), default=100_000,
                   help="the smaller log size for the memory-growth check (default 100,000)")
    p.add_argument("--memory-events", type=lambda s: int(float(s)), nargs="*", default=[],
                   help="extra log sizes at which only ingest is run, for its peak RSS (e.g. 3000000)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved repeats per contender (default 3)")
    p.add_argument("--seed", type=int, default=0, help="journal generator seed (default 0)")
    p.add_argument("--sessions-per-file", type=int, default=250,
                   help="sessions per day file (default 250)")
    a = p.parse_args(argv)
    if a.repeats < 1:
        p.error("--repeats must be >= 1")
    SCRATCH.mkdir(parents=True, exist_ok=True)

    t_all = time.perf_counter()
    sizes = [("large", a.events)]
    if a.small_events < a.events:
        sizes.insert(0, ("small", a.small_events))
    results: dict[str, dict] = {}
    for tag, n in sizes:
        folder, data = ensure_logs(n, a.seed, a.sessions_per_file)
        print(f"measuring {tag}: {data['lines']:,} events, "
              f"{a.repeats} interleaved repeats of {len(CONTENDERS)} contenders")
        results[tag] = measure(folder, data, a.repeats, tag)

    extra: list[dict] = []
    for n in a.memory_events:
        folder, data = ensure_logs(n, a.seed, a.sessions_per_file)
        print(f"memory check: ingest only, {data['lines']:,} events, {a.repeats} repeats")
        runs = []
        for r in range(a.repeats):
            out = SCRATCH / "ingest_out" / f"memory{n}"
            res = _spawn(["--child", "ingest", "--logs", str(folder), "--out", str(out)])
            if res["lines"] != data["lines"]:
                raise SystemExit(f"ingest saw {res['lines']} lines, the logs have {data['lines']}")
            print(f"  [memory {n:,} repeat {r + 1}/{a.repeats}] ingest {res['seconds']:7.2f} s  "
                  f"peak RSS {res['rss_end']['ru_maxrss_kib'] / 1024:7.1f} MiB", flush=True)
            runs.append(res)
        summ = _summary(runs, data)
        summ["loadavg_after"] = os.getloadavg()
        summ["arrow_pool_max_bytes"] = max(r["arrow_pool_max_bytes"] for r in runs)
        extra.append({"data": data, "runs": runs, "summary": summ})

    for tag, _ in sizes:
        print_table(results[tag], f"{tag} logs")
    large = results["large"]
    r = large["throughput_ratio_vs_baseline"]
    print("\nthroughput ratios, ours / baseline (events/s; best vs best, median vs median):")
    for c in CONTENDERS[1:]:
        print(f"  {c:<15} {r[c]['best']:.2f}x best, {r[c]['median']:.2f}x median   ({DESCRIPTION[c]})")
    sh = large["share_of_ingest_median_time"]
    print(f"breakdown (median times): decode alone = {sh['decode_only']:.0%} of ingest; "
          f"decode+validate+columnarise = {sh['process_blocks']:.0%}; "
          f"dedupe+Parquet+quarantine+bookkeeping = {1 - sh['process_blocks']:.0%}")
    rate = large["summary"]["ingest"]["median_events_per_s"]
    rate_goal = rate >= RATE_GOAL
    print(f"goal 'ingest >= {RATE_GOAL:,} lines/s (median, --events logs)': "
          f"{'MET' if rate_goal else 'NOT MET'} ({rate:,.0f} lines/s median, "
          f"{large['summary']['ingest']['best_events_per_s']:,.0f} best)")
    goal = r["ingest"]["median"] >= 3.0
    print(f"goal 'ingest >= 3x the plain json.loads loop': {'MET' if goal else 'NOT MET'} "
          f"({r['ingest']['median']:.2f}x median, {r['ingest']['best']:.2f}x best)")
    ls = large["summary"]
    print("peak memory, large logs (ru_maxrss / VmHWM, MiB): " + ", ".join(
        f"{c} {ls[c]['peak_rss_kib'] / 1024:.1f} / {ls[c]['peak_vmhwm_kib'] / 1024:.1f}"
        for c in CONTENDERS if ls[c]["peak_vmhwm_kib"] is not None))
    points = [(results[t]["data"]["lines"], results[t]["summary"]["ingest"]) for t, _ in sizes]
    points += [(e["data"]["lines"], e["summary"]) for e in extra]
    print("ingest peak RSS by log size:")
    for n_ev, s in sorted(points, key=lambda x: x[0]):
        print(f"  {n_ev:>11,} events: peak RSS {s['peak_rss_kib'] / 1024:7.1f} MiB "
              f"(after imports {s['rss_after_imports_kib'] / 1024:.1f} MiB, Arrow pool peak "
              f"{s['arrow_pool_max_bytes'] / 2**20:.1f} MiB), "
              f"median {s['median_events_per_s']:,.0f} events/s")
    mem = None
    if "small" in results:
        s_ing, l_ing = results["small"]["summary"]["ingest"], large["summary"]["ingest"]
        mem = {"small_events": results["small"]["data"]["lines"], "large_events": large["data"]["lines"],
               "small_peak_rss_kib": s_ing["peak_rss_kib"], "large_peak_rss_kib": l_ing["peak_rss_kib"],
               "small_rss_after_imports_kib": s_ing["rss_after_imports_kib"],
               "large_rss_after_imports_kib": l_ing["rss_after_imports_kib"],
               "peak_ratio_large_over_small": l_ing["peak_rss_kib"] / s_ing["peak_rss_kib"],
               "events_ratio_large_over_small": large["data"]["lines"] / results["small"]["data"]["lines"]}
        print(f"ingest peak RSS {mem['large_peak_rss_kib'] / 1024:.1f} MiB at {mem['large_events']:,} "
              f"events vs {mem['small_peak_rss_kib'] / 1024:.1f} MiB at {mem['small_events']:,}: "
              f"{mem['peak_ratio_large_over_small']:.2f}x the memory for "
              f"{mem['events_ratio_large_over_small']:.1f}x the events")

    doc = {"benchmark": "ingest", "date": time.strftime("%Y-%m-%d"),
           "command": "benchmarks/ingest_benchmark.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "args": vars(a), "machine": _machine(), "versions": large["versions"],
           "contenders": DESCRIPTION, "results": results, "ingest_memory_growth": mem,
           "ingest_memory_by_size": [{"events": n_ev, "peak_rss_kib": s["peak_rss_kib"],
                                      "rss_after_imports_kib": s["rss_after_imports_kib"],
                                      "arrow_pool_max_bytes": s["arrow_pool_max_bytes"],
                                      "median_events_per_s": s["median_events_per_s"]}
                                     for n_ev, s in sorted(points, key=lambda x: x[0])],
           "memory_only_runs": extra,
           "rate_goal": {"text": f"ingest at least {RATE_GOAL:,} lines/s (median)", "met": rate_goal,
                         "median_lines_per_s": rate},
           "goal": {"text": "ingest at least 3x the plain json.loads loop (events/s)", "met": goal,
                    "ratio_median": r["ingest"]["median"], "ratio_best": r["ingest"]["best"]},
           "wall_seconds": time.perf_counter() - t_all}
    RESULTS.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nresults written to {RESULTS.relative_to(ROOT)} (whole run {doc['wall_seconds']:.0f}s)")
    return doc


if __name__ == "__main__":
    if "--child" in sys.argv[1:]:
        run_child(sys.argv[1:])
    else:
        main()
