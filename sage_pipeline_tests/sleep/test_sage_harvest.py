"""The harvest of sleep-cycle tasks from what SAGE's ``sage run`` leaves behind (sleep/sage_harvest.py).

Two kinds of input, both written by SAGE's own code:

* the committed journals of six `sage run`s (``routing/fixtures/sage_world_run``, SAGE's verbatim
  journals of a day in the model world; its README says how they were written), for the damaged-input
  tests that need no SAGE: the workspaces' files are not in that fixture, so every run counts its tests
  missing on disk until the damage says otherwise;
* a day of SAGE's real ``sage run`` in the model world, run once per session (:func:`sage_day`, about
  40 s; needs ``SAGE_PYTHON``: the sage_contract lane), whose workspaces and journals the harvest reads
  and whose truth (the world's tasks and their wrong candidates) says what the harvest must find.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sage_pipeline.sim.schema import TaskRecord as SimTask
from sage_pipeline.sleep.judges import UnitTestJudge
from sage_pipeline.sleep.records import TaskRecordError, normalise_reference
from sage_pipeline.sleep.sage_harvest import (
    REASONS,
    NotRunnable,
    SageHarvestConfig,
    SageHarvestError,
    gate_command,
    harvest_sage,
    read_gate_tests,
    untrusted_judge,
    write_goal_ledger,
)
from sage_pipeline_tests.hang_guard import finishes
from sage_pipeline_tests.sim.sandbox_fixtures import docker_ready  # noqa: F401 - the Docker sandbox's fixture

FIXTURE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_world_run"
RUNS = [json.loads(line) for line in (FIXTURE / "runs.jsonl").read_text().splitlines()]


def _adds_up(res) -> None:
    assert res.sessions == len(res.tasks) + sum(res.reasons.values()), res.summary()
    assert set(res.reasons) <= set(REASONS)


@pytest.fixture
def fixture_copy(tmp_path) -> tuple[list[Path], Path]:
    """The committed SAGE journals in fresh workspaces, and a goal ledger naming every run's session."""
    spaces = []
    for ws in sorted(FIXTURE.glob("ws-*")):
        shutil.copytree(ws, tmp_path / ws.name)
        spaces.append(tmp_path / ws.name)
    ledger = write_goal_ledger(tmp_path / "goals.jsonl", [{"session_id": r["sessions"][0], "goal": f"the goal of "
                                                           f"{r['run']}: {r['task_id']}"} for r in RUNS])
    return spaces, ledger


def _journal(ws: Path) -> Path:
    (path,) = (ws / "memory" / "sessions").glob("*.log")
    return path


def _line_of(path: Path, session: str, typ: str, last: bool = True, **fields) -> int:
    """The (last) line number of ``path`` holding a ``typ`` event of ``session`` with ``fields``."""
    hits = [i for i, line in enumerate(path.read_text().splitlines(), start=1) if line.startswith("{")
            and (ev := json.loads(line)).get("type") == typ and ev.get("session_id") == session
            and all(ev.get(k) == v for k, v in fields.items())]
    assert hits, (path, session, typ, fields)
    return hits[-1] if last else hits[0]


# ------------------------------------------------------------------ damaged inputs (no SAGE needed)
def test_sage_journals_without_their_workspace_files_count_each_run_missing_its_tests(fixture_copy):
    spaces, ledger = fixture_copy
    res = harvest_sage(spaces, None, "coder", SageHarvestConfig(goal_ledgers=(ledger,)))
    assert res.sessions == 6 and not res.tasks and res.reasons == {"tests_missing_on_disk": 6}
    assert res.goals == 6 and not res.quarantined_lines and res.text_lines == {"text_checkpoint": 6}
    _adds_up(res)
    for ex in res.examples["tests_missing_on_disk"]:  # names the file the journal says was written, and the line
        file, line = ex["where"].rsplit(":", 1)
        assert ex["detail"].endswith(": missing") and "/tests/test_sol_" in ex["detail"]
        written = json.loads(Path(file).read_text().splitlines()[int(line) - 1])
        assert written["type"] == "TOOL_EXECUTED" and written["session_id"] == ex["session"]
        assert ex["detail"].split(": ")[0].endswith(written["file"])


def test_a_journal_cut_mid_line_ends_its_run_before_the_gate_and_quarantines_the_cut_line(fixture_copy):
    spaces, ledger = fixture_copy
    journal = _journal(spaces[1])
    last = next(r for r in reversed(RUNS) if r["worker"] == 1)["sessions"][0]
    verdict = _line_of(journal, last, "TRAJECTORY_STEP", verdict="PASS")
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:verdict - 1]) + lines[verdict - 1][:70])  # killed while writing the verdict
    res = harvest_sage(spaces, None, "coder", SageHarvestConfig(goal_ledgers=(ledger,)))
    assert res.reasons == {"journal_ends_before_gate": 1, "tests_missing_on_disk": 5}
    (ex,) = res.examples["journal_ends_before_gate"]
    assert ex["session"] == last and ex["where"] == f"{journal}:{verdict - 1}"
    (q,) = res.quarantined
    assert (q.file, q.line) == (str(journal), verdict) and "invalid JSON" in q.reason
    _adds_up(res)


