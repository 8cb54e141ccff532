"""Rotary embedding (rope) tables in numpy: bit for bit the float32 tables transformers computes
with torch on an x86 CPU, without importing torch.

Transformers builds inv_freq with torch ops (pow, reciprocal, products, comparisons) and the tables
as cos / sin of positions * inv_freq, all in float32. Numpy's own float32 pow, cos and sin differ
from torch's by an ulp in a few percent of the entries (torch's are not correctly rounded, numpy's
are other functions), so this module replays the exact operations of the functions torch runs:

- pow (inv_freq): SLEEF's powf_u10 as built for AVX2 (with FMA) on the first 16 * (n // 16)
  exponents, the part torch's CPU loop vectorizes on AVX2, and the C library's powf on the rest,
  which torch computes with std::pow (here called through ctypes).
- cos, sin: oneMKL's vmsCos / vmsSin in VML_HA mode, which torch's vml::vcos / vsin call, as its
  generic x86 code path (the one MKL runs on non-Intel CPUs) computes them, op for op.
- everything else is one IEEE float32 operation each, the same in numpy as in torch once a Python
  scalar is rounded to float32 as torch rounds it (torch.tensor(x) * 1.1 multiplies by
  float32(1.1)), and `1.0 / t` is torch's reciprocal(t) * 1.0.

Where torch itself is not the same everywhere, the tables follow one machine: an AVX2 CPU on which
MKL takes its generic path (AMD). On Intel CPUs MKL's AVX2 kernel differs for angles above 10000
radians (~0.02% of those entries by an ulp, measured) and very rarely below; on AVX-512 machines
torch vectorizes pow 32 wide with SLEEF's AVX-512 build (not measured here).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math

import numpy as np

F32, F64, U32 = np.float32, np.float64, np.uint32
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope")
# positions per chunk: bounds the float64 temporaries of cos / sin (~0.2 GB at 256 freqs)
_ROWS = 4096


def rope_table(
    params: dict,
    head_dim: int,
    max_cache_len: int,
    *,
    partial_rotary_factor: float = 1.0,
    max_position_embeddings: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 [max_cache_len, rope_dim / 2] for positions 0 .. max_cache_len - 1: the first
    half of transformers' rotate_half tables (the second half repeats it), attention factor included.

    params: a transformers-5 `rope_parameters` dict (one layer type's, for Gemma 3). The rotated
    dims are int(head_dim * partial_rotary_factor): the caller passes the factor, because whether
    the "default" type honours params' partial_rotary_factor depends on the model (Phi-3's rotary
    embedding does, Llama's does not); params' own key is not read. max_position_embeddings: the
    config's, which yarn and longrope scale by when params have no `factor`."""
    kind = params.get("rope_type", params.get("type", "default"))
    dim = int(head_dim * partial_rotary_factor)
    inv_freq, attention_factor = _inv_freq(
        kind, params, dim, max_cache_len, max_position_embeddings
    )
    scale = F32(attention_factor)
    cos = np.empty((max_cache_len, inv_freq.size), F32)
    sin = np.empty((max_cache_len, inv_freq.size), F32)
    for start in range(0, max_cache_len, _ROWS):
        pos = np.arange(start, min(start + _ROWS, max_cache_len), dtype=F32)  # exact below 2**24
        freqs = pos[:, None] * inv_freq[None, :]  # float32 [rows, dim / 2], as torch multiplies
        cos[start : start + pos.size] = mkl_cos(freqs) * scale
        sin[start : start + pos.size] = mkl_sin(freqs) * scale
    return cos, sin


# ---- inv_freq: modeling_rope_utils' _compute_*_parameters and the models' default, op for op ----


