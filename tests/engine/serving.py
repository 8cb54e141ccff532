"""Running `kwker serve`'s app on 127.0.0.1 inside the test process (so a test can look at the
engine too), and reading its /metrics."""

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
def running(app):
    """Serves the ASGI app on a free loopback port; yields its base URL (no /v1)."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
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
