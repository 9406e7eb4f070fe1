"""Sandbox fixtures (import them into a test module): the real Docker sandbox (never skipped: a machine without
a daemon or image fails with what to run) and the local backend."""

from __future__ import annotations

import pytest

from sage_pipeline.sim.sandbox import SandboxConfig, SandboxError, check_docker, open_sandbox


@pytest.fixture(scope="session")
def docker_ready() -> str:
    try:
        return check_docker(SandboxConfig())
    except SandboxError as e:
        pytest.fail(f"the Docker sandbox tests need a daemon and the sage-sim image: {e} "
                    "(`make sysdeps` as root installs docker.io, starts dockerd and builds the image)")


@pytest.fixture(scope="module")
def docker_sandbox(docker_ready):
    with open_sandbox("docker", workers=1, answer_grace_s=5.0) as sb:
        yield sb


@pytest.fixture(scope="module")
def local_sandbox():
    with open_sandbox("local", workers=1) as sb:
        yield sb
