"""Logged decisions as arrays: what every offline learner and estimator reads.

Built from the routing dataset (one row per decision, sorted by episode and step). Rows
keep the dataset's order; ``next_index`` links a decision to the next decision of its
episode (-1 when the episode ends there or the next step is missing).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from sage_pipeline.routing.action_space import ActionSpace
from sage_pipeline.routing.catalogue import ModelCatalogue
from sage_pipeline.routing.features import Contexts, FeatureSpec
from sage_pipeline.routing.schema import ROLES

REQUIRED = ("episode_id", "session_id", "step", "role", "model", "action_index", "reward",
            "task_complexity_score", "prompt_tokens", "failure_count", "primary_failure_count",
            "terminal", "split", "propensity")


@dataclass(frozen=True)
class LoggedDecisions:
    contexts: Contexts
    action: np.ndarray  # int64 catalogue index of the logged model
    reward: np.ndarray  # float64 under the dataset's reward_version
    pscore: np.ndarray  # float64 logged propensity; NaN where not logged
    episode: np.ndarray  # int64 episode code (0..n_episodes-1)
    session: np.ndarray  # int64 session code, for grouped folds
    step: np.ndarray  # int64
    terminal: np.ndarray  # bool
    next_index: np.ndarray  # int64, -1 at the end of an episode
    split: np.ndarray  # "train" / "eval"
    actions: tuple[str, ...]
    role_mask: np.ndarray  # (n_roles, K)
    roles: tuple[str, ...] = ROLES  # what contexts.role indexes

    def __len__(self) -> int:
        return len(self.action)

    @property
    def mask(self) -> np.ndarray:
        """(n, K) allowed actions per row."""
        return self.role_mask[self.contexts.role]

    def features(self, spec: FeatureSpec) -> np.ndarray:
        return spec.encode(self.contexts)

    def subset(self, rows: np.ndarray) -> "LoggedDecisions":
        """Rows ``rows`` (a boolean mask or sorted indices), with next_index remapped."""
        idx = np.flatnonzero(rows) if rows.dtype == bool else np.asarray(rows)
        new_pos = np.full(len(self), -1, dtype=np.int64)
        new_pos[idx] = np.arange(len(idx))
        nxt = self.next_index[idx]
        nxt = np.where(nxt >= 0, new_pos[np.maximum(nxt, 0)], -1)
        return LoggedDecisions(self.contexts.take(idx), self.action[idx], self.reward[idx], self.pscore[idx],
                               self.episode[idx], self.session[idx], self.step[idx], self.terminal[idx],
                               nxt, self.split[idx], self.actions, self.role_mask, self.roles)

    def split_rows(self, name: str) -> "LoggedDecisions":
        return self.subset(self.split == name)

    def restrict(self, space) -> "LoggedDecisions":
        """The decisions whose logged model ``space`` allows for the role, with its mask (how
        the ``sage_binary`` learners see logs that also explored other models). A decision
        whose next one is dropped ends its episode there."""
        if tuple(space.actions) != tuple(self.actions) or tuple(space.roles) != tuple(self.roles):
            raise ValueError(f"action space {space.name!r} orders roles/actions differently from the data")
        sub = self.subset(space.in_space(self.contexts.role, self.action))
        return LoggedDecisions(sub.contexts, sub.action, sub.reward, sub.pscore, sub.episode, sub.session, sub.step,
                               sub.terminal, sub.next_index, sub.split, sub.actions, np.asarray(space.mask), sub.roles)


def from_dataset(df: pd.DataFrame, catalogue: ActionSpace | ModelCatalogue) -> LoggedDecisions:
    """Arrays from a routing dataset frame, in ``catalogue``'s roles and action order (an
    :class:`ActionSpace`, or a catalogue for simulator-only data); errors name what is wrong."""
    missing = [c for c in REQUIRED if c not in df.columns]
    if missing:
        raise ValueError(f"routing dataset lacks columns {missing}: materialize routing_dataset with this version")
    if df.empty:
        raise ValueError("routing dataset is empty: nothing to learn from or evaluate on")
    df = df.sort_values(["episode_id", "step"], kind="stable").reset_index(drop=True)
    for col in ("reward", "task_complexity_score"):
        bad = ~np.isfinite(df[col].to_numpy(dtype=np.float64))
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"routing dataset column {col!r} is not finite at decision "
                             f"{df['decision_id'].iat[i] if 'decision_id' in df else i}")
    unknown = set(df["model"]) - set(catalogue.actions)
    if unknown:
        raise ValueError(f"models {sorted(unknown)} in the dataset are not in the action set of {catalogue.source}: "
                         "rematerialize routing_dataset (it writes the action space the dataset uses)")
    episode = pd.factorize(df["episode_id"])[0].astype(np.int64)
    step = df["step"].to_numpy(dtype=np.int64)
    terminal = df["terminal"].to_numpy(dtype=bool)
    n = len(df)
    nxt = np.arange(1, n + 1, dtype=np.int64)
    follows = np.zeros(n, dtype=bool)
    follows[:-1] = (episode[1:] == episode[:-1]) & (step[1:] == step[:-1] + 1)
    nxt = np.where(follows & ~terminal, nxt, -1)
    return LoggedDecisions(
        contexts=Contexts.from_frame(df, catalogue.roles),
        action=df["model"].map(catalogue.index).to_numpy(dtype=np.int64),
        reward=df["reward"].to_numpy(dtype=np.float64),
        pscore=df["propensity"].astype("float64").to_numpy(na_value=np.nan),
        episode=episode, session=pd.factorize(df["session_id"])[0].astype(np.int64), step=step,
        terminal=terminal, next_index=nxt, split=df["split"].to_numpy(dtype=object).astype(str),
        actions=catalogue.actions, role_mask=catalogue.role_mask(), roles=tuple(catalogue.roles),
    )
