"""The coder's UCB bandit state, as SAGE reads and writes it (``rl/ucb_bandit.py``).

SAGE's coder (``agents/coder.py``) never asks the router checkpoint: it picks one of four strategy
keys with a UCB1 bandit whose state lives in the workspace, ``memory/rl/ucb_bandit.json``:

    {"stats": {"coder:primary:conservative": {"count": 3.0, "value_mean": 0.7}, ...}}

* the keys are ``coder:{primary,fallback}:{conservative,standard}``; ``primary``/``fallback`` are the
  coder's models in ``models.yaml``; when the coder's YAML triggers fire, only the two fallback keys
  are candidates;
* ``select``: an untried candidate first (in the order above), else the largest
  ``value_mean + sqrt(2 ln(total) / count)`` over the candidates (the first on a tie); its choice does
  not look at the task;
* ``update`` after every reviewer verdict of the task (``orchestrator/workflow.py``): the reviewer's
  score (PASS or FAIL), so a task reviewed three times updates its key three times;
* the file is read once, when SAGE imports the module (``_GLOBAL_BANDIT``, relative to the working
  directory: the workspace), and rewritten after each update (tmp file, then replace). A file SAGE
  cannot parse is silently ignored by SAGE; here it is an error naming the file and the field.

:func:`warm_start` writes a state under which SAGE's own rule keeps choosing one side (primary or
fallback model) for as long as the user runs it: both keys of that side get ``count`` pulls at mean
1, the other side ``count`` pulls at mean 0. With equal counts the exploration bonus is equal, so UCB
picks the larger mean; reviewer scores (at most 1) move a mean by at most ``1/count`` a verdict, so a
count of 10^6 keeps the choice for a million verdicts.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from sage_pipeline import artifacts
from sage_pipeline.errors import ConfigError

STATE_PATH = ("memory", "rl", "ucb_bandit.json")  # in SAGE's workspace
KEYS = ("coder:primary:conservative", "coder:primary:standard", "coder:fallback:conservative",
        "coder:fallback:standard")
FALLBACK_KEYS = ("coder:fallback:conservative", "coder:fallback:standard")
SIDES = ("primary", "fallback")
WARM_COUNT = 1_000_000.0


def side_of(key: str) -> str:
    """``primary`` or ``fallback``: which of the coder's two models a strategy key uses."""
    parts = key.split(":")
    if len(parts) < 2 or parts[0] != "coder" or parts[1] not in SIDES:
        raise ValueError(f"{key!r} is not one of SAGE's coder strategy keys {KEYS}")
    return parts[1]


def read(path: str | Path) -> dict[str, dict[str, float]]:
    """The stats in a state file (``{"stats": {...}}`` or, as SAGE also accepts, the stats alone);
    a missing or empty file is no state. Anything SAGE would silently ignore is an error here."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return {}
    try:
        payload = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(path, "<file>", f"not JSON ({exc}); SAGE would ignore it and start its bandit empty",
                          "delete it or write it again with `python -m sage_pipeline.sage.bundle`") from exc
    stats = payload.get("stats", payload) if isinstance(payload, dict) else None
    if not isinstance(stats, dict):
        raise ConfigError(path, "stats", "expected a mapping strategy key -> {count, value_mean}")
    out = {}
    for key, v in stats.items():
        if not isinstance(v, dict):
            raise ConfigError(path, f"stats.{key}", "expected {count, value_mean}; SAGE drops such an entry")
        for f in ("count", "value_mean"):
            x = v.get(f, 0.0)
            if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x):
                raise ConfigError(path, f"stats.{key}.{f}", f"expected a finite number, got {x!r}")
        if v.get("count", 0.0) < 0:
            raise ConfigError(path, f"stats.{key}.count", f"a count cannot be negative: {v['count']!r}")
        out[str(key)] = {"count": float(v.get("count", 0.0)), "value_mean": float(v.get("value_mean", 0.0))}
    return out


def write(path: str | Path, stats: dict[str, dict[str, float]]) -> Path:
    """Write ``stats`` atomically in SAGE's format (``{"stats": ...}``, indented as SAGE writes it)."""
    for key in stats:
        side_of(key)
    return artifacts.write_text(path, json.dumps({"stats": stats}, indent=2))


def warm_start(side: str, count: float = WARM_COUNT) -> dict[str, dict[str, float]]:
    """A state under which SAGE's UCB picks ``side``'s model for the coder (see the module doc)."""
    if side not in SIDES:
        raise ValueError(f"side must be one of {SIDES}, got {side!r}")
    if not (count >= 1 and math.isfinite(count)):
        raise ValueError(f"count must be a finite number >= 1, got {count!r}")
    return {k: {"count": float(count), "value_mean": 1.0 if side_of(k) == side else 0.0} for k in KEYS}


def select(stats: dict[str, dict[str, float]], candidates: tuple[str, ...] | list[str]) -> str:
    """SAGE's ``UCBStrategyBandit.select`` on ``stats`` (pure: unseen keys count as untried)."""
    if not candidates:
        raise ValueError("candidates cannot be empty")
    st = {k: stats.get(k, {"count": 0.0, "value_mean": 0.0}) for k in candidates}
    untried = [k for k in candidates if st[k]["count"] == 0.0]
    if untried:
        return untried[0]
    total = sum(st[k]["count"] for k in candidates)
    if total <= 0:
        return candidates[0]
    best, best_ucb = candidates[0], -1e9
    for k in candidates:
        ucb = st[k]["value_mean"] + math.sqrt(2.0 * math.log(total) / max(st[k]["count"], 1e-9))
        if ucb > best_ucb:
            best, best_ucb = k, ucb
    return best


def update(stats: dict[str, dict[str, float]], key: str, reward: float) -> None:
    """SAGE's ``UCBStrategyBandit.update``, in place."""
    s = stats.setdefault(key, {"count": 0.0, "value_mean": 0.0})
    s["count"] += 1.0
    s["value_mean"] += (reward - s["value_mean"]) / max(s["count"], 1.0)
