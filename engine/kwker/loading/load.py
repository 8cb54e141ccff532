"""A decoder straight from model files, without torch: a GGUF file, or a folder of safetensors
with its config.json and tokenizer.

    dec = load_decoder("SmolLM2-135M-Instruct.Q4_1.gguf", max_cache_len=2048, precision="int4")
    ids = dec.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    text = dec.tokenizer.decode(dec.generate(ids, max_new_tokens=64)[0, len(ids):])

The first load packs the weights tensor by tensor from the mapped file (kwker.loading.build) and
writes them to the packed-weights cache (kwker.loading.packed_cache); later loads of the same file
at the same precision read the packed panels back. The decoder has the generation API of every
Kwker decoder (kwker.generation.StepDecoder) and returns numpy arrays.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace

from kwker.generation import StepDecoder
from kwker.loading import packed_cache
from kwker.loading import sampling_defaults as presets
from kwker.loading.build import empty_step, load_weights, own_precision
from kwker.loading.config import config_from_gguf, config_from_json
from kwker.loading.gguf_file import read_gguf
from kwker.loading.sources import (
    BadModelFile,
    GgufSource,
    SafetensorsSource,
    file_identity,
)
from kwker.loading.tokenizer import load_tokenizer, save_tokenizer
from kwker.models.cache import bundled_dir, cache_dir
from kwker.precision import checked
from kwker.runner import DEFAULT_STEP_TOKENS


class FileDecoder(StepDecoder):
    """A decoder loaded from files. `path` is what it was loaded from, `load_seconds` how long the
    load took and `from_cache` whether the packed weights came from the cache."""

    def __init__(self, model, step, precision, tokenizer, path, kv_cache, seconds, from_cache):
        super().__init__(model, step, precision, tokenizer, returns="numpy")
        self.path, self.kv_cache = path, kv_cache
        self.load_seconds, self.from_cache = seconds, from_cache
        # (where from, {setting: value}): the sampling the files recommend (kwker.models.presets)
        self.sampling_defaults = getattr(model.generation_config, "sampling_defaults", (None, {}))


def open_files(path: Path):
    """(config, source, files, generation defaults, tokenizer loader) for a GGUF file or a
    safetensors folder."""
    if path.is_file():
        gguf = read_gguf(path)
        config = config_from_gguf(gguf)
        source = GgufSource(gguf, config)
        generation = SimpleNamespace(eos_token_id=getattr(config, "eos_token_id", None))
        generation.sampling_defaults = (presets.GGUF, presets.from_gguf(gguf.metadata))
        return config, source, [path], generation, lambda: load_tokenizer(gguf)
    if not (path / "config.json").is_file():
        raise BadModelFile(f"{path} has no config.json: not a model folder")
    try:
        config = config_from_json(json.loads((path / "config.json").read_text()))
    except ValueError as e:
        raise BadModelFile(f"{path / 'config.json'}: {e}") from None
    source = SafetensorsSource(path)
    gen_file = path / "generation_config.json"
    generation = None
    if gen_file.exists():
        try:
            settings = json.loads(gen_file.read_text())
        except ValueError as e:
            raise BadModelFile(f"{gen_file}: {e}") from None
        if not isinstance(settings, dict):
            raise BadModelFile(f"{gen_file}: not a JSON object")
        generation = SimpleNamespace(**settings)
        sampling = presets.from_generation_config(settings)
        generation.sampling_defaults = (presets.GENERATION_CONFIG, sampling)
    # a folder without tokenizer.json (weights alone) runs on token ids
    has_tokenizer = (path / "tokenizer.json").is_file()
    return (
        config,
        source,
        source.files,
        generation,
        ((lambda: load_tokenizer(path)) if has_tokenizer else (lambda: None)),
    )


def source_identity(files) -> list[list]:
    """file_identity(files), with the files of the bundled folder named by their path in it and
    their size: an installed copy has another absolute path and modification time than the build's
    (where its packed weights were made), and the same bytes."""
    bundled = bundled_dir()
    out = []
    for (path, size, mtime), f in zip(file_identity(files), files, strict=True):
        if bundled is not None and Path(f).resolve().is_relative_to(bundled.resolve()):
            out.append(["bundled", str(Path(f).resolve().relative_to(bundled.resolve())), size])
        else:
            out.append([path, size, mtime])
    return out


def packed_roots() -> list[Path]:
    """Where packed weights and GGUF tokenizers are looked for: the user's cache (written), then
    the bundled folder's (read-only)."""
    bundled = bundled_dir()
    return [cache_dir() / "packed", *([bundled / "packed"] if bundled else [])]


