"""No slowloris: half-open connections cannot hold `kwker serve` (kwker.serve.connections for the
request head's deadline and the connection cap, the Guard for the body's deadline)."""

import logging
import socket
import time

import httpx
import pytest
from helpers import tiny_llama
from serving import running

from kwker.hf import KwkDecoder
from kwker.serve import ServingEngine, create_app, security
from kwker.serve.connections import guarded_protocol

KEY = "sekret"
HALF_OPEN = 300


@pytest.fixture(scope="module")
def engine():
    model = tiny_llama(seed=11, vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)
    with ServingEngine(KwkDecoder(model, max_cache_len=256, max_batch=2)) as engine:
        yield engine


def half_open(url: str, n: int) -> list[socket.socket]:
    """n connections that send part of a request's head and then nothing."""
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
        socks.append(s)
    return socks


def closed_by_server(s: socket.socket, timeout: float) -> bool:
    """Whether the server closed s within timeout: an end of file, or a reset (a connection closed
    before the server read what it had sent)."""
    s.settimeout(timeout)
    try:
        return s.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_half_open_connections_are_closed_while_a_keyed_client_is_served(engine, caplog):
    app = create_app(engine, "tiny", api_key=KEY)
    guard = guarded_protocol(max_connections=100, head_timeout_s=1.5)
    with caplog.at_level(logging.WARNING, "kwker.serve"), running(app, http=guard) as url:
        socks = half_open(url, HALF_OPEN)
        t0 = time.monotonic()
        r = httpx.post(
            f"{url}/v1/completions",
            headers={"Authorization": f"Bearer {KEY}"},
            json={"model": "tiny", "prompt": [5, 9, 33], "max_tokens": 4},
            timeout=30,
        )
        served_s = time.monotonic() - t0
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        # the cap closed the oldest 200 at once; the head's deadline, the rest
        assert sum(closed_by_server(s, 5.0) for s in socks) == HALF_OPEN
        for s in socks:
            s.close()
    assert served_s < 1.5  # served before any deadline passed: not after the slow ones left
    lines = [r for r in caplog.records if r.name == "kwker.serve"]
    assert 1 <= len(lines) <= 2, [r.getMessage() for r in lines]  # a count, not a line each


def test_a_body_that_does_not_arrive_gets_408(engine, monkeypatch):
    monkeypatch.setattr(security, "BODY_TIMEOUT_S", 1.0)
    app = create_app(engine, "tiny", api_key=KEY)
    with running(app) as url:
        host, port = url.removeprefix("http://").split(":")
        s = socket.create_connection((host, int(port)))
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sekret\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"model"'
        )
        s.settimeout(10)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
        s.close()
    assert reply.startswith(b"HTTP/1.1 408 ") and b"request_timeout" in reply
