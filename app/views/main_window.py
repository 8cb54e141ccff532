"""The chat window: conversations on the left, the chat in the middle, statistics and settings on the right.

Threading: the GenerationWorker lives on its own QThread and is reached through queued signals; Stop is a flag the
worker checks between tokens. Only this (GUI) thread touches widgets, item models and the store. Streamed text is
saved as it arrives and drawn at most once per frame."""

from __future__ import annotations

import html
import re
import sqlite3
import time
from pathlib import Path

from PySide6.QtCore import Qt, QThread, QTimer, QUrl, Signal
from PySide6.QtGui import QAction, QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListView,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QTextBrowser,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from kwker.app import theme
from kwker.app.conversation_model import ConversationListModel, IdRole
from kwker.app.render import (
    SOURCE_NAMES,
    add_run,
    citations,
    markdown_html,
    message_html,
    stats_line,
)
from kwker.app.saving import AnswerWriter
from kwker.app.settings import (
    LOAD_KEYS,
    effective,
    load_options,
    sampling_sources,
    user_values,
)
from kwker.app.store import Store
from kwker.app.views.settings_panel import SettingsPanel, split_values
from kwker.app.views.stats_panel import StatsPanel
from kwker.app.views.widgets import ElidedLabel
from kwker.app.worker import GenerationWorker

# What the first screen offers to ask (a click sends it)
EXAMPLES = (
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain recursion with a short Python example.",
    "Give me three tips for a job interview.",
)
SIDE_PANEL_WIDTH = 340  # the statistics and settings tabs, unless the screen is narrow
SIDE_PANEL_MIN_WIDTH = 260
FRAME_MS = 33  # the streamed answer is redrawn at most this often
REDRAW_SHARE = 0.05  # ...and less often when a redraw is slow: at most this share of the GUI thread's time, so that
# redrawing a long conversation does not take CPU from the decoder's threads (they use every core)


def window_start(messages, context_from: int) -> int:
    """The index of the first of `messages` the model sees: the first whose id is at least
    context_from (the rolling window's first message id; 0: all of them)."""
    if context_from <= 0:
        return 0
    return next((i for i, m in enumerate(messages) if m.id >= context_from), 0)


