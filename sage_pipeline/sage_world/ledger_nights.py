"""Decisions end to end (issue 47): SAGE's unchanged ``sage run`` in the model world, night after night, the
coder's model decided by the decision ledger on runs it assigned at random, a drift injected at a stated night,
and every decision put beside the world's exact truth.

**A night** (:func:`run_night`):

1. *The world of the night.* ``WorldConfig.coder_shift`` handicaps one coder model: its chance of a right first
   file is its calibrated chance minus ``coder_gap`` (:func:`world_shift`). Before ``drift_night`` the handicap
   is on the model the calibration makes weaker (the 1.5B), from ``drift_night`` on it is on the stronger (the
   14B) and the 1.5B has its calibrated chance again: the model a correct ledger has pinned by then turns worse
   than the other. The reviewer's accuracy and the debugger's repairs keep the calibration's figures.
2. *The plan and the draws* (``loop.coder_day``: the ledger's coder lever, :mod:`sage_pipeline.decisions.coder`).
   A round pending: 50/50 between two ``models.yaml`` files that pin SAGE's coder to one model each; a pin: the
   pin at ``1 - explore_share``, the other model at ``explore_share``; neither: SAGE's table (no draw). Every
   run's draw is made before any run starts, recorded as one line of ``assignments.jsonl`` with the arm's exact
   threshold out of 2**32, and given to the run as its own environment: ``SAGE_MODELS_YAML`` (the arm's file)
   and ``SAGE_TRACE_ID`` (the draw id) through ``harness.run_day(run_env=...)``, which the launcher sets in the
   forked child (SAGE reads both at call time). SAGE's code is not changed; SAGE copies ``SAGE_TRACE_ID`` into
   every journal line.
3. *SAGE runs* ``runs_per_night`` tasks (``sage run --auto --no-clarify --fresh``), in fresh workspaces.
4. *The project's own ingest* of what SAGE wrote that night (:func:`ingest_night`): ``routing.ingest`` (the
   journals to ``trajectories.parquet`` and its side tables), the routing dataset and the task outcomes (each
   task's verdict from SAGE's gate and its GPU-seconds from the journal's clock), the same core functions the
   Dagster assets ``trajectories`` and ``routing_dataset`` call.
5. *The ledger*: each session's ``trace_id`` as SAGE logged it (never the harness's record) joins the run to its
   draw; ``coder.add_runs`` adds the randomised runs (``task_v1`` rescaled, inverse-probability weighted with
   the recorded probabilities) and ``coder.decide_night`` decides; the ledger is saved.
6. *The truth* (:func:`arm_truth`): each arm's exact value on that night's runs (the pinned table's expected
   verified share, GPU-seconds and ``task_v1`` for each run's task, complexity and workspace state, under the
   night's world: ``truth.run_values``), the exact gap, the mean of the exact per-run gaps over every run a
   candidate was judged on (what its confidence sequence covers), and whether each transition was right
   (:func:`judge`).
7. *The checks* (:func:`journal_checks`, :func:`recompute_online`): every run's journal carries the trace id its
   draw gave it; the coder's model SAGE logged is the one the arm's ``models.yaml`` pins (read from the file the
   arm names, against the model SAGE's journal shows); each candidate's evidence, recomputed from the records'
   thresholds and the journals' outcomes alone, is the ledger's to the last bit.

**One lever randomised.** Only the coder lever changes what SAGE runs here: SAGE's YAML router (no checkpoint)
and SAGE's packaged skills hold on every run, so no other lever changes on the same runs and the coder's effect
is the only contrast (``assign``'s factorial draw would identify each lever's main effect if a second were
randomised; it is not needed here).

Pure but for SAGE's runs: numpy, pandas, the ledger, the world and the harness; no dagster.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.decisions import assign, coder as coder_ledger
from sage_pipeline.decisions.coder import CoderDecisionsConfig, CoderRun
from sage_pipeline.decisions.ledger import LEDGER_NAME, Ledger
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable, pin
from sage_pipeline.sage_world import truth as T
from sage_pipeline.sage_world.harness import DayResult, HarnessConfig, SageInstall, run_day
from sage_pipeline.sage_world.world import ModelWorld, WorldConfig
from sage_pipeline.sim.families import FAMILIES

log = logging.getLogger(__name__)
REPORT_NAME = "decision_e2e.json"
# journal_checks' counts a reader looks up
DRAWN, TRACE_OK = "runs drawn", "trace: journal carries the draw's id"
MODEL_OK, NO_CODER = "model: journal's coder is the arm's pin", "model: SAGE never reached the coder"


class DecisionE2EConfig(BaseModel):
    """The end-to-end target's settings (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    nights: int = Field(10, ge=1, le=365, description="nights, each a day of SAGE's runs then the ledger's decision")
    runs_per_night: int = Field(40, ge=1, description="`sage run`s a night")
    pool: int = Field(300, ge=len(FAMILIES), description="generated tasks the nights draw from")
    seed: int = Field(0, description="the world's, the tasks' and the draws' seed")
    coder_gap: float = Field(0.65, ge=0.0, le=1.0, description="the handicapped coder model's chance of a right "
                             "first file is its calibrated chance minus this (clipped at 0). 0.65: about +0.25 in "
                             "verified share for the 14B before the drift and -0.14 after it, where the world's own "
                             "+0.06 would need ~900 runs for one pin (issue 47), more than 10 x 40")
    drift_night: int | None = Field(5, ge=1, description="the first night of the turned world: the handicap moves "
                                    "from the weaker model to the stronger (None: no drift)")
    decisions: CoderDecisionsConfig = Field(default_factory=CoderDecisionsConfig)
    objective: TaskObjective = Field(default_factory=TaskObjective)
    harness: HarnessConfig = Field(default_factory=HarnessConfig)
    world: WorldConfig = Field(default_factory=WorldConfig)


