"""The SAGE week the project ships: days of SAGE's own ``sage run`` in the model world (journals and workspaces as
SAGE wrote them), ``make run``'s default data, read back verified.

The week is one archive, ``sage_week.tar.xz``, and its manifest, ``sage_week.json``, in this package's ``data/``
(written by ``scripts/make_sage_week.py``, ``make sage-week SAGE_SRC=...``; the manifest says with which SAGE,
the world's seed and settings, each day's runs and the world's exact truth). The archive's one top folder,
:data:`TOP`, holds:

* ``workspaces/day-NN/ws-W/``: each SAGE workspace of each day, every file as SAGE left it; SAGE's journals are
  its ``memory/sessions/*.log`` (nothing else under ``workspaces/`` is named like a journal, so the folder is a
  ``log_dirs`` entry of the ingest as it is);
* ``records/day-NN/runs.jsonl`` (the harness's record of each run: task, SAGE's session ids, the coder's model,
  the world's verdict), ``goals.jsonl`` (the goal ledger: the exact goal each ``sage run`` was given, by SAGE
  session id; SAGE logs no goal) and ``assignments.jsonl`` (each run's recorded coder draw), ``records/pins/`` the coder
  arms' models.yaml;
* ``checkpoint/`` the exploring checkpoint SAGE ran, ``deployments.jsonl`` its windows (paths relative to the
  week's root).

:func:`embedded_week` extracts it once under ``<data_dir>/sage_week/<the archive's sha256, 16 digits>/`` and
returns a :class:`Week`. The archive is treated as a file the project did not write (a checkout can be edited):
its sha256 must be the manifest's; it is read as a stream with ``tarfile``'s ``data`` filter, and only regular
files and folders under :data:`TOP` whose names the manifest lists are taken, each exactly the manifest's size
(so no link, device, ``../`` or absolute name, and nothing larger than the manifest says, is ever written);
every extracted file's sha256 is then checked; the folder is filled beside its place and renamed into it in one
step (a second extraction racing the first keeps the first). A later call finds the folder, checks every file's
sha256 again (a few hundred ms) and returns it. Every refusal is a :class:`WeekError` naming the file.

:func:`record_deployments` adds the week's deployment windows to an artifact root's record
(``sage.explore``), so the routing dataset reconstructs each logged decision's probability (:func:`record_windows`
does it for any days', e.g. a live day's).
"""

from __future__ import annotations

import json
import os
import shutil
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from sage_pipeline import artifacts
from sage_pipeline.sage import checkpoint as sage_router, explore as sage_explore

DATA_DIR = Path(__file__).resolve().parent / "data"
ARCHIVE_NAME = "sage_week.tar.xz"
MANIFEST_NAME = "sage_week.json"
FORMAT = 1
TOP = "sage_week"  # the archive's one top folder
WORKSPACES = "workspaces"
RECORDS = "records"
CHECKPOINT = "checkpoint"
DEPLOYMENTS = "deployments.jsonl"
GOALS_NAME = "goals.jsonl"  # records/day-NN/: the goal ledger (the goal each sage run was given, by session id)
EXTRACT_DIR = "sage_week"  # under the artifact root
SHA_DIGITS = 16
MAX_FILES = 100_000  # caps on what a manifest may ask for (the shipped week is far below them)
MAX_FILE_BYTES = 256 * 1024 * 1024
MAX_TOTAL_BYTES = 2 * 1024 * 1024 * 1024
_STAMP = ".verified"  # written last into the staged folder: the extraction is whole


class WeekError(ValueError):
    """The shipped week (its archive, its manifest or an extracted file) is not what its manifest says."""


