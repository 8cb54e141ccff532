"""A model's configuration without transformers: from a config.json, or from a GGUF file's metadata.

Transformers' config classes import torch (through modeling_rope_utils), so this module rebuilds what
the families read from them: `ModelConfig` is a plain attribute object, and `config_from_json` applies the
defaults and standardization transformers (5.x) applies for each supported `model_type` -- the class's field
defaults, its `__post_init__` (derived head_dim, num_key_value_heads, layer_types, Qwen's
use_sliding_window, ...) and the RoPE standardization of modeling_rope_utils (rope_theta and rope_scaling
folded into `rope_parameters`, per layer type for Gemma 3). Extra config.json keys stay attributes, as
they do on a transformers config.

`config_from_gguf` maps llama.cpp's metadata keys to such a config.json dict and builds it the same way,
requiring every key that defines the model's shape: a file that lacks one fails naming it, instead of
getting a default that describes some other model.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kwker.loading.gguf_file import GGML_TYPES, GgufFile


class ConfigError(ValueError):
    """A configuration this loader cannot build a model from; the message says which key and why."""


class ModelConfig:
    """A model's configuration as plain attributes (the names transformers' config classes use)."""

    def __init__(self, attributes: dict):
        self.__dict__.update(copy.deepcopy(attributes))

    @property
    def rope_scaling(self):  # transformers' deprecated alias, which older code still reads
        return self.rope_parameters

    def get_text_config(self, *args, **kwargs) -> ModelConfig:
        return self  # every config here is a text model's

    def to_dict(self) -> dict:
        """The attributes as a config.json holds them (config_from_json builds this config from it)."""
        out = copy.deepcopy(self.__dict__)
        if out.get("model_type") == "gemma3_text" and out.get("use_bidirectional_attention"):
            # undo the exclusive bound Gemma3TextConfig sets at init, as its to_dict does
            out["sliding_window"] = (out["sliding_window"] - 1) * 2
        return out

    def to_json_string(self, use_diff: bool = False) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def __eq__(self, other) -> bool:
        return isinstance(other, ModelConfig) and self.__dict__ == other.__dict__

    def __repr__(self) -> str:
        return f"ModelConfig({self.to_json_string()})"


# ---- config.json -----------------------------------------------------------------------------------

# Keys transformers' base config pops rather than keeps (generation settings belong to
# generation_config.json; the rest are loader bookkeeping).
_DROPPED = {
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
_BASE_FIELDS = {"transformers_version": None, "architectures": None, "dtype": None}
_LEGACY_LAYER_TYPES = {"attention": "full_attention", "mamba": "linear_attention"}
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
    """modeling_rope_utils' standardize_rope_params: rope_type in every dict, and the pretraining length
    in the scaled ones (from the config's own `original_max_position_embeddings` field where the class has
    one -- Phi-3 -- else max_position_embeddings)."""
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
    """PreTrainedConfig.convert_rope_params_to_dict: rope_scaling wins over rope_parameters; rope_theta
    and partial_rotary_factor move in (into each per-layer-type dict when nested)."""
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
    """Phi3Config's variant: partial_rotary_factor (1.0 unless given) goes into rope_parameters but also
    stays an attribute, and the old names of longrope ("su", "yarn") become "longrope"."""
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
        rope["full_attention"].update(scaling)
    if rope.get("full_attention") is None:
        rope["full_attention"] = {"rope_type": "default"}
    rope["full_attention"].setdefault("rope_theta", kw.pop("rope_theta", 1_000_000.0))
    if rope.get("sliding_attention") is None:
        rope["sliding_attention"] = {"rope_type": "default"}
    rope["sliding_attention"].setdefault("rope_theta", kw.pop("rope_local_base_freq", 10_000.0))
    a["rope_parameters"] = rope
    _standardize_rope(a, pretraining_length_field=False)


@dataclass(frozen=True)
class _ModelType:
    fields: dict  # the config class's own fields and their defaults
    post_init: Callable[[dict, dict], None]
    rope: Callable[[dict, dict], None]
    heads_divide_hidden: bool = False  # the class refuses hidden_size % num_attention_heads != 0


MODEL_TYPES: dict[str, _ModelType] = {
    "llama": _ModelType(_LLAMA_FIELDS, _llama_post_init, _rope_common, heads_divide_hidden=True),
    "mistral": _ModelType(_MISTRAL_FIELDS, _llama_post_init, _rope_common),
    "qwen2": _ModelType(_QWEN2_FIELDS, _qwen_post_init, _rope_common),
    "qwen3": _ModelType(_QWEN3_FIELDS, _qwen_post_init, _rope_common),
    "phi3": _ModelType(_PHI3_FIELDS, _default_heads, _rope_phi3),
    "gemma3_text": _ModelType(
        _GEMMA3_TEXT_FIELDS, _gemma3_post_init, _rope_gemma3, heads_divide_hidden=True
    ),
}


def config_from_json(config: dict) -> ModelConfig:
    """The ModelConfig of a config.json's contents (model types llama, mistral, qwen2, qwen3, phi3,
    gemma3_text, and gemma3, whose text_config is the model)."""
    model_type = config.get("model_type")
    if model_type == "gemma3":  # the multimodal wrapper: the language model is its text config
        config = {**(config.get("text_config") or {}), "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    spec = MODEL_TYPES.get(model_type)
    if spec is None:
        raise ConfigError(
            f"model type {model_type!r} is not supported (supported: {', '.join(sorted(MODEL_TYPES))}, gemma3)"
        )
    config = copy.deepcopy(config)
    fields = {**_BASE_FIELDS, **spec.fields}
    attributes = {name: config.pop(name, default) for name, default in fields.items()}
    extra = {k: v for k, v in config.items() if k not in _DROPPED}
    torch_dtype = extra.pop("torch_dtype", None)  # dtype's old name, taken when dtype is absent
    if attributes["dtype"] is None:
        attributes["dtype"] = torch_dtype
    _check_sizes(attributes, model_type)  # before anything divides by them
    spec.post_init(attributes, extra)
    spec.rope(attributes, extra)
    if attributes.get("layer_types") is not None:
        attributes["layer_types"] = [
            _LEGACY_LAYER_TYPES.get(t, t) for t in attributes["layer_types"]
        ]
    attributes.update(extra)
    attributes["model_type"] = model_type
    _validate(attributes, spec)
    return ModelConfig(attributes)


def _check_sizes(a: dict, model_type: str) -> None:
    for name in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size"):
        value = a[name]
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ConfigError(f"{model_type} config: {name} is {value!r}, not a positive integer")


def _validate(a: dict, spec: _ModelType) -> None:
    """The checks of transformers' strict config classes that a model would otherwise fail later."""
    if spec.heads_divide_hidden and a["hidden_size"] % a["num_attention_heads"]:
        raise ConfigError(
            f"{a['model_type']} config: hidden_size {a['hidden_size']} is not a multiple of "
            f"num_attention_heads {a['num_attention_heads']}"
        )
    types = a.get("layer_types")
    if types is not None and len(types) != a["num_hidden_layers"]:
        raise ConfigError(
            f"{a['model_type']} config: layer_types has {len(types)} entries for "
            f"{a['num_hidden_layers']} layers"
        )


