"""The SAGE-loop environment: multi-step coding episodes shaped like SAGE's coder / debugger
loop, with the sandbox's verified feedback, SAGE's own models and a per-task budget.

An episode is one task (a :class:`~sage_pipeline.sim.schema.TaskRecord` with its verified
wrong candidates). At each step the policy chooses one of

* ``code:<model>`` -- write a fresh candidate with that model;
* ``debug:<model>`` -- repair the current failing candidate given the sandbox's feedback on it
  (a debug call before any candidate exists returns nothing and costs the call);
* ``stop``.

The models are SAGE's (its ``models.yaml``: the coder row's primary and fallback, the debugger
row's primary and fallback, the frontier model), calibrated in
:mod:`sage_pipeline.sim.loop_config` from published pass rates (file
``sage_pipeline/sim/data/sage_loop.yaml``, every figure with its source).

**What a call produces.** A candidate is either the task's reference (it passes) or one of the
task's *verified wrong candidates* (``TaskRecord.wrong_candidates()``), whose outcome kind
(wrong_answer, exception, timeout, oom, killed) and tests passed / total are what the sandbox
recorded for it (the ``sandbox_rollouts`` shards, or the sandbox's ``run`` for what the shards
lack). So the feedback is a real sandbox result.

* ``code:m`` passes with the chance of a one-dimensional hardness model (item response in its
  simplest form): each task has a hidden hardness ``H ~ U(0, 1)``, shared by every model; model
  ``m`` reaches the task when ``H < s_m`` and then passes each attempt with chance ``q_m``,
  where ``s_m q_m = sigmoid(logit(humaneval_m) - slope (difficulty - ref) + family offset)``
  (its published HumanEval pass@1 at the reference difficulty) and ``q_m = max(retry_q,
  s_m q_m)``. The chance of the next attempt is the posterior one given the failed attempts
  so far (``calls`` per code action), so a task that one model failed is harder for all, and
  retrying the same model gains less each time (pass@k saturates, as published pass@10 / pass@1
  ratios do). Otherwise the candidate is one of the task's wrong ones, uniformly.
* ``debug:m`` on a candidate with feedback (kind ``k``, share ``t`` of tests passed) passes with
  chance ``sigmoid(debug_logit_m - slope (difficulty - ref) + family offset + kind_gain[k] +
  tests_gain (t - tests_ref))``, where ``debug_logit_m`` comes from the model's published Aider
  repair rate (second try after the failing tests' output). A failed repair leaves the
  candidate as it was.

**Budget.** Per task: ``calls``, ``usd`` and ``seconds`` (the config's ``budget``). A call that
would exceed any of them is not made and ends the episode (reward 0); so does ``stop``; a pass
ends it; so does using the last call.

**Reward** of a call (reward_v2's shape, as :mod:`sage_pipeline.sim.env`):

    r = clip(sage_step_reward(score = passed, verified = passed, timed_out = kind == timeout,
                              step = calls before this one)
             - cost_weight * usd - latency_weight * seconds, -2, 2)

i.e. 1.25 for a pass, -0.15 for a failure, -0.5 for a timeout, -0.1 per earlier call, minus the
call's dollars and latency (``reward_v1``: no dollar term).

**Observation** (:class:`~sage_pipeline.sim.obs.LoopObs`, encoded by ``ObsSpec.for_loop``): the
task's family (one-hot) and difficulty, the budget used (calls, dollars, seconds, as shares),
the feedback on the current candidate (its outcome kind, one-hot with ``none`` before the first
candidate, and the share of tests it passed) and the calls made so far per call action. The
state ``(task, calls per action, current candidate)`` is Markov; the observation is a function
of it, so :mod:`sage_pipeline.sim.loop_truth` values any policy exactly.

:class:`SageLoopVecEnv` is a :class:`gymnasium.vector.VectorEnv` (``autoreset_mode`` SAME_STEP,
numpy, one seeded generator); :class:`SageLoopEnv` is the single-episode ``gymnasium.Env`` on
the same transition.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import gymnasium as gym
import numpy as np

from sage_pipeline.routing.reward import RewardSpec, apply_version, sage_step_reward
from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN, ROLE_INDEX
from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sim.env import Executor, TaskOutcomes, TaskSimBase, TaskVecEnvBase, resolve_outcomes
from sage_pipeline.sim.loop_config import SageLoopConfig, SageLoopConfigError
from sage_pipeline.sim.obs import LAST_OUTCOMES, LoopObs, ObsSpec
from sage_pipeline.sim.schema import OUTCOME_KINDS, TaskRecord

STOP = "stop"
PASS, TIMEOUT = OUTCOME_KINDS.index("pass"), OUTCOME_KINDS.index("timeout")
NONE = 0  # LAST_OUTCOMES index of "no candidate yet"
NO_CANDIDATE = -2  # the outcome of a debug call made before any candidate exists (-1: no call made)
_EPS = 1e-9  # budget comparisons: a call that exactly fits is allowed


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class SageLoopSim(TaskSimBase):
    """The tasks, their verified wrong candidates and the calibrated models: everything an
    episode needs, as arrays. Build it with :meth:`build`."""

    def __init__(self, tasks: list[TaskRecord], outcomes: TaskOutcomes, config: SageLoopConfig,
                 table: RoutingTable, skipped: dict | None = None) -> None:
        c = self.config = config
        self.tasks, self.outcomes, self.table, self.skipped = tasks, outcomes, table, skipped or {}
        self.code_models, self.debug_models = c.code_models, c.debug_models
        self.call_actions = c.call_actions
        self.actions: tuple[str, ...] = (*self.call_actions, STOP)
        self.n_code, self.n_calls = len(self.code_models), len(self.call_actions)
        self.stop = self.n_calls
        self.role = ROLE_INDEX["coder"]
        self.is_code = np.arange(self.n_calls) < self.n_code
        roles = ["code"] * self.n_code + ["debug"] * len(self.debug_models)
        models = [*self.code_models, *self.debug_models]
        self.usd = np.array([c.usd_per_call(m, r) for m, r in zip(models, roles, strict=True)])
        self.seconds = np.array([c.models[m].latency_s for m in models])
        self.budget = c.budget
        self.reward_spec = RewardSpec(version=c.reward_version, cost_weight=c.cost_weight)
        self.families = tuple(sorted({t.family for t in tasks}))
        self.obs_spec = ObsSpec.for_loop(self.families, self.call_actions, max_count=c.budget.calls)
        fam = {f: i for i, f in enumerate(self.families)}
        self.family = np.array([fam[t.family] for t in tasks], dtype=np.int64)
        self.difficulty = np.array([t.difficulty for t in tasks], dtype=np.float64)
        bad = (self.difficulty < 0) | (self.difficulty > 1) | ~np.isfinite(self.difficulty)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"task {tasks[i].task_id!r}: field 'difficulty' is {self.difficulty[i]}, expected [0, 1]")
        self.split = np.array([t.split for t in tasks])
        self.n_wrong = outcomes.n_wrong
        self.W = outcomes.wrong_kind.shape[1]
        # the feedback a wrong candidate gives: its kind as a LAST_OUTCOMES index (== its OUTCOME_KINDS
        # index for a failure) and the share of tests it passed
        self.wrong_kind = np.where(outcomes.wrong_kind >= 0, outcomes.wrong_kind, NONE)
        self.wrong_tests = outcomes.wrong_tests_share
        a = c.assumed
        shift = -a["difficulty_slope"] * (self.difficulty - a["difficulty_ref"])
        shift = shift + np.array([a["family_offsets"].get(t.family, 0.0) for t in tasks])
        self._hardness_model(np.array([c.models[m].code_logit for m in self.code_models])[None, :] + shift[:, None],
                             a["retry_q"])
        gain = np.array([a["debug_kind_gain"][k] for k in LAST_OUTCOMES])
        dbg = np.array([c.models[m].debug_logit for m in self.debug_models])
        logit = (dbg[None, None, :] + shift[:, None, None] + gain[self.wrong_kind][:, :, None]
                 + a["debug_tests_gain"] * (self.wrong_tests - a["tests_ref"])[:, :, None])
        self.p_debug = _sigmoid(logit)  # (N, W, n_debug): a repair's chance per wrong candidate and debugger
        self._static_routes()
        self._tables()

    def _tables(self) -> None:
        """Lookup tables for the vector env's fast step (equal to p_code / call_reward: tested):
        the coders' chances per task and failed-attempt vector, the reward per call action,
        calls made and outcome kind (OUTCOME_KINDS, then NO_CANDIDATE last)."""
        calls = self.budget.calls
        self.fail_radix = (calls + 1) ** np.arange(self.n_code)
        combos = np.array([f for f in np.ndindex(*(calls + 1,) * self.n_code) if sum(f) <= calls], dtype=np.int64)
        self.fail_combo = np.full((calls + 1) ** self.n_code, -1, dtype=np.int64)
        self.fail_combo[combos @ self.fail_radix] = np.arange(len(combos))
        n, k = len(self.tasks), len(combos)
        counts = np.zeros((n * k, self.n_calls), dtype=np.int64)
        counts[:, :self.n_code] = np.tile(combos, (n, 1))
        self.p_code_table = self.p_code(np.repeat(np.arange(n), k), counts).reshape(n, k, self.n_code)
        kinds = np.array([*range(len(OUTCOME_KINDS)), NO_CANDIDATE])
        a, lv, kd = np.meshgrid(np.arange(self.n_calls), np.arange(calls + 1), kinds, indexing="ij")
        self.reward_table = self.call_reward(a.ravel(), kd.ravel(), lv.ravel()).reshape(a.shape)

    @classmethod
    def build(cls, tasks: Sequence[TaskRecord], rollouts, config: SageLoopConfig | None = None,
              table: RoutingTable | None = None, execute: Executor | None = None,
              log: Callable[[str], None] | None = None) -> SageLoopSim:
        """The simulator on ``tasks`` with their verified outcomes from ``rollouts`` (the
        ``sandbox_rollouts`` frame; what it lacks goes through ``execute``)."""
        config = config or SageLoopConfig.load()
        table = table or RoutingTable.load(config.routing_table)
        usable, outcomes, skipped = resolve_outcomes(tasks, rollouts, execute, log)
        keep = ~(outcomes.wrong_kind == PASS).any(axis=1)
        if not keep.all():  # a mutant that passed in the rollouts but not when sim_tasks verified it: flaky
            for i in np.flatnonzero(~keep):
                skipped[usable[i].task_id] = "a wrong candidate passed in the rollouts (not when sim_tasks verified it)"
            usable, outcomes = [t for t, k in zip(usable, keep, strict=True) if k], _subset(outcomes, keep)
        if not usable:
            raise ValueError(f"no usable task among {len(tasks)}: {dict(list(skipped.items())[:3])}")
        return cls(usable, outcomes, config, table, skipped)

    # ------------------------------------------------------------------ model
    def _hardness_model(self, logit: np.ndarray, retry_q: float) -> None:
        """Per task and coder: its reach ``s`` and per-attempt chance ``q`` (``s q`` = the pass
        chance of a first attempt), and the intervals of the hidden hardness the reaches cut."""
        p = _sigmoid(logit)  # (N, M) first-attempt chance
        self.q = np.maximum(retry_q, p)
        self.reach = p / self.q
        n, m = p.shape
        bounds = np.concatenate([np.zeros((n, 1)), np.sort(self.reach, axis=1), np.ones((n, 1))], axis=1)
        width = np.diff(bounds, axis=1)  # (N, M + 1) intervals [b_i, b_i+1)
        with np.errstate(divide="ignore"):
            self.log_width = np.log(width)
        # cover[n, i, m]: interval i lies below model m's reach (m can pass there)
        self.cover = (self.reach[:, None, :] >= bounds[:, 1:, None] - 1e-12).astype(np.float64)
        self.cover_log1mq = self.cover * np.log1p(-self.q)[:, None, :]

    def p_code(self, task: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """(n, n_code): each coder's chance that a fresh attempt passes, given the failed
        attempts so far (``counts[:, :n_code]``: all earlier calls failed, or the episode
        would have ended)."""
        fails = counts[:, :self.n_code].astype(np.float64)
        logw = self.log_width[task] + np.einsum("nim,nm->ni", self.cover_log1mq[task], fails)
        w = np.exp(logw - logw.max(axis=1, keepdims=True))
        return self.q[task] * np.einsum("ni,nim->nm", w, self.cover[task]) / w.sum(axis=1, keepdims=True)

    def call_reward(self, action: np.ndarray, kind: np.ndarray, calls_before: np.ndarray) -> np.ndarray:
        """The reward of a call (see the module docstring); ``kind`` is the outcome's
        OUTCOME_KINDS index (PASS on a pass; NO_CANDIDATE for a debug call without a candidate,
        a failed verification)."""
        passed, timed_out = kind == PASS, kind == TIMEOUT
        spec = self.reward_spec
        r1 = sage_step_reward(passed.astype(np.float64), passed, timed_out, calls_before, spec)
        return np.clip(apply_version(r1, self.usd[action], spec) - self.config.latency_weight * self.seconds[action],
                       REWARD_MIN, REWARD_MAX)

    def fits(self, counts: np.ndarray, action: np.ndarray) -> np.ndarray:
        """Whether ``action`` (a call) can be made within the budget after ``counts``."""
        calls = counts.sum(axis=1)
        b = self.budget
        return ((calls < b.calls) & (counts @ self.usd + self.usd[action] <= b.usd + _EPS)
                & (counts @ self.seconds + self.seconds[action] <= b.seconds + _EPS))

    def observe(self, task: np.ndarray, counts: np.ndarray, candidate: np.ndarray) -> LoopObs:
        task = np.asarray(task, dtype=np.int64)
        n = len(task)
        counts = np.broadcast_to(np.asarray(counts, dtype=np.int64), (n, self.n_calls))
        candidate = np.broadcast_to(np.asarray(candidate, dtype=np.int64), (n,))
        has = candidate >= 0
        slot = np.maximum(candidate, 0)
        b = self.budget
        return LoopObs(role=np.full(n, self.role, dtype=np.int64), task=task, family=self.family[task],
                       difficulty=self.difficulty[task], counts=counts, candidate=candidate,
                       last_outcome=np.where(has, self.wrong_kind[task, slot], NONE),
                       tests_passed=np.where(has, self.wrong_tests[task, slot], 0.0),
                       calls_used=counts.sum(axis=1) / b.calls, usd_used=(counts @ self.usd) / b.usd,
                       seconds_used=(counts @ self.seconds) / b.seconds, call_actions=self.call_actions)

    def transition(self, task: np.ndarray, counts: np.ndarray, candidate: np.ndarray, action: np.ndarray,
                   u: np.ndarray) -> dict[str, np.ndarray]:
        """One decision per row, driven by uniforms ``u`` (n, 2): pass or not, and which wrong
        candidate a failed fresh attempt produces. Returns the next counts and candidate, the
        reward, whether the episode ended, and what happened."""
        action = np.asarray(action, dtype=np.int64)
        n = len(task)
        if action.shape != (n,) or (action < 0).any() or (action > self.stop).any():
            raise ValueError(f"actions must be {(n,)} ints in [0, {self.stop}] ({', '.join(self.actions)})")
        call = action < self.stop
        a = np.where(call, action, 0)
        made = call & self.fits(counts, a)
        code = made & self.is_code[a]
        has = candidate >= 0
        slot = np.maximum(candidate, 0)
        p = np.zeros(n)
        if code.any():
            p[code] = np.take_along_axis(self.p_code(task[code], counts[code]), a[code, None], axis=1)[:, 0]
        dbg = made & ~self.is_code[a] & has
        if dbg.any():
            p[dbg] = self.p_debug[task[dbg], slot[dbg], a[dbg] - self.n_code]
        passed = made & (u[:, 0] < p)
        pick = np.minimum((u[:, 1] * self.n_wrong[task]).astype(np.int64), self.n_wrong[task] - 1)
        new_cand = np.where(code & ~passed, pick, candidate)
        kind = np.where(passed, PASS, np.where(new_cand >= 0, self.wrong_kind[task, np.maximum(new_cand, 0)],
                                               NO_CANDIDATE))
        calls_before = counts.sum(axis=1)
        reward = np.where(made, self.call_reward(a, kind, calls_before), 0.0)
        new_counts = counts.copy()
        new_counts[made, a[made]] += 1
        done = ~made | passed | (calls_before + made >= self.budget.calls)
        return {"counts": new_counts, "candidate": new_cand, "reward": reward, "done": done, "passed": passed,
                "made": made, "refused": call & ~made, "outcome": np.where(made, kind, -1),
                "cost_usd": np.where(made, self.usd[a], 0.0), "latency_s": np.where(made, self.seconds[a], 0.0)}

    # ------------------------------------------------------------------ SAGE's static table
    def _static_routes(self) -> None:
        """Each static role's (primary, fallback) as call actions, checked against the table."""
        c, self.static_routes = self.config, []
        for i, role in enumerate(c.static_roles):
            if role not in self.table.routes:
                raise SageLoopConfigError(c.source, f"static_roles[{i}]", f"role {role!r} is not routed by "
                                      f"{self.table.source} (it routes {', '.join(self.table.roles)})")
            kind = "code" if i == 0 else "debug"
            route = self.table.routes[role]
            cols = []
            for which in ("primary", "fallback"):
                name = f"{kind}:{getattr(route, which)}"
                if name not in self.call_actions:
                    raise SageLoopConfigError(c.source, f"actions.{kind}", f"{self.table.source} routes {role}.{which} "
                                          f"to {getattr(route, which)!r}, which is not a {kind} action "
                                          f"({', '.join(self.call_actions)})", "add the model to the actions")
                cols.append(self.call_actions.index(name))
            self.static_routes.append((role, *cols))

    def static_action(self, obs: LoopObs) -> np.ndarray:
        """SAGE's table: the first static role for the first call, then the next ones (the last
        repeating), each routed to its fallback when a trigger fires."""
        calls = obs.counts.sum(axis=1)
        out = np.zeros(len(obs), dtype=np.int64)
        for i, (role, primary, fallback) in enumerate(self.static_routes):
            last = i == len(self.static_routes) - 1
            rows = (calls == i) | ((calls > i) if last else np.zeros(len(obs), dtype=bool))
            if not rows.any():
                continue
            fired = self.table.fallback_fires(np.full(int(rows.sum()), self.table.roles.index(role)),
                                              obs.difficulty[rows], obs.counts[rows, primary], calls[rows])
            out[rows] = np.where(fired, fallback, primary)
        return out


