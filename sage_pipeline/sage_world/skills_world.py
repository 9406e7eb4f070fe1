"""Skills in the model world: a TEST HARNESS, off by default and never a claim about real models.

It exists to measure the sleep cycle's gate end to end (its false-accept rate and its power) with
SAGE's real ``sage run``: the world reads the skills SAGE injected into each call's prompt, and in
``planted`` mode a stated instruction, when SAGE injected it into one role's prompt, raises that role's
chance of a right answer by a stated delta. The numbers are chosen here and stated in
:class:`SkillsWorldConfig`; nothing says a real model reacts to any skill this way.

**Modes** (``ModelWorld(..., skills=SkillsWorldConfig(mode=...))``; the harness is never part of the
Dagster job's config):

* ``off`` (the default): the world is exactly what it was without this module: it never reads a
  prompt's skills, its truth records carry no skill fields, and a reflect request is refused as any
  request that is not a SAGE agent's.
* ``null``: skills never change an answer; each call's truth record lists the skills SAGE injected
  (:func:`injected_skills`) with their shas, and whether the instruction was among them.
* ``planted``: as ``null``, and when the call's agent is ``role`` and the instruction is in the skills
  SAGE injected into that call, the role's chance is ``min(1, max(0, p + delta))`` instead of ``p`` (the
  coder's first-attempt chance, the reviewer's accuracy, or the debugger's repair chance). The world's
  draw for the call is the same number either way (seeded by run, agent and call, as always), so a call
  answered right without the instruction is answered right with it.

**Where SAGE puts the skills** (read in SAGE's code): ``orchestrator/prefix_builder.py``
``build_prefix_for_agent`` returns the universal prefix followed by ``"\\n\\nSKILL DISCIPLINE CONTEXT:\\n"``
and the injector's text (blocks ``### sage:<folder>:<rel>\\n<body stripped>`` joined by a blank line);
every agent puts that prefix at the head of its **system** message, followed by ``"\\n\\n"`` and its own
instructions (``agents/*.py``: ``system = universal_prefix + "\\n\\n" + system``; the debugger's
``_build_debug_prompt``: ``prefix + "\\n\\n" + structured_instructions``). So the injected text runs from
the heading to the first ``"\\n\\n" + TEMPLATE_HEADS[agent]`` after it (each head is the first line of
that agent's instructions: its template in ``prompt_engine/templates/``, the debugger's structured
instructions). A body holding a line ``### sage:...`` after a blank line, or its agent's head after a
blank line, would be split there (SAGE's shipped skills hold neither).

**Shas.** A prompt shows each body stripped; SAGE logs ``content_sha256_16`` of the body before the
strip. The world records the shown text's sha (``shown_sha16``), and SAGE's logged ``sha16`` and
``chars`` when it was told the tree (:meth:`SkillsWorld.know`, e.g. each version of a
``SageSkillsRoot`` as it goes live) and the body was not cut by SAGE's total cap; otherwise ``None``.

**Reflect calls** (the sleep cycle's reflect, ``sleep/prompts.py`` ``reflect_messages``) are recognised by
the reflect prompt's own first sentence (:data:`REFLECT_MARKER`, at the head of its system message) when
the mode is not ``off``, through ``/api/chat`` and the OpenAI-compatible ``/v1/chat/completions``
(``server.py``). The reply is ``{"edits": [...]}`` in ``parse_reflect_reply``'s format: ``reflect_useless``
plausible rules that change nothing (seeded), each an ``add`` to a target drawn from the request's
targets, and in ``planted`` mode the instruction, with probability ``reflect_propose`` per call (unless
the request already holds it), an ``add`` to ``reflect_target`` (or, when the request does not offer it,
the first offered target that is a skill SAGE injects into ``role``, else the first target). The
instruction is never cut for the edit budget (useless rules are). Draws are seeded by (seed, the prompt's
sha, how many times that prompt was asked before): the same seed gives the same replies whatever
order concurrent calls arrive in, and asking the same prompt again draws afresh.

**The truth** (exact): :meth:`ModelWorld.chance` gives a role's chance with or without the instruction
live, and :func:`skills_effect` says whether a skills tree carries the instruction into the role's
prompt, by SAGE's own selection, path rule and caps (:func:`sage_pipeline.sage.skills.injection`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sage_pipeline.sage import skills as sk

PLANTED_INSTRUCTION = ("Before you return the file, run the function by hand on every example the task gives and "
                       "fix any that disagree.")
# sleep/prompts.py reflect_messages: the first sentence of its system message
REFLECT_MARKER = "You improve an agent's skill document and memory from its failures."
# what each SAGE agent writes right after its universal prefix (and "\n\n"): its instructions' first line
TEMPLATE_HEADS = {
    "planner": "# Planner Instructions",  # prompt_engine/templates/planner.md
    "coder": "# Coder Instructions",
    "debugger": "\nYou are a structured debugger.",  # agents/debugger.py _build_debug_prompt
    "reviewer": "# Reviewer Instructions",
    "test_engineer": "# Test Engineer Instructions",
    "documentation": "# Documentation agent",
    "architect": "# Architect Instructions",
}
PLANTABLE = ("coder", "reviewer", "debugger")  # the roles whose answers the world draws with a chance
_HEADING = re.compile(rf"(?:^|\n\n)### (sage:(?:{'|'.join(sk.FOLDERS)}):[^\n]+)\n")
_BUDGET = re.compile(r"Propose at most (\d+) edits")
_TARGETS = re.compile(r"Targets you may edit: (.+?)\. Each rule")
_RULE_CHARS = re.compile(r"Each rule is one line of at most (\d+) characters")


class SkillsWorldError(ValueError):
    """A request or a setting the skills harness cannot use; the message says what and what to do."""


class SkillsWorldConfig(BaseModel):
    """The skills harness's stated numbers (each default declared here once; see the module doc)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    mode: Literal["off", "null", "planted"] = Field("off", description="off: the world ignores skills; null: it "
                                                    "records them, answers unchanged; planted: the instruction "
                                                    "in the role's injected skills adds delta to its chance")
    role: Literal["coder", "reviewer", "debugger"] = Field("coder", description="the role the planted "
                                                           "instruction acts on")
    instruction: str = Field(PLANTED_INSTRUCTION, min_length=20, max_length=300,
                             description="the planted instruction: one distinctive sentence, matched in the "
                                         "injected text case- and whitespace-insensitively")
    delta: float = Field(0.15, ge=-1.0, le=1.0, description="added to the role's chance of a right answer "
                         "when the instruction is live (the result clipped to [0, 1])")
    seed: int = Field(0, description="seeds the reflect replies")
    reflect_useless: int = Field(3, ge=0, le=20, description="useless rules each reflect reply proposes (fewer "
                                 "when the request's edit budget is smaller)")
    reflect_propose: float = Field(0.5, ge=0.0, le=1.0, description="planted mode: the chance a reflect reply "
                                   "proposes the instruction")
    reflect_target: str = Field("skill", min_length=1, description="the reflect target the instruction is "
                                "proposed for, when the request offers it")

    @field_validator("instruction")
    @classmethod
    def _one_line(cls, v: str) -> str:
        if "\n" in v or "\r" in v or not v.strip():
            raise ValueError("the instruction must be one non-blank line (a reflect edit is one line)")
        return v


