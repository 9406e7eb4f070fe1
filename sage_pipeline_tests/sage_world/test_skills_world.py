"""Skills in the model world, a test harness (issue 42, item 6): off changes nothing; null records the skills SAGE
injected and never changes an answer; planted moves the role's chance by delta only when SAGE injects the
instruction (not past its caps, not in the tdd-workflow skill it never reads); reflect replies parse and propose
the instruction at the stated rate; and with SAGE's real `sage run` the world sees the instruction in the coder's
prompt and records the shas SAGE logs (SAGE_PYTHON)."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sage_pipeline.sage import skills as sk
from sage_pipeline.sage_world.harness import goal
from sage_pipeline.sage_world.server import WorldServer
from sage_pipeline.sage_world.skills_world import (
    PLANTED_INSTRUCTION,
    REFLECT_MARKER,
    TEMPLATE_HEADS,
    SkillsWorldConfig,
    SkillsWorldError,
    injected_skills,
    skills_effect,
)
from sage_pipeline.sage_world.world import ModelWorld, WorldConfig, WorldError, build_world, world_info
from sage_pipeline.sleep import prompts
from sage_pipeline.sleep.records import ReflectRequest
from sage_pipeline.sleep.sage_skills import SageSkillsRoot

SAGE_TABLE = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_journal" / "models.yaml"
TDD = "discipline/test-driven-development/SKILL.md"
DOCS = "workflow/documentation-lookup/SKILL.md"
SD = "discipline/systematic-debugging/SKILL.md"
TDD_WF = "workflow/tdd-workflow/SKILL.md"
CODER = "qwen2.5-coder:1.5b"
SHIPPED = {s: (sk.SKILL_TREE / s).read_text(encoding="utf-8") for s in sk.SKILL_IDS}


@pytest.fixture(scope="module")
def base() -> ModelWorld:
    return build_world(SAGE_TABLE, n_tasks=24, task_seed=3, config=WorldConfig(clock_scale=0.0))


def _world(base: ModelWorld, mode: str = "off", seed: int = 0, **skills) -> ModelWorld:
    return ModelWorld(base.sim, base.table, WorldConfig(seed=seed, clock_scale=0.0),
                      skills=SkillsWorldConfig(mode=mode, **skills))


def _with(skill: str, text: str) -> dict[str, str]:
    return {**SHIPPED, skill: text}


TREES = {
    "shipped": SHIPPED,
    "injected": _with(TDD, SHIPPED[TDD] + f"\n- {PLANTED_INSTRUCTION}\n"),
    # the same instruction, starting past SAGE's per-skill cap of 3,200 characters
    "past_cap": _with(TDD, SHIPPED[TDD] + "\n" + "- Keep the file tidy.\n" * 80 + f"- {PLANTED_INSTRUCTION}\n"),
    "tdd_workflow": _with(TDD_WF, SHIPPED[TDD_WF] + f"\n- {PLANTED_INSTRUCTION}\n"),
}


def _system(agent: str, tree: dict[str, str], task: str = "", err: str = "") -> str:
    """An agent's system message as SAGE builds it: universal prefix, the injected skills, its instructions."""
    prefix = ("CODEBASE CONTEXT:\nNone\n\nUSER RULES:\nNone\n\nORCHESTRATOR NOTES:\nNone\n\nWORKSPACE POLICY:\nNone\n\n"
              "TOOL PERMISSIONS:\ncreate, edit\n\nKNOWN PATTERNS:\nNone\n")
    prefix += sk.injection(tree, agent, task, err).prompt_section
    return prefix + "\n\n" + TEMPLATE_HEADS[agent] + "\n\nTASK: " + task + "\nPROJECT CONTEXT: {}\n"


def _coder_call(w: ModelWorld, run: str, task_id: str, tree: dict[str, str]) -> tuple[str, dict]:
    g = goal(run, w.tasks[w.by_id[task_id]].prompt)
    w.assign(run, task_id)
    msgs = [{"role": "system", "content": _system("coder", tree, g)},
            {"role": "user", "content": f"Implement the following task.\n\nTASK: {g}\n\nReturn ONLY JSON."}]
    return w.answer(CODER, msgs)


