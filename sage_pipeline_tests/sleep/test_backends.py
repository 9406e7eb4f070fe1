"""The OpenAI-compatible client against a real HTTP server on loopback: request, retries, deadlines, errors."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from sage_pipeline.sleep.backends import BackendError, OpenAIBackend, OpenAIConfig, Reply
from sage_pipeline_tests.sleep.conftest import ChatServer


def msgs(system: str = "s", user: str = "What is 2 + 2?") -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def backend(server, delays=None, **kw) -> OpenAIBackend:
    cfg = OpenAIConfig(base_url=server.base_url, model="m-test", api_key_env="SLEEP_TEST_KEY",
                       **{"max_retries": 4, "backoff_s": 0.5, "timeout_s": 5.0, **kw})
    return OpenAIBackend(cfg, sleep=(delays.append if delays is not None else lambda s: None))


def test_success_sends_the_request_and_counts_tokens(chat_server, monkeypatch):
    monkeypatch.setenv("SLEEP_TEST_KEY", "sk-test-123")
    chat_server.script = [("ok_usage", "4", 40, 2)]
    b = backend(chat_server)
    reply = b.complete(msgs("# skill"), "solve", 64)
    assert reply.text == "4" and (reply.prompt_tokens, reply.completion_tokens) == (40, 2)
    req = chat_server.requests[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer sk-test-123"
    assert req["body"]["model"] == "m-test" and req["body"]["temperature"] == 0.0
    assert req["body"]["messages"][0]["role"] == "system" and "# skill" in req["body"]["messages"][0]["content"]
    assert "What is 2 + 2?" in req["body"]["messages"][1]["content"]
    s = b.calls.summary()
    assert s["calls"] == 1 and s["total_tokens"] == 42 and s["retries"] == 0


def test_no_key_no_auth_header(chat_server, monkeypatch):
    monkeypatch.delenv("SLEEP_TEST_KEY", raising=False)
    backend(chat_server).complete(msgs("s"), "solve", 64)
    assert "Authorization" not in chat_server.requests[0]["headers"]


def test_429_is_retried_honouring_retry_after(chat_server):
    chat_server.script = [("status", 429, '{"error": {"message": "slow down"}}', {"Retry-After": "2"}), ("ok", "4")]
    delays: list[float] = []
    b = backend(chat_server, delays)
    assert b.complete(msgs("s"), "solve", 64).text == "4"
    assert delays == [2.0] and len(chat_server.requests) == 2
    assert b.calls.summary()["retries"] == 1
    assert "HTTP 429" in b.calls.errors[0]["error"] and "slow down" in b.calls.errors[0]["error"]
    assert b.calls.errors[0]["final"] is False


def test_5xx_backs_off_exponentially_then_succeeds(chat_server):
    chat_server.script = [("status", 500, "boom", {}), ("status", 503, "busy", {}), ("status", 502, "", {}),
                          ("ok", "4")]
    delays: list[float] = []
    b = backend(chat_server, delays)
    assert b.complete(msgs("s"), "solve", 64).text == "4"
    assert len(delays) == 3
    for i, d in enumerate(delays):  # base 0.5 s doubling, jitter in [50%, 100%]
        assert 0.5 * 2**i * 0.5 <= d <= 0.5 * 2**i + 1e-9


def test_persistent_5xx_ends_in_backend_error_with_cause(chat_server):
    chat_server.script = [("status", 500, '{"error": "internal"}', {})]
    b = backend(chat_server)
    with pytest.raises(BackendError) as ei:
        b.complete(msgs("s"), "solve", 64)
    e = ei.value
    assert e.kind == "transient" and e.attempts == 5 and e.purpose == "solve"
    assert "HTTP 500" in e.cause and "internal" in e.cause and "gave up after 5 attempts" in e.cause
    assert len(chat_server.requests) == 5
    assert [x["final"] for x in b.calls.errors] == [False] * 4 + [True]


def test_auth_failure_fails_fast(chat_server, monkeypatch):
    monkeypatch.setenv("SLEEP_TEST_KEY", "wrong")
    chat_server.script = [("status", 401, '{"error": {"message": "Incorrect API key"}}', {})]
    with pytest.raises(BackendError) as ei:
        backend(chat_server).complete(msgs("s"), "solve", 64)
    assert ei.value.kind == "auth" and len(chat_server.requests) == 1
    assert "Incorrect API key" in ei.value.cause and "$SLEEP_TEST_KEY is set" in ei.value.cause


def test_model_not_found_fails_fast(chat_server):
    chat_server.script = [("status", 404, '{"error": {"message": "The model `m-test` does not exist."}}', {})]
    with pytest.raises(BackendError) as ei:
        backend(chat_server).complete(msgs("s"), "solve", 64)
    assert ei.value.kind == "not_found" and len(chat_server.requests) == 1
    assert "m-test" in ei.value.cause and "does not exist" in ei.value.cause


def test_bad_request_fails_fast(chat_server):
    chat_server.script = [("status", 400, '{"error": {"message": "max_tokens is too large"}}', {})]
    with pytest.raises(BackendError) as ei:
        backend(chat_server).complete(msgs("s"), "solve", 64)
    assert ei.value.kind == "bad_request" and len(chat_server.requests) == 1


def test_empty_reply_is_retried_then_reported(chat_server):
    chat_server.script = [("ok", ""), ("ok", "   "), ("ok", "4")]
    b = backend(chat_server)
    assert b.complete(msgs("s"), "solve", 64).text == "4"
    assert b.calls.summary()["retries"] == 2 and "empty reply" in b.calls.errors[0]["error"]
    chat_server.requests.clear()
    chat_server.script = [("ok", "")]
    with pytest.raises(BackendError, match="empty reply"):
        backend(chat_server, max_retries=1).complete(msgs("other"), "solve", 64)
    assert len(chat_server.requests) == 2


def test_non_json_reply_is_retried_then_reported(chat_server):
    chat_server.script = [("raw", b"<html>502 Bad Gateway</html>")]
    with pytest.raises(BackendError, match="not JSON") as ei:
        backend(chat_server, max_retries=2).complete(msgs("s"), "solve", 64)
    assert ei.value.kind == "transient" and len(chat_server.requests) == 3


def test_timeout_is_retried_then_reported(chat_server):
    chat_server.script = [("sleep", 5.0, "late")]  # far past the 0.2 s deadline, however slow the client
    with pytest.raises(BackendError, match="timed out after 0.2 s"):
        backend(chat_server, timeout_s=0.2, max_retries=1).complete(msgs("s"), "solve", 64)
    assert len(chat_server.requests) == 2


def test_connection_refused_is_a_transient_backend_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    b = OpenAIBackend(OpenAIConfig(base_url=f"http://127.0.0.1:{port}/v1", model="m", max_retries=1),
                      sleep=lambda s: None)
    with pytest.raises(BackendError, match="connection to .* failed") as ei:
        b.complete(msgs("s"), "solve", 64)
    assert ei.value.kind == "transient" and ei.value.attempts == 2


def test_successes_are_cached_failures_never(chat_server):
    chat_server.script = [("status", 500, "down", {}), ("ok", "4")]
    b = backend(chat_server, max_retries=0)
    with pytest.raises(BackendError):
        b.complete(msgs("s"), "solve", 64)
    assert b.complete(msgs("s"), "solve", 64).text == "4"  # the failure was not cached: the server is asked again
    again = b.complete(msgs("s"), "solve", 64)
    assert again.cached and len(chat_server.requests) == 2
    assert b.calls.summary()["cache_hits"] == 1


def test_missing_model_or_bad_url_is_a_config_error(monkeypatch):
    monkeypatch.delenv("SAGE_SLEEP_MODEL", raising=False)
    with pytest.raises(BackendError, match="no model set") as ei:
        OpenAIBackend(OpenAIConfig(base_url="http://127.0.0.1:1/v1"))
    assert ei.value.kind == "config"
    with pytest.raises(BackendError, match="must start with http"):
        OpenAIBackend(OpenAIConfig(base_url="127.0.0.1:8000/v1", model="m"))


def test_env_gives_base_url_and_model(monkeypatch, chat_server):
    monkeypatch.setenv("SAGE_SLEEP_BASE_URL", chat_server.base_url + "/")
    monkeypatch.setenv("SAGE_SLEEP_MODEL", "from-env")
    b = OpenAIBackend(OpenAIConfig())
    assert b.url == chat_server.base_url + "/chat/completions"
    b.complete(msgs("s"), "solve", 64)
    assert chat_server.requests[0]["body"]["model"] == "from-env"


# deadlines: the whole request, not one socket read --------------------------------------------

# The trickles below last 30 s (each attempt's); a call cut by its 1.5 s deadline ends well within this
# bound even on a loaded machine, one without the deadline cannot.
TRICKLE_BOUND_S = 12.0


def _timed_failure(b: OpenAIBackend) -> tuple[BackendError, float]:
    t0 = time.monotonic()
    with pytest.raises(BackendError) as ei:
        b.complete(msgs("s"), "solve", 64)
    return ei.value, time.monotonic() - t0


def test_a_server_trickling_its_body_hits_the_deadline(chat_server):
    chat_server.script = [("trickle", 0.5, 60)]  # one byte every 0.5 s: each read is quick, the reply never ends
    e, took = _timed_failure(backend(chat_server, timeout_s=1.5, max_retries=0))
    # the trickle would last 30 s: well under that is the deadline at work (the bound is no race
    # with the machine's speed)
    assert took < TRICKLE_BOUND_S and e.kind == "transient" and e.purpose == "solve"
    assert "timed out after 1.5 s" in e.cause and "headers received" in e.cause


def test_a_server_that_never_finishes_its_headers_hits_the_deadline(chat_server):
    chat_server.script = [("trickle_headers", 0.5, 60)]
    e, took = _timed_failure(backend(chat_server, timeout_s=1.5, max_retries=0))
    assert took < TRICKLE_BOUND_S and e.kind == "transient"
    assert "timed out after 1.5 s" in e.cause and "no complete response headers" in e.cause


def test_each_retry_gets_its_own_deadline_and_the_call_stays_bounded(chat_server):
    chat_server.script = [("trickle", 0.2, 150)]  # 30 s per attempt without its deadline
    delays: list[float] = []
    b = backend(chat_server, delays, timeout_s=0.5, max_retries=2)
    e, took = _timed_failure(b)
    assert e.attempts == 3 and len(chat_server.requests) == 3 and len(delays) == 2
    # (max_retries + 1) * timeout_s = 1.5 s, far under one attempt's 30 s of trickle; the backoff
    # waits are recorded, not slept
    assert took < TRICKLE_BOUND_S
    assert [x["final"] for x in b.calls.errors] == [False, False, True]
    assert all("timed out after 0.5 s" in x["error"] for x in b.calls.errors)


def _self_signed_cert(tmp_path) -> tuple[Path, Path]:
    """A certificate and key for 127.0.0.1, valid for a day (made in-process)."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    cert_path, key_path = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return cert_path, key_path


