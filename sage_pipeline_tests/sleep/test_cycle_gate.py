"""A night end to end against the whole-prompt stand-in through the OpenAI backend: the paired gate
keeps a strong planted instruction, replays val ``samples`` times per arm above temperature 0
(fresh draws, never the reply cache), splits its level over the night's trials, and a night that
cannot tell says how many val tasks it would need."""

from __future__ import annotations

import pytest

from sage_pipeline.sleep.backends import OpenAIBackend, OpenAIConfig
from sage_pipeline.sleep.cycle import CycleConfig
from sage_pipeline.sleep.gate import GateConfig
from sage_pipeline.sleep.harvest import HarvestConfig, harvest
from sage_pipeline.sleep.nightly import NightSettings, run_night
from sage_pipeline.sleep.standin import (
    PLANTED_INSTRUCTION,
    InProcessBackend,
    StandinConfig,
    StandinModel,
    StandinServer,
)

DATE = "2026-12-01"
pytestmark = pytest.mark.slow  # a whole night each: the local sandbox, a few hundred calls (2-5 s)


def packaged() -> list:
    return harvest("coder", DATE, None, HarvestConfig(log_dirs=(), task_dirs=(), embedded_tasks=True)).tasks


def night(tmp_path, config: StandinConfig, temperature: float, gate: GateConfig | None = None, http: bool = True):
    """One night of the packaged coder tasks against the stand-in: through the SDK over HTTP, or
    through ``InProcessBackend`` (the same backend without the socket)."""
    tasks = packaged()
    model = StandinModel(tasks, config)
    settings = NightSettings(backend="openai", log_dirs=[], sandbox="local",
                             cycle=CycleConfig(gate=gate or GateConfig()))
    if not http:
        backend = InProcessBackend(model, OpenAIConfig(base_url="http://standin.invalid/v1", model="standin",
                                                       temperature=temperature, max_retries=0))
        r, files = run_night(tmp_path, "coder", DATE, None, settings, backend=backend)
        return r, model, tasks, files
    with StandinServer(model) as server:
        backend = OpenAIBackend(OpenAIConfig(base_url=server.base_url, model="standin", temperature=temperature,
                                             max_retries=0))
        r, files = run_night(tmp_path, "coder", DATE, None, settings, backend=backend)
    return r, model, tasks, files


def test_a_strong_planted_instruction_is_kept_with_fresh_samples_per_arm(tmp_path):
    cfg = StandinConfig(seed=1, effect="planted", delta=0.6, propose_planted=1.0, useless=0)
    r, model, tasks, files = night(tmp_path, cfg, temperature=0.7, gate=GateConfig(samples=3))
    assert r.status == "accepted" and r.gate_action == "accept", r.reason
    assert [e["content"] for e in r.edits if e["status"] == "accepted"] == [PLANTED_INSTRUCTION]
    assert PLANTED_INSTRUCTION in (tmp_path / "sleep" / "coder" / "SKILL.md").read_text()
    (trial,) = r.trials
    assert trial["test"] == "paired" and trial["samples"] == 3 and trial["level"] == 0.05 / 4  # / edit_budget
    assert trial["p_value"] <= 0.05 / 4 and trial["tasks"] == r.tasks["val"] and "better:" in trial["reason"]
    assert r.gate["replays_per_val_task"] == 3 and r.gate["backend_draws_fresh"] is True
    n = {s: sum(t.split == s for t in tasks) for s in ("train", "val", "test")}
    # every replay was a fresh call to the server: train once, val 3 times per arm, test before and after
    assert model.calls["solve"] == n["train"] + 2 * 3 * n["val"] + 2 * n["test"]
    assert r.calls["cache_hits"] == 0
    val_rows = [x for x in r.per_task if x["phase"] == "val baseline"]
    assert len(val_rows) == 3 * n["val"] and {x["sample"] for x in val_rows} == {0, 1, 2}
    assert r.scores["baseline_val"]["samples"] == 3 and r.scores["baseline_val"]["tasks"] == n["val"]
    # the test split is scored after the decision, once per document
    assert r.scores["test_after"]["tasks"] == n["test"] and r.scores["test_after"]["samples"] == 1
    assert "better: val mixed" in files.diagnostics.read_text()


def test_a_night_with_no_real_effect_rejects_and_says_what_it_would_need(tmp_path):
    cfg = StandinConfig(seed=4, effect="null", propose_planted=1.0)  # 3 candidate rules, none does anything
    r, model, tasks, _ = night(tmp_path, cfg, temperature=0.0)
    assert r.status == "rejected" and r.gate_action == "reject"
    assert len(r.trials) == 3 and all(t["level"] == 0.05 / 4 for t in r.trials)  # alpha / edit_budget
    assert r.gate["replays_per_val_task"] == 1  # temperature 0: a second replay would repeat the answer
    assert "none of 3 candidate edit(s) passed the paired gate" in r.reason
    unsure = [t for t in r.trials if t["verdict"] == "cannot_tell"]
    assert unsure, [t["verdict"] for t in r.trials]  # this seed's night has a positive, unresolved change
    best = max(unsure, key=lambda t: t["candidate"] - t["baseline"])
    assert f"this night cannot tell: its largest gain, {best['candidate'] - best['baseline']:+.3f}" in r.reason
    assert f"needs about {best['needed_tasks']} val tasks" in r.reason
    assert all(t["needed_tasks"] > t["tasks"] for t in unsure)
    assert PLANTED_INSTRUCTION not in (tmp_path / "sleep" / "coder" / "SKILL.md").read_text()


def test_the_old_strict_gate_is_one_config_value_away_and_has_no_power_here(tmp_path):
    cfg = StandinConfig(seed=1, effect="planted", delta=0.6, propose_planted=1.0, useless=0)
    r, *_ = night(tmp_path, cfg, temperature=0.7, gate=GateConfig(test="strict"))
    # at temperature 0.7 some val task draws worse under any edit: "no val task worse" refuses even this gain
    assert r.gate["replays_per_val_task"] == 1 and r.trials[0]["test"] == "strict"
    assert r.status == "rejected" and r.trials[0]["verdict"] == "regression", r.trials[0]["reason"]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_night_in_process_decides_exactly_as_one_over_http(tmp_path, temperature):
    """The benchmark's InProcessBackend skips only the SDK and the socket: same bodies, same answers
    (above temperature 0, the same stream of draws), same decisions."""
    cfg = StandinConfig(seed=7, effect="planted", propose_planted=1.0)
    gate = GateConfig(samples=2)
    over_http, *_ = night(tmp_path / "http", cfg, temperature, gate)
    direct, model, *_ = night(tmp_path / "direct", cfg, temperature, gate, http=False)

    def decided(r):
        return (r.status, r.reason, r.trials, [(e["content"], e["status"]) for e in r.edits], r.scores,
                r.per_task, r.calls["calls"], r.calls["cache_hits"])

    assert decided(direct) == decided(over_http)
    assert direct.backend["transport"].startswith("in-process") and "transport" not in over_http.backend
    assert model.calls["solve"] > 0