def test_a_damaged_line_is_quarantined_with_its_file_and_line_and_nothing_else_is_lost(fixture_copy):
    spaces, ledger = fixture_copy
    journal = _journal(spaces[0])
    lines = journal.read_text().splitlines(keepends=True)
    lines.insert(9, '{"type": "TOOL_EXECUTED", "timestamp": "2026-11-28T13:4\n')  # a cut line inside a run
    lines.insert(3, "\xff garbage from a disk error\n")
    lines.insert(0, '{"type": "MEMORY_READ", "timestamp": "2026-11-28T13:40:00+00:00", "key": "x"}\n')  # no session
    lines.insert(5, '{"type": "SKILL_INJECTION", "timestamp": "2026-11-28T13:43:32+00:00", "agent_role": "coder", '
                    '"skill_ids": "not a list", "session_id": "' + RUNS[0]["sessions"][0] + '"}\n')
    journal.write_text("".join(lines))
    res = harvest_sage(spaces, None, "coder", SageHarvestConfig(goal_ledgers=(ledger,)))
    assert res.reasons == {"tests_missing_on_disk": 6} and res.lines_without_session == 1
    got = {(q.line, q.reason.split(" (")[0].split(":")[0]) for q in res.quarantined}
    assert got == {(6, "SKILL_INJECTION with a field SAGE never writes so"), (5, "invalid JSON"), (13, "invalid JSON")}
    assert all(q.file == str(journal) for q in res.quarantined) and res.quarantined_lines == 3
    _adds_up(res)


def test_missing_folders_files_and_ledgers_are_listed_and_the_harvest_goes_on(tmp_path, fixture_copy):
    spaces, ledger = fixture_copy
    bare = tmp_path / "never-ran"
    bare.mkdir()
    cfg = SageHarvestConfig(goal_ledgers=(ledger, tmp_path / "no-ledger.jsonl"))
    res = harvest_sage([tmp_path / "gone", bare, *spaces], None, "coder", cfg)
    assert {(m["path"], m["reason"].split(":")[0]) for m in res.missing} == {
        (str(tmp_path / "gone"), "workspace folder not found"),
        (str(bare.resolve() / "memory" / "sessions"), "no journal folder"),
        (str(tmp_path / "no-ledger.jsonl"), "goal ledger not found (no goals read from it)")}
    assert res.sessions == 6 and res.reasons == {"tests_missing_on_disk": 6}
    res = harvest_sage([bare], [tmp_path / "no-journal.log"], "coder", cfg)
    assert res.sessions == 0 and any(m["path"] == str(tmp_path / "no-journal.log") for m in res.missing)


def test_journals_outside_every_workspace_count_their_runs_without_a_workspace(tmp_path, fixture_copy):
    spaces, ledger = fixture_copy
    elsewhere = tmp_path / "copied-journals"
    shutil.copytree(spaces[0] / "memory" / "sessions", elsewhere)
    res = harvest_sage(spaces[1:], [elsewhere, _journal(spaces[1])], "coder", SageHarvestConfig(goal_ledgers=(ledger,)))
    assert res.reasons == {"no_workspace": 3, "tests_missing_on_disk": 3}
    assert all(ex["detail"].startswith(f"journal {elsewhere}") for ex in res.examples["no_workspace"])
    _adds_up(res)


def test_goals_come_only_from_the_ledger_and_its_bad_lines_are_quarantined(tmp_path, fixture_copy):
    spaces, _ = fixture_copy
    ledger = tmp_path / "goals.jsonl"
    ledger.write_text("\n".join([
        json.dumps({"session_id": RUNS[0]["sessions"][0], "goal": "write best_window"}),
        json.dumps({"session_id": RUNS[0]["sessions"][0], "goal": "another goal for the same run"}),
        '{"session_id": "abc", "goal": ',
        json.dumps({"goal": "no run named"}),
        json.dumps({"session_id": RUNS[1]["sessions"][0], "goal": "   "}),
        json.dumps([1, 2]),
    ]) + "\n")
    res = harvest_sage(spaces, None, "coder", SageHarvestConfig(goal_ledgers=(ledger,)))
    assert res.goals == 1 and res.reasons == {"goal_not_found": 5, "tests_missing_on_disk": 1}
    assert {q.line: q.reason.split(" (")[0] for q in res.quarantined} == {
        2: f"session_id {RUNS[0]['sessions'][0]} already has another goal at {ledger}:1: one goal per run",
        3: "invalid JSON", 4: "needs a non-empty 'session_id' or 'trace_id' naming the run",
        5: "field 'goal' missing or empty: the goal `sage run` was given", 6: "not a JSON object"}
    assert {ex["session"] for ex in res.examples["goal_not_found"]} == {r["sessions"][0] for r in RUNS[1:]}
    _adds_up(res)
    with pytest.raises(SageHarvestError, match="entry 0: needs a 'session_id' or a 'trace_id'"):
        write_goal_ledger(tmp_path / "x.jsonl", [{"goal": "g"}])


def test_a_time_window_and_a_role_select_the_runs(fixture_copy):
    spaces, ledger = fixture_copy
    late = SageHarvestConfig(goal_ledgers=(ledger,), since=datetime(2026, 11, 29, tzinfo=UTC))
    res = harvest_sage(spaces, None, "coder", late)
    assert (res.sessions, res.outside_window) == (0, 6)
    res = harvest_sage(spaces, None, "coder", SageHarvestConfig(until=datetime(2026, 11, 29)))  # naive is UTC
    assert (res.sessions, res.outside_window) == (6, 0)
    res = harvest_sage(spaces, None, "architect", SageHarvestConfig(goal_ledgers=(ledger,)))
    assert res.reasons == {"role_not_called": 6}  # SAGE's planner plans no architect task in these runs
    with pytest.raises(SageHarvestError, match="role 'cook' is not one of SAGE's agent roles"):
        harvest_sage(spaces, None, "cook")


# ------------------------------------------------------------------ SAGE's tests, run as SAGE's gate runs them
def _world_tests(tests: list[dict], style: str = "plain") -> tuple[str, SimTask]:
    """What the model world's test engineer writes for a task (the same generator SAGE got its answer from)."""
    from sage_pipeline.sage_world.world import verified_tests

    task = SimTask("add-0000", "add", 0.1, "easy", "Add two numbers.", "def add(a: int, b: int) -> int", "add",
                   "def add(a, b):\n    return a + b\n", tests, 1.0)
    return verified_tests(task, style), task


