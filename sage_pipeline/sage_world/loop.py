"""The loop with SAGE in it: each day SAGE's own ``sage run`` works N tasks against the model world
with the checkpoint deployed that day; then the offline chain runs on every journal SAGE has written
so far, its gate decides, and what it promotes goes back to SAGE the next day.

Day 1 runs the exploring checkpoint around SAGE's YAML (``sage_explore``: SAGE's unchanged router
takes the other model with a known probability), or SAGE's YAML alone (``start="yaml"``: logs that
support no change, said so by the gate). Each later day runs the exploring checkpoint around what the
gate last promoted (around the YAML while nothing is). Every deployment is recorded
(``sage_explore.record_deployment``) before SAGE starts, so each logged decision's probability is
reconstructed exactly.

Per day the report gives, all from the world's exact truth (:mod:`~sage_pipeline.sage_world.truth`)
on that day's runs: the value of the deployed policy, of the YAML table and of the best policy
SAGE's router can express, and the share of that gap the deployment closes; then, after the chain,
the gate's decision and each candidate's OPE estimate (the headline estimator, with its interval)
beside its true value on the same report episodes, and whether the gate was right (a promotion is
wrong when the promoted policy's true value is below the table's).

**The coder lever** (``LoopConfig.coder_decisions``). ``"ledger"`` (the default): the decision ledger's coder lever
(:mod:`sage_pipeline.decisions.coder`) at ``<root>/data/decisions/ledger.json``. Before each day its plan is read
from the ledger (a round pending: 50/50 between the two coder models, each a ``models.yaml`` pinning the coder; a
pin: the pinned model at 1 - explore_share, the other at explore_share; neither: SAGE's table and its bandit, no
draws); each ``sage run`` gets its own recorded draw (``decisions.coder.draw``: exact integer thresholds, one line
per draw in ``days/day-NN/assignments.jsonl`` before any run starts) and runs with its arm's ``SAGE_MODELS_YAML``
and ``SAGE_TRACE_ID`` = the draw id (``harness.run_day(run_env=...)``). After the chain, :func:`coder_night_ledger`
joins every run to its draw (SAGE's logged ``trace_id`` from ``routing/trajectories.parquet``, else the harness's
record of the run's sessions), adds the randomised runs as evidence, decides, opens a new round when due and saves
the ledger; its report stands each candidate's estimate and interval beside the world's exact gap between the two
pinned tables on every run so far.
``"bootstrap"``: the old per-night decision (``rl.coder_lever.decide``: valid for one night only), which pins
the day-level models.yaml and never reverts.

The offline chain is passed in (``chain``: the Dagster assets, run by ``sage_pipeline.defs``): this
module imports no dagster.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.decisions import assign, coder as coder_ledger
from sage_pipeline.decisions.coder import CoderDecisionsConfig
from sage_pipeline.decisions.ledger import LEDGER_NAME, Ledger
from sage_pipeline.rl import coder_lever, offline_eval as oe, ope
from sage_pipeline.rl.coder_lever import CoderLeverConfig
from sage_pipeline.sage import checkpoint as sage_router, explore as sage_explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable, pin
from sage_pipeline.sage_world import phase5, truth as T
from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, run_day
from sage_pipeline.sage_world.server import WorldServer
from sage_pipeline.sage_world.world import ModelWorld, WorldConfig, build_world, world_info, write_truth
from sage_pipeline.sim.families import FAMILIES

log = logging.getLogger(__name__)
REPORT_NAME = "sage_loop.json"
HEADLINE = ope.HEADLINE_ESTIMATOR  # what offline_eval's summary leads with and its gate reads
# chain(data_root, log_dirs, exploration_rate): runs the offline chain on ``log_dirs`` (None: only the
# exploring checkpoint around SAGE's YAML, day 1) into ``data_root``; returns what it wants recorded
Chain = Callable[[Path, list[Path] | None, float], dict]


class LoopConfig(BaseModel):
    """The loop's settings (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    days: int = Field(7, ge=1, le=365, description="simulated days")
    tasks_per_day: int = Field(100, ge=1, description="`sage run`s a day")
    pool: int = Field(300, ge=len(FAMILIES), description="generated tasks the days draw from (every task family "
                      "gets one at least)")
    seed: int = Field(0, description="the world's and the task draws' seed")
    start: Literal["explore", "yaml"] = Field("explore", description="day 1: the exploring checkpoint around "
                                              "SAGE's YAML, or SAGE's YAML alone (logs with no support)")
    exploration_rate: float = Field(sage_explore.DEFAULT_RATE, ge=0.0, le=sage_explore.MAX_RATE,
                                    description="P(the model the target does not choose) per decision")
    sage_bench: bool = Field(True, description="after the last day, run SAGE's own `sage bench --compare-policy` "
                             "against the world with the last promoted checkpoint (else the last deployed one)")
    objective: TaskObjective = Field(default_factory=TaskObjective,
                                     description="the per-task objective bundles are judged and promoted on (task_v1)")
    coder: CoderLeverConfig = Field(default_factory=CoderLeverConfig,
                                    description="the coder lever's learner: when SAGE's logs pin the coder's model")
    learn_coder: bool = Field(True, description="each night, learn the coder's model from the logs and pin it in the "
                              "models.yaml SAGE runs the next day (the lever no checkpoint reaches)")
    coder_decisions: Literal["ledger", "bootstrap"] = Field(
        "ledger", description="how the coder lever decides: 'ledger' (randomised runs, one recorded draw per sage run, "
        "evidence carried across nights, a pin on probation and reverted when its gain is excluded) or 'bootstrap' "
        "(a session-bootstrap interval on all logs each night: valid for one night only, never reverted)")
    # the ledger's coder lever's settings, flat (the Dagster section inherits these fields; its other settings are
    # decisions.coder.CoderDecisionsConfig's defaults)
    coder_explore_share: float = Field(CoderDecisionsConfig().explore_share, gt=0.0, lt=0.5,
                                       description="ledger mode: after a pin, the share of runs kept on the other "
                                       "coder model (probation: what finds a wrong pin out)")
    coder_after_revert: Literal["randomise", "table"] = Field(
        CoderDecisionsConfig().after_revert, description="ledger mode, after a revert: a new round at 50/50 the same "
        "night ('randomise'), or SAGE's table and its bandit until the lever reopens a round ('table')")

    def coder_decisions_config(self) -> CoderDecisionsConfig:
        """The ledger's coder lever's settings."""
        return CoderDecisionsConfig(explore_share=self.coder_explore_share, after_revert=self.coder_after_revert)
    sage_phase5: bool = Field(True, description="each night, run SAGE's own Phase-5 tools (`sage rl export`, "
                              "`train-bc`, `train-cql`, `eval-offline`, in SAGE's venv) on the same journals and put "
                              "their claim beside the exact truth (sage_world.phase5)")
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    world: WorldConfig = Field(default_factory=WorldConfig)


