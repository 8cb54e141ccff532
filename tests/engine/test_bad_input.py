"""Bad input gets a clear exception and the decoder keeps working afterwards."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from helpers import tiny_llama
from kwker.decode import KwkDecoder, runner_unsupported


@pytest.fixture(scope="module")
def dec():
    return KwkDecoder(tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96), max_cache_len=32)


@pytest.mark.parametrize("ids, exc, message", [
    (torch.tensor([[1] * 30]), ValueError, "30 tokens \\+ max_new_tokens 8 = 38 tokens exceeds max_cache_len 32"),
    (torch.tensor([[]], dtype=torch.long), ValueError, "empty"),
    (torch.tensor([[1.0, 2.0]]), TypeError, "integer"),
    (torch.tensor([[1, 2], [3, 4]]), ValueError, "generate_batch"),
    (torch.ones(1, 1, 3, dtype=torch.long), ValueError, "shape"),
    (torch.tensor([[1, 5000]]), ValueError, "outside the vocabulary"),
    (torch.tensor([[1, -1]]), ValueError, "outside the vocabulary"),
    ("hello", TypeError, "token ids"),
])
def test_bad_prompts(dec, ids, exc, message):
    with pytest.raises(exc, match=message):
        dec.generate(ids, max_new_tokens=8)
    assert dec.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4).shape == (1, 7)  # still works


@pytest.mark.parametrize("n", [0, -2, 1.5])
def test_bad_max_new_tokens(dec, n):
    with pytest.raises(ValueError, match="max_new_tokens"):
        dec.generate(torch.tensor([[1, 2]]), max_new_tokens=n)


def test_unsupported_model_is_explained():
    gpt2 = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=100))
    reason = runner_unsupported(gpt2, 64)
    assert "gpt2" in reason and "llama" in reason
    with pytest.raises(ValueError, match="cannot run GPT2LMHeadModel"):
        KwkDecoder(gpt2, max_cache_len=64)


def test_cache_longer_than_the_model_positions():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96, max_pos=128)
    assert "max_position_embeddings 128" in runner_unsupported(model, 256)
    assert runner_unsupported(model, 128) is None
    assert "positive integer" in runner_unsupported(model, 0)


def test_bad_constructor_arguments():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96)
    with pytest.raises(ValueError, match="precision"):
        KwkDecoder(model, max_cache_len=32, precision="int3")
    with pytest.raises(ValueError, match="threads"):
        KwkDecoder(model, max_cache_len=32, threads=0)


def test_dynamic_rope_is_refused():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96,
                       rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0))
    assert "rope type 'dynamic'" in runner_unsupported(model, 64)
