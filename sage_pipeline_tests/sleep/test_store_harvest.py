"""The store (content-hashed versions, atomic compare-and-replace, restore, locks) and the harvest."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from sage_pipeline.sleep.harvest import HarvestConfig, harvest
from sage_pipeline.sleep.nightly import day_window
from sage_pipeline.sleep.store import LiveChanged, NightLocked, SkillStore, StoreError, version_id


def test_live_files_come_from_the_packaged_defaults(tmp_path):
    s = SkillStore(tmp_path / "sleep", "reviewer")
    notes = s.ensure_live()
    assert len(notes) == 2 and s.skill_path.read_text().startswith("# Skill: reviewer")
    v = s.register(s.read(), "2026-11-01")
    assert (v.seq, v.action, v.version) == (1, "initial", s.read().id)
    assert s.register(s.read(), "2026-11-02").seq == 1  # unchanged content: no new entry
    unknown = SkillStore(tmp_path / "sleep", "planner")
    unknown.ensure_live()
    assert "sage:learned:begin" in unknown.skill_path.read_text()
    with pytest.raises(StoreError, match="letters, digits"):
        SkillStore(tmp_path, "../evil")


def test_commit_versions_by_content_and_restore_any_version(tmp_path):
    s = SkillStore(tmp_path / "sleep", "coder")
    s.ensure_live()
    v1 = s.register(s.read())
    snap = s.read()
    v2 = s.commit("skill v2\n", "memory v2\n", snap, "accepted", "2026-11-01", "one edit")
    assert v2.version == version_id(b"skill v2\n", b"memory v2\n") and v2.parent == v1.version
    assert s.skill_path.read_text() == "skill v2\n" and (s.versions_dir / v2.version / "SKILL.md").is_file()
    v3 = s.commit("skill v3\n", "memory v2\n", s.read(), "accepted", "2026-11-02")
    back = s.restore(v1.version[:6], note="bad night")
    assert back.action == "rollback" and back.version == v1.version and back.parent == v3.version
    assert s.read().id == v1.version
    assert s.restore("v2").version == v2.version and s.skill_path.read_text() == "skill v2\n"
    assert [v.action for v in s.versions()] == ["initial", "accepted", "accepted", "rollback", "rollback"]
    with pytest.raises(StoreError, match="not a stored version"):
        s.restore("ffffffff")
    with pytest.raises(StoreError, match="not a stored version"):
        s.restore("abc")  # prefixes shorter than 4 characters are refused


def test_commit_refuses_when_the_live_file_changed(tmp_path):
    s = SkillStore(tmp_path / "sleep", "coder")
    s.ensure_live()
    snap = s.read()
    s.skill_path.write_text("edited by a person\n")
    with pytest.raises(LiveChanged, match="SKILL.md changed since the night read it"):
        s.commit("candidate\n", "m\n", snap, "accepted")
    assert s.skill_path.read_text() == "edited by a person\n" and s.versions() == []


def test_restore_of_an_external_edit_is_itself_reversible(tmp_path):
    s = SkillStore(tmp_path / "sleep", "coder")
    s.ensure_live()
    v1 = s.register(s.read())
    s.skill_path.write_text("hand edit\n")
    s.restore(v1.version)
    entries = s.versions()
    assert [e.action for e in entries] == ["initial", "external", "rollback"]
    s.restore(entries[1].version)
    assert s.skill_path.read_text() == "hand edit\n"


def test_tampered_version_folder_is_refused(tmp_path):
    s = SkillStore(tmp_path / "sleep", "coder")
    s.ensure_live()
    v = s.register(s.read())
    (s.versions_dir / v.version / "SKILL.md").write_text("tampered")
    with pytest.raises(StoreError, match="does not match the version id"):
        s.restore(v.version)


def _two_versions(tmp_path) -> tuple[SkillStore, str]:
    """A store whose index has v1 (initial) and v2 (accepted, live); returns it and v1's id."""
    s = SkillStore(tmp_path / "sleep", "coder")
    s.ensure_live()
    v1 = s.register(s.read())
    s.commit("skill v2\n", "memory v2\n", s.read(), "accepted", "2026-11-01")
    return s, v1.version


def _set_line(s: SkillStore, lineno: int, raw: bytes) -> None:
    lines = s.index.read_bytes().splitlines()
    lines[lineno - 1] = raw
    s.index.write_bytes(b"\n".join(lines) + b"\n")


def _edit_entry(s: SkillStore, lineno: int, **kw) -> None:
    d = json.loads(s.index.read_bytes().splitlines()[lineno - 1])
    _set_line(s, lineno, json.dumps({k: v for k, v in {**d, **kw}.items() if v is not None}).encode())


