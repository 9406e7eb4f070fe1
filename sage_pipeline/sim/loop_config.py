"""The SAGE-loop simulator's calibration, read from a YAML file with a source for every figure
(default: ``sage_pipeline/sim/data/sage_loop.yaml``).

What is published and what is assumed is kept apart: each model's HumanEval pass@1, its Aider
code-editing figures (first try, second try after the failing tests' output, seconds per
exercise) and an API model's list price each name a ``source`` (title, table or row, URL);
everything else is an ``assumption`` with its reason. From them (:class:`LoopConfig`):

* a coder's chance on a task at the reference difficulty: its HumanEval pass@1;
* a debugger's chance at the reference difficulty (before the feedback's gains): its Aider repair
  rate ``(pass_rate_2 - pass_rate_1) / (1 - pass_rate_1)``, moved by the model's own gap between
  HumanEval and Aider's harder exercises, ``logit(humaneval) - logit(pass_rate_1)``;
* a call's latency: Aider's seconds per exercise over the calls an exercise takes on average
  (``2 - pass_rate_1``: the second try only follows a failed first);
* a call's dollars: list price x the assumed tokens (API), or the GPU's assumed power x the
  latency x the assumed electricity price (local Ollama models: no list price).

Errors name the file and the field (``models.codestral:22b.aider.pass_rate_1``) and what to fix.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from sage_pipeline.routing.reward import REWARD_VERSIONS
from sage_pipeline.sim.obs import LAST_OUTCOMES

DEFAULT_CONFIG = Path(__file__).with_name("data") / "sage_loop.yaml"
ROLES = ("code", "debug")
ASSUMPTIONS = ("difficulty_slope", "difficulty_ref", "retry_q", "debug_kind_gain", "debug_tests_gain", "tests_ref",
               "family_offsets", "tokens", "gpu_watts", "usd_per_kwh")


class LoopConfigError(ValueError):
    """A calibration file that cannot be used; the message names the file and the field."""

    def __init__(self, source: str | Path, where: str, problem: str, fix: str = "") -> None:
        self.source, self.where = str(source), where
        super().__init__(f"{source}: field {where!r}: {problem}" + (f" ({fix})" if fix else ""))


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


@dataclass(frozen=True)
class Source:
    id: str
    title: str
    where: str
    url: str


@dataclass(frozen=True)
class ModelCalibration:
    name: str
    humaneval: float  # pass@1 (published)
    humaneval_source: str
    aider_pass1: float  # Aider code editing: first try (published)
    aider_pass2: float  # after the failing tests' output (published)
    aider_seconds_per_case: float
    aider_source: str
    input_usd_per_mtok: float | None = None  # list price (API models only)
    output_usd_per_mtok: float | None = None
    price_source: str | None = None
    mbpp: float | None = None  # published, reported beside the anchor (not used by the dynamics)
    rows: tuple[tuple[str, str], ...] = ()  # (figure, the table row it comes from)

    @property
    def local(self) -> bool:
        return self.input_usd_per_mtok is None

    @property
    def repair_rate(self) -> float:
        """Aider: the share of first-try failures the second try (with the tests' output) fixes."""
        return (self.aider_pass2 - self.aider_pass1) / (1.0 - self.aider_pass1)

    @property
    def latency_s(self) -> float:
        """Seconds per call: Aider's seconds per exercise / expected calls per exercise."""
        return self.aider_seconds_per_case / (2.0 - self.aider_pass1)

    @property
    def code_logit(self) -> float:
        """The coder's logit at the reference difficulty: HumanEval pass@1."""
        return logit(self.humaneval)

    @property
    def debug_logit(self) -> float:
        """The debugger's logit at the reference difficulty, before the feedback's gains."""
        return logit(self.repair_rate) + logit(self.humaneval) - logit(self.aider_pass1)


@dataclass(frozen=True)
class Budget:
    calls: int
    usd: float
    seconds: float


@dataclass(frozen=True)
class LoopConfig:
    source: str
    sources: dict[str, Source]
    models: dict[str, ModelCalibration]
    code_models: tuple[str, ...]
    debug_models: tuple[str, ...]
    static_roles: tuple[str, ...]
    budget: Budget
    reward_version: str
    cost_weight: float
    latency_weight: float
    assumptions: dict[str, object]  # name -> value
    why: dict[str, str]  # name -> reason
    routing_table: Path

    # ------------------------------------------------------------------ derived
    @property
    def call_actions(self) -> tuple[str, ...]:
        """Every call action, ``code:<model>`` then ``debug:<model>`` (the action order)."""
        return tuple(f"code:{m}" for m in self.code_models) + tuple(f"debug:{m}" for m in self.debug_models)

    def usd_per_call(self, model: str, role: str) -> float:
        m, tokens = self.models[model], self.assumptions["tokens"][role]
        if m.local:
            return self.assumptions["gpu_watts"] * m.latency_s / 3.6e6 * self.assumptions["usd_per_kwh"]
        return (tokens["input"] * m.input_usd_per_mtok + tokens["output"] * m.output_usd_per_mtok) / 1e6

    def table_rows(self) -> list[dict]:
        """The calibration table (docs/benchmarks.md, the asset's metadata): one row per model."""
        rows = []
        for name, m in self.models.items():
            rows.append({"model": name, "humaneval_pass1": m.humaneval, "mbpp_pass1": m.mbpp,
                         "aider_pass1": m.aider_pass1, "aider_pass2": m.aider_pass2,
                         "repair_rate": round(m.repair_rate, 4),
                         "code_chance_at_ref": round(m.humaneval, 4),
                         "debug_chance_at_ref": round(1.0 / (1.0 + math.exp(-m.debug_logit)), 4),
                         "latency_s": round(m.latency_s, 2),
                         "usd_code_call": round(self.usd_per_call(name, "code"), 6),
                         "usd_debug_call": round(self.usd_per_call(name, "debug"), 6),
                         "sources": ", ".join(dict.fromkeys(s for s in (m.humaneval_source, m.aider_source,
                                                                        m.price_source) if s))})
        return rows

    def to_dict(self) -> dict:
        return {"source": self.source, "routing_table": str(self.routing_table),
                "code_models": list(self.code_models), "debug_models": list(self.debug_models),
                "static_roles": list(self.static_roles), "budget": vars(self.budget),
                "reward_version": self.reward_version, "cost_weight": self.cost_weight,
                "latency_weight": self.latency_weight, "assumptions": self.assumptions,
                "models": self.table_rows(),
                "sources": {k: vars(s) for k, s in self.sources.items()}}

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path = DEFAULT_CONFIG) -> LoopConfig:
        path = Path(path)
        if not path.is_file():
            raise LoopConfigError(path, "<file>", "calibration file not found",
                                  f"pass the path of a file shaped like {DEFAULT_CONFIG}")
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise LoopConfigError(path, "<file>", f"not valid YAML: {exc}") from exc
        return cls.from_dict(doc, source=path)

    @classmethod
    def from_dict(cls, doc: object, source: str | Path = "<memory>") -> LoopConfig:
        r = _Reader(source)
        doc = r.mapping(doc, "<document>")
        sources = {k: Source(k, r.text(v, f"sources.{k}", "title"), r.text(v, f"sources.{k}", "where"),
                             r.text(v, f"sources.{k}", "url"))
                   for k, v in r.mapping(r.get(doc, "", "sources"), "sources").items()}
        models = {str(name): _model(r, str(name), spec, sources)
                  for name, spec in r.mapping(r.get(doc, "", "models"), "models").items()}
        actions = r.mapping(r.get(doc, "", "actions"), "actions")
        lists = {}
        for role in ROLES:
            names = r.get(actions, "actions", role)
            if not isinstance(names, list) or not names or len(set(names)) != len(names):
                r.fail(f"actions.{role}", f"expected a non-empty list of distinct model names, got {names!r}")
            for i, m in enumerate(names):
                if m not in models:
                    r.fail(f"actions.{role}[{i}]", f"model {m!r} has no calibration under 'models'",
                           f"add it (with its sources) or use one of {sorted(models)}")
            lists[role] = tuple(names)
        static = r.get(doc, "", "static_roles")
        if not isinstance(static, list) or not static or not all(isinstance(s, str) and s for s in static):
            r.fail("static_roles", f"expected a list of SAGE role names like [coder, debugger], got {static!r}")
        budget = r.mapping(r.get(doc, "", "budget"), "budget")
        calls = r.number(budget, "budget", "calls", lo=1, hi=12)
        if calls != int(calls):
            r.fail("budget.calls", f"expected a whole number of calls, got {calls!r}")
        reward = r.mapping(r.get(doc, "", "reward"), "reward")
        version = r.get(reward, "reward", "version")
        if version not in REWARD_VERSIONS:
            r.fail("reward.version", f"{version!r} is not a reward version", f"use one of {REWARD_VERSIONS}")
        assumptions, why = _assumptions(r, r.mapping(r.get(doc, "", "assumptions"), "assumptions"))
        table = r.get(doc, "", "routing_table")
        if not isinstance(table, str) or not table:
            r.fail("routing_table", f"expected the path of SAGE's models.yaml, got {table!r}")
        table_path = Path(table) if Path(table).is_absolute() else Path(str(source)).parent / table
        return cls(source=str(source), sources=sources, models=models, code_models=lists["code"],
                   debug_models=lists["debug"], static_roles=tuple(static),
                   budget=Budget(int(calls), r.number(budget, "budget", "usd", lo=1e-9),
                                 r.number(budget, "budget", "seconds", lo=1e-9)),
                   reward_version=version, cost_weight=r.number(reward, "reward", "cost_weight"),
                   latency_weight=r.number(reward, "reward", "latency_weight"),
                   assumptions=assumptions, why=why, routing_table=table_path)


