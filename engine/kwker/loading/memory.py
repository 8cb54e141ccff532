"""How much memory a model takes to run in Kwker, from its configuration alone, itemized. The
estimate reads no weights and imports neither torch nor the native module (facts_from_files reads
a file's header and tensor table through kwker.loading):

    facts = facts_from_files(path)              # or facts_from_config(config_json), ModelFacts(...)
    est = facts.estimate("int4", context=4096)  # precision "auto": the model's own
    est.total, est.describe()  # bytes; "needs 391 MB at int4: weights 99 MB, KV cache (fp16) ..."

The parts, each as the native step (native/src/model/model.cpp) lays out its memory:
- weights: every matrix packed at the precision's format (embedding and lm_head at its embedding
  format; a tied lm_head is the embedding, counted once), as panel_bytes sizes them, placed into the
  step's weight chunks (Model::weight_space: 64 MB or more each, in transparent huge pages, so each
  chunk is resident up to its last whole huge page); biases and norms as float32.
- kv_cache: K and V per layer and KV head, fp16 except at fp32 precision (kwker.loading.build),
  head_dim padded to 32 and positions to 16. Its pages are resident only where written
  (perf-notes #6): `tokens` says how many positions are held (default: the whole context, which is
  what a chat needs once it fills the context).
- scratch: the step's activation rows (max_step_tokens of them: a long prompt touches all), the
  rows of logits a speculative verify returns, attention scores per thread and the rope tables.
- tokenizer: the tokenizer of the vocabulary (kwker.loading.tokenizer's, read back from the cache).
- runtime: the app process before any model.

The tokenizer and runtime figures are measured (see their constants), the rest is computed. tests/
engine/test_memory_estimate.py checks the total against the RSS of the app's process.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kwker.precision import FORMATS, PRECISIONS, checked, kept_format, label
from kwker.precision import own_precision as dtype_precision

# ---- measured constants ------------------------------------------------------------------------

# The app's process before it loads a model: Python 3.11, numpy, PySide6 with its QApplication and
# the main window shown, the app's and the engine's modules, the tokenizers library and Jinja
# (kwker.loading.tokenizer's). Measured as VmRSS of a fresh process that imports and shows
# exactly that (QT_QPA_PLATFORM=offscreen, a store whose model does not exist, so nothing is
# loaded): 119 MB in three runs on this machine (x86-64 Linux, Python 3.11, PySide6 6.12; 148 MB
# when the tokenizer was transformers'; the window itself is 19 MB of it). tests/engine/
# test_memory_estimate.py measures it again (RUNTIME_CHILD) and checks this figure. A real display
# (xcb, wayland) instead of offscreen may add its own buffers.
RUNTIME_BYTES = 119_000_000

# A loaded tokenizer, per vocabulary entry: VmRSS after building it (then collecting the garbage)
# less before, in a process that had imported everything above. Byte-level BPE (SmolLM2, Qwen2.5:
# 49152 and 151936 entries) took 30 and 107 MB read back from the tokenizer saved in the cache
# (every load after the first; built from the GGUF, the first time, 20 and 53 MB); Gemma 3's
# SentencePiece vocabulary (262144 entries) 304 MB read back, 120 MB built.
TOKENIZER_BYTES_PER_ENTRY = {"bpe": 700, "spm": 1160}

# ---- the native step's layout (native/src/formats/formats.h, native/src/model/*.h) ---------------

PAD = 32  # kPad: activation rows and packed k are padded to it
PANEL = 16  # kPanel: rows per packed weight panel; KV positions per K panel
QBLOCK = 32  # kQBlock
MAX_ATTEND_ROWS = 6  # kMaxAttendRows
WEIGHT_CHUNK = 64 << 20  # Model::weight_space's smallest chunk
MAPPED = 1 << 20  # Buffer::kMappedBytes: from this size on, pages are resident where touched
PAGE = 4096
HUGE_PAGE = 2 << 20
# Rows of logits a step of the app's chats returns: a verify step returns the proposal's rows
# plus one, and prompt lookup proposes up to 8 tokens (StepDecoder.generate's default).
LOGIT_ROWS_USED = 9
# kwker.runner's DEFAULT_STEP_TOKENS and DEFAULT_LOGIT_ROWS (runner imports numpy; this module
# stays free of imports beyond the precision table)
STEP_TOKENS = 256
LOGIT_ROWS = 64


def _pad(n: int, m: int = PAD) -> int:
    return (n + m - 1) // m * m


def _up(n: int, page: int) -> int:
    return (n + page - 1) // page * page


def panel_bytes(fmt: str, n: int, k: int) -> int:
    """Bytes of an [n, k] matrix packed as `fmt` (pack.cpp panel_bytes)."""
    f = FORMATS[fmt]
    panels = _pad(n, PANEL) // PANEL
    if f.quantized:  # a block: PANEL rows of f.block weights
        return panels * (_pad(k) // f.block) * f.block_bytes * PANEL
    return panels * PANEL * _pad(k) * f.block_bytes


def _resident(allocated: int, used: int) -> int:
    """Resident bytes of a Buffer of `allocated` bytes whose first `used` are written: small ones
    come from the heap, zeroed whole; large ones are mappings, resident by the page."""
    return allocated if allocated < MAPPED else min(allocated, _up(used, PAGE))


def _huge_pages() -> bool:
    """Whether the kernel gives the weights' advised mappings huge pages (THP not "never")."""
    try:
        return "[never]" not in Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return False


