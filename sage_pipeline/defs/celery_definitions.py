"""The project's Definitions on the Celery executor (``dagster-celery``): every step of every
run is a Celery task that any worker listening on the broker may pick up.

A deployment module: ``sage_pipeline.definitions`` stays on its default executor (Dagster's
multiprocess executor, forkserver start), and
only what loads this module (``dagster ... -m sage_pipeline.defs.celery_definitions``, or a
workspace.yaml naming it) runs on Celery. The broker and the result backend come from the
environment of the process that starts the run, read when a run starts:

  SAGE_CELERY_BROKER    e.g. redis://redis.internal:6379/0
  SAGE_CELERY_BACKEND   e.g. redis://redis.internal:6379/1

Workers are plain Celery workers of ``dagster_celery.app`` that read the same two variables
through ``deploy/celery/dagster_celery_config.py``; they need the project installed, the same
``dagster.yaml`` environment (Postgres, shared Dagster storage) and ``SAGE_DATA_DIR`` on shared
storage. docs/scaling.md (section 2) has the commands; the test is
sage_pipeline_tests/cluster/test_celery_executor.py.
"""

from __future__ import annotations

import dagster as dg
from dagster_celery import celery_executor

# the module, not its `defs`: a second Definitions object at top level would make `-m` ambiguous
from sage_pipeline import definitions as _project

BROKER_ENV = "SAGE_CELERY_BROKER"
BACKEND_ENV = "SAGE_CELERY_BACKEND"

sage_celery_executor = celery_executor.configured(
    {"broker": {"env": BROKER_ENV}, "backend": {"env": BACKEND_ENV}},
    name="sage_celery",
)

# the project's fragments with this executor instead of the project's default (merge refuses two)
defs = dg.Definitions.merge(*_project.FRAGMENTS, dg.Definitions(executor=sage_celery_executor))
