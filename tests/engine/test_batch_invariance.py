"""A token's logits do not depend on how many tokens share its step: 1-token decode, k-token verify
steps (k = 2..9) and prefill give the same bits. Speculative decoding and batching rely on this."""

import pytest
import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder

SEQ = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(3)).tolist()


def one_at_a_time(dec, seq):
    dec.reset()
    rows = [dec.forward(seq[:1])]
    for i in range(1, len(seq)):
        rows.append(dec.forward(seq[i : i + 1], start=i))
    return torch.cat(rows)


@pytest.mark.parametrize("precision", [None, "bf16", "bf16-dot", "fp16", "balanced", "int4"])
@pytest.mark.parametrize("threads", [1, 2])
def test_logits_identical_alone_in_steps_and_in_prefill(precision, threads):
    model = tiny_llama(hidden=192, heads=3, kv_heads=1, inter=200, tied=False)
    dec = KwkDecoder(model, max_cache_len=64, precision=precision, threads=threads)
    alone = one_at_a_time(dec, SEQ)
    assert torch.equal(dec.forward(SEQ), alone)  # prefill: every row in one step
    for k in range(2, 10):
        p = 11
        dec.forward(SEQ[:p])
        rows = dec.forward(SEQ[p : p + k], start=p)  # a k-token verify step after p cached tokens
        assert torch.equal(rows, alone[p : p + k]), f"k={k}"


@pytest.mark.parametrize("precision", [None, "int4"])
@pytest.mark.parametrize("threads", [2, 3])
def test_long_context_attention_in_parts_keeps_the_bits(precision, threads):
    """From 128 keys on, a lone token's attention calls (fewer than two per thread) are shared out
    in parts between the threads; prefill makes whole calls. Each token's logits are the same bits
    either way."""
    seq = torch.randint(0, 1000, (200,), generator=torch.Generator().manual_seed(4)).tolist()
    model = tiny_llama(hidden=192, heads=3, kv_heads=1, inter=200, tied=False)
    dec = KwkDecoder(model, max_cache_len=256, precision=precision, threads=threads)
    assert torch.equal(dec.forward(seq), one_at_a_time(dec, seq))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_kv_heads_with_query_heads_in_two_blocks_keep_the_bits(threads):
    """7 query heads per KV head are attended in blocks of 4 + 3. With as many (run, KV head) pairs
    as threads, a KV head's blocks go to one thread together; with fewer, block by block (and, from
    128 keys on, a lone token's calls in parts). Every way gives each token the same bits, at 1, 2
    and 3 threads."""
    seq = torch.randint(0, 1000, (140,), generator=torch.Generator().manual_seed(5)).tolist()
    model = tiny_llama(hidden=224, heads=14, kv_heads=2, head_dim=16, inter=200, tied=False)
    ref = KwkDecoder(model, max_cache_len=160, threads=1).forward(seq)
    with torch.no_grad():  # and those bits are the model's (every call made once, none twice)
        theirs = model(torch.tensor([seq])).logits[0]
    assert float((ref - theirs).abs().max() / theirs.abs().max()) < 1e-4
    dec = KwkDecoder(model, max_cache_len=160, threads=threads)
    assert torch.equal(dec.forward(seq), ref)
    assert torch.equal(one_at_a_time(dec, seq), ref)


@pytest.mark.parametrize("precision", [None, "int4"])
def test_thread_count_does_not_change_bits(precision):
    """Threads take chunks of each other's shares of a matmul when they finish first: which thread
    computes a panel, and how many threads there are, changes no bit."""
    model = tiny_llama(hidden=192, heads=3, kv_heads=1, inter=200)
    a = KwkDecoder(model, max_cache_len=64, threads=1, precision=precision).forward(SEQ)
    for threads in (2, 3):
        assert torch.equal(
            KwkDecoder(model, max_cache_len=64, threads=threads, precision=precision).forward(SEQ),
            a,
        )


@pytest.mark.parametrize("precision", [None, "bf16", "bf16-dot", "balanced", "int4"])
def test_every_isa_is_batch_invariant_and_close_to_the_reference(precision, monkeypatch):
    """The whole decoding step on every kernel set: the portable reference, AVX2 and AVX-512 (on a
    CPU without AVX-512, its source compiled on SIMDe: "avx512-emulated"). Within an ISA, prefill, a
    3-token step and 1-token steps give each token the same bits, and across ISAs too
    (test_same_bits_everywhere.py covers every family)."""
    from kwker import _native

    isas = [i for i in ("generic", "avx2", "avx512", "avx512-emulated") if _native.isa_supported(i)]
    assert "avx512" in isas or "avx512-emulated" in isas, (
        "this build has no AVX-512 kernels to test (no SIMDe)"
    )
    model = tiny_llama(hidden=128, heads=2, kv_heads=1, inter=160, tied=False)
    seq = SEQ[:30]
    results = {}
    for isa in isas:
        monkeypatch.setenv("KWKER_ISA", isa)
        dec = KwkDecoder(model, max_cache_len=64, precision=precision, threads=2)
        assert dec.isa == isa
        alone = one_at_a_time(dec, seq)
        dec.forward(seq[:20])
        assert torch.equal(dec.forward(seq[20:23], start=20), alone[20:23]), isa
        assert torch.equal(dec.forward(seq), alone), isa
        results[isa] = alone
    for isa in isas[1:]:
        assert torch.equal(results[isa], results["generic"]), isa
