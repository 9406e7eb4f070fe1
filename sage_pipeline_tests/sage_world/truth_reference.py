"""The truth's previous implementation, kept as the reference the fast one is checked against
(``test_truth_fast.py``) and timed beside (``benchmarks/sage_truth_speed.py``).

These are :mod:`sage_pipeline.sage_world.truth`'s ``SagePolicy.p_fallback`` (here a function),
``run_value``, ``policy_value``, ``best_expressible``, ``draw_run``, ``bundle_value`` and
``best_bundle`` as they were before the vectorised rewrite (truth.py of commit a5d4527): one run at
a time, the recursion on plain tuples, every routing probability asked of the policy one state at a
time (``policy.p_fallback``). Slow (minutes a day of the loop) and exact: the fast path must give the
same numbers to 1e-12 and the same draws.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from sage_pipeline.sage import checkpoint as sage_router, explore as sage_explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable, pin
from sage_pipeline.sage_world.truth import (
    BundleSpec,
    BundleValue,
    RunValue,
    SagePolicy,
    _LookupPolicy,
    coder_candidates,
)
from sage_pipeline.sage_world.world import MAX_RETRIES, ModelWorld


def p_fallback(policy: SagePolicy, role: str, complexity: float, failure_count: int) -> float:
    """``SagePolicy.p_fallback`` as it was: one state, SAGE's YAML or the checkpoint's classifier."""
    route = policy.table.routes[role]
    if route.primary == route.fallback:
        return 0.0
    yfb = bool(sage_router.yaml_fallback(route, complexity, failure_count)[0])
    if policy.models is None:
        return float(yfb)
    x = np.array([[float(complexity), float(failure_count)]])
    dist = sage_explore.choice_distribution(policy.models.get(role), x, policy.min_confidence)
    return float(dist.p_fallback(np.array([yfb]))[0])


def run_value(world: ModelWorld, task: int, coder_model: str, complexity: float, policy: SagePolicy,
              tests_at_start: bool = False) -> RunValue:
    """The exact expected outcome of one `sage run` of ``task`` whose coder used ``coder_model``;
    ``tests_at_start``: the workspace already held the task's tests (an earlier run of the same task
    there), so SAGE's gate asks no test engineer. The rows of the reviewer, debugger, planner and test
    engineer are ``policy.table``'s (a bundle's models.yaml may change them); each call costs the
    world's ``call_seconds`` and ``call_usd`` of its agent and model."""
    c = world.config
    table = policy.table

    def row(role: str) -> tuple[str, str]:
        r = table.routes[role]
        return (r.primary, r.fallback)

    rev_pri, rev_fb = row("reviewer")
    dbg = row("debugger")
    costs: dict = {}

    def call(agent: str, model: str) -> tuple:
        got = costs.get((agent, model))
        if got is None:
            got = costs[agent, model] = (0.0, 0.0, 0.0, world.call_seconds(agent, model),
                                         world.call_usd(agent, model), 1.0)
        return got

    def routed_call(role: str, k: int) -> tuple:
        q = policy.p_fallback(role, complexity, k)
        pri, fb = row(role)
        return mix(q, call(role, fb), call(role, pri)) if q else call(role, pri)

    # vectors on plain tuples (the recursion is hot: numpy's small arrays cost 4x here):
    # (return, verified, debug calls, GPU-seconds, dollars, calls)
    zero = (0.0,) * 6

    def vec(ret: float = 0.0, verified: float = 0.0) -> tuple:
        return (ret, verified, 0.0, 0.0, 0.0, 0.0)

    def mix(p: float, x: tuple, y: tuple) -> tuple:  # p x + (1 - p) y, written out: the hot path
        q = 1.0 - p
        return (p * x[0] + q * y[0], p * x[1] + q * y[1], p * x[2] + q * y[2], p * x[3] + q * y[3],
                p * x[4] + q * y[4], p * x[5] + q * y[5])

    def plus(x: tuple, y: tuple, *more: tuple) -> tuple:
        out = (x[0] + y[0], x[1] + y[1], x[2] + y[2], x[3] + y[3], x[4] + y[4], x[5] + y[5])
        return plus(out, *more) if more else out

    def times(w: float, x: tuple) -> tuple:
        return (w * x[0], w * x[1], w * x[2], w * x[3], w * x[4], w * x[5])

    acc = {}
    for k in range(MAX_RETRIES + 1):
        q = policy.p_fallback("reviewer", complexity, k)
        acc[k] = (1 - q) * world.review_accuracy(task, rev_pri) + q * world.review_accuracy(task, rev_fb)
    p_dbg = {k: policy.p_fallback("debugger", complexity, k) for k in range(1, MAX_RETRIES + 1)}
    rev_call = {k: routed_call("reviewer", k) for k in range(MAX_RETRIES + 1)}
    te_call = {k: routed_call("test_engineer", k) for k in range(MAX_RETRIES + 1)}

    def fail_credit(k: int) -> float:
        return c.review_fail_score - 0.15 - (0.1 if k >= MAX_RETRIES else 0.0)

    def unreviewed_credit(k: int) -> float:
        if k == 0:
            return 0.0  # the coder's decision has no row: no verdict was ever logged for it
        return -0.1 if k >= MAX_RETRIES else -0.15

    @lru_cache(maxsize=None)
    def debug(k: int, slot: int, tests: bool) -> tuple:
        """From the k-th debugger call on the file in ``slot``."""
        if k > MAX_RETRIES:
            return zero
        out = (0.0, 0.0, 1.0, 0.0, 0.0, 0.0)
        for model, w in ((dbg[0], 1 - p_dbg[k]), (dbg[1], p_dbg[k])):
            if w == 0:
                continue
            p = world.p_fix(task, slot, model)
            v = mix(p, review(k, -1, tests), review(k, slot, tests) if slot != -1 else zero)
            out = plus(out, times(w, plus(v, call("debugger", model))))
        return out

    @lru_cache(maxsize=None)
    def review(k: int, slot: int, tests: bool) -> tuple:
        """From a file just written at failure count k, reviewed next (the review's call included)."""
        right = slot == -1
        pp = acc[k] if right else 1 - acc[k]
        nxt = (lambda t: debug(k + 1, slot, t)) if k < MAX_RETRIES else (lambda t: zero)
        fail = vec(fail_credit(k))
        verify = vec(c.review_pass_score + 0.25, 1.0) if right else plus(vec(unreviewed_credit(k)), nxt(True))
        after_tests = mix(pp, verify, plus(fail, nxt(True)))
        if tests:
            return plus(rev_call[k], after_tests)
        # the first PASS: the test engineer writes tests and the reviewer looks again
        return plus(rev_call[k], mix(pp, plus(te_call[k], rev_call[k], after_tests), plus(fail, nxt(False))))

    n_wrong = len(world.tasks[task].wrong_candidates())
    p = world.p_code(task, coder_model)
    t0 = bool(tests_at_start)
    wrong = zero
    for w in range(n_wrong):
        wrong = plus(wrong, review(0, w, t0))
    wrong = times(1.0 / n_wrong, wrong)
    v = plus(mix(p, review(0, -1, t0), wrong), call("coder", coder_model), routed_call("planner", 0))
    return RunValue(*(float(x) for x in v))