def cached_tokenizer(folder: Path, make):
    """The tokenizer saved in `folder` (a GGUF's, built once from its metadata) or in its namesake
    in the bundled folder, else make() saved in `folder`."""
    for saved in (folder, *(r / folder.name for r in packed_roots()[1:])):
        if (saved / "tokenizer.json").exists():
            try:
                return load_tokenizer(saved)
            except (OSError, ValueError):
                pass  # a damaged copy: built again below
    tokenizer = make()
    try:
        save_tokenizer(tokenizer, folder)
    except OSError:
        pass  # a read-only or full cache: the tokenizer is built from the file next time
    return tokenizer


# The context a decoder gets when none is asked for (at most the model's own)
DEFAULT_CACHE_LEN = 4096


def load_decoder(
    model_path,
    max_cache_len: int | None = None,
    precision: str | None = None,
    threads: int | None = None,
    max_batch: int = 1,
    max_step_tokens: int = DEFAULT_STEP_TOKENS,
    kv_cache: str | None = None,
    cache: bool = True,
    progress=None,
) -> FileDecoder:
    """A decoder for the model at `model_path` (a .gguf file or a safetensors folder) at
    `precision` (None: the nearest to the file's own; see kwker.loading.build), holding
    max_cache_len tokens (None: DEFAULT_CACHE_LEN or the model's max_position_embeddings, whichever
    is less). cache=False neither reads nor writes the packed-weights cache. Raises BadModelFile (a ValueError) naming what is
    wrong with the files."""
    started = time.perf_counter()
    path = Path(model_path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"no such model file or folder: {path}")
    config, source, files, generation, make_tokenizer = open_files(path)
    if max_cache_len is None:
        max_cache_len = min(DEFAULT_CACHE_LEN, config.max_position_embeddings)
    precision = checked(precision) or own_precision(source)  # the cache key needs it
    identity = {"source": source_identity(files), "config": sorted(vars(config).items(), key=str)}
    source_key = packed_cache.entry_key(identity)
    key = packed_cache.entry_key({**identity, "precision": precision})
    # the files' paths and the precision: what a newer entry replaces
    lineage = packed_cache.lineage_key([str(Path(f).resolve()) for f in files], precision)
    roots = packed_roots()
    root, name = roots[0], f"{path.stem}-{precision}-{key}.kwk"
    entry = next((r / name for r in roots if (r / name).exists()), root / name)
    options = dict(threads=threads, max_batch=max_batch, max_step_tokens=max_step_tokens,
                   kv_cache=kv_cache)  # fmt: skip
    step, from_cache = None, False
    if cache and entry.exists():
        if progress:
            progress(f"reading the packed weights of {path.name}")
        step, precision, kv_cache = empty_step(config, source, precision, max_cache_len, **options)
        try:
            packed_cache.read_entry(entry, key, step)
            step.check_complete()
            from_cache = True
        except packed_cache.StaleEntry as e:
            if progress:
                progress(f"rebuilding the packed weights: {e}")
            step = None  # partly filled: a fresh one is packed below
    if step is None:
        if progress:
            progress(f"packing {path.name} at {precision}")
        recording = packed_cache.Recording() if cache else None
        step, precision, kv_cache = empty_step(config, source, precision, max_cache_len, **options)
        load_weights(step, config, source, precision, recording)
        if cache:
            try:
                packed_cache.write_entry(root / name, key, step, recording, lineage)
            except OSError as e:  # the model runs; only the next load is slower
                if progress:
                    progress(f"could not write the packed-weights cache: {e}")
    tokenizer = (
        cached_tokenizer(root / f"{path.stem}-{source_key}.tokenizer", make_tokenizer)
        if path.is_file() and cache
        else make_tokenizer()
    )
    model = SimpleNamespace(config=config, generation_config=generation)
    seconds = time.perf_counter() - started
    return FileDecoder(model, step, precision, tokenizer, path, kv_cache, seconds, from_cache)
