"""Write SAGE session journals with SAGE's own functions, in the shapes `sage run` produces.

Run with a Python that can ``import sage`` (SAGE installed in a virtualenv of its own, never
the project's; ``make sage-venv``), from any folder::

    $SAGE_PYTHON write_sage_journals.py --workspace DIR [--days 3 --sessions-per-day 2 ...]

Every line is written by SAGE's code: ``ModelRouter.select`` (MODEL_ROUTING_DECISION, with
the RL hook when ``--checkpoint`` is given), ``chat_with_timeout`` with a stand-in ``ollama``
module (TOKEN_USAGE, from the response's usage fields), ``record_quality_delta`` and
``record_trajectory_step`` (PROMPT_QUALITY_DELTA, TRAJECTORY_STEP), ``log_event``
(CIRCUIT_BREAKER_ACTIVATED, MEMORY_CHECKPOINT) and ``MemoryManager.append_session_log``
(the plain-text ``[ts] CHECKPOINT ...`` and ``[TOKEN_SUMMARY] ...`` lines, and rotation to
``<date>.N.log`` under ``SAGE_SESSION_LOG_MAX_MB``). The order of calls follows
``sage/orchestrator/workflow.py`` at the pinned commit:

* ``route_model``: the planner's decision (complexity of the prompt, failure count 0);
* per task, ``run_coder``: the coder does NOT call ``ModelRouter.select``: it asks
  ``should_use_fallback`` (YAML only, never the RL hook) and its UCB bandit
  (``sage.rl.ucb_bandit``) picks a strategy key among the allowed ones; a documentation
  task's agent calls ``select("documentation", ...)``;
* ``run_verify``: the reviewer calls ``select("reviewer", ...)``, then writes a
  PROMPT_QUALITY_DELTA and a TRAJECTORY_STEP whose ``action.model_chosen`` is the *task's*
  model (the assigned agent's), verdict and score; the coder's bandit is updated;
* on FAIL, ``debug_agent``: ``select("debugger", c, next_retry)`` and a debugger step
  (reward 0, model = the task's model); a patch goes back to verification, no patch sends
  the task back to the coder with ``failure_count = retry``;
* ``circuit_breaker``: at the retry limit, or when the model call timed out,
  CIRCUIT_BREAKER_ACTIVATED and an orchestrator step (its model is empty when the coder
  never returned one);
* ``save_memory``: the CHECKPOINT and TOKEN_SUMMARY text lines.

Only the clock (so that several days can be written in one run) and the model calls are
stood in for; the outcome of each call is drawn from a small seeded world (a model's pass
probability falls with complexity, the larger model is better), enough to give rewards a
learner can tell apart. Prints one JSON summary line (counts per kind of line written).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import sage.llm.ollama_safe as ollama_safe
import sage.memory.manager as sage_manager
import sage.observability.structured_logger as sage_logger
from sage.memory.manager import MemoryManager
from sage.observability.structured_logger import log_event
from sage.observability.trajectory_logger import record_quality_delta, record_trajectory_step
from sage.orchestrator.model_router import ModelRouter
from sage.rl.ucb_bandit import UCBStrategyBandit


class _Clock:
    now_utc = datetime(2026, 11, 1, 9, 0, tzinfo=timezone.utc)

    @classmethod
    def tick(cls, seconds: float) -> None:
        cls.now_utc += timedelta(seconds=seconds)


class _FakeDatetime(datetime):
    @classmethod
    def now(cls, tz=None):  # noqa: D102 - the stood-in clock
        return _Clock.now_utc if tz is not None else _Clock.now_utc.replace(tzinfo=None)


def _pass_probability(model: str, primary: str, complexity: float, attempt: int) -> float:
    """The small world: the primary (small) model fails more on complex tasks."""
    base = 0.85 - 0.55 * complexity if model == primary else 0.9 - 0.2 * complexity
    return max(0.05, min(0.97, base + 0.1 * attempt))


class _Ollama:
    """Stands in for the ``ollama`` module: answers with usage fields SAGE logs as TOKEN_USAGE."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.timeout_next = False

    def chat(self, model, messages, options=None):  # noqa: ARG002 - ollama.chat's signature
        pt, ct = self.rng.randint(200, 2000), self.rng.randint(50, 800)
        _Clock.tick(self.rng.uniform(0.5, 20.0))
        return {"message": {"role": "assistant", "content": "ok"},
                "usage": {"prompt_tokens": pt, "completion_tokens": ct, "total_tokens": pt + ct}}


