"""artifacts.atomic_set: an asset's several files and folders switch together.

Readers of the public paths see one run's complete set, never files of two runs, whatever
moment a writer is killed at; members a run does not write keep their content; real files
and folders of the older one-by-one layout are adopted without a moment of change."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from pathlib import Path

import pytest

from sage_pipeline import artifacts

MEMBERS = ("checkpoints/a", "checkpoints/b", "reports/r.json")


def _write(stage: artifacts.SetStage, marker: int, members=MEMBERS) -> None:
    for m in members:
        if m.endswith(".json"):
            artifacts.write_json(stage.path(m), {"marker": marker})
        else:
            with artifacts.atomic_dir(stage.path(m)) as tmp:
                for k in range(3):
                    (tmp / f"part{k}.txt").write_text(str(marker))


def _markers(root: Path) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for m in MEMBERS:
        p = root / m
        if not p.exists():
            out[m] = None
        elif p.is_dir():
            vals = {(p / f"part{k}.txt").read_text() for k in range(3)}
            assert len(vals) == 1, f"{p} holds files of two saves: {vals}"
            out[m] = int(vals.pop())
        else:
            out[m] = int(__import__("json").loads(p.read_text())["marker"])
    return out


def _run(root: Path, marker: int, members=MEMBERS) -> None:
    with artifacts.atomic_set(root, "asset", MEMBERS) as stage:
        _write(stage, marker, members)


def test_a_run_switches_every_member_and_readers_find_them_at_their_usual_paths(tmp_path):
    _run(tmp_path, 1)
    assert _markers(tmp_path) == dict.fromkeys(MEMBERS, 1)
    _run(tmp_path, 2)
    assert _markers(tmp_path) == dict.fromkeys(MEMBERS, 2)
    assert all((tmp_path / m).is_symlink() for m in MEMBERS)
    home = tmp_path / artifacts.SETS_DIR / "asset"
    versions = sorted(p.name for p in home.iterdir() if p.is_dir() and not p.is_symlink())
    assert len(versions) == 2  # the current one and the one it replaced, for readers still in it
    assert os.readlink(home / "current") in versions and os.readlink(home / "previous") in versions
    _run(tmp_path, 3)
    assert len([p for p in home.iterdir() if p.is_dir() and not p.is_symlink()]) == 2


def test_a_member_the_run_does_not_write_keeps_its_content(tmp_path):
    _run(tmp_path, 1)
    _run(tmp_path, 2, members=("checkpoints/a",))
    assert _markers(tmp_path) == {"checkpoints/a": 2, "checkpoints/b": 1, "reports/r.json": 1}


def test_a_member_never_written_has_no_link_pointing_nowhere(tmp_path):
    _run(tmp_path, 1, members=("checkpoints/a", "reports/r.json"))
    assert not os.path.lexists(tmp_path / "checkpoints/b")
    (tmp_path / "checkpoints/b").mkdir()  # so a plain mkdir of it still works
    assert (tmp_path / "checkpoints/a/part0.txt").read_text() == "1"


def test_real_files_and_folders_of_the_older_layout_are_adopted(tmp_path):
    for m in MEMBERS:  # what the one-by-one writers left
        p = tmp_path / m
        p.parent.mkdir(parents=True, exist_ok=True)
        if m.endswith(".json"):
            p.write_text('{"marker": 0}')
        else:
            p.mkdir()
            for k in range(3):
                (p / f"part{k}.txt").write_text("0")
    _run(tmp_path, 1, members=("checkpoints/a",))
    assert _markers(tmp_path) == {"checkpoints/a": 1, "checkpoints/b": 0, "reports/r.json": 0}
    assert all((tmp_path / m).is_symlink() for m in MEMBERS)
    # a real folder written since by another writer is adopted too, then replaced by the run
    (tmp_path / "checkpoints/b").unlink()
    (tmp_path / "checkpoints/b").mkdir()
    for k in range(3):
        (tmp_path / "checkpoints/b" / f"part{k}.txt").write_text("7")
    _run(tmp_path, 2, members=("reports/r.json",))
    assert _markers(tmp_path) == {"checkpoints/a": 1, "checkpoints/b": 7, "reports/r.json": 2}


def test_a_failed_run_changes_nothing_and_leaves_nothing(tmp_path):
    _run(tmp_path, 1)
    with pytest.raises(RuntimeError, match="boom"):
        with artifacts.atomic_set(tmp_path, "asset", MEMBERS) as stage:
            _write(stage, 2, ("checkpoints/a",))
            raise RuntimeError("boom")
    assert _markers(tmp_path) == dict.fromkeys(MEMBERS, 1)
    home = tmp_path / artifacts.SETS_DIR / "asset"
    assert not [p for p in home.iterdir() if p.name.endswith(".partial")]


def test_writing_outside_the_members_is_an_error_that_names_them(tmp_path):
    with pytest.raises(ValueError, match=r"wrote \['other.txt'\], which are not among its members"):
        with artifacts.atomic_set(tmp_path, "asset", MEMBERS) as stage:
            artifacts.write_text(stage.path("other.txt"), "x")
    with pytest.raises(ValueError, match="must be paths inside the artifact root"):
        with artifacts.atomic_set(tmp_path, "asset", ["../escape"]):
            pass


def test_public_maps_a_staged_path_to_where_readers_find_it(tmp_path):
    with artifacts.atomic_set(tmp_path, "asset", MEMBERS) as stage:
        p = artifacts.write_json(stage.path("reports", "r.json"), {"marker": 1})
        assert stage.public(p) == tmp_path / "reports" / "r.json"


def _run_forever(root: Path, first: int, done) -> None:
    marker = first
    while True:
        _run(root, marker)
        with done.get_lock():
            done.value += 1
        marker += 1


def test_kill_9_at_any_moment_leaves_one_runs_set_and_the_next_run_sweeps(tmp_path):
    """30 writers killed at random moments: after each kill every member holds one marker,
    and it is one the set had as a whole. Each writer is killed after 0, 1 or 2 of its runs have
    completed and then at a random point of the next one (scaled to a run's measured duration),
    so the kills land at many moments however loaded the machine is."""
    t0 = time.perf_counter()
    _run(tmp_path, 0)
    one_run = time.perf_counter() - t0
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(0)
    seen = set()
    for trial in range(30):
        done = ctx.Value("i", 0)
        proc = ctx.Process(target=_run_forever, args=(tmp_path, 1000 * (trial + 1), done))
        proc.start()
        completed, deadline = rng.randint(0, 2), time.monotonic() + 60
        while done.value < completed and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.0, 1.5 * one_run))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        markers = set(_markers(tmp_path).values())
        assert len(markers) == 1, f"trial {trial}: members of two runs: {_markers(tmp_path)}"
        seen |= markers
    assert len(seen) > 5  # the kills landed at many moments, several runs completed
    _run(tmp_path, 1)
    home = tmp_path / artifacts.SETS_DIR / "asset"
    left = [p.name for p in home.iterdir() if not p.is_symlink()]
    assert len(left) == 2 and not [n for n in left if n.endswith(".partial")], left
    assert not [p for p in home.iterdir() if p.is_symlink() and p.name.startswith(".")]


def _reader(root: Path, seconds: float, out) -> None:
    bad, reads, end = 0, 0, time.monotonic() + seconds
    home = root / artifacts.SETS_DIR / "asset"
    while time.monotonic() < end:
        version = home / os.readlink(home / "current")  # one version, read whole
        try:
            vals = {(version / "checkpoints/a" / f"part{k}.txt").read_text() for k in range(3)}
            vals.add(str(__import__("json").loads((version / "reports/r.json").read_text())["marker"]))
        except FileNotFoundError:
            continue  # swept after two newer switches: read the current one again
        bad += len(vals) != 1
        reads += 1
    out.put((bad, reads))


def test_concurrent_runs_all_succeed_and_the_last_switch_wins_whole(tmp_path):
    _run(tmp_path, 0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    reader = ctx.Process(target=_reader, args=(tmp_path, 3.0, out))
    reader.start()
    writers = [ctx.Process(target=lambda w=w: [_run(tmp_path, 100 * w + i) for i in range(1, 15)])
               for w in (1, 2, 3)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    bad, reads = out.get(timeout=30)
    reader.join()
    assert reads > 0 and bad == 0
    markers = set(_markers(tmp_path).values())
    assert len(markers) == 1 and markers.pop() % 100 == 14
