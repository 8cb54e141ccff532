"""The sampling settings a model's files recommend (see kwker.models.presets, which adds the
catalog's): a GGUF's `general.sampling.*` keys, a folder's generation_config.json. Values out of
range, of the wrong type or not finite are left out: a file that says temperature -1 or top_p 7
is ignored on that key, not obeyed."""

from __future__ import annotations

import math

# The sampling settings a preset may give, with the range a value must lie in to be taken (a file
# that says temperature -1 or top_p 7 is ignored on that key, not obeyed).
RANGES = {
    "temperature": (0.0, 5.0),
    "top_p": (0.0, 1.0),
    "top_k": (0, 100_000),
    "min_p": (0.0, 1.0),
    "repetition_penalty": (0.5, 3.0),
}
GGUF_KEYS = {
    "general.sampling.temp": "temperature",
    "general.sampling.top_p": "top_p",
    "general.sampling.top_k": "top_k",
    "general.sampling.min_p": "min_p",
    "general.sampling.penalty_repeat": "repetition_penalty",
}
# where the values came from, as the settings panel says it
GGUF, GENERATION_CONFIG = "the model's GGUF file", "generation_config.json"


def checked(values: dict) -> dict:
    """The values of known settings that lie in their range (as int for top_k)."""
    out = {}
    for key, value in values.items():
        if key not in RANGES or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        low, high = RANGES[key]
        if not math.isfinite(value) or not low <= value <= high:
            continue
        out[key] = int(value) if key == "top_k" else float(value)
    return out


def from_gguf(metadata: dict) -> dict:
    """The sampling settings a GGUF's metadata names."""
    return checked({name: metadata[k] for k, name in GGUF_KEYS.items() if k in metadata})


def from_generation_config(config: dict) -> dict:
    """The sampling settings a generation_config.json names; do_sample false means greedy
    (transformers then ignores the temperature), so it is temperature 0."""
    values = {k: config[k] for k in RANGES if k in config}
    if config.get("do_sample") is False:
        values = {"temperature": 0.0}
    return checked(values)
