"""The sandbox runner: a small standard-library program that executes candidate solutions.

It runs inside the sandbox container (Docker backend) or as a local subprocess (local
backend), started as ``python3 -I -u -c <this file's source> <config json>``, so the image
needs nothing but python3. Protocol with the host: JSON lines. The runner first writes
``{"ready": ...}``; then for each request line
``{"id", "code", "entry_point", "tests": [{"args", "expected"}], "timeout_s"}`` it writes one
answer line ``{"id", "outcome", "tests_passed", "tests_total", "runtime_s", "output"}``.

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
before the next task. A wall-clock timeout kills a hanging candidate.

Python 3.9+, standard library only: this file is executed inside the sandbox image.
"""

import errno
import fcntl
import json
import math
import os
import resource
import selectors
import signal
import stat
import sys
import time

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
    def __init__(self, fd):
        self.fd, self.buf = fd, b""

    def read(self, timeout=None):
        """The next line as an object; None at EOF; raises TimeoutError past ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self.buf:
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError
                sel = selectors.DefaultSelector()
                sel.register(self.fd, selectors.EVENT_READ)
                ready = sel.select(left)
                sel.close()
                if not ready:
                    raise TimeoutError
            chunk = os.read(self.fd, 1 << 16)
            if not chunk:
                return None
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return json.loads(line)


# -- the child ---------------------------------------------------------------------------

def _limits(cfg, timeout_s):
    mem = int(cfg["memory_bytes"])
    cpu = int(math.ceil(timeout_s)) + 1
    limits = [(resource.RLIMIT_AS, mem), (resource.RLIMIT_CPU, cpu), (resource.RLIMIT_CORE, 0),
              (resource.RLIMIT_FSIZE, 16 << 20), (resource.RLIMIT_NOFILE, 64)]
    if cfg.get("drop_uid") is not None:
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
    except BaseException as e:  # the sandbox could not be set up: an infrastructure error
        try:
            os.write(channel, (json.dumps({"setup_error": repr(e)[:EXCERPT]}) + "\n").encode())
        finally:
            os._exit(3)
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


# -- the zygote -------------------------------------------------------------------------

def zygote(cfg, cmd_r, evt_w):
    """Forks one child per request, relays its outputs and exit status to the runner."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    reader = LineReader(cmd_r)
    while True:
        msg = reader.read()
        if msg is None:
            os._exit(0)
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
        write_line(evt_w, {"pid": pid})
        result, output, setup, status = _drain(pid, res_r, out_r, setup_r)
        write_line(evt_w, {"status": status, "result": result.decode("utf-8", "replace"),
                           "output": output.decode("utf-8", "replace"),
                           "setup": setup.decode("utf-8", "replace")})


def _drain(pid, res_r, out_r, setup_r):
    """Read the child's pipes until it has exited (a daemonised grandchild holding them
    open does not keep us waiting)."""
    bufs = {res_r: bytearray(), out_r: bytearray(), setup_r: bytearray()}
    caps = {res_r: MAX_RESULT_BYTES, out_r: MAX_CAPTURE_BYTES, setup_r: MAX_CAPTURE_BYTES}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    status, open_fds = None, set(bufs)
    while open_fds:
        ready = sel.select(0.02 if status is None else 0.0)
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
            if len(buf) < caps[key.fd]:
                buf += chunk[: caps[key.fd] - len(buf)]
        if status is None:
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
        elif not ready:
            break  # exited, and nothing more is readable: what is left belongs to a daemon
    sel.close()
    if status is None:
        _, status = os.waitpid(pid, 0)
    for fd in bufs:
        os.close(fd)
    return bytes(bufs[res_r]), bytes(bufs[out_r]), bytes(bufs[setup_r]), status


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


def _procs_of(uid):
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/status" % name) as fh:
                for line in fh:
                    if line.startswith("Uid:"):
                        if int(line.split()[1]) == uid:
                            pids.append(int(name))
                        break
        except OSError:
            continue
    return pids


def _kill_everything(cfg, pid):
    try:
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    uid = cfg.get("drop_uid")
    if uid is None:
        return 0
    # A task may have left a daemon in another session, or be a fork bomb: sweep the uid.
    for _ in range(200):
        pids = _procs_of(uid)
        if not pids:
            return 0
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.002)
    return len(_procs_of(uid))


