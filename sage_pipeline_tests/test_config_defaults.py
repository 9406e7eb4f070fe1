"""Each default is declared once: a Dagster ``Config`` class (or configurable resource) in
``sage_pipeline.defs`` takes its defaults from the core config it mirrors (by inheriting the
core model, section by section, as ``defs/sleep_assets.py`` does) instead of writing them again.

A field *repeats a core default* when the Dagster class's own body declares a default for it
(inherited fields do not count, nor nested config sections) and some core config (a dataclass
or pydantic model outside ``defs`` whose name ends in Config, Settings, Spec or Limits) has a
field of the same name, or whose name the Dagster field ends with (``gate_metric`` ->
``metric``), with an equal default. The classes that still do so are listed in NOT_MIGRATED
with the fields and why: the test fails when a new duplicate appears anywhere, and when a listed
one is fixed but still listed.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import pkgutil
from numbers import Number

import dagster as dg
import pytest
from pydantic import BaseModel, Field
from pydantic_core import PydanticUndefined

import sage_pipeline
from sage_pipeline.sleep.gate import GateConfig

CORE_SUFFIXES = ("Config", "Settings", "Spec", "Limits")
_NONE = object()

NOT_MIGRATED: dict[str, tuple[set[str], str]] = {}  # none left (issue 18); a class listed here must say why


def _classes() -> list[type]:
    out: dict[type, None] = {}
    for info in pkgutil.walk_packages(sage_pipeline.__path__, "sage_pipeline."):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(mod, inspect.isclass):
            if cls.__module__ == mod.__name__:
                out[cls] = None
    return list(out)


def _default(field) -> object:
    """A pydantic field's default, from its value or its factory (``_NONE``: none)."""
    if field.default is not PydanticUndefined:
        return field.default
    if field.default_factory is not None:
        try:
            return field.default_factory()
        except TypeError:  # a factory that takes the validated data
            return _NONE
    return _NONE


