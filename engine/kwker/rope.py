"""Rotary embedding (rope) tables in numpy, without torch: the one rope function of both load
paths (a Hugging Face model object and model files), so both pack the same tables.

The formulas are transformers' (modeling_rope_utils' _compute_*_parameters and the models' rotary
embeddings), op for op in float32 where transformers computes in float32. The two transcendental
steps, pow (inv_freq) and cos / sin (the tables), are computed in float64 and rounded to float32:
correctly rounded in all but the rarest cases, the same on every machine. torch's own float32 pow,
cos and sin are not correctly rounded and differ between CPUs (SLEEF's vector pow, oneMKL's
vmsCos per CPU vendor), so the tables are within 1 ulp of transformers' (a few percent of the
entries differ by that ulp), never bit-exact by design.
"""

from __future__ import annotations

import math

import numpy as np

F32, F64 = np.float32, np.float64
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "longrope", "freq_factors")
# positions per chunk: bounds the float64 temporaries of cos / sin (~8 MB at 256 freqs)
_ROWS = 4096


def rope_table(
    params: dict,
    head_dim: int,
    max_cache_len: int,
    *,
    partial_rotary_factor: float = 1.0,
    max_position_embeddings: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 [max_cache_len, rope_dim / 2] for positions 0 .. max_cache_len - 1: the
    first half of transformers' rotate_half tables (the second half repeats it), attention factor
    included.

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
        cos[start : start + pos.size] = cos32(freqs) * scale
        sin[start : start + pos.size] = sin32(freqs) * scale
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
    if kind == "freq_factors":  # a GGUF's rope_freqs.weight: llama.cpp divides each frequency
        factors = np.asarray(params["freq_factors"], F32)
        if factors.shape != (dim // 2,):
            raise ValueError(f"{factors.size} rope frequency factors for {dim // 2} frequencies")
        return (F32(1) / powf(base, exponents)) / factors, 1.0
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


# ---- pow, cos, sin: float64, rounded once to float32 ----


def powf(base, y: np.ndarray) -> np.ndarray:
    """float32(base) ** y (float32 [n]), correctly rounded to float32."""
    return (F64(F32(base)) ** y.astype(F64)).astype(F32)


def cos32(x: np.ndarray) -> np.ndarray:
    return np.cos(x.astype(F64)).astype(F32)


def sin32(x: np.ndarray) -> np.ndarray:
    return np.sin(x.astype(F64)).astype(F32)
