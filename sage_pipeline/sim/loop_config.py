"""The SAGE-loop simulator's calibration, read from a YAML file with a source for every figure
(default: ``sage_pipeline/sim/data/sage_loop.yaml``).

What is published and what is assumed is kept apart: each model's HumanEval pass@1, its Aider
code-editing figures (first try, second try after the failing tests' output, seconds per
exercise) and an API model's list price each name a ``source`` (title, table or row, URL);
everything else is an ``assumption`` with its reason. From them (:class:`SageLoopConfig`):

* a coder's chance on a task at the reference difficulty: its HumanEval pass@1;
* a debugger's chance at the reference difficulty (before the feedback's gains): its Aider repair
  rate ``(pass_rate_2 - pass_rate_1) / (1 - pass_rate_1)``, moved by the model's own gap between
  HumanEval and Aider's harder exercises, ``logit(humaneval) - logit(pass_rate_1)``;
* a call's latency: Aider's seconds per exercise over the calls an exercise takes on average
  (``2 - pass_rate_1``: the second try only follows a failed first);
* a call's dollars: list price x the assumed tokens (API), or the GPU's assumed power x the
  latency x the assumed electricity price (local Ollama models: no list price).

The file's shape is :class:`SageLoopConfig`: frozen pydantic models, one per mapping of the file, a
description per field. What a field allows is its type and bounds; the references between fields
(a figure's source, an action's model) are checked by the model. Errors name the file and the
field (``models.codestral:22b.aider.pass_rate_1``) and what to fix.
"""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Annotated, Any, Generic, Literal, TypeVar, Union, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from sage_pipeline.routing.reward import RewardVersion
from sage_pipeline.sim.obs import LAST_OUTCOMES

DEFAULT_CONFIG = Path(__file__).with_name("data") / "sage_loop.yaml"
ROLES = ("code", "debug")


class SageLoopConfigError(ValueError):
    """A calibration file that cannot be used; the message names the file and the field."""

    def __init__(self, source: str | Path, where: str, problem: str, fix: str = "") -> None:
        self.source, self.where = str(source), where
        super().__init__(f"{source}: field {where!r}: {problem}" + (f" ({fix})" if fix else ""))


def logit(p: float) -> float:
    return math.log(p / (1.0 - p))


# ------------------------------------------------------------------ field types
def _text(v: object) -> object:
    if not isinstance(v, str) or not v.strip():
        raise ValueError(f"expected a non-empty string, got {v!r}")
    return v


def _whole(v: object) -> object:
    """A whole number written as a float (``4.0``) is that integer; any other float is refused."""
    if isinstance(v, float):
        if not v.is_integer():
            raise ValueError(f"expected a whole number of calls, got {v!r}")
        return int(v)
    return v


def _every_outcome(v: dict[str, float]) -> dict[str, float]:
    if set(v) != set(LAST_OUTCOMES):
        raise ValueError(f"needs exactly the keys {LAST_OUTCOMES}, got {sorted(v)}")
    return {k: v[k] for k in LAST_OUTCOMES}


Text = Annotated[str, BeforeValidator(_text)]  # a non-empty string
Row = Annotated[str, BeforeValidator(str)]  # the table row a figure comes from, as written
Probability = Annotated[float, Field(ge=1e-6, le=1 - 1e-6)]
Share = Annotated[float, Field(ge=0.0, le=1.0)]
Amount = Annotated[float, Field(ge=0.0)]  # a finite number >= 0
Weight = Annotated[float, Field(ge=0.0, le=1e6)]
Gain = Annotated[float, Field(ge=-20.0, le=20.0)]  # logit added to a chance
KindGains = Annotated[dict[str, Gain], AfterValidator(_every_outcome)]
V = TypeVar("V")


