"""Observations of the code-task environment: the columnar batch a policy reads
(:class:`CodeTaskObs`) and its encoding (:class:`ObsSpec`), which a PPO checkpoint saves
as its ``feature_spec`` with ``spec_kind = "code_task"``.

Kept apart from the environment (numpy only) so that serving a checkpoint
(:func:`sage_pipeline.rl.checkpoint.load_policy`) imports neither gymnasium nor pandas.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar

import numpy as np

from sage_pipeline.sim.schema import OUTCOME_KINDS

# Index 0 is "no attempt yet"; the failure kinds keep their OUTCOME_KINDS index (pass never
# precedes another attempt), so ``last_outcome == outcome kind index`` after a failure.
LAST_OUTCOMES: tuple[str, ...] = ("none", *OUTCOME_KINDS[1:])


@dataclass(frozen=True)
class CodeTaskObs:
    """A batch of decision states, columnar. ``task`` identifies the task for the oracle
    (index into the simulator's task list); the encoding never reads it."""

    role: np.ndarray  # int64 index into ROLES (the environment's role)
    task: np.ndarray  # int64 index into CodeTaskSim.tasks
    family: np.ndarray  # int64 index into ObsSpec.families
    difficulty: np.ndarray  # float64 in [0, 1]
    prompt_tokens: np.ndarray  # float64, at this attempt
    step: np.ndarray  # int64 attempt index
    failure_count: np.ndarray  # int64
    primary_failure_count: np.ndarray  # int64
    last_outcome: np.ndarray  # int64 index into LAST_OUTCOMES

    def __post_init__(self) -> None:
        n = len(self.role)
        for f in fields(self):
            if len(getattr(self, f.name)) != n:
                raise ValueError(f"CodeTaskObs.{f.name} has {len(getattr(self, f.name))} rows, role has {n}")

    def __len__(self) -> int:
        return len(self.role)

    def take(self, idx: np.ndarray) -> CodeTaskObs:
        return CodeTaskObs(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})


@dataclass(frozen=True)
class ObsSpec:
    """How :class:`CodeTaskObs` becomes a float matrix: one-hot family, scaled numerics,
    one-hot last outcome. Saved with a checkpoint (``spec_kind = "code_task"``) so that a
    policy trained on other families or another encoding is refused by name."""

    spec_kind: ClassVar[str] = "code_task"
    version: int = 1
    families: tuple[str, ...] = ()
    numeric: tuple[str, ...] = ("difficulty", "log_prompt_tokens", "step", "failure_count",
                                "primary_failure_count")
    last_outcomes: tuple[str, ...] = LAST_OUTCOMES
    max_count: int = 8  # counts are clipped to this and divided by it

    @property
    def dim(self) -> int:
        return len(self.families) + len(self.numeric) + len(self.last_outcomes)

    def to_dict(self) -> dict:
        return asdict(self)

    def diff(self, other: ObsSpec) -> list[str]:
        """Human-readable differences; empty when the specs match."""
        a, b = self.to_dict(), other.to_dict()
        return [f"{k}: {a[k]!r} != {b.get(k)!r}" for k in a if a[k] != b.get(k)]

    def encode(self, obs: CodeTaskObs) -> np.ndarray:
        n, nf = len(obs), len(self.families)
        if n and (obs.family.min() < 0 or obs.family.max() >= nf):
            raise ValueError(f"family index {int(obs.family.max())} outside the spec's {nf} families")
        out = np.zeros((n, self.dim), dtype=np.float32)
        rows = np.arange(n)
        out[rows, obs.family] = 1.0
        cols = {
            "difficulty": obs.difficulty,
            "log_prompt_tokens": np.minimum(np.log1p(obs.prompt_tokens) / np.log1p(65536.0), 1.0),
            "step": np.minimum(obs.step, self.max_count) / self.max_count,
            "failure_count": np.minimum(obs.failure_count, self.max_count) / self.max_count,
            "primary_failure_count": np.minimum(obs.primary_failure_count, self.max_count) / self.max_count,
        }
        for j, name in enumerate(self.numeric):
            out[:, nf + j] = cols[name]
        out[rows, nf + len(self.numeric) + obs.last_outcome] = 1.0
        return out