def ranked(world: ModelWorld, models: Sequence[str]) -> tuple[str, str]:
    """(weaker, stronger) of the coder's two models by their calibrated mean chance of a right first file over the
    world's tasks (the shift left out)."""
    mean = {m: float(np.mean([world.p_code(i, m) for i in range(len(world.tasks))])) for m in models}
    weak, strong = sorted(models, key=lambda m: mean[m])
    return weak, strong


def world_shift(cfg: DecisionE2EConfig, night: int, weak: str, strong: str) -> dict[str, float]:
    """``WorldConfig.coder_shift`` of ``night``: the weaker model handicapped before ``drift_night``, the stronger
    from it on."""
    if cfg.coder_gap == 0:
        return {}
    turned = cfg.drift_night is not None and night >= cfg.drift_night
    return {strong if turned else weak: -cfg.coder_gap}


# ------------------------------------------------------------------------------------------------ the ingest
def ingest_night(session_dirs: Sequence[Path], out: Path, table: RoutingTable, objective: TaskObjective,
                 clock_scale: float) -> dict:
    """SAGE's journals of one night through the project's ingest into ``out``: ``trajectories.parquet`` and its
    side tables, the routing dataset, ``task_outcomes.parquet``. Returns the frames the ledger reads (``dataset``,
    ``outcomes``, ``trajectories``: session and trace ids) and the ingest's counts."""
    import pandas as pd
    import pyarrow.parquet as pq

    from sage_pipeline.routing import ingest, routing_dataset as rd, task_outcomes as to
    from sage_pipeline.routing.catalogue import SAGE_CATALOGUE, ModelCatalogue

    if not session_dirs:
        raise ValueError(f"{out}: no SAGE session folder to ingest (did any `sage run` start?)")
    res = ingest.ingest(ingest.IngestConfig([str(d) for d in session_dirs]), out, progress=lambda m: None)
    s = res.stats
    traj, mrd, tu, ai = (out / n for n in ingest.OUTPUT_FILES[:4])
    rd.build_routing_dataset_files(traj, table, ModelCatalogue.load(SAGE_CATALOGUE), rd.DatasetConfig(), out, mrd, tu)
    to.task_outcome_files(traj, mrd, tu, out / to.TASK_OUTCOMES_NAME,
                          to.TaskOutcomeConfig(objective=objective, clock_scale=clock_scale), agent_insights=ai)
    ds = rd.read_routing_dataset(out / rd.PARQUET_NAME,
                                 ["role", "model", "session_id", "task_id", "episode_id", "step", "source_line"])
    have = set(pq.read_schema(traj).names)
    trajectories = pq.read_table(traj, columns=[c for c in ("session_id", "trace_id") if c in have]).to_pandas()
    return {"dataset": ds, "outcomes": pd.read_parquet(out / to.TASK_OUTCOMES_NAME), "trajectories": trajectories,
            "counts": {"lines_read": s.lines_read, "accepted_lines": s.accepted_lines, "quarantined": s.quarantined,
                       "steps": s.steps_accepted, "files": len(s.files)}}


