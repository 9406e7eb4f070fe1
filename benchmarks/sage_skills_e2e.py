"""The SAGE-skills night end to end, with SAGE's real `sage run`: its false-accept rate and power (issue 42, item 6).

SAGE's unchanged `sage run` runs --runs tasks in the model world (`sage_world/`, the skills harness on: a test
harness, never a claim about real models) with SAGE_SKILLS_ROOT at a fresh project skills root (SAGE's nine skills
as shipped), 2 runs at a time; its workspaces and journals are harvested for the coder
(`sleep/sage_harvest.py`, goals from a ledger the harness keeps, as SAGE logs no goal) and the harvest's counts
printed by reason. Then nights of `run_sage_night` (`sleep/sage_night.py`) on those tasks, each through the
project's `OpenAIBackend` against the world's OpenAI-compatible `/v1` route (by default in process: the same
request bodies to the same route handler, `WorldServer.openai_chat`, without the socket; `--http` over loopback):

- **null**: --null-nights nights on consecutive dates (so each draws its val slice afresh), each on a fresh
  `SageSkillsRoot` (SAGE's skills as shipped), against a world in `null` mode (skills change nothing) whose
  reflect answers with --useless plausible rules that change nothing. A night that accepts anything is a false
  accept: the share, with its Clopper-Pearson 95% interval.
- **planted**: --planted-seeds seeds x up to --nights nights; each seed a fresh root, consecutive dates (a
  different start per seed), a world `planted` on the coder with Delta = --delta (its instruction, when SAGE's
  injector puts it into the coder's prompt, raises the coder's chance of a right file by Delta), whose reflect
  proposes the instruction with probability --propose a reply (until the skills hold it) and --useless useless
  rules. Per seed: whether the instruction was accepted within the nights, the night it was, the useless rules
  accepted alongside (every night of the seed), and the exact truth of the final live version: whether SAGE would
  inject the instruction into the coder's prompt for each harvested goal (`skills_world.skills_effect`, SAGE's
  own selection and caps) and the coder's true chance of a right first file before and after
  (`ModelWorld.chance` over the harvested tasks: for the model the night replays, and averaged over the models of
  the coder's row in SAGE's table).

The night runs with `SageNightConfig()`'s settings unless --samples, --train-share, --val-share, --train-samples or
--alpha say otherwise, at --temperature 0.7 (the world draws every call afresh, as a model above 0 does).

Then issue 42's goal lines (false-accept <= 5% of null nights; the planted +0.15 kept within 5 nights in >= 8 of
10 seeds; useless rules alongside <= 1 on average), whether each is met, and when nights could not tell, what they
said (the val tasks they would need). With several --runs values (e.g. `--runs 40 160`), SAGE runs each extra
batch as another day, and every measurement is repeated on the harvest of all days so far (the smaller harvest is
a part of the larger). Wall and CPU time, and where they go (SAGE's runs, the harvest, null and planted nights).

    SAGE_PYTHON=.sage/venv/bin/python .venv/bin/python benchmarks/sage_skills_e2e.py [--runs 40 160]
        [--null-nights 100] [--quick] [--http] [--out benchmarks/.scratch/NAME.json]

Results: printed, and written to --out (benchmarks/.scratch/sage_skills_e2e.json); SAGE's workspaces and the
nights' diagnostics go to the folder of the same name (replaced each run). docs/benchmarks.md has the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import sys
import time
from datetime import date, timedelta
from pathlib import Path

import numpy as np
from _cli import count  # benchmarks/ is the script's folder: first on sys.path
from pydantic import ValidationError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sage_pipeline import artifacts  # noqa: E402
from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, goal, run_day  # noqa: E402
from sage_pipeline.sage_world.server import WorldServer  # noqa: E402
from sage_pipeline.sage_world.skills_world import (  # noqa: E402
    PLANTED_INSTRUCTION,
    SkillsWorldConfig,
    carries,
    skills_effect,
)
from sage_pipeline.sage_world.world import RUN_MARK, ModelWorld, WorldConfig, WorldError, build_world  # noqa: E402
from sage_pipeline.sleep.backends import OpenAIBackend, OpenAIConfig, Reply  # noqa: E402
from sage_pipeline.sleep.gate import GateConfig  # noqa: E402
from sage_pipeline.sleep.judges import UnitTestJudge  # noqa: E402
from sage_pipeline.sleep.records import SplitSpec  # noqa: E402
from sage_pipeline.sleep.sage_harvest import (  # noqa: E402
    SageHarvestConfig,
    harvest_sage,
    untrusted_judge,
    write_goal_ledger,
)
from sage_pipeline.sleep.sage_night import HEALTHY, SageNightConfig, run_sage_night  # noqa: E402
from sage_pipeline.sleep.sage_skills import SageSkillsRoot  # noqa: E402

SCRATCH = ROOT / "benchmarks" / ".scratch"
# The null nights' first date; planted seed s starts at PLANTED_START + 10 s days. A date seeds only the night's val
# slice (a hash of date and task id): past 90 null nights their dates meet the planted ones, each with its own world.
NULL_START = date(2026, 12, 1)
PLANTED_START = date(2027, 3, 1)
GOALS = {"false_accept": 0.05, "kept_share": 0.8, "useless": 1.0, "nights": 5}


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact binomial interval of k successes in n (was benchmarks/sleep_gate.py's, deleted with the generic
    cycle it measured)."""
    from scipy.stats import beta

    a = 1.0 - level
    lo = 0.0 if k == 0 else float(beta.ppf(a / 2, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a / 2, k + 1, n - k))
    return lo, hi


