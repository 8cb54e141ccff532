"""Tool calls: the model asks for a function to be run, in its family's own format; the answer's
text and its calls are parted as they stream, and a call's arguments can be generated under the
JSON schema of the tool it names (kwker.constrained), so that they always parse. No Qt, no torch.

    fmt = tool_format(tokenizer)        # None: the chat template has no tools (see require_format)
    ids = chat_prompt(tokenizer, messages, tools)          # OpenAI-shaped messages and tools
    parser = ToolCallParser(fmt)
    for chunk in decoder.stream_generate(ids, 512, tools=tools, tool_choice="auto"):
        text, deltas = parser.feed(chunk.text, chunk.token)     # deltas: CallDelta, streamed
    text, deltas = parser.flush()
    parser.calls                                              # [ToolCall(id, name, arguments)]
    messages += [assistant_message(parser.content, parser.calls),
                 {"role": "tool", "tool_call_id": call.id, "content": result}]

Formats (read from the template, never assumed; FORMATS): Qwen2.5 / Qwen3 (Hermes) write
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, several in a row; Llama 3.x
writes the call as the whole answer, `{"name": ..., "parameters": {...}}`, or after
`<|python_tag|>`; Mistral writes `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`. A whole
answer that is one bare call object counts as a call for Qwen too (small Qwen2.5 models write it
without the tags).

Constrained calls (new_sequence(tools=..., tool_choice=...)): with "auto", the answer is free
until the model writes the format's opening token; from there to the call's end every token
follows {"name": <one of the tools>, "arguments": <that tool's parameters schema>} and the closing
marker, then the text is free again (parallel_tool_calls) or the answer ends. "required" and a
named tool constrain from the first token to calls (of that tool). The mask changes only between
steps (a step stops at the token that opens or closes a call), so the same tokens come with and
without lookup, a draft and batching. "none" is the caller's: leave the tools out."""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from dataclasses import dataclass, field, replace
from typing import NamedTuple

from kwker.constrained import Constraint, ConstraintError, grammar_of
from kwker.thinking import partial_tag, template_text

CHOICES = ("auto", "required", "none")
# compact JSON as Python's json.dumps writes it, which is how the templates render earlier calls
_SEPARATORS = {"item_separator": ", ", "key_separator": ": ", "whitespace_flexible": False}
# a call object's head, name first: from there its arguments can stream
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
# a bare call's start, whitespace squeezed out; Qwen2.5-Coder fences it as a JSON code block
_BARE_STARTS = ('{"name":', '```json{"name":', '```{"name":')
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


class ToolError(ValueError):
    """Tools a model cannot take (its template has none, a tool is malformed), with why."""


@dataclass(frozen=True)
class ToolFormat:
    name: str  # "hermes" (Qwen2.5, Qwen3), "llama3", "mistral"
    open: str  # the marker that opens a call: "<tool_call>", "<|python_tag|>", "[TOOL_CALLS]"
    close: str | None  # the marker that closes one; None: the call runs to the answer's end
    args_key: str  # "arguments" or "parameters"
    many: bool = False  # the body is a JSON list of calls (Mistral)
    bare: bool = False  # a whole answer that is one call object is a call
    open_id: int | None = None  # the markers' token ids, when they are single tokens
    close_id: int | None = None
    between: str = ""  # what the model writes between the open marker and the body
    after: str = ""  # ... between the body and the close marker


# what each family's template shows (the test that picks it) and how its calls look
FORMATS = (
    ("<tool_call>", ToolFormat("hermes", "<tool_call>", "</tool_call>", "arguments", bare=True,
                               between="\n", after="\n")),
    ("[TOOL_CALLS]", ToolFormat("mistral", "[TOOL_CALLS]", None, "arguments", many=True,
                                between=" ")),
    ('"parameters": ', ToolFormat("llama3", "<|python_tag|>", None, "parameters", bare=True)),
)  # fmt: skip


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as OpenAI gives it

    def to_openai(self) -> dict:
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": self.arguments}}  # fmt: skip


