"""Kwker's desktop chat app (PySide6). Imports point one way: this package uses the engine, never the reverse."""

from __future__ import annotations

import argparse
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="kwker-chat", description="Chat with a local model, fast."
    )
    parser.add_argument("--model", default=None, help="a hub id, a local folder or a .gguf file")
    args = parser.parse_args(argv)

    from PySide6.QtWidgets import QApplication

    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Kwker")
    window = MainWindow(Store(), model=args.model)
    window.show()
    return app.exec()
