"""Writing a models.yaml SAGE reads: round trip, SAGE's grammar, primary-only and fallback-only routes."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from sage_pipeline.sage.checkpoint import table_differences
from sage_pipeline.sage.table import ALWAYS, NEVER, SAGE_TABLE, RoutingTable, Trigger


def test_sages_own_table_survives_a_round_trip(tmp_path):
    t = RoutingTable.load(SAGE_TABLE)
    out = t.write(tmp_path / "models.yaml", header="written by a test\n\nsecond paragraph")
    back = RoutingTable.load(out)
    assert back.routes == t.routes and table_differences(t, back) == []
    text = out.read_text()
    assert text.startswith("# written by a test\n#\n# second paragraph\n")
    assert "task_complexity_score > 0.8" in text and "primary_failure_count >= 2" in text
    assert list(yaml.safe_load(text)["routing"]) == list(t.routes)


def test_an_edited_route_and_its_differences():
    t = RoutingTable.load(SAGE_TABLE)
    big = "qwen2.5-coder:14b-instruct-q4_K_M"
    e = t.with_route("coder", primary=big, triggers=(Trigger("task_complexity_score", ">", 0.35),))
    assert e.routes["coder"].primary == big and e.routes["debugger"] == t.routes["debugger"]
    diff = table_differences(t, e)
    assert diff == ["role 'coder': primary/fallback qwen2.5-coder:1.5b/qwen2.5-coder:14b-instruct-q4_K_M in the "
                    "checkpoint's table, qwen2.5-coder:14b-instruct-q4_K_M/qwen2.5-coder:14b-instruct-q4_K_M in SAGE's"]
    same_models = t.with_route("coder", triggers=(Trigger("task_complexity_score", ">", 0.35),))
    assert "task_complexity_score > 0.35" in table_differences(t, same_models)[0]
    with pytest.raises(ValueError, match="give its primary and fallback"):
        t.with_route("nobody", primary="m")


def test_never_and_always_mean_what_they_say_and_empty_means_sages_back_compat_rule():
    t = RoutingTable.load(SAGE_TABLE)
    roles = list(t.roles)
    i = roles.index("reviewer")
    c = np.array([0.1, 0.9, 0.1, 0.9])
    fc = np.array([0, 0, 2, 5])
    role = np.full(4, i)

    def fires(tab):
        return tab.fallback_fires(role, c, fc, fc).tolist()

    assert fires(t.with_route("reviewer", triggers=NEVER)) == [False] * 4
    assert fires(t.with_route("reviewer", triggers=ALWAYS)) == [True] * 4
    # SAGE's ModelRouter.should_use_fallback: no triggers -> failure_count >= 2 or complexity > 0.8
    assert fires(t.with_route("reviewer", triggers=())) == [False, True, True, True]


def test_a_threshold_sage_cannot_read_is_never_written(tmp_path):
    t = RoutingTable.load(SAGE_TABLE)
    with pytest.raises(ValueError, match="SAGE's trigger grammar"):
        t.with_route("coder", triggers=(Trigger("task_complexity_score", ">", -0.5),)).write(tmp_path / "m.yaml")
    assert not (tmp_path / "m.yaml").exists()
