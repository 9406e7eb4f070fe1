"""Sandboxes that execute candidate solutions: Docker (isolated) and local processes (not).

A sandbox is a warm pool of workers. Each worker is one long-lived runner
(``sage_pipeline/sim/runner.py``) speaking JSON lines over stdin/stdout: in a hardened
container (``backend="docker"``) or as a local subprocess (``backend="local"``, unisolated:
for the project's own generated tasks only, and marked so in every metadata). Each task
runs in a fresh process inside the runner; see runner.py for the isolation inside.

Host side:

- a watchdog gives every request its timeout plus ``answer_grace_s``; a worker that does
  not answer (or dies) is replaced and the request is run once more on a fresh worker. A
  request that takes down two fresh workers is the task's doing and is recorded as
  ``killed``; a worker that cannot be started is an infrastructure error
  (:class:`SandboxError`), never a task failure;
- workers are recycled every ``recycle_every`` requests;
- containers carry a label unique to the sandbox and are removed on close, on error, on
  interrupt and at interpreter exit; a killed host process leaves none behind either
  (``docker run -i --rm``: the runner exits when its stdin closes).

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
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from sage_pipeline.sim.schema import OUTCOME_KINDS, ExecJob, ExecResult

RUNNER_SOURCE = (Path(__file__).with_name("runner.py")).read_text(encoding="utf-8")
BACKENDS = ("docker", "local")
DEFAULT_IMAGE = "sage-sim:latest"
LABEL_KEY = "sage.sandbox"
# The container's own IPC namespace, made unusable: no SysV shared memory, message queue or
# semaphore set and no POSIX message queue can be created, so no task can leave one for the
# next task to read (a channel between tasks) or hold memory after it ends. Docker accepts
# these namespaced sysctls with a private IPC namespace (`--ipc none`); all five are tested.
IPC_SYSCTLS = {"kernel.shmmni": "0", "kernel.shmall": "0", "kernel.msgmni": "0", "kernel.sem": "0 0 0 0",
               "fs.mqueue.queues_max": "0"}


class SandboxError(RuntimeError):
    """The sandbox itself failed (daemon down, image missing, a worker that will not start).
    Never a verdict on a task: callers must not score it."""


@dataclass(frozen=True)
class SandboxConfig:
    backend: str = "docker"  # docker | local
    workers: int = 2
    image: str = DEFAULT_IMAGE
    memory_mb: int = 512  # container --memory and --memory-swap (no swap)
    task_memory_mb: int = 256  # address-space limit of each task process
    pids_limit: int = 128  # container --pids-limit
    task_nproc: int = 64  # processes/threads of the unprivileged uid
    cpus: float = 1.0  # container --cpus
    tmpfs_mb: int = 64  # the container's /tmp
    recycle_every: int = 2000  # requests per worker before it is replaced
    answer_grace_s: float = 10.0  # watchdog: time past a request's timeout before replacing
    start_timeout_s: float = 60.0  # a worker must say it is ready within this
    docker: str = "docker"  # the docker CLI (honours DOCKER_HOST)
    label: str = ""  # owner label for the containers; default: unique per sandbox

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"sandbox backend {self.backend!r}: use one of {', '.join(BACKENDS)}")
        if self.workers < 1:
            raise ValueError(f"sandbox workers must be >= 1, got {self.workers}")

    @property
    def isolated(self) -> bool:
        return self.backend == "docker"


class _Unresponsive(Exception):
    pass


def docker_run_args(cfg: SandboxConfig, name: str, label: str) -> list[str]:
    """The hardened ``docker run`` command line of one worker."""
    runner_cfg = {"workroot": "/tmp", "memory_bytes": cfg.task_memory_mb << 20, "nproc": cfg.task_nproc,
                  "drop_uid": 65534}
    return [
        cfg.docker, "run", "-i", "--rm", "--name", name, "--label", f"{LABEL_KEY}={label}",
        "--network", "none", "--read-only",
        "--tmpfs", f"/tmp:rw,nosuid,nodev,noexec,size={cfg.tmpfs_mb}m,mode=1777",
        "--ipc", "none", *[a for k, v in IPC_SYSCTLS.items() for a in ("--sysctl", f"{k}={v}")],
        "--memory", f"{cfg.memory_mb}m", "--memory-swap", f"{cfg.memory_mb}m",
        "--pids-limit", str(cfg.pids_limit), "--cpus", str(cfg.cpus),
        # The runner keeps only what it needs: drop to the task uid (SETUID, SETGID) and kill
        # that uid's processes (KILL).
        "--cap-drop", "ALL", "--cap-add", "SETUID", "--cap-add", "SETGID", "--cap-add", "KILL",
        "--security-opt", "no-new-privileges", "--init", "--user", "0:0", "--workdir", "/",
        "--log-driver", "none", "-e", "PYTHONDONTWRITEBYTECODE=1",
        cfg.image, "python3", "-I", "-u", "-c", RUNNER_SOURCE, json.dumps(runner_cfg),
    ]


def check_docker(cfg: SandboxConfig) -> str:
    """The daemon's version, or a SandboxError that says how to get a working daemon and image."""
    if shutil.which(cfg.docker) is None:
        raise SandboxError(f"the sandbox backend is 'docker' but the docker CLI {cfg.docker!r} is not installed "
                           "(apt-get install -y docker.io), or use backend='local' for the project's own tasks")
    try:
        out = subprocess.run([cfg.docker, "version", "--format", "{{.Server.Version}}"], capture_output=True,
                             text=True, timeout=20)
    except subprocess.TimeoutExpired:
        out = None
    if out is None or out.returncode != 0:
        why = "no answer in 20 s" if out is None else (out.stderr.strip().splitlines() or ["?"])[-1]
        host = os.environ.get("DOCKER_HOST", "the local socket /var/run/docker.sock")
        raise SandboxError(
            f"the sandbox backend is 'docker' but the Docker daemon at {host} does not answer ({why}). "
            "Start it (as root: `dockerd > /var/log/dockerd.log 2>&1 &`, or `systemctl start docker`), "
            "or point DOCKER_HOST at a running daemon. Nothing falls back to the unisolated local backend "
            "by itself: set backend='local' explicitly if that is what you want.")
    img = subprocess.run([cfg.docker, "image", "inspect", cfg.image], capture_output=True, text=True, timeout=30)
    if img.returncode != 0:
        raise SandboxError(f"the sandbox image {cfg.image!r} is not there: build it offline with "
                           "`sim/build_image.sh` (debootstrap + docker import), or with a registry "
                           f"`docker build -t {cfg.image} sim/`")
    return out.stdout.strip()


