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

import bisect
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from kwker.suffix import Follower, SuffixAutomaton, SuffixCache


def accept(candidates: list[int], picks: list[int]) -> int:
    """How many proposed tokens are kept: the run of candidates, from the first, that equals the
    target's own picks (picks[i]: the token the target chooses after the text + candidates[:i])."""
    n = 0
    while n < len(candidates) and n < len(picks) and candidates[n] == picks[n]:
        n += 1
    return n


class LookupProposer:
    """Prompt lookup that follows long matches (as SuffixDecoding, arXiv 2411.04975): the longest
    suffix of the text that occurred earlier proposes what followed it, and says how long the match
    is (`match_len`), so that the speculator can propose more after a long match (a text being
    copied) than after a short one (a common pair of words). Earlier means in the text itself, or
    in the earlier texts of a `corpus` (a server's earlier requests), whichever match is longer.

    A suffix automaton of the text, extended token by token (amortized O(1) each), gives the
    longest suffix with an earlier occurrence and the first such occurrence; an index of the
    n-grams (ngram_min to ngram_max tokens) -> where each occurrence ends gives the latest, which is
    taken when it matches as far back (a text's latest version of a passage is the one being
    edited). The text is also streamed through the corpus's automaton (a Follower).

    Lookup also keeps the copy under way (`copy`: where in the text the next token is expected),
    as an editor's copy goes: while the text follows it, it proposes what comes next there; where
    the text parts from it (an edit: a renamed name, a fixed typo), the copy resumes just after the
    edit, near where it parted (`_resume`). The longest match is often elsewhere then: the text's
    own earlier edit of the same line, an instruction that names the new name, the source's last
    occurrence of the line (perf-notes #32).
    """

    name = "lookup"
    COMPARE = 64  # tokens compared backwards to measure the latest occurrence's match
    RESUME = 16  # tokens past where a copy parted from its source that it may resume at
    EDIT = 4  # tokens of an edit (that match nothing at the resumed place), at most
    COPIED = 8  # tokens copied from a source before an edit, at least, for the copy to resume

    def __init__(self, ngram_max: int = 3, ngram_min: int = 1, corpus: SuffixCache | None = None):
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.corpus = corpus
        self.match_len = 0  # of the latest proposal
        self._reset()

    def _reset(self) -> None:
        # n-gram -> the position just after each of its occurrences, in order
        self.ends: dict[tuple[int, ...], list[int]] = {}
        # (t, s, copied, run): the text's token t is expected to copy its token s (the source of
        # a match, followed as far as the text agreed with it, across edits), after `copied`
        # tokens copied from there, the last `run` of them since the latest edit (the length of
        # the match it proposes from); None: no copy under way
        self.copy: tuple[int, int, int, int] | None = None
        self.indexed = 0  # tokens[:indexed] are in the index and the automaton
        self.tokens: list[int] = []
        self.automaton = SuffixAutomaton()
        self._follower = Follower()  # the text in the corpus's automaton
        self._corpus_version = -1  # of the corpus the follower walked

    def _sync(self, tokens: list[int]) -> None:
        # the same growing list (a sequence's text) needs no comparison; another list may be another text
        if self.indexed > len(tokens) or (
            self.tokens is not tokens and self.tokens[: self.indexed] != tokens[: self.indexed]
        ):
            self._reset()  # a different text: start over
        self.tokens = tokens
        for end in range(self.indexed + 1, len(tokens) + 1):
            self.automaton.extend(tokens[end - 1])
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end >= n:
                    self.ends.setdefault(tuple(tokens[end - n : end]), []).append(end)
        self.indexed = len(tokens)

    def _follow_copy(self, tokens: list[int]) -> int | None:
        """Follows the copy under way along the text's new tokens; returns how many tokens the text
        has gone on since it parted from the source (0: still copying), None without a copy (or once
        that is more than COMPARE)."""
        if self.copy is None:
            return None
        t, s, copied, run = self.copy
        while t < len(tokens) and tokens[t] == tokens[s]:
            t, s, copied, run = t + 1, s + 1, copied + 1, run + 1
        since = len(tokens) - t
        self.copy = (t, s, copied, run) if since <= self.COMPARE else None
        return since if self.copy else None

    def _resume(self, tokens: list[int], since: int) -> tuple[int, int] | None:
        """After an edit, where the copy goes on: the nearest occurrence of the text's last n tokens
        (n from ngram_max down, at most `since`) that starts within RESUME tokens after where the
        text parted from the source, if the tokens since then match it but for at most EDIT of
        them. (where its continuation starts, how many tokens match before it), or None."""
        t, s, _, _ = self.copy
        for n in range(min(self.ngram_max, since), self.ngram_min - 1, -1):
            ends = self.ends.get(tuple(tokens[-n:]), [])
            i = bisect.bisect_left(ends, s + n)  # the first occurrence that starts at s or later
            if i < len(ends) and ends[i] <= min(s + n + self.RESUME, t):
                m = self._match_back(tokens, ends[i], n, self.COMPARE)
                return (ends[i], m) if since - m <= self.EDIT else None
        return None

    def _match_back(self, tokens: list[int], end: int, n: int, most: int) -> int:
        """How many tokens (up to `most`) the occurrence ending at `end` matches of the text's end,
        given that its last n do."""
        m = n
        while m < most and end - 1 - m >= 0 and tokens[end - 1 - m] == tokens[-1 - m]:
            m += 1
        return m

    def match(self, tokens: list[int]) -> tuple[int, int] | None:
        """(where the continuation starts, how many tokens match before it) for the longest suffix
        of the text that occurred earlier in the text, or where an edited copy resumes; None if no
        token of the text's end occurred earlier."""
        self._sync(tokens)
        a = self.automaton
        state = a.link[a.last]
        length = a.length[state] if state > 0 else 0
        if length == 0:
            return None
        since = self._follow_copy(tokens)
        if since == 0 and self.copy[2] >= min(length, self.COMPARE):
            # the text follows a copy at least as long as the longest match: what comes next there
            return self.copy[1], self.copy[3]
        if since and self.copy[2] >= self.COPIED:
            resumed = self._resume(tokens, since)
            if resumed is not None:
                end, m = resumed
                self.copy = (len(tokens), end, self.copy[2] + m, m)
                return resumed
        start = a.first[state] + 1  # after the first occurrence
        n = min(length, self.ngram_max)
        if n >= self.ngram_min:
            end = self.ends[tuple(tokens[-n:])][-2]  # the latest occurrence but the suffix itself
            want = min(length, self.COMPARE)
            if end != start and self._match_back(tokens, end, n, want) >= want:
                start = end
        # while the text may be inside an edit (EDIT tokens since it parted from its copy), the
        # copy stays its source, to resume after it: the text's own earlier edit of the same name
        # matches longer, but goes on like that earlier line rather than this one
        if since is None or since == 0 or since > self.EDIT:
            self.copy = (len(tokens), start, *(min(length, self.COMPARE),) * 2)
        return start, length

    def _follow_corpus(self, tokens: list[int]) -> Follower | None:
        """The text's longest suffix that occurs in the corpus (after match synced the text)."""
        corpus = self.corpus
        if corpus is None or not corpus.tokens:
            return None
        follower = self._follower  # a new one for a new text (_reset)
        if self._corpus_version != corpus.version:
            # the corpus grew (its states moved): walk the text again
            follower = self._follower = Follower()
            self._corpus_version = corpus.version
        for t in tokens[follower.fed :]:
            follower.feed(corpus.automaton, t)
        return follower

    def find(self, tokens: list[int], most: int) -> tuple[list[int], int] | None:
        """(up to `most` tokens that followed the longest earlier match of the text's end, the
        match's length), from the text or the corpus, whichever match is longer; None if none."""
        here = self.match(tokens)
        follower = self._follow_corpus(tokens)
        if follower is not None and follower.matched > (here[1] if here else 0):
            cont = self.corpus.continuation(follower, most)
            if cont:
                self.copy = None  # the corpus is the source now
                return cont, follower.matched
        if here is None:
            return None
        start, length = here
        return tokens[start : start + most], length

    def propose(self, tokens: list[int], k: int) -> list[int]:
        found = self.find(tokens, k)
        if found is None:
            self.match_len = 0
            return []
        cont, self.match_len = found
        return cont


