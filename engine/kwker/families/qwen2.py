"""Qwen2ForCausalLM (Qwen2 / Qwen2.5, Coder included): the Llama layout with q/k/v biases (the native step takes
any matrix's bias); with use_sliding_window, the layers config.layer_types marks "sliding_attention" are windowed."""

from __future__ import annotations

from kwker.families.llama import native_config, rope_tables, unsupported, weights  # noqa: F401  (the interface)
