"""The SAGE-loop calibration file: every published figure has a source, derived numbers follow
from them as documented, and a bad file is an error naming the file and the field."""

from __future__ import annotations

import copy
import math
from pathlib import Path

import pytest
import yaml

from sage_pipeline import artifacts
from sage_pipeline.sim.loop_config import DEFAULT_CONFIG, SageLoopConfig, SageLoopConfigError

FIXTURE_TABLE = Path(__file__).parents[1] / "routing" / "fixtures" / "sage_journal" / "models.yaml"
# what ppo_policy.json's calibration was before the calibration became pydantic models (paths aside)
REPORT_FIXTURE = Path(__file__).parent / "fixtures" / "sage_loop_calibration_report.json"


@pytest.fixture(scope="module")
def doc() -> dict:
    return yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))


def test_every_figure_names_a_source_and_every_assumption_a_reason(doc):
    cfg = SageLoopConfig.load()
    assert set(cfg.code_models) | set(cfg.debug_models) <= set(cfg.models)
    for name, m in cfg.models.items():
        assert m.humaneval.source in cfg.sources and m.aider.source in cfg.sources, name
        assert m.local == (name != "claude-sonnet-4-5")
    for s in cfg.sources.values():
        assert s.url.startswith("https://") and s.title and s.where
    assert set(cfg.why) == set(cfg.assumed) and all(len(cfg.why[k]) > 20 for k in cfg.assumed)
    # the loop's table routes SAGE's roles (SAGE's own models.yaml is the journal fixture's); its
    # models are the calibration's names, not yet SAGE's tags (issue "SAGE in the loop")
    loop_roles = set(yaml.safe_load(cfg.routing_table.read_text())["routing"])
    assert loop_roles == set(yaml.safe_load(FIXTURE_TABLE.read_text())["routing"])


def test_derived_numbers_follow_the_published_ones():
    cfg = SageLoopConfig.load()
    m = cfg.models["qwen2.5-coder:14b"]
    assert (m.humaneval.value, m.aider.pass_rate_1, m.aider.pass_rate_2) == (0.896, 0.534, 0.617)
    assert m.repair_rate == pytest.approx((0.617 - 0.534) / (1 - 0.534))
    assert m.latency_s == pytest.approx(58.0 / (2 - 0.534))
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    assert m.debug_logit == pytest.approx(logit(m.repair_rate) + logit(0.896) - logit(0.534))
    # a wrong answer against an exception: the published repair rates' logit difference (45% vs 77%)
    g = cfg.assumed["debug_kind_gain"]
    assert g["exception"] - g["wrong_answer"] == pytest.approx(logit(0.77) - logit(0.45), abs=0.01)
    assert "selfrepair" in cfg.sources and "selfrepair" in cfg.why["debug_kind_gain"]
    a = cfg.assumed
    assert cfg.usd_per_call("qwen2.5-coder:14b", "code") == pytest.approx(
        a["gpu_watts"] * m.latency_s / 3.6e6 * a["usd_per_kwh"])
    tok = a["tokens"]["debug"]
    want = (tok["input"] * 3 + tok["output"] * 15) / 1e6  # $3 / $15 per million tokens
    assert cfg.usd_per_call("claude-sonnet-4-5", "debug") == pytest.approx(want)
    rows = {r["model"]: r for r in cfg.table_rows()}
    assert rows["codestral:22b"]["mbpp_pass1"] is None and rows["qwen2.5-coder:1.5b"]["mbpp_pass1"] == 0.692
    assert cfg.call_actions[0] == "code:qwen2.5-coder:1.5b" and cfg.call_actions[-1] == "debug:claude-sonnet-4-5"


def _set(d: dict, path: str, value) -> dict:
    d = copy.deepcopy(d)
    *head, last = path.split("/")
    node = d
    for k in head:
        node = node[k]
    if value is KeyError:
        del node[last]
    else:
        node[last] = value
    return d


