"""The OpenAI-compatible HTTP API over a ServingEngine: /v1/models, /v1/completions,
/v1/chat/completions, /health and /metrics.

A request's life: Guard (kwker.serve.security) checks host, origin, key, type and size; the body
is parsed, validated (kwker.serve.schema) and tokenized on a worker thread, never on the event
loop, so one huge prompt does not freeze the others; the engine's thread hands the chunks to the
event loop (Pending); the response streams them as server-sent events or collects them. When the
client goes away, the request is cancelled and leaves the batch before the next step, streaming
or not.

Responses follow OpenAI's shapes; finish_reason is "stop" (end of text or a stop sequence) or
"length". usage carries Kwker's own figures as usage["kwker"] (GenerationStats.summary(): speed,
speculation), and a stream's chunks carry them as "kwker" every STATS_EVERY_S.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from kwker.constrained import ConstraintError
from kwker.sampling import SeededGenerator
from kwker.serve.engine import END, QueueFull, Request, ServingEngine
from kwker.serve.metrics import CONTENT_TYPE, Metrics
from kwker.serve.schema import ChatRequest, CompletionRequest, Unsupported
from kwker.serve.security import DEFAULT_MAX_BODY, LOOPBACK_NAMES, Guard, error_body
from kwker.serve.text import StopText, token_bytes

STATS_EVERY_S = 0.25  # a stream's chunks carry fresh statistics at most this often
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


class Pending:
    """A request's items on their way from the engine's thread to the event loop: the engine
    calls sink() (never blocking), the route awaits items(). Every STATS_EVERY_S a chunk travels
    with a snapshot of its statistics, taken on the engine's thread, where they are written."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self._sent = 0.0

    def sink(self, item) -> None:
        stats = None
        if not isinstance(item, BaseException) and item is not END:
            now = time.perf_counter()
            if now - self._sent >= STATS_EVERY_S or item.finish_reason:
                self._sent, stats = now, item.stats.summary()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (item, stats))

    async def items(self):
        """(chunk, stats snapshot or None) until the end; raises the request's error."""
        while True:
            item, stats = await self.queue.get()
            if item is END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item, stats


def _finish(reason: str | None) -> str:
    """OpenAI's finish_reason for the engine's."""
    if reason in ("eos", "stop"):
        return "stop"
    if reason == "length":
        return "length"
    raise ApiError(
        503, "the server stopped before the answer ended", "server_error", "server_stopping"
    )


