"""The launcher (``sage run`` forked from a SAGE imported once) against SAGE's own code: a forked run
starts from what a fresh process would read, both ways of starting SAGE write the same journals, a
second run sees the bandit state the first wrote, and a run past its limit or a launcher that dies
never hangs the day. SAGE from SAGE_PYTHON (skipped or failed by the rule in
sage_contract/sage_journals.py); the first two tests need no SAGE."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, run_day, sage_env
from sage_pipeline.sage_world.launcher import LauncherError, SageLauncher, console_python
from sage_pipeline.sage_world.server import WorldServer
from sage_pipeline.sage_world.world import build_world

TASKS = 4


@pytest.fixture(scope="module")
def install(sage_python) -> SageInstall:
    return SageInstall.find(sage_python)


def _world(install: SageInstall):
    return build_world(install.models_yaml, n_tasks=24, task_seed=1)


@pytest.fixture(scope="module")
def world(install):
    return _world(install)


def _journal(ws: Path) -> list[tuple]:
    """A workspace's journal lines in order: each JSON event's type and payload keys (timestamps and
    session ids left out) with the fields that follow from the world's seed and SAGE's state; each
    text line's kind."""
    out = []
    for f in sorted((ws / "memory" / "sessions").glob("*.log")):
        for ln in f.read_text(encoding="utf-8").splitlines():
            if not ln.startswith("{"):
                out.append(("text", ln.split("] ", 1)[-1].split(" ", 1)[0]))
                continue
            e = json.loads(ln)
            keys = tuple(sorted(set(e) - {"timestamp"}))
            facts: tuple = ()
            if e["type"] == "MODEL_ROUTING_DECISION":
                facts = (e["agent_role"], e["selected_model"], e["policy_source"], e["primary_failure_count"])
            elif e["type"] == "TRAJECTORY_STEP":
                facts = (e["agent"], e["action"].get("prompt_strategy_key"), e.get("verdict"), e["terminal"])
            out.append((e["type"], keys, facts))
    return out


def _coder_strategies(ws: Path) -> list[str]:
    """The coder strategy SAGE's UCB bandit gave each run, in order (the first reviewer step of a session)."""
    first: dict[str, str] = {}
    for f in sorted((ws / "memory" / "sessions").glob("*.log")):
        for ln in f.read_text(encoding="utf-8").splitlines():
            if ln.startswith("{"):
                e = json.loads(ln)
                if e["type"] == "TRAJECTORY_STEP" and e["agent"] == "reviewer":
                    first.setdefault(e["session_id"], e["action"]["prompt_strategy_key"])
    return list(first.values())


