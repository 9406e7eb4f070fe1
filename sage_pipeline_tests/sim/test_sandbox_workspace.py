"""Workspace jobs (sim/runner.py, "workspace jobs"): a test module run unchanged by SAGE's verification command
in the sandbox, the candidate's code in SAGE's file, the verdict the command's exit status. The verdicts are
checked in the real Docker sandbox (its limits and no network unchanged) and in the local backend; what a job may
be (paths, commands) without either."""

from __future__ import annotations

import sys

import pytest

from sage_pipeline.sim.runner import pytest_summary, workspace_argv, workspace_problem
from sage_pipeline.sim.sandbox import SandboxConfig, SandboxError, open_sandbox, workspace_job

TEST = ("import pytest\nfrom calc import add\n\n\n@pytest.mark.parametrize('a, b, want', [(1, 2, 3), (2, 0, 2)])\n"
        "def test_add(a, b, want):\n    assert add(a, b) == want\n")
RIGHT, WRONG = "def add(a, b):\n    return a + b\n", "def add(a, b):\n    return a - b\n"
CMD = "python -m pytest -q tests/test_calc.py"


def _job(code: str, test: str = TEST, timeout_s: float = 20.0, code_file: str = "calc.py"):
    return workspace_job(code, code_file, {"tests/test_calc.py": test}, CMD, timeout_s)


VERDICTS = [  # (what the code does, code, outcome, the excerpt's start)
    ("right", RIGHT, "pass", "exit 0: 2 passed"),
    ("wrong", WRONG, "wrong_answer", "exit 1: 1 failed, 1 passed"),
    ("does not parse", "def add(a, b:\n", "exception", "exit 2 (pytest: interrupted (errors during collection))"),
    ("ends the process before pytest reports", "import os\nos._exit(0)\n", "exception",
     "exit 0 without pytest's report of passed tests"),
    ("loops", "def add(a, b):\n    while True:\n        pass\n", "timeout", "timed out"),
    ("kills itself", "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", "killed", "killed by signal 9"),
]


def _check(sb, timeout_s: float = 20.0) -> None:
    jobs = [_job(code, timeout_s=timeout_s if kind != "loops" else 4.0) for kind, code, _, _ in VERDICTS]
    for (kind, _, outcome, head), r in zip(VERDICTS, sb.run(jobs), strict=True):
        assert (r.outcome, r.tests_total) == (outcome, 1), (kind, r)
        assert r.output_excerpt.startswith(head), (kind, r.output_excerpt)
        assert r.tests_passed == (outcome == "pass")


def test_a_workspace_job_is_judged_by_the_commands_exit_in_the_docker_sandbox(docker_ready):
    with open_sandbox("docker", workers=2, untrusted=True) as sb:
        _check(sb)
        # a src/ layout (SAGE's verifier puts <workspace>/src on PYTHONPATH), and the sandbox's own limits and
        # network as the module under test sees them
        inside = ("import os, resource, socket\nfrom calc import add\n\n\ndef test_inside():\n"
                  "    assert add(1, 2) == 3\n"
                  "    assert [n for _, n in socket.if_nameindex()] == ['lo']  # --network none\n"
                  f"    assert resource.getrlimit(resource.RLIMIT_AS)[1] == {SandboxConfig().task_memory_mb << 20}\n"
                  "    assert os.getuid() == 65534 and os.environ['PYTHONPATH'].endswith('/src')\n")
        (r,) = sb.run([_job(RIGHT, inside, code_file="src/calc.py")])
        assert r.outcome == "pass", r.output_excerpt
        assert sb.describe()["untrusted"] and sb.describe()["isolated"]


def test_a_workspace_job_runs_the_chosen_interpreter_in_the_local_backend():
    with open_sandbox("local", workers=2, untrusted=True, allow_untrusted_local=True,
                      local_python=sys.executable) as sb:
        _check(sb)


def test_pytests_summary_line_is_read_from_the_end():
    assert pytest_summary("..F\nFAILED x\n1 failed, 2 passed in 0.12s\n") == {"failed": 1, "passed": 2}
    assert pytest_summary("===== 3 passed, 1 warning in 1.00s =====") == {"passed": 3, "warning": 1}
    assert pytest_summary("1 error in 0.1s\n") == {"error": 1} and pytest_summary("hello in there") == {}


def test_what_a_workspace_job_may_be():
    assert workspace_argv({"python": "/py"}, "python -m pytest -q tests/t.py") == ["/py", "-m", "pytest", "-q",
                                                                                  "tests/t.py"]
    assert workspace_argv({"python": "/py"}, "pytest tests/t.py -q") == ["/py", "-m", "pytest", "tests/t.py", "-q"]
    for command, why in [("rm -rf /", "runs 'rm'"), ("python -c 1 && python -c 2", "chained"), ("", "non-empty")]:
        with pytest.raises(ValueError, match=why):
            workspace_job(RIGHT, "calc.py", {}, command, 5)
    for path, why in [("/etc/x.py", "absolute"), ("../x.py", "'..'"), ("a//x.py", "empty"), ("a\\x.py", "plain"),
                      ("/".join("d" * 9) + "/x.py", "deep")]:
        with pytest.raises(ValueError, match=why):
            workspace_job(RIGHT, path, {}, CMD, 5)
        with pytest.raises(ValueError, match=why):
            workspace_job(RIGHT, "calc.py", {path: "x"}, CMD, 5)
    assert "both the code file" in workspace_problem({"command": CMD, "code_file": "a.py", "files": {"a.py": ""}})
    with pytest.raises(SandboxError, match="local_python .* is for the local backend"):
        SandboxConfig(backend="docker", local_python=sys.executable)


def test_a_malformed_workspace_job_is_the_sandboxs_failure_never_a_verdict():
    from sage_pipeline.sim.schema import ExecJob

    bad = ExecJob(code=RIGHT, entry_point="calc.py", timeout_s=5.0,
                  tests=[{"command": CMD, "code_file": "../calc.py", "files": {}}])
    with open_sandbox("local", workers=1, untrusted=True, allow_untrusted_local=True) as sb:
        with pytest.raises(SandboxError, match="a malformed workspace job: file '../calc.py'"):
            sb.run([bad])
