"""`kwker serve` as a client finds it, one test per way it could be misused: a client that goes
away, a body too large or of the wrong type, a web page's request, a rebinding Host, a wrong key
on any route, OpenAI's parameters (stop, n, logprobs, penalties, stream_options) and error
shapes, and one request's failure among others."""

import json
import logging
import math
import threading
import time

import httpx
import numpy as np
import pytest
import torch
from helpers import tiny_llama
from serving import Slow, metrics, never_reading_client, running, wait_idle

from kwker.hf import KwkDecoder
from kwker.sampling import SeededGenerator
from kwker.sequence import SequenceState
from kwker.serve import ServingEngine, create_app

KEY = "sekret"
AUTH = {"Authorization": f"Bearer {KEY}"}
ORIGIN = "https://chat.example"
STEP_SLEEP = 0.005  # s after each step: the tiny model's answers last long enough to cut


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=11, vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def solo(model, tokenizer):
    """A request's answer alone, from its own decoder: (token ids, n, sampling) -> tokens."""
    dec = KwkDecoder(model, max_cache_len=512, tokenizer=tokenizer)

    def run(ids, n, seed=None, temperature=1.0, **kw):
        if seed is not None:
            kw |= dict(do_sample=True, temperature=temperature, generator=SeededGenerator(seed))
        out = dec.generate(torch.tensor([ids]), max_new_tokens=n, eos_token_id=[], **kw)
        return out[0, len(ids) :].tolist()

    return run


@pytest.fixture(scope="module")
def server(model, tokenizer):
    dec = KwkDecoder(model, max_cache_len=512, max_batch=4, tokenizer=tokenizer)
    dec.config.eos_token_id = None  # a random model's text should not end by chance
    engine = ServingEngine(dec, tokenizer)
    app = create_app(engine, "tiny", api_key=KEY, allowed_origins=(ORIGIN,))
    engine.observer = Slow(engine.observer, STEP_SLEEP)
    with engine, running(app) as url:
        yield url, engine


def post(url, path, body, **kw):
    return httpx.post(f"{url}{path}", json=body, headers={**AUTH, **kw.pop("headers", {})}, **kw)


def is_openai_error(r, status, code=None, param=None):
    """The response is OpenAI's error shape with this status (and code / param)."""
    assert r.status_code == status, (r.status_code, r.text)
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert err["message"] and err["type"]
    if code is not None:
        assert err["code"] == code, err
    if param is not None:
        assert err["param"] == param, err
    return err


