"""The numpy router for many models: confident policy, else YAML; exact logged propensities."""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from sage_pipeline.rl.router import Router
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.table import RoutingTable

TABLE = {"routing": {
    "coder": {"primary": "qwen2.5-coder:1.5b", "fallback": "codestral:22b",
              "fallback_triggers": ["primary_failure_count >= 2"]},
    "shell_chat": {"primary": "llama3.2:3b", "fallback": "qwen3:14b-q4_K_M"},
}}


@dataclass(frozen=True)
class Fixed:
    """Coder: 0.8 on claude when complexity > 0.5 else 0.5/0.5 between primary and fallback."""

    space: ActionSpace
    name: str = "fixed"

    @property
    def actions(self):
        return self.space.actions

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        out = np.zeros((len(ctx), len(self.actions)))
        idx = self.space.index
        hard = ctx.task_complexity_score > 0.5
        out[hard, idx["claude-sonnet-4-5"]] = 0.8
        out[hard, idx["codestral:22b"]] = 0.2
        out[~hard, idx["qwen2.5-coder:1.5b"]] = 0.5
        out[~hard, idx["codestral:22b"]] = 0.5
        return out


@pytest.fixture()
def setup():
    table = RoutingTable.from_dict(TABLE, source="models.yaml")
    space = ActionSpace.build(table, [("coder", "claude-sonnet-4-5")])
    return table, space


def test_confident_policy_acts_else_yaml(setup, tmp_path):
    table, space = setup
    journal = tmp_path / "memory" / "sessions" / "2026-11-24.log"
    router = Router(Fixed(space), table, space, min_confidence=0.6, seed=0, journal=journal)
    d = router.route("coder", 0.9, 0, 0)
    assert (d.model, d.policy_source, d.propensity, d.confidence) == ("claude-sonnet-4-5", "learned", 1.0, 0.8)
    d = router.route("coder", 0.2, 2, 2)  # 0.5 < 0.6: the table decides (its trigger fires)
    assert (d.model, d.policy_source, d.propensity) == ("codestral:22b", "yaml", 1.0)
    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [x["selected_model"] for x in lines] == ["claude-sonnet-4-5", "codestral:22b"]
    assert lines[1]["matched_fallback_triggers"] == ["primary_failure_count >= 2"]
    assert lines[1]["primary_model"] == "qwen2.5-coder:1.5b" and lines[1]["propensity"] == 1.0
    assert {"type", "timestamp", "agent_role", "selected_model", "policy_source"} <= set(lines[0])


def test_logged_propensity_is_the_exact_frequency_with_exploration(setup):
    table, space = setup
    router = Router(Fixed(space), table, space, min_confidence=0.6, epsilon=0.3, seed=1)
    n = 6000
    picks = [router.route("coder", 0.9, 0, 0) for _ in range(n)]
    for model in ("claude-sonnet-4-5", "codestral:22b", "qwen2.5-coder:1.5b"):
        got = [d for d in picks if d.model == model]
        p = got[0].propensity
        assert all(d.propensity == p for d in got)
        assert abs(len(got) / n - p) < 4 * np.sqrt(p * (1 - p) / n)
    assert picks[0].propensity in (pytest.approx(0.8), pytest.approx(0.1))  # 0.7 + 0.3/3, or 0.3/3


def test_bad_input_is_named(setup):
    table, space = setup
    router = Router(Fixed(space), table, space)
    with pytest.raises(ValueError, match=r"role 'ghost' is not routed by the table models\.yaml"):
        router.route("ghost", 0.1, 0, 0)
    other = ActionSpace.build(table)
    with pytest.raises(ValueError, match="policy actions"):
        Router(Fixed(space), table, other)
    with pytest.raises(ValueError, match="must lie in"):
        Router(Fixed(space), table, space, epsilon=1.5)
