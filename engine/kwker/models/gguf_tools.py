"""GGUF files of the same weights in another format, for running llama.cpp side by side with Kwker.

`requantize(src, dst, fmt)` keeps every metadata key (tokenizer, chat template, hyper-parameters)
and re-encodes each 2-D tensor with the `gguf` package's reference quantizers (F32, BF16, Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1); 1-D tensors (norms) stay F32 as llama.cpp's own converter keeps them.
`llama_quantize(src, dst, fmt)` has llama.cpp's own quantizer (the llama-quantize tool's recipe,
through llama-cpp-python) write fmt instead: it picks some tensors' types itself, e.g. Q8_0 for a
tied embedding whose rows are not a multiple of 256 (SmolLM2, Qwen2.5 0.5B).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import numpy as np

FORMATS = {
    "F32": ("F32", "ALL_F32"),
    "BF16": ("BF16", "MOSTLY_BF16"),
    "Q8_0": ("Q8_0", "MOSTLY_Q8_0"),
    "Q4_0": ("Q4_0", "MOSTLY_Q4_0"),
    "Q4_1": ("Q4_1", "MOSTLY_Q4_1"),
    "Q5_0": ("Q5_0", "MOSTLY_Q5_0"),
    "Q5_1": ("Q5_1", "MOSTLY_Q5_1"),
}
SKIP_KEYS = {
    "general.architecture",
    "general.file_type",
    "GGUF.version",
    "GGUF.tensor_count",
    "GGUF.kv_count",
}


def requantize(src: Path, dst: Path, fmt: str) -> Path:
    import gguf
    from gguf.quants import dequantize, quantize

    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if dst.exists():
        return dst
    qtype = gguf.GGMLQuantizationType[FORMATS[fmt][0]]
    reader = gguf.GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    tmp = dst.with_suffix(".partial")
    writer = gguf.GGUFWriter(tmp, arch)
    for key, field in reader.fields.items():
        if key in SKIP_KEYS:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY and len(field.types) > 1 else None
        writer.add_key_value(key, field.contents(), vtype, sub_type=sub)
    writer.add_file_type(int(gguf.LlamaFileType[FORMATS[fmt][1]]))
    for t in reader.tensors:
        data = dequantize(t.data, t.tensor_type).astype(np.float32)
        if data.ndim >= 2 and qtype != gguf.GGMLQuantizationType.F32:
            writer.add_tensor(t.name, quantize(data, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(t.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.replace(dst)
    return dst


LLAMA_FTYPES = {
    "Q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
    "Q4_1": "LLAMA_FTYPE_MOSTLY_Q4_1",
    "Q8_0": "LLAMA_FTYPE_MOSTLY_Q8_0",
    # the K-quant recipes (gguf-py has no K-quant quantizer)
    "Q2_K": "LLAMA_FTYPE_MOSTLY_Q2_K",
    "Q3_K_M": "LLAMA_FTYPE_MOSTLY_Q3_K_M",
    "Q4_K_M": "LLAMA_FTYPE_MOSTLY_Q4_K_M",
    "Q5_K_M": "LLAMA_FTYPE_MOSTLY_Q5_K_M",
    "Q6_K": "LLAMA_FTYPE_MOSTLY_Q6_K",
    # the i-quant and ternary recipes; llama.cpp refuses IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S and IQ1_M
    # without an importance matrix, which llama-cpp-python cannot compute, and IQ3_XXS where its
    # recipe gives some tensors IQ2_S (Qwen2.5-Coder-1.5B's attn_k; not SmolLM2's)
    "IQ4_NL": "LLAMA_FTYPE_MOSTLY_IQ4_NL",
    "IQ4_XS": "LLAMA_FTYPE_MOSTLY_IQ4_XS",
    "IQ3_S": "LLAMA_FTYPE_MOSTLY_IQ3_S",
    "IQ3_XXS": "LLAMA_FTYPE_MOSTLY_IQ3_XXS",
    "IQ2_S": "LLAMA_FTYPE_MOSTLY_IQ2_S",
    "IQ2_XS": "LLAMA_FTYPE_MOSTLY_IQ2_XS",
    "IQ2_XXS": "LLAMA_FTYPE_MOSTLY_IQ2_XXS",
    "IQ1_M": "LLAMA_FTYPE_MOSTLY_IQ1_M",
    "IQ1_S": "LLAMA_FTYPE_MOSTLY_IQ1_S",
    "TQ2_0": "LLAMA_FTYPE_MOSTLY_TQ2_0",
    "TQ1_0": "LLAMA_FTYPE_MOSTLY_TQ1_0",
}


def llama_quantize(src: Path, dst: Path, fmt: str, threads: int = 0) -> Path:
    """dst: src quantized to fmt by llama.cpp's quantizer with its default recipe (already quantized
    source tensors are dequantized first). Its log goes to a file that a failure's message
    quotes."""
    import ctypes

    import llama_cpp

    if fmt not in LLAMA_FTYPES:
        raise ValueError(f"format must be one of {', '.join(LLAMA_FTYPES)}, got {fmt!r}")
    if dst.exists():
        return dst
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, LLAMA_FTYPES[fmt])
    params.nthread = threads
    params.allow_requantize = True
    tmp = dst.with_suffix(".partial")
    with tempfile.TemporaryFile() as log:  # llama.cpp prints a line per tensor on the C streams
        sys.stdout.flush(), sys.stderr.flush()
        saved = [os.dup(1), os.dup(2)]
        try:
            for fd in (1, 2):
                os.dup2(log.fileno(), fd)
            rc = llama_cpp.llama_model_quantize(
                str(src).encode(), str(tmp).encode(), ctypes.byref(params)
            )
        finally:
            for fd, old in zip((1, 2), saved, strict=True):
                os.dup2(old, fd)
                os.close(old)
        if rc != 0:
            tmp.unlink(missing_ok=True)
            log.seek(0)
            tail = log.read().decode(errors="replace").strip().splitlines()[-5:]
            raise RuntimeError(
                f"llama.cpp could not quantize {src} to {fmt} (code {rc}): " + " / ".join(tail)
            )
    tmp.replace(dst)
    return dst
