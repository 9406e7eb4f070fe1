"""The coder lever of the decision ledger: which model SAGE's coder runs, decided on randomised ``sage run``s
whose evidence is carried from night to night, with a pin kept on probation and undone when its gain is
excluded.

**Why randomised runs only.** SAGE's coder never asks the router: its UCB bandit picks a strategy key (two
per model of the coder's row in ``models.yaml``) from its own past rewards. That choice is *adaptive*: which
model a run got depends on the outcomes of the runs before it, and its probability is nowhere logged, so a
comparison of the bandit's runs by model has no known law (the winner's curse and the bandit's choices,
uncorrected: the "estimate above the truth on 5 of 5 nights" of issue 47). A run is evidence only when its
coder model was set by a **recorded draw of exact probability** (:mod:`.assign`): a ``models.yaml`` that
pins the coder to one model (``sage.table.pin``: primary and fallback that model, a trigger that never
fires), exported as ``SAGE_MODELS_YAML``, with ``SAGE_TRACE_ID`` the draw id. A run without a draw (SAGE's
own bandit chose) is counted and reported, never evidence.

**Candidates, by round.** A round proposes two ledger candidates on lever ``coder``, one per model of the
coder's row: "pin coder to A" and "pin coder to B" (key ``pin coder to <model> (round r)``), each the
contrast of its model's pinned table against the other's on the same randomised runs. The first proposed
gets the lever's next (larger) level ``alpha_j``: the caller's ``prefer`` (the model the non-randomised
logs favour, or after a revert the model that was not pinned: data that is never these candidates'
evidence, so using it to order them spends no level), else the table's order. The lever's levels are spent
geometrically (``LedgerConfig.first_share['coder']`` = 0.9: the first round's preferred model at 0.045, its
sibling at 0.0045, each later candidate a tenth of the one before; the sum over every round is at most
alpha), and its bets are the mixture over gains (``LedgerConfig.coder_evidence``). Both directions of a round
count: two equal models make both pins wrong, so the two share the level (a Bonferroni split over the known
pair; one level for both would only hold if a tie could not be wrong). Over every round and every candidate,
by the ledger's rule, *the chance the coder is ever pinned to a model that does not beat the other, on any
night, is at most alpha* (:func:`guarantee`).

- **Pending** (no pin yet): the plan runs **50/50** between the two pinned ``models.yaml``.
- **Accepted** (a pin): the other candidate of the round is dropped ("a round pins one model"); the plan
  runs the pinned model at ``1 - explore_share`` and the other at **explore_share = 0.3** (probation: a
  wrong pin is found out). The pin's probation stream reverts it when its gain is excluded above the
  ledger's ``min_useful_gain``.
- **Reverted**: the world turned under the pin. By default (``after_revert="randomise"``) a new round opens
  the same night, the model that was not pinned first, at 50/50 again: only a randomised round can find
  the new best, since SAGE's bandit's runs are no evidence. ``after_revert="table"`` goes back to SAGE's
  table (its bandit) until ``reopen_after_nights`` have passed.
- **Dropped** (by the ledger's rule: its gain over the other model shown below ``min_useful_gain``, or 30
  nights pending): while the round's other candidate is pending the round goes on at 50/50; when both are
  dropped, SAGE's table (its bandit) runs, and a new round opens after ``reopen_after_nights``.

**The observation of one run** (stream ``online``): ``y`` = the run's ``task_v1`` (``TaskObjective.score``;
the mean over the run's tasks of known verdict) rescaled to [0, 1] by the stated bounds ``[-cost_max, 1]``:
``y = (max(objective, -cost_max) + cost_max) / (1 + cost_max)``. ``cost_max`` = 1/30 (120 GPU-seconds a task
at the default price of one verified task per GPU-hour, or $0.17 at $5 a task; the model world's tasks
cost 7-17 GPU-seconds): a run whose cost term is above it counts at the bound, and is counted. A gain in
``y`` is the gain in task_v1 times ``1 / (1 + cost_max)`` (0.968): the ledger's ``min_useful_gain`` 0.03 in
``y`` is 0.031 in task_v1. Then ``x = ipw_contrast(y, on my arm, on the other arm, p_mine, p_other, c)``
with the draw's exact probabilities and ``c`` the running mean of the earlier runs' ``y`` in this stream
(after a prior of ``centre_prior_weight`` runs at ``centre_prior``), fixed before the run is read.

**Units and order.** One observation per draw (the draw id: a run's ``trace_id``), in the order the draws
were recorded (the launcher records a draw as its run starts; the loop records each day's draws in run
order, and each worker runs its runs in that order, so a run's outcome can depend on earlier runs of its
workspace, SAGE's bandit state and memory, never on later ones). Left out and counted: a run without a
draw; a draw without a coder arm or whose plan is unknown; a run whose verdicts are all unknown (a killed
run: never scored as 0); a second session on one draw; a draw already counted. A run whose coder logged
another model than its arm pinned still counts as drawn (intent to treat) and is counted.

Pure: numpy, pydantic, the ledger, the assignment and SAGE's table format; SAGE's journals and frames are
the caller's (``rl.coder_lever.ledger_runs``, ``sage_world.loop.coder_night_ledger``).
"""

