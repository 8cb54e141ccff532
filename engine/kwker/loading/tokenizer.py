"""A model's tokenizer without torch: from a GGUF file's metadata, or from a tokenizer folder.

`load_tokenizer` gives the transformers tokenizer `AutoTokenizer` gives for the same source, built only
from transformers' torch-free parts (AutoTokenizer itself imports torch: it builds the model's config
first, and for a GGUF that config comes from the `gguf` package's reader, which takes seconds on a
150k-token vocabulary):

- a GGUF: the metadata (read by kwker.loading.gguf_file) goes through what transformers'
  `get_gguf_tokenizer` does -- the vocabulary, merges and special tokens grouped under transformers'
  names, add_bos_token defaulted as llama.cpp does -- then `convert_gguf_tokenizer` builds the backend,
  and the tokenizer class AutoTokenizer picks for that architecture wraps it.
- a folder `save_tokenizer` wrote: the same class and arguments again, around the backend it saved
  (so a warm load skips the GGUF parse and gets exactly the same tokenizer).
- any other folder with a tokenizer.json (tokenizer_config.json, special_tokens_map.json,
  chat_template.jinja; a model folder's config.json names the model type): the class AutoTokenizer
  picks for it, loaded by that class's from_pretrained. The class matters: Qwen2Tokenizer and
  GemmaTokenizer rebuild their pipeline from tokenizer.json's vocabulary (Qwen's with NFC), where
  TokenizersBackend (PreTrainedTokenizerFast) takes tokenizer.json as it is.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kwker.loading.gguf_file import GgufFile, read_gguf

# The file save_tokenizer writes next to transformers' own: how to rebuild the tokenizer exactly.
KWKER_TOKENIZER_FILE = "kwker_tokenizer.json"
_FORMAT = 1

# The class AutoTokenizer picks for a model type (transformers' TOKENIZER_MAPPING_NAMES; types it does not
# list, llama among them, get TokenizersBackend), and the types whose hub tokenizer_class it overrides
# (MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS), for the model types Kwker runs. tokenization_auto, where
# they live, imports torch.
_REGISTERED_CLASSES = {
    "qwen2": "Qwen2Tokenizer",
    "qwen3": "Qwen2Tokenizer",
    "gemma3": "GemmaTokenizer",
    "gemma3_text": "GemmaTokenizer",
    "mistral": "TokenizersBackend",  # MistralCommonBackend only with mistral-common and its files
    "phi3": "TokenizersBackend",
}
_HUB_CLASS_OVERRIDDEN = {"qwen2", "phi3"}
_GGUF_MODEL_TYPES = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
_GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast", "PythonBackend"}

# get_gguf_tokenizer's special tokens: the attribute, and the id's metadata key under tokenizer.ggml.
_SPECIAL_TOKEN_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}

# The constructor arguments save_tokenizer keeps (everything else a tokenizer's init_kwargs holds is
# loader bookkeeping -- paths, the added-token table, which the backend carries itself).
_SAVED_ARGUMENTS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "pad_token",
    "sep_token",
    "cls_token",
    "mask_token",
    "extra_special_tokens",
    "chat_template",
    "add_bos_token",
    "add_eos_token",
    "add_prefix_space",
    "model_max_length",
    "padding_side",
    "truncation_side",
    "clean_up_tokenization_spaces",
    "split_special_tokens",
)


class TokenizerError(ValueError):
    """A source no tokenizer can be built from; the message names it."""


def load_tokenizer(source: GgufFile | str | os.PathLike):
    """The tokenizer of a GGUF file (a GgufFile or its path) or of a tokenizer folder."""
    if isinstance(source, GgufFile):
        return tokenizer_from_gguf(source)
    path = Path(source)
    if path.is_dir():
        return _tokenizer_from_folder(path)
    if path.is_file():
        return tokenizer_from_gguf(read_gguf(path))
    raise TokenizerError(f"{path}: no such GGUF file or tokenizer folder")


def gguf_tokenizer_parts(gguf: GgufFile) -> tuple[str, dict, dict]:
    """(architecture, tokenizer_dict, tokenizer_config) as transformers' get_gguf_tokenizer returns them,
    from metadata already read."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import GGUF_TOKENIZER_MAPPING

    meta = gguf.metadata
    architecture = meta.get("general.architecture")
    tokens = meta.get("tokenizer.ggml.tokens")
    if architecture is None or tokens is None:
        missing = "general.architecture" if architecture is None else "tokenizer.ggml.tokens"
        raise TokenizerError(
            f"{gguf.path}: the metadata has no {missing}, so there is no tokenizer to build"
        )
    tokenizer, config = (
        {
            name: meta[f"tokenizer.{key}"]
            for key, name in renames.items()
            if f"tokenizer.{key}" in meta
        }
        for renames in (
            GGUF_TOKENIZER_MAPPING["tokenizer"],
            GGUF_TOKENIZER_MAPPING["tokenizer_config"],
        )
    )
    kind = tokenizer.get("tokenizer_type")
    if kind == "llama":
        # older files have no flag, and llama.cpp adds BOS to a sentencepiece vocabulary that does not
        # say otherwise
        config.setdefault("add_bos_token", True)
    elif kind == "gemma4":
        # the flag is set, but the reference tokenizer adds none: its chat template writes <bos> itself
        config["add_bos_token"] = False
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is not None and not 0 <= token_id < len(tokens):
            raise TokenizerError(
                f"{gguf.path}: tokenizer.ggml.{key} is {token_id}, outside the vocabulary of {len(tokens)}"
            )
        config[name] = tokens[token_id] if token_id is not None else None
    return architecture, tokenizer, config


