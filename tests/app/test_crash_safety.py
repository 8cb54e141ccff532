"""Kill the app mid-answer: everything it had saved is still there, and the next start shows it."""

import os
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import answer, open_window

pytestmark = pytest.mark.slow

CHILD = textwrap.dedent("""
    import sys
    from PySide6.QtWidgets import QApplication
    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication([])
    store = Store()
    store.save_settings({"temperature": 0.0, "max_new_tokens": 400})
    win = MainWindow(store)
    original = win._on_chunk

    def on_chunk(*args):
        original(*args)  # saves, then reports what it saved
        print(len(win.stream_text), flush=True)

    win.worker.chunk.disconnect(win._on_chunk)
    win.worker.chunk.connect(on_chunk)
    win.worker.loaded.connect(lambda info: win.send("Write a long story about a lighthouse keeper."))
    app.exec()
""")


def test_killed_mid_stream_loses_nothing_saved(qtbot, data_dir):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True, env=env)
    saved = 0
    for line in child.stdout:
        saved = int(line)
        if saved > 60:
            break
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert saved > 60
    from kwker.app.store import Store

    store = Store()
    conv = store.conversations()[0]
    msg = store.messages(conv.id)[-1]
    assert msg.role == "assistant" and not msg.complete and len(msg.content) >= saved
    win = open_window(qtbot, keep_saved=True)
    assert "(interrupted)" in win.view.toPlainText() and msg.content[:30] in win.view.toPlainText()
