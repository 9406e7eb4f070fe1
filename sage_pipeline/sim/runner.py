"""The sandbox runner: a small standard-library program that executes candidate solutions.

It runs inside the sandbox container (Docker backend) or as a local subprocess (local
backend), started as ``python3 -I -u -c <this file's source> <config json>``, so the image
needs nothing but python3. Protocol with the host: JSON lines. The runner first writes
``{"ready": ...}``; then for each request line
``{"id", "code", "entry_point", "tests": [{"args", "expected"}], "timeout_s"}`` it writes one
answer line ``{"id", "outcome", "tests_passed", "tests_total", "runtime_s", "output"}``.
Tests of the form ``[{"check", "setup"}]`` are an external suite's (HumanEval, MBPP): their
trusted test code runs in a judge process, the candidate in its own (see "external suites"
below). A test of the form ``[{"command", "code_file", "files"}]`` is a **workspace job**
(SAGE's tests, see "workspace jobs" below): the candidate's code is written to ``code_file``
and every file of ``files`` beside it, and the command runs there as SAGE's gate runs it; the
verdict is its exit status.

Processes, per container:

- the runner (root inside the container, keeping only CAP_SETUID, CAP_SETGID, CAP_KILL)
  holds the expected outputs and the answer channel (its stdout, duplicated to a
  close-on-exec descriptor; descriptors 0 and 1 are pointed at /dev/null);
- the zygote, forked at start-up before any request is read, so its memory never holds an
  expected output; it forks one child per request and relays the child's outputs;
- the child: a fresh process in its own session, with resource limits (address space, CPU
  time, file size, open files, processes), privileges dropped to an unprivileged uid, a
  fresh working folder, descriptors 0-2 on /dev/null and a capture pipe and 3 on the
  result pipe. It runs the candidate on each test's ``args`` and writes one JSON line per
  test with the return value. It never sees an expected value, so it cannot forge a pass:
  the runner compares.

Set-up failures of the child travel on a third pipe (descriptor 4 in the child) that is
closed before candidate code runs: only the sandbox can report one, never the candidate.

After each request the runner kills the child's process group and, with a dedicated
unprivileged uid, every process of that uid (daemonised grandchildren included), then
empties the work root (whatever the modes, however deep). If anything is left (a process,
a file, an IPC object), the answer carries ``"dirty"`` and the host replaces this runner
before the next task. A wall-clock timeout kills a hanging candidate. The answer is due by
the task's timeout plus ``answer_within_s`` (the host's grace less its margin): a clean-up
still running then is cut short and the answer is "dirty", never late.

The task's process limit is the container's pids cgroup, not ``RLIMIT_NPROC`` (``nproc``
null): that one counts the uid's processes on the whole machine, every container's tasks
included. A task's first pid tells how many processes the previous task made (one pid
namespace per container: a fresh one per task needs CAP_SYS_ADMIN), and nothing else.

Python 3.9+, standard library only: this file is executed inside the sandbox image.
"""

import base64
import errno
import fcntl
import json
import math
import os
import resource
import select
import selectors
import signal
import socket
import stat
import sys
import time

# Standard-library modules that candidates and suite checks import most (HumanEval's `from typing
# import List` alone costs a child ~5-8 ms of CPU to import): imported once at start, before the
# zygote is forked and before any request is read, so every task and judge finds them loaded.
# Each child is a fresh fork: what a task does to a module stays in its own process; `random`
# reseeds itself in every forked child (os.register_at_fork).
PRELOAD = ("typing", "heapq", "bisect", "string", "random", "datetime", "copy")

MAX_RESULT_BYTES = 1 << 20  # per child, the outputs it may return
MAX_CAPTURE_BYTES = 4096  # head of the child's stdout/stderr kept for the answer
EXCERPT = 300


# -- framing ---------------------------------------------------------------------------

def write_line(fd, obj):
    data = (json.dumps(obj, separators=(",", ":")) + "\n").encode("utf-8")
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class LineReader:
    """JSON objects, one a line (the host's requests, the zygote's commands and events), read
    through :class:`RawLines` (linear in the bytes, capped)."""

    def __init__(self, fd, cap=1 << 30):
        self.raw = RawLines(fd, cap)

    def read(self, timeout=None):
        """The next line as an object; None at EOF; raises TimeoutError past ``timeout``."""
        line = self.raw.read(None if timeout is None else time.monotonic() + timeout)
        return None if line is None else json.loads(line)


# -- the child ---------------------------------------------------------------------------

def _limits(cfg, timeout_s):
    mem = int(cfg["memory_bytes"])
    cpu = int(math.ceil(timeout_s)) + 1
    limits = [(resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_CORE, 0),
              (resource.RLIMIT_FSIZE, 16 << 20), (resource.RLIMIT_NOFILE, 64)]
    # RLIMIT_NPROC counts every process of the uid on the whole machine (no user namespace), so a
    # per-uid limit would be one budget shared by every task of every container: the Docker
    # backend passes nproc None and the container's pids cgroup is the task's own limit.
    if cfg.get("drop_uid") is not None and cfg.get("nproc") is not None:
        limits.append((resource.RLIMIT_NPROC, int(cfg["nproc"])))
    for which, value in limits:
        try:
            resource.setrlimit(which, (value, value))
        except (ValueError, OSError):
            soft, hard = resource.getrlimit(which)
            if hard == resource.RLIM_INFINITY or value <= hard:
                raise
            resource.setrlimit(which, (hard, hard))


SETUP_FD = 4  # the set-up channel's descriptor in the child, closed before candidate code runs


def run_child(cfg, msg, res_w, out_w, setup_w):
    """In the forked child: isolate, then run the candidate on every test's args. Never returns.

    A set-up failure is reported on ``setup_w`` (descriptor 4 once set up), a pipe of its
    own that is closed before the candidate's code runs: the candidate can write anything to
    the result pipe (descriptor 3), but it cannot claim an infrastructure failure and so
    abort the batch."""
    channel = setup_w
    try:
        # Out of the way of the dup2s below (descriptors 0-4 are about to be overwritten).
        res_w, out_w, setup_w = (fcntl.fcntl(fd, fcntl.F_DUPFD, 100) for fd in (res_w, out_w, setup_w))
        channel = setup_w
        os.setsid()
        try:  # the kernel's OOM killer takes the task's processes first, never the runner
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(out_w, 2)
        os.dup2(res_w, 3)
        os.dup2(setup_w, SETUP_FD)
        channel = SETUP_FD
        os.closerange(SETUP_FD + 1, 1 << 16)
        _limits(cfg, msg["timeout_s"])
        uid = cfg.get("drop_uid")
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.umask(0o077)
        work = cfg["workroot"]  # emptied after every task; nothing to clean when nothing was written
        os.chdir(work)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": work, "TMPDIR": work, "LANG": "C.UTF-8"})
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
        if "workspace" in msg:
            argv = workspace_argv(cfg, msg["workspace"]["command"])
    except BaseException as e:  # the sandbox could not be set up: an infrastructure error
        try:
            os.write(channel, (json.dumps({"setup_error": repr(e)[:EXCERPT]}) + "\n").encode())
        finally:
            os._exit(3)
    if "workspace" in msg:
        run_workspace(msg, argv, work)  # never returns
    os.close(SETUP_FD)
    out = os.fdopen(3, "w", buffering=1)
    try:
        ns = {"__name__": "__candidate__", "__builtins__": __builtins__}
        exec(compile(msg["code"], "<candidate>", "exec"), ns)
        fn = ns[msg["entry_point"]]
    except MemoryError:
        out.write(json.dumps({"load_error": "MemoryError", "oom": True}) + "\n")
        os._exit(0)
    except BaseException as e:
        out.write(json.dumps({"load_error": (type(e).__name__ + ": " + str(e))[:EXCERPT]}) + "\n")
        os._exit(0)
    for i, args in enumerate(msg["args_list"]):
        try:
            value = fn(*args)
            try:
                line = json.dumps({"i": i, "out": value})
            except (TypeError, ValueError) as e:
                line = json.dumps({"i": i, "bad_type": (type(value).__name__ + ": " + str(e))[:EXCERPT]})
        except MemoryError:
            line = json.dumps({"i": i, "exc": "MemoryError", "oom": True})
        except BaseException as e:  # SystemExit and KeyboardInterrupt included
            line = json.dumps({"i": i, "exc": (type(e).__name__ + ": " + str(e))[:EXCERPT]})
        out.write(line + "\n")
    out.flush()
    os._exit(0)


