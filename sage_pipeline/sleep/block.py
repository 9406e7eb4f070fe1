"""The protected learned block inside a skill document or memory, and edits to it.

The nightly cycle edits only the lines between two markers::

    <!-- sage:learned:begin (the nightly sleep cycle edits only between these markers) -->
    - a learned rule
    <!-- sage:learned:end -->

Everything outside the markers is the user's and is never touched: a document is parsed
into ``prefix`` (up to and including the begin line), the block's rules, and ``suffix``
(from the end line on), and rendered back as ``prefix + rules + suffix``. A document
without the block gets one appended at its end (the original text stays a byte-exact
prefix). The block has a size cap; an ``add`` that would pass it is refused, so the
block only grows by replacing or deleting. A rule that must not reach a prompt (a control
character, a chat-template token, a fake role line, a line that mimics SAGE's own prompt
sections: :mod:`sage_pipeline.sleep.skill_text`) is refused as ``invalid``, its reason naming
the document, the line it would be on, what was found and what to do.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field, replace

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_pipeline.sleep import skill_text

BEGIN_MARK = "<!-- sage:learned:begin"
END_MARK = "<!-- sage:learned:end"
BEGIN_LINE = "<!-- sage:learned:begin (the nightly sleep cycle edits only between these markers) -->"
END_LINE = "<!-- sage:learned:end -->"
OPS = ("add", "replace", "delete")
TARGETS = ("skill", "memory")

# Edit statuses. "candidate" is transient (applied, waiting for the gate).
ACCEPTED, REJECTED = "accepted", "rejected"
DROPPED = ("duplicate", "noop", "over_budget", "over_cap", "invalid", "outside_block")
UNMATCHED = "unmatched"


class DocumentError(ValueError):
    """A skill or memory document cannot be used as it is: names the file, the line and the fix."""

    def __init__(self, path: object, problem: str, fix: str, line: int | None = None) -> None:
        self.path, self.line, self.problem, self.fix = str(path), line, problem, fix
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {problem} ({fix})")


def decode_document(raw: bytes, path: object) -> str:
    """UTF-8 text of a document, or a DocumentError naming the first bad byte's line and column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        col = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DocumentError(path, f"not UTF-8: byte {raw[e.start]:#04x} at line {line}, column {col} "
                            f"(offset {e.start})", "re-save the file as UTF-8; the night left it untouched",
                            line) from e


def normalise_rule(text: str) -> str:
    """Case- and whitespace-insensitive form of a rule, without a leading bullet or final period."""
    t = " ".join(text.casefold().split())
    t = re.sub(r"^[-*+]\s+", "", t)
    return t.rstrip(" .;:!")


@dataclass(frozen=True)
class LearnedDoc:
    """A document split around its learned block. ``render()`` gives the document back."""

    path: str
    prefix: str  # up to and including the begin line (with its newline)
    rules: tuple[str, ...]
    suffix: str  # the end line and everything after it
    newline: str = "\n"
    created_block: bool = False

    def render(self, rules: tuple[str, ...] | None = None) -> str:
        rules = self.rules if rules is None else rules
        return self.prefix + "".join(f"- {r}{self.newline}" for r in rules) + self.suffix

    def with_rules(self, rules: tuple[str, ...]) -> LearnedDoc:
        return replace(self, rules=tuple(rules))

    @property
    def outside(self) -> str:
        """The user's text: everything but the block's rules."""
        return self.prefix + self.suffix

    def block_chars(self, rules: tuple[str, ...] | None = None) -> int:
        rules = self.rules if rules is None else rules
        return sum(len(r) + 3 for r in rules)  # "- " + rule + newline


