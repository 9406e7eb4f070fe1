"""The online check of SAGE's skills: after a night's edit is deployed, SAGE's own journals say whether runs
that saw it were verified as often as runs that saw the text it replaced; an edit that hurts beyond chance
is rolled back.

**Which version each run saw.** SAGE logs ``SKILL_INJECTION`` for every role call that got skills
(``prompt_engine/skill_injector.py``), with each skill's ``content_sha256_16``; ``sage run`` sets a fresh
``SAGE_SESSION_ID`` per run, so the role's event of a session says which text of each skill its call saw
(:func:`runs_from_events`). :meth:`~sage_pipeline.sleep.sage_skills.SageSkillsRoot.sha_index` maps a sha to
the root's versions whose skill has it (a sha of no version of the root, e.g. a SAGE that ran without
``SAGE_SKILLS_ROOT`` on an edited tree, is shown as unknown).

**Whether the run was verified** is read as the routing chain reads it
(:func:`sage_pipeline.routing.task_outcomes.task_outcomes` on the journals' ingest): SAGE's gate passed
each of the session's tasks (verified), its circuit breaker ended one (not verified), or the journal ends
first (unknown: counted and left out, never a failure). A run is verified when every task of it with a
known outcome was, and it has at least one.

**Per skill text** (skill id, sha) the report gives the runs, the verified share and a Wilson interval at
``1 - alpha``. **Per edit** (every ``commit`` of the root's history: the nights' edits; rollbacks are not
checked, so a rollback is never undone by this check) and each skill it changed whose live text is still
the edit's, the runs that saw the edit's text are compared with the runs that saw its parent's text by a
one-sided Fisher exact test of "the edit's verified share is lower" (exact at any number of runs), at
level ``alpha`` divided by the number of edits checked (Bonferroni: on a day when no live edit hurts, the
check rolls back anything with probability at most ``alpha``). Decisions:

* ``harmful``: p at or under the level. When the skill's live text is still the edit's, it is rolled back
  (:meth:`SageSkillsRoot.rollback` to the parent's text, with the reason); otherwise the report says the
  edit was already replaced.
* ``cannot_tell``: the edit's share is lower but p is over the level; the report gives the runs per version
  a test at this level would need (power ``power``, normal approximation) to resolve the observed drop.
* ``no_harm``: the edit's share is at or above its parent's.
* ``no_runs``: no run saw the edit's text, or none saw its parent's.
* ``replaced``: a later edit or a rollback replaced the edit's text (listed, not tested).

Limits, stated: the arms are different days (a before/after comparison, not a randomised one: a day of
harder goals reads as harm); checking again every day looks at the same edit many times, so the level
holds per check, not over all the days of an edit's life. That is :func:`check`, the ``per_night`` check.

**Ledger mode** (:func:`check_ledger`, the night's ``decisions="ledger"``): the runs that the launcher
assigned at random (``decisions/skills/sage-run``: a recorded draw with its exact probability per ``sage
run``, joined to the run by its ``trace_id``) are fed to the decision ledger as each pending or accepted
candidate's ``online`` evidence (:func:`sage_pipeline.decisions.skills.add_online`: the randomised contrast
of the arms with and without the rule), and the night decides on it with its replays: no day is compared
with another and nothing is rolled back here. A run without a recorded draw is not evidence, and is
counted; a run whose logged shas are not its arm's version's is counted (it still counts as drawn). When no
assignment record exists yet (no launcher deployed), the day-vs-day check above is the fallback, labelled
"compares days, not randomised" in the report; a rollback it makes reverts the ledger's candidate.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.decisions import assign, skills as lever_skills
from sage_pipeline.decisions.ledger import Ledger
from sage_pipeline.sage import skills as sk
from sage_pipeline.sleep.sage_skills import SageSkillsRoot, SkillsRootError, journal_injections

ONLINE_DIR = "online"
DECISIONS = ("harmful", "cannot_tell", "no_harm", "no_runs", "replaced")


class OnlineCheckConfig(BaseModel):
    """How the online check reads SAGE's journals and decides (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    alpha: float = Field(0.05, gt=0.0, lt=0.5, description="the check's level: on a day when no edit hurts, it "
                         "rolls back anything with probability at most alpha (split evenly over the edits checked)")
    power: float = Field(0.8, gt=0.0, lt=1.0, description="the power at which a check that cannot tell reports the "
                         "runs it would need")
    apply_rollbacks: bool = Field(True, description="roll a harmful edit back (else only report it)")


