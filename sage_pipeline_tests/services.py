"""Throwaway servers for the storage and cluster tests, on loopback and free ports, from
Debian's binaries: a PostgreSQL cluster (``initdb`` + ``pg_ctl``, as the ``postgres`` user
when run as root) and a Redis server. Each is a context manager that stops what it started,
by PID (``pg_ctl stop`` on its own data directory, else the postmaster's PID; Redis by the
PID and process group of the process it started), also when the body fails.

Missing binaries FAIL (never skip), naming the fix: ``sudo .ci/system_deps.sh``.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sage_pipeline_tests.ui import _support as sup


@dataclass(frozen=True)
class Postgres:
    port: int
    user: str
    password: str
    db: str
    host: str = "127.0.0.1"


def pg_bin() -> Path:
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


@contextmanager
def postgres(user: str = "dagster", password: str = "sage-test-pw", db: str = "dagster") -> Iterator[Postgres]:
    """initdb + pg_ctl start in a temp dir, loopback only, a free port, password auth, with
    database ``db`` created; stopped (and the dir removed) on exit, also when the body fails."""
    bin_dir = pg_bin()
    # under the system temp dir, not pytest's (0700, root's): the postgres user must reach it
    root = Path(tempfile.mkdtemp(prefix="sage-pg-"))
    data, pwfile, log = root / "data", root / "pwfile", root / "postgres.log"
    cl = Postgres(port=sup.free_port(), user=user, password=password, db=db)
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

        conn = psycopg2.connect(host=cl.host, port=cl.port, user=cl.user, password=cl.password, dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {cl.db}")
        conn.close()
        yield cl
    finally:
        if started:
            _stop_postgres(bin_dir, data)
        shutil.rmtree(root, ignore_errors=True)


def _stop_postgres(bin_dir: Path, data: Path) -> None:
    """pg_ctl stop; if that fails, SIGKILL the postmaster by the PID in its pid file."""
    try:
        _run([str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop"], "pg_ctl stop")
    except AssertionError:
        pidfile = data / "postmaster.pid"
        if pidfile.is_file():
            os.kill(int(pidfile.read_text().split()[0]), signal.SIGKILL)
        raise


def pg_rows(cl: Postgres, sql: str) -> list[tuple]:
    import psycopg2

    conn = psycopg2.connect(host=cl.host, port=cl.port, user=cl.user, password=cl.password, dbname=cl.db)
    try:
        with conn.cursor() as cur:
            cur.execute(sql)
            return cur.fetchall()
    finally:
        conn.close()


@dataclass(frozen=True)
class Redis:
    port: int
    pid: int
    host: str = "127.0.0.1"

    def url(self, db: int = 0) -> str:
        return f"redis://{self.host}:{self.port}/{db}"


def redis_server_bin() -> Path:
    """Debian's redis-server: $REDIS_SERVER, else the one on PATH."""
    path = os.environ.get("REDIS_SERVER") or shutil.which("redis-server") or "/usr/bin/redis-server"
    return sup.require_file(path, "redis-server (Debian's redis-server package)", "REDIS_SERVER")


def redis_ping(host: str, port: int, timeout: float = 1.0) -> bool:
    """True when a Redis server answers PING with +PONG on host:port."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


@contextmanager
def redis(log_dir: Path) -> Iterator[Redis]:
    """redis-server on 127.0.0.1 at a free port, no persistence, in its own process group;
    stopped by its PID (SIGTERM, then SIGKILL of its group) on exit."""
    binary = redis_server_bin()
    port = sup.free_port()
    log_dir.mkdir(parents=True, exist_ok=True)
    log = open(log_dir / "redis.log", "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen([str(binary), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                             "--appendonly", "no", "--dir", str(log_dir), "--protected-mode", "yes",
                             "--daemonize", "no"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not redis_ping("127.0.0.1", port):
            if proc.poll() is not None:
                raise AssertionError(f"redis-server exited with {proc.returncode}: "
                                     f"{(log_dir / 'redis.log').read_text()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"redis-server did not answer on 127.0.0.1:{port} within 30 s")
            time.sleep(0.1)
        yield Redis(port=port, pid=proc.pid)
    finally:
        sup.stop_process_group(proc, grace_s=10)
        log.close()
