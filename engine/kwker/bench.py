"""`kwker bench`: prefill (pp) and generation (tg) tokens/s of Kwker and its peers, run alternately in one process
on the same weights and threads, with the machine's measured roofline.

Definitions (the same for every engine):
  pp<N>: N prompt tokens evaluated from an empty cache, N / seconds.
  tg<N>: after a 16-token prompt, N tokens decoded one at a time, (N - 1) / wall-clock seconds from the first new
         token to the last (the first token comes out of the prompt's evaluation; Python between steps counts).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from kwker import _native

# llama.cpp formats run beside each precision: int4 against Q4_0 (symmetric, 4.5 bits, the peer) and Q4_1
# (scale + min per block of 32, 5 bits: the same kind of format as kwker's int4)
GGUF_FORMATS = {None: ["F32"], "fp32": ["F32"], "bf16": ["BF16"], "balanced": ["Q8_0"], "int4": ["Q4_0", "Q4_1"]}
# The GGUF a model came from also runs as a peer, as it is, when kwker's precision keeps all its matrices exactly
# (int4 keeps Q4_1 grids and Q8_0, balanced Q8_0): both engines then compute with the same weights and read the
# same bytes. The formats above are written from its dequantized weights, so they can lose quality: see
# `kwker bench --quality --vs llama.cpp`.
# int4 also runs against Q4_0 as llama.cpp's own quantizer (llama-quantize's recipe) writes it from the same source:
# what a llama.cpp user gets for "Q4_0". It keeps a tied embedding whose rows are not a multiple of 256 at Q8_0, as
# kwker's int4 does (SmolLM2, Qwen2.5 0.5B); the Q4_0 above is pure (every matrix Q4_0, the issue's ~76 MB peer).
LLAMA_RECIPES = {"int4": ["Q4_0"]}
SOURCE_KEPT = {None: {"F32"}, "fp32": {"F32"}, "bf16": {"BF16"}, "balanced": {"Q8_0"}, "int4": {"Q4_1", "Q8_0"}}
LLAMA_CPP = ("llama.cpp", "llamacpp", "llama_cpp")  # the names --vs takes for llama.cpp
LLAMA_CPP_MISSING = "llama.cpp: llama-cpp-python is not installed (pip install 'kwker[bench]')"
TORCH_DTYPE = {None: torch.float32, "fp32": torch.float32, "bf16": torch.bfloat16}


def prompt_tokens(n: int, vocab: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(10, min(vocab, 32000), (n,), generator=g).tolist()


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


class KwkerEngine:
    name = "kwker"

    def __init__(self, model, precision, threads, max_cache_len):
        from kwker.decode import KwkDecoder

        self.dec = KwkDecoder(model, max_cache_len=max_cache_len, precision=precision, threads=threads)
        self.bytes_per_token = self.dec.weight_bytes_per_token

    def pp(self, tokens):
        self.dec.reset()
        t0 = time.perf_counter()
        self.dec.forward(tokens, logits="last")
        return len(tokens) / (time.perf_counter() - t0)

    def tg(self, prompt, n):
        self.dec.reset()
        self.dec.generate(prompt, max_new_tokens=n, eos_token_id=[], lookup=0)  # plain decoding: the roofline test
        return self.dec.last_stats.tokens_per_s


class TransformersEngine:
    name = "transformers"

    def __init__(self, model, precision, threads):
        self.model = model.to(TORCH_DTYPE[precision])
        torch.set_num_threads(threads)
        self.bytes_per_token = sum(p.numel() * p.element_size() for p in model.parameters()
                                   if p.dim() == 2 and p is not model.get_input_embeddings().weight)
        if model.lm_head.weight is model.get_input_embeddings().weight:
            self.bytes_per_token += model.lm_head.weight.numel() * model.lm_head.weight.element_size()

    @torch.no_grad()
    def pp(self, tokens):
        ids = torch.tensor([tokens])
        t0 = time.perf_counter()
        self.model(ids, logits_to_keep=1)
        return len(tokens) / (time.perf_counter() - t0)

    @torch.no_grad()
    def _generate(self, ids, n):
        t0 = time.perf_counter()
        self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, min_new_tokens=n,
                            do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0

    def tg(self, prompt, n):
        ids = torch.tensor([prompt])
        first = self._generate(ids, 1)
        return (n - 1) / (self._generate(ids, n) - first)


class LlamaCppEngine:
    def __init__(self, gguf_path, threads, n_ctx, fmt):
        from llama_cpp import Llama

        self.name = f"llama.cpp {fmt}"
        self.llm = Llama(model_path=str(gguf_path), n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads,
                         n_threads_batch=threads, verbose=False)
        self.bytes_per_token = _gguf_matrix_bytes(gguf_path)

    def pp(self, tokens):
        self.llm.reset()
        t0 = time.perf_counter()
        self.llm.eval(tokens)
        return len(tokens) / (time.perf_counter() - t0)

    def tg(self, prompt, n):
        self.llm.reset()
        self.llm.eval(prompt)
        tok = prompt[-1]
        t0 = time.perf_counter()
        for _ in range(n - 1):
            self.llm.eval([tok])
        return (n - 1) / (time.perf_counter() - t0)


def gguf_matrix_types(path) -> set[str]:
    """The storage types of a GGUF's matrices (F32 norms and biases left out)."""
    import gguf

    return {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) >= 2}


