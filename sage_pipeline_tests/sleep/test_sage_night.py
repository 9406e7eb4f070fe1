"""One night on SAGE's skills (sleep/sage_night.py), on hand-made tasks of the harvest's shape and a scripted chat
backend: the replayed prompt is SAGE's shape with the candidate's skills as SAGE's injector gives them; the val slice
is drawn afresh by date, test held out; a real effect is accepted and committed as a new live version with the rule
in the skill's learned block, a useless one is not; edits SAGE would not inject whole, or at all, are refused; and
every way a night can stop leaves the live version as it was, with a status, a cause and its diagnostics.
Last, the night end to end (SAGE_PYTHON): SAGE's real `sage run` in the model world, its runs harvested, one night
against the world's skills harness planted (accepted: the committed version carries the instruction and SAGE's next
runs log its shas) and one null (nothing accepted)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from sage_pipeline.sage import skills as sk
from sage_pipeline.sleep import sage_skills as sage_skills_mod
from sage_pipeline.sleep.backends import BackendError, CallLog, Reply
from sage_pipeline.sleep.block import normalise_rule
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.judges import JudgeError, Judgement, UnitTestJudge
from sage_pipeline.sleep.records import SplitSpec, task_from_dict
from sage_pipeline.sleep.sage_harvest import untrusted_judge
from sage_pipeline.sleep.sage_night import (
    CODER_USER,
    ERROR_STATUSES,
    STATUSES,
    UNIVERSAL_PREFIX,
    SageNightConfig,
    answer_code,
    role_messages,
    run_sage_night,
    split_tasks,
)
from sage_pipeline.sleep.sage_skills import SageSkillsRoot
from sage_pipeline_tests.hang_guard import finishes

TDD = "discipline/test-driven-development/SKILL.md"
VBC = "discipline/verification-before-completion/SKILL.md"
TDD_WF = "workflow/tdd-workflow/SKILL.md"
VLOOP = "workflow/verification-loop/SKILL.md"
RULE = "Run the function by hand on every example of the task before answering."
RIGHT = "def f(x):\n    return x + 1\n"
WRONG = "def f(x):\n    return x\n"
DATE = "2026-11-28"


def _task(i: int, kind: str = "unit_tests", intent: str | None = None, tid: str | None = None):
    ref = ({"entry_point": "f", "tests": [{"args": [1], "expected": 2}, {"args": [5], "expected": 6}], "timeout_s": 5}
           if kind == "unit_tests" else "2")
    return task_from_dict({"id": tid or f"sage/s{i:03d}", "intent": intent or f"[run {i}] write f(x) = x + 1, case {i}",
                           "reference_kind": kind, "reference": ref,
                           "meta": {"sage": {"artifact": f"sol_{i}.py", "entry_point": "f"}}}, f"test:{i}")


TASKS = [_task(i) for i in range(48)]


class Chat:
    """A chat backend that draws fresh answers: the coder writes the right file with chance ``p1`` when ``RULE`` is
    among the skills in its system message, else ``p0``; reflect answers ``reflect`` (a JSON string)."""

    def __init__(self, p0: float = 0.3, p1: float = 0.95, reflect: str | None = None, fail_at: int | None = None,
                 seed: int = 0, fresh: bool = True) -> None:
        self.p0, self.p1, self.fail_at, self.fresh = p0, p1, fail_at, fresh
        self.reflect = reflect if reflect is not None else json.dumps({"edits": [
            {"op": "add", "target": TDD, "content": RULE, "anchor": "", "rationale": "the failures"}]})
        self.rng = np.random.default_rng(seed)
        self.calls, self.n, self.sent = CallLog(), 0, []

    @property
    def draws_fresh(self) -> bool:
        return self.fresh

    def complete(self, messages: list[dict], purpose: str, max_tokens: int) -> Reply:
        self.n += 1
        self.sent.append((purpose, messages))
        if self.fail_at is not None and self.n >= self.fail_at:
            self.calls.error(purpose, 1, "HTTP 503 from the server: overloaded", True)
            raise BackendError("HTTP 503 from the server: overloaded (gave up after 5 attempts)", "transient",
                               purpose, 5)
        if purpose == "reflect":
            text = self.reflect
        else:
            skills = messages[0]["content"].partition(sk.PREFIX_HEADING)[2].partition("\n\n# Coder Instructions")[0]
            p = self.p1 if RULE in skills else self.p0
            code = RIGHT if self.rng.random() < p else WRONG
            text = json.dumps({"file": "sol.py", "operation": "create", "patch": code, "reason": "f",
                               "epistemic_flags": []})
        reply = Reply(text, 100, 20)
        self.calls.record(purpose, reply)
        return reply

    def describe(self) -> dict:
        return {"name": "scripted chat"}


class Judge:
    """Passes exactly the right file (what the sandbox would say of these two files)."""

    def __init__(self, fail: BaseException | None = None, on_run=None) -> None:
        self.fail, self.on_run, self.runs = fail, on_run, 0

    def run(self, items):
        self.runs += 1
        if self.on_run is not None:
            self.on_run(self.runs)
        if self.fail is not None:
            raise self.fail
        return [Judgement(1.0, 1.0) if code == RIGHT else Judgement(0.0, 0.5, "failed: 1/2 tests") for _, code in items]

    def describe(self) -> dict:
        return {"sandbox": "scripted"}

    def close(self) -> None:
        pass


@pytest.fixture
def root(tmp_path) -> SageSkillsRoot:
    return SageSkillsRoot(tmp_path / "skills")


def _night(root, backend=None, judge=None, tasks=TASKS, **cfg):
    """A night of the per-night gate (decisions='per_night', its old behaviour) unless ``decisions`` says otherwise:
    the ledger's nights are tested below, under "the ledger"."""
    cfg.setdefault("gate", GateConfig(samples=4))
    cfg.setdefault("decisions", "per_night")
    return run_sage_night(root, tasks, backend or Chat(), judge or Judge(), SageNightConfig(**cfg), date=DATE,
                          harvest={"sessions": len(tasks), "reasons": {"goal_not_found": 2}})