def policy_value(world: ModelWorld, runs: list[dict], policy: SagePolicy) -> RunValue:
    """The mean exact value over ``runs`` (each ``{"task_id", "coder_model", "complexity"}``)."""
    if not runs:
        return RunValue(*([float("nan")] * 6))
    vals = np.array([[*vars(run_value(world, world.by_id[r["task_id"]], r["coder_model"], r["complexity"],
                                      policy, r.get("tests_at_start", False))).values()] for r in runs])
    return RunValue(*(float(x) for x in vals.mean(axis=0)))


ROUTED = {"debugger": tuple(range(1, MAX_RETRIES + 1)), "reviewer": tuple(range(0, MAX_RETRIES + 1))}


def best_expressible(world: ModelWorld, runs: list[dict], by_complexity: bool = True,
                     roles: tuple[str, ...] = ("debugger", "reviewer"),
                     name: str = "best_expressible", table: RoutingTable | None = None,
                     objective: TaskObjective | None = None) -> tuple[SagePolicy, RunValue]:
    """The best policy SAGE's router can express on ``runs``, exactly: each of ``roles``' model as a
    function of (complexity, failure count) (``by_complexity``; else of the failure count alone). Per
    complexity, every choice over one role's failure counts is tried with the other role's fixed,
    from SAGE's YAML, role after role until no choice improves (the debugger's 2^5 and the reviewer's
    2^6 choices). A complexity SAGE computed for one task only is one cell: a decision tree on SAGE's
    two features can split there, so this is an upper bound on what a checkpoint could learn."""
    import itertools

    key = (lambda r: round(float(r["complexity"]), 6)) if by_complexity else (lambda r: None)
    groups: dict = {}
    for r in runs:
        groups.setdefault(key(r), []).append(r)
    table = table or world.table
    yaml = SagePolicy(table)

    def crit(v: RunValue) -> float:
        return v.ret if objective is None else v.objective(objective)

    choice: dict = {}
    for g, sub in groups.items():
        c = float(sub[0]["complexity"]) if by_complexity else 0.0
        cur = {(role, g, k): int(yaml.p_fallback(role, c, k) >= 0.5) for role in roles for k in ROUTED[role]}
        best_v = crit(policy_value(world, sub, _lookup_policy(table, cur, name, by_complexity)))
        for _ in range(4):
            improved = False
            for role in roles:
                for combo in itertools.product((0, 1), repeat=len(ROUTED[role])):
                    trial = cur | {(role, g, k): a for k, a in zip(ROUTED[role], combo, strict=True)}
                    v = crit(policy_value(world, sub, _lookup_policy(table, trial, name, by_complexity)))
                    if v > best_v + 1e-12:
                        cur, best_v, improved = trial, v, True
            if not improved:
                break
        choice.update(cur)
    pol = _lookup_policy(table, choice, name, by_complexity)
    return pol, policy_value(world, runs, pol)



