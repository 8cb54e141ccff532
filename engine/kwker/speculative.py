"""Exact speculative decoding as named parts: propose -> verify -> accept -> rollback.

Proposers suggest the next tokens (propose); the target runs them all in ONE native step (verify:
the kernels are batch-invariant, so each row's logits are the bits a plain step would give); a
proposed token is kept iff it equals the token the target itself picks at that position (accept:
argmax, or the sample drawn with that position's one uniform number); the slot's cache forgets the
rejected tail (rollback: Runner.trim) and the next step overwrites it. So the output never depends
on proposals.

Sources, and how they combine: prompt lookup (free: copies the continuation of the latest earlier match of the
text's last n-gram) and the draft model each propose as their record of accepted tokens and their cost promise;
where both have a proposal, the one expecting more tokens per unit of time goes (lookup where the draft does not
pay, or where its matches are being accepted).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


def accept(candidates: list[int], picks: list[int]) -> int:
    """How many proposed tokens are kept: the run of candidates, from the first, that equals the
    target's own picks (picks[i]: the token the target chooses after the text + candidates[:i])."""
    n = 0
    while n < len(candidates) and n < len(picks) and candidates[n] == picks[n]:
        n += 1
    return n


class LookupProposer:
    """Prompt lookup: the longest suffix n-gram (ngram_max down to ngram_min tokens) that occurred earlier in the
    text proposes what followed its latest earlier occurrence. An index of n-gram -> last start keeps each lookup
    O(1) however long the text is."""

    name = "lookup"

    def __init__(self, ngram_max: int = 3, ngram_min: int = 2):
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.index: dict[
            tuple[int, ...], int
        ] = {}  # n-gram -> position just after its latest occurrence
        self.prev: dict[tuple[int, ...], int] = {}  # the occurrence before that one
        self.indexed = 0  # tokens[:indexed] are in the index
        self.tokens: list[int] = []

    def _sync(self, tokens: list[int]) -> None:
        # the same growing list (a sequence's text) needs no comparison; another list may be another text
        if self.indexed > len(tokens) or (
            self.tokens is not tokens and self.tokens[: self.indexed] != tokens[: self.indexed]
        ):
            self.index, self.prev, self.indexed = {}, {}, 0  # a different text: start over
        self.tokens = tokens
        for end in range(self.indexed + 1, len(tokens) + 1):
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end >= n:
                    key = tuple(tokens[end - n : end])
                    if key in self.index:
                        self.prev[key] = self.index[key]
                    self.index[key] = end
        self.indexed = len(tokens)

    def propose(self, tokens: list[int], k: int) -> list[int]:
        self._sync(tokens)
        for n in range(self.ngram_max, self.ngram_min - 1, -1):
            if len(tokens) <= n:
                continue
            key = tuple(tokens[-n:])
            end = self.index.get(key)
            if end == len(tokens):  # the suffix itself: use the occurrence before it
                end = self.prev.get(key)
            if end is not None and end < len(tokens):
                return tokens[end : end + k]
        return []


CATCH_UP_TIMED = (
    4  # a draft call that first catches up on more tokens than this does not time its proposals
)


class DraftProposer:
    """A small model of the same tokenizer proposes the k tokens its greedy decoding would add.
    Its slot 0 follows the verified text: each proposal first catches up on the tokens its cache
    does not hold yet."""

    name = "draft"

    def __init__(self, draft):
        self.draft = draft
        self.behind = 0  # tokens the draft had to catch up on before its latest proposal

    def propose(self, tokens: list[int], k: int) -> list[int]:
        runner = self.draft.runner
        k = min(k, runner.max_cache_len - len(tokens))
        if k <= 0:
            return []
        with runner.hold():
            slot = runner.acquire(0)
            try:
                reuse = runner.reusable_prefix(slot, tokens)
                runner.trim(slot, runner.cached_len(slot) - reuse)
                self.behind = len(tokens) - reuse
                out: list[int] = []
                feed, start = tokens[reuse:], reuse  # first the catch-up, then each new token
                while len(out) < k:
                    out.append(runner.extend_slot(slot, start, feed, logits=False).argmax[-1])
                    feed, start = out[-1:], start + len(feed)
            finally:
                runner.release(slot)
        return out


