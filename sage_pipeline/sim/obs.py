"""Observations of the code-task environments: the columnar batches a policy reads and their
encoding (:class:`ObsSpec`), which a PPO checkpoint saves as its ``feature_spec`` with
``spec_kind = "code_task"``.

Two environments share the encoding, told apart by ``ObsSpec.env``:

* ``"escalation"`` (:class:`CodeTaskObs`, :mod:`sage_pipeline.sim.env`): pick a coder model
  or stop; sees the attempt index, failure counts and the last outcome kind;
* ``"sage_loop"`` (:class:`LoopObs`, :mod:`sage_pipeline.sim.loop_env`): SAGE's coder /
  debugger loop under a per-task budget; sees the sandbox's feedback on the current
  candidate (outcome kind, tests passed / total), the budget used and the calls made so far
  per action.

A checkpoint trained on one environment (or on other families, another action set) is
refused by name against the other: the specs' ``env``, ``numeric`` or ``families`` differ.

Kept apart from the environments (numpy only) so that serving a checkpoint
(:func:`sage_pipeline.rl.checkpoint.load_policy`) imports neither gymnasium nor pandas, nor
pydantic: :class:`ObsSpec` stays a frozen dataclass that checks its ``env`` itself (as
``routing.features.FeatureSpec`` does), unlike the simulators' pydantic configs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import ClassVar, Literal, get_args

import numpy as np

from sage_pipeline.routing.features import OneHot, assemble, check_rows, log_tokens, scaled_count, spec_diff
from sage_pipeline.sim.schema import OUTCOME_KINDS

# Index 0 is "no attempt yet" (no candidate); the failure kinds keep their OUTCOME_KINDS index
# (pass never precedes another attempt), so ``last_outcome == outcome kind index`` after a failure.
LAST_OUTCOMES: tuple[str, ...] = ("none", *OUTCOME_KINDS[1:])
EnvName = Literal["sage_loop", "escalation"]  # the code-task environments (sage_loop: the default one)
ENVS: tuple[str, ...] = get_args(EnvName)
ESCALATION_NUMERIC = ("difficulty", "log_prompt_tokens", "step", "failure_count", "primary_failure_count")
LOOP_NUMERIC = ("difficulty", "calls_used", "usd_used", "seconds_used", "tests_passed")
COUNT_PREFIX = "calls:"  # a loop observation's per-action call count column: "calls:<action>"


@dataclass(frozen=True)
class CodeTaskObs:
    """A batch of decision states of the escalation environment, columnar. ``task``
    identifies the task for the oracle (index into the simulator's task list); the
    encoding never reads it."""

    env: ClassVar[str] = "escalation"
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
        check_rows(self)

    def __len__(self) -> int:
        return len(self.role)

    def take(self, idx: np.ndarray) -> CodeTaskObs:
        return CodeTaskObs(**{f.name: getattr(self, f.name)[idx] for f in fields(self)})

    def columns(self, max_count: int) -> dict[str, np.ndarray]:
        return {"difficulty": self.difficulty, "log_prompt_tokens": log_tokens(self.prompt_tokens),
                "step": scaled_count(self.step, max_count),
                "failure_count": scaled_count(self.failure_count, max_count),
                "primary_failure_count": scaled_count(self.primary_failure_count, max_count)}


@dataclass(frozen=True)
class LoopObs:
    """A batch of decision states of the SAGE-loop environment, columnar. ``task`` and
    ``candidate`` identify the state for the exact ground truth; the encoding reads the
    task's family and difficulty, the feedback on the current candidate (``last_outcome``:
    its verified outcome kind, ``tests_passed``: the share of tests it passed), the budget
    used (shares of the per-task budget) and the calls made so far per call action."""

    env: ClassVar[str] = "sage_loop"
    role: np.ndarray  # int64 index into ROLES (the role whose row of role_mask applies: coder)
    task: np.ndarray  # int64 index into the simulator's tasks
    family: np.ndarray  # int64 index into ObsSpec.families
    difficulty: np.ndarray  # float64 in [0, 1]
    counts: np.ndarray  # (n, A) int64 calls made so far per call action (call_actions order)
    candidate: np.ndarray  # int64 index of the current wrong candidate in the task's list; -1: none yet
    last_outcome: np.ndarray  # int64 index into LAST_OUTCOMES: the current candidate's verified kind
    tests_passed: np.ndarray  # float64 share of the task's tests the current candidate passed (0 if none)
    calls_used: np.ndarray  # float64 share of the call budget used
    usd_used: np.ndarray  # float64 share of the dollar budget used
    seconds_used: np.ndarray  # float64 share of the seconds budget used
    call_actions: tuple[str, ...] = ()  # names of the columns of ``counts``

    def __post_init__(self) -> None:
        check_rows(self, skip=("call_actions",))
        if self.counts.ndim != 2 or self.counts.shape[1] != len(self.call_actions):
            raise ValueError(f"LoopObs.counts has shape {self.counts.shape}, expected (n, {len(self.call_actions)}) "
                             f"for call actions {self.call_actions}")

    def __len__(self) -> int:
        return len(self.role)

    def take(self, idx: np.ndarray) -> LoopObs:
        return LoopObs(**{f.name: getattr(self, f.name)[idx] for f in fields(self) if f.name != "call_actions"},
                       call_actions=self.call_actions)

    def columns(self, max_count: int) -> dict[str, np.ndarray]:
        cols = {"difficulty": self.difficulty, "calls_used": self.calls_used, "usd_used": self.usd_used,
                "seconds_used": self.seconds_used, "tests_passed": self.tests_passed}
        scaled = scaled_count(self.counts, max_count)
        cols |= {COUNT_PREFIX + a: scaled[:, i] for i, a in enumerate(self.call_actions)}
        return cols


@dataclass(frozen=True)
class ObsSpec:
    """How an observation batch becomes a float matrix: one-hot family, the ``numeric``
    columns (each in [0, 1]; a prompt past 64k tokens reads a little above 1), one-hot last
    outcome (the blocks of :func:`sage_pipeline.routing.features.assemble`). Saved with a
    checkpoint (``spec_kind = "code_task"``) so that a policy trained on another environment, other families or
    another encoding is refused by name. Checkpoints written before ``env`` existed read as
    ``"escalation"``."""

    spec_kind: ClassVar[str] = "code_task"
    version: int = 1
    families: tuple[str, ...] = ()
    numeric: tuple[str, ...] = ESCALATION_NUMERIC
    last_outcomes: tuple[str, ...] = LAST_OUTCOMES
    max_count: int = 8  # counts are clipped to this and divided by it
    env: EnvName = "escalation"  # which environment's observations this encodes (checked when made)

    def __post_init__(self) -> None:
        if self.env not in ENVS:
            raise ValueError(f"ObsSpec.env is {self.env!r}, expected one of {ENVS}")

    @classmethod
    def for_loop(cls, families: tuple[str, ...], call_actions: tuple[str, ...], max_count: int) -> ObsSpec:
        """The SAGE-loop environment's spec: its numeric columns, then one count per call action."""
        return cls(families=tuple(families), numeric=(*LOOP_NUMERIC, *(COUNT_PREFIX + a for a in call_actions)),
                   max_count=max_count, env="sage_loop")

    @property
    def dim(self) -> int:
        return len(self.families) + len(self.numeric) + len(self.last_outcomes)

    def to_dict(self) -> dict:
        return asdict(self)

    def diff(self, other: ObsSpec) -> list[str]:
        """Human-readable differences; empty when the specs match."""
        return spec_diff(self.to_dict(), other.to_dict())

    def encode(self, obs: CodeTaskObs | LoopObs) -> np.ndarray:
        if obs.env != self.env:
            raise ValueError(f"this spec encodes {self.env!r} observations, got {type(obs).__name__} "
                             f"({obs.env!r})")
        cols = obs.columns(self.max_count)
        missing = [c for c in self.numeric if c not in cols]
        if missing:
            raise ValueError(f"the observations have no column(s) {missing} the spec encodes "
                             f"(they have {sorted(cols)})")
        return assemble(len(obs), [OneHot("family", obs.family, len(self.families)),
                                   *((name, cols[name]) for name in self.numeric),
                                   OneHot("last_outcome", obs.last_outcome, len(self.last_outcomes))])


def check_policy(policy, spec: ObsSpec, actions: tuple[str, ...]) -> None:
    """Refuse a policy made for another observation spec or action set. A checkpoint checks
    itself (its ``check_compatible`` names what differs); any other policy must have these actions."""
    check = getattr(policy, "check_compatible", None)
    if check is not None:
        check(spec, actions)
    elif tuple(policy.actions) != tuple(actions):
        raise ValueError(f"policy {getattr(policy, 'name', '?')!r} has actions {list(policy.actions)}, "
                         f"the simulator {list(actions)}")
