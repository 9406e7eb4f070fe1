"""A journal may be anything: the ingest lists a path named like a journal that is not a regular file (a FIFO, a
device behind a link) in ``skipped_paths`` with the reason, never opens it (a FIFO cannot hang it), and reads the rest;
a FIFO swapped in after the listing is a damaged file, not a hang."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from sage_pipeline.routing import ingest
from sage_pipeline.routing.ingest import IngestConfig
from sage_pipeline_tests.hang_guard import finishes

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "sage_world_run"


def _finishes(fn, timeout_s: float = 30.0):
    return finishes(fn, timeout_s)


def _logs(tmp_path) -> Path:
    logs = tmp_path / "sessions"
    shutil.copytree(FIXTURE / "ws-0" / "memory" / "sessions", logs)  # SAGE's own journal of three runs
    return logs


def test_a_fifo_or_a_device_named_like_a_journal_is_listed_with_its_reason_and_never_opened(tmp_path):
    logs = _logs(tmp_path)
    os.mkfifo(logs / "2026-11-29.log")
    (logs / "2026-11-30.jsonl").symlink_to("/dev/zero")
    res = _finishes(lambda: ingest.ingest(IngestConfig([logs]), tmp_path / "out", progress=lambda m: None))
    skipped = {Path(s["path"]).name: s["reason"] for s in res.stats.skipped_paths}
    assert set(skipped) == {"2026-11-29.log", "2026-11-30.jsonl"}
    assert skipped["2026-11-29.log"].startswith("not a regular file (a FIFO), named like a journal: never opened")
    assert skipped["2026-11-30.jsonl"].startswith("not a regular file (a character device)")
    assert res.stats.files == [str(logs / "2026-11-28.log")] and res.stats.steps_accepted > 0
    assert res.stats.quarantined == 0 and res.stats.skipped_fraction == 2 / 3


def test_a_fifo_swapped_in_after_the_listing_is_a_damaged_file_not_a_hang(tmp_path, monkeypatch):
    logs = _logs(tmp_path)
    listed = ingest.discover_logs(IngestConfig([logs]))
    (path,) = listed[0]
    path.unlink()
    os.mkfifo(path)
    monkeypatch.setattr(ingest, "discover_logs", lambda config, setting="log_dirs": listed)
    monkeypatch.setattr(ingest.os.path, "getsize", lambda p: 1)  # as if it still had its size
    res = _finishes(lambda: ingest.ingest(IngestConfig([logs]), tmp_path / "out", progress=lambda m: None))
    (damaged,) = res.stats.damaged_files
    assert damaged["file"] == str(path) and damaged["reason"].startswith("not a regular file (a FIFO)")
    blocks = _finishes(lambda: list(ingest.iter_blocks(path, 1 << 20, 1 << 16)))
    assert len(blocks) == 1 and blocks[0].damaged.startswith("not a regular file (a FIFO)")
