"""stream_generate: chunks, closing stops generation, KV-cache reuse across calls, UTF-8 safe text
pieces."""

import time

from helpers import tiny_llama

from kwker.hf import KwkDecoder
from kwker.streaming import StreamingDetokenizer

PROMPT = [4, 8, 15, 16, 23, 42]


def make():
    return KwkDecoder(tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96), max_cache_len=128)


def test_stream_matches_generate_and_reports_stats():
    dec = make()
    chunks = list(dec.stream_generate(PROMPT, max_new_tokens=10, eos_token_id=[], lookup=0))
    assert [c.token for c in chunks] == dec.generate(PROMPT, max_new_tokens=10, eos_token_id=[])[
        0, 6:
    ].tolist()
    assert [c.finish_reason for c in chunks] == [None] * 9 + ["length"]
    stats = chunks[-1].stats
    assert stats.new_tokens == 10 and stats.steps == 9 and stats.prompt_tokens == 6


def test_closing_the_stream_stops_and_keeps_the_cache_consistent():
    dec = make()
    full = dec.generate(PROMPT, max_new_tokens=12, eos_token_id=[])[0].tolist()
    stream = dec.stream_generate(
        PROMPT, max_new_tokens=12, eos_token_id=[], lookup=0
    )  # one token per step
    first = [next(stream).token for _ in range(4)]
    stream.close()
    assert first == full[6:10]
    assert dec.last_stats.new_tokens == 4
    # continuing from the partial text reuses its cache and gives the same continuation
    cont = dec.generate(PROMPT + first, max_new_tokens=8, eos_token_id=[])[0].tolist()
    assert dec.last_stats.reused_prompt_tokens == len(PROMPT) + 3
    assert cont == full[:18]


def test_chat_turn_reuses_the_history():
    dec = make()
    turn1 = dec.generate(PROMPT, max_new_tokens=5, eos_token_id=[])[0].tolist()
    history = turn1 + [99, 100, 101]
    turn2 = dec.generate(history, max_new_tokens=5, eos_token_id=[])[0].tolist()
    assert (
        dec.last_stats.reused_prompt_tokens == len(turn1) - 1
    )  # the last answer token was never fed
    dec.reset()
    assert dec.generate(history, max_new_tokens=5, eos_token_id=[])[0].tolist() == turn2
    assert dec.last_stats.reused_prompt_tokens == 0


def test_a_diverging_prompt_reuses_only_the_shared_prefix_and_then_its_own_text():
    dec, fresh = make(), make()
    turn1 = dec.generate(PROMPT, max_new_tokens=8, eos_token_id=[])[0].tolist()
    other = PROMPT[:4] + [77, 78]  # shares 4 tokens with the cached text, then differs
    turn2 = dec.generate(other, max_new_tokens=6, eos_token_id=[])[0].tolist()
    assert dec.last_stats.reused_prompt_tokens == 4
    assert turn2 == fresh.generate(other, max_new_tokens=6, eos_token_id=[])[0].tolist()
    fresh.reset()
    turn3 = dec.generate(turn2 + [5], max_new_tokens=4, eos_token_id=[])[0].tolist()
    assert (
        dec.last_stats.reused_prompt_tokens == len(turn2) - 1
    )  # not a token of turn1's stale tail
    assert turn3 == fresh.generate(turn2 + [5], max_new_tokens=4, eos_token_id=[])[0].tolist()
    assert turn1 != turn2


def test_generation_rate_is_the_wall_clock_the_consumer_sees():
    """decode_s runs from the first new token to the latest: a reader that takes 20 ms per token
    gets a rate of at most 50 tokens/s, whatever the native steps take."""
    dec = make()
    t0 = time.perf_counter()
    # the loop variable outlives the loop: the last chunk is read below
    for chunk in dec.stream_generate(PROMPT, max_new_tokens=10, eos_token_id=[], lookup=0):  # noqa: B007
        time.sleep(0.02)
    total = time.perf_counter() - t0
    stats = chunk.stats
    assert 9 * 0.02 <= stats.decode_s <= total
    assert stats.tokens_per_s <= 50.0


def test_eos_ends_the_stream():
    dec = make()
    free = dec.generate(PROMPT, max_new_tokens=6, eos_token_id=[])[0, 6:].tolist()
    eos = free[-1]
    chunks = list(dec.stream_generate(PROMPT, max_new_tokens=6, eos_token_id=eos))
    assert [c.token for c in chunks] == free[: free.index(eos) + 1]
    assert chunks[-1].finish_reason == "eos"


class ByteTokenizer:
    """Token i is byte i; decode() shows an incomplete UTF-8 sequence as U+FFFD, as real tokenizers
    do."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_detokenizer_never_emits_half_a_character():
    detok = StreamingDetokenizer(ByteTokenizer())
    text = "héllo\n€ ok"
    pieces = [detok.add(b) for b in text.encode()]
    assert "".join(pieces) + detok.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1] == "" and pieces[2] == "é"  # held back until the second byte arrives
