"""A few trials of each category of benchmarks/fault_injection.py (issue 17's acceptance run), so
the test suite covers them: fuzzed journals through the ingest, kill -9 of materializations at
random delays and a plain re-run, two materializations at once, a SAGE night killed inside its commit, the SAGE
night's backend against a failing server, its night lock held by another night, bad configs of its asset, and (slow)
a daemon-launched night killed holding the pool's slot. The benchmark itself runs hundreds (docs/benchmarks.md,
"Fault injection")."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fi():
    spec = importlib.util.spec_from_file_location("fault_injection", REPO / "benchmarks" / "fault_injection.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("fault_injection", module)
    spec.loader.exec_module(module)
    return module


def _failures(trials) -> list[str]:
    return [f"{t.category} {t.name}: {t.detail}" for t in trials if not t.ok]


def test_fuzzed_journals_lose_no_valid_line_and_crash_nothing(fi, tmp_path):
    trials = fi.fuzz_trials(tmp_path, [1, 2, 3])
    assert len(trials) == 3 and not _failures(trials), _failures(trials)
    facts = [t.facts for t in trials]
    assert sum(f["poison"] for f in facts) > 20 and sum(f["valid"] for f in facts) > 100
    assert all(f["lines_read"] == f["accepted"] + f["quarantined"] for f in facts)


def test_a_damaged_gzip_oracle_is_exact(fi):
    """The fuzz's own yardstick: what a byte-by-byte reader recovers from each kind of damage."""
    import gzip
    import random

    raw = b"\n".join(b'{"type": "X", "n": %d}' % i for i in range(500)) + b"\n"
    gz = gzip.compress(raw, mtime=0)
    assert fi._gz_recoverable(gz) == (raw, True)
    assert fi._gz_recoverable(gz + gz) == (raw + raw, True)
    assert fi._gz_recoverable(gz + b"\x00" * 5) == (raw, True)  # zero padding is not damage
    assert fi._gz_recoverable(gz + b"junk") == (raw, False)
    assert fi._gz_recoverable(raw) == (b"", False)
    cut, clean = fi._gz_recoverable(gz[: len(gz) // 2])
    assert not clean and 0 < len(cut) < len(raw) and raw.startswith(cut)
    damaged = fi._damage(random.Random(0), raw, "corrupt")
    got, clean = fi._gz_recoverable(damaged)
    assert not clean


def test_kills_at_random_delays_leave_old_or_new_artifacts_and_a_plain_rerun_works(fi, tmp_path):
    """Two kill -9 trials each of synthetic_sessions, trajectories and a night of sleep_cycle/sage_skills (SAGE's
    night on the shipped week), then two runs at once of each: complete artifacts, old or new (the SAGE skills root
    whole), no temporary file left, no failed run."""
    bench = fi.Bench(tmp_path / "kill", seed=7)
    trials = []
    try:
        for spec in (s for s in fi.ASSETS if s.name in ("synthetic_sessions", "trajectories",
                                                          "sleep_cycle/sage_skills")):
            for i in (0, 1):
                if spec.prepare:
                    spec.prepare(bench.root, i)
                ok, why = bench.run(spec, i)
                assert ok, f"{spec.name}: {why}"
            trials += [fi.kill_trial(bench, spec, i) for i in (0, 1)]
            trials.append(fi.concurrent_trial(bench, spec, 0))
    finally:
        bench.close()
    assert len(trials) == 9 and not _failures(trials), _failures(trials)
    assert any(t.facts.get("killed") for t in trials if t.category == "kill"), "no kill landed inside a run"


@pytest.mark.parametrize("mode", ["trickle_body", "trickle_headers", "reset", "usage_5", "nesting_100000",
                                  "http_500"])
def test_each_backend_failure_ends_the_night_in_backend_error_within_its_deadline(fi, tmp_path, mode):
    t = fi.backend_trial(tmp_path, mode, timeout_s=0.5, max_retries=1)
    assert t.ok, t.detail
    assert t.seconds <= t.facts["bound_s"]


def test_a_sage_night_killed_in_its_commit_leaves_a_whole_live_version_and_the_next_night_succeeds(fi, tmp_path):
    """run_sage_night in a child, killed at a random delay and as its commit's version folder is written: the live
    version whole and the old or the new one; the plain re-run succeeds with the new one live, nothing left."""
    import random

    cal = fi.night_calibrate(tmp_path)
    trials = [fi.night_kill_trial(tmp_path, i, cal, random.Random(i)) for i in (0, 1)]
    assert not _failures(trials), _failures(trials)
    assert all(t.facts["live_after_kill"] in ("old", "new") and t.facts["rerun"] in ("accepted", "no_edits")
               for t in trials)


def test_the_night_lock_held_by_another_night_is_a_recorded_conflict_and_a_bad_config_names_its_field(fi, tmp_path):
    t = fi.night_lock_trial(tmp_path, wait_s=0.3)
    assert t.ok, t.detail
    t = fi.bad_config_trial()
    assert t.ok and t.facts["configs"] >= 10, t.detail


def test_the_skills_root_check_refuses_a_cut_short_version_and_a_pointer_off_the_history(fi, tmp_path):
    """The kill trials' yardstick for the SAGE skills root: a whole root passes; a version folder missing a file,
    or a live pointer at a version the history does not end with, is Broken."""
    import json

    from sage_pipeline.sleep.sage_skills import SageSkillsRoot

    root = SageSkillsRoot(tmp_path / "skills")
    first = root.live()
    tdd = "discipline/test-driven-development/SKILL.md"
    second = root.commit({tdd: root.text("live", tdd) + "\n- Read the task twice.\n"}, "a change").version
    got = fi.check_skills_root(root.folder)
    assert got["live"] == second and got["history"] == "2" and got["versions"] == ",".join(sorted([first, second]))
    pointer = json.loads(root.live_file.read_text())
    (root.live_file).write_text(json.dumps({**pointer, "version": "0" * 12}))
    with pytest.raises(fi.Broken):
        fi.check_skills_root(root.folder)
    root.live_file.write_text(json.dumps(pointer))
    (root.versions_dir / first / tdd).unlink()
    with pytest.raises(fi.Broken):
        fi.check_skills_root(root.folder)


def test_leftover_scan_finds_what_killed_writers_leave(fi, tmp_path):
    """The kill trials' check for temporary files: it must see each kind a killed writer leaves."""
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / ".offline_eval.json.k3j5h2g1.tmp").write_text("{")
    (tmp_path / "checkpoints" / ".bc.tmp-ab12cd34").mkdir(parents=True)
    (tmp_path / "checkpoints" / ".cql.old-ab12cd34").mkdir()
    (tmp_path / "routing").mkdir()
    (tmp_path / "routing" / ".routing_v1.parquet.parts.x1y2z3w4").mkdir()
    (tmp_path / ".synthetic_versions" / "20261124T000000Z-seed1-abcdefgh.partial").mkdir(parents=True)
    (tmp_path / "reports" / "kept.json").write_text("{}")
    (tmp_path / ".locks").mkdir()
    (tmp_path / ".locks" / "trajectories.lock").write_text("")
    assert fi.leftovers(tmp_path) == [".synthetic_versions/20261124T000000Z-seed1-abcdefgh.partial",
                                      "checkpoints/.bc.tmp-ab12cd34", "checkpoints/.cql.old-ab12cd34",
                                      "reports/.offline_eval.json.k3j5h2g1.tmp",
                                      "routing/.routing_v1.parquet.parts.x1y2z3w4"]
    assert fi._writing(tmp_path)
    assert not fi._writing(tmp_path / ".locks")


def test_leftover_scan_finds_what_a_killed_set_switch_leaves(fi, tmp_path):
    """atomic_set's leftovers: a version being written, a link not renamed into place, a
    pointer link not renamed, and more versions than the current one and the one it replaced."""
    home = tmp_path / ".sets" / "bc_policy"
    home.mkdir(parents=True)
    for name in ("20261124T000000Z-a1b2c3d4", "20261124T000001Z-e5f6a7b8"):
        (home / name).mkdir()
    (home / "current").symlink_to("20261124T000001Z-e5f6a7b8")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "bc").symlink_to("../.sets/bc_policy/current/checkpoints/bc")
    assert fi.leftovers(tmp_path) == []
    (home / "20261124T000002Z-c9d0e1f2.partial").mkdir()
    (home / ".current.0a1b2c3d").symlink_to("20261124T000000Z-a1b2c3d4")
    (tmp_path / "checkpoints" / ".bc.link-0a1b2c3d").symlink_to("../.sets/bc_policy/current/checkpoints/bc")
    assert fi.leftovers(tmp_path) == [".sets/bc_policy/.current.0a1b2c3d",
                                      ".sets/bc_policy/20261124T000002Z-c9d0e1f2.partial",
                                      "checkpoints/.bc.link-0a1b2c3d"]
    (home / "20261124T000002Z-c9d0e1f2.partial").rename(home / "20261124T000002Z-c9d0e1f2")
    assert ".sets/bc_policy holds 3 sets" in fi.leftovers(tmp_path)
    assert not fi._writing(tmp_path)  # an asset's set being written counts when its files' writes begin


