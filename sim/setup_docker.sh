#!/usr/bin/env bash
# Make the Docker sandbox usable on this machine, idempotently:
#   1. docker.io and debootstrap installed (as root, after one apt-get update),
#   2. a daemon answering (starts dockerd in its own session when none answers),
#   3. the image sage-sim:latest built offline (sim/build_image.sh).
# Not root: prints what to run and exits 1 when something is missing.
# SETUP_DOCKER_WAIT_S: seconds to wait for a started dockerd to answer (default 60).
# Tested with stub commands on PATH: sage_pipeline_tests/sim/test_setup_docker.py.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "setup_docker: $*"; }
wait_s="${SETUP_DOCKER_WAIT_S:-60}"
dockerd_log="${DOCKERD_LOG:-/var/log/dockerd.log}"   # where a dockerd started here logs

missing=()
# The client, and the daemon binary unless a daemon already answers (or DOCKER_HOST names
# one): an image may ship a docker client without dockerd, so the client proves nothing.
if ! command -v docker >/dev/null 2>&1; then
  missing+=(docker.io)
elif ! command -v dockerd >/dev/null 2>&1 && [ -z "${DOCKER_HOST:-}" ] && ! docker info >/dev/null 2>&1; then
  missing+=(docker.io)
fi
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup_docker: missing ${missing[*]}: sudo apt-get install -y ${missing[*]}" >&2; exit 1
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || { echo "setup_docker: apt-get update failed: check the network and /etc/apt/sources.list" >&2; exit 1; }
  apt-get install -y -qq "${missing[@]}" \
    || { echo "setup_docker: apt-get install ${missing[*]} failed (see above)" >&2; exit 1; }
  command -v docker >/dev/null 2>&1 && { command -v dockerd >/dev/null 2>&1 || [ -n "${DOCKER_HOST:-}" ]; } \
    || { echo "setup_docker: docker.io is installed but docker or dockerd is not on PATH ($PATH)" >&2; exit 1; }
fi

if ! docker info >/dev/null 2>&1; then
  if [ -n "${DOCKER_HOST:-}" ]; then
    echo "setup_docker: DOCKER_HOST=$DOCKER_HOST does not answer: start that daemon" >&2; exit 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "setup_docker: the Docker daemon does not answer: sudo dockerd >/var/log/dockerd.log 2>&1 &" >&2; exit 1
  fi
  log "starting dockerd (log: $dockerd_log)"
  setsid dockerd >"$dockerd_log" 2>&1 < /dev/null &
  for _ in $(seq 1 "$wait_s"); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 "$dockerd_log" >&2; echo "setup_docker: dockerd did not answer within ${wait_s} s (log above: $dockerd_log)" >&2; exit 1; }
fi
log "daemon $(docker version --format '{{.Server.Version}}') answers"
sim/build_image.sh
