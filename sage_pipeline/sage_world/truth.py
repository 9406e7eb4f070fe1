"""The exact value of a routing policy SAGE's router can serve, in the model world.

A policy is what SAGE's ``ModelRouter.select`` does with a checkpoint (or with none: its YAML):
:class:`SagePolicy` gives P(fallback | role, task_complexity_score, failure count) exactly, through
the same rule the propensity reconstruction uses (``sage_explore.choice_distribution``: every draw
of an exploring checkpoint, the confidence floor, the YAML branch).

For one ``sage run`` (a task, the model SAGE's UCB bandit gave the coder, the task's complexity as
SAGE computed it) the value is an expectation over SAGE's control flow after every patch
(``orchestrator/workflow.py`` verification_gate / debug_agent / circuit_breaker, ``max_retries`` 5):

* the file just written at failure count k is reviewed by the reviewer the policy routes at k
  (right verdict with the world's accuracy for that model); a FAIL credits the pending decision
  ``fail_score - 0.15`` (and the retry_limit breaker's -0.1 at k = 5);
* a first PASS without tests: the world's test engineer writes them and the reviewer reviews again;
* a PASS with tests runs SAGE's verification: a right file credits ``pass_score + 0.25`` and ends
  the task; a wrong one fails verification without a verdict (-0.15 to a debugger's decision when
  the next debugger step shows it, -0.1 at k = 5 by the breaker; the coder's decision then has no
  row, as the routing dataset reads the journals);
* then the debugger at k + 1 (routed by the policy) repairs with the world's chance, up to k = 5.

That is the routing dataset's reward_v1 per decision (``routing_dataset.sage_workflow_decisions``,
``reward.sage_composite_reward``), summed over the task's decisions: the episode return the
offline evaluation's headline estimator targets. The chance that the task ends verified and the
expected number of debugger calls come from the same recursion. Only the debugger's and the
reviewer's choices change what the world does (the planner's and test engineer's answers do not
depend on their model): every other role's routing is left out of the value.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

import joblib
import numpy as np

from sage_pipeline.sage import checkpoint as sage_router, explore as sage_explore
from sage_pipeline.sage.objective import TaskObjective
from sage_pipeline.sage.table import RoutingTable, pin
from sage_pipeline.sage_world.world import MAX_RETRIES, ModelWorld


@dataclass(frozen=True)
class SagePolicy:
    """SAGE's router with ``models`` (a checkpoint's classifiers by role; None: YAML only) at floor
    ``min_confidence``, over ``table``."""

    table: RoutingTable
    models: dict | None = None
    min_confidence: float = 0.55
    name: str = "yaml"

    @classmethod
    def load(cls, table: RoutingTable, checkpoint: str | Path, min_confidence: float | None = None,
             name: str | None = None) -> SagePolicy:
        """The policy SAGE runs with ``SAGE_RL_CHECKPOINT=checkpoint`` (folder or policy.joblib) and
        ``SAGE_RL_MIN_CONFIDENCE=min_confidence`` (default: the manifest's)."""
        folder = sage_router._folder(checkpoint)
        obj = joblib.load(folder / sage_router.JOBLIB_NAME)
        floor = sage_router.read_manifest(folder).get("min_confidence", 0.55) if min_confidence is None \
            else min_confidence
        return cls(table, dict(obj["models"]), float(floor), name or str(folder))

    def p_fallback(self, role: str, complexity: float, failure_count: int) -> float:
        route = self.table.routes[role]
        if route.primary == route.fallback:
            return 0.0
        yfb = bool(sage_router.yaml_fallback(route, complexity, failure_count)[0])
        if self.models is None:
            return float(yfb)
        x = np.array([[float(complexity), float(failure_count)]])
        dist = sage_explore.choice_distribution(self.models.get(role), x, self.min_confidence)
        return float(dist.p_fallback(np.array([yfb]))[0])


@dataclass(frozen=True)
class RunValue:
    ret: float  # expected episode return (reward_v1 summed over the run's decisions)
    p_verified: float  # chance the task ends verified
    debug_calls: float  # expected debugger calls
    gpu_seconds: float = 0.0  # expected GPU-seconds of the run's calls (the world's call_seconds)
    usd: float = 0.0  # expected dollars of the run's calls to API models
    calls: float = 0.0  # expected model calls (planner, coder, reviewer, test engineer, debugger)

    def objective(self, objective: TaskObjective) -> float:
        """The expected per-task objective: linear in the outcome, so the expectation is exact."""
        return float(objective.score(self.p_verified, self.gpu_seconds, self.usd))


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


@dataclass(frozen=True)
class _LookupPolicy(SagePolicy):
    choices: tuple = ()  # (((role, complexity or None, failure count), 0 primary / 1 fallback), ...)
    by_complexity: bool = True

    @cached_property
    def _table(self) -> dict:
        return dict(self.choices)

    def p_fallback(self, role: str, complexity: float, failure_count: int) -> float:
        g = round(float(complexity), 6) if self.by_complexity else None
        got = self._table.get((role, g, int(failure_count)))
        if got is not None:
            return float(got)
        return SagePolicy.p_fallback(self, role, complexity, failure_count)


# ------------------------------------------------------------------ bundles: every lever SAGE runs unchanged
@dataclass(frozen=True)
class BundleSpec:
    """A deployment bundle as the truth sees it: SAGE's router over the bundle's models.yaml (``policy``:
    its checkpoint, or its YAML alone) and the coder bandit's stats at the start of each workspace's day
    (``bandit``: None is SAGE's fresh workspace, no stats)."""

    policy: SagePolicy
    bandit: dict | None = None
    name: str = "bundle"

    @property
    def table(self) -> RoutingTable:
        return self.policy.table

    @property
    def pinned_coder(self) -> str | None:
        """The coder's model whatever its bandit chooses (the table's coder primary == fallback), else None."""
        r = self.table.routes["coder"]
        return r.primary if r.primary == r.fallback else None


@dataclass(frozen=True)
class BundleValue:
    """A bundle's value over some runs under an objective: the mean outcome per run (``value``: exact
    given the coder's models), the objective's mean and its standard error over the bandit's draws (0
    when the coder's model is pinned: then everything is exact), and each coder model's share of runs."""

    name: str
    value: RunValue
    objective: float
    objective_se: float
    coder_share: dict
    draws: int

    def as_dict(self) -> dict:
        return {"name": self.name, **vars(self.value), "objective": self.objective,
                "objective_se": self.objective_se, "coder_share": self.coder_share, "draws": self.draws}


def coder_candidates(table: RoutingTable, complexity: float) -> list[str]:
    """The strategy keys SAGE's coder offers its bandit (``agents/coder.py``): all four, or the two
    fallback keys when the coder's YAML triggers fire (the coder is called at failure count 0)."""
    from sage_pipeline.sage import bandit_state

    fires = bool(sage_router.yaml_fallback(table.routes["coder"], complexity, 0)[0])
    return list(bandit_state.FALLBACK_KEYS if fires else bandit_state.KEYS)


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


def front(world: ModelWorld, runs: list[dict], coder_models: tuple[str, ...],
          gpu_second_weights: tuple[float, ...] = (0.0, 1 / 36000, 1 / 3600, 1 / 600, 1 / 60)) -> list[dict]:
    """The front of verified share against GPU-seconds per task: for each coder model and each price on
    GPU time, the best routing by failure count (exact); the points no other point beats on both."""
    pts = []
    for lam in gpu_second_weights:
        obj = TaskObjective(gpu_second_weight=lam, usd_weight=0.0)
        for m in coder_models:
            table = pin(world.table, "coder", m)
            pol, v = best_expressible(world, [{**r, "coder_model": m} for r in runs], by_complexity=False,
                                      name=f"front|coder={m}|w={lam:.3g}", table=table, objective=obj)
            pts.append({"coder": m, "gpu_second_weight": lam, "verified": v.p_verified, "gpu_seconds": v.gpu_seconds,
                        "calls": v.calls})
    keep = [p for p in pts if not any(q["verified"] >= p["verified"] and q["gpu_seconds"] <= p["gpu_seconds"]
                                      and (q["verified"] > p["verified"] or q["gpu_seconds"] < p["gpu_seconds"])
                                      for q in pts)]
    uniq = {(round(p["verified"], 9), round(p["gpu_seconds"], 6)): p for p in keep}
    return sorted(uniq.values(), key=lambda p: p["gpu_seconds"])
