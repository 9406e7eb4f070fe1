"""Whole nights on the simulated backend (and the HTTP one failing): what gets accepted, what is
reported, and that bad input and failing backends end the night with a status and a cause."""

from __future__ import annotations

import json
from datetime import date, timedelta

import pytest

from sage_pipeline.sleep.backends import OpenAIBackend, OpenAIConfig, Reply
from sage_pipeline.sleep.block import BEGIN_LINE, EditLimits, parse_document
from sage_pipeline.sleep.cycle import CycleConfig
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.nightly import NightSettings, day_window, run_night
from sage_pipeline.sleep.records import write_task_file
from sage_pipeline.sleep.simulated_backend import FAILURES, SimulatedBackend, SimWorld
from sage_pipeline.sleep.store import SkillStore, default_document

D0 = date(2026, 11, 2)


def nights(n: int):
    return [(D0 + timedelta(days=i)).isoformat() for i in range(n)]


# The simulated world's rules change two or three val tasks each: too few for the default paired gate
# to tell from chance (it says "cannot tell"). These tests are about the night's mechanics, so they
# run the old strict gate; the paired gate's own: test_gate.py, test_cycle_gate.py.
STRICT = GateConfig(test="strict")


def settings(**kw) -> NightSettings:
    return NightSettings(**{"log_dirs": (), "cycle": CycleConfig(gate=STRICT), **kw})


def store(root, skill="reviewer") -> SkillStore:
    return SkillStore(root / "sleep", skill)


class ScriptedReflect(SimulatedBackend):
    """The simulated backend with a fixed reflect reply."""

    def __init__(self, skill: str, reply: str, on_reflect=None) -> None:
        super().__init__(SimWorld.load(skill))
        self.reply, self.on_reflect = reply, on_reflect

    def reflect(self, request):
        if self.on_reflect:
            self.on_reflect(request)
        r = Reply(self.reply, 10, len(self.reply) // 4)
        self.calls.record("reflect", r)
        return r


def test_nights_learn_only_helpful_rules_and_leave_the_rest_alone(tmp_path):
    world = SimWorld.load("reviewer")
    results = [run_night(tmp_path, "reviewer", d, None, settings())[0] for d in nights(4)]
    first, last = results[0], results[-1]
    assert last.scores["test_after"]["score"] - first.scores["test_before"]["score"] > 0.3
    accepted = [e for r in results for e in r.edits if e["status"] == "accepted"]
    assert accepted and all(world.classify(e["content"]).startswith("helpful") for e in accepted)
    proposed_harmful = [e for r in results for e in r.edits if world.classify(e["content"]) == "harmful"]
    assert proposed_harmful and all(e["status"] != "accepted" for e in proposed_harmful)
    s = store(tmp_path)
    assert len(s.versions()) == 1 + sum(r.status == "accepted" for r in results)
    live = parse_document(s.skill_path.read_text())
    packaged = parse_document(default_document("reviewer", "skill"))
    assert (live.prefix, live.suffix) == (packaged.prefix, packaged.suffix)  # outside the block: untouched
    for r in results:
        assert r.status in ("accepted", "rejected", "no_edits") and r.calls["total_tokens"] > 0
        assert r.scores["baseline_val"]["tasks"] == r.tasks["val"]
        d = json.loads((tmp_path / "sleep" / "reviewer" / "nights" / r.date / "diagnostics.json").read_text())
        assert d["status"] == r.status and d["per_task"] and d["reflect"]["reply_head"]
    report = (tmp_path / "sleep" / "reviewer" / "nights" / last.date / "report.md").read_text()
    assert "## Scores" in report and "![scores per night](scores.png)" in report
    assert (tmp_path / "sleep" / "reviewer" / "nights" / last.date / "scores.png").read_bytes()[:4] == b"\x89PNG"


def test_test_split_is_scored_after_the_decision_and_never_changes_it(tmp_path):
    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings())
    phases = [row["phase"] for row in r.per_task]
    last_gate = max(i for i, p in enumerate(phases) if p.startswith("val"))
    assert all(p.startswith("test") for p in phases[last_gate + 1:]) and "test before" in phases
    assert not any(p.startswith("test") for p in phases[:last_gate])


@pytest.mark.parametrize("fail_at,failure,phase", [(1, "timeout", "baseline_val"), (40, "rate_limit", "train"),
                                                   (72, "auth", "reflect"), (90, "http_500", "gate"),
                                                   (200, "empty", "test")])
