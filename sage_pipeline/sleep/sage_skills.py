"""SAGE's skills root, owned by the project: whole trees of SAGE's nine ``SKILL.md``, versioned, one of
them live, deployed to SAGE through ``SAGE_SKILLS_ROOT`` (what SAGE injects, and how, is
:mod:`sage_pipeline.sage.skills`).

Layout of a root (``SageSkillsRoot(folder)``)::

    live.json                 the live version: {"format", "version", "seq", "path"}; replaced in one rename
    history.jsonl             one line per version made live: seq, version, action (initial, commit,
                              rollback), created_at, parent, reason, changed (the skill ids edited)
    staged.jsonl              one line per version staged but never made live (a candidate arm SAGE_SKILLS_ROOT
                              may point a run at): version, base, reason, created_at, changed
    versions/<id>/            one whole tree, never rewritten: {discipline,workflow,planning}/<skill>/SKILL.md
                              (the nine files) with SAGE's LICENSE and a NOTICE
    versions/.<id>.tmp-XXXXXXXX  a version being written (artifacts.atomic_dir), or one a killed commit left
    .lock                     held while the history, the pointer or staged.jsonl change

A version's id is the first 12 hex digits of the SHA-256 of its nine files (paths and bytes), so the same
tree is the same version. A new root starts as SAGE's tree as shipped (``initial``).

**The switch.** ``live_path()`` is what ``SAGE_SKILLS_ROOT`` is set to: the live version's own folder,
never a link and never rewritten. SAGE resolves ``SAGE_SKILLS_ROOT`` at every skill it reads, and a run
keeps the environment it started with, so a ``sage run`` started before a commit reads the old version
for all its calls and one started after reads the new one: never a mix, whatever the timing. (SAGE also
caches each file's text by its absolute path for the life of its process: a new version is a new path,
so no cache can serve an old text for it.) A commit writes the version folder (atomically, whole), then
the history line, then ``live.json``; a run killed between the last two leaves the history one ahead of
the pointer, and the next change (or :meth:`SageSkillsRoot.recover`) finishes the switch. A commit killed
while it wrote its version folder leaves that folder's staging copy (``versions/.<id>.tmp-XXXXXXXX``); the
next change (or ``recover()``, whose note names them) removes every such copy, under ``.lock`` (so while no
commit runs) and only when no live writer still holds it (:func:`sage_pipeline.artifacts.folder_in_use`).
Nothing else is ever removed: not a version folder, referenced by the history, by ``staged.jsonl`` or by
neither (the sweep matches only the staging names, ``STAGING``).

**Staged versions** (:meth:`SageSkillsRoot.stage`): a version checked and written exactly as a commit would
write it, from the live tree or any other ``base``, but not made live: ``history.jsonl`` and ``live.json`` are
left as they were and one line goes to ``staged.jsonl``. The ledger's skills lever points the candidate arm
of a ``sage run`` at such a folder (:mod:`sage_pipeline.decisions.skills`). A staged id is a version like any
other to :meth:`~SageSkillsRoot.find`, :meth:`~SageSkillsRoot.texts`, :meth:`~SageSkillsRoot.shas` and
:meth:`~SageSkillsRoot.sha_index` (so the shas a candidate arm's runs log map to its version); ``v<seq>`` names
only versions made live. A damaged line of ``staged.jsonl`` is named by file and line and skipped
(:attr:`~SageSkillsRoot.staged_skipped`), never an error: the candidates are not what SAGE runs by default.

**Edits stay inside what SAGE injects** (:meth:`SageSkillsRoot.commit`): an edit is refused when SAGE
would not inject it as written: past SAGE's per-skill cap (naming the skill file and how many characters
over), blank, an unknown skill id, or the tdd-workflow skill, which SAGE's code never reads
(:data:`sage_pipeline.sage.skills.NEVER_READ`); and, by default, when SAGE's total cap would then cut more
of some role's injection than it cuts of the live version's (``SageSkillsConfig.check_total_cap``). So the
``content_sha256_16`` SAGE logs for a skill of a version is :meth:`SageSkillsRoot.sha16`.

**Skill text is checked before it can reach a prompt** (:func:`check_edit`, on every commit and rollback):
refused, naming the skill file, the line, what was found and what to do, are control characters,
chat-template control tokens, fake role lines and lines that mimic SAGE's own prompt sections or permission
lines (:mod:`sage_pipeline.sleep.skill_text`, which lists each marker and the SAGE file it comes from), and a
learned block the next night could not parse (a second marker: :func:`sage_pipeline.sleep.block.parse_document`).
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import os
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

import filelock
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.sage import skills as sk
from sage_pipeline.sleep import skill_text
from sage_pipeline.sleep.block import DocumentError, parse_document

FORMAT = 1
LIVE_FILE = "live.json"
HISTORY_FILE = "history.jsonl"
STAGED_FILE = "staged.jsonl"
VERSIONS_DIR = "versions"
LOCK_FILE = ".lock"
ACTIONS = ("initial", "commit", "rollback")
STAGING = re.compile(r"\.[0-9a-f]{12}\.tmp-[a-z0-9_]{8}")  # a version folder being written (atomic_dir's name)
SAGE_LICENSE = sk.SKILL_TREE.parent / "LICENSE"
VERSION_NOTICE = (
    "These SKILL.md files are SAGE's skills (the public repository Sris945/SAGE, commit "
    "83287e49114de46e3807e396b0f0447124ae3758, src/sage/assets/skills/), as SAGE ships them or as edited by "
    "sage_pipeline's sleep cycle (the history of edits is ../../history.jsonl of the skills root that wrote this "
    "folder). SAGE is MIT-licensed: its licence is LICENSE beside this file (copyright Sridhar S).\n")


class SageSkillsConfig(BaseModel):
    """How edits to SAGE's skills root are checked (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    total_cap: int | None = Field(None, ge=1, description="SAGE_MAX_SKILL_CHARS_TOTAL of the SAGE the root is "
                                  "deployed to (None: unset, SAGE's default of 12,000 characters; SAGE applies at "
                                  "least 1,000)")
    check_total_cap: bool = Field(True, description="refuse a commit after which SAGE's total cap would cut more "
                                  "of some role's injection (any keyword situation) than it cuts of the live version")
    lock_timeout_s: float = Field(600.0, gt=0, description="how long a change waits for another change of the "
                                  "same root")


