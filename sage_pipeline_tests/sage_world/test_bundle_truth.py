"""The world's exact truth for whole bundles under the per-task objective: calls and GPU-seconds of a
run, the coder's model through SAGE's YAML and its UCB bandit, the best bundle and the front."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from sage_pipeline.sage import bandit_state
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import SAGE_TABLE, pin
from sage_pipeline.sage_world import truth as T
from sage_pipeline.sage_world.world import MAX_RETRIES, ModelWorld, build_world

SMALL, BIG = "qwen2.5-coder:1.5b", "qwen2.5-coder:14b-instruct-q4_K_M"


@pytest.fixture(scope="module")
def world() -> ModelWorld:
    return build_world(SAGE_TABLE, n_tasks=22, task_seed=5)


def _runs(world: ModelWorld, workers: int = 2) -> list[dict]:
    return [{"task_id": t.task_id, "complexity": 0.05 + 0.02 * (i % 4), "worker": i % workers}
            for i, t in enumerate(world.tasks)]


def _drawn_costs(w: ModelWorld, task: int, coder: str, c: float, policy: T.SagePolicy, rng) -> tuple[float, float]:
    """(GPU-seconds, calls) of one run drawn through SAGE's flow, call by call."""
    tab = policy.table

    def model(role, k):
        r = tab.routes[role]
        return r.fallback if rng.random() < policy.p_fallback(role, c, k) else r.primary

    secs = w.call_seconds("planner", model("planner", 0)) + w.call_seconds("coder", coder)
    calls = 2
    slot = -1 if rng.random() < w.p_code(task, coder) else int(rng.integers(len(w.tasks[task].wrong_candidates())))
    tests, k = False, 0

    def review(k):
        nonlocal secs, calls
        m = model("reviewer", k)
        secs += w.call_seconds("reviewer", m)
        calls += 1
        return (slot == -1) == (rng.random() < w.review_accuracy(task, m))

    while True:
        passed = review(k)
        if passed and not tests:
            m = model("test_engineer", k)
            secs, calls = secs + w.call_seconds("test_engineer", m), calls + 1
            tests, passed = True, review(k)
        if passed and slot == -1:
            return secs, calls
        k += 1
        if k > MAX_RETRIES:
            return secs, calls
        m = model("debugger", k)
        secs, calls = secs + w.call_seconds("debugger", m), calls + 1
        if slot != -1 and rng.random() < w.p_fix(task, slot, m):
            slot = -1


def test_a_runs_calls_and_gpu_seconds_are_the_expectation_of_the_flow(world):
    rng = np.random.default_rng(1)
    pol = T.SagePolicy(world.table)
    for task, coder in ((0, SMALL), (3, BIG)):
        v = T.run_value(world, task, coder, 0.1, pol)
        d = np.array([_drawn_costs(world, task, coder, 0.1, pol, rng) for _ in range(3000)])
        assert abs(d[:, 0].mean() - v.gpu_seconds) < 4 * d[:, 0].std() / np.sqrt(3000) + 1e-9
        assert abs(d[:, 1].mean() - v.calls) < 4 * d[:, 1].std() / np.sqrt(3000) + 1e-9
        assert v.usd == 0.0  # SAGE's table routes none of these calls to an API model
        assert v.objective(TaskObjective()) == pytest.approx(v.p_verified - v.gpu_seconds / 3600)


def test_a_pinned_coder_is_exact_and_equals_the_policy_value(world):
    runs = _runs(world)
    obj = TaskObjective()
    for m in (SMALL, BIG):
        spec = T.BundleSpec(T.SagePolicy(pin(world.table, "coder", m)), None, m)
        bv = T.bundle_value(world, runs, spec, obj)
        pv = T.policy_value(world, [{**r, "coder_model": m} for r in runs], spec.policy)
        assert bv.draws == 1 and bv.objective_se == 0.0 and bv.coder_share == {m: 1.0}
        assert bv.value.p_verified == pytest.approx(pv.p_verified) and bv.objective == pytest.approx(pv.objective(obj))


