"""Exact ground truth of the SAGE-loop simulator (:mod:`sage_pipeline.sim.loop_env`): the value of
any policy, the optimal (oracle) policy, and the best policies that ignore the feedback, by
exact enumeration -- no sampling.

**The state.** Within an episode the state is ``(task, c, j)``: ``c`` the calls made so far per
call action (a vector summing to at most the call budget; only vectors within the dollar and
seconds budgets are reachable) and ``j`` the current candidate (none yet, or one of the task's
wrong candidates). Every earlier call failed (a pass ends the episode), so the coders' chances
depend on ``c`` only, a repair's on ``j``; dollars, seconds and SAGE's trigger counts are
functions of ``c``. An observation is a function of the state, so a policy's action
probabilities are evaluated state by state, for all tasks at once.

**Backward induction** over the number of calls made, from the budget down to 0, with a call
``a`` from ``(c, j)`` leading to ``c + e_a`` (``Q = 0`` when ``c + e_a`` is over budget: the call
is not made and the episode ends, as ``stop``):

    Q(c, j, code m)  = p_m(c) R_pass + (1 - p_m(c)) * mean_{j' wrong} [R_fail(kind_j') + V(c + e_a, j')]
    Q(c, j, debug d) = r_d(j) R_pass + (1 - r_d(j)) [R_fail(kind_j) + V(c + e_a, j)]      (r_d(none) = 0)
    V(c, j) = sum_a pi(a | obs(c, j)) Q(c, j, a)      or  max_a Q(c, j, a)  (the oracle)

carrying, besides the return, the expected pass indicator, dollars, seconds and calls, so pass
rate and cost are exact too.

**Policies that ignore the feedback.** A policy that sees the task but not the feedback (which
wrong candidate it holds: its kind and tests passed) can only condition on the calls it has
made, all of them failed: it follows a fixed plan, a sequence of actions, until a pass, the
budget or its own stop. :meth:`LoopGroundTruth.best_blind` finds, per task, the best such plan
exactly, by enumerating every sequence (a tree of at most ``A^budget`` prefixes; along a prefix
the distribution of the hidden candidate is propagated exactly). It is an upper bound on every
feedback-blind policy, a learned one-step contextual bandit included; it also gives the best
one-step route and the best single arm per task (the same action at every call, or stop).
:meth:`LoopGroundTruth.plan_values` is every plan's value per task. Because these optima know
each task's own wrong candidates, :meth:`LoopGroundTruth.learned_blind` gives the same classes as
policies of what an agent sees of a task (its family and difficulty), fitted on train tasks.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import numpy as np

from sage_pipeline.sim.ground_truth import CHANNELS, PolicyValue, regret_closure
from sage_pipeline.sim.loop_env import NO_CANDIDATE, PASS, SageLoopSim
from sage_pipeline.sim.obs import LoopObs, check_policy

CHUNK = 256  # tasks per backward pass (memory: CHUNK x states x candidates x actions)


class StaticTablePolicy:
    """SAGE's table (:meth:`SageLoopSim.static_action`): never stops; the budget ends it."""

    name = "static_table"

    def __init__(self, sim: SageLoopSim) -> None:
        self.sim, self.actions, self.role_mask = sim, sim.actions, sim.role_mask

    def action_probs(self, obs: LoopObs) -> np.ndarray:
        out = np.zeros((len(obs), len(self.actions)))
        out[np.arange(len(obs)), self.sim.static_action(obs)] = 1.0
        return out


class OraclePolicy:
    """The optimal policy: argmax of Q* at the observation's task and state."""

    name = "oracle"

    def __init__(self, gt: LoopGroundTruth) -> None:
        self.gt, self.actions, self.role_mask = gt, gt.sim.actions, gt.sim.role_mask

    def action_probs(self, obs: LoopObs) -> np.ndarray:
        q = self.gt.q_star()[obs.task, self.gt.state_index(obs.counts), obs.candidate + 1]
        out = np.zeros((len(obs), len(self.actions)))
        out[np.arange(len(obs)), q.argmax(axis=1)] = 1.0
        return out