def normalise(text: str) -> str:
    """Case- and whitespace-insensitive form of a text (runs of whitespace read as one space)."""
    return " ".join(text.casefold().split())


def carries(text: str, instruction: str) -> bool:
    """Whether ``text`` holds ``instruction`` (case and whitespace ignored; a final period optional)."""
    return normalise(instruction).rstrip(" .;:!") in normalise(text)


@dataclass(frozen=True)
class SeenSkill:
    """One skill block SAGE put in a prompt: the file it read (relative to the skills root) and its
    body as shown (stripped)."""

    skill_id: str
    text: str

    @property
    def shown_sha16(self) -> str:
        return sk.sha16(self.text)


def _system(messages: Sequence[dict]) -> str:
    return next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")


def injected_skills(messages: Sequence[dict], agent: str) -> tuple[SeenSkill, ...]:
    """The skills SAGE injected into ``agent``'s request ``messages``, in order (none when its system
    message has no ``SKILL DISCIPLINE CONTEXT``)."""
    system = _system(messages)
    start = system.find(sk.PREFIX_HEADING)
    if start < 0:
        return ()
    start += len(sk.PREFIX_HEADING)
    head = TEMPLATE_HEADS.get(agent)
    end = system.find("\n\n" + head, start) if head else -1
    block = system[start:end if end >= 0 else len(system)]
    marks = list(_HEADING.finditer(block))
    out = []
    for i, m in enumerate(marks):
        if i == 0 and m.start() != 0:
            return ()  # the context does not start with a skill block: not SAGE's injector's text
        stop = marks[i + 1].start() if i + 1 < len(marks) else len(block)
        out.append(SeenSkill(sk.skill_id(m.group(1)), block[m.end():stop]))
    return tuple(out)


