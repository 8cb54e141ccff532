"""Sampling: transformers' processors in its order, one uniform number per position, seeded reproducibility,
and a chi-square test that the sampled tokens follow the softmax."""

import pytest
import torch

from helpers import tiny_llama
from kwker.decode import KwkDecoder
from kwker.sampling import Sampler, SamplingParams

PROMPT = torch.tensor([[5, 9, 33, 102, 7]])


@pytest.fixture(scope="module")
def dec():
    return KwkDecoder(tiny_llama(hidden=96, heads=3, kv_heads=1, inter=128), max_cache_len=96)


def sample(dec, seed, **kw):
    return dec.generate(PROMPT, max_new_tokens=24, do_sample=True, generator=torch.Generator().manual_seed(seed),
                        **kw)


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
    theirs = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=32, do_sample=False,
                            repetition_penalty=1.3, min_new_tokens=32, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_sampled_first_token_follows_softmax(dec):
    """20000 draws of the first new token at temperature 1.5 against the model's own softmax."""
    logits = dec.forward(PROMPT)[-1]
    probs = torch.softmax(logits.double() / 1.5, dim=-1)
    sampler = Sampler(SamplingParams(do_sample=True, temperature=1.5), PROMPT.shape[1],
                      torch.Generator().manual_seed(0))
    n = 20000
    counts = torch.zeros_like(probs)
    for _ in range(n):
        counts[sampler.choose(logits, PROMPT, sampler.draw())] += 1
    expected = probs * n
    big = expected >= 5  # chi-square needs >= 5 expected per bin: pool the rest into one bin
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    stat = float(((obs - exp) ** 2 / exp).sum())
    pvalue = float(torch.special.gammaincc(torch.tensor((len(obs) - 1) / 2, dtype=torch.float64),
                                           torch.tensor(stat / 2, dtype=torch.float64)))  # chi2 survival function
    assert pvalue > 1e-3, (stat, pvalue)


def test_generate_uses_one_draw_per_position(dec):
    """The first sampled token of generate() equals the sampler's choice for the generator's first draw."""
    for seed in range(20):
        logits = dec.forward(PROMPT)[-1]
        probs = torch.softmax(logits.double(), dim=-1)
        u = float(torch.rand((), generator=torch.Generator().manual_seed(seed), dtype=torch.float64))
        expected = int(torch.searchsorted(torch.cumsum(probs, 0), torch.tensor([u]), right=True))
        assert int(sample(dec, seed)[0, PROMPT.shape[1]]) == expected


@pytest.mark.parametrize("kw, message", [
    (dict(temperature=0.0), "temperature"),
    (dict(temperature=-1.0), "temperature"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_k=-3), "top_k"),
    (dict(min_p=2.0), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(min_new_tokens=-1), "min_new_tokens"),
])
def test_invalid_sampling_values(dec, kw, message):
    with pytest.raises(ValueError, match=message):
        sample(dec, 0, **kw)


def test_top_p_keeps_transformers_set():
    """Our top-p (candidates first) keeps the tokens transformers' TopPLogitsWarper keeps; where the two differ it
    is one token whose mass ranked above it equals top_p to float rounding (their cumulative sums run in opposite
    orders)."""
    from transformers.generation.logits_process import TopPLogitsWarper

    from kwker.sampling import TopP

    g = torch.Generator().manual_seed(0)
    differ = 0
    for trial in range(120):
        vocab = [100, 1000, 50000][trial % 3]
        scores = torch.randn(2, vocab, generator=g) * (1 + trial % 7)
        for top_p in [0.1, 0.5, 0.9, 0.95, 0.99]:
            ours, theirs = TopP(top_p)(None, scores.clone()), TopPLogitsWarper(top_p)(None, scores.clone())
            assert torch.equal(ours[torch.isfinite(ours)], scores[torch.isfinite(ours)])
            for row in range(2):
                diff = torch.nonzero(torch.isinf(ours[row]) != torch.isinf(theirs[row])).flatten()
                if len(diff):
                    differ += 1
                    assert len(diff) == 1
                    probs = scores[row].softmax(-1).double()
                    above = probs[probs > probs[diff[0]]].sum()
                    assert abs(float(above) - top_p) < 1e-5
    assert differ <= 3


def test_min_new_tokens_processor_matches_transformers():
    """Our MinNewTokens writes only the eos entries; transformers' builds a vocabulary mask: same scores."""
    from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

    from kwker.sampling import MinNewTokens

    eos = torch.tensor([3, 7, 2000])  # one id outside this vocabulary
    ours, theirs = MinNewTokens(5, 4, eos), MinNewTokensLengthLogitsProcessor(5, 4, eos)
    scores = torch.randn(1, 1000)
    for length in (5, 7, 8, 9, 20):  # 0, 2, 3 new tokens: eos suppressed; 4, 15: left alone
        ids = torch.zeros(1, length, dtype=torch.long)
        assert torch.equal(ours(ids, scores), theirs(ids, scores)), length
    assert ours(torch.zeros(1, 5, dtype=torch.long), scores)[0, 3] == -float("inf")
