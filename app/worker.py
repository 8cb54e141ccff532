"""The generation worker: one QObject living on a QThread. It loads models and drives `stream_generate`; the GUI
talks to it through queued signals, except Stop, which is a thread-safe flag checked between tokens."""

from __future__ import annotations

import threading
import time
import traceback

from PySide6.QtCore import QObject, Signal, Slot

from kwker.app.context_window import fit_prompt
from kwker.app.settings import generation_options

STATS_EVERY_S = 0.05  # streamed chunks carry fresh statistics at most this often (the window draws
# at most every 33 ms; the speedup's medians cost more than a token's other work)


class GenerationWorker(QObject):
    loading = Signal(str)  # progress message
    loaded = Signal(dict)  # model info: name, precision, isa, threads, draft, chat_template
    load_failed = Signal(str)
    # the index of the first message the model sees (the rolling window's start), before an answer
    window = Signal(int)
    # text piece, token id, source ("" / "lookup" / "draft"), stats ({} between fresh ones)
    chunk = Signal(str, int, str, dict)
    finished = Signal(str, dict)  # finish reason ("eos", "length", "stopped"), final stats
    failed = Signal(str)

    def __init__(self):
        super().__init__()
        self._stop = threading.Event()
        self.decoder = None
        self.draft = None
        self.tokenizer = None
        self.info: dict = {}
        self.last_prompt: list[int] = []  # the token ids of the latest answer's prompt

    def request_stop(self) -> None:
        """Called from the GUI thread: the running answer ends after the current token."""
        self._stop.set()

    @Slot(dict)
    def load(self, opts: dict) -> None:
        from kwker.models.loader import load_decoder
        from kwker.precision import DRAFT, canonical

        try:
            # Dropping the references frees the previous decoders' memory (they hold no reference cycles). No
            # gc.collect() here: a collection on this thread can destroy Qt objects of the GUI thread that sit in
            # garbage cycles, which crashed the process (seen in CI, in the app tests).
            self.decoder = self.draft = None
            precision = canonical(opts["precision"])  # None: the model's own
            threads = opts["threads"] or None
            decoder = load_decoder(
                opts["model"], progress=self.loading.emit,
                max_cache_len=int(opts["context_length"]), precision=precision, threads=threads,
            )  # fmt: skip
            tokenizer = decoder.tokenizer
            draft = None
            if opts.get("draft_model"):
                self.loading.emit(f"loading draft {opts['draft_model']}")
                draft = load_decoder(
                    opts["draft_model"], progress=self.loading.emit,
                    max_cache_len=int(opts["context_length"]), precision=DRAFT, threads=threads,
                )  # fmt: skip
                decoder.check_draft(draft)
            self.decoder, self.draft, self.tokenizer = decoder, draft, tokenizer
            self.info = {
                "model": opts["model"],
                "precision": decoder.precision,
                "isa": decoder.isa,
                "threads": decoder.threads,
                "context_length": decoder.max_cache_len,
                "draft": opts.get("draft_model") or "",
                "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            }
            self.loaded.emit(self.info)
        except Exception as e:  # noqa: BLE001  (any load failure is reported in the window)
            traceback.print_exc()
            self.load_failed.emit(str(e))

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            return list(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=True
                )["input_ids"]
            )
        text = "\n\n".join(m["content"] for m in messages) + "\n\n"
        return self.tokenizer(text)["input_ids"]

    @Slot(list, dict, int)
    def generate(self, messages: list, settings: dict, start: int = 0) -> None:
        """Answers messages (role/content dicts) from the window's start so far (see
        kwker.app.context_window)."""
        self._stop.clear()
        if self.decoder is None:
            self.failed.emit("no model is loaded")
            return
        try:
            max_new = int(settings["max_new_tokens"])
            prompt = fit_prompt(
                self._prompt_ids, settings.get("system_prompt", "").strip(), messages, start,
                self.decoder.max_cache_len, max_new, settings["context_overflow"],
            )  # fmt: skip
            self.window.emit(prompt.start)
            self.last_prompt = prompt.ids
            opts = generation_options(settings)
            if self.draft is not None:
                opts["draft"] = self.draft
            stream = self.decoder.stream_generate(
                prompt.ids, min(max_new, prompt.room), tokenizer=self.tokenizer, **opts
            )
            reason, stats = "stopped", None
            t0 = sent = time.perf_counter()
            for c in stream:
                stats, now = c.stats, time.perf_counter()
                fresh = now - sent >= STATS_EVERY_S
                if fresh:
                    sent = now
                self.chunk.emit(
                    c.text, c.token, c.source or "", _stats_dict(c.stats, t0) if fresh else {}
                )
                if c.finish_reason:
                    reason = c.finish_reason
                    break
                if self._stop.is_set():
                    stream.close()
                    break
            self.finished.emit(reason, _stats_dict(stats, t0) if stats else {})
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            self.failed.emit(str(e))


def _stats_dict(s, t0: float) -> dict:
    return s.summary() | {"elapsed_s": time.perf_counter() - t0}
