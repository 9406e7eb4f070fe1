"""The skills lever of the ledger (decisions/skills.py): a rule proposed again continues its candidate and its
evidence; a task it was selected on is never its evidence; a useless accepted rule is reverted when its gain is
excluded above the minimum useful gain; a decided rule is final; randomised runs become evidence through their
recorded draw (a run without one is counted, never used); the next night's plan gives the arms their stated shares;
the standing line names the evidence needed; saving keeps the other levers' candidates."""

from __future__ import annotations

import re

import numpy as np
import pytest

from sage_pipeline.decisions import assign, skills as ls
from sage_pipeline.decisions.ledger import Ledger, LedgerConfig, LedgerError
from sage_pipeline.sleep.block import normalise_rule

TDD = "discipline/test-driven-development/SKILL.md"
RULE = "Run the function by hand on every example of the task before answering."


def _add(rule: str = RULE, skill: str = TDD) -> ls.RuleChange:
    return ls.RuleChange("add", skill, rule)


def _replays(rng, n: int, p_with: float, p_without: float, prefix: str = "t", samples: int = 4) -> list[ls.Replay]:
    return [ls.Replay(f"{prefix}{i}", f"c-{prefix}{i}", tuple((rng.random(samples) < p_with).astype(float)),
                      tuple((rng.random(samples) < p_without).astype(float))) for i in range(n)]


@pytest.fixture
def led(tmp_path) -> Ledger:
    return Ledger.load(tmp_path / "decisions" / "ledger.json")


def test_the_same_rule_proposed_on_two_nights_keeps_one_candidate_and_its_evidence_grows(led):
    rng = np.random.default_rng(0)
    a = ls.propose(led, _add(), night="2026-12-01", normalise=normalise_rule, selected_on=["s1"])
    assert a.status == "new" and a.candidate.index == 1
    first = ls.add_replays(led, a.candidate.id, "2026-12-01", _replays(rng, 10, 0.6, 0.4), fresh=True)
    ls.decide_night(led, "2026-12-01")
    n1 = led.standing(a.candidate.id)["n"]
    # the same rule in other case, spacing and bullet: the same candidate, tonight's selection joins the old one
    again = ls.propose(led, _add("-  run the function BY HAND on every example of the task before answering. "),
                       night="2026-12-02", normalise=normalise_rule, selected_on=["s2"])
    assert again.status == "continued" and again.candidate is a.candidate
    assert len(led.of(ls.LEVER)) == 1 and a.candidate.selected_on == ["s1", "s2"]
    # the same task ids on another night are other units: one per (night, task)
    second = ls.add_replays(led, a.candidate.id, "2026-12-02", _replays(rng, 10, 0.6, 0.4), fresh=True)
    assert first["added"] == second["added"] == 10 and n1 == 10 and led.standing(a.candidate.id)["n"] == 20
    assert a.candidate.judged_on[ls.REPLAY][:2] == ["2026-12-01/t0", "2026-12-01/t1"]
    assert {r.night for r in a.candidate.nights} == {"2026-12-01"}  # decided once so far, its row kept
    other = ls.propose(led, _add("Write the test first."), night="2026-12-02", normalise=normalise_rule)
    assert other.status == "new" and other.candidate.index == 2  # another rule spends the next level


def test_a_task_it_was_selected_on_is_never_its_evidence(led):
    rng = np.random.default_rng(1)
    sel = ls.selected_units([("s1", "goal-1"), ("s2", "")])
    assert sel == ["content:goal-1", "s1", "s2"]
    c = ls.propose(led, _add(), night="n1", normalise=normalise_rule, selected_on=sel).candidate
    rs = _replays(rng, 4, 0.5, 0.5)
    rs += [ls.Replay("s1", "x", (1.0,), (0.0,)),  # the task reflect saw
           ls.Replay("v9", "goal-1", (1.0,), (0.0,))]  # another id asking what a task reflect saw asks
    out = ls.add_replays(led, c.id, "n1", rs, fresh=True)
    assert out["added"] == 4 and out["left_out"] == {"selected on (reflect saw it, or a task asking the same)": 2}
    assert not any(u.endswith(("/s1", "/v9")) for u in c.judged_on[ls.REPLAY])
    again = ls.add_replays(led, c.id, "n1", rs[:4], fresh=True)  # the same night run twice
    assert again["added"] == 0 and again["left_out"] == {"already counted (this night was run before)": 4}
    det = ls.add_replays(led, c.id, "n2", rs[:4], fresh=False)  # same prompts, a backend that answers the same
    assert det["added"] == 0 and "does not draw fresh answers" in next(iter(det["left_out"]))
    with pytest.raises(LedgerError, match="selected on"):  # and the ledger itself refuses such a unit
        led.add_evidence(c.id, ls.REPLAY, [1.0], -1, 1, ["s2"])


