"""The deterministic simulated backend, the embedded default.

Its world (``data/sim_world.json``) gives, per skill, topics with the one rule that solves
their tasks, task templates with a gold and a naive answer, and rules that do nothing
(useless) or break other topics (harmful; some also solve their own topic, so an average
can hide the damage). A task is answered with its gold answer only when the skill or
memory holds its topic's rule (or a paraphrase) and no harmful rule present breaks its
topic; else with the naive one. The real judges score those answers.

Reflect reads the train failures and proposes, per failing topic, the right rule, a
useless one or a harmful one (and now and then a duplicate or an edit outside the block),
so the gate has real work to do. Every draw is seeded by (seed, night, call), so a run
is reproducible and two nights differ.

The world knows which rules are harmful (:meth:`SimWorld.classify`): the benchmark uses
that ground truth to count harmful edits the gate let through.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from sage_pipeline.sleep.backends import Backend, BackendError, Reply
from sage_pipeline.sleep.block import normalise_rule
from sage_pipeline.sleep.records import (
    DEFAULT_SPLIT,
    ReflectRequest,
    SplitSpec,
    TaskRecord,
    normalise_reference,
)

WORLD_FILE = Path(__file__).with_name("data") / "sim_world.json"
FAILURES = {
    "timeout": ("transient", "simulated backend: request timed out after 60 s (gave up after 5 attempts)"),
    "http_500": ("transient", "simulated backend: HTTP 500 from the server: internal error (gave up after 5 attempts)"),
    "rate_limit": ("transient", "simulated backend: HTTP 429 from the server: rate limited (gave up after 5 attempts)"),
    "empty": ("transient", "simulated backend: empty reply (finish_reason='stop') (gave up after 5 attempts)"),
    "auth": ("auth", "simulated backend: HTTP 401: invalid API key (authentication failed: check the API key)"),
}


@dataclass(frozen=True)
class Topic:
    id: str
    rule: str
    variants: tuple[str, ...]
    target: str
    base: bool
    templates: tuple[dict, ...]

    def texts(self) -> tuple[str, ...]:
        return (self.rule, *self.variants)


@dataclass(frozen=True)
class HarmfulRule:
    rule: str
    breaks: tuple[str, ...]  # topics whose tasks fail while the rule is present ("*": all)
    helps: tuple[str, ...]  # topics it solves anyway (the damage an average can hide)

    def breaks_topic(self, topic: str) -> bool:
        return topic not in self.helps and ("*" in self.breaks or topic in self.breaks)


def _present(text: str, doc_norm: str) -> bool:
    return normalise_rule(text) in doc_norm


@dataclass(frozen=True)
class SimWorld:
    skill: str
    topics: dict[str, Topic]
    useless: tuple[str, ...]
    harmful: tuple[HarmfulRule, ...]
    probabilities: dict[str, float]
    words: tuple[str, ...]

    @classmethod
    def load(cls, skill: str, path: str | Path = WORLD_FILE) -> SimWorld:
        return _load_world(skill, str(path))

    @property
    def learnable(self) -> list[str]:
        return sorted(t for t, v in self.topics.items() if not v.base)

    def classify(self, rule: str) -> str:
        """Ground truth for a rule: helpful (and its topic), useless, harmful or unknown."""
        n = normalise_rule(rule)
        for h in self.harmful:
            if normalise_rule(h.rule) == n:
                return "harmful"
        for t in self.topics.values():
            if any(normalise_rule(x) == n for x in t.texts()):
                return f"helpful:{t.id}"
        if any(normalise_rule(u) == n for u in self.useless):
            return "useless"
        return "unknown"

    def solves(self, topic: str, doc_norm: str) -> bool:
        """Whether a task of ``topic`` gets its gold answer under a (normalised) skill + memory."""
        present = [h for h in self.harmful if _present(h.rule, doc_norm)]
        if any(h.breaks_topic(topic) for h in present):
            return False
        if any(topic in h.helps for h in present):
            return True
        t = self.topics.get(topic)
        return t is not None and any(_present(x, doc_norm) for x in t.texts())

    def generate_tasks(self, seed: int, per_topic: int = 8, split: SplitSpec = DEFAULT_SPLIT,
                       prefix: str = "sim") -> list[TaskRecord]:
        """``per_topic`` tasks per topic from the templates, ids unique per (skill, seed)."""
        rng = np.random.default_rng([seed, 7919])
        tasks = []
        for topic in sorted(self.topics):
            t = self.topics[topic]
            for i in range(per_topic):
                tpl = t.templates[i % len(t.templates)]
                k = f"{self.words[int(rng.integers(len(self.words)))]}{i}"
                n = str(int(rng.integers(10, 400)))
                f = _fill(tpl, k, n)
                tid = f"{prefix}-{self.skill}-s{seed}-{topic}-{i:02d}"
                kind = f["reference_kind"]
                tasks.append(TaskRecord(
                    id=tid, intent=f["intent"], reference_kind=kind,
                    reference=normalise_reference(kind, f["reference"]), context=f.get("context", ""),
                    tags=(f"topic:{topic}",), split=split.of(tid), origin=f"simulated world, seed {seed}",
                    skill=self.skill, meta={"sim": {"topic": topic, "gold": f["gold"], "naive": f["naive"]}}))
        return tasks


def _fill(v: object, k: str, n: str) -> object:
    if isinstance(v, str):
        return v.replace("%k%", k).replace("%n%", n)
    if isinstance(v, list):
        return [_fill(x, k, n) for x in v]
    if isinstance(v, dict):
        return {a: _fill(b, k, n) for a, b in v.items()}
    return v


@lru_cache(maxsize=16)
def _load_world(skill: str, path: str) -> SimWorld:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    skills = data.get("skills", {})
    if skill not in skills:
        raise KeyError(f"{path}: the simulated world has no skill {skill!r} (it has {', '.join(sorted(skills))}); "
                       "use backend 'openai' for other skills, or add the skill to the world file")
    w = skills[skill]
    topics = {tid: Topic(tid, t["rule"], tuple(t.get("variants", ())), t.get("target", "skill"),
                         bool(t.get("base", False)), tuple(t["templates"])) for tid, t in w["topics"].items()}
    harmful = tuple(HarmfulRule(h["rule"], tuple(h["breaks"]), tuple(h.get("helps", ()))) for h in w["harmful"])
    return SimWorld(skill, topics, tuple(w["useless"]), harmful, dict(w["probabilities"]), tuple(data["words"]))


def _date_int(date: str) -> int:
    digits = "".join(c for c in date if c.isdigit())
    return int(digits) if digits else 0


class SimulatedBackend(Backend):
    """Deterministic stand-in for an LLM (see the module docstring).

    ``fail_at_call``: the n-th call (1-based) and every later one raise :class:`BackendError`
    of kind ``failure`` (one of :data:`FAILURES`), to exercise the ``backend_error`` path.
    """

    name = "simulated"

    def __init__(self, world: SimWorld, seed: int = 0, night: str = "", fail_at_call: int | None = None,
                 failure: str = "timeout") -> None:
        super().__init__()
        if failure not in FAILURES:
            raise ValueError(f"failure {failure!r}: use one of {', '.join(FAILURES)}")
        self.world, self.seed, self.night = world, seed, night
        self.fail_at_call, self.failure = fail_at_call, failure
        self._n = 0
        self._reflects = 0

    def describe(self) -> dict:
        return {"name": self.name, "skill": self.world.skill, "seed": self.seed,
                "fail_at_call": self.fail_at_call, "failure": self.failure if self.fail_at_call else None}

    def _call(self, purpose: str) -> None:
        self._n += 1
        if self.fail_at_call is not None and self._n >= self.fail_at_call:
            kind, cause = FAILURES[self.failure]
            self.calls.error(purpose, 1, cause, True)
            raise BackendError(cause, kind, purpose)

    def _reply(self, purpose: str, prompt_chars: int, text: str) -> Reply:
        r = Reply(text, prompt_chars // 4 + 1, len(text) // 4 + 1)
        self.calls.record(purpose, r)
        return r

    def solve(self, task: TaskRecord, skill: str, memory: str) -> Reply:
        self._call("solve")
        sim = task.meta.get("sim") if isinstance(task.meta, dict) else None
        size = len(skill) + len(memory) + len(task.intent) + len(task.context)
        if not sim or sim.get("topic") not in self.world.topics:
            return self._reply("solve", size, f"(the simulated backend has no answer for task {task.id}: it "
                                              "carries no simulation data)")
        doc_norm = normalise_rule(skill + "\n" + memory)
        text = sim["gold"] if self.world.solves(sim["topic"], doc_norm) else sim["naive"]
        return self._reply("solve", size, text)

    def grade(self, task: TaskRecord, response: str) -> Reply:
        self._call("grade")
        sim = task.meta.get("sim") if isinstance(task.meta, dict) else None
        r = " ".join(response.split())
        if sim and r == " ".join(sim["gold"].split()):
            score, why = 1.0, "meets the rubric"
        elif sim and r == " ".join(sim["naive"].split()):
            score, why = 0.25, "misses what the rubric asks for"
        else:
            score, why = 0.0, "unrelated to the rubric"
        return self._reply("grade", len(str(task.reference)) + len(response),
                           json.dumps({"score": score, "pass": score >= 0.7, "why": why}))

    def reflect(self, request: ReflectRequest) -> Reply:
        self._call("reflect")
        self._reflects += 1
        rng = np.random.default_rng([self.seed, _date_int(self.night), self._reflects])
        edits = self._propose(request, rng)
        size = sum(len(d) for d in request.documents.values()) + 200 * len(request.failures)
        return self._reply("reflect", size, json.dumps({"edits": edits}))

    def _propose(self, req: ReflectRequest, rng: np.random.Generator) -> list[dict]:
        w, p = self.world, self.world.probabilities
        counts: dict[str, int] = {}
        for t, _ in req.failures:
            topic = (t.meta.get("sim") or {}).get("topic") if isinstance(t.meta, dict) else None
            if topic in w.topics:
                counts[topic] = counts.get(topic, 0) + 1
        order = sorted(counts, key=lambda k: (-counts[k], rng.random()))
        block_rules = {tg: list(r) for tg, r in req.blocks.items()}
        all_rules = [r for rs in block_rules.values() for r in rs]
        harmful_in_block = [(tg, r) for tg, rs in block_rules.items() for r in rs
                            if w.classify(r) == "harmful"]
        edits: list[dict] = []
        for topic in order:
            if len(edits) >= req.edit_budget:
                break
            t = w.topics[topic]
            target = t.target if t.target in block_rules else next(iter(block_rules))
            culprit = [(tg, r) for tg, r in harmful_in_block
                       if any(h.breaks_topic(topic) and normalise_rule(h.rule) == normalise_rule(r) for h in w.harmful)]
            u = rng.random()
            if culprit:  # a failure caused by a learned rule: take the rule out
                tg, r = culprit[0]
                edits.append({"op": "delete", "target": tg, "anchor": r,
                              "rationale": f"{topic} tasks fail since this rule was learned"})
                harmful_in_block.remove(culprit[0])
                continue
            if u < p["good"]:
                content = t.texts()[int(rng.integers(len(t.texts())))]
                why = f"{counts[topic]} {topic} task(s) failed for want of this rule"
            elif u < p["good"] + p["useless"]:
                content, why = w.useless[int(rng.integers(len(w.useless)))], "general advice"
            elif u < p["good"] + p["useless"] + p["harmful"]:
                helping = [h for h in w.harmful if topic in h.helps]
                pool = helping if helping and rng.random() < 0.5 else list(w.harmful)
                content = pool[int(rng.integers(len(pool)))].rule
                why = f"a shortcut for the {topic} failures"
            else:
                edits.append(self._noise(req, block_rules, all_rules, rng, target))
                continue
            room = req.room.get(target, 0)
            if len(content) + 3 > room:  # make room: replace a rule that no task needs
                spare = [r for r in block_rules[target] if not w.classify(r).startswith("helpful")]
                if spare:
                    edits.append({"op": "replace", "target": target, "anchor": spare[0], "content": content,
                                  "rationale": why + "; replaces a rule that helps no task"})
                    block_rules[target].remove(spare[0])
                    continue
            edits.append({"op": "add", "target": target, "content": content, "rationale": why})
        return edits

    def _noise(self, req: ReflectRequest, blocks: dict, all_rules: list[str], rng: np.random.Generator,
               target: str) -> dict:
        """What real optimizers also send: a duplicate, an edit of text outside the block, a no-op."""
        kind = int(rng.integers(3))
        base = [t.rule for t in self.world.topics.values() if t.base]
        if kind == 0:
            content = all_rules[int(rng.integers(len(all_rules)))] if all_rules else base[0]
            return {"op": "add", "target": target, "content": content, "rationale": "restating a rule"}
        if kind == 1 or not all_rules:
            anchor = base[int(rng.integers(len(base)))]
            return {"op": "replace", "target": target, "anchor": anchor, "content": anchor.upper(),
                    "rationale": "emphasise an existing rule"}
        r = all_rules[int(rng.integers(len(all_rules)))]
        tg = next(tg for tg, rs in blocks.items() if r in rs) if any(r in rs for rs in blocks.values()) else target
        return {"op": "replace", "target": tg, "anchor": r, "content": r, "rationale": "restating a rule"}
