"""Choosing the next token: Hugging Face's logits processors and warpers, in the order transformers applies them,
and a sampler that draws ONE uniform number per output position.

Why one number per position: the token at position i is then a pure function of (the model's distribution at i,
u_i). Speculative decoding computes the same distribution at i whether or not a proposal was made (the kernels
are batch-invariant), so a proposed token is kept iff it equals that sample, and the text for a seed does not
depend on lookup or drafts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


@dataclass
class SamplingParams:
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_new_tokens: int = 0
    eos_token_ids: list[int] = field(default_factory=list)

    def validate(self) -> None:
        if self.temperature is not None and not self.temperature > 0:
            raise ValueError(f"temperature must be a positive number, got {self.temperature}")
        if self.top_k is not None and (not isinstance(self.top_k, int) or self.top_k < 0):
            raise ValueError(f"top_k must be a non-negative integer, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.min_p is not None and not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.repetition_penalty is not None and not self.repetition_penalty > 0:
            raise ValueError(f"repetition_penalty must be a positive number, got {self.repetition_penalty}")
        if not isinstance(self.min_new_tokens, int) or self.min_new_tokens < 0:
            raise ValueError(f"min_new_tokens must be a non-negative integer, got {self.min_new_tokens}")

    def processors(self, prompt_len: int) -> LogitsProcessorList:
        """The processors transformers' generate() would build for these options, in its order."""
        procs = LogitsProcessorList()
        if self.repetition_penalty is not None and self.repetition_penalty != 1.0:
            procs.append(RepetitionPenaltyLogitsProcessor(self.repetition_penalty))
        if self.min_new_tokens > 0 and self.eos_token_ids:
            procs.append(MinNewTokens(prompt_len, self.min_new_tokens, torch.tensor(self.eos_token_ids)))
        if self.do_sample:
            if self.temperature is not None and self.temperature != 1.0:
                procs.append(TemperatureLogitsWarper(self.temperature))
            if self.top_k is not None and self.top_k != 0:
                procs.append(TopKLogitsWarper(top_k=self.top_k))
            if self.top_p is not None and self.top_p < 1.0:
                procs.append(TopP(top_p=self.top_p))
            if self.min_p is not None:
                procs.append(MinPLogitsWarper(min_p=self.min_p))
        return procs


class MinNewTokens(MinNewTokensLengthLogitsProcessor):
    """transformers' rule (eos tokens at -inf until min_new_tokens are out), writing the few eos entries instead of
    building a vocabulary-sized mask every token (0.4 ms per token on a 49k vocabulary, more than a small model's
    whole step costs in Python), and touching nothing once the minimum is reached."""

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if input_ids.shape[-1] - self.prompt_length_to_skip >= self.min_new_tokens:
            return scores
        out = scores.clone()
        out[:, self.eos_token_id[(self.eos_token_id >= 0) & (self.eos_token_id < scores.shape[-1])]] = -math.inf
        return out


class TopP(TopPLogitsWarper):
    """transformers' top-p rule (keep a token iff the probability of the tokens ranked above it is below top_p;
    at least one token), found among the 256 most likely tokens when they already hold top_p of the mass, which
    is nearly always: a full sort of a 50k-250k vocabulary per token costs more than the model step of a small
    model. Falls back to transformers' own full sort otherwise."""

    CANDIDATES = 256

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[-1] <= self.CANDIDATES:
            return super().__call__(input_ids, scores)
        probs = scores.softmax(dim=-1)
        top, idx = probs.topk(self.CANDIDATES, dim=-1)  # descending
        cumulative = top.cumsum(dim=-1)
        if not bool((cumulative[:, -1] >= self.top_p).all()):
            return super().__call__(input_ids, scores)
        keep = cumulative - top < self.top_p  # the mass ranked above each candidate is below top_p
        keep[:, : self.min_tokens_to_keep] = True
        out = torch.full_like(scores, self.filter_value)
        return out.scatter(-1, idx, torch.where(keep, scores.gather(-1, idx), self.filter_value))


class Sampler:
    """Turns a row of logits into a token. `needs_logits` is False when the native argmax is the answer."""

    def __init__(self, params: SamplingParams, prompt_len: int, generator: torch.Generator | None):
        params.validate()
        self.params = params
        self.processors = params.processors(prompt_len)
        self.generator = generator
        self.needs_logits = params.do_sample or len(self.processors) > 0

    def draw(self) -> float:
        """The uniform number for the next output position (one per position, whatever is speculated)."""
        return float(torch.rand((), generator=self.generator, dtype=torch.float64))

    def choose(self, logits: torch.Tensor, context: torch.Tensor, u: float | None) -> int:
        """logits: (vocab,) float32; context: (1, L) int64, prompt + tokens before this position."""
        scores = self.processors(context, logits[None].float())[0] if len(self.processors) else logits
        if not self.params.do_sample:
            return int(torch.argmax(scores))
        probs = torch.softmax(scores.float(), dim=-1).double()
        return sample_inverse_cdf(probs, u)


def sample_inverse_cdf(probs: torch.Tensor, u: float) -> int:
    """The token whose cumulative-probability interval holds u * total: token i with probability probs[i]."""
    cdf = torch.cumsum(probs, dim=0)
    target = torch.tensor([u * float(cdf[-1])], dtype=cdf.dtype)
    idx = int(torch.searchsorted(cdf, target, right=True))
    if idx >= len(probs) or probs[idx] == 0:  # u * total rounded onto the end: the last possible token
        idx = int(torch.nonzero(probs)[-1])
    return idx
