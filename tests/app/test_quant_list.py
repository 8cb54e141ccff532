"""A Hub repo of GGUF files in the model picker (against the hub look-alike on 127.0.0.1): search
marks it, Download opens its quant list (sizes, bits per weight, memory and fit, the default
selected) read without downloading the files, the chosen quant downloads with a moving bar and
becomes a row of its own, and the chat answers with it."""

import sys
from pathlib import Path

import huggingface_hub.constants as hf_constants
import pytest
from app_helpers import LOAD_TIMEOUT_MS, open_window

sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))
import hub_server  # noqa: E402

from kwker.models import catalog as cat  # noqa: E402

pytestmark = pytest.mark.slow
REPO = "tiny/SmolLM2-GGUF"


@pytest.fixture
def gguf_hub(tmp_path, monkeypatch):
    from kwker.models.loader import resolve_model

    smollm2 = resolve_model(None)  # the PyPI-carried SmolLM2-135M-Instruct, Q4_1
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "SmolLM2-135M-Instruct-Q4_1.gguf").symlink_to(smollm2)
    (repo / "SmolLM2-135M-Instruct-Q8_0.gguf").write_bytes(smollm2.read_bytes()[: 1 << 20])
    (repo / "README.md").write_text("# SmolLM2 quants\n")
    state = hub_server.HubState({REPO: repo})
    state.delay_per_chunk = 0.0005
    server, url = hub_server.start(state)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "kwker-cache"))
    yield state, smollm2
    server.shutdown()


def test_a_gguf_repo_lists_its_quants_downloads_one_and_chats(qtbot, data_dir, gguf_hub):
    state, smollm2 = gguf_hub
    win = open_window(qtbot)
    picker = win.model_choice.open_picker()
    qtbot.addWidget(picker)
    picker.search.setText("SmolLM2-GGUF")
    picker.search_hub()
    qtbot.waitUntil(lambda: picker.select(REPO), timeout=30_000)
    assert "GGUF quants" in picker.selected()["status"]
    assert picker.download_button.text() == "Choose a quant…"
    # the size of what Download fetches: the default quant's file
    size = f"{smollm2.stat().st_size / 1e6:.0f} MB"
    qtbot.waitUntil(lambda: picker.table_model.row(REPO)["download"] == size, timeout=30_000)
    picker.download_selected()  # a GGUF repo: its quant list first
    quants = picker.quant_list
    qtbot.waitUntil(lambda: not quants.loading, timeout=30_000)
    assert [q.name for q in quants.quants] == ["Q8_0", "Q4_1"]  # smallest first (Q8_0 is cut)
    name, size, bits, mem, fit = quants.row("Q4_1")
    assert name == "Q4_1 (default)"  # no Q4_K_M: the nearest in bits
    assert size == f"{smollm2.stat().st_size / 1e6:.0f} MB"
    assert 4.5 < float(bits) < 8  # Q4_1 with a Q8_0 embedding, over SmolLM2's 135M weights
    # at the picker's precision (the settings'), as its own table estimates
    assert mem.endswith(f"at {picker.precision.currentData()}") and fit in cat.FIT_LABELS
    # only the default quant's header was read, not the files
    assert sum(state.served.values()) < smollm2.stat().st_size / 4
    seen = []
    picker.progress.valueChanged.connect(seen.append)
    quants.select("Q4_1")
    quants.download.click()
    qtbot.waitUntil(lambda: not picker.downloading, timeout=120_000)
    assert "is ready" in picker.status.text(), picker.status.text()
    assert seen[-1] == 100 and any(0 < v < 100 for v in seen)
    spec = f"{REPO}:Q4_1"
    qtbot.waitUntil(lambda: picker.select(spec), timeout=30_000)
    assert "downloaded" in picker.selected()["status"]
    picker._use()
    qtbot.waitUntil(
        lambda: win.model_info is not None and win.model_info["model"] == spec,
        timeout=LOAD_TIMEOUT_MS,
    )
    win.new_chat()
    assert win.send("What is the capital of France?")
    qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
    assert win.messages[-1].role == "assistant" and win.messages[-1].stats["new_tokens"] >= 1
    picker.close()
