"""SAGE's skills: the tree SAGE injects into every agent's prompt, its selection rule, its caps, and
the ``SKILL_INJECTION`` events it logs, each read from SAGE's code and tested against it
(``sage_pipeline_tests/sage_world/test_skills_contract.py`` runs SAGE's own injector).

**The tree** (:data:`SKILL_TREE`): SAGE's nine ``SKILL.md`` files, copied byte for byte from
``src/sage/assets/skills/{discipline,workflow,planning}/<skill>/SKILL.md`` (MIT: ``data/LICENSE`` and
``data/NOTICE``). A skill's id is its path under a skills root (:data:`SKILL_IDS`), e.g.
``discipline/test-driven-development/SKILL.md``; SAGE logs it as a *title*, ``sage:discipline:
test-driven-development/SKILL.md`` (:func:`title`). SAGE reads the tree from ``SAGE_SKILLS_ROOT`` when
it is set (stripped, ``~`` expanded, resolved: ``execution/policy_store.py``
``effective_skills_root_str``), else from the ``skills_root`` of ``.sage/policy.json`` in its working
folder, else its packaged tree.

**Selection** (``prompt_engine/skill_injector.py`` ``_select_skills``, :func:`select_skills`): a fixed
set per role (lower-cased), plus ``systematic-debugging`` for any role but the debugger when the last
error holds ``syntaxerror``, ``traceback``, ``parse failed``, ``json`` or ``stack``, plus, for the coder,
test engineer and reviewer, ``test-driven-development`` when the task holds ``test``, ``pytest``,
``coverage`` or ``tdd`` and ``systematic-debugging`` when it holds ``debug``, ``traceback``, ``stack trace``
or ``error`` (case-insensitive substrings), each skill once, in first-mention order.

**Injection** (``get_skill_injection_context``, :func:`injection`): for each selected skill, its text as
SAGE reads it (:func:`read_skill`: UTF-8 in SAGE's runs, undecodable bytes dropped, newlines
translated; missing or unreadable is empty); a skill whose text is blank is skipped; the body is the
first :data:`PER_SKILL_CAP` characters; when the total would pass the cap (``SAGE_MAX_SKILL_CHARS_TOTAL``,
default :data:`DEFAULT_TOTAL_CAP`, at least :data:`MIN_TOTAL_CAP`) the body is cut to what is left, or the
injection stops when :data:`MIN_REMAINING` characters or fewer are left; the block is ``### <title>\\n``
and the stripped body; blocks are joined by a blank line. The logged ``content_sha256_16`` is the
SHA-256 of the **body** (after both cuts, before the strip), first 16 hex digits (:func:`sha16`);
``per_skill_chars`` the body's length. Nothing is logged when no block is left.

**Where SAGE calls it** (``orchestrator/prefix_builder.py`` ``build_prefix_for_agent``, the only
caller; the workflow appends ``"\\n\\nSKILL DISCIPLINE CONTEXT:\\n" + text`` to the role's prefix):
``task_description`` is the state's ``current_task.description``, else the run's ``user_prompt`` (the
prompt as given to ``sage run``, a chat transcript prepended when there is one: ``cli/run_cmd.py``);
``last_error`` the state's. In ``sage run`` every task runs inside ``task_worker``, which starts each task
with ``current_task = {}`` and ``last_error = ""``; ``execute_agent`` returns the task as
``current_task``. In ``orchestrator/workflow.py``:

=============== ========================= ===========================================================
role            where                     task_description / last_error in ``sage run``
=============== ========================= ===========================================================
planner         run_planner (:345)        the user's prompt (no current task yet) / ``""`` at start
architect       execute_agent (:1231)     the user's prompt (``task_worker`` clears current_task) /
                                          ``""`` (cleared by task_worker); no skill unless the error
                                          names a keyword
coder           execute_agent (:1280)     the user's prompt, not the task's description / ``""``
documentation   execute_agent (:1349)     the user's prompt / ``""``
test_engineer   execute_agent (:1441)     the user's prompt / ``""``
reviewer        verification_gate (:1818) the task's description / the state's last error: the
                                          tool executor's, ``""`` when it applied the patch
test_engineer   verification_gate (:1929) the task's description / as the reviewer's
debugger        debug_agent (:2223)       the task's description / the failed verification's error
=============== ========================= ===========================================================

**Events** (:func:`read_injections`): ``log_event("SKILL_INJECTION", payload)``
(``observability/structured_logger.py``) appends ``{"type", "timestamp", **payload, "session_id"?,
"trace_id"?}`` to the journal, its strings passed through SAGE's redaction (no title or hash can match
its patterns; an ``agent_role`` holding a secret-like ``token=...`` would be redacted).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

SKILL_TREE = Path(__file__).with_name("data") / "skills"  # SAGE's nine SKILL.md as shipped
FOLDERS = ("discipline", "workflow", "planning")
SKILL_FILE = "SKILL.md"
SKILL_IDS: tuple[str, ...] = (  # the nine files of SAGE's tree (its paths under a skills root), as shipped
    "discipline/systematic-debugging/SKILL.md",
    "discipline/test-driven-development/SKILL.md",
    "discipline/verification-before-completion/SKILL.md",
    "planning/make-plan/SKILL.md",
    "planning/smart-explore/SKILL.md",
    "workflow/documentation-lookup/SKILL.md",
    "workflow/prompt-optimizer/SKILL.md",
    "workflow/tdd-workflow/SKILL.md",
    "workflow/verification-loop/SKILL.md",
)
SKILLS_ROOT_ENV = "SAGE_SKILLS_ROOT"
TOTAL_CAP_ENV = "SAGE_MAX_SKILL_CHARS_TOTAL"
PER_SKILL_CAP = 3200  # _SkillSpec.max_chars
DEFAULT_TOTAL_CAP = 12_000  # _max_total_chars() when the variable is unset, blank or not an integer
MIN_TOTAL_CAP = 1000  # _max_total_chars(): max(1000, int(v))
MIN_REMAINING = 200  # the injection stops when this many characters or fewer are left under the total cap
BLOCK_CAP = 3500  # _format_skill_block keeps the stripped body's first 3500 characters
EVENT = "SKILL_INJECTION"
PREFIX_HEADING = "\n\nSKILL DISCIPLINE CONTEXT:\n"  # prefix_builder.py, before the injected text

# the skills as SAGE's _select_skills names them (its _SkillSpec paths)
_TDD = "discipline/test-driven-development/SKILL.md"
_VBC = "discipline/verification-before-completion/SKILL.md"
_SD = "discipline/systematic-debugging/SKILL.md"
_TDD_WF = "workflow/tdd-workflow/SKILL.md"
_PROMPT = "workflow/prompt-optimizer/SKILL.md"
_VLOOP = "workflow/verification-loop/SKILL.md"
_DOCS = "workflow/documentation-lookup/SKILL.md"
_PLAN = "planning/make-plan/SKILL.md"
_EXPLORE = "planning/smart-explore/SKILL.md"
SPEC_PATHS = (_TDD, _VBC, _SD, _TDD_WF, _PROMPT, _VLOOP, _DOCS, _PLAN, _EXPLORE)
ERROR_KEYWORDS = ("syntaxerror", "traceback", "parse failed", "json", "stack")
TEST_TASK_KEYWORDS = ("test", "pytest", "coverage", "tdd")
DEBUG_TASK_KEYWORDS = ("debug", "traceback", "stack trace", "error")
TASK_KEYWORD_ROLES = ("coder", "test_engineer", "reviewer")


class SkillsError(ValueError):
    """A skills root, skill text or journal line SAGE's injector would not take as the project means it;
    the message names the file (and line, field) and what to do."""


class SkillTooLong(SkillsError):
    """A skill's text is past SAGE's per-skill cap: SAGE would inject only its first characters."""

    def __init__(self, skill_id: str, chars: int, where: str = "") -> None:
        self.skill_id, self.chars, self.over = skill_id, chars, chars - PER_SKILL_CAP
        super().__init__(
            f"{where or skill_id}: {chars} characters as SAGE reads it, {self.over} over SAGE's per-skill cap of "
            f"{PER_SKILL_CAP} (prompt_engine/skill_injector.py _SkillSpec.max_chars): SAGE would inject only the "
            f"first {PER_SKILL_CAP} and drop the rest. Shorten it by at least {self.over} characters")


# ---------------------------------------------------------------------------------------------- selection
def select_skills(role: str, task_description: str = "", last_error: str = "") -> tuple[str, ...]:
    """The skills SAGE's ``_select_skills`` picks, in its order (each once), as its code names them
    (:data:`SPEC_PATHS`; :func:`resolve` gives the file SAGE then reads)."""
    role = (role or "").lower()
    err = (last_error or "").lower()
    task = (task_description or "").lower()
    picked: list[str] = []
    if role in ("coder", "test_engineer", "reviewer"):
        picked += [_TDD, _VBC]
    if role == "debugger":
        picked.append(_SD)
    if role != "debugger" and any(k in err for k in ERROR_KEYWORDS):
        picked.append(_SD)
    if role in ("coder", "test_engineer"):
        picked += [_TDD_WF, _PROMPT]
    if role in ("reviewer", "test_engineer"):
        picked.append(_VLOOP)
    if role in ("planner", "coder", "debugger", "documentation"):
        picked.append(_DOCS)
    if role == "documentation":
        picked += [_VBC, _PROMPT]
    if role == "planner":
        picked += [_PLAN, _EXPLORE]
    if task and role in TASK_KEYWORD_ROLES:
        if any(k in task for k in TEST_TASK_KEYWORDS):
            picked.append(_TDD)
        if any(k in task for k in DEBUG_TASK_KEYWORDS):
            picked.append(_SD)
    return tuple(dict.fromkeys(picked))


def resolve(spec: str) -> tuple[str, str]:
    """(the file SAGE reads, relative to the skills root; the title it logs) for a skill as its selection
    names it: ``_resolve_spec_path`` removes *every* ``<folder>/`` from the path (``str.replace``), so
    ``workflow/tdd-workflow/SKILL.md`` is read from ``workflow/tdd-SKILL.md``, a file SAGE does not ship:
    SAGE never injects its tdd-workflow skill (:data:`NEVER_READ`)."""
    folder, _, rest = spec.partition("/")
    if folder not in FOLDERS or not rest:
        raise SkillsError(f"{spec!r} is not a skill path SAGE resolves (<{'|'.join(FOLDERS)}>/<skill>/SKILL.md)")
    rel = spec.replace(f"{folder}/", "")
    return f"{folder}/{rel}", f"sage:{folder}:{rel}"


# the files SAGE's injector reads (relative to the skills root), in SPEC_PATHS order
READ_FILES: tuple[str, ...] = tuple(dict.fromkeys(resolve(s)[0] for s in SPEC_PATHS))
# the shipped skills SAGE injects (the ones an edit can change), and the ones it never reads
INJECTED_IDS: tuple[str, ...] = tuple(s for s in SKILL_IDS if s in READ_FILES)
NEVER_READ: tuple[str, ...] = tuple(s for s in SKILL_IDS if s not in READ_FILES)


def title(file_id: str) -> str:
    """The title SAGE logs for the file it read: ``discipline/x/SKILL.md`` -> ``sage:discipline:x/SKILL.md``."""
    folder, _, rel = file_id.partition("/")
    if folder not in FOLDERS or not rel:
        raise SkillsError(f"{file_id!r} is not a skill file (<{'|'.join(FOLDERS)}>/<skill>/SKILL.md)")
    return f"sage:{folder}:{rel}"


_TITLE = re.compile(rf"sage:({'|'.join(FOLDERS)}):(.+)")


def skill_id(logged_title: str) -> str:
    """The file (relative to the skills root) of a title SAGE logged (the inverse of :func:`title`)."""
    m = _TITLE.fullmatch(logged_title)
    if m is None:
        raise SkillsError(f"{logged_title!r} is not a title SAGE logs (sage:<{'|'.join(FOLDERS)}>:<path>)")
    return f"{m.group(1)}/{m.group(2)}"


# ---------------------------------------------------------------------------------------------- reading
def sage_text(data: bytes) -> str:
    """A skill file's bytes as SAGE's ``Path.read_text(errors="ignore")`` gives them in its runs (UTF-8
    locale): undecodable bytes dropped, ``\\r\\n`` and ``\\r`` read as ``\\n``, a BOM kept."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="ignore").read()


