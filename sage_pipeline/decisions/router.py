"""The router lever of the decision ledger: a router checkpoint judged against the policy SAGE runs now,
on SAGE's own exploring logs, with one error level over every night and every candidate.

**The contrast.** Each logged episode (one ``sage run`` task; its unit id is the routing dataset's
``episode_id``, session/task) gives one observation per candidate::

    x = (w_cand - w_dep) * (R - c)

- ``w = prod_t pi(a_t | s_t) / p_t`` over the episode's decisions in step order: ``p_t`` the exact
  probability SAGE's router had of the logged model (reconstructed per decision from the exploring
  checkpoint deployed then, ``sage.explore``), ``pi`` the target policy's probability of it;
- ``R`` the task's objective (task_v1, the episode's return after ``offline_eval.objective_rows``) clipped
  to the stated bounds ``[objective_low, objective_high]`` (a task outside them counts at the bound, and
  is counted: ``clipped``);
- ``c`` a centre fixed before the episode: the running mean of ``R`` over every earlier episode of the
  log (:func:`centres`; a prior of ``centre_prior_weight`` episodes at the bounds' midpoint).

With every ``p_t`` exact, ``E[x | all earlier episodes] = V(cand) - V(dep)`` whatever ``c``: the
candidate's gain over the deployed policy in the objective's own units, so the ledger's
``min_useful_gain`` means the same here as on the other levers. The centre is a control variate: it
changes the variance, never the mean.

**Bounds stated before the episode.** Each re-weighted decision's ratio is at most ``1 / min_propensity``
(``min_propensity``: the smallest probability the exploring checkpoint gives either model of a
randomised decision, its rate), and at most ``max_randomised`` (``K``) decisions of an episode are
re-weighted, so ``0 <= w <= W = (1 / min_propensity) ** K`` and
``|x| <= W * max(c - objective_low, objective_high - c)``: known before the episode is seen, as the
betting e-process needs (``evidence.py``).

**What is estimated, exactly (the cap).** Only an episode's first ``K`` randomised decisions (logged
probability below 1) are re-weighted; every decision after the ``K``-th follows the log (ratio 1). So
``x`` is unbiased for the gain of *"the candidate for a task's first K randomised decisions, SAGE's
exploring checkpoint after"* over the same with the deployed policy: a well-defined pair of
(history-dependent) policies, never a clipped weight whose bias has no sign. For a task with at most
``K`` randomised decisions it is the candidate's gain itself; tasks with more are counted
(``truncated``) and said in every row. Dropping long episodes instead would select on the episode's
own length (an outcome of the policies compared), so it is not done.

**What the bound costs.** The bets are capped at ``cap / (W * max(c - low, high - c))``, so power falls as
``W`` grows: at the exploring checkpoint's default rate 0.1, ``W`` is 10 per re-weighted decision.
Two settings buy it back without touching validity: a higher exploration rate (``min_propensity`` with it),
and exploring only the roles tonight's candidates change (``sage.explore.ExploreConfig.roles``): the cap
counts randomised decisions only, so the ``K`` re-weighted ones are then the ones that matter.

**Which episodes count.** For each candidate, in log order (its first decision's ``timestamp``, then
its id), each episode once: only episodes that started after the candidate was proposed
(``payload.proposed_at``: the latest log time it was trained or selected on), never one it was
selected on (``selected_on``), and only episodes whose every decision has an exact propensity (a
``propensity_source`` of :data:`EXACT_SOURCES`, or a decision no router reaches: SAGE's coder, whose
bandit the policies follow). An episode with a randomised decision whose two models are not both at
least ``min_propensity`` likely (an exploring checkpoint run at a lower rate than stated) is left out
and counted: ``min(p, 1 - p)`` is the checkpoint's rate, a property of what was deployed, not of the
draw, so leaving such episodes out selects nothing about the outcome.

**Support.** Where SAGE's router decided deterministically (p = 1) before the cap, a policy that takes
the other model there cannot be valued (no logged decision saw it). A pending candidate found so is
dropped, naming the role; an accepted one gets no evidence that night, said in its row.

**The lever** (``ledger`` lever ``router``; candidate key: :func:`candidate_key` of what SAGE serves, the
``policy.joblib`` it loads *and* the confidence floor it applies. SAGE reads the floor from the environment,
not the file (``sage.rl.policy.load_routing_policy``: ``float(SAGE_RL_MIN_CONFIDENCE)``, 0.55 when unset), and
``ModelRouter.select`` takes a classifier's choice only when ``min(1, |p - 0.5| * 2) >= floor``: the same
classifiers at two floors route differently, so the key hashes the file's sha256 with the floor as SAGE
compares it (every floor <= 0 alike, every floor > 1 alike). A key written before (the file's sha256 alone)
still names its folder: :func:`folder_matches`). The deployed policy is a stack read from the ledger alone
(:func:`deployed_stack`): SAGE's YAML table (:data:`TABLE`) at the bottom, then each accepted candidate over
the one it was accepted against (``payload.incumbent``). Every night (:func:`judge`):

1. each accepted candidate, bottom up, is compared with its own incumbent on the new episodes (its
   probation: the ledger reverts it when its advantage is excluded above ``min_useful_gain``); a revert
   also reverts every candidate accepted on top of it, whose comparison was against it, and the
   deployed policy becomes the reverted one's incumbent (the previous one, or the table);
2. a pending candidate proposed against another policy than the one deployed now is dropped (its
   evidence was against a policy SAGE no longer runs: comparing with the deployed policy is the
   point); every other pending candidate is compared with the deployed policy and decided by
   ``Ledger.decide``; when several reach their level the same night, the one with the highest
   estimate is accepted and becomes the deployed policy, and the others are dropped for the same
   reason.

Every transition goes through the ledger (``Ledger.decide`` or ``Ledger.transition``), so the guarantee
is the ledger's: per lever, the chance any candidate without a gain over the policy deployed when it
was proposed is ever accepted, over every night and every candidate, is at most ``alpha`` (candidate
``j`` at ``alpha / (j (j + 1))``, each an e-process). Pure: numpy and pandas; the policies' probabilities
come from the caller (``offline_eval``'s ledger gate computes them with ``ope.policy_probs``), so this
module imports nothing of ``rl/``.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_pipeline.decisions import evidence as ev
from sage_pipeline.decisions.ledger import Candidate, Ledger, LedgerError

LEVER = "router"
STREAM = "exploring_logs"  # the candidate's evidence stream: one observation per logged episode
TABLE = "yaml_table"  # the deployed policy's key when no checkpoint is: SAGE's YAML table (never a sha256)
# propensity_source values that are exact (routing_dataset: logged on the step, a learned
# MODEL_ROUTING_DECISION's, or reconstructed from the deployment record); 'missing' and 'estimated_bc' are not
EXACT_SOURCES = ("logged", "logged_routing_decision", "reconstructed")
DETERMINISTIC = 1.0 - 1e-9  # a logged probability this close to 1: the router had no other choice (as ope's)
_REQUIRED = ("episode_id", "step", "propensity", "propensity_source", "reward", "timestamp")


FLOOR_ENV = "SAGE_RL_MIN_CONFIDENCE"  # where SAGE reads its floor (sage.rl.policy.load_routing_policy)


def served_floor(floor: float) -> str:
    """The floor as SAGE's router compares it: ``conf >= floor`` with ``conf = min(1, |p - 0.5| * 2)`` in [0, 1],
    so every floor <= 0 serves as 0 and every floor > 1 as "never" (SAGE's YAML on every role); else the float
    SAGE parses from the deploy's ``str(float(floor))``."""
    f = float(str(float(floor)))
    if math.isnan(f):
        raise RouterEvidenceError("a confidence floor of NaN: SAGE would compare every confidence false (YAML "
                                  "everywhere); give the checkpoint a number")
    return "0.0" if f <= 0.0 else ("above 1" if f > 1.0 else repr(f))


def candidate_key(joblib_sha256: str, floor: float) -> str:
    """The router candidate's ledger key: the sha256 of the ``policy.joblib`` SAGE loads together with the floor
    it applies (:func:`served_floor`). Two checkpoints SAGE serves alike have one key; two it serves apart,
    two keys."""
    text = f"sage router candidate\npolicy.joblib sha256 {joblib_sha256}\n{FLOOR_ENV} {served_floor(floor)}\n"
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def folder_key(folder: str | Path) -> str:
    """:func:`candidate_key` of a checkpoint folder as SAGE would serve it: its ``policy.joblib``'s sha256 and the
    floor its manifest's ``sage_env`` sets (SAGE's default 0.55 when it sets none)."""
    from sage_pipeline import artifacts
    from sage_pipeline.sage import checkpoint as sage_checkpoint  # scikit-learn's loader: only when a folder is read

    folder = Path(folder)
    env = sage_checkpoint.read_manifest(folder).get("sage_env") or {}
    floor = float(env.get(FLOOR_ENV, sage_checkpoint.SAGE_DEFAULT_MIN_CONFIDENCE))
    return candidate_key(artifacts.file_sha256(folder / sage_checkpoint.JOBLIB_NAME), floor)


def folder_matches(folder: str | Path, key: str) -> bool:
    """Whether the checkpoint at ``folder`` is the candidate ``key`` names: :func:`folder_key`, or, for a key
    written before the floor was part of it, its ``policy.joblib``'s sha256 alone."""
    from sage_pipeline import artifacts
    from sage_pipeline.sage import checkpoint as sage_checkpoint

    return key in (folder_key(folder), artifacts.file_sha256(Path(folder) / sage_checkpoint.JOBLIB_NAME))


class RouterGateConfig(BaseModel):
    """The router contrast's stated bounds (each default declared here once)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    objective_low: float = Field(-1.0, description="the lowest objective (task_v1) an episode counts at: a task "
                                 "scoring below it counts at it (counted). -1: a failed task's costs up to one "
                                 "verified point (an hour of GPU at the default price) are counted exactly")
    objective_high: float = Field(1.0, description="the highest objective an episode counts at (task_v1 <= 1: a "
                                  "verified task at no cost)")
    min_propensity: float = Field(0.1, gt=0.0, le=0.5, description="the smallest probability the exploring "
                                  "checkpoint gives either model of a randomised decision: its rate "
                                  "(sage.explore.DEFAULT_RATE 0.1). A higher rate buys power: the bound W below "
                                  "falls as (1/rate)^K")
    max_randomised: int = Field(2, ge=1, le=8, description="K: an episode's first K randomised decisions are "
                                "re-weighted, the rest follow the log (the estimand is then the gain of the "
                                "candidate on a task's first K randomised decisions; longer tasks are counted). "
                                "The weight bound is W = (1/min_propensity)^K (100 by default)")
    centre_prior_weight: float = Field(1.0, gt=0.0, description="episodes' worth of the centre's prior (the "
                                       "bounds' midpoint) in the running mean c")

    @model_validator(mode="after")
    def _bounds(self) -> RouterGateConfig:
        if not (math.isfinite(self.objective_low) and math.isfinite(self.objective_high)
                and self.objective_low < self.objective_high):
            raise ValueError(f"objective_low {self.objective_low} must be finite and below objective_high "
                             f"{self.objective_high}")
        return self

    def max_weight(self) -> float:
        """W: the largest weight an episode can have, stated before any episode is seen."""
        return (1.0 / self.min_propensity) ** self.max_randomised


DEFAULT = RouterGateConfig()  # the stated bounds' defaults (a frozen model: shared safely)


class RouterEvidenceError(LedgerError):
    """Logs or policies the router contrast cannot use (names the column, episode or policy and the fix)."""


# ------------------------------------------------------------------ the contrast, on arrays
def centres(objective, config: RouterGateConfig = DEFAULT, before_sum=0.0, before_n=0.0) -> np.ndarray:
    """The centre ``c_i`` of each episode along the last axis (log order): the running mean of the
    objectives before it, with ``before_sum``/``before_n`` the sum and count of earlier ones (leading axes
    broadcast: a benchmark's months) and a prior of ``centre_prior_weight`` at the bounds' midpoint."""
    obj = np.asarray(objective, dtype=np.float64)
    w0 = config.centre_prior_weight
    c0 = 0.5 * (config.objective_low + config.objective_high)
    prev = np.cumsum(obj, axis=-1) - obj
    n = np.arange(obj.shape[-1], dtype=np.float64)
    return (w0 * c0 + np.asarray(before_sum, dtype=np.float64)[..., None] + prev) / (
        w0 + np.asarray(before_n, dtype=np.float64)[..., None] + n)


def episode_weights(pi, p, randomised, follows, config: RouterGateConfig = DEFAULT
                    ) -> tuple[np.ndarray, np.ndarray]:
    """(w, unsupported) per episode from per-decision arrays on the last axis (step order; pad with
    ``follows=True``): ``pi`` the target policy's probability of the logged model, ``p`` the logged
    probability, ``randomised`` whether ``p < 1``, ``follows`` a decision no router reaches (ratio 1).
    Decisions after the episode's ``K``-th randomised one follow the log (ratio 1); ``unsupported``: the
    policy leaves the logged model before the cap where the router was deterministic."""
    pi = np.asarray(pi, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    rnd = np.asarray(randomised, dtype=bool)
    fol = np.asarray(follows, dtype=bool) & ~rnd
    before = np.cumsum(rnd, axis=-1) - rnd  # randomised decisions strictly before this one
    under = before < config.max_randomised  # the target (not yet the log) decides here
    safe_p = np.where(rnd, p, 1.0)
    ratio = np.where(under & ~fol, pi / safe_p, 1.0)
    unsupported = (under & ~rnd & ~fol & (pi < DETERMINISTIC)).any(axis=-1)
    return ratio.prod(axis=-1), unsupported


def contrast(w_cand, w_dep, objective, centre, config: RouterGateConfig = DEFAULT
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, lo, hi): ``x = (w_cand - w_dep) * (R - c)`` with ``R`` the objective clipped to the stated
    bounds and ``c`` the centre; ``lo``/``hi`` = ``-/+ W * max(c - low, high - c)``, fixed before the
    episode. Any shape (broadcast)."""
    W = config.max_weight()
    wc, wd = np.asarray(w_cand, dtype=np.float64), np.asarray(w_dep, dtype=np.float64)
    if np.any(wc < 0) or np.any(wd < 0) or np.any(wc > W * (1 + 1e-9)) or np.any(wd > W * (1 + 1e-9)):
        raise RouterEvidenceError(f"a weight outside [0, W = {W:g}]: a logged probability below min_propensity "
                                  f"{config.min_propensity} reached the contrast (Episodes leaves such episodes out)")
    c = np.asarray(centre, dtype=np.float64)
    r = np.clip(np.asarray(objective, dtype=np.float64), config.objective_low, config.objective_high)
    bound = W * np.maximum(c - config.objective_low, config.objective_high - c)
    x = (wc - wd) * (r - c)
    return x, -bound, bound


# ------------------------------------------------------------------ the logged episodes, from a frame
@dataclass(frozen=True)
class Episodes:
    """The logged episodes of a routing dataset frame, in log order, with what the contrast needs.

    ``frame``: their decisions sorted (episode start, episode id, step): the rows the caller computes each
    policy's probability of the logged model on (:meth:`weights` takes that (n,) array)."""

    frame: pd.DataFrame = field(repr=False)
    ids: np.ndarray  # (E,) episode ids, log order
    start: np.ndarray  # (E,) datetime64[ns] UTC of each episode's first decision
    objective: np.ndarray  # (E,) clipped to the stated bounds
    clipped: np.ndarray  # (E,) bool
    centre: np.ndarray  # (E,)
    exact: np.ndarray  # (E,) every decision's propensity exact
    below_bound: np.ndarray  # (E,) a randomised decision's models not both >= min_propensity likely
    truncated: np.ndarray  # (E,) more than K randomised decisions
    grid: tuple = field(repr=False)  # (row index (E, D) into frame or -1, p, randomised, follows) padded
    no_start: int = 0  # episodes left out: no parsable timestamp (cannot be ordered or dated)
    config: RouterGateConfig = DEFAULT

    @classmethod
    def from_frame(cls, df: pd.DataFrame, config: RouterGateConfig = DEFAULT,
                   follows_log_sources: Sequence[str] = ()) -> Episodes:
        """From routing dataset rows whose ``reward`` is the objective on each episode's last decision
        (``offline_eval.objective_rows``); ``follows_log_sources``: ``policy_source`` values no router reaches
        (``ope.FOLLOWS_LOG_SOURCES``: SAGE's coder)."""
        missing = [c for c in _REQUIRED if c not in df.columns]
        if missing:
            raise RouterEvidenceError(f"the routing dataset frame lacks {missing}: read them from "
                                      "routing/routing_v1.parquet (the router contrast orders episodes by "
                                      "'timestamp' and needs exact propensities)")
        ts = pd.to_datetime(df["timestamp"], utc=True, errors="coerce", format="ISO8601")
        eid = df["episode_id"].astype(str)
        start = ts.groupby(eid, sort=False).transform("min").dt.tz_localize(None)  # UTC, naive
        ok = start.notna().to_numpy()
        no_start = int(eid[~ok].nunique())
        d = df.loc[ok].assign(_start=start[ok].to_numpy(), _eid=eid[ok].to_numpy())
        d = d.sort_values(["_start", "_eid", "step"], kind="mergesort").reset_index(drop=True)
        codes, ids = pd.factorize(d["_eid"], sort=False)
        n, E = len(d), len(ids)
        first = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]]) if n else np.zeros(0, dtype=np.int64)
        reward = d["reward"].to_numpy(dtype=np.float64, na_value=np.nan)
        if np.isnan(reward).any():
            bad = d.loc[np.isnan(reward), "_eid"].iloc[0]
            raise RouterEvidenceError(f"episode {bad!r} has a decision without a reward: judge scored episodes "
                                      "only (offline_eval.objective_rows leaves unknown verdicts out)")
        raw = np.add.reduceat(reward, first) if n else np.zeros(0)
        lo, hi = config.objective_low, config.objective_high
        objective = np.clip(raw, lo, hi)
        follows = (d["policy_source"].isin(tuple(follows_log_sources)).to_numpy(dtype=bool)
                   if "policy_source" in d and follows_log_sources else np.zeros(n, dtype=bool))
        p = d["propensity"].astype("float64").to_numpy(na_value=np.nan)
        src = d["propensity_source"].astype(str).isin(EXACT_SOURCES).to_numpy()
        exact_row = follows | (src & np.isfinite(p) & (p > 0.0) & (p <= 1.0 + 1e-12))
        p = np.where(follows, 1.0, p)
        rnd = exact_row & ~follows & (p < DETERMINISTIC)
        low_rate = rnd & (np.minimum(p, 1.0 - p) < config.min_propensity - 1e-12)
        # per episode, padded to the longest: (E, D)
        pos = np.arange(n) - (first[codes] if n else 0)
        D = int(pos.max()) + 1 if n else 1
        row = np.full((E, D), -1, dtype=np.int64)
        row[codes, pos] = np.arange(n)

        def grid_of(x, fill):
            g = np.full((E, D), fill, dtype=np.asarray(x).dtype)
            g[codes, pos] = x
            return g

        g_rnd = grid_of(rnd, False)
        return cls(frame=d.drop(columns=["_start", "_eid"]), ids=np.asarray(ids, dtype=object),
                   start=d["_start"].to_numpy(dtype="datetime64[ns]")[first] if n else np.zeros(0, "datetime64[ns]"),
                   objective=objective, clipped=objective != raw, centre=centres(objective, config),
                   exact=grid_of(exact_row, True).all(axis=1), below_bound=grid_of(low_rate, False).any(axis=1),
                   truncated=g_rnd.sum(axis=1) > config.max_randomised,
                   grid=(row, grid_of(np.where(np.isfinite(p), p, 1.0), 1.0), g_rnd,
                         grid_of(follows, True) | (row < 0)),
                   no_start=no_start, config=config)

    def __len__(self) -> int:
        return len(self.ids)

    def weights(self, pi) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(w, unsupported, unsupported_rows) of a policy whose probability of each ``frame`` row's logged
        model is ``pi`` (n,): per episode its weight and whether it is unsupported, and the frame rows
        where it leaves a deterministic decision."""
        pi = np.asarray(pi, dtype=np.float64).ravel()
        if len(pi) != len(self.frame):
            raise RouterEvidenceError(f"{len(pi)} probabilities for {len(self.frame)} logged decisions: compute "
                                      "them on Episodes.frame")
        row, p, rnd, fol = self.grid
        g_pi = np.where(row >= 0, pi[np.maximum(row, 0)], 1.0)
        w, unsupported = episode_weights(g_pi, p, rnd, fol, self.config)
        before = np.cumsum(rnd, axis=1) - rnd
        bad = (before < self.config.max_randomised) & ~rnd & ~fol & (g_pi < DETERMINISTIC)
        return w, unsupported, row[bad]


# ------------------------------------------------------------------ the deployed policy, from the ledger
def deployed_stack(ledger: Ledger) -> list[Candidate]:
    """The accepted router candidates from the bottom (accepted against the table) to the top (deployed)."""
    accepted = ledger.of(LEVER, "accepted")
    chain: list[Candidate] = []
    key = TABLE
    while True:
        above = [c for c in accepted if c.payload.get("incumbent") == key and c not in chain]
        if not above:
            return chain
        if len(above) > 1:
            raise LedgerError(f"router candidates {', '.join(c.id for c in above)} are all accepted against "
                              f"{_short(key)}: the ledger was changed by hand; revert all but one")
        chain.append(above[0])
        key = above[0].key


def deployed_key(ledger: Ledger) -> str:
    """The key of the policy SAGE should run: the top accepted candidate's sha256, or :data:`TABLE`."""
    stack = deployed_stack(ledger)
    return stack[-1].key if stack else TABLE


