"""The sandbox's behaviour: verdicts, the watchdog, recycling, no leaked containers, clear
infrastructure errors (never scored as task failures), and the execution cache."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
import uuid

import pytest

from sage_pipeline.sim.cache import ExecutionCache, execute_cached
from sage_pipeline.sim.sandbox import SandboxConfig, SandboxError, open_sandbox
from sage_pipeline.sim.schema import ExecJob, ExecResult

TESTS = [{"args": [[3, 1, 2]], "expected": [1, 2, 3]}, {"args": [[]], "expected": []},
         {"args": [[2.5, -1.0]], "expected": [-1.0, 2.5]}]


def job(body: str, timeout_s: float = 1.0, tests=TESTS) -> ExecJob:
    return ExecJob("def f(xs):\n" + textwrap.indent(textwrap.dedent(body), "    "), "f", tests, timeout_s)


VERDICTS = [
    (job("return sorted(xs)"), "pass", 3),
    (job("return sorted(xs, reverse=True)"), "wrong_answer", 1),  # [] still passes
    (job("return sorted(xs)[:len(xs) - 1] if xs else []"), "wrong_answer", 1),
    (job("return tuple(sorted(xs))"), "pass", 3),  # JSON: a tuple is a list
    (job("return set(xs)"), "wrong_answer", 0),  # not JSON: the wrong type
    (job("return sorted(xs)[0]"), "exception", 0),
    (job("raise SystemExit(0)"), "exception", 0),
    (job("while True:\n    pass", timeout_s=0.3), "timeout", 0),
    (job("return [0] * (10 ** 10)"), "oom", 0),
    (job("import os\nos._exit(0)"), "exception", 0),
    (ExecJob("def f(xs):\n    return sorted(xs\n", "f", TESTS, 1.0), "exception", 0),  # syntax error
    (ExecJob("def g(xs):\n    return sorted(xs)\n", "f", TESTS, 1.0), "exception", 0),  # no entry point
]


@pytest.mark.parametrize("backend_fixture", ["local_sandbox", "docker_sandbox"])
def test_verdicts(request, backend_fixture):
    sb = request.getfixturevalue(backend_fixture)
    results = sb.run([j for j, _, _ in VERDICTS])
    got = [(r.outcome, r.tests_passed) for r in results]
    assert got == [(o, n) for _, o, n in VERDICTS]
    assert all(r.tests_total == 3 for r in results)
    assert "IndexError" in results[5].output_excerpt
    assert results[7].runtime_s >= 0.3


def test_floats_bools_and_dict_keys_compare_as_json(local_sandbox):
    tests = [{"args": [], "expected": {"1": 0.30000000000000004, "b": True}}]
    ok = ExecJob("def f():\n    return {1: 0.1 + 0.2, 'b': True}\n", "f", tests, 1.0)
    bool_as_int = ExecJob("def f():\n    return {1: 0.3, 'b': 1}\n", "f", tests, 1.0)
    assert [r.outcome for r in local_sandbox.run([ok, bool_as_int])] == ["pass", "wrong_answer"]


def test_the_local_backend_says_it_is_unisolated(local_sandbox):
    d = local_sandbox.describe()
    assert d["isolated"] is False and "UNISOLATED" in d["note"]


def test_a_daemon_that_does_not_answer_is_an_error_that_says_how_to_start_it(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(SandboxError, match="does not answer.*dockerd"):
        with open_sandbox("docker", workers=1):
            pass


def test_a_missing_image_says_how_to_build_it(docker_ready):
    with pytest.raises(SandboxError, match="build_image.sh"):
        with open_sandbox("docker", workers=1, image="sage-sim:no-such-tag"):
            pass


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match=r"\nbackend\n  Input should be 'docker' or 'local' .*'podman'"):
        SandboxConfig(backend="podman")
    with pytest.raises(ValueError, match=r"\nworkers\n  Input should be greater than or equal to 1 "):
        SandboxConfig(workers=0)
    with pytest.raises(ValueError, match=r"\nlabel\n  String should have at least 1 character"):
        SandboxConfig(label="")  # unset (unique per sandbox) is null, never ''
    with pytest.raises(ValueError, match=r"\nmemry_mb\n  Extra inputs are not permitted"):
        SandboxConfig(memry_mb=256)


def _labelled(label: str) -> list[str]:
    out = subprocess.run(["docker", "ps", "-aq", "--filter", f"label=sage.sandbox={label}"],
                         capture_output=True, text=True, check=True)
    return out.stdout.split()


def test_two_workers_recycling_and_no_leaked_containers(docker_ready):
    label = f"test-{uuid.uuid4().hex[:8]}"
    good = job("return sorted(xs)")
    with open_sandbox("docker", workers=2, recycle_every=5, label=label) as sb:
        assert len(_labelled(label)) == 2
        results = sb.run([good] * 24)
        assert {r.outcome for r in results} == {"pass"}
        assert sb.stats["recycled"] >= 3
        assert len(_labelled(label)) == 2  # recycled ones are gone
    assert _labelled(label) == []


def test_containers_are_removed_when_the_run_fails(docker_ready):
    label = f"test-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RuntimeError, match="boom"):
        with open_sandbox("docker", workers=1, label=label):
            raise RuntimeError("boom")
    assert _labelled(label) == []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_containers_are_removed_on_interrupt(docker_ready, tmp_path, sig):
    label = f"test-{uuid.uuid4().hex[:8]}"
    script = tmp_path / "interrupted.py"
    # the child takes signals as an interactive process does, whatever its parent ignores: a
    # shell without job control starts background commands with SIGINT ignored
    script.write_text(textwrap.dedent(f"""
        import signal, sys
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        from sage_pipeline.sim.sandbox import open_sandbox
        from sage_pipeline.sim.schema import ExecJob
        hang = ExecJob("def f():\\n    while True:\\n        pass\\n", "f", [{{"args": [], "expected": 0}}], 60.0)
        with open_sandbox("docker", workers=1, label={label!r}) as sb:
            print("started", flush=True)
            sb.run([hang])
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    time.sleep(0.5)
    assert len(_labelled(label)) == 1
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert proc.returncode != 0
    assert _labelled(label) == []


