"""`kwker bench --batch`: aggregate throughput of the serving engine with B requests served
together."""

from __future__ import annotations

import statistics
import threading
import time

from kwker.bench import report
from kwker.bench.measure import prompt_tokens
from kwker.serve.engine import END, ServingEngine


def run_batch(
    model_spec=None,
    precision=None,
    threads=None,
    batches=(1, 2, 4, 8),
    tg=128,
    prompt_len=64,
    repeats=3,
    out=print,
) -> dict:
    """Aggregate generation throughput with B requests served together (continuous batching, lookup
    off), and their time to first token when they all arrive at once. kwker loads the model's files
    as `kwker serve` does (precision None: the nearest to the files' own), once, with a slot for
    each request of the largest batch.

    Each of `repeats` rounds serves every batch size in turn, so a host whose speed drifts moves
    them all alike; a row gives the medians over rounds, and a batch's ratio to the first is the
    median of the rounds' ratios."""
    from kwker.loading.build import default_threads
    from kwker.loading.load import load_files
    from kwker.models.loader import DEFAULT_MODEL, resolve_model

    threads = threads or default_threads()
    dec = load_files(
        resolve_model(model_spec),
        max_cache_len=prompt_len + tg + 8,
        precision=precision,
        threads=threads,
        max_batch=max(batches),
    )
    rounds = [
        [
            serve_together(dec, b, dec.config.vocab_size, prompt_len, tg, seed=r * 1000)
            for b in batches
        ]
        for r in range(repeats)
    ]
    rows = []
    for i, b in enumerate(batches):
        runs = [rnd[i] for rnd in rounds]
        row = {"batch": b, "runs": runs}
        for key in ("tokens_per_s", "generation_tokens_per_s", "ttft_ms"):
            row[key] = statistics.median(r[key] for r in runs)
        for key in ("tokens_per_s", "generation_tokens_per_s"):
            row[key + "_ratio"] = statistics.median(rnd[i][key] / rnd[0][key] for rnd in rounds)
        rows.append(row)
    for line in report.BATCH_HEADER:
        out(line)
    for row in rows:
        out(report.batch_row(row))
    for line in report.batch_scaling_lines(rows, repeats):
        out(line)
    return {
        "model": model_spec or DEFAULT_MODEL,
        "threads": threads,
        "precision": dec.precision,
        "repeats": repeats,
        "results": rows,
    }


class _Arrivals:
    """A request's sink (see kwker.serve.engine.Request): the engine's thread records when its
    chunks arrive, as kwker serve's routes take them from a sink."""

    def __init__(self):
        self.first: float | None = None
        self.last = 0.0
        self.tokens = 0
        self.error: BaseException | None = None
        self.done = threading.Event()

    def __call__(self, item) -> None:
        if item is END:
            self.done.set()
        elif isinstance(item, BaseException):
            self.error = item
        else:
            self.last = time.perf_counter()
            if self.first is None:
                self.first = self.last
            self.tokens += 1


def serve_together(dec, b: int, vocab: int, prompt_len: int, tg: int, seed: int = 0) -> dict:
    """b requests of tg tokens submitted at once to a serving engine on `dec` (b of its slots); a
    first token is timed when the engine hands it on. Chunks go to sinks, not to a thread per
    request: on 2 cores, b reader threads waking at every step took cores from the step itself
    (batch 2 read 1.64x batch 1 where its steps cost 1.07 one-row steps). The prompts are seeded
    from `seed` on: a round's prompts share no prefix with another's, so no request starts from
    an earlier one's cache."""
    with ServingEngine(dec, max_active=b) as engine:
        warm = prompt_tokens(prompt_len, vocab, seed=seed + 999)
        engine.submit(warm, 4, lookup=0).tokens()
        arrivals = [_Arrivals() for _ in range(b)]
        t0 = time.perf_counter()
        for i in range(b):
            prompt = prompt_tokens(prompt_len, vocab, seed=seed + i)
            engine.submit(prompt, tg, sink=arrivals[i], eos_token_id=[], lookup=0)
        for a in arrivals:
            a.done.wait()
        wall = max(a.last for a in arrivals) - t0
    for a in arrivals:
        if a.error is not None:
            raise a.error
        if a.tokens != tg:
            raise RuntimeError(f"a request gave {a.tokens} tokens of {tg}")
    ttft = [a.first - t0 for a in arrivals]
    # generation alone: the tokens after every first token, from the last first token to the end
    return {
        "batch": b,
        "tokens_per_s": b * tg / wall,
        "generation_tokens_per_s": b * (tg - 1) / (wall - max(ttft)),
        "ttft_ms": statistics.fmean(ttft) * 1000,
    }