def test_a_useless_accepted_rule_is_reverted_when_its_gain_is_excluded_above_min_useful_gain(led):
    """A rule that helped (+0.5) is accepted; its effect then turns to nothing (paired replays centred on 0): on
    probation its gain is excluded above min_useful_gain (0.03) and it is reverted, though nothing shows harm."""
    rng = np.random.default_rng(3)
    c = ls.propose(led, _add(), night="n00", normalise=normalise_rule).candidate
    night = 0
    while c.state == "pending" and night < 10:
        night += 1
        ls.add_replays(led, c.id, f"n{night:02d}", _replays(rng, 10, 0.9, 0.4), fresh=True)
        ls.decide_night(led, f"n{night:02d}")
    assert c.state == "accepted", c.nights[-1]
    changes, start = [], night
    for night in range(start + 1, start + 31):
        x = rng.choice([-0.25, 0.0, 0.25], p=[0.1, 0.8, 0.1], size=40)  # useless: mean 0, not harmful
        rs = [ls.Replay(f"t{i}", "", (0.5 + v / 2,), (0.5 - v / 2,)) for i, v in enumerate(x)]
        ls.add_replays(led, c.id, f"n{night:02d}", rs, fresh=True)
        changes += ls.decide_night(led, f"n{night:02d}")
        if c.state != "accepted":
            break
    assert c.state == "reverted" and changes and changes[-1]["to"] == "reverted"
    assert "excluded above 0.03" in changes[-1]["reason"]
    assert c.nights[-1].revert_evidence >= 20  # what reverted it, kept in its last row
    assert c.nights[-1].estimate < 0.15  # never shown harmful: its running estimate stays well above -0.15


def test_a_decided_rule_is_final_and_never_tested_again(led):
    c = ls.propose(led, _add(), night="n1", normalise=normalise_rule).candidate
    led.transition(c.id, "dropped", night="n1", reason="test")
    p = ls.propose(led, _add(RULE.upper()), night="n2", normalise=normalise_rule)
    assert p.status == "final" and p.candidate is c and "never tested again" in p.reason
    assert len(led.of(ls.LEVER)) == 1 and led.data.next_index[ls.LEVER] == 2


def _plan_for(cid: str, kind: str = "cand") -> assign.Plan:
    return ls.plan("/skills/versions/aaaaaaaaaaaa", {(kind, cid): "/skills/versions/bbbbbbbbbbbb"})


def test_randomised_runs_become_online_evidence_through_their_draw_and_runs_without_one_are_counted(led):
    c = ls.propose(led, _add(), night="n1", normalise=normalise_rule).candidate
    p = _plan_for(c.id)
    assert {a.name: a.probability for a in p.levers[ls.LEVER]} == {"live": 0.5, f"cand-{c.id}": 0.5}
    draws, runs = {}, []
    rng = np.random.default_rng(5)
    for i in range(60):
        arm = f"cand-{c.id}" if i % 2 else "live"
        draws[f"d{i:03d}"] = {"plan": p.id, "at": f"2026-12-01T00:{i:02d}:00Z",
                              "levers": {ls.LEVER: {"arm": arm, "probability": 0.5, "candidate": None}}}
        runs.append(ls.LiveRun(f"d{i:03d}", float(rng.random() < (0.9 if i % 2 else 0.5)), saw_its_arm=i != 7))
    runs += [ls.LiveRun("", 1.0), ls.LiveRun("not-a-draw", 0.0)]
    out = ls.add_online(led, runs, draws, {p.id: p})
    assert out["with_draw"] == 60 and out["candidates"][c.id]["added"] == 60
    assert out["left_out"] == {"no recorded draw (not randomised: not evidence)": 2,
                               "saw another version than its arm's (counted as drawn: intent to treat)": 1}
    st = led.standing(c.id)
    assert st["n"] == 60 and st["estimate"] > 0 and st["evidence"] > 1
    again = ls.add_online(led, runs, draws, {p.id: p})  # tomorrow's read of the same journals adds nothing
    assert again["candidates"][c.id] == {"added": 0, "left_out": {"already counted": 60}}
    assert c.payload["online_centre"][1] == 61  # the centre's prior plus the 60 runs, carried to the next read
    # the bounds stated before each run: |x| <= max(c, 1 - c) / min(p_a, p_b)
    s = led._stream(c, "streams", ls.ONLINE)
    assert s.n[0] == 60


