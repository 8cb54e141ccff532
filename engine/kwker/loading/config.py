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

Both check every field they read before anything is computed or sized from it (see "what a
config's fields may hold" below): a header that lies is a ConfigError (a BadModelFile) naming the
field, never a traceback or gigabytes of memory. kwker.loading.build then checks the sizes against
the tensors.
"""

from __future__ import annotations

import copy
import json
import math
import reprlib
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from kwker.loading.errors import BadModelFile
from kwker.loading.gguf_file import GGML_TYPES, GgufFile


class ConfigError(BadModelFile):
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


# ---- what a config's fields may hold -----------------------------------------------------------
#
# A config.json or a GGUF's metadata is the file's word on the model's sizes, and everything a load
# allocates is sized by it. So each field the loader reads is checked for its type and range before
# anything is computed from it: an int where an int is meant (not a bool, a float, a string or a
# list), a finite positive number where a rope base or a norm's epsilon is meant.

# The native step's limits (native/src/model/model.cpp: kMaxLayers, kMaxWidth, kMaxHeads,
# kMaxVocab). A config past them describes no model kwker can run; refusing it before the config
# is built also bounds what is sized by it (layer_types holds an entry per layer).
MAX_LAYERS, MAX_WIDTH, MAX_HEADS, MAX_VOCAB = 1024, 1 << 17, 1024, 1 << 24
MAX_INT32 = 2**31 - 1  # positions and token ids are int32 in the native step

_SHOWN = reprlib.Repr()  # a field's value as a message shows it: a lying one can be megabytes long
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlevel = 40, 40, 2


def _shown(value) -> str:
    return _SHOWN.repr(value)


def _count(value, what: str, limit: int = MAX_INT32, low: int = 1) -> int:
    """`value` when it is an integer in low..limit (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ConfigError(f"{what} is {_shown(value)}, not {kind}")
    if value > limit:
        raise ConfigError(f"{what} is {value}, more than the {limit} kwker's native step takes")
    return value


def _number(value, what: str, low: float = 0.0, high: float = math.inf, zero: bool = False):
    """`value` when it is a finite number in (low, high] ([low, high] with zero=True)."""
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok:
        try:
            x = float(value)
        except OverflowError:  # an integer past the float range
            ok = False
        else:
            ok = math.isfinite(x) and (low <= x if zero else low < x) and x <= high
    if not ok:
        bound = f"{'>=' if zero else '>'} {low:g}" + (
            f" and <= {high:g}" if high < math.inf else ""
        )
        raise ConfigError(f"{what} is {_shown(value)}, not a finite number {bound}")
    return value


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{what} is {_shown(value)}, not true or false")
    return value


def _text(value, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{what} is {_shown(value)}, not a string")
    return value


def _token_ids(value, what: str):
    """None, a token id or a non-empty list of them (eos_token_id may name several)."""
    ids = value if isinstance(value, list) and value else [value]
    if value is not None:
        for i in ids:
            _count(i, what, MAX_INT32, low=0)
    return value


# The count fields of the config classes, with the most the native step takes
_COUNTS = {
    "vocab_size": MAX_VOCAB,
    "hidden_size": MAX_WIDTH,
    "intermediate_size": MAX_WIDTH,
    "num_hidden_layers": MAX_LAYERS,
    "num_attention_heads": MAX_HEADS,
    "num_key_value_heads": MAX_HEADS,
    "head_dim": MAX_WIDTH,
    "max_position_embeddings": MAX_INT32,
}
_DERIVED = {"num_key_value_heads", "head_dim"}  # None: derived from the others in __post_init__
_FLAGS = (
    "tie_word_embeddings",
    "attention_bias",
    "mlp_bias",
    "use_sliding_window",
    "use_bidirectional_attention",
)
_POSITIVE = ("rms_norm_eps", "query_pre_attn_scalar")
_TOKEN_IDS = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id")
_TEXTS = ("hidden_act", "hidden_activation", "dtype", "torch_dtype")
LAYER_TYPES = ("full_attention", "sliding_attention")  # the attention the native step runs
# What each rope type's formula reads (kwker.rope) besides rope_theta
_ROPE_NEEDS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("original_max_position_embeddings",),
    "longrope": ("short_factor", "original_max_position_embeddings"),
    "freq_factors": ("freq_factors",),
}
_ROPE_POSITIVE = ("rope_theta", "factor", "low_freq_factor", "high_freq_factor",
                  "attention_factor", "beta_fast", "beta_slow")  # fmt: skip
_ROPE_LISTS = ("short_factor", "long_factor", "freq_factors")  # one factor per rotary frequency


def _check_fields(a: dict, kw: dict, model_type: str) -> None:
    """Every field of a config.json that the config's building or a family reads, checked before
    anything divides by it or is sized by it (a: the class's fields, kw: the other keys)."""
    where = f"{model_type} config"
    fields = {**kw, **a}
    for name, limit in _COUNTS.items():
        if name in fields and not (fields[name] is None and name in _DERIVED):
            _count(fields[name], f"{where}: {name}", limit)
    for name in _FLAGS:
        if name in fields:
            _flag(fields[name], f"{where}: {name}")
    for name in _POSITIVE:
        if name in fields:
            _number(fields[name], f"{where}: {name}")
    for name in _TOKEN_IDS:
        _token_ids(fields.get(name), f"{where}: {name}")
    for name in _TEXTS:
        _text(fields.get(name), f"{where}: {name}")
    if fields.get("sliding_window") is not None:  # None: no window
        _count(fields["sliding_window"], f"{where}: sliding_window", low=0)
    # which layers a window applies to: compared with each layer's index, so never None
    for name, low in (("max_window_layers", 0), ("sliding_window_pattern", 1)):
        if name in fields:
            _count(fields[name], f"{where}: {name}", low=low)
    if fields.get("use_bidirectional_attention") and fields.get("sliding_window") is None:
        raise ConfigError(f"{where}: use_bidirectional_attention needs a sliding_window")
    if fields.get("partial_rotary_factor") is not None:
        _number(fields["partial_rotary_factor"], f"{where}: partial_rotary_factor", high=1.0)
    types = fields.get("layer_types")
    if types is not None and (
        not isinstance(types, list) or not all(isinstance(t, str) for t in types)
    ):
        raise ConfigError(f"{where}: layer_types is {_shown(types)}, not a list of strings")
    for name in ("rope_parameters", "rope_scaling"):
        rope = fields.get(name)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise ConfigError(f"{where}: {name} is {_shown(rope)}, not an object")
        # a key naming a layer type holds that type's own parameters (Gemma 3's are per type)
        for kind in rope.keys() & {*LAYER_TYPES, *(types or ())}:
            if rope[kind] is not None and not isinstance(rope[kind], dict):
                raise ConfigError(
                    f"{where}: {name}[{kind!r}] is {_shown(rope[kind])}, not an object"
                )


def _check_built(a: dict) -> None:
    """The checks of a built config (its __post_init__ and RoPE standardization done): the derived
    sizes, the layer types, and the RoPE parameters each layer reads."""
    where = f"{a['model_type']} config"
    _count(a["num_key_value_heads"], f"{where}: num_key_value_heads", MAX_HEADS)
    head_dim = a.get("head_dim") or a["hidden_size"] // a["num_attention_heads"]
    _count(head_dim, f"{where}: head_dim (hidden_size / num_attention_heads)", MAX_WIDTH)
    for i, kind in enumerate(a.get("layer_types") or ()):
        if kind not in LAYER_TYPES:
            raise ConfigError(
                f"{where}: layer_types[{i}] is {_shown(kind)} (supported: {', '.join(LAYER_TYPES)})"
            )
    rope = a["rope_parameters"]
    if a["model_type"] == "gemma3_text":  # one dict per layer type, each read by its layers
        kinds = sorted(set(a["layer_types"]))
        tables = [(f"rope_parameters[{k!r}]", rope.get(k)) for k in kinds]
    else:
        tables = [("rope_parameters", rope)]
    for name, params in tables:
        _check_rope(params, f"{where}: {name}", a, head_dim)


def _check_rope(params, where: str, a: dict, head_dim: int) -> None:
    """One rope_parameters dict: the keys its rope type's formula reads there, each of its type,
    the bases and factors finite and positive (a base of -1, inf or NaN makes every position's
    rotation garbage)."""
    if not isinstance(params, dict):
        raise ConfigError(f"{where} is {_shown(params)}, not an object")
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str):
        raise ConfigError(f"{where}: rope_type is {_shown(kind)}, not a string")
    for key in ("rope_theta", *_ROPE_NEEDS.get(kind, ())):
        if params.get(key) is None:
            raise ConfigError(f"{where} has no {key}, which rope type {kind!r} needs")
    for key in _ROPE_POSITIVE:
        if params.get(key) is not None:
            _number(params[key], f"{where}: {key}")
    for key in ("mscale", "mscale_all_dim"):
        if params.get(key) is not None:
            _number(params[key], f"{where}: {key}", zero=True)
    if params.get("original_max_position_embeddings") is not None:
        _count(params["original_max_position_embeddings"],
               f"{where}: original_max_position_embeddings")  # fmt: skip
    if params.get("partial_rotary_factor") is not None:
        _number(params["partial_rotary_factor"], f"{where}: partial_rotary_factor", high=1.0)
    if "truncate" in params:
        _flag(params["truncate"], f"{where}: truncate")
    if kind == "llama3" and params["low_freq_factor"] >= params["high_freq_factor"]:
        raise ConfigError(f"{where}: low_freq_factor is not below high_freq_factor")
    partial = params.get("partial_rotary_factor", a.get("partial_rotary_factor")) or 1.0
    frequencies = int(head_dim * partial) // 2  # as kwker.families.llama.config_rope_table
    if frequencies < 1:
        raise ConfigError(
            f"{where}: a partial_rotary_factor of {partial} rotates {int(head_dim * partial)} of "
            f"the head's {head_dim} dimensions, fewer than 2"
        )
    for key in _ROPE_LISTS:
        values = params.get(key)
        if values is None:
            continue
        if not isinstance(values, list) or len(values) != frequencies:
            raise ConfigError(
                f"{where}: {key} is {_shown(values)}, not a list of {frequencies} factors"
            )
        for i, value in enumerate(values):
            _number(value, f"{where}: {key}[{i}]")


def config_from_json(config: dict) -> ModelConfig:
    """The ModelConfig of a config.json's contents (model types llama, mistral, qwen2, qwen3, phi3,
    gemma3_text, and gemma3, whose text_config is the model)."""
    if not isinstance(config, dict):
        raise ConfigError(f"the config is {_shown(config)}, not a JSON object")
    _check_nesting(config)
    model_type = config.get("model_type")
    if model_type == "gemma3":  # the multimodal wrapper: the language model is its text config
        text = config.get("text_config") or {}
        if not isinstance(text, dict):
            raise ConfigError(f"gemma3 config: text_config is {_shown(text)}, not an object")
        config = {**text, "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    spec = MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if spec is None:
        raise ConfigError(
            f"model type {_shown(model_type)} is not supported "
            f"(supported: {', '.join(sorted(MODEL_TYPES))}, gemma3)"
        )
    config = copy.deepcopy(config)
    fields = {**_BASE_FIELDS, **spec.fields}
    attributes = {name: config.pop(name, default) for name, default in fields.items()}
    extra = {k: v for k, v in config.items() if k not in _DROPPED}
    torch_dtype = extra.pop("torch_dtype", None)  # dtype's old name, taken when dtype is absent
    if attributes["dtype"] is None:
        attributes["dtype"] = torch_dtype
    _check_fields(attributes, extra, model_type)  # before anything divides or sizes by them
    spec.post_init(attributes, extra)
    spec.rope(attributes, extra)
    if attributes.get("layer_types") is not None:
        attributes["layer_types"] = [
            _LEGACY_LAYER_TYPES.get(t, t) for t in attributes["layer_types"]
        ]
    attributes.update(extra)
    attributes["model_type"] = model_type
    _validate(attributes, spec)
    _check_built(attributes)
    return ModelConfig(attributes)


# A config.json nests a few levels (rope_parameters per layer type, a multimodal model's
# text_config); far deeper is damage, which copy.deepcopy's recursion would fail on
MAX_NESTING = 16


def _check_nesting(config: dict) -> None:
    pending = [(config, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_NESTING:
            raise ConfigError(f"the config nests objects or lists more than {MAX_NESTING} deep")
        children = value.values() if isinstance(value, dict) else value
        pending += [(c, depth + 1) for c in children if isinstance(c, dict | list)]


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

    def get(self, name: str, default=_REQUIRED, check=None, *, uniform: bool = True):
        """The value of `<arch>.<name>` (default when absent; else required), passed through
        check(value, key) when given, which raises a ConfigError saying what the value is not."""
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
                raise self.error(
                    f"{key} differs between layers ({_shown(value)}), which is not supported"
                )
            value = value[0]
        return self.checked(check, value, key)

    def checked(self, check, value, key: str):
        """`value` (of metadata `key`, which need not be under the architecture's prefix), passed
        through check(value, key); its ConfigError named with the file."""
        if check is not None:
            try:
                check(value, key)
            except ConfigError as e:
                raise self.error(str(e)) from None
        return value


def _at_most(limit: int, low: int = 1):
    """The check of a count: an integer in low..limit."""
    return lambda value, what: _count(value, what, limit, low)


def config_from_gguf(gguf: GgufFile) -> ModelConfig:
    """The ModelConfig of a GGUF file (architectures llama, qwen2, qwen3, gemma3): llama.cpp's keys
    mapped to transformers' names, then built as config_from_json builds a config.json."""
    arch = gguf.metadata.get("general.architecture")
    if arch is None:
        raise ConfigError(f"{gguf.path}: the metadata has no general.architecture")
    if not isinstance(arch, str) or arch not in GGUF_MODEL_TYPES:
        raise ConfigError(
            f"{gguf.path}: GGUF architecture {_shown(arch)} is not supported "
            f"(supported: {', '.join(GGUF_MODEL_TYPES)})"
        )
    m = _Metadata(gguf, arch)
    if m.get("expert_count", 0, _at_most(MAX_INT32, low=0)):
        raise ConfigError(f"{gguf.path}: a mixture-of-experts {arch} model is not supported")
    model_type = GGUF_MODEL_TYPES[arch]
    # llama.cpp runs Mistral's checkpoints as llama; transformers tells them apart by name
    if arch == "llama" and "mistral" in str(gguf.metadata.get("general.name", "")).lower():
        model_type = "mistral"

    # every value is checked as it is read, naming its GGUF key: a count that lies is refused
    # before anything divides by it or is sized by it
    heads = m.get("attention.head_count", check=_at_most(MAX_HEADS))
    hidden = m.get("embedding_length", check=_at_most(MAX_WIDTH))
    head_dim = m.get("attention.key_length", None, _at_most(MAX_WIDTH))
    if head_dim is None:
        # llama/mistral: transformers takes the head size from the rotary width, as llama.cpp does
        head_dim = (
            m.get("rope.dimension_count", None, _at_most(MAX_WIDTH)) if arch == "llama" else None
        )
    if head_dim is None:
        head_dim = hidden // heads  # llama.cpp's default for n_embd_head_k
    config = {
        "model_type": model_type,
        "vocab_size": _vocab_size(gguf, m),
        "hidden_size": hidden,
        "intermediate_size": m.get("feed_forward_length", check=_at_most(MAX_WIDTH)),
        "num_hidden_layers": m.get("block_count", check=_at_most(MAX_LAYERS)),
        "num_attention_heads": heads,
        "num_key_value_heads": m.get("attention.head_count_kv", heads, _at_most(MAX_HEADS)),
        "rms_norm_eps": m.get("attention.layer_norm_rms_epsilon", check=_number),
        "max_position_embeddings": m.get("context_length", check=_at_most(MAX_INT32)),
        "rope_theta": m.get("rope.freq_base", check=_number),
        # llama.cpp writes the output projection only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        # ids the file does not state stay None rather than taking a config class's defaults
        **{
            name: m.checked(_token_ids, gguf.metadata.get(key), key)
            for name, key in _GGUF_TOKEN_IDS.items()
        },
    }
    if "tokenizer.ggml.unknown_token_id" in gguf.metadata:
        key = "tokenizer.ggml.unknown_token_id"
        config["unk_token_id"] = m.checked(_token_ids, gguf.metadata[key], key)
    if model_type != "qwen2" or head_dim != hidden // heads:  # Qwen2Config has no head_dim field
        config["head_dim"] = head_dim
    rotary = m.get("rope.dimension_count", head_dim, _at_most(MAX_WIDTH))
    if rotary > head_dim:
        raise m.error(
            f"{arch}.rope.dimension_count is {rotary}, more than the head size {head_dim}"
        )
    if rotary != head_dim:
        config["partial_rotary_factor"] = rotary / head_dim
    biases = _biases(gguf)
    window = m.get("attention.sliding_window", None, _at_most(MAX_INT32, low=0))
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
    try:
        return config_from_json(config)
    except ConfigError as e:  # config_from_json knows the values, not the file they came from
        raise m.error(str(e)) from None


# The key (after "<arch>.") a GGUF states each of these config fields under, for messages that
# name what in the file is wrong
GGUF_FIELD_KEYS = {
    "vocab_size": "vocab_size",
    "hidden_size": "embedding_length",
    "intermediate_size": "feed_forward_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "head_dim": "attention.key_length",
}
# config.json's names of the token ids a GGUF's tokenizer metadata states
_GGUF_TOKEN_IDS = {
    "bos_token_id": "tokenizer.ggml.bos_token_id",
    "eos_token_id": "tokenizer.ggml.eos_token_id",
    "pad_token_id": "tokenizer.ggml.padding_token_id",
}


def _vocab_size(gguf: GgufFile, m: _Metadata) -> int:
    vocab = m.get("vocab_size", None, _at_most(MAX_VOCAB))
    if vocab is None:
        tokens = gguf.metadata.get("tokenizer.ggml.tokens")
        if tokens is None:
            raise m.error(f"the metadata has neither {m.arch}.vocab_size nor tokenizer.ggml.tokens")
        if not isinstance(tokens, list):
            raise m.error(f"tokenizer.ggml.tokens is {_shown(tokens)}, not a list of tokens")
        vocab = m.checked(_at_most(MAX_VOCAB), len(tokens), "the number of tokenizer.ggml.tokens")
    embed = gguf.tensors.get("token_embd.weight")
    if embed is not None and embed.shape[0] != vocab:
        raise m.error(f"token_embd.weight has {embed.shape[0]} rows for a vocabulary of {vocab}")
    return vocab


def _biases(gguf: GgufFile) -> dict[str, bool]:
    """Which layer matrices carry biases, from the tensor names (blk.N.attn_q.bias, blk.N.ffn_up.bias)."""
    parts = [name.split(".") for name in gguf.tensors]
    leaves = {p[2] for p in parts if len(p) == 4 and p[0] == "blk" and p[3] == "bias"}
    return {
        "attn": any(leaf.startswith("attn_") for leaf in leaves),
        "ffn": any(leaf.startswith("ffn_") for leaf in leaves),
    }


def _gemma3_keys(m: _Metadata, config: dict) -> dict:
    layers = config["num_hidden_layers"]
    out = {"sliding_window": m.get("attention.sliding_window", check=_at_most(MAX_INT32, low=0))}
    pattern = m.get("attention.sliding_window_pattern", None, uniform=False)
    key = f"{m.arch}.attention.sliding_window_pattern"
    if isinstance(pattern, list):  # per layer, True where the layer is windowed
        if not all(isinstance(p, bool) for p in pattern):
            raise m.error(f"{key} is {_shown(pattern)}, not a list of true/false")
        if len(pattern) != layers:
            raise m.error(
                f"{m.arch}.attention.sliding_window_pattern has {len(pattern)} entries for {layers} layers"
            )
        out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    elif pattern is not None:
        out["sliding_window_pattern"] = m.checked(_at_most(MAX_INT32), pattern, key)
    if (local_base := m.get("rope.freq_base_swa", None, _number)) is not None:
        out["rope_local_base_freq"] = local_base
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if (value := m.get(cap, None, _number)) is not None:
            out[cap] = value
    # The attention scale: stated by newer files; else llama.cpp's rule for Gemma 3 -- 1/sqrt(head size),
    # except the 27B (62 layers), which scales by 1/sqrt(hidden / heads)
    scale = m.get("attention.scale", None, _number)
    if scale is not None:
        if not 0 < scale * scale < math.inf:  # its square divides below
            raise m.error(f"{m.arch}.attention.scale is {scale}, too far from 1 to square")
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
    kind = m.get("rope.scaling.type", None, _text)
    factor = m.get("rope.scaling.factor", None, _number)
    if (
        kind is None and m.get("rope.scale_linear", None) is not None
    ):  # the key before rope.scaling.*
        kind, factor = "linear", m.get("rope.scale_linear", check=_number)
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
                raise m.error(f"{m.arch}.rope.scaling.{name} = {_shown(value)} is not supported")
        out = {"rope_type": "yarn", "factor": factor}
        original = m.get("rope.scaling.original_context_length", None, _at_most(MAX_INT32))
        if original is not None:
            out["original_max_position_embeddings"] = original
        for gguf_name, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := m.get(f"rope.scaling.{gguf_name}", None, _number)) is not None:
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
    # a Qwen2 config states no head_dim when it is hidden / heads, as Qwen2Config does
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    rotary = round(config.get("partial_rotary_factor", 1.0) * head_dim)
    if info.ggml_type not in (0, 1) or info.shape != (rotary // 2,):
        raise m.error(
            f"{_ROPE_FREQS} is {GGML_TYPES[info.ggml_type].name} of shape {info.shape}, not F32/F16 "
            f"[{rotary // 2}]"
        )
    dtype = "<f4" if info.ggml_type == 0 else "<f2"
    stored = np.frombuffer(gguf.tensor_bytes(info), dtype, rotary // 2).astype(np.float32)
    if not np.all(np.isfinite(stored)) or np.any(stored <= 0):
        raise m.error(f"{_ROPE_FREQS} holds factors that are not positive and finite")
    if np.all(stored == 1.0):
        return None
    return {"rope_type": "freq_factors", "freq_factors": [float(x) for x in stored]}
