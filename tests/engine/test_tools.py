"""Tool calls in the engine (kwker.tools): each family's format read from its real template and
its calls parsed back from what the template writes; the parser on pieces cut anywhere; calls
under tool_choice required / named / auto whose arguments validate against the tool's schema;
and the same tokens with and without prompt lookup, a draft and batching."""

import json

import jsonschema
import pytest
from helpers import tiny_llama
from tool_templates import llama31_tokenizer, mistral_tokenizer, qwen25_tokenizer

from kwker.hf import KwkDecoder
from kwker.sampling import SeededGenerator
from kwker.tools import (
    ToolCall,
    ToolCallParser,
    ToolError,
    assistant_message,
    chat_prompt,
    for_template,
    new_call_id,
    parse_answer,
    require_format,
    tool_constraint,
    tool_format,
)

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}},
           "required": ["city"], "additionalProperties": False}  # fmt: skip
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
       "b": {"type": "integer", "minimum": 0, "maximum": 99}}, "required": ["a", "b"],
       "additionalProperties": False}  # fmt: skip
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]  # fmt: skip
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
FAMILIES = {"hermes": qwen25_tokenizer, "llama3": llama31_tokenizer, "mistral": mistral_tokenizer}


def feed_all(parser, pieces):
    text, calls = "", []
    for piece in pieces:
        t, c = parser.feed(piece)
        text, calls = text + t, calls + c
    t, c = parser.flush()
    return text + t, calls + c


def joined(deltas):
    """Streamed deltas put together per call: (name, arguments)."""
    out = {}
    for d in deltas:
        name, args = out.get(d.index, ("", ""))
        out[d.index] = (name + (d.name or ""), args + d.arguments)
    return [out[i] for i in sorted(out)]


