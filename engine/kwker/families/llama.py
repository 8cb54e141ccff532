"""LlamaForCausalLM: SmolLM/SmolLM2, TinyLlama, Llama 2/3.x (GQA, tied or untied embeddings,
optional attention/MLP bias, the static rope scaling types transformers uses for them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kwker import rope

# Rope types whose tables do not change with the sequence length, so they can be computed once at
# load. (freq_factors: the per-frequency divisors a GGUF stores, see kwker.loading.config)
STATIC_ROPE_TYPES = {"default", "linear", "llama3", "yarn", "freq_factors"}
MAX_HEAD_DIM = 512


def head_dim(config) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def layer_windows(config) -> list[int]:
    """Per layer, how many trailing positions it attends to (0: all). Configs with `layer_types`
    (Qwen2/3, Gemma 3) window their "sliding_attention" layers; others (Mistral, Phi-3) window every
    layer when they set `sliding_window`."""
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


def shape_unsupported(c, max_cache_len: int) -> str | None:
    """The checks every family shares, on the config: head sizes, cache length."""
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
    return None


def unsupported(c, max_cache_len: int) -> str | None:
    """Why the native step cannot run a model of config `c` (None when it can)."""
    if getattr(c, "hidden_act", "silu") != "silu":
        return f"activation {c.hidden_act!r} is not supported (supported: silu)"
    params = getattr(c, "rope_parameters", None) or getattr(c, "rope_scaling", None) or {}
    if getattr(c, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1 is not supported"
    return shape_unsupported(c, max_cache_len) or rope_unsupported(params, max_cache_len)


def native_config(c, tied: bool, embed_dtype: str) -> dict:
    """The native step's configuration; tied: lm_head is the embedding; embed_dtype: the storage
    type of the embedding (ggml names: F32, BF16, Q4_K, ...), which Gemma's embedding scale
    follows."""
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
        tied_embeddings=tied,
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


@dataclass(frozen=True)
class WeightSpec:
    """A weight of the native step and the tensor it comes from (a Hugging Face state-dict name)."""

    native: str  # embed, lm_head, norm, layers.<i>.<q|k|...|attn_norm|...>
    source: str
    kind: str = "matrix"  # or "norm"
    bias: str | None = None  # the source's bias tensor, when the model has one
    rows: tuple[int, int] | None = None  # the rows of a fused source matrix that are this one


def layer_matrices(c, i: int):
    """The seven matrices of layer i, for the Llama layout (biases as the config says)."""
    p = f"model.layers.{i}."
    attn_bias, mlp_bias = getattr(c, "attention_bias", False), getattr(c, "mlp_bias", False)
    for name, module, bias in (
        ("q", "self_attn.q_proj", attn_bias),
        ("k", "self_attn.k_proj", attn_bias),
        ("v", "self_attn.v_proj", attn_bias),
        ("o", "self_attn.o_proj", attn_bias),
        ("gate", "mlp.gate_proj", mlp_bias),
        ("up", "mlp.up_proj", mlp_bias),
        ("down", "mlp.down_proj", mlp_bias),
    ):
        yield WeightSpec(f"layers.{i}.{name}", p + module + ".weight",
                         bias=p + module + ".bias" if bias else None)  # fmt: skip


# (native name, Hugging Face module) of a layer's norms, for the Llama layout
LAYER_NORMS = (("attn_norm", "input_layernorm"), ("mlp_norm", "post_attention_layernorm"))


def norm_values(w):
    """A norm's weights as the native step multiplies by them (float32 [n])."""
    return w


def weights(c, tied: bool, matrices=layer_matrices, norms=LAYER_NORMS):
    """The step's weights: embedding, lm_head (untied), the final norm, and per layer its `norms`
    ((native, module) pairs) and `matrices(c, i)`."""
    yield WeightSpec("embed", "model.embed_tokens.weight")
    if not tied:
        yield WeightSpec("lm_head", "lm_head.weight")
    yield WeightSpec("norm", "model.norm.weight", "norm")
    for i in range(c.num_hidden_layers):
        for native, module in norms:
            yield WeightSpec(f"layers.{i}.{native}", f"model.layers.{i}.{module}.weight", "norm")
        yield from matrices(c, i)
