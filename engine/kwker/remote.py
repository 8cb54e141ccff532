"""A client for OpenAI-compatible servers (`kwker serve`, vLLM, SGLang, llama.cpp's server,
Ollama's /v1): the models a server offers, and a chat answer streamed as chunks shaped like the
local engine's (a text piece, statistics, a finish reason on the last one).

Statistics: a Kwker server reports its own figures (the keys of GenerationStats.summary()) in
`usage["kwker"]` and, every ~0.25 s, in a top-level `kwker` field of its streamed chunks; they are
passed on with measured="server". Any other server's figures are measured here, from the streamed
pieces (measured="client"): the time to the first piece and the rate of the pieces after it (or of
usage.completion_tokens when the server reports it), never a speedup.

Failures raise RemoteError, whose message says what happened in words a user can act on, with the
server's own message from its OpenAI-shaped error body ({"error": {"message", ...}}).

Torch-free and Qt-free; the `openai` package (the chat extra) is imported on first use."""

from __future__ import annotations

import errno
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

CONNECT_TIMEOUT_S = 5.0  # a server that does not accept the connection by then is not there
READ_TIMEOUT_S = 300.0  # between two bytes of an answer: a busy server's queue, a long prefill
STATS_EVERY_S = 0.05  # client-measured figures are refreshed at most this often

# RemoteError kinds
UNREACHABLE, AUTH, NOT_FOUND, BUSY, REFUSED, FAILED, CUT = (
    "unreachable", "auth", "not_found", "busy", "refused", "failed", "cut",
)  # fmt: skip


class RemoteError(RuntimeError):
    """A server's failure in words; kind: one of the constants above (CUT: the stream ended
    midway, after some of the answer arrived)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass
class RemoteChunk:
    text: str
    stats: dict | None  # the figures so far when fresh ones came with this piece, else None
    finish_reason: str | None = None  # on the last chunk only: the server's ("stop", "length")
    token: int = -1  # a server sends text, not token ids
    source: str = ""  # which speculation supplied it: a server does not say
    # a thinking model's thinking, which the server sent apart (reasoning_content: Kwker, vLLM,
    # llama.cpp's server; vLLM's newer "reasoning")
    thinking: str = ""
    # on the last chunk, the tool calls the answer made ({id, name, arguments: JSON text}), put
    # together from the server's tool_calls deltas
    tool_calls: list[dict] | None = None


def normalize_url(url: str) -> str:
    """The API's base URL from what a user types: http:// when no scheme is given, no trailing
    slash, and /v1 when only a host (and port) is given, the path every such server uses."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    url = url.rstrip("/")
    if urlsplit(url).path in ("", "/"):
        url += "/v1"
    return url


def _client(base_url: str, api_key: str | None):
    try:
        import openai
    except ImportError as e:
        raise RemoteError(
            FAILED, "talking to a server needs the openai package: pip install 'kwker[chat]'"
        ) from e
    # The openai client refuses an empty key; a server without keys ignores this placeholder, and a
    # 401 is explained as a missing key (RemoteModel knows none was given).
    return openai.OpenAI(
        base_url=base_url,
        api_key=api_key or "no-key",
        max_retries=0,  # a failure is said at once; the user decides whether to try again
        timeout=openai.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
    )


def server_message(e) -> str:
    """The server's own words from an openai APIError: the OpenAI shape's message, FastAPI's
    detail, or the start of the body as it came."""
    body = getattr(e, "body", None)
    if isinstance(body, dict):
        for key in ("message", "detail", "error"):
            if isinstance(body.get(key), str) and body[key].strip():
                return body[key].strip()
    if isinstance(body, str) and body.strip():
        return body.strip()[:300]
    response = getattr(e, "response", None)
    text = ""
    try:
        text = response.text.strip() if response is not None else ""
    except Exception:  # noqa: BLE001  (a streamed body that was not read: no text to show)
        text = ""
    return text[:300] or str(getattr(e, "message", "") or e)


def _connection_reason(e: BaseException) -> str:
    """Why a connection failed, from the chain of causes ("connection refused", ...)."""
    seen = e
    while seen is not None:
        if isinstance(seen, ConnectionRefusedError) or getattr(seen, "errno", None) == (
            errno.ECONNREFUSED
        ):
            return "connection refused"
        text = str(seen)
        if "Connection refused" in text:
            return "connection refused"
        if "Name or service not known" in text or "nodename nor servname" in text:
            return "unknown host name"
        seen = seen.__cause__ or seen.__context__
    cause = e.__cause__ or e.__context__
    return str(cause or e) or type(e).__name__