class SkillsRootError(sk.SkillsError):
    """The skills root cannot do what was asked; the message names the file (line, field) and what to do."""


class SkillsRootChanged(SkillsRootError):
    """The live version is not the one the caller started from; nothing was written."""


@dataclass(frozen=True)
class RootVersion:
    """One line of ``history.jsonl``: a version made live; or of ``staged.jsonl``: a version staged, never made
    live (``seq`` 0, ``action`` "staged", ``parent`` the version it was staged from)."""

    seq: int
    version: str
    action: str
    created_at: str
    parent: str = ""
    reason: str = ""
    changed: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {**asdict(self), "changed": list(self.changed)}


_FIELDS = {"seq": int, "version": str, "action": str, "created_at": str, "parent": str, "reason": str,
           "changed": list}
_REQUIRED = ("seq", "version", "action", "created_at")
_STAGED_FIELDS = {"version": str, "base": str, "reason": str, "created_at": str, "changed": list}
_STAGED_REQUIRED = ("version", "base", "created_at")


def _is_id(v: object) -> bool:
    return isinstance(v, str) and len(v) == 12 and all(c in "0123456789abcdef" for c in v)


def version_id(files: Mapping[str, bytes]) -> str:
    """The id of a tree: the first 12 hex digits of the SHA-256 of its nine files' paths and bytes."""
    h = hashlib.sha256()
    for sid in sk.SKILL_IDS:
        for part in (sid.encode(), files[sid]):
            h.update(len(part).to_bytes(8, "big"))
            h.update(part)
    return h.hexdigest()[:12]


