"""The chat window: conversations on the left, the chat in the middle, statistics and settings on
the right. It wires the parts together: the conversation list, the chat view
(views/chat_view.py), the side panel, the store, and the worker that loads and runs the model.

Threading: the GenerationWorker lives on its own QThread and is reached through queued signals;
Stop is a flag the worker checks between tokens. Only this (GUI) thread touches widgets, item
models and the store. Streamed text is saved as it arrives (saving.StreamingAnswer) and drawn at
most once per frame (ChatView)."""

from __future__ import annotations

import html
import re
import sqlite3
from pathlib import Path

from PySide6.QtCore import Qt, QThread, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QSplitter,
    QWidget,
)

from kwker.app import theme
from kwker.app.answering import Answering
from kwker.app.context_window import window_start
from kwker.app.settings import LOAD_KEYS, effective, load_options, sampling_sources, user_values
from kwker.app.store import Store
from kwker.app.views import side_panel
from kwker.app.views.attachments_bar import AttachmentsBar
from kwker.app.views.chat_view import EXAMPLES, ChatView, welcome_html
from kwker.app.views.conversation_list import ConversationList
from kwker.app.views.settings_panel import split_values
from kwker.app.views.side_panel import SidePanel
from kwker.app.worker import GenerationWorker


class MainWindow(QMainWindow):
    request_load = Signal(dict)

    def __init__(self, store: Store, model: str | None = None):
        super().__init__()
        self.store = store
        self._model_arg = model  # the command line's model: in force, not saved
        self.preset: dict = {"values": {}, "sources": {}}  # the loaded model's (models.presets)
        self._refresh_settings()
        self.colors = theme.apply(QApplication.instance(), self.settings["theme"])
        self.setWindowTitle("Kwker")
        self._fit_to_screen(1280, 820)

        self.thread_ = QThread(self)
        self.worker = GenerationWorker()
        self.worker.moveToThread(self.thread_)
        self.request_load.connect(self.worker.load)
        self.worker.loading.connect(self._on_loading)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.load_failed.connect(self._on_load_failed)
        self.answering = Answering(store, self.worker, self)
        self.answer = self.answering.answer  # the answer being written
        self.answering.streamed.connect(self._show_stream)
        self.answering.window_moved.connect(lambda cid: cid == self.cid and self._render_history())
        self.answering.ended.connect(self._on_ended)
        self.answering.saved_late.connect(
            lambda: self.status.setText("Saved what could not be saved before")
        )
        self.worker.compare_finished.connect(lambda: setattr(self, "comparing", False))
        self.thread_.start()

        self.model_info: dict | None = None
        self.cid: int | None = None
        self.messages = []
        self.comparing = False  # the exactness split view's two runs hold the worker
        self.editing_index: int | None = None
        self.last_finish_reason = None
        self.pasted = ""  # an over-long message the user may attach as a document instead

        self._build()
        self.setAcceptDrops(True)  # model files and folders, documents (dropEvent)
        convs = self.store.conversations()
        self.open_conversation(convs[0].id if convs else self.store.new_conversation().id)
        self._load_model()

    @property
    def generating(self) -> bool:
        return self.answering.generating

    @property
    def stream_text(self) -> str:
        return self.answer.text

    # ----------------------------------------------------------------------------------- layout
    def _build(self):
        self.conversations = ConversationList(self.store)
        self.conversations.opened.connect(self.open_conversation)
        self.conversations.new_requested.connect(self.new_chat)
        self.conversations.delete_requested.connect(self.delete_current)
        self.conversations.models_requested.connect(self.open_models)
        self.conversations.about_requested.connect(self.open_about)
        self.search, self.conv_list = self.conversations.search, self.conversations.list
        self.conv_model = self.conversations.model
        bar = AttachmentsBar(self.store, self._count_tokens, self._prompt_room)
        bar.said.connect(lambda text: self.status.setText(text))
        self.chat = ChatView(self.colors, bar)
        self.chat.link.connect(self._on_link)
        self.chat.export_requested.connect(self._export_dialog)
        self.chat.drawn.connect(self._show_figures)
        self.chat.input.submitted.connect(self.send_or_stop)
        self.chat.send_button.clicked.connect(self.send_or_stop)
        self.chat.regen_button.clicked.connect(self.regenerate)
        self.chat.compare_button.clicked.connect(self.open_compare)
        self.attachments_row = bar.row
        # the names tests and packaging/screenshots.py drive the window by
        self.title, self.view, self.legend = self.chat.title, self.chat.view, self.chat.legend
        self.input, self.send_button = self.chat.input, self.chat.send_button
        self.compare_button = self.chat.compare_button
        split = QSplitter()
        split.addWidget(self.conversations)
        split.addWidget(self.chat)
        split.setStretchFactor(1, 1)
        split.setSizes([250, 800])
        self.setCentralWidget(split)

        self.tabs = SidePanel()
        self.stats, self.settings_panel = self.tabs.stats, self.tabs.settings_panel
        self.settings_tab = self.tabs.settings_tab
        self.settings_panel.changed.connect(self.apply_settings)
        dock = QDockWidget("", self)
        dock.setObjectName("side-panel")
        dock.setTitleBarWidget(QWidget())
        dock.setWidget(self.tabs)
        dock.setFeatures(QDockWidget.NoDockWidgetFeatures)
        self.addDockWidget(Qt.RightDockWidgetArea, dock)
        self.resizeDocks([dock], [side_panel.WIDTH], Qt.Horizontal)

        self.status = QLabel("")
        self.progress = QProgressBar()
        self.progress.setRange(0, 0)
        self.progress.setMaximumWidth(160)
        self.progress.setAccessibleName("loading")
        self.statusBar().addWidget(self.status, 1)
        self.statusBar().addPermanentWidget(self.progress)
        for keys, slot in (
            (QKeySequence.New, self.new_chat),
            ("Esc", self.stop),
            ("Ctrl+L", self.input.setFocus),
            ("Ctrl+R", self.regenerate),
        ):
            QShortcut(QKeySequence(keys), self, activated=slot)
        # Ctrl+Q itself: the platform's QKeySequence.Quit is empty on Windows and offscreen
        self.addAction(QAction("Quit", self, shortcut=QKeySequence("Ctrl+Q"), triggered=self.close))
        self._set_busy(True)

    def _fit_to_screen(self, width: int, height: int):
        """Opens at width x height, or at the screen's available size if that is smaller."""
        screen = self.screen() or QApplication.primaryScreen()
        if screen is not None:
            room = screen.availableGeometry()
            width, height = min(width, room.width()), min(height, room.height())
        self.resize(width, height)

    # --------------------------------------------------------------------------------- settings
    def _refresh_settings(self) -> None:
        """The settings in force: the defaults, under the model's preset, under the user's own."""
        self.settings = effective(self.store.settings(), self.preset["values"])
        if self._model_arg:
            self.settings["model"] = self._model_arg

    def effective_settings(self) -> dict:
        overrides = self.store.conversation(self.cid).overrides if self.cid else {}
        return {**self.settings, **overrides}

    def apply_settings(self, values: dict, conversation_only: bool) -> None:
        if not values:  # "use app defaults" for this conversation
            self.store.set_overrides(self.cid, {})
            return
        app_values, overrides = split_values(values, conversation_only)
        reload = any(app_values.get(k, self.settings[k]) != self.settings[k] for k in LOAD_KEYS)
        if app_values.get("model") and app_values["model"] != self.settings["model"]:
            self._model_arg = None  # the user chose another model: the choice is saved
        keep, forget = user_values(app_values, self.preset["values"], self.store.settings())
        self.store.save_settings(keep)
        self.store.forget_settings(forget)
        self._refresh_settings()
        self.store.set_overrides(self.cid, overrides)
        self._show_sources()
        if "theme" in app_values:
            self.colors = theme.apply(QApplication.instance(), self.settings["theme"])
            self.chat.set_colors(self.colors)
        self._render_history()  # the theme, the tint
        if reload:
            self.stop()
            self._load_model()

    def _show_sources(self) -> None:
        self.settings_panel.show_sources(
            sampling_sources(self.store.settings(), self.preset["sources"])
        )

    def _switch_model(self, **changes):
        self.apply_settings({**self.settings_panel.values(), **changes}, conversation_only=False)
        self.settings_panel.show_values(self.settings, self.store.conversation(self.cid).overrides)

    # ---------------------------------------------------------------------------------- the model
    def _model_name(self) -> str:
        """The chosen model as the status bar names it: a local one, or one on a server."""
        if self.settings["server_url"]:
            return f"{self.settings['server_model']} on {self.settings['server_url']}"
        return self.settings["model"]

    def _load_model(self):
        self.model_info = None
        self._set_busy(True)
        self.status.setText(f"Loading {self._model_name()}…")
        self.request_load.emit(load_options(self.settings))

    def _set_busy(self, busy: bool):
        self.progress.setVisible(busy)
        self.send_button.setEnabled(not busy or self.generating)

    def _on_loading(self, msg: str):
        self.status.setText(msg[:1].upper() + msg[1:] + "…")

    def _on_loaded(self, info: dict):
        from kwker.models.catalog import same_tokenizer

        self.model_info = info
        self.preset = info.get("preset") or {"values": {}, "sources": {}}
        self._refresh_settings()
        self.settings_panel.show_values(self.settings, self.store.conversation(self.cid).overrides)
        self._show_sources()
        self._set_busy(False)
        self.stats.set_model(info)
        where = f"on {info['server']}" if info["server"] else (
            f"({info['precision']}, {info['context_length']} tokens of context)"
        )  # fmt: skip
        self.status.setText(f"Ready: {info['model']} {where}")
        # models we know share the loaded model's tokenizer: the drafts it may use
        drafts = [] if info["server"] else same_tokenizer(self.settings["model"])
        self.settings_panel.set_draft_choices(drafts)
        # a server decodes as it does: there is no plain run of it to set beside speculation
        self.compare_button.setVisible(not info["server"])
        self.chat.attachments.refresh(self.cid)  # whether they fit this model's context
        if not self.messages:  # the first screen names the model, and whether it is a base one
            self._render_history()
        self.input.setFocus()  # ready: the next keystrokes are the user's message

    def _on_load_failed(self, msg: str):
        self._set_busy(False)
        self.send_button.setEnabled(False)
        if self.settings["server_url"]:  # the picker's Servers tab connects again
            self.status.setText(f"Could not use {self._model_name()}: {msg}")
        else:
            self.status.setText(f"Could not load the model: {msg}")
            self.tabs.setCurrentWidget(self.settings_tab)

    def open_models(self):
        """The model picker; choosing a model, a draft or a server's model reloads with it."""
        from kwker.app.views.model_picker import ModelPicker

        s = self.settings
        self.picker = ModelPicker(
            s["model"], self, precision=s["precision"], context=int(s["context_length"]),
            servers=s["servers"], server=(s["server_url"], s["server_model"]),
        )  # fmt: skip
        self.picker.model_chosen.connect(
            lambda repo: self._switch_model(model=repo, draft_model="", server_url="")
        )
        self.picker.draft_chosen.connect(lambda repo: self._switch_model(draft_model=repo))
        self.picker.server_chosen.connect(self._use_server)
        self.picker.server_forgotten.connect(self._forget_server)
        self.picker.show()
        return self.picker

    def _use_server(self, url: str, model: str):
        """Chats with `model` on the server at `url` (listed first among the servers)."""
        servers = [url, *(s for s in self.settings["servers"] if s != url)]
        self._switch_model(server_url=url, server_model=model, draft_model="", servers=servers)

    def _forget_server(self, url: str):
        """Drops a server from the list (its key is already forgotten); a chat on it goes local."""
        changes: dict = {"servers": [s for s in self.settings["servers"] if s != url]}
        if self.settings["server_url"] == url:
            changes.update(server_url="", server_model="")
        self._switch_model(**changes)

    def open_compare(self):
        """The exactness split view on the loaded local model (None for a server's)."""
        from kwker.app.views.split_view import SplitView

        if self.model_info is None or self.model_info["server"]:
            return None
        self.split_view = SplitView(self)
        self.split_view.show()
        return self.split_view

    def open_about(self):
        from kwker.app.views.about import AboutDialog

        self.about = AboutDialog(self)
        self.about.show()
        return self.about

    # ---------------------------------------------------------------------------- conversations
    def open_conversation(self, cid: int):
        self.cid = cid
        self.editing_index = None
        self.chat.inline_error = ""
        self.messages = self.answer.messages(cid)
        if not (self.generating and self.answer.cid == cid):  # the figures of what is shown
            last = next((m for m in reversed(self.messages) if m.role == "assistant"), None)
            self.stats.show_answer(last.stats if last else {})
        conv = self.store.conversation(cid)
        self.title.setText(conv.title)
        self.settings_panel.show_values(self.settings, conv.overrides)
        self.conversations.refresh(cid)
        self.chat.attachments.refresh(self.cid)
        self._render_history()

    def new_chat(self):
        self.open_conversation(self.store.new_conversation().id)
        self.input.setFocus()

    def delete_current(self, confirm: bool = True):
        question = f"Delete “{self.title.text()}”?"
        if confirm and QMessageBox.question(self, "Delete chat", question) != QMessageBox.Yes:
            return
        if self.generating and self.answer.cid == self.cid:
            self.stop()
        self.store.delete(self.cid)
        convs = self.store.conversations()
        self.open_conversation(convs[0].id if convs else self.store.new_conversation().id)

    def export_to(self, path: str, fmt: str) -> None:
        """Writes the conversation as `fmt` (a key of kwker.app.export.FORMATS)."""
        from kwker.app.export import export

        text = export(self.store, self.cid, fmt, self.model_info, self.effective_settings())
        Path(path).write_text(text, encoding="utf-8")

    def _export_dialog(self, fmt: str):
        from kwker.app.export import FORMATS

        name = f"{self.title.text()}.{fmt}"
        path, _ = QFileDialog.getSaveFileName(self, "Export", name, f"{FORMATS[fmt]} (*.{fmt})")
        if path:
            self.export_to(path, fmt)

    # -------------------------------------------------------------------------------- documents
    def attach(self, paths: list[str]) -> list[str]:
        """Attaches documents to the conversation; returns the names of those attached."""
        return self.chat.attachments.attach(paths)

    def _count_tokens(self, text: str) -> int:
        """text's length in the loaded model's tokens (4 characters a token for a server's, or
        before a model loaded: an estimate, shown as one)."""
        tokenizer = self.worker.tokenizer
        if tokenizer is None:
            return -(len(text) // 4 + 1)  # negative: an estimate
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def _prompt_room(self) -> int:
        """The tokens a prompt may take in the model's context, the answer's room kept free (0
        before a model is loaded)."""
        from kwker.app.context_window import answer_reserve

        context = (self.model_info or {}).get("context_length") or 0
        max_new = int(self.effective_settings()["max_new_tokens"])
        return context - answer_reserve(context, max_new) if context else 0

    def _too_long(self, text: str) -> bool:
        """Whether text cannot fit the context beside an answer: then it is not sent, and the chat
        offers to attach it as a document (whose parts the answers quote) instead."""
        context = self.model_info.get("context_length") or 0
        if not context or len(text) < context:  # a token takes at least a character
            return False
        tokens = self._count_tokens(text)
        if abs(tokens) <= self._prompt_room():
            return False
        self.pasted = text
        self._show_error(
            f"This message is {abs(tokens):,} tokens long, more than fits the model's context of "
            f"{context:,} tokens beside an answer. "
            '<a href="attach-paste:0">Attach it as a document</a> instead: each answer then '
            "gets the parts that match your question.",
            markup=True,
        )
        return True

    def attach_pasted(self) -> None:
        """Attaches the over-long message as a document and clears the input for a question."""
        if not self.pasted:
            return
        self.chat.attachments.attach_text("Pasted text.txt", self.pasted)
        self.pasted, self.chat.inline_error = "", ""
        self.input.clear()
        self.status.setText("Attached the pasted text: ask your question about it")
        self._render_history()

    # ------------------------------------------------------------------------------- generation
    def send_or_stop(self):
        if self.generating:
            self.stop()
        else:
            self.send(self.input.toPlainText())

    def send(self, text: str) -> bool:
        text = text.strip()
        if not text or self.generating or self.comparing or self.model_info is None:
            return False
        self.chat.inline_error = ""
        if self._too_long(text):
            return False
        try:
            self._add_question(text)
        except sqlite3.Error as e:  # the window stays as it was: the text stays in the input
            self._show_error(f"Your message could not be saved ({e}), so it was not sent.")
            return False
        self.input.clear()
        self._start_answer()
        return True

    def _add_question(self, text: str) -> None:
        if self.editing_index is not None:
            # the edited message becomes a new version of it: a branch off its parent, the old
            # branch kept (the "< 1/2 >" switcher goes back to it)
            self.store.set_leaf(self.cid, self.messages[self.editing_index].parent_id)
            self.editing_index = None
        if not any(m.role == "user" for m in self.messages):
            self.store.rename(self.cid, text.splitlines()[0][:48])
            self.title.setText(text.splitlines()[0][:48])
        self.store.add_message(self.cid, "user", text)

    def continue_answer(self) -> bool:
        """Continues the last answer where max_new_tokens cut it: the model goes on from its text
        (a model on this machine: a server has no such request)."""
        last = self.messages[-1] if self.messages else None
        if (
            last is None or last.role != "assistant" or self.generating or self.comparing
            or self.model_info is None or self.model_info["server"]
        ):  # fmt: skip
            return False
        self.chat.inline_error = ""
        self._start_answer(continued=last)
        return True

    def regenerate(self):
        if self.generating or self.comparing or self.model_info is None or not self.messages:
            return
        last = self.messages[-1]
        if last.role == "assistant":  # a new version of it: the others are kept
            self.store.set_leaf(self.cid, last.parent_id)
        if self.store.messages(self.cid):
            self._start_answer()

    def switch_version(self, index: int, step: int) -> None:
        """Shows another version of message `index` ("< 2/3 >"), with the branch under it."""
        if self.generating and self.answer.cid == self.cid:
            return  # the answer being written hangs off the branch on screen
        self.store.switch_version(self.cid, self.messages[index].id, step)
        self.open_conversation(self.cid)

    def fork_from(self, index: int) -> int | None:
        """A new conversation with this one's messages up to `index`, opened. Returns its id (None
        when the store refused it: then nothing of it was written)."""
        try:
            conv = self.store.fork(self.cid, self.messages[index].id)
        except sqlite3.Error as e:
            self._show_error(f"Kwker could not fork this chat: {e}.")
            return None
        self.open_conversation(conv.id)
        self.status.setText(f"Forked into “{conv.title}”")
        return conv.id

    def stop(self):
        if self.generating:
            self.worker.request_stop()

    def _start_answer(self, continued=None):
        """Starts an answer to the branch on screen (continued: see Answering.start)."""
        self.answering.start(self.cid, self.effective_settings(), continued)
        self.chat.set_stopping(True)
        self.messages = self.answer.messages(self.cid)
        self._render_history()
        self.stats.start()

    def _on_ended(self, reason: str, stats: dict, said: str, short: str):
        self.last_finish_reason = reason
        self.chat.set_stopping(False)
        if stats:
            self.stats.update_stats(stats, final=True)
        elif reason == "error":
            self.stats.clear()  # an error's answer has no figures, not the previous answer's
        if self.cid == self.answer.cid:
            self.messages = self.answer.messages(self.cid)
            self._render_history()
        self.conversations.refresh()
        if said:
            self._show_error(said, short=short)

    # ------------------------------------------------------------------------------------- view
    def _render_history(self):
        """The finished messages drawn again (the chat view adds the answer being written)."""
        self.chat.tint = self.settings["tint_speculation"]
        start = window_start(self.messages, self.store.conversation(self.cid).context_from)
        welcome = welcome_html(self.model_info, (self.model_info or {}).get("model") or
                               self._model_name())  # fmt: skip
        server = (self.model_info or {}).get("server")
        self._show_stream()
        self.chat.set_history(self.messages, start, self.answer.mid, not server, welcome)

    def _show_stream(self) -> None:
        """The answer being written, on screen if its conversation is."""
        shown = self.generating and self.answer.cid == self.cid and self.answer.mid is not None
        index = len(self.messages) - 1
        self.chat.stream = (index, self.answer.text, self.answer.runs) if shown else None
        self.chat.dirty = True

    def _show_figures(self) -> None:
        """The streamed answer's latest figures, as often as its text is drawn."""
        if self.answer.stats:
            self.stats.update_stats(self.answer.stats)

    def _show_error(self, message: str, markup: bool = False, short: str = "") -> None:
        """Says an error at the end of the chat, and in the status bar as plain text (`short`
        there, if given)."""
        plain = html.unescape(re.sub(r"<[^>]+>", "", message)) if markup else message
        self.status.setText(f"Error: {short or plain}")
        self.chat.show_error(message if markup else html.escape(message))

    def _on_link(self, kind: str, arg: str):
        if kind == "copy-code":
            self.status.setText("Code copied")
        elif kind == "copy-msg":
            QApplication.clipboard().setText(self.messages[int(arg)].content)
            self.status.setText("Message copied")
        elif kind == "edit-msg" and not self.generating:
            self.edit_message(int(arg))
        elif kind in ("prev-version", "next-version"):
            self.switch_version(int(arg), -1 if kind == "prev-version" else 1)
        elif kind == "fork-msg":
            self.fork_from(int(arg))
        elif kind == "continue":
            self.continue_answer()
        elif kind == "example":
            self.send(EXAMPLES[int(arg)])
        elif kind == "attach-paste":
            self.attach_pasted()

    def edit_message(self, index: int):
        """Puts a user message back in the input; sending makes a new version of it, a branch of
        the conversation from there (the old one is kept)."""
        self.editing_index = index
        self.input.setPlainText(self.messages[index].content)
        self.input.setFocus()
        self.status.setText(
            "Editing a message: Send branches off there (the old branch stays a version of it)"
        )

    # ---------------------------------------------------------------------------------- closing
    def closeEvent(self, event):  # noqa: N802
        self.stop()
        self.chat.frame.stop()
        self.thread_.quit()
        self.thread_.wait()
        # The lambdas connected to the worker's signals hold this window: a cycle through C++ that
        # Python's gc cannot see, so without this every closed window kept its model for good.
        self.worker.backend = None
        super().closeEvent(event)

    # ---- drag and drop: a .gguf file or a model folder dropped on the window is imported where it
    # is and becomes the chat's model; documents (text, PDF, source files) are attached to the chat
    def dragEnterEvent(self, event):  # noqa: N802
        from kwker.app.documents import dropped

        model, documents = dropped(event.mimeData())
        if model is not None or documents:
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event):  # noqa: N802
        from kwker.app.documents import dropped
        from kwker.app.tasks import describe_error
        from kwker.app.views.model_picker import import_model

        model, documents = dropped(event.mimeData())
        if not documents and model is None:
            event.ignore()
            return
        event.acceptProposedAction()
        if documents:
            self.attach(documents)
            return
        try:
            entry = import_model(model)
        except Exception as e:  # noqa: BLE001  (any failure is said in the window, nothing changes)
            self.status.setText(f"Cannot import {model}: {describe_error(e)}")
            return
        self._switch_model(model=entry["path"], draft_model="", server_url="")
