"""Constrained decoding: a grammar (a JSON schema, any JSON object, or a Lark grammar) that every
token of an answer must follow, through llguidance (the library llama.cpp and vLLM use).

Contract, for exactness: the mask applies at every position that picks a token, the first one
after prefill and each row of a verify step alike, before the sampler (see SequenceState._pick).
A row is picked only after the rows before it were, so the grammar's state is always the one of
the text so far: picks are never taken back (a rejected proposal is never picked). The tokens
the grammar forces (one choice each) are proposed as a step's candidates: the mask leaves the
target nothing else, so they are accepted, whatever the sampler draws."""

from __future__ import annotations

import copy
import json
import weakref

import numpy as np


class ConstraintError(ValueError):
    """A grammar or schema the library cannot compile, with its reason."""


def _llg():
    try:
        import llguidance
    except ImportError as e:  # pragma: no cover  (a dependency of kwker)
        raise ConstraintError("constrained output needs llguidance (pip install llguidance)") from e
    return llguidance


# tokenizer -> (vocab, llguidance's view of it): about a second to build, so kept while the
# tokenizer lives. Not an attribute on the tokenizer: a copy of it (deepcopy, or one with tokens
# added) must build its own view, and the view cannot be copied.
_LL_TOKENIZERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _ll_tokenizer(tokenizer, vocab: int):
    """llguidance's view of a tokenizer with a `tokenizers` backend (kwker.loading.tokenizer's,
    or a transformers fast one): what llguidance.hf.from_tokenizer builds, without importing
    transformers as that does."""
    cached = _LL_TOKENIZERS.get(tokenizer)
    if cached is not None and cached[0] == vocab:
        return cached[1]
    backend = copy.copy(tokenizer.backend_tokenizer)
    backend.no_padding()
    backend.no_truncation()
    ll = _llg().LLTokenizer(backend.to_str(), n_vocab=vocab, eos_token=tokenizer.eos_token_id)
    _LL_TOKENIZERS[tokenizer] = (vocab, ll)
    return ll


def grammar_of(json_schema=None, json_object: bool = False, lark: str | None = None) -> str:
    """The llguidance grammar of exactly one of: a JSON schema (a dict or its text), any JSON
    object, a Lark grammar."""
    llg = _llg()
    given = [json_schema is not None, bool(json_object), lark is not None]
    if sum(given) != 1:
        raise ConstraintError("give one of json_schema, json_object or grammar")
    if lark is not None:
        return llg.LLMatcher.grammar_from_lark(lark)
    schema = {"type": "object"} if json_object else json_schema
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ConstraintError(f"the JSON schema is not JSON: {e}") from None
    if not isinstance(schema, dict):
        raise ConstraintError("a JSON schema is a JSON object")
    try:
        # whitespace as compact JSON writes it: a model's free spaces would be tokens for nothing
        return llg.LLMatcher.grammar_from_json_schema(
            schema, defaults={"whitespace_flexible": False}
        )
    except ValueError as e:
        raise ConstraintError(f"the JSON schema cannot be used: {e}") from None


class Constraint:
    """One answer's grammar state over a vocabulary of `vocab` logits."""

    def __init__(self, grammar: str, tokenizer, vocab: int, eos_ids, what: str = "grammar"):
        """what: what the user gave, for the error ("grammar", "JSON schema")."""
        llg = _llg()
        message = llg.LLMatcher.validate_grammar(grammar, _ll_tokenizer(tokenizer, vocab))
        if message:
            raise ConstraintError(f"the {what} cannot be used: {message}")
        self.matcher = llg.LLMatcher(_ll_tokenizer(tokenizer, vocab), grammar, log_level=0)
        if self.matcher.is_error():
            raise ConstraintError(f"the {what} cannot be used: {self.matcher.get_error()}")
        self.vocab = vocab
        self.eos = np.asarray(sorted(eos_ids), dtype=np.int64)

    def allowed(self) -> np.ndarray:
        """(vocab,) bool: the tokens the grammar takes next (only the end once it is complete)."""
        if self.matcher.is_stopped():
            ok = np.zeros(self.vocab, dtype=bool)
            ok[self.eos] = True
            return ok
        bits = np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[: self.vocab].astype(bool)

    def masked(self, logits) -> np.ndarray:
        """A float32 copy of a row of logits with every token the grammar refuses at -inf."""
        x = np.asarray(logits, dtype=np.float32)
        return np.where(self.allowed(), x, np.float32(-np.inf))

    def consume(self, token: int) -> None:
        if not self.matcher.is_stopped() and not self.matcher.consume_token(token):
            raise ConstraintError(f"token {token} broke the grammar: {self.matcher.get_error()}")

    def forced(self) -> list[int]:
        """The tokens the grammar forces next, one choice each (none once it is complete)."""
        return [] if self.matcher.is_stopped() else list(self.matcher.compute_ff_tokens())