# a draft that is further behind than this catches up in a prefill of its own before proposing
CATCH_UP_APART = 4


class DraftProposer:
    """A small model of the same tokenizer proposes the k tokens its greedy decoding would add.
    Its slot 0 follows the verified text: each proposal first catches up on the tokens its cache
    does not hold yet, then runs its k steps in one native call (Runner.propose_greedy).

    Its head can be pruned (as FR-Spec does): HEAD_SUBSET rows of the vocabulary, the frequent
    tokens (a byte-level BPE's ids follow its merge order, which is the order of frequency in the
    tokenizer's training text), the special ones, and every token of the text so far (its prompt
    as it is read, its answer as it grows; at most TEXT_ROWS of them), so that each proposed token
    reads a fraction of the 0.5B-class draft's biggest matrix (151936 x 896 in Qwen2.5). An answer
    repeats its prompt's words: 5-14% of the bench's answers' tokens are outside Qwen2.5's first
    32768 ids (" fox", "rectangle"), and with the prompt's tokens in the head the draft's top token
    is the target's as often as with the full head on rewrite (0.96), 2-3 points less on code
    (0.89, 0.86 without them; perf-notes #29). A draft only proposes: a token it cannot propose
    costs a rejection, never a different text. The full head is the fallback: when the generated
    tokens fall outside the subset more than MISS_RATE of the time (another language, rare
    symbols), proposals use it."""

    name = "draft"
    HEAD_SUBSET = 32768  # rows of the pruned head's frequent tokens (0: the full head always)
    TEXT_ROWS = 2048  # rows of the text's own tokens, at most (more: the latest text's start again)
    MISS_RATE = 0.1

    def __init__(self, draft):
        self.draft = draft
        self.behind = 0  # tokens the draft had to catch up on before its latest proposal
        self.catch_up_s = 0.0  # of the latest proposal's time, its catch-up's (0: a short one)
        # the text's first tokens left out of the draft's context (propose's window)
        self.offset = 0
        self.subset = False  # whether the latest proposal used the pruned head
        # of the latest proposal, when asked for (alternatives): each token's probability and the
        # runner-up token at its position, by the draft
        self.probs: list[float] = []
        self.second: list[int] = []
        self._in_subset = None  # (vocab,) bool: the pruned head's tokens, once it is set
        # the frequent and special tokens' ids, first in the pruned head
        self._base: np.ndarray | None = None
        self._extra: list[int] = []  # the text's tokens the pruned head holds beside them
        self._covered = 0  # tokens of the text whose tokens the pruned head holds
        self._miss = 0.0  # moving average of how often the text's tokens are outside the subset
        self._seen = 0  # tokens of the text counted into _miss
        self._set_up_subset()

    def _set_up_subset(self) -> None:
        """Sets the pruned head up on the draft, once per draft decoder: here, before any proposal
        is timed. Set up inside the first proposal (a repacking of about a target step), it was
        charged to that proposal's width, which then looked too dear to be proposed again
        (perf-notes #24). A text's tokens join it later for the cost of their rows (_cover)."""
        runner = self.draft.runner
        vocab = self.draft.vocab_size
        if not self.HEAD_SUBSET or vocab <= 2 * self.HEAD_SUBSET or not runner.has_head_subset:
            return
        self._in_subset = np.zeros(vocab, bool)
        self._in_subset[: self.HEAD_SUBSET] = True
        self._in_subset[list(_special_ids(self.draft))] = True
        self._base = np.flatnonzero(self._in_subset)
        runner.set_head_subset(self._base)

    def _cover(self, tokens: list[int]) -> None:
        """The pruned head gains the rows of the text's tokens it lacks (from `_covered` on), in the
        order they first occur: the next turn of a conversation keeps the rows of the one before
        at their places, and the draft copies only the new ones (Model.set_head_subset)."""
        if self._in_subset is None:
            return
        if self._covered > len(tokens):
            self._covered = 0  # another text
        text = np.asarray(tokens[self._covered :], np.int64)
        self._covered = len(tokens)
        outside = text[~self._in_subset[text]]
        if not outside.size:
            return
        _, first = np.unique(outside, return_index=True)
        new = outside[np.sort(first)].tolist()
        if len(self._extra) + len(new) > self.TEXT_ROWS:
            self._in_subset[self._extra] = False  # start again from this text's latest tokens
            self._extra, new = [], new[-self.TEXT_ROWS :]
        self._extra += new
        self._in_subset[new] = True
        self.draft.runner.set_head_subset(np.concatenate([self._base, self._extra]))

    def _pruned(self, tokens: list[int]) -> bool:
        """Whether to propose with the pruned head."""
        if self._in_subset is None:
            return False
        if self._seen == 0 or self._seen > len(tokens):
            self._seen = len(tokens)  # a new text: its prompt does not count
        new = tokens[self._seen :]
        if new:
            missed = float(np.count_nonzero(~self._in_subset[new])) / len(new)
            # from 0, not from the first value (one rare token first would hold the full head for
            # dozens of steps)
            self._miss += min(0.5, 0.02 * len(new)) * (missed - self._miss)
            self._seen = len(tokens)
        return self._miss <= self.MISS_RATE

    def read(self, tokens: list[int]) -> None:
        """The draft reads the text (a new sequence's prompt, all but its last token, which its
        first proposal feeds) in a prefill of its own, so that its first proposal, a probe included,
        costs what any proposal does: a new text's first probe had to catch up on the whole prompt
        (or restart the draft's context at its last PROBE_WINDOW tokens, losing the text a rewrite
        copies), which made it too dear to go, and the draft never proposed on that text."""
        runner = self.draft.runner
        text = tokens[: runner.max_cache_len]
        if len(text) < 2:
            return
        with runner.hold():
            slot = runner.acquire(0)
            try:
                self._catch_up(slot, text, apart=1)
            finally:
                runner.release(slot)
        self.offset = 0
        self._covered = 0
        self._cover(text)

    def _catch_up(self, slot: int, view: list[int], apart: int) -> int:
        """Trims the draft's cache to its longest prefix of `view`. Where more than `apart` of
        view's tokens are missing, reads all of them but the last (the next feed's) in a prefill of
        its own, timed apart (catch_up_s): a width's cost is then always measured on the usual 1-
        or 2-token feed. Returns how many of view's tokens the cache holds; sets behind and
        catch_up_s."""
        runner = self.draft.runner
        reuse = runner.reusable_prefix(slot, view)
        runner.trim(slot, runner.cached_len(slot) - reuse)
        self.behind = len(view) - reuse
        self.catch_up_s = 0.0
        if self.behind > apart:
            t0 = time.perf_counter()
            runner.extend_slot(slot, reuse, view[reuse:-1], rows="none", logits=False)
            self.catch_up_s = time.perf_counter() - t0
            reuse = len(view) - 1
        return reuse

    def behind_on(self, tokens: list[int], window: int | None = None) -> int:
        """How many of the text's tokens a proposal would first catch up on (at most `window`)."""
        view = tokens[self.offset :]
        behind = len(view) - self.draft.runner.reusable_prefix(0, view)
        return behind if window is None else min(behind, window)

    def propose(
        self,
        tokens: list[int],
        k: int,
        window: int | None = None,
        min_prob: float = 0.0,
        alternatives: bool = False,
    ) -> list[int]:
        """The draft's greedy proposal of up to k tokens after the text. window: catch up on at most
        that many tokens; a draft further behind restarts its context at the text's last `window`
        tokens (the draft then proposes from less of the text, until the next text). min_prob: stop
        once the product of the proposed tokens' probabilities (the draft's own) is below it.
        alternatives: also set probs and second (for a tree's branch)."""
        self.probs, self.second = [], []
        runner = self.draft.runner
        if window is not None and self.behind_on(tokens) > window:
            self.offset = len(tokens) - window
        view = tokens[self.offset :]
        k = min(k, runner.max_cache_len - len(view))
        if k <= 0:
            return []
        with runner.hold():
            slot = runner.acquire(0)
            try:
                reuse = self._catch_up(slot, view, CATCH_UP_APART)
                self.subset = self._pruned(tokens)  # counts the misses before _cover adds them
                self._cover(tokens)
                got = runner.propose_greedy(
                    slot, reuse, view[reuse:], k, self.subset, min_prob, alternatives
                )
                if not alternatives:
                    return got
                out, self.probs, self.second = got
                return out
            finally:
                runner.release(slot)