def _gate_task(source: str, artifact: str, timeout_s: float = 20.0):
    """The record the harvest makes of a gate's test file: the file unchanged, run by SAGE's gate command."""
    from sage_pipeline.sleep.records import TaskRecord

    test_file = f"tests/test_{Path(artifact).stem}.py"
    gate = read_gate_tests(source, artifact)
    ref = normalise_reference("unit_tests", {"entry_point": gate.entry_point, "timeout_s": timeout_s, "tests": [
        {"command": gate_command(test_file), "code_file": artifact, "files": {test_file: source}}]})
    return TaskRecord("t", "add", "unit_tests", ref)


def _judged(task, codes: list[str], sandbox: str = "docker", **options) -> list[float]:
    judge = untrusted_judge(sandbox, **options)
    try:
        return [j.hard for j in judge.run([(task, code) for code in codes], raw=True)]
    finally:
        judge.close()


SUB, PLUS = "def add(a, b):\n    return a - b\n", "def plus(a, b):\n    return a + b\n"


@pytest.mark.usefixtures("docker_ready")
def test_the_world_test_engineers_module_is_judged_unchanged_and_tells_right_from_wrong():
    source, task = _world_tests([{"args": [1, 2], "expected": 3}, {"args": [-4, 4], "expected": 0}])
    gate = read_gate_tests(source, "sol_add_0000.py")
    assert (gate.entry_point, gate.imports, gate.names, gate.asserts) == ("add", ("add",), ("test_add",), 1)
    rec = _gate_task(source, "sol_add_0000.py")
    assert rec.reference["tests"][0]["files"] == {"tests/test_sol_add_0000.py": source}  # not rewritten
    assert rec.reference["tests"][0]["command"] == "python -m pytest -q tests/test_sol_add_0000.py"
    assert _judged(rec, [task.reference, SUB, PLUS]) == [1.0, 0.0, 0.0]


def test_the_names_the_tests_take_from_the_module_and_their_asserts_are_read_as_written():
    source = ("import unittest\nimport calc as c\n\n\nclass TestAdd(unittest.TestCase):\n"
              "    def setUp(self):\n        self.n = 2\n\n    def test_two(self):\n"
              "        self.assertEqual(c.add(self.n, 2), 4)\n\n\nclass TestMore:\n"
              "    def test_neg(self):\n        assert c.sub(-1, -1) == 0\n\n    def helper(self):\n        pass\n\n\n"
              "def test_zero():\n    assert c.add(0, 0) == 0\n")
    gate = read_gate_tests(source, "src/calc.py")
    assert gate.entry_point == "add" and gate.imports == ("add", "sub") and gate.asserts == 3
    assert gate.names == ("TestAdd.test_two", "TestMore.test_neg", "test_zero")
    alias = read_gate_tests("from src.calc import add as plus\n\ndef test_it():\n    assert plus(1, 1) == 2\n",
                            "src/calc.py")
    assert alias.entry_point == "add"
    # SAGE's own template's example: no name imported from the module, only `app_mod.app`
    app = read_gate_tests("import sys\nsys.path.insert(0, 'src')\n\nfrom fastapi.testclient import TestClient\n"
                          "import app as app_mod\n\ndef test_health():\n    c = TestClient(app_mod.app)\n"
                          "    assert c.get('/health').status_code == 200\n", "src/app.py")
    assert (app.entry_point, app.imports, app.asserts) == ("app", ("app",), 1)
    assert read_gate_tests("def test_a():\n    assert 1\n", "my-app.py").entry_point == "my_app"  # no import: the stem


def test_only_a_file_pytest_could_not_parse_is_refused_before_it_runs():
    for source in ("import pytest\nfrom calc import add\n\ndef test_a():\n    with pytest.raises(TypeError):\n"
                   "        add('a', 1)\n",
                   "from calc import add, sub\n\ndef test_a():\n    assert add(1, 1) == sub(3, 1)\n",
                   "from calc import add; X = 1\n\ndef test_a(tmp_path):\n    assert add(1, 1) == 2\n",
                   "import resource\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"):
        read_gate_tests(source, "calc.py")  # pytest's to run: raises, several names, fixtures, guards and all
    with pytest.raises(NotRunnable, match=r"line 2: not valid Python"):
        read_gate_tests("from calc import add\ndef test_a(:\n", "calc.py")


def test_tests_that_assert_nothing_are_counted_as_such():
    assert read_gate_tests("from calc import add\n\ndef test_a():\n    add(1, 2)\n", "calc.py").asserts == 0
    raises = read_gate_tests("import pytest\nfrom calc import add\n\ndef test_a():\n    with pytest.raises(TypeError):"
                             "\n        add()\n", "calc.py")
    assert raises.asserts == 1


