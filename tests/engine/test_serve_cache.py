"""kwker serve's prompt cache across requests, and its tenants kept apart (issue 46).

A request takes the free slot whose cache shares the longest prefix with its prompt, among its
own tenant's (an API key's); the slots beyond max_active keep earlier requests' text. Reuse never
changes a token. A tenant learns nothing of another's text: neither through reuse (time to
first token) nor through prompt lookup's corpus (the proposed and accepted counts in usage)."""

import httpx
import numpy as np
import pytest
import torch
from helpers import tiny_llama
from serving import running

from kwker.api_keys import api_key_from
from kwker.hf import KwkDecoder
from kwker.sampling import SeededGenerator
from kwker.serve import ServingEngine, create_app

RNG = np.random.default_rng(46)


def text(n: int) -> list[int]:
    """n token ids without a repeated pair: prompt lookup finds nothing in it alone."""
    return [int(t) for t in RNG.choice(np.arange(100, 49000), size=n, replace=False)]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=5, vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)


def engine_for(model, max_active=2, cache_slots=2, **options) -> ServingEngine:
    dec = KwkDecoder(model, max_cache_len=512, max_batch=max_active + cache_slots)
    return ServingEngine(dec, max_active=max_active, **options)


def ask(engine, prompt, n=24, tenant=None, seed=None):
    """(the new tokens, the request's figures) of a greedy request, or a seeded one at
    temperature 1.5 (the tiny model's greedy answers repeat one token; these do not)."""
    sampling = {}
    if seed is not None:
        sampling = dict(do_sample=True, temperature=1.5, generator=SeededGenerator(seed))
    req = engine.submit(prompt, n, tenant=tenant, eos_token_id=[], **sampling)
    return req.tokens(), req.seq.stats


SEED = 7


@pytest.fixture(scope="module")
def secret(model):
    """A prompt whose answer of 24 tokens at SEED repeats no token of the prompt or of itself:
    the text alone gives prompt lookup nothing to copy, whatever its controller times, so any
    lookup proposal for it comes from an earlier request's text."""
    for _ in range(20):
        prompt = text(64)
        with engine_for(model) as engine:
            answer, _ = ask(engine, prompt, seed=SEED)
        if len(set(prompt + answer)) == len(prompt) + 24:
            return prompt
    raise AssertionError("no prompt of 20 gives an answer without a repeated token")


@pytest.fixture(scope="module")
def alone(model):
    dec = KwkDecoder(model, max_cache_len=512)

    def run(prompt, n=24):
        out = dec.generate(torch.tensor([prompt]), max_new_tokens=n, eos_token_id=[], lookup=0)
        return out[0, len(prompt) :].tolist()

    return run


def test_a_growing_conversation_reuses_its_previous_turns(model, alone):
    previous = 0
    with engine_for(model) as engine:
        conversation = text(60)
        for turn in range(4):
            answer, stats = ask(engine, conversation)
            assert answer == alone(conversation)  # reuse changes no token
            if turn:  # all of the previous prompt and answer but the answer's last token
                assert stats.reused_prompt_tokens >= 0.95 * previous, (turn, stats)
            # two other tenants' requests in between take the free slots, not this one's
            for other in ("b", "c"):
                ask(engine, text(40), 8, tenant=other)
            previous = len(conversation) + len(answer)
            conversation = conversation + answer + text(12)  # the user's next message


def test_a_repeated_request_reuses_all_its_prompt_but_the_last_token(model):
    # the last token runs again: its logits give the first new token
    with engine_for(model) as engine:
        prompt = text(80)
        first, cold = ask(engine, prompt)
        again, warm = ask(engine, prompt)
        assert first == again and cold.reused_prompt_tokens == 0
        assert warm.reused_prompt_tokens == len(prompt) - 1


def test_a_tenant_learns_nothing_of_anothers_text(model, secret):
    """Bob sends the text Alice sent. He gets what a server that never saw her request gives: no
    reuse of her cache, and no lookup proposal (the text alone has none to give: see secret).
    Alice sending it again, the control, gets both."""
    with engine_for(model) as engine:
        ask(engine, secret, tenant="alice", seed=SEED)
        _, bob = ask(engine, secret, tenant="bob", seed=SEED)
        _, alice = ask(engine, secret, tenant="alice", seed=SEED)
    assert bob.reused_prompt_tokens == 0 and bob.proposed == bob.accepted == {}
    assert alice.reused_prompt_tokens == len(secret) - 1
    assert alice.accepted.get("lookup", 0) >= 12  # her first answer, copied


def test_without_shared_lookup_no_request_copies_from_an_earlier_one(model, secret):
    with engine_for(model, shared_lookup=False) as engine:
        ask(engine, secret, seed=SEED)
        _, again = ask(engine, secret, seed=SEED)
    assert again.proposed == again.accepted == {}
    assert again.reused_prompt_tokens == len(secret) - 1  # the prefix cache is still its own


def test_two_keys_over_http_are_two_tenants(model, secret, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("# name key\nalice key-a\nbob key-b\n")
    api_keys = api_key_from(str(keys), None)
    assert api_keys == {"key-a": "alice", "key-b": "bob"}

    def complete(url, key):
        r = httpx.post(
            f"{url}/v1/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": "tiny",
                "prompt": secret,
                "max_tokens": 24,
                "temperature": 1.5,
                "seed": SEED,
            },
            timeout=60,
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"], r.json()["usage"]["kwker"]

    with engine_for(model) as engine, running(create_app(engine, "tiny", api_keys)) as url:
        first_text, alice = complete(url, "key-a")
        bob_text, bob = complete(url, "key-b")
        again_text, alice_again = complete(url, "key-a")
        assert (
            httpx.get(f"{url}/v1/models", headers={"Authorization": "Bearer x"}).status_code == 401
        )
    assert first_text == bob_text == again_text
    assert bob["reused_prompt_tokens"] == 0 and bob["proposed"] == bob["accepted"] == {}
    assert alice["proposed"] == {}  # her first request: nothing to copy yet
    assert alice_again["reused_prompt_tokens"] == len(secret) - 1
    assert alice_again["accepted"].get("lookup", 0) >= 12


def test_a_keys_file_with_a_repeated_name_or_key_is_refused(tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("alice k1\nalice k2\n")
    with pytest.raises(ValueError, match="repeats"):
        api_key_from(str(keys), None)
    keys.write_text("k1\nk2\n")  # names default to the line's number
    assert api_key_from(str(keys), None) == {"k1": "key 1", "k2": "key 2"}
    keys.write_text("just-one-key\n")  # the old format: one key
    assert api_key_from(str(keys), None) == "just-one-key"
