"""Sandboxes that execute candidate solutions: Docker (isolated) and local processes (not).

A sandbox is a warm pool of workers. Each worker is one long-lived runner
(``sage_pipeline/sim/runner.py``) speaking JSON lines over stdin/stdout: in a hardened
container (``backend="docker"``) or as a local subprocess (``backend="local"``, unisolated:
for the project's own generated tasks only, and marked so in every metadata). Each task
runs in a fresh process inside the runner; see runner.py for the isolation inside.

Host side:

- containers are created, started, inspected and removed through the ``docker`` Python SDK
  (the daemon at ``DOCKER_HOST``, else the local socket); requests and answers travel on the
  container's raw attach socket (see :class:`_Channel` for why not the SDK's ``attach()``);
- the runner answers by a request's timeout plus ``answer_grace_s`` less a stated margin
  (ANSWER_MARGIN_SHARE): a clean-up still running then is cut short and the worker replaced
  after its verdict as dirty, so what a task leaves never makes its runner miss the deadline;
- a watchdog gives every request its timeout plus ``answer_grace_s``. A worker that does not
  answer, dies, or replies with something that is not an answer to the request (another
  id, counts out of range, not JSON, a line over 1 MiB) is replaced and the request run once
  more on a fresh worker. Before the task is blamed, Docker is asked why the container died:
  only its memory limit (``OOMKilled``, an ``oom`` event) twice makes the verdict ``oom``;
  anything else twice (killed or paused from outside, a runner crash, bad replies) is a
  :class:`SandboxError`, never a verdict and so never cached;
- a runner whose task left something behind (a process, a file, an IPC object) answers
  ``dirty`` and is replaced after its verdict; workers are recycled every ``recycle_every``
  requests;
- a daemon that fails mid-run (stopped, restarted, the connection cut) is a
  :class:`SandboxError` naming the cause, never a verdict;
- containers carry the owner label (``label``, which sandboxes may share) and one unique to
  the sandbox instance (also in their names); a sandbox removes only its own, on close, on
  error, on interrupt and at interpreter exit; a killed host process leaves none behind either (stdin
  attached once and ``auto_remove``: the runner exits when the host's stream closes);
- ``untrusted=True`` (code the project did not write) refuses any backend but Docker, unless the
  caller sets ``allow_untrusted_local`` (said in :meth:`Sandbox.describe`).

A job is a candidate's function run on each test's ``args`` (the runner compares with ``expected``),
an external suite's checks (``[{"check", "setup"}]``), or a **workspace job** (``[{"command",
"code_file", "files"}]``: SAGE's test module run by SAGE's verification command as its gate runs
it, :func:`workspace_job`; one test, passed when the command exits 0 with pytest's report of passed
tests, see runner.py "workspace jobs"). The image carries pytest and the packages SAGE's templates
steer its agents to (sim/README.md); the local backend runs the pipeline's interpreter, or
``local_python``.

Usage::

    with open_sandbox("docker", workers=2) as sb:
        results = sb.run(jobs)          # list[ExecJob] -> list[ExecResult], same order
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import queue
import select
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_pipeline import artifacts
from sage_pipeline.sim.schema import OUTCOME_KINDS, ExecJob, ExecResult

RUNNER_SOURCE = (Path(__file__).with_name("runner.py")).read_text(encoding="utf-8")
DEFAULT_IMAGE = "sage-sim:latest"
LABEL_KEY = "sage.sandbox"  # the owner label (SandboxConfig.label): shared by sandboxes given the same one
INSTANCE_KEY = "sage.sandbox.instance"  # unique per Sandbox: what its close() removes, part of every name
# What the sandbox guarantees a verdict was made under. The execution cache keys on it
# (sage_pipeline/sim/cache.py), so bump it with every change that can alter a verdict.
#   3 (issue 34): a task's processes are limited by its own container's pids cgroup, no longer by a
#     per-uid RLIMIT_NPROC that every task of every container on the host shared (a fork storm in
#     one task failed a correct task running beside it: verdicts cached before are not trusted).
#   4 (issue 48): the image carries pytest, FastAPI, Starlette, httpx, pydantic, requests and uvicorn (sim/README.md):
#     a candidate that imports one of them no longer fails on the import; workspace jobs (SAGE's tests) are new.
ISOLATION_VERSION = 4
# The runner must answer by a request's timeout plus answer_grace_s * (1 - ANSWER_MARGIN_SHARE)
# (its clean-up is cut short there, and the worker replaced as dirty); the host's watchdog waits
# the whole answer_grace_s. The margin, 30% of the grace (3 s of the default 10 s), is for
# killing the task, the answer's trip to the host and a loaded machine.
ANSWER_MARGIN_SHARE = 0.3
# The container's own IPC namespace, made unusable: no SysV shared memory, message queue or
# semaphore set and no POSIX message queue can be created, so no task can leave one for the
# next task to read (a channel between tasks) or hold memory after it ends. Docker accepts
# these namespaced sysctls with a private IPC namespace (`--ipc none`); all five are tested.
IPC_SYSCTLS = {"kernel.shmmni": "0", "kernel.shmall": "0", "kernel.msgmni": "0", "kernel.sem": "0 0 0 0",
               "fs.mqueue.queues_max": "0"}


LOCAL_PREFIX = "sage-sim-local-"  # the local backend's work folders, in the system's temporary folder


def _sweep_local_workroots() -> None:
    """Remove the local backend's work folders whose host is gone (killed with -9: its
    ``close`` never ran). A live host holds an ``flock`` on its folder, so only dead ones go."""
    tmp = Path(tempfile.gettempdir())
    with contextlib.suppress(OSError):
        for path in tmp.glob(f"{LOCAL_PREFIX}*"):
            if path.is_dir() and not path.is_symlink() and not artifacts.folder_in_use(path):
                shutil.rmtree(path, ignore_errors=True)


def workspace_job(code: str, code_file: str, files: dict[str, str], command: str, timeout_s: float) -> ExecJob:
    """A job that writes ``code`` to ``code_file`` and ``files`` beside it in a fresh working folder and runs
    SAGE's verification ``command`` there (e.g. ``python -m pytest -q tests/test_app.py``); ValueError naming
    what is malformed (a path out of the folder, a chained or non-Python command)."""
    from sage_pipeline.sim.runner import workspace_problem

    spec = {"command": command, "code_file": code_file, "files": dict(files)}
    problem = workspace_problem(spec)
    if problem:
        raise ValueError(f"workspace job: {problem}")
    return ExecJob(code=code, entry_point=code_file, tests=[spec], timeout_s=float(timeout_s))


class SandboxError(RuntimeError):
    """The sandbox itself failed (daemon down, image missing, a worker that will not start).
    Never a verdict on a task: callers must not score it."""


class SandboxConfig(BaseModel):
    """A sandbox: its backend, its warm pool and the limits of every container and task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    backend: Literal["docker", "local"] = Field("docker", description="'docker' (hardened containers) or 'local' "
                                                "(unisolated processes, for the project's own generated tasks only)")
    workers: int = Field(2, ge=1, description="warm workers (containers or processes) running tasks in parallel")
    image: str = Field(DEFAULT_IMAGE, description="the Docker image of the runner (sim/Dockerfile)")
    memory_mb: int = Field(512, ge=1, description="container --memory and --memory-swap (no swap), in MiB")
    task_memory_mb: int = Field(256, ge=1, description="address-space limit of each task process, in MiB")
    pids_limit: int = Field(128, ge=8, description="container --pids-limit: the processes and threads of the task "
                            "running in it (one at a time) and of the runner (3 to 5 of them). The task's own "
                            "limit: no per-uid limit, which every container on the machine would share")
    cpus: float = Field(1.0, gt=0.0, description="container --cpus")
    tmpfs_mb: int = Field(64, ge=1, description="size of the container's /tmp, in MiB")
    recycle_every: int = Field(2000, ge=1, description="requests per worker before it is replaced")
    answer_grace_s: float = Field(10.0, gt=0.0, description="watchdog: time past a request's timeout before the "
                                  "worker is replaced")
    start_timeout_s: float = Field(60.0, gt=0.0, description="a worker must say it is ready within this")
    label: str | None = Field(None, min_length=1, description="owner label of the containers (sandboxes may share "
                              "one: each removes only its own containers); null: unique per sandbox")
    untrusted: bool = Field(False, description="code the project did not write (an external suite's candidates, "
                            "SAGE's harvested tests, a model's answers): Docker only, unless allow_untrusted_local")
    allow_untrusted_local: bool = Field(False, description="let code the project did not write (untrusted=True) run "
                                        "in the UNISOLATED local backend anyway. RISK: it runs as you, with your "
                                        "files, keys and network (a hostile test can read or write anything you "
                                        "can); only for a throwaway machine or code you have read")
    local_python: str | None = Field(None, min_length=1, description="the local backend only: the interpreter a "
                                     "workspace job's `python` (SAGE's verification command) runs, e.g. SAGE's own "
                                     "virtualenv's, which has the packages SAGE's tests import; null: the pipeline's "
                                     "own interpreter. The Docker backend runs the image's python3 (sim/README.md)")

    @model_validator(mode="after")
    def _untrusted_code_runs_in_docker(self) -> SandboxConfig:
        if self.local_python is not None and self.backend != "local":
            raise SandboxError(f"local_python {self.local_python!r} is for the local backend; the {self.backend} "
                               "backend runs the image's own python3 (sim/build_image.sh installs what SAGE's tests "
                               "import there)")
        if self.untrusted and self.backend == "local" and not self.allow_untrusted_local:
            raise SandboxError(f"sandbox backend {self.backend!r} is UNISOLATED and this sandbox is for code the "
                               "project did not write (untrusted=True): it runs only in the Docker backend. "
                               "Start Docker (`bash sim/setup_docker.sh`) and use backend='docker', or, knowing "
                               "that the code then runs as you, set allow_untrusted_local=True.")
        return self

    @property
    def isolated(self) -> bool:
        return self.backend == "docker"


