"""Q4K and Q6K, ggml's Q4_K and Q6_K held exactly (formats.h): a matrix's bytes come back from its
panels bit for bit, its values are ggml's, and its matmul (integer sums per super-block, then FMAs)
gives the reference kernel's bits on every ISA, for every row count, alone or batched."""

import numpy as np
import pytest

from kwker import _native

W = _native.WType
AVX512 = "avx512" if _native.isa_supported("avx512") else "avx512-emulated"
# the AVX-512 source also on SIMDe where it is built: it needs its own emulations of intrinsics
ISAS = ["generic", *(i for i in ("avx2", "avx512", "avx512-emulated") if _native.isa_supported(i))]
GGML = {name: tid for tid, (name, _, _) in _native.ggml_types.items()}
# ggml type: (the format holding it, bytes of a block of 256, offsets of its fp16 scales)
KINDS = {"Q4_K": (W.Q4K, 144, (0, 2)), "Q6_K": (W.Q6K, 210, (208,))}


def ggml_rows(kind: str, n: int, k: int, seed: int = 0, scale: float = 0.02) -> np.ndarray:
    """[n, k / 256 * block bytes] uint8: random rows of ggml type `kind` (every sub-block scale,
    min and level), with fp16 scales of a real file's size."""
    _, size, halves = KINDS[kind]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(n * k // 256, size), dtype=np.uint8)
    for off in halves:
        d = rng.uniform(0, scale, len(raw)).astype(np.float16)
        raw[:, off : off + 2] = d.view(np.uint8).reshape(-1, 2)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n, k", [(1, 256), (16, 256), (17, 512), (45, 1536)])
def test_a_matrix_comes_back_from_its_panels_bit_for_bit(kind, n, k):
    raw = ggml_rows(kind, n, k, seed=n)
    packed = _native.k_pack(raw.reshape(-1), kind, n, k)
    # 4.625 and 6.5625 bits a weight
    assert packed.size == -(-n // 16) * (k // 256) * {"Q4_K": 2368, "Q6_K": 3360}[kind]
    back = _native.k_unpack(packed, kind, n, k)
    assert np.array_equal(back, raw.reshape(-1))


@pytest.mark.parametrize("kind", KINDS)
def test_its_values_are_ggmls(kind):
    """The packed weights as the kernels see them are ggml's dequantized values, bit for bit."""
    n, k = 33, 768
    raw = ggml_rows(kind, n, k, seed=3)
    ref = _native.ggml_dequantize(raw.reshape(-1), GGML[kind], n, k)
    ours = _native.kernel_weights(raw, KINDS[kind][0])
    assert np.array_equal(ours.view(np.uint32), ref.view(np.uint32))


def test_bad_shapes_are_clear_errors():
    raw = ggml_rows("Q4_K", 2, 256).reshape(-1)
    with pytest.raises(ValueError, match="multiple of 256"):
        _native.k_pack(raw, "Q4_K", 2, 200)
    with pytest.raises(ValueError, match="bytes, expected"):
        _native.k_pack(raw[:-1], "Q4_K", 2, 256)
    with pytest.raises(ValueError, match="Q4_K or Q6_K"):
        _native.k_pack(raw, "Q5_K", 2, 256)
    with pytest.raises(ValueError, match="ggml rows"):
        _native.kernel_matmul("generic", np.ones((1, 256), np.float32), raw.astype(np.int8), W.Q4K)


def reference(x: np.ndarray, raw: np.ndarray, kind: str) -> np.ndarray:
    """x w^T in float64, from the activations as quantized for the K formats and ggml's weights."""
    n, k = raw.shape[0], x.shape[1]
    q, d, _, _ = _native.kernel_quantize_super(x)
    xq = q[:, :k].astype(np.float64) * np.repeat(d, 256, axis=1)[:, :k]
    w = _native.ggml_dequantize(raw.reshape(-1), GGML[kind], n, k).astype(np.float64)
    return xq @ w.T


def test_the_activations_sums_are_their_levels_sums():
    x = np.random.default_rng(1).standard_normal((3, 512)).astype(np.float32)
    q, d, sums, sums16 = _native.kernel_quantize_super(x)
    assert np.array_equal(sums, q.reshape(3, -1, 32).sum(-1))
    assert np.array_equal(sums16, q.reshape(3, -1, 16).sum(-1))
    assert np.array_equal(d, np.abs(x).reshape(3, -1, 256).max(-1) / np.float32(127))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 4])
