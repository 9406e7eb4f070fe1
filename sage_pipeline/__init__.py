"""sage_pipeline: the learning loop around a SAGE-style LLM agent orchestrator.

``dagster ... -m sage_pipeline`` finds the Definitions as ``sage_pipeline.sage_definitions``
(the same object as ``sage_pipeline.definitions.defs``; not named ``defs`` because that
is the Dagster-layer subpackage). They are loaded lazily (PEP 562) so that importing the
pure core, e.g. the router's ``sage_pipeline.rl``, never pays for dagster or
great_expectations.
"""

from __future__ import annotations

__version__ = "0.1.0"


def __getattr__(name: str):
    if name == "sage_definitions":
        from sage_pipeline.definitions import defs

        return defs
    raise AttributeError(f"module 'sage_pipeline' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "sage_definitions"])
