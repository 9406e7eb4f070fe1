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
from sage_pipeline.sage.table import RoutingTable
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


def run_value(world: ModelWorld, task: int, coder_model: str, complexity: float, policy: SagePolicy,
              tests_at_start: bool = False) -> RunValue:
    """The exact expected outcome of one `sage run` of ``task`` whose coder used ``coder_model``;
    ``tests_at_start``: the workspace already held the task's tests (an earlier run of the same task
    there), so SAGE's gate asks no test engineer."""
    c = world.config
    rev_pri, rev_fb = world.row("reviewer")
    dbg = world.row("debugger")
    acc = {}
    for k in range(MAX_RETRIES + 1):
        q = policy.p_fallback("reviewer", complexity, k)
        acc[k] = (1 - q) * world.review_accuracy(task, rev_pri) + q * world.review_accuracy(task, rev_fb)
    p_dbg = {k: policy.p_fallback("debugger", complexity, k) for k in range(1, MAX_RETRIES + 1)}

    def fail_credit(k: int) -> float:
        return c.review_fail_score - 0.15 - (0.1 if k >= MAX_RETRIES else 0.0)

    def unreviewed_credit(k: int) -> float:
        if k == 0:
            return 0.0  # the coder's decision has no row: no verdict was ever logged for it
        return -0.1 if k >= MAX_RETRIES else -0.15

    zero = (0.0, 0.0, 0.0)

    def mix(p: float, x: tuple, y: tuple) -> tuple:  # p x + (1 - p) y, on (return, verified, debug calls)
        return (p * x[0] + (1 - p) * y[0], p * x[1] + (1 - p) * y[1], p * x[2] + (1 - p) * y[2])

    def plus(x: tuple, y: tuple) -> tuple:
        return (x[0] + y[0], x[1] + y[1], x[2] + y[2])

    @lru_cache(maxsize=None)
    def debug(k: int, slot: int, tests: bool) -> tuple:
        """(return, verified, debug calls) from the k-th debugger call on the file in ``slot``."""
        if k > MAX_RETRIES:
            return zero
        out = zero
        for model, w in ((dbg[0], 1 - p_dbg[k]), (dbg[1], p_dbg[k])):
            if w == 0:
                continue
            p = world.p_fix(task, slot, model)
            v = mix(p, review(k, -1, tests), review(k, slot, tests) if slot != -1 else zero)
            out = plus(out, (w * v[0], w * v[1], w * v[2]))
        return plus(out, (0.0, 0.0, 1.0))

    @lru_cache(maxsize=None)
    def review(k: int, slot: int, tests: bool) -> tuple:
        """From a file just written at failure count k, reviewed next."""
        right = slot == -1
        pp = acc[k] if right else 1 - acc[k]
        nxt = (lambda t: debug(k + 1, slot, t)) if k < MAX_RETRIES else (lambda t: zero)
        fail = (fail_credit(k), 0.0, 0.0)
        verify = ((c.review_pass_score + 0.25, 1.0, 0.0) if right
                  else plus((unreviewed_credit(k), 0.0, 0.0), nxt(True)))
        after_tests = mix(pp, verify, plus(fail, nxt(True)))
        if tests:
            return after_tests
        return mix(pp, after_tests, plus(fail, nxt(False)))  # the first PASS: tests written, reviewed again

    n_wrong = len(world.tasks[task].wrong_candidates())
    p = world.p_code(task, coder_model)
    t0 = bool(tests_at_start)
    wrong = zero
    for w in range(n_wrong):
        wrong = plus(wrong, review(0, w, t0))
    v = mix(p, review(0, -1, t0), (wrong[0] / n_wrong, wrong[1] / n_wrong, wrong[2] / n_wrong))
    return RunValue(float(v[0]), float(v[1]), float(v[2]))


def policy_value(world: ModelWorld, runs: list[dict], policy: SagePolicy) -> RunValue:
    """The mean exact value over ``runs`` (each ``{"task_id", "coder_model", "complexity"}``)."""
    if not runs:
        return RunValue(float("nan"), float("nan"), float("nan"))
    vals = np.array([[*vars(run_value(world, world.by_id[r["task_id"]], r["coder_model"], r["complexity"],
                                      policy, r.get("tests_at_start", False))).values()] for r in runs])
    m = vals.mean(axis=0)
    return RunValue(float(m[0]), float(m[1]), float(m[2]))


ROUTED = {"debugger": tuple(range(1, MAX_RETRIES + 1)), "reviewer": tuple(range(0, MAX_RETRIES + 1))}


def best_expressible(world: ModelWorld, runs: list[dict], by_complexity: bool = True,
                     roles: tuple[str, ...] = ("debugger", "reviewer"),
                     name: str = "best_expressible") -> tuple[SagePolicy, RunValue]:
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
    yaml = SagePolicy(world.table)
    choice: dict = {}
    for g, sub in groups.items():
        c = float(sub[0]["complexity"]) if by_complexity else 0.0
        cur = {(role, g, k): int(yaml.p_fallback(role, c, k) >= 0.5) for role in roles for k in ROUTED[role]}
        best_v = policy_value(world, sub, _lookup_policy(world.table, cur, name, by_complexity)).ret
        for _ in range(4):
            improved = False
            for role in roles:
                for combo in itertools.product((0, 1), repeat=len(ROUTED[role])):
                    trial = cur | {(role, g, k): a for k, a in zip(ROUTED[role], combo, strict=True)}
                    v = policy_value(world, sub, _lookup_policy(world.table, trial, name, by_complexity)).ret
                    if v > best_v + 1e-12:
                        cur, best_v, improved = trial, v, True
            if not improved:
                break
        choice.update(cur)
    pol = _lookup_policy(world.table, choice, name, by_complexity)
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
