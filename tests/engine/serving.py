"""Running `kwker serve`'s app on 127.0.0.1 inside the test process (so a test can look at the
engine too), and reading its /metrics."""

import json
import socket
import threading
import time
from contextlib import contextmanager

import httpx
from prometheus_client.parser import text_string_to_metric_families

from kwker.serve import ServingObserver


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running(app, **config):
    """Serves the ASGI app on a free loopback port, as `kwker serve` does (its connection guard;
    `config`: more of uvicorn.Config's); yields its base URL (no /v1)."""
    import uvicorn

    from kwker.serve.connections import guarded_protocol

    port = free_port()
    config = {"http": guarded_protocol(), **config}
    server = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", **config
        )
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join()


def metrics(url: str, headers=None) -> dict[tuple, float]:
    """/metrics as {(sample name, (label, value), ...): value}."""
    text = httpx.get(f"{url}/metrics", headers=headers or {}).text
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def wait_idle(engine, timeout: float = 10.0) -> None:
    """Waits until no request holds a slot or waits for one."""
    end = time.monotonic() + timeout
    while engine.active or engine.waiting:
        assert time.monotonic() < end, (engine.active, engine.waiting)
        time.sleep(0.01)


class Slow(ServingObserver):
    """Delegates to the engine's observer (the metrics) and sleeps after every step, so that a
    tiny model's answer lasts long enough to be cut mid-way."""

    def __init__(self, inner: ServingObserver, seconds: float):
        self.inner, self.seconds = inner, seconds

    def step(self, seconds, sequences):
        self.inner.step(seconds, sequences)
        time.sleep(self.seconds)

    def ended(self, req):
        self.inner.ended(req)


def never_reading_client(url: str, body: dict, key: str | None = None) -> socket.socket:
    """A stream asked for on a raw socket with a small receive buffer, and never read: its answer
    fills the socket's buffers and then waits on the server. Close it to end it."""
    port = int(url.rsplit(":", 1)[1])
    raw = json.dumps(body | {"stream": True})
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(
        (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{auth}"
         f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n{raw}").encode()
    )  # fmt: skip
    return s
