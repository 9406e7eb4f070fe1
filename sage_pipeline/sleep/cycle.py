"""One night of consolidation: replay, reflect, edit, gate, commit, then test.

1. Replay the val split under the live (skill, memory): the baseline.
2. Replay the train split; its failures and successes go to reflect.
3. Reflect proposes at most ``edit_budget`` edits to the learned blocks; invalid,
   duplicate, no-op, over-cap, unmatched and outside-the-block edits are dropped and
   reported.
4. The gate replays val under each candidate (each edit on its own, in order, or all
   together) and keeps a candidate only if its test says so (``sleep/gate.py``). The default,
   ``paired``, is a one-sided sign-flip test over val tasks, each edit at ``alpha /
   edit_budget`` (so a night on which no edit has a real effect accepts anything with
   probability at most ``alpha``), and with ``no_regression`` a bound on the val tasks that
   drop significantly. Against a backend that draws fresh answers (temperature above 0) every val
   task is replayed ``samples`` times in each arm, the baseline included; a deterministic one
   once. A night that cannot tell says so, with the val tasks it would need. ``strict`` is the
   old rule (strictly better mean, and no val task worse). If val overlaps train (by id or by
   content) nothing is accepted: ``reject_unverified``.
5. An accepted candidate is committed (new version, atomic live replace) by the caller's
   ``commit``; only then is the test split scored, before and after, so it can never
   influence the decision.

A backend failure at any step ends the night with ``backend_error`` and its cause; what
was scored before it is kept in the report, nothing after it is guessed.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.sleep.backends import Backend, BackendError
from sage_pipeline.sleep.block import Edit, EditLimits, LearnedDoc, apply_edit, screen_edits
from sage_pipeline.sleep.gate import GateConfig, Trial, changes, compare, summary
from sage_pipeline.sleep.judges import JudgeError, UnitTestJudge
from sage_pipeline.sleep.prompts import ReplyFormatError, parse_reflect_reply
from sage_pipeline.sleep.records import ReflectRequest, TaskRecord, TaskResult
from sage_pipeline.sleep.replay import replay
from sage_pipeline.sleep.store import LiveChanged

STATUSES = ("accepted", "rejected", "reject_unverified", "no_edits", "reflect_invalid", "no_tasks",
            "backend_error", "judge_error", "input_error", "store_error", "conflict", "internal_error", "aborted")
# internal_error: an unexpected exception (a bug) stopped the night; aborted: it was interrupted
# (KeyboardInterrupt, SystemExit). "running" is only ever on disk while a night runs, or after
# one was killed before it could write its result.
ERROR_STATUSES = ("backend_error", "judge_error", "input_error", "store_error", "internal_error", "aborted")


class CycleConfig(BaseModel):
    """One night's consolidation: what may change, how the gate decides, how hard to work."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    limits: EditLimits = Field(default_factory=EditLimits, description="how much one night may change")
    gate: GateConfig = Field(default_factory=GateConfig, description="when a candidate survives")
    evolve_skill: bool = Field(True, description="let the night edit the skill document's learned block")
    evolve_memory: bool = Field(True, description="let the night edit the memory's learned block")
    workers: int = Field(1, ge=1, description="parallel backend calls while replaying")
    reflect_examples: int = Field(16, ge=1, description="train failures shown to reflect (and half as many "
                                  "successes)")

    def targets(self) -> tuple[str, ...]:
        return tuple(t for t, on in (("skill", self.evolve_skill), ("memory", self.evolve_memory)) if on)


