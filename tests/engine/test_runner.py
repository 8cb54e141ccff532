"""The Runner's operations (acquire, release, reusable_prefix, trim, extend) on a stand-in step
that shows what it was sent, and speculation's accept as a pure function."""

import threading

import numpy as np
import pytest

from kwker.runner import Feed, Runner
from kwker.speculative import accept

VOCAB = 10


class EchoStep:
    """The native Model's interface; a row's most likely next token is its token + 1 (mod VOCAB),
    and its logits row says so. Records every call."""

    n_slots, max_cache_len, max_step_tokens, max_out_rows = 3, 16, 4, 3
    isa, threads, weight_bytes_per_token = "echo", 1, 0

    def __init__(self):
        self.calls = []
        self._logits = np.zeros((self.max_out_rows, VOCAB), np.float32)  # (max_out_rows, vocab)

    def step(self, tokens, slots, positions, out_rows):
        self.calls.append((tokens.tolist(), slots.tolist(), positions.tolist(), out_rows.tolist()))
        nxt = (tokens[out_rows] + 1) % VOCAB
        self._logits[:] = 0
        self._logits[np.arange(len(out_rows)), nxt] = 1.0
        return nxt.astype(np.int32)

    def logits(self, rows):
        return self._logits[:rows]


@pytest.fixture
def runner():
    return Runner(EchoStep())


def test_accept_keeps_the_proposals_the_target_agrees_with():
    assert accept([], [5]) == 0  # nothing proposed
    assert accept([1, 2, 3], [1, 2, 3, 4]) == 3  # all kept, plus the target's own next token
    assert accept([1, 2, 3], [1, 9]) == 1  # the second differs: one kept
    assert accept([1, 2, 3], [7]) == 0
    assert accept([1, 2, 3], [1, 2]) == 2  # verification stopped early (end of text)
    cands, picks = [4, 4], [4, 4, 4]
    accept(cands, picks)
    assert cands == [4, 4] and picks == [4, 4, 4]  # pure: nothing changed


def test_acquire_and_release(runner):
    assert runner.free_slots == 3
    assert [runner.acquire(), runner.acquire()] == [0, 1]  # the lowest free slots
    with pytest.raises(RuntimeError, match="slot 1 is in use"):
        runner.acquire(1)
    assert runner.acquire() == 2
    with pytest.raises(RuntimeError, match="all 3 slots"):
        runner.acquire()
    runner.release(1)
    assert runner.free_slots == 1 and runner.acquire(1) == 1
    for bad in (-1, 3, 1.0, True, "0"):
        with pytest.raises(ValueError, match="slot must be an integer in 0..2"):
            runner.acquire(bad)
        with pytest.raises(ValueError, match="slot must be an integer"):
            runner.release(bad)
    runner.release(0)
    with pytest.raises(ValueError, match="slot 0 is not in use"):
        runner.release(0)


def test_extend_runs_feeds_in_one_step_and_records_them(runner):
    a, b = runner.acquire(), runner.acquire()
    rows = runner.extend([Feed(a, 0, [1, 2, 3], "last"), Feed(b, 0, [5], "all")])
    assert runner._step.calls == [([1, 2, 3, 5], [a, a, a, b], [0, 1, 2, 0], [2, 3])]
    assert rows[0].argmax == [4] and rows[1].argmax == [6]
    assert rows[0].logits.shape == (1, VOCAB) and rows[0].logits[0].argmax() == 4
    assert runner.cached_len(a) == 3 and runner.cached_len(b) == 1
    rows = runner.extend([Feed(a, 3, [7, 8], "all"), Feed(b, 1, [2], "none")], logits=False)
    assert rows[0].argmax == [8, 9] and rows[1].argmax == [] and rows[0].logits is None
    assert runner.reusable_prefix(a, [1, 2, 3, 7, 8, 0]) == 5


def test_extend_refuses_a_wrong_position_and_bad_feeds(runner):
    s = runner.acquire()
    runner.extend([Feed(s, 0, [1, 2])])
    with pytest.raises(ValueError, match="go at position 2, after its 2 cached tokens, not at 1"):
        runner.extend([Feed(s, 1, [3])])
    with pytest.raises(ValueError, match="not at 5"):
        runner.extend([Feed(s, 5, [3])])  # past the end: a gap of unknown tokens
    with pytest.raises(ValueError, match="slot 1 is not acquired"):
        runner.extend([Feed(1, 0, [3])])
    with pytest.raises(ValueError, match="fed twice"):
        runner.extend([Feed(s, 2, [3]), Feed(s, 3, [4])])
    with pytest.raises(ValueError, match="at most 4 tokens"):
        runner.extend([Feed(s, 2, [1, 2, 3, 4, 5])])
    with pytest.raises(ValueError, match="exceed max_cache_len 16"):
        runner.extend_slot(s, 2, list(range(15)))
    with pytest.raises(ValueError, match="rows must be"):
        runner.extend([Feed(s, 2, [3], "first")])
    with pytest.raises(ValueError, match="at least one"):
        runner.extend([Feed(s, 2, [])])
    assert runner.cached_len(s) == 2 and len(runner._step.calls) == 1  # nothing ran or changed
    runner.extend([Feed(s, 2, [3])])  # still works
    assert runner.cached_len(s) == 3