def deployed_candidate(ledger: Ledger) -> Candidate | None:
    stack = deployed_stack(ledger)
    return stack[-1] if stack else None


def _short(key: str) -> str:
    return "SAGE's YAML table" if key == TABLE else f"checkpoint {key[:12]}"


def _iso(ts) -> str:
    t = pd.Timestamp(ts)
    t = t.tz_localize("UTC") if t.tzinfo is None else t.tz_convert("UTC")
    return t.isoformat()


def propose(ledger: Ledger, key: str, *, night: str, proposed_at, selected_on: Sequence[str] = (),
            description: str = "", payload: dict | None = None) -> tuple[Candidate, bool]:
    """The router candidate for checkpoint ``key`` (its sha256): new, pending against the policy deployed
    now (``payload.incumbent``), judged only on episodes that start after ``proposed_at`` (the latest log
    time it was trained or selected on) and never on ``selected_on``; or the existing one (False). What it was
    selected on (every episode of its train and select split: thousands) is kept as the ledger's id set
    beside it (``Candidate.selected_on_ids``: count and sha256 in the ledger, the ids in ``ids/<sha256>.txt``),
    not as a list inside the ledger."""
    if key == TABLE or not key:
        raise LedgerError(f"a router candidate's key is its checkpoint's sha256, not {key!r}")
    old = ledger.find(LEVER, key)
    if old is not None:
        return ledger.propose(LEVER, key, night=night, selected_on=selected_on, compact=True)
    facts = {**(payload or {}), "incumbent": deployed_key(ledger), "proposed_at": _iso(proposed_at)}
    return ledger.propose(LEVER, key, night=night, description=description, payload=facts, selected_on=selected_on,
                          compact=True)


