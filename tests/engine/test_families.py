"""Families beyond Llama that share its layout: Qwen2 (q/k/v biases), Qwen3 (q/k head norms) and Mistral, against
transformers."""

import pytest
import torch
from transformers import (MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)

from kwker.decode import KwkDecoder, runner_unsupported

PROMPT = torch.tensor([[3, 17, 250, 9, 40, 511, 7, 99, 300, 12, 5, 6, 44]])


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
    return widen(Qwen2ForCausalLM(Qwen2Config(vocab_size=1000, hidden_size=96, intermediate_size=160,
                                              num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                                              max_position_embeddings=512, **kw)))


def mistral(**kw):
    torch.manual_seed(2)
    return widen(MistralForCausalLM(MistralConfig(vocab_size=1000, hidden_size=128, intermediate_size=256,
                                                  num_hidden_layers=2, num_attention_heads=4,
                                                  num_key_value_heads=2, max_position_embeddings=512, **kw)))


def qwen3(**kw):
    torch.manual_seed(3)
    model = Qwen3ForCausalLM(Qwen3Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                         max_position_embeddings=512, **kw))
    with torch.no_grad():
        for layer in model.model.layers:  # q/k norm weights away from 1, so that a missing norm shows
            layer.self_attn.q_norm.weight.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.uniform_(0.5, 1.5)
    return widen(model)


@pytest.mark.parametrize("make", [qwen2, lambda: qwen2(tie_word_embeddings=True), mistral, qwen3,
                                  lambda: qwen3(tie_word_embeddings=True)])
def test_logits_and_greedy_match_transformers(make):
    model = make()
    if isinstance(model, Qwen2ForCausalLM):
        assert model.model.layers[0].self_attn.q_proj.bias is not None
    dec = KwkDecoder(model, max_cache_len=128)
    with torch.no_grad():
        ref = model(PROMPT).logits[0]
    assert float((dec.forward(PROMPT) - ref).abs().max() / ref.abs().max()) < 1e-4
    ours = dec.generate(PROMPT, max_new_tokens=24, min_new_tokens=24)
    theirs = model.generate(PROMPT, attention_mask=torch.ones_like(PROMPT), max_new_tokens=24, min_new_tokens=24,
                            do_sample=False, pad_token_id=0)
    assert torch.equal(ours, theirs)


def test_sliding_window_longer_than_the_cache_is_refused():
    assert "sliding window 64" in runner_unsupported(mistral(sliding_window=64), 128)
    assert runner_unsupported(mistral(sliding_window=256), 128) is None
    assert "sliding-window" in runner_unsupported(qwen2(use_sliding_window=True, sliding_window=64), 128)


@pytest.mark.slow
def test_smollm2_weights_declared_as_mistral_give_smollm2_tokens(smollm2):
    model, tokenizer = smollm2
    cfg = MistralConfig(**{k: v for k, v in model.config.to_dict().items()
                           if k in MistralConfig().to_dict() and k not in ("model_type", "architectures")})
    cfg.sliding_window = None
    as_mistral = MistralForCausalLM(cfg).eval()
    as_mistral.load_state_dict(model.state_dict(), strict=False)
    as_mistral.tie_weights()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                        add_generation_prompt=True, return_tensors="pt", return_dict=True)["input_ids"]
    llama_tokens = KwkDecoder(model, max_cache_len=128).generate(ids, max_new_tokens=24)
    assert torch.equal(KwkDecoder(as_mistral, max_cache_len=128).generate(ids, max_new_tokens=24), llama_tokens)
