"""Kwker's desktop chat app (PySide6). Imports point one way: this package uses the engine, never the reverse."""

from __future__ import annotations

import argparse
import os
import sys


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="kwker-chat", description="Chat with a local model, fast."
    )
    parser.add_argument("--model", default=None, help="a hub id, a local folder or a .gguf file")
    parser.add_argument(
        "file", nargs="?", default=None, help="a .gguf file or model folder to open"
    )
    parser.add_argument(
        "--self-test",
        action="store_true",
        help="open the window on a fresh data folder, answer one prompt, print it and the rates, "
        "and exit 0 (1 with the reason on any failure)",
    )
    parser.add_argument("--prompt", default=None, help="the self-test's prompt")
    args = parser.parse_args(argv)
    args.model = args.model or args.file
    # transformers' notice that torch is missing means nothing here: the app's path needs no torch
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    if args.self_test:
        from kwker.app import self_test

        return self_test.run(args.prompt or self_test.PROMPT, model=args.model)

    from kwker.app.system_check import missing_xcb_packages, xcb_message

    missing = missing_xcb_packages()
    if missing:
        print(xcb_message(missing), file=sys.stderr)
        return 1
    from PySide6.QtWidgets import QApplication

    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Kwker")
    window = MainWindow(Store(), model=args.model)
    window.show()
    return app.exec()