def explain(e: BaseException, base_url: str, model: str = "", had_key: bool = True,
            midway: bool = False) -> RemoteError:  # fmt: skip
    """The RemoteError for an exception of the openai client (midway: some of the answer had
    arrived: the stream was cut)."""
    import openai

    if isinstance(e, RemoteError):
        return e
    if midway:
        if isinstance(e, openai.APITimeoutError):
            why = f"nothing arrived for {READ_TIMEOUT_S:.0f} s"
        elif isinstance(e, openai.APIError) and not isinstance(e, openai.APIConnectionError):
            why = f"the server said: {server_message(e)}"  # an error event in the stream
        else:
            why = "the connection was lost"
        return RemoteError(CUT, f"The answer was cut midway: {why}.")
    if isinstance(e, openai.APITimeoutError):
        return RemoteError(
            UNREACHABLE, f"The server at {base_url} did not answer in {READ_TIMEOUT_S:.0f} s."
        )
    if isinstance(e, openai.APIConnectionError):
        return RemoteError(
            UNREACHABLE,
            f"Cannot reach the server at {base_url} ({_connection_reason(e)}). Is it running, "
            "and is the address right?",
        )
    if not isinstance(e, openai.APIStatusError):
        return RemoteError(FAILED, f"The server at {base_url} failed: {server_message(e)}")
    status, said = e.status_code, server_message(e)
    if status == 401:
        if had_key:
            return RemoteError(AUTH, f"The server at {base_url} refused the API key (401: {said}).")
        return RemoteError(AUTH, f"The server at {base_url} needs an API key (401: {said}).")
    if status == 403:
        return RemoteError(AUTH, f"The server at {base_url} refused access (403: {said}).")
    if status == 404:
        about_model = "model" in f"{e.code} {getattr(e, 'type', '')} {said}".lower()
        if model and about_model:
            return RemoteError(
                NOT_FOUND, f"The server at {base_url} has no model “{model}” (404: {said})."
            )
        return RemoteError(
            NOT_FOUND,
            f"Nothing answers at {base_url} (404: {said}). Is the address right? Most servers "
            "serve their API under /v1.",
        )
    if status == 429:
        return RemoteError(
            BUSY, f"The server at {base_url} is busy (429: {said}). Try again in a moment."
        )
    if status >= 500:
        return RemoteError(FAILED, f"The server at {base_url} failed ({status}: {said}).")
    return RemoteError(REFUSED, f"The server at {base_url} refused the request ({status}: {said}).")


def _exceeds_context(e: BaseException) -> bool:
    """A 400 saying that the prompt and max_tokens together exceed the model's context (OpenAI's
    and Kwker's code; vLLM's words), not that the prompt alone does."""
    import openai

    if not isinstance(e, openai.APIStatusError) or e.status_code != 400:
        return False
    said = server_message(e).lower()
    if getattr(e, "code", None) == "context_length_exceeded":
        return getattr(e, "param", None) == "max_tokens" or "max_tokens" in said
    return "maximum context length" in said and "completion" in said


def list_models(base_url: str, api_key: str | None = None) -> list[str]:
    """The ids of the models the server at base_url offers (its /v1/models), in its order."""
    try:
        return [m.id for m in _client(base_url, api_key).models.list().data]
    except Exception as e:
        raise explain(e, base_url, had_key=bool(api_key)) from e


class _Meter:
    """The figures of a server that reports none, measured here from its streamed pieces."""

    def __init__(self):
        self.t0 = time.perf_counter()
        self.first: float | None = None
        self.last = self.t0
        self.pieces = 0

    def piece(self) -> None:
        self.last = time.perf_counter()
        if self.first is None:
            self.first = self.last
        self.pieces += 1

    def summary(self, usage=None) -> dict:
        """usage: the server's token counts when it reported them (its completion_tokens is the
        count to use: a piece may hold several tokens)."""
        tokens = getattr(usage, "completion_tokens", None) or self.pieces
        first = self.first if self.first is not None else self.last
        # the rate of the tokens after the first: the first one's wait is the prompt's time
        decode_s = self.last - first
        return {
            "measured": "client",
            "counted": "usage" if getattr(usage, "completion_tokens", None) else "pieces",
            "new_tokens": tokens,
            "tokens_per_s": (tokens - 1) / decode_s if tokens > 1 and decode_s > 0 else 0.0,
            "ttft_s": first - self.t0,
            "prompt_tokens": getattr(usage, "prompt_tokens", None) or 0,
            "elapsed_s": time.perf_counter() - self.t0,
        }


def _kwker_stats(obj) -> dict | None:
    """The `kwker` figures a Kwker server attaches to a chunk or to its usage, if any."""
    if obj is None:
        return None
    extra = getattr(obj, "model_extra", None) or {}
    found = extra.get("kwker", getattr(obj, "kwker", None))
    return found if isinstance(found, dict) else None


