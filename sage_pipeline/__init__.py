"""sage_pipeline: the learning loop around a SAGE-style LLM agent orchestrator.

The Dagster Definitions live in :mod:`sage_pipeline.definitions`, which every entry point names
(``workspace.yaml``, ``dagster ... -m sage_pipeline.definitions``, ``[tool.dagster]``). This
package imports nothing, so the pure core (e.g. the router's ``sage_pipeline.rl``) never pays
for dagster or great_expectations.
"""

from __future__ import annotations

__version__ = "0.1.0"
