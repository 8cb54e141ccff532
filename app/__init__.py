"""Kwker's desktop chat app (PySide6). Imports point one way: this package uses the engine, never
the reverse."""

from __future__ import annotations

import argparse
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
    if args.self_test:
        from kwker.app import self_test

        return self_test.run(args.prompt or self_test.PROMPT, model=args.model)

    from kwker.app.system_check import missing_xcb_packages, no_display, xcb_message

    reason = no_display()
    if reason:
        print(reason, file=sys.stderr)
        return 1
    missing = missing_xcb_packages()
    if missing:
        print(xcb_message(missing), file=sys.stderr)
        return 1
    from PySide6.QtWidgets import QApplication

    from kwker.app import logs
    from kwker.app.store import data_dir
    from kwker.app.views.main_window import MainWindow

    logs.start(data_dir())
    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Kwker")
    store = open_store()
    if store is None:
        return 1
    window = MainWindow(store, model=args.model)
    window.show()
    return app.exec()


def open_store(ask=None):
    """The chats database; a damaged one is set aside (renamed, never deleted) for a fresh one
    if the user agrees (ask(message) -> bool; default: a dialog). None if they do not."""
    import logging

    from kwker.app.store import DamagedStore, Store, data_dir

    try:
        return Store()
    except DamagedStore as e:
        logging.getLogger(__name__).error("%s", e)
        message = (
            f"Kwker cannot read its chats file:\n{e}\n\nKeep it aside (renamed beside it, "
            "nothing is deleted) and start with an empty one?"
        )
        if not (ask or _ask)(message):
            return None
        aside = Store.set_aside(data_dir() / "chats.db")
        logging.getLogger(__name__).warning("set the damaged chats file aside as %s", aside)
        return Store()


def _ask(message: str) -> bool:
    from PySide6.QtWidgets import QMessageBox

    answer = QMessageBox.question(None, "Kwker: damaged chats file", message)
    return answer == QMessageBox.Yes
