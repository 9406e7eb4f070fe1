"""TEST HARNESS, never imported by production code: a whole-prompt stand-in model behind an
OpenAI-compatible server on loopback.

It exists to measure the sleep night's decisions (``benchmarks/decision_month.py``, the tests) against
a model whose answers move with every word of the prompt, as real models' do. Its numbers are
chosen, stated below and seeded; they are never a claim about any real model.

**Coder calls** (the night's replays, ``sage_night.role_messages``: SAGE's coder's messages) are
recognised by their user message, which is a function of the task alone; the answer is the task's
correct solution (``meta.sim.gold``) or its wrong variant (``meta.sim.naive``: the packaged tasks in
``harness/data/tasks`` and the
simulated world's generated ones carry both), correct with probability

    P(task, prompt) = clip(base(task) + perturbation_sd * z(prompt, task)
                           + delta * [instruction in prompt], P_MIN, P_MAX)

- ``base(task) = base_low + (base_high - base_low) * u("base", task id)``: a task's own rate;
- ``z(prompt, task) = Phi^-1(u("perturb", sha256(prompt), task id))``: a fixed standard normal for
  each (whole prompt, task), so any edit anywhere in the prompt moves every task's chance;
- ``delta * [instruction in prompt]``: the planted effect, when ``effect="planted"`` and the stated
  ``instruction`` appears in the prompt (case and spacing ignored); ``effect="null"``: none;
- ``u(...)``: the first 8 bytes of sha256 of (seed, the parts) over 2^64, uniform on [0, 1);
  ``prompt``: every message's role and content, in order.

At temperature 0 the answer is a fixed function of the prompt: correct when
``u("draw", sha256(prompt), task id) < P``. Above 0 every call draws afresh from the server's
generator (seeded by ``seed``). **Reflect calls** get ``{"edits": [...]}`` in the night's format
(``prompts.parse_reflect_reply``): ``useless``
plausible rules made from random parts (no effect beyond moving the prompt), each for a target the
request offers, and the planted instruction (for ``planted_target``, else the first target offered) with
probability ``propose_planted`` (in both modes, so a null night sees the same
proposals) unless the documents already hold it; order shuffled, at most the edit budget the
request states. At temperature 0 these are a function of the reflect prompt too.

A prompt the stand-in does not know (no task of its own) is answered HTTP 400, naming it: a
harness mistake fails loudly instead of scoring as a wrong answer. :meth:`StandinModel.p_correct`
is the exact truth for any prompt, for benchmarks to value documents without sampling.

:class:`StandinServer` serves it on loopback; :class:`InProcessBackend` is the project's
``OpenAIBackend`` with only the HTTP hop replaced by a direct call (same bodies, same parsing and
cache), for benchmarks whose call counts an SDK round trip per call would make too slow.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from statistics import NormalDist
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from sage_pipeline.sleep.backends import OpenAIBackend, OpenAIConfig, Reply
from sage_pipeline.sleep.block import normalise_rule
from sage_pipeline.sleep.records import TaskRecord
from sage_pipeline.sleep.sage_night import CODER_USER, role_messages, task_text

P_MIN, P_MAX = 0.02, 0.98
PLANTED_INSTRUCTION = ("Before writing code, restate the exact input and output contract and check each edge case "
                       "the task names against it.")
REFLECT_SYSTEM = "You improve an agent's skill document and memory"
IN_PROCESS_URL = "http://standin.invalid/v1"  # never dialled: InProcessBackend answers in process

_USELESS = (
    "Prefer {adj} names for {place}.", "Keep {place} {adj} and short.", "Add a one-line comment above {place}.",
    "Order the imports of {place} {order}.", "Use {quote} quotes for strings in {place}.",
    "Put a blank line between {place}.", "Mention the {thing} in the first sentence of the answer.",
    "Avoid abbreviations in {place}.", "Write {place} in the imperative mood.",
    "Say which {thing} the answer assumes before the code.", "Name the {thing} once, near the top of {place}.",
    "Prefer {adj} wording in {place}.")
_PARTS = {
    "adj": ("clear", "descriptive", "consistent", "explicit", "plain", "uniform", "readable", "precise"),
    "place": ("helper functions", "docstrings", "loops", "error messages", "test names", "module headers",
              "local variables", "return statements", "comments", "function signatures"),
    "order": ("alphabetically", "by length", "by origin", "standard library first"),
    "quote": ("double", "single"),
    "thing": ("Python version", "input size", "data type", "encoding", "time budget", "calling convention"),
}


class StandinConfig(BaseModel):
    """The stand-in's stated numbers (see the module docstring for how each is used)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seed: int = Field(0, description="seeds every hash and the generator of draws above temperature 0")
    effect: Literal["null", "planted"] = Field("null", description="'null': nothing in a prompt changes a task's "
                                              "chance beyond its perturbation; 'planted': the instruction adds delta")
    delta: float = Field(0.15, ge=-1.0, le=1.0, description="the planted effect on P(correct)")
    perturbation_sd: float = Field(0.1, ge=0.0, le=1.0, description="sd of the whole-prompt perturbation of "
                                   "P(correct)")
    base_low: float = Field(0.3, ge=0.0, le=1.0, description="lowest task base rate")
    base_high: float = Field(0.7, ge=0.0, le=1.0, description="highest task base rate")
    instruction: str = Field(PLANTED_INSTRUCTION, min_length=10, description="the planted instruction")
    propose_planted: float = Field(0.7, ge=0.0, le=1.0, description="chance a reflect reply proposes the "
                                   "instruction (when the documents do not hold it yet)")
    useless: int = Field(2, ge=0, le=10, description="useless rules each reflect reply proposes")
    planted_target: str = Field("", description="the skill id the instruction is proposed for, when reflect may "
                                "edit it (empty: the first target the request offers)")

    @model_validator(mode="after")
    def _rates_in_order(self) -> StandinConfig:
        if self.base_low > self.base_high:
            raise ValueError(f"base_low ({self.base_low}) must not exceed base_high ({self.base_high})")
        return self


