"""install(model): Hugging Face's generate keeps its interface and runs every step natively."""

import torch
from helpers import tiny_llama
from transformers import StoppingCriteria, StoppingCriteriaList, TextStreamer

from kwker.hf import install, uninstall

PROMPT = torch.tensor([[4, 8, 15, 16, 23, 42]])


class CountingStreamer(TextStreamer):
    def __init__(self):
        self.seen = []

    def put(self, value):
        self.seen.append(value.flatten().tolist())

    def end(self):
        self.seen.append("end")


class StopAfter(StoppingCriteria):
    def __init__(self, length):
        self.length = length

    def __call__(self, input_ids, scores, **kwargs):
        return torch.full(
            (input_ids.shape[0],), input_ids.shape[1] >= self.length, dtype=torch.bool
        )


def greedy(model, **kw):
    return model.generate(
        PROMPT,
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=12,
        do_sample=False,
        pad_token_id=0,
        **kw,
    )


def test_install_gives_the_same_tokens_and_keeps_streamers_and_stopping():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96)
    plain = greedy(model, min_new_tokens=12)
    install(model, max_cache_len=64)
    calls = []
    runner = model._kwker_decoder.runner
    original_extend = runner.extend
    runner.extend = lambda *a, **k: (calls.append(1), original_extend(*a, **k))[1]
    assert torch.equal(greedy(model, min_new_tokens=12), plain)
    assert model._kwker_fallback is None and len(calls) >= 12
    streamer = CountingStreamer()
    out = greedy(model, streamer=streamer, stopping_criteria=StoppingCriteriaList([StopAfter(10)]))
    assert out.shape[1] == 10 and torch.equal(out, plain[:, :10])
    assert streamer.seen[-1] == "end" and sum(len(s) for s in streamer.seen[1:-1]) == 4
    uninstall(model)
    assert "generate" not in vars(model) and not hasattr(model, "_kwker_fallback")
    assert torch.equal(greedy(model, min_new_tokens=12), plain)


def test_beam_search_falls_back_with_a_reason():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96)
    install(model, max_cache_len=64)
    out = model.generate(
        PROMPT,
        attention_mask=torch.ones_like(PROMPT),
        max_new_tokens=4,
        num_beams=2,
        pad_token_id=0,
    )
    assert out.shape == (1, 10)
    assert "beam search" in model._kwker_fallback


def test_prompt_lookup_through_hf_generate_runs_natively():
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96)
    ids = torch.tensor([[4, 8, 15, 16, 23, 42, 4, 8, 15, 16]])
    plain = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=12,
        min_new_tokens=12,
        do_sample=False,
        pad_token_id=0,
    )
    install(model, max_cache_len=64)
    fast = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=12,
        min_new_tokens=12,
        do_sample=False,
        pad_token_id=0,
        prompt_lookup_num_tokens=4,
    )
    assert model._kwker_fallback is None
    assert torch.equal(fast, plain)


def test_install_with_a_draft_runs_assisted_generation_natively():
    model = tiny_llama(seed=1, hidden=96, heads=3, kv_heads=1, inter=128, layers=3)
    small = tiny_llama(seed=2, hidden=48, heads=2, kv_heads=1, inter=64, layers=1)
    plain = greedy(model, min_new_tokens=12)
    install(model, max_cache_len=64, draft=small)
    calls = []
    runner = small._kwker_decoder.runner
    original_extend = runner.extend
    runner.extend = lambda *a, **k: (calls.append(1), original_extend(*a, **k))[1]
    assert torch.equal(greedy(model, min_new_tokens=12), plain)
    assert model._kwker_fallback is None and calls  # the draft proposed, natively
    uninstall(model)
    assert "generate" not in vars(small) and "generate" not in vars(model)


def test_torch_runs_one_thread_during_a_native_generate_and_is_restored():
    """transformers' loop between native steps runs on one torch thread (its OpenMP workers would
    spin on the cores the native step needs); the caller's setting comes back afterwards, also when
    the call fails."""
    model = tiny_llama(hidden=64, heads=2, kv_heads=1, inter=96)
    install(model, max_cache_len=64)
    seen = []
    runner = model._kwker_decoder.runner
    original_extend = runner.extend
    runner.extend = lambda *a, **k: (
        seen.append(torch.get_num_threads()),
        original_extend(*a, **k),
    )[1]
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        greedy(model)
        assert seen and set(seen) == {1}
        assert torch.get_num_threads() == 2
        runner.extend = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("step failed"))
        try:
            greedy(model)
        except RuntimeError as e:
            assert "step failed" in str(e)
        else:
            raise AssertionError("the failing step did not raise")
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
