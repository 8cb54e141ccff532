"""Qwen2ForCausalLM (Qwen2 / Qwen2.5, Coder included): the Llama layout with q/k/v biases (the
native step takes any matrix's bias); with use_sliding_window, the layers config.layer_types marks
"sliding_attention" are windowed."""

from __future__ import annotations

from dataclasses import replace

from kwker.families import llama
from kwker.families.llama import (  # noqa: F401  (the interface)
    native_config,
    norm_values,
    rope_tables,
    unsupported,
)


def layer_matrices(c, i: int):
    """Llama's seven matrices; q, k and v always have a bias (o has none)."""
    for spec in llama.layer_matrices(c, i):
        part = spec.native.rsplit(".", 1)[1]
        yield replace(spec, bias=spec.source.replace(".weight", ".bias") if part in "qkv" else None)


def weights(c, tied: bool):
    return llama.weights(c, tied, matrices=layer_matrices)