class StandinError(ValueError):
    """A request the stand-in cannot answer: ``status`` is the HTTP status it sends."""

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


def _prompt(messages: list[dict]) -> str:
    return "\n".join(f"{m.get('role', '')}: {m.get('content', '')}" for m in messages)


class StandinModel:
    """The stand-in's answers, without HTTP (:class:`StandinServer` serves them)."""

    def __init__(self, tasks: list[TaskRecord], config: StandinConfig | None = None) -> None:
        self.config = config if config is not None else StandinConfig()
        self._norm_instruction = normalise_rule(self.config.instruction)
        self.tasks: dict[str, TaskRecord] = {}
        self._solve: dict[str, TaskRecord] = {}
        for t in tasks:
            sim = t.meta.get("sim") if isinstance(t.meta, dict) else None
            if not isinstance(sim, dict) or not all(isinstance(sim.get(k), str) for k in ("gold", "naive")):
                raise ValueError(f"task {t.id} ({t.origin or 'no origin'}): the stand-in needs meta.sim.gold (a "
                                 "correct solution) and meta.sim.naive (a wrong variant); the packaged tasks and "
                                 "the simulated world's generated tasks have both")
            self.tasks[t.id] = t
            if t.reference_kind == "unit_tests":  # the night replays the coder on these only
                self._solve[CODER_USER.format(task=task_text(t))] = t
        self._rng = np.random.default_rng([self.config.seed, 20260])
        self._lock = threading.Lock()
        self.calls: Counter = Counter()
        self.proposed: Counter = Counter()  # "planted", "useless"

    # the exact truth ------------------------------------------------------------------------
    def _u(self, *parts: object) -> float:
        h = hashlib.sha256("\x1f".join(map(str, (self.config.seed, *parts))).encode("utf-8")).digest()
        return int.from_bytes(h[:8], "big") / 2.0 ** 64

    def has_instruction(self, prompt: str) -> bool:
        return self._norm_instruction in normalise_rule(prompt)

    def p_correct(self, task: TaskRecord, messages: list[dict]) -> float:
        """The exact chance that ``task`` is answered correctly under ``messages``."""
        c = self.config
        prompt = _prompt(messages)
        digest = hashlib.sha256(prompt.encode("utf-8")).hexdigest()
        base = c.base_low + (c.base_high - c.base_low) * self._u("base", task.id)
        u = min(max(self._u("perturb", digest, task.id), 1e-12), 1 - 1e-12)
        p = base + c.perturbation_sd * NormalDist().inv_cdf(u)
        if c.effect == "planted" and self.has_instruction(prompt):
            p += c.delta
        return float(min(max(p, P_MIN), P_MAX))

    def p_correct_tree(self, task: TaskRecord, tree: dict[str, str]) -> float:
        """:meth:`p_correct` under SAGE's coder prompt with the skills tree ``tree`` injected."""
        return self.p_correct(task, role_messages("coder", tree, task))

    # the calls ------------------------------------------------------------------------------
    def _draw(self, temperature: float, *parts: object) -> float:
        if temperature > 0:
            with self._lock:
                return float(self._rng.random())
        return self._u("draw", *parts)

    def chat(self, body: dict) -> str:
        """The reply text to a chat-completions request body; :class:`StandinError` when it is not one
        of the night's calls for a task this stand-in knows."""
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            raise StandinError(400, "the request has no messages list")
        temperature = body.get("temperature", 1.0)
        if isinstance(temperature, bool) or not isinstance(temperature, int | float) or temperature < 0:
            raise StandinError(400, f"temperature {temperature!r} is not a non-negative number")
        system = str(messages[0].get("content", "")) if messages[0].get("role") == "system" else ""
        user = str(messages[-1].get("content", ""))
        if system.startswith(REFLECT_SYSTEM):
            kind, text = "reflect", self._reflect(messages, system, float(temperature))
        elif user in self._solve:
            kind, text = "solve", self._answer(self._solve[user], messages, float(temperature))
        else:
            raise StandinError(400, f"the stand-in knows no task for this prompt (user message {user[:120]!r}); "
                               "start it with the tasks the night replays")
        with self._lock:
            self.calls[kind] += 1
        return text

    def _answer(self, task: TaskRecord, messages: list[dict], temperature: float) -> str:
        p = self.p_correct(task, messages)
        digest = hashlib.sha256(_prompt(messages).encode("utf-8")).hexdigest()
        sim = task.meta["sim"]
        return sim["gold"] if self._draw(temperature, digest, task.id) < p else sim["naive"]

    def _reflect(self, messages: list[dict], system: str, temperature: float) -> str:
        c = self.config
        m = re.search(r"Targets you may edit: (.+?)\.(?:\s|$)", system)
        targets = [t.strip() for t in m.group(1).split(",") if t.strip()] if m else ["skill"]
        b = re.search(r"Propose at most (\d+) edits", system)
        budget = int(b.group(1)) if b else c.useless + 1
        prompt = _prompt(messages)
        if temperature > 0:
            with self._lock:
                rng = np.random.default_rng(int(self._rng.integers(2 ** 63)))
        else:
            rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"{c.seed}\x1freflect\x1f{prompt}".encode())
                                                       .digest()[:8], "big"))
        edits = [{"op": "add", "target": targets[int(rng.integers(len(targets)))], "content": _useless_rule(rng),
                  "rationale": "general advice"} for _ in range(c.useless)]
        planted = rng.random() < c.propose_planted and not self.has_instruction(prompt)
        if planted:
            target = c.planted_target if c.planted_target in targets else targets[0]
            edits.append({"op": "add", "target": target, "content": c.instruction,
                          "rationale": "the failures skipped edge cases the task named"})
        order = rng.permutation(len(edits))
        edits = [edits[i] for i in order][:budget]
        with self._lock:
            for e in edits:
                self.proposed["planted" if e["content"] == c.instruction else "useless"] += 1
        return json.dumps({"edits": edits})


