"""One night of the sleep cycle on SAGE's own skills: replayed as SAGE would, judged by the tests SAGE's
test engineer wrote, gated by the paired test, committed as a new version of the project's SAGE skills root.

:func:`run_sage_night` runs the night for one role (the coder) on tasks harvested from SAGE's runs
(:func:`~sage_pipeline.sleep.sage_harvest.harvest_sage`); :func:`run_sage_skills` is the whole of what the
Dagster asset does: harvest, the online check of the deployed versions (:mod:`.sage_online`), the night.

1. **Splits.** A task's *test* split is the stable hash of its id (``SplitSpec.of``): held out, scored only
   after the decision. The others are split afresh every night: a task is in tonight's *val* slice when a
   hash of (the night's date, its id) falls under ``val / (train + val)``, so the val slice is drawn anew
   each night (seeded by the date) and a rule is never re-selected night after night on the same val
   tasks; the rest is *train*. A task that cannot be replayed (not a ``unit_tests`` reference, an empty
   goal, a duplicate id) is counted by reason and left out: one bad task never stops the night.
2. **Replay as SAGE would** (:func:`role_messages`). SAGE's coder sends a system message that is SAGE's
   universal prefix, then ``"\\n\\nSKILL DISCIPLINE CONTEXT:\\n"`` and the skills SAGE's injector gives
   (``orchestrator/prefix_builder.py``), then ``"\\n\\n"`` and its own instructions (``agents/coder.py``,
   ``prompt_engine/templates/coder.md``), and the user message ``"Implement the following task.\\n\\nTASK:
   ..."``. The replay builds the same shape: the prefix's sections empty (a fresh workspace), the skills
   exactly as :func:`sage_pipeline.sage.skills.injection` gives them for the *candidate* tree (role, the task's
   goal as ``task_description``: in ``sage run`` the coder's is the user's prompt, and ``last_error`` ""), a
   condensed form of SAGE's coder instructions, and the goal. SAGE's coder sees the planner's description
   of the task, which SAGE logs nowhere; the replay gives the goal with the file and the function the
   tests import. The call goes through the backend's ``complete`` (:mod:`sage_pipeline.sleep.backends`:
   Ollama's native ``/api/chat`` as SAGE calls it, or any OpenAI-compatible server); the answer is SAGE's
   PatchRequest JSON, its ``patch`` is the code (a fenced block or the whole answer when it is not that
   JSON), judged by the task's tests in the sandbox (:class:`~sage_pipeline.sleep.judges.UnitTestJudge`).
3. **Reflect** proposes rules for the skills SAGE injects into the role (the targets are their skill ids,
   e.g. ``discipline/test-driven-development/SKILL.md``), in the cycle's format
   (:func:`sage_pipeline.sleep.prompts.reflect_messages`). A rule goes into the protected learned block at
   the end of that ``SKILL.md`` (:mod:`sage_pipeline.sleep.block`), so every edit is visible, reviewable and
   revertible. Refused, with the reason: the tdd-workflow skill (``never_injected``: SAGE's path rule never
   reads it), a skill SAGE does not inject into this role (``not_injected``), an edit after which SAGE would
   cut the skill at its per-skill cap or cut more of some role's prompt at its total cap
   (``over_sage_cap``: :func:`sage_pipeline.sage.skills.check_text`), and what the block refuses
   (duplicates, over its own cap, ...).
4. **The gate** is :func:`sage_pipeline.sleep.gate.compare` (the paired sign-flip test at a stated
   false-accept level, ``samples`` replays per task against a backend that draws fresh answers, a bound
   on tasks that drop significantly, ``cannot_tell`` with the val tasks it would need). Each edit (or all
   of them: ``granularity``) is tried on top of what was accepted so far; an accepted candidate is
   committed as a new live version (:meth:`SageSkillsRoot.commit`, parent = the version the night
   started from, with the night's reason); a skills root changed meanwhile is a ``conflict``. This is
   ``decisions="per_night"``: a test valid **for one night only** (each night decides from scratch at its own
   level, so over a month of nights useless edits pile up and a rule that could not be told apart is
   forgotten); kept for comparison.

   **The ledger** (``decisions="ledger"``, the default) decides instead, on evidence carried across nights
   (:mod:`sage_pipeline.decisions.skills`, the ledger at ``<data>/decisions/ledger.json``): each rule reflect
   proposes is a candidate keyed by its skill and normalised text (proposed again, it continues), selected on
   the train tasks reflect saw; every night the pending candidates with the most evidence (``candidates_per_night``)
   are replayed on tonight's val tasks beside the live tree, each task one paired observation of the hard
   pass; the most recently accepted rules (``probation_replays``) are replayed without their rule; the
   online check has fed the randomised runs; then the ledger decides each candidate. An accept commits a new
   live version with the rule, a revert a new version without it (never an edit of the old one); a night
   that cannot resolve says how much more evidence is needed (``pending``), which is not a verdict. The
   next night's plan is written beside the ledger (``decisions/skills/``: the launcher ``sage-run`` that
   draws each ``sage run``'s arm: the pending candidate's version, committed but not live, on
   ``pending_share`` of the runs, the tree without the last accepted rule on ``probation_share`` while it is
   on probation). The ledger is saved atomically after the commit; a commit refused (a conflict) saves
   nothing, so the ledger never says a rule is live that is not.
5. **Diagnostics** (``<skills root>/nights/<date>/<role>/diagnostics.json``, written atomically: "running"
   first, the result at the end): versions and per-skill shas before and after, the per-skill diff, the
   trials, every edit with its status, the val and test scores, the task counts and the harvest's reasons.

A backend error, a judge error or a bug ends the night with its status and cause (:data:`STATUSES`); the live
version only ever changes by a whole commit. With no model configured (``$SAGE_SLEEP_MODEL`` or the config's
``model``), :func:`run_sage_skills` still harvests and checks, and the night ends ``no_model`` (healthy: nothing
was replayed, the live version is as it was).

**The roles.** SAGE injects skills into seven roles (``orchestrator/workflow.py``, every call of
``build_prefix_for_agent``; :mod:`sage_pipeline.sage.skills` has the table): planner (:345), architect
(:1231), coder (:1280), documentation (:1349: the issue's list leaves it out; SAGE's code injects it),
test_engineer (:1441 and :1929), reviewer (:1818) and debugger (:2223). The night replays the **coder** only:
its inputs are what the harvest holds (the goal, which ``sage run`` passes the coder as its
``task_description``; SAGE's file for the code) and its output is judged by what the harvest holds (the gate's
test file, run as SAGE's gate runs it). For each other role, what SAGE's journals and workspaces lack:

- *test_engineer*: a judge of a test file. The workspace holds the code SAGE's gate passed (one
  implementation the tests must accept) but no implementation known to be wrong, so a replayed test file
  cannot be scored beyond "accepts SAGE's code"; and the planner's task description, which its prompt
  carries, is logged nowhere.
- *reviewer*: its inputs are the planner's task description (logged nowhere) and the patch as the tool
  executor applied it, and its reference is a verdict; the journal logs the verdict (``TRAJECTORY_STEP``),
  but the workspace keeps only the last version of each file, not the patch each review saw.
- *debugger*: its input is the code that failed verification with the error; the journal logs the failure
  (``Verification failed (rc=N): ...``, a preview) and which file was written, not the file's contents at
  that point, and the workspace keeps only the final version.
- *planner*: its output is a DAG that ``sage run --auto`` never writes (``.sage/last_plan.json`` only in
  research or ``--plan-only`` mode); the journal logs only its node count.
- *architect* and *documentation*: no task of theirs reaches a judge the harvest can run (no test file is
  written for their output), and the architect gets no skill unless the error names a keyword.

What the night reads is hostile (an LLM wrote SAGE's workspaces): the harvest reads every file through the
guard and counts what it refuses (the diagnostics' ``harvest.unsafe`` and examples); SAGE's tests and the
model's code run in a sandbox opened for untrusted code (Docker; local only with ``allow_untrusted_local``,
which the diagnostics' ``sandbox`` shows); a harvest that raises still leaves its ``diagnostics.json``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import time
import traceback
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, date as Date, datetime, timedelta
from pathlib import Path
from typing import Literal, Protocol

import filelock
import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline import artifacts
from sage_pipeline.decisions import skills as lever_skills
from sage_pipeline.decisions.ledger import Candidate, Ledger, LedgerError
from sage_pipeline.sage import skills as sk
from sage_pipeline.sim.sandbox import SandboxConfig
from sage_pipeline.sleep.backends import (
    BACKENDS,
    BackendError,
    CallLog,
    OllamaConfig,
    OpenAIConfig,
    Reply,
)
from sage_pipeline.sleep.block import (
    DocumentError,
    Edit,
    EditLimits,
    LearnedDoc,
    apply_edit,
    normalise_rule,
    parse_document,
)
from sage_pipeline.sleep.gate import GateConfig, Trial, changes, compare, summary
from sage_pipeline.sleep.judges import JudgeError, UnitTestJudge, extract_code
from sage_pipeline.sleep.prompts import ReplyFormatError, extract_json, parse_reflect_reply, reflect_messages
from sage_pipeline.sleep.records import DEFAULT_SPLIT, ReflectRequest, SplitSpec, TaskRecord, TaskResult
from sage_pipeline.sleep.sage_online import OnlineCheckConfig, OnlineReport, check, check_ledger, runs_from_journals
from sage_pipeline.sleep.sage_skills import (
    SageSkillsConfig,
    SageSkillsRoot,
    SkillsRootChanged,
    SkillsRootError,
)

ROLES = ("coder",)  # the roles whose answer is the code the harvested tests judge
SKILLS_ROOT_DIR = ("sleep", "sage_skills")  # the project's SAGE skills root, under the artifact root
NIGHTS_DIR = "nights"
NIGHT_LOCK = ".night.lock"
STATUSES = ("accepted", "rejected", "reject_unverified", "no_edits", "reflect_invalid", "no_tasks", "pending",
            "no_model", "backend_error", "judge_error", "input_error", "store_error", "conflict", "internal_error",
            "aborted")
# internal_error: an unexpected exception (a bug) stopped the night; aborted: it was interrupted (KeyboardInterrupt,
# SystemExit). "running" is only ever on disk while a night runs, or after one was killed before it could write
# its result. "pending" (ledger mode): tonight's evidence was added to the candidates' and none resolved (not a
# verdict). "no_model": no model is configured, so the harvest ran and nothing was replayed.
ERROR_STATUSES = ("backend_error", "judge_error", "input_error", "store_error", "internal_error", "aborted")
HEALTHY = ("accepted", "rejected", "no_edits", "no_tasks", "reject_unverified", "pending", "no_model")
# "conflict" (another night of the root ran, or its lock was held past lock_timeout_s) and "reflect_invalid" are
# recorded statuses, neither healthy nor errors: the check warns. One rule for every night (the generic cycle
# that raised on a lock conflict is gone).
HEAD = 160
# SAGE's universal prefix (prompt_engine/universal_prefix.py build_universal_prefix) for a fresh workspace:
# its labels, every section empty; TOOL PERMISSIONS the coder's (prefix_builder.allowed_tools_for_role)
UNIVERSAL_PREFIX = ("CODEBASE CONTEXT:\nNone\n\nUSER RULES:\nNone\n\nORCHESTRATOR NOTES:\nNone\n\nWORKSPACE POLICY:\n"
                    "None\n\nTOOL PERMISSIONS:\n{tools}\n\nKNOWN PATTERNS:\nNone\n")
ROLE_TOOLS = {"coder": "create, edit, delete, run_command"}
# A condensed form of SAGE's coder instructions (prompt_engine/templates/coder.md: its first line, which the
# model world reads as the end of the injected skills, its TASK / PROJECT CONTEXT / USER RULES lines, its
# output contract) and of the user message agents/coder.py sends (whose first words the world recognises).
CODER_INSTRUCTIONS = (
    "# Coder Instructions\n\nTASK: {task}\nPROJECT CONTEXT: {{}}\nUSER RULES: None\n\n---\n\n## Output contract\n\n"
    "Answer with one JSON object and nothing else: {{\"file\": \"<relative path>\", \"operation\": \"create\", "
    "\"patch\": \"<the complete file, newlines written as \\n>\", \"reason\": \"<one sentence>\", "
    "\"epistemic_flags\": []}}. The patch is the whole file, never a diff.\n")
CODER_USER = ("Implement the following task.\n\nTASK: {task}\n\nReturn ONLY a JSON PatchRequest object. "
              "No prose outside the JSON.")
# edit statuses this night adds to the block's (sage_pipeline.sleep.block.DROPPED)
OVER_SAGE_CAP, NEVER_INJECTED, NOT_INJECTED = "over_sage_cap", "never_injected", "not_injected"
TARGET_HINT = '"target": "skill" | "memory"'  # reflect_messages' hint, replaced by the night's skill ids


class SageNightError(ValueError):
    """The night was asked something it cannot do; the message says what to do."""


class SageNightConfig(BaseModel):
    """One night on SAGE's skills: what may change, how the gate decides, how hard to work (each default
    declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Literal["coder"] = Field("coder", description="the role whose skills the night edits: the coder, whose "
                                   "answer is the code the harvested tests judge")
    limits: EditLimits = Field(default_factory=EditLimits, description="how much one night may change")
    gate: GateConfig = Field(default_factory=GateConfig, description="when a candidate survives ('per_night': "
                             "its test; 'ledger': its replays per val task)")
    decisions: Literal["ledger", "per_night"] = Field(
        "ledger", description="'ledger': every rule is a candidate in the decision ledger, its evidence carried "
                              "across nights, accepted and reverted at a level that holds over every night and "
                              "every rule; 'per_night': the paired gate decides each night from scratch (valid for "
                              "one night only: over a month useless edits pile up), kept for comparison")
    split: SplitSpec = Field(DEFAULT_SPLIT, description="shares: test (1 - train - val) is held out by a stable "
                             "hash of the task's id; the rest is split into train and a val slice drawn afresh "
                             "each night in the ratio train : val")
    workers: int = Field(1, ge=1, description="parallel backend calls while replaying")
    train_samples: int = Field(1, ge=1, le=16, description="replays of each train task (a backend drawing fresh "
                               "answers shows more of its failures to reflect with more)")
    reflect_examples: int = Field(16, ge=1, description="train failures shown to reflect (and half as many "
                                  "successes)")
    lock_timeout_s: float = Field(3600.0, ge=0, description="how long a night waits for another night of the same "
                                  "skills root before it gives up")