def _subset(o: TaskOutcomes, keep: np.ndarray) -> TaskOutcomes:
    return TaskOutcomes(o.ref_kind[keep], o.wrong_kind[keep], o.n_wrong[keep],
                        [ids for ids, k in zip(o.wrong_ids, keep, strict=True) if k], o.executed,
                        o.wrong_tests_passed[keep], o.wrong_tests_total[keep])


# ---------------------------------------------------------------------- environments
class SageLoopVecEnv(TaskVecEnvBase):
    """``num_envs`` episodes stepped together with numpy: a Gymnasium ``VectorEnv`` with
    same-step autoreset (after a finished episode the returned observation is the next
    episode's first; ``infos["final_obs"]`` holds the finished one's last observation, rows
    flagged by ``infos["_final_obs"]``). Every end is a true terminal (the budget is part of the
    observed state); nothing is truncated. Tasks are drawn uniformly from ``task_idx``; one
    seeded generator drives tasks and outcomes (``reset(seed=...)`` re-seeds it).

    The step is :meth:`SageLoopSim.transition` on lookup tables indexed by the action (a row
    for ``stop`` holds zeros) and running totals per row (budget used, calls per action, the
    coders' failed-attempt key), and writes the encoding directly: the same episodes for the
    same uniforms (tested), in a few dozen numpy calls per step."""

    def __init__(self, sim: SageLoopSim, task_idx: np.ndarray | None = None, n_envs: int = 64, seed: int = 0):
        self._init_spaces(sim, task_idx, n_envs)
        self._tables()
        self._seed = seed
        self.rng = np.random.default_rng(seed)
        n = n_envs
        self.task, self.candidate = np.zeros(n, np.int64), np.full(n, -1, np.int64)
        self.counts = np.zeros((n, sim.n_calls), np.int64)
        self.used = np.zeros((n, 3))  # budget used: calls, dollars, seconds
        self.fail_key = np.zeros(n, np.int64)  # the coders' failed attempts, as an index of sim.fail_combo
        self.ep_return, self.ep_len = np.zeros(n), np.zeros(n, np.int64)
        self._rows = np.arange(n)
        self.reset()

    def _tables(self) -> None:
        """Per action (the last row ``stop``): what a call costs (calls, dollars, seconds), its
        calls-per-action increment and failed-attempt key increment; per task the coders' and
        debuggers' chances by action; the encoding's layout (equal to ObsSpec.encode: tested)."""
        s, b, K, A = self.sim, self.sim.budget, len(self.sim.actions), self.sim.n_calls
        self._cost = np.zeros((K, 3))
        self._cost[:A] = np.column_stack([np.ones(A), s.usd, s.seconds])
        self._limit = np.array([b.calls, b.usd + _EPS, b.seconds + _EPS])
        self._onehot = np.eye(K, A, dtype=np.int64)
        self._fail_inc = np.zeros(K, np.int64)
        self._fail_inc[:s.n_code] = s.fail_radix
        n_tasks, n_combo = s.p_code_table.shape[:2]
        self._p_code = np.zeros((n_tasks, n_combo, K))
        self._p_code[:, :, :s.n_code] = s.p_code_table
        self._p_debug = np.zeros((n_tasks, s.W + 1, K))  # slot 0: no candidate yet
        self._p_debug[:, 1:, s.n_code:A] = s.p_debug
        self._kind = np.zeros((n_tasks, s.W + 1), np.int64)  # the reward table's kind column per slot
        self._no_cand = s.reward_table.shape[2] - 1
        self._kind[:, 0] = self._no_cand
        self._kind[:, 1:] = s.wrong_kind
        self._reward = np.zeros((K, *s.reward_table.shape[1:]))
        self._reward[:A] = s.reward_table
        nf = len(s.families)
        self._static = np.zeros((n_tasks, nf + 1), dtype=np.float32)  # per task: family one-hot, difficulty
        self._static[np.arange(n_tasks), s.family] = 1.0
        self._static[:, nf] = s.difficulty
        self._tests = np.zeros((n_tasks, s.W + 1), dtype=np.float32)  # per slot: the share of tests passed
        self._tests[:, 1:] = s.wrong_tests
        self._last = np.zeros((n_tasks, s.W + 1), np.int64)  # per slot: the LAST_OUTCOMES column
        self._last[:, 1:] = s.wrong_kind
        self._c_used, self._c_counts, self._c_kind = nf + 1, nf + 5, nf + 5 + A
        self._inv = np.array([1.0 / b.calls, 1.0 / b.usd, 1.0 / b.seconds], dtype=np.float32)
        self._inv_count = np.float32(1.0 / s.obs_spec.max_count)

    def _new(self, rows: np.ndarray) -> None:
        self.task[rows] = self.task_idx[self.rng.integers(0, len(self.task_idx), size=len(rows))]
        self.counts[rows] = 0
        self.candidate[rows] = -1
        self.used[rows] = 0.0
        self.fail_key[rows] = 0
        self.ep_return[rows] = 0.0
        self.ep_len[rows] = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self._seed = seed
            self.rng = np.random.default_rng(seed)
        self._new(self._rows)
        return self.encode(self._rows), {}

    def set_state(self, rows: np.ndarray, counts: np.ndarray, candidate: np.ndarray) -> None:
        """Put ``rows`` in the state (calls per action, current candidate) of their task, as if
        those calls had failed: to replay a state or start from one."""
        s = self.sim
        self.counts[rows] = counts
        self.candidate[rows] = candidate
        self.used[rows] = self.counts[rows] @ self._cost[:s.n_calls]
        self.fail_key[rows] = self.counts[rows, :s.n_code] @ s.fail_radix

    def observe(self) -> LoopObs:
        return self.sim.observe(self.task, self.counts, self.candidate)

    def encode(self, rows: np.ndarray) -> np.ndarray:
        """The ObsSpec encoding of ``rows``' current states, written directly (no LoopObs)."""
        task, slot = self.task[rows], self.candidate[rows] + 1
        out = np.zeros((len(rows), self.obs_dim), dtype=np.float32)
        out[:, :self._c_used] = self._static[task]
        out[:, self._c_used:self._c_used + 3] = self.used[rows] * self._inv
        out[:, self._c_used + 3] = self._tests[task, slot]
        out[:, self._c_counts:self._c_kind] = self.counts[rows] * self._inv_count  # counts <= calls = max_count
        out[np.arange(len(rows)), self._c_kind + self._last[task, slot]] = 1.0
        return out

    def step(self, actions) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        s = self.sim
        a = np.asarray(actions, dtype=np.int64)
        if a.shape != (self.num_envs,) or a.min() < 0 or a.max() > s.stop:
            raise ValueError(f"actions must be {(self.num_envs,)} ints in [0, {s.stop}] ({', '.join(s.actions)})")
        u = self.rng.random((self.num_envs, 2))
        task, slot = self.task, self.candidate + 1
        cost = self._cost[a]
        made = (a < s.stop) & ((self.used + cost) <= self._limit).all(axis=1)
        p = self._p_code[task, s.fail_combo[self.fail_key], a] + self._p_debug[task, slot, a]
        passed = made & (u[:, 0] < p)
        nw = s.n_wrong[task]
        pick = np.minimum((u[:, 1] * nw).astype(np.int64), nw - 1)
        new_cand = np.where(made & ~passed & (a < s.n_code), pick, self.candidate)
        kind = np.where(passed, PASS, self._kind[task, new_cand + 1])
        calls = self.used[:, 0].astype(np.int64)
        reward = self._reward[a, calls, kind] * made
        self.counts += self._onehot[a] * made[:, None]
        self.used += cost * made[:, None]
        self.fail_key += self._fail_inc[a] * made
        self.candidate = new_cand
        done = ~made | passed | (calls + made >= s.budget.calls)
        self.ep_return += reward
        self.ep_len += 1
        outcome = np.where(made, np.where(kind == self._no_cand, NO_CANDIDATE, kind), -1)
        info = {"task": task.copy(), "outcome": outcome, "passed": passed, "refused": (a < s.stop) & ~made,
                "cost_usd": cost[:, 1] * made, "latency_s": cost[:, 2] * made,
                "episode_return": np.where(done, self.ep_return, np.nan),
                "episode_length": np.where(done, self.ep_len, 0)}
        obs = self.encode(self._rows)
        finished = np.flatnonzero(done)
        if len(finished):
            info["final_obs"], info["_final_obs"] = obs.copy(), done
            self._new(finished)
            obs[finished] = self.encode(finished)
        return obs, reward, done, np.zeros(self.num_envs, dtype=bool), info


