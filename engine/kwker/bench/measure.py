"""What `kwker bench` measures and how: repeated timings, the machine's roofline probes, and kwker's
RSS in a fresh process."""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
from dataclasses import dataclass, field

import torch

from kwker import _native

STEADY_RSS_CACHE = 2048  # the chat app's default context
PROBE_BYTES = 512 << 20  # the read-bandwidth probe's buffer: far beyond any cache


@dataclass
class Result:
    engine: str
    test: str
    values: list[float] = field(default_factory=list)
    bytes_per_token: int = 0

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def sd(self) -> float:
        return statistics.stdev(self.values) if len(self.values) > 1 else 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.values)


@dataclass
class Timings:
    """Every engine's results, with the probes taken beside them: read bandwidth (GB/s) beside each
    repeat's generation runs, the compute peak (G multiply-adds/s) beside its prefill runs."""

    results: dict  # (engine name, test) -> Result
    probes: list[float]
    peaks: list[float]


def prompt_tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, min(vocab, 32000), (n,), generator=g).tolist()


def machine_limits(threads: int) -> dict:
    return {
        "read_gb_s_1_thread": _native.measure_read_bandwidth(PROBE_BYTES, 1, 4),
        f"read_gb_s_{threads}_threads": _native.measure_read_bandwidth(PROBE_BYTES, threads, 4),
        f"fma_gflops_{threads}_threads": _native.measure_fma_peak(threads),
        f"int8_gmacs_{threads}_threads": _native.measure_int8_peak(threads),
        "isa": _native.isa_best(),
    }


def compute_peak(quantized: bool):
    """The probe of the peak multiply-adds/s that prefill's kernels can reach: int8 dot products for
    the quantized formats, float32 FMAs (two flops each) otherwise."""
    if quantized:
        return _native.measure_int8_peak
    return lambda threads: _native.measure_fma_peak(threads) / 2


def time_engines(
    engines, pp_tokens, pp_name, tg_prompt, tg, tg_name, repeats, threads, quantized
) -> Timings:
    """Prefill and generation of every engine, `repeats` times, alternating engines within each
    repeat so that the machine's drifts hit all of them alike."""
    results = {
        (e.name, t): Result(e.name, t, bytes_per_token=e.bytes_per_token)
        for e in engines
        for t in (pp_name, tg_name)
    }
    for e in engines:  # warm-up: page in weights, spin up thread pools
        e.pp(pp_tokens[:64])
        e.tg(tg_prompt, 8)
    measure_peak = compute_peak(quantized)
    timings = Timings(results, probes=[], peaks=[])
    for _ in range(repeats):
        for e in engines:
            results[(e.name, pp_name)].values.append(e.pp(pp_tokens))
        timings.peaks.append(measure_peak(threads))
        timings.probes.append(_native.measure_read_bandwidth(PROBE_BYTES, threads, 2))
        for e in engines:
            results[(e.name, tg_name)].values.append(e.tg(tg_prompt, tg))
        gc.collect()
    return timings


def prefill_macs_per_token(config) -> int:
    """Multiply-accumulates of one prompt token in the layers' matrices (embeddings and lm_head
    excluded: prefill computes logits for the last token only)."""
    from kwker.families.llama import head_dim

    hd = head_dim(config)
    q, kv = config.num_attention_heads * hd, config.num_key_value_heads * hd
    per_layer = config.hidden_size * (2 * q + 2 * kv + 3 * config.intermediate_size)
    return config.num_hidden_layers * per_layer


def steady_rss(
    model_spec=None, precision=None, threads=None, max_cache_len=STEADY_RSS_CACHE
) -> dict:
    """RSS in MB of a fresh process that does what the chat app does: import, load the model, pack
    it, let the float model go, generate 32 tokens. `steady` is after that, `peak` the high-water
    mark (loading)."""
    code = (
        "import json, sys; from kwker.bench.measure import steady_rss_child; "
        "print(json.dumps(steady_rss_child(*json.loads(sys.argv[1]))))"
    )
    args = json.dumps([model_spec, precision, threads, max_cache_len])
    r = subprocess.run(
        [sys.executable, "-c", code, args], capture_output=True, text=True, check=True
    )
    return json.loads(r.stdout.strip().splitlines()[-1])


def steady_rss_child(model_spec, precision, threads, max_cache_len) -> dict:
    """steady_rss's measurement, in the fresh process: the model loaded from its files, as the
    app loads it (kwker.loading: no torch)."""
    from kwker.models.loader import load_decoder

    dec = load_decoder(
        model_spec, max_cache_len=max_cache_len, precision=precision, threads=threads
    )
    gc.collect()
    ids = dec.tokenizer("The capital of France is")["input_ids"]
    dec.generate(ids, max_new_tokens=32)
    return {"steady": current_rss_mb(), "peak": peak_rss_mb(), "max_cache_len": max_cache_len}


def peak_rss_mb() -> float:
    """This process image's RSS high-water mark (VmHWM; unlike ru_maxrss, not inherited from a
    forking parent)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
