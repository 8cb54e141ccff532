"""The app at the engine's speed and honest about it (issue 23), with the real default model, offscreen:
int4 by default, a speedup measured in the answer itself (1.00x when nothing was proposed, the bench's
ratio on its rewrite task), long chats under the rolling window, the tint and each answer's statistics kept
across a restart."""

import re
import statistics

import pytest
from app_helpers import answer, open_window

from kwker.app.context_window import STOP
from kwker.bench.speculation import TASKS, time_modes

pytestmark = pytest.mark.slow

GREEDY = {"temperature": 0.0, "precision": "int4"}


def test_the_default_precision_is_int4(qtbot, data_dir):
    win = open_window(qtbot, keep_saved=True)  # nothing saved: the app's own defaults
    assert win.settings["precision"] == "int4" and win.model_info["precision"] == "int4"
    assert win.worker.decoder.precision == "int4"
    checked = win.settings_panel.precision.checkedButton()
    assert checked.property("precision") == "int4" and checked.text().startswith("int4")
    # the model's own weights are one click away
    exact = next(b for b in win.settings_panel.precision.buttons() if b.text().startswith("Exact"))
    exact.click()
    assert win.settings_panel.values()["precision"] == "auto"


def test_speedup_is_one_when_nothing_was_proposed(qtbot, data_dir):
    win = open_window(qtbot, {**GREEDY, "lookup": False, "max_new_tokens": 64})
    msg = answer(qtbot, win, "Tell me a short story about a dragon who learns to cook.")
    stats = msg.stats
    assert stats["proposed"] == {} and stats["new_tokens"] > 20
    assert stats["plain_steps"] == stats["steps"] == stats["new_tokens"] - 1
    assert abs(stats["speedup"] - 1.0) <= 0.05
    assert win.stats.speedup.text() == f"{stats['speedup']:.2f}×"
    assert win.stats.reference.text().startswith(f"{stats['plain_tokens_per_s']:.1f} tokens/s")
    assert f"{stats['speedup']:.2f}× plain decoding" in win.view.toPlainText()  # the answer's line


def test_speedup_on_the_rewrite_task_matches_the_bench(qtbot, data_dir):
    """The window's figure (the median of three answers) against `kwker bench --lookup`'s on the same
    decoder and prompt: median tokens/s of prompt lookup over plain decoding, in separate generations
    (7 runs each, alternating). Two timings of a shared 2-core machine, one of them beside the GUI
    thread: each pair is measured again while it is more than 35% apart, and one of three must agree.
    Seen on a Xeon: pairs 8-17% apart at first, and 25-33% apart (the window lower) once the
    bench's plain steps, taken without the GUI beside them, were the window's reference; before
    the reference held the decoder's latest plain steps, 15-40% apart the other way (perf-notes #33).
    The figure itself is tested on made-up step times in test_streaming.py."""
    win = open_window(qtbot, {**GREEDY, "lookup": True, "max_new_tokens": 160})
    msg = answer(qtbot, win, TASKS["rewrite"])
    assert msg.stats["accepted"]["lookup"] > 40
    assert win.stats.speedup.text() == f"{msg.stats['speedup']:.2f}×"  # the answer's own figure
    modes = {"plain": dict(lookup=0), "lookup": dict(lookup=8)}
    pairs = []
    for _ in range(3):
        speedups = []
        for _ in range(3):
            win.regenerate()
            qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
            assert win.messages[-1].content == msg.content  # greedy: the same answer
            speedups.append(win.messages[-1].stats["speedup"])
        speedup = statistics.median(speedups)
        assert speedup > 1.5, speedups
        ids = win.worker.last_prompt
        rows = time_modes(win.worker.decoder, ids, modes, 160, 7, "rewrite", print)
        pairs.append((speedup, rows["lookup"]["speedup"]))
        print(f"rewrite: speedup in the window {speedups} -> {speedup:.2f}x, the bench's "
              f"{pairs[-1][1]:.2f}x")  # fmt: skip
        if abs(speedup / pairs[-1][1] - 1) <= 0.35:
            return
    raise AssertionError(f"(window, bench) speedups more than 35% apart three times: {pairs}")


def test_a_long_chat_rolls_over_and_keeps_the_system_prompt(qtbot, data_dir):
    system = "You are a helpful assistant who loves astronomy."
    win = open_window(
        qtbot,
        {**GREEDY, "context_length": 512, "max_new_tokens": 80, "system_prompt": system},
    )
    assert win.worker.decoder.max_cache_len == 512
    questions = [
        "Tell me about the planet Mars in a few sentences.",
        "Now tell me about Jupiter and its moons.",
        "What is a black hole? Explain it simply.",
        "How far away is the nearest star to the Sun?",
        "Why do stars twinkle at night?",
        "What is the difference between a comet and an asteroid?",
    ]
    reused = []
    for q in questions:
        msg = answer(qtbot, win, q)
        assert msg.role == "assistant" and msg.complete and msg.content.strip(), msg.stats
        assert "error" not in msg.stats
        reused.append(msg.stats["reused_prompt_tokens"])
        prompt = win.worker.tokenizer.decode(win.worker.last_prompt)
        assert system in prompt and q in prompt  # the system prompt is applied to every turn
    conv = win.store.conversation(win.cid)
    assert conv.context_from > 0  # the window moved
    assert len(win.messages) == 12
    first_seen = next(i for i, m in enumerate(win.messages) if m.id == conv.context_from)
    assert win.messages[first_seen].role == "user"
    assert questions[0] not in prompt  # the oldest turn is no longer in the prompt
    assert "no longer in the model's context" in win.view.toPlainText()  # the visible mark
    print("prompt tokens reused per turn:", reused)
    # between cuts only the new turn is computed: most of the prompt comes from the KV cache
    assert max(reused[1:]) > 200, reused


def test_the_stop_policy_says_why(qtbot, data_dir):
    win = open_window(
        qtbot, {**GREEDY, "context_length": 256, "max_new_tokens": 64, "context_overflow": STOP}
    )
    long = "Please summarise this: " + "the quick brown fox jumps over the lazy dog " * 30
    assert win.send(long)
    qtbot.waitUntil(lambda: not win.generating, timeout=60_000)
    assert "no longer fits the context of 256 tokens" in win.status.text()
    assert [m.role for m in win.messages] == ["user"]  # no empty answer left behind


def test_tint_and_statistics_survive_a_restart(qtbot, data_dir):
    win = open_window(qtbot, {**GREEDY, "lookup": True, "max_new_tokens": 160})
    win.apply_settings({**win.settings_panel.values(), "tint_speculation": True}, False)
    msg = answer(qtbot, win, TASKS["rewrite"])
    runs = msg.sources
    assert sum(n for n, _ in runs) == len(msg.content)
    lookup_chars = sum(n for n, source in runs if source == "lookup")
    assert lookup_chars > 100
    color = win.colors["lookup"]
    assert not win.legend.isHidden() and "prompt lookup" in win.legend.text()
    html = win.view.toHtml()
    assert color in html and "<p" in html  # tinted and still Markdown (paragraphs)
    line = win.view.toPlainText().splitlines()
    assert any("tokens/s" in x and "from prompt lookup" in x for x in line)
    win.close()
    again = open_window(qtbot, keep_saved=True)
    assert again.messages[-1].sources == runs
    assert color in again.view.toHtml() and not again.legend.isHidden()
    tinted = re.findall(rf"background-color:{color}[^>]*>([^<]*)<", again.view.toHtml())
    assert sum(len(t) for t in tinted) > 0.8 * lookup_chars