class CallDelta(NamedTuple):
    """A piece of the index-th call of an answer: its id and name come once, on its first piece;
    arguments is the next fragment of its JSON text."""

    index: int
    id: str | None
    name: str | None
    arguments: str


class Parsed(NamedTuple):
    text: str
    calls: list[CallDelta]


def tool_format(tokenizer) -> ToolFormat | None:
    """How the tokenizer's model writes tool calls, or None: its chat template does not take
    tools, or writes them in no format Kwker knows (require_format says which)."""
    template = template_text(tokenizer) if tokenizer is not None else ""
    if "tools" not in template:
        return None
    for shown, fmt in FORMATS:
        if shown in template:
            close_id = _token_id(tokenizer, fmt.close) if fmt.close else None
            return replace(fmt, open_id=_token_id(tokenizer, fmt.open), close_id=close_id)
    return None


def _token_id(tokenizer, text: str) -> int | None:
    """The id of the token that is `text` whole, or None. A lookup, not get_vocab(): that builds
    the whole vocabulary (0.1 s for Qwen2.5's 151k tokens), and every request with tools asks."""
    token = tokenizer.convert_tokens_to_ids(text)
    if not isinstance(token, int) or token < 0:
        return None
    return token if tokenizer.convert_ids_to_tokens(token) == text else None  # not the unknown


def require_format(tokenizer) -> ToolFormat:
    fmt = tool_format(tokenizer)
    if fmt is None:
        if "tools" in template_text(tokenizer):
            raise ToolError(
                "this model's chat template writes tool calls in a format Kwker does "
                "not know (it knows Qwen's <tool_call>, Llama 3's and Mistral's)"
            )
        raise ToolError("this model's chat template has no tools: the model was not trained to "
                        "call them")  # fmt: skip
    return fmt


