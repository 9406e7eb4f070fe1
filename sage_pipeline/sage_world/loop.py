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
    with WorldServer(world) as server:
        for day in range(1, cfg.days + 1):
            ckpt = data / "checkpoints" / "sage"
            deployed = (ckpt / sage_router.JOBLIB_NAME).is_file()
            dep = sage_explore.record_deployment(data, ckpt if deployed else None)
            policy = (T.SagePolicy.load(table, dep.path, dep.min_confidence, name=_deployed_name(ckpt))
                      if deployed else T.SagePolicy(table))
            models_yaml = None
            if table is not shipped:  # the bundle's models.yaml: SAGE reads it through SAGE_MODELS_YAML
                models_yaml = table.write(root / "bundles" / f"day-{day:02d}" / "models.yaml",
                                          header=f"the loop's bundle for day {day}: the coder pinned by its lever")
            progress(f"day {day}: SAGE runs {policy.name}, coder {_coder_of(table)}")
            res = run_day(world, server.url, install, day, day_tasks(world, day, cfg.tasks_per_day, cfg.seed),
                          root / "days" / f"day-{day:02d}", cfg.harness, dep.path if deployed else None,
                          dep.min_confidence, progress, models_yaml=models_yaml)
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
            if cfg.learn_coder:
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
    """The coder lever after a night's chain: its decision from the routing dataset and the task outcomes
    (:mod:`sage_pipeline.rl.coder_lever`), the estimate of the bundle it would deploy beside that bundle's
    exact value on every run so far, and whether a promotion was wrong (the new bundle truly below the
    deployed one on those runs)."""
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
            "coder lever": (f"pin {lever.get('model')}" if lever.get("promoted") else "keep") if lever else "off",
            "coder OPE": _f(lever.get("estimate")), "coder true": _f(lever.get("true_value")),
            "coder OPE error": _f(lever.get("ope_error"), 3),
            "failures": sum(d["runs"]["failures"].values()), "V deployed": _f(tv["deployed"]["ret"]),
            "V yaml": _f(tv["yaml"]["ret"]), "V best": _f(tv["best_expressible"]["ret"]),
            "verified deployed": _f(tv["deployed"]["p_verified"]), "gap closed": _f(d.get("gap_closed"), 2),
            "candidate": d.get("candidate"), "OPE": _f(c.get("estimate")), "OPE 95% CI": ci,
            "true": _f(c.get("true_value")), "OPE error": _f(d.get("candidate_ope_error"), 3),
            "promoted": d.get("promoted") or "none", "gate right": d.get("gate_right"),
            "judged on": d.get("judged_on"),
            **(phase5.summary_row(d["sage_phase5"]) if "sage_phase5" in d else {})}