def test_a_unit_tests_reference_holds_args_checks_or_one_test_module_run_by_its_command():
    ok = normalise_reference("unit_tests", {"entry_point": "f", "tests": [{"check": "test_a()", "setup": "S"},
                                                                          {"check": "test_b()", "setup": "S"}]})
    assert [t["check"] for t in ok["tests"]] == ["test_a()", "test_b()"]
    with pytest.raises(TaskRecordError, match=r"reference.tests\[1\].setup: differs from the first test's"):
        normalise_reference("unit_tests", {"entry_point": "f", "tests": [{"check": "a()", "setup": "S"},
                                                                         {"check": "b()", "setup": "T"}]})
    with pytest.raises(TaskRecordError, match=r"reference.tests\[1\]: must be \{\"check\""):
        normalise_reference("unit_tests", {"entry_point": "f", "tests": [{"check": "a()", "setup": "S"},
                                                                         {"args": [1], "expected": 2}]})
    spec = {"command": "python -m pytest -q tests/test_m.py", "code_file": "src/m.py",
            "files": {"tests/test_m.py": "x"}}
    assert normalise_reference("unit_tests", {"entry_point": "f", "tests": [spec]})["tests"] == [spec]
    for bad, why in [({**spec, "code_file": "../m.py"}, "'..' part"), ({**spec, "command": "rm -rf /"}, "runs 'rm'"),
                     ({**spec, "files": {"/etc/passwd": "x"}}, "an absolute path"),
                     ({**spec, "command": "python -m pytest a.py && python -c 1"}, "chained"),
                     ({**spec, "extra": 1}, "exactly {command, code_file, files}")]:
        with pytest.raises(TaskRecordError, match=re.escape(why)):
            normalise_reference("unit_tests", {"entry_point": "f", "tests": [bad]})
    with pytest.raises(TaskRecordError, match="one test only"):
        normalise_reference("unit_tests", {"entry_point": "f", "tests": [spec, spec]})


# ------------------------------------------------------------------ SAGE's real `sage run` (sage_contract)
@dataclass
class SageDay:
    world: object
    day: object
    ledger: Path
    root: Path

    def spaces(self) -> list[Path]:
        return sorted((self.root / "day").glob("ws-*"))


@pytest.fixture(scope="session")
def sage_day(sage_python, tmp_path_factory) -> SageDay:
    """Eight `sage run`s on two workspaces, each run's goal in a ledger as the harness gave it to SAGE. Six
    tasks: B runs twice in one workspace (the second finds the first's tests there), A once in each."""
    from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, goal, run_day
    from sage_pipeline.sage_world.server import WorldServer
    from sage_pipeline.sage_world.world import WorldConfig, build_world

    install = SageInstall.find(sage_python)
    root = tmp_path_factory.mktemp("sage_harvest")
    world = build_world(install.models_yaml, n_tasks=24, task_seed=1, config=WorldConfig(clock_scale=0.0))
    a, b, c, d, e, f = (t.task_id for t in world.tasks[:6])
    with WorldServer(world) as srv:  # worker w runs runs w, w + 2, ...: ws-0 gets A C D F, ws-1 B B E A
        day = run_day(world, srv.url, install, 1, [a, b, c, b, d, e, f, a], root / "day", HarnessConfig(workers=2))
    assert day.finished == 8, day.failures
    ledger = write_goal_ledger(root / "goals.jsonl", [
        {"session_id": r.sessions[0], "goal": goal(r.run, world.tasks[world.by_id[r.task_id]].prompt), "run": r.run}
        for r in day.runs])
    return SageDay(world, day, ledger, root)


@pytest.fixture(scope="session")
def harvested(sage_day, sage_python):
    # the model world's code: the override is safe here; SAGE's python runs SAGE's command, as at SAGE's gate
    return harvest_sage(sage_day.spaces(), None, "coder", SageHarvestConfig(
        goal_ledgers=(sage_day.ledger,), sandbox="local", allow_untrusted_local=True, local_python=sage_python))


def _run_of(sage_day, session: str):
    return next(r for r in sage_day.day.runs if session in r.sessions)


def _event(where: str) -> dict:
    file, line = where.rsplit(":", 1)
    return json.loads(Path(file).read_text().splitlines()[int(line) - 1])


def test_the_harvest_finds_sage_tasks_whose_tests_tell_the_right_code_from_the_wrong(sage_day, harvested,
                                                                                     sage_python):
    res = harvested
    assert res.sessions == 8 and len(res.tasks) >= 3 and res.validated == len(res.tasks), res.summary()
    _adds_up(res)
    world = sage_day.world
    rows = []
    for t in res.tasks:
        run = _run_of(sage_day, t.meta["sage"]["session_id"])
        task = world.tasks[world.by_id[run.task_id]]
        assert run.task_right and t.meta["sage"]["verdicts"]["verified"] is True  # the gate passed it: right code
        assert t.intent.endswith(task.prompt) and t.reference["entry_point"] == task.entry_point
        assert t.split in ("train", "val", "test") and t.tags == ("sage", "role:coder", "verified")
        (spec,) = t.reference["tests"]  # the gate's file as SAGE's test engineer wrote it, run by the gate's command
        assert spec["code_file"] == t.meta["sage"]["artifact"] and spec["command"] == t.meta["sage"][
            "verification_command"] == f"python -m pytest -q {t.meta['sage']['gate_test_file']}"
        assert spec["files"] == {t.meta["sage"]["gate_test_file"]: (Path(t.meta["sage"]["workspace"]) / t.meta[
            "sage"]["gate_test_file"]).read_text()}
        rows += [(t, task.reference), (t, task.wrong_candidates()[0].code)]
    # harvested tests, of the model world's code, run by SAGE's python
    judge = untrusted_judge("local", allow_untrusted_local=True, local_python=sage_python)
    try:
        verdicts = [j.hard for j in judge.run(rows)]
    finally:
        judge.close()
    assert verdicts == [1.0, 0.0] * len(res.tasks)  # the reference runs, and fails a verified wrong candidate


