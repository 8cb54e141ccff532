"""KwkDecoder: a Hugging Face causal LM's whole decoding step as one native call.

    dec = KwkDecoder(model, max_cache_len=256)
    out = dec.generate(torch.tensor([[1, 5, 7, 9]]), max_new_tokens=8)   # greedy: prompt + 8 tokens

Weights are copied once, at construction, into native buffers in the chosen precision; after that
the decoder needs only the model's config (the float model can be freed). The KV cache is
preallocated to max_cache_len and reused between calls whose prompt extends the previous text, so
a chat turn reads only its new tokens.

KwkDecoder builds the native step; the generation API over it is StepDecoder's (kwker.generation).
Also here: install / uninstall (model.generate on a KwkDecoder, see kwker.hf.generate) and
unsupported_reason (why a model cannot run natively). kwker.hf.compiled.CompiledDecoder runs the
models it turns away.
"""

from __future__ import annotations

import torch

from kwker.families import family_for, supported_model_types
from kwker.generation import StepDecoder
from kwker.hf.generate import attach, installed, uninstall
from kwker.loading.build import build_step
from kwker.loading.sources import TorchSource, torch_storage_type
from kwker.precision import checked
from kwker.runner import DEFAULT_STEP_TOKENS


def unsupported_reason(model, max_cache_len: int) -> str | None:
    """Why KwkDecoder cannot run `model` with a cache of max_cache_len tokens (its family, its
    dtype, a rope or activation the native step lacks, a cache longer than its positions), or
    None when it can."""
    if not isinstance(max_cache_len, int) or isinstance(max_cache_len, bool) or max_cache_len < 1:
        return f"max_cache_len must be a positive integer, got {max_cache_len!r}"
    family = family_for(model)
    if family is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return (
            f"model type {model_type!r} ({type(model).__name__}) is not supported natively "
            f"(supported: {', '.join(supported_model_types())}); kwker.hf.CompiledDecoder runs "
            "any causal LM"
        )
    if not hasattr(model, "model") or not hasattr(model, "lm_head"):
        return f"{type(model).__name__} is not a causal LM with a language-model head"
    dtype = model.model.embed_tokens.weight.dtype
    if torch_storage_type(dtype) is None:
        return f"weights of dtype {dtype} are not supported (float32, bfloat16, float16)"
    return family.unsupported(model.config, max_cache_len)


class KwkDecoder(StepDecoder):
    """The native step of a Hugging Face model object, its weights packed at `precision` (None:
    the model's own dtype). The same weights from files (kwker.loading) pack the same bytes: both
    go through kwker.loading.build. kv_cache: "fp16" (the default, except at precision fp32)
    halves the KV cache and the bytes attention reads; "fp32" keeps keys and values exact."""

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
        reason = unsupported_reason(model, max_cache_len)
        if reason is not None:
            raise ValueError(f"KwkDecoder cannot run {type(model).__name__}: {reason}")
        precision = checked(precision)
        with torch.no_grad():
            step, precision, self.kv_cache = build_step(
                model.config, TorchSource(model), precision, max_cache_len, threads=threads,
                max_batch=max_batch, max_step_tokens=max_step_tokens, kv_cache=kv_cache,
            )  # fmt: skip
        super().__init__(model, step, precision, tokenizer)


def install(
    model,
    max_cache_len: int = 2048,
    precision: str | None = None,
    threads: int | None = None,
    draft=None,
):
    """Routes model.generate through a KwkDecoder built now (raises ValueError if the model cannot
    run); see kwker.hf.generate. uninstall(model) undoes it.

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


__all__ = ["KwkDecoder", "install", "uninstall", "unsupported_reason"]
