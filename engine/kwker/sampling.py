"""Choosing the next token: transformers' logits processors and warpers, in the order it applies
them, and a sampler that draws ONE uniform number per output position.

Why one number per position: the token at position i is then a pure function of (the model's
distribution at i, u_i). Speculative decoding computes the same distribution at i whether or not a
proposal was made (the kernels are batch-invariant), so a proposed token is kept iff it equals that
sample, and the text for a seed does not depend on lookup or drafts.

The rules are transformers' (RepetitionPenalty, MinNewTokensLength, Temperature, TopK, TopP, MinP;
the tests compare them), computed on the tokens that can survive rather than on the whole
vocabulary: per token, a full pass of torch ops over a 49k-256k vocabulary (softmax, sort, scatter,
twice) cost more than a small model's whole step (SmolLM2-135M int4, the chat app's temperature
0.7 + top-p 0.9: 0.6 ms of a 3.8 ms token; now 0.1 ms). The vocabulary-wide part is one native
pass (softmax_stats); the rest is numpy on the few hundred candidates.

torch is optional here: a torch.Generator or tensor logits work when the caller has torch, and the
module never imports it (the GGUF / safetensors path runs without torch). SeededGenerator gives
torch's seeded stream without torch, so a seed gives the same text on both paths.
"""

from __future__ import annotations

import math
import os
import secrets
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from kwker import _native

if TYPE_CHECKING:
    import torch


def is_tensor(x) -> bool:
    """Whether x is a torch tensor, asked without importing torch: a tensor means torch is
    loaded."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def is_generator(x) -> bool:
    """Whether x is a random generator Sampler takes: a SeededGenerator or a torch.Generator."""
    torch = sys.modules.get("torch")
    return isinstance(x, SeededGenerator) or (torch is not None and isinstance(x, torch.Generator))


_MASK53 = (1 << 53) - 1


class SeededGenerator:
    """A seeded stream of uniform float64 numbers in [0, 1) without torch: the stream of
    torch.Generator().manual_seed(seed) drawn by torch.rand((), dtype=torch.float64) on the CPU, so
    a seed gives the same text on the torch and the torch-free paths (see
    tests/engine/test_torch_free_core.py).

    torch's CPU generator is an MT19937 seeded with the seed's low 32 bits by init_genrand, which
    is numpy's legacy (RandomState) seeding of a 32-bit int; a float64 is two 32-bit outputs
    a, b taken as the low 53 bits of (a << 32 | b), times 2**-53."""

    def __init__(self, seed: int):
        # torch.Generator.manual_seed's range; a negative seed is its 64-bit two's complement,
        # whose low 32 bits are seed & 0xFFFFFFFF
        if not _is_int(seed) or not -(2**63) <= seed < 2**64:
            raise ValueError(f"seed must be an integer in [-2**63, 2**64), got {seed!r}")
        self.seed = int(seed)
        key = np.random.RandomState(self.seed & 0xFFFFFFFF).get_state()[1]
        self._bits = np.random.MT19937(0)  # its own seeding is replaced at once
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": key, "pos": 624}}

    def random(self) -> float:
        # both words in one call: random_raw holds the bit generator's lock, so threads sharing a
        # generator never split a draw's pair
        a, b = self._bits.random_raw(2).tolist()
        return (((a << 32) | b) & _MASK53) * 2.0**-53


_unseeded: SeededGenerator | None = None
_unseeded_lock = threading.Lock()


def _unseeded_generator() -> SeededGenerator:
    """The process's generator for unseeded sampling without torch: like torch's default generator,
    seeded at random once per process and shared by every unseeded call."""
    global _unseeded
    with _unseeded_lock:
        if _unseeded is None:
            _unseeded = SeededGenerator(int.from_bytes(os.urandom(8), "little"))
        return _unseeded


def _uniform_source(generator):
    """The function drawing the next uniform float64 of `generator`, None if it is not one.
    generator=None is torch's default generator when torch is loaded (so torch.manual_seed still
    seeds unseeded calls, as it always did), else the process's own (_unseeded_generator)."""
    if isinstance(generator, SeededGenerator):
        return generator.random
    torch = sys.modules.get("torch")
    if torch is not None and (generator is None or isinstance(generator, torch.Generator)):
        return lambda: float(torch.rand((), generator=generator, dtype=torch.float64))
    if generator is None:
        return _unseeded_generator().random
    return None