# ---- GGUF ------------------------------------------------------------------------------------------

GGUF_MODEL_TYPES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_REQUIRED = object()
_ROPE_FREQS = "rope_freqs.weight"
# llama.cpp's convert_hf_to_gguf.py writes Llama 3's scaling as rope_freqs.weight computed with the
# pretraining length of hparams["original_max_position_embeddings"], 8192 when absent
_NEUTRAL_YARN_KEYS = {
    "attn_factor": (1.0,),
    "yarn_attn_factor": (1.0,),
    "yarn_ext_factor": (-1.0, 1.0),  # -1: llama.cpp's "derive it", which gives 1 for yarn
    "yarn_log_multiplier": (0.0,),
}


class _Metadata:
    """A GGUF's metadata under one architecture's prefix, with errors that name the missing key."""

    def __init__(self, gguf: GgufFile, arch: str):
        self.gguf, self.arch, self.meta = gguf, arch, gguf.metadata

    def error(self, message: str) -> ConfigError:
        return ConfigError(f"{self.gguf.path}: {message}")

    def get(self, name: str, default=_REQUIRED, *, uniform: bool = True):
        key = f"{self.arch}.{name}"
        if key not in self.meta:
            if default is _REQUIRED:
                raise self.error(f"the metadata has no {key}, which a {self.arch} model needs")
            return default
        value = self.meta[key]
        # llama.cpp allows some counts per layer (an array); a model with layers of different shapes
        # is not one the families run
        if uniform and isinstance(value, list):
            if not value or any(v != value[0] for v in value):
                raise self.error(f"{key} differs between layers ({value}), which is not supported")
            value = value[0]
        return value