@dataclass(frozen=True)
class Plans:
    """Every fixed plan (a sequence of action indices, made until a pass; ``()`` stops at once)
    and its exact channels per task, with the classes it belongs to."""

    plans: list[tuple[int, ...]]
    values: np.ndarray  # (n tasks, plans, len(CHANNELS))
    route: np.ndarray  # (plans,) bool: a first call, then one action repeated until the end (or nothing)
    arm: np.ndarray  # (plans,) bool: one action repeated until the end


class LoopGroundTruth:
    """Exact values on the simulator's tasks (all of them, or a subset per call)."""

    def __init__(self, sim: SageLoopSim) -> None:
        self.sim = sim
        self.A, self.K, self.J = sim.n_calls, len(sim.actions), sim.W + 1
        b = sim.budget
        vecs = [c for c in itertools.product(range(b.calls + 1), repeat=self.A) if sum(c) <= b.calls]
        vecs = np.array(vecs, dtype=np.int64).reshape(-1, self.A)
        ok = (vecs @ sim.usd <= b.usd + 1e-9) & (vecs @ sim.seconds <= b.seconds + 1e-9)
        self.counts = vecs[ok]  # every reachable vector of calls per action
        self.level = self.counts.sum(axis=1)
        self._radix = (b.calls + 1) ** np.arange(self.A)
        self._lookup = np.full((b.calls + 1) ** self.A, -1, dtype=np.int64)
        self._lookup[self.counts @ self._radix] = np.arange(len(self.counts))
        nxt = self.counts[:, None, :] + np.eye(self.A, dtype=np.int64)[None]
        inside = (nxt <= b.calls).all(axis=2)
        self.succ = np.where(inside, self._lookup[np.minimum(nxt, b.calls) @ self._radix], -1)  # (S, A)
        self.succ[self.level >= b.calls] = -1
        self.has_code = self.counts[:, : sim.n_code].sum(axis=1) > 0
        self._q_star: np.ndarray | None = None

    @property
    def n_states(self) -> int:
        return len(self.counts)

    def state_index(self, counts: np.ndarray) -> np.ndarray:
        idx = self._lookup[np.asarray(counts) @ self._radix]
        if (idx < 0).any():
            raise ValueError(f"calls per action {np.asarray(counts)[np.argmax(idx < 0)].tolist()} are not a "
                             "reachable state (over the budget)")
        return idx

    def _check(self, policy) -> None:
        check_policy(policy, self.sim.obs_spec, self.sim.actions)

    def _task(self, task_idx) -> np.ndarray:
        return np.arange(len(self.sim)) if task_idx is None else np.asarray(task_idx, dtype=np.int64)

    # ------------------------------------------------------------------ immediate terms
    def _immediate(self, task: np.ndarray, a: int, level: int, kind: np.ndarray) -> np.ndarray:
        """(..., C) channels of one call's outcome: ``kind`` PASS, a failure kind or NO_CANDIDATE."""
        s = self.sim
        r = s.call_reward(np.full(kind.shape, a), kind, np.full(kind.shape, level))
        out = np.empty((*kind.shape, len(CHANNELS)))
        out[..., 0], out[..., 1] = r, kind == PASS
        out[..., 2], out[..., 3], out[..., 4] = s.usd[a], s.seconds[a], 1.0
        return out

    # ------------------------------------------------------------------ backward induction
    def _backward(self, task: np.ndarray, policy=None, keep_q: bool = False):
        """Per-task channel expectations at the start (n, C) and, with ``keep_q``, Q of the
        return channel (n, S, J, K)."""
        s, S, J, K, C = self.sim, self.n_states, self.J, self.K, len(CHANNELS)
        n = len(task)
        V = np.zeros((n, S, J, C))
        Q_all = np.zeros((n, S, J, K)) if keep_q else None
        nw = s.n_wrong[task].astype(np.float64)
        valid_w = np.arange(s.W)[None, :] < s.n_wrong[task][:, None]  # (n, W)
        kinds_w = s.wrong_kind[task]  # (n, W)
        for level in range(int(self.level.max()), -1, -1):
            idx = np.flatnonzero(self.level == level)
            m = len(idx)
            Q = np.zeros((n, m, J, K, C))
            pc = s.p_code(np.repeat(task, m), np.tile(self.counts[idx], (n, 1))).reshape(n, m, s.n_code)
            for a in range(self.A):
                succ = self.succ[idx, a]
                ok = succ >= 0
                if not ok.any():
                    continue
                vn = V[:, np.maximum(succ, 0)]  # (n, m, J, C) value after the call
                fail_w = self._immediate(task, a, level, kinds_w)  # (n, W, C)
                win = self._immediate(task, a, level, np.full(n, PASS))  # (n, C)
                if s.is_code[a]:
                    p = pc[:, :, a][:, :, None]  # (n, m, 1)
                    after = (fail_w[:, None] + vn[:, :, 1:]) * valid_w[:, None, :, None]  # (n, m, W, C)
                    fail = after.sum(axis=2) / nw[:, None, None]  # (n, m, C)
                    q = p * win[:, None] + (1 - p) * fail  # (n, m, C), the same for every candidate
                    Q[:, :, :, a] = q[:, :, None, :]
                else:
                    d = a - s.n_code
                    none = self._immediate(task, a, level, np.full(n, NO_CANDIDATE))  # (n, C)
                    Q[:, :, 0, a] = none[:, None] + vn[:, :, 0]
                    r = s.p_debug[task, :, d][:, None, :, None]  # (n, 1, W, 1)
                    Q[:, :, 1:, a] = r * win[:, None, None] + (1 - r) * (fail_w[:, None] + vn[:, :, 1:])
                Q[:, ~ok, :, a] = 0.0
            if keep_q:
                Q_all[:, idx] = Q[..., 0]
            if policy is None:
                probs = np.zeros((n, m, J, K))
                np.put_along_axis(probs, Q[..., 0].argmax(axis=3)[..., None], 1.0, axis=3)
            else:
                tt = np.repeat(task, m * J)
                cc = np.tile(np.repeat(self.counts[idx], J, axis=0), (n, 1))
                jj = np.tile(np.arange(J) - 1, n * m)
                jj = np.where(jj < s.n_wrong[tt], jj, -1)  # padded slots: any valid state (masked below)
                probs = np.asarray(policy.action_probs(s.observe(tt, cc, jj)), dtype=np.float64)
                if probs.shape != (n * m * J, K) or not np.allclose(probs.sum(axis=1), 1.0, atol=1e-6):
                    raise ValueError(f"policy {getattr(policy, 'name', '?')!r} returned probabilities of shape "
                                     f"{probs.shape} not summing to 1; expected {(n * m * J, K)}")
                probs = probs.reshape(n, m, J, K)
            V[:, idx] = np.einsum("nmjk,nmjkc->nmjc", probs, Q)
        return V[:, self._lookup[0], 0], Q_all

    def _chunked(self, task: np.ndarray, policy=None) -> np.ndarray:
        return np.concatenate([self._backward(task[i:i + CHUNK], policy)[0] for i in range(0, len(task), CHUNK)])

    def policy_value(self, policy, task_idx: np.ndarray | None = None) -> PolicyValue:
        """Exact expected return (and pass rate, dollars, seconds, calls) of ``policy`` per task."""
        self._check(policy)
        return PolicyValue(getattr(policy, "name", "policy"), self._chunked(self._task(task_idx), policy))

    def optimal_value(self, task_idx: np.ndarray | None = None) -> PolicyValue:
        return PolicyValue("oracle", self._chunked(self._task(task_idx)))

    def q_star(self) -> np.ndarray:
        """Optimal Q of every task, (N, S, J, K), indexed [task, state, candidate + 1, action]."""
        if self._q_star is None:
            task = np.arange(len(self.sim))
            self._q_star = np.concatenate([self._backward(task[i:i + CHUNK], keep_q=True)[1]
                                           for i in range(0, len(task), CHUNK)])
        return self._q_star

    def oracle_policy(self) -> OraclePolicy:
        return OraclePolicy(self)

    def static_policy(self) -> StaticTablePolicy:
        return StaticTablePolicy(self.sim)

    # ------------------------------------------------------------------ feedback-blind policies
    def plan_values(self, task_idx: np.ndarray | None = None) -> Plans:
        """Every fixed plan's exact channels on each task: a tree of at most ``A^budget``
        prefixes, each prefix a plan (make these calls until a pass, then stop); along a prefix
        the distribution of the hidden candidate is propagated exactly. ``CHUNK`` tasks at a time."""
        task = self._task(task_idx)
        parts = [self._plan_values(task[i:i + CHUNK]) for i in range(0, len(task), CHUNK)]
        return replace(parts[0], values=np.concatenate([p.values for p in parts]))

    def _plan_values(self, task: np.ndarray) -> Plans:
        s, n, C = self.sim, len(task), len(CHANNELS)
        valid_w = (np.arange(s.W)[None, :] < s.n_wrong[task][:, None]).astype(np.float64)
        kinds_w = s.wrong_kind[task]
        plans, values, route, arm = [()], [np.zeros((n, C))], [True], [True]  # the empty plan: stop at once
        # a node: (plan, state index, candidate distribution (n, J) still running, channels so far (n, C))
        pi0 = np.zeros((n, self.J))
        pi0[:, 0] = 1.0
        frontier = [((), self._lookup[0], pi0, np.zeros((n, C)))]
        while frontier:
            nodes = []
            for plan, st, pi, acc in frontier:
                level = int(self.level[st])
                for a in range(self.A):
                    nxt = self.succ[st, a]
                    if nxt < 0:
                        continue
                    win = self._immediate(task, a, level, np.full(n, PASS))
                    fail_w = self._immediate(task, a, level, kinds_w)  # (n, W, C)
                    new_pi = np.zeros_like(pi)
                    if s.is_code[a]:
                        p = s.p_code(task, np.broadcast_to(self.counts[st], (n, self.A)))[:, a]
                        alive = pi.sum(axis=1)
                        new_pi[:, 1:] = (alive * (1 - p) / s.n_wrong[task])[:, None] * valid_w
                        gain = (alive * p)[:, None] * win + (new_pi[:, 1:, None] * fail_w).sum(axis=1)
                    else:
                        r = s.p_debug[task, :, a - s.n_code] * valid_w  # (n, W)
                        none = self._immediate(task, a, level, np.full(n, NO_CANDIDATE))
                        new_pi[:, 0] = pi[:, 0]
                        new_pi[:, 1:] = pi[:, 1:] * (1 - r)  # a failed repair keeps its candidate
                        gain = (pi[:, 0, None] * none + (pi[:, 1:] * r).sum(axis=1)[:, None] * win
                                + (new_pi[:, 1:, None] * fail_w).sum(axis=1))
                    new_plan, new_acc = (*plan, a), acc + gain
                    last = self.succ[nxt, a] < 0  # the same action cannot follow: a repetition ends here
                    plans.append(new_plan)
                    values.append(new_acc)
                    # a one-step route: a first call, then one action repeated (or nothing) until the end
                    route.append(len(new_plan) == 1 or (len(set(new_plan[1:])) == 1 and bool(last)))
                    arm.append(len(set(new_plan)) == 1 and bool(last))  # one arm, repeated until the end
                    nodes.append((new_plan, nxt, new_pi, new_acc))
            frontier = nodes
        return Plans(plans, np.stack(values, axis=1), np.array(route), np.array(arm))

    def best_blind(self, task_idx: np.ndarray | None = None) -> tuple[dict[str, PolicyValue], list]:
        """Exact per-task optima of three feedback-blind policy classes, and the best plan per
        task (action names): ``best feedback-blind plan`` (any sequence, stopping anywhere),
        ``best one-step route`` (a first call, then one action repeated until the budget or a
        pass: one routing decision per task, as a contextual bandit makes it) and ``best single
        arm`` (one action repeated). Each knows the task's own wrong candidates (which kinds it
        can produce), which no policy that only observes the task's family and difficulty does:
        :meth:`learned_blind` is that policy."""
        pv = self.plan_values(task_idx)
        rows, out, names = np.arange(pv.values.shape[0]), {}, {}
        for name, member in (("best feedback-blind plan", np.ones(len(pv.plans), bool)),
                             ("best one-step route", pv.route), ("best single arm", pv.arm)):
            idx = np.flatnonzero(member)
            best = idx[pv.values[:, idx, 0].argmax(axis=1)]
            out[name] = PolicyValue(name, pv.values[rows, best])
            names[name] = [tuple(self.sim.actions[a] for a in pv.plans[b]) for b in best]
        # a route's name: its first call and the follow-up it repeats
        routes = [r[:2] for r in names["best one-step route"]]
        return out, {"plans": names["best feedback-blind plan"], "routes": routes}

    def learned_blind(self, train_idx: np.ndarray, test_idx: np.ndarray, bins: tuple[int, ...] = (1, 2, 4, 8),
                      folds: int = 5, seed: int = 0) -> dict[str, tuple[PolicyValue, dict]]:
        """The best one-step route and the best feedback-blind plan as policies that see only the
        task's observation (its family and difficulty), learned with full information on
        ``train_idx``: one plan per family and difficulty bin (quantile bins of the train tasks),
        the one with the highest mean exact value there; the number of bins chosen by
        ``folds``-fold cross-validation on the train tasks. Valued exactly on ``test_idx``.
        Returns ``{"learned one-step route" | "learned feedback-blind plan": (value, info)}``."""
        s = self.sim
        train, test = np.asarray(train_idx, dtype=np.int64), np.asarray(test_idx, dtype=np.int64)
        pv = self.plan_values(np.concatenate([train, test]))
        fold = np.random.default_rng(seed).integers(0, folds, len(train))
        held_out = [(np.flatnonzero(fold != f), np.flatnonzero(fold == f)) for f in range(folds)]

        def cell(tasks: np.ndarray, edges: np.ndarray) -> np.ndarray:  # family x difficulty bin
            return s.family[tasks] * (len(edges) + 1) + np.searchsorted(edges, s.difficulty[tasks])

        def fit(v: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, dict]:
            edges = np.quantile(s.difficulty[train[rows]], np.linspace(0, 1, k + 1)[1:-1])
            key = cell(train[rows], edges)
            best = {int(g): int(v[rows][key == g].mean(axis=0).argmax()) for g in np.unique(key)}
            return edges, best | {-1: int(v[rows].mean(axis=0).argmax())}  # -1: a cell no train task is in

        def choose(model: tuple[np.ndarray, dict], tasks: np.ndarray) -> np.ndarray:
            edges, best = model
            return np.array([best.get(int(g), best[-1]) for g in cell(tasks, edges)], dtype=np.int64)

        def cv_value(returns: np.ndarray, k: int) -> float:  # held-out folds' value of plans fitted on the rest
            return float(np.mean([returns[held, choose(fit(returns, rest, k), train[held])].mean()
                                  for rest, held in held_out if len(held)]))

        out = {}
        for name, cols in (("learned one-step route", np.flatnonzero(pv.route)),
                           ("learned feedback-blind plan", np.arange(len(pv.plans)))):
            v_train, v_test = pv.values[:len(train)][:, cols], pv.values[len(train):][:, cols]
            returns = v_train[:, :, 0]
            cv = {k: cv_value(returns, k) for k in bins}
            k = max(cv, key=cv.get)
            model = fit(returns, np.arange(len(train)), k)
            plans = sorted({tuple(s.actions[a] for a in pv.plans[cols[c]]) for c in set(model[1].values())})
            out[name] = (PolicyValue(name, v_test[np.arange(len(test)), choose(model, test)]),
                         {"bins": k, "cv_value": cv, "distinct_plans": plans})
        return out

    # ------------------------------------------------------------------ the comparison
    def compare(self, policies: dict, task_idx: np.ndarray | None = None, blind: bool = True,
                train_idx: np.ndarray | None = None) -> list[dict]:
        """Exact summary rows for ``policies`` plus the table, the oracle and (``blind``) the best
        feedback-blind plan, route and arm per task -- and, given ``train_idx``, the feedback-blind
        plan and route learned from the task's observation on those tasks (:meth:`learned_blind`)
        -- with regret closure."""
        task = self._task(task_idx)
        vals = {"static_table": self.policy_value(self.static_policy(), task), "oracle": self.optimal_value(task)}
        if blind:
            vals |= self.best_blind(task)[0]
            if train_idx is not None:
                vals |= {name: v for name, (v, _) in self.learned_blind(train_idx, task).items()}
        vals |= {name: self.policy_value(p, task) for name, p in policies.items()}
        vs, vo = vals["static_table"].value, vals["oracle"].value
        return [v.summary() | {"policy": name, "regret_closure": regret_closure(v.value, vs, vo)}
                for name, v in vals.items()]