# -- workspace jobs: SAGE's tests, run as SAGE's gate runs them ----------------------------------
#
# SAGE's gate (orchestrator/workflow.py verification_gate) runs the plan's verification command,
# `python -m pytest -q tests/test_<module>.py`, in the workspace (execution/verifier.py
# VerificationEngine.run: no shell, the command split as shlex does, PYTHONPATH=<workspace>/src when
# that folder exists) and passes the task on exit status 0. A workspace job does the same in the
# child's fresh working folder: the candidate's code is written to ``code_file``, the job's ``files``
# (the test module) beside it, then the command replaces the child (execve), with the child's limits,
# uid and environment. ``python``/``python3`` is this runner's interpreter (``cfg["python"]`` when
# set), ``pytest`` is ``python -m pytest``. SAGE's import pre-check does not apply: VerificationEngine
# takes a command ending in ``.py`` for the file to import, and no such file exists.
#
# The verdict: exit 0 with pytest's summary of passed tests (and none failed) is a pass; 0 without it
# (the code ended the process before pytest reported, ``os._exit(0)`` at import) is an exception; 1
# (tests failed) a wrong answer; 2-5 (interrupted by collection errors, internal error, usage error,
# no tests collected) an exception naming pytest's code; a signal SIGXCPU or SIGALRM (the test's own
# alarm) a timeout, any other signal killed. The output kept is the head and the tail (pytest's
# summary is at the end).

WORKSPACE_MAX_FILES = 64
WORKSPACE_MAX_DEPTH = 8
WORKSPACE_HEAD_BYTES, WORKSPACE_TAIL_BYTES = 1024, 6144
PYTEST_EXIT = {2: "interrupted (errors during collection)", 3: "internal error", 4: "usage error",
               5: "no tests collected"}
_SUMMARY_WORDS = ("passed", "failed", "error", "errors", "skipped", "xfailed", "xpassed", "deselected",
                  "warning", "warnings", "rerun")


def workspace_path_problem(rel):
    """Why ``rel`` cannot be a file of a workspace job (None when it can): a relative path, no ``..``,
    no empty or hidden-dot parts, at most WORKSPACE_MAX_DEPTH deep."""
    if not isinstance(rel, str) or not rel or "\\" in rel or "\x00" in rel:
        return "not a plain relative path"
    if rel.startswith("/"):
        return "an absolute path"
    parts = rel.split("/")
    if any(x in ("", ".", "..") for x in parts):
        return "a path with an empty, '.' or '..' part"
    if len(parts) > WORKSPACE_MAX_DEPTH:
        return "more than %d folders deep" % WORKSPACE_MAX_DEPTH
    return None


def workspace_problem(spec):
    """Why ``spec`` (a workspace job's test: ``{"command", "code_file", "files"}``) is malformed, or None."""
    if not isinstance(spec, dict) or set(spec) != {"command", "code_file", "files"}:
        return "a workspace job's test is exactly {command, code_file, files}"
    if not isinstance(spec["command"], str) or not spec["command"].strip():
        return "its command is not a non-empty string"
    files = spec["files"]
    if not isinstance(files, dict) or len(files) + 1 > WORKSPACE_MAX_FILES:
        return "its files are not a mapping of at most %d paths" % (WORKSPACE_MAX_FILES - 1)
    for rel in [spec["code_file"], *files]:
        why = workspace_path_problem(rel)
        if why:
            return "file %r: %s" % (rel, why)
    if spec["code_file"] in files:
        return "file %r is both the code file and one of its files" % spec["code_file"]
    if not all(isinstance(v, str) for v in files.values()):
        return "a file's content is not a string"
    try:
        workspace_argv({}, spec["command"])
    except ValueError as e:
        return str(e)
    return None


def workspace_argv(cfg, command):
    """The argv of SAGE's verification ``command`` as its VerificationEngine runs it (shlex, no shell),
    ``python``/``python3`` this runner's interpreter, ``pytest`` ``python -m pytest``; ValueError for a
    chain (``&&``) or a program that is not Python's."""
    import shlex

    if " && " in command:
        raise ValueError("a chained verification command (&&): the sandbox runs one command")
    try:
        argv = shlex.split(command)
    except ValueError:
        argv = command.split()
    if not argv:
        raise ValueError("an empty verification command")
    python = cfg.get("python") or sys.executable
    prog = argv[0].rsplit("/", 1)[-1]
    if prog in ("python", "python3") or (prog.startswith("python3.") and prog[8:].isdigit()):
        return [python] + argv[1:]
    if prog in ("pytest", "py.test"):
        return [python, "-m", "pytest"] + argv[1:]
    raise ValueError("the verification command runs %r: the sandbox runs python and pytest only" % argv[0])


def _place(work, rel, text):
    """Write ``text`` to ``work/rel`` (the folders made), refusing to follow a link."""
    parts = rel.split("/")
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o700, dir_fd=fd)
            except FileExistsError:
                pass
            nxt = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = nxt
        out = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=fd)
        view = memoryview(text.encode("utf-8", "surrogatepass"))
        while view:
            view = view[os.write(out, view):]
        os.close(out)
    finally:
        os.close(fd)


def run_workspace(msg, argv, work):
    """In the isolated child: lay out the workspace, then become the verification command. Never returns.

    A file that cannot be written is the task's (exit 126, its reason on stderr). The set-up channel
    is close-on-exec, so the command cannot claim a sandbox failure; a command that cannot be executed
    (the sandbox's own interpreter missing) is one."""
    spec = msg["workspace"]
    try:
        _place(work, spec["code_file"], msg["code"])
        for rel in sorted(spec["files"]):
            _place(work, rel, spec["files"][rel])
    except (OSError, UnicodeError) as e:
        os.write(2, ("the workspace could not be laid out: %s: %s\n" % (type(e).__name__, e))[:EXCERPT].encode())
        os._exit(126)
    env = dict(os.environ)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if os.path.isdir(os.path.join(work, "src")):  # SAGE's verifier: PYTHONPATH=<workspace>/src
        env["PYTHONPATH"] = os.path.join(work, "src")
    os.close(3)
    fcntl.fcntl(SETUP_FD, fcntl.F_SETFD, fcntl.FD_CLOEXEC)
    try:
        os.execve(argv[0], argv, env)
    except BaseException as e:
        try:
            os.write(SETUP_FD, (json.dumps({"setup_error": "cannot run %s: %r" % (argv[0], e)})[:EXCERPT]
                                + "\n").encode())
        finally:
            os._exit(3)


