"""Issue 15, red-team findings 5-7, against the real Docker sandbox: an infrastructure failure
(a container killed from outside, a runner that answers nonsense) is a SandboxError, never a
verdict and never cached; the host trusts no reply it did not ask for; code the project did
not write never runs unisolated. Each attack is followed by a probe that the next normal task
runs and passes."""

from __future__ import annotations

import subprocess
import textwrap
import threading
import time
import uuid

import pytest

from sage_pipeline.defs.resources import SandboxResource
from sage_pipeline.sim import sandbox as sandbox_mod
from sage_pipeline.sim.cache import ExecutionCache, execute_cached
from sage_pipeline.sim.sandbox import SandboxConfig, SandboxError, open_sandbox
from sage_pipeline.sim.schema import ExecJob

TESTS = [{"args": [3], "expected": 6}, {"args": [0], "expected": 0}, {"args": [-2], "expected": -4}]
GOOD = ExecJob("def f(x):\n    return 2 * x\n", "f", TESTS, 2.0)


def _labelled(label: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=sage.sandbox={label}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


# -- 5: infrastructure failures are not task failures -----------------------------------------

def test_a_container_killed_from_outside_twice_is_an_infrastructure_error_never_cached(docker_ready, tmp_path):
    # A correct task; its container is killed from outside (`docker kill`) while it runs, and
    # the fresh one too. Docker says why (a kill event, exit 137, not OOM): not the task's doing.
    slow = ExecJob("import time\ndef f(x):\n    time.sleep(1.5)\n    return 2 * x\n", "f", TESTS[:1], 6.0)
    label = f"test-{uuid.uuid4().hex[:8]}"
    with open_sandbox("docker", workers=1, label=label, answer_grace_s=5.0) as sb:
        killed: list[str] = []
        done = threading.Event()

        def killer():
            while not done.is_set() and len(killed) < 2:
                w = sb.workers[0]
                name = w.name
                if w.served >= 1 and name not in killed:
                    time.sleep(0.4)  # the task is running now
                    subprocess.run(["docker", "kill", name], capture_output=True)
                    killed.append(name)
                time.sleep(0.02)

        t = threading.Thread(target=killer, daemon=True)
        t.start()
        cache = ExecutionCache(tmp_path / "cache")
        try:
            with pytest.raises(SandboxError, match="killed from outside"):
                execute_cached(sb.run, "docker", cache, [slow])
        finally:
            done.set()
            t.join(timeout=10)
        assert len(killed) == 2
        assert len(ExecutionCache(tmp_path / "cache")) == 0  # nothing cached for the task
        # the pool goes on: the next tasks run on a fresh container and pass
        assert [r.outcome for r in sb.run([GOOD, slow])] == ["pass", "pass"]
    assert _labelled(label) == []


def test_a_container_killed_once_is_replaced_and_the_task_passes(docker_ready):
    slow = ExecJob("import time\ndef f(x):\n    time.sleep(1.0)\n    return 2 * x\n", "f", TESTS[:1], 6.0)
    with open_sandbox("docker", workers=1, answer_grace_s=5.0) as sb:
        name = sb.workers[0].name

        def kill_once():
            while sb.workers[0].served < 1:
                time.sleep(0.01)
            time.sleep(0.3)
            subprocess.run(["docker", "kill", name], capture_output=True)

        t = threading.Thread(target=kill_once, daemon=True)
        t.start()
        r = sb.run([slow])[0]
        t.join(timeout=10)
        assert r.outcome == "pass", r
        assert sb.stats["replaced_dead"] == 1 and sb.workers[0].name != name


# -- 6: the host trusts no reply it did not ask for -------------------------------------------

# A runner answering as a compromised or broken one would (simulated: no task can reach the
# answer channel, see test_sandbox_security.py): the host must not score what it says.
BAD_RUNNER = textwrap.dedent('''
    import json, os, sys
    MODE = {mode!r}
    os.write(1, b'{{"ready": true}}\\n')
    for line in sys.stdin:
        req = json.loads(line)
        n = len(req["tests"])
        ans = {{"id": req["id"], "outcome": "pass", "tests_passed": n, "tests_total": n, "runtime_s": 0.0,
               "output": ""}}
        if MODE == "wrong_id":
            ans["id"] = req["id"] + 1
        elif MODE == "too_many_passed":
            ans["tests_passed"] = ans["tests_total"] = n + 5
        elif MODE == "passed_over_total":
            ans["tests_passed"] = n + 1
        elif MODE == "missing_fields":
            ans = {{"id": req["id"], "outcome": "pass"}}
        elif MODE == "not_json":
            os.write(1, b"this is not json\\n")
            continue
        elif MODE == "huge":
            chunk = b"x" * (1 << 20)
            for _ in range(300):
                os.write(1, chunk)
            os.write(1, b"\\n")
            continue
        os.write(1, (json.dumps(ans) + "\\n").encode())
''')


@pytest.mark.parametrize("mode", ["wrong_id", "too_many_passed", "passed_over_total", "missing_fields",
                                  "not_json", "huge"])
def test_a_reply_that_is_not_an_answer_to_the_request_is_an_infrastructure_error(docker_ready, monkeypatch,
                                                                                  mode):
    monkeypatch.setattr(sandbox_mod, "RUNNER_SOURCE", BAD_RUNNER.format(mode=mode))
    with open_sandbox("docker", workers=1, answer_grace_s=5.0) as sb:
        t0 = time.monotonic()
        with pytest.raises(SandboxError, match="failed twice.*bad reply"):
            sb.run([GOOD])
        assert time.monotonic() - t0 < 15  # a 300 MB reply is cut at 1 MiB, not read (18 s before)
        assert sb.stats["replaced_bad_reply"] == 2
    # the real runner again: a normal task passes
    monkeypatch.undo()
    with open_sandbox("docker", workers=1) as sb:
        assert sb.run([GOOD])[0].outcome == "pass"


# -- 7: 'auto' never runs untrusted code unisolated -------------------------------------------

def test_auto_never_runs_untrusted_code_unisolated(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    res = SandboxResource(backend="auto")
    assert res.resolve_backend() == "local"  # the project's own generated tasks: allowed, with a warning
    with pytest.raises(SandboxError, match="never runs in the unisolated local backend"):
        res.open(untrusted=True)
    with pytest.raises(SandboxError, match="UNISOLATED.*Docker only|runs only in the Docker backend"):
        SandboxConfig(backend="local", untrusted=True)
    with pytest.raises(SandboxError, match="UNISOLATED"):
        with SandboxResource(backend="local").open(untrusted=True):
            pass


# -- the SDK lifecycle ------------------------------------------------------------------------

def test_a_host_killed_with_sigkill_leaves_no_container(docker_ready, tmp_path):
    # No handler runs on SIGKILL: the attach stream closes, the runner reads EOF on stdin
    # (attached once) and exits, and auto_remove deletes the container.
    import signal
    import sys

    label = f"test-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "killed.py"
    script.write_text(textwrap.dedent(f"""
        import time
        from sage_pipeline.sim.sandbox import open_sandbox
        with open_sandbox("docker", workers=2, label={label!r}) as sb:
            print("started", flush=True)
            time.sleep(120)
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    assert len(_labelled(label)) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 20
    while _labelled(label) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _labelled(label) == []
