"""The guard for files the project did not write (sage_pipeline/untrusted.py): inside the root with links
resolved, regular files only (never opened otherwise: a FIFO cannot hang it), within a size cap (also while
read), every refusal naming the file, the root, the reason and what to do."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sage_pipeline import untrusted as ut
from sage_pipeline.untrusted import Untrusted
from sage_pipeline_tests.hang_guard import finishes


def _finishes(fn, timeout_s: float = 10.0):
    return finishes(fn, timeout_s)


@pytest.fixture
def tree(tmp_path) -> tuple[Path, Path]:
    """A root with one regular file, and a canary file outside it."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "ok.py").write_text("x = 1\n")
    (outside / "canary.txt").write_text("CANARY-SECRET\n")
    return root, outside


def _refused(root, path, reason, **kw) -> Untrusted:
    with pytest.raises(Untrusted) as info:
        _finishes(lambda: ut.read_bytes(root, path, **kw))
    e = info.value
    assert e.reason == reason, str(e)
    assert e.root == str(root) and str(path) in str(e) and reason in str(e)
    assert ut.WHAT_TO_DO[reason] in str(e)  # says what to do
    return e


def test_a_regular_file_inside_is_read_and_a_link_inside_to_a_file_inside_is_fine(tree):
    root, _ = tree
    assert ut.read_text(root, "ok.py") == "x = 1\n"
    (root / "sub").mkdir()
    (root / "sub" / "alias.py").symlink_to("../ok.py")
    (root / "dirlink").symlink_to("sub")
    assert ut.read_text(root, "sub/alias.py") == "x = 1\n" == ut.read_text(root, "dirlink/alias.py")
    assert ut.read_text(root, root / "ok.py") == "x = 1\n"  # an absolute path inside the root
    assert ut.is_safe_file(root, "ok.py") is None
    real, st = ut.check(root, "sub/alias.py")
    assert real == (root / "ok.py").resolve() and st.st_size == 6


def test_a_link_out_of_the_root_is_refused_for_a_file_and_for_a_folder(tree):
    root, outside = tree
    (root / "leak.py").symlink_to(outside / "canary.txt")
    e = _refused(root, "leak.py", "link")
    assert str(outside / "canary.txt") in str(e)  # says where it points
    (root / "tests").symlink_to(outside)
    _refused(root, "tests/canary.txt", "link")
    assert ut.is_safe_file(root, "tests/canary.txt") == "link"


def test_a_dangling_link_is_refused_as_a_link(tree):
    root, outside = tree
    (root / "gone.py").symlink_to(root / "never-written.py")
    e = _refused(root, "gone.py", "link")
    assert "dangling" in str(e)
    (root / "gone-out.py").symlink_to(outside / "never-written.py")
    _refused(root, "gone-out.py", "link")
    (root / "loop.py").symlink_to("loop.py")
    _refused(root, "loop.py", "link")


def test_a_fifo_is_refused_without_being_opened_so_nothing_hangs(tree):
    root, _ = tree
    os.mkfifo(root / "tests.py")
    e = _refused(root, "tests.py", "not_regular")
    assert "a FIFO" in str(e)
    assert ut.is_safe_file(root, "tests.py") == "not_regular"


def test_dev_zero_through_a_link_and_a_character_device_are_refused(tree):
    root, _ = tree
    (root / "zero.py").symlink_to("/dev/zero")
    _refused(root, "zero.py", "link")
    e = _refused("/dev", "zero", "not_regular")  # the device itself, inside its root
    assert "a character device" in str(e)


def test_a_file_over_the_cap_is_refused_unread(tree):
    root, _ = tree
    (root / "big.py").write_bytes(b"#" * 5000)
    e = _refused(root, "big.py", "too_large", max_bytes=4096)
    assert "5000 bytes, the cap is 4096" in str(e)
    assert len(ut.read_bytes(root, "big.py", max_bytes=5000)) == 5000  # at the cap: read


def test_parent_traversal_and_absolute_paths_elsewhere_are_refused(tree):
    root, outside = tree
    _refused(root, "../outside/canary.txt", "outside_root")
    _refused(root, "sub/../../outside/canary.txt", "outside_root")
    _refused(root, outside / "canary.txt", "outside_root")
    _refused(root, "/etc/passwd", "outside_root")
    with pytest.raises(Untrusted) as info:
        ut.resolve_inside(root, "bad\x00name.py")  # a NUL byte from a journal is refused, not a crash
    assert info.value.reason == "unreadable"


def test_a_missing_file_and_a_folder_are_refused_by_reason(tree):
    root, _ = tree
    _refused(root, "nope.py", "missing")
    (root / "pkg").mkdir()
    e = _refused(root, "pkg", "not_regular")
    assert "a folder" in str(e)


def test_a_file_that_grows_past_the_cap_while_read_is_refused_not_loaded(tree, monkeypatch):
    """The size is checked before the open and on the open file; a file that grows after both (another process
    appending) is never read past the cap: at most cap + 1 bytes are read, then it is refused."""
    root, _ = tree
    path = root / "growing.py"
    path.write_bytes(b"a" * 100)
    real_open = ut.open_binary

    import contextlib

    @contextlib.contextmanager
    def grows(*a, **k):
        with real_open(*a, **k) as fh:
            with open(path, "ab") as w:  # after the checks, before the read
                w.write(b"b" * 10_000)
            yield fh

    monkeypatch.setattr(ut, "open_binary", grows)
    e = _refused(root, "growing.py", "too_large", max_bytes=1000)
    assert "grew past the cap of 1000 bytes while read" in str(e)


def test_a_file_swapped_after_the_check_is_refused(tree, monkeypatch):
    root, outside = tree
    real_check = ut.check

    def check_then_swap(r, p, max_bytes=ut.DEFAULT_MAX_BYTES):
        got = real_check(r, p, max_bytes)
        (root / "ok.py").unlink()
        os.mkfifo(root / "ok.py")  # a FIFO where the checked file was
        return got

    monkeypatch.setattr(ut, "check", check_then_swap)
    e = _refused(root, "ok.py", "not_regular")
    assert "swapped in after the check" in str(e)


def test_walk_files_lists_what_a_reader_must_not_use_with_the_reason(tree):
    root, outside = tree
    (root / "sub").mkdir()
    (root / "sub" / "alias.py").symlink_to("../ok.py")
    (root / "sub" / "leak.py").symlink_to(outside / "canary.txt")
    (root / "sub" / "gone.py").symlink_to(root / "nothing")
    os.mkfifo(root / "sub" / "pipe.py")
    (root / "out").symlink_to(outside)
    got = {str(p.relative_to(root.resolve())): why for p, why in _finishes(lambda: list(ut.walk_files(root)))}
    assert got == {"ok.py": None, "sub/alias.py": None, "sub/leak.py": "link", "sub/gone.py": "link",
                   "sub/pipe.py": "not_regular", "out": "link"}
