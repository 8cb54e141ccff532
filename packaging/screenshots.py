"""Screenshots of the chat app as a user sees it: the first launch, the statistics while an answer streams, the
main window (light and dark), the settings panel, the speculation tint, a long chat rolled over by the
context window and the model picker's fit column. Run under Xvfb:

    xvfb-run -a -s "-screen 0 1400x900x24" python packaging/screenshots.py OUTDIR
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path


def main(out: Path) -> int:
    os.environ.setdefault("KWKER_DATA_DIR", tempfile.mkdtemp(prefix="kwker-shots-"))
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    out.mkdir(parents=True, exist_ok=True)

    def wait(cond, timeout=600.0):
        """Runs the event loop until cond() holds (checked by a timer, as a user's session would run)."""
        loop, end = QEventLoop(), time.time() + timeout
        timer = QTimer(interval=50)
        timer.timeout.connect(lambda: (cond() or time.time() > end) and loop.quit())
        timer.start()
        loop.exec()
        timer.stop()
        if not cond():
            raise TimeoutError("the app did not get there in time")

    def pause(ms):
        loop = QEventLoop()
        QTimer.singleShot(ms, loop.quit)
        loop.exec()

    store = Store()
    store.save_settings({"theme": "light", "temperature": 0.0, "max_new_tokens": 160})
    win = MainWindow(store)
    win.show()
    wait(lambda: win.model_info is not None)
    pause(200)
    win.grab().save(str(out / "first-launch.png"))
    win.send(
        "Write a Python function that checks whether a number is prime, then explain it briefly."
    )
    wait(lambda: len(win.stream_text) > 150)
    win.grab().save(str(out / "streaming-stats.png"))
    wait(lambda: not win.generating)
    pause(200)
    win.grab().save(str(out / "main-light.png"))
    win.tabs.setCurrentWidget(win.settings_panel)
    pause(100)
    win.grab().save(str(out / "settings.png"))
    win.tabs.setCurrentWidget(win.stats)

    # the speculation tint on a rewrite, where prompt lookup supplies most of the answer
    from kwker.bench.speculation import TASKS

    win.apply_settings({**win.settings_panel.values(), "tint_speculation": True}, False)
    win.new_chat()
    win.send(TASKS["rewrite"])
    wait(lambda: not win.generating)
    pause(200)
    win.grab().save(str(out / "tint.png"))

    # a long chat at a 512-token context: the rolling window drops the oldest turns
    values = {**win.settings_panel.values(), "tint_speculation": False, "context_length": 512}
    win.apply_settings({**values, "max_new_tokens": 80}, False)
    wait(lambda: win.model_info is not None)
    win.new_chat()
    for q in (
        "Tell me about the planet Mars.",
        "Now tell me about Jupiter.",
        "What is a black hole?",
        "How far away is the nearest star?",
        "Why do stars twinkle?",
        "What is a comet?",
    ):
        win.send(q)
        wait(lambda: not win.generating)
    win.view.scrollToAnchor("cut")
    pause(200)
    win.grab().save(str(out / "rolling-window.png"))

    win.settings_panel.theme.setCurrentIndex(win.settings_panel.theme.findData("dark"))
    win.settings_panel.apply_button.click()
    pause(200)
    win.grab().save(str(out / "main-dark.png"))
    picker = win.open_models()
    pause(1500)  # the scans and estimates arrive from the picker's worker
    picker.grab().save(str(out / "model-picker.png"))
    picker.close()
    win.close()
    print("\n".join(str(p) for p in sorted(out.glob("*.png"))))
    app.quit()
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")))
