"""Postgres instance storage, for real: a throwaway PostgreSQL cluster (Debian's
`postgresql` binaries) on loopback, a dagster.yaml with `storage: postgres:` exactly as
docs/scaling.md shows it, a small real materialization through that instance, and the
materializations read back through a fresh instance, with their metadata intact.

Missing PostgreSQL server binaries FAIL (never skip): run `.ci/system_deps.sh` as root.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
import yaml

from sage_pipeline_tests import services
from sage_pipeline_tests.ui import _support as sup

pytestmark = pytest.mark.slow

DOC = sup.REPO / "docs" / "scaling.md"
TESTED_MARKER = "<!-- tested: sage_pipeline_tests/ui/test_postgres_storage.py"


def documented_instance_config() -> dict:
    """The dagster.yaml block of docs/scaling.md that follows the `tested:` marker, parsed."""
    text = DOC.read_text()
    if TESTED_MARKER not in text:
        raise AssertionError(f"{DOC}: the marker {TESTED_MARKER!r} before the Postgres dagster.yaml is gone")
    after = text[text.index(TESTED_MARKER):]
    block = re.search(r"```yaml\n(.*?)```", after, re.DOTALL)
    assert block, f"{DOC}: no ```yaml block after the tested marker"
    return yaml.safe_load(block.group(1))


Cluster = services.Postgres


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL cluster on loopback (sage_pipeline_tests/services.py), stopped by
    its PID in the finalizer, also when a test fails."""
    with services.postgres() as cl:
        yield cl


@pytest.fixture
def pg_home(cluster, tmp_path, monkeypatch) -> Path:
    """DAGSTER_HOME with docs/scaling.md's dagster.yaml; only hostname and port point at the
    throwaway cluster (its user, database and password variable are the documented ones)."""
    config = documented_instance_config()
    db = config["storage"]["postgres"]["postgres_db"]
    assert (db["username"], db["db_name"], db["password"]) == (cluster.user, cluster.db,
                                                                {"env": "DAGSTER_PG_PASSWORD"})
    db.update(hostname="127.0.0.1", port=cluster.port)
    monkeypatch.setenv("DAGSTER_PG_PASSWORD", cluster.password)
    home = tmp_path / "dagster_home"
    home.mkdir()
    (home / "dagster.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    return home


_rows = services.pg_rows


def test_materializations_round_trip_through_postgres(cluster, pg_home, tmp_path):
    t0 = time.monotonic()
    with dg.DagsterInstance.from_config(str(pg_home)) as instance:
        storages = {type(s).__name__ for s in (instance.run_storage, instance.event_log_storage,
                                               instance.schedule_storage)}
        assert storages == {"PostgresRunStorage", "PostgresEventLogStorage", "PostgresScheduleStorage"}
        result = sup.materialize_small(instance, tmp_path / "sage")
        # the documented concurrency settings parse, and pool limits are stored in Postgres
        concurrency = instance.get_concurrency_config()
        pools, queue = concurrency.pool_config, concurrency.run_queue_config
        assert (pools.pool_granularity.value, pools.default_pool_limit) == ("op", 4)
        assert queue.max_concurrent_runs == 16
        assert [dict(t) for t in queue.tag_concurrency_limits] == [{"key": "sage/sleep_cycle", "limit": 1}]
        instance.event_log_storage.set_concurrency_slots("sage_sandbox", 3)
    written = {name: {k: v.value for k, v in result.asset_materializations_for_node(name)[-1].metadata.items()}
               for name in sup.SELECTION_NAMES}

    # a fresh instance from the same dagster.yaml (new connections) reads everything back
    with dg.DagsterInstance.from_config(str(pg_home)) as fresh:
        run = fresh.get_run_by_id(result.run_id)
        assert run is not None and run.status == dg.DagsterRunStatus.SUCCESS
        for name in sup.SELECTION_NAMES:
            event = fresh.get_latest_materialization_event(dg.AssetKey(name))
            assert event is not None, f"{name}: no materialization in Postgres"
            assert event.run_id == result.run_id
            read = {k: v.value for k, v in event.asset_materialization.metadata.items()}
            assert read == written[name], f"{name}: metadata changed on the way through Postgres"
        report = {k: v.value for k, v in fresh.get_latest_materialization_event(
            dg.AssetKey("reward_report")).asset_materialization.metadata.items()}
        assert report["reward_by_role"].startswith("![reward by role](data:image/png;base64,")
        assert Path(report["path"]).is_file()
        checks = [e.dagster_event.event_specific_data for e in fresh.all_logs(result.run_id)
                  if e.dagster_event and e.dagster_event.event_type_value == "ASSET_CHECK_EVALUATION"]
        assert [(c.check_name, c.passed) for c in checks] == [("quarantine_below_threshold", True)]

    # and the rows really are in Postgres, nothing went to a local SQLite file
    kinds = dict(_rows(cluster, "SELECT dagster_event_type, count(*) FROM event_logs "
                                "WHERE dagster_event_type IS NOT NULL GROUP BY 1"))
    assert kinds["ASSET_MATERIALIZATION"] == len(sup.SELECTION_NAMES)
    assert kinds["ASSET_CHECK_EVALUATION"] == 1, kinds
    assert _rows(cluster, "SELECT run_id, status FROM runs") == [(result.run_id, "SUCCESS")]
    assert _rows(cluster, "SELECT count(*) FROM concurrency_slots WHERE concurrency_key = 'sage_sandbox'") == [(3,)]
    assert not list(pg_home.rglob("*.db")), f"SQLite files under {pg_home}: {list(pg_home.rglob('*.db'))}"
    print(f"postgres round trip in {time.monotonic() - t0:.1f} s")


def test_missing_password_is_a_clear_error(cluster, pg_home, monkeypatch):
    """A dagster.yaml that reads the password from the environment fails loudly without it."""
    monkeypatch.delenv("DAGSTER_PG_PASSWORD")
    with pytest.raises(Exception, match="DAGSTER_PG_PASSWORD"):
        dg.DagsterInstance.from_config(str(pg_home))
