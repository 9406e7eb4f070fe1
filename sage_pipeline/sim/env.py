"""The code-task environment: multi-step escalation episodes over the coding-task simulator.

An episode is one task (a :class:`~sage_pipeline.sim.schema.TaskRecord`). At each step the
policy chooses one of the role's candidate models (the model catalogue's candidates for
``coder``) or ``stop``. The chosen simulated model produces a candidate solution: the
task's reference with probability

    p = sigmoid(sharpness * (capability - difficulty) + bias
                + retry_gain * failure_count + feedback_gain[last_outcome]
                - context_penalty * log2(max(1, prompt_tokens / context_tokens)))

(the routing simulator's success model, with the task's difficulty as its complexity and
a gain for informative feedback: a failing test or a traceback helps the next attempt more
than a timeout does), otherwise one of the task's verified wrong candidates
(``TaskRecord.wrong_candidates()``), uniformly. What that candidate does when run is what
the sandbox verified: its outcome kind (pass, wrong_answer, exception, timeout, oom,
killed) comes from the execution cache (the ``sandbox_rollouts`` shards), and a candidate
not in the cache goes through the sandbox (``execute``, the sandbox's ``run``) once, when
the environment is built. A pass ends the episode; any other outcome is a failure and the
task is attempted again, up to ``max_attempts``. ``stop`` ends the episode with reward 0.

Observations (:class:`CodeTaskObs`, encoded by :class:`ObsSpec`): task family (one-hot),
difficulty, prompt size (``log1p(tokens) / log1p(65536)``, the prompt growing by
``feedback_tokens`` per failure), attempt index, failure count, primary failure count
(the static table's trigger variable) and the last outcome kind (one-hot; ``none`` at
the first attempt).

Reward of an attempt (consistent with :mod:`sage_pipeline.routing.reward`):

    r1 = sage_step_reward(reviewer_score = 1 if passed else 0, verification_passed = passed,
                          timed_out = outcome == "timeout", step = attempt index)
       = 1.25 on a pass, -0.15 on any other failure, -0.5 on a timeout, minus 0.1 per earlier attempt
    r  = clip(apply_version(r1, cost_usd) - latency_weight * latency_s, -2, 2)

where ``apply_version`` subtracts ``cost_weight * cost_usd`` for ``reward_v2`` (the
default: 5 reward units per USD) and nothing for ``reward_v1``, and ``cost_usd`` and
``latency_s`` are the catalogue's for the model at the current prompt size. A sandbox
verdict stands in for the reviewer: a candidate that passes every test scores 1.

:class:`CodeTaskVecEnv` steps a batch of episodes with numpy: a ``gymnasium.vector.VectorEnv``
(same-step autoreset, one seeded generator: the same seed and actions give the same episodes);
:class:`CodeTaskEnv` is the single-episode Gymnasium environment on the same transition.
Ground truth (exact values, the oracle) is in :mod:`sage_pipeline.sim.ground_truth`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space
from pydantic import BaseModel, ConfigDict, Field, field_validator

from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.features import log_tokens, scaled_count
from sage_pipeline.routing.reward import RewardSpec, RewardVersion, apply_version, sage_step_reward
from sage_pipeline.routing.schema import REWARD_MAX, REWARD_MIN, ROLE_INDEX, ROLES
from sage_pipeline.sage.table import RoutingTable
from sage_pipeline.sim.obs import LAST_OUTCOMES, CodeTaskObs, ObsSpec
from sage_pipeline.sim.rollouts import RolloutsError
from sage_pipeline.sim.schema import OUTCOME_KINDS, Candidate, ExecJob, ExecResult, TaskRecord

STOP = "stop"
PASS, TIMEOUT = OUTCOME_KINDS.index("pass"), OUTCOME_KINDS.index("timeout")
Executor = Callable[[list[ExecJob]], list[ExecResult]]
Role = Literal[ROLES]  # one of SAGE's roles (routing.schema.ROLES)


# ------------------------------------------------------------------- rollouts
@dataclass(frozen=True)
class TaskOutcomes:
    """What the sandbox verified for each usable task: the reference's outcome kind and
    the outcome kinds of its verified wrong candidates (padded with -1)."""

    ref_kind: np.ndarray  # (N,) int index into OUTCOME_KINDS
    wrong_kind: np.ndarray  # (N, W) int, -1 past n_wrong
    n_wrong: np.ndarray  # (N,) int >= 1
    wrong_ids: list[list[str]]  # candidate ids, for people reading an episode
    executed: int = 0  # outcomes that were not in the cache and went through the executor
    # what the sandbox counted: tests passed and the task's total, per wrong candidate (0 past n_wrong)
    wrong_tests_passed: np.ndarray | None = None  # (N, W) int
    wrong_tests_total: np.ndarray | None = None  # (N, W) int

    @property
    def wrong_tests_share(self) -> np.ndarray:
        """(N, W) share of the tests each wrong candidate passed (0 past n_wrong)."""
        return self.wrong_tests_passed / np.maximum(self.wrong_tests_total, 1)

    def kind_dist(self) -> tuple[np.ndarray, np.ndarray]:
        """(N, n_kinds) one-hot of the reference's kind, and the wrong candidates' kind mix."""
        n, nk = len(self.ref_kind), len(OUTCOME_KINDS)
        ref = np.zeros((n, nk))
        ref[np.arange(n), self.ref_kind] = 1.0
        wrong = np.zeros((n, nk))
        rows, cols = np.nonzero(self.wrong_kind >= 0)
        np.add.at(wrong, (rows, self.wrong_kind[rows, cols]), 1.0)
        return ref, wrong / self.n_wrong[:, None]


def resolve_outcomes(tasks: Sequence[TaskRecord], rollouts=None, execute: Executor | None = None,
                     log: Callable[[str], None] | None = None) -> tuple[list[TaskRecord], TaskOutcomes, dict]:
    """Look up every candidate the environment can produce (reference + verified wrong
    ones) in the rollout cache by its cache key; run the missing ones through ``execute``
    in one batch. Records each one's outcome kind and the tests it passed out of the task's
    total, as the sandbox counted them. Tasks without a verified wrong candidate are skipped
    (returned in the third value, task id -> reason)."""
    known: dict[str, tuple[str, int, int]] = {}
    if rollouts is not None and len(rollouts):
        missing_cols = [c for c in ("cache_key", "outcome", "candidate_id", "tests_passed", "tests_total")
                        if c not in rollouts.columns]
        if missing_cols:
            raise RolloutsError(f"rollouts lack column(s) {missing_cols}; re-materialize sandbox_rollouts")
        bad = ~rollouts["outcome"].isin(OUTCOME_KINDS).to_numpy()
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise RolloutsError(f"rollouts row {i} (candidate {rollouts['candidate_id'].iloc[i]!r}): field "
                                f"'outcome' is {rollouts['outcome'].iloc[i]!r}, expected one of {OUTCOME_KINDS} "
                                "(re-materialize sandbox_rollouts)")
        known = dict(zip(rollouts["cache_key"].to_numpy(),
                         zip(rollouts["outcome"].to_numpy(), rollouts["tests_passed"].to_numpy(dtype=np.int64),
                             rollouts["tests_total"].to_numpy(dtype=np.int64))))
    usable, skipped = [], {}
    for t in tasks:
        if not t.wrong_candidates():
            skipped[t.task_id] = "no verified wrong candidate (every mutant is equivalent)"
        else:
            usable.append(t)
    if not usable:
        raise RolloutsError(f"none of the {len(tasks)} tasks has a verified wrong candidate; regenerate sim_tasks")
    wanted = [(t, c) for t in usable for c in [_reference(t), *t.wrong_candidates()]]
    keys = [ExecJob(c.code, t.entry_point, t.tests, t.timeout_s).key for t, c in wanted]
    missing = [i for i, k in enumerate(keys) if k not in known]
    if missing and execute is None:
        t, c = wanted[missing[0]]
        where = "the rollout cache is empty" if not known else f"{len(missing)} of {len(keys)} candidates"
        raise RolloutsError(f"no sandbox outcome for {len(missing)} candidate(s) ({where}); first: task "
                            f"{t.task_id!r} candidate {c.candidate_id!r}. Materialize sandbox_rollouts "
                            "for these tasks, or pass execute= (the sandbox's run) to execute them")
    if missing:
        t0 = time.perf_counter()
        jobs = [ExecJob(wanted[i][1].code, wanted[i][0].entry_point, wanted[i][0].tests, wanted[i][0].timeout_s)
                for i in missing]
        results = execute(jobs)
        if len(results) != len(jobs):
            raise RolloutsError(f"the executor returned {len(results)} results for {len(jobs)} jobs")
        for i, r in zip(missing, results):
            known[keys[i]] = (r.outcome, r.tests_passed, r.tests_total)
        if log:
            dt = time.perf_counter() - t0
            log(f"executed {len(jobs)} candidates missing from the rollout cache in {dt:.1f}s "
                f"({len(jobs) / max(dt, 1e-9):.0f}/s)")
    kind = {k: i for i, k in enumerate(OUTCOME_KINDS)}
    w = max(len(t.wrong_candidates()) for t in usable)
    ref_kind = np.zeros(len(usable), dtype=np.int64)
    wrong_kind = np.full((len(usable), w), -1, dtype=np.int64)
    n_wrong = np.zeros(len(usable), dtype=np.int64)
    passed, total = np.zeros((len(usable), w), dtype=np.int64), np.zeros((len(usable), w), dtype=np.int64)
    j = 0
    for i, t in enumerate(usable):
        ref_kind[i] = kind[known[keys[j]][0]]
        j += 1
        n_wrong[i] = len(t.wrong_candidates())
        for m in range(n_wrong[i]):
            wrong_kind[i, m] = kind[known[keys[j]][0]]
            passed[i, m], total[i, m] = known[keys[j]][1:]
            j += 1
    ids = [[c.candidate_id for c in t.wrong_candidates()] for t in usable]
    return usable, TaskOutcomes(ref_kind, wrong_kind, n_wrong, ids, executed=len(missing),
                                wrong_tests_passed=passed, wrong_tests_total=total), skipped


def _reference(t: TaskRecord) -> Candidate:
    refs = [c for c in t.candidates if c.kind == "reference"]
    return refs[0] if refs else Candidate(f"{t.task_id}/reference", "reference", t.reference)


# ------------------------------------------------------------------ simulator
class EscalationRewardSpec(RewardSpec):
    """The escalation env's reward: :class:`RewardSpec` with ``reward_v2`` (cost-aware) by default."""

    version: RewardVersion = Field("reward_v2", description="reward_v1 (SAGE's) or reward_v2 (reward_v1 minus "
                                   "cost_weight x the call's USD, clamped again)")


