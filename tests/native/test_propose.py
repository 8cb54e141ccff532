"""Model.propose (a draft's k greedy steps in one native call) and the head subset it can read: the
same tokens as k separate steps, the same cache, and each subset logit the full head's bits, on
every ISA and format."""

import numpy as np
import pytest
import torch
from helpers import WithoutPropose, tiny_llama

from kwker import _native
from kwker.hf import KwkDecoder

ISAS = [i for i in ("generic", "avx2", "avx512", "avx512-emulated") if _native.isa_supported(i)]
PROMPT = torch.randint(0, 1000, (13,), generator=torch.Generator().manual_seed(5)).tolist()


def steps_one_by_one(dec, prompt, k):
    """k greedy tokens after prompt, one native step each (the reference)."""
    dec.reset()
    runner = dec.runner
    with runner.hold():
        slot = runner.acquire(0)
        try:
            out, feed, at = [], list(prompt), 0
            while len(out) < k:
                out.append(runner.extend_slot(slot, at, feed, logits=False).argmax[-1])
                feed, at = out[-1:], at + len(feed)
        finally:
            runner.release(slot)
    return out


def propose(dec, prompt, k, subset=False, reuse=0):
    runner = dec.runner
    with runner.hold():
        slot = runner.acquire(0)
        try:
            runner.trim(slot, runner.cached_len(slot) - reuse)
            out = runner.propose_greedy(slot, reuse, prompt[reuse:], k, subset=subset)
            assert runner.cached_len(slot) == len(prompt) + k - 1  # the last is not run
            return out
        finally:
            runner.release(slot)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("precision", [None, "bf16", "fp16", "balanced", "int4"])
@pytest.mark.parametrize("tied", [True, False])
def test_propose_gives_the_steps_tokens_and_the_subset_the_full_heads_bits(
    isa, precision, tied, monkeypatch
):
    monkeypatch.setenv("KWKER_ISA", isa)
    model = tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128, tied=tied)
    dec = KwkDecoder(model, max_cache_len=64, precision=precision, threads=2)
    assert dec.isa == isa
    want = steps_one_by_one(dec, PROMPT, 7)
    dec.reset()
    assert propose(dec, PROMPT, 7) == want
    # after a rollback: a catch-up of 3 tokens on a cache that holds the first 10
    assert propose(dec, PROMPT, 7, reuse=10) == want
    full = dec.forward(PROMPT + want[:3]).numpy()  # (T, vocab) the full head's logits
    ids = np.sort(np.random.default_rng(1).choice(1000, 300, replace=False)).astype(np.int32)
    dec.runner.set_head_subset(ids)
    assert dec.runner.head_subset_size == 300
    dec.reset()
    got = propose(dec, PROMPT, 4, subset=True)
    rows = [full[len(PROMPT) - 1 + i] for i in range(4)]
    # each token is the argmax over the subset of the full head's logits after the tokens before it:
    # the same bits, so the same argmax (ties to the first, in the subset's order)
    expect, prefix = [], list(PROMPT)
    for _ in range(4):
        logits = dec.forward(prefix).numpy()[-1]
        expect.append(int(ids[np.argmax(logits[ids])]))
        prefix.append(expect[-1])
    assert got == expect
    # the logits the subset step leaves are the full head's at those ids, bit for bit
    dec.reset()
    propose(dec, PROMPT, 1, subset=True)
    left = dec.runner._step.logits(1)[0, :300]
    assert np.array_equal(left, rows[0][ids])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("precision", [None, "bf16", "int4"])
