"""The SAGE journal fixture has SAGE's shape (checked with plain json, not the ingest)."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import yaml

FIXTURE = Path(__file__).with_name("fixtures") / "sage_journal"
SESSIONS = FIXTURE / "memory" / "sessions"


def _files() -> list[Path]:
    return sorted(SESSIONS.iterdir())


def _events(path: Path) -> list[dict]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines()]


def test_files_are_date_named_journals_one_gzipped():
    names = [p.name for p in _files()]
    assert names == [f"2026-11-{d}.log" for d in range(16, 21)] + ["2026-11-21.log.gz"]


def test_events_have_sages_shape():
    table = yaml.safe_load((FIXTURE / "models.yaml").read_text())["routing"]
    with_ids, without_ids = 0, 0
    for path in _files():
        events = _events(path)
        has_id = {"session_id" in e for e in events}
        assert len(has_id) == 1  # SAGE_SESSION_ID is set for a whole run or not at all
        with_ids += has_id == {True}
        without_ids += has_id == {False}
        types = Counter(e["type"] for e in events)
        assert types["MODEL_ROUTING_DECISION"] == types["TOKEN_USAGE"] == types["TRAJECTORY_STEP"] > 0
        last_mrd = {}
        for e in events:
            assert e["timestamp"][10] == "T" and e["timestamp"].endswith("+00:00")
            if e["type"] == "MODEL_ROUTING_DECISION":
                last_mrd[e["agent_role"]] = e
                route = table[e["agent_role"]]
                assert (e["primary_model"], e["fallback_model"]) == (route["primary"], route["fallback"])
            if e["type"] == "TRAJECTORY_STEP":
                assert "step" not in e and "propensity" not in e and "failure_count" not in e["state"]
                assert e["agent"] in table
                model = e["action"]["model_chosen"]
                assert model in (table[e["agent"]]["primary"], table[e["agent"]]["fallback"])
                assert last_mrd[e["agent"]]["selected_model"] == model  # its routing decision came first
    assert with_ids == 3 and without_ids == 3


def test_table_has_sages_extra_roles_and_ollama_models():
    text = (FIXTURE / "models.yaml").read_text()
    assert text.startswith("#")
    table = yaml.safe_load(text)["routing"]
    assert {"shell_router", "shell_chat"} <= set(table) and len(table) == 10
    models = {m for r in table.values() for m in (r["primary"], r["fallback"])}
    assert {"qwen2.5-coder:1.5b", "qwen3:14b-q4_K_M", "codestral:22b", "claude-sonnet-4-5"} <= models