def read_skill(path: str | os.PathLike[str]) -> str:
    """A skill file as SAGE's ``_safe_read_text`` reads it: "" when missing, not a file or unreadable."""
    p = Path(path)
    try:
        if not p.is_file():
            return ""
        return sage_text(p.read_bytes())
    except OSError:
        return ""


def sha16(body: str) -> str:
    """SAGE's ``_short_hash``: the first 16 hex digits of the SHA-256 of ``body``'s UTF-8."""
    return hashlib.sha256(body.encode("utf-8", errors="ignore")).hexdigest()[:16]


def effective_total_cap(value: int | str | None = None) -> int:
    """The total cap SAGE applies for ``SAGE_MAX_SKILL_CHARS_TOTAL`` = ``value`` (``_max_total_chars``):
    None or blank -> 12,000; an integer (or its text) -> at least 1,000; any other text -> 12,000."""
    if value is None:
        return DEFAULT_TOTAL_CAP
    if isinstance(value, bool):
        raise SkillsError(f"total cap {value!r}: give the number of characters (or its text), not a bool")
    if isinstance(value, int):
        return max(MIN_TOTAL_CAP, value)
    v = str(value).strip()
    if not v:
        return DEFAULT_TOTAL_CAP
    try:
        return max(MIN_TOTAL_CAP, int(v))
    except ValueError:
        return DEFAULT_TOTAL_CAP