def _diag(r) -> dict:
    return json.loads(Path(r.diagnostics).read_text())


# ------------------------------------------------------------------ the prompt and the answer
def test_the_replayed_coder_prompt_is_sages_with_the_candidates_skills_injected():
    tree = {**sk.root_texts(), **{s: (sk.SKILL_TREE / s).read_text(encoding="utf-8") for s in sk.SKILL_IDS}}
    tree[TDD] += f"\n- {RULE}\n"
    t = _task(1, intent="[run 1] debug the parser's test of f")
    system, user = (m["content"] for m in role_messages("coder", tree, t))
    inj = sk.injection(tree, "coder", t.intent, "")
    assert [s.skill_id for s in inj.skills] == [TDD, VBC, "workflow/prompt-optimizer/SKILL.md",
                                                "workflow/documentation-lookup/SKILL.md",
                                                "discipline/systematic-debugging/SKILL.md"]  # the goal's keywords
    assert system == (UNIVERSAL_PREFIX.format(tools="create, edit, delete, run_command") + sk.PREFIX_HEADING
                      + inj.text + "\n\n# Coder Instructions\n\nTASK: " + system.split("TASK: ", 1)[1])
    assert RULE in system and user.startswith("Implement the following task.\n\nTASK: [run 1] debug")
    assert "sol_1.py" in user and "`f`" in user and user.endswith(CODER_USER.rsplit("}", 1)[1])
    bare = role_messages("coder", {s: "" for s in sk.SKILL_IDS}, t)[0]["content"]  # nothing injected
    assert sk.PREFIX_HEADING not in bare and "\n\n# Coder Instructions" in bare
    with pytest.raises(ValueError, match="replays coder only"):
        role_messages("reviewer", tree, t)


def test_the_code_is_the_patch_of_sages_patch_request_else_a_fenced_block_else_the_answer():
    assert answer_code(json.dumps({"file": "a.py", "operation": "create", "patch": RIGHT})) == (RIGHT, "patch")
    assert answer_code(f"Here:\n```python\n{RIGHT}```\n") == (RIGHT, "text")
    assert answer_code(json.dumps({"file": "a.py", "patch": ""})) == (json.dumps({"file": "a.py", "patch": ""}), "text")
    assert answer_code(WRONG) == (WRONG, "text")


def test_test_is_held_out_by_id_and_val_is_drawn_afresh_each_night():
    bad = [_task(900, kind="exact"), _task(901, tid=TASKS[0].id)]
    a, unusable = split_tasks([*TASKS, *bad], "2026-11-28", SplitSpec())
    b, _ = split_tasks(TASKS, "2026-11-29", SplitSpec())
    assert [x.id for x in a["test"]] == [x.id for x in b["test"]] and a["test"]
    assert {x.id for x in a["val"]} != {x.id for x in b["val"]}
    assert {x.id for x in a["val"] + a["train"]} == {x.id for x in b["val"] + b["train"]}
    assert {u["task"]: u["reason"][:20] for u in unusable} == {"sage/s900": "reference_kind 'exac",
                                                               TASKS[0].id: "duplicate id: the fi"}
    assert sum(len(v) for v in a.values()) == len(TASKS)
    share = len(a["val"]) / (len(a["val"]) + len(a["train"]))
    assert 0.15 < share < 0.55  # val : train is 1 : 2 in expectation


# ------------------------------------------------------------------ decisions
@pytest.mark.slow  # the local sandbox (about 1 s)
def test_a_rule_that_helps_is_accepted_and_committed_as_the_new_live_version(root):
    before, shas = root.live(), root.shas()
    unit = untrusted_judge("local", allow_untrusted_local=True)  # no Docker here; these tasks are the test's own
    try:
        r = _night(root, judge=unit)
    finally:
        unit.close()
    assert r.status == "accepted" and r.gate_action == "accept", r.reason
    assert r.status in STATUSES and r.versions["before"] == before and r.versions["after"] == root.live() != before
    text = root.text("live", TDD)
    assert text.startswith(root.text(before, TDD)) and f"- {RULE}\n<!-- sage:learned:end -->" in text
    assert len(text) <= sk.PER_SKILL_CAP and root.shas() == {**shas, TDD: sk.sha16(text)}
    assert r.shas["after"] == root.shas() and list(r.diff) == [TDD] and f"+- {RULE}" in r.diff[TDD]
    entry = root.versions()[-1]
    assert entry.action == "commit" and entry.parent == before and entry.changed == (TDD,)
    assert entry.reason.startswith(f"sage night {DATE} (coder): 1 of 1 edit(s) accepted by the paired gate")
    (trial,) = r.trials
    assert trial["accepted"] and trial["p_value"] <= trial["level"] == 0.05 and trial["samples"] == 4
    assert r.scores["candidate_val"]["score"] > r.scores["baseline_val"]["score"]
    assert r.scores["test_after"]["hard"] > r.scores["test_before"]["hard"]  # scored after the decision
    assert r.editable[:2] == [TDD, VBC] and TDD_WF not in r.editable
    assert r.sandbox["sandbox"] == "local" and r.sandbox["executions"] >= 2
    d = _diag(r)
    assert d["status"] == "accepted" and d["harvest"]["reasons"] == {"goal_not_found": 2}
    assert d["tasks"]["test_ids"] and d["calls"]["by_purpose"]["reflect"]["calls"] == 1