# ------------------------------------------------------------------ one night
@dataclass
class Feed:
    """What one candidate was given tonight, and what was left out."""

    fed: int = 0
    before_proposal: int = 0
    selected_on: int = 0
    already_judged: int = 0
    inexact: int = 0
    below_bound: int = 0
    truncated: int = 0  # of the fed: more than K randomised decisions (judged on their first K)
    clipped: int = 0  # of the fed: objective outside the stated bounds
    unsupported: str | None = None

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Night:
    """One night of the router lever: what is deployed before and after, every change, a row per candidate."""

    night: str
    deployed_before: str
    deployed_after: str = ""
    accepted: list[str] = field(default_factory=list)
    reverted: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    rows: dict[str, dict] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def _feed(ledger: Ledger, c: Candidate, ep: Episodes, weights: Callable[[str], tuple], against: str) -> Feed:
    f = Feed()
    if not len(ep):
        return f
    proposed_at = np.datetime64(pd.Timestamp(c.payload["proposed_at"]).tz_convert("UTC").tz_localize(None), "ns")
    start = ep.start.astype("datetime64[ns]")
    after = start > proposed_at
    ids = pd.Series(ep.ids, dtype=object)
    judged = ids.isin(set(c.judged_on.get(STREAM, ()))).to_numpy()
    selected = ids.isin(ledger.selected(c)).to_numpy()
    f.before_proposal = int((~after).sum())
    f.already_judged = int((after & judged).sum())
    new = after & ~judged
    f.selected_on = int((new & selected).sum())
    new &= ~selected
    f.inexact = int((new & ~ep.exact).sum())
    new &= ep.exact
    f.below_bound = int((new & ep.below_bound).sum())
    take = np.flatnonzero(new & ~ep.below_bound)
    if not len(take):
        return f
    wc, uc, rc = weights(c.key)
    wd, ud, rd = weights(against)
    bad = take[uc[take] | ud[take]]
    if len(bad):
        rows = np.concatenate([rc, rd])
        sub = ep.frame.iloc[rows] if len(rows) else ep.frame.iloc[:0]
        sub = sub[sub["episode_id"].astype(str).isin(set(ep.ids[bad]))]
        roles = sorted(sub["role"].astype(str).unique()) if "role" in sub else []
        f.unsupported = (f"{len(bad)} of tonight's {len(take)} episodes have decisions SAGE's router made "
                         f"deterministically (roles {', '.join(roles) or '?'}) where {c.id} or {_short(against)} "
                         "takes the other model: the logs cannot value that; deploy an exploring checkpoint that "
                         "explores those roles")
        return f
    x, lo, hi = contrast(wc[take], wd[take], ep.objective[take], ep.centre[take], ep.config)
    f.fed = ledger.add_evidence(c.id, STREAM, x, lo, hi, [str(u) for u in ep.ids[take]])
    f.truncated = int(ep.truncated[take].sum())
    f.clipped = int(ep.clipped[take].sum())
    return f


