"""Deprecated: kwker.hf.generate."""

from kwker._deprecation import moved_module, old_names
from kwker.hf.generate import attach, installed, uninstall

moved_module(__name__, "kwker.hf.generate")
__getattr__ = old_names(__name__, {}, rest="kwker.hf.generate")
__all__ = ["attach", "installed", "uninstall"]