def test_a_useless_rule_is_rejected_and_the_live_version_is_kept(root):
    before = root.live()
    r = _night(root, backend=Chat(p0=0.5, p1=0.5))
    assert r.status == "rejected" and r.gate_action == "reject" and root.live() == before == r.versions["after"]
    assert r.trials and not r.trials[0]["accepted"] and r.edits[0]["status"] == "rejected"
    assert r.diff == {} and r.scores["test_after"] == r.scores["test_before"]
    assert _diag(r)["status"] == "rejected"


def test_reflect_offers_the_injected_skills_by_id_and_sages_caps_refuse_what_sage_would_cut(root):
    long_tdd = root.text("live", TDD) + "\n" + "- Keep the file tidy and readable.\n" * 46
    assert 3100 < len(long_tdd) <= sk.PER_SKILL_CAP
    root.commit({TDD: long_tdd}, "a long TDD skill")
    edits = [{"op": "add", "target": TDD_WF, "content": RULE}, {"op": "add", "target": VLOOP, "content": RULE},
             {"op": "add", "target": "discipline/nope/SKILL.md", "content": RULE},
             {"op": "add", "target": TDD, "content": RULE + " " + "Really. " * 10}]
    chat = Chat(reflect=json.dumps({"edits": edits}))
    before = root.live()
    r = _night(root, backend=chat, limits={"edit_budget": 4, "block_max_chars": 2000})
    assert r.status == "no_edits" and root.live() == before, r.reason
    got = {e["target"]: (e["status"], e["reason"]) for e in r.edits}
    assert got[TDD_WF][0] == "never_injected" and "SAGE never injects this skill" in got[TDD_WF][1]
    assert got[VLOOP][0] == "not_injected" and "not injected into the coder's prompt" in got[VLOOP][1]
    assert got["discipline/nope/skill.md"][0] == "invalid"  # not a skill: left as the parser read it
    assert got[TDD][0] == "over_sage_cap" and "over SAGE's per-skill cap of 3200" in got[TDD][1]
    (system, user) = next(m for p, m in chat.sent if p == "reflect")
    assert "Targets you may edit: " + ", ".join(sorted(r.editable)) + ". Each rule" in system["content"]
    assert '"target": "discipline/test-driven-development/SKILL.md" | ' in system["content"]
    assert f"## {TDD} learned block (0 characters left)" in user["content"]  # SAGE's cap leaves no room


def test_an_edit_past_sages_total_cap_is_refused(tmp_path):
    from sage_pipeline.sleep.sage_skills import SageSkillsConfig

    root = SageSkillsRoot(tmp_path / "skills", SageSkillsConfig(total_cap=5600))  # the coder's four skills: 5482
    r = _night(root, backend=Chat(reflect=json.dumps({"edits": [{"op": "add", "target": TDD, "content": RULE}]})))
    assert r.status == "no_edits" and r.edits[0]["status"] == "over_sage_cap"
    assert "total cap of 5600 characters would then cut" in r.edits[0]["reason"]


# ------------------------------------------------------------------ every way a night stops
@pytest.mark.parametrize("reply, status, why", [
    ("I would add a rule about examples.", "reflect_invalid", "could not be used"),
    (json.dumps({"edits": []}), "no_edits", "none applicable (none proposed)"),
])
def test_a_reply_without_usable_edits_changes_nothing(root, reply, status, why):
    before = root.live()
    r = _night(root, backend=Chat(reflect=reply))
    assert r.status == status and why in r.reason and root.live() == before


def test_no_tasks_or_no_failures_end_the_night_quietly(root):
    r = _night(root, tasks=[])
    assert r.status == "no_tasks" and "none in tonight's val slice" in r.reason and r.calls["calls"] == 0
    r = _night(root, tasks=[_task(1, kind="exact")])
    assert r.status == "no_tasks" and r.unusable[0]["task"] == "sage/s001"
    r = _night(root, backend=Chat(p0=1.0, p1=1.0))
    assert r.status == "no_edits" and "train replays pass" in r.reason


def test_a_backend_failing_in_the_gate_ends_the_night_with_its_cause_and_keeps_the_live_version(root):
    before = root.live()
    n_val = len(split_tasks(TASKS, DATE, SplitSpec())[0]["val"])
    r = _night(root, backend=Chat(fail_at=n_val * 4 + 40))  # after the baseline and train, during the gate
    assert r.status == "backend_error" and r.phase == "gate" and "HTTP 503" in r.cause
    assert root.live() == before == r.versions["after"] and r.call_errors and not r.ok
    d = _diag(r)
    assert d["status"] == "backend_error" and d["scores"]["baseline_val"] is not None and d["finished_at"]


def test_a_judge_failure_or_a_bug_ends_the_night_and_keeps_the_live_version(root):
    before = root.live()
    r = _night(root, judge=Judge(fail=JudgeError("unit-test judge: the docker sandbox did not start")))
    assert r.status == "judge_error" and "did not start" in r.cause and r.phase == "baseline_val"
    r = _night(root, judge=Judge(fail=RuntimeError("boom")))
    assert r.status == "internal_error" and r.status in ERROR_STATUSES and "RuntimeError: boom" in r.cause
    assert "Traceback" in r.traceback and root.live() == before and _diag(r)["status"] == "internal_error"