def check_edit(skill_id: str, text: str, where: str = "") -> str:
    """``text`` as SAGE will read it, when it may become ``skill_id``'s text; else a :class:`sk.SkillsError`
    naming ``where`` (default the skill file), the line and what to do: what SAGE would not inject as written
    (:func:`sage_pipeline.sage.skills.check_text`), what must not reach a prompt
    (:func:`sage_pipeline.sleep.skill_text.check_skill_text`, SAGE's own shipped lines of the skill exempt
    from its marker class), or a learned block the next night could not parse."""
    where = where or skill_id
    seen = sk.check_text(skill_id, text, where)
    skill_text.check_skill_text(where, seen, trusted=skill_text.shipped_lines(skill_id))
    try:
        parse_document(seen, where)
    except DocumentError as e:
        raise skill_text.SkillTextError(where, [skill_text.Finding(
            e.line or 1, "learned_marker", e.problem, f"The next night could not parse the learned block: {e.fix}")]
        ) from e
    return seen


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _typed_line(raw: bytes, bad, required, fields: dict, kind: str) -> dict:
    """One JSON object line with its ``required`` fields, every field known to ``fields`` and of its type; else
    ``bad(problem)`` raised (the caller's error names the file and line)."""
    try:
        d = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise bad(f"not UTF-8 (byte {e.start + 1})") from e
    except json.JSONDecodeError as e:
        raise bad(f"not JSON ({e.msg}, column {e.colno})") from e
    if not isinstance(d, dict):
        raise bad(f"expected a JSON object, got {json.dumps(d)[:60]}")
    for name in required:
        if name not in d:
            raise bad(f"field {name!r} is missing")
    for name, value in d.items():
        typ = fields.get(name)
        if typ is None:
            raise bad(f"field {name!r} is unknown to {kind} (known: {', '.join(fields)})")
        if not isinstance(value, typ) or isinstance(value, bool):
            raise bad(f"field {name!r} is {json.dumps(value)[:60]}, expected {typ.__name__}")
    return d


def _entry(raw: bytes, where: str, prev_seq: int) -> RootVersion:
    def bad(problem: str) -> SkillsRootError:
        return SkillsRootError(f"{where}: {problem}. Nothing was changed; fix or remove the line (the version "
                               "folders are intact), then run the command again")

    d = _typed_line(raw, bad, _REQUIRED, _FIELDS, "a history entry")
    if d["seq"] != prev_seq + 1:
        raise bad(f"field 'seq' is {d['seq']}, expected {prev_seq + 1} (one more than the line before)")
    if not _is_id(d["version"]) or (d.get("parent") and not _is_id(d["parent"])):
        name = "version" if not _is_id(d["version"]) else "parent"
        raise bad(f"field {name!r} is {d[name]!r}, expected a version id (12 hex digits)")
    if d["action"] not in ACTIONS:
        raise bad(f"field 'action' is {d['action']!r}, expected one of {', '.join(ACTIONS)}")
    changed = d.get("changed", [])
    unknown = [c for c in changed if c not in sk.SKILL_IDS]
    if unknown:
        raise bad(f"field 'changed' names {unknown[0]!r}, which is not one of SAGE's skills")
    return RootVersion(d["seq"], d["version"], d["action"], d["created_at"], d.get("parent", ""),
                       d.get("reason", ""), tuple(changed))


def _staged_entry(raw: bytes, where: str) -> RootVersion:
    """One line of ``staged.jsonl``; else a :class:`SkillsRootError` naming ``where`` (file:line) and the field."""
    def bad(problem: str) -> SkillsRootError:
        return SkillsRootError(f"{where}: {problem}; the line is skipped (its version is not known to this root "
                               "until the line is fixed, or the version staged again)")

    d = _typed_line(raw, bad, _STAGED_REQUIRED, _STAGED_FIELDS, "a staged entry")
    for name in ("version", "base"):
        if not _is_id(d[name]):
            raise bad(f"field {name!r} is {d[name]!r}, expected a version id (12 hex digits)")
    changed = d.get("changed", [])
    unknown = [c for c in changed if not isinstance(c, str) or c not in sk.SKILL_IDS]
    if unknown:
        raise bad(f"field 'changed' names {unknown[0]!r}, which is not one of SAGE's skills")
    return RootVersion(0, d["version"], "staged", d["created_at"], d["base"], d.get("reason", ""), tuple(changed))


