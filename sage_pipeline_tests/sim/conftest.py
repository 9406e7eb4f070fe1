"""The sandbox fixtures (docker_ready, docker_sandbox, local_sandbox) for every test here."""

from sage_pipeline_tests.sim.sandbox_fixtures import docker_ready, docker_sandbox, local_sandbox  # noqa: F401
