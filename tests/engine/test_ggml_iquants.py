"""GGUF's i-quants (IQ4_NL, IQ4_XS, IQ3_S, IQ3_XXS, IQ2_S, IQ2_XS, IQ2_XXS, IQ1_M, IQ1_S), its
ternary types (TQ2_0, TQ1_0) and Q8_K, read natively: the dequantizer gives gguf-py's float32 bits
on random valid blocks (scales over fp16's whole finite range, every grid index there is), and a
file of those types loads, at its nearest precision, into the model its weights dequantized to F32
make. Real models written by llama.cpp in these types: scripts/iquant_quality.py."""

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize

from kwker import _native
from kwker.loading.build import GGUF_PRECISION
from kwker.loading.gguf_file import GGML_TYPES
from kwker.loading.load import load_files
from kwker.loading.memory import facts_from_files
from kwker.models.gguf_tools import requantize

sys.path.insert(0, str(Path(__file__).parents[1]))
import synthetic_gguf as sg  # noqa: E402

# Each type's fp16 d (byte offset in the block); IQ1_M splits its d over 4 words (SPLIT_D)
D_FIELD = {Q.IQ4_NL: 0, Q.IQ4_XS: 0, Q.IQ3_S: 0, Q.IQ3_XXS: 0, Q.IQ2_S: 0, Q.IQ2_XS: 0,
           Q.IQ2_XXS: 0, Q.IQ1_S: 0, Q.TQ2_0: 64, Q.TQ1_0: 52}  # fmt: skip
SPLIT_D = 48  # IQ1_M: d's 4 nibbles are the top nibbles of the uint16 words at 48, 50, 52, 54
TYPES = [*D_FIELD, Q.IQ1_M]
NEW = [*TYPES, Q.Q8_K]


def random_d(rng, n: int) -> np.ndarray:
    """n fp16 scales across the whole finite range, both signs, with zeros and subnormals: the
    decoders' products must round as the reference's do wherever they land."""
    d = rng.choice([-1, 1], n) * 10.0 ** rng.uniform(-8, 4.8, n)
    d[rng.random(n) < 0.02] = 0
    return d.astype(np.float16)


def random_blocks(qtype: Q, n: int, seed: int = 0) -> np.ndarray:
    """n valid blocks of qtype: random bits everywhere but d (every index field is exactly as wide
    as its grid, so any bits pick an entry; sign and scale bits take any value)."""
    rng = np.random.default_rng(seed)
    blocks = rng.integers(0, 256, (n, gguf.GGML_QUANT_SIZES[qtype][1]), dtype=np.uint8)
    d = random_d(rng, n).view(np.uint16)
    if qtype == Q.IQ1_M:
        words = blocks.view(np.uint16)[:, SPLIT_D // 2 : SPLIT_D // 2 + 4]
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
    else:
        blocks.view(np.uint16)[:, D_FIELD[qtype] // 2] = d
    return blocks


def native(blocks: np.ndarray, qtype: Q, rows: int) -> np.ndarray:
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    return _native.ggml_dequantize(
        blocks.reshape(-1), int(qtype), rows, len(blocks) * block // rows
    )


@pytest.mark.parametrize("qtype", TYPES, ids=lambda q: q.name)
def test_dequantize_gives_gguf_pys_bits(qtype):
    blocks = random_blocks(qtype, 512)  # 16384 grid indices, 8 for every IQ1 entry on average
    ours = native(blocks, qtype, rows=8)
    ref = dequantize(blocks.reshape(8, -1), qtype)
    assert ref.dtype == np.float32 and ours.shape == ref.shape
    assert np.isfinite(ref).all()  # valid blocks: no inf / NaN to compare
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32)), qtype.name


def test_q8_k_is_d_times_q():
    # gguf-py has no Q8_K dequantizer; ggml's dequantize_row_q8_K is y = d * q (fp32 d, int8 q)
    with pytest.raises(NotImplementedError):
        dequantize(np.zeros(292, np.uint8), Q.Q8_K)
    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, (64, 292), dtype=np.uint8)
    d = (rng.choice([-1, 1], 64) * 10.0 ** rng.uniform(-30, 30, 64)).astype(np.float32)
    blocks[:, :4] = d.view(np.uint8).reshape(64, 4)
    q = blocks[:, 4:260].view(np.int8).astype(np.float32)
    ref = (d[:, None] * q).reshape(4, -1)
    assert np.array_equal(native(blocks, Q.Q8_K, rows=4).view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", NEW, ids=lambda q: q.name)
def test_every_table_has_the_type_with_ggmls_sizes(qtype):
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    assert _native.ggml_types[int(qtype)] == (qtype.name, block, size)
    t = GGML_TYPES[int(qtype)]
    assert (t.name, t.block_elements, t.block_bytes) == (qtype.name, block, size)
    assert GGUF_PRECISION[qtype.name] == ("balanced" if qtype == Q.Q8_K else "int4")


def test_zero_d_zeroes_iq1_m():
    # the split d is every float IQ1_M's decoder reads: with its nibbles cleared, all is zero
    blocks = random_blocks(Q.IQ1_M, 64)
    blocks.view(np.uint16)[:, SPLIT_D // 2 : SPLIT_D // 2 + 4] &= 0x0FFF
    assert not np.any(native(blocks, Q.IQ1_M, rows=1).view(np.uint32) & 0x7FFFFFFF)


PROMPT = [3, 17, 250, 9, 40, 511, 7, 99, 300, 12, 5, 6, 44]


@pytest.mark.parametrize("matrix_type", [t.name for t in TYPES])
def test_a_file_of_the_type_runs_as_its_weights_in_f32(tmp_path, monkeypatch, matrix_type):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))
    path = sg.write_gguf(tmp_path / "tiny.gguf", "tiny", matrix_type)
    f32 = requantize(path, tmp_path / "tiny.F32.gguf", "F32")  # gguf-py's dequantizer, then F32
    assert facts_from_files(path).own == "int4"  # the memory estimate's precision, as load's
    ours = load_files(path, 64, cache=False)
    assert ours.precision == "int4"
    for precision in ("fp32", "int4"):
        a = ours if precision == "int4" else load_files(path, 64, precision, cache=False)
        b = load_files(f32, 64, precision, cache=False)
        la, lb = np.asarray(a.forward(PROMPT)), np.asarray(b.forward(PROMPT))
        assert np.isfinite(la).all()
        assert np.array_equal(la.view(np.uint32), lb.view(np.uint32)), precision
        tokens = a.generate(PROMPT, max_new_tokens=8)
        assert np.array_equal(tokens, b.generate(PROMPT, max_new_tokens=8))
