#!/usr/bin/env bash
# System packages the UI and storage tests need (Debian/Ubuntu):
#   chromium, chromium-driver  the real-browser test (sage_pipeline_tests/ui/test_browser.py)
#   postgresql                 the Postgres instance-storage test (test_postgres_storage.py)
#   redis-server               the Celery broker of the cluster test and `make cluster-demo`
#                              (test_celery_executor.py starts its own on loopback, by PID)
#   fonts-liberation           readable text in the browser test's screenshots
# Idempotent: installs only what is missing, after a single `apt-get update`. As root it
# installs; otherwise it prints the command to run and exits 1 when something is missing.
set -euo pipefail

PACKAGES=(chromium chromium-driver postgresql redis-server fonts-liberation)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "system_deps: already installed: ${PACKAGES[*]}"
  exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
  echo "system_deps: missing ${missing[*]} and apt-get is not available: install Chromium," \
       "its chromedriver, the PostgreSQL server binaries and redis-server with your package manager" >&2
  exit 1
fi

if [ "$(id -u)" != 0 ]; then
  echo "system_deps: missing ${missing[*]}; run as root:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  echo "  (or: sudo $0)" >&2
  exit 1
fi

echo "system_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
for p in "${missing[@]}"; do
  installed "$p" || { echo "system_deps: $p did not install" >&2; exit 1; }
done
echo "system_deps: installed ${missing[*]}"