def test_a_failing_backend_ends_in_backend_error_with_its_cause(tmp_path, fail_at, failure, phase):
    s = store(tmp_path)
    s.ensure_live()
    before = s.read()
    backend = SimulatedBackend(SimWorld.load("reviewer"), night="2026-11-03", fail_at_call=fail_at, failure=failure)
    r, files = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(), backend=backend)
    assert r.status == "backend_error" and r.cause == FAILURES[failure][1] and r.phase == phase
    assert r.call_errors and r.call_errors[-1]["error"] == FAILURES[failure][1]
    if r.phase == "test":  # the decision came first and was committed; the reason says so
        assert r.gate_action == "accept" and "was written before the test split" in r.reason
        assert s.read().id == r.versions["after"] != before.id
    else:
        assert s.read() == before and [v.action for v in s.versions()] == ["initial"]  # nothing written
    d = json.loads(files.diagnostics.read_text())
    assert d["status"] == "backend_error" and d["cause"] == r.cause
    if fail_at > 1:  # what was scored before the failure is kept, nothing after it is guessed
        assert r.scores["baseline_val"] is not None and r.scores["test_after"] is None
    if phase != "test":
        assert r.scores["test_before"] is None


def test_http_backend_down_is_a_backend_error_not_a_zero(tmp_path, chat_server):
    chat_server.script = [("status", 503, '{"error": "overloaded"}', {})]
    b = OpenAIBackend(OpenAIConfig(base_url=chat_server.base_url, model="m", max_retries=2), sleep=lambda s: None)
    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(), backend=b)
    assert r.status == "backend_error" and r.phase == "baseline_val"
    assert "HTTP 503" in r.cause and "overloaded" in r.cause and "gave up after 3 attempts" in r.cause
    assert r.scores["baseline_val"] is None and not r.per_task
    assert len(chat_server.requests) == 3 and r.calls["retries"] == 2


def test_empty_day_is_no_tasks(tmp_path):
    r, files = run_night(tmp_path, "reviewer", "2026-11-03", day_window("2026-11-03"),
                         settings(embedded_tasks=False, log_dirs=("sessions",)))
    assert r.status == "no_tasks" and "no usable tasks" in r.reason and r.calls["calls"] == 0
    assert r.harvest["missing_dirs"] == [str(tmp_path / "sessions")]
    assert files.diagnostics.is_file() and files.report.is_file()


def test_skill_file_without_block_gets_one_and_nothing_else_changes(tmp_path):
    mine = tmp_path / "agent" / "SKILL.md"
    mine.parent.mkdir()
    original = "# Skill: reviewer\n\n- Quote the code you comment on in backticks.\n"
    mine.write_text(original)
    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(skill_path=str(mine)))
    text = mine.read_text()
    assert text.startswith(original) and BEGIN_LINE in text
    assert r.block["created"] == ["skill"] and any("created the learned block" in n for n in r.notes)
    actions = [v.action for v in store(tmp_path).versions()]
    assert actions[:2] == ["initial", "block_created"]


def test_non_utf8_skill_file_is_an_input_error_and_left_untouched(tmp_path):
    s = store(tmp_path)
    s.ensure_live()
    raw = s.skill_path.read_bytes().replace(b"reviewer role", b"reviewer r\xf4le")
    s.skill_path.write_bytes(raw)
    r, files = run_night(tmp_path, "reviewer", "2026-11-03", None, settings())
    assert r.status == "input_error" and "not UTF-8" in r.cause and "line 3" in r.cause
    assert str(s.skill_path) in r.cause and s.skill_path.read_bytes() == raw
    assert files.diagnostics.is_file()


def test_malformed_task_file_lines_are_quarantined_and_the_night_goes_on(tmp_path):
    d = tmp_path / "sleep" / "tasks"
    d.mkdir(parents=True)
    (d / "mine.jsonl").write_text('{"id": "x", "intent": "y"}\nnot json\n')
    r, files = run_night(tmp_path, "reviewer", "2026-11-03", None, settings())
    assert r.status in ("accepted", "rejected", "no_edits")
    assert [(q["line"], q["field"]) for q in r.quarantined] == [(1, "reference"), (2, "line")]
    lines = files.extra["quarantine"].read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["file"].endswith("mine.jsonl")


