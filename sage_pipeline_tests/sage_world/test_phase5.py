"""SAGE's own Phase-5 tools (``sage rl export / train-bc / train-cql / eval-offline``) run on journals,
their claim beside the model world's truth (``sage_world/phase5.py``).

The first tests need no SAGE: a fake ``sage`` script stands in for SAGE's CLI to check what is recorded
when a tool fails, hangs or writes the wrong thing, and that a missing log folder is said. The rest run
SAGE's real tools from SAGE_PYTHON (skipped or failed by the rule in sage_contract/sage_journals.py): on
journals SAGE's own ``sage run`` wrote against the model world (eight runs, two workspaces), and on
journals SAGE's own functions wrote (enough rows for SAGE's CQL to fit Q models), where SAGE's router's
choices with each trained checkpoint are compared with the policy the truth values.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import joblib
import numpy as np
import pytest

from sage_pipeline import artifacts
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sage_world import phase5, truth as T
from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, run_day
from sage_pipeline.sage_world.server import WorldServer
from sage_pipeline.sage_world.world import WorldConfig, build_world

RUNS = 8


# ------------------------------------------------------------------ without SAGE: a fake `sage` script
def _fake_sage(tmp_path: Path, behaviour: dict[str, str]) -> Path:
    """A folder with ``python`` and a ``sage`` script (the project's interpreter) that acts per tool:
    ``behaviour[tool]`` is Python run with ``out`` (the --out/--output path), ``argv`` and ``record`` (it
    appends the tool's environment to env.jsonl beside the script)."""
    bindir = tmp_path / "fakesage"
    bindir.mkdir()
    (bindir / "python").symlink_to(sys.executable)
    cases = "\n".join(f"if tool == {tool!r}:\n" + textwrap.indent(code, "    ") for tool, code in behaviour.items())
    script = f"""#!{sys.executable}
import json, os, sys, time
from pathlib import Path
argv = sys.argv[1:]
tool = argv[1]
opt = lambda k: argv[argv.index(k) + 1] if k in argv else None
out = Path(opt("--out") or opt("--output") or "none")
with open({str(bindir / "env.jsonl")!r}, "a") as fh:
    fh.write(json.dumps({{"tool": tool, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}}) + "\\n")
{cases}
"""
    (bindir / "sage").write_text(script)
    (bindir / "sage").chmod(0o755)
    return bindir / "python"


EXPORT_OK = """
rows = [{"agent_role": "reviewer", "task_complexity_score": 0.2, "primary_failure_count": 0, "action_fallback": 0,
         "reward": 1.15}, {"agent_role": "reviewer", "task_complexity_score": 0.3, "primary_failure_count": 0,
         "action_fallback": 1, "reward": 0.55}]
out.write_text("".join(json.dumps(r) + "\\n" for r in rows))
Path(str(out) + ".meta.json").write_text(json.dumps({"row_count": 2}))
print(json.dumps({"row_count": 2}))
"""
CQL_OK = """
import joblib
joblib.dump({"kind": "cql_ridge", "models": {}, "pessimism_lambda": 0.15}, out)
print(json.dumps({"status": "ok"}))
"""
EVAL_OK = """
out.write_text(json.dumps({"rows": 2, "static_mean_reward": 0.85, "policy_mean_reward": 0.0, "delta": -0.85,
                           "checkpoint": opt("--checkpoint"), "min_confidence": float(opt("--min-confidence"))}))
"""
BC_FAILS = """
sys.stderr.write("Traceback (most recent call last):\\n  ...\\nValueError: This solver needs samples of at least 2 "
                 "classes in the data, but the data contains only one class: 0\\n")
sys.exit(1)
"""


def _journals(tmp_path: Path) -> Path:
    d = tmp_path / "ws-0" / "memory" / "sessions"
    d.mkdir(parents=True)
    (d / "2026-11-28.log").write_text('{"type": "TRAJECTORY_STEP"}\n')
    return d


def test_a_tool_exiting_non_zero_is_recorded_with_its_cause_and_the_others_go_on(tmp_path):
    py = _fake_sage(tmp_path, {"export": EXPORT_OK, "train-bc": BC_FAILS, "train-cql": CQL_OK, "eval-offline": EVAL_OK})
    yaml = tmp_path / "models.yaml"
    yaml.write_text("routing: {}\n")
    res = phase5.run_tools(py, [_journals(tmp_path)], tmp_path / "night", min_confidence=0.3, models_yaml=yaml)
    assert res["rows_exported"] == 2 and res["export"]["meta"] == {"row_count": 2}
    bc = res["train"]["bc"]
    assert bc["status"] == "failed" and bc["returncode"] == 1
    assert bc["cause"].startswith("exit 1: ValueError: This solver needs samples of at least 2 classes")
    assert "Traceback" in bc["stderr_tail"] and "checkpoint" not in bc
    assert res["eval"]["bc"]["status"] == "skipped" and res["eval"]["bc"]["cause"] == "train-bc failed: no checkpoint"
    cql = res["train"]["cql"]
    assert cql["status"] == "ok" and cql["sha256"] == artifacts.file_sha256(cql["checkpoint"])
    assert Path(cql["checkpoint"]) == tmp_path / "night" / "cql" / "policy.joblib"
    ev = res["eval"]["cql"]
    assert ev["status"] == "ok" and ev["claim"] == {"rows": 2, "static_mean_reward": 0.85, "policy_mean_reward": 0.0,
                                                    "delta": -0.85}
    assert ev["json"]["min_confidence"] == 0.3 and "--min-confidence" in ev["argv"]
    assert all(t["seconds"] >= 0 for t in (res["export"], bc, cql, ev))
    assert res["ok"] is False and set(res["failed"]) == {"train-bc", "eval-offline bc"}
    assert json.loads((tmp_path / "night" / phase5.RESULT_NAME).read_text())["failed"] == res["failed"]
    # each tool ran in the night's folder with an environment built from scratch
    calls = [json.loads(ln) for ln in (py.parent / "env.jsonl").read_text().splitlines()]
    assert [c["tool"] for c in calls] == ["export", "train-bc", "train-cql", "eval-offline"]
    for c in calls:
        env = c["env"]
        assert "PYTHONPATH" not in env and "VIRTUAL_ENV" not in env and c["cwd"] == str(tmp_path / "night")
        assert env["HOME"].startswith(str(tmp_path / "night")) and env["SAGE_RL_MIN_CONFIDENCE"] == "0.3"
        assert env["SAGE_MODELS_YAML"] == str(yaml.resolve()) and env["PATH"].startswith(str(tmp_path / "night"))


def test_a_missing_log_dir_is_said_and_nothing_runs_on_no_journals(tmp_path):
    py = _fake_sage(tmp_path, {"export": EXPORT_OK})
    gone = tmp_path / "day-01" / "ws-0" / "memory" / "sessions"
    res = phase5.run_tools(py, [gone], tmp_path / "night")
    assert res["export"]["status"] == "skipped" and str(gone) in res["export"]["cause"]
    assert "do not exist" in res["export"]["cause"] and res["journals"]["missing_log_dirs"] == [str(gone)]
    assert {k: t["status"] for k, t in res["train"].items()} == {"bc": "skipped", "cql": "skipped"}
    assert res["train"]["bc"]["cause"] == "export skipped: no dataset" and res["rows_exported"] is None
    assert not (py.parent / "env.jsonl").exists()  # no tool was started
    # one folder missing among others: the others are exported and the missing one is said
    res = phase5.run_tools(py, [gone, _journals(tmp_path)], tmp_path / "night2")
    assert res["export"]["status"] == "ok" and res["rows_exported"] == 2 and str(gone) in res["export"]["cause"]


def test_a_tool_past_its_limit_is_killed_and_recorded(tmp_path):
    py = _fake_sage(tmp_path, {"export": EXPORT_OK, "train-bc": "time.sleep(60)", "train-cql": "out.write_bytes(b'x')",
                               "eval-offline": EVAL_OK})  # the others import nothing: well inside the limit
    res = phase5.run_tools(py, [_journals(tmp_path)], tmp_path / "night", config=phase5.Phase5Config(tool_timeout_s=3))
    bc = res["train"]["bc"]
    assert bc["status"] == "failed" and bc["returncode"] is None and 3 <= bc["seconds"] < 30
    assert bc["cause"] == "killed after the 3 s limit (Phase5Config.tool_timeout_s)"
    assert res["train"]["cql"]["status"] == "ok" and res["eval"]["cql"]["status"] == "ok"


def test_eval_output_without_sages_fields_and_a_missing_checkpoint_are_failures(tmp_path):
    py = _fake_sage(tmp_path, {"export": EXPORT_OK, "train-bc": "print('{}')", "train-cql": CQL_OK,
                               "eval-offline": "out.write_text(json.dumps({'rows': 2}))"})
    res = phase5.run_tools(py, [_journals(tmp_path)], tmp_path / "night")
    assert res["train"]["bc"]["status"] == "failed" and "was not written" in res["train"]["bc"]["cause"]
    ev = res["eval"]["cql"]
    assert ev["status"] == "failed" and "is not eval-offline's JSON" in ev["cause"]
    assert "static_mean_reward" in ev["cause"]


def test_a_used_work_dir_and_a_bad_floor_are_refused(tmp_path):
    (tmp_path / "night").mkdir()
    (tmp_path / "night" / "old.joblib").write_bytes(b"x")
    with pytest.raises(FileExistsError, match="is not empty: SAGE's tools write their checkpoints there"):
        phase5.run_tools(tmp_path / "python", [], tmp_path / "night")
    with pytest.raises(ValueError, match=r"min_confidence must lie in \[0, 1\]"):
        phase5.run_tools(tmp_path / "python", [], tmp_path / "other", min_confidence=1.5)


def test_journals_of_one_name_from_several_workspaces_are_joined_under_sages_name(tmp_path):
    a, b = tmp_path / "ws-0", tmp_path / "ws-1"
    a.mkdir(), b.mkdir()
    (a / "2026-11-28.log").write_text('{"n": 1}')  # no final newline (a killed writer)
    (b / "2026-11-28.log").write_text('{"n": 2}\n')
    (b / "2026-11-29.1.log").write_text('{"n": 3}\n')
    (b / "notes.txt").write_text("not a journal")
    got = phase5.merge_journals([a, b, tmp_path / "gone"], tmp_path / "logs")
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["2026-11-28.log", "2026-11-29.1.log"]
    assert (tmp_path / "logs" / "2026-11-28.log").read_text() == '{"n": 1}\n{"n": 2}\n'
    assert got["files"] == 2 and got["sources"] == 3 and got["missing_log_dirs"] == [str(tmp_path / "gone")]
    assert got["joined"] == {"2026-11-28.log": [str(a / "2026-11-28.log"), str(b / "2026-11-28.log")]}


class _Linear:
    """A stand-in for a fitted Ridge: w . x + b."""

    def __init__(self, w, b):
        self.w, self.b = np.asarray(w, dtype=float), float(b)

    def predict(self, x):
        return np.asarray(x, dtype=float) @ self.w + self.b


def test_sages_offline_eval_statistic_and_the_cql_adapter(tmp_path):
    """The CQL rule as SAGE's adapter computes it, and SAGE's eval statistic counted by hand: rows below the
    floor are dropped, a role without a model counts as confidence 0, no agreeing row gives 0.0."""
    role = phase5.CqlRidgeRole(_Linear([0.0, 0.0], 0.2), _Linear([2.0, 0.0], 0.0), 100.0, 4.0, 0.15)
    p = role.predict_proba([[0.1, 0], [0.9, 0]])[:, 1]
    margin = np.array([0.2, 1.8]) - 0.15 / 2 - (0.2 - 0.15 / 10)
    assert np.allclose(p, 1 / (1 + np.exp(-margin)))
    rows = [{"agent_role": "reviewer", "task_complexity_score": 0.1, "primary_failure_count": 0, "action_fallback": 0,
             "reward": 1.0},  # p 0.47: confidence 0.06, below 0.5: not counted
            {"agent_role": "reviewer", "task_complexity_score": 0.9, "primary_failure_count": 0, "action_fallback": 1,
             "reward": 0.4},  # p 0.83: fallback, agrees
            {"agent_role": "reviewer", "task_complexity_score": 0.95, "primary_failure_count": 0, "action_fallback": 0,
             "reward": 2.0},  # fallback, disagrees
            {"agent_role": "debugger", "task_complexity_score": 0.9, "primary_failure_count": 1, "action_fallback": 0,
             "reward": 0.1}]  # no model: confidence 0
    got = phase5.sage_offline_eval(rows, {"reviewer": role}, 0.5)
    assert got["rows"] == 4 and got["rows_confident"] == 2 and got["rows_counted"] == 1
    assert math.isclose(got["static_mean_reward"], 3.5 / 4) and math.isclose(got["policy_mean_reward"], 0.4)
    at_zero = phase5.sage_offline_eval(rows, {"reviewer": role}, 0.0)  # the debugger row: "primary", agrees
    assert at_zero["rows_counted"] == 3 and math.isclose(at_zero["policy_mean_reward"], (1.0 + 0.4 + 0.1) / 3)
    none = phase5.sage_offline_eval(rows[:1], {}, 0.5)
    assert none["rows_counted"] == 0 and none["policy_mean_reward"] == 0.0 and none["delta"] == -1.0


def test_load_trained_reads_both_kinds_and_says_why_it_cannot(tmp_path):
    table = RoutingTable.load(Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_world_run"
                              / "models.yaml")
    ck = tmp_path / "cql" / "policy.joblib"
    ck.parent.mkdir()
    joblib.dump({"kind": "cql_ridge", "pessimism_lambda": 0.15, "models": {
        "reviewer": {"q_models": {0: _Linear([0, 0], 0.0), 1: _Linear([0, 1], -1.0)}, "counts": {0: 50, 1: 50}},
        "debugger": {"q_models": {0: _Linear([0, 0], 0.0)}, "counts": {0: 50, 1: 0}}}}, ck)
    pol, info = phase5.load_trained(table, ck, 0.0)
    assert info["kind"] == "cql_ridge" and info["truth_load"]["ok"] is False
    assert "predict_proba" in info["truth_load"]["error"]  # the project's loader reads the file, not its Q models
    assert set(pol.models) == {"reviewer"} and pol.min_confidence == 0.0
    assert pol.p_fallback("reviewer", 0.2, 3) == 1.0 and pol.p_fallback("reviewer", 0.2, 0) == 0.0  # margin 2, -1
    bad = tmp_path / "bad" / "policy.joblib"
    bad.parent.mkdir()
    bad.write_bytes(json.dumps({"error": "joblib_dump_failed"}).encode())  # what SAGE's train-cql writes on failure
    pol, info = phase5.load_trained(table, bad, 0.55)
    assert pol is None and "its router keeps its YAML" in info["cause"]


# ------------------------------------------------------------------ SAGE's real tools
def _sage_export_keys(sage_python: str, paths: list[Path], home: Path) -> list[list]:
    """(session, role, timestamp) of every row SAGE's own exporter makes of these journal files, read
    in place (no merge), in SAGE's virtualenv."""
    code = ("import json, sys\nfrom pathlib import Path\n"
            "from sage.rl.export_dataset import export_routing_rows, load_all_events\n"
            "rows = export_routing_rows(load_all_events([Path(p) for p in json.loads(sys.argv[1])]))\n"
            "print(json.dumps([[r.session_id, r.agent_role, r.timestamp] for r in rows]))\n")
    out = subprocess.run([sage_python, "-c", code, json.dumps([str(p) for p in paths])], capture_output=True,
                         text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, cwd=home)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def night(sage_python, tmp_path_factory):
    """Eight `sage run`s against the model world (two workspaces, SAGE's table), then SAGE's tools on
    their journals and the judge on the same runs."""
    install = SageInstall.find(sage_python)
    root = tmp_path_factory.mktemp("phase5")
    world = build_world(install.models_yaml, n_tasks=24, task_seed=1, config=WorldConfig(clock_scale=0.0))
    with WorldServer(world) as srv:
        day = run_day(world, srv.url, install, 1, [t.task_id for t in world.tasks[:RUNS]], root / "day",
                      HarnessConfig(workers=2))
    assert day.finished == RUNS, day.failures
    runs = [r.to_dict() for r in day.runs]
    tools = phase5.run_tools(sage_python, day.sessions_dirs, root / "phase5", models_yaml=install.models_yaml)
    judged = phase5.judge(world, world.table, runs, tools, TaskObjective(), project_estimate={"estimate": 1.0})
    return install, world, day, runs, tools, judged


def _single_label_roles(rows: list[dict]) -> set[str]:
    """Roles with 4 rows or more (train-bc fits those) whose action_fallback is one value: scikit-learn's
    LogisticRegression refuses them, and SAGE's train-bc exits on the first."""
    labels: dict[str, set] = {}
    for r in rows:
        labels.setdefault(r["agent_role"], set()).add(r["action_fallback"])
    return {role for role, ls in labels.items() if len(ls) == 1 and sum(r["agent_role"] == role for r in rows) >= 4}


def test_sages_tools_run_on_sage_run_journals_and_the_export_is_sages_own(night, sage_python, tmp_path):
    install, world, day, runs, tools, judged = night
    assert tools["export"]["status"] == "ok" and tools["train"]["cql"]["status"] == "ok", tools["failed"]
    assert len(day.sessions_dirs) == 2 and tools["journals"]["joined"]  # both workspaces wrote <date>.log
    rows = phase5.read_export(tools["export"]["dataset"])
    ours = [[r["session_id"], r["agent_role"], r["timestamp"]] for r in rows]
    sages = _sage_export_keys(sage_python, [f for d in day.sessions_dirs for f in sorted(d.glob("*.log"))], tmp_path)
    assert tools["rows_exported"] == tools["export"]["meta"]["row_count"] == len(sages) == len(ours) > 0
    assert sorted(ours) == sorted(sages)
    assert {s for s, _, _ in ours} <= {s for r in day.runs for s in r.sessions}
    bc = tools["train"]["bc"]
    if bc["status"] != "ok":  # SAGE's train-bc on `sage run` journals: the debugger's rows often carry one label
        assert _single_label_roles(rows) and "needs samples of at least 2 classes" in bc["cause"], bc
        assert tools["eval"]["bc"]["status"] == "skipped" and set(tools["failed"]) == {"train-bc", "eval-offline bc"}
    for kind in [k for k in ("bc", "cql") if tools["train"][k]["status"] == "ok"]:
        train, ev = tools["train"][kind], tools["eval"][kind]
        assert train["sha256"] == artifacts.file_sha256(train["checkpoint"]) and train["returncode"] == 0
        assert ev["json"] == json.loads(Path(ev["output"]).read_text())
        assert ev["claim"] == {k: ev["json"][k] for k in phase5.CLAIM_FIELDS} and ev["json"]["min_confidence"] == 0.55
        assert ev["claim"]["rows"] == tools["rows_exported"]


def test_what_sages_export_makes_of_sage_run_journals(night):
    """The three facts of SAGE's code the module doc states, on SAGE's own output: a row's model is the
    coder's (the world saw which model the coder ran), every row's reward is its step's reward plus one
    shift shared by the whole export (the task_id every plan uses is task_001), and a debugger row's
    failure count is one below the one SAGE routed the debugger with."""
    install, world, day, runs, tools, judged = night
    rows = phase5.read_export(tools["export"]["dataset"])
    coder = {s: r["coder_model"] for r in runs for s in r["sessions"]}
    assert all(r["model_chosen"] == coder[r["session_id"]] for r in rows)
    assert all(r["action_fallback"] == int(r["model_chosen"] == r["fallback_model"]) for r in rows)
    assert {r["task_id"] for r in rows} == {"task_001"} and len(coder) == RUNS
    steps, routed = {}, {}
    for d in day.sessions_dirs:
        for f in sorted(d.glob("*.log")):
            for ln in f.read_text().splitlines():
                ev = json.loads(ln) if ln.startswith("{") else {}
                if ev.get("type") == "TRAJECTORY_STEP":
                    steps[ev["session_id"], ev["timestamp"]] = float(ev["reward"])
                elif ev.get("type") == "MODEL_ROUTING_DECISION" and ev["agent_role"] == "debugger":
                    routed.setdefault(ev["session_id"], []).append(ev["primary_failure_count"])
    shifts = {round(r["reward"] - steps[r["session_id"], r["timestamp"]], 9) for r in rows}
    assert len(shifts) == 1, shifts
    dbg = [r for r in rows if r["agent_role"] == "debugger"]
    assert dbg and all(r["primary_failure_count"] + 1 in routed[r["session_id"]] for r in dbg)


def test_the_judge_sets_sages_claim_beside_the_exact_truth(night):
    install, world, day, runs, tools, judged = night
    assert judged["runs"] == RUNS and judged["runs_not_valued"] == 0 and judged["project"] == {"estimate": 1.0}
    yaml = T.policy_value(world, runs, T.SagePolicy(world.table))
    assert judged["yaml"]["return"] == yaml.ret and judged["yaml"]["p_verified"] == yaml.p_verified
    assert judged["yaml"]["objective"] == yaml.objective(TaskObjective())
    assert judged["baseline"]["return"] == yaml.ret  # no behaviour given: the data's policy is SAGE's YAML
    bc, cql = judged["checkpoints"]["bc"], judged["checkpoints"]["cql"]
    if bc["trained"]:
        assert bc["load"]["truth_load"] == {"ok": True} and bc["load"]["read_as"] == "truth.SagePolicy.load"
    else:
        assert bc["cause"] == f"train-bc gave no checkpoint: {tools['train']['bc']['cause']}" and "truth" not in bc
    assert cql["load"]["kind"] == "cql_ridge" and cql["load"]["read_as"].startswith("cql_ridge")
    for c in [x for x in (bc, cql) if x["trained"]]:
        assert all(math.isfinite(v) for v in [*c["truth"].values(), *c["true_delta"].values()])
        assert c["claim_reproduced"]["matches_sage"] is True, (c["claim"], c["claim_reproduced"])
        assert c["direction"]["claimed"] in (-1, 0, 1) and c["direction"]["true"] in (-1, 0, 1)
        assert c["true_delta"]["return_vs_baseline"] == pytest.approx(c["truth"]["return"] - yaml.ret, abs=1e-12)
    row = phase5.summary_row(judged)
    assert row["SAGE rows"] == tools["rows_exported"] and row["SAGE cql claim delta"] == round(cql["claim"]["delta"], 4)
    assert row["SAGE bc claim delta"] == (round(bc["claim"]["delta"], 4) if bc["trained"] else "not trained")
    assert json.loads((Path(tools["work_dir"]) / phase5.JUDGED_NAME).read_text())["runs"] == RUNS


def test_the_judge_records_a_missing_or_unloadable_checkpoint(night, tmp_path):
    install, world, day, runs, tools, judged = night
    bad = tmp_path / "policy.joblib"
    bad.write_bytes(b"not a joblib")
    broken = {**tools, "work_dir": None,
              "train": {"bc": {"status": "failed", "cause": "exit 1: ValueError: one class"},
                        "cql": {**tools["train"]["cql"], "checkpoint": str(bad)}}}
    got = phase5.judge(world, world.table, runs + [{"task_id": runs[0]["task_id"], "coder_model": None,
                                                    "complexity": None}], broken, TaskObjective())
    assert got["runs_not_valued"] == 1
    assert got["checkpoints"]["bc"] == {**got["checkpoints"]["bc"], "trained": False,
                                        "cause": "train-bc gave no checkpoint: exit 1: ValueError: one class"}
    cql = got["checkpoints"]["cql"]
    assert cql["served_as"] == "SAGE's YAML (its loader returns None)" and "joblib cannot load" in cql["load"]["cause"]
    assert cql["truth"]["return"] == got["yaml"]["return"]


@pytest.fixture(scope="module")
def rich_night(sage_python, sage_journals, tmp_path_factory):
    """Journals SAGE's own functions wrote, with enough rows for train-cql to fit Q models for a role."""
    sessions, _ = sage_journals(days=2, sessions_per_day=6, tasks=6)
    tools = phase5.run_tools(sage_python, [sessions], tmp_path_factory.mktemp("phase5_rich") / "night",
                             min_confidence=0.0)
    return tools


def _sage_selects(sage_python: str, checkpoint: str, floor: float, grid: list, home: Path) -> list[str]:
    code = ("import json, sys\nfrom sage.orchestrator.model_router import ModelRouter\n"
            "r = ModelRouter()\nprint(json.dumps([r.select(a, c, k) for a, c, k in json.loads(sys.argv[1])]))\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "SAGE_RL_POLICY": "1", "SAGE_RL_CHECKPOINT": checkpoint,
           "SAGE_RL_MIN_CONFIDENCE": repr(floor)}
    out = subprocess.run([sage_python, "-c", code, json.dumps(grid)], capture_output=True, text=True, timeout=300,
                         env=env, cwd=home)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_sages_router_serves_each_trained_checkpoint_as_the_truth_values_it(rich_night, sage_python, tmp_path):
    """For both of SAGE's checkpoint kinds, SAGE's own ModelRouter.select with SAGE_RL_CHECKPOINT picks,
    in every cell of a grid of roles, complexities and failure counts, the model the policy the truth
    values (phase5.load_trained) picks; and eval-offline's claim is what phase5.sage_offline_eval says."""
    tools = rich_night
    assert tools["ok"], tools["failed"]
    assert tools["train"]["cql"]["report"]["roles_trained"]  # Q models, not an empty checkpoint
    table = RoutingTable.load(SageInstall.find(sage_python).models_yaml)
    rows = phase5.read_export(tools["export"]["dataset"])
    grid = [[role, c, k] for role in ("planner", "reviewer", "debugger", "test_engineer", "documentation")
            for c in (0.0, 0.3, 0.8, 0.8000000000000002, 0.95) for k in range(6)]
    for kind in ("bc", "cql"):
        ck = tools["train"][kind]["checkpoint"]
        for floor in (0.0, 0.55):
            pol, info = phase5.load_trained(table, ck, floor)
            assert pol is not None, info
            home = tmp_path / f"{kind}-{floor}"
            home.mkdir()
            sage = _sage_selects(sage_python, ck, floor, grid, home)
            ours = []
            for role, c, k in grid:
                q = pol.p_fallback(role, c, k)
                assert q in (0.0, 1.0)  # SAGE's trained checkpoints are deterministic
                r = table.routes[role]
                ours.append(r.fallback if q else r.primary)
            assert ours == sage, f"{kind} at {floor}: {[(g, a, b) for g, a, b in zip(grid, ours, sage) if a != b][:5]}"
        claim = tools["eval"][kind]["claim"]
        rep = phase5.sage_offline_eval(rows, phase5.load_trained(table, ck, 0.0)[0].models, 0.0)
        assert rep["rows"] == claim["rows"] and rep["policy_mean_reward"] == pytest.approx(claim["policy_mean_reward"])
        assert rep["delta"] == pytest.approx(claim["delta"])
