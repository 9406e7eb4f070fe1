"""The test harness: the whole-prompt stand-in answers the SAGE night's own coder messages (fixed at
temperature 0, fresh draws above it), the planted effect's size over many calls, its reflect replies, the OpenAI
client talking to it over HTTP unchanged, and a night through it in process deciding as one over HTTP; and no
production module imports the harness."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from sage_pipeline.sage import skills as sk
from sage_pipeline.sleep.backends import BackendError, OpenAIBackend, OpenAIConfig
from sage_pipeline.sleep.block import Edit
from sage_pipeline.sleep.harness.sim_world import PACKAGED_TASKS, SimWorld
from sage_pipeline.sleep.harness.standin import (
    PLANTED_INSTRUCTION,
    InProcessBackend,
    StandinConfig,
    StandinError,
    StandinModel,
    StandinServer,
)
from sage_pipeline.sleep.prompts import parse_reflect_reply, reflect_messages
from sage_pipeline.sleep.records import ReflectRequest, TaskRecord, TaskResult, read_task_file
from sage_pipeline.sleep.sage_night import role_messages

PACKAGED = [t for t in read_task_file(PACKAGED_TASKS / "coder.jsonl").tasks if t.reference_kind == "unit_tests"]
TREE = {sid: sk.read_skill(sk.SKILL_TREE / sid) for sid in sk.SKILL_IDS}  # SAGE's skills as shipped
SKILL, MEMORY = "# Skill: coder\n\nWrite small functions.\n", "# Memory: coder\n"  # reflect's documents


def messages(task, extra: str = "") -> list[dict]:
    """SAGE's coder's messages for ``task`` with the shipped skills, ``extra`` appended to the system message."""
    m = role_messages("coder", TREE, task)
    return [{**m[0], "content": m[0]["content"] + extra}, m[1]]


def body(task, extra: str = "", temperature=0.0) -> dict:
    return {"model": "standin", "messages": messages(task, extra), "temperature": temperature}


def correct(model: StandinModel, task, text: str) -> bool:
    assert text in (task.meta["sim"]["gold"], task.meta["sim"]["naive"])
    return text == task.meta["sim"]["gold"]


def test_at_temperature_0_the_answer_is_a_fixed_function_of_the_whole_prompt():
    a, b = StandinModel(PACKAGED, StandinConfig(seed=3)), StandinModel(PACKAGED, StandinConfig(seed=3))
    first = [a.chat(body(t)) for t in PACKAGED]
    assert [a.chat(body(t)) for t in PACKAGED] == first == [b.chat(body(t)) for t in PACKAGED]
    # one word more anywhere in the prompt redraws every task: some answers change
    moved = [a.chat(body(t, "Be terse.\n")) for t in PACKAGED]
    changed = sum(x != y for x, y in zip(first, moved, strict=True))
    assert 8 < changed < 48, changed  # about 2 p (1 - p) of 56 tasks
    assert [StandinModel(PACKAGED, StandinConfig(seed=4)).chat(body(t)) for t in PACKAGED] != first
    assert a.calls["solve"] == 3 * len(PACKAGED)


def test_above_temperature_0_each_call_draws_afresh_at_the_prompts_chance():
    model = StandinModel(PACKAGED, StandinConfig(seed=1))
    task = PACKAGED[0]
    p = model.p_correct(task, messages(task))
    hits = [correct(model, task, model.chat(body(task, temperature=0.8))) for _ in range(2000)]
    assert abs(np.mean(hits) - p) < 4 * np.sqrt(p * (1 - p) / 2000)
    assert 0 < sum(hits) < 2000

    def stream(seed):
        m = StandinModel(PACKAGED, StandinConfig(seed=seed))
        return [m.chat(body(task, temperature=0.8)) for _ in range(50)]

    assert stream(1) == stream(1) != stream(2)  # seeded: the same stream of draws


@pytest.mark.slow  # 7,040 calls (about 0.7 s)
@pytest.mark.parametrize("effect,expected", [("planted", 0.15), ("null", 0.0)])
def test_the_planted_effect_measured_over_many_calls_is_its_stated_size(effect, expected):
    model = StandinModel(PACKAGED, StandinConfig(seed=11, effect=effect))
    rng = np.random.default_rng(0)
    without, with_ = [], []
    for _ in range(60):  # 60 prompts x 56 tasks, each with and without the instruction
        skill = f"- rule {rng.integers(10 ** 9)}\n"
        planted = skill + f"- {PLANTED_INSTRUCTION}\n"
        for t in PACKAGED:
            without.append(correct(model, t, model.chat(body(t, skill))))
            with_.append(correct(model, t, model.chat(body(t, planted))))
    n = len(without)
    assert abs(np.mean(with_) - np.mean(without) - expected) < 4 * np.sqrt(0.5 / n), (np.mean(with_), np.mean(without))
    # the exact chances: the perturbation's stated sd, the effect's stated size
    t = PACKAGED[5]
    ps = np.array([model.p_correct(t, messages(t, f"- x{i}\n")) for i in range(3000)])
    assert ps.std() == pytest.approx(0.1, abs=0.01)
    pp = np.array([model.p_correct(t, messages(t, f"- x{i}\n- {PLANTED_INSTRUCTION}\n")) for i in range(3000)])
    assert pp.mean() - ps.mean() == pytest.approx(expected, abs=0.01)


def _reflect_body(model_docs: dict[str, str], temperature=0.0, budget=4) -> dict:
    fail = PACKAGED[0]
    req = ReflectRequest("coder", model_docs, {k: () for k in model_docs},
                         [(fail, TaskResult(fail.id, "train", 0, 0, "x", "wrong"))], [], budget, 1500, 300,
                         {k: 1500 for k in model_docs})
    return {"messages": reflect_messages(req), "temperature": temperature}


def test_reflect_proposes_useless_rules_and_the_instruction_at_its_stated_rate():
    model = StandinModel(PACKAGED, StandinConfig(seed=2, effect="planted"))
    planted = useless = 0
    for i in range(300):
        docs = {"skill": SKILL + f"note {i}\n", "memory": MEMORY}
        edits = parse_reflect_reply(model.chat(_reflect_body(docs)))
        assert all(isinstance(e, Edit) and e.op == "add" and e.target in ("skill", "memory") and e.status != "invalid"
                   for e in edits)
        planted += sum(e.content == PLANTED_INSTRUCTION for e in edits)
        useless += sum(e.content != PLANTED_INSTRUCTION for e in edits)
    assert useless == 600 and abs(planted / 300 - 0.7) < 4 * np.sqrt(0.21 / 300)
    assert model.proposed == {"planted": planted, "useless": useless}
    # a fixed function of the reflect prompt at temperature 0; never proposed once the documents hold it
    docs = {"skill": SKILL, "memory": MEMORY}
    assert model.chat(_reflect_body(docs)) == model.chat(_reflect_body(docs))
    held = {"skill": SKILL + f"- {PLANTED_INSTRUCTION}\n", "memory": MEMORY}
    assert not any(PLANTED_INSTRUCTION in model.chat(_reflect_body(held, temperature=1.0)) for _ in range(30))
    assert len(json.loads(model.chat(_reflect_body(docs, budget=1)))["edits"]) == 1  # the stated budget


def test_refuses_a_prompt_it_does_not_know_and_bad_requests():
    model = StandinModel(PACKAGED)
    stranger = TaskRecord("x-1", "Write `nothing()`: returns None.", "unit_tests",
                          {"entry_point": "nothing", "tests": [{"args": [], "expected": None}]},
                          meta={"sim": {"gold": "None", "naive": "0"}})
    with pytest.raises(StandinError, match="knows no task for this prompt") as ei:
        model.chat(body(stranger))
    assert ei.value.status == 400
    for bad, message in [({"messages": []}, "no messages"),
                         ({"messages": [{"role": "user", "content": "x"}], "temperature": -1}, "temperature -1")]:
        with pytest.raises(StandinError, match=message):
            model.chat(bad)


def test_refuses_tasks_without_a_correct_and_a_wrong_answer_and_bad_config():
    bare = TaskRecord("t-1", "Say hi.", "exact", "hi", origin="tasks.jsonl:3")
    with pytest.raises(ValueError, match=r"task t-1 \(tasks.jsonl:3\): the stand-in needs meta.sim.gold"):
        StandinModel([bare])
    for kw, field in [({"base_low": 0.8, "base_high": 0.2}, "base_low (0.8) must not exceed"),
                      ({"effect": "maybe"}, "'null' or 'planted'"), ({"delta": 2}, "less than or equal to 1"),
                      ({"propose_planted": -0.1}, "greater than or equal to 0"), ({"instruction": "x"}, "at least 10")]:
        with pytest.raises(ValueError, match=re.escape(field)):
            StandinConfig(**kw)


@pytest.mark.slow  # a loopback server and 45 calls through the SDK (about 1 s)
def test_the_openai_backend_talks_to_it_unchanged():
    tasks = [t for t in SimWorld.load("coder").generate_tasks(0, per_topic=2) if t.reference_kind == "unit_tests"]
    model = StandinModel(tasks, StandinConfig(seed=5, effect="planted"))
    with StandinServer(model) as server:
        cold = OpenAIBackend(OpenAIConfig(base_url=server.base_url, model="standin", temperature=0.0, max_retries=0))
        t = tasks[0]
        r1, r2 = (cold.complete(messages(t), "solve", 256) for _ in range(2))
        assert r1.text in (t.meta["sim"]["gold"], t.meta["sim"]["naive"]) and r2.cached and r2.text == r1.text
        assert r1.text == model.chat(body(t)) and not cold.draws_fresh and r1.prompt_tokens > 0
        warm = OpenAIBackend(OpenAIConfig(base_url=server.base_url, model="standin", temperature=0.9, max_retries=0))
        texts = {warm.complete(messages(t), "solve", 256).text for _ in range(40)}
        assert warm.draws_fresh and len(texts) == 2 and warm.calls.summary()["cache_hits"] == 0  # fresh draws
        assert model.calls["solve"] == 1 + 1 + 40
        stranger = TaskRecord("x-1", "Write `nothing()`.", "unit_tests", {"entry_point": "nothing", "tests": [
            {"args": [], "expected": None}]})
        with pytest.raises(BackendError) as ei:
            cold.complete(messages(stranger), "solve", 256)
        assert ei.value.kind == "bad_request" and "knows no task for this prompt" in ei.value.cause


class GoldJudge:
    """Passes exactly a task's gold code (what the sandbox says of the stand-in's two answers, without a sandbox)."""

    def __init__(self, tasks) -> None:
        from sage_pipeline.sleep.judges import extract_code

        self.gold = {t.id: extract_code(t.meta["sim"]["gold"]).strip() for t in tasks}

    def run(self, items):
        from sage_pipeline.sleep.judges import Judgement

        return [Judgement(1.0, 1.0) if code.strip() == self.gold[t.id] else Judgement(0.0, 0.0, "naive") for t, code in
                items]

    def describe(self) -> dict:
        return {"sandbox": "gold"}

    def close(self) -> None:
        pass


@pytest.mark.slow  # two nights over HTTP and two in process (about 3 s)
@pytest.mark.parametrize("decisions", ["per_night", "ledger"])
def test_a_sage_night_through_the_in_process_stand_in_decides_exactly_as_one_over_http(tmp_path, decisions):
    from sage_pipeline.sleep.sage_night import SageNightConfig, run_sage_night
    from sage_pipeline.sleep.sage_skills import SageSkillsRoot

    tasks = [t for t in SimWorld.load("coder").generate_tasks(7, per_topic=6) if t.reference_kind == "unit_tests"]
    cfg = SageNightConfig(decisions=decisions)

    def night(name, backend):
        r = run_sage_night(SageSkillsRoot(tmp_path / name), tasks, backend, GoldJudge(tasks), cfg, date="2026-11-03",
                           ledger=tmp_path / f"{name}-ledger.json")
        return r, {k: r.to_dict()[k] for k in ("status", "gate_action", "scores", "edits", "trials", "per_task")}

    oc = dict(model="standin", temperature=0.0, max_retries=0)
    with StandinServer(StandinModel(tasks, StandinConfig(seed=9, effect="planted"))) as server:
        r_http, http = night("http", OpenAIBackend(OpenAIConfig(base_url=server.base_url, **oc)))
    r_in, inproc = night("inproc", InProcessBackend(StandinModel(tasks, StandinConfig(seed=9, effect="planted")),
                                                    OpenAIConfig(base_url="http://standin.invalid/v1", **oc)))
    assert r_http.status in ("accepted", "rejected", "pending", "no_edits"), (r_http.status, r_http.reason)
    assert r_http.calls["calls"] > len(tasks) // 2 and http == inproc
    assert r_http.versions["after"] == r_in.versions["after"]
