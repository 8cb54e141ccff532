"""The quants of a Hub repo of GGUF files, to choose the one to download: each with its download
size, bits per weight, the memory it needs at the picker's precision and context, and whether
that fits this machine.

The repo's file list and the header of its default quant (read over range requests, a few MB,
kwker.models.gguf_repo) come from the picker's background tasks. The quants of one repo are the
same model, so that header's config sizes every row; a quant's own precision ("the model's own"
in the picker) follows the type most of its weights are in, which its name says.
"""

from __future__ import annotations

import dataclasses

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from kwker.loading import memory
from kwker.models import catalog as cat
from kwker.models import gguf_repo

COLUMNS = ["Quant", "Download", "Bits per weight", "Memory", "Fit"]


def _size(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def read_repo(repo: str, token: str | None = None):
    """(commit, quants, facts of the default quant): the background call the dialog waits on."""
    commit, quants = gguf_repo.list_quants(repo, token=token)
    default = gguf_repo.pick(quants, None, repo)
    return commit, quants, default, gguf_repo.facts(repo, commit, default, token)


class QuantList(QDialog):
    """Lists a GGUF repo's quants; `chosen` gives "OWNER/REPO:QUANT" to download."""

    chosen = Signal(str)

    def __init__(self, repo: str, submit, precision: str | None, context: int, token=None,
                 parent=None):  # fmt: skip
        """submit(call, on_done, on_fail): the picker's background runner."""
        super().__init__(parent)
        self.setWindowTitle(f"Quants of {repo}")
        self.resize(720, 420)
        self.repo, self.precision, self.context = repo, precision, context
        self.quants: list[gguf_repo.Quant] = []
        self.default: gguf_repo.Quant | None = None
        self.facts: memory.ModelFacts | None = None
        self.status = QLabel(f"Reading the quants of {repo}…")
        self.status.setWordWrap(True)
        self.status.setAccessibleName("status")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setAccessibleName("quants")
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.setSelectionMode(QTableWidget.SingleSelection)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.Stretch)
        self.table.doubleClicked.connect(self._choose)
        self.buttons = QDialogButtonBox(QDialogButtonBox.Cancel)
        self.download = self.buttons.addButton("Download", QDialogButtonBox.AcceptRole)
        self.download.setEnabled(False)
        self.buttons.accepted.connect(self._choose)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.status)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.buttons)
        self.loading = True
        submit(lambda: read_repo(repo, token), self._listed, self._failed)

    def _failed(self, message: str) -> None:
        self.loading = False
        self.status.setText(f"Cannot list the quants of {self.repo}: {message}")

    def _listed(self, found) -> None:
        self.loading = False
        _, self.quants, self.default, self.facts = found
        self.table.setRowCount(len(self.quants))
        params = memory.parameters(self.facts.config, self.facts.tied)
        for i, q in enumerate(self.quants):
            own = gguf_repo.own_precision(q.name) or self.facts.own
            facts = dataclasses.replace(self.facts, own=own)
            est = facts.estimate(self.precision, self.context)
            name = f"{q.name} (default)" if q is self.default else q.name
            parts = f" in {len(q.files)} parts" if len(q.files) > 1 else ""
            cells = [name, _size(q.size) + parts, f"{8 * q.size / params:.2f}",
                     f"{_size(est.total)} at {est.precision}", cat.fit_of(est.total)]  # fmt: skip
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setData(Qt.UserRole, q.name)
                item.setToolTip(est.describe())
                self.table.setItem(i, column, item)
        if self.default is not None:
            self.table.selectRow(self.quants.index(self.default))
        self.download.setEnabled(bool(self.quants))
        if not self.quants:
            self.status.setText(f"{self.repo} holds no GGUF model files")
            return
        # at a set precision Kwker packs every quant to it: the memory is the same, the quality
        # is the file's
        packed = f" (every quant is packed to {self.precision})" if self.precision else ""
        self.status.setText(
            f"{len(self.quants)} quants. Memory at {self.context} tokens of context{packed}. "
            f"The default is {self.default.name}."
        )

    def row(self, quant: str) -> list[str]:
        """The cells of a quant's row, as shown."""
        i = [q.name for q in self.quants].index(quant)
        return [self.table.item(i, c).text() for c in range(len(COLUMNS))]

    def select(self, quant: str) -> None:
        self.table.selectRow([q.name for q in self.quants].index(quant))

    def _choose(self, *_) -> None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return
        quant = self.table.item(rows[0].row(), 0).data(Qt.UserRole)
        self.chosen.emit(f"{self.repo}:{quant}")
        self.accept()