def pytest_summary(output):
    """pytest's counts from its last summary line (``3 passed, 1 failed in 0.12s``), {} when there is none."""
    for line in reversed(output.splitlines()):
        line = line.strip().strip("=").strip()
        if " in " not in line:
            continue
        counts = {}
        for part in line.rsplit(" in ", 1)[0].split(","):
            bits = part.split()
            if len(bits) != 2 or not bits[0].isdigit() or bits[1] not in _SUMMARY_WORDS:
                counts = None
                break
            word = {"errors": "error", "warnings": "warning"}.get(bits[1], bits[1])
            counts[word] = int(bits[0])
        if counts:
            return counts
    return {}


def _judge_workspace(output, status, timed_out):
    """The verdict on a workspace job: its exit status (and pytest's summary for a pass)."""
    counts = pytest_summary(output)
    said = ", ".join("%d %s" % (n, w) for w, n in counts.items()) or "no pytest summary"
    if timed_out:
        return {"outcome": "timeout", "tests_passed": 0, "tests_total": 1, "first_fail": "timed out (%s)" % said}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        outcome = "timeout" if sig in (signal.SIGXCPU, signal.SIGALRM) else "killed"
        return {"outcome": outcome, "tests_passed": 0, "tests_total": 1, "first_fail": "killed by signal %d" % sig}
    rc = os.WEXITSTATUS(status)
    if rc == 0 and counts.get("passed", 0) > 0 and not counts.get("failed") and not counts.get("error"):
        return {"outcome": "pass", "tests_passed": 1, "tests_total": 1, "first_fail": "exit 0: " + said}
    if rc == 0:
        why = "exit 0 without pytest's report of passed tests (%s): the process ended before pytest did" % said
        return {"outcome": "exception", "tests_passed": 0, "tests_total": 1, "first_fail": why}
    if rc == 1:
        return {"outcome": "wrong_answer", "tests_passed": 0, "tests_total": 1, "first_fail": "exit 1: " + said}
    why = "exit %d%s: %s" % (rc, " (pytest: %s)" % PYTEST_EXIT[rc] if rc in PYTEST_EXIT else "", said)
    return {"outcome": "exception", "tests_passed": 0, "tests_total": 1, "first_fail": why}


def _failure_lines(output):
    """pytest's short summary lines (``FAILED ...``, ``ERROR ...``) and an ``E`` line, for the excerpt."""
    keep = [ln.strip() for ln in output.splitlines() if ln.startswith(("FAILED ", "ERROR ", "E "))]
    return " | ".join(keep[:3])


# -- external suites: the codec, the candidate's server and the judge ---------------------------
#
# An external suite's test code (HumanEval's ``check(candidate)``, MBPP's assert lines) is
# trusted and runs in a judge process, as another unprivileged uid than the candidate. The
# candidate's code runs in its own process. The runner forks the judge; the zygote forks
# the candidate and gets only its code and its two pipe ends (by SCM_RIGHTS), never the test
# code, so no candidate can find the checks in its own memory (``test_reader`` forger). In the
# judge, ``candidate`` (and the entry point's name) is a proxy: each call sends its arguments
# to the candidate's process and gets back the return value or the exception through the codec below. The judge decodes
# only plain values (never unpickles, never runs what the candidate sends), so a candidate
# that writes to any descriptor, returns an object whose ``__eq__`` is always true, exits,
# or patches its builtins can at worst fail. The codec lives here because this file is the
# program that runs inside the sandbox (``python3 -I -c``): no import of the package.

CODEC_MAX_DEPTH = 200
MAX_CALL_BYTES = 16 << 20  # one call's arguments or one reply
CALL_FD, REPLY_FD = 5, 6  # the candidate reads calls on 5; the judge reads replies on 6


class CodecError(ValueError):
    pass


def encode(v, depth=0):
    """A JSON-able, type-preserving form of a plain value: None, bool, int (any size), float
    (nan/inf too), complex, str, bytes, bytearray, list, tuple, set, frozenset, dict. Other
    types raise CodecError; subclasses of these (Counter, OrderedDict, a namedtuple, an
    IntEnum) travel as their plain value."""
    if depth > CODEC_MAX_DEPTH:
        raise CodecError("a value nested deeper than %d levels" % CODEC_MAX_DEPTH)
    t, d = type(v), depth + 1
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return v if -(1 << 53) < v < (1 << 53) else {"i": hex(v)}
    if t is float:
        return v if math.isfinite(v) else {"f": repr(v)}
    if t is list:
        return [encode(x, d) for x in v]
    if t is tuple:
        return {"t": [encode(x, d) for x in v]}
    if t is set:
        return {"s": [encode(x, d) for x in v]}
    if t is frozenset:
        return {"fs": [encode(x, d) for x in v]}
    if t is dict:
        return {"d": [[encode(k, d), encode(x, d)] for k, x in v.items()]}
    if t is bytes:
        return {"b": base64.b64encode(v).decode("ascii")}
    if t is bytearray:
        return {"ba": base64.b64encode(bytes(v)).decode("ascii")}
    if t is complex:
        return {"c": [encode(v.real, d), encode(v.imag, d)]}
    for base in (bool, int, float, complex, str, bytes, bytearray, tuple, list, set, frozenset, dict):
        if isinstance(v, base):
            return encode(base(v), d)
    raise CodecError("a %s cannot cross the sandbox boundary (plain values only)" % t.__name__)


def decode(x, depth=0):
    """The value ``encode`` made, from parsed JSON; anything else raises CodecError. Builds
    only plain values: whatever the candidate sends, the judge gets data, never code."""
    if depth > CODEC_MAX_DEPTH:
        raise CodecError("a value nested deeper than %d levels" % CODEC_MAX_DEPTH)
    t, d = type(x), depth + 1
    if x is None or t is bool or t is str or t is int or t is float:
        return x
    if t is list:
        return [decode(e, d) for e in x]
    if t is dict and len(x) == 1:
        tag, val = next(iter(x.items()))
        tv = type(val)
        try:
            if tag == "i" and tv is str:
                return int(val, 16)
            if tag == "f" and val in ("nan", "inf", "-inf"):
                return float(val)
            if tag in ("t", "s", "fs") and tv is list:
                items = [decode(e, d) for e in val]
                return tuple(items) if tag == "t" else set(items) if tag == "s" else frozenset(items)
            if tag == "d" and tv is list:
                out = {}
                for pair in val:
                    if type(pair) is not list or len(pair) != 2:
                        raise CodecError("a dict item that is not a [key, value] pair")
                    out[decode(pair[0], d)] = decode(pair[1], d)
                return out
            if tag in ("b", "ba") and tv is str:
                raw = base64.b64decode(val.encode("ascii"), validate=True)
                return raw if tag == "b" else bytearray(raw)
            if tag == "c" and tv is list and len(val) == 2:
                re_, im = decode(val[0], d), decode(val[1], d)
                if type(re_) is float and type(im) is float:
                    return complex(re_, im)
        except CodecError:
            raise
        except (TypeError, ValueError, UnicodeError) as e:  # an unhashable key, bad base64 or hex
            raise CodecError("a malformed %r value (%s)" % (tag, e)) from None
    raise CodecError("not a value of the codec (%s)" % t.__name__)


