"""Native logits against transformers' forward on tiny random Llama configs of many shapes.

Tolerances (max abs difference relative to the largest |logit| of the reference):
  fp32 weights:           1e-4  (both compute in float32; only summation order differs)
  bf16 / fp16 weights:    1e-4  against transformers in float32 on the same rounded weights (Kwker
                          keeps activations in float32, so the weight rounding is the only
                          difference)
  bf16 vs transformers bf16: 0.1 (transformers rounds every activation to bf16; Kwker does not)
"""

import pytest
import torch
from helpers import tiny_llama

from kwker.hf import KwkDecoder

SHAPES = {
    "hd32-gqa1-tied": dict(hidden=64, heads=2, kv_heads=2, inter=96),
    "hd64-gqa3-untied": dict(hidden=192, heads=3, kv_heads=1, inter=200, tied=False),
    "hd128-gqa4": dict(hidden=256, heads=4, kv_heads=1, inter=320, layers=3),
    "odd-vocab-bias": dict(
        vocab=1003, hidden=96, heads=3, kv_heads=3, inter=131, bias=True, tied=False
    ),
    "hd-not-pad-multiple": dict(vocab=517, hidden=72, heads=3, kv_heads=1, inter=100),
    "explicit-head-dim": dict(hidden=64, heads=4, kv_heads=2, head_dim=48, inter=128),
    "llama3-rope": dict(
        hidden=128,
        heads=2,
        kv_heads=1,
        rope_parameters=dict(
            rope_type="llama3",
            rope_theta=500000.0,
            factor=8.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=64,
        ),
    ),
    "linear-rope": dict(
        hidden=128,
        heads=2,
        kv_heads=1,
        rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
    ),
    "yarn-rope": dict(
        hidden=128,
        heads=2,
        kv_heads=1,
        rope_parameters=dict(
            rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64
        ),
    ),
}
PROMPT = [[3, 17, 250, 9, 40, 511, 7, 99, 300, 12, 5, 6, 44, 401, 2, 81, 130, 65, 1, 0]]


def rel_err(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("shape", list(SHAPES))
def test_fp32_logits_and_greedy_match_transformers(shape):
    model = tiny_llama(**SHAPES[shape])
    ids = torch.tensor(PROMPT) % model.config.vocab_size
    dec = KwkDecoder(model, max_cache_len=64)
    with torch.no_grad():
        ref = model(ids).logits[0]
    assert rel_err(dec.forward(ids), ref) < 1e-4
    ours = dec.generate(ids, max_new_tokens=32, min_new_tokens=32)
    theirs = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=32,
        min_new_tokens=32,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(ours, theirs)


def fp32_inv_freq(model):
    """The rotary frequencies in float32, as the model was built (model.to(dtype) rounds them)."""
    rotary = model.model.rotary_emb
    rotary.inv_freq = rotary.compute_default_rope_parameters(model.config)[0]
    return model


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", ["hd64-gqa3-untied", "odd-vocab-bias"])
def test_half_precision_weights(shape, dtype):
    model = tiny_llama(**SHAPES[shape]).to(dtype)
    # model.to(dtype) also rounds the rotary embedding's inv_freq buffer, which from_pretrained
    # keeps in float32; kwker computes rope from the config, in float32 (kwker.rope)
    fp32_inv_freq(model)
    ids = torch.tensor(PROMPT) % model.config.vocab_size
    ours = KwkDecoder(model, max_cache_len=64, kv_cache="fp32").forward(ids)
    default = KwkDecoder(model, max_cache_len=64).forward(ids)  # fp16 KV cache
    with torch.no_grad():
        same_weights_fp32 = fp32_inv_freq(model.float())(ids).logits[0]
        fp32_inv_freq(model.to(dtype))
        native_dtype = model(ids).logits[0].float()
    assert rel_err(ours, same_weights_fp32) < 1e-4
    # the fp16 cache rounds keys and values to 11 significant bits (2^-11 = 4.9e-4 relative each)
    assert rel_err(default, same_weights_fp32) < 2e-3
    assert rel_err(ours, native_dtype) < 0.1


def test_bf16_precision_from_fp32_model():
    model = tiny_llama(**SHAPES["hd64-gqa3-untied"])
    ids = torch.tensor(PROMPT)
    dec = KwkDecoder(model, max_cache_len=64, precision="bf16", kv_cache="fp32")
    assert (
        dec.weight_bytes_per_token * 2 == KwkDecoder(model, max_cache_len=64).weight_bytes_per_token
    )
    with torch.no_grad():  # precision="bf16" rounds the matrices; norms stay float32
        for p in model.parameters():
            if p.dim() == 2:
                p.copy_(p.bfloat16().float())
        ref = model(ids).logits[0]
    assert rel_err(dec.forward(ids), ref) < 1e-4


def test_long_prompt_in_several_native_steps():
    """A prompt longer than one step is prefilled in chunks; the logits do not notice."""
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96)
    ids = torch.randint(0, 1000, (1, 300), generator=torch.Generator().manual_seed(1))
    dec = KwkDecoder(model, max_cache_len=320, max_step_tokens=64)
    with torch.no_grad():
        ref = model(ids).logits[0]
    assert rel_err(dec.forward(ids), ref) < 1e-4