class ChatInput(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line."""

    submitted = Signal()

    def keyPressEvent(self, event):  # noqa: N802
        if (
            event.key() in (Qt.Key_Return, Qt.Key_Enter)
            and not event.modifiers() & Qt.ShiftModifier
        ):
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class MainWindow(QMainWindow):
    request_load = Signal(dict)
    # messages, settings, the window's start so far, the documents ({name, text})
    request_generate = Signal(list, dict, int, list)

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
        self.request_generate.connect(self.worker.generate)
        self.worker.loading.connect(self._on_loading)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.load_failed.connect(self._on_load_failed)
        self.worker.window.connect(self._on_window)
        self.worker.chunk.connect(self._on_chunk)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)
        self.worker.compare_finished.connect(lambda: setattr(self, "comparing", False))
        self.thread_.start()

        self.model_info: dict | None = None
        self.cid: int | None = None
        self.messages = []
        self.generating = False
        self.comparing = False  # the exactness split view's two runs hold the worker
        self.stream_cid = self.stream_mid = None
        self.stream_history_ids: list[int] = []  # the ids of the messages the answer was asked from
        self.stream_text = ""
        self.stream_runs: list = []  # which runs of stream_text came from speculation (add_run)
        self.stream_stats: dict = {}
        self.editing_index: int | None = None
        self.code_blocks: list[str] = []
        self._history_html = ""
        self._history_blocks: list[str] = []
        self._dirty = False
        self.last_finish_reason = None
        self.writer = AnswerWriter(store)  # the streamed answer's writes, kept when refused
        self.inline_error = ""  # said at the end of the chat, in words, until the next send
        self.pasted = ""  # an over-long message the user may attach as a document instead

        self._build()
        self._enable_drops()
        self.frame = QTimer(self)
        self.frame.setInterval(FRAME_MS)
        self.frame.timeout.connect(self._draw_frame)
        self.frame.start()
        self.retry = QTimer(self, interval=2000)  # writes the store refused, tried again
        self.retry.timeout.connect(self._retry_saves)
        self.retry.start()

        convs = self.store.conversations()
        self.open_conversation(convs[0].id if convs else self.store.new_conversation().id)
        self._load_model()

    # ------------------------------------------------------------------------------------------------- layout
    def _build(self):
        self.conv_model = ConversationListModel(self.store, self)
        self.search = QLineEdit(placeholderText="Search chats")
        self.search.setAccessibleName("search conversations")
        self.search.textChanged.connect(
            lambda t: (self.conv_model.reload(t), self._select_current())
        )
        self.conv_list = QListView()
        self.conv_list.setModel(self.conv_model)
        self.conv_list.setAccessibleName("conversations")
        self.conv_list.setTextElideMode(Qt.ElideRight)
        self.conv_list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.conv_list.clicked.connect(lambda idx: self.open_conversation(idx.data(IdRole)))
        models_btn = QPushButton("Models…")
        models_btn.setAccessibleName("models")
        models_btn.clicked.connect(self.open_models)
        about_btn = QPushButton("About")
        about_btn.setAccessibleName("about Kwker and its licenses")
        about_btn.clicked.connect(self.open_about)
        new_btn = QPushButton("New chat")
        new_btn.setAccessibleName("new chat")
        new_btn.clicked.connect(self.new_chat)
        rename_btn = QPushButton("Rename")
        rename_btn.clicked.connect(self._rename_current)
        delete_btn = QPushButton("Delete")
        delete_btn.clicked.connect(self.delete_current)
        side = QWidget()
        sl = QVBoxLayout(side)
        sl.addWidget(new_btn)
        sl.addWidget(self.search)
        sl.addWidget(self.conv_list, 1)
        models_row = QHBoxLayout()
        models_row.addWidget(models_btn, 1)
        models_row.addWidget(about_btn)
        sl.addLayout(models_row)
        row = QHBoxLayout()
        row.addWidget(rename_btn)
        row.addWidget(delete_btn)
        sl.addLayout(row)

        self.title = ElidedLabel("")
        self.title.setObjectName("big")
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.setAccessibleName("chat")
        self.view.anchorClicked.connect(self._on_link)
        self.legend = QLabel(self._legend_html())
        self.legend.setObjectName("muted")
        self.legend.setAccessibleName("tint legend")
        self.legend.setWordWrap(True)  # a narrow window wraps it rather than growing
        self.input = ChatInput()
        self.input.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
        self.input.setAccessibleName("message input")
        self.input.setMaximumHeight(110)
        self.input.submitted.connect(self.send_or_stop)
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("send")
        self.send_button.setAccessibleName("send")
        self.send_button.clicked.connect(self.send_or_stop)
        self.regen_button = QPushButton("Regenerate")
        self.regen_button.setAccessibleName("regenerate last answer")
        self.regen_button.clicked.connect(self.regenerate)
        self.compare_button = QPushButton("Compare…")
        self.compare_button.setAccessibleName("exactness split view")
        self.compare_button.setToolTip(
            "Answer a prompt by plain decoding and by speculation, side by side, and compare the "
            "tokens (a model on this machine only)"
        )
        self.compare_button.clicked.connect(self.open_compare)
        self.export_button = QPushButton("Export")
        self.export_button.setAccessibleName("export the conversation")
        export_menu = QMenu(self.export_button)
        for fmt, label in (
            ("md", "Markdown (the branch on screen)"),
            ("json", "JSON (every branch, the model, the settings, the statistics)"),
            ("html", "HTML page (to open in a browser)"),
        ):
            export_menu.addAction(label, lambda fmt=fmt: self._export_dialog(fmt))
        self.export_button.setMenu(export_menu)
        center = QWidget()
        cl = QVBoxLayout(center)
        cl.addWidget(self.title)
        cl.addWidget(self.view, 1)
        cl.addWidget(self.legend)
        tools = QHBoxLayout()
        tools.addWidget(self.regen_button)
        tools.addWidget(self.compare_button)
        tools.addStretch(1)
        tools.addWidget(self.export_button)
        cl.addLayout(tools)
        self.attach_button = QPushButton("Attach…")
        self.attach_button.setAccessibleName("attach documents")
        self.attach_button.setToolTip(
            "Text, Markdown, PDF and source files: the answers use them (or drop them here)"
        )
        self.attach_button.clicked.connect(self._attach_dialog)
        self.attachments_row = QHBoxLayout()
        docs = QHBoxLayout()
        docs.addWidget(self.attach_button)
        docs.addLayout(self.attachments_row)
        docs.addStretch(1)
        cl.addLayout(docs)
        inrow = QHBoxLayout()
        inrow.addWidget(self.input, 1)
        inrow.addWidget(self.send_button)
        cl.addLayout(inrow)

        split = QSplitter()
        split.addWidget(side)
        split.addWidget(center)
        split.setStretchFactor(1, 1)
        split.setSizes([250, 800])
        self.setCentralWidget(split)

        self.stats = StatsPanel()
        self.settings_panel = SettingsPanel()
        self.settings_panel.changed.connect(self.apply_settings)
        # The settings are a long form: they scroll, so that the window fits a laptop's screen
        self.settings_tab = QScrollArea()
        self.settings_tab.setWidget(self.settings_panel)
        self.settings_tab.setWidgetResizable(True)
        self.settings_tab.setFrameShape(QScrollArea.NoFrame)
        self.settings_tab.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.stats, "Statistics")
        self.tabs.addTab(self.settings_tab, "Settings")
        dock = QDockWidget("", self)
        dock.setObjectName("side-panel")
        dock.setTitleBarWidget(QWidget())
        dock.setWidget(self.tabs)
        dock.setFeatures(QDockWidget.NoDockWidgetFeatures)
        # a bounded width: the side panel's figures change while an answer streams, and a panel
        # that followed its longest line squeezed the chat mid-answer; its rows wrap instead
        self.tabs.setMinimumWidth(SIDE_PANEL_MIN_WIDTH)
        self.tabs.setMaximumWidth(SIDE_PANEL_WIDTH)
        self.addDockWidget(Qt.RightDockWidgetArea, dock)
        self.resizeDocks([dock], [SIDE_PANEL_WIDTH], Qt.Horizontal)

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
        quit_action = QAction("Quit", self, shortcut=QKeySequence("Ctrl+Q"), triggered=self.close)
        self.addAction(quit_action)
        self._set_busy(True)

    # ---------------------------------------------------------------------------------------------- settings
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
            self.legend.setText(self._legend_html())
        self._render_history()  # the theme, the tint
        if reload:
            self.stop()
            self._load_model()

    def _show_sources(self) -> None:
        self.settings_panel.show_sources(
            sampling_sources(self.store.settings(), self.preset["sources"])
        )

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
        self.model_info = info
        self.preset = info.get("preset") or {"values": {}, "sources": {}}
        self._refresh_settings()
        self.settings_panel.show_values(self.settings, self.store.conversation(self.cid).overrides)
        self._show_sources()
        self._set_busy(False)
        self.stats.set_model(info)
        if info["server"]:
            self.status.setText(f"Ready: {info['model']} on {info['server']}")
        else:
            self.status.setText(
                f"Ready: {info['model']} ({info['precision']}, {info['context_length']} tokens of "
                "context)"
            )
        self.settings_panel.set_draft_choices(self._draft_candidates())
        # a server decodes as it does: there is no plain run of it to set beside speculation
        self.compare_button.setVisible(not info["server"])
        self._show_attachments()  # whether they fit this model's context
        if not self.messages:  # the first screen names the model, and whether it is a base one
            self._render_history()
        self.input.setFocus()  # ready: the next keystrokes are the user's message

    def _fit_to_screen(self, width: int, height: int):
        """Opens at width x height, or at the screen's available size if that is smaller."""
        screen = self.screen() or QApplication.primaryScreen()
        if screen is not None:
            room = screen.availableGeometry()
            width, height = min(width, room.width()), min(height, room.height())
        self.resize(width, height)

    def _on_load_failed(self, msg: str):
        self._set_busy(False)
        self.send_button.setEnabled(False)
        if self.settings["server_url"]:  # the picker's Servers tab connects again
            self.status.setText(f"Could not use {self._model_name()}: {msg}")
        else:
            self.status.setText(f"Could not load the model: {msg}")
            self.tabs.setCurrentWidget(self.settings_tab)

    def open_models(self):
        """The model picker; choosing a model or a draft reloads with it."""
        from kwker.app.views.model_picker import ModelPicker

        self.picker = ModelPicker(
            self.settings["model"], self,
            precision=self.settings["precision"], context=int(self.settings["context_length"]),
            servers=self.settings["servers"],
            server=(self.settings["server_url"], self.settings["server_model"]),
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

    def _switch_model(self, **changes):
        self.apply_settings({**self.settings_panel.values(), **changes}, conversation_only=False)
        self.settings_panel.show_values(self.settings, self.store.conversation(self.cid).overrides)

    def _draft_candidates(self) -> list[str]:
        """Models we know share the loaded model's tokenizer (same family of the catalog)."""
        from kwker.models.catalog import same_tokenizer

        return [] if self.settings["server_url"] else same_tokenizer(self.settings["model"])

    # ------------------------------------------------------------------------------------------ conversations
    def open_conversation(self, cid: int):
        self.cid = cid
        self.editing_index = None
        self.inline_error = ""
        self.messages = self._messages(cid)
        if not (self.generating and self.stream_cid == cid):  # the figures of what is shown
            last = next((m for m in reversed(self.messages) if m.role == "assistant"), None)
            self.stats.show_answer(last.stats if last else {})
        conv = self.store.conversation(cid)
        self.title.setText(conv.title)
        self.settings_panel.show_values(self.settings, conv.overrides)
        self.conv_model.reload()
        self._select_current()
        self._show_attachments()
        self._render_history()

    def _select_current(self):
        row = self.conv_model.row_of(self.cid)
        if row >= 0:
            self.conv_list.setCurrentIndex(self.conv_model.index(row))

    def new_chat(self):
        self.open_conversation(self.store.new_conversation().id)
        self.input.setFocus()

    def _rename_current(self):
        row = self.conv_model.row_of(self.cid)
        if row >= 0:
            self.conv_list.edit(self.conv_model.index(row))

    def delete_current(self, confirm: bool = True):
        if (
            confirm
            and QMessageBox.question(self, "Delete chat", f"Delete “{self.title.text()}”?")
            != QMessageBox.Yes
        ):
            return
        if self.generating and self.stream_cid == self.cid:
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

        path, _ = QFileDialog.getSaveFileName(
            self, "Export", f"{self.title.text()}.{fmt}", f"{FORMATS[fmt]} (*.{fmt})"
        )
        if path:
            self.export_to(path, fmt)

    # -------------------------------------------------------------------------------------------- documents
    def attach(self, paths: list[str]) -> list[str]:
        """Attaches documents to the conversation (kwker.app.documents reads them); a file that
        cannot be read is named in the status bar, the others are attached. Returns the names of
        the attached."""
        from kwker.app.documents import DocumentError, read_document

        done, refused = [], []
        for path in paths:
            try:
                text = read_document(path)
            except (DocumentError, OSError) as e:
                refused.append(str(e))
                continue
            self.store.add_attachment(self.cid, Path(path).name, text, self._count_tokens(text))
            done.append(Path(path).name)
        self._show_attachments()
        if refused:
            self.status.setText("Not attached: " + "; ".join(refused))
        elif done:
            self.status.setText(f"Attached {', '.join(done)}: the next answers use it")
        return done

    def _count_tokens(self, text: str) -> int:
        """text's length in the loaded model's tokens (4 characters a token for a server's, or
        before a model loaded: an estimate, shown as one)."""
        tokenizer = self.worker.tokenizer
        if tokenizer is None:
            return -(len(text) // 4 + 1)  # negative: an estimate
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    def _attach_dialog(self):
        paths, _ = QFileDialog.getOpenFileNames(
            self, "Attach documents", "",
            "Documents (*.txt *.md *.pdf *.py *.c *.cpp *.h *.js *.ts *.rs *.go *.java *.json "
            "*.yaml *.toml *.html *.css *.sh);;All files (*)",
        )  # fmt: skip
        if paths:
            self.attach(paths)

    def _show_attachments(self):
        """One chip per attached document: its name, how many tokens it takes (and whether it
        can go in whole), and a button that detaches it."""
        while self.attachments_row.count():
            widget = self.attachments_row.takeAt(0).widget()
            widget.hide()
            widget.deleteLater()
        attachments = self.store.attachments(self.cid)
        context = (self.model_info or {}).get("context_length") or 0
        by_parts = bool(context) and sum(abs(a.tokens) for a in attachments) > self._prompt_room(
            context
        )
        for a in attachments:
            chip = QLabel(f"{a.name} · {a.about}" + (" · by parts" if by_parts else ""))
            chip.setTextFormat(Qt.PlainText)
            chip.setObjectName("chip")
            chip.setAccessibleName(f"attached {a.name}, {a.about}")
            chip.setToolTip(
                f"The documents are larger than the context of {context:,} tokens: each answer "
                "gets the parts that match the question best (BM25), and cites them"
                if by_parts
                else "The whole text goes into each answer's prompt while the chat leaves room; "
                "else the parts that match the question best"
            )
            # a tool button: a push button's padding in the theme leaves no room for the ×
            remove = QToolButton(text="×")  # in every font (an emoji's cross is not)
            remove.setAccessibleName(f"detach {a.name}")
            remove.setToolTip(f"Detach {a.name}")
            remove.clicked.connect(lambda _=False, aid=a.id: self.detach(aid))
            self.attachments_row.addWidget(chip)
            self.attachments_row.addWidget(remove)

    def detach(self, aid: int) -> None:
        self.store.remove_attachment(aid)
        self._show_attachments()

    # --------------------------------------------------------------------------------------------- generation
    def send_or_stop(self):
        if self.generating:
            self.stop()
        else:
            self.send(self.input.toPlainText())

    def send(self, text: str) -> bool:
        text = text.strip()
        if not text or self.generating or self.comparing or self.model_info is None:
            return False
        self.inline_error = ""
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

    def _too_long(self, text: str) -> bool:
        """Whether text cannot fit the context beside an answer: then it is not sent, and the chat
        offers to attach it as a document (whose parts the answers quote) instead."""
        context = self.model_info.get("context_length") or 0
        if not context or len(text) < context:  # a token takes at least a character
            return False
        tokens = self._count_tokens(text)
        if abs(tokens) <= self._prompt_room(context):
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

    def _prompt_room(self, context: int) -> int:
        """The tokens a prompt may take in `context`, the answer's room kept free."""
        from kwker.app.context_window import answer_reserve

        max_new = int(self.effective_settings()["max_new_tokens"])
        return context - answer_reserve(context, max_new)

    def attach_pasted(self) -> None:
        """Attaches the over-long message as a document and clears the input for a question."""
        if not self.pasted:
            return
        tokens = self._count_tokens(self.pasted)
        self.store.add_attachment(self.cid, "Pasted text.txt", self.pasted, tokens)
        self.pasted, self.inline_error = "", ""
        self.input.clear()
        self._show_attachments()
        self.status.setText("Attached the pasted text: ask your question about it")
        self._render_history()

    def _show_error(self, message: str, markup: bool = False, short: str = "") -> None:
        """Says an error at the end of the chat, and in the status bar as plain text (`short`
        there, if given)."""
        self.inline_error = message if markup else html.escape(message)
        plain = html.unescape(re.sub(r"<[^>]+>", "", message)) if markup else message
        self.status.setText(f"Error: {short or plain}")
        self._dirty = True
        self._draw_frame()

    def _retry_saves(self) -> None:
        if self.writer.pending and self.writer.flush():
            self.status.setText("Saved what could not be saved before")

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
        self.inline_error = ""
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
        if self.generating and self.stream_cid == self.cid:
            return  # the answer being written hangs off the branch on screen
        self.store.switch_version(self.cid, self.messages[index].id, step)
        self.open_conversation(self.cid)

    def fork_from(self, index: int) -> int:
        """A new conversation with this one's messages up to `index`; it is opened. Returns its id."""
        conv = self.store.fork(self.cid, self.messages[index].id)
        self.open_conversation(conv.id)
        self.status.setText(f"Forked into “{conv.title}”")
        return conv.id

    def stop(self):
        if self.generating:
            self.worker.request_stop()

    def _start_answer(self, continued=None):
        """Starts an answer to the branch on screen; continued: its last message, an answer cut at
        max_new_tokens, which the model goes on writing (kwker.app.backends)."""
        messages = self.store.messages(self.cid)
        history = [{"role": m.role, "content": m.content} for m in messages]
        start = window_start(messages, self.store.conversation(self.cid).context_from)
        self.stream_history_ids = [m.id for m in messages]  # what the worker's window indexes
        self.stream_cid = self.cid
        if continued is not None:
            self.stream_mid = continued.id
            self.stream_text, self.stream_runs = continued.content, list(continued.sources)
            self.writer.write(continued.id, continued.content, complete=False)
        else:
            self.stream_mid = self.store.add_message(self.cid, "assistant", "", complete=False).id
            self.stream_text, self.stream_runs = "", []
        self.stream_stats = {}
        self.generating = True
        self.send_button.setText("Stop")
        self.send_button.setProperty("stop", True)
        self.send_button.style().polish(self.send_button)
        self.messages = self._messages(self.cid)
        self._render_history()
        self.stats.start()
        documents = [{"name": a.name, "text": a.text} for a in self.store.attachments(self.cid)]
        self.request_generate.emit(history, self.effective_settings(), start, documents)

    def _on_window(self, start: int):
        """The worker's rolling window starts at message `start` of the answered history."""
        mid = self.stream_history_ids[start] if start > 0 else 0
        if mid != self.store.conversation(self.stream_cid).context_from:
            self.store.set_context_from(self.stream_cid, mid)
            if self.cid == self.stream_cid:
                self._render_history()

    def _on_chunk(self, text: str, token: int, source: str, stats: dict):
        if self.stream_mid is None:
            return
        self.stream_text += text
        add_run(self.stream_runs, text, source)
        if stats:
            self.stream_stats = stats
        # saved as it arrives, with which of it came from speculation
        self.writer.write(self.stream_mid, self.stream_text, sources=self.stream_runs)
        self._dirty = True

    def _on_finished(self, reason: str, stats: dict):
        if reason == "cut" and not self.stream_text:  # cut before a word arrived: nothing to keep
            self._on_failed(stats["error"])
            return
        saved = self.writer.write(
            self.stream_mid, self.stream_text, now=True, sources=self.stream_runs,
            stats={**stats, "finish_reason": reason}, complete=True,
        )  # fmt: skip
        self._end_answer(reason, stats)
        if reason == "cut":
            self._show_error(f"{stats['error']} The text that arrived is kept.")
        if not saved:
            self._unsaved()

    def _unsaved(self) -> None:
        self._show_error(
            f"This answer could not be saved: {self.writer.error}. It stays on screen, and Kwker "
            "saves it as soon as the disk takes it again."
        )

    def _on_failed(self, msg: str):
        saved = True
        if self.stream_mid is not None and not self.stream_text:
            try:
                self.store.delete_message(self.stream_mid)  # nothing was written: no empty answer
                self.writer.pending.pop(self.stream_mid, None)
            except sqlite3.Error:
                saved = False
        elif self.stream_mid is not None:
            saved = self.writer.write(
                self.stream_mid, self.stream_text, now=True, stats={"error": msg}, complete=True
            )
        self._end_answer("error", {})
        self.stats.clear()  # an error's answer has no figures: not the previous answer's either
        self._show_error(f"The answer failed: {msg}", short=msg)
        if not saved:
            self._unsaved()

    def _end_answer(self, reason: str, stats: dict):
        self.generating = False
        self.last_finish_reason = reason
        self.stream_mid = None
        self.send_button.setText("Send")
        self.send_button.setProperty("stop", False)
        self.send_button.style().polish(self.send_button)
        if stats:
            self.stats.update_stats(stats, final=True)
        if self.cid == self.stream_cid:
            self.messages = self._messages(self.cid)
            self._render_history()
        self.conv_model.reload()
        self._select_current()

    def _messages(self, cid: int) -> list:
        """The branch on screen as stored, with what the store could not take yet (writer)."""
        messages = self.store.messages(cid)
        for m in messages:
            for key, value in self.writer.pending.get(m.id, {}).items():
                setattr(m, key, value)
        return messages

    # -------------------------------------------------------------------------------------------------- view
    def _answer_html(self, text: str, runs: list, blocks: list[str]) -> str:
        """An answer's Markdown, tinted where its text came from speculation when the tint is on."""
        tinted = self.settings["tint_speculation"]
        return markdown_html(text, blocks, runs if tinted else None, self.colors)

    def _message_body(self, m, blocks) -> str:
        if m.role == "user":
            return f"<p>{html.escape(m.content).replace(chr(10), '<br>')}</p>"
        return self._answer_html(m.content, m.sources, blocks)

    def _render_history(self):
        """Renders the finished messages once; frames only redraw the answer being streamed."""
        blocks: list[str] = []
        parts = []
        start = window_start(self.messages, self.store.conversation(self.cid).context_from)
        for i, m in enumerate(self.messages):
            if m.id == self.stream_mid:
                continue
            if i == start and start > 0:
                parts.append(
                    f'<p class="cut"><a name="cut"></a>⋯ The {start} messages above are no longer '
                    "in the model's context (rolling window): it answers from here on ⋯</p>"
                )
            note = "" if m.complete else "(interrupted)"
            cut = m.stats.get("finish_reason") == "length" and i == len(self.messages) - 1
            if cut:
                note = f"Stopped at {m.stats.get('new_tokens', 0)} tokens"
            elif m.stats.get("finish_reason") == "stopped":
                note = "(stopped)"
            elif m.stats.get("finish_reason") == "cut":
                note = "(cut midway)"
            elif m.stats.get("error"):
                note = "(ended by an error)"
            parts.append(
                message_html(
                    i, m.role, self._message_body(m, blocks), editable=True,
                    note=note, stats=stats_line(m.stats) if m.role == "assistant" else "",
                    version=(m.version, m.versions), cites=citations(m.stats.get("documents", [])),
                    continue_link=cut and not (self.model_info or {}).get("server"),
                )
            )  # fmt: skip
        self.legend.setVisible(self.settings["tint_speculation"])
        if not self.messages:
            parts.append(self._welcome_html())
        self._history_html = "".join(parts)
        self._history_blocks = blocks
        self._dirty = True
        self._draw_frame()

    def _draw_frame(self):
        if not self._dirty:
            return
        self._dirty = False
        blocks = list(self._history_blocks)
        body = self._history_html
        if self.generating and self.stream_cid == self.cid:
            streamed = (
                self._answer_html(self.stream_text, self.stream_runs, blocks)
                if self.stream_text
                else "<p>…</p>"
            )
            body += message_html(
                len(self.messages) - 1, "assistant", streamed, editable=False, note="(writing)"
            )
            if self.stream_stats:
                self.stats.update_stats(self.stream_stats)
        if self.inline_error:
            body += f'<div class="error"><b>⚠</b> {self.inline_error}</div>'
        self.code_blocks = blocks
        bar = self.view.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        started = time.perf_counter()
        self.view.document().setDefaultStyleSheet(theme.chat_css(self.colors))
        self.view.setHtml(f"<html><body>{body}</body></html>")
        if at_bottom:
            bar.setValue(bar.maximum())
        spent_ms = (time.perf_counter() - started) * 1000
        self.frame.setInterval(max(FRAME_MS, round(spent_ms / REDRAW_SHARE)))

    def _on_link(self, url: QUrl):
        kind, _, arg = url.toString().partition(":")
        if kind == "copy-code":
            QApplication.clipboard().setText(self.code_blocks[int(arg)])
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

    def _welcome_html(self) -> str:
        """The first screen of a conversation: what to do, and a few prompts to start from."""
        info = self.model_info or {}
        name = html.escape(info.get("model") or self._model_name())
        if info.get("base"):
            about = (
                f"<b>{name}</b> is a base model: it continues text rather than answering "
                "questions. Models… offers instruct models that chat."
            )
        elif info:
            where = "on " + html.escape(info["server"]) if info["server"] else "on this computer"
            about = f"<b>{name}</b> answers {where}."
        else:
            about = f"Loading <b>{name}</b>…"
        examples = "".join(
            f'<li><a href="example:{i}">{html.escape(q)}</a></li>' for i, q in enumerate(EXAMPLES)
        )
        return (
            '<div class="welcome"><h2>Ask anything</h2>'
            f"<p>{about} Type below and press Enter, or start from one of these:</p>"
            f"<ul>{examples}</ul><p>Attach… adds documents the answers use; Models… picks "
            "another model.</p></div>"
        )

    def edit_message(self, index: int):
        """Puts a user message back in the input; sending makes a new version of it, a branch of
        the conversation from there (the old one is kept)."""
        self.editing_index = index
        self.input.setPlainText(self.messages[index].content)
        self.input.setFocus()
        self.status.setText(
            "Editing a message: Send branches off there (the old branch stays a version of it)"
        )

    def _legend_html(self) -> str:
        swatches = [
            f'<span style="background-color:{self.colors[source]}">&nbsp;&nbsp;&nbsp;</span> '
            f"from {name}"
            for source, name in SOURCE_NAMES.items()
        ]
        return (
            "Tint: " + " &nbsp; ".join(swatches) + " (accepted proposals; the rest: one step each)"
        )

    # ------------------------------------------------------------------------------------------------ closing
    def closeEvent(self, event):  # noqa: N802
        self.stop()
        self.frame.stop()
        self.thread_.quit()
        self.thread_.wait()
        super().closeEvent(event)

    # ---- drag and drop: a .gguf file or a model folder dropped on the window is imported where it
    # is and becomes the chat's model; documents (text, PDF, source files) are attached to the chat
    def _enable_drops(self):
        self.setAcceptDrops(True)

    @staticmethod
    def _dropped_paths(event) -> list[Path]:
        if not event.mimeData().hasUrls():
            return []
        return [Path(u.toLocalFile()) for u in event.mimeData().urls() if u.isLocalFile()]

    @classmethod
    def _dropped_model(cls, event) -> str | None:
        """The first dropped local path that may be a model (a .gguf file or a folder)."""
        for path in cls._dropped_paths(event):
            if path.is_dir() or path.suffix.lower() == ".gguf":
                return str(path)
        return None

    @classmethod
    def _dropped_documents(cls, event) -> list[str]:
        from kwker.app.documents import attachable

        return [str(p) for p in cls._dropped_paths(event) if p.is_file() and attachable(p)]

    def dragEnterEvent(self, event):  # noqa: N802
        if self._dropped_model(event) is not None or self._dropped_documents(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dropEvent(self, event):  # noqa: N802
        from kwker.app.views.model_picker import describe_error, import_model

        documents = self._dropped_documents(event)
        if documents:
            event.acceptProposedAction()
            self.attach(documents)
            return
        path = self._dropped_model(event)
        if path is None:
            event.ignore()
            return
        event.acceptProposedAction()
        try:
            entry = import_model(path)
        except Exception as e:  # noqa: BLE001  (any failure is said in the window, nothing changes)
            self.status.setText(f"Cannot import {path}: {describe_error(e)}")
            return
        self._switch_model(model=entry["path"], draft_model="", server_url="")
