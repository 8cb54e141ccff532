"""The model picker: the catalog, models already on disk and Hub search results, with size, license, family and
whether each fits in this machine's memory at the chosen precision; download with progress and cancel, delete,
import a folder or a .gguf file, and choose the chat model or its draft (same tokenizer only)."""

from __future__ import annotations

import threading

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QObject, Qt, QThread, Signal, Slot
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTableView,
    QVBoxLayout,
)

from kwker.models import catalog as cat
from kwker.models import hub
from kwker.precision import CONVERSIONS, PRECISIONS, weight_bytes

COLUMNS = ["Model", "Family", "Parameters", "Download", "License", "Fit", "Status"]


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


class ModelTableModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.rows: list[dict] = []
        self.precision, self.context, self.filter = "int4", 2048, ""
        self.search_results: list[str] = []
        self.refresh()

    def refresh(self) -> None:
        cached = {repo: size for repo, size, _ in hub.cached_models()}
        rows = []
        for e in cat.catalog():
            status = (
                "downloaded" if e.id in cached else ("offline source" if e.offline_source else "")
            )
            if not e.runs_natively:
                status = "not supported yet"
            rows.append(
                {
                    "id": e.id,
                    "family": e.family,
                    "params": _size(e.params).replace("B", ""),
                    "download": _size(e.download_bytes),
                    "license": e.license,
                    "fit": cat.fit(e, self.precision, self.context),
                    "status": status,
                    "entry": e,
                }
            )
        known = {r["id"] for r in rows}
        for repo, size in cached.items():
            if repo not in known:
                rows.append(
                    {
                        "id": repo,
                        "family": "",
                        "params": "",
                        "download": _size(size),
                        "license": "",
                        "fit": "",
                        "status": "downloaded",
                        "entry": None,
                    }
                )
                known.add(repo)
        for repo in self.search_results:
            if repo not in known:
                rows.append(
                    {
                        "id": repo,
                        "family": "",
                        "params": "",
                        "download": "",
                        "license": "",
                        "fit": "",
                        "status": "on the Hub",
                        "entry": None,
                    }
                )
        text = self.filter.lower()
        self.beginResetModel()
        self.rows = [r for r in rows if text in r["id"].lower() or text in r["family"]]
        self.endResetModel()

    def rowCount(self, parent=QModelIndex()):  # noqa: N802
        return 0 if parent.isValid() else len(self.rows)

    def columnCount(self, parent=QModelIndex()):  # noqa: N802
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(self, section, orientation, role=Qt.DisplayRole):  # noqa: N802
        if role == Qt.DisplayRole and orientation == Qt.Horizontal:
            return COLUMNS[section]
        return None

    def data(self, index, role=Qt.DisplayRole):
        if not index.isValid() or role not in (Qt.DisplayRole, Qt.ToolTipRole):
            return None
        r = self.rows[index.row()]
        return [
            r["id"],
            r["family"],
            r["params"],
            r["download"],
            r["license"],
            r["fit"],
            r["status"],
        ][index.column()]


class DownloadWorker(QObject):
    progress = Signal(int, str)  # percent, text
    done = Signal(str, str)  # repo, snapshot path
    failed = Signal(str)

    def __init__(self):
        super().__init__()
        self.cancel = threading.Event()
        self.token: str | None = None  # set by the dialog before a download of a gated repo

    @Slot(str)
    def run(self, repo: str) -> None:
        self.cancel.clear()

        def report(p):
            eta = f", {p.eta_s:.0f} s left" if p.eta_s is not None else ""
            self.progress.emit(
                int(100 * p.done / max(p.total, 1)),
                f"{p.file}: {_size(p.done)} of {_size(p.total)}, {_size(p.speed)}/s{eta}",
            )

        try:
            path = hub.download(repo, token=self.token, progress=report, cancel=self.cancel)
            self.done.emit(repo, str(path))
        except hub.DownloadError as e:
            self.failed.emit(str(e))