@dataclass
class LoopReport:
    config: dict
    world: dict
    days: list[dict] = field(default_factory=list)
    seconds: float = 0.0
    sage_bench: dict | None = None

    def goals(self) -> dict:
        """The issue's goals, measured: runs finished, OPE within 5% of the truth, wrong promotions,
        the gap the last deployment closes."""
        runs = sum(d["runs"]["runs"] for d in self.days)
        fin = sum(d["runs"]["finished"] for d in self.days)
        ope_days = [d for d in self.days if d.get("candidate_ope_error") is not None]
        within = sum(d["candidate_ope_error"] <= 0.05 for d in ope_days)
        last = self.days[-1] if self.days else {}
        coder = [d["coder_lever"] for d in self.days if d.get("coder_lever", {}).get("ope_error") is not None]
        coder_within = sum(c["ope_error"] <= 0.05 for c in coder)
        return {"runs": runs, "finished": fin, "finished_share": fin / runs if runs else None,
                "days_with_an_ope_number": len(ope_days), "ope_within_5pct": within,
                "ope_within_5pct_share": within / len(ope_days) if ope_days else None,
                "promotions": sum(bool(d.get("promoted")) for d in self.days),
                "wrong_promotions": sum(d.get("gate_right") is False and bool(d.get("promoted")) for d in self.days),
                "last_day_gap_closed": last.get("gap_closed"),
                # the objective (task_v1) and every lever: the bundle
                "last_day_objective_gap_closed": last.get("bundle", {}).get("gap_closed"),
                "bundle_promotions": sum(bool(d.get("coder_lever", {}).get("promoted")) for d in self.days),
                "wrong_bundle_promotions": sum(d.get("coder_lever", {}).get("wrong") is True for d in self.days),
                "coder_ope_days": len(coder), "coder_ope_within_5pct": coder_within,
                "coder_ope_within_5pct_share": coder_within / len(coder) if coder else None}

    def to_dict(self) -> dict:
        return {"config": self.config, "world": self.world, "days": self.days, "goals": self.goals(),
                "sage_bench": self.sage_bench, "seconds": round(self.seconds, 1)}


def day_tasks(world: ModelWorld, day: int, n: int, seed: int) -> list[str]:
    """The tasks of ``day``: a seeded draw from the pool (without replacement while the pool lasts)."""
    rng = np.random.default_rng([seed, day])
    ids = [t.task_id for t in world.tasks]
    pick = rng.permutation(len(ids))
    return [ids[pick[i % len(ids)]] for i in range(n)]