def events(lines) -> list:
    """The data of a stream's server-sent events ("[DONE]" as a string)."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


# --------------------------------------------------------------------------- a client going away
def test_a_stream_closed_after_one_token_stops_its_generation(server):
    url, engine = server
    before = metrics(url, AUTH)
    body = {"prompt": [5, 9, 33, 102], "max_tokens": 300, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, headers=AUTH) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                break  # one token, then the connection closes
    wait_idle(engine)
    after = metrics(url, AUTH)
    made = after[("kwker_generated_tokens_total",)] - before[("kwker_generated_tokens_total",)]
    cancelled = ("kwker_requests_ended_total", ("reason", "cancelled"))
    assert after[cancelled] - before.get(cancelled, 0) == 1
    # a step is ~5 ms here and 300 tokens take > 1.5 s: the cancel came within a few steps
    print("made after close:", made)
    assert made < 60, made
    assert after[("kwker_active_slots",)] == 0


def test_a_client_that_times_out_stops_its_generation(server):
    url, engine = server
    before = metrics(url, AUTH)
    body = {"prompt": [7, 8, 9], "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        post(url, "/v1/completions", body, timeout=0.3)
    wait_idle(engine)
    after = metrics(url, AUTH)
    made = after[("kwker_generated_tokens_total",)] - before[("kwker_generated_tokens_total",)]
    print("made after timeout:", made)
    assert made < 200, made  # 400 tokens take > 2 s; it was cut at 0.3 s, within a few steps
    cancelled = ("kwker_requests_ended_total", ("reason", "cancelled"))
    assert after[cancelled] - before.get(cancelled, 0) == 1


# ------------------------------------------------------------------------------------- bodies
def test_a_body_over_the_limit_gets_413_with_or_without_a_length(server):
    url, _ = server
    big = json.dumps({"prompt": "x" * (5 * 1024 * 1024), "max_tokens": 1}).encode()
    r = httpx.post(
        f"{url}/v1/completions",
        content=big,
        headers={**AUTH, "content-type": "application/json"},
    )
    is_openai_error(r, 413, "request_too_large")

    def chunks():  # no Content-Length: the limit is counted as the body arrives
        for i in range(0, len(big), 65536):
            yield big[i : i + 65536]

    r = httpx.post(
        f"{url}/v1/completions",
        content=chunks(),
        headers={**AUTH, "content-type": "application/json"},
    )
    is_openai_error(r, 413, "request_too_large")


def test_only_json_bodies_are_taken(server):
    url, _ = server
    body = json.dumps({"prompt": "Hi", "max_tokens": 1})
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**AUTH, **({"content-type": kind} if kind else {})}
        r = httpx.post(f"{url}/v1/completions", content=body, headers=headers)
        is_openai_error(r, 415, "unsupported_media_type")
    r = httpx.post(
        f"{url}/v1/completions",
        content=body,
        headers={**AUTH, "content-type": "application/json; charset=utf-8"},
    )
    assert r.status_code == 200


# ------------------------------------------------------------------------- web pages and hosts
def test_web_pages_are_refused_unless_their_origin_is_allowed(server):
    url, _ = server
    body = {"prompt": "Hi", "max_tokens": 1}
    r = post(url, "/v1/completions", body, headers={"Origin": "https://evil.example"})
    is_openai_error(r, 403, "origin_not_allowed")
    r = post(url, "/v1/completions", body, headers={"Origin": ORIGIN})
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
    pre = httpx.options(
        f"{url}/v1/completions",
        headers={"Origin": ORIGIN, "Access-Control-Request-Method": "POST"},
    )
    assert pre.status_code == 204 and "authorization" in pre.headers["access-control-allow-headers"]
    pre = httpx.options(f"{url}/v1/completions", headers={"Origin": "https://evil.example"})
    is_openai_error(pre, 403, "origin_not_allowed")


def test_a_rebinding_host_is_refused_on_loopback(server):
    url, _ = server
    port = url.rsplit(":", 1)[1]
    for host in (f"attacker.example:{port}", "attacker.example", f"127.0.0.1.nip.io:{port}"):
        r = httpx.get(f"{url}/v1/models", headers={**AUTH, "Host": host})
        is_openai_error(r, 403, "host_not_allowed")
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}"):
        assert httpx.get(f"{url}/v1/models", headers={**AUTH, "Host": host}).status_code == 200


# --------------------------------------------------------------------------------------- key
ROUTES = [
    ("GET", "/health"),
    ("GET", "/metrics"),
    ("GET", "/v1/models"),
    ("GET", "/v1/models/tiny"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/no-such-route"),
    ("DELETE", "/v1/models"),
]


@pytest.mark.parametrize("auth", [None, "Bearer wrong", "Bearer sekret2", "Basic sekret", "sekret"])
def test_a_wrong_or_missing_key_gets_401_on_every_route(server, auth):
    url, _ = server
    headers = {"content-type": "application/json"} | ({"Authorization": auth} if auth else {})
    for method, path in ROUTES:
        r = httpx.request(method, f"{url}{path}", headers=headers, content=b"{}")
        err = is_openai_error(r, 401, "invalid_api_key")
        assert "API key" in err["message"], (method, path)
    good = httpx.get(f"{url}/health", headers=AUTH)
    assert good.status_code == 200 and good.json()["status"] == "ok"


def test_the_key_is_read_from_a_file_or_the_environment(tmp_path, monkeypatch, capsys):
    from kwker.api_keys import api_key_from

    path = tmp_path / "key"
    path.write_text("from-file\n")
    monkeypatch.setenv("KWKER_API_KEY", "from-env")
    assert api_key_from(str(path), "from-argv") == "from-file"
    assert api_key_from(None, "from-argv") == "from-env"
    monkeypatch.delenv("KWKER_API_KEY")
    assert api_key_from(None, "from-argv") == "from-argv"
    assert "`ps`" in capsys.readouterr().err
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        api_key_from(str(tmp_path / "empty"), None)


# ------------------------------------------------------------------------------- parameters
def test_stop_sequences_end_the_answer_before_them(server, solo, tokenizer):
    url, _ = server
    ids = tokenizer("The weather today is")["input_ids"]
    full = tokenizer.decode(solo(ids, 40), skip_special_tokens=True)
    # two stop strings from inside the answer: it ends before the earlier one
    a, b = full[20:23], full[30:32]
    expect = full[: min(full.find(a), full.find(b))]
    body = {"prompt": "The weather today is", "max_tokens": 40, "temperature": 0, "stop": [b, a]}
    r = post(url, "/v1/completions", body)
    assert r.status_code == 200
    choice = r.json()["choices"][0]
    assert choice["text"] == expect and choice["finish_reason"] == "stop"
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=AUTH
    ) as s:
        got = events(s.iter_lines())
    assert got[-1] == "[DONE]"
    assert "".join(e["choices"][0]["text"] for e in got[:-1]) == expect
    assert got[-2]["choices"][0]["finish_reason"] == "stop"
    r = post(url, "/v1/completions", {**body, "stop": ["a", "b", "c", "d", "e"]})
    is_openai_error(r, 400, "unsupported_value", "stop")


def test_finish_reason_is_length_on_both_paths(server):
    url, _ = server
    body = {"prompt": "Once", "max_tokens": 5, "temperature": 0}
    assert post(url, "/v1/completions", body).json()["choices"][0]["finish_reason"] == "length"
    with httpx.stream(
        "POST", f"{url}/v1/completions", json={**body, "stream": True}, headers=AUTH
    ) as s:
        got = events(s.iter_lines())
    finishes = [e["choices"][0]["finish_reason"] for e in got[:-1]]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}


@pytest.mark.parametrize(
    "change, param",
    [
        ({"n": 2}, "n"),
        ({"temperature": True}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"seed": 1.5}, "seed"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": "10"}, "max_tokens"),
        ({"top_p": 0}, "top_p"),
        ({"stream_options": {"include_usage": True}}, "stream_options"),
        ({"logit_bias": {"5": 10}}, "logit_bias"),
        ({"echo": True}, "echo"),
        ({"best_of": 3}, "best_of"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frobnicate": 1}, "frobnicate"),
    ],
)
def test_bad_parameters_get_a_400_naming_them(server, change, param):
    url, _ = server
    r = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 2} | change)
    err = is_openai_error(r, 400, param=param)
    assert param in err["message"]


def test_numbers_json_cannot_hold_are_refused(server):
    url, _ = server
    for raw in ('"seed": Infinity', '"temperature": NaN', '"seed": -Infinity'):
        r = httpx.post(
            f"{url}/v1/completions",
            content=('{"prompt": "Hi", "max_tokens": 2, ' + raw + "}").encode(),
            headers={**AUTH, "content-type": "application/json"},
        )
        err = is_openai_error(r, 400, "invalid_value")
        assert err["param"] in ("seed", "temperature")


def test_chat_refuses_tools_and_what_it_cannot_do(server):
    url, _ = server
    msgs = [{"role": "user", "content": "Hi"}]
    r = post(url, "/v1/chat/completions", {"messages": msgs, "tools": [{"type": "function"}]})
    is_openai_error(r, 400, "unsupported_value", "tools")
    r = post(url, "/v1/chat/completions", {"messages": msgs, "top_logprobs": 2})
    is_openai_error(r, 400, "unsupported_value", "top_logprobs")
    r = post(url, "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]})
    is_openai_error(r, 400, "invalid_value", "messages.0.role")
    r = post(url, "/v1/chat/completions", {"messages": []})
    is_openai_error(r, 400, param="messages")
    r = post(url, "/v1/chat/completions", {"max_tokens": 2})
    is_openai_error(r, 400, "missing_required_parameter", "messages")


def test_max_tokens_null_means_up_to_the_context(server, tokenizer):
    url, _ = server
    prompt = "word " * 480
    n = len(tokenizer(prompt)["input_ids"])
    r = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": None, "temperature": 0})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 512 - n
    assert r.json()["choices"][0]["finish_reason"] == "length"
    r = post(url, "/v1/completions", {"prompt": prompt, "max_tokens": 100})
    err = is_openai_error(r, 400, "context_length_exceeded", "max_tokens")
    assert f"at most {512 - n}" in err["message"]


def test_logprobs_are_the_models_log_softmax(server, model, tokenizer):
    url, _ = server
    msgs = [{"role": "user", "content": "Name a colour"}]
    body = {
        "messages": msgs,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    r = post(url, "/v1/chat/completions", body)
    assert r.status_code == 200
    entries = r.json()["choices"][0]["logprobs"]["content"]
    assert len(entries) == 6
    ids = tokenizer.apply_chat_template(
        msgs, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([list(ids)])).logits[0, -1].double()
    ref = torch.log_softmax(logits, -1)
    first = entries[0]
    best = torch.topk(ref, 3)
    # greedy: the chosen token is the likeliest, and its log-probability is the model's
    assert [t["logprob"] for t in first["top_logprobs"]] == pytest.approx(
        best.values.tolist(), abs=2e-3
    )
    assert first["logprob"] == pytest.approx(float(best.values[0]), abs=2e-3)
    assert bytes(first["bytes"]).decode("utf-8", "replace") == first["token"]
    assert tokenizer.decode(best.indices[:1].tolist()) == bytes(first["bytes"]).decode()
    for e in entries:
        assert e["logprob"] == e["top_logprobs"][0]["logprob"]  # greedy picks the top one
        assert all(t["logprob"] <= 0 for t in e["top_logprobs"])
    text = r.json()["choices"][0]["message"]["content"]
    assert b"".join(bytes(e["bytes"]) for e in entries).decode() == text
    # completions: the legacy columns
    r = post(
        url, "/v1/completions", {"prompt": "Once", "max_tokens": 4, "temperature": 0, "logprobs": 2}
    )
    lp = r.json()["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 4
    assert all(len(t) <= 2 for t in lp["top_logprobs"])
    assert "".join(lp["tokens"]) == r.json()["choices"][0]["text"]


def test_logprobs_do_not_change_the_tokens(server):
    url, _ = server
    for extra in ({"temperature": 0}, {"temperature": 0.9, "seed": 5}):
        body = {"prompt": "Tell me", "max_tokens": 24} | extra
        plain = post(url, "/v1/completions", body).json()["choices"][0]["text"]
        with_lp = post(url, "/v1/completions", body | {"logprobs": 1}).json()["choices"][0]["text"]
        assert plain == with_lp


def test_presence_and_frequency_penalties_follow_openais_rule(server, model, tokenizer):
    url, _ = server
    prompt = tokenizer("a b a b a b a b")["input_ids"]
    presence, frequency = 0.7, 0.4
    tokens: list[int] = []
    with torch.no_grad():  # the rule, step by step on the model's own logits
        for _ in range(12):
            logits = model(torch.tensor([prompt + tokens])).logits[0, -1].clone()
            ids, counts = np.unique(np.array(tokens, dtype=np.int64), return_counts=True)
            logits[ids] -= presence + frequency * torch.tensor(counts, dtype=logits.dtype)
            tokens.append(int(torch.argmax(logits)))
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0,
            "presence_penalty": presence, "frequency_penalty": frequency}  # fmt: skip
    r = post(url, "/v1/completions", body)
    assert r.json()["choices"][0]["text"] == tokenizer.decode(tokens, skip_special_tokens=True)
    unpenalized = post(
        url, "/v1/completions", body | {"presence_penalty": 0, "frequency_penalty": 0}
    )
    assert unpenalized.json()["choices"][0]["text"] != r.json()["choices"][0]["text"]


def test_include_usage_adds_a_last_chunk_with_kwkers_figures(server):
    url, _ = server
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 7, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=AUTH) as s:
        got = events(s.iter_lines())
    assert got[-1] == "[DONE]"
    last = got[-2]
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == 7
    k = last["usage"]["kwker"]
    assert k["new_tokens"] == 7 and k["tokens_per_s"] > 0 and k["steps"] >= 1
    assert all(e["usage"] is None for e in got[:-2])
    assert got[0]["choices"][0]["delta"]["role"] == "assistant"
    body.pop("stream_options")
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, headers=AUTH) as s:
        got = events(s.iter_lines())
    assert all("usage" not in e for e in got[:-1])


# ---------------------------------------------------------------------------------- errors
def test_errors_come_in_openais_shape(server):
    url, _ = server
    is_openai_error(httpx.get(f"{url}/v1/nothing", headers=AUTH), 404, "not_found")
    is_openai_error(httpx.get(f"{url}/v1/completions", headers=AUTH), 405, "method_not_allowed")
    is_openai_error(httpx.get(f"{url}/v1/models/gpt-9", headers=AUTH), 404, "model_not_found")
    r = post(url, "/v1/completions", {"model": "gpt-9", "prompt": "Hi"})
    is_openai_error(r, 404, "model_not_found", "model")
    r = httpx.post(
        f"{url}/v1/completions",
        content=b"{not json",
        headers={**AUTH, "content-type": "application/json"},
    )
    is_openai_error(r, 400, "invalid_json")
    r = post(url, "/v1/completions", {"prompt": [10**9]})
    is_openai_error(r, 400)


def test_json_nested_at_any_depth_gets_a_400_and_no_traceback(server):
    """`[` * 100000 made Python's JSON parser recurse past its limit: a 500 and a 90-line
    traceback in the log for each request. Too deep a body, whether the parser takes it or not,
    is now a 400 in OpenAI's shape that logs nothing, and the server answers the next request."""
    url, _ = server
    logged = []
    catcher = logging.Handler()
    catcher.emit = logged.append
    # where uvicorn logs an app's uncaught exception; added once the server runs, since uvicorn's
    # logging setup at start replaces its loggers' handlers
    log = logging.getLogger("uvicorn.error")
    log.addHandler(catcher)
    # 150 levels: past MAX_JSON_DEPTH, within what the parser takes
    deep_prompt = b'{"prompt": ' + b"[" * 150 + b"1" + b"]" * 150 + b', "max_tokens": 2}'
    message = {"role": "user", "content": "Hi"}
    for _ in range(200):
        message = {"role": "user", "content": [message]}  # 400 levels: the parser takes it
    try:
        for body in (b"[" * 100_000, deep_prompt, json.dumps({"messages": [message]}).encode()):
            r = httpx.post(
                f"{url}/v1/chat/completions" if b"messages" in body else f"{url}/v1/completions",
                content=body,
                headers={**AUTH, "content-type": "application/json"},
            )
            err = is_openai_error(r, 400, "invalid_json")
            assert "nests deeper than" in err["message"]
    finally:
        log.removeHandler(catcher)
    assert logged == []
    r = post(url, "/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


@pytest.fixture
def failing(monkeypatch):
    """A request whose prompt holds token 4242 fails at its third decode step (its sampler
    raising, say): the others in the batch must not notice."""
    absorb = SequenceState.absorb

    def flaky(self, *args):
        if 4242 in self.prompt and self.stats.steps == 2:
            raise FloatingPointError("the scores of this sequence are all NaN")
        return absorb(self, *args)

    monkeypatch.setattr(SequenceState, "absorb", flaky)


def test_a_failing_sequence_ends_only_its_own_request(server, solo, failing):
    url, engine = server
    prompts = [[5, 9, 33, 102, 7], [400, 12, 19], [3, 1, 4, 1, 5, 9], [88, 77, 66, 55]]
    results = {}

    def ask(i):
        body = {"prompt": prompts[i], "max_tokens": 30, "temperature": 0}
        results[i] = post(url, "/v1/completions", body, timeout=60)

    def broken_stream():
        body = {"prompt": [4242, 17, 23], "max_tokens": 30, "temperature": 0, "stream": True}
        with httpx.stream(
            "POST", f"{url}/v1/completions", json=body, headers=AUTH, timeout=60
        ) as s:
            results["stream"] = events(s.iter_lines())

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=broken_stream))
    for t in threads:
        t.start()
    broken = post(url, "/v1/completions", {"prompt": [4242, 5], "max_tokens": 30, "temperature": 0})
    for t in threads:
        t.join()
    err = is_openai_error(broken, 500, "generation_failed")
    assert "all NaN" in err["message"]
    got = results["stream"]
    assert got[-1] == "[DONE]" and got[-2]["error"]["code"] == "generation_failed"
    for i in range(4):
        r = results[i]
        assert r.status_code == 200
        assert r.json()["usage"]["completion_tokens"] == 30
    wait_idle(engine)
    after = metrics(url, AUTH)
    assert after[("kwker_requests_ended_total", ("reason", "error"))] >= 2
    assert after[("kwker_active_slots",)] == 0


