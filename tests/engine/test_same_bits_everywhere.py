"""The same bits on every CPU and thread count: a token's logits do not depend on the ISA (the
portable reference, AVX2, AVX-512 or its source on SIMDe) nor on how many threads share the step, at
every precision, for a tiny model of every family and for the real SmolLM2. The kernels share one
exp polynomial and one canonical sum order, and every other reduction is a fixed FMA chain per
output (native/src/kernels/canonical.h, kernels.h): so a seeded conversation replays identically on
any x86 machine."""

import pytest
import torch
from helpers import tiny_llama
from test_families import MODELS

from kwker import _native
from kwker.hf import KwkDecoder

PRECISIONS = ["fp32", "bf16", "bf16-dot", "fp16", "balanced", "int4"]
ISAS = [i for i in ("generic", "avx2", "avx512", "avx512-emulated") if _native.isa_supported(i)]
# (ISA, threads) pairs compared with the reference on one thread: every ISA, and the best one on 2
# and 3 threads
BEST = "avx512" if "avx512" in ISAS else "avx2"
RUNS = [(isa, 2) for isa in ISAS if isa != "generic"] + [(BEST, 1), (BEST, 3)]
SEQ = torch.randint(0, 1000, (40,), generator=torch.Generator().manual_seed(21)).tolist()


def test_this_machine_tests_an_avx512_source():
    assert "avx512" in ISAS or "avx512-emulated" in ISAS, (
        "no AVX-512 kernels in this build (SIMDe not found)"
    )


def logits(model, isa, threads, precision, seq, monkeypatch, max_cache_len=64):
    """Prefill logits of seq and the logits of two 1-token steps after it (the decode path)."""
    monkeypatch.setenv("KWKER_ISA", isa)
    dec = KwkDecoder(model, max_cache_len=max_cache_len, precision=precision, threads=threads)
    assert (dec.isa, dec.threads) == (isa, threads)
    prefill = dec.forward(seq[:-2])
    steps = [dec.forward([t], start=len(seq) - 2 + i) for i, t in enumerate(seq[-2:])]
    return torch.cat([prefill, *steps])


def assert_same_bits(model, precision, seq, monkeypatch, **kw):
    ref = logits(model, "generic", 1, precision, seq, monkeypatch, **kw)
    for isa, threads in RUNS:
        out = logits(model, isa, threads, precision, seq, monkeypatch, **kw)
        diff = (out - ref).abs().max().item()
        assert torch.equal(out, ref), (
            f"{isa} on {threads} threads differs from the reference by {diff}"
        )


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("family", ["llama", *MODELS])
def test_every_family_gives_the_same_bits_on_every_isa_and_thread_count(
    family, precision, monkeypatch
):
    model = tiny_llama(inter=160, tied=False) if family == "llama" else MODELS[family]()
    assert_same_bits(model, precision, SEQ, monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("precision", PRECISIONS)
def test_smollm2_gives_the_same_bits_on_every_isa_and_thread_count(smollm2, precision, monkeypatch):
    """The real model, 30 layers: any difference in an exp or a sum order would be amplified past
    the last bit (by the quantized formats' rounding of activations to int8, into whole logits)."""
    model, tokenizer = smollm2
    seq = tokenizer(
        "The quick brown fox jumps over the lazy dog. It was a bright cold day in April"
    )["input_ids"]
    assert_same_bits(model, precision, seq[:12], monkeypatch, max_cache_len=32)
