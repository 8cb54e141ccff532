"""What a config's fields may hold. A config.json or a GGUF's metadata is the file's word on the
model's sizes, and everything a load allocates is sized by it. So each field the loader reads is
checked for its type and range before anything is computed from it: an int where an int is meant
(not a bool, a float, a string or a list), a finite positive number where a rope base or a norm's
epsilon is meant.

A header that lies is a ConfigError (a BadModelFile) naming the field, never a traceback or
gigabytes of memory. kwker.loading.config_json and kwker.loading.gguf_config call these checks;
kwker.loading.build then checks the sizes against the tensors.
"""

from __future__ import annotations

import math
import reprlib

from kwker.loading.errors import BadModelFile


class ConfigError(BadModelFile):
    """A configuration this loader cannot build a model from; the message says which key and why."""


# The native step's limits (native/src/model/model.cpp: kMaxLayers, kMaxWidth, kMaxHeads,
# kMaxVocab). A config past them describes no model kwker can run; refusing it before the config
# is built also bounds what is sized by it (layer_types holds an entry per layer).
MAX_LAYERS, MAX_WIDTH, MAX_HEADS, MAX_VOCAB = 1024, 1 << 17, 1024, 1 << 24
MAX_INT32 = 2**31 - 1  # positions and token ids are int32 in the native step

_SHOWN = reprlib.Repr()  # a field's value as a message shows it: a lying one can be megabytes long
_SHOWN.maxstring, _SHOWN.maxother, _SHOWN.maxlevel = 40, 40, 2


def shown(value) -> str:
    return _SHOWN.repr(value)


def check_count(value, what: str, limit: int = MAX_INT32, low: int = 1) -> int:
    """`value` when it is an integer in low..limit (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "a positive integer" if low == 1 else f"an integer >= {low}"
        raise ConfigError(f"{what} is {shown(value)}, not {kind}")
    if value > limit:
        raise ConfigError(f"{what} is {value}, more than the {limit} kwker's native step takes")
    return value


def check_number(value, what: str, low: float = 0.0, high: float = math.inf, zero: bool = False):
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
        raise ConfigError(f"{what} is {shown(value)}, not a finite number {bound}")
    return value


def _flag(value, what: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{what} is {shown(value)}, not true or false")
    return value


def check_text(value, what: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"{what} is {shown(value)}, not a string")
    return value


def check_token_ids(value, what: str):
    """None, a token id or a non-empty list of them (eos_token_id may name several)."""
    ids = value if isinstance(value, list) and value else [value]
    if value is not None:
        for i in ids:
            check_count(i, what, MAX_INT32, low=0)
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


def check_fields(a: dict, kw: dict, model_type: str) -> None:
    """Every field of a config.json that the config's building or a family reads, checked before
    anything divides by it or is sized by it (a: the class's fields, kw: the other keys)."""
    where = f"{model_type} config"
    fields = {**kw, **a}
    for name, limit in _COUNTS.items():
        if name in fields and not (fields[name] is None and name in _DERIVED):
            check_count(fields[name], f"{where}: {name}", limit)
    for name in _FLAGS:
        if name in fields:
            _flag(fields[name], f"{where}: {name}")
    for name in _POSITIVE:
        if name in fields:
            check_number(fields[name], f"{where}: {name}")
    for name in _TOKEN_IDS:
        check_token_ids(fields.get(name), f"{where}: {name}")
    for name in _TEXTS:
        check_text(fields.get(name), f"{where}: {name}")
    if fields.get("sliding_window") is not None:  # None: no window
        check_count(fields["sliding_window"], f"{where}: sliding_window", low=0)
    # which layers a window applies to: compared with each layer's index, so never None
    for name, low in (("max_window_layers", 0), ("sliding_window_pattern", 1)):
        if name in fields:
            check_count(fields[name], f"{where}: {name}", low=low)
    if fields.get("use_bidirectional_attention") and fields.get("sliding_window") is None:
        raise ConfigError(f"{where}: use_bidirectional_attention needs a sliding_window")
    if fields.get("partial_rotary_factor") is not None:
        check_number(fields["partial_rotary_factor"], f"{where}: partial_rotary_factor", high=1.0)
    types = fields.get("layer_types")
    if types is not None and (
        not isinstance(types, list) or not all(isinstance(t, str) for t in types)
    ):
        raise ConfigError(f"{where}: layer_types is {shown(types)}, not a list of strings")
    for name in ("rope_parameters", "rope_scaling"):
        rope = fields.get(name)
        if rope is None:
            continue
        if not isinstance(rope, dict):
            raise ConfigError(f"{where}: {name} is {shown(rope)}, not an object")
        # a key naming a layer type holds that type's own parameters (Gemma 3's are per type)
        for kind in rope.keys() & {*LAYER_TYPES, *(types or ())}:
            if rope[kind] is not None and not isinstance(rope[kind], dict):
                raise ConfigError(
                    f"{where}: {name}[{kind!r}] is {shown(rope[kind])}, not an object"
                )


def check_built(a: dict) -> None:
    """The checks of a built config (its __post_init__ and RoPE standardization done): the derived
    sizes, the layer types, and the RoPE parameters each layer reads."""
    where = f"{a['model_type']} config"
    check_count(a["num_key_value_heads"], f"{where}: num_key_value_heads", MAX_HEADS)
    head_dim = a.get("head_dim") or a["hidden_size"] // a["num_attention_heads"]
    check_count(head_dim, f"{where}: head_dim (hidden_size / num_attention_heads)", MAX_WIDTH)
    for i, kind in enumerate(a.get("layer_types") or ()):
        if kind not in LAYER_TYPES:
            raise ConfigError(
                f"{where}: layer_types[{i}] is {shown(kind)} (supported: {', '.join(LAYER_TYPES)})"
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
        raise ConfigError(f"{where} is {shown(params)}, not an object")
    kind = params.get("rope_type", params.get("type", "default"))
    if not isinstance(kind, str):
        raise ConfigError(f"{where}: rope_type is {shown(kind)}, not a string")
    for key in ("rope_theta", *_ROPE_NEEDS.get(kind, ())):
        if params.get(key) is None:
            raise ConfigError(f"{where} has no {key}, which rope type {kind!r} needs")
    for key in _ROPE_POSITIVE:
        if params.get(key) is not None:
            check_number(params[key], f"{where}: {key}")
    for key in ("mscale", "mscale_all_dim"):
        if params.get(key) is not None:
            check_number(params[key], f"{where}: {key}", zero=True)
    if params.get("original_max_position_embeddings") is not None:
        check_count(params["original_max_position_embeddings"],
               f"{where}: original_max_position_embeddings")  # fmt: skip
    if params.get("partial_rotary_factor") is not None:
        check_number(params["partial_rotary_factor"], f"{where}: partial_rotary_factor", high=1.0)
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
                f"{where}: {key} is {shown(values)}, not a list of {frequencies} factors"
            )
        for i, value in enumerate(values):
            check_number(value, f"{where}: {key}[{i}]")


# A config.json nests a few levels (rope_parameters per layer type, a multimodal model's
# text_config); far deeper is damage, which copy.deepcopy's recursion would fail on
MAX_NESTING = 16


def check_nesting(config: dict) -> None:
    pending = [(config, 1)]
    while pending:
        value, depth = pending.pop()
        if depth > MAX_NESTING:
            raise ConfigError(f"the config nests objects or lists more than {MAX_NESTING} deep")
        children = value.values() if isinstance(value, dict) else value
        pending += [(c, depth + 1) for c in children if isinstance(c, dict | list)]