def create_app(
    engine: ServingEngine,
    model_name: str,
    api_key: str | dict[str, str] | None = None,
    *,
    allowed_origins: tuple[str, ...] = (),
    allowed_hosts: tuple[str, ...] | None = LOOPBACK_NAMES,
    max_body: int = DEFAULT_MAX_BODY,
):
    """api_key: one key, or {key: tenant name}: each key's prompt cache and lookup corpus are
    its own. allowed_hosts: the Host names served (None: any; give None only when bound beyond
    loopback, where DNS rebinding does not reach). See kwker.serve.security."""
    tokenizer = engine.tokenizer
    context = engine.decoder.max_cache_len
    created = int(time.time())
    spelled = token_bytes(tokenizer) if tokenizer is not None else None
    metrics = Metrics(engine)

    app = FastAPI(title="Kwker", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = metrics

    def error(e: ApiError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
        return error(e)

    @app.exception_handler(HTTPException)
    async def http_error(request, e: HTTPException):
        if e.status_code == 404:
            e = ApiError(404, f"unknown URL: {request.method} {request.url.path}", code="not_found")
        elif e.status_code == 405:
            e = ApiError(
                405,
                f"{request.method} is not allowed on {request.url.path}",
                code="method_not_allowed",
            )
        else:
            e = ApiError(e.status_code, str(e.detail))
        return error(e)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_, e: RequestValidationError):
        first = e.errors()[0] if e.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error(ApiError(422, first.get("msg", "invalid request"), param=param))

    @app.exception_handler(Exception)
    async def internal_error(_, e: Exception):
        return error(
            ApiError(
                500, f"the server failed: {type(e).__name__}: {e}", "server_error", "internal_error"
            )
        )

    # ---------------------------------------------------------------------------- request side
    def validate(schema, raw: bytes):
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

    def chat_ids(body: ChatRequest) -> list[int]:
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ApiError(
                400, "this model has no chat template; use /v1/completions", param="messages"
            )
        try:
            ids = tokenizer.apply_chat_template(
                [m.for_template() for m in body.messages],
                add_generation_prompt=True,
                tokenize=True,
                return_dict=True,
            )["input_ids"]
        except Exception as e:  # noqa: BLE001  (a template's refusal is about the messages)
            raise ApiError(400, f"cannot apply the chat template: {e}", param="messages") from None
        return list(ids)

    def prompt_ids(body: CompletionRequest) -> list[int]:
        prompt = body.prompt
        if isinstance(prompt, list) and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            if tokenizer is None:
                raise ApiError(400, "this server takes token ids only", param="prompt")
            return tokenizer(prompt)["input_ids"]
        return prompt

    def submit(body, ids: list[int], pending: Pending, param: str, tenant) -> Request:
        room = context - len(ids)
        if room < 1:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens; this server's context is {context} tokens",
                code="context_length_exceeded",
                param=param,
            )
        limit = body.token_limit
        if limit is not None and limit > room:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens and max_tokens is {limit}: together more "
                f"than this server's context of {context} tokens; ask for at most {room}, or "
                "leave max_tokens out",
                code="context_length_exceeded",
                param="max_tokens",
            )
        try:
            return engine.submit(
                ids, limit or room, sink=pending.sink, tenant=tenant, logprobs=body.logprobs_k,
                **_sampling(body),
            )  # fmt: skip
        except QueueFull as e:
            raise ApiError(429, str(e), "rate_limit_error", "rate_limit_exceeded") from None
        except ConstraintError as e:
            name = "grammar" if body.grammar is not None else "response_format"
            raise ApiError(400, str(e), param=name) from None
        except (ValueError, TypeError) as e:
            raise ApiError(400, str(e)) from None

    def prepare(schema, raw: bytes, pending: Pending, tenant):
        """On a worker thread: parse, validate, tokenize, submit."""
        body = validate(schema, raw)
        chat = schema is ChatRequest
        ids = chat_ids(body) if chat else prompt_ids(body)
        param = "messages" if chat else "prompt"
        return body, len(ids), submit(body, ids, pending, param, tenant)

    # --------------------------------------------------------------------------- response side
    def logprobs_of(chunk, chat: bool):
        """The chunk's token in OpenAI's logprobs shape (chat's content entry, or completions'
        columns)."""
        if chunk.logprob is None:
            return None

        def entry(token, logprob):
            raw = spelled(token)
            return {
                "token": raw.decode("utf-8", errors="replace"),
                "logprob": logprob,
                "bytes": list(raw),
            }

        top = [entry(t, lp) for t, lp in chunk.top_logprobs or ()]
        if chat:
            return {**entry(chunk.token, chunk.logprob), "top_logprobs": top}
        return {
            "tokens": [entry(chunk.token, 0)["token"]],
            "token_logprobs": [chunk.logprob],
            "top_logprobs": [{e["token"]: e["logprob"] for e in top}],
        }

    def usage(prompt_len: int, n: int, stats: dict | None) -> dict:
        out = {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n}
        if stats is not None:
            out["kwker"] = stats
        return out

    async def stream(request, req: Request, pending: Pending, body, prompt_len: int, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        kind = "chat.completion.chunk" if chat else "text_completion"
        stops = StopText(body.stop_sequences)
        with_usage = body.include_usage

        def event(choices: list, **extra) -> str:
            data = {"id": rid, "object": kind, "created": int(time.time()), "model": model_name}
            data["choices"] = choices
            if with_usage and "usage" not in extra:
                data["usage"] = None
            data.update(extra)
            return f"data: {json.dumps(data)}\n\n"

        def choice(text: str, logprobs=None, finish=None) -> dict:
            if chat:
                delta = {"content": text} if text or finish is None else {}
                lp = {"content": [logprobs]} if logprobs else None
                return {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
            return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}

        async def events():
            n, stats = 0, None
            try:
                if chat:
                    yield event([{**choice(""), "delta": {"role": "assistant", "content": ""}}])
                finish = None
                async for chunk, fresh in pending.items():
                    n += 1
                    stats = fresh or stats
                    text = stops.feed(chunk.text)
                    if stops.stopped:
                        req.cancel()
                        finish = "stop"
                    elif chunk.finish_reason:
                        text += stops.flush()
                        finish = _finish(chunk.finish_reason)
                    lp = logprobs_of(chunk, chat)
                    if text or lp:
                        extra = {"kwker": fresh} if fresh else {}
                        yield event([choice(text, lp)], **extra)
                    if finish:
                        break
                if finish is None:  # ended without a last chunk: the server stopped it
                    finish = _finish(req.seq.finish_reason)
                yield event([choice("", finish=finish)], **({"kwker": stats} if stats else {}))
                if with_usage:
                    yield event([], usage=usage(prompt_len, n, stats))
            except Exception as e:  # noqa: BLE001  (this request's step failed; the others go on)
                yield f"data: {json.dumps(_as_api_error(e).body())}\n\n"
            yield "data: [DONE]\n\n"

        return CancellingStream(req, events(), media_type="text/event-stream")

    async def collect(request, req: Request, pending: Pending, body, prompt_len: int, chat: bool):
        """The whole answer, or a cancel as soon as the client goes away."""

        async def gather():
            stops = StopText(body.stop_sequences)
            parts, lps, n, stats, finish = [], [], 0, None, None
            async for chunk, fresh in pending.items():
                n += 1
                stats = fresh or stats
                parts.append(stops.feed(chunk.text))
                if chunk.logprob is not None:
                    lps.append(logprobs_of(chunk, chat))
                if stops.stopped:
                    req.cancel()
                    finish = "stop"
                    break
                if chunk.finish_reason:
                    parts.append(stops.flush())
                    finish = _finish(chunk.finish_reason)
                    break
            if finish is None:
                finish = _finish(req.seq.finish_reason)
            return "".join(parts), lps, n, stats, finish

        answer = asyncio.ensure_future(gather())
        gone = asyncio.ensure_future(_disconnected(request.receive))
        try:
            await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not answer.done():  # the client went away (or the server is stopping)
                req.cancel()
                answer.cancel()
        if not answer.done() or answer.cancelled():
            return Response(status_code=499)  # nobody reads it: nginx's "client closed"
        try:
            text, lps, n, stats, finish = answer.result()
        except Exception as e:  # noqa: BLE001  (this request's step failed; the others go on)
            raise _as_api_error(e) from None
        choice = {"index": 0, "finish_reason": finish}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            choice["logprobs"] = {"content": lps} if body.logprobs_k is not None else None
        else:
            choice["text"] = text
            choice["logprobs"] = _columns(lps) if body.logprobs_k is not None else None
        return {
            "id": ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24],
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": [choice],
            "usage": usage(prompt_len, n, stats),
        }

    async def generate(request: HttpRequest, schema):
        raw = await request.body()
        pending = Pending(asyncio.get_running_loop())
        tenant = request.scope.get("kwker.tenant")  # the key's name (kwker.serve.security)
        body, prompt_len, req = await run_in_threadpool(prepare, schema, raw, pending, tenant)
        chat = schema is ChatRequest
        answer = stream if body.stream else collect
        return await answer(request, req, pending, body, prompt_len, chat)

    # ---------------------------------------------------------------------------------- routes
    def model_card() -> dict:
        return {
            "id": model_name,
            "object": "model",
            "created": created,
            "owned_by": "kwker",
            "max_model_len": context,  # vLLM's name for it: clients read it to fit prompts
            "kwker": {
                "context_length": context,
                "precision": getattr(engine.decoder, "precision", None),
                "isa": getattr(engine.decoder, "isa", None),
                "max_batch": engine.decoder.runner.n_slots,
            },
        }

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "active": engine.active,
                "waiting": engine.waiting}  # fmt: skip

    @app.get("/metrics")
    async def metrics_text():
        return Response(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_name:
            raise ApiError(
                404, f"unknown model {name!r}; this server runs {model_name!r}",
                code="model_not_found", param="model",
            )  # fmt: skip
        return model_card()

    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        return await generate(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        return await generate(request, ChatRequest)

    class CancellingStream(StreamingResponse):
        """A stream whose request is cancelled however the response ends: sent in full, the
        client gone (Starlette then cancels the sending), or the server stopping."""

        def __init__(self, req: Request, content, **kw):
            super().__init__(content, **kw)
            self.req = req

        async def __call__(self, scope, receive, send):
            try:
                await super().__call__(scope, receive, send)
            finally:
                self.req.cancel()

    return Guard(
        app,
        api_key=api_key,
        allowed_origins=allowed_origins,
        allowed_hosts=allowed_hosts,
        max_body=max_body,
        on_response=metrics.response,
    )


def _as_api_error(e: Exception) -> ApiError:
    """A request's failure as the client sees it: an ApiError as it is; anything else, which is
    its own step failing, a 500 naming it."""
    if isinstance(e, ApiError):
        return e
    return ApiError(
        500, f"generation failed: {type(e).__name__}: {e}", "server_error", "generation_failed"
    )


async def _disconnected(receive) -> None:
    """Returns when the client closes the connection (after the body, receive waits for that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _columns(entries: list[dict]) -> dict:
    """Completions' logprobs: the per-token entries as OpenAI's parallel lists."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    offset = 0
    for e in entries:
        out["tokens"] += e["tokens"]
        out["token_logprobs"] += e["token_logprobs"]
        out["top_logprobs"] += e["top_logprobs"]
        out["text_offset"].append(offset)
        offset += len(e["tokens"][0])
    return out


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


def _sampling(body) -> dict:
    """The engine's sampling options for a request: temperature 0 is greedy; OpenAI's default
    temperature is 1; an unseeded request gets a seed of its own."""
    temperature = 1.0 if body.temperature is None else body.temperature
    opts: dict = {
        "presence_penalty": body.presence_penalty or None,
        "frequency_penalty": body.frequency_penalty or None,
        "repetition_penalty": body.repetition_penalty,
        **body.constraint,
    }
    if body.lookup is not None:
        opts["lookup"] = body.lookup
    if temperature == 0:
        return opts | {"do_sample": False}
    seed = body.seed if body.seed is not None else int.from_bytes(uuid.uuid4().bytes[:8], "little")
    opts |= {"do_sample": True, "temperature": float(temperature)}
    opts["generator"] = SeededGenerator(seed)
    for key in ("top_p", "top_k", "min_p"):
        if getattr(body, key) is not None:
            opts[key] = getattr(body, key)
    return opts