def _runs_for_truth(day_runs: list[dict]) -> list[dict]:
    """The runs whose value the world can give: SAGE reached the coder and logged the complexity."""
    return [r for r in day_runs if r.get("coder_model") and r.get("complexity") is not None]


def _closure(v: float, v_yaml: float, v_best: float) -> float | None:
    gap = v_best - v_yaml
    return None if gap <= 1e-9 else (v - v_yaml) / gap


def _read_gate(data_root: Path) -> dict:
    report = json.loads((data_root / "reports" / "offline_eval.json").read_text(encoding="utf-8"))
    binary = report.get("sage_binary")
    if binary is None:
        return {"evaluated": False}
    return {"evaluated": True, "gate": binary["gate"], "summary": binary["summary"],
            "sessions": binary.get("sessions"), "support_by_role": binary.get("support_by_role"),
            "judged_on": (report.get("objective") or {}).get("judged_on", "reward_v1")}


def _report_sessions(data_root: Path) -> set[str]:
    """The sessions of the eval split's report part: the episodes the gate's estimates are on."""
    from sage_pipeline.routing import routing_dataset as rd

    df = rd.read_routing_dataset(data_root / "routing" / rd.PARQUET_NAME)
    return set(oe.eval_part(df, "report")["session_id"].astype(str))


def run_loop(install: SageInstall, root: str | Path, chain: Chain, config: LoopConfig | None = None,
             world: ModelWorld | None = None, progress: Callable[[str], None] = log.info) -> LoopReport:
    """Run the loop into ``root`` (a fresh folder): ``root/days/day-NN`` SAGE's workspaces and runs,
    ``root/data`` the offline chain's artifact root, ``root/sage_loop.json`` the report (rewritten
    after every day), ``root/truth/day-NN.jsonl`` the world's records of each day's calls."""
    cfg = config or LoopConfig()
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: the loop starts from fresh SAGE workspaces; pick a new folder")
    data, t0 = root / "data", time.perf_counter()
    data.mkdir(parents=True)
    world = world or build_world(install.models_yaml, n_tasks=cfg.pool, task_seed=cfg.seed, config=cfg.world,
                                 workers=cfg.harness.workers, progress=progress)
    yaml = T.SagePolicy(world.table)
    shipped = world.table  # SAGE's table as shipped; `table` is the models.yaml SAGE runs (the coder lever pins it)
    table = shipped
    coder_models = tuple(dict.fromkeys((shipped.routes["coder"].primary, shipped.routes["coder"].fallback)))
    report = LoopReport(cfg.model_dump(), world_info(world))
    log_dirs: list[Path] = []
    progress(f"sage loop: {cfg.days} days x {cfg.tasks_per_day} tasks, SAGE {install.cli}")
    if cfg.start == "explore":
        chain(data, None, cfg.exploration_rate)  # the exploring checkpoint around SAGE's YAML
    all_runs: list[dict] = []
    ledger_mode = cfg.learn_coder and cfg.coder_decisions == "ledger"
    with WorldServer(world) as server:
        for day in range(1, cfg.days + 1):
            ckpt = data / "checkpoints" / "sage"
            deployed = (ckpt / sage_router.JOBLIB_NAME).is_file()
            dep = sage_explore.record_deployment(data, ckpt if deployed else None)
            policy = (T.SagePolicy.load(table, dep.path, dep.min_confidence, name=_deployed_name(ckpt))
                      if deployed else T.SagePolicy(table))
            run_env, coder_plan = None, None
            if ledger_mode:  # the ledger's plan: the incumbent table, and each run's own drawn models.yaml
                table, coder_plan, run_env = coder_day(data, root / "days" / f"day-{day:02d}", shipped, coder_models,
                                                       day, cfg)
                policy = (T.SagePolicy.load(table, dep.path, dep.min_confidence, name=_deployed_name(ckpt))
                          if deployed else T.SagePolicy(table))
            models_yaml = None
            if table is not shipped:  # the bundle's models.yaml: SAGE reads it through SAGE_MODELS_YAML
                models_yaml = table.write(root / "bundles" / f"day-{day:02d}" / "models.yaml",
                                          header=f"the loop's bundle for day {day}: the coder pinned by its lever")
            progress(f"day {day}: SAGE runs {policy.name}, coder {_coder_of(table)}"
                     + (f"; coder arms {_arms_line(coder_plan)}" if coder_plan else ""))
            res = run_day(world, server.url, install, day, day_tasks(world, day, cfg.tasks_per_day, cfg.seed),
                          root / "days" / f"day-{day:02d}", cfg.harness, dep.path if deployed else None,
                          dep.min_confidence, progress, models_yaml=models_yaml, run_env=run_env)
            write_truth([t for t in world.truth if str(t.get("run", "")).startswith(f"d{day:02d}-")],
                        root / "truth" / f"day-{day:02d}.jsonl")
            runs = [r.to_dict() for r in res.runs]
            artifacts.write_text(res.root / "runs.jsonl", "".join(json.dumps(r) + "\n" for r in runs))
            all_runs += runs
            log_dirs += res.sessions_dirs
            valued = _runs_for_truth(runs)
            v_dep, v_yaml = T.policy_value(world, valued, policy), T.policy_value(world, valued, yaml)
            _, v_best = T.best_expressible(world, valued, by_complexity=False)
            entry = {"day": day, "deployed": policy.name, "deployed_sha256": dep.sha256,
                     "runs": res.summary(), "runs_valued": len(valued),
                     "true_value": {"deployed": vars(v_dep), "yaml": vars(v_yaml), "best_expressible": vars(v_best)},
                     "gap_closed": _closure(v_dep.ret, v_yaml.ret, v_best.ret),
                     "bundle": bundle_truth(world, valued, policy, shipped, coder_models, cfg.objective)}
            chain_meta = chain(data, list(log_dirs), cfg.exploration_rate)
            entry["chain"] = chain_meta
            entry["truth_check"] = truth_check(world, data, valued, policy)
            entry.update(_judge(world, data, all_runs, T.SagePolicy(table), cfg.objective))
            if cfg.sage_phase5:
                tools = phase5.run_tools(install.python, list(log_dirs), root / "phase5" / f"day-{day:02d}",
                                         models_yaml=models_yaml, progress=progress)
                cand = (entry.get("candidates") or {}).get(entry.get("candidate") or "")
                entry["sage_phase5"] = phase5.judge(world, table, valued, tools, cfg.objective,
                                                    project_estimate={"candidate": entry["candidate"], **cand}
                                                    if cand else None, behaviour=policy)
            if ledger_mode:
                entry["coder_lever"] = coder_night_ledger(world, data, root, all_runs, shipped, coder_models, policy,
                                                          day, cfg, coder_plan)
            elif cfg.learn_coder:
                lever = coder_night(world, data, all_runs, table, policy, cfg)
                entry["coder_lever"] = lever
                if lever.get("promoted"):
                    table = pin(table, "coder", lever["model"])
            report.days.append(entry)
            report.seconds = time.perf_counter() - t0
            artifacts.write_json(root / REPORT_NAME, report.to_dict())
            b = entry["bundle"]
            progress(f"day {day}: {res.finished}/{len(res.runs)} runs finished; {cfg.objective.name}: deployed "
                     f"{b['deployed']['objective']:.4f} (SAGE shipped {b['shipped']['objective']:.4f}, best bundle "
                     f"{b['best']['objective']:.4f}, gap closed {b['gap_closed']}); gate: "
                     f"{entry.get('promoted') or 'nothing promoted'}; coder lever: "
                     f"{entry.get('coder_lever', {}).get('reason', 'off')}")
        if cfg.sage_bench:
            report.sage_bench = _sage_bench(world, server.url, install, root, data, valued, yaml, progress)
            report.seconds = time.perf_counter() - t0
            artifacts.write_json(root / REPORT_NAME, report.to_dict())
    return report


