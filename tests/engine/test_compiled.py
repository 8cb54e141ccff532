"""CompiledDecoder: families the native step does not run (GPT-2, OPT), through their own forward
exported and compiled ahead of time, with KwkDecoder's generate / lookup / sampling interface and
a disk cache of the compiled step."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, OPTConfig, OPTForCausalLM

from kwker.hf import unsupported_reason
from kwker.hf.compiled import CompiledDecoder, package_key

PROMPT = torch.tensor(
    [[3, 17, 250, 9, 40, 511, 7, 99, 3, 17, 250, 9, 40]]
)  # repeats itself: lookup has work


def widen(model):
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(3.0)
    return model.eval()


def gpt2():
    torch.manual_seed(0)
    return widen(
        GPT2LMHeadModel(
            GPT2Config(vocab_size=1000, n_embd=64, n_layer=2, n_head=4, n_positions=256)
        )
    )


def opt():
    torch.manual_seed(1)
    return widen(
        OPTForCausalLM(
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
    )


@pytest.fixture(scope="module", params=[gpt2, opt], ids=["gpt2", "opt"])
def compiled(request, tmp_path_factory):
    """(model, a CompiledDecoder that compiled, its cache folder): one compilation per family
    for the whole module."""
    model = request.param()
    assert (
        unsupported_reason(model, 128) is not None
    )  # really a family the native step does not run
    folder = tmp_path_factory.mktemp("compiled")
    dec = CompiledDecoder(model, max_cache_len=128, cache_folder=folder)
    assert dec.compiled_now and len(list(folder.glob("*.pt2"))) == 1
    return model, dec, folder


def test_greedy_and_logits_match_transformers(compiled):
    model, dec, _ = compiled
    with torch.no_grad():
        ref = model(PROMPT).logits[0]
    assert float((dec.forward(PROMPT) - ref).abs().max() / ref.abs().max()) < 1e-5
    theirs = model.generate(
        PROMPT,
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=40,
        min_new_tokens=40,
        do_sample=False,
        pad_token_id=0,
    )
    assert torch.equal(dec.generate(PROMPT, max_new_tokens=40, min_new_tokens=40, lookup=0), theirs)
    assert torch.equal(
        dec.generate(PROMPT, max_new_tokens=40, min_new_tokens=40), theirs
    )  # lookup on
    assert dec.last_stats.proposed.get("lookup", 0) > 0


def test_seeded_sampling_is_the_same_with_and_without_lookup(compiled):
    _, dec, _ = compiled
    runs = [
        dec.generate(
            PROMPT,
            max_new_tokens=30,
            min_new_tokens=30,
            do_sample=True,
            temperature=0.8,
            top_k=50,
            generator=torch.Generator().manual_seed(seed),
            lookup=lookup,
        )
        for seed in (1, 2)
        for lookup in (0, 8)
    ]
    assert torch.equal(runs[0], runs[1]) and torch.equal(runs[2], runs[3])
    assert not torch.equal(runs[0], runs[2])


def test_second_construction_loads_from_the_disk_cache(compiled):
    model, dec, folder = compiled
    again = CompiledDecoder(model, max_cache_len=128, cache_folder=folder)
    assert not again.compiled_now and again.build_seconds < dec.build_seconds
    # two decoders from one package keep their own KV caches: `dec` continues its text from its
    # cache after `again` has written other tokens at the same positions of its own
    a = dec.generate(PROMPT, max_new_tokens=10, lookup=0)
    again.generate(torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]]), max_new_tokens=20, lookup=0)
    continued = dec.generate(a, max_new_tokens=10, lookup=0)
    assert dec.last_stats.reused_prompt_tokens == a.shape[1] - 1
    dec.reset()
    assert torch.equal(dec.generate(a, max_new_tokens=10, lookup=0), continued)


def test_the_cache_key_follows_weights_and_sizes(compiled):
    model, _, _ = compiled
    changed = type(model)(model.config).eval()
    changed.load_state_dict(model.state_dict())
    key = package_key(model, 128, 128)
    assert package_key(changed, 128, 128) == key
    with torch.no_grad():
        next(changed.parameters()).view(-1)[0] += 1.0
    assert package_key(changed, 128, 128) != key
    assert package_key(model, 64, 64) != key


def test_bad_arguments_are_clear_errors():
    model = gpt2()
    with pytest.raises(ValueError, match="max_batch=1"):
        CompiledDecoder(model, max_cache_len=64, max_batch=2)
    with pytest.raises(ValueError, match="own precision"):
        CompiledDecoder(model, max_cache_len=64, precision="int4")
    with pytest.raises(ValueError, match="256 positions"):
        CompiledDecoder(model, max_cache_len=512)
