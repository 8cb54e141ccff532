"""Model files a user imported: registered where they are (a GGUF is never converted or copied
unless asked), listed in `<cache>/imported.json`.

    register("~/models/llama-3.1-8b.Q4_K_M.gguf")   # checks it can run, records it
    entries()                                      # what `kwker models list` and the app show
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from kwker.loading.paths import cache_dir


def _registry() -> Path:
    return cache_dir() / "imported.json"


def entries() -> list[dict]:
    """The imported models that still exist: {name, path, bytes}."""
    try:
        rows = json.loads(_registry().read_text())
    except (OSError, ValueError):
        return []
    return [r for r in rows if Path(r["path"]).exists()]


def check_runs(path: Path) -> None:
    """Raises BadModelFile (naming the reason) unless the files at `path` can run: the checks of a
    load, without packing the weights -- the header, the config and the tensor table are read
    and checked against each other (kwker.loading.load.open_files), the model's shape and RoPE
    tables checked as the native step takes them, and the tokenizer built."""
    from kwker.loading.build import check_model, rope_tables
    from kwker.loading.load import open_files

    config, source, _, _, make_tokenizer = open_files(path)
    context = min(2048, config.max_position_embeddings)
    check_model(config, source, context)
    rope_tables(config, source, context)
    make_tokenizer()


def register(path, copy: bool = False, progress=None) -> dict:
    """Checks `path` (a .gguf file or a model folder) and records it; copy=True copies a file into
    the cache first (written whole or not at all). Returns the entry."""
    path = Path(path).expanduser().resolve()
    if not path.exists():
        raise FileNotFoundError(f"no such model file or folder: {path}")
    check_runs(path)
    if copy and path.is_file():
        target = cache_dir() / "models" / "imported" / path.name
        if not target.exists():
            if progress:
                progress(f"copying {path.name} into {target.parent}")
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, suffix=".partial")
            os.close(fd)
            try:
                shutil.copyfile(path, tmp)
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        path = target
    size = (
        path.stat().st_size
        if path.is_file()
        else sum(f.stat().st_size for f in path.iterdir() if f.is_file())
    )
    entry = {"name": path.stem if path.is_file() else path.name, "path": str(path), "bytes": size}
    rows = [r for r in entries() if r["path"] != entry["path"]] + [entry]
    fd, tmp = tempfile.mkstemp(dir=cache_dir(), suffix=".json.partial")
    with os.fdopen(fd, "w") as f:
        json.dump(rows, f, indent=1)
    os.replace(tmp, _registry())
    return entry