def dumps_value(v):
    return json.dumps(encode(v), separators=(",", ":"), allow_nan=False)


def loads_value(text):
    try:
        parsed = json.loads(text)
    except Exception as e:  # bad JSON, RecursionError on deep nesting
        raise CodecError("not JSON (%s)" % type(e).__name__) from None
    return decode(parsed)


class RawLines:
    """Lines from a descriptor, capped; ``read`` returns bytes, None at EOF, raises
    TimeoutError past the deadline and CodecError past ``cap`` bytes."""

    def __init__(self, fd, cap):
        self.fd, self.cap, self.buf, self.scanned = fd, cap, bytearray(), 0

    def read(self, deadline=None):
        while True:
            nl = self.buf.find(b"\n", self.scanned)
            if nl >= 0:
                line = bytes(self.buf[:nl])
                del self.buf[:nl + 1]
                self.scanned = 0
                return line
            self.scanned = len(self.buf)
            if len(self.buf) > self.cap:
                raise CodecError("a line longer than %d bytes" % self.cap)
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                r, _, _ = select.select([self.fd], [], [], left)
                if not r:
                    raise TimeoutError
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk


def _isolate(cfg, timeout_s, fdmap, setup_w, uid, workdir):
    """Common set-up of a suite child: descriptors ``fdmap`` (target -> source) and the set-up
    channel on SETUP_FD, everything else closed, limits, the uid, a clean environment.
    Returns normally or writes the set-up error and exits."""
    channel = setup_w
    try:
        high = {}
        for target, src in list(fdmap.items()) + [(SETUP_FD, setup_w)]:
            high[target] = fcntl.fcntl(src, fcntl.F_DUPFD, 100)
        channel = high[SETUP_FD]
        os.setsid()
        try:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        for target, src in high.items():
            os.dup2(src, target)
        channel = SETUP_FD
        keep = sorted(high)
        start = 0
        for fd in keep:
            if fd > start:
                os.closerange(start, fd)
            start = fd + 1
        os.closerange(start, 1 << 16)
        _limits(cfg, timeout_s)
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
        os.umask(0o077)
        os.chdir(workdir)
        os.environ.clear()
        os.environ.update({"PATH": "/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8"})
        sys.stdout = os.fdopen(1, "w", buffering=1)
        sys.stderr = os.fdopen(2, "w", buffering=1)
    except BaseException as e:
        try:
            os.write(channel, (json.dumps({"setup_error": repr(e)[:EXCERPT]}) + "\n").encode())
        finally:
            os._exit(3)


def serve_candidate(cfg, msg, fds, setup_w):
    """The candidate's process: load its code, then answer the judge's calls. Never returns."""
    _isolate(cfg, msg["timeout_s"], {0: fds["devnull"], 1: fds["out_w"], 2: fds["out_w"],
                                     3: fds["reply_w"], CALL_FD: fds["call_r"]},
             setup_w, cfg.get("drop_uid"), cfg["workroot"])
    os.close(SETUP_FD)
    reply = os.fdopen(3, "w", buffering=1)
    try:
        ns = {"__name__": "__candidate__", "__builtins__": __builtins__}
        exec(compile(msg["code"], "<candidate>", "exec"), ns)
        fn = ns[msg["entry_point"]]
        reply.write(json.dumps({"ready": True}) + "\n")
    except MemoryError:
        reply.write(json.dumps({"load_error": "MemoryError", "oom": True}) + "\n")
        os._exit(0)
    except BaseException as e:
        reply.write(json.dumps({"load_error": (type(e).__name__ + ": " + str(e))[:EXCERPT]}) + "\n")
        os._exit(0)
    calls = RawLines(CALL_FD, MAX_CALL_BYTES)
    while True:
        line = calls.read()
        if line is None:
            os._exit(0)
        call = json.loads(line)  # from the trusted judge
        n = call["n"]
        try:
            args, kwargs = decode(call["args"]), decode(call["kwargs"])
            value = fn(*args, **kwargs)
            try:
                out = json.dumps({"n": n, "ok": encode(value)}, separators=(",", ":"), allow_nan=False)
            except (CodecError, ValueError, TypeError, RecursionError) as e:
                out = json.dumps({"n": n, "bad_type": (type(value).__name__ + ": " + str(e))[:EXCERPT]})
        except MemoryError:
            out = json.dumps({"n": n, "exc": ["MemoryError", ""]})
        except BaseException as e:  # SystemExit and KeyboardInterrupt included
            out = json.dumps({"n": n, "exc": [type(e).__name__, str(e)[:EXCERPT]]})
        reply.write(out + "\n")


class CandidateFailed(Exception):
    """Raised in the judge by a call of the candidate that did not return a value."""
    kind = "exception"


class CandidateGone(CandidateFailed):
    kind = "gone"


class CandidateBadValue(CandidateFailed, TypeError):
    kind = "wrong_answer"


_RAISED_TYPES = {}


def _raised(name, message):
    """The exception the candidate raised, re-created in the judge as a builtin exception type
    of that name (so a check that expects ValueError still sees one), marked CandidateFailed."""
    import builtins

    base = getattr(builtins, name, None) if isinstance(name, str) else None
    if not (isinstance(base, type) and issubclass(base, Exception)):
        base = Exception
    cls = _RAISED_TYPES.get(base)
    if cls is None:
        cls = _RAISED_TYPES[base] = (type("CandidateRaised", (CandidateFailed,), {}) if base is Exception
                                     else type(base.__name__, (base, CandidateFailed), {}))
    e = cls("%s: %s" % (name, message) if base is Exception else message)
    if name == "MemoryError":
        e.kind = "oom"
    return e


