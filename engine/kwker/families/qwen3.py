"""Qwen3ForCausalLM: the Llama layout plus an RMSNorm of every query and key head before RoPE
(q_norm, k_norm), and an explicit head_dim (128 on the small models, not hidden / heads)."""

from __future__ import annotations

from kwker.families import llama
from kwker.families.llama import (  # noqa: F401  (the interface)
    norm_values,
    rope_tables,
    unsupported,
)


def native_config(c, tied: bool, embed_dtype: str) -> dict:
    return {**llama.native_config(c, tied, embed_dtype), "qk_norm": True}


LAYER_NORMS = llama.LAYER_NORMS + (("q_norm", "self_attn.q_norm"), ("k_norm", "self_attn.k_norm"))


def weights(c, tied: bool):
    return llama.weights(c, tied, norms=LAYER_NORMS)
