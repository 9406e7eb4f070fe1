"""Deploys to one root are serialised (issue 49, item 3): two processes deploying 40 bundles each lose no
record (80 whole JSON lines), and a reader looping beside them never sees ``sage.env`` name another version
than ``current``: the env file lives in the version, ``ROOT/sage.env`` is the link ``current/sage.env``,
so ``current`` is the one switch.

Every one of the 80 bundles is different and deployed once, so ``current`` never comes back to a version
it left: a reader that reads ``current`` the same before and after reading ``sage.env`` read it while
``current`` named that version, and the env file must name it too. The deployers wait for the reader
after each deploy (a counter, never a sleep), so the reader's checks interleave with the deploys
whatever the machine's speed."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

from sage_pipeline.sage import bundle as bd
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable

ROUNDS = 40
WAIT_S = 300  # only ever reached when something hangs: the condition is a count, never a time


def _deploy_all(folders: list[str], root: str, barrier, checks) -> None:
    """One deployer process: every folder in turn; after each deploy, wait for the reader's next check."""
    table = RoutingTable.load(SAGE_TABLE)
    barrier.wait(WAIT_S)
    for folder in folders:
        bd.deploy(folder, root, target=table)
        seen, deadline = checks.value, time.monotonic() + WAIT_S
        while checks.value <= seen:
            if time.monotonic() > deadline:
                raise SystemExit(f"the reader made no check in {WAIT_S} s")
            time.sleep(0.001)


def _check(root: Path) -> bool:
    """One reader's look: True when ``current`` named one version throughout and sage.env named it too."""
    try:
        before = os.readlink(root / "current")
    except FileNotFoundError:  # before the first deploy
        return False
    env = bd.read_env_file(root / bd.ENV_FILE)
    after = os.readlink(root / "current")
    if before != after:
        return False
    version = Path(os.path.abspath(root)) / before
    assert env["SAGE_MODELS_YAML"] == str(version / bd.MODELS_YAML), (before, env)
    return True


def test_two_processes_deploying_40_times_each_lose_no_record_and_env_agrees_with_current(tmp_path):
    base = RoutingTable.load(SAGE_TABLE)
    folders = [bd.build(tmp_path / f"b{i}", base.with_route("coder", primary=f"coder-model-{i}:7b"), base,
                        objective=TaskObjective()).folder for i in range(2 * ROUNDS)]
    root = tmp_path / "deploy"
    ctx = multiprocessing.get_context("spawn")
    barrier, checks = ctx.Barrier(2), ctx.Value("i", 0)
    procs = [ctx.Process(target=_deploy_all, args=([str(f) for f in folders[i::2]], str(root), barrier, checks))
             for i in range(2)]
    for p in procs:
        p.start()
    try:
        while any(p.is_alive() for p in procs):
            if _check(root):
                with checks.get_lock():
                    checks.value += 1
    except BaseException:
        for p in procs:  # the deployers wait for the reader's next check: stop them rather than let them wait
            p.terminate()
        raise
    finally:
        for p in procs:
            p.join(WAIT_S)
    assert [p.exitcode for p in procs] == [0, 0]
    assert _check(root)  # and after the last deploy
    assert checks.value >= ROUNDS  # the reader looked between every two deploys of each process
    lines = (root / bd.RECORD).read_text().splitlines()
    assert len(lines) == 2 * ROUNDS
    records = [json.loads(x) for x in lines]  # each line whole JSON
    ids = [bd.read(f).id for f in folders]
    assert sorted(r["bundle"] for r in records) == sorted(ids)
    assert os.readlink(root / "current") == f"versions/{records[-1]['bundle']}"  # the last recorded is current


def test_sage_env_is_the_link_to_current_and_the_version_holds_its_env(tmp_path):
    base = RoutingTable.load(SAGE_TABLE)
    b = bd.build(tmp_path / "b", base, base, objective=TaskObjective())
    root = tmp_path / "deploy"
    bd.deploy(b, root, target=base)
    assert os.readlink(root / bd.ENV_FILE) == f"current/{bd.ENV_FILE}"
    assert os.readlink(root / "current") == f"versions/{b.id}"
    assert (root / "versions" / b.id / bd.ENV_FILE).is_file()
    assert bd.read_env_file(root / bd.ENV_FILE)["SAGE_MODELS_YAML"] == str(
        Path(os.path.abspath(root)) / "versions" / b.id / bd.MODELS_YAML)


def test_a_root_deployed_with_a_regular_sage_env_gets_the_link_and_every_version_its_env(tmp_path):
    base = RoutingTable.load(SAGE_TABLE)
    a = bd.build(tmp_path / "a", base, base, objective=TaskObjective())
    b = bd.build(tmp_path / "b", base.with_route("coder", primary="coder-model-b:7b"), base, objective=TaskObjective())
    root = tmp_path / "deploy"
    bd.deploy(a, root, target=base)
    # the layout an older version left: a regular sage.env at the root, none in the version
    old = root / "versions" / a.id / bd.ENV_FILE
    text = old.read_text()
    old.unlink()
    (root / bd.ENV_FILE).unlink()
    (root / bd.ENV_FILE).write_text(text)
    bd.deploy(b, root, target=base)
    assert os.readlink(root / bd.ENV_FILE) == f"current/{bd.ENV_FILE}" and old.read_text() == text
    assert bd.read_env_file(root / bd.ENV_FILE)["SAGE_MODELS_YAML"].endswith(f"versions/{b.id}/models.yaml")


def test_a_record_line_a_killed_writer_left_open_does_not_swallow_the_next(tmp_path):
    base = RoutingTable.load(SAGE_TABLE)
    a = bd.build(tmp_path / "a", base, base, objective=TaskObjective())
    root = tmp_path / "deploy"
    bd.deploy(a, root, target=base)
    with open(root / bd.RECORD, "a") as fh:
        fh.write('{"bundle": "half a li')  # killed mid-line
    bd.deploy(a, root, target=base)
    lines = (root / bd.RECORD).read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[0])["bundle"] == json.loads(lines[2])["bundle"] == a.id