def make_candidate_proxy(entry_point, call_fd, reply_fd, deadline):
    """The judge's ``candidate``: a function that runs each call in the candidate's process."""
    replies = RawLines(reply_fd, MAX_CALL_BYTES)
    state = {"n": 0, "gone": None, "loaded": False, "kind": "gone"}

    def gone():
        e = CandidateGone(state["gone"])
        e.kind = state["kind"]
        return e

    def receive():
        try:
            line = replies.read(deadline)
        except TimeoutError:
            state["gone"], state["kind"] = "the candidate did not answer in time", "timeout"
            raise gone() from None
        except CodecError as e:
            state["gone"] = "the candidate's reply is unreadable (%s)" % e
            raise CandidateGone(state["gone"]) from None
        if line is None:
            state["gone"] = "the candidate's process exited"
            raise CandidateGone(state["gone"])
        try:
            rec = json.loads(line)
        except Exception:
            rec = None
        if type(rec) is not dict:
            state["gone"] = "the candidate's reply is not a JSON object"
            raise CandidateGone(state["gone"])
        return rec

    def candidate(*args, **kwargs):
        if state["gone"]:
            raise gone()
        if not state["loaded"]:
            hello = receive()
            if "load_error" in hello or hello.get("ready") is not True:
                state["gone"] = "load: %s" % str(hello.get("load_error", "no ready line"))[:EXCERPT]
                e = CandidateGone(state["gone"])
                e.kind = "oom" if hello.get("oom") is True else "exception"
                raise e
            state["loaded"] = True
        n = state["n"]
        state["n"] += 1
        try:
            payload = json.dumps({"n": n, "args": encode(list(args)), "kwargs": encode(kwargs)},
                                 separators=(",", ":"), allow_nan=False)
        except (CodecError, ValueError) as e:
            raise TypeError("the suite passes the candidate a value that cannot cross the sandbox "
                            "boundary: %s" % e) from None
        try:
            write_line_raw(call_fd, payload)
        except OSError:
            state["gone"] = "the candidate's process exited"
            raise CandidateGone(state["gone"]) from None
        rec = receive()
        if rec.get("n") != n:
            state["gone"] = "the candidate answered call %r where call %d was made" % (rec.get("n"), n)
            raise CandidateGone(state["gone"])
        if "ok" in rec:
            try:
                return decode(rec["ok"])
            except CodecError as e:
                raise CandidateBadValue("the candidate returned something that is not a plain value: %s" % e) \
                    from None
        if "exc" in rec and type(rec["exc"]) is list and len(rec["exc"]) == 2:
            raise _raised(rec["exc"][0], str(rec["exc"][1])[:EXCERPT])
        if "bad_type" in rec:
            raise CandidateBadValue("the candidate returned %s" % str(rec["bad_type"])[:EXCERPT])
        state["gone"] = "the candidate's reply to call %d is neither a value nor an exception" % n
        raise CandidateGone(state["gone"])

    candidate.__name__ = candidate.__qualname__ = entry_point
    return candidate


def write_line_raw(fd, text):
    view = memoryview((text + "\n").encode("utf-8"))
    while view:
        n = os.write(fd, view)
        view = view[n:]


def run_judge(cfg, msg, fds, setup_w):
    """The judge's process: the suite's trusted test code, ``candidate`` a proxy. Writes one
    line per check on descriptor 3: {"i", "ok": true} or {"i", "kind", "fail"}. Never returns."""
    _isolate(cfg, msg["timeout_s"], {0: fds["devnull"], 1: fds["devnull"], 2: fds["devnull"],
                                     3: fds["res_w"], CALL_FD: fds["call_w"], REPLY_FD: fds["reply_r"]},
             setup_w, cfg.get("judge_uid"), "/")
    os.close(SETUP_FD)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # a candidate that exits: EPIPE on the next call
    out = os.fdopen(3, "w", buffering=1)
    deadline = time.monotonic() + float(msg["timeout_s"])
    proxy = make_candidate_proxy(msg["entry_point"], CALL_FD, REPLY_FD, deadline)
    ns = {"__name__": "__judge__", "__builtins__": __builtins__}
    checks = msg["checks"]
    try:
        exec(compile(msg["setup"], "<suite test set-up>", "exec"), ns)
        setup_failed = None
    except BaseException as e:
        setup_failed = "the suite's test set-up failed: %s: %s" % (type(e).__name__, str(e)[:200])
    ns["candidate"] = proxy
    ns[msg["entry_point"]] = proxy
    for i, check in enumerate(checks):
        rec = {"i": i}
        if setup_failed:
            rec.update(kind="wrong_answer", fail=setup_failed)
        else:
            try:
                exec(compile(check, "<check %d>" % i, "exec"), ns)
                rec["ok"] = True
            except CandidateFailed as e:
                rec.update(kind=getattr(e, "kind", "exception"), fail=(type(e).__name__ + ": " + str(e))[:EXCERPT])
            except BaseException as e:  # an assert, or the check broke on what the candidate returned
                rec.update(kind="wrong_answer", fail=(type(e).__name__ + ": " + str(e))[:EXCERPT])
        out.write(json.dumps(rec) + "\n")
    out.flush()
    os._exit(0)


def _judge_suite(n_checks, judge_text, cand_status, judge_status, timed_out):
    """The verdict on an external-suite job from the judge's lines (trusted: the candidate
    cannot reach the judge's descriptors) and the candidate process's exit status."""
    passed, seen, first = 0, set(), {}
    for raw in judge_text.splitlines():
        try:
            rec = json.loads(raw)
        except Exception:
            continue
        i = rec.get("i") if isinstance(rec, dict) else None
        if type(i) is not int or not 0 <= i < n_checks or i in seen:
            continue
        seen.add(i)
        if rec.get("ok") is True:
            passed += 1
        else:
            first.setdefault(str(rec.get("kind")), "test %d: %s" % (i, str(rec.get("fail"))[:EXCERPT]))
    cand_sig = os.WTERMSIG(cand_status) if cand_status is not None and os.WIFSIGNALED(cand_status) else None
    if timed_out or "timeout" in first:
        outcome = "timeout"
    elif passed == n_checks and n_checks > 0:
        outcome = "pass"
    elif cand_sig is not None:
        outcome = "timeout" if cand_sig == signal.SIGXCPU else "killed"
        first.setdefault(outcome, "the candidate's process was killed by signal %d" % cand_sig)
    elif "oom" in first:
        outcome = "oom"
    elif "exception" in first or "gone" in first:
        outcome = "exception"
        first.setdefault("exception", first.get("gone", ""))
    elif len(seen) < n_checks and not first:
        judge_sig = os.WTERMSIG(judge_status) if judge_status is not None and os.WIFSIGNALED(judge_status) else None
        outcome = "timeout" if judge_sig == signal.SIGXCPU else "exception"
        first[outcome] = "the judge stopped after %d of %d checks (%s)" % (
            len(seen), n_checks, "signal %d" % judge_sig if judge_sig else "exited")
    else:
        outcome = "wrong_answer"
    detail = first.get(outcome) or next(iter(first.values()), "")
    return {"outcome": outcome, "tests_passed": passed, "tests_total": n_checks, "first_fail": detail}


# -- the zygote -------------------------------------------------------------------------

