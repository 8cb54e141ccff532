"""Kill the app mid-answer: everything it had saved is still there, and the next start shows it."""

import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from app_helpers import open_window

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent("""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication([])
    store = Store()
    store.save_settings({"temperature": 0.0, "max_new_tokens": 400})
    win = MainWindow(store)
    # each piece is saved, then streamed is emitted: this reports what was saved
    win.answering.streamed.connect(lambda: print(len(win.stream_text), flush=True))
    # Send from the GUI thread once the model is ready (a timer, as a user would click).
    timer = QTimer(interval=50)
    timer.timeout.connect(lambda: win.model_info and not win.generating and
                          win.send("Write a long story about a lighthouse keeper.") and timer.stop())
    timer.start()
    app.exec()
""")


def saved_lengths(child, deadline):
    """The lengths the child reports having saved, line by line, until the deadline."""
    sel = selectors.DefaultSelector()
    sel.register(child.stdout, selectors.EVENT_READ)
    while time.time() < deadline and sel.select(timeout=max(0.0, deadline - time.time())):
        line = child.stdout.readline()
        if not line:
            return
        yield int(line)


def test_killed_mid_stream_loses_nothing_saved(qtbot, data_dir, tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    with open(tmp_path / "child.err", "w") as err:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=err, text=True, env=env
        )
    saved = 0
    for saved in saved_lengths(child, time.time() + 300):
        if saved > 60:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert saved > 60, (tmp_path / "child.err").read_text()[-3000:]
    from kwker.app.store import Store

    store = Store()
    conv = store.conversations()[0]
    msg = store.messages(conv.id)[-1]
    assert msg.role == "assistant" and not msg.complete and len(msg.content) >= saved
    win = open_window(qtbot, keep_saved=True)
    assert "(interrupted)" in win.view.toPlainText() and msg.content[:30] in win.view.toPlainText()