def judge(ledger: Ledger, ep: Episodes, prob_of: Callable[[str], np.ndarray], night: str) -> Night:
    """Tonight's router decisions (the module doc's steps 1 and 2), every transition through the ledger.

    ``prob_of(key)``: the probability the policy with that key (:data:`TABLE` or a candidate's sha256)
    gives each ``ep.frame`` row's logged model, (n,). Call it before proposing tonight's candidates
    (they are judged from the next night on: every episode so far is before their proposal)."""
    cache: dict[str, tuple] = {}

    def weights(key: str) -> tuple:
        if key not in cache:
            cache[key] = ep.weights(prob_of(key))
        return cache[key]

    out = Night(night, deployed_key(ledger))
    feeds: dict[str, Feed] = {}
    stack = deployed_stack(ledger)
    for c in ledger.of(LEVER, "accepted"):
        if c not in stack:
            ledger.transition(c.id, "reverted", night=night, reason=f"the policy it was accepted against "
                              f"({_short(c.payload.get('incumbent', TABLE))}) is no longer deployed")
            out.reverted.append(c.id)
    # 1. probation, bottom up: each accepted candidate against its own incumbent
    for pos, c in enumerate(stack):
        if c.state != "accepted":
            continue
        feeds[c.id] = _feed(ledger, c, ep, weights, c.payload["incumbent"])
        if ledger.decide(c.id, night) == "reverted":
            out.reverted.append(c.id)
            for above in stack[pos + 1:]:
                if above.state == "accepted":
                    ledger.transition(above.id, "reverted", night=night, reason=(
                        f"it was accepted against {c.id}, reverted tonight: its comparison no longer holds; "
                        f"SAGE goes back to {_short(c.payload['incumbent'])}"))
                    out.reverted.append(above.id)
    # 2. pending: against the policy deployed now
    dep = deployed_key(ledger)
    passed = []
    for c in ledger.of(LEVER, "pending"):
        if c.payload.get("incumbent") != dep:
            _drop_stale(ledger, c, dep, night, out)
            continue
        f = feeds[c.id] = _feed(ledger, c, ep, weights, dep)
        if f.unsupported:
            ledger.transition(c.id, "dropped", night=night, reason=f"unsupported: {f.unsupported}")
            out.dropped.append(c.id)
            continue
        st = ledger.standing(c.id)
        if st["evidence"] >= st["needed"]:
            passed.append((st["estimate"], c))
        elif ledger.decide(c.id, night) == "dropped":
            out.dropped.append(c.id)
    if passed:
        passed.sort(key=lambda t: (-t[0], t[1].index))
        best = passed[0][1]
        for est, c in passed[1:]:
            ledger.transition(c.id, "dropped", night=night, reason=(
                f"{best.id} reached its level the same night with a higher estimate ({passed[0][0]:+.4f} against "
                f"{est:+.4f}) and is deployed: this one's evidence was against {_short(dep)}"))
            out.dropped.append(c.id)
        ledger.decide(best.id, night)
        out.accepted.append(best.id)
        for c in ledger.of(LEVER, "pending"):
            _drop_stale(ledger, c, best.key, night, out)
    out.deployed_after = deployed_key(ledger)
    for c in ledger.of(LEVER):
        if c.id in feeds or c.history[-1].night == night:
            out.rows[c.id] = row(ledger, c, feeds.get(c.id))
    return out


