"""A simulated month of deploy -> log -> retrain -> gate -> promote, side by side with the static
table, the online bandit and the oracle, on the same days, tasks and seed.

Every day the deployed router routes that day's simulated tasks in SAGE's binary space
(primary or fallback, what SAGE's router executes) with some exploration
(:class:`ExplorationConfig`: by default more where the deployed policy's fitted Q-function
says its choice is close to, or worse than, the other one, little where it is clearly right)
and writes SAGE-shaped journals with the probability it acted on. Every night the offline
chain runs on the last ``window_days`` of journals (0: everything so far): the ingest, the
routing dataset, CQL with alpha chosen by FQE on the eval split's select half, the policy
distilled into SAGE's per-role classifiers behind a confidence floor chosen the same way
(``offline_eval.train_select_cql`` and ``distill_select_served``, as the assets), then the
gate (``offline_eval.promotion_gate``, as the assets): the candidate is promoted only if the
lower bound of its gain over the deployed policy, clipped step-wise DR paired on the same
report-half episodes, exceeds ``min_gain`` of the deployed policy's estimate. A candidate that
passes is then A/B-tested online against the deployed policy (``online_ab``: SAGE's
``compare-policy``, common random numbers) and promoted only if the online 95% interval of its
gain lies above 0 (``LoopGateConfig.confirm_online``). A promotion is the next day's deployed
policy; tonight's window also refits the deployed policy's Q-function
that tomorrow's exploration reads. When a day's logged return drops against the day before
under the same deployed policy and exploration (:class:`ChangeConfig`), the loop takes it for a
change in the world: the window restarts that day and the router explores at ``epsilon_max``
everywhere for the next days.

The world: stationary, or drifting (``WorldConfig``): from ``quality_day`` one model's
capability for every role drops by ``quality_drop`` (30%), and from ``price_day`` another
model's price is multiplied by ``price_factor`` (2). The reward is ``reward_v2`` (the
reviewer's reward minus ``cost_weight`` per USD) so that a price change matters.

Ground truth per day, on one fixed set of ``eval_tasks`` tasks per seed, in that day's
world: the exact value of the policy each arm acted with (the nightly loop's deployed
policy with its exploration, the bandit's state at the start of the day with its floor,
the static table) and of the served policy alone, and the best binary policy (the oracle
arm: it knows the world). Cumulative regret sums ``V_oracle - V_arm`` over the days. A
promotion is wrong when the promoted policy's true value that night is below the policy
it replaces. numpy + the offline chain (torch for CQL).
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import numpy as np
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_pipeline import artifacts
from sage_pipeline.rl import cql, offline_eval as oe, online_ab as ab, ope
from sage_pipeline.rl.bandit import BanditConfig, LinearBandit, run_online
from sage_pipeline.routing import collector, ingest
from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.features import FeatureSpec
from sage_pipeline.routing.policy import EpsilonGreedyPolicy, StaticTablePolicy
from sage_pipeline.routing.reward import RewardSpec
from sage_pipeline.routing.routing_dataset import DatasetConfig, build_routing_dataset
from sage_pipeline.routing.routing_simulator import RoutingSimulator, SimulatorConfig, Tasks
from sage_pipeline.routing.schema import ROLES, TRAJECTORY_STEP
from sage_pipeline.sage import checkpoint as sage_router
from sage_pipeline.sage.table import RoutingTable

log = logging.getLogger(__name__)

ARMS = ("static_table", "bandit", "nightly", "oracle")


@dataclass(frozen=True)
class WorldConfig:
    drift: bool = False
    quality_model: str = "claude-sonnet-4"  # its capability drops by quality_drop on quality_day
    quality_drop: float = 0.3
    quality_day: int = 10
    price_model: str = "gpt-4.1"  # its price is multiplied by price_factor on price_day
    price_factor: float = 2.0
    price_day: int = 20
    cost_weight: float = 5.0  # reward_v2: reward units per USD

    def catalogue(self, base: ModelCatalogue, day: int) -> ModelCatalogue:
        """The models as they are on ``day`` (0-based)."""
        if not self.drift:
            return base
        for name in (self.quality_model, self.price_model):
            if name not in base.actions:
                raise ValueError(f"drift model {name!r} is not in the catalogue {base.source} "
                                 f"({', '.join(base.actions)}): name one of them")
        models = []
        for m in base.models:
            if m.name == self.quality_model and day >= self.quality_day:
                m = replace(m, capability={r: c * (1.0 - self.quality_drop) for r, c in m.capability.items()})
            if m.name == self.price_model and day >= self.price_day:
                m = replace(m, cost_per_call=m.cost_per_call * self.price_factor,
                            cost_per_1k_prompt_tokens=m.cost_per_1k_prompt_tokens * self.price_factor)
            models.append(m)
        return ModelCatalogue(tuple(models), f"{base.source} (day {day})")

    def changes(self) -> list[int]:
        return [self.quality_day, self.price_day] if self.drift else []


class ExplorationConfig(BaseModel):
    """How the deployed router explores (what its journals log as the propensity).

    ``gap``: with probability ``epsilon(s)`` a uniform candidate, else the deployed choice, where
    ``epsilon(s) = epsilon_min + (epsilon_max - epsilon_min) * exp(-gap(s) / temperature)`` and
    ``gap(s)`` is how much better the deployed choice is than the best other candidate under the
    deployed policy's fitted Q-function (``ope.fit_q`` on the journals of the last ``fit_days``
    days, so that it follows a changing world; 0 where another candidate looks better). Near a
    tie, or where the choice looks wrong, it explores at ``epsilon_max``, which is cheap there and
    is where tomorrow's candidate will differ; where the choice is clearly right, at
    ``epsilon_min``. Before any night (no fitted model) it explores at ``epsilon_max``.
    ``uniform``: at ``epsilon`` everywhere (the rule before issue 19)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rule: Literal["gap", "uniform"] = Field("gap", description="'gap': explore most where the deployed policy's "
                                            "fitted Q-values are close; 'uniform': at epsilon everywhere")
    epsilon: float = Field(0.1, gt=0.0, le=1.0, description="'uniform': the rate everywhere")
    epsilon_max: float = Field(0.3, gt=0.0, le=1.0, description="'gap': the rate at a tie, and before the first "
                               "night (0.3 is the synthetic collector's rate)")
    epsilon_min: float = Field(0.02, gt=0.0, le=1.0, description="'gap': the floor, so every candidate keeps "
                               "support (importance weights <= n / epsilon_min)")
    temperature: float = Field(0.05, gt=0.0, description="'gap': how fast the rate falls with the gap, in reward "
                               "units of the episode return")
    fit_days: int = Field(1, ge=1, description="'gap': the Q-function is fitted on the last this many days of "
                          "journals (the freshest world)")

    @model_validator(mode="after")
    def _ordered(self) -> ExplorationConfig:
        if self.epsilon_min > self.epsilon_max:
            raise ValueError(f"epsilon_min ({self.epsilon_min}) must be <= epsilon_max ({self.epsilon_max})")
        return self

    def behaviour(self, deployed, q_model: ope.LinearQ | None, spec: FeatureSpec):
        """The policy the deployed router acts with (its probabilities are the logged propensities)."""
        if self.rule == "uniform":
            return EpsilonGreedyPolicy(deployed, self.epsilon, name="deployed+exploration")
        return GapExploration(deployed, q_model, spec, self.epsilon_max, self.epsilon_min, self.temperature)


