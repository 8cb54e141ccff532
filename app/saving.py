"""Writing the streamed answer to the store without ever stalling or failing the window.

A write the store refuses (another process holds the lock, the disk is full, the folder became
read-only) is kept here, not lost: the window keeps showing the text, the latest state of each
message waits in `pending`, and `flush` (on the next token, and from the window's retry timer)
writes it once the store takes it again. One failure is logged once, not once a token.
"""

from __future__ import annotations

import logging
import sqlite3
import time

log = logging.getLogger(__name__)

RETRY_S = 2.0  # after a refused write, per-token writes wait this long before trying again


class AnswerWriter:
    def __init__(self, store):
        self.store = store
        self.pending: dict[int, dict] = {}  # message id -> the fields to write (the latest)
        self.error = ""  # why the latest write failed ("" once everything is written)
        self._next_try = 0.0

    def write(self, mid: int, content: str, now: bool = False, **fields) -> bool:
        """Saves message `mid`'s latest state (fields: update_message's); now: try at once even
        within RETRY_S of a failure (an answer's end). Whether everything pending is written."""
        self.pending[mid] = {**self.pending.get(mid, {}), "content": content, **fields}
        if not now and time.monotonic() < self._next_try:
            return False
        return self.flush()

    def flush(self) -> bool:
        for mid, fields in list(self.pending.items()):
            try:
                self.store.update_message(mid, **fields)
            except sqlite3.Error as e:
                if str(e) != self.error:
                    log.warning("could not save message %s: %s", mid, e)
                self.error, self._next_try = str(e), time.monotonic() + RETRY_S
                return False
            del self.pending[mid]
        if self.error:
            log.info("saved what had waited (%s)", self.error)
        self.error = ""
        return True
