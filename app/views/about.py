"""Help → About: Kwker's version and license, and the notices of everything it ships. An installer
carries THIRD_PARTY_NOTICES.txt (packaging/build.py gathers it with pip-licenses); a pip install
lists the installed packages' own license metadata."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QPlainTextEdit, QVBoxLayout


def version() -> str:
    try:
        return metadata.version("kwker")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def notices() -> str:
    """The shipped notices file of a frozen app, else a line per installed package: name, version,
    license (from its metadata)."""
    if getattr(sys, "frozen", False):
        shipped = Path(sys._MEIPASS) / "licenses" / "THIRD_PARTY_NOTICES.txt"
        if shipped.exists():
            return shipped.read_text(encoding="utf-8")
    lines = []
    for dist in sorted(metadata.distributions(), key=lambda d: d.metadata["Name"].lower()):
        meta = dist.metadata
        license_ = meta.get("License-Expression") or meta.get("License") or ""
        if not license_ or len(license_) > 80:  # a whole license text: its classifier says it
            classifiers = [c for c in meta.get_all("Classifier") or [] if c.startswith("License")]
            license_ = classifiers[-1].split(" :: ")[-1] if classifiers else license_[:80]
        lines.append(f"{meta['Name']} {dist.version}: {license_ or 'see its files'}")
    return "Installed packages and their licenses (from their metadata):\n\n" + "\n".join(lines)


class AboutDialog(QDialog):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setWindowTitle("About Kwker")
        self.resize(640, 520)
        title = QLabel(
            f"<b>Kwker {version()}</b><br>Fast, exact LLM inference on a plain CPU, and this chat "
            "app.<br>Licensed under the Apache License 2.0. The default model, "
            "Qwen2.5-Coder-1.5B-Instruct by the Qwen team (Alibaba Cloud), is Apache-2.0 too."
        )
        title.setWordWrap(True)
        from kwker.app import logs
        from kwker.app.store import data_dir

        folder = data_dir()
        self.logs = QLabel(
            f"The app's log is {folder / logs.LOG_NAME}; a crash leaves its trace in "
            f"{folder / logs.CRASH_NAME}. Send both with a bug report."
        )
        self.logs.setWordWrap(True)
        self.logs.setTextInteractionFlags(Qt.TextSelectableByMouse)
        self.logs.setAccessibleName("where the log is")
        self.text = QPlainTextEdit(notices())
        self.text.setReadOnly(True)
        self.text.setAccessibleName("third-party notices")
        buttons = QDialogButtonBox(QDialogButtonBox.Close)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addWidget(self.logs)
        layout.addWidget(QLabel("Third-party software and its licenses:"))
        layout.addWidget(self.text, 1)
        layout.addWidget(buttons)
