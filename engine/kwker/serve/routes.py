"""The OpenAI-compatible HTTP API over a ServingEngine: /v1/models, /v1/completions,
/v1/chat/completions, /health and /metrics.

A request's life: Guard (kwker.serve.security) checks host, origin, key, type and size; the body
is parsed, validated (kwker.serve.schema) and tokenized on a worker thread (kwker.serve.requests),
never on the event loop, so one huge prompt does not freeze the others; the engine's thread hands
the chunks to the event loop (Pending); one answer generator (kwker.serve.responses.pieces) feeds
both a stream of server-sent events and a whole answer. When the
client goes away, the request is cancelled and leaves the batch before the next step, streaming
or not.

Responses follow OpenAI's shapes; finish_reason is "stop" (end of text or a stop sequence),
"length", or "tool_calls" (the answer called tools: kwker.tools; tool_calls in the message, and
streamed as deltas: id and name first, then the arguments' fragments). usage carries Kwker's own
figures as usage["kwker"] (GenerationStats.summary(): speed, speculation), and a stream's chunks
carry them as "kwker" every STATS_EVERY_S. A thinking model's chat answer (kwker.thinking) has its
thinking apart, as vLLM and llama.cpp's server give it: the message's and the deltas'
reasoning_content, and usage's completion_tokens_details.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI
from fastapi import Request as HttpRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from kwker.constrained import ConstraintError
from kwker.serve.engine import QueueFull, Request, ServingEngine
from kwker.serve.metrics import CONTENT_TYPE, Metrics
from kwker.serve.requests import (
    ApiError,
    as_api_error,
    chat_ids,
    parse,
    prompt_ids,
    sampling_options,
)
from kwker.serve.responses import CancellingStream, Pending, Shapes, disconnected, pieces
from kwker.serve.schema import ChatRequest, CompletionRequest
from kwker.serve.security import DEFAULT_MAX_BODY, LOOPBACK_NAMES, Guard
from kwker.serve.text import StopText, token_bytes
from kwker.thinking import ThinkingSplitter, starts_inside, thinking_format
from kwker.tools import ToolCallParser, ToolError, tool_format


class Routes:
    """The API's routes over one engine and its model."""

    def __init__(self, engine: ServingEngine, model_name: str):
        self.engine, self.model_name = engine, model_name
        self.tokenizer = engine.tokenizer
        self.context = engine.decoder.max_cache_len
        self.created = int(time.time())
        self.spelled = token_bytes(self.tokenizer) if self.tokenizer is not None else None
        self.metrics = Metrics(engine)

    # ---------------------------------------------------------------------------- request side
    def submit(self, body, ids: list[int], pending: Pending, param: str, tenant) -> Request:
        room = self.context - len(ids)
        if room < 1:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens; this server's context is {self.context} tokens",
                code="context_length_exceeded",
                param=param,
            )
        limit = body.token_limit
        if limit is not None and limit > room:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens and max_tokens is {limit}: together more "
                f"than this server's context of {self.context} tokens; ask for at most {room}, "
                "or leave max_tokens out",
                code="context_length_exceeded",
                param="max_tokens",
            )
        try:
            return self.engine.submit(
                ids, limit or room, sink=pending.sink, tenant=tenant, logprobs=body.logprobs_k,
                **sampling_options(body),
            )  # fmt: skip
        except QueueFull as e:
            raise ApiError(429, str(e), "rate_limit_error", "rate_limit_exceeded") from None
        except ToolError as e:
            raise ApiError(400, str(e), param="tools") from None
        except ConstraintError as e:
            name = "grammar" if body.grammar is not None else "response_format"
            raise ApiError(400, str(e), param=name) from None
        except (ValueError, TypeError) as e:
            raise ApiError(400, str(e)) from None

    def prepare(self, schema, raw: bytes, pending: Pending, tenant):
        """On a worker thread: parse, validate, tokenize, submit. Also the splitter of a thinking
        model's chat answer (None otherwise: completions are the model's text as it is)."""
        body = parse(schema, raw, self.model_name)
        chat = schema is ChatRequest
        ids = chat_ids(self.tokenizer, body) if chat else prompt_ids(self.tokenizer, body)
        param = "messages" if chat else "prompt"
        fmt = thinking_format(self.tokenizer) if chat else None
        split = ThinkingSplitter(fmt, starts_inside(self.tokenizer, ids, fmt)) if fmt else None
        tools = None
        if chat and body.tools_on:
            names = frozenset((t.get("function") or {}).get("name") for t in body.tools)
            tools = ToolCallParser(tool_format(self.tokenizer), names=names)
        return body, len(ids), self.submit(body, ids, pending, param, tenant), split, tools

    async def generate(self, request: HttpRequest, schema):
        raw = await request.body()
        pending = Pending(asyncio.get_running_loop())
        tenant = request.scope.get("kwker.tenant")  # the key's name (kwker.serve.security)
        body, prompt_len, req, split, tools = await run_in_threadpool(
            self.prepare, schema, raw, pending, tenant
        )
        chat = schema is ChatRequest
        shapes = Shapes(self.model_name, chat, self.spelled, body.include_usage, split, tools)
        answer = self.stream if body.stream else self.collect
        return await answer(request, req, pending, body, prompt_len, shapes)

    # --------------------------------------------------------------------------- response side
    async def stream(self, request, req: Request, pending: Pending, body, prompt_len, shapes):
        async def events():
            n, stats = 0, None
            try:
                if shapes.opening():
                    yield shapes.opening()
                stops = StopText(body.stop_sequences)
                async for piece in pieces(req, pending, stops, shapes.split, shapes.tools):
                    n += piece.chunk is not None
                    stats = piece.stats or stats
                    lp = shapes.logprobs_of(piece.chunk)
                    if piece.text or piece.thinking or lp or piece.calls:
                        extra = {"kwker": piece.stats} if piece.stats else {}
                        delta = shapes.delta(
                            piece.text, lp, thinking=piece.thinking, calls=piece.calls
                        )
                        yield shapes.event([delta], **extra)
                    if piece.finish:
                        closing = shapes.delta("", finish=piece.finish)
                        yield shapes.event([closing], **({"kwker": stats} if stats else {}))
                if shapes.with_usage:
                    yield shapes.event([], usage=shapes.usage(prompt_len, n, stats))
            except Exception as e:  # noqa: BLE001  (this request's step failed; the others go on)
                yield f"data: {json.dumps(as_api_error(e).body())}\n\n"
            yield "data: [DONE]\n\n"

        return CancellingStream(req, events(), media_type="text/event-stream")

    async def collect(self, request, req: Request, pending: Pending, body, prompt_len, shapes):
        """The whole answer, or a cancel as soon as the client goes away."""

        async def gather():
            parts, thoughts, lps, n, stats, finish = [], [], [], 0, None, None
            stops = StopText(body.stop_sequences)
            async for piece in pieces(req, pending, stops, shapes.split, shapes.tools):
                n += piece.chunk is not None
                stats = piece.stats or stats
                parts.append(piece.text)
                thoughts.append(piece.thinking)
                if piece.chunk is not None and piece.chunk.logprob is not None:
                    lps.append(shapes.logprobs_of(piece.chunk))
                finish = piece.finish
            return "".join(parts), "".join(thoughts), lps, n, stats, finish

        answer = asyncio.ensure_future(gather())
        gone = asyncio.ensure_future(disconnected(request.receive))
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
            text, thinking, lps, n, stats, finish = answer.result()
        except Exception as e:  # noqa: BLE001  (this request's step failed; the others go on)
            raise as_api_error(e) from None
        lps = lps if body.logprobs_k is not None else None
        return shapes.whole(text, lps, prompt_len, n, stats, finish, thinking)

    # ---------------------------------------------------------------------------------- models
    def model_card(self) -> dict:
        return {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "kwker",
            "max_model_len": self.context,  # vLLM's name for it: clients read it to fit prompts
            "kwker": {
                "context_length": self.context,
                "precision": getattr(self.engine.decoder, "precision", None),
                "isa": getattr(self.engine.decoder, "isa", None),
                "max_batch": self.engine.max_active,
            },
        }


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
    routes = Routes(engine, model_name)
    app = FastAPI(title="Kwker", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.metrics = routes.metrics

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

    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_name, "active": engine.active,
                "waiting": engine.waiting}  # fmt: skip

    @app.get("/metrics")
    async def metrics_text():
        return Response(routes.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [routes.model_card()]}

    @app.get("/v1/models/{name:path}")
    async def model(name: str):
        if name != model_name:
            raise ApiError(
                404, f"unknown model {name!r}; this server runs {model_name!r}",
                code="model_not_found", param="model",
            )  # fmt: skip
        return routes.model_card()

    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        return await routes.generate(request, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        return await routes.generate(request, ChatRequest)

    return Guard(
        app,
        api_key=api_key,
        allowed_origins=allowed_origins,
        allowed_hosts=allowed_hosts,
        max_body=max_body,
        on_response=routes.metrics.response,
    )