def _reflect_request(budget: int = 4, max_rule_chars: int = 300, skill_doc: str = "# Coder\n") -> ReflectRequest:
    return ReflectRequest(skill_name="coder", documents={"skill": skill_doc, "memory": "# Memory\n"},
                          blocks={"skill": ("Read the task twice.",), "memory": ()}, failures=[], successes=[],
                          edit_budget=budget, block_max_chars=2000, max_rule_chars=max_rule_chars,
                          room={"skill": 1900, "memory": 2000})


def _interval(p: np.ndarray) -> float:
    """4 standard deviations of a sum of independent Bernoullis with chances ``p`` (at least 1)."""
    return max(1.0, 4.0 * math.sqrt(float(np.sum(p * (1.0 - p)))))


# ------------------------------------------------------------------ off: the world as it was
def test_off_is_the_default_and_ignores_skills_entirely(base):
    assert SkillsWorldConfig().mode == "off" and not base.skills.on and "skills" not in world_info(base)
    assert world_info(_world(base, "null"))["skills"]["mode"] == "null"
    plain, planted_text = _world(base), _world(base)
    tid = base.tasks[0].task_id
    a = _coder_call(plain, "r1", tid, TREES["shipped"])
    b = _coder_call(planted_text, "r1", tid, TREES["injected"])
    assert a == b and "skills" not in a[1] and "instruction_live" not in a[1]
    # a reflect request is no SAGE agent's: refused as before
    with pytest.raises(WorldError, match="no SAGE agent writes"):
        plain.answer("m", prompts.reflect_messages(_reflect_request()))
    assert plain.skills.reflects == []


# ------------------------------------------------------------------ reading what SAGE injected
@pytest.mark.parametrize("agent", sorted(TEMPLATE_HEADS))
def test_the_injected_skills_are_read_back_exactly_from_each_agents_system_message(agent):
    tree = TREES["injected"]
    for task, err in (("", ""), ("fix the error in the test", "Traceback: boom")):
        inj = sk.injection(tree, agent, task, err)
        msgs = [{"role": "system", "content": _system(agent, tree, task, err)}, {"role": "user", "content": "x"}]
        seen = injected_skills(msgs, agent)
        assert [s.skill_id for s in seen] == [s.skill_id for s in inj.skills]
        for s, i in zip(seen, inj.skills, strict=True):  # the shown text is SAGE's body, stripped
            assert s.text == tree[i.skill_id][:i.chars].strip()
            assert s.shown_sha16 == sk.sha16(s.text)


def test_a_prompt_without_sages_skill_context_shows_no_skills():
    for system in ("CODEBASE CONTEXT:\nNone\n", "",
                   "x\n\nSKILL DISCIPLINE CONTEXT:\nsome notes\n### sage:discipline:x/SKILL.md\ntext"):
        assert injected_skills([{"role": "system", "content": system}], "coder") == ()
    assert injected_skills([{"role": "user", "content": _system("coder", SHIPPED)}], "coder") == ()  # not system


def test_shas_resolve_to_what_sage_logs_once_the_world_knows_the_tree(base):
    w = _world(base, "null")
    tree = TREES["injected"]
    _, before = _coder_call(w, "r1", base.tasks[0].task_id, tree)
    assert before["instruction_live"] and {s["sha16"] for s in before["skills"]} == {None}
    w.skills.know(tree)
    _, rec = _coder_call(w, "r2", base.tasks[0].task_id, tree)
    payload = sk.injection(tree, "coder", goal("r2", base.tasks[0].prompt)).payload
    assert [s["sha16"] for s in rec["skills"]] == payload["content_sha256_16"]
    assert [s["chars"] for s in rec["skills"]] == payload["per_skill_chars"]
    assert [sk.title(s["skill_id"]) for s in rec["skills"]] == payload["skill_ids"]
    assert rec["skills"][0]["shown_sha16"] != rec["skills"][0]["sha16"]  # the body ends in a newline SAGE strips


