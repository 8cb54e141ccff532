"""The draft proposer: a self-draft's tokens are all kept, a draft of another tokenizer is
refused (its vocabulary compared once), it reads a new text's prompt in prefill and catches up in a
prefill of its own, and its pruned head holds the frequent, special and text's own tokens."""

import numpy as np
import pytest
import torch
from helpers import tiny_llama
from spec_fakes import PLAIN, real_pair, run, tiny_small, tiny_target

from kwker.hf import KwkDecoder
from kwker.speculative import DraftProposer, Speculator


@pytest.fixture(scope="module")
def target():
    return tiny_target()


@pytest.fixture(scope="module")
def small():
    return tiny_small()


@pytest.fixture(scope="module")
def smollm2_pair(smollm2):
    return real_pair(smollm2)


def test_self_draft_accepts_every_token(target, monkeypatch):
    # a self-draft never pays for its time, so the speculator would soon stop asking it: make it
    # always propose 4
    monkeypatch.setattr(
        Speculator,
        "_best_k",
        lambda self, source, room, accept=None: min(4, room) if source == "draft" else 0,
    )
    # and all 4: a random model's tokens are unsure, and where the stop falls depends on timings
    monkeypatch.setattr(Speculator, "STOP_MAX", 0.0)
    dec = KwkDecoder(target, max_cache_len=128)
    same = KwkDecoder(target, max_cache_len=128)
    run(dec, PLAIN, lookup=0, draft=same)
    stats = dec.last_stats
    assert stats.proposed["draft"] > 20
    assert stats.accepted["draft"] == stats.proposed["draft"]
    assert stats.steps < 40 / 2  # several tokens per target step


def test_draft_with_another_tokenizer_is_refused(target):
    other = tiny_llama(seed=3, vocab=1200, hidden=48, heads=2, kv_heads=1, inter=64, layers=1)
    dec = KwkDecoder(target, max_cache_len=64)
    with pytest.raises(ValueError, match="vocabulary sizes differ"):
        dec.generate(
            torch.tensor([PLAIN]), max_new_tokens=4, draft=KwkDecoder(other, max_cache_len=64)
        )
    with pytest.raises(ValueError, match="lookup"):
        dec.generate(torch.tensor([PLAIN]), max_new_tokens=4, lookup=-1)


class Vocab:
    """A tokenizer as check_draft sees it, counting the vocabularies it was asked for."""

    def __init__(self, vocab: dict[str, int]):
        self.vocab, self.asked = vocab, 0

    def get_vocab(self) -> dict[str, int]:
        self.asked += 1
        return dict(self.vocab)


def test_a_drafts_tokenizer_is_compared_once_and_a_different_one_refused(target):
    """Building a 151k-token vocabulary takes 0.2 s: a pair of tokenizers found equal is not
    compared again on each call; another tokenizer is, and one that differs is refused."""
    words = {f"w{i}": i for i in range(target.config.vocab_size)}
    dec = KwkDecoder(target, max_cache_len=64, tokenizer=Vocab(words))
    draft = KwkDecoder(target, max_cache_len=64, tokenizer=Vocab(words))
    for _ in range(3):
        dec.generate(torch.tensor([PLAIN]), max_new_tokens=2, draft=draft)
    assert dec.tokenizer.asked == draft.tokenizer.asked == 1
    draft.tokenizer = Vocab({**words, "w0": 1, "w1": 0})  # same size, two ids swapped
    with pytest.raises(ValueError, match="the tokenizers' vocabularies differ"):
        dec.generate(torch.tensor([PLAIN]), max_new_tokens=2, draft=draft)
    assert draft.tokenizer.asked == 1


def test_a_draft_far_behind_catches_up_in_a_prefill_of_its_own(smollm2_pair):
    """The catch-up runs as a prefill apart (timed on its own), and the proposal is the same."""
    _, draft, _ = smollm2_pair
    text = list(range(1000, 1040))
    draft.runner.reset()
    proposer = DraftProposer(draft)
    apart = proposer.propose(text, 4)
    assert proposer.behind == 40 and proposer.catch_up_s > 0
    assert proposer.behind_on(text + apart[:1]) == 1  # it holds the text and its proposals
    draft.runner.reset()
    with draft.runner.hold():
        slot = draft.runner.acquire(0)
        whole = draft.runner.propose_greedy(slot, 0, text, 4)
        draft.runner.release(slot)
    assert apart == whole


def test_a_draft_reads_a_new_texts_prompt_in_prefill(target, small, monkeypatch):
    """A new text's prompt goes through the draft during prefill (Speculator.start): its first
    proposal catches up on the prompt's last token only, not on the prompt (a catch-up that had made
    a new text's first probe too dear to go), and the text is plain decoding's."""
    behind = []
    propose = DraftProposer.propose

    def recording(self, tokens, k, *args, **kw):
        behind.append(self.behind_on(tokens))
        return propose(self, tokens, k, *args, **kw)

    monkeypatch.setattr(DraftProposer, "propose", recording)
    dec, draft = KwkDecoder(target, 256), KwkDecoder(small, 256)
    prompt = list(range(300, 400))  # 100 tokens
    plain = run(dec, prompt, lookup=0)
    out = run(dec, prompt, lookup=0, draft=draft)
    assert torch.equal(out, plain)
    assert behind and behind[0] <= 2, behind  # the prompt's last token and the first new one
    assert draft.runner.cached_len(0) >= len(prompt) - 1


def test_the_pruned_head_is_set_up_before_any_proposal_is_timed(small, monkeypatch):
    draft = KwkDecoder(small, max_cache_len=64, precision="int4")
    monkeypatch.setattr(DraftProposer, "HEAD_SUBSET", 200)
    assert draft.runner.head_subset_size == 0
    DraftProposer(draft)
    assert draft.runner.head_subset_size >= 200


def test_the_pruned_head_holds_the_texts_own_tokens(small, monkeypatch):
    """The prompt's tokens join the pruned head when the draft reads it, the answer's as they come,
    each once; past TEXT_ROWS of them the head starts again from the latest text's. A proposal
    is the argmax of the full head's logits over exactly the tokens the head holds."""
    monkeypatch.setattr(DraftProposer, "HEAD_SUBSET", 200)
    monkeypatch.setattr(DraftProposer, "TEXT_ROWS", 6)
    draft = KwkDecoder(small, max_cache_len=64, precision="int4")
    proposer = DraftProposer(draft)
    base = draft.runner.head_subset_size
    text = [5, 300, 7, 301, 300, 450]
    proposer.read(text)
    assert draft.runner.head_subset_size == base + 3  # 300, 301, 450
    assert proposer._in_subset[text].all()
    got = proposer.propose(text + [302], 1)
    assert proposer.subset and draft.runner.head_subset_size == base + 4
    ids = np.flatnonzero(proposer._in_subset)
    logits = draft.forward(text + [302]).numpy()[-1]
    assert got == [int(ids[np.argmax(logits[ids])])]
    proposer.read([303, 304, 305, 9])  # 4 + 3 > TEXT_ROWS: this text's tokens only
    assert draft.runner.head_subset_size == base + 3
    assert not proposer._in_subset[[300, 301, 302, 450]].any()
    assert proposer._in_subset[[303, 304, 305, 9]].all()
