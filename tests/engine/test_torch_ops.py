"""kwker.hf.torch_ops: plain transformers generate with its Linear layers on the native kernels."""

import pytest
import torch
from helpers import tiny_llama
from transformers import OPTConfig, OPTForCausalLM

from kwker.hf import torch_ops as ops

PROMPT = torch.tensor([[3, 17, 250, 9, 40, 511, 7, 99, 300, 12, 5]])


@pytest.fixture
def installed():
    ops.install()
    yield
    ops.uninstall()


def opt():
    torch.manual_seed(1)
    model = OPTForCausalLM(
        OPTConfig(
            vocab_size=1000,
            hidden_size=64,
            num_hidden_layers=2,
            ffn_dim=128,
            num_attention_heads=4,
            max_position_embeddings=256,
            word_embed_proj_dim=64,
        )
    )
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    return model.eval()


@pytest.mark.parametrize(
    "make", [lambda: tiny_llama(tied=False, bias=True), opt], ids=["llama-bias", "opt"]
)
def test_same_greedy_tokens_and_close_logits(make):
    model = make()
    kw = dict(
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=30,
        min_new_tokens=30,
        do_sample=False,
        pad_token_id=0,
    )
    with torch.no_grad():
        ref_logits = model(PROMPT).logits
    ref = model.generate(PROMPT, **kw)
    original = torch.nn.Linear.forward
    threads = torch.get_num_threads()
    ops.install()
    try:
        assert torch.nn.Linear.forward is not original
        with torch.no_grad():
            logits = model(PROMPT).logits
        # every Linear ran on the native kernels (packed at its first call)... (their sums may or
        # may not equal the BLAS's to the bit: on a Xeon with AMX, torch's sgemm gave the same bits)
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        assert linears and all(m in ops._packed for m in linears)
        assert (
            float((logits - ref_logits).abs().max() / ref_logits.abs().max()) < 1e-5
        )  # ...of the same sums
        assert torch.equal(model.generate(PROMPT, **kw), ref)
    finally:
        ops.uninstall()
    assert torch.nn.Linear.forward is original and torch.get_num_threads() == threads
    with torch.no_grad():
        assert torch.equal(model(PROMPT).logits, ref_logits)


def test_linear_matches_torch_on_awkward_shapes(installed):
    torch.manual_seed(0)
    for n, k, bias in [(1, 1, True), (17, 33, False), (129, 31, True), (64, 256, False)]:
        lin = torch.nn.Linear(k, n, bias=bias)
        for shape in [(k,), (1, k), (3, 7, k)]:
            x = torch.randn(shape)
            with torch.no_grad():
                y = lin(x)
                ref = x.double() @ lin.weight.double().T + (lin.bias.double() if bias else 0)
            assert y.shape == (*shape[:-1], n)
            assert torch.allclose(y.double(), ref, rtol=1e-5, atol=1e-5 * k)
        x = torch.randn(5, 2 * k)[:, ::2]  # non-contiguous rows
        with torch.no_grad():
            assert torch.allclose(
                lin(x), x.contiguous() @ lin.weight.T + (lin.bias if bias else 0), atol=1e-5 * k
            )


def test_weights_changed_in_place_are_repacked(installed):
    lin = torch.nn.Linear(40, 24)
    x = torch.randn(2, 40)
    with torch.no_grad():
        lin(x)  # packs the weights
        lin.weight.mul_(2)
        lin.bias.zero_()
        assert torch.allclose(lin(x), x @ lin.weight.T, atol=1e-5)


def test_autograd_and_other_dtypes_use_torch(installed):
    lin = torch.nn.Linear(16, 8)
    x = torch.randn(3, 16, requires_grad=True)
    lin(x).sum().backward()  # the native path has no backward: this must be torch's own
    assert x.grad is not None and lin.weight.grad is not None
    half = torch.nn.Linear(16, 8).to(torch.bfloat16)
    with torch.no_grad():
        assert half(torch.randn(2, 16, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.slow
def test_real_smollm2_greedy_tokens_unchanged(smollm2):
    model, tokenizer = smollm2
    outs = []
    for use in (False, True):
        if use:
            ops.install()
        try:
            for prompt in ("The capital of France is", "def add(a, b):"):
                ids = tokenizer(prompt, return_tensors="pt").input_ids
                outs.append(
                    model.generate(
                        ids,
                        attention_mask=torch.ones_like(ids),
                        max_new_tokens=32,
                        do_sample=False,
                        pad_token_id=tokenizer.eos_token_id,
                    )
                )
        finally:
            ops.uninstall()
    assert all(torch.equal(a, b) for a, b in zip(outs[:2], outs[2:], strict=True))
