"""StepDecoder: the generation API (generate, stream_generate, generate_batch, forward) over a step.

A decoder is a step plus the model's config: FileDecoder (kwker.loading.load, behind kwker.load)
packs a model's files into the native step, KwkDecoder (kwker.hf.decoder) a transformers model's
weights, and CompiledDecoder (kwker.hf.compiled) runs the model's own forward compiled ahead of
time; all are StepDecoders over a Runner, which owns the step and what each slot of its cache
holds. Calls on one decoder from several threads take turns: a generation holds the runner from
its first step to its last (see Runner.hold).

torch is optional: the module never imports it unless a result is to be a torch tensor. Results
are torch tensors when the decoder's `returns` is "torch" (KwkDecoder and CompiledDecoder, built
from a torch model) or when the prompt came as a tensor; else numpy arrays (a decoder built from
model files without torch sets returns="numpy").
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from kwker.runner import Runner
from kwker.sampling import Sampler, SamplingParams, SeededGenerator, is_generator, is_tensor
from kwker.scheduler import DEFAULT_PREFILL_CHUNK, Scheduler
from kwker.sequence import SequenceState
from kwker.speculative import DraftProposer, LookupProposer, Speculator, StepCosts, SuffixCache
from kwker.streaming import GenerationChunk

if TYPE_CHECKING:
    import torch

RETURNS = ("torch", "numpy")


def token_ids(input_ids, vocab_size: int) -> list[int]:
    """One sequence of token ids as a list of ints: a tensor of shape (1, T) or (T,) of int32 or
    int64, a list of ints, or a tokenizer's output holding "input_ids" (what
    apply_chat_template returns). Raises TypeError / ValueError naming what is wrong."""
    if hasattr(input_ids, "keys") and "input_ids" in input_ids.keys():
        input_ids = input_ids["input_ids"]
    if is_tensor(input_ids):
        ids = _tensor_ids(input_ids)
    elif isinstance(input_ids, (list, tuple)):
        ids = _list_ids(input_ids)
    else:
        raise TypeError(
            "input_ids must be a torch tensor or a list of token ids, got "
            f"{type(input_ids).__name__}"
        )
    if not ids:
        raise ValueError("input_ids is empty: the prompt needs at least one token")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ValueError(f"token id {bad[0]} is outside the vocabulary (size {vocab_size})")
    return ids


def _tensor_ids(t: torch.Tensor) -> list[int]:
    import torch  # loaded already: t is a tensor

    if t.dtype not in (torch.int32, torch.int64):  # others are refused, never cast
        raise TypeError(
            "input_ids must be an integer tensor of dtype torch.int32 or torch.int64, "
            f"got {t.dtype}"
        )
    if t.dim() == 2:
        if t.shape[0] != 1:
            raise ValueError(
                f"generate takes one sequence (input_ids of shape (1, T)), got shape "
                f"{tuple(t.shape)}; use generate_batch for several"
            )
        t = t[0]
    elif t.dim() != 1:
        raise ValueError(f"input_ids must have shape (1, T) or (T,), got {tuple(t.shape)}")
    return t.tolist()  # reads any strides: a non-contiguous tensor gives its own values


def _list_ids(ids) -> list[int]:
    ids = list(ids)
    if ids and isinstance(ids[0], (list, tuple)):
        if len(ids) != 1:
            raise ValueError("generate takes one sequence; use generate_batch for several")
        ids = list(ids[0])
    if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool) for t in ids):
        raise TypeError("input_ids must contain integer token ids")
    return [int(t) for t in ids]  # numpy's as Python ints: the vocabulary check sees their value


class StepDecoder:
    def __init__(self, model, step, precision: str, tokenizer=None, returns: str = "torch"):
        """model: the Hugging Face model whose config (and generation_config) this decoder follows;
        step: an object with the native Model's interface (see Runner); returns: "torch" or
        "numpy", what forward and generate return for a prompt that is not a tensor."""
        if returns not in RETURNS:
            raise ValueError(f"returns must be one of {RETURNS}, got {returns!r}")
        self.returns = returns
        self.config = model.config
        self.generation_config = getattr(model, "generation_config", None)
        self.precision = precision
        self.vocab_size = model.config.vocab_size
        self.tokenizer = tokenizer
        self.runner = Runner(step)
        self.max_cache_len = self.runner.max_cache_len
        self.max_batch = self.runner.n_slots
        self._solo_costs = StepCosts()  # measured by the sequences run alone, for their speculation
        # the latest (own, draft's) tokenizers found to share a vocabulary (see check_draft)
        self._same_vocab: tuple | None = None
        self.last_stats = None  # GenerationStats of the latest stream

    # ------------------------------------------------------------------------------------ info
    @property
    def isa(self) -> str:
        return self.runner.isa

    @property
    def threads(self) -> int:
        return self.runner.threads

    @property
    def weight_bytes_per_token(self) -> int:
        return self.runner.weight_bytes_per_token

    def reset(self) -> None:
        """Forget the cached text: the next call prefills its whole prompt."""
        with self.runner.hold():
            self.runner.reset()

    def _torch_results(self, inputs) -> bool:
        """Whether results are torch tensors: for a "torch" decoder, or for any tensor prompt."""
        return self.returns == "torch" or any(is_tensor(x) for x in inputs)

    # --------------------------------------------------------------------------------- forward
    def forward(self, input_ids, start: int = 0, logits: str = "all"):
        """Logits float32 of input_ids placed at positions start.. of the cached text (start=0: a
        fresh sequence): (T, vocab) for logits="all", (1, vocab) for "last". Tokens before `start`
        must be the ones already cached. A torch tensor or a numpy array (see the module's
        docstring); no autograd either way (the native step returns numpy)."""
        if logits not in ("all", "last"):
            raise ValueError(f"logits must be 'all' or 'last', got {logits!r}")
        ids = self.token_ids(input_ids)
        if not isinstance(start, int) or isinstance(start, bool) or start < 0:
            raise ValueError(f"start must be a non-negative integer, got {start!r}")
        if start + len(ids) > self.max_cache_len:
            raise ValueError(
                f"{start} + {len(ids)} tokens exceed max_cache_len {self.max_cache_len}"
            )
        runner = self.runner
        with runner.hold():
            slot = runner.acquire(0)
            try:
                held = runner.cached_len(slot)
                if start > held:
                    raise ValueError(f"position {start} is past the {held} cached tokens")
                runner.trim(slot, held - start)
                out = runner.extend_slot(slot, start, ids, rows=logits).logits
            finally:
                runner.release(slot)
        if self._torch_results([input_ids]):
            import torch

            return torch.from_numpy(out)
        return out

    # ------------------------------------------------------------------------------ generation
    def token_ids(self, input_ids) -> list[int]:
        """The prompt as a list of ints (TypeError / ValueError on bad input; see token_ids)."""
        return token_ids(input_ids, self.vocab_size)

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
        if isinstance(eos_token_id, int):
            return [int(eos_token_id)]
        return [int(t) for t in eos_token_id]

    def stream_generate(
        self, input_ids, max_new_tokens: int = 20, *, tokenizer=None, **options
    ) -> Iterator[GenerationChunk]:
        """Yields one GenerationChunk per new token. Closing the generator stops generation; the
        KV cache keeps everything verified so far, so the next call continues from it. From its
        first step to its end (or close) the stream holds the decoder: other threads' calls wait.

        Options: do_sample, temperature, top_k, top_p, min_p, repetition_penalty, min_new_tokens,
        eos_token_id, generator (transformers' meanings); presence_penalty, frequency_penalty
        (OpenAI's); logprobs=K gives each chunk its token's log-probability and the K likeliest
        tokens' (see GenerationChunk); lookup=N proposes up to N tokens per
        step by prompt lookup (default 8, 0 turns it off; after a match of 16 tokens or more, up
        to 3N: Speculator.LONG_MATCH, LONG_LOOKUP); draft= a KwkDecoder of a small model
        with the same tokenizer proposes too: each step takes the source that expects more tokens
        per unit of time (the draft where lookup finds nothing). Neither changes the output."""
        seq = self.new_sequence(
            self.token_ids(input_ids),
            max_new_tokens,
            tokenizer=tokenizer,
            costs=self._solo_costs,
            **options,
        )
        return self._drive(seq)

    def new_sequence(
        self,
        prompt: list[int],
        max_new_tokens: int,
        *,
        do_sample: bool = False,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        min_p: float | None = None,
        repetition_penalty: float | None = None,
        presence_penalty: float | None = None,
        frequency_penalty: float | None = None,
        min_new_tokens: int = 0,
        eos_token_id: int | list[int] | None = None,
        generator: SeededGenerator | torch.Generator | None = None,
        lookup: int = 8,
        draft: StepDecoder | None = None,
        tokenizer=None,
        costs: StepCosts | None = None,
        logprobs: int | None = None,
        corpus: SuffixCache | None = None,
        tree: bool = False,
        json_schema: dict | str | None = None,
        json_object: bool = False,
        grammar: str | None = None,
        tools: list[dict] | None = None,
        tool_choice: str | dict = "auto",
        parallel_tool_calls: bool = True,
    ) -> SequenceState:
        """A validated sequence to generate (raises ValueError/TypeError on bad options). costs:
        what earlier sequences measured, shared with this one's speculation (see StepCosts);
        corpus: earlier texts that prompt lookup also copies from (a server's requests).
        json_schema / json_object / grammar (Lark): the answer follows it, token by token (see
        kwker.constrained; a ConstraintError, a ValueError, names what cannot be compiled).
        tools (OpenAI's), tool_choice ("auto", "required", "none" or {"type": "function",
        "function": {"name": ...}}), parallel_tool_calls: a call's arguments follow its tool's
        schema (see kwker.tools; the prompt must carry the tools: kwker.tools.chat_prompt)."""
        if (
            not isinstance(max_new_tokens, int)
            or isinstance(max_new_tokens, bool)
            or max_new_tokens < 1
        ):
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        total = len(prompt) + max_new_tokens
        if total > self.max_cache_len:
            raise ValueError(
                f"prompt of {len(prompt)} tokens + max_new_tokens {max_new_tokens} = "
                f"{total} tokens exceeds max_cache_len {self.max_cache_len}"
            )
        if not isinstance(lookup, int) or isinstance(lookup, bool) or lookup < 0:
            raise ValueError(f"lookup must be a non-negative integer, got {lookup!r}")
        if draft is not None:
            self.check_draft(draft)
        if logprobs is not None and (
            not isinstance(logprobs, int) or isinstance(logprobs, bool) or logprobs < 0
        ):
            raise ValueError(f"logprobs must be None or a non-negative integer, got {logprobs!r}")
        params = SamplingParams(
            do_sample=bool(do_sample),
            temperature=self._default("temperature", temperature) if do_sample else None,
            top_k=self._default("top_k", top_k) if do_sample else None,
            top_p=self._default("top_p", top_p) if do_sample else None,
            min_p=self._default("min_p", min_p) if do_sample else None,
            repetition_penalty=repetition_penalty,
            presence_penalty=presence_penalty,
            frequency_penalty=frequency_penalty,
            min_new_tokens=min_new_tokens,
            eos_token_ids=self._eos_ids(eos_token_id),
        )
        sampler = Sampler(params, len(prompt), generator)  # validates the options
        spec = Speculator(
            LookupProposer(corpus=corpus) if lookup > 0 else None,
            DraftProposer(draft) if draft is not None else None,
            lookup_max=max(lookup, 1),
            costs=costs,
            tree=bool(tree),
        )
        constraint = None
        if json_schema is not None or json_object or grammar is not None:
            from kwker.constrained import Constraint, grammar_of

            tok = tokenizer if tokenizer is not None else self.tokenizer
            if tok is None:
                raise ValueError("a constrained answer needs the model's tokenizer")
            rules = grammar_of(json_schema, json_object, grammar)
            what = "grammar" if grammar is not None else "JSON schema"
            constraint = Constraint(rules, tok, self.vocab_size, params.eos_token_ids, what)
        if tools:
            from kwker.tools import require_format, tool_constraint

            tok = tokenizer if tokenizer is not None else self.tokenizer
            if tok is None:
                raise ValueError("an answer with tools needs the model's tokenizer")
            if constraint is not None:
                raise ValueError("give tools or a response format / grammar, not both")
            constraint = tool_constraint(
                require_format(tok), tools, tok, self.vocab_size, params.eos_token_ids,
                tool_choice, parallel_tool_calls,
            )  # fmt: skip
        return SequenceState(prompt, max_new_tokens, sampler, spec, tokenizer, logprobs, constraint)

    def check_draft(self, draft: StepDecoder) -> None:
        """A draft must speak the target's tokenizer: the same vocabulary size and special tokens
        (and the same vocabulary, when both decoders were given their tokenizer)."""
        if not isinstance(draft, StepDecoder):
            raise TypeError(f"draft must be a KwkDecoder, got {type(draft).__name__}")
        if draft is self:
            raise ValueError(
                "a decoder cannot draft for itself (its one cache holds the text "
                "being verified); use a second decoder of the same model"
            )
        problems = []
        if self.vocab_size != draft.vocab_size:
            problems.append(f"vocabulary sizes differ ({self.vocab_size} vs {draft.vocab_size})")
        for attr in ("bos_token_id", "eos_token_id"):
            mine, theirs = getattr(self.config, attr, None), getattr(draft.config, attr, None)
            if mine != theirs:
                problems.append(f"{attr} differs ({mine} vs {theirs})")
        if self.tokenizer is not None and draft.tokenizer is not None:
            # get_vocab builds a dict of the whole vocabulary: 0.2 s for Qwen2.5's 151k tokens, on
            # every call with a draft, before its prefill; a pair found equal is not compared again
            known = self._same_vocab
            if not (known and known[0] is self.tokenizer and known[1] is draft.tokenizer):
                if self.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
                    problems.append("the tokenizers' vocabularies differ")
                else:
                    self._same_vocab = (self.tokenizer, draft.tokenizer)
        if problems:
            raise ValueError(
                "the draft model does not share the target's tokenizer: " + "; ".join(problems)
            )

    def _drive(self, seq: SequenceState) -> Iterator[GenerationChunk]:
        """Runs one sequence in slot 0 (whose cache keeps the previous call's text, for reuse) to
        its end, through the same scheduler as batches: the prompt in chunks of the step size, then
        propose -> one native step -> accept -> rollback -> emit. Holds the runner throughout;
        closing the generator lets it go."""
        with self.runner.hold():
            scheduler = Scheduler(self.runner, prefill_chunk=self.runner.max_step_tokens)
            scheduler.admit(seq, slot=0)
            self.last_stats = seq.stats
            try:
                while scheduler.active:
                    for _, chunks in scheduler.step():
                        yield from chunks
                    if seq.error is not None:
                        raise seq.error
            finally:
                scheduler.close()

    def generate_batch(
        self,
        prompts,
        max_new_tokens: int = 20,
        *,
        generator=None,
        tokenizer=None,
        prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
        **options,
    ) -> list:
        """Several prompts decoded together, up to max_batch per step; each gets exactly the tokens
        it gets alone. Returns a list of 1-D int64 tensors (numpy arrays: see the module's
        docstring) of prompt + new tokens, in the prompts' order. Options as for generate; for
        sampling, generator= takes a list with one generator per prompt."""
        if is_tensor(prompts) and prompts.dim() == 2:
            prompts = list(prompts)
        prompts = list(prompts)
        as_torch = self._torch_results(prompts)  # a 2-D tensor's rows are tensors
        prompts = [self.token_ids(p) for p in prompts]
        if is_generator(generator) and len(prompts) > 1:
            raise ValueError(
                "pass one generator per prompt (a list), so that each sequence "
                "samples what it would alone"
            )
        if isinstance(generator, (list, tuple)):
            generators = list(generator)
        else:
            generators = [generator] * len(prompts)
        if len(generators) != len(prompts):
            raise ValueError(f"{len(generators)} generators for {len(prompts)} prompts")
        seqs = [
            self.new_sequence(p, max_new_tokens, generator=g, tokenizer=tokenizer, **options)
            for p, g in zip(prompts, generators, strict=True)
        ]
        with self.runner.hold():
            Scheduler(self.runner, prefill_chunk).run(seqs)
        if as_torch:
            import torch

            return [torch.tensor(seq.tokens, dtype=torch.long) for seq in seqs]
        return [np.array(seq.tokens, dtype=np.int64) for seq in seqs]

    def generate(self, input_ids, max_new_tokens: int = 20, **kwargs):
        """Prompt + new tokens, shape (1, T + n) int64, like transformers' generate: a torch tensor
        or a numpy array (see the module's docstring). Greedy unless do_sample=True."""
        prompt = self.token_ids(input_ids)
        new = [c.token for c in self.stream_generate(prompt, max_new_tokens, **kwargs)]
        if self._torch_results([input_ids]):
            import torch

            return torch.tensor([prompt + new], dtype=torch.long)
        return np.array([prompt + new], dtype=np.int64)