def journal_runs(frames: Mapping, objective: TaskObjective) -> tuple[list[CoderRun], dict[str, str]]:
    """The night's runs as the ledger reads them (``rl.coder_lever.ledger_runs``), each joined to its draw by the
    ``trace_id`` SAGE logged for its session (and that map, session -> trace id)."""
    from sage_pipeline.rl import coder_lever

    traces = coder_lever.traces_by_session(frames["trajectories"])
    return coder_lever.ledger_runs(frames["dataset"], frames["outcomes"], objective, traces), traces


# ------------------------------------------------------------------------------------------------ the checks
def pinned_model(models_yaml: str | Path) -> str:
    """The model a ``models.yaml`` pins SAGE's coder to (its coder row's primary, which must equal its fallback)."""
    r = RoutingTable.load(models_yaml).routes["coder"]
    if r.primary != r.fallback:
        raise ValueError(f"{models_yaml}: routing.coder has primary {r.primary!r} and fallback {r.fallback!r}: "
                         "not a table that pins the coder")
    return r.primary


def journal_checks(runs: Sequence[Mapping], traces: Mapping[str, str], journal: Sequence[CoderRun],
                   draws: Mapping[str, dict], plans: Mapping[str, assign.Plan]) -> dict:
    """Per run of the harness (``RunResult.to_dict()``: its own ``env``, its ``sessions``): whether SAGE's journal
    carries the trace id its draw gave it (every session of the run logged exactly that id), and whether the
    coder's model SAGE's journal shows is the one the arm's ``models.yaml`` pins (the file the recorded arm names,
    read again). Counts, and the first few problems by run."""
    by_session = {r.session_id: r for r in journal}
    out: Counter = Counter()
    problems: list[str] = []
    yaml_model: dict[str, str] = {}
    for r in runs:
        did = (r.get("env") or {}).get("SAGE_TRACE_ID")
        if not did:
            out["runs without a draw"] += 1
            continue
        out[DRAWN] += 1
        logged = {traces.get(s) for s in r.get("sessions", ())}
        if not r.get("sessions"):
            out["trace: no journal line"] += 1
            problems.append(f"{r['run']}: SAGE wrote no journal line")
            continue
        if logged == {did}:
            out[TRACE_OK] += 1
        else:
            out["trace: journal lacks or differs"] += 1
            problems.append(f"{r['run']}: drew {did}, its journal logged {sorted(map(str, logged))}")
        d = draws.get(did)
        if d is None or d["plan"] not in plans or "coder" not in d["levers"]:
            out["model: draw not recorded"] += 1
            problems.append(f"{r['run']}: draw {did} not in the records")
            continue
        arm = next(a for a in plans[d["plan"]].levers["coder"] if a.name == d["levers"]["coder"]["arm"])
        path = arm.env["SAGE_MODELS_YAML"]
        if path not in yaml_model:
            yaml_model[path] = pinned_model(path)
        if r.get("env", {}).get("SAGE_MODELS_YAML") != str(Path(path).resolve()):
            out["model: run's SAGE_MODELS_YAML is not its arm's"] += 1
            problems.append(f"{r['run']}: ran with {r['env'].get('SAGE_MODELS_YAML')}, its arm names {path}")
        seen = {by_session[s].logged_model for s in r.get("sessions", ()) if s in by_session} - {None}
        if not seen:
            out[NO_CODER] += 1
        elif seen == {yaml_model[path]}:
            out[MODEL_OK] += 1
        else:
            out["model: journal's coder differs"] += 1
            problems.append(f"{r['run']}: arm pins {yaml_model[path]}, SAGE's coder logged {sorted(seen)}")
    return {"counts": dict(out), "problems": problems[:20]}


