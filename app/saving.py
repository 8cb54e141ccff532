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


class StreamingAnswer:
    """The answer being written: its conversation and message, the messages it was asked from
    (their ids: the worker's rolling window indexes them), its text so far with the runs that
    came from speculation (kwker.app.render.add_run), a thinking model's thinking, its tool calls
    (kwker.app.tool_calls) and its latest figures. It is saved as it arrives, through an
    AnswerWriter."""

    def __init__(self, store):
        self.store = store
        self.writer = AnswerWriter(store)
        self.cid: int | None = None
        self.mid: int | None = None  # None: no answer is being written
        self.last_mid: int | None = None  # the answer written last (once it ended)
        self.history_ids: list[int] = []
        self.text = ""
        self.thinking = ""
        self.runs: list = []
        self.tool_calls: list[dict] = []
        self.stats: dict = {}

    def start(self, cid: int, history_ids: list[int], continued=None) -> None:
        """A new answer in conversation cid, or `continued`: a cut answer the model goes on
        writing. Raises sqlite3.Error when the store refuses the new message."""
        self.cid, self.history_ids, self.stats = cid, history_ids, {}
        if continued is not None:
            self.mid, self.text, self.runs = (
                continued.id,
                continued.content,
                list(continued.sources),
            )
            self.thinking = continued.thinking
            self.tool_calls = [dict(c) for c in continued.tool_calls]
            self.writer.write(self.mid, self.text, complete=False)
        else:
            self.mid = self.store.add_message(cid, "assistant", "", complete=False).id
            self.text, self.runs, self.thinking, self.tool_calls = "", [], "", []

    def add(self, text: str, source: str, stats: dict) -> None:
        """A streamed piece: saved with which of the answer came from speculation."""
        from kwker.app.render import add_run

        self.text += text
        add_run(self.runs, text, source)
        if stats:
            self.stats = stats
        self.writer.write(self.mid, self.text, sources=self.runs)

    def add_thinking(self, text: str) -> None:
        """A streamed piece of the thinking before the answer, saved apart from its text."""
        self.thinking += text
        self.writer.write(self.mid, self.text, thinking=self.thinking)

    def set_tool_call(self, call: dict) -> None:
        """A tool call as it goes (asked, running, ended), by its id: saved at once, since the
        user waited for it and its result cannot be had again for free."""
        ids = [c["id"] for c in self.tool_calls]
        calls = list(self.tool_calls)  # a new list: the writer may hold the one it waits to save
        if call["id"] in ids:
            calls[ids.index(call["id"])] = dict(call)
        else:
            calls.append(dict(call))
        self.tool_calls = calls
        self.writer.write(self.mid, self.text, now=True, tool_calls=self.tool_calls)

    def finish(self, stats: dict) -> bool:
        """The answer's end (stats: its final figures and finish_reason). Whether it is saved."""
        saved = self.writer.write(
            self.mid, self.text, now=True, sources=self.runs, stats=stats, complete=True,
            thinking=self.thinking, tool_calls=self.tool_calls,
        )  # fmt: skip
        self.last_mid, self.mid = self.mid, None
        return saved

    def fail(self, error: str) -> bool:
        """The answer's end by an error: what arrived is kept with the error, an answer with no
        text is deleted. Whether the store took it."""
        mid = self.last_mid = self.mid
        self.mid = None
        if mid is None:
            return True
        if self.text or self.thinking or self.tool_calls:
            return self.writer.write(
                mid, self.text, now=True, stats={"error": error}, complete=True,
                thinking=self.thinking, tool_calls=self.tool_calls,
            )  # fmt: skip
        try:
            self.store.delete_message(mid)  # nothing was written: no empty answer
        except sqlite3.Error:
            return False
        self.writer.pending.pop(mid, None)
        return True

    def messages(self, cid: int) -> list:
        """Conversation cid's branch as stored, with what the store could not take yet."""
        messages = self.store.messages(cid)
        for m in messages:
            for key, value in self.writer.pending.get(m.id, {}).items():
                setattr(m, key, value)
        return messages
