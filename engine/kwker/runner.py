"""Runner: the one owner of a decoder's step (the native Model, or anything with its interface) and
of the record of what each slot of its KV cache holds.

    runner = Runner(step)
    with runner.hold():                    # one generation at a time: other threads wait their turn
        slot = runner.acquire()            # a free slot, its record cleared
        with runner.lock:                  # the step, and the read of its logits
            rows, = runner.extend([Feed(slot, 0, prompt, "last")])
            first = rows.argmax[-1]        # rows.logits: (1, vocab), valid until the next step
        ...
        runner.trim(slot, 3)               # speculation's rollback: forget 3 rejected tokens
        runner.release(slot)

A slot's record is the list of tokens whose K/V the slot's cache holds, position by position. It
changes only here: extend appends what a step ran, trim drops a tail that is no longer wanted,
acquire clears it or keeps it for the next text that shares its prefix. The native cache is never
cleared: positions past the record are stale, and the step that next writes them overwrites them.

Two kinds of exclusivity:
- `lock`: one native step and the read of its logits, which are a view of the step's buffer that
  the next step, from any thread, overwrites. Hold it from extend until the logits are consumed.
- `hold()`: one generation at a time, so that no one edits a slot's record between a generation's
  steps. A stream holds the runner from its first step to its end: a second thread's generation
  waits for the first one's whole text. The holding thread may hold it again (install's generate
  runs its forward calls inside its own hold); a second generation started in that thread then
  finds its slot in use, a clear error instead of a deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from kwker import _native

DEFAULT_STEP_TOKENS = 256  # tokens per native step in prefill (longer prompts go in chunks)
DEFAULT_LOGIT_ROWS = 64  # rows of logits one step can return
ROWS = ("none", "last", "all")  # which of a feed's rows a step returns


@dataclass
class Feed:
    """Tokens for one slot in a step, at positions start.. of its text (right after its record).

    A branch (branch_of: the slot of another feed of the same step, its parent) is a speculation
    tree's second path: its slot first takes what the parent's slot holds (the K/V its record
    lacks are copied), the parent's tokens before this feed's start go into its cache too (the
    same rows, written twice: not run twice), and its tokens follow them. So each of its rows
    attends to the text it would have alone, and gives the logits a plain step would."""

    slot: int
    start: int
    tokens: Sequence[int]
    rows: str = "last"  # one of ROWS
    branch_of: int | None = None

    @property
    def n_rows(self) -> int:
        return {"none": 0, "last": 1, "all": len(self.tokens)}[self.rows]


class Rows(NamedTuple):
    """One feed's share of a step's output."""

    argmax: list[int]  # (R,) the most likely next token after each returned row
    # (R, vocab) float32: from extend a view valid until the next step, from extend_slot a copy
    logits: np.ndarray | None


class _Hold:
    """A lock that its thread may take again and that any thread may let go of: a stream holds it
    from its first step to its end, and may be closed (or collected) on another thread than the one
    that started it."""

    def __init__(self):
        self._changed = threading.Condition()
        self._owner: int | None = None  # the ident of the thread that took it
        self._depth = 0

    def acquire(self) -> None:
        me = threading.get_ident()
        with self._changed:
            if self._owner != me:
                self._changed.wait_for(lambda: self._owner is None)
                self._owner = me
            self._depth += 1

    def release(self) -> None:
        with self._changed:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._changed.notify()


class Runner:
    def __init__(self, step):
        """step: a kwker._native.Model, or an object with its interface (step, logits, n_slots,
        max_cache_len, max_step_tokens, max_out_rows, isa, threads, weight_bytes_per_token)."""
        self._step = step
        self.n_slots = step.n_slots
        self.max_cache_len = step.max_cache_len
        self.max_step_tokens = step.max_step_tokens
        self.max_out_rows = step.max_out_rows
        # per slot, the tokens whose K/V it holds, whose text they are (a server's tenant: one
        # owner's cache never serves another's prompt) and when it was last given back
        self._records: list[list[int]] = [[] for _ in range(self.n_slots)]
        self._owners: list[object] = [None] * self.n_slots
        self._released: list[int] = [0] * self.n_slots
        self._releases = 0
        self._in_use: set[int] = set()
        self.lock = threading.RLock()
        self._hold = _Hold()

    # ------------------------------------------------------------------------------------ info
    @property
    def isa(self) -> str:
        return self._step.isa

    @property
    def threads(self) -> int:
        return self._step.threads

    @property
    def weight_bytes_per_token(self) -> int:
        return self._step.weight_bytes_per_token

    # --------------------------------------------------------------------------------- holding
    @contextmanager
    def hold(self) -> Iterator[Runner]:
        """The runner for one generation, or one call that reads or edits a record: other threads
        wait until it ends."""
        self._hold.acquire()
        try:
            yield self
        finally:
            self._hold.release()

    # ----------------------------------------------------------------------------------- slots
    @property
    def free_slots(self) -> int:
        return self.n_slots - len(self._in_use)

    def acquire(self, slot: int | None = None, owner: object = None) -> int:
        """Takes a slot for one sequence, until release(slot). None: the lowest free slot, its
        record cleared (a new text); a slot number: that slot, its record kept (a chat turn
        continues the previous text) if it is `owner`'s, else cleared."""
        with self.lock:
            if slot is None:
                free = self._free()
                if not free:
                    raise RuntimeError(
                        f"all {self.n_slots} slots of this decoder are in use (an unfinished "
                        "stream_generate in this thread? close it first)"
                    )
                slot = free[0]
                self._records[slot].clear()
            else:
                self._check_slot(slot)
                if slot in self._in_use:
                    raise RuntimeError(
                        f"slot {slot} is in use by an unfinished generation (a stream_generate "
                        "not yet closed, in this thread?): close it first"
                    )
            self._take(slot, owner)
            return slot

    def _free(self) -> list[int]:
        """The slots not in use, lowest first (call it under the lock)."""
        return [s for s in range(self.n_slots) if s not in self._in_use]

    def _take(self, slot: int, owner: object) -> None:
        if self._owners[slot] != owner:
            self._records[slot].clear()
            self._owners[slot] = owner
        self._in_use.add(slot)

    def best_free_slot(self, tokens: Sequence[int], owner: object = None) -> int | None:
        """The free slot to give a new text: the one of `owner`'s whose cache shares the longest
        prefix with `tokens`; failing any, an empty one; failing that, the one given back
        longest ago (least recently used). None when every slot is in use."""
        with self.lock:
            free = self._free()
            if not free:
                return None

            def worth(s: int) -> tuple[int, bool, int]:
                shared = self.reusable_prefix(s, tokens) if self._owners[s] == owner else 0
                return shared, not self._records[s], -self._released[s]

            return max(free, key=worth)

    def lend(self, prefer: int | None = None, owner: object = None) -> int | None:
        """A free slot for one step's branch (see Feed), its record kept if `owner`'s (a branch
        first takes its parent's): `prefer` if free, else the free slot that holds the fewest
        tokens (the least cache lost); None if none is free. Give it back with release."""
        with self.lock:
            free = self._free()
            if not free:
                return None
            slot = prefer if prefer in free else min(free, key=lambda s: len(self._records[s]))
            self._take(slot, owner)
            return slot

    def release(self, slot: int) -> None:
        """Gives the slot back; its record stays, for a later text that shares its prefix."""
        with self.lock:
            self._check_slot(slot)
            if slot not in self._in_use:
                raise ValueError(f"slot {slot} is not in use")
            self._in_use.remove(slot)
            self._releases += 1
            self._released[slot] = self._releases

    def cached_len(self, slot: int) -> int:
        """How many tokens the slot's cache holds (positions 0..cached_len-1)."""
        self._check_slot(slot)
        return len(self._records[slot])

    def reusable_prefix(self, slot: int, tokens: Sequence[int]) -> int:
        """How many leading tokens of `tokens` the slot's cache already holds, never all of them:
        the last token must still be run, for its logits."""
        self._check_slot(slot)
        return _common_prefix(self._records[slot], tokens[:-1])

    def trim(self, slot: int, n: int) -> int:
        """Forgets the slot's last n tokens (all of them if it holds fewer), as mlx-lm's cache trim:
        speculation's rollback of rejected proposals, or a new text that shares only a prefix.
        Returns how many it forgot."""
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"trim takes a non-negative number of tokens, got {n!r}")
        with self.lock:
            self._check_slot(slot)
            record = self._records[slot]
            n = min(n, len(record))
            del record[len(record) - n :]
            return n

    def reset(self) -> None:
        """Forgets every slot's text: the next call prefills its whole prompt."""
        with self.lock:
            if self._in_use:
                raise RuntimeError(
                    f"slots {sorted(self._in_use)} are in use by unfinished generations"
                )
            for record in self._records:
                record.clear()

    def _check_slot(self, slot) -> None:
        if not isinstance(slot, int) or isinstance(slot, bool) or not 0 <= slot < self.n_slots:
            raise ValueError(f"slot must be an integer in 0..{self.n_slots - 1}, got {slot!r}")

    # -------------------------------------------------------------------------------- the step
    def extend(self, feeds: Sequence[Feed], logits: bool = True) -> list[Rows]:
        """Runs every feed's tokens in ONE native step, each at the end of its slot's text, and
        appends them to the slots' records. Returns each feed's rows (see Feed.rows): the argmax
        and, with logits, the float32 logits as a view of the step's buffer, valid until the next
        step (hold `lock` until they are read)."""
        if not feeds:
            raise ValueError("a step needs at least one feed")
        ids, slots, positions, out_rows = [], [], [], []  # (T,), (T,), (T,), (R,)
        also: list[int] = []  # (T,): -1, or the branch slot that also takes the row's K/V
        spans = []  # each feed's rows: out_rows[a:b]
        fed: dict[int, int] = {}  # slot -> where its feed's rows start in ids
        parents: dict[int, Feed] = {}  # a branch's slot -> its parent feed
        for feed in feeds:
            parent = self._check_branch(feed, feeds, fed) if feed.branch_of is not None else None
            self._check_feed(feed, set(fed), parent)
            if parent is not None:  # the parent's rows before the branch are the branch's too
                parents[feed.slot] = parent
                base = fed[parent.slot]
                for i in range(feed.start - parent.start):
                    also[base + i] = feed.slot
            fed[feed.slot] = len(ids)
            base, n = len(ids), len(feed.tokens)
            ids.extend(feed.tokens)
            slots.extend([feed.slot] * n)
            also.extend([-1] * n)
            positions.extend(range(feed.start, feed.start + n))
            first = len(out_rows)
            if feed.rows == "all":
                out_rows.extend(range(base, base + n))
            elif feed.rows == "last":
                out_rows.append(base + n - 1)
            spans.append((first, len(out_rows)))
        if len(ids) > self.max_step_tokens or len(out_rows) > self.max_out_rows:
            raise ValueError(
                f"a step takes at most {self.max_step_tokens} tokens and {self.max_out_rows} "
                f"rows, got {len(ids)} and {len(out_rows)}"
            )
        with self.lock:
            for slot, parent in parents.items():
                self._sync(parent.slot, slot)
            args = [np.asarray(v, np.int32) for v in (ids, slots, positions, out_rows)]
            if parents:
                args.append(np.asarray(also, np.int32))
            argmax = self._step.step(*args).tolist()
            view = self._step.logits(len(out_rows)) if logits and out_rows else None  # (R, vocab)
            for feed in feeds:
                parent = parents.get(feed.slot)
                if parent is not None:  # the shared rows first (see Feed)
                    self._records[feed.slot].extend(parent.tokens[: feed.start - parent.start])
                self._records[feed.slot].extend(feed.tokens)
        return [Rows(argmax[a:b], None if view is None else view[a:b]) for a, b in spans]

    def extend_slot(
        self, slot: int, start: int, tokens: Sequence[int], rows: str = "last", logits: bool = True
    ) -> Rows:
        """extend for one slot and any number of tokens, in as many steps as the step's limits
        need. The logits (the rows' (R, vocab) float32) are a copy: they outlive the steps."""
        if rows not in ROWS:
            raise ValueError(f"rows must be one of {ROWS}, got {rows!r}")
        if not tokens:
            raise ValueError("extend needs at least one token")
        if start + len(tokens) > self.max_cache_len:  # checked before any step runs
            raise ValueError(
                f"{start} + {len(tokens)} tokens exceed max_cache_len {self.max_cache_len}"
            )
        chunk = (
            self.max_step_tokens if rows != "all" else min(self.max_step_tokens, self.max_out_rows)
        )
        n_rows = Feed(slot, start, tokens, rows).n_rows
        argmax: list[int] = []
        # (R, vocab), filled chunk by chunk by numpy: torch's copy (torch.cat) would run on its
        # OpenMP threads, which then spin on the cores the next native step needs (perf-notes #2)
        out = None
        with self.lock:
            for i in range(0, len(tokens), chunk):
                part = tokens[i : i + chunk]
                last = i + len(part) == len(tokens)
                # inner chunks of a "last" or "none" feed only fill the cache
                part_rows = "all" if rows == "all" else (rows if last else "none")
                (got,) = self.extend([Feed(slot, start + i, part, part_rows)], logits=logits)
                if got.logits is not None:
                    if out is None:
                        out = np.empty((n_rows, got.logits.shape[1]), np.float32)
                    out[len(argmax) : len(argmax) + len(got.argmax)] = got.logits
                argmax.extend(got.argmax)
        return Rows(argmax, out)

    def propose_greedy(
        self,
        slot: int,
        start: int,
        tokens: Sequence[int],
        k: int,
        subset: bool = False,
        min_prob: float = 0.0,
        alternatives: bool = False,
    ):
        """A greedy proposal of up to k tokens after `tokens` (fed at positions start.., right after
        the slot's record): ONE native call where the step has one (Model.propose: the steps and
        their argmaxes without a round trip through Python), else step by step. With subset,
        argmaxes over the head rows set_head_subset chose. With min_prob, it stops after the token
        at which the product of the proposed tokens' softmax probabilities falls below min_prob.
        The record gains the tokens and every proposed one but the last (which is not run).
        Returns the tokens; with alternatives, (tokens, each one's probability, the runner-up
        token at each position)."""
        propose = getattr(self._step, "propose", None)
        if propose is None or len(tokens) > self.max_step_tokens:
            if subset:
                raise ValueError("this step has no head subset")
            out: list[int] = []
            probs: list[float] = []
            second: list[int] = []
            feed, at, kept = list(tokens), start, 1.0
            want_logits = min_prob > 0 or alternatives
            while len(out) < k and kept >= min_prob:
                rows = self.extend_slot(slot, at, feed, logits=want_logits)
                out.append(rows.argmax[-1])
                if want_logits:  # as Model.propose: 1 / the sum of exp(logit - max)
                    row = rows.logits[-1]
                    probs.append(1.0 / _native.softmax_stats(row, 1.0, 0.0)[1])
                    kept *= probs[-1]
                    rest = row.copy()
                    rest[out[-1]] = -np.inf
                    second.append(int(np.argmax(rest)))  # the lowest id among equals
                feed, at = out[-1:], at + len(feed)
            return (out, probs, second) if alternatives else out
        self._check_feed(Feed(slot, start, tokens, "last"), set())
        if start + len(tokens) + k - 1 > self.max_cache_len:
            raise ValueError(
                f"{start} + {len(tokens)} + {k - 1} tokens exceed max_cache_len {self.max_cache_len}"
            )
        with self.lock:
            got = propose(
                np.asarray(tokens, np.int32), slot, start, k, subset, min_prob, alternatives
            )
            got = [a.tolist() for a in got] if alternatives else got.tolist()
            out = got[0] if alternatives else got
            self._records[slot].extend(tokens)
            self._records[slot].extend(out[:-1])
        return tuple(got) if alternatives else out

    @property
    def has_head_subset(self) -> bool:
        """Whether the step can run proposals over a subset of the vocabulary's rows."""
        return hasattr(self._step, "set_head_subset")

    @property
    def head_subset_size(self) -> int:
        """Rows of the head subset proposals can use (0: none set, or a step without one)."""
        return getattr(self._step, "head_subset_size", 0)

    def set_head_subset(self, ids: Sequence[int]) -> None:
        """The vocabulary rows (distinct ids) a subset proposal reads."""
        with self.lock:
            self._step.set_head_subset(np.asarray(ids, np.int32))

    @property
    def branches(self) -> bool:
        """Whether steps take branch feeds (the step writes a row to two slots, copies caches)."""
        return hasattr(self._step, "copy_cache")

    def _sync(self, src: int, dst: int) -> None:
        """Makes slot dst hold what slot src holds: the K/V of the positions where their records
        differ are copied from src (a branch slot catching up with its chain)."""
        want = self._records[src]
        same = _common_prefix(self._records[dst], want)
        if same < len(want):
            self._step.copy_cache(src, dst, same, len(want) - same)
        self._records[dst] = list(want)

    def copy(self, src: int, dst: int, start: int, n: int) -> None:
        """Slot dst takes slot src's K/V of positions start..start+n-1 (the accepted rows of a
        branch, back into the chain's slot): its record becomes its first `start` tokens, which
        must be src's, then src's next n."""
        with self.lock:
            self._check_slot(src)
            self._check_slot(dst)
            have, want = self._records[dst], self._records[src]
            if start + n > len(want) or have[:start] != want[:start]:
                raise ValueError(
                    f"slot {dst} does not share slot {src}'s first {start} tokens, or slot {src} "
                    f"holds fewer than {start + n}"
                )
            if n:
                self._step.copy_cache(src, dst, start, n)
            self._records[dst] = want[: start + n]

    def _check_branch(self, feed: Feed, feeds: Sequence[Feed], fed: dict[int, int]) -> Feed:
        """The parent feed of a branch feed (see Feed), checked."""
        if not self.branches:
            raise ValueError("this step takes no branch feeds")
        parent = next((f for f in feeds if f.slot == feed.branch_of), None)
        if parent is None or parent.slot not in fed or parent.branch_of is not None:
            raise ValueError(
                f"a branch of slot {feed.branch_of} needs that slot's own feed earlier in the step"
            )
        if not parent.start < feed.start <= parent.start + len(parent.tokens):
            raise ValueError(
                f"a branch starts after its parent's first token, within its tokens: "
                f"{parent.start} < {feed.start} <= {parent.start + len(parent.tokens)}"
            )
        return parent

    def _check_feed(self, feed: Feed, fed: set[int], parent: Feed | None = None) -> None:
        self._check_slot(feed.slot)
        if feed.slot not in self._in_use:
            raise ValueError(f"slot {feed.slot} is not acquired")
        if feed.slot in fed:
            raise ValueError(f"slot {feed.slot} is fed twice in one step")
        if not feed.tokens:
            raise ValueError("a feed needs at least one token")
        if feed.rows not in ROWS:
            raise ValueError(f"rows must be one of {ROWS}, got {feed.rows!r}")
        # a branch's slot will hold its parent's record, then the parent's rows before the branch
        held = len(self._records[feed.slot]) if parent is None else feed.start
        if feed.start != held:
            raise ValueError(
                f"tokens for slot {feed.slot} go at position {held}, after its {held} cached "
                f"tokens, not at {feed.start} (trim first to overwrite)"
            )
        if feed.start + len(feed.tokens) > self.max_cache_len:
            raise ValueError(
                f"{feed.start} + {len(feed.tokens)} tokens exceed max_cache_len "
                f"{self.max_cache_len}"
            )


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n, limit = 0, min(len(a), len(b))
    while n < limit and a[n] == b[n]:
        n += 1
    return n
