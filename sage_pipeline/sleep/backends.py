"""The sleep night's one backend interface, a chat completion, and its two clients.

Every call the night makes is ``complete(messages, purpose, max_tokens) -> Reply``: the chat messages
SAGE's role would send (``sage_night.role_messages``) or reflect's (``prompts.reflect_messages``), a
purpose for the accounting (``solve``, ``reflect``), and a completion budget. Two clients:

- :class:`OllamaBackend`, Ollama's native ``POST /api/chat``: what SAGE itself calls
  (``src/sage/llm/ollama_safe.py`` ``chat_with_timeout`` -> ``ollama.chat(model, messages, options)``,
  every agent passing ``options={"temperature": t}``). The body is the one the ``ollama`` client sends
  for that call: ``{"model", "stream": false, "options": {"temperature": t}, "messages", "tools": []}``,
  at the host ``$OLLAMA_HOST`` names (parsed as the client parses it: default ``http://127.0.0.1:11434``,
  port 11434 when none is given); the reply is read as SAGE reads it, ``message.content``, with Ollama's
  ``prompt_eval_count`` and ``eval_count`` as the token counts. Like SAGE, it sends no ``num_predict``:
  ``max_tokens`` is not a field SAGE sets, so the reply is bounded by ``max_reply_bytes`` and the deadline.
- :class:`OpenAIBackend`, any OpenAI-compatible ``/chat/completions`` server (vLLM, llama.cpp server,
  Ollama's ``/v1``, hosted APIs), through the ``openai`` SDK.

A call that fails raises :class:`BackendError` with its cause. The night stops there and ends
``backend_error``: a failed call is never cached and never scored as a wrong answer. Transient
failures (timeouts, connection errors, 408/409/425/429, 5xx, empty, non-JSON or malformed replies) are
retried with exponential backoff and jitter, honouring ``Retry-After``; authentication (401/403),
not-found (404: model or URL) and other request errors fail at once.

The retries are this module's (the SDK's own are turned off), because a night needs every failed attempt
in its report, a malformed 200 reply retried like a 5xx, and a seeded, injectable clock.

Deadlines: ``timeout_s`` is the wall-clock deadline of one attempt, the whole request (connect, TLS,
send, headers, body), not of one socket read (a server trickling a byte at a time would hold that for
ever): a timer shuts the attempt's connection down when the deadline passes. Each retry gets a fresh
deadline after its backoff wait, so one call lasts at most ``(max_retries + 1) * timeout_s + max_retries *
max(backoff_max_s, max_retry_after_s)`` (plus name resolution, which nothing here can bound).

Reply size: ``max_reply_bytes`` (default 4 MiB) caps every reply, success or error. The body is read as
a stream and the read stops at the cap (a ``Content-Length`` over it is refused before any of the body is
read), so a server answering 50 MB costs at most the cap in memory; the call then fails at once
(retrying would get the same reply) with a :class:`BackendError` of kind ``too_large`` naming the cap.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import socket
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx2
import openai
from pydantic import BaseModel, ConfigDict, Field, field_validator

TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
DEFAULT_BASE_URL = "http://127.0.0.1:8000/v1"
OLLAMA_DEFAULT_PORT = 11434  # the ollama client's (ollama/_client.py _parse_host)
DEFAULT_MAX_REPLY_BYTES = 4 << 20  # 4 MiB: a chat completion of a few thousand tokens is a few KiB

class BackendError(RuntimeError):
    """A backend call failed for good. ``kind``: transient (retries used up), auth, not_found,
    bad_request, config, reply (a reply that had to be JSON was not), too_large (a reply over
    ``max_reply_bytes``)."""

    def __init__(self, cause: str, kind: str = "transient", purpose: str = "", attempts: int = 1) -> None:
        self.cause, self.kind, self.purpose, self.attempts = cause, kind, purpose, attempts
        super().__init__(cause)


@dataclass(frozen=True)
class Reply:
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached: bool = False


@dataclass
class CallLog:
    """Calls, token use, retries and every failed attempt, per purpose (solve, grade, reflect)."""

    calls: Counter = field(default_factory=Counter)
    prompt_tokens: Counter = field(default_factory=Counter)
    completion_tokens: Counter = field(default_factory=Counter)
    cache_hits: Counter = field(default_factory=Counter)
    retries: Counter = field(default_factory=Counter)
    errors: list[dict] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record(self, purpose: str, reply: Reply) -> None:
        with self._lock:
            if reply.cached:
                self.cache_hits[purpose] += 1
                return
            self.calls[purpose] += 1
            self.prompt_tokens[purpose] += reply.prompt_tokens
            self.completion_tokens[purpose] += reply.completion_tokens

    def error(self, purpose: str, attempt: int, cause: str, final: bool) -> None:
        with self._lock:
            if not final:
                self.retries[purpose] += 1
            self.errors.append({"purpose": purpose, "attempt": attempt, "error": cause[:300],
                                "final": final, "at": time.strftime("%H:%M:%S")})

    def summary(self) -> dict:
        with self._lock:
            purposes = sorted(set(self.calls) | set(self.cache_hits) | set(self.retries))
            by = {p: {"calls": self.calls[p], "prompt_tokens": self.prompt_tokens[p],
                      "completion_tokens": self.completion_tokens[p], "cache_hits": self.cache_hits[p],
                      "retries": self.retries[p]} for p in purposes}
            return {"calls": sum(self.calls.values()), "prompt_tokens": sum(self.prompt_tokens.values()),
                    "completion_tokens": sum(self.completion_tokens.values()),
                    "total_tokens": sum(self.prompt_tokens.values()) + sum(self.completion_tokens.values()),
                    "cache_hits": sum(self.cache_hits.values()), "retries": sum(self.retries.values()),
                    "errors": len(self.errors), "by_purpose": by}


class ChatConfig(BaseModel):
    """What both clients share: the model, how to call it, how long to wait, how much to read. ``model``
    defaults to ``$SAGE_SLEEP_MODEL`` as it is when the config is made (at run time in Dagster, never at
    import)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(default_factory=lambda: os.environ.get("SAGE_SLEEP_MODEL", ""),
                       description="model name on the server (default: $SAGE_SLEEP_MODEL when the config is made; "
                                   "the backend refuses to start without one)")
    timeout_s: float = Field(60.0, description="wall-clock deadline of one attempt: connect, send, headers and "
                             "body; each retry gets its own")
    max_retries: int = Field(4, ge=0, description="retries of a transient failure (timeout, connection error, "
                             "408/409/425/429, 5xx, empty or malformed reply)")
    backoff_s: float = Field(1.0, ge=0, description="the first retry waits about this long, doubling each time")
    backoff_max_s: float = Field(30.0, ge=0, description="the longest backoff wait")
    max_retry_after_s: float = Field(60.0, ge=0, description="a server's Retry-After is honoured up to this")
    temperature: float = Field(0.0, ge=0, description="sampling temperature of every call")
    max_tokens: int = Field(1024, ge=1, description="completion tokens of an answer (the openai client sends it; "
                            "the ollama client, like SAGE, does not)")
    reflect_max_tokens: int = Field(2048, ge=1, description="completion tokens of reflect's reply (as max_tokens)")
    seed: int = Field(0, description="seed of the backoff jitter")
    max_reply_bytes: int = Field(DEFAULT_MAX_REPLY_BYTES, ge=1024, description="the largest reply read from the "
                                 "server, in bytes (default 4 MiB): the read stops there and the call fails, "
                                 "naming this cap, so a runaway server cannot fill the memory")


