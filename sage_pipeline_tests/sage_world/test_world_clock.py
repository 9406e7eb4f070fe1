"""The model world's time: each call's calibrated GPU-seconds and dollars (``sim/data/model_time.yaml``,
``ModelWorld.call_seconds`` / ``call_usd``), the server's scaled clock, and SAGE's own journals
carrying it.

The last test runs SAGE's real ``sage run`` through the harness (skipped or failed by the rule in
sage_contract/sage_journals.py: ``SAGE_PYTHON=/path/to/sage/venv/bin/python``). SAGE writes no
TOKEN_USAGE against Ollama (server.py), so the journal's measure of a call is the gap between the
``AGENT_INSIGHT_EMITTED`` "decision" an agent writes just before its ``chat_with_timeout`` (it names
the model) and the next line of the journal, the agent's own insight after the answer.
"""

from __future__ import annotations

import json
import re
import statistics
import threading
import time
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sage_world import harness
from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, goal, run_day
from sage_pipeline.sage_world.server import WorldServer
from sage_pipeline.sage_world.world import (
    AGENTS,
    DEFAULT_MODEL_TIME,
    ModelTimeConfig,
    ModelWorld,
    WorldConfig,
    WorldError,
    build_world,
)
from sage_pipeline.sim.loop_config import SageLoopConfigError
from sage_pipeline_tests.sage_world.world_journal_day import table_for_every_model

SAGE_TABLE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_journal" / "models.yaml"
# SAGE's median overhead per call (building the prompt after the decision line, the HTTP round trip,
# the world's draw, parsing the answer), in wall seconds: the stated tolerance of the journal test.
# Measured 7-19 ms per (agent, model) on 2 shared cores with Nagle off (server.py); 40-50 ms more with it on.
OVERHEAD_TOL_S = 0.05


@pytest.fixture(scope="module")
def world() -> ModelWorld:
    return build_world(SAGE_TABLE, n_tasks=24, task_seed=3)


def _msgs(user: str) -> list[dict]:
    return [{"role": "system", "content": "CODEBASE CONTEXT:\nNone"}, {"role": "user", "content": user}]


def test_call_seconds_is_the_published_throughput_formula_of_agent_and_model(world):
    """seconds = prompt / prefill + completion / decode, each throughput the RTX 4090 anchor's scaled
    by parameters (the file's figures, written out here by hand)."""
    pp, tg, p8 = 5265.68, 130.58, 8.03  # llama.cpp, 4090, Llama 3 8B Q4_K_M: pp 4096, tg 512
    assert world.call_seconds("debugger", "codestral:22b") == pytest.approx(
        3500 / (pp * p8 / 22.25) + 180 / (tg * p8 / 22.25), rel=1e-12)
    assert world.call_seconds("reviewer", "qwen2.5-coder:1.5b") == pytest.approx(
        2800 / (pp * p8 / 1.54) + 20 / (tg * p8 / 1.54), rel=1e-12)
    assert world.call_seconds("planner", "qwen3:14b-q4_K_M") == pytest.approx(
        3600 / (pp * p8 / 14.8) + 170 / (tg * p8 / 14.8), rel=1e-12)
    # SAGE's Ollama tag is the calibrated model it is an alias of
    assert world.call_seconds("coder", "qwen2.5-coder:14b-instruct-q4_K_M") == world.call_seconds(
        "coder", "qwen2.5-coder:14b") == pytest.approx(4200 / (pp * p8 / 14.7) + 120 / (tg * p8 / 14.7))
    # (agent, model) alone: every agent, bigger models slower, and split as Ollama reports it
    for agent in AGENTS:
        secs = [world.call_seconds(agent, m) for m in ("qwen2.5-coder:1.5b", "qwen2.5-coder:14b", "qwen3:14b-q4_K_M",
                                                         "codestral:22b")]
        assert 0 < secs[0] < secs[1] < secs[2] < secs[3]
        assert sum(world.call_time(agent, "codestral:22b")) == world.call_seconds(agent, "codestral:22b")
        assert world.call_usd(agent, "codestral:22b") == 0.0  # a local model's cost is its time
    with pytest.raises(WorldError, match="model 'llama-9000' has no figures in .*model_time.yaml"):
        world.call_seconds("coder", "llama-9000")
    with pytest.raises(WorldError, match="no SAGE agent 'shell'"):
        world.call_seconds("shell", "qwen2.5-coder:1.5b")


def test_an_api_model_costs_its_list_price_and_no_gpu_time(world):
    assert world.call_seconds("coder", "claude-sonnet-4-5") == 0.0
    # sage_loop.yaml's Anthropic price ($3 / $15 per million tokens) x the coder's 4200 / 120 tokens
    assert world.call_usd("coder", "claude-sonnet-4-5") == pytest.approx((4200 * 3.0 + 120 * 15.0) / 1e6)
    assert world.call_usd("reviewer", "claude-sonnet-4-5") == pytest.approx((2800 * 3.0 + 20 * 15.0) / 1e6)