def zygote(cfg, cmd_r, evt_w, fd_sock):
    """Forks one child per request, relays its outputs and exit status to the runner."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reader = LineReader(cmd_r)
    while True:
        msg = reader.read()
        if msg is None:
            os._exit(0)
        if msg.get("suite"):
            _fork_suite_candidate(cfg, msg, cmd_r, evt_w, fd_sock)
            continue
        res_r, res_w = os.pipe()
        out_r, out_w = os.pipe()
        setup_r, setup_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            for fd in (res_r, out_r, setup_r, cmd_r, evt_w):
                os.close(fd)
            run_child(cfg, msg, res_w, out_w, setup_w)
        for fd in (res_w, out_w, setup_w):
            os.close(fd)
        write_line(evt_w, {"pid": pid, "pids": [pid]})
        # a workspace job's output: its head and its tail (pytest's summary comes last)
        keep = (WORKSPACE_HEAD_BYTES, WORKSPACE_TAIL_BYTES) if "workspace" in msg else MAX_CAPTURE_BYTES
        bufs, statuses = _drain([pid], {"result": (res_r, MAX_RESULT_BYTES), "output": (out_r, keep),
                                        "setup": (setup_r, MAX_CAPTURE_BYTES)})
        write_line(evt_w, {"status": statuses[0], **{k: v.decode("utf-8", "replace") for k, v in bufs.items()}})


def _fork_suite_candidate(cfg, msg, cmd_r, evt_w, fd_sock):
    """An external-suite job's candidate process. Its two pipe ends to the judge (calls in,
    replies out) arrive from the runner over ``fd_sock``; the zygote never sees the suite's
    test code, so no candidate (a fork of the zygote) can find it in its own memory."""
    _, (call_r, reply_w), _, _ = socket.recv_fds(fd_sock, 16, 2)
    out_r, out_w = os.pipe()
    setup_r, setup_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        for fd in (out_r, setup_r, cmd_r, evt_w, fd_sock.fileno()):
            os.close(fd)
        serve_candidate(cfg, msg, {"devnull": os.open(os.devnull, os.O_RDWR), "out_w": out_w,
                                   "reply_w": reply_w, "call_r": call_r}, setup_w)
    for fd in (call_r, reply_w, out_w, setup_w):
        os.close(fd)
    write_line(evt_w, {"pid": pid, "pids": [pid]})
    bufs, statuses = _drain([pid], {"output": (out_r, MAX_CAPTURE_BYTES), "setup": (setup_r, MAX_CAPTURE_BYTES)})
    write_line(evt_w, {"status": statuses[0], **{k: v.decode("utf-8", "replace") for k, v in bufs.items()}})


def _fork_judge(cfg, req, call_w, reply_r):
    """The judge of an external-suite job, forked by the runner (which holds the suite's test
    code; the candidate's zygote never does). Returns its pid and its result and set-up pipes."""
    res_r, res_w = os.pipe()
    setup_r, setup_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            signal.signal(signal.SIGPIPE, signal.SIG_IGN)
            msg = {"entry_point": req["entry_point"], "checks": [t["check"] for t in req["tests"]],
                   "setup": req["tests"][0].get("setup", ""), "timeout_s": float(req["timeout_s"])}
            run_judge(cfg, msg, {"devnull": os.open(os.devnull, os.O_RDWR), "res_w": res_w, "call_w": call_w,
                                 "reply_r": reply_r}, setup_w)
        finally:
            os._exit(3)
    os.close(res_w)
    os.close(setup_w)
    return pid, res_r, setup_r


def _drain(pids, pipes, deadline=None):
    """Read the children's pipes (name -> (fd, cap)) until every child has exited (a
    daemonised grandchild holding them open does not keep us waiting), or until
    ``deadline`` (then the statuses of the children still running are None). ``cap`` is the
    bytes kept from the start, or (head, tail): the first ``head`` and the last ``tail`` bytes."""
    names = {fd: name for name, (fd, _) in pipes.items()}
    bufs = {fd: bytearray() for fd in names}
    caps = {fd: cap if isinstance(cap, int) else cap[0] for fd, cap in pipes.values()}
    tails = {fd: (cap[1], bytearray(), [0]) for fd, cap in pipes.values() if not isinstance(cap, int)}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    statuses = [None] * len(pids)
    open_fds = set(bufs)
    while open_fds:
        if deadline is not None and time.monotonic() > deadline:
            break
        exited = all(st is not None for st in statuses)
        ready = sel.select(0.0 if exited else 0.02)
        for key, _ in ready:
            try:
                chunk = os.read(key.fd, 1 << 16)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(key.fd)
                open_fds.discard(key.fd)
                continue
            buf = bufs[key.fd]
            room = caps[key.fd] - len(buf)
            if room > 0:
                buf += chunk[:room]
            if key.fd in tails and len(chunk) > max(room, 0):
                keep, tail, dropped = tails[key.fd]
                tail += chunk[max(room, 0):]
                if len(tail) > keep:
                    dropped[0] += len(tail) - keep
                    del tail[:len(tail) - keep]
        if not exited:
            for k, pid in enumerate(pids):
                if statuses[k] is None:
                    done, st = os.waitpid(pid, os.WNOHANG)
                    if done:
                        statuses[k] = st
        elif not ready:
            break  # exited, and nothing more is readable: what is left belongs to a daemon
    sel.close()
    for k, pid in enumerate(pids):
        if statuses[k] is None and (deadline is None or time.monotonic() <= deadline):
            _, statuses[k] = os.waitpid(pid, 0)
    for fd in bufs:
        os.close(fd)
    for fd, (_, tail, dropped) in tails.items():
        if tail:
            bufs[fd] += (b"\n[... %d bytes ...]\n" % dropped[0] if dropped[0] else b"") + tail
    return {names[fd]: bytes(buf) for fd, buf in bufs.items()}, statuses


# -- the runner -------------------------------------------------------------------------

def _same(a, b):
    """JSON equality, floats within 1e-9, bools never equal to numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) or (a != a and b != b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def _procs_of(uids):
    """The pids of every process whose real uid is in ``uids``: one pass over /proc."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name) as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) in uids:
                            pids.append(int(name))
                        break
        except OSError:
            continue
    return pids


def _kill_everything(cfg, pids):
    for pid in pids:
        try:
            os.killpg(pid, signal.SIGKILL)
        except OSError:
            pass
    uids = [u for u in (cfg.get("drop_uid"), cfg.get("judge_uid")) if u is not None]
    if not uids:
        return 0
    # A task may have left a daemon in another session, or be a fork bomb: sweep the uids.
    for _ in range(200):
        pids = _procs_of(uids)
        if not pids:
            return 0
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)
    return len(_procs_of(uids))


def _listing(fd):
    """(name, is a directory) of every entry of the open directory ``fd``: one getdents pass, the
    types from it (no stat per entry), taken whole before anything is removed."""
    try:
        with os.scandir(fd) as it:
            out = []
            for e in it:
                try:
                    out.append((e.name, e.is_dir(follow_symlinks=False)))
                except OSError:
                    out.append((e.name, False))
            return out
    except OSError:
        return []


