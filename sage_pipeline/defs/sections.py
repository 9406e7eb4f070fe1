"""Dagster configs made from the core's pydantic models, so each default, description and check
is declared once, in the core (as ``defs/sleep_assets.py`` does for the night).

A Dagster config inherits its core model (``class GateSection(dg.Config, GateConfig)``); a field
that is itself a core model becomes a nested section, a ``dg.Config`` subclass of that model.
Dagster fills a section the run config leaves out from the section *class's* defaults, so a
section's class must carry the defaults its parent wants (a core subclass where they differ,
e.g. ``routing_benchmark.train.BenchmarkCQLConfig``).
"""

from typing import TypeVar

from pydantic import BaseModel, Field

M = TypeVar("M", bound=BaseModel)


def section(core: type[BaseModel], name: str, section_cls: type) -> object:
    """A nested Dagster config section standing for ``core``'s field ``name`` (its description kept)."""
    return Field(default_factory=section_cls, description=core.model_fields[name].description)


def to_core(config: BaseModel, core: type[M]) -> M:
    """The core model ``core`` from a Dagster config that inherits it: its fields only, nested
    sections included, validated again as the core's types."""
    return core.model_validate(config.model_dump(include=set(core.model_fields)))