@dataclass(frozen=True)
class Run:
    """One ``sage run``: its session, whether it was verified (None: unknown), the text (sha) of each skill
    the role's call saw, and where SAGE logged it."""

    session_id: str
    verified: float | None
    shas: dict[str, str]
    where: str = ""
    trace_id: str = ""  # SAGE_TRACE_ID as SAGE logged it: the launcher's draw id, when the run was assigned


@dataclass
class RunsRead:
    runs: list[Run] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # what was left out, by reason
    problems: list[str] = field(default_factory=list)  # SKILL_INJECTION lines that could not be used (first 20)
    folders: list[str] = field(default_factory=list)


def run_verdicts(outcomes: pd.DataFrame) -> dict[str, float | None]:
    """Session id -> 1.0 (every task with a known outcome verified), 0.0 (one was not), None (none known),
    from :func:`~sage_pipeline.routing.task_outcomes.task_outcomes`'s frame (``session_id``, ``verified``)."""
    if outcomes.empty:
        return {}
    v = outcomes["verified"].astype(float)
    known = v.notna()
    g = pd.DataFrame({"s": outcomes["session_id"].astype(str), "v": v, "k": known})
    agg = g.groupby("s", sort=False).agg(known=("k", "sum"), low=("v", "min"))
    return {s: (None if row.known == 0 else float(row.low)) for s, row in agg.iterrows()}


def runs_from_events(events: Iterable[sk.InjectionEvent], verdicts: dict[str, float | None], role: str
                     ) -> RunsRead:
    """The runs whose ``role`` call SAGE logged skills for, each with its verdict: sessions whose verdict is
    unknown, or not in ``verdicts``, and a skill seen with two texts in one session are counted, not used."""
    out = RunsRead()
    by_session: dict[str, dict[str, set[str]]] = {}
    where: dict[str, str] = {}
    traces: dict[str, str] = {}
    for e in events:
        if e.agent_role != role:
            continue
        if not e.session_id:
            out.counts["role events without a session id (not written by `sage run`)"] += 1
            continue
        shas = by_session.setdefault(e.session_id, {})
        where.setdefault(e.session_id, f"{e.source}:{e.line}")
        if e.trace_id:
            traces.setdefault(e.session_id, e.trace_id)
        for sid, h in e.shas.items():
            shas.setdefault(sid, set()).add(h)
    for sid_, shas in by_session.items():
        if sid_ not in verdicts:
            out.counts["sessions with no workflow outcome (no task reached SAGE's gate or breaker)"] += 1
            continue
        if verdicts[sid_] is None:
            out.counts["sessions whose outcome is unknown (the journal ends first)"] += 1
            continue
        mixed = [s for s, hs in shas.items() if len(hs) > 1]
        if mixed:
            out.counts["skills seen with two texts in one session (left out of that run)"] += len(mixed)
        out.runs.append(Run(sid_, verdicts[sid_], {s: next(iter(hs)) for s, hs in shas.items() if len(hs) == 1},
                            where[sid_], traces.get(sid_, "")))
    return out