@pytest.mark.parametrize("family", FAMILIES)
def test_calls_written_by_the_real_template_parse_back(smollm2_tokenizer, family):
    tok = FAMILIES[family](smollm2_tokenizer)
    fmt = tool_format(tok)
    assert fmt.name == family
    calls = [ToolCall(new_call_id(fmt), "get_weather", '{"city": "Paris"}')]
    if family != "llama3":  # Llama 3.1's template takes one call per answer
        calls.append(ToolCall(new_call_id(fmt), "add", '{"a": 1, "b": 2}'))
    history = [*ASK, assistant_message(None, calls)]
    before = tok.apply_chat_template(for_template(ASK), tools=TOOLS, tokenize=False)
    after = tok.apply_chat_template(for_template(history), tools=TOOLS, tokenize=False)
    assert after.startswith(before[: len(before) // 2])
    answer = (
        after[len(before) :] if after.startswith(before) else after.split(ASK[0]["content"])[-1]
    )
    for end in ("<|im_end|>\n", "<|eot_id|>", "</s>"):
        answer = answer.removesuffix(end)
    if family == "hermes":
        answer = answer.removeprefix("<|im_start|>assistant")
    elif family == "llama3":
        answer = answer.split("<|end_header_id|>\n\n")[-1]
    else:
        answer = answer.split("[/INST]")[-1]
    text, got = parse_answer(fmt, answer)
    assert text == "" and [(c.name, json.loads(c.arguments)) for c in got] == [
        (c.name, json.loads(c.arguments)) for c in calls]  # fmt: skip
    # cut anywhere into three pieces, the stream's deltas add up to the whole
    for i in range(0, len(answer), 7):
        for j in range(i, len(answer), 13):
            parser = ToolCallParser(fmt)
            streamed, deltas = feed_all(parser, [answer[:i], answer[i:j], answer[j:]])
            assert streamed == "" and joined(deltas) == [(c.name, c.arguments) for c in got]


def test_text_around_calls_and_what_is_no_call(smollm2_tokenizer):
    fmt = tool_format(qwen25_tokenizer(smollm2_tokenizer))
    said = 'Let me check.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>\nOk.'
    text, calls = parse_answer(fmt, said)
    assert text == "Let me check.\nOk." and calls[0].name == "add"
    assert calls[0].arguments == '{"a": 1}'
    # a bare call (small Qwen2.5 models write one), fenced or not; JSON that is no call is text
    bare = '```json\n{"name": "add", "arguments": {"a": 2}}\n```'
    assert [(c.name, c.arguments) for c in parse_answer(fmt, bare)[1]] == [("add", '{"a": 2}')]
    assert parse_answer(fmt, '{"name": "Bob"}') == ('{"name": "Bob"}', [])
    # a fenced call object naming a tool that was not offered is the text it was
    fenced = '```json\n{"name": "rm", "arguments": {}}\n```'
    parser = ToolCallParser(fmt, names=frozenset({"add"}))
    assert parser.feed(fenced).text + parser.flush().text == fenced and parser.calls == []
    parser = ToolCallParser(fmt, names=frozenset({"rm"}))
    assert parser.feed(fenced).text + parser.flush().text == "" and parser.calls[0].name == "rm"
    assert parse_answer(fmt, "a <tool_c b") == ("a <tool_c b", [])


def test_a_template_without_tools_says_so(smollm2_tokenizer):
    assert tool_format(smollm2_tokenizer) is None
    with pytest.raises(ToolError, match="has no tools"):
        require_format(smollm2_tokenizer)


@pytest.fixture(scope="module")
def qwen(smollm2_tokenizer):
    tok = qwen25_tokenizer(smollm2_tokenizer)
    model = tiny_llama(seed=3, vocab=49160, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)
    return model, tok, KwkDecoder(model, max_cache_len=1024, max_batch=4, tokenizer=tok)


def answer(dec, tok, seed, choice, **options):
    sampling = {}
    if seed is not None:
        sampling = dict(do_sample=True, temperature=1.0, generator=SeededGenerator(seed))
    ids = chat_prompt(tok, ASK, TOOLS)
    chunks = dec.stream_generate(ids, 160, tools=TOOLS, tool_choice=choice, tokenizer=tok,
                                 **sampling, **options)  # fmt: skip
    return [c.token for c in chunks]


CHOICES = ["required", {"type": "function", "function": {"name": "add"}}, "auto"]


@pytest.mark.parametrize("choice", CHOICES)
def test_calls_validate_and_speculation_changes_no_token(qwen, choice):
    model, tok, dec = qwen
    draft = KwkDecoder(model, max_cache_len=1024, tokenizer=tok)
    fmt = tool_format(tok)
    for seed in (None, 1, 2, 3):
        plain = answer(dec, tok, seed, choice, lookup=0)
        _, calls = parse_answer(fmt, tok.decode(plain, skip_special_tokens=True))
        if plain[-1] != tok.eos_token_id:  # cut at the length limit: its last call unfinished
            calls = calls[:-1]
        if choice != "auto":  # a random model calls only when it must
            assert calls
        for call in calls:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
            assert isinstance(choice, str) or call.name == "add"
        assert answer(dec, tok, seed, choice) == plain  # prompt lookup
        assert answer(dec, tok, seed, choice, lookup=0, draft=draft) == plain


def test_auto_constrains_a_call_the_model_opens(qwen):
    """A model that opens calls by itself (the open tag's logits row made the likeliest token's):
    free text until then, the call's grammar from the tag on, free again after it."""
    import torch

    model, tok, _ = qwen
    fmt = tool_format(tok)
    biased = type(model)(model.config)
    biased.load_state_dict(model.state_dict())
    head = biased.get_output_embeddings().weight
    plain = KwkDecoder(model, max_cache_len=1024, tokenizer=tok)
    first = answer(plain, tok, None, "auto", lookup=0)
    with torch.no_grad():  # the open tag wins wherever the model's favourite token would
        favourite = max(set(first), key=first.count)
        head[fmt.open_id] = head[favourite] * 1.01 + 0.01
    dec = KwkDecoder(biased, max_cache_len=1024, max_batch=4, tokenizer=tok)
    seen = 0
    for seed in (None, 5, 6, 7):
        tokens = answer(dec, tok, seed, "auto", lookup=0)
        assert answer(dec, tok, seed, "auto") == tokens
        _, calls = parse_answer(fmt, tok.decode(tokens, skip_special_tokens=True))
        for call in calls[: len(calls) - (tokens[-1] != tok.eos_token_id)]:
            jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])
        seen += len(calls)
    assert seen >= 1  # the model opened a call, and the grammar made it valid