def _inv_freq(kind, params, dim, max_cache_len, max_position_embeddings):
    """(inv_freq float32 [dim / 2], attention_factor) of one rope type."""
    base = params["rope_theta"]
    exponents = np.arange(0, dim, 2, dtype=F32) / F32(dim)  # float32 [dim / 2]
    if kind in ("default", "linear", "llama3"):
        inv_freq = F32(1) / powf(base, exponents)
        if kind == "linear":
            inv_freq = inv_freq / F32(params["factor"])
        elif kind == "llama3":
            inv_freq = _llama3(inv_freq, params)
        return inv_freq, 1.0
    if kind == "yarn":
        return _yarn(base, exponents, params, dim, max_position_embeddings)
    if kind == "longrope":
        return _longrope(base, exponents, params, dim, max_cache_len, max_position_embeddings)
    raise ValueError(f"rope type {kind!r} is not supported (supported: {', '.join(ROPE_TYPES)})")


def _llama3(inv_freq, params):
    factor = params["factor"]
    low_freq_factor, high_freq_factor = params["low_freq_factor"], params["high_freq_factor"]
    old_context_len = params["original_max_position_embeddings"]
    low_freq_wavelen = F32(old_context_len / low_freq_factor)  # torch compares in float32
    high_freq_wavelen = F32(old_context_len / high_freq_factor)
    wavelen = (F32(1) / inv_freq) * F32(2 * math.pi)
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / F32(factor), inv_freq)
    smooth = ((F32(1) / wavelen) * F32(old_context_len) - F32(low_freq_factor)) / F32(
        high_freq_factor - low_freq_factor
    )
    smoothed = ((F32(1) - smooth) * inv_freq_llama) / F32(factor) + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama)


