"""Kwker's cache folder (platformdirs' user cache dir; KWKER_CACHE_DIR overrides it)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def cache_dir() -> Path:
    root = os.environ.get("KWKER_CACHE_DIR") or platformdirs.user_cache_dir("kwker")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path
