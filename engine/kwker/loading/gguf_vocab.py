"""A GGUF file's tokenizer metadata as a `tokenizers` backend, as transformers 5.24 builds it.

A GGUF has no tokenizer.json: llama.cpp stores the vocabulary, the merges, each token's type and
the special token ids as metadata. transformers' `integrations/gguf/gguf_tokenizer_mapping.py`
(`get_gguf_tokenizer`, `convert_gguf_tokenizer`) hands them to a tokenizer class by the
vocabulary's kind (`tokenizer.ggml.model`): GPT2Tokenizer for byte-level BPE ("gpt2": SmolLM2,
Qwen, Llama 3), LlamaTokenizer for SentencePiece ("llama": Mistral, Phi-3), GemmaTokenizer for
Gemma's; adds the control tokens as special tokens and the user-defined ones as plain added
tokens; sets the pre-tokenizer's split from `tokenizer.ggml.pre`. The class AutoTokenizer picks for
the architecture then takes that backend (kwker.loading.tokenizer_classes.settle). Ported here
step by step, so that the backend is transformers' own, without importing it.
"""

from __future__ import annotations

from dataclasses import dataclass

from tokenizers import AddedToken, Regex, Tokenizer, normalizers, pre_tokenizers

from kwker.loading.gguf_file import GgufFile
from kwker.loading.tokenizer_classes import (
    QWEN2_SPLIT,
    REGISTERED_CLASSES,
    SPACE,
    all_special,
    bytes_to_unicode,
    generate_merges,
    pipeline,
    settle,
    special_tokens,
)

# transformers' GGUF_TOKENIZER_MAPPING: metadata keys (under "tokenizer.") by the names the
# converter reads them under, for the vocabulary and for the tokenizer's arguments
_VOCAB_KEYS = {
    "ggml.model": "tokenizer_type",
    "ggml.pre": "pre_tokenizer_type",
    "ggml.tokens": "tokens",
    "ggml.scores": "scores",
    "ggml.token_type": "token_type",
    "ggml.merges": "merges",
}
_ARGUMENT_KEYS = {
    "chat_template": "chat_template",
    "ggml.add_bos_token": "add_bos_token",
    "ggml.add_eos_token": "add_eos_token",
}
# get_gguf_tokenizer's special tokens: the argument, and its id's metadata key under tokenizer.ggml.
_SPECIAL_TOKEN_IDS = {
    "bos_token": "bos_token_id",
    "eos_token": "eos_token_id",
    "unk_token": "unknown_token_id",
    "pad_token": "padding_token_id",
}
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types

# the model type of a GGUF architecture, where the two differ
_GGUF_MODEL_TYPES = {"qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}

# the pre-tokenizer splits of GGUF_PRE_TOKENIZER_SPLITS, by tokenizer.ggml.pre
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_SPLITS = {
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "dbrx",
            "smaug-bpe",
        ),
        _LLAMA3_SPLIT,
    ),  # fmt: skip
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}


class GgufTokenizerError(ValueError):
    """Metadata no tokenizer can be built from; the message names the file."""


@dataclass
class GgufTokenizer:
    """What a GGUF's tokenizer is: its backend, named special tokens and chat template."""

    backend: Tokenizer
    special: dict[str, str]
    chat_template: str | None


def gguf_tokenizer_parts(gguf: GgufFile) -> tuple[str, dict, dict]:
    """(architecture, vocabulary, arguments) as transformers' get_gguf_tokenizer returns them:
    the vocabulary's metadata under the converter's names, and the tokenizer's arguments (special
    tokens by their text, add_bos_token defaulted as llama.cpp does, the chat template)."""
    meta = gguf.metadata
    architecture = meta.get("general.architecture")
    tokens = meta.get("tokenizer.ggml.tokens")
    if architecture is None or tokens is None:
        missing = "general.architecture" if architecture is None else "tokenizer.ggml.tokens"
        raise GgufTokenizerError(
            f"{gguf.path}: the metadata has no {missing}, so there is no tokenizer to build"
        )
    vocab, arguments = (
        {name: meta[f"tokenizer.{key}"] for key, name in keys.items() if f"tokenizer.{key}" in meta}
        for keys in (_VOCAB_KEYS, _ARGUMENT_KEYS)
    )
    kind = vocab.get("tokenizer_type")
    if kind == "llama":
        # older files have no flag, and llama.cpp adds BOS to a sentencepiece vocabulary that
        # does not say otherwise
        arguments.setdefault("add_bos_token", True)
    elif kind == "gemma4":
        # the flag is set, but the reference tokenizer adds none: its chat template writes <bos>
        arguments["add_bos_token"] = False
    for name, key in _SPECIAL_TOKEN_IDS.items():
        token_id = meta.get(f"tokenizer.ggml.{key}")
        if token_id is not None and not 0 <= token_id < len(tokens):
            raise GgufTokenizerError(
                f"{gguf.path}: tokenizer.ggml.{key} is {token_id}, outside the vocabulary of "
                f"{len(tokens)}"
            )
        arguments[name] = tokens[token_id] if token_id is not None else None
    return architecture, vocab, arguments