# ------------------------------------------------------------------ null: recorded, never acted on
def test_null_mode_answers_exactly_as_off_whatever_the_skills(base):
    off = _world(base)
    worlds = {name: _world(base, "null") for name in TREES}
    for i in range(60):
        tid = base.tasks[i % len(base.tasks)].task_id
        want = _coder_call(off, f"r{i}", tid, SHIPPED)
        for name, w in worlds.items():
            content, rec = _coder_call(w, f"r{i}", tid, TREES[name])
            assert content == want[0] and rec["slot_after"] == want[1]["slot_after"]
            assert rec["p_right"] == want[1]["p_right"]
            assert rec["instruction_live"] == (name == "injected")
    shas = {}
    for name, w in worlds.items():
        rec = _coder_call(w, "z", base.tasks[0].task_id, TREES[name])[1]
        shas[name] = {s["skill_id"]: s["shown_sha16"] for s in rec["skills"]}
    assert shas["injected"][TDD] != shas["shipped"][TDD] and shas["past_cap"][TDD] != shas["shipped"][TDD]
    assert shas["tdd_workflow"] == shas["shipped"]  # SAGE never reads that skill: the prompt is the same


# ------------------------------------------------------------------ planted: delta only when injected
def test_planted_moves_the_coders_right_rate_by_delta_only_when_sage_injects_the_instruction(base):
    n, delta = 800, 0.15
    runs = [(f"r{i}", base.tasks[i % len(base.tasks)].task_id) for i in range(n)]
    off = _world(base)
    right0 = np.array([_coder_call(off, r, t, SHIPPED)[1]["slot_after"] == -1 for r, t in runs])
    p0 = np.array([base.p_code(base.by_id[t], CODER) for _, t in runs])
    p1 = np.minimum(1.0, p0 + delta)
    for name, tree in TREES.items():
        w = _world(base, "planted", delta=delta)
        recs = [_coder_call(w, r, t, tree)[1] for r, t in runs]
        right = np.array([rec["slot_after"] == -1 for rec in recs])
        live = name == "injected"
        assert {rec["instruction_live"] for rec in recs} == {live}
        assert skills_effect(tree, w.skills.config, task_description=goal("r0", base.tasks[0].prompt)).live == live
        if not live:  # past the cap, in tdd-workflow or absent: not one answer changes
            assert np.array_equal(right, right0), name
            continue
        # the same draw decides with and without: right without -> right with; the moved share is delta
        assert not np.any(right0 & ~right)
        moved = int(np.sum(right & ~right0))
        assert abs(moved - float(np.sum(p1 - p0))) <= _interval(p1 - p0)
        assert abs(int(right.sum()) - float(p1.sum())) <= _interval(p1)
        assert recs[0]["p_right"][CODER] == pytest.approx(min(1.0, base.p_code(base.by_id[runs[0][1]], CODER) + delta))
        assert abs(right.mean() - right0.mean() - delta) < 0.05


def test_planted_acts_on_its_role_only(base):
    """Planted on the reviewer: the coder's answers do not move; the reviewer's recorded accuracy does."""
    w, off = _world(base, "planted", role="reviewer"), _world(base)
    tree = TREES["injected"]  # TDD is injected into the coder and the reviewer alike
    for i in range(40):
        tid = base.tasks[i % len(base.tasks)].task_id
        assert _coder_call(w, f"r{i}", tid, tree)[0] == _coder_call(off, f"r{i}", tid, tree)[0]
        desc = f"[sage-world run=r{i}] Implement it."
        rev = [{"role": "system", "content": _system("reviewer", tree, desc)},
               {"role": "user", "content": f"Review this file for task: {desc}\nFILE: x.py\n"}]
        _, rec = w.answer(CODER, rev)
        _, rec0 = off.answer(CODER, rev)
        assert rec["instruction_live"]
        assert rec["accuracy"] == pytest.approx(min(1.0, rec0["accuracy"] + 0.15))


def test_chance_is_the_exact_truth_with_and_without_the_instruction(base):
    t = 5
    p, acc, fix = base.p_code(t, CODER), base.review_accuracy(t, CODER), base.p_fix(t, 0, "codestral:22b")
    planted = _world(base, "planted", delta=0.3)
    assert planted.chance("coder", t, CODER, instruction_live=True) == pytest.approx(min(1.0, p + 0.3))
    assert planted.chance("coder", t, CODER) == p
    assert planted.chance("reviewer", t, CODER, instruction_live=True) == acc  # not the planted role
    for mode in ("off", "null"):
        assert _world(base, mode).chance("coder", t, CODER, instruction_live=True) == p
    deb = _world(base, "planted", role="debugger", delta=-1.0)
    assert deb.chance("debugger", t, "codestral:22b", 0, True) == 0.0  # clipped at 0
    assert deb.chance("debugger", t, "codestral:22b", 0) == fix
    assert deb.chance("debugger", t, "codestral:22b", -1, True) == 1.0  # a right file stays right: no draw
    assert _world(base, "planted", delta=1.0).chance("coder", t, CODER, instruction_live=True) == 1.0
    with pytest.raises(WorldError, match="no chance for role 'planner'"):
        planted.chance("planner", t, CODER)