class _Unresponsive(Exception):
    pass


class _BadReply(Exception):
    """The runner's reply is not a well-formed answer to the request sent (too long, not JSON,
    another request's id, counts out of range): the worker is replaced, the request re-run."""


MAX_REPLY_BYTES = 1 << 20  # an answer is a few hundred bytes; anything longer is not an answer
STDERR_TAIL_BYTES = 4096


def answer_within_s(cfg: SandboxConfig) -> float:
    """Seconds past a request's timeout by which the runner answers: strictly less than the
    watchdog's ``answer_grace_s``, by ANSWER_MARGIN_SHARE of it."""
    return cfg.answer_grace_s * (1.0 - ANSWER_MARGIN_SHARE)


def _runner_cfg(cfg: SandboxConfig) -> dict:
    # nproc None: no RLIMIT_NPROC. Tasks run as uid 65534 in every container and Docker here does
    # no user-namespace remapping, so a per-uid limit is one budget for the whole machine (one
    # task's fork storm failed a concurrent task, issue 34); the container's pids cgroup
    # (pids_limit) bounds the one task it runs.
    return {"workroot": "/tmp", "memory_bytes": cfg.task_memory_mb << 20, "nproc": None,
            "drop_uid": 65534, "judge_uid": 65533, "answer_within_s": answer_within_s(cfg)}


