"""The sleep cycle's gate against a whole-prompt stand-in model: false-accept rate and power (issue 42).

The stand-in (``sage_pipeline/sleep/standin.py``, a test harness, never a claim about real
models) answers the OpenAI chat-completions API. A task's chance of a correct answer is its base
rate (0.3-0.7) moved by a fixed perturbation of the whole prompt (sd 0.1), plus Delta = +0.15 when
its planted instruction is in the prompt (``planted``; ``null``: no effect). Reflect proposes two
useless rules a night and the instruction with probability 0.7 (in both modes).

Each seed runs 5 nights of ``run_night`` (store, harvest, cycle, reports: what the nightly job
runs) per gate, at temperature 0 (answers a fixed function of the prompt) and above it (fresh
draws), under three gates from the same start, on the same nights' tasks:

- ``paired``: the default (``GateConfig()``): one-sided sign-flip test over val tasks, the
  night's family-wise level 0.05 split over its trials, ``samples`` replays per task and arm above
  temperature 0, at most chance's share of val tasks dropping significantly;
- ``strict``: the old default (strictly better mean, no val task worse), one replay per task;
- ``mean``: SkillOpt's mean-only gate (``--allow-regression``), one replay per task.

Each night's tasks are drawn afresh from a pool of the simulated coder world's generated tasks
(the packaged tasks' templates; ids fixed, so the local sandbox runs each (task, answer) once:
trusted, generated tasks): ``--train`` train tasks and a val slice of ``--val-t0`` tasks at
temperature 0 and ``--val-warm`` tasks above it (each replayed ``--samples`` times per arm by the
paired gate), no test tasks: the stand-in values documents exactly, so the test figure is the
true pass rate of the final documents on the pool's test tasks, with no sampling at all. The
sizes are what a night needs to resolve +0.15 at this level (the packaged 22 val tasks cannot:
such a night says "cannot tell" and how many it would need).

The calls go through the project's ``OpenAIBackend``; by default with only its HTTP hop replaced
by a direct call (``InProcessBackend``: same bodies, parsing and cache; the tests check a night
decides identically over HTTP), since the SDK's round trip (~5 ms of CPU) would make a full run
take over an hour on 2 busy cores; ``--http`` goes over loopback HTTP through the SDK.

Reported per temperature and gate: null nights that accepted anything (share, Clopper-Pearson
95% interval); planted seeds whose instruction was kept within the nights; useless rules
accepted alongside (per planted seed); nights that could not tell; the true pass-rate change;
backend requests and seconds per night. Goal lines: false-accept <= 5%; planted kept in >= 8 of
10 seeds; useless alongside <= 1 on average (for the default gate).

    .venv/bin/python benchmarks/sleep_gate.py [--null-seeds 20] [--planted-seeds 10] [--nights 5] [--http] [--quick]

Results: printed, and written to benchmarks/.scratch/sleep_gate.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from datetime import date, timedelta
from pathlib import Path

import numpy as np
from _cli import count  # benchmarks/ is the script's folder: first on sys.path

from sage_pipeline.sleep.backends import OpenAIBackend, OpenAIConfig
from sage_pipeline.sleep.block import parse_document
from sage_pipeline.sleep.cycle import CycleConfig
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.nightly import NightSettings, run_night
from sage_pipeline.sleep.records import SplitSpec, TaskRecord, write_task_file
from sage_pipeline.sleep.simulated_backend import SimWorld
from sage_pipeline.sleep.standin import IN_PROCESS_URL, InProcessBackend, StandinConfig, StandinModel, StandinServer
from sage_pipeline.sleep.store import default_document

ROOT = Path(__file__).resolve().parents[1]
SKILL = "coder"
POOL_SPLIT = SplitSpec(train=0.1, val=0.8)  # the rest (10%) is the pool's test tasks, valued exactly
GATES = {"paired": GateConfig(), "strict": GateConfig(test="strict"),
         "mean": GateConfig(test="strict", no_regression=False)}


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    from scipy.stats import beta

    a = 1.0 - level
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


def night_tasks(pool: dict[str, list[TaskRecord]], seed: int, night: int, n_train: int, n_val: int,
                mode: str) -> list[TaskRecord]:
    """The night's tasks, drawn afresh from the pool (the same for every gate of a seed)."""
    rng = np.random.default_rng([seed, night, 1 if mode == "planted" else 0, 4242])
    pick = [pool["train"][i] for i in rng.choice(len(pool["train"]), n_train, replace=False)]
    return pick + [pool["val"][i] for i in rng.choice(len(pool["val"]), n_val, replace=False)]


