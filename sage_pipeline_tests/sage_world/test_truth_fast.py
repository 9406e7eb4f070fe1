"""The truth's vectorised path gives the numbers of the one-run recursion it replaced
(``truth_reference.py``, the previous implementation kept verbatim): every run's value, the policy
values, the best-expressible search, the bundles and their seeded draws, on a few hundred random runs
under several policies (SAGE's YAML, an exploring checkpoint, deterministic checkpoints at two floors,
a policy that says its choices one state at a time, a pinned coder), exact to 1e-12."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.sage import bandit_state, checkpoint as sage_router, explore as sage_explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import SAGE_TABLE, pin
from sage_pipeline.sage_world import truth as T
from sage_pipeline.sage_world.world import ModelWorld, build_world
from sage_pipeline_tests.sage_world import truth_reference as R

pytestmark = pytest.mark.slow  # builds a model world and runs the slow reference beside the fast path

SMALL, BIG = "qwen2.5-coder:1.5b", "qwen2.5-coder:14b-instruct-q4_K_M"
TOL = 1e-12
# complexities SAGE's triggers and the checkpoints split at (0.8: `task_complexity_score > 0.8`), and others
COMPLEXITIES = (0.0, 0.05, 0.0683, 0.1, 0.35, 0.5, 0.8, float(np.nextafter(0.8, 1.0)), 0.81, 0.95, 1.0)


@pytest.fixture(scope="module")
def world() -> ModelWorld:
    return build_world(SAGE_TABLE, n_tasks=22, task_seed=5)


def _runs(world: ModelWorld, n: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"task_id": world.tasks[int(rng.integers(len(world.tasks)))].task_id,
             "coder_model": (SMALL, BIG)[int(rng.integers(2))],
             "complexity": COMPLEXITIES[int(rng.integers(len(COMPLEXITIES)))],
             "tests_at_start": bool(rng.random() < 0.3), "worker": int(rng.integers(3))} for _ in range(n)]


class Coin(T.SagePolicy):
    """Says its choice one state at a time (p_fallback only): the debugger's and reviewer's by a fair coin."""

    def p_fallback(self, role: str, complexity: float, failure_count: int) -> float:
        return 0.5 if role in ("debugger", "reviewer") else super().p_fallback(role, complexity, failure_count)


def _trees(table, seed: int) -> dict:
    """Deterministic classifiers as the chain distils them (decision trees on SAGE's two inputs)."""
    from sklearn.tree import DecisionTreeClassifier

    rng = np.random.default_rng(seed)
    out = {}
    for role in ("debugger", "reviewer", "test_engineer", "planner"):
        x = np.column_stack([rng.random(300), rng.integers(0, 6, 300)])
        y = ((x[:, 1] >= rng.integers(1, 4)) ^ (x[:, 0] > rng.uniform(0.05, 0.9))).astype(int)
        out[role] = DecisionTreeClassifier(max_depth=3, random_state=0).fit(x, y)
    return out


def _policies(world: ModelWorld) -> dict[str, T.SagePolicy]:
    table = world.table
    explore = sage_explore.build_exploring(table, ActionSpace.build(table).binary(), sage_explore.ExploreConfig(0.2))
    # P(fallback) 0.25 below failure count 2, 0.5 from it: confident enough only at floor 0
    unsure = {r: sage_router.region_classifier(([0.5], [2.0]), ([0.5], [2.0]),
                                               lambda s, f: 0.5 if f >= 2 else 0.25) for r in ("debugger", "reviewer")}
    return {"yaml": T.SagePolicy(table),
            "exploring": T.SagePolicy(table, dict(explore.models), sage_explore.EXPLORE_FLOOR, "exploring"),
            "trees": T.SagePolicy(table, _trees(table, 1), 0.55, "trees"),
            "unsure at floor 0": T.SagePolicy(table, unsure, 0.0, "unsure"),  # acts on P 0.5 and 0.25; YAML elsewhere
            "unsure at 0.55": T.SagePolicy(table, unsure, 0.55, "unsure"),  # never confident: YAML
            "coin": Coin(table, name="coin"),
            "pinned coder": T.SagePolicy(pin(table, "coder", BIG), dict(explore.models), sage_explore.EXPLORE_FLOOR)}


@dataclass
class Memo:
    """The reference asks the policy one state at a time, sklearn each time: remembered here (the
    answers are the policy's own) so the reference runs in seconds."""

    policy: T.SagePolicy
    seen: dict = field(default_factory=dict)

    @property
    def table(self):
        return self.policy.table

    def p_fallback(self, role: str, complexity: float, failure_count: int) -> float:
        key = (role, float(complexity), int(failure_count))
        if key not in self.seen:
            self.seen[key] = self.policy.p_fallback(role, complexity, failure_count)
        return self.seen[key]


def _row(v: T.RunValue) -> np.ndarray:
    return np.array(list(vars(v).values()))


def test_p_fallbacks_is_p_fallback_state_by_state(world):
    c = np.array([x for x in COMPLEXITIES for _ in range(T.K)])
    k = np.tile(np.arange(T.K), len(COMPLEXITIES))
    for name, pol in _policies(world).items():
        for role in T.FLOW_ROLES:
            one = np.array([pol.p_fallback(role, a, int(b)) for a, b in zip(c, k)])
            assert np.array_equal(pol.p_fallbacks(role, c, k), one), (name, role)
            if name != "coin":  # SAGE's router, one state at a time as it was asked before
                assert np.array_equal(one, [R.p_fallback(pol, role, a, int(b)) for a, b in zip(c, k)]), (name, role)
    pols = _policies(world)
    # SAGE's floor: at 0 it acts on P 0.25 (the primary, where its YAML falls back) and 0.5 (the fallback)
    assert [pols["unsure at floor 0"].p_fallback("debugger", 0.1, k) for k in (1, 2)] == [0.0, 1.0]
    assert [pols["unsure at 0.55"].p_fallback("debugger", 0.1, k) for k in (0, 1)] == [0.0, 1.0]  # its YAML


def test_every_runs_value_is_the_reference_recursions(world):
    runs = _runs(world, 240, seed=0)
    for name, pol in _policies(world).items():
        fast = T.run_values(world, runs, pol)
        memo = Memo(pol)
        ref = np.array([_row(R.run_value(world, world.by_id[r["task_id"]], r["coder_model"], r["complexity"], memo,
                                         r["tests_at_start"])) for r in runs])
        assert np.abs(fast - ref).max() <= TOL, name
        assert fast.shape == (240, 6) and np.all(fast[:, 1] >= 0) and np.all(fast[:, 1] <= 1)
        one = T.run_value(world, world.by_id[runs[7]["task_id"]], runs[7]["coder_model"], runs[7]["complexity"], pol,
                          runs[7]["tests_at_start"])
        assert np.abs(_row(one) - ref[7]).max() <= TOL
        assert np.abs(_row(T.policy_value(world, runs, pol)) - _row(R.policy_value(world, runs, memo))).max() <= TOL


def test_the_best_expressible_search_finds_the_references_policy_and_value(world):
    runs = _runs(world, 24, seed=1)
    cases = [dict(by_complexity=False, roles=("debugger",)),
             dict(by_complexity=False, objective=TaskObjective(gpu_second_weight=1 / 600)),
             dict(by_complexity=True, roles=("reviewer",), objective=TaskObjective())]
    for i, kw in enumerate(cases):
        sub = runs if kw.get("roles") else runs[:6]  # both roles: 384 trials, the reference's minutes
        pf, vf = T.best_expressible(world, sub, **kw)
        pr, vr = R.best_expressible(world, sub, **kw)
        assert pf.choices == pr.choices, i
        assert np.abs(_row(vf) - _row(vr)).max() <= TOL, i
    # the search's own trials: the final policy valued anew gives its value, and it beats SAGE's YAML
    assert T.policy_value(world, runs, pf) == vf
    assert vf.objective(TaskObjective()) >= T.policy_value(world, runs, T.SagePolicy(world.table)).objective(
        TaskObjective()) - TOL


def test_bundles_and_their_draws_are_the_references(world):
    runs = _runs(world, 60, seed=2)
    obj = TaskObjective()
    pols = _policies(world)
    specs = [T.BundleSpec(pols["exploring"], None, "deployed"),
             T.BundleSpec(pols["yaml"], None, "shipped"),
             T.BundleSpec(pols["trees"], bandit_state.warm_start("fallback"), "warm"),
             T.BundleSpec(pols["pinned coder"], None, "pinned")]
    for spec in specs:
        for seed in (0, 3):
            fast = T.bundle_value(world, runs, spec, obj, draws=12, seed=seed)
            ref = R.bundle_value(world, runs, T.BundleSpec(Memo(spec.policy), spec.bandit, spec.name), obj, draws=12,
                                 seed=seed)
            assert fast.coder_share == ref.coder_share and fast.draws == ref.draws, spec.name
            assert np.abs(_row(fast.value) - _row(ref.value)).max() <= TOL, spec.name
            assert abs(fast.objective - ref.objective) <= TOL and abs(fast.objective_se - ref.objective_se) <= TOL
    # seeded: the same seed gives the same draws, another seed other draws (SAGE's bandit picks both models)
    a, b = (T.bundle_value(world, runs, specs[0], obj, draws=12, seed=s) for s in (5, 5))
    assert a == b
    assert T.bundle_value(world, runs, specs[0], obj, draws=12, seed=6).value != a.value


def test_drawn_runs_are_the_references_draw_for_draw(world):
    pols = _policies(world)
    for name in ("yaml", "exploring", "coin"):
        pol = pols[name]
        rf, rr = np.random.default_rng(11), np.random.default_rng(11)
        for i, r in enumerate(_runs(world, 150, seed=3)):
            args = (world, world.by_id[r["task_id"]], r["coder_model"], r["complexity"])
            assert T.draw_run(*args, pol, rf, r["tests_at_start"]) == \
                R.draw_run(*args, Memo(pol), rr, r["tests_at_start"]), (name, i)
        assert rf.random() == rr.random()  # both consumed the same numbers


def test_best_bundle_is_the_references(world):
    runs = _runs(world, 6, seed=4)
    obj = TaskObjective()
    fs, fb, fc = T.best_bundle(world, runs, obj, (SMALL, BIG))
    rs, rb, rc = R.best_bundle(world, runs, obj, (SMALL, BIG))
    assert fs.name == rs.name and fs.policy.choices == rs.policy.choices
    assert len(fc) == len(rc) == 2
    for f, r in zip([fb, *fc], [rb, *rc]):
        assert f.name == r.name and f.coder_share == r.coder_share and f.draws == r.draws
        assert np.abs(_row(f.value) - _row(r.value)).max() <= TOL and abs(f.objective - r.objective) <= TOL


def test_bad_runs_say_which_run_and_what_to_fix(world):
    good = _runs(world, 3, seed=5)
    pol = T.SagePolicy(world.table)
    with pytest.raises(ValueError, match=r"run 1: task 'no-such-task' is not one of the world's 22 tasks"):
        T.run_values(world, [good[0], {**good[1], "task_id": "no-such-task"}], pol)
    with pytest.raises(ValueError, match=r"run 2: no 'complexity'"):
        T.policy_value(world, [good[0], good[1], {**good[2], "complexity": None}], pol)
    with pytest.raises(ValueError, match=r"run 0: no 'coder_model'"):
        T.run_values(world, [{k: v for k, v in good[0].items() if k != "coder_model"}], pol)
    with pytest.raises(ValueError, match="at least one run"):
        T.bundle_value(world, [], T.BundleSpec(pol), TaskObjective())
    assert T.run_values(world, [], pol).shape == (0, 6)


def test_the_loops_truth_check_sets_each_runs_exact_expectation_beside_sages_returns(world, tmp_path):
    import pandas as pd

    from sage_pipeline.routing import routing_dataset as rd
    from sage_pipeline.sage_world import loop as sl

    runs = [{**r, "sessions": [f"s{i}"]} for i, r in enumerate(_runs(world, 30, seed=6))]
    pol = _policies(world)["exploring"]
    ref = np.array([R.run_value(world, world.by_id[r["task_id"]], r["coder_model"], r["complexity"], Memo(pol),
                                r["tests_at_start"]).ret for r in runs])
    noise = np.random.default_rng(0).normal(0.0, 0.3, len(runs))
    path = tmp_path / "routing" / rd.PARQUET_NAME
    path.parent.mkdir()
    for shift, agrees in ((0.0, True), (1.0, False)):
        returns = ref + noise - noise.mean() + shift  # what the dataset made of SAGE's journals, per run
        pd.DataFrame({"session_id": [f"s{i}" for i in range(len(runs))], "reward": returns,
                      "reward_version": "reward_v1"}).to_parquet(path)
        got = sl.truth_check(world, tmp_path, runs, pol)
        assert got["runs"] == 30 and abs(got["expected_mean"] - ref.mean()) <= TOL
        assert abs(got["realized_mean"] - returns.mean()) <= TOL and got["agrees"] is agrees
    assert sl.truth_check(world, tmp_path, [], pol) == {"runs": 0}
    pd.DataFrame({"session_id": ["s0"], "reward": [1.0], "reward_version": "reward_v2"}).to_parquet(path)
    assert "reward_v1" in sl.truth_check(world, tmp_path, runs, pol)["why"]
