"""The skills lever of the decision ledger: each rule a night proposes for one of SAGE's skills is a
candidate whose evidence is carried from night to night, from two streams, until the ledger decides.

**The candidate** (ledger lever ``skills``) is one change to the learned block of one skill
(:class:`RuleChange`). Its key is the skill path and the rule's normalised text (the caller's
normaliser: ``sleep.block.normalise_rule``, so the same rule in other case, spacing or bullet is the same
candidate): ``["<skill>", "<rule>"]`` for an added rule, with ``"replacing", "<anchor>"`` or ``"deleting",
"<anchor>"`` after it for the other operations. Proposing the same key again continues the same
candidate and its evidence (:func:`propose`); a key the ledger reverted or dropped is final and never
tested again (a fresh look would spend the level again on data that already spoke).

**What it was selected on** (``selected_on``): the train tasks the reflect step saw when it proposed the
rule (their ids, and ``content:<key>`` for what they ask: a task of another id asking the same is the same
task), every night it was proposed. They are never its evidence.

**Stream ``replay``** (:func:`add_replays`): each night, the candidate's tree (the live tree with the change)
is replayed on tonight's val tasks (drawn afresh each night by a hash of the date) beside the live tree;
each task is one observation, ``paired_difference`` of the two arms' mean *hard* pass (the verified share,
the unit of ``min_useful_gain``), unit id ``<night>/<task id>``. Left out and counted: a task it was
selected on; a unit already counted (the same night run twice); with a backend that does not draw fresh
answers, a task already judged for it (the same prompt gives the same answer: no new evidence). An
accepted candidate on probation is replayed the other way round: the live tree (with the rule) beside the
live tree without it.

**Stream ``online``** (:func:`add_online`): ``sage run``s assigned at random by the launcher
(:mod:`.assign`): a run is joined to its recorded draw by ``trace_id`` (the draw id the launcher exports as
``SAGE_TRACE_ID``); a run without a draw is not evidence and is counted. For a pending candidate ``c`` the
plan's arms are ``cand-<c>`` (its tree, committed to the skills root as a version that is not live) and
``live``; for one on probation ``live`` (with its rule) and ``prev-<c>`` (the live tree without it). One
observation per run, ``ipw_contrast`` of the run's verified outcome for (with the rule) minus (without),
with the draw's exact probabilities and a centre fixed before the run (the running mean of the earlier
runs' outcomes in this stream, after a prior of ``centre_prior_weight`` runs at ``centre_prior``). The
contrast is the draw's (intent to treat): a run that logged another version's shas than its arm's still
counts as drawn, and the caller counts it.

**Decisions** (:func:`decide_night`, the ledger's rule, once a night for every pending or accepted
candidate, with or without new evidence): pending -> accepted when its e-process against "no gain"
reaches ``1/alpha_j``; pending -> dropped when its confidence sequence lies below ``min_useful_gain`` or
after ``max_pending_nights``; accepted -> reverted on probation when its gain is excluded above
``min_useful_gain`` (a harmful rule, or a useless one: the learned block can shrink). The guarantee is the
ledger's (:func:`guarantee`): *the chance any rule without a gain is ever accepted, over every night and
every rule proposed, is at most alpha*.

**The next night's plan** (:func:`plan`): the skills lever's arms for the launcher: ``cand-<c>`` at
``pending_share`` for the pending candidate with the most evidence (its version committed but not made
live), ``prev-<c>`` at ``probation_share`` for the candidate accepted most recently, for
``probation_nights`` nights after its accept, and ``live`` for the rest. What randomising costs: the share
of runs on an arm that is not live (``pending_share`` on a rule that may not help, ``probation_share`` on
the tree without a rule that did); what it buys: each run on a 0.5 / 0.5 split is worth about a quarter
of a paired replay of a task, at any number of nights.

Pure: numpy, pydantic and the ledger; the trees, the versions and SAGE's journals are the caller's
(``sleep.sage_night``, ``sleep.sage_online``).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_pipeline.decisions import assign, evidence as ev
from sage_pipeline.decisions.ledger import LEDGER_NAME, Candidate, Ledger

LEVER = "skills"
REPLAY, ONLINE = "replay", "online"  # the candidate's evidence streams
UNITS = {REPLAY: "val tasks", ONLINE: "runs"}  # what one observation of a stream is, for the reader
LIVE_ARM = "live"
LEVER_DIR = "skills"  # beside the ledger: the plans, the launcher and its assignments.jsonl
PLANS_DIR = "plans"
OPS = ("add", "replace", "delete")


class SkillsLeverConfig(BaseModel):
    """How the skills lever spends its nights and runs (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidates_per_night: int = Field(4, ge=1, description="pending candidates replayed on val each night (the "
                                      "ones with the most evidence first, tonight's proposals among them); each "
                                      "costs one val replay")
    probation_replays: int = Field(1, ge=0, description="accepted candidates (the most recent) replayed each night "
                                   "without their rule, as probation evidence; each costs one val replay")
    pending_share: float = Field(0.5, gt=0.0, lt=1.0, description="the share of runs the launcher gives the pending "
                                 "candidate under online test (its version, not live)")
    probation_share: float = Field(0.1, gt=0.0, lt=1.0, description="the share of runs kept on the live tree "
                                   "without the rule accepted last, while it is on probation")
    probation_nights: int = Field(14, ge=1, description="nights after an accept that the launcher keeps its "
                                  "probation arm (the ledger keeps testing it on replays after that)")
    centre_prior: float = Field(0.5, ge=0.0, le=1.0, description="the online contrast's centre before any run: "
                                "the prior of the running mean of the runs' verified outcomes")
    centre_prior_weight: float = Field(1.0, gt=0.0, description="runs' worth of the centre's prior")

    @model_validator(mode="after")
    def _a_live_arm_remains(self) -> SkillsLeverConfig:
        if self.pending_share + self.probation_share >= 1.0:
            raise ValueError(f"pending_share {self.pending_share} + probation_share {self.probation_share} must leave "
                             "the live arm a share above 0")
        return self


# ---------------------------------------------------------------------------------------------- the candidate
@dataclass(frozen=True)
class RuleChange:
    """One change to the learned block of one skill: ``add`` the rule, ``replace`` the block's rule
    matching ``anchor`` by it, or ``delete`` the rule matching ``anchor``."""

    op: str
    skill: str
    rule: str = ""
    anchor: str = ""
    rationale: str = ""

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op {self.op!r}: a rule change is one of {', '.join(OPS)}")
        if not self.skill:
            raise ValueError("a rule change names its skill (its path, e.g. discipline/x/SKILL.md)")

    def key(self, normalise: Callable[[str], str]) -> str:
        """The ledger key: the skill path and the rule's normalised text (see the module doc)."""
        parts = [self.skill, normalise(self.rule) if self.op != "delete" else ""]
        if self.op == "replace":
            parts += ["replacing", normalise(self.anchor)]
        elif self.op == "delete":
            parts += ["deleting", normalise(self.anchor)]
        return json.dumps(parts, ensure_ascii=False)

    def describe(self) -> str:
        if self.op == "add":
            return f"add to {self.skill}: {self.rule!r}"
        if self.op == "replace":
            return f"replace in {self.skill}: {self.anchor!r} -> {self.rule!r}"
        return f"delete in {self.skill}: {self.anchor!r}"

    def to_payload(self) -> dict:
        return {"change": asdict(self)}

    @classmethod
    def from_payload(cls, payload: Mapping) -> RuleChange:
        return cls(**payload["change"])


def selected_units(tasks: Iterable[tuple[str, str]]) -> list[str]:
    """``selected_on`` of tasks given as (id, content key): each id and ``content:<key>``."""
    out: list[str] = []
    for tid, content in tasks:
        out += [tid] + ([f"content:{content}"] if content else [])
    return sorted(set(out))


def replay_unit(night: str, task_id: str) -> str:
    """A replayed task's unit id: one per (night, task)."""
    return f"{night}/{task_id}"


def unit_task(unit: str) -> str:
    return unit.split("/", 1)[1] if "/" in unit else unit


@dataclass
class Proposal:
    candidate: Candidate
    status: Literal["new", "continued", "final"]
    reason: str = ""


def propose(led: Ledger, change: RuleChange, *, night: str, normalise: Callable[[str], str],
            selected_on: Sequence[str] = ()) -> Proposal:
    """The candidate for ``change``: new, continued (the same key proposed again: its evidence carries on and
    tonight's selection joins ``selected_on``) or final (reverted or dropped before: not tested again)."""
    key = change.key(normalise)
    old = led.find(LEVER, key)
    if old is not None and old.state in ("reverted", "dropped"):
        last = old.history[-1]
        return Proposal(old, "final", f"{old.id} was {old.state} on {last.night} ({last.reason}); a decided rule is "
                        "never tested again")
    c, new = led.propose(LEVER, key, night=night, description=change.describe(), payload=change.to_payload(),
                         selected_on=selected_on)
    return Proposal(c, "new" if new else "continued",
                    f"{c.id}: proposed again, its evidence carries on" if not new else f"{c.id}: a new candidate "
                    f"(index {c.index}, level {c.alpha:.3g})")


# ---------------------------------------------------------------------------------------------- evidence
@dataclass(frozen=True)
class Replay:
    """One val task replayed in both arms: the hard pass of each replay (``with_rule``: the tree with the
    change; ``without``: the tree without it)."""

    task_id: str
    content: str
    with_rule: tuple[float, ...]
    without: tuple[float, ...]


def add_replays(led: Ledger, cid: str, night: str, replays: Sequence[Replay], *, fresh: bool) -> dict:
    """Tonight's paired replays as ``replay`` evidence of candidate ``cid`` (see the module doc); returns
    ``{"added", "left_out": {reason: n}}``."""
    c = led.get(cid)
    selected = set(c.selected_on)
    seen = set(c.judged_on.get(REPLAY, ()))
    seen_tasks = {unit_task(u) for u in seen}
    left: Counter = Counter()
    keep: list[Replay] = []
    for r in replays:
        unit = replay_unit(night, r.task_id)
        if r.task_id in selected or (r.content and f"content:{r.content}" in selected):
            left["selected on (reflect saw it, or a task asking the same)"] += 1
        elif unit in seen:
            left["already counted (this night was run before)"] += 1
        elif not fresh and r.task_id in seen_tasks:
            left["judged before by a backend that does not draw fresh answers (the same answers again)"] += 1
        elif not r.with_rule or not r.without:
            left["not replayed in both arms"] += 1
        else:
            keep.append(r)
    added = 0
    if keep:
        x, lo, hi = ev.paired_difference([float(np.mean(r.with_rule)) for r in keep],
                                         [float(np.mean(r.without)) for r in keep])
        added = led.add_evidence(cid, REPLAY, x, lo, hi, [replay_unit(night, r.task_id) for r in keep])
    return {"added": added, "left_out": dict(left)}


@dataclass(frozen=True)
class LiveRun:
    """One ``sage run`` read from SAGE's journals: its trace id, whether it was verified (0/1) and, when the
    caller could tell, whether its shas were those of its drawn arm's version (None: not checked)."""

    trace_id: str
    verified: float
    saw_its_arm: bool | None = None


def _arms(plan: assign.Plan) -> dict[str, assign.Arm]:
    return {a.name: a for a in plan.levers.get(LEVER, ())}


def contrast_arms(plan: assign.Plan, cid: str) -> tuple[str, str] | None:
    """(the arm with the rule, the arm without) of ``plan`` for candidate ``cid``, or None when the plan has
    no arm for it."""
    arms = _arms(plan)
    if f"cand-{cid}" in arms and LIVE_ARM in arms:
        return f"cand-{cid}", LIVE_ARM
    if f"prev-{cid}" in arms and LIVE_ARM in arms:
        return LIVE_ARM, f"prev-{cid}"
    return None


def add_online(led: Ledger, runs: Sequence[LiveRun], draws: Mapping[str, dict], plans: Mapping[str, assign.Plan],
               cfg: SkillsLeverConfig | None = None) -> dict:
    """Randomised runs as ``online`` evidence of every pending or accepted candidate whose plan gave it arms
    (``draws``: :func:`assign.read_records`'s, by draw id; ``plans`` by id). Returns the counts: runs with a
    draw, left out by reason (a run without a draw is not evidence), and per candidate what was added."""
    cfg = cfg or SkillsLeverConfig()
    out: dict = {"runs": len(runs), "with_draw": 0, "left_out": Counter(), "candidates": {}}
    usable = []
    for run in runs:
        d = draws.get(run.trace_id) if run.trace_id else None
        if d is None:
            out["left_out"]["no recorded draw (not randomised: not evidence)"] += 1
            continue
        arm = d["levers"].get(LEVER)
        if arm is None or d["plan"] not in plans:
            out["left_out"]["a draw without a skills arm"] += 1
            continue
        if run.saw_its_arm is False:
            out["left_out"]["saw another version than its arm's (counted as drawn: intent to treat)"] += 1
        usable.append((str(d.get("at") or ""), run.trace_id, float(run.verified), plans[d["plan"]], arm))
    out["with_draw"] = len(usable)
    usable.sort(key=lambda u: (u[0], u[1]))
    for c in led.of(LEVER, "pending", "accepted"):
        done = set(c.judged_on.get(ONLINE, ()))
        s, n = c.payload.get("online_centre", [cfg.centre_prior * cfg.centre_prior_weight, cfg.centre_prior_weight])
        xs, los, his, units = [], [], [], []
        skipped = Counter()
        for _, tid, y, plan, drawn in usable:
            pair = contrast_arms(plan, c.id)
            if pair is None:
                skipped["its plan had no arm for it"] += 1
                continue
            if tid in done:
                skipped["already counted"] += 1
                continue
            arms = _arms(plan)
            centre = s / n
            x, lo, hi = ev.ipw_contrast([y], [drawn["arm"] == pair[0]], [drawn["arm"] == pair[1]],
                                        [arms[pair[0]].probability], [arms[pair[1]].probability], [centre])
            xs.append(float(x[0]))
            los.append(float(lo[0]))
            his.append(float(hi[0]))
            units.append(tid)
            s, n = s + y, n + 1
        added = led.add_evidence(c.id, ONLINE, xs, los, his, units) if units else 0
        if added:
            c.payload["online_centre"] = [s, n]
        out["candidates"][c.id] = {"added": added, "left_out": dict(skipped)}
    out["left_out"] = dict(out["left_out"])
    return out


# ---------------------------------------------------------------------------------------------- decisions
def _order(led: Ledger, c: Candidate) -> tuple:
    st = led.standing(c.id)
    return (c.state != "accepted", -(st["estimate"] if st["estimate"] is not None else -math.inf), c.index)


def decide_night(led: Ledger, night: str, skip: Iterable[str] = ()) -> list[dict]:
    """The ledger's decision for every pending or accepted candidate of the lever tonight (accepted ones
    first, so a revert is known before an accept is applied; then pending ones by estimate, highest first:
    the order in which accepts are applied). ``skip``: candidates not decided tonight. Returns the
    transitions: ``{id, from, to, reason}``."""
    out = []
    skip = set(skip)
    for c in sorted(led.of(LEVER, "pending", "accepted"), key=lambda c: _order(led, c)):
        if c.id in skip:
            continue
        before = c.state
        new = led.decide(c.id, night)
        if new:
            out.append({"id": c.id, "from": before, "to": new, "reason": c.history[-1].reason})
    return out


def _more(need: float) -> str:
    return f"about {int(need)} more" if np.isfinite(need) else "no end in sight"


def standing_line(led: Ledger, c: Candidate) -> str:
    """Where the candidate stands, for the reader: "pending: evidence 3.1 of the 40 needed, about N more val
    tasks (or M more runs) at the current effect"; on probation the same against a gain of
    ``min_useful_gain``."""
    st = led.standing(c.id)
    cfg = led.config
    if c.state == "pending":
        log_now = np.array([math.log(max(st["evidence"], 1e-300))])
        parts = []
        for name in c.streams:
            s = led.stream(c, "streams", name)
            need = ev.observations_needed(log_now, st["needed"], ev.growth_per_observation(s, 0.0))[0]
            parts.append(f"{_more(need)} {UNITS.get(name, name)} ({int(s.n[0])} so far)")
        est = "" if st["estimate"] is None else f" (estimate {st['estimate']:+.3f})"
        return (f"pending: evidence {st['evidence']:.1f} of the {st['needed']:.0f} needed, "
                + (" or ".join(parts) + " at the current effect" if parts else "no evidence yet") + est)
    if c.state == "accepted":
        if st.get("revert_evidence") is None:
            return (f"accepted, on probation: no evidence since the accept yet (a revert needs "
                    f"{st['revert_needed']:.0f} against a gain of {cfg.min_useful_gain})")
        log_now = np.array([math.log(max(st["revert_evidence"], 1e-300))])
        parts = []
        for name in c.probation:
            s = led.stream(c, "probation", name)
            need = ev.observations_needed(log_now, st["revert_needed"],
                                          ev.growth_per_observation(s, cfg.min_useful_gain, side="minus"))[0]
            parts.append(f"{_more(need)} {UNITS.get(name, name)} ({int(s.n[0])} so far)")
        return (f"accepted, on probation: evidence against a gain of {cfg.min_useful_gain} is "
                f"{st['revert_evidence']:.1f} of the {st['revert_needed']:.0f} a revert needs; "
                + " or ".join(parts) + " at the current effect would revert it")
    return f"{c.state}: {c.history[-1].reason}"


def row(led: Ledger, c: Candidate) -> dict:
    """The diagnostics' row of a candidate: state, estimate and interval, evidence of needed, the standing
    line and why its last transition happened."""
    st = led.standing(c.id)
    lo, hi = st["ci"]
    return {"id": c.id, "change": c.description, "key": c.key, "state": c.state, "index": c.index,
            "alpha": c.alpha, "estimate": st["estimate"], "interval": [lo, hi], "evidence": st["evidence"],
            "needed": st["needed"], "revert_evidence": st["revert_evidence"], "observations": {
                name: int(led.stream(c, "streams", name).n[0]) for name in c.streams},
            "standing": standing_line(led, c), "nights": len({r.night for r in c.nights}),
            "history": [{"night": t.night, "state": t.state, "reason": t.reason} for t in c.history],
            "version": c.payload.get("version"), "staged": c.payload.get("staged")}


def guarantee(led: Ledger) -> str:
    cfg = led.config
    return (f"the chance any skill rule without a gain is ever accepted, over every night and every rule proposed, "
            f"is at most {cfg.alpha} (rule j at alpha/(j(j+1)), each an e-process valid at every night); an "
            f"accepted rule is reverted when its gain is excluded above {cfg.min_useful_gain} (harmful or useless), "
            f"and a rule that truly gains {cfg.min_useful_gain} or more is ever reverted with chance at most "
            f"{cfg.revert_alpha}")


# ---------------------------------------------------------------------------------------------- the plan
def _nights_since_accept(c: Candidate) -> int:
    """Nights decided since the accept (its own night's row is the first with state accepted)."""
    return max(0, sum(r.state == "accepted" for r in c.nights) - 1)


def arms_wanted(led: Ledger, cfg: SkillsLeverConfig | None = None) -> list[tuple[str, str]]:
    """The arms the next plan should have besides ``live``: ``("cand", id)`` for the pending candidate with the
    most evidence, ``("prev", id)`` for the candidate accepted most recently while on probation."""
    cfg = cfg or SkillsLeverConfig()
    out = []
    pending = led.of(LEVER, "pending")
    if pending:
        best = max(pending, key=lambda c: (led.standing(c.id)["evidence"], -c.index))
        out.append(("cand", best.id))
    recent = [c for c in led.of(LEVER, "accepted") if _nights_since_accept(c) < cfg.probation_nights]
    if recent:
        last = max(recent, key=lambda c: (next(t.at for t in reversed(c.history) if t.state == "accepted"), c.index))
        out.append(("prev", last.id))
    return out


def plan(live_root: str, versions: Mapping[tuple[str, str], str], cfg: SkillsLeverConfig | None = None,
         note: str = "") -> assign.Plan:
    """The skills lever's plan: ``live`` (``SAGE_SKILLS_ROOT`` = ``live_root``, the live version's folder) and,
    for each ``(kind, candidate id) -> version folder`` of ``versions`` (:func:`arms_wanted`, staged by the
    caller), its arm at ``pending_share`` (cand) or ``probation_share`` (prev)."""
    cfg = cfg or SkillsLeverConfig()
    arms = []
    for (kind, cid), folder in versions.items():
        share = cfg.pending_share if kind == "cand" else cfg.probation_share
        arms.append((f"{kind}-{cid}", cid, share, {"SAGE_SKILLS_ROOT": str(folder)}))
    rest = 1.0 - sum(a[2] for a in arms)
    if rest <= 0:
        raise ValueError(f"the arms' shares sum to {1 - rest:.3f}: the live arm needs a share above 0")
    return assign.make_plan({LEVER: [(LIVE_ARM, None, rest, {"SAGE_SKILLS_ROOT": str(live_root)}), *arms]}, note)


def lever_dir(ledger_path: str | Path) -> Path:
    """The skills lever's folder beside the ledger: ``plans/<id>.json`` (every plan ever written, so an old
    draw still finds its plan), the launcher ``sage-run``, its plan and its ``assignments.jsonl``."""
    return Path(ledger_path).parent / LEVER_DIR


def save_plan(folder: str | Path, p: assign.Plan, launcher: bool = True, sage: str = "sage") -> dict:
    """Archive ``p`` under ``plans/`` and, with ``launcher``, write the launcher that draws from it."""
    folder = Path(folder)
    assign.save_plan(folder / PLANS_DIR / p.id, p)
    out = {"id": p.id, "arms": [{"arm": a.name, "candidate": a.candidate, "probability": a.probability,
                                 "SAGE_SKILLS_ROOT": a.env.get("SAGE_SKILLS_ROOT", "")} for a in p.levers[LEVER]],
           "plans": str(folder / PLANS_DIR)}
    if launcher:
        out["launcher"] = str(assign.write_launcher(folder, p, sage))
        out["records"] = str(folder / assign.RECORDS_NAME)
    return out


def load_plans(folder: str | Path) -> tuple[dict[str, assign.Plan], list[str]]:
    """Every archived plan by id, and the ones that could not be read (named)."""
    return assign.load_plans(Path(folder) / PLANS_DIR)


def save_merged(led: Ledger, path: str | Path | None = None) -> Path:
    """Save the ledger with this lever's candidates as ``led`` has them and every other lever's as the file
    has them now (another lever may have saved meanwhile), under ``<ledger>.lock``."""
    return led.save_lever(LEVER, path)


def ledger_path(data_root: str | Path) -> Path:
    """The ledger of every lever under the artifact root: ``<data>/decisions/ledger.json``."""
    return Path(data_root) / "decisions" / LEDGER_NAME
