"""Streaming output: the dataclasses `stream_generate` yields, and a detokenizer that never emits half a
UTF-8 character."""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import ClassVar

PLAIN = "plain"  # the key of the 1-token steps (nothing proposed) in GenerationStats.step_times


@dataclass
class GenerationStats:
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # prompt tokens whose KV cache was kept from the previous call
    prefill_s: float = 0.0
    new_tokens: int = 0
    # wall-clock from the first new token to the latest (steps, drafting, Python, consumer)
    decode_s: float = 0.0
    steps: int = 0  # native decode steps after prefill (each verifies its proposals)
    draft_s: float = 0.0  # of decode_s, the time the draft model took
    proposed: dict[str, int] = field(default_factory=dict)  # speculation source -> tokens proposed
    accepted: dict[str, int] = field(default_factory=dict)  # speculation source -> tokens accepted
    # a speculation tree's branches: steps that verified one, and steps whose text went on along
    # it (the chain failed where it starts and its token was the target's)
    branches: int = 0
    branches_taken: int = 0
    # Each decode step's own time, from its plan (proposing, drafting) to the end of its absorb
    # (verifying, emitting), without what the consumer does between chunks; keyed by how the step
    # was fed: (PLAIN, 1) for a 1-token step, (source, 1 + proposed) for a speculative one.
    step_times: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    # The decoder's latest warm 1-token step times before this answer (StepCosts.plain_s, at most
    # PLAIN_REFERENCE). An answer that speculation serves well takes one or two plain steps, often
    # its first, and an answer's first COLD_STEPS decode steps run slower than a steady one (the
    # caches are cold after prefill: 10-30% over it, perf-notes #33 and #35): measured against
    # those, a rewrite's speedup read 20-30% above the ratio of the tokens/s of plain and
    # speculative answers. So the reference is the median of the latest PLAIN_REFERENCE warm
    # plain steps (a decode step at index COLD_STEPS or later), this answer's last; only where
    # there is none yet, the latest cold ones (the decoder's in cold_before, then this answer's).
    plain_before: list[float] = field(default_factory=list)
    cold_before: list[float] = field(default_factory=list)
    warm_plain: list[float] = field(default_factory=list)  # this answer's warm plain steps
    cold_plain: list[float] = field(default_factory=list)  # and its cold ones
    PLAIN_REFERENCE: ClassVar[int] = 32
    COLD_STEPS: ClassVar[int] = 4

    # The first new token comes out of prefill; the rest out of decode steps.
    @property
    def tokens_per_s(self) -> float:
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        n = self.prompt_tokens - self.reused_prompt_tokens
        return n / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.new_tokens - 1) / self.steps if self.steps else 0.0

    def add_step(self, source: str | None, fed: int, seconds: float) -> str | None:
        """Records a decode step's time (call it after counting the step in `steps`). Returns
        what it is to the speedup's reference: "warm" or "cold" for a plain step (see
        plain_before), None for a speculative one."""
        self.step_times.setdefault((source or PLAIN, fed), []).append(seconds)
        if source is not None or fed != 1:
            return None
        warm = self.steps > self.COLD_STEPS
        (self.warm_plain if warm else self.cold_plain).append(seconds)
        return "warm" if warm else "cold"

    @property
    def plain_steps(self) -> int:
        return len(self.step_times.get((PLAIN, 1), ()))

    @property
    def reference_steps(self) -> list[float]:
        """The plain steps the speedup is measured against: the latest PLAIN_REFERENCE warm ones,
        the decoder's before this answer and this answer's own (these last); without any, the
        latest cold ones, in the same order."""
        warm = (self.plain_before + self.warm_plain)[-self.PLAIN_REFERENCE :]
        return warm or (self.cold_before + self.cold_plain)[-self.PLAIN_REFERENCE :]

    @property
    def reference_own(self) -> int:
        """How many of the reference's steps are this answer's."""
        own = self.warm_plain if self.plain_before or self.warm_plain else self.cold_plain
        return min(len(own), len(self.reference_steps))

    @property
    def plain_step_s(self) -> float:
        """The median time of the reference's 1-token steps (0 when it has none)."""
        reference = self.reference_steps
        return median(reference) if reference else 0.0

    @property
    def speedup(self) -> float | None:
        """How much faster this generation's steps made its tokens than plain decoding would have:
        (new tokens after the first) x the median plain step (plain_step_s), over the steps'
        typical time (per kind of step, its count x its median time). The medians keep a step that
        a busy machine held up from swaying either side. Exactly 1.0 when nothing was proposed
        (every step was plain: this answer was plain decoding); None before a step ran, or while
        neither this answer nor the decoder's earlier ones has run a plain step."""
        if not self.step_times or not self.reference_steps:
            return None
        if set(self.step_times) == {(PLAIN, 1)}:
            return 1.0
        typical = sum(len(t) * median(t) for t in self.step_times.values())
        return (self.new_tokens - 1) * self.plain_step_s / typical

    def summary(self) -> dict:
        """The figures as plain JSON values: what the app's statistics show, and what `kwker
        serve` reports as usage["kwker"] (a remote app shows the same figures)."""
        return {
            "new_tokens": self.new_tokens,
            "tokens_per_s": self.tokens_per_s,
            "prefill_s": self.prefill_s,
            "prompt_tokens": self.prompt_tokens,
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "steps": self.steps,
            "tokens_per_step": self.tokens_per_step,
            "proposed": dict(self.proposed),
            "accepted": dict(self.accepted),
            "draft_s": self.draft_s,
            "speedup": self.speedup,  # None with no plain step to measure against
            "plain_steps": self.plain_steps,
            "reference_steps": len(self.reference_steps),
            "reference_own": self.reference_own,  # of them, this answer's
            "plain_tokens_per_s": 1 / self.plain_step_s if self.plain_step_s else 0.0,
        }


@dataclass
class GenerationChunk:
    token: int
    text: str  # the new piece of text ("" without a tokenizer, or while a character is incomplete)
    stats: GenerationStats
    finish_reason: str | None = None  # "eos" or "length" on the last chunk
    # "lookup" or "draft" when the token was a proposal the model verified
    source: str | None = None
    # with logprobs=K: the token's log-probability under the model (its raw distribution, before
    # temperature and the other sampling rules), and the K likeliest tokens' (id, log-probability)
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] | None = None


class StreamingDetokenizer:
    """Decodes a growing token list into text pieces. Holds back text that ends in an incomplete character
    (decoded as U+FFFD) until the next token completes it; starts a fresh window after each newline so that
    decoding stays cheap on long answers (as transformers' TextStreamer does)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.tokens: list[int] = []
        self.emitted = 0

    def add(self, token: int) -> str:
        self.tokens.append(token)
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=self.skip_special_tokens)
        if text.endswith("\ufffd"):
            return ""
        piece = text[self.emitted :]
        if text.endswith("\n"):
            self.tokens, self.emitted = [], 0
        else:
            self.emitted = len(text)
        return piece

    def flush(self) -> str:
        text = self.tokenizer.decode(self.tokens, skip_special_tokens=self.skip_special_tokens)
        piece = text[self.emitted :]
        self.tokens, self.emitted = [], 0
        return piece
