"""Thinking models: those that write their reasoning between two tags before the answer (Qwen3,
DeepSeek-R1, SmolLM3: `<think>...</think>`; Magistral: `[THINK]...[/THINK]`). No Qt, no torch.

    fmt = thinking_format(tokenizer)             # None: the model does not think
    fmt.switch                                   # its template takes enable_thinking
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                        **template_kwargs(fmt, enable_thinking=False))
    split = ThinkingSplitter(fmt, inside=starts_inside(tokenizer, ids, fmt))
    for piece in stream:
        thinking, answer = split.feed(piece.text, piece.token)
    thinking, answer = split.flush()

The tags are read from the chat template (the pair whose name says think or reason), else from
the vocabulary's added tokens, never assumed: a model names its own. A template whose generation
prompt opens the tag itself (DeepSeek-R1's ends with `<think>\\n`) makes the answer start inside
the thinking: starts_inside() reads that off the prompt's last tokens.

Thinking is the model's scratch work: it goes back into a later prompt only as the template
wants it. for_template() gives an earlier answer as its text without the thinking, plus
`reasoning_content` when the template reads that field (Qwen3's keeps it for the turns after the
last question and drops it for earlier ones)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

SWITCH = "enable_thinking"  # the template variable of the switch (Qwen3, SmolLM3, Granite...)
# a tag pair: <name>...</name> or [NAME]...[/NAME], named for thinking
_TAGS = re.compile(r"<(/?)([A-Za-z_][\w-]{0,30})>|\[(/?)([A-Za-z_][\w-]{0,30})\]")
_THINKING_NAME = re.compile(r"think|reason", re.I)
_TAIL_TOKENS = 16  # how many of the prompt's last tokens show whether it opened the thinking

START, THINKING, ANSWER = "start", "thinking", "answer"


@dataclass(frozen=True)
class ThinkingFormat:
    open: str  # "<think>"
    close: str  # "</think>"
    switch: bool  # the chat template takes enable_thinking
    reads_reasoning: bool  # the chat template reads an assistant message's reasoning_content
    # the tags' token ids when they are special tokens, which detokenizers skip (their text never
    # arrives, so the splitter goes by the id); None for tags that arrive as text
    open_id: int | None = None
    close_id: int | None = None


class Split(NamedTuple):
    thinking: str
    answer: str


def template_text(tokenizer) -> str:
    """The tokenizer's chat template ("" without one; a dict of named templates joined)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        return "\n".join(str(t) for t in template.values())
    if isinstance(template, list):  # the older [{name, template}, ...] form
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return str(template)


def _tag_pair(text: str) -> tuple[str, str] | None:
    """The first thinking tag pair (an opening and its closing tag) found in text."""
    seen: dict[tuple[str, bool], str] = {}
    for m in _TAGS.finditer(text):
        slash, name = (m.group(1), m.group(2)) if m.group(2) else (m.group(3), m.group(4))
        seen[(name, bool(slash))] = m.group(0)
    for (name, closing), tag in seen.items():
        if not closing and _THINKING_NAME.search(name) and (name, True) in seen:
            return tag, seen[(name, True)]
    return None