def _threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


# ---- the estimate --------------------------------------------------------------------------------


def _size(n: float) -> str:
    return f"{n / 1e9:.1f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes a model takes to run, by part. `precision` is the one it runs at (the model's own
    resolved), `tokens` the positions its KV cache holds (the context, unless asked otherwise)."""

    precision: str
    context: int
    tokens: int
    kv_cache_type: str
    weights: int
    kv_cache: int
    scratch: int
    tokenizer: int
    runtime: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.scratch + self.tokenizer + self.runtime

    def parts(self) -> list[tuple[str, int]]:
        return [
            ("weights", self.weights),
            (f"KV cache ({self.kv_cache_type}) for {self.tokens} tokens", self.kv_cache),
            ("scratch", self.scratch),
            ("tokenizer", self.tokenizer),
            ("runtime", self.runtime),
        ]

    def describe(self) -> str:
        """'needs 0.4 GB at int4: weights 92 MB, KV cache (fp16) for 4096 tokens 94 MB, ...'"""
        items = ", ".join(f"{name} {_size(n)}" for name, n in self.parts())
        return f"needs {_size(self.total)} at {label(self.precision)}: {items}"


def estimate(
    config,
    precision: str | None,
    context: int,
    *,
    own: str | None = None,
    tied: bool | None = None,
    tokenizer: str = "bpe",
    types: dict | None = None,
    tokens: int | None = None,
    threads: int | None = None,
    n_slots: int = 1,
    max_step_tokens: int = STEP_TOKENS,
    kv_cache: str | None = None,
) -> MemoryEstimate:
    """The memory of `config` (a kwker.loading.config.ModelConfig) run at `precision` (None or
    "auto": `own`, the model's own) with a cache of `context` tokens, `tokens` of them held (None:
    all). tied: lm_head is the embedding (None: as the config says). tokenizer: "bpe" or "spm"
    (TOKENIZER_BYTES_PER_ENTRY). types: a GGUF's matrix types (matrix_sizes). The other options
    are load_files's."""
    resolved = checked(precision) or own
    if resolved is None:
        raise ValueError("the model's own precision is not known: name a precision")
    kv_cache = kv_cache or ("fp32" if resolved == "fp32" else "fp16")
    tokens = context if tokens is None else min(tokens, context)
    tied = bool(getattr(config, "tie_word_embeddings", False)) if tied is None else tied
    c = config
    hd, qd, kvd = _dims(c)
    return MemoryEstimate(
        precision=resolved,
        context=context,
        tokens=tokens,
        kv_cache_type=kv_cache,
        weights=_weights(c, resolved, tied, types),
        kv_cache=_kv_cache(
            c.num_hidden_layers * n_slots * c.num_key_value_heads, hd, context, tokens, kv_cache
        ),  # fmt: skip
        scratch=_scratch(config, hd, qd, kvd, context, tokens, threads, max_step_tokens),
        tokenizer=TOKENIZER_BYTES_PER_ENTRY[tokenizer] * c.vocab_size,
        runtime=RUNTIME_BYTES,
    )


def _dims(c) -> tuple[int, int, int]:
    """(head_dim, q width, kv width) of config c."""
    hd = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return hd, c.num_attention_heads * hd, c.num_key_value_heads * hd


LAYER_MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