def _requests(calls: dict) -> int:
    """Backend requests a night made: sent to the server, or answered from the reply cache (at
    temperature 0 the gates of a seed share one backend, so a request one gate made first is a
    cache hit for the others)."""
    return calls["calls"] + calls["cache_hits"]


def true_rate(model: StandinModel, tasks: list[TaskRecord], docs: dict[str, str]) -> float:
    return float(np.mean([model.p_correct_docs(t, docs["skill"], docs["memory"]) for t in tasks]))


def run_seed(pool: dict, model: StandinModel, url: str | None, temperature: float, gates: list[str], args,
             n_val: int, unit_cache: dict, scratch: Path) -> dict:
    """Every gate's nights for one (temperature, mode, seed); one backend, so at temperature 0 the
    gates share its reply cache wherever their documents agree. ``url``: the stand-in's server
    (the SDK over HTTP), or None (``InProcessBackend``: the same backend without the socket)."""
    seed, mode = model.config.seed, model.config.effect
    config = OpenAIConfig(base_url=url or IN_PROCESS_URL, model="standin", temperature=temperature, max_retries=0,
                          timeout_s=30.0)
    backend = OpenAIBackend(config) if url else InProcessBackend(model, config)
    start = {k: parse_document(default_document(SKILL, k)).render() for k in ("skill", "memory")}
    out = {}
    for name in gates:
        root = Path(tempfile.mkdtemp(prefix=f"{mode}-{temperature:g}-{seed}-{name}-", dir=scratch))
        st = NightSettings(backend="openai", openai=backend.config, log_dirs=[], embedded_tasks=False,
                           sandbox="local", split=POOL_SPLIT, cycle=CycleConfig(gate=GATES[name]))
        nights, kept_at = [], None
        for i in range(args.nights):
            write_task_file(root / "sleep" / SKILL / "tasks" / "night.jsonl",
                            night_tasks(pool, seed, i, args.train, n_val, mode))
            before = backend.calls.summary()
            t0 = time.perf_counter()
            r, _ = run_night(root, SKILL, (date(2026, 12, 1) + timedelta(days=i)).isoformat(), None, st,
                             backend=backend, unit_cache=unit_cache)
            secs = time.perf_counter() - t0
            if r.status not in ("accepted", "rejected", "no_edits"):
                raise SystemExit(f"{mode} seed {seed} {name} night {i + 1}: {r.status}: {r.reason} {r.cause}")
            acc = [e["content"] for e in r.edits if e["status"] == "accepted"]
            planted = [c for c in acc if model.has_instruction(c)]
            if planted and kept_at is None:
                kept_at = i + 1
            nights.append({"status": r.status, "accepted": len(acc), "planted": len(planted),
                           "useless": len(acc) - len(planted), "cannot_tell": sum(
                               t["verdict"] == "cannot_tell" for t in r.trials),
                           "trials": len(r.trials), "val_tasks": r.tasks.get("val", 0),
                           "requests": _requests(backend.calls.summary()) - _requests(before),
                           "sent": backend.calls.summary()["calls"] - before["calls"], "seconds": secs})
        live = {k: (root / "sleep" / SKILL / ("SKILL.md" if k == "skill" else "MEMORY.md")).read_text("utf-8")
                for k in ("skill", "memory")}
        out[name] = {"nights": nights, "kept": model.has_instruction(live["skill"] + "\n" + live["memory"]),
                     "kept_at": kept_at, "useless": sum(n["useless"] for n in nights),
                     "true_before": true_rate(model, pool["test"], start),
                     "true_after": true_rate(model, pool["test"], live)}
    return out


