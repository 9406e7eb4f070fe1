#!/usr/bin/env bash
# Build the sandbox image sage-sim:latest offline: debootstrap a minimal Debian bookworm
# root with python3, its full standard library, pytest and the packages SAGE's own templates
# steer its agents to (FastAPI, Starlette's TestClient and httpx, pydantic, requests, uvicorn:
# which file names each, sim/README.md), then `docker import` it.
# No container registry is needed (only a Debian mirror). Idempotent: an image whose
# recipe label matches this script is left alone; FORCE=1 rebuilds.
#
#   sim/build_image.sh                 # as root, with dockerd running
#   IMAGE=sage-sim:latest MIRROR=http://deb.debian.org/debian sim/build_image.sh
#
# Users who can reach a registry can use sim/Dockerfile instead (same contents).
set -euo pipefail
IMAGE="${IMAGE:-sage-sim:latest}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SUITE=bookworm
# python3 + the parts of the standard library Debian ships separately.
PACKAGES="python3,python3-minimal,libpython3.11-stdlib,python3-distutils,python3-lib2to3,python3-venv,ca-certificates"
# SAGE's verification command (`python -m pytest -q tests/test_<module>.py`) and what SAGE's
# templates steer its agents to (sim/README.md says which file names each). Debian's own builds,
# so the build stays offline; debootstrap resolves their dependencies (anyio, sniffio, idna, ...).
PACKAGES="$PACKAGES,python-is-python3,python3-pytest,python3-pytest-asyncio,python3-fastapi,python3-starlette"
PACKAGES="$PACKAGES,python3-httpx,python3-pydantic,python3-requests,python3-uvicorn"
# What the build checks imports in the new root (and the image prints the versions of).
IMPORTS="json, resource, selectors, signal, pytest, pytest_asyncio, fastapi, fastapi.testclient, starlette.testclient, httpx, pydantic, requests, uvicorn"
RECIPE="$(printf '%s|%s|%s' "$SUITE" "$PACKAGES" "$(sha256sum "$0" | cut -c1-16)" | sha256sum | cut -c1-16)"

die() { echo "build_image.sh: $*" >&2; exit 1; }
command -v docker >/dev/null || die "docker is not installed (apt-get install -y docker.io)"
docker info >/dev/null 2>&1 || die "the Docker daemon does not answer: start it (as root: 'dockerd >/var/log/dockerd.log 2>&1 &', or 'systemctl start docker')"

if [ "${FORCE:-0}" != 1 ] && [ "$(docker image inspect -f '{{ index .Config.Labels "sage.recipe" }}' "$IMAGE" 2>/dev/null || true)" = "$RECIPE" ]; then
  echo "build_image.sh: $IMAGE is up to date (recipe $RECIPE)"
  exit 0
fi
[ "$(id -u)" = 0 ] || die "debootstrap needs root"
command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install -y debootstrap)"

ROOT="$(mktemp -d /tmp/sage-sim-root.XXXXXX)"
trap 'rm -rf "$ROOT"' EXIT
echo "build_image.sh: debootstrap $SUITE into $ROOT (a few minutes)"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOT" "$MIRROR" >"$ROOT.log" 2>&1 \
  || { tail -20 "$ROOT.log" >&2; die "debootstrap failed (log: $ROOT.log)"; }
rm -f "$ROOT.log"
# Keep the image small: no apt caches, docs or man pages.
rm -rf "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* "$ROOT"/usr/share/doc/* \
       "$ROOT"/usr/share/man/* "$ROOT"/usr/share/info/*
chroot "$ROOT" python3 -c "import $IMPORTS" || die "python3 in the new root cannot import $IMPORTS"
tar -C "$ROOT" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL sage.recipe=$RECIPE" \
  --change 'CMD ["python3"]' - "$IMAGE" >/dev/null
docker run --rm --network none "$IMAGE" python3 -c "import sys, $IMPORTS; print('build_image.sh: ok, python', sys.version.split()[0], *(m.__name__ + ' ' + m.__version__ for m in (pytest, fastapi, starlette, httpx, pydantic, requests, uvicorn)))" \
  || die "the new image $IMAGE cannot import $IMPORTS"
echo "build_image.sh: built $IMAGE (recipe $RECIPE)"
