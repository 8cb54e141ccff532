"""The cost model: what a decoder's steps and its drafts' proposals cost, in 1-token steps of the
moment, measured as speculation runs and shared by the sequences a decoder runs."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import ClassVar

# prior: each token a step feeds past the first adds this much of a 1-token step (perf-notes #26)
STEP_SLOPE = 0.08


@dataclass
class StepCosts:
    """What speculation measures about a decoder rather than a text: the target's 1-token step time
    (a moving average), and relative to it, the time of a step that feeds more tokens (by their
    number) and each draft's time for a proposal of k tokens (by id of the draft decoder, then k).
    Relative costs are measured against the 1-token average of the moment, so that a machine that
    slows down or speeds up (shared, noisy) moves both alike and a size measured long ago keeps its
    meaning. A decoder hands one to the sequences it runs one after another, so that each starts
    from what the earlier ones measured.

    A width's cost is the median of its latest TIMINGS times, no more than the prior's (_prior)
    while it has fewer than TRUSTED of them, or while STALE multi-token steps have not timed it
    again (current): a width whose few timings came out dear (the host slows single steps) would
    otherwise never be proposed, so never timed, again. Timed again, its old times are dropped."""

    # a width's cost is the median of its latest this many times (perf-notes #45)
    TIMINGS: ClassVar[int] = 5
    # times a width needs before it may cost more than the prior (perf-notes #45)
    TRUSTED: ClassVar[int] = 3
    # multi-token steps without timing a width after which its record is doubted (perf-notes #26)
    STALE: ClassVar[int] = 100

    step1_s: float = 0.0
    # fed tokens (2+) -> the latest TIMINGS times of a step that fed them, each / the 1-token step
    timings: dict[int, list[float]] = field(default_factory=dict)
    relative: dict[int, float] = field(default_factory=dict)  # fed tokens -> its cost (record)
    recorded: int = 0  # multi-token steps timed so far
    # fed tokens -> `recorded` at its latest
    recorded_at: dict[int, int] = field(default_factory=dict)
    # id(draft) -> {k: time of a k-token proposal / 1-token step}
    draft_call: dict[int, dict[int, float]] = field(default_factory=dict)
    # id(draft) -> its acceptance at the end of the latest sequence: the next one's prior, so that
    # a draft that was being accepted proposes at once (perf-notes #20)
    draft_accept: dict[int, float] = field(default_factory=dict)
    # id(draft) -> the time of catching up on one token of the text (a proposal's prefill of what
    # the draft has not seen: the prompt, a run of lookup's tokens, the steps it sat out), in
    # 1-token steps
    draft_catch_up: dict[int, float] = field(default_factory=dict)

    # the decoder's latest warm plain steps as (when, seconds), for the next answers' speedup
    # (kwker.speedup.SpeedupMeter.earlier)
    plain_s: list[tuple[float, float]] = field(default_factory=list)
    # plain_s's length at most: a few answers' worth of reference steps (perf-notes #33)
    PLAIN_KEPT: ClassVar[int] = 32

    def add_plain(self, seconds: float, at: float) -> None:
        self.plain_s.append((at, seconds))
        del self.plain_s[: -self.PLAIN_KEPT]

    def recent_plain(self, now: float, age: float) -> list[float]:
        """The plain steps timed in the latest `age` seconds."""
        return [seconds for at, seconds in self.plain_s if now - at <= age]

    def _stale(self, fed: int) -> bool:
        return self.recorded - self.recorded_at.get(fed, self.recorded) > self.STALE

    def record(self, fed: int, relative: float) -> None:
        """A step that fed `fed` tokens took `relative` 1-token steps."""
        times = self.timings.setdefault(fed, [])
        if self._stale(fed):
            times.clear()
        self.recorded += 1
        self.recorded_at[fed] = self.recorded
        times.append(relative)
        del times[: -self.TIMINGS]
        cost = statistics.median(times)
        if len(times) < self.TRUSTED:
            cost = min(cost, _prior(fed))
        self.relative[fed] = cost

    def current(self) -> dict[int, float]:
        """fed tokens -> the cost to plan with: its record, a stale one no more than the prior's."""
        return {
            fed: min(cost, _prior(fed)) if self._stale(fed) else cost
            for fed, cost in self.relative.items()
        }

    def step_cost(self, fed: int) -> float:
        """Step time of `fed` tokens relative to a 1-token step: the cheapest measured size at least
        as wide (a wider step is not cheaper, which keeps one noisy measurement from ruling a size
        out); wider than any measured, the widest measured plus its measured cost per extra token
        for each token more (STEP_SLOPE before any was measured)."""
        if fed == 1:
            return 1.0
        relative = self.current()
        wider = [r for f, r in relative.items() if f >= fed]
        if wider:
            return max(1.0, min(wider))
        widest = max(relative, default=1)
        if widest == 1:
            return _prior(fed)
        # along the measured cost per extra token (from the 1-token step to the widest), not below
        # a quarter of the prior's
        base = max(1.0, relative[widest])
        slope = max((base - 1.0) / (widest - 1), STEP_SLOPE / 4)
        return base + slope * (fed - widest)

    def draft_cost(self, draft: int | None, k: int) -> float | None:
        """A k-token proposal's time by the draft of id `draft`, relative to a 1-token target step,
        from the widths measured: a fixed cost per call and a cost per token, read off the two
        nearest widths (between them: interpolated; outside: extended along their line; one width
        measured: proportional to k). None before any was measured."""
        calls = self.draft_call.setdefault(draft, {})
        if not calls:
            return None
        if k in calls:  # the bound is at most calls[k] (j = k)
            return _draft_bound(calls, k)
        ks = sorted(calls)
        if len(ks) == 1:
            return calls[ks[0]] * k / ks[0]
        below = [w for w in ks if w < k]
        above = [w for w in ks if w > k]
        if below and above:
            lo, hi = below[-1], above[0]
        elif above:
            lo, hi = above[0], above[1]
        else:
            lo, hi = below[-2], below[-1]
        per_token = max(0.0, (calls[hi] - calls[lo]) / (hi - lo))
        # a proposal of more tokens never costs less; the fixed part is not negative either
        estimate = max(per_token * k, calls[lo] + per_token * (k - lo))
        return min(estimate, _draft_bound(calls, k))


def _draft_bound(calls: dict[int, float], k: int) -> float:
    """What any measured width says a k-token proposal costs at most: k / j times a j-token one
    (j < k: its k steps are like the j ones, its fixed part the same), and no more than a wider
    one. Without this bound, a width measured once at a slow moment (host steal, a one-time cost)
    would never be chosen again, so never measured again: an estimate that is too low corrects
    itself (the width is proposed and timed), one that is too high does not (perf-notes #24)."""
    return min(c * max(1.0, k / j) for j, c in calls.items())


def _prior(fed: int) -> float:
    """A step of `fed` tokens before it was timed: STEP_SLOPE of a 1-token step a token more."""
    return 1.0 + STEP_SLOPE * (fed - 1)
