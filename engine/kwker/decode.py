"""KwkDecoder: a Hugging Face causal LM's whole decoding step as one native call.

    dec = KwkDecoder(model, max_cache_len=256)
    out = dec.generate(torch.tensor([[1, 5, 7, 9]]), max_new_tokens=8)   # greedy: prompt + 8 tokens

Weights are copied once, at construction, into native buffers in the chosen precision; after that the decoder
needs only the model's config (the float model can be freed). The KV cache is preallocated to max_cache_len and
reused between calls whose prompt extends the previous text, so a chat turn reads only its new tokens.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator, Sequence

import numpy as np
import torch

from kwker import _native
from kwker.cpu_backend import best_isa, decoder_available
from kwker.families import family_for, supported_model_types
from kwker.precision import FORMATS, PRECISIONS, checked, own_precision
from kwker.batch import BatchRunner, generate_batch
from kwker.sampling import Sampler, SamplingParams
from kwker.sequence import SequenceState
from kwker.speculative import DraftProposer, LookupProposer, Speculator, StepCosts
from kwker.streaming import GenerationChunk

# The KV cache's element type: kv_cache="fp16" halves its memory and the bytes attention reads per token (at 2000
# tokens of context SmolLM2's float32 cache is as many bytes as its int4 weights); "fp32" keeps keys and values
# exact. By default fp16, except at precision fp32, which matches transformers' float32 attention.
KV_CACHE_TYPES = ("fp32", "fp16")
DEFAULT_STEP_TOKENS = 256  # tokens per native step in prefill (longer prompts go in chunks of this)
DEFAULT_LOGIT_ROWS = 64  # rows of logits one step can return


def default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def trim_memory() -> None:
    """Returns the C heap's free pages to the system (glibc's malloc_trim; elsewhere nothing). Call it once the
    float model has been let go: the blocks it freed sit in the middle of the heap and would otherwise stay
    resident (SmolLM2-135M int4, steady RSS of a fresh process in the test install: 527 -> 503 MB)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c")) if os.name == "posix" else None
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


def runner_unsupported(model, max_cache_len: int) -> str | None:
    """None when KwkDecoder can run `model` with a cache of max_cache_len tokens, else the reason it can't."""
    if not isinstance(max_cache_len, int) or isinstance(max_cache_len, bool) or max_cache_len < 1:
        return f"max_cache_len must be a positive integer, got {max_cache_len!r}"
    family = family_for(model)
    if family is None:
        model_type = getattr(getattr(model, "config", None), "model_type", None)
        return (f"model type {model_type!r} ({type(model).__name__}) is not supported natively (supported: "
                f"{', '.join(supported_model_types())}); kwker.compiled.Decoder runs any causal LM")
    return family.unsupported(model, max_cache_len)


def _to_native_array(t: torch.Tensor, fmt: str) -> np.ndarray:
    """The array the native loader takes for format fmt: float32 (F32, and Q8/Q4, which it quantizes itself) or
    the uint16 bits of bf16 / fp16."""
    dtype = getattr(torch, FORMATS[fmt].array)
    t = t.detach().to(dtype).contiguous()
    if dtype == torch.float32:
        return t.numpy()
    return t.view(torch.int16).numpy().view(np.uint16)


