"""One sequence being generated: what it feeds the next native step (prefill chunk, or its last
token plus proposals) and what it makes of that step's rows (verify, accept, emit, finish). The
scheduler drives every sequence through this one mechanism: the single stream, the batch and the
serving engine."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import numpy as np

from kwker import _native
from kwker.runner import Feed, Rows
from kwker.sampling import CLOSE, Sampler
from kwker.speculative import Speculator, accept
from kwker.streaming import GenerationChunk, GenerationStats, StreamingDetokenizer

if TYPE_CHECKING:
    from kwker.constrained import Constraint


class SequenceState:
    def __init__(
        self,
        prompt: list[int],
        max_new_tokens: int,
        sampler: Sampler,
        spec: Speculator,
        tokenizer=None,
        logprobs: int | None = None,
        constraint: Constraint | None = None,
    ):
        """constraint: a grammar every new token follows (see kwker.constrained)."""
        self.prompt = prompt
        self.tokens = list(prompt)  # prompt + emitted tokens
        self.max_new_tokens = max_new_tokens
        self.sampler = sampler
        self.spec = spec
        self.slot: int | None = None  # the runner's slot, from admission (see place)
        # whose text it is: a server's API key (see Runner.acquire); None for a caller's own
        self.tenant: object = None
        self.prefilled = 0  # prompt tokens whose K/V are in the cache
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.stats.meter.earlier = spec.costs.recent_plain(
            time.perf_counter(), self.stats.meter.REFERENCE_AGE
        )
        spec.meter = self.stats.meter  # it asks for a plain step now and then (kwker.speedup)
        self.detok = StreamingDetokenizer(tokenizer) if tokenizer is not None else None
        self.eos = set(sampler.params.eos_token_ids)
        self.constraint = constraint
        self.logprobs = logprobs  # None, or how many alternatives each chunk reports
        self._set_fast()
        self.finish_reason: str | None = None
        self.error: BaseException | None = None  # why it failed (finish_reason "error")
        self._source: str | None = None
        self._cands: list[int] = []
        # the tree's branch of this step, if planned (i, tokens: see Speculator.branch), and where
        # the branch won: (position, rows) of its rows the chain's slot takes back (see took_branch)
        self._branch: tuple[int, list[int]] | None = None
        self.took_branch: tuple[int, int] | None = None
        self.branch_slot: int | None = None  # the slot its latest branch ran in (to reuse)
        self._draft_s = 0.0
        self._planned_at = 0.0  # when the current decode step's plan began (its time: see absorb)
        # when prefill gave the first new token (perf_counter): decoding's wall-clock starts there
        self.first_token_at = 0.0

    def _set_fast(self) -> None:
        """Greedy without processors or an active grammar: the native argmax is the answer. A
        tool constraint (kwker.tools) is active only inside a call, and changes only between
        steps (see _verify), so each step is planned for what it needs."""
        active = self.constraint is not None and getattr(self.constraint, "active", True)
        self.fast = not self.sampler.needs_logits and not active
        self.wants_logits = not self.fast or self.logprobs is not None

    def place(self, slot: int, reused: int) -> None:
        """The slot the sequence runs in, whose cache holds the prompt's first `reused` tokens."""
        self.slot = slot
        self.prefilled = self.stats.reused_prompt_tokens = reused

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def in_prefill(self) -> bool:
        return self.prefilled < len(self.prompt)

    @property
    def cached_len(self) -> int:
        """How many leading tokens of self.tokens have valid K/V in the cache."""
        return self.prefilled if self.in_prefill else len(self.tokens) - 1

    @property
    def new_tokens(self) -> list[int]:
        return self.tokens[len(self.prompt) :]

    def plan(self, prefill_chunk: int) -> tuple[list[int], int, str]:
        """(tokens to feed, position of the first, rows wanted: "none", "last" or "all")."""
        if self.in_prefill:
            end = min(len(self.prompt), self.prefilled + prefill_chunk)
            return (
                self.prompt[self.prefilled : end],
                self.prefilled,
                "last" if end == len(self.prompt) else "none",
            )
        self._planned_at = time.perf_counter()
        self._set_fast()
        room = self.max_new_tokens - self.stats.new_tokens - 1
        forced = self.constraint.forced() if self.constraint is not None else []
        if forced and room > 0:  # the grammar's own proposal: no lookup, no draft this step
            most = self.spec.limit["lookup"] * self.spec.LONG_LOOKUP  # a width steps can take
            self._source, self._cands = "grammar", forced[: min(room, most)]
            self._branch, self._draft_s = None, 0.0
        else:
            draft_s = self.spec.draft_s
            self._source, self._cands = self.spec.propose(self.tokens, room)
            self._branch = self.spec.branch
            self._draft_s = self.spec.draft_s - draft_s
        return (
            [self.tokens[-1]] + self._cands,
            len(self.tokens) - 1,
            "all" if self._cands else "last",
        )

    @property
    def wants_branch(self) -> bool:
        """Whether this step's plan has a branch (see Speculator.branch)."""
        return self._branch is not None

    def branch_feed(self, slot: int) -> Feed | None:
        """The feed of this step's branch in `slot` (a free slot the scheduler lends), if
        planned."""
        if self._branch is None:
            return None
        i, tokens = self._branch
        return Feed(slot, len(self.tokens) + i, tokens, "all", branch_of=self.slot)

    def _pick(self, row: int, argmax, logits, new: list[int]) -> int:
        """The token for `row`, after the tokens so far and `new` (this step's picks before it)."""
        if self.fast:
            if self.constraint is not None:  # an inactive one: it watches for a call's start
                self.constraint.consume(argmax[row])
            return argmax[row]
        scores = logits[row]
        if self.constraint is not None and getattr(self.constraint, "active", True):
            scores = self.constraint.masked(scores)  # before the sampler (see kwker.constrained)
        u = self.sampler.draw() if self.sampler.params.do_sample else None
        token = self.sampler.choose(scores, self.tokens + new, u)
        if self.constraint is not None:
            self.constraint.consume(token)
        return token

    def absorb(
        self, n_fed: int, argmax: list[int], logits, seconds: float, branch: Rows | None = None
    ) -> list[GenerationChunk]:
        """Takes the step's rows for this sequence (as plan asked; branch: its branch feed's rows,
        if it ran) and returns the chunks of the tokens it verified."""
        if self.in_prefill:
            self.prefilled += n_fed
            self.stats.prefill_s += seconds
            if self.in_prefill:
                return []
            t0 = time.perf_counter()
            self.spec.start(self.prompt)  # a draft reads the prompt: prefill's time, too
            self.first_token_at = time.perf_counter()
            self.stats.prefill_s += self.first_token_at - t0
            first = [self._pick(-1, argmax, logits, [])]
            row = None if logits is None else logits[-1]
            return self._emit(first, 0, self._logprobs([row], first))
        cands = self._cands
        new, rows = self._verify(argmax, logits, branch)
        accepted = accept(cands, new)
        kept = len(new) - 1 if len(new) > accepted + 1 else accepted  # proposals among new
        branched = len(self._branch[1]) if branch is not None else 0  # the branch's tokens
        if self._source:
            self.stats.proposed[self._source] = (
                self.stats.proposed.get(self._source, 0) + len(cands) + branched
            )
            self.stats.accepted[self._source] = self.stats.accepted.get(self._source, 0) + kept
        fed = n_fed + branched
        self.stats.branches += branch is not None
        self.stats.branches_taken += self.took_branch is not None
        # the grammar's proposals teach speculation nothing of the text's (its timing, though)
        source = None if self._source == "grammar" else self._source
        self.spec.feedback(source, len(cands), accepted, fed, seconds, new)
        self.stats.steps += 1
        self.stats.draft_s += self._draft_s
        chunks = self._emit(new, kept, self._logprobs(rows, new))
        now = time.perf_counter()
        self.stats.decode_s = now - self.first_token_at
        if self.stats.add_step(self._source, fed, len(chunks), now - self._planned_at):
            self.spec.costs.add_plain(now - self._planned_at, now)  # for the next answers
        return chunks

    def _verify(self, argmax, logits, branch: Rows | None):
        """The target's own tokens, row by row, as far as they agree with the proposals: the first
        one that differs (or ends the text) is the last. Rows past it are not picked, so a sampled
        row draws its number only when its token is emitted. Where the chain fails exactly where
        the branch starts and the target's token is the branch's first, the branch's rows go on.
        Returns the tokens and, per token, the logits it was picked from (for logprobs)."""
        new: list[int] = []
        rows: list = []  # per new token: its row of logits (None without logits)
        self.took_branch = None

        def run(cands, argmax, logits) -> bool:
            """Picks along one path's rows; whether every candidate was kept."""
            for row in range(len(cands) + 1):
                new.append(self._pick(row, argmax, logits, new))
                rows.append(None if logits is None else logits[row])
                if new[-1] in self.eos or self.stats.new_tokens + len(new) >= self.max_new_tokens:
                    return False
                if getattr(self.constraint, "switched", False):
                    # a call opened or closed: the rows after it were planned for the other mask
                    return False
                if row == len(cands) or new[-1] != cands[row]:
                    return row == len(cands)
            return True

        run(self._cands, argmax, logits)
        if branch is not None and not getattr(self.constraint, "switched", False):
            i, tokens = self._branch
            if len(new) == i + 1 and self.stats.new_tokens + len(new) < self.max_new_tokens:
                self.spec.branch_feedback(new[-1] == tokens[0])
                if new[-1] == tokens[0] and new[-1] not in self.eos:
                    start = len(new)  # the branch's first token is new[-1]: its rows go on
                    run(tokens[1:], branch.argmax, branch.logits)
                    # the chain's slot takes the branch's rows of every token it verified but
                    # the last (which is not run): positions from its first token on
                    self.took_branch = (len(self.tokens) + i, len(new) - start)
        return new, rows

    def _logprobs(self, rows: list, tokens) -> list:
        """(logprob, top_logprobs) for each token at its row of logits; Nones without logprobs."""
        if self.logprobs is None:
            return [(None, None)] * len(tokens)
        return [
            token_logprobs(row, tok, self.logprobs) for row, tok in zip(rows, tokens, strict=True)
        ]

    def _emit(self, new: list[int], accepted: int, logprobs: list) -> list[GenerationChunk]:
        """Emits the verified tokens; the first `accepted` of them were proposals."""
        chunks = []
        for i, (tok, (lp, top)) in enumerate(zip(new, logprobs, strict=True)):
            self.tokens.append(tok)
            self.stats.new_tokens += 1
            finish = (
                "eos"
                if tok in self.eos
                else ("length" if self.stats.new_tokens == self.max_new_tokens else None)
            )
            text = self.detok.add(tok) if self.detok else ""
            if finish and self.detok:
                text += self.detok.flush()
            chunks.append(
                GenerationChunk(
                    token=tok,
                    text=text,
                    stats=self.stats,
                    finish_reason=finish,
                    source=self._source if i < accepted else None,
                    logprob=lp,
                    top_logprobs=top,
                )
            )
            if finish:
                self.finish_reason = finish
                break
        return chunks

    def cancel(self) -> None:
        if not self.done:
            self.finish_reason = "cancelled"

    def fail(self, error: BaseException) -> None:
        """Ends the sequence because its own step failed (the others in the batch go on)."""
        self.error = error
        self.finish_reason = "error"


def token_logprobs(row, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-softmax of one row of logits at `token`, and its k highest entries (id, value),
    likeliest first. One native pass gives the max, the softmax total and the tokens within CLOSE
    nats of the max, among which the top k almost always are."""
    x = row.numpy() if hasattr(row, "numpy") else np.asarray(row, dtype=np.float32)
    m, total, close = _native.softmax_stats(x, 1.0, CLOSE)
    log_z = float(m) + math.log(total)
    top: list[tuple[int, float]] = []
    if k:
        pool = close if len(close) >= k else np.arange(len(x))
        best = pool[np.argsort(-x[pool], kind="stable")[:k]]
        top = [(int(t), float(x[t]) - log_z) for t in best]
    return float(x[token]) - log_z, top
