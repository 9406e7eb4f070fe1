"""make run's driver (scripts/materialize_all.py): its five steps cover the graph make run promises, each asset
once; a step run in one process is the run `dagster asset materialize` makes; a failed step is named and ends it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections import defaultdict

import dagster as dg
import pytest

from sage_pipeline.definitions import defs
from sage_pipeline_tests.ui import _support as sup

sys.path.insert(0, str(sup.REPO / "scripts"))
import materialize_all as m  # noqa: E402
import run_summary  # noqa: E402


def test_the_steps_materialize_every_asset_make_run_promises_each_once():
    graph = defs.resolve_asset_graph()
    promised = {k for k in graph.get_all_asset_keys() if graph.get(k).group_name not in run_summary.ON_DEMAND}
    plan = m.steps(3)
    assert [s.title.split()[0] for s in plan] == ["1/5", "2/5", "3/5", "4/5", "4/5", "4/5", "5/5"]
    owners: dict[dg.AssetKey, list[m.Step]] = defaultdict(list)
    for step in plan:
        keys = dg.AssetSelection.from_string(step.select).resolve(graph)
        assert keys, f"{step.title}: selects nothing"
        partitioned = {graph.get(k).partitions_def is not None for k in keys}
        assert partitioned == {step.partition is not None or step.partition_range is not None}, step
        for k in keys:
            owners[k].append(step)
    for k, mine in owners.items():  # in one step, or in one step per night (the same selection, other partitions)
        if len(mine) > 1:
            assert len({s.select for s in mine}) == 1 and None not in {s.partition for s in mine}, (k, mine)
            assert len({s.partition for s in mine}) == len(mine), (k, mine)
    assert set(owners) == promised, {"missing": promised - set(owners), "extra": set(owners) - promised}
    assert len({s.partition for s in plan[3:6]}) == 3  # three different nights


def test_sleep_nights_must_be_a_whole_number(monkeypatch):
    monkeypatch.setenv("SLEEP_NIGHTS", "two")
    with pytest.raises(SystemExit, match="SLEEP_NIGHTS must be a whole number >= 0, got 'two'"):
        m._nights_from_env()
    monkeypatch.setenv("SLEEP_NIGHTS", "0")
    assert m._nights_from_env() == 0


def test_cli_args_are_the_dagster_commands():
    assert m.Step("t", "sandbox_rollouts", partition_range="a...b").cli_args() == [
        "--select", "sandbox_rollouts", "--partition-range", "a...b"]
    assert m.Step("t", "group:sleep_cycle", partition="2026-11-01").cli_args() == [
        "--select", "group:sleep_cycle", "--partition", "2026-11-01"]


def test_a_step_in_process_is_a_dagster_run_and_a_failed_step_is_named(tmp_path):
    home, data = tmp_path / "home", tmp_path / "data"
    home.mkdir()
    data.mkdir()
    (home / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(sup.REPO / "scripts")!r})
        import materialize_all as m
        m.run_in_process(m.Step("one", "key:decisions/decision_ledger"))
        m.steps = lambda n: [m.Step("the rollouts without tasks", "sandbox_rollouts", partition="shard-00")]
        print("RC", m.main([]))
    """)
    env = {**os.environ, "DAGSTER_HOME": str(home), "SAGE_DATA_DIR": str(data), "DAGSTER_DISABLE_TELEMETRY": "1"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=sup.REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    said = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0 and "RC 1" in proc.stdout, said
    assert "step 'the rollouts without tasks' failed" in proc.stderr, said
    with dg.DagsterInstance.from_config(str(home)) as instance:
        runs = instance.get_runs()
        assert [r.status for r in reversed(runs)] == [dg.DagsterRunStatus.SUCCESS, dg.DagsterRunStatus.FAILURE]
        assert runs[0].tags.get("dagster/partition") == "shard-00"  # the tags the CLI gives a partition
        assert instance.fetch_materializations(dg.AssetKey(["decisions", "decision_ledger"]), limit=1).records


def test_without_a_dagster_home_it_says_what_to_set(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("DAGSTER_HOME", raising=False)
    assert m.main([]) == 2
    assert "DAGSTER_HOME='' is not a folder" in capsys.readouterr().err
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "missing"))
    assert m.main(["--cli"]) == 2
    assert "make run sets it to .dagster_home" in capsys.readouterr().err