def docker_run_args(cfg: SandboxConfig, name: str, label: str, docker: str = "docker",
                    instance: str | None = None) -> list[str]:
    """The same hardened container as a ``docker run`` command line: what the pool creates
    through the SDK (:func:`container_options`), for the container-per-execution baseline of
    the benchmarks and for running a worker by hand."""
    return [
        docker, "run", "-i", "--rm", "--name", name, "--label", f"{LABEL_KEY}={label}",
        *(("--label", f"{INSTANCE_KEY}={instance}") if instance else ()),
        "--network", "none", "--read-only",
        "--tmpfs", f"/tmp:rw,nosuid,nodev,noexec,size={cfg.tmpfs_mb}m,mode=1777",
        "--ipc", "none", *[a for k, v in IPC_SYSCTLS.items() for a in ("--sysctl", f"{k}={v}")],
        "--memory", f"{cfg.memory_mb}m", "--memory-swap", f"{cfg.memory_mb}m",
        "--pids-limit", str(cfg.pids_limit), "--cpus", str(cfg.cpus),
        "--cap-drop", "ALL", "--cap-add", "SETUID", "--cap-add", "SETGID", "--cap-add", "KILL",
        "--security-opt", "no-new-privileges", "--init", "--user", "0:0", "--workdir", "/",
        "--log-driver", "none", "-e", "PYTHONDONTWRITEBYTECODE=1",
        cfg.image, "python3", "-I", "-u", "-c", RUNNER_SOURCE, json.dumps(_runner_cfg(cfg)),
    ]


def container_options(cfg: SandboxConfig, name: str, label: str, instance: str) -> dict:
    """Keyword arguments of ``client.containers.create`` for one hardened worker of the sandbox
    ``instance`` (owner label ``label``)."""
    from docker.types import LogConfig

    return dict(
        image=cfg.image, command=["python3", "-I", "-u", "-c", RUNNER_SOURCE, json.dumps(_runner_cfg(cfg))],
        name=name, labels={LABEL_KEY: label, INSTANCE_KEY: instance},
        # stdin open and attached once (StdinOnce, which the SDK sets for detach=False): when the
        # host's attach stream closes (the host exits, is killed, or stop() closes it), the runner
        # reads EOF and exits and auto_remove deletes the container: a killed host leaves none.
        stdin_open=True, detach=False, auto_remove=True,
        network_mode="none", read_only=True,
        tmpfs={"/tmp": f"rw,nosuid,nodev,noexec,size={cfg.tmpfs_mb}m,mode=1777"},
        ipc_mode="none", sysctls=dict(IPC_SYSCTLS),
        mem_limit=f"{cfg.memory_mb}m", memswap_limit=f"{cfg.memory_mb}m",
        pids_limit=cfg.pids_limit, nano_cpus=int(cfg.cpus * 1e9),
        # The runner keeps only what it needs: drop to the task uid (SETUID, SETGID) and kill
        # that uid's processes (KILL).
        cap_drop=["ALL"], cap_add=["SETUID", "SETGID", "KILL"],
        security_opt=["no-new-privileges"], init=True, user="0:0", working_dir="/",
        log_config=LogConfig(type="none"), environment={"PYTHONDONTWRITEBYTECODE": "1"},
    )


def _daemon_name() -> str:
    return "the Docker daemon at " + os.environ.get("DOCKER_HOST", "the local socket /var/run/docker.sock")


