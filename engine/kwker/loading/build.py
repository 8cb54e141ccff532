"""One loader for every source: a model's config and its tensors (kwker.loading.sources) in, the
native step with its weights packed out.

    step, precision, kv_cache = build_step(config, source, "int4", max_cache_len=2048, ...)

or, for weights that come from elsewhere (the packed cache), empty_step(...) and fill it.

The family (kwker.families) says which tensors the step needs under their Hugging Face names;
each matrix goes from the source's bytes to packed panels in one native call
(Model.set_matrix_ggml), a panel of rows at a time. Validation is strict: a tensor the family needs
and the source lacks, a tensor the source has and the family does not explain, or a wrong shape,
is a BadModelFile naming it; nothing is ever left at random or default values.
"""

from __future__ import annotations

import math
import os
import re
import reprlib

import numpy as np

from kwker import _native
from kwker.cpu_backend import best_isa, decoder_available
from kwker.families import FAMILIES, llama, supported_model_types
from kwker.loading.config import GGUF_FIELD_KEYS
from kwker.loading.packed_cache import Recording
from kwker.loading.sources import BadModelFile
from kwker.precision import PRECISIONS, checked, kept_format
from kwker.runner import DEFAULT_LOGIT_ROWS, DEFAULT_STEP_TOKENS

KV_CACHE_TYPES = ("fp32", "fp16")
EMBED = "model.embed_tokens.weight"  # the one tensor every family reads first

# The precision a GGUF's matrix type runs at when none is asked for: the nearest Kwker format
# (perf-notes #18: the 4- and 5-bit types lose least as Q4, the 6- and 8-bit ones as Q8). The
# i-quants and the ternary types (4.5 bits a weight and fewer) are nearest Q4, at half of Q8's
# bytes a token; repacking their non-uniform levels costs some (Qwen2.5-Coder-1.5B IQ4_XS: KL
# 0.128 at int4, 0.078 at balanced, perf-notes #44), which --precision balanced gives back.
# Q8_K (8 bits) is Q8's.
GGUF_PRECISION = {
    "F32": "fp32", "F16": "fp16", "BF16": "bf16", "Q8_0": "balanced", "Q8_K": "balanced",
    "Q6_K": "balanced", "Q5_0": "int4", "Q5_1": "int4", "Q5_K": "int4", "Q4_0": "int4",
    "Q4_1": "int4", "Q4_K": "int4", "Q3_K": "int4", "Q2_K": "int4", "IQ4_NL": "int4",
    "IQ4_XS": "int4", "IQ3_S": "int4", "IQ3_XXS": "int4", "IQ2_S": "int4", "IQ2_XS": "int4",
    "IQ2_XXS": "int4", "IQ1_M": "int4", "IQ1_S": "int4", "TQ2_0": "int4", "TQ1_0": "int4",
}  # fmt: skip


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def family_of(config):
    family = FAMILIES.get(getattr(config, "model_type", None))
    if family is None:
        raise ValueError(
            f"model type {getattr(config, 'model_type', None)!r} is not supported natively "
            f"(supported: {', '.join(supported_model_types())})"
        )
    return family


def is_tied(config, source) -> bool:
    """A model whose lm_head is its embedding: its config says so, or its files hold no lm_head
    (a GGUF leaves output.weight out)."""
    return (
        bool(getattr(config, "tie_word_embeddings", False)) or "lm_head.weight" not in source.names
    )


def own_precision(source) -> str:
    """The precision a model's files hold best: for float files the dtype of their weights, for a
    quantized GGUF the nearest precision of the type most of its layers' matrix values are in."""
    counts: dict[str, int] = {}
    for name in source.names:
        if name.startswith("model.layers.") and name.endswith("_proj.weight"):
            kind = source.type_name(name)
            counts[kind] = counts.get(kind, 0) + math.prod(source.shape(name))
    if not counts:
        counts[source.type_name(EMBED)] = 1
    return GGUF_PRECISION[max(counts, key=counts.get)]


