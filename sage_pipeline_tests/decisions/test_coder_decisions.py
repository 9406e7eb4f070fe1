"""The coder lever of the ledger (decisions/coder.py): equal coder models are pinned in few months (a batch of
100 simulated months of 30 nights, vectorised, checked equal to the ledger's own path); a real +0.06 gap is
pinned; a pin is reverted when the world turns, and a new round pins the other model; a run without a recorded
draw is never evidence; a unit counted twice is refused; the plan runs 50/50, then the pin at 0.7 with 0.3 on
the other model, through pinned models.yaml files SAGE reads; each run's draw is recorded and reaches SAGE as its
own environment (the harness, with a stand-in `sage`)."""

from __future__ import annotations

import json
import math
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from sage_pipeline.decisions import assign, coder, evidence as ev
from sage_pipeline.decisions.ledger import Ledger, LedgerConfig, LedgerError
from sage_pipeline.sage.table import RoutingTable

A, B = "qwen2.5-coder:1.5b", "qwen2.5-coder:14b-instruct-q4_K_M"
GPU_S = 8.0  # GPU-seconds a task: the model world's are 7-17
PINS = {A: "/nowhere/a.yaml", B: "/nowhere/b.yaml"}
SHIPPED = Path(__file__).resolve().parents[2] / "sage_pipeline" / "sage" / "data" / "models.yaml"


def _record(plan: assign.Plan, arm: assign.Arm) -> dict:
    """A draw as assign.read_records gives it back."""
    return {"plan": plan.id, "at": None, "levers": {coder.LEVER: {"arm": arm.name, "probability": arm.probability,
                                                                   "candidate": arm.candidate}}}


def ledger_night(led: Ledger, n: int, u: np.ndarray, v: np.ndarray, p_verified: dict, prefix: str = "") -> list[dict]:
    """One night through the lever's own path: the plan from the ledger, one draw per run (``u`` its 32-bit
    uniforms), the verdict ``v < p_verified[arm's model]``, the runs as evidence, the night's decision."""
    plan = coder.plan(led, PINS)
    if plan is not None:
        draws, runs = {}, []
        for j in range(len(u)):
            arm = assign.draw(plan, {coder.LEVER: int(u[j])})[coder.LEVER]
            m = coder.model_of(led.get(arm.candidate))
            did = f"{prefix}d{n}-r{j}"
            draws[did] = _record(plan, arm)
            runs.append(coder.CoderRun(did, did, float(v[j] < p_verified[m]) - GPU_S / 3600, m))
        coder.add_runs(led, runs, draws, {plan.id: plan})
    return coder.decide_night(led, f"day-{n:02d}", models=[A, B])


def batch_months(U: np.ndarray, V: np.ndarray, pa: float, pb: float, cfg: LedgerConfig | None = None) -> dict:
    """The same rule for many months at once, until each month's first pin (``U``, ``V``: (months, nights, runs)):
    rows 0..M-1 are "pin A" (index 1), M..2M-1 "pin B" (index 2), one ``evidence.Stream`` over both; the centre
    the month's running mean; accept, drop (the e-process against "gain >= min_useful_gain" at 1/drop_alpha, or
    30 nights pending) as ``Ledger.decide`` (the first test checks the two agree). Returns per month the night
    of the first accept (0: none) and its model, and each candidate's drop night."""
    cfg = cfg or LedgerConfig()
    M, nights, N = U.shape
    nulls = cfg.nulls()
    bets = cfg.evidence_for(coder.LEVER)
    s = ev.Stream.start(nulls, 2 * M, bets.components())
    alpha = np.r_[np.full(M, cfg.alpha_for(1, coder.LEVER)), np.full(M, cfg.alpha_for(2, coder.LEVER))]
    state = np.zeros(2 * M, int)  # 0 pending, 1 accepted, 2 dropped
    dropped_at = np.zeros(2 * M, int)
    first, model = np.zeros(M, int), np.full(M, "", dtype=object)
    cs, cn = np.full(M, 0.5), np.ones(M)  # the contrast's centre: prior 0.5, weight 1
    thr = assign.thresholds([0.5, 0.5])[0]
    p = thr / assign.SCALE
    i0, i_min = ev.at(nulls, 0.0), ev.at(nulls, cfg.min_useful_gain)
    for n in range(nights):
        active = (first == 0) & ((state[:M] == 0) | (state[M:] == 0))
        for j in range(N):
            on_a = U[:, n, j] < thr
            verified = (V[:, n, j] < np.where(on_a, pa, pb)).astype(float)
            y, _ = coder.rescale(verified - GPU_S / 3600)
            x, lo, hi = ev.ipw_contrast(y, on_a, ~on_a, p, 1.0 - p, cs / cn)
            xb, _, _ = ev.ipw_contrast(y, ~on_a, on_a, p, 1.0 - p, cs / cn)
            valid = np.r_[active & (state[:M] == 0), active & (state[M:] == 0)]
            s.update(np.r_[x, xb], np.r_[lo, lo], np.r_[hi, hi], bets, valid)
            cs, cn = cs + np.where(active, y, 0.0), cn + active
        rows = np.r_[active, active] & (state == 0)
        evidence = np.exp(np.minimum(s.log_plus[:, i0], 700))
        drop_evidence = np.exp(np.minimum(s.log_minus[:, i_min], 700))  # against "gain >= min_useful_gain"
        acc = rows & (evidence >= 1.0 / alpha)
        drop = rows & ~acc & ((drop_evidence >= 1.0 / cfg.drop_alpha) | (n + 1 >= cfg.max_pending_nights))
        state[acc], state[drop] = 1, 2
        dropped_at[drop] = n + 1
        for k in np.flatnonzero(acc):
            mo = k % M
            if first[mo] == 0:
                first[mo], model[mo] = n + 1, A if k < M else B
    return {"first": first, "model": model, "dropped_at": dropped_at}