@dataclass(frozen=True, eq=False)
class GapExploration:
    """``base`` with state-dependent epsilon-exploration: see :class:`ExplorationConfig` (``gap``)."""

    base: object
    q_model: ope.LinearQ | None  # the base policy's fitted Q-function; None: epsilon_max everywhere
    spec: FeatureSpec  # how q_model reads a context (ope.reward_basis)
    epsilon_max: float
    epsilon_min: float
    temperature: float
    name: str = "deployed+exploration"

    @property
    def actions(self) -> tuple[str, ...]:
        return tuple(self.base.actions)

    @property
    def role_mask(self) -> np.ndarray:
        return self.base.role_mask

    def epsilon(self, ctx, base: np.ndarray | None = None) -> np.ndarray:
        """The exploration rate of each context."""
        if self.q_model is None:
            return np.full(len(ctx), self.epsilon_max)
        base = self.base.action_probs(ctx) if base is None else base
        rows, cand = np.arange(len(ctx)), self.role_mask[ctx.role]
        q = self.q_model.predict(ctx.role, ope.reward_basis(ctx, self.spec))
        chosen = base.argmax(axis=1)
        others = np.where(cand, q, -np.inf)
        others[rows, chosen] = -np.inf
        best_other = others.max(axis=1)
        gap = np.where(np.isfinite(best_other), np.maximum(q[rows, chosen] - best_other, 0.0), np.inf)
        return self.epsilon_min + (self.epsilon_max - self.epsilon_min) * np.exp(-gap / self.temperature)

    def action_probs(self, ctx) -> np.ndarray:
        base = np.asarray(self.base.action_probs(ctx), dtype=np.float64)
        cand = self.role_mask[ctx.role].astype(np.float64)
        eps = self.epsilon(ctx, base)[:, None]
        return (1.0 - eps) * base + eps * cand / cand.sum(axis=1, keepdims=True)


