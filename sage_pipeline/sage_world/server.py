"""The model world on loopback, speaking the part of Ollama's HTTP API that SAGE and its client use.

Endpoints (Ollama's ``docs/api.md`` shapes): ``POST /api/chat`` (what every SAGE agent calls,
through ``ollama.chat``; non-streamed, or one NDJSON line when ``stream`` is true),
``POST /api/embeddings`` and ``POST /api/embed`` (SAGE's fix-pattern retrieval: a deterministic
64-dimensional vector of the text), ``GET /api/tags`` and ``POST /api/show`` (the models of SAGE's
table), ``GET /api/version`` and ``GET /``. ``sage doctor`` makes no HTTP call (it runs the
``ollama list`` CLI).

**The clock.** Before it answers a chat call the server sleeps ``WorldConfig.clock_scale x
ModelWorld.call_seconds(agent, model)`` wall seconds (the call's calibrated GPU-seconds, scaled;
0 answers at once), in the request's own thread and holding no lock: concurrent SAGE runs wait in
parallel. Each call's GPU-seconds and dollars go into its truth record (``gpu_s``, ``usd``), never
to SAGE. The socket sends without Nagle's delay, so a reply is not held back ~40 ms waiting for
the client's ACK (which SAGE's journals would otherwise show as model time).

A chat reply carries Ollama's usage fields: ``prompt_eval_count`` and ``eval_count`` (this call's
tokens: characters / ``WorldConfig.chars_per_token``) and the calibrated time of a typical call of
that agent in ``prompt_eval_duration`` / ``eval_duration`` / ``total_duration`` (nanoseconds; not
the counts over the throughputs). SAGE writes ``TOKEN_USAGE`` only from a ``usage``
attribute of the client's response (``ollama_safe.py:102``), which the ``ollama`` client SAGE
pins (0.6.x, a pydantic ``ChatResponse`` that drops unknown fields) never has: against Ollama,
and so against the world, SAGE writes no TOKEN_USAGE line. What SAGE's journals do show is the
gap between the ``AGENT_INSIGHT_EMITTED`` "decision" an agent writes before its call and the line
it writes after: that gap holds the clock's sleep (``world.py``, "Time and money").

**Skills mode** (``ModelWorld.skills``: null or planted; a test harness, ``skills_world.py``): the
sleep cycle's reflect requests are answered too (no clock, no GPU time, recorded in
``ModelWorld.skills.reflects``, not in the truth), and ``POST /v1/chat/completions`` serves the same
answers in the OpenAI chat-completions shape (non-streamed), so the cycle's ``OpenAIBackend`` can use the
world (``base_url`` = ``url + "/v1"``). Off (the default), neither exists: the server is exactly the
Ollama stand-in above.

A request the world cannot answer gets HTTP 400 with Ollama's ``{"error": ...}`` (SAGE's agent then
takes its failure path); every such error is counted with its reason (:attr:`WorldServer.errors`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import Counter
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from sage_pipeline.sage_world.skills_world import SkillsWorldError
from sage_pipeline.sage_world.world import ModelWorld, WorldError, agent_of

log = logging.getLogger(__name__)
EMBED_DIM = 64
MAX_BODY = 64 << 20  # SAGE's prompts are tens of kB; anything near this is not a SAGE request


def embedding(text: str) -> list[float]:
    """A unit vector that depends only on ``text`` (hashed character trigrams)."""
    v = np.zeros(EMBED_DIM)
    t = text.lower()
    for i in range(max(1, len(t) - 2)):
        h = int.from_bytes(hashlib.blake2b(t[i:i + 3].encode(), digest_size=4).digest(), "little")
        v[h % EMBED_DIM] += 1.0 if h & 1 << 31 else -1.0
    n = float(np.linalg.norm(v)) or 1.0
    return [round(float(x) / n, 6) for x in v]


def _now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


class WorldServer:
    """``ModelWorld`` served on ``127.0.0.1:port`` (0: a free port) in a background thread; a
    context manager. ``url`` is what ``OLLAMA_HOST`` takes."""

    def __init__(self, world: ModelWorld, port: int = 0, host: str = "127.0.0.1") -> None:
        self.world = world
        self.errors: Counter = Counter()
        self.requests: Counter = Counter()
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer((host, port), self._handler())
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> WorldServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="model-world", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> WorldServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _count(self, what: str, error: str | None = None) -> None:
        with self._lock:
            self.requests[what] += 1
            if error:
                self.errors[error] += 1

    def chat(self, body: dict) -> dict:
        model = body.get("model")
        messages = body.get("messages")
        if not isinstance(model, str) or not model:
            raise WorldError("field 'model' must be a non-empty string")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise WorldError("field 'messages' must be a list of objects")
        if self.world.skills.is_reflect(messages):  # skills mode only: the sleep cycle's reflect, no SAGE agent
            return self._reflect(model, messages)
        agent = agent_of(messages)
        prefill_s, decode_s = self.world.call_time(agent, model)  # a model without figures: refused, no draw made
        content, truth = self.world.answer(model, messages)
        truth.update(ts=_now(), gpu_s=prefill_s + decode_s, usd=self.world.call_usd(agent, model))
        with self._lock:
            self.world.truth.append(truth)
        pause = self.world.config.clock_scale * (prefill_s + decode_s)
        if pause > 0:
            time.sleep(pause)  # this request's thread only: no lock held, concurrent runs wait in parallel
        p_tok, c_tok = self.world.tokens(messages, content)
        p_ns, e_ns = int(prefill_s * 1e9), int(decode_s * 1e9)
        return {"model": model, "created_at": _now(), "message": {"role": "assistant", "content": content},
                "done": True, "done_reason": "stop", "total_duration": p_ns + e_ns, "load_duration": 0,
                "prompt_eval_count": p_tok, "prompt_eval_duration": p_ns, "eval_count": c_tok,
                "eval_duration": e_ns}

    def _reflect(self, model: str, messages: list[dict]) -> dict:
        try:
            content, _ = self.world.answer(model, messages)
        except SkillsWorldError as exc:  # a reflect request without its stated limits
            raise WorldError(str(exc)) from exc
        p_tok, c_tok = self.world.tokens(messages, content)
        return {"model": model, "created_at": _now(), "message": {"role": "assistant", "content": content},
                "done": True, "done_reason": "stop", "total_duration": 0, "load_duration": 0,
                "prompt_eval_count": p_tok, "prompt_eval_duration": 0, "eval_count": c_tok, "eval_duration": 0}

    def openai_chat(self, body: dict) -> dict:
        """``POST /v1/chat/completions`` (skills mode): :meth:`chat`'s answer as an OpenAI chat completion."""
        if body.get("stream"):
            raise WorldError("streamed chat completions are not served: send 'stream': false")
        reply = self.chat(body)
        p_tok, c_tok = reply["prompt_eval_count"], reply["eval_count"]
        with self._lock:
            n = sum(self.requests.values())
        return {"id": f"chatcmpl-world-{n}", "object": "chat.completion", "created": int(time.time()),
                "model": reply["model"],
                "choices": [{"index": 0, "message": reply["message"], "finish_reason": "stop"}],
                "usage": {"prompt_tokens": p_tok, "completion_tokens": c_tok, "total_tokens": p_tok + c_tok}}

    def models(self) -> list[dict]:
        names = sorted({m for r in self.world.table.routes.values() for m in (r.primary, r.fallback)})
        return [{"name": n, "model": n, "modified_at": _now(), "size": 0,
                 "digest": hashlib.sha256(n.encode()).hexdigest(),
                 "details": {"format": "gguf", "family": n.split(":")[0], "parameter_size": "",
                             "quantization_level": ""}}
                for n in names]

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True  # headers and body are two writes: no ~40 ms wait for a delayed ACK

            def log_message(self, fmt, *args) -> None:  # requests are counted, not printed
                pass

            def _send(self, obj: object, code: int = 200, ndjson: bool = False) -> None:
                data = (json.dumps(obj) + ("\n" if ndjson else "")).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/x-ndjson" if ndjson else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, what: str, msg: str, code: int = 400) -> None:
                server._count(what, f"{what}: {msg}")
                log.warning("model world: %s: %s", what, msg)
                self._send({"error": msg}, code)

            def do_GET(self) -> None:  # noqa: N802 (http.server's name)
                path = self.path.split("?")[0]
                if path == "/api/tags":
                    server._count("tags")
                    return self._send({"models": server.models()})
                if path == "/api/version":
                    server._count("version")
                    return self._send({"version": "0.0.0-sage-world"})
                if path == "/":
                    data = b"Ollama is running"
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return None
                return self._error("get", f"no endpoint GET {path}", 404)

            def do_HEAD(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                path = self.path.split("?")[0]
                try:
                    n = int(self.headers.get("Content-Length") or 0)
                except ValueError:
                    return self._error("request", "bad Content-Length")
                if n > MAX_BODY:
                    return self._error("request", f"body of {n} bytes is over {MAX_BODY}", 413)
                try:
                    body = json.loads(self.rfile.read(n) or b"{}")
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    return self._error("request", f"body is not JSON: {exc}")
                if not isinstance(body, dict):
                    return self._error("request", "body must be a JSON object")
                if path == "/api/chat":
                    try:
                        reply = server.chat(body)
                    except WorldError as exc:
                        return self._error("chat", str(exc))
                    server._count("chat")
                    return self._send(reply, ndjson=bool(body.get("stream")))
                if path == "/v1/chat/completions" and server.world.skills.on:
                    try:
                        reply = server.openai_chat(body)
                    except WorldError as exc:
                        return self._error("chat", str(exc))
                    server._count("chat")
                    return self._send(reply)
                if path == "/api/embeddings":
                    server._count("embeddings")
                    return self._send({"embedding": embedding(str(body.get("prompt") or ""))})
                if path == "/api/embed":
                    server._count("embed")
                    inp = body.get("input")
                    texts = inp if isinstance(inp, list) else [str(inp or "")]
                    return self._send({"model": body.get("model"), "embeddings": [embedding(str(t)) for t in texts]})
                if path == "/api/show":
                    server._count("show")
                    name = body.get("model") or body.get("name")
                    if name not in {m["name"] for m in server.models()}:
                        return self._error("show", f"model {name!r} not found", 404)
                    return self._send({"modelfile": "", "parameters": "", "template": "",
                                       "details": {"format": "gguf", "family": str(name).split(":")[0]},
                                       "model_info": {}})
                return self._error("post", f"no endpoint POST {path}", 404)

        return Handler
