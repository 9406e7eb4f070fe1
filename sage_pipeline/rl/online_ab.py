"""Online A/B in the routing simulator: SAGE's ``compare-policy``, with ground truth.

Two policies (the static YAML table as A, the served policy as B) route the *same* simulated
tasks with *common random numbers*: every (task, attempt) has its own uniforms for the
timeout, the verification and the reviewer score (and for the policy's draw, when it is
stochastic), drawn once and shared by both arms. Where the two policies choose the same model
at the same state they get the same outcome, so the paired difference of their episode
returns has far less variance than two independent samples (the interval is the paired
one). Each arm's outcome follows the simulator's outcome model exactly
(:meth:`RoutingSimulator.outcome_probs`, reviewer score Binomial(10, q)/10 by inverse CDF).

Reported: each arm's mean return with its 95% interval, the difference B - A with its paired
95% interval, pass rate (episodes that end verified), cost and latency per episode, the
exact values of both policies on the same tasks (the simulator's ground truth), and whether
OPE's estimates (``offline_eval``'s, of the value of B and of B - A) lie inside the online
intervals. numpy only.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from sage_pipeline.routing.catalogue import known_tokens
from sage_pipeline.routing.reward import apply_version, sage_step_reward
from sage_pipeline.routing.routing_simulator import SCORE_LEVELS, RoutingSimulator, Tasks

Z95 = 1.959963984540054


class OnlineABConfig(BaseModel):
    """How large the online A/B is (the ``online_ab`` asset's run config inherits it)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    episodes: int = Field(2000, ge=30, description="simulated tasks each arm routes (the same tasks, common random "
                          "numbers); at least 30, for a normal-approximation interval")
    seed: int = Field(0, description="seed of the tasks and the common random numbers")


@dataclass(frozen=True)
class CommonNumbers:
    """(n_tasks, max_attempts) uniforms shared by both arms."""

    timeout: np.ndarray
    verify: np.ndarray
    score: np.ndarray
    action: np.ndarray

    @classmethod
    def draw(cls, n: int, max_attempts: int, rng: np.random.Generator) -> "CommonNumbers":
        return cls(*(rng.random((n, max_attempts)) for _ in range(4)))


@dataclass(frozen=True)
class ArmResult:
    """Per episode: its return, whether it ended verified, its cost (USD), latency (s), attempts."""

    returns: np.ndarray
    passed: np.ndarray
    cost_usd: np.ndarray
    latency_s: np.ndarray
    attempts: np.ndarray


def _binomial_inverse(u: np.ndarray, q: np.ndarray) -> np.ndarray:
    """k/10 with k the smallest count whose Binomial(10, q) CDF reaches u (the inverse CDF)."""
    k = np.arange(SCORE_LEVELS + 1)
    comb = np.array([math.comb(SCORE_LEVELS, int(i)) for i in k], dtype=np.float64)
    cdf = np.cumsum(comb * q[:, None] ** k * (1.0 - q[:, None]) ** (SCORE_LEVELS - k), axis=1)
    return np.minimum((u[:, None] > cdf).sum(axis=1), SCORE_LEVELS) / SCORE_LEVELS


