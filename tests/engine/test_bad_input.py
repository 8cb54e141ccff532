"""Bad input gets a clear exception and the decoder keeps working afterwards."""

import numpy as np
import pytest
import torch
from helpers import tiny_llama
from transformers import GPT2Config, GPT2LMHeadModel

from kwker.hf import KwkDecoder, unsupported_reason


@pytest.fixture(scope="module")
def dec():
    return KwkDecoder(tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96), max_cache_len=32)


@pytest.mark.parametrize(
    "ids, exc, message",
    [
        (
            torch.tensor([[1] * 30]),
            ValueError,
            "30 tokens \\+ max_new_tokens 8 = 38 tokens exceeds max_cache_len 32",
        ),
        (torch.tensor([[]], dtype=torch.long), ValueError, "empty"),
        (torch.tensor([[1.0, 2.0]]), TypeError, "integer"),
        (torch.tensor([[1, 2], [3, 4]]), ValueError, "generate_batch"),
        (torch.ones(1, 1, 3, dtype=torch.long), ValueError, "shape"),
        (torch.tensor([[1, 5000]]), ValueError, "outside the vocabulary"),
        (torch.tensor([[1, -1]]), ValueError, "outside the vocabulary"),
        ("hello", TypeError, "token ids"),
    ],
)
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
    reason = unsupported_reason(gpt2, 64)
    assert "gpt2" in reason and "llama" in reason
    with pytest.raises(ValueError, match="cannot run GPT2LMHeadModel"):
        KwkDecoder(gpt2, max_cache_len=64)


def test_cache_longer_than_the_model_positions():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96, max_pos=128)
    assert "max_position_embeddings 128" in unsupported_reason(model, 256)
    assert unsupported_reason(model, 128) is None
    assert "positive integer" in unsupported_reason(model, 0)


def test_bad_constructor_arguments():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96)
    with pytest.raises(ValueError, match="precision"):
        KwkDecoder(model, max_cache_len=32, precision="int3")
    with pytest.raises(ValueError, match="threads"):
        KwkDecoder(model, max_cache_len=32, threads=0)


def test_dynamic_rope_is_refused():
    model = tiny_llama(
        hidden=64,
        heads=2,
        kv_heads=1,
        inter=96,
        rope_parameters=dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0),
    )
    assert "rope type 'dynamic'" in unsupported_reason(model, 64)


def works(dec):
    return dec.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4).shape == (1, 7)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.bool, torch.float16])
def test_id_tensors_other_than_int32_int64_are_refused(dec, dtype):
    ids = torch.tensor([[1, 2, 3]]).to(dtype)
    with pytest.raises(TypeError, match=f"int32 or torch.int64, got {dtype}"):
        dec.generate(ids, max_new_tokens=4)
    assert works(dec)


def test_int32_ids_and_numpy_integer_ids_are_read_as_they_are(dec):
    want = dec.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=4)
    int32 = torch.tensor([[1, 2, 3]], dtype=torch.int32)
    assert torch.equal(dec.generate(int32, max_new_tokens=4), want)
    numpy_ints = [np.int64(1), np.uint8(2), np.int16(3)]
    assert torch.equal(dec.generate(numpy_ints, max_new_tokens=4), want)
    for big in (np.int64(2**32 + 1), np.uint64(2**64 - 1), 2**40):  # not narrowed onto a valid id
        with pytest.raises(ValueError, match=f"token id {int(big)} is outside the vocabulary"):
            dec.generate([1, big], max_new_tokens=4)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        dec.generate(torch.tensor([[1, 2**32 + 1]]), max_new_tokens=4)
    with pytest.raises(TypeError, match="integer token ids"):
        dec.generate([1, True], max_new_tokens=4)
    assert works(dec)


def test_non_contiguous_ids_give_the_contiguous_copy_s_output(dec):
    wide = torch.tensor([[5, 0, 9, 0, 33, 0, 102, 0, 7, 0]])
    strided = wide[:, ::2]  # (1, 5), stride 2
    # (1, 5), the first row of a column-major (2, 5): strides (1, 2)
    column = torch.tensor([[5, 9, 33, 102, 7], [1, 1, 1, 1, 1]]).t().contiguous().t()[:1]
    assert not strided.is_contiguous() and not column.is_contiguous()
    want = dec.generate(strided.contiguous(), max_new_tokens=6)
    assert torch.equal(dec.generate(strided, max_new_tokens=6), want)
    assert torch.equal(dec.generate(column, max_new_tokens=6), want)
    assert torch.equal(dec.generate(strided[0], max_new_tokens=6), want)  # 1-D, stride 2
    assert torch.equal(dec.forward(strided), dec.forward(strided.contiguous()))


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(temperature=NAN), "temperature must be a positive number, got nan"),
        (dict(temperature=INF), "temperature must be a positive number, got inf"),
        (dict(temperature=-INF), "temperature"),
        (dict(temperature="0.7"), "temperature"),
        (dict(temperature=True), "temperature"),
        (dict(top_p=NAN), "top_p must be in \\(0, 1\\], got nan"),
        (dict(top_p=INF), "top_p"),
        (dict(top_p=1.01), "top_p"),
        (dict(min_p=NAN), "min_p must be in \\[0, 1\\], got nan"),
        (dict(min_p=-0.1), "min_p"),
        (dict(repetition_penalty=NAN), "repetition_penalty must be a positive number, got nan"),
        (dict(repetition_penalty=INF), "repetition_penalty"),
        (dict(repetition_penalty=-1.0), "repetition_penalty"),
        (dict(top_k=True), "top_k must be a non-negative integer, got True"),
        (dict(top_k=5.0), "top_k must be a non-negative integer, got 5.0"),
        (dict(top_k=NAN), "top_k"),
        (dict(min_new_tokens=True), "min_new_tokens"),
    ],
)
def test_bad_sampling_options(dec, kw, message):
    with pytest.raises(ValueError, match=message):
        dec.generate(torch.tensor([[1, 2]]), max_new_tokens=4, do_sample=True, **kw)
    with pytest.raises(ValueError, match=message.split()[0]):
        list(dec.stream_generate([1, 2], max_new_tokens=4, do_sample=True, **kw))
    assert works(dec)


def test_numpy_sampling_numbers_are_accepted(dec):
    run = [
        dec.generate(
            torch.tensor([[1, 2]]),
            max_new_tokens=6,
            do_sample=True,
            generator=torch.Generator().manual_seed(3),
            **kw,
        )
        for kw in (
            dict(temperature=0.8, top_k=5, top_p=0.9),
            dict(temperature=np.float32(0.8), top_k=np.int64(5), top_p=np.float64(0.9)),
        )
    ]
    assert torch.equal(run[0], run[1])
