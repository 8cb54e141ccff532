"""Tokenizers to compare with transformers' (a helper module, not tests): tiny GGUF files of each
vocabulary kind Kwker's families use, the texts and chats to compare on, and the comparison."""

from __future__ import annotations

import json

from loading_files import write

from kwker.loading.tokenizer_classes import bytes_to_unicode

TEXTS = [
    "Hello world",
    "hello, World! How's it going?",
    " leading space",
    "   three leading spaces",
    "trailing spaces   ",
    "multiple   inner    spaces",
    "line\nbreak\n\ntwo\r\nwindows",
    "\ttabs\tand\t\tmore",
    "héllo wörld, naïve café",
    "e\u0301 (a decomposed accent)",
    "日本語のテキストと中文",
    "Ελληνικά и русский текст",
    "emoji 🤖🎉👍🏽 family 👨‍👩‍👧",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < 10; ++i) { x += a[i]; }",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>",
    "<|endoftext|> <bos> <eos> <s></s> <start_of_turn>model<|eot_id|>",
    "numbers 1234567890 3.14159 1e-5",
    "",
    " ",
    "\n",
    "  ",
    "a" * 200,
]
CHATS = [
    [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "  Hi there\n  (spaces) 🤖"},
        {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
        {"role": "user", "content": "Thanks! 日本語"},
    ],
]

WEATHER = {"type": "object", "properties": {"city": {"type": "string",
           "description": "a city, e.g. Zürich or 東京"}}, "required": ["city"]}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather 🌦",
                                           "parameters": WEATHER}}]  # fmt: skip
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}  # fmt: skip
TOOL_CHAT = [
    {"role": "system", "content": "Use the tools."},
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "call12345", "name": "get_weather"},
    {"role": "assistant", "content": "It is 21 degrees."},
    {"role": "user", "content": "And tomorrow?"},
]


def state(tok) -> dict:
    """What makes two tokenizers the same: the backend (normalizer, pre-tokenizer, model, added
    tokens, post-processor, decoder), the special tokens and the chat template."""
    return dict(
        backend=json.loads(tok.backend_tokenizer.to_str()),
        special=tok.special_tokens_map,
        ids=(tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id),
        all_special=(tok.all_special_tokens, tok.all_special_ids),
        added=tok.get_added_vocab(),
        chat_template=tok.chat_template,
        size=len(tok),
    )


def assert_same_tokenizer(ours, theirs, chats=CHATS):
    """ours (kwker.loading.tokenizer's) gives what theirs (transformers') gives: the same state,
    ids, text back (every 3000th token alone too) and chat prompts."""
    a, b = state(ours), state(theirs)
    assert [k for k in a if a[k] != b[k]] == []
    for text in TEXTS:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(
                text, add_special_tokens=special
            ), text
    assert ours(TEXTS)["input_ids"] == theirs(TEXTS)["input_ids"]
    ids = theirs.encode("".join(TEXTS)) + [i for i in theirs.all_special_ids if i is not None]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
            ids, skip_special_tokens=skip
        )
    every = range(0, len(theirs), max(1, len(theirs) // 3000))
    assert [ours.decode([i]) for i in every] == [theirs.decode([i]) for i in every]
    added = sorted(theirs.get_added_vocab().values())  # which of them decoding drops
    assert [ours.decode([i], skip_special_tokens=True) for i in added] == [
        theirs.decode([i], skip_special_tokens=True) for i in added
    ]
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    tokens = theirs.convert_ids_to_tokens(ids) + ["not-a-token-at-all"]
    assert ours.convert_tokens_to_ids(tokens) == theirs.convert_tokens_to_ids(tokens)
    if theirs.chat_template is None:
        return
    for chat in chats:
        for prompt in (True, False):
            args = dict(add_generation_prompt=prompt)
            text = ours.apply_chat_template(chat, tokenize=False, **args)
            assert text == theirs.apply_chat_template(chat, tokenize=False, **args)
            ids = ours.apply_chat_template(chat, **args)["input_ids"]
            assert ids == theirs.apply_chat_template(chat, **args)["input_ids"]
            assert ids == ours.apply_chat_template(chat, return_dict=False, **args)


# ---- tiny GGUF files: a vocabulary of each kind, as llama.cpp's converter writes it ------------

STRING, ARRAY, UINT32, INT32, FLOAT32, BOOL = 8, 9, 4, 5, 6, 7
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6  # llama.cpp's token types
SP = "\u2581"
BYTE_MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("Ġ", "w"), ("o", "r"), ("Ġw", "or"),
               ("l", "d"), ("Ġwor", "ld"), ("l", "l"), ("e", "ll"), ("H", "ell"), ("Hell", "o"),
               ("i", "n"), ("Ġ", "Ġ"), ("ĠĠ", "ĠĠ"), ("Ċ", "Ċ"), ("Ġ", "a"), ("Ġa", "nd"),
               ("n", "d"), ("ä", "¸")]  # fmt: skip
PIECES = [SP, "e", "h", "l", "o", "t", "w", "r", "d", "a", "n", "i", "s", "H", f"{SP}t", "he",
          f"{SP}the", "ll", f"{SP}h", f"{SP}he", "llo", f"{SP}hello", f"{SP}w", "or", f"{SP}wor",
          "ld", f"{SP}world", "in", "an", f"{SP}a", f"{SP}an", f"{SP}and", f"{SP}{SP}",
          f"{SP * 4}", "\n", "el", "Hel", "Hello", f"{SP}Hello"]  # fmt: skip
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3 = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
MISTRAL = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]"
    "{% elif m.role == 'assistant' %}{{ m.content }}{{ eos_token }}{% endif %}{% endfor %}"
)
GEMMA = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant'"
    " else m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _byte_level(extra: list[tuple[str, int]]):
    tokens = [*bytes_to_unicode().values(), *dict.fromkeys(a + b for a, b in BYTE_MERGES)]
    types = [NORMAL] * len(tokens)
    return tokens + [t for t, _ in extra], types + [k for _, k in extra]