@dataclass(frozen=True)
class SkillsEffect:
    """Whether a skills tree carries the instruction into a role's prompt, and why."""

    live: bool
    skill: str | None  # the injected skill that carries it (live), or the file that holds it (not live)
    reason: str


def _texts(tree: Mapping[str, str] | str | os.PathLike[str]) -> dict[str, str]:
    files = dict.fromkeys((*sk.SKILL_IDS, *sk.READ_FILES))
    if isinstance(tree, Mapping):
        return {f: tree.get(f, "") or "" for f in files}
    base = Path(tree)
    if not base.is_dir():
        raise SkillsWorldError(f"{base}: not a skills tree folder (a SageSkillsRoot version folder holds "
                               f"{sk.SKILL_IDS[0]} and the other skills)")
    return {f: sk.read_skill(base / f) for f in files}


def skills_effect(skill_texts_by_id: Mapping[str, str] | str | os.PathLike[str],
                  config: SkillsWorldConfig | None = None, *, role: str | None = None, task_description: str = "",
                  last_error: str = "", total_cap: int | str | None = None) -> SkillsEffect:
    """Whether SAGE injects ``config.instruction`` into ``role``'s prompt (default ``config.role``) from a
    skills tree (skill id -> text, e.g. ``SageSkillsRoot.texts(version)``, or a version folder), for a call
    with ``task_description`` and ``last_error`` (in ``sage run`` the coder's task description is the run's
    goal, ``harness.goal(run, prompt)``, and its last error is empty: ``sage/skills.py`` lists every role's)
    under ``SAGE_MAX_SKILL_CHARS_TOTAL`` = ``total_cap``: by :func:`sage_pipeline.sage.skills.injection`,
    so SAGE's selection, path rule and caps decide (an instruction past the per-skill cap, cut by the total
    cap, or in ``workflow/tdd-workflow/SKILL.md``, which SAGE never reads, has no effect)."""
    cfg = config or SkillsWorldConfig()
    role = role or cfg.role
    texts = _texts(skill_texts_by_id)
    inj = sk.injection(texts, role, task_description, last_error, total_cap)
    for s in inj.skills:
        if carries(texts[s.skill_id][:s.chars], cfg.instruction):
            return SkillsEffect(True, s.skill_id, f"{s.skill_id} carries the instruction and SAGE injects it into "
                                                  f"the {role}'s prompt")
    holders = [f for f in texts if carries(texts[f], cfg.instruction)]
    for f in holders:
        got = next((s for s in inj.skills if s.skill_id == f), None)
        if got is not None or f in inj.dropped:
            cap = ("the per-skill cap of 3,200 characters" if got is not None and got.chars == sk.PER_SKILL_CAP
                   else f"the total cap of {inj.cap} characters")
            return SkillsEffect(False, f, f"{f} holds the instruction past what SAGE injects of it into the "
                                          f"{role}'s prompt ({cap})")
    for f in holders:
        if f in sk.NEVER_READ:
            return SkillsEffect(False, f, f"{f} holds the instruction, but SAGE never reads that file (its path "
                                          f"rule reads {sk.resolve(f)[0]} instead)")
    if holders:
        return SkillsEffect(False, holders[0], f"{holders[0]} holds the instruction, but SAGE does not inject it "
                                               f"into the {role}'s prompt (its selection for this task and error)")
    return SkillsEffect(False, None, "no skill of the tree holds the instruction")