def _empty_dir(root):
    """Remove everything below ``root``, whatever the modes (a directory made 000 or 0500 by
    its owner is made 0700 first) and however deep (descriptor-relative, no recursion). An
    empty directory costs one rmdir (a task that leaves 180,000 of them is common enough)."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    stack = [(top, None, None, iter(_listing(top)))]
    seen = set()
    while stack:
        fd, parent, name, entries = stack[-1]
        descended = False
        for entry, is_dir in entries:
            if not is_dir:
                try:
                    os.unlink(entry, dir_fd=fd)
                except IsADirectoryError:  # replaced by a directory since listed: taken below
                    pass
                except OSError:
                    continue
                else:
                    continue
            try:
                os.rmdir(entry, dir_fd=fd)
                continue
            except OSError:
                pass  # not empty, or not writable: opened and emptied first
            try:
                st = os.lstat(entry, dir_fd=fd)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            try:
                os.chmod(entry, 0o700, dir_fd=fd, follow_symlinks=True)
                child = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                continue
            stack.append((child, fd, entry, iter(_listing(child))))
            descended = True
            break
        if descended:
            continue
        stack.pop()
        os.close(fd)
        if parent is not None:
            try:
                os.rmdir(name, dir_fd=parent)
            except OSError:
                pass


CLEAN_TIMEOUT_S = 10.0  # the clean-up's own limit; the host's answer_within_s lowers it (see _serve)


def _clean_workroot(cfg, clean_by=None):
    """Empty the work root; returns what is left in it (nothing, normally). With a dedicated
    uid the files belong to it, and the runner has no CAP_DAC_OVERRIDE: remove them in a
    forked process running as that uid, killed at ``clean_by`` (monotonic) or after
    CLEAN_TIMEOUT_S, whichever comes first: what it did not remove is left, and the runner
    answers "dirty" (replaced by the host) instead of answering late."""
    root, uid = cfg["workroot"], cfg.get("drop_uid")
    if not os.listdir(root):
        return []
    if uid is None:
        _empty_dir(root)
        return sorted(os.listdir(root))
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            _empty_dir(root)
        finally:
            os._exit(0)
    deadline = time.monotonic() + CLEAN_TIMEOUT_S
    if clean_by is not None:
        deadline = min(deadline, clean_by)
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.002)
    return sorted(os.listdir(root))


def _ipc_left():
    """SysV IPC objects and POSIX message queues that exist in this IPC namespace (the
    container's sysctls make them impossible to create; this checks that they are none)."""
    left = []
    for kind in ("shm", "msg", "sem"):
        try:
            with open("/proc/sysvipc/" + kind) as fh:
                n = sum(1 for _ in fh) - 1
        except OSError:
            continue
        if n > 0:
            left.append("%d SysV %s" % (n, kind))
    try:
        queues = os.listdir("/dev/mqueue")
    except OSError:
        queues = []
    if queues:
        left.append("%d POSIX message queues" % len(queues))
    return left


def _judge_line(rec, expected, total, seen, first):
    """One output line of the child: 1 if it is a passing test not seen before, else 0."""
    if "load_error" in rec:
        first.setdefault("oom" if rec.get("oom") is True else "exception",
                         "load: " + str(rec["load_error"])[:EXCERPT])
        return 0
    i = rec.get("i")
    if type(i) is not int or not 0 <= i < total or i in seen:
        return 0
    seen.add(i)
    if "out" in rec and _same(rec["out"], expected[i]):
        return 1
    if rec.get("oom") is True:
        first.setdefault("oom", "test %d: MemoryError" % i)
    elif "exc" in rec:
        first.setdefault("exception", "test %d: %s" % (i, str(rec["exc"])[:EXCERPT]))
    else:
        detail = rec.get("bad_type") or "returned %s" % json.dumps(rec.get("out"))[:120]
        first.setdefault("wrong_answer", "test %d: %s" % (i, str(detail)[:EXCERPT]))
    return 0


def _judge(tests, result_text, status, timed_out):
    """The verdict on a child's output lines: outcome, tests passed, and the first failure
    of the kind that decided the outcome (for the excerpt)."""
    expected = [t["expected"] for t in tests]
    total, passed, seen, first = len(expected), 0, set(), {}
    for raw in result_text.splitlines():
        try:  # whatever the bytes (deeply nested JSON included): a bad line counts for nothing
            rec = json.loads(raw)
        except Exception:
            continue
        if not isinstance(rec, dict):
            continue
        try:
            passed += _judge_line(rec, expected, total, seen, first)
        except Exception:
            continue
    if timed_out:
        outcome = "timeout"
    elif os.WIFSIGNALED(status) and len(seen) < total:
        sig = os.WTERMSIG(status)
        outcome = "timeout" if sig == signal.SIGXCPU else "killed"
        first.setdefault(outcome, "killed by signal %d" % sig)
    elif passed == total and total > 0:
        outcome = "pass"
    elif "oom" in first:
        outcome = "oom"
    elif "exception" in first:
        outcome = "exception"
    elif len(seen) < total and not first:
        outcome = "exception"
        first["exception"] = "the process exited (status %d) after %d of %d tests" % (
            os.WEXITSTATUS(status) if os.WIFEXITED(status) else -1, len(seen), total)
    else:
        outcome = "wrong_answer"
    detail = first.get(outcome) or next(iter(first.values()), "")
    return {"outcome": outcome, "tests_passed": passed, "tests_total": total, "first_fail": detail}


def _config(argv):
    """The runner's settings (JSON in argv[1]) with their defaults; no uid to drop to unless root."""
    cfg = json.loads(argv[1]) if len(argv) > 1 else {}
    cfg.setdefault("workroot", "/tmp")
    cfg.setdefault("memory_bytes", 384 << 20)
    cfg.setdefault("nproc", 64)  # null: no per-uid limit (the Docker backend: its pids cgroup is the limit)
    # seconds past a request's timeout by which the answer is written (the host's answer_grace_s
    # less its margin): the clean-up stops there
    cfg.setdefault("answer_within_s", CLEAN_TIMEOUT_S)
    cfg.setdefault("drop_uid", 65534 if os.geteuid() == 0 else None)
    if cfg["drop_uid"] is not None and os.geteuid() != 0:
        cfg["drop_uid"] = None
    # an external suite's judge runs as a uid of its own: the candidate cannot signal, trace or
    # read it
    cfg.setdefault("judge_uid", None if cfg["drop_uid"] is None else cfg["drop_uid"] - 1)
    if cfg["drop_uid"] is None:
        cfg["judge_uid"] = None
    return cfg


class _Channels:
    """The runner's ends: the host's requests and the answers to it, the zygote's commands and
    events, the socket that passes a suite job's pipe ends, and the zygote's pid."""

    def __init__(self, proto_in, proto_out, cmd_w, evt_r, fd_runner, zpid):
        self.requests, self.proto_out, self.cmd_w = LineReader(proto_in), proto_out, cmd_w
        self.events, self.fd_runner, self.zpid = LineReader(evt_r), fd_runner, zpid


def _start(cfg):
    """Moves the answer channel off fds 0 and 1 (private copies; 0 and 1 point at /dev/null) and
    forks the zygote, which never returns here."""
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    cmd_r, cmd_w = os.pipe()
    evt_r, evt_w = os.pipe()
    fd_runner, fd_zygote = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)  # pipe ends for suite jobs
    zpid = os.fork()
    if zpid == 0:
        os.close(proto_in)
        os.close(proto_out)
        os.close(cmd_w)
        os.close(evt_r)
        fd_runner.close()
        zygote(cfg, cmd_r, evt_w, fd_zygote)
    os.close(cmd_r)
    os.close(evt_w)
    fd_zygote.close()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return _Channels(proto_in, proto_out, cmd_w, evt_r, fd_runner, zpid)


def _start_task(cfg, ch, req, suite, timeout_s):
    """Hands the task to the zygote (a suite job: the candidate's code and its pipe ends only, and a
    judge forked here with the test code). (the zygote's "started" event, the judge), the event
    None when the zygote is gone."""
    judge = None
    try:
        if suite:  # an external suite's job: [{"check": statement, "setup": source}, ...]
            call_r, call_w = os.pipe()
            reply_r, reply_w = os.pipe()
            # the zygote gets the candidate's code and its pipe ends, never the test code
            write_line(ch.cmd_w, {"suite": True, "code": req["code"], "entry_point": req["entry_point"],
                                  "timeout_s": timeout_s})
            socket.send_fds(ch.fd_runner, [b"f"], [call_r, reply_w])
            os.close(call_r)
            os.close(reply_w)
            judge = _fork_judge(cfg, req, call_w, reply_r)
            os.close(call_w)
            os.close(reply_r)
        elif suite is None:  # a workspace job: [{"command", "code_file", "files"}]
            write_line(ch.cmd_w, {"code": req["code"], "workspace": req["tests"][0], "timeout_s": timeout_s})
        else:
            write_line(ch.cmd_w, {"code": req["code"], "entry_point": req["entry_point"],
                                  "args_list": [t["args"] for t in req["tests"]], "timeout_s": timeout_s})
        return ch.events.read(timeout=10.0), judge
    except (OSError, TimeoutError):
        return None, judge