from __future__ import annotations

import hashlib
import math
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timezone
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.decisions import assign, evidence as ev, report
from sage_pipeline.decisions.ledger import Candidate, Ledger
from sage_pipeline.sage.table import RoutingTable, pin

LEVER = "coder"
ONLINE = "online"  # the candidates' one evidence stream: randomised runs
LEVER_DIR = "coder"  # beside the ledger: plans/, pins/ (the pinned models.yaml files)
PLANS_DIR = "plans"
PINS_DIR = "pins"
ARM_PREFIX = "pin-"


class CoderDecisionsConfig(BaseModel):
    """How the coder lever spends its runs (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    explore_share: float = Field(0.3, gt=0.0, lt=0.5, description="after a pin, the share of runs kept on the other "
                                 "model (probation: what finds a wrong pin out; each run there costs the gap). 0.3: "
                                 "at 0.1 a pin gone bad was reverted within 7 nights in 37% of months "
                                 "(benchmarks/decision_month.py)")
    cost_max: float = Field(1.0 / 30.0, gt=0.0, le=10.0, description="the stated bound of task_v1's cost term (its "
                            "GPU-seconds and dollars at the objective's prices) for the rescaling to [0, 1]: 120 "
                            "GPU-seconds a task at one verified task per GPU-hour; a run above it counts at it")
    centre_prior: float = Field(0.5, ge=0.0, le=1.0, description="the contrast's centre before any run")
    centre_prior_weight: float = Field(1.0, gt=0.0, description="runs' worth of the centre's prior")
    after_revert: Literal["randomise", "table"] = Field("randomise", description="after a revert: a new round at "
                                                        "50/50 the same night, or SAGE's table until "
                                                        "reopen_after_nights have passed")
    reopen_after_nights: int = Field(30, ge=1, description="nights after a round ended without a pin (or, with "
                                     "after_revert='table', after a revert) before a new round opens")


# ---------------------------------------------------------------------------------------------- outcomes
def bounds(cfg: CoderDecisionsConfig | None = None) -> tuple[float, float]:
    """The stated bounds of task_v1 the rescaling uses: ``(-cost_max, 1)``."""
    cfg = cfg or CoderDecisionsConfig()
    return -cfg.cost_max, 1.0


def rescale(objective, cfg: CoderDecisionsConfig | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(y in [0, 1], capped) of task_v1 values: ``(max(o, -cost_max) + cost_max) / (1 + cost_max)``; ``capped``
    marks values below the bound (their cost term above ``cost_max``)."""
    lo, hi = bounds(cfg)
    o = np.asarray(objective, dtype=np.float64)
    if np.any(o > hi + 1e-9):
        raise ValueError("a task_v1 value above 1: verified is at most 1 and costs are never negative")
    return (np.clip(o, lo, hi) - lo) / (hi - lo), o < lo


@dataclass(frozen=True)
class CoderRun:
    """One ``sage run`` read from SAGE's journals: its session, its draw id (``trace_id`` as SAGE logged it, or
    the harness's join of the run to its draw; None: not randomised), its task_v1 (the mean over its tasks of
    known verdict; None: none known), the model its coder's first decision logged, and its tasks."""

    session_id: str
    trace_id: str | None
    objective: float | None
    logged_model: str | None = None
    tasks: int = 1