# ---------------------------------------------------------------------------------------------- the backend
class ChatBackend(Protocol):
    """What the night calls: a chat completion (:class:`~sage_pipeline.sleep.backends.ChatClient`: the Ollama and the
    OpenAI-compatible clients)."""

    calls: CallLog

    @property
    def draws_fresh(self) -> bool: ...

    def complete(self, messages: list[dict], purpose: str, max_tokens: int) -> Reply: ...

    def describe(self) -> dict: ...


def map_workers(fn: Callable, items: Sequence, workers: int) -> list:
    """``[fn(x) for x in items]``, over ``workers`` threads when more than one; the first error cancels the rest."""
    if workers <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=workers) as ex:
        futures = [ex.submit(fn, x) for x in items]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for f in futures:
                f.cancel()
            raise


def _max_tokens(backend: ChatBackend, name: str, default: int) -> int:
    cfg = getattr(backend, "config", None)
    return int(getattr(cfg, name, default)) if cfg is not None else default


# ---------------------------------------------------------------------------------------------- the prompts
def task_text(task: TaskRecord) -> str:
    """The task as the replay's coder reads it: the goal, with the file and the function the tests import."""
    sage = task.meta.get("sage") if isinstance(task.meta, dict) else None
    extra = []
    if isinstance(sage, dict) and sage.get("artifact"):
        extra.append(f"Write it in {sage['artifact']}")
    extra.append(f"the tests call `{task.reference['entry_point']}`")
    return f"{task.intent.strip()}\n({'; '.join(extra)}.)"


def role_messages(role: str, tree: dict[str, str], task: TaskRecord, total_cap: int | None = None) -> list[dict]:
    """The chat messages SAGE's ``role`` would send for ``task`` with the skills tree ``tree`` (skill id ->
    text) deployed: see the module doc, step 2."""
    if role not in ROLES:
        raise SageNightError(f"role {role!r}: the night replays {', '.join(ROLES)} only (the role whose answer is "
                             "the code the harvested tests judge)")
    inj = sk.injection(tree, role, task.intent, "", total_cap)
    text = task_text(task)
    system = (UNIVERSAL_PREFIX.format(tools=ROLE_TOOLS[role]) + inj.prompt_section + "\n\n"
              + CODER_INSTRUCTIONS.format(task=text))
    return [{"role": "system", "content": system}, {"role": "user", "content": CODER_USER.format(task=text)}]


def answer_code(text: str) -> tuple[str, str]:
    """(the code of a coder's answer, how it was read): SAGE's PatchRequest ``patch``, else the answer's
    first fenced block, else the whole answer."""
    try:
        obj = extract_json(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("patch"), str) and obj["patch"].strip():
        return obj["patch"], "patch"
    return extract_code(text), "text"