def _gguf_matrix_bytes(path) -> int:
    import gguf

    reader = gguf.GGUFReader(path)
    total = sum(int(t.n_bytes) for t in reader.tensors if len(t.shape) >= 2 and t.name != "token_embd.weight")
    if not any(t.name == "output.weight" for t in reader.tensors):  # tied: the embedding is the output matrix
        total += next(int(t.n_bytes) for t in reader.tensors if t.name == "token_embd.weight")
    return total


def machine_limits(threads: int) -> dict:
    return {
        "read_gb_s_1_thread": _native.measure_read_bandwidth(512 << 20, 1, 4),
        f"read_gb_s_{threads}_threads": _native.measure_read_bandwidth(512 << 20, threads, 4),
        f"fma_gflops_{threads}_threads": _native.measure_fma_peak(threads),
        f"int8_gmacs_{threads}_threads": _native.measure_int8_peak(threads),
        "isa": _native.isa_best(),
    }


def prefill_macs_per_token(model) -> int:
    """Multiply-accumulates of one prompt token in the layers' matrices (embeddings and lm_head excluded: prefill
    computes logits for the last token only)."""
    skip = {id(model.get_input_embeddings().weight), id(model.get_output_embeddings().weight)}
    return sum(p.numel() for p in model.parameters() if p.dim() == 2 and id(p) not in skip)


STEADY_RSS_CACHE = 2048  # the chat app's default context


