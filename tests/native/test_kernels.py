"""Every ISA's kernels against the portable reference, on awkward sizes, with a named tolerance per
format; and the property the exactness promise rests on: a row's result does not depend on how many
rows share the call."""

import numpy as np
import pytest
import torch

from kwker import _native

# The AVX-512 source runs natively where the CPU has AVX-512, else compiled on SIMDe's portable
# intrinsics.
AVX512 = "avx512" if _native.isa_supported("avx512") else "avx512-emulated"
ISAS = ["generic", "avx2", AVX512]
SIZES = [1, 3, 7, 17, 31, 33, 127, 129]
WTYPES = {
    "f32": (_native.WType.F32, torch.float32),
    "bf16": (_native.WType.BF16, torch.bfloat16),
    "f16": (_native.WType.F16, torch.float16),
    "q8": (_native.WType.Q8, None),
    "q4": (_native.WType.Q4, None),
    "bf16p": (_native.WType.BF16P, torch.bfloat16),
}
EPS32 = np.finfo(np.float32).eps


def needs(isa):
    if not _native.isa_supported(isa):
        pytest.skip(f"this CPU does not support {isa}")


def weights(n, k, wtype, rng):
    """(array to pass, the weights as the kernel sees them after rounding or quantizing to the
    format)."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    code, dtype = WTYPES[wtype]
    if dtype is None:  # quantized formats take float32 and quantize at packing
        return w, _native.kernel_weights(w, code).astype(np.float64)
    t = torch.from_numpy(w).to(dtype)
    raw = t.numpy() if wtype == "f32" else t.view(torch.int16).numpy().view(np.uint16)
    return raw, t.double().numpy()


def bf16_activations(x):
    """x as the BF16P matmul reads it: rounded to bf16 (torch's rounding), subnormals to zero of
    their sign."""
    x = np.where(np.abs(x) < np.finfo(np.float32).tiny, np.copysign(np.float32(0), x), x).astype(
        np.float32
    )
    return torch.from_numpy(x).to(torch.bfloat16).float().numpy()


def gamma_bound(x, w_exact, k):
    """Worst-case float32 rounding of a k-term dot product: k * eps * sum |x_i w_i| (Higham's
    gamma_k)."""
    return (k + 2) * EPS32 * (np.abs(x).astype(np.float64) @ np.abs(w_exact).T)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", list(WTYPES))
@pytest.mark.parametrize("k", SIZES)
def test_matmul_matches_float64_within_rounding_bound(isa, wtype, k):
    needs(isa)
    rng = np.random.default_rng(k)
    m, n = 5, 37
    x = rng.standard_normal((m, k)).astype(np.float32)
    raw, exact = weights(n, k, wtype, rng)
    bias = rng.standard_normal(n).astype(np.float32)
    y = _native.kernel_matmul(isa, x, raw, WTYPES[wtype][0], bias)
    # quantized weights meet activations quantized per row and block of 32
    if WTYPES[wtype][1] is None:
        x = _native.kernel_quantized_activations(x)
    if wtype == "bf16p":  # the bf16 dot product rounds the activations to bf16
        x = bf16_activations(x)
    ref = x.astype(np.float64) @ exact.T + bias
    assert np.all(np.abs(y - ref) <= gamma_bound(x, exact, k) + np.abs(bias) * EPS32)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", list(WTYPES))
@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 7, 8, 9, 17, 63, 64, 65, 130])
def test_matmul_rows_are_batch_invariant(isa, wtype, m):
    """Row t of an m-row call equals, bit for bit, the same row computed alone."""
    needs(isa)
    rng = np.random.default_rng(m)
    k, n = 129, 53
    x = rng.standard_normal((m, k)).astype(np.float32)
    raw, _ = weights(n, k, wtype, rng)
    together = _native.kernel_matmul(isa, x, raw, WTYPES[wtype][0])
    alone = np.concatenate(
        [_native.kernel_matmul(isa, x[t : t + 1], raw, WTYPES[wtype][0]) for t in range(m)]
    )
    assert np.array_equal(together, alone)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("wtype", list(WTYPES))
@pytest.mark.parametrize("m", [1, 2, 3, 5, 7, 8])
def test_matmul_panel_ranges_give_the_whole_calls_bits(isa, wtype, m):
    """A call over panels [p0, p1) (a thread's share) computes exactly those outputs of the whole
    call: one- and two-row calls stream a range's panels in strided tiles, and 3-8 rows of a 2-byte
    format take groups of 3 or 4 panels, so every range length and offset is its own tiling."""
    needs(isa)
    rng = np.random.default_rng(m)
    k, n = 97, 13 * 16 - 5  # 13 panels, the last one partial
    x = rng.standard_normal((m, k)).astype(np.float32)
    raw, _ = weights(n, k, wtype, rng)
    bias = rng.standard_normal(n).astype(np.float32)
    whole = _native.kernel_matmul(isa, x, raw, WTYPES[wtype][0], bias)
    for p0, p1 in [(0, 13), (0, 4), (1, 13), (3, 12), (5, 6), (2, 11), (6, 13), (4, 4)]:
        part = _native.kernel_matmul(isa, x, raw, WTYPES[wtype][0], bias, panels=(p0, p1))
        c0, c1 = p0 * 16, min(p1 * 16, n)
        assert np.array_equal(part[:, c0:c1], whole[:, c0:c1]), (p0, p1)
        assert not part[:, :c0].any() and not part[:, c1:].any(), (p0, p1)


def reference_attention(q, k, v, scale):
    s = (q.astype(np.float64) @ k.T.astype(np.float64)) * scale  # (g, n)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return (p / p.sum(axis=1, keepdims=True)) @ v, np.abs(s).max()


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("hd", [2, 24, 64, 128])
@pytest.mark.parametrize("g", [1, 2, 3, 4])
def test_attend_matches_softmax_attention(isa, n, hd, g):
    needs(isa)
    rng = np.random.default_rng(n * hd + g)
    q = rng.standard_normal((g, hd)).astype(np.float32)
    k = rng.standard_normal((n, hd)).astype(np.float32)
    v = rng.standard_normal((n, hd)).astype(np.float32)
    scale = hd**-0.5
    out = _native.kernel_attend(isa, q, k, v, scale)
    ref, smax = reference_attention(q, k, v, scale)
    # softmax weights carry ~hd ulp of the score error; outputs are convex combinations of v
    assert np.allclose(out, ref, rtol=0, atol=2e-5 * np.abs(v).max() * max(1.0, smax))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("first", [1, 15, 16, 17, 40, 128])
@pytest.mark.parametrize("g", [1, 3])
def test_attend_sliding_window_matches_attention_over_the_window(isa, first, g):
    """Keys before `first` (a sliding window's start, inside or at a panel edge) take no part at
    all."""
    needs(isa)
    n = 129
    rng = np.random.default_rng(first * 7 + g)
    q = rng.standard_normal((g, 64)).astype(np.float32)
    k = rng.standard_normal((n, 64)).astype(np.float32)
    v = rng.standard_normal((n, 64)).astype(np.float32)
    k[:first] *= 50  # large scores before the window would dominate if they leaked in
    out = _native.kernel_attend(isa, q, k, v, 0.125, first)
    ref, smax = reference_attention(q, k[first:], v[first:], 0.125)
    assert np.allclose(out, ref, rtol=0, atol=2e-5 * np.abs(v).max() * max(1.0, smax))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 17, 129])
@pytest.mark.parametrize("g", [1, 3])
def test_attend_on_an_fp16_cache_matches_attention_on_rounded_keys_and_values(isa, n, g):
    """kv_f16: the cache holds keys and values rounded to fp16 (nearest even); attention on them is
    float32."""
    needs(isa)
    rng = np.random.default_rng(n + 10 * g)
    q = rng.standard_normal((g, 48)).astype(np.float32)
    k = rng.standard_normal((n, 48)).astype(np.float32)
    v = rng.standard_normal((n, 48)).astype(np.float32)
    out = _native.kernel_attend(isa, q, k, v, 48**-0.5, kv_f16=True)
    kr, vr = k.astype(np.float16).astype(np.float32), v.astype(np.float16).astype(np.float32)
    ref, smax = reference_attention(q, kr, vr, 48**-0.5)
    assert np.allclose(out, ref, rtol=0, atol=2e-5 * np.abs(vr).max() * max(1.0, smax))
    together = _native.kernel_attend(isa, np.tile(q, (4 // g, 1))[:4], k, v, 48**-0.5, kv_f16=True)
    assert np.array_equal(together[:g], out)  # a query's result does not depend on its group


@pytest.mark.parametrize("isa", ISAS)
def test_to_f16_rounds_to_nearest_even_like_numpy(isa):
    needs(isa)
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.standard_normal(1000) * 10.0 ** rng.integers(-9, 5, 1000),
            [0.0, -0.0, 1e-8, 6e-5, 65504.0, 65519.0, -65520.0, 1e6, np.inf, -np.inf],
        ]
    ).astype(np.float32)
    with np.errstate(over="ignore"):  # 65520 and up round to inf, as they should
        want = x.astype(np.float16).view(np.uint16)
    for n in (len(x), 7, 1):  # whole vectors and tails
        assert np.array_equal(_native.kernel_to_f16(isa, x[:n]), want[:n])


@pytest.mark.parametrize("isa", ISAS)
def test_attend_query_result_does_not_depend_on_its_group(isa):
    """A query head's output is the same bits alone or attended together with 1-3 other heads."""
    needs(isa)
    rng = np.random.default_rng(5)
    q = rng.standard_normal((4, 64)).astype(np.float32)
    k = rng.standard_normal((37, 64)).astype(np.float32)
    v = rng.standard_normal((37, 64)).astype(np.float32)
    together = _native.kernel_attend(isa, q, k, v, 0.125)
    for j in range(4):
        assert np.array_equal(_native.kernel_attend(isa, q[j : j + 1], k, v, 0.125)[0], together[j])
    assert np.array_equal(_native.kernel_attend(isa, q[1:3], k, v, 0.125), together[1:3])


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "g,ends,first",
    [
        (3, [30, 31], [0, 0]),  # two prefill tokens, 3 heads each: 6 rows
        (1, [5, 6, 7, 8, 9, 10], [0, 0, 0, 0, 0, 0]),  # six tokens of one head
        (2, [17, 18, 19], [0, 0, 0]),  # keys across a panel edge
        (2, [40, 41, 42], [8, 9, 10]),  # sliding window: every row starts elsewhere
        (3, [20, 129], [0, 100]),  # windows with no key in common
        (1, [1, 2, 3], [0, 0, 0]),  # the first keys of a sequence
    ],
)
def test_attend_run_of_tokens_gives_each_row_its_own_bits(isa, g, ends, first):
    """Several query tokens of one sequence in one call (prefill, a verify step): each row is the
    same bits as when its token is attended alone (and close to float64 attention over its own
    keys)."""
    needs(isa)
    rng = np.random.default_rng(sum(ends) + g)
    nt, n = len(ends), max(ends)
    q = rng.standard_normal((g * nt, 64)).astype(np.float32)
    k = rng.standard_normal((n, 64)).astype(np.float32)
    v = rng.standard_normal((n, 64)).astype(np.float32)
    for kv_f16 in (False, True):
        together = _native.kernel_attend(isa, q, k, v, 0.125, first, kv_f16=kv_f16, ends=ends)
        for t in range(nt):
            rows = slice(t * g, (t + 1) * g)
            alone = _native.kernel_attend(
                isa, q[rows], k[: ends[t]], v[: ends[t]], 0.125, first[t], kv_f16=kv_f16
            )
            assert np.array_equal(together[rows], alone)
            if not kv_f16:
                ref, smax = reference_attention(
                    q[rows], k[first[t] : ends[t]], v[first[t] : ends[t]], 0.125
                )
                assert np.allclose(alone, ref, rtol=0, atol=2e-5 * np.abs(v).max() * max(1.0, smax))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize(
    "g,ends,first,hd",
    [
        (3, [], [0], 64),  # one token, 3 heads (the 1-token step)
        (1, [], [37], 64),  # a sliding window starting inside a panel
        (2, [200, 201], [0, 150], 80),  # two tokens, different windows; columns past head_dim
        (3, [20, 129], [0, 100], 64),  # no key in common
        (4, [], [0], 128),
    ],
)
@pytest.mark.parametrize("panels_per_part", [1, 3, 8])
def test_attend_in_parts_gives_the_bits_of_the_whole_call(isa, g, ends, first, hd, panels_per_part):
    """The parts threads share (key panels, rows, output columns; here taken in reverse order) give
    attend()'s bits, on float32 and fp16 caches."""
    needs(isa)
    n = max(ends) if ends else 300
    rng = np.random.default_rng(n + g + hd)
    q = rng.standard_normal((g * max(1, len(ends)), hd)).astype(np.float32)
    k = rng.standard_normal((n, hd)).astype(np.float32)
    v = rng.standard_normal((n, hd)).astype(np.float32)
    for kv_f16 in (False, True):
        whole = _native.kernel_attend(isa, q, k, v, 0.1, first, kv_f16=kv_f16, ends=ends)
        parts = _native.kernel_attend(
            isa, q, k, v, 0.1, first, kv_f16=kv_f16, ends=ends, panels_per_part=panels_per_part
        )
        assert np.array_equal(parts, whole)
        ref, smax = reference_attention(
            q[:g], k[first[0] : (ends or [n])[0]], v[first[0] : (ends or [n])[0]], 0.1
        )
        if not kv_f16:
            assert np.allclose(parts[:g], ref, rtol=0, atol=2e-5 * np.abs(v).max() * max(1.0, smax))


@pytest.mark.parametrize("m", [7, 40])
def test_matmul_is_identical_across_isas(m):
    """Every ISA runs the same FMA chain per output (over k for float weights, over blocks of exact
    integer dot products for quantized ones), so the results match the reference bit for bit. 40
    rows: the tiles of a Q4 panel share it unpacked to bytes."""
    rng = np.random.default_rng(11)
    for k in SIZES:
        x = rng.standard_normal((m, k)).astype(np.float32)
        for wtype in WTYPES:
            raw, _ = weights(19, k, wtype, rng)
            ref = _native.kernel_matmul("generic", x, raw, WTYPES[wtype][0])
            for isa in ISAS[1:]:
                if _native.isa_supported(isa):
                    assert np.array_equal(
                        _native.kernel_matmul(isa, x, raw, WTYPES[wtype][0]), ref
                    ), (isa, k)


@pytest.mark.parametrize("wtype", ["q8", "q4"])
@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 47, 48, 49, 61])
def test_quantized_gemm_tiles_are_identical_across_isas(wtype, m):
    """The AVX-512 VNNI GEMM (two rows or more: tiles of up to 6 (Q4) or 5 (Q8) tokens x 4 panels,
    the panels left over in tiles of 1-3, rows in blocks of 48) gives the reference's bits for every
    row count, panel remainder and block count; and every row is its own alone."""
    rng = np.random.default_rng(100 + m)
    for k, n in [(32, 16), (97, 9 * 16 - 3), (129, 6 * 16), (576, 7 * 16 + 1)]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        raw, _ = weights(n, k, wtype, rng)
        ref = _native.kernel_matmul("generic", x, raw, WTYPES[wtype][0])
        for isa in ISAS[1:]:
            if _native.isa_supported(isa):
                y = _native.kernel_matmul(isa, x, raw, WTYPES[wtype][0])
                assert np.array_equal(y, ref), (isa, k, n)
        alone = np.concatenate(
            [_native.kernel_matmul(AVX512, x[t : t + 1], raw, WTYPES[wtype][0]) for t in range(m)]
        )
        assert np.array_equal(alone, ref), k


