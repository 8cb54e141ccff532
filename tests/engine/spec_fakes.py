"""Shared by the test_spec_* files: the tiny models and prompts they decode, fake drafts (a
proposal's cost and agreement set by the test), a simulated machine to run the controller on, and
the real SmolLM2 pair."""

import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder

# A prompt that repeats itself, so that lookup has something to propose, and one that does not.
REPEATS = [5, 9, 33, 102, 7, 61, 5, 9, 33, 102, 7, 61, 5, 9, 33]


PLAIN = [400, 12, 87, 3, 650, 71, 220, 15]


def tiny_target():
    return tiny_llama(seed=1, hidden=96, heads=3, kv_heads=1, inter=128, layers=3)


def tiny_small():
    return tiny_llama(seed=2, hidden=48, heads=2, kv_heads=1, inter=64, layers=1)


class FakeDraft:
    """A draft that proposes `token` k times; what matters in these tests is what proposing costs.
    `behind`: how many tokens each proposal first catches up on."""

    name = "draft"

    def __init__(self, token=7, behind=0):
        self.draft, self.behind, self.token = object(), behind, token
        self.catch_up_s = 0.0  # of a proposal's time, its catch-up's

    def behind_on(self, tokens, window=None):
        return self.behind if window is None else min(self.behind, window)

    def propose(self, tokens, k, window=None, min_prob=0.0, alternatives=False):
        return [self.token] * k


def run(dec, prompt, seed=None, **kw):
    sampling = {}
    if seed is not None:
        sampling = dict(
            do_sample=True, temperature=1.3, top_k=40, generator=torch.Generator().manual_seed(seed)
        )
    return dec.generate(
        torch.tensor([prompt]), max_new_tokens=40, eos_token_id=[], **sampling, **kw
    )


class SimulatedDraft(FakeDraft):
    """A draft on a simulated machine: a k-token proposal costs call(k) target steps of the clock's
    time, and `catch_up` steps for each token beyond the usual 1 or 2 that it first catches up on
    (the steps it sat out); each proposed token is the target's own with probability `agree`."""

    def __init__(self, clock, call, step1_s, agree, catch_up=0.0, seed=0):
        import random

        super().__init__()
        self.clock, self.call, self.step1_s, self.agree = clock, call, step1_s, agree
        self.catch_up, self.seen = catch_up, 0  # the text's tokens its cache holds
        self.rng = random.Random(seed)
        self.calls: list[int] = []

    def behind_on(self, tokens, window=None):
        behind = len(tokens) - self.seen
        return behind if window is None else min(behind, window)

    def propose(self, tokens, k, window=None, min_prob=0.0, alternatives=False):
        self.behind = self.behind_on(tokens, window)
        self.catch_up_s = self.catch_up * max(0, self.behind - 2) * self.step1_s
        self.clock.t += self.call(k) * self.step1_s + self.catch_up_s
        self.calls.append(k)
        self.seen = len(tokens) + k - 1  # it ran its proposals but the last
        return [7] * k

    def verified(self, text_len, accepted):
        """The target kept `accepted` of the proposals made at text_len: the rest leave the
        cache."""
        self.seen = min(self.seen, text_len + accepted)

    def accepted(self, k):
        n = 0
        while n < k and self.rng.random() < self.agree:
            n += 1
        return n


class UnluckyDraft(SimulatedDraft):
    """A SimulatedDraft whose first `unlucky` proposals are all rejected at their first token."""

    def __init__(self, *args, unlucky, **kw):
        super().__init__(*args, **kw)
        self.unlucky = unlucky

    def accepted(self, k):
        if self.unlucky:
            self.unlucky -= 1
            return 0
        return super().accepted(k)


class ConfidentDraft(SimulatedDraft):
    """A simulated draft that knows when it is unsure, as the real ones do (perf-notes #26: the
    Qwen2.5-Coder 0.5B's tokens of probability >= 0.97 were the 1.5B's own 100% of the time, those
    under 0.3 30%): each token's probability is 0.99 (5 tokens in 6) or 0.3, and the target keeps
    it with that chance. It stops as Model.propose does, once the product of its tokens'
    probabilities is below min_prob."""

    def propose(self, tokens, k, window=None, min_prob=0.0, alternatives=False):
        self.probs, kept = [], 1.0
        while len(self.probs) < k and kept >= min_prob:
            self.probs.append(0.99 if self.rng.random() < 5 / 6 else 0.3)
            kept *= self.probs[-1]
        return super().propose(tokens, len(self.probs), window)

    def accepted(self, k):
        n = 0
        while n < k and self.rng.random() < self.probs[n]:
            n += 1
        return n


class Clock:
    t = 0.0

    def __call__(self):
        return self.t


def simulate(spec, draft, step, steps, step1_s):
    """Runs `steps` verify steps on the simulated machine: (tokens, time) of the last half."""
    tokens = seconds = 0.0
    text = [1, 2, 3]  # its values do not matter: only its length, to the draft's catch-up
    for i in range(steps):
        t0 = draft.clock.t
        source, cands = spec.propose(text, room=50)
        accepted = draft.accepted(len(cands)) if source == "draft" else 0
        if source == "draft":
            draft.verified(len(text), accepted)
        text = text + [0] * (accepted + 1)
        fed = len(cands) + 1
        spec.feedback(source, len(cands), accepted, fed, step(fed) * step1_s, None)
        if i >= steps // 2:
            tokens += accepted + 1
            seconds += draft.clock.t - t0 + step(fed) * step1_s
    return tokens, seconds


def real_pair(smollm2, max_batch=1):
    """The real SmolLM2-135M and a draft of its first 8 layers (same tokenizer, its final norm and
    head), int4."""
    import copy

    model, tokenizer = smollm2
    small = copy.deepcopy(model)
    small.model.layers = small.model.layers[:8]
    small.config.num_hidden_layers = 8
    dec = KwkDecoder(model, 512, precision="int4", tokenizer=tokenizer, max_batch=max_batch)
    draft = KwkDecoder(small, 512, precision="int4", tokenizer=tokenizer)
    return dec, draft, tokenizer


def chat_ids(tokenizer, text):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}], add_generation_prompt=True
    )
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