def test_the_failing_request_leaves_the_others_answers_exact(model, tokenizer, solo, failing):
    dec = KwkDecoder(model, max_cache_len=512, max_batch=4, tokenizer=tokenizer)
    prompts = [[5, 9, 33, 102, 7], [4242, 1, 2], [3, 1, 4, 1, 5, 9], [88, 77, 66, 55]]
    with ServingEngine(dec) as engine:
        reqs = [engine.submit(p, 25, eos_token_id=[]) for p in prompts]
        with pytest.raises(FloatingPointError):
            reqs[1].tokens()
        for p, req in zip(prompts, reqs, strict=True):
            if p[0] != 4242:
                assert req.tokens() == solo(p, 25)
        assert reqs[1].finish_reason == "error"
        # and the server goes on serving, exactly
        assert engine.submit(prompts[0], 10, eos_token_id=[]).tokens() == solo(prompts[0], 10)


def test_tokenizing_does_not_hold_up_the_event_loop(server):
    url, _ = server
    body = json.dumps({"prompt": "word " * 700_000, "max_tokens": 1}).encode()  # 3.5 MB
    done = {}

    def big():
        r = httpx.post(
            f"{url}/v1/completions", content=body, timeout=120,
            headers={**AUTH, "content-type": "application/json"},
        )  # fmt: skip
        done["big"] = (time.monotonic(), r.status_code)

    t = threading.Thread(target=big)
    t.start()
    time.sleep(0.3)  # the big body is sent; its tokenizing has begun
    answered = []
    while "big" not in done and len(answered) < 20:
        assert httpx.get(f"{url}/v1/models", headers=AUTH).status_code == 200
        answered.append(time.monotonic())
    t.join()
    # /v1/models answered while the big prompt was still being tokenized
    assert answered and answered[0] < done["big"][0], (answered[:1], done)
    assert done["big"][1] == 400  # 700k tokens: more than the context