class ChangeConfig(BaseModel):
    """How the loop reacts when its own journals show the world changed.

    Each day the mean episode return the deployed router logged is compared with the previous
    day's, when both days ran the same deployed policy with the same exploration regime. A drop
    with a one-sided z above ``z`` (Welch, the two days' per-episode returns) is a detected
    change. Then the nightly window starts at the day the drop was seen, so no candidate is
    trained or gated on the old world's journals; and for ``explore_days`` days the router
    explores at ``ExplorationConfig.epsilon_max`` everywhere, because the next candidates differ
    from the deployed policy where its low exploration gave the gate's OPE little support."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="detect drops in the logged return and react; false: never")
    z: float = Field(5.0, gt=0.0, description="one-sided z of today's drop in mean episode return against "
                     "yesterday's (same deployed policy and exploration) that counts as a change")
    explore_days: int = Field(1, ge=0, description="days after a detected change that explore at "
                              "exploration.epsilon_max everywhere (docs/benchmarks.md: 0 left a recovery at 4 "
                              "days, 2 cost more regret than 1 for the same recoveries)")


# The nightly gate's bar: a month gates ~30 times, mostly between near-equal policies, and a
# one-sided 97.5% bound lets ties through (0 wrong promotions is the goal; docs/benchmarks.md)
LOOP_MIN_GAIN = 0.005


class LoopGateConfig(oe.PromotionGateConfig):
    """The simulated month's gate: :class:`offline_eval.PromotionGateConfig` with a bar of
    :data:`LOOP_MIN_GAIN` of the deployed policy's estimate."""

    min_gain: float = Field(LOOP_MIN_GAIN, ge=0.0, description="the paired lower bound of the candidate's gain "
                            "over the deployed policy must exceed this share of the deployed policy's estimate")
    confirm_online: bool = Field(True, description="a candidate the offline gate passes is then A/B-tested online "
                                 "against the deployed policy (common random numbers, LoopConfig.online_ab_episodes "
                                 "tasks each: SAGE's compare-policy) and deployed only if the lower bound of the "
                                 "online 95% interval of its gain is above 0; false: the offline gate alone decides")


def confirmed_online(difference: dict[str, float], gate: LoopGateConfig) -> bool:
    """Whether an online A/B's paired ``difference`` (candidate - deployed: mean, ci_low,
    ci_high) confirms a candidate the offline gate passed: its lower bound above 0, or always
    when ``gate.confirm_online`` is off."""
    return (not gate.confirm_online) or difference["ci_low"] > 0.0


class MonthConfig(BaseModel):
    """The simulated month's settings a user sets (the ``policy_iteration`` asset's run config
    inherits them); :class:`LoopConfig` adds the world, the bandit and the loop's internals."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    days: int = Field(30, ge=1, description="simulated days")
    episodes_per_day: int = Field(2000, ge=50, description="tasks routed per day by every arm (the same tasks)")
    eval_tasks: int = Field(2000, ge=50, description="the fixed tasks every day's true values are computed on")
    seed: int = Field(0, description="seed of the tasks, the exploration, the training and the bootstrap")
    exploration: ExplorationConfig = Field(default_factory=ExplorationConfig,
                                           description="the deployed router's exploration; its logged "
                                           "propensities feed the nightly OPE")
    window_days: int = Field(2, ge=0, description="the nightly chain retrains on the last this many days of "
                             "journals (0: every day so far)")
    cql_steps: int = Field(500, ge=1, description="CQL gradient steps per night")
    alphas: list[Annotated[float, Field(ge=0.0, allow_inf_nan=False)]] = Field(
        [0.03, 0.1, 0.3, 1.0], min_length=1, description="CQL alphas tried each night, each >= 0 (FQE on the "
        "select half chooses)")
    floors: list[Annotated[float, Field(ge=0.0, le=1.0)]] = Field(
        [0.0, 0.2, 0.4, 0.55], min_length=1, description="SAGE confidence floors tried each night, each in [0, 1] "
        "(FQE chooses, not truth)")
    gate: LoopGateConfig = Field(default_factory=LoopGateConfig,
                                 description="the nightly gate; the deployed policy is its baseline")
    change: ChangeConfig = Field(default_factory=ChangeConfig,
                                 description="what the loop does when its journals show the world changed")


class LoopConfig(MonthConfig):
    """:class:`MonthConfig` and what the benchmark varies besides: the world, the online bandit,
    the arms run, and the loop's internals."""

    eval_fraction: float = Field(0.5, gt=0.0, lt=1.0, description="of the window's sessions: half choose alpha "
                                 "and the floor, half gate")
    n_boot: int = Field(200, ge=1, description="bootstrap resamples of the gate's interval")
    sessions_per_day: int = Field(250, ge=1, description="sessions a day's journal splits its tasks into")
    bandit: BanditConfig = Field(default_factory=BanditConfig, description="the online bandit arm")
    bandit_batch: int = Field(10, ge=1, description="tasks routed between two bandit updates")
    online_ab_episodes: int = Field(2000, ge=30, description="each promotion is A/B-tested online against the "
                                    "policy it replaces on this many tasks")
    world: WorldConfig = Field(default_factory=WorldConfig, description="stationary or drifting")
    arms: tuple[str, ...] = Field(ARMS, description=f"the arms run: any of {', '.join(ARMS)}")

    @model_validator(mode="after")
    def _known_arms(self) -> LoopConfig:
        bad = [a for a in self.arms if a not in ARMS]
        if bad or not self.arms:
            raise ValueError(f"arms {bad or 'none'}: choose from {', '.join(ARMS)}")
        return self

    def to_dict(self) -> dict:
        """The config as JSON types (the bandit and the world, dataclasses, as dicts too)."""
        return self.model_dump()


