"""The recorded random assignment: exact integer probabilities, the launcher SAGE is started through
(under a hostile folder name, its values come back exactly and nothing runs), records joined by the
draw id SAGE copies into its journals, and bad plans and records named by file, line and field."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter

import pytest

from sage_pipeline.decisions import assign as A


def _fake_sage(folder):
    p = folder / "fake-sage"
    p.write_text('#!/bin/sh\nprintf "%s|%s|%s|%s\\n" "${SAGE_SKILLS_ROOT:-}" "${SAGE_MODELS_YAML:-}" '
                 '"$SAGE_TRACE_ID" "$*"\n')
    p.chmod(0o755)
    return p


def test_thresholds_are_exact_and_sum_to_two_to_the_32():
    t = A.thresholds([0.1, 0.2, 0.7])
    assert sum(t) == A.SCALE and all(isinstance(x, int) for x in t)
    with pytest.raises(A.AssignError, match="sum to 1"):
        A.thresholds([0.5, 0.4])
    with pytest.raises(A.AssignError, match="> 0"):
        A.thresholds([1.0, 0.0])


def test_draws_follow_the_thresholds():
    plan = A.make_plan({"coder": [("a", "coder-0001", 0.25, {}), ("b", None, 0.75, {})]})
    a = plan.levers["coder"][0].threshold
    assert A.draw(plan, {"coder": a - 1})["coder"].name == "a"
    assert A.draw(plan, {"coder": a})["coder"].name == "b"
    assert A.draw(plan, {"coder": A.SCALE - 1})["coder"].name == "b"
    with pytest.raises(A.AssignError, match="outside"):
        A.draw(plan, {"coder": A.SCALE})


def test_a_plan_may_only_set_what_sage_reads_for_a_lever():
    with pytest.raises(ValueError, match="not a variable SAGE reads"):
        A.make_plan({"coder": [("a", None, 1.0, {"LD_PRELOAD": "/tmp/x.so"})]})
    with pytest.raises(ValueError, match="NUL"):
        A.make_plan({"coder": [("a", None, 1.0, {"SAGE_MODELS_YAML": "/x\0y"})]})
    with pytest.raises(A.AssignError, match="not a variable SAGE reads"):
        A.launcher_text(A.make_plan({"coder": [("a", None, 1.0, {})]}), "/r", base_env={"LD_PRELOAD": "/x.so"})


def test_a_value_with_a_newline_is_exported_as_it_is_and_runs_nothing(tmp_path):
    """(A lever of one arm, probability 1: the script draws without a test.)"""
    value = "/x\nexport LD_PRELOAD=/y\n$(touch pwned)"
    plan = A.make_plan({"coder": [("a", None, 1.0, {"SAGE_MODELS_YAML": value})]})
    sage = tmp_path / "fake-sage"
    sage.write_text('#!/bin/sh\nprintf "%s|%s" "$SAGE_MODELS_YAML" "${LD_PRELOAD:-}"\n')
    sage.chmod(0o755)
    out = subprocess.run([str(A.write_launcher(tmp_path, plan, sage=str(sage)))], capture_output=True, text=True,
                         check=True, cwd=tmp_path, env={"PATH": os.environ["PATH"]}).stdout
    assert out == value + "|" and not list(tmp_path.rglob("pwned*"))


def test_the_launcher_sets_a_whole_environment_and_records_elsewhere(tmp_path):
    """base_env and unset give every run the deployment's environment, the arm overriding its lever's
    variable only; records_dir puts the records where they outlive the launcher's folder."""
    here, records = tmp_path / "version", tmp_path / "root with 'q' $(x)"
    here.mkdir()
    records.mkdir()
    plan = A.make_plan({"coder": [("pin", "coder-0001", 0.5, {"SAGE_MODELS_YAML": "/arm.yaml"}),
                                  ("incumbent", None, 0.5, {})]})
    launcher = A.write_launcher(here, plan, sage=str(_fake_sage(tmp_path)), records_dir=records,
                                base_env={"SAGE_MODELS_YAML": "/base.yaml", "SAGE_SKILLS_ROOT": "/skills"},
                                unset=["SAGE_RL_POLICY"])
    seen = {}
    for _ in range(40):
        out = subprocess.run([str(launcher)], capture_output=True, text=True, check=True, cwd=tmp_path,
                             env={"PATH": os.environ["PATH"], "SAGE_RL_POLICY": "1"}).stdout.rstrip("\n")
        skills, models, trace, _ = out.split("|")
        assert skills == "/skills" and models in ("/arm.yaml", "/base.yaml")
        seen[trace] = models
    assert set(seen.values()) == {"/arm.yaml", "/base.yaml"}
    assert not (here / A.RECORDS_NAME).exists()
    got, bad = A.read_records(records / A.RECORDS_NAME, {plan.id: plan})
    assert bad == [] and {d: r["levers"]["coder"]["arm"] for d, r in got.items()} == {
        d: "pin" if m == "/arm.yaml" else "incumbent" for d, m in seen.items()}
    assert A.load_plan(here / A.PLAN_NAME) == plan