def recompute_online(led: Ledger, journal: Sequence[CoderRun], draws: Mapping[str, dict],
                     plans: Mapping[str, assign.Plan], cfg: CoderDecisionsConfig) -> dict:
    """Each coder candidate's ``online`` evidence recomputed from the records and the journals alone, without
    ``coder.add_runs`` (only its stated rescaling of task_v1 and arm names are shared): its units (every
    recorded draw, in record order, whose plan gave both arms of its round and whose run has a known task_v1),
    and the sum of ``x = (Z_mine/p_mine - Z_other/p_other) (y - c)`` with the probabilities the exact thresholds
    / 2**32 and ``c`` the running mean of ``y`` after the prior. Returns per candidate: whether the units equal
    the ledger's ``judged_on`` (same order), the two sums and their difference, and the probabilities used (as
    exact fractions)."""
    y_of: dict[str, float] = {}
    for r in journal:
        if r.trace_id and r.objective is not None and math.isfinite(r.objective) and r.trace_id not in y_of:
            y_of[r.trace_id] = float(coder_ledger.rescale([r.objective], cfg)[0][0])
    out = {}
    for c in led.of(coder_ledger.LEVER):
        if "other_id" not in c.payload:
            continue
        mine, theirs = coder_ledger.arm_name(c.id), coder_ledger.arm_name(str(c.payload["other_id"]))
        s, n = cfg.centre_prior * cfg.centre_prior_weight, cfg.centre_prior_weight
        units, total, probs = [], 0.0, set()
        for did, d in draws.items():
            plan = plans.get(d["plan"])
            arms = {a.name: a for a in plan.levers.get(coder_ledger.LEVER, ())} if plan else {}
            if mine not in arms or theirs not in arms or did not in y_of or "coder" not in d["levers"]:
                continue
            got = d["levers"]["coder"]["arm"]
            pa, pb = arms[mine].threshold / assign.SCALE, arms[theirs].threshold / assign.SCALE
            probs.add((str(Fraction(arms[mine].threshold, assign.SCALE)), str(Fraction(arms[theirs].threshold,
                                                                                         assign.SCALE))))
            y = y_of[did]
            total += ((got == mine) / pa - (got == theirs) / pb) * (y - s / n)
            units.append(did)
            s, n = s + y, n + 1
        judged = list(c.judged_on.get(coder_ledger.ONLINE, ()))
        # a closed candidate takes no evidence after its last night: compare on the units it was judged on
        if c.state in ("reverted", "dropped"):
            keep = set(judged)
            units = [u for u in units if u in keep]
        ledger_total = (float(led.stream(c, "streams", coder_ledger.ONLINE).total[0])
                        if coder_ledger.ONLINE in c.streams else 0.0)
        out[c.id] = {"units_equal": units == judged, "units": len(judged), "sum_recomputed": total,
                     "sum_ledger": ledger_total, "difference": abs(total - ledger_total) if c.state in (
                         "pending", "accepted") else None, "probabilities": sorted(probs)}
    return out


# ------------------------------------------------------------------------------------------------ the truth
def truth_rows(runs: Sequence[Mapping]) -> list[dict]:
    """The runs the truth can value: SAGE reached its reviewer and logged the task's complexity."""
    return [{"run": r["run"], "task_id": r["task_id"], "complexity": r["complexity"], "worker": r.get("worker", 0),
             "tests_at_start": bool(r.get("tests_at_start", False)), "trace_id": r.get("trace_id")}
            for r in runs if r.get("complexity") is not None]


def arm_truth(world: ModelWorld, runs: Sequence[Mapping], shipped: RoutingTable, models: Sequence[str],
              objective: TaskObjective) -> dict:
    """Each model's pinned table's exact value on ``runs`` under the world as it is now: per run (by trace id, for
    the confidence sequence's target) and on average (verified share, GPU-seconds, task_v1)."""
    tr = truth_rows(runs)
    if not tr:
        return {"runs": 0}
    per: dict[str, np.ndarray] = {}
    out: dict = {"runs": len(tr), "models": {}}
    for m in models:
        vals = T.run_values(world, [{**r, "coder_model": m} for r in tr], T.SagePolicy(pin(shipped, "coder", m)))
        per[m] = objective.score(vals[:, 1], vals[:, 3], vals[:, 4])
        out["models"][m] = {"verified": float(vals[:, 1].mean()), "gpu_seconds": float(vals[:, 3].mean()),
                            "task_v1": float(per[m].mean())}
    out["per_run"] = {r["trace_id"]: {m: float(per[m][i]) for m in models} for i, r in enumerate(tr)
                      if r.get("trace_id")}
    return out


