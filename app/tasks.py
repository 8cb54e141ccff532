"""Slow calls off the GUI thread. A TaskRunner runs them on its own QThread, one at a time and in
the order asked, and calls back on the GUI thread with the result, or with the failure in words.

Only the GUI thread touches widgets and Qt models, so a call returns data and its callback, run
on the GUI thread by a queued signal, changes the window. The model picker runs its disk and
network calls through one; its Servers tab runs its keyring calls through the picker's."""

from __future__ import annotations

import traceback

from PySide6.QtCore import QObject, QThread, Signal, Slot

from kwker.models import hub
from kwker.remote import RemoteError


def describe_error(e: BaseException) -> str:
    """A failure as the user reads it: kwker's own errors and the OS's say what happened; anything
    else (a bug) is named by its type, so the message is never empty or cryptic."""
    if isinstance(e, (hub.DownloadError, RemoteError, ValueError, OSError)) and str(e):
        return str(e)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


class _Worker(QObject):
    """Lives on the runner's thread: runs each call it is sent."""

    finished = Signal(int, object)  # task id, what the call returned
    failed = Signal(int, str)  # task id, what went wrong, in words

    @Slot(int, object)
    def run(self, task: int, call) -> None:
        try:
            result = call()
        except Exception as e:  # noqa: BLE001  (any failure is reported, the worker lives on)
            if not isinstance(e, RemoteError):  # a server's refusal is no bug: said, not traced
                traceback.print_exc()
            self.failed.emit(task, describe_error(e))
            return
        self.finished.emit(task, result)


class TaskRunner(QObject):
    _request = Signal(int, object)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._thread = QThread(self)
        self._worker = _Worker()
        self._worker.moveToThread(self._thread)
        self._request.connect(self._worker.run)
        self._worker.finished.connect(self._finished)
        self._worker.failed.connect(self._failed)
        self._thread.start()
        self._callbacks: dict[int, tuple] = {}  # task id -> (on_done, on_fail)
        self._next = 0

    def submit(self, call, on_done, on_fail) -> int:
        """Runs call() on the runner's thread; then on_done(result) or on_fail(message) on this
        one. Returns the task's id."""
        self._next += 1
        self._callbacks[self._next] = (on_done, on_fail)
        self._request.emit(self._next, call)
        return self._next

    @property
    def busy(self) -> bool:
        """Whether a call is still to report."""
        return bool(self._callbacks)

    def stop(self) -> None:
        """Ends the thread once the call running now returns (the calls still queued are
        dropped with their callbacks)."""
        self._callbacks.clear()
        self._thread.quit()
        self._thread.wait()

    def _finished(self, task: int, result) -> None:
        on_done, _ = self._callbacks.pop(task, (None, None))
        if on_done is not None:
            on_done(result)

    def _failed(self, task: int, message: str) -> None:
        _, on_fail = self._callbacks.pop(task, (None, None))
        if on_fail is not None:
            on_fail(message)
