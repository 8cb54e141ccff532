"""Phi3ForCausalLM (Phi-3 / Phi-3.5 mini, Phi-4-mini): the Llama layout with fused matrices, split at load (qkv_proj
into q, k, v; gate_up_proj into gate, up), optional partial rotary dims (the rope table's width says how many),
longrope scaling while the cache fits the original context, and a sliding window on every layer when set."""

from __future__ import annotations

from kwker.families import llama
from kwker.families.llama import native_config, rope_tables, unsupported  # noqa: F401  (the family's interface)


def fused_matrices(model, layer):
    c = model.config
    hd = llama.head_dim(c)
    qd, kvd = c.num_attention_heads * hd, c.num_key_value_heads * hd
    qkv, gate_up = layer.self_attn.qkv_proj.weight, layer.mlp.gate_up_proj.weight
    yield "q", qkv[:qd], None
    yield "k", qkv[qd : qd + kvd], None
    yield "v", qkv[qd + kvd :], None
    yield "o", layer.self_attn.o_proj.weight, None
    yield "gate", gate_up[: c.intermediate_size], None
    yield "up", gate_up[c.intermediate_size :], None
    yield "down", layer.mlp.down_proj.weight, None


def weights(model):
    return llama.weights(model, matrices=fused_matrices)
