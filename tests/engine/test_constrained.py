"""Constrained answers (kwker.constrained): under a JSON schema every answer validates, and the
grammar changes nothing of exactness: the same text with and without prompt lookup and a draft,
and in a batch of 8, greedy and seeded. The tokens the grammar forces are proposed as "grammar"
steps. A schema the library cannot compile is a ValueError naming the problem."""

import json

import jsonschema
import pytest
from helpers import tiny_llama

from kwker.constrained import ConstraintError
from kwker.hf import KwkDecoder
from kwker.sampling import SeededGenerator

NAME = {"type": "string", "pattern": "^[a-z]{1,8}$"}
SHORT = {"type": "string", "maxLength": 10}
SCHEMAS = [
    {"type": "object", "properties": {"name": NAME}, "required": ["name"]},
    {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["age"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
     "required": ["color"]},
    {"type": "object", "properties": {"x": {"type": "number", "minimum": -5, "maximum": 5}},
     "required": ["x"]},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 1,
     "maxItems": 4},
    {"type": "array", "items": NAME, "maxItems": 3},
    {"type": "object", "properties": {"user": {"type": "object", "properties": {
        "name": NAME, "id": {"type": "integer", "minimum": 1, "maximum": 999}},
        "required": ["name", "id"]}}, "required": ["user"]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": {"enum": ["a", "b"]},
     "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"date": {"type": "string",
     "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}}, "required": ["date"]},
    {"type": "object", "properties": {"a": NAME, "b": NAME, "c": NAME},
     "required": ["a", "b", "c"]},
    {"type": "object", "properties": {"n": {"type": "integer", "minimum": 10, "maximum": 20},
     "m": {"type": "integer", "minimum": -3, "maximum": 3}}, "required": ["n", "m"]},
    {"type": "object", "properties": {"kind": {"const": "point"}, "x": {"type": "integer",
     "minimum": 0, "maximum": 9}}, "required": ["kind", "x"]},
    {"type": "object", "properties": {"note": SHORT}, "required": ["note"]},
    {"type": "object", "properties": {"rows": {"type": "array", "maxItems": 2, "items": {
        "type": "object", "properties": {"k": NAME, "v": {"type": "boolean"}},
        "required": ["k", "v"]}}}, "required": ["rows"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0,
     "maximum": 5}, {"type": "boolean"}]}}, "required": ["value"]},
    {"type": "object", "properties": {"email": {"type": "string",
     "pattern": "^[a-z]{1,6}@[a-z]{1,6}\\.com$"}}, "required": ["email"]},
    {"type": "object", "properties": {"level": {"enum": ["low", "mid", "high"]},
     "score": {"type": "number", "minimum": 0, "maximum": 1}}, "required": ["level", "score"]},
    {"type": "object", "properties": {"deep": {"type": "object", "properties": {"deeper": {
        "type": "object", "properties": {"leaf": {"type": "integer", "minimum": 0,
        "maximum": 3}}, "required": ["leaf"]}}, "required": ["deeper"]}},
     "required": ["deep"]},
    {"type": "object", "properties": {"id": {"type": "string", "pattern": "^[A-F0-9]{4}$"},
     "on": {"type": "boolean"}}, "required": ["id", "on"], "additionalProperties": False},
]  # fmt: skip
PROMPT = [5, 9, 33, 102, 7, 61, 5, 9, 33]


