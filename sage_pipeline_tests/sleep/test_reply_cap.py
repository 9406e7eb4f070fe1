"""Issue 35: every reply of both chat clients (Ollama's /api/chat, OpenAI-compatible) is capped
(``max_reply_bytes``, default 4 MiB).

A server answering 50 MB (chunked, or with its Content-Length, or as an error body) ends the call
with a ``too_large`` BackendError naming the cap, and the night ``backend_error``; the read stops at
the cap, so the memory the call takes stays bounded (measured in a child process: its peak RSS)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sage_pipeline.sleep.backends import (
    DEFAULT_MAX_REPLY_BYTES,
    BackendError,
    OllamaBackend,
    OllamaConfig,
    OpenAIBackend,
    OpenAIConfig,
)
from sage_pipeline.sleep.sage_night import SageNightConfig, run_sage_night
from sage_pipeline.sleep.sage_skills import SageSkillsRoot
from sage_pipeline_tests.sleep.test_sage_night import TASKS, Judge

MSGS = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2 + 2?"}]
BIG = 50 * 1000 * 1000  # 50 MB of reply content
_BLOCK = b"x" * (1 << 16)


class BigServer:
    """Answers every POST with a chat completion whose content is ``size`` bytes, streamed in 64 KiB
    writes: ``mode`` "chunked" (no Content-Length), "length" (Content-Length given) or "error" (a 500
    with a body of that size). Counts the bytes it managed to send."""

    def __init__(self, size: int = BIG, mode: str = "chunked") -> None:
        self.size, self.mode, self.sent, self.requests = size, mode, 0, 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                server.requests += 1
                head = b'{"choices": [{"index": 0, "message": {"role": "assistant", "content": "'
                tail = b'"}, "finish_reason": "stop"}]}'
                total = len(head) + server.size + len(tail)
                self.send_response(500 if server.mode == "error" else 200)
                self.send_header("Content-Type", "application/json")
                chunked = server.mode == "chunked"
                if chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(total))
                self.send_header("Connection", "close")
                self.end_headers()

                def write(data: bytes) -> None:
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
                    server.sent += len(data)
                try:
                    write(head)
                    left = server.size
                    while left > 0:
                        piece = _BLOCK[:min(left, len(_BLOCK))]
                        write(piece)
                        left -= len(piece)
                    write(tail)
                    if chunked:
                        self.wfile.write(b"0\r\n\r\n")
                except OSError:
                    pass  # the client stopped reading: what the cap does
                self.close_connection = True

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def big_server(request):
    s = BigServer(mode=getattr(request, "param", "chunked"))
    yield s
    s.close()


def _backend(url: str, client: str = "openai", **kw) -> OpenAIBackend | OllamaBackend:
    kw = {"model": "m", "max_retries": 3, "timeout_s": 60.0, **kw}
    if client == "ollama":
        return OllamaBackend(OllamaConfig(host=url.removesuffix("/v1"), **kw), sleep=lambda s: None)
    return OpenAIBackend(OpenAIConfig(base_url=url, **kw), sleep=lambda s: None)


def test_the_default_cap_is_a_few_mib_and_configurable():
    assert OpenAIConfig().max_reply_bytes == DEFAULT_MAX_REPLY_BYTES == 4 << 20
    assert OpenAIConfig(max_reply_bytes=1 << 20).max_reply_bytes == 1 << 20
    with pytest.raises(ValueError, match="max_reply_bytes"):
        OpenAIConfig(max_reply_bytes=0)


@pytest.mark.parametrize("client", ["openai", "ollama"])
@pytest.mark.parametrize("big_server", ["chunked", "length", "error"], indirect=True)
def test_a_50_mb_reply_is_cut_at_the_cap_and_fails_at_once_naming_it(big_server, client):
    b = _backend(big_server.base_url, client)
    with pytest.raises(BackendError) as err:
        b.complete(MSGS, "solve", 64)
    e = err.value
    assert e.kind == "too_large" and e.purpose == "solve"
    assert f"larger than max_reply_bytes={4 << 20} (4 MiB" in e.cause and f"raise the {client} backend's" in e.cause
    assert big_server.requests == 1  # never retried: the same server would answer the same
    assert b.calls.summary()["errors"] == 1


def test_a_reply_under_the_cap_is_read_whole(big_server):
    big_server.size = 3 * 1000 * 1000
    reply = _backend(big_server.base_url).complete(MSGS, "solve", 64)
    assert len(reply.text) == 3 * 1000 * 1000


def test_a_50_mb_reply_ends_the_night_in_backend_error_naming_the_cap(tmp_path, big_server):
    root = SageSkillsRoot(tmp_path / "skills")
    backend = _backend(big_server.base_url, "ollama", max_retries=1)
    r = run_sage_night(root, TASKS, backend, Judge(), SageNightConfig(decisions="per_night"), date="2026-11-03")
    assert r.status == "backend_error" and "max_reply_bytes=4194304" in r.cause, (r.status, r.cause)
    diag = json.loads(open(r.diagnostics).read())
    assert diag["status"] == "backend_error" and "max_reply_bytes" in diag["cause"]
    assert root.versions()[-1].version == root.live() and len(root.versions()) == 1  # nothing committed


_PEAK = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from sage_pipeline.sleep.backends import BackendError, OpenAIBackend, OpenAIConfig

    def peak_kib():  # VmHWM: the peak RSS since the last reset (Linux), else the peak since start
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss

    b = OpenAIBackend(OpenAIConfig(base_url=sys.argv[1], model="m", max_retries=0, timeout_s=60.0),
                      sleep=lambda s: None)
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset the peak to the RSS now
    except OSError:
        pass
    before = peak_kib()
    try:
        b.complete([{"role": "user", "content": "What is 2 + 2?"}], "solve", 64)
        outcome = "ok"
    except BackendError as e:
        outcome = e.kind
    after = peak_kib()
    print(json.dumps({"before_kib": before, "after_kib": after, "outcome": outcome}))
""")


@pytest.mark.slow  # over 0.6 s: out of make test-fast (issue 35)
def test_a_50_mb_reply_costs_bounded_memory(big_server):
    """Peak RSS of a process making the call, before and after it (Linux: KiB)."""
    out = subprocess.run([sys.executable, "-c", _PEAK, big_server.base_url], capture_output=True, text=True,
                         timeout=120, check=True)
    m = json.loads(out.stdout.strip().splitlines()[-1])
    grown_mib = (m["after_kib"] - m["before_kib"]) / 1024
    print(f"peak RSS before the call {m['before_kib'] / 1024:.1f} MiB, after {m['after_kib'] / 1024:.1f} MiB "
          f"(+{grown_mib:.1f} MiB); the server sent {big_server.sent / 1e6:.1f} MB of {BIG / 1e6:.0f} MB")
    assert m["outcome"] == "too_large"
    assert grown_mib < 32, m  # the cap is 4 MiB; reading the whole 50 MB would take 100+ MiB