def test_a_subset_set_again_holds_the_same_bits_as_one_set_once(isa, precision, monkeypatch):
    """Set again (as a draft does for each text), the subset copies only the rows whose id changed
    at their index, into its own space while it fits: each subset, reached from any other (a
    prefix kept, rows replaced, grown past its room, shrunk), leaves the logits a subset set once
    on a fresh decoder leaves, bit for bit."""
    monkeypatch.setenv("KWKER_ISA", isa)
    model = tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128, tied=False)
    rng = np.random.default_rng(2)
    base = np.arange(0, 200, dtype=np.int32)
    subsets = [
        base,
        np.concatenate([base, [700, 512, 999]]),  # a text's tokens after the frequent ones
        np.concatenate([base, [700, 300, 301, 302]]),  # the next text: one row kept, others new
        np.concatenate([base, rng.choice(np.arange(200, 1000), 400, replace=False)]),  # past room
        base[:50],  # shrunk: the rows past 50 are stale, not read
        np.concatenate([base[::-1], [650]]),  # every row moved
    ]

    def left_logits(dec, ids):
        dec.reset()
        propose(dec, PROMPT, 1, subset=True)
        return dec.runner._step.logits(1)[0, : len(ids)].copy()

    dec = KwkDecoder(model, max_cache_len=64, precision=precision, threads=2)
    for ids in subsets:
        dec.runner.set_head_subset(ids)
        assert dec.runner.head_subset_size == len(ids)
        fresh = KwkDecoder(model, max_cache_len=64, precision=precision, threads=2)
        fresh.runner.set_head_subset(ids)
        assert np.array_equal(left_logits(dec, ids), left_logits(fresh, ids)), len(ids)


def test_bad_proposals_and_subsets_are_refused():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=64)
    dec = KwkDecoder(model, max_cache_len=32)
    m = dec.runner._step
    with pytest.raises(RuntimeError, match="subset"):
        m.propose(np.array([1, 2], np.int32), 0, 0, 2, True)  # no subset set
    for bad in ([], [1, 1], [-1], [1000]):
        with pytest.raises(ValueError):
            m.set_head_subset(np.array(bad, np.int32))
    with pytest.raises(ValueError):
        m.propose(np.array([1, 2], np.int32), 0, 30, 4)  # past the cache
    with pytest.raises(ValueError):
        m.propose(np.array([1, 2000], np.int32), 0, 0, 2)
    with pytest.raises(ValueError):
        m.propose(np.array([1, 2], np.int32), 3, 0, 2)  # no such slot
    with pytest.raises(ValueError):
        m.propose(np.array([1, 2], np.int32), 0, 0, 0)
    assert len(m.propose(np.array([1, 2], np.int32), 0, 0, 3)) == 3  # and it still proposes


def softmax_top(row):
    """The softmax probability of a row's largest logit, in float64."""
    row = np.asarray(row, np.float64)
    return 1.0 / np.exp(row - row.max()).sum()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("subset", [False, True])
def test_a_proposal_stops_where_its_tokens_probability_falls_below_min_prob(
    isa, subset, monkeypatch
):
    """min_prob: the proposal ends with the first token at which the product of the proposed
    tokens' probabilities (each the softmax of its row of logits over the head it read) falls below
    it; the tokens are the full proposal's first ones, and the cache holds all but the last."""
    monkeypatch.setenv("KWKER_ISA", isa)
    model = tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128)
    dec = KwkDecoder(model, max_cache_len=64, precision="int4", threads=2)
    ids = np.arange(0, 1000, 3, dtype=np.int32)  # every third token
    if subset:
        dec.runner.set_head_subset(ids)
    full = propose(dec, PROMPT, 8, subset=subset)
    # the running product of each proposed token's probability, from the full head's logits
    logits = dec.forward(PROMPT + full[:-1]).numpy()[len(PROMPT) - 1 :]  # (8, vocab)
    kept = np.cumprod([softmax_top(row[ids] if subset else row) for row in logits])
    for n in (1, 3, 6):  # stop after token n: min_prob between the products after n - 1 and n
        before = kept[n - 2] if n > 1 else 1.0
        min_prob = float(np.sqrt(kept[n - 1] * before))  # (a product shrinks: every p < 1 here)
        assert kept[n - 1] < min_prob < before
        dec.reset()
        runner = dec.runner
        with runner.hold():
            slot = runner.acquire(0)
            got = runner.propose_greedy(slot, 0, PROMPT, 8, subset=subset, min_prob=min_prob)
            assert runner.cached_len(slot) == len(PROMPT) + len(got) - 1
            runner.release(slot)
        assert got == full[:n], n
        if not subset:  # the runner's step-by-step fallback stops at the same token
            dec.reset()
            step = runner._step
            runner._step = WithoutPropose(step)
            try:
                with runner.hold():
                    slot = runner.acquire(0)
                    assert runner.propose_greedy(slot, 0, PROMPT, 8, min_prob=min_prob) == got
                    runner.release(slot)
            finally:
                runner._step = step
    with pytest.raises(ValueError, match="min_prob"):
        dec.runner._step.propose(np.array(PROMPT, np.int32), 0, 0, 2, subset, 1.5)
