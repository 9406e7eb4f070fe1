"""The bundle carries the decision ledger and the randomised arms (issue 47, items 1, 3, 4): both are parts
verified like every other (regular files, no links, sha256s and the id recomputed, each parsed as what it
is), a hostile arm is refused before anything is written, and a deploy writes the launcher whose draws
export the DEPLOYED copies, records every run at the root (kept across deploys, each naming its plan) and
switches with sage.env."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from sage_pipeline.decisions import assign
from sage_pipeline.decisions.ledger import Ledger
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage import bundle as bd, checkpoint as sr, explore as se
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable, pin
from sage_pipeline_tests.hang_guard import finishes

BIG = "qwen2.5-coder:14b-instruct-q4_K_M"
HOSTILE = "dep loy 'q' \"dq\" $(touch canary) `touch canary2` ;touch canary3; $HOME"
VARS = ("SAGE_MODELS_YAML", "SAGE_SKILLS_ROOT", "SAGE_RL_POLICY", "SAGE_RL_CHECKPOINT", "SAGE_TRACE_ID")


@pytest.fixture(scope="module")
def sage_table() -> RoutingTable:
    return RoutingTable.load(SAGE_TABLE)


def _skills(folder: Path, text: str) -> Path:
    (folder / "discipline" / "tdd").mkdir(parents=True)
    (folder / "discipline" / "tdd" / "SKILL.md").write_text(f"# TDD\n{text}\n")
    return folder


def _ledger(path: Path) -> Path:
    led = Ledger.load(path)
    led.propose("coder", BIG, night="2026-12-01", description="pin the coder on the 14B model")
    led.propose("skills", "tdd::run the tests first", night="2026-12-01")
    led.save()
    return path


@pytest.fixture()
def src(sage_table, tmp_path) -> dict:
    """What a bundle with a ledger and arms on both levers is built from."""
    ex = se.build_exploring(sage_table, ActionSpace.build(sage_table).binary(), se.ExploreConfig(rate=0.2))
    sr.write_sage_checkpoint(tmp_path / "ck", ex, {"source": "test"})
    return {"ck": tmp_path / "ck", "live": _skills(tmp_path / "live", "live"),
            "cand": _skills(tmp_path / "cand", "- run the tests first"),
            "pin": pin(sage_table, "coder", BIG).write(tmp_path / "pin.yaml"),
            "ledger": _ledger(tmp_path / "decisions" / "ledger.json")}


def _arms(src: dict) -> dict:
    return {"coder": [("incumbent", None, 0.7, None), ("pin", "coder-0001", 0.3, src["pin"])],
            "skills": [("live", None, 0.5, src["live"]), ("cand", "skills-0001", 0.5, src["cand"])]}


def _build(src: dict, out: Path, sage_table: RoutingTable, **kw) -> bd.Bundle:
    kw = {"ledger": src["ledger"], "arms": _arms(src), **kw}
    return bd.build(out, sage_table, sage_table, objective=TaskObjective(), checkpoint=src["ck"],
                    skills=src["live"], **kw)


@pytest.fixture()
def built(src, sage_table, tmp_path) -> bd.Bundle:
    return _build(src, tmp_path / "bundle", sage_table)


def _fake_sage(folder: Path) -> Path:
    """A `sage` that prints what SAGE would read (NUL-separated) and its arguments."""
    p = folder / "fake-sage"
    p.write_text("#!/bin/sh\nprintf '%s\\0' " + " ".join(f'"${{{v}:-}}"' for v in VARS) + ' "$*"\n')
    p.chmod(0o755)
    return p


def _run(launcher: Path, cwd: Path, n: int) -> list[dict]:
    out = []
    for _ in range(n):
        proc = subprocess.run([str(launcher), "build a thing"], cwd=cwd, capture_output=True, timeout=60,
                              env={"PATH": os.environ["PATH"], "HOME": str(cwd), "SAGE_RL_POLICY": "stale",
                                   "SAGE_SKILLS_ROOT": "/stale"})
        assert proc.returncode == 0, proc.stderr.decode()
        values = proc.stdout.decode().split("\0")[:-1]
        out.append(dict(zip((*VARS, "args"), values, strict=True)))
    return out


# --- the parts and the id ------------------------------------------------------------------------------


def test_a_bundle_with_a_ledger_and_arms_round_trips(built, src, sage_table, tmp_path):
    again = bd.read(built.folder)
    assert again.id == built.id and again.manifest == built.manifest
    m = built.manifest
    assert m["parts"]["decisions"]["path"] == "ledger.json"
    assert Ledger.load(built.folder / "ledger.json").get("coder-0001").key == BIG
    coder = m["arms"]["coder"]
    assert [a["name"] for a in coder] == ["incumbent", "pin"] and coder[0]["path"] is None
    assert coder[1]["path"] == "arms/coder/pin/models.yaml" and coder[1]["candidate"] == "coder-0001"
    assert sum(a["threshold"] for a in coder) == assign.SCALE  # exact: integers out of 2**32
    assert all(isinstance(a["threshold"], int) for arms in m["arms"].values() for a in arms)
    assert (built.folder / "arms" / "skills" / "cand" / "skills" / "discipline" / "tdd" / "SKILL.md").is_file()
    plan = built.plan()
    assert plan.probability("skills", "cand") == 0.5
    assert plan.probability("coder", "pin") == coder[1]["threshold"] / assign.SCALE
    assert plan.levers["coder"][1].env == {"SAGE_MODELS_YAML": str(built.folder / "arms/coder/pin/models.yaml")}
    assert plan.levers["coder"][0].env == {}  # the incumbent runs the bundle's own models.yaml
    # the id changes when any arm's file, the ledger, or a probability changes
    ids = {built.id}
    src["pin"].write_text(src["pin"].read_text() + "\n# another arm\n")
    ids.add(_build(src, tmp_path / "b1", sage_table).id)
    (src["cand"] / "discipline" / "tdd" / "SKILL.md").write_text("# TDD\n- another rule\n")
    ids.add(_build(src, tmp_path / "b2", sage_table).id)
    (src["live"] / "discipline" / "tdd" / "notes.md").write_text("x\n")
    ids.add(_build(src, tmp_path / "b3", sage_table).id)
    led = Ledger.load(src["ledger"])
    led.propose("router", "ab" * 32, night="2026-12-02")
    led.save()
    ids.add(_build(src, tmp_path / "b4", sage_table).id)
    arms = _arms(src)
    arms["coder"] = [("incumbent", None, 0.6, None), ("pin", "coder-0001", 0.4, src["pin"])]
    ids.add(_build(src, tmp_path / "b5", sage_table, arms=arms).id)
    assert len(ids) == 6


def test_an_edited_arm_or_ledger_is_refused_on_read(built):
    (built.folder / "arms" / "coder" / "pin" / "models.yaml").write_text("# edited\n", encoding="utf-8")
    with pytest.raises(bd.BundleError, match=r"arm 'arms\.coder\.pin'.*changed since the bundle was built"):
        bd.read(built.folder)


def test_without_ledger_or_arms_a_bundle_keeps_its_id_and_manifest(src, sage_table, tmp_path):
    b = bd.build(tmp_path / "plain", sage_table, sage_table, objective=TaskObjective(), checkpoint=src["ck"])
    on_disk = json.loads((b.folder / bd.MANIFEST).read_text())
    assert "arms" not in on_disk and set(on_disk["parts"]) == {"models_yaml", "checkpoint", "bandit_state", "skills"}
    assert b.manifest == on_disk and b.plan() is None
    old = hashlib.sha256(json.dumps({k: None if v is None else v["sha256"] for k, v in on_disk["parts"].items()},
                                    sort_keys=True).encode()).hexdigest()  # the id as it always was computed
    assert b.id == old == on_disk["id"]
    root = tmp_path / "root"
    line = bd.deploy(b, root, target=sage_table)
    assert not (root / bd.LAUNCHER).exists() and not (root / "versions" / b.id / bd.LAUNCHER).exists()
    assert "launcher" not in line


def test_a_bad_ledger_is_refused_naming_the_file_and_field(src, sage_table, tmp_path):
    doc = json.loads(src["ledger"].read_text())
    doc["candidates"][0]["state"] = "maybe"
    src["ledger"].write_text(json.dumps(doc))
    with pytest.raises(bd.BundleError, match=r"ledger\.json.*field 'candidates\.0\.state'") as info:
        _build(src, tmp_path / "out", sage_table)
    assert str(src["ledger"]) in str(info.value) and ".tmp-" not in str(info.value)
    assert not (tmp_path / "out").exists()


# --- hostile arms: refused before anything is written ------------------------------------------------


def _finishes(fn, timeout_s: float = 20.0):
    return finishes(fn, timeout_s)


def _hostile_build(src, sage_table, tmp_path, arms, *needles):
    out = tmp_path / "out"
    with pytest.raises(bd.BundleError) as info:
        _finishes(lambda: _build(src, out, sage_table, arms=arms))
    for n in needles:
        assert n in str(info.value), str(info.value)
    assert not out.exists() and not list(tmp_path.glob(".out.tmp-*"))
    return str(info.value)


def _coder(part) -> dict:
    return {"coder": [("a", None, 0.5, None), ("b", "c", 0.5, part)]}


def test_a_hostile_arm_is_refused_at_build(src, sage_table, tmp_path):
    secret = tmp_path / "shadow"
    secret.write_text("CANARY\n")
    (tmp_path / "link.yaml").symlink_to(src["pin"])  # even to a good models.yaml
    _hostile_build(src, sage_table, tmp_path, _coder(tmp_path / "link.yaml"),
                   "link.yaml", "link")
    (src["cand"] / "discipline" / "tdd" / "extra.md").symlink_to(secret)
    _hostile_build(src, sage_table, tmp_path, _arms(src), "extra.md", "link")
    (src["cand"] / "discipline" / "tdd" / "extra.md").unlink()
    os.mkfifo(tmp_path / "fifo.yaml")
    _hostile_build(src, sage_table, tmp_path, _coder(tmp_path / "fifo.yaml"),
                   "fifo.yaml", "FIFO")
    other = sage_table.with_route("reviewer", primary=BIG).with_route("coder", primary=BIG).write(tmp_path / "o.yaml")
    _hostile_build(src, sage_table, tmp_path, _coder(other),
                   "models.yaml for another table", "reviewer")
    (tmp_path / "empty").mkdir()
    _hostile_build(src, sage_table, tmp_path, {"skills": [("a", None, 0.5, None), ("b", "c", 0.5, tmp_path / "empty")]},
                   "SKILL.md")
    _hostile_build(src, sage_table, tmp_path, {"router": [("a", None, 1.0, None)]}, "router", "coder, skills")
    _hostile_build(src, sage_table, tmp_path, {"coder": [("../x", None, 1.0, None)]}, "the arms")
    assert "CANARY" not in "".join(p.read_text(errors="replace") for p in tmp_path.rglob("*.md") if p.is_file())


def _manifest(folder: Path) -> dict:
    return json.loads((folder / bd.MANIFEST).read_text())


def _tree_sha256(path: Path) -> str:
    """An arm's hash with links followed: what an attacker reseals with."""
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        h.update(str(f.relative_to(path) if f != path else f.name).encode() + b"\0")
        h.update(hashlib.sha256(f.read_bytes()).hexdigest().encode() + b"\0")
    return h.hexdigest()


