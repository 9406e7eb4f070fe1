"""The model world (what SAGE's agents get back), its Ollama server and its exact values, without SAGE."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sage_world import truth as T
from sage_pipeline.sage_world.harness import SageInstall, SageNotFound, goal
from sage_pipeline.sage_world.server import WorldServer, embedding
from sage_pipeline.sage_world.world import (
    DEFAULT_TEST_STYLES,
    MAX_RETRIES,
    TEST_STYLES,
    ModelWorld,
    WorldConfig,
    WorldError,
    agent_of,
    build_world,
    module_of,
    style_for,
    verified_tests,
)
from sage_pipeline_tests.sim.sandbox_fixtures import docker_ready  # noqa: F401 - the Docker sandbox's fixture

SAGE_TABLE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_journal" / "models.yaml"


@pytest.fixture(scope="module")
def world() -> ModelWorld:
    return build_world(SAGE_TABLE, n_tasks=24, task_seed=3)


def _msgs(user: str, system: str = "CODEBASE CONTEXT:\nNone") -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _fresh(world: ModelWorld, seed: int = 0) -> ModelWorld:
    return ModelWorld(world.sim, world.table, WorldConfig(seed=seed))


def _run_task(w: ModelWorld, run: str, task_id: str, debug_calls: int = 0) -> list[str]:
    """A run's answers in SAGE's order: planner, coder, reviewer, then debugger/reviewer pairs."""
    w.assign(run, task_id)
    plan = json.loads(w.answer("qwen2.5-coder:1.5b", _msgs(
        f"Generate a Task DAG for the following goal.\n\nGOAL: {goal(run, 'x')}\n\nCODEBASE CONVENTIONS:\n"))[0])
    desc = plan["dag"]["nodes"][0]["description"]
    out = [w.answer("qwen2.5-coder:1.5b", _msgs(f"Implement the following task.\n\nTASK: {desc}\n\n"))[0]]
    out.append(w.answer("qwen2.5-coder:1.5b", _msgs(f"Review this file for task: {desc}\nFILE: x.py\n"))[0])
    for _ in range(debug_calls):
        fix = f"Fix the following error.\n\nERROR: e\nFILE: x.py\nTASK: {desc}"
        out.append(w.answer("codestral:22b", _msgs(fix))[0])
    return out


def test_each_sage_agent_is_recognised_by_its_own_template():
    for user, agent in (("Generate a Task DAG for the following goal.\n\nGOAL: g", "planner"),
                        ("Implement the following task.\n\nTASK: t", "coder"),
                        ("Fix the following error.\n\nERROR: e", "debugger"),
                        ("Review this file for task: t\nFILE: f.py", "reviewer"),
                        ("Generate pytest tests for f.py.\nTASK: t", "test_engineer"),
                        ("Produce the markdown PatchRequest for `README.md`. Return ONLY JSON.", "documentation"),
                        ("Design the project blueprint for:\n\nTASK: t", "architect")):
        assert agent_of(_msgs(user)) == agent
    with pytest.raises(WorldError, match="no SAGE agent writes a user message starting 'Summarise"):
        agent_of(_msgs("Summarise this"))
    with pytest.raises(WorldError, match="without a user message"):
        agent_of([{"role": "system", "content": "x"}])


def test_answers_are_in_the_shapes_sages_parsers_take(world):
    w = _fresh(world)
    t = w.tasks[0]
    w.assign("r1", t.task_id)
    dag = f"Generate a Task DAG for the following goal.\n\nGOAL: {goal('r1', 'p')}"
    plan = json.loads(w.answer("m", _msgs(dag))[0])
    node = plan["dag"]["nodes"][0]
    assert node["assigned_agent"] == "coder" and "[sage-world run=r1]" in node["description"]
    assert node["verification"] == f"python -m pytest -q tests/test_{module_of(t)}.py"  # the test path last
    for word in ("pytest", "test file", "readme", "documentation"):  # SAGE would re-assign the task
        assert word not in node["description"].lower()
    task = node["description"]
    code = json.loads(w.answer("qwen2.5-coder:1.5b", _msgs(f"Implement the following task.\n\nTASK: {task}"))[0])
    assert code["file"] == f"{module_of(t)}.py" and code["operation"] == "create"
    assert len(code["patch"].splitlines()) >= 3  # SAGE's reviewer fails a shorter file unread
    verdict = json.loads(w.answer("qwen2.5-coder:1.5b", _msgs(f"Review this file for task: {node['description']}"))[0])
    assert verdict["verdict"] in ("PASS", "FAIL") and (verdict["score"] >= 0.5) == (verdict["verdict"] == "PASS")
    tests = json.loads(w.answer("m", _msgs(f"Generate pytest tests for x.py.\nTASK: {node['description']}"))[0])
    assert tests["file"] == f"tests/test_{module_of(t)}.py"
    fix = json.loads(w.answer("codestral:22b", _msgs(f"Fix the following error.\n\nERROR: e\nTASK: {task}"))[0])
    assert isinstance(fix["phase_3_hypothesize"]["confidence"], float)  # SAGE formats it with :.2f
    assert fix["phase_4_patch"]["file"] == code["file"]


def test_a_request_naming_no_run_is_refused_with_what_to_do(world):
    w = _fresh(world)
    with pytest.raises(WorldError, match="names no run"):
        w.answer("m", _msgs("Implement the following task.\n\nTASK: something"))
    with pytest.raises(WorldError, match="never assigned a task"):
        w.answer("m", _msgs("Implement the following task.\n\nTASK: [sage-world run=nope] x"))
    with pytest.raises(WorldError, match="unknown task"):
        w.assign("r", "no-such-task")


def test_same_seed_same_world_whatever_the_order_of_runs(world):
    ids = [t.task_id for t in world.tasks[:6]]
    a, b, c = _fresh(world, 7), _fresh(world, 7), _fresh(world, 8)
    first = {f"r{i}": _run_task(a, f"r{i}", t, 2) for i, t in enumerate(ids)}
    second = {f"r{i}": _run_task(b, f"r{i}", t, 2) for i, t in reversed(list(enumerate(ids)))}
    assert first == second
    other = {f"r{i}": _run_task(c, f"r{i}", t, 2) for i, t in enumerate(ids)}
    assert other != first


def test_the_coder_is_right_with_the_calibrated_chance(world):
    w = _fresh(world)
    t = w.tasks[0]
    p = w.p_code(0, "qwen2.5-coder:1.5b")
    n = 600
    right = 0
    for i in range(n):
        _run_task(w, f"c{i}", t.task_id)
        right += w.final_right(f"c{i}")
    # the reviewer does not change the file: the share of right first files is the coder's chance
    assert abs(right / n - p) < 4 * np.sqrt(p * (1 - p) / n)
    assert 0 < p < 1 and w.p_code(0, "qwen2.5-coder:14b-instruct-q4_K_M") > p  # the 14b (an alias) is better


def test_a_coder_shift_moves_the_coders_first_file_and_its_truth_and_nothing_else(world):
    """``WorldConfig.coder_shift`` (the end-to-end target's handicap and drift): the coder's first file is right
    with the calibrated chance plus the shift, clipped to [0, 1], as drawn and as the truth values it; named by
    SAGE's tag or the calibrated name; the reviewer's accuracy keeps the calibration's figure; no shift is the
    calibration exactly; a shift past 1 either way is refused."""
    from pydantic import ValidationError

    from sage_pipeline.sage_world import truth as T

    tag, small = "qwen2.5-coder:14b-instruct-q4_K_M", "qwen2.5-coder:1.5b"
    base = _fresh(world)
    p = base.p_code(0, small)
    w = ModelWorld(world.sim, world.table, WorldConfig(coder_shift={small: -0.5, "qwen2.5-coder:14b": 0.9}))
    assert w.p_coder(0, small) == max(0.0, p - 0.5) and w.p_coder(0, tag) == 1.0  # the alias's calibrated name
    assert base.p_coder(0, small) == p and w.review_accuracy(0, small) == base.review_accuracy(0, small)
    n, right = 400, 0
    for i in range(n):
        _run_task(w, f"s{i}", w.tasks[0].task_id)
        right += w.final_right(f"s{i}")
    q = w.p_coder(0, small)
    assert abs(right / n - q) < 4 * np.sqrt(max(q * (1 - q), 1e-3) / n)
    assert w.chance("coder", 0, small) == q and w.chance("reviewer", 0, small) == base.chance("reviewer", 0, small)
    pol = T.SagePolicy(world.table)
    v0, v1 = (T.run_value(x, 0, small, 0.5, pol) for x in (base, w))
    assert v1.p_verified < v0.p_verified
    with pytest.raises(ValidationError, match="at most 1"):
        WorldConfig(coder_shift={small: -1.5})


def test_the_test_file_passes_the_reference_and_fails_every_wrong_candidate(world, tmp_path):
    """What SAGE's verification command runs: the task's verified cases, against each candidate."""
    w = _fresh(world)
    for t in w.tasks[:3]:
        mod = module_of(t)
        (tmp_path / "tests").mkdir(exist_ok=True)
        (tmp_path / "tests" / f"test_{mod}.py").write_text(verified_tests(t))
        for slot in (-1, *range(len(t.wrong_candidates()))):
            (tmp_path / f"{mod}.py").write_text(w._file(t, slot))
            out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  f"tests/test_{mod}.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
            assert (out.returncode == 0) == (slot == -1), (t.task_id, slot, w.outcome_kind(0, slot), out.stdout[-500:])


@pytest.mark.usefixtures("docker_ready")
def test_every_test_style_passes_the_reference_and_fails_every_wrong_candidate_in_the_sandbox(world):
    """Each style the world's test engineer writes, run unchanged by SAGE's verification command in the Docker
    sandbox (pytest, FastAPI and httpx from the image): the right file passes, each verified wrong one fails."""
    from sage_pipeline.sim.sandbox import open_sandbox, workspace_job

    w, jobs, meta = _fresh(world), [], []
    for k, style in enumerate(TEST_STYLES):
        for t in (w.tasks[k],):
            mod, source = module_of(t), verified_tests(t, style)
            for slot in (-1, *range(len(t.wrong_candidates()))):
                jobs.append(workspace_job(w._file(t, slot), f"{mod}.py", {f"tests/test_{mod}.py": source},
                                          f"python -m pytest -q tests/test_{mod}.py", 30.0))
                meta.append((style, t.task_id, slot, w.outcome_kind(w.by_id[t.task_id], slot)))
    with open_sandbox("docker", workers=2, untrusted=True) as sb:
        results = sb.run(jobs)
    wrong = [(m, r.outcome, r.output_excerpt[:200]) for m, r in zip(meta, results, strict=True)
             if r.passed != (m[2] == -1)]
    assert not wrong, wrong
    assert {m[0] for m in meta} == set(TEST_STYLES) and sum(m[2] == -1 for m in meta) == len(TEST_STYLES)
    assert len({m[3] for m in meta if m[2] != -1}) >= 3  # wrong answers, exceptions, loops


def test_approx_compares_exactly_as_the_plain_style_does():
    """``_close`` (pytest.approx where a float is compared) and ``_same`` agree on every pair, bools and ints
    included: the approx style tells right from wrong as the plain one does."""
    ns: dict = {"pytest": pytest}
    source = verified_tests(world_task(), "approx")
    exec(source[source.index("def _same"):source.index("def test_")], ns)  # the module's two comparisons
    values = [0, 1, -1, 3, 10**12, 10**12 + 1, 0.0, 1.0, 3.0, 3.0000000001, 1e12, 1e12 + 1, True, False, None, "3",
              [1, 2], [1.0, 2.0], [1, 2.5], {"a": 1}, {"a": 1.0}, float("nan")]
    for got in values:
        for want in values:
            try:
                same = ns["_same"](got, want)
            except TypeError:
                same = False
            try:
                close = ns["_close"](got, want)
            except TypeError:
                close = False
            assert same == close, (got, want, same, close)


def world_task():
    from sage_pipeline.sim.schema import TaskRecord

    return TaskRecord("add-0000", "add", 0.1, "easy", "Add.", "def add(a: int, b: int) -> int", "add",
                      "def add(a, b):\n    return a + b\n", [{"args": [1, 2], "expected": 3}], 1.0)


def test_the_style_is_drawn_per_task_by_the_seed(world):
    t = world.tasks[0]
    assert style_for(0, t) == style_for(0, t) and tuple(WorldConfig().test_styles) == DEFAULT_TEST_STYLES
    drawn = {style_for(seed, t) for seed in range(200)}
    assert drawn == set(TEST_STYLES)  # every style is drawn for some seed
    assert {style_for(0, t, DEFAULT_TEST_STYLES) for t in world.tasks} <= set(DEFAULT_TEST_STYLES)
    assert style_for(0, t, ("plain",)) == "plain"
    no_args = dataclasses.replace(world_task(), signature="def add(*xs) -> int")
    assert style_for(0, no_args, ("raises",)) == "plain"  # raises needs a call that fails without arguments
    with pytest.raises(WorldError, match="no test style 'doctest'"):
        verified_tests(t, "doctest")
    with pytest.raises(ValueError, match="unknown test styles"):
        WorldConfig(test_styles=("doctest",))
    # the test engineer writes the drawn style, and says so in its truth record
    w = ModelWorld(world.sim, world.table, WorldConfig(seed=5, test_styles=TEST_STYLES))
    w.assign("te", t.task_id)
    reply, rec = w.answer("m", _msgs("Generate pytest tests for x.py.\nTASK: [sage-world run=te] x"))
    assert rec["test_style"] == style_for(5, t) and json.loads(reply)["patch"] == verified_tests(t, rec["test_style"])


def test_server_speaks_ollamas_api_and_counts_what_it_refuses(world):
    w = _fresh(world)
    w.assign("s1", w.tasks[0].task_id)
    with WorldServer(w) as srv:
        def post(path: str, body: object) -> tuple[int, dict]:
            req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        code, reply = post("/api/chat", {"model": "qwen2.5-coder:1.5b", "stream": False, "messages": _msgs(
            f"Generate a Task DAG for the following goal.\n\nGOAL: {goal('s1', 'p')}")})
        assert code == 200 and reply["done"] is True and reply["message"]["role"] == "assistant"
        assert reply["prompt_eval_count"] > 0 and reply["eval_count"] > 0 and reply["total_duration"] > 0
        code, reply = post("/api/chat", {"model": "m", "messages": _msgs("Tell me a joke")})
        assert code == 400 and "no SAGE agent" in reply["error"]
        code, reply = post("/api/chat", {"model": "", "messages": []})
        assert code == 400 and "'model'" in reply["error"]
        code, reply = post("/api/embeddings", {"model": "nomic-embed-text", "prompt": "abc def"})
        assert code == 200 and reply["embedding"] == embedding("abc def") and len(reply["embedding"]) == 64
        with urllib.request.urlopen(srv.url + "/api/tags", timeout=30) as r:
            names = {m["name"] for m in json.loads(r.read())["models"]}
        assert {"qwen2.5-coder:1.5b", "codestral:22b", "qwen2.5-coder:14b-instruct-q4_K_M"} <= names
        assert srv.requests["chat"] == 3 and sum(srv.errors.values()) == 2  # every request counted, refusals too
        assert any("no SAGE agent" in k for k in srv.errors)


def test_a_table_naming_a_model_without_figures_is_refused(world, tmp_path):
    bad = tmp_path / "models.yaml"
    bad.write_text(SAGE_TABLE.read_text().replace('primary: "codestral:22b"', 'primary: "llama-9000"'))
    with pytest.raises(WorldError, match=r"routing\.debugger names 'llama-9000'.*add an alias"):
        ModelWorld(world.sim, RoutingTable.load(bad))


class Coin(T.SagePolicy):
    """The debugger's and the reviewer's model by a fair coin (as an exploring checkpoint is random)."""

    def p_fallback(self, role: str, complexity: float, failure_count: int) -> float:
        return 0.5 if role in ("debugger", "reviewer") else super().p_fallback(role, complexity, failure_count)


def _simulate(w: ModelWorld, task: int, coder: str, c: float, policy: T.SagePolicy, rng) -> tuple[float, bool]:
    """One run of SAGE's flow (truth.py's docstring) by drawing, not by expectation."""
    t = w.tasks[task]
    right = rng.random() < w.p_code(task, coder)
    slot = -1 if right else int(rng.integers(len(t.wrong_candidates())))
    tests, total, k = False, 0.0, 0
    rev = w.row("reviewer")

    def says_pass(k: int) -> bool:
        m = rev[int(rng.random() < policy.p_fallback("reviewer", c, k))]
        acc = w.review_accuracy(task, m)
        return (slot == -1) == (rng.random() < acc)

    while True:
        passed = says_pass(k)
        if passed and not tests:  # the first PASS: the test engineer writes tests, the reviewer looks again
            tests, passed = True, says_pass(k)
        if not passed:
            total += 0.3 - 0.15 - (0.1 if k >= MAX_RETRIES else 0)
        elif slot == -1:
            return total + 1.15, True
        else:
            total += 0.0 if k == 0 else (-0.1 if k >= MAX_RETRIES else -0.15)
        k += 1
        if k > MAX_RETRIES:
            return total, False
        m = w.row("debugger")[int(rng.random() < policy.p_fallback("debugger", c, k))]
        if slot != -1 and rng.random() < w.p_fix(task, slot, m):
            slot = -1


def test_exact_value_matches_drawn_runs(world):
    """truth.run_value is the expectation of the flow it describes (checked by drawing 4,000 runs),
    for SAGE's YAML and for a policy that explores."""
    w = _fresh(world)
    rng = np.random.default_rng(0)
    yaml = T.SagePolicy(w.table)
    coin = Coin(w.table, name="coin")
    for policy in (yaml, coin):
        for task in (0, 5):
            v = T.run_value(w, task, "qwen2.5-coder:1.5b", 0.1, policy)
            draws = np.array([_simulate(w, task, "qwen2.5-coder:1.5b", 0.1, policy, rng) for _ in range(4000)])
            assert abs(draws[:, 0].mean() - v.ret) < 4 * draws[:, 0].std() / np.sqrt(4000) + 1e-3
            assert abs(draws[:, 1].mean() - v.p_verified) < 4 * np.sqrt(0.25 / 4000)