def _draws(seed: int, months: int, nights: int = 30, runs: int = 60) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, assign.SCALE, size=(months, nights, runs)), rng.random((months, nights, runs)))


def test_the_batch_decides_as_the_ledger_does():
    """The vectorised months below are the lever's rule: the same draws through the ledger's own path
    (plan, draw, add_runs, decide_night) give the same pin on the same night and the same drops."""
    U, V = _draws(11, 3, nights=12, runs=60)
    for pa, pb in ((0.93, 0.99), (0.95, 0.95)):
        batch = batch_months(U, V, pa, pb)
        for m in range(3):
            led = Ledger()
            coder.open_round(led, [A, B], "day-00")
            pin_night, pin_model, drops = 0, "", {}
            for n in range(1, 13):
                for t in ledger_night(led, n, U[m, n - 1], V[m, n - 1], {A: pa, B: pb}, prefix=f"m{m}"):
                    mo = coder.model_of(led.get(t["id"]))
                    if t["to"] == "accepted" and not pin_night:
                        pin_night, pin_model = n, mo
                    if t["to"] == "dropped" and not pin_night:
                        drops[mo] = n
                if pin_night:
                    break
            assert (pin_night, pin_model) == (batch["first"][m], batch["model"][m] or "")
            want = {mo: int(batch["dropped_at"][k]) for mo, k in ((A, m), (B, 3 + m)) if batch["dropped_at"][k]
                    and (not pin_night or batch["dropped_at"][k] < pin_night)}
            assert drops == want


def test_equal_coder_models_are_pinned_in_few_months():
    """100 months x 30 nights x 60 randomised runs, two equal models (0.93): pinned in under 10% of months
    (the ledger's bound over both candidates is alpha/2 + alpha/6 = 0.033); the per-night bootstrap it
    replaces pinned 28%."""
    U, V = _draws(2026, 100)
    res = batch_months(U, V, 0.93, 0.93)
    pinned = float(np.mean(res["first"] > 0))
    assert pinned < 0.1, f"equal models pinned in {pinned:.0%} of months"


def test_a_real_gap_is_pinned():
    """14B vs 1.5B as the world's truth says (+0.06 in verified share on a base of 0.93): the better model is
    pinned within the month in at least 80% of 40 months, and the worse one never."""
    U, V = _draws(7, 40)
    res = batch_months(U, V, 0.93, 0.99)
    assert np.all(res["model"][res["first"] > 0] == B)
    assert np.mean(res["first"] > 0) >= 0.8
    assert np.median(res["first"][res["first"] > 0]) <= 20
    assert np.mean((res["first"] > 0) & (res["first"] <= 14)) >= 0.7  # the worse model first: at alpha/6