def test_skills_effect_follows_sages_selection_path_rule_and_caps(tmp_path):
    cfg = SkillsWorldConfig(mode="planted")
    eff = skills_effect(TREES["injected"], cfg)
    assert eff.live and eff.skill == TDD
    eff = skills_effect(TREES["past_cap"], cfg)
    assert not eff.live and eff.skill == TDD and "per-skill cap" in eff.reason
    eff = skills_effect(TREES["tdd_workflow"], cfg)
    assert not eff.live and eff.skill == TDD_WF and "never reads" in eff.reason
    assert skills_effect(SHIPPED, cfg) == skills_effect(SHIPPED, cfg) and not skills_effect(SHIPPED, cfg).live
    # the coder's last skill is cut by a low total cap (SAGE_MAX_SKILL_CHARS_TOTAL)
    docs = _with(DOCS, SHIPPED[DOCS] + f"\n- {PLANTED_INSTRUCTION}\n")
    assert skills_effect(docs, cfg).live
    eff = skills_effect(docs, cfg, total_cap=4500)
    assert not eff.live and "total cap of 4500" in eff.reason
    # systematic-debugging reaches the coder only when the task names a debugging keyword
    sd = _with(SD, SHIPPED[SD] + f"\n- {PLANTED_INSTRUCTION}\n")
    assert not skills_effect(sd, cfg, task_description="sum a list").live
    assert "does not inject it into the coder" in skills_effect(sd, cfg, task_description="sum a list").reason
    assert skills_effect(sd, cfg, task_description="raise an error on empty input").live
    assert skills_effect(sd, cfg, role="debugger").live
    # a version folder of the project's skills root, as SAGE_SKILLS_ROOT points at it
    store = SageSkillsRoot(tmp_path / "skills")
    assert not skills_effect(store.live_path(), cfg).live
    store.commit({TDD: TREES["injected"][TDD]}, "plant")
    assert skills_effect(store.live_path(), cfg).live and skills_effect(store.texts("live"), cfg).live
    with pytest.raises(SkillsWorldError, match="not a skills tree folder"):
        skills_effect(tmp_path / "nowhere", cfg)


def test_config_errors_say_what_is_wrong():
    from pydantic import ValidationError

    for bad, field in (({"mode": "on"}, "mode"), ({"role": "planner"}, "role"), ({"delta": 1.5}, "delta"),
                       ({"instruction": "two\nlines of an instruction"}, "instruction"),
                       ({"instruction": "short"}, "instruction"), ({"reflect_propose": -0.1}, "reflect_propose"),
                       ({"bogus": 1}, "bogus")):
        with pytest.raises(ValidationError) as e:
            SkillsWorldConfig(**bad)
        assert e.value.errors()[0]["loc"][0] == field


# ------------------------------------------------------------------ reflect
def test_reflects_marker_is_the_reflect_prompts_own():
    assert prompts.reflect_messages(_reflect_request())[0]["content"].startswith(REFLECT_MARKER)


def test_reflect_replies_parse_and_propose_the_instruction_at_the_stated_rate(base):
    n, rate, k = 400, 0.3, 3
    planted = _world(base, "planted", reflect_propose=rate, reflect_useless=k, seed=1)
    null = _world(base, "null", reflect_propose=rate, reflect_useless=k, seed=1)
    msgs = prompts.reflect_messages(_reflect_request(budget=4))
    proposed = 0
    for _ in range(n):
        edits = prompts.parse_reflect_reply(planted.answer("m", msgs)[0])
        nulls = prompts.parse_reflect_reply(null.answer("m", msgs)[0])
        assert all(e.op == "add" and e.target in ("skill", "memory") and e.status != "invalid" and e.content
                   and "\n" not in e.content for e in edits)
        mine = [e for e in edits if e.content == PLANTED_INSTRUCTION]
        assert all(e.target == "skill" for e in mine)
        proposed += len(mine)
        useless = [(e.content, e.target) for e in edits if e.content != PLANTED_INSTRUCTION]
        assert len(useless) == k and useless == [(e.content, e.target) for e in nulls]  # null: the same rules
        assert PLANTED_INSTRUCTION not in {e.content for e in nulls}
    assert abs(proposed - rate * n) <= 4 * math.sqrt(n * rate * (1 - rate))
    recs = planted.skills.reflects
    assert len(recs) == n and sum(r["proposed_instruction"] for r in recs) == proposed
    assert [r["asked"] for r in recs] == list(range(n))  # the same prompt asked again draws afresh
    assert planted.truth == []  # a reflect is no SAGE call


