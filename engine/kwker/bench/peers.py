"""The engines `kwker bench` times side by side, all with one interface (name, bytes_per_token, pp,
tg): kwker itself, transformers on the same float weights, and llama.cpp (llama-cpp-python, the
optional `bench` extra) on GGUF files of the same weights, written here in the format matching
kwker's precision."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from kwker.llama_cpp_amx import NOTE as AMX_NOTE
from kwker.llama_cpp_amx import cpu_has_amx, keep_llama_cpp_off_amx
from kwker.precision import PRECISIONS

LLAMA_CPP = ("llama.cpp", "llamacpp", "llama_cpp")  # the names --vs takes for llama.cpp
LLAMA_CPP_MISSING = "llama.cpp: llama-cpp-python is not installed (pip install 'kwker[bench]')"


class KwkerEngine:
    name = "kwker"

    def __init__(self, path, precision, threads, max_cache_len):
        """kwker on the model files at `path`, as the app and the CLI load them (kwker.loading)."""
        from kwker.loading.load import load_files

        self.dec = load_files(
            path, max_cache_len=max_cache_len, precision=precision, threads=threads
        )
        self.bytes_per_token = self.dec.weight_bytes_per_token

    def pp(self, tokens):
        self.dec.reset()
        t0 = time.perf_counter()
        self.dec.forward(tokens, logits="last")
        return len(tokens) / (time.perf_counter() - t0)

    def tg(self, prompt, n):
        self.dec.reset()
        # plain decoding: the roofline test
        self.dec.generate(prompt, max_new_tokens=n, eos_token_id=[], lookup=0)
        return self.dec.last_stats.tokens_per_s


class TransformersEngine:
    name = "transformers"

    def __init__(self, model, dtype: str, threads):
        self.model = model.to(getattr(torch, dtype))  # in place: kwker has packed its copy already
        torch.set_num_threads(threads)
        embedding = model.get_input_embeddings().weight
        self.bytes_per_token = sum(
            p.numel() * p.element_size()
            for p in model.parameters()
            if p.dim() == 2 and p is not embedding
        )
        if model.lm_head.weight is embedding:  # tied: the embedding is read whole as the lm_head
            self.bytes_per_token += embedding.numel() * embedding.element_size()

    @torch.no_grad()
    def pp(self, tokens):
        ids = torch.tensor([tokens])
        t0 = time.perf_counter()
        self.model(ids, logits_to_keep=1)
        return len(tokens) / (time.perf_counter() - t0)

    @torch.no_grad()
    def _generate(self, ids, n):
        t0 = time.perf_counter()
        self.model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
        return time.perf_counter() - t0

    def tg(self, prompt, n):
        ids = torch.tensor([prompt])
        first = self._generate(ids, 1)
        return (n - 1) / (self._generate(ids, n) - first)


class LlamaCppEngine:
    def __init__(self, gguf_path, threads, n_ctx, fmt):
        from llama_cpp import Llama

        keep_llama_cpp_off_amx()
        self.name = f"llama.cpp {fmt}"
        self.llm = Llama(
            model_path=str(gguf_path),
            n_ctx=n_ctx,
            n_batch=512,
            n_ubatch=512,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self.bytes_per_token = gguf_matrix_bytes(gguf_path)

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


class LlamaCppLookup:
    """llama.cpp's own prompt-lookup decoding (llama-cpp-python's LlamaPromptLookupDecoding) beside
    its plain decoding, greedy, on the GGUF of the same weights in the format matching kwker's
    precision."""

    def __init__(self, gguf_path, fmt, threads, n_ctx=1024):
        from llama_cpp import Llama
        from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

        keep_llama_cpp_off_amx()
        self.fmt = fmt
        args = dict(
            model_path=str(gguf_path),
            n_ctx=n_ctx,
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
        self.plain = Llama(**args)
        self.lookup = Llama(**args, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))

    def lookup_speedup(self, prompt: list[int], n: int, repeats: int) -> tuple[float, bool]:
        """(speedup of its lookup over its plain decoding, whether both gave the same text:
        llama.cpp's verify batch is not guaranteed to reproduce its one-token steps, unlike
        kwker's)."""
        times = {"plain": [], "lookup": []}
        outputs = {}
        for _ in range(repeats):
            for mode, llm in (("plain", self.plain), ("lookup", self.lookup)):
                llm.reset()
                t0 = time.perf_counter()
                out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1)
                times[mode].append(time.perf_counter() - t0)
                outputs[mode] = out["choices"][0]["text"]
        speedup = statistics.median(times["plain"]) / statistics.median(times["lookup"])
        return speedup, outputs["plain"] == outputs["lookup"]


