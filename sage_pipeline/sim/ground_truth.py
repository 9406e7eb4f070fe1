"""Exact ground truth of the code-task simulator: the value of any policy and the optimal
(oracle) policy, by backward induction, for the simulator's known probabilities.

The simulator's state within an episode is (task, attempt t, primary failure count pfc,
last outcome kind): the success probability depends on the task, the model, t and the
last outcome; the prompt (so cost and latency) on t; the static table's trigger on pfc.
Everything an observation holds is a function of that state, so a policy's action
probabilities are evaluated state by state, for all tasks at once:

    Q_t(s, a) = sum_k P(k | s, a) * (r(k, s, a) + [k != pass and t + 1 < T] * V_{t+1}(s'(s, a, k)))
    Q_t(s, stop) = 0
    V_t(s) = sum_a pi(a | s) Q_t(s, a)        (policy evaluation)
    V*_t(s) = max_a Q*_t(s, a)                (optimal)

where ``P(k | s, a) = p * [k == reference's kind] + (1 - p) * share of wrong candidates of
kind k`` with ``p = CodeTaskSim.p_correct``, and ``s' = (t + 1, pfc + [a == primary], k)``.
The same recursion carries, besides the return, the expected pass indicator, cost, latency
and number of calls, so pass rate and mean cost are exact too. With T = 4 attempts there
are 46 states per task; a whole task set takes milliseconds plus 46 policy calls.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sage_pipeline.sim.env import LAST_OUTCOMES, PASS, CodeTaskObs, CodeTaskSim
from sage_pipeline.sim.obs import check_policy

CHANNELS = ("return", "pass_rate", "cost_usd", "latency_s", "calls")


@dataclass(frozen=True)
class PolicyValue:
    """Exact expectations per task (one row per task, one column per channel)."""

    name: str
    per_task: np.ndarray  # (N, len(CHANNELS))

    @property
    def value(self) -> float:
        return float(self.per_task[:, 0].mean())

    def mean(self, channel: str) -> float:
        return float(self.per_task[:, CHANNELS.index(channel)].mean())

    def summary(self) -> dict:
        return {"policy": self.name, "value": self.value, "pass_rate": self.mean("pass_rate"),
                "mean_cost_usd": self.mean("cost_usd"), "mean_latency_s": self.mean("latency_s"),
                "calls_per_task": self.mean("calls")}


def regret_closure(v_policy: float, v_static: float, v_oracle: float) -> float:
    """(V_policy - V_static) / (V_oracle - V_static): 1 is the oracle, 0 the table."""
    gap = v_oracle - v_static
    return float((v_policy - v_static) / gap) if gap > 1e-12 else float("nan")


class StaticTablePolicy:
    """SAGE's static table for the environment's role: the primary, or the fallback when
    a trigger fires (``task_complexity_score`` is the task's difficulty). It never stops."""

    name = "static_table"

    def __init__(self, sim: CodeTaskSim) -> None:
        self.sim, self.actions, self.role_mask = sim, sim.actions, sim.role_mask

    def choose(self, obs: CodeTaskObs) -> np.ndarray:
        fired = self.sim.table.fallback_fires(obs.role, obs.difficulty, obs.primary_failure_count, obs.failure_count)
        return np.where(fired, self.sim.fallback, self.sim.primary)

    def action_probs(self, obs: CodeTaskObs) -> np.ndarray:
        out = np.zeros((len(obs), len(self.actions)))
        out[np.arange(len(obs)), self.choose(obs)] = 1.0
        return out


class OraclePolicy:
    """The optimal policy: argmax of Q* at the observation's task and state."""

    name = "oracle"

    def __init__(self, gt: GroundTruth) -> None:
        self.gt, self.actions, self.role_mask = gt, gt.sim.actions, gt.sim.role_mask

    def action_probs(self, obs: CodeTaskObs) -> np.ndarray:
        q = self.gt.q_star()[obs.task, np.minimum(obs.step, self.gt.T - 1), obs.primary_failure_count,
                             obs.last_outcome]
        out = np.zeros((len(obs), len(self.actions)))
        out[np.arange(len(obs)), q.argmax(axis=1)] = 1.0
        return out


class GroundTruth:
    """Exact values on the simulator's tasks (all of them, or a subset per call)."""

    def __init__(self, sim: CodeTaskSim) -> None:
        self.sim, self.T, self.K = sim, sim.config.max_attempts, len(sim.actions)
        self._q_star: np.ndarray | None = None

    def _check(self, policy) -> None:
        check_policy(policy, self.sim.obs_spec, self.sim.actions)

    def _backward(self, task: np.ndarray, policy=None, keep_q: bool = False):
        """Returns the per-task channel expectations at the first attempt (N, C) and, with
        ``keep_q``, Q of the return channel (N, T, T, L, K) (-inf where a state cannot occur)."""
        sim, T, K, L, C = self.sim, self.T, self.K, len(LAST_OUTCOMES), len(CHANNELS)
        n = len(task)
        n_models = sim.stop
        is_fail = np.arange(len(LAST_OUTCOMES)) != PASS  # OUTCOME_KINDS order; kind k -> last k
        Q = np.full((n, T, T, L, K), -np.inf) if keep_q else None
        v_next = np.zeros((n, T + 1, L, C))
        for t in range(T - 1, -1, -1):
            v_t = np.zeros((n, T + 1, L, C))
            lasts = [0] if t == 0 else range(1, L)
            for pfc in range(t + 1):
                for last in lasts:
                    q = np.zeros((n, K, C))
                    step, lst = np.full(n, t), np.full(n, last)
                    for a in range(n_models):
                        m = np.full(n, a)
                        pk = sim.kind_probs(task, m, step, lst)  # (n, kinds)
                        cost, lat = sim.call_cost(task, m, step)
                        r = sim.reward(np.arange(pk.shape[1])[None, :], step[:, None], cost[:, None], lat[:, None])
                        imm = np.stack([r, np.broadcast_to(np.arange(pk.shape[1]) == PASS, r.shape),
                                        np.broadcast_to(cost[:, None], r.shape), np.broadcast_to(lat[:, None], r.shape),
                                        np.ones_like(r)], axis=2)  # (n, kinds, C)
                        if t + 1 < T:
                            nxt = v_next[:, pfc + (a == sim.primary)]  # (n, L, C): last index == kind index
                            imm = imm + is_fail[None, :, None] * nxt
                        q[:, a] = np.einsum("nk,nkc->nc", pk, imm)
                    if keep_q:
                        Q[:, t, pfc, last] = q[:, :, 0]
                    if policy is None:
                        probs = np.zeros((n, K))
                        probs[np.arange(n), q[:, :, 0].argmax(axis=1)] = 1.0
                    else:
                        obs = sim.observe(task, step, np.full(n, pfc), lst)
                        probs = np.asarray(policy.action_probs(obs), dtype=np.float64)
                        if probs.shape != (n, K) or not np.allclose(probs.sum(axis=1), 1.0, atol=1e-6):
                            raise ValueError(f"policy {getattr(policy, 'name', '?')!r} returned probabilities of "
                                             f"shape {probs.shape} not summing to 1; expected {(n, K)}")
                    v_t[:, pfc, last] = np.einsum("na,nac->nc", probs, q)
            v_next = v_t
        return v_next[:, 0, 0], Q

    def _task(self, task_idx) -> np.ndarray:
        return np.arange(len(self.sim)) if task_idx is None else np.asarray(task_idx, dtype=np.int64)

    def policy_value(self, policy, task_idx: np.ndarray | None = None) -> PolicyValue:
        """Exact expected return (and pass rate, cost, latency, calls) of ``policy`` per task."""
        self._check(policy)
        return PolicyValue(getattr(policy, "name", "policy"), self._backward(self._task(task_idx), policy)[0])

    def optimal_value(self, task_idx: np.ndarray | None = None) -> PolicyValue:
        return PolicyValue("oracle", self._backward(self._task(task_idx))[0])

    def q_star(self) -> np.ndarray:
        """Optimal Q of every task, (N, T, T, L, K), indexed [task, attempt, pfc, last outcome, action]."""
        if self._q_star is None:
            self._q_star = self._backward(np.arange(len(self.sim)), keep_q=True)[1]
        return self._q_star

    def oracle_policy(self) -> OraclePolicy:
        return OraclePolicy(self)

    def static_policy(self) -> StaticTablePolicy:
        return StaticTablePolicy(self.sim)

    def compare(self, policies: dict, task_idx: np.ndarray | None = None) -> list[dict]:
        """Exact summary rows for ``policies`` plus the table and the oracle, with regret closure."""
        vals = {"static_table": self.policy_value(self.static_policy(), task_idx),
                "oracle": self.optimal_value(task_idx)}
        vals |= {name: self.policy_value(p, task_idx) for name, p in policies.items()}
        vs, vo = vals["static_table"].value, vals["oracle"].value
        return [v.summary() | {"policy": name, "regret_closure": regret_closure(v.value, vs, vo)}
                for name, v in vals.items()]