@pytest.mark.parametrize("path, value, where, what", [
    ("models/codestral:22b/aider/pass_rate_2", 0.2, "models.codestral:22b.aider.pass_rate_2",
     "not above pass_rate_1"),
    ("models/codestral:22b/humaneval/source", "a blog", "models.codestral:22b.humaneval.source",
     "'a blog' is not one of the file's sources"),
    ("models/qwen2.5-coder:14b/humaneval", KeyError, "models.qwen2.5-coder:14b.humaneval", "missing"),
    ("models/qwen2.5-coder:14b/humaneval/value", 1.2, "models.qwen2.5-coder:14b.humaneval.value",
     r"less than or equal to 0\.999999, got 1\.2"),
    ("models/qwen2.5-coder:14b/humaneval/value", "0.9", "models.qwen2.5-coder:14b.humaneval.value",
     "Input should be a valid number, got '0.9'"),
    ("models/qwen2.5-coder:14b/aider/seconds_per_case", True, "models.qwen2.5-coder:14b.aider.seconds_per_case",
     "Input should be a valid number, got True"),
    ("models/qwen2.5-coder:14b/aider/seconds_per_case", float("nan"), "models.qwen2.5-coder:14b.aider.seconds_per_case",
     "finite number"),
    ("models/claude-sonnet-4-5/price/source", "a tweet", "models.claude-sonnet-4-5.price.source",
     "'a tweet' is not one of the file's sources"),
    ("models/claude-sonnet-4-5/prices", {"input_per_mtok": 1.0}, "models.claude-sonnet-4-5.prices",
     "unknown key .*the keys here are humaneval, mbpp, aider, price"),
    ("actions/debug", ["qwen2.5-coder:14b", "gpt-5"], "actions.debug[1]", "'gpt-5' has no calibration"),
    ("actions/code", [], "actions.code", "List should have at least 1 item"),
    ("actions/code", ["codestral:22b", "codestral:22b"], "actions.code", "expected distinct model names"),
    ("budget/calls", 2.5, "budget.calls", "whole number"),
    ("budget/calls", 13, "budget.calls", "less than or equal to 12, got 13"),
    ("budget/usd", -1, "budget.usd", r"greater than or equal to 0\.000000001, got -1"),
    ("budget", KeyError, "budget", r"missing \(add it: per task\)"),
    ("reward/version", "reward_v9", "reward.version", "Input should be 'reward_v1' or 'reward_v2', got 'reward_v9'"),
    ("assumptions/retry_q", KeyError, "assumptions.retry_q", "missing"),
    ("assumptions/retry_q/why", "", "assumptions.retry_q.why", "non-empty string"),
    ("assumptions/debug_kind_gain/value", {"wrong_answer": 1.0}, "assumptions.debug_kind_gain.value",
     "needs exactly the keys"),
    ("assumptions/debug_kind_gain/value/timeout", 25.0, "assumptions.debug_kind_gain.value.timeout",
     "less than or equal to 20"),
    ("assumptions/colour", {"value": 1, "why": "x"}, "assumptions.colour",
     "unknown key .*the keys here are difficulty_slope, difficulty_ref, retry_q, "),
    ("sources/aider/url", None, "sources.aider.url", "non-empty string"),
    ("static_roles", "coder", "static_roles", "Input should be a valid list, got 'coder'"),
    ("routing_table", "", "routing_table", "expected a non-empty string"),
    ("version", 2, "version", "Input should be 1"),
])
def test_a_bad_calibration_names_the_file_and_the_field(tmp_path, doc, path, value, where, what):
    f = tmp_path / "loop.yaml"
    f.write_text(yaml.safe_dump(_set(doc, path, value)), encoding="utf-8")
    with pytest.raises(SageLoopConfigError, match=what) as err:
        SageLoopConfig.load(f)
    assert str(f) in str(err.value) and f"field {where!r}" in str(err.value)


def test_a_missing_or_broken_file_says_so(tmp_path):
    with pytest.raises(SageLoopConfigError, match="calibration file not found"):
        SageLoopConfig.load(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("models: [1, 2\n")
    with pytest.raises(SageLoopConfigError, match="not valid YAML"):
        SageLoopConfig.load(tmp_path / "bad.yaml")


def test_the_reports_calibration_is_written_as_before(tmp_path):
    """ppo_policy.json records SageLoopConfig.to_dict(): byte for byte what the dataclasses wrote
    (the fixture was written by them; its values follow the file's: the feedback kinds' gains and
    their source changed on 2026-11-27), so existing readers and reports agree."""
    d = SageLoopConfig.load().to_dict()
    assert (d["source"], d["routing_table"]) == (str(DEFAULT_CONFIG), str(DEFAULT_CONFIG.parent / "sage_models.yaml"))
    d |= {"source": "<source>", "routing_table": "<routing_table>"}
    artifacts.write_json(tmp_path / "calibration.json", d)
    assert (tmp_path / "calibration.json").read_bytes() == REPORT_FIXTURE.read_bytes()


def test_a_calibration_read_from_memory_resolves_nothing_and_copies_keep_the_source(doc):
    cfg = SageLoopConfig.from_dict(doc)
    assert cfg.source == "<memory>" and cfg.routing_table == Path("sage_models.yaml")
    loaded = SageLoopConfig.load()
    tight = loaded.model_copy(update={"budget": loaded.budget.model_copy(update={"seconds": 20.0})})
    assert tight.source == str(DEFAULT_CONFIG) and tight.budget.seconds == 20.0 and loaded.budget.seconds == 70.0
    assert SageLoopConfig.from_dict(doc, DEFAULT_CONFIG) == loaded  # the same file, the same config
    assert SageLoopConfig.from_dict(_set(doc, "budget/calls", 4.0)).budget.calls == 4  # a whole float is that int