def peer_engines(peers, model_spec, precision, threads, n_ctx, out, source_only=False) -> list:
    """The peer engines named in `peers` for kwker at `precision` (a table name). transformers
    loads the model itself, as float32; llama.cpp runs GGUFs of the same weights (source_only:
    only the model's own GGUF, none written for the comparison)."""
    engines = []
    for peer in peers:
        if peer == "transformers":
            dtype = PRECISIONS[precision].transformers_dtype
            if dtype is None:
                out(f"transformers has no {precision} weights: skipped")
                continue
            from kwker.models.loader import load_model

            model, _ = load_model(model_spec, dtype=torch.float32)
            engines.append(TransformersEngine(model, dtype, threads))
        elif peer in LLAMA_CPP:
            engines += llama_cpp_engines(model_spec, precision, threads, n_ctx, out, source_only)
        else:
            raise ValueError(f"unknown peer {peer!r} (transformers, llama.cpp)")
    return engines


def llama_cpp_engines(model_spec, precision, threads, n_ctx, out, source_only=False) -> list:
    """llama.cpp on the GGUFs of these weights that match `precision`: those written in its peer
    formats, the source file when the precision keeps its matrices exactly, and llama.cpp's own
    quantizer's."""
    from kwker.models.loader import source_gguf

    src = source_gguf(model_spec)
    if src is None:
        out("llama.cpp: no GGUF of these weights to convert from: skipped")
        return []
    spec = PRECISIONS[precision]
    if not spec.gguf:
        out(f"llama.cpp: no GGUF format matches {precision}: skipped")
        return []
    types = gguf_matrix_types(src)
    if source_only:
        runs = [(src, f"{'+'.join(sorted(types))} (source file)")]
    else:
        runs = [(peer_gguf(src, fmt), fmt) for fmt in spec.gguf]
        if types <= spec.gguf_kept:
            runs.append((src, f"{'+'.join(sorted(types))} (source file)"))
    if cpu_has_amx():
        out(f"llama.cpp runs {AMX_NOTE}")
    try:
        for fmt in () if source_only else spec.llama_quantize:
            path = recipe_gguf(src, fmt, threads)
            runs.append(
                (path, f"{'+'.join(sorted(gguf_matrix_types(path)))} (llama-quantize {fmt})")
            )
        return [LlamaCppEngine(path, threads, n_ctx, fmt) for path, fmt in runs]
    except ImportError:
        out(f"{LLAMA_CPP_MISSING}: skipped")
        return []


def llama_lookup_peer(model_spec, precision, threads, out) -> LlamaCppLookup | None:
    """llama.cpp's prompt lookup on the first peer format of `precision`, or None (said why on
    `out`)."""
    from kwker.models.loader import source_gguf

    src = source_gguf(model_spec)
    if src is None:
        return None
    formats = PRECISIONS[precision].gguf
    if not formats:
        out(f"llama.cpp: no GGUF format matches {precision}: its prompt lookup skipped")
        return None
    gguf_path = peer_gguf(src, formats[0])
    if cpu_has_amx():
        out(f"llama.cpp's prompt lookup runs {AMX_NOTE}")
    try:
        return LlamaCppLookup(gguf_path, formats[0], threads)
    except ImportError:
        out(f"{LLAMA_CPP_MISSING}: its prompt lookup skipped")
        return None


def gguf_matrix_types(path) -> set[str]:
    """The storage types of a GGUF's matrices (F32 norms and biases left out)."""
    import gguf

    return {t.tensor_type.name for t in gguf.GGUFReader(path).tensors if len(t.shape) >= 2}


def gguf_matrix_bytes(path) -> int:
    """Bytes of matrices one generated token reads: every matrix but the embedding, whose one row is
    looked up, unless it is tied to the output."""
    import gguf

    tensors = gguf.GGUFReader(path).tensors
    total = sum(
        int(t.n_bytes) for t in tensors if len(t.shape) >= 2 and t.name != "token_embd.weight"
    )
    if not any(
        t.name == "output.weight" for t in tensors
    ):  # tied: the embedding is the output matrix
        total += next(int(t.n_bytes) for t in tensors if t.name == "token_embd.weight")
    return total


def peer_gguf(src: Path, fmt: str) -> Path:
    """The GGUF of the same weights in llama.cpp format fmt, written beside the source once."""
    from kwker.models.gguf_tools import requantize

    return requantize(src, src.with_name(f"{src.stem}.{fmt}.gguf"), fmt)


def recipe_gguf(src: Path, fmt: str, threads: int) -> Path:
    """The GGUF llama.cpp's quantizer writes from src for fmt, beside the source once."""
    from kwker.models.gguf_tools import llama_quantize

    return llama_quantize(src, src.with_name(f"{src.stem}.llama-quantize-{fmt}.gguf"), fmt, threads)
