"""The task families of the coding-task simulator.

Each module registers its families in :data:`FAMILIES` (name -> :class:`Family`) when it
is imported; this package imports them all, in a fixed order, so the registry (and so
the tasks a seed produces) is the same in every process.
"""

from __future__ import annotations

from sage_pipeline.sim.families import lists, matrix, numbers, parsing, strings, structures, timeline  # noqa: F401
from sage_pipeline.sim.families.base import FAMILIES, Family, FamilyError, TaskSpec, Variant

__all__ = ["FAMILIES", "Family", "FamilyError", "TaskSpec", "Variant"]
