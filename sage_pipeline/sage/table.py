"""SAGE's static routing table (``models.yaml``): per role a primary, a fallback and
``fallback_triggers``. The fallback is used when any trigger fires.

The table is read as SAGE ships it: comments, any role name (SAGE's own table routes
``shell_router`` and ``shell_chat`` beside the eight agent roles) and any model id
(Ollama tags such as ``qwen2.5-coder:1.5b`` included). The role set is the table's: the
agent roles of :data:`ROLES` it routes, in that order, then
its other roles in file order (:attr:`RoutingTable.roles`); role indices everywhere
(``Contexts.role``, masks, feature one-hots) index that tuple. Models need not be in any
catalogue: a catalogue only adds prices (and, for the simulator, capabilities).

Triggers are ``var op number`` over ``task_complexity_score``, ``primary_failure_count``
and ``failure_count``. SAGE silently ignored a trigger it could not parse; here that is a
load error naming the role and the expression.

The fields are the ones SAGE's code reads: ``routing`` at the top
(``orchestrator/model_router.py``: ``self.config.get("routing", {})``), and per role
``primary``, ``fallback`` and ``fallback_triggers`` (``model_router.py`` ``select`` and
``should_use_fallback``; ``cli/main.py`` ``_validate_models_config``). SAGE ignores any
other key and keeps the last of a key written twice; here both are load errors naming
file, line and key (:data:`TABLE_FIELDS`, :data:`ROUTE_FIELDS`), so a misspelt ``primry``
is not silently routed to SAGE's default model.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml

from sage_pipeline import artifacts
from sage_pipeline.errors import ConfigError, KeyLines, check_keys, load_yaml

# the project's example multi-model table (its demos need many models); SAGE's own is SAGE_TABLE
DEFAULT_TABLE = Path(__file__).parents[1] / "routing" / "data" / "models.yaml"
# SAGE's models.yaml as SAGE ships it (src/sage/config/models.yaml, MIT: LICENSE beside it)
SAGE_TABLE = Path(__file__).with_name("data") / "models.yaml"

# Every key SAGE reads from models.yaml: the top-level mapping, and each role's route.
TABLE_FIELDS = ("routing",)
ROUTE_FIELDS = ("primary", "fallback", "fallback_triggers")

TRIGGER_VARS = ("task_complexity_score", "primary_failure_count", "failure_count")
_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
        "==": operator.eq, "!=": operator.ne}
_TRIGGER_RE = re.compile(
    r"^\s*(?P<var>[A-Za-z_][A-Za-z0-9_]*)\s*(?P<op>>=|<=|==|!=|>|<)\s*"
    r"(?P<num>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$"
)
# The numbers SAGE's own parser reads (model_router.py ``_eval_fallback_trigger``: ``[0-9]+(?:\.[0-9]+)?``
# after the operator, the whole expression stripped). A sign, an exponent, ``.5`` or ``2.`` do not match
# there, and SAGE then never fires the trigger, silently: here they are load errors.
_SAGE_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]+)?")

# SAGE's routed agent roles (src/sage/config/models.yaml, less the shell's own two), in the order the
# project lists them everywhere
ROLES: tuple[str, ...] = (
    "planner",
    "architect",
    "coder",
    "debugger",
    "reviewer",
    "test_engineer",
    "documentation",
    "memory_optimizer",
)


def sage_number(value: float) -> str:
    """``value`` as SAGE's trigger parser reads it: digits, a decimal part only when needed, never an
    exponent or a sign (a negative threshold cannot be written in SAGE's grammar)."""
    v = float(value)
    if not np.isfinite(v) or v < 0:
        raise ValueError(f"SAGE's trigger grammar has no way to write {value!r}: thresholds are numbers >= 0")
    if v == int(v):
        return str(int(v))
    text = repr(v)  # the shortest text that reads back as the same float
    if "e" in text:  # SAGE's parser reads no exponent: the same float in plain decimals
        text = next(t for t in (f"{v:.{n}f}" for n in range(1, 400)) if float(t) == v)
    return text


@dataclass(frozen=True)
class Trigger:
    var: str
    op: str
    value: float

    @classmethod
    def parse(cls, expr: object, *, source: str, role: str, i: int) -> "Trigger":
        where = f"routing.{role}.fallback_triggers[{i}]"
        if not isinstance(expr, str):
            raise ConfigError(source, where, f"expected a string like 'primary_failure_count >= 2', got {expr!r}")
        m = _TRIGGER_RE.match(expr)
        if not m:
            raise ConfigError(source, where, f"cannot parse trigger {expr!r} for role {role!r}",
                              "write 'variable op number', e.g. 'task_complexity_score > 0.8'")
        if not _SAGE_NUMBER.fullmatch(m["num"]):
            raise ConfigError(source, where, f"SAGE cannot read the number {m['num']!r} in trigger {expr!r} for role "
                              f"{role!r}: its parser takes digits with an optional decimal part only, and ignores "
                              "the trigger otherwise", "write the number as digits, e.g. 0.05 or 2")
        if m["var"] not in TRIGGER_VARS:
            raise ConfigError(source, where, f"unknown variable {m['var']!r} in trigger {expr!r} for role {role!r}",
                              f"use one of {', '.join(TRIGGER_VARS)}")
        return cls(m["var"], m["op"], float(m["num"]))

    def fires(self, values: dict[str, np.ndarray]) -> np.ndarray:
        return _OPS[self.op](np.asarray(values[self.var]), self.value)

    def __str__(self) -> str:
        return f"{self.var} {self.op} {sage_number(self.value)}"


# SAGE's rule for a role whose fallback_triggers are empty or missing (ModelRouter.should_use_fallback:
# ``failure_count >= 2 or float(task_complexity_score) > 0.8``)
BACKCOMPAT_TRIGGERS = (Trigger("failure_count", ">=", 2.0), Trigger("task_complexity_score", ">", 0.8))
# Triggers in SAGE's grammar that never / always fire for `sage run` (max_retries 5, complexity in [0, 1]):
# a route must name one of them to mean "primary only" or "fallback only", as an empty list means SAGE's
# back-compat rule
NEVER = (Trigger("primary_failure_count", ">=", 99.0),)
ALWAYS = (Trigger("primary_failure_count", ">=", 0.0),)


@dataclass(frozen=True)
class RoleRoute:
    role: str
    primary: str
    fallback: str
    triggers: tuple[Trigger, ...]

    @property
    def effective_triggers(self) -> tuple[Trigger, ...]:
        """The triggers SAGE evaluates: the route's, or its back-compat rule when there are none."""
        return self.triggers or BACKCOMPAT_TRIGGERS


def ordered_roles(names) -> tuple[str, ...]:
    """The agent roles of ROLES among ``names`` in ROLES' order, then the others in order."""
    names = list(dict.fromkeys(names))
    return tuple(r for r in ROLES if r in names) + tuple(r for r in names if r not in ROLES)


@dataclass(frozen=True)
class RoutingTable:
    routes: dict[str, RoleRoute]
    source: str = "<memory>"

    @property
    def roles(self) -> tuple[str, ...]:
        """The table's roles: the index order of every role array (see the module doc)."""
        return ordered_roles(self.routes)

    @property
    def models(self) -> tuple[str, ...]:
        """Every model the table names, in order of first appearance."""
        return tuple(dict.fromkeys(m for r in self.roles for m in (self.routes[r].primary, self.routes[r].fallback)))

    def _index(self, actions, which: str) -> np.ndarray:
        """``actions``: anything with an ``index`` mapping model -> column (an ActionSpace, a catalogue)."""
        idx = actions.index
        out = []
        for r in self.roles:
            model = getattr(self.routes[r], which)
            if model not in idx:
                raise ConfigError(self.source, f"routing.{r}.{which}",
                                  f"model {model!r} is not in the action set of {getattr(actions, 'source', actions)}")
            out.append(idx[model])
        return np.array(out, dtype=np.int64)

    def primary_index(self, actions) -> np.ndarray:
        """(n_roles,) column of each role's primary model in ``actions`` (its ``index``)."""
        return self._index(actions, "primary")

    def fallback_index(self, actions) -> np.ndarray:
        return self._index(actions, "fallback")

    def fallback_fires(self, role: np.ndarray, task_complexity_score: np.ndarray,
                       primary_failure_count: np.ndarray, failure_count: np.ndarray) -> np.ndarray:
        """Vectorised: does any fallback trigger of the row's role fire?"""
        role = np.asarray(role)
        values = {"task_complexity_score": np.asarray(task_complexity_score, dtype=np.float64),
                  "primary_failure_count": np.asarray(primary_failure_count, dtype=np.float64),
                  "failure_count": np.asarray(failure_count, dtype=np.float64)}
        out = np.zeros(role.shape, dtype=bool)
        for r_i, r in enumerate(self.roles):
            sel = role == r_i
            if not sel.any():
                continue
            sub = {k: v[sel] for k, v in values.items()}
            fired = np.zeros(int(sel.sum()), dtype=bool)
            for trig in self.routes[r].effective_triggers:
                fired |= trig.fires(sub)
            out[sel] = fired
        return out

    def choose(self, actions, role: np.ndarray, task_complexity_score: np.ndarray,
               primary_failure_count: np.ndarray, failure_count: np.ndarray) -> np.ndarray:
        """Vectorised SAGE routing: the column in ``actions`` of the chosen model per row."""
        role = np.asarray(role, dtype=np.int64)
        fired = self.fallback_fires(role, task_complexity_score, primary_failure_count, failure_count)
        return np.where(fired, self.fallback_index(actions)[role], self.primary_index(actions)[role])

    @classmethod
    def load(cls, path: str | Path = DEFAULT_TABLE) -> "RoutingTable":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(path, "<file>", "routing table not found",
                              "set routing_table in the sage resource or SAGE_ROUTING_TABLE")
        doc, lines = load_yaml(path)
        return cls.from_dict(doc, source=str(path), lines=lines)

    @classmethod
    def from_dict(cls, doc: object, source: str = "<memory>", lines: KeyLines | None = None) -> "RoutingTable":
        """The table in ``doc``; ``lines`` (from :func:`load_yaml`) puts line numbers in errors."""
        if not isinstance(doc, dict) or not isinstance(doc.get("routing"), dict):
            raise ConfigError(source, "routing",
                              "expected a mapping 'routing: {<role>: {primary, fallback, fallback_triggers}}'")
        check_keys(doc, TABLE_FIELDS, source=source, path=(), lines=lines, what="SAGE's models.yaml")
        routing = doc["routing"]
        routes: dict[str, RoleRoute] = {}
        if not routing:
            raise ConfigError(source, "routing", "no roles: the table routes nothing")
        for role, spec in routing.items():
            if not isinstance(role, str) or not role.strip():
                raise ConfigError(source, f"routing.{role}", "a role name must be a non-empty string")
            if not isinstance(spec, dict):
                raise ConfigError(source, f"routing.{role}",
                                  "expected a mapping with primary, fallback, fallback_triggers")
            check_keys(spec, ROUTE_FIELDS, source=source, path=("routing", role), lines=lines,
                       what="a route in SAGE's models.yaml")
            for key in ("primary", "fallback"):
                if not isinstance(spec.get(key), str) or not spec[key]:
                    raise ConfigError(source, f"routing.{role}.{key}", "missing or not a model name")
            raw = spec.get("fallback_triggers", []) or []
            if not isinstance(raw, list):
                raise ConfigError(source, f"routing.{role}.fallback_triggers", "expected a list of expressions")
            triggers = tuple(Trigger.parse(t, source=source, role=role, i=i) for i, t in enumerate(raw))
            routes[role] = RoleRoute(role, spec["primary"], spec["fallback"], triggers)
        return cls(routes, source=source)

    # ------------------------------------------------------------------ writing one, for SAGE_MODELS_YAML
    def with_route(self, role: str, primary: str | None = None, fallback: str | None = None,
                   triggers: tuple[Trigger, ...] | None = None) -> "RoutingTable":
        """A copy with ``role``'s route changed (a new role is added after the others)."""
        old = self.routes.get(role)
        if old is None and (primary is None or fallback is None):
            raise ValueError(f"role {role!r} is not in {self.source}: give its primary and fallback")
        new = RoleRoute(role, primary or old.primary, fallback or old.fallback,
                        tuple(triggers) if triggers is not None else old.triggers)
        return RoutingTable({**self.routes, role: new}, source=f"{self.source} (edited)")

    def to_doc(self) -> dict:
        """The table as SAGE's ``models.yaml`` mapping: ``routing`` -> role -> primary, fallback,
        fallback_triggers, the triggers in SAGE's grammar (:func:`sage_number`), roles in file order."""
        return {"routing": {role: {"primary": r.primary, "fallback": r.fallback,
                                   "fallback_triggers": [str(t) for t in r.triggers]}
                            for role, r in self.routes.items()}}

    def to_yaml(self, header: str = "") -> str:
        lead = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
        return lead + yaml.safe_dump(self.to_doc(), sort_keys=False, default_flow_style=False, width=1000)

    def write(self, path: str | Path, header: str = "") -> Path:
        """Write the table atomically as a ``models.yaml`` SAGE reads (``SAGE_MODELS_YAML``), then read
        it back with this loader: a table that does not survive the round trip is an error."""
        out = artifacts.write_text(path, self.to_yaml(header))
        back = RoutingTable.load(out)
        if back.routes != self.routes:
            raise ValueError(f"{out}: the written table does not read back as written (a route changed on the "
                             "round trip): report it, with the table")
        return out


def pin(table: RoutingTable, role: str, model: str) -> RoutingTable:
    """``table`` with ``role`` on ``model`` alone: primary and fallback both ``model``, and a trigger that
    never fires (an empty list would be SAGE's back-compat rule). For the coder this is the lever a
    models.yaml pulls without any bandit state: SAGE's bandit then chooses between two strategies of
    one model."""
    return table.with_route(role, primary=model, fallback=model, triggers=NEVER)
