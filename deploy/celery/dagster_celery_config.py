"""Celery settings of a worker of ``dagster_celery.app`` for sage_pipeline.

``dagster_celery.app`` imports a module named ``dagster_celery_config`` when one is on the
worker's import path and applies its settings; put the folder holding this file on
PYTHONPATH (or start the worker in it). The broker and the result backend are the ones the
run's coordinator uses (sage_pipeline.defs.celery_definitions reads the same variables).
"""

import os

try:
    broker_url = os.environ["SAGE_CELERY_BROKER"]
    result_backend = os.environ["SAGE_CELERY_BACKEND"]
except KeyError as e:
    raise RuntimeError(f"dagster_celery_config ({__file__}): the environment variable {e.args[0]} is not set; "
                       "set SAGE_CELERY_BROKER and SAGE_CELERY_BACKEND to the broker and result backend "
                       "URLs the runs use (e.g. redis://redis.internal:6379/0 and .../1)") from None

# A worker holds only the step it is running: with late acknowledgement and a prefetch of one,
# a busy worker never reserves a second step while another worker is idle (Celery's default,
# an early ack, would let it reserve one more).
task_acks_late = True
worker_prefetch_multiplier = 1
