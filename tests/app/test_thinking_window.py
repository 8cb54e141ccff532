"""A thinking model in the window: the Think toggle (shown for a template with the switch, saved
with the conversation, changing the prompt), the thinking streamed into its own dimmed block
above the answer (open while it streams, closed once finished, opened and closed by its link),
saved apart from the answer and restored, exported, and left out of later prompts.

The model is a tiny random Qwen3 loaded from its folder, through the app's own loading and
prompt building; its decoder's stream is scripted (a random model does not think), token by
token through the real tokenizer."""

import json
import time

import pytest
from app_helpers import answer, open_window
from thinking_model import qwen3_tokenizer, tiny_qwen3

from kwker.app.export import export
from kwker.app.store import Store
from kwker.streaming import GenerationChunk, GenerationStats

THOUGHT = "The user counts: one, two, three."
WRITTEN = f"<think>\n{THOUGHT}\n</think>\n\nThree."


@pytest.fixture(scope="module")
def folder(tmp_path_factory, smollm2_tokenizer):
    path = tmp_path_factory.mktemp("tiny-qwen3")
    tok = qwen3_tokenizer(smollm2_tokenizer)
    tiny_qwen3(vocab=len(tok) + 6).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def scripted(decoder, tokenizer, seconds: float = 0.0):
    """decoder.stream_generate answers the next text of `texts` (token by token, each after
    `seconds`) whatever the prompt; the prompts are kept."""
    texts, prompts = [], []

    def stream_generate(ids, max_new_tokens, tokenizer=tokenizer, **_):
        prompts.append(list(ids))
        tokens = tokenizer(texts.pop(0), add_special_tokens=False)["input_ids"]
        stats = GenerationStats(prompt_tokens=len(ids))
        for i, token in enumerate(tokens):
            time.sleep(seconds)
            stats.new_tokens, stats.decode_s = i + 1, (i + 1) * 0.01
            last = i == len(tokens) - 1
            text = tokenizer.decode([token])
            yield GenerationChunk(token, text, stats, "eos" if last else None)

    decoder.stream_generate = stream_generate
    return texts, prompts


def test_thinking_in_the_window(qtbot, data_dir, folder, tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))
    win = open_window(qtbot, {"model": str(folder), "precision": "fp32", "context_length": 512})
    assert win.model_info["think_switch"] and win.model_info["thinks"]
    think = win.chat.think
    assert not think.isHidden() and think.isEnabled() and think.isChecked()
    tokenizer = win.worker.tokenizer
    texts, prompts = scripted(win.worker.decoder, tokenizer, seconds=0.03)

    # the thinking streams into an open block, above the answer
    texts.append(WRITTEN)
    assert win.send("How many?")
    qtbot.waitUntil(lambda: "one, two" in win.view.toPlainText(), timeout=20_000)
    assert win.generating and "▾ Thinking" in win.view.toPlainText()
    qtbot.waitUntil(lambda: not win.generating, timeout=20_000)
    first = win.messages[-1]
    assert (first.content, first.thinking) == ("Three.", THOUGHT)
    spelled = len(tokenizer.encode(f"<think>\n{THOUGHT}\n</think>", add_special_tokens=False))
    assert first.stats["thinking_tokens"] == spelled and first.stats["thinking_s"] > 0
    decoded = tokenizer.decode(prompts[-1])
    assert decoded.endswith("How many?<|im_end|>\n<|im_start|>assistant\n")  # thinking on

    # finished: closed, with its length; its link opens and closes it
    shown = win.view.toPlainText()
    assert f"▸ Thinking {spelled} tokens" in shown and THOUGHT not in shown
    assert f"{spelled} of {first.stats['new_tokens']} tokens thinking" in shown  # the stats line
    assert shown.index("Thinking") < shown.index("Three.")
    win.chat.toggle_thinking(1)
    assert THOUGHT in win.view.toPlainText() and "▾ Thinking" in win.view.toPlainText()
    win.chat.toggle_thinking(1)
    assert THOUGHT not in win.view.toPlainText()

    # Think off: saved with the conversation, the template's empty thinking in the prompt, and
    # the first answer's thinking left out of it
    think.setChecked(False)
    assert win.store.conversation(win.cid).think is False
    texts.append("Four.")
    second = answer(qtbot, win, "And one more?")
    assert (second.content, second.thinking) == ("Four.", "")
    assert "thinking_tokens" not in second.stats
    decoded = tokenizer.decode(prompts[-1])
    assert decoded.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert "Three.<|im_end|>" in decoded and "one, two" not in decoded

    # exported with its answer
    md = export(win.store, win.cid, "md", win.model_info, win.effective_settings())
    assert f"<details><summary>Thinking ({spelled} tokens" in md and THOUGHT in md
    assert md.index(THOUGHT) < md.index("Three.")
    data = json.loads(export(win.store, win.cid, "json", win.model_info, {}))
    assert [m["thinking"] for m in data["messages"]] == ["", THOUGHT, "", ""]
    page = export(win.store, win.cid, "html", win.model_info, {})
    assert '<details class="thinking"><summary>Thinking' in page and THOUGHT in page
    cid = win.cid
    win.close()
    win.store.close()

    # saved, and restored after the store is opened again
    store = Store()
    restored = store.messages(cid)
    assert [m.thinking for m in restored] == ["", THOUGHT, "", ""]
    assert restored[1].stats["thinking_tokens"] == spelled and not store.conversation(cid).think
    store.close()
    again = open_window(qtbot, keep_saved=True)
    again.open_conversation(cid)
    assert not again.chat.think.isChecked() and not again.chat.think.isHidden()
    assert "▸ Thinking" in again.view.toPlainText() and THOUGHT not in again.view.toPlainText()


def test_no_toggle_for_a_model_without_the_switch(qtbot, data_dir):
    win = open_window(qtbot)  # SmolLM2: no thinking in its template
    assert not win.model_info["thinks"] and not win.model_info["think_switch"]
    assert win.chat.think.isHidden()