def test_an_interrupt_is_recorded_then_raised(root):
    with pytest.raises(KeyboardInterrupt):
        _night(root, judge=Judge(fail=KeyboardInterrupt()))
    d = json.loads((root.folder / "nights" / DATE / "coder" / "diagnostics.json").read_text())
    assert d["status"] == "aborted" and d["finished_at"]


def test_a_root_changed_during_the_night_is_a_conflict_and_nothing_is_overwritten(root):
    other = "discipline/systematic-debugging/SKILL.md"

    def meanwhile(n: int) -> None:
        if n == 3:  # baseline, train, then the gate's trial
            root.commit({other: root.text("live", other) + "\n- Read the traceback first.\n"}, "another change")
    r = _night(root, judge=Judge(on_run=meanwhile))
    assert r.status == "conflict" and "another change went live" in r.reason
    assert RULE in r.candidate[TDD] and RULE not in root.text("live", TDD)
    assert root.versions()[-1].reason == "another change"


def test_bad_settings_and_backends_are_refused_with_what_to_do(root, monkeypatch):
    with pytest.raises(ValidationError, match="role"):
        SageNightConfig(role="reviewer")
    with pytest.raises(ValidationError, match="train \\+ val < 1"):
        SageNightConfig(split={"train": 0.6, "val": 0.5})
    with pytest.raises(ValidationError, match="extra"):
        SageNightConfig(samples=3)
    r = run_sage_night(root, TASKS, object(), Judge(), date=DATE)
    assert r.status == "input_error" and "complete(messages, purpose, max_tokens)" in r.reason
    broken = root.text("live", TDD) + "\n<!-- sage:learned:begin -->\n<!-- sage:learned:begin -->\n"
    with monkeypatch.context() as m:  # a root written before commits checked the block (sage_skills.check_edit)
        m.setattr(sage_skills_mod, "check_edit", lambda sid, text, where="": text)
        root.commit({TDD: broken}, "an edit by hand that broke the block")
    r = _night(root)
    assert r.status == "input_error" and "2 learned-block begin markers" in r.cause and root.text("live", TDD) == broken
    shutil.rmtree(root.folder / "nights")
    (root.folder / "nights").write_text("not a folder")
    with pytest.raises(ValueError, match="a file where the folder of the nights' diagnostics belongs"):
        _night(root)


def test_the_assets_work_reads_sages_journals_and_records_a_failing_harvest_or_online_check(tmp_path, monkeypatch):
    """run_sage_skills on the committed journals of six `sage run`s (their workspaces lack the test files, so no task):
    the online check reads every run, the night ends no_tasks without ever starting a backend; a sandbox failing in
    the harvest is a judge_error night with its diagnostics, a failing online check is shown and the night still
    runs."""
    from sage_pipeline.sleep import sage_harvest, sage_night
    from sage_pipeline.sleep.sage_night import SageSkillsSettings, run_sage_skills

    fixture = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_world_run"
    spaces = [str(shutil.copytree(fixture / ws, tmp_path / ws)) for ws in ("ws-0", "ws-1")]
    settings = SageSkillsSettings(workspaces=spaces, sandbox="local", allow_untrusted_local=True, openai={"model": ""})
    o = run_sage_skills(tmp_path / "data", DATE, None, settings)
    assert o.configured and o.healthy and o.night.status == "no_tasks" and o.harvest["sessions"] == 6
    assert o.online.runs >= 4 and o.online.edits == [] and o.live["seq"] == 1 and o.night.calls["calls"] == 0
    assert o.night.backend["error"].startswith("the backend could not be set up: no model set")

    def sandbox_down(*a, **k):
        raise JudgeError("unit-test judge: the docker sandbox did not start: no daemon")

    def journals_unreadable(*a, **k):
        raise OSError("journal folder unreadable")

    monkeypatch.setattr(sage_harvest, "harvest_sage", sandbox_down)
    monkeypatch.setattr(sage_night, "runs_from_journals", journals_unreadable)
    o = run_sage_skills(tmp_path / "data", "2026-11-29", None, settings)
    assert not o.healthy and o.night.status == "judge_error" and o.night.phase == "harvest"
    assert "no daemon" in o.night.cause and json.loads(Path(o.night.diagnostics).read_text())["status"] == "judge_error"
    assert o.online is None and "journal folder unreadable" in o.online_error and "online check failed" in o.message


# ------------------------------------------------------------------ what the night reads is hostile
FIXTURE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_world_run"
ARTIFACT, GATE_TESTS = "sol_best_window_0000.py", "tests/test_sol_best_window_0000.py"  # run 0 of ws-0, as SAGE logged
CODE = "def best_window(xs, k):\n    return max(sum(xs[i:i + k]) for i in range(len(xs) - k + 1))\n"


def _workspace(tmp_path, name: str, tests: str | None = None) -> Path:
    """SAGE's ws-0 (its journal, written by SAGE), with run 0's code and, when given, its gate's test file."""
    ws = shutil.copytree(FIXTURE / "ws-0", tmp_path / "spaces" / name)
    (ws / ARTIFACT).write_text(CODE)
    (ws / "tests").mkdir()
    if tests is not None:
        (ws / GATE_TESTS).write_text(tests)
    return ws


def _ledger(tmp_path) -> str:
    from sage_pipeline.sleep.sage_harvest import write_goal_ledger

    runs = [json.loads(x) for x in (FIXTURE / "runs.jsonl").read_text().splitlines()]
    return str(write_goal_ledger(tmp_path / "goals.jsonl", [{"session_id": r["sessions"][0], "goal": f"the goal "
                                                             f"of {r['run']}"} for r in runs]))


