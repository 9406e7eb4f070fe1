"""The project's SAGE skills root: whole trees versioned by content, one live, switched by one rename; edits
SAGE would not inject as written refused; per-skill diff and rollback; damaged files named; the version
folder is what a deployment bundle carries to SAGE_SKILLS_ROOT."""

from __future__ import annotations

import gzip
import json
import threading

import pytest

from sage_pipeline.sage import bundle as bd, skills as sk
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import SAGE_TABLE, RoutingTable
from sage_pipeline.sleep import sage_skills as ss
from sage_pipeline.sleep.sage_skills import SageSkillsConfig, SageSkillsRoot, SkillsRootChanged, SkillsRootError

TDD = "discipline/test-driven-development/SKILL.md"
SD = "discipline/systematic-debugging/SKILL.md"
DOCS = "workflow/documentation-lookup/SKILL.md"


@pytest.fixture()
def root(tmp_path) -> SageSkillsRoot:
    return SageSkillsRoot(tmp_path / "skills")


def _appended(root: SageSkillsRoot, skill: str, line: str = "- Run the whole suite before you say done.") -> str:
    return root.text("live", skill) + "\n" + line + "\n"


def _tree(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_new_root_is_sages_tree_as_shipped_with_its_licence(root):
    (entry,) = root.versions()
    assert entry.action == "initial" and entry.seq == 1 and root.live() == entry.version
    live = root.live_path()
    assert live == root.folder / "versions" / entry.version
    assert {k: v for k, v in _tree(live).items() if k.endswith("SKILL.md")} == _tree(sk.SKILL_TREE)
    assert (live / "LICENSE").read_bytes() == (sk.SKILL_TREE.parent / "LICENSE").read_bytes()
    assert "MIT" in (live / "NOTICE").read_text()
    assert entry.version == ss.version_id({s: (sk.SKILL_TREE / s).read_bytes() for s in sk.SKILL_IDS})
    # the shas SAGE logs when it injects the shipped tree
    assert root.shas() == {s: sk.sha16(sk.read_skill(sk.SKILL_TREE / s)) for s in sk.INJECTED_IDS}
    assert json.loads((root.folder / "live.json").read_text())["path"] == f"versions/{entry.version}"
    again = SageSkillsRoot(root.folder)  # opening it again changes nothing
    assert again.versions() == [entry]


def test_a_commit_makes_a_new_whole_version_live_and_leaves_the_old_one_as_it_was(root):
    v1, old = root.live(), _tree(root.live_path())
    e = root.commit({TDD: _appended(root, TDD)}, "night 1: run the suite")
    assert (e.seq, e.action, e.parent, e.changed, e.reason) == (2, "commit", v1, (TDD,), "night 1: run the suite")
    assert root.live() == e.version != v1 and root.live_path().name == e.version
    assert _tree(root.folder / "versions" / v1) == old  # a version is never rewritten
    assert root.sha16(e.version, TDD) != root.sha16(v1, TDD)
    assert {s: h for s, h in root.shas().items() if s != TDD} == {s: h for s, h in root.shas(v1).items() if s != TDD}
    # the sha is what SAGE's injector logs for the coder from the live folder
    inj = sk.injection(root.live_path(), "coder", "add a test")
    assert inj.shas[TDD] == root.sha16("live", TDD) and not inj.truncated
    (d,) = root.diff("v1", "v2").items()
    assert d[0] == TDD and "+- Run the whole suite before you say done." in d[1]
    assert root.diff("v1", "v1") == {}
    assert root.commit({TDD: root.text("live", TDD)}, "unchanged") == e  # a no-op
    assert len(root.versions()) == 2
    assert root.find("v2") == root.find(e.version[:6]) == root.find("live") == e.version
    assert root.sha_index()[TDD] == {root.sha16(v1, TDD): [v1], root.sha16(e.version, TDD): [e.version]}


def test_rollback_restores_one_skill_in_a_new_version(root):
    v1 = root.live()
    root.commit({TDD: _appended(root, TDD), SD: _appended(root, SD)}, "two edits")
    r = root.rollback(TDD, "v1")
    assert r.action == "rollback" and r.changed == (TDD,) and r.seq == 3
    assert root.text("live", TDD) == root.text(v1, TDD) and root.text("live", SD) == root.text("v2", SD)
    assert root.rollback(TDD, "v1") == r  # already so: a no-op
    both = root.rollback(SD, v1)  # every skill back: the tree of v1, its folder reused
    assert both.version == v1 and both.seq == 4


@pytest.mark.parametrize("edits, message", [
    ({TDD: "x" * 3210}, r"discipline/test-driven-development/SKILL.md: 3210 characters .*10 over"),
    ({"discipline/nope/SKILL.md": "x"}, "not one of SAGE's skills"),
    ({"workflow/tdd-workflow/SKILL.md": "x"}, "SAGE never reads this file"),
    ({SD: "   "}, "blank"),
])
def test_edits_sage_would_not_inject_as_written_are_refused_and_nothing_is_written(root, edits, message):
    before = (root.folder / "history.jsonl").read_bytes(), (root.folder / "live.json").read_bytes()
    with pytest.raises(sk.SkillsError, match=message):
        root.commit(edits, "bad")
    assert ((root.folder / "history.jsonl").read_bytes(), (root.folder / "live.json").read_bytes()) == before
    assert len(list((root.folder / "versions").iterdir())) == 1


def test_an_edit_the_total_cap_would_cut_is_refused_naming_the_role(tmp_path):
    root = SageSkillsRoot(tmp_path / "skills", SageSkillsConfig(total_cap=7000))
    # the coder with an error keyword gets TDD, VBC, SD, prompt-optimizer and documentation-lookup: 6.8k as shipped
    with pytest.raises(sk.SkillsError, match=r"total cap of 7000 .* from the coder's prompt"):
        root.commit({TDD: _appended(root, TDD, "y" * 600)}, "long")
    assert len(root.versions()) == 1
    SageSkillsRoot(tmp_path / "skills", SageSkillsConfig(total_cap=7000, check_total_cap=False)).commit(
        {TDD: _appended(root, TDD, "y" * 600)}, "allowed")
    assert sk.injection(root.live_path(), "coder", "", "traceback", 7000).truncated  # SAGE does cut it


def test_a_change_from_a_version_that_is_no_longer_live_is_refused(root):
    v1 = root.live()
    root.commit({TDD: _appended(root, TDD)}, "first", parent=v1)
    with pytest.raises(SkillsRootChanged, match=f"live version is {root.live()}, not {v1}"):
        root.commit({SD: _appended(root, SD)}, "second", parent=v1)


def test_readers_during_commits_always_see_one_whole_version(root):
    """What SAGE_SKILLS_ROOT names (live_path) is a folder whose files hash to its id, before, during and after
    any number of switches: a run started at any moment injects one version."""
    seen, errors, stop = [], [], threading.Event()

    def read():
        while not stop.is_set():
            try:
                p = root.live_path()
                files = {s: (p / s).read_bytes() for s in sk.SKILL_IDS}
                assert ss.version_id(files) == p.name
                seen.append(p.name)
            except Exception as e:  # noqa: BLE001 - any failure is the test's
                errors.append(e)

    readers = [threading.Thread(target=read) for _ in range(2)]
    for t in readers:
        t.start()
    for i in range(8):
        root.commit({TDD: _appended(root, TDD, f"- rule {i}")}, f"edit {i}")
    stop.set()
    for t in readers:
        t.join()
    assert errors == [] and len(set(seen)) >= 2 and len(root.versions()) == 9


def test_damaged_history_and_pointer_are_named_by_file_line_and_field(root):
    root.commit({TDD: _appended(root, TDD)}, "one")
    hist = root.folder / "history.jsonl"
    good = hist.read_text()
    lines = good.splitlines()
    hist.write_text(lines[0] + "\n" + lines[1].replace('"action": "commit"', '"action": "merge"') + "\n")
    with pytest.raises(SkillsRootError, match=rf"{hist}:2: field 'action' is 'merge'"):
        root.commit({SD: _appended(root, SD)}, "two")
    hist.write_text(lines[0] + "\n" + lines[1].replace('"seq": 2', '"seq": 5') + "\n")
    with pytest.raises(SkillsRootError, match=rf"{hist}:2: field 'seq' is 5, expected 2"):
        root.versions()
    hist.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(SkillsRootError, match=rf"{hist}:2: not JSON"):
        root.versions()
    hist.write_text(good)
    live = root.folder / "live.json"
    live.write_text(json.dumps({"format": 1, "version": "nothex", "seq": 2}))
    with pytest.raises(SkillsRootError, match=rf"{live}: field 'version' is \"nothex\""):
        root.live_path()
    live.write_text("{")
    with pytest.raises(SkillsRootError, match=rf"{live}: not a JSON object"):
        root.live()
    live.unlink()
    assert "was missing" in root.recover() and root.live() == root.versions()[-1].version


def test_a_switch_cut_short_between_history_and_pointer_is_finished(root):
    v1 = root.live()
    root.commit({TDD: _appended(root, TDD)}, "one")
    v2 = root.live()
    pointer = json.loads((root.folder / "live.json").read_text())
    (root.folder / "live.json").write_text(json.dumps({**pointer, "version": v1, "seq": 1}))  # killed before it
    assert root.live() == v1
    assert "finished the switch" in root.recover() and root.live() == v2
    assert root.recover() == ""


def test_an_edited_version_folder_is_refused(root):
    (root.live_path() / TDD).write_text("edited in place")
    with pytest.raises(SkillsRootError, match="hash to .* not to its id .*never changed in place"):
        root.live_path()


def test_unknown_refs_and_skills_are_named(root):
    with pytest.raises(SkillsRootError, match="'v9' is not a version of this root"):
        root.find("v9")
    with pytest.raises(SkillsRootError, match="not one of SAGE's skills"):
        root.sha16("live", "discipline/x/SKILL.md")
    with pytest.raises(SkillsRootError, match="never reads this file"):
        root.sha16("live", "workflow/tdd-workflow/SKILL.md")


def test_a_bundle_of_the_live_version_deploys_sage_skills_root_with_the_stores_shas(root, tmp_path):
    table = RoutingTable.load(SAGE_TABLE)
    deployed = []
    for night in range(2):
        if night:
            root.commit({TDD: _appended(root, TDD)}, "night 1")
        b = bd.build(tmp_path / f"bundle{night}", table, table, objective=TaskObjective(), skills=root.live_path())
        line = bd.deploy(b, tmp_path / "deploy", target=table)
        env = bd.read_env_file(tmp_path / "deploy" / bd.ENV_FILE)
        folder = env["SAGE_SKILLS_ROOT"]
        assert folder == line["env"]["SAGE_SKILLS_ROOT"] and f"versions/{b.id}/skills" in folder
        got = {s: sk.sha16(t) for s, t in sk.root_texts(folder).items() if s in sk.INJECTED_IDS}
        assert got == root.shas()
        deployed.append((folder, got))
    (f0, s0), (f1, s1) = deployed
    assert s1[TDD] != s0[TDD] and {k: v for k, v in s1.items() if k != TDD} == {k: v for k, v in s0.items() if k != TDD}
    assert {s: sk.sha16(t) for s, t in sk.root_texts(f0).items() if s in sk.INJECTED_IDS} == s0  # old one unchanged


def test_journal_injections_reads_a_sessions_folder_in_sages_order(root, tmp_path):
    inj = sk.injection(root.live_path(), "debugger")
    line = json.dumps({"type": "SKILL_INJECTION", "timestamp": "t", **inj.payload})
    sessions = tmp_path / "ws" / "memory" / "sessions"
    sessions.mkdir(parents=True)
    (sessions / "2026-11-20.log").write_text("[TOKEN_SUMMARY] total_tokens=1 prompt=1 completion=0 calls=1\n"
                                             + line + "\n")
    (sessions / "2026-11-20.1.log").write_text(line + "\n")  # rotated: written before 2026-11-20.log
    with gzip.open(sessions / "2026-11-19.log.gz", "wt") as fh:
        fh.write(line + "\n")
    log = ss.journal_injections([tmp_path / "ws"])
    assert [(e.source.rsplit("/", 1)[-1], e.line) for e in log.events] == [
        ("2026-11-19.log.gz", 1), ("2026-11-20.1.log", 1), ("2026-11-20.log", 2)]
    assert all(e.shas == {s: root.sha16("live", s) for s in e.skill_ids} for e in log.events)
    assert ss.journal_injections([tmp_path / "ws" / "memory" / "sessions" / ".."]).lines == 4


# ---------------------------------------------------------------------------------------------- staged versions
def _files_state(root: SageSkillsRoot) -> tuple[bytes, bytes]:
    return (root.folder / "live.json").read_bytes(), (root.folder / "history.jsonl").read_bytes()


def test_a_staged_version_is_a_version_to_read_but_never_made_live(root):
    v1, before = root.live(), _files_state(root)
    e = root.stage({TDD: _appended(root, TDD)}, "the ledger's cand arm")
    assert (e.seq, e.action, e.parent, e.changed, e.reason) == (0, "staged", v1, (TDD,), "the ledger's cand arm")
    assert _files_state(root) == before and root.live() == v1 and len(root.versions()) == 1  # nothing made live
    folder = root.versions_dir / e.version
    assert ss.version_id({s: (folder / s).read_bytes() for s in sk.SKILL_IDS}) == e.version  # whole, by its id
    assert (folder / "LICENSE").is_file() and (folder / "NOTICE").is_file()
    assert root.staged() == [e] and root.staged_skipped == []
    # readable by id and by prefix, as any version
    assert root.find(e.version) == root.find(e.version[:5]) == e.version
    assert root.text(e.version[:6], TDD) == _appended(root, TDD) and root.text(e.version, SD) == root.text(v1, SD)
    assert root.sha16(e.version, TDD) != root.sha16(v1, TDD)
    # what SAGE logs when a candidate arm's run points SAGE_SKILLS_ROOT at the folder maps to the staged version
    inj = sk.injection(folder, "coder", "add a test")
    assert inj.shas[TDD] == root.shas(e.version)[TDD]
    index = root.sha_index()
    assert index[TDD] == {root.sha16(v1, TDD): [v1], root.sha16(e.version, TDD): [e.version]}
    assert index[SD] == {root.sha16(v1, SD): [v1, e.version]}
    assert root.diff("live", e.version[:6]).keys() == {TDD}
    with pytest.raises(SkillsRootError, match=r"'v2' is not a version of this root .*1 staged, latest"):
        root.find("v2")  # v<seq> names only versions made live


def test_staging_the_same_edits_twice_gives_one_version_and_one_line(root):
    edits = {TDD: _appended(root, TDD), SD: _appended(root, SD)}
    e = root.stage(edits, "first")
    folder = root.versions_dir / e.version
    mtime, lines = folder.stat().st_mtime_ns, (root.folder / ss.STAGED_FILE).read_bytes()
    assert root.stage(dict(reversed(edits.items())), "again") == e  # the same tree: its entry, nothing written
    assert folder.stat().st_mtime_ns == mtime and (root.folder / ss.STAGED_FILE).read_bytes() == lines
    assert len(lines.splitlines()) == 1 and len(root.staged()) == 1
    assert sorted(p.name for p in root.versions_dir.iterdir()) == sorted([root.live(), e.version])
    # no change from the base: the base's entry (here the live history line), no line, no folder
    assert root.stage({TDD: root.text("live", TDD)}, "unchanged") == root.versions()[-1]
    assert (root.folder / ss.STAGED_FILE).read_bytes() == lines


def test_a_staged_version_can_be_staged_from_made_live_and_stays_readable(root):
    v1 = root.live()
    a = root.stage({TDD: _appended(root, TDD)}, "arm a")
    b = root.stage({SD: _appended(root, SD)}, "arm b on a", base=a.version[:6])
    assert b.parent == a.version and b.changed == (SD,)
    assert root.text(b.version, TDD) == root.text(a.version, TDD) != root.text(v1, TDD)
    before = (root.versions_dir / a.version / TDD).read_bytes()
    c = root.commit({TDD: root.text(a.version, TDD)}, "the ledger accepted arm a")  # the same tree goes live
    assert c.version == a.version and root.live() == a.version
    assert (root.versions_dir / a.version / TDD).read_bytes() == before  # verified, never rewritten
    assert [s.version for s in root.staged()] == [a.version, b.version]
    # made live first (listed once, as a version of the history), then b, staged with a's text of TDD
    assert root.sha_index()[TDD][root.sha16(a.version, TDD)] == [a.version, b.version]
    with pytest.raises(SkillsRootError, match="'ffffffffffff' is not a version"):
        root.stage({SD: _appended(root, SD)}, "unknown base", base="ffffffffffff")


def test_an_edit_the_total_cap_would_cut_is_refused_at_stage_too(tmp_path):
    root = SageSkillsRoot(tmp_path / "skills", SageSkillsConfig(total_cap=7000))
    before = _files_state(root)
    with pytest.raises(sk.SkillsError, match=r"total cap of 7000 .* from the coder's prompt"):
        root.stage({TDD: _appended(root, TDD, "y" * 600)}, "long")
    assert _files_state(root) == before and not (root.folder / ss.STAGED_FILE).exists()
    assert len(list(root.versions_dir.iterdir())) == 1


def test_a_damaged_staged_line_is_named_and_skipped_never_a_crash(root):
    a = root.stage({TDD: _appended(root, TDD)}, "arm a")
    b = root.stage({SD: _appended(root, SD)}, "arm b")
    f = root.folder / ss.STAGED_FILE
    good = f.read_text().splitlines()
    f.write_text("\n".join([good[0], "{not json", json.dumps({"version": "nothex", "base": a.version,
                                                              "created_at": "t"}),
                            json.loads(json.dumps(good[1])).replace('"reason"', '"why"'), good[0], ""]))
    assert root.staged() == [a]
    skipped = root.staged_skipped
    assert len(skipped) == 4
    assert skipped[0].startswith(f"{f}:2: not JSON") and "skipped" in skipped[0]
    assert skipped[1].startswith(f"{f}:3: field 'version' is 'nothex'")
    assert skipped[2].startswith(f"{f}:4: field 'why' is unknown")
    assert skipped[3].startswith(f"{f}:5: version {a.version} is staged already")
    # the rest of the root works: a is found, b is not (until staged again), the index has a
    assert root.find(a.version[:6]) == a.version
    with pytest.raises(SkillsRootError, match="is not a version of this root"):
        root.find(b.version)
    assert a.version in root.sha_index()[TDD][root.sha16(a.version, TDD)]
    again = root.stage({SD: _appended(root, SD)}, "arm b again")
    assert again.version == b.version and [s.version for s in root.staged()] == [a.version, b.version]
    # a staged version whose folder was damaged is left out of the index, named
    (root.versions_dir / a.version / TDD).write_text("edited in place")
    index = root.sha_index()
    assert all(a.version not in vs for by in index.values() for vs in by.values())
    assert any("hash to" in s and f"staged version {a.version} is left out" in s for s in root.staged_skipped)