def _coder_of(table: RoutingTable) -> str:
    r = table.routes["coder"]
    return r.primary if r.primary == r.fallback else f"{r.primary} / {r.fallback} (SAGE's bandit)"


def _truth_runs(runs: list[dict]) -> list[dict]:
    return [{"task_id": r["task_id"], "complexity": r["complexity"], "worker": r.get("worker", 0),
             "tests_at_start": r.get("tests_at_start", False)} for r in runs]


def bundle_truth(world: ModelWorld, runs: list[dict], deployed: T.SagePolicy, shipped: RoutingTable,
                 coder_models: tuple[str, ...], objective: TaskObjective) -> dict:
    """Under the objective, on ``runs`` (exact; the coder's bandit drawn where the table leaves it two
    models): the deployed bundle, SAGE's shipped configuration (its table, its YAML router, fresh
    workspaces), the best bundle SAGE can run (:func:`truth.best_bundle`), the share of the gap between the
    shipped and the best that the deployed closes. (The front of verified share against GPU-seconds,
    :func:`truth.front`, is not computed here: five prices x two coder models, ten more exact searches.)"""
    if not runs:
        return {"runs": 0}
    tr = _truth_runs(runs)
    dep = T.bundle_value(world, tr, T.BundleSpec(deployed, None, "deployed"), objective, draws=32)
    ship = T.bundle_value(world, tr, T.BundleSpec(T.SagePolicy(shipped), None, "SAGE shipped"), objective, draws=32)
    _, best, cands = T.best_bundle(world, tr, objective, coder_models)
    return {"runs": len(tr), "deployed": dep.as_dict(), "shipped": ship.as_dict(), "best": best.as_dict(),
            "candidates": [c.as_dict() for c in cands],
            "gap_closed": _closure(dep.objective, ship.objective, best.objective)}


