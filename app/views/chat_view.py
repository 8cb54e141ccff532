"""The chat in the middle of the window: the conversation's title, its messages, the tint legend,
the answer tools, the attachments bar and the input.

Drawing: the finished messages are rendered to HTML once (set_history); the frame timer redraws
only when something changed, adding the answer being streamed, at most every FRAME_MS, and less
often when a redraw is slow. The links in the chat (copy, edit, versions, fork, continue, the first
screen's examples, attach a paste) are emitted as (kind, argument) for the window to act on.

A thinking model's thinking is a dimmed block above its answer: open while it streams, closed on a
finished answer; its "Thinking" line opens and closes it. An answer's tool calls are blocks where
they were made in its text (closed; their "Tool call" line opens them on the arguments and the
result). The Think toggle (shown for a model whose
template can turn thinking off) is the conversation's: the window saves it."""

from __future__ import annotations

import html
import time

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtWidgets import (
    QApplication,
    QCheckBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from kwker.app import theme
from kwker.app.render import (
    SOURCE_NAMES,
    citations,
    markdown_html,
    message_html,
    segments,
    slice_runs,
    stats_line,
    thinking_about,
    thinking_html,
    tool_call_html,
)
from kwker.app.views.attachments_bar import AttachmentsBar
from kwker.app.views.widgets import ElidedLabel

# What the first screen offers to ask (a click sends it)
EXAMPLES = (
    "What is the capital of France?",
    "Write a haiku about autumn.",
    "Explain recursion with a short Python example.",
    "Give me three tips for a job interview.",
)
FRAME_MS = 33  # the streamed answer is redrawn at most this often
STREAM_ID = -1  # ChatView.thinking_shown's key of the answer being written
# ...and less often when a redraw is slow: at most this share of the GUI thread's time, so that
# redrawing a long conversation does not take CPU from the decoder's threads (they use every core)
REDRAW_SHARE = 0.05
EXPORTS = (
    ("md", "Markdown (the branch on screen)"),
    ("json", "JSON (every branch, the model, the settings, the statistics)"),
    ("html", "HTML page (to open in a browser)"),
)


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


def _button(text: str, accessible: str, tip: str = "") -> QPushButton:
    button = QPushButton(text)
    button.setAccessibleName(accessible)
    button.setToolTip(tip)
    return button


class ChatView(QWidget):
    link = Signal(str, str)  # a link in the chat: its kind and argument ("copy-msg", "3")
    export_requested = Signal(str, str)  # a file's path, a format of kwker.app.export.FORMATS
    drawn = Signal()  # a frame with the streamed answer was drawn

    def __init__(self, colors: dict[str, str], attachments: AttachmentsBar):
        super().__init__()
        self.colors = colors
        self.tint = False  # whether speculation's text is tinted (the setting)
        self.title = ElidedLabel("")
        self.title.setObjectName("big")
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.setAccessibleName("chat")
        self.view.anchorClicked.connect(self._on_link)
        self.legend = QLabel()
        self.legend.setObjectName("muted")
        self.legend.setAccessibleName("tint legend")
        self.legend.setWordWrap(True)  # a narrow window wraps it rather than growing
        self.input = ChatInput()
        self.input.setPlaceholderText("Message (Enter sends, Shift+Enter for a new line)")
        self.input.setAccessibleName("message input")
        self.input.setMaximumHeight(110)
        self.send_button = _button("Send", "send")
        self.send_button.setObjectName("send")
        self.regen_button = _button("Regenerate", "regenerate last answer")
        self.compare_button = _button(
            "Compare…", "exactness split view",
            "Answer a prompt by plain decoding and by speculation, side by side, and compare the "
            "tokens (a model on this machine only)",
        )  # fmt: skip
        self.export_button = _button("Export", "export the conversation")
        menu = QMenu(self.export_button)
        for fmt, label in EXPORTS:
            menu.addAction(label, lambda fmt=fmt: self._export_dialog(fmt))
        self.export_button.setMenu(menu)
        self.think = QCheckBox("Think")
        self.think.setAccessibleName("think before answering")
        self.think.setToolTip(
            "The model thinks before it answers (its thinking shows above the answer); off, it "
            "answers at once. This conversation's setting."
        )
        self.think.setVisible(False)  # until a model whose template has the switch is loaded
        self.attachments = attachments

        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.view, 1)
        layout.addWidget(self.legend)
        tools = QHBoxLayout()
        tools.addWidget(self.regen_button)
        tools.addWidget(self.compare_button)
        tools.addWidget(self.think)
        tools.addStretch(1)
        tools.addWidget(self.export_button)
        layout.addLayout(tools)
        layout.addWidget(self.attachments)
        row = QHBoxLayout()
        row.addWidget(self.input, 1)
        row.addWidget(self.send_button)
        layout.addLayout(row)

        self._history_html = ""  # the finished messages, rendered once
        self._history_blocks: list[str] = []  # their code blocks, for the Copy links
        self.code_blocks: list[str] = []  # the code blocks on screen, the streamed answer's too
        # the answer being written: (index, text, runs, thinking, figures, tool calls)
        self.stream: tuple[int, str, list, str, dict, list] | None = None
        # the tool calls opened, by (message id or STREAM_ID, the call's place in the answer)
        self.tools_shown: set[tuple[int, int]] = set()
        # whether a thinking block is open, by message id (STREAM_ID: the answer being written);
        # not in it: open while streaming, closed once finished
        self.thinking_shown: dict[int, bool] = {}
        self._history_args: tuple | None = None
        self._ids: list[int] = []  # the ids of the messages on screen, by index
        self.inline_error = ""  # HTML said at the end of the chat
        self.dirty = False
        self.frame = QTimer(self, interval=FRAME_MS)
        self.frame.timeout.connect(self.draw_frame)
        self.frame.start()
        self.set_colors(colors)

    def _export_dialog(self, fmt: str) -> None:
        from kwker.app.export import FORMATS

        name = f"{self.title.text()}.{fmt}"
        path, _ = QFileDialog.getSaveFileName(self, "Export", name, f"{FORMATS[fmt]} (*.{fmt})")
        if path:
            self.export_requested.emit(path, fmt)

    def set_colors(self, colors: dict[str, str]) -> None:
        self.colors = colors
        swatches = [
            f'<span style="background-color:{colors[source]}">&nbsp;&nbsp;&nbsp;</span> from {name}'
            for source, name in SOURCE_NAMES.items()
        ]
        self.legend.setText(
            "Tint: " + " &nbsp; ".join(swatches) + " (accepted proposals; the rest: one step each)"
        )

    def set_stopping(self, stopping: bool) -> None:
        """The send button as Stop (red, by the theme) while an answer is written."""
        self.send_button.setText("Stop" if stopping else "Send")
        self.send_button.setProperty("stop", stopping)
        self.send_button.style().polish(self.send_button)

    def answer_html(
        self, text: str, runs: list, blocks: list[str], calls: list = (), index: int = 0,
        key: int = STREAM_ID,
    ) -> str:  # fmt: skip
        """An answer's Markdown, tinted where its text came from speculation when the tint is on,
        with its tool calls (message `index`, `key` its id) where they were made."""
        if not calls:
            return markdown_html(text, blocks, runs if self.tint else None, self.colors)
        parts, j = [], 0
        for part in segments(text, calls):
            if isinstance(part, dict):
                shown = (key, j) in self.tools_shown
                parts.append(tool_call_html(f"{index}.{j}", part, shown))
                j += 1
            elif part[1] > part[0]:
                piece, piece_runs = text[part[0] : part[1]], slice_runs(runs, *part)
                parts.append(markdown_html(piece, blocks, piece_runs if self.tint else None,
                                           self.colors))  # fmt: skip
        return "".join(parts)

    def set_history(self, messages, start: int, skip_id, can_continue: bool, welcome: str) -> None:
        """Renders the finished `messages` (not the one being written, skip_id); `start`: the
        first the model sees (the rolling window); can_continue: a cut last answer gets its
        Continue link; welcome: the first screen, shown when there are no messages."""
        self._history_args = (messages, start, skip_id, can_continue, welcome)
        self._ids = [m.id for m in messages]
        # nothing to answer again, or to export, on an empty chat
        self.regen_button.setEnabled(bool(messages))
        self.export_button.setEnabled(bool(messages))
        blocks: list[str] = []
        parts = []
        for i, m in enumerate(messages):
            if m.id == skip_id:
                continue
            if i == start and start > 0:
                parts.append(
                    f'<p class="cut"><a name="cut"></a>⋯ The {start} messages above are no longer '
                    "in the model's context (rolling window): it answers from here on ⋯</p>"
                )
            cut = m.stats.get("finish_reason") == "length" and i == len(messages) - 1
            if m.role == "user":
                body = f"<p>{html.escape(m.content).replace(chr(10), '<br>')}</p>"
            else:
                body = self.answer_html(m.content, m.sources, blocks, m.tool_calls, i, m.id)
                if m.thinking:
                    shown = self.thinking_shown.get(m.id, False)
                    body = thinking_html(i, m.thinking, shown, thinking_about(m.stats)) + body
            parts.append(
                message_html(
                    i, m.role, body, editable=True, note=_note(m, cut),
                    stats=stats_line(m.stats) if m.role == "assistant" else "",
                    version=(m.version, m.versions), cites=citations(m.stats.get("documents", [])),
                    continue_link=cut and can_continue,
                )
            )  # fmt: skip
        self.legend.setVisible(self.tint)
        if not messages:
            parts.append(welcome)
        self._history_html = "".join(parts)
        self._history_blocks = blocks
        self.dirty = True
        self.draw_frame()

    def show_error(self, message_html: str) -> None:
        """Says an error at the end of the chat ("" clears it)."""
        self.inline_error = message_html
        self.dirty = True
        self.draw_frame()

    def draw_frame(self) -> None:
        if not self.dirty:
            return
        self.dirty = False
        blocks = list(self._history_blocks)
        body = self._history_html
        if self.stream is not None:
            index, text, runs, thinking, figures, calls = self.stream
            streamed = self.answer_html(text, runs, blocks, calls, index) if text or calls else ""
            if thinking:
                shown = self.thinking_shown.get(STREAM_ID, True)
                streamed = thinking_html(index, thinking, shown, thinking_about(figures)) + streamed
            streamed = streamed or "<p>…</p>"
            body += message_html(index, "assistant", streamed, editable=False, note="(writing)")
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
        if self.stream is not None:
            self.drawn.emit()

    def _on_link(self, url: QUrl) -> None:
        kind, _, arg = url.toString().partition(":")
        if kind == "copy-code":
            QApplication.clipboard().setText(self.code_blocks[int(arg)])
        if kind == "thinking":
            self.toggle_thinking(int(arg))
        if kind == "toolcall":
            self.toggle_tool_call(*(int(n) for n in arg.split(".")))
        self.link.emit(kind, arg)

    def show_think(self, switch: bool, on: bool) -> None:
        """The Think toggle: shown for a model whose template can turn thinking off (switch),
        checked as the conversation on screen has it."""
        self.think.setVisible(switch)
        self.think.setEnabled(switch)
        self.think.blockSignals(True)  # showing the saved value is no change to save
        self.think.setChecked(on)
        self.think.blockSignals(False)

    def stream_ended(self, mid: int | None) -> None:
        """The answer being written ended as message `mid`: its thinking stays open only if the
        user opened or closed it while it streamed (else it closes, as finished ones are)."""
        shown = self.thinking_shown.pop(STREAM_ID, None)
        if shown is not None and mid is not None:
            self.thinking_shown[mid] = shown
        opened = {(k, j) for k, j in self.tools_shown if k == STREAM_ID}
        self.tools_shown -= opened
        if mid is not None:
            self.tools_shown |= {(mid, j) for _, j in opened}

    def toggle_tool_call(self, index: int, j: int) -> None:
        """Opens or closes the j-th tool call of message `index` (the answer being written's
        too)."""
        streaming = self.stream is not None and self.stream[0] == index
        key = (STREAM_ID if streaming else self._ids[index], j)
        self.tools_shown ^= {key}
        if self._history_args is not None:
            self.set_history(*self._history_args)

    def toggle_thinking(self, index: int) -> None:
        """Opens or closes the thinking of message `index` (the answer being written's too)."""
        streaming = self.stream is not None and self.stream[0] == index
        key = STREAM_ID if streaming else self._ids[index]
        self.thinking_shown[key] = not self.thinking_shown.get(key, streaming)
        if self._history_args is not None:
            self.set_history(*self._history_args)


def _note(m, cut: bool) -> str:
    """What a finished message's header says of how it ended."""
    if cut:
        return f"Stopped at {m.stats.get('new_tokens', 0)} tokens"
    reason = m.stats.get("finish_reason")
    if reason in ("stopped", "cut"):
        return "(stopped)" if reason == "stopped" else "(cut midway)"
    if m.stats.get("error"):
        return "(ended by an error)"
    return "" if m.complete else "(interrupted)"


def welcome_html(info: dict | None, name: str) -> str:
    """The first screen of a conversation: what to do, and a few prompts to start from. info: the
    loaded model's (None while it loads); name: the model's name."""
    name = html.escape(name)
    if info and info.get("base"):
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