def test_trim_forgets_the_tail_and_stops_at_the_start(runner):
    s = runner.acquire()
    runner.extend_slot(s, 0, [1, 2, 3, 4, 5, 6])
    assert runner.trim(s, 2) == 2 and runner.cached_len(s) == 4
    assert runner.trim(s, 0) == 0 and runner.cached_len(s) == 4
    assert runner.trim(s, 10) == 4 and runner.cached_len(s) == 0  # past the start: all there were
    with pytest.raises(ValueError, match="non-negative"):
        runner.trim(s, -1)
    with pytest.raises(ValueError, match="slot must be"):
        runner.trim(7, 1)


def test_reusable_prefix_never_covers_the_last_token(runner):
    s = runner.acquire()
    runner.extend_slot(s, 0, [1, 2, 3, 4])
    assert runner.reusable_prefix(s, [1, 2, 3, 4, 5]) == 4
    assert runner.reusable_prefix(s, [1, 2, 3, 4]) == 3  # the last token runs again, for logits
    assert runner.reusable_prefix(s, [1, 2, 9, 4, 5]) == 2
    assert runner.reusable_prefix(s, [7]) == 0
    with pytest.raises(ValueError, match="slot must be"):
        runner.reusable_prefix(3, [1])


def test_acquire_clears_a_fresh_slot_and_keeps_a_named_one(runner):
    s = runner.acquire()
    runner.extend_slot(s, 0, [1, 2, 3])
    runner.release(s)
    assert runner.acquire(s) == s and runner.cached_len(s) == 3  # named: kept, for a continuation
    runner.release(s)
    assert runner.acquire() == s and runner.cached_len(s) == 0  # fresh: a new text
    with pytest.raises(RuntimeError, match="in use"):
        runner.reset()
    runner.release(s)
    runner.reset()


def test_a_slot_serves_only_its_owners_text_and_the_best_free_slot_shares_most(runner):
    a = runner.acquire(None, "alice")
    runner.extend_slot(a, 0, [1, 2, 3, 4])
    runner.release(a)
    b = runner.acquire(runner.best_free_slot([1, 2, 7], "bob"), "bob")  # not alice's
    assert b != a
    runner.extend_slot(b, 0, [1, 2, 7])
    runner.release(b)
    # alice's longest shared prefix is her own slot's; bob's too; a newcomer gets the empty slot
    assert runner.best_free_slot([1, 2, 3, 4, 5], "alice") == a
    assert runner.best_free_slot([1, 2, 3, 4, 5], "bob") == b
    empty = runner.best_free_slot([1, 2, 3, 4, 5], "carol")
    assert empty not in (a, b)
    runner.extend_slot(runner.acquire(empty, "carol"), 0, [9])  # every slot now holds a text
    runner.release(empty)
    assert runner.best_free_slot([5], "dave") == a  # none shares: the least recently used
    # another owner's slot is cleared when taken: nothing of alice's text serves carol
    assert runner.acquire(a, "carol") == a and runner.cached_len(a) == 0
    assert runner.lend(b, "carol") == b and runner.cached_len(b) == 0
    assert runner.best_free_slot([9, 1], "carol") == empty
    runner.acquire(empty, "carol")
    assert runner.best_free_slot([1], "carol") is None  # all in use


def test_extend_slot_chunks_and_copies(runner):
    s = runner.acquire()
    rows = runner.extend_slot(s, 0, [1, 2, 3, 4, 5, 6, 7], rows="all")  # at most 3 rows per step
    assert [len(c[0]) for c in runner._step.calls] == [3, 3, 1]
    assert rows.argmax == [2, 3, 4, 5, 6, 7, 8] and rows.logits.shape == (7, VOCAB)
    assert rows.logits.argmax(axis=1).tolist() == rows.argmax  # a copy: later steps left it alone
    rows = runner.extend_slot(s, 7, [1, 2, 3, 4, 5], rows="last")  # 4 tokens a step, last row only
    assert [c[3] for c in runner._step.calls[3:]] == [[], [0]] and rows.argmax == [6]
    assert runner.cached_len(s) == 12


def test_hold_makes_other_threads_wait_and_lets_its_thread_in_again(runner):
    order = []

    def take():
        with runner.hold():
            order.append("other")

    with runner.hold():
        with runner.hold():  # the same thread: no deadlock
            order.append("inner")
        other = threading.Thread(target=take)
        other.start()
        other.join(0.2)
        assert other.is_alive()  # waits for the holder
        order.append("holder done")
    other.join(5)
    assert order == ["inner", "holder done", "other"]
