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
depend on their model); the planner's and the test engineer's routing enter through their calls'
cost only, every other role's not at all.

**How it is computed.** :func:`run_values` values many runs at once: the recursion runs from the
last failure count back on numpy arrays (the runs; each wrong candidate of a run's task; in
:func:`best_expressible`, every choice of one role's models over the failure counts), and a policy
is asked once for all the states it decides (:meth:`SagePolicy.p_fallbacks`: an exploring
checkpoint's classifiers once per call, not once per state). Each number goes through the same float
operations in the same order as the one-run recursion this replaced (kept as the reference in
``sage_pipeline_tests/sage_world/truth_reference.py``), so the values are the same to the last bit,
and the bandit's draws consume the same random numbers: a seed gives the same draws.
``benchmarks/sage_truth_speed.py`` times both on the loop's 7 days x 100 runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
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
        return float(self._router_p_fallbacks(role, np.array([float(complexity)]), np.array([failure_count]))[0])

    def p_fallbacks(self, role: str, complexity: np.ndarray, failure_count: np.ndarray) -> np.ndarray:
        """:meth:`p_fallback` of every state (``complexity[i]``, ``failure_count[i]``) at once: the
        checkpoint's classifiers are asked once for all of them (each row's answer is the one a single
        row gets). A subclass that overrides only :meth:`p_fallback` is asked state by state."""
        c, k = np.asarray(complexity, dtype=np.float64), np.asarray(failure_count)
        if type(self).p_fallback is not SagePolicy.p_fallback:
            return _state_by_state(self, role, c, k)
        return self._router_p_fallbacks(role, c, k)

    def _router_p_fallbacks(self, role: str, c: np.ndarray, k: np.ndarray) -> np.ndarray:
        """SAGE's ``ModelRouter.select`` over the states: YAML, or the classifier at the floor
        (``sage_explore.choice_distribution``: every draw of an exploring checkpoint)."""
        route = self.table.routes[role]
        if route.primary == route.fallback:
            return np.zeros(len(c))
        yfb = sage_router.yaml_fallback(route, c, k)
        if self.models is None:
            return yfb.astype(np.float64)
        x = np.column_stack([c, k.astype(np.float64)])
        return sage_explore.choice_distribution(self.models.get(role), x, self.min_confidence).p_fallback(yfb)


def _state_by_state(policy: SagePolicy, role: str, c: np.ndarray, k: np.ndarray) -> np.ndarray:
    return np.array([policy.p_fallback(role, float(a), int(b)) for a, b in zip(c, k, strict=True)], dtype=np.float64)


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

    @classmethod
    def of(cls, row) -> RunValue:
        return cls(*(float(x) for x in row))


# ------------------------------------------------------------------ the recursion, over many runs at once
K = MAX_RETRIES + 1  # failure counts 0..MAX_RETRIES
FLOW_ROLES = ("reviewer", "debugger", "test_engineer", "planner")  # the roles whose routing the value reads


class _Flow:
    """What the recursion reads of the world for some runs under one table: per run its task's
    chances (the coder's first file, the reviewer row's accuracy, the debugger row's repairs of each
    wrong candidate) and its coder call's cost; computed once, valued under any number of policies."""

    def __init__(self, world: ModelWorld, table: RoutingTable, task: np.ndarray, coder: list[str],
                 tests: np.ndarray) -> None:
        self.world, self.table = world, table
        self.task, self.tests = np.asarray(task, dtype=np.int64), np.asarray(tests, dtype=bool)
        n = len(self.task)
        self.p_code = np.array([world.p_coder(int(t), m) for t, m in zip(self.task, coder, strict=True)])
        self.n_wrong = np.array([len(world.tasks[int(t)].wrong_candidates()) for t in self.task], dtype=np.int64)
        if n and self.n_wrong.min() == 0:
            bad = world.tasks[int(self.task[int(np.argmin(self.n_wrong))])].task_id
            raise ValueError(f"task {bad} has no wrong candidates: the world's truth needs at least one (build the "
                             "world with build_world, which keeps only tasks with verified wrong candidates)")
        self.width = int(self.n_wrong.max()) if n else 0
        rev = self.row("reviewer")
        self.accuracy = tuple(np.array([world.review_accuracy(int(t), m) for t in self.task]) for m in rev)
        self._costs: dict = {}
        self._fix: dict = {}
        secs = {m: world.call_seconds("coder", m) for m in dict.fromkeys(coder)}
        usd = {m: world.call_usd("coder", m) for m in secs}
        self.coder_call = np.zeros((n, 6))
        self.coder_call[:, 3] = [secs[m] for m in coder]
        self.coder_call[:, 4] = [usd[m] for m in coder]
        self.coder_call[:, 5] = 1.0

    def row(self, role: str) -> tuple[str, str]:
        r = self.table.routes[role]
        return (r.primary, r.fallback)

    def call(self, agent: str, model: str) -> np.ndarray:
        """(return, verified, debug calls, GPU-seconds, dollars, calls) of one call."""
        got = self._costs.get((agent, model))
        if got is None:
            got = self._costs[agent, model] = np.array([0.0, 0.0, 0.0, self.world.call_seconds(agent, model),
                                                        self.world.call_usd(agent, model), 1.0])
        return got

    def p_fix(self, model: str) -> np.ndarray:
        """(n, width): ``model``'s chance of repairing each wrong candidate of each run's task (0 past its last)."""
        got = self._fix.get(model)
        if got is None:
            got = self._fix[model] = np.zeros((len(self.task), self.width))
            for i, t in enumerate(self.task):
                for w in range(self.n_wrong[i]):
                    got[i, w] = self.world.p_fix(int(t), w, model)
        return got


def _mix(p: np.ndarray | float, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """p x + (1 - p) y, ``p`` one number per outcome vector (vectors on the last axis)."""
    p = np.asarray(p, dtype=np.float64)[..., None]
    return p * x + (1.0 - p) * y


def _values(flow: _Flow, q: dict[str, np.ndarray]) -> np.ndarray:
    """The expected outcome vector (return, verified, debug calls, GPU-seconds, dollars, calls) of each
    of ``flow``'s runs, (*lead, n, 6), where ``q[role]`` (*lead, n, K) is P(the role's fallback) at each
    failure count (``lead``: policies valued side by side). SAGE's flow as the module doc says, from the
    last failure count back: ``right[k][tests]`` / ``wrong[k][tests]`` from a file written at failure
    count k (right, or each wrong candidate: the axis before the vector) reviewed next, ``fix_*`` from the
    k-th debugger call. Each number is the same sequence of float operations the one-run recursion
    makes (sage_pipeline_tests/sage_world/truth_reference.py), so the values agree to the last bit."""
    c = flow.world.config
    dbg = flow.row("debugger")
    zero = np.zeros(6)

    def vec(ret: float = 0.0, verified: float = 0.0, debug_calls: float = 0.0) -> np.ndarray:
        return np.array([ret, verified, debug_calls, 0.0, 0.0, 0.0])

    def routed_call(role: str, k: int) -> np.ndarray:
        p = q[role][..., k]
        pri, fb = flow.row(role)
        return _mix(p, flow.call(role, fb), flow.call(role, pri)) if np.any(p) else \
            np.broadcast_to(flow.call(role, pri), p.shape + (6,))

    def fail_credit(k: int) -> float:
        return c.review_fail_score - 0.15 - (0.1 if k >= MAX_RETRIES else 0.0)

    def unreviewed_credit(k: int) -> float:
        if k == 0:
            return 0.0  # the coder's decision has no row: no verdict was ever logged for it
        return -0.1 if k >= MAX_RETRIES else -0.15

    right: dict = {}
    wrong: dict = {}
    fix_right: dict = {(K, t): zero for t in (True, False)}  # past the last debugger call: nothing more
    fix_wrong: dict = dict(fix_right)
    for k in range(MAX_RETRIES, -1, -1):
        qr = q["reviewer"][..., k]
        acc = (1 - qr) * flow.accuracy[0] + qr * flow.accuracy[1]
        rev_call, te_call = routed_call("reviewer", k), routed_call("test_engineer", k)
        fail = vec(fail_credit(k))
        for t in (True, False):
            # a right file: a PASS (with tests) ends the task verified
            after = _mix(acc, vec(c.review_pass_score + 0.25, 1.0), fail + fix_right[k + 1, True])
            right[k, t] = rev_call + (after if t else _mix(acc, te_call + rev_call + after,
                                                           fail + fix_right[k + 1, False]))
            # a wrong file: a PASS (with tests) fails verification, unreviewed; the debugger is next
            verify = vec(unreviewed_credit(k)) + fix_wrong[k + 1, True]
            after = _mix((1 - acc)[..., None], verify, fail + fix_wrong[k + 1, True])
            wrong[k, t] = rev_call[..., None, :] + (
                after if t else _mix((1 - acc)[..., None], te_call[..., None, :] + rev_call[..., None, :] + after,
                                     fail + fix_wrong[k + 1, False]))
        if k == 0:
            break
        qd = q["debugger"][..., k]
        for t in (True, False):
            out_r = out_w = vec(debug_calls=1.0)
            for model, w in ((dbg[0], 1 - qd), (dbg[1], qd)):
                if not np.any(w):
                    continue  # never this model here: adding its zero-weighted branch would change nothing
                cost = flow.call("debugger", model)
                out_r = out_r + w[..., None] * (_mix(1.0, right[k, t], zero) + cost)
                v = _mix(flow.p_fix(model), right[k, t][..., None, :], wrong[k, t])
                out_w = out_w + w[..., None, None] * (v + cost)
            fix_right[k, t], fix_wrong[k, t] = out_r, out_w
    tests = flow.tests
    first_right = np.where(tests[:, None], right[0, True], right[0, False])
    first_wrong = np.where(tests[:, None, None], wrong[0, True], wrong[0, False])
    mean_wrong = zero
    for w in range(flow.width):  # in slot order, as the one-run sum
        mean_wrong = mean_wrong + np.where((w < flow.n_wrong)[:, None], first_wrong[..., w, :], 0.0)
    mean_wrong = (1.0 / flow.n_wrong)[:, None] * mean_wrong
    return _mix(flow.p_code, first_right, mean_wrong) + flow.coder_call + routed_call("planner", 0)


def _choice_probs(policy: SagePolicy, complexity: np.ndarray) -> dict[str, np.ndarray]:
    """P(fallback) of each role the value reads, (n, K): for each run's complexity and failure count,
    the policy asked once per distinct complexity."""
    uniq, inv = np.unique(np.asarray(complexity, dtype=np.float64), return_inverse=True)
    c, k = np.repeat(uniq, K), np.tile(np.arange(K), len(uniq))
    return {role: policy.p_fallbacks(role, c, k).reshape(len(uniq), K)[inv] for role in FLOW_ROLES}


def _field(runs: list[dict], name: str, why: str) -> list:
    """Each run's ``name``; a run without it is an error naming the run."""
    out = []
    for i, r in enumerate(runs):
        v = r.get(name)
        if v is None:
            raise ValueError(f"run {i}: no {name!r} ({why}); value only runs that have one (loop._runs_for_truth)")
        out.append(v)
    return out


def _complexities(runs: list[dict]) -> np.ndarray:
    return np.array([float(c) for c in _field(runs, "complexity", "the task_complexity_score SAGE logged")])


def _flow_of(world: ModelWorld, runs: list[dict], table: RoutingTable, coder: list[str] | None = None) -> _Flow:
    task = []
    for i, tid in enumerate(_field(runs, "task_id", "the world's task it ran")):
        if tid not in world.by_id:
            raise ValueError(f"run {i}: task {tid!r} is not one of the world's {len(world.tasks)} tasks: value runs "
                             "against the world they ran in")
        task.append(world.by_id[tid])
    coder = coder if coder is not None else _field(runs, "coder_model", "the model SAGE's bandit gave the coder")
    return _Flow(world, table, np.array(task, dtype=np.int64), coder,
                 np.array([bool(r.get("tests_at_start", False)) for r in runs], dtype=bool))


def run_values(world: ModelWorld, runs: list[dict], policy: SagePolicy) -> np.ndarray:
    """(n, 6): :func:`run_value` of each of ``runs`` (each ``{"task_id", "coder_model", "complexity"}``,
    optional ``tests_at_start``), the columns RunValue's fields in order; all runs at once."""
    if not runs:
        return np.zeros((0, 6))
    flow = _flow_of(world, runs, policy.table)
    return _values(flow, _choice_probs(policy, _complexities(runs)))


def run_value(world: ModelWorld, task: int, coder_model: str, complexity: float, policy: SagePolicy,
              tests_at_start: bool = False) -> RunValue:
    """The exact expected outcome of one `sage run` of ``task`` whose coder used ``coder_model``;
    ``tests_at_start``: the workspace already held the task's tests (an earlier run of the same task
    there), so SAGE's gate asks no test engineer. The rows of the reviewer, debugger, planner and test
    engineer are ``policy.table``'s (a bundle's models.yaml may change them); each call costs the
    world's ``call_seconds`` and ``call_usd`` of its agent and model."""
    flow = _Flow(world, policy.table, np.array([task]), [coder_model], np.array([bool(tests_at_start)]))
    return RunValue.of(_values(flow, _choice_probs(policy, np.array([float(complexity)])))[0])


def _mean(vals: np.ndarray) -> RunValue:
    """The mean of (n, 6) run values, summed as the per-run rows always were (row after row)."""
    return RunValue.of(np.ascontiguousarray(vals).mean(axis=0))


def policy_value(world: ModelWorld, runs: list[dict], policy: SagePolicy) -> RunValue:
    """The mean exact value over ``runs`` (each ``{"task_id", "coder_model", "complexity"}``)."""
    if not runs:
        return RunValue(*([float("nan")] * 6))
    return _mean(run_values(world, runs, policy))


ROUTED = {"debugger": tuple(range(1, MAX_RETRIES + 1)), "reviewer": tuple(range(0, MAX_RETRIES + 1))}


def best_expressible(world: ModelWorld, runs: list[dict], by_complexity: bool = True,
                     roles: tuple[str, ...] = ("debugger", "reviewer"),
                     name: str = "best_expressible", table: RoutingTable | None = None,
                     objective: TaskObjective | None = None) -> tuple[SagePolicy, RunValue]:
    """The best policy SAGE's router can express on ``runs``, exactly: each of ``roles``' model as a
    function of (complexity, failure count) (``by_complexity``; else of the failure count alone). Per
    complexity, every choice over one role's failure counts is tried with the other role's fixed,
    from SAGE's YAML, role after role until no choice improves (the debugger's 2^5 and the reviewer's
    2^6 choices, each role's valued side by side). A complexity SAGE computed for one task only is one
    cell: a decision tree on SAGE's two features can split there, so this is an upper bound on what a
    checkpoint could learn."""
    import itertools

    _complexities(runs)  # every run has one
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
        flow = _flow_of(world, sub, table)
        base = _choice_probs(yaml, _complexities(sub))
        best_v = crit(_mean(_values(flow, _choices(base, cur, g, roles))[0]))
        for _ in range(4):
            improved = False
            for role in roles:
                # the role's choices tried with the others' fixed: this pass's trials, valued side by side
                combos = list(itertools.product((0, 1), repeat=len(ROUTED[role])))
                vals = _values(flow, _choices(base, cur, g, roles, role, combos))
                for combo, v in zip(combos, vals, strict=True):
                    v = crit(_mean(v))
                    if v > best_v + 1e-12:
                        cur = cur | {(role, g, k): a for k, a in zip(ROUTED[role], combo, strict=True)}
                        best_v, improved = v, True
            if not improved:
                break
        choice.update(cur)
    pol = _lookup_policy(table, choice, name, by_complexity)
    return pol, policy_value(world, runs, pol)


def _choices(base: dict[str, np.ndarray], cur: dict, g, roles: tuple[str, ...], searched: str | None = None,
             combos: list[tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """The P(fallback) arrays of :func:`_values` for lookup policies: ``base`` (SAGE's YAML, (n, K)) with
    each of ``roles`` on its choices in ``cur`` (group ``g``), ``searched`` on each of ``combos`` instead:
    (len(combos) or 1, n, K) per role."""
    q = dict(base)
    for role in roles:
        bits = (np.array(combos, dtype=np.float64) if role == searched
                else np.array([[cur[role, g, k] for k in ROUTED[role]]], dtype=np.float64))
        arr = np.broadcast_to(base[role], (len(bits),) + base[role].shape).copy()
        arr[..., list(ROUTED[role])] = bits[:, None, :]
        q[role] = arr
    return q


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

    def p_fallbacks(self, role: str, complexity: np.ndarray, failure_count: np.ndarray) -> np.ndarray:
        c, k = np.asarray(complexity, dtype=np.float64), np.asarray(failure_count)
        if type(self).p_fallback is not _LookupPolicy.p_fallback:
            return _state_by_state(self, role, c, k)
        got = [self._table.get((role, round(float(a), 6) if self.by_complexity else None, int(b)))
               for a, b in zip(c, k, strict=True)]
        out = np.array([np.nan if x is None else float(x) for x in got], dtype=np.float64)
        miss = np.isnan(out)
        if miss.any():  # a state the table does not name: SAGE's router (the YAML here)
            out[miss] = self._router_p_fallbacks(role, c[miss], k[miss])
        return out


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
    q = _choice_probs(policy, np.array([float(complexity)]))
    return _draw(world, policy.table, task, coder_model, q["reviewer"][0].tolist(), q["debugger"][0].tolist(), rng,
                 tests_at_start)


def _draw(world: ModelWorld, table: RoutingTable, task: int, coder_model: str, q_rev: list[float],
          q_dbg: list[float], rng: np.random.Generator, tests_at_start: bool) -> tuple[bool, list[float]]:
    """:func:`draw_run` given the reviewer's and the debugger's P(fallback) at each failure count (the
    draws, in the same order whatever the probabilities: a seed gives the same runs)."""
    c = world.config
    rev = (table.routes["reviewer"].primary, table.routes["reviewer"].fallback)
    dbg = (table.routes["debugger"].primary, table.routes["debugger"].fallback)
    n_wrong = len(world.tasks[task].wrong_candidates())
    slot = -1 if rng.random() < world.p_coder(task, coder_model) else int(rng.integers(n_wrong))
    tests, k, rewards = bool(tests_at_start), 0, []

    def says_pass(k: int) -> bool:
        m = rev[int(rng.random() < q_rev[k])]
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
        m = dbg[int(rng.random() < q_dbg[k])]
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
    (:func:`run_value`, every run under each coder model valued once): the mean over draws, with its
    standard error."""
    from sage_pipeline.sage import bandit_state

    if not runs:
        raise ValueError("bundle_value needs at least one run")
    route = bundle.table.routes["coder"]
    pinned = bundle.pinned_coder
    n = len(runs)
    cx = _complexities(runs)
    q = _choice_probs(bundle.policy, cx)
    models = (pinned,) if pinned is not None else tuple(dict.fromkeys((route.primary, route.fallback)))
    exact = {m: _values(_flow_of(world, runs, bundle.table, [m] * n), q) for m in models}
    n_draws = 1 if pinned is not None else int(draws)
    rng = np.random.default_rng(seed)
    if pinned is None:  # what each draw reads, once
        cands = [coder_candidates(bundle.table, c) for c in cx.tolist()]
        q_rev, q_dbg = q["reviewer"].tolist(), q["debugger"].tolist()
        task = [world.by_id[r["task_id"]] for r in runs]
        tests = [bool(r.get("tests_at_start", False)) for r in runs]
    per_draw, share = [], {}
    for _ in range(n_draws):
        stats: dict = {}
        pick = [pinned] * n
        if pinned is None:
            for i, r in enumerate(runs):
                w = r.get("worker", 0)
                st = stats.setdefault(w, {k: dict(v) for k, v in (bundle.bandit or {}).items()})
                key = bandit_state.select(st, cands[i])
                model = pick[i] = route.primary if bandit_state.side_of(key) == "primary" else route.fallback
                _, rewards = _draw(world, bundle.table, task[i], model, q_rev[i], q_dbg[i], rng, tests[i])
                for x in rewards:
                    bandit_state.update(st, key, x)
        vals = np.empty((n, 6))
        for m in models:
            got = np.array([p == m for p in pick])
            vals[got] = exact[m][got]
            share[m] = share.get(m, 0) + int(got.sum())
        per_draw.append(vals.mean(axis=0))
    arr = np.array(per_draw)
    mean = RunValue(*(float(x) for x in arr.mean(axis=0)))
    objs = np.array([objective.score(a[1], a[3], a[4]) for a in arr])
    se = float(objs.std(ddof=1) / np.sqrt(len(objs))) if len(objs) > 1 else 0.0
    total = sum(share.values())
    return BundleValue(bundle.name, mean, float(objs.mean()), se,
                       {m: k / total for m, k in sorted(share.items()) if k}, n_draws)


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
