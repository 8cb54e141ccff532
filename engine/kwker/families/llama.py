"""LlamaForCausalLM: SmolLM/SmolLM2, TinyLlama, Llama 2/3.x (GQA, tied or untied embeddings, optional
attention/MLP bias, the static rope scaling types transformers uses for them)."""

from __future__ import annotations

import numpy as np
import torch

from kwker import rope

# Rope types whose tables do not change with the sequence length, so they can be computed once at load.
STATIC_ROPE_TYPES = {"default", "linear", "llama3", "yarn"}
MAX_HEAD_DIM = 512
DTYPES = {torch.float32, torch.bfloat16, torch.float16}


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_windows(config) -> list[int]:
    """Per layer, how many trailing positions it attends to (0: all). Configs with `layer_types` (Qwen2/3,
    Gemma 3) window their "sliding_attention" layers; others (Mistral, Phi-3) window every layer when they set
    `sliding_window`."""
    window = getattr(config, "sliding_window", None) or 0
    types = getattr(config, "layer_types", None)
    if types is not None:
        return [window if t == "sliding_attention" else 0 for t in types]
    return [window] * config.num_hidden_layers


def rope_unsupported(params: dict, max_cache_len: int) -> str | None:
    """Why a rope configuration can't be tabulated once at load (None when it can)."""
    kind = params.get("rope_type", params.get("type", "default"))
    if (
        kind == "longrope"
    ):  # transformers switches every position to the long factors past the original length
        original = params.get("original_max_position_embeddings")
        if original is None or max_cache_len > original:
            return (
                f"longrope with max_cache_len {max_cache_len} longer than original_max_position_embeddings "
                f"{original} is not supported (its factors change with the text's length)"
            )
        return None
    if kind not in STATIC_ROPE_TYPES:
        return f"rope type {kind!r} is not supported (supported: {', '.join(sorted(STATIC_ROPE_TYPES | {'longrope'}))})"
    return None


def shape_unsupported(model, max_cache_len: int) -> str | None:
    """The checks every family shares: a causal LM with a head, head sizes, cache length, weight dtype."""
    c = model.config
    if not hasattr(model, "model") or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} is not a causal LM with a language-model head"
    hd = head_dim(c)
    if hd % 2 or hd > MAX_HEAD_DIM:
        return f"head_dim {hd} is not supported (even, at most {MAX_HEAD_DIM})"
    if c.num_attention_heads % c.num_key_value_heads:
        return "num_attention_heads is not a multiple of num_key_value_heads"
    if max_cache_len > c.max_position_embeddings:
        return (
            f"max_cache_len {max_cache_len} is longer than the model's max_position_embeddings "
            f"{c.max_position_embeddings}"
        )
    dtype = model.model.embed_tokens.weight.dtype
    if dtype not in DTYPES:
        return f"weights of dtype {dtype} are not supported (float32, bfloat16, float16)"
    return None


def unsupported(model, max_cache_len: int) -> str | None:
    c = model.config
    if getattr(c, "hidden_act", "silu") != "silu":
        return f"activation {c.hidden_act!r} is not supported (supported: silu)"
    params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    if getattr(c, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1 is not supported"
    return shape_unsupported(model, max_cache_len) or rope_unsupported(params, max_cache_len)


def tied(model) -> bool:
    return model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


def native_config(model) -> dict:
    c = model.config
    hd = head_dim(c)
    return dict(
        n_layer=c.num_hidden_layers,
        n_embd=c.hidden_size,
        n_head=c.num_attention_heads,
        n_kv_head=c.num_key_value_heads,
        head_dim=hd,
        n_ff=c.intermediate_size,
        vocab=c.vocab_size,
        norm_eps=float(c.rms_norm_eps),
        attn_scale=float(hd**-0.5),
        tied_embeddings=tied(model),
        layer_window=layer_windows(c),
    )


# Model types whose "default" rope rotates int(head_dim * partial_rotary_factor) dims, as their
# transformers rotary embedding computes it (Llama's, Qwen's and Mistral's rotate the whole head)
PARTIAL_DEFAULT_ROPE = {"phi3"}


def config_rope_table(config, params: dict, max_cache_len: int) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin float32 [max_cache_len, rope_dim / 2] of one rope_parameters dict of `config`, the
    rotated dims as the model's transformers rotary embedding picks them."""
    kind = params.get("rope_type", params.get("type", "default"))
    factor = 1.0
    if kind != "default" or getattr(config, "model_type", None) in PARTIAL_DEFAULT_ROPE:
        # standardized configs carry it in rope_parameters; the config attribute is its source
        factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", None))
    return rope.rope_table(
        params,
        head_dim(config),
        max_cache_len,
        partial_rotary_factor=factor or 1.0,
        max_position_embeddings=getattr(config, "max_position_embeddings", None),
    )


def rope_tables(config, max_cache_len: int) -> tuple[np.ndarray, np.ndarray]:
    """One table for every layer: cos, sin float32 [1, max_cache_len, rope_dim / 2]."""
    params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    cos, sin = config_rope_table(config, params, max_cache_len)
    return cos[None], sin[None]


def _bias(linear):
    return None if linear.bias is None else linear.bias.detach().float()


def layer_matrices(model, layer):
    """(name, weight, bias) of a layer's seven matrices, for the Llama layout."""
    a, mlp = layer.self_attn, layer.mlp
    for name, lin in (
        ("q", a.q_proj),
        ("k", a.k_proj),
        ("v", a.v_proj),
        ("o", a.o_proj),
        ("gate", mlp.gate_proj),
        ("up", mlp.up_proj),
        ("down", mlp.down_proj),
    ):
        yield name, lin.weight, _bias(lin)


def layer_norms(layer):
    """(name, norm module) of a layer's norms, for the Llama layout."""
    yield "attn_norm", layer.input_layernorm
    yield "mlp_norm", layer.post_attention_layernorm


def norm_weight(module):
    return module.weight


def weights(model, matrices=layer_matrices, norms=layer_norms, norm_weight=norm_weight):
    """Embedding, lm_head (untied), the final norm, and per layer `norms(layer)` and `matrices(model, layer)`; a
    norm module's weight as the native step takes it is `norm_weight(module)`."""
    m = model.model
    yield "embed", m.embed_tokens.weight, None
    if not tied(model):
        yield "lm_head", model.lm_head.weight, None
    yield "norm", norm_weight(m.norm), None
    for i, layer in enumerate(m.layers):
        p = f"layers.{i}."
        for name, module in norms(layer):
            yield p + name, norm_weight(module), None
        for name, w, bias in matrices(model, layer):
            yield p + name, w, bias