def _daemon_failures() -> tuple[type[BaseException], ...]:
    """What a call through the docker SDK raises when the daemon fails or is lost: the SDK's own
    errors, and its transport's, which it does not wrap (requests' ConnectionError or a timeout,
    a socket's OSError)."""
    import docker
    import requests

    return docker.errors.DockerException, requests.exceptions.RequestException, OSError


def _why(e: BaseException) -> str:
    text = getattr(e, "explanation", None) or str(e) or ""
    return f"{type(e).__name__}: {(text.splitlines() or [''])[0][:200]}"


def daemon_lost(e: BaseException, doing: str) -> SandboxError:
    """The SandboxError for a daemon that failed mid-run: what was being done, and the cause."""
    return SandboxError(f"{_daemon_name()} failed while {doing} ({_why(e)}): the daemon stopped or restarted, or "
                        "the connection to it was cut. Nothing was scored or cached for the jobs not answered; "
                        "check `docker info` (or DOCKER_HOST) and run them again.")


def docker_client(timeout: float = 60.0):
    """A docker SDK client whose daemon answers, or a SandboxError that says how to get one."""
    try:
        import docker
    except ImportError as e:
        raise SandboxError("the sandbox backend is 'docker' but the docker Python SDK is not installed: "
                           "`.venv/bin/pip install -c constraints.txt docker` (a project dependency), "
                           "or use backend='local' for the project's own tasks") from e
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except Exception as e:  # noqa: BLE001 - DockerException, ConnectionError, a timeout: no daemon there
        why = (str(e).splitlines() or [type(e).__name__])[0][:200]
        raise SandboxError(
            f"the sandbox backend is 'docker' but {_daemon_name()} does not answer ({why}). "
            "Start it (as root: `dockerd > /var/log/dockerd.log 2>&1 &`, `systemctl start docker`, or "
            "`bash sim/setup_docker.sh`), or point DOCKER_HOST at a running daemon. Nothing falls back to the "
            "unisolated local backend by itself: set backend='local' explicitly if that is what you want.") from e


def check_docker(cfg: SandboxConfig, client=None) -> str:
    """The daemon's version, or a SandboxError that says how to get a working daemon and image."""
    client = client or docker_client()
    import docker

    try:
        version = client.version().get("Version", "?")
        client.images.get(cfg.image)
    except docker.errors.ImageNotFound as e:
        raise SandboxError(f"the sandbox image {cfg.image!r} is not there: build it offline with "
                           "`sim/build_image.sh` (debootstrap + docker import), or with a registry "
                           f"`docker build -t {cfg.image} sim/`") from e
    except _daemon_failures() as e:
        raise daemon_lost(e, f"checking the sandbox image {cfg.image!r}") from e
    return version


class _Channel:
    """The runner's JSON-lines stream, read in linear time and capped at MAX_REPLY_BYTES a line.

    With Docker it is the container's attach socket. The SDK's ``attach()`` is a blocking
    generator with no timeout and no way to write stdin, so the pool keeps the raw, hijacked
    attach socket (``APIClient.attach_socket``): requests are written to the runner's stdin
    on it, reads select on it with the watchdog's deadline, and Docker's stream framing
    (8-byte headers: 1 = stdout, 2 = stderr) is taken apart here."""

    def __init__(self, fd: int, framed: bool, sock=None) -> None:
        self.fd, self.framed, self.sock = fd, framed, sock  # sock: read with recv (a TLS socket too)
        self.buf = bytearray()
        self.scanned = 0  # bytes at the start of buf known to hold no newline
        self.stderr = bytearray()
        self._raw = bytearray()  # framed: bytes not yet taken apart
        self._frame_kind, self._frame_left = 1, 0

    def _feed(self, chunk: bytes) -> None:
        if not self.framed:
            self.buf += chunk
            return
        self._raw += chunk
        pos = 0
        while pos < len(self._raw):
            if self._frame_left == 0:
                if len(self._raw) - pos < 8:
                    break
                self._frame_kind = self._raw[pos]
                self._frame_left = int.from_bytes(self._raw[pos + 4:pos + 8], "big")
                pos += 8
                continue
            take = min(self._frame_left, len(self._raw) - pos)
            piece = self._raw[pos:pos + take]
            if self._frame_kind == 2:
                self.stderr += piece
                del self.stderr[:-STDERR_TAIL_BYTES]
            else:
                self.buf += piece
            self._frame_left -= take
            pos += take
        del self._raw[:pos]

    def read_line(self, timeout: float) -> bytes | None:
        """The next line; None at the end of the stream; _Unresponsive past ``timeout``;
        _BadReply when a line grows past MAX_REPLY_BYTES."""
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.fd, selectors.EVENT_READ)
            while True:
                nl = self.buf.find(b"\n", self.scanned)
                if nl >= 0:
                    line = bytes(self.buf[:nl])
                    del self.buf[:nl + 1]
                    self.scanned = 0
                    return line
                self.scanned = len(self.buf)
                if len(self.buf) > MAX_REPLY_BYTES:
                    raise _BadReply(f"a reply line longer than {MAX_REPLY_BYTES} bytes")
                left = deadline - time.monotonic()
                buffered = self.sock is not None and getattr(self.sock, "pending", lambda: 0)() > 0
                if left <= 0 or not (buffered or sel.select(left)):
                    raise _Unresponsive
                try:
                    if self.sock is not None:
                        self.sock.settimeout(max(left, 0.001))
                        chunk = self.sock.recv(1 << 16)
                    else:
                        chunk = os.read(self.fd, 1 << 16)
                except TimeoutError as e:
                    raise _Unresponsive from e
                except OSError:
                    chunk = b""
                if not chunk:
                    return None
                self._feed(chunk)


