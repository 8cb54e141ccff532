"""Sampling: transformers' processors in its order, one uniform number per position, seeded
reproducibility, and a chi-square test that the sampled tokens follow the softmax."""

import numpy as np
import pytest
import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder
from kwker.sampling import Sampler, SamplingParams

PROMPT = torch.tensor([[5, 9, 33, 102, 7]])


@pytest.fixture(scope="module")
def dec():
    return KwkDecoder(tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128), max_cache_len=96)


def sample(dec, seed, **kw):
    return dec.generate(
        PROMPT,
        max_new_tokens=24,
        do_sample=True,
        generator=torch.Generator().manual_seed(seed),
        **kw,
    )


def test_same_seed_same_tokens(dec):
    a = sample(dec, 7, temperature=0.9, top_p=0.95)
    b = sample(dec, 7, temperature=0.9, top_p=0.95)
    c = sample(dec, 8, temperature=0.9, top_p=0.95)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_top_k_1_is_greedy(dec):
    assert torch.equal(sample(dec, 3, top_k=1), dec.generate(PROMPT, max_new_tokens=24))


def test_greedy_with_processors_matches_transformers():
    model = tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128)
    dec = KwkDecoder(model, max_cache_len=96)
    ours = dec.generate(PROMPT, max_new_tokens=32, repetition_penalty=1.3, min_new_tokens=32)
    theirs = model.generate(
        PROMPT,
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=32,
        do_sample=False,
        repetition_penalty=1.3,
        min_new_tokens=32,
        pad_token_id=0,
    )
    assert torch.equal(ours, theirs)