# ---------------------------------------------------------------------------------------------- candidates
def key(model: str, round_no: int) -> str:
    return f"pin coder to {model} (round {round_no})"


def arm_name(cid: str) -> str:
    return f"{ARM_PREFIX}{cid}"


def model_of(c: Candidate) -> str:
    return str(c.payload["model"])


def rounds(led: Ledger) -> dict[int, list[Candidate]]:
    out: dict[int, list[Candidate]] = {}
    for c in led.of(LEVER):
        out.setdefault(int(c.payload.get("round", 0)), []).append(c)
    return dict(sorted(out.items()))


def sibling(led: Ledger, c: Candidate) -> Candidate:
    return led.get(str(c.payload["other_id"]))


def open_round(led: Ledger, models: Sequence[str], night: str, prefer: str | None = None) -> list[Candidate]:
    """Propose the two candidates of a new round ("pin coder to A", "pin coder to B"; ``prefer`` first, so it
    gets the larger level). Refused while a candidate of the lever is pending or accepted."""
    ms = list(dict.fromkeys(str(m) for m in models))
    if len(ms) != 2:
        raise ValueError(f"the coder lever compares the two models of the coder's row; got {ms}")
    if led.of(LEVER, "pending", "accepted"):
        raise ValueError("a round is open (a coder candidate is pending or accepted): it must end before another")
    if prefer is not None:
        if prefer not in ms:
            raise ValueError(f"prefer {prefer!r} is not one of the coder's models {ms}")
        ms.sort(key=lambda m: m != prefer)
    r = max(rounds(led), default=0) + 1
    out = []
    for m in ms:
        c, _ = led.propose(LEVER, key(m, r), night=night, description=f"pin the coder to {m} (round {r})",
                           payload={"model": m, "round": r, "night_no": night_number(night)})
        out.append(c)
    a, b = out
    a.payload.update(other=model_of(b), other_id=b.id)
    b.payload.update(other=model_of(a), other_id=a.id)
    return out


def night_number(night: str) -> int:
    """A night as a number: an ISO date's ordinal (the nightly job), else the number it ends in (the loop's
    ``day-NN``)."""
    try:
        return date.fromisoformat(night[:10]).toordinal()
    except ValueError:
        m = re.search(r"(\d+)$", night)
        if not m:
            raise ValueError(f"night {night!r}: an ISO date or a name ending in its number (day-03)") from None
        return int(m.group(1))


def pinned(led: Ledger) -> Candidate | None:
    """The accepted pin, if any (at most one: an accept drops its round's other candidate)."""
    acc = led.of(LEVER, "accepted")
    if len(acc) > 1:
        raise ValueError(f"two coder pins accepted at once ({', '.join(c.id for c in acc)}): the ledger was "
                         "edited by something other than this lever")
    return acc[0] if acc else None


def round_due(led: Ledger, night: str, cfg: CoderDecisionsConfig | None = None) -> bool:
    """Whether a new round should open tonight (see the module doc): never while one is open; on the first
    night; the night of a revert with ``after_revert='randomise'``; else ``reopen_after_nights`` after the last
    round ended."""
    cfg = cfg or CoderDecisionsConfig()
    if led.of(LEVER, "pending", "accepted"):
        return False
    cands = led.of(LEVER)
    if not cands:
        return True
    last = max(rounds(led).items())[1]
    ended = max(last, key=lambda c: night_number(c.history[-1].night))
    gone = night_number(night) - night_number(ended.history[-1].night)
    if any(c.state == "reverted" for c in last) and cfg.after_revert == "randomise":
        return True
    return gone >= cfg.reopen_after_nights


# ---------------------------------------------------------------------------------------------- evidence
def _coder_arms(plan: assign.Plan) -> dict[str, assign.Arm]:
    return {a.name: a for a in plan.levers.get(LEVER, ())}


