"""MistralForCausalLM: the Llama layout; with `sliding_window` set, every layer attends to the last
sliding_window positions only (the native step windows its attention once the text is longer)."""

from __future__ import annotations

from kwker.families.llama import (  # noqa: F401  (the interface)
    native_config,
    norm_values,
    rope_tables,
    unsupported,
    weights,
)