def run_setting(pool: dict, temperature: float, mode: str, seeds: range, gates: list[str], args, n_val: int,
                unit_cache: dict, scratch: Path) -> dict:
    """Every seed under the default gate; the first ``--contrast-seeds`` under the others too."""
    res: dict = {g: [] for g in gates}
    for i, seed in enumerate(seeds):
        run = [g for g in gates if g == "paired" or args.contrast_seeds is None or i < args.contrast_seeds] or gates
        model = StandinModel(pool["all"], StandinConfig(seed=seed, effect=mode))
        t0 = time.perf_counter()
        if args.http:
            with StandinServer(model) as server:
                by = run_seed(pool, model, server.base_url, temperature, run, args, n_val, unit_cache, scratch)
        else:
            by = run_seed(pool, model, None, temperature, run, args, n_val, unit_cache, scratch)
        for g, d in by.items():
            res[g].append(d)
        print(f"  T={temperature:g} {mode} seed {seed} ({time.perf_counter() - t0:.0f} s): " + ", ".join(
            f"{g} acc/nights {sum(n['status'] == 'accepted' for n in d['nights'])}/{len(d['nights'])}"
            + (f" kept {d['kept']} useless {d['useless']}" if mode == "planted" else "") for g, d in by.items()),
            flush=True)
    return res