def test_the_reference_kernel_computes_x_times_w(kind, m):
    rng = np.random.default_rng(m)
    n, k = 40, 1024
    x = rng.standard_normal((m, k)).astype(np.float32)
    raw = ggml_rows(kind, n, k, seed=m)
    y = _native.kernel_matmul("generic", x, raw, KINDS[kind][0])
    ref = reference(x, raw, kind)
    assert np.abs(y - ref).max() <= 1e-5 * np.abs(ref).max()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 7, 8, 9, 13, 48, 49])
def test_every_isa_gives_the_reference_bits_alone_or_batched(kind, m):
    rng = np.random.default_rng(200 + m)
    wtype = KINDS[kind][0]
    for n, k in [(16, 256), (9 * 16 - 3, 512), (7 * 16 + 1, 1536)]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        x[0, :256] *= 100  # super-blocks of different scales
        raw = ggml_rows(kind, n, k, seed=n + k)
        bias = rng.standard_normal(n).astype(np.float32)
        ref = _native.kernel_matmul("generic", x, raw, wtype, bias)
        for isa in ISAS[1:]:
            y = _native.kernel_matmul(isa, x, raw, wtype, bias)
            assert np.array_equal(y, ref), (isa, n, k)
        alone = np.concatenate(
            [_native.kernel_matmul(AVX512, x[t : t + 1], raw, wtype, bias) for t in range(m)]
        )
        assert np.array_equal(alone, ref), (n, k)


@pytest.mark.parametrize("kind", KINDS)
def test_exact_at_the_extremes_of_the_levels(kind):
    """Every scale, min and level at its largest (Q6_K: the int8 scales at -1, the levels at 63)
    against activations at +-127: the largest integer sums (AVX2 adds a Q4K sub-block's pairs in
    int16 before its scale) give the reference's bits."""
    n, k = 32, 512
    raw = ggml_rows(kind, n, k, seed=9)
    blocks = raw.reshape(-1, KINDS[kind][1])
    half = len(blocks) // 2
    if kind == "Q4_K":
        blocks[:half, 4:] = 0xFF
    else:
        blocks[:half, :192] = 0xFF  # levels 63
        blocks[:half, 192:208] = 0x80  # scales -128
    x = np.stack([np.ones(k), -np.ones(k), np.tile([1.0, -1.0], k // 2)]).astype(np.float32)
    wtype = KINDS[kind][0]
    ref = _native.kernel_matmul("generic", x, raw, wtype)
    assert np.abs(ref - reference(x, raw, kind)).max() <= 1e-5 * np.abs(ref).max()
    for isa in ISAS[1:]:
        assert np.array_equal(_native.kernel_matmul(isa, x, raw, wtype), ref), isa


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("panels", [(0, 1), (1, 3), (2, 5)])
def test_panel_ranges_give_the_whole_calls_bits(kind, panels):
    rng = np.random.default_rng(5)
    n, k = 5 * 16, 768
    x = rng.standard_normal((3, k)).astype(np.float32)
    raw = ggml_rows(kind, n, k, seed=5)
    wtype = KINDS[kind][0]
    whole = _native.kernel_matmul("generic", x, raw, wtype)
    p0, p1 = panels
    for isa in ISAS:
        part = _native.kernel_matmul(isa, x, raw, wtype, panels=panels)
        cols = slice(p0 * 16, p1 * 16)
        assert np.array_equal(part[:, cols], whole[:, cols]), isa
        assert not part[:, p1 * 16 :].any()
