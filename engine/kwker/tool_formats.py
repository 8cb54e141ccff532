"""The tool-call formats Kwker knows, one per family, read from the model's chat template
(FORMATS), and what goes into the template: OpenAI-shaped tools checked (check_tools), messages
with their calls (for_template), the prompt (chat_prompt). No Qt, no torch.

Qwen2.5 / Qwen3 (Hermes) write `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
several in a row; Llama 3.x writes the call as the whole answer, `{"name": ..., "parameters":
{...}}`, or after `<|python_tag|>`; Mistral writes `[TOOL_CALLS] [{"name": ..., "arguments":
{...}}, ...]`. A whole answer that is one bare call object counts as a call for Qwen too (small
Qwen2.5 models write it without the tags).
"""

from __future__ import annotations

import json
import re
import secrets
import string
import uuid
from dataclasses import dataclass, replace

from kwker.thinking import template_text

# a bare call's start, whitespace squeezed out; Qwen2.5-Coder fences it as a JSON code block
BARE_STARTS = ('{"name":', '```json{"name":', '```{"name":')


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
