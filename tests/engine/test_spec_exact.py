"""Speculative decoding never changes the output: greedy and seeded sampling give the same tokens
with or without prompt lookup and a draft model, bit for bit (the batch-invariant kernels make this
possible), on tiny models and on the real SmolLM2 pair, trees included."""

import pytest
import torch
from helpers import WithoutPropose
from spec_fakes import PLAIN, REPEATS, chat_ids, real_pair, run, tiny_small, tiny_target

from kwker.hf import KwkDecoder
from kwker.speculative import DraftProposer, Speculator


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def small():
    return tiny_small()


@pytest.mark.parametrize("precision", [None, "bf16", "fp16", "balanced", "int4"])
def test_greedy_same_with_lookup_and_draft(target, small, precision):
    dec = KwkDecoder(target, max_cache_len=128, precision=precision)
    draft = KwkDecoder(small, max_cache_len=128, precision=precision)
    for prompt in (REPEATS, PLAIN):
        plain = run(dec, prompt, lookup=0)
        assert torch.equal(run(dec, prompt), plain)  # lookup=8, the default
        assert torch.equal(run(dec, prompt, lookup=0, draft=draft), plain)
        assert torch.equal(run(dec, prompt, lookup=3, draft=draft), plain)


@pytest.mark.parametrize("seed", range(12))
def test_seeded_sampling_same_with_lookup_and_draft(target, small, seed):
    dec = KwkDecoder(target, max_cache_len=128)
    draft = KwkDecoder(small, max_cache_len=128)
    plain = run(dec, REPEATS, seed=seed, lookup=0)
    assert torch.equal(run(dec, REPEATS, seed=seed), plain)
    assert torch.equal(run(dec, REPEATS, seed=seed, lookup=0, draft=draft), plain)
    assert torch.equal(run(dec, REPEATS, seed=seed, draft=draft), plain)


def test_seeded_sampling_same_with_self_draft_in_bf16(target):
    dec = KwkDecoder(target, max_cache_len=128, precision="bf16")
    draft = KwkDecoder(target, max_cache_len=128, precision="bf16")
    for seed in range(4):
        assert torch.equal(
            run(dec, PLAIN, seed=seed, lookup=0, draft=draft), run(dec, PLAIN, seed=seed, lookup=0)
        )


@pytest.fixture(scope="module")
def smollm2_pair(smollm2):
    return real_pair(smollm2)


def draft_every_step(monkeypatch, width=4):
    """Makes the Speculator give the draft `width` tokens at every step, whatever this machine's
    timings say it pays (the tests that use it check tokens, which must not depend on them)."""
    best_k = Speculator._best_k

    def forced(self, source, room, accept=None, long=False):
        return min(width, room) if source == "draft" else best_k(self, source, room, accept, long)

    monkeypatch.setattr(Speculator, "_best_k", forced)


def fresh(dec, ids, n, seed, temperature, **kw):
    """dec's text after ids from an empty cache (greedy, or sampled from seed), and its stats."""
    sampling = {}
    if seed is not None:
        sampling = dict(
            do_sample=True, temperature=temperature, generator=torch.Generator().manual_seed(seed)
        )
    dec.reset()
    out = dec.generate(torch.tensor([ids]), max_new_tokens=n, **sampling, **kw)
    return out, dec.last_stats