class _Reader:
    """Field access on the parsed YAML with errors that name the file and the field."""

    def __init__(self, source) -> None:
        self.source = source

    def fail(self, where: str, problem: str, fix: str = ""):
        raise LoopConfigError(self.source, where, problem, fix)

    def mapping(self, value, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"expected a mapping, got {type(value).__name__}")
        return value

    def get(self, d: dict, where: str, key: str):
        if key not in d:
            self.fail(f"{where}.{key}".lstrip("."), "missing")
        return d[key]

    def text(self, d, where: str, key: str) -> str:
        v = self.get(self.mapping(d, where), where, key)
        if not isinstance(v, str) or not v.strip():
            self.fail(f"{where}.{key}", f"expected a non-empty string, got {v!r}")
        return v

    def number(self, d: dict, where: str, key: str, lo: float = 0.0, hi: float = math.inf) -> float:
        v = self.get(d, where, key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo <= v <= hi:
            self.fail(f"{where}.{key}", f"expected a number in [{lo}, {hi}], got {v!r}")
        return float(v)

    def source_id(self, d: dict, where: str, sources: dict) -> str:
        s = self.get(d, where, "source")
        if s not in sources:
            self.fail(f"{where}.source", f"{s!r} is not one of the file's sources {sorted(sources)}",
                      "every published figure names its source")
        return s


def _model(r: _Reader, name: str, spec, sources: dict) -> ModelCalibration:
    where = f"models.{name}"
    spec = r.mapping(spec, where)
    he = r.mapping(r.get(spec, where, "humaneval"), f"{where}.humaneval")
    ai = r.mapping(r.get(spec, where, "aider"), f"{where}.aider")
    prob = lambda d, w, k: r.number(d, w, k, lo=1e-6, hi=1 - 1e-6)  # noqa: E731
    p1, p2 = prob(ai, f"{where}.aider", "pass_rate_1"), prob(ai, f"{where}.aider", "pass_rate_2")
    if p2 <= p1:
        r.fail(f"{where}.aider.pass_rate_2", f"{p2} is not above pass_rate_1 {p1}: no repair rate can be derived")
    kw = {}
    if "price" in spec:
        price = r.mapping(spec["price"], f"{where}.price")
        kw = {"input_usd_per_mtok": r.number(price, f"{where}.price", "input_per_mtok"),
              "output_usd_per_mtok": r.number(price, f"{where}.price", "output_per_mtok"),
              "price_source": r.source_id(price, f"{where}.price", sources)}
    mbpp = None
    if "mbpp" in spec:
        mb = r.mapping(spec["mbpp"], f"{where}.mbpp")
        mbpp = prob(mb, f"{where}.mbpp", "value")
        r.source_id(mb, f"{where}.mbpp", sources)
    rows = tuple((k, str(spec[k].get("row", ""))) for k in ("humaneval", "mbpp", "aider") if k in spec)
    return ModelCalibration(name=name, humaneval=prob(he, f"{where}.humaneval", "value"),
                            humaneval_source=r.source_id(he, f"{where}.humaneval", sources),
                            aider_pass1=p1, aider_pass2=p2,
                            aider_seconds_per_case=r.number(ai, f"{where}.aider", "seconds_per_case", lo=1e-6),
                            aider_source=r.source_id(ai, f"{where}.aider", sources), mbpp=mbpp, rows=rows, **kw)


def _assumptions(r: _Reader, doc: dict) -> tuple[dict, dict]:
    values, why = {}, {}
    unknown = sorted(set(doc) - set(ASSUMPTIONS))
    if unknown:
        r.fail(f"assumptions.{unknown[0]}", "unknown assumption", f"the simulator reads {ASSUMPTIONS}")
    for name in ASSUMPTIONS:
        where = f"assumptions.{name}"
        entry = r.mapping(r.get(doc, "assumptions", name), where)
        why[name] = r.text(entry, where, "why")
        v = r.get(entry, where, "value")
        if name == "debug_kind_gain":
            v = r.mapping(v, f"{where}.value")
            if set(v) != set(LAST_OUTCOMES):
                r.fail(f"{where}.value", f"needs exactly the keys {LAST_OUTCOMES}, got {sorted(v)}")
            v = {k: r.number(v, f"{where}.value", k, lo=-20, hi=20) for k in LAST_OUTCOMES}
        elif name == "family_offsets":
            v = {str(k): r.number(r.mapping(v, f"{where}.value"), f"{where}.value", k, lo=-20, hi=20) for k in v}
        elif name == "tokens":
            v = r.mapping(v, f"{where}.value")
            v = {role: {k: r.number(r.mapping(r.get(v, f"{where}.value", role), f"{where}.value.{role}"),
                                    f"{where}.value.{role}", k) for k in ("input", "output")} for role in ROLES}
        else:
            hi = 1 - 1e-6 if name == "retry_q" else (1.0 if name in ("difficulty_ref", "tests_ref") else 1e6)
            lo = 1e-6 if name == "retry_q" else 0.0
            v = r.number(entry, where, "value", lo=lo, hi=hi)
        values[name] = v
    return values, why