def _empty_dir(root):
    """Remove everything below ``root``, whatever the modes (a directory made 000 or 0500 by
    its owner is made 0700 first) and however deep (descriptor-relative, no recursion)."""
    top = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    stack = [(top, None, None, iter(os.listdir(top)))]
    seen = set()
    while stack:
        fd, parent, name, entries = stack[-1]
        descended = False
        for entry in entries:
            try:
                st = os.lstat(entry, dir_fd=fd)
            except OSError:
                continue
            if not stat.S_ISDIR(st.st_mode):
                try:
                    os.unlink(entry, dir_fd=fd)
                except OSError:
                    pass
                continue
            if (st.st_dev, st.st_ino) in seen:
                continue
            seen.add((st.st_dev, st.st_ino))
            try:
                os.chmod(entry, 0o700, dir_fd=fd, follow_symlinks=True)
                child = os.open(entry, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError:
                continue
            try:
                listing = iter(os.listdir(child))
            except OSError:
                listing = iter(())
            stack.append((child, fd, entry, listing))
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


CLEAN_TIMEOUT_S = 10.0


def _clean_workroot(cfg):
    """Empty the work root; returns what is left in it (nothing, normally). With a dedicated
    uid the files belong to it, and the runner has no CAP_DAC_OVERRIDE: remove them in a
    forked process running as that uid (killed if it takes longer than CLEAN_TIMEOUT_S)."""
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


def main(argv):
    cfg = json.loads(argv[1]) if len(argv) > 1 else {}
    cfg.setdefault("workroot", "/tmp")
    cfg.setdefault("memory_bytes", 384 << 20)
    cfg.setdefault("nproc", 64)
    cfg.setdefault("drop_uid", 65534 if os.geteuid() == 0 else None)
    if cfg["drop_uid"] is not None and os.geteuid() != 0:
        cfg["drop_uid"] = None
    # The answer channel: private, close-on-exec copies; 0 and 1 point at /dev/null.
    proto_in, proto_out = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.dup2(devnull, 1)
    cmd_r, cmd_w = os.pipe()
    evt_r, evt_w = os.pipe()
    zpid = os.fork()
    if zpid == 0:
        os.close(proto_in)
        os.close(proto_out)
        os.close(cmd_w)
        os.close(evt_r)
        zygote(cfg, cmd_r, evt_w)
    os.close(cmd_r)
    os.close(evt_w)
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    write_line(proto_out, {"ready": True, "python": sys.version.split()[0], "pid": os.getpid(),
                           "isolated_uid": cfg["drop_uid"], "zygote": zpid})
    requests, events = LineReader(proto_in), LineReader(evt_r)
    while True:
        req = requests.read()
        if req is None:
            break
        if req.get("ping"):
            write_line(proto_out, {"id": req.get("id"), "pong": True})
            continue
        tests, timeout_s = req["tests"], float(req["timeout_s"])
        t0 = time.monotonic()
        try:
            write_line(cmd_w, {"code": req["code"], "entry_point": req["entry_point"],
                               "args_list": [t["args"] for t in tests], "timeout_s": timeout_s})
            started = events.read(timeout=10.0)
        except (OSError, TimeoutError):
            started = None
        if started is None:  # the zygote is gone: nothing more can run in this runner
            write_line(proto_out, {"id": req.get("id"), "infra_error": "the sandbox zygote died"})
            break
        pid, timed_out = started["pid"], False
        try:
            done = events.read(timeout=timeout_s)
        except TimeoutError:
            timed_out = True
            _kill_everything(cfg, pid)
            try:
                done = events.read(timeout=10.0)
            except TimeoutError:
                done = None
        runtime = time.monotonic() - t0
        if done is None:  # the zygote died with the task (a task that kills its parent)
            write_line(proto_out, {"id": req.get("id"), "outcome": "killed", "tests_passed": 0,
                                   "tests_total": len(tests), "runtime_s": runtime,
                                   "output": "the task killed the sandbox's process supervisor"})
            break
        left = _kill_everything(cfg, pid)
        files_left = _clean_workroot(cfg)
        # Anything the task leaves that the next task could see makes this runner unfit for
        # another task: the host replaces it after taking this answer.
        dirty = []
        if left:
            dirty.append("%d processes survived the sweep" % left)
        if files_left:
            dirty.append("%d entries left in %s (%s)" % (len(files_left), cfg["workroot"],
                                                        ", ".join(files_left[:3])[:100]))
        if cfg.get("drop_uid") is not None:
            dirty += _ipc_left()
        if done.get("setup"):  # written before the candidate's code ran: the sandbox's failure
            write_line(proto_out, {"id": req.get("id"), "infra_error": "sandbox child set-up failed: "
                                   + done["setup"][:EXCERPT], "dirty": "; ".join(dirty)})
            continue
        verdict = _judge(tests, done["result"], done["status"], timed_out)
        output = verdict.pop("first_fail")
        if done["output"]:
            output = (output + " | output: " if output else "output: ") + done["output"]
        verdict.update({"id": req.get("id"), "runtime_s": runtime, "output": output[:EXCERPT]})
        if dirty:
            verdict["dirty"] = "; ".join(dirty)
        write_line(proto_out, verdict)
    try:
        os.close(cmd_w)
        os.waitpid(zpid, 0)
    except OSError as e:
        if e.errno != errno.ECHILD:
            raise
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
