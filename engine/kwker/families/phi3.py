"""Phi3ForCausalLM (Phi-3 / Phi-3.5 mini, Phi-4-mini): the Llama layout with fused matrices, split at load (qkv_proj
into q, k, v; gate_up_proj into gate, up), optional partial rotary dims (the rope table's width says how many),
longrope scaling while the cache fits the original context, and a sliding window on every layer when set."""

from __future__ import annotations

from kwker.families import llama
from kwker.families.llama import native_config, rope_tables, unsupported  # noqa: F401  (the family's interface)


def weights(model):
    c = model.config
    m = model.model
    hd = llama.head_dim(c)
    qd, kvd = c.num_attention_heads * hd, c.num_key_value_heads * hd
    yield "embed", m.embed_tokens.weight, None
    if not llama.tied(model):
        yield "lm_head", model.lm_head.weight, None
    yield "norm", m.norm.weight, None
    for i, layer in enumerate(m.layers):
        a, mlp = layer.self_attn, layer.mlp
        p = f"layers.{i}."
        yield p + "attn_norm", layer.input_layernorm.weight, None
        yield p + "mlp_norm", layer.post_attention_layernorm.weight, None
        qkv = a.qkv_proj.weight
        yield p + "q", qkv[:qd], None
        yield p + "k", qkv[qd:qd + kvd], None
        yield p + "v", qkv[qd + kvd:], None
        yield p + "o", a.o_proj.weight, None
        gate_up = mlp.gate_up_proj.weight
        yield p + "gate", gate_up[:c.intermediate_size], None
        yield p + "up", gate_up[c.intermediate_size:], None
        yield p + "down", mlp.down_proj.weight, None