def test_a_table_model_without_time_figures_is_refused_when_the_world_is_built(world, tmp_path):
    bad = tmp_path / "models.yaml"
    bad.write_text(SAGE_TABLE.read_text().replace('fallback: "qwen3:14b-q4_K_M"', 'fallback: "llama-9000"', 1))
    with pytest.raises(WorldError, match=r"routing\.planner names 'llama-9000', which the model-time file"):
        ModelWorld(world.sim, RoutingTable.load(bad))


def test_a_bad_model_time_file_names_the_field(tmp_path):
    text = DEFAULT_MODEL_TIME.read_text()
    cases = [(text.replace("{params_b: 22.25, source: codestral}", "{params_b: 22.25, source: nope}"),
              r"field 'models.codestral:22b.source'?.*'nope' is not one of the file's sources"),
             (text.replace("      architect: {prompt: 3600, completion: 170}\n", ""),
              r"assumptions.call_tokens.*needs exactly the keys"),
             (text.replace("{params_b: 1.54, source: qwen25coder_1_5b}", "{params_b: -1.54, source: qwen25coder_1_5b}"),
              r"models.qwen2.5-coder:1.5b.params_b.*greater than 0"),
             (text.replace("claude-sonnet-4-5: {api: true}", "claude-sonnet-4-5: {api: true, params_b: 100.0}"),
              r"either `api: true` alone, or `params_b` with its `source`")]
    for i, (body, want) in enumerate(cases):
        path = tmp_path / f"t{i}.yaml"
        path.write_text(body)
        with pytest.raises(SageLoopConfigError, match=want) as err:
            ModelTimeConfig.load(path)
        assert str(path) in str(err.value)
    assert ModelTimeConfig.load().source == str(DEFAULT_MODEL_TIME)


def _post(url: str, body: dict) -> tuple[dict, float, float]:
    req = urllib.request.Request(url + "/api/chat", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=60) as r:
        out = json.loads(r.read())
    return out, t0, time.perf_counter()


def _test_engineer(run: str) -> dict:
    return {"model": "codestral:22b", "stream": False,
            "messages": _msgs(f"Generate pytest tests for x.py.\nTASK: {goal(run, 'p')}")}


