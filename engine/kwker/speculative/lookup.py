"""Prompt lookup: the longest suffix of the text that occurred before proposes what followed it,
in the text itself (LookupProposer) or in earlier texts (SuffixCache: a server's earlier requests,
as SuffixDecoding does, arXiv 2411.04975).

A suffix automaton of a token sequence has a state per class of substrings that end at the same
positions; it is built token by token in amortized O(1) each, and a text streamed through it
(Follower) keeps, at every token, its longest suffix that occurs in the sequence and where that
occurrence first ends.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


class SuffixAutomaton:
    """The suffix automaton of a sequence that grows token by token (extend)."""

    def __init__(self) -> None:
        # per state: its transitions, suffix link, longest length and the end (index of the last
        # token) of its first occurrence
        self.next: list[dict[int, int]] = [{}]
        self.link, self.length, self.first = [-1], [0], [-1]
        self.last = 0  # the state of the whole sequence
        self.size = 0  # tokens extended so far

    def extend(self, c: int) -> None:
        """Appends token c (at position self.size)."""
        nxt, link, length, first = self.next, self.link, self.length, self.first
        cur = len(length)
        nxt.append({})
        length.append(length[self.last] + 1)
        link.append(0)
        first.append(self.size)
        p = self.last
        while p != -1 and c not in nxt[p]:
            nxt[p][c] = cur
            p = link[p]
        if p != -1:
            q = nxt[p][c]
            if length[p] + 1 == length[q]:
                link[cur] = q
            else:
                clone = len(length)
                nxt.append(dict(nxt[q]))
                length.append(length[p] + 1)
                link.append(link[q])
                first.append(first[q])
                while p != -1 and nxt[p].get(c) == q:
                    nxt[p][c] = clone
                    p = link[p]
                link[q] = link[cur] = clone
        self.last = cur
        self.size += 1


@dataclass
class Follower:
    """A text streamed through another sequence's automaton: after each token, its longest suffix
    that occurs in that sequence (`matched` tokens) is in `state`."""

    state: int = 0
    matched: int = 0
    fed: int = 0  # tokens of the text streamed so far

    def feed(self, automaton: SuffixAutomaton, c: int) -> None:
        nxt, link, length = automaton.next, automaton.link, automaton.length
        while self.state and c not in nxt[self.state]:
            self.state = link[self.state]
            self.matched = length[self.state]
        if c in nxt[self.state]:
            self.state = nxt[self.state][c]
            self.matched += 1
        else:
            self.state, self.matched = 0, 0
        self.fed += 1


class SuffixCache:
    """Earlier texts (prompt and answer of a server's requests) that prompt lookup also copies from:
    a new request that repeats an earlier one's text (a regenerated answer, an agent's loop over the
    same tool output) is proposed what followed there. Texts are joined by SEPARATOR, which no text
    holds, so no match spans two of them. At most max_tokens are kept: past that, the older half of
    the texts is dropped. Used from one thread (the serving engine's): `version` tells a reader
    whose place in the automaton came from before the latest add that it must find it again.

    Its size: 65536 tokens of text-like ids hold ~27 MB of automaton; adding costs ~12 us a token,
    and dropping the older half rebuilds the newer one (~0.4 s at the default size, once per ~32k
    tokens added; perf-notes #26)."""

    SEPARATOR = -1

    def __init__(self, max_tokens: int = 1 << 16):
        if max_tokens < 2:
            raise ValueError(f"max_tokens must be at least 2, got {max_tokens}")
        self.max_tokens = max_tokens
        self.tokens: list[int] = []  # the texts, each followed by SEPARATOR
        self.automaton = SuffixAutomaton()
        self.version = 0

    def add(self, text: list[int]) -> None:
        """Keeps a finished text (its last max_tokens - 1 tokens) for later lookups."""
        text = list(text[-(self.max_tokens - 1) :])
        if not text:
            return
        if len(self.tokens) + len(text) + 1 > self.max_tokens:
            self._drop_older_half(len(text) + 1)
        self._append([*text, self.SEPARATOR])
        self.version += 1

    def _append(self, tokens: list[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            self.automaton.extend(t)

    def _drop_older_half(self, room: int) -> None:
        """Rebuilds from the newer texts: at most half of max_tokens, and room for `room` more."""
        keep = min(self.max_tokens // 2, self.max_tokens - room)
        cut = len(self.tokens) - keep
        # start at a text's start: after the first separator at or past the cut
        while cut < len(self.tokens) and (cut == 0 or self.tokens[cut - 1] != self.SEPARATOR):
            cut += 1
        kept = self.tokens[cut:]
        self.tokens, self.automaton = [], SuffixAutomaton()
        self._append(kept)

    def continuation(self, follower: Follower, k: int) -> list[int]:
        """Up to k tokens that followed the follower's match, up to the end of that earlier text."""
        if not follower.matched:
            return []
        start = self.automaton.first[follower.state] + 1
        out = self.tokens[start : start + k]
        if self.SEPARATOR in out:
            out = out[: out.index(self.SEPARATOR)]
        return out


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
    # tokens compared backwards to measure a match: a bound on each step's work (untuned)
    COMPARE = 64
    # tokens past where a copy parted from its source that it may resume at (perf-notes #32)
    RESUME = 16
    # an edit's tokens (unmatched where the copy resumes), at most, to resume (perf-notes #32)
    EDIT = 4
    # tokens copied before an edit, at least: chance matches do not resume (perf-notes #32)
    COPIED = 8

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
        # the same growing list (a sequence's text) needs no comparison; another list may be
        # another text
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