class ModelPicker(QDialog):
    model_chosen = Signal(str)
    draft_chosen = Signal(str)
    request_download = Signal(str)

    def __init__(self, current_model: str, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Models")
        self.resize(980, 560)
        self.current_model = current_model
        self.table_model = ModelTableModel(self)
        self.search = QLineEdit(placeholderText="Filter, or search the Hub")
        self.search.setAccessibleName("search models")
        self.search.textChanged.connect(self._filter)
        hub_button = QPushButton("Search the Hub")
        hub_button.clicked.connect(self.search_hub)
        self.precision = QComboBox()
        for name in sorted(("fp32", *CONVERSIONS), key=weight_bytes):  # the smallest first
            self.precision.addItem(f"Fit at {PRECISIONS[name].weights}", name)
        self.precision.currentIndexChanged.connect(self._refit)
        self.token = QLineEdit(placeholderText="Hugging Face token (gated models)")
        self.token.setEchoMode(QLineEdit.Password)
        self.token.setAccessibleName("Hugging Face token")
        self.table = QTableView()
        self.table.setModel(self.table_model)
        self.table.setSelectionBehavior(QTableView.SelectRows)
        self.table.setSelectionMode(QTableView.SingleSelection)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.Stretch)
        self.table.setAccessibleName("models")
        self.progress = QProgressBar()
        self.progress.setAccessibleName("download progress")
        self.progress.setVisible(False)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.download_button = QPushButton("Download")
        self.cancel_button = QPushButton("Cancel download")
        self.cancel_button.setEnabled(False)
        use = QPushButton("Chat with this model")
        draft = QPushButton("Use as draft")
        delete = QPushButton("Delete")
        import_button = QPushButton("Import folder or GGUF…")
        self.download_button.clicked.connect(self.download_selected)
        self.cancel_button.clicked.connect(lambda: self.worker.cancel.set())
        use.clicked.connect(self._use)
        draft.clicked.connect(self._draft)
        delete.clicked.connect(self.delete_selected)
        import_button.clicked.connect(self._import_dialog)

        top = QHBoxLayout()
        top.addWidget(self.search, 1)
        top.addWidget(hub_button)
        top.addWidget(self.precision)
        top.addWidget(self.token)
        buttons = QHBoxLayout()
        for b in (self.download_button, self.cancel_button, use, draft, delete, import_button):
            buttons.addWidget(b)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addLayout(buttons)

        self.thread_ = QThread(self)
        self.worker = DownloadWorker()
        self.worker.moveToThread(self.thread_)
        self.request_download.connect(self.worker.run)
        self.worker.progress.connect(self._on_progress)
        self.worker.done.connect(self._on_done)
        self.worker.failed.connect(self._on_failed)
        self.thread_.start()
        self.downloading = False

    def _filter(self, text: str):
        self.table_model.filter = text.strip()
        self.table_model.refresh()

    def _refit(self):
        self.table_model.precision = self.precision.currentData()
        self.table_model.refresh()

    def search_hub(self):
        try:
            self.table_model.search_results = hub.search(self.search.text().strip())
        except Exception as e:  # noqa: BLE001  (offline or refused: say so, keep the catalog)
            self.status.setText(f"Hub search failed: {e}")
            return
        self.table_model.filter = ""
        self.table_model.refresh()

    def select(self, repo: str) -> bool:
        for i, r in enumerate(self.table_model.rows):
            if r["id"] == repo:
                self.table.selectRow(i)
                return True
        return False

    def selected(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows()
        return self.table_model.rows[rows[0].row()] if rows else None

    def download_selected(self):
        row = self.selected()
        if row is None or self.downloading:
            return
        self.downloading = True
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self.cancel_button.setEnabled(True)
        self.download_button.setEnabled(False)
        self.status.setText(f"Downloading {row['id']}…")
        self.worker.token = self.token.text().strip() or None
        self.request_download.emit(row["id"])

    def _on_progress(self, percent: int, text: str):
        self.progress.setValue(percent)
        self.status.setText(text)

    def _finish_download(self):
        self.downloading = False
        self.cancel_button.setEnabled(False)
        self.download_button.setEnabled(True)

    def _on_done(self, repo: str, path: str):
        self._finish_download()
        self.progress.setValue(100)
        self.status.setText(f"{repo} is ready ({path})")
        self.table_model.refresh()
        self.select(repo)

    def _on_failed(self, msg: str):
        self._finish_download()
        self.status.setText(msg)

    def _use(self):
        row = self.selected()
        if row is not None:
            self.model_chosen.emit(row["id"])

    def _draft(self):
        row = self.selected()
        if row is None:
            return
        if row["id"] not in cat.same_tokenizer(self.current_model):
            self.status.setText(
                f"{row['id']} does not share {self.current_model}'s tokenizer (or is not smaller): "
                "it cannot draft for it"
            )
            return
        self.draft_chosen.emit(row["id"])

    def delete_selected(self):
        row = self.selected()
        if row is None:
            return
        try:
            freed = hub.remove(row["id"])
        except hub.DownloadError as e:
            self.status.setText(str(e))
            return
        self.status.setText(f"Deleted {row['id']} ({_size(freed)} freed)")
        self.table_model.refresh()

    def _import_dialog(self):
        path, _ = QFileDialog.getOpenFileName(self, "Import a GGUF file", "", "GGUF (*.gguf)")
        if path:
            self.import_file(path)

    def import_file(self, path: str):
        """Checks the file can run and registers it where it is (never converted or copied)."""
        from kwker.models import imported

        try:
            entry = imported.register(path)
        except (OSError, ValueError) as e:
            self.status.setText(f"Cannot import {path}: {e}")
            return
        self.status.setText(f"Imported {entry['name']} ({_size(entry['bytes'])}), kept at {path}")
        self.model_chosen.emit(entry["path"])

    def done(self, result):  # noqa: A003  (QDialog's name)
        self.worker.cancel.set()
        self.thread_.quit()
        self.thread_.wait()
        super().done(result)
