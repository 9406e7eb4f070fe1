#!/usr/bin/env bash
# make cluster-demo: the whole graph through the Celery executor, on loopback.
#   - Redis (Debian's redis-server): the Celery broker (db 0) and result backend (db 1);
#   - a throwaway PostgreSQL cluster (initdb + pg_ctl): Dagster's run, event and schedule storage;
#   - CLUSTER_WORKERS Celery workers (default 2), each with its own folder (DAGSTER_HOME and
#     PYTHONPATH holding deploy/celery/), its own process group and node name, sharing
#     SAGE_DATA_DIR and Dagster's storage folder, as docs/scaling.md (section 2) describes;
#   - then the graph in scripts/materialize_all.sh's order, through
#     sage_pipeline.defs.celery_definitions: 1. every unpartitioned asset upstream of the
#     partitioned ones, 2. sandbox_rollouts as one run per shard, all at once (a partition range
#     is one step, which only one worker could take), 3. ppo_policy, 4. the sleep cycle, one
#     night per run (SLEEP_NIGHTS, default 3);
#   - a summary: wall time per step, steps per Celery worker (from the runs' events).
# Everything started here is stopped on exit by the PIDs it recorded (trap), whatever happened.
# SANDBOX_WORKERS: sandbox processes per rollout shard (the sandbox resource's `workers`; default:
# the resource's own, 2). CLUSTER_DEMO_DIR: where it works (default: a new /tmp/sage-cluster-demo.XXXXXX). The artifacts
# (data/) and logs (logs/) stay there; the PostgreSQL cluster is removed with its server.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
PY="${PYTHON_BIN:-$repo/.venv/bin/python}"
BIN=$(dirname "$PY")
MODULE=sage_pipeline.defs.celery_definitions
n_workers="${CLUSTER_WORKERS:-2}"
nights_n="${SLEEP_NIGHTS:-3}"
demo="${CLUSTER_DEMO_DIR:-$(mktemp -d /tmp/sage-cluster-demo.XXXXXX)}"
log() { echo "cluster-demo: $*"; }
die() { echo "cluster-demo: $*" >&2; exit 1; }

[[ "$n_workers" =~ ^[1-9][0-9]*$ ]] || die "CLUSTER_WORKERS must be a positive integer, got '$n_workers'"
[ -x "$BIN/celery" ] || die "$BIN/celery not found: run make install (dagster-celery is in the celery extra)"
pg_bin="${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)}"
[ -x "$pg_bin/initdb" ] && [ -x "$pg_bin/pg_ctl" ] \
  || die "PostgreSQL server binaries not found (PG_BIN=${pg_bin:-unset}): run sudo .ci/system_deps.sh"
redis_bin="${REDIS_SERVER:-$(command -v redis-server || true)}"
[ -n "$redis_bin" ] && [ -x "$redis_bin" ] || die "redis-server not found: run sudo .ci/system_deps.sh"