class WorldBackend(OpenAIBackend):
    """The project's :class:`OpenAIBackend` with its HTTP hop replaced by a direct call of the world server's
    ``/v1/chat/completions`` handler (:meth:`WorldServer.openai_chat`): the same request bodies (built, retried
    and counted by ``OpenAIBackend``'s own code) and the same reply JSON parsed by its own parser; a request the
    world refuses is the HTTP 400 the server would send. Only the SDK and the socket are skipped (``--http``
    goes through them)."""

    def __init__(self, server: WorldServer, config: OpenAIConfig) -> None:
        super().__init__(config)
        self.server = server

    def _post(self, body: dict) -> Reply:
        try:
            payload = self.server.openai_chat(json.loads(json.dumps(body)))
        except WorldError as e:
            self._raise_for_status(400, json.dumps({"error": str(e)}).encode("utf-8"), {})
        return self._parse(json.dumps(payload).encode("utf-8"))

    def describe(self) -> dict:
        return {**super().describe(), "transport": "in-process (the world server's /v1 handler, no socket)"}


def sage_python(given: str | None) -> str:
    py = given or os.environ.get("SAGE_PYTHON", "")
    if not py and (ROOT / ".sage" / "venv" / "bin" / "python").is_file():
        py = str(ROOT / ".sage" / "venv" / "bin" / "python")
    if not py:
        sys.exit("no SAGE: give --sage-python (or SAGE_PYTHON), SAGE installed by `scripts/sage_venv.sh <SAGE "
                 "checkout>` into .sage/venv, never into .venv")
    return py


def night_config(a: argparse.Namespace) -> SageNightConfig:
    return SageNightConfig(gate=GateConfig(samples=a.samples, alpha=a.alpha),
                           split=SplitSpec(train=a.train_share, val=a.val_share), train_samples=a.train_samples)


def backend_for(server: WorldServer, model: str, a: argparse.Namespace) -> OpenAIBackend:
    cfg = OpenAIConfig(base_url=server.url + "/v1", model=model, temperature=a.temperature, max_retries=1,
                       timeout_s=60.0)
    return OpenAIBackend(cfg) if a.http else WorldBackend(server, cfg)


