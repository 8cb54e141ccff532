"""Families beyond Llama, against transformers: Qwen2 (q/k/v biases, windowed upper layers), Qwen3
(q/k head norms), Mistral (sliding window), Gemma 3 (post norms, scaled embeddings, GELU-tanh,
sliding + global layers with their own rope tables) and Phi-3 (fused matrices, partial rotary,
longrope)."""

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from kwker.hf import KwkDecoder, unsupported_reason

PROMPT = torch.tensor([[3, 17, 250, 9, 40, 511, 7, 99, 300, 12, 5, 6, 44]])
# longer than the tiny sliding windows below, so that windowed layers really drop keys
LONG = torch.randint(0, 1000, (1, 70), generator=torch.Generator().manual_seed(9))


def widen(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
            elif p.dim() == 1 and p.abs().sum() > 0 and not torch.all(p == 1):
                p.normal_(0, 0.5)  # biases: random, so that a missing one shows
    return model.eval()


def qwen2(**kw):
    torch.manual_seed(1)
    return widen(
        Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=1000,
                hidden_size=96,
                intermediate_size=160,
                num_hidden_layers=2,
                num_attention_heads=6,
                num_key_value_heads=2,
                max_position_embeddings=512,
                **kw,
            )
        )
    )


def mistral(**kw):
    torch.manual_seed(2)
    return widen(
        MistralForCausalLM(
            MistralConfig(
                vocab_size=1000,
                hidden_size=128,
                intermediate_size=256,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=512,
                **kw,
            )
        )
    )


def qwen3(**kw):
    torch.manual_seed(3)
    model = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=1000,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=32,
            max_position_embeddings=512,
            **kw,
        )
    )
    with torch.no_grad():
        for (
            layer
        ) in model.model.layers:  # q/k norm weights away from 1, so that a missing norm shows
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return widen(model)


def gemma3(seed=4, **kw):
    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=1,
        head_dim=48,
        max_position_embeddings=512,
        sliding_window=16,
        query_pre_attn_scalar=48,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )
    cfg.update(kw)
    model = Gemma3ForCausalLM(Gemma3TextConfig(**cfg))
    with torch.no_grad():
        for _name, p in model.named_parameters():
            if p.dim() == 1:  # Gemma norms start at 0 (scale 1 + w): make each one count
                p.uniform_(-0.5, 0.5)
            else:
                p.mul_(3.0)
    return model.eval()


def phi3(seed=5, **kw):
    torch.manual_seed(seed)
    cfg = dict(
        vocab_size=1000,
        hidden_size=96,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        pad_token_id=0,
    )
    cfg.update(kw)
    return widen(Phi3ForCausalLM(Phi3Config(**cfg)))


LONGROPE = dict(
    rope_type="longrope",
    rope_theta=10000.0,
    original_max_position_embeddings=256,
    short_factor=[1.0 + 0.1 * i for i in range(12)],
    long_factor=[2.0 + i for i in range(12)],
)

MODELS = {
    "qwen2": qwen2,
    "qwen2-tied": lambda: qwen2(tie_word_embeddings=True),
    "qwen2-window": lambda: qwen2(use_sliding_window=True, sliding_window=16, max_window_layers=1),
    "mistral": mistral,
    "mistral-window": lambda: mistral(sliding_window=16),
    "qwen3": qwen3,
    "qwen3-tied": lambda: qwen3(tie_word_embeddings=True),
    "gemma3": gemma3,
    "gemma3-wide-heads": lambda: gemma3(
        seed=6,
        hidden_size=96,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=24,
        sliding_window=24,
        layer_types=["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"],
        num_hidden_layers=4,
    ),
    "gemma3-untied-scaled-rope": lambda: gemma3(
        seed=7,
        tie_word_embeddings=False,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "phi3": phi3,
    "phi3-window": lambda: phi3(sliding_window=16),
    "phi3-partial-rotary": lambda: phi3(
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
        }
    ),
    "phi3-longrope": lambda: phi3(rope_parameters=LONGROPE, original_max_position_embeddings=256),
}


def relative_error(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("name", MODELS)
def test_logits_and_greedy_match_transformers(name):
    model = MODELS[name]()
    if isinstance(model, Qwen2ForCausalLM):
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    dec = KwkDecoder(model, max_cache_len=128)
    with torch.no_grad():
        ref = model(PROMPT).logits[0]
        ref_long = model(LONG).logits[0]
    assert relative_error(dec.forward(PROMPT), ref) < 1e-4
    assert relative_error(dec.forward(LONG), ref_long) < 1e-4  # past the windows
    ours = dec.generate(PROMPT, max_new_tokens=40, min_new_tokens=40)
    theirs = model.generate(
        PROMPT,
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=40,
        min_new_tokens=40,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize(
    "name", ["qwen2-window", "qwen3", "gemma3", "phi3-partial-rotary", "mistral-window"]
)
@pytest.mark.parametrize("precision", [None, "bf16", "int4"])
def test_batch_invariance_in_every_family(name, precision):
    """1-token steps, k-token steps and prefill give the same bits, windows and post norms
    included."""
    seq = LONG[0].tolist()
    dec = KwkDecoder(MODELS[name](), max_cache_len=96, precision=precision)
    whole = dec.forward(seq)
    dec.reset()
    rows = [dec.forward(seq[:30])]
    for i in range(30, len(seq), 7):
        rows.append(dec.forward(seq[i : i + 7], start=i))
    assert torch.equal(torch.cat(rows), whole)
    assert torch.equal(dec.forward(seq[-1:], start=len(seq) - 1), whole[-1:])


@pytest.mark.parametrize("name", ["qwen2", "qwen3", "gemma3", "phi3", "mistral-window"])
@pytest.mark.parametrize("precision,tolerance", [("bf16", 0.01), ("balanced", 0.06), ("int4", 0.4)])
def test_converted_precisions_stay_close(name, precision, tolerance):
    """Stated tolerance per precision: relative RMS error of all 70 positions' logits against
    transformers' fp32 (random Gaussian weights widened 3x have no structure for 4 bits to keep:
    int4 measures 0.14-0.32 here; the real-model quality bounds are in test_quality.py)."""
    model = MODELS[name]()
    with torch.no_grad():
        ref = model(LONG).logits[0]
    out = KwkDecoder(model, max_cache_len=96, precision=precision).forward(LONG)
    assert float((out - ref).norm() / ref.norm()) < tolerance


def test_variants_the_native_step_cannot_run_say_why():
    assert "longrope" in unsupported_reason(MODELS["phi3-longrope"](), 300)
    assert unsupported_reason(MODELS["phi3-longrope"](), 256) is None
    assert "softcapping" in unsupported_reason(gemma3(final_logit_softcapping=30.0), 64)
    assert "activation" in unsupported_reason(gemma3(hidden_activation="relu"), 64)


@pytest.mark.slow
def test_smollm2_weights_declared_as_mistral_give_smollm2_tokens(smollm2):
    model, tokenizer = smollm2
    cfg = MistralConfig(
        **{
            k: v
            for k, v in model.config.to_dict().items()
            if k in MistralConfig().to_dict() and k not in ("model_type", "architectures")
        }
    )
    cfg.sliding_window = None
    as_mistral = MistralForCausalLM(cfg).eval()
    as_mistral.load_state_dict(model.state_dict(), strict=False)
    as_mistral.tie_weights()
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    llama_tokens = KwkDecoder(model, max_cache_len=128).generate(ids, max_new_tokens=24)
    assert torch.equal(
        KwkDecoder(as_mistral, max_cache_len=128).generate(ids, max_new_tokens=24), llama_tokens
    )