@dataclass
class SamplingParams:
    do_sample: bool = False
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    # OpenAI's: subtracted from the score of each token the answer already holds, once (presence)
    # and once per time it occurs (frequency); counted over the new tokens, not the prompt
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_new_tokens: int = 0
    eos_token_ids: list[int] = field(default_factory=list)

    def validate(self) -> None:
        _check_number("temperature", self.temperature, "a positive number", lambda v: v > 0)
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 0):
            raise ValueError(f"top_k must be a non-negative integer, got {self.top_k!r}")
        _check_number("top_p", self.top_p, "in (0, 1]", lambda v: 0 < v <= 1)
        _check_number("min_p", self.min_p, "in [0, 1]", lambda v: 0 <= v <= 1)
        _check_number(
            "repetition_penalty", self.repetition_penalty, "a positive number", lambda v: v > 0
        )
        for name in ("presence_penalty", "frequency_penalty"):
            _check_number(name, getattr(self, name), "a finite number", lambda v: True)
        if not _is_int(self.min_new_tokens) or self.min_new_tokens < 0:
            raise ValueError(
                f"min_new_tokens must be a non-negative integer, got {self.min_new_tokens!r}"
            )


def sampling_options(
    temperature: float,
    *,
    seed: int | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    min_p: float | None = None,
    repetition_penalty: float | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
) -> dict:
    """stream_generate's sampling keyword arguments: the one mapping the app, `kwker serve` and
    the CLI share, so a setting means the same in all three.

    temperature 0 is greedy, and the other sampling options are dropped (they change nothing).
    Above 0 it samples with SeededGenerator(seed), a fresh random seed when seed is None. A
    top_p, top_k or min_p left None takes the model's own default (its generation config); to
    turn one off, pass top_p=1, top_k=0 or min_p=0. Penalties left None are off."""
    opts: dict = {
        name: value
        for name, value in (
            ("repetition_penalty", repetition_penalty),
            ("presence_penalty", presence_penalty),
            ("frequency_penalty", frequency_penalty),
        )
        if value is not None
    }
    if temperature == 0:
        return opts | {"do_sample": False}
    seed = secrets.randbits(63) if seed is None else seed
    opts |= {"do_sample": True, "temperature": float(temperature)}
    opts["generator"] = SeededGenerator(seed)
    for name, value in (("top_p", top_p), ("top_k", top_k), ("min_p", min_p)):
        if value is not None:
            opts[name] = value
    return opts


