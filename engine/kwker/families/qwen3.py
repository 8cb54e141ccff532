"""Qwen3ForCausalLM: the Llama layout plus an RMSNorm of every query and key head before RoPE (q_norm, k_norm),
and an explicit head_dim (128 on the small models, not hidden / heads)."""

from __future__ import annotations

from kwker.families import llama
from kwker.families.llama import rope_tables, unsupported  # noqa: F401  (the family's interface)


def native_config(model) -> dict:
    return {**llama.native_config(model), "qk_norm": True}


def weights(model):
    yield from llama.weights(model)
    for i, layer in enumerate(model.model.layers):
        yield f"layers.{i}.q_norm", layer.self_attn.q_norm.weight, None
        yield f"layers.{i}.k_norm", layer.self_attn.k_norm.weight, None
