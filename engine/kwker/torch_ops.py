"""Deprecated: kwker.hf.torch_ops (the same functions and state)."""

from kwker._deprecation import moved_module, old_names
from kwker.hf.torch_ops import install, installed, uninstall

moved_module(__name__, "kwker.hf.torch_ops")
__getattr__ = old_names(__name__, {}, rest="kwker.hf.torch_ops")
__all__ = ["install", "installed", "uninstall"]
