"""The generation worker: one QObject living on a QThread. It loads models and drives `stream_generate`; the GUI
talks to it through queued signals, except Stop, which is a thread-safe flag checked between tokens."""

from __future__ import annotations

import threading
import time
import traceback

from PySide6.QtCore import QObject, Signal, Slot

from kwker.app.settings import generation_options

REFERENCE_PROMPT = "Count from one to twenty in words."


class GenerationWorker(QObject):
    loading = Signal(str)  # progress message
    loaded = Signal(
        dict
    )  # model info: name, precision, isa, threads, reference tokens/s, has_draft
    load_failed = Signal(str)
    chunk = Signal(
        str, int, str, dict
    )  # text piece, token id, source ("" / "lookup" / "draft"), stats
    finished = Signal(str, dict)  # finish reason ("eos", "length", "stopped"), final stats
    failed = Signal(str)

    def __init__(self):
        super().__init__()
        self._stop = threading.Event()
        self.decoder = None
        self.draft = None
        self.tokenizer = None
        self.info: dict = {}

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
            self.loading.emit("measuring plain decoding speed")
            self.info = {
                "model": opts["model"],
                "precision": decoder.precision,
                "isa": decoder.isa,
                "threads": decoder.threads,
                "reference_tokens_per_s": self._reference_rate(),
                "draft": opts.get("draft_model") or "",
                "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            }
            self.loaded.emit(self.info)
        except Exception as e:  # noqa: BLE001  (any load failure is reported in the window)
            traceback.print_exc()
            self.load_failed.emit(str(e))

    def _reference_rate(self) -> float:
        """Plain decoding (no lookup, no draft) tokens/s of the loaded model: the base of the speedup figure."""
        ids = self._prompt_ids([{"role": "user", "content": REFERENCE_PROMPT}])
        n = min(24, self.decoder.max_cache_len - len(ids))
        if n < 4:
            return 0.0
        self.decoder.generate(ids, max_new_tokens=n, lookup=0, eos_token_id=[])
        rate = self.decoder.last_stats.tokens_per_s
        self.decoder.reset()
        return rate

    def _prompt_ids(self, messages: list[dict]) -> list[int]:
        if getattr(self.tokenizer, "chat_template", None):
            return list(
                self.tokenizer.apply_chat_template(
                    messages, add_generation_prompt=True, tokenize=True, return_dict=True
                )["input_ids"]
            )
        text = "\n\n".join(m["content"] for m in messages) + "\n\n"
        return self.tokenizer(text)["input_ids"]

    @Slot(list, dict)
    def generate(self, messages: list, settings: dict) -> None:
        self._stop.clear()
        if self.decoder is None:
            self.failed.emit("no model is loaded")
            return
        try:
            system = settings.get("system_prompt", "").strip()
            convo = ([{"role": "system", "content": system}] if system else []) + messages
            ids = self._prompt_ids(convo)
            room = self.decoder.max_cache_len - len(ids)
            if room < 1:
                raise ValueError(
                    f"the conversation ({len(ids)} tokens) no longer fits the context of "
                    f"{self.decoder.max_cache_len} tokens: start a new chat or raise the context length"
                )
            opts = generation_options(settings)
            if self.draft is not None:
                opts["draft"] = self.draft
            stream = self.decoder.stream_generate(
                ids, min(int(settings["max_new_tokens"]), room), tokenizer=self.tokenizer, **opts
            )
            reason, stats = "stopped", None
            t0 = time.perf_counter()
            for c in stream:
                stats = c.stats
                self.chunk.emit(c.text, c.token, c.source or "", _stats_dict(c.stats, t0))
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
    return {
        "new_tokens": s.new_tokens,
        "tokens_per_s": s.tokens_per_s,
        "prefill_s": s.prefill_s,
        "prompt_tokens": s.prompt_tokens,
        "reused_prompt_tokens": s.reused_prompt_tokens,
        "steps": s.steps,
        "tokens_per_step": s.tokens_per_step,
        "proposed": dict(s.proposed),
        "accepted": dict(s.accepted),
        "draft_s": s.draft_s,
        "elapsed_s": time.perf_counter() - t0,
    }