def strict(schema):
    """The schema with no properties beyond those named, as OpenAI's strict mode has it: a random
    model's free keys and strings would never end."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if out.get("type") == "object":
        out.setdefault("additionalProperties", False)
    return out


SCHEMAS = [strict(s) for s in SCHEMAS]
N = 160


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=3, vocab=49152, hidden=64, heads=2, kv_heads=1, inter=96, layers=2)


@pytest.fixture(scope="module")
def tokenizer(smollm2_tokenizer):
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def dec(model, tokenizer):
    return KwkDecoder(model, max_cache_len=512, max_batch=8, tokenizer=tokenizer)


def answer(dec, seed, prompt=PROMPT, **options):
    sampling = {}
    if seed is not None:
        sampling = dict(do_sample=True, temperature=1.0, generator=SeededGenerator(seed))
    return [c.token for c in dec.stream_generate(prompt, N, **sampling, **options)]


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_every_answer_validates_and_speculation_changes_no_token(dec, tokenizer, index):
    schema = SCHEMAS[index]
    for seed in (None, 11, 12):
        plain = answer(dec, seed, json_schema=schema, lookup=0)
        assert plain[-1] == tokenizer.eos_token_id, tokenizer.decode(plain)  # it ended
        jsonschema.validate(json.loads(tokenizer.decode(plain[:-1])), schema)
        assert answer(dec, seed, json_schema=schema) == plain  # with prompt lookup


@pytest.mark.parametrize("index", range(len(SCHEMAS)))
def test_a_batch_of_8_gives_each_answer_its_own_text(dec, tokenizer, index):
    schema = SCHEMAS[index]
    seeds = list(range(20, 28))
    alone = [answer(dec, seed, json_schema=schema, lookup=0) for seed in seeds]
    batch = dec.generate_batch(
        [PROMPT] * 8, N, json_schema=schema, do_sample=True, temperature=1.0,
        generator=[SeededGenerator(s) for s in seeds], tokenizer=tokenizer,
    )  # fmt: skip
    assert [list(b[len(PROMPT) :]) for b in batch] == alone


def test_a_draft_changes_no_token(model, dec, tokenizer):
    draft = KwkDecoder(model, max_cache_len=512, tokenizer=tokenizer)
    for schema in SCHEMAS[:10]:
        for seed in (None, 20):
            plain = answer(dec, seed, json_schema=schema, lookup=0)
            assert answer(dec, seed, json_schema=schema, draft=draft) == plain


def test_forced_tokens_are_proposed_and_accepted(dec, tokenizer):
    schema = {"type": "object", "properties": {"a_rather_long_key_name": {"type": "boolean"},
              "another_long_key": {"type": "boolean"}},
              "required": ["a_rather_long_key_name", "another_long_key"]}  # fmt: skip
    stats = None
    tokens = []
    for c in dec.stream_generate(PROMPT, N, json_schema=schema, lookup=0):
        tokens.append(c.token)
        stats = c.stats
    assert stats.proposed["grammar"] >= 8 and stats.accepted["grammar"] == stats.proposed["grammar"]
    assert stats.steps < len(tokens) - 8  # the keys came in steps of several tokens


def test_a_lark_grammar(dec, tokenizer):
    text = tokenizer.decode(answer(dec, 5, grammar='start: ("yes" | "no") "!"')[:-1])
    assert text in ("yes!", "no!")


@pytest.mark.slow
def test_json_object_parses_from_the_real_model(smollm2):
    """Any JSON object: its keys and strings are free, so a random model's never end; a real one's
    do, at the first answer of each question."""
    model, tokenizer = smollm2
    real = KwkDecoder(model, max_cache_len=512, tokenizer=tokenizer)
    for question in ("Describe a cat as JSON.", "Give me a JSON object about Paris."):
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}], add_generation_prompt=True
        )
        ids = ids["input_ids"] if isinstance(ids, dict) else ids
        out = [c.token for c in real.stream_generate(ids, 200, json_object=True)]
        assert out[-1] in (real.config.eos_token_id, tokenizer.eos_token_id)
        assert isinstance(json.loads(tokenizer.decode(out[:-1])), dict)


def test_a_schema_that_cannot_be_compiled_is_refused_with_the_reason(dec):
    with pytest.raises(ConstraintError, match="nonsense"):
        answer(dec, None, json_schema={"type": "nonsense"})
    with pytest.raises(ValueError, match="one of"):
        answer(dec, None, json_schema={"type": "object"}, json_object=True)
