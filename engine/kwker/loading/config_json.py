"""A model's configuration from a config.json, without transformers: `ModelConfig` is a plain
attribute object, and `config_from_json` builds it as transformers' config class for the
`model_type` would (kwker.loading.config_types), every field checked first
(kwker.loading.config_checks). Extra config.json keys stay attributes, as they do on a
transformers config.
"""

from __future__ import annotations

import copy
import json

from kwker.loading.config_checks import (
    ConfigError,
    check_built,
    check_fields,
    check_nesting,
    shown,
)
from kwker.loading.config_types import (
    BASE_FIELDS,
    DROPPED,
    LEGACY_LAYER_TYPES,
    MODEL_TYPES,
    ModelType,
)


class ModelConfig:
    """A model's configuration as plain attributes (the names transformers' config classes use)."""

    def __init__(self, attributes: dict):
        self.__dict__.update(copy.deepcopy(attributes))

    @property
    def rope_scaling(self):  # transformers' deprecated alias, which older code still reads
        return self.rope_parameters

    def get_text_config(self, *args, **kwargs) -> ModelConfig:
        return self  # every config here is a text model's

    def to_dict(self) -> dict:
        """The attributes as a config.json holds them (config_from_json builds this config from
        it)."""
        out = copy.deepcopy(self.__dict__)
        if out.get("model_type") == "gemma3_text" and out.get("use_bidirectional_attention"):
            # undo the exclusive bound Gemma3TextConfig sets at init, as its to_dict does
            out["sliding_window"] = (out["sliding_window"] - 1) * 2
        return out

    def to_json_string(self, use_diff: bool = False) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def __eq__(self, other) -> bool:
        return isinstance(other, ModelConfig) and self.__dict__ == other.__dict__

    def __repr__(self) -> str:
        return f"ModelConfig({self.to_json_string()})"


def config_from_json(config: dict) -> ModelConfig:
    """The ModelConfig of a config.json's contents (model types llama, mistral, qwen2, qwen3, phi3,
    gemma3_text, and gemma3, whose text_config is the model)."""
    if not isinstance(config, dict):
        raise ConfigError(f"the config is {shown(config)}, not a JSON object")
    check_nesting(config)
    model_type = config.get("model_type")
    if model_type == "gemma3":  # the multimodal wrapper: the language model is its text config
        text = config.get("text_config") or {}
        if not isinstance(text, dict):
            raise ConfigError(f"gemma3 config: text_config is {shown(text)}, not an object")
        config = {**text, "model_type": "gemma3_text"}
        model_type = "gemma3_text"
    spec = MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None
    if spec is None:
        raise ConfigError(
            f"model type {shown(model_type)} is not supported "
            f"(supported: {', '.join(sorted(MODEL_TYPES))}, gemma3)"
        )
    config = copy.deepcopy(config)
    fields = {**BASE_FIELDS, **spec.fields}
    attributes = {name: config.pop(name, default) for name, default in fields.items()}
    extra = {k: v for k, v in config.items() if k not in DROPPED}
    torch_dtype = extra.pop("torch_dtype", None)  # dtype's old name, taken when dtype is absent
    if attributes["dtype"] is None:
        attributes["dtype"] = torch_dtype
    check_fields(attributes, extra, model_type)  # before anything divides or sizes by them
    spec.post_init(attributes, extra)
    spec.rope(attributes, extra)
    if attributes.get("layer_types") is not None:
        attributes["layer_types"] = [
            LEGACY_LAYER_TYPES.get(t, t) for t in attributes["layer_types"]
        ]
    attributes.update(extra)
    attributes["model_type"] = model_type
    _validate(attributes, spec)
    check_built(attributes)
    return ModelConfig(attributes)


def _validate(a: dict, spec: ModelType) -> None:
    """The checks of transformers' strict config classes that a model would otherwise fail later."""
    if spec.heads_divide_hidden and a["hidden_size"] % a["num_attention_heads"]:
        raise ConfigError(
            f"{a['model_type']} config: hidden_size {a['hidden_size']} is not a multiple of "
            f"num_attention_heads {a['num_attention_heads']}"
        )
    types = a.get("layer_types")
    if types is not None and len(types) != a["num_hidden_layers"]:
        raise ConfigError(
            f"{a['model_type']} config: layer_types has {len(types)} entries for "
            f"{a['num_hidden_layers']} layers"
        )