class _Worker:
    """One runner (a container or a local subprocess) and its JSON-lines channel."""

    def __init__(self, cfg: SandboxConfig, label: str, index: int, client=None, instance: str = "") -> None:
        self.cfg, self.label, self.index, self.client = cfg, label, index, client
        self.instance = instance or uuid.uuid4().hex[:12]
        self.generation = 0
        self.proc: subprocess.Popen | None = None  # local backend
        self.container = None  # docker backend
        self.sock = None
        self.chan: _Channel | None = None
        self.name = ""
        self.served = 0
        self.started_at = 0.0
        self._workroot: str | None = None
        self._workroot_lock: int | None = None
        self._stderr = None
        self._attach_api = None
        self._sock_ref = None

    def start(self) -> None:
        self.generation += 1
        self.served = 0
        self.started_at = time.time()
        if self.cfg.backend == "docker":
            self._start_container()
        else:
            self._start_local()
        try:
            line = self.chan.read_line(self.cfg.start_timeout_s)
            ready = json.loads(line) if line is not None else None
        except (_Unresponsive, _BadReply, ValueError):
            ready = None
        if not isinstance(ready, dict) or not ready.get("ready"):
            err = self._stderr_tail()
            self.stop()
            raise SandboxError(f"sandbox worker {self.name} did not start ({err or 'no output'}); "
                               + (f"check `docker run --rm {self.cfg.image} python3 -V`"
                                  if self.cfg.backend == "docker" else "check the Python interpreter"))
        self.info = ready

    def _start_container(self) -> None:
        import docker

        self.name = f"sage-sim-{self.label}-{self.instance}-{self.index}-{self.generation}"
        try:
            self.container = self.client.containers.create(**container_options(self.cfg, self.name, self.label,
                                                                               self.instance))
            # Attached before start, as `docker run -i` does, so the "ready" line is not missed;
            # on a client of its own: the hijacked connection never goes back to a shared pool.
            self._attach_api = docker.from_env(version=self.client.api.api_version, timeout=60).api
            sock = self._attach_api.attach_socket(self.container.id, params={
                "stdin": 1, "stdout": 1, "stderr": 1, "stream": 1})
            self.sock = getattr(sock, "_sock", sock)  # the socket under the SDK's SocketIO wrapper
            self._sock_ref = sock
            self.container.start()
        except docker.errors.APIError as e:  # the daemon answered: it refused this container
            self.stop()
            raise SandboxError(f"sandbox worker {self.name} did not start ({_why(e)}); "
                               f"check `docker run --rm {self.cfg.image} python3 -V`") from e
        except _daemon_failures() as e:  # the daemon did not answer: lost, restarted, connection cut
            self.stop()
            raise daemon_lost(e, f"starting sandbox worker {self.name}") from e
        self.chan = _Channel(self.sock.fileno(), framed=True, sock=self.sock)

    def _start_local(self) -> None:
        self._stderr = tempfile.TemporaryFile()
        _sweep_local_workroots()
        self._workroot = tempfile.mkdtemp(prefix=LOCAL_PREFIX)
        self._workroot_lock = artifacts.hold_folder(Path(self._workroot))  # freed with this process
        runner_cfg = {"workroot": self._workroot, "memory_bytes": self.cfg.task_memory_mb << 20, "drop_uid": None}
        if self.cfg.local_python:  # a workspace job's `python` (SAGE's verification command)
            runner_cfg["python"] = self.cfg.local_python
        self.name = f"local-{os.getpid()}-{self.index}-{self.generation}"
        cmd = [sys.executable, "-I", "-u", "-c", RUNNER_SOURCE, json.dumps(runner_cfg)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     start_new_session=True)
        self.chan = _Channel(self.proc.stdout.fileno(), framed=False)

    def _stderr_tail(self) -> str:
        if self.chan is not None and self.chan.stderr:
            return bytes(self.chan.stderr[-500:]).decode("utf-8", "replace").strip()
        if self._stderr is None:
            return ""
        with contextlib.suppress(Exception):
            self._stderr.seek(0)
            return self._stderr.read()[-500:].decode("utf-8", "replace").strip()
        return ""

    def _send(self, data: bytes, timeout: float) -> bool:
        """False when the runner is gone; _Unresponsive when it stops reading."""
        try:
            if self.sock is not None:
                self.sock.settimeout(timeout)
                self.sock.sendall(data)
            else:
                assert self.proc is not None and self.proc.stdin is not None
                self.proc.stdin.write(data)
                self.proc.stdin.flush()
        except TimeoutError as e:
            raise _Unresponsive from e
        except (OSError, ValueError):
            return False
        return True

    def request(self, job: ExecJob, req_id: int) -> dict | None:
        """The runner's answer, checked against the request; None if the runner died;
        _Unresponsive past the watchdog's deadline; _BadReply if it is not an answer to it."""
        msg = {"id": req_id, "code": job.code, "entry_point": job.entry_point, "tests": job.tests,
               "timeout_s": job.timeout_s}
        deadline = job.timeout_s + self.cfg.answer_grace_s
        if not self._send((json.dumps(msg, separators=(",", ":")) + "\n").encode("utf-8"), deadline):
            return None
        self.served += 1
        line = self.chan.read_line(deadline)
        if line is None:
            return None
        return _check_answer(line, req_id, len(job.tests))

    def alive(self) -> bool:
        """Cheap, no API call: a runner that exited has closed its stream (end of file pending)."""
        if self.cfg.backend == "docker":
            if self.sock is None:
                return False
            try:
                readable, _, _ = select.select([self.sock], [], [], 0)
                if not readable:
                    return True  # nothing pending, not even an end of file: still there
                self.sock.settimeout(0.5)  # readable: returns at once
                return self.sock.recv(1, socket.MSG_PEEK) != b""
            except OSError:
                return False
        return self.proc is not None and self.proc.poll() is None

    def why_down(self) -> tuple[str, str]:
        """Why this worker stopped answering, asked of Docker before the task is blamed:
        ``("oom", why)`` when its container hit the memory limit (the task's processes did:
        they are the OOM killer's first choice and only they grow), else ``("infra", why)``:
        killed or paused from outside, the runner crashed, the daemon lost it."""
        if self.cfg.backend != "docker":
            code = self.proc.poll() if self.proc is not None else None
            if code is None:
                return "infra", "the local runner stopped answering"
            tail = self._stderr_tail()[-200:]
            return "infra", f"the local runner exited with {code}" + (f" ({tail})" if tail else "")
        if self.container is None:
            return "infra", "no container"
        import docker

        state: dict = {}
        try:
            state = self.client.api.inspect_container(self.container.id).get("State", {})
        except docker.errors.NotFound:
            pass  # auto-removed once it exited: the daemon's events say why
        except Exception as e:  # noqa: BLE001 - the daemon itself does not answer: that is why
            return "infra", f"{_daemon_name()} does not answer ({_why(e)})"
        if state.get("Paused"):
            return "infra", "its container was paused from outside"
        if state.get("Running") and not state.get("OOMKilled"):
            return "infra", "the runner stopped answering while its container kept running"
        actions: dict[str, dict] = {}
        with contextlib.suppress(Exception):
            for ev in self.client.api.events(since=int(self.started_at) - 1, until=int(time.time()) + 1,
                                             filters={"container": self.container.id}, decode=True):
                actions.setdefault(ev.get("Action", ""), ev.get("Actor", {}).get("Attributes", {}))
        if state.get("OOMKilled") or "oom" in actions:
            return "oom", "its container reached the memory limit"
        if "kill" in actions:
            return "infra", f"its container was killed from outside (signal {actions['kill'].get('signal')})"
        code = state.get("ExitCode", actions.get("die", {}).get("exitCode", "?"))
        tail = self._stderr_tail()[-200:]
        return "infra", f"its container exited with {code}" + (f" ({tail})" if tail else "")

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(Exception):
                    os.killpg(proc.pid, signal.SIGKILL)
                with contextlib.suppress(Exception):
                    proc.wait(timeout=5)
            with contextlib.suppress(Exception):
                proc.stdout.close()
        sock, self.sock = self.sock, None
        if sock is not None:
            # shutdown, not only close: the SDK's wrappers hold references that keep a closed
            # socket's descriptor open, and the daemon waits for the stream before it removes
            # a container whose runner is blocked writing to it
            with contextlib.suppress(Exception):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(Exception):
                sock.close()
            with contextlib.suppress(Exception):
                self._sock_ref.close()
            self._sock_ref = None
        api, self._attach_api = self._attach_api, None
        if api is not None:
            with contextlib.suppress(Exception):
                api.close()
        container, self.container = self.container, None
        if container is not None:
            with contextlib.suppress(Exception):  # already gone (auto_remove) is fine
                container.remove(force=True)
        if self._workroot:
            shutil.rmtree(self._workroot, ignore_errors=True)
            artifacts.release_folder(self._workroot_lock)
            self._workroot, self._workroot_lock = None, None
        if self._stderr is not None:
            with contextlib.suppress(Exception):
                self._stderr.close()
            self._stderr = None