@pytest.mark.parametrize("wtype", ["q8", "q4"])
def test_quantized_gemm_exact_at_the_extremes_of_the_levels(wtype):
    """Q8 on VNNI adds 128 to the activations (as unsigned bytes) and takes 128 times the weights'
    sum back off: levels at +-127 in every position, of equal and of opposite signs, give the
    reference's bits."""
    k, n = 64, 5 * 16
    rng = np.random.default_rng(7)
    signs = np.where(rng.random((n, k)) < 0.5, -1.0, 1.0).astype(np.float32)
    w = np.concatenate([np.ones((16, k)), -np.ones((16, k)), signs[:48]]).astype(np.float32)
    x = np.stack([np.ones(k), -np.ones(k), signs[0], -signs[1], np.full(k, 1e-30)]).astype(
        np.float32
    )
    ref = _native.kernel_matmul("generic", x, w, WTYPES[wtype][0])
    for isa in ISAS[1:]:
        if _native.isa_supported(isa):
            assert np.array_equal(_native.kernel_matmul(isa, x, w, WTYPES[wtype][0]), ref), isa


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", SIZES)
def test_silu_mul(isa, n):
    needs(isa)
    rng = np.random.default_rng(n)
    g = (rng.standard_normal(n) * 8).astype(np.float32)  # reaches the exp clamp region too
    u = rng.standard_normal(n).astype(np.float32)
    out = _native.kernel_glu(isa, g, u, _native.Activation.Silu)
    g64 = g.astype(np.float64)
    ref = g64 / (1 + np.exp(-g64)) * u
    assert np.allclose(out, ref, rtol=4 * EPS32, atol=1e-30)


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", SIZES)
def test_gelu_tanh_mul_matches_torch(isa, n):
    """transformers' gelu_pytorch_tanh (Gemma's MLP), computed as x sigmoid(2u)."""
    needs(isa)
    rng = np.random.default_rng(n + 1)
    g = (rng.standard_normal(n) * 6).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    out = _native.kernel_glu(isa, g, u, _native.Activation.GeluTanh)
    g64 = g.astype(np.float64)
    z = 2 * np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3)
    # = 0.5 x (1 + tanh(z / 2)) without the cancellation in the far tail
    gelu = g64 / (1 + np.exp(-z))
    assert np.allclose(
        gelu,
        torch.nn.functional.gelu(torch.from_numpy(g64), approximate="tanh").numpy(),
        rtol=0,
        atol=1e-12,
    )
    # float32 carries ~|z| ulp of absolute error in z, which becomes relative error of the tail
    assert np.all(np.abs(out - gelu * u) <= 8 * EPS32 * (1 + np.abs(z)) * np.abs(gelu * u) + 1e-30)