def _processes_under(root: Path) -> list[int]:
    """Processes whose working directory is inside ``root`` (a run, or anything it started)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if Path(os.readlink(p / "cwd")).is_relative_to(root):
                    pids.append(int(p.name))
            except OSError:
                continue
    return pids


def _is_launcher(pid: int) -> bool:
    try:
        return b"--fd" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def test_the_interpreter_is_the_one_the_sage_scripts_shebang_names(tmp_path):
    py = Path(sys.executable)
    script = tmp_path / "sage"
    script.write_text(f"#!{py}\nimport sys\n")
    assert console_python(script, Path("/fallback")) == py
    script.write_text("#!/bin/sh\n'''exec' \"/a very/long path/python\" \"$0\" \"$@\"\n")  # pip's long-path trampoline
    assert console_python(script, Path("/fallback")) == Path("/fallback")
    assert console_python(tmp_path / "missing", Path("/fallback")) == Path("/fallback")


def test_a_launcher_that_cannot_import_sage_says_so_and_what_to_do(tmp_path):
    """The project's own Python has no SAGE: the launcher reports the import error, never hangs."""
    la = SageLauncher(Path(sys.executable), tmp_path / "sage", {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                      tmp_path / "launchers")
    with pytest.raises(LauncherError, match=r"No module named 'sage'.*fresh_process=True"):
        la.start(timeout=60)
    assert not la.alive


def test_a_forked_run_starts_from_what_a_fresh_sage_run_would_read(install, tmp_path):
    """Each child: its own session, stdin /dev/null, only stdio open, the run's workspace, argv,
    sys.path[0] and interpreter as the `sage` script gets them, the bandit of *its* workspace (read
    again at each run), numpy's global RNG drawn afresh (the exploring checkpoint draws from it), and
    the run's environment and Ollama host."""
    ckpt = tmp_path / "policy.joblib"  # a checkpoint drawing from numpy's global RNG, as the exploring one does
    out = subprocess.run([str(install.python), "-c", (
        "import sys, joblib, numpy as np; from sklearn.dummy import DummyClassifier as D; "
        "c = D(strategy='stratified').fit(np.zeros((2, 2)), [0, 1]); "
        "joblib.dump({'models': {'debugger': c}, 'feature_keys': ['task_complexity_score', 'failure_count']}, "
        "sys.argv[1])"), str(ckpt)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    ws = tmp_path / "ws"
    (ws / "memory" / "rl").mkdir(parents=True)
    bandit = ws / "memory" / "rl" / "ucb_bandit.json"
    bandit.write_text(json.dumps({"stats": {"coder:primary:standard": {"count": 3.0, "value_mean": 0.7}}}))
    env = sage_env(install, "http://127.0.0.1:9", tmp_path / "home", tmp_path / "bin", ckpt, 0.1, install.models_yaml)
    py = console_python(install.cli, install.python)
    probes = []
    with SageLauncher(py, install.cli, env, tmp_path / "launchers") as la:
        for i in range(2):
            rc, cpu, killed = la.run(f"p{i}", ws, ["run", "x"], tmp_path / f"p{i}.out", tmp_path / f"p{i}.err", 60,
                                     probe=True)
            assert (rc, killed) == (0, False) and cpu is not None, (tmp_path / f"p{i}.err").read_text()
            probes.append(json.loads((tmp_path / f"p{i}.out").read_text()))
            bandit.write_text(json.dumps({"stats": {"coder:fallback:standard": {"count": 1.0, "value_mean": 0.2}}}))
        launcher_pid = la.info["pid"]
    a, b = probes
    for p in probes:
        assert p["pid"] == p["pgid"] == p["sid"] != launcher_pid  # its own session: killed with its group
        assert p["cwd"] == str(ws) and p["argv"] == [str(install.cli), "run", "x"]
        assert p["path0"] == str(install.cli.parent) and p["executable"] == str(py)
        assert p["stdin"] == "/dev/null" and p["threads"] == ["MainThread"]
        assert p["fds"] == [0, 1, 2, 3]  # stdio and the listing's own descriptor: the launcher's socket is closed
        assert p["ollama_host"] == "http://127.0.0.1:9" and p["env"]["SAGE_MODELS_YAML"] == str(install.models_yaml)
        extra = set(p["env"]) - set(env)
        assert {k: p["env"][k] for k in env} == env and extra <= {"KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK"}
    assert a["bandit"] == {"coder:primary:standard": {"count": 3.0, "value_mean": 0.7}}
    assert b["bandit"] == {"coder:fallback:standard": {"count": 1.0, "value_mean": 0.2}}  # read again, not cached
    assert a["numpy_draw"] is not None and a["numpy_draw"] != b["numpy_draw"]


def test_a_run_given_paths_relative_to_the_caller_runs_there(install, tmp_path, monkeypatch):
    """The launcher runs in a folder of its own: a workspace and output files named relative to the caller's
    working directory are the caller's (a relative --out once failed every run with 'No such file')."""
    env = sage_env(install, "http://127.0.0.1:9", tmp_path / "home", tmp_path / "bin")
    (tmp_path / "ws").mkdir()
    monkeypatch.chdir(tmp_path)
    with SageLauncher(console_python(install.cli, install.python), install.cli, env, tmp_path / "launchers") as la:
        rc, _, _ = la.run("rel", Path("ws"), ["run", "x"], Path("rel.out"), Path("rel.err"), 60, probe=True)
    assert rc == 0, (tmp_path / "rel.err").read_text()
    assert json.loads((tmp_path / "rel.out").read_text())["cwd"] == str(tmp_path / "ws")


def test_a_runs_own_variables_reach_that_run_only_and_bad_ones_are_refused(install, tmp_path):
    """``env=``: the forked child has the launcher's environment with the run's own variables on top (a run's
    SAGE_TRACE_ID and SAGE_MODELS_YAML), the next run without them has the launcher's again; a name that is not
    a variable name or a value with a NUL is refused before anything is forked."""
    env = sage_env(install, "http://127.0.0.1:9", tmp_path / "home", tmp_path / "bin")
    ws = tmp_path / "ws"
    ws.mkdir()
    other = tmp_path / "other.yaml"
    other.write_text(install.models_yaml.read_text())
    own = {"SAGE_TRACE_ID": "draw-1", "SAGE_MODELS_YAML": str(other)}
    py = console_python(install.cli, install.python)
    with SageLauncher(py, install.cli, env, tmp_path / "launchers") as la:
        probes = []
        for i, extra in enumerate((own, None)):
            rc, _, _ = la.run(f"p{i}", ws, ["run", "x"], tmp_path / f"p{i}.out", tmp_path / f"p{i}.err", 60,
                              probe=True, env=extra)
            assert rc == 0, (tmp_path / f"p{i}.err").read_text()
            probes.append(json.loads((tmp_path / f"p{i}.out").read_text())["env"])
        for bad in ({"sage trace": "x"}, {"SAGE_TRACE_ID": "a\x00b"}, {"SAGE_TRACE_ID": 3}):
            with pytest.raises(ValueError, match="variable name"):
                la.run("bad", ws, ["run", "x"], tmp_path / "b.out", tmp_path / "b.err", 60, env=bad)
        assert la.alive  # a refused request forks nothing and leaves the launcher serving
    first, second = probes
    assert {k: first[k] for k in own} == own and {k: first[k] for k in env if k not in own} == \
        {k: v for k, v in env.items() if k not in own}
    assert "SAGE_TRACE_ID" not in second and "SAGE_MODELS_YAML" not in second  # the day's environment again


def test_both_ways_of_starting_sage_write_the_same_journals_and_the_bandit_carries_over(install, tmp_path):
    """The same world seed and tasks, SAGE's YAML: every workspace's journal has the same events (types,
    payload keys, routing and trajectory facts) whether each run is a fresh process or a fork; and the
    second run in a workspace gets another coder strategy from SAGE's UCB bandit, as a fresh `sage run`
    does after reading the state the first one wrote (a bandit read once by the launcher would give every
    run the first untried strategy)."""
    days = {}
    for fresh in (True, False):
        world = _world(install)
        tasks = [t.task_id for t in world.tasks[:TASKS]]
        with WorldServer(world) as srv:
            res = run_day(world, srv.url, install, 1, tasks, tmp_path / ("fresh" if fresh else "launcher"),
                          HarnessConfig(workers=2, fresh_process=fresh))
        assert res.finished == TASKS, res.failures
        assert res.process == ("fresh" if fresh else "launcher") and res.launcher_restarts == 0
        days[fresh] = res
    fresh, forked = days[True], days[False]
    for ws in ("ws-0", "ws-1"):
        a, b = _journal(fresh.root / ws), _journal(forked.root / ws)
        first_difference = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
        assert len(a) > 20 and a == b, f"{ws}: the journals differ from event {first_difference}"
        strategies = _coder_strategies(forked.root / ws)
        assert strategies == _coder_strategies(fresh.root / ws) and len(strategies) == TASKS // 2
        assert strategies[1] != strategies[0]  # the first run's reward reached the second through the file
        state = json.loads((forked.root / ws / "memory" / "rl" / "ucb_bandit.json").read_text())["stats"]
        assert sum(s["count"] for s in state.values()) >= TASKS // 2
    facts = lambda d: [(r.run, r.task_id, r.coder_model, r.task_right, r.complexity, len(r.sessions)) for r in d.runs]  # noqa: E731
    assert facts(fresh) == facts(forked)
    assert all(r.cpu_s is None for r in fresh.runs) and all(r.cpu_s > 0 for r in forked.runs)
    logs = sorted(p.name for p in (forked.root / "runs").iterdir())
    assert logs == [f"d01-r{i:03d}.log" for i in range(TASKS)]  # the runs' stdout/stderr files folded into them


def test_a_run_past_its_limit_is_killed_with_its_process_group_and_the_launcher_goes_on(install, world, tmp_path):
    tasks = [t.task_id for t in world.tasks[4:6]]
    root = tmp_path / "day"
    with WorldServer(world) as srv:
        res = run_day(world, srv.url, install, 3, tasks, root, HarnessConfig(workers=1, run_timeout_s=0.5))
    assert [r.failure for r in res.runs] == ["killed after the 0.5 s limit"] * 2
    assert all(r.returncode is None for r in res.runs) and res.launcher_restarts == 0
    assert _processes_under(root / "ws-0") == []  # nothing SAGE started outlives the kill
    assert "rc=None" in (root / "runs" / "d03-r000.log").read_text()


def test_a_launcher_that_dies_mid_run_is_replaced_counted_and_the_day_goes_on(install, world, tmp_path):
    """The launcher is SIGKILLed while its first run works: that run fails with the reason and is
    killed with its group; the next run gets a new launcher and finishes."""
    tasks = [t.task_id for t in world.tasks[6:8]]
    root = tmp_path / "day"
    home = root / "launchers" / "launcher-0"
    killed: list[int] = []

    def kill_the_launcher_once_a_run_works() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            launcher = [p for p in _processes_under(home) if _is_launcher(p)]
            runs = _processes_under(root / "ws-0")
            if launcher and runs:
                time.sleep(0.3)  # well into the run
                os.kill(launcher[0], signal.SIGKILL)
                killed.append(launcher[0])
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_launcher_once_a_run_works, daemon=True)
    killer.start()
    with WorldServer(world) as srv:
        res = run_day(world, srv.url, install, 4, tasks, root, HarnessConfig(workers=1))
    killer.join(5)
    assert killed, "the test never saw the launcher and a run at once"
    first, second = res.runs
    assert first.failure is not None and first.failure.startswith("launcher lost during the run"), first.failure
    assert second.failure is None and res.launcher_restarts == 1 and res.summary()["launcher_restarts"] == 1
    assert _processes_under(root) == []