def judge(moves: Sequence[Mapping], led: Ledger, truth: Mapping, min_gain_task_v1: float) -> list[dict]:
    """Each transition tonight beside the exact truth of tonight's runs: an accept is right when the pinned model
    truly beats the other (gain > 0); a revert, and a drop by the rule, when its true gain is below the minimum
    useful gain; the drop of an accepted pin's round-mate when it truly does not beat the pin (gain <= 0)."""
    models = truth.get("models", {})
    out = []
    for mv in moves:
        c = led.get(mv["id"])
        m, o = str(c.payload.get("model")), str(c.payload.get("other"))
        gain = models[m]["task_v1"] - models[o]["task_v1"] if m in models and o in models else None
        right = None
        if gain is not None:
            if mv["to"] == "accepted":
                right = gain > 0
            elif mv["to"] == "reverted":
                right = gain < min_gain_task_v1
            elif mv["to"] == "dropped":
                right = gain <= 0 if "a round pins one model" in mv["reason"] else gain < min_gain_task_v1
        out.append({**mv, "model": m, "true_gain": gain, "right": right})
    return out


# ------------------------------------------------------------------------------------------------ a night
def _paths(data: Path) -> tuple[Path, Path]:
    ledger = data / "decisions" / LEDGER_NAME
    return ledger, coder_ledger.lever_dir(ledger)


def plan_rows(plan: assign.Plan | None, records: Mapping[str, dict], models_of: Mapping[str, str]) -> list[dict]:
    """The night's arms: name, candidate, model, exact probability (threshold / 2**32) and the runs drawn to it."""
    if plan is None:
        return []
    drawn = Counter(d["levers"]["coder"]["arm"] for d in records.values()
                    if d["plan"] == plan.id and "coder" in d["levers"])
    return [{"arm": a.name, "candidate": a.candidate, "model": models_of.get(a.env.get("SAGE_MODELS_YAML", ""), ""),
             "probability": a.probability, "exact": f"{a.threshold}/2^32", "runs": int(drawn.get(a.name, 0))}
            for a in plan.levers[coder_ledger.LEVER]]


