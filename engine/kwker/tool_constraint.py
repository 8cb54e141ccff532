"""Tool calls generated under their tools' JSON schemas (kwker.constrained), so that their
arguments always parse: the Lark grammars of a format's calls, and ToolConstraint, which applies
them to an answer as it is generated. No Qt, no torch.

With tool_choice "auto", the answer is free until the model writes the format's opening token;
from there to the call's end every token follows {"name": <one of the tools>, "arguments": <that
tool's parameters schema>} and the closing marker, then the text is free again
(parallel_tool_calls) or the answer ends. "required" and a named tool constrain from the first
token to calls (of that tool). The mask changes only between steps (a step stops at the token
that opens or closes a call), so the same tokens come with and without lookup, a draft and
batching. "none" is the caller's: leave the tools out.
"""

from __future__ import annotations

import json
import re

from kwker.constrained import Constraint, ConstraintError, grammar_of
from kwker.tool_formats import BARE_STARTS, ToolError, ToolFormat, check_tools

CHOICES = ("auto", "required", "none")
# compact JSON as Python's json.dumps writes it, which is how the templates render earlier calls
_SEPARATORS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}


def _call_schema(fmt: ToolFormat, tools: list[dict], only: str | None) -> dict:
    """The JSON schema of one call object: a named tool and its own arguments."""
    options = [
        {"type": "object", "properties": {"name": {"const": t["function"]["name"]},
         fmt.args_key: t["function"]["parameters"]}, "required": ["name", fmt.args_key],
         "additionalProperties": False}
        for t in tools if only in (None, t["function"]["name"])
    ]  # fmt: skip
    return {"anyOf": options, "x-guidance": _SEPARATORS}


def _marker(text: str, token: int | None) -> str:
    # a special token is named by its id: llguidance misreads a literal for an added token
    return f"<[{token}]>" if token is not None else json.dumps(text)


def call_grammar(fmt: ToolFormat, tools, only: str | None = None, opened: bool = True,
                 parallel: bool = True) -> str:  # fmt: skip
    """The Lark grammar of the calls: after the open marker (opened), or from the answer's start
    (its calls and nothing else: tool_choice required or named)."""
    call = "%json " + json.dumps(_call_schema(fmt, tools, only))
    between = json.dumps(fmt.between) if fmt.between else ""
    if fmt.many:  # Mistral: the marker, then a list of calls
        items = 'call (", " call)*' if parallel else "call"
        body = f'{between} "[" {items} "]"'
    else:
        close = _marker(fmt.close, fmt.close_id) if fmt.close else ""
        after = json.dumps(fmt.after) if fmt.after else ""
        body = f"{between} call {after} {close}"
    if opened:
        rules = f"start: {body}"
    elif fmt.name == "llama3":  # its own way: the bare object is the answer
        rules = "start: call"
    else:
        one = f"{_marker(fmt.open, fmt.open_id)} {body}"
        many = 'one ("\\n" one)*' if parallel and not fmt.many else "one"
        rules = f"start: {many}\none: {one}"
    return f"{rules}\ncall: {call}\n"


def bare_grammar(fmt: ToolFormat, tools) -> str:
    """The Lark grammar of a whole answer that is one bare call object, fenced as a JSON code
    block or not (what small Qwen2.5 models write instead of their template's tags). Its JSON
    may be spaced as the model likes: they write it indented, and the grammar takes over from
    the tokens already written."""
    schema = {**_call_schema(fmt, tools, None), "x-guidance": {"whitespace_flexible": True}}
    call = "%json " + json.dumps(schema)
    return (
        'start: WS (call | FENCE call WS "```") WS\n'
        "FENCE: /```(json)?[ \\t]*\\r?\\n/\n"
        "WS: /[ \\t\\r\\n]*/\n"
        f"call: {call}\n"
    )


