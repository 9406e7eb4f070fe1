"""SAGE's `sage run` started two ways, side by side on the same day of tasks: as a process of its own
per run (`HarnessConfig(fresh_process=True)`, SAGE imported every time) and forked from a launcher
that imported SAGE once per worker (`sage_pipeline.sage_world.launcher`, the default).

For each size N (`--tasks`, e.g. 30 60) and each way, one day of N runs against the model world (the
same world seed, tasks and run ids for both ways, so SAGE does the same work), with the exploring
checkpoint deployed as on the loop's day 1 (`--checkpoint none`: SAGE's YAML). Prints per way: wall,
CPU of the processes the harness started (SAGE's runs and what they start; the launchers and their
imports included) and of the harness process itself (the world's server, the harness's threads), per
run, and the ratio fresh / launcher; the runs' journals are checked to hold the same events both ways.

Then where a run's time goes (`--profile`): one run with SAGE already imported under cProfile (its
main thread: SAGE's workflow, the verification subprocess, the calls to the world, what SAGE still
imports), the CPU split between SAGE's Python and its subprocesses, the launcher's one-off import,
the world server's share, and the offline chain on the day's journals (the loop runs it every night).

    SAGE_PYTHON=<SAGE's venv python> .venv/bin/python benchmarks/sage_launcher.py [--tasks 30 60] [--workers 3]
        [--checkpoint explore|none] [--no-profile] [--out DIR]

Results: printed, and benchmarks/.scratch/sage_launcher/sage_launcher.json (unless --out).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import pstats
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

from _cli import count  # noqa: E402  (benchmarks/ is the script's folder: first on sys.path)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _cpu(who: int) -> float:
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def journal_events(day_root: Path) -> dict[str, list[tuple]]:
    """Per workspace, each journal line's event type and payload keys (timestamps left out)."""
    out = {}
    for ws in sorted(day_root.glob("ws-*")):
        seq = []
        for f in sorted((ws / "memory" / "sessions").glob("*.log")):
            for ln in f.read_text(encoding="utf-8").splitlines():
                if ln.startswith("{"):
                    e = json.loads(ln)
                    seq.append((e["type"], tuple(sorted(set(e) - {"timestamp"}))))
                else:
                    seq.append(("text", ln.split("] ", 1)[-1].split(" ", 1)[0]))
        out[ws.name] = seq
    return out


def one_day(world, install, tasks: list[str], root: Path, workers: int, fresh: bool, ckpt, floor) -> dict:
    from sage_pipeline.sage_world.harness import HarnessConfig, run_day
    from sage_pipeline.sage_world.server import WorldServer

    load = os.getloadavg()[0]
    with WorldServer(world) as srv:
        c0, s0, t0 = _cpu(resource.RUSAGE_CHILDREN), _cpu(resource.RUSAGE_SELF), time.perf_counter()
        res = run_day(world, srv.url, install, 1, tasks, root, HarnessConfig(workers=workers, fresh_process=fresh),
                      ckpt, floor, progress=lambda m: None)
        wall = time.perf_counter() - t0
        child, own = _cpu(resource.RUSAGE_CHILDREN) - c0, _cpu(resource.RUSAGE_SELF) - s0
    n = len(res.runs)
    cpus = [r.cpu_s for r in res.runs if r.cpu_s is not None]
    return {"way": "fresh" if fresh else "launcher", "runs": n, "finished": res.finished, "failures": res.failures,
            "launcher_restarts": res.launcher_restarts, "wall_s": wall, "wall_per_run_s": wall / n,
            "child_cpu_s": child, "child_cpu_per_run_s": child / n, "harness_cpu_s": own,
            "harness_cpu_per_run_s": own / n, "run_cpu_mean_s": sum(cpus) / len(cpus) if cpus else None,
            "runs_per_minute": 60 * n / wall, "load_before": load, "load_after": os.getloadavg()[0],
            "sessions_dirs": [str(p) for p in res.sessions_dirs]}


