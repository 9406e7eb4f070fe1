"""The numpy router for many models: confident policy, else YAML; exact logged propensities;
SAGE-shaped MODEL_ROUTING_DECISION journal lines."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pytest

from sage_pipeline.rl.router import Router
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.features import Contexts
from sage_pipeline.sage.table import RoutingTable

TABLE = {"routing": {
    "coder": {"primary": "qwen2.5-coder:1.5b", "fallback": "codestral:22b",
              "fallback_triggers": ["primary_failure_count >= 2", "task_complexity_score > 0.95"]},
    "shell_chat": {"primary": "llama3.2:3b", "fallback": "qwen3:14b-q4_K_M"},
}}
MRD_FIELDS = {"type", "timestamp", "agent_role", "task_complexity_score", "primary_failure_count", "primary_model",
              "fallback_model", "selected_model", "matched_fallback_triggers", "policy_source", "propensity"}


@dataclass(frozen=True)
class Fixed:
    """Coder: 0.8 on claude (a model only the logs show) when complexity > 0.5, else 0.5/0.5
    between primary and fallback. shell_chat: 0.7 on its fallback."""

    space: ActionSpace
    name: str = "fixed"

    @property
    def actions(self):
        return self.space.actions

    @property
    def role_mask(self):
        return self.space.mask

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        out = np.zeros((len(ctx), len(self.actions)))
        idx = self.space.index
        coder = ctx.role == self.space.role_index["coder"]
        hard = coder & (ctx.task_complexity_score > 0.5)
        out[hard, idx["claude-sonnet-4-5"]] = 0.8
        out[hard, idx["codestral:22b"]] = 0.2
        easy = coder & ~hard
        out[easy, idx["qwen2.5-coder:1.5b"]] = 0.5
        out[easy, idx["codestral:22b"]] = 0.5
        out[~coder, idx["qwen3:14b-q4_K_M"]] = 0.7
        out[~coder, idx["llama3.2:3b"]] = 0.3
        return out


@pytest.fixture()
def setup():
    table = RoutingTable.from_dict(TABLE, source="models.yaml")
    space = ActionSpace.build(table, [("coder", "claude-sonnet-4-5")])
    return table, space


@pytest.fixture(autouse=True)
def _no_sage_env(monkeypatch):
    for var in ("SAGE_SESSION_ID", "SAGE_TRACE_ID", "SAGE_JSON_LOG_EXTRA_PATH"):
        monkeypatch.delenv(var, raising=False)


def test_confident_policy_acts_else_yaml(setup, tmp_path):
    table, space = setup
    journal = tmp_path / "memory" / "sessions" / "2026-11-24.log"
    router = Router(Fixed(space), table, space, min_confidence=0.6, seed=0, journal=journal)
    d = router.route("coder", 0.9, 0, 0)  # 0.8 >= 0.6: the policy's argmax, a model the table never picks
    assert (d.model, d.policy_source, d.probability, d.confidence) == ("claude-sonnet-4-5", "learned", 1.0, 0.8)
    assert d.yaml_model == "qwen2.5-coder:1.5b" and not d.explored
    d = router.route("coder", 0.2, 2, 2)  # 0.5 < 0.6: the table decides (its trigger fires)
    assert (d.model, d.policy_source, d.propensity) == ("codestral:22b", "yaml", 1.0)
    d = router.route("coder", 0.2, 0, 3)  # the table's trigger reads primary_failure_count, not failure_count
    assert (d.model, d.policy_source) == ("qwen2.5-coder:1.5b", "yaml")
    d = router.route("shell_chat", 0.1, 0, 0, step=3, prompt_tokens=1200)
    assert (d.model, d.policy_source) == ("qwen3:14b-q4_K_M", "learned")
    # at the floor exactly, the policy acts (>=, as SAGE's hook)
    assert Router(Fixed(space), table, space, min_confidence=0.8).route("coder", 0.9, 0, 0).policy_source == "learned"

    lines = [json.loads(x) for x in journal.read_text().splitlines()]
    assert [x["selected_model"] for x in lines] == ["claude-sonnet-4-5", "codestral:22b", "qwen2.5-coder:1.5b",
                                                    "qwen3:14b-q4_K_M"]
    for x in lines:
        assert set(x) == MRD_FIELDS and x["type"] == "MODEL_ROUTING_DECISION"
        assert datetime.fromisoformat(x["timestamp"]).utcoffset() is not None  # ISO 8601 with an offset
        assert x["propensity"] == 1.0
    assert lines[0] == {**lines[0], "agent_role": "coder", "task_complexity_score": 0.9, "primary_failure_count": 0,
                        "primary_model": "qwen2.5-coder:1.5b", "fallback_model": "codestral:22b",
                        "matched_fallback_triggers": [], "policy_source": "learned"}
    assert lines[1]["matched_fallback_triggers"] == ["primary_failure_count >= 2"]
    assert lines[1]["policy_source"] == "yaml" and lines[1]["primary_failure_count"] == 2
    assert lines[3]["agent_role"] == "shell_chat" and lines[3]["fallback_model"] == "qwen3:14b-q4_K_M"


def test_without_a_journal_nothing_is_written_but_the_event_is_returned(setup, tmp_path):
    table, space = setup
    d = Router(Fixed(space), table, space).route("coder", 0.99, 0, 0)
    assert d.event["matched_fallback_triggers"] == ["task_complexity_score > 0.95"]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tcs, rule_model", [(0.9, "claude-sonnet-4-5"), (0.2, "qwen2.5-coder:1.5b")])
def test_logged_propensity_is_the_exact_frequency_with_exploration(setup, tcs, rule_model):
    """Learned rule (0.9) and YAML rule (0.2, the policy is unsure): the propensity of each
    model is (1 - eps) [model == rule's] + eps / 3, and the empirical frequencies match it."""
    table, space = setup
    eps, n = 0.3, 6000
    router = Router(Fixed(space), table, space, min_confidence=0.6, epsilon=eps, seed=1)
    picks = [router.route("coder", tcs, 0, 0) for _ in range(n)]
    for model in space.candidates("coder"):
        want = (1 - eps) * (model == rule_model) + eps / 3
        got = [d for d in picks if d.model == model]
        assert all(d.propensity == pytest.approx(want) for d in got)
        assert abs(len(got) / n - want) < 4 * np.sqrt(want * (1 - want) / n)
        assert all(d.explored == (model != rule_model) for d in got)
        assert np.isclose(router.probabilities("coder", tcs, 0, 0)[space.index[model]], want)
    assert not any(d.model == "llama3.2:3b" for d in picks)  # never another role's model
    sources = {d.model: d.policy_source for d in picks}
    if rule_model == "qwen2.5-coder:1.5b":  # the table's rule: its own model is "yaml", an explored one is not
        assert sources == {"qwen2.5-coder:1.5b": "yaml", "codestral:22b": "learned", "claude-sonnet-4-5": "learned"}
    else:
        assert set(sources.values()) == {"learned"}


def test_same_seed_same_decisions(setup):
    table, space = setup
    r1, r2, r3 = (Router(Fixed(space), table, space, epsilon=0.5, seed=s) for s in (7, 7, 8))
    runs = [[r.route("coder", 0.9, 0, 0).model for _ in range(50)] for r in (r1, r2, r3)]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_bad_input_is_named(setup):
    table, space = setup
    router = Router(Fixed(space), table, space)
    with pytest.raises(ValueError, match=r"role 'ghost' is not routed by the table models\.yaml"):
        router.route("ghost", 0.1, 0, 0)
    with pytest.raises(ValueError, match=r"task_complexity_score must lie in \[0, 1\], got 1.5"):
        router.route("coder", 1.5, 0, 0)
    with pytest.raises(ValueError, match="task_complexity_score must lie in"):
        router.route("coder", float("nan"), 0, 0)
    with pytest.raises(ValueError, match="primary_failure_count must be an integer >= 0, got -1"):
        router.route("coder", 0.1, -1, 0)
    with pytest.raises(ValueError, match="failure_count must be an integer >= 0, got 0.5"):
        router.route("coder", 0.1, 0, 0.5)
    other = ActionSpace.build(table)
    with pytest.raises(ValueError, match="policy 'fixed' actions"):
        Router(Fixed(space), table, other)
    with pytest.raises(ValueError, match="epsilon must lie in"):
        Router(Fixed(space), table, space, epsilon=1.5)
    with pytest.raises(ValueError, match="min_confidence must lie in"):
        Router(Fixed(space), table, space, min_confidence=-0.1)
    wider = Fixed(space)
    narrow = space.binary()  # same actions, but claude is not a candidate for the coder
    with pytest.raises(ValueError, match="may choose 'claude-sonnet-4-5' for role 'coder'"):
        Router(wider, table, narrow)


def test_lines_carry_the_ids_sage_run_sets_as_log_event_adds_them(setup, tmp_path, monkeypatch):
    """Under `sage run` every line of SAGE's own carries SAGE_SESSION_ID (and SAGE_TRACE_ID when
    set): the router's lines must too, after the payload and in log_event's order, or the
    ingest cannot join them to the session's steps."""
    table, space = setup
    journal = tmp_path / "memory" / "sessions" / "2026-11-24.log"
    extra = tmp_path / "extra" / "all.jsonl"
    monkeypatch.setenv("SAGE_SESSION_ID", "5f0c9a1e2b3d4c5e6f708192a3b4c5d6")
    monkeypatch.setenv("SAGE_TRACE_ID", "  trace-7  ")
    monkeypatch.setenv("SAGE_JSON_LOG_EXTRA_PATH", str(extra))
    Router(Fixed(space), table, space, min_confidence=0.6, seed=0, journal=journal).route("coder", 0.9, 0, 0)
    line = json.loads(journal.read_text())
    assert list(line)[:2] == ["type", "timestamp"] and list(line)[-2:] == ["session_id", "trace_id"]
    assert (line["session_id"], line["trace_id"]) == ("5f0c9a1e2b3d4c5e6f708192a3b4c5d6", "trace-7")
    assert datetime.fromisoformat(line["timestamp"]).utcoffset().total_seconds() == 0  # UTC, as log_event
    assert extra.read_text() == journal.read_text()  # SAGE_JSON_LOG_EXTRA_PATH gets the same line


def test_blank_ids_are_left_out_as_log_event_leaves_them(setup, tmp_path, monkeypatch):
    table, space = setup
    monkeypatch.setenv("SAGE_SESSION_ID", "")
    monkeypatch.setenv("SAGE_TRACE_ID", "   ")
    event = Router(Fixed(space), table, space).route("coder", 0.99, 0, 0).event
    assert "session_id" not in event and "trace_id" not in event