def _within(fn, timeout_s: float = 120.0):
    return finishes(fn, timeout_s)


def test_a_night_on_hostile_workspaces_never_hangs_and_counts_what_it_could_not_use(tmp_path):
    from sage_pipeline.sleep.sage_night import SageSkillsSettings, run_sage_skills

    fifo = _workspace(tmp_path, "fifo")
    os.mkfifo(fifo / GATE_TESTS)
    zero = _workspace(tmp_path, "zero")
    (zero / GATE_TESTS).symlink_to("/dev/zero")
    os.mkfifo(zero / "memory" / "sessions" / "2026-11-29.log")  # a journal that is a FIFO
    settings = SageSkillsSettings(workspaces=[str(fifo), str(zero)], goal_ledgers=[_ledger(tmp_path)],
                                  openai={"model": ""})
    o = _within(lambda: run_sage_skills(tmp_path / "data", DATE, None, settings))
    assert o.night.status == "no_tasks" and o.harvest["reasons"]["unsafe_tests_file"] == 2
    assert o.harvest["unsafe"] == {"not_regular": 1, "link": 1}
    assert any(m["path"].endswith("zero/memory/sessions/2026-11-29.log") and "a FIFO" in m["reason"]
               for m in o.harvest["missing"])  # the ingest's listing says so; never opened
    d = json.loads(Path(o.night.diagnostics).read_text())
    assert d["harvest"]["unsafe"] == o.harvest["unsafe"]
    details = [ex["detail"] for ex in d["harvest"]["examples"]["unsafe_tests_file"]]
    assert any("fifo/tests/test_sol_best_window_0000.py: refused (not_regular" in x for x in details)
    assert any("zero/tests/test_sol_best_window_0000.py: refused (link" in x for x in details)


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError("a bug in the harvest")])
def test_a_harvest_that_raises_still_writes_the_nights_diagnostics(tmp_path, monkeypatch, error):
    from sage_pipeline.sleep import sage_harvest
    from sage_pipeline.sleep.sage_night import SageSkillsSettings, run_sage_skills

    def raises(*a, **k):
        raise error

    monkeypatch.setattr(sage_harvest, "harvest_sage", raises)
    settings = SageSkillsSettings(workspaces=[str(_workspace(tmp_path, "ws"))], openai={"model": ""})
    o = run_sage_skills(tmp_path / "data", DATE, None, settings)
    assert o.night.status == "internal_error" and o.night.phase == "harvest" and not o.healthy
    assert type(error).__name__ in o.night.cause and "Traceback" in o.night.traceback
    d = json.loads(Path(o.night.diagnostics).read_text())
    assert d["status"] == "internal_error" and d["finished_at"] and d["sandbox"]["untrusted"] is True


def test_the_night_refuses_a_judge_not_opened_for_untrusted_code(root):
    before = root.live()
    r = run_sage_night(root, TASKS, Chat(), UnitTestJudge(sandbox="local"), date=DATE)
    assert r.status == "input_error" and "without untrusted=True" in r.cause and "allow_untrusted_local" in r.cause
    assert root.live() == before and r.calls["calls"] == 0 and _diag(r)["sandbox"]["untrusted"] is False


def _writes_on_the_host(host: Path) -> str:
    return (f"import pathlib\nfrom sol_best_window_0000 import best_window\n\n"
            f"pathlib.Path({str(host)!r}).write_text('written by a harvested test')\n\n\n"
            "def test_window():\n    assert best_window([1, 2, 3], 2) == 5\n")


def test_harvested_tests_never_run_unisolated_without_the_explicit_override(tmp_path):
    """SAGE's tests are model-written: the sandbox is opened untrusted, so the local backend refuses them (a judge_error
    night, its diagnostics saying why and which backend) and the hostile test's file is never written."""
    from sage_pipeline.sleep.sage_night import SageSkillsSettings, run_sage_skills

    host = tmp_path / "host-file-written-by-a-test"
    ws = _workspace(tmp_path, "ws", _writes_on_the_host(host))
    settings = SageSkillsSettings(workspaces=[str(ws)], goal_ledgers=[_ledger(tmp_path)], sandbox="local",
                                  openai={"model": ""})
    o = run_sage_skills(tmp_path / "data", DATE, None, settings)
    assert o.night.status == "judge_error" and o.night.phase == "harvest", o.night.reason
    assert "UNISOLATED" in o.night.cause and "allow_untrusted_local=True" in o.night.cause
    assert not host.exists()
    d = json.loads(Path(o.night.diagnostics).read_text())
    assert d["sandbox"]["sandbox"] == "local" and d["sandbox"]["untrusted"] is True
    assert d["sandbox"]["allow_untrusted_local"] is False


@pytest.mark.slow  # the local sandbox (about 1 s)
def test_the_override_runs_them_locally_and_the_diagnostics_say_so(tmp_path):
    from sage_pipeline.defs.sleep_assets import sage_skills_metadata
    from sage_pipeline.sleep.sage_night import SageSkillsSettings, run_sage_skills

    host = tmp_path / "host-file-written-by-a-test"
    ws = _workspace(tmp_path, "ws", _writes_on_the_host(host))
    settings = SageSkillsSettings(workspaces=[str(ws)], goal_ledgers=[_ledger(tmp_path)], sandbox="local",
                                  allow_untrusted_local=True, openai={"model": ""})
    o = run_sage_skills(tmp_path / "data", DATE, None, settings)
    assert o.night.status == "no_model" and o.harvest["validated"] == 1, (o.night.reason, o.harvest)  # no model set
    assert host.exists()  # the override's stated risk: unisolated, a harvested test writes on this machine
    d = json.loads(Path(o.night.diagnostics).read_text())["sandbox"]
    assert (d["sandbox"], d["untrusted"], d["allow_untrusted_local"], d["isolated"]) == ("local", True, True, False)
    assert "allow_untrusted_local" in d["note"]
    assert "UNISOLATED" in sage_skills_metadata(o)["sandbox"] and "allow_untrusted_local" in sage_skills_metadata(o)[
        "sandbox"]