def _lookup_policy(table: RoutingTable, choice: dict, name: str, by_complexity: bool) -> SagePolicy:
    return _LookupPolicy(table, None, 1.0, name, tuple(choice.items()), by_complexity)


def draw_run(world: ModelWorld, task: int, coder_model: str, complexity: float, policy: SagePolicy,
             rng: np.random.Generator, tests_at_start: bool = False) -> tuple[bool, list[float]]:
    """One run of the flow :func:`run_value` describes, drawn: (verified, the reviewer scores SAGE's
    workflow feeds the coder's bandit, in order). SAGE updates the bandit on every FAIL verdict and on
    the final PASS ("All gates passed"); a first PASS before tests exist, and a PASS whose file then
    fails verification, update nothing (``orchestrator/workflow.py`` verification_gate)."""
    c, table = world.config, policy.table
    rev = (table.routes["reviewer"].primary, table.routes["reviewer"].fallback)
    dbg = (table.routes["debugger"].primary, table.routes["debugger"].fallback)
    wrong = world.tasks[task].wrong_candidates()
    slot = -1 if rng.random() < world.p_code(task, coder_model) else int(rng.integers(len(wrong)))
    tests, k, rewards = bool(tests_at_start), 0, []

    def says_pass(k: int) -> bool:
        m = rev[int(rng.random() < policy.p_fallback("reviewer", complexity, k))]
        return (slot == -1) == (rng.random() < world.review_accuracy(task, m))

    while True:
        passed = says_pass(k)
        if passed and not tests:
            tests, passed = True, says_pass(k)
        if not passed:
            rewards.append(c.review_fail_score)
        elif slot == -1:
            rewards.append(c.review_pass_score)
            return True, rewards
        k += 1
        if k > MAX_RETRIES:
            return False, rewards
        m = dbg[int(rng.random() < policy.p_fallback("debugger", complexity, k))]
        if slot != -1 and rng.random() < world.p_fix(task, slot, m):
            slot = -1


