"""The precision table: importable before torch (the command line parses its arguments first), its
formats' sizes as the native packer lays them out, and one vocabulary for names, aliases and the
model's own."""

import subprocess
import sys

import pytest

from kwker import precision
from kwker.precision import FORMATS, PRECISIONS


def test_the_table_imports_neither_torch_nor_the_native_module():
    code = (
        "import sys, kwker.precision, kwker.cli\n"
        "print([m for m in ('torch', 'kwker._native') if m in sys.modules])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_formats_match_the_native_weight_types():
    from kwker import _native

    assert set(FORMATS) == set(_native.WType.__members__)
    for p in PRECISIONS.values():
        assert p.matrices in FORMATS and p.embeddings in FORMATS


def test_bytes_per_weight():
    bits = {name: f.bytes_per_weight * 8 for name, f in FORMATS.items()}
    assert bits == {"F32": 32, "BF16": 16, "BF16P": 16, "F16": 16, "Q8": 8.5, "Q4": 5,
                    "Q4K": 4.625, "Q6K": 6.5625}  # fmt: skip
    from kwker import _native

    for name, b in bits.items():
        assert _native.bits_per_weight(getattr(_native.WType, name)) == b, name
    assert precision.weight_bytes("int4") == 20 / 32
    assert precision.weight_bytes(precision.AUTO) == precision.weight_bytes(None) == 4


def test_names_aliases_and_the_models_own():
    assert precision.NAMES == ("fp32", "bf16", "bf16-dot", "fp16", "balanced", "int4")
    assert precision.ALIASES == {
        "float32": "fp32",
        "bfloat16": "bf16",
        "float16": "fp16",
        "int8": "balanced",
    }
    assert precision.canonical("int8") == "balanced"
    assert precision.canonical(precision.AUTO) is None and precision.checked(None) is None
    with pytest.raises(ValueError, match="precision must be .*'int4'.*got 'int3'"):
        precision.checked("int3")
    assert (
        precision.canonical("int3") == "int3"
    )  # left to the caller, as the compiled Decoder words its error


def test_own_precision_of_torch_dtypes():
    import torch

    assert precision.own_precision(torch.bfloat16) == "bf16"
    assert precision.own_precision("float16") == "fp16"
    assert (
        precision.own_precision(torch.int8) is None
    )  # int8 names balanced, but int8 weights are not a model's
    assert precision.own_precision(torch.float64) is None


def test_labels_and_lists():
    assert precision.label(precision.AUTO) == "Model's own"
    assert [precision.label(p) for p in precision.CONVERSIONS] == [
        "bfloat16",
        "Balanced (int8)",
        "int4",
    ]
    assert all(precision.quantized(p) for p in ("balanced", "int4"))
    assert not any(precision.quantized(p) for p in (None, "fp32", "bf16", "fp16"))


def test_bf16_dot_is_bf16s_weights_computed_otherwise():
    """bf16-dot stores bf16's bytes (its own format: k in pairs) and is scored beside the
    conversions, but the number type bfloat16 and a bf16 model's own precision still name bf16
    (float32 activations)."""
    assert precision.COMPUTATIONS == ("bf16-dot",)
    assert precision.weight_bytes("bf16-dot") == precision.weight_bytes("bf16") == 2
    assert PRECISIONS["bf16-dot"].matrices == PRECISIONS["bf16-dot"].embeddings == "BF16P"
    assert precision.checked("bf16-dot") == "bf16-dot" and not precision.quantized("bf16-dot")
    assert precision.canonical("bfloat16") == precision.own_precision("bfloat16") == "bf16"


def test_gguf_peers():
    assert PRECISIONS["int4"].gguf == ("Q4_0", "Q4_1") and PRECISIONS["int4"].llama_quantize == (
        "Q4_0",
    )
    assert PRECISIONS["int4"].gguf_kept == {"Q4_1", "Q8_0", "Q5_0", "Q4_K", "Q6_K"}
    assert (
        PRECISIONS["fp16"].gguf == ()
    )  # no peer: `kwker bench --vs llama.cpp` says so and skips it


def test_a_ggufs_k_quants_keep_their_blocks():
    """int4 holds a Q4_K matrix as Q4K and a Q6_K one as Q6K (int8's Q8 would hold Q6_K only
    nearly, in more bytes), Q4_0 and Q4_1 as its own Q4, Q8_0 and Q5_0 as Q8. Float weights and the
    types no format holds are quantized to Q4K where the rows are whole super-blocks, else to the
    precision's own format."""
    kept = precision.kept_format
    assert kept("Q4", "Q4_K", 1536) == "Q4K" and kept("Q4", "Q6_K", 1536) == "Q6K"
    assert kept("Q8", "Q6_K", 256) == "Q6K" and kept("Q8", "Q4_K", 256) == "Q8"
    assert kept("Q4", "Q4_1", 256) == "Q4" and kept("Q4", "Q4_0", 512) == "Q4"
    assert kept("Q4", "Q5_K", 256) == "Q4K" and kept("Q4", None, 256) == "Q4K"
    assert kept("Q4", "Q8_0", 4864) == "Q8" and kept("Q4", "Q5_0", 640) == "Q8"
    assert kept("Q4", "Q5_1", 4864) == "Q4K" and kept("Q4", None, 576) == "Q4"
    assert kept("Q8", None, 256) == "Q8" and kept("Q8", "Q5_0", 256) == "Q8"
    assert kept("BF16", "Q4_K", 256) == "BF16" and kept("Q4", "Q4_K", 288) == "Q4"
    # an embedding is looked up: a Q4_K one stays Q4K where its precision would take Q8
    assert kept("Q8", "Q4_K", 256, embedding=True) == "Q4K"
