"""A full disk names the path and the asset (issue 35): every OSError of an artifact write is
re-raised by ``artifacts`` (one place) as an ArtifactWriteError that says which file, for which
asset, and what to do, never a bare "[Errno 28] No space left on device"; the previous version
stays whole. On a real full filesystem: a small tmpfs mounted for the test (root only)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from pathlib import Path

import dagster as dg
import pytest

from sage_pipeline import artifacts
from sage_pipeline.defs import routing_assets, sleep_assets
from sage_pipeline.defs.resources import SageResource


@pytest.fixture
def disk(tmp_path):
    """``disk(mb)``: a fresh tmpfs of that size, unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(mb: int) -> Path:
        mnt = tmp_path / f"disk{len(mounted)}"
        mnt.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(mnt)],
                           capture_output=True, text=True)
        if r.returncode:
            pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(folder: Path, leave: int = 0) -> None:
    """Use up every byte left on ``folder``'s filesystem but ``leave``."""
    with open(folder / "filler", "ab", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)
            fh.flush()
    if leave:
        os.truncate(folder / "filler", max(0, os.path.getsize(folder / "filler") - leave))


def test_a_write_to_a_full_disk_names_the_path_and_the_asset_and_keeps_the_old_file(disk):
    root = disk(1)
    dest = root / "reports" / "r.json"
    artifacts.write_json(dest, {"v": 1})
    with artifacts.writer("reward_report"), pytest.raises(artifacts.ArtifactWriteError) as e:
        artifacts.write_bytes(dest, b"x" * 2_000_000)
    msg = str(e.value)
    assert str(dest) in msg and "asset reward_report" in msg and "No space left on device" in msg, msg
    assert "free space" in msg and "SAGE_DATA_DIR" in msg and e.value.errno == errno.ENOSPC
    assert isinstance(e.value, OSError) and e.value.filename == str(dest)
    assert dest.read_text() == '{\n  "v": 1\n}\n'
    assert os.listdir(dest.parent) == ["r.json"]  # no temporary file left


def test_a_read_error_inside_a_write_is_not_called_a_write_error(tmp_path):
    with pytest.raises(FileNotFoundError), artifacts.atomic_path(tmp_path / "out.txt"):
        open(tmp_path / "missing.txt")  # noqa: SIM115 - an input the writer cannot read


def _materialize(root: Path, assets, run_config=None, partition=None):
    return dg.materialize(assets, resources={"sage": SageResource(data_dir=str(root))}, run_config=run_config,
                          partition_key=partition, instance=dg.DagsterInstance.ephemeral(), raise_on_error=False)


def _error(result) -> str:
    failures = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    assert failures, "the run did not fail"
    err = failures[0].step_failure_data.error
    text = []
    while err is not None:
        text.append(err.message)
        err = err.cause
    return "\n".join(text)


@pytest.mark.slow
def test_trajectories_and_routing_dataset_on_a_full_disk_name_path_and_asset(disk):
    root = disk(48)
    small = {"ops": {"synthetic_sessions": {"config": {"episodes": 300, "seed": 3}}}}
    chain = [routing_assets.synthetic_sessions, routing_assets.trajectories, routing_assets.routing_dataset]
    assert _materialize(root, chain, small).success
    before = (root / "routing" / "trajectories.parquet").read_bytes()
    fill(root)
    for asset, path in ((routing_assets.trajectories, "routing/"), (routing_assets.routing_dataset, "routing/")):
        res = _materialize(root, [asset])
        msg = _error(res)
        name = asset.key.to_user_string()
        assert f"for asset {name}" in msg and "No space left on device" in msg, msg
        assert f"could not write {root}" in msg and path in msg, msg
        assert "[Errno 28] No space left on device\n" not in msg + "\n"  # never the bare error alone
    assert (root / "routing" / "trajectories.parquet").read_bytes() == before


def _night_on_a_full_disk(disk, leave: int, tmp_path: Path) -> tuple[Path, str]:
    root = disk(16)
    runs = tmp_path / "sage-workspaces"  # SAGE's runs, off the full disk (none: the night writes its own files only)
    runs.mkdir()
    config = {"ops": {"sleep_cycle__sage_skills": {"config": {"workspaces": [str(runs)], "sandbox": "local"}}}}
    assert _materialize(root, [sleep_assets.sage_skills], config, partition="2026-11-02").success
    fill(root, leave)
    return root, _error(_materialize(root, [sleep_assets.sage_skills], config, partition="2026-11-03"))


@pytest.mark.slow
def test_a_sleep_night_on_a_nearly_full_disk_names_path_and_asset(disk, tmp_path):
    """Room for the night's lock file (the skills root's lock, written directly), none for its diagnostics."""
    root, msg = _night_on_a_full_disk(disk, 16 * 1024, tmp_path)
    assert "for asset sleep_cycle/sage_skills (partition 2026-11-03)" in msg and "No space left on device" in msg, msg
    assert f"could not write {root}/sleep" in msg, msg


@pytest.mark.slow
def test_a_sleep_night_on_a_full_disk_names_path_and_asset(disk, tmp_path):
    root, msg = _night_on_a_full_disk(disk, 0, tmp_path)
    assert "for asset sleep_cycle/sage_skills (partition 2026-11-03)" in msg and "No space left on device" in msg, msg
