"""Screenshots of the chat app as a user sees it: the first launch, the statistics while an answer
streams, the main window (light and dark), the settings panel, the speculation tint, a long chat
rolled over by the context window and the model picker's fit column. Run under Xvfb:

    xvfb-run -a -s "-screen 0 1400x900x24" python packaging/screenshots.py OUTDIR

With --tour THEME WIDTHxHEIGHT it takes instead, at that window size: the first screen, a streamed
answer with its statistics, the settings, the picker, a cut answer with Continue and an inline
error (issue 44's list), as OUTDIR/THEME-WIDTHxHEIGHT-*.png. With --thinking MODEL it takes a
thinking model's answer with its thinking closed and open (MODEL: a local thinking model). With
--tools it takes tools from an MCP server: the Tools tab, a call's approval, a finished call.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path


def run_until(cond=lambda: False, seconds: float = 600.0) -> bool:
    """Runs Qt's event loop until cond() holds or `seconds` pass (checked every 50 ms, as a
    user's session would run); whether cond() holds."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop, end = QEventLoop(), time.time() + seconds
    timer = QTimer(interval=50)
    timer.timeout.connect(lambda: (cond() or time.time() > end) and loop.quit())
    timer.start()
    loop.exec()
    timer.stop()
    return bool(cond())


def main(out: Path) -> int:
    os.environ.setdefault("KWKER_DATA_DIR", tempfile.mkdtemp(prefix="kwker-shots-"))
    from PySide6.QtWidgets import QApplication

    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    out.mkdir(parents=True, exist_ok=True)

    def wait(cond, timeout=600.0):
        if not run_until(cond, timeout):
            raise TimeoutError("the app did not get there in time")

    def pause(ms):
        run_until(seconds=ms / 1000)

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
    picker = win.model_choice.open_picker()
    pause(1500)  # the scans and estimates arrive from the picker's worker
    picker.grab().save(str(out / "model-picker.png"))
    picker.close()
    win.close()
    print("\n".join(str(p) for p in sorted(out.glob("*.png"))))
    app.quit()
    return 0


def tour(out: Path, theme: str, width: int, height: int) -> int:
    os.environ.setdefault("KWKER_DATA_DIR", tempfile.mkdtemp(prefix="kwker-tour-"))
    from PySide6.QtWidgets import QApplication

    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    out.mkdir(parents=True, exist_ok=True)

    def pause(ms, until=lambda: False, limit_s=600.0):
        """ms milliseconds, or until until() holds (ms 0: within limit_s)."""
        run_until(until, ms / 1000 if ms else limit_s)

    def shot(widget, name):
        pause(300)
        path = out / f"{theme}-{width}x{height}-{name}.png"
        widget.grab().save(str(path))
        print(path)

    store = Store()
    store.save_settings({"theme": theme, "max_new_tokens": 200})
    win = MainWindow(store)
    win.resize(width, height)
    win.show()
    pause(0, lambda: win.model_info is not None)
    shot(win, "1-first-screen")
    win.send("Write a Python function that checks whether a number is prime, and explain it.")
    pause(0, lambda: len(win.stream_text) > 300 or not win.generating)
    shot(win, "2-streaming")
    pause(0, lambda: not win.generating)
    win.tabs.setCurrentWidget(win.settings_tab)
    shot(win, "3-settings")
    win.tabs.setCurrentWidget(win.stats)
    picker = win.model_choice.open_picker()
    pause(0, lambda: not picker.busy, 60)
    shot(picker, "4-picker")
    picker.close()
    win.apply_settings({**win.settings_panel.values(), "max_new_tokens": 24}, False)
    win.new_chat()
    win.send("Tell me a long story about a lighthouse keeper.")
    pause(0, lambda: not win.generating)
    shot(win, "5-cut-answer")
    win.new_chat()
    win.send("Please summarise this: " + "the quick brown fox jumps over the lazy dog " * 2000)
    shot(win, "6-inline-error")
    win.close()
    app.quit()
    return 0


# A thinking model's answer as the store keeps it: the thinking apart, with its figures
THINKING_QUESTION = "Is 221 a prime number?"
THINKING_TEXT = (
    "The user asks whether 221 is prime. Its square root is about 14.9, so I only need to try "
    "the primes up to 13.\n\n221 is odd, so not 2. Digit sum 5: not 3. It does not end in 0 or "
    "5. 7 × 31 = 217, remainder 4. 11 × 20 = 220, remainder 1. 13 × 17 = 221. So 221 = 13 × 17, "
    "and it is not prime."
)
THINKING_ANSWER = "No: **221 = 13 × 17**, so it is not a prime number."
THINKING_STATS = {"new_tokens": 131, "thinking_tokens": 112, "thinking_s": 2.4,
                  "prompt_tokens": 16, "prefill_s": 0.08, "tokens_per_s": 46.8,
                  "finish_reason": "eos"}  # fmt: skip