# ------------------------------------------------------------------ the ledger (decisions="ledger", the default)
NEXT = "2026-11-29"


def _ledger_path(root) -> Path:
    return root.folder.parent / "decisions" / "ledger.json"


def _ledger_night(root, date=DATE, backend=None, judge=None, tasks=TASKS, **cfg):
    cfg.setdefault("gate", GateConfig(samples=4))
    from sage_pipeline.decisions.evidence import EvidenceConfig
    from sage_pipeline.decisions.ledger import Ledger, LedgerConfig

    if not _ledger_path(root).exists():  # bets at half the safe one: one night of these few tasks cannot accept
        Ledger.load(_ledger_path(root), LedgerConfig(evidence=EvidenceConfig(cap=0.5))).save()
    return run_sage_night(root, tasks, backend or Chat(), judge or Judge(), SageNightConfig(**cfg), date=date,
                          ledger=_ledger_path(root))


def _arms(r) -> dict:
    return {a["arm"]: a for a in r.ledger["plan"]["arms"]}


def test_ledger_a_night_with_too_little_data_adds_its_evidence_and_says_how_much_more_is_needed(root):
    assert SageNightConfig().decisions == "ledger"
    before = root.live()
    r = _ledger_night(root)
    assert r.status == "pending" and r.gate_action == "pending" and root.live() == before, r.reason
    (row,) = r.ledger["candidates"]
    assert row["state"] == "pending" and row["tonight"]["proposed"] == "new"
    assert row["tonight"]["replay"] == {"added": r.tasks["val"], "left_out": {}}
    assert re.fullmatch(r"pending: evidence \d+\.\d of the 40 needed, about \d+ more val tasks \(\d+ so far\) at the "
                        r"current effect \(estimate \+0\.\d{3}\)", row["standing"]), row["standing"]
    assert row["standing"] in r.reason and "not a verdict" in r.reason
    assert r.edits[0]["status"] == "pending" and r.edits[0]["candidate"] == row["id"]
    assert _diag(r)["ledger"]["candidates"][0]["standing"] == row["standing"]
    # the next night's plan: the candidate's version (committed, not live) on half the runs, through the launcher
    arms = _arms(r)
    assert {k: a["probability"] for k, a in arms.items()} == {"live": 0.5, f"cand-{row['id']}": 0.5}
    staged = Path(arms[f"cand-{row['id']}"]["SAGE_SKILLS_ROOT"])
    assert staged.parent == root.versions_dir and f"- {RULE}\n" in (staged / TDD).read_text()
    assert staged.name not in {e.version for e in root.versions()} and root.live() == before
    assert Path(arms["live"]["SAGE_SKILLS_ROOT"]) == root.live_path() and Path(r.ledger["plan"]["launcher"]).is_file()
    assert r.scores["test_after"] == r.scores["test_before"]  # nothing changed: the test split says the same


def test_ledger_the_same_rule_the_next_night_continues_its_candidate_until_its_level_is_reached(root):
    from sage_pipeline.decisions.ledger import Ledger

    before = root.live()
    first = _ledger_night(root)
    assert first.status == "pending"
    n1 = first.ledger["candidates"][0]["observations"]["replay"]
    r = _ledger_night(root, NEXT)
    (row,) = [x for x in r.ledger["candidates"] if x["id"] == first.ledger["candidates"][0]["id"]]
    assert row["tonight"]["proposed"] == "continued" and len(Ledger.load(_ledger_path(root)).of("skills")) == 1
    tonight = row["tonight"]["replay"]
    assert row["observations"]["replay"] == n1 + tonight["added"] and tonight["added"] > 0
    # tonight's val slice is drawn afresh: the tasks reflect saw last night, in it now, are not the rule's evidence
    assert tonight["added"] + sum(tonight["left_out"].values()) == r.tasks["val"]
    assert set(tonight["left_out"]) <= {"selected on (reflect saw it, or a task asking the same)"}
    assert r.status == "accepted" and r.gate_action == "accept", r.reason
    live = root.live()
    assert live != before and r.versions["after"] == live and f"- {RULE}\n<!-- sage:learned:end -->" in root.text(
        live, TDD)
    entry = root.versions()[-1]
    assert entry.action == "commit" and entry.parent == before and "the decision ledger: accepted skills-0001" in \
        entry.reason
    c = Ledger.load(_ledger_path(root)).get(row["id"])
    assert c.state == "accepted" and c.payload["version"] == live and c.payload["added"] == [RULE]
    assert "reached the 40" in c.history[-1].reason
    arms = _arms(r)  # on probation: a tenth of the runs keep the tree without the rule
    assert arms[f"prev-{c.id}"]["probability"] == pytest.approx(0.1) and arms["live"]["probability"] == pytest.approx(
        0.9)
    assert RULE not in (Path(arms[f"prev-{c.id}"]["SAGE_SKILLS_ROOT"]) / TDD).read_text()
    assert r.scores["test_after"]["hard"] > r.scores["test_before"]["hard"]


