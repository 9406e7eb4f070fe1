"""Postgres instance storage, for real: a throwaway PostgreSQL cluster (Debian's
`postgresql` binaries) on loopback, a dagster.yaml with `storage: postgres:` exactly as
docs/scaling.md shows it, a small real materialization through that instance, and the
materializations read back through a fresh instance, with their metadata intact.

Missing PostgreSQL server binaries FAIL (never skip): run `.ci/system_deps.sh` as root.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
import yaml

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


@dataclass(frozen=True)
class Cluster:
    port: int
    user: str
    password: str
    db: str


def _pg_bin() -> Path:
    """The PostgreSQL server binaries: $PG_BIN, else Debian's newest /usr/lib/postgresql/*/bin."""
    if os.environ.get("PG_BIN"):
        found = Path(os.environ["PG_BIN"])
    else:
        versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                          key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0)
        found = Path(versions[-1]).parent if versions else Path("/usr/lib/postgresql/<version>/bin")
    for tool in ("initdb", "pg_ctl"):
        sup.require_file(found / tool, f"PostgreSQL's {tool} (server binaries)", "PG_BIN")
    return found


def _as_unprivileged(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run it as the `postgres` user when we are root."""
    if os.geteuid() != 0:
        return cmd
    if shutil.which("runuser") is None:
        raise AssertionError("running as root and `runuser` is missing: cannot start PostgreSQL as an "
                             "unprivileged user (install util-linux, or run the tests as a normal user)")
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        raise AssertionError("running as root and there is no `postgres` user to run PostgreSQL as: "
                             f"run `sudo {sup.SYSTEM_DEPS}` (Debian's postgresql package creates it)") from None
    return ["runuser", "-u", "postgres", "--", *cmd]


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(_as_unprivileged(cmd), check=False, capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise AssertionError(f"{what} failed ({done.returncode}): {' '.join(cmd)}\n{done.stdout}{done.stderr}")


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """initdb + pg_ctl start in a temp dir, loopback only, a free port, password auth;
    stopped (and the dir removed) in the finalizer, also when a test fails."""
    bin_dir = _pg_bin()
    # under the system temp dir, not pytest's (0700, root's): the postgres user must reach it
    root = Path(tempfile.mkdtemp(prefix="sage-pg-"))
    data, pwfile, log = root / "data", root / "pwfile", root / "postgres.log"
    cl = Cluster(port=sup.free_port(), user="dagster", password="sage-test-pw", db="dagster")
    pwfile.write_text(cl.password + "\n")
    if os.geteuid() == 0:
        shutil.chown(root, "postgres")
        shutil.chown(pwfile, "postgres")
    started = False
    try:
        _run([str(bin_dir / "initdb"), "-D", str(data), "-U", cl.user, f"--pwfile={pwfile}",
              "--auth=scram-sha-256", "-E", "UTF8", "--no-sync", "--no-instructions"], "initdb")
        opts = f"-c listen_addresses=127.0.0.1 -p {cl.port} -k {data} -c fsync=off -c full_page_writes=off"
        _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", opts, "-w", "-t", "60", "start"],
             f"pg_ctl start (log {log})")
        started = True
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=cl.port, user=cl.user, password=cl.password,
                                dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {cl.db}")
        conn.close()
        yield cl
    finally:
        if started:
            _stop(bin_dir, data)
        shutil.rmtree(root, ignore_errors=True)


def _stop(bin_dir: Path, data: Path) -> None:
    """pg_ctl stop; if that fails, SIGKILL the postmaster by the PID in its pid file."""
    try:
        _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop"], "pg_ctl stop")
    except AssertionError:
        pidfile = data / "postmaster.pid"
        if pidfile.is_file():
            import signal

            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        raise


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


def _rows(cluster: Cluster, sql: str) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=cluster.port, user=cluster.user, password=cluster.password,
                            dbname=cluster.db)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


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
