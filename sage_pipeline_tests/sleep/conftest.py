"""A real OpenAI-compatible HTTP server on loopback, scripted per test, and small helpers."""

from __future__ import annotations

import json
import ssl
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class ChatServer:
    """Answers POST /v1/chat/completions from a script of actions; the last action repeats.

    Actions: ("ok", text) | ("ok_usage", text, prompt_tokens, completion_tokens) |
    ("status", code, body, headers) | ("raw", bytes) | ("json", object) | ("sleep", seconds, text) |
    ("fn", body -> text) | ("trickle", seconds, n) | ("trickle_headers", seconds, n).

    The trickles send one byte every ``seconds``, at most ``n`` bytes, then hang up: "trickle"
    after complete headers promising a longer body, "trickle_headers" never finishing the headers.
    They stop early when the client hangs up or the server closes. ``tls=(cert, key)`` serves HTTPS.
    """

    def __init__(self, tls: tuple[str, str] | None = None) -> None:
        self.script: list[tuple] = [("ok", "hello")]
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        self.stop = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep pytest output clean
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with server._lock:
                    server.requests.append({"path": self.path, "headers": dict(self.headers),
                                            "body": json.loads(body or b"{}")})
                    n = len(server.requests)
                    action = server.script[min(n, len(server.script)) - 1]
                kind = action[0]
                if kind == "fn":  # a tiny model: the reply is a function of the request
                    action = ("ok", action[1](json.loads(body)))
                    kind = "ok"
                if kind == "sleep":
                    time.sleep(action[1])
                    action = ("ok", action[2])
                    kind = "ok"
                if kind in ("ok", "ok_usage"):
                    usage = ({"prompt_tokens": action[2], "completion_tokens": action[3]}
                             if kind == "ok_usage" else {"prompt_tokens": 11, "completion_tokens": 3})
                    payload = json.dumps({"id": "x", "object": "chat.completion", "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": action[1]},
                         "finish_reason": "stop"}], "usage": usage}).encode()
                    self._send(200, payload, {"Content-Type": "application/json"})
                elif kind == "status":
                    _, code, body_, headers = action
                    self._send(code, body_.encode() if isinstance(body_, str) else body_, headers)
                elif kind == "raw":
                    self._send(200, action[1], {"Content-Type": "text/html"})
                elif kind == "json":
                    self._send(200, json.dumps(action[1]).encode(), {"Content-Type": "application/json"})
                elif kind == "trickle":
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", "1000")
                    self.end_headers()
                    self._trickle(b'{"choices": [{"message": {"content": "' + b"x" * 1000, action[1], action[2])
                elif kind == "trickle_headers":
                    self._trickle(b"HTTP/1.1 200 OK\r\nX-Slow: " + b"y" * 1000, action[1], action[2])

            def _trickle(self, data, seconds, n):
                for byte in data[:n]:  # bounded: n bytes, n * seconds
                    try:
                        self.wfile.write(bytes([byte]))
                    except OSError:
                        return  # the client gave up: what the test wants
                    if server.stop.wait(seconds):
                        return
                self.close_connection = True

            def _send(self, code, payload, headers):
                try:
                    self.send_response(code)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.scheme = "http"
        if tls is not None:
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(*tls)
            self.httpd.socket = ctx.wrap_socket(self.httpd.socket, server_side=True)
            self.scheme = "https"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def chat_server():
    s = ChatServer()
    yield s
    s.close()
