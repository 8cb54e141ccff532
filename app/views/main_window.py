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

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
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
from kwker.app.settings import LOAD_KEYS, effective, sampling_sources, user_values
from kwker.app.store import Store
from kwker.app.views import side_panel
from kwker.app.views.attachments_bar import AttachmentsBar
from kwker.app.views.branch_actions import BranchActions
from kwker.app.views.chat_view import EXAMPLES, ChatView, welcome_html
from kwker.app.views.conversation_list import ConversationList
from kwker.app.views.model_choice import ModelChoice
from kwker.app.views.settings_panel import split_values
from kwker.app.views.side_panel import SidePanel
from kwker.app.views.tool_use import ToolUse
from kwker.app.views.widgets import fit_to_screen


class MainWindow(QMainWindow):
    def __init__(self, store: Store, model: str | None = None):
        super().__init__()
        self.store = store
        self._model_arg = model  # the command line's model: in force, not saved
        self.preset: dict = {"values": {}, "sources": {}}  # the loaded model's (models.presets)
        self.refresh_settings()
        self.colors = theme.apply(QApplication.instance(), self.settings["theme"])
        self.setWindowTitle("Kwker")
        fit_to_screen(self, 1280, 820)

        self.model_choice = ModelChoice(self)  # the worker, on its thread, and choosing a model
        self.worker = self.model_choice.worker
        self.branches = BranchActions(self)
        self.answering = Answering(store, self.worker, self)
        self.answer = self.answering.answer  # the answer being written
        self.answering.streamed.connect(self._show_stream)
        self.answering.window_moved.connect(lambda cid: cid == self.cid and self.render_history())
        self.answering.ended.connect(self._on_ended)
        self.answering.saved_late.connect(
            lambda: self.status.setText("Saved what could not be saved before")
        )
        self.worker.compare_finished.connect(lambda: setattr(self, "comparing", False))

        self.model_info: dict | None = None
        self.cid: int | None = None
        self.messages = []
        self.comparing = False  # the exactness split view's two runs hold the worker
        self.last_finish_reason = None

        self._build()
        self.tool_use = ToolUse(self)  # MCP servers, the Tools tab, the approval of calls
        self.setAcceptDrops(True)  # model files and folders, documents (dropEvent)
        convs = self.store.conversations()
        self.open_conversation(convs[0].id if convs else self.store.new_conversation().id)
        self.model_choice.load()

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
        self.conversations.models_requested.connect(self.model_choice.open_picker)
        self.conversations.about_requested.connect(self.open_about)
        self.search, self.conv_list = self.conversations.search, self.conversations.list
        self.conv_model = self.conversations.model
        bar = AttachmentsBar(self.store, self.model_choice.count_tokens,
                             self.model_choice.prompt_room)  # fmt: skip
        bar.said.connect(lambda text: self.status.setText(text))
        self.chat = ChatView(self.colors, bar)
        self.chat.link.connect(self._on_link)
        self.chat.export_requested.connect(self.export_to)
        self.chat.drawn.connect(self._show_figures)
        self.chat.input.submitted.connect(self.send_or_stop)
        self.chat.send_button.clicked.connect(self.send_or_stop)
        self.chat.regen_button.clicked.connect(self.branches.regenerate)
        self.chat.compare_button.clicked.connect(self.open_compare)
        self.chat.think.toggled.connect(lambda on: self.cid and self.store.set_think(self.cid, on))
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
            ("Ctrl+R", self.branches.regenerate),
        ):
            QShortcut(QKeySequence(keys), self, activated=slot)
        # Ctrl+Q itself: the platform's QKeySequence.Quit is empty on Windows and offscreen
        self.addAction(QAction("Quit", self, shortcut=QKeySequence("Ctrl+Q"), triggered=self.close))
        self.set_busy(True)

    # --------------------------------------------------------------------------------- settings
    def refresh_settings(self) -> None:
        """The settings in force: the defaults, under the model's preset, under the user's own."""
        self.settings = effective(self.store.settings(), self.preset["values"])
        if self._model_arg:
            self.settings["model"] = self._model_arg

    def effective_settings(self) -> dict:
        """The app's settings, the conversation's overrides and its Think toggle."""
        if not self.cid:
            return dict(self.settings)
        conv = self.store.conversation(self.cid)
        return {**self.settings, **conv.overrides, "think": conv.think}

    def show_think(self) -> None:
        """The Think toggle, for a model whose template can turn thinking off."""
        on = self.store.conversation(self.cid).think if self.cid else True
        self.chat.show_think(bool((self.model_info or {}).get("think_switch")), on)

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
        self.refresh_settings()
        self.store.set_overrides(self.cid, overrides)
        self.show_sources()
        if "theme" in app_values:
            self.colors = theme.apply(QApplication.instance(), self.settings["theme"])
            self.chat.set_colors(self.colors)
        self.render_history()  # the theme, the tint
        if reload:
            self.stop()
            self.model_choice.load()

    def show_sources(self) -> None:
        self.settings_panel.show_sources(
            sampling_sources(self.store.settings(), self.preset["sources"])
        )

    def set_busy(self, busy: bool):
        self.progress.setVisible(busy)
        self.send_button.setEnabled(not busy or self.generating)

    # ----------------------------------------------------------------------------------- dialogs
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
        self.branches.editing_index = None
        self.chat.inline_error = ""
        self.messages = self.answer.messages(cid)
        if not (self.generating and self.answer.cid == cid):  # the figures of what is shown
            last = next((m for m in reversed(self.messages) if m.role == "assistant"), None)
            self.stats.show_answer(last.stats if last else {})
        conv = self.store.conversation(cid)
        self.title.setText(conv.title)
        self.settings_panel.show_values(self.settings, conv.overrides)
        self.show_think()
        self.conversations.refresh(cid)
        self.chat.attachments.refresh(self.cid)
        self.render_history()

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

    # -------------------------------------------------------------------------------- documents
    def attach(self, paths: list[str]) -> list[str]:
        """Attaches documents to the conversation; returns the names of those attached."""
        return self.chat.attachments.attach(paths)

    def attach_pasted(self) -> None:
        """Attaches the over-long message as a document and clears the input for a question."""
        if self.chat.attachments.attach_pasted():
            self.chat.inline_error = ""
            self.input.clear()
            self.status.setText("Attached the pasted text: ask your question about it")
            self.render_history()

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
        refusal = self.chat.attachments.too_long(text, self.model_info.get("context_length") or 0)
        if refusal:
            self.show_error(refusal, markup=True)
            return False
        try:
            self.branches.add_question(text)
        except sqlite3.Error as e:  # the window stays as it was: the text stays in the input
            self.show_error(f"Your message could not be saved ({e}), so it was not sent.")
            return False
        self.input.clear()
        self.start_answer()
        return True

    def stop(self):
        if self.generating:
            self.worker.request_stop()

    def start_answer(self, continued=None):
        """Starts an answer to the branch on screen (continued: see Answering.start)."""
        self.answering.start(self.cid, self.effective_settings(), continued)
        self.chat.set_stopping(True)
        self.messages = self.answer.messages(self.cid)
        self.render_history()
        self.stats.start()

    def _on_ended(self, reason: str, stats: dict, said: str, short: str):
        self.last_finish_reason = reason
        self.chat.set_stopping(False)
        self.chat.stream_ended(self.answer.last_mid)
        if stats:
            self.stats.update_stats(stats, final=True)
        elif reason == "error":
            self.stats.clear()  # an error's answer has no figures, not the previous answer's
        if self.cid == self.answer.cid:
            self.messages = self.answer.messages(self.cid)
            self.render_history()
        self.conversations.refresh()
        if said:
            self.show_error(said, short=short)

    # ------------------------------------------------------------------------------------- view
    def render_history(self):
        """The finished messages drawn again (the chat view adds the answer being written)."""
        self.chat.tint = self.settings["tint_speculation"]
        start = window_start(self.messages, self.store.conversation(self.cid).context_from)
        welcome = welcome_html(self.model_info, (self.model_info or {}).get("model") or
                               self.model_choice.name())  # fmt: skip
        server = (self.model_info or {}).get("server")
        self._show_stream()
        self.chat.set_history(self.messages, start, self.answer.mid, not server, welcome)

    def _show_stream(self) -> None:
        """The answer being written, on screen if its conversation is."""
        a, shown = self.answer, self.generating and self.answer.cid == self.cid
        fields = (len(self.messages) - 1, a.text, a.runs, a.thinking, a.stats, a.tool_calls)
        self.chat.stream = fields if shown and a.mid is not None else None
        self.chat.dirty = True

    def _show_figures(self) -> None:
        """The streamed answer's latest figures, as often as its text is drawn."""
        if self.answer.stats:
            self.stats.update_stats(self.answer.stats)

    def show_error(self, message: str, markup: bool = False, short: str = "") -> None:
        """Says an error at the end of the chat, and in the status bar as plain text (`short`
        there, if given)."""
        plain = html.unescape(re.sub(r"<[^>]+>", "", message)) if markup else message
        self.status.setText(f"Error: {short or plain}")
        self.chat.show_error(message if markup else html.escape(message))

    def _on_link(self, kind: str, arg: str):
        """A link in the chat: its kind, and its argument (a message's index, mostly)."""
        b, i = self.branches, int(arg) if arg.isdigit() else 0
        actions = {
            "copy-code": lambda: self.status.setText("Code copied"),
            "copy-msg": lambda: (QApplication.clipboard().setText(self.messages[i].content),
                                 self.status.setText("Message copied")),
            "edit-msg": lambda: self.generating or b.edit_message(i),
            "prev-version": lambda: b.switch_version(i, -1),
            "next-version": lambda: b.switch_version(i, 1),
            "fork-msg": lambda: b.fork_from(i),
            "continue": b.continue_answer,
            "example": lambda: self.send(EXAMPLES[i]),
            "attach-paste": self.attach_pasted,
        }  # fmt: skip
        actions.get(kind, lambda: None)()

    # ---------------------------------------------------------------------------------- closing
    def closeEvent(self, event):  # noqa: N802
        self.chat.frame.stop()
        self.model_choice.close()
        self.tool_use.close()
        super().closeEvent(event)

    # ---- drag and drop: a .gguf file or a model folder dropped on the window is imported where it
    # is and becomes the chat's model; documents (text, PDF, source files) are attached to the chat
    def dragEnterEvent(self, event):  # noqa: N802
        self._drop(event, take=False)

    def dropEvent(self, event):  # noqa: N802
        self._drop(event, take=True)

    def _drop(self, event, take: bool) -> None:
        from kwker.app.documents import dropped

        model, documents = dropped(event.mimeData())
        if model is None and not documents:
            return event.ignore()
        event.acceptProposedAction()
        if take and documents:
            self.attach(documents)
        elif take:
            self.model_choice.import_dropped(model)