# ---------------------------------------------------------------------- journals
def write_journal(path: Path, sim: RoutingSimulator, tasks: Tasks, rows: dict[str, np.ndarray], day: datetime,
                  prefix: str, sessions_per_day: int, rng: np.random.Generator) -> int:
    """One day's decisions (``rows`` as ``collector.simulate_episodes`` returns them) as SAGE's
    journal ``YYYY-MM-DD.log``: per session SESSION_START, per decision MODEL_ROUTING_DECISION,
    TOKEN_USAGE and TRAJECTORY_STEP (no ``step``; ``propensity`` as the extension key), SESSION_END.
    The event shapes are the synthetic collector's; returns the number of lines."""
    order = np.lexsort((rows["step"], rows["task"]))
    rows = {k: v[order] for k, v in rows.items()}
    fired = collector._fired(sim, tasks, rows)
    bounds = np.searchsorted(rows["task"], np.arange(len(tasks) + 1))
    sizes = collector._session_sizes(len(tasks), 4.0, rng)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    spacing = timedelta(seconds=0.9 * 86400 / max(len(sizes), 1))
    fallback, enc, lines = sim.table.fallback_index(sim.catalogue), msgspec.json.Encoder(), []
    for s, size in enumerate(sizes):
        sid = f"{prefix}-{day.date().isoformat()}-{s:05d}"
        clock = day + spacing * s
        lines.append(enc.encode({"type": "SESSION_START", "timestamp": collector._stamp(clock), "session_id": sid,
                                 "extra": {"synthetic": True, "collector": __name__}}))
        for j in range(size):
            task = first[s] + j
            r_i = int(tasks.role[task])
            role, tid = ROLES[r_i], f"{sid}-t{j:02d}"
            for r in range(bounds[task], bounds[task + 1]):
                model = sim.actions[rows["action"][r]]
                timed_out, passed = bool(rows["timed_out"][r]), bool(rows["verification_passed"][r])
                p, tcs = round(float(rows["propensity"][r]), 10), float(tasks.task_complexity_score[task])
                pfc, tokens = int(rows["primary_failure_count"][r]), int(rows["prompt_tokens"][r])
                table_choice = fallback[r_i] if fired[r] else sim.primary[r_i]
                clock += timedelta(milliseconds=5)
                lines.append(enc.encode({
                    "type": "MODEL_ROUTING_DECISION", "timestamp": collector._stamp(clock), "session_id": sid,
                    "agent_role": role, "task_complexity_score": tcs, "primary_failure_count": pfc,
                    "primary_model": sim.actions[sim.primary[r_i]], "fallback_model": sim.actions[fallback[r_i]],
                    "selected_model": model, "matched_fallback_triggers": fired[r],
                    "policy_source": "yaml" if rows["action"][r] == table_choice else "learned", "propensity": p}))
                clock += timedelta(seconds=float(rows["latency_s"][r]))
                completion = 0 if timed_out else collector.COMPLETION_TOKENS_PER_CALL
                lines.append(enc.encode({"type": "TOKEN_USAGE", "timestamp": collector._stamp(clock),
                                         "session_id": sid, "model": model, "prompt_tokens": tokens,
                                         "completion_tokens": completion}))
                clock += timedelta(milliseconds=5)
                lines.append(enc.encode({
                    "type": TRAJECTORY_STEP, "timestamp": collector._stamp(clock), "session_id": sid, "task_id": tid,
                    "agent": role, "action": {"model_chosen": model, "prompt_strategy_key": "default"},
                    "propensity": p,
                    "state": {"task_complexity_score": tcs, "primary_failure_count": pfc,
                              "failure_count": int(rows["failure_count"][r]), "prompt_tokens": tokens,
                              "verification_passed": passed, "timed_out": timed_out,
                              "failed_reason": "timeout" if timed_out else (None if passed else "verification_failed"),
                              "reviewer_score": float(rows["reviewer_score"][r]),
                              "latency_s": round(float(rows["latency_s"][r]), 3),
                              "cost_usd": round(float(rows["cost_usd"][r]), 6)},
                    "reward": round(float(rows["reward_v1"][r]), 6), "terminal": bool(rows["terminal"][r]),
                    "extra": {"synthetic": True}}))
        clock += timedelta(milliseconds=1)
        lines.append(enc.encode({"type": "SESSION_END", "timestamp": collector._stamp(clock), "session_id": sid}))
    artifacts.write_bytes(path, b"\n".join(lines) + b"\n")
    return len(lines)


