"""PySide6 6.12.0's Signal.emit() dropped a reference to True per call (and to None inside a dict
argument): the app emits once per token, and CPython aborted a few thousand tokens in
(none_dealloc, bool_dealloc). The pin in pyproject.toml keeps it out; these tests catch any
version that brings it back, on a long streamed answer and on the worker's own signals. The
soak test answers 100 prompts in the real window with a steady RSS and quits cleanly."""

import os
import subprocess
import sys
import textwrap

import pytest
from app_helpers import TEST_MODEL
from PySide6.QtCore import QObject, QThread, Signal, Slot

from kwker.app.worker import GenerationWorker


class Streamer(QObject):
    # the worker's chunk signal's shape: text, token, source, stats
    chunk = Signal(str, int, str, dict)
    done = Signal()

    @Slot()
    def run(self):
        for i in range(5000):
            self.chunk.emit("x", i, "", {"speedup": None, "final": True, "error": None})
        self.done.emit()


def test_a_long_stream_across_threads_keeps_the_counts_of_true_and_none(qtbot):
    received = []
    before = sys.getrefcount(True), sys.getrefcount(None), sys.getrefcount(False)
    thread, streamer = QThread(), Streamer()
    streamer.moveToThread(thread)
    streamer.chunk.connect(lambda *args: received.append(args[1]))  # queued: another thread
    thread.started.connect(streamer.run)
    with qtbot.waitSignal(streamer.done, timeout=60_000):
        thread.start()
    qtbot.waitUntil(lambda: len(received) == 5000, timeout=60_000)
    thread.quit()
    thread.wait()
    after = sys.getrefcount(True), sys.getrefcount(None), sys.getrefcount(False)
    # 5000 emits with a True and two Nones each: a leak of one a call shows as thousands
    assert all(abs(a - b) < 100 for a, b in zip(after, before, strict=True)), (before, after)


def test_the_workers_own_signals_keep_the_counts(qtbot):
    worker = GenerationWorker()
    seen = []  # counts only: a slot that kept its arguments would hold references itself
    worker.chunk.connect(lambda *args: seen.append(len(args)))
    worker.finished.connect(lambda *args: seen.append(len(args)))
    before = sys.getrefcount(True), sys.getrefcount(None)
    for i in range(2000):
        worker.chunk.emit("a", i, "", {"x": None, "y": True})
        worker.finished.emit("eos", {"speedup": None, "ok": True})
    after = sys.getrefcount(True), sys.getrefcount(None)
    assert len(seen) == 4000
    assert all(abs(a - b) < 100 for a, b in zip(after, before, strict=True)), (before, after)


SOAK = textwrap.dedent("""
    import os, sys
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication
    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    def rss_mb():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) for l in f if l.startswith("VmRSS:")) / 1024

    app = QApplication([])
    store = Store()
    store.save_settings({"model": sys.argv[1], "precision": "int4", "max_new_tokens": 48,
                         "temperature": 0.7, "seed": -1})
    win = MainWindow(store)
    win.show()
    prompts = ["Tell me a fact about the sea.", "Write a line of a poem.", "Name a fruit.",
               "Explain what a verb is.", "Say hello in French."]
    state = {"sent": 0, "rss": []}

    def tick():
        if win.model_info is None or win.generating:
            return
        if state["sent"] == 100:
            print("RSS", " ".join(f"{r:.0f}" for r in state["rss"]), flush=True)
            print("MESSAGES", len(win.store.messages(win.cid)), flush=True)
            win.close()
            app.quit()
            return
        if state["sent"] % 10 == 0:
            state["rss"].append(rss_mb())
        if state["sent"] % 20 == 0:
            win.new_chat()
        win.send(prompts[state["sent"] % len(prompts)])
        state["sent"] += 1

    timer = QTimer(interval=20)
    timer.timeout.connect(tick)
    timer.start()
    sys.exit(app.exec())
""")


@pytest.mark.slow
def test_the_window_answers_100_prompts_with_a_steady_rss_and_quits_cleanly(data_dir, tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    r = subprocess.run(
        [sys.executable, "-c", SOAK, TEST_MODEL], capture_output=True, text=True, env=env,
        timeout=1500,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in r.stdout.splitlines() if " " in line)
    rss = [float(x) for x in lines["RSS"].split()]
    print("RSS (MB) every 10 answers:", rss)
    assert len(rss) == 10
    # after the first answers have warmed every cache, RSS stays within 60 MB
    assert max(rss[2:]) - min(rss[2:]) < 60, rss
    assert int(lines["MESSAGES"]) == 40  # the last chat: 20 questions and their answers


@pytest.mark.slow
def test_a_closed_window_lets_its_model_go(qtbot, data_dir):
    """The lambdas connected to the worker's signals hold the window, a cycle through C++ that gc
    cannot see: each closed window kept its model (280 MB here), and CI's pytest process grew past
    24 GB and was killed. Closing a window must free its decoder."""
    import gc
    import weakref

    from app_helpers import open_window

    win = open_window(qtbot)
    decoder = weakref.ref(win.worker.decoder)
    win.close()
    del win
    gc.collect()
    assert decoder() is None, gc.get_referrers(decoder())