def test_ledger_a_useless_rule_is_never_made_live(root):
    from sage_pipeline.decisions.ledger import Ledger

    before = root.live()
    for date in (DATE, NEXT, "2026-11-30"):
        r = _ledger_night(root, date, backend=Chat(p0=0.5, p1=0.5, seed=hash(date) % 1000))
        assert r.status in ("pending", "rejected") and root.live() == before, r.reason
    (c,) = Ledger.load(_ledger_path(root)).of("skills")
    assert c.state in ("pending", "dropped") and len({n.night for n in c.nights}) == 3
    assert len(root.versions()) == 1


def test_ledger_a_reverted_rule_is_a_new_version_without_it_even_on_a_night_without_tasks(root):
    """An accepted rule whose probation evidence excludes a gain of min_useful_gain (here: it hurts) is reverted on
    the next night, though that night has no task to replay: a new version without the rule, the old one intact."""
    from sage_pipeline.decisions import skills as ls
    from sage_pipeline.decisions.ledger import Ledger
    from sage_pipeline.sleep.block import parse_document

    with_rule = root.commit({TDD: parse_document(root.text("live", TDD)).with_rules((RULE,)).render()},
                            "the rule, as the ledger committed it")
    led = Ledger.load(_ledger_path(root))
    c = ls.propose(led, ls.RuleChange("add", TDD, RULE), night="2026-11-20", normalise=normalise_rule).candidate
    led.transition(c.id, "accepted", night="2026-11-20", reason="test")
    c.payload.update(version=with_rule.version, added=[RULE])
    led.add_evidence(c.id, ls.REPLAY, [-0.5] * 20, -1, 1, [f"2026-11-21/t{i}" for i in range(20)])
    led.save()
    r = _ledger_night(root, tasks=[])
    assert r.gate_action == "revert" and r.status == "accepted" and "skills-0001 reverted" in r.reason, r.reason
    assert "no usable task" not in r.reason and RULE not in root.text("live", TDD)
    last = root.versions()[-1]
    assert last.action == "rollback" and last.parent == with_rule.version and root.live() == last.version
    assert RULE in root.text(with_rule.version, TDD)  # a revert is a new version, never an edit of the old
    back = Ledger.load(_ledger_path(root)).get(c.id)
    assert back.state == "reverted" and back.payload["reverted_in"] == last.version


def test_ledger_a_commit_refused_saves_nothing_so_the_ledger_never_says_a_rule_is_live_that_is_not(root):
    from sage_pipeline.decisions.ledger import Ledger

    other = "discipline/systematic-debugging/SKILL.md"
    _ledger_night(root)
    seq = Ledger.load(_ledger_path(root)).data.seq

    def meanwhile(n: int) -> None:
        if n == 3:  # baseline, train, then the candidate's replay
            root.commit({other: root.text("live", other) + "\n- Read the traceback first.\n"}, "another change")
    r = _ledger_night(root, NEXT, judge=Judge(on_run=meanwhile))
    assert r.status == "conflict" and "another change went live" in r.reason and "not saved" in r.reason
    assert RULE in r.candidate[TDD] and RULE not in root.text("live", TDD)
    led = Ledger.load(_ledger_path(root))
    assert led.data.seq == seq and led.of("skills")[0].state == "pending"


@pytest.mark.parametrize("decisions", ["ledger", "per_night"])
def test_both_modes_stop_the_same_way_on_a_failing_judge(root, decisions):
    before = root.live()
    r = _night(root, judge=Judge(fail=JudgeError("unit-test judge: the docker sandbox did not start")),
               decisions=decisions)
    assert r.status == "judge_error" and root.live() == before and r.gate["decisions"] == decisions


# ------------------------------------------------------------------ end to end: SAGE's real `sage run` (sage_contract)
WORLD_RUNS = 16  # 16 runs -> about 10 val tasks tonight: the paired test at 0.05 needs 5 changed val tasks


@pytest.fixture(scope="module")
def sage_world(sage_python, tmp_path_factory):
    """Sixteen `sage run`s of SAGE's packaged skills (SAGE_SKILLS_ROOT at the project's root, version 1) in a world
    planted on the coder (delta 0.5: the instruction makes its first file right), harvested for the coder."""
    from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, goal, run_day
    from sage_pipeline.sage_world.server import WorldServer
    from sage_pipeline.sage_world.skills_world import SkillsWorldConfig
    from sage_pipeline.sage_world.world import WorldConfig, build_world
    from sage_pipeline.sleep.sage_harvest import SageHarvestConfig, harvest_sage, write_goal_ledger

    tmp = tmp_path_factory.mktemp("sage_night")
    install = SageInstall.find(sage_python)
    world = build_world(install.models_yaml, n_tasks=40, task_seed=1, config=WorldConfig(clock_scale=0.0),
                        skills=SkillsWorldConfig(mode="planted", delta=0.5, reflect_propose=1.0, reflect_useless=0))
    root = SageSkillsRoot(tmp / "skills")
    world.skills.know(root.texts("live"))
    srv = WorldServer(world).start()
    day = run_day(world, srv.url, install, 1, [t.task_id for t in world.tasks[:WORLD_RUNS]], tmp / "day1",
                  HarnessConfig(workers=2), skills_root=root.live_path())
    assert day.finished == WORLD_RUNS, day.failures
    ledger = write_goal_ledger(tmp / "goals.jsonl", [{"session_id": r.sessions[0], "goal": goal(
        r.run, world.tasks[world.by_id[r.task_id]].prompt)} for r in day.runs])
    h = harvest_sage(sorted((tmp / "day1").glob("ws-*")), None, "coder",  # the model world's code: the override
                     SageHarvestConfig(goal_ledgers=(ledger,), sandbox="local", allow_untrusted_local=True))
    assert len(h.tasks) >= WORLD_RUNS - 3 and h.validated == len(h.tasks), h.summary()
    yield {"world": world, "srv": srv, "install": install, "root": root, "day": day, "harvest": h, "tmp": tmp}
    srv.stop()


