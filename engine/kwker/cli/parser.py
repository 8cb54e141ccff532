"""The `kwker` command's arguments."""

from __future__ import annotations

import argparse

from kwker.cli.generate import cmd_generate
from kwker.cli.models import cmd_models
from kwker.precision import DRAFT, NAMES

MODEL_HELP = "a hub id (OWNER/REPO:QUANT for a GGUF repo's quant), a local folder or a .gguf file"
PRECISION_HELP = "weight precision (default: the model's own)"
THREADS_HELP = "threads to run on (default: one per CPU this process may use)"


def cmd_bench(args) -> int:
    from kwker.bench.main import main

    return main(args)


def cmd_serve(args) -> int:
    from kwker.api_keys import api_key_from
    from kwker.serve import run_server

    run_server(
        args.model,
        args.host,
        args.port,
        api_key_from(args.api_key_file, args.api_key),
        args.precision,
        args.max_batch,
        args.max_cache_len,
        args.threads,
        allowed_origins=tuple(args.allow_origin),
        allowed_hosts=tuple(args.allowed_host),
        max_body=args.max_body_bytes,
        cache_slots=args.cache_slots,
        shared_lookup=args.shared_lookup,
        max_queue=args.max_queue,
    )
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kwker", description="Fast, exact LLM inference on a plain CPU."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    g = sub.add_parser(
        "generate",
        help="stream text from a model (default: Qwen2.5-Coder-1.5B-Instruct), or from a server's model",
    )
    g.add_argument(
        "args",
        nargs="*",
        metavar="[MODEL] PROMPT",
        help="a hub id (OWNER/REPO:QUANT for a GGUF repo's quant), a local folder or a .gguf file, "
        "then the prompt (read from standard input when left out)",
    )
    g.add_argument(
        "--chat",
        dest="chat",
        action="store_true",
        default=None,
        help="wrap the prompt in the model's chat template (default when it has one)",
    )
    g.add_argument(
        "--no-chat", dest="chat", action="store_false", help="the prompt as it is, no template"
    )
    g.add_argument(
        "--no-think",
        action="store_true",
        help="a thinking model answers without thinking (its template's enable_thinking=false), "
        "and any thinking is not shown (else it is, dimmed on a terminal)",
    )
    g.add_argument("--max-new-tokens", type=int, default=128, help="longest answer (default 128)")
    g.add_argument(
        "--precision",
        choices=NAMES,
        default=None,
        help=PRECISION_HELP,
    )
    g.add_argument(
        "--seed", type=int, default=None, help="sample with this seed (temperature defaults to 0.7)"
    )
    g.add_argument(
        "--temperature", type=float, default=None, help="0 (the default without --seed): greedy"
    )
    g.add_argument("--top-p", type=float, default=None, help="default: the model's own")
    g.add_argument("--top-k", type=int, default=None, help="default: the model's own")
    g.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    g.add_argument(
        "--max-cache-len",
        type=int,
        default=None,
        help="tokens of context (default: 4096, or less if the model has less)",
    )
    g.add_argument(
        "--server",
        default=None,
        metavar="URL",
        help="ask the model of this OpenAI-compatible server instead (kwker serve, vLLM, "
        "llama.cpp's server, ...), e.g. http://host:8000/v1",
    )
    g.add_argument(
        "--api-key-file",
        default=None,
        help="--server: the server's API key, read from this file (or set KWKER_API_KEY)",
    )
    g.add_argument(
        "--model", default=None, help="--server: which of its models (default: its first)"
    )
    g.set_defaults(func=cmd_generate)

    b = sub.add_parser(
        "bench", help="prefill and generation tokens/s against peers, with the roofline"
    )
    b.add_argument("model", nargs="?", default=None, help=f"{MODEL_HELP} (default: SmolLM2-135M)")
    b.add_argument("--precision", choices=NAMES, default=None, help=PRECISION_HELP)
    b.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    b.add_argument(
        "--repeats", type=int, default=5, help="runs of each test; the median is reported"
    )
    b.add_argument("--pp", type=int, default=512, help="prompt tokens for the prefill test")
    b.add_argument("--tg", type=int, default=128, help="tokens for the generation test")
    b.add_argument(
        "--depth",
        type=int,
        default=16,
        help="tokens of context before the generation test (its GB/s count weights, not the KV cache)",
    )
    b.add_argument("--vs", default="", help="comma-separated peers: transformers, llama.cpp")
    b.add_argument(
        "--source-only",
        action="store_true",
        help="llama.cpp runs the model's own GGUF only (no GGUFs written for the comparison)",
    )
    b.add_argument("--json", default=None, help="write the results to this file")
    b.add_argument(
        "--batch", default=None, help="comma-separated batch sizes: aggregate throughput instead"
    )
    b.add_argument(
        "--lookup",
        action="store_true",
        help="speculative decoding: plain vs prompt lookup per task",
    )
    b.add_argument("--draft", default=None, help="speculative decoding with this draft model too")
    b.add_argument(
        "--draft-precision",
        default=None,
        choices=NAMES,
        help=f"the draft's precision (default {DRAFT}: the cheapest proposals; never changes the output)",
    )
    b.add_argument(
        "--quality",
        action="store_true",
        help="perplexity, KL and top-1 agreement vs fp32 of each precision on a fixed text",
    )
    b.set_defaults(func=cmd_bench)

    s = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (continuous batching)")
    s.add_argument("model", nargs="?", default=None, help=f"{MODEL_HELP} (default: SmolLM2-135M)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback)")
    s.add_argument("--port", type=int, default=8000, help="default 8000")
    s.add_argument(
        "--api-key-file",
        default=None,
        help="require 'Authorization: Bearer KEY' on every route, KEY read from this file "
        "(or set KWKER_API_KEY)",
    )
    s.add_argument(
        "--api-key", default=None, help="the key itself (visible in `ps`: prefer --api-key-file)"
    )
    s.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help="serve requests from web pages of this origin, e.g. https://chat.example.com "
        "(repeatable; none by default)",
    )
    s.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a Host name to answer to besides localhost (repeatable; bound to loopback, others "
        "are refused against DNS rebinding)",
    )
    s.add_argument(
        "--max-body-bytes", type=int, default=None, help="largest request body (default 4 MiB)"
    )
    s.add_argument("--max-queue", type=int, default=64, help="requests waiting before 429")
    s.add_argument("--precision", choices=NAMES, default=None, help=PRECISION_HELP)
    s.add_argument("--max-batch", type=int, default=8, help="requests decoded at once")
    s.add_argument(
        "--cache-slots",
        type=int,
        default=4,
        help="KV slots beyond --max-batch that keep earlier requests' text, so that a request "
        "sharing a prefix with one (a conversation's next turn) skips its prefill; each costs "
        "one request's KV cache of RAM (default 4)",
    )
    s.add_argument(
        "--no-shared-lookup",
        dest="shared_lookup",
        action="store_false",
        help="prompt lookup copies from each request's own text only, not from its key's "
        "earlier requests",
    )
    s.add_argument(
        "--max-cache-len", type=int, default=2048, help="tokens of context a request may use"
    )
    s.add_argument("--threads", type=int, default=None, help=THREADS_HELP)
    s.set_defaults(func=cmd_serve)

    m = sub.add_parser(
        "models", help="list, download, import, remove or search models; a GGUF repo's quants"
    )
    m.add_argument(
        "action",
        choices=["list", "download", "import", "remove", "search", "quants"],
        help="what to do",
    )
    m.add_argument(
        "name", nargs="?", default="",
        help="repo id (OWNER/REPO:QUANT for a quant of a GGUF repo), local path, or search text",
    )  # fmt: skip
    m.add_argument("--token", default=None, help="a Hugging Face token for gated or private repos")
    m.add_argument("--copy", action="store_true", help="import: copy the file into kwker's cache")
    m.set_defaults(func=cmd_models)
    return parser
