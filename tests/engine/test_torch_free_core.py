"""The generation core runs without torch: importing it loads no torch, SeededGenerator draws
torch's seeded float64 stream, so a seed samples the same tokens on the torch and the torch-free
paths, and a decoder with returns="numpy" gives numpy results with the same values."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers import tiny_llama

from kwker.generation import StepDecoder
from kwker.hf import KwkDecoder
from kwker.sampling import Sampler, SamplingParams, SeededGenerator

CORE = "kwker.generation, kwker.sampling, kwker.scheduler, kwker.speculative, kwker.runner"
SEEDS = [0, 1, 42, 2**31 + 5, 2**40 + 3]
OPTIONS = [
    dict(temperature=0.9, top_p=0.95),
    dict(temperature=1.3, top_k=40),
    dict(temperature=1.1, top_k=50, top_p=0.9),
    dict(temperature=1.4),  # no top-k/p: the cumulative sum over the whole vocabulary
]
REPEATS = [5, 9, 33, 102, 7, 61, 5, 9, 33, 102, 7, 61, 5, 9, 33]  # gives lookup proposals
PROMPTS = [REPEATS, [400, 12], [7] * 30, [3, 1, 4, 1, 5, 9, 2, 6]]


def run_without_torch(code: str) -> str:
    """Runs code in a fresh interpreter that checks, at its end, that torch was never imported."""
    check = "\nimport sys\nassert 'torch' not in sys.modules, 'torch was imported'\n"
    return subprocess.run(
        [sys.executable, "-c", code + check], capture_output=True, text=True, check=True
    ).stdout


def test_core_imports_no_torch():
    run_without_torch(f"import {CORE}")


def test_scheduler_thread_limit_is_a_no_op_without_torch():
    run_without_torch("from kwker.scheduler import one_torch_thread\nwith one_torch_thread(): pass")


@pytest.mark.parametrize(
    "seed", [*SEEDS, 2, 7, 2**32, 2**32 - 1, 2**64 - 1, -1, -(2**63), np.int64(9)]
)
def test_seeded_generator_is_torch_stream(seed):
    ours, theirs = SeededGenerator(seed), torch.Generator().manual_seed(int(seed))
    for _ in range(300):
        assert ours.random() == float(torch.rand((), generator=theirs, dtype=torch.float64))


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1, 1.0, True, "1"])
def test_seeded_generator_refuses_what_torch_refuses(seed):
    with pytest.raises(ValueError, match="seed"):
        SeededGenerator(seed)


def test_serial_cumsums_agree_bit_for_bit():
    """sample() takes torch's cumsum where torch is loaded, numpy's elsewhere: both serial sums."""
    rng = np.random.default_rng(0)
    for trial in range(60):
        n = [1, 7, 300, 1000, 49152, 151936][trial % 6]
        sv = (rng.standard_normal(n) * [0.3, 1, 3, 8, 30][trial % 5]).astype(np.float32)
        w = np.exp(sv - sv.max()).astype(np.float64)
        assert torch.from_numpy(w).cumsum(0).numpy().tobytes() == np.cumsum(w).tobytes()


# A sampler's picks over fixed random logits, for one seed: run here with a torch.Generator and in
# a torch-free interpreter with a SeededGenerator (numpy's cumsum, no tensors anywhere).
PICKS = """
import json
import numpy as np
from kwker.sampling import Sampler, SamplingParams, SeededGenerator

def picks(options, seeds, make_generator):
    out = []
    rng = np.random.default_rng(5)
    for vocab in (1000, 49152, 151936):
        rows = (rng.standard_normal((12, vocab)) * 3).astype(np.float32)
        for kw in options:
            for seed in seeds:
                s = Sampler(SamplingParams(do_sample=True, **kw), 0, make_generator(seed))
                out.append([s.choose(row, [], s.draw()) for row in rows])
    return out
