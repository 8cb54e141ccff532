"""Shared test helpers (a module of its own: conftest files are not importable by name)."""

import torch


def tiny_llama(
    seed=0,
    vocab=1000,
    hidden=128,
    layers=2,
    heads=2,
    kv_heads=1,
    inter=256,
    head_dim=None,
    tied=True,
    bias=False,
    rope_parameters=None,
    dtype=torch.float32,
    max_pos=2048,
):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=tied,
        attention_bias=bias,
        mlp_bias=bias,
        max_position_embeddings=max_pos,
        rope_parameters=rope_parameters,
    )
    model = LlamaForCausalLM(cfg).eval()
    # Random init gives near-zero logits; widen the weights so that argmax ties are not an accident
    # of scale.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    return model.to(dtype)


class WithoutPropose:
    """A native step seen without its propose: the runner then proposes step by step (its fallback,
    as for a compiled decoder's step)."""

    def __init__(self, step):
        self._step = step

    def __getattr__(self, name):
        if name == "propose":
            raise AttributeError(name)
        return getattr(self._step, name)
