"""Decision contexts: the columnar batch every policy reads.

``Contexts`` holds the named state of a batch of routing decisions (what SAGE's router
sees). Policies implement ``action_probs(contexts) -> (n, K)``. Neural policies turn it
into a float matrix with a :class:`FeatureSpec`, which is saved with their checkpoints
so that a mismatch between a checkpoint and the data is caught by name.

The encoding's building blocks are shared with the code-task simulators' observations
(:mod:`sage_pipeline.sim.obs`), so a prompt size or a count means the same number in every
checkpoint: :func:`log_tokens`, :func:`scaled_count`, :func:`assemble` (one-hot blocks and
numeric columns side by side, non-finite values refused by name), :func:`check_rows` and
:func:`spec_diff`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields

import numpy as np

from sage_pipeline.routing.schema import ROLES

TOKENS_SCALE = float(np.log1p(65536.0))


def log_tokens(tokens: np.ndarray) -> np.ndarray:
    """A prompt size as a feature: ``log1p(tokens) / log1p(65536)``, 1 at a 64k-token prompt
    (not clipped: a larger prompt reads a little above 1), 0 where the size is unknown (NaN)."""
    return np.log1p(np.nan_to_num(np.asarray(tokens, dtype=np.float64), nan=0.0)) / TOKENS_SCALE


def scaled_count(count: np.ndarray, max_count: int) -> np.ndarray:
    """A count as a feature: clipped to ``max_count`` and divided by it, so in [0, 1]."""
    return np.minimum(count, max_count) / max_count


@dataclass(frozen=True)
class OneHot:
    """A one-hot block of ``width`` columns, the ``index`` column of each row set."""

    name: str
    index: np.ndarray
    width: int


def assemble(n: int, parts: Sequence[OneHot | tuple[str, np.ndarray]]) -> np.ndarray:
    """The (n, width) float32 matrix of ``parts`` side by side: a block per :class:`OneHot`, a
    column per ``(name, values)``. An index outside its block or a non-finite value is an
    error naming the part and the row."""
    width = sum(p.width if isinstance(p, OneHot) else 1 for p in parts)
    out = np.zeros((n, width), dtype=np.float32)
    rows, j = np.arange(n), 0
    for p in parts:
        if isinstance(p, OneHot):
            bad = (p.index < 0) | (p.index >= p.width)
            if n and bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{p.name} index {int(p.index[i])} at row {i} is outside its {p.width} values")
            out[rows, j + p.index] = 1.0
            j += p.width
        else:
            name, values = p
            out[:, j] = values
            if not np.isfinite(out[:, j]).all():
                raise ValueError(f"non-finite feature {name!r} at row {int(np.argmax(~np.isfinite(out[:, j])))}")
            j += 1
    return out


def check_rows(batch, skip: tuple[str, ...] = ()) -> None:
    """Every column of a columnar batch (a dataclass of arrays) has as many rows as ``role``."""
    n = len(batch.role)
    for f in fields(batch):
        if f.name not in skip and len(getattr(batch, f.name)) != n:
            raise ValueError(f"{type(batch).__name__}.{f.name} has {len(getattr(batch, f.name))} rows, role has {n}")


def spec_diff(a: dict, b: dict) -> list[str]:
    """Human-readable differences between two specs' dicts; empty when they match."""
    return [f"{k}: {a[k]!r} != {b.get(k)!r}" for k in a if a[k] != b.get(k)]


@dataclass(frozen=True)
class Contexts:
    role: np.ndarray  # int64 index into the action space's roles (RoutingTable.roles)
    task_complexity_score: np.ndarray  # float64 in [0, 1]
    prompt_tokens: np.ndarray  # float64
    step: np.ndarray  # int64, attempt index within the episode
    failure_count: np.ndarray  # int64
    primary_failure_count: np.ndarray  # int64

    def __post_init__(self) -> None:
        check_rows(self)

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
        return spec_diff(self.to_dict(), other.to_dict())

    def encode(self, ctx: Contexts) -> np.ndarray:
        """One-hot role, then the numeric columns: the complexity score, :func:`log_tokens` of the
        prompt size (unknown sizes encode as 0), and the counts as :func:`scaled_count`."""
        cols = {
            "task_complexity_score": ctx.task_complexity_score,
            "log_prompt_tokens": log_tokens(ctx.prompt_tokens),
            "step": scaled_count(ctx.step, self.max_count),
            "failure_count": scaled_count(ctx.failure_count, self.max_count),
            "primary_failure_count": scaled_count(ctx.primary_failure_count, self.max_count),
        }
        return assemble(len(ctx), [OneHot("role", ctx.role, len(self.roles)),
                                   *((name, cols[name]) for name in self.numeric)])
