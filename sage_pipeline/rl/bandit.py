"""SAGE's Tier 1: an online contextual bandit router (linear Thompson sampling and LinUCB).

One ridge-regression arm per (role, model): ``A[r, k] = ridge * I + sum x x^T`` and
``b[r, k] = sum reward * x`` over the decisions role ``r`` routed to model ``k``, on the
routing features ``x`` (an intercept, the complexity and its square, the attempt, the failure
counts and the log prompt size: :func:`bandit_features`). It works on either action space:
the ``mask`` it is built with says which models each role may take (SAGE's binary
primary/fallback mask, or every candidate). Each decision's reward updates its arm
(:meth:`LinearBandit.update`); the bandit is myopic (the reward of the attempt, not the
episode's return), as SAGE's roadmap has it.

* **LinUCB** (Li et al. 2010): the model with the largest ``x.theta + ucb_alpha * sqrt(x A^-1 x)``,
  mixed with an epsilon floor (uniform over the role's candidates). Its probabilities are exact:
  ``(1 - epsilon) [k == argmax] + epsilon / n_candidates``.
* **Thompson sampling** (Agrawal & Goyal 2013): ``theta ~ N(A^-1 b, posterior_scale^2 A^-1)``, the
  argmax model. The probability that Thompson picks a model has no closed form, so it is
  **estimated by sampling**: ``n_samples`` posterior draws per state give each model's argmax
  frequency, mixed with the same epsilon floor. The bandit then *draws its action from that
  estimate* (choosing one of the draws uniformly is itself a posterior draw), so the logged
  propensity is the exact probability of the action given the draws (what importance
  weighting needs) and an estimate of Thompson's marginal probability with standard error at
  most ``sqrt(p (1 - p) / n_samples)``. The draws are seeded by ``(seed, updates so far)``:
  between two updates ``action_probs`` is a fixed function of the context, so OPE and the
  simulator's ground truth can value the bandit's state like any policy.

The bandit implements the policy contract (``actions``, ``role_mask``, ``action_probs``), so
:class:`sage_pipeline.rl.router.Router` serves it with the confidence floor and the YAML
fallback like a promoted checkpoint, and its logs (propensity per decision) feed the offline
chain and OPE. Its state is one ``.npz`` file written atomically (:meth:`save` / :func:`load_bandit`).
numpy only.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from sage_pipeline import artifacts
from sage_pipeline.routing.collector import simulate_episodes
from sage_pipeline.routing.features import Contexts, log_tokens, scaled_count
from sage_pipeline.routing.policy import sample_actions

ALGORITHMS = ("thompson", "linucb")
FORMAT, VERSION = "sage_linear_bandit", 1
FEATURES = ("intercept", "task_complexity_score", "task_complexity_score^2", "step", "failure_count",
            "primary_failure_count", "log_prompt_tokens")
MAX_COUNT = 4.0  # counts are clipped to this and divided by it


@dataclass(frozen=True)
class BanditConfig:
    algorithm: str = "thompson"  # ALGORITHMS
    ridge: float = 1.0  # prior precision of each arm's weights
    ucb_alpha: float = 0.5  # LinUCB: width of the confidence bonus
    posterior_scale: float = 0.3  # Thompson: the reward noise's sd, scaling the posterior covariance
    epsilon: float = 0.05  # floor: this share of decisions is uniform over the role's candidates
    n_samples: int = 256  # Thompson: posterior draws behind each estimated propensity
    seed: int = 0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}")
        if not 0.0 < self.epsilon <= 1.0:
            raise ValueError(f"epsilon must lie in (0, 1] so every candidate keeps a propensity > 0, "
                             f"got {self.epsilon!r}")
        for k in ("ridge", "posterior_scale"):
            if not getattr(self, k) > 0:
                raise ValueError(f"{k} must be > 0, got {getattr(self, k)!r}")
        if self.ucb_alpha < 0 or self.n_samples < 1:
            raise ValueError(f"ucb_alpha must be >= 0 and n_samples >= 1, got {self.ucb_alpha!r}, "
                             f"{self.n_samples!r}")


class BanditStateError(ValueError):
    """A bandit state file that cannot be loaded; the message names the file and the field."""


def bandit_features(ctx: Contexts) -> np.ndarray:
    """(n, d) float64: :data:`FEATURES` of each decision (missing prompt sizes encode as 0)."""
    c = np.asarray(ctx.task_complexity_score, dtype=np.float64)
    count = lambda v: scaled_count(np.asarray(v, dtype=np.float64), MAX_COUNT)  # noqa: E731
    return np.column_stack([np.ones(len(ctx)), c, c * c, count(ctx.step), count(ctx.failure_count),
                            count(ctx.primary_failure_count), log_tokens(ctx.prompt_tokens)])


class LinearBandit:
    """Per-(role, model) linear arms; see the module doc for the two rules and their propensities."""

    def __init__(self, actions: tuple[str, ...], roles: tuple[str, ...], mask: np.ndarray,
                 config: BanditConfig = BanditConfig(), name: str | None = None) -> None:
        mask = np.asarray(mask, dtype=bool)
        if mask.shape != (len(roles), len(actions)):
            raise ValueError(f"mask has shape {mask.shape}, expected (roles, models) = ({len(roles)}, {len(actions)})")
        empty = [r for r, row in zip(roles, mask) if not row.any()]
        if empty:
            raise ValueError(f"roles {empty} have no candidate model in the mask: every role needs at least one")
        self.actions, self.roles, self.mask, self.config = tuple(actions), tuple(roles), mask, config
        self.name = name or config.algorithm
        d = len(FEATURES)
        self.A = np.tile(np.eye(d) * config.ridge, (len(roles), len(actions), 1, 1))
        self.b = np.zeros((len(roles), len(actions), d))
        self.updates = 0  # decisions learned from
        self.rng = np.random.default_rng(config.seed)  # draws the actions act() takes
        self._cache: tuple[int, np.ndarray, np.ndarray] | None = None

    @classmethod
    def for_space(cls, space, config: BanditConfig = BanditConfig(), name: str | None = None) -> "LinearBandit":
        """On an ActionSpace (its mask: ``space.binary()`` for SAGE's primary/fallback) or a catalogue."""
        mask = space.mask if hasattr(space, "mask") else space.role_mask()
        return cls(tuple(space.actions), tuple(space.roles), mask, config, name)

    # ------------------------------------------------------------------ the contract
    @property
    def role_mask(self) -> np.ndarray:
        return self.mask

    @property
    def propensity_method(self) -> str:
        if self.config.algorithm == "linucb":
            return f"exact (LinUCB argmax with an epsilon floor of {self.config.epsilon:g})"
        return (f"estimated by sampling ({self.config.n_samples} Thompson posterior draws per state, the action "
                f"drawn from that estimate; epsilon floor {self.config.epsilon:g})")

    def _posterior(self) -> tuple[np.ndarray, np.ndarray]:
        """(theta (R, K, d), A^-1 (R, K, d, d)), recomputed only after an update."""
        if self._cache is None or self._cache[0] != self.updates:
            inv = np.linalg.inv(self.A)
            self._cache = (self.updates, np.einsum("rkij,rkj->rki", inv, self.b), inv)
        return self._cache[1], self._cache[2]

    def greedy_probs(self, ctx: Contexts) -> np.ndarray:
        """(n, K) the rule's probabilities before the epsilon floor (LinUCB: one-hot; Thompson:
        argmax frequencies over ``n_samples`` posterior draws seeded by the state)."""
        x = bandit_features(ctx)
        theta, inv = self._posterior()
        role = np.asarray(ctx.role, dtype=np.int64)
        out = np.zeros((len(ctx), len(self.actions)))
        S = self.config.n_samples
        for r in np.unique(role):
            rows = np.flatnonzero(role == r)
            cand = np.flatnonzero(self.mask[r])
            xr = x[rows]
            if self.config.algorithm == "linucb":
                width = np.sqrt(np.maximum(np.einsum("nd,kde,ne->nk", xr, inv[r, cand], xr), 0.0))
                score = xr @ theta[r, cand].T + self.config.ucb_alpha * width
                out[rows, cand[np.argmax(score, axis=1)]] = 1.0
            else:
                chol = np.linalg.cholesky(inv[r, cand])  # (k, d, d)
                rng = np.random.default_rng([self.config.seed, self.updates, int(r)])  # a role's draws: its own
                z = rng.standard_normal((len(cand), S, x.shape[1]))
                draws = theta[r, cand][:, None, :] + self.config.posterior_scale * np.einsum("kde,kse->ksd", chol, z)
                score = np.einsum("nd,ksd->nks", xr, draws)  # (n_r, k, S)
                best = np.argmax(score, axis=1)  # (n_r, S)
                out[np.ix_(rows, cand)] = (best[:, :, None] == np.arange(len(cand))).mean(axis=1)
        return out

    def action_probs(self, ctx: Contexts) -> np.ndarray:
        m = self.mask[np.asarray(ctx.role, dtype=np.int64)].astype(np.float64)
        eps = self.config.epsilon
        return (1.0 - eps) * self.greedy_probs(ctx) + eps * m / m.sum(axis=1, keepdims=True)

    def thompson_choice(self, ctx: Contexts, rng: np.random.Generator) -> np.ndarray:
        """Plain Thompson sampling, one fresh posterior draw per row (no floor): the reference the
        estimated propensities are tested against."""
        x = bandit_features(ctx)
        theta, inv = self._posterior()
        out = np.empty(len(ctx), dtype=np.int64)
        for i, r in enumerate(np.asarray(ctx.role, dtype=np.int64)):
            cand = np.flatnonzero(self.mask[r])
            draws = [rng.multivariate_normal(theta[r, k], self.config.posterior_scale ** 2 * inv[r, k]) for k in cand]
            out[i] = cand[int(np.argmax([x[i] @ d for d in draws]))]
        return out

    # ------------------------------------------------------------------ acting and learning
    def act(self, ctx: Contexts) -> tuple[np.ndarray, np.ndarray]:
        """(actions, logged propensities): one model per row drawn from :meth:`action_probs`."""
        probs = self.action_probs(ctx)
        a = sample_actions(probs, self.rng)
        return a, probs[np.arange(len(a)), a]

    def update(self, ctx: Contexts, action: np.ndarray, reward: np.ndarray) -> None:
        """Learn from each decision's reward (the sufficient statistics add up, so a batch equals
        the same decisions one at a time)."""
        action = np.asarray(action, dtype=np.int64)
        reward = np.asarray(reward, dtype=np.float64)
        role = np.asarray(ctx.role, dtype=np.int64)
        if not (len(action) == len(reward) == len(ctx)):
            raise ValueError(f"update: {len(ctx)} contexts, {len(action)} actions, {len(reward)} rewards")
        if len(action) and (action.min() < 0 or action.max() >= len(self.actions)):
            raise ValueError(f"update: action indices must lie in 0..{len(self.actions) - 1}")
        bad = ~self.mask[role, action]
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"update: row {i} routed role {self.roles[role[i]]!r} to {self.actions[action[i]]!r}, "
                             f"which is not one of its candidates ({int(bad.sum())} such rows)")
        if not np.isfinite(reward).all():
            raise ValueError(f"update: non-finite reward at row {int(np.argmax(~np.isfinite(reward)))}")
        x = bandit_features(ctx)
        np.add.at(self.A, (role, action), np.einsum("ni,nj->nij", x, x))
        np.add.at(self.b, (role, action), reward[:, None] * x)
        self.updates += len(action)

    def counts(self) -> np.ndarray:
        """(R, K) decisions learned from per arm (the trace of A above the prior, / intercept)."""
        return np.rint(self.A[:, :, 0, 0] - self.config.ridge).astype(np.int64)

    # ------------------------------------------------------------------ state
    def save(self, path: str | Path) -> Path:
        """One ``.npz`` (arrays and a JSON header), replaced atomically."""
        meta = {"format": FORMAT, "version": VERSION, "name": self.name, "config": asdict(self.config),
                "actions": list(self.actions), "roles": list(self.roles), "features": list(FEATURES),
                "updates": self.updates, "rng": self.rng.bit_generator.state}
        with artifacts.atomic_open(path, "wb") as fh:
            np.savez(fh, meta=np.array(json.dumps(meta)), A=self.A, b=self.b, mask=self.mask)
        return Path(path)


