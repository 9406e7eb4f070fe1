"""One guard for every file the project did not write: SAGE's workspaces and journals (written by
an LLM), a bundle from another machine, a skills tree.

A file is read only when all of this holds, checked before it is opened for reading:

- its path, every link resolved, lies inside its ``root`` (a link *inside* the root to a file inside
  the root is fine; a link out, an absolute path elsewhere or ``../`` past the root is refused);
- it is a regular file: a FIFO, a device, a socket or a folder is refused without being opened
  (so a FIFO never hangs a reader and ``/dev/zero`` never fills memory);
- it is at most ``max_bytes`` long (checked on the open file too, and never read past the cap, so a
  file that grows while it is read is refused, not loaded).

A refusal is an :class:`Untrusted` error naming the file, the root and the reason (one of
:data:`REASONS`), so a caller can count it by reason and go on. The file is opened with
``O_NOFOLLOW | O_NONBLOCK`` and checked again with ``fstat``, so a swap between the check and the
open is refused too. Standard library only: the router's import path stays light.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import stat
from collections.abc import Iterator
from pathlib import Path

# the default cap for one file the project did not write (a test file, a code artifact, a manifest);
# callers with bigger legitimate files (journals) pass their own, stated in their config
DEFAULT_MAX_BYTES = 8 * 1024 * 1024

REASONS = {
    "outside_root": "the path, links resolved, is outside its root",
    "link": "a symbolic link where a file was expected, pointing out of the root or nowhere",
    "not_regular": "not a regular file (a FIFO, a device, a socket or a folder)",
    "too_large": "larger than the size cap",
    "missing": "no such file",
    "unreadable": "could not be read",
}


class Untrusted(ValueError):
    """A file the project did not write was refused: ``path``, ``root``, ``reason`` (a key of
    :data:`REASONS`) and the message, which says what to do."""

    def __init__(self, path: str | os.PathLike[str], root: str | os.PathLike[str], reason: str, detail: str = ""):
        self.path, self.root, self.reason = str(path), str(root), reason
        msg = f"{path}: refused ({reason}: {REASONS[reason]}{'; ' + detail if detail else ''}; root {root})"
        super().__init__(msg)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "not a regular file"


def resolve_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path`` (relative to ``root``, or absolute) with every link resolved, required inside ``root``
    (itself resolved). Raises :class:`Untrusted` ``outside_root`` or ``link`` (a dangling link)."""
    base = Path(os.path.realpath(root))
    p = Path(path)
    given = p if p.is_absolute() else Path(root) / p
    real = Path(os.path.realpath(given))
    try:
        inside = os.path.commonpath([str(base), str(real)]) == str(base)
    except ValueError:  # different drives / mixed absolute and relative
        inside = False
    if not inside:
        link = any(os.path.islink(q) for q in _chain(given))
        raise Untrusted(given, root, "link" if link else "outside_root",
                        f"it resolves to {real}" if str(real) != str(given) else "")
    return real


def _chain(p: Path) -> Iterator[Path]:
    yield p
    yield from p.parents


def check(root: str | os.PathLike[str], path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES
          ) -> tuple[Path, os.stat_result]:
    """The resolved path and its ``lstat``, when the file may be read (see the module doc); raises
    :class:`Untrusted` naming the reason. Nothing is opened."""
    real = resolve_inside(root, path)
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        raise Untrusted(path, root, "missing") from None
    except OSError as e:
        raise Untrusted(path, root, "unreadable", e.strerror or str(e)) from None
    if stat.S_ISLNK(st.st_mode):  # realpath left a link: a loop
        raise Untrusted(path, root, "link", "a link loop")
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted(path, root, "not_regular", f"it is {_kind(st.st_mode)}")
    if st.st_size > max_bytes:
        raise Untrusted(path, root, "too_large", f"{st.st_size} bytes, the cap is {max_bytes}")
    return real, st


@contextlib.contextmanager
def open_binary(root: str | os.PathLike[str], path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES
                ) -> Iterator[io.BufferedReader]:
    """The file opened for reading after :func:`check`, with ``O_NOFOLLOW | O_NONBLOCK`` and checked
    again on the open descriptor (a regular file within the cap). The caller reads at most
    ``max_bytes`` (:func:`read_bytes` does)."""
    real, _ = check(root, path, max_bytes)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        reason = "link" if e.errno == errno.ELOOP else "missing" if e.errno == errno.ENOENT else "unreadable"
        raise Untrusted(path, root, reason, e.strerror or "") from None
    fh = os.fdopen(fd, "rb")
    try:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(path, root, "not_regular", f"it is {_kind(st.st_mode)} (swapped in after the check)")
        if st.st_size > max_bytes:
            raise Untrusted(path, root, "too_large", f"{st.st_size} bytes, the cap is {max_bytes}")
        os.set_blocking(fh.fileno(), True)
        yield fh
    finally:
        fh.close()


def read_bytes(root: str | os.PathLike[str], path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> bytes:
    """The bytes of a file the project did not write (see the module doc); never more than
    ``max_bytes`` are read: a file that grew past the cap while open is refused ``too_large``."""
    with open_binary(root, path, max_bytes) as fh:
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise Untrusted(path, root, "too_large", f"it grew past the cap of {max_bytes} bytes while read")
    return data


def read_text(root: str | os.PathLike[str], path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES,
              encoding: str = "utf-8", errors: str = "strict") -> str:
    """:func:`read_bytes`, decoded. A decoding error (``errors="strict"``) is a ``UnicodeDecodeError``
    the caller names as it does any other bad content."""
    return read_bytes(root, path, max_bytes).decode(encoding, errors)


def is_safe_file(root: str | os.PathLike[str], path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES
                 ) -> str | None:
    """None when :func:`check` passes, else the reason (a key of :data:`REASONS`)."""
    try:
        check(root, path, max_bytes)
    except Untrusted as e:
        return e.reason
    return None


def walk_files(root: str | os.PathLike[str], folder: str | os.PathLike[str] = ".") -> Iterator[tuple[Path, str | None]]:
    """Every entry under ``folder`` (inside ``root``), without following links into folders: each as
    (path, None) for a candidate regular file, or (path, reason) for what a reader must not use (a
    link out of the root, a FIFO, a device, a socket). Folders are walked, never yielded. Size is
    left to the reader's cap."""
    start = resolve_inside(root, folder)
    for dirpath, dirnames, filenames in os.walk(start, followlinks=False):
        for name in sorted(dirnames):
            p = Path(dirpath) / name
            if os.path.islink(p):  # a link to a folder is not walked; say where it points
                try:
                    resolve_inside(root, p)
                    yield p, "link"
                except Untrusted as e:
                    yield p, e.reason
        dirnames[:] = sorted(d for d in dirnames if not os.path.islink(Path(dirpath) / d))
        for name in sorted(filenames):
            p = Path(dirpath) / name
            try:
                st = os.lstat(p)
            except OSError:
                yield p, "missing"
                continue
            if stat.S_ISLNK(st.st_mode):
                try:
                    real = resolve_inside(root, p)
                    yield (p, None) if os.path.isfile(real) and stat.S_ISREG(os.stat(real).st_mode) else (p, "not_regular")
                except Untrusted as e:
                    yield p, e.reason
            elif stat.S_ISREG(st.st_mode):
                yield p, None
            else:
                yield p, "not_regular"