def one_night(root: SageSkillsRoot, world: ModelWorld, server: WorldServer, h, unit: UnitTestJudge, day: date,
              a: argparse.Namespace, instruction: str) -> dict:
    """One night on ``root`` against ``world``; what it did, as the benchmark counts it."""
    backend = backend_for(server, world.row("coder")[0], a)
    asked = len(world.skills.reflects)
    t0 = time.perf_counter()
    r = run_sage_night(root, h.tasks, backend, unit, night_config(a), date=day.isoformat(), harvest=h.summary())
    secs = time.perf_counter() - t0
    if r.status not in HEALTHY:
        raise SystemExit(f"night {day} on {root.folder}: {r.status} during {r.phase}: {r.reason} {r.cause}\n"
                         f"{r.traceback}\n(diagnostics: {r.diagnostics})")
    accepted = [e["content"] for e in r.edits if e["status"] == "accepted"]
    planted = [c for c in accepted if carries(c, instruction)]
    unsure = [t for t in r.trials if t["verdict"] == "cannot_tell"]
    calls = r.calls or {}
    return {"date": day.isoformat(), "status": r.status, "reason": r.reason[:400], "accepted": len(accepted),
            "gate_accepted": any(t["accepted"] for t in r.trials),  # committed, or refused after (val overlaps)
            "planted": len(planted), "useless": len(accepted) - len(planted),
            "proposed_instruction": any(x["proposed_instruction"] for x in world.skills.reflects[asked:]),
            "val_tasks": r.tasks.get("val", 0), "train_tasks": r.tasks.get("train", 0),
            "test_tasks": r.tasks.get("test", 0),
            "trials": [{k: t[k] for k in ("verdict", "p_value", "level", "tasks", "samples", "needed_tasks",
                                          "detectable", "baseline", "candidate")} | {"edits": t["edits"]}
                       for t in r.trials],
            "cannot_tell": len(unsure), "needed_tasks": max((t["needed_tasks"] or 0 for t in unsure), default=None),
            "calls": calls.get("calls", 0), "seconds": round(secs, 2), "diagnostics": r.diagnostics}


def assign_runs(world: ModelWorld, runs: list[tuple[str, str]]) -> ModelWorld:
    for run, task_id in runs:
        world.assign(run, task_id)
    return world


def coder_truth(world: ModelWorld, tree: dict[str, str], h, task_of_run: dict[str, str]) -> dict:
    """The exact chance of a right first coder file over the harvested tasks, without the instruction and with
    ``tree`` live (per task: does SAGE inject the instruction into the coder's prompt for that goal): for the
    model the night replays (the primary of the coder's row) and averaged over the row's models (SAGE's bandit
    picks among them)."""
    cfg, models = world.skills.config, world.row("coder")
    live, before, after = [], [], []  # per task; before / after: one column per model of the row
    for t in h.tasks:
        idx = world.by_id[task_of_run[RUN_MARK.search(t.intent)["run"]]]
        on = skills_effect(tree, cfg, task_description=t.intent).live
        live.append(on)
        before.append([world.chance("coder", idx, m) for m in models])
        after.append([world.chance("coder", idx, m, instruction_live=on) for m in models])
    b, f = np.array(before), np.array(after)
    return {"instruction_live_share": float(np.mean(live)), "model": models[0], "p_before": float(b[:, 0].mean()),
            "p_after": float(f[:, 0].mean()), "change": float((f[:, 0] - b[:, 0]).mean()),
            "row_change": float((f - b).mean())}