def test_every_fact_of_a_harvested_task_points_at_the_line_sage_wrote_it_on(sage_day, harvested):
    for t in harvested.tasks:
        sage = t.meta["sage"]
        sid, prov = sage["session_id"], sage["provenance"]
        step = _event(prov["terminal_step"])
        assert (step["type"], step["agent"], step["session_id"]) == ("TRAJECTORY_STEP", "reviewer", sid)
        assert step["state"]["verification_passed"] is True and step["terminal"] is True
        code = _event(prov["code_write"])
        assert (code["type"], code["file"], code["session_id"]) == ("TOOL_EXECUTED", sage["artifact"], sid)
        tests = _event(prov["tests_write"])
        assert (tests["type"], tests["file"]) == ("TOOL_EXECUTED", sage["gate_test_file"])
        assert tests["session_id"] == prov["tests_written_in_session"]
        assert _event(prov["first_line"])["session_id"] == sid == _event(prov["last_line"])["session_id"]
        file, line = sage["goal_source"].rsplit(":", 1)
        entry = json.loads(Path(file).read_text().splitlines()[int(line) - 1])
        assert entry["session_id"] == sid and entry["goal"] == t.intent
        for call in sage["skills"]["calls"]:  # each role call's skill versions, as its SKILL_INJECTION line says
            ev = _event(call["at"])
            assert ev["type"] == "SKILL_INJECTION" and ev["session_id"] == sid and ev["agent_role"] == call["role"]
            assert call["skills"] == dict(zip(ev["skill_ids"], ev["content_sha256_16"], strict=True))
        assert {c["role"] for c in sage["skills"]["calls"]} >= {"planner", "coder", "reviewer"}
        assert sage["role_skills"] == sage["skills"]["by_role"]["coder"]
        steps = [json.loads(ln) for ln in Path(prov["journal_files"][0]).read_text().splitlines()
                 if ln.startswith("{") and '"TRAJECTORY_STEP"' in ln and sid in ln]
        v = sage["verdicts"]
        assert v["reviewer_fails"] == sum(s.get("verdict") == "FAIL" for s in steps)
        assert v["debugger_calls"] == sum(s["agent"] == "debugger" for s in steps)


def test_every_run_that_is_not_a_task_is_counted_by_what_sage_did(sage_day, harvested):
    res = harvested
    by_session = {ex["session"]: reason for reason, exs in res.examples.items() for ex in exs}
    assert len(by_session) == sum(res.reasons.values())
    runs = sage_day.day.runs
    for session, reason in by_session.items():
        run = _run_of(sage_day, session)
        if reason == "gate_never_passed":  # SAGE's circuit breaker ended it, and the code was wrong
            assert not run.task_right
        elif reason == "code_overwritten_later":  # the same task ran again in the same workspace
            assert any(r.task_id == run.task_id and r.worker == run.worker and r.run > run.run for r in runs)
        elif reason == "duplicate_task":  # another run of the same task was harvested first
            kept = [t for t in res.tasks if _run_of(sage_day, t.meta["sage"]["session_id"]).task_id == run.task_id]
            assert len(kept) == 1
        else:
            pytest.fail(f"run {run.run} counted {reason}: not expected of these runs")
    for reason, exs in res.examples.items():  # each names the line that decided it
        for ex in exs:
            ev = _event(ex["where"].split(" (")[0])
            if reason.endswith("_overwritten_later"):  # the later run's write
                assert ev["type"] == "TOOL_EXECUTED"
                assert ex["detail"].endswith(f"rewritten in session {ev['session_id']}")
            else:
                assert ev["session_id"] == ex["session"]
    assert all(r.task_id == runs[1].task_id for r in runs if r.tests_at_start)  # only B ran twice in one workspace


def test_unverified_runs_are_kept_unvalidated_only_when_asked(sage_day, harvested):
    cfg = SageHarvestConfig(goal_ledgers=(sage_day.ledger,), keep_unverified=True, validate_reference=False)
    res = harvest_sage(sage_day.spaces(), None, "coder", cfg)
    _adds_up(res)
    assert "gate_never_passed" not in res.reasons and res.validated == 0
    assert not any(t.meta["sage"]["reference_validated"] for t in res.tasks)
    for t in res.tasks:
        sage = t.meta["sage"]
        run = _run_of(sage_day, sage["session_id"])
        if "unverified" in t.tags:  # SAGE's circuit breaker ended it; its tests were never seen to pass
            v = sage["verdicts"]
            assert v["verified"] is False and v["failed_reason"] == "retry_limit" and not run.task_right
            assert _event(v["terminal_step"])["agent"] == "orchestrator"
        if run.tests_at_start:  # an earlier run of the task in this workspace wrote the tests its gate ran
            earlier = [r for r in sage_day.day.runs if r.task_id == run.task_id and r.worker == run.worker
                       and r.run < run.run]
            assert sage["provenance"]["tests_written_in_session"] in {x for r in earlier for x in r.sessions}
            assert _event(sage["provenance"]["tests_write"])["session_id"] != sage["session_id"]
    for reason in res.reasons:
        assert reason in ("no_tests_written", "duplicate_task"), res.examples


def test_a_harvest_for_the_debugger_keeps_only_the_runs_that_called_it(sage_day):
    res = harvest_sage(sage_day.spaces(), None, "debugger",
                       SageHarvestConfig(goal_ledgers=(sage_day.ledger,), validate_reference=False))
    _adds_up(res)
    called = {ev["session_id"] for ws in sage_day.spaces() for f in (ws / "memory" / "sessions").glob("*.log")
              for ln in f.read_text().splitlines() if ln.startswith("{")
              and (ev := json.loads(ln))["type"] == "SKILL_INJECTION" and ev["agent_role"] == "debugger"}
    assert res.reasons["role_not_called"] == 8 - len(called)
    for t in res.tasks:
        assert t.meta["sage"]["session_id"] in called and t.meta["sage"]["verdicts"]["debugger_calls"] >= 1
        assert "sage:discipline:systematic-debugging/SKILL.md" in t.meta["sage"]["role_skills"]


