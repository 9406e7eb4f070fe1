"""The routing simulator: multi-step routing episodes with exact ground truth.

A task (role, complexity, prompt size) is attempted; each attempt is routed to a model.
The attempt times out with probability ``tau``; otherwise it passes verification with
probability ``p`` (a logistic function of the model's capability for the role minus the
task's complexity, helped by the error feedback of earlier failures and hurt by prompts
longer than the model's comfortable context). The reviewer score is Binomial(10, q)/10.
A failure increments the failure count (and the primary failure count if the role's
primary model failed) and the task is routed again, up to ``max_attempts``.

Because every probability is known, the simulator answers exactly:
``expected_reward(ctx, action)``, ``policy_value(policy, tasks)`` by backward induction
over the failure counts, and the optimal policy ``oracle_policy()``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.routing.catalogue import ModelCatalogue, known_tokens
from sage_pipeline.routing.features import Contexts
from sage_pipeline.routing.reward import RewardSpec, apply_version, sage_step_reward
from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN, ROLES
from sage_pipeline.sage.table import RoutingTable

# How often each role gets a task, and the Beta(a, b) of its complexity and the median
# prompt size of its tasks. Every role gets at least 11% so 5,000 episodes give each
# role well over 500 logged decisions.
ROLE_MIX = {
    #                 share  beta_a beta_b median_tokens
    "planner":          (0.12, 2.0, 2.0, 2500),
    "architect":        (0.11, 2.5, 2.0, 4000),
    "coder":            (0.18, 2.0, 2.0, 5000),
    "debugger":         (0.13, 2.5, 1.8, 7000),
    "reviewer":         (0.12, 2.0, 3.0, 6000),
    "test_engineer":    (0.12, 2.0, 2.5, 4000),
    "documentation":    (0.11, 1.5, 3.0, 9000),
    "memory_optimizer": (0.11, 1.5, 3.0, 12000),
}
SCORE_LEVELS = 10  # reviewer scores are k/10


class OutcomeSpec(BaseModel):
    """How attempts turn out: the success and timeout model and how prompts grow (the routing
    simulator's world, without its reward)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_attempts: int = Field(4, ge=1, le=10, description="attempts per task before the episode ends, in [1, 10]")
    sharpness: float = Field(8.0, description="slope of the success logit in (capability - complexity)")
    bias: float = Field(0.0, description="success logit when capability == complexity")
    retry_gain: float = Field(0.3, description="logit gained per earlier failure (error feedback)")
    context_penalty: float = Field(1.5, description="logit lost per doubling of the prompt past the model's "
                                   "comfortable context")
    prompt_growth_tokens: int = Field(800, description="tokens of error feedback added to the prompt per failure")
    tokens_sigma: float = Field(0.6, description="log-normal spread of prompt sizes")


class SimulatorConfig(OutcomeSpec):
    """The routing simulator: its outcome model and the reward it logs (the collector's
    manifest records it as ``to_dict()``)."""

    reward: RewardSpec = Field(default_factory=RewardSpec, description="the reward of each attempt")

    def to_dict(self) -> dict:
        return self.model_dump()


@dataclass(frozen=True)
class Tasks:
    """A batch of tasks (episodes): their fixed context at the first attempt."""

    role: np.ndarray  # int64
    task_complexity_score: np.ndarray  # float64
    prompt_tokens: np.ndarray  # float64, at the first attempt

    def __len__(self) -> int:
        return len(self.role)

    def take(self, idx: np.ndarray) -> "Tasks":
        return Tasks(self.role[idx], self.task_complexity_score[idx], self.prompt_tokens[idx])


VALUE_CHUNK = 50_000  # tasks valued at a time by policy_value / optimal_value (bounds memory)


@dataclass(frozen=True)
class PolicyValue:
    name: str
    per_task: np.ndarray  # exact expected return of each task

    @property
    def mean(self) -> float:
        return float(self.per_task.mean())

    def by_role(self, tasks: Tasks) -> dict[str, float]:
        return {r: float(self.per_task[tasks.role == i].mean()) for i, r in enumerate(ROLES)
                if (tasks.role == i).any()}


class RoutingSimulator:
    def __init__(self, catalogue: ModelCatalogue, table: RoutingTable,
                 config: SimulatorConfig = SimulatorConfig()) -> None:
        self.catalogue, self.table, self.config = catalogue, table, config
        catalogue.check_simulates()
        # the table's agent roles come first, in ROLES' order (RoutingTable.roles), so role indices agree;
        # roles past them (SAGE's shell_router and shell_chat: no task, no outcome) get no simulated tasks
        if table.roles[:len(catalogue.roles)] != catalogue.roles:
            raise ValueError(f"the routing simulator models the roles {', '.join(catalogue.roles)} (its catalogue "
                             f"{catalogue.source}); the table {table.source} routes {', '.join(table.roles)}: "
                             "simulate with a table that routes every one of those roles (it may route more, as "
                             "SAGE's own table does: those get no simulated tasks)")
        self.actions = catalogue.actions
        self.K = len(self.actions)
        self.role_mask = catalogue.role_mask()
        self.capability = np.nan_to_num(catalogue.capability_matrix(), nan=0.0)
        self.primary = table.primary_index(catalogue)
        self.timeout_rate = catalogue.array("timeout_rate")
        self.context_tokens = catalogue.array("context_tokens")

    # ---------------------------------------------------------------- tasks
    def sample_tasks(self, n: int, rng: np.random.Generator) -> Tasks:
        shares = np.array([ROLE_MIX[r][0] for r in ROLES])
        role = rng.choice(len(ROLES), size=n, p=shares / shares.sum())
        a = np.array([ROLE_MIX[r][1] for r in ROLES])[role]
        b = np.array([ROLE_MIX[r][2] for r in ROLES])[role]
        med = np.array([ROLE_MIX[r][3] for r in ROLES], dtype=np.float64)[role]
        complexity = np.round(rng.beta(a, b), 4)
        tokens = np.clip(np.round(med * np.exp(self.config.tokens_sigma * rng.standard_normal(n))), 200, 64000)
        return Tasks(role.astype(np.int64), complexity, tokens)

    def contexts(self, tasks: Tasks, step: np.ndarray, pfc: np.ndarray) -> Contexts:
        step = np.asarray(step, dtype=np.int64)
        return Contexts(
            role=tasks.role,
            task_complexity_score=tasks.task_complexity_score,
            prompt_tokens=tasks.prompt_tokens + self.config.prompt_growth_tokens * step,
            step=step,
            failure_count=step,
            primary_failure_count=np.asarray(pfc, dtype=np.int64),
        )

    def tasks_of(self, ctx: Contexts) -> Tasks:
        """Invert :meth:`contexts`: the task a decision context belongs to."""
        tokens0 = known_tokens(ctx.prompt_tokens) - self.config.prompt_growth_tokens * ctx.failure_count
        return Tasks(ctx.role, ctx.task_complexity_score, np.maximum(tokens0, 1.0))

    # ------------------------------------------------------ outcome model
    def outcome_probs(self, ctx: Contexts, action: np.ndarray) -> dict[str, np.ndarray]:
        """Per row: P(timeout), P(pass | no timeout), and the reviewer-score Binomial q's."""
        c = self.config
        a = np.asarray(action, dtype=np.int64)
        cap = self.capability[ctx.role, a]
        tokens = known_tokens(ctx.prompt_tokens)
        overflow = np.log2(np.maximum(tokens / self.context_tokens[a], 1.0))
        logit = c.sharpness * (cap - ctx.task_complexity_score) + c.bias \
            + c.retry_gain * ctx.failure_count - c.context_penalty * overflow
        p_pass = 1.0 / (1.0 + np.exp(-logit))
        tau = np.clip(self.timeout_rate[a] * tokens / 4000.0, 0.0, 0.5)
        q_pass = np.clip(0.5 + 0.45 * cap - 0.25 * ctx.task_complexity_score, 0.05, 0.97)
        return {"p_timeout": tau, "p_pass": p_pass, "q_pass": q_pass, "q_fail": 0.3 * q_pass}

    def _reward(self, score, verified, timed_out, ctx: Contexts, action: np.ndarray) -> np.ndarray:
        spec = self.config.reward
        r1 = sage_step_reward(score, verified, timed_out, ctx.step, spec)
        return apply_version(r1, self.catalogue.cost_usd(action, known_tokens(ctx.prompt_tokens)), spec)

    def expected_reward(self, ctx: Contexts, action: np.ndarray) -> np.ndarray:
        """Exact E[reward | context, action], enumerating every outcome (clamp included)."""
        action = np.asarray(action, dtype=np.int64)
        self._check_actions(ctx, action)
        pr = self.outcome_probs(ctx, action)
        n = len(ctx)
        k = np.arange(SCORE_LEVELS + 1)
        comb = np.array([math.comb(SCORE_LEVELS, int(i)) for i in k], dtype=np.float64)

        def pmf(q: np.ndarray) -> np.ndarray:  # (n, 11) Binomial(10, q)
            q = q[:, None]
            return comb * q ** k * (1.0 - q) ** (SCORE_LEVELS - k)

        rep = lambda x: np.repeat(np.asarray(x), SCORE_LEVELS + 1)  # noqa: E731
        big = ctx.take(np.repeat(np.arange(n), SCORE_LEVELS + 1))
        scores = np.tile(k / SCORE_LEVELS, n)
        r_pass = self._reward(scores, np.ones(len(big), bool), np.zeros(len(big), bool), big, rep(action))
        r_fail = self._reward(scores, np.zeros(len(big), bool), np.zeros(len(big), bool), big, rep(action))
        r_to = self._reward(np.zeros(n), np.zeros(n, bool), np.ones(n, bool), ctx, action)
        e_pass = (pmf(pr["q_pass"]) * r_pass.reshape(n, SCORE_LEVELS + 1)).sum(axis=1)
        e_fail = (pmf(pr["q_fail"]) * r_fail.reshape(n, SCORE_LEVELS + 1)).sum(axis=1)
        tau, p = pr["p_timeout"], pr["p_pass"]
        # a mixture of clamped rewards lies in the clamp; the clip only removes rounding error
        return np.clip(tau * r_to + (1.0 - tau) * (p * e_pass + (1.0 - p) * e_fail), REWARD_MIN, REWARD_MAX)

    def continue_prob(self, ctx: Contexts, action: np.ndarray) -> np.ndarray:
        """P(the episode goes on after this attempt) = P(not verified), 0 at the last attempt."""
        pr = self.outcome_probs(ctx, action)
        cont = 1.0 - (1.0 - pr["p_timeout"]) * pr["p_pass"]
        return np.where(ctx.step >= self.config.max_attempts - 1, 0.0, cont)

    def sample_outcome(self, ctx: Contexts, action: np.ndarray, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Draw one attempt's outcome per row; returns the logged fields and the reward."""
        action = np.asarray(action, dtype=np.int64)
        pr = self.outcome_probs(ctx, action)
        n = len(ctx)
        timed_out = rng.random(n) < pr["p_timeout"]
        verified = ~timed_out & (rng.random(n) < pr["p_pass"])
        q = np.where(verified, pr["q_pass"], pr["q_fail"])
        score = np.where(timed_out, 0.0, rng.binomial(SCORE_LEVELS, q) / SCORE_LEVELS)
        tokens = known_tokens(ctx.prompt_tokens)
        cost = self.catalogue.cost_usd(action, tokens)
        r1 = sage_step_reward(score, verified, timed_out, ctx.step, self.config.reward)
        return {
            "timed_out": timed_out, "verification_passed": verified, "reviewer_score": score,
            "cost_usd": cost, "latency_s": self.catalogue.latency_s(action, tokens),
            "reward_v1": r1, "reward": apply_version(r1, cost, self.config.reward),
        }

    # ------------------------------------------------------- ground truth
    def allowed(self, mask: np.ndarray | None = None) -> np.ndarray:
        """(simulated roles, K): the candidates that ``mask`` also allows (default: every candidate). A
        mask over the table's roles (an action space's: SAGE's table adds its shell roles after the
        simulated ones) is read on the simulated roles' rows."""
        if mask is None:
            return self.role_mask
        mask = np.asarray(mask, dtype=bool)
        if mask.ndim != 2 or mask.shape[0] < len(self.role_mask) or mask.shape[1] != self.K:
            raise ValueError(f"a mask of shape {mask.shape} does not cover the simulator's {len(self.role_mask)} "
                             f"roles x {self.K} models")
        return mask[:len(self.role_mask)] & self.role_mask

    def _check_actions(self, ctx: Contexts, action: np.ndarray) -> None:
        bad = ~self.role_mask[ctx.role, action]
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"model {self.actions[action[i]]!r} is not a candidate for role "
                             f"{ROLES[ctx.role[i]]!r} ({int(bad.sum())} rows)")

    def _backward(self, tasks: Tasks, policy, mask: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Backward induction over (attempt, primary failures).

        Returns Q of shape (N, T, T+1, K) (``-inf`` where undefined) and the value at the
        first attempt (N,). With ``policy=None`` the values are the optimal ones over the
        actions ``mask`` allows (default: every candidate; the sage_binary space passes its
        primary/fallback mask, giving the best binary policy).
        """
        n, T, K = len(tasks), self.config.max_attempts, self.K
        allowed = self.allowed(mask)
        Q = np.full((n, T, T + 1, K), -np.inf)
        v_next = np.zeros((n, T + 2))  # V_{t+1}(pfc) for pfc in 0..T+1
        for t in range(T - 1, -1, -1):
            v_t = np.zeros((n, T + 2))
            for pfc in range(t + 1):
                ctx = self.contexts(tasks, np.full(n, t), np.full(n, pfc))
                q = np.full((n, K), -np.inf)
                for a in range(K):
                    ok = allowed[tasks.role, a]
                    if not ok.any():
                        continue
                    sub = ctx.take(np.flatnonzero(ok))
                    acts = np.full(len(sub), a)
                    nxt = pfc + (self.primary[sub.role] == a)
                    cont = self.continue_prob(sub, acts)
                    q[ok, a] = self.expected_reward(sub, acts) + cont * v_next[ok, nxt]
                Q[:, t, pfc] = q
                if policy is None:
                    v_t[:, pfc] = q.max(axis=1)
                else:
                    if tuple(getattr(policy, "actions", self.actions)) != tuple(self.actions):
                        raise ValueError(f"policy {policy.name!r} orders its actions {tuple(policy.actions)}, the "
                                         f"simulator {tuple(self.actions)}: build it on the simulator's catalogue")
                    probs = policy.action_probs(ctx)
                    if (probs[~self.role_mask[tasks.role]] > 1e-9).any():
                        raise ValueError(f"policy {policy.name!r} puts mass on a model that is not a "
                                         "candidate for the role; the simulator cannot value it")
                    v_t[:, pfc] = (probs * np.where(np.isfinite(q), q, 0.0)).sum(axis=1)
            v_next = v_t
        return Q, v_next[:, 0]

    def _values(self, tasks: Tasks, policy, mask: np.ndarray | None = None) -> np.ndarray:
        """First-attempt values of every task, ``VALUE_CHUNK`` tasks at a time: each task's
        backward induction is its own, and the (N, T, T+1, K) Q array of all tasks at once
        would grow with the logs (3 GB at 2M tasks)."""
        if len(tasks) <= VALUE_CHUNK:
            return self._backward(tasks, policy, mask)[1]
        return np.concatenate([self._backward(tasks.take(np.arange(i, min(i + VALUE_CHUNK, len(tasks)))),
                                              policy, mask)[1] for i in range(0, len(tasks), VALUE_CHUNK)])

    def policy_value(self, policy, tasks: Tasks) -> PolicyValue:
        """Exact expected return of ``policy`` on each task (no sampling). This simulator's own
        :class:`OraclePolicy` is valued by one backward induction (its value is the optimum's), not
        by asking it for its actions, which takes one more induction per (attempt, failures) state."""
        if isinstance(policy, OraclePolicy) and policy.sim is self:
            return PolicyValue(policy.name, self._values(tasks, None, policy.mask))
        return PolicyValue(getattr(policy, "name", "policy"), self._values(tasks, policy))

    def optimal_value(self, tasks: Tasks, mask: np.ndarray | None = None) -> PolicyValue:
        return PolicyValue("oracle", self._values(tasks, None, mask))

    def q_star(self, tasks: Tasks, mask: np.ndarray | None = None) -> np.ndarray:
        """Optimal Q-values over the actions ``mask`` allows, (N, T, T+1, K)."""
        return self._backward(tasks, None, mask)[0]

    def oracle_policy(self, mask: np.ndarray | None = None) -> "OraclePolicy":
        """The optimal policy; with ``mask`` (e.g. the sage_binary mask) the optimum among it."""
        return OraclePolicy(self, mask)


class OraclePolicy:
    """The optimal policy of the simulator: argmax of Q* at the context's (attempt, pfc)."""

    name = "oracle"

    def __init__(self, sim: RoutingSimulator, mask: np.ndarray | None = None) -> None:
        self.sim = sim
        self.actions = sim.actions
        self.mask = mask
        self.role_mask = sim.allowed(mask)

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        T = self.sim.config.max_attempts
        Q = self.sim.q_star(self.sim.tasks_of(ctx), self.mask)
        t = np.minimum(ctx.failure_count, T - 1)
        pfc = np.minimum(ctx.primary_failure_count, t)
        q = Q[np.arange(len(ctx)), t, pfc]
        out = np.zeros((len(ctx), len(self.actions)))
        out[np.arange(len(ctx)), q.argmax(axis=1)] = 1.0
        return out