def test_best_expressible_is_never_below_yaml_or_any_fixed_choice(world):
    w = _fresh(world)
    runs = [{"task_id": t.task_id, "coder_model": "qwen2.5-coder:1.5b", "complexity": 0.05 + 0.01 * (i % 3)}
            for i, t in enumerate(w.tasks)]
    yaml = T.policy_value(w, runs, T.SagePolicy(w.table)).ret
    _, best = T.best_expressible(w, runs)
    _, by_fc = T.best_expressible(w, runs, by_complexity=False)
    _, debugger_only = T.best_expressible(w, runs, by_complexity=False, roles=("debugger",))
    always_primary = T._LookupPolicy(w.table, None, 1.0, "p", tuple((("debugger", None, k), 0) for k in range(1, 6)),
                                     False)
    assert best.ret >= by_fc.ret - 1e-12 >= debugger_only.ret - 1e-12 >= yaml - 1e-12
    assert debugger_only.ret >= T.policy_value(w, runs, always_primary).ret - 1e-12
    # the reviewer's model matters in the world (its accuracy): the best policy beats YAML
    assert best.ret > yaml


def test_sage_install_errors_say_how_to_install(tmp_path, monkeypatch):
    monkeypatch.delenv("SAGE_PYTHON", raising=False)
    with pytest.raises(SageNotFound, match="SAGE_PYTHON is unset: install SAGE with `scripts/sage_venv.sh"):
        SageInstall.find()
    with pytest.raises(SageNotFound, match="no `sage` script beside it"):
        SageInstall.find(tmp_path / "python")


