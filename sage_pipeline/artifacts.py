"""The artifact root and atomic writes.

Every artifact the pipeline writes lives under one root (``SAGE_DATA_DIR``, default
``./datasets``). Every write goes to a temporary file in the destination folder, is
fsynced and then ``os.replace``d, so a killed run never leaves a half-written artifact;
the temporary files a killed writer leaves are removed by the next write into the same
folder (:func:`atomic_path`). Whole folders (checkpoints) go through :func:`atomic_dir`,
which also stays correct when saves are killed or run concurrently and while readers load
the folder.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import functools
import hashlib
import io
import json
import os
import re
import secrets
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

DATA_DIR_ENV = "SAGE_DATA_DIR"
DEFAULT_DATA_DIR = "datasets"


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The artifact root: ``override`` if given, else ``$SAGE_DATA_DIR``, else ``./datasets``.

    ``SAGE_DATA_DIR`` set but empty (or blank) is refused: it would silently mean the current folder."""
    raw = override if override not in (None, "") else os.environ.get(DATA_DIR_ENV, DEFAULT_DATA_DIR)
    if not str(raw).strip():
        raise ValueError(f"{DATA_DIR_ENV} is set but empty ({DATA_DIR_ENV}={raw!r}): set it to the artifact "
                         f"folder, or unset it to use ./{DEFAULT_DATA_DIR}")
    return Path(raw).expanduser().resolve()


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def fsync_dir(path: Path) -> None:
    """fsync a folder, so a rename inside it survives a crash (a no-op where folders cannot be opened)."""
    with contextlib.suppress(OSError):  # some filesystems do not allow opening a dir
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# ---------------------------------------------------------------------------------------------
# A failed write names its path and its asset, in one place (_naming_write_errors): every atomic
# writer below re-raises an OSError of writing an artifact (a full disk, a read-only filesystem,
# a missing permission) as an ArtifactWriteError that says which file, for which asset, and what
# to do, instead of a bare "[Errno 28] No space left on device".
# ---------------------------------------------------------------------------------------------

_WRITER: contextvars.ContextVar[str | None] = contextvars.ContextVar("sage_artifact_writer", default=None)
_writer_resolver: Callable[[], str | None] | None = None
# errors only a write can cause: one met while an artifact is being written is that write's
_WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}
_HINTS = {
    errno.ENOSPC: "the filesystem holding it is full: free space there (or set SAGE_DATA_DIR to a folder on a "
                  "larger disk) and run the asset again",
    errno.EDQUOT: "the disk quota of this user is used up there: free space (or set SAGE_DATA_DIR to another "
                  "disk) and run the asset again",
    errno.EFBIG: "the file is larger than this filesystem allows: set SAGE_DATA_DIR to another filesystem",
    errno.EROFS: "the filesystem is read-only: set SAGE_DATA_DIR to a writable folder",
    errno.EACCES: "this user may not write there: fix the folder's permissions or set SAGE_DATA_DIR to a "
                  "writable folder",
    errno.EPERM: "this user may not write there: fix the folder's permissions or set SAGE_DATA_DIR to a "
                 "writable folder",
}


class ArtifactWriteError(OSError):
    """Writing an artifact failed: ``path`` (where readers find it), ``asset`` (the writer, None
    outside an asset) and the OSError that caused it (``__cause__``; ``errno`` is its errno).
    The artifact's previous version is untouched (every write is atomic)."""

    def __init__(self, cause: OSError, path: str | os.PathLike[str], asset: str | None,
                 staged: str | os.PathLike[str] | None = None) -> None:
        code = cause.errno
        if code is None and "No space left on device" in str(cause):  # pyarrow's, without an errno
            code = errno.ENOSPC
        super().__init__(code, cause.strerror or str(cause), str(path))
        self.cause, self.path, self.asset = cause, Path(path), asset
        self.staged = Path(staged) if staged is not None else None

    def moved(self, path: Path) -> ArtifactWriteError:
        """The same error named by the public path of a staged file (atomic_set)."""
        err = ArtifactWriteError(self.cause, path, self.asset, staged=self.path)
        err.__cause__ = self.cause
        return err

    def __str__(self) -> str:
        what = errno.errorcode.get(self.errno or 0, "no errno")
        where = f" (staged as {self.staged})" if self.staged is not None else ""
        who = f"asset {self.asset}" if self.asset else "no asset (written outside a Dagster run)"
        hint = _HINTS.get(self.errno or 0, "check the disk and the folder's permissions, then run the asset again")
        return (f"could not write {self.path}{where} for {who}: {self.cause.strerror or self.cause} ({what}). "
                f"{hint[0].upper()}{hint[1:]}; its previous version is unchanged.")


