"""The skill store: live files, content-hashed versions, atomic replacement and restore.

Per skill, under ``<artifact root>/sleep/<skill>/``::

    SKILL.md, MEMORY.md          the live documents (or the paths you configured)
    versions/index.jsonl         history: one line per event (initial, external, block_created,
                                 accepted, rollback), oldest first
    versions/<id>/               SKILL.md, MEMORY.md, version.json of one version
    store.json                   where the live documents are (so a rollback finds them)
    pending.json                 only while the live documents are being replaced (see below)

A version's id is the first 12 hex digits of the SHA-256 of its two documents, so the
same content is the same version. The live files are replaced atomically (temporary
file, fsync, rename), under a lock, and only if they still hold what the night started
from: a live file edited meanwhile is left alone (:class:`LiveChanged`). The whole index
is checked (every line a UTF-8 JSON object with the fields and types of a :class:`Version`)
before anything is written, so a damaged index stops a commit or a rollback with an error
naming the line and the field, and the live files stay as they were. The two live files
are replaced one after the other, so the switch is written to ``pending.json`` first; a run
killed between the two leaves it, and the next night (or commit, or rollback) finishes the
switch to the stored version before reading anything (:meth:`SkillStore.recover`), unless the
files were edited by hand since.

Lost files are recovered, never replaced by a new history (:meth:`SkillStore.recover_lost`): an
``index.jsonl`` deleted (or emptied) while version folders remain is rebuilt from their
``version.json`` files (action ``recovered``), and a live document deleted while the history
has versions is restored from the last recorded version; the night's notes (report and
diagnostics) say which. A path that has the wrong kind (``SKILL.md`` a folder) is a
:class:`StoreError` naming it and what to do, not a traceback.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import MISSING, asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path

import filelock

from sage_pipeline import artifacts
from sage_pipeline.sleep.block import BEGIN_LINE, END_LINE

PACKAGED_SKILLS = Path(__file__).with_name("data") / "skills"
SKILL_FILE, MEMORY_FILE = "SKILL.md", "MEMORY.md"
PENDING_FILE = "pending.json"  # a switch of the live documents in progress, or cut short by a kill
ACTIONS = ("initial", "external", "block_created", "accepted", "rollback", "recovered")
# recovered: an entry of an index rebuilt from the version folders (the original action is not known)


class StoreError(ValueError):
    """The store cannot do what was asked (missing file, unknown version): says what to do."""


class LiveChanged(RuntimeError):
    """A live document changed since the night read it; nothing was written."""


class NightLocked(TimeoutError):
    """Another night of the same skill holds the lock past the timeout."""


def _holder(lock_file: Path) -> str:
    """Who holds a night lock, as its lock file says."""
    try:
        return lock_file.read_text(encoding="utf-8", errors="replace").strip() or "another process"
    except OSError:
        return "another process"


def version_id(skill: bytes, memory: bytes) -> str:
    h = hashlib.sha256()
    for part in (b"skill", skill, b"memory", memory):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:12]


@dataclass(frozen=True)
class Snapshot:
    """The live documents' bytes as read at one moment."""

    skill: bytes
    memory: bytes

    @property
    def id(self) -> str:
        return version_id(self.skill, self.memory)

    def sha256(self) -> dict[str, str]:
        return {"skill": hashlib.sha256(self.skill).hexdigest(), "memory": hashlib.sha256(self.memory).hexdigest()}


@dataclass(frozen=True)
class Version:
    seq: int
    version: str
    action: str
    created_at: str
    night: str = ""
    parent: str = ""
    note: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


_VERSION_TYPES = {"seq": int, "version": str, "action": str, "created_at": str, "night": str, "parent": str,
                  "note": str}  # the JSON type of each field of an index entry


