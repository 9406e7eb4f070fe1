"""Task records: stable splits, reference validation, task files with quarantine."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from sage_pipeline.sleep.harness.sim_world import SimWorld
from sage_pipeline.sleep.records import (
    SplitSpec,
    TaskRecordError,
    normalise_reference,
    read_task_file,
    task_from_dict,
    write_task_file,
)

GOOD = {"id": "t-1", "intent": "Say hi", "reference_kind": "rules", "reference": [{"contains": "hi"}]}


def test_split_is_a_stable_hash_with_the_configured_shares():
    spec = SplitSpec()
    ids = [f"task-{i}" for i in range(4000)]
    first = [spec.of(i) for i in ids]
    assert first == [SplitSpec().of(i) for i in ids]  # stable across calls and instances
    shares = Counter(first)
    assert abs(shares["train"] / 4000 - 0.5) < 0.03 and abs(shares["val"] / 4000 - 0.25) < 0.03
    assert task_from_dict(GOOD, "x").split == spec.of("t-1")
    with pytest.raises(ValueError, match="train \\+ val < 1"):
        SplitSpec(train=0.8, val=0.3)


def test_references_are_validated_and_normalised():
    assert normalise_reference("rules", [{"contains": "a", "ignore_case": True}, {"max_chars": 5}]) == [
        {"check": "contains", "value": "a", "ignore_case": True},
        {"check": "max_chars", "value": 5, "ignore_case": False}]
    ut = normalise_reference("unit_tests", {"entry_point": "f", "tests": [{"args": [1], "expected": 2}]})
    assert ut["timeout_s"] == 5.0
    bad = [("exact", "", "non-empty string"), ("rules", [], "non-empty list"),
           ("rules", [{"regex": "("}], "not a valid regular expression"),
           ("rules", [{"contains": "a", "regex": "b"}], "exactly one"),
           ("rules", [{"max_chars": -1}], "non-negative integer"),
           ("unit_tests", {"entry_point": "1f", "tests": []}, "Python function name"),
           ("unit_tests", {"entry_point": "f", "tests": [{"args": 1}]}, "args"),
           ("sql", "x", "not one of")]
    for kind, ref, msg in bad:
        with pytest.raises(TaskRecordError, match=msg):
            normalise_reference(kind, ref)


def test_task_file_quarantines_bad_lines_with_line_and_reason(tmp_path):
    path = tmp_path / "tasks.jsonl"
    lines = [json.dumps(GOOD).encode(), b'{"id": "t-2", "intent": "x"', b"[1, 2]",
             json.dumps({**GOOD, "id": "t-3", "reference_kind": "rubric", "reference": ""}).encode(),
             json.dumps({k: v for k, v in GOOD.items() if k != "reference"} | {"id": "t-4"}).encode(),
             b'{"id": "t-5", "intent": "caf\xe9"}', b"",
             json.dumps({**GOOD, "id": "t-6", "colour": "red"}).encode(),
             json.dumps({**GOOD, "id": "t-7", "date": "1 Nov"}).encode(),
             json.dumps({**GOOD, "id": "t-8", "tags": ["a"], "context": "ctx"}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    res = read_task_file(path)
    assert [t.id for t in res.tasks] == ["t-1", "t-8"]
    q = {x.line: x for x in res.quarantined}
    assert sorted(q) == [2, 3, 4, 5, 6, 8, 9]
    assert "invalid JSON" in q[2].reason and "JSON object" in q[3].reason
    assert q[4].field == "reference" and "missing" in q[5].reason
    assert "not UTF-8" in q[6].reason and "0xe9" in q[6].reason
    assert "unknown fields" in q[8].reason and "YYYY-MM-DD" in q[9].reason
    assert all(x.file == str(path) for x in res.quarantined)
    assert res.tasks[0].origin == f"{path}:1"


def test_task_file_roundtrip_keeps_every_field(tmp_path):
    tasks = SimWorld.load("coder").generate_tasks(seed=5, per_topic=1)
    back = read_task_file(write_task_file(tmp_path / "t.jsonl", tasks)).tasks
    assert [(t.id, t.intent, t.reference, t.tags, t.split, t.meta) for t in back] == [
        (t.id, t.intent, t.reference, t.tags, t.split, t.meta) for t in tasks]


def test_packaged_tasks_are_the_simulated_world_seed_0():
    from sage_pipeline.sleep.harness.sim_world import PACKAGED_TASKS

    for skill in ("coder", "reviewer"):
        packaged = read_task_file(PACKAGED_TASKS / f"{skill}.jsonl")
        assert not packaged.quarantined
        fresh = SimWorld.load(skill).generate_tasks(seed=0, prefix="embedded")
        assert [(t.id, t.reference, t.meta) for t in packaged.tasks] == [(t.id, t.reference, t.meta) for t in fresh]
        assert {s for s in (t.split for t in packaged.tasks)} == {"train", "val", "test"}


def test_content_key_ignores_id_case_and_whitespace():
    a = task_from_dict(GOOD, "x")
    b = task_from_dict({**GOOD, "id": "other", "intent": "  say   HI "}, "y")
    assert a.content_key() == b.content_key() and a.id != b.id
