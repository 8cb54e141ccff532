"""Structured output over `kwker serve`: response_format json_schema (OpenAI's shape) and the Lark
grammar extension give answers that validate, with the same text with prompt lookup off
(`lookup: 0`) and on, alone and with 8 requests at once; a schema that cannot be compiled gets a
400 naming the problem."""

import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import jsonschema
import pytest
from helpers import tiny_llama
from serving import running
from test_constrained import SCHEMAS

from kwker.hf import KwkDecoder
from kwker.serve import ServingEngine, create_app


@pytest.fixture(scope="module")
def url(smollm2_tokenizer):
    tokenizer = smollm2_tokenizer
    model = tiny_llama(seed=3, vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)
    dec = KwkDecoder(model, max_cache_len=512, max_batch=8, tokenizer=tokenizer)
    with ServingEngine(dec, tokenizer) as engine, running(create_app(engine, "tiny")) as url:
        yield url


def complete(url, seed, **extra):
    body = {"prompt": [5, 9, 33, 102, 7], "max_tokens": 160, "temperature": 1.0, "seed": seed}
    r = httpx.post(f"{url}/v1/completions", json=body | extra, timeout=120)
    return r


def schema_format(schema) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}


@pytest.mark.parametrize("index", [0, 5, 7, 14, 19])
def test_json_schema_answers_validate_and_lookup_changes_no_token(url, index):
    fmt = schema_format(SCHEMAS[index])
    r = complete(url, 31, response_format=fmt, lookup=0)
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["text"]), SCHEMAS[index])
    assert complete(url, 31, response_format=fmt).json()["choices"][0]["text"] == choice["text"]


def test_eight_structured_requests_at_once_each_get_their_own_text(url):
    fmt = schema_format(SCHEMAS[7])
    alone = [complete(url, seed, response_format=fmt).json() for seed in range(40, 48)]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda s: complete(url, s, response_format=fmt).json(),
                                 range(40, 48)))  # fmt: skip
    assert [a["choices"][0]["text"] for a in alone] == [t["choices"][0]["text"] for t in together]


def test_a_lark_grammar_and_the_chat_endpoint(url):
    r = complete(url, 3, grammar='start: ("yes" | "no") "!"')
    assert r.json()["choices"][0]["text"] in ("yes!", "no!")
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none")
    reply = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hi"}], seed=2, max_tokens=160,
        response_format=schema_format(SCHEMAS[3]),
    )  # fmt: skip
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMAS[3])


def test_a_schema_or_grammar_that_cannot_be_used_gets_a_400_naming_it(url):
    r = complete(url, 1, response_format=schema_format({"type": "nonsense"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    assert r.json()["error"]["message"].startswith("the JSON schema cannot be used: ")
    assert "nonsense" in r.json()["error"]["message"]
    r = complete(url, 1, response_format={"type": "json_schema"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"
    r = complete(url, 1, grammar="start: (")
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"
    r = complete(url, 1, grammar="start: 'a'", response_format={"type": "json_object"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"
