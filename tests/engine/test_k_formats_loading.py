"""A GGUF's Q4_K and Q6_K matrices run at int4 as Q4K and Q6K (issue 49): the file's blocks are held
bit for bit, packed without quantizing, and a token's logits are the same bits alone, in a multi-row
step, from the packed cache, on every ISA and thread count."""

import numpy as np
import pytest
from synthetic_gguf import write_gguf

from kwker import _native
from kwker.loading.build import family_of, is_tied
from kwker.loading.load import load_files, open_files

ISAS = [i for i in ("generic", "avx2", "avx512", "avx512-emulated") if _native.isa_supported(i)]
SEQ = [int(t) for t in np.random.default_rng(49).integers(16, 1000, 24)]


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    """The tiny llama shape as a Q4_K_M file: Q4_K matrices, Q6_K attn_v, ffn_down and output."""
    return write_gguf(tmp_path_factory.mktemp("q4k") / "tiny-Q4_K_M.gguf", "tiny", "Q4_K_M", seed=4)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))


def file_matrices(path):
    """{native name: (the file's rows as uint8 [n, row bytes] in Hugging Face order, type)}."""
    config, source, *_ = open_files(path)
    out = {}
    for spec in family_of(config).weights(config, tied=is_tied(config, source)):
        if spec.kind == "norm":
            continue
        t = source.tensor(spec.source)
        rows = np.asarray(t.raw).reshape(t.shape[0], -1)
        out[spec.native] = (rows if t.row_order is None else rows[t.row_order], t.type_name)
    return out


def test_the_files_blocks_are_held_bit_for_bit(q4_k_m):
    step = load_files(q4_k_m, max_cache_len=64, precision="int4", cache=False).runner._step
    held = []
    for name, (rows, type_name) in file_matrices(q4_k_m).items():
        n, k = rows.shape[0], rows.shape[1] // {"Q4_K": 144, "Q6_K": 210}[type_name] * 256
        back = np.asarray(_native.k_unpack(step.packed(name), type_name, n, k)).reshape(n, -1)
        assert np.array_equal(back, rows), name
        held.append(type_name)
    # the Q4_K embedding; per layer Q4_K q and k (their rows permuted in the file), o, gate, up,
    # and Q6_K v and down; the Q6_K output
    assert sorted(held) == ["Q4_K"] * 11 + ["Q6_K"] * 5


def logits(path, isa, threads, monkeypatch, cache=False):
    monkeypatch.setenv("KWKER_ISA", isa)
    dec = load_files(path, max_cache_len=64, precision="int4", threads=threads, cache=cache)
    prefill = dec.forward(SEQ[:-2])
    steps = [dec.forward([t], start=len(SEQ) - 2 + i) for i, t in enumerate(SEQ[-2:])]
    return np.concatenate([prefill, *steps]), dec


def test_the_same_bits_alone_batched_on_every_isa_and_thread_count(q4_k_m, monkeypatch):
    ref, dec = logits(q4_k_m, "generic", 1, monkeypatch)
    # a token's logits alone (one-row steps) are its logits in the prefill
    alone = np.concatenate([dec.forward([t], start=i) for i, t in enumerate(SEQ[:-2])])
    assert np.array_equal(alone.view(np.uint32), ref[:-2].view(np.uint32))
    for isa in ISAS:
        for threads in (1, 2, 3):
            out, _ = logits(q4_k_m, isa, threads, monkeypatch)
            assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (isa, threads)


def test_the_packed_cache_gives_the_same_bits(q4_k_m, monkeypatch):
    first, a = logits(q4_k_m, ISAS[-1], 2, monkeypatch, cache=True)
    again, b = logits(q4_k_m, ISAS[-1], 2, monkeypatch, cache=True)
    assert (a.from_cache, b.from_cache) == (False, True)
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))


def test_the_logits_are_the_files_weights_on_quantized_activations(q4_k_m):
    """Q4K runs the file's own numbers: its logits stay near those of the file at fp32 (the
    dequantized weights on float32 activations)."""
    fp32 = load_files(q4_k_m, max_cache_len=64, precision="fp32", cache=False).forward(SEQ)
    int4 = load_files(q4_k_m, max_cache_len=64, precision="int4", cache=False).forward(SEQ)
    assert kl(fp32, int4) < 0.005  # 0.0012 when written; the Q4 of before: 0.0011


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean KL(p || q) of the rows' next-token distributions."""
    lp = p_logits - np.logaddexp.reduce(p_logits, axis=1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits, axis=1, keepdims=True)
    return float((np.exp(lp) * (lp - lq)).sum(1).mean())