def run_night(world: ModelWorld, url: str, install: SageInstall, root: Path, night: int, tasks: Sequence[str],
              shipped: RoutingTable, models: tuple[str, ...], cfg: DecisionE2EConfig, weak: str, strong: str,
              state: dict, progress: Callable[[str], None] = log.info) -> dict:
    """One night (see the module doc) into ``root`` (``nights/night-NN``: SAGE's workspaces, the records and the
    night's ingest; ``data/decisions``: the ledger, its plans and pins). ``state`` carries what the nights read
    back, updated: ``truth`` every run's exact per-model values so far by trace id (what each candidate's
    confidence sequence covers) and ``journal`` every run the ingest read so far. Returns the night's row."""
    judged_truth = state.setdefault("truth", {})
    journal_all = state.setdefault("journal", [])
    from sage_pipeline.sage_world import loop as sl

    t0 = time.perf_counter()
    data, night_root = root / "data", root / "nights" / f"night-{night:02d}"
    ledger_path, folder = _paths(data)
    shift = world_shift(cfg, night, weak, strong)
    world.config = world.config.model_copy(update={"coder_shift": shift})
    loop_cfg = sl.LoopConfig(seed=cfg.seed, pool=cfg.pool, coder_explore_share=cfg.decisions.explore_share,
                             coder_after_revert=cfg.decisions.after_revert)
    _, plan, run_env = sl.coder_day(data, night_root, shipped, models, night, loop_cfg)
    progress(f"night {night}: world {shift or 'as calibrated'}; arms "
             + (", ".join(f"{a.name} {a.probability:.2f}" for a in plan.levers['coder']) if plan else "none"))
    res: DayResult = run_day(world, url, install, night, tasks, night_root, cfg.harness, progress=progress,
                             run_env=run_env)
    runs = [r.to_dict() for r in res.runs]
    artifacts.write_text(night_root / "runs.jsonl", "".join(json.dumps(r) + "\n" for r in runs))
    t_runs = time.perf_counter() - t0
    frames = ingest_night(res.sessions_dirs, night_root / "ingest", shipped, cfg.objective,
                          cfg.world.clock_scale or 1.0)
    journal, traces = journal_runs(frames, cfg.objective)
    journal_all += journal
    plans, bad_plans = coder_ledger.load_plans(folder)
    draws: dict[str, dict] = {}
    bad: list[str] = []
    for n in range(1, night + 1):  # every night's records, in the order they were drawn
        got, problems = assign.read_records(root / "nights" / f"night-{n:02d}" / assign.RECORDS_NAME, plans)
        draws.update(got)
        bad += problems
    tonight, _ = assign.read_records(night_root / assign.RECORDS_NAME, plans)
    led = Ledger.load(ledger_path)
    before = {c.id: c.state for c in led.of(coder_ledger.LEVER)}
    added = coder_ledger.add_runs(led, journal, draws, plans, cfg.decisions)
    moves = coder_ledger.decide_night(led, f"day-{night:02d}", models, cfg=cfg.decisions)
    coder_ledger.save_merged(led, ledger_path)
    truth = arm_truth(world, runs, shipped, models, cfg.objective)
    judged_truth.update(truth.get("per_run", {}))
    scale = 1.0 + cfg.decisions.cost_max
    min_gain = led.config.min_useful_gain * scale
    pins = {str(Path(p).resolve()): m for m, p in coder_ledger.write_pins(
        shipped, folder / coder_ledger.PINS_DIR, models).items()}
    cands = []
    for c in led.of(coder_ledger.LEVER):
        r = coder_ledger.row(led, c)
        units = [u for u in c.judged_on.get(coder_ledger.ONLINE, ()) if u in judged_truth]
        m, o = str(c.payload.get("model")), str(c.payload.get("other"))
        target = (float(np.mean([judged_truth[u][m] - judged_truth[u][o] for u in units])) if units else None)
        lo, hi = r["interval"]
        rev = r["revert_evidence"]
        if rev is None and c.nights and c.nights[-1].night == f"day-{night:02d}":
            rev = c.nights[-1].revert_evidence  # reverted tonight: the evidence that reverted it
        cands.append({"id": c.id, "model": m, "round": r["round"], "state": c.state,
                      "state_before": before.get(c.id), "estimate": _mul(r["estimate"], scale),
                      "interval": [_mul(lo, scale), _mul(hi, scale)], "evidence": r["evidence"],
                      "needed": r["needed"], "revert_evidence": rev,
                      "revert_needed": 1.0 / led.config.revert_alpha, "runs": r["runs"],
                      "true_mean_gain_on_its_runs": target, "standing": r["standing"]})
    p = coder_ledger.pinned(led)
    gap = None
    if truth.get("runs"):
        mv = truth["models"]
        gap = mv[strong]["task_v1"] - mv[weak]["task_v1"]
    turned = bool(cfg.drift_night and night >= cfg.drift_night)
    row = {"night": night, "world": {"coder_shift": shift, "turned": turned},
           "runs": res.summary(), "arms": plan_rows(plan, tonight, pins),
           "truth": {k: v for k, v in truth.items() if k != "per_run"}, "true_gap_strong_minus_weak": gap,
           "candidates": cands, "transitions": judge(moves, led, truth, min_gain),
           "pinned_after": coder_ledger.model_of(p) if p is not None else None,
           "evidence": {k: v for k, v in added.items() if k != "candidates"},
           "journal": journal_checks(runs, traces, journal, draws, plans),
           "recomputed": recompute_online(led, journal_all, draws, plans, cfg.decisions),
           "records_problems": (bad + bad_plans)[:20], "ingest": frames["counts"],
           "seconds": {"runs": round(t_runs, 1), "night": round(time.perf_counter() - t0 - t_runs, 1)}}
    if p is not None and truth.get("runs"):
        mv = truth["models"]
        row["pin_truly_better_tonight"] = bool(mv[coder_ledger.model_of(p)]["task_v1"]
                                               > mv[str(p.payload["other"])]["task_v1"])
    return row


