"""GGUF tensors straight into packed weights: the native dequantizer gives transformers' float32
values (and gguf-py's, for the types transformers lacks) bit for bit on every ggml type it reads,
set_matrix_ggml packs exactly what set_matrix packs from those floats (any thread count, any row
order), and set_matrix_packed takes back the bytes `packed` gives out."""

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize as gguf_dequantize
from transformers.integrations.gguf.dequant import dequantize as transformers_dequantize

from kwker import _native

W = _native.WType
TYPES = {name: tid for tid, (name, _, _) in _native.ggml_types.items()}
# where each block type keeps its fp16 scales (random bytes there could be inf / NaN)
FP16_FIELDS = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
               "Q2_K": [80, 82], "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}  # fmt: skip


def random_tensor(name: str, rows: int, k: int, seed: int = 0) -> np.ndarray:
    """Valid bytes of a [rows, k] tensor of ggml type `name`: random blocks with sane scales."""
    rng = np.random.default_rng(seed)
    _, block, block_bytes = _native.ggml_types[TYPES[name]]
    if name == "F32":
        return rng.standard_normal(rows * k).astype(np.float32).view(np.uint8)
    if name == "F16":
        return rng.standard_normal(rows * k).astype(np.float16).view(np.uint8)
    if name == "BF16":
        bits = rng.standard_normal(rows * k).astype(np.float32).view(np.uint32) >> 16
        return bits.astype(np.uint16).view(np.uint8)
    raw = rng.integers(0, 256, size=rows * k // block * block_bytes, dtype=np.uint8)
    blocks = raw.reshape(-1, block_bytes)
    for off in FP16_FIELDS[name]:
        scales = rng.uniform(-0.02, 0.02, len(blocks)).astype(np.float16)
        blocks[:, off : off + 2] = scales.view(np.uint8).reshape(-1, 2)
    return raw


# (the i-quants, the ternary types and Q8_K: tests/engine/test_ggml_iquants.py)
@pytest.mark.parametrize("name", sorted(["F32", "F16", "BF16", *FP16_FIELDS]))
def test_dequantize_gives_the_references_bits(name):
    _, block, _ = _native.ggml_types[TYPES[name]]
    rows, k = 7, block * 3 if block > 1 else 45
    raw = random_tensor(name, rows, k)
    ours = _native.ggml_dequantize(raw, TYPES[name], rows, k)
    ref = gguf_dequantize(raw.reshape(rows, -1), GGMLQuantizationType(TYPES[name]))
    np.testing.assert_array_equal(ours, ref.astype(np.float32).reshape(rows, k), strict=True)
    if block > 1 and name not in ("Q5_0", "Q5_1"):  # transformers reads no Q5_0 / Q5_1
        theirs = transformers_dequantize(torch.from_numpy(raw.copy()), TYPES[name]).numpy()
        assert np.array_equal(ours.view(np.uint32), theirs.reshape(rows, k).view(np.uint32))


def model(threads: int, vocab: int = 300, embd: int = 256) -> _native.Model:
    cfg = dict(n_layer=1, n_embd=embd, n_head=2, n_kv_head=1, head_dim=128, n_ff=512, vocab=vocab,
               norm_eps=1e-6, attn_scale=0.1, wtype=W.Q4, tied_embeddings=True)  # fmt: skip
    cos, sin = np.ones((8, 64), np.float32), np.zeros((8, 64), np.float32)
    return _native.Model(cfg, cos, sin, 8, 1, 4, 4, threads)


@pytest.mark.parametrize("target", ["F32", "BF16", "F16", "Q8", "Q4"])
@pytest.mark.parametrize("name", ["F16", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"])
def test_set_matrix_ggml_packs_what_set_matrix_packs_from_the_floats(name, target):
    rows, k = 300, 256  # the embedding: 300 rows, not a whole number of 16-row panels
    raw = random_tensor(name, rows, k, seed=1)
    floats = _native.ggml_dequantize(raw, TYPES[name], rows, k)
    order = np.random.default_rng(2).permutation(rows).astype(np.int32)
    expected = model(1)
    if target in ("BF16", "F16"):
        dtype = torch.bfloat16 if target == "BF16" else torch.float16
        bits = torch.from_numpy(floats[order]).to(dtype).view(torch.int16).numpy().view(np.uint16)
        expected.set_matrix("embed", bits, W.__members__[target])
    else:
        expected.set_matrix("embed", floats[order], W.__members__[target])
    for threads in (1, 2, 3):
        m = model(threads)
        m.set_matrix_ggml(
            "embed", raw, TYPES[name], rows, k, W.__members__[target], row_order=order
        )
        np.testing.assert_array_equal(m.packed("embed"), expected.packed("embed"))


def test_packed_bytes_go_back_in_and_unloaded_matrices_have_none():
    a, b = model(2), model(1)
    assert a.packed("embed") is None
    a.set_matrix_ggml("embed", random_tensor("Q4_K", 300, 256), TYPES["Q4_K"], 300, 256, W.Q4)
    packed = a.packed("embed")
    assert not packed.flags.writeable
    room = b.set_matrix_packed("embed", W.Q4, 300, 256)
    assert room.nbytes == packed.nbytes and room.flags.writeable
    room[:] = packed
    np.testing.assert_array_equal(b.packed("embed"), packed)


def test_bad_ggml_input_gets_a_clear_error():
    m = model(1)
    raw = random_tensor("Q4_K", 300, 256)
    with pytest.raises(ValueError, match="bytes"):
        m.set_matrix_ggml("embed", raw[:-1], TYPES["Q4_K"], 300, 256, W.Q4)
    with pytest.raises(ValueError, match="not supported"):
        m.set_matrix_ggml("embed", raw, 99, 300, 256, W.Q4)
    with pytest.raises(ValueError, match="whole"):
        m.set_matrix_ggml("embed", raw, TYPES["Q4_K"], 300, 200, W.Q4)
    with pytest.raises(ValueError, match="shape"):
        m.set_matrix_ggml("embed", random_tensor("Q8_0", 300, 64), TYPES["Q8_0"], 300, 64, W.Q4)
    with pytest.raises(ValueError, match="permutation"):
        order = np.zeros(300, np.int32)
        m.set_matrix_ggml("embed", raw, TYPES["Q4_K"], 300, 256, W.Q4, row_order=order)
    with pytest.raises(TypeError, match="uint8"):
        m.set_matrix_ggml("embed", raw.view(np.int8), TYPES["Q4_K"], 300, 256, W.Q4)
    with pytest.raises(ValueError, match="unknown weight"):
        m.set_matrix_packed("nope", W.Q4, 300, 256)
    assert m.packed("embed") is None  # nothing was loaded by the failures