def runs_from_journals(folders: Sequence[str | os.PathLike[str]], role: str, clock_scale: float = 1.0,
                       log: Callable[[str], None] = lambda m: None) -> RunsRead:
    """The runs in SAGE's journal folders (each searched as the trajectories ingest searches it; a journal
    file stands for its folder) with ``role``'s ``SKILL_INJECTION`` events and their outcomes (the ingest and
    ``task_outcomes``, in a scratch folder; ``clock_scale``: task_outcomes', which changes no verdict)."""
    from sage_pipeline.routing.ingest import IngestConfig, ingest
    from sage_pipeline.routing.task_outcomes import TaskOutcomeConfig, task_outcome_files

    dirs = sorted({str(Path(f).parent if Path(f).is_file() else Path(f)) for f in folders})
    missing = [d for d in dirs if not Path(d).is_dir()]
    dirs = [d for d in dirs if Path(d).is_dir()]
    if not dirs:
        out = RunsRead()
        out.counts["journal folders not found"] += len(missing)
        return out
    inj = journal_injections(dirs)
    with tempfile.TemporaryDirectory(prefix="sage-online-") as tmp:
        res = ingest(IngestConfig(dirs), tmp, progress=log)
        frame = task_outcome_files(res.trajectories, res.routing_decisions, res.token_usage,
                                   Path(tmp) / "task_outcomes.parquet", TaskOutcomeConfig(clock_scale=clock_scale),
                                   agent_insights=res.agent_insights).frame
    out = runs_from_events(inj.events, run_verdicts(frame), role)
    out.problems, out.folders = inj.problems[:20], dirs
    if inj.problems:
        out.counts["SKILL_INJECTION lines that could not be used"] += len(inj.problems)
    if missing:
        out.counts["journal folders not found"] += len(missing)
    log(f"online check: {len(out.runs)} runs with the {role}'s skills and a known outcome in {len(dirs)} "
        f"folder(s); left out: {dict(out.counts)}")
    return out