def check_tools(tools) -> list[dict]:
    """OpenAI's tools ([{"type": "function", "function": {name, description, parameters}}]),
    checked; a function without parameters takes none."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise ToolError("tools must be a non-empty list")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ToolError(f"tools[{i}] must be {{'type': 'function', 'function': {{...}}}}")
        if not isinstance(fn.get("name"), str) or not re.fullmatch(r"[\w.-]{1,64}", fn["name"]):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . or -")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON schema object")
        out.append({"type": "function", "function": {**fn, "parameters": params}})
    names = [t["function"]["name"] for t in out]
    if len(set(names)) != len(names):
        raise ToolError("two tools have the same name")
    return out


def for_template(messages: list[dict]) -> list[dict]:
    """OpenAI-shaped messages as chat templates take them: an assistant's calls with their
    arguments as objects (templates write them with tojson), no empty tool_calls (Llama's
    template tests only that the key is there)."""
    out = []
    for m in messages:
        m = dict(m)
        calls = m.pop("tool_calls", None)
        if calls:
            m["tool_calls"] = [_call_for_template(c) for c in calls]
            m["content"] = m.get("content") or ""
        out.append(m)
    return out


def _call_for_template(call) -> dict:
    if isinstance(call, ToolCall):
        call = call.to_openai()
    fn = dict(call.get("function", call))
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            pass  # the model's own broken arguments: shown as they were
    return {"id": call.get("id"), "type": "function", "function": fn}


def chat_prompt(tokenizer, messages, tools=None, **template_kwargs) -> list[int]:
    """The generation prompt's token ids for OpenAI-shaped messages (role tool, assistant
    tool_calls) and tools (transformers' apply_chat_template(tools=...))."""
    if tools:
        require_format(tokenizer)
        template_kwargs["tools"] = check_tools(tools)
    ids = tokenizer.apply_chat_template(
        for_template(messages), add_generation_prompt=True, tokenize=True, **template_kwargs
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def assistant_message(content: str | None, calls: list[ToolCall]) -> dict:
    """An answer as the next prompt's assistant message, in OpenAI's shape."""
    out = {"role": "assistant", "content": content or None}
    if calls:
        out["tool_calls"] = [c.to_openai() for c in calls]
    return out


def new_call_id(fmt: ToolFormat | None) -> str:
    # Mistral's template refuses any id but 9 letters and digits
    if fmt is not None and fmt.name == "mistral":
        alphabet = string.ascii_letters + string.digits
        return "".join(secrets.choice(alphabet) for _ in range(9))
    return "call_" + uuid.uuid4().hex[:24]


# ---------------------------------------------------------------------------------- grammars
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
        if not squeezed.startswith(_BARE_STARTS):
            if squeezed and not any(b.startswith(squeezed) for b in _BARE_STARTS):
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


# ----------------------------------------------------------------------------------- parsing
def _args_shown(body: str) -> str:
    """The arguments' text so far of a body after its head: without the object's closing brace
    and the spaces around it, which may be the end (kept back until they are not)."""
    s = body.rstrip()
    return (s[:-1] if s.endswith("}") else s).rstrip()


def _as_call(obj) -> tuple[str, str] | None:
    """(name, arguments' JSON) of a parsed call object, or None if it is none."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if "arguments" not in obj and "parameters" not in obj:  # {"name": "Bob"} is no call
        return None
    args = obj.get("arguments", obj.get("parameters"))
    if isinstance(args, str):  # arguments given as JSON text
        return obj["name"], args
    return obj["name"], json.dumps(args, ensure_ascii=False)


TEXT, CALL, BARE = "text", "call", "bare"


@dataclass
class ToolCallParser:
    """Parts an answer, piece by piece, into text and tool calls (CallDelta). A marker may arrive
    in pieces: what could be its start is held back until it is or is not; the spaces around
    calls are theirs, not the text's. A Hermes call's name comes as soon as it is written and its
    arguments stream; the calls of formats that run to the answer's end come at the end."""

    fmt: ToolFormat
    # the tools offered: a bare call object naming another is text, not a call (None: any name)
    names: frozenset[str] | None = None
    calls: list[ToolCall] = field(default_factory=list)
    content: str = ""  # the text so far, without the calls
    phase: str = TEXT
    _held: str = ""
    _body: str = ""
    _head: int | None = None  # where the arguments start in the body, once its head is read
    _shown: str = ""  # the arguments' text streamed so far
    _started: bool = False  # some text was said: a bare call is no longer possible

    def feed(self, text: str, token: int | None = None) -> Parsed:
        if token is not None:  # a special marker, which detokenizers skip
            for mark, mark_id in ((self.fmt.open, self.fmt.open_id),
                                  (self.fmt.close, self.fmt.close_id)):  # fmt: skip
                if mark and token == mark_id and mark not in text:
                    text += mark
        out: list[str] = []
        deltas: list[CallDelta] = []
        s, self._held = self._held + text, ""
        self._step(s, out, deltas)
        said = "".join(out)
        self.content += said
        return Parsed(said, deltas)

    def flush(self) -> Parsed:
        """The end of the answer: what was held back, and the calls that run to the end."""
        held, self._held = self._held, ""
        out: list[str] = []
        deltas: list[CallDelta] = []
        if self.phase == BARE:
            self._finish_bare(held, out, deltas)
        elif self.phase == CALL:
            self._body += held
            if not self._end_call(deltas) and self._head is None:
                out.append(self.fmt.open + self._body)
        elif held.strip() or not self.calls:
            out.append(held if self._started else held.lstrip())
        said = "".join(out)
        self.content += said
        return Parsed(said, deltas)

    def _step(self, s: str, out: list[str], deltas: list[CallDelta]) -> None:
        while s:
            if self.phase == CALL:
                s = self._in_call(s, out, deltas)
                continue
            if self.phase == BARE:
                self._held = s
                return
            if not self._started and self.fmt.bare and not self.calls:
                squeezed = re.sub(r"\s+", "", s)
                if squeezed.startswith(_BARE_STARTS):
                    self.phase = BARE
                    continue
                if not squeezed or any(b.startswith(squeezed) for b in _BARE_STARTS):
                    self._held = s  # spaces, or maybe a bare call's start
                    return
            at = s.find(self.fmt.open)
            if at >= 0:
                before = s[:at]
                if before.strip():
                    out.append(before.rstrip() if self._started else before.strip())
                    self._started = True
                self.phase, self._body, self._head, self._shown = CALL, "", None, ""
                s = s[at + len(self.fmt.open) :]
                continue
            keep = partial_tag(s, self.fmt.open)
            said, rest = s[: len(s) - keep], s[len(s) - keep :]
            body = said.rstrip()  # trailing spaces wait: they may precede a call
            if body.strip():
                out.append(body if self._started else body.lstrip())
                self._started = True
            self._held = said[len(body) :] + rest
            return

    def _in_call(self, s: str, out: list[str], deltas: list[CallDelta]) -> str:
        """Takes text inside a call; returns what follows its close marker ("" while open)."""
        self._body += s
        close = self.fmt.close
        if close and close in self._body:
            self._body, rest = self._body.split(close, 1)
            if not self._end_call(deltas) and self._head is None:
                out.append(self.fmt.open + self._body + close)  # no call after all: as written
                self._started = True
            self.phase = TEXT
            return rest
        if close and not self.fmt.many:
            visible = self._body[: len(self._body) - partial_tag(self._body, close)]
            self._stream(visible, deltas)
        return ""

    def _stream(self, visible: str, deltas: list[CallDelta]) -> None:
        """A Hermes call's name once its head is written, then its arguments as they come."""
        if self._head is None:
            stripped = visible.lstrip()
            m = _HEAD.match(stripped)
            if m is None or m.end() == len(stripped):  # the spaces before the arguments wait
                return
            self._head = len(visible) - len(stripped) + m.end()
            name = json.loads(f'"{m.group(1)}"')
            self.calls.append(ToolCall(new_call_id(self.fmt), name, ""))
            deltas.append(CallDelta(len(self.calls) - 1, self.calls[-1].id, name, ""))
        shown = _args_shown(visible[self._head :])
        if len(shown) > len(self._shown) and shown.startswith(self._shown):
            deltas.append(CallDelta(len(self.calls) - 1, None, None, shown[len(self._shown) :]))
            self._shown = shown
            self.calls[-1].arguments = shown

    def _end_call(self, deltas: list[CallDelta]) -> bool:
        """The call's body is whole: its calls out; whether it was one."""
        if self._head is not None:  # streamed: its last fragment
            self._stream(self._body, deltas)
            self.phase = TEXT
            return True
        self.phase = TEXT
        return self._emit_parsed(self._body, deltas)

    def _emit_parsed(self, body: str, deltas: list[CallDelta]) -> bool:
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return False
        found = [_as_call(v) for v in (value if isinstance(value, list) else [value])]
        if not found or None in found:
            return False
        for name, args in found:
            self.calls.append(ToolCall(new_call_id(self.fmt), name, args))
            deltas.append(CallDelta(len(self.calls) - 1, self.calls[-1].id, name, args))
        return True

    def _finish_bare(self, held: str, out: list[str], deltas: list[CallDelta]) -> None:
        self.phase = TEXT
        fenced = _FENCE.match(held.strip())
        body = fenced.group(1) if fenced else held
        if not self._offered(body) or not self._emit_parsed(body, deltas):
            out.append(held.strip())

    def _offered(self, body: str) -> bool:
        """Whether a bare call's body names only offered tools (any, when none were named)."""
        if self.names is None:
            return True
        try:
            value = json.loads(body)
        except json.JSONDecodeError:
            return False
        found = [_as_call(v) for v in (value if isinstance(value, list) else [value])]
        return all(f is not None and f[0] in self.names for f in found)


def parse_answer(fmt: ToolFormat, text: str) -> tuple[str, list[ToolCall]]:
    """A whole answer's text (without its calls) and calls."""
    parser = ToolCallParser(fmt)
    parser.feed(text)
    parser.flush()
    return parser.content, parser.calls