@dataclass(frozen=True)
class Week:
    """A SAGE week on disk: ``root`` (the extracted folder), ``journals`` (the folder every journal lies under:
    each workspace's ``memory/sessions/*.log``; an ingest ``log_dirs`` entry as it is), ``workspaces`` (the
    folder of ``day-NN/ws-W`` workspaces), ``days`` (``day-01``...), ``manifest`` (the shipped manifest)."""

    root: Path
    journals: Path
    workspaces: Path
    days: tuple[str, ...]
    manifest: dict

    @property
    def workspace_dirs(self) -> list[Path]:
        """Every SAGE workspace of the week, day by day."""
        return sorted(p for p in self.workspaces.glob("day-*/ws-*") if p.is_dir())

    @property
    def sessions_dirs(self) -> list[Path]:
        """Every workspace's journal folder (``memory/sessions``)."""
        return [p / "memory" / "sessions" for p in self.workspace_dirs if (p / "memory" / "sessions").is_dir()]

    @property
    def goal_ledgers(self) -> list[Path]:
        """The goal ledgers, day by day (``records/day-NN/goals.jsonl``): the goal each run was given."""
        return [p for p in (self.records / d / GOALS_NAME for d in self.days) if p.is_file()]

    @property
    def records(self) -> Path:
        return self.root / RECORDS

    @property
    def checkpoint(self) -> Path:
        return self.root / CHECKPOINT

    def runs(self) -> list[dict]:
        """The harness's record of every run (``records/day-NN/runs.jsonl``), day by day."""
        out = []
        for day in self.days:
            path = self.records / day / "runs.jsonl"
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise WeekError(f"{path}:{n}: not JSON ({exc.msg}); re-extract the week") from exc
        return out


def load_manifest(data_dir: str | os.PathLike[str] = DATA_DIR) -> dict:
    """The shipped manifest, its fields checked (format, archive, sha256, files with sha256 and bytes, days)."""
    path = Path(data_dir) / MANIFEST_NAME
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise WeekError(f"{path} not found: the SAGE week is not shipped here; make it with "
                        "`make sage-week SAGE_SRC=<a SAGE checkout>`") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise WeekError(f"{path}: not a readable JSON manifest ({exc}); restore it from git") from exc

    def bad(field: str, what: str) -> WeekError:
        return WeekError(f"{path}: field {field!r}: {what}; restore the manifest from git or remake the week")

    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise bad("format", f"{m.get('format') if isinstance(m, dict) else m!r} is not {FORMAT}")
    if m.get("archive") != ARCHIVE_NAME or m.get("top") != TOP:
        raise bad("archive", f"names {m.get('archive')!r} (top {m.get('top')!r}), not {ARCHIVE_NAME} ({TOP})")
    if not _is_sha(m.get("archive_sha256")):
        raise bad("archive_sha256", "not 64 lowercase hex digits")
    files = m.get("files")
    if not isinstance(files, dict) or not files or len(files) > MAX_FILES:
        raise bad("files", f"must list between 1 and {MAX_FILES} files")
    total = 0
    for name, f in files.items():
        if not _safe_name(name):
            raise bad(f"files[{name!r}]", "not a plain relative path (no '..', no absolute, no empty part)")
        if not (isinstance(f, dict) and _is_sha(f.get("sha256")) and isinstance(f.get("bytes"), int)
                and not isinstance(f.get("bytes"), bool) and 0 <= f["bytes"] <= MAX_FILE_BYTES):
            raise bad(f"files[{name!r}]", f"needs sha256 (64 hex) and bytes (an integer in [0, {MAX_FILE_BYTES}])")
        total += f["bytes"]
    if total > MAX_TOTAL_BYTES:
        raise bad("files", f"{total} bytes in all, above the cap {MAX_TOTAL_BYTES}")
    days = m.get("days")
    if not (isinstance(days, list) and days and all(isinstance(d, str) and _safe_name(d) for d in days)):
        raise bad("days", "must list the days (day-01, ...)")
    return m


def embedded_week(data_dir: Path) -> Week:
    """The shipped SAGE week, extracted (once, verified) under ``<data_dir>/sage_week/<sha256 prefix>/``
    (``data_dir``: the artifact root). See the module doc."""
    manifest = load_manifest(DATA_DIR)
    archive = DATA_DIR / ARCHIVE_NAME
    if not archive.is_file():
        raise WeekError(f"{archive} not found: the SAGE week's archive is missing (git lfs? a partial checkout?); "
                        "restore it from git or make it with `make sage-week SAGE_SRC=<a SAGE checkout>`")
    sha = manifest["archive_sha256"]
    dest = Path(data_dir) / EXTRACT_DIR / sha[:SHA_DIGITS]
    if not (dest / _STAMP).is_file():
        got = artifacts.file_sha256(archive)
        if got != sha:
            raise WeekError(f"{archive}: sha256 {got} is not the manifest's {sha} ({DATA_DIR / MANIFEST_NAME}): the "
                            "archive was changed; restore both from git, or remake them with `make sage-week`")
        _extract(archive, manifest, dest)
    verify(dest, manifest)
    return _week(dest, manifest)


