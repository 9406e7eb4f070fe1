"""The deployment bundle: parts checked by sha256, bound to the table it was learned for, deployed as
one switch with a record; bad bundles and wrong targets refused with what differs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage import bandit_state, bundle as bd, checkpoint as sr, explore as se
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import NEVER, SAGE_TABLE, RoutingTable

BIG = "qwen2.5-coder:14b-instruct-q4_K_M"


@pytest.fixture(scope="module")
def sage_table() -> RoutingTable:
    return RoutingTable.load(SAGE_TABLE)


def _checkpoint(table: RoutingTable, out: Path, rate: float = 0.2) -> Path:
    ex = se.build_exploring(table, ActionSpace.build(table).binary(), se.ExploreConfig(rate=rate))
    sr.write_sage_checkpoint(out, ex, {"source": "test"})
    return out


@pytest.fixture()
def built(sage_table, tmp_path) -> bd.Bundle:
    new = sage_table.with_route("coder", primary=BIG, fallback=BIG, triggers=NEVER)
    return bd.build(tmp_path / "bundle", new, sage_table, objective=TaskObjective(),
                    checkpoint=_checkpoint(new, tmp_path / "ck"), bandit=bandit_state.warm_start("fallback"),
                    exploration={"rate": 0.2}, why="the coder on the 14B model")


def test_a_bundle_holds_every_part_with_its_hash_and_what_it_was_learned_for(built, sage_table):
    m = built.manifest
    assert set(m["parts"]) == {"models_yaml", "checkpoint", "bandit_state", "skills"} and m["parts"]["skills"] is None
    assert built.table.routes["coder"].primary == BIG
    assert sr.table_differences(built.learned_for, sage_table) == []
    assert m["objective"]["name"] == "task_v1" and m["why"] == "the coder on the 14B model"
    env = built.env()
    assert env["SAGE_MODELS_YAML"].endswith("models.yaml") and env["SAGE_RL_POLICY"] == "1"
    assert Path(env["SAGE_RL_CHECKPOINT"]).is_file()
    assert bandit_state.read(built.part("bandit_state"))["coder:fallback:standard"]["value_mean"] == 1.0
    assert bd.read(built.folder).id == built.id  # ids are the parts' hashes


def test_an_edited_part_is_refused(built):
    (built.folder / bd.MODELS_YAML).write_text((built.folder / bd.MODELS_YAML).read_text() + "\n# edited\n")
    with pytest.raises(bd.BundleError, match="part 'models_yaml'.*changed since the bundle was built"):
        bd.read(built.folder)


def test_not_a_bundle_and_a_bad_manifest(tmp_path):
    with pytest.raises(bd.BundleError, match="is not a bundle"):
        bd.read(tmp_path)
    (tmp_path / bd.MANIFEST).write_text("{not json")
    with pytest.raises(bd.BundleError, match="not JSON"):
        bd.read(tmp_path)
    (tmp_path / bd.MANIFEST).write_text(json.dumps({"format": 1, "id": "x", "parts": {}}))
    with pytest.raises(bd.BundleError, match="'learned_for' is missing"):
        bd.read(tmp_path)
    (tmp_path / bd.MANIFEST).write_text(json.dumps({"format": 1, "id": "x", "learned_for": {}, "objective": {},
                                                    "parts": {"models_yaml": {"path": "models.yaml"}}}))
    with pytest.raises(bd.BundleError, match="bundle.json: .*field 'parts.models_yaml.sha256' is missing"):
        bd.read(tmp_path)


def test_a_checkpoint_for_another_table_is_refused(sage_table, tmp_path):
    ck = _checkpoint(sage_table, tmp_path / "ck")
    other = sage_table.with_route("reviewer", primary=BIG)
    with pytest.raises(ValueError, match="reviewer"):
        bd.build(tmp_path / "b", other, sage_table, objective=TaskObjective(), checkpoint=ck)
    assert not (tmp_path / "b").exists()


def test_deploy_switches_env_and_current_and_records_it(built, sage_table, tmp_path):
    root, ws, data = tmp_path / "deploy", tmp_path / "ws", tmp_path / "data"
    line = bd.deploy(built, root, target=sage_table, workspaces=(ws,), data_dir=data)
    env = bd.read_env_file(root / bd.ENV_FILE)
    version = root / "versions" / built.id
    assert env["SAGE_MODELS_YAML"] == str(version / "models.yaml")
    assert env["SAGE_RL_CHECKPOINT"] == str(version / "checkpoint" / "policy.joblib")
    assert (root / "current").resolve() == version.resolve()
    assert bandit_state.read(ws / "memory" / "rl" / "ucb_bandit.json") == bandit_state.warm_start("fallback")
    deps = se.read_deployments(se.deployments_path(data))
    assert len(deps) == 1 and deps[0].sha256 == built.manifest["parts"]["checkpoint"]["policy_sha256"]
    assert [json.loads(x)["bundle"] for x in (root / bd.RECORD).read_text().splitlines()] == [built.id]
    assert line["env"] == env
    # the same bundle again, now that SAGE runs its table: allowed
    bd.deploy(built, root, target=built.table)


def test_deploy_to_a_sage_running_another_table_is_refused_naming_the_difference(built, sage_table, tmp_path):
    other = sage_table.with_route("debugger", primary="llama3:8b")
    with pytest.raises(bd.BundleRefused, match="debugger.*codestral:22b.*llama3:8b") as err:
        bd.deploy(built, tmp_path / "deploy", target=other)
    assert len(err.value.differences) == 1
    assert not (tmp_path / "deploy").exists()


def test_a_bundle_without_a_checkpoint_unsets_sages_router_variables(sage_table, tmp_path):
    b = bd.build(tmp_path / "b", sage_table, sage_table, objective=TaskObjective())
    bd.deploy(b, tmp_path / "d", target=sage_table)
    text = (tmp_path / "d" / bd.ENV_FILE).read_text()
    assert "unset SAGE_RL_POLICY" in text and "SAGE_RL_CHECKPOINT=" not in text


def test_target_table_without_sage_reads_sages_override_order(sage_table, tmp_path):
    p = sage_table.with_route("coder", primary=BIG).write(tmp_path / "m.yaml")
    assert bd.target_table(env={"SAGE_MODELS_YAML": str(p)}).routes["coder"].primary == BIG
    user = tmp_path / "xdg" / "sage" / "models.yaml"
    sage_table.write(user)
    assert bd.target_table(env={"XDG_CONFIG_HOME": str(tmp_path / "xdg")}).source == str(user)
    with pytest.raises(bd.BundleError, match="--sage-python"):
        bd.target_table(env={"HOME": str(tmp_path / "nohome")})


def test_cli_deploy_and_its_refusal(built, sage_table, tmp_path, capsys):
    assert bd.main(["deploy", str(built.folder), str(tmp_path / "d"), "--target-env", str(tmp_path / "none"),
                    "--sage-python", ""]) == 2
    assert "--sage-python" in capsys.readouterr().err
    env_file = tmp_path / "target.env"
    other = sage_table.with_route("planner", primary=BIG).write(tmp_path / "p.yaml")
    env_file.write_text(f"export SAGE_MODELS_YAML={other}\n")
    assert bd.main(["deploy", str(built.folder), str(tmp_path / "d"), "--target-env", str(env_file),
                    "--sage-python", ""]) == 2
    assert "planner" in capsys.readouterr().err
    env_file.write_text(f"export SAGE_MODELS_YAML={SAGE_TABLE}\n")
    assert bd.main(["deploy", str(built.folder), str(tmp_path / "d"), "--target-env", str(env_file),
                    "--sage-python", ""]) == 0
    assert "start SAGE with: ." in capsys.readouterr().out


def test_bandit_state_files_are_read_as_sage_would_and_errors_name_the_field(tmp_path):
    p = tmp_path / "ucb_bandit.json"
    assert bandit_state.read(p) == {}
    p.write_text(json.dumps({"coder:primary:standard": {"count": 2, "value_mean": 0.5}}))  # SAGE accepts bare stats
    assert bandit_state.read(p)["coder:primary:standard"]["count"] == 2.0
    p.write_text(json.dumps({"stats": {"coder:primary:standard": {"count": "x"}}}))
    with pytest.raises(ValueError, match="stats.coder:primary:standard.count"):
        bandit_state.read(p)
    p.write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        bandit_state.read(p)
    with pytest.raises(ValueError, match="side must be"):
        bandit_state.warm_start("both")
    with pytest.raises(ValueError, match="coder strategy keys"):
        bandit_state.write(p, {"planner:x": {"count": 1, "value_mean": 1}})


def test_warm_start_keeps_sages_ucb_on_its_side_for_many_verdicts():
    for side in bandit_state.SIDES:
        st = bandit_state.warm_start(side, count=10_000)
        for _ in range(2000):  # the worst case: the pinned side's verdicts all FAIL (score 0.3)
            key = bandit_state.select(st, list(bandit_state.KEYS))
            assert bandit_state.side_of(key) == side
            bandit_state.update(st, key, 0.3)


def test_a_pinned_coder_keeps_a_checkpoint_written_for_the_table(sage_table, tmp_path):
    # SAGE never asks the checkpoint about the coder: pinning it by models.yaml leaves the checkpoint valid
    from sage_pipeline.sage.table import pin

    ck = _checkpoint(sage_table, tmp_path / "ck")
    b = bd.build(tmp_path / "b", pin(sage_table, "coder", BIG), sage_table, objective=TaskObjective(), checkpoint=ck)
    assert b.table.routes["coder"].primary == b.table.routes["coder"].fallback == BIG
    with pytest.raises(ValueError, match="debugger"):
        bd.build(tmp_path / "c", pin(sage_table, "debugger", BIG), sage_table, objective=TaskObjective(), checkpoint=ck)
