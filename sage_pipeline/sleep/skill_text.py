"""What skill text may reach SAGE's prompts: the line check every edit of SAGE's skills root passes
(:func:`sage_pipeline.sleep.sage_skills.check_edit`, on every commit and rollback) and every rule a night
writes into a learned block (:func:`sage_pipeline.sleep.block.apply_edit`, before the gate spends a call).

SAGE pastes a skill's text, as it reads it, into the *system* message of every agent that selects it
(``prompt_engine/skill_injector.py`` ``_format_skill_block``: ``### <title>`` and the text;
``orchestrator/prefix_builder.py``: ``SKILL DISCIPLINE CONTEXT:`` after the universal prefix). So a line of a
skill can pose as anything else in that prompt. The text is checked as SAGE reads it (:func:`sage_pipeline.
sage.skills.sage_text`: ``\\r\\n`` and a lone ``\\r`` are line ends there, so CRLF files are allowed and a
``\\r`` cannot hide a line from the check), line by line. Refused, each a :class:`SkillTextError` naming the
skill file, the line, what was found and what to do:

``control``
    a control character (Unicode category Cc) other than tab and newline (NUL, ESC, DEL, C1 codes), a
    format character (Cf: zero-width and bidirectional controls, a BOM inside the text, soft hyphen), or a
    line or paragraph separator (U+2028, U+2029). None is in SAGE's nine shipped skills.
``chat_token``
    a chat-template control token anywhere in a line: ``<|...|>`` (ChatML ``<|im_start|>``, ``<|im_end|>``,
    ``<|system|>``, ``<|user|>``, ``<|assistant|>``, ``<|endoftext|>``, Llama 3 ``<|eot_id|>``,
    ``<|start_header_id|>``, ...), its full-width form ``<｜...｜>``, ``[INST]``, ``[/INST]``, ``<<SYS>>``,
    ``<</SYS>>``, ``<s>``, ``</s>``, ``<start_of_turn>``, ``<end_of_turn>``, and role tags such as
    ``<system>``, ``</user>``, ``<assistant_message>`` (case-insensitive).
``role_line``
    a line that starts like a chat message: ``system:``, ``system prompt:``, ``system message:``, ``user:``,
    ``assistant:``, ``human:``, ``developer:`` (``### System:`` and ``**User**:`` too).
``sage_marker``
    a line that mimics one of SAGE's own prompt sections, permission lines or system-prompt openings.
    Matched case-insensitively, after leading whitespace and markdown decoration (``#``, ``>``, ``-``,
    ``*``, ``+``, ``_``, backticks, ``1.``) are dropped, ``*`` and backticks anywhere removed and ``_``
    read as a space; a *label* matches when the line is the label alone, or the label followed by a
    colon or a parenthesis (``TOOL PERMISSIONS:``, ``## Tool permissions``, ``**EXISTING_CODE_CONTEXT**
    (read these...):``), a *prefix* when the line starts with it. From SAGE's code:

    ======================================== =================================================================
    SAGE file                                what this module refuses
    ======================================== =================================================================
    prompt_engine/skill_injector.py          the skill block header ``### sage:<discipline|workflow|planning>:
                                             ...`` (any heading, or a title alone on its line)
    orchestrator/prefix_builder.py           SKILL DISCIPLINE CONTEXT, ORCHESTRATOR NOTES, RELEVANT EXISTING
                                             CODE
    prompt_engine/universal_prefix.py        CODEBASE CONTEXT, USER RULES, ORCHESTRATOR NOTES, WORKSPACE
                                             POLICY, TOOL PERMISSIONS, KNOWN PATTERNS
    execution/workspace_policy.py            Allowed workspace roots; prefixes "Filesystem create/edit/delete
                                             only", "Commands: subprocess"
    execution/tool_policy.py                 Tool policy mode, Denied substrings include, Strict mode
    agents/coder.py                          EXISTING_CODE_CONTEXT, CONVENTIONS_TO_MATCH, EXISTING_SYMBOLS,
                                             INSTRUCTION
    agents/reviewer.py                       STATIC ANALYSIS RESULTS, FILE
    agents/debugger.py                       CONTEXT, ERROR, OUTPUT SCHEMA, RULES; prefix "You are"
    agents/planner.py                        GOAL
    orchestrator/workflow.py                 CODEBASE CONVENTIONS
    memory/rag_retriever.py                  RELEVANT FIX PATTERNS
    memory/docs_rag_retriever.py             RELEVANT DOCS CONTEXT
    cli/shell_chat.py                        prefix "You are"
    prompt_engine/templates/*.md             <Architect|Coder|Debugger|Planner|Reviewer|Test Engineer>
                                             Instructions, Documentation agent, TASK, PROJECT CONTEXT, USER
                                             RULES, RULES, FILE, FILE CONTENT, SOURCE FILE, SOURCE CODE, TEST
                                             FILE TO GENERATE, ERROR REPORT, FAILED FILE, ORIGINAL TASK,
                                             STATIC_ANALYSIS_RESULTS, EXAMPLE, EXAMPLE OUTPUT, ANOTHER
                                             EXAMPLE, EXAMPLE PASS, EXAMPLE FAIL, Output contract, Output
                                             schema, Output format; prefix "NOW OUTPUT THE"
    ======================================== =================================================================

    **SAGE's own lines are exempt from this class only**: SAGE's shipped skills hold three such lines
    (discipline/test-driven-development line 10, "You are operating inside **SAGE** ..."; planning/make-plan
    line 12, ``## Rules``, and line 16, ``- **Goal** (one paragraph)``), and SAGE wrote them. A line of an
    edit that is, character for character, a line of SAGE's shipped file of the same skill
    (:func:`shipped_lines`) is not checked for markers; every other line is, whatever version added it (the
    check compares with SAGE's text, not with the parent version's), so text a version added before this
    check landed is refused too when that skill is edited or rolled back to again (roll the skill back to
    ``v1``, SAGE's tree as shipped, which always passes). The other classes are checked on every line:
    SAGE's nine skills hold none of them.

A second learned-block marker (or an end marker before its begin, or one without the other) is the learned
block's business: :func:`sage_pipeline.sleep.block.parse_document` refuses it, and ``check_edit`` runs it
on every commit, so a text the next night could not parse is never made live.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

from sage_pipeline.sage import skills as sk

KINDS = ("control", "chat_token", "role_line", "sage_marker", "learned_marker")  # the last: sage_skills.check_edit

# -------------------------------------------------------------------------------------------- SAGE's markers
# label -> the SAGE file it comes from (a line is the label alone, or the label and ':' or '(')
SAGE_LABELS: dict[str, str] = {
    "skill discipline context": "orchestrator/prefix_builder.py",
    "relevant existing code": "orchestrator/prefix_builder.py",
    "orchestrator notes": "prompt_engine/universal_prefix.py, orchestrator/prefix_builder.py",
    "codebase context": "prompt_engine/universal_prefix.py",
    "user rules": "prompt_engine/universal_prefix.py, prompt_engine/templates/coder.md",
    "workspace policy": "prompt_engine/universal_prefix.py",
    "tool permissions": "prompt_engine/universal_prefix.py",
    "known patterns": "prompt_engine/universal_prefix.py",
    "allowed workspace roots": "execution/workspace_policy.py",
    "tool policy mode": "execution/tool_policy.py",
    "denied substrings include": "execution/tool_policy.py",
    "strict mode": "execution/tool_policy.py",
    "existing code context": "agents/coder.py, prompt_engine/templates/coder.md",
    "conventions to match": "agents/coder.py",
    "existing symbols": "agents/coder.py, prompt_engine/templates/coder.md",
    "instruction": "agents/coder.py",
    "static analysis results": "agents/reviewer.py, prompt_engine/templates/reviewer.md",
    "file": "agents/reviewer.py, prompt_engine/templates/reviewer.md",
    "context": "agents/debugger.py",
    "error": "agents/debugger.py",
    "output schema": "agents/debugger.py, prompt_engine/templates/debugger.md",
    "rules": "agents/debugger.py, prompt_engine/templates/architect.md",
    "goal": "agents/planner.py",
    "codebase conventions": "orchestrator/workflow.py",
    "relevant fix patterns": "memory/rag_retriever.py",
    "relevant docs context": "memory/docs_rag_retriever.py",
    **{f"{role} instructions": f"prompt_engine/templates/{role.replace(' ', '_')}.md"
       for role in ("architect", "coder", "debugger", "planner", "reviewer", "test engineer")},
    "documentation agent": "prompt_engine/templates/documentation.md",
    "task": "prompt_engine/templates/*.md",
    "project context": "prompt_engine/templates/*.md",
    "file content": "prompt_engine/templates/reviewer.md",
    "source file": "prompt_engine/templates/test_engineer.md",
    "source code": "prompt_engine/templates/test_engineer.md",
    "test file to generate": "prompt_engine/templates/test_engineer.md",
    "error report": "prompt_engine/templates/debugger.md",
    "failed file": "prompt_engine/templates/debugger.md",
    "original task": "prompt_engine/templates/debugger.md",
    "example": "prompt_engine/templates/coder.md",
    "example output": "prompt_engine/templates/architect.md",
    "another example": "prompt_engine/templates/architect.md",
    "example pass": "prompt_engine/templates/reviewer.md",
    "example fail": "prompt_engine/templates/reviewer.md",
    "output contract": "prompt_engine/templates/coder.md",
    "output format": "prompt_engine/templates/planner.md",
}
# prefix -> the SAGE file it comes from (a line that starts with it)
SAGE_PREFIXES: dict[str, str] = {
    "you are": "agents/debugger.py, cli/shell_chat.py",
    "now output the": "prompt_engine/templates/*.md",
    "filesystem create/edit/delete only": "execution/workspace_policy.py",
    "commands: subprocess": "execution/workspace_policy.py",
}
_LABEL_RE = re.compile(r"(" + "|".join(re.escape(k) for k in sorted(SAGE_LABELS, key=len, reverse=True))
                       + r")\s*(?:$|:|\()")
_PREFIX_RE = re.compile(r"(" + "|".join(re.escape(k) for k in SAGE_PREFIXES) + r")\b")
_FOLDERS = "|".join(sk.FOLDERS)
_HEADER_RE = re.compile(rf"\s*(?:>\s*)*#{{1,6}}\s*[*_`]*\s*sage:(?:{_FOLDERS}):", re.IGNORECASE)
_TITLE_RE = re.compile(rf"sage:(?:{_FOLDERS}):\S*")

# -------------------------------------------------------------------------------------------- chat templates
_ROLES = r"(?:system|user|assistant|developer)"
_TOKEN_RE = re.compile(
    r"<\|[^|\s<>]{1,64}\|>"  # ChatML, Llama 3, Phi, ...: <|im_start|>, <|eot_id|>, <|start_header_id|>
    r"|<｜[^｜\s]{1,64}｜>"  # the full-width form (DeepSeek)
    r"|\[/?INST\]|<</?SYS>>"  # Llama 2, Mistral
    r"|</?s>"  # sentence start / end
    r"|<(?:start|end)_of_turn>"  # Gemma
    rf"|</?{_ROLES}(?:[ _-]?(?:prompt|message))?>",  # role tags
    re.IGNORECASE)
_ROLE_LINE_RE = re.compile(r"(system(?: prompt| message)?|user|assistant|human|developer)\s*:")

_DECOR_RE = re.compile(r"^(?:[\s#>*_\-+`~=|]|\d{1,3}[.)](?=\s))*")
_ALLOWED_CONTROLS = frozenset("\t\n")


def _bare(line: str) -> str:
    """A line as the start-of-line checks compare it: leading decoration dropped, ``*`` and backticks removed,
    ``_`` read as a space, case folded, whitespace collapsed."""
    s = _DECOR_RE.sub("", line).replace("*", "").replace("`", "").replace("_", " ")
    return " ".join(s.casefold().split())


@dataclass(frozen=True)
class Finding:
    """One thing in a skill's text that must not reach a prompt: ``line`` (1-based, as SAGE reads the text),
    ``kind`` (one of :data:`KINDS`), ``found`` (what, and where in the line), ``fix`` (what to do)."""

    line: int
    kind: str
    found: str
    fix: str

    def message(self, where: str) -> str:
        return f"{where}:{self.line}: {self.found}. {self.fix}"


class SkillTextError(sk.SkillsError):
    """A skill's text holds something that must not reach SAGE's prompts; ``finding`` says what and where,
    ``findings`` lists every one (the message names the first)."""

    def __init__(self, where: str, findings: list[Finding]) -> None:
        self.where, self.findings, self.finding = where, findings, findings[0]
        more = f" ({len(findings) - 1} more finding(s) in this text besides)" if len(findings) > 1 else ""
        super().__init__(self.finding.message(where) + more + ". Nothing was written")


def _char_name(c: str) -> str:
    return unicodedata.name(c, "") or {"\x00": "NUL", "\x1b": "ESC", "\x7f": "DEL", "\r": "CR"}.get(c, "control")


def line_findings(line: str, lineno: int = 1, *, markers: bool = True) -> list[Finding]:
    """Every finding of one line (without its newline); ``markers=False`` skips the ``sage_marker`` class."""
    out: list[Finding] = []
    for col, c in enumerate(line, start=1):
        if c in _ALLOWED_CONTROLS or unicodedata.category(c) not in ("Cc", "Cf", "Zl", "Zp"):
            continue
        out.append(Finding(lineno, "control", f"control character U+{ord(c):04X} ({_char_name(c)}) at column {col}",
                           "Remove it: SAGE pastes skill text into the system prompt as it is, and of the "
                           "control characters only newlines and tabs belong there"))
        break
    if (m := _TOKEN_RE.search(line)) is not None:
        out.append(Finding(lineno, "chat_token", f"the chat-template control token {m.group(0)!r} at column "
                           f"{m.start() + 1}", "Remove it: a model's chat template reads it as the start or end of "
                           "a message, so the skill would fake a turn of the conversation"))
    bare = _bare(line)
    if (m := _ROLE_LINE_RE.match(bare)) is not None:
        out.append(Finding(lineno, "role_line", f"a line that starts like a chat message of the role "
                           f"{m.group(1)!r} ({line.strip()[:60]!r})", "Reword it so that it does not start with a "
                           "role name and a colon: the skill would pose as a message of that role"))
    if markers:
        hit = None
        if _HEADER_RE.match(line) or _TITLE_RE.fullmatch(bare):
            hit = ("SAGE's skill block header '### sage:<folder>:<skill>'", "prompt_engine/skill_injector.py")
        elif (m := _LABEL_RE.match(bare)) is not None:
            hit = (f"SAGE's prompt section {m.group(1).upper()!r}", SAGE_LABELS[m.group(1)])
        elif (m := _PREFIX_RE.match(bare)) is not None:
            hit = (f"SAGE's prompt line starting {m.group(1)!r}", SAGE_PREFIXES[m.group(1)])
        if hit is not None:
            out.append(Finding(lineno, "sage_marker", f"a line that mimics {hit[0]} of {hit[1]} in SAGE "
                               f"({line.strip()[:60]!r})", "Reword it: a model would read it as part of SAGE's own "
                               "prompt, not of the skill; write it as plain text or a bullet that does not start "
                               "with that label"))
    return out


def findings(text: str, *, trusted: Iterable[str] = ()) -> list[Finding]:
    """Every finding in ``text`` as SAGE reads it; the lines in ``trusted`` (SAGE's own) skip the
    ``sage_marker`` class."""
    trusted = frozenset(trusted)
    seen = sk.sage_text(text.encode("utf-8", errors="surrogatepass"))
    out: list[Finding] = []
    for lineno, line in enumerate(seen.split("\n"), start=1):
        out += line_findings(line, lineno, markers=line not in trusted)
    return out


@cache
def shipped_lines(skill_id: str) -> frozenset[str]:
    """The lines of SAGE's shipped file of ``skill_id`` as SAGE reads it (empty for a file SAGE does not ship)."""
    if skill_id not in sk.SKILL_IDS:
        return frozenset()
    return frozenset(sk.read_skill(sk.SKILL_TREE / skill_id).split("\n"))


def check_skill_text(where: str, text: str, *, trusted: Iterable[str] = ()) -> None:
    """Raise :class:`SkillTextError` (naming ``where``, the line, what was found and what to do) when ``text``
    holds anything of :data:`KINDS`; the lines in ``trusted`` skip the ``sage_marker`` class."""
    found = findings(text, trusted=trusted)
    if found:
        raise SkillTextError(where, found)


def rule_problem(rule: str) -> str:
    """What is wrong with one learned rule (a single line the project writes): "" when nothing, else the first
    finding's "found. fix" (no line: the caller knows where the rule goes)."""
    found = [f for ln in rule.split("\n") for f in line_findings(ln)]
    return f"{found[0].found}. {found[0].fix}" if found else ""