def _fake_sage(tmp_path: Path, body: str) -> SageInstall:
    """A stand-in `sage` script (a shell script) beside a Python, to exercise the harness without SAGE."""
    bindir = tmp_path / "fake" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "python").symlink_to(sys.executable)
    cli = bindir / "sage"
    cli.write_text("#!/bin/sh\n" + body)
    cli.chmod(0o755)
    return SageInstall(bindir / "python", cli, SAGE_TABLE)


def test_a_failed_or_hung_run_is_counted_with_its_cause_and_the_day_goes_on(world, tmp_path):
    from sage_pipeline.sage_world.harness import HarnessConfig, run_day

    install = _fake_sage(tmp_path, 'case "$5" in\n'
                                   '  *d01-r000*) echo "Traceback: boom" >&2; exit 3 ;;\n'
                                   '  *d01-r001*) sleep 30 ;;\n'
                                   '  *) echo done ;;\n'
                                   'esac\n')
    w = _fresh(world)
    ids = [t.task_id for t in w.tasks[:4]]
    # a stand-in `sage` script cannot be imported: each run as a process of its own (the launcher's own
    # failures and timeouts are tested in test_sage_launcher.py)
    day = run_day(w, "http://127.0.0.1:9", install, 1, ids, tmp_path / "day",
                  HarnessConfig(workers=2, run_timeout_s=2, fresh_process=True))
    assert day.summary()["runs"] == 4 and day.finished == 2
    assert day.failures == {"exit 3: Traceback: boom": 1, "killed after the 2 s limit": 1}
    assert (tmp_path / "day" / "runs" / "d01-r000.log").read_text().count("boom") == 1
    with pytest.raises(FileExistsError, match="is not empty: each day runs SAGE in fresh workspaces"):
        run_day(w, "http://127.0.0.1:9", install, 1, ids, tmp_path / "day")


def test_loop_settings_are_checked_before_anything_runs():
    from pydantic import ValidationError

    from sage_pipeline.sage_world.loop import LoopConfig

    with pytest.raises(ValidationError, match="days"):
        LoopConfig(days=0)
    with pytest.raises(ValidationError, match="pool"):
        LoopConfig(pool=5)  # fewer tasks than task families
    with pytest.raises(ValidationError, match="exploration_rate"):
        LoopConfig(exploration_rate=0.9)


def test_the_dagster_job_without_sage_fails_saying_how_to_install_it(tmp_path, monkeypatch):
    import dagster as dg

    from sage_pipeline.defs.resources import SageResource
    from sage_pipeline.defs.sage_loop_assets import sage_loop

    monkeypatch.delenv("SAGE_PYTHON", raising=False)
    result = dg.materialize([sage_loop], resources={"sage": SageResource(data_dir=str(tmp_path))},
                            instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "scripts/sage_venv.sh" in failure.event_specific_data.error.message