def gguf_tokenizer(gguf: GgufFile) -> GgufTokenizer:
    """The tokenizer AutoTokenizer.from_pretrained(folder, gguf_file=name) builds, from the
    metadata already read."""
    architecture, vocab, arguments = gguf_tokenizer_parts(gguf)
    kind = vocab.get("tokenizer_type")
    build = _SENTENCEPIECE_BUILDERS.get(architecture) if kind == "llama" else None
    build = build or _BUILDERS.get(kind)
    if build is None:
        raise GgufTokenizerError(
            f"{gguf.path}: Cannot build a tokenizer from a GGUF file stating tokenizer {kind!r}. "
            f"Supported: {sorted(_BUILDERS)}."
        )
    backend = build(vocab)
    _add_special_tokens(backend, vocab)
    split = _SPLITS.get(vocab.get("pre_tokenizer_type"))
    if split is not None:  # the split the vocabulary's merges were learned on
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(split), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
    # the class AutoTokenizer picks for the architecture takes that backend
    model_type = _GGUF_MODEL_TYPES.get(architecture, architecture)
    class_name = REGISTERED_CLASSES.get(model_type, "TokenizersBackend")
    special = special_tokens(class_name, {k: arguments[k] for k in _SPECIAL_TOKEN_IDS})
    settle(
        backend, special, add_bos=arguments.get("add_bos_token"),
        add_eos=arguments.get("add_eos_token"),
    )  # fmt: skip
    if class_name == "Qwen2Tokenizer":  # its __init__'s last step
        backend.add_tokens([AddedToken(t, special=True) for t in all_special(special, [])])
    return GgufTokenizer(
        backend, {k: str(v) for k, v in special.items()}, arguments.get("chat_template")
    )


def _intermediate(class_name: str, vocab: dict, merges: list) -> Tokenizer:
    """The backend of class_name(vocab=vocab, merges=merges), the converter's first step."""
    backend = pipeline(class_name, vocab, merges, {})
    settle(backend, special_tokens(class_name, {}))
    return backend


def _merges(vocab: dict, scores: dict | None = None) -> list:
    """The merges the file gives, or the ones its vocabulary implies (by `scores`, else by the
    file's scores)."""
    if "merges" in vocab:
        return [tuple(merge.split(" ")) for merge in vocab["merges"]]
    tokens = vocab["tokens"]
    if scores is None:
        scores = dict(zip(tokens, vocab["scores"], strict=False))
    return generate_merges({t: i for i, t in enumerate(tokens)}, scores)


def _sentencepiece(vocab: dict, class_name: str = "LlamaTokenizer", scores=None) -> Tokenizer:
    ids = {token: i for i, token in enumerate(vocab["tokens"])}
    return _intermediate(class_name, ids, _merges(vocab, scores))


def _gemma(vocab: dict) -> Tokenizer:
    """Sentencepiece, with Gemma's two fixes: a token of two or more spaces is stored as spaces
    where GemmaTokenizer looks "▁▁" up, and the merges come from the tokens' order in the file
    (Gemma's scores do not follow its merge order)."""
    tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in vocab["tokens"]]
    positions = {token: -i for i, token in enumerate(tokens)}
    return _sentencepiece({**vocab, "tokens": tokens}, "GemmaTokenizer", positions)


def _phi3(vocab: dict) -> Tokenizer:
    """Sentencepiece, with the prefix space from a normalizer instead of Metaspace (Phi-3's
    tokenizer.json, which a GGUF does not carry)."""
    backend = _sentencepiece(vocab)
    backend.normalizer = normalizers.Sequence(
        [normalizers.Prepend(prepend=SPACE), normalizers.Replace(pattern=" ", content=SPACE)]
    )
    backend.pre_tokenizer = None
    return backend


def _byte_level(vocab: dict) -> Tokenizer:
    """Byte-level BPE: a token spelled outside the byte alphabet is spelled in it."""
    spelling = bytes_to_unicode()
    alphabet = set(spelling.values())
    ids = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(vocab["tokens"])
    }
    return _intermediate("GPT2Tokenizer", ids, _merges(vocab))


def _add_special_tokens(backend: Tokenizer, vocab: dict) -> None:
    """The tokens the file marks as control (<|endoftext|>) added as special tokens, the ones it
    marks user-defined (<think>) as plain added tokens: else they are cut into pieces. In a
    byte-level vocabulary a control token spelled outside the byte alphabet is one llama.cpp
    mislabelled, and is left out (it would grow the vocabulary past the model's)."""
    spelled = set(bytes_to_unicode().values()) if vocab.get("tokenizer_type") == "gpt2" else None
    types = list(zip(vocab["tokens"], vocab.get("token_type") or (), strict=False))
    control = [
        AddedToken(token, normalized=False, special=True)
        for token, kind in types
        if kind == _CONTROL and (spelled is None or set(token) <= spelled)
    ]
    if control:
        backend.add_special_tokens(control)
    known = backend.get_vocab(with_added_tokens=True)
    user_defined = [
        AddedToken(token, normalized=False, special=False)
        for token, kind in types
        if kind == _USER_DEFINED and token in known
    ]
    if user_defined:
        backend.add_tokens(user_defined)


_SENTENCEPIECE_BUILDERS = {"gemma": _gemma, "gemma2": _gemma, "gemma3": _gemma, "phi3": _phi3}
_BUILDERS = {
    "gpt2": _byte_level,
    "llama": _sentencepiece,
    "gemma4": lambda vocab: _sentencepiece(vocab, "GemmaTokenizer"),
}
