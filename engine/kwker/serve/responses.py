"""The response side of `kwker serve`'s HTTP API: the engine's chunks on their way to the event
loop (Pending), one answer generator that both a stream and a whole answer read (pieces: stop
sequences applied, the finish reason OpenAI's), and OpenAI's shapes for both (Shapes)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from kwker.serve.engine import END, Request
from kwker.serve.requests import ApiError
from kwker.serve.text import StopText
from kwker.thinking import ThinkingSplitter
from kwker.tools import CallDelta, ToolCallParser

STATS_EVERY_S = 0.25  # a stream's chunks carry fresh statistics at most this often


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


def finish_reason(reason: str | None) -> str:
    """OpenAI's finish_reason for the engine's."""
    if reason in ("eos", "stop"):
        return "stop"
    if reason == "length":
        return "length"
    raise ApiError(
        503, "the server stopped before the answer ended", "server_error", "server_stopping"
    )


@dataclass
class Piece:
    """What an answer adds: text (stop sequences held back until they cannot match), the chunk
    it came from (None for the closing piece), fresh statistics if the chunk carried them, the
    finish reason on the last piece, and a thinking model's thinking (text is then the answer
    only)."""

    text: str
    chunk: object | None
    stats: dict | None
    finish: str | None
    thinking: str = ""
    calls: list[CallDelta] | None = None  # the answer's tool calls' pieces (kwker.tools)


async def pieces(
    req: Request, pending: Pending, stops: StopText, split: ThinkingSplitter | None = None,
    tools: ToolCallParser | None = None,
) -> AsyncIterator[Piece]:  # fmt: skip
    """The answer as it comes, for a stream and a whole answer alike: a stop sequence cancels the
    request and ends it with "stop"; the last piece always has a finish reason. With split, a
    thinking model's text is parted into thinking and answer (after the stop sequences, which
    apply to what the model wrote); with tools, the answer into text and tool calls (an answer
    that called a tool ends with "tool_calls")."""
    async for piece in _pieces(req, pending, stops, split):
        yield _called(piece, tools)


async def _pieces(req, pending, stops, split) -> AsyncIterator[Piece]:
    async for chunk, fresh in pending.items():
        text, finish = stops.feed(chunk.text), None
        if stops.stopped:
            req.cancel()
            finish = "stop"
        elif chunk.finish_reason:
            text += stops.flush()
            finish = finish_reason(chunk.finish_reason)
        yield _parted(Piece(text, chunk, fresh, finish), split)
        if finish:
            return
    # ended without a last chunk: the server stopped it
    yield _parted(Piece("", None, None, finish_reason(req.seq.finish_reason)), split)


def _called(piece: Piece, tools: ToolCallParser | None) -> Piece:
    if tools is None:
        return piece
    token = piece.chunk.token if piece.chunk is not None else None
    text, calls = tools.feed(piece.text, token)
    if piece.finish:
        last = tools.flush()
        text, calls = text + last.text, calls + last.calls
        if tools.calls and piece.finish == "stop":
            piece.finish = "tool_calls"
    piece.text, piece.calls = text, calls
    return piece


def _parted(piece: Piece, split: ThinkingSplitter | None) -> Piece:
    if split is None:
        return piece
    token = piece.chunk.token if piece.chunk is not None else None
    thinking, answer = split.feed(piece.text, token) if piece.chunk is not None else ("", "")
    if piece.finish:
        last = split.flush()
        thinking, answer = thinking + last.thinking, answer + last.answer
    piece.thinking, piece.text = thinking, answer
    return piece


class Shapes:
    """OpenAI's response shapes for one request of either endpoint."""

    def __init__(
        self, model_name: str, chat: bool, spelled, with_usage: bool = False,
        split: ThinkingSplitter | None = None, tools: ToolCallParser | None = None,
    ):  # fmt: skip
        """spelled(token) -> the token's bytes (for logprobs); with_usage: a stream's last event
        carries usage (stream_options.include_usage); split: a thinking model's chat answer is
        parted by it (its thinking is the message's reasoning_content, as vLLM and llama.cpp's
        server return it)."""
        self.model, self.chat, self.spelled, self.with_usage = model_name, chat, spelled, with_usage
        self.split, self.tools = split, tools
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]

    def logprobs_of(self, chunk):
        """The chunk's token in OpenAI's logprobs shape (chat's content entry, or completions'
        columns)."""
        if chunk is None or chunk.logprob is None:
            return None

        def entry(token, logprob):
            raw = self.spelled(token)
            return {
                "token": raw.decode("utf-8", errors="replace"),
                "logprob": logprob,
                "bytes": list(raw),
            }

        top = [entry(t, lp) for t, lp in chunk.top_logprobs or ()]
        if self.chat:
            return {**entry(chunk.token, chunk.logprob), "top_logprobs": top}
        return {
            "tokens": [entry(chunk.token, 0)["token"]],
            "token_logprobs": [chunk.logprob],
            "top_logprobs": [{e["token"]: e["logprob"] for e in top}],
        }

    def usage(self, prompt_len: int, n: int, stats: dict | None) -> dict:
        """OpenAI's usage; a thinking model's thinking tokens as OpenAI counts its reasoning
        models' (completion_tokens_details.reasoning_tokens)."""
        out = {"prompt_tokens": prompt_len, "completion_tokens": n, "total_tokens": prompt_len + n}
        if self.split is not None:
            out["completion_tokens_details"] = {"reasoning_tokens": self.split.thinking_tokens}
        if stats is not None:
            out["kwker"] = stats
        return out

    # ---- a stream's server-sent events
    def event(self, choices: list, **extra) -> str:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        data = {"id": self.id, "object": kind, "created": int(time.time()), "model": self.model}
        data["choices"] = choices
        if self.with_usage and "usage" not in extra:
            data["usage"] = None
        data.update(extra)
        return f"data: {json.dumps(data)}\n\n"

    def delta(self, text: str, logprobs=None, finish=None, thinking: str = "", calls=None) -> dict:
        if self.chat:
            delta = {"reasoning_content": thinking} if thinking else {}
            if text or (finish is None and not thinking and not calls):
                delta["content"] = text
            if calls:
                delta["tool_calls"] = [_call_delta(c) for c in calls]
            lp = {"content": [logprobs]} if logprobs else None
            return {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        return {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}

    def opening(self) -> str | None:
        """A chat stream's first event: the assistant's role."""
        if not self.chat:
            return None
        return self.event([{**self.delta(""), "delta": {"role": "assistant", "content": ""}}])

    # ---- a whole answer
    def whole(
        self, text, logprobs: list | None, prompt_len, n, stats, finish, thinking: str = ""
    ) -> dict:
        """logprobs: the tokens' entries, or None when the request asked for none; thinking: a
        thinking model's (reasoning_content: null when it did not think)."""
        choice = {"index": 0, "finish_reason": finish}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
            if self.tools is not None and self.tools.calls:
                choice["message"]["content"] = text or None
                choice["message"]["tool_calls"] = [c.to_openai() for c in self.tools.calls]
            if self.split is not None:
                choice["message"]["reasoning_content"] = thinking or None
            choice["logprobs"] = {"content": logprobs} if logprobs is not None else None
        else:
            choice["text"] = text
            choice["logprobs"] = _columns(logprobs) if logprobs is not None else None
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(prompt_len, n, stats),
        }


def _call_delta(c: CallDelta) -> dict:
    """A tool call's piece as OpenAI streams it: id, type and name on its first piece only."""
    out: dict = {"index": c.index}
    if c.id is not None:
        out |= {"id": c.id, "type": "function"}
    out["function"] = {"arguments": c.arguments} | ({"name": c.name} if c.name else {})
    return out


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


async def disconnected(receive) -> None:
    """Returns when the client closes the connection (after the body, receive waits for that)."""
    while (await receive())["type"] != "http.disconnect":
        pass


class CancellingStream(StreamingResponse):
    """A stream whose request is cancelled however the response ends: sent in full, the client
    gone (Starlette then cancels the sending), or the server stopping."""

    def __init__(self, req: Request, content, **kw):
        super().__init__(content, **kw)
        self.req = req

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.req.cancel()
