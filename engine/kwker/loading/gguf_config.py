"""A model's configuration from a GGUF file's metadata: `config_from_gguf` maps llama.cpp's
metadata keys to a config.json dict and builds it as config_from_json does, requiring every key
that defines the model's shape: a file that lacks one fails naming it, instead of getting a
default that describes some other model. Every value is checked as it is read, naming its key.
"""

from __future__ import annotations

import math

import numpy as np

from kwker.loading.config_checks import (
    MAX_HEADS,
    MAX_INT32,
    MAX_LAYERS,
    MAX_VOCAB,
    MAX_WIDTH,
    ConfigError,
    check_count,
    check_number,
    check_text,
    check_token_ids,
    shown,
)
from kwker.loading.config_json import ModelConfig, config_from_json
from kwker.loading.gguf_file import GGML_TYPES, GgufFile

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
                    f"{key} differs between layers ({shown(value)}), which is not supported"
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
    return lambda value, what: check_count(value, what, limit, low)


def config_from_gguf(gguf: GgufFile) -> ModelConfig:
    """The ModelConfig of a GGUF file (architectures llama, qwen2, qwen3, gemma3): llama.cpp's keys
    mapped to transformers' names, then built as config_from_json builds a config.json."""
    arch = gguf.metadata.get("general.architecture")
    if arch is None:
        raise ConfigError(f"{gguf.path}: the metadata has no general.architecture")
    if not isinstance(arch, str) or arch not in GGUF_MODEL_TYPES:
        raise ConfigError(
            f"{gguf.path}: GGUF architecture {shown(arch)} is not supported "
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
        "rms_norm_eps": m.get("attention.layer_norm_rms_epsilon", check=check_number),
        "max_position_embeddings": m.get("context_length", check=_at_most(MAX_INT32)),
        "rope_theta": m.get("rope.freq_base", check=check_number),
        # llama.cpp writes the output projection only when it is not the embedding matrix
        "tie_word_embeddings": "output.weight" not in gguf.tensors,
        # ids the file does not state stay None rather than taking a config class's defaults
        **{
            name: m.checked(check_token_ids, gguf.metadata.get(key), key)
            for name, key in _GGUF_TOKEN_IDS.items()
        },
    }
    if "tokenizer.ggml.unknown_token_id" in gguf.metadata:
        key = "tokenizer.ggml.unknown_token_id"
        config["unk_token_id"] = m.checked(check_token_ids, gguf.metadata[key], key)
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
            raise m.error(f"tokenizer.ggml.tokens is {shown(tokens)}, not a list of tokens")
        vocab = m.checked(_at_most(MAX_VOCAB), len(tokens), "the number of tokenizer.ggml.tokens")
    embed = gguf.tensors.get("token_embd.weight")
    if embed is not None and embed.shape[0] != vocab:
        raise m.error(f"token_embd.weight has {embed.shape[0]} rows for a vocabulary of {vocab}")
    return vocab


def _biases(gguf: GgufFile) -> dict[str, bool]:
    """Which layer matrices carry biases, from the tensor names (blk.N.attn_q.bias,
    blk.N.ffn_up.bias)."""
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
            raise m.error(f"{key} is {shown(pattern)}, not a list of true/false")
        if len(pattern) != layers:
            raise m.error(
                f"{m.arch}.attention.sliding_window_pattern has {len(pattern)} entries for "
                f"{layers} layers"
            )
        out["layer_types"] = ["sliding_attention" if p else "full_attention" for p in pattern]
    elif pattern is not None:
        out["sliding_window_pattern"] = m.checked(_at_most(MAX_INT32), pattern, key)
    if (local_base := m.get("rope.freq_base_swa", None, check_number)) is not None:
        out["rope_local_base_freq"] = local_base
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):
        if (value := m.get(cap, None, check_number)) is not None:
            out[cap] = value
    # The attention scale: stated by newer files; else llama.cpp's rule for Gemma 3 --
    # 1/sqrt(head size), except the 27B (62 layers), which scales by 1/sqrt(hidden / heads)
    scale = m.get("attention.scale", None, check_number)
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
    kind = m.get("rope.scaling.type", None, check_text)
    factor = m.get("rope.scaling.factor", None, check_number)
    if (
        kind is None and m.get("rope.scale_linear", None) is not None
    ):  # the key before rope.scaling.*
        kind, factor = "linear", m.get("rope.scale_linear", check=check_number)
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
                raise m.error(f"{m.arch}.rope.scaling.{name} = {shown(value)} is not supported")
        out = {"rope_type": "yarn", "factor": factor}
        original = m.get("rope.scaling.original_context_length", None, _at_most(MAX_INT32))
        if original is not None:
            out["original_max_position_embeddings"] = original
        for gguf_name, name in (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if (value := m.get(f"rope.scaling.{gguf_name}", None, check_number)) is not None:
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
            f"{_ROPE_FREQS} is {GGML_TYPES[info.ggml_type].name} of shape {info.shape}, "
            f"not F32/F16 [{rotary // 2}]"
        )
    dtype = "<f4" if info.ggml_type == 0 else "<f2"
    stored = np.frombuffer(gguf.tensor_bytes(info), dtype, rotary // 2).astype(np.float32)
    if not np.all(np.isfinite(stored)) or np.any(stored <= 0):
        raise m.error(f"{_ROPE_FREQS} holds factors that are not positive and finite")
    if np.all(stored == 1.0):
        return None
    return {"rope_type": "freq_factors", "freq_factors": [float(x) for x in stored]}