@pytest.mark.parametrize("damage, reason", [
    ("edit the code SAGE ended with", "reference_not_reproducible"),
    ("delete the tests folder", "tests_missing_on_disk"),
    ("cut the journal before the verdict", "journal_ends_before_gate"),
])
def test_damage_after_sage_ran_is_counted_by_reason_naming_file_and_line(sage_day, harvested, tmp_path, damage, reason,
                                                                        sage_python):
    victim = harvested.tasks[0]
    sage = victim.meta["sage"]
    ws = tmp_path / "day"
    shutil.copytree(sage_day.root / "day", ws, ignore=shutil.ignore_patterns("home", "bin", "launchers", "runs"))
    src = Path(sage["workspace"])
    mine = ws / src.name
    journal = mine / Path(sage["provenance"]["terminal_step"].rsplit(":", 1)[0]).relative_to(src)
    if damage == "edit the code SAGE ended with":
        (mine / sage["artifact"]).write_text(sage_day.world.tasks[sage_day.world.by_id[
            _run_of(sage_day, sage["session_id"]).task_id]].wrong_candidates()[0].code)
    elif damage == "delete the tests folder":
        shutil.rmtree(mine / "tests")
    else:
        line = int(sage["provenance"]["terminal_step"].rsplit(":", 1)[1])
        journal.write_text("".join(journal.read_text().splitlines(keepends=True)[:line - 1]))
    ledger = tmp_path / "goals.jsonl"
    shutil.copyfile(sage_day.ledger, ledger)
    res = harvest_sage(sorted(ws.glob("ws-*")), None, "coder", SageHarvestConfig(
        goal_ledgers=(ledger,), sandbox="local", allow_untrusted_local=True, local_python=sage_python))
    _adds_up(res)
    hit = [ex for ex in res.examples.get(reason, []) if ex["session"] == sage["session_id"]]
    assert len(hit) == 1 and sage["session_id"] not in {t.meta["sage"]["session_id"] for t in res.tasks}, [
        (r, ex) for r, exs in res.examples.items() for ex in exs if ex["session"] == sage["session_id"]]
    file, line = hit[0]["where"].split(" (")[0].rsplit(":", 1)
    assert Path(file).is_relative_to(mine) and int(line) >= 1
    if reason == "reference_not_reproducible":
        head = f"{sage['gate_test_file']} against {sage['artifact']}: "  # then the sandbox's verdict on the wrong code
        assert re.fullmatch(re.escape(head) + r"(wrong_answer|exception|timeout|killed): " + re.escape(
            sage["verification_command"]) + r": (exit [13]|timed out|killed).*", hit[0]["detail"]), hit[0]["detail"]
    elif reason == "tests_missing_on_disk":
        assert hit[0]["detail"] == f"{mine / sage['gate_test_file']}: missing"


# ------------------------------------------------------------------ the test engineer's styles (sage_contract)
def gate_styles(install) -> tuple[str, ...]:
    """The world's test styles SAGE's gate can run in the harness: all of them when the ``python`` the harness puts on
    PATH (a symlink to SAGE's, harness.sage_env) imports FastAPI and httpx, else the default (no TestClient)."""
    import subprocess
    import tempfile

    from sage_pipeline.sage_world.world import DEFAULT_TEST_STYLES, TEST_STYLES

    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "python").symlink_to(install.python)
        ok = subprocess.run([str(Path(d) / "python"), "-c", "import fastapi, httpx"], capture_output=True).returncode
    return TEST_STYLES if ok == 0 else DEFAULT_TEST_STYLES


@dataclass
class StylesDay(SageDay):
    styles: tuple[str, ...] = ()


def venv_python(sage_python: str, folder: Path) -> Path:
    """SAGE's Python as a script that execs it, with SAGE's ``sage`` beside it: the harness's symlink to it
    (harness.sage_env) then runs SAGE's virtualenv, FastAPI and httpx included. A symlink straight to a virtualenv's
    interpreter runs as its base interpreter (no pyvenv.cfg beside the link), which has neither."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "python").write_text(f'#!/bin/sh\nexec {sage_python} "$@"\n')
    (folder / "python").chmod(0o755)
    (folder / "sage").symlink_to(Path(sage_python).parent / "sage")
    return folder / "python"


@pytest.fixture(scope="session")
def styles_day(sage_python, tmp_path_factory) -> StylesDay:
    """`sage run`s of three distinct tasks for each style the world's test engineer writes (so no run's tests or
    code are another's), each run's goal in a ledger; SAGE's gate runs SAGE's virtualenv (venv_python), so the
    TestClient style is among them."""
    from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, goal, run_day
    from sage_pipeline.sage_world.server import WorldServer
    from sage_pipeline.sage_world.world import WorldConfig, build_world, style_for

    root = tmp_path_factory.mktemp("sage_styles")
    install = SageInstall.find(venv_python(sage_python, root / "sage_bin"))
    styles = gate_styles(install)
    world = build_world(install.models_yaml, n_tasks=90, task_seed=2,
                        config=WorldConfig(clock_scale=0.0, test_styles=styles))
    picked: dict[str, list[str]] = {s: [] for s in styles}
    for t in world.tasks:
        s = style_for(0, t, styles)
        if len(picked[s]) < 3:
            picked[s].append(t.task_id)
    assert all(len(v) == 3 for v in picked.values()), picked
    tasks = [t for s in styles for t in picked[s]]
    with WorldServer(world) as srv:
        day = run_day(world, srv.url, install, 1, tasks, root / "day", HarnessConfig(workers=2))
    assert day.finished == len(tasks), day.failures
    ledger = write_goal_ledger(root / "goals.jsonl", [
        {"session_id": r.sessions[0], "goal": goal(r.run, world.tasks[world.by_id[r.task_id]].prompt), "run": r.run}
        for r in day.runs])
    return StylesDay(world, day, ledger, root, styles)


def _gate_passed(day: SageDay) -> set[str]:
    """The sessions whose code task SAGE's gate passed: the reviewer's terminal step with verification_passed, as
    SAGE's journal says (workflow.py verification_gate)."""
    out = set()
    for ws in day.spaces():
        for f in (ws / "memory" / "sessions").glob("*.log"):
            for ln in f.read_text().splitlines():
                if ln.startswith("{") and '"TRAJECTORY_STEP"' in ln:
                    ev = json.loads(ln)
                    if ev["agent"] == "reviewer" and ev.get("terminal") and ev["state"].get("verification_passed"):
                        out.add(ev["session_id"])
    return out