def current_writer() -> str | None:
    """The asset writing now: the innermost :func:`writer` (atomic_set names its own), else what
    the resolver the Dagster layer registered says (the running step's asset), else None."""
    name = _WRITER.get()
    if name is None and _writer_resolver is not None:
        with contextlib.suppress(Exception):
            name = _writer_resolver()
    return name


@contextlib.contextmanager
def writer(name: str) -> Iterator[None]:
    """Writes inside this block are the asset ``name``'s (named by a failed write)."""
    token = _WRITER.set(name)
    try:
        yield
    finally:
        _WRITER.reset(token)


def set_writer_resolver(resolver: Callable[[], str | None] | None) -> None:
    """Register how to find the asset writing when no :func:`writer` block says (the Dagster
    layer asks the running step's context; this module never imports dagster)."""
    global _writer_resolver
    _writer_resolver = resolver


def _within(name: Any, folders: Sequence[Path]) -> bool:
    if not isinstance(name, (str, bytes, os.PathLike)):
        return False
    path = os.path.abspath(os.fsdecode(name))
    return any(path == str(f) or path.startswith(str(f).rstrip(os.sep) + os.sep) for f in folders)


@contextlib.contextmanager
def _naming_write_errors(dest: Path, *writing: Path, always: bool = False) -> Iterator[None]:
    """The one place a failed artifact write is named: an OSError raised inside is re-raised as an
    :class:`ArtifactWriteError` naming ``dest`` and the asset when it is a write's (``always``,
    an errno only writes cause, or a file under ``writing``: the temporary file or folder being
    filled). Other OSErrors (an input that cannot be read) pass through unchanged."""
    try:
        yield
    except ArtifactWriteError:
        raise
    except OSError as e:
        folders = [Path(os.path.abspath(w)) for w in writing]
        if not (always or e.errno in _WRITE_ERRNOS or "No space left on device" in str(e)
                or _within(e.filename, folders) or _within(e.filename2, folders)):
            raise
        raise ArtifactWriteError(e, dest, current_writer()) from e


def naming_write_errors(dest: str | os.PathLike[str]) -> contextlib.AbstractContextManager[None]:
    """For a small file written in place (a lock's note): any OSError writing it is an
    :class:`ArtifactWriteError` naming ``dest`` and the asset."""
    return _naming_write_errors(Path(dest), always=True)