def _world_night(root, h, url: str, model: str, alpha: float = 0.05):
    from sage_pipeline.sleep.backends import OpenAIBackend, OpenAIConfig

    backend = OpenAIBackend(OpenAIConfig(base_url=url + "/v1", model=model, temperature=0.7, max_retries=1))
    unit = untrusted_judge("local", allow_untrusted_local=True)  # the model world's code: the override is safe here
    cfg = SageNightConfig(gate=GateConfig(samples=16, alpha=alpha), split=SplitSpec(train=0.25, val=0.65),
                          train_samples=4, decisions="per_night")
    try:
        return run_sage_night(root, h.tasks, backend, unit, cfg, date=DATE, harvest=h.summary())
    finally:
        unit.close()


def test_a_planted_rule_is_accepted_and_sages_next_runs_log_the_new_versions_shas(sage_world):
    """The world answers reflect with its planted instruction; the replayed coder, with the candidate's skills in
    SAGE's prompt shape, is right far more often; the gate accepts, the committed version carries the instruction in
    the TDD skill's learned block, and SAGE's unchanged `sage run` with SAGE_SKILLS_ROOT at the new live version logs
    its shas (the done-when's contract, after a night that accepted an edit); the online check maps those runs to it."""
    from sage_pipeline.sage_world.harness import HarnessConfig, run_day
    from sage_pipeline.sage_world.skills_world import PLANTED_INSTRUCTION, skills_effect
    from sage_pipeline.sleep.sage_online import check, runs_from_journals
    from sage_pipeline.sleep.sage_skills import journal_injections

    w, root, h = sage_world["world"], sage_world["root"], sage_world["harvest"]
    before = root.live()
    r = _world_night(root, h, sage_world["srv"].url, w.row("coder")[0])
    assert r.status == "accepted", (r.reason, r.tasks, r.edits)
    assert r.tasks["val"] >= 5 and r.trials[0]["p_value"] <= 0.05 and r.trials[0]["candidate"] == 1.0
    live = root.live()
    assert live != before and r.versions["after"] == live and list(r.diff) == [TDD]
    text = root.text(live, TDD)
    assert f"- {PLANTED_INSTRUCTION}\n<!-- sage:learned:end -->" in text and len(text) <= sk.PER_SKILL_CAP
    assert skills_effect(root.texts(live), w.skills.config, task_description=h.tasks[0].intent).live
    assert w.skills.reflects and all(x["proposed_instruction"] for x in w.skills.reflects)
    w.skills.know(root.texts(live))
    day = run_day(w, sage_world["srv"].url, sage_world["install"], 2, [t.task_id for t in w.tasks[20:24]],
                  sage_world["tmp"] / "day2", HarnessConfig(workers=2), skills_root=root.live_path())
    assert day.finished == 4, day.failures
    log = journal_injections(day.sessions_dirs)
    shas = root.shas(live)
    assert log.problems == [] and log.events and all(e.shas == {s: shas[s] for s in e.skill_ids} for e in log.events)
    assert {e.shas[TDD] for e in log.events if e.agent_role == "coder"} == {shas[TDD]} != {r.shas["before"][TDD]}
    coder = [t for t in w.truth if t.get("agent") == "coder" and t.get("run", "").startswith("d02-")]
    assert len(coder) == 4 and all(t["instruction_live"] for t in coder)
    runs = runs_from_journals([*sage_world["day"].sessions_dirs, *day.sessions_dirs], "coder")
    rep = check(root, runs, date="2026-11-29")
    tdd = {x["versions"].split("=")[0]: x["runs"] for x in rep.texts if x["skill"] == TDD}
    assert tdd.get("v2") == 4 and tdd.get("v1", 0) >= WORLD_RUNS - 2
    assert rep.edits[0]["decision"] in ("no_harm", "cannot_tell") and rep.rollbacks == [] and root.live() == live


def test_a_null_world_accepts_nothing(sage_world, tmp_path):
    """The same tasks against a world whose skills change nothing (its reflect proposes useless rules only): the gate
    keeps none (its level here 0.01, so this test fails by chance at most once in a hundred runs; the gate's
    false-accept rate over many nights is the benchmark's, benchmarks/sleep_gate.py)."""
    from sage_pipeline.sage_world.server import WorldServer
    from sage_pipeline.sage_world.skills_world import SkillsWorldConfig
    from sage_pipeline.sage_world.world import ModelWorld, WorldConfig

    w = sage_world["world"]
    null = ModelWorld(w.sim, w.table, WorldConfig(seed=1, clock_scale=0.0),
                      skills=SkillsWorldConfig(mode="null", reflect_useless=2))
    for run in sage_world["day"].runs:
        null.assign(run.run, run.task_id)
    root = SageSkillsRoot(tmp_path / "skills")
    before = root.live()
    with WorldServer(null) as srv:
        r = _world_night(root, sage_world["harvest"], srv.url, w.row("coder")[0], alpha=0.01)
    assert r.status in ("rejected", "no_edits"), (r.status, r.reason)
    assert root.live() == before and len(root.versions()) == 1 and r.edits
    assert not any(e["status"] == "accepted" for e in r.edits)
    assert all(rec["proposed_instruction"] is False for rec in null.skills.reflects)