def _reasoning(delta) -> str:
    """A delta's thinking: a field the OpenAI client keeps as an extra."""
    extra = getattr(delta, "model_extra", None) or {}
    return extra.get("reasoning_content") or extra.get("reasoning") or ""


class RemoteModel:
    """One model on one server."""

    def __init__(self, base_url: str, model: str, api_key: str | None = None):
        self.base_url, self.model, self.api_key = normalize_url(base_url), model, api_key
        self.client = _client(self.base_url, api_key)

    def _explain(self, e: BaseException, midway: bool = False) -> RemoteError:
        return explain(e, self.base_url, self.model, bool(self.api_key), midway)

    def stream_chat(self, messages: list[dict], max_tokens: int | None = None,
                    template_kwargs: dict | None = None, tools: list[dict] | None = None,
                    **sampling) -> Iterator[RemoteChunk]:  # fmt: skip
        """The answer to messages (role/content dicts) as it streams. sampling: temperature,
        top_p, seed (None values are left out); template_kwargs: the chat template's variables
        ({"enable_thinking": False}), sent as vLLM's chat_template_kwargs (only when given: a
        server without them may refuse the field); tools: OpenAI's function list (only when
        given), the calls coming back on the last chunk. Closing the generator closes the HTTP
        response, which tells the server to stop generating. Raises RemoteError."""
        params = {k: v for k, v in sampling.items() if v is not None}
        if tools:
            params["tools"] = tools
        if template_kwargs:
            params["extra_body"] = {"chat_template_kwargs": template_kwargs}
        meter = _Meter()

        def ask(**limit):
            return self.client.chat.completions.create(
                model=self.model, messages=messages, stream=True,
                stream_options={"include_usage": True}, **params, **limit,
            )  # fmt: skip

        try:
            try:
                stream = ask(**({"max_tokens": int(max_tokens)} if max_tokens else {}))
            except Exception as e:
                # A long conversation leaves less room than the answer's cap: servers that check
                # (Kwker, vLLM, OpenAI) refuse prompt + max_tokens > context; without the cap
                # they answer up to the context, which is the most that fits.
                if not (max_tokens and _exceeds_context(e)):
                    raise
                stream = ask()
        except Exception as e:
            raise self._explain(e) from e
        try:
            yield from self._pieces(stream, meter)
        finally:
            stream.close()

    def _pieces(self, stream, meter: _Meter) -> Iterator[RemoteChunk]:
        reason, server_stats, usage = None, None, None
        calls: dict[int, dict] = {}  # the tool calls, by their index, as their deltas arrive
        sent = meter.t0
        try:
            for chunk in stream:
                live = _kwker_stats(chunk)
                if live is not None:
                    server_stats = live
                if chunk.usage is not None:
                    usage = chunk.usage
                    server_stats = _kwker_stats(chunk.usage) or server_stats
                choice = chunk.choices[0] if chunk.choices else None
                text = (choice.delta.content or "") if choice is not None else ""
                thought = _reasoning(choice.delta) if choice is not None else ""
                if choice is not None and choice.finish_reason:
                    reason = choice.finish_reason
                for d in (choice.delta.tool_calls or ()) if choice is not None else ():
                    call = calls.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
                    call["id"] = d.id or call["id"]
                    if d.function is not None:
                        call["name"] += d.function.name or ""
                        call["arguments"] += d.function.arguments or ""
                if text or thought:
                    meter.piece()
                now = time.perf_counter()
                if server_stats is not None:
                    stats = self._server_figures(server_stats, meter) if live else None
                elif meter.pieces and now - sent >= STATS_EVERY_S:
                    stats = meter.summary(usage)
                else:
                    stats = None
                if stats is not None:
                    sent = now
                if text or thought or stats:
                    yield RemoteChunk(text, stats, thinking=thought)
        except Exception as e:
            # after the request was answered with 200, any failure is a stream cut midway
            raise self._explain(e, midway=True) from e
        if reason is None:
            raise RemoteError(
                CUT, "The answer was cut midway: the server ended the stream without finishing."
            )
        final = (
            self._server_figures(server_stats, meter)
            if server_stats is not None
            else meter.summary(usage)
        )
        yield RemoteChunk("", final, finish_reason=reason,
                          tool_calls=[calls[i] for i in sorted(calls)] or None)  # fmt: skip

    @staticmethod
    def _server_figures(stats: dict, meter: _Meter) -> dict:
        first = meter.first if meter.first is not None else meter.last
        return {
            **stats,
            "measured": "server",
            "ttft_s": first - meter.t0,
            "elapsed_s": time.perf_counter() - meter.t0,
        }
