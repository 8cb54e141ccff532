"""The scheduler: admit, step, retire. Every way of generating drives its sequences through it: one
stream (stream_generate), a batch (generate_batch) and the serving engine's requests arriving over
time.

Each step packs every active sequence's plan (a prefill chunk, or its last token plus its proposals)
into as few native steps as the step's limits allow, so the weights are read once for all of them.
Batch invariance makes every sequence's tokens the ones it gets alone. Per sequence, a step is
speculation's four parts: propose (the sequence's plan), verify (the native step), accept (the
sequence's absorb) and rollback (Runner.trim of the rejected tail).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Iterable
from contextlib import contextmanager

from kwker.runner import Feed, Runner
from kwker.sequence import SequenceState
from kwker.streaming import GenerationChunk

DEFAULT_PREFILL_CHUNK = 64  # prompt tokens a newcomer adds per step: running streams keep flowing


@contextmanager
def one_torch_thread():
    """torch on one intra-op thread for the block (restored after, also on error). Between two
    native steps torch's ops are small or vocabulary-sized (too small to share), and each op on two
    or more threads wakes torch's OpenMP workers, which then spin-wait on the cores the next native
    step's threads need (perf-notes #2). Without torch loaded, nothing to limit: imports nothing."""
    torch = sys.modules.get("torch")
    if torch is None:
        yield
        return
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class Scheduler:
    def __init__(self, runner: Runner, prefill_chunk: int = DEFAULT_PREFILL_CHUNK):
        self.runner = runner
        self.prefill_chunk = min(prefill_chunk, runner.max_step_tokens)
        self.active: list[SequenceState] = []
        # sequences waiting for a slot (run's queue; a server's own): a free slot is theirs, not
        # a branch's
        self.waiting: int = 0

    @property
    def has_room(self) -> bool:
        return self.runner.free_slots > 0

    def admit(self, seq: SequenceState, slot: int | None = None) -> None:
        """Gives seq a slot (see Runner.acquire: None for a fresh one) and starts it after the
        prompt tokens that slot's cache already holds (if they are its tenant's)."""
        slot = self.runner.acquire(slot, seq.tenant)
        reused = self.runner.reusable_prefix(slot, seq.prompt)
        self.runner.trim(slot, self.runner.cached_len(slot) - reused)  # the slot's old text
        seq.place(slot, reused)
        self.active.append(seq)

    def retire(self, seq: SequenceState) -> None:
        """Takes seq out of the batch and frees its slot (its cache keeps what it verified)."""
        self.active.remove(seq)
        self.runner.release(seq.slot)

    def close(self) -> None:
        """Retires every sequence still active (a closed stream, a failed step)."""
        for seq in list(self.active):
            self.retire(seq)

    def step(self) -> list[tuple[SequenceState, list[GenerationChunk]]]:
        """One round: every active sequence's plan, in as few native steps as the limits allow.
        Returns each sequence's new chunks; the sequences that finished are retired.

        A failure is its sequence's own: a sequence whose plan or absorb raises ends with
        finish_reason "error" and the exception in seq.error, and a native step that raises is
        run again feed by feed, so that only the feed it fails on ends. The others go on, with
        the tokens they get alone (a failed step leaves the slots' records as they were)."""
        if all(seq.fast for seq in self.active):  # no torch: the native argmax is every answer
            results = self._step()
        else:
            with one_torch_thread():
                results = self._step()
        for seq, _ in results:
            if seq.done:
                self.retire(seq)
        return results

    def run(self, seqs: Iterable[SequenceState]) -> None:
        """Runs every sequence to its end, as many at a time as there are slots (continuous: a
        finished sequence's slot goes to the next one at once)."""
        waiting = deque(seqs)
        try:
            while waiting or self.active:
                # with nothing active, admitting without room raises: the slots are held elsewhere
                while waiting and (self.has_room or not self.active):
                    self.admit(waiting.popleft())
                self.waiting = len(waiting)
                for seq, _ in self.step():
                    if seq.error is not None:  # a batch call fails as a whole
                        raise seq.error
        finally:
            self.close()

    def _step(self):
        plans = []  # (sequence, its feed)
        out = []
        for seq in self.active:
            try:
                tokens, start, rows = seq.plan(self.prefill_chunk)
            except Exception as e:  # noqa: BLE001  (its proposer failed: it ends, not the batch)
                seq.fail(e)
                out.append((seq, []))
                continue
            feeds = [Feed(seq.slot, start, tokens, rows)]
            branch = self._branch(seq, feeds[0])
            if branch is not None:
                feeds.append(branch)
            plans.append((seq, feeds))
        group, tokens, rows = [], 0, 0
        try:
            for seq, feeds in plans:
                size = sum(len(f.tokens) for f in feeds)
                n_rows = sum(f.n_rows for f in feeds)
                if group and (
                    tokens + size > self.runner.max_step_tokens
                    or rows + n_rows > self.runner.max_out_rows
                ):
                    out.extend(self._run_group(group))
                    group, tokens, rows = [], 0, 0
                group.append((seq, feeds))
                tokens, rows = tokens + size, rows + n_rows
            if group:
                out.extend(self._run_group(group))
        finally:
            for _, feeds in plans:  # the lent slots go back, their records kept
                for f in feeds[1:]:
                    self.runner.release(f.slot)
        return out

    def _branch(self, seq: SequenceState, main: Feed) -> Feed | None:
        """The feed of the sequence's planned branch, in a slot lent for this step (the one its
        last branch ran in, if free: its cache then mostly holds the text already), or None where
        no branch is planned, no slot is free (a free slot goes to a waiting sequence first) or
        the two feeds would not fit one step."""
        if not seq.wants_branch or not self.runner.branches or self.waiting:
            return None
        slot = self.runner.lend(seq.branch_slot, seq.tenant)
        if slot is None:
            return None
        feed = seq.branch_feed(slot)
        r = self.runner
        if (
            feed.start + len(feed.tokens) > r.max_cache_len
            or len(main.tokens) + len(feed.tokens) > r.max_step_tokens
            or main.n_rows + feed.n_rows > r.max_out_rows
        ):
            r.release(slot)
            return None
        seq.branch_slot = slot
        return feed

    def _run_group(self, group):
        """One native step for the group's feeds: verify; then each sequence accepts and rolls
        back."""
        need_logits = any(seq.wants_logits and feeds[0].n_rows for seq, feeds in group)
        results = []
        # The logits are a view of the step's buffer, valid until the next step: absorb reads them
        # in place, under the lock (a copy of a wide verify step's rows would be charged to its
        # cost; perf-notes #3).
        with self.runner.lock:
            t0 = time.perf_counter()
            try:
                outputs = self.runner.extend(
                    [f for _, feeds in group for f in feeds], logits=need_logits
                )
            except Exception as e:  # noqa: BLE001  (see step: the failure is one feed's)
                if len(group) > 1:
                    return [r for one in group for r in self._run_group([one])]
                group[0][0].fail(e)
                return [(group[0][0], [])]
            seconds = time.perf_counter() - t0
            at = 0
            for seq, feeds in group:
                feed, rows = feeds[0], outputs[at]
                branch = outputs[at + 1] if len(feeds) > 1 else None
                at += len(feeds)
                try:
                    chunks = seq.absorb(len(feed.tokens), rows.argmax, rows.logits, seconds, branch)
                except Exception as e:  # noqa: BLE001  (its sampler or detokenizer failed)
                    # its slot's records stay true (they hold only what the step computed), so
                    # no rollback: the slot's cache is as reusable as any other
                    seq.fail(e)
                    results.append((seq, []))
                    continue
                if seq.took_branch is not None:  # the branch's rows replace the chain's tail
                    position, n = seq.took_branch
                    self.runner.trim(seq.slot, self.runner.cached_len(seq.slot) - position)
                    self.runner.copy(feeds[1].slot, seq.slot, position, n)
                rejected = self.runner.cached_len(seq.slot) - seq.cached_len
                self.runner.trim(seq.slot, rejected)  # rollback
                results.append((seq, chunks))
        return results
