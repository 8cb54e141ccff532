"""KwkDecoder: a Hugging Face causal LM's whole decoding step as one native call.

    dec = KwkDecoder(model, max_cache_len=256)
    out = dec.generate(torch.tensor([[1, 5, 7, 9]]), max_new_tokens=8)   # greedy: prompt + 8 tokens

Weights are copied once, at construction, into native buffers in the chosen precision; after that the decoder
needs only the model's config (the float model can be freed). The KV cache is preallocated to max_cache_len and
reused between calls whose prompt extends the previous text, so a chat turn reads only its new tokens.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from kwker import _native
from kwker.cpu_backend import best_isa, decoder_available
from kwker.families import family_for, supported_model_types
from kwker.sampling import Sampler, SamplingParams
from kwker.streaming import GenerationChunk, GenerationStats, StreamingDetokenizer

PRECISIONS = {None: None, "fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
              "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
WTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}
DEFAULT_STEP_TOKENS = 256  # tokens per native step in prefill (longer prompts go in chunks of this)
DEFAULT_LOGIT_ROWS = 64  # rows of logits one step can return


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def runner_unsupported(model, max_cache_len: int) -> str | None:
    """None when KwkDecoder can run `model` with a cache of max_cache_len tokens, else the reason it can't."""
    if not isinstance(max_cache_len, int) or isinstance(max_cache_len, bool) or max_cache_len < 1:
        return f"max_cache_len must be a positive integer, got {max_cache_len!r}"
    family = family_for(model)
    if family is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return (f"model type {model_type!r} ({type(model).__name__}) is not supported natively; supported: "
                f"{', '.join(supported_model_types())}")
    return family.unsupported(model, max_cache_len)