def test_reflect_keeps_the_instruction_within_a_small_budget_and_never_repeats_one_already_there(base):
    w = _world(base, "planted", reflect_propose=1.0, reflect_useless=5)
    edits = prompts.parse_reflect_reply(w.answer("m", prompts.reflect_messages(_reflect_request(budget=2)))[0])
    assert len(edits) == 2 and PLANTED_INSTRUCTION in {e.content for e in edits}
    held = prompts.reflect_messages(_reflect_request(skill_doc=f"# Coder\n\n- {PLANTED_INSTRUCTION}\n"))
    assert PLANTED_INSTRUCTION not in {e.content for e in prompts.parse_reflect_reply(w.answer("m", held)[0])}
    with pytest.raises(SkillsWorldError, match="over the reflect request's limit of 50"):
        w.answer("m", prompts.reflect_messages(_reflect_request(max_rule_chars=50)))
    with pytest.raises(SkillsWorldError, match="without its edit budget"):
        w.answer("m", [{"role": "system", "content": REFLECT_MARKER + " Reply with JSON."},
                       {"role": "user", "content": "x"}])


def test_reflect_targets_a_sage_skill_the_role_gets_when_the_request_offers_skill_files(base):
    w = _world(base, "planted", reflect_propose=1.0)
    req = ReflectRequest(skill_name="sage", documents={SD: "x", TDD: "y"}, blocks={SD: (), TDD: ()}, failures=[],
                         successes=[], edit_budget=4, block_max_chars=2000, max_rule_chars=300,
                         room={SD: 100, TDD: 100})
    reply = json.loads(w.answer("m", prompts.reflect_messages(req))[0])["edits"]
    # SAGE injects TDD into the coder, not systematic-debugging
    assert {e["target"] for e in reply if e["content"] == PLANTED_INSTRUCTION} == {TDD}
    assert {e["target"] for e in reply} <= {SD, TDD}
    assert len(prompts.parse_reflect_reply(json.dumps({"edits": reply}))) == len(reply)


# ------------------------------------------------------------------ the server: Ollama's API and OpenAI's route
def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_server_answers_reflect_on_both_routes_and_the_cycles_openai_backend_parses_it(base):
    from sage_pipeline.sleep.backends import OpenAIBackend, OpenAIConfig

    w = _world(base, "planted", reflect_propose=1.0)
    msgs = prompts.reflect_messages(_reflect_request())
    with WorldServer(w) as srv:
        code, reply = _post(srv.url + "/api/chat", {"model": "sleep", "messages": msgs, "stream": False})
        assert code == 200 and reply["done"] and reply["eval_duration"] == 0
        assert PLANTED_INSTRUCTION in {e.content for e in prompts.parse_reflect_reply(reply["message"]["content"])}
        backend = OpenAIBackend(OpenAIConfig(base_url=srv.url + "/v1", model="sleep", api_key_env="", max_retries=0))
        got = backend.complete(prompts.reflect_messages(_reflect_request()), "reflect", 2048)
        assert PLANTED_INSTRUCTION in {e.content for e in prompts.parse_reflect_reply(got.text)}
        assert got.prompt_tokens > 0 and got.completion_tokens > 0
        # a SAGE agent's call through the OpenAI route is the world's answer, as on Ollama's
        w.assign("rq", base.tasks[0].task_id)
        g = goal("rq", base.tasks[0].prompt)
        code, reply = _post(srv.url + "/v1/chat/completions", {"model": CODER, "messages": [
            {"role": "system", "content": _system("coder", TREES["injected"], g)},
            {"role": "user", "content": f"Implement the following task.\n\nTASK: {g}\n\n"}]})
        assert code == 200 and reply["object"] == "chat.completion"
        assert json.loads(reply["choices"][0]["message"]["content"])["operation"] == "create"
        assert w.truth[-1]["agent"] == "coder" and w.truth[-1]["instruction_live"]
        code, reply = _post(srv.url + "/v1/chat/completions", {"model": "m", "messages": msgs, "stream": True})
        assert code == 400 and "stream" in reply["error"]
    assert [r["proposed_instruction"] for r in w.skills.reflects] == [True, True]


