"""The ledger's state machine: a monkey test (random operations against the documented transitions),
evidence carried across nights, the refusals, a kill at any point leaving one whole ledger, and a
ledger of the wrong shape named by file and field."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sage_pipeline.decisions import evidence as ev
from sage_pipeline.decisions.ledger import LEVERS, TRANSITIONS, Ledger, LedgerConfig, LedgerError

STATES = tuple(TRANSITIONS)


def test_monkey_every_transition_is_allowed_only_as_documented(tmp_path):
    rng = np.random.default_rng(7)
    led = Ledger.load(tmp_path / "ledger.json")
    unit = 0
    for step in range(600):
        op = rng.choice(["propose", "transition", "evidence", "decide", "save"], p=[0.2, 0.35, 0.25, 0.15, 0.05])
        cands = led.data.candidates
        if op == "propose" or not cands:
            lever = str(rng.choice(LEVERS))
            key = f"k{int(rng.integers(12))}"
            before = led.find(lever, key)
            c, new = led.propose(lever, key, night=f"n{step}")
            assert new == (before is None)
            if before is not None:
                assert c is before  # the same key continues the same candidate
            continue
        c = cands[int(rng.integers(len(cands)))]
        if op == "transition":
            to = str(rng.choice(STATES))
            if to in TRANSITIONS[c.state]:
                old = c.state
                led.transition(c.id, to, night=f"n{step}", reason="monkey")
                assert c.state == to and c.history[-1].state == to
                assert old != to
            else:
                state = c.state
                with pytest.raises(LedgerError, match="cannot become"):
                    led.transition(c.id, to, night=f"n{step}", reason="monkey")
                assert c.state == state
        elif op == "evidence":
            n = int(rng.integers(1, 5))
            units = [f"u{unit + i}" for i in range(n)]
            unit += n
            x = rng.uniform(-1, 1, n)
            if c.state in ("reverted", "dropped"):
                with pytest.raises(LedgerError, match="takes no more evidence"):
                    led.add_evidence(c.id, "replay", x, -1, 1, units)
            else:
                assert led.add_evidence(c.id, "replay", x, -1, 1, units) == n
        elif op == "decide":
            state = c.state
            new = led.decide(c.id, f"n{step}")
            assert new is None or new in TRANSITIONS[state]
        else:
            led.save()
            again = Ledger.load(led.path)
            assert again.data.model_dump() == led.data.model_dump()
    # every candidate's history is a walk along the documented edges
    for c in led.data.candidates:
        states = [t.state for t in c.history]
        assert states[0] == "pending"
        for a, b in zip(states, states[1:]):
            assert b in TRANSITIONS[a]


def test_the_same_rule_proposed_again_carries_its_evidence_and_indices_spend_the_level(tmp_path):
    led = Ledger.load(tmp_path / "l.json")
    a, new_a = led.propose("skills", "coder::write tests first", night="d1", selected_on=["t1"])
    b, _ = led.propose("skills", "coder::another", night="d1")
    assert new_a and a.index == 1 and b.index == 2
    assert a.alpha == pytest.approx(0.05 / 2) and b.alpha == pytest.approx(0.05 / 6)
    led.add_evidence(a.id, "replay", [0.3, 0.2], -1, 1, ["d1/t2", "d1/t3"])
    led.decide(a.id, "d1")
    again, new = led.propose("skills", "coder::write tests first", night="d2", selected_on=["t9"])
    assert again is a and not new and a.index == 1
    led.add_evidence(a.id, "replay", [0.3], -1, 1, ["d2/t4"])
    assert led.standing(a.id)["n"] == 3
    with pytest.raises(LedgerError, match="selected on"):
        led.add_evidence(a.id, "replay", [0.1], -1, 1, ["t9"])
    with pytest.raises(LedgerError, match="already counted"):
        led.add_evidence(a.id, "replay", [0.1], -1, 1, ["d2/t4"])
    with pytest.raises(LedgerError, match="unknown lever"):
        led.propose("prompts", "x", night="d2")


def test_a_real_gain_is_accepted_then_reverted_when_it_turns_and_a_useless_one_dropped(tmp_path):
    rng = np.random.default_rng(2)
    led = Ledger.load(tmp_path / "l.json", LedgerConfig(max_pending_nights=60))
    good, _ = led.propose("skills", "good", night="n0")
    useless, _ = led.propose("skills", "useless", night="n0")
    states = {}
    for night in range(1, 41):
        gain = 0.15 if night <= 15 else -0.15
        for c, g in ((good, gain), (useless, 0.0)):
            if c.state in ("reverted", "dropped"):
                continue
            a = (rng.random((25, 16)) < 0.6 + g).mean(1)
            b = (rng.random((25, 16)) < 0.6).mean(1)
            x, lo, hi = ev.paired_difference(a, b)
            led.add_evidence(c.id, "replay", x, lo, hi, [f"n{night}/t{i}" for i in range(25)])
            new = led.decide(c.id, f"n{night}")
            if new:
                states.setdefault(c.key, []).append((night, new))
    assert states["good"][0][1] == "accepted" and states["good"][0][0] <= 5
    assert states["good"][1][1] == "reverted" and 15 < states["good"][1][0] <= 22
    assert [s for _, s in states["useless"]] == ["dropped"]
    rows = {r["key"]: r for r in led.summary()}
    assert rows["good"]["state"] == "reverted" and "excluded" in rows["good"]["why"]
    assert "minimum useful gain" in rows["useless"]["why"]


def test_a_ledger_of_the_wrong_shape_names_the_file_and_field(tmp_path):
    p = tmp_path / "ledger.json"
    led = Ledger.load(p)
    led.propose("coder", "pin qwen", night="n1")
    led.save()
    raw = json.loads(p.read_text())
    raw["candidates"][0]["state"] = "promoted"
    p.write_text(json.dumps(raw))
    with pytest.raises(LedgerError, match=r"ledger\.json: field 'candidates\.0\.state'"):
        Ledger.load(p)
    p.write_text("[1, 2")
    with pytest.raises(LedgerError, match="not a readable ledger"):
        Ledger.load(p)


_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from sage_pipeline.decisions.ledger import Ledger
    path = sys.argv[1]
    rng = np.random.default_rng(int(sys.argv[2]))
    i = 0
    while True:
        led = Ledger.load(path)
        c, _ = led.propose("skills", f"k{i % 7}", night=f"n{i}")
        if c.state == "pending":
            units = [f"{sys.argv[2]}/{i}/{j}" for j in range(20)]
            led.add_evidence(c.id, "replay", rng.uniform(-1, 1, 20), -1, 1, units)
            led.decide(c.id, f"n{i}")
        led.save()
        print(led.data.seq, flush=True)
        i += 1
""")