def load_bandit(path: str | Path) -> LinearBandit:
    """The bandit saved at ``path``; a missing or damaged file is an error naming it and the field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"bandit state {path} not found: save one with LinearBandit.save, or start a "
                                "fresh bandit")
    fix = "delete it to start a fresh bandit, or restore a saved copy"
    try:
        with np.load(path, allow_pickle=False) as z:
            absent = [k for k in ("meta", "A", "b", "mask") if k not in z.files]
            if absent:
                raise BanditStateError(f"bandit state {path}: missing array {absent[0]!r} (it holds {z.files}): {fix}")
            arrays = {k: z[k] for k in ("meta", "A", "b", "mask")}
    except BanditStateError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise BanditStateError(f"bandit state {path} is not a readable .npz ({exc}): {fix}") from exc
    try:
        meta = json.loads(str(arrays["meta"]))
    except json.JSONDecodeError as exc:
        raise BanditStateError(f"bandit state {path}: field 'meta' is not JSON ({exc}): {fix}") from exc
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BanditStateError(f"bandit state {path}: field 'meta.format' is "
                               f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r}: "
                               "not a bandit state file")
    if meta.get("version") != VERSION or meta.get("features") != list(FEATURES):
        raise BanditStateError(f"bandit state {path}: version {meta.get('version')!r} with features "
                               f"{meta.get('features')!r}; this code reads version {VERSION} with "
                               f"{list(FEATURES)}: {fix}")
    try:
        known = {f.name for f in fields(BanditConfig)}
        config = BanditConfig(**{k: v for k, v in meta["config"].items() if k in known})
        bandit = LinearBandit(tuple(meta["actions"]), tuple(meta["roles"]), arrays["mask"], config, meta["name"])
    except (KeyError, TypeError, ValueError) as exc:
        raise BanditStateError(f"bandit state {path}: bad field in 'meta' or 'mask' ({exc}): {fix}") from exc
    for key in ("A", "b"):
        want = getattr(bandit, key).shape
        if arrays[key].shape != want:
            raise BanditStateError(f"bandit state {path}: field {key!r} has shape {arrays[key].shape}, expected "
                                   f"{want} for {len(bandit.roles)} roles x {len(bandit.actions)} models: {fix}")
        if not np.isfinite(arrays[key]).all():
            raise BanditStateError(f"bandit state {path}: field {key!r} holds non-finite values: {fix}")
    bandit.A, bandit.b = arrays["A"].astype(np.float64), arrays["b"].astype(np.float64)
    bandit.updates = int(meta["updates"])
    bandit.rng.bit_generator.state = meta["rng"]
    return bandit


# ---------------------------------------------------------------------- online in the simulator
def run_online(bandit: LinearBandit, sim, tasks, rng: np.random.Generator, batch: int = 1) -> dict[str, np.ndarray]:
    """Route ``tasks`` (a simulator's) with ``bandit``, ``batch`` tasks at a time, learning from every
    decision's reward after each batch; returns the decision rows (as the collector's
    ``simulate_episodes``: task, step, action, propensity, outcome, reward) over all tasks."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    parts = []
    for i in range(0, len(tasks), batch):
        idx = np.arange(i, min(i + batch, len(tasks)))
        sub = tasks.take(idx)
        rows = simulate_episodes(sim, sub, bandit, rng)
        ctx = sim.contexts(sub.take(rows["task"]), rows["step"], rows["primary_failure_count"])
        bandit.update(ctx, rows["action"], rows["reward"])
        rows["task"] = idx[rows["task"]]
        parts.append(rows)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
