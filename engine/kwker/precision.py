"""The one precision table: what each precision is called, shown as, stored in, costs, and is
benched against.

A precision says how the weights are stored once loaded and how their matmuls compute. Activations
are float32 everywhere but in "bf16-dot", whose matmuls round them to bf16 (the bf16 dot product,
below). Every part of Kwker reads it from here: the decoder (the native formats), the command line
(its choices, parsed before torch loads, so this module imports neither torch nor the native
module), the app (labels, "Model's own"), the model catalog (bytes per weight), `kwker bench` (the
GGUF formats llama.cpp runs beside each precision, the dtype transformers runs at) and the quality
table.

Format names are those of the native module's weight types (`kwker._native.WType.Q4`); the decoder
maps them there, where it makes the native call.
"""

from __future__ import annotations

from dataclasses import dataclass

# the model's own precision (its weights' dtype), as the app stores it (transformers' "auto")
AUTO = "auto"
AUTO_LABEL = "Model's own"


@dataclass(frozen=True)
class Format:
    """A native weight format: `block` weights take `block_bytes` bytes (see
    native/src/kernels/kernels.h)."""

    name: str  # the member of kwker._native.WType
    block: int
    block_bytes: int
    # the torch dtype of the array the native loader takes (it quantizes from float32 itself)
    array: str

    @property
    def quantized(self) -> bool:
        return self.block > 1

    @property
    def bytes_per_weight(self) -> float:
        return self.block_bytes / self.block


FORMATS = {
    f.name: f
    for f in (
        Format("F32", 1, 4, "float32"),
        Format("BF16", 1, 2, "bfloat16"),
        # bf16 in pairs along k for the bf16 dot product (VDPBF16PS), which also rounds the
        # activations to bf16
        Format("BF16P", 1, 2, "bfloat16"),
        Format("F16", 1, 2, "float16"),
        # blocks of 32 along the input dimension: Q8 = 32 int8 + an fp16 scale (8.5 bits per
        # weight), Q4 = 32 nibbles + an fp16 scale and min (5 bits)
        Format("Q8", 32, 34, "float32"),
        Format("Q4", 32, 20, "float32"),
        # ggml's Q4_K blocks: per 256 weights an fp16 scale and min and 8 six-bit sub-block
        # scales and mins, unpacked to a byte each (4.625 bits). A GGUF's Q4_K tensors are held
        # exactly; other weights are quantized to it (the native quantizer takes float32)
        Format("Q4K", 256, 148, "float32"),
        # ggml's Q6_K blocks held exactly (from a GGUF's Q6_K tensors): an fp16 scale and 16
        # int8 sub-block scales per 256 six-bit weights (6.5625 bits, as ggml's)
        Format("Q6K", 256, 210, "uint8"),
    )
}


# The native formats that hold a GGUF type's blocks exactly, used in place of the precision's own
# format for that type: a Q4_K matrix at int4 runs as Q4K (the file's numbers, 4.625 bits a
# weight) instead of being requantized to Q4 (5 bits); a Q6_K one as Q6K (6.5625 bits) at int4,
# where Q4 would lose two bits, and where Q8 would hold it (8.5 bits) only nearly, in more bytes.
KEPT_FORMATS = {("Q4", "Q4_K"): "Q4K", ("Q4", "Q6_K"): "Q6K", ("Q8", "Q6_K"): "Q6K"}
# Wider formats that hold a type exactly where the precision's own would lose bits: Q8 holds Q8_0's
# and Q5_0's blocks, which a Q4_K_M file gives to the matrices it keeps at more bits (its rows that
# are not whole super-blocks, some v). In 4 bits, Gemma 3 270M's mean KL from its file rose from
# 0.038 to 1.06 (perf-notes #49). A draft's weights skip them (kept_format's wider=False): its
# precision changes only how often the target agrees, and its bytes decide whether it pays.
KEPT_WIDER = {("Q4", "Q8_0"): "Q8", ("Q4", "Q5_0"): "Q8"}
# The embedding, besides: its rows are looked up, and multiplied only as a tied lm_head, so a Q4_K
# one is held as it is where its format is Q8 (int4's embeddings), not in 8.5 bits that only
# approximate it (Qwen2.5-Coder-1.5B Q4_K_M: mean KL 0.0132 -> 0.0125 from the file's weights,
# perf-notes #46).
KEPT_EMBEDDING_FORMATS = KEPT_FORMATS | {("Q8", "Q4_K"): "Q4K"}


