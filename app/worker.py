"""The generation worker: one QObject living on a QThread. It loads a backend (a model here or on a
server, kwker.app.backends) and drives its answers; the GUI talks to it through queued signals,
except Stop, which is a thread-safe flag checked between pieces."""

from __future__ import annotations

import logging
import threading

from PySide6.QtCore import QObject, Signal, Slot

from kwker.app.backends import backend_for
from kwker.remote import CUT, RemoteError

log = logging.getLogger(__name__)  # to the app's log file (kwker.app.logs)


class GenerationWorker(QObject):
    loading = Signal(str)  # progress message
    loaded = Signal(dict)  # model info: model, server, precision, isa, threads, draft, ...
    load_failed = Signal(str)
    # the index of the first message the model sees (the rolling window's start), before an answer
    window = Signal(int)
    # text piece, token id (-1 from a server), source ("" / "lookup" / "draft"), stats ({} between
    # fresh ones)
    chunk = Signal(str, int, str, dict)
    # a thinking model's thinking (kwker.thinking), sent before the same piece's chunk
    thought = Signal(str)
    # finish reason ("eos", "length", "stopped"; a server's "stop"; "cut": the stream ended midway,
    # its text so far kept, the reason in the stats' "error"), final stats
    finished = Signal(str, dict)
    failed = Signal(str)
    # the exactness split view (kwker.app.views.split_view): column (0 plain decoding,
    # 1 speculation), text piece, token id; a column's final stats; a failure; the end of both
    compare_chunk = Signal(int, str, int)
    compare_done = Signal(int, dict)
    compare_failed = Signal(str)
    compare_finished = Signal()

    def __init__(self):
        super().__init__()
        self._stop = threading.Event()
        self.backend = None
        self.info: dict = {}

    # a local backend's parts, for tests and measurements on the loaded model (None for a server)
    @property
    def decoder(self):
        return getattr(self.backend, "decoder", None)

    @property
    def tokenizer(self):
        return getattr(self.backend, "tokenizer", None)

    @property
    def last_prompt(self) -> list[int]:
        return getattr(self.backend, "last_prompt", [])

    def request_stop(self) -> None:
        """Called from the GUI thread: the running answer ends after the current piece."""
        self._stop.set()

    @Slot(dict)
    def load(self, opts: dict) -> None:
        try:
            # Dropping the reference frees the previous decoders' memory (they hold no reference
            # cycles). No gc.collect() here: a collection on this thread can destroy Qt objects of
            # the GUI thread that sit in garbage cycles, which crashed the process (seen in CI).
            self.backend = None
            self.backend = backend_for(opts).load(opts, self.loading.emit)
            self.info = self.backend.info
            self.loaded.emit(self.info)
        except RemoteError as e:  # a server's refusal, said in words: no traceback to print
            self.load_failed.emit(str(e))
        except Exception as e:  # noqa: BLE001  (any load failure is reported in the window)
            log.exception("%s", e)
            self.load_failed.emit(str(e))

    @Slot(list, dict, int, list)
    def generate(self, messages: list, settings: dict, start: int = 0, documents=()) -> None:
        """Answers messages (role/content dicts) from the window's start so far (see
        kwker.app.context_window), with the conversation's documents ({name, text} dicts; see
        kwker.app.documents)."""
        self._stop.clear()
        if self.backend is None:
            self.failed.emit("no model is loaded")
            return
        answer = None
        try:
            answer = self.backend.answer(messages, settings, start, list(documents))
            self.window.emit(answer.start)
            reason = "stopped"
            for piece in answer:
                if piece.thinking:
                    self.thought.emit(piece.thinking)
                self.chunk.emit(piece.text, piece.token, piece.source, piece.stats or {})
                if piece.finish_reason:
                    reason = piece.finish_reason
                    break
                if self._stop.is_set():
                    answer.close()
                    break
            self.finished.emit(reason, answer.stats())
        except RemoteError as e:
            if e.kind == CUT and answer is not None:  # what arrived stays, marked as cut
                self.finished.emit("cut", {**answer.stats(), "error": str(e)})
            else:
                self.failed.emit(str(e))
        except Exception as e:  # noqa: BLE001
            log.exception("%s", e)
            self.failed.emit(str(e))

    @Slot(list, dict, int)
    def compare(self, messages: list, settings: dict, start: int = 0) -> None:
        """Answers messages twice, one run after the other: plain decoding (no lookup, no draft),
        then speculation (lookup, and the draft if one is loaded), with the same settings (and so
        the same seed). A local model's only: a server decodes as it does."""
        self._stop.clear()
        try:
            if self.backend is None or self.backend.remote:
                raise RuntimeError("the split view needs a model loaded on this machine")
            runs = ((0, {**settings, "lookup": False}, False), (1, settings, True))
            for column, run_settings, draft in runs:
                answer = self.backend.answer(messages, run_settings, start, draft=draft)
                for piece in answer:
                    self.compare_chunk.emit(column, piece.text, piece.token)
                    if piece.finish_reason:
                        break
                    if self._stop.is_set():
                        answer.close()
                        break
                self.compare_done.emit(column, answer.stats())
                if self._stop.is_set():
                    break
        except Exception as e:  # noqa: BLE001  (said in the split view)
            log.exception("%s", e)
            self.compare_failed.emit(str(e))
        finally:
            self.compare_finished.emit()