def test_a_pin_is_reverted_when_the_world_turns_and_the_other_model_is_then_pinned(tmp_path):
    """The pinned 14B falls 0.15 below the 1.5B the night after its pin: the probation stream (0.1 of the runs
    on the 1.5B) reverts it, a new round opens that same night with the 1.5B first, and pins it. Saved and
    loaded every night: the evidence and the rounds survive the file."""
    path = tmp_path / "decisions" / "ledger.json"
    for seed in (0, 1, 2):
        rng = np.random.default_rng(seed)
        led = Ledger.load(path.with_name(f"ledger-{seed}.json"))
        coder.open_round(led, [A, B], "day-00")
        turn = None
        events = []
        for n in range(1, 46):
            pv = {A: 0.93, B: 0.99} if turn is None or n <= turn else {A: 0.93, B: 0.78}
            moves = ledger_night(led, n, rng.integers(0, assign.SCALE, 60), rng.random(60), pv)
            coder.save_merged(led)
            led = Ledger.load(led.path)
            for t in moves:
                events.append((n, coder.model_of(led.get(t["id"])), t["to"]))
                if t["to"] == "accepted" and turn is None:
                    turn = n
                    assert coder.plan(led, PINS).levers[coder.LEVER][0].probability == pytest.approx(0.7)
        pinned_b = next(n for n, m, to in events if to == "accepted" and m == B)
        reverted = next(n for n, m, to in events if to == "reverted")
        assert reverted - pinned_b <= 20
        new_round = [(m, to) for n, m, to in events if n == reverted and to == "pending"]
        assert new_round == [(A, "pending"), (B, "pending")]  # the model that was not pinned gets the larger level
        assert any(to == "accepted" and m == A and n > reverted for n, m, to in events)
        assert [c.index for c in led.of(coder.LEVER)] == [1, 2, 3, 4]


def _one_round():
    led = Ledger()
    a, b = coder.open_round(led, [A, B], "day-01")
    plan = coder.plan(led, PINS)
    arms = {x.candidate: x for x in plan.levers[coder.LEVER]}
    return led, a, b, plan, arms


def test_a_run_without_a_recorded_draw_is_not_evidence():
    led, a, b, plan, arms = _one_round()
    draws = {"d1": _record(plan, arms[a.id]), "d2": _record(plan, arms[b.id])}
    other = assign.make_plan({"skills": [("live", None, 1.0, {})]})
    draws["d3"] = {"plan": other.id, "at": None, "levers": {"skills": {"arm": "live", "probability": 1.0,
                                                                       "candidate": None}}}
    runs = [coder.CoderRun("s0", None, 1.0, A),  # SAGE's bandit chose: no draw
            coder.CoderRun("s9", "not-a-draw", 1.0, A),  # a trace id no draw has
            coder.CoderRun("s1", "d1", 1.0, A), coder.CoderRun("s2", "d2", None, B),  # no verdict known
            coder.CoderRun("s3", "d3", 1.0, A)]  # a draw without a coder arm
    out = coder.add_runs(led, runs, draws, {plan.id: plan, other.id: other})
    assert out["with_draw"] == 1 and out["left_out"] == {
        "no recorded draw (SAGE's bandit chose, adaptively: not evidence)": 2,
        "drawn, but no task verdict known (a killed or cut run: never scored as 0)": 1,
        "a draw without a coder arm (or its plan unknown)": 1}
    assert out["candidates"][a.id]["added"] == 1 and a.judged_on[coder.ONLINE] == ["d1"]
    # only the drawn run moved the evidence: the same run alone gives the same stream
    led2, a2, _, plan2, arms2 = _one_round()
    coder.add_runs(led2, [coder.CoderRun("s1", "d1", 1.0, A)], {"d1": _record(plan2, arms2[a2.id])}, {plan2.id: plan2})
    assert np.array_equal(led.stream(a, "streams", coder.ONLINE).log_plus,
                          led2.stream(a2, "streams", coder.ONLINE).log_plus)
    # a run whose coder logged another model than its arm pinned still counts as drawn, and is said
    more = coder.add_runs(led, [coder.CoderRun("s4", "d4", 0.0, B)], {"d4": _record(plan, arms[a.id])}, {plan.id: plan})
    assert more["candidates"][a.id]["added"] == 1 and len(more["noted"]) == 1