def tokenizer_from_gguf(gguf: GgufFile):
    """The tokenizer AutoTokenizer.from_pretrained(folder, gguf_file=name) builds, from metadata."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    architecture, tokenizer_dict, arguments = gguf_tokenizer_parts(gguf)
    try:
        backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    except ValueError as e:
        raise TokenizerError(f"{gguf.path}: {e}") from None
    arguments.update(extra)
    model_type = _GGUF_MODEL_TYPES.get(architecture, architecture)
    class_name = _REGISTERED_CLASSES.get(model_type, "TokenizersBackend")
    return _build(class_name, arguments, tokenizer_object=_Adopted(backend))


def _tokenizer_class(name: str):
    """A transformers tokenizer class by name, imported on its own (transformers' lazy module imports just
    the tokenization module that defines it, which for these classes does not import torch)."""
    import transformers

    name = name.removesuffix("Fast") if name not in _GENERIC_CLASSES else "TokenizersBackend"
    cls = getattr(transformers, name, None) if name.endswith(("Tokenizer", "Backend")) else None
    if cls is None:
        raise TokenizerError(f"{name!r} is not a transformers tokenizer class")
    return cls


def _build(class_name: str, arguments: dict, **backend):
    """class_name(**backend, **arguments), `backend` being tokenizer_object= or tokenizer_file=: how
    transformers builds a GGUF's tokenizer (the class's __init__ takes the backend, adds the special
    tokens, sets the post-processor from add_bos_token / add_eos_token)."""
    return _tokenizer_class(class_name)(**backend, **arguments)


class _Adopted:
    """A backend handed to a tokenizer's __init__ as tokenizer_object without the deep copy __init__
    makes of it (2 s of Gemma's 4 s build; the backend was built for this tokenizer alone)."""

    def __init__(self, backend):
        self.backend = backend

    def __deepcopy__(self, memo):
        return self.backend


def save_tokenizer(tokenizer, folder: str | os.PathLike) -> Path:
    """Writes `tokenizer` to `folder`: transformers' files (so any tool reads it) and KWKER_TOKENIZER_FILE,
    from which load_tokenizer rebuilds the same class with the same arguments."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(folder)
    arguments = {
        key: _plain(tokenizer.init_kwargs[key])
        for key in _SAVED_ARGUMENTS
        if key in tokenizer.init_kwargs
    }
    record = {"format": _FORMAT, "class": type(tokenizer).__name__, "arguments": arguments}
    (folder / KWKER_TOKENIZER_FILE).write_text(
        json.dumps(record, indent=2, ensure_ascii=False) + "\n"
    )
    return folder


def _plain(value):
    """An argument as JSON holds it: special tokens by their text (the backend keeps their flags)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)  # an AddedToken


def _tokenizer_from_folder(folder: Path):
    record_path = folder / KWKER_TOKENIZER_FILE
    backend_file = folder / "tokenizer.json"
    if not backend_file.is_file():
        raise TokenizerError(f"{folder}: no tokenizer.json, so no tokenizer to load")
    if record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("format") != _FORMAT:
            raise TokenizerError(f"{record_path}: format {record.get('format')!r}, not {_FORMAT}")
        return _build(record["class"], record["arguments"], tokenizer_file=str(backend_file))
    return _tokenizer_class(_auto_class_name(folder)).from_pretrained(folder)


def _auto_class_name(folder: Path) -> str:
    """The tokenizer class AutoTokenizer.from_pretrained(folder) loads, for Kwker's model types: the
    tokenizer_config.json's tokenizer_class, unless transformers knows better for the model type."""
    hub = _read_json(folder / "tokenizer_config.json").get("tokenizer_class")
    model_type = _read_json(folder / "config.json").get("model_type")
    registered = _REGISTERED_CLASSES.get(model_type)
    if hub is None:
        return registered or "TokenizersBackend"
    hub = hub.removesuffix("Fast")
    if (
        hub == "LlamaTokenizer"
        and model_type != "mistral"
        and _byte_level(folder / "tokenizer.json")
    ):
        return "TokenizersBackend"  # LlamaTokenizer would force a Metaspace pipeline onto byte-level BPE
    if registered not in (None, *_GENERIC_CLASSES) and registered != hub:
        return registered if model_type in _HUB_CLASS_OVERRIDDEN else hub
    return hub


def _byte_level(tokenizer_json: Path) -> bool:
    spec = _read_json(tokenizer_json)
    return "ByteLevel" in json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
