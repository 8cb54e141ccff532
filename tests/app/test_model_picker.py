"""The model picker: catalog, filter, memory fit, Hub search and a download (from a hub look-alike on 127.0.0.1)
with a moving progress bar, then a chat with the new model."""

import sys
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
from app_helpers import LOAD_TIMEOUT_MS, open_window

sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))
import hub_server  # noqa: E402
from helpers import tiny_llama  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture
def hub(tmp_path, monkeypatch):
    from kwker.loading.tokenizer import load_tokenizer
    from kwker.models.loader import resolve_model

    folder = tmp_path / "repo"
    tiny_llama(vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2).save_pretrained(
        folder
    )
    load_tokenizer(resolve_model(None)).save_pretrained(folder)  # SmolLM2's tokenizer
    state = hub_server.HubState({"tiny/chat": folder})
    state.delay_per_chunk = 0.001
    server, url = hub_server.start(state)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    yield state
    server.shutdown()


def test_picker_downloads_a_model_and_the_chat_uses_it(qtbot, data_dir, hub):
    win = open_window(qtbot)
    picker = win.open_models()
    qtbot.addWidget(picker)
    ids = [r["id"] for r in picker.table_model.rows]
    assert "HuggingFaceTB/SmolLM2-135M-Instruct" in ids and len(ids) >= 10
    assert {r["fit"] for r in picker.table_model.rows} <= {"fits", "tight", "won't fit"}
    picker.search.setText("qwen")
    assert picker.table_model.rows and all(
        "qwen" in r["id"].lower() for r in picker.table_model.rows
    )
    picker.search.setText("tiny")
    picker.search_hub()
    assert picker.select("tiny/chat")
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