def test_an_off_world_serves_neither_reflect_nor_the_openai_route(base):
    msgs = prompts.reflect_messages(_reflect_request())
    with WorldServer(_world(base)) as srv:
        code, reply = _post(srv.url + "/api/chat", {"model": "m", "messages": msgs})
        assert code == 400 and "no SAGE agent" in reply["error"]
        code, reply = _post(srv.url + "/v1/chat/completions", {"model": "m", "messages": msgs})
        assert code == 404 and "no endpoint POST /v1/chat/completions" in reply["error"]


# ------------------------------------------------------------------ contract: SAGE's real `sage run`
def test_template_heads_are_what_sages_agents_write_after_their_prefix(sage_python):
    from sage_pipeline_tests.sage_contract.sage_journals import require_sage

    pkg = require_sage()[1].parents[1]
    for agent, head in TEMPLATE_HEADS.items():
        if agent == "debugger":
            src = (pkg / "agents" / "debugger.py").read_text(encoding="utf-8")
            assert 'structured_instructions = f"""' + head in src
            assert 'return prefix + "\\n\\n" + structured_instructions' in src
        else:
            first = (pkg / "prompt_engine" / "templates" / f"{agent}.md").read_text(encoding="utf-8").splitlines()[0]
            assert first == head, agent
            src = (pkg / "agents" / f"{agent}.py").read_text(encoding="utf-8")
            assert 'universal_prefix + "\\n\\n" + system' in src, agent


def test_sage_run_shows_the_planted_instruction_to_the_coder_and_the_world_records_sages_shas(sage_python, tmp_path):
    """Four runs of SAGE's unchanged `sage run`, SAGE_SKILLS_ROOT at a version whose TDD skill carries the
    instruction, planted on the coder with delta -1 (so every first file is wrong and the debugger is called
    too): every call's skills, as the world read them from the prompt, are what SAGE logged it injected."""
    from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, run_day
    from sage_pipeline.sleep.sage_skills import journal_injections

    install = SageInstall.find(sage_python)
    world = build_world(install.models_yaml, n_tasks=24, task_seed=1, config=WorldConfig(clock_scale=0.0),
                        skills=SkillsWorldConfig(mode="planted", delta=-1.0))
    store = SageSkillsRoot(tmp_path / "skills")
    store.commit({TDD: store.text("live", TDD) + f"\n- {PLANTED_INSTRUCTION}\n"}, "plant the instruction")
    world.skills.know(store.texts("live"))
    with WorldServer(world) as srv:
        res = run_day(world, srv.url, install, 1, [t.task_id for t in world.tasks[:4]], tmp_path / "day1",
                      HarnessConfig(workers=2), skills_root=store.live_path())
    assert res.finished == 4, res.failures
    calls = [r for r in world.truth if "skills" in r]
    coder = [r for r in calls if r["agent"] == "coder"]
    assert len(coder) == 4 and all(r["instruction_live"] and r["slot_after"] != -1 for r in coder)
    assert all(p == pytest.approx(world.chance("coder", world.by_id[r["task_id"]], m, instruction_live=True))
               for r in coder for m, p in r["p_right"].items())
    log = journal_injections(res.sessions_dirs)
    assert log.problems == [] and log.events
    theirs = Counter((e.agent_role, tuple(e.skill_ids), e.sha16, e.per_skill_chars) for e in log.events)
    mine = Counter((r["agent"], tuple(s["skill_id"] for s in r["skills"]), tuple(s["sha16"] for s in r["skills"]),
                    tuple(s["chars"] for s in r["skills"])) for r in calls if r["skills"])
    assert mine == theirs  # every call the world answered showed exactly what SAGE logged it injected
    assert {r["agent"] for r in calls} >= {"planner", "coder", "reviewer", "test_engineer", "debugger"}
    assert {s["sha16"] for r in calls for s in r["skills"]} <= set(store.shas().values())
    live = {e.agent_role for e in log.events if TDD in e.skill_ids}
    assert {r["agent"] for r in calls if r["instruction_live"]} == live
