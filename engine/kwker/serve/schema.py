"""The OpenAI request bodies `kwker serve` takes, as pydantic models: strict types (true is not a
number, 1.5 is not an integer, Infinity and NaN are no numbers), OpenAI's ranges, and unknown
fields refused, as OpenAI refuses them ("Unrecognized request argument"). A parameter the engine
cannot honour is refused with a 400 naming it, never ignored.

Beyond OpenAI's fields, the sampling extras vLLM and llama.cpp's server take: top_k, min_p,
repetition_penalty; and Kwker's: lookup (0 turns prompt lookup off; else its longest proposal)
and grammar (a Lark grammar the answer follows). response_format (json_object, json_schema)
works on both endpoints, as vLLM has it; chat_template_kwargs and an answer's reasoning_content
are vLLM's and llama.cpp's too."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

# strict: JSON's true is not 1, and 1.5 is not an integer; Infinity and NaN (which Python's JSON
# reader accepts) are not finite numbers
Int = Annotated[int, Field(strict=True)]
Real = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Text = Annotated[str, Field(strict=True)]
Flag = Annotated[bool, Field(strict=True)]

MAX_STOP = 4  # OpenAI's limit on stop sequences


class Unsupported(ValueError):
    """A known OpenAI parameter with a value this server cannot honour (a 400 naming it)."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Flag = False


