"""The action space: roles from the routing table, models from the table and the logs."""

from __future__ import annotations

import numpy as np
import pytest

from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.schema import ROLES
from sage_pipeline.sage.table import RoutingTable

SAGE_LIKE = {"routing": {
    "shell_router": {"primary": "llama3.2:3b", "fallback": "qwen3:14b-q4_K_M"},
    "coder": {"primary": "qwen2.5-coder:1.5b", "fallback": "codestral:22b",
              "fallback_triggers": ["task_complexity_score > 0.8"]},
    "reviewer": {"primary": "qwen3:14b-q4_K_M", "fallback": "claude-sonnet-4-5"},
}}


def test_built_from_table_and_logs_without_a_catalogue():
    table = RoutingTable.from_dict(SAGE_LIKE, source="models.yaml")
    logged = [("coder", "qwen2.5-coder:1.5b"), ("coder", "claude-sonnet-4-5"), ("ghost_role", "x:1b")]
    space = ActionSpace.build(table, logged)
    assert space.roles == ("coder", "reviewer", "shell_router")  # agent roles first, then the others
    # table models in order of appearance, then models only the logs show; a role the table does
    # not route contributes nothing
    assert space.actions == ("qwen2.5-coder:1.5b", "codestral:22b", "qwen3:14b-q4_K_M", "claude-sonnet-4-5",
                             "llama3.2:3b")
    assert space.candidates("coder") == ("qwen2.5-coder:1.5b", "codestral:22b", "claude-sonnet-4-5")
    assert space.candidates("shell_router") == ("qwen3:14b-q4_K_M", "llama3.2:3b")
    binary = space.binary()
    assert binary.name == "sage_binary" and binary.actions == space.actions
    assert binary.candidates("coder") == ("qwen2.5-coder:1.5b", "codestral:22b")
    role = np.array([0, 0])
    assert binary.in_space(role, np.array([1, 3])).tolist() == [True, False]
    assert space.in_space(role, np.array([1, 3])).tolist() == [True, True]


def test_catalogue_order_first_so_simulator_columns_match(catalogue, table):
    logged = [(r, m) for r in ROLES for m in catalogue.candidates(r)]
    space = ActionSpace.build(table, logged, catalogue)
    assert space.actions == catalogue.actions and space.roles == catalogue.roles
    assert (space.mask == catalogue.role_mask()).all()
    assert (space.primary == table.primary_index(catalogue)).all()


def test_save_load_roundtrip_and_errors(tmp_path):
    table = RoutingTable.from_dict(SAGE_LIKE)
    space = ActionSpace.build(table, [("coder", "claude-sonnet-4-5")])
    path = space.save(tmp_path / "action_space.json")
    back = ActionSpace.load(path)
    assert back.roles == space.roles and back.actions == space.actions and (back.mask == space.mask).all()
    assert (ActionSpace.load(path, "sage_binary").mask == space.binary().mask).all()
    with pytest.raises(ValueError, match="action space 'nope': use one of multi_model, sage_binary"):
        space.of("nope")
    with pytest.raises(FileNotFoundError, match="materialize routing_dataset first"):
        ActionSpace.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text('{"name": "multi_model"}')
    with pytest.raises(ValueError, match=r"bad\.json: not an action space"):
        ActionSpace.load(tmp_path / "bad.json")