def check_options(max_cache_len, threads, kv_cache, max_batch) -> None:
    if not isinstance(max_cache_len, int) or isinstance(max_cache_len, bool) or max_cache_len < 1:
        raise ValueError(f"max_cache_len must be a positive integer, got {max_cache_len!r}")
    if threads is not None and (not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    if kv_cache is not None and kv_cache not in KV_CACHE_TYPES:
        raise ValueError(f"kv_cache must be None, 'fp32' or 'fp16', got {kv_cache!r}")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
    if not decoder_available():
        raise RuntimeError(
            f"this CPU has no supported SIMD kernels (best: {_native.isa_best()}); "
            "the native step needs AVX2+FMA+F16C or AVX-512"
        )


def check_model(config, source, max_cache_len: int):
    """The family of `config`, after checking that it runs with max_cache_len tokens and that the
    source has an embedding (BadModelFile saying why not)."""
    family = family_of(config)
    reason = family.unsupported(config, max_cache_len)
    if reason is not None:
        raise BadModelFile(
            f"{source.description}: cannot run this {config.model_type} model: {reason}"
        )
    if EMBED not in source.names:
        raise BadModelFile(f"{source.description}: tensor {EMBED} is missing")
    # the native step computes in float32: a value the config makes past its range (an epsilon
    # of 1e300) is refused here, naming where it comes from
    tied, embed_dtype = is_tied(config, source), source.type_name(EMBED)
    cfg = family.native_config(config, tied=tied, embed_dtype=embed_dtype)
    for name, origin in NATIVE_FLOATS.items():
        if name in cfg and not abs(cfg[name]) <= FLOAT32_MAX:  # False for NaN too
            raise BadModelFile(
                f"{source.description}: {name} = {cfg[name]:g} (from the config's {origin}) is "
                "past the float32 range the native step computes in"
            )
    return family


# The native step's float settings, and the config fields they come from
NATIVE_FLOATS = {
    "norm_eps": "rms_norm_eps",
    "attn_scale": "head_dim or query_pre_attn_scalar",
    "embed_scale": "hidden_size",
}
FLOAT32_MAX = float(np.finfo(np.float32).max)


# A layer's tensors: model.layers.<i>.<...> (ASCII digits: int() would take other scripts' too)
_LAYER = re.compile(r"model\.layers\.([0-9]+)\.")


def check_tensor_table(config, source, config_file=None) -> None:
    """Checks that `config` describes the tensors `source` holds, before anything is sized by the
    config: the layers the tensor names number are 0 .. num_hidden_layers - 1, the family reads
    every tensor, and every tensor it reads is there with the shape the config gives it
    (vocab_size x hidden_size for the embedding, num_attention_heads x head_dim rows for q, ...).
    The tensors are as large as the file, so a header that lies about a count is refused here,
    naming the file and the field, instead of being allocated for. `config_file`: where the config
    was read, when not from the source's files (a folder's config.json). Raises BadModelFile."""
    where, family = source.description, family_of(config)
    layers = {int(m.group(1)) for m in map(_LAYER.match, source.names) if m}
    n = config.num_hidden_layers
    if layers != set(range(n)):
        missing = sorted(set(range(n)) - layers)
        held = f"no layer {missing[0]}" if missing else f"a layer {max(layers)}"
        raise BadModelFile(
            f"{config_file or where}: {_field(source, 'num_hidden_layers')} is {n}, but the "
            f"tensors hold {held} ({len(layers)} layers in all)"
        )
    expected = expected_shapes(config, family, source)
    unread = sorted(source.names - expected.keys() - {"lm_head.weight"})  # a tied one is unread
    if unread:
        raise BadModelFile(
            f"{where}: tensors {', '.join(unread[:5])}{' ...' if len(unread) > 5 else ''} are "
            f"not part of a {config.model_type} model as kwker reads it"
        )
    for tensor, (shape, fields, needed_for) in expected.items():
        if tensor not in source.names:
            raise BadModelFile(
                f"{where}: tensor {tensor} is missing (the model needs it for {needed_for})"
            )
        if tuple(source.shape(tensor)) != shape:
            raise BadModelFile(
                f"{where}: tensor {_tensor_name(source, tensor)} has shape "
                f"{list(source.shape(tensor))}, where the config's [{', '.join(fields)}] make it "
                f"{list(shape)}"
            )


def expected_shapes(config, family, source) -> dict[str, tuple]:
    """{tensor: (shape, the config fields each dimension comes from, the native weight it is
    for)} of every tensor the family reads (Hugging Face names). The parts of a fused matrix
    (Phi-3's qkv_proj) add up to its rows."""
    hd = llama.head_dim(config)
    d, ff, vocab = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd

    def named(*fields: str) -> str:
        return " x ".join(_field(source, f) for f in fields)

    hidden, inner, words = named("hidden_size"), named("intermediate_size"), named("vocab_size")
    q_rows = named("num_attention_heads", "head_dim")
    kv_rows = named("num_key_value_heads", "head_dim")
    # each native weight's shape and the fields of its dimensions; every other norm scales the
    # hidden state
    native = {
        "embed": ((vocab, d), (words, hidden)),
        "lm_head": ((vocab, d), (words, hidden)),
        "q": ((q, d), (q_rows, hidden)),
        "k": ((kv, d), (kv_rows, hidden)),
        "v": ((kv, d), (kv_rows, hidden)),
        "o": ((d, q), (hidden, q_rows)),
        "gate": ((ff, d), (inner, hidden)),
        "up": ((ff, d), (inner, hidden)),
        "down": ((d, ff), (hidden, inner)),
        "q_norm": ((hd,), (named("head_dim"),)),
        "k_norm": ((hd,), (named("head_dim"),)),
    }
    out: dict[str, tuple] = {}
    for spec in family.weights(config, tied=is_tied(config, source)):
        shape, fields = native.get(spec.native.rsplit(".", 1)[-1], ((d,), (hidden,)))
        parts = [(spec.source, shape, fields)]
        if spec.bias is not None:  # a bias per row
            parts.append((spec.bias, shape[:1], fields[:1]))
        for tensor, shape, fields in parts:
            if spec.rows is not None and tensor in out:  # the next part of a fused matrix
                (rows, *columns), (rows_from, *columns_from), _ = out[tensor]
                shape = (rows + shape[0], *columns)
                fields = (f"{rows_from} + {fields[0]}", *columns_from)
            out[tensor] = (shape, fields, spec.native)
    return out


def _field(source, name: str) -> str:
    """A config field as the files name it: with the GGUF key it comes from, for a GGUF."""
    arch = getattr(source, "arch", None)
    if arch is None or name not in GGUF_FIELD_KEYS:
        return name
    return f"{name} ({arch}.{GGUF_FIELD_KEYS[name]})"


def _tensor_name(source, tensor: str) -> str:
    gguf_name = getattr(source, "gguf_name", None)
    return tensor if gguf_name is None else f"{gguf_name(tensor)} ({tensor})"


def rope_tables(config, source, max_cache_len: int) -> tuple[np.ndarray, np.ndarray]:
    """The family's rope tables (cos, sin) of `config` for max_cache_len positions, checked: each
    rope parameter is finite and positive (kwker.loading.config), but extreme ones (a base of
    1e-45) still overflow float32, and are refused rather than run as garbage. Raises
    BadModelFile."""
    try:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # checked below
            cos, sin = family_of(config).rope_tables(config, max_cache_len)
    except (ArithmeticError, ValueError) as e:
        # a combination of valid values that the formula still cannot take (yarn's log of a base
        # of 1 divides by zero)
        raise BadModelFile(
            f"{source.description}: the RoPE parameters {reprlib.repr(config.rope_parameters)} "
            f"cannot be tabulated ({type(e).__name__}: {e})"
        ) from None
    if not (np.isfinite(cos).all() and np.isfinite(sin).all()):
        raise BadModelFile(
            f"{source.description}: the RoPE parameters "
            f"{reprlib.repr(config.rope_parameters)} give rotations that are not finite numbers"
        )
    return cos, sin


def empty_step(
    config,
    source,
    precision: str | None,
    max_cache_len: int,
    threads: int | None = None,
    max_batch: int = 1,
    max_step_tokens: int = DEFAULT_STEP_TOKENS,
    kv_cache: str | None = None,
):
    """(step, precision, kv_cache): the native step of `config` at `precision` (None: the
    source's own) with no weights yet, after checking that it can run at all."""
    check_options(max_cache_len, threads, kv_cache, max_batch)
    family = check_model(config, source, max_cache_len)
    precision = checked(precision) or own_precision(source)
    kv_cache = kv_cache or ("fp32" if precision == "fp32" else "fp16")
    tied, embed_dtype = is_tied(config, source), source.type_name(EMBED)
    cfg = family.native_config(config, tied=tied, embed_dtype=embed_dtype)
    cfg["wtype"] = getattr(_native.WType, PRECISIONS[precision].matrices)
    cfg["kv_f16"] = kv_cache == "fp16"
    cos, sin = rope_tables(config, source, max_cache_len)
    # the table's width: partial rotary models rotate fewer dims
    cfg["rope_dim"] = 2 * cos.shape[-1]
    step = _native.Model(
        cfg, cos, sin, max_cache_len, max_batch, min(max_step_tokens, max_cache_len),
        DEFAULT_LOGIT_ROWS, threads or default_threads(), best_isa(),
    )  # fmt: skip
    return step, precision, kv_cache


def build_step(config, source, precision, max_cache_len, recording: Recording | None = None,
               **options):  # fmt: skip
    """(step, precision, kv_cache): empty_step's step with `source`'s weights packed into it.
    `recording`, if given, collects what was set (for the packed cache)."""
    step, precision, kv_cache = empty_step(config, source, precision, max_cache_len, **options)
    load_weights(step, config, source, precision, recording)
    return step, precision, kv_cache


def load_weights(step, config, source, precision: str, recording=None, fewest_bytes=False) -> None:
    """Packs every weight the family names from `source` into `step`, strictly (see the module).
    fewest_bytes: no matrix in a format wider than the precision's own (a draft's weights; see
    kwker.precision.KEPT_WIDER)."""
    family, tied = family_of(config), is_tied(config, source)
    matrix_fmt, embed_fmt = PRECISIONS[precision].matrices, PRECISIONS[precision].embeddings
    used = {"lm_head.weight"} if tied else set()

    def take(name: str, needed_for: str):
        if name not in source.names:
            raise BadModelFile(
                f"{source.description}: tensor {name} is missing (the model needs it for "
                f"{needed_for})"
            )
        used.add(name)
        return source.tensor(name)

    for spec in family.weights(config, tied=tied):
        t = take(spec.source, spec.native)
        try:
            if spec.kind == "norm":
                values = family.norm_values(t.float32().reshape(-1))
                step.set_norm(spec.native, values)
                if recording is not None:
                    recording.norm(spec.native, values)
                continue
            if len(t.shape) != 2:
                raise ValueError(f"has shape {list(t.shape)}, a matrix is 2-D")
            raw, n = t.raw, t.shape[0]
            if spec.rows is not None:  # a part of a fused matrix: whole rows of its bytes
                a, b = spec.rows
                raw, n = raw.reshape(t.shape[0], -1)[a:b].reshape(-1), b - a
            bias = None if spec.bias is None else take(spec.bias, spec.native).float32()
            if bias is not None and spec.rows is not None:
                bias = bias[spec.rows[0] : spec.rows[1]]
            fmt = embed_fmt if spec.native in ("embed", "lm_head") else matrix_fmt
            fmt = kept_format(fmt, t.type_name, t.shape[1], embedding=spec.native == "embed",
                              wider=not fewest_bytes)  # fmt: skip
            step.set_matrix_ggml(spec.native, raw, t.ggml_type, n, t.shape[1],
                                 getattr(_native.WType, fmt), bias, t.row_order)  # fmt: skip
            fmt = step.matrix_format(spec.native).name  # Q4K may have been packed as Q4
            if recording is not None:
                recording.matrix(spec.native, fmt, (n, t.shape[1]), bias)
        except ValueError as e:
            raise BadModelFile(
                f"{source.description}: tensor {spec.source} ({t.type_name}): {e}"
            ) from None
        finally:
            source.release(spec.source)
    left = sorted(source.names - used)
    if left:
        raise BadModelFile(
            f"{source.description}: tensors {', '.join(left[:5])}{' ...' if len(left) > 5 else ''}"
            f" are not part of a {config.model_type} model as kwker reads it"
        )
    step.check_complete()


__all__ = ["build_step", "check_tensor_table", "empty_step", "family_of", "own_precision"]