def logged_dataset(day_dirs: list[Path], work: Path, table: RoutingTable, catalogue: ModelCatalogue,
                   reward: RewardSpec, eval_fraction: float = DatasetConfig.eval_fraction):
    """The routing dataset (frame, multi-model action space) of the journals in ``day_dirs``, through the
    same ingest and dataset build as the assets."""
    res = ingest.ingest(ingest.IngestConfig(tuple(day_dirs)), work, progress=lambda *_: None)
    if res.stats.quarantined:
        raise ValueError(f"{res.stats.quarantined} lines of the loop's own journals were quarantined "
                         f"({dict(res.stats.quarantine_reasons)}): see {res.quarantine}")
    built = build_routing_dataset(pq.read_table(res.trajectories).to_pandas(), table, catalogue,
                                  DatasetConfig(reward=reward, eval_fraction=eval_fraction),
                                  pq.read_table(res.routing_decisions).to_pandas(),
                                  pq.read_table(res.token_usage).to_pandas())
    return built.frame, built.space


# ---------------------------------------------------------------------- one night
@dataclass(frozen=True)
class NightResult:
    promoted: bool
    candidate: object | None  # the served composite trained tonight
    reason: str
    alpha: str | None = None
    floor: float | None = None
    seconds: float = 0.0
    estimates: dict = field(default_factory=dict)  # the gate's estimator on the report half: deployed, candidate


def nightly(df, space: ActionSpace, table: RoutingTable, deployed, config: LoopConfig, seed: int) -> NightResult:
    """Train tonight's served candidate on ``df`` and gate it against ``deployed`` on the report half."""
    t0 = time.perf_counter()
    quiet = lambda *_: None  # noqa: E731
    ope_cfg = ope.OPEConfig(n_boot=config.n_boot, seed=seed)
    sel = oe.train_select_cql(df, space, cql.CQLConfig(steps=config.cql_steps, seed=seed), config.alphas, ope_cfg,
                              "fqe", progress=quiet)
    served = oe.distill_select_served(df, space, table, sel.result.policy(), "cql",
                                      sage_router.SageRouterConfig(min_confidence_grid=config.floors, seed=seed),
                                      ope_cfg, "fqe", progress=quiet)
    data = ope.LoggedData.from_frame(oe.eval_part(df, "report"), space.actions, space.roles)
    evals = {"deployed": ope.evaluate_policy(data, deployed, ope_cfg, progress=quiet),
             "candidate": ope.evaluate_policy(data, served.policy, ope_cfg, progress=quiet)}
    gate = oe.promotion_gate(evals, static="deployed", candidates=("candidate",), gate=config.gate)
    est = {k: e.estimates[oe.GATE_ESTIMATOR].to_dict() for k, e in evals.items()}
    c = gate.candidates.get("candidate", {})
    est["difference"] = {k: c.get(k) for k in ("difference", "difference_ci_low", "difference_ci_high")}
    return NightResult(gate.promoted == "candidate", served.policy, gate.reason, sel.label,
                       served.policy.min_confidence, time.perf_counter() - t0, est)


# ---------------------------------------------------------------------- the month
@dataclass
class LoopResult:
    config: dict
    days: list[dict] = field(default_factory=list)  # per day: true values of every arm, promotions
    summary: dict = field(default_factory=dict)
    bandit_ope: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def _value(sim: RoutingSimulator, policy, tasks: Tasks) -> float:
    return float(sim.policy_value(policy, tasks).mean)