def _yarn(base, exponents, params, dim, max_position_embeddings):
    factor = params.get("factor")
    attention_factor = params.get("attention_factor")
    mscale, mscale_all_dim = params.get("mscale"), params.get("mscale_all_dim")
    original = params["original_max_position_embeddings"]
    if factor is None:
        factor = max_position_embeddings / original

    def get_mscale(scale, m=1):
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(
                get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
            )
        else:
            attention_factor = get_mscale(factor)
    beta_fast = params.get("beta_fast") or 32
    beta_slow = params.get("beta_slow") or 1

    def correction_dim(rotations):
        return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # transformers' guard against a zero-width ramp
    ramp = np.clip((np.arange(dim // 2, dtype=F32) - F32(low)) / F32(high - low), F32(0), F32(1))
    extrapolation_factor = F32(1) - ramp  # float32 [dim / 2]
    pos_freqs = powf(base, exponents)
    extrapolation = F32(1) / pos_freqs
    interpolation = F32(1) / (pos_freqs * F32(factor))
    inv_freq = (
        interpolation * (F32(1) - extrapolation_factor) + extrapolation * extrapolation_factor
    )
    return inv_freq, attention_factor


def _longrope(base, exponents, params, dim, max_cache_len, max_position_embeddings):
    original = params["original_max_position_embeddings"]
    if max_cache_len > original:
        raise ValueError(
            f"longrope with max_cache_len {max_cache_len} longer than "
            f"original_max_position_embeddings {original} is not supported (transformers switches "
            "every position to the long factors once the text is longer)"
        )
    factor = params.get("factor")
    attention_factor = params.get("attention_factor")
    if factor is None:  # Phi-3 scales the attention by its context extension instead
        factor = max_position_embeddings / original
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    short = np.array(params["short_factor"], F32)  # float32 [dim / 2], as torch.tensor rounds
    return F32(1) / (short * powf(base, exponents)), attention_factor


# ---- pow: SLEEF powf_u10 (AVX2 + FMA) and the C library's powf, as torch splits them ----

_VEC = 16  # floats per iteration of torch's vectorized loop on AVX2 (2 x 8 lanes)


def powf(base, y: np.ndarray) -> np.ndarray:
    """float32(base) ** y (float32 [n]) as torch's `base ** tensor` computes it on AVX2."""
    x = F32(base)
    out = np.empty(y.shape, F32)
    vec = y.size // _VEC * _VEC
    out[:vec] = _sleef_powf(np.full(vec, x), y[:vec])
    out[vec:] = [_libm_powf(x, e) for e in y[vec:]]
    return out


@functools.cache
def _libm():
    name = ctypes.util.find_library("m")
    if name is None:
        return None
    f = ctypes.CDLL(name).powf
    f.restype, f.argtypes = ctypes.c_float, [ctypes.c_float, ctypes.c_float]
    return f


def _libm_powf(x, y) -> F32:
    f = _libm()
    if f is None:  # no C library to call: numpy's float32 power, libm's powf where numpy has none
        return np.power(x, y)
    return F32(f(float(x), float(y)))


def _fma(a, b, c):
    """float32 a * b + c with one rounding. The product is exact in float64; the sum is rounded to
    odd (TwoSum, then an inexact even result moves to its neighbour toward the exact sum), which
    makes the rounding to float32 the correct one."""
    p = a.astype(F64) * b.astype(F64)
    cd = np.asarray(c, F32).astype(F64)
    s = p + cd
    bb = s - p
    err = (p - (s - bb)) + (cd - bb)  # s + err == p + c exactly
    bits = s.view(np.int64).copy()
    inexact_even = (err != 0) & ((bits & 1) == 0)
    bits[inexact_even] += np.where((err > 0) == (s > 0), 1, -1)[inexact_even]
    return bits.view(F64).astype(F32)


# SLEEF's double-float helpers (src/common/df.h, the ENABLE_FMA_SP versions), on (hi, lo) pairs


def _df_add2_ff(x, y):
    s = x + y
    v = s - x
    return s, (x - (s - v)) + (y - v)


def _df_add2_f2f(x, y):
    s = x[0] + y
    v = s - x[0]
    return s, ((x[0] - (s - v)) + (y - v)) + x[1]


def _df_add2_f2f2(x, y):
    s = x[0] + y[0]
    v = s - x[0]
    return s, ((x[0] - (s - v)) + (y[0] - v)) + (x[1] + y[1])


def _df_add_f2f2(x, y):
    s = x[0] + y[0]
    return s, (((x[0] - s) + y[0]) + x[1]) + y[1]


def _df_add_ff2(x, y):
    s = x + y[0]
    return s, ((x - s) + y[0]) + y[1]


def _df_mul_f2f(x, y):
    s = x[0] * y
    return s, _fma(x[1], y, _fma(x[0], y, -s))


def _df_mul_f2f2(x, y):
    s = x[0] * y[0]
    return s, _fma(x[0], y[1], _fma(x[1], y[0], _fma(x[0], y[0], -s)))


def _df_squ(x):
    s = x[0] * x[0]
    return s, _fma(x[0] + x[0], x[1], _fma(x[0], x[0], -s))


def _df_div(n, d):
    t = F32(1) / d[0]
    s = n[0] * t
    u = _fma(t, n[0], -s)
    v = _fma(-d[1], t, _fma(-d[0], t, F32(1)))
    return s, _fma(s, v, _fma(n[1], t, u))


def _sleef_powf(x, y):
    """SLEEF xpowf (sleefsimdsp.c) for x > 0 normal and finite y: expkf(logkf(x) * y)."""
    # logkf: x = m * 2**e with m in [0.75, 1.5), log(m) from an atanh series in double-float
    e = (((x * F32(1.0 / 0.75)).view(np.int32) >> 23) & 0xFF) - 0x7F
    m = (x.view(np.int32) + (-e << 23)).view(F32)
    t = _df_div(_df_add2_ff(F32(-1), m), _df_add2_ff(F32(1), m))
    t2 = _df_squ(t)
    p = _fma(_fma(F32(0.240320354700088500976562), t2[0], F32(0.285112679004669189453125)), t2[0],
             F32(0.400007992982864379882812))  # fmt: skip
    c = (F32(0.66666662693023681640625), F32(3.69183861259614332084311e-09))
    ln2 = (F32(0.69314718246459960938), F32(-1.904654323148236017e-09))
    s = _df_mul_f2f(ln2, e.astype(F32))
    s = _df_add_f2f2(s, (t[0] * F32(2), t[1] * F32(2)))
    s = _df_add_f2f2(s, _df_mul_f2f2(_df_mul_f2f2(t2, t), _df_add2_f2f2(_df_mul_f2f(t2, p), c)))
    d = _df_mul_f2f(s, y)
    # expkf: 2**q * exp(r), r = d - q * ln2 in two parts
    q = np.rint((d[0] + d[1]) * F32(1.442695040888963407359924681)).astype(np.int32)
    qf = q.astype(F32)
    r = _df_add2_f2f(d, qf * -F32(0.693145751953125))
    r = _df_add2_f2f(r, qf * -F32(1.428606765330187045e-06))
    r = (r[0] + r[1], (r[0] - (r[0] + r[1])) + r[1])  # dfnormalize
    u = F32(0.00136324646882712841033936)
    for coef in (0.00836596917361021041870117, 0.0416710823774337768554688,
                 0.166665524244308471679688, 0.499999850988388061523438):  # fmt: skip
        u = _fma(u, r[0], F32(coef))
    w = _df_add_ff2(F32(1), _df_add_f2f2(r, _df_mul_f2f(_df_squ(r), u)))
    out = ((w[0] + w[1]) * np.exp2(q.astype(F64))).astype(F32)  # exact: the results are normal
    return np.where((y == 0) | (x == 1), F32(1), out).astype(F32)


# ---- cos, sin: oneMKL VML_HA single precision, its generic x86 path, op for op ----
#
# |x| <= 10000: x - n * pi (pi in two doubles, n from a float32 rounding trick whose parity gives
# the sign) and an odd polynomial in double, rounded to float32 once. cos is sin(|x| + pi/2) by
# shifting n by a half. |x| > 10000: x / (2 pi) in fixed point from a 96-bit window of 1/(2 pi)'s
# bits picked by x's exponent (Payne-Hanek), split as 256 table steps + a remainder r in turns,
# r * 2 pi in float32 pairs, then cos / sin(step + r) = table terms + float32 polynomials in r.


def _h32(bits: int) -> F32:
    return np.array([bits], U32).view(F32)[0]


def _f(bits: np.ndarray) -> np.ndarray:
    return bits.view(F32)


_HALF_PI, _INV_PI = _h32(0x3FC90FDB), _h32(0x3EA2F983)
_SHIFT = F32(12582912.0)  # 1.5 * 2**23: adding it rounds to an integer, its last bit the parity
_PI_HI = F64(float.fromhex("0x1.921fb54440000p+1"))  # pi in two doubles: n * _PI_HI is exact
_PI_LO = F64(float.fromhex("0x1.68c234c4c6629p-38"))
_POLY = tuple(F64(float.fromhex(h)) for h in
              ("0x1.5dbdf0e4c7deep-19", "-0x1.9f6ffeea73463p-13", "0x1.110ed3804ca96p-7",
               "-0x1.55554bc836587p-3"))  # fmt: skip
_FAST_LIMIT = F32(10000.0)
_TWO_PI_HI, _TWO_PI_LO, _TWO_PI = _h32(0x40C91000), _h32(0x3795777A), _h32(0x40C90FDB)
_SIN_C2, _SIN_C1, _COS_C2 = _h32(0x3C08885C), _h32(0xBE2AAAAB), _h32(0x3D2AAA7C)


def mkl_cos(x: np.ndarray) -> np.ndarray:
    """float32 cos of float32 x (any shape) as torch.cos computes it (oneMKL vmsCos, VML_HA)."""
    return _mkl(x, cos=True)


def mkl_sin(x: np.ndarray) -> np.ndarray:
    """float32 sin of float32 x (any shape) as torch.sin computes it (oneMKL vmsSin, VML_HA)."""
    return _mkl(x, cos=False)


def _mkl(x, cos):
    x = np.asarray(x, F32)
    flat = x.ravel()
    ax = np.abs(flat)
    if not np.isfinite(ax).all():
        raise ValueError("cos / sin of inf or nan: not emulated (rope angles are finite)")
    out = np.empty_like(flat)
    small = ax <= _FAST_LIMIT
    out[small] = _mkl_fast(ax[small], cos)
    if not cos:  # sin is odd
        out[small] = _f(out[small].view(U32) ^ (flat[small].view(U32) & U32(0x80000000)))
    if not small.all():
        big = ~small
        out[big] = _mkl_big(flat[big], _tables()[0 if cos else 1])
    return out.reshape(x.shape)


def _mkl_fast(ax, cos):
    """|x| <= 10000 (float32 [n], non-negative)."""
    t = (ax + _HALF_PI) * _INV_PI if cos else ax * _INV_PI
    y = t + _SHIFT
    n = y - _SHIFT
    if cos:
        n = n + F32(-0.5)
    nd = n.astype(F64)
    r = (ax.astype(F64) - nd * _PI_HI) - nd * _PI_LO  # float64 [n], |r| <= pi/2
    r2 = r * r
    p = r2 * _POLY[0]
    for coef in _POLY[1:]:
        p = (p + coef) * r2
    res = (p * r + r).astype(F32)
    return _f(res.view(U32) ^ (y.view(U32) << U32(31)))


def _mkl_big(x, table):
    """|x| > 10000 (float32 [n]); table float32 [256, 4]."""
    xb = x.view(U32)
    words = _inv2pi_words()[(xb >> U32(23)) & U32(0xFF)]  # uint32 [n, 3]
    lo16, s16 = U32(0xFFFF), U32(16)
    t0l, t0h = words[:, 0] & lo16, words[:, 0] >> s16
    t1l, t1h = words[:, 1] & lo16, words[:, 1] >> s16
    t2l, t2h = words[:, 2] & lo16, words[:, 2] >> s16
    mh = ((xb >> s16) & U32(0x7F)) | U32(0x80)  # the significand's top 8 bits and its low 16
    ml = xb & lo16
    # The 24 x 96-bit product in 16-bit pieces with uint32 sums, as MKL adds them (it drops the
    # lowest pieces, which only the carries into bit 32 would see)
    a3 = ((t2h * ml) >> s16) + t2h * mh
    a4 = ((t1h * ml) >> s16) + t1h * mh
    a10 = ((t0l * ml) >> s16) + (t0h * ml + t0l * mh)
    a7 = ((t1h * ml) & lo16) + t1l * mh + ((t1l * ml) >> s16)
    a15 = ((t0l * ml) & lo16) + a4
    a6 = ((t2l * mh) >> s16) + ((t1l * ml) & lo16) + a3
    a4 = (a6 >> s16) + a7
    a7 = (a4 >> s16) + a15
    w_hi = (a10 << s16) + a7  # bits 64..95 of the product: x / (2 pi)'s fraction, its top word
    w_mid = a4 << s16
    w_lo = (a6 & lo16) | w_mid
    sign = xb & U32(0x80000000)
    # The fraction as float32s: 1.f (top 23 bits), the next 23 bits and the last 18, exact
    one_f = _f((w_hi >> U32(9)) | sign | U32(0x3F800000))
    k = one_f + F32(49152.0)  # rounds to 1/256 turns: the table index is in its low bits
    frac = one_f - (k + F32(-49152.0))
    e46 = sign | U32(0x28800000)
    lo = _f(((w_lo << U32(5)) & U32(0x007FFFE0)) | e46) - _f(e46)
    e23 = sign | U32(0x34000000)
    mid = _f(((a7 << U32(14)) & U32(0x007FC000)) | (w_mid >> U32(18)) | e23) - _f(e23)
    s = mid + frac
    e = ((frac - s) + mid) + lo
    # r = (s + e) turns in radians, as a float32 pair (rh, rl)
    sh = _f(s.view(U32) & U32(0xFFFFF000))
    sl = s - sh
    h = sh * _TWO_PI_HI
    t10 = (e * _TWO_PI - sl * _TWO_PI_LO) + (sl * _TWO_PI_HI - sh * _TWO_PI_LO)
    rh = h + t10
    rl = (h - rh) + t10
    r2 = rh * rh
    idx = k.view(U32) & U32(0xFF)
    a, b, c, d = table[idx, 0], table[idx, 1], table[idx, 2], table[idx, 3]
    ps = (r2 * _SIN_C2 + _SIN_C1) * r2 * rh  # sin(r) - r
    pc = (r2 * _COS_C2 + F32(-0.5)) * r2 * b  # (cos(r) - 1) * b
    s1 = d * rh + b
    e1 = (b - s1) + d * rh
    s2 = a * rh + s1
    e2 = ((s1 - s2) + a * rh) + e1
    t3 = (d + a) - rh * b
    pc = pc + (rl * t3 + c)
    return ((t3 * ps + e2) + pc) + s2


# ---- the tables, computed once with integer arithmetic (exact roundings) ----

_PREC = 320  # fixed-point bits of the table computations


def _atan_inv(n: int, prec: int) -> int:
    """atan(1/n) * 2**prec (truncated)."""
    total, term, k, sign = 0, (1 << prec) // n, 1, 1
    while term:
        total += sign * (term // k)
        term //= n * n
        k += 2
        sign = -sign
    return total


def _pi(prec: int) -> int:
    g = prec + 16  # guard bits
    return (16 * _atan_inv(5, g) - 4 * _atan_inv(239, g)) >> 16


def _cos_sin(k: int, n: int, prec: int) -> tuple[int, int]:
    """cos, sin of 2 pi k / n, times 2**prec (Taylor series in fixed point)."""
    g = prec + 16
    one = 1 << g
    x = 2 * _pi(g) * k // n
    c = s = 0
    term, i = one, 0
    while term:
        if i % 4 == 0:
            c += term
        elif i % 4 == 1:
            s += term
        elif i % 4 == 2:
            c -= term
        else:
            s -= term
        i += 1
        term = term * x // (one * i)
    return c >> 16, s >> 16


def _round_f32(n: int, prec: int) -> float:
    """n / 2**prec rounded to the nearest float32 (ties to even), without double rounding."""
    if n == 0:
        return 0.0
    mag = abs(n)
    shift = mag.bit_length() - 24
    if shift > 0:
        q, rem = divmod(mag, 1 << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and q & 1):
            q += 1
    else:
        q = mag << -shift
    v = q * 2.0 ** (shift - prec)
    return -v if n < 0 else v


def _pow2_near(n: int) -> int:
    """The power of two MKL's tables split off (nearest on a log scale, the sqrt(2)/2 tie up)."""
    if n == 0:
        return 0
    e = abs(n).bit_length() - 1
    up = n * n >= (1 << (2 * e + 1)) - (1 << (2 * e + 1 - 200))
    v = 1 << (e + 1 if up else e)
    return v if n > 0 else -v


@functools.cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """MKL's cos and sin tables float32 [256, 4]: (a, b, c, d) at step k, with b + c the function
    at 2 pi k / 256 (float32 + remainder) and d + a its derivative, d a power of two."""
    one = 1 << _PREC
    tables = np.zeros((2, 256, 4), F32)
    for k in range(256):
        c, s = _cos_sin(k, 256, _PREC)
        if k % 64 == 0:  # exactly 0 or +-1
            c, s = round(c / one) * one, round(s / one) * one
        for t, (v, w) in enumerate(((c, -s), (s, c))):
            b = _round_f32(v, _PREC)
            rest = v - int(b * 2.0**64) * (1 << (_PREC - 64))  # b is a multiple of 2**-64
            d = _pow2_near(w)
            tables[t, k] = (_round_f32(w - d, _PREC), b, _round_f32(rest, _PREC),
                            _round_f32(d, _PREC))  # fmt: skip
    tables[tables == 0] = 0.0  # +0.0, as MKL stores zeros
    return tables[0], tables[1]


@functools.cache
def _inv2pi_words() -> np.ndarray:
    """uint32 [256, 3]: for each float32 biased exponent E, the 96 bits of 2**(E - 54) / (2 pi) below
    its units, so a significand times them holds x / (2 pi)'s fraction in its bits 64..95."""
    prec = 420
    inv = (1 << (2 * prec)) // (2 * _pi(prec))  # 2**prec / (2 pi)
    words = np.zeros((256, 3), U32)
    for e in range(256):
        shift = 96 + e - 150
        v = ((inv << shift) if shift >= 0 else (inv >> -shift)) >> prec
        v &= (1 << 96) - 1
        words[e] = ((v >> 64) & 0xFFFFFFFF, (v >> 32) & 0xFFFFFFFF, v & 0xFFFFFFFF)
    return words