def test_reflect_reply_that_is_not_json_is_reported(tmp_path):
    b = ScriptedReflect("reviewer", "Sure! I would add a rule about SQL injection.")
    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(), backend=b)
    assert r.status == "reflect_invalid" and "is not valid JSON" in r.reflect["error"]
    assert r.reflect["reply_head"].startswith("Sure!") and r.scores["test_before"] is not None
    assert [v.action for v in store(tmp_path).versions()] == ["initial"]


def test_edits_outside_the_block_are_rejected_and_reported(tmp_path):
    reply = json.dumps({"edits": [
        {"op": "replace", "target": "skill", "anchor": "Quote the code you comment on in backticks.",
         "content": "Never quote code."},
        {"op": "add", "target": "preamble", "content": "I am the reviewer now."},
        {"op": "delete", "target": "skill", "anchor": "# Skill: reviewer"},
        "add a rule", {"op": "add", "target": "skill", "content": 42}]})
    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(), backend=ScriptedReflect("reviewer", reply))
    assert r.status == "no_edits" and "5 edit(s), none applicable" in r.reason
    assert sorted(e["status"] for e in r.edits) == ["invalid", "invalid", "outside_block", "outside_block",
                                                    "outside_block"]
    assert store(tmp_path).skill_path.read_text() == default_document("reviewer", "skill")


def test_live_file_edited_during_the_night_is_a_conflict(tmp_path):
    world = SimWorld.load("reviewer")
    good = world.topics["sql-injection"].rule
    reply = json.dumps({"edits": [{"op": "add", "target": "skill", "content": good}]})
    s = store(tmp_path)

    def person_edits(_request):
        s.skill_path.write_text(s.skill_path.read_text() + "\nA line the user added.\n")

    r, files = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(),
                         backend=ScriptedReflect("reviewer", reply, person_edits))
    assert r.gate_action == "accept" and r.status == "conflict" and "changed since the night read it" in r.reason
    assert s.skill_path.read_text().endswith("A line the user added.\n") and good not in s.skill_path.read_text()
    staged = files.extra["candidate_skill"].read_text()
    assert good in staged


def test_val_overlapping_train_is_reject_unverified(tmp_path):
    from dataclasses import replace

    from sage_pipeline.sleep.harvest import PACKAGED_TASKS
    from sage_pipeline.sleep.records import DEFAULT_SPLIT, read_task_file

    twins = []  # each val task again, under an id that hashes to train: same content, two splits
    for t in (t for t in read_task_file(PACKAGED_TASKS / "reviewer.jsonl").tasks if t.split == "val"):
        tid = next(f"twin-{t.id}-{i}" for i in range(100) if DEFAULT_SPLIT.of(f"twin-{t.id}-{i}") == "train")
        twins.append(replace(t, id=tid, split="train"))
    write_task_file(tmp_path / "sleep" / "reviewer" / "tasks" / "twins.jsonl", twins)
    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings())
    assert len(r.tasks["val_overlapping_train"]) == len(twins)
    assert r.status == "reject_unverified" and r.gate_action == "reject_unverified" and "not verified" in r.reason
    assert [v.action for v in store(tmp_path).versions()] == ["initial"]


def test_block_never_grows_past_its_cap(tmp_path):
    cap = 180
    cfg = CycleConfig(limits=EditLimits(edit_budget=4, block_max_chars=cap, max_rule_chars=120), gate=STRICT)
    rs = [run_night(tmp_path, "reviewer", d, None, settings(cycle=cfg))[0] for d in nights(5)]
    s = store(tmp_path)
    for v in s.versions():
        snap = s.read_version(v.version)
        for raw in (snap.skill, snap.memory):
            assert parse_document(raw.decode()).block_chars() <= cap
    statuses = {e["status"] for r in rs for e in r.edits}
    ops = {e["op"] for r in rs for e in r.edits if e["status"] == "accepted"}
    assert "over_cap" in statuses or "replace" in ops


def test_memory_can_be_frozen(tmp_path):
    cfg = CycleConfig(evolve_memory=False, gate=STRICT)
    rs = [run_night(tmp_path, "reviewer", d, None, settings(cycle=cfg))[0] for d in nights(3)]
    assert store(tmp_path).memory_path.read_text() == default_document("reviewer", "memory")
    assert all(e["target"] == "skill" for r in rs for e in r.edits if e["status"] == "accepted")


def test_bundle_gate_and_gate_off_modes(tmp_path):
    bundle = run_night(tmp_path / "a", "reviewer", "2026-11-03", None,
                       settings(cycle=CycleConfig(gate=GateConfig(test="strict", granularity="bundle"))))[0]
    assert len(bundle.trials) == 1
    off = run_night(tmp_path / "b", "reviewer", "2026-11-03", None,
                    settings(cycle=CycleConfig(gate=GateConfig(mode="off"))))[0]
    assert off.status == "accepted" and all(t["verdict"] == "gate_off" for t in off.trials)