def root_texts(root: str | os.PathLike[str] | None = None) -> dict[str, str]:
    """The text of every file SAGE's injector reads (:data:`READ_FILES`) in a skills root (default:
    :data:`SKILL_TREE`), as SAGE reads it ("" when missing)."""
    base = Path(root) if root is not None else SKILL_TREE
    return {f: read_skill(base / f) for f in READ_FILES}


# ---------------------------------------------------------------------------------------------- injection
@dataclass(frozen=True)
class Injected:
    """One skill as SAGE injected it: ``skill_id`` the file read (relative to the skills root), ``chars``
    the body's length (``per_skill_chars``), ``sha16`` its hash, ``cut`` how many characters of the file's
    text the caps left out."""

    skill_id: str
    chars: int
    sha16: str
    cut: int


@dataclass(frozen=True)
class Injection:
    """What SAGE's ``get_skill_injection_context`` returns and logs for one call."""

    role: str
    selected: tuple[str, ...]  # the files the rule's picks are read from (resolve()), in order
    text: str  # the returned markdown ("" when nothing was injected)
    skills: tuple[Injected, ...]  # what was injected, in order
    skipped_blank: tuple[str, ...]  # selected files whose text is blank (missing, empty, whitespace)
    dropped: tuple[str, ...]  # selected files with text left out once the total cap was reached
    cap: int  # the total cap applied

    @property
    def payload(self) -> dict | None:
        """The ``SKILL_INJECTION`` payload SAGE logs (before its redaction), or None: nothing logged."""
        if not self.text.strip():
            return None
        chars = [s.chars for s in self.skills]
        return {"agent_role": self.role, "skill_ids": [title(s.skill_id) for s in self.skills],
                "content_sha256_16": [s.sha16 for s in self.skills], "per_skill_chars": chars,
                "total_chars": sum(chars), "approx_prompt_tokens": 1 + sum(chars) // 4}

    @property
    def prompt_section(self) -> str:
        """What SAGE's prefix builder appends to the role's prefix ("" when nothing was injected)."""
        return PREFIX_HEADING + self.text if self.text.strip() else ""

    @property
    def shas(self) -> dict[str, str]:
        return {s.skill_id: s.sha16 for s in self.skills}

    @property
    def truncated(self) -> dict[str, int]:
        """Skill id -> characters the caps cut from it, for every injected skill not injected whole (the
        skills the total cap left out altogether are :attr:`dropped`)."""
        return {s.skill_id: s.cut for s in self.skills if s.cut}


def injection(root: str | os.PathLike[str] | Mapping[str, str] | None, role: str, task_description: str = "",
              last_error: str = "", total_cap: int | str | None = None) -> Injection:
    """SAGE's injection for one call: ``root`` a skills root folder (None: :data:`SKILL_TREE`, SAGE's
    packaged tree) or the texts of the files in it by path (:data:`READ_FILES`), as SAGE would read them
    (a missing path is a missing file); ``total_cap`` what ``SAGE_MAX_SKILL_CHARS_TOTAL`` is set to (None:
    unset; applied by SAGE's rule, :func:`effective_total_cap`)."""
    if root is None or not isinstance(root, Mapping):
        base = Path(root) if root is not None else SKILL_TREE

        def text_of(sid: str) -> str:
            return read_skill(base / sid)
    else:
        texts = root

        def text_of(sid: str) -> str:
            return texts.get(sid, "") or ""
    cap = effective_total_cap(total_cap)
    selected = tuple(resolve(spec)[0] for spec in select_skills(role, task_description, last_error))
    blocks: list[str] = []
    done: list[Injected] = []
    blank: list[str] = []
    used = 0
    stopped_at = len(selected)
    for i, sid in enumerate(selected):
        raw = text_of(sid)
        if not raw.strip():
            blank.append(sid)
            continue
        body = raw[:min(PER_SKILL_CAP, len(raw))]
        if used + len(body) > cap:
            remain = cap - used
            if remain <= MIN_REMAINING:
                stopped_at = i
                break
            body = body[:remain]
        stripped = body.strip()[:BLOCK_CAP]
        if not stripped:  # a body of whitespace only (its text starts with that much blank)
            blank.append(sid)
            continue
        blocks.append(f"### {title(sid)}\n{stripped}")
        done.append(Injected(sid, len(body), sha16(body), len(raw) - len(body)))
        used += len(body)
        if used >= cap:
            stopped_at = i + 1
            break
    dropped = tuple(s for s in selected[stopped_at:] if text_of(s).strip())
    return Injection(role, selected, "\n\n".join(blocks), tuple(done), tuple(blank), dropped, cap)


# ---------------------------------------------------------------------------------------------- caps
def check_text(skill: str, text: str, where: str = "") -> str:
    """``text`` as SAGE will read it once written as UTF-8, for the shipped skill ``skill``; a
    :class:`SkillsError` naming ``where`` (default the skill) when SAGE would not inject it as written:
    past the per-skill cap (:class:`SkillTooLong`, with how many characters over), blank (SAGE skips a
    blank skill), not encodable, or a file SAGE never reads (:data:`NEVER_READ`)."""
    where = where or skill
    if skill in NEVER_READ:
        read_as = resolve(skill)[0]
        raise SkillsError(f"{where}: SAGE never reads this file: its injector (_resolve_spec_path) removes every "
                          f"'{skill.partition('/')[0]}/' from the path and reads {read_as} instead, which SAGE does "
                          f"not ship, so an edit here cannot change any prompt. Edit one of the skills SAGE injects: "
                          f"{', '.join(INJECTED_IDS)}")
    if skill not in SKILL_IDS:
        raise SkillsError(f"{where}: not one of SAGE's skills ({', '.join(SKILL_IDS)}): SAGE's injector reads only "
                          "these paths")
    if not isinstance(text, str):
        raise SkillsError(f"{where}: the new text is a {type(text).__name__}, expected a string")
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SkillsError(f"{where}: the new text cannot be written as UTF-8 (character {e.start + 1}: "
                          f"{text[e.start:e.end]!r}); remove it") from e
    seen = sage_text(data)
    if len(seen) > PER_SKILL_CAP:
        raise SkillTooLong(skill, len(seen), where)
    if not seen.strip():
        raise SkillsError(f"{where}: blank: SAGE skips a blank skill, so it would vanish from every prompt that "
                          "injects it; keep some text (or keep the previous version)")
    return seen


@dataclass(frozen=True)
class CapReport:
    """Where SAGE's caps would cut a skills tree: per skill past the per-skill cap (skill id -> characters
    over), and every (role, keyword situation) whose injection the total cap cuts."""

    per_skill: dict[str, int]
    total: list[dict] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.per_skill and not self.total

    def message(self, where: str = "") -> str:
        lines = [f"{where + '/' if where else ''}{sid}: {n} characters over SAGE's per-skill cap of {PER_SKILL_CAP}"
                 for sid, n in self.per_skill.items()]
        lines += [f"role {t['role']} ({t['situation']}): the total cap of {t['cap']} cuts "
                  + ", ".join(f"{sid} by {n}" for sid, n in t["cut"].items()) for t in self.total]
        return "; ".join(lines)


# keyword situations that change what a role gets: (name, task_description, last_error)
SITUATIONS: tuple[tuple[str, str, str], ...] = tuple(
    (f"task {t or '-'}, error {e or '-'}", t, e)
    for t in ("", "test", "debug", "test debug") for e in ("", "traceback"))
# every role SAGE's selection knows (the rest get nothing unless the error names a keyword)
SELECTION_ROLES = ("planner", "coder", "test_engineer", "reviewer", "debugger", "documentation", "architect")


def check_within_caps(root: str | os.PathLike[str] | Mapping[str, str] | None = None,
                      total_cap: int | str | None = None) -> CapReport:
    """Which skills SAGE's caps would cut: every skill longer than :data:`PER_SKILL_CAP` as SAGE reads it,
    and for every role SAGE's selection knows and every keyword situation (task with ``test``, ``debug``,
    both or neither; error with ``traceback`` or none), the skills the total cap cuts or drops."""
    texts = root_texts(root) if not isinstance(root, Mapping) else {f: root.get(f, "") or "" for f in READ_FILES}
    per_skill = {sid: len(t) - PER_SKILL_CAP for sid, t in texts.items() if len(t) > PER_SKILL_CAP}
    total = []
    for role in SELECTION_ROLES:
        for name, task, err in SITUATIONS:
            inj = injection(texts, role, task, err, total_cap)
            cut = {sid: n for sid, n in inj.truncated.items() if sid not in per_skill or n > per_skill[sid]}
            cut |= {sid: len(texts[sid]) for sid in inj.dropped}
            if cut:
                total.append({"role": role, "situation": name, "cap": inj.cap, "cut": cut})
    return CapReport(per_skill, total)


# ---------------------------------------------------------------------------------------------- events
@dataclass(frozen=True)
class InjectionEvent:
    """One ``SKILL_INJECTION`` line of SAGE's journal."""

    source: str  # the journal file ("<lines>" for lines given directly)
    line: int  # 1-based
    timestamp: str
    session_id: str | None
    trace_id: str | None
    agent_role: str
    skill_ids: tuple[str, ...]  # ids (discipline/x/SKILL.md), from the logged titles
    sha16: tuple[str, ...]
    per_skill_chars: tuple[int, ...]
    total_chars: int
    approx_prompt_tokens: int

    @property
    def shas(self) -> dict[str, str]:
        return dict(zip(self.skill_ids, self.sha16, strict=True))


@dataclass
class InjectionLog:
    """The ``SKILL_INJECTION`` events of some journal lines, and the ones that could not be used (each
    ``file:line: field ...: what is wrong``). Other lines (other events, SAGE's text lines) are not read."""

    events: list[InjectionEvent] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    lines: int = 0


_HEX16 = re.compile(r"[0-9a-f]{16}")


def _event(obj: dict, source: str, lineno: int) -> InjectionEvent:
    def bad(name: str, want: str) -> SkillsError:
        return SkillsError(f"{source}:{lineno}: field {name!r} is {json.dumps(obj.get(name))[:80]}, expected {want}")

    for name in ("timestamp", "agent_role"):
        if not isinstance(obj.get(name), str):
            raise bad(name, "a string")
    for name in ("session_id", "trace_id"):
        if name in obj and not isinstance(obj[name], str):
            raise bad(name, "a string")
    lists = {}
    for name, typ in (("skill_ids", str), ("content_sha256_16", str), ("per_skill_chars", int)):
        v = obj.get(name)
        if not isinstance(v, list) or any(not isinstance(x, typ) or isinstance(x, bool) for x in v):
            raise bad(name, f"a list of {'strings' if typ is str else 'integers'}")
        lists[name] = v
    n = len(lists["skill_ids"])
    for name in ("content_sha256_16", "per_skill_chars"):
        if len(lists[name]) != n:
            raise bad(name, f"{n} entries, one per skill id")
    if any(not _HEX16.fullmatch(h) for h in lists["content_sha256_16"]):
        raise bad("content_sha256_16", "16 lower-case hex digits per skill")
    for name in ("total_chars", "approx_prompt_tokens"):
        if not isinstance(obj.get(name), int) or isinstance(obj.get(name), bool):
            raise bad(name, "an integer")
    try:
        ids = tuple(skill_id(t) for t in lists["skill_ids"])
    except SkillsError as e:
        raise SkillsError(f"{source}:{lineno}: field 'skill_ids': {e}") from e
    return InjectionEvent(source, lineno, obj["timestamp"], obj.get("session_id"), obj.get("trace_id"),
                          obj["agent_role"], ids, tuple(lists["content_sha256_16"]), tuple(lists["per_skill_chars"]),
                          obj["total_chars"], obj["approx_prompt_tokens"])


def _lines_of(path: Path) -> Iterator[bytes]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rb") as fh:
        yield from fh


def read_injections(source: os.PathLike[str] | Iterable[os.PathLike[str]] | Iterable[str | bytes]) -> InjectionLog:
    """The ``SKILL_INJECTION`` events in SAGE's journal lines: ``source`` a journal file (a ``Path``:
    ``.log``/``.jsonl``, gzipped when its name ends in ``.gz``), several files (read in the order given:
    :func:`sage_pipeline.sleep.sage_skills.journal_injections` finds and orders a folder's the way the
    trajectories ingest does), or the lines themselves (``str``/``bytes``). A ``SKILL_INJECTION`` line that
    cannot be used (not JSON, not UTF-8, a field of the wrong type) is a problem naming file, line and field."""
    log = InjectionLog()
    if isinstance(source, str | bytes):
        raise SkillsError(f"read_injections({str(source)[:60]!r}): give a Path (a journal file), a list of Paths, "
                          "or a list of lines; a bare string is neither")
    if isinstance(source, os.PathLike):
        sources: list = [Path(source)]
    else:
        items = list(source)
        sources = [Path(p) for p in items] if items and all(isinstance(p, os.PathLike) for p in items) else [items]
    for src in sources:
        name = str(src) if isinstance(src, Path) else "<lines>"
        lines = _lines_of(src) if isinstance(src, Path) else src
        for lineno, raw in enumerate(lines, start=1):
            log.lines += 1
            if isinstance(raw, Path | os.PathLike):
                raise SkillsError(f"read_injections: {raw} is a path among lines: give paths only, or lines only")
            data = raw.encode("utf-8", errors="surrogateescape") if isinstance(raw, str) else bytes(raw)
            if EVENT.encode() not in data:
                continue
            try:
                obj = json.loads(data.decode("utf-8"))
            except UnicodeDecodeError as e:
                log.problems.append(f"{name}:{lineno}: a {EVENT} line that is not UTF-8 (byte {e.start + 1})")
                continue
            except json.JSONDecodeError as e:
                if data.lstrip()[:1] != b"{":
                    continue  # a text line mentioning the event (SAGE writes none today)
                log.problems.append(f"{name}:{lineno}: a {EVENT} line that is not JSON ({e.msg}, column {e.colno})")
                continue
            if not isinstance(obj, dict) or obj.get("type") != EVENT:
                continue
            try:
                log.events.append(_event(obj, name, lineno))
            except SkillsError as e:
                log.problems.append(str(e))
    return log