def run_month(config: LoopConfig, work: Path | None = None, progress: Callable[[str], None] = log.info,
              catalogue: ModelCatalogue | None = None, table: RoutingTable | None = None) -> LoopResult:
    """Run every arm of ``config.arms`` over ``config.days`` simulated days (see the module doc)."""
    catalogue, table = catalogue or ModelCatalogue.load(), table or RoutingTable.load()
    reward = RewardSpec(version="reward_v2", cost_weight=config.world.cost_weight)
    sims = {}

    def world(day: int) -> RoutingSimulator:
        key = tuple(d for d in config.world.changes() if day >= d)
        if key not in sims:
            sims[key] = RoutingSimulator(config.world.catalogue(catalogue, day), table, SimulatorConfig(reward=reward))
        return sims[key]

    space = ActionSpace.build(table, catalogue=catalogue).binary()
    sim0 = world(0)
    if tuple(space.actions) != tuple(sim0.actions):
        raise ValueError(f"the table's models {space.actions} are not the catalogue's {sim0.actions}: the loop "
                         "needs a catalogue that simulates every model the table names, and only those")
    rng_eval = np.random.default_rng([config.seed, 1])
    eval_tasks = sim0.sample_tasks(config.eval_tasks, rng_eval)
    static = StaticTablePolicy(table, space)
    deployed, deployed_name = static, "static_table"
    q_model, q_spec = None, replace(ope.OPEConfig().feature_spec, roles=tuple(space.roles))
    bandit = LinearBandit.for_space(space, replace(config.bandit, seed=config.seed), name=config.bandit.algorithm)
    result = LoopResult({"loop": config.to_dict()})
    start = datetime(2026, 12, 1, tzinfo=timezone.utc)
    own_tmp = None
    if work is None:
        own_tmp = tempfile.TemporaryDirectory(prefix="policy_iteration-")
        work = Path(own_tmp.name)
    try:
        journals = {"nightly": work / "nightly", "bandit": work / "bandit"}
        explore_until, window_start, yesterday = -1, 0, None
        for day in range(config.days):
            sim = world(day)
            date = start + timedelta(days=day)
            rng_day = np.random.default_rng([config.seed, 2, day])
            tasks = sim.sample_tasks(config.episodes_per_day, rng_day)  # the same tasks for every arm
            row = {"day": day, "date": date.date().isoformat(),
                   "oracle": float(sim.optimal_value(eval_tasks, space.mask).mean),
                   "static_table": _value(sim, static, eval_tasks)}
            if "bandit" in config.arms:
                row["bandit"] = _value(sim, bandit, eval_tasks)  # its state at the start of the day, floor included
                rows = run_online(bandit, sim, tasks, np.random.default_rng([config.seed, 3, day]), config.bandit_batch)
                write_journal(journals["bandit"] / date.date().isoformat() / f"{date.date().isoformat()}.log", sim,
                              tasks, rows, date, f"bandit-{config.seed}", config.sessions_per_day,
                              np.random.default_rng([config.seed, 4, day]))
            if "nightly" in config.arms:
                boosted = day <= explore_until
                behaviour = (EpsilonGreedyPolicy(deployed, config.exploration.epsilon_max, name="deployed+exploration")
                             if boosted else config.exploration.behaviour(deployed, q_model, q_spec))
                row["nightly"] = _value(sim, behaviour, eval_tasks)
                row["nightly_deployed"] = _value(sim, deployed, eval_tasks)
                row["deployed"] = deployed_name
                rows = collector.simulate_episodes(sim, tasks, behaviour, np.random.default_rng([config.seed, 5, day]))
                row["exploration"] = exploration_summary(sim, tasks, rows, deployed, behaviour) | {"boosted": boosted}
                today = DayReturns.of(rows, len(tasks), (deployed_name, boosted, q_model is None))
                z = today.drop_z(yesterday)
                row["logged_return"], row["drop_z"] = today.mean, z
                if config.change.enabled and z is not None and z > config.change.z:
                    row["change_detected"] = True
                    explore_until, window_start = day + config.change.explore_days, day
                    progress(f"day {day + 1}: the logged return fell from {yesterday.mean:.4f} to {today.mean:.4f} "
                             f"(z {z:.1f}): a change; the window restarts today and the router explores at "
                             f"{config.exploration.epsilon_max} for {config.change.explore_days} days")
                yesterday = today
                day_dir = journals["nightly"] / date.date().isoformat()
                write_journal(day_dir / f"{date.date().isoformat()}.log", sim, tasks, rows, date,
                              f"loop-{config.seed}", config.sessions_per_day,
                              np.random.default_rng([config.seed, 6, day]))
                if day < config.days - 1:  # the last night's policy would never be deployed
                    dirs = sorted(p for p in journals["nightly"].iterdir() if p.is_dir())  # one per day so far
                    dirs = dirs[max(window_start, day + 1 - config.window_days if config.window_days else 0):]
                    df, _ = logged_dataset(dirs, work / "night" / date.date().isoformat(), table, catalogue, reward,
                                           config.eval_fraction)
                    night = nightly(df, space, table, deployed, config, config.seed * 1000 + day)
                    v_new, v_old = _value(sim, night.candidate, eval_tasks), row["nightly_deployed"]
                    row |= {"window": [dirs[0].name, dirs[-1].name], "promoted": night.promoted,
                            "gate": night.reason, "alpha": night.alpha, "floor": night.floor,
                            "night_s": round(night.seconds, 2),
                            "gate_difference": night.estimates["difference"], "candidate_true_value": v_new}
                    if night.promoted:  # the offline gate passed it: A/B it online in tonight's world
                        ab_cfg = ab.OnlineABConfig(episodes=config.online_ab_episodes, seed=config.seed * 1000 + day)
                        rep = ab.online_ab(sim, deployed, night.candidate, ab_cfg,
                                           {"a": night.estimates["deployed"]["value"],
                                            "b": night.estimates["candidate"]["value"],
                                            **night.estimates["difference"]}, (deployed_name, "candidate"))
                        ok = confirmed_online(rep.difference, config.gate)
                        row["online_ab"] = {"from": deployed_name, "difference": rep.difference,
                                            "true_difference": rep.true_difference, "ope": rep.ope,
                                            "ope_difference_inside": rep.ope_difference_inside,
                                            "ope_value_inside": rep.ope_value_inside, "ope_agrees": rep.ope_agrees,
                                            "confirmed": ok}
                        row |= {"offline_gate_passed": True, "offline_gate_wrong": v_new < v_old, "promoted": ok,
                                "gate": f"{night.reason}; online A/B gain {rep.difference['mean']:+.4f} "
                                        f"[{rep.difference['ci_low']:+.4f}, {rep.difference['ci_high']:+.4f}]: "
                                        + ("deployed" if ok else "not deployed (its lower bound is not above 0)")}
                        if ok:
                            row |= {"promoted_true_value": v_new, "wrong_promotion": v_new < v_old}
                            deployed, deployed_name = night.candidate, f"served@night{day}"
                    # tomorrow's exploration reads the deployed policy's Q-function on the last days' journals
                    recent = {p.name for p in dirs[-config.exploration.fit_days:]}
                    fresh = df[df["source_file"].map(lambda f: Path(f).parent.name).isin(recent)]
                    q_model = ope.fit_q(ope.LoggedData.from_frame(fresh, space.actions, space.roles), deployed)
            result.days.append(row)
            progress(f"day {day + 1}/{config.days}: oracle {row['oracle']:.4f}, table {row['static_table']:.4f}"
                     + (f", bandit {row['bandit']:.4f}" if "bandit" in row else "")
                     + (f", nightly {row['nightly']:.4f} (deployed {row['nightly_deployed']:.4f}"
                        f"{', promoted' if row.get('promoted') else ''})" if "nightly" in row else ""))
        if "bandit" in config.arms:
            result.bandit_ope = bandit_logs_ope(journals["bandit"], work / "bandit_ope", bandit, static, space, table,
                                                catalogue, reward, world(config.days - 1), config)
    finally:
        if own_tmp is not None:
            own_tmp.cleanup()
    result.summary = summarise(result.days, config)
    return result


