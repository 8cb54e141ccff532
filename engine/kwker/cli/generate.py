"""`kwker generate`: a prompt's answer streamed to stdout, from a local model or a server's."""

from __future__ import annotations

import sys
from pathlib import Path

from kwker.api_keys import client_key
from kwker.cli.common import progress as _progress
from kwker.thinking import ThinkingSplitter, starts_inside, template_kwargs, thinking_format

USAGE = 'usage: kwker generate [MODEL] "PROMPT"  (or the prompt on standard input)'


def _model_and_prompt(positional: list[str]) -> tuple[str | None, str]:
    """(model spec or None for the default, prompt) from generate's positional arguments. One
    argument is the prompt, unless it names a file or folder that exists: then it is the model.
    Without a prompt argument the prompt is read from standard input, when that is not a
    terminal (a prompt is never made up)."""
    if len(positional) > 2:
        raise SystemExit(USAGE)
    if len(positional) == 2:
        return positional[0], positional[1]
    if positional and not Path(positional[0]).expanduser().exists():
        return None, positional[0]
    return (positional or [None])[0], _prompt_from_stdin()


def _prompt_from_stdin() -> str:
    if sys.stdin is None or sys.stdin.isatty():
        raise SystemExit(f"kwker generate: no prompt given\n{USAGE}")
    prompt = sys.stdin.read().strip()
    if not prompt:
        raise SystemExit("kwker generate: the prompt on standard input is empty")
    return prompt


def cmd_generate(args) -> int:
    if args.server:
        return generate_remote(args)
    from kwker.models.loader import CHAT_MODEL, load_decoder
    from kwker.sampling import sampling_options

    model_spec, prompt = _model_and_prompt(args.args)
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
        ids = list(tokenizer.encode(prompt))
    if len(ids) + args.max_new_tokens > dec.max_cache_len:
        raise SystemExit(
            f"kwker: the prompt's {len(ids)} tokens and --max-new-tokens {args.max_new_tokens} "
            f"exceed --max-cache-len {dec.max_cache_len}"
        )
    sampling = sampling_options(
        args.temperature, seed=args.seed, top_p=args.top_p, top_k=args.top_k
    )
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


def generate_remote(args) -> int:
    """Streams the answer of a model on an OpenAI-compatible server (--server) to stdout."""
    from kwker.remote import RemoteModel, list_models, normalize_url

    if len(args.args) > 1:
        raise SystemExit(
            'usage: kwker generate --server URL [--model NAME] "prompt" (the server has the models)'
        )
    prompt = args.args[0] if args.args else _prompt_from_stdin()
    if args.chat is False:
        raise SystemExit(
            "kwker: --no-chat needs a local model; a server is asked through its chat API"
        )
    url, key = normalize_url(args.server), client_key(args.api_key_file)
    model = args.model
    if model is None:  # the server's first model (a Kwker server, like most, has one)
        offered = list_models(url, key)
        if not offered:
            raise SystemExit(f"kwker: the server at {url} offers no model")
        model = offered[0]
    sampling = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed}
    remote = RemoteModel(url, model, key)
    stream = remote.stream_chat(
        [{"role": "user", "content": prompt}],
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
