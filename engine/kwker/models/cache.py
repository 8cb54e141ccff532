"""Deprecated: kwker.loading.paths. Loading keeps its packed weights in these folders, and loading
sits below kwker.models."""

from kwker._deprecation import moved_module
from kwker.loading.paths import bundled_dir, cache_dir

moved_module(__name__, "kwker.loading.paths")
__all__ = ["bundled_dir", "cache_dir"]
