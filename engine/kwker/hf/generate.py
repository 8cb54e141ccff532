"""Hugging Face's own `model.generate` with every step on a decoder: kwker.hf.install(model)
builds the decoder and attaches it here; uninstall(model) restores the model.

transformers' generate keeps its whole interface (logits processors, sampling, stopping criteria,
streamers, prompt_lookup_num_tokens); only the model's forward is swapped, for the duration of the
call, for one that runs the native step over the new tokens at their cache positions. Calls the
native step cannot serve run on the model's own forward, and `model._kwker_fallback` says why
(None when the call ran natively). A call holds the decoder from its first step to its last:
another thread's generate on the model waits for it.
"""

from __future__ import annotations

import contextlib
import functools

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from kwker.scheduler import one_torch_thread


def installed(model) -> bool:
    return hasattr(model, "_kwker_original_generate")


def attach(model, decoder, draft=None):
    """Routes model.generate through `decoder` (built from this model). draft: an installed draft
    model, passed to transformers' assisted generation as assistant_model for greedy calls that
    name no assistant of their own."""
    original = model.generate
    model._kwker_decoder = decoder
    model._kwker_original_generate = original
    model._kwker_fallback = None
    vars(model)["_kwker_draft"] = (
        draft  # not an nn.Module attribute: the draft must not become a submodule
    )

    @functools.wraps(original)
    def generate(*args, **kwargs):
        greedy = not kwargs.get("do_sample", getattr(model.generation_config, "do_sample", False))
        if (
            draft is not None
            and greedy
            and kwargs.get("assistant_model") is None
            and not kwargs.get("prompt_lookup_num_tokens")
        ):
            kwargs["assistant_model"] = draft
        reason = _fallback_reason(model, decoder, args, kwargs)
        model._kwker_fallback = reason
        if reason is not None:
            return original(*args, **kwargs)
        # held for the whole call: its forward calls continue one text in the decoder's cache
        with decoder.runner.hold(), _native_forward(model, decoder), one_torch_thread():
            return original(*args, **kwargs)

    model.generate = generate
    return model


def uninstall(model):
    """Restores the model's original generate."""
    draft = vars(model).get("_kwker_draft")
    if draft is not None:
        uninstall(draft)
    vars(model).pop("generate", None)  # install set an instance attribute over the class's method
    for attr in ("_kwker_original_generate", "_kwker_decoder", "_kwker_fallback", "_kwker_draft"):
        vars(model).pop(attr, None)
    return model


def _fallback_reason(model, decoder, args, kwargs) -> str | None:
    gen_cfg = kwargs.get("generation_config") or model.generation_config
    num_beams = kwargs.get("num_beams", getattr(gen_cfg, "num_beams", 1)) or 1
    if num_beams > 1:
        return "beam search runs on the model's own forward"
    if kwargs.get("inputs_embeds") is not None:
        return "inputs_embeds runs on the model's own forward"
    assistant = kwargs.get("assistant_model")
    if assistant is not None and not hasattr(assistant, "_kwker_decoder"):
        return (
            "an assistant_model that is not installed runs on the model's own forward "
            "(install it first)"
        )
    input_ids = args[0] if args else kwargs.get("input_ids", kwargs.get("inputs"))
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        return "generate without a 2-D input_ids tensor runs on the model's own forward"
    if input_ids.shape[0] != 1:
        return "batched input runs on the model's own forward"
    mask = kwargs.get("attention_mask")
    if mask is not None and not bool(mask.all()):
        return "a padded attention_mask runs on the model's own forward"
    max_new = kwargs.get("max_new_tokens", getattr(gen_cfg, "max_new_tokens", None))
    max_len = kwargs.get("max_length", getattr(gen_cfg, "max_length", None) or 20)
    total = input_ids.shape[1] + max_new if max_new is not None else max_len
    if total > decoder.max_cache_len:
        return f"{total} tokens exceed the decoder's max_cache_len {decoder.max_cache_len}"
    return None


@contextlib.contextmanager
def _native_forward(model, decoder):
    cache_field = (
        "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"
    )

    def forward(input_ids=None, logits_to_keep=0, **kwargs):
        # The K/V live in the native cache. transformers' cache object only keeps the length,
        # through tiny (1, 1, T, 1) tensors: generate reads positions from it and crops it when it
        # rejects lookup tokens.
        cache = kwargs.get("cache", kwargs.get("past_key_values"))
        start = cache.get_seq_length() if cache is not None else 0
        n = input_ids.shape[1]
        last_only = isinstance(logits_to_keep, int) and logits_to_keep == 1
        logits = decoder.forward(
            input_ids[0].tolist(), start=start, logits="last" if last_only else "all"
        )
        if cache is not None:
            stub = torch.zeros(1, 1, n, 1)
            cache.update(stub, stub, 0)
        return CausalLMOutputWithPast(logits=logits[None], **{cache_field: cache})

    model.forward = forward
    try:
        yield
    finally:
        del model.forward