class _Part(BaseModel):
    """A mapping of the calibration file: exactly its keys (an unknown one is refused), numbers as
    numbers (not strings or booleans) and finite."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


def _refuse(where: str, problem: str, fix: str) -> None:
    """A reference between fields that does not hold, at ``where`` (the file's field path)."""
    raise PydanticCustomError("calibration", "field {where}: {problem} ({fix})",
                              {"where": where, "problem": problem, "fix": fix})


# ------------------------------------------------------------------ the file's parts
class Source(_Part):
    """Where published figures come from."""

    title: Text = Field(description="the publication's title")
    where: Text = Field(description="the table or row the figures come from")
    url: Text = Field(description="where to read it")


class Figure(_Part):
    """A published pass@1 on a benchmark."""

    value: Probability = Field(description="pass@1, a share in (0, 1)")
    source: Text = Field(description="its source: a key of `sources`")
    row: Row = Field("", description="the table row it comes from")


class AiderFigures(_Part):
    """A model's row of Aider's code-editing leaderboard."""

    pass_rate_1: Probability = Field(description="share of the exercises passed at the first try")
    pass_rate_2: Probability = Field(description="share passed after a second try that sees the failing tests' "
                                     "output; above pass_rate_1")
    seconds_per_case: float = Field(ge=1e-6, description="seconds per exercise")
    source: Text = Field(description="its source: a key of `sources`")
    row: Row = Field("", description="the leaderboard row it comes from")

    @field_validator("pass_rate_2")
    @classmethod
    def _above_the_first_try(cls, v: float, info: ValidationInfo) -> float:
        p1 = info.data.get("pass_rate_1")
        if p1 is not None and v <= p1:
            raise ValueError(f"{v} is not above pass_rate_1 {p1}: no repair rate can be derived")
        return v


class Price(_Part):
    """An API model's list price."""

    input_per_mtok: Amount = Field(description="USD per million input tokens")
    output_per_mtok: Amount = Field(description="USD per million output tokens")
    source: Text = Field(description="its source: a key of `sources`")
    row: Row = Field("", description="the price list's row")


class ModelCalibration(_Part):
    """One model of SAGE's table the loop can call: its published figures, and what follows."""

    humaneval: Figure = Field(description="HumanEval pass@1: the anchor of the coder's chance")
    mbpp: Figure | None = Field(None, description="MBPP pass@1, reported beside the anchor (not used by the "
                                "dynamics)")
    aider: AiderFigures = Field(description="Aider's figures: the anchor of the debugger's chance and of the "
                                "latency")
    price: Price | None = Field(None, description="list price (API models); local models have none and are "
                                "priced by the electricity assumptions")

    @property
    def local(self) -> bool:
        return self.price is None

    @property
    def repair_rate(self) -> float:
        """Aider: the share of first-try failures the second try (with the tests' output) fixes."""
        a = self.aider
        return (a.pass_rate_2 - a.pass_rate_1) / (1.0 - a.pass_rate_1)

    @property
    def latency_s(self) -> float:
        """Seconds per call: Aider's seconds per exercise / expected calls per exercise."""
        return self.aider.seconds_per_case / (2.0 - self.aider.pass_rate_1)

    @property
    def code_logit(self) -> float:
        """The coder's logit at the reference difficulty: HumanEval pass@1."""
        return logit(self.humaneval.value)

    @property
    def debug_logit(self) -> float:
        """The debugger's logit at the reference difficulty, before the feedback's gains."""
        return logit(self.repair_rate) + logit(self.humaneval.value) - logit(self.aider.pass_rate_1)


class Actions(_Part):
    """The loop's call actions, ``code:<model>`` then ``debug:<model>``."""

    code: list[Text] = Field(min_length=1, description="models that write a fresh candidate (distinct names)")
    debug: list[Text] = Field(min_length=1, description="models that repair the current failing candidate given "
                              "the sandbox's feedback (distinct names)")

    @field_validator("code", "debug")
    @classmethod
    def _distinct(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError(f"expected distinct model names, got {v}")
        return v


class Budget(_Part):
    """Per task: a call that would exceed any of them is not made, and the episode ends."""

    calls: Annotated[int, BeforeValidator(_whole)] = Field(ge=1, le=12, description="model calls, in [1, 12]")
    usd: float = Field(ge=1e-9, description="dollars")
    seconds: float = Field(ge=1e-9, description="seconds of model time")


class LoopReward(_Part):
    """reward_v2's shape: SAGE's step reward - cost_weight x USD - latency_weight x seconds."""

    version: RewardVersion = Field(description="reward_v1 (SAGE's) or reward_v2 (minus cost_weight x USD)")
    cost_weight: Amount = Field(description="reward units per USD")
    latency_weight: Amount = Field(description="reward units per second of model latency")


class Assumed(_Part, Generic[V]):
    """An assumption: its value and the reason for it."""

    value: V = Field(description="the value")
    why: Text = Field(description="why it has this value")


class TokensPerCall(_Part):
    input: Amount = Field(description="tokens sent")
    output: Amount = Field(description="tokens received")


class Tokens(_Part):
    code: TokensPerCall = Field(description="a code call")
    debug: TokensPerCall = Field(description="a debug call (it also sends the candidate and the failing tests' "
                                 "output)")


class Assumptions(_Part):
    """Every figure nothing published gives, each with its reason."""

    difficulty_slope: Assumed[Weight] = Field(description="logit lost per unit of task difficulty")
    difficulty_ref: Assumed[Share] = Field(description="the difficulty at which a model passes with its "
                                           "HumanEval pass@1")
    retry_q: Assumed[Probability] = Field(description="chance that an attempt passes when the task is within the "
                                          "model's reach")
    debug_kind_gain: Assumed[KindGains] = Field(description="logit added to a repair's chance per outcome kind of "
                                                "the feedback (exactly the keys of LAST_OUTCOMES)")
    debug_tests_gain: Assumed[Weight] = Field(description="logit added to a repair's chance per unit share of the "
                                              "tests the failing candidate passes, centred on tests_ref")
    tests_ref: Assumed[Share] = Field(description="the share of tests passed where the tests gain is 0")
    family_offsets: Assumed[dict[str, Gain]] = Field(description="logit added per task family")
    tokens: Assumed[Tokens] = Field(description="tokens per call, per role")
    gpu_watts: Assumed[Weight] = Field(description="power of the GPU that runs the local models")
    usd_per_kwh: Assumed[Weight] = Field(description="electricity price: a local model's marginal cost")


# ------------------------------------------------------------------ the whole file
class SageLoopConfig(_Part):
    """The SAGE loop's calibration: the file, mapping by mapping, and what follows from it.
    ``source`` is the file it was read from (``<memory>`` otherwise); ``routing_table`` is
    resolved against the file's folder."""

    version: Literal[1] = Field(1, description="the file format's version")
    routing_table: Path = Field(description="SAGE's models.yaml (relative to this file), whose coder and debugger "
                                "rows are the static policy")
    sources: dict[str, Source] = Field(description="the publications the figures come from, by id")
    models: dict[str, ModelCalibration] = Field(description="every model the loop can call, by SAGE's name")
    actions: Actions = Field(description="the call actions")
    static_roles: list[Text] = Field(min_length=1, description="SAGE's roles whose routes are the static policy: "
                                     "the first writes the first candidate, the next handle the later calls")
    budget: Budget = Field(description="per task")
    reward: LoopReward = Field(description="the reward")
    assumptions: Assumptions = Field(description="every figure nothing published gives, each with its reason")

    _source: str = PrivateAttr("<memory>")

    @field_validator("routing_table", mode="before")
    @classmethod
    def _under_the_files_folder(cls, v: object, info: ValidationInfo) -> Path:
        path = v if isinstance(v, Path) else Path(_text(v))
        base = (info.context or {}).get("base")
        return path if path.is_absolute() or base is None else Path(base) / path

    @model_validator(mode="after")
    def _references_hold(self) -> SageLoopConfig:
        for name, m in self.models.items():
            for part in ("humaneval", "mbpp", "aider", "price"):
                fig = getattr(m, part)
                if fig is not None and fig.source not in self.sources:
                    _refuse(f"models.{name}.{part}.source", f"{fig.source!r} is not one of the file's sources "
                            f"{sorted(self.sources)}", "every published figure names its source")
        for role in ROLES:
            for i, m in enumerate(getattr(self.actions, role)):
                if m not in self.models:
                    _refuse(f"actions.{role}[{i}]", f"model {m!r} has no calibration under 'models'",
                            f"add it (with its sources) or use one of {sorted(self.models)}")
        return self

    # ------------------------------------------------------------------ derived
    @property
    def source(self) -> str:
        return self._source

    @property
    def code_models(self) -> tuple[str, ...]:
        return tuple(self.actions.code)

    @property
    def debug_models(self) -> tuple[str, ...]:
        return tuple(self.actions.debug)

    @property
    def call_actions(self) -> tuple[str, ...]:
        """Every call action, ``code:<model>`` then ``debug:<model>`` (the action order)."""
        return tuple(f"code:{m}" for m in self.code_models) + tuple(f"debug:{m}" for m in self.debug_models)

    @property
    def reward_version(self) -> str:
        return self.reward.version

    @property
    def cost_weight(self) -> float:
        return self.reward.cost_weight

    @property
    def latency_weight(self) -> float:
        return self.reward.latency_weight

    @property
    def assumed(self) -> dict[str, Any]:
        """Each assumption's value, by name (plain numbers and dicts)."""
        return {k: v["value"] for k, v in self.assumptions.model_dump().items()}

    @property
    def why(self) -> dict[str, str]:
        """Each assumption's reason, by name."""
        return {k: getattr(self.assumptions, k).why for k in Assumptions.model_fields}

    def usd_per_call(self, model: str, role: str) -> float:
        m, a = self.models[model], self.assumed
        if m.price is None:
            return a["gpu_watts"] * m.latency_s / 3.6e6 * a["usd_per_kwh"]
        tokens = a["tokens"][role]
        return (tokens["input"] * m.price.input_per_mtok + tokens["output"] * m.price.output_per_mtok) / 1e6

    def table_rows(self) -> list[dict]:
        """The calibration table (docs/benchmarks.md, the asset's metadata): one row per model."""
        rows = []
        for name, m in self.models.items():
            rows.append({"model": name, "humaneval_pass1": m.humaneval.value,
                         "mbpp_pass1": m.mbpp.value if m.mbpp else None,
                         "aider_pass1": m.aider.pass_rate_1, "aider_pass2": m.aider.pass_rate_2,
                         "repair_rate": round(m.repair_rate, 4),
                         "code_chance_at_ref": round(m.humaneval.value, 4),
                         "debug_chance_at_ref": round(1.0 / (1.0 + math.exp(-m.debug_logit)), 4),
                         "latency_s": round(m.latency_s, 2),
                         "usd_code_call": round(self.usd_per_call(name, "code"), 6),
                         "usd_debug_call": round(self.usd_per_call(name, "debug"), 6),
                         "sources": ", ".join(dict.fromkeys(f.source for f in (m.humaneval, m.aider, m.price)
                                                            if f))})
        return rows

    def to_dict(self) -> dict:
        """What the ppo_policy report records (its ``calibration``)."""
        return {"source": self.source, "routing_table": str(self.routing_table),
                "code_models": list(self.code_models), "debug_models": list(self.debug_models),
                "static_roles": list(self.static_roles), "budget": self.budget.model_dump(),
                "reward_version": self.reward_version, "cost_weight": self.cost_weight,
                "latency_weight": self.latency_weight, "assumptions": self.assumed,
                "models": self.table_rows(),
                "sources": {k: {"id": k, **s.model_dump()} for k, s in self.sources.items()}}

    # ------------------------------------------------------------------ loading
    @classmethod
    def load(cls, path: str | Path = DEFAULT_CONFIG) -> SageLoopConfig:
        path = Path(path)
        if not path.is_file():
            raise SageLoopConfigError(path, "<file>", "calibration file not found",
                                  f"pass the path of a file shaped like {DEFAULT_CONFIG}")
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, UnicodeDecodeError) as exc:
            raise SageLoopConfigError(path, "<file>", f"not valid YAML: {exc}") from exc
        return cls.from_dict(doc, source=path)

    @classmethod
    def from_dict(cls, doc: object, source: str | Path = "<memory>") -> SageLoopConfig:
        """The calibration from a parsed file; a bad one raises :class:`SageLoopConfigError` naming
        ``source`` and the field. Relative paths are resolved against ``source``'s folder."""
        try:
            cfg = cls.model_validate(doc, context={"base": Path(str(source)).parent})
        except ValidationError as exc:
            raise _file_error(source, exc) from None
        cfg._source = str(source)
        return cfg


# ------------------------------------------------------------------ errors
def _where(loc: tuple) -> str:
    """A validation error's location as the file's field path: ``models.x.aider.pass_rate_2``,
    ``actions.debug[1]``."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "<document>"


def _plain(tp: Any) -> Any:
    while True:
        if get_origin(tp) is Annotated:
            tp = get_args(tp)[0]
        elif get_origin(tp) in (Union, types.UnionType):
            tp = next(a for a in get_args(tp) if a is not type(None))
        else:
            return tp


def _part_at(loc: tuple) -> type[BaseModel] | None:
    """The model of the file's mapping at ``loc`` (None where it is not one)."""
    tp: Any = SageLoopConfig
    for key in loc:
        tp = _plain(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel) and key in tp.model_fields:
            tp = tp.model_fields[key].annotation
        elif get_origin(tp) in (dict, list):
            tp = get_args(tp)[-1]
        else:
            return None
    tp = _plain(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _file_error(source: str | Path, exc: ValidationError) -> SageLoopConfigError:
    """The first of the model's errors as a SageLoopConfigError naming the file and the field."""
    errors = exc.errors()
    e, more = errors[0], (f" ({len(errors) - 1} more error(s) in the file)" if len(errors) > 1 else "")
    if e["type"] == "calibration":
        return SageLoopConfigError(source, e["ctx"]["where"], e["ctx"]["problem"] + more, e["ctx"]["fix"])
    where, parent, key = _where(e["loc"]), _part_at(e["loc"][:-1]), e["loc"][-1] if e["loc"] else None
    if e["type"] == "missing":
        what = parent.model_fields[key].description if parent and key in parent.model_fields else ""
        return SageLoopConfigError(source, where, "missing" + more, f"add it: {what}" if what else "")
    if e["type"] == "extra_forbidden":
        keys = ", ".join(parent.model_fields) if parent else ""
        return SageLoopConfigError(source, where, "unknown key" + more, f"the keys here are {keys}" if keys else "")
    if e["type"] in ("model_type", "dict_type"):
        return SageLoopConfigError(source, where, f"expected a mapping, got {type(e.get('input')).__name__}" + more)
    msg = e["msg"].removeprefix("Value error, ")
    got = "" if "got " in msg or isinstance(e.get("input"), (dict, list)) else f", got {e.get('input')!r}"
    return SageLoopConfigError(source, where, msg + got + more)
