"""SAGE's contract: the formats SAGE's code reads and writes, one module per SAGE concept, each read
from SAGE's source (``../shared/upstream/sage``) and tested against it.

* :mod:`.table`: ``models.yaml`` (``SAGE_MODELS_YAML``): routes, triggers in SAGE's grammar, writing one
* :mod:`.checkpoint`: the router checkpoint SAGE's ``rl/policy.py`` loads (``SAGE_RL_CHECKPOINT``)
* :mod:`.explore`: exploring checkpoints, deployment records, reconstructed probabilities
* :mod:`.bandit_state`: the coder's UCB bandit state (``memory/rl/ucb_bandit.json``)
* :mod:`.objective`: the per-task objective SAGE's users are judged by
* :mod:`.bundle`: every lever SAGE runs unchanged, as one deployment switched atomically
* :mod:`.skills`: the skills tree SAGE injects (``SAGE_SKILLS_ROOT``), its selection rule and caps, the
  injected text and the ``SKILL_INJECTION`` events

Nothing here imports the learning (``rl``) or the data (``routing``) packages: they import this.
"""