def test_coder_night_judges_code_in_the_sandbox(tmp_path):
    r, _ = run_night(tmp_path, "coder", "2026-11-03", None, settings())
    assert r.sandbox["sandbox"] == "local" and r.sandbox["executions"] > 0
    whys = [row["why"] for row in r.per_task if row["why"]]
    assert any(w.startswith(("wrong_answer", "exception")) for w in whys)
    assert r.tasks["by_kind"]["unit_tests"] > 0 and r.status in ("accepted", "rejected", "no_edits")


def test_a_sandbox_that_cannot_start_is_a_judge_error_not_a_score(tmp_path):
    from sage_pipeline.sleep.block import parse_document as parse
    from sage_pipeline.sleep.cycle import NightResult, run_cycle
    from sage_pipeline.sleep.judges import UnitTestJudge

    world = SimWorld.load("coder")
    docs = {k: parse(default_document("coder", k)) for k in ("skill", "memory")}
    unit = UnitTestJudge(sandbox="docker", options={"image": f"sage-sim-absent-{tmp_path.name.lower()}:none"})
    r = NightResult(skill="coder", date="2026-11-03")
    run_cycle(world.generate_tasks(seed=0, per_topic=2), docs, SimulatedBackend(world), unit, CycleConfig(), r,
              commit=lambda texts: pytest.fail("nothing may be committed"))
    assert r.status == "judge_error" and r.phase == "baseline_val"
    assert "sandbox did not start" in r.cause
    assert r.scores["baseline_val"] is None


def test_a_whole_night_over_http_learns_from_a_model_that_follows_its_memory(tmp_path, chat_server):
    """The OpenAI-compatible path end to end: the loopback 'model' answers 404 only when its system
    prompt (skill + memory) says so, and reflects by proposing that rule as JSON."""
    rule = "Missing users are answered with HTTP 404."

    def model(body: dict) -> str:
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if "You improve an agent's skill document" in system:
            assert "## Failures (train)" in user and "## memory learned block" in user
            return "Here you go:\n```json\n" + json.dumps({"edits": [
                {"op": "add", "target": "memory", "content": rule, "rationale": "the 404 tasks failed"},
                {"op": "add", "target": "skill", "content": "Be brief."}]}) + "\n```"
        return "404" if rule in system else "400"

    chat_server.script = [("fn", model)]
    tasks = [{"id": f"http-{i}", "intent": f"Which status for missing user {i}? Number only.",
              "reference_kind": "exact", "reference": "404"} for i in range(24)]
    d = tmp_path / "sleep" / "tasks"
    d.mkdir(parents=True)
    (d / "http.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    b = OpenAIBackend(OpenAIConfig(base_url=chat_server.base_url, model="tiny"), sleep=lambda s: None)
    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(embedded_tasks=False), backend=b)
    assert r.status == "accepted", (r.status, r.reason, r.cause)
    assert r.scores["baseline_val"]["hard"] == 0.0 and r.scores["candidate_val"]["hard"] == 1.0
    assert r.scores["test_before"]["hard"] == 0.0 and r.scores["test_after"]["hard"] == 1.0
    assert [(e["content"], e["status"]) for e in r.edits] == [(rule, "accepted"), ("Be brief.", "rejected")]
    assert rule in store(tmp_path).memory_path.read_text()
    assert r.calls["calls"] == len(chat_server.requests) and r.calls["by_purpose"]["reflect"]["calls"] == 1


# a failed night's record on disk is this night's ---------------------------------------------------

class BreaksAtCall(SimulatedBackend):
    """The simulated backend that raises ``error`` (not a BackendError) at its ``at``-th solve
    (0: never), calling ``on_first`` at the first."""

    def __init__(self, skill: str, at: int, error: BaseException | None = None, on_first=None) -> None:
        super().__init__(SimWorld.load(skill), night="2026-11-03")
        self.at, self.error, self.on_first, self.n = at, error, on_first, 0

    def solve(self, task, skill, memory):
        self.n += 1
        if self.n == 1 and self.on_first:
            self.on_first()
        if self.n == self.at:
            raise self.error
        return super().solve(task, skill, memory)


