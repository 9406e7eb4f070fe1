"""artifacts.atomic_dir under kills and concurrency, through the checkpoint writer and reader.

Every checkpoint saved here carries one marker (an integer) in both files: ``config.marker``
in ``policy.json`` and every weight in ``weights.npz``, so a load that mixes two saved
versions is caught.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest

from sage_pipeline import artifacts
from sage_pipeline.rl.checkpoint import CheckpointMeta, load_policy, save_checkpoint

MP = multiprocessing.get_context("fork")  # children start in milliseconds and share this module
KILLED = 77  # exit status of a child that "died" mid-save


def _save(path: Path, marker: int) -> None:
    meta = CheckpointMeta(kind="test", feature_spec={}, actions=["a", "b"], role_mask=[[True, True]],
                          config={"marker": marker})
    net = [(np.full((64, 64), marker, np.float32), np.full(64, marker, np.float32)),
           (np.full((2, 64), marker, np.float32), np.full(2, marker, np.float32))]
    save_checkpoint(path, meta, [net])


def _marker(path: Path) -> int:
    """The version the checkpoint at ``path`` holds; AssertionError if its two files disagree."""
    pol = load_policy(path)
    marker = pol.meta.config["marker"]
    weights = {float(v) for layer in pol.nets[0] for arr in layer for v in np.unique(arr)}
    assert weights == {float(marker)}, f"mixed: policy.json has {marker}, weights.npz {sorted(weights)}"
    return marker


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_leftovers_of_killed_saves_do_not_break_the_next_save_and_are_swept(tmp_path):
    ck = tmp_path / "ck"
    _save(ck, 1)
    leftovers = [".ck.old", ".ck.old-0a1b2c3d", ".ck.k3j5h2g1", ".ck.tmp-zz9yy8xx"]  # old and current names
    for name in leftovers:
        (tmp_path / name).mkdir()
        (tmp_path / name / "weights.npz").write_bytes(b"x" * 4096)
    (tmp_path / "ck.tmp").write_text("an unrelated file")
    (tmp_path / ".other.old").mkdir()  # another folder's leftover is not this save's business
    _save(ck, 2)
    assert _marker(ck) == 2
    assert _names(tmp_path) == [".other.old", "ck", "ck.tmp"]
    _save(ck, 3)  # and the next save too
    assert _marker(ck) == 3


def _save_and_die(ck: Path, when: str) -> None:
    """Save version 2 of ``ck`` but die (os._exit, no cleanup) just before or just after the
    first step that moves ``ck`` itself: the rename(s) of the swap, or the one-step exchange."""
    def dying(fn, moves_ck):
        def wrapper(*args, **kwargs):
            hit = moves_ck(*args)
            if hit and when == "before-swap":
                os._exit(KILLED)
            out = fn(*args, **kwargs)
            if hit and when == "after-swap":
                os._exit(KILLED)
            return out
        return wrapper

    def moves_ck(src, dst, *_):
        return ck in (Path(src), Path(dst))

    os.replace, os.rename = dying(os.replace, moves_ck), dying(os.rename, moves_ck)
    if hasattr(artifacts, "_exchange"):
        artifacts._exchange = dying(artifacts._exchange, lambda *_: True)
    _save(ck, 2)
    os._exit(0)


@pytest.mark.parametrize("when", ["before-swap", "after-swap"])
def test_a_save_killed_at_the_swap_leaves_a_complete_loadable_checkpoint(tmp_path, when):
    ck = tmp_path / "ck"
    _save(ck, 1)
    child = MP.Process(target=_save_and_die, args=(ck, when))
    child.start()
    child.join(60)
    assert child.exitcode == KILLED, "the save was not interrupted where the test meant to"
    assert _marker(ck) == (1 if when == "before-swap" else 2)  # killed before the swap: the old one
    _save(ck, 3)
    assert _marker(ck) == 3
    assert _names(tmp_path) == ["ck"]  # what the killed save left was swept by the next one


def _writer(ck: Path, writer: int, saves: int, start, stop, out) -> None:
    errors, done = [], 0
    start.wait()
    while done < saves or (stop is not None and not stop.is_set()):
        try:
            _save(ck, writer * 1000 + done)
        except Exception as exc:  # noqa: BLE001 - the test reports every failure
            errors.append(f"{type(exc).__name__}: {exc}")
        done += 1
        if stop is None and done >= saves:
            break
    out.put((writer, done, errors))


def _collect(out, procs, n):
    results = [out.get(timeout=120) for _ in range(n)]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    return results


def _without_exchange(monkeypatch) -> None:
    """Make atomic_dir take its fallback (two renames), as on a filesystem without RENAME_EXCHANGE."""
    monkeypatch.setattr(artifacts, "_exchange", lambda a, b: False, raising=False)


def test_a_fallback_save_killed_between_its_renames_is_repaired_by_the_next_save(tmp_path, monkeypatch):
    _without_exchange(monkeypatch)  # children are forked: they inherit it
    ck = tmp_path / "ck"
    _save(ck, 1)
    child = MP.Process(target=_save_and_die, args=(ck, "after-swap"))  # dies with ck renamed aside
    child.start()
    child.join(60)
    assert child.exitcode == KILLED
    with pytest.raises(RuntimeError, match="body failed"), artifacts.atomic_dir(ck) as tmp:
        (tmp / "policy.json").write_text("{}")
        raise RuntimeError("body failed")
    assert _marker(ck) == 1  # the old folder was put back before the (failed) save
    assert _names(tmp_path) == ["ck"]


@pytest.mark.parametrize("swap", ["exchange", "two-renames"])
def test_concurrent_saves_of_one_folder_all_succeed_and_leave_one_complete_version(tmp_path, monkeypatch,
                                                                                    swap):
    if swap == "two-renames":
        _without_exchange(monkeypatch)
    ck, writers, saves = tmp_path / "ck", 4, 25
    start, out = MP.Barrier(writers), MP.Queue()
    procs = [MP.Process(target=_writer, args=(ck, w, saves, start, None, out)) for w in range(1, writers + 1)]
    for p in procs:
        p.start()
    results = _collect(out, procs, writers)
    errors = [e for _, _, errs in results for e in errs]
    assert not errors, f"{len(errors)} of {writers * saves} saves failed, e.g. {errors[:3]}"
    assert _marker(ck) % 1000 == saves - 1  # the last save of one of the writers won, complete
    assert _names(tmp_path) == ["ck"]
    assert _names(ck) == ["policy.json", "weights.npz"]


def _reader(ck: Path, loads: int, versions: int, start, out) -> None:
    """Loads ``ck`` until it has made ``loads`` loads and seen ``versions`` different saves (counted,
    not timed: a loaded machine makes the reader and the writers slower, not the overlap smaller;
    the 300 s are only a hang guard)."""
    seen, problems = [], []
    start.wait()
    deadline = time.monotonic() + 300
    while (len(seen) + len(problems) < loads or len(set(seen)) < versions) and time.monotonic() < deadline:
        try:
            seen.append(_marker(ck))
        except Exception as exc:  # noqa: BLE001 - CheckpointError, or AssertionError for a mix
            problems.append(f"{type(exc).__name__}: {exc}")
    out.put(("reader", seen, problems))


def test_a_reader_never_fails_nor_mixes_versions_while_the_checkpoint_is_re_saved(tmp_path):
    ck = tmp_path / "ck"
    _save(ck, 0)
    start, stop, out = MP.Barrier(3), MP.Event(), MP.Queue()
    reader = MP.Process(target=_reader, args=(ck, 1000, 20, start, out))
    writers = [MP.Process(target=_writer, args=(ck, w, 1, start, stop, out)) for w in (1, 2)]
    for p in [reader, *writers]:
        p.start()
    first = out.get(timeout=400)  # the reader finishes first: the writers go on until told to stop
    assert first[0] == "reader"
    stop.set()
    results = [first, *_collect(out, [reader, *writers], 2)]
    _, seen, problems = results[0]
    errors = [e for _, _, errs in results[1:] for e in errs]
    saves = sum(done for _, done, _ in results[1:])
    assert not problems, f"{len(problems)} of {len(seen) + len(problems)} loads failed, e.g. {problems[:3]}"
    assert not errors, f"{len(errors)} of {saves} saves failed, e.g. {errors[:3]}"
    assert len(seen) >= 1000 and len(set(seen)) >= 20, "the reader did not overlap the saves"
    assert _names(tmp_path) == ["ck"]


# ---------------------------------------------------------------------------------------------
# atomic_path: single files. A killed writer's temporary file is swept by the next write into
# the same folder; a live writer's (another process, or this one) never is.
# ---------------------------------------------------------------------------------------------

def _write_and_hold(dest: Path, ready, release) -> None:
    """Start an atomic write of ``dest``, write part of it, then wait (to be killed, or released)."""
    with artifacts.atomic_path(dest) as tmp:
        tmp.write_bytes(b"half of a file")
        ready.set()
        release.wait(60)
        tmp.write_bytes(b"the whole file\n")
    os._exit(0)


def _temps(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".tmp") and p.name.startswith("."))


def _start_writer(dest: Path):
    ready, release = MP.Event(), MP.Event()
    child = MP.Process(target=_write_and_hold, args=(dest, ready, release))
    child.start()
    assert ready.wait(60), "the writer did not start its write"
    return child, release


def test_a_killed_writers_temporary_file_is_swept_by_the_next_write_to_the_folder(tmp_path):
    artifacts.write_json(tmp_path / "report.json", {"v": 1})
    child, _ = _start_writer(tmp_path / "report.json")
    assert len(_temps(tmp_path)) == 1
    os.kill(child.pid, 9)  # kill -9 in the middle of the write
    child.join(60)
    assert child.exitcode == -9
    assert len(_temps(tmp_path)) == 1, "the killed write left its temporary file"
    assert (tmp_path / "report.json").read_text() == '{\n  "v": 1\n}\n'  # the old complete version
    artifacts.write_text(tmp_path / "other.txt", "another artifact of the same folder\n")
    assert _temps(tmp_path) == [], "the next write did not sweep the dead writer's temporary file"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "report.json"]


def test_temporary_files_of_older_runs_and_only_those_are_swept(tmp_path):
    # a leftover of an earlier version (no writer holds it), and files that only look alike
    for name in (".report.json.k3j5h2g1.tmp", ".weights.npz.abc_1234.tmp"):
        (tmp_path / name).write_bytes(b"x" * 100)
    keep = ["notes.tmp", ".notes.tmp", ".report.json.tmp-k3j5h2g1", ".x.TOOLONG123.tmp"]
    for name in keep:
        (tmp_path / name).write_bytes(b"not atomic_path's")
    (tmp_path / ".ck.abcdefgh.tmp").mkdir()  # a folder is never swept as a file
    artifacts.write_bytes(tmp_path / "a.bin", b"1")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(keep + [".ck.abcdefgh.tmp", "a.bin"])


def test_a_live_writers_temporary_file_is_left_alone_and_its_write_completes(tmp_path):
    child, release = _start_writer(tmp_path / "report.json")
    (live,) = _temps(tmp_path)
    for i in range(3):  # writes to the same folder, and to the same file, while it writes
        artifacts.write_text(tmp_path / f"other-{i}.txt", "x\n")
    artifacts.write_text(tmp_path / "report.json", "from this process\n")
    assert _temps(tmp_path) == [live]
    release.set()
    child.join(60)
    assert child.exitcode == 0
    assert (tmp_path / "report.json").read_text() == "the whole file\n"
    assert _temps(tmp_path) == []


def test_a_write_nested_in_another_of_the_same_folder_keeps_the_outer_temporary_file(tmp_path):
    with artifacts.atomic_path(tmp_path / "outer.parquet") as outer:
        outer.write_bytes(b"outer")
        artifacts.write_text(tmp_path / "inner.json", "{}\n")
        assert outer.exists()
    assert (tmp_path / "outer.parquet").read_bytes() == b"outer"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inner.json", "outer.parquet"]


# ---------------------------------------------------------------------------------------------
# exclusive: one writer of an artifact set at a time; a killed holder's lock goes with it
# ---------------------------------------------------------------------------------------------

def _hold_exclusive(root: Path, ready, release) -> None:
    with artifacts.exclusive(root, "offline_eval"):
        ready.set()
        release.wait(60)
    os._exit(0)


def test_a_second_writer_waits_for_the_first_and_says_so(tmp_path):
    ready, release = MP.Event(), MP.Event()
    holder = MP.Process(target=_hold_exclusive, args=(tmp_path, ready, release))
    holder.start()
    assert ready.wait(60)
    said: list[str] = []

    def waiting(msg: str) -> None:  # told once the lock was found taken: only now may the first go
        said.append(msg)
        release.set()

    with artifacts.exclusive(tmp_path, "offline_eval", waiting):
        # certain, not timed: the first lets go only after release, which only a waiting second sets
        assert release.is_set(), "the second writer did not wait for the first"
    holder.join(60)
    assert len(said) == 1 and "another run of offline_eval" in said[0] and ".locks" in said[0]
    with artifacts.exclusive(tmp_path, "trajectories", said.append):  # another name: no wait, nothing said
        pass
    assert len(said) == 1


def test_a_killed_writers_lock_is_free_at_once(tmp_path):
    ready, release = MP.Event(), MP.Event()
    holder = MP.Process(target=_hold_exclusive, args=(tmp_path, ready, release))
    holder.start()
    assert ready.wait(60)
    os.kill(holder.pid, 9)
    holder.join(60)
    said: list[str] = []
    with artifacts.exclusive(tmp_path, "offline_eval", said.append):
        assert said == []  # taken at once, never waited for (certain, where a wall-time bound was not)
    assert sorted(p.name for p in (tmp_path / ".locks").iterdir()) == ["offline_eval.lock"]
