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

Formats (read from the template, never assumed) are kwker.tool_formats; constrained calls are
kwker.tool_constraint. This module parses the calls out of an answer as it streams, and is the
front of the three: all of the above is importable from kwker.tools."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import NamedTuple

from kwker.thinking import partial_tag
from kwker.tool_constraint import (
    CHOICES,
    ToolConstraint,
    bare_grammar,
    call_grammar,
    tool_constraint,
)
from kwker.tool_formats import (
    BARE_STARTS,
    FORMATS,
    ToolCall,
    ToolError,
    ToolFormat,
    assistant_message,
    chat_prompt,
    check_tools,
    for_template,
    new_call_id,
    require_format,
    tool_format,
)

__all__ = [
    "CHOICES",
    "FORMATS",
    "CallDelta",
    "Parsed",
    "ToolCall",
    "ToolCallParser",
    "ToolConstraint",
    "ToolError",
    "ToolFormat",
    "assistant_message",
    "bare_grammar",
    "call_grammar",
    "chat_prompt",
    "check_tools",
    "for_template",
    "new_call_id",
    "parse_answer",
    "require_format",
    "tool_constraint",
    "tool_format",
]

# a call object's head, name first: from there its arguments can stream
_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*```$", re.S)


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
                if squeezed.startswith(BARE_STARTS):
                    self.phase = BARE
                    continue
                if not squeezed or any(b.startswith(squeezed) for b in BARE_STARTS):
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