def _check_answer(line: bytes, req_id: int, n_tests: int) -> dict:
    """The runner's answer if it is one to this request, else _BadReply saying what is wrong."""
    try:
        answer = json.loads(line)
    except (ValueError, RecursionError) as e:
        raise _BadReply(f"a reply that is not JSON ({str(e)[:80]})") from e
    if not isinstance(answer, dict):
        raise _BadReply(f"a reply that is not a JSON object ({line[:60]!r})")
    if type(answer.get("id")) is not int or answer["id"] != req_id:
        raise _BadReply(f"the answer to request {answer.get('id')!r} where request {req_id} was asked")
    if "infra_error" in answer:
        return answer
    outcome, passed, total, runtime = (answer.get(k) for k in ("outcome", "tests_passed", "tests_total",
                                                               "runtime_s"))
    if outcome not in OUTCOME_KINDS:
        raise _BadReply(f"an unknown outcome {outcome!r}")
    if type(passed) is not int or type(total) is not int or total != n_tests or not 0 <= passed <= total:
        raise _BadReply(f"tests_passed {passed!r} of tests_total {total!r} for a job of {n_tests} tests")
    if (outcome == "pass") != (passed == total and total > 0):
        raise _BadReply(f"outcome {outcome!r} with {passed} of {total} tests passed")
    if type(runtime) not in (int, float) or not 0 <= runtime < 1e6:
        raise _BadReply(f"a runtime of {runtime!r}")
    return answer