def run_arm(sim: RoutingSimulator, tasks: Tasks, policy, u: CommonNumbers) -> ArmResult:
    """Route every task's episode with ``policy`` on the common numbers ``u``."""
    n, T = len(tasks), sim.config.max_attempts
    pfc = np.zeros(n, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    out = {k: np.zeros(n) for k in ("returns", "cost_usd", "latency_s", "attempts")}
    passed = np.zeros(n, dtype=bool)
    for t in range(T):
        idx = np.flatnonzero(active)
        if idx.size == 0:
            break
        sub = tasks.take(idx)
        ctx = sim.contexts(sub, np.full(idx.size, t), pfc[idx])
        probs = np.asarray(policy.action_probs(ctx), dtype=np.float64)
        cdf = np.cumsum(probs, axis=1)
        a = np.minimum((u.action[idx, t][:, None] * cdf[:, -1:] > cdf).sum(axis=1), probs.shape[1] - 1)
        pr = sim.outcome_probs(ctx, a)
        timed_out = u.timeout[idx, t] < pr["p_timeout"]
        verified = ~timed_out & (u.verify[idx, t] < pr["p_pass"])
        score = np.where(timed_out, 0.0, _binomial_inverse(u.score[idx, t], np.where(verified, pr["q_pass"],
                                                                                      pr["q_fail"])))
        tokens = known_tokens(ctx.prompt_tokens)
        cost = sim.catalogue.cost_usd(a, tokens)
        r = apply_version(sage_step_reward(score, verified, timed_out, ctx.step, sim.config.reward), cost,
                          sim.config.reward)
        out["returns"][idx] += r
        out["cost_usd"][idx] += cost
        out["latency_s"][idx] += sim.catalogue.latency_s(a, tokens)
        out["attempts"][idx] += 1
        passed[idx] |= verified
        pfc[idx] += ~verified & (a == sim.primary[sub.role])
        active[idx[verified | (t == T - 1)]] = False
    return ArmResult(out["returns"], passed, out["cost_usd"], out["latency_s"], out["attempts"])


def mean_interval(x: np.ndarray) -> dict[str, float]:
    """Mean and its 95% normal-approximation interval."""
    x = np.asarray(x, dtype=np.float64)
    m, se = float(x.mean()), float(x.std(ddof=1) / np.sqrt(len(x)))
    return {"mean": m, "ci_low": m - Z95 * se, "ci_high": m + Z95 * se, "se": se}


def inside(value: float | None, interval: dict[str, float]) -> bool | None:
    return None if value is None else bool(interval["ci_low"] <= value <= interval["ci_high"])


@dataclass(frozen=True)
class OnlineABReport:
    episodes: int
    arms: dict[str, dict]  # name -> value interval, pass rate, cost, latency, attempts, exact value
    difference: dict[str, float]  # B - A: paired mean and interval
    true_difference: float  # exact, on the same tasks
    ope: dict[str, float | None]  # offline_eval's estimates: value of B, of A, their difference
    ope_value_inside: bool | None  # OPE's estimate of B's value inside B's online interval
    ope_difference_inside: bool | None  # OPE's estimated difference inside the online difference interval
    identical_decisions: float  # share of first decisions where A and B chose the same model
    # OPE's and the online difference agree within both their errors (None: OPE's interval unknown)
    ope_agrees: bool | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    def rows(self) -> list[dict]:
        """One row per arm and one for the difference (for metadata tables)."""
        out = [{"arm": name, "mean_return": a["value"]["mean"], "ci_low": a["value"]["ci_low"],
                "ci_high": a["value"]["ci_high"], "true_value": a["true_value"], "pass_rate": a["pass_rate"],
                "cost_usd": a["cost_usd"], "latency_s": a["latency_s"], "attempts": a["attempts"]}
               for name, a in self.arms.items()]
        d = self.difference
        out.append({"arm": "B - A", "mean_return": d["mean"], "ci_low": d["ci_low"], "ci_high": d["ci_high"],
                    "true_value": self.true_difference})
        return out


def online_ab(sim: RoutingSimulator, a, b, config: OnlineABConfig = OnlineABConfig(),
              ope_estimates: dict[str, float | None] | None = None,
              names: tuple[str, str] = ("static_table", "served")) -> OnlineABReport:
    """A (``a``) vs B (``b``) on ``config.episodes`` fresh simulated tasks with common random
    numbers; ``ope_estimates``: offline_eval's ``{"b": V(B), "a": V(A)}`` estimates, when known,
    and its paired 95% interval of B - A (``difference_ci_low``, ``difference_ci_high``), which
    :func:`agrees` needs."""
    rng = np.random.default_rng(config.seed)
    tasks = sim.sample_tasks(config.episodes, rng)
    u = CommonNumbers.draw(len(tasks), sim.config.max_attempts, rng)
    results = {names[0]: run_arm(sim, tasks, a, u), names[1]: run_arm(sim, tasks, b, u)}
    truth = {names[0]: sim.policy_value(a, tasks).mean, names[1]: sim.policy_value(b, tasks).mean}
    arms = {name: {"value": mean_interval(r.returns), "true_value": truth[name],
                   "pass_rate": float(r.passed.mean()), "cost_usd": float(r.cost_usd.mean()),
                   "latency_s": float(r.latency_s.mean()), "attempts": float(r.attempts.mean())}
            for name, r in results.items()}
    diff = mean_interval(results[names[1]].returns - results[names[0]].returns)
    est = dict(ope_estimates or {})
    v_b, v_a = est.get("b"), est.get("a")
    ope = {"value_b": v_b, "value_a": v_a, "difference": None if v_a is None or v_b is None else v_b - v_a,
           "difference_ci_low": est.get("difference_ci_low"), "difference_ci_high": est.get("difference_ci_high")}
    ctx0 = sim.contexts(tasks, np.zeros(len(tasks), dtype=np.int64), np.zeros(len(tasks), dtype=np.int64))
    same = float((np.argmax(a.action_probs(ctx0), axis=1) == np.argmax(b.action_probs(ctx0), axis=1)).mean())
    return OnlineABReport(len(tasks), arms, diff, truth[names[1]] - truth[names[0]], ope,
                          inside(v_b, arms[names[1]]["value"]), inside(ope["difference"], diff), same,
                          agrees(ope, diff))


def agrees(ope: dict, online: dict[str, float]) -> bool | None:
    """Whether OPE's estimated difference and the online one agree within both their errors:
    the gap between them is at most 1.96 standard errors of their difference, OPE's standard
    error read from its paired 95% interval (``difference_ci_low``/``_high``, normal). This is
    the test to act on: "OPE's estimate inside the online interval" asks OPE to be as precise as
    the online A/B, which with common random numbers it is not (importance weights on logged
    data), so that one fails for an honest OPE whenever the online test is the sharper one.
    None when OPE's difference or its interval is unknown."""
    lo, hi, d = ope.get("difference_ci_low"), ope.get("difference_ci_high"), ope.get("difference")
    if d is None or lo is None or hi is None:
        return None
    se_ope = (hi - lo) / (2 * Z95)
    return bool(abs(d - online["mean"]) <= Z95 * math.hypot(se_ope, online["se"]))


def ope_estimates_from_summary(summary: list[dict], policy: str, static: str = "static_table",
                               estimator: str = "step_dr_clip") -> dict[str, float | None]:
    """``{"b": V(policy), "a": V(static)}`` from an offline_eval summary (one row per policy)."""
    rows = {r.get("policy"): r for r in summary if isinstance(r, dict)}
    return {"b": rows.get(policy, {}).get(estimator), "a": rows.get(static, {}).get(estimator)}