def parse_document(text: str, path: object = "<document>") -> LearnedDoc:
    """Split ``text`` around its learned block; append an empty block when it has none."""
    newline = "\r\n" if "\r\n" in text else "\n"
    lines = text.splitlines(keepends=True)
    begins = [i for i, ln in enumerate(lines) if ln.strip().startswith(BEGIN_MARK)]
    ends = [i for i, ln in enumerate(lines) if ln.strip().startswith(END_MARK)]
    if not begins and not ends:
        if not text or text.endswith(newline * 2):
            sep = ""
        elif text.endswith(("\n", "\r")):
            sep = newline  # a blank line between the user's text and the block
        else:
            sep = newline * 2
        prefix = text + sep + BEGIN_LINE + newline
        return LearnedDoc(str(path), prefix, (), END_LINE + newline, newline, created_block=True)
    fix = f"keep exactly one '{BEGIN_LINE}' line followed by one '{END_LINE}' line"
    if len(begins) != 1:
        where = begins[1] + 1 if len(begins) > 1 else (ends[0] + 1)
        raise DocumentError(path, f"{len(begins)} learned-block begin markers (lines "
                            f"{', '.join(str(i + 1) for i in begins) or 'none'})", fix, where)
    if len(ends) != 1:
        where = ends[1] + 1 if len(ends) > 1 else begins[0] + 1
        raise DocumentError(path, f"{len(ends)} learned-block end markers (lines "
                            f"{', '.join(str(i + 1) for i in ends) or 'none'})", fix, where)
    b, e = begins[0], ends[0]
    if e < b:
        raise DocumentError(path, f"the learned-block end marker (line {e + 1}) comes before its begin marker "
                            f"(line {b + 1})", fix, e + 1)
    rules = tuple(r for r in (_strip_bullet(ln) for ln in lines[b + 1:e]) if r)
    return LearnedDoc(str(path), "".join(lines[:b + 1]), rules, "".join(lines[e:]), newline)


def _strip_bullet(line: str) -> str:
    return re.sub(r"^[-*+]\s+", "", line.strip())


@dataclass
class Edit:
    """One proposed change to a learned block, with what became of it."""

    op: str
    target: str
    content: str = ""
    anchor: str = ""
    rationale: str = ""
    status: str = "proposed"
    reason: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        if self.op == "add":
            return f"add to {self.target}: {self.content!r}"
        if self.op == "replace":
            return f"replace in {self.target}: {self.anchor!r} -> {self.content!r}"
        return f"{self.op} in {self.target}: {self.anchor!r}"


