"""The online check of SAGE's skills (sleep/sage_online.py): runs mapped to the skill texts their coder call saw (SAGE's
SKILL_INJECTION shas) and to their verdicts; an edit whose runs are verified less often than its parent's beyond the
one-sided test's level is rolled back, once; a smaller drop says how many runs it would need; the stated level holds
when no edit hurts; and SAGE's own journals (the committed `sage run` fixture) are read end to end."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sage_pipeline.sage import skills as sk
from sage_pipeline.sleep.sage_online import (
    OnlineCheckConfig,
    Run,
    RunsRead,
    check,
    harm_p_value,
    run_verdicts,
    runs_from_events,
    runs_from_journals,
    runs_needed,
    wilson,
)
from sage_pipeline.sleep.sage_skills import SageSkillsRoot

TDD = "discipline/test-driven-development/SKILL.md"
FIXTURE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_world_run"


def _event(session: str | None, shas: dict[str, str], role: str = "coder", line: int = 1) -> sk.InjectionEvent:
    ids = tuple(shas)
    return sk.InjectionEvent("j.log", line, "2026-11-28T00:00:00Z", session, None, role, ids,
                             tuple(shas[i] for i in ids), tuple(100 for _ in ids), 100 * len(ids), 25 * len(ids))


@pytest.fixture
def root(tmp_path) -> SageSkillsRoot:
    r = SageSkillsRoot(tmp_path / "skills")
    r.commit({TDD: r.text("live", TDD) + "\n- Write the tests first, always.\n"}, "sage night 2026-11-27: 1 edit")
    return r


def _runs(root: SageSkillsRoot, per_version: dict[str, tuple[int, int]]) -> RunsRead:
    """``verified`` of ``n`` runs per version ref (``v1``, ``v2``), as SAGE would have logged their coder call."""
    events, verdicts = [], {}
    for ref, (verified, n) in per_version.items():
        shas = {s: h for s, h in root.shas(ref).items() if s in sk.injection(root.texts(ref), "coder").shas}
        for i in range(n):
            sid = f"{ref}-{i}"
            events.append(_event(sid, shas))
            verdicts[sid] = 1.0 if i < verified else 0.0
    return runs_from_events(events, verdicts, "coder")


def test_an_edit_that_hurts_beyond_the_level_is_rolled_back_once_and_the_report_says_so(root):
    v1, v2 = (e.version for e in root.versions())
    rep = check(root, _runs(root, {"v1": (30, 40), "v2": (12, 40)}), date="2026-11-29")
    (edit,) = rep.edits
    assert edit["decision"] == "harmful" and edit["p_value"] <= rep.level == 0.05
    assert (edit["runs_new"], edit["verified_new"], edit["runs_parent"], edit["verified_parent"]) == (40, 12, 40, 30)
    assert edit["action"].startswith("rolled back as version ") and len(rep.rollbacks) == 1
    last = root.versions()[-1]
    assert last.action == "rollback" and last.changed == (TDD,) and "online check 2026-11-29" in last.reason
    assert root.text("live", TDD) == root.text(v1, TDD) and root.live() == v1  # the tree is v1's again
    assert "rolled back: " + TDD in rep.summary()
    assert json.loads(Path(rep.path).read_text())["rollbacks"][0]["to_version"] == v1
    tdd = {r["sha16"]: r for r in rep.texts if r["skill"] == TDD}
    assert tdd[root.sha16(v2, TDD)]["share"] == pytest.approx(0.3) and tdd[root.sha16(v1, TDD)]["runs"] == 40
    assert tdd[root.sha16(v2, TDD)]["versions"].startswith("v2=")
    again = check(root, _runs(root, {"v1": (30, 40), "v2": (12, 40)}), date="2026-11-30")
    assert again.edits[0]["decision"] == "replaced" and again.rollbacks == [] and root.versions()[-1] == last


@pytest.mark.parametrize("counts, decision", [
    ({"v1": (20, 40), "v2": (30, 40)}, "no_harm"),
    ({"v1": (8, 10), "v2": (6, 10)}, "cannot_tell"),
    ({"v1": (8, 10)}, "no_runs"),
])
def test_no_rollback_without_evidence_of_harm(root, counts, decision):
    live = root.live()
    rep = check(root, _runs(root, counts), date="2026-11-29")
    assert rep.edits[0]["decision"] == decision and rep.rollbacks == [] and root.live() == live
    if decision == "cannot_tell":
        need = rep.edits[0]["needed_runs"]
        assert need > 10 and f"needs about {need} runs per version" in rep.edits[0]["action"]
        # as many runs with the same shares: the check resolves it
        assert check(root, _runs(root, {"v1": (8 * need // 10, need), "v2": (6 * need // 10, need)}),
                     date="2026-11-30").edits[0]["decision"] == "harmful"


def test_a_harmful_edit_is_only_reported_when_rollbacks_are_off(root):
    live = root.live()
    rep = check(root, _runs(root, {"v1": (35, 40), "v2": (10, 40)}), OnlineCheckConfig(apply_rollbacks=False),
                date="2026-11-29")
    assert rep.edits[0]["decision"] == "harmful" and "not rolled back" in rep.edits[0]["action"]
    assert root.live() == live and rep.rollbacks == []


def test_a_root_without_edits_has_nothing_to_check(tmp_path):
    root = SageSkillsRoot(tmp_path / "skills")
    rep = check(root, _runs(root, {"v1": (3, 5)}), date="2026-11-29", write=False)
    assert rep.edits == [] and rep.level is None and "nothing to check" in rep.notes[0] and rep.path == ""
    assert {r["runs"] for r in rep.texts} == {5} and all(r["versions"].startswith("v1=") for r in rep.texts)


def test_the_stated_level_holds_when_no_edit_hurts():
    """One-sided Fisher at 0.05 on two arms of 30 runs with the same verified chance: at most 5% harmful."""
    rng = np.random.default_rng(7)
    k = rng.binomial(30, 0.6, size=(1000, 2))
    p = np.array([harm_p_value(int(a), 30, int(b), 30) for a, b in k])
    assert np.mean(p <= 0.05) <= 0.05
    # and it has power against a real drop: 0.8 -> 0.4 over 40 runs each
    k = np.stack([rng.binomial(40, 0.4, 200), rng.binomial(40, 0.8, 200)], axis=1)
    assert np.mean([harm_p_value(int(a), 40, int(b), 40) <= 0.05 for a, b in k]) > 0.9


def test_intervals_and_runs_needed():
    low, high = wilson(np.array([0, 5, 10]), np.array([10, 10, 10]), 0.95)
    assert low[0] == pytest.approx(0) and high[2] == pytest.approx(1)
    assert low[1] == pytest.approx(0.2366, abs=1e-3) and high[1] == pytest.approx(0.7634, abs=1e-3)
    assert runs_needed(0.8, 0.8, 0.05, 0.8) is None and runs_needed(0.8, 0.9, 0.05, 0.8) is None
    assert runs_needed(0.8, 0.6, 0.05, 0.8) > runs_needed(0.8, 0.4, 0.05, 0.8) > 10


def test_runs_take_their_verdict_from_every_task_and_their_shas_from_the_roles_call():
    frame = pd.DataFrame({"session_id": ["a", "a", "b", "b", "c", "d"],
                          "verified": [1.0, 1.0, 1.0, 0.0, np.nan, 1.0]})
    assert run_verdicts(frame) == {"a": 1.0, "b": 0.0, "c": None, "d": 1.0}
    assert run_verdicts(frame.iloc[:0]) == {}
    events = [_event("a", {TDD: "1" * 16}), _event("a", {TDD: "1" * 16}, role="reviewer"),
              _event("b", {TDD: "2" * 16}), _event("b", {TDD: "3" * 16}),  # two texts in one session
              _event("c", {TDD: "1" * 16}), _event("e", {TDD: "1" * 16}), _event(None, {TDD: "1" * 16})]
    got = runs_from_events(events, run_verdicts(frame), "coder")
    assert [(r.session_id, r.verified, r.shas) for r in got.runs] == [("a", 1.0, {TDD: "1" * 16}), ("b", 0.0, {})]
    assert sorted(got.counts.values()) == [1, 1, 1, 1] and len(got.counts) == 4


def test_sages_own_journals_are_read_end_to_end(tmp_path):
    """The committed journals of six `sage run`s (SAGE's packaged skills): every run's coder saw the initial
    version's texts, and its verdict is what SAGE's gate wrote."""
    runs = runs_from_journals([FIXTURE / "ws-0" / "memory" / "sessions", FIXTURE / "ws-1" / "memory" / "sessions",
                               tmp_path / "gone"], "coder")
    sessions = {s for line in (FIXTURE / "runs.jsonl").read_text().splitlines() for s in json.loads(line)["sessions"]}
    assert {r.session_id for r in runs.runs} <= sessions and len(runs.runs) >= 4, runs.counts
    assert runs.counts["journal folders not found"] == 1 and runs.problems == []
    root = SageSkillsRoot(tmp_path / "skills")
    rep = check(root, runs, date="2026-11-28")
    assert {r["versions"] for r in rep.texts} == {f"v1={root.live()}"}
    assert {r["runs"] for r in rep.texts} == {len(runs.runs)} and all(r["verified"] <= r["runs"] for r in rep.texts)


# ------------------------------------------------------------------ ledger mode: randomised runs feed the ledger
def _ledger_with(tmp_path, root: SageSkillsRoot, state: str = "pending"):
    from sage_pipeline.decisions import skills as ls
    from sage_pipeline.decisions.ledger import Ledger
    from sage_pipeline.sleep.block import normalise_rule

    path = tmp_path / "decisions" / "ledger.json"
    led = Ledger.load(path)
    c = ls.propose(led, ls.RuleChange("add", TDD, "Write the tests first, always."), night="2026-11-27",
                   normalise=normalise_rule).candidate
    if state == "accepted":
        led.transition(c.id, "accepted", night="2026-11-27", reason="test")
        c.payload.update(version=root.live(), previous=root.versions()[0].version)
    led.save()
    return path, c.id


def _assigned(tmp_path, root: SageSkillsRoot, ledger, cid: str, per_arm: dict[str, tuple[int, int]]) -> RunsRead:
    """A plan (live: v2, cand: v1's folder) archived and its recorded draws; ``verified`` of ``n`` runs per arm, each
    logged with its arm's shas and the draw id as its trace id."""
    from sage_pipeline.decisions import assign, skills as ls

    v1, v2 = (e.version for e in root.versions())
    plan = ls.plan(str(root.versions_dir / v2), {("cand", cid): root.versions_dir / v1})
    folder = ls.lever_dir(ledger)
    ls.save_plan(folder, plan)
    arms = {a.name: a for a in plan.levers[ls.LEVER]}
    events, verdicts = [], {}
    for name, (verified, n) in per_arm.items():
        ref = v2 if name == "live" else v1
        shas = {s: h for s, h in root.shas(ref).items() if s in sk.injection(root.texts(ref), "coder").shas}
        for i in range(n):
            did = f"{name}-{i:03d}"
            assign.record(folder, plan, {ls.LEVER: arms[name]}, did, f"2026-11-28T01:{i:02d}:00Z")
            ids = tuple(shas)
            events.append(sk.InjectionEvent("j.log", 1, "2026-11-28T00:00:00Z", f"s-{did}", did, "coder", ids,
                                            tuple(shas[x] for x in ids), tuple(100 for _ in ids), 100, 25))
            verdicts[f"s-{did}"] = 1.0 if i < verified else 0.0
    return runs_from_events(events, verdicts, "coder")


def test_in_ledger_mode_randomised_runs_feed_the_ledger_and_no_day_comparison_rolls_back(root, tmp_path):
    from sage_pipeline.decisions import skills as ls
    from sage_pipeline.decisions.ledger import Ledger
    from sage_pipeline.sleep.sage_online import check_ledger

    ledger, cid = _ledger_with(tmp_path, root)
    cand = f"cand-{cid}"
    runs = _assigned(tmp_path, root, ledger, cid, {"live": (12, 40), cand: (36, 40)})
    runs.runs.append(Run("unassigned", 1.0, {}, "j.log:9"))  # a run started without the launcher
    live = root.live()
    rep = check_ledger(root, runs, ledger, date="2026-11-29")
    assert rep.mode == "ledger" and rep.edits == [] and rep.rollbacks == [] and root.live() == live
    x = rep.randomised
    assert x["with_draw"] == 80 and x["candidates"][cid]["added"] == 80
    assert x["left_out"] == {"no recorded draw (not randomised: not evidence)": 1}
    led = Ledger.load(ledger)
    st = led.standing(cid)
    assert st["n"] == 80 and st["estimate"] > 0.3 and len(set(led.get(cid).judged_on[ls.ONLINE])) == 80
    assert led.get(cid).judged_on[ls.ONLINE][:2] == [f"{cand}-000", "live-000"]  # in the order of their draws
    assert "80 with a recorded random draw" in rep.summary() and f"{cid} +80" in rep.summary()
    again = check_ledger(root, runs, ledger, date="2026-11-30")  # the same journals read the next day
    assert again.randomised["candidates"][cid]["added"] == 0 and Ledger.load(ledger).standing(cid)["n"] == 80


def test_without_assignment_records_the_day_comparison_is_the_fallback_and_its_rollback_reverts_the_ledger(
        root, tmp_path):
    from sage_pipeline.decisions.ledger import Ledger
    from sage_pipeline.sleep.sage_online import FALLBACK, check_ledger

    ledger, cid = _ledger_with(tmp_path, root, state="accepted")
    v1 = root.versions()[0].version
    rep = check_ledger(root, _runs(root, {"v1": (30, 40), "v2": (12, 40)}), ledger, date="2026-11-29")
    assert rep.mode == FALLBACK == "per_night fallback: compares days, not randomised"
    assert rep.summary().startswith(FALLBACK) and "no recorded random assignment" in rep.notes[0]
    assert rep.edits[0]["decision"] == "harmful" and root.live() == v1 and rep.rollbacks[0]["ledger"] == cid
    c = Ledger.load(ledger).get(cid)
    assert c.state == "reverted" and "compares days, not randomised" in c.history[-1].reason
    assert json.loads(Path(rep.path).read_text())["mode"] == FALLBACK
