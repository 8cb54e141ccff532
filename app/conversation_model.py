"""The conversation list as a Qt item model (titles, newest first), filled from the store by the GUI
thread."""

from __future__ import annotations

from PySide6.QtCore import QAbstractListModel, QModelIndex, Qt

from kwker.app.store import Conversation, Store

IdRole = Qt.UserRole + 1


class ConversationListModel(QAbstractListModel):
    def __init__(self, store: Store, parent=None):
        super().__init__(parent)
        self.store = store
        self.items: list[Conversation] = []
        self.search = ""
        self.reload()

    def reload(self, search: str | None = None) -> None:
        if search is not None:
            self.search = search
        self.beginResetModel()
        self.items = self.store.conversations(self.search)
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()) -> int:  # noqa: N802  (Qt's names)
        return 0 if parent.isValid() else len(self.items)

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid() or not 0 <= index.row() < len(self.items):
            return None
        conv = self.items[index.row()]
        if role in (Qt.DisplayRole, Qt.EditRole, Qt.ToolTipRole, Qt.AccessibleTextRole):
            return conv.title
        if role == IdRole:
            return conv.id
        return None

    def flags(self, index):
        if not index.isValid():
            return Qt.NoItemFlags
        return Qt.ItemIsEnabled | Qt.ItemIsSelectable | Qt.ItemIsEditable

    def setData(self, index, value, role=Qt.EditRole) -> bool:  # noqa: N802
        if role != Qt.EditRole or not index.isValid() or not str(value).strip():
            return False
        conv = self.items[index.row()]
        self.store.rename(conv.id, str(value).strip())
        conv.title = str(value).strip()
        self.dataChanged.emit(index, index, [Qt.DisplayRole, Qt.EditRole])
        return True

    def row_of(self, cid: int) -> int:
        return next((i for i, c in enumerate(self.items) if c.id == cid), -1)