def run_null(base: ModelWorld, runs, h, unit: UnitTestJudge, a, out: Path, instruction: str) -> list[dict]:
    world = assign_runs(ModelWorld(base.sim, base.table, WorldConfig(seed=a.seed + 1, clock_scale=0.0),
                                   skills=SkillsWorldConfig(mode="null", reflect_useless=a.useless, seed=a.seed + 1)),
                        runs)
    nights = []
    with WorldServer(world) as srv:
        for i in range(a.null_nights):
            root = SageSkillsRoot(out / f"night-{i:03d}")  # SAGE's skills as shipped, every night
            n = one_night(root, world, srv, h, unit, NULL_START + timedelta(days=i), a, instruction)
            nights.append(n)
            print(f"    null night {i + 1}/{a.null_nights} {n['date']}: {n['status']} (val {n['val_tasks']}, "
                  f"{n['accepted']} accepted, {n['cannot_tell']} cannot tell"
                  + (f", needs ~{n['needed_tasks']} val tasks" if n["needed_tasks"] else "")
                  + f"; {n['calls']} calls, {n['seconds']:.1f} s)", flush=True)
    return nights


def run_planted(base: ModelWorld, runs, h, unit: UnitTestJudge, a, out: Path, task_of_run: dict[str, str]
                ) -> list[dict]:
    seeds = []
    for s in range(a.planted_seeds):
        cfg = SkillsWorldConfig(mode="planted", role="coder", delta=a.delta, seed=a.seed + 100 + s,
                                reflect_propose=a.propose, reflect_useless=a.useless)
        world = assign_runs(ModelWorld(base.sim, base.table, WorldConfig(seed=a.seed + 100 + s, clock_scale=0.0),
                                       skills=cfg), runs)
        root = SageSkillsRoot(out / f"seed-{s:02d}")
        start_tree = root.texts("live")
        nights, kept_at = [], None
        t0 = time.perf_counter()
        with WorldServer(world) as srv:
            for i in range(a.nights):
                world.skills.know(root.texts("live"))
                n = one_night(root, world, srv, h, unit, PLANTED_START + timedelta(days=10 * s + i), a,
                              cfg.instruction)
                nights.append(n)
                if n["planted"] and kept_at is None:
                    kept_at = i + 1
                if kept_at is not None and a.stop_when_kept:
                    break
        final = root.texts("live")
        truth = coder_truth(world, final, h, task_of_run)
        seed = {"seed": s, "nights": nights, "kept_at": kept_at, "kept": truth["instruction_live_share"] > 0,
                "useless": sum(n["useless"] for n in nights), "truth": truth,
                "truth_start": coder_truth(world, start_tree, h, task_of_run),
                "proposed_nights": sum(n["proposed_instruction"] for n in nights),
                "versions": len(root.versions()), "seconds": round(time.perf_counter() - t0, 1)}
        seeds.append(seed)
        print(f"    planted seed {s + 1}/{a.planted_seeds}: kept {seed['kept']} (night {kept_at or '-'}), "
              f"proposed on {seed['proposed_nights']}/{len(nights)} nights, useless accepted {seed['useless']}, "
              f"nights " + ",".join(n["status"][:3] for n in nights)
              + f"; true coder chance ({truth['model']}) {truth['p_before']:.3f} -> {truth['p_after']:.3f} "
              f"({truth['change']:+.3f}); {seed['seconds']:.0f} s", flush=True)
    return seeds