@dataclass
class NightResult:
    """Everything a night did and why: diagnostics.json is this, as JSON."""

    skill: str
    date: str
    status: str = "running"
    gate_action: str = "none"  # accept | reject | reject_unverified | none
    reason: str = ""
    cause: str = ""  # for error statuses: what failed
    phase: str = ""  # where it stopped, for error statuses
    started_at: str = ""
    finished_at: str = ""
    seconds: float = 0.0
    backend: dict = field(default_factory=dict)
    sandbox: dict = field(default_factory=dict)
    harvest: dict = field(default_factory=dict)
    quarantined: list = field(default_factory=list)
    unusable: list = field(default_factory=list)
    tasks: dict = field(default_factory=dict)
    scores: dict = field(default_factory=lambda: {k: None for k in (
        "baseline_val", "candidate_val", "train", "test_before", "test_after")})
    trials: list = field(default_factory=list)
    edits: list = field(default_factory=list)
    val_changes: dict = field(default_factory=lambda: {"improved": [], "regressed": []})
    per_task: list = field(default_factory=list)
    reflect: dict = field(default_factory=lambda: {"reply_head": "", "error": "", "proposed": 0})
    calls: dict = field(default_factory=dict)
    call_errors: list = field(default_factory=list)
    versions: dict = field(default_factory=lambda: {"before": "", "after": ""})
    live: dict = field(default_factory=dict)
    block: dict = field(default_factory=dict)
    gate: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    candidate: dict = field(default_factory=dict)  # target -> document, when not written live
    traceback: str = ""  # internal_error, aborted: where it stopped

    def to_dict(self) -> dict:
        return asdict(self)

    def edits_with(self, *statuses: str) -> list[dict]:
        return [e for e in self.edits if e["status"] in statuses]

    @property
    def ok(self) -> bool:
        return self.status not in ERROR_STATUSES


def _order_key(task_id: str, salt: str) -> str:
    return hashlib.sha256(f"{salt}:{task_id}".encode()).hexdigest()