def test_a_kill_at_any_point_leaves_one_whole_ledger(tmp_path):
    """SIGKILL a writer that loads, changes and saves in a loop, at a different moment each round;
    whenever it died, the ledger on disk loads whole and its sequence number never goes back."""
    path = tmp_path / "ledger.json"
    last = 0
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    for round_ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(round_)], stdout=subprocess.PIPE,
                                text=True, env=env)
        # wait for (3 + round) whole saves, then kill while it is mid-way through the next ones
        for _ in range(3 + round_):
            line = proc.stdout.readline()
            assert line, "the writer died on its own"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
        led = Ledger.load(path)  # whole: a kill between temp file and rename leaves the old one
        assert led.data.seq >= last + 3
        last = led.data.seq
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != "ledger.json"]
        assert all(n.startswith(".") for n in leftovers)  # only the atomic writer's temp names, swept later


def test_the_coder_spends_its_level_geometrically_and_bets_the_mixture(tmp_path):
    """The coder's candidates at alpha 0.9 (0.1)^(j-1) (the other levers at alpha / (j (j + 1))), summing to at
    most alpha over any number of rounds; its pending streams are mixtures, its probation streams the plug-in."""
    cfg = LedgerConfig()
    levels = [cfg.alpha_for(j, "coder") for j in range(1, 200)]
    assert levels[0] == pytest.approx(0.045) and levels[1] == pytest.approx(0.0045)
    assert sum(levels) <= cfg.alpha + 1e-15
    assert sum(cfg.alpha_for(j, "skills") for j in range(1, 10_000)) <= cfg.alpha
    with pytest.raises(LedgerError, match="indices start at 1"):
        cfg.alpha_for(0, "coder")
    with pytest.raises(ValueError, match="first_share"):
        LedgerConfig(first_share={"coder": 1.5})
    with pytest.raises(ValueError):
        LedgerConfig(first_share={"prompts": 0.5})
    led = Ledger.load(tmp_path / "l.json")
    c, _ = led.propose("coder", "pin coder to B (round 1)", night="n1")
    s, _ = led.propose("skills", "rule", night="n1")
    assert c.alpha == pytest.approx(0.045) and s.alpha == pytest.approx(0.025)
    led.add_evidence(c.id, "online", [0.5] * 40, -1.9, 1.9, [f"r{i}" for i in range(40)])
    led.add_evidence(s.id, "replay", [0.1, 0.2], -1, 1, ["t1", "t2"])
    led.add_evidence(s.id, "online", [0.4, -0.3], -2.0, 2.0, ["s1", "s2"])
    assert led.stream(c, "streams", "online").components() == len(cfg.coder_evidence.mixture_gaps)
    assert led.stream(s, "streams", "replay").components() == 0  # the skills replays: the plug-in
    assert led.stream(s, "streams", "online").components() == len(cfg.online_evidence.mixture_gaps)
    assert led.decide(c.id, "n1") == "accepted"
    led.add_evidence(c.id, "online", [0.1], -1.9, 1.9, ["r40"])
    assert led.stream(c, "probation", "online").components() == 0
    led.save()
    again = Ledger.load(led.path)
    assert again.data.schema_version == 4 and again.standing(c.id)["n"] == 41
    assert again.data.model_dump() == led.data.model_dump()


