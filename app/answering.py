"""The answer being written, from the request to the worker to its last saved piece.

The window asks for an answer (start); the worker streams it back on its thread through queued
signals, and each piece is saved as it arrives (saving.StreamingAnswer, which keeps what the store
refuses and retries it). The window hears `streamed` to redraw, `window_moved` when the rolling
window dropped older messages, and `ended` once: with the finish reason ("error" for a failure),
the final figures, and what to say of it, if anything."""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

from kwker.app.context_window import window_start
from kwker.app.saving import StreamingAnswer

RETRY_MS = 2000  # how often what the store refused is offered to it again


class Answering(QObject):
    # messages, settings, the window's start so far, the documents ({name, text})
    request = Signal(list, dict, int, list)
    streamed = Signal()
    window_moved = Signal(int)  # a conversation whose rolling window starts later now
    # reason, stats, what to say ("" or HTML), the same in short plain words
    ended = Signal(str, dict, str, str)
    saved_late = Signal()  # what the store had refused is saved now

    def __init__(self, store, worker, parent=None):
        super().__init__(parent)
        self.store = store
        self.answer = StreamingAnswer(store)
        self.generating = False
        self.request.connect(worker.generate)
        worker.window.connect(self._on_window)
        worker.chunk.connect(self._on_chunk)
        worker.thought.connect(self._on_thought)
        worker.tool_call.connect(self._on_tool_call)
        worker.finished.connect(self._on_finished)
        worker.failed.connect(self._on_failed)
        self.retry = QTimer(self, interval=RETRY_MS)
        self.retry.timeout.connect(self._retry)
        self.retry.start()

    def start(self, cid: int, settings: dict, continued=None) -> None:
        """Answers conversation cid's branch with `settings`; continued: its last message, an
        answer cut at max_new_tokens that the model goes on writing (kwker.app.backends)."""
        messages = self.store.messages(cid)
        # an answer's thinking goes along apart: the backend gives it to the template only as
        # the template wants it (kwker.thinking.for_template)
        history = [{"role": m.role, "content": m.content, "thinking": m.thinking,
                    "tool_calls": m.tool_calls} for m in messages]  # fmt: skip
        start = window_start(messages, self.store.conversation(cid).context_from)
        self.answer.start(cid, [m.id for m in messages], continued)
        self.generating = True
        documents = [{"name": a.name, "text": a.text} for a in self.store.attachments(cid)]
        self.request.emit(history, settings, start, documents)

    def _on_window(self, start: int) -> None:
        """The worker's rolling window starts at message `start` of the answered history."""
        cid = self.answer.cid
        mid = self.answer.history_ids[start] if start > 0 else 0
        if mid != self.store.conversation(cid).context_from:
            self.store.set_context_from(cid, mid)
            self.window_moved.emit(cid)

    def _on_chunk(self, text: str, token: int, source: str, stats: dict) -> None:
        if self.answer.mid is not None:
            self.answer.add(text, source, stats)
            self.streamed.emit()

    def _on_thought(self, text: str) -> None:
        if self.answer.mid is not None:
            self.answer.add_thinking(text)
            self.streamed.emit()

    def _on_tool_call(self, call: dict) -> None:
        if self.answer.mid is not None:
            self.answer.set_tool_call(call)
            self.streamed.emit()

    def _on_finished(self, reason: str, stats: dict) -> None:
        a = self.answer
        if reason == "cut" and not (a.text or a.thinking or a.tool_calls):  # nothing to keep
            self._on_failed(stats["error"])
            return
        saved = self.answer.finish({**stats, "finish_reason": reason})
        said = f"{stats['error']} The text that arrived is kept." if reason == "cut" else ""
        self._end(reason, stats, said, said, saved)

    def _on_failed(self, msg: str) -> None:
        saved = self.answer.fail(msg)
        self._end("error", {}, f"The answer failed: {msg}", msg, saved)

    def _end(self, reason: str, stats: dict, said: str, short: str, saved: bool) -> None:
        self.generating = False
        if not saved:
            said = short = (
                f"This answer could not be saved: {self.answer.writer.error}. It stays on screen, "
                "and Kwker saves it as soon as the disk takes it again."
            )
        self.ended.emit(reason, stats, said, short)

    def _retry(self) -> None:
        if self.answer.writer.pending and self.answer.writer.flush():
            self.saved_late.emit()