def summarise(null: dict, planted: dict) -> dict:
    out = {}
    for g in null:
        nn = [n for s in null[g] for n in s["nights"]]
        fa = sum(n["status"] == "accepted" for n in nn)
        ps = planted[g]
        pn = [n for s in ps for n in s["nights"]]
        allnights = nn + pn
        out[g] = {"null_nights": len(nn), "false_accept_nights": fa,
                  "false_accept_share": fa / len(nn) if nn else float("nan"),
                  "false_accept_ci95": clopper_pearson(fa, len(nn)) if nn else None,
                  "null_cannot_tell_nights": sum(n["cannot_tell"] > 0 for n in nn),
                  "null_true_change": float(np.mean([s["true_after"] - s["true_before"] for s in null[g]])),
                  "planted_seeds": len(ps), "planted_kept": sum(s["kept"] for s in ps),
                  "kept_at": [s["kept_at"] for s in ps],
                  "useless_alongside": float(np.mean([s["useless"] for s in ps])) if ps else float("nan"),
                  "planted_true_change": float(np.mean([s["true_after"] - s["true_before"] for s in ps])),
                  "requests_per_night": float(np.mean([n["requests"] for n in allnights])),
                  "sent_per_night": float(np.mean([n["sent"] for n in allnights])),
                  "seconds_per_night": float(np.mean([n["seconds"] for n in allnights])),
                  "val_tasks": float(np.mean([n["val_tasks"] for n in allnights]))}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--null-seeds", type=count, default=20, help="seeds of the null stand-in (x nights = null nights)")
    p.add_argument("--planted-seeds", type=count, default=10)
    p.add_argument("--contrast-seeds", type=count, default=None, help="only the first this many null and planted "
                   "seeds also run the old gates (strict, mean); default: every seed")
    p.add_argument("--nights", type=count, default=5)
    p.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7],
                   help="sampling temperatures to run (0: answers a fixed function of the prompt)")
    p.add_argument("--samples", type=count, default=GateConfig().samples,
                   help="replays per val task and arm above temperature 0 (the paired gate)")
    p.add_argument("--val-t0", type=count, default=160, help="val tasks a night at temperature 0")
    p.add_argument("--val-warm", type=count, default=40, help="val tasks a night above temperature 0")
    p.add_argument("--train", type=count, default=12, help="train tasks a night (reflect reads their failures)")
    p.add_argument("--per-topic", type=count, default=60, help="pool tasks per topic of the coder world (11 topics)")
    p.add_argument("--gates", nargs="+", default=list(GATES), choices=list(GATES))
    p.add_argument("--http", action="store_true", help="call the stand-in over HTTP through the SDK (about 5 ms "
                   "of CPU a call, 10x the run) instead of in process")
    p.add_argument("--quick", action="store_true", help="smoke run: 2 seeds x 2 nights each, small slices")
    args = p.parse_args()
    if any(t < 0 for t in args.temperatures):
        p.error("--temperatures must be >= 0")
    if args.quick:
        args.null_seeds, args.planted_seeds, args.nights, args.contrast_seeds = 2, 2, 2, 1
        args.val_t0, args.val_warm, args.per_topic = 40, 12, 16
    GATES["paired"] = GateConfig(samples=args.samples)
    world = SimWorld.load(SKILL)
    tasks = world.generate_tasks(2026, per_topic=args.per_topic, split=POOL_SPLIT, prefix="gate")
    pool = {"all": tasks, **{s: [t for t in tasks if t.split == s] for s in ("train", "val", "test")}}
    if len(pool["val"]) < max(args.val_t0, args.val_warm) or len(pool["train"]) < args.train:
        p.error(f"the pool has {len(pool['train'])} train and {len(pool['val'])} val tasks: raise --per-topic")
    scratch_root = ROOT / "benchmarks" / ".scratch"
    scratch_root.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()
    t_all = time.perf_counter()
    unit_cache: dict = {}
    results: dict = {}
    with tempfile.TemporaryDirectory(dir=scratch_root, prefix="sleep-gate-") as tmp:
        for temperature in args.temperatures:
            n_val = args.val_t0 if temperature == 0 else args.val_warm
            t0 = time.perf_counter()
            print(f"T={temperature:g}: val {n_val} tasks a night, train {args.train}; {args.null_seeds} null and "
                  f"{args.planted_seeds} planted seeds x {args.nights} nights x {len(args.gates)} gates", flush=True)
            null = run_setting(pool, temperature, "null", range(args.null_seeds), args.gates, args, n_val,
                               unit_cache, Path(tmp))
            planted = run_setting(pool, temperature, "planted", range(100, 100 + args.planted_seeds), args.gates,
                                  args, n_val, unit_cache, Path(tmp))
            results[f"{temperature:g}"] = {"summary": summarise(null, planted), "null": null, "planted": planted,
                                           "val_tasks": n_val, "seconds": time.perf_counter() - t0}
    total = time.perf_counter() - t_all

    sc = StandinConfig()
    print(f"\nStand-in: base rate {sc.base_low}-{sc.base_high}, whole-prompt perturbation sd {sc.perturbation_sd}, "
          f"planted Delta {sc.delta:+} (proposed with p {sc.propose_planted} a night, {sc.useless} useless rules a "
          f"night); pool {len(tasks)} coder tasks; {args.nights} nights a seed; "
          f"{'HTTP through the SDK' if args.http else 'in process'}.\n")
    head = ("| T | gate | val tasks x samples | null nights | false-accept nights | share (95% CI) | null nights "
            "'cannot tell' | planted kept | kept by night | useless alongside | true pass change planted / null | "
            "requests/night (sent) | s/night |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for t, r in results.items():
        for g, s in r["summary"].items():
            k = GATES[g].replays(float(t) > 0)
            lo, hi = s["false_accept_ci95"]
            nights_kept = ",".join(str(x) if x else "-" for x in s["kept_at"])
            print(f"| {t} | {g} | {r['val_tasks']} x {k} | {s['null_nights']} | {s['false_accept_nights']} | "
                  f"{s['false_accept_share']:.1%} ({lo:.1%}-{hi:.1%}) | {s['null_cannot_tell_nights']} | "
                  f"{s['planted_kept']}/{s['planted_seeds']} | {nights_kept} | {s['useless_alongside']:.2f} | "
                  f"{s['planted_true_change']:+.3f} / {s['null_true_change']:+.3f} | "
                  f"{s['requests_per_night']:.0f} ({s['sent_per_night']:.0f}) | "
                  f"{s['seconds_per_night']:.2f} |")
    goals = {}
    for t, r in results.items():
        if "paired" not in r["summary"]:
            continue
        s = r["summary"]["paired"]
        goals[f"T={t}"] = {"false_accept_le_5pct": s["false_accept_share"] <= 0.05,
                           "planted_kept_ge_8_of_10": s["planted_kept"] >= 0.8 * s["planted_seeds"],
                           "useless_alongside_le_1": s["useless_alongside"] <= 1.0}
        print(f"\nGoals, default gate, T={t}: false-accept {s['false_accept_share']:.1%} <= 5%: "
              f"{goals[f'T={t}']['false_accept_le_5pct']}; planted kept {s['planted_kept']}/{s['planted_seeds']} "
              f">= 8 of 10: {goals[f'T={t}']['planted_kept_ge_8_of_10']}; useless alongside "
              f"{s['useless_alongside']:.2f} <= 1: {goals[f'T={t}']['useless_alongside_le_1']}")
    print(f"\nsandbox executions: {len(unit_cache)} (cached by answer and tests, local runner: trusted, generated "
          f"tasks); wall time {total:.0f} s ("
          + ", ".join(f"T={t}: {r['seconds']:.0f} s" for t, r in results.items())
          + f"); load average before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    out = scratch_root / "sleep_gate.json"
    out.write_text(json.dumps({"args": vars(args), "results": results, "goals": goals, "seconds": total,
                               "load_before": load, "load_after": os.getloadavg(),
                               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                           "platform": platform.platform()}}, indent=1, default=str))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