def add_runs(led: Ledger, runs: Sequence[CoderRun], draws: Mapping[str, dict], plans: Mapping[str, assign.Plan],
             cfg: CoderDecisionsConfig | None = None) -> dict:
    """Randomised runs as ``online`` evidence of every pending or accepted candidate whose plan gave it and its
    round's other candidate an arm (``draws``: :func:`assign.read_records`'s, by draw id, in the order they were
    recorded; ``plans`` by id). Returns the counts: runs, runs with a draw, left out by reason (a run without
    a draw is not evidence), per arm the runs drawn to it, and per candidate what was added."""
    cfg = cfg or CoderDecisionsConfig()
    out: dict = {"runs": len(runs), "with_draw": 0, "left_out": Counter(), "noted": Counter(), "by_arm": Counter(),
                 "capped": 0, "candidates": {}}
    order = {did: i for i, did in enumerate(draws)}
    usable: dict[str, tuple] = {}
    for r in runs:
        d = draws.get(r.trace_id) if r.trace_id else None
        if d is None:
            out["left_out"]["no recorded draw (SAGE's bandit chose, adaptively: not evidence)"] += 1
            continue
        arm = d["levers"].get(LEVER)
        if arm is None or d["plan"] not in plans:
            out["left_out"]["a draw without a coder arm (or its plan unknown)"] += 1
            continue
        if r.objective is None or not math.isfinite(r.objective):
            out["left_out"]["drawn, but no task verdict known (a killed or cut run: never scored as 0)"] += 1
            continue
        if r.trace_id in usable:
            out["left_out"]["a second session on one draw (one draw is one run)"] += 1
            continue
        y, capped = rescale([r.objective], cfg)
        out["capped"] += int(capped[0])
        drawn_model = None
        if arm.get("candidate"):
            try:
                drawn_model = model_of(led.get(arm["candidate"]))
            except (KeyError, ValueError):
                drawn_model = None
        if r.logged_model and drawn_model and r.logged_model != drawn_model:
            out["noted"]["its coder logged another model than its arm pinned (counted as drawn: intent to treat)"] += 1
        out["by_arm"][arm["arm"]] += 1
        usable[r.trace_id] = (order[r.trace_id], r.trace_id, float(y[0]), plans[d["plan"]], arm)
    out["with_draw"] = len(usable)
    seq = sorted(usable.values(), key=lambda u: u[0])
    for c in led.of(LEVER, "pending", "accepted"):
        mine, theirs = arm_name(c.id), arm_name(str(c.payload["other_id"]))
        done = set(c.judged_on.get(ONLINE, ()))
        s, n = c.payload.get("online_centre", [cfg.centre_prior * cfg.centre_prior_weight, cfg.centre_prior_weight])
        xs, los, his, units = [], [], [], []
        skipped: Counter = Counter()
        for _, did, y, plan, drawn in seq:
            arms = _coder_arms(plan)
            if mine not in arms or theirs not in arms:
                skipped["its plan had no arms for this round"] += 1
                continue
            if did in done:
                skipped["already counted"] += 1
                continue
            x, lo, hi = ev.ipw_contrast([y], [drawn["arm"] == mine], [drawn["arm"] == theirs],
                                        [arms[mine].probability], [arms[theirs].probability], [s / n])
            xs.append(float(x[0]))
            los.append(float(lo[0]))
            his.append(float(hi[0]))
            units.append(did)
            s, n = s + y, n + 1
        added = led.add_evidence(c.id, ONLINE, xs, los, his, units) if units else 0
        if added:
            c.payload["online_centre"] = [s, n]
        out["candidates"][c.id] = {"added": added, "left_out": dict(skipped)}
    for k in ("left_out", "noted", "by_arm"):
        out[k] = dict(out[k])
    return out


