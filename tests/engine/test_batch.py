"""Several sequences per step: each gets, token for token, what it gets alone (greedy and seeded
sampling), with prompts of different lengths, sequences finishing at different times and newcomers
taking freed slots."""

import pytest
import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder

PROMPTS = [
    [5, 9, 33, 102, 7, 61, 5, 9, 33],
    [400, 12],
    [7] * 40,
    [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5],
    [88, 77, 66],
    list(range(100, 170)),
]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=4, hidden=96, heads=3, kv_heads=1, inter=128, layers=2)


def alone(dec, prompt, n, **kw):
    return dec.generate(torch.tensor([prompt]), max_new_tokens=n, **kw)[0]


@pytest.mark.parametrize("precision", [None, "int4"])
@pytest.mark.parametrize("max_batch", [2, 4])
def test_greedy_batch_equals_alone(model, precision, max_batch):
    single = KwkDecoder(model, max_cache_len=128, precision=precision)
    batched = KwkDecoder(model, max_cache_len=128, precision=precision, max_batch=max_batch)
    lengths = [30, 5, 17, 30, 1, 12]  # sequences leave at different steps; newcomers join
    outs = batched.generate_batch(PROMPTS, 30, eos_token_id=[])  # 6 prompts through 2 or 4 slots
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert torch.equal(out, alone(single, prompt, 30, eos_token_id=[]))
    outs = [
        batched.generate_batch([p], n, eos_token_id=[])[0]
        for p, n in zip(PROMPTS, lengths, strict=True)
    ]
    for prompt, n, out in zip(PROMPTS, lengths, outs, strict=True):
        assert torch.equal(out, alone(single, prompt, n, eos_token_id=[]))


@pytest.mark.parametrize("lookup", [0, 8])
def test_seeded_sampling_batch_equals_alone(model, lookup):
    single = KwkDecoder(model, max_cache_len=128)
    batched = KwkDecoder(model, max_cache_len=128, max_batch=3)
    kw = dict(do_sample=True, temperature=1.2, top_p=0.95, eos_token_id=[], lookup=lookup)
    gens = [torch.Generator().manual_seed(i) for i in range(len(PROMPTS))]
    outs = batched.generate_batch(PROMPTS, 25, generator=gens, **kw)
    for i, (prompt, out) in enumerate(zip(PROMPTS, outs, strict=True)):
        assert torch.equal(
            out, alone(single, prompt, 25, generator=torch.Generator().manual_seed(i), **kw)
        )


def test_eos_ends_a_sequence_early(model):
    dec = KwkDecoder(model, max_cache_len=128, max_batch=4)
    free = dec.generate_batch(PROMPTS[:3], 20, eos_token_id=[])
    eos = int(free[1][len(PROMPTS[1]) + 3])
    outs = dec.generate_batch(PROMPTS[:3], 20, eos_token_id=eos)
    for f, o, p in zip(free, outs, PROMPTS[:3], strict=True):
        new = f[len(p) :].tolist()
        expect = new[: new.index(eos) + 1] if eos in new else new
        assert o[len(p) :].tolist() == expect


def test_batch_needs_a_generator_per_prompt(model):
    dec = KwkDecoder(model, max_cache_len=64, max_batch=2)
    with pytest.raises(ValueError, match="one generator per prompt"):
        dec.generate_batch(PROMPTS[:2], 4, do_sample=True, generator=torch.Generator())