def verify(root: Path, manifest: dict) -> None:
    """Every file the manifest lists is in ``root`` as a regular file with its sha256, and nothing else is."""
    root = Path(root)
    files = manifest["files"]
    seen = set()
    for dirpath, dirs, names in os.walk(root):
        for d in dirs:
            if os.path.islink(os.path.join(dirpath, d)):
                raise WeekError(f"{os.path.join(dirpath, d)}: a link in the extracted week; remove {root} and "
                                "run again (it is extracted afresh)")
        for n in names:
            p = Path(dirpath) / n
            rel = p.relative_to(root).as_posix()
            if rel == _STAMP:
                continue
            if rel not in files:
                raise WeekError(f"{p}: not in the week's manifest ({MANIFEST_NAME}); remove {root} and run again")
            if p.is_symlink() or not p.is_file():
                raise WeekError(f"{p}: not a regular file; remove {root} and run again")
            got = artifacts.file_sha256(p)
            if got != files[rel]["sha256"]:
                raise WeekError(f"{p}: sha256 {got} is not the manifest's {files[rel]['sha256']}: the extracted "
                                f"file was changed; remove {root} and run again (it is extracted afresh)")
            seen.add(rel)
    missing = sorted(set(files) - seen)
    if missing:
        raise WeekError(f"{root}: {len(missing)} files of the manifest are missing (first: {missing[0]}); remove "
                        f"{root} and run again")


def _extract(archive: Path, manifest: dict, dest: Path) -> None:
    files = manifest["files"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        taken: set[str] = set()
        try:
            with tarfile.open(archive, mode="r|xz") as tar:
                for m in tar:
                    name = _member_name(archive, m.name)
                    if m.isdir():
                        continue  # folders are made for the files in them
                    if not m.isreg():
                        raise WeekError(f"{archive}: member {m.name!r} is not a regular file (a link, a device or "
                                        "a FIFO): refused; restore the archive from git")
                    if name not in files:
                        raise WeekError(f"{archive}: member {m.name!r} is not in the manifest: refused")
                    if name in taken:
                        raise WeekError(f"{archive}: member {m.name!r} appears twice: refused")
                    if m.size != files[name]["bytes"]:
                        raise WeekError(f"{archive}: member {m.name!r} is {m.size} bytes, the manifest says "
                                        f"{files[name]['bytes']}: refused")
                    tar.extract(m, stage, filter="data")
                    taken.add(name)
        except (tarfile.TarError, EOFError, OSError) as exc:
            if isinstance(exc, WeekError):
                raise
            raise WeekError(f"{archive}: not a readable tar.xz ({exc}); restore it from git") from exc
        top = stage / TOP
        if not top.is_dir():
            raise WeekError(f"{archive}: no {TOP}/ folder in it")
        verify(top, manifest)
        artifacts.write_text(top / _STAMP, manifest["archive_sha256"] + "\n")
        artifacts.fsync_dir(top)
        try:
            os.rename(top, dest)
        except OSError:
            if not (dest / _STAMP).is_file():  # not another extraction that won the race: a real failure
                raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _member_name(archive: Path, raw: str) -> str:
    p = PurePosixPath(raw)
    if p.is_absolute() or not p.parts or p.parts[0] != TOP or ".." in p.parts:
        raise WeekError(f"{archive}: member {raw!r} is not under {TOP}/ (or climbs out of it): refused")
    return PurePosixPath(*p.parts[1:]).as_posix() if len(p.parts) > 1 else ""


def _week(root: Path, manifest: dict) -> Week:
    return Week(root=root, journals=root / WORKSPACES, workspaces=root / WORKSPACES,
                days=tuple(manifest["days"]), manifest=manifest)


def _is_sha(v) -> bool:
    return isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)


