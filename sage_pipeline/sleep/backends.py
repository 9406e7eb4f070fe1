"""Backends: what answers tasks, grades rubrics and reflects.

Two implementations share one interface (``solve``, ``grade``, ``reflect``, each returning a
:class:`Reply`):

- :class:`~sage_pipeline.sleep.sim.SimulatedBackend`, the deterministic embedded default;
- :class:`OpenAIBackend`, any OpenAI-compatible ``/chat/completions`` server (vLLM,
  llama.cpp server, Ollama, hosted APIs), standard library only.

A call that fails raises :class:`BackendError` with its cause. The night stops there and
ends ``backend_error``: a failed call is never cached and never scored as a wrong answer.
Transient failures (timeouts, connection errors, 408/409/429, 5xx, empty or non-JSON
replies) are retried with exponential backoff and jitter, honouring ``Retry-After``;
authentication (401/403), not-found (404: model or URL) and other request errors fail at
once.
"""

from __future__ import annotations

import abc

import hashlib
import http.client
import json
import os
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from sage_pipeline.sleep import prompts
from sage_pipeline.sleep.records import ReflectRequest, TaskRecord

TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class BackendError(RuntimeError):
    """A backend call failed for good. ``kind``: transient (retries used up), auth, not_found,
    bad_request, config, reply (a reply that had to be JSON was not)."""

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


class Backend(abc.ABC):
    """The interface of every backend (simulated, OpenAI-compatible). ``calls`` records what
    they cost."""

    name = "backend"

    def __init__(self) -> None:
        self.calls = CallLog()

    @abc.abstractmethod
    def solve(self, task: TaskRecord, skill: str, memory: str) -> Reply:
        """The backend's answer to ``task`` under the skill document and memory."""

    @abc.abstractmethod
    def grade(self, task: TaskRecord, response: str) -> Reply:
        """A rubric grade of ``response`` (reply text: JSON with a score in [0, 1])."""

    @abc.abstractmethod
    def reflect(self, request: ReflectRequest) -> Reply:
        """Proposed edits to the learned blocks (reply text: JSON)."""

    def describe(self) -> dict:
        return {"name": self.name}


@dataclass(frozen=True)
class OpenAIConfig:
    base_url: str = ""  # "" -> $SAGE_SLEEP_BASE_URL, else http://127.0.0.1:8000/v1
    model: str = ""  # "" -> $SAGE_SLEEP_MODEL
    api_key_env: str = "SAGE_SLEEP_API_KEY"  # the environment variable holding the key ("" or unset: no key)
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_s: float = 1.0  # first retry waits about this long, doubling each time
    backoff_max_s: float = 30.0
    max_retry_after_s: float = 60.0  # a server's Retry-After is honoured up to this
    temperature: float = 0.0
    max_tokens: int = 1024
    reflect_max_tokens: int = 2048
    seed: int = 0  # jitter of the backoff

    def resolved(self) -> OpenAIConfig:
        base = self.base_url or os.environ.get("SAGE_SLEEP_BASE_URL", "") or "http://127.0.0.1:8000/v1"
        model = self.model or os.environ.get("SAGE_SLEEP_MODEL", "")
        return OpenAIConfig(**{**self.__dict__, "base_url": base.rstrip("/"), "model": model})


