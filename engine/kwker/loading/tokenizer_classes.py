"""What transformers' tokenizer classes build around a vocabulary, on the `tokenizers` library.

transformers 5.24's tokenizer classes (GPT2Tokenizer, LlamaTokenizer, GemmaTokenizer,
Qwen2Tokenizer, TokenizersBackend) each build a `tokenizers.Tokenizer` in their __init__: a
pipeline of their own around the vocabulary and merges (`pipeline`), then TokenizersBackend's
__init__ adds the special tokens the backend lacks and sets the post-processor that adds BOS /
EOS (`settle`). The steps are ported one by one, in transformers' order, since the order decides
the id a token new to the vocabulary gets; a tokenizer built here has the backend transformers'
has, down to its JSON.
"""

from __future__ import annotations

from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES: the named special tokens, in their order
NAMED_TOKENS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)

# Each class's special tokens when it is given none (its __init__'s defaults). TokenizersBackend
# has none when it gets a backend, as every path here gives it one.
DEFAULT_TOKENS = {
    "GPT2Tokenizer": {
        "unk_token": "<|endoftext|>",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
    },
    "LlamaTokenizer": {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>"},
    "GemmaTokenizer": {
        "unk_token": "<unk>",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "mask_token": "<mask>",
    },
    "Qwen2Tokenizer": {
        "unk_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
    },
    "TokenizersBackend": {},
}
# The class AutoTokenizer picks for a model type (transformers' TOKENIZER_MAPPING_NAMES; the types
# it does not list, llama among them, get TokenizersBackend), for the model types Kwker runs.
REGISTERED_CLASSES = {
    "qwen2": "Qwen2Tokenizer",
    "qwen3": "Qwen2Tokenizer",
    "gemma3": "GemmaTokenizer",
    "gemma3_text": "GemmaTokenizer",
    "mistral": "TokenizersBackend",  # MistralCommonBackend only with mistral-common and its files
    "phi3": "TokenizersBackend",
}
# the classes that build their own pipeline (the others take tokenizer.json as it is)
PIPELINE_CLASSES = {"GPT2Tokenizer", "LlamaTokenizer", "GemmaTokenizer", "Qwen2Tokenizer"}

# Qwen2Tokenizer's pre-tokenizer split (transformers.models.qwen2.tokenization_qwen2)
QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
SPACE = "\u2581"  # SentencePiece's word start


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte alphabet: each byte's character in a byte-level vocabulary. The printable
    bytes stand for themselves; the others (controls, space, 0x7f-0xa0, 0xad) are shifted to
    U+0100 onwards, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shifted = [b for b in range(256) if b not in printable]
    return {
        **{b: chr(b) for b in printable},
        **{b: chr(256 + n) for n, b in enumerate(shifted)},
    }


def pipeline(class_name: str, vocab: dict, merges: list, options: dict) -> Tokenizer:
    """The backend `class_name`'s __init__ builds for vocab and merges; options: the
    constructor's keyword arguments (add_prefix_space, legacy, unk_token)."""
    merges = merges or []
    if class_name == "GPT2Tokenizer":
        tok = Tokenizer(
            BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                end_of_word_suffix="", fuse_unk=False)
        )  # fmt: skip
        add_prefix_space = options.get("add_prefix_space", False)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
        tok.decoder = decoders.ByteLevel()
    elif class_name == "LlamaTokenizer":
        add_prefix_space = options.get("add_prefix_space")
        add_prefix_space = True if add_prefix_space is None else add_prefix_space
        legacy = options.get("legacy", False)
        tok = Tokenizer(
            BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True, dropout=None)
        )
        scheme = ("always" if legacy else "first") if add_prefix_space else "never"
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement=SPACE, prepend_scheme=scheme, split=False
        )
        steps = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        if add_prefix_space:
            steps.append(decoders.Strip(content=" ", left=1))
        tok.decoder = decoders.Sequence(steps)
    elif class_name == "GemmaTokenizer":
        unk = str(options.get("unk_token", "<unk>"))
        tok = Tokenizer(
            BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token=unk, dropout=None,
                byte_fallback=True)
        )  # fmt: skip
        tok.pre_tokenizer = pre_tokenizers.Split(
            pattern=" ", behavior="merged_with_previous", invert=False
        )
        tok.decoder = decoders.Sequence(
            [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
        )
        tok.normalizer = normalizers.Replace(" ", SPACE)
    elif class_name == "Qwen2Tokenizer":
        tok = Tokenizer(
            BPE(vocab=vocab, merges=merges, dropout=None, unk_token=None,
                continuing_subword_prefix="", end_of_word_suffix="", fuse_unk=False,
                byte_fallback=False)
        )  # fmt: skip
        tok.decoder = decoders.ByteLevel()
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(
                    add_prefix_space=bool(options.get("add_prefix_space")), use_regex=False
                ),
            ]
        )
    else:
        raise ValueError(f"{class_name} builds no pipeline of its own")
    return tok