class OpenAIConfig(ChatConfig):
    """An OpenAI-compatible chat-completions server and how to call it. ``base_url`` defaults to
    ``$SAGE_SLEEP_BASE_URL`` as it is when the config is made."""

    base_url: str = Field(default_factory=lambda: os.environ.get("SAGE_SLEEP_BASE_URL") or DEFAULT_BASE_URL,
                          validate_default=True,
                          description="base URL ending in /v1 (default: $SAGE_SLEEP_BASE_URL when the config is "
                                      f"made, else {DEFAULT_BASE_URL})")
    api_key_env: str = Field("SAGE_SLEEP_API_KEY", description="the environment variable holding the API key, read "
                             "at each request; unset or empty: no key is sent (local servers)")

    @field_validator("base_url")
    @classmethod
    def _no_trailing_slash(cls, v: str) -> str:
        return v.rstrip("/")


def ollama_host(host: str | None) -> str:
    """``host`` as the ``ollama`` client SAGE uses reads ``$OLLAMA_HOST`` (``ollama/_client.py``
    ``_parse_host``): empty is ``http://127.0.0.1:11434``; no scheme is http; no port is 11434 (80 or 443
    with an explicit http:// or https://); a path is kept, without a trailing slash."""
    host, port = (host or "").strip(), OLLAMA_DEFAULT_PORT
    scheme, _, hostport = host.partition("://")
    if not hostport:
        scheme, hostport = "http", host
    elif scheme == "http":
        port = 80
    elif scheme == "https":
        port = 443
    split = urllib.parse.urlsplit(f"{scheme}://{hostport}")
    name = split.hostname or "127.0.0.1"
    try:
        port = split.port or port
    except ValueError:
        raise BackendError(f"OLLAMA_HOST {host!r}: the port is not a number from 0 to 65535", kind="config") from None
    if ":" in name:
        name = f"[{name}]"
    path = split.path.rstrip("/")
    return f"{scheme}://{name}:{port}{path}"