class SageLoopEnv(gym.Env):
    """One episode at a time, the Gymnasium way (``reset(seed=...)``, ``step(action)``), on
    the same transition as :class:`SageLoopVecEnv`. ``reset(options={"task": i})`` replays task
    ``i``."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, sim: SageLoopSim, task_idx: np.ndarray | None = None) -> None:
        self.sim = sim
        self.task_idx = np.arange(len(sim)) if task_idx is None else np.asarray(task_idx, dtype=np.int64)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(sim.obs_spec.dim,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(len(sim.actions))
        self._state: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def _obs(self) -> np.ndarray:
        return self.sim.obs_spec.encode(self.sim.observe(*self._state))[0]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "task" in options:
            if not 0 <= int(options["task"]) < len(self.sim):
                raise ValueError(f"options['task'] = {options['task']} is not a task index (0..{len(self.sim) - 1})")
            task = np.array([int(options["task"])])
        else:
            task = self.np_random.choice(self.task_idx, size=1)
        self._state = (task, np.zeros((1, self.sim.n_calls), np.int64), np.full(1, -1, np.int64))
        return self._obs(), {"task_id": self.sim.tasks[int(task[0])].task_id}

    def step(self, action):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        task, counts, cand = self._state
        tr = self.sim.transition(task, counts, cand, np.array([int(action)]), self.np_random.random((1, 2)))
        done = bool(tr["done"][0])
        self._state = (task, tr["counts"], tr["candidate"])
        obs = self._obs()
        k = int(tr["outcome"][0])
        info = {"outcome": OUTCOME_KINDS[k] if k >= 0 else ("no_candidate" if k == NO_CANDIDATE else STOP),
                "passed": bool(tr["passed"][0]), "refused": bool(tr["refused"][0]),
                "cost_usd": float(tr["cost_usd"][0]), "latency_s": float(tr["latency_s"][0])}
        if done:
            self._state = None
        return obs, float(tr["reward"][0]), done, False, info