# The GGUF types a precision's own format holds exactly: Q4's fp16 scale and min per 32 hold Q4_0's
# and Q4_1's blocks, Q8's fp16 scale Q8_0's.
OWN_TYPES = {"Q4": frozenset({"Q4_0", "Q4_1"}), "Q8": frozenset({"Q8_0"})}
# The format a layer's matrix takes in place of its precision's own when it must be quantized anyway
# (float weights, or a GGUF type that no format holds) and its rows are whole blocks of it: int4's
# Q4K. From the same weights Q4K's error is within 1% of Q4's in 7.5% fewer bytes (4.625 bits a
# weight against 5), and its matmul pays a float epilogue once per 256 weights, not per 32
# (perf-notes #48). The native loader still packs Q4 where a matrix's first rows show Q4 holding
# them better for its bytes: weights on Q4's grid (a Q4_0 or Q4_1 file's, dequantized by
# transformers), which Q4 holds exactly.
QUANTIZED_FORMATS = {"Q4": "Q4K"}


def kept_format(
    fmt: str, type_name: str | None, k: int, embedding: bool = False, wider: bool = True
) -> str:
    """The format a matrix of GGUF type `type_name` (None: float weights) with rows of k values
    packs as, when its precision's format is `fmt`; `embedding`: the model's embedding; `wider`:
    whether a wider format may hold the type exactly (KEPT_WIDER; not for a draft)."""
    table = KEPT_EMBEDDING_FORMATS if embedding else KEPT_FORMATS
    kept = table.get((fmt, type_name)) or (KEPT_WIDER.get((fmt, type_name)) if wider else None)
    if kept is not None and k % FORMATS[kept].block == 0:
        return kept
    better = QUANTIZED_FORMATS.get(fmt)
    if better and type_name not in OWN_TYPES[fmt] and k % FORMATS[better].block == 0:
        return better
    return fmt


@dataclass(frozen=True)
class Precision:
    name: str
    # the weights' number type in plain words, also accepted as a name for the precision
    weights: str
    label: str  # what the app shows
    matrices: str  # format of the layers' matrices
    embeddings: str  # format of the embedding and lm_head
    # `kwker bench --vs llama.cpp`: the GGUF formats written from the same weights and run beside
    # this precision; the matrix types of a source GGUF that it holds exactly (then that file runs
    # too, as it is: both engines read the same bytes); the formats llama.cpp's own quantizer also
    # writes
    gguf: tuple[str, ...] = ()
    gguf_kept: frozenset[str] = frozenset()
    llama_quantize: tuple[str, ...] = ()
    # the torch dtype of `--vs transformers` at this precision; None: no such peer
    transformers_dtype: str | None = None