def test_the_deadline_holds_over_https_too(tmp_path, monkeypatch):
    cert, key = _self_signed_cert(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    server = ChatServer(tls=(str(cert), str(key)))
    try:
        assert server.base_url.startswith("https://")
        server.script = [("ok", "4"), ("trickle", 0.5, 60)]
        b = backend(server, timeout_s=1.5, max_retries=0)
        assert b.complete(msgs("s"), "solve", 64).text == "4"
        e, took = _timed_failure(b.__class__(b.config, sleep=lambda s: None))
        assert took < TRICKLE_BOUND_S and "timed out after 1.5 s" in e.cause
    finally:
        server.close()


def test_a_timeout_that_is_not_positive_is_a_config_error(chat_server):
    for bad in (0, -1.0, float("nan"), float("inf")):
        with pytest.raises(BackendError, match="positive number of seconds") as ei:
            backend(chat_server, timeout_s=bad)
        assert ei.value.kind == "config"


# replies of the wrong shape ----------------------------------------------------------------------

OK_CHOICES = [{"index": 0, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}]


@pytest.mark.parametrize("action,reason", [
    (("json", {"choices": OK_CHOICES, "usage": 5}), "'usage' is an integer 5, expected an object"),
    (("json", {"choices": OK_CHOICES, "usage": {"prompt_tokens": "12"}}),
     "usage.prompt_tokens is a string \"12\", expected a non-negative integer"),
    (("json", {"id": "x", "usage": {}}), "no 'choices' field"),
    (("json", {"error": {"message": "model overloaded"}}), "no 'choices' field; its error field says"),
    (("json", {"choices": []}), "'choices' is an empty list"),
    (("json", {"choices": {"0": OK_CHOICES[0]}}), "'choices' is an object"),
    (("json", {"choices": [{"message": {"content": ["4"]}}]}),
     "choices[0].message.content is a list [\"4\"], expected a string"),
    (("json", {"choices": [{"message": {"content": 4}}]}), "choices[0].message.content is an integer 4"),
    (("json", {"choices": [{"message": "4"}]}), "choices[0].message is a string"),
    (("json", [OK_CHOICES]), "the reply is a list"),
    (("raw", b"<html>502 Bad Gateway</html>"), "not JSON: Expecting value at line 1 column 1 (Content-Type text/html)"),
    (("raw", b"[" * 100_000), "nested too deeply"),
], ids=["usage-int", "usage-field-str", "no-choices", "error-object", "empty-choices", "choices-object",
        "content-list", "content-int", "message-str", "top-level-list", "html", "deep-nesting"])
def test_a_malformed_reply_is_a_backend_error_that_says_what_was_wrong(chat_server, action, reason):
    chat_server.script = [action]
    with pytest.raises(BackendError) as ei:
        backend(chat_server, max_retries=1).complete(msgs("s"), "solve", 64)
    e = ei.value
    assert reason in e.cause, e.cause
    assert e.kind == "transient" and e.attempts == 2 and len(chat_server.requests) == 2


def test_usage_absent_or_null_is_fine(chat_server):
    chat_server.script = [("json", {"choices": OK_CHOICES}), ("json", {"choices": OK_CHOICES, "usage": None})]
    b = backend(chat_server)
    assert b.complete(msgs("a"), "solve", 64) == Reply("4", 0, 0)
    assert b.complete(msgs("b"), "solve", 64) == Reply("4", 0, 0)