def _is_int(value) -> bool:
    """An integer (numpy's too), not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_number(name: str, value, rule: str, ok) -> None:
    """None, or a finite real number (not a bool) for which ok(value) holds; else a ValueError
    saying `rule`."""
    if value is None:
        return
    real = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not real or not math.isfinite(value) or not ok(value):
        raise ValueError(f"{name} must be {rule}, got {value!r}")


# Top-p's candidates, widest last: the tokens within CLOSE nats of the most likely one (one cheap
# pass), else the TOP most likely, else the whole vocabulary (a full sort), whichever first holds
# top_p of the probability mass. Top-k looks for its k best among the CLOSE ones, else among the
# WIDE ones, else in the whole vocabulary. The max, the softmax total and the tokens within a
# distance come from one native pass over the scores (32 us for 49k tokens; numpy's passes took
# 165).
CLOSE = 9.0
WIDE = 16.0
TOP = 1024


class Sampler:
    """Turns a row of logits into a token. `needs_logits` is False when the native argmax is the
    answer."""

    def __init__(
        self,
        params: SamplingParams,
        prompt_len: int,
        generator: SeededGenerator | torch.Generator | None,
    ):
        """generator: a SeededGenerator, a torch.Generator, or None (unseeded: see
        _uniform_source)."""
        params.validate()
        p = self.params = params
        self.prompt_len = prompt_len
        self.generator = generator
        self._draw = _uniform_source(generator)
        # refused before any step; a greedy call never draws, so there it stays ignored, as before
        if self._draw is None and p.do_sample:
            raise TypeError(_not_a_generator(generator))
        self.penalty = p.repetition_penalty if p.repetition_penalty not in (None, 1.0) else None
        self.presence = float(p.presence_penalty or 0.0)
        self.frequency = float(p.frequency_penalty or 0.0)
        self.eos = np.array(p.eos_token_ids if p.min_new_tokens > 0 else [], dtype=np.int64)
        self.temperature = (
            p.temperature if p.do_sample and p.temperature not in (None, 1.0) else None
        )
        self.top_k = p.top_k if p.do_sample and p.top_k else 0
        self.top_p = p.top_p if p.do_sample and p.top_p is not None and p.top_p < 1.0 else None
        self.min_p = p.min_p if p.do_sample and p.min_p else None
        self._buffer = None
        self.needs_logits = (
            p.do_sample
            or self.penalty is not None
            or self.presence != 0
            or self.frequency != 0
            or len(self.eos) > 0
        )

    def draw(self) -> float:
        """The uniform number for the next output position (one per position, whatever is
        speculated)."""
        if self._draw is None:
            raise TypeError(_not_a_generator(self.generator))
        return self._draw()

    def choose(self, logits, context, u: float | None) -> int:
        """logits: (vocab,) float32 (tensor or array); context: the prompt and the tokens before
        this position."""
        scores = self.processed(logits, context)
        if not self.params.do_sample:
            return int(np.argmax(scores))
        return self.sample(*self.survivors(scores), u)

    def processed(self, logits, context) -> np.ndarray:
        """The scores after the repetition, presence and frequency penalties and min_new_tokens
        (float32; logits are not modified)."""
        x = logits.numpy() if is_tensor(logits) else np.asarray(logits)
        x = x.astype(np.float32, copy=False)
        n_ctx = context.shape[-1] if is_tensor(context) else len(context)
        suppress_eos = len(self.eos) > 0 and n_ctx - self.prompt_len < self.params.min_new_tokens
        counted = self.presence != 0 or self.frequency != 0
        if self.penalty is None and not counted and not suppress_eos:
            return x
        if self._buffer is None or self._buffer.shape != x.shape:
            # kept: a fresh vocabulary-sized array is page faults on every call
            self._buffer = np.empty_like(x)
        np.copyto(self._buffer, x)
        x = self._buffer
        if (
            self.penalty is not None
        ):  # a context token's score: times the penalty if negative, else divided by it
            ids = np.asarray(context, dtype=np.int64).reshape(-1)
            v = x[ids]
            x[ids] = np.where(v < 0, v * np.float32(self.penalty), v / np.float32(self.penalty))
        if counted:  # OpenAI's rule, over the tokens generated so far
            new = np.asarray(context, dtype=np.int64).reshape(-1)[self.prompt_len :]
            ids, counts = np.unique(new, return_counts=True)
            x[ids] -= np.float32(self.presence) + np.float32(self.frequency) * counts.astype(
                np.float32
            )
        if suppress_eos:
            x[self.eos[(self.eos >= 0) & (self.eos < len(x))]] = -np.inf
        return x

    def _over_t(self, x: np.ndarray) -> np.ndarray:
        return x / np.float32(self.temperature) if self.temperature is not None else x

    def survivors(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(scores over temperature of the tokens top-k, top-p and min-p keep, their ids ascending;
        None: all of them). Scores are divided by the temperature only where they are read."""
        keep = stats = None
        if (
            self.top_k or self.top_p is not None
        ):  # one native pass: max, softmax total, the tokens within CLOSE
            stats = _native.softmax_stats(scores, self.temperature or 1.0, CLOSE)
        if (
            self.top_k
        ):  # the tokens scoring at least the k-th highest score (ties kept, as transformers does)
            k, close = min(self.top_k, len(scores)), stats[2]
            if (
                len(close) < k
            ):  # fewer than k within CLOSE: look WIDE, a second pass cheaper than a full partition
                close = _native.softmax_stats(scores, self.temperature or 1.0, WIDE)[2]
            if len(close) < k:
                close = np.arange(len(scores))
            pool = self._over_t(scores[close])
            keep = close[pool >= np.partition(pool, len(pool) - k)[len(pool) - k]]
        if self.top_p is not None:
            keep = self._top_p(scores, keep, stats)
        if self.min_p is not None:  # probability at least min_p times the most likely token's
            sv = self._over_t(scores if keep is None else scores[keep])
            kept = np.flatnonzero(np.exp(sv - sv.max()) >= np.float32(self.min_p))
            keep = kept if keep is None else keep[kept]
        return self._over_t(scores if keep is None else scores[keep]), keep

    def _top_p(self, scores: np.ndarray, keep: np.ndarray | None, stats) -> np.ndarray:
        """The tokens whose probability mass ranked above them (among the tokens kept so far) is
        below top_p."""
        if keep is None:
            ids = None
            m, total, close = stats
        else:
            ids = keep
            sv = self._over_t(scores[keep])
            m = sv.max()
            total = np.exp(sv - m).sum(dtype=np.float64)
            close = np.flatnonzero(sv >= m - CLOSE)
        n = len(scores) if ids is None else len(ids)
        values = (lambda c: self._over_t(scores[c])) if ids is None else (lambda c: sv[c])
        widening = (
            lambda: close,
            lambda: np.argpartition(values(np.arange(n)), -TOP)[-TOP:],
            lambda: np.arange(n),
        )
        for make in widening if n > TOP else widening[::2]:
            cands = make()
            v = values(cands)
            rank = np.argsort(-v, kind="stable")  # most likely first
            probs = np.exp(v[rank] - m).astype(np.float64) / total
            cumulative = np.cumsum(probs)
            if cumulative[-1] >= self.top_p or len(cands) == n:
                kept = cands[rank[cumulative - probs < self.top_p]]
                return np.sort(kept if ids is None else ids[kept])
        raise AssertionError("unreachable: the last candidates are the whole vocabulary")

    def sample(self, sv: np.ndarray, keep: np.ndarray | None, u: float) -> int:
        """The token whose interval of the cumulative distribution (in token id order) holds u times
        its total: sv are the survivors' scores over temperature, keep their ids (None: every
        token)."""
        # float32, as a softmax of the scores would be before its division
        weights = np.exp(sv - sv.max())
        # Both cumsums are serial float64 sums, the same bits
        # (tests/engine/test_torch_free_core.py). torch's runs 3x faster on a whole vocabulary (49k
        # tokens: 68 us vs numpy's 213; 152k: 190 vs 653), so it is used where torch is loaded
        # anyway; never imported for it.
        torch = sys.modules.get("torch")
        w64 = weights.astype(np.float64)
        cdf = torch.from_numpy(w64).cumsum(0).numpy() if torch is not None else np.cumsum(w64)
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        if (
            i >= len(sv) or weights[i] == 0
        ):  # u * total rounded onto the end: the last possible token
            i = int(np.flatnonzero(weights)[-1])
        return i if keep is None else int(keep[i])


def _not_a_generator(generator) -> str:
    return (
        "generator must be a kwker.sampling.SeededGenerator or a torch.Generator, got "
        f"{type(generator).__name__}"
    )