def test_the_launcher_under_a_hostile_folder_name_draws_records_and_runs_sage(tmp_path):
    root = tmp_path / "deploy $(touch pwned) `id` 'q\" x"
    root.mkdir()
    live, cand = str(root / "v1"), str(root / "v2 $(touch pwned2)")
    plan = A.make_plan({"skills": [("live", None, 0.5, {"SAGE_SKILLS_ROOT": live}),
                                   ("cand", "skills-0001", 0.5, {"SAGE_SKILLS_ROOT": cand})],
                        "coder": [("pin", "coder-0001", 0.8, {"SAGE_MODELS_YAML": str(root / "m.yaml")}),
                                  ("bandit", None, 0.2, {})]})
    launcher = A.write_launcher(root, plan, sage=str(_fake_sage(tmp_path)))
    seen = Counter()
    traces = {}
    for _ in range(120):
        out = subprocess.run([str(launcher), "build a thing"], capture_output=True, text=True, check=True,
                             cwd=tmp_path).stdout.rstrip("\n")
        skills, models, trace, args = out.split("|")
        assert args == "run build a thing"
        assert skills in (live, cand) and models in ("", str(root / "m.yaml"))
        seen[(skills == cand, bool(models))] += 1
        traces[trace] = (skills, models)
    assert not list(tmp_path.rglob("pwned*"))  # nothing in a name ran
    assert all(v > 0 for v in seen.values()) and len(seen) == 4  # every combination of the two levers
    records, bad = A.read_records(root / A.RECORDS_NAME, {plan.id: plan})
    assert bad == [] and set(records) == set(traces)  # one whole line per run, joined by SAGE_TRACE_ID
    for did, r in records.items():
        skills, models = traces[did]
        assert r["levers"]["skills"]["arm"] == ("cand" if skills == cand else "live")
        assert r["levers"]["skills"]["probability"] == 0.5
        assert r["levers"]["coder"]["arm"] == ("pin" if models else "bandit")
    assert A.load_plan(root / A.PLAN_NAME) == plan


def test_bad_records_are_named_by_file_and_line(tmp_path):
    plan = A.make_plan({"coder": [("a", None, 0.5, {}), ("b", None, 0.5, {})]})
    A.record(tmp_path, plan, {"coder": plan.levers["coder"][0]}, "d1", "2026-12-01T00:00:00Z")
    with open(tmp_path / A.RECORDS_NAME, "a") as fh:
        fh.write("not json\n")
        fh.write(json.dumps({"plan": plan.id, "draw": "d3", "arms": {"coder": {"arm": "a", "threshold": 7}}}) + "\n")
        fh.write(json.dumps({"plan": "nope", "draw": "d4", "arms": {}}) + "\n")
    records, bad = A.read_records(tmp_path / A.RECORDS_NAME, {plan.id: plan})
    assert list(records) == ["d1"]
    assert [b.split(": ", 1)[0].rsplit(":", 1)[1] for b in bad] == ["2", "3", "4"]
    assert "not JSON" in bad[0] and "does not match its plan" in bad[1] and "'nope'" in bad[2]
    (tmp_path / "plan.json").write_text(json.dumps({"levers": {"coder": [{"name": "a", "threshold": 5}]}}))
    with pytest.raises(A.AssignError, match=r"plan\.json: field 'levers'"):
        A.load_plan(tmp_path / "plan.json")
    assert os.access(tmp_path, os.W_OK)
