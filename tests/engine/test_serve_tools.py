"""Tools over `kwker serve` with the OpenAI SDK: a tiny random model that speaks Qwen2.5's chat
template (tests/tool_templates.py) calls tools under tool_choice required and named (a random
model would not call by itself), its arguments validate against the tool's schema, the SDK's tool
loop goes on with the tool's result, streamed deltas add up to the whole answer, parallel calls
come only when allowed, and what cannot be served gets a 400 naming it."""

import json

import httpx
import jsonschema
import pytest
from helpers import tiny_llama
from openai import OpenAI
from serving import running
from tool_templates import qwen25_tokenizer

from kwker.hf import KwkDecoder
from kwker.serve import ServingEngine, create_app

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12},
           "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city"],
           "additionalProperties": False}  # fmt: skip
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
       "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"],
       "additionalProperties": False}  # fmt: skip
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}},
]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def url(smollm2_tokenizer):
    tokenizer = qwen25_tokenizer(smollm2_tokenizer)
    model = tiny_llama(seed=3, vocab=49160, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)
    dec = KwkDecoder(model, max_cache_len=1024, max_batch=4, tokenizer=tokenizer)
    with ServingEngine(dec, tokenizer) as engine, running(create_app(engine, "tiny")) as url:
        yield url


@pytest.fixture(scope="module")
def client(url):
    return OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)


def ask(client, messages=ASK, **extra):
    options = dict(model="tiny", messages=messages, tools=TOOLS, seed=4, max_tokens=120)
    return client.chat.completions.create(**(options | extra))


def check_calls(calls, name=None):
    assert calls
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        assert name in (None, call.function.name)
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def test_a_two_step_tool_loop(client):
    reply = ask(client, tool_choice="required", parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    check_calls(choice.message.tool_calls)
    call = choice.message.tool_calls[0]
    # the SDK's loop: the answer as it came, then the tool's result, then the final answer
    messages = [*ASK, choice.message, {"role": "tool", "tool_call_id": call.id,
                                       "content": json.dumps({"temperature_c": 18})}]  # fmt: skip
    final = ask(client, messages, tool_choice="none")
    assert final.choices[0].finish_reason in ("stop", "length")
    assert final.choices[0].message.tool_calls is None
    assert isinstance(final.choices[0].message.content, str)
    # the same history with the tools callable again: a call, or a text answer, as the model says
    again = ask(client, messages, tool_choice="required").choices[0]
    check_calls(again.message.tool_calls)


def streamed(client, **extra):
    """A streamed answer put together as OpenAI's clients do: content, and per call index its
    id, name and the arguments' fragments."""
    content, calls, finish = "", {}, None
    for event in ask(client, stream=True, **extra):
        delta = event.choices[0].delta
        content += delta.content or ""
        for piece in delta.tool_calls or ():
            call = calls.setdefault(piece.index, {"id": None, "name": "", "arguments": ""})
            call["id"] = piece.id or call["id"]
            call["name"] += piece.function.name or ""
            call["arguments"] += piece.function.arguments or ""
        finish = event.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_streamed_deltas_add_up_to_the_whole_answer(client, choice):
    whole = ask(client, tool_choice=choice).choices[0]
    content, calls, finish = streamed(client, tool_choice=choice)
    assert finish == whole.finish_reason == "tool_calls"
    assert content == (whole.message.content or "")
    got = [(c["name"], c["arguments"]) for c in calls]
    assert got == [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert all(c["id"].startswith("call_") for c in calls)
    check_calls(whole.message.tool_calls, None if choice == "required" else "add")


def test_a_named_tool_is_the_one_called(client):
    for seed in (1, 2, 3):
        choice = {"type": "function", "function": {"name": "get_weather"}}
        reply = ask(client, tool_choice=choice, seed=seed, temperature=1.0)
        check_calls(reply.choices[0].message.tool_calls, "get_weather")


def test_parallel_calls_only_when_allowed(client):
    counts = [len(ask(client, tool_choice="required", seed=s, temperature=1.0)
                  .choices[0].message.tool_calls) for s in range(6)]  # fmt: skip
    assert max(counts) >= 2, counts  # the model went on calling: several calls in one answer
    for s in range(6):
        one = ask(client, tool_choice="required", seed=s, temperature=1.0,
                  parallel_tool_calls=False).choices[0]  # fmt: skip
        assert len(one.message.tool_calls) == 1 and one.finish_reason == "tool_calls"


def test_lookup_changes_no_call(client):
    with_lookup = ask(client, tool_choice="required", temperature=1.0, seed=9)
    without = ask(client, tool_choice="required", temperature=1.0, seed=9, extra_body={"lookup": 0})
    a, b = with_lookup.choices[0].message, without.choices[0].message
    assert [c.function.arguments for c in a.tool_calls] == [
        c.function.arguments for c in b.tool_calls]  # fmt: skip


def test_what_cannot_be_served_gets_a_400(url, smollm2_tokenizer):
    def post(**body):
        body = {"messages": ASK, "max_tokens": 8} | body
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)

    r = post(tool_choice="auto")
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = post(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = post(tools=[{"type": "function", "function": {"name": "bad name!"}}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    r = post(tools=TOOLS, response_format={"type": "json_object"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    r = post(functions=[{"name": "f"}])
    assert r.status_code == 400 and r.json()["error"]["param"] == "functions"


def test_a_model_without_tools_says_so(smollm2_tokenizer):
    model = tiny_llama(seed=3, vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)
    dec = KwkDecoder(model, max_cache_len=256, tokenizer=smollm2_tokenizer)
    with ServingEngine(dec, smollm2_tokenizer) as engine, running(create_app(engine, "t")) as url:
        body = {"messages": ASK, "tools": TOOLS, "max_tokens": 8}
        r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"
    assert "has no tools" in r.json()["error"]["message"]