def _reseal(folder: Path, edit=None) -> None:
    """Edit the manifest, then recompute every arm's sha256 from what its path names, and the id."""
    m = _manifest(folder)
    if edit is not None:
        edit(m)
    for arms in m["arms"].values():
        for a in arms:
            if a.get("path") and os.path.exists(folder / a["path"]) and not Path(folder / a["path"]).is_fifo():
                a["sha256"] = _tree_sha256(folder / a["path"])
    shas = {k: None if v is None else v["sha256"] for k, v in m["parts"].items()}
    m["id"] = bd._ident(shas, m["arms"])
    (folder / bd.MANIFEST).write_text(json.dumps(m))


def _refused(folder: Path, root: Path, target: RoutingTable, *needles: str) -> None:
    with pytest.raises(bd.BundleError) as info:
        _finishes(lambda: bd.deploy(folder, root, target=target))
    for n in needles:
        assert n in str(info.value), str(info.value)
    assert not root.exists()


def test_a_resealed_hostile_arm_is_refused_at_deploy(built, sage_table, tmp_path):
    f, root = built.folder, tmp_path / "deploy"
    pristine = tmp_path / "pristine"
    shutil.copytree(f, pristine, symlinks=True)

    def fresh() -> None:
        shutil.rmtree(f)
        shutil.copytree(pristine, f, symlinks=True)

    # a path out of the bundle: refused by the schema, whatever the hashes say
    _reseal(f, lambda m: m["arms"]["coder"][1].update(path="../pin.yaml"))
    _refused(f, root, sage_table, "arms.coder.1.path", "arms/coder/pin/models.yaml")
    fresh()
    # the arm's part replaced by a link (to a good models.yaml outside)
    (f / "arms/coder/pin/models.yaml").unlink()
    (f / "arms/coder/pin/models.yaml").symlink_to(tmp_path / "pin.yaml")
    _reseal(f)
    _refused(f, root, sage_table, "arms.coder.pin", "link")
    fresh()
    # a folder on the way is a link (arms/skills -> a copy outside): never followed
    shutil.copytree(f / "arms" / "skills", tmp_path / "outside-skills")
    shutil.rmtree(f / "arms" / "skills")
    (f / "arms" / "skills").symlink_to(tmp_path / "outside-skills")
    _reseal(f)
    _refused(f, root, sage_table, "arms.skills", "on the way")
    fresh()
    # a FIFO inside a skills arm: refused without being opened
    os.mkfifo(f / "arms/skills/cand/skills/discipline/tdd/pipe")
    _reseal(f)
    _refused(f, root, sage_table, "arms.skills.cand", "FIFO")
    fresh()
    # a models.yaml for another table, resealed
    RoutingTable.load(SAGE_TABLE).with_route("debugger", primary=BIG).write(f / "arms/coder/pin/models.yaml")
    _reseal(f)
    _refused(f, root, sage_table, "models.yaml for another table", "debugger")
    fresh()
    # thresholds that do not sum to 2**32
    _reseal(f, lambda m: m["arms"]["coder"][0].update(threshold=m["arms"]["coder"][0]["threshold"] - 1))
    _refused(f, root, sage_table, "arms.coder", "2**32")
    fresh()
    bd.deploy(f, root, target=sage_table)  # the pristine bundle deploys


