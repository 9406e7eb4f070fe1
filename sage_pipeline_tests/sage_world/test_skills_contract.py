"""SAGE's skill injection is the project's contract (issue 42): SAGE's own ``get_skill_injection_context``,
run in SAGE's virtualenv, returns exactly :func:`sage_pipeline.sage.skills.injection`'s text and logs exactly
its payload, over every role, keyword, cap and kind of skills root; and SAGE's unchanged ``sage run``, in the
model world with ``SAGE_SKILLS_ROOT`` at the project's live skills root, logs ``SKILL_INJECTION`` shas equal
to the live version's, before and after a commit. SAGE from SAGE_PYTHON (skipped or failed by the rule in
sage_contract/sage_journals.py)."""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from pathlib import Path

from sage_pipeline.sage import skills as sk
from sage_pipeline.sage.table import ROLES
from sage_pipeline.sleep.sage_skills import SageSkillsRoot, journal_injections

# Run by SAGE's Python: for each case, the environment SAGE reads (SAGE_SKILLS_ROOT, SAGE_MAX_SKILL_CHARS_TOTAL,
# a session id naming the case) and SAGE's injector; the texts on stdout, the payloads in SAGE's journal
# (memory/sessions under the working folder), written by SAGE's own log_event.
DRIVER = r"""
import json, os, sys
from pathlib import Path
from sage.prompt_engine.skill_injector import get_skill_injection_context
cases = json.load(sys.stdin)
out = []
for i, c in enumerate(cases):
    os.environ["SAGE_SESSION_ID"] = "case-%d" % i
    for key, value in (("SAGE_SKILLS_ROOT", c["root"]), ("SAGE_MAX_SKILL_CHARS_TOTAL", c["cap"])):
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    policy = Path(".sage/policy.json")
    if c.get("policy_root"):
        policy.parent.mkdir(exist_ok=True)
        policy.write_text(json.dumps({"skills_root": c["policy_root"]}))
    elif policy.exists():
        policy.unlink()
    out.append(get_skill_injection_context(agent_role=c["role"], task_description=c["task"], last_error=c["err"]))
print(json.dumps(out))
"""

TASKS = ("", "implement the parser", *sk.TEST_TASK_KEYWORDS, *sk.DEBUG_TASK_KEYWORDS, "Add PyTest COVERAGE")
ERRORS = ("", "AssertionError: 1 != 2", *sk.ERROR_KEYWORDS, "SyntaxError: invalid syntax")
GRID_ROLES = (*ROLES, "shell_router", "shell_chat", "unknown_role", "Reviewer", "")
SELECTION_ROLES = sk.SELECTION_ROLES


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def _roots(tmp: Path) -> dict[str, Path]:
    """Skills roots of every kind SAGE's injector treats differently."""
    shipped = {s: (sk.SKILL_TREE / s).read_bytes() for s in sk.SKILL_IDS}
    varied = _write(tmp / "varied", {
        "discipline/test-driven-development/SKILL.md": ("TDD — é " * 700).encode(),  # 5,600 characters
        "discipline/verification-before-completion/SKILL.md": b"",  # empty
        # systematic-debugging missing
        "workflow/tdd-workflow/SKILL.md": b"never read by SAGE",
        "workflow/tdd-SKILL.md": b"read instead of tdd-workflow",
        "workflow/prompt-optimizer/SKILL.md": b"crlf line\r\n" * 330,  # 3,630 bytes, 3,300 characters as read
        "workflow/verification-loop/SKILL.md": b"\xef\xbb\xbfbom and bad bytes \xff\xfe here\n",
        "workflow/documentation-lookup/SKILL.md": b"d" * 3200,  # exactly the cap
        "planning/make-plan/SKILL.md": b" " * 3300 + b"text past a capful of blank",
    })
    (varied / "planning" / "smart-explore" / "SKILL.md").mkdir(parents=True)  # a folder where the file belongs
    long = _write(tmp / "long", {s: (s[:1] * 3100 + "\n" + "x" * 99).encode() for s in sk.READ_FILES})
    return {"shipped": _write(tmp / "shipped", shipped), "varied": varied, "long": long}


def _grid(roots: dict[str, Path]) -> list[dict]:
    """Every role x task x error on SAGE's packaged tree and on the varied root; the selection-distinct roles
    with a keyword or none on every other (root, cap)."""
    full = [(None, None), ("varied", None)]
    some = [(None, "1000"), ("shipped", None), ("shipped", "abc"), ("varied", "3300"), ("varied", "500"),
            ("long", None), ("long", " 6400 "), ("long", "6600"), ("long", "6601"), ("long", "5000"),
            ("long", "")]
    grids = [(full, GRID_ROLES, TASKS, ERRORS),
             (some, (*SELECTION_ROLES, "unknown_role"), ("", "test", "debug", "Add PyTest COVERAGE"),
              ("", "traceback", "AssertionError: 1 != 2"))]
    cases = [{"root": None if r is None else str(roots[r]), "cap": cap, "role": role, "task": task, "err": err}
             for combos, roles, tasks, errors in grids for r, cap in combos
             for role in roles for task in tasks for err in errors]
    # the policy file's skills_root, read when SAGE_SKILLS_ROOT is unset, and the variable winning over it
    policy = {"cap": None, "role": "coder", "task": "test", "err": "", "policy_root": str(roots["long"])}
    cases += [{"root": None, **policy}, {"root": str(roots["varied"]), **policy}]
    return cases