def coder_night(world: ModelWorld, data: Path, all_runs: list[dict], table: RoutingTable, deployed: T.SagePolicy,
                cfg: LoopConfig) -> dict:
    """The ``bootstrap`` coder lever (valid for one night only) after a night's chain: its decision from the
    routing dataset and the task outcomes (:mod:`sage_pipeline.rl.coder_lever`), the estimate of the bundle it
    would deploy beside that bundle's exact value on every run so far, and whether a promotion was wrong (the
    new bundle truly below the deployed one on those runs)."""
    import pandas as pd

    from sage_pipeline.routing import routing_dataset as rd, task_outcomes as to

    out_path = data / "routing" / to.TASK_OUTCOMES_NAME
    if not out_path.is_file():
        return {"promoted": False, "reason": "no task outcomes: the chain wrote no routing/task_outcomes.parquet"}
    ds = rd.read_routing_dataset(data / "routing" / rd.PARQUET_NAME,
                                 ["role", "model", "session_id", "task_id", "episode_id", "step", "source_line"])
    tasks, unjoined = coder_lever.coder_tasks(ds, pd.read_parquet(out_path))
    r = table.routes["coder"]
    d = coder_lever.decide(tasks, cfg.objective, cfg.coder, r.primary if r.primary == r.fallback else None)
    out = {"promoted": d.promote, "model": d.model, "reason": d.reason, "per_model": d.per_model,
           "differences": d.differences, "tasks": d.tasks, "unjoined": unjoined}
    runs = _truth_runs(_runs_for_truth(all_runs))
    # the bundle the lever leads with (promoted or not): its estimate beside its exact value on every run so far
    lead = d.model or (max(d.per_model, key=lambda m: d.per_model[m]["objective"]) if d.per_model else None)
    if lead is None or not runs:
        return out
    cand = T.BundleSpec(T.SagePolicy(pin(table, "coder", lead), deployed.models, deployed.min_confidence),
                        None, f"coder {lead}")
    true = T.bundle_value(world, runs, cand, cfg.objective).objective
    logged = d.per_model.get(lead)  # none: the logs never saw the coder on it, so no estimate
    est = None if logged is None else logged["objective"]
    out.update(lead=lead, estimate=est, interval=None if logged is None else logged["ci"], true_value=true,
               ope_error=abs(est - true) / abs(true) if true and est is not None else None)
    if d.promote:
        now = T.bundle_value(world, runs, T.BundleSpec(deployed, None, "deployed"), cfg.objective, draws=32)
        out.update(true_value_deployed=now.objective, wrong=bool(true < now.objective - 2 * now.objective_se))
    return out


# ------------------------------------------------------------------------------------- the ledger's coder lever
def _coder_paths(data: Path) -> tuple[Path, Path]:
    ledger = data / "decisions" / LEDGER_NAME
    return ledger, coder_ledger.lever_dir(ledger)


def _arms_line(plan: assign.Plan) -> str:
    return ", ".join(f"{a.name} {a.probability:.2f}" for a in plan.levers[coder_ledger.LEVER])


def coder_day(data: Path, day_root: Path, shipped: RoutingTable, models: tuple[str, ...], day: int,
              cfg: LoopConfig) -> tuple[RoutingTable, assign.Plan | None, Callable[[str, str], dict] | None]:
    """Before day ``day``: the ledger's coder plan (the first round opened before day 1), the incumbent table
    (the accepted pin, else SAGE's shipped table) and the harness's ``run_env``: each run's recorded draw into
    ``day_root/assignments.jsonl`` (written by run_day, once its fresh folder exists), its arm's models.yaml
    and ``SAGE_TRACE_ID``. The draws are seeded by (seed, day): the loop reproduces; their probabilities are
    the plan's exact thresholds either way."""
    path, folder = _coder_paths(data)
    led = Ledger.load(path)
    if len(models) != 2:
        return shipped, None, None  # the coder's row names one model: nothing to compare
    if not led.of(coder_ledger.LEVER):  # the first round, before day 1
        coder_ledger.open_round(led, models, f"day-{day - 1:02d}")
        coder_ledger.save_merged(led, path)
    pins = coder_ledger.write_pins(shipped, folder / coder_ledger.PINS_DIR, models)
    plan = coder_ledger.plan(led, pins, cfg.coder_decisions_config(), note=f"the loop's coder arms for day {day}")
    p = coder_ledger.pinned(led)
    table = pin(shipped, "coder", coder_ledger.model_of(p)) if p is not None else shipped
    if plan is None:
        return table, None, None
    coder_ledger.save_plan(folder, plan)
    rng = np.random.default_rng([cfg.seed, day, 47])

    def run_env(run: str, task_id: str) -> dict:
        return coder_ledger.draw(plan, rng, run, day_root)[2]

    return table, plan, run_env