@dataclass(frozen=True)
class DayReturns:
    """One day's logged episode returns, with what produced them."""

    regime: tuple  # what explored: (deployed policy, boosted after a change, before any fitted Q-function)
    mean: float
    var_of_mean: float

    @classmethod
    def of(cls, rows: dict[str, np.ndarray], n_tasks: int, regime: tuple) -> DayReturns:
        ret = np.bincount(rows["task"], weights=rows["reward"], minlength=n_tasks)
        return cls(regime, float(ret.mean()), float(ret.var(ddof=1) / len(ret)))

    def drop_z(self, yesterday: DayReturns | None) -> float | None:
        """The one-sided z of today's drop against ``yesterday``; None when the two days are not
        comparable (another deployed policy or exploration regime, or no yesterday)."""
        if yesterday is None or yesterday.regime != self.regime:
            return None
        se = np.sqrt(self.var_of_mean + yesterday.var_of_mean)
        return float((yesterday.mean - self.mean) / se) if se > 0 else None


def exploration_summary(sim: RoutingSimulator, tasks: Tasks, rows: dict[str, np.ndarray], deployed,
                        behaviour) -> dict[str, float]:
    """How much the day's decisions left the deployed policy's choice: the mean probability of doing so
    (what the behaviour logged) and the share that did."""
    t = rows["task"]
    ctx = sim.contexts(tasks.take(t), rows["step"], rows["primary_failure_count"])
    choice = np.asarray(deployed.action_probs(ctx)).argmax(axis=1)
    p_stay = np.asarray(behaviour.action_probs(ctx))[np.arange(len(t)), choice]
    return {"leave_probability": float((1.0 - p_stay).mean()), "left_share": float((rows["action"] != choice).mean())}