def thinking_format(tokenizer) -> ThinkingFormat | None:
    """How the tokenizer's model writes its thinking, or None for a model that does not (no
    thinking tag pair in its chat template or its added tokens). Kept on the tokenizer for its
    template and vocabulary: the serve routes ask once per request."""
    if tokenizer is None:
        return None
    template = template_text(tokenizer)
    key = (template, len(tokenizer))  # the vocabulary grows when tokens are added
    cached = getattr(tokenizer, "_kwker_thinking", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    pair = _tag_pair(template)
    if pair is None:
        added = getattr(tokenizer, "get_added_vocab", lambda: {})()
        pair = _tag_pair(" ".join(sorted(added)))
    fmt = None
    if pair is not None:
        special = set(getattr(tokenizer, "all_special_tokens", ()) or ())

        def special_id(tag: str) -> int | None:
            if tag not in special:
                return None
            token = tokenizer.convert_tokens_to_ids(tag)
            return token if isinstance(token, int) and token >= 0 else None

        fmt = ThinkingFormat(
            pair[0], pair[1], SWITCH in template, "reasoning_content" in template,
            special_id(pair[0]), special_id(pair[1]),
        )  # fmt: skip
    try:
        tokenizer._kwker_thinking = (key, fmt)
    except AttributeError:  # a tokenizer that takes no attributes: asked again next time
        pass
    return fmt


def template_kwargs(fmt: ThinkingFormat | None, enable_thinking: bool | None) -> dict:
    """apply_chat_template's keyword arguments for the switch (transformers hands them to the
    template): {} when not asked (the template's default) or the template has no switch."""
    if enable_thinking is None or fmt is None or not fmt.switch:
        return {}
    return {SWITCH: bool(enable_thinking)}


def starts_inside(tokenizer, ids, fmt: ThinkingFormat | None) -> bool:
    """Whether the prompt `ids` ends by opening the thinking (its generation prompt wrote the
    opening tag), so that the answer starts inside it."""
    if fmt is None or not len(ids):
        return False
    tail = list(ids[-_TAIL_TOKENS:])
    if fmt.open_id is not None and fmt.open_id in tail:
        rest = tail[tail.index(fmt.open_id) :]
        return fmt.close_id not in rest
    text = tokenizer.decode(tail, skip_special_tokens=False).rstrip()
    return text.endswith(fmt.open)


def for_template(message: dict, fmt: ThinkingFormat | None) -> dict:
    """A stored message ({role, content, thinking?}) as the chat template takes it: the answer's
    text, and its thinking as reasoning_content only when the template reads that field."""
    out = {k: v for k, v in message.items() if k != "thinking"}
    thinking = message.get("thinking") or ""
    if thinking and fmt is not None and fmt.reads_reasoning and message.get("role") == "assistant":
        out["reasoning_content"] = thinking
    return out


def raw_text(fmt: ThinkingFormat, thinking: str, answer: str, inside: bool) -> str:
    """The text the model wrote for an answer split into `thinking` and `answer` (as a cut answer
    is continued: the model goes on from its own words), with the tags' usual spacing. A thinking
    with no answer yet was cut inside it: its closing tag is not written."""
    if not thinking:
        return answer
    text = ("" if inside else fmt.open + "\n") + thinking
    return text + (f"\n{fmt.close}\n\n{answer}" if answer else "")


def partial_tag(text: str, tag: str) -> int:
    """The length of the longest end of text that is a proper start of tag (a tag arriving in
    pieces)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkingSplitter:
    """Splits a streamed answer, piece by piece, into thinking and answer text. A tag may arrive
    in pieces: what could be the start of one is held back until it is or is not. The thinking's
    leading and trailing whitespace and the answer's leading whitespace after the closing tag are
    dropped (the tags' spacing, not the model's words); an answer without thinking is as written.

    Phases: START (only whitespace so far: a thinking may still open), THINKING, ANSWER. Only a
    tag at the very start opens the thinking; after the closing tag, tags are text.
    thinking_tokens counts the pieces fed (one token each, as the engine streams) that were
    thinking, its tags included."""

    def __init__(self, fmt: ThinkingFormat, inside: bool = False, phase: str | None = None):
        """inside: the prompt opened the thinking; phase: where a continued answer resumes."""
        self.fmt = fmt
        self.phase = phase or (THINKING if inside else START)
        self._held = ""
        self._fresh = self.phase == THINKING and phase is None  # leading whitespace dropped
        self.thinking_tokens = 0
        self._undecided = 0  # pieces fed before the answer showed whether it thinks

    def feed(self, text: str, token: int | None = None) -> Split:
        before = self.phase
        if token is not None:  # a special tag, which arrives as an id with no text
            if token == self.fmt.open_id and self.fmt.open not in text:
                text += self.fmt.open
            elif token == self.fmt.close_id and self.fmt.close not in text:
                text += self.fmt.close
        split = self._split(self._held + text)
        if self.phase == START:
            self._undecided += 1  # thinking if a tag opens after them: "<th", "ink>"
        elif before == START and self.phase == THINKING:
            self.thinking_tokens += self._undecided + 1
        elif THINKING in (before, self.phase):
            self.thinking_tokens += 1
        return split

    def flush(self) -> Split:
        """What is held back, at the answer's end."""
        held, self._held = self._held, ""
        if self.phase == THINKING:
            return Split(held.rstrip(), "")
        return Split("", held)

    def _split(self, s: str) -> Split:
        thinking, answer = [], []
        self._held = ""
        while s:
            if self.phase == START:
                stripped = s.lstrip()
                if stripped.startswith(self.fmt.open):
                    self.phase, self._fresh = THINKING, True
                    s = stripped[len(self.fmt.open) :]
                    continue
                if not stripped or self.fmt.open.startswith(stripped):
                    self._held = s  # whitespace, or maybe the opening tag's start
                    break
                self.phase = ANSWER  # an answer without thinking: kept as written
            if self.phase == THINKING:
                if self._fresh:
                    s = s.lstrip()
                    if not s:
                        break
                    self._fresh = False
                end = s.find(self.fmt.close)
                if end >= 0:
                    thinking.append(s[:end].rstrip())
                    s, self.phase, self._fresh = s[end + len(self.fmt.close) :], ANSWER, True
                    continue
                body = s[: len(s) - partial_tag(s, self.fmt.close)]
                said = body.rstrip()  # trailing whitespace waits: it may precede the tag
                thinking.append(said)
                self._held = s[len(said) :]
                break
            if self._fresh:
                s = s.lstrip()
                if not s:
                    break
                self._fresh = False
            answer.append(s)
            break
        return Split("".join(thinking), "".join(answer))


def split_text(fmt: ThinkingFormat, text: str, inside: bool = False) -> Split:
    """A whole answer's thinking and answer."""
    splitter = ThinkingSplitter(fmt, inside)
    first, last = splitter.feed(text), splitter.flush()
    return Split(first.thinking + last.thinking, first.answer + last.answer)
