"""sim/setup_docker.sh on a machine like this project's image: a `docker` client on PATH,
no `dockerd`, no daemon. Every system command the script calls that would change the
machine (apt-get, dockerd, debootstrap) is a stub on PATH that records its call, so the
test runs anywhere and changes nothing; the real daemon is reached by the sandbox tests.
"""
from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "sim" / "setup_docker.sh"

# `docker info` answers once the stub dockerd has run; everything else the stub client
# is asked (the image build's `image inspect`) fails like a daemon without the image.
DOCKER = """#!/bin/sh
echo "docker $*" >> "$STATE/calls"
case "$1" in
  info) [ -e "$STATE/daemon_up" ] ;;
  version) echo 99.0-stub ;;
  *) echo "stub docker: $1 not available" >&2; exit 1 ;;
esac
"""
# The daemon: comes up unless told to die.
DOCKERD = """#!/bin/sh
echo "dockerd $*" >> "$STATE/calls"
[ -n "$DOCKERD_DIES" ] && { echo "stub dockerd: failed to start daemon" >&2; exit 1; }
touch "$STATE/daemon_up"
"""
# apt-get install puts dockerd and debootstrap on PATH, as Debian's packages do.
APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$STATE/calls"
[ -n "$APT_FAILS" ] && { echo "E: Unable to locate package docker.io" >&2; exit 100; }
if [ "$1" = install ]; then
  cp "$STATE/dockerd.stub" "$STUBS/dockerd"
  printf '#!/bin/sh\\necho "debootstrap $*" >> "$STATE/calls"\\n' > "$STUBS/debootstrap"
  printf 'echo "stub debootstrap: no mirror" >&2\\nexit 1\\n' >> "$STUBS/debootstrap"
  chmod +x "$STUBS/dockerd" "$STUBS/debootstrap"
fi
"""
ID_NOT_ROOT = """#!/bin/sh
[ "$1" = -u ] && { echo 1000; exit 0; }
exec /usr/bin/id "$@"
"""


def _write(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.fixture
def machine(tmp_path):
    """A PATH holding only stubs and the coreutils directories (/usr/bin, /bin): the real
    docker client (/usr/local/bin) and dockerd/debootstrap (/usr/sbin) are out of reach."""
    stubs, state = tmp_path / "stubs", tmp_path / "state"
    stubs.mkdir(), state.mkdir()
    _write(stubs / "docker", DOCKER)
    _write(stubs / "apt-get", APT_GET)
    _write(state / "dockerd.stub", DOCKERD)
    for name in ("dockerd", "debootstrap"):
        assert not (stubs / name).exists()
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "STATE": str(state), "STUBS": str(stubs),
           "HOME": str(tmp_path), "DOCKERD_LOG": str(state / "dockerd.log"),
           "SETUP_DOCKER_WAIT_S": "3"}

    def run(root: bool = True, **extra: str) -> tuple[subprocess.CompletedProcess, list[str]]:
        if not root:
            _write(stubs / "id", ID_NOT_ROOT)
        if root and os.geteuid() != 0:
            pytest.fail("this test runs the script's root path: run the suite as root, as CI does")
        proc = subprocess.run(["bash", str(SCRIPT)], env={**env, **extra}, cwd=tmp_path,
                              capture_output=True, text=True, timeout=60)
        calls_file = state / "calls"
        calls = calls_file.read_text().splitlines() if calls_file.exists() else []
        return proc, calls

    return run


def test_a_client_without_dockerd_installs_docker_io_and_starts_the_daemon(machine):
    proc, calls = machine()
    out = proc.stdout + proc.stderr
    assert "apt-get update -qq" in calls
    install = [c for c in calls if c.startswith("apt-get install")]
    assert install == ["apt-get install -y -qq docker.io debootstrap"], calls
    assert any(c.startswith("dockerd") for c in calls), calls         # the daemon was started
    assert "setup_docker: daemon 99.0-stub answers" in out
    # Then the image build runs (and stops at the stub debootstrap, with its own message).
    assert any(c.startswith("debootstrap --variant=minbase") for c in calls), calls
    assert proc.returncode != 0 and "build_image.sh: debootstrap failed" in out


def test_not_root_names_the_missing_packages_and_installs_nothing(machine):
    proc, calls = machine(root=False)
    assert proc.returncode == 1
    assert "setup_docker: missing docker.io debootstrap: sudo apt-get install -y docker.io debootstrap" \
        in proc.stderr
    assert not [c for c in calls if c.startswith(("apt-get", "dockerd"))]


def test_a_failed_install_is_a_clear_failure_and_no_daemon_is_started(machine):
    proc, calls = machine(APT_FAILS="1")
    assert proc.returncode == 1
    assert "setup_docker: apt-get update failed" in proc.stderr
    assert not [c for c in calls if c.startswith("dockerd")]


def test_a_daemon_that_never_answers_fails_within_the_wait_and_shows_its_log(machine):
    proc, calls = machine(DOCKERD_DIES="1")
    assert proc.returncode == 1
    assert "stub dockerd: failed to start daemon" in proc.stderr      # the daemon's own log
    assert "setup_docker: dockerd did not answer within 3 s" in proc.stderr
    assert sum(c == "docker info" for c in calls) >= 3               # it did wait


def test_a_daemon_that_already_answers_needs_no_dockerd(machine, tmp_path):
    (tmp_path / "state" / "daemon_up").touch()     # e.g. a mounted docker.sock
    (tmp_path / "stubs" / "debootstrap").write_text("#!/bin/sh\nexit 1\n")
    (tmp_path / "stubs" / "debootstrap").chmod(0o755)
    proc, calls = machine()
    assert not [c for c in calls if c.startswith(("apt-get", "dockerd"))], calls
    assert "setup_docker: daemon 99.0-stub answers" in proc.stdout
