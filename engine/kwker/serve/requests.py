"""The request side of `kwker serve`'s HTTP API: a body parsed and validated against the OpenAI
schemas (kwker.serve.schema) into an engine request's token ids and options, or an ApiError in
OpenAI's shape naming what is wrong."""

from __future__ import annotations

import json

from pydantic import ValidationError

from kwker.sampling import sampling_options as engine_sampling
from kwker.serve.schema import ChatRequest, CompletionRequest, Unsupported
from kwker.serve.security import error_body
from kwker.tools import ToolError, check_tools, for_template, require_format

# How deeply a request's JSON may nest. The requests Kwker serves nest a few levels (messages, their
# content parts); a deeper body is refused before pydantic, an error message's repr() or json.dumps
# walk it, all of which recurse and fail past Python's recursion limit (about 1000).
MAX_JSON_DEPTH = 100


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type_: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status, message, type_, code, param,
        )  # fmt: skip

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def as_api_error(e: Exception) -> ApiError:
    """A request's failure as the client sees it: an ApiError as it is; anything else, which is
    its own step failing, a 500 naming it."""
    if isinstance(e, ApiError):
        return e
    return ApiError(
        500, f"generation failed: {type(e).__name__}: {e}", "server_error", "generation_failed"
    )


def parse(schema, raw: bytes, model_name: str):
    """The body as `schema` (ChatRequest or CompletionRequest), for the model `model_name`."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    except RecursionError:  # the parser recursed past Python's limit: "[" * 100000
        raise _too_deep() from None
    if _nesting(data) > MAX_JSON_DEPTH:
        raise _too_deep()
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        body = schema.model_validate(data)
    except ValidationError as e:
        raise _validation_error(e) from None
    if body.model is not None and body.model != model_name:
        raise ApiError(
            404,
            f"unknown model {body.model!r}; this server runs {model_name!r}",
            code="model_not_found",
            param="model",
        )
    return body


def chat_ids(tokenizer, body: ChatRequest) -> list[int]:
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ApiError(
            400, "this model has no chat template; use /v1/completions", param="messages"
        )
    kwargs = dict(body.chat_template_kwargs or {})
    if body.tools_on:
        try:
            require_format(tokenizer)
        except ToolError as e:  # a model that cannot call tools: as any value it cannot honour
            raise ApiError(400, str(e), code="unsupported_value", param="tools") from None
        try:
            kwargs["tools"] = check_tools(body.tools)
        except ToolError as e:
            raise ApiError(400, str(e), code="invalid_value", param="tools") from None
    try:
        ids = tokenizer.apply_chat_template(
            for_template([m.for_template() for m in body.messages]),
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
            **kwargs,
        )["input_ids"]
    except Exception as e:  # noqa: BLE001  (a template's refusal is about the messages)
        raise ApiError(400, f"cannot apply the chat template: {e}", param="messages") from None
    return list(ids)


def prompt_ids(tokenizer, body: CompletionRequest) -> list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if tokenizer is None:
            raise ApiError(400, "this server takes token ids only", param="prompt")
        return tokenizer(prompt)["input_ids"]
    return prompt


def _too_deep() -> ApiError:
    return ApiError(
        400,
        f"the request body nests deeper than {MAX_JSON_DEPTH} levels of arrays and objects",
        code="invalid_json",
    )


def _nesting(data) -> int:
    """How deeply `data` (parsed JSON) nests lists and dicts: 0 for a number or a string. Walked
    with a stack, not recursion, so that it holds at any depth the parser took."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        deepest = max(deepest, depth)
        if deepest > MAX_JSON_DEPTH:
            return deepest  # deep enough to refuse: the rest need not be walked
        stack.extend((v, depth + 1) for v in value)
    return deepest


def _validation_error(e: ValidationError) -> ApiError:
    """The first problem pydantic found, as OpenAI words it: a 400 naming the parameter."""
    first = e.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, Unsupported):
        return ApiError(400, str(cause), code="unsupported_value", param=cause.param)
    loc = [str(p) for p in first["loc"] if not str(p).startswith(("function-", "constrained-"))]
    # a union's branches name the type they tried ("str", "list[int]"): the parameter is before
    loc = [p for p in loc if "[" not in p and p not in ("str", "int", "float", "bool")]
    param = ".".join(loc) or None
    if first["type"] == "extra_forbidden":
        return ApiError(
            400, f"unrecognized request argument: {param}", code="unknown_parameter", param=param
        )
    if first["type"] == "missing":
        return ApiError(
            400,
            f"missing required parameter: {param}",
            code="missing_required_parameter",
            param=param,
        )
    value = first.get("input")
    shown = json.dumps(value) if _jsonable(value) else repr(value)
    return ApiError(
        400, f"invalid value for {param}: {shown} ({first['msg']})", code="invalid_value",
        param=param,
    )  # fmt: skip


def _jsonable(value) -> bool:
    try:
        json.dumps(value, allow_nan=False)
        return len(json.dumps(value)) < 200
    except (TypeError, ValueError):
        return False


def sampling_options(body) -> dict:
    """The engine's options for a request: its sampling (kwker.sampling.sampling_options: an
    option the request leaves out takes the model's default, and an unseeded request gets a seed
    of its own), OpenAI's default temperature of 1, its constraint, tools and lookup."""
    opts = {**body.constraint, **getattr(body, "tool_options", {})}
    if body.lookup is not None:
        opts["lookup"] = body.lookup
    return opts | engine_sampling(
        1.0 if body.temperature is None else body.temperature,
        seed=body.seed,
        top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p,
        repetition_penalty=body.repetition_penalty,
        presence_penalty=body.presence_penalty or None,
        frequency_penalty=body.frequency_penalty or None,
    )
