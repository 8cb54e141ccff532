"""stream_generate: chunks, closing stops generation, KV-cache reuse across calls, UTF-8 safe text pieces."""

import statistics
import time

from helpers import tiny_llama

from kwker.decode import KwkDecoder
from kwker.streaming import GenerationStats, StreamingDetokenizer

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
    """decode_s runs from the first new token to the latest: a reader that takes 20 ms per token gets a rate of at
    most 50 tokens/s, whatever the native steps take."""
    dec = make()
    t0 = time.perf_counter()
    for chunk in dec.stream_generate(PROMPT, max_new_tokens=10, eos_token_id=[], lookup=0):  # noqa: B007 (the last is read below)
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
    """Token i is byte i; decode() shows an incomplete UTF-8 sequence as U+FFFD, as real tokenizers do."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_detokenizer_never_emits_half_a_character():
    detok = StreamingDetokenizer(ByteTokenizer())
    text = "héllo\n€ ok"
    pieces = [detok.add(b) for b in text.encode()]
    assert "".join(pieces) + detok.flush() == text
    assert all("\ufffd" not in p for p in pieces)
    assert pieces[1] == "" and pieces[2] == "é"  # held back until the second byte arrives


def step(s: GenerationStats, source, fed: int, seconds: float) -> str | None:
    """One decode step, counted and timed as Sequence.absorb does."""
    s.steps += 1
    return s.add_step(source, fed, seconds)


def test_an_answer_with_few_plain_steps_is_measured_against_the_decoders_latest_warm_ones():
    """An answer's first COLD_STEPS decode steps run slower than steady ones (the caches are cold
    after prefill): its cold plain step is left out of the reference, which is the median of the
    latest 32 warm ones, the decoder's earlier ones included."""
    s = GenerationStats(new_tokens=22, plain_before=[0.010] * 40)
    assert step(s, None, 1, 0.014) == "cold"  # the answer's first step
    for _ in range(4):
        assert step(s, "lookup", 5, 0.020) is None
    assert step(s, None, 1, 0.011) == "warm"  # its sixth
    assert s.reference_steps == [0.010] * 31 + [0.011] and s.plain_step_s == 0.010
    assert s.speedup == 21 * 0.010 / (2 * statistics.median([0.014, 0.011]) + 4 * 0.020)
    summary = s.summary()
    assert (summary["reference_steps"], summary["reference_own"], summary["plain_steps"]) == (
        32,
        1,
        2,
    )
    plain = GenerationStats(new_tokens=3, plain_before=[0.010] * 40)
    step(plain, None, 1, 0.014)
    step(plain, None, 1, 0.012)
    assert plain.speedup == 1.0  # nothing proposed: this answer was plain decoding


def test_a_fresh_decoders_first_answer_is_measured_against_its_cold_steps_if_it_has_no_other():
    s = GenerationStats(new_tokens=13)
    step(s, None, 1, 0.014)
    for _ in range(3):
        step(s, "lookup", 5, 0.020)
    assert s.reference_steps == [0.014] and s.summary()["reference_own"] == 1
    assert s.speedup == 12 * 0.014 / (0.014 + 3 * 0.020)
    step(s, None, 1, 0.011)  # a warm one: the cold one leaves the reference
    assert s.reference_steps == [0.011] and s.summary()["reference_own"] == 1


def test_without_warm_plain_steps_the_decoders_cold_ones_are_the_reference():
    """A decoder whose answers were all speculated after their first steps has only cold plain
    steps: an answer with none of its own is measured against those, not left without a figure."""
    s = GenerationStats(new_tokens=9, cold_before=[0.013, 0.012])
    for _ in range(2):
        step(s, "lookup", 5, 0.020)
    assert s.reference_steps == [0.013, 0.012] and s.summary()["reference_own"] == 0
    assert s.speedup == 8 * statistics.median([0.013, 0.012]) / (2 * 0.020)
    warm = GenerationStats(new_tokens=9, plain_before=[0.010], cold_before=[0.013])
    step(warm, "lookup", 5, 0.020)
    assert warm.reference_steps == [0.010]


def test_the_decoder_hands_its_latest_warm_plain_steps_to_the_next_answer():
    dec = make()
    dec.generate(PROMPT, max_new_tokens=12, eos_token_id=[], lookup=0)
    first = dec.last_stats.step_times[("plain", 1)]
    assert dec.last_stats.plain_before == [] and len(first) == 11
    warm = first[GenerationStats.COLD_STEPS :]
    assert dec.last_stats.reference_steps == warm
    dec.generate(PROMPT, max_new_tokens=12, eos_token_id=[], lookup=0)
    s = dec.last_stats
    assert s.plain_before == warm
    assert s.reference_steps == warm + s.step_times[("plain", 1)][GenerationStats.COLD_STEPS :]


def test_an_answer_without_plain_steps_is_measured_against_earlier_ones_if_there_are_any():
    s = GenerationStats(new_tokens=9, plain_before=[0.010] * 5)
    for _ in range(2):
        s.add_step("lookup", 5, 0.020)
    assert s.plain_steps == 0 and s.speedup == 8 * 0.010 / (2 * 0.020)
    assert s.summary()["reference_steps"] == 5
    alone = GenerationStats(new_tokens=9)  # a fresh decoder's answer that copied from the start
    for _ in range(2):
        alone.add_step("lookup", 5, 0.020)
    assert alone.speedup is None and alone.plain_step_s == 0.0
    assert GenerationStats(new_tokens=1, plain_before=[0.010]).speedup is None  # no step yet
