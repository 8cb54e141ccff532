"""MistralForCausalLM: the Llama layout; its sliding window only matters when the cache is longer than the window,
which is refused until the native step implements windowed attention."""

from __future__ import annotations

from kwker.families import llama
from kwker.families.llama import native_config, rope_tables, weights  # noqa: F401  (the family's interface)


def unsupported(model, max_cache_len: int) -> str | None:
    window = getattr(model.config, "sliding_window", None)
    if window and max_cache_len > window:
        return (f"max_cache_len {max_cache_len} is longer than the sliding window {window}: windowed attention is "
                "not supported yet")
    return llama.unsupported(model, max_cache_len)
