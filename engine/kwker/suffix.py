"""Suffix automata for prompt lookup: the longest suffix of a text that occurred before, in the text
itself (LookupProposer) or in earlier texts (SuffixCache: a server's earlier requests, as
SuffixDecoding does, arXiv 2411.04975).

A suffix automaton of a token sequence has a state per class of substrings that end at the same
positions; it is built token by token in amortized O(1) each, and a text streamed through it
(Follower) keeps, at every token, its longest suffix that occurs in the sequence and where that
occurrence first ends.
"""

from __future__ import annotations

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
    tokens added)."""

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