# ---------------------------------------------------------------------------------------------- statistics
def wilson(k: np.ndarray, n: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score intervals of ``k`` successes in ``n`` trials at confidence ``level`` (vectorised;
    (nan, nan) where n = 0)."""
    k, n = np.asarray(k, float), np.asarray(n, float)
    z = NormalDist().inv_cdf(0.5 + level / 2)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        centre = (p + z * z / (2 * n)) / (1 + z * z / n)
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)


def harm_p_value(k_new: int, n_new: int, k_old: int, n_old: int) -> float:
    """One-sided Fisher exact p-value of "the new text's verified share is lower than the old one's"."""
    from scipy.stats import fisher_exact

    return float(fisher_exact([[k_new, n_new - k_new], [k_old, n_old - k_old]], alternative="less")[1])


def runs_needed(p_old: float, p_new: float, level: float, power: float) -> int | None:
    """Runs per version a one-sided two-proportion test at ``level`` would need to resolve a drop from
    ``p_old`` to ``p_new`` with probability ``power`` (normal approximation); None when there is no drop."""
    drop = p_old - p_new
    if drop <= 1e-12:
        return None
    za, zb = NormalDist().inv_cdf(1 - level), NormalDist().inv_cdf(power)
    bar = (p_old + p_new) / 2
    n = (za * math.sqrt(2 * bar * (1 - bar)) + zb * math.sqrt(p_old * (1 - p_old) + p_new * (1 - p_new))) ** 2
    return max(2, math.ceil(n / drop ** 2))


# ---------------------------------------------------------------------------------------------- the check
@dataclass
class OnlineReport:
    """Per skill text its runs and verified share; per edit the decision; the rollbacks made."""

    role: str
    date: str
    alpha: float
    level: float | None = None  # per edit (alpha / edits checked)
    runs: int = 0
    left_out: dict = field(default_factory=dict)
    texts: list[dict] = field(default_factory=list)  # skill, sha, versions, runs, verified, share, low, high
    edits: list[dict] = field(default_factory=list)  # one per (edit, skill): the comparison and the decision
    rollbacks: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    path: str = ""
    mode: str = "per_night"  # per_night | ledger | per_night fallback: compares days, not randomised
    randomised: dict = field(default_factory=dict)  # ledger mode: the runs fed to the ledger and what was left out

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        if self.mode == "ledger":
            x = self.randomised
            added = ", ".join(f"{cid} +{v['added']}" for cid, v in x.get("candidates", {}).items() if v["added"])
            return (f"{self.runs} run(s) read, {x.get('with_draw', 0)} with a recorded random draw (the rest are not "
                    f"evidence); fed to the ledger: {added or 'nothing new'}")
        if self.mode != "per_night":
            return f"{self.mode}: " + self._per_night_summary()
        return self._per_night_summary()

    def _per_night_summary(self) -> str:
        if not self.edits:
            return f"{self.runs} run(s) read; no edit of the skills root to check yet"
        c = Counter(e["decision"] for e in self.edits)
        s = f"{self.runs} run(s) read; edits checked: " + ", ".join(f"{n} {d}" for d, n in c.items())
        if self.rollbacks:
            s += "; rolled back: " + ", ".join(f"{r['skill']} to {r['to_version']}" for r in self.rollbacks)
        return s


def _texts(root: SageSkillsRoot, runs: RunsRead, cfg: OnlineCheckConfig, rep: OnlineReport, seq: dict[str, int]
           ) -> dict[tuple[str, str], list[float]]:
    """Per skill text (skill id, sha) its runs' verdicts; the report's ``texts`` table."""
    index = root.sha_index()
    counts: dict[tuple[str, str], list[float]] = {}
    for r in runs.runs:
        for sid, h in r.shas.items():
            counts.setdefault((sid, h), []).append(float(r.verified))
    keys = sorted(counts, key=lambda k: (k[0], -len(counts[k])))
    k = np.array([sum(counts[x]) for x in keys])
    n = np.array([len(counts[x]) for x in keys])
    low, high = wilson(k, n, 1 - cfg.alpha)
    for i, (sid, h) in enumerate(keys):
        rep.texts.append({"skill": sid, "sha16": h, "versions": _label(seq, index.get(sid, {}).get(h, [])),
                          "runs": int(n[i]), "verified": int(k[i]), "share": float(k[i] / n[i]),
                          "low": float(low[i]), "high": float(high[i])})
    return counts


def _label(root_seq: dict[str, int], versions: Sequence[str]) -> str:
    return ", ".join(f"v{root_seq[v]}={v}" if v in root_seq else v for v in versions) or "unknown (no version of " \
                                                                                         "this root)"


def check(root: SageSkillsRoot, runs: RunsRead, config: OnlineCheckConfig | None = None, *, date: str,
          role: str = "coder", log: Callable[[str], None] = lambda m: None, write: bool = True) -> OnlineReport:
    """The online check of ``root``'s edits on ``runs`` (``role``'s calls: :func:`runs_from_journals`; see the
    module doc); rolls back what it finds harmful (``config.apply_rollbacks``) and writes the report to
    ``<root>/online/<date>.json``."""
    cfg = config or OnlineCheckConfig()
    rep = OnlineReport(role, date, cfg.alpha, runs=len(runs.runs), left_out=dict(runs.counts))
    history = root.versions()
    seq = {}
    for e in history:
        seq.setdefault(e.version, e.seq)
    counts = _texts(root, runs, cfg, rep, seq)
    live = root.shas()
    pairs = [(e, sid) for e in history if e.action == "commit" and e.parent for sid in e.changed
             if sid in sk.INJECTED_IDS]
    if not pairs:
        rep.notes.append("no night's edit in the root's history yet: nothing to check")
        return _written(root, rep, write)
    checked = [(e, sid) for e, sid in pairs if live.get(sid) == root.sha16(e.version, sid)]
    rep.level = cfg.alpha / len(checked) if checked else None
    for e, sid in pairs:
        new, old = root.sha16(e.version, sid), root.sha16(e.parent, sid)
        vn, vo = counts.get((sid, new), []), counts.get((sid, old), [])
        kn, nn, ko, no = int(sum(vn)), len(vn), int(sum(vo)), len(vo)
        row = {"version": f"v{e.seq}={e.version}", "parent": _label(seq, [e.parent]), "skill": sid,
               "reason": e.reason[:200], "runs_new": nn, "verified_new": kn, "runs_parent": no,
               "verified_parent": ko, "share_new": kn / nn if nn else None, "share_parent": ko / no if no else None,
               "p_value": None, "level": rep.level, "needed_runs": None, "decision": "", "action": ""}
        if (e, sid) not in checked:
            row["decision"], row["level"] = "replaced", None
            row["action"] = "the skill's live text is no longer this edit's (a later edit or a rollback replaced it)"
        elif not nn or not no:
            row["decision"] = "no_runs"
            row["action"] = (f"no run saw {'the edit' if not nn else 'its parent'}'s text of this skill yet: the "
                             "check needs runs of both")
        else:
            p = harm_p_value(kn, nn, ko, no)
            row["p_value"] = p
            if kn / nn >= ko / no:
                row["decision"], row["action"] = "no_harm", "the edit's verified share is at or above its parent's"
            elif p > rep.level:
                need = runs_needed(ko / no, kn / nn, rep.level, cfg.power)
                row["decision"], row["needed_runs"] = "cannot_tell", need
                row["action"] = (f"lower ({kn}/{nn} vs {ko}/{no}) but within chance (p = {p:.3g} > {rep.level:.3g}); "
                                 f"a drop this size needs about {need} runs per version to resolve")
            else:
                row["decision"] = "harmful"
                row["action"] = _roll_back(root, e, sid, new, row, rep, cfg, p, log)
        rep.edits.append(row)
    return _written(root, rep, write)


def _roll_back(root: SageSkillsRoot, e, sid: str, new: str, row: dict, rep: OnlineReport,
               cfg: OnlineCheckConfig, p: float, log: Callable[[str], None]) -> str:
    what = (f"verified {row['verified_new']}/{row['runs_new']} with the edit vs {row['verified_parent']}/"
            f"{row['runs_parent']} with its parent's text (one-sided Fisher p = {p:.3g} <= {rep.level:.3g})")
    if root.shas().get(sid) != new:  # another rollback tonight already put back an older text
        return f"harmful ({what}), but the skill's live text is no longer the edit's: nothing to roll back"
    if not cfg.apply_rollbacks:
        return f"harmful ({what}); not rolled back (apply_rollbacks is off)"
    reason = f"online check {rep.date}: v{e.seq}={e.version}'s edit of {sid} hurt: {what}"
    try:
        entry = root.rollback(sid, e.parent, reason)
    except (SkillsRootError, sk.SkillsError, OSError) as exc:
        return f"harmful ({what}); the rollback failed: {exc}"
    rep.rollbacks.append({"skill": sid, "from_version": e.version, "to_version": entry.version, "seq": entry.seq,
                          "reason": reason})
    log(f"online check: rolled {sid} back to {e.parent}'s text as version {entry.version} (v{entry.seq}): {what}")
    return f"rolled back as version {entry.version} (v{entry.seq}): {what}"


def _written(root: SageSkillsRoot, rep: OnlineReport, write: bool) -> OnlineReport:
    if write:
        rep.path = str(artifacts.write_json(root.folder / ONLINE_DIR / f"{rep.date}.json", rep.to_dict()))
    return rep


# ---------------------------------------------------------------------------------------------- ledger mode
FALLBACK = "per_night fallback: compares days, not randomised"


def _arm_shas(root: SageSkillsRoot, plans: dict[str, assign.Plan]) -> dict[str, dict[str, str]]:
    """Each arm's version id (the folder its SAGE_SKILLS_ROOT names) -> the shas SAGE logs for its skills."""
    out: dict[str, dict[str, str]] = {}
    for p in plans.values():
        for a in p.levers.get(lever_skills.LEVER, ()):
            vid = Path(a.env.get("SAGE_SKILLS_ROOT", "")).name
            if vid and vid not in out:
                try:
                    files = root.files(vid)
                except (SkillsRootError, OSError):
                    continue
                out[vid] = {s: sk.sha16(sk.sage_text(files[s])) for s in sk.INJECTED_IDS}
    return out


