"""The draft proposer: a small model of the target's tokenizer proposes the tokens its greedy
decoding would add, in one native call, over a head that may be pruned to the likely rows."""

from __future__ import annotations

import time

import numpy as np

# tokens behind past which a draft catches up in a prefill of its own, timed apart, so that a
# width is always timed on the usual 1-2 token feed (perf-notes #23)
CATCH_UP_APART = 4


class DraftProposer:
    """A small model of the same tokenizer proposes the k tokens its greedy decoding would add.
    Its slot 0 follows the verified text: each proposal first catches up on the tokens its cache
    does not hold yet, then runs its k steps in one native call (Runner.propose_greedy).

    Its head can be pruned (as FR-Spec does), so that each proposed token reads a fraction of the
    draft's biggest matrix (151936 x 896 in Qwen2.5): HEAD_SUBSET rows of frequent tokens (a
    byte-level BPE's ids follow its merge order, the order of frequency in the tokenizer's training
    text), the special ones, and every token of the text so far (its prompt as it is read, its
    answer as it grows; at most TEXT_ROWS of them), since an answer repeats its prompt's words. A
    draft only proposes: a token it cannot propose costs a rejection, never a different text. The
    full head is the fallback: while the generated tokens fall outside the subset more than
    MISS_RATE of the time (another language, rare symbols), proposals use it."""

    name = "draft"
    # frequent-token rows of the pruned head (0: the full head always); fewer cost agreement for
    # little time (perf-notes #32)
    HEAD_SUBSET = 32768
    # rows of the text's own tokens, at most (past it: the latest text's only; perf-notes #29)
    TEXT_ROWS = 2048
    # share of the text's tokens outside the pruned head past which the full head proposes
    # (perf-notes #20)
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
        is timed, since the set-up (a repacking of about a target step) would be charged to the
        width of the proposal it ran in (perf-notes #24). A text's tokens join it later for the
        cost of their rows (_cover)."""
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
        costs what any proposal does rather than a catch-up on the whole prompt (perf-notes #27)."""
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
