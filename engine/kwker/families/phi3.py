"""Phi3ForCausalLM (Phi-3 / Phi-3.5 mini, Phi-4-mini): the Llama layout with fused matrices, split
at load (qkv_proj into q, k, v; gate_up_proj into gate, up), optional partial rotary dims (the rope
table's width says how many), longrope scaling while the cache fits the original context, and a
sliding window on every layer when set."""

from __future__ import annotations

from kwker.families import llama
from kwker.families.llama import (  # noqa: F401  (the interface)
    native_config,
    norm_values,
    rope_tables,
    unsupported,
)


def fused_matrices(c, i: int):
    """q, k, v as rows of qkv_proj, gate and up as rows of gate_up_proj (no biases)."""
    hd = llama.head_dim(c)
    qd, kvd = c.num_attention_heads * hd, c.num_key_value_heads * hd
    p, ff = f"model.layers.{i}.", c.intermediate_size
    spec = llama.WeightSpec
    qkv, gate_up = p + "self_attn.qkv_proj.weight", p + "mlp.gate_up_proj.weight"
    yield spec(f"layers.{i}.q", qkv, rows=(0, qd))
    yield spec(f"layers.{i}.k", qkv, rows=(qd, qd + kvd))
    yield spec(f"layers.{i}.v", qkv, rows=(qd + kvd, qd + 2 * kvd))
    yield spec(f"layers.{i}.o", p + "self_attn.o_proj.weight")
    yield spec(f"layers.{i}.gate", gate_up, rows=(0, ff))
    yield spec(f"layers.{i}.up", gate_up, rows=(ff, 2 * ff))
    yield spec(f"layers.{i}.down", p + "mlp.down_proj.weight")


def weights(c, tied: bool):
    return llama.weights(c, tied, matrices=fused_matrices)
