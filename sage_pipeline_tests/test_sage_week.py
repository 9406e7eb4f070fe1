"""The shipped SAGE week (sage_pipeline/sage/data/sage_week.tar.xz) as the project reads it: extracted once and
verified, idempotent, a changed or hostile archive refused naming the file, every journal line accepted or counted
(none quarantined), its deployment windows recorded once, and sage_week putting it where trajectories reads by
default. SAGE's own readers on it: test_sage_week_contract.py."""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline.routing import ingest
from sage_pipeline.sage import explore as sage_explore, week as W


@pytest.fixture(scope="module")
def week(tmp_path_factory) -> W.Week:
    return W.embedded_week(tmp_path_factory.mktemp("week"))


def test_the_manifest_is_a_week_of_sage_runs():
    m = W.load_manifest()
    assert len(m["days"]) >= 5 and all(n >= 40 for n in m["runs_per_day"].values())
    assert m["runs"] == sum(m["runs_per_day"].values())
    assert m["sage"]["commit"] and m["sage"]["models_yaml"] == "as shipped"
    truth = m["truth"]
    assert set(truth["bundles"]) == {f"coder={c},router={r}" for c in ("shipped", *truth["coder_models"])
                                     for r in ("yaml", "explore")}
    assert set(truth["per_day"]) == set(m["days"])


def test_embedded_week_extracts_verified_and_is_idempotent(week):
    m = week.manifest
    assert week.root.name == m["archive_sha256"][:W.SHA_DIGITS] and week.days == tuple(m["days"])
    assert week.journals.is_dir() and week.workspaces.is_dir()
    assert len(week.workspace_dirs) == len(week.sessions_dirs) > 0
    files = sorted(p.relative_to(week.root).as_posix() for p in week.root.rglob("*") if p.is_file())
    assert set(files) - {".verified"} == set(m["files"])
    stamp = (week.root / ".verified").stat().st_mtime_ns
    again = W.embedded_week(week.root.parent.parent)
    assert again == week and (week.root / ".verified").stat().st_mtime_ns == stamp  # found, not extracted again
    runs = week.runs()
    assert len(runs) == m["runs"] and all(r["sessions"] for r in runs)


def test_every_run_has_its_goal_in_the_ledgers_the_harvest_reads(week):
    """SAGE logs no goal: the week ships each run's (records/day-NN/goals.jsonl), read by the harvest's reader."""
    from sage_pipeline.sleep.sage_harvest import SageHarvestResult, read_goal_ledgers

    out = SageHarvestResult()
    goals = read_goal_ledgers(week.goal_ledgers, out, 10)
    assert len(week.goal_ledgers) == len(week.days) and not out.missing
    runs = week.runs()
    for r in runs:
        for sid in r["sessions"]:
            goal, where = goals[("session_id", sid)]
            assert goal.startswith(f"[sage-world run={r['run']}] ")  # harness.goal: the run mark, then the prompt
            assert where.startswith(f"{week.records / ('day-' + r['run'][1:3]) / W.GOALS_NAME}:")  # its day's ledger
    assert len(goals) == sum(len(r["sessions"]) for r in runs)


def test_every_journal_line_is_accepted_or_counted(week, tmp_path):
    res = ingest.ingest(ingest.IngestConfig([week.journals]), tmp_path / "routing", progress=lambda m: None)
    s = res.stats
    assert s.lines_read == week.manifest["journal_lines"]
    assert s.quarantined == 0 and s.accepted_lines == s.lines_read and not s.damaged_files and not s.skipped_paths
    assert s.steps_accepted > 0 and s.rows_by_source.get("synthetic", 0) == 0
    sessions = {sid for r in week.runs() for sid in r["sessions"]}
    import pandas as pd

    assert set(pd.read_parquet(res.trajectories, columns=["session_id"])["session_id"].astype(str)) == sessions


def _copy_data(tmp_path: Path, monkeypatch) -> Path:
    data = tmp_path / "pkg"
    data.mkdir()
    for n in (W.ARCHIVE_NAME, W.MANIFEST_NAME):
        shutil.copyfile(W.DATA_DIR / n, data / n)
    monkeypatch.setattr(W, "DATA_DIR", data)
    return data


