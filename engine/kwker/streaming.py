"""Streaming output: the dataclasses `stream_generate` yields, and a detokenizer that never emits
half a UTF-8 character."""

from __future__ import annotations

from dataclasses import dataclass, field

from kwker.speedup import PLAIN, SpeedupMeter

__all__ = ["PLAIN", "GenerationChunk", "GenerationStats", "StreamingDetokenizer"]


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
    meter: SpeedupMeter = field(default_factory=SpeedupMeter)  # the answer's speedup

    # The first new token comes out of prefill; the rest out of decode steps.
    @property
    def tokens_per_s(self) -> float:
        return (self.new_tokens - 1) / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def tokens_per_step(self) -> float:
        return (self.new_tokens - 1) / self.steps if self.steps else 0.0

    def add_step(self, source: str | None, fed: int, tokens: int, seconds: float) -> bool:
        """Records a decode step (call it after counting the step in `steps`): what proposed
        (None: nothing), the tokens it fed and gave, its time. Returns whether it was a warm plain
        step (SpeedupMeter.add)."""
        self.step_times.setdefault((source or PLAIN, fed), []).append(seconds)
        return self.meter.add(source, fed, tokens, seconds)

    @property
    def plain_steps(self) -> int:
        return len(self.step_times.get((PLAIN, 1), ()))

    @property
    def speedup(self) -> float | None:
        """The answer's speedup over plain decoding (kwker.speedup), None with too little
        evidence."""
        return self.meter.speedup

    @property
    def plain_step_s(self) -> float:
        return self.meter.plain_step_s

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
            "speedup": self.speedup,  # None with too little evidence: speedup_why says why
            "speedup_why": self.meter.why,
            "plain_steps": self.plain_steps,
            "reference_steps": len(self.meter.reference),  # the warm plain steps it is timed by
            "reference_own_steps": len(self.meter.plain),  # ...of them, this answer's own
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
    """Decodes a growing token list into text pieces. Holds back text that ends in an incomplete
    character (decoded as U+FFFD) until the next token completes it; starts a fresh window after
    each newline so that decoding stays cheap on long answers (as transformers' TextStreamer
    does)."""

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
