"""The night's phases one at a time (``Cycle._examples``, ``_screen``, ``_gate``, ``_verdict``,
``_commit_accepted``): what each records and when it stops the night."""

from __future__ import annotations

import pytest

from sage_pipeline.sleep.block import Edit, parse_document
from sage_pipeline.sleep.cycle import Cycle, CycleConfig, NightResult, _Gated
from sage_pipeline.sleep.gate import GateConfig, Trial
from sage_pipeline.sleep.judges import UnitTestJudge
from sage_pipeline.sleep.records import TaskResult
from sage_pipeline.sleep.simulated_backend import SimulatedBackend, SimWorld
from sage_pipeline.sleep.store import LiveChanged, default_document


def cycle(commit=lambda texts: "v-new", **cfg) -> Cycle:
    world = SimWorld.load("reviewer")
    docs = {k: parse_document(default_document("reviewer", k)) for k in ("skill", "memory")}
    return Cycle(world.generate_tasks(seed=0, per_topic=2), docs, SimulatedBackend(world), UnitTestJudge(),
                 CycleConfig(**cfg), NightResult(skill="reviewer", date="2026-11-03"), commit)


def results(c: Cycle, split: str, passed) -> list[TaskResult]:
    return [TaskResult(t.id, split, 1.0 if passed(i) else 0.0, 1.0 if passed(i) else 0.0, "", "")
            for i, t in enumerate(c.split[split])]


def trial(accepted: bool, verdict: str) -> Trial:
    return Trial(["x"], 0.5, 0.6 if accepted else 0.5, accepted, verdict, verdict)


def test_examples_stop_the_night_when_all_train_passes_and_are_ordered_by_the_night():
    c = cycle()
    assert c._examples(results(c, "train", lambda i: True)) is None
    assert c.r.status == "no_edits" and f"all {len(c.split['train'])} train tasks pass" in c.r.reason
    c = cycle()
    res = results(c, "train", lambda i: i % 2)
    failures, successes = c._examples(res)
    assert {x.task_id for _, x in failures} == {x.task_id for x in res if x.hard < 1}
    assert {x.task_id for _, x in successes} == {x.task_id for x in res if x.hard >= 1}
    assert c._examples(list(reversed(res))) == (failures, successes)  # the order is the night's, not the input's
    assert c.r.status == "running"


def test_screen_drops_what_cannot_apply_and_stops_when_nothing_is_left():
    c = cycle()
    edits = [Edit("add", "skill", "Quote the code you review."), Edit("add", "nowhere", "x", status="invalid"),
             Edit("delete", "skill", anchor="a rule that is not there")]
    candidates, dropped = c._screen(edits)
    assert [e.content for e in candidates] == ["Quote the code you review."]
    assert {e.status for e in dropped} == {"invalid", "unmatched"} and len(c.r.edits) == 2
    c = cycle()
    assert c._screen([Edit("delete", "skill", anchor="absent")]) is None
    assert c.r.status == "no_edits" and "1 edit(s), none applicable (1 unmatched)" in c.r.reason


def test_gate_keeps_only_strictly_better_groups_on_top_of_each_other():
    # the mechanics of groups on top of each other, under the old strict rule: two val tasks of a topic
    # are too few for the paired test (test_cycle_gate.py runs it end to end against the stand-in)
    c = cycle(gate=GateConfig(test="strict"))
    base = c._replay("val", c.docs, "val (baseline)")
    world = SimWorld.load("reviewer")
    failing = {x.task_id for x in base if x.hard < 1}
    helpful = next(t.rule for name, t in world.topics.items()
                   if any(x.meta["sim"]["topic"] == name and x.id in failing for x in c.split["val"]))
    g = c._gate([Edit("add", "skill", helpful), Edit("add", "memory", "Be brief.")], base)
    assert c.r.phase == "gate" and [t.accepted for t in g.trials] == [True, False]
    assert [e.content for e in g.accepted] == [helpful] and g.docs is not c.docs
    assert helpful in g.docs["skill"].render() and "Be brief." not in g.docs["memory"].render()
    bundle = cycle(gate=GateConfig(test="strict", granularity="bundle"))
    g = bundle._gate([Edit("add", "skill", helpful), Edit("add", "memory", "Be brief.")], base)
    assert len(g.trials) == 1 and g.trials[0].edits == [f"add to skill: {helpful!r}", "add to memory: 'Be brief.'"]


