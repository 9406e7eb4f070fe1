#!/usr/bin/env bash
# Materialize every asset on embedded defaults, in lineage order, with the Dagster CLI.
# `dagster asset materialize --select '*'` cannot mix partitioned and unpartitioned assets
# in one run, so this runs the graph in four steps:
#   1. every unpartitioned asset upstream of the partitioned ones (offline routing chain on SAGE's
#      own journals: sage_week, the shipped SAGE week and, with SAGE_PYTHON, a live SAGE day first;
#      routing-benchmark import, sim_tasks), with their checks;
#   2. sandbox_rollouts, all shards in one run (single-run backfill policy);
#   3. what depends on the rollouts (ppo_policy);
#   4. the sleep cycle on SAGE's skills root, one night per day of the embedded SAGE week (oldest first,
#      SLEEP_NIGHTS of them, default 3; the first partitions when the week is not there);
#   5. the decision ledger every lever's nights wrote (group decisions);
# The simulated month (group closed_loop, job simulated_month), SAGE in the loop (group
# sage_in_the_loop, job sage_in_the_loop: needs SAGE_PYTHON) and the routing simulator's synthetic
# journals (group routing_demo, job routing_demo: a demo) are not part of it: run on demand (README).
# Then prints a summary read back from the instance (scripts/run_summary.py): the sandbox
# really used (sandbox_isolated), the promotion gate's decisions, each skill's last night.
# Uses DAGSTER_HOME and SAGE_DATA_DIR from the environment (the Makefile sets them).
set -euo pipefail
cd "$(dirname "$0")/.."
DG="${DAGSTER_BIN:-.venv/bin/dagster} asset materialize -m sage_pipeline.definitions"
PY="${PYTHON_BIN:-.venv/bin/python}"

step() { echo; echo "== $*"; }

# a run of this instance killed earlier (kill -9, a closed laptop) would hold its pool slot
# and leave the pooled steps below waiting forever: mark it failed and free its slots (each run
# below does it again before its steps claim slots: run_reaper.reaping, the project's executor)
$PY -m sage_pipeline.defs.run_reaper

step "1/5 unpartitioned assets"
$DG --select 'not key:sandbox_rollouts and not key:ppo_policy and not group:sleep_cycle and not group:closed_loop and not group:sage_in_the_loop and not group:decisions and not group:routing_demo'

shards=$($PY -c 'from sage_pipeline.defs.sim_assets import SHARDS; k = SHARDS.get_partition_keys(); print(f"{k[0]}...{k[-1]}")')
step "2/5 sandbox_rollouts, shards $shards"
$DG --select sandbox_rollouts --partition-range "$shards"

step "3/5 ppo_policy"
$DG --select ppo_policy

nights=$($PY -c 'from sage_pipeline.defs.sleep_assets import default_nights; print(" ".join(default_nights(int("'"${SLEEP_NIGHTS:-3}"'"))))')
for night in $nights; do
  step "4/5 sleep cycle, night $night"
  $DG --select 'group:sleep_cycle' --partition "$night"
done

step "5/5 the decision ledger"
$DG --select 'group:decisions'

$PY scripts/run_summary.py
