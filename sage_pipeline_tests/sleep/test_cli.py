"""``python -m sage_pipeline.sleep``: run-night, versions, show, rollback, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sage_pipeline.sleep.__main__ import main
from sage_pipeline.sleep.store import SkillStore


def test_run_night_versions_show_and_rollback(tmp_path, capsys):
    root = ["--data-dir", str(tmp_path)]
    for d in ("2026-11-02", "2026-11-03"):  # the strict gate: the simulated world's rules move too few val tasks
        assert main([*root, "run-night", "--skill", "reviewer", "--date", d, "--gate-test", "strict"]) == 0
    out = capsys.readouterr().out
    assert "reviewer 2026-11-03: accepted" in out and "diagnostics:" in out
    store = SkillStore(tmp_path / "sleep", "reviewer")
    entries = store.versions()
    assert [v.action for v in entries] == ["initial", "accepted", "accepted"]
    assert main([*root, "versions", "--skill", "reviewer"]) == 0
    table = capsys.readouterr().out
    assert all(v.version in table for v in entries) and "| v3 |" in table
    assert main([*root, "show", "--skill", "reviewer", "--version", "v1"]) == 0
    assert capsys.readouterr().out == store.read_version(entries[0].version).skill.decode()
    assert main([*root, "rollback", "--skill", "reviewer", "--version", entries[0].version[:5],
                 "--note", "too eager"]) == 0
    said = capsys.readouterr().out
    assert f"now at version {entries[0].version}" in said and f"--version {entries[2].version}" in said
    assert store.current() == entries[0].version and store.versions()[-1].note == "too eager"


def test_errors_exit_2_with_a_message(tmp_path, capsys):
    root = ["--data-dir", str(tmp_path)]
    assert main([*root, "versions", "--skill", "reviewer"]) == 0
    assert "no stored versions" in capsys.readouterr().out
    main([*root, "run-night", "--skill", "reviewer", "--date", "2026-11-02"])
    capsys.readouterr()
    assert main([*root, "rollback", "--skill", "reviewer", "--version", "nope"]) == 2
    assert "is not a stored version" in capsys.readouterr().err


def test_a_failed_night_exits_1(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SAGE_SLEEP_MODEL", raising=False)
    rc = main(["--data-dir", str(tmp_path), "run-night", "--skill", "reviewer", "--date", "2026-11-02",
               "--backend", "openai"])
    out = capsys.readouterr().out
    assert rc == 1 and "backend_error" in out and "no model set" in out


def test_module_entry_point_runs():
    out = subprocess.run([sys.executable, "-m", "sage_pipeline.sleep", "--help"], capture_output=True, text=True,
                         check=False)
    assert out.returncode == 0 and "rollback" in out.stdout and "run-night" in out.stdout


@pytest.mark.parametrize("bad,said", [("0", "'0': the deadline must be a positive number of seconds"),
                                      ("-2", "'-2': the deadline must be a positive number of seconds"),
                                      ("nan", "'nan': the deadline must be a positive number of seconds"),
                                      ("x", "'x' is not a number: give seconds")])
def test_timeout_must_be_a_positive_number(tmp_path, capsys, bad, said):
    with pytest.raises(SystemExit) as ei:
        main(["--data-dir", str(tmp_path), "run-night", "--skill", "reviewer", "--date", "2026-11-02",
              "--timeout", bad])
    err = capsys.readouterr().err
    assert ei.value.code == 2 and "argument --timeout" in err and said in err
    assert not (tmp_path / "sleep").exists()  # nothing ran


def test_timeout_reaches_the_backend(tmp_path, capsys, chat_server):
    chat_server.script = [("status", 401, '{"error": {"message": "no key"}}', {})]  # the first call ends the night
    rc = main(["--data-dir", str(tmp_path), "run-night", "--skill", "reviewer", "--date", "2026-11-02",
               "--backend", "openai", "--base-url", chat_server.base_url, "--model", "m", "--timeout", "2.5"])
    assert rc == 1 and "backend_error" in capsys.readouterr().out
    d = json.loads((tmp_path / "sleep" / "reviewer" / "nights" / "2026-11-02" / "diagnostics.json").read_text())
    assert d["backend"]["timeout_s"] == 2.5 and len(chat_server.requests) == 1


@pytest.mark.parametrize("option,field,said", [
    (["--edit-budget", "0"], "cycle.limits.edit_budget", "greater than or equal to 1"),
    (["--block-max-chars", "100"], "cycle.limits", "must hold at least one rule of max_rule_chars (300)"),
    (["--workers", "0"], "cycle.workers", "greater than or equal to 1")])
def test_a_bad_setting_exits_2_naming_the_field_and_what_is_allowed(tmp_path, capsys, option, field, said):
    rc = main(["--data-dir", str(tmp_path), "run-night", "--skill", "reviewer", "--date", "2026-11-02", *option])
    err = capsys.readouterr().err
    assert rc == 2 and field in err and said in err, err
    assert not (tmp_path / "sleep").exists()  # nothing ran


def test_an_option_outside_its_choices_is_refused_by_the_parser(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--data-dir", str(tmp_path), "run-night", "--skill", "reviewer", "--date", "2026-11-02",
              "--metric", "f1"])
    assert "argument --metric: invalid choice: 'f1'" in capsys.readouterr().err
