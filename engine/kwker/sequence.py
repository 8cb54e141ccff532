"""One sequence being generated: what it feeds the next native step (prefill chunk, or its last token plus
proposals) and what it makes of that step's rows (accept, emit, finish). The single-stream generator, the batch
and the serving engine all drive sequences through this one mechanism."""

from __future__ import annotations

import time

from kwker.sampling import Sampler
from kwker.speculative import Speculator
from kwker.streaming import GenerationChunk, GenerationStats, StreamingDetokenizer


class SequenceState:
    def __init__(self, prompt: list[int], max_new_tokens: int, sampler: Sampler, spec: Speculator, tokenizer=None,
                 slot: int = 0, reused: int = 0):
        self.prompt = prompt
        self.tokens = list(prompt)  # prompt + emitted tokens
        self.max_new_tokens = max_new_tokens
        self.sampler = sampler
        self.spec = spec
        self.slot = slot
        self.prefilled = reused  # prompt tokens whose K/V are in the cache
        self.stats = GenerationStats(prompt_tokens=len(prompt), reused_prompt_tokens=reused)
        self.detok = StreamingDetokenizer(tokenizer) if tokenizer is not None else None
        self.eos = set(sampler.params.eos_token_ids)
        self.fast = not sampler.needs_logits  # greedy without processors: the native argmax is the answer
        self.finish_reason: str | None = None
        self._source: str | None = None
        self._cands: list[int] = []
        self._draft_s = 0.0
        self._first_token_time = 0.0  # when prefill gave the first new token: decoding's wall-clock starts there

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
        return self.tokens[len(self.prompt):]

    def plan(self, prefill_chunk: int) -> tuple[list[int], int, str]:
        """(tokens to feed, position of the first, rows wanted: "none", "last" or "all")."""
        if self.in_prefill:
            end = min(len(self.prompt), self.prefilled + prefill_chunk)
            return self.prompt[self.prefilled:end], self.prefilled, "last" if end == len(self.prompt) else "none"
        draft_s = self.spec.draft_s
        self._source, self._cands = self.spec.propose(self.tokens, self.max_new_tokens - self.stats.new_tokens - 1)
        self._draft_s = self.spec.draft_s - draft_s
        return [self.tokens[-1]] + self._cands, len(self.tokens) - 1, "all" if self._cands else "last"

    def _pick(self, row: int, argmax, logits, new: list[int]) -> int:
        """The token for `row`, after the tokens so far and `new` (this step's picks before it)."""
        if self.fast:
            return argmax[row]
        u = self.sampler.draw() if self.sampler.params.do_sample else None
        return self.sampler.choose(logits[row], self.tokens + new, u)

    def absorb(self, n_fed: int, argmax: list[int], logits, seconds: float) -> list[GenerationChunk]:
        """Takes the step's rows for this sequence (as plan asked) and returns the chunks of the tokens it
        verified."""
        if self.in_prefill:
            self.prefilled += n_fed
            self.stats.prefill_s += seconds
            if self.in_prefill:
                return []
            self._first_token_time = time.perf_counter()
            return self._emit([self._pick(-1, argmax, logits, [])], 0)
        new: list[int] = []
        cands = self._cands
        for row in range(len(cands) + 1):  # accept: keep a proposal iff it is what the target picks there
            new.append(self._pick(row, argmax, logits, new))
            if row == len(cands) or new[-1] != cands[row] or new[-1] in self.eos or \
                    self.stats.new_tokens + len(new) >= self.max_new_tokens:
                break
        accepted = 0
        if self._source:
            accepted = len(new) if new == cands[:len(new)] else len(new) - 1
            self.stats.proposed[self._source] = self.stats.proposed.get(self._source, 0) + len(cands)
            self.stats.accepted[self._source] = self.stats.accepted.get(self._source, 0) + accepted
        self.spec.feedback(self._source, len(cands), accepted, n_fed, seconds, new[0])
        self.stats.steps += 1
        self.stats.draft_s += self._draft_s
        self.stats.decode_s = time.perf_counter() - self._first_token_time
        return self._emit(new, accepted)

    def _emit(self, new: list[int], accepted: int) -> list[GenerationChunk]:
        """Emits the verified tokens; the first `accepted` of them were proposals."""
        chunks = []
        for i, tok in enumerate(new):
            self.tokens.append(tok)
            self.stats.new_tokens += 1
            finish = "eos" if tok in self.eos else ("length" if self.stats.new_tokens == self.max_new_tokens
                                                    else None)
            text = self.detok.add(tok) if self.detok else ""
            if finish and self.detok:
                text += self.detok.flush()
            chunks.append(GenerationChunk(token=tok, text=text, stats=self.stats, finish_reason=finish,
                                          source=self._source if i < accepted else None))
            if finish:
                self.finish_reason = finish
                break
        return chunks

    def cancel(self) -> None:
        if not self.done:
            self.finish_reason = "cancelled"
