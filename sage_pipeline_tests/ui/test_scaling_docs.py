"""docs/scaling.md against the code: what it claims about executors, rollout shards, pools
and the nightly schedule holds for the Definitions as built (the Postgres half is proven
in test_postgres_storage.py)."""

from __future__ import annotations

import re

import dagster as dg
import pytest

from sage_pipeline import definitions as project
from sage_pipeline.definitions import defs
from sage_pipeline_tests.ui import _support as sup

DOC = sup.REPO / "docs" / "scaling.md"


def _graph_node(name: str):
    graph = defs.resolve_asset_graph()
    key = dg.AssetKey.from_user_string(name)
    assert graph.has(key), f"docs/scaling.md names asset {name}, which is not in the definitions"
    return graph.get(key)


def test_an_executor_merged_in_a_deployment_module_reaches_every_job():
    """Section 2's pattern, with the multiprocess executor standing in for k8s_job_executor: the
    project's fragments merged with the deployment's executor (the project's own ``defs`` carries
    its default executor, and Definitions.merge refuses a second, as the doc says)."""
    stand_in = dg.multiprocess_executor.configured({"max_concurrent": 3}, name="stand_in_executor")
    assert defs.executor.name == "multiprocess_forkserver" and "multiprocess_forkserver" in DOC.read_text()
    with pytest.raises(dg.DagsterInvariantViolationError, match="both have an executor"):
        dg.Definitions.merge(defs, dg.Definitions(executor=stand_in))
    assert "dg.Definitions.merge(*_project.FRAGMENTS, dg.Definitions(executor=" in DOC.read_text()
    merged = dg.Definitions.merge(*project.FRAGMENTS, dg.Definitions(executor=stand_in))
    jobs = merged.get_repository_def().get_all_jobs()
    names = {j.name for j in jobs}
    assert {"offline_routing", "sage_main"} <= names
    wrong = {j.name: j.executor_def.name for j in jobs if j.executor_def.name != "stand_in_executor"}
    assert not wrong, f"jobs that ignore the deployment's executor: {wrong}"


def test_rollout_shards_partitions_and_pools_are_as_documented():
    text = DOC.read_text()
    node = _graph_node("sandbox_rollouts")
    shards = node.partitions_def.get_partition_keys()
    documented = re.findall(r'"(shard-\d\d)"', text.split("## 3.")[1].split("## 4.")[0])
    assert documented == shards, f"docs/scaling.md lists shards {documented}, the asset has {shards}"
    assert node.pools == {"sage_sandbox"}
    assert "dagster instance concurrency set sage_sandbox" in text
    for shard in re.findall(r"--partition (shard-\d\d)", text):
        assert shard in shards, f"docs/scaling.md materializes {shard}, which is not a partition"
    assert "shard-XX.parquet" in text


def test_sleep_cycle_limits_and_schedule_are_as_documented():
    text = DOC.read_text()
    graph = defs.resolve_asset_graph()
    nights = [graph.get(k) for k in graph.get_all_asset_keys() if graph.get(k).group_name == "sleep_cycle"]
    assert nights, "no sleep_cycle assets"
    assert all(n.pools == {"sleep_cycle"} for n in nights), [n.pools for n in nights]
    assert "dagster instance concurrency set sleep_cycle 1" in text
    job = defs.resolve_job_def("nightly_sleep")
    assert "sage/sleep_cycle" in job.tags and "key: sage/sleep_cycle" in text
    assert defs.resolve_schedule_def("nightly_sleep_schedule").name in text