def test_a_version_1_ledger_is_read_with_the_rule_it_was_written_under(tmp_path):
    """A ledger written before the mixture and the geometric levels (schema 1): its coder candidates keep their
    plug-in streams and alpha / (j (j + 1)), it goes on taking evidence, and it is written back as version 4."""
    p = tmp_path / "ledger.json"
    led = Ledger.load(p)
    c, _ = led.propose("coder", "pin coder to B (round 1)", night="n1")
    led.add_evidence(c.id, "online", [0.2, -0.1], -1.9, 1.9, ["r1", "r2"])
    led.save()
    raw = json.loads(p.read_text())
    # what version 1 wrote: no coder_evidence, no first_share, the coder's stream without components
    raw["schema_version"] = 1
    del raw["config"]["coder_evidence"], raw["config"]["first_share"]
    for k in ("comp_plus", "comp_minus"):
        del raw["candidates"][0]["streams"]["online"][k]
    raw["candidates"][0]["alpha"] = 0.025
    p.write_text(json.dumps(raw))
    old = Ledger.load(p)
    assert old.config.coder_evidence.bet == "plug_in" and old.config.first_share == {}
    assert old.config.alpha_for(1, "coder") == pytest.approx(0.025)
    c = old.get(c.id)
    old.add_evidence(c.id, "online", [0.3], -1.9, 1.9, ["r3"])
    assert old.stream(c, "streams", "online").components() == 0 and old.standing(c.id)["n"] == 3
    d, _ = old.propose("coder", "pin coder to A (round 1)", night="n2")
    assert d.alpha == pytest.approx(0.05 / 6)
    old.save()
    assert json.loads(p.read_text())["schema_version"] == 4
    raw["schema_version"] = 5
    p.write_text(json.dumps(raw))
    with pytest.raises(LedgerError, match=r"ledger\.json: field 'schema_version'"):
        Ledger.load(p)


