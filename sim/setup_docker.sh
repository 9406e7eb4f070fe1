#!/usr/bin/env bash
# Make the Docker sandbox usable on this machine, idempotently:
#   1. docker.io and debootstrap installed (as root, after one apt-get update),
#   2. a daemon answering (starts dockerd in its own session when none answers),
#   3. the image sage-sim:latest built offline (sim/build_image.sh).
# Not root: prints what to run and exits 1 when something is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "setup_docker: $*"; }
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
# the daemon binary, not the client: an image may ship a docker client without dockerd
{ command -v docker >/dev/null 2>&1 && command -v dockerd >/dev/null 2>&1; } || [ -n "${DOCKER_HOST:-}" ] \
  || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "setup_docker: missing ${missing[*]}: sudo apt-get install -y ${missing[*]}" >&2; exit 1
  fi
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}"
fi

if ! docker info >/dev/null 2>&1; then
  if [ -n "${DOCKER_HOST:-}" ]; then
    echo "setup_docker: DOCKER_HOST=$DOCKER_HOST does not answer: start that daemon" >&2; exit 1
  fi
  if [ "$(id -u)" != 0 ]; then
    echo "setup_docker: the Docker daemon does not answer: sudo dockerd >/var/log/dockerd.log 2>&1 &" >&2; exit 1
  fi
  log "starting dockerd (log: /var/log/dockerd.log)"
  setsid dockerd >/var/log/dockerd.log 2>&1 < /dev/null &
  for _ in $(seq 1 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -20 /var/log/dockerd.log >&2; echo "setup_docker: dockerd did not come up" >&2; exit 1; }
fi
log "daemon $(docker version --format '{{.Server.Version}}') answers"
sim/build_image.sh
