"""The serving engine: requests submitted from any thread join the running batch at the next step (continuous
batching), stream their tokens back, can be cancelled, and are refused when the queue is full. Plus an
OpenAI-compatible HTTP front end (`kwker serve`)."""

import json
import queue
import threading
import time
import uuid
from collections import deque

from kwker.sampling import SeededGenerator
from kwker.scheduler import DEFAULT_PREFILL_CHUNK, Scheduler
from kwker.sequence import SequenceState


class QueueFull(RuntimeError):
    pass


class Request:
    """A submitted generation: iterate it for GenerationChunks (ends after the last one); cancel() from anywhere."""

    def __init__(self, seq: SequenceState):
        self.seq = seq
        self._chunks: queue.SimpleQueue = queue.SimpleQueue()
        self._cancel = threading.Event()
        self.finish_reason: str | None = None

    def __iter__(self):
        while True:
            item = self._chunks.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> None:
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def tokens(self) -> list[int]:
        """Waits for the end and returns the new tokens."""
        return [c.token for c in self]


class ServingEngine:
    def __init__(
        self,
        decoder,
        tokenizer=None,
        max_queue: int = 64,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
    ):
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.max_queue = max_queue
        self.prefill_chunk = prefill_chunk
        self._waiting: deque[Request] = deque()
        self._wake = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()

    def start(self) -> None:
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="kwker-serve", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def submit(self, prompt, max_new_tokens: int = 128, **options) -> Request:
        """Queues a request (token ids) and returns its handle; bad options raise here, in the caller's thread."""
        ids = self.decoder.token_ids(prompt)
        seq = self.decoder.new_sequence(ids, max_new_tokens, tokenizer=self.tokenizer, **options)
        req = Request(seq)
        with self._wake:
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(
                    f"the queue is full ({self.max_queue} requests waiting); try again later"
                )
            self._waiting.append(req)
            self._wake.notify_all()
        return req

    def _loop(self) -> None:
        """Waits for requests; while any are active, holds the decoder (direct calls on it wait)
        and steps them."""
        scheduler = Scheduler(self.decoder.runner, self.prefill_chunk)
        requests: dict[int, Request] = {}  # id(seq) -> its request, for the active ones
        try:
            while self._wait_for_work():
                with self.decoder.runner.hold():
                    try:
                        self._serve_until_idle(scheduler, requests)
                    finally:
                        scheduler.close()  # stopped or failed with requests running: free slots
        finally:
            for req in list(requests.values()) + list(self._waiting):
                req._chunks.put(None)

    def _wait_for_work(self) -> bool:
        """Blocks until a request waits (True) or the engine stops (False)."""
        with self._wake:
            while not self._stop and not self._waiting:
                self._wake.wait()
            return not self._stop

    def _serve_until_idle(self, scheduler: Scheduler, requests: dict[int, Request]) -> None:
        """Admit, step, retire, until no request is active or waiting, or the engine stops."""
        while True:
            with self._wake:
                if self._stop:
                    return
                while self._waiting and (scheduler.has_room or not scheduler.active):
                    req = self._waiting.popleft()
                    try:
                        scheduler.admit(req.seq)
                    except RuntimeError as e:  # no slot at all: they are held elsewhere
                        _end(req, e)
                        continue
                    requests[id(req.seq)] = req
            for req in [r for r in requests.values() if r.cancelled]:
                req.seq.cancel()
                scheduler.retire(req.seq)
                _end(requests.pop(id(req.seq)))
            if not scheduler.active:
                return
            try:
                results = scheduler.step()
            except Exception as e:  # noqa: BLE001  (a failed step ends its requests, not the server)
                scheduler.close()
                for key in list(requests):
                    _end(requests.pop(key), e)
                continue
            for seq, chunks in results:
                req = requests[id(seq)]
                for c in chunks:
                    req._chunks.put(c)
                if seq.done:  # the scheduler retired it
                    _end(requests.pop(id(seq)))


def _end(req: Request, error: BaseException | None = None) -> None:
    """Ends a request's stream (after the error, if any)."""
    req.finish_reason = req.seq.finish_reason
    if error is not None:
        req._chunks.put(error)
    req._chunks.put(None)


# ------------------------------------------------------------------------------------------ OpenAI-compatible HTTP
class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.code = status, message, code


def _sampling(body: dict) -> dict:
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if not isinstance(temperature, (int, float)) or temperature < 0:
        raise ApiError(400, f"temperature must be a number >= 0, got {temperature!r}")
    if temperature == 0:
        return {"do_sample": False}
    seed = body.get("seed")
    gen = SeededGenerator(int(seed) if seed is not None else int(time.time_ns() % 2**62))
    opts = {"do_sample": True, "temperature": float(temperature), "generator": gen}
    for key in ("top_p", "top_k", "min_p", "repetition_penalty"):
        if body.get(key) is not None:
            opts[key] = body[key]
    return opts


