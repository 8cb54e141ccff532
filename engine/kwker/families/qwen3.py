"""Qwen3ForCausalLM: the Llama layout plus an RMSNorm of every query and key head before RoPE (q_norm, k_norm),
and an explicit head_dim (128 on the small models, not hidden / heads)."""

from __future__ import annotations

from kwker.families import llama
from kwker.families.llama import rope_tables, unsupported  # noqa: F401  (the family's interface)


def native_config(model) -> dict:
    return {**llama.native_config(model), "qk_norm": True}


def layer_norms(layer):
    yield from llama.layer_norms(layer)
    yield "q_norm", layer.self_attn.q_norm
    yield "k_norm", layer.self_attn.k_norm


def weights(model):
    return llama.weights(model, norms=layer_norms)
