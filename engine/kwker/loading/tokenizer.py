"""A model's tokenizer without transformers (nor torch): from a GGUF file's metadata, or a folder.

`Tokenizer` holds a `tokenizers` backend (Hugging Face's Rust library), the special tokens and
the chat template, with the part of transformers' tokenizer API Kwker uses, under transformers'
names (so code that takes a tokenizer takes a transformers one too):

    tok = load_tokenizer("SmolLM2-135M-Instruct.Q4_1.gguf")
    ids = tok.encode("Hello")                               # tok("Hello")["input_ids"] too
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)["input_ids"]
    text = tok.decode(ids, skip_special_tokens=True)

`load_tokenizer` builds what transformers 5.24's AutoTokenizer builds for the same source, with
the same backend (normalizer, pre-tokenizer, model, added tokens, post-processor, decoder), so
the same ids and text:

- a GGUF: kwker.loading.gguf_vocab ports transformers' GGUF converter;
- a folder `save_tokenizer` wrote (KWKER_TOKENIZER_FILE): its backend as saved, and its record;
- any other folder with a tokenizer.json: kwker.loading.tokenizer_folder reads it as
  AutoTokenizer.from_pretrained(folder) does.

Chat templates render as transformers renders them (kwker.loading.chat_template).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from kwker.loading.gguf_file import GgufFile, read_gguf
from kwker.loading.tokenizer_classes import DEFAULT_TOKENS, NAMED_TOKENS, special_tokens

# The file save_tokenizer writes beside tokenizer.json, last: the special tokens and the template.
# Format 1 (written through transformers) named the class and its arguments; it still loads.
KWKER_TOKENIZER_FILE = "kwker_tokenizer.json"
_FORMAT = 2


class TokenizerError(ValueError):
    """A source no tokenizer can be built from; the message names it."""


class Tokenizer:
    """A tokenizer: `backend_tokenizer` (a tokenizers.Tokenizer, which encodes, decodes and holds
    the added tokens), the special tokens by name (bos_token, eos_token, ... and model-specific
    ones such as image_token), extra special tokens, and the chat template (a string, or a dict
    of named templates). Special tokens are what a chat template sees as bos_token, eos_token...
    and what all_special_ids lists; which tokens decode(skip_special_tokens=True) drops is the
    backend's (its added tokens flagged special)."""

    def __init__(
        self,
        backend,
        special_tokens: dict[str, str] | None = None,
        extra_special_tokens=(),
        chat_template: str | dict | None = None,
        clean_up_tokenization_spaces: bool = False,
    ):
        self.backend_tokenizer = backend
        # transformers turns padding and truncation off for every call that does not ask for them
        backend.no_padding()
        backend.no_truncation()
        self._special = {k: str(v) for k, v in (special_tokens or {}).items() if v is not None}
        self.extra_special_tokens = [str(t) for t in extra_special_tokens]
        self.chat_template = chat_template
        # transformers' clean-up of " ." and " 's", skipped for BPE models as transformers does
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces

    def __repr__(self) -> str:
        return f"Tokenizer({len(self)} tokens, {self.special_tokens_map})"

    # -- special tokens ------------------------------------------------------------------------

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens: bos_token, eos_token, ... in that order, then the
        model-specific ones."""
        order = [
            *(k for k in NAMED_TOKENS if k in self._special),
            *(k for k in self._special if k not in NAMED_TOKENS),
        ]
        return {k: self._special[k] for k in order}

    def _named(name: str):
        def get(self) -> str | None:
            return self._special.get(name)

        def set_(self, value) -> None:
            if value is None:
                self._special.pop(name, None)
            else:
                self._special[name] = str(value)

        return property(get, set_, doc=f"The {name.replace('_', ' ')} (None: none).")

    def _named_id(name: str):
        def get(self) -> int | None:
            token = self._special.get(name)
            return None if token is None else self.convert_tokens_to_ids(token)

        return property(get, doc=f"The {name.replace('_', ' ')}'s id (None: none).")

    bos_token, eos_token = _named("bos_token"), _named("eos_token")
    unk_token, pad_token = _named("unk_token"), _named("pad_token")
    bos_token_id, eos_token_id = _named_id("bos_token"), _named_id("eos_token")
    unk_token_id, pad_token_id = _named_id("unk_token"), _named_id("pad_token")
    del _named, _named_id

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, then the extra ones, once each."""
        return list(dict.fromkeys([*self.special_tokens_map.values(), *self.extra_special_tokens]))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    # -- the vocabulary ------------------------------------------------------------------------

    def __len__(self) -> int:
        """The vocabulary's size, added tokens included."""
        return self.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    def get_vocab(self) -> dict[str, int]:
        """Every token's id, added tokens included (built anew: 0.1 s for 150k tokens)."""
        return self.backend_tokenizer.get_vocab(with_added_tokens=True)

    def get_added_vocab(self) -> dict[str, int]:
        """The added tokens' ids (special or not), in id order."""
        decoder = self.backend_tokenizer.get_added_tokens_decoder()
        return {decoder[i].content: i for i in sorted(decoder)}

    def add_tokens(self, tokens, special: bool = False) -> int:
        """Adds tokens (strings or tokenizers.AddedToken) to the vocabulary, those it lacks at its
        end; special=True adds them as special tokens (kept whole, dropped by
        decode(skip_special_tokens=True), listed in all_special_tokens). Returns how many were
        added."""
        tokens = [tokens] if isinstance(tokens, str) else list(tokens)
        if not special:
            return self.backend_tokenizer.add_tokens(tokens)
        for token in map(str, tokens):
            if token not in self.extra_special_tokens:
                self.extra_special_tokens.append(token)
        return self.backend_tokenizer.add_special_tokens(tokens)

    def convert_tokens_to_ids(self, tokens: str | list[str]):
        """A token's id (a list's ids); one not in the vocabulary is the unknown token's (None
        without one)."""
        if isinstance(tokens, str):
            found = self.backend_tokenizer.token_to_id(tokens)
            if found is None and self._special.get("unk_token") is not None:
                return self.backend_tokenizer.token_to_id(self._special["unk_token"])
            return found
        return [self.convert_tokens_to_ids(t) for t in tokens]

    def convert_ids_to_tokens(self, ids, skip_special_tokens: bool = False):
        """An id's token (a list's tokens, without the special ones if asked)."""
        if isinstance(ids, int):
            return self.backend_tokenizer.id_to_token(ids)
        skipped = set(self.all_special_ids) if skip_special_tokens else set()
        return [self.backend_tokenizer.id_to_token(int(i)) for i in ids if int(i) not in skipped]

    # -- text ----------------------------------------------------------------------------------

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of `text`; add_special_tokens: with the BOS / EOS the tokenizer adds."""
        # encode_batch lets go of the GIL (encode does not): a server's long prompt is encoded
        # on a worker thread while its event loop answers
        (encoding,) = self.backend_tokenizer.encode_batch(
            [text], add_special_tokens=add_special_tokens
        )
        return encoding.ids

    def __call__(self, text: str | list[str], add_special_tokens: bool = True) -> dict:
        """{"input_ids": encode(text)}, or a list of them for a list of texts (transformers'
        tokenizer(text) without its other outputs)."""
        if isinstance(text, str):
            return {"input_ids": self.encode(text, add_special_tokens)}
        batch = self.backend_tokenizer.encode_batch(
            list(text), add_special_tokens=add_special_tokens
        )
        return {"input_ids": [e.ids for e in batch]}

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of ids (a list, an array, one id)."""
        ids = [int(ids)] if isinstance(ids, int) else [int(i) for i in ids]
        text = self.backend_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)
        if (
            self.clean_up_tokenization_spaces
            and type(self.backend_tokenizer.model).__name__ != "BPE"
        ):
            for spaced, joined in _CLEAN_UP:
                text = text.replace(spaced, joined)
        return text

    # -- chats ---------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        conversation: list[dict],
        tools: list[dict] | None = None,
        documents: list[dict] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        tokenize: bool = True,
        return_dict: bool = True,
        **kwargs,
    ):
        """One conversation through the chat template, as transformers' apply_chat_template:
        tools as JSON schemas, documents as dicts, kwargs the template's own variables
        (enable_thinking...; the special tokens by name are variables too). chat_template: a
        template, or the name of one of the tokenizer's. Returns the text (tokenize=False), else
        {"input_ids": ids} (return_dict=True, transformers' default) or the ids; the text is
        encoded without added BOS / EOS (the template writes its own)."""
        from kwker.loading.chat_template import render_chat

        template = self._template(chat_template, tools)
        variables = {**self.special_tokens_map, **kwargs}
        text = render_chat(
            template, conversation, tools=tools, documents=documents,
            add_generation_prompt=add_generation_prompt, **variables,
        )  # fmt: skip
        if not tokenize:
            return text
        ids = self.encode(text, add_special_tokens=False)
        return {"input_ids": ids} if return_dict else ids

    def _template(self, chosen: str | None, tools) -> str:
        """transformers' get_chat_template: of a dict of templates, `chosen` by name, else
        tool_use when there are tools, else default."""
        own = self.chat_template
        if isinstance(own, dict):
            if chosen is not None and chosen in own:
                return own[chosen]
            if chosen is None:
                if tools is not None and "tool_use" in own:
                    return own["tool_use"]
                if "default" in own:
                    return own["default"]
                raise ValueError(
                    f"this tokenizer has chat templates {sorted(own)} and none is the default: "
                    "name one"
                )
        if chosen is not None:
            return chosen
        if own is None:
            raise ValueError("this tokenizer has no chat template (tokenizer.chat_template)")
        return own

    # -- files ---------------------------------------------------------------------------------

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Writes the tokenizer to `folder`, which load_tokenizer reads back the same:
        tokenizer.json (the backend), tokenizer_config.json and the chat template as transformers
        writes them (so AutoTokenizer reads the folder too), and KWKER_TOKENIZER_FILE last."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.backend_tokenizer.save(str(folder / "tokenizer.json"))
        config = {
            "backend": "tokenizers",
            "tokenizer_class": "TokenizersBackend",  # tokenizer.json is the whole pipeline
            **self.special_tokens_map,
            "extra_special_tokens": self.extra_special_tokens,
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            "split_special_tokens": self.backend_tokenizer.encode_special_tokens,
        }
        templates = self.chat_template
        if isinstance(templates, str):
            (folder / "chat_template.jinja").write_text(templates, encoding="utf-8")
        elif isinstance(templates, dict):
            named = folder / "additional_chat_templates"
            named.mkdir(exist_ok=True)
            for name, template in templates.items():
                path = (
                    folder / "chat_template.jinja" if name == "default" else named / f"{name}.jinja"
                )
                path.write_text(template, encoding="utf-8")
        _write_json(folder / "tokenizer_config.json", config)
        record = {
            "format": _FORMAT,
            "special_tokens": self.special_tokens_map,
            "extra_special_tokens": self.extra_special_tokens,
            "chat_template": self.chat_template,
            "clean_up_tokenization_spaces": self.clean_up_tokenization_spaces,
            "split_special_tokens": self.backend_tokenizer.encode_special_tokens,
            "skipped_plain_tokens": _skipped_plain_tokens(self.backend_tokenizer),
        }
        _write_json(folder / KWKER_TOKENIZER_FILE, record)
        return folder


