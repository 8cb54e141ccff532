"""A model's configuration without transformers: from a config.json, or from a GGUF file's
metadata. Transformers' config classes import torch (through modeling_rope_utils), so kwker
rebuilds what the families read from them. This module is the front; the parts are

- kwker.loading.config_json: `ModelConfig`, a plain attribute object, and `config_from_json`;
- kwker.loading.config_types: the defaults and standardization transformers (5.x) applies for
  each supported `model_type`;
- kwker.loading.gguf_config: `config_from_gguf`, llama.cpp's metadata keys mapped to such a
  config.json dict and built the same way;
- kwker.loading.config_checks: what a config's fields may hold, checked before anything is
  computed or sized from them (a header that lies is a ConfigError naming the field).
"""

from kwker.loading.config_checks import (
    LAYER_TYPES,
    MAX_HEADS,
    MAX_INT32,
    MAX_LAYERS,
    MAX_NESTING,
    MAX_VOCAB,
    MAX_WIDTH,
    ConfigError,
)
from kwker.loading.config_json import ModelConfig, config_from_json
from kwker.loading.config_types import MODEL_TYPES
from kwker.loading.gguf_config import GGUF_FIELD_KEYS, GGUF_MODEL_TYPES, config_from_gguf

__all__ = [
    "GGUF_FIELD_KEYS",
    "GGUF_MODEL_TYPES",
    "LAYER_TYPES",
    "MAX_HEADS",
    "MAX_INT32",
    "MAX_LAYERS",
    "MAX_NESTING",
    "MAX_VOCAB",
    "MAX_WIDTH",
    "MODEL_TYPES",
    "ConfigError",
    "ModelConfig",
    "config_from_gguf",
    "config_from_json",
]