class _RecordedClock:
    """The server module's ``time``, its sleeps recorded (and slept): what the server waits is read
    from what it asked for, not bounded by wall time (HTTP and the world take what a loaded
    machine gives them)."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def __getattr__(self, name):
        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        time.sleep(seconds)


def test_the_server_sleeps_the_scaled_call_time_and_records_it(world, monkeypatch):
    from sage_pipeline.sage_world import server as server_mod

    clock = _RecordedClock()
    monkeypatch.setattr(server_mod, "time", clock)
    cs = world.call_seconds("test_engineer", "codestral:22b")
    scale = 0.3 / cs  # a 0.3 s pause
    w = ModelWorld(world.sim, world.table, WorldConfig(clock_scale=scale))
    w.assign("c1", w.tasks[0].task_id)
    with WorldServer(w) as srv:
        reply, t0, t1 = _post(srv.url, _test_engineer("c1"))
    assert t1 - t0 >= scale * cs  # at least the pause (certain: it is slept before the answer)
    assert clock.slept == pytest.approx([scale * cs])  # the pause, once: no other wait
    assert reply["total_duration"] == reply["prompt_eval_duration"] + reply["eval_duration"]
    assert reply["total_duration"] == pytest.approx(cs * 1e9, abs=2)  # Ollama's fields: the GPU time, not the pause
    rec = w.truth[-1]
    assert (rec["agent"], rec["model"], rec["gpu_s"], rec["usd"]) == ("test_engineer", "codestral:22b", cs, 0.0)
    # scale 0: the same answer at once
    w0 = ModelWorld(world.sim, world.table, WorldConfig(clock_scale=0.0))
    w0.assign("c1", w.tasks[0].task_id)
    with WorldServer(w0) as srv:
        reply0, t0, t1 = _post(srv.url, _test_engineer("c1"))
    assert len(clock.slept) == 1  # no sleep at all at scale 0
    assert reply0["message"] == reply["message"] and w0.truth[-1]["gpu_s"] == cs


def test_concurrent_calls_wait_in_parallel_not_in_turn(world, monkeypatch):
    """Six SAGE runs calling at once each wait their own pause, not the ones before theirs.

    Certain, not timed: the server's sleep is a barrier of six, which passes only when all six
    calls are in their pause at once (calls waiting in turn would never get there: the barrier's
    60 s are a hang guard); each sleep is asked for exactly the call's own pause."""
    from sage_pipeline.sage_world import server as server_mod

    cs = world.call_seconds("test_engineer", "codestral:22b")
    pause = 0.3
    w = ModelWorld(world.sim, world.table, WorldConfig(clock_scale=pause / cs))
    n = 6
    for i in range(n):
        w.assign(f"p{i}", w.tasks[i].task_id)
    together, asked = threading.Barrier(n), []

    class _Clock:  # the server module's ``time``: its sleep waits for the other calls' pauses
        def __getattr__(self, name):
            return getattr(time, name)

        @staticmethod
        def sleep(seconds: float) -> None:
            asked.append(seconds)
            together.wait(timeout=60)

    monkeypatch.setattr(server_mod, "time", _Clock())
    replies: list[dict] = []
    errors: list[BaseException] = []

    def call(i: int) -> None:
        try:
            replies.append(_post(srv.url, _test_engineer(f"p{i}"))[0])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    with WorldServer(w) as srv:
        threads = [threading.Thread(target=call, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert not errors and len(replies) == n, errors
    assert not together.broken and len(asked) == n and asked == pytest.approx([pause] * n)
    assert len(w.truth) == n


# ---------------------------------------------------------------------------- SAGE's journals


@pytest.fixture(scope="module")
def clocked_day(sage_python, tmp_path_factory):
    install = SageInstall.find(sage_python)
    root = tmp_path_factory.mktemp("world_clock")
    table = table_for_every_model(install.models_yaml, root / "models.yaml")
    world = build_world(table, n_tasks=24, task_seed=1, config=WorldConfig())  # the default clock
    mp = pytest.MonkeyPatch()
    orig = harness.sage_env  # SAGE reads a user's table from SAGE_MODELS_YAML; the harness sets none
    mp.setattr(harness, "sage_env", lambda *a, **k: {**orig(*a, **k), "SAGE_MODELS_YAML": str(table)})
    try:
        with WorldServer(world) as srv:
            day = run_day(world, srv.url, install, 1, [t.task_id for t in world.tasks[:8]], root / "day",
                          HarnessConfig(workers=2))
    finally:
        mp.undo()
    return world, day


def _journal(day) -> list[list[dict]]:
    return [[json.loads(ln) for ln in f.read_text().splitlines() if ln.startswith("{")]
            for f in sorted(day.root.glob("ws-*/memory/sessions/*.log"))]


def _ts(e: dict) -> datetime:
    return datetime.fromisoformat(e["timestamp"])


def test_sages_journals_carry_each_models_calibrated_time(clocked_day):
    """Per (agent, model), the journal's gap before the answer / clock_scale recovers call_seconds:
    never below it (the pause is inside the gap), and above it by SAGE's own overhead only
    (median under OVERHEAD_TOL_S wall seconds). Prints the bias that overhead puts on the
    recovered GPU-seconds at the default clock_scale."""
    world, day = clocked_day
    assert day.finished == len(day.runs) == 8, day.failures
    scale = world.config.clock_scale
    gaps: dict[tuple[str, str], list[float]] = {}
    for events in _journal(day):
        assert not any(e["type"] == "TOKEN_USAGE" for e in events), (
            "SAGE now writes TOKEN_USAGE against the world: the routing dataset's latency_s can measure the "
            "clock directly; measure it there")
        for e, nxt in zip(events, events[1:]):
            if e["type"] != "AGENT_INSIGHT_EMITTED" or e.get("insight_type") != "decision":
                continue
            m = re.search(r"model=([^\s,]+?)(?:,|\s|$)", e["content_preview"])
            if m is None:
                continue
            # the next line is the same agent's own insight after its call: the gap spans the call
            assert (nxt["type"], nxt.get("agent")) == ("AGENT_INSIGHT_EMITTED", e["agent"]), nxt
            gaps.setdefault((e["agent"], m[1]), []).append((_ts(nxt) - _ts(e)).total_seconds())
    # every call the world timed is one gap in the journals, and nothing else is
    timed: dict[tuple[str, str], int] = {}
    for t in world.truth:
        timed[t["agent"], t["model"]] = timed.get((t["agent"], t["model"]), 0) + 1
    assert {k: len(v) for k, v in gaps.items()} == timed
    # each of the four local models SAGE's table names is measured
    assert {world.calibrated(m) for _, m in gaps} == {"qwen2.5-coder:1.5b", "qwen2.5-coder:14b", "qwen3:14b-q4_K_M",
                                                      "codestral:22b"}
    rows = []
    for (agent, model), g in sorted(gaps.items()):
        cs = world.call_seconds(agent, model)
        assert min(g) >= scale * cs - 1e-3, (agent, model, min(g), scale * cs)
        recovered = statistics.median(g) / scale
        bias = recovered - cs
        assert 0.0 <= bias <= OVERHEAD_TOL_S / scale, (agent, model, recovered, cs)
        rows.append(f"{agent:14s} {model:34s} n={len(g):3d} call_seconds={cs:7.3f} recovered={recovered:7.3f} "
                    f"bias={bias:+.3f} GPU-s ({100 * bias / cs:+.1f}%)")
    print(f"\nclock_scale={scale}: journal gap / clock_scale against call_seconds\n" + "\n".join(rows))