def plain_quantize(blk, wtype):
    """Per-block quantization with the plain step, scale (and min) rounded to fp16: q8 symmetric,
    amax / 127 over [-127, 127]; q4 asymmetric (as ggml's Q4_1),
    min + (max - min) / 15 * [0, 15]."""
    f16 = lambda a: a.astype(np.float16).astype(np.float64)  # noqa: E731
    if wtype == "q8":
        d = f16(np.abs(blk).max(axis=1, keepdims=True) / 127)
        inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
        return np.clip(np.round(blk * inv), -127, 127) * d, d
    lo, hi = blk.min(axis=1, keepdims=True), blk.max(axis=1, keepdims=True)
    d, m = f16((hi - lo) / 15), f16(lo)
    inv = np.divide(1, d, out=np.zeros_like(d), where=d != 0)
    return np.clip(np.round((blk - m) * inv), 0, 15) * d + m, d


@pytest.mark.parametrize("wtype", ["q8", "q4"])
@pytest.mark.parametrize("k", [32, 33, 64, 100])
def test_quantize_round_trip_bound(wtype, k):
    """Per block of 32 with an fp16 scale (and min), the packer searches the step (least squares
    around the plain one): its squared error is never above the plain step's (fp16 rounding aside),
    and every value stays within 1.5 plain steps. Rows are offset from zero, where an asymmetric
    int4 keeps its 16 levels."""
    rng = np.random.default_rng(k)
    w = (rng.standard_normal((21, k)) * rng.uniform(0.01, 10, (21, 1))).astype(np.float32)
    w[::3] += 2 * np.abs(w[::3]).max(axis=1, keepdims=True)
    deq = _native.kernel_weights(w, WTYPES[wtype][0]).astype(np.float64)
    total, total_plain = 0.0, 0.0
    for c0 in range(0, k, 32):
        blk = np.zeros((21, 32))
        blk[:, : min(32, k - c0)] = w[:, c0 : c0 + 32]
        dblk = np.zeros((21, 32))
        dblk[:, : min(32, k - c0)] = deq[:, c0 : c0 + 32]
        plain, step = plain_quantize(blk, wtype)
        err, err_plain = ((blk - dblk) ** 2).sum(axis=1), ((blk - plain) ** 2).sum(axis=1)
        assert np.all(err <= err_plain * 1.01 + 1e-12)
        assert np.all(np.abs(blk - dblk) <= 1.5 * step + 1e-12)
        total, total_plain = total + err.sum(), total_plain + err_plain.sum()
    assert total <= total_plain


