"""Reflect's prompt, and the parsers of the replies that must be JSON.

Reflect must answer ``{"edits": [{"op", "target", "content", "anchor", "rationale"}]}``, each target one of
the skill ids the night offers (``sage_night`` puts them in the prompt's target hint). A reply that is not
that JSON raises :class:`ReplyFormatError` with the reply's head, so the night can say what came back
instead of guessing. (The system message's first sentence is what the model world recognises a reflect
call by: ``sage_world/skills_world.py`` ``REFLECT_MARKER``.)
"""

from __future__ import annotations

import json
import re

from sage_pipeline.sleep.block import Edit
from sage_pipeline.sleep.records import ReflectRequest, TaskRecord

HEAD = 300


class ReplyFormatError(ValueError):
    """A reply that had to be JSON of a given shape was not."""

    def __init__(self, what: str, problem: str, reply: str) -> None:
        self.what, self.problem, self.head = what, problem, reply[:HEAD]
        super().__init__(f"{what} reply {problem}: {self.head!r}")


def reflect_messages(req: ReflectRequest) -> list[dict]:
    def block(target: str) -> str:
        rules = req.blocks.get(target, ())
        return "\n".join(f"- {r}" for r in rules) or "(empty)"

    def case(t: TaskRecord, r) -> str:
        return (f"- task {t.id}: {t.intent.strip()[:400]}\n  answer head: {r.response_head[:200]!r}\n"
                f"  why it failed: {r.why[:200] or '-'}")

    targets = ", ".join(sorted(req.blocks))
    sysmsg = (
        "You improve an agent's skill document and memory from its failures. You may only change the "
        "learned block of each document (a list of short rules); the rest of each document is read-only. "
        f"Propose at most {req.edit_budget} edits. Reply with JSON only, no prose:\n"
        '{"edits": [{"op": "add" | "replace" | "delete", "target": "skill" | "memory", '
        '"content": "<the new rule, one line>", "anchor": "<for replace/delete: the rule of the block to change>", '
        '"rationale": "<why>"}]}\n'
        f"Targets you may edit: {targets}. Each rule is one line of at most {req.max_rule_chars} characters. "
        f"Each block holds at most {req.block_max_chars} characters: when a block is nearly full, replace or "
        "delete rules instead of adding. Prefer general rules that fix several failures; never propose a rule "
        "that would make the successes fail.")
    parts = [f"Skill: {req.skill_name}"]
    for target in sorted(req.blocks):
        parts.append(f"## {target} document (read-only outside the learned block)\n{req.documents[target]}")
        parts.append(f"## {target} learned block ({req.room.get(target, 0)} characters left)\n{block(target)}")
    parts.append("## Failures (train)\n" + ("\n".join(case(t, r) for t, r in req.failures) or "(none)"))
    parts.append("## Successes (train)\n" + ("\n".join(f"- task {t.id}: {t.intent.strip()[:200]}"
                                                        for t, _ in req.successes) or "(none)"))
    return [{"role": "system", "content": sysmsg}, {"role": "user", "content": "\n\n".join(parts)}]


def extract_json(text: str) -> object:
    """The JSON value of a reply: the whole reply, a fenced ```json block, or the outermost {...}."""
    s = text.strip()
    m = re.search(r"```(?:json)?\s*\n(.*?)```", s, re.DOTALL)
    candidates = [s] + ([m.group(1)] if m else [])
    i, j = s.find("{"), s.rfind("}")
    if 0 <= i < j:
        candidates.append(s[i:j + 1])
    for c in candidates:
        try:
            return json.loads(c)
        except json.JSONDecodeError:
            continue
    raise ValueError("is not valid JSON")


def parse_reflect_reply(text: str) -> list[Edit]:
    """Edits of a reflect reply; items that are not edit objects come back with status ``invalid``."""
    if not text.strip():
        raise ReplyFormatError("reflect", "is empty", text)
    try:
        obj = extract_json(text)
    except ValueError as e:
        raise ReplyFormatError("reflect", str(e), text) from e
    if isinstance(obj, dict) and "edits" in obj:
        items = obj["edits"]
    elif isinstance(obj, list):
        items = obj
    else:
        raise ReplyFormatError("reflect", 'is JSON but not {"edits": [...]}', text)
    if not isinstance(items, list):
        raise ReplyFormatError("reflect", '"edits" is not a list', text)
    edits = []
    for i, it in enumerate(items):
        if not isinstance(it, dict):
            edits.append(Edit(op="", target="", status="invalid",
                              reason=f"edit {i + 1} is not an object: {it!r}"[:200]))
            continue
        vals = {k: it.get(k, "") for k in ("op", "target", "content", "anchor", "rationale")}
        bad = [k for k, v in vals.items() if not isinstance(v, str)]
        if bad:
            edits.append(Edit(op=str(vals["op"]), target=str(vals["target"]), status="invalid",
                              reason=f"edit {i + 1}: {', '.join(bad)} must be strings"))
            continue
        edits.append(Edit(op=vals["op"].strip().lower(), target=vals["target"].strip().lower(),
                          content=vals["content"], anchor=vals["anchor"], rationale=vals["rationale"]))
    return edits