def steady_rss(model_spec=None, precision=None, threads=None, max_cache_len=STEADY_RSS_CACHE) -> dict:
    """RSS in MB of a fresh process that does what the chat app does: import, load the model, pack it, let the
    float model go, generate 32 tokens. `steady` is after that, `peak` the high-water mark (loading)."""
    code = ("import json, sys; from kwker.bench import _steady_rss_child; "
            "print(json.dumps(_steady_rss_child(*json.loads(sys.argv[1]))))")
    args = json.dumps([model_spec, precision, threads, max_cache_len])
    r = subprocess.run([sys.executable, "-c", code, args], capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def _steady_rss_child(model_spec, precision, threads, max_cache_len) -> dict:
    from kwker.decode import KwkDecoder, trim_memory
    from kwker.models.loader import load_model

    model, tokenizer = load_model(model_spec)
    dec = KwkDecoder(model, max_cache_len=max_cache_len, precision=precision, threads=threads, tokenizer=tokenizer)
    del model
    gc.collect()
    trim_memory()
    dec.generate(tokenizer("The capital of France is", return_tensors="pt").input_ids, max_new_tokens=32)
    return {"steady": current_rss_mb(), "peak": peak_rss_mb(), "max_cache_len": max_cache_len}


def peak_rss_mb() -> float:
    """This process image's RSS high-water mark (VmHWM; unlike ru_maxrss, not inherited from a forking parent)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024


def current_rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def run(model_spec=None, precision=None, threads=None, repeats=5, pp=512, tg=128, depth=16, peers=(), json_path=None,
        out=print) -> dict:
    from kwker.decode import default_threads
    from kwker.models.loader import DEFAULT_MODEL, load_model, source_gguf

    threads = threads or default_threads()
    limits = machine_limits(threads)
    bw = limits[f"read_gb_s_{threads}_threads"]
    out(f"machine: {limits['isa']}, read {limits['read_gb_s_1_thread']:.1f} GB/s (1 thread), {bw:.1f} GB/s "
        f"({threads} threads), fp32 FMA peak {limits[f'fma_gflops_{threads}_threads']:.0f} GFLOP/s, int8 peak "
        f"{limits[f'int8_gmacs_{threads}_threads']:.0f} GMAC/s")
    model, _ = load_model(model_spec, dtype=torch.float32)
    name = model_spec or DEFAULT_MODEL
    n_ctx = max(pp, depth) + tg + 32
    engines = [KwkerEngine(model, precision, threads, n_ctx)]
    for peer in peers:
        if peer == "transformers":
            if precision not in TORCH_DTYPE:
                out(f"transformers has no {precision} weights: skipped")
                continue
            engines.append(TransformersEngine(model, precision, threads))
        elif peer in LLAMA_CPP:
            src = source_gguf(model_spec)
            if src is None:
                out("llama.cpp: no GGUF of these weights to convert from: skipped")
                continue
            types = gguf_matrix_types(src)
            runs = [(peer_gguf(src, fmt), fmt) for fmt in GGUF_FORMATS[precision]]
            if types <= SOURCE_KEPT[precision]:
                runs.append((src, f"{'+'.join(sorted(types))} (source file)"))
            try:
                for fmt in LLAMA_RECIPES.get(precision, []):
                    path = recipe_gguf(src, fmt, threads)
                    runs.append((path, f"{'+'.join(sorted(gguf_matrix_types(path)))} (llama-quantize {fmt})"))
                engines += [LlamaCppEngine(path, threads, n_ctx, fmt) for path, fmt in runs]
            except ImportError:
                out(f"{LLAMA_CPP_MISSING}: skipped")
        else:
            raise ValueError(f"unknown peer {peer!r} (transformers, llama.cpp)")
    out(f"model: {name}, precision {precision or 'model dtype'}, threads {threads}, kwker reads "
        f"{engines[0].bytes_per_token / 1e6:.0f} MB of weights per token")

    vocab = model.config.vocab_size
    # the generation test decodes after `depth` tokens of context (llama-bench's tg128 @ d<depth>)
    pp_tokens, tg_prompt = prompt_tokens(pp, vocab), prompt_tokens(depth, vocab, seed=1)
    tg_name = f"tg{tg}" if depth == 16 else f"tg{tg}@d{depth}"
    results = {(e.name, t): Result(e.name, t, bytes_per_token=e.bytes_per_token)
               for e in engines for t in (f"pp{pp}", tg_name)}
    for e in engines:  # warm-up: page in weights, spin up thread pools
        e.pp(pp_tokens[:64])
        e.tg(tg_prompt, 8)
    quantized = precision in ("balanced", "int4")
    measure_peak = _native.measure_int8_peak if quantized else lambda n: _native.measure_fma_peak(n) / 2
    probes = []  # read bandwidth beside each repeat's generation runs: the roofline of the same moments
    peaks = []  # and the compute peak (G multiply-adds/s) beside its prefill runs
    for _ in range(repeats):  # alternate engines within each repeat, so drifts hit all of them alike
        for e in engines:
            results[(e.name, f"pp{pp}")].values.append(e.pp(pp_tokens))
        peaks.append(measure_peak(threads))
        probes.append(_native.measure_read_bandwidth(512 << 20, threads, 2))
        for e in engines:
            results[(e.name, tg_name)].values.append(e.tg(tg_prompt, tg))
        gc.collect()
    # This shared host's speed drifts by tens of percent over minutes: generation's fraction of the roofline is its
    # median over the median of the probes taken beside it (the machine line above is the best of its probes).
    bw = statistics.median(probes)
    out(f"read bandwidth beside the generation runs: median {bw:.1f} GB/s ({threads} threads; range "
        f"{min(probes):.1f}-{max(probes):.1f}): the roofline below")

    # Prefill's ceiling: the multiply-accumulates of the layers' matrices per token at the compute peak of the
    # precision's kernels (int8 dot products for the quantized formats, float32 FMAs otherwise), the median of the
    # peaks measured beside the prefill runs.
    macs = prefill_macs_per_token(model)
    peak = statistics.median(peaks)
    out(f"{'int8' if quantized else 'fp32'} compute peak beside the prefill runs: median {peak:.0f} GMAC/s "
        f"({threads} threads; range {min(peaks):.0f}-{max(peaks):.0f})")
    out("| engine | test | tokens/s mean ± sd | median | GB/s | of roofline |")
    out("|---|---|---|---|---|---|")
    rows = []
    for r in results.values():
        if r.test.startswith("tg"):
            gbs = r.median * r.bytes_per_token / 1e9
            gbs_text, roof = f"{gbs:.1f}", f"{gbs / bw:.0%}"
        else:  # prefill: GMAC/s and the fraction of the compute peak
            gbs, gbs_text = None, f"{r.median * macs / 1e9:.0f} GMAC/s"
            roof = f"{r.median * macs / 1e9 / peak:.0%} of {'int8' if quantized else 'fp32'} peak" if peak else ""
        out(f"| {r.engine} | {r.test} | {r.mean:.1f} ± {r.sd:.1f} | {r.median:.1f} | {gbs_text} | {roof} |")
        rows.append({"engine": r.engine, "test": r.test, "tokens_per_s": {"mean": r.mean, "sd": r.sd,
                     "median": r.median, "values": r.values}, "gb_s": gbs,
                     "gmac_s": None if gbs else r.median * macs / 1e9})
    ratios = {}
    for e in engines[1:]:
        for t in (f"pp{pp}", tg_name):
            ratios[f"{t} kwker/{e.name}"] = results[("kwker", t)].median / results[(e.name, t)].median
    for k, v in ratios.items():
        out(f"{k}: {v:.2f}x (medians)")
    alone = steady_rss(model_spec, precision, threads)
    report = {"model": name, "precision": precision or "model dtype", "threads": threads,
              "machine": limits | {"read_gb_s_beside_runs": probes, "compute_peak_gmac_s_beside_runs": peaks},
              "roofline_tg_tokens_per_s": bw * 1e9 / engines[0].bytes_per_token, "results": rows, "ratios": ratios,
              "rss_mb": {"peak": peak_rss_mb(), "now": current_rss_mb(), "steady_alone": alone["steady"],
                         "peak_alone": alone["peak"]}}
    out(f"kwker generation roofline here: {report['roofline_tg_tokens_per_s']:.1f} tokens/s; this run's RSS peak "
        f"{report['rss_mb']['peak']:.0f} MB, now {report['rss_mb']['now']:.0f} MB (float model and peers loaded)")
    out(f"kwker alone (a fresh process: load, pack, float model freed, 32 tokens generated, max_cache_len "
        f"{alone['max_cache_len']}): steady RSS {alone['steady']:.0f} MB, peak {alone['peak']:.0f} MB")
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=2))
    return report


def run_batch(model_spec=None, precision=None, threads=None, batches=(1, 2, 4, 8), tg=128, prompt_len=64,
              out=print) -> dict:
    """Aggregate generation throughput with B requests served together (continuous batching, lookup off), and
    their time to first token when they all arrive at once."""
    from kwker.decode import KwkDecoder, default_threads
    from kwker.models.loader import DEFAULT_MODEL, load_model
    from kwker.serve import ServingEngine

    threads = threads or default_threads()
    model, _ = load_model(model_spec, dtype=torch.float32)
    vocab = model.config.vocab_size
    report = {"model": model_spec or DEFAULT_MODEL, "precision": precision or "model dtype", "threads": threads,
              "results": []}
    out("| batch | aggregate tokens/s (whole run) | aggregate generation tokens/s | per sequence | "
        "mean time to first token |")
    out("|---|---|---|---|---|")
    for b in batches:
        dec = KwkDecoder(model, max_cache_len=prompt_len + tg + 8, precision=precision, threads=threads, max_batch=b)
        with ServingEngine(dec) as engine:
            engine.submit(prompt_tokens(prompt_len, vocab, seed=99), 4, lookup=0).tokens()  # warm-up
            t0 = time.perf_counter()
            reqs = [engine.submit(prompt_tokens(prompt_len, vocab, seed=i), tg, eos_token_id=[], lookup=0)
                    for i in range(b)]
            ttft = [0.0] * b

            def consume(i):  # one reader per request, as b clients would: a first token is timed when it arrives
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
        agg = b * tg / wall
        # generation alone: the tokens after every first token, from the last first token to the end
        gen = b * (tg - 1) / (wall - max(ttft))
        out(f"| {b} | {agg:.1f} | {gen:.1f} | {gen / b:.1f} | {statistics.fmean(ttft) * 1000:.0f} ms |")
        report["results"].append({"batch": b, "tokens_per_s": agg, "generation_tokens_per_s": gen,
                                  "ttft_ms": statistics.fmean(ttft) * 1000})
    first = report["results"][0]
    for r in report["results"]:
        out(f"batch {r['batch']}: generation {r['generation_tokens_per_s'] / first['generation_tokens_per_s']:.2f}x, "
            f"whole run {r['tokens_per_s'] / first['tokens_per_s']:.2f}x batch {first['batch']}")
    return report


SPEC_TASKS = {
    "rewrite": "Fix the typos in this paragraph and return the whole corrected paragraph:\n\n"
               "The quick brwon fox jumpd over the lazy dog. It was a sunny day and the fox was verry happy. "
               "After jumping, the fox ran into the forrest, where it met a freindly owl. The owl asked the fox "
               "where it was going, and the fox said it was looking for its familly. Together they walked "
               "thru the trees untill the sun went down.",
    "chat": "Tell me a short story about a dragon who learns to cook.",
    "code": "Rewrite this function with type hints and a docstring, keeping the logic the same:\n\n"
            "def area(shape, a, b=None):\n    if shape == 'square':\n        return a * a\n"
            "    if shape == 'rectangle':\n        return a * b\n    if shape == 'circle':\n"
            "        return 3.14159 * a * a\n    raise ValueError(shape)\n",
}


def run_speculative(model_spec=None, precision=None, threads=None, draft_spec=None, max_new_tokens=160,
                    repeats=3, out=print, draft_precision=None) -> dict:
    """Greedy tokens/s per task: plain decoding, prompt lookup (and the draft model, with draft_spec), checked to
    give the same tokens; plus transformers' own prompt_lookup_num_tokens on the same task as a peer."""
    from kwker.decode import KwkDecoder, default_threads
    from kwker.models.loader import DEFAULT_MODEL, load_model
    from kwker.speculative import DRAFT_PRECISION

    threads = threads or default_threads()
    torch.set_num_threads(threads)
    model, tokenizer = load_model(model_spec, dtype=torch.float32)
    dec = KwkDecoder(model, max_cache_len=1024, precision=precision, threads=threads, tokenizer=tokenizer)
    modes = {"plain": dict(lookup=0), "lookup": dict(lookup=8)}
    if draft_spec:
        dmodel, dtok = load_model(draft_spec, dtype=torch.float32)
        draft = KwkDecoder(dmodel, max_cache_len=1024, precision=draft_precision or DRAFT_PRECISION, threads=threads,
                           tokenizer=dtok)
        modes["draft"] = dict(lookup=0, draft=draft)
        modes["lookup+draft"] = dict(lookup=8, draft=draft)
    report = {"model": model_spec or DEFAULT_MODEL, "precision": dec.precision, "threads": threads, "tasks": {}}
    llama = None if draft_spec else _llama_lookup_peer(model_spec, precision, threads, out)
    if draft_spec:
        out(f"draft {draft_spec} at {draft.precision}")
        report["draft"] = {"model": draft_spec, "precision": draft.precision}
    out("| task | mode | tokens/s median | speedup | tokens per step | accepted |")
    out("|---|---|---|---|---|---|")
    for task, text in SPEC_TASKS.items():
        ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                            return_tensors="pt", return_dict=True)["input_ids"]
        rates, outputs, stats = {m: [] for m in modes}, {}, {}
        for _ in range(repeats):
            for mode, kw in modes.items():  # alternate modes so that machine drifts hit all alike
                dec.reset()
                outputs[mode] = dec.generate(ids, max_new_tokens=max_new_tokens, **kw)
                stats[mode] = dec.last_stats
                rates[mode].append(stats[mode].tokens_per_s)
        for mode in modes:
            if not torch.equal(outputs[mode], outputs["plain"]):
                raise AssertionError(f"{mode} changed the output of task {task}")
        base = statistics.median(rates["plain"])
        report["tasks"][task] = {}
        for mode in modes:
            med = statistics.median(rates[mode])
            acc = {k: f"{v}/{stats[mode].proposed[k]}" for k, v in stats[mode].accepted.items()}
            out(f"| {task} | {mode} | {med:.1f} | {med / base:.2f}x | {stats[mode].tokens_per_step:.2f} | "
                f"{acc or '-'} |")
            report["tasks"][task][mode] = {"tokens_per_s": med, "speedup": med / base,
                                           "tokens_per_step": stats[mode].tokens_per_step}
        if draft_spec:  # transformers' float32 forward of a large target is too slow to be a useful peer here
            continue
        hf = []
        for n in (0, 10):  # transformers' own prompt lookup as a peer, on the same weights
            kw = dict(prompt_lookup_num_tokens=n) if n else {}
            t0 = time.perf_counter()
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens, do_sample=False,
                           pad_token_id=tokenizer.eos_token_id, **kw)
            hf.append(time.perf_counter() - t0)
        out(f"| {task} | transformers prompt lookup | {hf[0] / hf[1]:.2f}x its own plain decoding |")
        report["tasks"][task]["transformers_lookup_speedup"] = hf[0] / hf[1]
        if llama is not None:
            ratio, same = llama.lookup_speedup(ids[0].tolist(), max_new_tokens, repeats)
            out(f"| {task} | llama.cpp prompt lookup ({llama.fmt}) | {ratio:.2f}x its own plain decoding"
                f"{'' if same else ', and a different text than its plain decoding'} |")
            report["tasks"][task]["llama_cpp_lookup"] = {"speedup": ratio, "same_text_as_plain": same}
    return report