def core_defaults(cls: type) -> dict[str, object]:
    if dataclasses.is_dataclass(cls):
        out = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                out[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                out[f.name] = f.default_factory()
        return out
    return {n: v for n, f in cls.model_fields.items() if (v := _default(f)) is not _NONE}


def own_defaults(cls: type) -> dict[str, object]:
    """The defaults the class's own body declares (not inherited, not nested config sections)."""
    own = cls.__dict__.get("__annotations__", {})
    return {n: v for n, f in cls.model_fields.items()
            if n in own and (v := _default(f)) is not _NONE and not isinstance(v, BaseModel)}


def _same(a, b) -> bool:
    a, b = (list(x) if isinstance(x, tuple) else x for x in (a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, Number) and isinstance(b, Number):
        return a == b
    return type(a) is type(b) and a == b


def repeated_defaults(dagster_classes, core_classes) -> dict[str, dict[str, list[str]]]:
    """``{module.Class: {field: [Core.field, ...]}}`` for every Dagster field repeating a core default."""
    cores = [(c, core_defaults(c)) for c in core_classes]
    found: dict[str, dict[str, list[str]]] = {}
    for d in dagster_classes:
        for name, value in own_defaults(d).items():
            hits = [f"{c.__name__}.{cn}" for c, defaults in cores for cn, cv in defaults.items()
                    if (name == cn or name.endswith("_" + cn)) and _same(value, cv)]
            if hits:
                found.setdefault(f"{d.__module__.rsplit('.', 1)[-1]}.{d.__name__}", {})[name] = hits
    return found


@pytest.fixture
def tree(monkeypatch):
    """The Dagster config classes of sage_pipeline.defs and the core configs of the rest, with no
    SAGE_* variable set (some core defaults are read from the environment when a config is made)."""
    for var in [v for v in os.environ if v.startswith("SAGE_")]:
        monkeypatch.delenv(var)
    classes = _classes()
    dagster = [c for c in classes if issubclass(c, dg.Config) and c.__module__.startswith("sage_pipeline.defs.")]
    core = [c for c in classes if not c.__module__.startswith(("sage_pipeline.defs", "sage_pipeline.definitions"))
            and c.__name__.endswith(CORE_SUFFIXES)
            and (dataclasses.is_dataclass(c) or (issubclass(c, BaseModel) and not issubclass(c, dg.Config)))]
    assert len(dagster) >= 15 and len(core) >= 30, (len(dagster), len(core))  # the walk found the tree
    return dagster, core


def test_no_default_is_declared_twice_outside_the_listed_classes(tree):
    found = repeated_defaults(*tree)
    new = {cls: fields for cls, fields in found.items() if cls not in NOT_MIGRATED}
    assert not new, ("a Dagster config repeats its core's defaults; inherit the core model instead (see "
                     f"defs/sleep_assets.py): {new}")
    for cls, (listed, why) in NOT_MIGRATED.items():
        now = set(found.get(cls, {}))
        assert now - listed == set(), f"{cls}: new repeated defaults {sorted(now - listed)} (listed: {why})"
        assert listed - now == set(), (f"{cls}: {sorted(listed - now)} no longer repeat a core default: remove "
                                       "them from NOT_MIGRATED (and the class, once it is empty)")


def test_the_sleep_configs_repeat_nothing(tree):
    dagster, core = tree
    sleep = [c for c in dagster if c.__module__ == "sage_pipeline.defs.sleep_assets"]
    assert {c.__name__ for c in sleep} >= {"SageSkillsAssetConfig", "OllamaSection", "OpenAISection", "GateSection",
                                           "EditLimitsSection", "SplitSection", "RollbackConfig"}
    assert repeated_defaults(sleep, core) == {}
    # stronger than "no repeat": the night config's classes declare no default of their own at all
    assert {c.__name__: own_defaults(c) for c in sleep if c.__name__ != "RollbackConfig"} == {
        c.__name__: {} for c in sleep if c.__name__ != "RollbackConfig"}


# The migrated Dagster configs outside sleep and the defaults their own bodies declare: settings
# no core model has (the asset's, or the Dagster layer's), and nothing else.
OWN_SETTINGS = {
    "routing_assets.SyntheticSessionsConfig": set(),
    "routing_assets.TrajectoriesConfig": {"max_quarantined_fraction"},
    "routing_assets.RewardSection": set(),
    "routing_assets.RoutingDatasetConfig": {"chunk_rows", "journal_clock"},
    "policy_assets.BCPolicyConfig": {"action_spaces"},
    "policy_assets.CQLPolicyConfig": {"action_spaces", "alphas", "selection", "n_boot", "support"},
    "benchmark_assets.RoutingBenchmarkConfig": {"ope_behaviours"},  # made from BenchmarkConfig's default
    "resources.SandboxResource": {"backend"},  # 'auto', a backend the core does not have
    "resources.SageResource": {"data_dir", "routing_table", "model_catalogue", "min_rows_per_role"},
    "sim_assets.SimTasksConfig": {"suite_path", "suite_format"},
    "sim_policy_assets.PPOPolicyConfig": {"env", "bandit_steps", "calibration", "routing_table"},
    "sim_policy_assets.EscalationSection": set(),
    "sim_policy_assets.EscalationRewardSection": set(),
}


def test_the_migrated_configs_declare_only_their_own_settings(tree):
    dagster, core = tree
    by_name = {f"{c.__module__.rsplit('.', 1)[-1]}.{c.__name__}": c for c in dagster}
    assert set(OWN_SETTINGS) <= set(by_name)
    assert {n: set(own_defaults(by_name[n])) for n in OWN_SETTINGS} == OWN_SETTINGS
    sections = [c for c in dagster if c.__name__.endswith("Section")
                and c.__module__.rsplit(".", 1)[-1] in ("benchmark_assets", "routing_assets")]
    assert len(sections) >= 11 and {c.__name__: own_defaults(c) for c in sections} == {
        c.__name__: {} for c in sections}
    assert repeated_defaults([by_name[n] for n in OWN_SETTINGS] + sections, core) == {}


def test_the_check_catches_a_repeated_default(tree):
    """The check can fail: a Dagster class that writes GateConfig's default again is caught, under
    its own name and under a prefixed one; a different value, or an inherited field, is not."""
    _, core = tree

    class Flat(dg.Config):
        metric: str = "mixed"
        gate_hard_weight: float = Field(0.5, description="repeats GateConfig.hard_weight")
        granularity: str = "bundle"  # not GateConfig's default: no repeat

    class Inherits(dg.Config, GateConfig):
        pass

    found = repeated_defaults([Flat, Inherits], core)
    assert set(found) == {f"{__name__.rsplit('.', 1)[-1]}.Flat"}
    fields = next(iter(found.values()))
    assert set(fields) == {"metric", "gate_hard_weight"}
    assert "GateConfig.metric" in fields["metric"] and "GateConfig.hard_weight" in fields["gate_hard_weight"]