def test_a_unit_counted_twice_is_refused():
    led, a, b, plan, arms = _one_round()
    draws = {"d1": _record(plan, arms[a.id]), "d2": _record(plan, arms[b.id])}
    runs = [coder.CoderRun("s1", "d1", 1.0, A), coder.CoderRun("s2", "d2", 0.0, B)]
    first = coder.add_runs(led, runs, draws, {plan.id: plan})
    again = coder.add_runs(led, runs, draws, {plan.id: plan})
    assert first["candidates"][a.id]["added"] == 2
    assert again["candidates"][a.id] == {"added": 0, "left_out": {"already counted": 2}}
    assert led.standing(a.id)["n"] == 2
    twice = coder.add_runs(led, [coder.CoderRun("s5", "d5", 1.0, A), coder.CoderRun("s6", "d5", 1.0, A)],
                           {"d5": _record(plan, arms[a.id])}, {plan.id: plan})
    assert twice["left_out"] == {"a second session on one draw (one draw is one run)": 1}
    with pytest.raises(LedgerError, match="already counted"):
        led.add_evidence(a.id, coder.ONLINE, [0.1], -2.0, 2.0, ["d1"])


def test_the_plan_runs_both_models_then_the_pin_with_exploration_through_pinned_models_yaml(tmp_path):
    table = RoutingTable.load(SHIPPED)
    models = (table.routes["coder"].primary, table.routes["coder"].fallback)
    pins = coder.write_pins(table, tmp_path / "pins", models)
    for m, path in pins.items():  # SAGE's table as shipped, the coder alone on m
        back = RoutingTable.load(path)
        assert back.routes["coder"].primary == back.routes["coder"].fallback == m
        assert {r: back.routes[r] for r in back.routes if r != "coder"} == \
            {r: table.routes[r] for r in table.routes if r != "coder"}
    led = Ledger()
    assert coder.round_due(led, "day-01")
    a, b = coder.open_round(led, models, "day-01", prefer=models[1])
    assert coder.model_of(a) == models[1] and a.index == 1  # prefer gets the larger level
    with pytest.raises(ValueError, match="a round is open"):
        coder.open_round(led, models, "day-01")
    plan = coder.plan(led, pins)
    got = {x.name: (x.probability, x.env["SAGE_MODELS_YAML"]) for x in plan.levers[coder.LEVER]}
    assert got == {f"pin-{a.id}": (0.5, str(pins[models[1]].resolve())), f"pin-{b.id}": (0.5, str(pins[models[0]]))}
    led.transition(a.id, "accepted", night="day-02", reason="test")
    led.transition(b.id, "dropped", night="day-02", reason="test")
    arms = {x.name: x.probability for x in coder.plan(led, pins).levers[coder.LEVER]}
    assert arms == {f"pin-{a.id}": pytest.approx(0.7), f"pin-{b.id}": pytest.approx(0.3)}
    assert sum(x.threshold for x in coder.plan(led, pins).levers[coder.LEVER]) == assign.SCALE  # exact
    assert not coder.round_due(led, "day-03")
    led.transition(a.id, "reverted", night="day-05", reason="test")
    assert coder.plan(led, pins) is None  # until the night's decision opens the next round
    assert coder.round_due(led, "day-05")
    table_after = coder.CoderDecisionsConfig(after_revert="table", reopen_after_nights=3)
    assert not coder.round_due(led, "day-07", table_after) and coder.round_due(led, "day-08", table_after)


def test_each_draw_is_recorded_and_read_back_with_its_exact_probability(tmp_path):
    led, a, b, _, _ = _one_round()
    plan = coder.plan(led, PINS)
    folder = tmp_path / "coder"
    coder.save_plan(folder, plan)
    rng = np.random.default_rng(0)
    envs = [coder.draw(plan, rng, f"d01-r{i:03d}", tmp_path / "day-01") for i in range(6)]
    plans, bad = coder.load_plans(folder)
    recs, problems = assign.read_records(tmp_path / "day-01" / assign.RECORDS_NAME, plans)
    assert not bad and not problems and list(recs) == [d for d, _, _ in envs]  # in the order drawn
    for did, arms, env in envs:
        arm = arms[coder.LEVER]
        assert env == {"SAGE_MODELS_YAML": arm.env["SAGE_MODELS_YAML"], "SAGE_TRACE_ID": did}
        assert recs[did]["levers"][coder.LEVER] == {"arm": arm.name, "probability": 0.5, "candidate": arm.candidate}