def _call(model: str, totals: dict) -> None:
    ollama_safe.chat_with_timeout(model=model, messages=[{"role": "user", "content": "task"}], timeout_s=30)
    usage = ollama_safe.get_last_token_usage()
    for k in ("prompt_tokens", "completion_tokens", "total_tokens"):
        totals[k] = totals.get(k, 0) + int(usage.get(k) or 0)
    totals["calls"] = totals.get("calls", 0) + 1


def _session(args, rng: random.Random, router: ModelRouter, bandit: UCBStrategyBandit, counts: dict) -> None:
    mm = MemoryManager()
    totals: dict = {}
    planner_c = round(rng.random(), 3)
    _call(router.select("planner", task_complexity_score=planner_c, failure_count=0), totals)
    completed = pending = 0
    for t in range(args.tasks):
        task_id = f"task_{t + 1:03d}"
        c = round(rng.random(), 3)
        agent = "documentation" if rng.random() < args.documentation_share else "coder"
        retry, model, strategy, done = 0, "", "", False
        need_author = True
        while not done:
            if need_author:
                if rng.random() < args.timeout_rate:  # the model call times out before any model is used
                    log_event("CIRCUIT_BREAKER_ACTIVATED", payload={
                        "task_id": task_id, "reason": "ollama_timeout", "retry_count": retry, "max_retries": 3,
                        "error_preview": "ollama.chat timeout after 30s"})
                    record_trajectory_step(task_id=task_id, agent="orchestrator", action_model=model,
                                           action_strategy_key=strategy, reward=0.0, terminal=True,
                                           state={"failed_reason": "timeout"},
                                           extra={"error": "ollama.chat timeout after 30s"})
                    counts["timeouts"] += 1
                    pending += 1
                    break
                if agent == "coder":
                    primary, fallback = router.get_primary_fallback("coder")
                    keys = ["coder:primary:conservative", "coder:primary:standard",
                            "coder:fallback:conservative", "coder:fallback:standard"]
                    if router.should_use_fallback("coder", task_complexity_score=c, failure_count=retry):
                        keys = ["coder:fallback:conservative", "coder:fallback:standard"]
                    strategy = bandit.select(strategy_keys=keys)
                    model = fallback if ":fallback:" in strategy else primary
                else:
                    strategy = ""
                    model = router.select("documentation", task_complexity_score=c, failure_count=retry)
                _call(model, totals)
                need_author = False
            reviewer_model = router.select("reviewer", task_complexity_score=c, failure_count=retry)
            _call(reviewer_model, totals)
            primary = router.get_primary_fallback(agent)[0]
            passed = rng.random() < _pass_probability(model, primary, c, retry)
            score = round(min(1.0, max(0.0, rng.gauss(0.85 if passed else 0.35, 0.08))), 3)
            verdict = "PASS" if passed else "FAIL"
            record_quality_delta(task_id=task_id, agent="reviewer", current_score=score, passed=passed,
                                 model_used=reviewer_model, issues=[] if passed else ["tests fail"],
                                 extra={"verdict": verdict})
            record_trajectory_step(task_id=task_id, agent="reviewer", action_model=model or reviewer_model,
                                   action_strategy_key=strategy, reward=score, terminal=passed,
                                   state={"verification_passed": passed, "task_complexity_score": c,
                                          "primary_failure_count": retry},
                                   extra={"verdict": verdict})
            if agent == "coder" and strategy:
                bandit.update(strategy_key=strategy, reward=score)
            if passed:
                completed += 1
                done = True
                if completed % 5 == 0:
                    log_event("MEMORY_CHECKPOINT", payload={"completed_count": completed},
                              timestamp=_Clock.now_utc.isoformat())
                break
            next_retry = retry + 1
            debugger_model = router.select("debugger", task_complexity_score=c, failure_count=next_retry)
            _call(debugger_model, totals)
            patch = rng.random() < 0.8
            record_trajectory_step(task_id=task_id, agent="debugger", action_model=model, action_strategy_key=strategy,
                                   reward=0.0, terminal=False,
                                   state={"debug_retry": next_retry,
                                          "debug_status": "patch_ready" if patch else "error",
                                          "task_complexity_score": c, "primary_failure_count": retry},
                                   extra={"patch_preview": "--- a/x.py\n+++ b/x.py\n" if patch else ""})
            retry = next_retry
            if retry >= 3:  # circuit_breaker: the retry limit
                log_event("CIRCUIT_BREAKER_ACTIVATED", payload={
                    "task_id": task_id, "reason": "retry_limit", "retry_count": retry, "max_retries": 3,
                    "error_preview": "Review FAILED"})
                record_trajectory_step(task_id=task_id, agent="orchestrator", action_model=model,
                                       action_strategy_key=strategy, reward=0.0, terminal=True,
                                       state={"failed_reason": "retry_limit"}, extra={"error": "Review FAILED"})
                pending += 1
                break
            need_author = not patch  # no patch: the task goes back to its agent with failure_count = retry
    _Clock.tick(1.0)
    mm.append_session_log(f"[{_Clock.now_utc.isoformat()}] CHECKPOINT completed={completed} pending={pending}")
    mm.append_session_log(f"[TOKEN_SUMMARY] total_tokens={totals.get('total_tokens', 0)} "
                          f"prompt={totals.get('prompt_tokens', 0)} completion={totals.get('completion_tokens', 0)} "
                          f"calls={totals.get('calls', 0)}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workspace", required=True, help="SAGE's working folder: memory/sessions/ is written there")
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--sessions-per-day", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=6, help="tasks per session")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--start", default="2026-11-01", help="first day (UTC)")
    ap.add_argument("--no-session-id", action="store_true",
                    help="leave SAGE_SESSION_ID unset (SAGE outside `sage run`): the file stem is the session")
    ap.add_argument("--trace-id", default="", help="SAGE_TRACE_ID for every line (empty: unset)")
    ap.add_argument("--rotate-mb", type=float, default=0.0, help="SAGE_SESSION_LOG_MAX_MB (0: no rotation)")
    ap.add_argument("--models-yaml", default="", help="SAGE's models.yaml (default: the one SAGE resolves)")
    ap.add_argument("--checkpoint", default="", help="SAGE_RL_CHECKPOINT: run the router with SAGE_RL_POLICY=1")
    ap.add_argument("--min-confidence", default="", help="SAGE_RL_MIN_CONFIDENCE with --checkpoint")
    ap.add_argument("--documentation-share", type=float, default=0.2)
    ap.add_argument("--timeout-rate", type=float, default=0.03)
    args = ap.parse_args(argv)
    if args.days < 1 or args.sessions_per_day < 1 or args.tasks < 1:
        ap.error("--days, --sessions-per-day and --tasks must be >= 1")

    ws = Path(args.workspace).resolve()
    models_yaml = Path(args.models_yaml).resolve() if args.models_yaml else None  # before the chdir below
    ws.mkdir(parents=True, exist_ok=True)
    os.chdir(ws)  # SAGE writes memory/ relative to its working folder
    for var in ("SAGE_SESSION_ID", "SAGE_TRACE_ID", "SAGE_RL_POLICY", "SAGE_RL_CHECKPOINT", "SAGE_RL_MIN_CONFIDENCE",
                "SAGE_SESSION_LOG_MAX_MB", "SAGE_MODEL_PROFILE", "SAGE_FORCE_LOCAL_MODEL",
                "SAGE_JSON_LOG_EXTRA_PATH"):
        os.environ.pop(var, None)
    if args.trace_id:
        os.environ["SAGE_TRACE_ID"] = args.trace_id
    if args.rotate_mb > 0:
        os.environ["SAGE_SESSION_LOG_MAX_MB"] = str(args.rotate_mb)
    if args.checkpoint:
        os.environ["SAGE_RL_POLICY"] = "1"
        os.environ["SAGE_RL_CHECKPOINT"] = str(Path(args.checkpoint).resolve())
        if args.min_confidence != "":
            os.environ["SAGE_RL_MIN_CONFIDENCE"] = args.min_confidence
    sage_manager.datetime = _FakeDatetime
    sage_logger.datetime = _FakeDatetime
    rng = random.Random(args.seed)
    ollama_safe.ollama = _Ollama(rng)
    router = ModelRouter(models_yaml)
    bandit = UCBStrategyBandit(storage_path=ws / "memory" / "rl" / "ucb_bandit.json")
    counts = {"sessions": 0, "timeouts": 0}
    day0 = datetime.fromisoformat(args.start).replace(tzinfo=timezone.utc)
    for d in range(args.days):
        _Clock.now_utc = day0 + timedelta(days=d, hours=8)
        for _ in range(args.sessions_per_day):
            if not args.no_session_id:
                os.environ["SAGE_SESSION_ID"] = uuid.UUID(int=rng.getrandbits(128)).hex  # as `sage run` does
            _session(args, rng, router, bandit, counts)
            counts["sessions"] += 1
            _Clock.tick(rng.uniform(60, 1800))
    kinds: dict[str, int] = {}
    files = sorted((ws / "memory" / "sessions").glob("*.log"))
    for p in files:
        for line in p.read_text(encoding="utf-8").splitlines():
            try:
                kind = json.loads(line).get("type", "?")
            except json.JSONDecodeError:
                kind = "text:TOKEN_SUMMARY" if line.startswith("[TOKEN_SUMMARY]") else "text:CHECKPOINT"
            kinds[kind] = kinds.get(kind, 0) + 1
    print(json.dumps({"files": [p.name for p in files], "lines": kinds, **counts}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
