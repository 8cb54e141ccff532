"""A speculation tree's branch (runner.Feed.branch_of): a second slot that shares the chain's first
rows in the same step (their K/V written to both caches, Model.step's `also`) gives every row the
logits, bit for bit, that the branch's text gives alone; the caches it leaves hold the bits plain
steps would; Model.copy_cache moves K/V between slots; Model.propose's alternatives (each token's
probability and the runner-up) are the full softmax's. On every ISA, at the float and int4
formats."""

import numpy as np
import pytest
import torch
from helpers import tiny_llama

from kwker import _native
from kwker.hf import KwkDecoder
from kwker.runner import Feed

ISAS = [i for i in ("generic", "avx2", "avx512", "avx512-emulated") if _native.isa_supported(i)]
TEXT = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(8)).tolist()


def alone(dec, text, rows):
    """The logits of a text's last `rows` rows, from a fresh slot: prefill, then one step."""
    runner = dec.runner
    with runner.hold():
        slot = runner.acquire()
        try:
            runner.extend_slot(slot, 0, text[:-rows], rows="none", logits=False)
            return runner.extend_slot(slot, len(text) - rows, text[-rows:], rows="all").logits
        finally:
            runner.release(slot)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("precision", [None, "int4"])
def test_a_branch_row_gives_the_logits_of_its_text_alone(isa, precision, monkeypatch):
    monkeypatch.setenv("KWKER_ISA", isa)
    dec = KwkDecoder(
        tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128),
        64,
        precision=precision,
        threads=2,
        max_batch=3,
    )
    runner = dec.runner
    prefix, chain, branch = TEXT[:30], TEXT[30:36], [7, 8, 9]
    at = 3  # the branch replaces chain[3:]: it shares chain[:3]
    with runner.hold():
        a, b = runner.acquire(), runner.acquire()
        runner.extend_slot(a, 0, prefix, rows="none", logits=False)
        runner.extend_slot(b, 0, prefix[:11], rows="none", logits=False)  # behind: synced
        got_a, got_b = runner.extend(
            [Feed(a, 30, chain, "all"), Feed(b, 30 + at, branch, "all", branch_of=a)]
        )
        got_a, got_b = got_a.logits.copy(), got_b.logits.copy()
        assert runner.cached_len(b) == 30 + at + len(branch)
        # the branch's cache now holds its text: a step after it gives the text's logits alone
        after = runner.extend([Feed(b, 36, [5], "all")])[0].logits.copy()
        # the chain's slot takes the branch's rows back, and goes on as the branch's text
        runner.trim(a, runner.cached_len(a) - 33)
        runner.copy(b, a, 33, 4)
        assert runner.cached_len(a) == 37
        back = runner.extend([Feed(a, 37, [6], "all")])[0].logits.copy()
        runner.release(a)
        runner.release(b)
    assert np.array_equal(got_a, alone(dec, prefix + chain, len(chain)))
    text_b = prefix + chain[:at] + branch
    assert np.array_equal(got_b, alone(dec, text_b, len(branch)))
    assert np.array_equal(after, alone(dec, text_b + [5], 1))
    assert np.array_equal(back, alone(dec, text_b + [5, 6], 1))


def ids(*lists):
    return [np.asarray(v, np.int32) for v in lists]


def test_bad_branches_and_copies_are_refused():
    dec = KwkDecoder(tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128), 64, max_batch=2)
    runner, step = dec.runner, dec.runner._step
    with runner.hold():
        a, b = runner.acquire(), runner.acquire()
        runner.extend_slot(a, 0, TEXT[:5], rows="none", logits=False)
        with pytest.raises(ValueError, match="earlier in the step"):
            runner.extend([Feed(b, 6, [1], branch_of=a)])
        with pytest.raises(ValueError, match="within its tokens"):
            runner.extend([Feed(a, 5, [1, 2]), Feed(b, 5, [3], branch_of=a)])
        with pytest.raises(ValueError, match="two rows write"):  # the branch's own row
            step.step(*ids([1, 2], [a, b], [5, 5], [0]), also=ids([b, -1])[0])
        with pytest.raises(ValueError, match="another slot"):
            step.step(*ids([1], [a], [5], [0]), also=ids([a])[0])
        with pytest.raises(ValueError, match="two different slots"):
            step.copy_cache(a, a, 0, 1)
        with pytest.raises(ValueError, match="outside the cache"):
            step.copy_cache(a, b, 60, 5)
        with pytest.raises(ValueError, match="does not share"):
            runner.copy(a, b, 3, 1)  # b holds nothing
        assert runner.cached_len(a) == 5 and runner.cached_len(b) == 0  # nothing lost
        runner.release(a)
        runner.release(b)


@pytest.mark.parametrize("isa", ISAS)
def test_propose_alternatives_are_the_softmax_and_the_runner_up(isa, monkeypatch):
    monkeypatch.setenv("KWKER_ISA", isa)
    dec = KwkDecoder(tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128), 64, threads=2)
    runner = dec.runner
    with runner.hold():
        slot = runner.acquire()
        ids, probs, second = runner.propose_greedy(slot, 0, TEXT[:9], 5, alternatives=True)
        runner.release(slot)
    text = TEXT[:9] + ids
    logits = alone(dec, text[:-1], 5)  # row i: after text[:9 + i]
    for i, row in enumerate(logits):
        order = np.argsort(-row, kind="stable")
        assert ids[i] == order[0] and second[i] == order[1]
        want = 1.0 / _native.softmax_stats(row, 1.0, 0.0)[1]
        assert probs[i] == pytest.approx(want, rel=1e-6)
