"""Exact speculative decoding as named parts: propose -> verify -> accept -> rollback.

Proposers suggest the next tokens; the target checks them all in ONE native step (the kernels are batch-invariant,
so each row's logits are the bits a plain step would give); a proposed token is kept iff it equals the token the
target itself picks at that position (argmax, or the sample drawn with that position's one uniform number); the
KV cache keeps the verified prefix and the rest is overwritten later. So the output never depends on proposals.

Sources, and how they combine: prompt lookup first (free: copies the continuation of the latest earlier match of
the text's last n-gram); the draft model only where lookup has nothing to offer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


class LookupProposer:
    """Prompt lookup: the longest suffix n-gram (ngram_max down to ngram_min tokens) that occurred earlier in the
    text proposes what followed its latest earlier occurrence. An index of n-gram -> last start keeps each lookup
    O(1) however long the text is."""

    name = "lookup"

    def __init__(self, ngram_max: int = 3, ngram_min: int = 2):
        self.ngram_max, self.ngram_min = ngram_max, ngram_min
        self.index: dict[tuple[int, ...], int] = {}  # n-gram -> position just after its latest occurrence
        self.prev: dict[tuple[int, ...], int] = {}  # the occurrence before that one
        self.indexed = 0  # tokens[:indexed] are in the index
        self.tokens: list[int] = []

    def _sync(self, tokens: list[int]) -> None:
        if self.indexed > len(tokens) or self.tokens[:self.indexed] != tokens[:self.indexed]:
            self.index, self.prev, self.indexed = {}, {}, 0  # a different text: start over
        self.tokens = tokens
        for end in range(self.indexed + 1, len(tokens) + 1):
            for n in range(self.ngram_min, self.ngram_max + 1):
                if end >= n:
                    key = tuple(tokens[end - n:end])
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
                return tokens[end:end + k]
        return []


class DraftProposer:
    """A small model of the same tokenizer proposes k tokens greedily; its KV cache follows the verified text."""

    name = "draft"

    def __init__(self, draft):
        self.draft = draft

    def propose(self, tokens: list[int], k: int) -> list[int]:
        return self.draft.greedy_continuation(tokens, k)


@dataclass
class Speculator:
    """Chooses a source and how many tokens to propose, adapting to recent acceptance."""

    lookup: LookupProposer | None
    draft: DraftProposer | None
    lookup_max: int = 8
    draft_max: int = 8

    def __post_init__(self):
        self.k = {"lookup": self.lookup_max, "draft": min(4, self.draft_max)}
        self.limit = {"lookup": self.lookup_max, "draft": self.draft_max}
        self.draft_s = 0.0

    def propose(self, tokens: list[int], room: int) -> tuple[str | None, list[int]]:
        """(source, tokens) to verify after the text; room = how many may be proposed at most."""
        if room <= 0:
            return None, []
        if self.lookup is not None:
            cands = self.lookup.propose(tokens, min(self.k["lookup"], room))
            if cands:
                return "lookup", cands
        if self.draft is not None:
            t0 = time.perf_counter()
            cands = self.draft.propose(tokens, min(self.k["draft"], room))
            self.draft_s += time.perf_counter() - t0
            return "draft", cands
        return None, []

    def feedback(self, source: str, proposed: int, accepted: int) -> None:
        """All accepted: propose more next time (up to the limit); none: fewer (at least 1)."""
        if accepted == proposed:
            self.k[source] = min(self.limit[source], self.k[source] * 2 if source == "lookup" else self.k[source] + 1)
        elif accepted == 0:
            self.k[source] = max(1, self.k[source] // 2 if source == "lookup" else self.k[source] - 1)
