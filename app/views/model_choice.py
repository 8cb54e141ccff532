"""The model a window chats with: the worker that loads and runs it on its own QThread, what the
window shows while it loads, and the ways the user picks another (the model picker, a server, a
model file dropped on the window). A choice goes through the window's apply_settings, so it is
saved as the user's and reloads the model only when a load setting changed."""

from __future__ import annotations

from PySide6.QtCore import QObject, QThread, Signal

from kwker.app.settings import load_options
from kwker.app.worker import GenerationWorker


class ModelChoice(QObject):
    request_load = Signal(dict)  # queued to the worker's thread

    def __init__(self, window):
        super().__init__(window)
        self.w = window
        self.thread_ = QThread(self)
        self.worker = GenerationWorker()
        self.worker.moveToThread(self.thread_)
        self.request_load.connect(self.worker.load)
        self.worker.loading.connect(self._on_loading)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.load_failed.connect(self._on_load_failed)
        self.thread_.start()

    def close(self) -> None:
        """Ends the worker's thread (after the running answer's current piece) and frees the
        model now: the lambdas connected to the worker's signals hold the window, a cycle through
        C++ that gc cannot see, so without this every closed window kept its model for good."""
        self.worker.request_stop()
        self.thread_.quit()
        self.thread_.wait()
        self.worker.backend = None

    def name(self) -> str:
        """The chosen model as the status bar names it: a local one, or one on a server."""
        s = self.w.settings
        return f"{s['server_model']} on {s['server_url']}" if s["server_url"] else s["model"]

    def load(self) -> None:
        self.w.model_info = None
        self.w.set_busy(True)
        self.w.status.setText(f"Loading {self.name()}…")
        self.request_load.emit(load_options(self.w.settings))

    # ---- the loaded model's measures, for the attachments and the too-long check
    def count_tokens(self, text: str) -> int:
        """text's length in the loaded model's tokens (4 characters a token for a server's, or
        before a model loaded: an estimate, shown as one)."""
        tokenizer = self.worker.tokenizer
        if tokenizer is None:
            return -(len(text) // 4 + 1)  # negative: an estimate
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_room(self) -> int:
        """The tokens a prompt may take in the model's context, the answer's room kept free (0
        before a model is loaded)."""
        from kwker.app.context_window import answer_reserve

        context = (self.w.model_info or {}).get("context_length") or 0
        max_new = int(self.w.effective_settings()["max_new_tokens"])
        return context - answer_reserve(context, max_new) if context else 0

    # ---- the worker's reports
    def _on_loading(self, msg: str):
        self.w.status.setText(msg[:1].upper() + msg[1:] + "…")

    def _on_loaded(self, info: dict):
        from kwker.models.catalog import same_tokenizer

        w = self.w
        w.model_info = info
        w.preset = info.get("preset") or {"values": {}, "sources": {}}
        w.refresh_settings()
        w.settings_panel.show_values(w.settings, w.store.conversation(w.cid).overrides)
        w.show_sources()
        w.set_busy(False)
        w.stats.set_model(info)
        where = f"on {info['server']}" if info["server"] else (
            f"({info['precision']}, {info['context_length']} tokens of context)"
        )  # fmt: skip
        w.status.setText(f"Ready: {info['model']} {where}")
        # models we know share the loaded model's tokenizer: the drafts it may use
        drafts = [] if info["server"] else same_tokenizer(w.settings["model"])
        w.settings_panel.set_draft_choices(drafts)
        # a server decodes as it does: there is no plain run of it to set beside speculation
        w.compare_button.setVisible(not info["server"])
        w.show_think()  # the Think toggle, for a model whose template can turn thinking off
        w.chat.attachments.refresh(w.cid)  # whether they fit this model's context
        if not w.messages:  # the first screen names the model, and whether it is a base one
            w.render_history()
        w.input.setFocus()  # ready: the next keystrokes are the user's message

    def _on_load_failed(self, msg: str):
        self.w.set_busy(False)
        self.w.send_button.setEnabled(False)
        if self.w.settings["server_url"]:  # the picker's Servers tab connects again
            self.w.status.setText(f"Could not use {self.name()}: {msg}")
        else:
            self.w.status.setText(f"Could not load the model: {msg}")
            self.w.tabs.setCurrentWidget(self.w.settings_tab)

    # ---- choosing another
    def switch(self, **changes) -> None:
        """The settings panel's values with `changes`, applied as the user's (a reload if a load
        setting changed)."""
        w = self.w
        w.apply_settings({**w.settings_panel.values(), **changes}, conversation_only=False)
        w.settings_panel.show_values(w.settings, w.store.conversation(w.cid).overrides)

    def open_picker(self):
        """The model picker; choosing a model, a draft or a server's model reloads with it."""
        from kwker.app.views.model_picker import ModelPicker

        s = self.w.settings
        self.picker = ModelPicker(
            s["model"], self.w, precision=s["precision"], context=int(s["context_length"]),
            servers=s["servers"], server=(s["server_url"], s["server_model"]),
        )  # fmt: skip
        self.picker.model_chosen.connect(
            lambda repo: self.switch(model=repo, draft_model="", server_url="")
        )
        self.picker.draft_chosen.connect(lambda repo: self.switch(draft_model=repo))
        self.picker.server_chosen.connect(self._use_server)
        self.picker.server_forgotten.connect(self._forget_server)
        self.picker.show()
        return self.picker

    def _use_server(self, url: str, model: str):
        """Chats with `model` on the server at `url` (listed first among the servers)."""
        servers = [url, *(s for s in self.w.settings["servers"] if s != url)]
        self.switch(server_url=url, server_model=model, draft_model="", servers=servers)

    def _forget_server(self, url: str):
        """Drops a server from the list (its key is already forgotten); a chat on it goes local."""
        changes: dict = {"servers": [s for s in self.w.settings["servers"] if s != url]}
        if self.w.settings["server_url"] == url:
            changes.update(server_url="", server_model="")
        self.switch(**changes)

    def import_dropped(self, model: str) -> None:
        """A .gguf file or a model folder dropped on the window: imported where it is (nothing is
        copied) and made the chat's model; a file that cannot be used is said, nothing changes."""
        from kwker.app.tasks import describe_error
        from kwker.app.views.model_table import import_model

        try:
            entry = import_model(model)
        except Exception as e:  # noqa: BLE001  (any failure is said in the window)
            self.w.status.setText(f"Cannot import {model}: {describe_error(e)}")
            return
        self.switch(model=entry["path"], draft_model="", server_url="")
