"""A decoder straight from model files, without torch: a GGUF file, or a folder of safetensors
with its config.json and tokenizer.

    dec = load_files("SmolLM2-135M-Instruct.Q4_1.gguf", max_cache_len=2048, precision="int4")
    ids = dec.tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    text = dec.tokenizer.decode(dec.generate(ids, max_new_tokens=64)[0, len(ids) :])

The first load packs the weights tensor by tensor from the mapped file (kwker.loading.build) and
writes them to the packed-weights cache (kwker.loading.packed_cache); later loads of the same file
at the same precision read the packed panels back. The decoder has the generation API of every
Kwker decoder (kwker.generation.StepDecoder) and returns numpy arrays. kwker.load(spec) finds the
files a spec names (kwker.models.loader) and opens them here.

The cache only ever saves time: a cache entry or tokenizer that cannot be read is built again, and
a cache that cannot be written (read-only, full, or a folder that cannot be made) leaves the model
running uncached.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path
from types import SimpleNamespace

from kwker._deprecation import old_names
from kwker.generation import StepDecoder
from kwker.loading import packed_cache
from kwker.loading import sampling_defaults as presets
from kwker.loading.build import check_tensor_table, empty_step, load_weights, own_precision
from kwker.loading.config import config_from_gguf, config_from_json
from kwker.loading.gguf_split import read_split
from kwker.loading.paths import bundled_dir, cache_dir
from kwker.loading.sources import (
    BadModelFile,
    GgufSource,
    SafetensorsSource,
    file_identity,
)
from kwker.loading.tokenizer import (
    KWKER_TOKENIZER_FILE,
    TokenizerError,
    load_tokenizer,
    save_tokenizer,
)
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
    safetensors folder. Every load and `kwker models import` open files here, so the header checks
    are all made here: each field's type and range (kwker.loading.config) and the config's sizes
    against the tensor table (check_tensor_table), before anything is sized by them. Raises
    BadModelFile."""
    if path.is_file():
        gguf, paths = read_split(path)  # one file, or every part of a split one
        config = config_from_gguf(gguf)
        source = GgufSource(gguf, config)
        check_tensor_table(config, source)
        generation = SimpleNamespace(eos_token_id=getattr(config, "eos_token_id", None))
        generation.sampling_defaults = (presets.GGUF, presets.from_gguf(gguf.metadata))
        return config, source, paths, generation, lambda: file_tokenizer(gguf, path)
    if not (path / "config.json").is_file():
        raise BadModelFile(f"{path} has no config.json: not a model folder")
    try:
        config = config_from_json(json.loads((path / "config.json").read_text()))
    except (ValueError, RecursionError) as e:  # RecursionError: JSON nested too deeply to parse
        raise BadModelFile(f"{path / 'config.json'}: {e}") from None
    source = SafetensorsSource(path)
    check_tensor_table(config, source, path / "config.json")
    gen_file = path / "generation_config.json"
    generation = None
    if gen_file.exists():
        try:
            settings = json.loads(gen_file.read_text())
        except (ValueError, RecursionError) as e:
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
        ((lambda: file_tokenizer(path, path)) if has_tokenizer else (lambda: None)),
    )


def file_tokenizer(source, path: Path):
    """The tokenizer of the model files at `path` (`source`: their GgufFile, or the folder with
    tokenizer.json); BadModelFile when none can be built. The tokenizer's sources are the file's
    and unchecked by the code that reads them (kwker.loading.gguf_vocab, the tokenizers
    library), which raises whatever damage leads it to: a TypeError, a KeyError, a bare
    Exception ("EOF while parsing")."""
    try:
        return load_tokenizer(source)
    except TokenizerError as e:  # its message names the file
        raise BadModelFile(str(e)) from None
    except MemoryError:
        raise  # the machine is short of memory, not the file damaged
    except Exception as e:
        raise BadModelFile(
            f"{path}: no tokenizer can be built from it ({type(e).__name__}: {e})"
        ) from None


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


def user_packed_root() -> Path | None:
    """The user's cache's folder of packed weights and GGUF tokenizers, where loads write; None
    when the cache folder cannot be made (a read-only home, a KWKER_CACHE_DIR under a file): the
    model then runs uncached."""
    try:
        return cache_dir() / "packed"
    except OSError:
        return None


def packed_roots(writable: Path | None) -> list[Path]:
    """Where packed weights and GGUF tokenizers are looked for: `writable`, the user's cache's
    (None: none), then the bundled folder's (read-only)."""
    bundled = bundled_dir()
    return [r for r in (writable, bundled and bundled / "packed") if r is not None]


def cached_tokenizer(name: str, roots: list[Path], writable: Path | None, make, progress=None):
    """The tokenizer saved as the folder `name` (a GGUF's, built once from its metadata) in the
    first of `roots` holding a readable one, else make(), saved in `writable` (None: nowhere)."""
    for saved in (root / name for root in roots):
        if not saved.exists():
            continue
        try:
            if not (saved / KWKER_TOKENIZER_FILE).is_file():  # written last by save_tokenizer
                raise ValueError("an unfinished copy")
            return load_tokenizer(saved)
        except MemoryError:
            raise  # the machine is short of memory: the copy may be good
        except Exception as e:
            # Any other failure means a damaged copy, to build again: a cut tokenizer.json makes
            # the tokenizers library raise a bare Exception ("EOF while parsing"), a damaged
            # record a KeyError or TypeError.
            if progress:
                progress(f"rebuilding the tokenizer: {saved}: {type(e).__name__}: {e}")
            _discard(saved)
    tokenizer = make()
    if writable is not None:
        _save_whole(tokenizer, writable / name, progress)
    return tokenizer


