"""The question before a tool runs: which server's tool the model wants to run, what it does, and
the arguments it would get, with three answers: allow once, always allow this tool (saved: it is
not asked about again), deny. Closing the dialog denies.

The dialog is window-modal but does not block (open(), not exec()): the generation worker waits
on its own thread for the answer (kwker.app.tool_calls.Approvals), and the window keeps drawing."""

from __future__ import annotations

import json

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
)

from kwker.app.tool_calls import ALLOW_ALWAYS, ALLOW_ONCE, DENY


class ApprovalDialog(QDialog):
    decided = Signal(str)  # ALLOW_ONCE, ALLOW_ALWAYS or DENY, once

    def __init__(self, call: dict, description: str, parent=None):
        super().__init__(parent)
        self.call = call
        self.setWindowTitle("Run a tool?")
        self.setAccessibleName("tool call approval")
        question = QLabel(
            f"The model wants to run <b>{_esc(call['tool'])}</b> of the tool server "
            f"<b>{_esc(call['server'])}</b>."
        )
        question.setWordWrap(True)
        about = QLabel(_esc(description) or "(The server gives no description of this tool.)")
        about.setWordWrap(True)
        about.setObjectName("muted")
        self.arguments = QPlainTextEdit(json.dumps(call["arguments"], indent=2, ensure_ascii=False))
        self.arguments.setReadOnly(True)
        self.arguments.setAccessibleName("the call's arguments")
        self.arguments.setMinimumHeight(120)
        self.once = QPushButton("Allow once")
        self.always = QPushButton("Always allow this tool")
        self.always.setToolTip(
            f"Runs {call['tool']} of {call['server']} from now on without asking (the Tools tab "
            "takes it back)"
        )
        self.deny = QPushButton("Deny")
        self.deny.setToolTip("The tool is not run; the model is told so and answers on")
        self.once.setDefault(True)
        for button, answer in ((self.once, ALLOW_ONCE), (self.always, ALLOW_ALWAYS),
                               (self.deny, DENY)):  # fmt: skip
            button.clicked.connect(lambda _=False, a=answer: self._decide(a))
        self._answered = False

        layout = QVBoxLayout(self)
        layout.addWidget(question)
        layout.addWidget(about)
        layout.addWidget(QLabel("With these arguments:"))
        layout.addWidget(self.arguments, 1)
        row = QHBoxLayout()
        row.addWidget(self.deny)
        row.addStretch(1)
        row.addWidget(self.always)
        row.addWidget(self.once)
        layout.addLayout(row)
        self.resize(520, 340)

    def _decide(self, answer: str) -> None:
        if not self._answered:
            self._answered = True
            self.decided.emit(answer)
        self.accept()

    def done(self, result: int) -> None:  # closed by Esc or the title bar: denied
        if not self._answered:
            self._answered = True
            self.decided.emit(DENY)
        super().done(result)


def _esc(text: str) -> str:
    import html

    return html.escape(text)