@dataclass
class StepCosts:
    """What speculation measures about a decoder rather than a text, as moving averages: the target's 1-token step
    time, and relative to it, the time of a step that feeds more tokens (by their number) and each draft's time for
    a proposal of k tokens (by id of the draft decoder, then k). Relative costs are measured against the 1-token
    average of the moment, so that a machine that slows down or speeds up (shared, noisy) moves both alike and a
    size measured long ago keeps its meaning. A decoder hands one to the sequences it runs one after another, so
    that each starts from what the earlier ones measured."""

    step1_s: float = 0.0
    relative: dict[int, float] = field(
        default_factory=dict
    )  # fed tokens (2+) -> step time / 1-token step
    draft_call: dict[int, dict[int, float]] = field(
        default_factory=dict
    )  # id(draft) -> {k: time of a k-token proposal / 1-token step}


STEP_SLOPE = (
    0.08  # prior: each token fed beyond the widest measured step adds this much of a 1-token step
)


class Speculator:
    """Chooses a source and how many tokens to propose, by expected tokens per unit of time.

    Per source it keeps an estimate of the chance that the next proposed token is accepted (`a`, moving average);
    per number of fed tokens, the step time relative to a 1-token step; per draft and proposal width, the draft's
    time. Proposing k tokens yields 1 + a + a^2 + ... + a^k tokens for the cost of a (k+1)-token step (plus the
    draft's k-token proposal for the draft): it proposes the k with the best ratio, and nothing when no k beats a
    plain step. Until the 1-token step that every other cost is relative to has been measured, steps are plain.
    The costs can come from earlier sequences (`costs`, see StepCosts): a generation then starts with the widths
    and the draft costs they measured instead of learning them again.

    A draft cannot lock itself out: a draft with no measured cost first proposes FIRST_DRAFT_WIDTH tokens (a
    width at which a draft of a few tenths of a step can pay; one token rarely does, and a controller that grows
    widths only where the narrower one paid never gets there); its widths are then chosen on its measured costs,
    interpolated between the widths measured (a fixed cost per call and a cost per token); and while its record
    does not pay it is probed on a schedule whatever its record says (see PROBE_*).
    While lookup is not proposing it still checks, for free, whether its proposal would have been right, so it
    comes back when the text starts repeating."""

    PLAIN_WARMUP = 2  # plain steps measured before anything is proposed
    FIRST_DRAFT_WIDTH = 4  # tokens a draft with no measured cost proposes first
    # A draft whose record does not pay is still probed now and then: PROBE_GAP steps after its last proposal,
    # at the width that would pay best if its tokens were accepted PROBE_ACCEPT of the time (at least
    # PROBE_MIN_WIDTH: its record may be a prior, or come from another kind of text, or its measured costs from
    # a slow moment). A probe after which its record still does not pay doubles the gap, up to PROBE_GAP_MAX
    # (a failed probe costs about one step: 1/PROBE_GAP_MAX of the time at most); one that pays resets it.
    PROBE_ACCEPT = 0.9
    PROBE_GAP = 8
    PROBE_GAP_MAX = 128
    PROBE_MIN_WIDTH = 3
    DRAFT_MARGIN = (
        1.05  # a draft must promise this much over a plain step (noise in its measured costs)
    )
    LOOKUP_MARGIN = 1.02
    # A generation's speedup is measured against its own plain steps (GenerationStats.speedup): where
    # speculation proposes at every step, a plain step is taken once REFERENCE_GAP steps have passed
    # without one, until the generation has REFERENCE_STEPS of them (a few tokens' worth of time).
    REFERENCE_STEPS = 4
    REFERENCE_GAP = 16

    def __init__(
        self,
        lookup: LookupProposer | None,
        draft: DraftProposer | None,
        lookup_max: int = 8,
        draft_max: int = 8,
        costs: StepCosts | None = None,
        clock=time.perf_counter,
    ):
        """clock: what times the draft's proposals (a test's simulated clock)."""
        self.lookup, self.draft = lookup, draft
        self.limit = {"lookup": lookup_max, "draft": draft_max}
        self.accept = {
            "lookup": 0.5,
            "draft": 0.6,
        }  # prior chance that a proposed token is accepted
        self.costs = costs if costs is not None else StepCosts()
        self.clock = clock
        self._inherited = (
            self.costs.step1_s > 0
        )  # an earlier sequence measured the 1-token step: no plain warm-up
        self._draft_key = id(draft.draft) if draft is not None else None
        self.draft_s = 0.0
        self.trace: list[dict] | None = None  # a list to record each decision in (diagnostics)
        self._shadow: int | None = None  # lookup's first proposal, when it was not made
        self._plain_steps = 0
        self._steps = 0
        self._last_plain = 0  # the step count at the latest plain step
        # the first probe comes PROBE_GAP steps in: a record inherited from earlier sequences is not doubted at once
        self._probe_gap, self._next_probe, self._probing = self.PROBE_GAP, self.PROBE_GAP, False

    @property
    def _draft_calls(self) -> dict[int, float]:
        return self.costs.draft_call.setdefault(self._draft_key, {})

    @property
    def draft_cost(self) -> float:
        """The draft's time per proposed token relative to a 1-token target step, at its widest measured width
        (0 before it was measured)."""
        calls = self.costs.draft_call.get(self._draft_key) or {}
        if not calls:
            return 0.0
        k = max(calls)
        return calls[k] / k

    def _cost(self, fed: int) -> float:
        """Step time of `fed` tokens relative to a 1-token step: the cheapest measured size at least as wide (a
        wider step is not cheaper, which keeps one noisy measurement from ruling a size out); wider than any
        measured, the widest measured (or a 1-token step) plus STEP_SLOPE per token more."""
        if fed == 1:
            return 1.0
        wider = [r for f, r in self.costs.relative.items() if f >= fed]
        if wider:
            return max(1.0, min(wider))
        widest = max(self.costs.relative, default=1)
        base = self.costs.relative.get(widest, 1.0)
        return max(1.0, base) + STEP_SLOPE * (fed - widest)

    def _draft_call(self, k: int) -> float | None:
        """A k-token proposal's time relative to a 1-token target step, from the widths measured: a fixed cost
        per call and a cost per token, read off the two nearest widths (between them: interpolated; outside:
        extended along their line; one width measured: proportional to k). None before any was measured."""
        calls = self._draft_calls
        if not calls:
            return None
        if k in calls:
            return calls[k]
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
        return max(per_token * k, calls[lo] + per_token * (k - lo))

    def _ratio(self, source: str, k: int, accept: float | None = None) -> float:
        """Expected tokens per unit of time (a plain step: 1) when `source` proposes k tokens."""
        a = self.accept[source] if accept is None else accept
        extra = (self._draft_call(k) or 0.0) if source == "draft" else 0.0
        return sum(a**i for i in range(k + 1)) / (self._cost(k + 1) + extra)

    def _best_k(self, source: str, room: int, accept: float | None = None) -> int:
        """The width with the best expected ratio, 0 if none beats a plain step by the source's margin."""
        best_k, best = 0, 1.0
        top = min(self.limit[source], room)
        if source == "lookup":
            # Only step sizes already measured, and one more: lookup's proposals cost nothing but their step,
            # and where a wide step costs nearly as much as several narrow ones (compute-bound formats, big
            # models) they grow only as far as they are seen to pay.
            top = min(top, max(self.costs.relative, default=1))
        elif not self._draft_calls:
            return min(self.FIRST_DRAFT_WIDTH, top)  # a new draft: tried at a width that can pay
        margin = self.DRAFT_MARGIN if source == "draft" else self.LOOKUP_MARGIN
        for k in range(1, top + 1):
            ratio = self._ratio(source, k, accept)
            if ratio > best * margin and ratio > best:
                best_k, best = k, ratio
        return best_k

    def _probe_k(self, room: int) -> int:
        """The width of a probe of the draft: the best at PROBE_ACCEPT, and never less than PROBE_MIN_WIDTH (a
        probe is made even where the draft's measured costs say it cannot pay)."""
        k = self._best_k("draft", room, accept=self.PROBE_ACCEPT)
        return min(max(k, self.PROBE_MIN_WIDTH), self.limit["draft"], room)

    def _note(self, **what) -> None:
        if self.trace is not None:
            self.trace.append(dict(step=self._steps, **what))

    def propose(self, tokens: list[int], room: int) -> tuple[str | None, list[int]]:
        """(source, tokens) to verify after the text; room = how many may be proposed at most."""
        self._shadow = None
        if room <= 0:
            return None, []
        if (
            self._plain_steps < self.REFERENCE_STEPS
            and self._steps - self._last_plain >= self.REFERENCE_GAP
        ):
            self._note(source=None, why="reference")
            return None, []  # a reference step
        warm = self._plain_steps >= self.PLAIN_WARMUP or self._inherited
        found: list[int] = []  # lookup's proposal, if it pays
        if self.lookup is not None:
            k = self._best_k("lookup", room) if warm else 0
            cands = self.lookup.propose(tokens, max(k, 1))
            if cands and k:
                found = cands
            elif cands:
                self._shadow = cands[0]
        self._probing = False
        if self.draft is not None and warm:
            k = self._best_k("draft", room)
            chosen = k and (
                not found or self._ratio("draft", k) > self._ratio("lookup", len(found))
            )
            # a probe where the draft's own record does not pay (where it pays but lookup promises more,
            # the records decide), even where lookup has a proposal: a text that repeats its prompt may be
            # the draft's best ground too
            if not k and self._steps >= self._next_probe:
                k, chosen, self._probing = self._probe_k(room), True, True
            if self.trace is not None:
                self._note(
                    draft_k=k,
                    chosen=bool(chosen),
                    probing=self._probing,
                    accept=dict(self.accept),
                    draft_calls=dict(self._draft_calls),
                    relative=dict(self.costs.relative),
                    found=len(found),
                )
            if chosen:
                if found:
                    self._shadow = found[
                        0
                    ]  # lookup keeps learning whether it would have been right
                t0 = self.clock()
                cands = self.draft.propose(tokens, k)
                spent = self.clock() - t0
                self.draft_s += spent
                if cands:
                    # the cost of proposing: not a long catch-up (the prompt, a run of lookup tokens)
                    if self.draft.behind <= CATCH_UP_TIMED:
                        calls = self._draft_calls
                        calls[len(cands)] = _ema(
                            calls.get(len(cands), 0.0), spent / self.costs.step1_s
                        )
                    return "draft", cands
        if found:
            return "lookup", found
        return None, []

    def feedback(
        self,
        source: str | None,
        proposed: int,
        accepted: int,
        fed: int,
        seconds: float,
        next_token: int | None,
    ) -> None:
        """After a verify step: what was accepted, how long the step took, and the first new token (for the
        shadow check of lookup)."""
        if fed == 1:
            self.costs.step1_s = _ema(self.costs.step1_s, seconds)
            self._plain_steps += 1
            self._last_plain = self._steps + 1
        elif self.costs.step1_s:
            self.costs.relative[fed] = _ema(
                self.costs.relative.get(fed, 0.0), seconds / self.costs.step1_s
            )
        self._steps += 1
        if source is not None and proposed:
            # accepted successes, then one failure unless everything was accepted
            trials = accepted + (1 if accepted < proposed else 0)
            self.accept[source] = _ema(
                self.accept[source], accepted / trials, weight=min(0.5, 0.1 * trials)
            )
        if source == "draft":
            if self._probing:
                # a probe after which the record pays makes the draft a regular again; else the gap doubles
                pays = self._best_k("draft", self.limit["draft"]) > 0
                self._probe_gap = (
                    self.PROBE_GAP if pays else min(self._probe_gap * 2, self.PROBE_GAP_MAX)
                )
            self._next_probe = self._steps + self._probe_gap
        if self._shadow is not None and next_token is not None:
            self.accept["lookup"] = _ema(
                self.accept["lookup"], float(self._shadow == next_token), weight=0.1
            )


def _ema(old: float, new: float, weight: float = 0.2) -> float:
    return new if old == 0.0 else old + weight * (new - old)