def summarise(null: list[dict], planted: list[dict]) -> dict:
    fa = sum(n["gate_accepted"] for n in null)
    lo, hi = clopper_pearson(fa, len(null)) if null else (float("nan"), float("nan"))
    pn = [n for s in planted for n in s["nights"]]
    kept = sum(s["kept"] for s in planted)
    both = null + pn
    unsure = [n for n in both if n["cannot_tell"]]
    return {"null_nights": len(null), "false_accepts": fa, "null_committed": sum(n["accepted"] > 0 for n in null),
            "false_accept_share": fa / len(null) if null else None,
            "false_accept_ci95": [lo, hi], "null_useless_accepted": sum(n["useless"] for n in null),
            "null_cannot_tell": sum(n["cannot_tell"] > 0 for n in null),
            "null_status": {k: sum(n["status"] == k for n in null) for k in sorted({n["status"] for n in null})},
            "planted_seeds": len(planted), "kept": kept, "kept_at": [s["kept_at"] for s in planted],
            "useless_alongside": float(np.mean([s["useless"] for s in planted])) if planted else None,
            "planted_nights": len(pn), "planted_cannot_tell": sum(n["cannot_tell"] > 0 for n in pn),
            "proposed_share": float(np.mean([n["proposed_instruction"] for n in pn])) if pn else None,
            "true_change": float(np.mean([s["truth"]["change"] for s in planted])) if planted else None,
            "p_before": float(np.mean([s["truth"]["p_before"] for s in planted])) if planted else None,
            "row_change": float(np.mean([s["truth"]["row_change"] for s in planted])) if planted else None,
            "val_tasks": float(np.mean([n["val_tasks"] for n in both])) if both else 0.0,
            "needed_tasks_median": float(np.median([n["needed_tasks"] for n in unsure if n["needed_tasks"]]))
            if any(n["needed_tasks"] for n in unsure) else None,
            "detectable_median": float(np.median(ds)) if (ds := [t["detectable"] for n in both for t in n["trials"]
                                                                 if t["detectable"] is not None]) else None,
            "calls_per_night": float(np.mean([n["calls"] for n in both])) if both else 0.0,
            "seconds_per_night": float(np.mean([n["seconds"] for n in both])) if both else 0.0}


def goal_lines(s: dict) -> dict:
    fa_ok = s["false_accept_share"] is not None and s["false_accept_share"] <= GOALS["false_accept"]
    kept_ok = s["planted_seeds"] > 0 and s["kept"] >= GOALS["kept_share"] * s["planted_seeds"]
    useless_ok = s["useless_alongside"] is not None and s["useless_alongside"] <= GOALS["useless"]
    return {"false_accept_le_5pct": fa_ok, "planted_kept_ge_8_of_10": kept_ok, "useless_alongside_le_1": useless_ok}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    d = SageNightConfig()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sage-python", default=None, help="SAGE's venv python (default $SAGE_PYTHON, else .sage/venv)")
    ap.add_argument("--runs", type=count, nargs="+", default=[40], help="`sage run`s harvested; several values "
                    "(ascending) run the extra runs as further days and measure again on all days so far")
    ap.add_argument("--workers", type=count, default=2, help="`sage run`s at once")
    ap.add_argument("--null-nights", type=count, default=30)
    ap.add_argument("--planted-seeds", type=count, default=10)
    ap.add_argument("--nights", type=count, default=GOALS["nights"], help="nights per planted seed")
    ap.add_argument("--stop-when-kept", action="store_true", help="end a planted seed at the night that accepted "
                    "the instruction (faster; useless rules alongside then count only those nights)")
    ap.add_argument("--delta", type=float, default=0.15, help="the planted instruction's gain in the coder's chance")
    ap.add_argument("--propose", type=float, default=0.7, help="the chance a planted world's reflect reply proposes "
                    "the instruction")
    ap.add_argument("--useless", type=int, default=3, help="useless rules in every reflect reply")
    ap.add_argument("--temperature", type=float, default=0.7, help="the night's sampling temperature (above 0 the "
                    "gate replays each val task --samples times per arm)")
    ap.add_argument("--samples", type=count, default=d.gate.samples, help="gate replays per val task and arm "
                    "(default: the night's)")
    ap.add_argument("--alpha", type=float, default=d.gate.alpha, help="the gate's family-wise false-accept level")
    ap.add_argument("--train-share", type=float, default=d.split.train, help="the night's split: train share "
                    "(default: the night's)")
    ap.add_argument("--val-share", type=float, default=d.split.val, help="the night's split: val share (default: "
                    "the night's); test is the rest")
    ap.add_argument("--train-samples", type=count, default=d.train_samples, help="replays of each train task "
                    "(default: the night's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--http", action="store_true", help="the nights' calls over loopback HTTP through the SDK")
    ap.add_argument("--out", default=str(SCRATCH / "sage_skills_e2e.json"), help="the results JSON (SAGE's "
                    "workspaces and the nights' diagnostics go to the folder of the same name without .json)")
    ap.add_argument("--quick", action="store_true", help="smoke run: by default 8 runs, 3 null nights, 2 planted "
                    "seeds x 2 nights")
    if ap.parse_args(argv).quick:  # smaller defaults; what the command line gives still wins
        ap.set_defaults(runs=[8], null_nights=3, planted_seeds=2, nights=2)
    a = ap.parse_args(argv)
    if sorted(a.runs) != a.runs or len(set(a.runs)) != len(a.runs):
        ap.error(f"--runs {' '.join(map(str, a.runs))}: give increasing counts (each extra batch is another day)")
    if not 0 <= a.propose <= 1 or not -1 <= a.delta <= 1 or a.useless < 0 or a.temperature < 0:
        ap.error("--propose in [0, 1], --delta in [-1, 1], --useless >= 0, --temperature >= 0")
    try:
        night_config(a)
    except ValidationError as e:  # name the field and what is wrong, on one line
        ap.error("the night's settings: " + "; ".join(
            f"{'.'.join(map(str, x['loc'])) or 'split'}: {x['msg']}" for x in e.errors()))
    if a.temperature == 0:
        print("note: at temperature 0 the backend replays each val task once and caches replies (the world still "
              "draws each uncached call afresh)")
    return a