def _special_ids(decoder) -> set[int]:
    """The special tokens a draft must be able to propose (the end of a turn above all)."""
    ids: set[int] = set()
    for attr in ("eos_token_id", "bos_token_id", "pad_token_id"):
        v = getattr(decoder.config, attr, None)
        ids.update(v if isinstance(v, list) else [] if v is None else [v])
    tok = getattr(decoder, "tokenizer", None)
    if tok is not None:
        ids.update(getattr(tok, "all_special_ids", []) or [])
        if hasattr(tok, "get_added_vocab"):
            ids.update(tok.get_added_vocab().values())
    return {i for i in ids if 0 <= i < decoder.vocab_size}


# prior: each token fed beyond the widest measured step adds this much of a 1-token step
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

    A width's cost is the median of its latest TIMINGS times, and while it has fewer than TRUSTED of
    them, no more than the prior's (STEP_SLOPE a token): the host slows single steps by up to 2.4x,
    and a width whose first timing came out that dear would never be proposed, so never timed,
    again (a prompt being copied then got nothing from lookup: seen in CI). For the same reason a
    record that STALE multi-token steps have not timed again counts at no more than the prior's
    (current): a width timed in a slow stretch, then never proposed, was never timed again either
    (perf-notes #26: a draft locked at width 3 for good, steps of 5 and 6 tokens read at 1.6 and
    1.81 plain steps where they cost 1.28 and 1.42). Timed again, its old times are dropped."""

    TIMINGS: ClassVar[int] = 5
    TRUSTED: ClassVar[int] = 3
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
    # id(draft) -> its acceptance at the end of the latest sequence: the next one's prior (a new
    # sequence that started from 0.6 waited for its first probe before a draft that had been
    # accepted 95% of the time proposed again)
    draft_accept: dict[int, float] = field(default_factory=dict)
    # id(draft) -> the time of catching up on one token of the text (a proposal's prefill of what
    # the draft has not seen: the prompt, a run of lookup's tokens, the steps it sat out) / 1-token step
    draft_catch_up: dict[int, float] = field(default_factory=dict)

    # the decoder's latest warm plain steps as (when, seconds), for the next answers' speedup
    # (kwker.speedup.SpeedupMeter.earlier)
    plain_s: list[tuple[float, float]] = field(default_factory=list)
    PLAIN_KEPT: ClassVar[int] = 32  # plain_s's length at most: a few answers' worth

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


def _prior(fed: int) -> float:
    """A step of `fed` tokens before it was timed: STEP_SLOPE of a 1-token step a token more."""
    return 1.0 + STEP_SLOPE * (fed - 1)


class Speculator:
    """Chooses a source and how many tokens to propose, by expected tokens per unit of time.

    Per source it keeps an estimate of the chance that the next proposed token is accepted (`a`, moving average);
    per number of fed tokens, the step time relative to a 1-token step; per draft and proposal width, the draft's
    time. Proposing k tokens yields 1 + a + a^2 + ... + a^k tokens for the cost of a (k+1)-token step (plus the
    draft's k-token proposal for the draft): it proposes the k with the best ratio, and nothing when no k beats a
    plain step. Until the 1-token step that every other cost is relative to has been measured, steps are plain.
    The costs can come from earlier sequences (`costs`, see StepCosts): a generation then starts with the widths,
    the draft costs and the draft's acceptance they measured instead of learning them again.

    A draft cannot lock itself out: a draft with no measured cost first proposes FIRST_DRAFT_WIDTH tokens (a
    width at which a draft of a few tenths of a step can pay; one token rarely does, and a controller that grows
    widths only where the narrower one paid never gets there); its widths are then chosen on its measured costs,
    interpolated between the widths measured (a fixed cost per call and a cost per token), at a hopeful bound
    of its acceptance while this generation has tested few of its tokens (HOPE); and while its record
    does not pay it is probed whatever its record says: once early in each generation (a new text may suit it),
    then on a budget of the generation's time that counts everything a probe costs, the catch-up on the tokens
    the draft sat out included (see PROBE_*).
    While lookup is not proposing it still checks, for free, whether its proposal would have been right, so it
    comes back when the text starts repeating."""

    PLAIN_WARMUP = 2  # plain steps measured before anything is proposed
    # a draft's proposal stops below this chance that all its tokens are kept, at most
    STOP_MAX = 0.9
    FIRST_DRAFT_WIDTH = 4  # tokens a draft with no measured cost proposes first
    # A draft whose record does not pay is still probed now and then, at least PROBE_GAP steps after its last
    # proposal, at the width that would pay best if its tokens were accepted PROBE_ACCEPT of the time (at least
    # PROBE_MIN_WIDTH: its record may be a prior, or come from another kind of text, or its measured costs from
    # a slow moment). What a probe costs is its draft call, the catch-up on every token the draft sat out
    # (a prefill on the draft: on a 2-core AVX2 machine and an int4 target a few hundredths of a target step a
    # token, so probes on a schedule alone cost a fixed share of the time however far apart) and its verify
    # step, less the tokens it gained. A generation's first probe goes if it is expected to cost at most
    # PROBE_FIRST_COST plain steps; later ones while all probes together stay within PROBE_SHARE of the
    # generation's time (so that speculation stays >= 0.97x plain where the draft never pays).
    PROBE_ACCEPT = 0.9
    PROBE_GAP = 8
    PROBE_MIN_WIDTH = 3
    PROBE_FIRST_COST = 4.0
    PROBE_SHARE = 0.02
    # A probe catches up on at most PROBE_WINDOW tokens (a draft further behind restarts its context
    # at the text's last PROBE_WINDOW tokens): else its cost would grow with the steps the draft sat
    # out, and the budget would allow none once a caught-up token costs more than PROBE_SHARE.
    PROBE_WINDOW = 48
    CATCH_UP_PRIOR = 0.05  # a caught-up token's cost / 1-token target step, until one was measured
    # While a generation has tested few of the draft's tokens, its widths are chosen at an upper bound of its
    # acceptance, HOPE standard errors over the estimate, counting the estimate (a prior, or another text's
    # record) as HOPE_PRIOR_TRIALS trials: a few unlucky first proposals do not hold the draft off a text it
    # would serve well, and the bound closes on the estimate as this text's trials come in (an upper
    # confidence bound, as in a bandit: a draft that does not pay costs a few proposals to find out).
    HOPE, HOPE_PRIOR_TRIALS = 0.75, 8
    # what a source must promise over a plain step (noise in its measured costs)
    DRAFT_MARGIN, LOOKUP_MARGIN = 1.05, 1.02
    # Lookup's acceptance is kept per length of the match its proposal follows (1, 2-3, 4-7, 8-15, 16+
    # tokens): a text being copied (a long match) is accepted far more often than a common pair of
    # words. After a match of LONG_MATCH tokens or more, lookup proposes up to LONG_LOOKUP times its
    # limit, its widths growing twice as fast.
    MATCH_BUCKETS = (1, 2, 4, 8, 16)
    LONG_MATCH = 16
    LONG_LOOKUP = 3
    # A tree: beside a draft's chain, one branch that shares the chain's first i tokens and
    # replaces the rest, verified in the same step in a second slot (runner.Feed.branch_of): the
    # draft's runner-up at i, or lookup's continuation where it parts from the chain at i. Where
    # the chain fails at i and the branch's token is the target's, the branch's rows go on from
    # there. It is planned where the tokens it is expected to add (the draft's own probabilities
    # say how likely the chain fails at i) beat the rows it adds to the step. RUNNER_UP: prior
    # chance that the draft's runner-up is the target's token where its top token is not
    # (perf-notes #27: 0.4-0.6 on the bench's texts).
    RUNNER_UP = 0.4

    def __init__(
        self,
        lookup: LookupProposer | None,
        draft: DraftProposer | None,
        lookup_max: int = 8,
        draft_max: int = 8,
        costs: StepCosts | None = None,
        clock=time.perf_counter,
        tree: bool = False,
    ):
        """clock: what times the draft's proposals (a test's simulated clock). tree: plan a branch
        beside the draft's chain (see RUNNER_UP); the caller verifies it where it has a slot for it
        (`branch` after each propose)."""
        self.lookup, self.draft = lookup, draft
        self.tree = tree
        self.branch: tuple[int, list[int]] | None = None  # (i, tokens): replaces the chain's [i:]
        self.runner_up = self.RUNNER_UP  # learnt: see branch_feedback
        self._branch_is_runner_up = False  # whether `branch` is the draft's runner-up
        self.limit = {"lookup": lookup_max, "draft": draft_max}
        # prior chance that a proposed token is accepted
        self.accept = {"lookup": 0.5, "draft": 0.6}
        self._draft_key = id(draft.draft) if draft is not None else None
        if costs is not None and self._draft_key in costs.draft_accept:
            self.accept["draft"] = costs.draft_accept[self._draft_key]
        self.costs = costs if costs is not None else StepCosts()
        # lookup's acceptance per bucket of match length (MATCH_BUCKETS): not carried over from
        # the earlier sequences, whose kind of text may differ (perf-notes #32: an edit's records
        # made a story's lookup propose 2.4x the tokens, 0.96x -> 0.89x plain)
        self.match_accept: dict[int, float] = {}
        self._bucket: int | None = None  # of the lookup proposal (or shadow) of this step
        self.clock = clock
        # an earlier sequence measured the 1-token step: no plain warm-up
        self._inherited = self.costs.step1_s > 0
        self.draft_s = 0.0
        self.meter = None  # the sequence's SpeedupMeter, which may ask for a plain step
        # lookup's continuation where it was found and not proposed: checked against the step's
        # tokens (feedback), so lookup's records keep learning while it sits out
        self._shadow: list[int] | None = None
        self._plain_steps = 0
        self._steps = 0
        # the first probe comes PROBE_GAP steps in: a record inherited from earlier sequences is not doubted at once
        self._next_probe, self._probing, self._probed = self.PROBE_GAP, False, False
        # this generation's time, and what its probes cost, in 1-token steps of the moment
        self._elapsed = self._probe_spent = 0.0
        self._spent_drafting = 0.0  # the draft's time in this step, in 1-token steps
        self._draft_trials = 0  # the draft's tokens this generation has tested (see HOPE)

    @property
    def _draft_calls(self) -> dict[int, float]:
        return self.costs.draft_call.setdefault(self._draft_key, {})

    @property
    def catch_up_cost(self) -> float:
        """A caught-up token's time relative to a 1-token target step (CATCH_UP_PRIOR until measured)."""
        return self.costs.draft_catch_up.get(self._draft_key, self.CATCH_UP_PRIOR)

    def _cost(self, fed: int) -> float:
        """Step time of `fed` tokens relative to a 1-token step: the cheapest measured size at least as wide (a
        wider step is not cheaper, which keeps one noisy measurement from ruling a size out); wider than any
        measured, the widest measured plus its measured cost per extra token for each token more (STEP_SLOPE
        before any was measured)."""
        if fed == 1:
            return 1.0
        relative = self.costs.current()
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

    def _draft_call(self, k: int) -> float | None:
        """A k-token proposal's time relative to a 1-token target step, from the widths measured: a fixed cost
        per call and a cost per token, read off the two nearest widths (between them: interpolated; outside:
        extended along their line; one width measured: proportional to k). None before any was measured."""
        calls = self._draft_calls
        if not calls:
            return None
        if k in calls:  # the bound is at most calls[k] (j = k)
            return self._draft_bound(k)
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
        return min(estimate, self._draft_bound(k))

    def _draft_bound(self, k: int) -> float:
        """What any measured width says a k-token proposal costs at most: k / j times a j-token
        one (j < k: its k steps are like the j ones, its fixed part the same), and no more than a
        wider one. Without this bound, a width measured once at a slow moment (host steal, a
        one-time cost) would never be chosen again, so never measured again: an estimate that is
        too low corrects itself (the width is proposed and timed), one that is too high does not."""
        return min(c * max(1.0, k / j) for j, c in self._draft_calls.items())

    def _ratio(
        self, source: str, k: int, accept: float | None = None, catch_up: float = 0.0
    ) -> float:
        """Expected tokens per unit of time (a plain step: 1) when `source` proposes k tokens,
        counting `catch_up` tokens of the draft's catch-up in its time."""
        a = self.accept[source] if accept is None else accept
        extra = self.catch_up_cost * catch_up
        if source == "draft":
            extra += self._draft_call(k) or 0.0
        return _expected_tokens(a, k) / (self._cost(k + 1) + extra)

    def _lookup_accept(self, bucket: int | None) -> float:
        """Lookup's acceptance after a match of that bucket (its overall record until the bucket has one)."""
        return self.match_accept.get(bucket, self.accept["lookup"])

    def _best_k(
        self, source: str, room: int, accept: float | None = None, long: bool = False
    ) -> int:
        """The width with the best expected ratio, 0 if none beats a plain step by the source's margin.
        long: after a long match (lookup)."""
        best_k, best = 0, 1.0
        top = min(self.limit[source] * (self.LONG_LOOKUP if long else 1), room)
        if source == "lookup":
            # Only step sizes already measured, and one more: lookup's proposals cost nothing but their step,
            # and where a wide step costs nearly as much as several narrow ones (compute-bound formats, big
            # models) they grow only as far as they are seen to pay (twice as fast after a long match).
            widest = max(self.costs.relative, default=1)
            top = min(top, 2 * widest if long else widest)
        elif not self._draft_calls:
            return min(self.FIRST_DRAFT_WIDTH, top)  # a new draft: tried at a width that can pay
        margin = self.DRAFT_MARGIN if source == "draft" else self.LOOKUP_MARGIN
        for k in range(1, top + 1):
            ratio = self._ratio(source, k, accept)
            if ratio > best * margin and ratio > best:
                best_k, best = k, ratio
        return best_k

    def _hopeful_accept(self) -> float:
        """The draft's acceptance at its upper bound (HOPE), never above the estimate or PROBE_ACCEPT,
        whichever is higher."""
        a = self.accept["draft"]
        bound = a + self.HOPE * math.sqrt(
            a * (1 - a) / (self.HOPE_PRIOR_TRIALS + self._draft_trials)
        )
        return min(bound, max(a, self.PROBE_ACCEPT))

    def _stop_below(self, k: int) -> float:
        """Where a draft proposing up to k tokens stops (DraftProposer.propose's min_prob): one more
        token is worth the chance that every token before it is kept (the product of the draft's
        own probabilities) times the chance that it is (the draft's acceptance), and costs a draft
        token and a verify row; it is proposed while its worth per cost beats the tokens per unit of
        time that the k-token plan expects. 0 (no stop) before the draft's cost was measured."""
        call = self._draft_call(k)
        if call is None:
            return 0.0
        draft_token = call - (self._draft_call(k - 1) or 0.0) if k > 1 else call
        row = self._cost(k + 1) - self._cost(k)
        worth = self.accept["draft"]
        return min(self.STOP_MAX, self._ratio("draft", k) * (draft_token + row) / max(worth, 0.05))

    def _probe_k(self, room: int) -> int:
        """The width of a probe of the draft: the best at PROBE_ACCEPT, and never less than PROBE_MIN_WIDTH (a
        probe is made even where the draft's measured costs say it cannot pay)."""
        k = self._best_k("draft", room, accept=self.PROBE_ACCEPT)
        return min(max(k, self.PROBE_MIN_WIDTH), self.limit["draft"], room)

    def _probe_due(self, tokens: list[int], k: int) -> bool:
        """Whether a probe of k tokens fits (PROBE_*): its expected cost in 1-token steps, catch-up
        included, against the first probe's allowance or the budget."""
        if self._steps < self._next_probe:
            return False
        # measured: a draft with no measured width is not probed, it proposes FIRST_DRAFT_WIDTH
        cost = (
            self._draft_call(k)
            + self.catch_up_cost * self.draft.behind_on(tokens, self.PROBE_WINDOW)
            + self._cost(k + 1)
            - 1.0
        )
        if not self._probed and cost <= self.PROBE_FIRST_COST:
            return True
        return self._probe_spent + cost <= self.PROBE_SHARE * (self._elapsed + cost)

    def _reference_due(self) -> bool:
        """Whether this step should be plain for the speedup's reference (kwker.speedup)."""
        return self.meter is not None and self.meter.wants_plain()

    def propose(self, tokens: list[int], room: int) -> tuple[str | None, list[int]]:
        """(source, tokens) to verify after the text; room = how many may be proposed at most.
        With tree, `branch` is then the branch to verify beside them, if one pays."""
        self._shadow = None
        self.branch = None
        if room <= 0:
            return None, []
        if self._reference_due():
            return None, []  # a reference step
        warm = self._plain_steps >= self.PLAIN_WARMUP or self._inherited
        found: list[int] = []  # lookup's proposal, if it pays
        found_accept = self.accept["lookup"]
        self._bucket = None
        cont: list[int] = []  # lookup's continuation, if it found one
        if self.lookup is not None:
            where = self.lookup.find(tokens, min(room, self.limit["lookup"] * self.LONG_LOOKUP))
            if where is not None:
                cont, length = where
                self._bucket = max(b for b in self.MATCH_BUCKETS if b <= length)
                found_accept = self._lookup_accept(self._bucket)
                long = length >= self.LONG_MATCH
                k = self._best_k("lookup", room, found_accept, long) if warm else 0
                if k:
                    found = cont[:k]
                else:
                    self._shadow = cont
        self._probing = False
        if self.draft is not None and warm:
            k = self._best_k("draft", room, accept=self._hopeful_accept())
            # Against lookup: every token a lookup step gives, the draft must catch up on when it
            # next proposes, so lookup's step counts their catch-up. What the draft is behind already
            # is owed whichever proposes now: charged to the draft, as it was, each lookup step made
            # the next more likely (a draft 7 tokens behind lost to 2-token matches kept 1 time in 9
            # on code: perf-notes #36).
            gain = _expected_tokens(found_accept, len(found))
            chosen = k and (
                not found
                or self._ratio("draft", k)
                > self._ratio("lookup", len(found), found_accept, catch_up=gain)
            )
            # a probe where the draft's own record does not pay (where it pays but lookup promises more,
            # the records decide), even where lookup has a proposal: a text that repeats its prompt may be
            # the draft's best ground too
            if not k:
                probe = self._probe_k(room)
                if self._probe_due(tokens, probe):
                    k, chosen, self._probing = probe, True, True
            if chosen:
                if found:  # lookup keeps learning whether it would have been right
                    self._shadow = cont
                t0 = self.clock()
                window = self.PROBE_WINDOW if self._probing else None
                cands = self.draft.propose(tokens, k, window, self._stop_below(k), self.tree)
                spent = self.clock() - t0
                self.draft_s += spent
                self._spent_drafting = spent / self.costs.step1_s
                if cands:
                    self._learn_draft_cost(len(cands), spent)
                    if self.tree and self.draft.probs:
                        self.branch = self._plan_branch(cands, room, cont, found_accept)
                    return "draft", cands
        if found:
            return "lookup", found
        return None, []

    def start(self, tokens: list[int]) -> None:
        """A new text's prompt is in the target's cache: the draft reads it too (DraftProposer.read),
        as part of the prefill."""
        if self.draft is not None:
            self.draft.read(tokens)

    def _plan_branch(
        self, cands: list[int], room: int, cont: list[int], cont_accept: float
    ) -> tuple[int, list[int]] | None:
        """The branch beside the draft's chain `cands` that adds the most tokens per unit of time,
        None if none adds more than it costs. The draft's probabilities (well calibrated: perf-notes
        #26) give the chance that the chain fails exactly at i; the runner-up is then right
        runner_up of the time, lookup's tokens as its record after a match of that length says."""
        probs, second = self.draft.probs, self.draft.second
        n = len(cands)
        expected = 1.0 + sum(math.prod(probs[: i + 1]) for i in range(n))  # the chain's tokens
        cost = self._cost(n + 1) + (self._draft_call(n) or 0.0)
        best, plan = expected / cost, None
        for i in range(n):
            fails_here = math.prod(probs[:i]) * (1.0 - probs[i])
            options = [([second[i]], self.runner_up, True)]
            if len(cont) > i and cont[:i] == cands[:i] and cont[i] != cands[i]:
                options.append((cont[i : i + self.limit["lookup"]], cont_accept, False))
            for tokens, right, runner_up in options:
                tokens = tokens[: max(0, room - i)]
                if not tokens:
                    continue
                gain = fails_here * sum(right**j for j in range(1, len(tokens) + 1))
                rows = self._cost(n + 1 + len(tokens)) - self._cost(n + 1)
                ratio = (expected + gain) / (cost + rows)
                if ratio > best:
                    best, plan = ratio, (i, tokens)
                    self._branch_is_runner_up = runner_up
        return plan

    def branch_feedback(self, right: bool) -> None:
        """The chain failed where the branch starts: whether the branch's token was the target's
        (learnt for the draft's runner-up; lookup's tokens keep their own record)."""
        if self._branch_is_runner_up:
            self.runner_up = _ema(self.runner_up, float(right), weight=0.1)

    def _learn_draft_cost(self, k: int, spent: float) -> None:
        """A k-token proposal took `spent` seconds: of them the draft's catch-up took catch_up_s (a
        long one: its cost per token), the rest is the width's cost."""
        step1, catch_s = self.costs.step1_s, self.draft.catch_up_s
        calls = self._draft_calls
        calls[k] = _ema(calls.get(k, 0.0), (spent - catch_s) / step1)
        if catch_s > 0:
            key, per_token = self._draft_key, catch_s / step1 / max(1, self.draft.behind - 1)
            self.costs.draft_catch_up[key] = _ema(
                self.costs.draft_catch_up.get(key, 0.0), per_token
            )

    def feedback(
        self,
        source: str | None,
        proposed: int,
        accepted: int,
        fed: int,
        seconds: float,
        new: list[int] | None,
    ) -> None:
        """After a verify step: what was accepted, how long the step took, and the tokens it gave
        (the target's own, in order: for the shadow check of lookup)."""
        if self.costs.step1_s:
            step = seconds / self.costs.step1_s + self._spent_drafting
            self._elapsed += step
            if self._probing:  # what the probe cost beyond the plain step, less what it gained
                self._probe_spent += max(0.0, step - 1.0 - accepted)
        self._spent_drafting = 0.0
        if fed == 1:
            self.costs.step1_s = _ema(self.costs.step1_s, seconds)
            self._plain_steps += 1
        elif self.costs.step1_s:
            self.costs.record(fed, seconds / self.costs.step1_s)
        self._steps += 1
        if source is not None and proposed:
            trials = self._learn(source, accepted, proposed)
            if source == "draft":
                self.costs.draft_accept[self._draft_key] = self.accept["draft"]
                self._draft_trials += trials
        if source == "draft":
            self._probed = self._probed or self._probing
            self._next_probe = self._steps + self.PROBE_GAP
        if self._shadow and new:
            # Learnt as from lookup's own proposal, over as many tokens as the step gave: with
            # the first token alone (weight 0.1 a step), the record of long matches rose from its
            # 0.5 prior to 0.7 in 12 steps of an edit where they were all kept, and the draft,
            # at 8 tokens a step, kept lookup's 9-22 from the copy (perf-notes #36).
            self._learn("lookup", accept(self._shadow, new), min(len(self._shadow), len(new)))

    def _learn(self, source: str, kept: int, tested: int) -> int:
        """Learns `source`'s acceptance from `tested` tokens it proposed (or, for lookup's shadow,
        would have), the first `kept` of them kept: kept successes, then one failure unless all
        were kept, at weight 0.1 a trial (at most 0.5). Returns the trials counted."""
        trials = kept + (1 if kept < tested else 0)
        if trials:
            weight = min(0.5, 0.1 * trials)
            self.accept[source] = _ema(self.accept[source], kept / trials, weight=weight)
            if source == "lookup" and self._bucket is not None:
                self._learn_match(kept / trials, weight)
        return trials

    def _learn_match(self, accepted: float, weight: float) -> None:
        """Lookup's acceptance after a match of this step's bucket."""
        self.match_accept[self._bucket] = _ema(
            self._lookup_accept(self._bucket), accepted, weight=weight
        )


def _expected_tokens(accept: float, k: int) -> float:
    """The tokens a step that verifies k proposed tokens gives, when each is accepted with chance
    `accept` after the one before it was: 1 + a + a^2 + ... + a^k (the target's own token last)."""
    return sum(accept**i for i in range(k + 1))


def _ema(old: float, new: float, weight: float = 0.2) -> float:
    return new if old == 0.0 else old + weight * (new - old)