def test_a_full_disk_fails_naming_path_and_asset_and_keeps_the_old_set(fi, tmp_path):
    """Issue 35's full-disk case, one trial per asset (a real tmpfs: root only)."""
    import os

    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    trials = [fi.disk_trial(tmp_path, asset, k) for k, asset in enumerate(fi.DISK_ASSETS)]
    assert len(trials) == 3 and not _failures(trials), _failures(trials)
    assert all("No space left" in t.facts["message"] and "asset " in t.facts["message"] for t in trials)


@pytest.mark.slow
def test_a_daemon_launched_night_killed_holding_the_pool_slot_never_blocks_the_next(fi, tmp_path):
    """The pool trial (--pool): a sleep_cycle/sage_skills night launched through dagster-daemon holds the sleep_cycle
    pool's only slot, its run worker is killed with -9, the dead run is marked failed and the next night runs."""
    trial = fi.pool_trial(tmp_path)
    assert trial.ok, trial.detail
    assert trial.facts["slot_holder_is_first"] and trial.facts["second_waited"]


@pytest.mark.slow
def test_a_killed_pooled_cli_run_never_blocks_the_next(fi, tmp_path):
    trial = fi.cli_pool_trial(tmp_path, 0)
    assert trial.ok, trial.detail
    assert trial.facts["next_run_s"] < 60


@pytest.mark.slow
def test_the_results_go_to_the_scratch_folder_never_into_the_clone(tmp_path):
    import json
    import subprocess

    scratch = tmp_path / "scratch"
    r = subprocess.run([sys.executable, str(REPO / "benchmarks" / "fault_injection.py"), "--no-kill",
                        "--fuzz-trials", "1", "--backend-rounds", "0", "--disk-trials", "0", "--cli-pool-trials", "0",
                        "--scratch", str(scratch)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert json.loads((scratch / "fault_injection.json").read_text())["rows"][0]["trials"] == 1
    assert not (REPO / "benchmarks" / ".scratch" / "fault_injection.json").exists() or \
        (REPO / "benchmarks" / ".scratch" / "fault_injection.json").stat().st_mtime < scratch.stat().st_mtime