def test_a_client_that_never_reads_does_not_stall_the_others(server, solo, tokenizer):
    url, engine = server
    body = {"prompt": "Go on", "max_tokens": 480, "temperature": 0}
    lazy = never_reading_client(url, body, KEY)
    try:
        time.sleep(0.2)
        for i in range(3):
            ids = [100 + i, 200, 300]
            r = post(
                url,
                "/v1/completions",
                {"prompt": ids, "max_tokens": 20, "temperature": 0},
                timeout=30,
            )
            assert r.json()["choices"][0]["text"] == tokenizer.decode(
                solo(ids, 20), skip_special_tokens=True
            )
    finally:
        lazy.close()
    wait_idle(engine)


def test_seeded_requests_get_their_solo_answer(server, solo, tokenizer):
    url, _ = server
    ids = [12, 34, 56, 78]
    for seed in (1, 99, 2**40):
        body = {"prompt": ids, "max_tokens": 16, "temperature": 0.8, "seed": seed}
        got = post(url, "/v1/completions", body).json()["choices"][0]["text"]
        assert got == tokenizer.decode(
            solo(ids, 16, seed=seed, temperature=0.8), skip_special_tokens=True
        )


def test_health_and_metrics(server):
    url, _ = server
    h = httpx.get(f"{url}/health", headers=AUTH).json()
    assert h["status"] == "ok" and h["model"] == "tiny"
    before = metrics(url, AUTH)
    post(url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0})
    after = metrics(url, AUTH)
    ok = ("kwker_requests_total", ("path", "/v1/completions"), ("status", "200"))
    assert after[ok] - before.get(ok, 0) == 1
    assert after[("kwker_prompt_tokens_total",)] - before[("kwker_prompt_tokens_total",)] == 3
    assert after[("kwker_step_seconds_count",)] > before[("kwker_step_seconds_count",)]
    assert after[("kwker_queue_depth",)] == 0
    refused = ("kwker_requests_total", ("path", "/v1/models"), ("status", "401"))
    httpx.get(f"{url}/v1/models")
    assert metrics(url, AUTH)[refused] >= 1
    assert not math.isnan(after[("kwker_request_seconds_sum",)])


def test_the_remote_client_fits_its_cap_to_a_long_conversation(server, tokenizer):
    """The app asks for up to its max_new_tokens; where the conversation leaves less room, the
    server refuses (as vLLM and OpenAI do), and the client asks again without the cap."""
    from kwker.remote import RemoteModel

    url, _ = server
    messages = [{"role": "user", "content": "word " * 450}]
    ids = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=True
    )["input_ids"]
    n = len(ids)
    chunks = list(RemoteModel(f"{url}/v1", "tiny", KEY).stream_chat(messages, 200, temperature=0))
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].stats["new_tokens"] == 512 - n < 200