def _await_judge(cfg, judge, pids, deadline):
    """The judge decides; the candidate exits when the judge's end of the call pipe closes. A judge
    past the deadline is killed with everything else. (pids, what the judge said, timed out)."""
    jpid, jres_r, jsetup_r = judge
    pids = pids + [jpid]
    bufs, (jstatus,) = _drain([jpid], {"result": (jres_r, MAX_RESULT_BYTES), "setup": (jsetup_r, MAX_CAPTURE_BYTES)},
                              deadline=deadline)
    timed_out = False
    if jstatus is None:
        timed_out = True
        _kill_everything(cfg, pids)
        _, jstatus = os.waitpid(jpid, 0)
    judged = {"result": bufs["result"].decode("utf-8", "replace"), "judge_status": jstatus,
              "judge_setup": bufs["setup"].decode("utf-8", "replace")}
    return pids, judged, timed_out


def _await_task(cfg, events, judged, timed_out, pids, timeout_s):
    """The zygote's "done" event for the task: (event, timed out). A task past its time is killed
    (a candidate still running after its judge is stopped, not blamed); the event is None when the
    zygote died with the task."""
    try:
        done = events.read(timeout=timeout_s if judged is None else (10.0 if timed_out else 1.0))
    except TimeoutError:
        if judged is None:
            timed_out = True
        else:  # judged already; a candidate still running after it is stopped, not blamed
            judged["candidate_stopped"] = True
        _kill_everything(cfg, pids)
        try:
            done = events.read(timeout=10.0)
        except TimeoutError:
            done = None
    return done, timed_out


def _sweep(cfg, pids, clean_by=None):
    """Kills what is left of the task and empties the work folder (until ``clean_by``). Anything
    the task leaves that the next task could see makes this runner unfit for another task: the
    reasons why (the host replaces the runner after taking this answer)."""
    left = _kill_everything(cfg, pids)
    files_left = _clean_workroot(cfg, clean_by)
    dirty = []
    if left:
        dirty.append("%d processes survived the sweep" % left)
    if files_left:
        dirty.append("%d entries left in %s (%s)" % (len(files_left), cfg["workroot"],
                                                    ", ".join(files_left[:3])[:100]))
    if cfg.get("drop_uid") is not None:
        dirty += _ipc_left()
    return dirty


def _reply(req, suite, done, judged, timed_out, runtime, dirty):
    """The answer to the host: the verdict, or an infra_error when the child's set-up failed."""
    tests = req["tests"]
    if judged is not None:
        done["setup"] = (done.get("setup", "") + judged["judge_setup"]).strip()
        done["result"], done["judge_status"] = judged["result"], judged["judge_status"]
        if judged.get("candidate_stopped"):
            done["status"] = None
    if done.get("setup"):  # written before the candidate's code ran: the sandbox's failure
        return {"id": req.get("id"), "infra_error": "sandbox child set-up failed: " + done["setup"][:EXCERPT],
                "dirty": "; ".join(dirty)}
    if suite is None:  # a workspace job: its exit status; its failures and the output's tail for humans
        verdict = _judge_workspace(done["output"], done["status"], timed_out)
        output = verdict.pop("first_fail")
        failures = _failure_lines(done["output"])
        tail = " ".join(done["output"].split())[-(EXCERPT // 2):]  # one line
        output += (" | " + failures) if failures else (" | output: ..." + tail) if tail else ""
    elif suite:
        verdict = _judge_suite(len(tests), done["result"], done["status"], done.get("judge_status"), timed_out)
        output = verdict.pop("first_fail")
    else:
        verdict = _judge(tests, done["result"], done["status"], timed_out)
        output = verdict.pop("first_fail")
    if done["output"] and suite is not None:
        output = (output + " | output: " if output else "output: ") + done["output"]
    verdict.update({"id": req.get("id"), "runtime_s": runtime, "output": output[:EXCERPT]})
    if dirty:
        verdict["dirty"] = "; ".join(dirty)
    return verdict


def _serve(cfg, ch, req):
    """One task, start to answer: (the answer, whether this runner can take another task)."""
    tests, timeout_s = req["tests"], float(req["timeout_s"])
    suite = bool(tests) and all(isinstance(t, dict) and "check" in t for t in tests)
    if len(tests) == 1 and isinstance(tests[0], dict) and "command" in tests[0]:
        suite = None  # a workspace job (SAGE's tests): None is neither a suite's nor a plain job
        problem = workspace_problem(tests[0])
        if problem or not isinstance(req.get("code"), str):
            return {"id": req.get("id"), "infra_error": "a malformed workspace job: %s" % (problem or "no code")}, True
    t0 = time.monotonic()
    started, judge = _start_task(cfg, ch, req, suite, timeout_s)
    if started is None:  # the zygote is gone: nothing more can run in this runner
        return {"id": req.get("id"), "infra_error": "the sandbox zygote died"}, False
    pids, judged, timed_out = started["pids"], None, False
    if judge is not None:
        pids, judged, timed_out = _await_judge(cfg, judge, pids, t0 + timeout_s)
    done, timed_out = _await_task(cfg, ch.events, judged, timed_out, pids, timeout_s)
    runtime = time.monotonic() - t0
    if done is None:  # the zygote died with the task (a task that kills its parent)
        return {"id": req.get("id"), "outcome": "killed", "tests_passed": 0, "tests_total": len(tests),
                "runtime_s": runtime, "output": "the task killed the sandbox's process supervisor",
                "dirty": "the runner exits: its zygote is gone"}, False
    # The answer is due by the task's timeout plus answer_within_s (the host waits its grace, which
    # is longer by a stated margin): a clean-up still running then is cut short (answer "dirty").
    clean_by = t0 + timeout_s + float(cfg["answer_within_s"])
    return _reply(req, suite, done, judged, timed_out, runtime, _sweep(cfg, pids, clean_by)), True


def _preload():
    """Import PRELOAD, then freeze the garbage collector's view of everything loaded so far: the
    forked children never scan (and so never copy) the inherited objects' pages."""
    import gc
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            pass  # a smaller image: the task imports it itself, as before
    gc.freeze()


def main(argv):
    cfg = _config(argv)
    _preload()
    ch = _start(cfg)
    write_line(ch.proto_out, {"ready": True, "python": sys.version.split()[0], "pid": os.getpid(),
                              "isolated_uid": cfg["drop_uid"], "zygote": ch.zpid})
    while True:
        req = ch.requests.read()
        if req is None:
            break
        if req.get("ping"):
            write_line(ch.proto_out, {"id": req.get("id"), "pong": True})
            continue
        answer, more = _serve(cfg, ch, req)
        write_line(ch.proto_out, answer)
        if not more:
            break
    try:
        os.close(ch.cmd_w)
        os.waitpid(ch.zpid, 0)
    except OSError as e:
        if e.errno != errno.ECHILD:
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