def config_from_gguf(gguf: GgufFile) -> ModelConfig:
    """The ModelConfig of a GGUF file (architectures llama, qwen2, qwen3, gemma3): llama.cpp's keys
    mapped to transformers' names, then built as config_from_json builds a config.json."""
    arch = gguf.metadata.get("general.architecture")
    if arch is None:
        raise ConfigError(f"{gguf.path}: the metadata has no general.architecture")
    if arch not in GGUF_MODEL_TYPES:
        raise ConfigError(
            f"{gguf.path}: GGUF architecture {arch!r} is not supported "
            f"(supported: {', '.join(GGUF_MODEL_TYPES)})"
        )
    m = _Metadata(gguf, arch)
    if m.get("expert_count", 0):
        raise ConfigError(f"{gguf.path}: a mixture-of-experts {arch} model is not supported")
    model_type = GGUF_MODEL_TYPES[arch]
    # llama.cpp runs Mistral's checkpoints as llama; transformers tells them apart by name
    if arch == "llama" and "mistral" in str(gguf.metadata.get("general.name", "")).lower():
        model_type = "mistral"

    heads = m.get("attention.head_count")
    hidden = m.get("embedding_length")
    if not isinstance(heads, int) or heads <= 0:
        raise m.error(f"{arch}.attention.head_count is {heads!r}, not a positive integer")
    head_dim = m.get("attention.key_length", None)
    if head_dim is None:
        # llama/mistral: transformers takes the head size from the rotary width, as llama.cpp does
        head_dim = m.get("rope.dimension_count", None) if arch == "llama" else None
    if head_dim is None:
        head_dim = hidden // heads  # llama.cpp's default for n_embd_head_k
    config = {
        "model_type": model_type,
        "vocab_size": _vocab_size(gguf, m),
        "hidden_size": hidden,
        "intermediate_size": m.get("feed_forward_length"),
        "num_hidden_layers": m.get("block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": m.get("attention.head_count_kv", heads),
        "rms_norm_eps": m.get("attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": m.get("context_length"),
        "rope_theta": m.get("rope.freq_base"),
        # llama.cpp writes the output projection only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        # ids the file does not state stay None rather than taking a config class's defaults
        "bos_token_id": gguf.metadata.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": gguf.metadata.get("tokenizer.ggml.eos_token_id"),
        "pad_token_id": gguf.metadata.get("tokenizer.ggml.padding_token_id"),
    }
    if "tokenizer.ggml.unknown_token_id" in gguf.metadata:
        config["unk_token_id"] = gguf.metadata["tokenizer.ggml.unknown_token_id"]
    if model_type != "qwen2" or head_dim != hidden // heads:  # Qwen2Config has no head_dim field
        config["head_dim"] = head_dim
    rotary = m.get("rope.dimension_count", head_dim)
    if rotary != head_dim:
        config["partial_rotary_factor"] = rotary / head_dim
    biases = _biases(gguf)
    window = m.get("attention.sliding_window", None)
    if model_type == "llama":
        config["attention_bias"] = biases["attn"]
        config["mlp_bias"] = biases["ffn"]
        if window is not None:
            config["sliding_window"] = window
    elif model_type == "mistral":
        # llama.cpp applies no window to a llama-architecture file that states none, where
        # MistralConfig would default to 4096
        config["sliding_window"] = window
    elif model_type == "qwen3":
        config["attention_bias"] = biases["attn"]
    elif model_type == "gemma3_text":
        config.update(_gemma3_keys(m, config))
    scaling = _rope_scaling(gguf, m, config)
    if scaling is not None:
        config["rope_scaling"] = scaling
    return config_from_json(config)


def _vocab_size(gguf: GgufFile, m: _Metadata) -> int:
    vocab = m.get("vocab_size", None)
    if vocab is None:
        tokens = gguf.metadata.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise m.error(f"the metadata has neither {m.arch}.vocab_size nor tokenizer.ggml.tokens")
        vocab = len(tokens)
    embed = gguf.tensors.get("token_embd.weight")
    if embed is not None and embed.shape[0] != vocab:
        raise m.error(f"token_embd.weight has {embed.shape[0]} rows for a vocabulary of {vocab}")
    return vocab


def _biases(gguf: GgufFile) -> dict[str, bool]:
    """Which layer matrices carry biases, from the tensor names (blk.N.attn_q.bias, blk.N.ffn_up.bias)."""
    leaves = {
        name.split(".")[2]
        for name in gguf.tensors
        if name.startswith("blk.") and name.endswith(".bias")
    }
    return {
        "attn": any(leaf.startswith("attn_") for leaf in leaves),
        "ffn": any(leaf.startswith("ffn_") for leaf in leaves),
    }


def _gemma3_keys(m: _Metadata, config: dict) -> dict:
    layers = config["num_hidden_layers"]
    out = {"sliding_window": m.get("attention.sliding_window")}
    pattern = m.get("attention.sliding_window_pattern", None, uniform=False)
    if isinstance(pattern, list):  # per layer, True where the layer is windowed
        if len(pattern) != layers:
            raise m.error(
                f"{m.arch}.attention.sliding_window_pattern has {len(pattern)} entries for {layers} layers"
            )
        out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    elif pattern is not None:
        out["sliding_window_pattern"] = pattern
    if (local_base := m.get("rope.freq_base_swa", None)) is not None:
        out["rope_local_base_freq"] = local_base
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if (value := m.get(cap, None)) is not None:
            out[cap] = value
    # The attention scale: stated by newer files; else llama.cpp's rule for Gemma 3 -- 1/sqrt(head size),
    # except the 27B (62 layers), which scales by 1/sqrt(hidden / heads)
    scale = m.get("attention.scale", None)
    if scale is not None:
        scalar = 1.0 / (scale * scale)
        out["query_pre_attn_scalar"] = (
            round(scalar) if abs(scalar - round(scalar)) < 1e-3 else scalar
        )
    elif layers == 62:
        out["query_pre_attn_scalar"] = config["hidden_size"] // config["num_attention_heads"]
    else:
        out["query_pre_attn_scalar"] = config["head_dim"]
    return out


def _rope_scaling(gguf: GgufFile, m: _Metadata, config: dict) -> dict | None:
    """The rope scaling the file states, in config.json's terms; None for plain RoPE."""
    kind = m.get("rope.scaling.type", None)
    factor = m.get("rope.scaling.factor", None)
    if (
        kind is None and m.get("rope.scale_linear", None) is not None
    ):  # the key before rope.scaling.*
        kind, factor = "linear", m.get("rope.scale_linear")
    freqs = gguf.tensors.get(_ROPE_FREQS)
    if freqs is not None:
        if kind not in (None, "none"):
            raise m.error(f"{_ROPE_FREQS} and {m.arch}.rope.scaling.type {kind!r} both scale RoPE")
        return _freq_factors(gguf, m, config)
    if kind in (None, "none"):
        return None
    if factor is None:
        raise m.error(
            f"{m.arch}.rope.scaling.type is {kind!r} but {m.arch}.rope.scaling.factor is missing"
        )
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        # llama.cpp's own yarn knobs change the formula in ways transformers' yarn parameters do not
        # express one to one: only their neutral values can be taken
        for name, neutral in _NEUTRAL_YARN_KEYS.items():
            value = m.get(f"rope.scaling.{name}", None)
            if value is not None and value not in neutral:
                raise m.error(f"{m.arch}.rope.scaling.{name} = {value} is not supported")
        out = {"rope_type": "yarn", "factor": factor}
        if (original := m.get("rope.scaling.original_context_length", None)) is not None:
            out["original_max_position_embeddings"] = original
        for gguf_name, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := m.get(f"rope.scaling.{gguf_name}", None)) is not None:
                out[name] = value
        return out
    raise m.error(
        f"{m.arch}.rope.scaling.type {kind!r} is not supported (supported: none, linear, yarn)"
    )


def _freq_factors(gguf: GgufFile, m: _Metadata, config: dict) -> dict | None:
    """The per-frequency divisors llama.cpp stores in rope_freqs.weight (Llama 3's scaling, written
    out by its converter), as rope type "freq_factors": RoPE's inverse frequencies divided by them,
    as llama.cpp divides. Transformers' GGUF loader ignores the tensor (so Llama 3.x files load
    with unscaled RoPE there); the file's own factors are what the model was converted with."""
    info = gguf.tensors[_ROPE_FREQS]
    head_dim = config["head_dim"]
    rotary = round(config.get("partial_rotary_factor", 1.0) * head_dim)
    if info.ggml_type not in (0, 1) or info.shape != (rotary // 2,):
        raise m.error(
            f"{_ROPE_FREQS} is {GGML_TYPES[info.ggml_type].name} of shape {info.shape}, not F32/F16 "
            f"[{rotary // 2}]"
        )
    dtype = "<f4" if info.ggml_type == 0 else "<f2"
    stored = np.fromfile(gguf.path, dtype, rotary // 2, offset=info.offset).astype(np.float32)
    if not np.all(np.isfinite(stored)) or np.any(stored <= 0):
        raise m.error(f"{_ROPE_FREQS} holds factors that are not positive and finite")
    if np.all(stored == 1.0):
        return None
    return {"rope_type": "freq_factors", "freq_factors": [float(x) for x in stored]}