class KwkDecoder:
    def __init__(self, model, max_cache_len: int, precision: str | None = None, threads: int | None = None,
                 max_batch: int = 1, max_step_tokens: int = DEFAULT_STEP_TOKENS, tokenizer=None,
                 kv_cache: str | None = None):
        reason = runner_unsupported(model, max_cache_len)
        if reason is not None:
            raise ValueError(f"KwkDecoder cannot run {type(model).__name__}: {reason}")
        if not decoder_available():
            raise RuntimeError(f"this CPU has no supported SIMD kernels (best: {_native.isa_best()}); "
                               "KwkDecoder needs AVX2+FMA+F16C or AVX-512")
        precision = checked(precision)
        if threads is not None and (not isinstance(threads, int) or threads < 1):
            raise ValueError(f"threads must be a positive integer, got {threads!r}")
        if kv_cache is not None and kv_cache not in KV_CACHE_TYPES:
            raise ValueError(f"kv_cache must be None, 'fp32' or 'fp16', got {kv_cache!r}")
        if not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch must be a positive integer, got {max_batch!r}")
        family = family_for(model)
        precision = precision or own_precision(model.model.embed_tokens.weight.dtype)
        matrix_fmt, embed_fmt = PRECISIONS[precision].matrices, PRECISIONS[precision].embeddings

        cfg = family.native_config(model)
        cfg["wtype"] = getattr(_native.WType, matrix_fmt)
        self.kv_cache = kv_cache or ("fp32" if precision == "fp32" else "fp16")
        cfg["kv_f16"] = self.kv_cache == "fp16"
        cos, sin = family.rope_tables(model, max_cache_len)
        cfg["rope_dim"] = 2 * cos.shape[-1]  # the table's width: partial rotary models rotate fewer dims
        step = _native.Model(cfg, cos.numpy(), sin.numpy(), max_cache_len, max_batch,
                             min(max_step_tokens, max_cache_len), DEFAULT_LOGIT_ROWS, threads or default_threads(),
                             best_isa())
        with torch.no_grad():
            for name, w, bias in family.weights(model):
                if w.dim() == 1:
                    step.set_norm(name, w.detach().float().numpy())
                else:
                    fmt = embed_fmt if name in ("embed", "lm_head") else matrix_fmt
                    step.set_matrix(name, _to_native_array(w, fmt), getattr(_native.WType, fmt),
                                    None if bias is None else bias.numpy())
        step.check_complete()
        self._attach(model, step, precision, max_batch, tokenizer)

    def _attach(self, model, step, precision: str, max_batch: int, tokenizer) -> None:
        """Takes `step` as this decoder's step: an object with the native Model's interface (step, logits,
        max_cache_len, max_step_tokens, max_out_rows, isa, threads, weight_bytes_per_token)."""
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        self.max_cache_len = step.max_cache_len
        self.max_batch = max_batch
        self.precision = precision
        self.vocab_size = model.config.vocab_size
        self.tokenizer = tokenizer
        self._step = step
        self._logit_rows = step.max_out_rows
        self._cached: list[list[int]] = [[] for _ in range(max_batch)]  # tokens whose K/V each slot holds
        self._solo_costs = StepCosts()  # what the sequences run alone measured, for their speculation
        self.last_stats = None  # GenerationStats of the latest stream

    # ----------------------------------------------------------------------------------------------- info
    @property
    def isa(self) -> str:
        return self._step.isa

    @property
    def threads(self) -> int:
        return self._step.threads

    @property
    def weight_bytes_per_token(self) -> int:
        return self._step.weight_bytes_per_token

    def reset(self) -> None:
        """Forget the cached text: the next call prefills its whole prompt."""
        self._cached = [[] for _ in range(self.max_batch)]

    # ---------------------------------------------------------------------------------------- native step
    def _run(self, tokens: Sequence[int], start: int, slot: int = 0, rows: str = "last",
             copy_logits: bool = True) -> tuple[list[int], torch.Tensor | None]:
        """Runs tokens at positions start.. of `slot` (in chunks of the step size). Returns the argmax and, with
        copy_logits, the float32 logits (R, vocab) of the last row (rows="last") or of every row ("all")."""
        n = len(tokens)
        if start > len(self._cached[slot]):
            raise ValueError(f"position {start} is past the {len(self._cached[slot])} cached tokens")
        del self._cached[slot][start:]  # what stays valid if this call fails midway
        step = self._step.max_step_tokens if rows == "last" else min(self._step.max_step_tokens,
                                                                         self._logit_rows)
        argmax_rows, logit_rows = [], []
        i = 0
        while i < n:
            size = min(step, n - i)
            last = i + size == n
            if rows == "all":
                out_rows = np.arange(size, dtype=np.int32)
            else:  # inner prefill chunks only fill the cache
                out_rows = np.array([size - 1] if last else [], dtype=np.int32)
            am = self._step.step(np.asarray(tokens[i:i + size], dtype=np.int32),
                                   np.full(size, slot, dtype=np.int32),
                                   np.arange(start + i, start + i + size, dtype=np.int32), out_rows)
            if rows == "all" or last:
                argmax_rows.extend(am.tolist())
                if copy_logits:
                    logit_rows.append(torch.from_numpy(self._step.logits(len(out_rows)).copy()))
            self._cached[slot].extend(tokens[i:i + size])
            i += size
        if len(logit_rows) > 1:
            return argmax_rows, torch.cat(logit_rows)
        # one chunk's rows as they are: torch.cat would copy them on torch's OpenMP threads, which then spin on the
        # core the next step's worker needs
        return argmax_rows, (logit_rows[0] if logit_rows else None)

    def _reusable_prefix(self, tokens: list[int], slot: int = 0) -> int:
        """How many leading tokens the cache already holds (never all: the last token's logits are needed)."""
        cached = self._cached[slot]
        limit = min(len(cached), len(tokens) - 1)
        n = 0
        while n < limit and cached[n] == tokens[n]:
            n += 1
        return n

    def greedy_continuation(self, tokens: list[int], k: int) -> list[int]:
        """The k tokens greedy decoding would add to `tokens` (used when this decoder drafts for another)."""
        k = min(k, self.max_cache_len - len(tokens))
        if k <= 0:
            return []
        reuse = self._reusable_prefix(tokens)
        out = [self._run(tokens[reuse:], reuse, copy_logits=False)[0][-1]]
        while len(out) < k:
            out.append(self._run([out[-1]], len(tokens) + len(out) - 1, copy_logits=False)[0][-1])
        return out

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
        return self._run(ids, start, rows=logits)[1]

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

    def stream_generate(self, input_ids, max_new_tokens: int = 20, *, tokenizer=None,
                        **options) -> Iterator[GenerationChunk]:
        """Yields one GenerationChunk per new token. Closing the generator stops generation; the KV cache keeps
        everything verified so far, so the next call continues from it.

        Options: do_sample, temperature, top_k, top_p, min_p, repetition_penalty, min_new_tokens, eos_token_id,
        generator (transformers' meanings); lookup=N proposes up to N tokens per step by prompt lookup (default 8,
        0 turns it off); draft= a KwkDecoder of a small model with the same tokenizer proposes too: each step takes
        the source that expects more tokens per unit of time (the draft where lookup finds nothing). Neither changes
        the output."""
        prompt = self._check_ids(input_ids)
        seq = self.new_sequence(prompt, max_new_tokens, tokenizer=tokenizer, reused=self._reusable_prefix(prompt),
                                costs=self._solo_costs, **options)
        return self._drive(seq)

    def new_sequence(self, prompt: list[int], max_new_tokens: int, *, do_sample: bool = False,
                     temperature: float | None = None, top_k: int | None = None, top_p: float | None = None,
                     min_p: float | None = None, repetition_penalty: float | None = None, min_new_tokens: int = 0,
                     eos_token_id: int | list[int] | None = None, generator: torch.Generator | None = None,
                     lookup: int = 8, draft: KwkDecoder | None = None, tokenizer=None, slot: int = 0,
                     reused: int = 0, costs: StepCosts | None = None) -> SequenceState:
        """A validated sequence to generate (raises ValueError/TypeError on bad options). costs: what earlier
        sequences measured, shared with this one's speculation (see StepCosts)."""
        if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if len(prompt) + max_new_tokens > self.max_cache_len:
            raise ValueError(f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} = "
                             f"{len(prompt) + max_new_tokens} tokens exceeds max_cache_len {self.max_cache_len}")
        if not isinstance(lookup, int) or isinstance(lookup, bool) or lookup < 0:
            raise ValueError(f"lookup must be a non-negative integer, got {lookup!r}")
        if draft is not None:
            self.check_draft(draft)
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
        spec = Speculator(LookupProposer() if lookup > 0 else None,
                          DraftProposer(draft) if draft is not None else None, lookup_max=max(lookup, 1),
                          costs=costs)
        return SequenceState(prompt, max_new_tokens, sampler, spec, tokenizer, slot=slot, reused=reused)

    def check_draft(self, draft: KwkDecoder) -> None:
        """A draft must speak the target's tokenizer: the same vocabulary size and special tokens (and the same
        vocabulary, when both decoders were given their tokenizer)."""
        if not isinstance(draft, KwkDecoder):
            raise TypeError(f"draft must be a KwkDecoder, got {type(draft).__name__}")
        problems = []
        if self.vocab_size != draft.vocab_size:
            problems.append(f"vocabulary sizes differ ({self.vocab_size} vs {draft.vocab_size})")
        for attr in ("bos_token_id", "eos_token_id"):
            mine, theirs = getattr(self.config, attr, None), getattr(draft.config, attr, None)
            if mine != theirs:
                problems.append(f"{attr} differs ({mine} vs {theirs})")
        if self.tokenizer is not None and draft.tokenizer is not None and \
                self.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
            problems.append("the tokenizers' vocabularies differ")
        if problems:
            raise ValueError("the draft model does not share the target's tokenizer: " + "; ".join(problems))

    def _drive(self, seq: SequenceState) -> Iterator[GenerationChunk]:
        """Runs one sequence in slot 0 to its end, through the same runner as batches: the prompt in chunks of the
        step size, then plan -> one native step -> absorb (rollback to the verified tokens) -> emit."""
        self.last_stats = seq.stats
        runner = BatchRunner(self, prefill_chunk=self._step.max_step_tokens)
        while not seq.done:
            for _, chunks in runner.step([seq]):
                yield from chunks

    def generate_batch(self, prompts, max_new_tokens: int = 20, **options) -> list[torch.Tensor]:
        """Several prompts decoded together, up to max_batch per step; each gets exactly the tokens it gets alone.
        Returns a list of 1-D tensors (prompt + new tokens), in the prompts' order. Options as for generate;
        for sampling, generator= takes a list with one generator per prompt."""
        return generate_batch(self, prompts, max_new_tokens, **options)

    def generate(self, input_ids, max_new_tokens: int = 20, **kwargs) -> torch.Tensor:
        """Prompt + new tokens, shape (1, T + n), like transformers' generate. Greedy unless do_sample=True."""
        prompt = self._check_ids(input_ids)
        new = [c.token for c in self.stream_generate(prompt, max_new_tokens, **kwargs)]
        return torch.tensor([prompt + new], dtype=torch.long)


from kwker.hf_generate import install, uninstall  # noqa: E402  (re-exported: the spec imports them from here)

__all__ = ["KwkDecoder", "install", "runner_unsupported", "uninstall"]