def _mul(x: float | None, k: float) -> float | None:
    return None if x is None else x * k


def run(install: SageInstall, root: str | Path, cfg: DecisionE2EConfig | None = None, world: ModelWorld | None = None,
        progress: Callable[[str], None] = log.info) -> dict:
    """Every night into ``root`` (a fresh folder); the report (rewritten after every night) at
    ``root/decision_e2e.json``."""
    from sage_pipeline.sage_world import loop as sl
    from sage_pipeline.sage_world.server import WorldServer
    from sage_pipeline.sage_world.world import build_world, world_info

    cfg = cfg or DecisionE2EConfig()
    root = Path(root).resolve()
    if root.exists() and any(root.iterdir()):
        raise FileExistsError(f"{root} is not empty: the nights start from fresh SAGE workspaces and a fresh ledger; "
                              "pick a new folder")
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    world = world or build_world(install.models_yaml, n_tasks=cfg.pool, task_seed=cfg.seed, config=cfg.world,
                                 workers=cfg.harness.workers, progress=progress)
    shipped = world.table
    r = shipped.routes["coder"]
    models = tuple(dict.fromkeys((r.primary, r.fallback)))
    if len(models) != 2:
        raise ValueError(f"{shipped.source}: the coder's row names one model ({models}): nothing to decide")
    weak, strong = ranked(world, models)
    report = {"config": cfg.model_dump(), "world": world_info(world), "models": {"weak": weak, "strong": strong},
              "nights": [], "seconds": 0.0}
    state: dict = {}
    with WorldServer(world) as server:
        for n in range(1, cfg.nights + 1):
            tasks = sl.day_tasks(world, n, cfg.runs_per_night, cfg.seed)
            row = run_night(world, server.url, install, root, n, tasks, shipped, models, cfg, weak, strong, state,
                            progress)
            report["nights"].append(row)
            report["seconds"] = round(time.perf_counter() - t0, 1)
            artifacts.write_json(root / REPORT_NAME, report)
            moves = "; ".join(f"{t['id']} {t['to']} (right: {t['right']})" for t in row["transitions"]) or "no change"
            progress(f"night {n}: {row['runs']['finished']}/{row['runs']['runs']} runs finished; pinned "
                     f"{row['pinned_after'] or 'none'}; {moves}; {row['seconds']}")
    return report


# ------------------------------------------------------------------------------------------------ the report
def _short(model: str) -> str:
    return model.split(":")[-1].split("-")[0].upper() if ":" in model else model


def _f(x, nd: int = 3) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:+.{nd}f}" if nd < 0 else \
        f"{x:.{nd}f}"