def _entry_problem(d) -> str:
    """What is wrong with one decoded index line (which field, and how), or "" if it is a valid Version."""
    if not isinstance(d, dict):
        return f"an entry must be a JSON object, got {json.dumps(d)[:60]}"
    missing = [f.name for f in fields(Version) if f.name not in d and f.default is MISSING]
    unknown = [k for k in d if k not in _VERSION_TYPES]
    if missing or unknown:
        what = "missing" if missing else "unknown to a version entry"
        return f"field {(missing or unknown)[0]!r} is {what}"
    for name, value in d.items():
        if not isinstance(value, _VERSION_TYPES[name]) or isinstance(value, bool):
            want = "an integer" if _VERSION_TYPES[name] is int else "a string"
            return f"field {name!r} is {json.dumps(value)[:60]}, expected {want}"
    if d["seq"] < 1:
        return f"field 'seq' is {d['seq']}, expected 1 or more"
    if d["action"] not in ACTIONS:
        return f"field 'action' is {d['action']!r}, expected one of {', '.join(ACTIONS)}"
    if len(d["version"]) != 12 or any(c not in "0123456789abcdef" for c in d["version"]):
        return f"field 'version' is {d['version']!r}, expected a version id (12 hex digits)"
    return ""


def _index_entry(raw: bytes) -> Version:
    """One line of ``index.jsonl`` as a Version; ValueError saying what is wrong (the caller adds where)."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ValueError(f"not UTF-8 (byte {raw[e.start:e.start + 1]!r} at column {e.start + 1})") from e
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e})") from e
    problem = _entry_problem(d)
    if problem:
        raise ValueError(problem)
    return Version(**d)


_READ_ATTEMPTS = 10  # each retry means the version folder was swapped or missing while it was read


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def default_document(skill: str, which: str) -> str:
    """The packaged default (``data/skills/<skill>.md`` / ``<skill>.memory.md``), else a minimal one."""
    name = f"{skill}.md" if which == "skill" else f"{skill}.memory.md"
    packaged = PACKAGED_SKILLS / name
    if packaged.is_file():
        return packaged.read_text(encoding="utf-8")
    title = f"# Skill: {skill}" if which == "skill" else f"# Memory: {skill}"
    return f"{title}\n\n{BEGIN_LINE}\n{END_LINE}\n"


class SkillStore:
    def __init__(self, sleep_root: str | Path, skill: str, skill_path: str | Path | None = None,
                 memory_path: str | Path | None = None) -> None:
        if not skill or not all(c.isalnum() or c in "-_" for c in skill):
            raise StoreError(f"skill name {skill!r}: use letters, digits, '-' and '_' only (it names a folder)")
        self.skill = skill
        self.root = Path(sleep_root) / skill
        self.versions_dir = self.root / "versions"
        self.index = self.versions_dir / "index.jsonl"
        recorded = self._recorded()
        given = {k: str(Path(v).expanduser().absolute()) for k, v in (("skill_path", skill_path),
                                                                      ("memory_path", memory_path)) if v}
        paths = {**recorded, **given}
        self.configured = {"skill": "skill_path" in paths, "memory": "memory_path" in paths}
        self.skill_path = Path(paths.get("skill_path") or self.root / SKILL_FILE)
        self.memory_path = Path(paths.get("memory_path") or self.root / MEMORY_FILE)
        if paths != recorded:
            artifacts.write_json(self.root / "store.json", paths)

    def _recorded(self) -> dict:
        p = self.root / "store.json"
        if not p.is_file():
            return {}
        try:
            d = json.loads(p.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise StoreError(f"{p}: not valid JSON ({e}); delete it to fall back to the default live paths") from e
        return {k: v for k, v in d.items() if k in ("skill_path", "memory_path") and isinstance(v, str)}

    def paths(self) -> dict[str, Path]:
        return {"skill": self.skill_path, "memory": self.memory_path}

    # live files ---------------------------------------------------------------------------
    def check_kinds(self) -> None:
        """A StoreError naming the path and what to do where a path of the store has the wrong kind
        (a live document that is a folder, the versions folder or its index the other way round)."""
        for which, path in self.paths().items():
            if path.exists() and not path.is_file():
                raise StoreError(f"{path}: the live {which} document is a folder (or another non-file), not a "
                                 f"file: move it away (or delete it if it is empty), then run the night again; the "
                                 f"last recorded version is restored into it (versions under {self.versions_dir})")
        if self.versions_dir.exists() and not self.versions_dir.is_dir():
            raise StoreError(f"{self.versions_dir}: is a file where the folder of the skill's versions belongs: "
                             "move it away, then run the night again")
        if self.index.exists() and not self.index.is_file():
            raise StoreError(f"{self.index}: is a folder where the version history (a file) belongs: move it away, "
                             "then run the night again (the history is rebuilt from the version folders)")

    def ensure_live(self) -> list[str]:
        """Finish a switch of the live documents a killed run left half done (:meth:`recover`),
        recover a lost index or live document (:meth:`recover_lost`), then create missing live
        documents from the packaged defaults; a configured path must exist."""
        self.check_kinds()
        notes = [n for n in [self.recover()] if n]
        notes += self.recover_lost()
        for which, path in self.paths().items():
            if path.is_file():
                continue
            if self.configured[which]:
                raise StoreError(f"{path}: the configured {which} document does not exist; create it, or clear "
                                 f"the {which}_path setting to use "
                                 f"{self.root / (SKILL_FILE if which == 'skill' else MEMORY_FILE)}")
            artifacts.write_text(path, default_document(self.skill, which))
            notes.append(f"created {path} from the packaged default")
        return notes

    def read(self) -> Snapshot:
        return Snapshot(self.skill_path.read_bytes(), self.memory_path.read_bytes())

    def recover_lost(self) -> list[str]:
        """Rebuild a lost index from the version folders, then restore a lost live document from
        the last recorded version; a note per thing recovered (none when nothing was lost)."""
        with self.lock():
            notes = self._rebuild_index()
            entries = self.versions()
            if not entries:
                return notes
            last = entries[-1]
            missing = [w for w, p in self.paths().items()  # a configured path stays the user's to fix
                       if not self.configured[w] and not p.exists() and not p.is_symlink()]
            if missing:
                snap = self.read_version(last.version)
                for which in missing:
                    artifacts.write_bytes(self.paths()[which], getattr(snap, which))
                    notes.append(f"{self.paths()[which]} was missing: restored from the last recorded version "
                                 f"{last.version} (v{last.seq}, {last.action}), not from the packaged default")
            return notes

    def _rebuild_index(self) -> list[str]:
        """An index rebuilt from ``versions/<id>/version.json`` when it is missing or empty while
        version folders remain (oldest first; each folder's content checked against its id)."""
        if self.versions() or not self.versions_dir.is_dir():
            return []
        found, bad = [], []
        for d in sorted(p for p in self.versions_dir.iterdir() if p.is_dir() and len(p.name) == 12):
            try:
                self.read_version(d.name)
                meta = json.loads((d / "version.json").read_text(encoding="utf-8"))
                created, night = str(meta.get("created_at", "")), str(meta.get("night", ""))
            except (StoreError, OSError, ValueError, AttributeError) as e:
                bad.append(f"{d.name} ({str(e)[:120]})")
                continue
            found.append((created, night, d.name))
        if not found:
            return [f"{self.index} is missing and no usable version folder is left under {self.versions_dir}: "
                    f"a new history starts ({len(bad)} unusable folder(s){': ' + '; '.join(bad) if bad else ''})"]
        live = None
        with contextlib.suppress(OSError):
            live = self.read().id
        found.sort(key=lambda f: (f[0], f[2] == live, f[2]))  # ties in time: the live content last
        lines, parent = [], ""
        for seq, (created, night, vid) in enumerate(found, start=1):
            v = Version(seq=seq, version=vid, action="recovered", created_at=created or _now(), night=night,
                        parent=parent, note="index rebuilt from the version folders: the original action is not known")
            lines.append(json.dumps(v.to_dict()))
            parent = vid
        artifacts.write_text(self.index, "\n".join(lines) + "\n")
        skipped = f"; skipped {len(bad)} unusable folder(s): {'; '.join(bad)}" if bad else ""
        return [f"{self.index} was missing or empty while {len(found)} version folder(s) remained: rebuilt from "
                f"their version.json, oldest first (created_at), action 'recovered'{skipped}"]

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """Short exclusive lock for reading-comparing-writing the live files and the index."""
        self.root.mkdir(parents=True, exist_ok=True)
        with filelock.FileLock(self.root / ".store.lock"):
            yield

    @contextlib.contextmanager
    def night_lock(self, timeout_s: float = 3600.0, log: Callable[[str], None] | None = None,
                   night: str = "") -> Iterator[None]:
        """Held for a whole night: two nights of one skill never run at once (the second waits up
        to ``timeout_s``, then raises :class:`NightLocked`). It is a ``flock`` (filelock), which
        the kernel drops when its holder dies, so a killed night never leaves it held. While held,
        the lock file says whose it is; it is emptied on release (a killed night's text stays,
        but nothing holds the lock)."""
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / ".night.lock"
        lock = filelock.FileLock(path)
        try:
            lock.acquire(timeout=0)
        except filelock.Timeout:
            if log is not None:
                log(f"waiting for the running night of {self.skill!r} ({_holder(path)}) to finish")
            try:
                lock.acquire(timeout=max(timeout_s, 0.0), poll_interval=0.2)
            except filelock.Timeout:
                raise NightLocked(f"{path}: another night of skill {self.skill!r} ({_holder(path)}) still runs "
                                  f"after {timeout_s:g} s; nights never overlap, try again later") from None
        try:
            with artifacts.naming_write_errors(path):  # a full disk names the path and the asset
                path.write_text(f"night {night or '?'}, pid {os.getpid()}, since {_now()}\n")
            yield
        finally:
            with contextlib.suppress(OSError):  # emptying the note is a courtesy; the flock is what counts
                path.write_text("")
            lock.release()

    # versions -------------------------------------------------------------------------------
    def versions(self) -> list[Version]:
        """The whole index, every line checked (UTF-8 JSON object, the fields of a Version and their
        types) before anyone acts on it: a bad line is a StoreError naming the file, line and field."""
        if not self.index.is_file():
            return []
        out = []
        for lineno, raw in enumerate(self.index.read_bytes().splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                out.append(_index_entry(raw))
            except ValueError as e:
                raise StoreError(f"{self.index}:{lineno}: malformed version entry: {e}. Nothing was changed: "
                                 f"the live documents and the version folders under {self.versions_dir} are "
                                 "intact; fix or remove the line, then run the command again") from e
        return out

    def find(self, ref: str) -> str:
        """A stored version id from its id, a unique prefix (>= 4 characters) or ``v<seq>``."""
        ref = ref.strip()
        entries = self.versions()
        if ref[:1] in "vV" and ref[1:].isdigit():
            hit = [v.version for v in entries if v.seq == int(ref[1:])]
            if hit:
                return hit[0]
        ids = sorted({v.version for v in entries})
        hits = [i for i in ids if i.startswith(ref.lower())] if len(ref) >= 4 else []
        if len(hits) == 1 and (self.versions_dir / hits[0]).is_dir():
            return hits[0]
        known = ", ".join(f"v{v.seq}={v.version}" for v in entries[-8:]) or "none yet"
        why = "matches several versions" if len(hits) > 1 else "is not a stored version"
        raise StoreError(f"version {ref!r} of skill {self.skill!r} {why} (latest: {known}); list them with "
                         f"`python -m sage_pipeline.sleep versions --skill {self.skill}`")

    def read_version(self, vid: str) -> Snapshot:
        """Both documents of one stored version, from the same folder.

        The folder is opened once and both files are read relative to it (``dir_fd``), so a
        save that swaps in another copy of the folder meanwhile (artifacts.atomic_dir) never
        gives a document of one copy with the other of the next. If a file is gone because the
        copy being read was replaced and removed, or the folder is missing for the moment a
        save without RENAME_EXCHANGE needs, the read starts again on the folder now there."""
        d = self.versions_dir / vid
        problem, swapped = "", False
        for attempt in range(_READ_ATTEMPTS):
            if attempt:
                time.sleep(0.001 * attempt)
            try:
                dir_fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
            except (FileNotFoundError, NotADirectoryError):
                problem = (f"{d}: no such version folder; list the stored versions with "
                           f"`python -m sage_pipeline.sleep versions --skill {self.skill}`")
                continue
            try:
                parts = [artifacts.read_at(dir_fd, name) for name in (SKILL_FILE, MEMORY_FILE)]
                if None in parts:
                    missing = [n for n, b in zip((SKILL_FILE, MEMORY_FILE), parts, strict=True) if b is None]
                    problem = f"{d}: version folder incomplete ({d / missing[0]} missing)"
                else:
                    snap = Snapshot(parts[0], parts[1])
                    if snap.id == vid:
                        return snap
                    problem = (f"{d}: content hash {snap.id} does not match the version id {vid}: the folder "
                               "was edited; restore it from a backup or pick another version")
                if not artifacts.folder_replaced(d, dir_fd):
                    raise StoreError(problem)
                swapped = True
            finally:
                os.close(dir_fd)
        raise StoreError(problem + (f" (read {_READ_ATTEMPTS} times while the folder was being replaced)"
                                    if swapped else ""))

    def _save_version(self, snap: Snapshot, night: str) -> str:
        vid = snap.id
        dest = self.versions_dir / vid
        if not dest.is_dir():
            with artifacts.atomic_dir(dest) as tmp:
                (tmp / SKILL_FILE).write_bytes(snap.skill)
                (tmp / MEMORY_FILE).write_bytes(snap.memory)
                (tmp / "version.json").write_text(json.dumps(
                    {"version": vid, **{f"{k}_sha256": v for k, v in snap.sha256().items()},
                     "created_at": _now(), "night": night}, indent=2) + "\n", encoding="utf-8")
        return vid

    def _append(self, vid: str, action: str, night: str, parent: str, note: str) -> Version:
        entries = self.versions()
        v = Version(seq=(entries[-1].seq + 1 if entries else 1), version=vid, action=action, created_at=_now(),
                    night=night, parent=parent, note=note)
        lines = [json.dumps(e.to_dict()) for e in entries] + [json.dumps(v.to_dict())]
        artifacts.write_text(self.index, "\n".join(lines) + "\n")
        return v

    def register(self, snap: Snapshot, night: str = "") -> Version:
        """Record the live content the night starts from (``initial`` or ``external``) if it is new."""
        with self.lock():
            entries = self.versions()
            vid = self._save_version(snap, night)
            if entries and entries[-1].version == vid:
                return entries[-1]
            action = "initial" if not entries else "external"
            note = ("first version" if not entries else
                    "the live documents were edited outside the cycle since the last recorded version")
            return self._append(vid, action, night, entries[-1].version if entries else "", note)

    @property
    def pending(self) -> Path:
        """Written before the two live documents are replaced, removed once the version is recorded."""
        return self.root / PENDING_FILE

    def _switch_live(self, target: Snapshot, action: str, night: str, parent: str, note: str) -> Version:
        """Make the stored version ``target`` live and record it; call under the lock.

        The two live documents are replaced one after the other, so the switch is written down
        first: a run killed between them leaves ``pending.json``, and the next one (``recover``)
        finishes the switch instead of learning from a pair that was never a version."""
        artifacts.write_json(self.pending, {"version": target.id, "parent": parent, "action": action,
                                            "night": night, "note": note})
        self._write_live(target)
        v = self._append(target.id, action, night, parent, note)
        self.pending.unlink()
        return v

    def recover(self) -> str:
        """Finish a switch of the live documents that a killed run left half done; a note saying
        what was done, or "" when there was nothing to do."""
        with self.lock():
            return self._recover()

    def _recover(self) -> str:
        if not self.pending.is_file():
            return ""
        try:
            p = json.loads(self.pending.read_bytes().decode("utf-8"))
            vid, parent = p["version"], p["parent"]
            target = self.read_version(vid)
        except (ValueError, KeyError, TypeError, StoreError) as e:
            raise StoreError(f"{self.pending}: a switch of the live documents was cut short, and this record of it "
                             f"cannot be used ({e}); compare {self.skill_path} and {self.memory_path} with the "
                             f"versions under {self.versions_dir}, then delete it") from e
        try:
            old = self.read_version(parent) if parent else None
        except StoreError:
            old = None
        now = self.read()
        halves = all(getattr(now, k) in {getattr(target, k)} | ({getattr(old, k)} if old else set())
                     for k in ("skill", "memory"))
        if now.id != vid and not halves:  # edited by hand since: theirs to keep
            self.pending.unlink()
            return (f"a switch of the live documents to version {vid} was cut short, and they were edited since: "
                    "left as they are")
        if now.id != vid:
            self._write_live(target)
        entries = self.versions()
        if not entries or entries[-1].version != vid:
            self._append(vid, p.get("action", "accepted"), p.get("night", ""), parent,
                         ((p.get("note") or "") + " (finished after the run that started it was killed)").strip())
        self.pending.unlink()
        return f"finished the switch of the live documents to version {vid} that a killed run had left half done"

    def _write_live(self, snap: Snapshot) -> None:
        for path, data in ((self.memory_path, snap.memory), (self.skill_path, snap.skill)):
            target = path.resolve()  # a symlinked live file: replace its target, keep the link
            mode = target.stat().st_mode & 0o7777 if target.exists() else None
            artifacts.write_bytes(target, data)
            if mode is not None:
                os.chmod(target, mode)

    def commit(self, skill: str, memory: str, expected: Snapshot, action: str, night: str = "",
               note: str = "") -> Version:
        """Write a new version and replace the live files, if they still hold ``expected``."""
        if action not in ACTIONS:
            raise ValueError(f"action {action!r} is not one of {ACTIONS}")
        new = Snapshot(skill.encode("utf-8"), memory.encode("utf-8"))
        with self.lock():
            self.versions()  # a damaged index is refused before the live files are touched
            self._recover()
            now = self.read()
            changed = [w for w, (a, b) in {"skill": (expected.skill, now.skill),
                                          "memory": (expected.memory, now.memory)}.items() if a != b]
            if changed:
                raise LiveChanged(
                    "; ".join(f"{self.paths()[w]} changed since the night read it" for w in changed)
                    + ": the live files were left alone (the candidate is staged with the night's report); "
                    "run the night again to learn from the new text")
            self._save_version(new, night)
            return self._switch_live(new, action, night, expected.id, note)

    def restore(self, ref: str, note: str = "") -> Version:
        """Make a stored version live again (the current live content is stored first)."""
        vid = self.find(ref)
        target = self.read_version(vid)
        with self.lock():
            self.versions()  # a damaged index is refused before the live files are touched
            self._recover()
            now = self.read()
            entries = self.versions()
            self._save_version(now, "")
            if not entries or entries[-1].version != now.id:
                self._append(now.id, "external", "", entries[-1].version if entries else "",
                             "live documents as found before a rollback")
            return self._switch_live(target, "rollback", "", now.id, note or f"rolled back from {now.id} to {vid}")

    def current(self) -> str:
        return self.read().id