def _disk(s: SkillStore) -> dict[str, bytes]:
    """Every file of the store and the live documents, byte for byte (the lock files aside)."""
    files = {str(p): p.read_bytes() for p in s.root.rglob("*")
             if p.is_file() and not p.name.endswith(".lock")}
    return files | {str(p): p.read_bytes() for p in s.paths().values()}


@pytest.mark.parametrize("damage, match", [
    (lambda s: _edit_entry(s, 2, seq="x"), r"index.jsonl:2: malformed version entry: field 'seq' is \"x\", "
                                          r"expected an integer"),
    (lambda s: _edit_entry(s, 2, seq=True), r"index.jsonl:2: .*field 'seq' is true, expected an integer"),
    (lambda s: _edit_entry(s, 1, seq=0), r"index.jsonl:1: .*field 'seq' is 0, expected 1 or more"),
    (lambda s: _edit_entry(s, 2, note=5), r"index.jsonl:2: .*field 'note' is 5, expected a string"),
    (lambda s: _edit_entry(s, 1, action="undo"),
     r"index.jsonl:1: .*field 'action' is 'undo', expected one of"),
    (lambda s: _edit_entry(s, 2, version="../../x"), r"index.jsonl:2: .*field 'version' is '../../x'"),
    (lambda s: _edit_entry(s, 2, version=None), r"index.jsonl:2: .*field 'version' is missing"),
    (lambda s: _edit_entry(s, 2, sequence=3), r"index.jsonl:2: .*field 'sequence' is unknown"),
    (lambda s: _set_line(s, 2, b'"a string"'), r"index.jsonl:2: .*must be a JSON object"),
    (lambda s: _set_line(s, 2, b'{"seq": 2, "note": "caf\xe9"}'),
     r"index.jsonl:2: .*not UTF-8 \(byte b'\\xe9'"),
    (lambda s: _set_line(s, 1, b'{"seq": 1,'), r"index.jsonl:1: .*not JSON"),
], ids=["seq-string", "seq-bool", "seq-zero", "note-int", "unknown-action", "version-path", "missing-field",
        "unknown-field", "bare-string", "non-utf8", "truncated"])
def test_a_bad_index_line_is_an_error_naming_the_file_line_and_field(tmp_path, damage, match):
    s, _ = _two_versions(tmp_path)
    damage(s)
    with pytest.raises(StoreError, match=match) as err:
        s.versions()
    assert "fix or remove the line" in str(err.value)


@pytest.mark.parametrize("bad_line", [
    lambda s: _edit_entry(s, 2, seq="x"),
    lambda s: _set_line(s, 1, s.index.read_bytes().splitlines()[0].replace(b'"note": "', b'"note": "\xff')),
], ids=["seq-string", "non-utf8"])
def test_a_rollback_on_a_bad_index_leaves_the_live_documents_byte_for_byte_unchanged(tmp_path, bad_line):
    s, v1 = _two_versions(tmp_path)
    bad_line(s)
    before = _disk(s)
    with pytest.raises(StoreError, match=r"index.jsonl:\d+: malformed version entry.*Nothing was changed"):
        s.restore(v1)
    assert _disk(s) == before
    assert s.read().skill == b"skill v2\n" and s.read().memory == b"memory v2\n"


def test_a_commit_on_a_bad_index_leaves_the_live_documents_unchanged(tmp_path):
    s, _ = _two_versions(tmp_path)
    _edit_entry(s, 2, seq="x")
    before = _disk(s)
    with pytest.raises(StoreError, match=r"index.jsonl:2: .*field 'seq'"):
        s.commit("skill v3\n", "memory v3\n", s.read(), "accepted")
    assert _disk(s) == before


def test_configured_live_paths_are_remembered_and_must_exist(tmp_path):
    live = tmp_path / "agent" / "SKILL.md"
    with pytest.raises(StoreError, match="configured skill document does not exist"):
        SkillStore(tmp_path / "sleep", "coder", skill_path=live).ensure_live()
    live.parent.mkdir()
    live.write_text("# mine\n")
    os.chmod(live, 0o640)
    s = SkillStore(tmp_path / "sleep", "coder", skill_path=live)
    s.ensure_live()
    s.commit("# mine, improved\n", s.read().memory.decode(), s.read(), "accepted")
    assert live.read_text() == "# mine, improved\n" and (live.stat().st_mode & 0o777) == 0o640
    again = SkillStore(tmp_path / "sleep", "coder")  # e.g. the rollback CLI: finds the same live file
    assert again.skill_path == live.absolute()


