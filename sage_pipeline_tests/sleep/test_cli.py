"""``python -m sage_pipeline.sleep`` on the SAGE skills root: status, versions, diff, rollback, night; and its
refusals (an unknown skill, an unknown version, a folder that is not a skills root, a bad date)."""

from __future__ import annotations

import pytest

from sage_pipeline.sleep.__main__ import main
from sage_pipeline.sleep.sage_skills import SageSkillsRoot

TDD = "discipline/test-driven-development/SKILL.md"
RULE = "\n- Run every example of the task by hand before answering.\n"


@pytest.fixture
def root(tmp_path) -> SageSkillsRoot:
    r = SageSkillsRoot(tmp_path / "skills")
    r.commit({TDD: r.text("live", TDD) + RULE}, "a night's rule")
    return r


def run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_status_shows_the_live_version_its_shas_and_how_to_deploy_it(root, capsys):
    rc, out, _ = run(capsys, "--root", str(root.folder), "status")
    assert rc == 0 and f"live: v2={root.live()}" in out
    assert f"export SAGE_SKILLS_ROOT={root.live_path()}" in out
    assert f"| {TDD} | {root.shas()[TDD]} |" in out and "2 version(s) made live" in out


def test_versions_lists_every_live_version_and_filters_by_skill(root, capsys):
    rc, out, _ = run(capsys, "--root", str(root.folder), "versions")
    assert rc == 0 and "| v1 |" in out and "| v2 |" in out and "a night's rule" in out
    rc, out, _ = run(capsys, "--root", str(root.folder), "versions", "--skill", "verification-before-completion")
    assert rc == 0 and "| v1 |" in out and "| v2 |" not in out  # v2 did not change it


def test_diff_defaults_to_the_live_versions_parent(root, capsys):
    rc, out, _ = run(capsys, "--root", str(root.folder), "diff")
    assert rc == 0 and "+- Run every example of the task by hand before answering." in out and TDD in out
    rc, out, _ = run(capsys, "--root", str(root.folder), "diff", "--from", "v2", "--to", "live")
    assert rc == 0 and "hold the same skills" in out


def test_rollback_undoes_the_skills_last_change_and_can_itself_be_undone(root, capsys):
    v2 = root.live()
    rc, out, _ = run(capsys, "--root", str(root.folder), "rollback", "test-driven-development")
    assert rc == 0 and "rolled back" in out
    r = SageSkillsRoot(root.folder)
    assert RULE.strip() not in r.text("live", TDD) and r.versions()[-1].action == "rollback"
    assert r.texts("live") == r.texts("v1")
    rc, out, _ = run(capsys, "--root", str(root.folder), "rollback", TDD, "--to", v2[:6])
    assert rc == 0 and RULE.strip() in SageSkillsRoot(root.folder).text("live", TDD)
    rc, out, _ = run(capsys, "--root", str(root.folder), "rollback", TDD, "--to", "live")
    assert rc == 0 and "nothing changed" in out


def test_bad_input_is_refused_with_what_to_do(root, tmp_path, capsys):
    rc, _, err = run(capsys, "--root", str(root.folder), "rollback", "no-such-skill")
    assert rc == 2 and "skill 'no-such-skill' is not one of SAGE's skills" in err and "test-driven-development" in err
    rc, _, err = run(capsys, "--root", str(root.folder), "rollback", TDD, "--to", "feedbeef")
    assert rc == 2 and "version 'feedbeef' is not a version of this root" in err
    rc, _, err = run(capsys, "--root", str(root.folder), "diff", "--from", "v9")
    assert rc == 2 and "'v9'" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("x")
    for cmd in (["status"], ["versions"], ["diff"], ["rollback", TDD]):
        rc, _, err = run(capsys, "--root", str(other), *cmd)
        assert rc == 2 and f"{other} is not a SAGE skills root: it has no live.json" in err, (cmd, err)
    assert not (other / "live.json").exists()  # never created
    rc, _, err = run(capsys, "--root", str(tmp_path / "missing"), "status")
    assert rc == 2 and "it does not exist" in err
    rc, _, err = run(capsys, "--root", str(other), "night", "--date", "2026-11-28")
    assert rc == 2 and "not an empty folder" in err
    rc, _, err = run(capsys, "--root", str(tmp_path / "new"), "night", "--date", "28/11/2026")
    assert rc == 2 and "give the night's day as YYYY-MM-DD" in err
    fresh = SageSkillsRoot(tmp_path / "fresh")
    rc, _, err = run(capsys, "--root", str(fresh.folder), "rollback", TDD)
    assert rc == 2 and "has never changed" in err


def test_night_runs_the_sage_night_on_the_root_with_the_config(tmp_path, capsys, monkeypatch):
    for name in ("SAGE_WORKSPACES", "SAGE_JOURNALS", "SAGE_GOAL_LEDGERS"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "night.json"
    config.write_text('{"embedded": false}')
    rc, out, _ = run(capsys, "--data-dir", str(tmp_path / "data"), "night", "--date", "2026-11-28",
                     "--config", str(config))
    assert rc == 0 and "nothing to harvest" in out
    empty = tmp_path / "ws"
    empty.mkdir()
    monkeypatch.setenv("SAGE_WORKSPACES", str(empty))
    rc, out, err = run(capsys, "--root", str(tmp_path / "r"), "night", "--date", "2026-11-28", "--model", "m",
                       "--host", "127.0.0.1:1")
    r = SageSkillsRoot(tmp_path / "r")
    assert rc == 0 and "night no_tasks" in out and f"live: v1={r.live()}" in out, (out, err)
    assert (tmp_path / "r" / "nights" / "2026-11-28" / "coder" / "diagnostics.json").is_file()
    bad = tmp_path / "bad.json"
    bad.write_text('{"backend": "gpt"}')
    rc, _, err = run(capsys, "--data-dir", str(tmp_path / "data"), "night", "--date", "2026-11-28", "--config",
                     str(bad))
    assert rc == 2 and "backend" in err