class ToolConstraint:
    """The grammar of an answer with tools (the interface of kwker.constrained.Constraint):
    inactive while the text is free, a call's grammar from the token that opens a call to its
    end. `switched` says the latest token opened or closed a call: the step stops there, so that
    every step is all free or all constrained (see SequenceState)."""

    def __init__(self, fmt: ToolFormat, tools, tokenizer, vocab: int, eos_ids,
                 choice: str = "auto", parallel: bool = True):  # fmt: skip
        self.fmt, self.tokenizer, self.vocab, self.eos = fmt, tokenizer, vocab, eos_ids
        self.parallel = parallel
        tools = check_tools(tools)
        only = None
        if isinstance(choice, dict):  # OpenAI's {"type": "function", "function": {"name": n}}
            only = (choice.get("function") or {}).get("name")
            if only not in [t["function"]["name"] for t in tools]:
                raise ToolError(f"tool_choice names {only!r}, which is not one of the tools")
        elif choice not in ("auto", "required"):
            raise ToolError(f"tool_choice must be auto, required, none or a named function, "
                            f"got {choice!r}")  # fmt: skip
        self.free = choice == "auto"
        try:
            self._call = grammar_of(lark=call_grammar(fmt, tools, only, True, parallel))
            whole = None if self.free else call_grammar(fmt, tools, only, False, parallel)
            self.inner = None if whole is None else self._new(grammar_of(lark=whole))
            # a bare call has no token that opens it: the answer's first tokens are watched
            # (_watch) until they spell a call's start or cannot
            self._bare = grammar_of(lark=bare_grammar(fmt, tools)) if fmt.bare else None
        except ConstraintError as e:
            raise ToolError(f"the tools' schemas cannot be used: {e}") from None
        self._said: list[int] | None = [] if self.free and self._bare else None
        self.bare = False  # the answer is a bare call, under the bare grammar to its end
        self.switched = False

    def _new(self, grammar: str) -> Constraint:
        return Constraint(grammar, self.tokenizer, self.vocab, self.eos, "tools' JSON schema")

    @property
    def active(self) -> bool:
        return self.inner is not None

    def allowed(self):
        return self.inner.allowed()

    def masked(self, logits):
        return self.inner.masked(logits)

    def forced(self) -> list[int]:
        return self.inner.forced() if self.inner is not None else []

    def consume(self, token: int) -> None:
        before = self.active
        if self.inner is None:
            if token == self.fmt.open_id:
                self.inner, self._said = self._new(self._call), None
            elif self._said is not None:
                self._watch(token)
        else:
            self.inner.consume(token)
            # a finished call frees the text again (the model may call more, or answer), unless
            # only one call was asked for, or it was a bare one: then only the end is left
            if self.free and self.parallel and not self.bare and self.inner.matcher.is_stopped():
                self.inner = None
        self.switched = before != self.active

    def _watch(self, token: int) -> None:
        """The answer's start, token by token: once it spells a bare call's start ('{"name":'
        or a ```json fence around it, spaces aside), the bare grammar takes the answer from its
        first token on, as llama.cpp's lazy grammars do; once it cannot, the watch ends. The
        tokens so far are fed to the grammar: should they not fit it (other spacing), the
        call is left to the parser, unconstrained."""
        self._said.append(token)
        text = self.tokenizer.decode(self._said, skip_special_tokens=True)
        squeezed = re.sub(r"\s+", "", text)
        if not squeezed.startswith(BARE_STARTS):
            if squeezed and not any(b.startswith(squeezed) for b in BARE_STARTS):
                self._said = None  # text: no bare call
            return
        said, self._said = self._said, None
        grammar = self._new(self._bare)
        try:
            for t in said:
                grammar.consume(t)
        except ConstraintError:
            return
        self.inner, self.bare = grammar, True


def tool_constraint(fmt, tools, tokenizer, vocab, eos_ids, choice="auto", parallel=True):
    """The constraint of an answer with tools, or None when there is nothing to constrain (auto
    for a format whose calls open with no token of their own and are never bare: they are only
    parsed)."""
    if choice == "none":
        return None
    if choice == "auto" and fmt.open_id is None and not fmt.bare:
        return None
    return ToolConstraint(fmt, tools, tokenizer, vocab, eos_ids, choice, parallel)