@pytest.mark.slow
@pytest.mark.parametrize("seed", [None, 0])
def test_real_model_same_text_with_each_new_mechanism(smollm2_pair, seed, monkeypatch):
    """Greedy and seeded sampling on the real SmolLM2: the same tokens with the suffix lookup, the
    draft's proposals in one native call or step by step, its pruned head (8192 of 49152 rows
    here), and with or without the proposals' stop at the draft's low confidence
    (Speculator.STOP_MAX). The draft is given 4 tokens at every step, so it proposes whatever this
    machine's timings."""
    dec, draft, tokenizer = smollm2_pair
    text = (
        "Fix the typos and return the whole paragraph: The quick brwon fox jumpd over the lazy "
        "dog. It was a sunny day and the fox was verry happy."
    )
    ids = chat_ids(tokenizer, text)

    def gen(**kw):
        return fresh(dec, ids, 40, seed, 0.8, **kw)

    plain, _ = gen(lookup=0)
    # (head rows, proposals in one native call): the step-by-step proposal only greedy, for time
    combos = [(0, True, 0.0), (0, True, 0.9), (8192, True, 0.9)]
    combos += [(0, False, 0.9)] if seed is None else []
    for subset, native, stop in combos:
        monkeypatch.setattr(DraftProposer, "HEAD_SUBSET", subset)
        monkeypatch.setattr(Speculator, "STOP_MAX", stop)
        draft_every_step(monkeypatch)
        if not native:  # the proposal step by step (Runner's fallback), as before Model.propose
            monkeypatch.setattr(draft.runner, "_step", WithoutPropose(draft.runner._step))
        out, stats = gen(lookup=0, draft=draft)
        assert torch.equal(out, plain), (subset, native, stop)
        assert stats.proposed.get("draft", 0) > 0
        assert torch.equal(gen(draft=draft)[0], plain), (subset, native, stop)
        monkeypatch.undo()
    assert draft.runner.head_subset_size >= 8192  # the pruned head was set (and its special tokens)
    out, stats = gen()  # the suffix lookup alone
    assert torch.equal(out, plain) and stats.proposed.get("lookup", 0) > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [None, 0, 1])
def test_real_model_same_text_with_a_tree(smollm2, seed, monkeypatch):
    """A speculation tree (a branch beside the draft's chain, in a second slot) on the real SmolLM2
    and its 8-layer draft: greedy and seeded sampling give plain decoding's tokens, branches ran,
    and the text went on along some of them. The branch is always the draft's runner-up at its
    least sure token, and the draft proposes 4 tokens at every step: what the costs would plan
    depends on this machine's timings (a run where they planned other branches took none of
    them: seen in CI), and the tokens must not; this way the branches depend on the text alone."""

    def always(self, cands, room, cont, cont_accept):
        if room <= 0 or not cands:
            return None
        i = min(range(len(cands)), key=lambda j: self.draft.probs[j])
        self._branch_is_runner_up = True
        return i, [self.draft.second[i]]

    monkeypatch.setattr(Speculator, "_plan_branch", always)
    draft_every_step(monkeypatch)

    model, tokenizer = smollm2
    dec, draft, _ = real_pair(smollm2, max_batch=2)
    ids = chat_ids(tokenizer, "Tell me a short story about a dragon who learns to cook.")

    def gen(**kw):
        return fresh(dec, ids, 80, seed, 0.7, **kw)

    plain, _ = gen(lookup=0)
    branches = taken = 0
    for lookup in (0, 8):
        out, stats = gen(lookup=lookup, draft=draft, tree=True)
        assert torch.equal(out, plain), lookup
        branches, taken = branches + stats.branches, taken + stats.branches_taken
    assert branches >= 5 and taken > 0, (branches, taken)

    # in a batch of two on three slots: one lent slot a step, each text as alone
    other = chat_ids(tokenizer, "Return this list sorted: pear, apple, fig, kiwi.")
    batch = KwkDecoder(model, 512, precision="int4", tokenizer=tokenizer, max_batch=3)

    def sampling(*offsets):  # prompt i samples with the generator of seed + i, alone or not
        if seed is None:
            return {}
        gens = [torch.Generator().manual_seed(seed + i) for i in offsets]
        return dict(do_sample=True, temperature=0.7, generator=gens)

    alone = [
        batch.generate_batch([p], 60, lookup=0, **sampling(i))[0]
        for i, p in enumerate([ids, other])
    ]
    together = batch.generate_batch([ids, other], 60, draft=draft, tree=True, **sampling(0, 1))
    assert all(torch.equal(a, b) for a, b in zip(alone, together, strict=True))