# transformers' clean_up_tokenization: the spaces a word-piece detokenizer leaves
_CLEAN_UP = [(" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
             (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")]  # fmt: skip


def _skipped_plain_tokens(backend) -> list[str]:
    """The added tokens flagged plain that decode(skip_special_tokens=True) drops all the same:
    once added as special (a named special token, user-defined in a GGUF: Gemma's <mask>), a
    token stays in the backend's set of special ones, which tokenizer.json does not hold."""
    added = backend.get_added_tokens_decoder()
    return [
        added[i].content
        for i in sorted(added)
        if not added[i].special
        and backend.decode([i], skip_special_tokens=True) == ""
        and backend.decode([i], skip_special_tokens=False) != ""
    ]


def _skip_again(backend, contents: list[str]) -> None:
    """Puts the plain added tokens `contents` back in the backend's special set: added as
    special, then as they were (the special set keeps them, the token its flags)."""
    from tokenizers import AddedToken

    added = backend.get_added_tokens_decoder()
    for token in (added.get(backend.token_to_id(c)) for c in contents):
        if token is None:
            continue
        flags = dict(single_word=token.single_word, lstrip=token.lstrip, rstrip=token.rstrip)
        marked = AddedToken(token.content, normalized=token.normalized, special=True, **flags)
        backend.add_tokens([marked, token])


def _write_json(path: Path, value) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def load_tokenizer(source: GgufFile | str | os.PathLike) -> Tokenizer:
    """The tokenizer of a GGUF file (a GgufFile or its path) or of a tokenizer folder."""
    if isinstance(source, GgufFile):
        return tokenizer_from_gguf(source)
    path = Path(source)
    if path.is_dir():
        return _tokenizer_from_folder(path)
    if path.is_file():
        return tokenizer_from_gguf(read_gguf(path))
    raise TokenizerError(f"{path}: no such GGUF file or tokenizer folder")


def tokenizer_from_gguf(gguf: GgufFile) -> Tokenizer:
    """The tokenizer AutoTokenizer.from_pretrained(folder, gguf_file=name) builds, from metadata
    already read."""
    from kwker.loading.gguf_vocab import GgufTokenizerError, gguf_tokenizer

    try:
        built = gguf_tokenizer(gguf)
    except GgufTokenizerError as e:
        raise TokenizerError(str(e)) from None
    return Tokenizer(built.backend, built.special, chat_template=built.chat_template)


def save_tokenizer(tokenizer: Tokenizer, folder: str | os.PathLike) -> Path:
    """Writes `tokenizer` to `folder` (Tokenizer.save_pretrained), KWKER_TOKENIZER_FILE last."""
    return tokenizer.save_pretrained(folder)


def _tokenizer_from_folder(folder: Path) -> Tokenizer:
    from tokenizers import Tokenizer as Backend

    record_path = folder / KWKER_TOKENIZER_FILE
    backend_file = folder / "tokenizer.json"
    if not backend_file.is_file():
        raise TokenizerError(f"{folder}: no tokenizer.json, so no tokenizer to load")
    if not record_path.is_file():
        from kwker.loading.tokenizer_folder import folder_tokenizer

        return Tokenizer(**folder_tokenizer(folder))
    record = json.loads(record_path.read_text(encoding="utf-8"))
    if record.get("format") == 1:
        record = _from_format_1(record)
    elif record.get("format") != _FORMAT:
        raise TokenizerError(f"{record_path}: format {record.get('format')!r}, not {_FORMAT}")
    backend = Backend.from_file(str(backend_file))
    backend.encode_special_tokens = bool(record.get("split_special_tokens", False))
    _skip_again(backend, record.get("skipped_plain_tokens") or [])
    return Tokenizer(
        backend,
        record["special_tokens"],
        record.get("extra_special_tokens") or (),
        record.get("chat_template"),
        bool(record.get("clean_up_tokenization_spaces", False)),
    )


def _from_format_1(record: dict) -> dict:
    """A format-1 record (a transformers class and its arguments, its backend saved whole) as a
    format-2 one: the class's default special tokens under the ones given."""
    arguments = record["arguments"]
    given = {k: arguments[k] for k in NAMED_TOKENS if k in arguments}
    name = record["class"].removesuffix("Fast")
    extra = arguments.get("extra_special_tokens") or []
    return {
        "special_tokens": special_tokens(
            name if name in DEFAULT_TOKENS else "TokenizersBackend", given
        ),
        "extra_special_tokens": list(extra) if isinstance(extra, list) else [],
        "chat_template": arguments.get("chat_template"),
        "clean_up_tokenization_spaces": arguments.get("clean_up_tokenization_spaces", False),
        "split_special_tokens": arguments.get("split_special_tokens", False),
    }