def transformers_probs(logits, **kw):
    """The distribution transformers samples from for these options: its own warpers, then a
    softmax."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    scores = logits[None].float()
    if kw.get("temperature"):
        scores = TemperatureLogitsWarper(kw["temperature"])(None, scores)
    if kw.get("top_k"):
        scores = TopKLogitsWarper(kw["top_k"])(None, scores)
    if kw.get("top_p"):
        scores = TopPLogitsWarper(kw["top_p"])(None, scores)
    if kw.get("min_p"):
        scores = MinPLogitsWarper(kw["min_p"])(None, scores)
    return torch.softmax(scores[0].double(), dim=-1)


@pytest.mark.parametrize(
    "kw",
    [
        dict(temperature=1.5),
        dict(temperature=0.8, top_k=20, top_p=0.9),
        dict(temperature=1.2, top_p=0.8, min_p=0.05),
    ],
)
def test_sampled_first_token_follows_transformers_distribution(dec, kw):
    """20000 draws of the first new token against the distribution transformers' warpers give
    (chi-square)."""
    logits = dec.forward(PROMPT)[-1]
    probs = transformers_probs(logits, **kw)
    sampler = Sampler(
        SamplingParams(do_sample=True, **kw), PROMPT.shape[1], torch.Generator().manual_seed(0)
    )
    n = 20000
    counts = torch.zeros_like(probs)
    for _ in range(n):
        counts[sampler.choose(logits, PROMPT, sampler.draw())] += 1
    assert counts[probs == 0].sum() == 0  # nothing outside what transformers keeps
    expected = probs * n
    big = expected >= 5  # chi-square needs >= 5 expected per bin: pool the rest into one bin
    obs, exp = counts[big], expected[big]
    if expected[~big].sum() > 0:
        obs, exp = (
            torch.cat([obs, counts[~big].sum()[None]]),
            torch.cat([exp, expected[~big].sum()[None]]),
        )
    assert len(obs) >= 3
    stat = float(((obs - exp) ** 2 / exp).sum())
    pvalue = float(
        torch.special.gammaincc(
            torch.tensor((len(obs) - 1) / 2, dtype=torch.float64),
            torch.tensor(stat / 2, dtype=torch.float64),
        )
    )  # chi2 survival function
    assert pvalue > 1e-3, (stat, pvalue)


def test_generate_uses_one_draw_per_position(dec):
    """The first sampled token of generate() equals the sampler's choice for the generator's first
    draw."""
    for seed in range(20):
        logits = dec.forward(PROMPT)[-1]
        probs = torch.softmax(logits.double(), dim=-1)
        u = float(
            torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
        )
        expected = int(torch.searchsorted(torch.cumsum(probs, 0), torch.tensor([u]), right=True))
        assert int(sample(dec, seed)[0, PROMPT.shape[1]]) == expected


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(temperature=0.0), "temperature"),
        (dict(temperature=-1.0), "temperature"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_k=-3), "top_k"),
        (dict(min_p=2.0), "min_p"),
        (dict(repetition_penalty=0.0), "repetition_penalty"),
        (dict(min_new_tokens=-1), "min_new_tokens"),
    ],
)
def test_invalid_sampling_values(dec, kw, message):
    with pytest.raises(ValueError, match=message):
        sample(dec, 0, **kw)


@pytest.mark.parametrize(
    "kw",
    [
        dict(top_p=0.9),
        dict(top_k=40),
        dict(top_k=7, top_p=0.95),
        dict(temperature=0.7, top_p=0.9),
        dict(min_p=0.05),
        dict(top_k=100, top_p=0.5, min_p=0.1),
    ],
)
def test_kept_tokens_are_transformers_set(kw):
    """The tokens our warpers keep (found among the likeliest first) are those transformers' warpers
    keep, over peaked and flat distributions of small and large vocabularies (flat ones need the
    wider candidate sets and the full sort). Where the two differ it is one token whose top-p
    boundary is a tie to float rounding (their cumulative sums run in opposite orders)."""
    g = torch.Generator().manual_seed(0)
    differ = 0
    for trial in range(60):
        vocab = [100, 1000, 50000][trial % 3]
        scores = torch.randn(vocab, generator=g) * [0.3, 1, 3, 8][trial % 4]
        scores[torch.randint(0, vocab, (3,), generator=g)] += 5  # a few likely tokens
        sampler = Sampler(SamplingParams(do_sample=True, **kw), 0, None)
        _, keep = sampler.survivors(sampler.processed(scores, []))
        ours = torch.zeros(vocab, dtype=torch.bool)
        ours[torch.from_numpy(keep if keep is not None else np.arange(vocab))] = True
        theirs = transformers_probs(scores, **kw) > 0
        diff = torch.nonzero(ours != theirs).flatten()
        if len(diff):
            differ += 1
            assert len(diff) == 1 and "top_p" in kw, (trial, diff)
            t = scores / kw.get("temperature", 1.0)
            probs = t.double().softmax(-1)
            above = probs[probs > probs[diff[0]]].sum()
            assert abs(float(above) - kw["top_p"]) < 1e-5
    assert differ <= 2


def test_penalties_match_transformers():
    """Repetition penalty and min_new_tokens give transformers' scores exactly (eos only until the
    minimum)."""
    from transformers.generation.logits_process import (
        MinNewTokensLengthLogitsProcessor,
        RepetitionPenaltyLogitsProcessor,
    )

    eos = [3, 7, 2000]  # one id outside this vocabulary
    sampler = Sampler(
        SamplingParams(repetition_penalty=1.3, min_new_tokens=4, eos_token_ids=eos), 5, None
    )
    penalty = RepetitionPenaltyLogitsProcessor(1.3)
    min_new = MinNewTokensLengthLogitsProcessor(5, 4, torch.tensor(eos))
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(1000, generator=g) * 4
    for length in (5, 7, 8, 9, 20):  # 0, 2, 3 new tokens: eos suppressed; 4, 15: left alone
        context = torch.randint(0, 1000, (1, length), generator=g)
        theirs = min_new(context, penalty(context, scores[None].clone()))[0]
        ours = sampler.processed(scores, context[0].tolist())
        assert torch.equal(torch.from_numpy(ours), theirs), length
        assert (ours[3] == -np.inf) == (length < 9)
    assert torch.equal(
        scores, torch.randn(1000, generator=torch.Generator().manual_seed(1)) * 4
    )  # not modified