def profile_one_run(install, world, root: Path, ckpt, floor) -> dict:
    """One run with SAGE imported first (as in a launcher's child), ``main()`` under cProfile; its
    wall time split by where the main thread was, its CPU split between itself and its children."""
    from sage_pipeline.sage_world.harness import goal, sage_env
    from sage_pipeline.sage_world.launcher import PRELOAD
    from sage_pipeline.sage_world.server import WorldServer

    prof, split = root / "run.prof", root / "cpu.json"
    code = ("import importlib, json, resource, sys, time, cProfile\n"
            f"[importlib.import_module(m) for m in {list(PRELOAD)!r}]\n"
            f"ckpt = {str(ckpt) if ckpt else ''!r}\n"
            "if ckpt:\n"
            "    import joblib; joblib.load(ckpt)  # as the launcher: what unpickling the checkpoint imports\n"
            "from sage.cli.main import main\n"
            f"sys.argv = [{str(install.cli)!r}] + sys.argv[1:]\n"
            "u = lambda w: resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime\n"
            "s0, c0, t0 = u(resource.RUSAGE_SELF), u(resource.RUSAGE_CHILDREN), time.perf_counter()\n"
            "try:\n"
            f"    cProfile.run('main()', {str(prof)!r})\n"
            "finally:\n"
            f"    open({str(split)!r}, 'w').write(json.dumps({{'self': u(resource.RUSAGE_SELF) - s0, "
            "'children': u(resource.RUSAGE_CHILDREN) - c0, 'wall': time.perf_counter() - t0}))\n")
    ws = root / "ws"
    ws.mkdir(parents=True)
    task = world.tasks[0]
    world.assign("d09-r000", task.task_id, workspace=str(ws))
    with WorldServer(world) as srv:
        env = sage_env(install, srv.url, root / "home", root / "bin", ckpt, floor)
        s0 = _cpu(resource.RUSAGE_SELF)
        out = subprocess.run([str(install.python), "-c", code, "run", "--auto", "--no-clarify", "--fresh",
                              goal("d09-r000", task.prompt)], cwd=ws, env=env, capture_output=True, text=True,
                             timeout=600)
        server_cpu = _cpu(resource.RUSAGE_SELF) - s0
    if out.returncode != 0:
        raise RuntimeError(f"the profiled run failed (exit {out.returncode}): {out.stderr[-500:]}")
    st = pstats.Stats(str(prof))
    cum = {}
    for (file, _line, fn), (_cc, _nc, _tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        cum[(Path(file).name, fn)] = max(cum.get((Path(file).name, fn), 0.0), ct)

    def c(file: str, fn: str) -> float:
        return cum.get((file, fn), 0.0)

    total = c("main.py", "main")
    parts = {"verification subprocess (pytest, SAGE's gate)": c("verifier.py", "run"),
             "calls to the model world (ollama.chat, all agents)": c("ollama_safe.py", "chat_with_timeout"),
             "models.yaml parsed again (ModelRouter, per agent)": c("model_router.py", "__init__"),
             "imports SAGE still does lazily": c("<frozen importlib._bootstrap>", "_find_and_load"),
             "terminal output (rich)": c("console.py", "print"),
             "argparse (SAGE's CLI parser)": c("main.py", "build_parser")}
    parts["the rest of SAGE's workflow (langgraph, agents, journals)"] = total - sum(parts.values())
    cpu = json.loads(split.read_text())
    return {"wall_s": total, "parts_s": parts, "cpu_self_s": cpu["self"], "cpu_children_s": cpu["children"],
            "world_server_cpu_s": server_cpu}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=count, nargs="+", default=[30, 60], help="runs in a day, one size after another")
    ap.add_argument("--workers", type=count, default=None, help="`sage run`s at once (default: HarnessConfig's)")
    ap.add_argument("--checkpoint", choices=("explore", "none"), default="explore")
    ap.add_argument("--no-profile", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / ".scratch" / "sage_launcher"))
    a = ap.parse_args(argv)

    import logging

    logging.getLogger("dagster").setLevel(logging.WARNING)
    from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall
    from sage_pipeline.sage_world.world import ModelWorld, WorldConfig, build_world

    py = os.environ.get("SAGE_PYTHON", "")
    if not py:
        sys.exit("set SAGE_PYTHON to SAGE's Python (scripts/sage_venv.sh <SAGE checkout> prints it)")
    install = SageInstall.find(py)
    workers = a.workers or HarnessConfig().workers
    out = Path(a.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    base = build_world(install.models_yaml, n_tasks=max(max(a.tasks), 24), task_seed=a.seed)
    from sage_pipeline.sage import explore as sage_explore

    if a.checkpoint == "explore":  # as the loop's day 1: the exploring checkpoint around SAGE's YAML, recorded
        from sage_pipeline.defs.sage_loop_assets import offline_chain

        offline_chain(out / "data", None, 0.1, install.models_yaml)
    dep = sage_explore.record_deployment(out / "data", out / "data" / "checkpoints" / "sage"
                                         if a.checkpoint == "explore" else None)
    ckpt, floor = dep.path, dep.min_confidence
    report = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
              "workers": workers, "checkpoint": a.checkpoint, "sizes": []}
    print(f"SAGE {install.cli}; {workers} runs at once; checkpoint: {a.checkpoint}; {os.cpu_count()} CPUs\n")
    print("runs | way | wall s | wall/run s | runs/min | child CPU/run s | harness CPU/run s | run CPU (wait4) s | "
          "load | same journals")
    for n in a.tasks:
        tasks = [t.task_id for t in base.tasks[:n]]
        rows = []
        for fresh in (True, False):  # a fresh world per way: the same draws for the same run ids
            world = ModelWorld(base.sim, base.table, WorldConfig(seed=a.seed))
            rows.append(one_day(world, install, tasks, out / f"n{n}" / ("fresh" if fresh else "launcher"), workers,
                                fresh, ckpt, floor))
        same = journal_events(out / f"n{n}" / "fresh") == journal_events(out / f"n{n}" / "launcher")
        for r in rows:
            r["same_journals"] = same if a.checkpoint == "none" else None
            rc = f"{r['run_cpu_mean_s']:.2f}" if r["run_cpu_mean_s"] is not None else "-"
            print(f"{n} | {r['way']} | {r['wall_s']:.1f} | {r['wall_per_run_s']:.2f} | {r['runs_per_minute']:.1f} | "
                  f"{r['child_cpu_per_run_s']:.2f} | {r['harness_cpu_per_run_s']:.2f} | {rc} | "
                  f"{r['load_before']:.1f}-{r['load_after']:.1f} | "
                  + ("same" if same else ("differ (exploring draws)" if a.checkpoint == "explore" else "DIFFER")))
        f, la = rows
        ratio = {"wall": f["wall_s"] / la["wall_s"], "child_cpu": f["child_cpu_s"] / la["child_cpu_s"]}
        print(f"{n} | fresh / launcher | wall x{ratio['wall']:.2f}, CPU of SAGE's processes x{ratio['child_cpu']:.2f}")
        report["sizes"].append({"tasks": n, "ways": rows, "ratio": ratio, "same_journals": same})
        json.dump(report, open(out / "sage_launcher.json", "w"), indent=1)
    if not a.no_profile:
        from sage_pipeline.sage_world.harness import sage_env
        from sage_pipeline.sage_world.launcher import SageLauncher, console_python

        prof = profile_one_run(install, ModelWorld(base.sim, base.table, WorldConfig(seed=a.seed)), out / "profile",
                               ckpt, floor)
        env = sage_env(install, "http://127.0.0.1:9", out / "lhome", out / "lbin", ckpt, floor or 0.55)
        with SageLauncher(console_python(install.cli, install.python), install.cli, env, out / "launchers") as la:
            prof["launcher_import_s"], prof["launcher_import_cpu_s"] = la.info["import_s"], la.info["import_cpu_s"]
        from sage_pipeline.defs.sage_loop_assets import offline_chain

        last = report["sizes"][-1]["ways"][1]
        data = out / "chain"
        shutil.copytree(out / "data", data)
        t0 = time.perf_counter()
        offline_chain(data, [Path(p) for p in last["sessions_dirs"]], 0.1, install.models_yaml)
        prof["offline_chain_s"] = time.perf_counter() - t0
        prof["offline_chain_runs"] = last["runs"]
        report["profile"] = prof
        json.dump(report, open(out / "sage_launcher.json", "w"), indent=1)
        print(f"\nwhere one run's time goes (SAGE imported first; main thread, wall {prof['wall_s']:.2f} s):")
        for k, v in prof["parts_s"].items():
            print(f"  {k}: {v:.2f} s")
        print(f"  CPU: SAGE's process {prof['cpu_self_s']:.2f} s, its subprocesses {prof['cpu_children_s']:.2f} s; "
              f"the world's server (harness process) {prof['world_server_cpu_s']:.2f} s")
        print(f"  once per worker and day: the launcher's imports {prof['launcher_import_s']:.2f} s wall, "
              f"{prof['launcher_import_cpu_s']:.2f} s CPU")
        print(f"  once a night: the offline chain on {prof['offline_chain_runs']} runs' journals "
              f"{prof['offline_chain_s']:.1f} s")
    print("\nreport:", out / "sage_launcher.json")


if __name__ == "__main__":
    main()
