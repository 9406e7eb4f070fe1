#!/usr/bin/env bash
# make run's materialization: every asset on embedded defaults, in lineage order, then the summary.
# The steps and why there are five: scripts/materialize_all.py (its docstring). By default they run in one
# process (Dagster's own `dagster asset materialize` function, the code location loaded once); with --cli, one
# `dagster asset materialize -m sage_pipeline.definitions` command per step (what CI runs).
# Uses DAGSTER_HOME and SAGE_DATA_DIR from the environment (the Makefile sets them).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON_BIN:-.venv/bin/python}" scripts/materialize_all.py "$@"