class _Worker:
    """One runner process (a container or a local subprocess) and its JSON-lines channel."""

    def __init__(self, cfg: SandboxConfig, label: str, index: int) -> None:
        self.cfg, self.label, self.index = cfg, label, index
        self.generation = 0
        self.proc: subprocess.Popen | None = None
        self.name = ""
        self.served = 0
        self._buf = b""
        self._workroot: str | None = None
        self._stderr = None

    def start(self) -> None:
        self.generation += 1
        self.served, self._buf = 0, b""
        self._stderr = tempfile.TemporaryFile()
        if self.cfg.backend == "docker":
            self.name = f"sage-sim-{self.label}-{self.index}-{self.generation}"
            cmd = docker_run_args(self.cfg, self.name, self.label)
        else:
            self._workroot = tempfile.mkdtemp(prefix="sage-sim-local-")
            runner_cfg = {"workroot": self._workroot, "memory_bytes": self.cfg.task_memory_mb << 20,
                          "drop_uid": None}
            self.name = f"local-{os.getpid()}-{self.index}-{self.generation}"
            cmd = [sys.executable, "-I", "-u", "-c", RUNNER_SOURCE, json.dumps(runner_cfg)]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     start_new_session=True)
        try:
            ready = self._read(self.cfg.start_timeout_s)
        except _Unresponsive:
            ready = None
        if not ready or not ready.get("ready"):
            err = self._stderr_tail()
            self.stop()
            raise SandboxError(f"sandbox worker {self.name} did not start ({err or 'no output'}); "
                               + ("check `docker run --rm " + self.cfg.image + " python3 -V`"
                                  if self.cfg.backend == "docker" else "check the Python interpreter"))
        self.info = ready

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        with contextlib.suppress(Exception):
            self._stderr.seek(0)
            return self._stderr.read()[-500:].decode("utf-8", "replace").strip()
        return ""

    def _read(self, timeout: float) -> dict | None:
        assert self.proc is not None and self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self._buf:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise _Unresponsive
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return None
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def request(self, job: ExecJob, req_id: int) -> dict | None:
        """The runner's answer, None if it died, _Unresponsive past the watchdog's deadline."""
        assert self.proc is not None and self.proc.stdin is not None
        msg = {"id": req_id, "code": job.code, "entry_point": job.entry_point, "tests": job.tests,
               "timeout_s": job.timeout_s}
        try:
            self.proc.stdin.write((json.dumps(msg, separators=(",", ":")) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        self.served += 1
        return self._read(job.timeout_s + self.cfg.answer_grace_s)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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
        if self.cfg.backend == "docker" and self.name:
            subprocess.run([self.cfg.docker, "rm", "-f", self.name], capture_output=True, timeout=30)
        if self._workroot:
            shutil.rmtree(self._workroot, ignore_errors=True)
            self._workroot = None
        if self._stderr is not None:
            with contextlib.suppress(Exception):
                self._stderr.close()
            self._stderr = None


def _result(answer: dict) -> ExecResult:
    outcome = answer["outcome"]
    if outcome not in OUTCOME_KINDS:
        raise SandboxError(f"the sandbox runner answered an unknown outcome {outcome!r}")
    return ExecResult(outcome=outcome, tests_passed=int(answer["tests_passed"]),
                      tests_total=int(answer["tests_total"]), runtime_s=float(answer["runtime_s"]),
                      output_excerpt=str(answer.get("output", ""))[:300])


class Sandbox:
    """A warm pool of workers. Use :func:`open_sandbox`; :meth:`run` executes jobs."""

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.label = cfg.label or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.workers = [_Worker(cfg, self.label, i) for i in range(cfg.workers)]
        self.stats = {"requests": 0, "replaced_unresponsive": 0, "replaced_dead": 0, "replaced_dirty": 0,
                      "recycled": 0}
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
        d = {k: v for k, v in asdict(self.cfg).items() if k not in ("label", "docker")}
        d["isolated"] = self.isolated
        d["note"] = ("Docker: no network, read-only root, tmpfs /tmp, memory/pids/cpu limits, all capabilities "
                     "dropped but SETUID/SETGID/KILL, no-new-privileges, tasks as uid 65534"
                     if self.isolated else
                     "UNISOLATED local processes (resource limits and timeouts only): for the project's own "
                     "generated tasks, never for untrusted code")
        return d

    def start(self) -> Sandbox:
        if self.cfg.backend == "docker":
            check_docker(self.cfg)
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

    def _remove_labelled(self) -> None:
        with contextlib.suppress(Exception):
            out = subprocess.run([self.cfg.docker, "ps", "-aq", "--filter", f"label={LABEL_KEY}={self.label}"],
                                 capture_output=True, text=True, timeout=30)
            ids = out.stdout.split()
            if ids:
                subprocess.run([self.cfg.docker, "rm", "-f", *ids], capture_output=True, timeout=60)

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
        failures = []
        for _attempt in range(2):
            try:
                answer = w.request(job, req_id)
            except _Unresponsive:
                failures.append("stopped answering")
                self._restart(w, "replaced_unresponsive")
                continue
            if answer is None or "infra_error" in answer:
                failures.append("died" if answer is None else answer["infra_error"])
                self._restart(w, "replaced_dead")
                continue
            if not w.alive():  # answered, then exited (its supervisor was killed): fresh worker next
                self._restart(w, "replaced_dead")
            elif answer.get("dirty"):  # the task left something behind: no next task in this worker
                self._restart(w, "replaced_dirty")
            return _result(answer)
        if all(f in ("stopped answering", "died") for f in failures):
            # Two fresh workers went down on this task: its doing, not the infrastructure's.
            return ExecResult("killed", 0, len(job.tests), job.timeout_s,
                              f"the task took down two fresh sandbox workers ({'; '.join(failures)})")
        raise SandboxError(f"sandbox worker {w.name} failed twice: {'; '.join(failures)}")

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
                except BaseException as e:  # noqa: BLE001 - re-raised in the caller
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

