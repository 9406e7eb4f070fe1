"""The artifact root and atomic writes.

Every artifact the pipeline writes lives under one root (``SAGE_DATA_DIR``, default
``./datasets``). Every write goes to a temporary file in the destination folder, is
fsynced and then ``os.replace``d, so a killed run never leaves a half-written artifact.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

DATA_DIR_ENV = "SAGE_DATA_DIR"
DEFAULT_DATA_DIR = "datasets"


def data_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The artifact root: ``override`` if given, else ``$SAGE_DATA_DIR``, else ``./datasets``."""
    raw = override if override not in (None, "") else os.environ.get(DATA_DIR_ENV, DEFAULT_DATA_DIR)
    return Path(raw).expanduser().resolve()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):  # some filesystems do not allow opening a dir
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; on success it replaces ``dest`` atomically.

    The caller writes the temporary file completely (any writer that takes a path:
    pyarrow, matplotlib, ...). On an exception the temporary file is removed and ``dest``
    is left untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp_path, 0o666 & ~_umask())
        os.replace(tmp_path, dest)
        _fsync_dir(dest.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def atomic_open(dest: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """``open`` for writing, atomically: the file appears complete or not at all."""
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports modes 'w' and 'wb', not {mode!r}")
    with atomic_path(dest) as tmp:
        kwargs = {"encoding": "utf-8", "newline": "\n"} if mode == "w" else {}
        with open(tmp, mode, **kwargs) as fh:
            yield fh


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary sibling folder to fill; on success it replaces ``dest``.

    The old folder is renamed aside and then removed, so readers see the old complete
    folder or the new complete one (with a brief moment of none), never a mix. On an
    exception the temporary folder is removed and ``dest`` is left untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; an artifact folder is not
    try:
        yield tmp
        old = dest.with_name(f".{dest.name}.old")
        if dest.exists():
            os.replace(dest, old)
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def write_bytes(dest: str | os.PathLike[str], data: bytes) -> Path:
    with atomic_open(dest, "wb") as fh:
        fh.write(data)
    return Path(dest)


def write_text(dest: str | os.PathLike[str], text: str) -> Path:
    with atomic_open(dest, "w") as fh:
        fh.write(text)
    return Path(dest)


def write_json(dest: str | os.PathLike[str], obj: Any) -> Path:
    """Pretty JSON, atomically. NaN and infinities are refused (they are not JSON)."""
    return write_text(dest, json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n")


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def bytes_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def png_bytes(fig: Any) -> bytes:
    """Render a matplotlib figure to PNG bytes and close it."""
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()
