"""Small widgets the views share."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QPainter
from PySide6.QtWidgets import QApplication, QLabel, QSizePolicy, QWidget


class ElidedLabel(QLabel):
    """A one-line label that ends in "…" where its text does not fit; text() stays whole (and the
    tooltip shows it)."""

    def __init__(self, text: str = "", parent=None):
        super().__init__(text, parent)
        self.setSizePolicy(QSizePolicy.Ignored, QSizePolicy.Preferred)  # never widens a layout

    def setText(self, text: str) -> None:  # noqa: N802
        super().setText(text)
        self.setToolTip(text)

    def paintEvent(self, event):  # noqa: N802
        painter = QPainter(self)
        shown = self.fontMetrics().elidedText(self.text(), Qt.ElideRight, self.width())
        painter.drawText(self.rect(), int(self.alignment() | Qt.AlignVCenter), shown)


def fit_to_screen(window: QWidget, width: int, height: int) -> None:
    """Opens window at width x height, or at the screen's available size if that is smaller."""
    screen = window.screen() or QApplication.primaryScreen()
    if screen is not None:
        room = screen.availableGeometry()
        width, height = min(width, room.width()), min(height, room.height())
    window.resize(width, height)