class LlamaCppLookup:
    """llama.cpp's own prompt-lookup decoding (llama-cpp-python's LlamaPromptLookupDecoding) beside its plain
    decoding, greedy, on the GGUF of the same weights in the format matching kwker's precision."""

    def __init__(self, gguf_path, fmt, threads, n_ctx=1024):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        self.fmt = fmt
        args = dict(model_path=str(gguf_path), n_ctx=n_ctx, n_threads=threads, n_threads_batch=threads, verbose=False)
        self.plain = Llama(**args)
        self.lookup = Llama(**args, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))

    def lookup_speedup(self, prompt: list[int], n: int, repeats: int) -> tuple[float, bool]:
        """(speedup of its lookup over its plain decoding, whether both gave the same text: llama.cpp's verify
        batch is not guaranteed to reproduce its one-token steps, unlike kwker's)."""
        times = {"plain": [], "lookup": []}
        outputs = {}
        for _ in range(repeats):
            for mode, llm in (("plain", self.plain), ("lookup", self.lookup)):
                llm.reset()
                t0 = time.perf_counter()
                out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1)
                times[mode].append(time.perf_counter() - t0)
                outputs[mode] = out["choices"][0]["text"]
        return statistics.median(times["plain"]) / statistics.median(times["lookup"]), \
            outputs["plain"] == outputs["lookup"]


def peer_gguf(src: Path, fmt: str) -> Path:
    """The GGUF of the same weights in llama.cpp format fmt, written beside the source once."""
    from kwker.models.gguf_tools import requantize

    return requantize(src, src.with_name(f"{src.stem}.{fmt}.gguf"), fmt)


def recipe_gguf(src: Path, fmt: str, threads: int) -> Path:
    """The GGUF llama.cpp's quantizer writes from src for fmt, beside the source once."""
    from kwker.models.gguf_tools import llama_quantize

    return llama_quantize(src, src.with_name(f"{src.stem}.llama-quantize-{fmt}.gguf"), fmt, threads)


def _llama_lookup_peer(model_spec, precision, threads, out):
    from kwker.models.loader import source_gguf

    src = source_gguf(model_spec)
    if src is None:
        return None
    fmt = GGUF_FORMATS[precision][0]
    gguf_path = peer_gguf(src, fmt)
    try:
        return LlamaCppLookup(gguf_path, fmt, threads)
    except ImportError:
        out(f"{LLAMA_CPP_MISSING}: its prompt lookup skipped")
        return None