def _result(answer: dict) -> ExecResult:
    return ExecResult(outcome=answer["outcome"], tests_passed=answer["tests_passed"],
                      tests_total=answer["tests_total"], runtime_s=float(answer["runtime_s"]),
                      output_excerpt=str(answer.get("output", ""))[:300])


class Sandbox:
    """A warm pool of workers. Use :func:`open_sandbox`; :meth:`run` executes jobs."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        # Two sandboxes may share an owner label (cfg.label); the instance is this one's alone: in
        # every container's name and label, and all that close() removes.
        self.instance = uuid.uuid4().hex[:12]
        self.label = cfg.label or f"{os.getpid()}-{self.instance[:8]}"
        self.client = None  # the docker SDK client (docker backend), made in start()
        self.workers = [_Worker(cfg, self.label, i, instance=self.instance) for i in range(cfg.workers)]
        self.stats = {"requests": 0, "replaced_unresponsive": 0, "replaced_dead": 0, "replaced_dirty": 0,
                      "replaced_bad_reply": 0, "recycled": 0}
        self._closed = False
        self._lock = threading.Lock()

    @property
    def backend(self) -> str:
        return self.cfg.backend

    @property
    def isolated(self) -> bool:
        return self.cfg.isolated

    def describe(self) -> dict:
        """What the sandbox is, for metadata: backend, isolation, limits."""
        d = self.cfg.model_dump(exclude={"label"})
        d["isolated"] = self.isolated
        d["isolation_version"] = ISOLATION_VERSION
        d["note"] = ("Docker: no network, read-only root, tmpfs /tmp, memory/pids/cpu limits, all capabilities "
                     "dropped but SETUID/SETGID/KILL, no-new-privileges, no SysV/POSIX IPC objects, one task at a time "
                     "per container (its pids cgroup is the task's process limit), tasks as uid 65534 "
                     "(an external suite's judge as uid 65533)"
                     if self.isolated else
                     "UNISOLATED local processes running code the project did not write, by the explicit override "
                     "allow_untrusted_local (resource limits and timeouts only)"
                     if self.cfg.untrusted else
                     "UNISOLATED local processes (resource limits and timeouts only): for the project's own "
                     "generated tasks, never for untrusted code")
        return d

    def start(self) -> Sandbox:
        if self.cfg.backend == "docker":
            self.client = docker_client()
            check_docker(self.cfg, self.client)
            for w in self.workers:
                w.client = self.client
        errors: list[BaseException] = []

        def boot(w: _Worker) -> None:
            try:
                w.start()
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=boot, args=(w,)) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            self.close()
            raise errors[0]
        atexit.register(self.close)
        return self

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for w in self.workers:
            with contextlib.suppress(Exception):
                w.stop()
        if self.cfg.backend == "docker":
            self._remove_labelled()
        with contextlib.suppress(Exception):
            atexit.unregister(self.close)

    def _remove_labelled(self, wait_s: float = 30.0) -> None:
        """Remove this sandbox's containers and wait until the daemon lists none: a stopped
        worker's container may still be in its auto-removal (listed, and refusing a second
        removal) when close() gets here, more so on a loaded machine. Gives up after ``wait_s``."""
        if self.client is None:
            return
        deadline = time.monotonic() + wait_s
        with contextlib.suppress(Exception):
            while left := self.client.containers.list(all=True,
                                                      filters={"label": f"{INSTANCE_KEY}={self.instance}"}):
                for c in left:
                    with contextlib.suppress(Exception):  # its auto-removal is in progress: wait for it
                        c.remove(force=True)
                if time.monotonic() > deadline:
                    break
                time.sleep(0.1)
        with contextlib.suppress(Exception):
            self.client.close()

    def _restart(self, w: _Worker, why: str) -> None:
        # Under the lock: a sandbox being closed (an interrupt) never starts a new container.
        with self._lock:
            if self._closed:
                raise SandboxError("the sandbox was closed while a request was running")
            self.stats[why] += 1
            w.stop()
            w.start()

    def _execute(self, w: _Worker, job: ExecJob, req_id: int) -> ExecResult:
        if w.served >= self.cfg.recycle_every:
            self._restart(w, "recycled")
        failures: list[tuple[str, str]] = []  # (whose: "oom" | "infra", why) of each failed attempt
        for _attempt in range(2):
            try:
                answer = w.request(job, req_id)
            except _Unresponsive:
                failures.append(("infra", "stopped answering: " + w.why_down()[1]))
                self._restart(w, "replaced_unresponsive")
                continue
            except _BadReply as e:
                failures.append(("infra", f"a bad reply ({e})"))
                self._restart(w, "replaced_bad_reply")
                continue
            if answer is None:
                failures.append(w.why_down())
                self._restart(w, "replaced_dead")
                continue
            if "infra_error" in answer:
                failures.append(("infra", str(answer["infra_error"])[:300]))
                self._restart(w, "replaced_dead")
                continue
            if not w.alive():  # answered, then exited (its supervisor was killed): fresh worker next
                self._restart(w, "replaced_dead")
            elif answer.get("dirty"):  # the task left something behind: no next task in this worker
                self._restart(w, "replaced_dirty")
            return _result(answer)
        if all(whose == "oom" for whose, _ in failures):
            # Docker says the container's memory limit was hit, twice, on fresh workers: the
            # task's processes did it (the kernel's OOM killer takes them first).
            return ExecResult("oom", 0, len(job.tests), job.timeout_s,
                              "the task's processes took two sandbox containers past their memory limit")
        # Anything else is the sandbox's failure, never the task's verdict (and never cached).
        raise SandboxError(f"sandbox worker {w.name} failed twice on one job, not because of the task: "
                           + "; ".join(why for _, why in failures))

    def run(self, jobs: Sequence[ExecJob], log: Callable[[str], None] | None = None,
            log_every_s: float = 5.0) -> list[ExecResult]:
        """Execute every job (in parallel over the workers); results in the jobs' order."""
        if self._closed:
            raise SandboxError("the sandbox is closed")
        results: list[ExecResult | None] = [None] * len(jobs)
        todo: queue.Queue[int] = queue.Queue()
        for i in range(len(jobs)):
            todo.put(i)
        errors: list[BaseException] = []
        done = [0]
        t0 = time.monotonic()

        def work(w: _Worker) -> None:
            while not errors:
                try:
                    i = todo.get_nowait()
                except queue.Empty:
                    return
                try:
                    results[i] = self._execute(w, jobs[i], i)
                except SandboxError as e:
                    errors.append(e)
                    return
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                    if self.cfg.backend == "docker" and isinstance(e, _daemon_failures()):
                        lost = daemon_lost(e, f"running a job on sandbox worker {w.name}")
                        lost.__cause__ = e
                        e = lost
                    errors.append(e)
                    return
                done[0] += 1
                self.stats["requests"] += 1

        threads = [threading.Thread(target=work, args=(w,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        last = t0
        try:
            while any(t.is_alive() for t in threads):
                for t in threads:
                    t.join(timeout=0.2)
                now = time.monotonic()
                if log is not None and now - last >= log_every_s:
                    last = now
                    log(f"sandbox ({self.backend}): {done[0]}/{len(jobs)} executions, "
                        f"{done[0] / (now - t0):.1f}/s")
        except BaseException:
            errors.append(KeyboardInterrupt())
            raise
        if errors:
            raise errors[0]
        missing = sum(r is None for r in results)
        if missing:
            raise SandboxError(f"{missing} of {len(jobs)} executions got no result")
        return results  # type: ignore[return-value]


@contextlib.contextmanager
def open_sandbox(backend: str = "docker", workers: int = 2, **options) -> Iterator[Sandbox]:
    """A started sandbox, closed (containers removed) on exit, error or interrupt."""
    cfg = SandboxConfig(backend=backend, workers=workers, **options)
    restore = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        def _term(signum, frame):  # turn SIGTERM into an exception so the containers are removed
            raise KeyboardInterrupt(f"signal {signum}")

        restore = signal.signal(signal.SIGTERM, _term)
    sb = Sandbox(cfg)
    try:
        sb.start()
        yield sb
    finally:
        sb.close()
        if restore is not None:
            signal.signal(signal.SIGTERM, restore)

