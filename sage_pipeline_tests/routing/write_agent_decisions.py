"""Run each of SAGE's model-calling agents once with SAGE's own code, so that SAGE writes the journal
lines that mark its model calls: each agent's ``AGENT_INSIGHT_EMITTED`` "decision" (through SAGE's
``OrchestratorIntelligenceFeed``, the insight sink ``sage run`` passes its agents) and its
``MODEL_ROUTING_DECISION``, then the call, then what the agent writes after the answer.

Run with a Python that can ``import sage`` (SAGE's own virtualenv, never the project's), in an
empty workspace folder::

    $SAGE_PYTHON write_agent_decisions.py --workspace DIR

Only ``ollama`` is stood in for (``sage.llm.ollama_safe.ollama``, the module every agent's
``chat_with_timeout`` calls): it answers each agent in the JSON shape the agent parses, records
the model it was asked for, and answers without ``usage`` (as the ``ollama`` client SAGE pins
does: no TOKEN_USAGE). Each call waits ``--call-s`` seconds, so the journal's gap around it is
measurable. Between them, SAGE's ``record_trajectory_step`` writes task_001's workflow steps in the
shapes ``orchestrator/workflow.py`` writes them (the debugger's step, line 2247; the reviewer's
terminal PASS, line 2027), so the calls have a task:

1. the planner (its insight's task id is ``"planner"``), the architect, coder, reviewer, test
   engineer and debugger on task_001, then the debugger's step;
2. the documentation agent on task_002 (it writes no decision insight, only its
   MODEL_ROUTING_DECISION), the coder again on task_001 with a failing call (``RuntimeError``, as a
   refused request), then the reviewer's terminal PASS of task_001.

Prints one JSON line: ``{"session_id", "calls": [{"agent", "model", "ok"}, ...]}`` in call order.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import uuid
from pathlib import Path

_ANSWERS = {
    "planner": {"brainstorm_questions": [], "confirmed": True, "dag": {"nodes": [
        {"id": "task_001", "description": "Implement add(a, b) in calc.py", "dependencies": [],
         "assigned_agent": "coder", "verification": "python -m pytest -q tests/test_calc.py"}]}},
    "architect": {"folders": [], "files": ["calc.py"], "tech_decisions": {}, "summary": "one module"},
    "coder": {"file": "calc.py", "operation": "create", "reason": "the task",
              "patch": '"""calc."""\n\n\ndef add(a, b):\n    return a + b\n'},
    "reviewer": {"verdict": "PASS", "score": 0.9, "issues": [], "suggestion": ""},
    "test_engineer": {"file": "tests/test_calc.py", "operation": "create", "reason": "tests",
                      "patch": "from calc import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"},
    "debugger": {"file": "calc.py", "operation": "edit", "reason": "fix", "suspected_cause": "logic",
                 "patch": '"""calc."""\n\n\ndef add(a, b):\n    return a + b\n'},
    "documentation": {"file": "README.md", "operation": "create", "reason": "docs", "patch": "# calc\n\nadd(a, b)\n"},
}


class _Ollama:
    """Stands in for the ``ollama`` module: the current agent's answer, after ``call_s`` seconds."""

    def __init__(self, call_s: float) -> None:
        self.call_s = call_s
        self.agent = ""
        self.fail = False
        self.calls: list[dict] = []

    def chat(self, model, messages, options=None):  # noqa: ARG002 - ollama.chat's signature
        time.sleep(self.call_s)
        self.calls.append({"agent": self.agent, "model": model, "ok": not self.fail})
        if self.fail:
            raise RuntimeError("model refused the request (stand-in)")
        return {"message": {"role": "assistant", "content": json.dumps(_ANSWERS[self.agent])}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workspace", required=True, type=Path)
    ap.add_argument("--call-s", type=float, default=0.05)
    args = ap.parse_args()
    args.workspace.mkdir(parents=True, exist_ok=True)
    os.chdir(args.workspace)
    sid = str(uuid.uuid4())
    os.environ.update(SAGE_SESSION_ID=sid, SAGE_DISABLE_OLLAMA_SPINNER="1", SAGE_NO_CLARIFY="1")

    import sage.llm.ollama_safe as ollama_safe
    from sage.agents.architect import ArchitectAgent
    from sage.agents.coder import CoderAgent
    from sage.agents.debugger import DebuggerAgent
    from sage.agents.documentation import DocumentationAgent
    from sage.agents.planner import PlannerAgent
    from sage.agents.reviewer import ReviewerAgent
    from sage.agents.test_engineer import TestEngineerAgent
    from sage.observability.trajectory_logger import record_trajectory_step
    from sage.orchestrator.intelligence_feed import OrchestratorIntelligenceFeed

    stub = _Ollama(args.call_s)
    ollama_safe.ollama = stub
    feed = OrchestratorIntelligenceFeed()
    task = {"id": "task_001", "description": "Implement add(a, b) in calc.py", "task_complexity_score": 0.2}
    doc_task = {"id": "task_002", "description": "Write README.md for calc", "task_complexity_score": 0.1}
    Path("calc.py").write_text('"""calc."""\n\n\ndef add(a, b):\n    return a - b\n', encoding="utf-8")

    def agent(name: str, fn, fail: bool = False) -> None:
        stub.agent, stub.fail = name, fail
        fn()

    agent("planner", lambda: PlannerAgent().run("Implement add(a, b) in calc.py", {}, insight_sink=feed,
                                                 clarify_enabled=False, clarify_tty=False))
    agent("architect", lambda: ArchitectAgent().run(task, {}, insight_sink=feed))
    agent("coder", lambda: CoderAgent().run(task, {}, insight_sink=feed))
    agent("reviewer", lambda: ReviewerAgent().run("calc.py", task, {}, insight_sink=feed))
    agent("test_engineer", lambda: TestEngineerAgent().run("calc.py", task, {}, insight_sink=feed))
    agent("debugger", lambda: DebuggerAgent().run(task, "AssertionError: add(1, 2) == -1", "calc.py", {},
                                                   insight_sink=feed))
    record_trajectory_step(task_id="task_001", agent="debugger", action_model=stub.calls[2]["model"],
                           action_strategy_key="coder:primary:conservative", reward=0.0, terminal=False,
                           state={"debug_retry": 1, "debug_status": "patch_ready", "task_complexity_score": 0.2,
                                  "primary_failure_count": 0}, extra={"patch_preview": "def add(a, b): ..."})
    agent("documentation", lambda: DocumentationAgent().run(doc_task, {}, insight_sink=feed))
    agent("coder", lambda: CoderAgent().run(task, {}, failure_count=1, insight_sink=feed), fail=True)
    record_trajectory_step(task_id="task_001", agent="reviewer", action_model=stub.calls[2]["model"],
                           action_strategy_key="coder:primary:conservative", reward=0.9, terminal=True,
                           state={"verification_passed": True, "task_complexity_score": 0.2,
                                  "primary_failure_count": 1}, extra={"verdict": "PASS"})
    print(json.dumps({"session_id": sid, "calls": stub.calls}))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