class OllamaConfig(ChatConfig):
    """Ollama's native chat API, as SAGE calls it. ``host`` defaults to ``$OLLAMA_HOST`` (SAGE's own
    variable) as it is when the config is made."""

    host: str = Field(default_factory=lambda: os.environ.get("OLLAMA_HOST", ""),
                      description="Ollama's host as $OLLAMA_HOST writes it (default: $OLLAMA_HOST when the config "
                                  "is made; empty: http://127.0.0.1:11434, as SAGE's ollama client)")


class ChatClient:
    """A chat-completions client: :meth:`complete` with its cache, retries and accounting; a subclass sends
    one attempt (:meth:`_post`) and names its URL.

    Successful replies are cached by request (model, messages, sampling) at temperature 0, so replaying an
    unchanged prompt costs nothing; above 0 every call draws afresh (a cached sample would make the gate's
    repeated replays one draw); failed calls are never cached.
    """

    name = "chat"
    url = ""

    def __init__(self, config: ChatConfig, sleep: Callable[[float], None]) -> None:
        self.calls = CallLog()
        self.config = config
        if not config.model:
            raise BackendError(f"no model set for the {self.name} backend: set $SAGE_SLEEP_MODEL or the config "
                               "field model", kind="config")
        t = config.timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t) or t <= 0:
            raise BackendError(f"timeout_s {t!r}: the deadline of one request must be a positive number of seconds",
                               kind="config")
        self._sleep = sleep
        self._rng = random.Random(config.seed)
        self._cache: dict[str, Reply] = {}
        self._lock = threading.Lock()
        self._attempt = threading.local()  # the deadline of the attempt this thread is making

    @property
    def draws_fresh(self) -> bool:
        """Whether asking the same prompt again draws a fresh answer (sampling above temperature 0), so the
        gate's repeated replays carry new evidence; at 0 the same answer comes back."""
        return self.config.temperature > 0

    def describe(self) -> dict:
        c = self.config
        return {"name": self.name, "url": self.url, "model": c.model, "temperature": c.temperature,
                "timeout_s": c.timeout_s, "max_retries": c.max_retries, "max_reply_bytes": c.max_reply_bytes}

    def body(self, messages: list[dict], max_tokens: int) -> dict:
        """The request body of one call."""
        raise NotImplementedError

    def _post(self, body: dict) -> Reply:
        raise NotImplementedError

    # the call, its retries and its cache -------------------------------------------------
    def complete(self, messages: list[dict], purpose: str, max_tokens: int) -> Reply:
        """The model's reply to ``messages`` (``purpose``: what the call is for, in the accounting)."""
        body = self.body(messages, max_tokens)
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            reply = Reply(hit.text, hit.prompt_tokens, hit.completion_tokens, cached=True)
            self.calls.record(purpose, reply)
            return reply
        attempts = 1 + self.config.max_retries
        for attempt in range(1, attempts + 1):
            try:
                reply = self._post(body)
            except _Retry as e:
                final = attempt == attempts
                self.calls.error(purpose, attempt, e.cause, final)
                if final:
                    raise BackendError(f"{e.cause} (gave up after {attempts} attempts to {self.url})",
                                       "transient", purpose, attempt) from None
                self._sleep(self._delay(attempt, e.retry_after))
                continue
            except BackendError as e:
                e.purpose, e.attempts = purpose, attempt
                self.calls.error(purpose, attempt, e.cause, True)
                raise
            if not self.draws_fresh:
                with self._lock:
                    self._cache[key] = reply
            self.calls.record(purpose, reply)
            return reply
        raise AssertionError("unreachable")

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        c = self.config
        if retry_after is not None:
            return min(max(retry_after, 0.0), c.max_retry_after_s)
        base = min(c.backoff_max_s, c.backoff_s * 2 ** (attempt - 1))
        with self._lock:
            return base * (0.5 + 0.5 * self._rng.random())

    def _on_response(self, response) -> None:
        """The HTTP client's response hook (headers in, body not yet read): the body is read through
        a stream that stops at ``max_reply_bytes``, whoever reads it (this backend, or the SDK reading
        an error's body)."""
        deadline = self._attempt.deadline
        cap = self.config.max_reply_bytes
        length = response.headers.get("Content-Length", "")
        if length.strip().isdigit() and int(length) > cap:
            deadline.too_large(f"Content-Length {int(length)}")
            response.stream.close()
            response.stream = _CappedStream(iter(()), response.stream, cap, deadline)
        else:
            response.stream = _CappedStream(response.stream, response.stream, cap, deadline)

    def _too_large(self, deadline: _Deadline, what: str = "") -> BackendError:
        cap = self.config.max_reply_bytes
        return BackendError(f"the {what}reply from {self.url} is larger than max_reply_bytes={cap} ({cap / 2**20:g} "
                            f"MiB; {deadline.cut}): the read stopped at the cap and the call failed without "
                            f"retrying. Check the server and model (a runaway generation?), or raise the {self.name} "
                            "backend's max_reply_bytes if such replies are real", kind="too_large")

    def _timed_out(self, deadline: _Deadline) -> _Retry:
        return _Retry(f"request timed out after {deadline.seconds:g} s (the deadline of one attempt: connect, send, "
                      f"headers and body; {deadline.progress()}; if the model is only slow, raise timeout_s or "
                      "--timeout)")

    def _auth_note(self) -> str:
        return "check the API key"

    def _not_found_note(self) -> str:
        return f"model {self.config.model!r} not found on the server, or the URL is wrong"

    def _raise_for_status(self, status: int, raw: bytes, headers) -> None:
        msg = _server_message(raw)
        if status in TRANSIENT_STATUS or status >= 500:
            retry_after = _retry_after(headers.get("Retry-After") if headers else None)
            raise _Retry(f"HTTP {status} from the server: {msg}", retry_after)
        if status in (401, 403):
            raise BackendError(f"HTTP {status} from {self.url}: {msg} (authentication failed: {self._auth_note()})",
                               kind="auth")
        if status == 404:
            raise BackendError(f"HTTP 404 from {self.url}: {msg} ({self._not_found_note()})", kind="not_found")
        raise BackendError(f"HTTP {status} from {self.url}: {msg} (the server refused the request; "
                           "retrying would not help)", kind="bad_request")

    def _decode(self, raw: bytes, headers) -> object:
        try:
            return json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise _Retry(f"the server's reply is not JSON: not UTF-8 at byte {e.start}{_ctype(headers)}: "
                         f"{raw[:120]!r}") from None
        except json.JSONDecodeError as e:
            raise _Retry(f"the server's reply is not JSON: {e.msg} at line {e.lineno} column {e.colno}"
                         f"{_ctype(headers)}: {raw[:120]!r}") from None
        except RecursionError:
            raise _Retry(f"the server's reply is not usable JSON: nested too deeply to decode{_ctype(headers)}: "
                         f"{raw[:60]!r}") from None


