"""Decision contexts: the columnar batch every policy reads.

``Contexts`` holds the named state of a batch of routing decisions (what SAGE's router
sees). Policies implement ``action_probs(contexts) -> (n, K)``. Neural policies turn it
into a float matrix with a :class:`FeatureSpec`, which is saved with their checkpoints
so that a mismatch between a checkpoint and the data is caught by name.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np

from sage_pipeline.routing.schema import ROLES


@dataclass(frozen=True)
class Contexts:
    role: np.ndarray  # int64 index into the action space's roles (RoutingTable.roles)
    task_complexity_score: np.ndarray  # float64 in [0, 1]
    prompt_tokens: np.ndarray  # float64
    step: np.ndarray  # int64, attempt index within the episode
    failure_count: np.ndarray  # int64
    primary_failure_count: np.ndarray  # int64

    def __post_init__(self) -> None:
        n = len(self.role)
        for f in fields(self):
            if len(getattr(self, f.name)) != n:
                raise ValueError(f"Contexts.{f.name} has {len(getattr(self, f.name))} rows, role has {n}")

    def __len__(self) -> int:
        return len(self.role)

    def take(self, idx: np.ndarray) -> "Contexts":
        return Contexts(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    @classmethod
    def from_frame(cls, df, roles: tuple[str, ...] = ROLES) -> "Contexts":  # DataFrame with dataset columns
        unknown = set(df["role"].unique()) - set(roles)
        if unknown:
            raise ValueError(f"unknown role(s) {sorted(unknown)} in column 'role' (roles: {', '.join(roles)})")
        tokens = df["prompt_tokens"].astype("float64").to_numpy(na_value=np.nan) if "prompt_tokens" in df else None
        if tokens is None:
            tokens = np.full(len(df), np.nan)
        return cls(
            role=df["role"].map({r: i for i, r in enumerate(roles)}).to_numpy(dtype=np.int64),
            task_complexity_score=df["task_complexity_score"].to_numpy(dtype=np.float64),
            prompt_tokens=tokens,
            step=df["step"].to_numpy(dtype=np.int64),
            failure_count=df["failure_count"].to_numpy(dtype=np.int64),
            primary_failure_count=df["primary_failure_count"].to_numpy(dtype=np.int64),
        )


@dataclass(frozen=True)
class FeatureSpec:
    """How Contexts become a float matrix: one-hot role, then scaled numerics."""

    version: int = 1
    roles: tuple[str, ...] = ROLES
    numeric: tuple[str, ...] = ("task_complexity_score", "log_prompt_tokens", "step",
                                "failure_count", "primary_failure_count")
    max_count: int = 8  # counts are clipped to this and divided by it

    @property
    def dim(self) -> int:
        return len(self.roles) + len(self.numeric)

    def to_dict(self) -> dict:
        return asdict(self)

    def diff(self, other: "FeatureSpec") -> list[str]:
        """Human-readable differences; empty when the specs match."""
        a, b = self.to_dict(), other.to_dict()
        return [f"{k}: {a[k]!r} != {b[k]!r}" for k in a if a[k] != b.get(k)]

    def encode(self, ctx: Contexts) -> np.ndarray:
        n = len(ctx)
        out = np.zeros((n, self.dim), dtype=np.float32)
        out[np.arange(n), ctx.role] = 1.0
        cols = {
            "task_complexity_score": ctx.task_complexity_score,
            # missing prompt sizes encode as 0 (log1p(0)); known ones as log1p(tokens)/log1p(64k)
            "log_prompt_tokens": np.log1p(np.nan_to_num(ctx.prompt_tokens, nan=0.0)) / np.log1p(65536.0),
            "step": np.minimum(ctx.step, self.max_count) / self.max_count,
            "failure_count": np.minimum(ctx.failure_count, self.max_count) / self.max_count,
            "primary_failure_count": np.minimum(ctx.primary_failure_count, self.max_count) / self.max_count,
        }
        for j, name in enumerate(self.numeric):
            out[:, len(self.roles) + j] = cols[name]
        if not np.isfinite(out).all():
            bad = np.argwhere(~np.isfinite(out))[0]
            raise ValueError(f"non-finite feature {self.numeric[bad[1] - len(self.roles)]!r} at row {bad[0]}")
        return out