class Day:
    """SAGE's runs so far (every day's), the goal ledger the harness keeps for them, and their harvest."""

    def __init__(self, base: ModelWorld, install: SageInstall, shipped: SageSkillsRoot, out: Path) -> None:
        self.base, self.install, self.shipped, self.out = base, install, shipped, out
        self.runs: list[tuple[str, str]] = []  # (run, task id), every day's
        self.spaces: list[Path] = []
        self.ledger: list[dict] = []
        self.days: list[dict] = []

    def run(self, url: str, k: int, task_ids: list[str], workers: int) -> None:
        day = run_day(self.base, url, self.install, k, task_ids, self.out / f"day{k}", HarnessConfig(workers=workers),
                      skills_root=self.shipped.live_path(), progress=lambda m: print("  " + m, flush=True))
        self.days.append(day.summary())
        print(f"`sage run` day {k}: {day.finished}/{len(day.runs)} finished, failures {day.failures or '{}'}, "
              f"{day.summary()['tasks_right']} right, {day.seconds:.0f} s", flush=True)
        for r in day.runs:
            self.runs.append((r.run, r.task_id))
            if r.sessions:  # the harness's goal ledger: SAGE logs no goal
                self.ledger.append({"session_id": r.sessions[0],
                                    "goal": goal(r.run, self.base.tasks[self.base.by_id[r.task_id]].prompt)})
        self.spaces += sorted((self.out / f"day{k}").glob("ws-*"))

    def harvest(self, unit: UnitTestJudge):
        path = write_goal_ledger(self.out / f"goals-{len(self.runs)}.jsonl", self.ledger)
        h = harvest_sage(self.spaces, None, "coder", SageHarvestConfig(goal_ledgers=(path,), sandbox="local",
                                                                      allow_untrusted_local=True), judge=unit)
        hs = h.summary()
        if not h.tasks:
            sys.exit(f"the harvest of {len(self.runs)} runs found no task ({hs}): see SAGE's run logs under "
                     f"{self.out}/day*/runs/")
        print(f"harvest of {len(self.runs)} runs: {hs['sessions']} sessions -> {hs['tasks']} tasks "
              f"({hs['validated']} validated); left out by reason: {hs['reasons'] or 'none'} ({hs['seconds']:.1f} s)",
              flush=True)
        return h


