"""A tokenizer folder read as transformers 5.24's AutoTokenizer.from_pretrained(folder) reads it.

The folder holds tokenizer.json (the `tokenizers` backend), and may hold tokenizer_config.json
(the special tokens, the added tokens, the class and the chat template), special_tokens_map.json
(the special tokens of older folders), chat_template.jinja and additional_chat_templates/*.jinja
(templates, which win over the config's), and a model folder's config.json (its model type). The
class AutoTokenizer picks matters: GPT2Tokenizer, LlamaTokenizer, GemmaTokenizer and
Qwen2Tokenizer rebuild their own pipeline around tokenizer.json's vocabulary and merges (Qwen's
with NFC), where TokenizersBackend takes tokenizer.json as it is; any other class is read as
TokenizersBackend reads it. Not ported: added_tokens.json (slow tokenizers' legacy file) and
Mistral's fix_mistral_regex option.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Tokenizer

from kwker.loading.tokenizer_classes import (
    DEFAULT_TOKENS,
    NAMED_TOKENS,
    PIPELINE_CLASSES,
    REGISTERED_CLASSES,
    all_special,
    pipeline,
    settle,
    special_tokens,
)

# the types whose hub tokenizer_class AutoTokenizer overrides (MODELS_WITH_INCORRECT_HUB_
# TOKENIZER_CLASS), among the model types Kwker runs
_HUB_CLASS_OVERRIDDEN = {"qwen2", "phi3"}
_GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast", "PythonBackend"}


def folder_tokenizer(folder: Path) -> dict:
    """The keyword arguments of kwker.loading.tokenizer.Tokenizer for the tokenizer
    AutoTokenizer.from_pretrained(folder) loads: backend, special_tokens, extra_special_tokens,
    chat_template, clean_up_tokenization_spaces. The folder has a tokenizer.json."""
    class_name = auto_class_name(folder)
    config = read_json(folder / "tokenizer_config.json")
    spec = read_json(folder / "tokenizer.json")
    # with a tokenizer.json the flags are its post-processor's, whatever the config says
    for key in ("tokenizer_class", "init_inputs", "add_bos_token", "add_eos_token"):
        config.pop(key, None)
    template = _chat_templates(folder, config.get("chat_template"))
    if not config.get("extra_special_tokens") and "additional_special_tokens" in config:
        config["extra_special_tokens"] = config.pop("additional_special_tokens")
    specific = {
        k: v for k, v in config.items() if k not in NAMED_TOKENS and _is_token_name(k, v, str)
    }
    if isinstance(config.get("extra_special_tokens"), dict):
        specific.update(config.pop("extra_special_tokens"))
    for key in specific:
        config.pop(key)
    added = _added_tokens(config, spec, folder)
    if "additional_special_tokens" in config and "extra_special_tokens" not in config:
        config["extra_special_tokens"] = config.pop("additional_special_tokens")
    config = _tokens_as_added(config)
    by_text = {str(t): t for t in added.values()}
    for key in NAMED_TOKENS:
        if config.get(key) is not None and by_text:
            config[key] = by_text.get(str(config[key]), config[key])
    # PreTrainedTokenizerBase.__init__ takes the other *_token arguments as model-specific ones,
    # before the ones the loader set apart
    automatic = {k: v for k, v in config.items() if k not in NAMED_TOKENS and _is_token_name(k, v)}
    given = {k: config[k] for k in NAMED_TOKENS if k in config}
    special = special_tokens(class_name, {**given, **automatic, **specific})
    extra = config.get("extra_special_tokens") or []
    if class_name in PIPELINE_CLASSES:
        backend, post_processor = _rebuilt(class_name, spec, folder, config)
    else:
        backend, post_processor = Tokenizer.from_file(str(folder / "tokenizer.json")), None
    settle(
        backend, special, extra, added, post_processor=post_processor,
        split_special_tokens=bool(config.get("split_special_tokens", False)),
    )  # fmt: skip
    if class_name == "Qwen2Tokenizer":  # its __init__'s last step
        backend.add_tokens([AddedToken(t, special=True) for t in all_special(special, extra)])
    return dict(
        backend=backend,
        special_tokens={k: str(v) for k, v in special.items()},
        extra_special_tokens=[str(t) for t in extra],
        chat_template=template,
        clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)),
    )


def auto_class_name(folder: Path) -> str:
    """The tokenizer class AutoTokenizer.from_pretrained(folder) loads, for Kwker's model types:
    the class tokenizer_config.json (or config.json) names, unless transformers knows better for
    the model type; a class whose pipeline is not ported here is read as TokenizersBackend."""
    config = read_json(folder / "config.json")
    hub = read_json(folder / "tokenizer_config.json").get("tokenizer_class")
    hub = hub or config.get("tokenizer_class")
    model_type = config.get("model_type") or None
    registered = REGISTERED_CLASSES.get(model_type)
    if hub is None:
        name = registered or "TokenizersBackend"
    elif (
        hub.removesuffix("Fast") == "LlamaTokenizer"
        and model_type not in _HUB_CLASS_OVERRIDDEN
        and '"ByteLevel"' in (folder / "tokenizer.json").read_text(encoding="utf-8")
    ):
        name = "TokenizersBackend"  # Llama's Metaspace pipeline does not fit byte-level BPE
    elif registered is not None and registered != hub.removesuffix("Fast"):
        overridden = model_type in _HUB_CLASS_OVERRIDDEN
        name = "TokenizersBackend" if registered in _GENERIC_CLASSES else None
        name = name or (registered if overridden else hub.removesuffix("Fast"))
    else:
        name = hub.removesuffix("Fast")
    return name if name in DEFAULT_TOKENS else "TokenizersBackend"


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def _is_token_name(key: str, value, kinds=(str, AddedToken)) -> bool:
    return key.endswith("_token") and isinstance(value, kinds)


def _chat_templates(folder: Path, configured):
    """The chat template: chat_template.jinja and additional_chat_templates/NAME.jinja (a dict of
    templates by name when there are named ones) over the config's (a list of {name, template}
    is such a dict too)."""
    found = {}
    if (folder / "chat_template.jinja").is_file():
        found["default"] = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    for path in sorted((folder / "additional_chat_templates").glob("*.jinja")):
        found[path.name.removesuffix(".jinja")] = path.read_text(encoding="utf-8")
    if found:
        return found["default"] if list(found) == ["default"] else found
    if isinstance(configured, list | tuple):
        return {t["name"]: t["template"] for t in configured}
    return configured


def _added_tokens(config: dict, spec: dict, folder: Path) -> dict[int, AddedToken]:
    """The added tokens by id: tokenizer_config.json's added_tokens_decoder; in older folders
    (without one) tokenizer.json's, and special_tokens_map.json's special tokens go into the
    config."""
    if "added_tokens_decoder" in config:
        return {int(i): _added_token(t) for i, t in config.pop("added_tokens_decoder").items()}
    for key, value in read_json(folder / "special_tokens_map.json").items():
        if isinstance(value, dict) and key != "extra_special_tokens":
            value = AddedToken(**{k: v for k, v in value.items() if k != "special"}, special=True)
        elif key == "extra_special_tokens" and isinstance(value, list):
            merged = list(config.get("extra_special_tokens") or [])
            for token in value:
                token = AddedToken(**token, special=True) if isinstance(token, dict) else token
                if token not in merged:
                    merged.append(token)
            value = merged
        config[key] = value
    return {
        t["id"]: _added_token({k: v for k, v in t.items() if k != "id"})
        for t in spec.get("added_tokens", [])
    }


def _added_token(token) -> AddedToken:
    if isinstance(token, AddedToken):
        return token
    return AddedToken(**{k: v for k, v in token.items() if k != "__type"})


def _tokens_as_added(value):
    """The config with every {"__type": "AddedToken", ...} as an AddedToken."""
    if isinstance(value, dict) and value.get("__type") == "AddedToken":
        return _added_token(value)
    if isinstance(value, list | tuple):
        return [_tokens_as_added(v) for v in value]
    if isinstance(value, dict):
        return {k: _tokens_as_added(v) for k, v in value.items()}
    return value


def _rebuilt(class_name: str, spec: dict, folder: Path, config: dict):
    """(backend, post-processor) of a class that rebuilds its pipeline: the vocabulary and merges
    of tokenizer.json, and its post-processor (read from a copy without the vocabulary: cheap)."""
    model = spec.get("model", {})
    if model.get("type") not in (None, "Unigram"):
        bare = {**spec, "added_tokens": [], "model": {**model, "vocab": {}}}
        if model.get("type") == "BPE":
            bare["model"]["merges"] = []
        post_processor = Tokenizer.from_str(json.dumps(bare)).post_processor
    else:
        post_processor = Tokenizer.from_file(str(folder / "tokenizer.json")).post_processor
    vocab = model.get("vocab")
    if isinstance(vocab, list):
        vocab = {t[0] if isinstance(t, list) else t: i for i, t in enumerate(vocab)}
    merges = [
        tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])
    ]
    options = dict(config)
    options.setdefault("unk_token", DEFAULT_TOKENS[class_name].get("unk_token"))
    return pipeline(class_name, vocab, merges, options), post_processor
