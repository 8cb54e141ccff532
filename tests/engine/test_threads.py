"""Several threads on one decoder take turns: no crash, and every call gets the tokens it gets
alone. A stream holds the decoder from its first step to its end; closing it (or dropping it, or an
error) lets the next one in."""

import threading
import time

import pytest
import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder, install
from kwker.serve import ServingEngine

NEW = 40
# 20 prompts, some repeating themselves so that lookup proposes
PROMPTS = [[(7 * i + j) % 900 + 1 for j in range(3 + i % 5)] * (1 + i % 3) for i in range(20)]
JOIN_S = 120  # a thread still running after this is taken for a deadlock


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=3, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)


@pytest.fixture(scope="module")
def dec(model):
    return KwkDecoder(model, max_cache_len=256, threads=2)


@pytest.fixture(scope="module")
def solo(dec):
    """Each prompt's tokens generated alone, one call after another (lookup on, the default)."""
    return [dec.generate(p, max_new_tokens=NEW, eos_token_id=[])[0].tolist() for p in PROMPTS]


def run_threads(targets):
    threads = [threading.Thread(target=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"


def test_four_threads_share_one_decoder(dec, solo):
    results, errors = {}, []

    def worker(first):
        try:
            for i in range(first, len(PROMPTS), 4):  # 5 calls per thread, 20 in all
                out = dec.generate(PROMPTS[i], max_new_tokens=NEW, eos_token_id=[])
                results[i] = out[0].tolist()
        except Exception as e:  # noqa: BLE001  (reported below, in the test's thread)
            errors.append(e)

    run_threads([lambda k=k: worker(k) for k in range(4)])
    assert not errors, errors
    assert sorted(results) == list(range(20))
    for i, out in results.items():
        assert out == solo[i], i


def test_streams_from_two_threads_take_turns(dec, solo):
    """Both consumers read their streams at once, slowly; the decoder serves one whole stream,
    then the other."""
    times, tokens = {0: [], 1: []}, {0: [], 1: []}

    def consume(k):
        for chunk in dec.stream_generate(PROMPTS[k], max_new_tokens=NEW, eos_token_id=[]):
            tokens[k].append(chunk.token)
            times[k].append(time.perf_counter())
            time.sleep(0.002)

    run_threads([lambda: consume(0), lambda: consume(1)])
    for k in (0, 1):
        assert PROMPTS[k] + tokens[k] == solo[k]
    first, second = sorted((0, 1), key=lambda k: times[k][0])
    assert times[first][-1] < times[second][0]  # the first held the decoder to its end


def test_a_stream_closed_midway_lets_the_waiting_thread_in(dec, solo):
    stream = dec.stream_generate(PROMPTS[2], max_new_tokens=NEW, eos_token_id=[])
    got = [next(stream).token for _ in range(3)]
    done = threading.Event()
    out = {}

    def other():
        out["tokens"] = dec.generate(PROMPTS[3], max_new_tokens=NEW, eos_token_id=[])[0].tolist()
        done.set()

    waiter = threading.Thread(target=other)
    waiter.start()
    assert not done.wait(0.3)  # the open stream holds the decoder
    stream.close()
    assert done.wait(JOIN_S)
    waiter.join()
    assert got == solo[2][len(PROMPTS[2]) :][:3] and out["tokens"] == solo[3]


def test_a_dropped_stream_and_a_failed_step_let_go(dec, solo):
    def read_two_and_fail():
        for i, _ in enumerate(dec.stream_generate(PROMPTS[4], max_new_tokens=NEW, eos_token_id=[])):
            if i == 1:
                raise KeyError("the consumer failed")

    with pytest.raises(KeyError):
        read_two_and_fail()  # the stream is dropped unclosed: collecting it closes it

    runner = dec.runner
    real = runner.extend
    runner.extend = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("step failed"))
    try:
        with pytest.raises(RuntimeError, match="step failed"):
            dec.generate(PROMPTS[5], max_new_tokens=NEW, eos_token_id=[])
    finally:
        runner.extend = real
    out = {}
    run_threads(
        [lambda: out.update(t=dec.generate(PROMPTS[5], max_new_tokens=NEW, eos_token_id=[]))]
    )
    assert out["t"][0].tolist() == solo[5]


def test_a_second_generation_in_the_streaming_thread_is_refused_not_deadlocked(dec, solo):
    stream = dec.stream_generate(PROMPTS[6], max_new_tokens=NEW, eos_token_id=[])
    next(stream)
    with pytest.raises(RuntimeError, match="slot 0 is in use"):
        dec.generate(PROMPTS[7], max_new_tokens=NEW, eos_token_id=[])
    with pytest.raises(RuntimeError, match="in use"):
        dec.reset()
    rest = [c.token for c in stream]  # the open stream was not disturbed
    assert PROMPTS[6] + [solo[6][len(PROMPTS[6])]] + rest == solo[6]
    assert dec.generate(PROMPTS[7], max_new_tokens=NEW, eos_token_id=[])[0].tolist() == solo[7]


def test_installed_generate_from_two_threads(model):
    prompts = [torch.tensor([p]) for p in PROMPTS[8:12]]
    kw = dict(max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0)
    plain = [model.generate(p, attention_mask=torch.ones_like(p), **kw) for p in prompts]
    install(model, max_cache_len=128, threads=2)
    try:
        outs = {}

        def worker(first):
            for i in range(first, len(prompts), 2):
                mask = torch.ones_like(prompts[i])
                outs[i] = model.generate(prompts[i], attention_mask=mask, **kw)

        run_threads([lambda: worker(0), lambda: worker(1)])
        assert model._kwker_fallback is None
        for i, want in enumerate(plain):
            assert torch.equal(outs[i], want), i
    finally:
        from kwker.hf import uninstall

        uninstall(model)


def test_a_server_and_a_direct_caller_share_a_decoder(model, solo):
    batched = KwkDecoder(model, max_cache_len=256, max_batch=2, threads=2)
    direct = {}
    with ServingEngine(batched) as engine:
        requests = [engine.submit(PROMPTS[i], NEW, eos_token_id=[]) for i in range(12, 16)]

        def call():
            out = batched.generate(PROMPTS[16], max_new_tokens=NEW, eos_token_id=[])
            direct["t"] = out[0].tolist()

        run_threads([call])
        served = [r.tokens() for r in requests]
    assert direct["t"] == solo[16]
    for i, tokens in zip(range(12, 16), served, strict=True):
        assert PROMPTS[i] + tokens == solo[i], i