# what atomic_path names its temporary files: ``.<name>.XXXXXXXX.tmp`` (tempfile.mkstemp)
_TEMP_FILE = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def _sweep_temp_files(folder: Path) -> None:
    """Remove the temporary files of atomic_path writers that died (kill -9, power loss) in
    ``folder``; call under the folder's lock. A live writer holds an exclusive ``flock`` on
    its temporary file until it is done, so only files no process holds are removed."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if _TEMP_FILE.fullmatch(name) is None:
            continue
        path = folder / name
        try:
            if not stat.S_ISREG(path.lstat().st_mode):
                continue
        except OSError:
            continue
        if not folder_in_use(path):
            with contextlib.suppress(OSError):
                path.unlink()


def sweep_temp_files(folder: str | os.PathLike[str]) -> None:
    """Remove what killed :func:`atomic_path` writers left in ``folder`` (never a live writer's
    file): for callers about to move a folder's files elsewhere, where no later write into the
    folder would sweep them."""
    folder = Path(folder)
    with _folder_lock(folder):
        _sweep_temp_files(folder)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; on success it replaces ``dest`` atomically.

    The caller writes the temporary file completely (any writer that takes a path:
    pyarrow, matplotlib, ...). On an exception the temporary file is removed and ``dest``
    is left untouched. The writer keeps an exclusive ``flock`` on its temporary file while
    it writes; a killed writer's lock is gone, and the next atomic write into the same
    folder removes such orphaned temporary files (never a live writer's, in this process or
    another). Creating the file and sweeping happen under the folder's lock, so no sweep
    sees a new temporary file before its writer holds it.
    """
    dest = Path(dest)
    with _naming_write_errors(dest, always=True):
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _folder_lock(dest.parent) as private:
            if not private:  # a fresh atomic_dir folder of this process: nobody else wrote there
                _sweep_temp_files(dest.parent)
            fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
            with contextlib.suppress(OSError):  # a filesystem without flock: swept by age instead
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    tmp_path = Path(tmp)
    try:
        with _naming_write_errors(dest, tmp_path):
            yield tmp_path
        with _naming_write_errors(dest, always=True):
            with open(tmp_path, "rb+") as fh:
                os.fsync(fh.fileno())
            os.chmod(tmp_path, 0o666 & ~current_umask())
            os.replace(tmp_path, dest)
            fsync_dir(dest.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise
    finally:
        os.close(fd)  # releases the lock


@contextlib.contextmanager
def atomic_open(dest: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """``open`` for writing, atomically: the file appears complete or not at all."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports modes 'w' and 'wb', not {mode!r}")
    with atomic_path(dest) as tmp:
        kwargs = {"encoding": "utf-8", "newline": "\n"} if mode == "w" else {}
        with open(tmp, mode, **kwargs) as fh:
            yield fh


# ---------------------------------------------------------------------------------------------
# atomic_dir: whole folders, safe against kills and concurrent writers and readers
#
# Names beside ``dest`` (all hidden, all in dest's parent):
#   .<name>.tmp-XXXXXXXX  a save in progress (locked by its writer) or, after a kill, a leftover
#   .<name>.old-XXXXXXXX  the previous folder during a two-rename swap (fallback only)
#   .<name>.XXXXXXXX, .<name>.old   what earlier versions of atomic_dir left behind
# Writers of one parent take an exclusive ``flock`` on the parent folder itself for two short
# phases: sweep + create their temporary folder, and swap + delete the replaced contents. A
# writer keeps an exclusive ``flock`` on its own temporary folder until it is done, so a sweep
# (which runs under the parent's lock) can tell a live save from a killed one exactly.
# ---------------------------------------------------------------------------------------------

_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100
# a folder whose lock cannot be tested (flock unsupported there) counts as in use until this old
_UNLOCKABLE_STALE_S = 3600.0
_held: set[tuple[int, int]] = set()  # (st_dev, st_ino) of the temporary folders this process holds


@functools.cache
def _renameat2() -> Any:
    """libc's ``renameat2`` (Linux, glibc >= 2.28), or None."""
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` in one atomic step (``renameat2(RENAME_EXCHANGE)``).

    False when this OS, libc or filesystem cannot (then nothing was changed)."""
    import ctypes

    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def _key(fd: int) -> tuple[int, int]:
    st = os.fstat(fd)
    return st.st_dev, st.st_ino


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[bool]:
    """Exclusive ``flock`` on ``folder`` itself (no lock file is left beside the artifacts).

    Where a folder cannot be locked (a filesystem without ``flock``), writers go on unlocked,
    as before. A folder this process holds as an atomic_dir temporary (atomic_dir nested in
    another's body) is private to it and is not locked again. Yields whether it is private."""
    fd, private = None, False
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
        private = _key(fd) in _held
        if not private:
            fcntl.flock(fd, fcntl.LOCK_EX)  # waits; an OSError here means flock is unsupported
    try:
        yield private
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def hold_folder(folder: Path) -> int | None:
    """Mark a fresh temporary folder as in use: an exclusive ``flock`` held until closed."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    _held.add(_key(fd))
    return fd


def release_folder(fd: int | None) -> None:
    if fd is not None:
        _held.discard(_key(fd))
        os.close(fd)


def folder_in_use(path: Path) -> bool:
    """Whether a live writer still holds ``path``, an atomic_dir temporary folder or an
    atomic_path temporary file (its writer keeps it locked; a killed writer's lock is gone).
    Where the lock cannot be tested, recent ones count as in use."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return True  # gone already: nothing to do
    except OSError:
        fd = None
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return False
        except BlockingIOError:
            return True
        except OSError:
            pass
        finally:
            os.close(fd)
    try:
        return time.time() - path.lstat().st_mtime < _UNLOCKABLE_STALE_S
    except OSError:
        return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _sweep(dest: Path) -> None:
    """Remove what killed saves of ``dest`` left beside it; call under the parent's lock.

    If ``dest`` itself is missing (a save killed between the two renames of the fallback swap,
    or of atomic_dir before it swapped in one step), the newest moved-aside old folder, which is
    complete, is put back first."""
    leftover = re.compile(rf"\.{re.escape(dest.name)}\."
                          r"(?:(?P<old>old(?:-[a-z0-9_]{8})?)|(?:tmp-)?[a-z0-9_]{8})")
    try:
        names = os.listdir(dest.parent)
    except OSError:
        return
    temps, olds = [], []
    for name in names:
        if (m := leftover.fullmatch(name)) is not None:
            (olds if m["old"] else temps).append(dest.parent / name)
    olds = [p for p in olds if not folder_in_use(p)]
    if olds and not os.path.lexists(dest):
        newest = max(olds, key=lambda p: p.lstat().st_mtime_ns)
        try:
            os.rename(newest, dest)
            olds.remove(newest)
        except OSError:
            olds = []  # keep the old copies rather than lose the last complete one
    for p in olds + [p for p in temps if not folder_in_use(p)]:
        _remove(p)


def _fsync_tree(folder: Path) -> None:
    """fsync every file and folder under ``folder`` (callers may write plain files into it)."""
    for root, _dirs, files in os.walk(folder):
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                continue  # a link or special file: nothing of ours to flush
            try:
                os.fsync(fd)
            except OSError as e:  # data that did not reach the disk (full, I/O error): the write failed
                if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO):
                    raise
            finally:
                os.close(fd)
        fsync_dir(Path(root))


def _swap_in(tmp: Path, dest: Path) -> Path | None:
    """Put the folder ``tmp`` at ``dest``; call under the parent's lock. Returns where the
    replaced contents now are (to delete), or None when ``dest`` did not exist."""
    if not os.path.lexists(dest):
        os.rename(tmp, dest)
        return None
    if _exchange(tmp, dest):
        return tmp
    # fallback (no RENAME_EXCHANGE): two renames, with a moment where dest is missing
    old = dest.with_name(f".{dest.name}.old-{secrets.token_hex(4)}")
    os.rename(dest, old)
    try:
        os.rename(tmp, dest)
    except BaseException:
        os.rename(old, dest)
        raise
    return old


def read_at(dir_fd: int, name: str) -> bytes | None:
    """The bytes of the regular file ``name`` inside the open folder ``dir_fd`` (not through
    a path, which may name a newer copy of the folder by now: see :func:`atomic_dir`); None
    when it is missing, a folder or a symlink."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dir_fd)
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:  # a symlink where a file should be
            return None
        raise
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return None
        return fh.read()


def folder_replaced(path: Path, dir_fd: int) -> bool:
    """Whether ``path`` names another folder than the open ``dir_fd`` now (or none): an
    :func:`atomic_dir` save swapped a new copy in, so a reader should start again."""
    mine = os.fstat(dir_fd)
    try:
        now = os.stat(path)
    except OSError:
        return True
    return (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino)


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success it replaces ``dest`` atomically.

    Readers of ``dest`` see the old complete folder or the new complete one, never a mix and
    never no folder: on Linux the new folder is swapped in with one
    ``renameat2(RENAME_EXCHANGE)``, and the old contents, which then sit at the temporary
    name, are deleted. Where that call is unavailable (another OS, a filesystem such as NFS
    without it) the old folder is renamed aside first, so readers may find no folder for a
    moment; a save killed in that moment leaves the old folder aside, and the next save puts
    it back before anything else. A reader that needs several files of one version opens the
    folder once and the files relative to it (``dir_fd``, as ``rl.checkpoint.load_policy``
    does), and reads again if a file is gone and the path names another folder by then.

    Concurrent saves of one folder (threads or processes) all succeed and the last one wins:
    the swap runs under an exclusive ``flock`` on the parent folder. Every save first removes
    what killed saves of ``dest`` left beside it (temporary folders no live writer holds, old
    folders set aside). On an exception the temporary folder is removed and ``dest`` is left
    untouched.
    """
    dest = Path(dest)
    with _naming_write_errors(dest, always=True):
        dest.parent.mkdir(parents=True, exist_ok=True)
        with _folder_lock(dest.parent):
            _sweep(dest)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
            hold = hold_folder(tmp)
    try:
        with _naming_write_errors(dest, tmp):
            os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; an artifact folder is not
            yield tmp
        with _naming_write_errors(dest, always=True):
            _fsync_tree(tmp)
            with _folder_lock(dest.parent):
                replaced = _swap_in(tmp, dest)
                fsync_dir(dest.parent)
                if replaced is not None:
                    _remove(replaced)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        release_folder(hold)


LOCKS_DIR = ".locks"  # under the artifact root: one lock file per writer of several artifacts


@contextlib.contextmanager
def exclusive(root: str | os.PathLike[str], name: str, log: Any = None) -> Iterator[Path]:
    """One run at a time of the writer ``name``: an exclusive ``flock`` on
    ``<root>/.locks/<name>.lock``, held for the whole block.

    Each atomic write keeps its one file whole, but an asset that writes several files (or
    folders) would, run twice at once, leave some files of one run beside the others of the
    other run. Holding this for the whole asset makes the second run wait for the first, so
    the set is the last run's, whole. The lock goes with its holder: a run killed with -9 never
    blocks the next one. ``log`` (a callable) is told when a run has to wait. Where the
    filesystem has no ``flock``, runs go on unlocked."""
    folder = Path(root) / LOCKS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.lock"
    with open(path, "a") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if log is not None:
                log(f"another run of {name} is writing its artifacts (it holds {path}): waiting for it to finish")
            fcntl.flock(fh, fcntl.LOCK_EX)
        except OSError:
            pass
        yield path


# ---------------------------------------------------------------------------------------------
# atomic_set: an asset's several files and folders, switched together
#
#   <root>/.sets/<name>/<time>-XXXXXXXX.partial   a run's version being written (locked by its run)
#   <root>/.sets/<name>/<time>-XXXXXXXX           a complete version
#   <root>/.sets/<name>/current, previous         links to the version readers see, and the one before
#   <root>/<member>  ->  .sets/<name>/current/<member>   one link per member, made once
#
# Switching ``current`` (a new link renamed over it) changes every member at once: readers see
# the old set or the new one, never some files of each.
# ---------------------------------------------------------------------------------------------

SETS_DIR = ".sets"
_PARTIAL = ".partial"


class SetStage:
    """Where a run of an :func:`atomic_set` writes: ``path(member)`` in its fresh version, laid
    out like the artifact root; ``public(p)`` is where a staged path is read from after the switch."""

    def __init__(self, root: Path, stage: Path) -> None:
        self.root, self.dir = root, stage

    def path(self, *parts: str) -> Path:
        return self.dir.joinpath(*parts)

    def public(self, path: str | os.PathLike[str]) -> Path:
        return self.root / Path(path).relative_to(self.dir)


def _link_target(home: Path) -> Path | None:
    """The version folder ``home/current`` names, or None."""
    try:
        return home / os.readlink(home / "current")
    except OSError:
        return None


def _point(home: Path, link: str, version: Path) -> None:
    """Point ``home/link`` at ``version`` in one step (a fresh link renamed over it)."""
    tmp = home / f".{link}.{secrets.token_hex(4)}"
    os.symlink(version.name, tmp)
    os.replace(tmp, home / link)


def _copy_member(src: Path, dest: Path) -> None:
    """Copy a member file or folder into a version: hard links where possible (artifacts are
    replaced by rename, never changed in place), else a copy."""
    dest.parent.mkdir(parents=True, exist_ok=True)

    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    if src.is_dir():
        shutil.copytree(src, dest, copy_function=link, symlinks=False)
    else:
        link(str(src), str(dest))


def _is_link_of(root: Path, home: Path, member: str) -> bool:
    path = root / member
    try:
        return os.readlink(path) == os.path.relpath(home / "current" / member, path.parent)
    except OSError:
        return False


def _link_member(root: Path, home: Path, member: str) -> None:
    """Make ``root/member`` the link into ``home/current`` (a real file or folder there is
    swapped for it in one step; call after :func:`_adopt` has copied it into a version)."""
    if _is_link_of(root, home, member):
        return
    path = root / member
    target = os.path.relpath(home / "current" / member, path.parent)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.link-{secrets.token_hex(4)}")
    os.symlink(target, tmp)
    if path.is_dir() and not path.is_symlink():
        if _exchange(tmp, path):
            _remove(tmp)  # the real folder, now under the temporary name
        else:
            aside = path.with_name(f".{path.name}.old-{secrets.token_hex(4)}")
            os.rename(path, aside)
            os.rename(tmp, path)
            _remove(aside)
    else:
        os.replace(tmp, path)
    fsync_dir(path.parent)


def _adopt(root: Path, home: Path, members: tuple[str, ...]) -> None:
    """Under home's lock: where a member is a real file or folder (written before this layout,
    or by another writer since), rebuild the current version from those real paths and the
    current version's other members, then swap each real path for its link. What a reader
    finds at every path is the same before and after."""
    real = [m for m in members if os.path.lexists(root / m) and not _is_link_of(root, home, m)]
    if not real:
        return
    adopted = Path(tempfile.mkdtemp(prefix=f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-", dir=home))
    os.chmod(adopted, 0o777 & ~current_umask())
    current = _link_target(home)
    for m in members:
        src = root / m if m in real else (current / m if current is not None else None)
        if src is not None and src.exists():
            _copy_member(src, adopted / m)
    _fsync_tree(adopted)
    if current is not None:
        _point(home, "previous", current)
    _point(home, "current", adopted)
    fsync_dir(home)
    for m in real:
        _link_member(root, home, m)


def _sweep_set(home: Path) -> None:
    """Under home's lock: remove every version but ``current``, ``previous`` and those a live
    run holds, and links a killed switch left."""
    keep = set()
    for link in ("current", "previous"):
        with contextlib.suppress(OSError):
            keep.add(os.readlink(home / link))
    for entry in os.scandir(home):
        path = Path(entry.path)
        if entry.is_symlink():
            if entry.name.startswith("."):
                with contextlib.suppress(OSError):
                    path.unlink()
        elif entry.is_dir() and entry.name not in keep and not folder_in_use(path):
            _remove(path)


def _sweep_member_leftovers(root: Path, members: tuple[str, ...]) -> None:
    """Under home's lock: the links and moved-aside folders a run killed inside
    :func:`_link_member` left beside the members (each member is in a version by then)."""
    for m in members:
        path = root / m
        leftover = re.compile(rf"\.{re.escape(path.name)}\.(?:link|old)-[0-9a-f]{{8}}")
        with contextlib.suppress(OSError):
            for name in os.listdir(path.parent):
                if leftover.fullmatch(name):
                    _remove(path.parent / name)


@contextlib.contextmanager
def atomic_set(root: str | os.PathLike[str], name: str, members: Sequence[str],
               log: Any = None) -> Iterator[SetStage]:
    """Write the files and folders ``members`` (paths relative to ``root``) of one asset as one
    set: the run writes them into a fresh version (``stage.path(member)``, with any atomic
    writer), and on success all of them switch at once. Readers of ``root/<member>`` see the
    old set or the new one, never a mix, also after a ``kill -9`` at any moment; the next run
    removes what a killed run left.

    A member the run does not write keeps its current content (it is carried into the new
    version), as it would if the files were written one by one. Each member's path becomes a
    link into ``root/.sets/<name>/current/`` (a real file or folder there is adopted first).
    The version replaced is kept until the next switch, for readers still inside it.
    Concurrent runs each write their own version; the last switch wins, whole."""
    root, members = Path(root), tuple(dict.fromkeys(members))
    bad = [m for m in members if not m or Path(m).is_absolute() or ".." in Path(m).parts]
    if bad:
        raise ValueError(f"atomic_set {name!r}: members {bad} must be paths inside the artifact root")
    home = root / SETS_DIR / name
    token = _WRITER.set(_WRITER.get() or name)  # a failed write inside names this asset
    try:
        with _naming_write_errors(home, always=True):
            home.mkdir(parents=True, exist_ok=True)
            with _folder_lock(home):
                _sweep_set(home)
                _sweep_member_leftovers(root, members)
                stage = Path(tempfile.mkdtemp(prefix=f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}-",
                                              suffix=_PARTIAL, dir=home))
                hold = hold_folder(stage)
    except BaseException:
        _WRITER.reset(token)
        raise
    version, switched = None, False
    try:
        with _naming_staged_errors(root, stage):
            os.chmod(stage, 0o777 & ~current_umask())
            yield SetStage(root, stage)
        written = {str(p.relative_to(stage)) for p in stage.rglob("*")}
        stray = sorted(w for w in written if not any(w == m or w.startswith(m + "/") or m.startswith(w + "/")
                                                     for m in members))
        if stray:
            raise ValueError(f"atomic_set {name!r}: wrote {stray[:5]}, which are not among its members {list(members)}")
        with _naming_write_errors(home, always=True), _folder_lock(home):
            _adopt(root, home, members)
            current = _link_target(home)
            for m in members:  # what this run did not write keeps its content
                if not os.path.lexists(stage / m) and current is not None and os.path.lexists(current / m):
                    _copy_member(current / m, stage / m)
            _fsync_tree(stage)
            version = stage.with_name(stage.name.removesuffix(_PARTIAL))
            os.rename(stage, version)  # the same folder: this run's lock on it holds
            present = [m for m in members if os.path.lexists(version / m)]
            for m in present:  # before the switch they show the current version (or nothing)
                _link_member(root, home, m)
            if current is not None:
                _point(home, "previous", current)
            _point(home, "current", version)
            fsync_dir(home)
            switched = True
            for m in members:  # in no version: no link pointing nowhere
                if m not in present and (root / m).is_symlink():
                    (root / m).unlink()
            _sweep_set(home)
        if log is not None:
            log(f"{name}: switched {len(members)} artifacts to {version.relative_to(root)} in one step")
    except BaseException:
        if not switched:
            shutil.rmtree(stage, ignore_errors=True)
            if version is not None:
                shutil.rmtree(version, ignore_errors=True)
        raise
    finally:
        _WRITER.reset(token)
        release_folder(hold)


@contextlib.contextmanager
def exclusive_set(root: str | os.PathLike[str], name: str, members: Sequence[str],
                  log: Any = None) -> Iterator[SetStage]:
    """Write the writer ``name``'s files (``members``, relative to ``root``) as one set: one run at a
    time (:func:`exclusive`), switched together (:func:`atomic_set`), so a kill at any moment leaves
    one run's set whole. ``log`` (a callable) is told when a run waits or sweeps."""
    with exclusive(root, name, log), atomic_set(root, name, members, log) as stage:
        yield stage


@contextlib.contextmanager
def _naming_staged_errors(root: Path, stage: Path) -> Iterator[None]:
    """A failed write into an atomic_set's version, named by the path readers know it by
    (``root/<member>``, the staged path beside it)."""
    try:
        with _naming_write_errors(stage, stage):
            yield
    except ArtifactWriteError as e:
        if not _within(e.path, [stage.absolute()]):
            raise
        public = root / e.path.absolute().relative_to(stage.absolute()) if e.path != stage else root
        raise e.moved(public) from e.cause


def write_bytes(dest: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_open(dest, "wb") as fh:
        fh.write(data)
    return Path(dest)


def write_text(dest: str | os.PathLike[str], text: str) -> Path:
    with atomic_open(dest, "w") as fh:
        fh.write(text)
    return Path(dest)


def _model_fields(obj: Any) -> Any:
    """A config model met inside the object (a pydantic model, e.g. a RewardSpec kept whole by
    ``dataclasses.asdict``) as its fields; anything else is not JSON. Duck-typed: this module is
    on the router's import path, which does not import pydantic."""
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    raise TypeError(f"Object of type {type(obj).__name__} is not JSON serializable")


def write_json(dest: str | os.PathLike[str], obj: Any) -> Path:
    """Pretty JSON, atomically. NaN and infinities are refused (they are not JSON); a pydantic
    config model is written as its fields."""
    return write_text(dest, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False, default=_model_fields) + "\n")


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def png_bytes(fig: Any) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