def _rng(seed: int, *key: object) -> np.random.Generator:
    digest = hashlib.sha256(json.dumps([seed, *map(str, key)]).encode()).digest()
    return np.random.default_rng(int.from_bytes(digest[:16], "little"))


_USELESS = (
    "Name each helper after what it returns, not how it computes it.",
    "Keep every line of the answer under {n} characters.",
    "Put the imports of the module in {order} order.",
    "Write a one-line docstring for every {thing}.",
    "Use {quote} quotes for string literals.",
    "Prefer a {loop} over an index-based loop where both work.",
    "Leave one blank line between the {thing}s of the module.",
    "State the Python version the answer assumes in a comment.",
    "Avoid single-letter names for {thing} arguments.",
    "Return early from a {thing} instead of nesting conditions.",
)
_PARTS = {"n": ("88", "100", "120"), "order": ("alphabetical", "standard-library-first", "length"),
          "thing": ("function", "helper", "public function", "class"), "quote": ("double", "single"),
          "loop": ("for-each loop", "comprehension", "generator expression")}


def useless_rule(rng: np.random.Generator) -> str:
    """A plausible rule that changes nothing in the world: one of a fixed set of style rules, seeded."""
    t = _USELESS[int(rng.integers(len(_USELESS)))]
    return t.format(**{k: v[int(rng.integers(len(v)))] for k, v in _PARTS.items()})