def thinking(out: Path, model: str) -> int:
    """A thinking model's answer in the chat, its thinking block closed (as a finished answer
    shows it) and open, as OUTDIR/thinking-closed.png and thinking-open.png. The conversation is
    stored (a thinking answer needs a thinking model: `model`, a local one, is loaded)."""
    os.environ.setdefault("KWKER_DATA_DIR", tempfile.mkdtemp(prefix="kwker-shots-"))
    from PySide6.QtWidgets import QApplication

    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    out.mkdir(parents=True, exist_ok=True)
    store = Store()
    store.save_settings({"theme": "light", "model": model})
    cid = store.new_conversation("Prime check").id
    store.add_message(cid, "user", THINKING_QUESTION)
    mid = store.add_message(cid, "assistant", THINKING_ANSWER).id
    store.update_message(mid, THINKING_ANSWER, stats=THINKING_STATS, thinking=THINKING_TEXT)
    win = MainWindow(store)
    win.show()
    run_until(lambda: win.model_info is not None)
    win.open_conversation(cid)
    app.processEvents()
    win.grab().save(str(out / "thinking-closed.png"))
    win.chat.toggle_thinking(1)
    app.processEvents()
    win.grab().save(str(out / "thinking-open.png"))
    win.close()
    print("\n".join(str(out / f"thinking-{s}.png") for s in ("closed", "open")))
    app.quit()
    return 0


def tools(out: Path) -> int:
    """Tools from an MCP server, with the default model: the Tools tab with Kwker's built-in
    files server sharing a folder, the approval asked before a call, and the finished call in the
    chat, its block open (OUTDIR/tools-settings.png, tools-approval.png (the dialog),
    tools-asking.png (the window meanwhile), tools-call.png)."""
    base = Path(tempfile.mkdtemp(prefix="kwker-shots-"))
    os.environ.setdefault("KWKER_DATA_DIR", str(base / "data"))
    os.environ["XDG_CONFIG_HOME"] = str(base / "config")  # a config of its own: no user servers
    shared = base / "Documents"
    shared.mkdir()
    (shared / "notes.txt").write_text(
        "Team offsite: Thursday 14 May, 9:30, Harbour Room.\nBring the Q2 roadmap draft.\n"
    )
    (shared / "budget.csv").write_text("item,cost\nvenue,1200\nlunch,340\n")
    from PySide6.QtWidgets import QApplication

    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication(sys.argv[:1])
    out.mkdir(parents=True, exist_ok=True)

    wait = run_until

    store = Store()
    store.save_settings({"theme": "light", "temperature": 0.0, "max_new_tokens": 120})
    win = MainWindow(store)
    win.show()
    wait(lambda: win.model_info is not None)
    win.tool_use.panel.share_folder(str(shared))
    wait(lambda: len(win.tool_use.host.tools()) == 2)
    win.tabs.setCurrentWidget(win.tool_use.panel)
    win.tool_use.panel.tree.setCurrentItem(win.tool_use.panel.tree.topLevelItem(0))
    wait(lambda: False, 0.3)
    win.grab().save(str(out / "tools-settings.png"))
    win.send("What does the file notes.txt say?")
    wait(lambda: win.tool_use.dialog is not None)
    wait(lambda: False, 0.3)
    win.tool_use.dialog.grab().save(str(out / "tools-approval.png"))  # a window of its own
    win.grab().save(str(out / "tools-asking.png"))
    win.tool_use.dialog.once.click()
    wait(lambda: not win.generating)
    win.tabs.setCurrentWidget(win.stats)
    win.chat.toggle_tool_call(len(win.messages) - 1, 0)
    wait(lambda: False, 0.3)
    win.grab().save(str(out / "tools-call.png"))
    win.close()
    print("\n".join(str(p) for p in sorted(out.glob("tools-*.png"))))
    app.quit()
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--tools":  # --tools [OUTDIR]
        sys.exit(tools(Path(sys.argv[2] if len(sys.argv) > 2 else "screenshots")))
    if len(sys.argv) > 1 and sys.argv[1] == "--thinking":  # --thinking MODEL [OUTDIR]
        sys.exit(thinking(Path(sys.argv[3] if len(sys.argv) > 3 else "screenshots"), sys.argv[2]))
    if len(sys.argv) > 1 and sys.argv[1] == "--tour":
        size = [int(v) for v in sys.argv[3].split("x")]
        out = Path(sys.argv[4] if len(sys.argv) > 4 else "screenshots")
        sys.exit(tour(out, sys.argv[2], *size))
    sys.exit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "screenshots")))