def special_tokens(class_name: str, given: dict) -> dict:
    """The named special tokens a class ends up with: `given` (a None value: none) over the
    class's defaults, in NAMED_TOKENS order, then the model-specific names (image_token...)."""
    merged = {**DEFAULT_TOKENS[class_name], **given}
    out = {name: merged[name] for name in NAMED_TOKENS if merged.get(name) is not None}
    out.update((k, v) for k, v in merged.items() if k not in NAMED_TOKENS and v is not None)
    return out


def all_special(special: dict, extra: list) -> list[str]:
    """transformers' all_special_tokens: the named ones, then the extra ones, once each."""
    return list(dict.fromkeys(str(t) for t in [*special.values(), *extra]))


def settle(
    backend: Tokenizer,
    special: dict,
    extra: list = (),
    added: dict | None = None,
    add_bos: bool | None = None,
    add_eos: bool | None = None,
    post_processor=None,
    split_special_tokens: bool = False,
) -> None:
    """What TokenizersBackend.__init__ does to a backend built for it. special: the named special
    tokens (special_tokens()); extra: the extra special tokens; added: the added tokens by id
    (tokenizer_config.json's added_tokens_decoder); add_bos / add_eos: the flags, None where not
    given; post_processor: the one tokenizer.json had (a rebuilt pipeline keeps it)."""
    if post_processor is not None:
        backend.post_processor = post_processor
    update = add_bos is not None or add_eos is not None or backend.post_processor is None
    backend.encode_special_tokens = split_special_tokens
    # transformers compares the given added tokens with the ids of the backend's (its hash set is
    # of the dict's keys), so every one of them is added again: the same token is a no-op, one
    # with other flags takes them
    to_add = [token for _, token in sorted((added or {}).items())]
    present = [t.content for _, t in sorted(backend.get_added_tokens_decoder().items())]
    encoder = present + [str(t) for t in to_add]
    for token in [*special.values(), *extra]:
        if str(token) not in encoder and token not in to_add:
            to_add.append(token)
    named = [str(t) for t in special.values()]
    tokens = []
    for token in to_add:
        if isinstance(token, str):
            token = AddedToken(token, special=True)
        elif not token.special and str(token) in named:
            token.special = True
        tokens.append(token)
    if tokens:
        backend.add_tokens(tokens)
    if update or backend.post_processor is None:
        set_post_processor(backend, special, bool(add_bos), bool(add_eos))


def set_post_processor(backend: Tokenizer, special: dict, add_bos: bool, add_eos: bool) -> None:
    """TokenizersBackend.update_post_processor: BOS before and EOS after a text, as the flags say
    (a flag without its token is off)."""
    from tokenizers import processors

    bos, eos = special.get("bos_token"), special.get("eos_token")
    add_bos, add_eos = add_bos and bos is not None, add_eos and eos is not None
    bos, eos = str(bos), str(eos)
    single = f"{(bos + ':0 ') if add_bos else ''}$A:0{(' ' + eos + ':0') if add_eos else ''}"
    pair = single + (f" {bos}:1" if add_bos else "") + " $B:1" + (f" {eos}:1" if add_eos else "")
    ids = [(bos, _token_id(backend, bos, special))] if add_bos else []
    ids += [(eos, _token_id(backend, eos, special))] if add_eos else []
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair=pair, special_tokens=ids
    )


def _token_id(backend: Tokenizer, token: str, special: dict) -> int | None:
    found = backend.token_to_id(token)
    unk = special.get("unk_token")
    return found if found is not None or unk is None else backend.token_to_id(str(unk))


def generate_merges(vocab: dict, vocab_scores: dict | None = None) -> list[tuple[str, str]]:
    """The merges a vocabulary implies (transformers' generate_merges): every split of a token
    into two tokens, by the score of the token they make (best first), else by its id."""
    reverse = vocab_scores is not None
    scores = dict(vocab_scores) if reverse else vocab
    merges = []
    for merge, score in scores.items():
        local = []
        for i in range(1, len(merge)):
            left = merge[:i]
            if left in vocab:
                right = merge[i:]
                if right in vocab:
                    local.append((vocab[left], vocab[right], left, right, score))
        local.sort()  # by the ids, which no two splits of a token share
        merges.extend(local)
    merges.sort(key=lambda m: (m[4], len(m[2]), len(m[3])), reverse=reverse)
    return [(m[2], m[3]) for m in merges]
