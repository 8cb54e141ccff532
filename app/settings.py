"""The app's settings: defaults, which of them a conversation may override, and how they map onto
the engine."""

from __future__ import annotations

from kwker.app.context_window import ROLLING
from kwker.models import CHAT_MODEL
from kwker.sampling import sampling_options

# int4 by default: 4-bit weights read about a quarter of float32's bytes per token, the cost of a
# decoding step on a CPU, and keep nearly all of a model's answers (the quality table of `kwker
# bench --quality`); the model's own weights ("auto") are one click away in the settings.
DEFAULT_PRECISION = "int4"

DEFAULTS = {
    "model": CHAT_MODEL,
    "precision": DEFAULT_PRECISION,
    "draft_model": "",
    "lookup": True,
    "lookup_tokens": 8,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "seed": -1,  # -1: a new seed every answer
    "max_new_tokens": 512,
    "context_length": 2048,
    "context_overflow": ROLLING,  # or "stop" (see kwker.app.context_window)
    "threads": 0,  # 0: all cores
    "system_prompt": "",
    "theme": "system",
    "tint_speculation": False,
    # "": the model runs here; else the address of the OpenAI-compatible server whose model
    # server_model answers (its API key is kept apart from the settings: kwker.app.keys)
    "server_url": "",
    "server_model": "",
    "servers": [],  # the addresses of the servers added in the model picker, the latest first
}

# What a conversation may set for itself (the rest belongs to the app: the loaded model and how it
# runs).
PER_CONVERSATION = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "seed",
    "max_new_tokens",
    "system_prompt",
    "lookup",
    "lookup_tokens",
)

# The sampling a model's preset may give (kwker.models.presets): where the user has not set one,
# the loaded model's own value replaces the app's default.
SAMPLING = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
DEFAULT_SOURCE, USER_SOURCE = "Kwker's default", "your setting"


def effective(saved: dict, preset_values: dict) -> dict:
    """The settings in force: the app's defaults, under the loaded model's preset, under what the
    user saved."""
    return {**DEFAULTS, **preset_values, **saved}


def sampling_sources(saved: dict, preset_sources: dict) -> dict:
    """Where each sampling setting in force came from, as the settings panel says it."""
    return {
        k: USER_SOURCE if k in saved else preset_sources.get(k, DEFAULT_SOURCE) for k in SAMPLING
    }


def user_values(values: dict, preset_values: dict, saved: dict) -> tuple[dict, list[str]]:
    """(values to save, sampling keys to forget) for values applied from the panel: a sampling
    value equal to what the model's preset (or the app's default) gives is not the user's own, so
    it is forgotten and follows the next model's preset; any other is kept as the user's."""
    keep, forget = {}, []
    for key, value in values.items():
        if key in SAMPLING and value == preset_values.get(key, DEFAULTS[key]):
            if key in saved:
                forget.append(key)
            continue
        keep[key] = value
    return keep, forget


# Changing these reloads the model.
LOAD_KEYS = (
    "model", "precision", "draft_model", "context_length", "threads", "server_url", "server_model",
)  # fmt: skip


def load_options(s: dict) -> dict:
    return {k: s[k] for k in LOAD_KEYS}


def generation_options(s: dict) -> dict:
    """KwkDecoder.stream_generate keyword arguments for settings s. Every sampling setting is
    passed as it is, so none falls back to the model's own default behind the user's back (top-p
    1, top-k 0 and min-p 0 mean off); a negative seed means a fresh one each answer."""
    seed = int(s["seed"])
    penalty = float(s["repetition_penalty"])
    opts = sampling_options(
        float(s["temperature"]),
        seed=seed if seed >= 0 else None,
        top_p=float(s["top_p"]) if 0 < s["top_p"] <= 1 else 1.0,
        top_k=max(0, int(s["top_k"])),
        min_p=max(0.0, float(s["min_p"])),
        repetition_penalty=penalty if penalty != 1.0 else None,
    )
    return {"lookup": int(s["lookup_tokens"]) if s["lookup"] else 0, **opts}


def remote_sampling(s: dict) -> dict:
    """The OpenAI API's sampling parameters for settings s (kwker.remote.RemoteModel.stream_chat):
    it has no top-k, min-p or repetition penalty (the settings panel hides them for a server)."""
    temperature = float(s["temperature"])
    return {
        "temperature": temperature,
        "top_p": float(s["top_p"]) if temperature > 0 and 0 < s["top_p"] < 1 else None,
        "seed": int(s["seed"]) if temperature > 0 and int(s["seed"]) >= 0 else None,
    }
