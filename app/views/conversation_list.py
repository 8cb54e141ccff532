"""The window's left column: New chat, a search box, the conversations (newest first; a double
click renames one), the Models… and About buttons, and Rename and Delete for the one open."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QLineEdit, QListView, QPushButton, QVBoxLayout, QWidget

from kwker.app.conversation_model import ConversationListModel, IdRole


class ConversationList(QWidget):
    opened = Signal(int)  # a conversation's id, clicked
    new_requested = Signal()
    delete_requested = Signal()
    models_requested = Signal()
    about_requested = Signal()

    def __init__(self, store):
        super().__init__()
        self.model = ConversationListModel(store, self)
        self.current: int | None = None  # the conversation open in the window
        self.search = QLineEdit(placeholderText="Search chats")
        self.search.setAccessibleName("search conversations")
        self.search.textChanged.connect(lambda text: (self.model.reload(text), self.select()))
        self.list = QListView()
        self.list.setModel(self.model)
        self.list.setAccessibleName("conversations")
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.clicked.connect(lambda index: self.opened.emit(index.data(IdRole)))
        buttons = {}
        for name, text, accessible, signal in (
            ("new", "New chat", "new chat", self.new_requested),
            ("models", "Models…", "models", self.models_requested),
            ("about", "About", "about Kwker and its licenses", self.about_requested),
            ("rename", "Rename", "rename the chat", None),
            ("delete", "Delete", "delete the chat", self.delete_requested),
        ):
            buttons[name] = QPushButton(text)
            buttons[name].setAccessibleName(accessible)
            buttons[name].clicked.connect(signal if signal is not None else self.rename_current)
        layout = QVBoxLayout(self)
        layout.addWidget(buttons["new"])
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        for pair, stretch in ((("models", "about"), 1), (("rename", "delete"), 0)):
            row = QHBoxLayout()
            row.addWidget(buttons[pair[0]], stretch)
            row.addWidget(buttons[pair[1]])
            layout.addLayout(row)

    def refresh(self, cid: int | None = None) -> None:
        """Lists the conversations again (their titles, their order) and selects `cid`, or the
        one selected before."""
        if cid is not None:
            self.current = cid
        self.model.reload()
        self.select()

    def select(self) -> None:
        row = self.model.row_of(self.current)
        if row >= 0:
            self.list.setCurrentIndex(self.model.index(row))

    def rename_current(self) -> None:
        row = self.model.row_of(self.current)
        if row >= 0:
            self.list.edit(self.model.index(row))
