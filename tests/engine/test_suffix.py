"""Prompt lookup across texts: the suffix automaton of earlier texts (SuffixCache), a text streamed
through it (Follower), LookupProposer taking the longer of its own and the corpus's match, and the
serving engine's requests proposing what earlier requests wrote, without changing a token."""

import random

import pytest
import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder
from kwker.serve import ServingEngine
from kwker.speculative import LookupProposer, StepCosts, _prior
from kwker.suffix import Follower, SuffixCache


def longest_earlier(corpus_texts, text):
    """By brute force: the length of the longest suffix of text inside one corpus text."""
    for n in range(len(text), 0, -1):
        if any(t[i : i + n] == text[-n:] for t in corpus_texts for i in range(len(t) - n + 1)):
            return n
    return 0


def follow(corpus, text):
    f = Follower()
    for t in text:
        f.feed(corpus.automaton, t)
    return f


@pytest.mark.parametrize("seed", range(6))
def test_a_follower_finds_the_longest_suffix_in_earlier_texts_and_what_followed(seed):
    rng = random.Random(seed)
    texts = [[rng.randrange(4) for _ in range(rng.randrange(1, 30))] for _ in range(4)]
    corpus = SuffixCache()
    for t in texts:
        corpus.add(t)
    for _ in range(20):
        query = [rng.randrange(4) for _ in range(rng.randrange(1, 12))]
        f = follow(corpus, query)
        n = longest_earlier(texts, query)
        assert f.matched == n, query
        if n:
            # an occurrence's continuation; never across the end of its text
            got = corpus.continuation(f, 50)
            assert any(
                t[i : i + n] == query[-n:] and t[i + n : i + n + len(got)] == got
                for t in texts
                for i in range(len(t) - n + 1)
            )
            assert corpus.SEPARATOR not in got


def test_the_cache_keeps_its_newest_texts_within_its_size():
    corpus = SuffixCache(max_tokens=100)
    texts = [[1000 + 10 * i + j for j in range(20)] for i in range(12)]  # 21 tokens each, kept
    for t in texts:
        corpus.add(t)
        assert len(corpus.tokens) <= 100
    assert corpus.tokens[-21:-1] == texts[-1]
    assert follow(corpus, texts[-1][:5]).matched == 5  # the newest is found
    assert follow(corpus, texts[0][:5]).matched <= 1  # the oldest is gone
    assert corpus.tokens[0] == texts[len(texts) - len(corpus.tokens) // 21][0]  # whole texts
    corpus.add(list(range(500)))  # longer than the cache: its end is kept
    assert corpus.tokens[:-1] == list(range(500))[-99:]
    with pytest.raises(ValueError):
        SuffixCache(max_tokens=1)


def test_lookup_takes_the_longer_of_the_texts_own_match_and_the_corpus():
    corpus = SuffixCache()
    corpus.add([1, 2, 3, 4, 5, 6, 7, 8, 9])
    p = LookupProposer(corpus=corpus)
    # the text's own match is 1 token ("3"), the corpus's 3 ("2 3" after "1"... "1 2 3")
    text = [3, 40, 1, 2, 3]
    assert p.propose(text, 4) == [4, 5, 6, 7] and p.match_len == 3
    # the text repeats itself for longer than the corpus matches: its own continuation
    text = [1, 2, 3, 50, 51, 1, 2, 3, 50]
    assert p.propose(text, 3) == [51, 1, 2] and p.match_len == 4
    # a continuation stops at the end of the earlier text
    assert p.propose([7, 8], 5) == [9]
    # the corpus grows: a reader follows it (its place is found again)
    corpus.add([60, 61, 62, 63])
    assert p.propose([7, 8, 60, 61], 5) == [62, 63]
    assert LookupProposer().propose([60, 61], 3) == []  # no corpus, nothing repeats


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=5, vocab=2000, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)


@pytest.fixture
def costs_at_their_prior(monkeypatch):
    """Step costs at the controller's prior whatever the host measures: on a shared machine a
    slow stretch can make multi-token steps look dear, and lookup rightly stop proposing, which
    is the controller's business, not what these tests are about."""
    record = StepCosts.record
    monkeypatch.setattr(StepCosts, "record", lambda self, fed, _: record(self, fed, _prior(fed)))


@pytest.mark.parametrize("seed", [None, 3])
def test_a_request_that_repeats_an_earlier_one_copies_its_answer_with_the_same_tokens(
    model, seed, costs_at_their_prior
):
    """The second of two requests with one prompt gets its answer from lookup over the first's
    text; both get the tokens of a plain decode, greedy and seeded."""

    def sampling():
        if seed is None:
            return {}
        gen = torch.Generator().manual_seed(seed)
        return dict(do_sample=True, temperature=1.1, generator=gen)

    prompt = [int(t) for t in torch.randint(0, 2000, (30,), generator=torch.Generator())]
    dec = KwkDecoder(model, max_cache_len=256)
    plain = dec.generate(torch.tensor([prompt]), 60, eos_token_id=[], lookup=0, **sampling())
    plain = plain[0, len(prompt) :].tolist()
    with ServingEngine(dec) as engine:
        first = engine.submit(prompt, 60, eos_token_id=[], **sampling())
        assert first.tokens() == plain
        second = engine.submit(prompt, 60, eos_token_id=[], **sampling())
        assert second.tokens() == plain
    got = [r.seq.stats.accepted.get("lookup", 0) for r in (first, second)]
    assert got[1] >= 40 and got[1] > got[0], got