class SageSkillsRoot:
    """A versioned store of whole SAGE skills trees under ``folder`` (see the module doc); created on first
    use, starting from SAGE's tree as shipped (:data:`sage_pipeline.sage.skills.SKILL_TREE`)."""

    def __init__(self, folder: str | os.PathLike[str], config: SageSkillsConfig | None = None) -> None:
        self.folder = Path(os.path.abspath(folder))
        self.config = config or SageSkillsConfig()
        self.live_file = self.folder / LIVE_FILE
        self.history_file = self.folder / HISTORY_FILE
        self.staged_file = self.folder / STAGED_FILE
        self.staged_skipped: list[str] = []  # why each line of staged.jsonl the last staged() read was skipped
        self.versions_dir = self.folder / VERSIONS_DIR
        with self._lock():
            self._ensure()

    # ----------------------------------------------------------------------------------------- reading
    def versions(self) -> list[RootVersion]:
        """The whole history, oldest first, every line checked (a bad one is an error naming file, line
        and field)."""
        if not self.history_file.is_file():
            return []
        out: list[RootVersion] = []
        for lineno, raw in enumerate(self.history_file.read_bytes().splitlines(), start=1):
            if raw.strip():
                out.append(_entry(raw, f"{self.history_file}:{lineno}", out[-1].seq if out else 0))
        return out

    def staged(self) -> list[RootVersion]:
        """Every version staged and not (necessarily) made live, in the order staged: the lines of
        ``staged.jsonl``, each checked; a bad line is skipped, its file, line and problem kept in
        :attr:`staged_skipped` (one per line skipped), and a version's later lines are repeats, skipped too."""
        self.staged_skipped = []
        try:
            data = self.staged_file.read_bytes()
        except FileNotFoundError:
            return []
        except OSError as e:
            self.staged_skipped.append(f"{self.staged_file}: cannot be read ({e.strerror or e}); no staged version "
                                       "is known until it can")
            return []
        out: dict[str, RootVersion] = {}
        for lineno, raw in enumerate(data.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                e = _staged_entry(raw, f"{self.staged_file}:{lineno}")
            except SkillsRootError as err:
                self.staged_skipped.append(str(err))
                continue
            if e.version in out:
                self.staged_skipped.append(f"{self.staged_file}:{lineno}: version {e.version} is staged already "
                                           "(an earlier line); the repeat is skipped")
                continue
            out[e.version] = e
        return list(out.values())

    def _pointer(self) -> dict:
        path = self.live_file
        try:
            d = json.loads(path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise SkillsRootError(f"{path} is missing: the live version is not known; run `SageSkillsRoot(...)"
                                  ".recover()` to point it at the last version of the history") from None
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise SkillsRootError(f"{path}: not a JSON object ({e}); delete it and run `.recover()`: the last "
                                  f"version of {self.history_file} becomes live") from e
        if not isinstance(d, dict):
            raise SkillsRootError(f"{path}: expected a JSON object; delete it and run `.recover()`")
        if d.get("format") != FORMAT:
            raise SkillsRootError(f"{path}: field 'format' is {d.get('format')!r}, this version reads {FORMAT}")
        if not _is_id(d.get("version")):
            raise SkillsRootError(f"{path}: field 'version' is {json.dumps(d.get('version'))[:60]}, expected a "
                                  "version id (12 hex digits); delete the file and run `.recover()`")
        if not isinstance(d.get("seq"), int) or isinstance(d.get("seq"), bool) or d["seq"] < 1:
            raise SkillsRootError(f"{path}: field 'seq' is {json.dumps(d.get('seq'))[:60]}, expected the history "
                                  "line's seq (1 or more); delete the file and run `.recover()`")
        return d

    def live(self) -> str:
        """The live version's id."""
        return self._pointer()["version"]

    def live_path(self) -> Path:
        """The live version's folder, checked whole: what ``SAGE_SKILLS_ROOT`` is set to."""
        vid = self.live()
        self.files(vid)
        return self.versions_dir / vid

    def find(self, ref: str) -> str:
        """A version id from its id, a unique prefix (4 or more digits), ``v<seq>`` or ``live``; a staged
        version (:meth:`stage`) by its id or a unique prefix."""
        ref = ref.strip()
        if ref == "live":
            return self.live()
        entries = self.versions()
        if ref[:1] in "vV" and ref[1:].isdigit():
            hit = [e.version for e in entries if e.seq == int(ref[1:])]
            if hit:
                return hit[0]
        staged = self.staged()
        ids = sorted({e.version for e in [*entries, *staged]})
        hits = [i for i in ids if i.startswith(ref.lower())] if len(ref) >= 4 else []
        if len(hits) == 1:
            return hits[0]
        known = ", ".join(f"v{e.seq}={e.version}" for e in entries[-8:]) or "none yet"
        if staged:
            known += f"; {len(staged)} staged, latest {staged[-1].version}"
        why = "matches several versions" if len(hits) > 1 else "is not a version of this root"
        raise SkillsRootError(f"version {ref!r} {why} ({self.folder}; latest: {known})")

    def files(self, version: str) -> dict[str, bytes]:
        """The nine files of a version, checked against its id (an edited folder is an error)."""
        vid = self.find(version) if not _is_id(version) else version
        d = self.versions_dir / vid
        if not d.is_dir():
            raise SkillsRootError(f"{d}: no such version folder ({self.history_file} lists the versions)")
        out = {}
        for sid in sk.SKILL_IDS:
            try:
                out[sid] = (d / sid).read_bytes()
            except OSError as e:
                raise SkillsRootError(f"{d / sid}: cannot be read ({e.strerror or e}): the version is incomplete; "
                                      "roll back to another version") from e
        got = version_id(out)
        if got != vid:
            raise SkillsRootError(f"{d}: its files hash to {got}, not to its id {vid}: the folder was edited; a "
                                  "version is never changed in place (commit an edit instead), so restore it or "
                                  "roll back to another version")
        return out

    def texts(self, version: str = "live") -> dict[str, str]:
        """Each skill's text in a version, as SAGE reads it."""
        return {sid: sk.sage_text(b) for sid, b in self.files(self.find(version)).items()}

    def text(self, version: str, skill_id: str) -> str:
        self._known(skill_id)
        return self.texts(version)[skill_id]

    def sha16(self, version: str, skill_id: str) -> str:
        """The ``content_sha256_16`` SAGE logs for ``skill_id`` when it injects it from ``version`` uncut."""
        self._known(skill_id)
        if skill_id in sk.NEVER_READ:
            raise SkillsRootError(f"{skill_id}: SAGE never reads this file (it reads {sk.resolve(skill_id)[0]}), "
                                  "so it never logs a sha for it")
        return sk.sha16(self.texts(version)[skill_id])

    def shas(self, version: str = "live") -> dict[str, str]:
        """:meth:`sha16` of every skill SAGE injects."""
        texts = self.texts(version)
        return {sid: sk.sha16(texts[sid]) for sid in sk.INJECTED_IDS}

    def sha_index(self) -> dict[str, dict[str, list[str]]]:
        """Skill id -> sha16 -> the versions whose text of that skill has it (those made live oldest first, then
        the staged ones in the order staged): which version a logged sha came from. A staged version whose folder
        cannot be read whole is left out, named in :attr:`staged_skipped`."""
        out: dict[str, dict[str, list[str]]] = {sid: {} for sid in sk.INJECTED_IDS}
        made_live = list(dict.fromkeys(e.version for e in self.versions()))
        staged = [e.version for e in self.staged() if e.version not in made_live]
        skipped, left_out = list(self.staged_skipped), []
        for vid in [*made_live, *staged]:
            try:
                shas = self.shas(vid)
            except SkillsRootError as e:
                if vid not in staged:
                    raise
                left_out.append(f"{e}; staged version {vid} is left out of the sha index")
                continue
            for sid, h in shas.items():
                out[sid].setdefault(h, []).append(vid)
        self.staged_skipped = skipped + left_out
        return out

    def diff(self, a: str, b: str) -> dict[str, str]:
        """Skill id -> unified diff from version ``a`` to ``b``, for every skill that differs."""
        va, vb = self.find(a), self.find(b)
        ta, tb = self.texts(va), self.texts(vb)
        return {sid: "".join(difflib.unified_diff(ta[sid].splitlines(keepends=True), tb[sid].splitlines(keepends=True),
                                                  fromfile=f"{va}/{sid}", tofile=f"{vb}/{sid}"))
                for sid in sk.SKILL_IDS if ta[sid] != tb[sid]}

    # ----------------------------------------------------------------------------------------- changing
    def commit(self, edits: Mapping[str, str], reason: str, *, parent: str | None = None,
               action: str = "commit") -> RootVersion:
        """Make a new version live: the live tree with ``edits`` (skill id -> the skill's new text). Refused
        (nothing written) when an edit is one SAGE would not inject as written (see the module doc), or when
        ``parent`` is given and is not the live version (:class:`SkillsRootChanged`). Unchanged text: a no-op
        that returns the live version's entry."""
        if action not in ("commit", "rollback"):
            raise ValueError(f"action {action!r}: a commit is 'commit' or 'rollback'")
        if not isinstance(edits, Mapping):
            raise SkillsRootError(f"edits must map skill ids to their new text, got {type(edits).__name__}")
        for sid, text in edits.items():
            check_edit(sid, text)
        with self._lock():
            self._recover()
            entries = self.versions()
            live = self._pointer()
            if parent is not None and parent != live["version"]:
                raise SkillsRootChanged(f"{self.live_file}: the live version is {live['version']}, not {parent} "
                                        "(the version this change started from): another change went live "
                                        "meanwhile; nothing was written, start again from the live version")
            base = self.files(live["version"])
            new = {**base, **{sid: text.encode("utf-8") for sid, text in edits.items()}}
            changed = tuple(sid for sid in sk.SKILL_IDS if new[sid] != base[sid])
            if not changed:
                return entries[-1]
            self._check_total_cap(base, new, changed)
            vid = version_id(new)
            self._save(vid, new)
            entry = RootVersion(entries[-1].seq + 1, vid, action, _now(), live["version"], reason, changed)
            self._switch(entries, entry)
            return entry

    def stage(self, edits: Mapping[str, str], reason: str, *, base: str | None = None) -> RootVersion:
        """A version that is not made live: ``base``'s tree (any ref :meth:`find` knows; default the live
        version) with ``edits``, checked as :meth:`commit` checks it (:func:`check_edit` per edit, SAGE's total
        cap against ``base``), written whole under ``versions/<id>`` (an existing folder is verified, never
        rewritten), and one line appended to ``staged.jsonl`` under the root's lock. ``history.jsonl`` and
        ``live.json`` are left as they are. A tree this root already knows (no change from ``base``, or staged
        before, or made live before) adds no line: its existing entry is returned."""
        if not isinstance(edits, Mapping):
            raise SkillsRootError(f"edits must map skill ids to their new text, got {type(edits).__name__}")
        for sid, text in edits.items():
            check_edit(sid, text)
        with self._lock():
            self._sweep()
            entries, staged = self.versions(), self.staged()
            bid = self.live() if base is None else self.find(base)
            old = self.files(bid)
            new = {**old, **{sid: text.encode("utf-8") for sid, text in edits.items()}}
            changed = tuple(sid for sid in sk.SKILL_IDS if new[sid] != old[sid])
            vid = version_id(new)
            known = self._known_entry(vid, entries, staged)
            if known is not None:
                self.files(vid)  # the folder whole, as an entry promises
                return known
            self._check_total_cap(old, new, changed)
            self._save(vid, new)
            entry = RootVersion(0, vid, "staged", _now(), bid, reason, changed)
            line = json.dumps({"version": vid, "base": bid, "reason": reason, "created_at": entry.created_at,
                               "changed": list(changed)}).encode("utf-8")
            try:
                prior = self.staged_file.read_bytes()
            except FileNotFoundError:
                prior = b""
            if prior and not prior.endswith(b"\n"):
                prior += b"\n"
            artifacts.write_bytes(self.staged_file, prior + line + b"\n")  # whole or not at all
            return entry

    def rollback(self, skill_id: str, to_version: str, reason: str = "") -> RootVersion:
        """A new version: the live tree with ``skill_id``'s text from ``to_version`` (a no-op when equal)."""
        self._known(skill_id)
        vid = self.find(to_version)
        text = self.files(vid)[skill_id].decode("utf-8")
        return self.commit({skill_id: text}, reason or f"{skill_id} rolled back to version {vid}", action="rollback")

    def recover(self) -> str:
        """Finish a switch a killed change left half done (the history one ahead of ``live.json``), or
        restore a lost ``live.json`` from the history, and remove the staging folders killed commits left
        (see the module doc); a note saying what was done ("" when nothing)."""
        with self._lock():
            return self._recover()

    # ----------------------------------------------------------------------------------------- internals
    @staticmethod
    def _known_entry(vid: str, entries: Sequence[RootVersion], staged: Sequence[RootVersion]) -> RootVersion | None:
        """The entry of a version the root knows: its last history line, else its staged line."""
        return next((e for e in reversed(entries) if e.version == vid), None) or \
            next((e for e in staged if e.version == vid), None)

    def _known(self, skill_id: str) -> None:
        if skill_id not in sk.SKILL_IDS:
            raise SkillsRootError(f"{skill_id!r} is not one of SAGE's skills ({', '.join(sk.SKILL_IDS)})")

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        self.folder.mkdir(parents=True, exist_ok=True)
        lock = filelock.FileLock(self.folder / LOCK_FILE)
        try:
            lock.acquire(timeout=self.config.lock_timeout_s)
        except filelock.Timeout:
            raise SkillsRootError(f"{self.folder / LOCK_FILE}: another change of this skills root still runs after "
                                  f"{self.config.lock_timeout_s:g} s; try again later") from None
        try:
            yield
        finally:
            lock.release()

    def _ensure(self) -> None:
        if self.history_file.exists() or self.live_file.exists():
            return
        shipped = {sid: (sk.SKILL_TREE / sid).read_bytes() for sid in sk.SKILL_IDS}
        vid = version_id(shipped)
        self._save(vid, shipped)
        self._switch([], RootVersion(1, vid, "initial", _now(), "", "SAGE's skills as shipped", ()))

    def _save(self, vid: str, files: Mapping[str, bytes]) -> None:
        dest = self.versions_dir / vid
        if dest.is_dir():
            self.files(vid)  # the same content, already whole (an edited folder is an error, never rewritten)
            return
        with artifacts.atomic_dir(dest) as tmp:
            for sid, data in files.items():
                (tmp / sid).parent.mkdir(parents=True, exist_ok=True)
                (tmp / sid).write_bytes(data)
            (tmp / "LICENSE").write_bytes(SAGE_LICENSE.read_bytes())
            (tmp / "NOTICE").write_text(VERSION_NOTICE, encoding="utf-8")

    def _switch(self, entries: Sequence[RootVersion], entry: RootVersion) -> None:
        """The history line first, then the pointer (a kill between them: :meth:`_recover` finishes)."""
        lines = [json.dumps(e.to_dict()) for e in [*entries, entry]]
        artifacts.write_text(self.history_file, "\n".join(lines) + "\n")
        self._write_pointer(entry)

    def _recover(self) -> str:
        swept = self._sweep()
        note = self._finish_switch()
        if swept:
            note = "; ".join(n for n in (note, f"removed {len(swept)} staging folder(s) that killed commits left in "
                                         f"{self.versions_dir}: {', '.join(swept)}") if n)
        return note

    def _sweep(self) -> list[str]:
        """Remove the staging folders of killed commits; call under the root's lock (no commit of this root
        runs then), and a folder a live writer still holds (flock) is kept."""
        try:
            names = sorted(os.listdir(self.versions_dir))
        except FileNotFoundError:
            return []
        swept = []
        for name in names:
            path = self.versions_dir / name
            if not STAGING.fullmatch(name) or path.is_symlink() or not path.is_dir():
                continue
            if artifacts.folder_in_use(path):
                continue
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                swept.append(name)
        return swept

    def _finish_switch(self) -> str:
        entries = self.versions()
        if not entries:
            raise SkillsRootError(f"{self.history_file} is missing or empty while {self.live_file} exists: the "
                                  "history of this root is lost; restore it from a backup, or move the root away "
                                  "to start again from SAGE's skills as shipped")
        last = entries[-1]
        if not self.live_file.exists():
            self.files(last.version)
            self._write_pointer(last)
            return (f"{self.live_file} was missing: pointed at the last version of the history, {last.version} "
                    f"(v{last.seq})")
        live = self._pointer()
        if live["seq"] == last.seq and live["version"] == last.version:
            return ""
        if live["seq"] == last.seq - 1 and live["version"] == (entries[-2].version if len(entries) > 1 else None):
            self.files(last.version)
            self._write_pointer(last)
            return (f"finished the switch to version {last.version} (v{last.seq}) that a killed change had left "
                    "half done")
        raise SkillsRootError(f"{self.live_file}: fields 'version' {live['version']} and 'seq' {live['seq']} match "
                              f"no step of {self.history_file} (last: v{last.seq}={last.version}); delete "
                              f"{self.live_file} to make the last version of the history live")

    def _write_pointer(self, entry: RootVersion) -> None:
        artifacts.write_json(self.live_file, {"format": FORMAT, "version": entry.version, "seq": entry.seq,
                                              "path": f"{VERSIONS_DIR}/{entry.version}", "since": _now()})

    def _check_total_cap(self, base: Mapping[str, bytes], new: Mapping[str, bytes], changed: Sequence[str]) -> None:
        if not self.config.check_total_cap:
            return

        def cuts(files: Mapping[str, bytes]) -> dict[tuple[str, str, str], int]:
            rep = sk.check_within_caps({f: sk.sage_text(files[f]) for f in sk.INJECTED_IDS}, self.config.total_cap)
            return {(t["role"], t["situation"], sid): n for t in rep.total for sid, n in t["cut"].items()}

        before, after = cuts(base), cuts(new)
        worse = {k: n for k, n in after.items() if n > before.get(k, 0)}
        if worse:
            (role, situation, sid), n = next(iter(worse.items()))
            cap = sk.effective_total_cap(self.config.total_cap)
            raise sk.SkillsError(
                f"editing {', '.join(changed)}: SAGE's total cap of {cap} characters (SAGE_MAX_SKILL_CHARS_TOTAL) "
                f"would then cut {n} characters of {sid} from the {role}'s prompt ({situation}), and "
                f"{len(worse) - 1} other cut(s) besides: SAGE would not inject the edit whole. Shorten the edit "
                "(or raise the cap the deployed SAGE runs with, and set SageSkillsConfig.total_cap to it)")


def journal_injections(log_dirs: Sequence[str | os.PathLike[str]]) -> sk.InjectionLog:
    """The ``SKILL_INJECTION`` events of every SAGE journal under ``log_dirs`` (``*.log``, ``*.jsonl`` and their
    ``.gz``, recursively), found and ordered as the trajectories ingest finds them (SAGE's writing order)."""
    from sage_pipeline.routing.ingest import IngestConfig, discover_logs

    files, _ = discover_logs(IngestConfig([str(d) for d in log_dirs]), "log_dirs")
    return sk.read_injections(files) if files else sk.InjectionLog()