def bundle_value(world: ModelWorld, runs: list[dict], bundle: BundleSpec, objective: TaskObjective,
                 draws: int = 64, seed: int = 0) -> BundleValue:
    """The value of ``bundle`` on ``runs`` (each ``{"task_id", "complexity"}``, optional ``worker``: the
    workspace, and ``tests_at_start``), the runs of a worker in list order, as SAGE would run them.

    The coder's model comes from the bundle's table through SAGE's UCB bandit, whose stats start each
    worker's day at ``bundle.bandit`` and move with the reviewer's scores: with a pinned coder the value
    is exact; otherwise the bandit's path is drawn ``draws`` times (each run's outcome drawn only to move
    the bandit) and, given each drawn sequence of coder models, each run's value is exact
    (:func:`run_value`): the mean over draws, with its standard error."""
    from sage_pipeline.sage import bandit_state

    if not runs:
        raise ValueError("bundle_value needs at least one run")
    cache: dict = {}

    def value(r: dict, model: str) -> RunValue:
        key = (r["task_id"], model, round(float(r["complexity"]), 9), bool(r.get("tests_at_start", False)))
        got = cache.get(key)
        if got is None:
            got = cache[key] = run_value(world, world.by_id[r["task_id"]], model, float(r["complexity"]),
                                         bundle.policy, bool(r.get("tests_at_start", False)))
        return got

    route = bundle.table.routes["coder"]
    pinned = bundle.pinned_coder
    n_draws = 1 if pinned is not None else int(draws)
    rng = np.random.default_rng(seed)
    per_draw, share = [], {}
    for _ in range(n_draws):
        stats: dict = {}
        vals = []
        for r in runs:
            w = r.get("worker", 0)
            if pinned is not None:
                model = pinned
            else:
                st = stats.setdefault(w, {k: dict(v) for k, v in (bundle.bandit or {}).items()})
                key = bandit_state.select(st, coder_candidates(bundle.table, float(r["complexity"])))
                model = route.primary if bandit_state.side_of(key) == "primary" else route.fallback
                _, rewards = draw_run(world, world.by_id[r["task_id"]], model, float(r["complexity"]), bundle.policy,
                                      rng, bool(r.get("tests_at_start", False)))
                for x in rewards:
                    bandit_state.update(st, key, x)
            share[model] = share.get(model, 0) + 1
            vals.append(value(r, model))
        per_draw.append(np.array([[*vars(v).values()] for v in vals]).mean(axis=0))
    arr = np.array(per_draw)
    mean = RunValue(*(float(x) for x in arr.mean(axis=0)))
    objs = np.array([objective.score(a[1], a[3], a[4]) for a in arr])
    se = float(objs.std(ddof=1) / np.sqrt(len(objs))) if len(objs) > 1 else 0.0
    total = sum(share.values())
    return BundleValue(bundle.name, mean, float(objs.mean()), se, {m: n / total for m, n in sorted(share.items())},
                       n_draws)


def best_bundle(world: ModelWorld, runs: list[dict], objective: TaskObjective, coder_models: tuple[str, ...],
                by_complexity: bool = False) -> tuple[BundleSpec, BundleValue, list[BundleValue]]:
    """The best bundle SAGE can run on ``runs`` among: the coder pinned to each of ``coder_models`` (by its
    models.yaml), with the reviewer's and debugger's models chosen per failure count (and complexity,
    ``by_complexity``) between their rows' two models by a checkpoint, all exactly, under ``objective``
    (:func:`best_expressible`). An upper bound on what the loop can deploy with SAGE's rows; rows with
    other models are not searched. Returns the best, its value and every candidate's value."""
    out = []
    for m in coder_models:
        table = pin(world.table, "coder", m)
        pinned_runs = [{**r, "coder_model": m} for r in runs]
        pol, _ = best_expressible(world, pinned_runs, by_complexity=by_complexity, name=f"best|coder={m}",
                                  table=table, objective=objective)
        spec = BundleSpec(pol, None, f"coder {m}, best routing")
        out.append((spec, bundle_value(world, runs, spec, objective)))
    best = max(out, key=lambda sv: sv[1].objective)
    return best[0], best[1], [v for _, v in out]