def _arm_version(plan: assign.Plan, arm: str) -> str:
    a = next((x for x in plan.levers.get(lever_skills.LEVER, ()) if x.name == arm), None)
    return Path(a.env.get("SAGE_SKILLS_ROOT", "")).name if a is not None else ""


def check_ledger(root: SageSkillsRoot, runs: RunsRead, ledger: str | os.PathLike[str],
                 config: OnlineCheckConfig | None = None, *, date: str, role: str = "coder",
                 log: Callable[[str], None] = lambda m: None, write: bool = True,
                 lever: lever_skills.SkillsLeverConfig | None = None) -> OnlineReport:
    """The online check in ledger mode (see the module doc): the randomised runs fed to the ledger at ``ledger``
    (saved), or, with no assignment record yet, :func:`check` as the fallback (labelled so). The report is
    written to ``<root>/online/<date>.json``."""
    cfg = config or OnlineCheckConfig()
    folder = lever_skills.lever_dir(ledger)
    records = folder / assign.RECORDS_NAME
    plans, bad_plans = lever_skills.load_plans(folder)
    draws, bad = assign.read_records(records, plans)
    if not draws:
        rep = check(root, runs, cfg, date=date, role=role, log=log, write=False)
        rep.mode = FALLBACK
        rep.notes.insert(0, f"no recorded random assignment in {records}: the day-vs-day check decides instead "
                         "(it compares days, not randomised arms: a harder day reads as harm); start `sage run` "
                         f"through {folder / assign.LAUNCHER_NAME} so the ledger judges on randomised runs")
        if bad or bad_plans:
            rep.notes.append(f"{len(bad)} assignment line(s) and {len(bad_plans)} plan(s) could not be read: "
                             + "; ".join((bad + bad_plans)[:3]))
        if rep.rollbacks:
            _revert_rolled_back(ledger, rep, date)
        return _written(root, rep, write)
    rep = OnlineReport(role, date, cfg.alpha, runs=len(runs.runs), left_out=dict(runs.counts), mode="ledger")
    seq = {}
    for e in root.versions():
        seq.setdefault(e.version, e.seq)
    _texts(root, runs, cfg, rep, seq)
    shas = _arm_shas(root, plans)
    live_runs = []
    for r in runs.runs:
        d = draws.get(r.trace_id) if r.trace_id else None
        saw = None
        arm = (d or {}).get("levers", {}).get(lever_skills.LEVER)
        if arm is not None and d["plan"] in plans:
            expected = shas.get(_arm_version(plans[d["plan"]], arm["arm"]))
            if expected is not None:
                saw = all(expected.get(s) == h for s, h in r.shas.items() if s in expected)
        live_runs.append(lever_skills.LiveRun(r.trace_id, float(r.verified), saw))
    led = Ledger.load(ledger)
    out = lever_skills.add_online(led, live_runs, draws, plans, lever)
    lever_skills.save_merged(led, ledger)
    rep.randomised = {**out, "records": str(records), "plans": len(plans), "unreadable": (bad + bad_plans)[:20],
                      "standing": [lever_skills.row(led, c) for c in led.of(lever_skills.LEVER, "pending", "accepted")]}
    rep.notes.append("randomised: each run's arm is its recorded draw (exact probability), joined by trace_id; the "
                     "ledger decides at the night, on these runs and its replays")
    log(f"online check (ledger): {out['with_draw']} of {len(runs.runs)} runs with a recorded draw; "
        + ", ".join(f"{cid} +{v['added']}" for cid, v in out["candidates"].items()))
    return _written(root, rep, write)


def _revert_rolled_back(ledger: str | os.PathLike[str], rep: OnlineReport, date: str) -> None:
    """A rollback of the fallback check takes the rule out of the live tree: the ledger's candidate that
    committed it is reverted, with the check's reason."""
    led = Ledger.load(ledger)
    changed = False
    for rb in rep.rollbacks:
        for c in led.of(lever_skills.LEVER, "accepted"):
            ch = lever_skills.RuleChange.from_payload(c.payload)
            if c.payload.get("version") == rb["from_version"] and ch.skill == rb["skill"]:
                led.transition(c.id, "reverted", night=date, reason=f"rolled back by the online check's fallback "
                               f"({FALLBACK}) as version {rb['to_version']}: {rb['reason']}")
                c.payload["reverted_in"] = rb["to_version"]
                rb["ledger"] = c.id
                changed = True
    if changed:
        lever_skills.save_merged(led, ledger)