def _drop_stale(ledger: Ledger, c: Candidate, dep: str, night: str, out: Night) -> None:
    if c.payload.get("incumbent") == dep:
        return
    ledger.transition(c.id, "dropped", night=night, reason=(
        f"the deployed policy changed from {_short(c.payload.get('incumbent', TABLE))}, which its evidence was "
        f"against, to {_short(dep)}: a candidate is judged against what SAGE runs (propose it again retrained, "
        "as a new checkpoint)"))
    out.dropped.append(c.id)


def row(ledger: Ledger, c: Candidate, feed: Feed | None = None) -> dict:
    """One candidate as the report says it: state, estimate and interval, evidence of needed, and why."""
    st = ledger.standing(c.id)
    deployed = deployed_key(ledger) == c.key
    last = c.history[-1]
    if c.state == "pending":
        why = _to_go(ledger, c, st)
    elif c.state == "accepted":
        rev = st.get("revert_evidence")
        why = (("deployed" if deployed else "accepted, under a later acceptance") + f" since {_accepted_night(c)}; "
               f"on probation against {_short(c.payload['incumbent'])}: evidence against a gain of "
               f"{ledger.config.min_useful_gain} is {1.0 if rev is None else rev:.1f} of the "
               f"{st['revert_needed']:.0f} a revert needs ({st.get('probation_n', 0)} episodes since the accept)")
        why = f"{why}. Accepted because {_accept_reason(c)}"
    else:
        why = last.reason
    if feed is not None and feed.unsupported and c.state == "accepted":
        why = f"{why}. No evidence tonight: {feed.unsupported}"
    lo, hi = st["ci"]
    if c.state == "accepted" and st.get("lower_one_sided") is not None:
        lo = st["lower_one_sided"]  # the one-sided bound the accept read (K+ at 1/alpha_j), not the two-sided CS's
    return {"candidate": c.id, "key": c.key, "name": c.payload.get("name") or c.description, "state": c.state,
            "deployed": deployed, "against": _short(c.payload.get("incumbent", TABLE)),
            "estimate": st["estimate"], "ci": [lo, hi], "evidence": st["evidence"], "needed": st["needed"],
            "revert_evidence": st.get("revert_evidence"), "episodes": st["n"], "proposed": c.proposed,
            "tonight": feed.to_dict() if feed is not None else None, "why": why}


def _accepted_night(c: Candidate) -> str:
    return next((t.night for t in reversed(c.history) if t.state == "accepted"), "?")


def _accept_reason(c: Candidate) -> str:
    return next((t.reason for t in reversed(c.history) if t.state == "accepted"), "?")


def _to_go(ledger: Ledger, c: Candidate, st: dict) -> str:
    streams = ledger.streams(c)
    head = (f"pending against {_short(c.payload.get('incumbent', TABLE))}: evidence {st['evidence']:.2f} of the "
            f"{st['needed']:.0f} needed")
    if not streams or st["n"] == 0:
        return f"{head}; no episode yet (judged on episodes logged after {c.payload.get('proposed_at', '?')})"
    s = streams[0]
    need = ev.observations_needed(np.array([math.log(max(st["evidence"], 1e-300))]), st["needed"],
                                  ev.growth_per_observation(s, 0.0))[0]
    more = (f"about {int(need)} more episodes at the current effect" if np.isfinite(need)
            else "no end in sight at the current effect (its estimate is not above 0)")
    return f"{head}; {more} ({st['n']} so far)"
