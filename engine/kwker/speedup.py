"""The speedup an answer shows: how much faster speculation gave its tokens than plain decoding
would have, measured inside the answer itself. This is the one place the figure is made.

What it estimates is what an A/B measures: the same prompt decoded plainly and with speculation,
one after the other on the same machine, time against time. Inside one answer:

    speedup = (tokens the steps gave) x (a plain step's time) / (the time the steps took)

- Only warm steps count, on both sides: an answer's first COLD_STEPS decode steps run 10-30%
  slower than a steady one (the caches are cold after prefill; perf-notes #33, #35).
- The plain step's time is the median of this answer's own warm one-token steps, never an earlier
  answer's alone: those ran under another load and at another length, and gave 2.71x beside 1.07
  tokens a step (issue 44). The steps' time is, per kind of step (its source and width), its count
  times its median, so that a step the machine held up sways neither side.
- The decoder's plain steps from the latest REFERENCE_AGE seconds (`earlier`) join the reference
  only while this answer has MIN_OWN of its own and their medians agree within AGREE: the
  answer's own steps say what a plain step costs now, the earlier ones only make that figure
  steadier. Fewer than MIN_PLAIN plain steps in all, or fewer than MIN_TOKENS tokens, is too
  little evidence: the figure is None, and `why` says what is missing (the window shows "–" with
  it). Two plain steps once gave 1.80x.
- A step of k tokens costs at least a one-token step, so the speedup can never exceed the tokens
  a warm step gave on average; a figure above it is noise, and is held to it.

Where speculation proposes at every step (a rewrite), there would be no plain step to measure
against, so the meter asks for one (wants_plain) once REFERENCE_GAP warm steps have passed
without one. This is a statistic that slows the answer, by choice: a plain step in place of a
step of t tokens costing c plain steps loses (1 - c / t) of a step, at most one step in
REFERENCE_GAP + 1: for a rewrite at 10 tokens a step and 2.5x, about 2% of its time (perf-notes
#41). Without it a rewrite could show no figure at all. Its token is the target's, as every
token is: the output does not change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import ClassVar

PLAIN = "plain"  # the kind of a one-token step with nothing proposed


@dataclass
class SpeedupMeter:
    COLD_STEPS: ClassVar[int] = 4  # an answer's first decode steps, left out on both sides
    MIN_PLAIN: ClassVar[int] = 6  # warm plain steps needed to show a figure
    MIN_TOKENS: ClassVar[int] = 16  # tokens from warm steps needed to show a figure
    REFERENCE_GAP: ClassVar[int] = 8  # warm speculative steps in a row before a plain one
    MIN_OWN: ClassVar[int] = 2  # the answer's own plain steps before earlier ones may join
    AGREE: ClassVar[float] = 0.2  # how far the two medians may be apart for that
    REFERENCE_AGE: ClassVar[float] = 120.0  # seconds: how recent an earlier plain step must be

    # earlier: the decoder's warm plain steps (seconds) of the latest REFERENCE_AGE seconds
    earlier: list[float] = field(default_factory=list)

    steps: int = 0  # decode steps seen, cold ones included
    tokens: int = 0  # tokens the warm steps gave
    # warm steps' times (seconds) by kind: (PLAIN, 1), or (source, tokens fed) for a speculative one
    times: dict[tuple[str, int], list[float]] = field(default_factory=dict)
    since_plain: int = 0  # warm speculative steps since the latest plain one

    def add(self, source: str | None, fed: int, tokens: int, seconds: float) -> bool:
        """A decode step: what proposed (None: nothing), the tokens it fed, the tokens it gave
        and its time (from its plan to the end of its absorb). Returns whether it was a warm
        plain step (one the decoder's next answers may be timed by: `earlier`)."""
        self.steps += 1
        if self.steps <= self.COLD_STEPS:
            return False
        plain = source is None and fed == 1
        self.times.setdefault((PLAIN, 1) if plain else (source or PLAIN, fed), []).append(seconds)
        self.tokens += tokens
        self.since_plain = 0 if plain else self.since_plain + 1
        return plain

    def wants_plain(self) -> bool:
        """Whether the next step should be plain, for the figure's reference (see the module)."""
        return self.since_plain >= self.REFERENCE_GAP

    @property
    def plain(self) -> list[float]:
        return self.times.get((PLAIN, 1), [])

    @property
    def reference(self) -> list[float]:
        """The plain steps the figure is measured by: this answer's own warm ones, and the
        earlier ones where enough of its own agree with them."""
        own = self.plain
        if len(own) >= self.MIN_OWN and self.earlier:
            if abs(median(self.earlier) / median(own) - 1) <= self.AGREE:
                return self.earlier + own
        return own

    @property
    def plain_step_s(self) -> float:
        """The median of the reference's plain steps (0 without any)."""
        return median(self.reference) if self.reference else 0.0

    @property
    def warm_steps(self) -> int:
        return sum(len(t) for t in self.times.values())

    @property
    def why(self) -> str:
        """Why there is no figure ("" when there is one)."""
        if self.tokens < self.MIN_TOKENS:
            return (
                f"Too short to measure: {self.tokens} tokens after the first {self.COLD_STEPS} "
                f"steps (at least {self.MIN_TOKENS} are needed)."
            )
        if len(self.reference) < self.MIN_PLAIN:
            return (
                f"Too little evidence: {len(self.plain)} plain one-token steps in this answer to "
                f"time plain decoding by (at least {self.MIN_PLAIN} are needed, or "
                f"{self.MIN_OWN} that agree with the decoder's latest). "
                "Compare… times plain decoding on the same prompt."
            )
        return ""

    @property
    def speedup(self) -> float | None:
        """The answer's speedup over plain decoding, or None with too little evidence (why)."""
        if self.why:
            return None
        if set(self.times) == {(PLAIN, 1)}:
            return 1.0  # nothing was proposed: this answer was plain decoding
        typical = sum(len(t) * median(t) for t in self.times.values())
        figure = self.tokens * self.plain_step_s / typical
        return min(figure, self.tokens / self.warm_steps)  # a step costs at least a plain one