def test_q4_holds_a_scale_and_min_grid_exactly():
    """Weights already on a 4-bit grid with an fp16 scale and min per block of 32 (ggml's Q4_1, what
    GGUF-sourced models carry) come back unchanged: int4 adds no second rounding to them."""
    rng = np.random.default_rng(3)
    n, k = 19, 96
    d = rng.uniform(0.001, 0.1, (n, k // 32, 1)).astype(np.float16).astype(np.float32)
    m = (-8 * d * rng.uniform(0.5, 1.5, (n, k // 32, 1))).astype(np.float16).astype(np.float32)
    q = rng.integers(0, 16, (n, k // 32, 32))
    q[:, :, 0], q[:, :, 1] = 0, 15  # every block spans the whole range
    w = (q * d + m).astype(np.float32).reshape(n, k)
    assert np.array_equal(_native.kernel_weights(w, WTYPES["q4"][0]), w)


@pytest.mark.parametrize("k", [1, 31, 32, 33, 100, 129])
def test_activation_quantization_bound(k):
    """Activations for the int8/int4 kernels: per row and block of 32, step = amax / 127, rounded to
    nearest (ties to even), so every value is within half a step; a block of zeros stays zero; a
    row's result is its own."""
    rng = np.random.default_rng(k)
    x = (rng.standard_normal((6, k)) * rng.uniform(1e-3, 1e3, (6, 1))).astype(np.float32)
    x[2] = 0.0
    deq = _native.kernel_quantized_activations(x)
    for c0 in range(0, k, 32):
        blk, dblk = x[:, c0 : c0 + 32].astype(np.float64), deq[:, c0 : c0 + 32].astype(np.float64)
        step = np.abs(blk).max(axis=1, keepdims=True) / 127
        assert np.all(np.abs(blk - dblk) <= 0.5 * step * (1 + 1e-5) + 1e-30)
        assert np.all(np.abs(dblk).max(axis=1) <= np.abs(blk).max(axis=1) * (1 + 1e-6))
    assert not deq[2].any()
    assert np.array_equal(_native.kernel_quantized_activations(x[3:4])[0], deq[3])


def test_unknown_isa_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown ISA"):
        _native.kernel_glu("sse9", np.zeros(3, np.float32), np.zeros(3, np.float32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("k", SIZES)
def test_activation_quantization_is_identical_across_isas(isa, k):
    """The quantized matmuls' activations: every ISA's quantization gives the reference's bytes
    (levels, scales, sums), including ties at half a level, all-zero blocks and values of very
    different magnitudes."""
    needs(isa)
    rng = np.random.default_rng(k + 7)
    x = (rng.standard_normal((9, k)) * np.exp(rng.uniform(-20, 20, (9, 1)))).astype(np.float32)
    x[1] = 0.0  # every block of a row zero
    # with max 127 the step is 1: ties, rounded to even
    x[2, : min(k, 32)] = np.arange(min(k, 32)) - 15.5
    x[2, 0] = 127.0
    q, d, dsum = _native.kernel_quantize(isa, x)
    rq, rd, rdsum = _native.kernel_quantize("generic", x)
    assert np.array_equal(q, rq) and np.array_equal(d.view(np.uint32), rd.view(np.uint32))
    assert np.array_equal(dsum.view(np.uint32), rdsum.view(np.uint32))
    blocks = np.zeros((9, q.shape[1]), np.float32)
    blocks[:, :k] = x
    blocks = blocks.reshape(9, -1, 32)
    assert np.array_equal(d, np.abs(blocks).max(-1) / np.float32(127))
    with np.errstate(divide="ignore"):
        inv = np.where(d > 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    assert np.array_equal(q.reshape(9, -1, 32), np.rint(blocks * inv[..., None]).astype(np.int8))
    assert np.array_equal(dsum, d * q.reshape(9, -1, 32).sum(-1).astype(np.float32))


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 7, 8, 255, 257, 49152, 151936 + 5])
def test_softmax_stats_match_numpy(isa, n):
    """The sampler's native pass: the max of x / t (exactly numpy's float32 quotients), the softmax
    total against float64 (float32 canonical sums of 256 terms: 1e-5 relative), and exactly the ids
    within `close` of the max."""
    needs(isa)
    rng = np.random.default_rng(n)
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    x[rng.integers(0, n, 4)] += 10
    x[rng.integers(0, n, 2)] = -np.inf  # suppressed tokens (min_new_tokens' eos)
    if n == 1:
        x[0] = 1.5
    for t, close in ((1.0, 9.0), (0.7, 9.0), (1.9, 3.0)):
        top, total, ids = _native.kernel_softmax_stats(isa, x, t, close)
        q = x / np.float32(t)
        assert top == q.max()
        want = np.exp(q.astype(np.float64) - q.max()).sum()
        assert abs(total / want - 1) < 1e-5, (total, want)
        assert np.array_equal(ids, np.flatnonzero(q >= np.float32(q.max() - np.float32(close))))
    with pytest.raises(ValueError, match="temperature"):
        _native.kernel_softmax_stats(isa, x, 0.0, 9.0)


def scan_argmax(x):
    """ArgmaxFn's contract, the scan itself (NaN is never larger)."""
    best = 0
    for i in range(1, len(x)):
        if x[i] > x[best]:
            best = i
    return best


@pytest.mark.parametrize("isa", ISAS)
@pytest.mark.parametrize("n", [1, 7, 16, 17, 255, 4099, 49152 + 5])
def test_argmax_is_the_scans_first_largest(isa, n):
    """The greedy token: the largest logit, the lowest id among equals, NaN passed over (and a NaN
    at 0 kept, as the scan keeps it), signed zeros equal."""
    needs(isa)
    rng = np.random.default_rng(n)
    rows = []
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    rows.append(x)
    tied = x.copy()
    tied[rng.integers(0, n, 3)] = 20.0  # ties: the first wins
    rows.append(tied)
    rows.append(np.full(n, -np.inf, np.float32))
    zeros = np.where(rng.random(n) < 0.5, np.float32(-0.0), np.float32(0.0)).astype(np.float32)
    rows.append(zeros)
    with_nan = tied.copy()
    with_nan[rng.integers(0, n, 2)] = np.nan
    rows.append(with_nan)
    nan_first = x.copy()
    nan_first[0] = np.nan
    rows.append(nan_first)
    last = x.copy()
    last[-1] = 50.0  # the largest in the tail past the last whole register
    rows.append(last)
    for row in rows:
        if n < 5000:
            want = scan_argmax(row.tolist())
        elif np.isnan(row[0]):
            want = 0
        else:  # a long row: numpy's first largest, NaN taken as -inf, is the scan's
            want = int(np.argmax(np.where(np.isnan(row), -np.inf, row)))
        assert _native.kernel_argmax(isa, row) == want


@pytest.mark.parametrize("n", [1, 5, 16, 17, 33, 255, 256, 257, 4099])
def test_attend_glu_quantize_and_stats_are_identical_across_isas(n):
    """Beside the matmuls, the kernels with a reduction or an exponential (the attention's softmax,
    the GLU, the sampler's pass) share one exp polynomial and one canonical sum order (canonical.h),
    and the activation quantization is exact: every ISA returns the reference's bits, for any length
    (whole groups of 16 lanes, AVX2's two registers of 8, and a tail)."""
    rng = np.random.default_rng(n)
    isas = [isa for isa in ISAS[1:] if _native.isa_supported(isa)]
    q = rng.standard_normal((3, 64)).astype(np.float32)
    k = rng.standard_normal((n, 64)).astype(np.float32)
    v = rng.standard_normal((n, 64)).astype(np.float32)
    x = (rng.standard_normal(n) * 5).astype(np.float32)
    u = rng.standard_normal(n).astype(np.float32)
    rows = (rng.standard_normal((3, n)) * 3).astype(np.float32)

    def results(isa):
        out = [
            _native.kernel_attend(isa, q, k, v, 0.125, first, kv_f16=f16)
            for first in (0, n // 3)
            for f16 in (False, True)
        ]
        out += [
            _native.kernel_glu(isa, x, u, act) for act in _native.Activation.__members__.values()
        ]
        out += list(_native.kernel_quantize(isa, rows))
        for t, close in ((1.0, 9.0), (0.7, 2.0)):
            top, total, ids = _native.kernel_softmax_stats(isa, x, t, close)
            out += [np.float32(top), np.float64(total), ids]
        return out

    ref = results("generic")
    for isa in isas:
        for i, (a, b) in enumerate(zip(results(isa), ref, strict=True)):
            assert a.tobytes() == b.tobytes(), (isa, i)


def test_the_samplers_pass_runs_on_kernels_chosen_once():
    """softmax_stats (the engine's entry) runs on the process's kernels and equals every ISA's
    bits."""
    x = (np.random.default_rng(3).standard_normal(50_000) * 4).astype(np.float32)
    top, total, ids = _native.softmax_stats(x, 0.8, 9.0)
    assert _native.sampler_isa() in ("generic", "avx2", "avx512", "avx512-emulated")
    rtop, rtotal, rids = _native.kernel_softmax_stats("generic", x, 0.8, 9.0)
    assert (top, total) == (rtop, rtotal) and np.array_equal(ids, rids)
    for bad_t in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="temperature"):
            _native.softmax_stats(x, bad_t, 9.0)
    with pytest.raises(TypeError, match="float32"):
        _native.softmax_stats(x.astype(np.float64), 1.0, 9.0)


# BF16P: the bf16 dot product of VDPBF16PS (kernels.h). Every ISA gives its bits: the AVX-512 source
# with the instruction (on SIMDe: the SDM's definition, avx512_emulated.cpp), AVX2 with two FMAs per
# pair under MXCSR's FTZ/DAZ, the reference with fma_ftz.
BF16P = _native.WType.BF16P


def bf16_bits(values):
    """The bf16 bits of float32 values that bf16 holds exactly."""
    return (
        torch.tensor(np.asarray(values, np.float32))
        .to(torch.bfloat16)
        .view(torch.int16)
        .numpy()
        .view(np.uint16)
    )


@pytest.mark.parametrize("m", [2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 47, 48, 49, 61])
def test_bf16_dot_gemm_tiles_are_identical_across_isas_and_alone(m):
    """The VDPBF16PS GEMM (two rows or more: tiles of up to 6 tokens x 4 panels, the panels left
    over in tiles of 1-3, rows in blocks of 48) gives the reference's bits for every row count and
    panel remainder; and every row computed alone (the GEMV tiles) is the same row inside the
    call."""
    rng = np.random.default_rng(200 + m)
    for k, n in [(32, 16), (97, 9 * 16 - 3), (129, 6 * 16), (576, 7 * 16 + 1)]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        raw, _ = weights(n, k, "bf16p", rng)
        ref = _native.kernel_matmul("generic", x, raw, BF16P)
        for isa in ISAS[1:]:
            if _native.isa_supported(isa):
                assert np.array_equal(_native.kernel_matmul(isa, x, raw, BF16P), ref), (isa, k, n)
                alone = np.concatenate(
                    [_native.kernel_matmul(isa, x[t : t + 1], raw, BF16P) for t in range(m)]
                )
                assert np.array_equal(alone, ref), (isa, k, n)


def test_bf16_dot_takes_each_pair_odd_k_first():
    """Per pair of k the odd product is added first, as the SDM defines VDPBF16PS: with ones for
    weights and x = [0, 1, 2^-24 + 2^-30, 2^-24], the odd-first chain 1, 1, 1 (a tie to even),
    1 + 2^-23 ends one ulp below the order k = 0, 1, 2, 3 of BF16 (1, 1 + 2^-23, then a tie to
    even: 1 + 2^-22)."""
    x = np.array([[0.0, 1.0, 2.0**-24 + 2.0**-30, 2.0**-24]], np.float32)
    w = bf16_bits(np.ones((16, 4)))
    for isa in ISAS:
        if _native.isa_supported(isa):
            assert _native.kernel_matmul(isa, x, w, BF16P)[0, 0] == np.float32(1 + 2.0**-23), isa
            assert _native.kernel_matmul(isa, x, w, _native.WType.BF16)[0, 0] == np.float32(
                1 + 2.0**-22
            ), isa


def test_bf16_dot_flushes_as_vdpbf16ps():
    """VDPBF16PS reads subnormal inputs as zero (DAZ) and flushes tiny results (FTZ), detecting
    tininess after rounding: every ISA does the same. Columns (one output each, k = 2: the odd
    product first):
      0: 2^-70 x 2^-70 = 2^-140 (a subnormal product): 0, where IEEE keeps it;
      1: 2^-63 x 2^-63 = 2^-126 (FLT_MIN, kept), then + 2^-75 x -2^-75: exactly FLT_MIN
         (1 - 2^-24), which gradual underflow rounds up to FLT_MIN but 24 bits with an unbounded
         exponent do not: 0;
      2: an activation just below FLT_MIN (f32 subnormal; rounding would make it FLT_MIN)
         x 2^100: 0;
      3: a subnormal bf16 weight (bits 0x0001) x 2^100: 0;
      4: a product that stays normal: 2^-60 x 2^-60 = 2^-120."""
    tiny_x = np.frombuffer(np.uint32(0x007FFFFF).tobytes(), np.float32)[0]
    x = np.array(
        [[2.0**-70, 0.0, 2.0**-75, 2.0**-63, tiny_x, 0.0, 0.0, 2.0**100, 0.0, 2.0**-60]], np.float32
    )
    w = np.zeros((16, 10), np.uint16)
    w[0, 0] = bf16_bits([2.0**-70])[0]
    w[1, 2:4] = bf16_bits([-(2.0**-75), 2.0**-63])
    w[2, 4] = bf16_bits([2.0**100])[0]
    w[3, 7] = 0x0001
    w[4, 9] = bf16_bits([2.0**-60])[0]
    expect = np.zeros(16, np.float32)
    expect[4] = 2.0**-120
    for isa in ISAS:
        if _native.isa_supported(isa):
            y = _native.kernel_matmul(isa, x, w, BF16P)[0]
            assert np.array_equal(y.view(np.uint32), expect.view(np.uint32)), (isa, y[:5])
    # the same inputs in IEEE arithmetic (BF16: float32 activations) keep the tiny results
    assert _native.kernel_matmul("generic", x, w, _native.WType.BF16)[0, 0] == np.float32(2.0**-140)


@pytest.mark.parametrize("isa", ISAS)
def test_bf16_dot_rounds_activations_as_vcvtne2ps2bf16(isa):
    """Activations round to nearest even (ties both ways), infinities stay, a value that rounds past
    the largest bf16 becomes infinity, NaN stays NaN. Row r holds one value at column r; the first
    output sums its row with weights of one, so it is the rounded value itself."""
    needs(isa)

    def b(bits):
        return np.frombuffer(np.asarray(bits, np.uint32).tobytes(), np.float32)

    # 1 + half an ulp of bf16 (a tie: to even, 1), 1 + 3 half ulps (a tie: up), just above a tie,
    # the largest floats, the infinities, a value bf16 holds
    values = np.concatenate(
        [b([0x3F808000, 0x3F818000, 0x3F808001, 0x7F7FFFFF, 0xFF7FFFFF]), [np.inf, -np.inf, 1.5]]
    )
    x = np.zeros((len(values) + 1, 32), np.float32)
    x[np.arange(len(values)), np.arange(len(values))] = values
    x[-1, 5] = np.nan
    w = np.zeros((16, 32), np.float32)
    w[0] = 1
    y = _native.kernel_matmul(isa, x, bf16_bits(w), BF16P)[:, 0]
    expect = np.array(
        [1.0, 1 + 2.0**-6, 1 + 2.0**-7, np.inf, -np.inf, np.inf, -np.inf, 1.5], np.float32
    )
    assert np.array_equal(y[:-1], expect), y
    assert np.isnan(y[-1])
