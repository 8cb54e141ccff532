"""Qwen2ForCausalLM (Qwen2 / Qwen2.5, Coder included): the Llama layout with q/k/v biases (the native step takes
any matrix's bias). Sliding-window attention is refused until the native step implements it."""

from __future__ import annotations

from kwker.families import llama
from kwker.families.llama import native_config, rope_tables, weights  # noqa: F401  (the family's interface)


def unsupported(model, max_cache_len: int) -> str | None:
    c = model.config
    if getattr(c, "use_sliding_window", False) and max_cache_len > (c.sliding_window or 0):
        return "sliding-window attention is not supported yet (use_sliding_window=True)"
    return llama.unsupported(model, max_cache_len)
