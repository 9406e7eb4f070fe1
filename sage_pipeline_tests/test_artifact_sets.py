"""artifacts.atomic_set: an asset's several files and folders switch together.

Readers of the public paths see one run's complete set, never files of two runs, whatever
moment a writer is killed at; members a run does not write keep their content; real files
and folders of the older one-by-one layout are adopted without a moment of change."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import re
import signal
import time
from pathlib import Path

import pytest

from sage_pipeline import artifacts

MEMBERS = ("checkpoints/a", "checkpoints/b", "reports/r.json")


def _write(stage: artifacts.SetStage, marker: int, members=MEMBERS) -> None:
    for m in members:
        if m.endswith(".json"):
            artifacts.write_json(stage.path(m), {"marker": marker})
        else:
            with artifacts.atomic_dir(stage.path(m)) as tmp:
                for k in range(3):
                    (tmp / f"part{k}.txt").write_text(str(marker))


def _markers(root: Path) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    for m in MEMBERS:
        p = root / m
        if not p.exists():
            out[m] = None
        elif p.is_dir():
            vals = {(p / f"part{k}.txt").read_text() for k in range(3)}
            assert len(vals) == 1, f"{p} holds files of two saves: {vals}"
            out[m] = int(vals.pop())
        else:
            out[m] = int(__import__("json").loads(p.read_text())["marker"])
    return out


def _run(root: Path, marker: int, members=MEMBERS) -> None:
    with artifacts.atomic_set(root, "asset", MEMBERS) as stage:
        _write(stage, marker, members)


def test_a_run_switches_every_member_and_readers_find_them_at_their_usual_paths(tmp_path):
    _run(tmp_path, 1)
    assert _markers(tmp_path) == dict.fromkeys(MEMBERS, 1)
    _run(tmp_path, 2)
    assert _markers(tmp_path) == dict.fromkeys(MEMBERS, 2)
    assert all((tmp_path / m).is_symlink() for m in MEMBERS)
    home = tmp_path / artifacts.SETS_DIR / "asset"
    versions = sorted(p.name for p in home.iterdir() if p.is_dir() and not p.is_symlink())
    assert len(versions) == 2  # the current one and the one it replaced, for readers still in it
    assert os.readlink(home / "current") in versions and os.readlink(home / "previous") in versions
    _run(tmp_path, 3)
    assert len([p for p in home.iterdir() if p.is_dir() and not p.is_symlink()]) == 2


def test_a_member_the_run_does_not_write_keeps_its_content(tmp_path):
    _run(tmp_path, 1)
    _run(tmp_path, 2, members=("checkpoints/a",))
    assert _markers(tmp_path) == {"checkpoints/a": 2, "checkpoints/b": 1, "reports/r.json": 1}


def test_a_member_never_written_has_no_link_pointing_nowhere(tmp_path):
    _run(tmp_path, 1, members=("checkpoints/a", "reports/r.json"))
    assert not os.path.lexists(tmp_path / "checkpoints/b")
    (tmp_path / "checkpoints/b").mkdir()  # so a plain mkdir of it still works
    assert (tmp_path / "checkpoints/a/part0.txt").read_text() == "1"


def test_real_files_and_folders_of_the_older_layout_are_adopted(tmp_path):
    for m in MEMBERS:  # what the one-by-one writers left
        p = tmp_path / m
        p.parent.mkdir(parents=True, exist_ok=True)
        if m.endswith(".json"):
            p.write_text('{"marker": 0}')
        else:
            p.mkdir()
            for k in range(3):
                (p / f"part{k}.txt").write_text("0")
    _run(tmp_path, 1, members=("checkpoints/a",))
    assert _markers(tmp_path) == {"checkpoints/a": 1, "checkpoints/b": 0, "reports/r.json": 0}
    assert all((tmp_path / m).is_symlink() for m in MEMBERS)
    # a real folder written since by another writer is adopted too, then replaced by the run
    (tmp_path / "checkpoints/b").unlink()
    (tmp_path / "checkpoints/b").mkdir()
    for k in range(3):
        (tmp_path / "checkpoints/b" / f"part{k}.txt").write_text("7")
    _run(tmp_path, 2, members=("reports/r.json",))
    assert _markers(tmp_path) == {"checkpoints/a": 1, "checkpoints/b": 7, "reports/r.json": 2}


def test_a_failed_run_changes_nothing_and_leaves_nothing(tmp_path):
    _run(tmp_path, 1)
    with pytest.raises(RuntimeError, match="boom"):
        with artifacts.atomic_set(tmp_path, "asset", MEMBERS) as stage:
            _write(stage, 2, ("checkpoints/a",))
            raise RuntimeError("boom")
    assert _markers(tmp_path) == dict.fromkeys(MEMBERS, 1)
    home = tmp_path / artifacts.SETS_DIR / "asset"
    assert not [p for p in home.iterdir() if p.name.endswith(".partial")]


def test_writing_outside_the_members_is_an_error_that_names_them(tmp_path):
    with pytest.raises(ValueError, match=r"wrote \['other.txt'\], which are not among its members"):
        with artifacts.atomic_set(tmp_path, "asset", MEMBERS) as stage:
            artifacts.write_text(stage.path("other.txt"), "x")
    with pytest.raises(ValueError, match="must be paths inside the artifact root"):
        with artifacts.atomic_set(tmp_path, "asset", ["../escape"]):
            pass


def test_public_maps_a_staged_path_to_where_readers_find_it(tmp_path):
    with artifacts.atomic_set(tmp_path, "asset", MEMBERS) as stage:
        p = artifacts.write_json(stage.path("reports", "r.json"), {"marker": 1})
        assert stage.public(p) == tmp_path / "reports" / "r.json"


def _run_forever(root: Path, first: int, done) -> None:
    marker = first
    while True:
        _run(root, marker)
        with done.get_lock():
            done.value += 1
        marker += 1


def test_kill_9_at_any_moment_leaves_one_runs_set_and_the_next_run_sweeps(tmp_path):
    """30 writers killed at random moments: after each kill every member holds one marker,
    and it is one the set had as a whole. Each writer is killed after 0, 1 or 2 of its runs have
    completed and then at a random point of the next one (scaled to a run's measured duration),
    so the kills land at many moments however loaded the machine is."""
    t0 = time.perf_counter()
    _run(tmp_path, 0)
    one_run = time.perf_counter() - t0
    ctx = multiprocessing.get_context("fork")
    rng = random.Random(0)
    seen = set()
    for trial in range(30):
        done = ctx.Value("i", 0)
        proc = ctx.Process(target=_run_forever, args=(tmp_path, 1000 * (trial + 1), done))
        proc.start()
        completed, deadline = rng.randint(0, 2), time.monotonic() + 60
        while done.value < completed and time.monotonic() < deadline:
            time.sleep(0.0005)
        time.sleep(rng.uniform(0.0, 1.5 * one_run))
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        markers = set(_markers(tmp_path).values())
        assert len(markers) == 1, f"trial {trial}: members of two runs: {_markers(tmp_path)}"
        seen |= markers
    assert len(seen) > 5  # the kills landed at many moments, several runs completed
    _run(tmp_path, 1)
    home = tmp_path / artifacts.SETS_DIR / "asset"
    left = [p.name for p in home.iterdir() if not p.is_symlink()]
    assert len(left) == 2 and not [n for n in left if n.endswith(".partial")], left
    assert not [p for p in home.iterdir() if p.is_symlink() and p.name.startswith(".")]


def _reader(root: Path, seconds: float, out) -> None:
    bad, reads, end = 0, 0, time.monotonic() + seconds
    home = root / artifacts.SETS_DIR / "asset"
    while time.monotonic() < end:
        version = home / os.readlink(home / "current")  # one version, read whole
        try:
            vals = {(version / "checkpoints/a" / f"part{k}.txt").read_text() for k in range(3)}
            vals.add(str(__import__("json").loads((version / "reports/r.json").read_text())["marker"]))
        except FileNotFoundError:
            continue  # swept after two newer switches: read the current one again
        bad += len(vals) != 1
        reads += 1
    out.put((bad, reads))


def test_concurrent_runs_all_succeed_and_the_last_switch_wins_whole(tmp_path):
    _run(tmp_path, 0)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    reader = ctx.Process(target=_reader, args=(tmp_path, 3.0, out))
    reader.start()
    writers = [ctx.Process(target=lambda w=w: [_run(tmp_path, 100 * w + i) for i in range(1, 15)])
               for w in (1, 2, 3)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(120)
        assert p.exitcode == 0
    bad, reads = out.get(timeout=30)
    reader.join()
    assert reads > 0 and bad == 0
    markers = set(_markers(tmp_path).values())
    assert len(markers) == 1 and markers.pop() % 100 == 14


# ---------------------------------------------------------------------------------------------
# Every asset's files: an asset that writes more than one file or folder writes them as one set
# (issue 35). The assets are materialized in process with the artifacts layer recording each
# atomic write and the asset it was made for (artifacts.current_writer); a write into an
# atomic_set's version, or into a folder an atomic_dir fills, belongs to that set or folder.
# ---------------------------------------------------------------------------------------------

# Not materialized here, each with why it needs no check here. Every asset of the project's
# Definitions is either measured below or listed here (a new asset must be one or the other).
NOT_MEASURED = {
    "sage_loop": "needs SAGE (SAGE_PYTHON); writes only into a fresh sage_loop/<run_id>/ folder per run",
    "decisions/decision_ledger": "reads the ledger the levers' nights wrote and writes one file, "
                                 "reports/decision_ledger.png (artifacts.write_bytes): defs/test_decision_assets.py",
}
# Measured, and known to write several files one by one: each entry must still do so (remove it
# when its asset writes one set), and names whose it is to change.
KNOWN_LOOSE = {
}


# Not an asset's artifact: the sandbox's execution cache (sim/cache.py), segments named by their
# content, each complete on its own and valid for any run; a mix of segments of two runs is its design.
# Also not one asset's: the router's candidate checkpoints (checkpoints/candidates/<sha256>/, written once
# by content address, never rewritten: a kill leaves the folder whole or absent) and the decision ledger
# (decisions/ledger.json, every lever's state across nights, one atomic file merged per lever under its lock,
# and decisions/ids/<sha256>.txt, the id sets its candidates name, written once by content address before it);
# SAGE's deployments record (checkpoints/sage_deployments.jsonl: every window SAGE ran a checkpoint in, whoever
# deployed it, one atomic file rewritten under its lock; sage_week adds the SAGE week's windows) and the
# checkpoints it names (checkpoints/sage_deployed/<sha256>/, written once by content address).
CACHES = ("sim/cache/", "checkpoints/candidates/", "decisions/ledger.json", "decisions/ids/",
          "checkpoints/sage_deployments.jsonl", "checkpoints/sage_deployed/")


def _is_set_or_nested(rel: Path) -> bool:
    return any(p == artifacts.SETS_DIR or p == ".synthetic_versions" or re.fullmatch(r"\..+\.tmp-[a-z0-9_]{8}", p)
               for p in rel.parts[:-1])


@contextlib.contextmanager
def _recording(monkeypatch, root: Path):
    """Record, per asset, every outermost atomic write outside a set (path relative to root), and
    the members of every atomic_set."""
    loose: dict[str, set[str]] = {}
    sets: dict[str, list[str]] = {}

    def rec(real):
        @contextlib.contextmanager
        def write(dest, *args, **kwargs):
            rel = Path(os.path.abspath(dest)).relative_to(root.resolve())
            if not _is_set_or_nested(rel) and not str(rel).startswith(CACHES):
                asset = (artifacts.current_writer() or "?").split(" (partition ")[0]
                loose.setdefault(asset, set()).add(str(rel))
            with real(dest, *args, **kwargs) as out:
                yield out
        return write

    real_set = artifacts.atomic_set

    @contextlib.contextmanager
    def atomic_set(where, name, members, *args, **kwargs):
        sets.setdefault(name, []).extend(members)
        with real_set(where, name, members, *args, **kwargs) as stage:
            yield stage

    with monkeypatch.context() as m:
        m.setattr(artifacts, "atomic_path", rec(artifacts.atomic_path))
        m.setattr(artifacts, "atomic_dir", rec(artifacts.atomic_dir))
        m.setattr(artifacts, "atomic_set", atomic_set)
        yield loose, sets


def _runs(tmp_path: Path):
    """(root, assets, checks, run_config, partition, resources) of every materialization measured."""

    from sage_pipeline.definitions import ROUTING_ASSETS
    from sage_pipeline.defs import (
        benchmark_assets,
        bundle_assets,
        online_ab,
        policy_iteration,
        routing_checks,
        sim_assets,
        sleep_assets as sa,
    )
    from sage_pipeline.defs.resources import SandboxResource
    from sage_pipeline_tests.defs import (
        test_benchmark_assets as tba,
        test_policy_iteration_asset as tpi,
        test_routing_assets as tra,
        test_sim_policy_assets as tsp,
    )

    offline, sim, bench, sleep, month = (tmp_path / n for n in ("offline", "sim", "bench", "sleep", "month"))
    # sage_week's live day (SAGE_PYTHON set, as make test SAGE_SRC=... sets it) writes only into a fresh
    # sage_week_live/<when>/ folder of its own, which nothing reads until sessions/sage links it:
    # test_sage_week.py's live-day test checks that; measured here is the shipped week, the path make run takes
    offline_config = {"ops": {**tra.SMALL["ops"], "sage_week": {"config": {"live_day": "off"}}}}
    yield (offline, [*ROUTING_ASSETS, online_ab.online_ab, bundle_assets.sage_bundle],
           [routing_checks.routing_dataset_contract, routing_checks.routing_dataset_volume], offline_config, None, {})
    sandbox = {"sandbox": SandboxResource(backend="local", workers=2)}
    yield sim, [sim_assets.sim_tasks], [], {"ops": {"sim_tasks": {"config": {"n_tasks": 30, "seed": 3}}}}, None, sandbox
    yield sim, [sim_assets.sandbox_rollouts], [], None, sim_assets.SHARDS.get_partition_keys()[0], sandbox
    ppo = tsp._root(tmp_path / "ppo")
    yield ppo, [tsp.ppo_policy], [], tsp.SMALL, None, {}
    yield (bench, [benchmark_assets.routing_benchmark], [], {"ops": {"routing_benchmark": {"config": tba.FAST}}},
           None, {})
    yield (month, [policy_iteration.policy_iteration], [],
           {"ops": {"policy_iteration": {"config": {**tpi.TINY, "days": 2}}}}, None, {})
    yield sleep, [sa.sage_skills], [], {"ops": {"sleep_cycle__sage_skills": {"config": {"embedded": False}}}}, \
        "2026-11-03", {}


@pytest.mark.slow
def test_every_asset_writes_at_most_one_file_or_folder_outside_an_atomic_set(tmp_path, monkeypatch):
    """Issue 35: an asset that writes several files or folders writes them as one atomic_set (a kill
    or a full disk between two of them would leave files of two runs). Every asset is materialized
    in process (small configs) while the artifacts layer records each atomic write and the asset it
    was made for; an asset may write at most one file or folder outside a set."""
    import dagster as dg

    from sage_pipeline.definitions import defs
    from sage_pipeline.defs.resources import SageResource
    from sage_pipeline.rl import ppo_policy as pp

    measured: dict[str, set[str]] = {}
    all_sets: dict[str, list[str]] = {}
    for root, assets, checks, run_config, partition, resources in _runs(tmp_path):
        with _recording(monkeypatch, root) as (loose, sets):
            result = dg.materialize([*assets, *checks], resources={"sage": SageResource(data_dir=str(root)),
                                                                    **resources},
                                    run_config=run_config, partition_key=partition,
                                    instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)
        assert result.success, [e.event_specific_data.error.to_string() for e in result.all_events
                                if e.event_type_value == "STEP_FAILURE"]
        names = {e.asset_key.to_user_string() for e in result.all_events
                 if e.event_type_value == "ASSET_MATERIALIZATION"}
        assert set(loose) <= names, f"writes by no asset materialized here: {loose}"
        for name in names:
            measured.setdefault(name, set()).update(loose.get(name, set()))
        all_sets |= sets

    everything = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    unaccounted = sorted(everything - set(measured) - set(NOT_MEASURED))
    assert not unaccounted, f"assets neither measured here nor listed in NOT_MEASURED with a reason: {unaccounted}"
    several = {a: sorted(files) for a, files in measured.items() if len(files) > 1 and a not in KNOWN_LOOSE}
    assert not several, ("these assets write several files or folders one by one, outside an artifacts.atomic_set "
                         f"(a kill or a full disk between them leaves files of two runs): {several}")
    fixed = [a for a in KNOWN_LOOSE if len(measured.get(a, ())) <= 1]
    assert not fixed, f"{fixed} now write(s) at most one file outside a set: remove it from KNOWN_LOOSE"
    assert set(pp.MEMBERS) <= set(all_sets["ppo_policy"])
    assert {f"policy_iteration/{w}.png" for w in ("stationary", "drifting")} <= set(all_sets["policy_iteration"])