def test_a_version_3_ledger_goes_on_betting_its_skills_runs_as_it_started(tmp_path):
    """A ledger written before online_evidence (schema 3): a pending skills candidate's randomised-run stream was
    started with the plug-in and goes on with it (a stream keeps the bets it started with); a candidate proposed
    after the upgrade bets the same ledger config, and the file is written back as version 4."""
    p = tmp_path / "ledger.json"
    led = Ledger.load(p)
    s, _ = led.propose("skills", "rule", night="n1")
    led.add_evidence(s.id, "online", [0.4, -0.3], -2.0, 2.0, ["r1", "r2"])
    led.save()
    raw = json.loads(p.read_text())
    raw["schema_version"] = 3
    del raw["config"]["online_evidence"]
    for k in ("comp_plus", "comp_minus"):  # the plug-in stream version 3 wrote
        del raw["candidates"][0]["streams"]["online"][k]
    p.write_text(json.dumps(raw))
    old = Ledger.load(p)
    assert old.config.online_evidence == old.config.evidence and old.config.online_evidence.bet == "plug_in"
    old.add_evidence(s.id, "online", [0.5], -2.0, 2.0, ["r3"])
    assert old.stream(old.get(s.id), "streams", "online").components() == 0 and old.standing(s.id)["n"] == 3
    t, _ = old.propose("skills", "another rule", night="n2")
    old.add_evidence(t.id, "online", [0.2], -2.0, 2.0, ["r4"])
    assert old.stream(t, "streams", "online").components() == 0  # the ledger's own rule, not today's default
    old.save()
    assert json.loads(p.read_text())["schema_version"] == 4
    assert Ledger.load(p).config.online_evidence.bet == "plug_in"


def test_a_large_selected_on_is_an_id_set_beside_the_ledger_and_stays_checkable(tmp_path):
    """What the router's candidates are selected on (thousands of episodes) is kept as a count and a sha256 in the
    ledger and the ids in ids/<sha256>.txt, written once; it is still refused as evidence, survives a reload and
    a second proposal's union; a changed or missing file is named, never read as another set."""
    import hashlib

    from sage_pipeline.decisions.ledger import IDS_DIR

    p = tmp_path / "ledger.json"
    led = Ledger.load(p)
    eps = [f"s{i // 5}/task{i % 5:04d}" for i in range(18_000)]
    c, _ = led.propose("router", "a" * 64, night="n1", selected_on=eps, compact=True)
    assert c.selected_on == [] and c.selected_on_ids.count == 18_000
    led.save()
    text = "".join(f"{u}\n" for u in sorted(eps))
    f = tmp_path / IDS_DIR / f"{hashlib.sha256(text.encode()).hexdigest()}.txt"
    assert f.read_text() == text and c.selected_on_ids.sha256 == f.stem
    assert p.stat().st_size < 20_000  # the ledger holds the count and the hash, not 18,000 ids
    again = Ledger.load(p)
    back = again.get(c.id)
    with pytest.raises(LedgerError, match="selected on"):
        again.add_evidence(back.id, "exploring_logs", [0.1], -1, 1, [eps[123]])
    assert again.add_evidence(back.id, "exploring_logs", [0.1], -1, 1, ["s9999/task0000"]) == 1
    more, new = again.propose("router", "a" * 64, night="n2", selected_on=["s9999/task0001"], compact=True)
    assert not new and more.selected_on_ids.count == 18_001 and len(again.selected(more)) == 18_001
    again.save()
    assert len(list((tmp_path / IDS_DIR).iterdir())) == 2  # the first set is kept: the old record still names it
    # a ledger whose id file was changed, or lost, says which file and what to do
    third = Ledger.load(p)
    (tmp_path / IDS_DIR / f"{more.selected_on_ids.sha256}.txt").write_text("s1/task0000\n")
    with pytest.raises(LedgerError, match=r"ids/[0-9a-f]{64}\.txt: sha256 .* the file was changed"):
        third.selected(third.get(c.id))
    (tmp_path / IDS_DIR / f"{more.selected_on_ids.sha256}.txt").unlink()
    with pytest.raises(LedgerError, match="cannot be read"):
        Ledger.load(p).add_evidence(c.id, "exploring_logs", [0.1], -1, 1, ["s9999/task0005"])
    with pytest.raises(LedgerError, match="one line"):
        led.propose("router", "b" * 64, night="n3", selected_on=["bad\nid"], compact=True)