def _escalation_reward() -> RewardSpec:
    """:class:`EscalationRewardSpec`'s defaults as a plain RewardSpec (so configs compare equal)."""
    return RewardSpec(**EscalationRewardSpec().model_dump())


class SimConfig(BaseModel):
    """The escalation env's outcome model and reward (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role = Field("coder", description="the role whose candidates (the model catalogue's) are the models")
    max_attempts: int = Field(4, ge=1, le=10, description="attempts per task before the episode ends, in [1, 10]")
    sharpness: float = Field(8.0, allow_inf_nan=False, description="slope of the success logit in (capability - "
                             "difficulty)")
    bias: float = Field(0.0, allow_inf_nan=False, description="added to the success logit")
    retry_gain: float = Field(0.3, allow_inf_nan=False, description="logit gained per earlier failure")
    feedback_gain: dict[str, float] = Field(
        default_factory=lambda: {"none": 0.0, "wrong_answer": 0.4, "exception": 0.3, "timeout": -0.2, "oom": 0.0,
                                 "killed": 0.0},
        description="logit gained from the last failure's feedback, per last outcome (exactly the keys "
                    f"{', '.join(LAST_OUTCOMES)}): a failing test or a traceback helps more than a timeout, an "
                    "out-of-memory kill or a killed process")
    context_penalty: float = Field(1.5, allow_inf_nan=False, description="logit lost per doubling of the prompt "
                                   "past the model's context")
    feedback_tokens: int = Field(200, ge=0, description="prompt tokens added per failure (the failing test's "
                                 "output)")
    reward: RewardSpec = Field(default_factory=_escalation_reward, description="the reward (reward_v2 by "
                               "default: minus cost_weight x USD)")
    latency_weight: float = Field(0.01, ge=0.0, allow_inf_nan=False, description="reward units subtracted per "
                                  "second of model latency")

    @field_validator("feedback_gain")
    @classmethod
    def _every_last_outcome(cls, v: dict[str, float]) -> dict[str, float]:
        if set(v) != set(LAST_OUTCOMES):
            raise ValueError(f"needs exactly the keys {list(LAST_OUTCOMES)}, got {sorted(v)}")
        return v

    def to_dict(self) -> dict:
        return self.model_dump()


class TaskSimBase:
    """What both code-task simulators share: ``tasks`` with a ``split`` each, one deciding
    ``role`` (index into ROLES) and the ``actions`` it chooses among."""

    tasks: list[TaskRecord]
    split: np.ndarray
    role: int
    actions: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.tasks)

    @property
    def role_mask(self) -> np.ndarray:
        """(n_roles, K): the deciding role may use every action; other roles none."""
        m = np.zeros((len(ROLES), len(self.actions)), dtype=bool)
        m[self.role] = True
        return m

    def split_index(self, split: str) -> np.ndarray:
        idx = np.flatnonzero(self.split == split)
        if not len(idx):
            raise ValueError(f"no task in split {split!r} (splits present: {sorted(set(self.split))})")
        return idx


class CodeTaskSim(TaskSimBase):
    """The tasks, their verified outcomes and the simulated models: everything an episode
    needs, as arrays. Build it with :meth:`build`."""

    def __init__(self, tasks: list[TaskRecord], outcomes: TaskOutcomes, catalogue: ModelCatalogue,
                 table: RoutingTable, config: SimConfig = SimConfig(), skipped: dict | None = None) -> None:
        c = config
        self.tasks, self.outcomes, self.catalogue, self.table, self.config = tasks, outcomes, catalogue, table, c
        self.skipped = skipped or {}
        self.role = ROLE_INDEX[c.role]
        self.models = catalogue.candidates(c.role)
        self.actions: tuple[str, ...] = (*self.models, STOP)
        self.stop = len(self.models)
        self.model_cat = np.array([catalogue.index[m] for m in self.models])  # env model -> catalogue index
        route = table.routes[c.role]
        self.primary, self.fallback = self.models.index(route.primary), self.models.index(route.fallback)
        self.capability = np.array([catalogue.models[k].capability[c.role] for k in self.model_cat])
        self.context_tokens = catalogue.array("context_tokens")[self.model_cat]
        self.families = tuple(sorted({t.family for t in tasks}))
        self.obs_spec = ObsSpec(families=self.families)
        fam = {f: i for i, f in enumerate(self.families)}
        self.family = np.array([fam[t.family] for t in tasks], dtype=np.int64)
        self.difficulty = np.array([t.difficulty for t in tasks], dtype=np.float64)
        self.prompt_tokens = np.array([t.prompt_tokens for t in tasks], dtype=np.float64)
        self.split = np.array([t.split for t in tasks])
        self.gain = np.array([c.feedback_gain[k] for k in LAST_OUTCOMES])
        self.ref_dist, self.wrong_dist = outcomes.kind_dist()
        bad = (self.difficulty < 0) | (self.difficulty > 1) | ~np.isfinite(self.difficulty)
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"task {tasks[i].task_id!r}: field 'difficulty' is {self.difficulty[i]}, expected [0, 1]")

    @classmethod
    def build(cls, tasks: Sequence[TaskRecord], rollouts, catalogue: ModelCatalogue, table: RoutingTable,
              config: SimConfig = SimConfig(), execute: Executor | None = None,
              log: Callable[[str], None] | None = None) -> CodeTaskSim:
        usable, outcomes, skipped = resolve_outcomes(tasks, rollouts, execute, log)
        return cls(usable, outcomes, catalogue, table, config, skipped)

    # -------------------------------------------------------------- model
    def tokens(self, task: np.ndarray, step: np.ndarray) -> np.ndarray:
        return self.prompt_tokens[task] + self.config.feedback_tokens * np.asarray(step)

    def p_correct(self, task: np.ndarray, model: np.ndarray, step: np.ndarray, last: np.ndarray) -> np.ndarray:
        """P(the model's candidate is the reference), vectorised over rows."""
        c = self.config
        overflow = np.log2(np.maximum(self.tokens(task, step) / self.context_tokens[model], 1.0))
        logit = (c.sharpness * (self.capability[model] - self.difficulty[task]) + c.bias
                 + c.retry_gain * np.asarray(step) + self.gain[last] - c.context_penalty * overflow)
        return 1.0 / (1.0 + np.exp(-logit))

    def kind_probs(self, task: np.ndarray, model: np.ndarray, step: np.ndarray, last: np.ndarray) -> np.ndarray:
        """(n, n_kinds): the outcome kind's distribution after choosing ``model``."""
        p = self.p_correct(task, model, step, last)[:, None]
        return p * self.ref_dist[task] + (1.0 - p) * self.wrong_dist[task]

    def call_cost(self, task: np.ndarray, model: np.ndarray, step: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(cost_usd, latency_s) of a call at this attempt's prompt size."""
        tok = self.tokens(task, step)
        return self.catalogue.cost_usd(self.model_cat[model], tok), self.catalogue.latency_s(self.model_cat[model], tok)

    def reward(self, kind: np.ndarray, step: np.ndarray, cost: np.ndarray, latency: np.ndarray) -> np.ndarray:
        """The step reward of an attempt (see the module docstring)."""
        kind = np.asarray(kind)
        passed, timed_out = kind == PASS, kind == TIMEOUT
        spec = self.config.reward
        r1 = sage_step_reward(passed.astype(np.float64), passed, timed_out, step, spec)
        return np.clip(apply_version(r1, cost, spec) - self.config.latency_weight * latency, REWARD_MIN, REWARD_MAX)

    def observe(self, task, step, pfc, last) -> CodeTaskObs:
        task = np.asarray(task, dtype=np.int64)
        n = len(task)
        step = np.broadcast_to(np.asarray(step, dtype=np.int64), (n,))
        return CodeTaskObs(role=np.full(n, self.role, dtype=np.int64), task=task, family=self.family[task],
                           difficulty=self.difficulty[task], prompt_tokens=self.tokens(task, step),
                           step=step, failure_count=step,
                           primary_failure_count=np.broadcast_to(np.asarray(pfc, dtype=np.int64), (n,)),
                           last_outcome=np.broadcast_to(np.asarray(last, dtype=np.int64), (n,)))

    def transition(self, task, step, pfc, last, action, rng: np.random.Generator) -> dict[str, np.ndarray]:
        """One attempt per row: sample the candidate and look up its verified outcome."""
        action = np.asarray(action, dtype=np.int64)
        if action.shape != task.shape or (action < 0).any() or (action > self.stop).any():
            raise ValueError(f"actions must be {task.shape} ints in [0, {self.stop}] ({', '.join(self.actions)})")
        n = len(task)
        stop = action == self.stop
        model = np.where(stop, 0, action)
        u_correct, u_pick = rng.random(n), rng.random(n)
        correct = u_correct < self.p_correct(task, model, step, last)
        pick = np.minimum((u_pick * self.outcomes.n_wrong[task]).astype(np.int64), self.outcomes.n_wrong[task] - 1)
        kind = np.where(correct, self.outcomes.ref_kind[task], self.outcomes.wrong_kind[task, pick])
        cost, latency = self.call_cost(task, model, step)
        reward = np.where(stop, 0.0, self.reward(kind, step, cost, latency))
        kind = np.where(stop, -1, kind)
        done = stop | (kind == PASS) | (step + 1 >= self.config.max_attempts)
        return {"reward": reward, "done": done, "outcome": kind, "correct": correct & ~stop,
                "candidate": np.where(stop | correct, -1, pick), "passed": kind == PASS,
                "cost_usd": np.where(stop, 0.0, cost), "latency_s": np.where(stop, 0.0, latency),
                "is_primary": ~stop & (action == self.primary)}


# -------------------------------------------------------------- environments
class TaskVecEnvBase(gym.vector.VectorEnv):
    """What the two batch envs share: the tasks episodes are drawn from, and the spaces (the
    observation in [0, 1], one discrete action; autoreset in the same step)."""

    metadata: ClassVar[dict] = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def _init_spaces(self, sim, task_idx: np.ndarray | None, n_envs: int) -> None:
        if n_envs < 1:
            raise ValueError(f"n_envs must be >= 1, got {n_envs}")
        self.sim = sim
        self.task_idx = np.arange(len(sim)) if task_idx is None else np.asarray(task_idx, dtype=np.int64)
        if not len(self.task_idx):
            raise ValueError("task_idx is empty: no task to run episodes on")
        self.num_envs, self.n_actions = n_envs, len(sim.actions)
        self.obs_spec, self.actions, self.role_mask = sim.obs_spec, sim.actions, sim.role_mask
        self.obs_dim = sim.obs_spec.dim
        self.single_observation_space = gym.spaces.Box(0.0, 1.0, shape=(self.obs_dim,), dtype=np.float32)
        self.single_action_space = gym.spaces.Discrete(self.n_actions)
        self.observation_space = batch_space(self.single_observation_space, n_envs)
        self.action_space = batch_space(self.single_action_space, n_envs)


class CodeTaskVecEnv(TaskVecEnvBase):
    """``n_envs`` episodes stepped together with numpy: a Gymnasium ``VectorEnv`` with
    same-step autoreset (``metadata["autoreset_mode"]``): after a finished episode the
    returned observation is the next episode's first, and ``infos["final_obs"]`` holds the
    finished one's last observation (rows flagged by ``infos["_final_obs"]``). Every end is a
    true terminal; nothing is truncated. Tasks are drawn uniformly from ``task_idx`` at every
    reset. One seeded generator drives tasks and outcomes (``reset(seed=...)`` re-seeds it)."""

    def __init__(self, sim: CodeTaskSim, task_idx: np.ndarray | None = None, n_envs: int = 64, seed: int = 0):
        self._init_spaces(sim, task_idx, n_envs)
        # the encoding's per-task parts (ObsSpec.encode, written directly: tested equal)
        spec, nf, T = sim.obs_spec, len(sim.families), sim.config.max_attempts
        self._static = np.zeros((len(sim), nf + 1), dtype=np.float32)  # family one-hot, difficulty
        self._static[np.arange(len(sim)), sim.family] = 1.0
        self._static[:, nf] = sim.difficulty
        tokens = sim.tokens(np.repeat(np.arange(len(sim)), T + 1), np.tile(np.arange(T + 1), len(sim)))
        self._log_tokens = log_tokens(tokens).reshape(len(sim), T + 1)
        self._counts = scaled_count(np.arange(2 * T + 2), spec.max_count)  # count -> column
        self._direct = spec.numeric == ("difficulty", "log_prompt_tokens", "step", "failure_count",
                                        "primary_failure_count")
        self.rng = np.random.default_rng(seed)
        self.reset()

    def _new(self, rows: np.ndarray) -> None:
        self.task[rows] = self.rng.choice(self.task_idx, size=len(rows))
        self.step_i[rows] = self.pfc[rows] = self.last[rows] = 0
        self.ep_return[rows] = 0.0
        self.ep_len[rows] = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        n = self.num_envs
        self.task, self.step_i = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.pfc, self.last = np.zeros(n, np.int64), np.zeros(n, np.int64)
        self.ep_return, self.ep_len = np.zeros(n), np.zeros(n, np.int64)
        self._new(np.arange(n))
        return self.encode(), {}

    def observe(self) -> CodeTaskObs:
        return self.sim.observe(self.task, self.step_i, self.pfc, self.last)

    def encode(self, rows: np.ndarray | None = None) -> np.ndarray:
        """The ObsSpec encoding of the current states (of ``rows``: all by default)."""
        rows = slice(None) if rows is None else rows
        if not self._direct:
            return self.obs_spec.encode(self.observe().take(np.arange(self.num_envs)[rows]))
        task, step = self.task[rows], self.step_i[rows]
        nf = len(self.sim.families)
        out = np.zeros((len(task), self.obs_dim), dtype=np.float32)
        out[:, :nf + 1] = self._static[task]
        out[:, nf + 1] = self._log_tokens[task, np.minimum(step, self._log_tokens.shape[1] - 1)]
        out[:, nf + 2] = out[:, nf + 3] = self._counts[step]
        out[:, nf + 4] = self._counts[self.pfc[rows]]
        out[np.arange(len(task)), nf + 5 + self.last[rows]] = 1.0
        return out

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        tr = self.sim.transition(self.task, self.step_i, self.pfc, self.last, actions, self.rng)
        done = tr["done"]
        self.ep_return += tr["reward"]
        self.ep_len += 1
        info = tr | {"task": self.task.copy(), "episode_return": np.where(done, self.ep_return, np.nan),
                     "episode_length": np.where(done, self.ep_len, 0)}
        self.pfc += tr["is_primary"]
        self.last = np.where(tr["outcome"] >= 0, tr["outcome"], self.last)  # a stop shows what came before it
        self.step_i += 1
        obs = self.encode()
        finished = np.flatnonzero(done)
        if len(finished):
            info["final_obs"], info["_final_obs"] = obs.copy(), done
            self._new(finished)
            obs[finished] = self.encode(finished)
        return obs, tr["reward"], done, np.zeros(self.num_envs, dtype=bool), info


class CodeTaskEnv(gym.Env):
    """One episode at a time, the Gymnasium way (``reset(seed=...)``, ``step(action)``).
    Observations are :class:`ObsSpec` encodings in [0, 1]; actions index ``sim.actions``."""

    metadata: ClassVar[dict] = {"render_modes": []}

    def __init__(self, sim: CodeTaskSim, task_idx: np.ndarray | None = None) -> None:
        self.sim = sim
        self.task_idx = np.arange(len(sim)) if task_idx is None else np.asarray(task_idx, dtype=np.int64)
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(sim.obs_spec.dim,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(len(sim.actions))
        self._state: tuple[np.ndarray, ...] | None = None

    def _obs(self) -> np.ndarray:
        return self.sim.obs_spec.encode(self.sim.observe(*self._state))[0]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if options and "task" in options:  # a given task (index into sim.tasks), e.g. to replay one
            if not 0 <= int(options["task"]) < len(self.sim):
                raise ValueError(f"options['task'] = {options['task']} is not a task index (0..{len(self.sim) - 1})")
            task = np.array([int(options["task"])])
        else:
            task = self.np_random.choice(self.task_idx, size=1)
        self._state = (task, np.zeros(1, np.int64), np.zeros(1, np.int64), np.zeros(1, np.int64))
        return self._obs(), {"task_id": self.sim.tasks[int(task[0])].task_id}

    def step(self, action):
        if self._state is None:
            raise RuntimeError("call reset() before step()")
        task, step, pfc, last = self._state
        tr = self.sim.transition(task, step, pfc, last, np.array([int(action)]), self.np_random)
        done = bool(tr["done"][0])
        info = {k: v[0].item() for k, v in tr.items() if k not in ("reward", "done")}
        info["outcome"] = OUTCOME_KINDS[info["outcome"]] if info["outcome"] >= 0 else STOP
        self._state = (task, step + 1, pfc + tr["is_primary"], np.where(done, 0, tr["outcome"]))
        obs = self._obs()
        if done:
            self._state = None
        return obs, float(tr["reward"][0]), done, False, info
