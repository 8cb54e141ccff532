"""The config classes of the supported model types as transformers (5.x) defines them: each
class's field defaults, its `__post_init__` (derived head_dim, num_key_value_heads, layer_types,
Qwen's use_sliding_window, ...) and the RoPE standardization of modeling_rope_utils (rope_theta and
rope_scaling folded into `rope_parameters`, per layer type for Gemma 3).

kwker.loading.config_json applies them to a config.json's keys.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Keys transformers' base config pops rather than keeps (generation settings belong to
# generation_config.json; the rest are loader bookkeeping).
DROPPED = {
    "assistant_confidence_threshold",
    "assistant_lookbehind",
    "bad_words_ids",
    "begin_suppress_tokens",
    "diversity_penalty",
    "do_sample",
    "early_stopping",
    "encoder_no_repeat_ngram_size",
    "encoder_repetition_penalty",
    "epsilon_cutoff",
    "eta_cutoff",
    "exponential_decay_length_penalty",
    "forced_bos_token_id",
    "forced_eos_token_id",
    "length_penalty",
    "max_length",
    "min_length",
    "no_repeat_ngram_size",
    "num_assistant_tokens",
    "num_assistant_tokens_schedule",
    "num_beam_groups",
    "num_beams",
    "num_return_sequences",
    "output_scores",
    "remove_invalid_values",
    "repetition_penalty",
    "return_dict_in_generate",
    "suppress_tokens",
    "target_lookbehind",
    "temperature",
    "top_k",
    "top_p",
    "typical_p",
    "name_or_path",
    "_name_or_path",
    "_commit_hash",
    "output_attentions",
    "attn_implementation",
    "experts_implementation",
    "per_layer_config",
    "_attn_implementation_internal",
    "_experts_implementation_internal",
}
# PreTrainedConfig's own fields that describe the checkpoint (its classification-head and output
# switches are left out: nothing here builds those); dtype stays the string config.json spells
BASE_FIELDS = {"transformers_version": None, "architectures": None, "dtype": None}
LEGACY_LAYER_TYPES = {"attention": "full_attention", "mamba": "linear_attention"}
_SCALED_ROPE_TYPES = ("llama3", "yarn", "longrope")  # the types that carry their pretraining length

_LLAMA_FIELDS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "hidden_act": "silu",
    "max_position_embeddings": 2048,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "use_cache": True,
    "pad_token_id": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pretraining_tp": 1,
    "tie_word_embeddings": False,
    "rope_parameters": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "mlp_bias": False,
    "head_dim": None,
}
_MISTRAL_FIELDS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": None,
    "hidden_act": "silu",
    "max_position_embeddings": 4096 * 32,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "use_cache": True,
    "pad_token_id": None,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "tie_word_embeddings": False,
    "rope_parameters": None,
    "sliding_window": 4096,
    "attention_dropout": 0.0,
}
_QWEN2_FIELDS = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "use_cache": True,
    "tie_word_embeddings": False,
    "rope_parameters": None,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "max_window_layers": 28,
    "layer_types": None,
    "attention_dropout": 0.0,
    "pad_token_id": None,
    "bos_token_id": None,
    "eos_token_id": None,
}
_QWEN3_FIELDS = {**_QWEN2_FIELDS, "head_dim": 128, "attention_bias": False}
_PHI3_FIELDS = {
    "vocab_size": 32064,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": None,
    "resid_pdrop": 0.0,
    "embd_pdrop": 0.0,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "original_max_position_embeddings": 4096,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-5,
    "use_cache": True,
    "tie_word_embeddings": False,
    "rope_parameters": None,
    "bos_token_id": 1,
    "eos_token_id": 32000,
    "pad_token_id": 32000,
    "sliding_window": None,
}
_GEMMA3_TEXT_FIELDS = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "initializer_range": 0.02,
    "rms_norm_eps": 1e-6,
    "use_cache": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "tie_word_embeddings": True,
    "rope_parameters": None,
    "attention_bias": False,
    "attention_dropout": 0.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "layer_types": None,
    "final_logit_softcapping": None,
    "attn_logit_softcapping": None,
    "use_bidirectional_attention": False,
}


def _default_heads(a: dict, kw: dict) -> None:
    if a["num_key_value_heads"] is None:
        a["num_key_value_heads"] = a["num_attention_heads"]


def _llama_post_init(a: dict, kw: dict) -> None:
    if a["head_dim"] is None:
        a["head_dim"] = a["hidden_size"] // a["num_attention_heads"]
    _default_heads(a, kw)


def _qwen_post_init(a: dict, kw: dict) -> None:
    a["sliding_window"] = a["sliding_window"] if a["use_sliding_window"] else None
    _default_heads(a, kw)
    if a["layer_types"] is None:
        a["layer_types"] = [
            "sliding_attention"
            if a["sliding_window"] is not None and i >= a["max_window_layers"]
            else "full_attention"
            for i in range(a["num_hidden_layers"])
        ]


def _gemma3_post_init(a: dict, kw: dict) -> None:
    if a["use_bidirectional_attention"]:
        a["sliding_window"] = a["sliding_window"] // 2 + 1  # transformers' exclusive bound
    a["_sliding_window_pattern"] = pattern = kw.get("sliding_window_pattern", 6)
    if a["layer_types"] is None:
        a["layer_types"] = [
            "sliding_attention" if (i + 1) % pattern else "full_attention"
            for i in range(a["num_hidden_layers"])
        ]


def _nested_rope_keys(a: dict, rope: dict) -> list[str]:
    """The layer types `rope` holds one dict per (only types the config declares count)."""
    labels = a.get("layer_types") or ()
    return [key for key in rope if key in labels]


def _standardize_rope(a: dict, pretraining_length_field: bool) -> None:
    """modeling_rope_utils' standardize_rope_params: rope_type in every dict, and the pretraining
    length in the scaled ones (from the config's own `original_max_position_embeddings` field where
    the class has one -- Phi-3 -- else max_position_embeddings)."""
    rope = a.get("rope_parameters") or {}
    if not rope:
        return
    nested = _nested_rope_keys(a, rope)
    for params in [rope[k] for k in nested] if nested else [rope]:
        if params is None:
            continue
        params.setdefault("rope_type", params.get("type", "default"))
        params.setdefault("rope_theta", None)
        if params["rope_type"] in _SCALED_ROPE_TYPES:
            if pretraining_length_field and not nested:
                params["original_max_position_embeddings"] = a["original_max_position_embeddings"]
            else:
                params.setdefault("original_max_position_embeddings", a["max_position_embeddings"])
    a["rope_parameters"] = rope


def _rope_common(a: dict, kw: dict) -> None:
    """PreTrainedConfig.convert_rope_params_to_dict: rope_scaling wins over rope_parameters;
    rope_theta and partial_rotary_factor move in (into each per-layer-type dict when nested)."""
    rope = kw.pop("rope_scaling", None) or a["rope_parameters"]
    rope = rope if rope is not None else {}
    theta = kw.pop("rope_theta", 10_000.0)
    partial = kw.pop("partial_rotary_factor", None)
    nested = _nested_rope_keys(a, rope)
    for params in [rope[k] for k in nested] if nested else [rope]:
        if params is None:
            continue
        params.setdefault("rope_theta", theta)
        if partial is not None:
            params.setdefault("partial_rotary_factor", partial)
    a["rope_parameters"] = rope
    _standardize_rope(a, pretraining_length_field=False)


def _rope_phi3(a: dict, kw: dict) -> None:
    """Phi3Config's variant: partial_rotary_factor (1.0 unless given) goes into rope_parameters but
    also stays an attribute, and the old names of longrope ("su", "yarn") become "longrope"."""
    rope = kw.pop("rope_scaling", None) or a["rope_parameters"]
    rope = rope if rope is not None else {}
    rope.setdefault("rope_theta", kw.pop("rope_theta", 10_000.0))
    rope.setdefault("partial_rotary_factor", kw.get("partial_rotary_factor", 1.0))
    a["rope_parameters"] = rope
    _standardize_rope(a, pretraining_length_field=True)
    if rope.get("rope_type") in ("su", "yarn"):
        rope["rope_type"] = "longrope"


def _rope_gemma3(a: dict, kw: dict) -> None:
    """Gemma3TextConfig's variant: one dict per layer type; rope_scaling and rope_theta apply to the
    full-attention layers, rope_local_base_freq is the sliding layers' base."""
    scaling = kw.pop("rope_scaling", None)
    rope = a["rope_parameters"]
    if rope is None:
        rope = {
            "sliding_attention": {"rope_type": "default"},
            "full_attention": {"rope_type": "default"},
        }
    if scaling is not None:
        rope["full_attention"] = {
            **(rope.get("full_attention") or {"rope_type": "default"}),
            **scaling,
        }
    if rope.get("full_attention") is None:
        rope["full_attention"] = {"rope_type": "default"}
    rope["full_attention"].setdefault("rope_theta", kw.pop("rope_theta", 1_000_000.0))
    if rope.get("sliding_attention") is None:
        rope["sliding_attention"] = {"rope_type": "default"}
    rope["sliding_attention"].setdefault("rope_theta", kw.pop("rope_local_base_freq", 10_000.0))
    a["rope_parameters"] = rope
    _standardize_rope(a, pretraining_length_field=False)


@dataclass(frozen=True)
class ModelType:
    fields: dict  # the config class's own fields and their defaults
    post_init: Callable[[dict, dict], None]
    rope: Callable[[dict, dict], None]
    heads_divide_hidden: bool = False  # the class refuses hidden_size % num_attention_heads != 0


MODEL_TYPES: dict[str, ModelType] = {
    "llama": ModelType(_LLAMA_FIELDS, _llama_post_init, _rope_common, heads_divide_hidden=True),
    "mistral": ModelType(_MISTRAL_FIELDS, _llama_post_init, _rope_common),
    "qwen2": ModelType(_QWEN2_FIELDS, _qwen_post_init, _rope_common),
    "qwen3": ModelType(_QWEN3_FIELDS, _qwen_post_init, _rope_common),
    "phi3": ModelType(_PHI3_FIELDS, _default_heads, _rope_phi3),
    "gemma3_text": ModelType(
        _GEMMA3_TEXT_FIELDS, _gemma3_post_init, _rope_gemma3, heads_divide_hidden=True
    ),
}
