"""`kwker-chat --self-test`: the installed app checks itself as a user would see it. It opens the
real window (offscreen is fine) on a fresh data folder, loads the default model (an installer's
bundled one), answers one prompt greedily, prints the answer and its rates, and exits 0; on any
failure it prints the reason and exits 1. The installers' smoke tests (packaging/smoke.sh) run
it."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

PROMPT = "What is 2+2? Answer in one short sentence."
TIMEOUT_S = 300.0


def process_age() -> float:
    """Seconds since this process started (from /proc on Linux; else since this module loaded)."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return uptime - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return time.perf_counter() - _LOADED


_LOADED = time.perf_counter()


def run(prompt: str = PROMPT, model: str | None = None, timeout: float = TIMEOUT_S) -> int:
    os.environ.setdefault("KWKER_DATA_DIR", tempfile.mkdtemp(prefix="kwker-self-test-"))
    from PySide6.QtCore import QEventLoop, QTimer
    from PySide6.QtWidgets import QApplication

    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("Kwker")
    failures: list[str] = []

    def wait(cond) -> bool:
        loop, end = QEventLoop(), time.monotonic() + timeout
        timer = QTimer(interval=20)
        timer.timeout.connect(
            lambda: (cond() or failures or time.monotonic() > end) and loop.quit()
        )
        timer.start()
        loop.exec()
        timer.stop()
        return cond() and not failures

    store = Store()
    store.save_settings({"temperature": 0.0, "max_new_tokens": 48})
    win = MainWindow(store, model=model)
    win.worker.load_failed.connect(lambda msg: failures.append(f"the model did not load: {msg}"))
    win.worker.failed.connect(lambda msg: failures.append(f"the answer failed: {msg}"))
    win.show()
    try:
        if not wait(lambda: win.model_info is not None):
            raise SystemExit(failures[0] if failures else f"no model after {timeout:.0f} s")
        ready = process_age()
        info = win.model_info
        print(f"ready {ready:.1f} s after launch: {info['model']} at {info['precision']}, "
              f"{info['isa']}, {info['threads']} threads")  # fmt: skip
        win.send(prompt)
        if not wait(lambda: not win.generating):
            raise SystemExit(failures[0] if failures else f"no answer after {timeout:.0f} s")
        msg = win.messages[-1]
        if msg.role != "assistant" or not msg.content.strip() or "error" in msg.stats:
            raise SystemExit(f"no answer: {msg.stats.get('error', 'the answer is empty')}")
        s = msg.stats
        print(f"prompt: {prompt}\nanswer: {msg.content.strip()}")
        print(f"{s['new_tokens']} tokens at {s['tokens_per_s']:.1f} tokens/s; prompt of "
              f"{s['prompt_tokens']} tokens in {s['prefill_s'] * 1000:.0f} ms; "
              f"speedup {s['speedup'] or 1.0:.2f}x")  # fmt: skip
        print(f"serve: {check_serve(win.worker.decoder, win.worker.tokenizer, info['model'])}")
        print("self-test passed")
        return 0
    except SystemExit as e:
        print(f"self-test failed: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001  (any failure is the test's result, with its reason)
        print(f"self-test failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    finally:
        win.close()


def check_serve(decoder, tokenizer, model: str, timeout: float = 120.0) -> str:
    """`kwker serve`'s HTTP server, run in this process on the loaded model on a free loopback
    port, answers one chat completion: its status and answer (SystemExit with the reason
    otherwise). It shows the installed app carries the server and its dependencies."""
    import json
    import threading
    import urllib.request

    import uvicorn

    from kwker.serve import ServingEngine, create_app

    engine = ServingEngine(decoder, tokenizer, max_active=1)
    with engine:
        app = create_app(engine, model, None)
        server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        end = time.monotonic() + timeout
        while not server.started and thread.is_alive() and time.monotonic() < end:
            time.sleep(0.02)
        if not server.started:
            raise SystemExit("kwker serve's HTTP server did not start")
        port = server.servers[0].sockets[0].getsockname()[1]
        body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24,
                "temperature": 0}  # fmt: skip
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                status, reply = r.status, json.load(r)
        except OSError as e:
            raise SystemExit(f"kwker serve did not answer: {e}") from None
        finally:
            server.should_exit = True
            thread.join(timeout)
    answer = reply["choices"][0]["message"]["content"].strip()
    if status != 200 or not answer:
        raise SystemExit(f"kwker serve answered {status} with {answer!r}")
    return f"{status}, {answer}"
