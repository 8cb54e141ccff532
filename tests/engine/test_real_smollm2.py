"""The real SmolLM2-135M-Instruct (from the PyPI source here): greedy chat answers equal
transformers' at fp32, and logits agree within the fp32 tolerance."""

import pytest
import torch

from kwker.hf import KwkDecoder

pytestmark = pytest.mark.slow

PROMPTS = [
    "What is the capital of France?",
    "Write a Python function that returns the square of a number.",
    "Name three colours of the rainbow.",
]


def chat_ids(tokenizer, text):
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": text}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    return ids


@pytest.fixture(scope="module")
def dec(smollm2):
    model, _ = smollm2
    return KwkDecoder(model, max_cache_len=256)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_chat_answer_equals_transformers(smollm2, dec, prompt):
    model, tokenizer = smollm2
    ids = chat_ids(tokenizer, prompt)
    ours = dec.generate(ids, max_new_tokens=48)
    theirs = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=48,
        do_sample=False,
        pad_token_id=tokenizer.eos_token_id,
    )
    assert torch.equal(ours, theirs), (tokenizer.decode(ours[0]), tokenizer.decode(theirs[0]))
    answer = tokenizer.decode(ours[0, ids.shape[1] :], skip_special_tokens=True)
    assert len(answer.split()) >= 3


def test_logits_within_fp32_tolerance(smollm2, dec):
    model, tokenizer = smollm2
    ids = chat_ids(tokenizer, PROMPTS[0])
    with torch.no_grad():
        ref = model(ids).logits[0]
    assert float((dec.forward(ids) - ref).abs().max() / ref.abs().max()) < 1e-4


def test_streamed_text_equals_decoded_tokens(smollm2, dec):
    _, tokenizer = smollm2
    ids = chat_ids(tokenizer, PROMPTS[2])
    chunks = list(dec.stream_generate(ids, max_new_tokens=32, tokenizer=tokenizer))
    text = "".join(c.text for c in chunks)
    assert text == tokenizer.decode([c.token for c in chunks], skip_special_tokens=True)
    assert "red" in text.lower() or "blue" in text.lower() or "green" in text.lower()