# ---------------------------------------------------------------------------------------------- the result
@dataclass
class SageNightResult:
    """Everything a night did and why: ``diagnostics.json`` is this, as JSON."""

    role: str
    date: str
    root: str = ""
    status: str = "running"
    gate_action: str = "none"  # accept | reject | reject_unverified | none
    reason: str = ""
    cause: str = ""
    phase: str = ""
    started_at: str = ""
    finished_at: str = ""
    seconds: float = 0.0
    backend: dict = field(default_factory=dict)
    sandbox: dict = field(default_factory=dict)
    harvest: dict = field(default_factory=dict)
    unusable: list = field(default_factory=list)  # tasks left out: {task, reason}
    tasks: dict = field(default_factory=dict)
    editable: list = field(default_factory=list)  # the skills reflect may edit (SAGE injects them into the role)
    scores: dict = field(default_factory=lambda: {k: None for k in (
        "baseline_val", "candidate_val", "train", "test_before", "test_after")})
    trials: list = field(default_factory=list)
    edits: list = field(default_factory=list)
    val_changes: dict = field(default_factory=lambda: {"improved": [], "regressed": []})
    per_task: list = field(default_factory=list)
    reflect: dict = field(default_factory=lambda: {"reply_head": "", "error": "", "proposed": 0})
    calls: dict = field(default_factory=dict)
    call_errors: list = field(default_factory=list)
    versions: dict = field(default_factory=lambda: {"before": "", "after": "", "before_seq": None,
                                                    "after_seq": None})
    shas: dict = field(default_factory=lambda: {"before": {}, "after": {}})
    diff: dict = field(default_factory=dict)  # skill id -> unified diff (before -> after)
    gate: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    candidate: dict = field(default_factory=dict)  # skill id -> text, when accepted but not committed
    ledger: dict = field(default_factory=dict)  # ledger mode: every candidate's standing, tonight's transitions, plan
    diagnostics: str = ""
    traceback: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def ok(self) -> bool:
        return self.status not in ERROR_STATUSES

    def edits_with(self, *statuses: str) -> list[dict]:
        return [e for e in self.edits if e["status"] in statuses]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _rows(phase: str, results: list[TaskResult], samples: int) -> list[dict]:
    n = len(results) // max(samples, 1) or 1
    return [{"phase": phase, **({"sample": i // n} if samples > 1 else {}), **r.to_dict()}
            for i, r in enumerate(results)]


def _unit(h: str) -> float:
    return int.from_bytes(hashlib.sha256(h.encode()).digest()[:8], "big") / 2**64


def split_tasks(tasks: Sequence[TaskRecord], date: str, split: SplitSpec) -> tuple[dict[str, list[TaskRecord]],
                                                                                  list[dict]]:
    """({train, val, test}: tasks sorted by id, [{task, reason}] left out): test by the stable hash of the id,
    val drawn from the rest by a hash of (date, id) in the ratio train : val."""
    out: dict[str, list[TaskRecord]] = {"train": [], "val": [], "test": []}
    unusable, seen = [], set()
    val_share = split.val / (split.train + split.val)
    for t in sorted(tasks, key=lambda t: t.id):
        if t.id in seen:
            unusable.append({"task": t.id, "reason": "duplicate id: the first task with it is kept"})
            continue
        seen.add(t.id)
        if t.reference_kind != "unit_tests":
            unusable.append({"task": t.id, "reason": f"reference_kind {t.reference_kind!r}: the night judges the "
                             "coder's code by the task's tests (unit_tests) only"})
            continue
        if not t.intent.strip():
            unusable.append({"task": t.id, "reason": "empty goal: nothing for the coder to implement"})
            continue
        if split.of(t.id) == "test":
            out["test"].append(t)
        else:
            out["val" if _unit(f"sage-night-val:{date}:{t.id}") < val_share else "train"].append(t)
    return out, unusable


# ---------------------------------------------------------------------------------------------- edits
def _texts(docs: dict[str, LearnedDoc], orig: dict[str, LearnedDoc], live: dict[str, str]) -> dict[str, str]:
    """The whole tree: each edited skill rendered, every other skill as it is live."""
    return {sid: (docs[sid].render() if sid in docs and docs[sid] is not orig[sid] else live[sid])
            for sid in sk.SKILL_IDS}


def _cap_cuts(texts: dict[str, str], total_cap: int | None) -> dict[tuple[str, str, str], int]:
    rep = sk.check_within_caps({f: texts.get(f, "") for f in sk.READ_FILES}, total_cap)
    return {(t["role"], t["situation"], sid): n for t in rep.total for sid, n in t["cut"].items()}


_SKILL_BY_LOWER = {s.lower(): s for s in sk.SKILL_IDS}


@dataclass
class _Applied:
    docs: dict[str, LearnedDoc] | None
    status: str
    reason: str = ""


class _Edits:
    """Edits to the learned blocks of the role's injected skills, checked against SAGE's caps."""

    def __init__(self, role: str, live: dict[str, str], editable: list[str], limits: EditLimits,
                 total_cap: int | None) -> None:
        self.role, self.live, self.limits, self.total_cap = role, live, limits, total_cap
        self.orig = {sid: parse_document(live[sid], sid) for sid in editable}
        self.base_cuts = _cap_cuts(live, total_cap)

    def apply(self, docs: dict[str, LearnedDoc], e: Edit) -> _Applied:
        sid = e.target = _SKILL_BY_LOWER.get(e.target.strip().lower(), e.target)  # the reply's parser lower-cases
        if sid in sk.NEVER_READ:
            return _Applied(None, NEVER_INJECTED, f"{sid}: SAGE never injects this skill (its path rule reads "
                            f"{sk.resolve(sid)[0]}, which it does not ship): an edit here changes no prompt")
        if sid not in docs:
            why = ("not one of SAGE's skills" if sid not in sk.SKILL_IDS else
                   f"not injected into the {self.role}'s prompt by SAGE's selection")
            return _Applied(None, NOT_INJECTED if sid in sk.SKILL_IDS else "invalid",
                            f"target {sid!r}: {why}; the night edits {', '.join(docs)}")
        view = {"skill": docs[sid], **{k: d for k, d in docs.items() if k != sid}}
        res = apply_edit(view, replace(e, target="skill"), self.limits, ("skill",))
        if res.docs is None:
            return _Applied(None, res.status, res.reason)
        new = {**docs, sid: res.docs["skill"]}
        texts = _texts(new, self.orig, self.live)
        try:
            sk.check_text(sid, texts[sid], f"{sid} after this edit")
        except sk.SkillTooLong as exc:
            return _Applied(None, OVER_SAGE_CAP, str(exc))
        except sk.SkillsError as exc:
            return _Applied(None, "invalid", str(exc))
        worse = {k: n for k, n in _cap_cuts(texts, self.total_cap).items() if n > self.base_cuts.get(k, 0)}
        if worse:
            (role, situation, cut), n = next(iter(worse.items()))
            return _Applied(None, OVER_SAGE_CAP, f"SAGE's total cap of {sk.effective_total_cap(self.total_cap)} "
                            f"characters would then cut {n} characters of {cut} from the {role}'s prompt "
                            f"({situation}): SAGE would not inject the edit whole")
        return _Applied(new, "candidate")

    def screen(self, docs: dict[str, LearnedDoc], edits: list[Edit]) -> tuple[list[Edit], list[Edit]]:
        """(candidates, dropped): in order, each as if every earlier candidate were applied."""
        keep, dropped, state = [], [], docs
        for i, e in enumerate(edits):
            if e.status == "invalid":
                dropped.append(e)
                continue
            if i >= self.limits.edit_budget:
                e.status, e.reason = "over_budget", f"edit {i + 1} of a reply limited to edit_budget " \
                                                    f"{self.limits.edit_budget}"
                dropped.append(e)
                continue
            res = self.apply(state, e)
            if res.docs is None:
                e.status, e.reason = res.status, res.reason
                dropped.append(e)
                continue
            e.status, state = "candidate", res.docs
            keep.append(e)
        return keep, dropped


# ---------------------------------------------------------------------------------------------- the night
class _Night:
    def __init__(self, root: SageSkillsRoot, tasks: Sequence[TaskRecord], backend: ChatBackend, unit: UnitTestJudge,
                 config: SageNightConfig, r: SageNightResult, log: Callable[[str], None]) -> None:
        self.root, self.backend, self.unit, self.cfg, self.r, self.log = root, backend, unit, config, r, log
        self.split, r.unusable = split_tasks(tasks, r.date, config.split)
        self.total_cap = root.config.total_cap
        self.samples = config.gate.replays(backend.draws_fresh)

    def _replay(self, split: str, tree: dict[str, str], label: str, samples: int = 1) -> list[TaskResult]:
        tasks = self.split[split] * samples
        if not tasks:
            return []
        t0 = time.monotonic()
        msgs = {t.id: role_messages(self.cfg.role, tree, t, self.total_cap) for t in self.split[split]}
        max_tokens = _max_tokens(self.backend, "max_tokens", 1024)
        replies = map_workers(lambda t: self.backend.complete(msgs[t.id], "solve", max_tokens), tasks, self.cfg.workers)
        codes = [answer_code(rep.text)[0] for rep in replies]
        verdicts = self.unit.run(list(zip(tasks, codes, strict=True)))
        out = [TaskResult(t.id, split, v.hard, v.soft, rep.text[:HEAD], v.why,
                          rep.prompt_tokens + rep.completion_tokens)
               for t, rep, v in zip(tasks, replies, verdicts, strict=True)]
        dt = time.monotonic() - t0
        self.log(f"sage night: replayed {len(self.split[split])} {label} tasks"
                 + (f" x {samples} samples" if samples > 1 else "")
                 + f" in {dt:.1f} s ({len(tasks) / max(dt, 1e-9):.1f}/s): hard {np.mean([x.hard for x in out]):.3f}")
        return out

    def _stop(self, status: str, reason: str) -> None:
        self.r.status, self.r.reason = status, reason

    def run(self) -> None:
        r, cfg = self.r, self.cfg
        train, val, test = self.split["train"], self.split["val"], self.split["test"]
        train_keys = {t.content_key() for t in train}
        overlap = [t.id for t in val if t.content_key() in train_keys]
        r.tasks = {"total": sum(len(v) for v in self.split.values()), "train": len(train), "val": len(val),
                   "test": len(test), "unusable": len(r.unusable), "val_ids": [t.id for t in val],
                   "test_ids": [t.id for t in test], "val_overlapping_train": overlap,
                   "val_drawn": f"afresh for {r.date}: a hash of (date, task id) < val / (train + val) = "
                                f"{cfg.split.val / (cfg.split.train + cfg.split.val):.3f}"}
        r.gate = {**cfg.gate.model_dump(), "replays_per_val_task": self.samples,
                  "backend_draws_fresh": self.backend.draws_fresh, "decisions": cfg.decisions}
        if not train or not val:
            which = "val" if not val else "train"
            self._stop("no_tasks", f"{r.tasks['total']} usable task(s) but none in tonight's {which} slice, so the "
                       f"night can {'verify no edit' if which == 'val' else 'learn nothing'}; harvest more of SAGE's "
                       "runs (the val slice is drawn afresh each night)")
            self._nothing_to_replay()
            return
        live = self.root.texts(r.versions["before"])
        editable: list[str] = []
        for t in train + val:  # the skills SAGE injects into the role for tonight's goals
            for s in sk.injection(live, cfg.role, t.intent, "", self.total_cap).skills:
                if s.skill_id not in editable and s.skill_id in sk.SKILL_IDS:
                    editable.append(s.skill_id)
        r.editable = editable
        try:
            self.edits = _Edits(cfg.role, live, editable, cfg.limits, self.total_cap)
        except DocumentError as e:
            r.status, r.phase, r.cause = "input_error", "read the live skills", str(e)
            r.reason = ("a live skill's learned block is broken; nothing was changed (fix it with a commit or a "
                        "rollback)")
            return
        try:
            self._run(live, overlap)
        except BackendError as e:
            r.status, r.cause = "backend_error", e.cause
            r.reason = (f"the backend failed during {r.phase} ({e.kind}"
                        f"{', after ' + str(e.attempts) + ' attempts' if e.attempts > 1 else ''}): nothing after "
                        "this point was scored")
            if r.versions["after"] != r.versions["before"]:
                r.reason += f"; the accepted version {r.versions['after']} was committed before the test split"
        except JudgeError as e:
            r.status, r.cause = "judge_error", str(e)
            r.reason = f"the unit-test judge failed during {r.phase}: nothing after this point was scored"

    def _nothing_to_replay(self) -> None:
        """A night without val or train tasks: the per-night gate has nothing to do."""

    def _run(self, live: dict[str, str], overlap: list[str]) -> None:
        r, cfg = self.r, self.cfg
        r.phase = "baseline_val"
        base_val = self._replay("val", live, "val (baseline)", self.samples)
        r.scores["baseline_val"] = summary(base_val, cfg.gate)
        r.per_task += _rows("val baseline", base_val, self.samples)
        r.phase = "train"
        train_samples = cfg.train_samples if self.backend.draws_fresh else 1  # else the same answers again
        train_res = self._replay("train", live, "train", train_samples)
        r.scores["train"] = summary(train_res, cfg.gate)
        r.per_task += _rows("train", train_res, train_samples)
        final = self._reflect_and_gate(base_val, train_res, overlap)
        self._test(live, final)

    def _reflect_and_gate(self, base_val: list[TaskResult], train_res: list[TaskResult],
                          overlap: list[str]) -> dict[str, str] | None:
        r, cfg = self.r, self.cfg
        by_id = {t.id: t for t in self.split["train"]}
        order = lambda x: hashlib.sha256(f"{r.date}:{x.task_id}".encode()).hexdigest()  # noqa: E731
        failed = {x.task_id: x for x in sorted((x for x in train_res if x.hard < 1.0), key=order)}
        if not failed:
            self._stop("no_edits", f"all {len(train_res)} train replays pass: nothing to learn tonight")
            return None
        passed = {x.task_id: x for x in sorted((x for x in train_res if x.hard >= 1.0), key=order)}
        failures = [(by_id[i], x) for i, x in failed.items()]  # one replay per task
        successes = [(by_id[i], x) for i, x in passed.items() if i not in failed]
        edits = self._reflect(failures, successes)
        if edits is None:
            return None
        candidates, dropped = self.edits.screen(dict(self.edits.orig), edits)
        r.edits = [e.to_dict() for e in dropped]
        if not candidates:
            counts = Counter(e.status for e in dropped)
            detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none proposed"
            self._stop("no_edits", f"reflect proposed {len(edits)} edit(s), none applicable ({detail})")
            return None
        docs, val, trials, accepted = self._gate(candidates, base_val)
        r.trials = [t.to_dict() for t in trials]
        r.edits = [e.to_dict() for e in candidates] + [e.to_dict() for e in dropped]
        best = max(trials, key=lambda t: t.candidate) if trials else None
        r.scores["candidate_val"] = (summary(val, cfg.gate) if accepted else best and {
            "score": best.candidate, "hard": None, "soft": None, "tasks": best.tasks, "samples": best.samples,
            "note": "best rejected trial"})
        if not accepted:
            r.gate_action = "reject"
            verdicts = Counter(t.verdict for t in trials)
            self._stop("rejected", f"none of {len(candidates)} candidate edit(s) passed the {cfg.gate.test} gate ("
                       + ", ".join(f"{n} {v}" for v, n in verdicts.items()) + ")" + _cannot_tell(trials))
            return None
        improved, regressed = changes(base_val, val, cfg.gate)
        r.val_changes = {"improved": improved, "regressed": regressed}
        if overlap:
            for e in accepted:
                e.status, e.reason = "rejected", f"passed the gate, but val overlaps train: {e.reason}"
            r.edits = [e.to_dict() for e in candidates] + [e.to_dict() for e in dropped]
            r.gate_action = "reject_unverified"
            self._stop("reject_unverified", f"{len(accepted)} edit(s) passed the gate but {len(overlap)} val task(s) "
                       f"ask what a train task asks ({', '.join(overlap[:5])}): an improvement there is not verified")
            return None
        r.gate_action = "accept"
        return self._commit(docs, accepted, len(candidates), trials)

    def _reflect(self, failures: list, successes: list) -> list[Edit] | None:
        r, cfg = self.r, self.cfg
        orig = self.edits.orig
        room = {sid: max(0, min(cfg.limits.block_max_chars - d.block_chars(),
                                sk.PER_SKILL_CAP - len(d.render()))) for sid, d in orig.items()}
        req = ReflectRequest(
            skill_name=f"SAGE's {cfg.role} (the skills SAGE injects into its prompt)",
            documents={sid: d.render() for sid, d in orig.items()}, blocks={sid: d.rules for sid, d in orig.items()},
            failures=failures[:cfg.reflect_examples], successes=successes[:max(1, cfg.reflect_examples // 2)],
            edit_budget=cfg.limits.edit_budget, block_max_chars=cfg.limits.block_max_chars,
            max_rule_chars=cfg.limits.max_rule_chars, room=room)
        msgs = reflect_messages(req)
        hint = '"target": ' + " | ".join(json.dumps(s) for s in orig)
        msgs[0] = {**msgs[0], "content": msgs[0]["content"].replace(TARGET_HINT, hint)}
        r.phase = "reflect"
        reply = self.backend.complete(msgs, "reflect", _max_tokens(self.backend, "reflect_max_tokens", 2048))
        r.reflect["reply_head"] = reply.text[:600]
        try:
            edits = parse_reflect_reply(reply.text)
        except ReplyFormatError as e:
            r.reflect["error"] = str(e)
            self._stop("reflect_invalid", f"reflect's reply could not be used ({e.problem}); the skills are "
                       "unchanged tonight")
            return None
        r.reflect["proposed"] = len(edits)
        return edits

    def _gate(self, candidates: list[Edit], base_val: list[TaskResult]
              ) -> tuple[dict[str, LearnedDoc], list[TaskResult], list[Trial], list[Edit]]:
        cfg = self.cfg
        self.r.phase = "gate"
        docs, val, trials, accepted = dict(self.edits.orig), base_val, [], []
        groups = [[e] for e in candidates] if cfg.gate.granularity == "edit" else [candidates]
        for group in groups:
            trial_docs, ok = docs, []
            for e in group:
                res = self.edits.apply(trial_docs, e)
                if res.docs is None:  # its anchor or room came from an edit the gate rejected
                    e.status, e.reason = res.status, res.reason + " (after earlier edits were rejected)"
                    continue
                trial_docs, ok = res.docs, ok + [e]
            if not ok:
                continue
            tree = _texts(trial_docs, self.edits.orig, self.edits.live)
            cand = self._replay("val", tree, f"val (trial {len(trials) + 1})", self.samples)
            trial = compare(val, cand, cfg.gate, [f"{e.describe()}" for e in ok], trials=len(groups))
            trials.append(trial)
            self.log(f"sage night: gate trial {len(trials)}/{len(groups)}: {trial.reason}")
            self.r.per_task += _rows(f"val trial {len(trials)}", cand, self.samples)
            for e in ok:
                e.status, e.reason = ("accepted" if trial.accepted else "rejected"), trial.reason
            if trial.accepted:
                docs, val, accepted = trial_docs, cand, accepted + ok
        return docs, val, trials, accepted

    def _commit(self, docs: dict[str, LearnedDoc], accepted: list[Edit], n: int, trials: list[Trial]
                ) -> dict[str, str] | None:
        r = self.r
        r.phase = "commit"
        tree = _texts(docs, self.edits.orig, self.edits.live)
        new = {sid: tree[sid] for sid in sk.SKILL_IDS if tree[sid] != self.edits.live[sid]}
        base = trials[0].baseline
        why = (f"sage night {r.date} ({r.role}): {len(accepted)} of {n} edit(s) accepted by the "
               f"{self.cfg.gate.test} gate, val {self.cfg.gate.metric} {base:.3f} -> "
               f"{r.scores['candidate_val']['score']:.3f}: " + "; ".join(e.describe() for e in accepted))
        try:
            entry = self.root.commit(new, why, parent=r.versions["before"])
        except SkillsRootChanged as e:
            r.candidate = new
            self._stop("conflict", f"the gate accepted {len(accepted)} edit(s) but {e}")
            return tree
        except (SkillsRootError, sk.SkillsError, OSError) as e:
            r.candidate, r.cause = new, str(e)
            self._stop("store_error", f"the gate accepted {len(accepted)} edit(s) but the skills root refused or "
                       f"failed the commit: {e}")
            return None
        r.versions["after"], r.versions["after_seq"] = entry.version, entry.seq
        self._stop("accepted", f"{len(accepted)} of {n} candidate edit(s) accepted and committed as version "
                   f"{entry.version} (v{entry.seq}): val {self.cfg.gate.metric} {base:.3f} -> "
                   f"{r.scores['candidate_val']['score']:.3f}")
        return tree

    def _test(self, live: dict[str, str], final: dict[str, str] | None) -> None:
        r = self.r
        if not self.split["test"]:
            r.notes.append("no test tasks tonight: test scores are empty")
            return
        r.phase = "test"
        before = self._replay("test", live, "test (before)", self.samples)
        r.scores["test_before"] = summary(before, self.cfg.gate)
        r.per_task += _rows("test before", before, self.samples)
        if final is None:
            r.scores["test_after"] = r.scores["test_before"]
            return
        after = self._replay("test", final, "test (after)", self.samples)
        r.scores["test_after"] = summary(after, self.cfg.gate)
        r.per_task += _rows("test after", after, self.samples)


# ---------------------------------------------------------------------------------------------- the ledger's night
def _change(c: Candidate) -> lever_skills.RuleChange:
    return lever_skills.RuleChange.from_payload(c.payload)


def _edit(ch: lever_skills.RuleChange) -> Edit:
    return Edit(ch.op, ch.skill, ch.rule, ch.anchor, ch.rationale)


def _rule_diff(before: LearnedDoc, after: LearnedDoc) -> tuple[list[str], list[str]]:
    """(rules added, rules removed) from ``before``'s block to ``after``'s, by normalised text."""
    b, a = {normalise_rule(x) for x in before.rules}, {normalise_rule(x) for x in after.rules}
    return ([x for x in after.rules if normalise_rule(x) not in b],
            [x for x in before.rules if normalise_rule(x) not in a])


def _undo(docs: dict[str, LearnedDoc], c: Candidate) -> dict[str, LearnedDoc] | None:
    """``docs`` without accepted candidate ``c``'s change: the rules it added taken out, the rules it removed put
    back at the block's end; None when its rule is no longer in the block (removed outside the ledger)."""
    ch = _change(c)
    doc = docs.get(ch.skill)
    if doc is None:
        return None
    added = c.payload.get("added") or ([ch.rule] if ch.op != "delete" else [])
    removed = c.payload.get("removed") or []
    gone = {normalise_rule(x) for x in added}
    kept = tuple(x for x in doc.rules if normalise_rule(x) not in gone)
    if gone and len(kept) == len(doc.rules):
        return None
    have = {normalise_rule(x) for x in kept}
    kept += tuple(x for x in removed if normalise_rule(x) not in have)
    return {**docs, ch.skill: doc.with_rules(kept)}


def _stage(root: SageSkillsRoot, edits: dict[str, str], reason: str, base: str) -> str:
    """A version of ``root``'s tree ``base`` (the live version the edits were made from) with ``edits``, written
    whole under ``versions/`` but not made live (what the launcher's arm points ``SAGE_SKILLS_ROOT`` at); its id.
    Checked as a commit is checked (:meth:`SageSkillsRoot.stage`)."""
    return root.stage(edits, reason, base=base).version


class _LedgerNight(_Night):
    """The night in ledger mode (the module doc, step 4): evidence added to the ledger's candidates, the ledger
    decides, accepts and reverts committed, the next night's plan written, the ledger saved."""

    def __init__(self, root: SageSkillsRoot, tasks: Sequence[TaskRecord], backend: ChatBackend, unit: UnitTestJudge,
                 config: SageNightConfig, r: SageNightResult, log: Callable[[str], None], ledger: Path,
                 lever: lever_skills.SkillsLeverConfig) -> None:
        super().__init__(root, tasks, backend, unit, config, r, log)
        self.path, self.lever = ledger, lever
        self.led: Ledger | None = None
        self.docs: _Edits | None = None  # the live blocks of every skill a candidate or tonight's goals touch
        self.tonight: dict[str, dict] = {}  # candidate id -> what tonight added or why it was not replayed
        self.transitions: list[dict] = []
        self.closed = False
        self.final: dict[str, str] | None = None
        self.quiet = ""  # why tonight proposed nothing new
        self.reflect_stop: tuple[str, str] | None = None

    def run(self) -> None:
        r = self.r
        try:
            self.led = Ledger.load(self.path)
        except LedgerError as e:
            r.status, r.phase, r.cause = "input_error", "read the ledger", str(e)
            r.reason = "the decision ledger cannot be read; nothing was changed"
            return
        r.ledger = {"mode": "ledger", "path": str(self.path), "guarantee": lever_skills.guarantee(self.led)}
        super().run()

    # ---- the live blocks the ledger's candidates touch
    def _prepare(self, live: dict[str, str]) -> None:
        want = list(self.r.editable)
        for c in self.led.of(lever_skills.LEVER, "pending", "accepted"):
            sid = _change(c).skill
            if sid in sk.SKILL_IDS and sid not in sk.NEVER_READ and sid not in want:
                want.append(sid)
        self.docs = _Edits(self.cfg.role, live, want, self.cfg.limits, self.total_cap)

    def _nothing_to_replay(self) -> None:
        live = self.root.texts(self.r.versions["before"])
        try:
            self._prepare(live)
        except DocumentError as e:
            self.r.status, self.r.cause = "input_error", str(e)
            self.r.reason = "a live skill's learned block is broken; nothing was changed"
            return
        self._close(live)

    def _run(self, live: dict[str, str], overlap: list[str]) -> None:
        r, cfg = self.r, self.cfg
        try:
            self._prepare(live)
        except DocumentError as e:
            r.status, r.phase, r.cause = "input_error", "read the live skills", str(e)
            r.reason = "a live skill a candidate of the ledger edits has a broken learned block; nothing was changed"
            return
        r.phase = "baseline_val"
        base_val = self._replay("val", live, "val (baseline)", self.samples)
        r.scores["baseline_val"] = summary(base_val, cfg.gate)
        r.per_task += _rows("val baseline", base_val, self.samples)
        r.phase = "train"
        train_samples = cfg.train_samples if self.backend.draws_fresh else 1
        train_res = self._replay("train", live, "train", train_samples)
        r.scores["train"] = summary(train_res, cfg.gate)
        r.per_task += _rows("train", train_res, train_samples)
        try:
            self._propose(train_res)
            self._evidence(live, base_val)
        except (BackendError, JudgeError):
            self._close(live)  # the evidence of every candidate replayed whole so far is valid: decided and kept
            raise
        self._close(live)
        self._test(live, self.final)

    # ---- tonight's proposals
    def _propose(self, train_res: list[TaskResult]) -> None:
        r, cfg = self.r, self.cfg
        by_id = {t.id: t for t in self.split["train"]}
        order = lambda x: hashlib.sha256(f"{r.date}:{x.task_id}".encode()).hexdigest()  # noqa: E731
        failed = {x.task_id: x for x in sorted((x for x in train_res if x.hard < 1.0), key=order)}
        if not failed:
            self.quiet = f"all {len(train_res)} train replays pass: nothing new to propose tonight"
            r.notes.append(self.quiet)
            return
        passed = {x.task_id: x for x in sorted((x for x in train_res if x.hard >= 1.0), key=order)}
        failures = [(by_id[i], x) for i, x in failed.items()]
        successes = [(by_id[i], x) for i, x in passed.items() if i not in failed]
        edits = self._reflect(failures, successes)
        if edits is None:  # reflect_invalid: recorded; the pending candidates are still replayed
            r.notes.append(f"{r.status}: {r.reason}")
            self.reflect_stop = (r.status, r.reason)
            r.status, r.reason = "running", ""
            return
        shown = failures[:cfg.reflect_examples] + successes[:max(1, cfg.reflect_examples // 2)]
        selected = lever_skills.selected_units((t.id, t.content_key()) for t, _ in shown)
        candidates, dropped = self.edits.screen(dict(self.edits.orig), edits)
        for e in candidates:
            ch = lever_skills.RuleChange(e.op, e.target, " ".join(e.content.split()), e.anchor, e.rationale)
            p = lever_skills.propose(self.led, ch, night=r.date, normalise=normalise_rule, selected_on=selected)
            e.status = "already_decided" if p.status == "final" else "pending"
            e.reason = p.reason
            self.tonight.setdefault(p.candidate.id, {})["proposed"] = p.status
        r.edits = [{**e.to_dict(), "candidate": self._cid(e)} for e in candidates] + [e.to_dict() for e in dropped]
        if not candidates:
            counts = Counter(e.status for e in dropped)
            self.quiet = (f"reflect proposed {len(edits)} edit(s), none applicable ("
                          + (", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none proposed") + ")")
            r.notes.append(self.quiet)

    def _cid(self, e: Edit) -> str | None:
        ch = lever_skills.RuleChange(e.op, e.target, " ".join(e.content.split()), e.anchor, e.rationale)
        c = self.led.find(lever_skills.LEVER, ch.key(normalise_rule))
        return c.id if c else None

    # ---- tonight's evidence
    def _pairs(self, with_rule: list[TaskResult], without: list[TaskResult]) -> list[lever_skills.Replay]:
        content = {t.id: t.content_key() for t in self.split["val"]}
        a: dict[str, list[float]] = {}
        b: dict[str, list[float]] = {}
        for x in with_rule:
            a.setdefault(x.task_id, []).append(float(x.hard))
        for x in without:
            b.setdefault(x.task_id, []).append(float(x.hard))
        return [lever_skills.Replay(t, content.get(t, ""), tuple(a[t]), tuple(b.get(t, ()))) for t in a]

    def _drop(self, c: Candidate, reason: str) -> None:
        before = c.state
        self.led.transition(c.id, "dropped" if before == "pending" else "reverted", night=self.r.date, reason=reason)
        self.transitions.append({"id": c.id, "from": before, "to": c.state, "reason": reason})

    def _evidence(self, live: dict[str, str], base_val: list[TaskResult]) -> None:
        r, led = self.r, self.led
        r.phase = "gate"
        fresh = self.backend.draws_fresh
        pending = led.of(lever_skills.LEVER, "pending")
        pending.sort(key=lambda c: (-led.standing(c.id)["evidence"], c.id not in self.tonight, c.index))
        for c in pending[self.lever.candidates_per_night:]:
            self.tonight.setdefault(c.id, {})["replay"] = (f"not replayed tonight: {self.lever.candidates_per_night} "
                                                           "candidates with more evidence were (candidates_per_night)")
        for c in pending[:self.lever.candidates_per_night]:
            res = self.docs.apply(dict(self.docs.orig), _edit(_change(c)))
            if res.docs is None:
                self._drop(c, f"its change no longer applies to the live version ({res.status}: {res.reason})")
                continue
            tree = _texts(res.docs, self.docs.orig, self.docs.live)
            cand = self._replay("val", tree, f"val ({c.id})", self.samples)
            r.per_task += _rows(f"val {c.id}", cand, self.samples)
            self.tonight.setdefault(c.id, {})["replay"] = lever_skills.add_replays(
                led, c.id, r.date, self._pairs(cand, base_val), fresh=fresh)
        accepted = sorted(led.of(lever_skills.LEVER, "accepted"),
                          key=lambda c: next(t.at for t in reversed(c.history) if t.state == "accepted"), reverse=True)
        for c in accepted[:self.lever.probation_replays]:
            docs = _undo(dict(self.docs.orig), c)
            if docs is None:
                self._drop(c, "its rule is no longer in the live version (removed outside the ledger)")
                continue
            tree = _texts(docs, self.docs.orig, self.docs.live)
            without = self._replay("val", tree, f"val (without {c.id})", self.samples)
            r.per_task += _rows(f"val without {c.id}", without, self.samples)
            self.tonight.setdefault(c.id, {})["probation_replay"] = lever_skills.add_replays(
                led, c.id, r.date, self._pairs(base_val, without), fresh=fresh)

    # ---- the decisions, the commit, the plan, the ledger saved
    def _close(self, live: dict[str, str]) -> None:
        if self.closed:
            return
        self.closed = True
        r, led = self.r, self.led
        prior = (r.status, r.reason)
        done = {t["id"] for t in self.transitions}
        self.transitions += lever_skills.decide_night(led, r.date, skip=done)
        r.phase = "commit"
        docs, accepted, reverted = dict(self.docs.orig), [], []
        for t in self.transitions:
            c = led.get(t["id"])
            if t["to"] == "reverted" and c.payload.get("version"):
                out = _undo(docs, c)
                if out is None:
                    r.notes.append(f"{c.id} reverted; its rule was no longer in the live version")
                    continue
                docs = out
                reverted.append(c)
        for t in self.transitions:
            c = led.get(t["id"])
            if t["to"] != "accepted":
                continue
            ch = _change(c)
            res = self.docs.apply(docs, _edit(ch))
            if res.docs is None:
                why = (f"accepted, but its change cannot be applied with the others accepted tonight ({res.status}: "
                       f"{res.reason}); never deployed")
                led.transition(c.id, "reverted", night=r.date, reason=why)
                t["note"] = why
                continue
            c.payload["added"], c.payload["removed"] = _rule_diff(docs[ch.skill], res.docs[ch.skill])
            docs = res.docs
            accepted.append(c)
        tree = _texts(docs, self.docs.orig, self.docs.live)
        new = {sid: tree[sid] for sid in sk.SKILL_IDS if tree[sid] != self.docs.live[sid]}
        if new and not self._commit_ledger(new, accepted, reverted):
            return  # refused or failed: the ledger is not saved, so it never says a rule is live that is not
        self.final = tree if new else None
        self._plan()
        try:
            saved = lever_skills.save_merged(led, self.path)
        except (LedgerError, OSError, filelock.Timeout) as e:
            r.status, r.cause = "store_error", str(e)
            r.reason = (f"the ledger could not be saved to {self.path}" + (
                f"; version {r.versions['after']} was committed: restore the ledger from the last bundle" if new else
                ""))
            return
        r.ledger["seq"] = led.data.seq
        r.ledger["saved"] = str(saved)
        self._report(prior, bool(new), accepted, reverted)

    def _commit_ledger(self, new: dict[str, str], accepted: list[Candidate], reverted: list[Candidate]) -> bool:
        r = self.r
        what = ([f"accepted {c.id} ({c.description}; {c.history[-1].reason})" for c in accepted]
                + [f"reverted {c.id} ({c.description}; {c.history[-1].reason})" for c in reverted])
        why = f"sage night {r.date} ({r.role}), the decision ledger: " + "; ".join(what)
        try:
            entry = self.root.commit(new, why[:4000], parent=r.versions["before"],
                                     action="commit" if accepted else "rollback")
        except SkillsRootChanged as e:
            r.candidate = new
            self._stop("conflict", f"the ledger decided ({'; '.join(what)}) but {e}; the ledger was not saved")
            return False
        except (SkillsRootError, sk.SkillsError, OSError) as e:
            r.candidate, r.cause = new, str(e)
            self._stop("store_error", f"the ledger decided ({'; '.join(what)}) but the skills root refused or failed "
                       f"the commit: {e}; the ledger was not saved")
            return False
        r.versions["after"], r.versions["after_seq"] = entry.version, entry.seq
        for c in accepted:
            c.payload.update(version=entry.version, previous=r.versions["before"])
        for c in reverted:
            c.payload["reverted_in"] = entry.version
        return True

    def _plan(self) -> None:
        """The next night's arms for the skills lever, their versions staged (committed, not live), the launcher."""
        r, led = self.r, self.led
        try:
            live_v = self.root.live()
            live = self.root.texts(live_v)
            want = lever_skills.arms_wanted(led, self.lever)
            skills = [s for s in dict.fromkeys(_change(led.get(cid)).skill for _, cid in want)
                      if s in sk.SKILL_IDS and s not in sk.NEVER_READ]
            docs = _Edits(self.cfg.role, live, skills, self.cfg.limits, self.total_cap)
            versions = {}
            for kind, cid in want:
                c = led.get(cid)
                if kind == "cand":
                    res = docs.apply(dict(docs.orig), _edit(_change(c)))
                    d = res.docs
                else:
                    d = _undo(dict(docs.orig), c)
                if d is None:
                    r.notes.append(f"no online arm for {c.id}: its change does not apply to the live version")
                    continue
                tree = _texts(d, docs.orig, docs.live)
                vid = _stage(self.root, {s: tree[s] for s in sk.SKILL_IDS if tree[s] != live[s]},
                             f"the ledger's {kind} arm for {c.id} ({c.description})", live_v)
                c.payload["staged"] = {"kind": kind, "version": vid, "night": r.date}
                versions[(kind, cid)] = self.root.versions_dir / vid
            p = lever_skills.plan(str(self.root.versions_dir / live_v), versions, self.lever,
                                  note=f"sage night {r.date}: the skills lever's arms")
            r.ledger["plan"] = lever_skills.save_plan(lever_skills.lever_dir(self.path), p)
        except (SkillsRootError, sk.SkillsError, DocumentError, OSError, ValueError) as e:
            r.notes.append(f"the next night's plan could not be written ({e}); the launcher keeps its last plan")

    def _report(self, prior: tuple[str, str], committed: bool, accepted: list[Candidate],
                reverted: list[Candidate]) -> None:
        r, led = self.r, self.led
        touched = set(self.tonight) | {t["id"] for t in self.transitions}
        rows = []
        for c in led.of(lever_skills.LEVER):
            if c.state in ("pending", "accepted") or c.id in touched:
                rows.append({**lever_skills.row(led, c), "tonight": self.tonight.get(c.id, {}),
                             "transition": next((t for t in self.transitions if t["id"] == c.id), None)})
        r.ledger.update(candidates=rows, transitions=self.transitions)
        for e in r.edits:
            cid = e.get("candidate")
            if cid:
                c = led.get(cid)
                e["status"], e["reason"] = c.state, lever_skills.standing_line(led, c)
        pending = [x for x in rows if x["state"] == "pending"]
        ahead = "; ".join(f"{x['id']} {x['standing']}" for x in pending[:3]) + (
            f"; and {len(pending) - 3} more" if len(pending) > 3 else "")
        if committed:
            r.gate_action = "+".join(a for a, xs in (("accept", accepted), ("revert", reverted)) if xs)
            self._stop("accepted", "; ".join(
                [f"{c.id} accepted ({c.description}): {c.history[-1].reason}" for c in accepted]
                + [f"{c.id} reverted ({c.description}): {c.history[-1].reason}" for c in reverted])
                + f"; committed as version {r.versions['after']} (v{r.versions['after_seq']})"
                + (f"; still pending: {ahead}" if pending else ""))
        elif prior[0] == "no_tasks":
            r.reason = prior[1] + "".join(f"; the ledger: {t['id']} {t['to']} ({t['reason']})"
                                          for t in self.transitions)
            r.reason += (f"; the ledger carries {len(pending)} pending candidate(s) to the next night: {ahead}"
                         if pending else "")
        elif pending:
            r.gate_action = "pending"
            self._stop("pending", f"{len(pending)} candidate(s) pending, tonight's evidence added to what earlier "
                       f"nights gathered (not a verdict): {ahead}")
        elif self.reflect_stop:
            self._stop(*self.reflect_stop)
        elif self.transitions:
            r.gate_action = "drop"
            self._stop("rejected", "; ".join(f"{t['id']} {t['to']}: {t['reason']}" for t in self.transitions))
        else:
            self._stop("no_edits", (self.quiet or "nothing proposed tonight") + "; nothing pending in the ledger")


def _cannot_tell(trials: list[Trial]) -> str:
    unsure = [t for t in trials if t.verdict == "cannot_tell" and t.needed_tasks]
    if not unsure:
        return ""
    best = max(unsure, key=lambda t: t.candidate - t.baseline)
    return (f"; this night cannot tell: its largest gain, {best.candidate - best.baseline:+.3f} over {best.tasks} "
            f"val task(s), needs about {best.needed_tasks} val tasks to resolve at level {best.level:.3g}"
            + (f" (these tasks resolve {best.detectable:+.3f} or more)" if best.detectable is not None else ""))


def night_dir(root: SageSkillsRoot, date: str, role: str) -> Path:
    return root.folder / NIGHTS_DIR / date / role


def _stopped_by(r: SageNightResult, e: BaseException, status: str) -> None:
    frames = traceback.extract_tb(e.__traceback__)
    at = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    r.status, r.cause = status, f"{type(e).__name__}: {e}"[:1000] + at
    r.traceback = "".join(traceback.format_exception(e))[-4000:]
    r.reason = (f"the night was interrupted during {r.phase or 'setup'}" if status == "aborted" else
                f"an unexpected error stopped the night during {r.phase or 'setup'} (a bug: report it with this "
                "night's diagnostics.json)") + ": nothing after this point was scored"


def run_sage_night(root: SageSkillsRoot, tasks: Sequence[TaskRecord], backend: ChatBackend, unit: UnitTestJudge,
                   config: SageNightConfig | None = None, *, date: str, harvest: dict | None = None,
                   log: Callable[[str], None] = lambda m: None, ledger: str | os.PathLike[str] | None = None,
                   lever: lever_skills.SkillsLeverConfig | None = None) -> SageNightResult:
    """One night on ``root`` (see the module doc) for ``config.role`` on ``tasks`` (the harvest's records;
    ``harvest``: its summary, kept in the diagnostics), the night of ``date`` (YYYY-MM-DD: it seeds the val
    slice). ``ledger`` (``decisions="ledger"``): the decision ledger's file (``run_sage_skills`` passes
    ``<data>/decisions/ledger.json``; None: ``<root>/decisions/ledger.json``); ``lever``: how the skills lever
    spends its nights and runs. Never raises for a night that went wrong in a way the result can explain (its
    status and cause say it); an interrupt is recorded, then raised again. ``diagnostics.json`` is written under
    ``<root>/nights/<date>/<role>/`` before the night starts (``running``) and when it ends."""
    cfg = config or SageNightConfig()
    r = SageNightResult(role=cfg.role, date=date, root=str(root.folder), started_at=_now(), harvest=harvest or {})
    out = night_dir(root, date, cfg.role)
    for p in (out.parent.parent, out.parent, out):
        if p.exists() and not p.is_dir():
            raise SageNightError(f"{p}: a file where the folder of the nights' diagnostics belongs; move it away, "
                                 "then run the night again")
    diag = out / "diagnostics.json"
    r.diagnostics = str(diag)
    t0 = time.monotonic()
    lock = filelock.FileLock(root.folder / NIGHT_LOCK)
    try:
        lock.acquire(timeout=cfg.lock_timeout_s, poll_interval=0.2)
    except filelock.Timeout:
        r.status, r.phase = "conflict", "setup"
        r.reason = (f"{root.folder / NIGHT_LOCK}: another night of this skills root still runs after "
                    f"{cfg.lock_timeout_s:g} s; nights never overlap, try again later")
        r.finished_at = _now()
        artifacts.write_json(diag, r.to_dict())
        return r
    interrupted: BaseException | None = None
    try:
        artifacts.write_json(diag, {**r.to_dict(), "reason": "started, not finished: if this is still here, the "
                                    "night was killed before its end"})
        try:
            _setup_and_run(root, tasks, backend, unit, cfg, r, log, ledger, lever)
        except Exception as e:  # noqa: BLE001 - a bug still leaves a record that says the night failed
            _stopped_by(r, e, "internal_error")
            log(f"sage night {date}: internal_error: {r.cause}\n{r.traceback}")
        except BaseException as e:  # interrupted: record it, then let it go on
            _stopped_by(r, e, "aborted")
            interrupted = e
        _finish(root, r, backend, unit)
        r.seconds = round(time.monotonic() - t0, 3)
        r.finished_at = _now()
        artifacts.write_json(diag, r.to_dict())
    finally:
        lock.release()
    log(f"sage night {date} ({cfg.role}): {r.status} ({r.reason}) in {r.seconds:.1f} s; {diag}")
    if interrupted is not None:
        raise interrupted
    return r


def _setup_and_run(root: SageSkillsRoot, tasks: Sequence[TaskRecord], backend: ChatBackend, unit: UnitTestJudge,
                   cfg: SageNightConfig, r: SageNightResult, log: Callable[[str], None],
                   ledger: str | os.PathLike[str] | None = None,
                   lever: lever_skills.SkillsLeverConfig | None = None) -> None:
    r.phase = "setup"
    missing = [m for m in ("complete", "calls", "describe") if not hasattr(backend, m)]
    if missing:
        r.status, r.cause = "input_error", f"{type(backend).__name__} has no {', '.join(missing)}"
        r.reason = ("the backend is not a chat backend: the night sends SAGE's own messages through its "
                    "complete(messages, purpose, max_tokens) (use sleep.backends.OllamaBackend or OpenAIBackend)")
        return
    r.backend = backend.describe()
    from sage_pipeline.sleep.sage_harvest import SageHarvestError, require_untrusted  # as run_sage_skills: lazily

    try:  # the night runs SAGE's tests and the model's code: never in a sandbox opened for trusted code
        require_untrusted(unit, "the night")
    except SageHarvestError as e:
        r.status, r.cause, r.reason = "input_error", str(e), "the judge's sandbox is not opened for untrusted code"
        return
    try:
        r.notes.append(root.recover() or "")
        before = root.live()
        seq = next(e.seq for e in reversed(root.versions()) if e.version == before)
        r.versions.update(before=before, after=before, before_seq=seq, after_seq=seq)
        r.shas["before"] = r.shas["after"] = root.shas(before)
    except (SkillsRootError, sk.SkillsError, OSError, StopIteration) as e:
        r.status, r.cause = "input_error", str(e)
        r.reason = "the skills root cannot be read as it is; nothing was changed"
        return
    r.notes = [n for n in r.notes if n]
    if cfg.decisions == "per_night":
        _Night(root, tasks, backend, unit, cfg, r, log).run()
        return
    path = Path(ledger) if ledger is not None else root.folder / "decisions" / "ledger.json"
    _LedgerNight(root, tasks, backend, unit, cfg, r, log, path, lever or lever_skills.SkillsLeverConfig()).run()


def _finish(root: SageSkillsRoot, r: SageNightResult, backend: ChatBackend, unit: UnitTestJudge) -> None:
    """The calls, the sandbox, the versions and the diff, whatever stopped the night."""
    calls = getattr(backend, "calls", None)
    if isinstance(calls, CallLog):
        r.calls, r.call_errors = calls.summary(), list(calls.errors)
    describe = getattr(unit, "describe", None)
    with contextlib.suppress(Exception):
        r.sandbox = describe() if callable(describe) else {}
    before, after = r.versions.get("before"), r.versions.get("after")
    if before and after and after != before:
        with contextlib.suppress(SkillsRootError, sk.SkillsError, OSError):
            r.shas["after"] = root.shas(after)
            r.diff = root.diff(before, after)


# ---------------------------------------------------------------------------------------------- the asset's work
def _env_paths(name: str) -> list[str]:
    return [p for p in os.environ.get(name, "").split(os.pathsep) if p.strip()]


class SageSkillsSettings(BaseModel):
    """What the ``sleep_cycle/sage_skills`` asset runs with (its Dagster config is this model, section by section).
    ``workspaces``, ``journals`` and ``goal_ledgers`` default to ``$SAGE_WORKSPACES``, ``$SAGE_JOURNALS`` and
    ``$SAGE_GOAL_LEDGERS`` (``os.pathsep``-separated) as they are when the config is made (at run time); when
    none of the three is given, ``embedded`` says whether the shipped week of SAGE's own runs is read
    (:func:`resolve_inputs`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workspaces: list[str] = Field(default_factory=lambda: _env_paths("SAGE_WORKSPACES"),
                                  description="SAGE's workspaces (the folders `sage run` ran in); default "
                                              "$SAGE_WORKSPACES. None and no journals: nothing to harvest")
    journals: list[str] = Field(default_factory=lambda: _env_paths("SAGE_JOURNALS"),
                                description="SAGE's journal files or folders, when not each workspace's "
                                            "memory/sessions; default $SAGE_JOURNALS")
    goal_ledgers: list[str] = Field(default_factory=lambda: _env_paths("SAGE_GOAL_LEDGERS"),
                                    description="JSON-lines goal ledgers {session_id or trace_id, goal} kept by "
                                                "whoever starts `sage run` (SAGE logs no goal); default "
                                                "$SAGE_GOAL_LEDGERS")
    embedded: bool = Field(True, description="with no workspaces, journals or goal ledgers given, read the shipped "
                           "week of SAGE's own runs (sage_pipeline.sage.week.embedded_week: journals, workspaces "
                           "and any goal ledger, extracted under the artifact root); False: nothing to harvest")
    embedded_first_night: str = Field("2026-11-01", pattern=r"^\d{4}-\d{2}-\d{2}$",
                                      description="YYYY-MM-DD, the night of the embedded week's day-01: "
                                       "the night of D harvests the week's days up to day (D - this) + 1 (its "
                                       "journals' timestamps are when the week was made, so its days are told "
                                       "apart by folder, not by time)")
    skills_root: str = Field("/".join(SKILLS_ROOT_DIR), description="the project's SAGE skills root (relative to "
                             "the artifact root, or absolute): deploy its live version with SAGE_SKILLS_ROOT")
    total_cap: int | None = Field(None, ge=1, description="SAGE_MAX_SKILL_CHARS_TOTAL of the SAGE the skills are "
                                  "deployed to (None: SAGE's default)")
    backend: Literal["ollama", "openai"] = Field("ollama", description="the client of the user's model: 'ollama' "
                                                 "(Ollama's native /api/chat, as SAGE calls it, at $OLLAMA_HOST) or "
                                                 "'openai' (any OpenAI-compatible server)")
    ollama: OllamaConfig = Field(default_factory=OllamaConfig, description="the ollama client: host, model, "
                                 "deadlines")
    openai: OpenAIConfig = Field(default_factory=OpenAIConfig, description="the openai client: any OpenAI-compatible "
                                 "chat-completions server (Ollama's /v1 included)")
    night: SageNightConfig = Field(default_factory=SageNightConfig, description="the night on SAGE's skills")
    online: OnlineCheckConfig = Field(default_factory=OnlineCheckConfig, description="the online check of the "
                                      "deployed edits on SAGE's journals, before the night")
    sandbox: Literal["docker", "local"] = Field("docker", description="where SAGE's tests and the code they judge "
                                                "run (model-written: the sandbox is opened untrusted): 'docker' "
                                                "(isolated) or 'local' (unisolated: refused unless "
                                                "allow_untrusted_local)")
    allow_untrusted_local: bool = Field(False, description="let sandbox 'local' run SAGE's harvested tests and the "
                                        "model's code. RISK: unisolated, they run as you and can read or write "
                                        "whatever you can (a hostile test can write files on this machine); only "
                                        "for a throwaway machine or code you trust (the model world's). The "
                                        "night's diagnostics say when it was used")
    sandbox_workers: int = Field(SandboxConfig.model_fields["workers"].default, ge=1,
                                 description="parallel sandbox workers (default: the sandbox's own): the harvest's "
                                 "validation and the replays' judge")
    harvest_days: int = Field(0, ge=0, description="harvest the runs of this many days before the night's end "
                              "(0: every run before it)")
    clock_scale: float = Field(1.0, gt=0, description="journal seconds per model second (1 for a real SAGE; the "
                               "model world's clock_scale for its journals)")

    @property
    def configured(self) -> bool:
        """Whether SAGE's runs were named (workspaces or journals), rather than the embedded week."""
        return bool(self.workspaces or self.journals)

    @property
    def client(self) -> OllamaConfig | OpenAIConfig:
        return self.ollama if self.backend == "ollama" else self.openai

    def make_backend(self) -> ChatBackend:
        """The configured client (a :class:`~sage_pipeline.sleep.backends.BackendError` when it cannot start)."""
        return BACKENDS[self.backend](self.client)

    def root_path(self, data_root: str | os.PathLike[str]) -> Path:
        p = Path(self.skills_root)
        return p if p.is_absolute() else Path(data_root) / p


NOT_CONFIGURED = ("no SAGE journals configured and embedded off: nothing to harvest (set workspaces or journals in "
                  "the asset's config, or $SAGE_WORKSPACES / $SAGE_JOURNALS, or leave embedded on)")


@dataclass(frozen=True)
class Inputs:
    """What a night harvests: SAGE's workspaces, journals (None: each workspace's memory/sessions) and goal
    ledgers, and where they came from."""

    workspaces: tuple[str, ...]
    journals: tuple[str, ...] | None
    goal_ledgers: tuple[str, ...]
    source: str  # "config" or "embedded week ..."
    embedded: bool = False  # the shipped week: its days told apart by folder, never by the journals' times


def resolve_inputs(s: SageSkillsSettings, data_root: str | os.PathLike[str], night: str | None = None) -> Inputs | None:
    """The night's inputs: the settings' own when any is given; else, with ``embedded``, the shipped week of SAGE's
    runs (:func:`sage_pipeline.sage.week.embedded_week`, extracted under ``data_root``): for the night ``night``
    (YYYY-MM-DD) its days up to ``(night - embedded_first_night) + 1``, every day when ``night`` is None; else
    None."""
    if s.workspaces or s.journals or s.goal_ledgers:
        return Inputs(tuple(s.workspaces), tuple(s.journals) or None, tuple(s.goal_ledgers), "config")
    if not s.embedded:
        return None
    try:
        from sage_pipeline.sage.week import embedded_week  # noqa: PLC0415 - another engineer's module, may be absent
    except ImportError as e:
        raise SageNightError(f"the embedded week of SAGE's runs cannot be read: {e} (sage_pipeline/sage/week.py "
                             "provides embedded_week); name SAGE's workspaces or journals instead ($SAGE_WORKSPACES "
                             "/ $SAGE_JOURNALS) or turn embedded off") from e
    week = embedded_week(Path(data_root))
    days = list(week.days)
    if night is not None:
        k = (Date.fromisoformat(night) - Date.fromisoformat(s.embedded_first_night)).days + 1
        days = days[:max(k, 0)]
    ws = [str(p) for d in days for p in sorted((Path(week.workspaces) / d).glob("ws-*")) if p.is_dir()]
    ledgers = tuple(str(p) for p in _week_ledgers(week))
    what = f"{days[0]}..{days[-1]}" if days else "no day yet"
    return Inputs(tuple(ws), None, ledgers, f"embedded week {Path(week.root).name} ({what} of {len(week.days)} days, "
                  f"{len(ledgers)} goal ledger(s))", embedded=True)


def _week_ledgers(week) -> list[Path]:
    """The goal ledgers the week ships (SAGE logs no goal: :mod:`.sage_harvest`): ``week.goal_ledgers`` when the
    week names them, else every ``goals*.jsonl`` under its ``records/``. None: every session is counted
    ``goal_not_found`` and the night has no task."""
    given = getattr(week, "goal_ledgers", None)
    if given:
        return [Path(p) for p in given]
    return sorted(p for p in (Path(week.root) / "records").rglob("goals*.jsonl") if p.is_file())


def live_skills(folder: str | os.PathLike[str]) -> Path | None:
    """The live version's folder of the SAGE skills root at ``folder``, or None when no root is there (never
    creates one)."""
    folder = Path(folder)
    if not (folder / "live.json").is_file():
        return None
    return SageSkillsRoot(folder).live_path()


@dataclass
class SageSkillsOutcome:
    """What the asset shows: the live version, the online check, the night (None when not run)."""

    configured: bool
    message: str
    root: str
    live: dict = field(default_factory=dict)  # version, seq, path, shas
    online: OnlineReport | None = None
    online_error: str = ""  # the online check could not read the journals or decide (the night still ran)
    night: SageNightResult | None = None
    harvest: dict = field(default_factory=dict)
    inputs: str = ""  # where SAGE's runs came from: "config" or the embedded week

    @property
    def healthy(self) -> bool:
        return not self.online_error and (self.night is None or self.night.status in HEALTHY)


def _live(root: SageSkillsRoot) -> dict:
    v = root.live()
    seq = next((e.seq for e in reversed(root.versions()) if e.version == v), None)
    return {"version": v, "seq": seq, "path": str(root.live_path()), "shas": root.shas(v)}


def run_sage_skills(data_root: str | os.PathLike[str], date: str, window: tuple[datetime, datetime] | None,
                    settings: SageSkillsSettings | None = None, log: Callable[[str], None] = lambda m: None,
                    backend: ChatBackend | None = None) -> SageSkillsOutcome:
    """The ``sleep_cycle/sage_skills`` asset's work for the night of ``date`` on SAGE's runs (:func:`resolve_inputs`:
    the configured ones, else the embedded week): the online check of the deployed versions on SAGE's journals (a
    harmful edit rolled back), then the harvest of SAGE's runs before the night's end and one night on the skills
    root; with no inputs (embedded off), :data:`NOT_CONFIGURED` and nothing else (the root is not even created).
    ``backend`` overrides the one the settings name; with none and no model configured the night is ``no_model``
    (harvested, nothing replayed)."""
    from sage_pipeline.sleep.sage_harvest import SageHarvestConfig, harvest_sage, untrusted_judge

    s = settings or SageSkillsSettings()
    folder = s.root_path(data_root)
    inputs = resolve_inputs(s, data_root, date)
    if inputs is None:
        live = {}
        if (folder / "live.json").is_file():
            live = _live(SageSkillsRoot(folder))
        return SageSkillsOutcome(False, NOT_CONFIGURED, str(folder), live)
    log(f"sage skills {date}: SAGE's runs from {inputs.source}: {len(inputs.workspaces)} workspace(s), "
        f"{len(inputs.journals or ())} journal folder(s), {len(inputs.goal_ledgers)} goal ledger(s)")
    root = SageSkillsRoot(folder, SageSkillsConfig(total_cap=s.total_cap))
    dirs = list(inputs.journals or ()) or [str(Path(w) / "memory" / "sessions") for w in inputs.workspaces]
    out = SageSkillsOutcome(True, "", str(folder), inputs=inputs.source)
    ledger = lever_skills.ledger_path(data_root)  # ledger mode: every lever's ledger, under the artifact root
    try:
        runs = runs_from_journals(dirs, s.night.role, s.clock_scale, log)
        if s.night.decisions == "ledger":  # the randomised runs feed the ledger (the day-vs-day check without them)
            out.online = check_ledger(root, runs, ledger, s.online, date=date, role=s.night.role, log=log)
        else:
            out.online = check(root, runs, s.online, date=date, role=s.night.role, log=log)
    except Exception as e:  # noqa: BLE001 - recorded and shown; the night still runs on the live version
        out.online_error = f"{type(e).__name__}: {e}"[:1000]
        log(f"online check failed: {out.online_error}")
    until = window[1] if window and not inputs.embedded else None
    since = (until - timedelta(days=s.harvest_days)) if until is not None and s.harvest_days else None
    hcfg = SageHarvestConfig(goal_ledgers=tuple(Path(p) for p in inputs.goal_ledgers), sandbox=s.sandbox,
                             sandbox_workers=s.sandbox_workers, allow_untrusted_local=s.allow_untrusted_local,
                             since=since, until=until)
    unit = untrusted_judge(s.sandbox, s.sandbox_workers, s.allow_untrusted_local, log)
    try:
        try:
            h = harvest_sage(list(inputs.workspaces), list(inputs.journals) if inputs.journals else None,
                             s.night.role, hcfg, judge=unit, log=log)
        except JudgeError as e:
            out.night = _harvest_failed(root, s.night.role, date, str(e), unit)
        except Exception as e:  # noqa: BLE001 - a bug in the harvest still leaves the night's diagnostics
            out.night = _harvest_failed(root, s.night.role, date, "", unit, e)
        else:
            out.harvest = {**h.summary(), "examples": h.examples}
            if backend is None and not s.client.model and h.tasks:  # no tasks: the night says no_tasks
                out.night = _no_model(root, s, date, out.harvest, unit)
            else:
                if backend is None:
                    try:
                        backend = s.make_backend()
                    except BackendError as e:
                        backend = _NoBackend(f"the backend could not be set up: {e.cause}")
                out.night = run_sage_night(root, h.tasks, backend, unit, s.night, date=date, harvest=out.harvest,
                                           log=log, ledger=ledger)
    finally:
        unit.close()
    out.live = _live(root)
    out.message = f"night {out.night.status}: {out.night.reason}" + (
        f"; the online check failed: {out.online_error}" if out.online_error else "")
    if inputs.embedded and not inputs.goal_ledgers and out.harvest.get("sessions"):
        out.message += ("; the embedded week ships no goal ledger (SAGE logs no goal: records/goals*.jsonl of "
                        "{session_id, goal} lines), so its runs count goal_not_found and give no task")
    return out


def _no_model(root: SageSkillsRoot, s: SageSkillsSettings, date: str, harvest: dict,
              unit: UnitTestJudge) -> SageNightResult:
    """The night when no model is configured: the harvest is kept, nothing is replayed, the live version stays
    (created as SAGE's tree as shipped on a new root); its diagnostics written."""
    r = SageNightResult(role=s.night.role, date=date, root=str(root.folder), status="no_model", phase="setup",
                        started_at=_now(), harvest=harvest,
                        reason=f"no model for the {s.backend} client: the harvest ran ({harvest.get('tasks', 0)} "
                               "task(s)), nothing was replayed and the skills are unchanged; set $SAGE_SLEEP_MODEL "
                               f"(or the config's {s.backend}.model) to the model SAGE's coder uses")
    with contextlib.suppress(Exception):
        r.sandbox = unit.describe()
    r.notes.append(root.recover() or "")
    r.notes = [n for n in r.notes if n]
    v = root.live()
    seq = next((e.seq for e in reversed(root.versions()) if e.version == v), None)
    r.versions.update(before=v, after=v, before_seq=seq, after_seq=seq)
    r.shas["before"] = r.shas["after"] = root.shas(v)
    r.finished_at = _now()
    r.diagnostics = str(artifacts.write_json(night_dir(root, date, s.night.role) / "diagnostics.json", r.to_dict()))
    return r


def _harvest_failed(root: SageSkillsRoot, role: str, date: str, cause: str, unit: UnitTestJudge,
                    error: Exception | None = None) -> SageNightResult:
    """The night of a harvest that raised: ``judge_error`` (its sandbox failed or refused), or
    ``internal_error`` with the traceback (``error``: a bug, since a bad input is counted, never raised);
    its diagnostics written either way, with the sandbox the harvest used."""
    r = SageNightResult(role=role, date=date, root=str(root.folder), status="judge_error", phase="harvest",
                        cause=cause, started_at=_now(),
                        reason="the sandbox failed or refused (see the cause) while validating the harvested tests "
                               "against SAGE's code: no task was replayed and the skills are unchanged")
    if error is not None:
        _stopped_by(r, error, "internal_error")
    with contextlib.suppress(Exception):
        r.sandbox = unit.describe()
    with contextlib.suppress(SkillsRootError, sk.SkillsError, OSError):
        v = root.live()
        r.versions.update(before=v, after=v)
    r.finished_at = _now()
    r.diagnostics = str(artifacts.write_json(night_dir(root, date, role) / "diagnostics.json", r.to_dict()))
    return r


class _NoBackend:
    """Stands for a backend that could not be started: every call fails with why (the night then ends
    ``backend_error`` at its first call, or ``no_tasks`` before any)."""

    draws_fresh = False

    def __init__(self, cause: str) -> None:
        self.cause, self.calls = cause, CallLog()

    def complete(self, messages: list[dict], purpose: str, max_tokens: int) -> Reply:
        raise BackendError(self.cause, kind="config", purpose=purpose)

    def describe(self) -> dict:
        return {"name": "none", "error": self.cause}