def coder_night_ledger(world: ModelWorld, data: Path, root: Path, all_runs: list[dict], shipped: RoutingTable,
                       models: tuple[str, ...], deployed: T.SagePolicy, day: int, cfg: LoopConfig,
                       plan: assign.Plan | None) -> dict:
    """The ledger's coder lever after a night's chain (see the module doc): every run so far joined to its draw,
    the randomised ones added as evidence (each once: the ledger refuses a unit counted twice), the decision,
    a new round when due, the ledger saved; the report's row: each candidate's state, estimate and interval
    (rescaled task_v1 and task_v1), the exact gap between the two pinned tables on every run so far, the
    runs left out by reason (a run SAGE's bandit chose is not evidence) and the next day's arms."""
    import pandas as pd

    from sage_pipeline.routing import routing_dataset as rd, task_outcomes as to

    night = f"day-{day:02d}"
    path, folder = _coder_paths(data)
    led = Ledger.load(path)
    out_path, traj = data / "routing" / to.TASK_OUTCOMES_NAME, data / "routing" / "trajectories.parquet"
    if len(models) != 2 or not out_path.is_file():
        return {"mode": "ledger", "promoted": False, "reason": "no task outcomes (or one coder model): nothing to add"}
    ds = rd.read_routing_dataset(data / "routing" / rd.PARQUET_NAME,
                                 ["role", "model", "session_id", "task_id", "episode_id", "step", "source_line"])
    logged = coder_lever.traces_by_session(pd.read_parquet(traj, columns=["session_id", "trace_id"])
                                           if traj.is_file() else pd.DataFrame())
    by_harness = {s: r["trace_id"] for r in all_runs if r.get("trace_id") for s in r.get("sessions", ())}
    traces = {**by_harness, **logged}  # SAGE's own trace_id first; the harness's record of the run's sessions else
    runs = coder_lever.ledger_runs(ds, pd.read_parquet(out_path), cfg.objective, traces)
    draws, bad = {}, []
    plans, bad_plans = coder_ledger.load_plans(folder)
    for d in range(1, day + 1):  # in the order recorded: day by day, each day's runs in run order
        got, problems = assign.read_records(root / "days" / f"day-{d:02d}" / assign.RECORDS_NAME, plans)
        draws.update(got)
        bad += problems
    added = coder_ledger.add_runs(led, runs, draws, plans, cfg.coder_decisions_config())
    moves = coder_ledger.decide_night(led, night, models, cfg=cfg.coder_decisions_config())
    coder_ledger.save_merged(led, path)
    scale = 1.0 + cfg.coder_decisions_config().cost_max  # a gain in y times this is the gain in task_v1
    rows = []
    for c in led.of(coder_ledger.LEVER):
        r = coder_ledger.row(led, c)
        r["estimate_task_v1"] = None if r["estimate"] is None else r["estimate"] * scale
        rows.append(r)
    p = coder_ledger.pinned(led)
    accepted = [m for m in moves if m["to"] == "accepted"]
    sessions = {r.session_id for r in runs}
    out = {"mode": "ledger", "night": night, "promoted": bool(accepted),
           "model": coder_ledger.model_of(p) if p is not None else None,
           "reverted": [m["id"] for m in moves if m["to"] == "reverted"],
           "reason": "; ".join(f"{m['id']} {m['to']}: {m['reason']}" for m in moves) or "no change tonight",
           "transitions": moves, "candidates": rows, "evidence": added,
           "joined_by": {"sage_trace_id": sum(s in logged for s in sessions),
                         "harness_sessions": sum(s in by_harness and s not in logged for s in sessions)},
           "records_problems": (bad + bad_plans)[:20], "arms_today": None if plan is None else _arms_line(plan),
           "guarantee": coder_ledger.guarantee(led, cfg.coder_decisions_config())}
    truth_runs = _truth_runs(_runs_for_truth(all_runs))
    if truth_runs:  # the world's exact value of each pinned table on every run so far: the gap the ledger estimates
        def pinned_to(m: str) -> T.BundleSpec:
            pol = T.SagePolicy(pin(shipped, "coder", m), deployed.models, deployed.min_confidence)
            return T.BundleSpec(pol, None, m)

        vals = {m: T.bundle_value(world, truth_runs, pinned_to(m), cfg.objective).objective for m in models}
        out["true_value"] = vals
        out["true_gap"] = {f"{a} - {b}": vals[a] - vals[b] for a in models for b in models if a != b}
        if accepted:
            m = accepted[0]
            mod = coder_ledger.model_of(led.get(m["id"]))
            other = next(x for x in models if x != mod)
            out["wrong"] = bool(vals[mod] < vals[other])
    return out


