"""int8 ("balanced") and int4 weights: logits close to the float model, tokens sensible on the real
model.

Tolerances on tiny random models (max abs logit error relative to the largest |logit|): int8 4e-2,
int4 3.5e-1 (random weights amplify rounding; the real model is checked below and in
test_quality.py). The error is the weights' rounding plus that of the activations, which the
int8/int4 kernels quantize to int8 per row and block of 32 (measured here: int8 2.2e-2, int4
2.6e-1)."""

import pytest
import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder

PROMPT = torch.tensor([[3, 17, 250, 9, 40, 511, 7, 99, 300, 12, 5, 6]])


@pytest.mark.parametrize("precision, tol", [("balanced", 4e-2), ("int4", 3.5e-1)])
def test_quantized_logits_close_to_float(precision, tol):
    model = tiny_llama(hidden=128, heads=2, kv_heads=1, inter=256, layers=2, tied=False)
    ref = KwkDecoder(model, max_cache_len=32).forward(PROMPT)
    q = KwkDecoder(model, max_cache_len=32, precision=precision)
    assert float((q.forward(PROMPT) - ref).abs().max() / ref.abs().max()) < tol


def test_packed_sizes():
    """int8 weights take 8.5 bits (an fp16 scale per 32). int4 takes 5 in the layers (an fp16 scale
    and min per 32), but 4.625 (Q4K) in a matrix whose rows are whole super-blocks of 256: here
    down, 256 wide; lm_head stays int8."""
    model = tiny_llama(vocab=1008, hidden=128, heads=2, kv_heads=1, inter=256, layers=2, tied=False)
    fp32 = KwkDecoder(model, max_cache_len=32).weight_bytes_per_token
    assert (
        KwkDecoder(model, max_cache_len=32, precision="balanced").weight_bytes_per_token
        == fp32 * 8.5 / 32
    )
    head, down = 1008 * 128, 2 * 128 * 256
    layers = fp32 / 4 - head - down
    assert (
        KwkDecoder(model, max_cache_len=32, precision="int4").weight_bytes_per_token
        == layers * 5 / 8 + down * 4.625 / 8 + head * 8.5 / 8
    )


QUESTIONS = [
    ("What is the capital of Germany?", "berlin"),  # facts the fp32 model itself gets right
    ("Who wrote Romeo and Juliet?", "shakespeare"),
    ("How many days are in a week?", "7"),
]


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["balanced", "int4"])
def test_quantized_real_model_answers_sensibly(smollm2, precision):
    """int8 and int4 keep the facts. (Not "the capital of France": fp32 itself puts "The" only 0.08
    logits above "L" there, and with int8 activations every quantized precision, like llama.cpp's
    Q8_0 of the same weights, answers "L'Étoile, ...".)"""
    model, tokenizer = smollm2
    dec = KwkDecoder(model, max_cache_len=256, precision=precision)
    for question, fact in QUESTIONS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        out = dec.generate(ids, max_new_tokens=40)
        answer = tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True).lower()
        assert fact in answer, (precision, question, answer)