def _to_native_array(t: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    t = t.detach().to(dtype).contiguous()
    if dtype == torch.float32:
        return t.numpy()
    return t.view(torch.int16).numpy().view(np.uint16)


class KwkDecoder:
    def __init__(self, model, max_cache_len: int, precision: str | None = None, threads: int | None = None,
                 max_batch: int = 1, max_step_tokens: int = DEFAULT_STEP_TOKENS):
        reason = runner_unsupported(model, max_cache_len)
        if reason is not None:
            raise ValueError(f"KwkDecoder cannot run {type(model).__name__}: {reason}")
        if not decoder_available():
            raise RuntimeError(f"this CPU has no supported SIMD kernels (best: {_native.isa_best()}); "
                               "KwkDecoder needs AVX2+FMA+F16C or AVX-512")
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of None, 'fp32', 'bf16', 'fp16', got {precision!r}")
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        family = family_for(model)
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        self.max_cache_len = max_cache_len
        self.max_batch = max_batch
        self.dtype = PRECISIONS[precision] or model.model.embed_tokens.weight.dtype
        self.precision = precision
        self.vocab_size = model.config.vocab_size

        cfg = family.native_config(model)
        cfg["wtype"] = WTYPES[self.dtype]
        cos, sin = family.rope_tables(model, max_cache_len)
        self._native = _native.Model(cfg, cos.numpy(), sin.numpy(), max_cache_len, max_batch,
                                     min(max_step_tokens, max_cache_len), threads or default_threads(),
                                     best_isa())
        self._logit_rows = min(DEFAULT_LOGIT_ROWS, self._native.max_step_tokens)
        with torch.no_grad():
            for name, w, bias in family.weights(model):
                if w.dim() == 1:
                    self._native.set_norm(name, w.detach().float().numpy())
                else:
                    self._native.set_matrix(name, _to_native_array(w, self.dtype), WTYPES[self.dtype],
                                            None if bias is None else bias.numpy())
        self._native.check_complete()
        self._cached: list[list[int]] = [[] for _ in range(max_batch)]  # tokens whose K/V each slot holds
        self.last_stats: GenerationStats | None = None

    # ----------------------------------------------------------------------------------------------- info
    @property
    def isa(self) -> str:
        return self._native.isa

    @property
    def threads(self) -> int:
        return self._native.threads

    @property
    def weight_bytes_per_token(self) -> int:
        return self._native.weight_bytes_per_token

    def reset(self) -> None:
        """Forget the cached text: the next call prefills its whole prompt."""
        self._cached = [[] for _ in range(self.max_batch)]

    # ---------------------------------------------------------------------------------------- native step
    def _run(self, tokens: Sequence[int], start: int, slot: int = 0, logits: str = "last"):
        """Runs tokens at positions start.. of `slot` (in chunks of the step size) and returns (argmax, logits)
        for the rows `logits` asks for: "last", "all" or "none" (argmax of the last row only)."""
        n = len(tokens)
        if start > len(self._cached[slot]):
            raise ValueError(f"position {start} is past the {len(self._cached[slot])} cached tokens")
        self._cached[slot] = self._cached[slot][:start]  # what stays valid if this call fails midway
        step = self._native.max_step_tokens
        argmax_rows, logit_rows = [], []
        pos = start
        i = 0
        while i < n:
            size = min(step, n - i, self._logit_rows if logits == "all" else step)
            chunk = np.asarray(tokens[i:i + size], dtype=np.int32)
            positions = np.arange(pos, pos + size, dtype=np.int32)
            slots = np.full(size, slot, dtype=np.int32)
            last = i + size == n
            rows = np.arange(size, dtype=np.int32) if logits == "all" else np.array([size - 1] if last else [],
                                                                                     dtype=np.int32)
            if len(rows) == 0:  # an inner prefill chunk: only the cache matters; compute one cheap row
                rows = np.array([size - 1], dtype=np.int32)
            am = self._native.step(chunk, slots, positions, rows)
            if logits == "all" or last:
                argmax_rows.extend(am.tolist() if logits == "all" else am[-1:].tolist())
                if logits != "none":
                    lg = torch.from_numpy(self._native.logits(len(rows)).copy())
                    logit_rows.append(lg if logits == "all" else lg[-1:])
            self._cached[slot].extend(tokens[i:i + size])
            pos += size
            i += size
        return argmax_rows, (torch.cat(logit_rows) if logit_rows else None)

    @torch.no_grad()
    def forward(self, input_ids, start: int = 0, logits: str = "all") -> torch.Tensor:
        """Logits float32 of input_ids placed at positions start.. of the cached text (start=0: a fresh
        sequence): (T, vocab) for logits="all", (1, vocab) for "last". Tokens before `start` must be the ones
        already cached."""
        if logits not in ("all", "last"):
            raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
        ids = self._check_ids(input_ids)
        if start + len(ids) > self.max_cache_len:
            raise ValueError(f"{start} + {len(ids)} tokens exceed max_cache_len {self.max_cache_len}")
        return self._run(ids, start, logits=logits)[1]

    # ------------------------------------------------------------------------------------------ generation
    def _check_ids(self, input_ids) -> list[int]:
        if isinstance(input_ids, torch.Tensor):
            if input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool or input_ids.is_complex():
                raise TypeError(f"input_ids must be an integer tensor, got {input_ids.dtype}")
            if input_ids.dim() == 2:
                if input_ids.shape[0] != 1:
                    raise ValueError(f"generate takes one sequence (input_ids of shape (1, T)), got shape "
                                     f"{tuple(input_ids.shape)}; use generate_batch for several")
                input_ids = input_ids[0]
            elif input_ids.dim() != 1:
                raise ValueError(f"input_ids must have shape (1, T) or (T,), got {tuple(input_ids.shape)}")
            ids = input_ids.tolist()
        elif isinstance(input_ids, (list, tuple)):
            ids = list(input_ids)
            if ids and isinstance(ids[0], (list, tuple)):
                if len(ids) != 1:
                    raise ValueError("generate takes one sequence; use generate_batch for several")
                ids = list(ids[0])
            if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in ids):
                raise TypeError("input_ids must contain integer token ids")
            ids = [int(t) for t in ids]
        else:
            raise TypeError(f"input_ids must be a torch tensor or a list of token ids, got {type(input_ids).__name__}")
        if not ids:
            raise ValueError("input_ids is empty: the prompt needs at least one token")
        bad = [t for t in ids if not 0 <= t < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {self.vocab_size})")
        return ids

    def _default(self, name, value):
        if value is not None or self.generation_config is None:
            return value
        return getattr(self.generation_config, name, None)

    def _eos_ids(self, eos_token_id) -> list[int]:
        if eos_token_id is None:
            eos_token_id = self._default("eos_token_id", None)
            if eos_token_id is None:
                eos_token_id = getattr(self.config, "eos_token_id", None)
        if eos_token_id is None:
            return []
        return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]

    def stream_generate(self, input_ids, max_new_tokens: int = 20, *, do_sample: bool = False,
                        temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                        min_p: float | None = None, repetition_penalty: float | None = None,
                        min_new_tokens: int = 0, eos_token_id: int | list[int] | None = None,
                        generator: torch.Generator | None = None, tokenizer=None) -> Iterator[GenerationChunk]:
        """Yields one GenerationChunk per new token. Closing the generator stops generation; the KV cache keeps
        everything computed so far, so the next call continues from it."""
        prompt = self._check_ids(input_ids)
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if len(prompt) + max_new_tokens > self.max_cache_len:
            raise ValueError(f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} = "
                             f"{len(prompt) + max_new_tokens} tokens exceeds max_cache_len {self.max_cache_len}")
        params = SamplingParams(
            do_sample=bool(do_sample),
            temperature=self._default("temperature", temperature) if do_sample else None,
            top_k=self._default("top_k", top_k) if do_sample else None,
            top_p=self._default("top_p", top_p) if do_sample else None,
            min_p=self._default("min_p", min_p) if do_sample else None,
            repetition_penalty=repetition_penalty,
            min_new_tokens=min_new_tokens,
            eos_token_ids=self._eos_ids(eos_token_id),
        )
        sampler = Sampler(params, len(prompt), generator)  # validates the options
        return self._generate_tokens(prompt, max_new_tokens, sampler, tokenizer)

    def _generate_tokens(self, prompt: list[int], max_new_tokens: int, sampler: Sampler,
                         tokenizer) -> Iterator[GenerationChunk]:
        stats = GenerationStats(prompt_tokens=len(prompt))
        self.last_stats = stats
        detok = StreamingDetokenizer(tokenizer) if tokenizer is not None else None
        eos = set(sampler.params.eos_token_ids)

        cached = self._cached[0]
        reuse = 0
        limit = min(len(cached), len(prompt) - 1)  # the last prompt token is always run: its logits are needed
        while reuse < limit and cached[reuse] == prompt[reuse]:
            reuse += 1
        stats.reused_prompt_tokens = reuse
        t0 = time.perf_counter()
        want = "last" if sampler.needs_logits else "none"
        argmax, logits = self._run(prompt[reuse:], reuse, logits=want)
        tokens = list(prompt)
        context = torch.tensor([tokens])
        tok = argmax[-1] if not sampler.needs_logits else sampler.choose(logits[-1], context, self._draw(sampler))
        stats.prefill_s = time.perf_counter() - t0

        for i in range(max_new_tokens):
            tokens.append(tok)
            stats.new_tokens += 1
            finish = "eos" if tok in eos else ("length" if i == max_new_tokens - 1 else None)
            text = detok.add(tok) if detok else ""
            if finish and detok:
                text += detok.flush()
            yield GenerationChunk(token=tok, text=text, stats=stats, finish_reason=finish)
            if finish:
                return
            t1 = time.perf_counter()
            argmax, logits = self._run([tok], len(tokens) - 1, logits=want)
            if sampler.needs_logits:
                context = torch.tensor([tokens])
                tok = sampler.choose(logits[-1], context, self._draw(sampler))
            else:
                tok = argmax[-1]
            stats.steps += 1
            stats.decode_s += time.perf_counter() - t1

    @staticmethod
    def _draw(sampler: Sampler) -> float | None:
        return sampler.draw() if sampler.params.do_sample else None

    def generate(self, input_ids, max_new_tokens: int = 20, **kwargs) -> torch.Tensor:
        """Prompt + new tokens, shape (1, T + n), like transformers' generate. Greedy unless do_sample=True."""
        prompt = self._check_ids(input_ids)
        new = [c.token for c in self.stream_generate(prompt, max_new_tokens, **kwargs)]
        return torch.tensor([prompt + new], dtype=torch.long)


from kwker.hf_generate import install, uninstall  # noqa: E402  (re-exported: the spec imports them from here)

__all__ = ["KwkDecoder", "install", "runner_unsupported", "uninstall"]
