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