@pytest.mark.usefixtures("docker_ready")
def test_the_harvest_keeps_nine_in_ten_of_the_runs_sages_gate_passed_in_every_test_style(styles_day):
    day = styles_day
    world = day.world
    style_of = {r["run"]: r["test_style"] for r in world.truth if r.get("agent") == "test_engineer"}
    assert set(style_of.values()) == set(day.styles)  # SAGE's test engineer got every style
    passed = _gate_passed(day)
    for r in day.day.runs:  # the world's truth with the new styles: SAGE's gate passes exactly the right files
        assert (r.sessions[0] in passed) == r.task_right, (r.run, style_of.get(r.run), r.task_right)
    res = harvest_sage(day.spaces(), None, "coder", SageHarvestConfig(goal_ledgers=(day.ledger,), sandbox="docker",
                                                                      sandbox_workers=2))
    _adds_up(res)
    kept = {t.meta["sage"]["session_id"] for t in res.tasks}
    assert kept <= passed and res.validated == len(res.tasks)
    lost = {ex["session"]: reason for reason, exs in res.examples.items() for ex in exs if ex["session"] in passed}
    assert len(kept) + len(lost) == len(passed)  # the rest of the gate's passes, each counted by its reason
    share = len(kept) / len(passed)
    run_of = {r.sessions[0]: r.run for r in day.day.runs}
    kept_styles = {style_of[run_of[s]] for s in kept}
    print(f"harvest kept {len(kept)} of {len(passed)} runs SAGE's gate passed ({share:.0%}); lost: {lost}; styles "
          f"kept: {sorted(kept_styles)} of {list(day.styles)}")
    assert share >= 0.9, (share, lost, res.examples)
    assert len(kept_styles) >= len(day.styles) - 1, kept_styles
    for t in res.tasks:  # each kept task's file as SAGE's test engineer wrote it, in its style
        sage = t.meta["sage"]
        (spec,) = t.reference["tests"]
        assert spec["files"][sage["gate_test_file"]].startswith('"""Tests of ')
        assert f"({style_of[run_of[sage['session_id']]]} style)" in spec["files"][sage["gate_test_file"]]


# ------------------------------------------------------------------ hostile workspaces (an LLM wrote them)
CANARY = "CANARY-7d1f3c-outside-the-workspace"
ARTIFACT, TESTS = "sol_best_window_0000.py", "tests/test_sol_best_window_0000.py"  # run 0 of ws-0, as SAGE logged
TEST_SOURCE = ("from sol_best_window_0000 import best_window\n\n\ndef test_window():\n"
               "    assert best_window([1, 2, 3], 2) == 5\n")
CODE = "def best_window(xs, k):\n    return max(sum(xs[i:i + k]) for i in range(len(xs) - k + 1))\n"


class RecordingJudge:
    """Passes every reference, keeping what it was given (a sandbox opened for untrusted code, as the harvest asks)."""

    sandbox, options = "recording", {"untrusted": True}

    def __init__(self) -> None:
        self.items: list = []

    def run(self, items):
        from sage_pipeline.sleep.judges import Judgement

        self.items += items
        return [Judgement(1.0, 1.0) for _ in items]


def _within(fn, timeout_s: float = 60.0):
    return finishes(fn, timeout_s)


def _retarget(ws: Path, file: str) -> None:
    """The journal as if SAGE's patch had written the code at ``file`` (an absolute or ../ path from the model)."""
    journal = _journal(ws)
    journal.write_text(journal.read_text().replace(f'"file": "{ARTIFACT}"', f'"file": {json.dumps(file)}'))


@pytest.fixture
def hostile(tmp_path) -> tuple[list[Path], Path, Path]:
    """Copies of SAGE's ws-0 (its journal of three runs, written by SAGE), each with one hostile thing where run 0's
    test file or code belongs, and one clean copy (run 0 a task); outside them, files holding the canary."""
    out = tmp_path / "outside"
    (out / "tests").mkdir(parents=True)
    (out / "canary_tests.py").write_text(TEST_SOURCE + f"# {CANARY}\n")
    (out / "tests" / Path(TESTS).name).write_text(TEST_SOURCE + f"# {CANARY}\n")
    (out / "canary_code.py").write_text(CODE + f"# {CANARY}\n")
    (out / ARTIFACT).write_text(CODE + f"# {CANARY}\n")
    shutil.copyfile(FIXTURE / "ws-1" / "memory" / "sessions" / "2026-11-28.log", out / "2026-11-29.log")
    cases = {}

    def ws(name: str, tests: bool = True, code: bool = True) -> Path:
        w = shutil.copytree(FIXTURE / "ws-0", tmp_path / "spaces" / name)
        if tests:
            (w / "tests").mkdir()
            (w / TESTS).write_text(TEST_SOURCE)
        if code:
            (w / ARTIFACT).write_text(CODE)
        cases[name] = w
        return w

    ws("clean")
    (ws("tests_link_out", tests=False) / "tests").mkdir()
    (cases["tests_link_out"] / TESTS).symlink_to(out / "canary_tests.py")
    (ws("tests_folder_link_out", tests=False) / "tests").symlink_to(out / "tests", target_is_directory=True)
    (ws("code_link_out", code=False) / ARTIFACT).symlink_to(out / "canary_code.py")
    _retarget(ws("code_absolute_path", code=False), str(out / ARTIFACT))
    _retarget(ws("code_parent_path", code=False), f"../../outside/{ARTIFACT}")
    (ws("tests_fifo", tests=False) / "tests").mkdir()
    os.mkfifo(cases["tests_fifo"] / TESTS)
    os.mkfifo(ws("code_fifo", code=False) / ARTIFACT)
    (ws("tests_dev_zero", tests=False) / "tests").mkdir()
    (cases["tests_dev_zero"] / TESTS).symlink_to("/dev/zero")
    (ws("tests_50mb", tests=False) / "tests").mkdir()
    (cases["tests_50mb"] / TESTS).write_bytes(TEST_SOURCE.encode() + b"#" * (50 * 1024 * 1024) + b"\n")
    (ws("journal_link_out") / "memory" / "sessions" / "2026-11-29.log").symlink_to(out / "2026-11-29.log")
    ledger = write_goal_ledger(tmp_path / "goals.jsonl", [{"session_id": r["sessions"][0], "goal": f"the goal of "
                                                           f"{r['run']}: {r['task_id']}"} for r in RUNS])
    return [cases[k] for k in sorted(cases)], ledger, out


