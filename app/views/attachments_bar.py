"""The chat's attachments bar: an Attach… button and one chip per attached document, with its
size in tokens, whether the answers get it whole or by parts, and a button that detaches it. It
attaches (kwker.app.documents reads the files) and detaches in the store itself."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QToolButton,
    QWidget,
)

DOCUMENT_FILTER = (
    "Documents (*.txt *.md *.pdf *.py *.c *.cpp *.h *.js *.ts *.rs *.go *.java *.json *.yaml "
    "*.toml *.html *.css *.sh);;All files (*)"
)


class AttachmentsBar(QWidget):
    said = Signal(str)  # what attaching did, for the status bar

    def __init__(self, store, count_tokens, prompt_room):
        """count_tokens(text): its length in the model's tokens (negative: an estimate);
        prompt_room(): the tokens a prompt may take, 0 before a model is loaded."""
        super().__init__()
        self.store, self.count_tokens, self.prompt_room = store, count_tokens, prompt_room
        self.cid: int | None = None  # the conversation shown
        self.pasted = ""  # an over-long message the user may attach as a document instead
        self.attach_button = QPushButton("Attach…")
        self.attach_button.setAccessibleName("attach documents")
        self.attach_button.setToolTip(
            "Text, Markdown, PDF and source files: the answers use them (or drop them here)"
        )
        self.attach_button.clicked.connect(self._dialog)
        self.row = QHBoxLayout()  # the chips: a label and a × button per document
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.attach_button)
        layout.addLayout(self.row)
        layout.addStretch(1)

    def attach(self, paths: list[str]) -> list[str]:
        """Attaches documents to the conversation; a file that cannot be read is said, the others
        are attached. Returns the names of the attached."""
        from kwker.app.documents import DocumentError, read_document

        done, refused = [], []
        for path in paths:
            try:
                text = read_document(path)
            except (DocumentError, OSError) as e:
                refused.append(str(e))
                continue
            self.store.add_attachment(self.cid, Path(path).name, text, self.count_tokens(text))
            done.append(Path(path).name)
        self.refresh()
        if refused:
            self.said.emit("Not attached: " + "; ".join(refused))
        elif done:
            self.said.emit(f"Attached {', '.join(done)}: the next answers use it")
        return done

    def attach_text(self, name: str, text: str) -> None:
        self.store.add_attachment(self.cid, name, text, self.count_tokens(text))
        self.refresh()

    def too_long(self, text: str, context: int) -> str:
        """Why a message cannot be sent beside an answer in `context` tokens, as markup offering to
        attach it as a document instead (whose parts the answers quote); "" when it fits. The
        text is kept for attach_pasted."""
        if not context or len(text) < context:  # a token takes at least a character
            return ""
        tokens = abs(self.count_tokens(text))
        if tokens <= self.prompt_room():
            return ""
        self.pasted = text
        return (
            f"This message is {tokens:,} tokens long, more than fits the model's context of "
            f"{context:,} tokens beside an answer. "
            '<a href="attach-paste:0">Attach it as a document</a> instead: each answer then '
            "gets the parts that match your question."
        )

    def attach_pasted(self) -> bool:
        """Attaches the over-long message too_long refused; False if there is none."""
        if not self.pasted:
            return False
        self.attach_text("Pasted text.txt", self.pasted)
        self.pasted = ""
        return True

    def _dialog(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach documents", "", DOCUMENT_FILTER)
        if paths:
            self.attach(paths)

    def detach(self, aid: int) -> None:
        self.store.remove_attachment(aid)
        self.refresh()

    def refresh(self, cid: int | None = None) -> None:
        """One chip per attachment of conversation `cid` (else the one shown); "by parts" when
        together they are larger than the prompt's room, so each answer gets the best parts."""
        if cid is not None:
            self.cid = cid
        while self.row.count():
            widget = self.row.takeAt(0).widget()
            widget.hide()
            widget.deleteLater()
        attachments = self.store.attachments(self.cid)
        room = self.prompt_room()
        by_parts = bool(room) and sum(abs(a.tokens) for a in attachments) > room
        for a in attachments:
            chip = QLabel(f"{a.name} · {a.about}" + (" · by parts" if by_parts else ""))
            chip.setTextFormat(Qt.PlainText)
            chip.setObjectName("chip")
            chip.setAccessibleName(f"attached {a.name}, {a.about}")
            chip.setToolTip(
                "The documents are larger than the model's context: each answer gets the parts "
                "that match the question best (BM25), and cites them"
                if by_parts
                else "The whole text goes into each answer's prompt while the chat leaves room; "
                "else the parts that match the question best"
            )
            # a tool button: a push button's padding in the theme leaves no room for the ×
            remove = QToolButton(text="×")  # in every font (an emoji's cross is not)
            remove.setAccessibleName(f"detach {a.name}")
            remove.setToolTip(f"Detach {a.name}")
            remove.clicked.connect(lambda _=False, aid=a.id: self.detach(aid))
            self.row.addWidget(chip)
            self.row.addWidget(remove)