"""


def test_sampler_picks_same_without_torch():
    theirs = run_without_torch(
        PICKS
        + f"print(json.dumps(picks({OPTIONS!r}, {SEEDS!r}, SeededGenerator)))\n"
        # unseeded sampling without torch draws from the process's own generator
        + "s = Sampler(SamplingParams(do_sample=True, temperature=0.7), 0, None)\n"
        + "assert 0 <= s.choose(np.zeros(10, np.float32), [], s.draw()) < 10\n"
    )
    scope = {}
    exec(PICKS, scope)
    ours = scope["picks"](OPTIONS, SEEDS, lambda s: torch.Generator().manual_seed(s))
    assert json.loads(theirs) == ours


@pytest.fixture(scope="module")
def model():
    return tiny_llama(seed=1, hidden=96, heads=3, kv_heads=1, inter=128, layers=2)


@pytest.fixture(scope="module")
def dec(model):
    return KwkDecoder(model, max_cache_len=128, max_batch=3)


@pytest.mark.parametrize("lookup", [0, 8])
@pytest.mark.parametrize("kw", OPTIONS)
def test_seeded_generation_same_with_either_generator(dec, kw, lookup):
    kw = dict(do_sample=True, eos_token_id=[], lookup=lookup, **kw)
    for seed in SEEDS:
        for prompt in (REPEATS, [400, 12, 87, 3]):
            ours = dec.generate([prompt], 30, generator=SeededGenerator(seed), **kw)
            theirs = dec.generate([prompt], 30, generator=torch.Generator().manual_seed(seed), **kw)
            assert torch.equal(ours, theirs), (seed, prompt)


@pytest.mark.parametrize("lookup", [0, 8])
def test_seeded_batch_same_with_either_generator(dec, lookup):
    kw = dict(do_sample=True, temperature=1.2, top_p=0.95, top_k=60, eos_token_id=[], lookup=lookup)
    for base in (0, 2**31 + 5):
        seeds = [base + i for i in range(len(PROMPTS))]
        ours = dec.generate_batch(PROMPTS, 25, generator=[SeededGenerator(s) for s in seeds], **kw)
        theirs = dec.generate_batch(
            PROMPTS, 25, generator=[torch.Generator().manual_seed(s) for s in seeds], **kw
        )
        for a, b in zip(ours, theirs, strict=True):
            assert torch.equal(a, b)


def test_generator_checks(dec):
    with pytest.raises(ValueError, match="one generator per prompt"):
        dec.generate_batch(PROMPTS[:2], 4, do_sample=True, generator=SeededGenerator(0))
    with pytest.raises(TypeError, match="generator must be"):
        dec.generate([[1, 2]], 4, do_sample=True, generator=np.random.default_rng(0))
    # a greedy call never draws: its generator is not looked at, as before
    assert dec.generate([[1, 2]], 4, generator="unused").shape == (1, 6)
    with pytest.raises(TypeError, match="generator must be"):
        Sampler(SamplingParams(), 0, "unused").draw()


def test_numpy_results(model):
    torch_dec = KwkDecoder(model, max_cache_len=128, max_batch=3)
    np_dec = KwkDecoder(model, max_cache_len=128, max_batch=3)
    np_dec.returns = "numpy"  # what a decoder built without torch sets in its constructor
    prompt = [5, 9, 33, 102, 7]
    logits = np_dec.forward(prompt)
    assert isinstance(logits, np.ndarray) and logits.dtype == np.float32
    assert np.array_equal(logits, torch_dec.forward(prompt).numpy())
    kw = dict(do_sample=True, temperature=0.9, top_p=0.9, eos_token_id=[])
    out = np_dec.generate(prompt, 12, generator=SeededGenerator(3), **kw)
    assert isinstance(out, np.ndarray) and out.dtype == np.int64 and out.shape == (1, 17)
    assert (
        out.tolist() == torch_dec.generate(prompt, 12, generator=SeededGenerator(3), **kw).tolist()
    )
    outs = np_dec.generate_batch(PROMPTS, 8, eos_token_id=[])
    assert all(isinstance(o, np.ndarray) and o.dtype == np.int64 for o in outs)
    assert [o.tolist() for o in outs] == [
        o.tolist() for o in torch_dec.generate_batch(PROMPTS, 8, eos_token_id=[])
    ]
    # a tensor prompt gets a tensor back whatever the decoder returns otherwise
    assert isinstance(np_dec.generate(torch.tensor([prompt]), 3), torch.Tensor)
    assert isinstance(np_dec.forward(torch.tensor(prompt)), torch.Tensor)
    assert all(
        isinstance(o, torch.Tensor) for o in np_dec.generate_batch(torch.tensor([prompt]), 3)
    )
    chunk = next(iter(np_dec.stream_generate(prompt, 3)))
    assert type(chunk.token) is int  # chunks hold plain Python values, no tensors
    with pytest.raises(ValueError, match="returns"):
        StepDecoder(model, None, None, returns="list")  # refused before the step is looked at