def night_table(report: Mapping) -> list[dict]:
    """One row per night for the markdown table: the world, the arms (exact probability, runs drawn), the exact
    truth of each arm on the night's runs, each open or just-closed candidate (state, estimate and confidence
    sequence in task_v1, evidence of needed, the exact mean gain over the runs it was judged on), the transitions
    and whether each was right, and the checks."""
    weak, strong = report["models"]["weak"], report["models"]["strong"]
    out = []
    for n in report["nights"]:
        mv = n["truth"].get("models", {})
        shift = n["world"]["coder_shift"]
        cands = []
        for c in n["candidates"]:
            if c["state"] in ("pending", "accepted") or c["state"] != c["state_before"]:
                lo, hi = c["interval"]
                ev_txt = (f"revert {c['revert_evidence']:.1f}/{c['revert_needed']:.0f}" if c["state"] in (
                    "accepted", "reverted") and c["revert_evidence"] is not None
                    else f"{c['evidence']:.1f}/{c['needed']:.0f}")
                cands.append(f"{c['id']} {_short(c['model'])} {c['state']}: {_f(c['estimate'])} "
                             f"[{_f(lo, 2)}, {_f(hi, 2)}], {ev_txt}, true {_f(c['true_mean_gain_on_its_runs'])}")
        checks = n["journal"]["counts"]
        rec = [v["difference"] for v in n["recomputed"].values() if v["difference"] is not None]
        out.append({
            "night": n["night"],
            "world": ", ".join(f"{_short(m)} {d:+.2f}" for m, d in shift.items()) or "calibrated",
            "arms (p exact, runs)": "; ".join(f"{_short(a['model'])} {a['probability']:.2f} ({a['runs']})"
                                              for a in n["arms"]) or "SAGE's table",
            f"true verified {_short(strong)}/{_short(weak)}": "/".join(
                f"{mv[m]['verified']:.3f}" for m in (strong, weak)) if mv else "—",
            f"true GPU-s {_short(strong)}/{_short(weak)}": "/".join(
                f"{mv[m]['gpu_seconds']:.1f}" for m in (strong, weak)) if mv else "—",
            "true task_v1 gap": _f(n["true_gap_strong_minus_weak"]),
            "ledger (estimate [CS], evidence/needed, true mean gain on its runs)": "<br>".join(cands) or "—",
            "transitions (right?)": "; ".join(f"{t['id']} {t['to']} ({'right' if t['right'] else 'WRONG'})"
                                              if t["right"] is not None else f"{t['id']} {t['to']}"
                                              for t in n["transitions"]) or "—",
            "pinned": _short(n["pinned_after"]) if n["pinned_after"] else "none",
            "trace ids in journal": f"{checks.get(TRACE_OK, 0)}/{checks.get(DRAWN, 0)}",
            "coder = arm's pin": f"{checks.get(MODEL_OK, 0)}/{checks.get(DRAWN, 0) - checks.get(NO_CODER, 0)}",
            "evidence recomputed, max diff": _f(max(rec), 1) if rec else "—",
        })
    return out


def summary(report: Mapping) -> dict:
    """The target's figures: the first accept and its night, the drift night, the revert and its nights after the
    drift, every transition's verdict against the truth, how often an open (or just closed) candidate's confidence
    sequence held the exact mean gain over its runs, the checks over all nights, runs and time."""
    cfg = report["config"]
    moves = [{**t, "night": n["night"]} for n in report["nights"] for t in n["transitions"]]
    first = lambda to, after=0: next((m for m in moves if m["to"] == to and m["night"] >= after), None)  # noqa: E731
    acc, drift = first("accepted"), cfg.get("drift_night")
    rev = first("reverted", drift or 0) if drift else None
    judged = [m for m in moves if m["right"] is not None]
    checks: Counter = Counter()
    for n in report["nights"]:
        checks.update(n["journal"]["counts"])
    rec = [v["difference"] for n in report["nights"] for v in n["recomputed"].values() if v["difference"] is not None]
    covered = [c["interval"][0] <= c["true_mean_gain_on_its_runs"] <= c["interval"][1] for n in report["nights"]
               for c in n["candidates"] if c["true_mean_gain_on_its_runs"] is not None and None not in c["interval"]
               and (c["state"] in ("pending", "accepted") or c["state"] != c["state_before"])]
    runs = sum(n["runs"]["runs"] for n in report["nights"])
    run_s = sum(n["seconds"]["runs"] for n in report["nights"])
    return {"nights": len(report["nights"]), "runs": runs,
            "finished": sum(n["runs"]["finished"] for n in report["nights"]),
            "first_accept": None if acc is None else {"night": acc["night"], "id": acc["id"], "model": acc["model"],
                                                      "right": acc["right"], "true_gain": acc["true_gain"]},
            "drift_night": drift,
            "revert_after_drift": None if rev is None else {"night": rev["night"], "id": rev["id"],
                                                            "nights_after_drift": rev["night"] - drift + 1,
                                                            "right": rev["right"], "true_gain": rev["true_gain"]},
            "transitions_judged": len(judged), "transitions_wrong": sum(not m["right"] for m in judged),
            "confidence_sequence_covers_truth": f"{sum(covered)} of {len(covered)} candidate-nights",
            "checks": dict(checks), "evidence_recomputed_max_difference": max(rec) if rec else None,
            "units_equal_everywhere": all(v["units_equal"] for n in report["nights"] for v in n["recomputed"].values()),
            "records_problems": sum(len(n["records_problems"]) for n in report["nights"]),
            "seconds": report.get("seconds"), "runs_seconds": round(run_s, 1),
            "runs_per_minute": round(60 * runs / max(run_s, 1e-9), 1)}