def truth_check(world: ModelWorld, data: Path, runs: list[dict], policy: T.SagePolicy) -> dict:
    """The world's exact expected return of each run (under the policy SAGE ran) against what the
    routing dataset made of SAGE's journals for that run (its decisions' reward_v1, summed): the
    truth's model of SAGE's control flow, checked against SAGE itself. Agreement means the mean
    realized return lies within its 95% interval of the mean expected one."""
    from sage_pipeline.routing import routing_dataset as rd

    df = rd.read_routing_dataset(data / "routing" / rd.PARQUET_NAME, ["session_id", "reward", "reward_version"])
    versions = set(df["reward_version"].astype(str))
    if versions != {"reward_v1"}:
        return {"runs": 0, "why": f"the dataset's reward is {sorted(versions)}; the world's truth is reward_v1's"}
    by_session = df.groupby(df["session_id"].astype(str))["reward"].sum()
    if not runs:
        return {"runs": 0}
    x = np.array([float(sum(by_session.get(s, 0.0) for s in r["sessions"])) for r in runs])
    e = T.run_values(world, runs, policy)[:, 0]  # each run's expected return, all runs at once
    half = 1.96 * float((x - e).std(ddof=1)) / math.sqrt(len(x)) if len(x) > 1 else float("nan")
    diff = float((x - e).mean())
    return {"runs": len(x), "realized_mean": float(x.mean()), "expected_mean": float(e.mean()),
            "difference": diff, "difference_ci": [diff - half, diff + half],
            "agrees": bool(abs(diff) <= half) if not math.isnan(half) else None}


def _sage_bench(world: ModelWorld, url: str, install: SageInstall, root: Path, data: Path, last_runs: list[dict],
                yaml: T.SagePolicy, progress: Callable[[str], None]) -> dict:
    """SAGE's `sage bench --compare-policy` with the last promoted checkpoint (else the last deployed
    one), beside the world's exact difference for it on the bench's tasks and on the last day's runs."""
    from sage_pipeline.sage_world.bench import run_sage_bench

    promoted = data / "checkpoints" / "promoted_sage"
    ck = promoted if (promoted / sage_router.JOBLIB_NAME).is_file() else data / "checkpoints" / "sage"
    floor = float(sage_router.read_manifest(ck)["min_confidence"])
    world.config = world.config.model_copy(update={"adopt_unmarked": True})
    try:
        rep = run_sage_bench(world, url, install, root / "sage_bench", ck, floor, progress=progress)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
        rep = {"error": str(exc)}
    pol = T.SagePolicy.load(world.table, ck, floor)
    a, b = T.policy_value(world, last_runs, yaml), T.policy_value(world, last_runs, pol)
    rep.update(checkpoint=str(ck), checkpoint_kind=sage_router.read_manifest(ck).get("kind"),
               true_delta_last_day={"p_verified": b.p_verified - a.p_verified, "return": b.ret - a.ret,
                                    "runs": len(last_runs)})
    return rep


def _deployed_name(ckpt: Path) -> str:
    m = sage_router.read_manifest(ckpt)
    kind = m.get("kind", "")
    return f"{kind} around {m.get('policy') or m.get('source') or 'the YAML'}"


def _judge(world: ModelWorld, data: Path, all_runs: list[dict], yaml: T.SagePolicy,
           objective: TaskObjective | None = None) -> dict:
    """The gate's decision after a day, each candidate's OPE estimate beside its true value on the
    report episodes (under what offline_eval judged: the task objective, or reward_v1's return where it
    said it fell back to it), and whether the gate was right."""
    gate = _read_gate(data)
    if not gate["evaluated"]:
        return {"gate": "sage_binary not evaluated", "promoted": None}
    g = gate["gate"]
    judged_on = gate.get("judged_on", "reward_v1")
    objective = objective or TaskObjective()

    def value(policy: T.SagePolicy) -> float:
        if not report_runs:  # no report episode joined a run: nothing to value (as reward_v1's empty mean)
            return float("nan")
        v = T.policy_value(world, report_runs, policy)
        return v.ret if judged_on == "reward_v1" else v.objective(objective)

    sessions = _report_sessions(data)
    report_runs = _runs_for_truth([r for r in all_runs if set(r["sessions"]) & sessions])
    cands = {}
    base = data / "checkpoints" / "gate" / oe.CANDIDATES_DIR
    v_yaml = value(yaml)
    for row in gate["summary"]:
        name = row["policy"]
        est = {"estimator": HEADLINE, "estimate": row.get(HEADLINE), "ci_low": row.get("ci_low"),
               "ci_high": row.get("ci_high"), "no_support": row.get("no_support")}
        if name == "static_table":
            true = v_yaml
        elif (base / name / sage_router.JOBLIB_NAME).is_file():
            true = value(T.SagePolicy.load(yaml.table, base / name))
        else:
            true = None  # a trained network, not what SAGE serves
        err = (abs(est["estimate"] - true) / abs(true) if true not in (None, 0) and est.get("estimate") is not None
               and not math.isnan(est["estimate"]) else None)
        cands[name] = {**est, "true_value": true, "relative_error": err}
    promoted = g.get("promoted")
    served = {k: v for k, v in cands.items() if k.endswith("_served")}
    ranked = [k for k, v in served.items() if v.get("estimate") is not None and not math.isnan(v["estimate"])]
    pick = promoted or (max(ranked, key=lambda k: served[k]["estimate"]) if ranked else None)  # the gate's best
    head = cands.get(pick) if pick else None
    best_true_gain = max((c["true_value"] - v_yaml for c in served.values() if c["true_value"] is not None),
                         default=None)
    if promoted:
        right = cands[promoted]["true_value"] is not None and cands[promoted]["true_value"] >= v_yaml
    else:  # a refusal is wrong only when a candidate truly beat the table
        right = best_true_gain is None or best_true_gain <= 0
    return {"promoted": promoted, "gate_reason": g.get("reason"), "gate_right": bool(right), "judged_on": judged_on,
            "report_episodes": len(report_runs), "candidates": cands,
            "candidate": pick,
            "candidate_ope_error": head["relative_error"] if head else None,
            "best_candidate_true_gain": best_true_gain}


