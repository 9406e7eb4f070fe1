"""Pure learning code: the policy contract, policies, checkpoints, BC, CQL, PPO, OPE.

Importing this package must not import dagster, great_expectations or docker: the
router that loads a policy at run time pays only for numpy (and torch for neural ones).
"""

from sage_pipeline.rl.checkpoint import CheckpointError, load_policy
from sage_pipeline.rl.policy import (
    EpsilonGreedyPolicy,
    Policy,
    StaticTablePolicy,
    UniformPolicy,
)

__all__ = ["CheckpointError", "EpsilonGreedyPolicy", "Policy", "StaticTablePolicy", "UniformPolicy", "load_policy"]
