"""The Ollama client against a fake Ollama on loopback: the request SAGE's agents send (``ollama.chat(model,
messages, options={"temperature": t})`` as the ``ollama`` 0.6 client puts it on the wire), the reply read as SAGE
reads it, and the errors (model not pulled, 5xx retried, malformed and empty replies, no server, bad host)."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sage_pipeline.sleep.backends import BackendError, OllamaBackend, OllamaConfig, ollama_host

# What SAGE's venv's ollama client sends for chat(model="m", messages=[system, user], options={"temperature": 0.1})
# (ChatRequest(...).model_dump(exclude_none=True), read off ollama 0.6.3): the body the client must match.
SAGE_BODY = {"model": "m", "stream": False, "options": {"temperature": 0.1},
             "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}], "tools": []}
MSGS = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]


class FakeOllama:
    """POST /api/chat answered from a script (the last action repeats): ("ok", text, prompt_eval, eval) |
    ("status", code, body) | ("json", obj)."""

    def __init__(self) -> None:
        self.script: list[tuple] = [("ok", "hello", 7, 3)]
        self.requests: list[dict] = []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                me.requests.append({"path": self.path, "headers": dict(self.headers), "body": json.loads(raw)})
                action = me.script[min(len(me.requests), len(me.script)) - 1]
                if action[0] == "ok":
                    code, obj = 200, {"model": "m", "created_at": "2026-12-02T00:00:00Z", "done": True,
                                      "done_reason": "stop", "message": {"role": "assistant", "content": action[1]},
                                      "prompt_eval_count": action[2], "eval_count": action[3]}
                elif action[0] == "status":
                    code, obj = action[1], action[2]
                else:
                    code, obj = 200, action[1]
                payload = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    @property
    def host(self) -> str:  # as a user writes $OLLAMA_HOST
        return f"127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def ollama():
    s = FakeOllama()
    yield s
    s.close()


def client(server: FakeOllama, **kw) -> OllamaBackend:
    cfg = OllamaConfig(host=server.host, model="m", **{"max_retries": 2, "backoff_s": 0.01, "timeout_s": 5.0, **kw})
    return OllamaBackend(cfg, sleep=lambda s: None)


def test_the_request_is_the_one_sage_sends_and_the_reply_is_read_as_sage_reads_it(ollama):
    ollama.script = [("ok", '{"file": "m.py", "patch": "x = 1"}', 41, 9)]
    b = client(ollama, temperature=0.1)
    reply = b.complete(MSGS, "solve", 1024)
    req = ollama.requests[0]
    assert req["path"] == "/api/chat" and req["body"] == SAGE_BODY  # no num_predict: SAGE sends none
    assert req["headers"]["Content-Type"] == "application/json"
    assert reply.text == '{"file": "m.py", "patch": "x = 1"}' and (reply.prompt_tokens, reply.completion_tokens) == (
        41, 9)
    assert b.url == f"http://{ollama.host}/api/chat" and b.describe()["name"] == "ollama"
    assert b.calls.summary()["calls"] == 1 and b.draws_fresh  # temperature 0.1: a fresh draw per call


def test_the_host_is_read_as_the_ollama_client_reads_ollama_host(monkeypatch):
    monkeypatch.setenv("OLLAMA_HOST", "10.0.0.5")
    monkeypatch.setenv("SAGE_SLEEP_MODEL", "qwen2.5-coder:7b")
    b = OllamaBackend()
    assert b.url == "http://10.0.0.5:11434/api/chat" and b.config.model == "qwen2.5-coder:7b"
    assert ollama_host("") == "http://127.0.0.1:11434" and ollama_host(":56789") == "http://127.0.0.1:56789"
    assert ollama_host("https://example.com") == "https://example.com:443"
    assert ollama_host("example.com:56789/path/") == "http://example.com:56789/path"
    with pytest.raises(BackendError, match="port is not a number"):
        ollama_host("example.com:99999999")


def test_no_model_is_a_config_error(monkeypatch):
    monkeypatch.delenv("SAGE_SLEEP_MODEL", raising=False)
    with pytest.raises(BackendError, match=r"no model set for the ollama backend: set \$SAGE_SLEEP_MODEL") as ei:
        OllamaBackend(OllamaConfig(host="127.0.0.1:1"))
    assert ei.value.kind == "config"


def test_a_model_not_pulled_fails_at_once_saying_so(ollama):
    ollama.script = [("status", 404, {"error": "model 'm' not found"})]
    with pytest.raises(BackendError) as ei:
        client(ollama).complete(MSGS, "solve", 64)
    e = ei.value
    assert e.kind == "not_found" and "model 'm' not found" in e.cause and "ollama pull" in e.cause
    assert len(ollama.requests) == 1


def test_a_5xx_is_retried_then_the_reply_is_used_and_persistent_ones_end_in_a_backend_error(ollama):
    ollama.script = [("status", 503, {"error": "server busy"}), ("ok", "fine", 1, 1)]
    b = client(ollama)
    assert b.complete(MSGS, "solve", 64).text == "fine" and b.calls.summary()["retries"] == 1
    ollama.requests.clear()
    ollama.script = [("status", 500, {"error": "llama runner process has terminated"})]
    with pytest.raises(BackendError) as ei:
        client(ollama).complete(MSGS + [{"role": "user", "content": "again"}], "reflect", 64)
    assert ei.value.kind == "transient" and ei.value.attempts == 3 and "llama runner process" in ei.value.cause
    assert ei.value.purpose == "reflect" and len(ollama.requests) == 3


@pytest.mark.parametrize("obj,reason", [
    ({"done": True}, "no 'message' field"),
    ({"error": "boom"}, "its error field says: boom"),
    ({"message": "text"}, "'message' is a string"),
    ({"message": {"content": 5}}, "message.content is an integer"),
    ({"message": {"content": "x"}, "eval_count": -1}, "eval_count is an integer -1"),
    ([1, 2], "the reply is a list"),
])
def test_a_malformed_reply_is_retried_then_says_what_was_wrong(ollama, obj, reason):
    ollama.script = [("json", obj)]
    with pytest.raises(BackendError) as ei:
        client(ollama, max_retries=1).complete(MSGS, "solve", 64)
    assert reason in ei.value.cause and "Ollama's /api/chat reply" in ei.value.cause
    assert len(ollama.requests) == 2


def test_an_empty_reply_is_retried_and_a_cached_success_costs_no_call(ollama):
    ollama.script = [("ok", "  ", 1, 0), ("ok", "def f(): pass", 3, 2)]
    b = client(ollama)
    assert b.complete(MSGS, "solve", 64).text == "def f(): pass"
    assert "empty reply" in b.calls.errors[0]["error"]
    again = b.complete(MSGS, "solve", 64)
    assert again.cached and len(ollama.requests) == 2


def test_no_ollama_listening_is_a_transient_error_naming_ollama_host():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = OllamaBackend(OllamaConfig(host=f"127.0.0.1:{port}", model="m", max_retries=1, backoff_s=0.0),
                      sleep=lambda s: None)
    with pytest.raises(BackendError) as ei:
        b.complete(MSGS, "solve", 64)
    assert ei.value.kind == "transient" and "is Ollama running there?" in ei.value.cause
    assert "OLLAMA_HOST" in ei.value.cause


def test_sages_own_ollama_call_sends_what_this_client_sends(ollama, sage_python, monkeypatch):
    """The contract: SAGE's ``chat_with_timeout`` (``sage.llm.ollama_safe``, the one door of every agent's call), run
    in SAGE's venv against the same fake Ollama, posts to the same path the same body as this client, and reads the
    content this client reads."""
    import subprocess

    ollama.script = [("ok", "the same reply", 5, 2)]
    code = ("import json, sys; from sage.llm.ollama_safe import chat_with_timeout as c; "
            "r = c(model='m', messages=json.loads(sys.argv[1]), options={'temperature': 0.1}); "
            "print(json.dumps(r['message']['content']))")
    out = subprocess.run([sage_python, "-c", code, json.dumps(MSGS)], capture_output=True, text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "OLLAMA_HOST": ollama.host, "SAGE_DISABLE_OLLAMA_SPINNER": "1",
                              "HOME": "/tmp"})
    assert out.returncode == 0, out.stderr[-2000:]
    sage_req = ollama.requests[-1]
    mine = client(ollama, temperature=0.1)
    reply = mine.complete(MSGS, "solve", 1024)
    assert ollama.requests[-1]["path"] == sage_req["path"] == "/api/chat"
    assert ollama.requests[-1]["body"] == sage_req["body"] == SAGE_BODY
    assert json.loads(out.stdout.strip().splitlines()[-1]) == reply.text == "the same reply"


@pytest.mark.slow  # builds a model world and serves it (about 3.5 s)
def test_the_model_worlds_ollama_route_answers_the_nights_own_calls_through_the_ollama_client():
    """The contract on the route SAGE uses: the model world's /api/chat (what SAGE's agents call in the world)
    answers the night's coder replay and reflect through this client, as it answers SAGE."""
    from pathlib import Path

    from sage_pipeline.sage import skills as sk
    from sage_pipeline.sage_world.server import WorldServer
    from sage_pipeline.sage_world.skills_world import PLANTED_INSTRUCTION, SkillsWorldConfig
    from sage_pipeline.sage_world.world import ModelWorld, WorldConfig, build_world
    from sage_pipeline.sleep.prompts import parse_reflect_reply, reflect_messages
    from sage_pipeline.sleep.records import ReflectRequest

    table = Path(__file__).resolve().parents[1] / "routing" / "fixtures" / "sage_journal" / "models.yaml"
    base = build_world(table, n_tasks=24, task_seed=3, config=WorldConfig(clock_scale=0.0))
    world = ModelWorld(base.sim, base.table, WorldConfig(seed=0, clock_scale=0.0),
                       skills=SkillsWorldConfig(mode="planted", reflect_propose=1.0))
    tdd = "discipline/test-driven-development/SKILL.md"
    req = ReflectRequest(skill_name="SAGE's coder", documents={tdd: sk.read_skill(sk.SKILL_TREE / tdd)},
                         blocks={tdd: ()}, failures=[], successes=[], edit_budget=4, block_max_chars=2000,
                         max_rule_chars=300, room={tdd: 1900})
    with WorldServer(world) as srv:
        b = OllamaBackend(OllamaConfig(host=srv.url, model="sleep", max_retries=0), sleep=lambda s: None)
        got = b.complete(reflect_messages(req), "reflect", 2048)
    assert b.url.endswith("/api/chat")
    assert PLANTED_INSTRUCTION in {e.content for e in parse_reflect_reply(got.text)}
    assert got.prompt_tokens > 0 and got.completion_tokens > 0  # the world's prompt_eval_count / eval_count
