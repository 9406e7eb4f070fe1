"""The model catalogue: optional information about models, keyed by model id.

For the offline chain it only adds prices: a decision whose log has no cost is priced
from here (``cost_per_call`` + ``cost_per_1k_prompt_tokens``); a model it does not list
has an unknown cost. Roles and models come from the routing table and the logs, never
from here. For the routing simulator it also describes each model: a capability per role
(a model is a simulated candidate for a role exactly when it has one), a latency, a
timeout rate and a comfortable context size. So a prices-only catalogue (``cost_per_call``
and nothing else per model) is valid; the simulator refuses it, naming what is missing.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sage_pipeline.errors import ConfigError, KeyLines, check_keys, load_yaml
from sage_pipeline.routing.schema import ROLES

# the example catalogue of the example multi-model table (sage.table.DEFAULT_TABLE): the demos that need many models
DEFAULT_CATALOGUE = Path(__file__).with_name("data") / "model_catalogue.yaml"
# the catalogue of SAGE's own table (sage.table.SAGE_TABLE), every figure derived from the project's sourced
# calibration (sim/data/sage_loop.yaml, sim/data/model_time.yaml; the file's header says how): the default
SAGE_CATALOGUE = Path(__file__).with_name("data") / "sage_model_catalogue.yaml"
# Prompt size assumed where a log does not record it (costs, latencies, the simulator).
ASSUMED_PROMPT_TOKENS = 4000.0
# The catalogue's fields: anything else (a misspelt ``cost_per_cal``) is a load error naming
# file, line and key, as is a key written twice.
CATALOGUE_FIELDS = ("version", "models")
MODEL_FIELDS = ("cost_per_call", "cost_per_1k_prompt_tokens", "latency_s", "timeout_rate", "context_tokens",
                "capability")


def known_tokens(prompt_tokens: np.ndarray) -> np.ndarray:
    """Prompt sizes with missing values (NaN) replaced by ASSUMED_PROMPT_TOKENS."""
    return np.nan_to_num(np.asarray(prompt_tokens, dtype=np.float64), nan=ASSUMED_PROMPT_TOKENS)



def _spec_number(spec: dict, source: str, where: str, key: str, default: float | None = None, lo: float = 0.0,
                 hi: float = math.inf) -> float:
    """``spec[key]`` (or ``default``) as a finite float in ``[lo, hi]``, else a ConfigError at ``where.key``."""
    val = spec.get(key, default)
    if val is None:
        raise ConfigError(source, f"{where}.{key}", "missing")
    if isinstance(val, bool) or not isinstance(val, (int, float)) or not math.isfinite(val):
        raise ConfigError(source, f"{where}.{key}", f"expected a finite number, got {val!r}")
    if not lo <= val <= hi:
        raise ConfigError(source, f"{where}.{key}", f"{val} outside [{lo}, {hi}]")
    return float(val)

@dataclass(frozen=True)
class ModelSpec:
    name: str
    cost_per_call: float  # USD per call
    cost_per_1k_prompt_tokens: float  # USD per 1,000 prompt tokens
    latency_s: float  # seconds per call at 4k prompt tokens (simulator)
    timeout_rate: float  # probability of a timeout per call at 4k prompt tokens (simulator)
    context_tokens: int  # prompts longer than this degrade the model (simulator)
    capability: dict[str, float]  # role -> capability in [0, 1] (simulator; may be empty)


@dataclass(frozen=True)
class ModelCatalogue:
    models: tuple[ModelSpec, ...]
    source: str = "<memory>"

    @property
    def actions(self) -> tuple[str, ...]:
        """The ordered action tuple: every policy's column order."""
        return tuple(m.name for m in self.models)

    @property
    def roles(self) -> tuple[str, ...]:
        """The roles the catalogue's capabilities (and so the simulator) describe."""
        return ROLES

    @property
    def index(self) -> dict[str, int]:
        return {m.name: i for i, m in enumerate(self.models)}

    def candidates(self, role: str) -> tuple[str, ...]:
        return tuple(m.name for m in self.models if role in m.capability)

    def role_mask(self) -> np.ndarray:
        """(n_roles, K) bool: model k is a candidate for role r."""
        return np.array([[r in m.capability for m in self.models] for r in ROLES], dtype=bool)

    def array(self, field: str) -> np.ndarray:
        return np.array([getattr(m, field) for m in self.models], dtype=np.float64)

    def capability_matrix(self) -> np.ndarray:
        """(n_roles, K) capability; NaN where the model is not a candidate."""
        return np.array(
            [[m.capability.get(r, np.nan) for m in self.models] for r in ROLES], dtype=np.float64
        )

    def cost_usd(self, action: np.ndarray, prompt_tokens: np.ndarray) -> np.ndarray:
        per_call = self.array("cost_per_call")[action]
        per_tok = self.array("cost_per_1k_prompt_tokens")[action]
        return per_call + per_tok * known_tokens(prompt_tokens) / 1000.0

    def latency_s(self, action: np.ndarray, prompt_tokens: np.ndarray) -> np.ndarray:
        base = self.array("latency_s")[action]
        return base * (0.5 + 0.5 * known_tokens(prompt_tokens) / 4000.0)

    @classmethod
    def load(cls, path: str | Path = DEFAULT_CATALOGUE) -> "ModelCatalogue":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(path, "<file>", "model catalogue not found",
                              "set model_catalogue in the sage resource or SAGE_MODEL_CATALOGUE")
        doc, lines = load_yaml(path)
        return cls.from_dict(doc, source=str(path), lines=lines)

    @classmethod
    def from_dict(cls, doc: object, source: str = "<memory>", lines: KeyLines | None = None) -> "ModelCatalogue":
        """The catalogue in ``doc``; ``lines`` (from :func:`load_yaml`) puts line numbers in errors."""
        if not isinstance(doc, dict) or not isinstance(doc.get("models"), dict) or not doc["models"]:
            raise ConfigError(source, "models", "expected a non-empty mapping of model name -> spec")
        check_keys(doc, CATALOGUE_FIELDS, source=source, path=(), lines=lines, what="a model catalogue")
        models = []
        for name, spec in doc["models"].items():
            where = f"models.{name}"
            if not isinstance(spec, dict):
                raise ConfigError(source, where, "expected a mapping")
            check_keys(spec, MODEL_FIELDS, source=source, path=("models", name), lines=lines,
                       what="a model in the catalogue")

            num = functools.partial(_spec_number, spec, source, where)
            cap = spec.get("capability", {})
            if not isinstance(cap, dict):
                raise ConfigError(source, f"{where}.capability", "expected a mapping role -> capability")
            for role, val in cap.items():
                if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0.0 <= val <= 1.0:
                    raise ConfigError(source, f"{where}.capability.{role}",
                                      f"expected a number in [0, 1], got {val!r}")
            models.append(ModelSpec(
                name=str(name),
                cost_per_call=num("cost_per_call"),
                cost_per_1k_prompt_tokens=num("cost_per_1k_prompt_tokens", 0.0),
                latency_s=num("latency_s", 0.0, lo=0.0),
                timeout_rate=num("timeout_rate", 0.0, hi=0.5),
                context_tokens=int(num("context_tokens", 128000, lo=1)),
                capability={r: float(v) for r, v in cap.items()},
            ))
        return cls(tuple(models), source=source)

    def check_simulates(self) -> None:
        """Raise unless every simulated role (ROLES) has a candidate: what the simulator needs."""
        for role in ROLES:
            if len(self.candidates(role)) < 1:
                raise ConfigError(self.source, "models.*.capability",
                                  f"no model is a candidate for role {role!r}: the routing simulator needs a "
                                  "capability per role (a prices-only catalogue serves real logs only)")
