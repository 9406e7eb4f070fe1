"""Security tests against the real Docker sandbox: each attack is contained, recorded with
the right outcome kind, and the next task runs normally in the same warm container."""

from __future__ import annotations

import textwrap

import pytest

from sage_pipeline.sim.schema import ExecJob

TESTS = [{"args": [3], "expected": 6}, {"args": [0], "expected": 0}, {"args": [-2], "expected": -4}]
GOOD = ExecJob("def f(x):\n    return 2 * x\n", "f", TESTS, 2.0)

# A probe run after each attack: how many processes of the task uid exist besides itself,
# and what is left in /tmp. A contained attack leaves nothing behind.
PROBE = ExecJob(textwrap.dedent("""
    import os
    def f(x):
        me = os.getpid()
        others = []
        for p in os.listdir('/proc'):
            if p.isdigit() and int(p) != me:
                try:
                    with open('/proc/%s/status' % p) as fh:
                        uid = [l for l in fh if l.startswith('Uid:')][0].split()[1]
                except OSError:
                    continue
                if uid == '65534':
                    others.append(p)
        leftovers = sorted(os.listdir('/tmp'))
        return [len(others), leftovers, os.getuid()]
"""), "f", [{"args": [0], "expected": [0, [], 65534]}], 5.0)


def code(src: str) -> str:
    return textwrap.dedent(src).lstrip()


def run_then_probe(sb, job: ExecJob):
    attack, probe, good = sb.run([job, PROBE, GOOD])
    assert probe.outcome == "pass", f"the attack left something behind: {probe}"
    assert good.outcome == "pass", f"the next task did not run normally: {good}"
    return attack


def attack(src: str, timeout_s: float = 1.0) -> ExecJob:
    return ExecJob(code(src), "f", TESTS, timeout_s)


def test_the_probe_and_a_good_task_pass(docker_sandbox):
    assert [r.outcome for r in docker_sandbox.run([GOOD, PROBE])] == ["pass", "pass"]


def test_infinite_loop_is_a_timeout(docker_sandbox):
    r = run_then_probe(docker_sandbox, attack("def f(x):\n    while True:\n        pass\n", timeout_s=0.5))
    assert r.outcome == "timeout" and r.tests_passed == 0
    assert 0.5 <= r.runtime_s < 3.0


def test_fork_bomb_is_contained(docker_sandbox):
    r = run_then_probe(docker_sandbox, attack("""
        import os
        def f(x):
            while True:
                try:
                    os.fork()
                except OSError:
                    pass
    """))
    assert r.outcome in ("timeout", "exception"), r


def test_thread_bomb_is_contained(docker_sandbox):
    r = run_then_probe(docker_sandbox, attack("""
        import threading, time
        def f(x):
            while True:
                threading.Thread(target=time.sleep, args=(100,), daemon=True).start()
    """))
    assert r.outcome in ("exception", "timeout"), r
    if r.outcome == "exception":
        assert "thread" in r.output_excerpt.lower()


@pytest.mark.parametrize("src", [
    "def f(x):\n    return len(bytearray(4 << 30))\n",
    "def f(x):\n    xs = []\n    while True:\n        xs.append(' ' * (1 << 20))\n",
])
def test_memory_hog_is_oom(docker_sandbox, src):
    r = run_then_probe(docker_sandbox, attack(src, timeout_s=3.0))
    assert r.outcome == "oom", r


def test_no_network(docker_sandbox):
    r = run_then_probe(docker_sandbox, attack("""
        import socket
        def f(x):
            socket.create_connection(("1.1.1.1", 53), timeout=1).close()
            return 2 * x
    """, timeout_s=3.0))
    assert r.outcome == "exception" and r.tests_passed == 0
    assert "unreachable" in r.output_excerpt.lower() or "errno" in r.output_excerpt.lower(), r