def test_a_batch_gives_each_answer_its_own_tokens(qwen):
    _, tok, dec = qwen
    seeds = [11, 12, 13, 14]
    alone = [answer(dec, tok, s, "required", lookup=0) for s in seeds]
    ids = chat_prompt(tok, ASK, TOOLS)
    batch = dec.generate_batch(
        [ids] * 4, 160, tools=TOOLS, tool_choice="required", do_sample=True, temperature=1.0,
        generator=[SeededGenerator(s) for s in seeds], tokenizer=tok,
    )  # fmt: skip
    assert [list(b[len(ids) :]) for b in batch] == alone


def fed(constraint, tok, text):
    """(active, switched) after each token of text, fed to the constraint as the answer's."""
    out = []
    for t in tok(text, add_special_tokens=False)["input_ids"]:
        constraint.consume(t)
        out.append((constraint.active, constraint.switched))
    return out


def test_a_bare_call_is_constrained_from_where_it_shows(qwen):
    """A call written as a bare object (fenced or not: Qwen2.5-Coder-1.5B's way) has no token
    that opens it: the constraint watches the answer's start, and the token that completes
    '{"name":' switches the grammar on, over the tokens already written too, spaced as the
    model spaced them. A code block or a JSON answer that is no call stays free."""
    from kwker.constrained import ConstraintError

    _, tok, dec = qwen
    fmt = tool_format(tok)

    def constraint():
        return tool_constraint(fmt, TOOLS, tok, dec.vocab_size, [tok.eos_token_id])

    for start in ('```json\n{\n  "name":', '{"name":', ' {"name": '):
        c = constraint()
        states = fed(c, tok, start)
        on = [a for a, _ in states].index(True)  # from one token on, and only that one switched
        assert states[on:] == [(True, True)] + [(True, False)] * (len(states) - on - 1), start
        assert not any(a for a, _ in states[:on])
        fed(c, tok, ' "add",\n  "arguments": {"a": 2, "b": 3}\n}' + "\n```" * start.startswith("`"))
        assert c.inner.matcher.is_stopped() or c.allowed()[tok.eos_token_id]
    c = constraint()
    fed(c, tok, '```json\n{"name": ')
    with pytest.raises(ConstraintError):  # only an offered tool's name can follow
        fed(c, tok, '"rm_rf", "arguments": {}}')
    for text in ('```python\nprint({"name": 1})\n```', '{"city": "Paris"}', "Sure: {"):
        c = constraint()
        assert not any(a for a, _ in fed(c, tok, text)), text


@pytest.fixture(scope="module")
def coder():
    from kwker.models import CHAT_MODEL
    from kwker.models.loader import load_decoder

    return load_decoder(CHAT_MODEL, precision="int4", max_cache_len=1024)


@pytest.mark.slow
def test_the_chat_models_bare_calls_are_constrained_and_exact(coder):
    """Qwen2.5-Coder-1.5B-Instruct (the app's model) fences its calls as JSON: the grammar takes
    them over (its forced tokens are accepted as the grammar's), they validate, and lookup
    changes no token."""
    tools = [
        {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
        {"type": "function", "function": {"name": "add", "parameters": ADD}},
    ]
    tok = coder.tokenizer
    for question, name in (("What's the weather in Oslo?", "get_weather"),
                           ("Use the tool to add 17 and 25.", "add")):  # fmt: skip
        ids = chat_prompt(tok, [{"role": "user", "content": question}], tools)
        runs = []
        for options in ({}, {"lookup": 0}):
            chunks = list(coder.stream_generate(ids, 80, tools=tools, tool_choice="auto",
                                                tokenizer=tok, **options))  # fmt: skip
            runs.append(([c.token for c in chunks], chunks[-1].stats))
        (tokens, stats), (plain, _) = runs
        assert tokens == plain
        assert stats.accepted.get("grammar", 0) > 0  # the grammar was on
        _, calls = parse_answer(tool_format(tok), tok.decode(tokens, skip_special_tokens=True))
        (call,) = calls
        assert call.name == name
        jsonschema.validate(json.loads(call.arguments), SCHEMAS[name])