# --- the arms file the levers' nights write --------------------------------------------------------------


def test_the_arms_file_resolves_parts_inside_the_data_root(src, tmp_path):
    data = tmp_path / "data"
    (data / "decisions").mkdir(parents=True)
    shutil.copy(src["pin"], data / "decisions" / "pin.yaml")
    path = data / "decisions" / assign.ARMS_FILE
    assign.save_lever_arms(path, "coder", [("incumbent", None, 0.9, None), ("pin", "coder-0001", 0.1,
                                                                             "decisions/pin.yaml")])
    assign.save_lever_arms(path, "skills", [("live", None, 1.0, None)])
    got = assign.load_arms(path, data)
    assert set(got) == {"coder", "skills"}  # one lever's night keeps the other's arms
    assert got["coder"][1] == ("pin", "coder-0001", 0.1, (data / "decisions" / "pin.yaml").resolve())
    assign.save_lever_arms(path, "skills", [])
    assert set(assign.load_arms(path, data)) == {"coder"}
    doc = json.loads(path.read_text())
    for bad, field in (("../pin.yaml", "levers.coder.1.part"), (str(src["pin"]), "levers.coder.1.part")):
        doc["levers"]["coder"][1]["part"] = bad
        path.write_text(json.dumps(doc))
        with pytest.raises(assign.AssignError, match=rf"{assign.ARMS_FILE}: field '{field}'.*outside_root"):
            assign.load_arms(path, data)
    (data / "out.yaml").symlink_to(src["pin"])
    doc["levers"]["coder"][1]["part"] = "out.yaml"
    path.write_text(json.dumps(doc))
    with pytest.raises(assign.AssignError, match="field 'levers.coder.1.part'.*link"):
        assign.load_arms(path, data)
    doc["levers"]["coder"][1].update(part=None, probability="0.1")
    path.write_text(json.dumps(doc))
    with pytest.raises(assign.AssignError, match="field 'levers.coder.1.probability'"):
        assign.load_arms(path, data)
    doc["levers"]["coder"][1]["probability"] = 0.1
    doc["levers"]["router"] = doc["levers"].pop("coder")
    path.write_text(json.dumps(doc))
    with pytest.raises(assign.AssignError, match="field 'levers'.*coder, skills only"):
        assign.load_arms(path, data)