def matrix_sizes(c, precision: str, tied: bool, types: dict | None = None) -> list[int]:
    """Packed bytes of each matrix of config c at `precision`, in the order a load sets them
    (the families' weights(): embedding, lm_head unless tied, then each layer's q, k, v, o, gate,
    up, down). types: a GGUF's type of each matrix by native name ("layers.0.q": "Q4_K"), for
    the formats that hold a type's blocks exactly (kwker.precision.kept_format)."""
    p = PRECISIONS[precision]
    _, qd, kvd = _dims(c)
    e, f, v = c.hidden_size, c.intermediate_size, c.vocab_size
    shapes = dict(q=(qd, e), k=(kvd, e), v=(kvd, e), o=(e, qd), gate=(f, e), up=(f, e), down=(e, f))
    named = [("embed", p.embeddings, v, e)] + ([] if tied else [("lm_head", p.embeddings, v, e)])
    named += [(f"layers.{i}.{m}", p.matrices, *shapes[m])
              for i in range(c.num_hidden_layers) for m in LAYER_MATRICES]  # fmt: skip
    types = types or {}
    return [
        panel_bytes(kept_format(fmt, types.get(name), k, embedding=name == "embed"), n, k)
        for name, fmt, n, k in named
    ]


def parameters(c, tied: bool) -> int:
    """The weights of config c's matrices (biases and norms aside), lm_head once when tied."""
    _, qd, kvd = _dims(c)
    e, f = c.hidden_size, c.intermediate_size
    layer = e * (2 * qd + 2 * kvd) + 3 * e * f
    return c.num_hidden_layers * layer + c.vocab_size * e * (1 if tied else 2)


def _weights(c, precision: str, tied: bool, types: dict | None) -> int:
    """The matrices placed in weight chunks in load order, resident up to each chunk's last
    touched page, plus biases and norms."""
    chunks: list[list[int]] = []  # [size, used]
    for b in matrix_sizes(c, precision, tied, types):
        b = _up(b, 64)
        if not chunks or chunks[-1][1] + b > chunks[-1][0]:
            chunks.append([max(b, WEIGHT_CHUNK), 0])
        chunks[-1][1] += b
    page = HUGE_PAGE if _huge_pages() else PAGE
    packed = sum(_up(used, page) for _, used in chunks)
    _, qd, kvd = _dims(c)
    layers, model_type = c.num_hidden_layers, getattr(c, "model_type", "")
    biased = model_type == "qwen2" or getattr(c, "attention_bias", False)
    bias = layers * 4 * (_pad(qd, PANEL) + 2 * _pad(kvd, PANEL)) if biased else 0
    norms_per_layer = 4 if model_type == "gemma3_text" else 2
    norms = 4 * c.hidden_size * (layers * norms_per_layer + 1)
    return packed + bias + norms


def _kv_cache(heads: int, hd: int, context: int, tokens: int, kv_cache: str) -> int:
    """K ([pos / 16][hdp][16] panels) and V ([pos][hdp]) of every (slot, layer, KV head), each a
    region of the two mappings, written from its start."""
    elem = 2 if kv_cache == "fp16" else 4
    hdp = _pad(hd)
    region = _pad(context, PANEL) * hdp * elem
    if tokens >= context:
        return 2 * heads * region
    k_used = _pad(tokens, PANEL) * hdp * elem
    v_used = tokens * hdp * elem
    return heads * (min(region, _up(k_used, PAGE)) + min(region, _up(v_used, PAGE)))