def _f(x, nd: int = 4):
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), nd)


def _coder_columns(lever: dict) -> dict:
    """The coder lever's estimate beside its truth: the bootstrap's leading model's objective and its exact value,
    or (ledger mode) the leading candidate's estimated gain in task_v1 beside the world's exact gap."""
    if lever.get("mode") != "ledger":
        return {"coder OPE": _f(lever.get("estimate")), "coder true": _f(lever.get("true_value")),
                "coder OPE error": _f(lever.get("ope_error"), 3)}
    rows = [r for r in lever.get("candidates", []) if r.get("estimate_task_v1") is not None]
    lead = max(rows, key=lambda r: r["estimate_task_v1"], default=None)
    gap = None
    if lead is not None:
        m = str(lead.get("model") or "")
        gap = next((v for k, v in (lever.get("true_gap") or {}).items() if k.startswith(f"{m} - ")), None)
    est = None if lead is None else lead["estimate_task_v1"]
    return {"coder OPE": _f(est), "coder true": _f(gap),
            "coder OPE error": _f(abs(est - gap), 3) if est is not None and gap is not None else None}


def day_row(d: dict) -> dict:
    """One day as a flat table row (the asset's metadata, the benchmark's print, docs/benchmarks.md)."""
    tv = d["true_value"]
    c = (d.get("candidates") or {}).get(d.get("candidate") or "", {})
    ci = (f"[{_f(c.get('ci_low'))}, {_f(c.get('ci_high'))}]" if c.get("ci_low") is not None else "none")
    b, lever = d.get("bundle", {}), d.get("coder_lever", {})
    return {"day": d["day"], "deployed": d["deployed"], "runs": d["runs"]["runs"], "finished": d["runs"]["finished"],
            "objective deployed": _f(b.get("deployed", {}).get("objective")),
            "objective shipped": _f(b.get("shipped", {}).get("objective")),
            "objective best": _f(b.get("best", {}).get("objective")),
            "verified deployed/shipped/best": "/".join(str(_f(b.get(k, {}).get("p_verified"), 3))
                                                       for k in ("deployed", "shipped", "best")),
            "GPU-s deployed/shipped/best": "/".join(str(_f(b.get(k, {}).get("gpu_seconds"), 2))
                                                    for k in ("deployed", "shipped", "best")),
            "objective gap closed": _f(b.get("gap_closed"), 2),
            "coder lever": (f"pin {lever.get('model')}" if lever.get("promoted") else
                            (f"ledger: pinned {lever['model']}" if lever.get("model") else "ledger: no pin")
                            if lever.get("mode") == "ledger" else "keep") if lever else "off",
            **_coder_columns(lever),
            "failures": sum(d["runs"]["failures"].values()), "V deployed": _f(tv["deployed"]["ret"]),
            "V yaml": _f(tv["yaml"]["ret"]), "V best": _f(tv["best_expressible"]["ret"]),
            "verified deployed": _f(tv["deployed"]["p_verified"]), "gap closed": _f(d.get("gap_closed"), 2),
            "candidate": d.get("candidate"), "OPE": _f(c.get("estimate")), "OPE 95% CI": ci,
            "true": _f(c.get("true_value")), "OPE error": _f(d.get("candidate_ope_error"), 3),
            "promoted": d.get("promoted") or "none", "gate right": d.get("gate_right"),
            "judged on": d.get("judged_on"),
            **(phase5.summary_row(d["sage_phase5"]) if "sage_phase5" in d else {})}
