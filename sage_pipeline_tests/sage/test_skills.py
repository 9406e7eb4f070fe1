"""SAGE's skills contract, read from prompt_engine/skill_injector.py: the shipped tree, the selection rule,
the caps, the text and payload of an injection, SKILL_INJECTION lines read back. SAGE's own injector is run
against the same cases in sage_world/test_skills_contract.py; these tests need no SAGE."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pytest

from sage_pipeline.sage import skills as sk

TDD = "discipline/test-driven-development/SKILL.md"
VBC = "discipline/verification-before-completion/SKILL.md"
SD = "discipline/systematic-debugging/SKILL.md"
TDD_WF = "workflow/tdd-workflow/SKILL.md"
PROMPT = "workflow/prompt-optimizer/SKILL.md"
VLOOP = "workflow/verification-loop/SKILL.md"
DOCS = "workflow/documentation-lookup/SKILL.md"
PLAN = "planning/make-plan/SKILL.md"
EXPLORE = "planning/smart-explore/SKILL.md"


def _root(tmp_path: Path, files: dict[str, bytes | str]) -> Path:
    for rel, data in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data.encode() if isinstance(data, str) else data)
    return tmp_path


def test_the_shipped_tree_is_sages_nine_skills_with_the_licence_named():
    files = sorted(str(p.relative_to(sk.SKILL_TREE)) for p in sk.SKILL_TREE.rglob("*") if p.is_file())
    assert files == sorted(sk.SKILL_IDS) and len(files) == 9
    notice = (sk.SKILL_TREE.parent / "NOTICE").read_text()
    assert "skills/" in notice and "src/sage/assets/skills" in notice and "MIT" in notice
    assert "Sridhar S" in (sk.SKILL_TREE.parent / "LICENSE").read_text()
    texts = sk.root_texts()
    assert all(texts[s].strip() and len(texts[s]) <= sk.PER_SKILL_CAP for s in sk.INJECTED_IDS)
    assert sk.check_within_caps().ok  # as shipped, SAGE's caps cut nothing for any role or keyword


def test_sages_path_rule_never_reads_the_tdd_workflow_skill():
    # _resolve_spec_path: spec.path.replace("workflow/", "") also eats "tdd-workflow/"
    assert sk.resolve(TDD_WF) == ("workflow/tdd-SKILL.md", "sage:workflow:tdd-SKILL.md")
    assert sk.resolve(TDD) == (TDD, "sage:discipline:test-driven-development/SKILL.md")
    assert sk.NEVER_READ == (TDD_WF,) and len(sk.INJECTED_IDS) == 8
    assert "workflow/tdd-SKILL.md" in sk.READ_FILES and TDD_WF not in sk.READ_FILES
    inj = sk.injection(None, "coder")
    assert TDD_WF not in inj.selected and "workflow/tdd-SKILL.md" in inj.skipped_blank
    assert [s.skill_id for s in inj.skills] == [TDD, VBC, PROMPT, DOCS]


def test_a_file_at_the_path_sage_reads_is_injected_under_its_title(tmp_path):
    root = _root(tmp_path, {TDD: "tdd", "workflow/tdd-SKILL.md": "the tdd workflow"})
    inj = sk.injection(root, "test_engineer")
    assert inj.payload["skill_ids"] == ["sage:discipline:test-driven-development/SKILL.md",
                                        "sage:workflow:tdd-SKILL.md"]
    assert sk.skill_id("sage:workflow:tdd-SKILL.md") == "workflow/tdd-SKILL.md"


@pytest.mark.parametrize("role, expected", [
    ("coder", (TDD, VBC, TDD_WF, PROMPT, DOCS)),
    ("test_engineer", (TDD, VBC, TDD_WF, PROMPT, VLOOP)),
    ("reviewer", (TDD, VBC, VLOOP)),
    ("debugger", (SD, DOCS)),
    ("planner", (DOCS, PLAN, EXPLORE)),
    ("documentation", (DOCS, VBC, PROMPT)),
    ("architect", ()),
    ("memory_optimizer", ()),
    ("Coder", (TDD, VBC, TDD_WF, PROMPT, DOCS)),  # the role is lower-cased
    ("", ()),
])
def test_fixed_sets_per_role(role, expected):
    assert sk.select_skills(role) == expected


def test_keywords_add_skills_in_sages_order_and_never_twice():
    # an error keyword adds systematic-debugging right after the role's discipline skills, for any role but the debugger
    assert sk.select_skills("coder", "", "Traceback (most recent call last)") == (TDD, VBC, SD, TDD_WF, PROMPT, DOCS)
    assert sk.select_skills("architect", "", "JSON parse failed") == (SD,)
    assert sk.select_skills("nobody", "", "stack overflow") == (SD,)
    assert sk.select_skills("debugger", "", "traceback") == (SD, DOCS)
    # task keywords: only the coder, test engineer and reviewer, appended at the end
    assert sk.select_skills("reviewer", "Fix the ERROR in parse()") == (TDD, VBC, VLOOP, SD)
    assert sk.select_skills("reviewer", "add coverage") == (TDD, VBC, VLOOP)  # TDD already there
    assert sk.select_skills("planner", "debug the tests") == (DOCS, PLAN, EXPLORE)
    assert sk.select_skills("coder", "a stack trace", "traceback") == (TDD, VBC, SD, TDD_WF, PROMPT, DOCS)
    assert sk.select_skills("coder", None, None) == sk.select_skills("coder")


def test_the_injected_text_and_payload_are_sages(tmp_path):
    root = _root(tmp_path, {TDD: "  # TDD\n\nwrite the test first\n\n", VBC: "verify", PROMPT: "", DOCS: "\n \n"})
    inj = sk.injection(root, "Coder", "add a test")
    assert inj.text == "### sage:discipline:test-driven-development/SKILL.md\n# TDD\n\nwrite the test first" \
                       "\n\n### sage:discipline:verification-before-completion/SKILL.md\nverify"
    body = "  # TDD\n\nwrite the test first\n\n"  # the hash is of the body before the strip
    assert inj.payload == {"agent_role": "Coder",
                           "skill_ids": ["sage:discipline:test-driven-development/SKILL.md",
                                         "sage:discipline:verification-before-completion/SKILL.md"],
                           "content_sha256_16": [hashlib.sha256(body.encode()).hexdigest()[:16],
                                                 hashlib.sha256(b"verify").hexdigest()[:16]],
                           "per_skill_chars": [len(body), 6], "total_chars": len(body) + 6,
                           "approx_prompt_tokens": 1 + (len(body) + 6) // 4}
    assert set(inj.skipped_blank) == {PROMPT, DOCS, "workflow/tdd-SKILL.md"}
    assert inj.prompt_section == sk.PREFIX_HEADING + inj.text
    nothing = sk.injection(root, "architect")
    assert nothing.text == "" and nothing.payload is None and nothing.prompt_section == ""


def test_per_skill_cap_cuts_the_body_and_the_hash_is_of_what_was_injected(tmp_path):
    text = "é" * 5000  # characters, not bytes
    inj = sk.injection(_root(tmp_path, {SD: text}), "debugger")
    (s,) = inj.skills
    assert s.chars == sk.PER_SKILL_CAP and s.cut == 1800 and inj.truncated == {SD: 1800}
    assert s.sha16 == sk.sha16(text[:sk.PER_SKILL_CAP])
    assert sk.check_within_caps(tmp_path).per_skill == {SD: 1800}


def test_total_cap_cuts_the_last_skill_and_stops_when_200_or_fewer_are_left(tmp_path):
    root = _root(tmp_path, {TDD: "a" * 3000, VBC: "b" * 3000, TDD_WF: "x", PROMPT: "c" * 3000, DOCS: "d" * 3000})
    inj = sk.injection(root, "coder", total_cap="10000")
    assert [s.chars for s in inj.skills] == [3000, 3000, 3000, 1000] and inj.truncated == {DOCS: 2000}
    assert inj.payload["total_chars"] == 10000
    inj = sk.injection(root, "coder", total_cap=9200)  # 200 left for DOCS: SAGE stops
    assert [s.skill_id for s in inj.skills] == [TDD, VBC, PROMPT] and inj.dropped == (DOCS,)
    inj = sk.injection(root, "coder", total_cap=9201)  # 201 left: injected, cut
    assert inj.skills[-1].chars == 201
    inj = sk.injection(root, "coder", total_cap=6000)  # the cap reached exactly: nothing after
    assert [s.skill_id for s in inj.skills] == [TDD, VBC] and inj.dropped == (PROMPT, DOCS)
    inj = sk.injection(root, "coder", total_cap=500)  # SAGE applies at least 1000
    assert inj.cap == 1000 and [s.chars for s in inj.skills] == [1000]
    report = sk.check_within_caps(root, total_cap=6000)
    assert not report.per_skill and any(t["role"] == "coder" and t["cut"] == {PROMPT: 3000, DOCS: 3000}
                                        for t in report.total)
    assert "role coder" in report.message()


@pytest.mark.parametrize("value, cap", [(None, 12000), ("", 12000), ("  ", 12000), ("abc", 12000), ("1.5e4", 12000),
                                        ("500", 1000), (" 5000 ", 5000), ("+4000", 4000), (0, 1000), (20000, 20000)])
def test_total_cap_is_read_as_sage_reads_the_variable(value, cap):
    assert sk.effective_total_cap(value) == cap


def test_a_bool_cap_is_refused():
    with pytest.raises(sk.SkillsError, match="not a bool"):
        sk.effective_total_cap(True)


def test_files_are_read_as_sage_reads_them(tmp_path):
    root = _root(tmp_path, {SD: b"line one\r\nline two\rthree\n", DOCS: b"ok \xff\xfe bytes", PLAN: "\ufeffbom"})
    (tmp_path / "planning" / "smart-explore" / "SKILL.md").mkdir(parents=True)  # a folder: read as missing
    texts = sk.root_texts(root)
    assert texts[SD] == "line one\nline two\nthree\n" and texts[DOCS] == "ok  bytes" and texts[PLAN] == "\ufeffbom"
    assert texts[EXPLORE] == "" and texts[TDD] == ""
    inj = sk.injection(root, "planner")
    assert [s.skill_id for s in inj.skills] == [DOCS, PLAN] and EXPLORE in inj.skipped_blank
    assert inj.skills[0].sha16 == sk.sha16("ok  bytes")


def test_a_skill_starting_with_a_capful_of_blank_is_not_injected(tmp_path):
    inj = sk.injection(_root(tmp_path, {SD: " " * 3300 + "text"}), "debugger")
    assert inj.skills == () and inj.payload is None and SD in inj.skipped_blank


def test_an_edit_past_the_cap_is_refused_naming_the_file_and_how_far_over():
    with pytest.raises(sk.SkillTooLong, match=r"discipline/test-driven-development/SKILL.md: 3250 characters .* "
                                              r"50 over SAGE's per-skill cap of 3200") as e:
        sk.check_text(TDD, "x" * 3250)
    assert e.value.over == 50 and e.value.skill_id == TDD
    assert sk.check_text(TDD, "a\r\n" * 1600) == "a\n" * 1600  # 3200 characters once SAGE reads \r\n as \n
    with pytest.raises(sk.SkillsError, match="blank: SAGE skips a blank skill"):
        sk.check_text(TDD, " \n\t")
    with pytest.raises(sk.SkillsError, match="SAGE never reads this file.*workflow/tdd-SKILL.md"):
        sk.check_text(TDD_WF, "x")
    with pytest.raises(sk.SkillsError, match="not one of SAGE's skills"):
        sk.check_text("discipline/nope/SKILL.md", "x")
    with pytest.raises(sk.SkillsError, match="cannot be written as UTF-8"):
        sk.check_text(TDD, "bad \udc80")
    with pytest.raises(sk.SkillsError, match="expected a string"):
        sk.check_text(TDD, b"bytes")


def _line(payload: dict, **extra) -> str:
    return json.dumps({"type": "SKILL_INJECTION", "timestamp": "2026-11-20T10:00:00+00:00", **payload, **extra})


def test_skill_injection_lines_are_read_back_with_their_ids_and_shas(tmp_path):
    inj = sk.injection(None, "reviewer", "add tests")
    lines = ["[2026-11-20T10:00:00Z] CHECKPOINT completed=1 pending=0",
             json.dumps({"type": "TRAJECTORY_STEP", "timestamp": "t", "note": "SKILL_INJECTION mentioned"}),
             _line(inj.payload, session_id="s1", trace_id="t1"), ""]
    log = sk.read_injections(lines)
    (e,) = log.events
    assert log.problems == [] and log.lines == 4 and (e.source, e.line) == ("<lines>", 3)
    assert e.skill_ids == (TDD, VBC, VLOOP) and e.shas == inj.shas and e.session_id == "s1" and e.trace_id == "t1"
    assert e.per_skill_chars == tuple(s.chars for s in inj.skills) and e.total_chars == inj.payload["total_chars"]
    f = tmp_path / "2026-11-20.log.gz"
    with gzip.open(f, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    (g,) = sk.read_injections(f).events
    assert g.source == str(f) and g.line == 3 and g.shas == inj.shas
    assert sk.read_injections([f, f]).lines == 8


def test_unusable_skill_injection_lines_are_named_by_line_and_field():
    good = sk.injection(None, "debugger").payload
    lines = [_line(good)[:-5],  # truncated
             _line({**good, "content_sha256_16": good["content_sha256_16"][:1]}),
             _line({**good, "per_skill_chars": ["12", 3]}),
             _line({**good, "skill_ids": ["discipline:x"] * 2}),
             _line({**good, "content_sha256_16": ["XYZ", "abc"]}),
             b'{"type": "SKILL_INJECTION", "agent_role": "\xff"}',
             _line(good)]
    log = sk.read_injections(lines)
    assert len(log.events) == 1 and log.events[0].line == 7
    assert log.problems[0].startswith("<lines>:1: a SKILL_INJECTION line that is not JSON")
    assert log.problems[1] == "<lines>:2: field 'content_sha256_16' is [\"" + good["content_sha256_16"][0] + \
        "\"], expected 2 entries, one per skill id"
    assert log.problems[2].startswith("<lines>:3: field 'per_skill_chars'") and "list of integers" in log.problems[2]
    assert log.problems[3].startswith("<lines>:4: field 'skill_ids'") and "not a title SAGE logs" in log.problems[3]
    assert log.problems[4].startswith("<lines>:5: field 'content_sha256_16'") and "hex" in log.problems[4]
    assert log.problems[5] == "<lines>:6: a SKILL_INJECTION line that is not UTF-8 (byte 44)"


def test_a_bare_string_is_neither_a_path_nor_lines():
    with pytest.raises(sk.SkillsError, match="a bare string is neither"):
        sk.read_injections("memory/sessions/2026-11-20.log")
