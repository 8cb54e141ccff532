"""Connections that cannot hold the server: uvicorn's h11 protocol with a deadline for a request's
head and a cap on open connections (uvicorn has neither: 300 half-open connections were held
for good, and under a file descriptor limit keyed clients then timed out).

- A request's head (its request line and headers) must arrive within HEAD_TIMEOUT_S of the
  connection being opened or of the previous response; else the connection is closed.
- At most max_connections are open. A connection past the cap closes the oldest one still
  waiting for its head (a slow or idle client), or itself if none is: a client that has sent its
  request is never dropped for a newcomer.
- The body's deadline is the Guard's (kwker.serve.security), which answers 408.
- Closings are logged at most once per LOG_EVERY_S, as a count."""

from __future__ import annotations

import logging
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

HEAD_TIMEOUT_S = 10.0
DEFAULT_MAX_CONNECTIONS = 512
LOG_EVERY_S = 10.0

log = logging.getLogger("kwker.serve")


class _Closings:
    """Counts closed connections and says so in one log line per LOG_EVERY_S."""

    def __init__(self):
        self.counts: dict[str, int] = {}
        self.logged_at = 0.0

    def add(self, why: str) -> None:
        self.counts[why] = self.counts.get(why, 0) + 1
        now = time.monotonic()
        if now - self.logged_at >= LOG_EVERY_S:
            said = ", ".join(f"{n} {why}" for why, n in self.counts.items())
            log.warning("closed connections: %s", said)
            self.counts, self.logged_at = {}, now


def guarded_protocol(max_connections: int = DEFAULT_MAX_CONNECTIONS,
                     head_timeout_s: float = HEAD_TIMEOUT_S) -> type[H11Protocol]:  # fmt: skip
    """The protocol class to give uvicorn.Config(http=...)."""
    closings = _Closings()

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.opened_at = time.monotonic()
            self.head_timer = None
            self._arm()
            if len(self.connections) > max_connections:
                waiting = [c for c in self.connections if c._waiting_for_head()]
                oldest = min(waiting, key=lambda c: c.opened_at)  # self waits: never empty
                oldest._close("over the connection cap")

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if not self._waiting_for_head():
                self._disarm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()  # the next request's head gets its own deadline

        def connection_lost(self, exc) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _waiting_for_head(self) -> bool:
            return self.conn.their_state is h11.IDLE and not self.transport.is_closing()

        def _arm(self) -> None:
            self._disarm()
            self.head_timer = self.loop.call_later(head_timeout_s, self._head_late)

        def _disarm(self) -> None:
            if getattr(self, "head_timer", None) is not None:
                self.head_timer.cancel()
                self.head_timer = None

        def _head_late(self) -> None:
            self.head_timer = None
            if self._waiting_for_head():
                self._close("without a request head in time")

        def _close(self, why: str) -> None:
            closings.add(why)
            self._disarm()
            self.transport.close()

    return GuardedH11Protocol