def test_the_rescaling_keeps_task_v1_inside_its_stated_bounds():
    y, capped = coder.rescale([1.0, 1.0 - 8 / 3600, -8 / 3600, -1.0])
    assert y[0] == 1.0 and 0.0 < y[2] < y[1] < 1.0 and y[3] == 0.0 and capped.tolist() == [False, False, False, True]
    assert coder.bounds() == (pytest.approx(-1 / 30), 1.0)
    with pytest.raises(ValueError):
        coder.rescale([1.5])


def test_saving_keeps_the_other_levers_candidates(tmp_path):
    path = tmp_path / "ledger.json"
    other = Ledger.load(path)
    other.propose("skills", "a rule", night="2026-12-01")
    other.save_lever("skills")
    led = Ledger.load(tmp_path / "elsewhere.json")
    coder.open_round(led, [A, B], "2026-12-01")
    coder.save_merged(led, path)
    back = Ledger.load(path)
    assert [c.lever for c in back.data.candidates] == ["skills", "coder", "coder"]
    assert coder.sibling(back, back.of(coder.LEVER)[0]).id == back.of(coder.LEVER)[1].id
    assert "at most 0.05" in coder.guarantee(back) and math.isfinite(coder.row(back, back.of("coder")[0])["needed"])


# ------------------------------------------------------------------------- the loop's side: a run's own draw
FAKE_SAGE = """#!/bin/sh
# a stand-in for SAGE's `sage run`: one journal line as SAGE's structured logger writes it
mkdir -p memory/sessions
sid=$(od -An -N8 -tx8 /dev/urandom | tr -d ' \\n')
printf '{"type": "X", "timestamp": "t", "session_id": "%s", "trace_id": "%s", "models_yaml": "%s"}\\n' \\
  "$sid" "$SAGE_TRACE_ID" "$SAGE_MODELS_YAML" >> memory/sessions/2026-12-01.log
"""


def test_the_harness_runs_each_sage_run_with_its_own_drawn_models_yaml(tmp_path):
    from sage_pipeline.sage_world.harness import HarnessConfig, SageInstall, run_day

    cli = tmp_path / "bin" / "sage"
    cli.parent.mkdir()
    cli.write_text(FAKE_SAGE)
    cli.chmod(cli.stat().st_mode | stat.S_IXUSR)
    install = SageInstall(Path("/bin/sh"), cli, SHIPPED)
    tasks = [SimpleNamespace(prompt="p")]
    world = SimpleNamespace(tasks=tasks, by_id={"t1": 0}, assign=lambda *a, **k: None, final_right=lambda r: True,
                            coder_model=lambda r: None, tests_at_start=lambda r: False)
    led = Ledger()
    coder.open_round(led, [A, B], "day-00")
    pins = coder.write_pins(RoutingTable.load(SHIPPED), tmp_path / "pins", [A, B])
    plan = coder.plan(led, pins)
    rng = np.random.default_rng(3)
    day_root = tmp_path / "day-01"
    res = run_day(world, "http://127.0.0.1:9", install, 1, ["t1"] * 8, day_root,
                  HarnessConfig(workers=2, fresh_process=True, run_timeout_s=30),
                  run_env=lambda run, task: coder.draw(plan, rng, run, day_root)[2])
    recs, problems = assign.read_records(day_root / assign.RECORDS_NAME, {plan.id: plan})
    assert not problems and len(recs) == 8 and res.finished == 8
    lines = [json.loads(x) for f in sorted(day_root.glob("ws-*/memory/sessions/*.log"))
             for x in f.read_text().splitlines()]
    seen = {ln["trace_id"]: ln["models_yaml"] for ln in lines}
    for r in res.runs:
        arm = recs[r.trace_id]["levers"][coder.LEVER]["arm"]
        want = next(a for a in plan.levers[coder.LEVER] if a.name == arm).env["SAGE_MODELS_YAML"]
        assert seen[r.trace_id] == want == r.env["SAGE_MODELS_YAML"] and len(r.sessions) == 1
    assert len({a for a in seen.values()}) == 2  # both arms ran
    with pytest.raises(ValueError, match="may set only"):
        run_day(world, "http://127.0.0.1:9", install, 2, ["t1"], tmp_path / "day-02",
                HarnessConfig(workers=1, fresh_process=True), run_env=lambda run, task: {"PATH": "/tmp"})
    assert os.access(cli, os.X_OK)
