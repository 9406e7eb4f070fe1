"""One guard for every file the project did not write: SAGE's workspaces and journals (written by
an LLM), a bundle from another machine, a skills tree.

A file is read only when all of this holds, checked before it is opened for reading:

- its path, every link resolved, lies inside its ``root`` (a link *inside* the root to a file inside
  the root is fine; a link out, an absolute path elsewhere or ``../`` past the root is refused);
- it is a regular file: a FIFO, a device, a socket or a folder is refused without being opened
  (so a FIFO never hangs a reader and ``/dev/zero`` never fills memory);
- it is at most ``max_bytes`` long (checked on the open file too, and never read past the cap, so a
  file that grows while it is read is refused, not loaded).

A refusal is an :class:`Untrusted` error naming the file, the root, the reason (one of
:data:`REASONS`) and what to do, so a caller can count it by reason and go on. The file is opened
with ``O_NOFOLLOW | O_NONBLOCK`` and checked again with ``fstat`` (a regular file within the cap, the
very file that was checked: same device and inode), so a swap between the check and the open is
refused too. Standard library only: the router's import path stays light.
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
# what to do about each, said in every refusal
WHAT_TO_DO = {
    "outside_root": "only files inside the root are read: copy the file in if it is meant to be read",
    "link": "replace the link by the file itself (links out of the root, dangling or looping are never followed)",
    "not_regular": "replace it by a regular file (it is never opened, so a FIFO cannot hang the reader)",
    "too_large": "shrink the file, or raise the reader's size cap (its config says which) if the size is legitimate",
    "missing": "check the path",
    "unreadable": "check the path and its permissions",
}


class Untrusted(ValueError):
    """A file the project did not write was refused: ``path``, ``root``, ``reason`` (a key of
    :data:`REASONS`) and the message, which says what to do."""

    def __init__(self, path: str | os.PathLike[str], root: str | os.PathLike[str], reason: str, detail: str = ""):
        self.path, self.root, self.reason = str(path), str(root), reason
        msg = (f"{path}: refused ({reason}: {REASONS[reason]}{'; ' + detail if detail else ''}; root {root}): "
               f"{WHAT_TO_DO[reason]}")
        super().__init__(msg)


def kind_of(mode: int) -> str:
    """What a file of ``st_mode`` ``mode`` is, in words ("a FIFO", "a character device", ...)."""
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder"),
                       (stat.S_ISLNK, "a symbolic link"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def resolve_inside(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    """``path`` (relative to ``root``, or absolute) with every link resolved, required inside ``root``
    (itself resolved). Raises :class:`Untrusted` ``outside_root`` (an absolute path elsewhere, ``../``
    past the root), ``link`` (a link on the way points out of the root) or ``unreadable`` (a path
    the system cannot take: a NUL byte, too long). A dangling link inside the root resolves to where it
    points; :func:`check` refuses it."""
    try:
        base = Path(os.path.realpath(root))
        p = Path(path)
        given = p if p.is_absolute() else Path(root) / p
        real = Path(os.path.realpath(given))
    except (ValueError, OSError) as e:  # an embedded NUL byte; a name too long for the system
        raise Untrusted(repr(str(path)), root, "unreadable", f"not a usable path: {e}") from None
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


def _given(root: str | os.PathLike[str], path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    return p if p.is_absolute() else Path(root) / p


def check(root: str | os.PathLike[str], path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES
          ) -> tuple[Path, os.stat_result]:
    """The resolved path and its ``lstat``, when the file may be read (see the module doc); raises
    :class:`Untrusted` naming the reason. Nothing is opened."""
    real = resolve_inside(root, path)
    try:
        st = os.lstat(real)
    except FileNotFoundError:
        given = _given(root, path)
        links = [q for q in _chain(given) if os.path.islink(q)]
        if links:  # a dangling link (to a place inside the root that is not there)
            raise Untrusted(path, root, "link", f"a dangling link: {links[0]} points at {real}, which does not "
                            "exist") from None
        raise Untrusted(path, root, "missing") from None
    except OSError as e:
        raise Untrusted(path, root, "unreadable", e.strerror or str(e)) from None
    if stat.S_ISLNK(st.st_mode):  # realpath left a link: a loop
        raise Untrusted(path, root, "link", "a link loop")
    if not stat.S_ISREG(st.st_mode):
        raise Untrusted(path, root, "not_regular", f"it is {kind_of(st.st_mode)}")
    if st.st_size > max_bytes:
        raise Untrusted(path, root, "too_large", f"{st.st_size} bytes, the cap is {max_bytes}")
    return real, st


@contextlib.contextmanager
def open_binary(root: str | os.PathLike[str], path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES
                ) -> Iterator[io.BufferedReader]:
    """The file opened for reading after :func:`check`, with ``O_NOFOLLOW | O_NONBLOCK`` and checked
    again on the open descriptor (a regular file within the cap, the same device and inode :func:`check`
    saw). The caller reads at most ``max_bytes`` (:func:`read_bytes` does)."""
    real, before = check(root, path, max_bytes)
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        reason = "link" if e.errno == errno.ELOOP else "missing" if e.errno == errno.ENOENT else "unreadable"
        raise Untrusted(path, root, reason, e.strerror or "") from None
    try:
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    try:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise Untrusted(path, root, "not_regular", f"it is {kind_of(st.st_mode)} (swapped in after the check)")
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino):
            raise Untrusted(path, root, "link", "another file was swapped in after the check (a folder on the "
                            "way replaced by a link?)")
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
        try:
            data = fh.read(max_bytes + 1)
        except OSError as e:
            raise Untrusted(path, root, "unreadable", e.strerror or str(e)) from None
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
    link out of the root or a dangling one, a FIFO, a device, a socket, a folder that cannot be
    listed). Folders are walked, never yielded. Size is left to the reader's cap."""
    start = resolve_inside(root, folder)
    errors: list[OSError] = []
    for dirpath, dirnames, filenames in os.walk(start, onerror=errors.append, followlinks=False):
        while errors:
            e = errors.pop(0)
            yield Path(e.filename or dirpath), "unreadable"
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
                except Untrusted as e:
                    yield p, e.reason
                    continue
                try:
                    target = os.lstat(real)
                except OSError:  # dangling
                    yield p, "link"
                    continue
                yield (p, None) if stat.S_ISREG(target.st_mode) else (p, "link" if stat.S_ISLNK(target.st_mode)
                                                                      else "not_regular")
            elif stat.S_ISREG(st.st_mode):
                yield p, None
            else:
                yield p, "not_regular"
    for e in errors:  # the top folder itself could not be listed
        yield Path(e.filename or start), "unreadable"