mkdir -p "$demo/logs" "$demo/data" "$demo/dagster_storage"
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# PostgreSQL refuses to run as root: as root, run its tools as the postgres user
as_pg() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# ---- what this script starts, stopped by PID on exit --------------------------------------
worker_pids=()
run_pids=()
redis_pid=""
pg_root=""
pg_started=""
stop_group() {  # stop_group PID GRACE_S: SIGTERM to the group led by PID, then SIGKILL what is left
  local pid=$1 grace=$2 i
  kill -TERM -- "-$pid" 2>/dev/null || return 0
  for ((i = 0; i < grace * 10; i++)); do
    kill -0 -- "-$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 -- "-$pid" 2>/dev/null; then
    log "process group $pid ignored SIGTERM for ${grace} s: SIGKILL"
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  for pid in "${run_pids[@]}"; do stop_group "$pid" 10; done
  for pid in "${worker_pids[@]}"; do stop_group "$pid" 60; done
  [ -n "$redis_pid" ] && stop_group "$redis_pid" 10
  if [ -n "$pg_started" ]; then
    if ! as_pg "$pg_bin/pg_ctl" -D "$pg_root/data" -m fast -w -t 30 stop >/dev/null; then
      pid=$(head -n 1 "$pg_root/data/postmaster.pid" 2>/dev/null || true)
      [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  [ -n "$pg_root" ] && rm -rf "$pg_root"
  log "stopped everything it started (exit $rc); artifacts in $demo/data, logs in $demo/logs"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- PostgreSQL --------------------------------------------------------------------------
pg_port=$(free_port)
pg_password="sage-demo-$RANDOM$RANDOM"
pg_root=$(mktemp -d /tmp/sage-pg.XXXXXX)   # under /tmp: the postgres user must reach it
printf '%s\n' "$pg_password" > "$pg_root/pwfile"
[ "$(id -u)" = 0 ] && chown -R postgres "$pg_root"
as_pg "$pg_bin/initdb" -D "$pg_root/data" -U dagster --pwfile="$pg_root/pwfile" --auth=scram-sha-256 -E UTF8 \
  --no-sync --no-instructions >"$demo/logs/initdb.log"
pg_started=1
as_pg "$pg_bin/pg_ctl" -D "$pg_root/data" -l "$pg_root/postgres.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $pg_root/data" start >/dev/null \
  || { cat "$pg_root/postgres.log" >&2; die "PostgreSQL did not start"; }
PGPASSWORD="$pg_password" "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U dagster dagster
log "PostgreSQL on 127.0.0.1:$pg_port (postmaster $(head -n 1 "$pg_root/data/postmaster.pid"))"

# ---- Redis -------------------------------------------------------------------------------
redis_port=$(free_port)
setsid "$redis_bin" --bind 127.0.0.1 --port "$redis_port" --save '' --appendonly no --dir "$demo/logs" \
  --protected-mode yes --daemonize no >"$demo/logs/redis.log" 2>&1 &
redis_pid=$!
for _ in $(seq 100); do
  "$PY" -c "import socket, sys; s = socket.create_connection(('127.0.0.1', $redis_port), 1); s.sendall(b'PING\r\n'); sys.exit(0 if s.recv(16).startswith(b'+PONG') else 1)" 2>/dev/null && break
  kill -0 "$redis_pid" 2>/dev/null || die "redis-server exited: $(tail -n 5 "$demo/logs/redis.log")"
  sleep 0.1
done
log "Redis on 127.0.0.1:$redis_port (pid $redis_pid)"

# ---- the environment every process shares (docs/scaling.md, section 2) ---------------------
export DAGSTER_PG_HOST=127.0.0.1 DAGSTER_PG_PORT="$pg_port" DAGSTER_PG_PASSWORD="$pg_password"
export DAGSTER_SHARED_STORAGE="$demo/dagster_storage"
export SAGE_DATA_DIR="$demo/data"
export SAGE_CELERY_BROKER="redis://127.0.0.1:$redis_port/0" SAGE_CELERY_BACKEND="redis://127.0.0.1:$redis_port/1"
export GX_ANALYTICS_ENABLED=false

# ---- the workers -------------------------------------------------------------------------
names=()
for i in $(seq "$n_workers"); do
  name="worker-$(printf '%02d' "$i")"
  wd="$demo/$name"
  mkdir -p "$wd"
  cp deploy/celery/dagster.yaml deploy/celery/dagster_celery_config.py "$wd/"
  (cd "$wd" && DAGSTER_HOME="$wd" PYTHONPATH="$wd" exec setsid "$BIN/celery" -A dagster_celery.app worker \
     -l INFO -n "$name@%h" -c 1 -I "$MODULE") >"$demo/logs/$name.log" 2>&1 &
  worker_pids+=($!)
  names+=("$name")
done
log "workers ${names[*]} started (pids ${worker_pids[*]}); waiting for them to answer"
"$PY" - "$n_workers" <<'EOF' &   # in the background: a signal to this script runs the trap at once
import os, sys, time
from celery import Celery
app = Celery("ping", broker=os.environ["SAGE_CELERY_BROKER"], backend=os.environ["SAGE_CELERY_BACKEND"])
want, deadline, seen = int(sys.argv[1]), time.monotonic() + 180, set()
while len(seen) < want and time.monotonic() < deadline:
    seen = {n for reply in app.control.ping(timeout=1.0) for n in reply}
print("cluster-demo: answering:", ", ".join(sorted(seen)))
sys.exit(0 if len(seen) >= want else 1)
EOF
wait $! || die "the workers did not answer (logs in $demo/logs)"

# ---- the graph ---------------------------------------------------------------------------
mkdir -p "$demo/coordinator"
cp deploy/celery/dagster.yaml "$demo/coordinator/"
export DAGSTER_HOME="$demo/coordinator"
DG=("$BIN/dagster" asset materialize -m "$MODULE")
timings=()
now() { date +%s.%N; }
since() { "$PY" -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }
step() { echo; echo "== $*"; }
# start LOG ARGS...: one `dagster asset materialize` in its own process group, in the background
# (so that a signal to this script runs the trap at once, and the trap can stop the run by PID)
start() { local out=$1; shift; setsid "${DG[@]}" "$@" >"$out" 2>&1 & run_pids+=($!); }
# finish PID...: wait for runs started with start; returns 1 if any failed
finish() { local pid rc=0; for pid in "$@"; do wait "$pid" || rc=1; done; run_pids=(); return $rc; }

# docs/scaling.md's pool limits, set once for every machine before runs use the pools (runs that
# meet a pool first, all at once, race to create its default limit in Postgres and fail)
"$BIN/dagster" instance concurrency set sage_sandbox 4 >/dev/null
"$BIN/dagster" instance concurrency set sleep_cycle 1 >/dev/null
log "pool limits set: sage_sandbox 4, sleep_cycle 1"

step "1/4 unpartitioned assets"
t0=$(now)
start "$demo/logs/run-1-unpartitioned.log" \
  --select 'not key:sandbox_rollouts and not key:ppo_policy and not group:sleep_cycle and not group:closed_loop'
finish "${run_pids[@]}" || die "step 1 failed: see $demo/logs/run-1-unpartitioned.log"
timings+=("1/4 unpartitioned assets: $(since "$t0") s")

shards=$("$PY" -c 'from sage_pipeline.defs.sim_assets import SHARDS; print(" ".join(SHARDS.get_partition_keys()))')
step "2/4 sandbox_rollouts: one run per shard, all at once ($shards)"
t0=$(now)
declare -A shard_pid=()
shard_config=()
if [ -n "${SANDBOX_WORKERS:-}" ]; then
  [[ "$SANDBOX_WORKERS" =~ ^[1-9][0-9]*$ ]] || die "SANDBOX_WORKERS must be a positive integer, got '$SANDBOX_WORKERS'"
  shard_config=(--config-json "{\"resources\": {\"sandbox\": {\"config\": {\"workers\": $SANDBOX_WORKERS}}}}")
fi
for s in $shards; do
  start "$demo/logs/run-2-$s.log" --select sandbox_rollouts --partition "$s" "${shard_config[@]}"
  shard_pid[$s]=$!
done
failed=()
for s in $shards; do wait "${shard_pid[$s]}" || failed+=("$s"); done
run_pids=()
[ ${#failed[@]} -eq 0 ] || die "shards ${failed[*]} failed: see $demo/logs/run-2-<shard>.log"
rollouts_s=$(since "$t0")
timings+=("2/4 sandbox_rollouts, $(echo "$shards" | wc -w) shard runs on $n_workers worker(s), sandbox workers per shard: ${SANDBOX_WORKERS:-default}: $rollouts_s s")

step "3/4 ppo_policy"
t0=$(now)
start "$demo/logs/run-3-ppo_policy.log" --select ppo_policy
finish "${run_pids[@]}" || die "step 3 failed: see $demo/logs/run-3-ppo_policy.log"
timings+=("3/4 ppo_policy: $(since "$t0") s")

nights=$("$PY" -c "from sage_pipeline.defs.sleep_assets import default_nights; print(' '.join(default_nights($nights_n)))")
for night in $nights; do
  step "4/4 sleep cycle, night $night"
  t0=$(now)
  start "$demo/logs/run-4-$night.log" --select 'group:sleep_cycle' --partition "$night"
  finish "${run_pids[@]}" || die "night $night failed: see $demo/logs/run-4-$night.log"
  timings+=("4/4 night $night: $(since "$t0") s")
done

echo
log "wall times:"
printf '  %s\n' "${timings[@]}"
"$PY" - <<'EOF'
import collections
import dagster as dg
with dg.DagsterInstance.get() as instance:
    runs = instance.get_runs()
    per_worker, shards = collections.Counter(), []
    for run in runs:
        worker, start = {}, {}
        for record in instance.all_logs(run.run_id):
            ev = record.dagster_event
            if ev is None:
                continue
            if ev.event_type_value == "ENGINE_EVENT" and "Celery worker" in ev.event_specific_data.metadata:
                worker[record.step_key] = ev.event_specific_data.metadata["Celery worker"].value
                per_worker[worker[record.step_key]] += 1
            elif ev.event_type_value == "STEP_START":
                start[record.step_key] = record.timestamp
            elif ev.event_type_value == "STEP_SUCCESS" and record.step_key == "sandbox_rollouts":
                shards.append((run.tags.get("dagster/partition"), worker.get(record.step_key),
                               start[record.step_key], record.timestamp))
    statuses = collections.Counter(r.status.value for r in runs)
print(f"cluster-demo: {len(runs)} runs ({dict(statuses)}); steps per Celery worker: {dict(sorted(per_worker.items()))}")
if shards:
    t0 = min(s[2] for s in shards)
    print("cluster-demo: sandbox_rollouts steps (seconds from the first shard's start):")
    for shard, worker, a, b in sorted(shards, key=lambda s: s[2]):
        print(f"  {shard} on {worker}: {a - t0:6.1f} -> {b - t0:6.1f} ({b - a:.1f} s)")
    print(f"  first start to last end: {max(s[3] for s in shards) - t0:.1f} s")
EOF
