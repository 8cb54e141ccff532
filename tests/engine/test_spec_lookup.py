"""Prompt lookup: the suffix automata (a text streamed through earlier texts: Follower,
SuffixCache), LookupProposer's longest match, its editor's copy and its corpus, and a serving
engine's requests proposing what earlier requests wrote, without changing a token."""

import random
import sys

import pytest
import torch
from helpers import tiny_llama
from spec_fakes import REPEATS, run, tiny_target

from kwker.hf import KwkDecoder
from kwker.serve import ServingEngine
from kwker.speculative import Follower, LookupProposer, StepCosts, SuffixAutomaton, SuffixCache
from kwker.speculative.costs import _prior


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


def test_the_old_suffix_module_warns_and_still_works():
    """kwker.suffix gives the automata from their new home for one release, warning at the line
    that imported it."""
    sys.modules.pop("kwker.suffix", None)
    with pytest.warns(
        DeprecationWarning, match="kwker.suffix is now kwker.speculative.lookup"
    ) as said:
        __import__("kwker.suffix")  # an import statement's path
    assert len(said) == 1 and said[0].filename == __file__
    old = sys.modules["kwker.suffix"]
    assert (old.SuffixCache, old.Follower, old.SuffixAutomaton) == (
        SuffixCache,
        Follower,
        SuffixAutomaton,
    )
    corpus = old.SuffixCache()
    corpus.add([1, 2, 3, 4])
    assert corpus.continuation(follow(corpus, [9, 2]), 5) == [3, 4]


def test_lookup_proposes_what_followed_the_latest_match():
    p = LookupProposer()
    text = [1, 2, 3, 4, 9, 1, 2, 3, 7, 8, 1, 2, 3]
    assert p.propose(text, 3) == [7, 8, 1]  # "1 2 3" last seen before the suffix at index 5
    assert p.propose(text + [7], 2) == [8, 1]  # incremental: the index follows the growing text
    assert p.propose([5, 6, 7], 4) == []  # a new text, nothing repeats


def test_lookup_follows_the_longest_match_and_says_how_long_it_is():
    p = LookupProposer()
    passage = list(range(100, 130))
    # the passage, a short reuse of its last 3 tokens, then the passage again up to token 120
    text = [1] + passage + [7] + passage[-3:] + [8] + passage[:21]
    assert p.match(text) == (1 + 21, 21)  # the first occurrence matches 21 tokens; the latest 0
    assert p.propose(text, 4) == passage[21:25] and p.match_len == 21
    # two occurrences that match as far back: the latest
    text = [5, 1, 2, 3, 9, 5, 1, 2, 3, 4, 6, 1, 2, 3]
    assert p.match(text) == (9, 3) and p.propose(text, 2) == [4, 6]
    assert p.propose([1, 2, 1], 3) == [2, 1] and p.match_len == 1  # one token is a match too


def test_lookup_resumes_an_edited_copy_where_it_left_its_source():
    """A module whose function LOAD is renamed NEW: after each renamed call the copy goes on from
    its own line of the source, not from the latest line that matches (the text's own earlier
    edit of a call, or the source's last call), and says how long its match is since the edit."""
    LOAD, NEW, CFG, PATH, END, RET, A, B = 50, 51, 52, 53, 54, 55, 60, 61
    source = [9, 9, 8] + list(range(100, 120))  # a preamble the copy starts in
    source += [RET, LOAD, CFG, PATH, A, END] + [RET, LOAD, CFG, PATH, B, END]
    p = LookupProposer()
    text = source + [7]

    def decode(tokens: list[int], most: int = 2):
        """Lookup at each new token, as decoding calls it; what it finds after the last."""
        for t in tokens:
            text.append(t)
            found = p.find(text, most)
        return found

    decode(source[:23] + [RET, NEW])  # copied to the first call, LOAD renamed
    assert decode([CFG]) == ([PATH, A], 1)  # not "PATH B" (the latest call's)
    decode([PATH, A, END, RET, NEW])
    # the text's own first call ("RET NEW CFG PATH A") matches longer, the copy is at the second
    assert decode([CFG, PATH]) == ([B, END], 2)
    assert LookupProposer().find(text, 2)[0] == [A, END]  # (without the copy)


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
def target():
    return tiny_target()


def test_lookup_accepts_on_repetitive_text_and_records_stats(target):
    dec = KwkDecoder(target, max_cache_len=128)
    out = run(dec, REPEATS)
    s = dec.last_stats
    assert s.proposed.get("lookup", 0) > 0 and 0 <= s.accepted["lookup"] <= s.proposed["lookup"]
    assert (
        s.new_tokens == 40 and s.steps + s.accepted["lookup"] == 39
    )  # each step: accepted + one of its own
    assert out.shape == (1, len(REPEATS) + 40)


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