def _rows(phase: str, results: list[TaskResult], samples: int = 1) -> list[dict]:
    """Per-task rows of a replay; with several samples each row says which replay it was."""
    if samples <= 1:
        return [{"phase": phase, **r.to_dict()} for r in results]
    n = len(results) // samples
    return [{"phase": phase, "sample": i // n, **r.to_dict()} for i, r in enumerate(results)]


@dataclass
class _Gated:
    """Where the gate got to: the documents and val results of everything accepted so far."""

    docs: dict[str, LearnedDoc]
    val: list[TaskResult]
    trials: list[Trial] = field(default_factory=list)
    accepted: list[Edit] = field(default_factory=list)


def _cannot_tell(trials: list[Trial]) -> str:
    """What a night that could not tell would need: the val tasks for its largest unresolved gain, or,
    when nothing rose, the smallest change its val tasks resolve."""
    unsure = [t for t in trials if t.verdict == "cannot_tell" and t.needed_tasks]
    if not unsure:
        sized = [t for t in trials if t.detectable is not None]
        if not sized:
            return ""
        t = min(sized, key=lambda x: x.detectable)
        return (f"; no candidate rose: these {t.tasks} val task(s) resolve a change of {t.detectable:+.3f} or more "
                f"at level {t.level:.3g}")
    best = max(unsure, key=lambda t: t.candidate - t.baseline)
    return (f"; this night cannot tell: its largest gain, {best.candidate - best.baseline:+.3f} over {best.tasks} "
            f"val task(s), needs about {best.needed_tasks} val tasks to resolve at level {best.level:.3g}"
            + (f" (these tasks resolve {best.detectable:+.3f} or more)" if best.detectable is not None else ""))


class Cycle:
    """Runs the steps above, recording into ``result`` as it goes."""

    def __init__(self, tasks: list[TaskRecord], docs: dict[str, LearnedDoc], backend: Backend,
                 unit: UnitTestJudge, config: CycleConfig, result: NightResult,
                 commit: Callable[[dict[str, str]], str], log: Callable[[str], None] = lambda m: None) -> None:
        self.tasks = sorted(tasks, key=lambda t: t.id)
        self.docs, self.backend, self.unit, self.cfg, self.r = docs, backend, unit, config, result
        self.commit, self.log = commit, log
        self.split = {s: [t for t in self.tasks if t.split == s] for s in ("train", "val", "test")}
        self.samples = config.gate.replays(backend.draws_fresh)  # replays of each val task per arm

    def _replay(self, split: str, docs: dict[str, LearnedDoc], label: str, samples: int = 1) -> list[TaskResult]:
        return replay(self.split[split], docs["skill"].render(), docs["memory"].render(), self.backend, self.unit,
                      self.cfg.workers, self.log, label, samples)

    def _stop(self, status: str, reason: str) -> None:
        self.r.status, self.r.reason = status, reason

    def run(self) -> NightResult:
        r, cfg = self.r, self.cfg
        train, val = self.split["train"], self.split["val"]
        train_ids, train_keys = {t.id for t in train}, {t.content_key() for t in train}
        overlap = [t.id for t in val if t.id in train_ids or t.content_key() in train_keys]
        r.tasks = {"total": len(self.tasks), **{s: len(v) for s, v in self.split.items()},
                   "by_kind": {k: sum(t.reference_kind == k for t in self.tasks)
                               for k in sorted({t.reference_kind for t in self.tasks})},
                   "val_overlapping_train": overlap}
        r.gate = {**cfg.gate.model_dump(), "replays_per_val_task": self.samples,
                  "backend_draws_fresh": self.backend.draws_fresh}
        if not self.tasks:
            self._stop("no_tasks", "no usable tasks for this night: nothing to learn from or to verify with")
            return r
        if not val or not train:
            which = "val" if not val else "train"
            self._stop("no_tasks", f"{len(self.tasks)} tasks but none in the {which} split, so the night can "
                       f"{'verify no edit' if which == 'val' else 'learn nothing'}; add tasks (a task's split is "
                       "a hash of its id)")
            return r
        try:
            self._night(overlap)
        except BackendError as e:
            r.status, r.cause = "backend_error", e.cause
            r.reason = (f"the backend failed during {r.phase} ({e.kind}"
                        f"{', after ' + str(e.attempts) + ' attempts' if e.attempts > 1 else ''}): nothing after "
                        "this point was scored")
            if r.versions["after"]:
                r.reason += f"; the accepted version {r.versions['after']} was written before the test split"
        except JudgeError as e:
            r.status, r.cause = "judge_error", str(e)
            r.reason = f"a judge failed during {r.phase}: nothing after this point was scored"
        return r

    def _night(self, overlap: list[str]) -> None:
        r, cfg = self.r, self.cfg
        r.phase = "baseline_val"
        base_val = self._replay("val", self.docs, "val (baseline)", self.samples)
        r.scores["baseline_val"] = summary(base_val, cfg.gate)
        r.per_task += _rows("val baseline", base_val, self.samples)
        r.phase = "train"
        train_res = self._replay("train", self.docs, "train")
        r.scores["train"] = summary(train_res, cfg.gate)
        r.per_task += _rows("train", train_res)
        self._test(self._reflect_and_gate(base_val, train_res, overlap) or self.docs)

    def _reflect_and_gate(self, base_val: list[TaskResult], train_res: list[TaskResult],
                          overlap: list[str]) -> dict | None:
        """Steps 3-5: reflect on train, screen the proposed edits, gate them on val, commit the
        accepted ones. Returns the documents the test split is scored under after the night, or
        None when they are the night's starting ones (``self.r`` says why)."""
        examples = self._examples(train_res)
        edits = self._reflect(*examples) if examples else None
        screened = self._screen(edits) if edits is not None else None
        if screened is None:
            return None
        candidates, dropped = screened
        gated = self._gate(candidates, base_val)
        self._record_gate(gated, candidates, dropped, base_val)
        if not self._verdict(gated, candidates, dropped, overlap):
            return None
        return self._commit_accepted(gated, len(candidates))

    def _examples(self, train_res: list[TaskResult]) -> tuple[list, list] | None:
        """Train failures and successes as (task, result), in an order salted by the night; None
        (``no_edits``) when every train task passes."""
        by_id = {t.id: t for t in self.split["train"]}

        def ordered(rows) -> list:
            return sorted(((by_id[x.task_id], x) for x in rows), key=lambda p: _order_key(p[0].id, self.r.date))

        failures = ordered(x for x in train_res if x.hard < 1.0)
        if not failures:
            self._stop("no_edits", f"all {len(train_res)} train tasks pass: nothing to learn tonight")
            return None
        return failures, ordered(x for x in train_res if x.hard >= 1.0)

    def _reflect(self, failures: list, successes: list) -> list[Edit] | None:
        """Asks the backend for edits to the editable learned blocks; None (``reflect_invalid``) when
        its reply is not the JSON asked for."""
        r, cfg = self.r, self.cfg
        editable = {t: d for t, d in self.docs.items() if t in cfg.targets()}
        req = ReflectRequest(
            skill_name=r.skill, documents={t: d.render() for t, d in editable.items()},
            blocks={t: d.rules for t, d in editable.items()}, failures=failures[:cfg.reflect_examples],
            successes=successes[:max(1, cfg.reflect_examples // 2)], edit_budget=cfg.limits.edit_budget,
            block_max_chars=cfg.limits.block_max_chars, max_rule_chars=cfg.limits.max_rule_chars,
            room={t: cfg.limits.block_max_chars - d.block_chars() for t, d in editable.items()})
        r.phase = "reflect"
        reply = self.backend.reflect(req)
        r.reflect["reply_head"] = reply.text[:600]
        try:
            edits = parse_reflect_reply(reply.text)
        except ReplyFormatError as e:
            r.reflect["error"] = str(e)
            self._stop("reflect_invalid", f"reflect's reply could not be used ({e.problem}); the documents are "
                       "unchanged tonight")
            return None
        r.reflect["proposed"] = len(edits)
        return edits

    def _screen(self, edits: list[Edit]) -> tuple[list[Edit], list[Edit]] | None:
        """(candidates, dropped): invalid, duplicate, no-op, over-cap... edits are dropped with their
        reason; None (``no_edits``) when no candidate is left."""
        pre_invalid = [e for e in edits if e.status == "invalid"]
        screened = screen_edits(self.docs, [e for e in edits if e.status != "invalid"], self.cfg.limits,
                                self.cfg.targets())
        dropped = pre_invalid + screened.dropped
        self.r.edits = [e.to_dict() for e in dropped]
        if not screened.candidates:
            counts = Counter(e.status for e in dropped)
            detail = ", ".join(f"{n} {s}" for s, n in sorted(counts.items())) or "none proposed"
            self._stop("no_edits", f"reflect proposed {len(edits)} edit(s), none applicable ({detail})")
            return None
        return screened.candidates, dropped

    def _gate(self, candidates: list[Edit], base_val: list[TaskResult]) -> _Gated:
        """Each group (one edit, or all of them: ``granularity``) is applied on top of what was
        accepted so far, replayed on val and kept only if the gate accepts it; the paired test
        splits its level over the most edits a night may gate (one bundle: one trial)."""
        cfg, targets = self.cfg, self.cfg.targets()
        self.r.phase = "gate"
        g = _Gated(self.docs, base_val)
        groups = [[e] for e in candidates] if cfg.gate.granularity == "edit" else [candidates]
        family = cfg.gate.family(len(groups), cfg.limits.edit_budget)
        for group in groups:
            trial_docs, ok = g.docs, []
            for e in group:
                res = apply_edit(trial_docs, e, cfg.limits, targets)
                if res.docs is None:  # its anchor came from an edit the gate rejected
                    e.status, e.reason = res.status, res.reason + " (after earlier edits were rejected)"
                    continue
                trial_docs, ok = res.docs, ok + [e]
            if not ok:
                continue
            cand_val = self._replay("val", trial_docs, f"val (trial {len(g.trials) + 1})", self.samples)
            trial = compare(g.val, cand_val, cfg.gate, [e.describe() for e in ok], trials=family)
            g.trials.append(trial)
            self.log(f"gate trial {len(g.trials)}/{len(groups)}: {trial.reason}")
            self.r.per_task += _rows(f"val trial {len(g.trials)}", cand_val, self.samples)
            for e in ok:
                e.status, e.reason = ("accepted" if trial.accepted else "rejected"), trial.reason
            if trial.accepted:
                g.docs, g.val, g.accepted = trial_docs, cand_val, g.accepted + ok
        return g

    def _record_gate(self, g: _Gated, candidates: list[Edit], dropped: list[Edit],
                     base_val: list[TaskResult]) -> None:
        """The trials, every edit with its status, the candidate's val score and what changed on val."""
        r, cfg = self.r, self.cfg
        r.trials = [t.to_dict() for t in g.trials]
        r.edits = [e.to_dict() for e in candidates] + [e.to_dict() for e in dropped]
        best = max(g.trials, key=lambda t: t.candidate) if g.trials else None
        r.scores["candidate_val"] = (summary(g.val, cfg.gate) if g.accepted else
                                     (best and {"score": best.candidate, "hard": None, "soft": None,
                                                "tasks": best.tasks, "samples": best.samples,
                                                "note": "best rejected trial"}))
        if g.accepted:
            improved, regressed = changes(base_val, g.val, cfg.gate)
            r.val_changes = {"improved": improved, "regressed": regressed}

    def _verdict(self, g: _Gated, candidates: list[Edit], dropped: list[Edit], overlap: list[str]) -> bool:
        """True when the night may commit; else ``rejected`` (nothing passed) or ``reject_unverified``
        (edits passed, but val overlaps train)."""
        r = self.r
        if not g.accepted:
            r.gate_action = "reject"
            verdicts = Counter(t.verdict for t in g.trials)
            self._stop("rejected", f"none of {len(candidates)} candidate edit(s) passed the {self.cfg.gate.test} "
                       "gate (" + ", ".join(f"{n} {v}" for v, n in verdicts.items()) + ")" + _cannot_tell(g.trials))
            return False
        if overlap:
            for e in g.accepted:
                e.status, e.reason = "rejected", f"passed the gate, but val overlaps train: {e.reason}"
            r.edits = [e.to_dict() for e in candidates] + [e.to_dict() for e in dropped]
            r.gate_action = "reject_unverified"
            self._stop("reject_unverified", f"{len(g.accepted)} edit(s) passed the gate but {len(overlap)} val "
                       f"task(s) also appear in train ({', '.join(overlap[:5])}): an improvement there is not "
                       "verified")
            return False
        r.gate_action = "accept"
        return True

    def _commit_accepted(self, g: _Gated, n_candidates: int) -> dict | None:
        """Writes the accepted documents (the caller's ``commit``). A live file changed meanwhile is a
        ``conflict`` (the test split is still scored under the candidate), a write that failed a
        ``store_error``; either way the candidate is kept in the report."""
        r = self.r
        r.phase = "commit"
        texts = {t: d.render() for t, d in g.docs.items()}
        try:
            r.versions["after"] = self.commit(texts)
        except LiveChanged as e:
            r.candidate = texts
            self._stop("conflict", f"the gate accepted {len(g.accepted)} edit(s) but {e}")
            return g.docs
        except OSError as e:
            r.candidate = texts
            self._stop("store_error", f"the gate accepted {len(g.accepted)} edit(s) but writing them failed: {e}")
            r.cause = str(e)
            return None
        self._stop("accepted", f"{len(g.accepted)} of {n_candidates} candidate edit(s) accepted: "
                   f"val {self.cfg.gate.metric} {g.trials[0].baseline:.3f} -> {r.scores['candidate_val']['score']:.3f}")
        return g.docs

    def _test(self, final_docs: dict[str, LearnedDoc]) -> None:
        r = self.r
        if not self.split["test"]:
            r.notes.append("no test tasks tonight: test scores are empty")
            return
        r.phase = "test"
        before = self._replay("test", self.docs, "test (before)")
        r.scores["test_before"] = summary(before, self.cfg.gate)
        r.per_task += _rows("test before", before)
        if final_docs is self.docs:
            r.scores["test_after"] = r.scores["test_before"]
            return
        after = self._replay("test", final_docs, "test (after)")
        r.scores["test_after"] = summary(after, self.cfg.gate)
        r.per_task += _rows("test after", after)


def run_cycle(tasks: list[TaskRecord], docs: dict[str, LearnedDoc], backend: Backend, unit: UnitTestJudge,
              config: CycleConfig, result: NightResult, commit: Callable[[dict[str, str]], str],
              log: Callable[[str], None] = lambda m: None) -> NightResult:
    t0 = time.monotonic()
    try:
        Cycle(tasks, docs, backend, unit, config, result, commit, log).run()
    finally:  # also when an unexpected error stops the night: the report shows the calls made
        result.calls = backend.calls.summary()
        result.call_errors = list(backend.calls.errors)
        result.seconds = round(result.seconds + time.monotonic() - t0, 3)
    return result