class OpenAIBackend(ChatClient):
    """An OpenAI-compatible chat-completions server, through the ``openai`` SDK."""

    name = "openai"

    def __init__(self, config: OpenAIConfig | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        config = config if config is not None else OpenAIConfig()
        super().__init__(config, sleep)
        if not config.base_url.startswith(("http://", "https://")):
            raise BackendError(f"base URL {config.base_url!r} must start with http:// or https://", kind="config")
        self.url = f"{config.base_url}/chat/completions"
        self._client = _client(config, self._on_request, self._on_response)

    def describe(self) -> dict:
        return {**super().describe(), "api_key_env": self.config.api_key_env, "api_key_set": bool(self._api_key())}

    def body(self, messages: list[dict], max_tokens: int) -> dict:
        return {"model": self.config.model, "messages": messages, "temperature": self.config.temperature,
                "max_tokens": max_tokens}

    def _api_key(self) -> str:
        env = self.config.api_key_env
        return os.environ.get(env, "") if env else ""

    def _auth_note(self) -> str:
        env = self.config.api_key_env
        key_note = (f"${env} is {'set' if os.environ.get(env) else 'not set'}" if env else "no API key is sent")
        return f"check the API key; {key_note}"

    def _not_found_note(self) -> str:
        return (f"model {self.config.model!r} not found on the server, or the base URL is wrong: it should end "
                "in /v1")

    def _on_request(self, request) -> None:
        """The HTTP client's request hook: this attempt's deadline watches the connection (httpcore's
        ``trace`` extension), and the API key is the one in the environment now, or none at all."""
        request.extensions["trace"] = self._attempt.deadline.trace
        key = self._api_key()
        if key:
            request.headers["Authorization"] = f"Bearer {key}"
        else:
            request.headers.pop("Authorization", None)

    def _post(self, body: dict) -> Reply:
        """One attempt: the SDK sends the request, its body is read here under the deadline, and
        never past ``max_reply_bytes``."""
        t = self.config.timeout_s
        deadline = self._attempt.deadline = _Deadline(t, self.config.max_reply_bytes)
        try:
            with deadline, self._client.chat.completions.with_streaming_response.create(**body) as resp:
                raw = deadline.read(resp.iter_bytes())
                headers = resp.headers
        except openai.APIStatusError as e:
            if deadline.cut:
                raise self._too_large(deadline, f"HTTP {e.status_code} ") from None
            if not deadline.expired:
                self._raise_for_status(e.status_code, e.response.content, e.response.headers)
            raise self._timed_out(deadline) from None
        except (openai.APIConnectionError, httpx2.TransportError, OSError) as e:
            if deadline.expired or isinstance(e, openai.APITimeoutError | httpx2.TimeoutException | TimeoutError):
                raise self._timed_out(deadline) from None
            cause = e.__cause__ if isinstance(e, openai.APIConnectionError) and e.__cause__ else e
            raise _Retry(f"connection to {self.url} failed ({type(cause).__name__}: {cause})") from None
        if deadline.cut:
            raise self._too_large(deadline)
        return self._parse(raw, headers)

    def _parse(self, raw: bytes, headers=None) -> Reply:
        text, pt, ct = _reply_fields(self._decode(raw, headers))
        return Reply(text, pt if pt is not None else 0, ct if ct is not None else len(text) // 4)


class OllamaBackend(ChatClient):
    """Ollama's native ``POST /api/chat``, the request SAGE's agents send (see the module doc)."""

    name = "ollama"

    def __init__(self, config: OllamaConfig | None = None, sleep: Callable[[float], None] = time.sleep) -> None:
        config = config if config is not None else OllamaConfig()
        super().__init__(config, sleep)
        self.base = ollama_host(config.host)
        self.url = f"{self.base}/api/chat"
        self._client = httpx2.Client(event_hooks={"request": [self._on_request], "response": [self._on_response]},
                                     limits=httpx2.Limits(max_keepalive_connections=0),
                                     timeout=httpx2.Timeout(config.timeout_s), follow_redirects=True,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})

    def body(self, messages: list[dict], max_tokens: int) -> dict:
        """SAGE's ``ollama.chat(model=..., messages=..., options={"temperature": t})`` as the ``ollama`` client
        sends it (``ChatRequest(...).model_dump(exclude_none=True)``); ``max_tokens`` is not sent, as SAGE
        sends no ``num_predict``."""
        return {"model": self.config.model, "stream": False, "options": {"temperature": self.config.temperature},
                "messages": [{"role": m["role"], "content": m["content"]} for m in messages], "tools": []}

    def _not_found_note(self) -> str:
        return f"model {self.config.model!r} is not pulled on this Ollama (ollama pull it), or the host is wrong"

    def _auth_note(self) -> str:
        return "the server in front of Ollama refused the request"

    def _on_request(self, request) -> None:
        request.extensions["trace"] = self._attempt.deadline.trace

    def _post(self, body: dict) -> Reply:
        deadline = self._attempt.deadline = _Deadline(self.config.timeout_s, self.config.max_reply_bytes)
        try:
            with deadline, self._client.stream("POST", self.url, json=body) as resp:
                raw = deadline.read(resp.iter_bytes())
                status, headers = resp.status_code, resp.headers
        except (httpx2.TransportError, OSError) as e:
            if deadline.expired or isinstance(e, httpx2.TimeoutException | TimeoutError):
                raise self._timed_out(deadline) from None
            raise _Retry(f"connection to {self.url} failed ({type(e).__name__}: {e}): is Ollama running there? "
                         "(SAGE reads the host from $OLLAMA_HOST)") from None
        if deadline.cut:
            raise self._too_large(deadline, "" if status < 400 else f"HTTP {status} ")
        if status >= 400:
            self._raise_for_status(status, raw, headers)
        return self._parse(raw, headers)

    def _parse(self, raw: bytes, headers=None) -> Reply:
        return _ollama_fields(self._decode(raw, headers))


def _ollama_fields(obj) -> Reply:
    """The reply of ``/api/chat`` (``stream: false``): ``message.content`` as SAGE reads it
    (``response["message"]["content"]``), ``prompt_eval_count`` and ``eval_count`` as the token counts; any
    other shape is a :class:`_Retry` naming the field that was wrong."""
    def bad(what: str) -> _Retry:
        return _Retry(f"the server's reply is malformed: {what} (expected Ollama's /api/chat reply: message.content "
                      f"a string): {str(obj)[:160]}")

    if not isinstance(obj, dict):
        raise bad(f"the reply is {_kind(obj)}, not an object")
    if "message" not in obj:
        err = obj.get("error")
        raise bad(f"no 'message' field{'; its error field says: ' + str(err)[:200] if err else ''}")
    message = obj["message"]
    if not isinstance(message, dict):
        raise bad(f"'message' is {_kind(message)}, expected an object")
    text = message.get("content")
    if text is not None and not isinstance(text, str):
        raise bad(f"message.content is {_kind(text)}, expected a string")
    if text is None or not text.strip():
        raise _Retry(f"empty reply (content {'null' if text is None else repr(text[:20])}, "
                     f"done_reason={obj.get('done_reason')!r})")
    counts = []
    for k in ("prompt_eval_count", "eval_count"):
        v = obj.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise bad(f"{k} is {_kind(v)}, expected a non-negative integer")
        counts.append(v)
    return Reply(text, counts[0] or 0, counts[1] if counts[1] is not None else len(text) // 4)


BACKENDS = {"ollama": OllamaBackend, "openai": OpenAIBackend}


def _kind(value) -> str:
    """``an integer 5``, ``a list [1, 2]``: a JSON value's type and head, for error messages."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", int: "an integer",
             float: "a number", type(None): "null"}
    head = json.dumps(value)[:60] if value is not None else ""
    return f"{names.get(type(value), type(value).__name__)} {head}".rstrip()


def _reply_fields(obj) -> tuple[str, int | None, int | None]:
    """(content, prompt_tokens, completion_tokens) of a chat-completions reply; a reply of any other
    shape is a :class:`_Retry` naming the field that was wrong."""
    def bad(what: str) -> _Retry:
        return _Retry(f"the server's reply is malformed: {what} (expected an OpenAI chat completion: "
                      f"choices[0].message.content a string, usage an object or absent): {str(obj)[:160]}")

    if not isinstance(obj, dict):
        raise bad(f"the reply is {_kind(obj)}, not an object")
    if "choices" not in obj:
        err = obj.get("error")
        raise bad(f"no 'choices' field{'; its error field says: ' + str(err)[:200] if err else ''}")
    choices = obj["choices"]
    if not isinstance(choices, list):
        raise bad(f"'choices' is {_kind(choices)}, expected a list")
    if not choices:
        raise bad("'choices' is an empty list")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise bad(f"choices[0] is {_kind(choice)}, expected an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise bad(f"choices[0].message is {'missing' if 'message' not in choice else _kind(message)}, "
                  "expected an object")
    if "content" not in message:
        raise bad("choices[0].message has no 'content'")
    text = message["content"]
    if text is not None and not isinstance(text, str):
        raise bad(f"choices[0].message.content is {_kind(text)}, expected a string")
    if text is None or not text.strip():
        raise _Retry(f"empty reply (content {'null' if text is None else repr(text[:20])}, "
                     f"finish_reason={choice.get('finish_reason')!r})")
    usage = obj.get("usage")
    if usage is None:
        return text, None, None
    if not isinstance(usage, dict):
        raise bad(f"'usage' is {_kind(usage)}, expected an object")
    counts = []
    for k in ("prompt_tokens", "completion_tokens"):
        v = usage.get(k)
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
            raise bad(f"usage.{k} is {_kind(v)}, expected a non-negative integer")
        counts.append(v)
    return text, counts[0], counts[1]


def _ctype(headers) -> str:
    ctype = headers.get("Content-Type") if headers else None
    return f" (Content-Type {ctype})" if ctype else ""


class _Deadline:
    """The wall-clock deadline of one attempt (``with``: armed on entry, disarmed on exit).

    httpcore reports each connection it opens to :meth:`trace`, its ``trace`` extension; a
    duplicate of the connection's socket is kept, and when the deadline passes a timer shuts
    it down, which ends a blocked connect, TLS handshake, send or read at once, however slowly
    the server trickles (a shutdown reaches the socket under TLS too, and, unlike a close, never
    frees a descriptor another thread is reading).
    """

    def __init__(self, seconds: float, max_bytes: int = DEFAULT_MAX_REPLY_BYTES) -> None:
        self.seconds = seconds
        self.max_bytes = max_bytes
        self.cut = ""  # why the body was cut at max_bytes, once it was
        self.expired = False
        self.body_bytes = -1  # -1: the headers have not arrived
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(max(seconds, 0.0), self._expire)
        self._timer.daemon = True

    def __enter__(self) -> _Deadline:
        self._timer.start()
        return self

    def __exit__(self, *exc) -> None:
        self._timer.cancel()
        with self._lock:
            socks, self._socks = self._socks, []
        for s in socks:
            s.close()

    def trace(self, event: str, info: dict) -> None:
        """httpcore's trace callback: a new connection's socket is watched; headers are noted."""
        if event == "connection.connect_tcp.complete":
            sock = info["return_value"].get_extra_info("socket")
            if sock is not None:
                self._watch(sock.dup())
        elif event == "http11.receive_response_headers.complete":
            self.body_bytes = max(self.body_bytes, 0)

    def read(self, chunks) -> bytes:
        """The body, counted as it comes (for the timeout's message), never more than ``max_bytes``
        of it once decoded (the stream under it stops at ``max_bytes`` on the wire, :class:`_CappedStream`)."""
        self.body_bytes = 0
        out = []
        for chunk in chunks:
            self.body_bytes += len(chunk)
            if self.body_bytes > self.max_bytes:
                self.too_large(f"over {self.max_bytes} bytes once decoded")
                break
            out.append(chunk)
        if self.expired:  # the timer shut the socket: what looked like the end was the cut
            raise TimeoutError(f"deadline of {self.seconds:g} s passed")
        return b"" if self.cut else b"".join(out)

    def too_large(self, why: str) -> None:
        self.cut = self.cut or why

    def progress(self) -> str:
        if self.body_bytes < 0:
            return "no complete response headers by then"
        return f"headers received, {self.body_bytes} byte(s) of the body by then"

    def _watch(self, sock: socket.socket) -> None:
        with self._lock:
            self._socks.append(sock)
            expired = self.expired
        if expired:
            _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            socks = list(self._socks)
        for s in socks:
            _shutdown(s)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed by the other side
        pass


class _CappedStream(httpx2.SyncByteStream):
    """A response body that ends after ``cap`` bytes on the wire, saying so to the attempt's
    deadline; closing it closes the connection's stream (the rest is never read)."""

    def __init__(self, chunks, inner, cap: int, deadline: _Deadline) -> None:
        self._chunks, self._inner, self._cap, self._deadline = chunks, inner, cap, deadline

    def __iter__(self):
        n = 0
        for chunk in self._chunks:
            n += len(chunk)
            if n > self._cap:
                self._deadline.too_large(f"over {self._cap} bytes on the wire")
                return
            yield chunk

    def close(self) -> None:
        self._inner.close()


def _client(config: OpenAIConfig, on_request: Callable, on_response: Callable):
    """The SDK's client for ``config``: no retries of its own (the backend's loop retries), no
    pooled connections (each attempt's deadline watches the connection it opens), each socket
    operation bounded by ``timeout_s`` (the deadline bounds them together), and every reply's body
    read through ``on_response``'s capped stream."""
    http = openai.DefaultHttpxClient(event_hooks={"request": [on_request], "response": [on_response]},
                                     limits=httpx2.Limits(max_keepalive_connections=0))
    # the key is set per request by on_request (or none is sent); the SDK only insists on one
    return openai.OpenAI(api_key="set-per-request", base_url=config.base_url, max_retries=0,
                         timeout=httpx2.Timeout(config.timeout_s), http_client=http)


class _Retry(Exception):
    def __init__(self, cause: str, retry_after: float | None = None) -> None:
        self.cause, self.retry_after = cause, retry_after
        super().__init__(cause)


def _server_message(raw: bytes) -> str:
    text = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(text)
    except json.JSONDecodeError:
        return text[:200] or "(no body)"
    if isinstance(obj, dict):
        err = obj.get("error", obj.get("message", obj.get("detail")))
        if isinstance(err, dict):
            err = err.get("message") or err.get("code") or err
        return str(err)[:200]
    return text[:200]


def _retry_after(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None
