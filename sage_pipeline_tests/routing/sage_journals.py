"""Journals written by SAGE's own functions, for tests: ``write_sage_journals.py`` run with the
Python that ``SAGE_PYTHON`` names (SAGE installed in a virtualenv of its own, never the project's).

Tests that need them skip, saying why, where ``SAGE_PYTHON`` is unset or cannot ``import sage``.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

GENERATOR = Path(__file__).resolve().parents[1] / "sage_contract" / "write_sage_journals.py"
SAGE_MODELS = "sage/config/models.yaml"  # inside SAGE's package


@cache
def sage_python() -> tuple[str | None, str]:
    """(the Python that can import sage, or None; why not)."""
    py = os.environ.get("SAGE_PYTHON", "").strip()
    if not py:
        return None, ("SAGE_PYTHON is unset: these tests write journals with SAGE's own code; set it to a "
                      "Python that can `import sage` (e.g. make sage-venv; SAGE_PYTHON=/tmp/sage_venv/bin/python)")
    try:
        out = subprocess.run([py, "-c", "import sage, os; print(os.path.dirname(sage.__file__))"],
                             capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"SAGE_PYTHON={py} cannot run: {exc}"
    if out.returncode != 0:
        return None, f"SAGE_PYTHON={py} cannot import sage: {out.stderr.strip()[-300:]}"
    return py, out.stdout.strip()


def require_sage() -> tuple[str, Path]:
    """The SAGE Python and SAGE's models.yaml, or skip the test saying why (conftest's policy: unset
    is a skip the summary counts; set but broken, or SAGE_SRC set without it, is a failure)."""
    from sage_pipeline_tests.conftest import _SAGE_SKIP

    py, where = sage_python()
    if py is None:
        if os.environ.get("SAGE_PYTHON", "").strip() or os.environ.get("SAGE_SRC", "").strip():
            pytest.fail(where)
        pytest.skip(_SAGE_SKIP)
    return py, Path(where) / "config" / "models.yaml"


def write_journals(workspace: Path, *args: str) -> dict:
    """Run the generator into ``workspace`` (memory/sessions/*.log); returns its summary line."""
    py, _ = require_sage()
    out = subprocess.run([py, str(GENERATOR), "--workspace", str(workspace), *args], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def raw_events(sessions: Path) -> list[tuple[str, int, dict | str]]:
    """Every line of the journals as (file, line, JSON object or text), in SAGE's writing order."""
    from sage_pipeline.routing.ingest import journal_order

    out = []
    for f in sorted(sessions.glob("*.log"), key=journal_order):
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            out.append((f.name, i, json.loads(line) if line.startswith("{") else line))
    return out


def expected_decisions(sessions: Path) -> dict:
    """What the dataset must hold, counted straight from the journals: every reviewer verdict is the
    outcome of the assigned agent's decision (coder or documentation) unless it verifies a debugger's
    patch; every debugger MODEL_ROUTING_DECISION is the debugger's decision; every circuit breaker
    'timeout' is a decision SAGE did not log (the call timed out before task.model_used was set)."""
    last: dict[tuple[str, str], dict] = {}
    author = Counter()
    timeouts = 0
    debugger_mrds = 0
    for _, _, e in raw_events(sessions):
        if not isinstance(e, dict):
            continue
        sid = e.get("session_id") or "day"
        if e["type"] == "MODEL_ROUTING_DECISION" and e["agent_role"] == "debugger":
            debugger_mrds += 1
        if e["type"] != "TRAJECTORY_STEP":
            continue
        key = (sid, e["task_id"])
        prev = last.get(key)
        if e["agent"] == "reviewer":
            patch = prev is not None and prev["agent"] == "debugger" and prev["state"]["debug_status"] == "patch_ready"
            if not patch:
                author["coder" if e["action"]["prompt_strategy_key"].startswith("coder:") else "documentation"] += 1
        if e["agent"] == "orchestrator" and e["state"]["failed_reason"] == "timeout":
            timeouts += 1
        if e["terminal"]:
            last.pop(key, None)  # the task's episode ended: the same id again is a new episode
        else:
            last[key] = e
    return {"coder": author["coder"], "documentation": author["documentation"], "debugger": debugger_mrds,
            "timeouts": timeouts}