def test_the_next_nights_plan_gives_each_arm_its_stated_share(led, tmp_path):
    pend = ls.propose(led, _add(), night="n1", normalise=normalise_rule).candidate
    acc = ls.propose(led, _add("Write the test first."), night="n1", normalise=normalise_rule).candidate
    led.transition(acc.id, "accepted", night="n1", reason="test")
    led.decide(acc.id, "n1")
    want = ls.arms_wanted(led)
    assert want == [("cand", pend.id), ("prev", acc.id)]
    p = ls.plan("/v/live0000000", {k: f"/v/{k[0]}" for k in want})
    probs = {a.name: a.probability for a in p.levers[ls.LEVER]}
    assert probs == pytest.approx({"live": 0.4, f"cand-{pend.id}": 0.5, f"prev-{acc.id}": 0.1})
    assert sum(a.threshold for a in p.levers[ls.LEVER]) == assign.SCALE  # exact: integers out of 2**32
    assert ls.contrast_arms(p, pend.id) == (f"cand-{pend.id}", "live")
    assert ls.contrast_arms(p, acc.id) == ("live", f"prev-{acc.id}")
    out = ls.save_plan(tmp_path / "lever", p)
    assert (tmp_path / "lever" / "sage-run").is_file() and out["launcher"].endswith("sage-run")
    plans, bad = ls.load_plans(tmp_path / "lever")
    assert list(plans) == [p.id] and bad == []
    for night in range(2, 2 + ls.SkillsLeverConfig().probation_nights):  # the probation arm ends
        led.decide(acc.id, f"n{night:02d}")
    assert ("prev", acc.id) not in ls.arms_wanted(led)
    with pytest.raises(ValueError, match="live arm"):
        ls.SkillsLeverConfig(pending_share=0.8, probation_share=0.2)


def test_the_standing_line_names_the_evidence_needed(led):
    rng = np.random.default_rng(2)
    c = ls.propose(led, _add(), night="n1", normalise=normalise_rule).candidate
    assert ls.standing_line(led, c) == "pending: evidence 1.0 of the 40 needed, no evidence yet"
    ls.add_replays(led, c.id, "n1", _replays(rng, 6, 0.8, 0.5), fresh=True)
    line = ls.standing_line(led, c)
    assert re.fullmatch(r"pending: evidence \d+\.\d of the 40 needed, about \d+ more val tasks \(6 so far\) at the "
                        r"current effect \(estimate [+-]\d\.\d{3}\)", line), line
    row = ls.row(led, c)
    assert row["standing"] == line and row["needed"] == pytest.approx(40) and row["observations"] == {"replay": 6}
    assert "at most 0.05" in ls.guarantee(led)


def test_saving_keeps_the_other_levers_candidates_written_meanwhile(tmp_path):
    path = tmp_path / "decisions" / "ledger.json"
    mine = Ledger.load(path, LedgerConfig())
    ls.propose(mine, _add(), night="n1", normalise=normalise_rule)
    other = Ledger.load(path)
    other.propose("router", "sha-of-a-checkpoint", night="n1")
    other.save()  # the router's gate saved while the night ran
    ls.save_merged(mine, path)
    back = Ledger.load(path)
    assert sorted((c.lever, c.id) for c in back.data.candidates) == [("router", "router-0001"),
                                                                     ("skills", "skills-0001")]
    assert back.data.next_index["router"] == 2 and back.data.next_index["skills"] == 2