def test_the_watchdog_replaces_a_container_that_stops_answering(docker_ready):
    label = f"test-{uuid.uuid4().hex[:8]}"
    with open_sandbox("docker", workers=1, label=label, answer_grace_s=1.0) as sb:
        name = sb.workers[0].name
        subprocess.run(["docker", "pause", name], check=True, capture_output=True)
        t0 = time.monotonic()
        result = sb.run([job("return sorted(xs)", timeout_s=0.5)])[0]
        assert result.outcome == "pass"  # re-run on the fresh container, not scored as a failure
        assert sb.stats["replaced_unresponsive"] == 1
        assert sb.workers[0].name != name
        assert time.monotonic() - t0 < 30
    assert _labelled(label) == []


def test_a_worker_that_cannot_start_is_an_infrastructure_error(docker_ready):
    # An image without python3: the worker never says it is ready.
    subprocess.run("tar -cf - --files-from /dev/null | docker import - sage-sim-test:nopython",
                   shell=True, check=True, capture_output=True)
    with pytest.raises(SandboxError, match="did not start"):
        with open_sandbox("docker", workers=1, image="sage-sim-test:nopython", start_timeout_s=20.0):
            pass


def test_cache_executes_only_what_is_new(local_sandbox, tmp_path):
    calls = []

    def run(jobs):
        calls.append(len(jobs))
        return local_sandbox.run(jobs)

    cache = ExecutionCache(tmp_path / "cache")
    jobs = [job("return sorted(xs)"), job("return xs"), job("return sorted(xs)")]
    results, counts = execute_cached(run, "local", cache, jobs)
    assert [r.outcome for r in results] == ["pass", "wrong_answer", "pass"]
    assert counts == {"hits": 0, "executed": 2} and calls == [2]
    # A new process (a re-run) reads the segments back and executes only the new job.
    cache2 = ExecutionCache(tmp_path / "cache")
    assert len(cache2) == 2
    results2, counts2 = execute_cached(run, "local", cache2, jobs + [job("return []")])
    assert [r.outcome for r in results2] == ["pass", "wrong_answer", "pass", "wrong_answer"]
    assert counts2 == {"hits": 3, "executed": 1} and calls == [2, 1]
    # Docker does not trust what the unisolated local backend verified.
    assert cache2.get(jobs[0].key, "docker") is None
    assert cache2.get(jobs[0].key, "local") == results[0]
    assert cache2.compact() is not None and len(list((tmp_path / "cache").glob("segment-*"))) == 1
    assert len(ExecutionCache(tmp_path / "cache")) == 3


def test_a_damaged_cache_line_is_executed_again_not_trusted(tmp_path):
    folder = tmp_path / "cache"
    cache = ExecutionCache(folder)
    cache.put("k1", ExecResult("pass", 1, 1, 0.1), "local")
    seg = cache.flush()
    with open(seg, "a") as fh:
        fh.write('{"key": "k2", "backend": "local", "result": {"outcome": "maybe"}}\n{not json\n')
    again = ExecutionCache(folder)
    assert again.bad_lines == 2 and again.get("k1", "local").passed and again.get("k2", "local") is None


def test_the_test_suite_never_leaves_containers_behind():
    # Every container this suite starts carries the sandbox label; none may be left running
    # by the tests above (module fixtures close at module end, so only count other labels).
    out = subprocess.run(["docker", "ps", "-a", "--format", "{{.Labels}}"], capture_output=True, text=True)
    leaked = [line for line in out.stdout.splitlines() if "sage.sandbox=test-" in line]
    assert leaked == []



def test_a_killed_hosts_local_work_folders_are_removed_by_the_next_local_sandbox(tmp_path):
    """A host killed with -9 never runs close(): its local workers' folders in /tmp stay.
    The next local sandbox removes them, and never a live sandbox's."""
    import os
    import tempfile
    from pathlib import Path

    from sage_pipeline.sim.sandbox import LOCAL_PREFIX

    def folders() -> set[Path]:
        return set(Path(tempfile.gettempdir()).glob(f"{LOCAL_PREFIX}*"))

    code = ("import sys, time\nfrom sage_pipeline.sim.sandbox import open_sandbox\n"
            "with open_sandbox('local', workers=2) as sb:\n"
            "    print('ready', flush=True)\n    time.sleep(600)\n")
    before = folders()
    host = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout.readline().strip() == "ready"
        theirs = folders() - before
        assert len(theirs) == 2
        with open_sandbox("local", workers=1) as sb:  # a live host's folders are left alone
            assert sb.run([job("return sorted(xs)")])[0].outcome == "pass"
            assert theirs <= folders()
        os.kill(host.pid, signal.SIGKILL)
        host.wait(10)
        assert theirs <= folders()  # what the kill leaves
        with open_sandbox("local", workers=1) as sb:
            assert not theirs & folders()
            assert sb.run([job("return sorted(xs)")])[0].outcome == "pass"  # and the next task is right
    finally:
        if host.poll() is None:
            host.kill()
            host.wait()
