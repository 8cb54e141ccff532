"""kwker.rope's numpy tables against transformers' rotary embedding modules (torch, float32): every
rope type the families support, on tiny configs of every family, bit for bit.

The exact comparisons hold where torch runs the functions kwker.rope replays: an AVX2 CPU on which
MKL takes its generic path (see kwker.rope). Elsewhere they allow the ulp torch's own kernels differ
by."""

import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import (
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Phi3Config,
    Qwen2Config,
    Qwen3Config,
)
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding
from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2RotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from kwker import rope
from kwker.families import gemma3, llama, phi3

LENGTHS = [1, 7, 300, 5000]


def hf_tables(rotary, max_cache_len: int, *args) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 [max_cache_len, rope_dim / 2]: the module's tables for positions 0 .. L-1,
    their first (rotate_half) half, as the decoder took them before kwker.rope."""
    pos = torch.arange(max_cache_len)[None]
    with torch.no_grad():
        c, s = rotary(torch.zeros(1, dtype=torch.float32), pos, *args)
    half = c.shape[-1] // 2
    return c[0, :, :half].float().numpy(), s[0, :, :half].float().numpy()


def ulps(a: np.ndarray, b: np.ndarray) -> int:
    """The largest distance between a and b in float32 steps."""

    def ordered(x):
        i = x.astype(np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)

    return int(np.abs(ordered(a) - ordered(b)).max(initial=0))


def assert_same(ours, theirs):
    """As close as torch's float32 pow / cos / sin allow (see kwker.rope): inv_freq within an ulp,
    so angles (position p times inv_freq <= 1) within a few ulp of p, and the tables within that
    (rows are positions; 1-D arrays are compared as one position)."""
    assert ours.dtype == np.float32 and ours.shape == theirs.shape
    position = np.arange(len(ours)).reshape(-1, *[1] * (ours.ndim - 1)) if ours.ndim > 1 else 0
    tolerance = 2.5e-7 * (1 + position)
    assert np.all(np.abs(ours.astype(np.float64) - theirs) <= tolerance), float(
        np.abs(ours.astype(np.float64) - theirs).max()
    )


def small(cls, **kw):
    base = dict(vocab_size=64, hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                intermediate_size=64, num_hidden_layers=2, max_position_embeddings=32768)  # fmt: skip
    return cls(**{**base, **kw})


LLAMA3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
              high_freq_factor=4.0, original_max_position_embeddings=64)  # fmt: skip
LLAMA3_8K = {**LLAMA3, "factor": 32.0, "original_max_position_embeddings": 8192}
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)

# name: (config, rotary embedding class), the single-table families
CASES = {
    "llama-default": (small(LlamaConfig), LlamaRotaryEmbedding),
    "llama-theta5e5": (
        small(LlamaConfig, rope_parameters=dict(rope_type="default", rope_theta=500000.0)),
        LlamaRotaryEmbedding,
    ),
    # 24 frequencies: torch's pow takes 16 from SLEEF, 8 from libm
    "llama-hd48": (small(LlamaConfig, head_dim=48), LlamaRotaryEmbedding),
    "llama-hd16": (small(LlamaConfig, hidden_size=32), LlamaRotaryEmbedding),  # 8: all libm
    "llama-hd160": (small(LlamaConfig, head_dim=160), LlamaRotaryEmbedding),
    "llama-linear": (
        small(LlamaConfig, rope_parameters=dict(rope_type="linear", rope_theta=1e4, factor=4.0)),
        LlamaRotaryEmbedding,
    ),
    "llama-llama3": (small(LlamaConfig, rope_parameters=LLAMA3), LlamaRotaryEmbedding),
    "llama-llama3-8k": (
        small(LlamaConfig, rope_parameters=LLAMA3_8K, head_dim=128),
        LlamaRotaryEmbedding,
    ),
    "llama-yarn": (small(LlamaConfig, rope_parameters=YARN), LlamaRotaryEmbedding),
    "llama-yarn-no-truncate": (
        small(
            LlamaConfig,
            rope_parameters={**YARN, "truncate": False, "beta_fast": 16, "beta_slow": 2},
        ),
        LlamaRotaryEmbedding,
    ),
    "llama-yarn-mscale": (
        small(
            LlamaConfig,
            rope_parameters={
                **YARN,
                "factor": 40.0,
                "mscale": 0.707,
                "mscale_all_dim": 1.0,
                "rope_theta": 1e6,
            },
        ),
        LlamaRotaryEmbedding,
    ),
    "llama-yarn-attention-factor": (
        small(LlamaConfig, rope_parameters={**YARN, "attention_factor": 1.3}),
        LlamaRotaryEmbedding,
    ),
    "mistral": (
        small(
            MistralConfig, head_dim=32, rope_parameters=dict(rope_type="default", rope_theta=1e6)
        ),
        MistralRotaryEmbedding,
    ),
    "qwen2": (
        small(Qwen2Config, rope_parameters=dict(rope_type="default", rope_theta=1e6)),
        Qwen2RotaryEmbedding,
    ),
    "qwen2-yarn": (
        small(
            Qwen2Config,
            rope_parameters={**YARN, "rope_theta": 1e6, "original_max_position_embeddings": 4096},
        ),
        Qwen2RotaryEmbedding,
    ),
    "qwen3": (
        small(Qwen3Config, head_dim=128, rope_parameters=dict(rope_type="default", rope_theta=1e6)),
        Qwen3RotaryEmbedding,
    ),
    # head_dim 96, 72 of its dims rotate
    "phi3-partial": (
        small(Phi3Config, hidden_size=192, partial_rotary_factor=0.75, pad_token_id=0),
        Phi3RotaryEmbedding,
    ),
    "phi3-longrope": (
        small(
            Phi3Config,
            hidden_size=192,
            max_position_embeddings=131072,
            original_max_position_embeddings=8192,
            pad_token_id=0,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                short_factor=[1.0 + 0.05 * i for i in range(48)],
                long_factor=[4.0] * 48,
            ),
        ),
        Phi3RotaryEmbedding,
    ),
    "phi3-longrope-partial": (
        small(
            Phi3Config,
            hidden_size=256,
            max_position_embeddings=131072,
            original_max_position_embeddings=8192,
            pad_token_id=0,
            partial_rotary_factor=0.75,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=250000.0,
                short_factor=[1.0 + 0.1 * i for i in range(48)],
                long_factor=[3.0] * 48,
            ),
        ),
        Phi3RotaryEmbedding,
    ),
}


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("name", list(CASES))
def test_family_tables(name, length):
    config, rotary_cls = CASES[name]
    cos, sin = llama.rope_tables(config, length)  # float32 [1, L, rope_dim / 2]
    hf_cos, hf_sin = hf_tables(rotary_cls(config), length)
    assert cos.shape[0] == 1
    assert_same(cos[0], hf_cos)
    assert_same(sin[0], hf_sin)


def gemma3_config(**rope):
    return small(Gemma3TextConfig, head_dim=64, num_hidden_layers=6, sliding_window=16,
                 rope_parameters=rope or None)  # fmt: skip


GEMMA3 = {
    "default": gemma3_config(),
    "linear": gemma3_config(
        full_attention=dict(rope_type="linear", rope_theta=1e6, factor=8.0),
        sliding_attention=dict(rope_type="default", rope_theta=10000.0),
    ),
    "yarn": gemma3_config(
        full_attention={**YARN, "rope_theta": 1e6, "truncate": False},
        sliding_attention=dict(rope_type="default", rope_theta=10000.0),
    ),
}


@pytest.mark.parametrize("length", LENGTHS)
@pytest.mark.parametrize("name", list(GEMMA3))
def test_gemma3_tables(name, length):
    config = GEMMA3[name]
    cos, sin = gemma3.rope_tables(config, length)  # float32 [n_types, L, head_dim / 2]
    rotary = Gemma3RotaryEmbedding(config)
    kinds = gemma3.rope_layer_types(config)
    assert cos.shape[0] == len(kinds) == 2
    for i, kind in enumerate(kinds):
        hf_cos, hf_sin = hf_tables(rotary, length, kind)
        assert_same(cos[i], hf_cos)
        assert_same(sin[i], hf_sin)


def test_phi3_interface_is_llamas():
    config = CASES["phi3-partial"][0]
    cos, _ = phi3.rope_tables(config, 4)
    assert cos.shape == (1, 4, 36)  # 0.75 of head_dim 96 rotates


def test_long_caches_angles():
    """Angles far past 2 pi (a long cache's first columns) stay within the ulp."""
    config = small(LlamaConfig, head_dim=32, max_position_embeddings=131072)
    cos, sin = llama.rope_tables(config, 20000)
    hf_cos, hf_sin = hf_tables(LlamaRotaryEmbedding(config), 20000)
    assert_same(cos[0], hf_cos)
    assert_same(sin[0], hf_sin)


def test_functions_against_correct_rounding():
    """pow, cos, sin are the float64 values rounded once (torch's are within an ulp of them)."""
    rng = np.random.default_rng(0)
    x = rng.uniform(-1e5, 1e5, 100_000).astype(np.float32)
    t = torch.from_numpy(x)
    assert ulps(rope.cos32(x), t.cos().numpy()) <= 1
    assert ulps(rope.sin32(x), t.sin().numpy()) <= 1
    for base in [10000.0, 500000.0, 1e6, *rng.uniform(2, 1e8, 5)]:
        e = torch.arange(0, 128, 2, dtype=torch.float) / 128
        assert ulps(rope.powf(base, e.numpy()), (base**e).numpy()) <= 1


def test_rope_table_direct():
    params = dict(rope_type="linear", rope_theta=10000.0, factor=2.0)
    cos, sin = rope.rope_table(params, 64, 10)
    assert cos.shape == sin.shape == (10, 32) and cos.dtype == np.float32
    assert cos.flags.c_contiguous and sin.flags.c_contiguous
    assert (cos[0] == 1).all() and (sin[0] == 0).all()
    cos, _ = rope.rope_table(
        dict(rope_type="default", rope_theta=1e4), 64, 3, partial_rotary_factor=0.5
    )
    assert cos.shape == (3, 16)


def test_unsupported_rope():
    longrope = dict(rope_type="longrope", rope_theta=1e4, original_max_position_embeddings=16,
                    short_factor=[1.0] * 8, long_factor=[2.0] * 8)  # fmt: skip
    rope.rope_table(longrope, 16, 16, max_position_embeddings=64)
    with pytest.raises(ValueError, match="longrope"):
        rope.rope_table(longrope, 16, 17, max_position_embeddings=64)
    with pytest.raises(ValueError, match="dynamic"):
        rope.rope_table(dict(rope_type="dynamic", rope_theta=1e4, factor=2.0), 16, 4)


def test_imports_no_torch():
    code = (
        "import sys, kwker.rope as r\n"
        "r.rope_table({'rope_type': 'yarn', 'rope_theta': 1e4, 'factor': 4.0,"
        " 'original_max_position_embeddings': 64}, 32, 20000)\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