# ---------------------------------------------------------------------------------------------- decisions
def decide_night(led: Ledger, night: str, models: Sequence[str] | None = None, prefer: str | None = None,
                 cfg: CoderDecisionsConfig | None = None) -> list[dict]:
    """The ledger's rule for every pending or accepted coder candidate (the pin first, so a revert is known
    first; then pending ones by estimate, highest first), an accept dropping its round's other candidate;
    then, with ``models`` (the coder's two), a new round when :func:`round_due` (``prefer`` first; after a
    revert, the model that was not pinned). Returns the transitions ``{id, from, to, reason}`` (a new round's
    proposals as ``to: pending``)."""
    cfg = cfg or CoderDecisionsConfig()
    out: list[dict] = []

    def order(c: Candidate) -> tuple:
        st = led.standing(c.id)
        return (c.state != "accepted", -(st["estimate"] if st["estimate"] is not None else -math.inf), c.index)

    for c in sorted(led.of(LEVER, "pending", "accepted"), key=order):
        if c.state not in ("pending", "accepted"):
            continue  # dropped tonight as the other candidate of an accepted pin
        before = c.state
        new = led.decide(c.id, night)
        if new:
            out.append({"id": c.id, "from": before, "to": new, "reason": c.history[-1].reason})
        if new == "accepted":
            o = sibling(led, c)
            if o.state == "pending":
                why = f"{c.id} pinned the coder to {model_of(c)}: a round pins one model"
                led.transition(o.id, "dropped", night=night, reason=why)
                out.append({"id": o.id, "from": "pending", "to": "dropped", "reason": why})
    if models is not None and round_due(led, night, cfg):
        reverted = [t for t in out if t["to"] == "reverted"]
        if reverted:
            prefer = str(led.get(reverted[0]["id"]).payload["other"])
        for c in open_round(led, models, night, prefer):
            out.append({"id": c.id, "from": None, "to": "pending", "reason": c.history[-1].reason
                        + f" ({c.description}, level {c.alpha:.3g})"})
    return out


def guarantee(led: Ledger, cfg: CoderDecisionsConfig | None = None) -> str:
    cfg = cfg or CoderDecisionsConfig()
    c = led.config
    share = c.first_share.get(LEVER)
    spend = (f"alpha {share:g} ({1 - share:g})^(j-1)" if share is not None else "alpha/(j(j+1))")
    return (f"the chance the coder is ever pinned to a model that does not beat the other, over every night and "
            f"every round, is at most {c.alpha} (candidate j at {spend}, each an e-process on randomised runs "
            f"valid at every night, betting {c.coder_evidence.bet}); a pin is reverted when its gain is excluded "
            f"above {c.min_useful_gain} in task_v1 "
            f"rescaled by [{-cfg.cost_max:.4g}, 1], and a pin that truly gains that much is ever reverted with "
            f"chance at most {c.revert_alpha}; runs SAGE's bandit chose are never evidence")


def row(led: Ledger, c: Candidate) -> dict:
    """The report's row of a candidate: model, round, state, estimate and interval, evidence of needed, the
    standing line and why its last transition happened."""
    st = led.standing(c.id)
    return {"id": c.id, "model": model_of(c), "round": c.payload.get("round"), "state": c.state, "alpha": c.alpha,
            "estimate": st["estimate"], "interval": list(st["ci"]), "evidence": st["evidence"],
            "needed": st["needed"], "revert_evidence": st["revert_evidence"], "runs": st["n"],
            "standing": report.to_go(led, c), "why": c.history[-1].reason}


# ---------------------------------------------------------------------------------------------- the plan
def arms_wanted(led: Ledger, cfg: CoderDecisionsConfig | None = None) -> list[tuple[str, str, float, str]]:
    """The next plan's coder arms ``(arm name, candidate id, probability, model)``: the pin at
    ``1 - explore_share`` and its round's other model at ``explore_share``; else the open round's two models at
    0.5 each; else none (SAGE's table, its bandit)."""
    cfg = cfg or CoderDecisionsConfig()
    p = pinned(led)
    if p is not None:
        o = sibling(led, p)
        return [(arm_name(p.id), p.id, 1.0 - cfg.explore_share, model_of(p)),
                (arm_name(o.id), o.id, cfg.explore_share, model_of(o))]
    pend = led.of(LEVER, "pending")
    if pend:
        r = max(int(c.payload["round"]) for c in pend)
        pair = sorted(rounds(led)[r], key=lambda c: c.index)
        return [(arm_name(c.id), c.id, 0.5, model_of(c)) for c in pair]
    return []


