"""Issue 35, the sleep store: a path of the wrong kind is an error naming it and what to do; a deleted
SKILL.md or index.jsonl is recovered from the version folders, and the night's report says so."""

from __future__ import annotations

import json

import pytest

from sage_pipeline.sleep.cycle import CycleConfig
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.nightly import NightSettings, run_night
from sage_pipeline.sleep.store import SkillStore, StoreError

D1, D2 = "2026-11-03", "2026-11-04"


def settings() -> NightSettings:
    # the strict gate: these nights must accept, and the simulated world's rules move too few val
    # tasks for the default paired gate (sleep/test_cycle_gate.py runs that one)
    return NightSettings(log_dirs=(), cycle=CycleConfig(gate=GateConfig(test="strict")))


def night(root, date=D1):
    return run_night(root, "reviewer", date, None, settings())


def store(root) -> SkillStore:
    return SkillStore(root / "sleep", "reviewer")


def test_skill_md_that_is_a_folder_is_an_input_error_naming_the_path(tmp_path):
    (tmp_path / "sleep" / "reviewer" / "SKILL.md").mkdir(parents=True)
    r, files = night(tmp_path)
    assert r.status == "input_error"
    assert r.cause.startswith(f"{tmp_path / 'sleep' / 'reviewer' / 'SKILL.md'}: the live skill document is a folder")
    assert "move it away" in r.cause
    assert json.loads(files.diagnostics.read_text())["status"] == "input_error"
    assert (tmp_path / "sleep" / "reviewer" / "SKILL.md").is_dir()  # left alone


def test_a_nights_folder_that_is_a_file_is_an_error_naming_the_path(tmp_path):
    nights = tmp_path / "sleep" / "reviewer" / "nights"
    nights.mkdir(parents=True)
    (nights / D1).write_text("not a folder")
    with pytest.raises(StoreError, match=rf"^{nights / D1}: is a file where the folder of the nights' reports .*"
                                         r"move it away \(or delete it\), then run the night again$"):
        night(tmp_path)
    assert (nights / D1).read_text() == "not a folder"


@pytest.mark.slow  # over 0.6 s: out of make test-fast (issue 35)
def test_a_deleted_skill_md_is_restored_from_the_last_version_and_the_report_says_so(tmp_path):
    r1, _ = night(tmp_path)
    assert r1.status == "accepted"
    s = store(tmp_path)
    learned = s.skill_path.read_bytes()
    seqs = len(s.versions())
    s.skill_path.unlink()
    r2, files = night(tmp_path, D2)
    assert r2.ok, (r2.status, r2.cause)
    note = next(n for n in r2.notes if "was missing" in n)
    assert note.startswith(f"{s.skill_path} was missing: restored from the last recorded version "
                           f"{r1.versions['after']}")
    assert "restored from the last recorded version" in files.report.read_text()
    assert "restored from the last recorded version" in json.dumps(json.loads(files.diagnostics.read_text())["notes"])
    # learning went on from the restored document: its learned rules are still there
    assert r2.versions["before"] == r1.versions["after"]
    restored_then = store(tmp_path).read_version(r2.versions["before"]).skill
    assert restored_then == learned
    assert all(v.action != "initial" for v in store(tmp_path).versions()[seqs:])


@pytest.mark.slow  # over 0.6 s: out of make test-fast (issue 35)
def test_a_deleted_index_is_rebuilt_from_the_version_folders_and_the_report_says_so(tmp_path):
    r1, _ = night(tmp_path)
    s = store(tmp_path)
    old = s.versions()
    assert len(old) >= 2
    s.index.unlink()
    r2, files = night(tmp_path, D2)
    assert r2.ok, (r2.status, r2.cause)
    assert any("was missing or empty while" in n and "rebuilt" in n for n in r2.notes)
    assert "rebuilt from their version.json" in files.report.read_text()
    new = store(tmp_path).versions()
    # every old version folder is in the history again, in order, none orphaned; no new 'initial'
    assert [v.version for v in new[:len(old)]] == [v.version for v in old]
    assert {v.action for v in new[:len(old)]} == {"recovered"}
    assert all(v.action != "initial" for v in new)
    assert r2.versions["before"] == r1.versions["after"]


def test_an_emptied_index_is_rebuilt_too_and_a_tampered_folder_is_skipped_and_named(tmp_path):
    night(tmp_path)
    s = store(tmp_path)
    old = s.versions()
    first = s.versions_dir / old[0].version
    (first / "SKILL.md").write_text("tampered")
    s.index.write_text("")
    notes = s.ensure_live()
    assert any(f"skipped 1 unusable folder(s): {old[0].version}" in n for n in notes)
    assert [v.version for v in s.versions()] == [v.version for v in old[1:]]
