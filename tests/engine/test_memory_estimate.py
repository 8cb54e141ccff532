"""The memory estimate (kwker.loading.memory) holds: within 15% of the resident memory (VmRSS) of
the app's own process, for SmolLM2-135M and Qwen2.5-Coder-0.5B at two precisions and two contexts,
on a first load (packing the weights into an empty packed-weights cache) and a later one (reading
them back).

Each measurement is a fresh process that runs the chat window (offscreen) on the model, as the app
does: the window loads it on its worker thread, answers one short message (one short generate),
then the test fills the context with one long prompt. The estimate of the first point counts the
positions the KV cache holds then (its pages are resident only where written, perf-notes #6); the
second is the figure the picker's fit uses, the whole context."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from kwker.loading import memory

pytestmark = pytest.mark.slow

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
QWEN = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
CASES = [
    (model, precision, context)
    for model in (SMOLLM2, QWEN)
    for precision in ("int4", "bf16")
    for context in (512, 4096)
]
TOLERANCE = 0.15
SHORT_TOKENS = 64  # positions a short first answer leaves written (the child checks it)

# Shared by both children: the app's process up to its window, shown, with nothing loaded yet.
WINDOW = r"""
import json, os, sys, time
os.environ["QT_QPA_PLATFORM"] = "offscreen"
from PySide6.QtWidgets import QApplication
app = QApplication([])
from kwker.app.store import Store
from kwker.app.views.main_window import MainWindow

def rss():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))

def wait(done, seconds):
    end = time.monotonic() + seconds
    while not done():
        if time.monotonic() > end:
            raise SystemExit(f"timed out; the window says: {win.status.text()}")
        app.processEvents()
        time.sleep(0.005)

store = Store()
store.save_settings(dict(json.loads(sys.argv[1]), temperature=0.0, max_new_tokens=16, lookup=True))
win = MainWindow(store)
win.show()
"""

# The measurement is printed; the interpreter's finalization is not part of it, and once in about
# 30 of these children it aborted there ("none_dealloc: deallocating None", a reference-count
# error in some C extension while Python tears the modules down, after the window had closed).
EXIT = r"""
sys.stdout.flush()
os._exit(0)
"""

RUNTIME_CHILD = (
    WINDOW
    + r"""
wait(lambda: "Could not load" in win.status.text(), 60)
# what a load imports for the tokenizer and its chat template
import kwker.loading.gguf_vocab, kwker.loading.tokenizer_folder, jinja2.ext, jinja2.sandbox
for _ in range(50):
    app.processEvents()
print(json.dumps({"rss": rss()}))
win.close()  # its closeEvent stops the worker's thread
"""
    + EXIT
)

LOAD_CHILD = (
    WINDOW
    + r"""
wait(lambda: win.model_info is not None or "Could not load" in win.status.text(), 600)
assert win.model_info is not None, win.status.text()
dec = win.worker.decoder
assert win.send("Name a colour.")
wait(lambda: not win.generating, 300)
for _ in range(50):
    app.processEvents()
out = {"precision": dec.precision, "kv_cache": dec.kv_cache, "from_cache": dec.from_cache,
       "held": dec.runner.cached_len(0), "short": rss(),
       "weight_bytes_per_token": dec.weight_bytes_per_token}
