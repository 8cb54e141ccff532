"""Gemma3ForCausalLM (model_type gemma3_text: Gemma 3 270M/1B and the text part of the larger ones).

What differs from Llama, all of it configuration of the one native step: RMSNorm weights are used as
(1 + w) (folded in at load); norms before and after both attention and MLP; q/k head norms;
embeddings scaled by sqrt(hidden_size) in the weights' dtype; gelu_pytorch_tanh gate; attention
scale query_pre_attn_scalar^-0.5; "sliding_attention" layers attend to the last sliding_window
positions and use their own rope table (base 10k), "full_attention" layers attend to everything with
the global one (base 1M, optionally scaled).
"""

from __future__ import annotations

import numpy as np

from kwker import _native
from kwker.families import llama

ACTIVATIONS = ("gelu_pytorch_tanh",)  # the native GeluTanh


def rope_layer_types(config) -> list[str]:
    return sorted(set(config.layer_types))


def unsupported(c, max_cache_len: int) -> str | None:
    act = getattr(c, "hidden_activation", None)
    if act not in ACTIVATIONS:
        return f"activation {act!r} is not supported (supported: {', '.join(ACTIVATIONS)})"
    if (
        getattr(c, "attn_logit_softcapping", None) is not None
        or getattr(c, "final_logit_softcapping", None) is not None
    ):
        return "logit softcapping (Gemma 2 style) is not supported"
    if getattr(c, "use_bidirectional_attention", False):
        return "bidirectional attention is not supported (causal LMs only)"
    for kind in rope_layer_types(c):
        reason = llama.rope_unsupported(c.rope_parameters[kind] or {}, max_cache_len)
        if reason:
            return f"{kind} layers: {reason}"
    return llama.shape_unsupported(c, max_cache_len)


def embed_scale(c, embed_dtype: str) -> float:
    """sqrt(hidden_size) in the embedding's dtype, as transformers multiplies by it (a float32
    scalar cast to the weights' dtype; quantized GGUF weights load as float32)."""
    scale = np.float32(c.hidden_size**0.5)
    if embed_dtype == "BF16":
        return _bf16(scale)
    if embed_dtype == "F16":
        return float(np.float16(scale))
    return float(scale)


def _bf16(x: np.float32) -> float:
    """x rounded to bfloat16 (to nearest even), as a float."""
    u = np.array([x], np.float32).view(np.uint32)
    u = (u + np.uint32(0x7FFF) + ((u >> 16) & 1)) & np.uint32(0xFFFF0000)
    return float(u.view(np.float32)[0])


def native_config(c, tied: bool, embed_dtype: str) -> dict:
    kinds = rope_layer_types(c)
    return {
        **llama.native_config(c, tied, embed_dtype),
        "attn_scale": float(c.query_pre_attn_scalar**-0.5),
        "qk_norm": True,
        "post_norms": True,
        "activation": _native.Activation.GeluTanh,
        "embed_scale": embed_scale(c, embed_dtype),
        "layer_rope": [kinds.index(t) for t in c.layer_types],
    }


def rope_tables(config, max_cache_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One table per layer type, in rope_layer_types order: cos, sin float32
    [n_types, max_cache_len, head_dim / 2]."""
    # transformers' yarn reads `truncate` from the top-level rope_parameters, which here holds the
    # layer types, so a layer's own `truncate` never applies (transformers 5.24)
    tables = [
        llama.config_rope_table(
            config, {**(config.rope_parameters[kind] or {}), "truncate": True}, max_cache_len
        )
        for kind in rope_layer_types(config)
    ]
    return np.stack([c for c, _ in tables]), np.stack([s for _, s in tables])


def norm_values(w):
    """Gemma's RMSNorm scales by (1 + w), computed in float32."""
    return np.float32(1.0) + w


# Gemma's four norms around attention and MLP, and the q/k head norms
LAYER_NORMS = (
    ("attn_norm", "input_layernorm"),
    ("post_attn_norm", "post_attention_layernorm"),
    ("mlp_norm", "pre_feedforward_layernorm"),
    ("post_mlp_norm", "post_feedforward_layernorm"),
    ("q_norm", "self_attn.q_norm"),
    ("k_norm", "self_attn.k_norm"),
)


def weights(c, tied: bool):
    return llama.weights(c, tied, norms=LAYER_NORMS)