def _sentencepiece(head: list[tuple[str, int]], tail=()):
    tokens = [t for t, _ in head] + [f"<0x{b:02X}>" for b in range(256)] + PIECES
    types = [k for _, k in head] + [BYTE] * 256 + [NORMAL] * len(PIECES)
    tokens += [t for t, _ in tail]
    types += [k for _, k in tail]
    return tokens, types


def _metadata(arch, kind, tokens, types, *, pre=None, merges=None, scores=None, ids=(),
              flags=(), template=None):  # fmt: skip
    meta = [("general.architecture", STRING, arch), ("tokenizer.ggml.model", STRING, kind)]
    if pre:
        meta.append(("tokenizer.ggml.pre", STRING, pre))
    meta += [
        ("tokenizer.ggml.tokens", ARRAY, (STRING, tokens)),
        ("tokenizer.ggml.token_type", ARRAY, (INT32, types)),
        (
            "tokenizer.ggml.scores",
            ARRAY,
            (FLOAT32, scores or [-float(i) for i in range(len(tokens))]),
        ),
    ]
    if merges is not None:
        meta.append(("tokenizer.ggml.merges", ARRAY, (STRING, [f"{a} {b}" for a, b in merges])))
    meta += [(f"tokenizer.ggml.{k}", UINT32, tokens.index(v)) for k, v in dict(ids).items()]
    meta += [(f"tokenizer.ggml.{k}", BOOL, v) for k, v in dict(flags).items()]
    if template:
        meta.append(("tokenizer.chat_template", STRING, template))
    return meta


def tiny_gguf_metadata(kind: str) -> list:
    """A GGUF's tokenizer metadata, of one of TINY_KINDS."""
    if kind == "llama3":  # Llama 3's byte-level BPE: no <|endoftext|> in it, BOS on
        specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                    "<|end_header_id|>", "<|eot_id|>"]  # fmt: skip
        tokens, types = _byte_level([(t, CONTROL) for t in specials])
        return _metadata(
            "llama", "gpt2", tokens, types, pre="llama-bpe", merges=BYTE_MERGES,
            ids={"bos_token_id": specials[0], "eos_token_id": "<|eot_id|>"},
            flags={"add_bos_token": True}, template=LLAMA3,
        )  # fmt: skip
    if kind == "qwen2":  # Qwen's: user-defined <think>, a control token outside the alphabet
        extra = [("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
                 ("<think>", USER_DEFINED), ("</think>", USER_DEFINED),
                 ("<｜fim｜>", CONTROL)]  # fmt: skip
        tokens, types = _byte_level(extra)
        return _metadata(
            "qwen2", "gpt2", tokens, types, pre="qwen2", merges=BYTE_MERGES,
            ids={"bos_token_id": "<|endoftext|>", "eos_token_id": "<|im_end|>",
                 "padding_token_id": "<|endoftext|>"},
            flags={"add_bos_token": False}, template=CHATML,
        )  # fmt: skip
    if kind == "smollm2":  # SmolLM2's: byte-level BPE under the llama architecture, no pre split
        extra = [("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL), ("<|endoftext|>", CONTROL)]
        tokens, types = _byte_level(extra)
        return _metadata(
            "llama", "gpt2", tokens, types, pre="smollm", merges=BYTE_MERGES,
            ids={"bos_token_id": "<|im_start|>", "eos_token_id": "<|im_end|>",
                 "unknown_token_id": "<|endoftext|>", "padding_token_id": "<|im_end|>"},
            flags={"add_bos_token": False}, template=CHATML,
        )  # fmt: skip
    if kind in ("mistral", "phi3"):  # SentencePiece, merges from the scores, BOS by default
        head = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)]
        tokens, types = _sentencepiece(head, [("[INST]", CONTROL), ("[/INST]", CONTROL)])
        return _metadata(
            "llama" if kind == "mistral" else "phi3", "llama", tokens, types,
            ids={"bos_token_id": "<s>", "eos_token_id": "</s>", "unknown_token_id": "<unk>"},
            template=MISTRAL,
        )  # fmt: skip
    if kind == "gemma3":  # Gemma's: spaces stored as spaces, merges by the tokens' order
        head = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN),
                ("<mask>", USER_DEFINED), ("<start_of_turn>", CONTROL),
                ("<end_of_turn>", CONTROL)]  # fmt: skip
        tail = [("  ", NORMAL), ("   ", NORMAL), ("<think>", USER_DEFINED)]
        tokens, types = _sentencepiece(head, tail)
        return _metadata(
            "gemma3", "llama", tokens, types,
            ids={"bos_token_id": "<bos>", "eos_token_id": "<eos>", "unknown_token_id": "<unk>",
                 "padding_token_id": "<pad>"},
            flags={"add_bos_token": True, "add_eos_token": False}, template=GEMMA,
        )  # fmt: skip
    raise ValueError(kind)


TINY_KINDS = ["llama3", "qwen2", "smollm2", "mistral", "phi3", "gemma3"]


def tiny_gguf(kind: str, folder):
    """Writes the tiny GGUF of `kind` (tokenizer metadata only) to folder; returns its path."""
    path = folder / f"{kind}.gguf"
    write(path, tiny_gguf_metadata(kind))
    return path