# then the whole context: one prompt that leaves room for the token it generates
context = dec.max_cache_len
prompt = [int(t) for t in (100 + (i * 7919) % 5000 for i in range(context - 1))]
dec.reset()
dec.generate(prompt, max_new_tokens=1, lookup=0, eos_token_id=[])
out["full"] = rss()
print(json.dumps(out))
win.close()
"""
    + EXIT
)


def run(code: str, settings: dict, cache: str, data: str) -> dict:
    env = dict(os.environ, KWKER_CACHE_DIR=cache, KWKER_DATA_DIR=data, QT_QPA_PLATFORM="offscreen")
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(settings)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def files_of(model: str) -> str:
    """The model's files as resolve_model finds them in the user's own cache (the PyPI GGUFs)."""
    from kwker.models.loader import resolve_model

    return str(resolve_model(model))


def error(estimate: int, measured: int) -> float:
    return estimate / measured - 1


def test_the_layout_constants_are_the_runners():
    from kwker.runner import DEFAULT_LOGIT_ROWS, DEFAULT_STEP_TOKENS

    assert (memory.STEP_TOKENS, memory.LOGIT_ROWS) == (DEFAULT_STEP_TOKENS, DEFAULT_LOGIT_ROWS)


def test_the_runtime_constant_is_the_app_process_before_a_model(tmp_path):
    got = run(RUNTIME_CHILD, {"model": str(tmp_path / "none.gguf")}, str(tmp_path / "c"),
              str(tmp_path / "d"))["rss"]  # fmt: skip
    print(
        f"\nruntime: measured {got / 1e6:.0f} MB, RUNTIME_BYTES {memory.RUNTIME_BYTES / 1e6:.0f} MB"
    )
    assert abs(error(memory.RUNTIME_BYTES, got)) < 0.10, got


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    """(case, load, measured child output, facts) for every case: a cold load into an empty
    packed-weights cache, then a warm one from it."""
    rows = []
    for model, precision, context in CASES:
        path = files_of(model)
        facts = memory.facts_from_files(path)
        root = tmp_path_factory.mktemp("mem")
        settings = {"model": path, "precision": precision, "context_length": context}
        for load in ("cold", "warm"):
            got = run(LOAD_CHILD, settings, str(root / "cache"), str(root / f"data-{load}"))
            assert got["from_cache"] == (load == "warm")
            rows.append(((model, precision, context), load, got, facts))
        shutil.rmtree(root)  # its packed cache (up to 1.2 GB): the figures are what is kept
    lines = [
        f"{'model':34} {'prec':5} {'ctx':>5} {'load':5} {'point':6} {'estimate':>9} {'RSS':>9}"
        f" {'error':>7}"
    ]
    for (model, precision, context), load, got, facts in rows:
        for point, tokens in (("short", SHORT_TOKENS), ("full", None)):
            est = facts.estimate(precision, context, tokens=tokens).total
            lines.append(
                f"{model.split('/')[1]:34} {precision:5} {context:5} {load:5} {point:6}"
                f" {est / 1e6:7.0f}MB {got[point] / 1e6:7.0f}MB {100 * error(est, got[point]):+6.1f}%"
            )
    print("\n" + "\n".join(lines))
    return rows


def test_the_estimate_is_within_15_percent_of_the_rss(measured):
    for (model, precision, context), load, got, facts in measured:
        assert got["precision"] == precision and got["held"] <= SHORT_TOKENS, got
        assert got["kv_cache"] == facts.estimate(precision, context).kv_cache_type
        for point, tokens in (("short", SHORT_TOKENS), ("full", None)):
            est = facts.estimate(precision, context, tokens=tokens)
            assert abs(error(est.total, got[point])) < TOLERANCE, (
                f"{model} {precision} {context} {load} {point}: {est.describe()}, "
                f"RSS {got[point] / 1e6:.0f} MB"
            )


def test_the_packed_weights_are_the_native_steps_own(measured):
    """The weights part counts the matrices exactly as the step packs them: its own count of the
    bytes a token reads (every layer matrix and lm_head, which is the embedding when tied) is
    the estimate's panels less the embedding of an untied model."""
    for (model, precision, _), _, got, facts in measured:
        sizes = memory.matrix_sizes(facts.config, precision, facts.tied, facts.types)
        embed = sizes[0]  # the embedding's panels (a GGUF's Q6_K one in Q6K)
        assert sum(sizes) - (0 if facts.tied else embed) == got["weight_bytes_per_token"], model