def test_a_changed_archive_is_refused_naming_it(tmp_path, monkeypatch):
    data = _copy_data(tmp_path, monkeypatch)
    raw = bytearray((data / W.ARCHIVE_NAME).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (data / W.ARCHIVE_NAME).write_bytes(bytes(raw))
    with pytest.raises(W.WeekError, match=rf"{data / W.ARCHIVE_NAME}: sha256 [0-9a-f]{{64}} is not the manifest's"):
        W.embedded_week(tmp_path / "root")
    assert not (tmp_path / "root" / W.EXTRACT_DIR).exists() or not any((tmp_path / "root" / W.EXTRACT_DIR).iterdir())


def test_a_changed_extracted_file_is_refused_naming_it(week, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(week.root.parent.parent, root)
    victim = next((root / W.EXTRACT_DIR).rglob("memory/sessions/*.log"))
    victim.write_text(victim.read_text() + '{"type": "FORGED"}\n')
    with pytest.raises(W.WeekError, match=rf"{victim}: sha256 .* is not the manifest's"):
        W.embedded_week(root)


def test_a_bad_manifest_field_is_named(tmp_path, monkeypatch):
    data = _copy_data(tmp_path, monkeypatch)
    m = json.loads((data / W.MANIFEST_NAME).read_text())
    name = next(iter(m["files"]))
    m["files"]["../escape"] = m["files"].pop(name)
    (data / W.MANIFEST_NAME).write_text(json.dumps(m))
    with pytest.raises(W.WeekError, match=r"sage_week.json: field .files\['\.\./escape'\].: not a plain relative"):
        W.embedded_week(tmp_path / "root")


def _hostile(tmp_path: Path, monkeypatch, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    """An archive of the week's files plus one hostile member, and a manifest whose sha256 is that archive's."""
    pkg = _copy_data(tmp_path, monkeypatch)
    m = json.loads((pkg / W.MANIFEST_NAME).read_text())
    buf = io.BytesIO()
    with tarfile.open(W.DATA_DIR / W.ARCHIVE_NAME, "r:xz") as src, tarfile.open(fileobj=buf, mode="w:xz") as out:
        out.addfile(member, io.BytesIO(data) if member.isreg() else None)  # first: refused before anything lands
        for x in src.getmembers():
            out.addfile(x, src.extractfile(x))
    (pkg / W.ARCHIVE_NAME).write_bytes(buf.getvalue())
    m["archive_sha256"] = __import__("hashlib").sha256(buf.getvalue()).hexdigest()
    (pkg / W.MANIFEST_NAME).write_text(json.dumps(m))
    return pkg / W.ARCHIVE_NAME


def _member(name: str, kind: bytes = tarfile.REGTYPE, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.size, info.linkname = kind, size, link
    return info


@pytest.mark.parametrize("member, why", [
    (_member(f"{W.TOP}/workspaces/x", tarfile.SYMTYPE, link="/etc/passwd"), "not a regular file"),
    (_member(f"{W.TOP}/../../escape", size=1), "not under sage_week/"),
    (_member("/abs/path", size=1), "not under sage_week/"),
    (_member(f"{W.TOP}/not_listed.txt", size=1), "not in the manifest"),
    (_member(f"{W.TOP}/{W.DEPLOYMENTS}", size=10**6), "the manifest says"),
], ids=["link out", "dotdot", "absolute", "unlisted", "larger than listed"])
def test_a_hostile_archive_is_refused_and_nothing_is_left(tmp_path, monkeypatch, member, why):
    archive = _hostile(tmp_path, monkeypatch, member, b"x" * member.size if member.isreg() else b"")
    root = tmp_path / "root"
    with pytest.raises(W.WeekError, match=rf"{archive}: member .*{why}"):
        W.embedded_week(root)
    assert not [p for p in (root / W.EXTRACT_DIR).iterdir()]  # the staging folder is gone, nothing renamed in
    assert not Path("/abs/path").exists() and not (tmp_path / "escape").exists()


def test_the_deployment_windows_are_recorded_once_in_time_order(week, tmp_path):
    root = tmp_path / "root"
    later = W.record_deployments(week, root)
    assert len(later) == len(week.manifest["deployments"])
    assert all(Path(d.path).is_file() and Path(d.path).is_relative_to(root) for d in later)
    assert W.record_deployments(week, root) == later  # each window once
    # a deployment after the week (a live day): the week's windows stay before it
    last = sage_explore.record_deployment(root, None)
    fresh = tmp_path / "fresh"
    sage_explore.record_deployment(fresh, None, deployed_from=last.deployed_from)
    both = W.record_deployments(week, fresh)
    assert [d.sha256 for d in both] == [d.sha256 for d in later] + [None]


@pytest.mark.slow
def test_sage_week_feeds_trajectories_on_its_defaults(tmp_path, monkeypatch):
    """sage_week (no SAGE: the shipped week alone) then trajectories with its default log_dirs: every SAGE line
    read, none quarantined, nothing else read."""
    from sage_pipeline.defs import routing_assets as ra
    from sage_pipeline.defs.resources import SageResource

    monkeypatch.delenv("SAGE_PYTHON", raising=False)
    res = dg.materialize([ra.sage_week, ra.trajectories], resources={"sage": SageResource(data_dir=str(tmp_path))},
                         instance=dg.DagsterInstance.ephemeral())
    assert res.success
    wk = {k: v.value for k, v in res.asset_materializations_for_node("sage_week")[-1].metadata.items()}
    tr = {k: v.value for k, v in res.asset_materializations_for_node("trajectories")[-1].metadata.items()}
    m = W.load_manifest()
    assert wk["runs"] == m["runs"] and wk["live_day"]["ran"] is False and wk["other_journal_folders"] == []
    assert tr["lines_read"] == m["journal_lines"] and tr["quarantined_lines"] == 0
    assert os.path.islink(tmp_path / "sessions" / "sage" / "week")
    assert json.loads((tmp_path / "sessions" / "sage" / ra.JOURNAL_CLOCK).read_text())["clock_scale"] == \
        m["settings"]["world"]["clock_scale"]


@pytest.mark.slow
def test_a_live_sage_day_is_added_beside_the_week_and_written_into_its_own_folder(sage_python, tmp_path,
                                                                                 tmp_path_factory):
    """live_day 'on' with SAGE at hand: SAGE's unchanged `sage run` runs one more day in the week's model world,
    into a fresh sage_week_live/<when>/ folder; its journals are linked beside the week's and trajectories reads
    them too; its exploring checkpoint's windows join checkpoints/sage_deployments.jsonl. Outside that folder the
    asset writes only sessions/sage (one atomic folder of links) and the deployments record."""
    import contextlib

    from sage_pipeline import artifacts
    from sage_pipeline.defs import routing_assets as ra
    from sage_pipeline.defs.resources import SageResource

    runs = 4
    written: list[Path] = []

    def recording(real):
        @contextlib.contextmanager
        def record(dest, *a, **k):  # sage_week's own writes (its live day's threads name no writer)
            if (artifacts.current_writer() or "sage_week").startswith("sage_week"):
                written.append(Path(os.path.abspath(dest)))
            with real(dest, *a, **k) as out:
                yield out
        return record

    mp = pytest.MonkeyPatch()
    mp.setattr(artifacts, "atomic_path", recording(artifacts.atomic_path))
    mp.setattr(artifacts, "atomic_dir", recording(artifacts.atomic_dir))
    try:
        res = dg.materialize([ra.sage_week, ra.trajectories], resources={"sage": SageResource(data_dir=str(tmp_path))},
                             run_config={"ops": {"sage_week": {"config": {"live_day": "on", "live_runs": runs}}}},
                             instance=dg.DagsterInstance.ephemeral())
    finally:
        mp.undo()
    assert res.success
    wk = {k: v.value for k, v in res.asset_materializations_for_node("sage_week")[-1].metadata.items()}
    tr = {k: v.value for k, v in res.asset_materializations_for_node("trajectories")[-1].metadata.items()}
    m = W.load_manifest()
    live = wk["live_day"]
    assert live["ran"] is True and live["runs"] == runs and live["day"] == len(m["days"]) + 1
    assert wk["runs"] == m["runs"] + runs and wk["days"] == len(m["days"]) + 1
    folder = Path(live["folder"])
    assert folder.parent == tmp_path / ra.LIVE_DIR and (folder / "truth.json").is_file()
    linked = sorted(p.name for p in (tmp_path / "sessions" / "sage" / "live").iterdir())  # a link per workspace
    assert linked and all((tmp_path / "sessions" / "sage" / "live" / n).resolve().is_relative_to(folder)
                                       for n in linked)
    assert tr["lines_read"] > m["journal_lines"] and tr["quarantined_lines"] == 0
    deployments = (tmp_path / "checkpoints" / "sage_deployments.jsonl").read_text().splitlines()
    fresh = tmp_path_factory.mktemp("week_alone")  # the week's windows alone, and the live day's one after them
    week_alone = W.record_deployments(W.embedded_week(fresh), fresh)
    assert len(deployments) == len(week_alone) + 1
    assert json.loads(deployments[-1])["deployed_from"] > max(d.deployed_until for d in week_alone).isoformat()
    outside = {str(p.relative_to(tmp_path)) for p in written
               if not p.is_relative_to(folder) and not any(part.startswith(".") for part in p.parts)}  # not staged
    assert "sessions/sage" in outside and any(p.is_relative_to(folder) for p in written)
    assert outside <= {"sessions/sage", "checkpoints/sage_deployments.jsonl"} | {
        s for s in outside if s.startswith(("checkpoints/sage_deployed/", "sage_week/"))}, outside
