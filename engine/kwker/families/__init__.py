"""Model families the native step runs, one module per Hugging Face `model_type`.

A family module works on a config (a transformers config or kwker.loading.config.ModelConfig):
  unsupported(config, max_cache_len) -> str | None   why this model (variant) cannot run, or None
  native_config(config, tied, embed_dtype) -> dict   the native step's configuration
  rope_tables(config, max_cache_len) -> (cos, sin)   numpy float32 [n_tables, max_cache_len,
                                                     rope_dim / 2] (native_config's layer_rope
                                                     picks a table per layer)
  weights(config, tied) -> iterable of WeightSpec    each native weight and the Hugging Face
                                                     tensor it comes from (kwker.loading.build
                                                     reads them)
  norm_values(w) -> w                                a norm's float32 weights as the step uses them
"""

from __future__ import annotations

from types import ModuleType

from kwker.families import gemma3, llama, mistral, phi3, qwen2, qwen3

FAMILIES: dict[str, ModuleType] = {
    "llama": llama,
    "mistral": mistral,
    "qwen2": qwen2,
    "qwen3": qwen3,
    "gemma3_text": gemma3,
    "phi3": phi3,
}


def family_for(model) -> ModuleType | None:
    config = getattr(model, "config", None)
    return FAMILIES.get(getattr(config, "model_type", None))


def supported_model_types() -> list[str]:
    return sorted(FAMILIES)