def plan(led: Ledger, pins: Mapping[str, str | Path], cfg: CoderDecisionsConfig | None = None,
         note: str = "") -> assign.Plan | None:
    """The coder lever's plan (``SAGE_MODELS_YAML`` = ``pins[model]``, a models.yaml pinning the coder to it), or
    None when SAGE's table runs unrandomised."""
    arms = arms_wanted(led, cfg)
    if not arms:
        return None
    missing = [m for *_, m in arms if m not in pins]
    if missing:
        raise ValueError(f"no pinned models.yaml for {missing}: write them with write_pins first")
    return assign.make_plan({LEVER: [(name, cid, p, {"SAGE_MODELS_YAML": str(Path(pins[m]).resolve())})
                                     for name, cid, p, m in arms]}, note)


def pin_file(folder: str | Path, model: str) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", model)[:60]
    return Path(folder) / f"{slug}-{hashlib.sha256(model.encode()).hexdigest()[:8]}.yaml"


def write_pins(table: RoutingTable, folder: str | Path, models: Sequence[str]) -> dict[str, Path]:
    """For each model, ``table`` with the coder pinned to it (``sage.table.pin``), written as a models.yaml SAGE
    reads (atomically, read back by SAGE's loader's rules); only when its text changes."""
    out = {}
    for m in models:
        t = pin(table, "coder", m)
        path = pin_file(folder, m)
        header = f"the coder lever's arm: {table.source} with the coder pinned to {m}"
        if not (path.is_file() and path.read_text(encoding="utf-8") == t.to_yaml(header)):
            t.write(path, header=header)
        out[m] = path
    return out


def draw(plan: assign.Plan, rng: np.random.Generator, run_id: str, records_dir: str | Path,
         at: str | None = None) -> tuple[str, dict[str, assign.Arm], dict[str, str]]:
    """One run's recorded draw, as the ``sage-run`` launcher makes it (32-bit uniforms per lever, the draw id,
    one whole line appended to ``records_dir/assignments.jsonl`` before the run starts): ``(draw id, arms, the
    run's environment)``, the environment each drawn arm's variables and ``SAGE_TRACE_ID`` = the draw id."""
    uniforms = {lever: int(rng.integers(0, assign.SCALE)) for lever in plan.levers}
    arms = assign.draw(plan, uniforms)
    did = assign.draw_id(uniforms, run_id.encode())
    Path(records_dir).mkdir(parents=True, exist_ok=True)
    assign.record(records_dir, plan, arms, did, at or datetime.now(timezone.utc).isoformat(timespec="seconds"))
    env = {k: v for a in arms.values() for k, v in a.env.items()}
    env["SAGE_TRACE_ID"] = did
    return did, arms, env


def lever_dir(ledger_path: str | Path) -> Path:
    """The coder lever's folder beside the ledger: ``plans/<id>/`` (every plan ever written, so an old draw
    still finds its plan) and ``pins/`` (the pinned models.yaml files)."""
    return Path(ledger_path).parent / LEVER_DIR


def save_plan(folder: str | Path, p: assign.Plan) -> dict:
    """Archive ``p`` under ``plans/``; its arms as the report shows them."""
    folder = Path(folder)
    assign.save_plan(folder / PLANS_DIR / p.id, p)
    return {"id": p.id, "arms": [{"arm": a.name, "candidate": a.candidate, "probability": a.probability,
                                  "SAGE_MODELS_YAML": a.env.get("SAGE_MODELS_YAML", "")} for a in p.levers[LEVER]]}


def load_plans(folder: str | Path) -> tuple[dict[str, assign.Plan], list[str]]:
    """Every archived plan by id, and the ones that could not be read (named)."""
    return assign.load_plans(Path(folder) / PLANS_DIR)


def bundle_arms(led: Ledger, pins: Mapping[str, str | Path], cfg: CoderDecisionsConfig | None = None
                ) -> list[tuple[str, str | None, float, str | None]]:
    """The coder's arms for the arms file a deployment bundle carries (``assign.save_lever_arms(path, 'coder',
    ...)``): each arm's part its pinned models.yaml (a path inside the data root, as given)."""
    return [(name, cid, p, str(pins[m])) for name, cid, p, m in arms_wanted(led, cfg)]


def save_merged(led: Ledger, path: str | Path | None = None) -> Path:
    """Save with this lever's candidates as ``led`` has them and every other lever's as the file has them now."""
    return led.save_lever(LEVER, path)
