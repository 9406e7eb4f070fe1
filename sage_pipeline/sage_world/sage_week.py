"""Days of SAGE's own work in the model world, as ``make run``'s default data is made of them: SAGE's unchanged
``sage run`` (:func:`~sage_pipeline.sage_world.harness.run_day`), the router exploring around SAGE's YAML and
the coder randomised between its row's two models, every decision's probability recorded, and the world's
exact truth of the bundles the summary can name.

What SAGE runs each day (the loop's defaults on its first day, :class:`~sage_pipeline.sage_world.loop.LoopConfig`,
held fixed over the days: no night's decision moves the behaviour, so every day's logs are one policy's):

* **the router**: the exploring checkpoint around SAGE's YAML (``sage.explore``, the loop's
  ``exploration_rate``, its floor :data:`~sage_pipeline.sage.explore.EXPLORE_FLOOR` from the manifest), recorded
  with ``explore.record_deployment`` before each day, so each logged ``MODEL_ROUTING_DECISION``'s probability is
  reconstructed exactly;
* **the coder**: the decision ledger's first round (``decisions.coder``: two candidates, "pin coder to A/B",
  pending), so each ``sage run`` draws its models.yaml 50/50 between the coder's row pinned to either model,
  recorded in ``assignments.jsonl`` before the run starts (``loop.coder_day``; ``harness.run_day(run_env=...)``),
  and runs with it through ``SAGE_MODELS_YAML``; SAGE's bandit then has one model to choose, so the coder's
  model is randomised at a known 1/2.

The truth (:func:`truth_of`): under the objective (``task_v1``), on each day's runs and on all of them, the world's
exact value of every bundle ``coder x router``: the coder as shipped (SAGE's table and its UCB bandit from a fresh
workspace: the mean over 32 drawn bandit paths, with its standard error) or pinned to each model of its row, the
router SAGE's YAML or the exploring checkpoint. It is the model world's truth (its calibrated rates), not a
measurement of anyone's SAGE.

This module runs days; packing them into the shipped archive is ``scripts/make_sage_week.py``'s, reading them
back is :mod:`sage_pipeline.sage.week`'s.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage import checkpoint as sage_router, explore as sage_explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable, pin
from sage_pipeline.sage_world import loop as sl, truth as T
from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, goal, run_day
from sage_pipeline.sage_world.server import WorldServer
from sage_pipeline.sage_world.world import ModelWorld, WorldConfig, build_world, world_info, write_truth
from sage_pipeline.sim.families import FAMILIES

log = logging.getLogger(__name__)
SHIPPED = "shipped"  # the coder as SAGE ships it: its table's row and its UCB bandit
ROUTERS = ("yaml", "explore")


class WeekConfig(BaseModel):
    """The days SAGE works (each default declared here once; the loop's where it has one)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    days: int = Field(5, ge=1, le=60, description="days of SAGE's work, each in fresh workspaces")
    runs_per_day: int = Field(40, ge=1, description="`sage run`s a day")
    pool: int = Field(sl.LoopConfig().pool, ge=len(FAMILIES),
                      description="generated tasks the days draw from (loop.day_tasks)")
    seed: int = Field(sl.LoopConfig().seed, description="the world's and the task draws' seed")
    exploration_rate: float = Field(sl.LoopConfig().exploration_rate, ge=0.0, le=sage_explore.MAX_RATE,
                                    description="the exploring checkpoint's P(the model SAGE's YAML does not choose)")
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    world: WorldConfig = Field(default_factory=WorldConfig)
    objective: TaskObjective = Field(default_factory=TaskObjective)
    truth_draws: int = Field(32, ge=2, description="drawn bandit paths for the coder as shipped (its value's se)")


@dataclass
class DaysResult:
    """What :func:`run_days` did: each day's run folder (``run_day``'s root), its runs, the deployments."""

    root: Path
    # {"day", "folder", "runs": [RunResult dicts], "summary", "goals": the goal ledger's entries (the exact goal each
    # `sage run` was given, by SAGE session id: SAGE logs no goal, the harvest reads it from such a ledger)}
    days: list[dict] = field(default_factory=list)
    checkpoint: Path | None = None
    deployments: list[dict] = field(default_factory=list)  # one closed window per day
    truth: dict = field(default_factory=dict)
    world: dict = field(default_factory=dict)
    coder_models: tuple[str, ...] = ()
    seconds: float = 0.0

    @property
    def sessions_dirs(self) -> list[Path]:
        return sorted(p for d in self.days for p in Path(d["folder"]).glob("ws-*/memory/sessions") if p.is_dir())


def exploring_checkpoint(table: RoutingTable, models_yaml: Path, folder: Path, rate: float) -> Path:
    """The exploring checkpoint around SAGE's YAML at ``rate`` (what the loop deploys on its first day),
    written for the table SAGE runs; returns its folder."""
    served = sage_explore.build_exploring(table, ActionSpace.build(table).binary(),
                                          sage_explore.ExploreConfig(rate=rate), table=table)
    sage_router.write_sage_checkpoint(folder, served, {"source": f"SAGE's YAML ({table.source})"},
                                      sage_table=models_yaml)
    return folder


def run_days(install: SageInstall, root: str | os.PathLike[str], config: WeekConfig | None = None,
             first_day: int = 1, world: ModelWorld | None = None,
             progress: Callable[[str], None] = log.info) -> DaysResult:
    """SAGE's ``sage run`` for ``config.days`` days from ``first_day`` into ``root`` (a fresh folder):
    ``root/day-NN`` each day's ``run_day`` folder (SAGE's workspaces ``ws-*``), ``root/data`` the scratch artifact
    root (the deployments record, the ledger's first coder round, the checkpoint), ``root/truth`` the world's
    records of each day's calls. See the module doc for what SAGE runs."""
    cfg = config or WeekConfig()
    root = Path(root)
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: SAGE's days start from fresh workspaces; pick a new folder")
    data, t0 = root / "data", time.perf_counter()
    data.mkdir(parents=True)
    world = world or build_world(install.models_yaml, n_tasks=cfg.pool, task_seed=cfg.seed, config=cfg.world,
                                 workers=cfg.harness.workers, progress=progress)
    shipped = world.table
    coder = shipped.routes["coder"]
    models = tuple(dict.fromkeys((coder.primary, coder.fallback)))
    ckpt = exploring_checkpoint(shipped, install.models_yaml, data / "checkpoints" / "sage", cfg.exploration_rate)
    loop_cfg = sl.LoopConfig(days=cfg.days, tasks_per_day=cfg.runs_per_day, pool=cfg.pool, seed=cfg.seed,
                             exploration_rate=cfg.exploration_rate, harness=cfg.harness, world=cfg.world,
                             objective=cfg.objective)
    out = DaysResult(root, checkpoint=ckpt, world=world_info(world), coder_models=models)
    with WorldServer(world) as server:
        for day in range(first_day, first_day + cfg.days):
            folder = root / f"day-{day:02d}"
            dep = sage_explore.record_deployment(data, ckpt)
            table, plan, run_env = sl.coder_day(data, folder, shipped, models, day, loop_cfg)
            arms = "SAGE's table and its bandit" if plan is None else sl._arms_line(plan)
            progress(f"sage week: day {day}: {cfg.runs_per_day} runs, router exploring around SAGE's YAML at "
                     f"{cfg.exploration_rate:g}, coder arms {arms}")
            res = run_day(world, server.url, install, day, sl.day_tasks(world, day, cfg.runs_per_day, cfg.seed),
                          folder, cfg.harness, dep.path, dep.min_confidence, progress, run_env=run_env)
            out.deployments.append({**dep.to_dict(), "deployed_until": datetime.now(timezone.utc).isoformat()})
            runs = [r.to_dict() for r in res.runs]
            write_truth([t for t in world.truth if str(t.get("run", "")).startswith(f"d{day:02d}-")],
                           root / "truth" / f"day-{day:02d}.jsonl")
            goals = [{"session_id": sid, "goal": goal(r["run"], world.tasks[world.by_id[r["task_id"]]].prompt),
                      "run": r["run"], "task_id": r["task_id"]} for r in runs for sid in r["sessions"]]
            out.days.append({"day": day, "folder": str(folder), "runs": runs, "summary": res.summary(),
                             "goals": goals})
            progress(f"sage week: day {day}: {res.finished}/{len(res.runs)} runs finished "
                     f"({res.seconds:.0f} s), failures {res.failures or 'none'}")
    out.truth = truth_of(world, out.days, shipped, ckpt, models, cfg, progress)
    out.seconds = time.perf_counter() - t0
    return out


def valued_runs(runs: list[dict]) -> list[dict]:
    """The runs whose value the world gives (SAGE reached the coder and logged the task's complexity), as the
    truth reads them."""
    return [{"task_id": r["task_id"], "complexity": r["complexity"], "worker": r.get("worker", 0),
             "tests_at_start": r.get("tests_at_start", False)}
            for r in runs if r.get("coder_model") and r.get("complexity") is not None]


def bundles(shipped: RoutingTable, checkpoint: Path, models: tuple[str, ...]) -> dict[str, T.BundleSpec]:
    """Every bundle the truth values, by key ``coder=<shipped|model>,router=<yaml|explore>``."""
    explore = T.SagePolicy.load(shipped, checkpoint, name="exploring around SAGE's YAML")
    out = {}
    for c in (SHIPPED, *models):
        table = shipped if c == SHIPPED else pin(shipped, "coder", c)
        for r in ROUTERS:
            pol = (T.SagePolicy(table, name="SAGE's YAML") if r == "yaml"
                   else T.SagePolicy(table, explore.models, explore.min_confidence, explore.name))
            out[bundle_key(c, r)] = T.BundleSpec(pol, None, f"coder {c}, router {r}")
    return out


def bundle_key(coder: str, router: str) -> str:
    return f"coder={coder},router={router}"


def truth_of(world: ModelWorld, days: list[dict], shipped: RoutingTable, checkpoint: Path,
             models: tuple[str, ...], cfg: WeekConfig, progress: Callable[[str], None] = log.info) -> dict:
    """The world's exact value of every bundle (:func:`bundles`) under ``cfg.objective``, per day and over
    every day's runs: ``{"objective", "bundles": {key: description}, "per_day": {day: {key: value}},
    "week": {key: value}}``, each value ``truth.BundleValue.as_dict()`` (objective, p_verified, gpu_seconds,
    ..., objective_se, coder_share)."""
    specs = bundles(shipped, checkpoint, models)

    def values(runs: list[dict]) -> dict:
        return {k: T.bundle_value(world, runs, b, cfg.objective, draws=cfg.truth_draws).as_dict()
                for k, b in specs.items()} if runs else {}

    t0 = time.perf_counter()
    per_day = {f"day-{d['day']:02d}": values(valued_runs(d["runs"])) for d in days}
    every = [r for d in days for r in valued_runs(d["runs"])]
    week = values(every)
    progress(f"sage week: the world's truth of {len(specs)} bundles on {len(every)} runs "
             f"({time.perf_counter() - t0:.0f} s)")
    return {"objective": cfg.objective.describe(), "objective_config": cfg.objective.model_dump(),
            "exploration_rate": cfg.exploration_rate, "coder_models": list(models),
            "bundles": {k: b.name for k, b in specs.items()}, "runs_valued": len(every),
            "per_day": per_day, "week": week,
            "what": "the model world's exact expected value (its calibrated rates) of each bundle on these runs' "
                    "tasks, complexities and workspaces; not a measurement of a user's SAGE"}


def write_runs(path: Path, runs: list[dict], strip: Path) -> Path:
    """The harness's record of a day's runs (one JSON line each), paths under ``strip`` made relative to it."""
    def rel(v):
        if isinstance(v, str) and v.startswith(str(strip) + os.sep):
            return os.path.relpath(v, strip)
        return v

    lines = [json.dumps({k: ({a: rel(b) for a, b in v.items()} if isinstance(v, dict) else rel(v))
                         for k, v in r.items()}, sort_keys=True) for r in runs]
    return artifacts.write_text(path, "".join(ln + "\n" for ln in lines))


def write_deployments(res: DaysResult, path: Path, base: Path, checkpoint: str | None = None) -> Path:
    """The days' deployment windows as a record file (``sage.week.record_windows`` reads it): each checkpoint's
    path relative to ``base`` (``checkpoint``: that relative path instead, e.g. where the archive puts it)."""
    lines = []
    for d in res.deployments:
        rel = checkpoint if checkpoint is not None else (
            None if d["path"] is None else os.path.relpath(d["path"], base))
        lines.append(json.dumps({**d, "path": rel}))
    return artifacts.write_text(path, "".join(ln + "\n" for ln in lines))