def test_sages_bandit_gives_the_coder_both_models_and_a_warm_start_pins_it(world):
    runs = _runs(world)
    obj = TaskObjective()
    shipped = T.bundle_value(world, runs, T.BundleSpec(T.SagePolicy(world.table)), obj, draws=32)
    assert set(shipped.coder_share) == {SMALL, BIG} and shipped.objective_se > 0
    small = T.bundle_value(world, runs, T.BundleSpec(T.SagePolicy(pin(world.table, "coder", SMALL))), obj)
    big = T.bundle_value(world, runs, T.BundleSpec(T.SagePolicy(pin(world.table, "coder", BIG))), obj)
    assert small.objective - 4 * shipped.objective_se < shipped.objective < big.objective + 4 * shipped.objective_se
    warm = T.bundle_value(world, runs, T.BundleSpec(T.SagePolicy(world.table), bandit_state.warm_start("fallback")),
                          obj, draws=8)
    assert warm.coder_share == {BIG: 1.0} and warm.objective == pytest.approx(big.objective)
    # a fresh workspace's bandit tries its untried keys in SAGE's order: the first run of a worker is primary's
    first = T.bundle_value(world, runs[:2], T.BundleSpec(T.SagePolicy(world.table)), obj, draws=4)
    assert first.coder_share == {SMALL: 1.0}


def test_the_coders_yaml_triggers_restrict_the_bandit_to_the_fallback_keys(world):
    from sage_pipeline.sage.table import ALWAYS

    table = world.table.with_route("coder", triggers=ALWAYS)
    assert T.coder_candidates(table, 0.1) == list(bandit_state.FALLBACK_KEYS)
    assert T.coder_candidates(world.table, 0.1) == list(bandit_state.KEYS)
    v = T.bundle_value(world, _runs(world), T.BundleSpec(T.SagePolicy(table)), TaskObjective(), draws=4)
    assert v.coder_share == {BIG: 1.0}


def test_the_best_bundle_beats_every_fixed_choice_and_sages_shipped_one(world):
    runs = _runs(world)
    obj = TaskObjective()
    spec, best, cands = T.best_bundle(world, runs, obj, (SMALL, BIG))
    assert len(cands) == 2 and best.objective == max(c.objective for c in cands)
    for m in (SMALL, BIG):
        yaml = T.bundle_value(world, runs, T.BundleSpec(T.SagePolicy(pin(world.table, "coder", m))), obj)
        assert best.objective >= yaml.objective - 1e-12
    shipped = T.bundle_value(world, runs, T.BundleSpec(T.SagePolicy(world.table)), obj, draws=32)
    assert best.objective > shipped.objective + 4 * shipped.objective_se


def test_under_the_objective_gpu_time_can_change_the_best_routing(world):
    runs = [{**r, "coder_model": SMALL} for r in _runs(world)]
    free, v_free = T.best_expressible(world, runs, by_complexity=False, objective=TaskObjective(gpu_second_weight=0))
    dear, v_dear = T.best_expressible(world, runs, by_complexity=False, objective=TaskObjective(gpu_second_weight=0.05))
    assert v_free.p_verified >= v_dear.p_verified - 1e-12
    assert v_dear.gpu_seconds <= v_free.gpu_seconds + 1e-12
    pts = T.front(world, runs, (SMALL,), (0.0, 0.05))
    assert pts == sorted(pts, key=lambda p: p["gpu_seconds"])
    assert all(a["verified"] < b["verified"] for a, b in zip(pts, pts[1:]))  # a front: more time, more verified


def test_the_coder_levers_estimate_from_sages_bandit_logs_is_the_pinned_bundles_truth(world):
    """Identification (rl/coder_lever.py): SAGE's bandit picks the coder's model from its past rewards
    only, so per model the mean over the tasks it got estimates the table that pins it."""
    from sage_pipeline.rl import coder_lever as cl

    rng = np.random.default_rng(7)
    pol = T.SagePolicy(world.table)
    route = world.table.routes["coder"]
    rows = []
    for w in range(4):  # four fresh workspaces, 150 runs each: SAGE's bandit as in a shipped install
        stats: dict = {}
        for i in range(150):
            task = int(rng.integers(len(world.tasks)))
            key = bandit_state.select(stats, T.coder_candidates(world.table, 0.1))
            m = route.primary if bandit_state.side_of(key) == "primary" else route.fallback
            ok, rewards = T.draw_run(world, task, m, 0.1, pol, rng)
            for x in rewards:
                bandit_state.update(stats, key, x)
            rows.append({"session_id": f"w{w}-{i}", "model": m, "verified": float(ok), "gpu_seconds": 0.0,
                         "usd": 0.0, "calls": 0})
    tasks = pd.DataFrame(rows)
    d = cl.decide(tasks, TaskObjective(gpu_second_weight=0.0), cl.CoderLeverConfig(confidence=0.999))
    runs = [{"task_id": t.task_id, "complexity": 0.1} for t in world.tasks]  # the task stream: uniform over tasks
    for m in (SMALL, BIG):
        truth = T.bundle_value(world, runs, T.BundleSpec(T.SagePolicy(pin(world.table, "coder", m))),
                               TaskObjective()).value.p_verified
        lo, hi = d.per_model[m]["ci"]
        assert lo <= truth <= hi, (m, truth, d.per_model[m])