def test_two_nights_of_one_skill_never_overlap(tmp_path):
    # Certain, not timed: night a holds the lock until night b says it waits for it (night_lock's
    # log is called once b has found the lock taken), so b has tried while a ran.
    s = SkillStore(tmp_path / "sleep", "coder")
    events: list[str] = []
    a_holds, b_waits = threading.Event(), threading.Event()

    def night_a() -> None:
        with s.night_lock(timeout_s=60, night="a"):
            events.append("start a")
            a_holds.set()
            assert b_waits.wait(60), "night b never found the lock taken"
            events.append("end a")

    t = threading.Thread(target=night_a)
    t.start()
    assert a_holds.wait(60)
    with s.night_lock(timeout_s=60, night="b", log=lambda _msg: b_waits.set()):
        events.append("start b")
        events.append("end b")
    t.join(60)
    assert events == ["start a", "end a", "start b", "end b"] and b_waits.is_set()
    other = SkillStore(tmp_path / "sleep", "coder")
    with s.night_lock(timeout_s=1, night="c"), pytest.raises(NightLocked, match="still runs"), \
            other.night_lock(timeout_s=0.3):
        pass


def test_a_night_in_another_process_excludes_this_one_until_it_is_killed(tmp_path):
    """Concurrent nights of one skill in two processes exclude each other; a night killed with
    SIGKILL (nothing of it runs on the way out) leaves the lock free for the next one."""
    code = ("import sys, time\nfrom sage_pipeline.sleep.store import SkillStore\n"
            "with SkillStore(sys.argv[1], 'coder').night_lock(timeout_s=5, night='2026-11-02'):\n"
            "    print('held', flush=True)\n    time.sleep(60)\n")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "sleep")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        s = SkillStore(tmp_path / "sleep", "coder")
        waited: list[str] = []
        with pytest.raises(NightLocked, match=f"night 2026-11-02, pid {holder.pid}") as ei:
            with s.night_lock(timeout_s=0.3, log=waited.append):
                pass
        assert "still runs after 0.3 s" in str(ei.value) and len(waited) == 1 and str(holder.pid) in waited[0]
        holder.kill()
        holder.wait(10)
        after_kill: list[str] = []
        with s.night_lock(timeout_s=60, night="2026-11-03", log=after_kill.append):
            assert "night 2026-11-03" in (s.root / ".night.lock").read_text()
        assert after_kill == []  # freed by the kill: taken at once, never waited for (not timed: certain)
        assert (s.root / ".night.lock").read_text() == ""  # emptied on release
    finally:
        holder.kill()
        holder.wait(10)


# harvest -----------------------------------------------------------------------------------------

def _event(ts: datetime, **kw) -> str:
    return json.dumps({"type": "AGENT_MESSAGE", "timestamp": ts.isoformat().replace("+00:00", "Z"), **kw})


def test_harvest_takes_the_days_tasks_with_a_reference_and_reports_the_rest(tmp_path):
    day = datetime(2026, 11, 3, tzinfo=UTC)
    ref = {"reference_kind": "exact", "reference": "404"}
    lines = [
        _event(day + timedelta(hours=1), session_id="s1", task_id="t1", agent="reviewer", intent="Status?"),
        _event(day + timedelta(hours=1, minutes=1), session_id="s1", task_id="t1", agent="reviewer", extra=ref),
        _event(day + timedelta(hours=2), session_id="s1", task_id="t2", agent="reviewer", intent="no ref"),
        _event(day + timedelta(hours=3), session_id="s1", task_id="t3", agent="coder", intent="other", **ref),
        _event(day + timedelta(hours=4), session_id="s2", task_id="t4", agent="planner", skill="reviewer",
               intent="Which status for invalid input?", reference_kind="exact", reference="422"),
        _event(day - timedelta(minutes=1), session_id="s0", task_id="t0", agent="reviewer", intent="yday", **ref),
        _event(day + timedelta(days=1), session_id="s3", task_id="t5", agent="reviewer", intent="tomorrow", **ref),
        _event(day + timedelta(hours=5), session_id="s4", task_id="t6", agent="reviewer", intent="bad",
               reference_kind="rules", reference=[{"regex": "("}]),
        '{"timestamp": "2026-11-03T01:00:00Z", broken', "{no date, skipped undecoded",
        json.dumps({"type": "SESSION_START", "timestamp": "not a time"}),
    ]
    logs = tmp_path / "sessions" / "real"
    logs.mkdir(parents=True)
    (logs / "a.jsonl").write_text("\n".join(lines[:5]) + "\n")
    with gzip.open(logs / "b.jsonl.gz", "wt") as fh:
        fh.write("\n".join(lines[5:]) + "\n")
    res = harvest("reviewer", "2026-11-03", day_window("2026-11-03"),
                  HarvestConfig(log_dirs=(tmp_path / "sessions",), embedded_tasks=False))
    assert sorted(t.id for t in res.tasks) == ["s1/t1", "s2/t4"]
    t1 = next(t for t in res.tasks if t.id == "s1/t1")
    assert (t1.intent, t1.reference) == ("Status?", "404") and "a.jsonl:2" in t1.origin
    assert res.unusable_count == 1 and res.unusable[0]["task"] == "s1/t2"
    assert "no reference" in res.unusable[0]["reason"]
    assert len(res.quarantined) == 1 and res.quarantined[0].file.endswith("b.jsonl.gz")
    assert res.quarantined[0].line == 3 and "regular expression" in res.quarantined[0].reason
    s = res.summary()
    assert s["bad_log_lines"] == 1 and s["log_lines"] == 11 and s["sources"] == {"session logs": 2}