def _scratch(c, hd, qd, kvd, context, tokens, threads, max_step_tokens) -> int:
    """The step's buffers (Model::Model), each resident for the rows a step writes."""
    steps = min(max_step_tokens, context)
    rows = min(steps, max(tokens, 1))
    ep, qp, kvp, fp, hdp = (
        _pad(c.hidden_size),
        _pad(qd),
        _pad(kvd),
        _pad(c.intermediate_size),
        _pad(hd),
    )
    per_row = [ep, ep, qp, kvp, kvp, c.num_attention_heads * hdp, qp, fp, fp]  # x ... up, floats
    total = sum(_resident(4 * steps * w, 4 * rows * w) for w in per_row)
    widest = max(ep, qp, fp)
    total += _resident(steps * widest, rows * widest)  # int8 activations
    total += 2 * _resident(4 * steps * widest // QBLOCK, 4 * rows * widest // QBLOCK)
    # the same for the Int8Super activations of Q4K matrices (int8, a float per 256, an int16 per
    # 32), counted as written: a few KB a row
    total += _resident(steps * widest, rows * widest)
    total += _resident(4 * steps * (widest // 256 + 1), 4 * rows * (widest // 256 + 1))
    total += _resident(2 * steps * widest // QBLOCK, 2 * rows * widest // QBLOCK)
    out_rows = min(LOGIT_ROWS, steps)
    vocab_row = 4 * _pad(c.vocab_size)
    total += _resident(out_rows * vocab_row, min(out_rows, LOGIT_ROWS_USED) * vocab_row)
    t = threads or _threads()
    total += _resident(
        4 * 2 * t * MAX_ATTEND_ROWS * _pad(context), 4 * 2 * t * MAX_ATTEND_ROWS * _pad(tokens)
    )
    total += 4 * 2 * t * MAX_ATTEND_ROWS * hdp
    # rope: cos and sin, one table per rope kind (Gemma 3: local and global), copied in whole
    rotary = round(hd * (getattr(c, "partial_rotary_factor", None) or 1.0))
    kinds = len(set(getattr(c, "layer_types", None) or ())) if c.model_type == "gemma3_text" else 1
    total += 2 * 4 * max(kinds, 1) * context * (rotary // 2)
    return total


# ---- what a model is -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelFacts:
    """What the estimate needs to know of a model besides the precision and context it runs at:
    its config, the precision of its own weights (None: not known), whether lm_head is the
    embedding, its tokenizer kind."""

    config: object = field(repr=False)
    own: str | None
    tied: bool
    tokenizer: str = "bpe"
    # a GGUF's type of each matrix by native name (matrix_sizes); None for float files
    types: dict | None = field(default=None, repr=False, compare=False)

    def estimate(self, precision: str | None, context: int, **options) -> MemoryEstimate:
        return estimate(self.config, precision, context, own=self.own, tied=self.tied,
                        tokenizer=self.tokenizer, types=self.types, **options)  # fmt: skip


def _tokenizer_kind(config) -> str:
    # Gemma's vocabulary is SentencePiece's; the other families Kwker runs use byte-level BPE
    return "spm" if getattr(config, "model_type", "") == "gemma3_text" else "bpe"


def facts_from_config(config_json: dict) -> ModelFacts:
    """The facts of a model from its config.json's contents (a Hub repo's, a catalog entry's):
    its own precision from the dtype it states (transformers' torch_dtype or dtype)."""
    from kwker.loading.config import config_from_json

    config = config_from_json(config_json)
    own = dtype_precision(getattr(config, "dtype", None) or "float32")
    return ModelFacts(config, own, bool(getattr(config, "tie_word_embeddings", False)),
                      _tokenizer_kind(config))  # fmt: skip


def facts_from_files(path) -> ModelFacts:
    """The facts of a model's files (a .gguf file or a safetensors folder), from their header and
    tensor table: the precision load_files gives "the model's own", and whether lm_head is
    stored (a GGUF leaves it out when it is the embedding)."""
    from kwker.loading.build import is_tied, own_precision
    from kwker.loading.load import open_files

    config, source, _, _, _ = open_files(Path(path).expanduser())
    if path_is_gguf(path):
        return _gguf_facts(config, source)
    return ModelFacts(config, own_precision(source), is_tied(config, source),
                      _tokenizer_kind(config))  # fmt: skip


def facts_from_gguf(gguf) -> ModelFacts:
    """The facts of a GGUF model from its header alone (kwker.loading.gguf_file.GgufFile; a
    split model's merged one): what kwker.models.gguf_repo reads from the Hub."""
    from kwker.loading.build import check_tensor_table
    from kwker.loading.config import config_from_gguf
    from kwker.loading.sources import GgufSource

    config = config_from_gguf(gguf)
    source = GgufSource(gguf, config)  # maps no file: only the header is asked
    check_tensor_table(config, source)
    return _gguf_facts(config, source)


def _gguf_facts(config, source) -> ModelFacts:
    from kwker.loading.build import family_of, is_tied, own_precision

    # llama.cpp names the tokenizer's kind: "gpt2" (BPE) or "llama" (SPM)
    kind = source.file.metadata.get("tokenizer.ggml.model")
    tokenizer = {"gpt2": "bpe", "llama": "spm"}.get(kind, _tokenizer_kind(config))
    tied = is_tied(config, source)
    types = {w.native: source.type_name(w.source)
             for w in family_of(config).weights(config, tied=tied) if w.kind != "norm"}  # fmt: skip
    return ModelFacts(config, own_precision(source), tied, tokenizer, types)


def path_is_gguf(path) -> bool:
    return Path(path).expanduser().is_file()


__all__ = [
    "MemoryEstimate",
    "ModelFacts",
    "estimate",
    "facts_from_config",
    "facts_from_files",
    "facts_from_gguf",
    "parameters",
]