def bandit_logs_ope(folder: Path, work: Path, bandit: LinearBandit, static, space: ActionSpace, table: RoutingTable,
                    catalogue: ModelCatalogue, reward: RewardSpec, sim: RoutingSimulator, config: LoopConfig) -> dict:
    """The bandit's own journals of the last ``window_days`` days (the world of the last day), read by the
    ingest and the dataset build like any logs, then OPE (the gate's clipped step-wise DR) of two
    policies on them: the bandit's final state and the static table, each against its exact value
    on those days' tasks."""
    dirs = sorted(p for p in folder.iterdir() if p.is_dir())[-max(config.window_days, 3):]
    first_day = config.days - len(dirs)
    if any(first_day <= c < config.days for c in config.world.changes() if c > first_day):
        return {"skipped": f"the world changed within the last {len(dirs)} days: no single truth to compare with"}
    df, _ = logged_dataset(dirs, work, table, catalogue, reward)
    data = ope.LoggedData.from_frame(df, space.actions, space.roles)
    tasks = oe.eval_tasks(data)
    out = {"days": [d.name for d in dirs], "decisions": int(len(df)), "episodes": int(len(tasks))}
    for name, pol in (("bandit_final", bandit), ("static_table", static)):
        ev = ope.evaluate_policy(data, pol, ope.OPEConfig(n_boot=config.n_boot, seed=config.seed),
                                 progress=lambda *_: None)
        e = ev.estimates[ope.HEADLINE_ESTIMATOR]
        truth = _value(sim, pol, tasks)
        out[name] = {"estimate": e.value, "ci_low": e.ci_low, "ci_high": e.ci_high, "true_value": truth,
                     "relative_error": None if e.value is None else abs(e.value - truth) / abs(truth)}
    return out


def summarise(days: list[dict], config: LoopConfig) -> dict:
    """Cumulative regret per arm, promotions, wrong promotions, recovery after each change."""
    oracle = np.array([d["oracle"] for d in days])
    out: dict = {"days": len(days), "cumulative_regret": {}, "mean_value": {}}
    for arm in ("static_table", "bandit", "nightly"):
        if arm in days[0]:
            v = np.array([d[arm] for d in days])
            out["cumulative_regret"][arm] = float((oracle - v).sum())
            out["mean_value"][arm] = float(v.mean())
    out["mean_value"]["oracle"] = float(oracle.mean())
    if "nightly" in days[0]:
        st = out["cumulative_regret"]["static_table"]
        out["nightly_regret_share_of_static"] = out["cumulative_regret"]["nightly"] / st if st > 0 else None
        out["promotions"] = sum(bool(d.get("promoted")) for d in days)
        out["offline_gate_passed"] = sum(bool(d.get("offline_gate_passed")) for d in days)
        out["offline_gate_wrong"] = sum(bool(d.get("offline_gate_wrong")) for d in days)
        out["rejected_online"] = out["offline_gate_passed"] - out["promotions"]
        abs_ = [d["online_ab"] for d in days if "online_ab" in d]
        out["online_ab"] = {"promotions_tested": len(abs_),
                            "ope_difference_inside": sum(bool(a["ope_difference_inside"]) for a in abs_),
                            "first_from_static_inside": next((a["ope_difference_inside"] for a in abs_
                                                              if a["from"] == "static_table"), None)}
        out["wrong_promotions"] = sum(bool(d.get("wrong_promotion")) for d in days)
        out["changes_detected"] = [d["day"] for d in days if d.get("change_detected")]
        out["recovery"] = {}
        for change in config.world.changes():
            gaps = {d["day"]: (d["oracle"] - d["nightly_deployed"]) / abs(d["oracle"]) for d in days
                    if change <= d["day"] < change + 10}
            back = next((day - change for day, g in sorted(gaps.items()) if g <= 0.05), None)
            out["recovery"][str(change)] = {"days_to_within_5pct": back,
                                            "gap_on_day_3": gaps.get(change + 3),
                                            "within_5pct_by_day_3": back is not None and back <= 3}
    return out


def plot_days(days: list[dict], title: str = "") -> bytes:
    """The true value of each arm's acting policy by day (and the nightly loop's deployed policy)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    x = [d["day"] + 1 for d in days]
    labels = {"oracle": "oracle", "static_table": "static table", "bandit": "online bandit",
              "nightly": "nightly loop (with exploration)", "nightly_deployed": "nightly loop: served policy"}
    styles = {"oracle": ("k", ":"), "static_table": ("tab:gray", "-"), "bandit": ("tab:orange", "-"),
              "nightly": ("tab:blue", "-"), "nightly_deployed": ("tab:blue", "--")}
    for key, label in labels.items():
        if key in days[0]:
            color, ls = styles[key]
            ax.plot(x, [d[key] for d in days], color=color, ls=ls, lw=1.2, label=label)
    for d in days:
        if d.get("promoted"):
            ax.axvline(d["day"] + 1.5, color="tab:green" if not d.get("wrong_promotion") else "tab:red", lw=0.5)
    ax.set_xlabel("day")
    ax.set_ylabel("true value (expected episode return)")
    ax.set_title(title or "true value of the deployed policy by day (green: a promotion)", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return artifacts.png_bytes(fig)
