"""Serving: kwker.serve.engine (continuous batching of requests from any thread, no HTTP) and the
OpenAI-compatible HTTP server on top of it, `kwker serve` (routes: the API as a class; requests
and schema: the request bodies; responses: OpenAI's shapes and the one answer generator;
security: host, origin, key and body checks; connections: deadlines and a connection cap;
metrics: /metrics; text: stop sequences and token bytes). The HTTP parts need the `serve` extra
(fastapi, uvicorn, prometheus-client); the engine needs nothing more than kwker."""

from __future__ import annotations

import sys

from kwker.serve.engine import QueueFull, Request, ServingEngine, ServingObserver

__all__ = ["QueueFull", "Request", "ServingEngine", "ServingObserver", "create_app", "run_server"]


def create_app(engine: ServingEngine, model_name: str, api_key: str | None = None, **options):
    """The ASGI app serving `engine` (see kwker.serve.routes.create_app for the options)."""
    from kwker.serve.routes import create_app as make

    return make(engine, model_name, api_key, **options)


def run_server(
    model_spec: str | None,
    host: str,
    port: int,
    api_key: str | dict[str, str] | None,
    precision: str | None,
    max_batch: int,
    max_cache_len: int,
    threads: int | None,
    *,
    allowed_origins: tuple[str, ...] = (),
    allowed_hosts: tuple[str, ...] = (),
    max_body: int | None = None,
    max_queue: int = 64,
    cache_slots: int = 4,
    shared_lookup: bool = True,
) -> None:
    """Loads the model and serves it until interrupted. Bound to loopback, only loopback names
    (and allowed_hosts) may be in the Host header; bound elsewhere, any name unless allowed_hosts
    lists them. cache_slots: KV slots beyond max_batch that keep earlier requests' text for the
    next ones (a prompt cache in RAM); shared_lookup: see ServingEngine."""
    import uvicorn

    from kwker.models.loader import DEFAULT_MODEL, load_decoder
    from kwker.serve.connections import guarded_protocol
    from kwker.serve.security import DEFAULT_MAX_BODY, LOOPBACK_NAMES, is_loopback

    if not api_key and not is_loopback(host):
        print(
            f"kwker serve: listening on {host} without an API key: anyone who can reach this "
            "machine can use the model (set KWKER_API_KEY or --api-key-file)",
            file=sys.stderr,
        )
    hosts = (*LOOPBACK_NAMES, *allowed_hosts) if is_loopback(host) else (allowed_hosts or None)
    decoder = load_decoder(
        model_spec, max_cache_len=max_cache_len, precision=precision, threads=threads,
        max_batch=max_batch + cache_slots,
    )  # fmt: skip
    engine = ServingEngine(
        decoder, decoder.tokenizer, max_queue=max_queue, max_active=max_batch,
        shared_lookup=shared_lookup,
    )  # fmt: skip
    with engine:
        app = create_app(
            engine, model_spec or DEFAULT_MODEL, api_key, allowed_origins=allowed_origins,
            allowed_hosts=hosts, max_body=max_body or DEFAULT_MAX_BODY,
        )  # fmt: skip
        # a deadline for each request's head and a cap on connections (no slowloris)
        uvicorn.run(app, host=host, port=port, log_level="info", http=guarded_protocol())
