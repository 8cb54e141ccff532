"""`kwker bench --batch`: aggregate throughput of the serving engine with B requests served
together."""

from __future__ import annotations

import statistics
import threading
import time

from kwker.bench import report
from kwker.bench.measure import prompt_tokens


def run_batch(
    model_spec=None,
    precision=None,
    threads=None,
    batches=(1, 2, 4, 8),
    tg=128,
    prompt_len=64,
    out=print,
) -> dict:
    """Aggregate generation throughput with B requests served together (continuous batching, lookup
    off), and their time to first token when they all arrive at once. kwker loads the model's files
    as `kwker serve` does (precision None: the nearest to the files' own)."""
    from kwker.loading.build import default_threads
    from kwker.loading.load import load_files
    from kwker.models.loader import DEFAULT_MODEL, resolve_model

    threads = threads or default_threads()
    path = resolve_model(model_spec)
    result = {
        "model": model_spec or DEFAULT_MODEL,
        "threads": threads,
        "results": [],
    }
    for line in report.BATCH_HEADER:
        out(line)
    for b in batches:
        dec = load_files(
            path,
            max_cache_len=prompt_len + tg + 8,
            precision=precision,
            threads=threads,
            max_batch=b,
        )
        result["precision"] = dec.precision
        row = serve_together(dec, b, dec.config.vocab_size, prompt_len, tg)
        out(report.batch_row(row))
        result["results"].append(row)
    for line in report.batch_scaling_lines(result["results"]):
        out(line)
    return result


def serve_together(dec, b: int, vocab: int, prompt_len: int, tg: int) -> dict:
    """b requests of tg tokens submitted at once to a serving engine on `dec`, each read by its own
    thread as b clients would: a first token is timed when it arrives."""
    from kwker.serve import ServingEngine

    with ServingEngine(dec) as engine:
        engine.submit(prompt_tokens(prompt_len, vocab, seed=99), 4, lookup=0).tokens()  # warm-up
        t0 = time.perf_counter()
        reqs = [
            engine.submit(prompt_tokens(prompt_len, vocab, seed=i), tg, eos_token_id=[], lookup=0)
            for i in range(b)
        ]
        ttft = [0.0] * b

        def consume(i):
            it = iter(reqs[i])
            next(it)
            ttft[i] = time.perf_counter() - t0
            sum(1 for _ in it)

        readers = [threading.Thread(target=consume, args=(i,)) for i in range(b)]
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        wall = time.perf_counter() - t0
    # generation alone: the tokens after every first token, from the last first token to the end
    return {
        "batch": b,
        "tokens_per_s": b * tg / wall,
        "generation_tokens_per_s": b * (tg - 1) / (wall - max(ttft)),
        "ttft_ms": statistics.fmean(ttft) * 1000,
    }
