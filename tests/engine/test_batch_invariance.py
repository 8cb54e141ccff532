"""A token's logits do not depend on how many tokens share its step: 1-token decode, k-token verify steps
(k = 2..9) and prefill give the same bits. Speculative decoding and batching rely on this."""

import pytest
import torch

from helpers import tiny_llama
from kwker.decode import KwkDecoder

SEQ = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(3)).tolist()


def one_at_a_time(dec, seq):
    dec.reset()
    rows = [dec.forward(seq[:1])]
    for i in range(1, len(seq)):
        rows.append(dec.forward(seq[i:i + 1], start=i))
    return torch.cat(rows)


@pytest.mark.parametrize("precision", [None, "bf16", "fp16", "balanced", "int4"])
@pytest.mark.parametrize("threads", [1, 2])
def test_logits_identical_alone_in_steps_and_in_prefill(precision, threads):
    model = tiny_llama(hidden=192, heads=3, kv_heads=1, inter=200, tied=False)
    dec = KwkDecoder(model, max_cache_len=64, precision=precision, threads=threads)
    alone = one_at_a_time(dec, SEQ)
    assert torch.equal(dec.forward(SEQ), alone)  # prefill: every row in one step
    for k in range(2, 10):
        p = 11
        dec.forward(SEQ[:p])
        rows = dec.forward(SEQ[p:p + k], start=p)  # a k-token verify step after p cached tokens
        assert torch.equal(rows, alone[p:p + k]), f"k={k}"


def test_thread_count_does_not_change_bits():
    model = tiny_llama(hidden=192, heads=3, kv_heads=1, inter=200)
    a = KwkDecoder(model, max_cache_len=64, threads=1).forward(SEQ)
    b = KwkDecoder(model, max_cache_len=64, threads=2).forward(SEQ)
    assert torch.equal(a, b)
