"""``sage run`` from a SAGE that is already imported: a launcher process, started with SAGE's own
interpreter, imports SAGE once, then forks one child per run; the child enters the run's workspace
and calls SAGE's console-script entry point (``sage = "sage.cli.main:main"`` in SAGE's
pyproject ``[project.scripts]``) exactly as the ``sage`` script does. SAGE's code is unchanged.
SAGE's imports cost ~3 s of CPU per ``sage run`` (langgraph, langchain_core, qdrant_client), ~2 s
more with a checkpoint deployed (joblib and scikit-learn, to unpickle it), and the interpreter ~0.6 s
at exit; a forked child costs ~0.1 s of CPU besides its run (``benchmarks/sage_launcher.py``).

This file is both sides and imports nothing outside the standard library: run as a script (by
SAGE's interpreter) it is the launcher; imported (by the harness) it gives :class:`SageLauncher`,
which starts one and talks to it over a Unix socket pair, one JSON object a line:

    launcher -> harness  {"ready": true, ...}            after the imports (or "ready": false, "error")
    harness  -> launcher {"run", "cwd", "argv", "stdout", "stderr", "env", "probe"}
    launcher -> harness  {"started": pid}                the child: its own session and process group
    launcher -> harness  {"exit": rc, "cpu_s": s}        rc as subprocess's returncode; cpu_s from wait4

The harness closing its end stops the launcher. Each launcher serves one worker's runs in turn
(one per worker and day: the environment is the day's).

**A run's own variables** (``env`` of a request, :meth:`SageLauncher.run`'s ``env=``): set in the
child's ``os.environ`` after the fork and before SAGE's entry point, on top of the launcher's (the
day's). Only variables SAGE reads *at call time* can differ per run this way: a variable read at
import would be the launcher's. The harness sets ``SAGE_TRACE_ID`` (read by
``observability/structured_logger.py`` and ``run_metrics.py`` at every line), ``SAGE_MODELS_YAML``
(``config/paths.py``'s ``resolved_models_yaml_path``, called each time a ``ModelRouter`` is built) and
``SAGE_SKILLS_ROOT`` (``execution/policy_store.py``, read at each injection; the injector's
``lru_cache`` of skill files is empty in each child, see below), and nothing else
(``harness.RUN_ENV_KEYS``). The child has exactly the environment a fresh ``sage run`` started with
the day's environment and those variables would have.

**What a fork shares with its launcher that a fresh process would build itself**, found by reading
every SAGE module a ``sage run`` imports (82 with a checkpoint deployed: ``sage.cli``,
``sage.orchestrator``, ``sage.agents``, ``sage.execution``, ``sage.memory``, ``sage.llm``,
``sage.observability``, ``sage.prompt_engine``, ``sage.codebase``, ``sage.rl``, ...) for state made
at import, and what is done about each:

* **The coder's UCB bandit** (``sage.rl.ucb_bandit._GLOBAL_BANDIT``): built at import from the
  relative path ``memory/rl/ucb_bandit.json``, i.e. from the *workspace's* state, read once. The
  child, after ``chdir`` into the run's workspace, rebinds it to
  ``UCBStrategyBandit(storage_path=<the same relative path>)`` (SAGE's own constructor, which reads
  the file as the import would have); ``get_global_bandit()`` reads the module global at each call,
  and the launcher refuses to serve if anything but that global holds the import-time bandit.
* **The working directory at import**: the launcher imports in an empty folder of its own and
  refuses to serve if the imports wrote anything there (SAGE writes nothing at import today); every
  other relative path SAGE holds (``memory/...``, ``.sage/rules.md``, ``tests``, ``memory/handoff.json``,
  ``policy_bc.joblib``) is a ``Path`` resolved when used, in the child, after the ``chdir``.
* **Environment variables read at import** (``ollama``'s default client reads ``OLLAMA_HOST`` and
  ``OLLAMA_API_KEY`` when ``ollama`` is imported; httpx its proxy and certificate variables; every
  ``SAGE_*`` SAGE reads is read at call time): the launcher is started with the run's environment,
  exactly the one a fresh ``sage run`` gets (the harness builds it once per day), so every value
  read at import is the run's. The ``ollama`` client made at import has never sent a request in the
  launcher: no connection is inherited. ``SAGE_SESSION_ID`` and ``SAGE_WORKSPACE_ROOT`` are set by
  ``cmd_run`` itself, in the child. scikit-learn's import sets ``KMP_DUPLICATE_LIB_OK`` and
  ``KMP_INIT_AT_FORK`` (Intel OpenMP only); a fresh run sets them at its first routing decision
  (the planner's, when ``SAGE_RL_POLICY=1`` unpickles the checkpoint), a forked one has them from
  its start: no subprocess runs between the two.
* **Random state**: Python's ``random`` is reseeded in every fork child by Python itself
  (``os.register_at_fork``); numpy's global ``RandomState`` is not, and the exploring checkpoint's
  ``DummyClassifier(strategy="stratified")`` draws from it at every decision, so the child reseeds
  it from OS entropy (``numpy.random.seed()``, as numpy's import does). ``uuid4`` (SAGE's session
  ids) reads the OS. The one difference left: ``str`` hashes use the launcher's hash seed in every
  run of that launcher (a fresh process draws its own); the test that the two paths write the same
  journals checks that nothing SAGE writes depends on it.
* **Caches and module globals filled during a run** (``sage.rl.policy._policy_loaded`` /
  ``_cached_policy`` behind ``get_routing_policy``, ``skill_injector._load_skill_text``'s
  ``lru_cache``, ``ollama_safe._last_token_usage``, ``trajectory_logger._last_score_by_task``,
  ``semantic_reader``'s index and Qdrant client, ``docs_rag_retriever._CACHE``,
  ``executor._FILE_LOCKS``): empty at import, and the launcher runs nothing but the imports, so each
  child starts with them as a fresh import leaves them; what a run fills dies with its child.
* **Threads and file handles**: the workflow's ``EVENT_BUS`` starts its worker thread at the first
  event (in the child), not at import; no SAGE module opens a file or a logger handler at import
  (``structured_logger.log_event`` and ``MemoryManager`` open the journal per line). The launcher
  refuses to serve if a Python thread is running after the imports (a fork keeps only the calling
  thread). numpy's and scipy's OpenBLAS start a native thread pool at import; OpenBLAS shuts it
  down around a fork (``pthread_atfork``) and the child starts its own at its first BLAS call. The
  child closes the launcher's socket, so only stdin (``/dev/null``), stdout and stderr (the run's
  files) are open in it, as in a fresh process started by ``subprocess`` (``close_fds``).
* **What the interpreter knows of its own start**: ``sys.executable`` is the interpreter named in
  the ``sage`` script's ``#!`` line (the launcher is started with it: SAGE's planner writes
  ``sys.executable -m pytest`` into a plan's verification command); ``sys.path[0]`` is the
  script's folder (set before the imports, as for the script); ``sys.argv`` is the script's path
  and the run's arguments (``argparse`` names the program from it). ``sys.orig_argv`` is set to
  what starting the script would have given.
* **stdio and signals**: stdout and stderr are files (a pipe in the fresh path): neither is a TTY,
  so Python buffers them alike and ``rich`` sees no terminal in both. The launcher installs no
  signal handler; ``cmd_run`` installs its SIGINT/SIGTERM handlers in the child. Output the
  imports print (none today) goes to the launcher's own files; the harness puts it before each
  run's output, where a fresh process would have printed it.
* **The garbage collector**: the launcher collects the imports' garbage, then freezes what they
  left alive (``gc.freeze()``, as Python's documentation advises before forking workers): a
  child's collections, and the interpreter's at exit, skip those objects instead of touching, and
  so copying, every page of them (0.6 s of CPU less per run; a fresh process pays ~0.6 s at exit).
  The one difference a run could see: an import-time object that becomes cyclic garbage during
  the run is neither collected nor finalized before exit, and SAGE's import-time objects hold
  nothing a finalizer would release (no file, socket or thread; see above).
* **Exit**: the child leaves the launcher's loop and raises ``SystemExit(main())`` from the script's
  top level as the ``sage`` script does, so the interpreter finishes as it would (``atexit``
  handlers, non-daemon threads joined, buffers flushed, an uncaught exception's traceback on stderr
  and exit 1).

A run past its limit is killed with its whole process group by the harness (the child is a session
leader, as ``start_new_session`` makes a fresh one); the launcher reaps it and goes on. A launcher
that dies or stops answering is seen by the harness (end of file, or a time limit), which kills
the run it was serving, if any, starts another and counts it.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

# Every SAGE module a `sage run` imports (measured: 82 with their packages), and the few of its libraries'
# modules it imports lazily during the run; the launcher imports them once. A module left out is imported
# by the child, as a fresh run would: only slower.
PRELOAD = tuple(f"sage.{m}" for m in (
    "cli.main", "cli.run_cmd", "cli.run_output", "cli.chat_session_store", "cli.clarify", "cli.log_utils",
    "orchestrator.workflow", "orchestrator.session_manager", "orchestrator.checkpoints",
    "orchestrator.intelligence_feed", "orchestrator.task_graph", "orchestrator.task_scheduler",
    "agents.architect", "agents.coder", "agents.debugger", "agents.documentation", "agents.memory_optimizer",
    "agents.planner", "agents.reviewer", "agents.test_engineer",
    "codebase.context_builder", "codebase.code_index", "codebase.conventions", "codebase.sage_project_initializer",
    "codebase.scanner", "codebase.semantic_reader", "codebase.state_assessor",
    "execution.verifier", "execution.policy_store", "llm.embeddings", "llm.token_budget",
    "memory.digest", "memory.docs_rag_retriever", "memory.manager", "memory.sqlite_store",
    "observability.run_metrics", "observability.structured_logger", "observability.trajectory_logger",
    "prompt_engine.skill_injector", "rl.policy", "rl.ucb_bandit", "scripts.git_hooks",
)) + ("rich.panel", "rich.rule", "langchain_core.tracers.context", "langchain_core.tracers.run_collector",
      "langchain_core.tracers.stdout")
READY_TIMEOUT_S = 180.0  # the imports take ~3 s alone, longer on a loaded machine
REPLY_TIMEOUT_S = 30.0  # a launcher answers a request (or reports a killed run) within this, or it is replaced


class LauncherError(RuntimeError):
    """The launcher could not start, died or stopped answering; the message says what it printed."""


# ----------------------------------------------------------------------------- the launcher (SAGE's interpreter)
def _send(sock: socket.socket, obj: dict) -> None:
    sock.sendall((json.dumps(obj) + "\n").encode())


class _Lines:
    """JSON lines from a socket, without ``makefile`` (whose references would keep the socket open
    in a forked child after ``close``)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.buf = sock, b""

    def read(self, timeout: float | None = None) -> dict | None:
        """The next object, None at end of file; TimeoutError past ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not select.select([self.sock], [], [], left)[0]:
                    raise TimeoutError
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


def _import_state(cwd: Path) -> str | None:
    """Why the imported SAGE cannot be forked as a fresh one (None: it can); see the module doc."""
    import gc
    import threading

    threads = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    if threads:
        return f"threads running after SAGE's imports ({threads}): a fork would lose them"
    left = sorted(p.name for p in cwd.iterdir())
    if left:
        return (f"SAGE's imports wrote {left} into the working directory {cwd}: a fresh run would write them "
                "into its workspace")
    ucb = sys.modules["sage.rl.ucb_bandit"]
    holders = [r for r in gc.get_referrers(ucb._GLOBAL_BANDIT) if r is not vars(ucb)]
    if holders:
        return (f"sage.rl.ucb_bandit._GLOBAL_BANDIT is held by {len(holders)} object(s) besides its module: "
                "rebinding it per run would leave them with the launcher's state")
    return None


def _enter_run(req: dict, sock: socket.socket, cli: str) -> None:
    """In the forked child: the run's session, stdio, workspace, argv and import-time state (module doc)."""
    os.setsid()
    sock.close()
    for fd, path, flags in ((0, os.devnull, os.O_RDONLY), (1, req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        f = os.open(path, flags, 0o644)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.update({str(k): str(v) for k, v in (req.get("env") or {}).items()})  # the run's own variables
    sys.argv = [cli, *req["argv"]]
    sys.orig_argv = [sys.executable, *sys.argv]
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()  # fresh OS entropy, as numpy's import seeds it
    ucb = sys.modules["sage.rl.ucb_bandit"]
    ucb._GLOBAL_BANDIT = ucb.UCBStrategyBandit(storage_path=ucb._GLOBAL_BANDIT._storage_path)


def _probe() -> dict:
    """What the child would run SAGE with (``"probe": true`` requests: the tests read it)."""
    import threading

    ucb, ollama = sys.modules["sage.rl.ucb_bandit"], sys.modules["ollama"]
    np_random = sys.modules.get("numpy.random")
    return {"pid": os.getpid(), "pgid": os.getpgid(0), "sid": os.getsid(0), "cwd": os.getcwd(), "argv": sys.argv,
            "path0": sys.path[0], "executable": sys.executable, "bandit": ucb.get_global_bandit()._stats,
            "numpy_draw": float(np_random.random()) if np_random else None,
            "ollama_host": str(ollama._client._client.base_url), "env": dict(os.environ),
            "threads": [t.name for t in threading.enumerate()],
            "fds": sorted(int(f) for f in os.listdir("/proc/self/fd")),
            "stdin": os.readlink("/proc/self/fd/0")}


def _serve(sock: socket.socket) -> dict | None:
    """Answer requests until the harness closes its end (None); in a forked child, return its request."""
    lines = _Lines(sock)
    while True:
        req = lines.read()
        if req is None:
            return None
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            return req
        _send(sock, {"started": pid})
        _, status, usage = os.wait4(pid, 0)
        _send(sock, {"exit": os.waitstatus_to_exitcode(status), "cpu_s": usage.ru_utime + usage.ru_stime})


def launcher_main(argv: list[str]) -> None:
    import argparse

    ap = argparse.ArgumentParser(description="SAGE launcher: imports SAGE once, forks one child per `sage run`")
    ap.add_argument("--fd", type=int, required=True, help="this end of the harness's socket pair")
    ap.add_argument("--cli", required=True, help="SAGE's `sage` script (its argv[0] and sys.path[0])")
    ap.add_argument("--preload", default=",".join(PRELOAD))
    a = ap.parse_args(argv)
    sock = socket.socket(fileno=a.fd)
    sys.path[0] = str(Path(a.cli).parent)  # the script's folder, not this file's
    sys.argv = [a.cli]
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        import importlib

        for mod in a.preload.split(","):
            importlib.import_module(mod)
        ckpt = os.environ.get("SAGE_RL_CHECKPOINT", "")
        if os.environ.get("SAGE_RL_POLICY") == "1" and ckpt and Path(ckpt).is_file():
            import joblib  # what unpickling the checkpoint imports (scikit-learn); the object is dropped

            joblib.load(ckpt)
        why = _import_state(Path.cwd())
    except Exception as exc:  # noqa: BLE001 (reported to the harness, which says what to do)
        why = f"importing SAGE failed: {type(exc).__name__}: {exc}"
    if why:
        _send(sock, {"ready": False, "error": why})
        raise SystemExit(2)
    import gc

    gc.collect()  # the imports' garbage, as a fresh process would collect it during its run
    gc.freeze()  # what the imports left alive: no child's collection touches (and so copies) it again
    _send(sock, {"ready": True, "pid": os.getpid(), "executable": sys.executable, "modules": len(sys.modules),
                 "import_s": time.perf_counter() - t0, "import_cpu_s": time.process_time() - cpu0})
    req = _serve(sock)
    if req is None:
        raise SystemExit(0)
    _enter_run(req, sock, a.cli)
    if req.get("probe"):
        print(json.dumps(_probe()))
        raise SystemExit(0)
    from sage.cli.main import main  # the `sage` script, verbatim but for the import above

    sys.argv[0] = re.sub(r"(-script\.pyw|\.exe)?$", "", sys.argv[0])
    raise SystemExit(main())


# ----------------------------------------------------------------------------- the harness's side
def console_python(cli: Path, fallback: Path) -> Path:
    """The interpreter the ``sage`` script's ``#!`` line names (``sys.executable`` of a fresh run),
    else ``fallback`` (pip writes a ``/bin/sh`` trampoline for long paths)."""
    try:
        with open(cli, "rb") as f:
            first = f.readline().decode("utf-8", "replace").strip()
    except OSError:
        return fallback
    path = first[2:].strip() if first.startswith("#!") else ""
    ok = path and " " not in path and Path(path).name.startswith("python") and Path(path).is_file()
    return Path(path) if ok else fallback


class SageLauncher:
    """One launcher process: ``run`` forks one ``sage run`` from it and waits for it. Not thread-safe:
    one per worker. ``start`` raises :class:`LauncherError`; ``run`` raises it when the launcher died
    or hung (after killing the run it was serving), and the caller starts another."""

    def __init__(self, python: Path, cli: Path, env: dict[str, str], home: Path, name: str = "launcher") -> None:
        self.python, self.cli, self.env, self.home, self.name = python, cli, env, Path(home), name
        self.proc: subprocess.Popen | None = None
        self.sock: socket.socket | None = None
        self.lines: _Lines | None = None
        self.info: dict = {}
        self.import_output = ("", "")  # what the imports printed (stdout, stderr): before every run's own
        self.current_pid: int | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = READY_TIMEOUT_S) -> dict:
        cwd = self.home / self.name
        shutil.rmtree(cwd, ignore_errors=True)  # a replaced launcher's folder: the next one imports in an empty one
        cwd.mkdir(parents=True)
        ours, theirs = socket.socketpair()
        out, err = self.home / f"{self.name}.stdout", self.home / f"{self.name}.stderr"
        try:
            with open(out, "wb") as fo, open(err, "wb") as fe:
                cmd = [str(self.python), str(Path(__file__).resolve()), "--fd", str(theirs.fileno()),
                       "--cli", str(self.cli)]
                self.proc = subprocess.Popen(
                    cmd, cwd=cwd, env=self.env, stdin=subprocess.DEVNULL, stdout=fo, stderr=fe,
                    pass_fds=[theirs.fileno()], start_new_session=True)
        except OSError as exc:
            ours.close()
            raise LauncherError(f"could not start SAGE's launcher with {self.python}: {exc}") from exc
        finally:
            theirs.close()
        self.sock, self.lines = ours, _Lines(ours)
        try:
            msg = self.lines.read(timeout)
        except TimeoutError:
            msg = {"ready": False, "error": f"no answer within {timeout:g} s"}
        if msg is None:
            msg = {"ready": False, "error": f"it exited ({self.proc.wait()}) before importing SAGE"}
        if not msg.get("ready"):
            self.close()
            raise LauncherError(f"SAGE's launcher did not start: {msg.get('error')}; its output: "
                                f"{self._tail(err) or 'none'} (set HarnessConfig(fresh_process=True) to run each "
                                "`sage run` as a process of its own)")
        self.info = msg
        self.import_output = (out.read_text(errors="replace"), err.read_text(errors="replace"))
        return msg

    def run(self, run: str, cwd: Path, argv: list[str], stdout: Path, stderr: Path, timeout: float,
            probe: bool = False, env: dict[str, str] | None = None) -> tuple[int | None, float | None, bool]:
        """Fork ``sage <argv>`` in ``cwd``, its output into ``stdout``/``stderr``, with ``env`` set on top of
        the launcher's environment (variables SAGE reads at call time only: see the module doc); kill its
        process group past ``timeout`` seconds. Returns (exit status or None when killed, CPU seconds of the
        run and the children it waited for, killed)."""
        if not self.alive or self.sock is None or self.lines is None:
            raise LauncherError(f"{self.name} is not running: start it first")
        extra = dict(env or {})
        for k, v in extra.items():
            if not (isinstance(k, str) and re.fullmatch(r"[A-Z_][A-Z0-9_]*", k) and isinstance(v, str)
                    and "\x00" not in v):
                raise ValueError(f"run {run}: env {k!r}: a variable name (A-Z, 0-9, _) with a string value "
                                 "without a NUL byte")
        self.current_pid = None
        # absolute: the launcher runs in a folder of its own, so a path relative to the caller's would miss
        req = {"run": run, "cwd": str(Path(cwd).resolve()), "argv": argv, "stdout": str(Path(stdout).resolve()),
               "stderr": str(Path(stderr).resolve()), "env": extra, "probe": probe}
        start = time.monotonic()
        try:
            _send(self.sock, req)
            msg = self.lines.read(REPLY_TIMEOUT_S)
        except (OSError, TimeoutError) as exc:
            raise self._lost(f"it did not take the run ({type(exc).__name__})") from None
        if msg is None or "started" not in msg:
            raise self._lost(f"it did not start the run (answered {msg!r})")
        self.current_pid = int(msg["started"])
        killed = False
        try:
            msg = self.lines.read(max(timeout - (time.monotonic() - start), 0.0))
        except TimeoutError:
            killed = True
            _killpg(self.current_pid)
            try:
                msg = self.lines.read(REPLY_TIMEOUT_S)
            except TimeoutError:
                msg = None
        if msg is None or "exit" not in msg:
            raise self._lost("it died or stopped answering during the run")
        self.current_pid = None
        return (None if killed else int(msg["exit"])), msg.get("cpu_s"), killed

    def _lost(self, what: str) -> LauncherError:
        """Kill the run in flight (its own process group: it outlives its launcher), then the launcher."""
        if self.current_pid is not None:
            _killpg(self.current_pid)
        rc = self.proc.poll() if self.proc is not None else None
        self.close()
        status = f"exit {rc}" if rc is not None else "killed by the harness"
        tail = self._tail(self.home / f"{self.name}.stderr")
        return LauncherError(f"SAGE's launcher {self.name} was lost ({status}): {what}"
                             + (f"; it printed: {tail}" if tail else ""))

    def close(self) -> None:
        """Stop the launcher: end of file on its socket, then SIGKILL if it has not exited in 10 s."""
        if self.sock is not None:
            self.sock.close()
            self.sock = self.lines = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                _killpg(self.proc.pid)
                self.proc.wait()

    def _tail(self, path: Path) -> str:
        try:
            lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(lines[-3:])[-500:]

    def __enter__(self) -> SageLauncher:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _killpg(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:  # not yet its own group (a fork's first instant) or gone
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    launcher_main(sys.argv[1:])