def night_files(root, d):
    folder = root / "sleep" / "reviewer" / "nights" / d
    return folder, json.loads((folder / "diagnostics.json").read_text()), (folder / "report.md").read_text()


def test_a_night_stopped_by_a_bug_says_it_failed_and_moves_the_earlier_run_aside(tmp_path):
    earlier, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings())
    assert earlier.status == "accepted"
    r, files = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(),
                         backend=BreaksAtCall("reviewer", 30, ValueError("boom")))
    assert r.status == "internal_error" and r.phase == "train" and "an unexpected error" in r.reason
    assert r.cause.startswith("ValueError: boom (at test_nightly.py:") and "in solve)" in r.cause
    assert "raise self.error" in r.traceback and r.calls["calls"] > 0  # the calls made before it are kept
    folder, d, report = night_files(tmp_path, "2026-11-03")
    assert files.report == folder / "report.md"
    assert d["status"] == "internal_error" and d["cause"] == r.cause
    assert "**Status: internal_error**" in report and "This night failed" in report and "boom" in report
    assert "accepted" not in report.split("## Scores")[0]
    prev = json.loads((folder / "previous" / "diagnostics.json").read_text())
    assert prev["status"] == "accepted" and prev["started_at"] == earlier.started_at
    assert not (folder / "previous" / "previous").exists()


def test_a_killed_nights_half_written_files_are_not_moved_aside_with_its_result(tmp_path):
    """A night killed while writing leaves a temporary file (no live writer holds it); the next
    run moves the earlier files to previous/, where no later write would sweep it: it is removed."""
    run_night(tmp_path, "reviewer", "2026-11-03", None, settings())
    folder = tmp_path / "sleep" / "reviewer" / "nights" / "2026-11-03"
    (folder / ".diagnostics.json.k3j5h2g1.tmp").write_text('{"status": ')  # what kill -9 left
    (folder / "candidate").mkdir(exist_ok=True)
    (folder / "candidate" / ".SKILL.md.a1b2c3d4.tmp").write_text("half")
    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings())
    left = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.tmp"))
    assert left == [] and (folder / "previous" / "diagnostics.json").is_file()


def test_an_interrupted_night_is_recorded_as_aborted_then_raised(tmp_path):
    assert run_night(tmp_path, "reviewer", "2026-11-02", None, settings())[0].status == "accepted"
    with pytest.raises(KeyboardInterrupt):
        run_night(tmp_path, "reviewer", "2026-11-03", None, settings(),
                  backend=BreaksAtCall("reviewer", 5, KeyboardInterrupt()))
    _, d, report = night_files(tmp_path, "2026-11-03")
    assert d["status"] == "aborted" and d["cause"].startswith("KeyboardInterrupt") and d["finished_at"]
    assert "**Status: aborted**" in report and "This night failed" in report
    from sage_pipeline.sleep.report import load_history

    assert [(h["date"], h["status"]) for h in load_history(tmp_path / "sleep" / "reviewer")] == [
        ("2026-11-02", "accepted"), ("2026-11-03", "aborted")]
    with store(tmp_path).night_lock(0.5):  # the lock was released on the way out
        pass


def test_while_a_night_runs_its_folder_says_running_never_an_earlier_result(tmp_path):
    run_night(tmp_path, "reviewer", "2026-11-03", None, settings())
    seen = {}

    def look():  # what a reader (or a night killed right now) leaves on disk
        _, d, report = night_files(tmp_path, "2026-11-03")
        seen.update(status=d["status"], reason=d["reason"], report=report)

    r, _ = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(),
                     backend=BreaksAtCall("reviewer", 0, on_first=look))
    assert seen["status"] == "running" and "killed" in seen["reason"]
    assert "**Status: running**" in seen["report"] and "has not finished" in seen["report"]
    assert "accepted" not in seen["report"]
    assert night_files(tmp_path, "2026-11-03")[1]["status"] == r.status != "running"


def test_a_reply_with_a_bad_usage_field_ends_the_night_in_backend_error(tmp_path, chat_server):
    chat_server.script = [("json", {"choices": [{"message": {"content": "4"}}], "usage": 5})]
    b = OpenAIBackend(OpenAIConfig(base_url=chat_server.base_url, model="m", max_retries=1), sleep=lambda s: None)
    r, files = run_night(tmp_path, "reviewer", "2026-11-03", None, settings(), backend=b)
    assert r.status == "backend_error" and r.phase == "baseline_val"
    assert "'usage' is an integer 5, expected an object" in r.cause
    assert "This night failed" in files.report.read_text()