class OpenAIBackend(Backend):
    """An OpenAI-compatible chat-completions server over HTTP (urllib; no SDK).

    Successful replies are cached by request (model, messages, sampling), so replaying an
    unchanged document costs nothing; failed calls are never cached.
    """

    name = "openai"

    def __init__(self, config: OpenAIConfig = OpenAIConfig(), sleep: Callable[[float], None] = time.sleep) -> None:
        super().__init__()
        self.config = config.resolved()
        if not self.config.model:
            raise BackendError("no model set for the OpenAI-compatible backend: set $SAGE_SLEEP_MODEL or the "
                               "config field model", kind="config")
        if not self.config.base_url.startswith(("http://", "https://")):
            raise BackendError(f"base URL {self.config.base_url!r} must start with http:// or https://", kind="config")
        self.url = f"{self.config.base_url}/chat/completions"
        self._sleep = sleep
        self._rng = random.Random(self.config.seed)
        self._cache: dict[str, Reply] = {}
        self._lock = threading.Lock()

    def describe(self) -> dict:
        c = self.config
        return {"name": self.name, "url": self.url, "model": c.model, "api_key_env": c.api_key_env,
                "api_key_set": bool(c.api_key_env and os.environ.get(c.api_key_env)),
                "timeout_s": c.timeout_s, "max_retries": c.max_retries}

    # the three uses ------------------------------------------------------------------
    def solve(self, task: TaskRecord, skill: str, memory: str) -> Reply:
        return self.complete(prompts.solve_messages(task, skill, memory), "solve", self.config.max_tokens)

    def grade(self, task: TaskRecord, response: str) -> Reply:
        return self.complete(prompts.grade_messages(task, response), "grade", 256)

    def reflect(self, request: ReflectRequest) -> Reply:
        return self.complete(prompts.reflect_messages(request), "reflect", self.config.reflect_max_tokens)

    # the HTTP call ----------------------------------------------------------------------
    def complete(self, messages: list[dict], purpose: str, max_tokens: int) -> Reply:
        body = {"model": self.config.model, "messages": messages, "temperature": self.config.temperature,
                "max_tokens": max_tokens}
        key = hashlib.sha256(json.dumps(body, sort_keys=True).encode("utf-8")).hexdigest()
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            reply = Reply(hit.text, hit.prompt_tokens, hit.completion_tokens, cached=True)
            self.calls.record(purpose, reply)
            return reply
        data = json.dumps(body).encode("utf-8")
        attempts = 1 + max(0, self.config.max_retries)
        for attempt in range(1, attempts + 1):
            try:
                reply = self._post(data)
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

    def _headers(self) -> dict:
        h = {"Content-Type": "application/json", "Accept": "application/json"}
        key = os.environ.get(self.config.api_key_env, "") if self.config.api_key_env else ""
        if key:
            h["Authorization"] = f"Bearer {key}"
        return h

    def _post(self, data: bytes) -> Reply:
        req = urllib.request.Request(self.url, data=data, headers=self._headers(), method="POST")
        t = self.config.timeout_s
        try:
            with urllib.request.urlopen(req, timeout=t) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as e:
            raw = _read_quietly(e)
            self._raise_for_status(e.code, raw, e.headers)
            raise _Retry(f"HTTP {e.code}") from None  # 1xx/3xx oddities: treat as transient
        except TimeoutError:
            raise _Retry(f"request timed out after {t:g} s") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise _Retry(f"request timed out after {t:g} s") from None
            raise _Retry(f"connection to {self.url} failed ({e.reason})") from None
        except (ConnectionError, http.client.HTTPException, OSError) as e:
            raise _Retry(f"connection to {self.url} failed ({type(e).__name__}: {e})") from None
        if status >= 300:
            self._raise_for_status(status, raw, {})
        return self._parse(raw)

    def _raise_for_status(self, status: int, raw: bytes, headers) -> None:
        msg = _server_message(raw)
        if status in TRANSIENT_STATUS or status >= 500:
            retry_after = _retry_after(headers.get("Retry-After") if headers else None)
            raise _Retry(f"HTTP {status} from the server: {msg}", retry_after)
        env = self.config.api_key_env
        if status in (401, 403):
            key_note = (f"${env} is {'set' if os.environ.get(env) else 'not set'}" if env else "no API key is sent")
            raise BackendError(f"HTTP {status} from {self.url}: {msg} (authentication failed: check the API key; "
                               f"{key_note})", kind="auth")
        if status == 404:
            raise BackendError(f"HTTP 404 from {self.url}: {msg} (model {self.config.model!r} not found on the "
                               "server, or the base URL is wrong: it should end in /v1)", kind="not_found")
        raise BackendError(f"HTTP {status} from {self.url}: {msg} (the server refused the request; "
                           "retrying would not help)", kind="bad_request")

    def _parse(self, raw: bytes) -> Reply:
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise _Retry(f"the server's reply is not JSON: {raw[:120]!r}") from None
        try:
            choice = obj["choices"][0]
            text = choice["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise _Retry(f"the server's reply has no choices[0].message.content: {str(obj)[:160]}") from None
        if not isinstance(text, str) or not text.strip():
            reason = choice.get("finish_reason") if isinstance(choice, dict) else None
            raise _Retry(f"empty reply (finish_reason={reason!r})")
        usage = obj.get("usage") or {}
        pt, ct = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return Reply(text, int(pt) if isinstance(pt, int) else 0, int(ct) if isinstance(ct, int) else len(text) // 4)


class _Retry(Exception):
    def __init__(self, cause: str, retry_after: float | None = None) -> None:
        self.cause, self.retry_after = cause, retry_after
        super().__init__(cause)


def _read_quietly(e: urllib.error.HTTPError) -> bytes:
    try:
        return e.read()
    except Exception:  # noqa: BLE001 - the body is only for the message
        return b""


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
