"""Serving: kwker.serve.engine (continuous batching of requests from any thread, no HTTP) and the
OpenAI-compatible HTTP server on top of it, `kwker serve` (app: routes; schema: the request
bodies; security: host, origin, key and body checks; metrics: /metrics; text: stop sequences and
token bytes). The HTTP parts need the `serve` extra (fastapi, uvicorn, prometheus-client); the
engine needs nothing more than kwker."""

from __future__ import annotations

import os
import sys

from kwker.serve.engine import QueueFull, Request, ServingEngine, ServingObserver

__all__ = ["QueueFull", "Request", "ServingEngine", "ServingObserver", "create_app", "run_server"]


def create_app(engine: ServingEngine, model_name: str, api_key: str | None = None, **options):
    """The ASGI app serving `engine` (see kwker.serve.app.create_app for the options)."""
    from kwker.serve.app import create_app as make

    return make(engine, model_name, api_key, **options)


def api_key_from(key_file: str | None, key: str | None) -> str | None:
    """The key a server requires: from --api-key-file, else KWKER_API_KEY, else --api-key (which
    every user of the machine can read in `ps`: a warning says so)."""
    if key_file:
        with open(key_file, encoding="utf-8") as f:
            text = f.read().strip()
        if not text:
            raise ValueError(f"the API key file {key_file} is empty")
        return text
    if os.environ.get("KWKER_API_KEY"):
        return os.environ["KWKER_API_KEY"]
    if key:
        print(
            "kwker serve: warning: --api-key shows the key to every user of this machine (in "
            "`ps`); use --api-key-file or KWKER_API_KEY",
            file=sys.stderr,
        )
    return key


def run_server(
    model_spec: str | None,
    host: str,
    port: int,
    api_key: str | None,
    precision: str | None,
    max_batch: int,
    max_cache_len: int,
    threads: int | None,
    *,
    allowed_origins: tuple[str, ...] = (),
    allowed_hosts: tuple[str, ...] = (),
    max_body: int | None = None,
    max_queue: int = 64,
) -> None:
    """Loads the model and serves it until interrupted. Bound to loopback, only loopback names
    (and allowed_hosts) may be in the Host header; bound elsewhere, any name unless allowed_hosts
    lists them."""
    import uvicorn

    from kwker.models.loader import DEFAULT_MODEL, load_decoder
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
        max_batch=max_batch,
    )  # fmt: skip
    with ServingEngine(decoder, decoder.tokenizer, max_queue=max_queue) as engine:
        app = create_app(
            engine, model_spec or DEFAULT_MODEL, api_key, allowed_origins=allowed_origins,
            allowed_hosts=hosts, max_body=max_body or DEFAULT_MAX_BODY,
        )  # fmt: skip
        uvicorn.run(app, host=host, port=port, log_level="info")