def _save_whole(tokenizer, folder: Path, progress) -> None:
    """Saves `tokenizer` as `folder` whole or not at all: written in a temporary folder beside it,
    then renamed, so that a kill or a full disk mid-write leaves no half-written tokenizer (only
    debris that packed_cache.sweep_debris removes). Where it cannot be saved, the load goes on:
    the tokenizer is built from the model file again next time."""
    temporary = folder.parent / f".{folder.name}.{secrets.token_hex(6)}.partial"
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        temporary.mkdir()
        save_tokenizer(tokenizer, temporary)
    except Exception as e:
        # A full disk is an OSError from Python's writes but a bare Exception from the tokenizers
        # library's ("No space left on device (os error 28)"): either way the model runs.
        if progress:
            progress(f"could not save the tokenizer to the cache: {e}")
    else:
        try:
            os.rename(temporary, folder)
        except OSError:
            pass  # another process saved the same tokenizer first: theirs stays
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _discard(saved: Path) -> None:
    """Removes a damaged tokenizer folder where that can be done (not from a read-only cache):
    renamed to debris first, so that no load sees it half-removed."""
    debris = saved.parent / f".{saved.name}.{secrets.token_hex(6)}.partial"
    try:
        os.rename(saved, debris)
        if debris.is_dir():
            shutil.rmtree(debris)
        else:
            debris.unlink()  # a file where the folder should be
    except OSError:
        pass  # read-only: it stays, and every load builds the tokenizer from the model file


# The context a decoder gets when none is asked for (at most the model's own)
DEFAULT_CACHE_LEN = 4096


def load_files(
    model_path,
    max_cache_len: int | None = None,
    precision: str | None = None,
    threads: int | None = None,
    max_batch: int = 1,
    max_step_tokens: int = DEFAULT_STEP_TOKENS,
    kv_cache: str | None = None,
    cache: bool = True,
    progress=None,
    fewest_bytes: bool = False,
) -> FileDecoder:
    """A decoder for the model at `model_path` (a .gguf file or a safetensors folder) at
    `precision` (None: the nearest to the file's own; see kwker.loading.build), holding
    max_cache_len tokens (None: DEFAULT_CACHE_LEN or the model's max_position_embeddings, whichever
    is less). cache=False neither reads nor writes the packed-weights cache (nor the tokenizer's).
    fewest_bytes=True packs no matrix in a format wider than the precision's own where that would
    hold the file's blocks exactly (Q5_0 and Q8_0 at int4): for a draft, whose bytes decide whether
    it pays and whose precision never changes the output. Raises BadModelFile (a ValueError) naming
    what is wrong with the files; never for the cache (see the module doc)."""
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
    packing = f"{precision}, fewest bytes" if fewest_bytes else precision
    key = packed_cache.entry_key({**identity, "precision": packing})
    # the files' paths and the packing: what a newer entry replaces
    lineage = packed_cache.lineage_key([str(Path(f).resolve()) for f in files], packing)
    writable = user_packed_root() if cache else None
    roots = packed_roots(writable) if cache else []
    if writable is not None:
        packed_cache.sweep_debris(writable)  # what killed loads left
    name = f"{path.stem}-{precision}-{key}.kwk"
    options = dict(threads=threads, max_batch=max_batch, max_step_tokens=max_step_tokens,
                   kv_cache=kv_cache)  # fmt: skip
    step, from_cache = None, False
    for entry in (r / name for r in roots if (r / name).exists()):
        if progress:
            progress(f"reading the packed weights of {path.name}")
        step, precision, kv_cache = empty_step(config, source, precision, max_cache_len, **options)
        try:
            packed_cache.read_entry(entry, key, step)
            from_cache = True
            break
        except packed_cache.StaleEntry as e:
            if progress:
                progress(f"rebuilding the packed weights: {e}")
            step = None  # partly filled: a fresh one is packed below
    if step is None:
        if progress:
            progress(f"packing {path.name} at {precision}")
        recording = packed_cache.Recording() if writable is not None else None
        step, precision, kv_cache = empty_step(config, source, precision, max_cache_len, **options)
        load_weights(step, config, source, precision, recording, fewest_bytes)
        if writable is not None:
            try:
                packed_cache.write_entry(writable / name, key, step, recording, lineage)
            except OSError as e:  # the model runs; only the next load is slower
                if progress:
                    progress(f"could not write the packed-weights cache: {e}")
    tokenizer = (
        cached_tokenizer(
            f"{path.stem}-{source_key}.tokenizer", roots, writable, make_tokenizer, progress
        )
        if path.is_file() and cache
        else make_tokenizer()
    )
    model = SimpleNamespace(config=config, generation_config=generation)
    seconds = time.perf_counter() - started
    return FileDecoder(model, step, precision, tokenizer, path, kv_cache, seconds, from_cache)


__getattr__ = old_names(__name__, {"load_decoder": "kwker.loading.load.load_files"})