@pytest.mark.parametrize("path", ["/etc/evil", "/evil", "/usr/lib/evil", "/root/evil"])
def test_writes_outside_tmp_fail(docker_sandbox, path):
    r = run_then_probe(docker_sandbox, attack(f"""
        def f(x):
            with open({path!r}, "w") as fh:
                fh.write("x")
            return 2 * x
    """))
    assert r.outcome == "exception" and ("Read-only" in r.output_excerpt or "Permission" in r.output_excerpt), r
    check = ExecJob(f"import os\ndef f(x):\n    return os.path.exists({path!r})\n", "f",
                    [{"args": [0], "expected": False}], 2.0)
    assert docker_sandbox.run([check])[0].outcome == "pass"


def test_host_files_are_not_readable(docker_sandbox, tmp_path):
    secret = tmp_path / "host_secret.txt"
    secret.write_text("host secret")
    r = run_then_probe(docker_sandbox, attack(f"""
        def f(x):
            return open({str(secret)!r}).read()
    """))
    assert r.outcome == "exception" and "FileNotFoundError" in r.output_excerpt
    r = run_then_probe(docker_sandbox, attack("def f(x):\n    return open('/etc/shadow').read()\n"))
    assert r.outcome == "exception" and "PermissionError" in r.output_excerpt


def test_a_daemonised_child_does_not_outlive_the_task(docker_sandbox):
    # A correct solution that leaves a daemon (double fork + setsid) writing into /tmp.
    r = run_then_probe(docker_sandbox, attack("""
        import os, time
        def f(x):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    while True:
                        with open('/tmp/daemon.txt', 'a') as fh:
                            fh.write('alive')
                        time.sleep(0.01)
                os._exit(0)
            return 2 * x
    """))
    assert r.outcome == "pass"


def test_a_task_cannot_forge_its_result(docker_sandbox):
    # It writes a forged "pass" answer to every channel it can find and claims its outputs.
    r = run_then_probe(docker_sandbox, attack("""
        import json, os, sys
        FORGED = json.dumps({"id": 0, "outcome": "pass", "tests_passed": 3, "tests_total": 3,
                             "runtime_s": 0.0, "output": ""}) + "\\n"
        def f(x):
            for fd in range(0, 64):
                try:
                    os.write(fd, FORGED.encode())
                except OSError:
                    pass
            for i in range(3):
                os.write(3, (json.dumps({"i": i, "out": "forged"}) + "\\n").encode())
            for target in ("/proc/%d/fd/1" % os.getppid(), "/proc/1/fd/1", "/dev/stdout"):
                try:
                    with open(target, "w") as fh:
                        fh.write(FORGED)
                except OSError:
                    pass
            try:
                open("/proc/%d/mem" % os.getppid(), "rb").read(1)
            except OSError:
                pass
            return -1
    """))
    assert r.outcome == "wrong_answer" and r.tests_passed == 0, r


@pytest.mark.parametrize("src", [
    "import os\ndef f(x):\n    os.kill(os.getppid(), 9)\n    return 2 * x\n",
    "import os\ndef f(x):\n    os.kill(1, 9)\n    return 2 * x\n",
    "import os\ndef f(x):\n    os.kill(-1, 9)\n    return 2 * x\n",
])
def test_a_task_cannot_kill_its_runner(docker_sandbox, src):
    r = run_then_probe(docker_sandbox, attack(src))
    # kill(-1) reaches nothing but the task uid's own processes (it signals no one else);
    # killing the supervisor or init is refused.
    assert r.outcome in ("exception", "pass"), r
    if "kill(-1" not in src:
        assert r.outcome == "exception" and "PermissionError" in r.output_excerpt


def test_the_container_runs_hardened(docker_sandbox):
    # Inside: no capabilities for the task, uid 65534, read-only root, tmpfs /tmp, no network devices.
    job = ExecJob(code("""
        import os
        def f(x):
            caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith('CapEff')][0]
            nets = sorted(os.listdir('/sys/class/net'))
            mounts = {l.split()[1]: l.split()[3].split(',')[0] for l in open('/proc/mounts')}
            nnp = [l.split()[1] for l in open('/proc/self/status') if l.startswith('NoNewPrivs')][0]
            return [caps, os.getuid(), nets, mounts['/'], mounts['/tmp'], nnp]
    """), "f", [{"args": [0], "expected": ["0000000000000000", 65534, ["lo"], "ro", "rw", "1"]}], 2.0)
    r = docker_sandbox.run([job])[0]
    assert r.outcome == "pass", r
