"""Several sequences per native step: each active sequence adds its feed (a prefill chunk, or its last token plus
its own lookup proposals) to one call, so the weights are read once for all of them. Batch invariance makes every
sequence's tokens the ones it gets alone."""

from __future__ import annotations

import time
from contextlib import contextmanager
from collections import deque

import numpy as np
import torch

from kwker.sequence import SequenceState
from kwker.streaming import GenerationChunk

DEFAULT_PREFILL_CHUNK = 64  # prompt tokens a newcomer adds per step, so running streams keep flowing


@contextmanager
def one_torch_thread():
    """torch on one intra-op thread for the block (restored after, also on error). Between two native steps torch's
    ops are small or vocabulary-sized (too small to share), and each op on two or more threads wakes torch's OpenMP
    workers, which then spin-wait on the cores the next native step's threads need. Measured on SmolLM2 int4, 2
    cores: seeded top-p sampling 57 -> 100+ tokens/s (the torch sampler of the time); transformers' own generate
    loop through install(), greedy 93 -> 230+."""
    n = torch.get_num_threads()
    if n == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(n)


class BatchRunner:
    def __init__(self, decoder, prefill_chunk: int = DEFAULT_PREFILL_CHUNK):
        self.dec = decoder
        self.prefill_chunk = min(prefill_chunk, decoder._step.max_step_tokens)

    def step(self, seqs: list[SequenceState]) -> list[tuple[SequenceState, list[GenerationChunk]]]:
        """One round: every sequence's plan, packed into as few native steps as the step limits allow."""
        if all(seq.fast for seq in seqs):  # torch is not used: the native argmax is every answer
            return self._step(seqs)
        with one_torch_thread():
            return self._step(seqs)

    def _step(self, seqs):
        plans = [(seq, *seq.plan(self.prefill_chunk)) for seq in seqs]
        native = self.dec._step
        out, group, tokens, out_rows = [], [], 0, 0
        for plan in plans:
            n, rows = len(plan[1]), {"none": 0, "last": 1, "all": len(plan[1])}[plan[3]]
            if group and (tokens + n > native.max_step_tokens or out_rows + rows > native.max_out_rows):
                out.extend(self._run_group(group))
                group, tokens, out_rows = [], 0, 0
            group.append(plan)
            tokens, out_rows = tokens + n, out_rows + rows
        if group:
            out.extend(self._run_group(group))
        return out

    def _run_group(self, group):
        ids, slots, positions, out_rows, spans = [], [], [], [], []
        for seq, feed, start, rows in group:
            base = len(ids)
            ids.extend(feed)
            slots.extend([seq.slot] * len(feed))
            positions.extend(range(start, start + len(feed)))
            first = len(out_rows)
            if rows == "all":
                out_rows.extend(range(base, base + len(feed)))
            elif rows == "last":
                out_rows.append(base + len(feed) - 1)
            spans.append((first, len(out_rows)))
        need_logits = any(not seq.fast and rows != "none" for seq, _, _, rows in group)
        for seq, _, start, _ in group:  # what stays valid if the step fails midway
            del self.dec._cached[seq.slot][start:]
        t0 = time.perf_counter()
        argmax = self.dec._step.step(np.asarray(ids, np.int32), np.asarray(slots, np.int32),
                                       np.asarray(positions, np.int32), np.asarray(out_rows, np.int32)).tolist()
        # a view of the native buffer, valid until the next step: absorb reads it before then (a copy of 9 rows of a
        # 49k vocabulary was ~0.3 ms, charged to wide verify steps)
        logits = torch.from_numpy(self.dec._step.logits(len(out_rows))) if need_logits else None
        seconds = time.perf_counter() - t0
        results = []
        for (seq, feed, start, rows), (a, b) in zip(group, spans):
            chunks = seq.absorb(len(feed), argmax[a:b], None if logits is None else logits[a:b], seconds)
            self.dec._cached[seq.slot].extend(seq.tokens[start:seq.cached_len])  # this step's verified tokens
            results.append((seq, chunks))
        return results


def generate_batch(decoder, prompts, max_new_tokens: int = 20, *, generator=None, tokenizer=None,
                   prefill_chunk: int = DEFAULT_PREFILL_CHUNK, **options) -> list[torch.Tensor]:
    """Generates for every prompt, max_batch at a time (continuous: a finished sequence's slot goes to the next
    prompt at once). Returns one 1-D tensor per prompt, prompt + new tokens, in the prompts' order."""
    if isinstance(prompts, torch.Tensor) and prompts.dim() == 2:
        prompts = list(prompts)
    prompts = [decoder._check_ids(p) for p in prompts]
    if isinstance(generator, torch.Generator) and len(prompts) > 1:
        raise ValueError("pass one generator per prompt (a list), so that each sequence samples what it "
                         "would alone")
    generators = list(generator) if isinstance(generator, (list, tuple)) else [generator] * len(prompts)
    if len(generators) != len(prompts):
        raise ValueError(f"{len(generators)} generators for {len(prompts)} prompts")
    seqs = [decoder.new_sequence(p, max_new_tokens, generator=g, tokenizer=tokenizer, **options)
            for p, g in zip(prompts, generators)]
    waiting, active, free = deque(seqs), [], list(range(decoder.max_batch))[::-1]
    runner = BatchRunner(decoder, prefill_chunk)
    while waiting or active:
        while waiting and free:
            seq = waiting.popleft()
            seq.slot = free.pop()
            decoder._cached[seq.slot] = []
            active.append(seq)
        runner.step(active)
        for seq in [s for s in active if s.done]:
            active.remove(seq)
            free.append(seq.slot)
    return [torch.tensor(seq.tokens, dtype=torch.long) for seq in seqs]
