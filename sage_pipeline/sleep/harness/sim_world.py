"""TEST HARNESS, never imported by production code: the simulated world's task pool.

Its world (``data/sim_world.json``) gives, per skill, topics with the one rule that solves their tasks,
task templates with a gold and a naive answer (``meta.sim``: what :mod:`.standin` answers with), and rules
that do nothing (useless) or break other topics (harmful). :meth:`SimWorld.generate_tasks` draws seeded
tasks from it (``benchmarks/decision_month.py`` takes the coder's ``unit_tests`` ones);
:meth:`SimWorld.classify` is the ground truth of a rule. The packaged tasks (``data/tasks``) are the same
world's, written out.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from sage_pipeline.sleep.block import normalise_rule
from sage_pipeline.sleep.records import (
    DEFAULT_SPLIT,
    SplitSpec,
    TaskRecord,
    normalise_reference,
)

WORLD_FILE = Path(__file__).with_name("data") / "sim_world.json"
PACKAGED_TASKS = Path(__file__).with_name("data") / "tasks"


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
                       "add the skill to the world file")
    w = skills[skill]
    topics = {tid: Topic(tid, t["rule"], tuple(t.get("variants", ())), t.get("target", "skill"),
                         bool(t.get("base", False)), tuple(t["templates"])) for tid, t in w["topics"].items()}
    harmful = tuple(HarmfulRule(h["rule"], tuple(h["breaks"]), tuple(h.get("helps", ()))) for h in w["harmful"])
    return SimWorld(skill, topics, tuple(w["useless"]), harmful, dict(w["probabilities"]), tuple(data["words"]))