def create_app(engine: ServingEngine, model_name: str, api_key: str | None = None):
    from fastapi import FastAPI
    from fastapi import Request as HttpRequest
    from fastapi.responses import JSONResponse, StreamingResponse
    from starlette.concurrency import run_in_threadpool

    app = FastAPI(title="Kwker", version="1")
    tokenizer = engine.tokenizer

    @app.exception_handler(ApiError)
    async def api_error(_, exc: ApiError):
        return JSONResponse(
            {"error": {"message": exc.message, "type": exc.code}}, status_code=exc.status
        )

    async def parse(request: HttpRequest) -> dict:
        if api_key is not None and request.headers.get("authorization") != f"Bearer {api_key}":
            raise ApiError(
                401, "missing or wrong API key (Authorization: Bearer ...)", "authentication_error"
            )
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ApiError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object")
        if body.get("model", model_name) != model_name:
            raise ApiError(
                404,
                f"unknown model {body.get('model')!r}; this server runs {model_name!r}",
                "model_not_found",
            )
        return body

    def submit(ids: list[int], body: dict) -> Request:
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens", 256))
        room = engine.decoder.max_cache_len - len(ids)
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise ApiError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
        if room < 1:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens; this server's context is "
                f"{engine.decoder.max_cache_len} tokens",
            )
        try:
            return engine.submit(ids, min(max_tokens, room), **_sampling(body))
        except QueueFull as e:
            raise ApiError(429, str(e), "rate_limit_error") from None
        except (ValueError, TypeError) as e:
            raise ApiError(400, str(e)) from None

    def respond(req: Request, prompt_len: int, body: dict, chat: bool):
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def usage(n):
            return {
                "prompt_tokens": prompt_len,
                "completion_tokens": n,
                "total_tokens": prompt_len + n,
            }

        if body.get("stream"):

            def events():
                n = 0
                try:
                    for c in req:
                        n += 1
                        piece = {"index": 0, "finish_reason": c.finish_reason}
                        piece.update({"delta": {"content": c.text}} if chat else {"text": c.text})
                        yield (
                            "data: "
                            + json.dumps(
                                {
                                    "id": rid,
                                    "object": kind + ("" if not chat else ".chunk"),
                                    "created": created,
                                    "model": model_name,
                                    "choices": [piece],
                                }
                            )
                            + "\n\n"
                        )
                    yield "data: [DONE]\n\n"
                finally:
                    req.cancel()  # the client went away (or we are done): stop generating for it

            return StreamingResponse(events(), media_type="text/event-stream")

        async def collect():
            chunks = await run_in_threadpool(lambda: list(req))
            text = "".join(c.text for c in chunks)
            finish = chunks[-1].finish_reason if chunks else "cancelled"
            finish = "stop" if finish == "eos" else finish
            choice = {"index": 0, "finish_reason": finish}
            choice.update(
                {"message": {"role": "assistant", "content": text}} if chat else {"text": text}
            )
            return {
                "id": rid,
                "object": kind,
                "created": created,
                "model": model_name,
                "choices": [choice],
                "usage": usage(len(chunks)),
            }

        return collect()

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "owned_by": "kwker"}],
        }

    @app.post("/v1/completions")
    async def completions(request: HttpRequest):
        body = await parse(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            ids = prompt
        elif isinstance(prompt, str) and tokenizer is not None:
            ids = tokenizer(prompt)["input_ids"]
        else:
            raise ApiError(400, "prompt must be a string (or a list of token ids)")
        out = respond(submit(ids, body), len(ids), body, chat=False)
        return out if isinstance(out, StreamingResponse) else await out

    @app.post("/v1/chat/completions")
    async def chat(request: HttpRequest):
        body = await parse(request)
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(m, dict) for m in messages)
        ):
            raise ApiError(400, "messages must be a non-empty list of {role, content} objects")
        if tokenizer is None or not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        try:
            ids = tokenizer.apply_chat_template(
                messages, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        except Exception as e:  # noqa: BLE001  (a template error is the client's malformed messages)
            raise ApiError(400, f"cannot apply the chat template: {e}") from None
        out = respond(submit(list(ids), body), len(ids), body, chat=True)
        return out if isinstance(out, StreamingResponse) else await out

    return app


def run_server(
    model_spec: str | None,
    host: str,
    port: int,
    api_key: str | None,
    precision: str | None,
    max_batch: int,
    max_cache_len: int,
    threads: int | None,
) -> None:
    import uvicorn

    from kwker.models.loader import DEFAULT_MODEL, load_decoder

    decoder = load_decoder(
        model_spec, max_cache_len=max_cache_len, precision=precision, threads=threads,
        max_batch=max_batch,
    )  # fmt: skip
    tokenizer = decoder.tokenizer
    with ServingEngine(decoder, tokenizer) as engine:
        uvicorn.run(
            create_app(engine, model_spec or DEFAULT_MODEL, api_key),
            host=host,
            port=port,
            log_level="info",
        )
