"""`kwker bench --batch`: aggregate throughput of the serving engine with B requests served
together."""

from __future__ import annotations

import statistics
import threading
import time

import torch

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
    off), and their time to first token when they all arrive at once."""
    from kwker.hf.decoder import KwkDecoder
    from kwker.loading.build import default_threads
    from kwker.models.loader import DEFAULT_MODEL, load_model

    threads = threads or default_threads()
    model, _ = load_model(model_spec, dtype=torch.float32)
    result = {
        "model": model_spec or DEFAULT_MODEL,
        "precision": precision or "model dtype",
        "threads": threads,
        "results": [],
    }
    for line in report.BATCH_HEADER:
        out(line)
    for b in batches:
        dec = KwkDecoder(
            model,
            max_cache_len=prompt_len + tg + 8,
            precision=precision,
            threads=threads,
            max_batch=b,
        )
        row = serve_together(dec, b, model.config.vocab_size, prompt_len, tg)
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