def main(argv: list[str] | None = None) -> None:
    a = parse_args(argv)
    t_start, cpu_start, load = time.perf_counter(), time.process_time(), os.getloadavg()
    secs = dict.fromkeys(("world", "sage_runs", "harvest", "null_nights", "planted_nights"), 0.0)
    out = Path(a.out).resolve().with_suffix("")  # absolute: SAGE runs in its workspaces' folders
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    install = SageInstall.find(sage_python(a.sage_python))
    n_max = a.runs[-1]
    t0 = time.perf_counter()
    base = build_world(install.models_yaml, n_tasks=max(40, int(n_max * 1.25) + 10), task_seed=1,
                       config=WorldConfig(seed=a.seed, clock_scale=0.0),
                       skills=SkillsWorldConfig(mode="null", reflect_useless=a.useless, seed=a.seed))
    if len(base.tasks) < n_max:
        sys.exit(f"the world verified only {len(base.tasks)} tasks, fewer than --runs {n_max}")
    secs["world"] = time.perf_counter() - t0
    print(f"model world: {len(base.tasks)} tasks ({secs['world']:.0f} s); coder row {base.row('coder')}", flush=True)
    shipped = SageSkillsRoot(out / "sage-run-skills")  # SAGE's skills as shipped: what every `sage run` injects
    base.skills.know(shipped.texts("live"))
    sage, results = Day(base, install, shipped, out), []
    # the world's tasks are the project's own code, harvested as SAGE's: the explicit override runs them locally
    unit = untrusted_judge("local", allow_untrusted_local=True)  # one cache
    try:
        with WorldServer(base) as srv:
            for k, n in enumerate(a.runs):
                t0 = time.perf_counter()
                sage.run(srv.url, k + 1, [t.task_id for t in base.tasks[a.runs[k - 1] if k else 0:n]], a.workers)
                t1 = time.perf_counter()
                h = sage.harvest(unit)
                t2 = time.perf_counter()
                print(f"  {n} runs: {a.null_nights} null nights", flush=True)
                null = run_null(base, sage.runs, h, unit, a, out / f"n{n}" / "null", PLANTED_INSTRUCTION)
                t3 = time.perf_counter()
                print(f"  {n} runs: {a.planted_seeds} planted seeds x up to {a.nights} nights", flush=True)
                planted = run_planted(base, sage.runs, h, unit, a, out / f"n{n}" / "planted", dict(sage.runs))
                t4 = time.perf_counter()
                for key, dt in zip(("sage_runs", "harvest", "null_nights", "planted_nights"),
                                   (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                    secs[key] += dt
                s = summarise(null, planted)
                results.append({"runs": n, "harvest": h.summary(), "summary": s, "goals": goal_lines(s),
                                "null": null, "planted": planted})
    finally:
        unit.close()
    wall = time.perf_counter() - t_start
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    report(a, results, sage.days, wall, secs, time.process_time() - cpu_start, ru.ru_utime + ru.ru_stime, load, unit)


def report(a, results: list[dict], days: list[dict], wall: float, parts: dict, cpu_self: float, cpu_children: float,
           load: tuple, unit: UnitTestJudge) -> None:
    c = night_config(a)
    nights = [n for r in results for n in (*r["null"], *(x for p in r["planted"] for x in p["nights"]))]
    levels = sorted({round(t["level"], 6) for n in nights for t in n["trials"] if t["level"] is not None})
    print(f"\nNight: `run_sage_night` (coder) through OpenAIBackend "
          f"({'HTTP' if a.http else 'in process'}) at temperature {a.temperature:g}, paired gate alpha "
          f"{c.gate.alpha:g} split over the night's trials (levels used: {', '.join(f'{x:g}' for x in levels)}), "
          f"{c.gate.samples} samples per val task and arm, "
          f"split train {c.split.train:g} / val {c.split.val:g} / test {1 - c.split.train - c.split.val:.2g}, "
          f"train samples {c.train_samples}; world: delta {a.delta:+g} on the coder, reflect proposes the "
          f"instruction with p {a.propose:g} and {a.useless} useless rules a reply.\n")
    head = ("| runs | harvested tasks | val tasks / night | null nights | false accepts | share (95% CI) | "
            "null 'cannot tell' | planted kept | kept by night | useless alongside | planted 'cannot tell' nights | "
            "true coder chance change, night's model (row mean) | calls / night | s / night |")
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for r in results:
        s, hs = r["summary"], r["harvest"]
        lo, hi = s["false_accept_ci95"]
        kept_by = ",".join(str(x) if x else "-" for x in s["kept_at"])
        print(f"| {r['runs']} | {hs['tasks']} | {s['val_tasks']:.1f} | {s['null_nights']} | {s['false_accepts']} | "
              f"{s['false_accept_share']:.1%} ({lo:.1%}-{hi:.1%}) | {s['null_cannot_tell']} | "
              f"{s['kept']}/{s['planted_seeds']} | {kept_by} | {s['useless_alongside']:.2f} | "
              f"{s['planted_cannot_tell']}/{s['planted_nights']} | {s['true_change']:+.3f} from "
              f"{s['p_before']:.3f} ({s['row_change']:+.3f}) | {s['calls_per_night']:.0f} | "
              f"{s['seconds_per_night']:.1f} |")
    for r in results:
        s, g = r["summary"], r["goals"]
        print(f"\nGoals with {r['runs']} runs ({r['harvest']['tasks']} harvested tasks, {s['val_tasks']:.1f} val a "
              f"night): false-accept {s['false_accept_share']:.1%} <= 5%: "
              f"{'met' if g['false_accept_le_5pct'] else 'NOT met'}"
              f"; planted +{a.delta:g} kept within {a.nights} nights in {s['kept']}/{s['planted_seeds']} seeds "
              f">= 8 of 10: {'met' if g['planted_kept_ge_8_of_10'] else 'NOT met'}; useless alongside "
              f"{s['useless_alongside']:.2f} <= 1: {'met' if g['useless_alongside_le_1'] else 'NOT met'}")
        unsure = s["null_cannot_tell"] + s["planted_cannot_tell"]
        if unsure:
            ex = next((n["reason"] for n in [*r["null"], *(x for p in r["planted"] for x in p["nights"])]
                       if "cannot tell" in n["reason"]), "")
            print(f"  {unsure} of {s['null_nights'] + s['planted_nights']} nights could not tell"
                  + (f"; median val tasks needed {s['needed_tasks_median']:.0f}" if s["needed_tasks_median"] else "")
                  + (f"; median smallest resolvable change {s['detectable_median']:+.3f}"
                     if s["detectable_median"] is not None else "")
                  + (f"\n  e.g. \"{ex[ex.find('this night cannot tell'):] if 'this night cannot tell' in ex else ex}\""
                     if ex else ""))
    other = wall - sum(parts.values())
    print(f"\nwall {wall:.0f} s: " + ", ".join(f"{k.replace('_', ' ')} {v:.0f} s" for k, v in parts.items())
          + f", other {other:.0f} s; `sage run` days: " + ", ".join(
              f"{d['runs']} runs in {d['seconds']:.0f} s ({d['runs_per_minute']:.1f}/min)" for d in days)
          + f"; CPU: this process {cpu_self:.0f} s (world, harvest, nights), SAGE's runs and sandbox children "
          f"{cpu_children:.0f} s; sandbox executions {unit.executed} (cached by answer and tests); load average "
          f"before {load[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    dest = artifacts.write_json(a.out, {
        "args": vars(a), "night_config": night_config(a).model_dump(), "days": days, "results": results,
        "seconds": {"wall": wall, **parts}, "cpu": {"self": cpu_self, "children": cpu_children},
        "load_before": list(load), "load_after": list(os.getloadavg()),
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}})
    print(f"results: {dest}")


if __name__ == "__main__":
    main()