def _payload(e: sk.InjectionEvent) -> dict:
    return {"agent_role": e.agent_role, "skill_ids": [sk.title(s) for s in e.skill_ids],
            "content_sha256_16": list(e.sha16), "per_skill_chars": list(e.per_skill_chars),
            "total_chars": e.total_chars, "approx_prompt_tokens": e.approx_prompt_tokens}


def test_sages_injector_gives_exactly_the_projects_text_and_payload(sage_python, tmp_path):
    roots = _roots(tmp_path / "roots")
    cases = _grid(roots)
    ws = tmp_path / "ws"
    ws.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path), "LANG": "C.UTF-8"}
    out = subprocess.run([sage_python, "-c", DRIVER], input=json.dumps(cases), capture_output=True, text=True,
                         cwd=ws, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    texts = json.loads(out.stdout.strip().splitlines()[-1])
    log = sk.read_injections(sorted((ws / "memory" / "sessions").glob("*.log")))
    assert log.problems == []
    logged = {e.session_id: e for e in log.events}
    assert len(logged) == len(log.events)  # one event at most per case
    mismatches, kinds = [], Counter()
    for i, (case, text) in enumerate(zip(cases, texts, strict=True)):
        root = case.get("policy_root") if case["root"] is None and case.get("policy_root") else case["root"]
        mine = sk.injection(None if root is None else Path(root), case["role"], case["task"], case["err"], case["cap"])
        event = logged.get(f"case-{i}")
        theirs = None if event is None else _payload(event)
        if mine.text != text or mine.payload != theirs:
            mismatches.append((case, mine.payload, theirs))
        kinds.update({"injected": bool(mine.skills), "per_skill_cut": any(s.cut and s.chars == sk.PER_SKILL_CAP
                                                                            for s in mine.skills),
                      "total_cut": bool(mine.dropped) or any(0 < s.chars < sk.PER_SKILL_CAP and s.cut
                                                             for s in mine.skills),
                      "blank_skipped": bool(mine.skipped_blank), "nothing": not mine.skills})
    assert mismatches == [], f"{len(mismatches)} of {len(cases)} differ; first: {mismatches[:2]}"
    # the grid reached every behaviour it is meant to test
    assert all(kinds[k] > 50 for k in ("injected", "per_skill_cut", "total_cut", "blank_skipped", "nothing")), kinds
    assert len(cases) > 3000 and len(log.events) == kinds["injected"]
    # SAGE's packaged tree (SAGE_SKILLS_ROOT unset) is the project's shipped copy: same texts, same shas
    assert texts[0] == sk.injection(None, cases[0]["role"], "", "").text


def test_sage_run_logs_the_live_versions_shas_before_and_after_a_commit(sage_python, tmp_path):
    """The issue's done-when: SAGE's unchanged `sage run` in the model world, SAGE_SKILLS_ROOT at the project's
    live version, logs SKILL_INJECTION shas equal to it; after a commit that appends a line to one skill, the
    next day's runs log that skill's new sha and the others' old ones."""
    from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, run_day
    from sage_pipeline.sage_world.server import WorldServer
    from sage_pipeline.sage_world.world import WorldConfig, build_world

    tdd = "discipline/test-driven-development/SKILL.md"
    install = SageInstall.find(sage_python)
    world = build_world(install.models_yaml, n_tasks=24, task_seed=1, config=WorldConfig(clock_scale=0.0))
    store = SageSkillsRoot(tmp_path / "skills")
    days = []
    with WorldServer(world) as srv:
        for day in (1, 2):
            if day == 2:
                edited = store.text("live", tdd) + "\n- Run the whole test file before you say the task is done.\n"
                store.commit({tdd: edited}, "night 1: accepted")
            live, shas = store.live_path(), store.shas()
            res = run_day(world, srv.url, install, day, [t.task_id for t in world.tasks[:2]], tmp_path / f"day{day}",
                          HarnessConfig(workers=2), skills_root=live)
            assert res.finished == 2, res.failures
            log = journal_injections(res.sessions_dirs)
            assert log.problems == [] and log.events
            days.append((shas, log.events))
            for e in log.events:  # every skill SAGE injected, in every call, is the live version's
                assert e.shas == {s: shas[s] for s in e.skill_ids}, (day, e)
                assert all(n == len(store.text("live", s)) for s, n in zip(e.skill_ids, e.per_skill_chars))
            roles = Counter(e.agent_role for e in log.events)
            assert roles["coder"] >= 2 and roles["reviewer"] >= 2 and roles["planner"] >= 2, roles
    (before, first), (after, second) = days
    assert after[tdd] != before[tdd] and {s: h for s, h in after.items() if s != tdd} == \
        {s: h for s, h in before.items() if s != tdd}
    assert {e.shas[tdd] for e in first if tdd in e.shas} == {before[tdd]}
    assert {e.shas[tdd] for e in second if tdd in e.shas} == {after[tdd]}
    others = {(s, h) for e in second for s, h in e.shas.items() if s != tdd}
    assert others and all(before[s] == h for s, h in others)
    assert "workflow/tdd-workflow/SKILL.md" not in {s for _, evs in days for e in evs for s in e.skill_ids}
