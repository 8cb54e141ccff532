"""A model's sampling preset, from each of its three sources, in the real window: the values in
force and the settings panel's word on where each came from; a user's value wins. And a cut
answer's Continue: the model goes on from its text, in the same message."""

import json
import sys
from pathlib import Path

import gguf
import pytest
from app_helpers import TEST_MODEL, answer, open_window

sys.path.insert(0, str(Path(__file__).parent.parent / "engine"))
from helpers import tiny_llama  # noqa: E402

from kwker.loading.sampling_defaults import GENERATION_CONFIG, GGUF  # noqa: E402
from kwker.models.presets import CATALOG  # noqa: E402

pytestmark = pytest.mark.slow
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def with_sampling_keys(src: Path, dst: Path, keys: dict) -> Path:
    """A copy of GGUF `src` with `keys` added to its metadata (as llama.cpp's converter writes
    general.sampling.*), its tensors as they are."""
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue  # the writer's own
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), value_type, sub_type=sub_type)
    for name, value in keys.items():
        if isinstance(value, int):
            writer.add_uint32(name, value)
        else:
            writer.add_float32(name, value)
    for t in reader.tensors:
        writer.add_tensor(t.name, t.data, raw_shape=t.data.shape, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def window_on(qtbot, model: str):
    """The window on `model`, with no sampling of the user's own saved."""

    win = open_window(qtbot, {"model": model})
    win.store.forget_settings(SAMPLING)  # the tests' greedy settings: not the user's here
    win.close()
    return open_window(qtbot, keep_saved=True)


def test_the_preset_comes_from_the_gguf_then_the_folder_then_the_catalog(qtbot, data_dir, tmp_path):
    from kwker.models.loader import resolve_model

    # 1. a GGUF's general.sampling.* (and the catalog has nothing for a file path)
    keys = {"general.sampling.temp": 0.35, "general.sampling.top_k": 33}
    path = with_sampling_keys(resolve_model(TEST_MODEL), tmp_path / "sampled.gguf", keys)
    win = window_on(qtbot, str(path))
    assert win.settings["temperature"] == pytest.approx(0.35) and win.settings["top_k"] == 33
    assert win.preset["sources"] == {"temperature": GGUF, "top_k": GGUF}
    said = win.settings_panel.sources.text()
    assert f"temperature, top-k: {GGUF}" in said and "top-p" in said  # the rest: the default's
    # a user's value wins, and is kept as theirs
    win.apply_settings({**win.settings_panel.values(), "temperature": 0.9}, False)
    assert win.settings["temperature"] == 0.9 and win.store.settings()["temperature"] == 0.9
    assert "temperature: your setting" in win.settings_panel.sources.text()
    win.store.forget_settings(SAMPLING)
    win.close()

    # 2. a folder's generation_config.json
    folder = tmp_path / "folder"
    tiny_llama(vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2).save_pretrained(
        folder
    )
    from kwker.loading.tokenizer import load_tokenizer

    load_tokenizer(resolve_model(TEST_MODEL)).save_pretrained(folder)
    config = {"do_sample": True, "temperature": 0.45, "top_p": 0.85, "repetition_penalty": 1.15}
    (folder / "generation_config.json").write_text(json.dumps(config))
    win = window_on(qtbot, str(folder))
    assert win.settings["temperature"] == pytest.approx(0.45)
    assert win.settings["top_p"] == pytest.approx(0.85)
    assert win.settings["repetition_penalty"] == pytest.approx(1.15)
    assert set(win.preset["sources"].values()) == {GENERATION_CONFIG}
    assert GENERATION_CONFIG in win.settings_panel.sources.text()
    win.close()

    # 3. the catalog's entry (SmolLM2's files name no sampling)
    win = window_on(qtbot, TEST_MODEL)
    from kwker.models.catalog import entry

    listed = entry(TEST_MODEL).preset
    assert listed and all(win.settings[k] == pytest.approx(v) for k, v in listed.items())
    assert set(win.preset["sources"].values()) == {CATALOG}
    assert CATALOG in win.settings_panel.sources.text()


def test_a_cut_answer_continues_in_the_same_message(qtbot, data_dir):
    win = open_window(qtbot, {"max_new_tokens": 16})
    cut = answer(qtbot, win, "Write a long story about a lighthouse keeper.")
    assert cut.stats["finish_reason"] == "length" and cut.stats["new_tokens"] == 16
    assert "Stopped at 16 tokens" in win.view.toPlainText()
    assert 'href="continue:0"' in win.view.toHtml() or "Continue" in win.view.toPlainText()
    assert win.branches.continue_answer()
    qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
    went_on = win.messages[-1]
    assert went_on.id == cut.id and len(win.messages) == 2  # the same message, no new one
    assert went_on.content.startswith(cut.content) and len(went_on.content) > len(cut.content)
    assert went_on.stats["new_tokens"] >= 1 and went_on.complete
    # greedy: the two parts read as the 32-token answer does (the text is tokenized again at
    # the cut, which may join its last word to the next, so it is compared as text)
    win.apply_settings({**win.settings_panel.values(), "max_new_tokens": 32}, False)
    win.new_chat()
    whole = answer(qtbot, win, "Write a long story about a lighthouse keeper.")
    assert whole.content.startswith(went_on.content[: len(cut.content) + 8]), (
        whole.content,
        went_on.content,
    )
