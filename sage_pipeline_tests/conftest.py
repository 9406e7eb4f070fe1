"""Shared fixtures: the packaged model catalogue, routing table and simulator."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

from sage_pipeline.routing.catalogue import ModelCatalogue  # noqa: E402
from sage_pipeline.routing.simulator import RoutingSimulator  # noqa: E402
from sage_pipeline.routing.table import RoutingTable  # noqa: E402


@pytest.fixture(scope="session")
def catalogue() -> ModelCatalogue:
    return ModelCatalogue.load()


@pytest.fixture(scope="session")
def table(catalogue) -> RoutingTable:
    return RoutingTable.load()


@pytest.fixture(scope="session")
def sim(catalogue, table) -> RoutingSimulator:
    return RoutingSimulator(catalogue, table)