EXPECTED = {  # workspace -> (the harvest's reason for run 0, the guard's reason)
    "tests_link_out": ("unsafe_tests_file", "link"),
    "tests_folder_link_out": ("unsafe_tests_file", "link"),
    "tests_fifo": ("unsafe_tests_file", "not_regular"),
    "tests_dev_zero": ("unsafe_tests_file", "link"),
    "tests_50mb": ("unsafe_tests_file", "too_large"),
    "code_link_out": ("code_outside_workspace", "link"),
    "code_absolute_path": ("code_outside_workspace", "outside_root"),
    "code_parent_path": ("code_outside_workspace", "outside_root"),
    "code_fifo": ("unsafe_code_file", "not_regular"),
}


def test_a_harvest_of_hostile_workspaces_finishes_counts_each_by_reason_and_reads_nothing_outside(hostile):
    spaces, ledger, outside = hostile
    judge = RecordingJudge()
    res = _within(lambda: harvest_sage(spaces, None, "coder", SageHarvestConfig(goal_ledgers=(ledger,)), judge=judge))
    _adds_up(res)
    (task,) = res.tasks  # run 0 of the clean workspace only
    assert task.meta["sage"]["workspace"].endswith("/clean") and task.meta["sage"]["reference_validated"]
    by_ws = {}
    for reason, exs in res.examples.items():
        for ex in exs:
            by_ws.setdefault(ex["where"].split("/spaces/")[1].split("/")[0], []).append((reason, ex))
    for name, (reason, guard) in EXPECTED.items():
        hits = [(r, ex) for r, ex in by_ws[name] if r == reason and ex["session"] == RUNS[0]["sessions"][0]]
        assert len(hits) == 1, (name, by_ws[name])
        detail = hits[0][1]["detail"]
        assert f"refused ({guard}:" in detail and "spaces/" + name in detail, detail  # the file, the root, why
    # the tests folder linked out refuses the two other runs' test files too (their path goes through the link)
    assert res.reasons["unsafe_tests_file"] == 5 + 2 and res.reasons["code_outside_workspace"] == 3
    assert res.reasons["unsafe_code_file"] == 1
    assert res.unsafe == {"link": 3 + 3 + 1, "not_regular": 2, "too_large": 1, "outside_root": 2}  # 1: the journal
    (journal,) = [m for m in res.missing if "journal_link_out" in m["path"]]
    assert journal["path"].endswith("2026-11-29.log") and "refused (link:" in journal["reason"]
    assert str(outside / "2026-11-29.log") not in res.journal_files
    # nothing outside the workspaces was read: the canary is in no record, no code judged, no count or example
    seen = json.dumps([t.to_dict() for t in res.tasks]) + json.dumps(judge.items, default=str)
    seen += json.dumps(res.summary()) + json.dumps(res.examples)
    assert CANARY not in seen
    assert res.summary()["unsafe"] == dict(res.unsafe)


def test_the_size_cap_is_a_stated_setting(hostile):
    spaces, ledger, _ = hostile
    field = SageHarvestConfig.model_fields["max_file_bytes"]
    assert field.default == 8 * 1024 * 1024 and "never read" in field.description
    clean = [w for w in spaces if w.name == "clean"]
    res = harvest_sage(clean, None, "coder", SageHarvestConfig(goal_ledgers=(ledger,), max_file_bytes=64),
                       judge=RecordingJudge())
    (ex,) = res.examples["unsafe_tests_file"]
    assert "too_large" in ex["detail"] and "the cap is 64" in ex["detail"] and not res.tasks


def test_a_judge_not_opened_for_untrusted_code_is_refused(hostile):
    spaces, ledger, _ = hostile
    clean = [w for w in spaces if w.name == "clean"]
    with pytest.raises(SageHarvestError, match="without untrusted=True.*allow_untrusted_local"):
        harvest_sage(clean, None, "coder", SageHarvestConfig(goal_ledgers=(ledger,)), judge=UnitTestJudge("local"))
    judge = untrusted_judge("local")
    assert judge.options == {"untrusted": True, "allow_untrusted_local": False}
    assert judge.describe()["untrusted"] and not judge.describe()["allow_untrusted_local"]


@pytest.mark.parametrize("source", ["(" * 300_000 + ")" * 300_000, "x = 1\x00\n", "-" * 2_000_000 + "1\n"])
def test_a_hostile_test_module_is_not_runnable_not_a_crash(source):
    with pytest.raises(NotRunnable, match="line 1|:1:"):
        read_gate_tests(source, "calc.py")
