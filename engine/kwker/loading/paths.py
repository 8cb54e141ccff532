"""Kwker's cache folder (platformdirs' user cache dir; KWKER_CACHE_DIR overrides it), and the
read-only folder of models an installer ships. Here, below kwker.models, because loading keeps its
packed weights in them as the torch wing keeps its compiled code, and the models put their
downloads and imports there."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import platformdirs


def cache_dir() -> Path:
    root = os.environ.get("KWKER_CACHE_DIR") or platformdirs.user_cache_dir("kwker")
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def bundled_dir() -> Path | None:
    """The folder an installer ships models in (kwker.models.bundled): KWKER_BUNDLED_DIR, else
    models/ beside a frozen app's code; None when there is none."""
    root = os.environ.get("KWKER_BUNDLED_DIR")
    if not root and getattr(sys, "frozen", False):
        root = str(Path(sys._MEIPASS) / "models")  # PyInstaller's folder of the bundled files
    return Path(root) if root and Path(root).is_dir() else None
