#!/usr/bin/env bash
# Build the sandbox image sage-sim:latest offline: debootstrap a minimal Debian bookworm
# root with python3 and its full standard library, then `docker import` it.
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
chroot "$ROOT" python3 -c 'import json, resource, selectors, signal' || die "python3 in the new root does not work"
tar -C "$ROOT" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change "LABEL sage.recipe=$RECIPE" \
  --change 'CMD ["python3"]' - "$IMAGE" >/dev/null
docker run --rm --network none "$IMAGE" python3 -c 'import json, resource, selectors, signal, sys; print("build_image.sh: ok,", sys.version.split()[0])'
echo "build_image.sh: built $IMAGE (recipe $RECIPE)"