# --- deploying: the launcher ------------------------------------------------------------------------------


def _hostile_root(tmp_path: Path) -> Path:
    base = tmp_path / "roots"
    base.mkdir()
    try:
        (base / (HOSTILE + "\nnext line")).mkdir()
        (base / (HOSTILE + "\nnext line")).rmdir()
        return base / (HOSTILE + "\nnext line")
    except OSError:  # a filesystem that refuses a newline in a name
        return base / HOSTILE


def test_deploy_writes_a_launcher_whose_draws_run_the_deployed_version(built, src, sage_table, tmp_path):
    root, cwd = _hostile_root(tmp_path), tmp_path / "cwd"
    cwd.mkdir()
    fake = _fake_sage(tmp_path)
    line = bd.deploy(built, root, target=sage_table, sage=str(fake))
    version = Path(os.path.abspath(root)) / "versions" / built.id
    assert (root / bd.LAUNCHER).is_symlink() and os.readlink(root / bd.LAUNCHER) == "current/sage-run"
    assert line["launcher"] == str(root / bd.LAUNCHER) and line["plan"] == built.plan(version).id
    runs = _run(root / bd.LAUNCHER, cwd, 40)
    assert not any(p.name.startswith("canary") for p in [*cwd.iterdir(), *tmp_path.iterdir()])  # nothing ran
    coder = {str(version / "models.yaml"): "incumbent", str(version / "arms/coder/pin/models.yaml"): "pin"}
    skills = {str(version / "arms/skills/live/skills"): "live", str(version / "arms/skills/cand/skills"): "cand"}
    for r in runs:
        assert r["args"] == "run build a thing"
        assert r["SAGE_MODELS_YAML"] in coder and r["SAGE_SKILLS_ROOT"] in skills  # inside the deployed version
        assert str(built.folder) not in r["SAGE_MODELS_YAML"] + r["SAGE_SKILLS_ROOT"]
        assert Path(r["SAGE_MODELS_YAML"]).is_file() and (Path(r["SAGE_SKILLS_ROOT"]) / "discipline").is_dir()
        assert r["SAGE_RL_POLICY"] == "1" and r["SAGE_RL_CHECKPOINT"] == str(version / "checkpoint" / "policy.joblib")
    seen = Counter((coder[r["SAGE_MODELS_YAML"]], skills[r["SAGE_SKILLS_ROOT"]]) for r in runs)
    assert len(seen) == 4  # both levers drawn, independently
    plans, bad = bd.deployed_plans(root)
    records, bad_lines = assign.read_records(root / bd.ASSIGNMENTS, plans)
    assert bad == [] and bad_lines == [] and set(records) == {r["SAGE_TRACE_ID"] for r in runs}
    for r in runs:
        rec = records[r["SAGE_TRACE_ID"]]
        assert rec["plan"] == line["plan"]
        assert rec["levers"]["coder"]["arm"] == coder[r["SAGE_MODELS_YAML"]]
        assert rec["levers"]["skills"]["arm"] == skills[r["SAGE_SKILLS_ROOT"]]
        assert rec["levers"]["coder"]["probability"] == built.plan().probability("coder", rec["levers"]["coder"]["arm"])
    assert not (version / bd.ASSIGNMENTS).exists()  # the records live at the root


