"""Pure learning code: checkpoints, BC, CQL, PPO, OPE, bandits, the served router.

The policy contract and the policies that need no training live in
:mod:`sage_pipeline.routing.policy` (the routing domain's collector and simulator use them,
and ``routing`` never imports ``rl``); they are re-exported here with :func:`load_policy`.

Importing this package must not import dagster, great_expectations or docker: the
router that loads a policy at run time pays only for numpy (and torch for neural ones).
"""

from sage_pipeline.rl.checkpoint import CheckpointError, load_policy
from sage_pipeline.routing.policy import (
    EpsilonGreedyPolicy,
    Policy,
    StaticTablePolicy,
    UniformPolicy,
)

__all__ = ["CheckpointError", "EpsilonGreedyPolicy", "Policy", "StaticTablePolicy", "UniformPolicy", "load_policy"]