def test_verdict_rejects_without_an_accepted_edit_and_when_val_overlaps_train():
    c = cycle()
    g = _Gated(c.docs, [], [trial(False, "tie"), trial(False, "worse"), trial(False, "tie")])
    assert c._verdict(g, [Edit("add", "skill", "a")] * 3, [], overlap=[]) is False
    assert (c.r.status, c.r.gate_action) == ("rejected", "reject")
    assert "none of 3 candidate edit(s) passed the paired gate (2 tie, 1 worse)" in c.r.reason
    c = cycle()
    e = Edit("add", "skill", "a", status="accepted", reason="better")
    assert c._verdict(_Gated(c.docs, [], [trial(True, "better")], [e]), [e], [], overlap=["t1"]) is False
    assert (c.r.status, c.r.gate_action) == ("reject_unverified", "reject_unverified")
    assert e.status == "rejected" and "val overlaps train: better" in e.reason and c.r.edits[0]["status"] == "rejected"
    c = cycle()
    assert c._verdict(_Gated(c.docs, [], [trial(True, "better")], [e]), [e], [], overlap=[]) is True
    assert c.r.gate_action == "accept" and c.r.status == "running"


@pytest.mark.parametrize("failure,status,returns_docs", [(None, "accepted", True),
                                                         (LiveChanged("SKILL.md changed"), "conflict", True),
                                                         (OSError("disk full"), "store_error", False)])
def test_commit_records_the_version_or_why_it_was_not_written(failure, status, returns_docs):
    def commit(texts):
        if failure is not None:
            raise failure
        return "v-new"

    c = cycle(commit)
    c.r.scores["candidate_val"] = {"score": 0.75}
    new = {k: parse_document(d.render() + "") for k, d in c.docs.items()}
    g = _Gated(new, [], [trial(True, "better")], [Edit("add", "skill", "a")])
    out = c._commit_accepted(g, n_candidates=2)
    assert c.r.status == status and c.r.phase == "commit"
    assert (out is new) if returns_docs else out is None
    if failure is None:
        assert c.r.versions["after"] == "v-new" and "1 of 2 candidate edit(s) accepted: val mixed 0.500 -> 0.750" \
            in c.r.reason and c.r.candidate == {}
    else:
        assert c.r.candidate == {k: d.render() for k, d in new.items()} and str(failure) in c.r.reason


def test_the_paired_gate_tests_each_edit_at_alpha_over_the_edit_budget_and_a_bundle_at_alpha():
    edits = [Edit("add", "skill", "Quote the code you review."), Edit("add", "memory", "Be brief.")]
    c = cycle(gate=GateConfig(alpha=0.08))
    base = c._replay("val", c.docs, "val (baseline)")
    g = c._gate(edits, base)
    assert [t.level for t in g.trials] == [0.08 / 4, 0.08 / 4]  # edit_budget 4: the same bar for every edit
    assert all(t.test == "paired" and t.p_value is not None for t in g.trials)
    c = cycle(gate=GateConfig(alpha=0.08, granularity="bundle"))
    (trial,) = c._gate([Edit("add", "skill", "Quote the code you review."), Edit("add", "memory", "Be brief.")],
                       base).trials
    assert trial.level == 0.08


def test_a_rejected_night_says_what_it_would_need_or_what_its_tasks_resolve():
    def paired(verdict: str, gain: float, needed=None, detectable=None) -> Trial:
        return Trial(["x"], 0.5, 0.5 + gain, False, verdict, verdict, test="paired", tasks=20, level=0.0125,
                     needed_tasks=needed, detectable=detectable)

    c = cycle()
    g = _Gated(c.docs, [], [paired("cannot_tell", 0.05, 300, 0.2), paired("cannot_tell", 0.1, 90, 0.2),
                            paired("worse", -0.1, None, 0.25)])
    assert c._verdict(g, [Edit("add", "skill", "a")] * 3, [], overlap=[]) is False
    assert "this night cannot tell: its largest gain, +0.100 over 20 val task(s), needs about 90 val tasks to " \
           "resolve at level 0.0125 (these tasks resolve +0.200 or more)" in c.r.reason
    c = cycle()
    g = _Gated(c.docs, [], [paired("worse", -0.1, None, 0.25), paired("tie", 0.0, None, None)])
    assert c._verdict(g, [Edit("add", "skill", "a")] * 2, [], overlap=[]) is False
    assert c.r.reason.endswith("; no candidate rose: these 20 val task(s) resolve a change of +0.250 or more at "
                               "level 0.0125")


def test_replay_answers_every_task_samples_times_over_and_refuses_zero():
    from sage_pipeline.sleep.replay import replay

    c = cycle()
    val = c.split["val"]
    out = replay(val, "s", "m", c.backend, c.unit, samples=3)
    assert [r.task_id for r in out] == [t.id for t in val] * 3  # every task, then every task again
    with pytest.raises(ValueError, match="replay each task at least once"):
        replay(val, "s", "m", c.backend, c.unit, samples=0)