def test_records_survive_a_second_deploy_and_the_launcher_switches_with_sage_env(built, src, sage_table, tmp_path):
    root, cwd, fake = tmp_path / "root", tmp_path / "cwd", _fake_sage(tmp_path)
    cwd.mkdir()
    bd.deploy(built, root, target=sage_table, sage=str(fake))
    first = _run(root / bd.LAUNCHER, cwd, 5)
    before = (root / bd.ASSIGNMENTS).read_text()
    arms = {"coder": [("incumbent", None, 0.5, None), ("pin", "coder-0001", 0.5, src["pin"])]}
    second = _build(src, tmp_path / "bundle2", sage_table, arms=arms)
    line = bd.deploy(second, root, target=sage_table, sage=str(fake))
    assert (root / bd.ASSIGNMENTS).read_text() == before  # a deploy never touches the records
    later = _run(root / bd.LAUNCHER, cwd, 10)
    v2 = Path(os.path.abspath(root)) / "versions" / second.id
    assert {r["SAGE_SKILLS_ROOT"] for r in later} == {str(v2 / "skills")}  # no skills arm: the bundle's own
    assert all(r["SAGE_MODELS_YAML"].startswith(str(v2)) for r in later)
    assert bd.read_env_file(root / bd.ENV_FILE)["SAGE_MODELS_YAML"] == str(v2 / "models.yaml")
    plans, _ = bd.deployed_plans(root)
    records, bad = assign.read_records(root / bd.ASSIGNMENTS, plans)
    assert bad == [] and len(records) == 15
    assert {records[r["SAGE_TRACE_ID"]]["plan"] for r in first} == {built.plan(root / "versions" / built.id).id}
    assert {records[r["SAGE_TRACE_ID"]]["plan"] for r in later} == {line["plan"]}
    # a bundle without arms to a root that had a launcher: the launcher stays, draws nothing, runs the version
    plain = bd.build(tmp_path / "plain", sage_table, sage_table, objective=TaskObjective())
    line = bd.deploy(plain, root, target=sage_table, sage=str(fake))
    (run,) = _run(root / bd.LAUNCHER, cwd, 1)
    v3 = Path(os.path.abspath(root)) / "versions" / plain.id
    assert run["SAGE_MODELS_YAML"] == str(v3 / "models.yaml") and run["SAGE_SKILLS_ROOT"] == ""
    assert run["SAGE_RL_POLICY"] == ""  # unset, as sage.env does
    plans, _ = bd.deployed_plans(root)
    records, bad = assign.read_records(root / bd.ASSIGNMENTS, plans)
    assert bad == [] and records[run["SAGE_TRACE_ID"]]["levers"] == {} and line["arms"] == {}


def test_cli_deploy_says_how_to_start_sage_through_the_launcher(built, tmp_path, capsys):
    env_file = tmp_path / "target.env"
    env_file.write_text(f"export SAGE_MODELS_YAML={SAGE_TABLE}\n")
    root = tmp_path / "with space"
    assert bd.main(["deploy", str(built.folder), str(root), "--target-env", str(env_file), "--sage-python", "",
                    "--sage", str(_fake_sage(tmp_path))]) == 0
    out = capsys.readouterr().out
    assert f"wrote the launcher '{root / 'sage-run'}'" in out
    assert f"'{root / 'sage-run'}' \"<prompt>\" instead of sage run \"<prompt>\"" in out
    assert "coder: incumbent 0.7, pin 0.3" in out