def _safe_name(name) -> bool:
    if not isinstance(name, str) or not name or "\\" in name or "\x00" in name:
        return False
    p = PurePosixPath(name)
    return not p.is_absolute() and all(part not in ("", ".", "..") for part in name.split("/"))


def record_deployments(week: Week, data_root: str | os.PathLike[str]) -> list[sage_explore.Deployment]:
    """Add the week's deployment windows to ``data_root``'s record (:func:`record_windows`)."""
    return record_windows(week.root / DEPLOYMENTS, week.root, data_root)


def record_windows(src: Path, base: Path, data_root: str | os.PathLike[str]) -> list[sage_explore.Deployment]:
    """Add the deployment windows of ``src`` (one JSON object a line, as ``explore`` records them, each
    checkpoint's ``path`` relative to ``base`` and inside it) to ``<data_root>/checkpoints/sage_deployments.jsonl``,
    each checkpoint copied to ``checkpoints/sage_deployed/<sha256>/`` as ``explore.record_deployment`` does, each
    window once (one already there, same sha256 and start, is not added again). The record stays in time order
    (days of the past go before any later window) and is checked by ``explore.read_deployments`` before it is
    written; a window that overlaps one there is a :class:`WeekError`. Returns the whole record."""
    root, src, base = Path(data_root), Path(src), Path(base).resolve()
    lines = []
    for n, raw in enumerate(src.read_text(encoding="utf-8").splitlines(), 1):
        if raw.strip():
            try:
                lines.append((n, json.loads(raw)))
            except json.JSONDecodeError as exc:
                raise WeekError(f"{src}:{n}: not JSON ({exc.msg})") from exc
    path = sage_explore.deployments_path(root)
    with artifacts.exclusive(root, "sage_deployments"):
        have = sage_explore.read_deployments(path)
        known = {(d.sha256, d.deployed_from) for d in have}
        new = []
        for n, rec in lines:
            if not isinstance(rec, dict):
                raise WeekError(f"{src}:{n}: not a JSON object")
            if rec.get("sha256") is not None:
                ck = (base / str(rec.get("path", ""))).resolve()
                if not ck.is_relative_to(base) or not ck.is_file() or artifacts.file_sha256(ck) != rec["sha256"]:
                    raise WeekError(f"{src}:{n}: field 'path': {rec.get('path')!r} is not a checkpoint inside {base} "
                                    f"with sha256 {rec['sha256']}")
                home = root.joinpath(*sage_explore.DEPLOYED_DIR, rec["sha256"])
                if not (home / sage_router.JOBLIB_NAME).is_file():
                    with artifacts.atomic_dir(home) as tmp:
                        for name in (sage_router.JOBLIB_NAME, sage_router.MANIFEST_NAME):
                            shutil.copyfile(ck.parent / name, tmp / name)
                rec = {**rec, "path": str(home / sage_router.JOBLIB_NAME)}
            d = _one(rec, src, n)
            if (d.sha256, d.deployed_from) not in known:
                new.append(d)
                known.add((d.sha256, d.deployed_from))
        if not new:
            return have
        merged = sorted([*have, *new], key=lambda d: d.deployed_from)
        text = "".join(json.dumps(d.to_dict()) + "\n" for d in merged)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:  # checked as the record it will be, before writing
            check = Path(tmp) / path.name
            check.write_text(text, encoding="utf-8")
            try:
                sage_explore.read_deployments(check)
            except sage_explore.DeploymentRecordError as exc:
                raise WeekError(f"{path}: the windows of {src} do not fit the record: {exc}; move the record aside "
                                "to start a fresh one") from exc
        artifacts.write_text(path, text)
    return sage_explore.read_deployments(path)


def _one(rec: dict, src: Path, n: int) -> sage_explore.Deployment:
    with tempfile.TemporaryDirectory() as tmp:
        p = Path(tmp) / "line.jsonl"
        p.write_text(json.dumps(rec) + "\n", encoding="utf-8")
        try:
            return sage_explore.read_deployments(p)[0]
        except sage_explore.DeploymentRecordError as exc:
            raise WeekError(f"{src}:{n}: {exc}") from exc