def test_harvest_day_follows_the_time_zone(tmp_path):
    (tmp_path / "s").mkdir()
    ts = datetime(2026, 11, 3, 23, 30, tzinfo=UTC)  # 00:30 on Nov 4 in Berlin
    (tmp_path / "s" / "x.jsonl").write_text(_event(ts, session_id="s", task_id="t", agent="coder", intent="i",
                                                   reference_kind="exact", reference="1") + "\n")
    cfg = HarvestConfig(log_dirs=(tmp_path / "s",), embedded_tasks=False)
    assert len(harvest("coder", "2026-11-03", day_window("2026-11-03", "UTC"), cfg).tasks) == 1
    assert len(harvest("coder", "2026-11-04", day_window("2026-11-04", "Europe/Berlin"), cfg).tasks) == 1
    assert len(harvest("coder", "2026-11-03", day_window("2026-11-03", "Europe/Berlin"), cfg).tasks) == 0


def test_task_files_filter_by_skill_and_date_and_drop_duplicate_ids(tmp_path):
    d = tmp_path / "tasks"
    d.mkdir()
    base = {"intent": "x", "reference_kind": "exact", "reference": "1"}
    rows = [{"id": "a", **base}, {"id": "b", "skill": "coder", **base}, {"id": "c", "date": "2026-11-03", **base},
            {"id": "d", "date": "2026-11-04", **base}, {"id": "a", **base, "intent": "again"}, {"id": "e"}]
    (d / "mine.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    res = harvest("reviewer", "2026-11-03", None, HarvestConfig(task_dirs=(d,), embedded_tasks=True))
    ids = [t.id for t in res.tasks]
    assert ids[:2] == ["a", "c"] and len(ids) == 2 + 80  # plus the packaged reviewer tasks
    assert res.skipped_other_skill == 1 and res.skipped_other_date == 1
    assert res.duplicates[0]["task"] == "a" and res.duplicates[0]["dropped"].endswith("mine.jsonl:5")
    assert res.quarantined[0].line == 6
    assert res.summary()["sources"] == {f"task file {d / 'mine.jsonl'}": 2, "packaged tasks": 80}


# a version read while its folder is re-saved ------------------------------------------------------

def _resave_version(s: SkillStore, vid: str, stop, saves) -> None:
    """Re-save the version folder again and again, as atomic_dir saves any folder (a repair, or two
    processes saving one version), until told to stop; ``saves`` counts the saves."""
    from sage_pipeline import artifacts

    src = {name: (s.versions_dir / vid / name).read_bytes() for name in ("SKILL.md", "MEMORY.md", "version.json")}
    while not stop.is_set():
        with artifacts.atomic_dir(s.versions_dir / vid) as tmp:
            for name, data in src.items():
                (tmp / name).write_bytes(data)
        with saves.get_lock():
            saves.value += 1
    os._exit(0)


@pytest.mark.parametrize("swap", ["exchange", "two-renames"])
def test_a_version_read_while_its_folder_is_re_saved_is_whole_and_never_an_error(tmp_path, monkeypatch, swap):
    """read_version opens the version's folder once and both documents inside it: never a document
    of one folder with the other of the next, never a missing file while folders are swapped."""
    import multiprocessing

    from sage_pipeline import artifacts

    if swap == "two-renames":  # a filesystem without RENAME_EXCHANGE: the folder is gone for a moment
        monkeypatch.setattr(artifacts, "_exchange", lambda a, b: False)
    s, v1 = _two_versions(tmp_path)
    want = (s.versions_dir / v1 / "SKILL.md").read_bytes(), (s.versions_dir / v1 / "MEMORY.md").read_bytes()
    mp = multiprocessing.get_context("fork")
    stop, saves = mp.Event(), mp.Value("i", 0)
    writer = mp.Process(target=_resave_version, args=(s, v1, stop, saves))
    writer.start()
    reads, problems = 0, []
    try:
        # counted, not timed: 1,000 reads, while the writer re-saved the folder 200 times or more (the
        # deadline is only a hang guard; a loaded machine makes both sides slower, not fewer)
        deadline = time.monotonic() + 300.0
        while (reads + len(problems) < 1000 or saves.value < 200) and time.monotonic() < deadline:
            try:
                snap = s.read_version(v1)
                assert (snap.skill, snap.memory) == want
                reads += 1
            except StoreError as e:
                problems.append(str(e))
    finally:
        stop.set()
        writer.join(60)
    assert writer.exitcode == 0
    assert not problems, f"{len(problems)} of {reads + len(problems)} reads failed, e.g. {problems[:2]}"
    assert reads >= 1000 and saves.value >= 200, (reads, saves.value)
    assert sorted(p.name for p in s.versions_dir.iterdir() if p.name.startswith(".")) == []


# a switch of the live documents cut short by a kill ---------------------------------------------

KILLED = 77


def _commit_and_die(s: SkillStore, after_writes: int) -> None:
    """Commit v3, but die (os._exit: no clean-up, as kill -9) once ``after_writes`` of the two live
    documents are written (2: before the version is recorded in the index)."""
    from sage_pipeline import artifacts

    real_bytes, real_text, done = artifacts.write_bytes, artifacts.write_text, []

    def write_bytes(dest, data):
        if len(done) == after_writes:
            os._exit(KILLED)
        done.append(dest)
        return real_bytes(dest, data)

    def write_text(dest, text):
        if Path(dest).name == "index.jsonl" and len(done) == after_writes:
            os._exit(KILLED)
        return real_text(dest, text)

    artifacts.write_bytes, artifacts.write_text = write_bytes, write_text
    s.commit("skill v3\n", "memory v3\n", s.read(), "accepted", "2026-11-02", "the night's edit")
    os._exit(0)


def _killed_commit(tmp_path, after_writes: int) -> tuple[SkillStore, str, str]:
    import multiprocessing

    s, _ = _two_versions(tmp_path)
    v2 = s.read().id
    child = multiprocessing.get_context("fork").Process(target=_commit_and_die, args=(s, after_writes))
    child.start()
    child.join(60)
    assert child.exitcode == KILLED, "the commit was not cut short where the test meant to"
    return s, v2, version_id(b"skill v3\n", b"memory v3\n")


@pytest.mark.parametrize("after_writes", [0, 1, 2])
def test_a_commit_killed_between_the_live_documents_is_finished_by_the_next_run(tmp_path, after_writes):
    """The two live documents are replaced one after the other: a kill between them left a pair that
    was never a version (the new MEMORY.md beside the old SKILL.md), and the next night learned from
    it and recorded it as an outside edit. Now the next run finishes the switch first."""
    s, v2, v3 = _killed_commit(tmp_path, after_writes)
    if after_writes == 1:
        assert (s.read().skill, s.read().memory) == (b"skill v2\n", b"memory v3\n")  # the mixed pair
    assert (s.root / "pending.json").is_file()
    notes = SkillStore(tmp_path / "sleep", "coder").ensure_live()  # what the next night does first
    assert any("finished the switch" in n and v3 in n for n in notes)
    assert s.read().id == v3
    last = s.versions()[-1]
    assert (last.version, last.action, last.parent) == (v3, "accepted", v2) and "killed" in last.note
    assert not (s.root / "pending.json").exists()
    assert s.register(s.read()).version == v3  # nothing recorded as an outside edit


def test_a_killed_switch_whose_documents_were_edited_since_is_left_to_the_editor(tmp_path):
    s, v2, v3 = _killed_commit(tmp_path, 1)
    s.skill_path.write_text("edited by hand after the crash\n")
    notes = s.ensure_live()
    assert any("edited since" in n for n in notes)
    assert s.skill_path.read_text() == "edited by hand after the crash\n" and s.memory_path.read_text() == "memory v3\n"
    assert not (s.root / "pending.json").exists()
    assert s.register(s.read()).action == "external"


def test_a_rollback_finishes_a_killed_switch_before_it_reads_the_live_documents(tmp_path):
    s, v2, v3 = _killed_commit(tmp_path, 1)
    v1 = s.versions()[0].version
    v = s.restore(v1)
    assert s.read().id == v1 and v.action == "rollback"
    assert [e.version for e in s.versions()][-2:] == [v3, v1]  # the finished switch, then the rollback