class EditLimits(BaseModel):
    """How much one night may change the learned blocks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    edit_budget: int = Field(4, ge=1, description="at most this many edits per night")
    block_max_chars: int = Field(1500, description="size cap of each learned block: past it, edits must replace or "
                                 "delete")
    max_rule_chars: int = Field(300, ge=10, description="the longest rule an edit may write")

    @model_validator(mode="after")
    def _a_block_holds_a_rule(self) -> EditLimits:
        if self.block_max_chars < self.max_rule_chars + 3:
            raise ValueError(f"block_max_chars ({self.block_max_chars}) must hold at least one rule of "
                             f"max_rule_chars ({self.max_rule_chars}) and its 3-character bullet")
        return self


@dataclass
class ApplyOutcome:
    docs: dict[str, LearnedDoc] | None  # None when the edit was not applied
    status: str  # "candidate" or a dropped / unmatched status
    reason: str = ""


def apply_edit(docs: dict[str, LearnedDoc], edit: Edit, limits: EditLimits,
               targets: tuple[str, ...] = TARGETS) -> ApplyOutcome:
    """Apply one edit to the learned block of its target; never touches text outside it.

    ``docs`` holds every document (duplicates are looked for in all of them); ``targets``
    are the ones that may be edited tonight.
    """
    if edit.op not in OPS:
        return ApplyOutcome(None, "invalid", f"unknown op {edit.op!r}: use add, replace or delete")
    if edit.target not in TARGETS:
        return ApplyOutcome(None, "outside_block" if edit.target else "invalid",
                            f"target {edit.target!r}: edits go to the learned block of 'skill' or 'memory' only")
    if edit.target not in docs or edit.target not in targets:
        return ApplyOutcome(None, "invalid", f"target {edit.target!r} is not evolved tonight")
    doc = docs[edit.target]
    rules = list(doc.rules)
    norms = [normalise_rule(r) for r in rules]
    others = {t: [normalise_rule(r) for r in d.rules] for t, d in docs.items() if t != edit.target}
    outside = normalise_rule("\n".join(d.outside for d in docs.values()))
    if edit.op in ("add", "replace"):
        problem = _content_problem(edit.content, limits)
        if problem:
            return ApplyOutcome(None, "invalid", problem)
    content = " ".join(edit.content.split())
    unsafe = skill_text.rule_problem(content) if edit.op in ("add", "replace") else ""
    if unsafe:  # refused before the gate spends a call on it (what reaches a prompt: sleep/skill_text.py)
        index = len(rules) if edit.op == "add" else _find_anchor(edit.anchor, norms, others, outside)[0]
        return ApplyOutcome(None, "invalid", f"{doc.path}{_rule_line(doc, index)}, the rule this edit writes: "
                            f"{unsafe}")
    n = normalise_rule(content)
    dup_elsewhere = [t for t, ns in others.items() if n in ns]
    if edit.op == "add":
        if n in norms:
            return ApplyOutcome(None, "duplicate", "the block already holds this rule")
        if dup_elsewhere:
            return ApplyOutcome(None, "duplicate", f"the {dup_elsewhere[0]} block already holds this rule")
        if n in outside:
            return ApplyOutcome(None, "duplicate", "a document already says this outside its learned block")
        new = (*rules, content)
    else:
        idx, why = _find_anchor(edit.anchor, norms, others, outside)
        if idx is None:
            return ApplyOutcome(None, *why)
        if edit.op == "delete":
            new = tuple(r for i, r in enumerate(rules) if i != idx)
        else:
            if n == norms[idx]:
                return ApplyOutcome(None, "noop", "the replacement equals the rule it replaces")
            if n in norms or dup_elsewhere or n in outside:
                return ApplyOutcome(None, "duplicate", "the replacement duplicates a rule the documents already hold")
            new = tuple(content if i == idx else r for i, r in enumerate(rules))
    size = doc.block_chars(new)
    if size > limits.block_max_chars and size > doc.block_chars():
        return ApplyOutcome(None, "over_cap", f"the block would hold {size} characters, over its cap of "
                            f"{limits.block_max_chars}: replace or delete a rule instead")
    return ApplyOutcome({**docs, edit.target: doc.with_rules(new)}, "candidate")


def _rule_line(doc: LearnedDoc, index: int | None) -> str:
    """``:<line>`` of the document where rule ``index`` of its block is (or goes); "" when not known."""
    return "" if index is None else f":{doc.prefix.count(chr(10)) + index + 1}"


def _content_problem(content: object, limits: EditLimits) -> str:
    if not isinstance(content, str) or not content.strip():
        return "empty content"
    if "\n" in content.strip() or "\r" in content:
        return "content spans several lines: one rule per edit"
    if "sage:learned" in content or "<!--" in content or "-->" in content:
        return "content holds a block marker or an HTML comment"
    if len(content.strip()) > limits.max_rule_chars:
        return f"content has {len(content.strip())} characters, over max_rule_chars {limits.max_rule_chars}"
    return ""


def _find_anchor(anchor: str, norms: list[str], others: dict[str, list[str]],
                 outside: str) -> tuple[int | None, tuple[str, str]]:
    a = normalise_rule(anchor or "")
    if not a:
        return None, ("invalid", "replace and delete need the anchor: the rule of the block they change")
    if a in norms:
        return norms.index(a), ("", "")
    hits = [i for i, n in enumerate(norms) if a in n]
    if len(hits) == 1:
        return hits[0], ("", "")
    if len(hits) > 1:
        return None, (UNMATCHED, f"the anchor matches {len(hits)} rules of the block: quote one rule whole")
    elsewhere = [t for t, ns in others.items() if any(a in n for n in ns)]
    if elsewhere:
        return None, (UNMATCHED, f"the anchor is a rule of the {elsewhere[0]} block, not of this target's block")
    if a in outside:
        return None, ("outside_block", "the anchor is text outside the learned block, which the cycle never edits")
    return None, (UNMATCHED, "no rule of the learned block matches the anchor")


@dataclass
class Screened:
    """Edits after screening: the ones to gate, in order, and everything dropped."""

    candidates: list[Edit] = field(default_factory=list)
    dropped: list[Edit] = field(default_factory=list)


def screen_edits(docs: dict[str, LearnedDoc], edits: list[Edit], limits: EditLimits,
                 targets: tuple[str, ...] = TARGETS) -> Screened:
    """Drop invalid, duplicate, no-op, over-cap, unmatched, outside-block and over-budget edits.

    Edits are screened in order as if every earlier candidate were applied, so a reply that
    proposes the same rule twice keeps the first.
    """
    out = Screened()
    state = dict(docs)
    for i, e in enumerate(edits):
        if i >= limits.edit_budget:
            e.status, e.reason = "over_budget", f"edit {i + 1} of a reply limited to edit_budget {limits.edit_budget}"
            out.dropped.append(e)
            continue
        res = apply_edit(state, e, limits, targets)
        if res.docs is None:
            e.status, e.reason = res.status, res.reason
            out.dropped.append(e)
            continue
        e.status = "candidate"
        out.candidates.append(e)
        state = res.docs
    return out
