"""KwkDecoder: a Hugging Face causal LM's whole decoding step as one native call.

    dec = KwkDecoder(model, max_cache_len=256)
    out = dec.generate(torch.tensor([[1, 5, 7, 9]]), max_new_tokens=8)   # greedy: prompt + 8 tokens

Weights are copied once, at construction, into native buffers in the chosen precision; after that the decoder
needs only the model's config (the float model can be freed). The KV cache is preallocated to max_cache_len and
reused between calls whose prompt extends the previous text, so a chat turn reads only its new tokens.

KwkDecoder builds the native step; the generation API over it is StepDecoder's (kwker.generation).
Also here: install / uninstall (model.generate on a KwkDecoder, see kwker.hf_generate) and
kwker.compiled.Decoder.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import numpy as np
import torch

from kwker import _native
from kwker.compiled import Decoder
from kwker.cpu_backend import best_isa, decoder_available
from kwker.families import family_for, supported_model_types
from kwker.generation import StepDecoder
from kwker.hf_generate import attach, installed, uninstall
from kwker.precision import FORMATS, PRECISIONS, checked, own_precision
from kwker.runner import DEFAULT_LOGIT_ROWS, DEFAULT_STEP_TOKENS

# The KV cache's element type: kv_cache="fp16" halves its memory and the bytes attention reads per token (at 2000
# tokens of context SmolLM2's float32 cache is as many bytes as its int4 weights); "fp32" keeps keys and values
# exact. By default fp16, except at precision fp32, which matches transformers' float32 attention.
KV_CACHE_TYPES = ("fp32", "fp16")


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def trim_memory() -> None:
    """Returns the C heap's free pages to the system (glibc's malloc_trim; elsewhere nothing). Call it once the
    float model has been let go: the blocks it freed sit in the middle of the heap and would otherwise stay
    resident (perf-notes #4)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c")) if os.name == "posix" else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def runner_unsupported(model, max_cache_len: int) -> str | None:
    """None when KwkDecoder can run `model` with a cache of max_cache_len tokens, else the reason it can't."""
    if not isinstance(max_cache_len, int) or isinstance(max_cache_len, bool) or max_cache_len < 1:
        return f"max_cache_len must be a positive integer, got {max_cache_len!r}"
    family = family_for(model)
    if family is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return (
            f"model type {model_type!r} ({type(model).__name__}) is not supported natively (supported: "
            f"{', '.join(supported_model_types())}); kwker.compiled.Decoder runs any causal LM"
        )
    return family.unsupported(model, max_cache_len)


def _to_native_array(t: torch.Tensor, fmt: str) -> np.ndarray:
    """The array the native loader takes for format fmt: float32 (F32, and Q8/Q4, which it quantizes itself) or
    the uint16 bits of bf16 / fp16."""
    dtype = getattr(torch, FORMATS[fmt].array)
    t = t.detach().to(dtype).contiguous()
    if dtype == torch.float32:
        return t.numpy()
    return t.view(torch.int16).numpy().view(np.uint16)


class KwkDecoder(StepDecoder):
    def __init__(
        self,
        model,
        max_cache_len: int,
        precision: str | None = None,
        threads: int | None = None,
        max_batch: int = 1,
        max_step_tokens: int = DEFAULT_STEP_TOKENS,
        tokenizer=None,
        kv_cache: str | None = None,
    ):
        reason = runner_unsupported(model, max_cache_len)
        if reason is not None:
            raise ValueError(f"KwkDecoder cannot run {type(model).__name__}: {reason}")
        if not decoder_available():
            raise RuntimeError(
                f"this CPU has no supported SIMD kernels (best: {_native.isa_best()}); "
                "KwkDecoder needs AVX2+FMA+F16C or AVX-512"
            )
        precision = checked(precision)
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        if kv_cache is not None and kv_cache not in KV_CACHE_TYPES:
            raise ValueError(f"kv_cache must be None, 'fp32' or 'fp16', got {kv_cache!r}")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        family = family_for(model)
        precision = precision or own_precision(model.model.embed_tokens.weight.dtype)
        matrix_fmt, embed_fmt = PRECISIONS[precision].matrices, PRECISIONS[precision].embeddings

        cfg = family.native_config(model)
        cfg["wtype"] = getattr(_native.WType, matrix_fmt)
        self.kv_cache = kv_cache or ("fp32" if precision == "fp32" else "fp16")
        cfg["kv_f16"] = self.kv_cache == "fp16"
        cos, sin = family.rope_tables(model.config, max_cache_len)
        cfg["rope_dim"] = (
            2 * cos.shape[-1]
        )  # the table's width: partial rotary models rotate fewer dims
        step = _native.Model(
            cfg,
            cos,
            sin,
            max_cache_len,
            max_batch,
            min(max_step_tokens, max_cache_len),
            DEFAULT_LOGIT_ROWS,
            threads or default_threads(),
            best_isa(),
        )
        with torch.no_grad():
            for name, w, bias in family.weights(model):
                if w.dim() == 1:
                    step.set_norm(name, w.detach().float().numpy())
                else:
                    fmt = embed_fmt if name in ("embed", "lm_head") else matrix_fmt
                    step.set_matrix(
                        name,
                        _to_native_array(w, fmt),
                        getattr(_native.WType, fmt),
                        None if bias is None else bias.numpy(),
                    )
        step.check_complete()
        super().__init__(model, step, precision, tokenizer)


def install(
    model,
    max_cache_len: int = 2048,
    precision: str | None = None,
    threads: int | None = None,
    draft=None,
):
    """Routes model.generate through a KwkDecoder built now (raises ValueError if the model cannot
    run); see kwker.hf_generate. uninstall(model) undoes it.

    draft: a small model with the same tokenizer; it is installed too and, for greedy calls that
    name no assistant of their own, passed to transformers' assisted generation as assistant_model
    (both models then run natively; greedy output is unchanged, as transformers guarantees for
    assisted greedy decoding)."""
    if installed(model):
        uninstall(model)
    decoder = KwkDecoder(model, max_cache_len=max_cache_len, precision=precision, threads=threads)
    if draft is not None:
        install(draft, max_cache_len=max_cache_len, precision=precision, threads=threads)
        decoder.check_draft(draft._kwker_decoder)
    return attach(model, decoder, draft)


__all__ = ["Decoder", "KwkDecoder", "install", "runner_unsupported", "uninstall"]