def _useless_rule(rng: np.random.Generator) -> str:
    template = _USELESS[int(rng.integers(len(_USELESS)))]
    return template.format(**{k: v[int(rng.integers(len(v)))] for k, v in _PARTS.items()})


def respond(model: StandinModel, body: object) -> tuple[int, dict]:
    """(HTTP status, JSON reply) of a chat-completions request body: a chat completion, or an
    OpenAI-style error object naming what was wrong."""
    try:
        if not isinstance(body, dict):
            raise StandinError(400, "the request body is not a JSON object")
        text = model.chat(body)
    except StandinError as e:
        return e.status, {"error": {"message": str(e)}}
    chars = sum(len(str(m.get("content", ""))) for m in body["messages"])
    return 200, {"id": "standin", "object": "chat.completion", "created": 0, "model": str(body.get("model", "standin")),
                 "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                 "usage": {"prompt_tokens": chars // 4 + 1, "completion_tokens": len(text) // 4 + 1,
                           "total_tokens": chars // 4 + len(text) // 4 + 2}}


class StandinServer:
    """:class:`StandinModel` served as ``POST <base_url>/chat/completions`` on 127.0.0.1 (a free port),
    in a thread; a context manager."""

    def __init__(self, model: StandinModel) -> None:
        self.model = model
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # the harness's own logs say what it did
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0) or 0))
                if not self.path.rstrip("/").endswith("/chat/completions"):
                    return self._send(404, {"error": {"message": f"no route {self.path}: POST /v1/chat/completions"}})
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError as e:
                    return self._send(400, {"error": {"message": f"the request body is not JSON ({e.msg})"}})
                self._send(*respond(me.model, body))

            def _send(self, code: int, obj: dict) -> None:
                payload = json.dumps(obj).encode("utf-8")
                try:
                    self.send_response(code)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> StandinServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class InProcessBackend(OpenAIBackend):
    """The project's :class:`OpenAIBackend` with the network hop replaced by a direct call of the
    stand-in: the same request bodies (built, cached, retried and counted by ``OpenAIBackend``'s
    own code), the same reply JSON, parsed by its own parser; only the SDK and the socket are
    skipped. For benchmarks that make hundreds of thousands of calls (an HTTP round trip through
    the SDK costs about 5 ms of CPU); ``test_harness.py`` checks that a night through it decides
    exactly as one over HTTP."""

    def __init__(self, model: StandinModel, config: OpenAIConfig | None = None) -> None:
        super().__init__(config if config is not None else OpenAIConfig(base_url=IN_PROCESS_URL, model="standin"))
        self.standin = model

    def _post(self, body: dict) -> Reply:
        status, payload = respond(self.standin, json.loads(json.dumps(body)))
        raw = json.dumps(payload).encode("utf-8")
        if status != 200:
            self._raise_for_status(status, raw, {})
        return self._parse(raw)

    def describe(self) -> dict:
        return {**super().describe(), "transport": "in-process (the stand-in, no HTTP)"}
