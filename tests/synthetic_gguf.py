"""Synthetic GGUF files with real models' shapes: random but valid quantized weights, in seconds.

The 8B-class load test needs a file of Llama-3.1-8B's size and layout, not its knowledge: the real
model would take a 16 GB download and a quantization pass, while random bytes are already valid
blocks of every ggml type once their fp16 scale fields hold small positive values (every other
field is an integer bit-field, where any bit pattern decodes to a finite number). Tensors are
generated and written a chunk of rows at a time, so the writer's memory stays near one chunk
whatever the file's size.

    python tests/synthetic_gguf.py /tmp/kwker-8b/llama-3.1-8b-Q4_K.gguf \
        --shape llama-3.1-8b --matrix-type Q4_K [--layers 4] [--seed 0]

The metadata and tensor names are those llama.cpp's converter writes for the llama architecture,
including the `rope_freqs.weight` tensor it stores for Llama 3's RoPE scaling, and a byte-level
BPE tokenizer that loads.
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    context: int
    rope_theta: float
    rms_eps: float
    # Llama 3's rope_scaling: factor, low_freq_factor, high_freq_factor and
    # original_max_position_embeddings
    rope_llama3: tuple[float, float, float, int] | None
    # The last `n_control` ids are control tokens (Llama 3 keeps its 256 at 128000-128255)
    n_control: int


SHAPES = {
    "llama-3.1-8b": Shape(
        name="llama-3.1-8b",
        layers=32,
        hidden=4096,
        intermediate=14336,
        heads=32,
        kv_heads=8,
        head_dim=128,
        vocab=128256,
        context=131072,
        rope_theta=500000.0,
        rms_eps=1e-5,
        rope_llama3=(8.0, 1.0, 4.0, 8192),
        n_control=256,
    ),
    "tiny": Shape(
        name="tiny",
        layers=2,
        hidden=256,
        intermediate=512,
        heads=8,
        kv_heads=2,
        head_dim=32,
        vocab=1024,
        context=2048,
        rope_theta=500000.0,
        rms_eps=1e-5,
        rope_llama3=(8.0, 1.0, 4.0, 8192),
        n_control=16,
    ),
}

# One type for every matrix (as `llama-quantize --pure` writes), or the Q4_K_M-like mix
MATRIX_TYPES = tuple(
    "F32 F16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 Q4_K Q5_K Q6_K Q4_K_M IQ4_NL IQ4_XS IQ3_S IQ3_XXS IQ2_S "
    "IQ2_XS IQ2_XXS IQ1_M IQ1_S TQ2_0 TQ1_0".split()
)

# general.file_type as llama.cpp names a file of mostly that type (a pure K-quant file: its _S)
FILE_TYPES = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "Q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S,
    "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_S,
    "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
    "Q4_K_M": gguf.LlamaFileType.MOSTLY_Q4_K_M,
    **{t: gguf.LlamaFileType[f"MOSTLY_{t}"] for t in MATRIX_TYPES if t.startswith(("IQ", "TQ"))},
}

# The fp16 fields of each block type: byte offset in the block -> the uniform range its values are
# drawn from. These are all the float fields the decoders read (tests check that zeroing them zeroes
# the whole tensor), laid out as ggml's block_q* structs (and gguf.quants' dequantizers) have them:
#   Q8_0 {d, qs[32]}  Q4_0 {d, qs[16]}  Q4_1 {d, m, qs[16]}
#   Q5_0 {d, qh[4], qs[16]}  Q5_1 {d, m, qh[4], qs[16]}
#   Q4_K {d, dmin, scales[12], qs[128]}  Q5_K {d, dmin, scales[12], qh[32], qs[128]}
#   Q6_K {ql[128], qh[64], scales[16] (int8), d}
#   IQ4_NL {d, qs[16]}, and every other i-quant {d, ...}
#   TQ1_0 {qs[48], qh[4], d}  TQ2_0 {qs[64], d}
# (IQ1_M has no fp16 field: IQ1_M_SCALE below.) The i-quants' other fields are bit-fields too: every
# grid index has exactly the bits of its grid's size, and any sign or scale bits are valid.
# The ranges put the largest weight near 0.1, as in real checkpoints, so that 32 random layers keep
# activations in range instead of multiplying them by tens per layer: Q8_0's quants reach 127 and
# the K-quants multiply d by a 6-bit (Q6_K: 8-bit) sub-scale, so their d is smaller. The K-quants'
# dmin is about d times half the quant range, which centres a block's values near zero; Q4_1/Q5_1's
# min is a block's lowest value.
SCALE_FIELDS: dict[Q, dict[int, tuple[float, float]]] = {
    Q.Q8_0: {0: (2e-4, 8e-4)},
    Q.Q4_0: {0: (1e-3, 1e-2)},
    Q.Q4_1: {0: (1e-3, 1e-2), 2: (-0.06, -0.04)},
    Q.Q5_0: {0: (1e-3, 5e-3)},
    Q.Q5_1: {0: (1e-3, 5e-3), 2: (-0.06, -0.04)},
    Q.Q4_K: {0: (5e-5, 1.5e-4), 2: (4e-4, 1e-3)},
    Q.Q5_K: {0: (2.5e-5, 7.5e-5), 2: (4e-4, 1e-3)},
    Q.Q6_K: {208: (1e-5, 3e-5)},
    # an i-quant's d multiplies a sub-scale (up to 32 in IQ4_XS, 31 in IQ3_S, 15.5 x 0.25 or 0.5
    # in IQ2_* / IQ3_XXS, 15 in IQ1_*) and a level (up to 127 in IQ4, 62 in IQ3_XXS, 43 in IQ2_*,
    # 1.125 in IQ1_*); the ternary types' d is the weight itself
    Q.IQ4_NL: {0: (2e-4, 8e-4)},
    Q.IQ4_XS: {0: (2e-5, 6e-5)},
    Q.IQ3_S: {0: (1.5e-4, 4e-4)},
    Q.IQ3_XXS: {0: (2e-4, 5e-4)},
    Q.IQ2_S: {0: (5e-4, 1.5e-3)},
    Q.IQ2_XS: {0: (5e-4, 1.5e-3)},
    Q.IQ2_XXS: {0: (5e-4, 1.5e-3)},
    Q.IQ1_S: {0: (3e-3, 8e-3)},
    Q.TQ2_0: {64: (0.02, 0.05)},
    Q.TQ1_0: {52: (0.02, 0.05)},
}
# IQ1_M {qs[32], qh[16], scales[4] (uint16)}: its fp16 d is the top nibbles of the scale words
# (d's low nibble in the first word's top), as IQ1_S's d draws
IQ1_M_SCALE = (48, (3e-3, 8e-3))
FLOAT_STD = 0.02  # F32/F16 matrices: normal weights of a real checkpoint's typical spread
CHUNK_BYTES = 32 << 20  # rows generated and written at a time: bounds the writer's memory


def matrix_type_of(name: str, matrix_type: str) -> Q:
    """The ggml type of the 2-D tensor `name` in a file of `matrix_type`.

    Q4_K_M here is a simplified llama.cpp recipe: llama.cpp gives attn_v and ffn_down Q6_K in about
    half the layers (its use_more_bits), this gives it in all of them; output.weight Q6_K, the rest
    Q4_K."""
    if matrix_type != "Q4_K_M":
        return Q[matrix_type]
    if name == "output.weight" or name.endswith((".attn_v.weight", ".ffn_down.weight")):
        return Q.Q6_K
    return Q.Q4_K


@dataclass(frozen=True)
class TensorSpec:
    name: str
    # numpy order: the last axis is ne[0], a row (the input dimension of a matrix)
    shape: tuple[int, ...]
    qtype: Q
    kind: str  # "matrix", "norm" or "rope_freqs"

    @property
    def ne(self) -> tuple[int, ...]:
        """The shape as GGUF stores it (ne[0] first)."""
        return tuple(reversed(self.shape))

    @property
    def row_bytes(self) -> int:
        block, size = gguf.GGML_QUANT_SIZES[self.qtype]
        return self.shape[-1] // block * size

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape[:-1]) * self.row_bytes


def resolve_shape(shape: str | Shape, layers: int | None = None) -> Shape:
    if isinstance(shape, str):
        if shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
        shape = SHAPES[shape]
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be at least 1, got {layers}")
        shape = replace(shape, layers=layers)
    return shape


def tensor_plan(shape: Shape, matrix_type: str) -> list[TensorSpec]:
    """Every tensor of the file in the order written (rope_freqs first, as llama.cpp's converter
    writes it)."""
    if matrix_type not in MATRIX_TYPES:
        raise ValueError(
            f"matrix type must be one of {', '.join(MATRIX_TYPES)}, got {matrix_type!r}"
        )
    q_dim, kv_dim = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim

    def matrix(name: str, rows: int, cols: int) -> TensorSpec:
        qtype = matrix_type_of(name, matrix_type)
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        if cols % block:
            raise ValueError(
                f"{name}: rows of {cols} are not a multiple of {qtype.name}'s block of {block}"
            )
        return TensorSpec(name, (rows, cols), qtype, "matrix")

    def norm(name: str) -> TensorSpec:
        return TensorSpec(name, (shape.hidden,), Q.F32, "norm")

    plan = []
    if shape.rope_llama3 is not None:
        plan.append(TensorSpec("rope_freqs.weight", (shape.head_dim // 2,), Q.F32, "rope_freqs"))
    plan.append(matrix("token_embd.weight", shape.vocab, shape.hidden))
    for i in range(shape.layers):
        b = f"blk.{i}"
        plan += [
            norm(f"{b}.attn_norm.weight"),
            matrix(f"{b}.attn_q.weight", q_dim, shape.hidden),
            matrix(f"{b}.attn_k.weight", kv_dim, shape.hidden),
            matrix(f"{b}.attn_v.weight", kv_dim, shape.hidden),
            matrix(f"{b}.attn_output.weight", shape.hidden, q_dim),
            norm(f"{b}.ffn_norm.weight"),
            matrix(f"{b}.ffn_gate.weight", shape.intermediate, shape.hidden),
            matrix(f"{b}.ffn_up.weight", shape.intermediate, shape.hidden),
            matrix(f"{b}.ffn_down.weight", shape.hidden, shape.intermediate),
        ]
    plan += [norm("output_norm.weight"), matrix("output.weight", shape.vocab, shape.hidden)]
    return plan


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """The head_dim/2 divisors of RoPE's inverse frequencies that llama.cpp's converter stores as
    rope_freqs.weight for Llama 3's scaling (transformers' _compute_llama3_parameters, inverted)."""
    factor, low, high, old_context = shape.rope_llama3
    dim = shape.head_dim
    freqs = 1.0 / (shape.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old_context / high:  # high frequencies: kept
            factors.append(1.0)
        elif wavelen > old_context / low:  # low frequencies: slowed down by the whole factor
            factors.append(factor)
        else:  # in between: a smooth blend of the two
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)


def random_blocks(rng: np.random.Generator, qtype: Q, n_blocks: int) -> np.ndarray:
    """n_blocks valid blocks of qtype, a (n_blocks, block bytes) uint8 array: random bits, sane fp16
    scales."""
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    blocks = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    # Every block size is even and every fp16 field 2-aligned: the fields are columns of a fp16 view
    halves = blocks.view(np.float16)
    if qtype == Q.IQ1_M:
        offset, (low, high) = IQ1_M_SCALE
        d = rng.uniform(low, high, size=n_blocks).astype(np.float16).view(np.uint16)
        words = blocks.view(np.uint16)[:, offset // 2 : offset // 2 + 4]
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((d >> (4 * i)) & 0xF) << 12)
        return blocks
    for offset, (low, high) in SCALE_FIELDS[qtype].items():
        halves[:, offset // 2] = rng.uniform(low, high, size=n_blocks).astype(np.float16)
    return blocks


def tensor_chunks(spec: TensorSpec, shape: Shape, rng: np.random.Generator):
    """The tensor's bytes, a C-contiguous array of whole rows (about CHUNK_BYTES) at a time."""
    if spec.kind == "rope_freqs":
        yield llama3_rope_factors(shape)
        return
    if spec.kind == "norm":
        # RMSNorm gains of a trained model sit around 1; positive: no channel flipped or zeroed
        yield rng.uniform(0.8, 1.2, size=spec.shape).astype(np.float32)
        return
    rows, cols = spec.shape
    step = max(1, CHUNK_BYTES // spec.row_bytes)  # read here: tests shrink it
    for start in range(0, rows, step):
        n = min(step, rows - start)
        if spec.qtype in (Q.F32, Q.F16):
            w = rng.standard_normal(size=(n, cols), dtype=np.float32) * np.float32(FLOAT_STD)
            yield w.astype(np.float16) if spec.qtype == Q.F16 else w
        else:
            yield random_blocks(
                rng, spec.qtype, n * spec.row_bytes // gguf.GGML_QUANT_SIZES[spec.qtype][1]
            )


# Llama 3.1's named control tokens at their offsets in its block of specials (at 128000 + i); the
# other offsets hold reserved tokens
LLAMA3_CONTROL = {
    0: "<|begin_of_text|>",
    1: "<|end_of_text|>",
    4: "<|finetune_right_pad_id|>",
    6: "<|start_header_id|>",
    7: "<|end_header_id|>",
    8: "<|eom_id|>",
    9: "<|eot_id|>",
    10: "<|python_tag|>",
}
# A few byte-level BPE merges whose results are in the vocabulary (Ġ is GPT-2's byte for a space)
MERGES = [
    ("Ġ", "t"),
    ("h", "e"),
    ("i", "n"),
    ("e", "r"),
    ("a", "n"),
    ("Ġ", "a"),
    ("o", "n"),
    ("r", "e"),
    ("Ġ", "s"),
    ("Ġt", "he"),
]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte as a printable character (what byte-level BPE
    vocabularies hold)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    bs = printable + [*range(ord("®"), ord("ÿ") + 1)]
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def tokenizer_vocab(shape: Shape) -> tuple[list[str], list[int]]:
    """Tokens and token types: the 256 byte tokens, the merges' results, unique fillers, then the
    control tokens."""
    tokens = list(bytes_to_unicode().values())
    tokens += [a + b for a, b in MERGES]
    n_regular = shape.vocab - shape.n_control
    if n_regular < len(tokens):
        raise ValueError(
            f"vocab {shape.vocab} is too small for {len(tokens)} byte and merge tokens"
        )
    # Fillers are never produced (no merge leads to them) but give the embedding and the output
    # their real row count
    tokens += [f"<filler_{i}>" for i in range(n_regular - len(tokens))]
    control = [
        LLAMA3_CONTROL.get(i, f"<|reserved_special_token_{i}|>") for i in range(shape.n_control)
    ]
    types = [int(gguf.TokenType.NORMAL)] * len(tokens)
    types += [int(gguf.TokenType.CONTROL)] * len(control)
    tokens += control
    assert len(set(tokens)) == len(tokens) == shape.vocab
    return tokens, types


def add_metadata(writer: gguf.GGUFWriter, shape: Shape, matrix_type: str) -> None:
    writer.add_type("model")
    writer.add_name(f"synthetic {shape.name} {matrix_type}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(shape.context)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.intermediate)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(int(FILE_TYPES[matrix_type]))
    if matrix_type not in ("F32", "F16"):
        writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    tokens, types = tokenizer_vocab(shape)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges([f"{a} {b}" for a, b in MERGES])
    first_control = shape.vocab - shape.n_control
    writer.add_bos_token_id(first_control)  # <|begin_of_text|>
    writer.add_eos_token_id(first_control + 9)  # <|eot_id|>
    writer.add_chat_template(CHAT_TEMPLATE)


def write_gguf(
    path: str | Path,
    shape: str | Shape = "tiny",
    matrix_type: str = "Q4_K",
    seed: int = 0,
    layers: int | None = None,
) -> Path:
    """Writes a synthetic GGUF of `shape` (a SHAPES name or a Shape) with matrices of
    `matrix_type` to `path`; returns `path`."""
    path = Path(path)
    shape = resolve_shape(shape, layers)
    plan = tensor_plan(shape, matrix_type)
    # A partial name until the last byte is written: an interrupted run leaves no file that looks
    # whole
    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(tmp, "llama")
    add_metadata(writer, shape, matrix_type)
    for spec in plan:
        if spec.qtype in (Q.F32, Q.F16):
            dtype = np.float32 if spec.qtype == Q.F32 else np.float16
            writer.add_tensor_info(spec.name, spec.shape, np.dtype(dtype), spec.nbytes)
        else:
            byte_shape = (*spec.shape[:-1], spec.row_bytes)
            writer.add_tensor_info(
                spec.name, byte_shape, np.dtype(np.uint8), spec.nbytes, raw_dtype=spec.qtype
            )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    # GGUFWriter.write_tensor_data takes a whole tensor at once (2 GB for the 8B's F32 embedding);
    # this writes the same bytes a chunk of rows at a time: the data section aligned, each tensor
    # padded to the alignment, in the order of the tensor infos whose offsets the writer has just
    # computed from those same sizes.
    fout = writer.fout[0]
    rng = np.random.default_rng(seed)
    for spec in plan:
        writer.write_padding(fout, fout.tell())
        written = 0
        for chunk in tensor_chunks(spec, shape, rng):
            fout.write(chunk.data)
            written += chunk.nbytes
        assert written == spec.nbytes, (spec.name, written, spec.nbytes)
        writer.write_padding(fout, spec.nbytes)
    writer.close()
    tmp.replace(path)
    return path


def split_gguf(src: str | Path, first: str | Path, max_tensors: int) -> list[Path]:
    """Writes the GGUF at `src` as a split model of at most `max_tensors` tensors a part, as
    llama.cpp's gguf-split does (gguf-py's writer names the parts after `first`'s stem:
    STEM-00001-of-0000N.gguf); returns the parts' paths."""
    reader = gguf.GGUFReader(src)
    first = Path(first)
    writer = gguf.GGUFWriter(first, reader.fields["general.architecture"].contents(),
                             split_max_tensors=max_tensors)  # fmt: skip
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    for t in reader.tensors:
        raw = t.tensor_type not in (Q.F32, Q.F16)
        writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type if raw else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return sorted(first.parent.glob(f"{first.stem}-*-of-*.gguf"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the .gguf file to write")
    parser.add_argument("--shape", choices=SHAPES, default="tiny")
    parser.add_argument("--matrix-type", choices=MATRIX_TYPES, default="Q4_K")
    parser.add_argument("--layers", type=int, default=None, help="override the shape's layer count")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    path = write_gguf(args.out, args.shape, args.matrix_type, seed=args.seed, layers=args.layers)
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kilobytes on Linux
    size = path.stat().st_size
    print(
        f"{path}: {size / 1e9:.3f} GB ({size} bytes) in {seconds:.1f} s, peak RSS {peak_mb:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