class Sampling(BaseModel):
    """The fields both endpoints share."""

    model_config = ConfigDict(extra="forbid")

    model: Text | None = None  # None: the one model this server runs
    max_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None  # None: up to the context
    temperature: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0, le=1)] | None = None
    n: Int = 1
    stream: Flag = False
    stream_options: StreamOptions | None = None
    stop: Text | list[Text] | None = None
    presence_penalty: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-2, le=2)] = 0.0
    frequency_penalty: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=-2, le=2)] = 0.0
    seed: Annotated[int, Field(strict=True, ge=-(2**63), lt=2**64)] | None = None
    user: Text | None = None  # the caller's tag for its end user: informational
    logit_bias: dict[str, Real] | None = None
    # the extras
    top_k: Annotated[int, Field(strict=True, ge=0)] | None = None
    min_p: Annotated[float, Field(strict=True, allow_inf_nan=False, ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Field(strict=True, allow_inf_nan=False, gt=0)] | None = (
        None
    )
    lookup: Annotated[int, Field(strict=True, ge=0, le=64)] | None = None
    grammar: Text | None = None  # Lark
    response_format: dict | None = None

    @model_validator(mode="after")
    def _check(self):
        if self.n != 1:
            raise Unsupported("n", "n must be 1: this server makes one answer per request")
        if self.stream_options is not None and not self.stream:
            raise Unsupported("stream_options", "stream_options is only allowed with stream: true")
        if self.logit_bias:
            raise Unsupported("logit_bias", "logit_bias is not supported by this server")
        stops = self.stop_sequences
        if len(stops) > MAX_STOP:
            raise Unsupported("stop", f"stop takes at most {MAX_STOP} sequences, got {len(stops)}")
        if any(not s for s in stops):
            raise Unsupported("stop", "a stop sequence must not be empty")
        self.constraint  # noqa: B018  (checks response_format and grammar)
        return self

    @property
    def constraint(self) -> dict:
        """The engine's options for the answer's grammar (see kwker.constrained), {} for none."""
        fmt = self.response_format or {"type": "text"}
        kind = fmt.get("type")
        if kind not in ("text", "json_object", "json_schema"):
            raise Unsupported(
                "response_format", "response_format's type is text, json_object or json_schema"
            )
        if kind != "text" and self.grammar is not None:
            raise Unsupported("grammar", "give a grammar or a response_format, not both")
        if kind == "json_object":
            return {"json_object": True}
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
                raise Unsupported(
                    "response_format",
                    "response_format json_schema takes {'json_schema': {'name': ..., 'schema': "
                    "{...}}}",
                )
            return {"json_schema": spec["schema"]}
        return {"grammar": self.grammar} if self.grammar is not None else {}

    @property
    def stop_sequences(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: Text


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: Text
    arguments: Text  # JSON text, as OpenAI gives it back


class ToolCallIn(BaseModel):
    """An earlier answer's tool call, as this server returned it."""

    model_config = ConfigDict(extra="forbid")
    id: Text
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="forbid")
    # "developer" is OpenAI's newer name for "system"; "tool" carries a tool's result
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Text | list[TextPart] | None = None
    name: Text | None = None
    tool_calls: list[ToolCallIn] | None = None  # an earlier answer's calls
    tool_call_id: Text | None = None  # the call a tool message answers
    # an earlier answer's thinking, as this server and vLLM return it: the template decides
    # whether it goes into the prompt (Qwen3's keeps it only after the last question)
    reasoning_content: Text | None = None

    def for_template(self) -> dict:
        """The message as chat templates take it: role and plain text (and an answer's
        reasoning_content when the client sent it back)."""
        content = self.content
        if isinstance(content, list):
            content = "".join(part.text for part in content)
        role = "system" if self.role == "developer" else self.role
        out = {"role": role, "content": content or ""}
        if self.reasoning_content and role == "assistant":
            out["reasoning_content"] = self.reasoning_content
        if self.tool_calls and role == "assistant":
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if role == "tool" and self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


# apply_chat_template's own parameters: chat_template_kwargs are the template's variables only
RESERVED_TEMPLATE_KWARGS = frozenset(
    ("conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
     "continue_final_message", "tokenize", "padding", "truncation", "max_length",
     "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs")
)  # fmt: skip


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(strict=True, ge=1)] | None = None
    logprobs: Flag = False
    top_logprobs: Annotated[int, Field(strict=True, ge=0, le=20)] | None = None
    # OpenAI's tools (kwker.tools); the older functions / function_call are refused by name
    tools: list[dict] | None = None
    tool_choice: Literal["auto", "none", "required"] | dict | None = None
    functions: list | None = None
    function_call: object | None = None
    parallel_tool_calls: Flag | None = None
    # the template's variables, as vLLM and llama.cpp's server take them: {"enable_thinking":
    # false} turns a thinking model's thinking off
    chat_template_kwargs: dict[str, object] | None = None

    @model_validator(mode="after")
    def _check_chat(self):
        reserved = sorted(set(self.chat_template_kwargs or ()) & RESERVED_TEMPLATE_KWARGS)
        if reserved:
            raise Unsupported(
                "chat_template_kwargs",
                f"chat_template_kwargs takes the template's variables, not {reserved[0]!r}",
            )
        for name in ("functions", "function_call"):
            if getattr(self, name):
                raise Unsupported(name, f"{name} is not supported by this server: use tools")
        if self.tool_choice is not None and not self.tools:
            raise Unsupported("tool_choice", "tool_choice is only allowed when tools are given")
        if self.tools_on and (self.response_format or self.grammar is not None):
            raise Unsupported("tools", "give tools or a response_format / grammar, not both")
        if isinstance(self.tool_choice, dict):
            name = (self.tool_choice.get("function") or {}).get("name")
            names = [(t.get("function") or {}).get("name") for t in self.tools or ()]
            if self.tool_choice.get("type") != "function" or name not in names:
                raise Unsupported(
                    "tool_choice",
                    "tool_choice names a function of the tools: {'type': 'function', "
                    "'function': {'name': ...}}",
                )
        if self.top_logprobs is not None and not self.logprobs:
            raise Unsupported("top_logprobs", "top_logprobs needs logprobs: true")
        return self

    @property
    def tools_on(self) -> bool:
        """Whether the answer may call the tools. tool_choice "none" leaves them out of the
        prompt too: the model answers in text, as if it had none."""
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def tool_options(self) -> dict:
        """The engine's options for the tools (see kwker.tools), {} for none."""
        if not self.tools_on:
            return {}
        return {"tools": self.tools, "tool_choice": self.tool_choice or "auto",
                "parallel_tool_calls": self.parallel_tool_calls is not False}  # fmt: skip

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    @property
    def logprobs_k(self) -> int | None:
        """None: no logprobs; else how many alternatives each token reports."""
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(Sampling):
    prompt: (
        Text
        | Annotated[list[Int], Field(min_length=1)]
        | Annotated[list[Text], Field(min_length=1, max_length=1)]
    )
    logprobs: Annotated[int, Field(strict=True, ge=0, le=5)] | None = None
    echo: Flag = False
    suffix: Text | None = None
    best_of: Int | None = None

    @model_validator(mode="after")
    def _check_completion(self):
        if self.echo:
            raise Unsupported("echo", "echo is not supported by this server")
        if self.suffix:
            raise Unsupported("suffix", "suffix (insertion) is not supported by this server")
        if self.best_of not in (None, 1):
            raise Unsupported("best_of", "best_of must be 1: this server makes one answer")
        return self

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens

    @property
    def logprobs_k(self) -> int | None:
        return self.logprobs
