"""The serving engine and `kwker serve`'s HTTP API: requests arriving over time each get what they
get alone; cancel, a full queue and bad requests get clear answers and the server keeps serving. The
ways a client could misuse the server are in test_serve_http.py; the load test in
test_serve_load.py."""

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder
from kwker.serve import QueueFull, ServingEngine, create_app

PROMPTS = [
    [5, 9, 33, 102, 7, 61, 5, 9, 33],
    [400, 12],
    [7] * 40,
    [3, 1, 4, 1, 5, 9, 2, 6],
    [88, 77, 66],
]


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=5, vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)


@pytest.fixture(scope="module")
def alone(model):
    dec = KwkDecoder(model, max_cache_len=256)

    def run(prompt, n, seed=None):
        kw = (
            dict(do_sample=True, temperature=1.1, generator=torch.Generator().manual_seed(seed))
            if seed
            else {}
        )
        return dec.generate(torch.tensor([prompt]), max_new_tokens=n, eos_token_id=[], **kw)[
            0, len(prompt) :
        ].tolist()

    return run


def test_requests_arriving_over_time_get_what_they_get_alone(model, alone):
    dec = KwkDecoder(model, max_cache_len=256, max_batch=3)
    with ServingEngine(dec, prefill_chunk=16) as engine:
        results = {}

        def client(i):
            time.sleep(0.01 * i)  # arrive while others run
            seed = i + 1 if i % 2 else None
            kw = (
                dict(do_sample=True, temperature=1.1, generator=torch.Generator().manual_seed(seed))
                if seed
                else {}
            )
            req = engine.submit(PROMPTS[i % len(PROMPTS)], 20 + i, eos_token_id=[], **kw)
            results[i] = (req.tokens(), seed)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    for i, (tokens, seed) in results.items():
        assert tokens == alone(PROMPTS[i % len(PROMPTS)], 20 + i, seed), i


def test_cancel_and_queue_full(model, alone):
    dec = KwkDecoder(model, max_cache_len=256, max_batch=2)
    engine = ServingEngine(dec, max_queue=2)
    engine.submit(PROMPTS[0], 5)
    engine.submit(PROMPTS[1], 5)
    with pytest.raises(QueueFull, match="queue is full"):
        engine.submit(PROMPTS[2], 5)
    with engine:
        long = engine.submit(PROMPTS[3], 200, eos_token_id=[])
        other = engine.submit(PROMPTS[4], 30, eos_token_id=[])
        got = []
        for c in long:
            got.append(c.token)
            if len(got) == 3:
                long.cancel()
        assert 3 <= len(got) < 200
        assert other.tokens() == alone(PROMPTS[4], 30)


# --------------------------------------------------------------------------------------------- HTTP
@pytest.fixture(scope="module")
def server(model, smollm2_tokenizer):
    import uvicorn

    tokenizer = smollm2_tokenizer
    dec = KwkDecoder(model, max_cache_len=256, max_batch=4, tokenizer=tokenizer)
    engine = ServingEngine(dec, tokenizer)
    engine.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    srv = uvicorn.Server(
        uvicorn.Config(
            create_app(engine, "tiny", api_key="sekret"),
            host="127.0.0.1",
            port=port,
            log_level="warning",
        )
    )
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    while not srv.started:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1", tokenizer
    srv.should_exit = True
    thread.join()
    engine.stop()


def test_openai_client_chat_and_stream(server, alone):
    from openai import OpenAI

    url, tokenizer = server
    client = OpenAI(base_url=url, api_key="sekret")
    assert [m.id for m in client.models.list()] == ["tiny"]
    messages = [{"role": "user", "content": "Hello there"}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    expect = tokenizer.decode(alone(list(ids), 12), skip_special_tokens=True)
    r = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0
    )
    assert r.choices[0].message.content == expect
    assert r.usage.completion_tokens == 12 and r.usage.prompt_tokens == len(ids)
    stream = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == expect
    text = client.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=8, temperature=0
    )
    assert text.choices[0].text == tokenizer.decode(
        alone(tokenizer("Once upon a time")["input_ids"], 8), skip_special_tokens=True
    )


def test_bad_requests_get_4xx_and_the_server_keeps_serving(server):
    url, _ = server
    auth = {"Authorization": "Bearer sekret"}
    ok = {"model": "tiny", "prompt": "Hi", "max_tokens": 2, "temperature": 0}
    assert httpx.post(f"{url}/completions", json=ok).status_code == 401
    r = httpx.post(f"{url}/completions", json={**ok, "model": "gpt-9"}, headers=auth)
    assert r.status_code == 404 and "unknown model 'gpt-9'" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/completions", json={**ok, "prompt": "word " * 400}, headers=auth)
    assert r.status_code == 400 and "context is 256 tokens" in r.json()["error"]["message"]
    r = httpx.post(
        f"{url}/completions",
        content=b"{not json",
        headers={**auth, "content-type": "application/json"},
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/completions", json={**ok, "temperature": -1}, headers=auth)
    assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]
    r = httpx.post(f"{url}/completions", json=ok, headers=auth)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_load_64_requests_from_16_clients(server, alone):
    url, tokenizer = server
    auth = {"Authorization": "Bearer sekret"}
    prompts = [f"Question number {i}: what comes next?" for i in range(64)]

    def ask(i):
        r = httpx.post(
            f"{url}/completions",
            headers=auth,
            timeout=120,
            json={"model": "tiny", "prompt": prompts[i], "max_tokens": 6 + i % 5, "temperature": 0},
        )
        return i, r.status_code, r.json()

    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(ask, range(64)))
    assert all(status == 200 for _, status, _ in answers)
    for i, _, body in answers:
        ids = tokenizer(prompts[i])["input_ids"]
        assert body["choices"][0]["text"] == tokenizer.decode(
            alone(ids, 6 + i % 5), skip_special_tokens=True
        ), i