# bf16 and bf16-dot hold the same bf16 weights and compute differently (perf-notes #22):
# - "bf16" (format BF16): the activations stay float32, one float32 FMA chain over k per output.
#   The bf16 weights exactly, nothing else rounded: what a bf16 model's own precision means
#   (README: activations are float32), and the closer to fp32 (SmolLM2-135M, 512 tokens: mean KL
#   0.00016 from fp32).
# - "bf16-dot" (format BF16P): the matmuls round the activations to bf16 and multiply pairs of k
#   with VDPBF16PS (AVX512_BF16: twice the multiply-adds of an fp32 FMA per instruction; other CPUs
#   compute the same bits with two FMAs per pair), as transformers' bfloat16 also rounds them.
#   Mean KL 0.00039, the same top-1 agreement (99.0%); faster where the matmuls are compute bound
#   (prefill, verify steps, batches on AVX-512 BF16), and on AVX2 for 1-8 rows.
# int4 runs against Q4_0 (symmetric, 4.5 bits: the usual llama.cpp peer) and Q4_1 (a scale and a
# min per block of 32, 5 bits: the same kind of format as kwker's Q4), and against the Q4_0 that
# llama.cpp's quantizer writes (it keeps a tied embedding whose rows are not a multiple of 256 at
# Q8_0, as int4 does).
# fmt: off
PRECISIONS = {p.name: p for p in (
    Precision("fp32", weights="float32", label="float32", matrices="F32", embeddings="F32",
              gguf=("F32",), gguf_kept=frozenset({"F32"}), transformers_dtype="float32"),
    Precision("bf16", weights="bfloat16", label="bfloat16", matrices="BF16", embeddings="BF16",
              gguf=("BF16",), gguf_kept=frozenset({"BF16"}), transformers_dtype="bfloat16"),
    Precision("bf16-dot", weights="bfloat16", label="bfloat16, bf16 dot products",
              matrices="BF16P", embeddings="BF16P", gguf=("BF16",), gguf_kept=frozenset({"BF16"}),
              transformers_dtype="bfloat16"),
    Precision("fp16", weights="float16", label="float16", matrices="F16", embeddings="F16"),
    Precision("balanced", weights="int8", label="Balanced (int8)", matrices="Q8", embeddings="Q8",
              gguf=("Q8_0",), gguf_kept=frozenset({"Q8_0", "Q6_K"})),
    Precision("int4", weights="int4", label="int4", matrices="Q4", embeddings="Q8",
              gguf=("Q4_0", "Q4_1"),
              gguf_kept=frozenset({"Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}),
              llama_quantize=("Q4_0",)),
)}
# fmt: on
NAMES = tuple(PRECISIONS)
# A number type names the first precision of that weight type ("bfloat16": "bf16")
ALIASES: dict[str, str] = {}
for _p in PRECISIONS.values():
    if _p.weights != _p.name:
        ALIASES.setdefault(_p.weights, _p.name)

# What a model is converted to at load to save memory: the app offers these beside the model's own,
# and the quality table scores them against fp32. fp16 is not among them: it has bf16's bytes with a
# narrower range (it overflows past 65504), so it runs as a model's own dtype or when asked for by
# name.
CONVERSIONS = ("bf16", "balanced", "int4")
# Precisions that store a conversion's weights and compute otherwise: the quality table scores them
# too, the app's memory fit does not list them apart (their bytes are a conversion's).
COMPUTATIONS = ("bf16-dot",)

# A draft model only proposes; its precision changes how often the target agrees, never the output.
# int4 makes its steps the cheapest, which is what decides whether it pays (perf-notes #1).
DRAFT = "int4"


def canonical(name: str | None) -> str | None:
    """The precision a name or alias stands for; None for None and AUTO (the model's own). Other
    names are returned as they are (see `checked`)."""
    if name == AUTO:
        return None
    return ALIASES.get(name, name)


def checked(name: str | None) -> str | None:
    """canonical(name), or a ValueError naming the choices."""
    precision = canonical(name)
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(
            f"precision must be None, {AUTO!r} or one of {', '.join(map(repr, NAMES))} (or "
            f"{', '.join(map(repr, ALIASES))}), got {name!r}"
        )
    return precision


def own_precision(dtype) -> str | None:
    """The precision of weights of this torch dtype (the dtype or its name); None when kwker has
    none."""
    floats: dict[str, str] = {}
    for p in PRECISIONS.values():
        if not FORMATS[p.matrices].quantized:
            floats.setdefault(p.weights, p.name)  # the first of a number type (bfloat16: bf16)
    return floats.get(str(dtype).removeprefix("torch."))


def label(name: str | None) -> str:
    """What the app shows for a precision (AUTO_LABEL for the model's own)."""
    precision = canonical(name)
    return AUTO_LABEL if precision is None else PRECISIONS[precision].label


def quantized(name: str | None) -> bool:
    """Whether the layers' matrices are quantized (their matmuls then use int8 dot products)."""
    precision = canonical(name)
    return precision is not None and FORMATS[PRECISIONS[precision].matrices].quantized


def weight_bytes(name: str | None) -> float:
    """Bytes per weight of the layers' matrices; 4 (float32, the most a model's own can take) for
    the model's own precision."""
    precision = canonical(name)
    return FORMATS[PRECISIONS[precision].matrices if precision else "F32"].bytes_per_weight