class SkillsWorld:
    """The world's skills harness (one per :class:`ModelWorld`, ``world.skills``); thread-safe."""

    def __init__(self, config: SkillsWorldConfig | None = None) -> None:
        self.config = config or SkillsWorldConfig()
        self._index: dict[tuple[str, str], tuple[str, int]] = {}
        self._asked: Counter = Counter()  # reflect prompt sha -> times asked
        self._lock = threading.Lock()
        self.reflects: list[dict] = []  # one record per reflect reply, in answer order

    @property
    def on(self) -> bool:
        return self.config.mode != "off"

    # ------------------------------------------------------------------ SAGE's agents
    def know(self, tree: Mapping[str, str] | str | os.PathLike[str]) -> None:
        """Tell the world a skills tree SAGE may inject from (skill id -> text, or a version folder), so the
        calls that show its skills record SAGE's logged sha and length (a body the total cap cut stays
        unresolved: ``None``)."""
        texts = _texts(tree)
        entries = {}
        for f in sk.READ_FILES:
            t = texts[f]
            if not t.strip():
                continue
            body = t[:sk.PER_SKILL_CAP]
            entries[f, sk.sha16(body.strip()[:sk.BLOCK_CAP])] = (sk.sha16(body), len(body))
        with self._lock:
            self._index.update(entries)

    def seen(self, agent: str, messages: Sequence[dict]) -> tuple[tuple[SeenSkill, ...], bool]:
        """(the skills SAGE injected into this request, whether the instruction is among them)."""
        got = injected_skills(messages, agent)
        return got, any(carries(s.text, self.config.instruction) for s in got)

    def describe(self, seen: Sequence[SeenSkill]) -> list[dict]:
        """The truth record's ``skills``: per skill its id, the shown text's sha and, when the world knows
        the tree, SAGE's logged ``sha16`` and ``chars`` (else None)."""
        out = []
        with self._lock:
            for s in seen:
                shown = s.shown_sha16
                sha, chars = self._index.get((s.skill_id, shown), (None, None))
                out.append({"skill_id": s.skill_id, "shown_sha16": shown, "sha16": sha, "chars": chars})
        return out

    def chance(self, role: str, p: float, instruction_live: bool) -> float:
        """``p`` (the role's chance without the instruction), moved by ``delta`` when the mode is planted,
        ``role`` is the planted role and the instruction is live; clipped to [0, 1]."""
        c = self.config
        if c.mode == "planted" and role == c.role and instruction_live:
            return min(1.0, max(0.0, p + c.delta))
        return p

    # ------------------------------------------------------------------ reflect
    def is_reflect(self, messages: Sequence[dict]) -> bool:
        """Whether the mode is not off and ``messages`` are the sleep cycle's reflect request."""
        return self.on and _system(messages).startswith(REFLECT_MARKER)

    def _instruction_target(self, targets: list[str]) -> str:
        c = self.config
        if c.reflect_target in targets:
            return c.reflect_target
        injected = set(s.skill_id for s in sk.injection({f: "x" for f in sk.READ_FILES}, c.role).skills)
        return next((t for t in targets if t in injected), targets[0])

    def reflect(self, model: str, messages: Sequence[dict]) -> tuple[str, dict]:
        """The reply to a reflect request (see the module doc) and its record."""
        c = self.config
        system = _system(messages)
        prompt = "\n".join(f"{m.get('role', '')}: {m.get('content') or ''}" for m in messages)
        budget, targets, limit = _BUDGET.search(system), _TARGETS.search(system), _RULE_CHARS.search(system)
        if budget is None or targets is None or limit is None:
            missing = [n for n, m in (("edit budget", budget), ("targets", targets), ("rule length", limit))
                       if m is None]
            raise SkillsWorldError(f"reflect request without its {', '.join(missing)} (the system message of "
                                   "sleep/prompts.py reflect_messages states them): the world cannot answer it")
        budget_n, max_chars = int(budget.group(1)), int(limit.group(1))
        offered = [t.strip() for t in targets.group(1).split(",") if t.strip()]
        if not offered:
            raise SkillsWorldError("reflect request offers no target to edit ('Targets you may edit:' is empty)")
        key = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
        with self._lock:
            n = self._asked[key]
            self._asked[key] += 1
        rng = _rng(c.seed, "reflect", key, n)
        # every draw is made whatever the mode, so a null and a planted world give the same useless rules
        u = rng.random()
        rules = [(useless_rule(rng), offered[int(rng.integers(len(offered)))]) for _ in range(c.reflect_useless)]
        at = rng.random()
        propose = c.mode == "planted" and u < c.reflect_propose and not carries(prompt, c.instruction)
        if propose and len(c.instruction) > max_chars:
            raise SkillsWorldError(f"the planted instruction is {len(c.instruction)} characters, over the reflect "
                                   f"request's limit of {max_chars} per rule: shorten SkillsWorldConfig.instruction "
                                   "or raise the cycle's max_rule_chars")
        edits = [{"op": "add", "target": t, "content": r[:max_chars], "anchor": "",
                  "rationale": "keeps answers uniform"} for r, t in rules]
        edits = edits[:max(0, budget_n - int(propose))]
        if propose:
            edits.insert(int(at * (len(edits) + 1)), {
                "op": "add", "target": self._instruction_target(offered), "content": c.instruction, "anchor": "",
                "rationale": "the failures disagreed with the task's own examples"})
        rec = {"agent": "reflect", "model": model, "prompt_sha16": key[:16], "asked": n, "mode": c.mode,
               "proposed_instruction": propose, "useless": len(edits) - int(propose), "targets": offered}
        with self._lock:
            self.reflects.append(rec)
        return json.dumps({"edits": edits}), rec
