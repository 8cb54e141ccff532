"""The native entry points refuse bad input with a clear Python error before touching memory, and
stay usable after it: wrong dtypes and ranks, short biases, ids that do not fit int32 or are not
integers, a step before the weights are set, thread counts past the cap, a pool whose threads cannot
start. A seeded fuzz run calls every binding with random shapes, dtypes, lengths and ids;
native/fuzz_sanitized.sh runs it under ASan + UBSan."""

import os
import subprocess
import sys

import numpy as np
import pytest

from kwker import _native

ERRORS = (ValueError, TypeError, RuntimeError, IndexError, OverflowError, KeyError, MemoryError)
W = _native.WType


def tiny_config(**kw):
    cfg = dict(
        n_layer=1,
        n_embd=32,
        n_head=2,
        n_kv_head=1,
        head_dim=16,
        n_ff=64,
        vocab=50,
        norm_eps=1e-6,
        attn_scale=0.25,
        wtype=W.F32,
        tied_embeddings=True,
    )
    cfg.update(kw)
    return cfg


def rope(cache_len=16, half=8):
    return np.ones((cache_len, half), np.float32), np.zeros((cache_len, half), np.float32)


def tiny_model(threads=1, complete=True, **kw):
    cfg = tiny_config(**kw)
    m = _native.Model(cfg, *rope(), 16, 1, 8, 4, threads)
    rng = np.random.default_rng(0)
    shapes = {
        "embed": (50, 32),
        "layers.0.q": (32, 32),
        "layers.0.k": (16, 32),
        "layers.0.v": (16, 32),
        "layers.0.o": (32, 32),
        "layers.0.gate": (64, 32),
        "layers.0.up": (64, 32),
        "layers.0.down": (32, 64),
    }
    for name, shape in shapes.items():
        if complete or name != "layers.0.down":
            m.set_matrix(name, rng.standard_normal(shape).astype(np.float32), W.F32)
    for name in ("norm", "layers.0.attn_norm", "layers.0.mlp_norm"):
        m.set_norm(name, np.ones(32, np.float32))
    return m


def ids(*values, dtype=np.int32):
    return np.array(values, dtype=dtype)


def step(m, tokens=(1, 2), dtype=np.int32):
    n = len(tokens)
    return m.step(
        ids(*tokens, dtype=dtype),
        ids(*[0] * n, dtype=dtype),
        ids(*range(n), dtype=dtype),
        ids(n - 1, dtype=dtype),
    )


def test_a_step_before_the_weights_are_set_is_an_error_and_the_model_works_once_they_are():
    m = tiny_model(complete=False)
    with pytest.raises(RuntimeError, match="layers.0.down"):
        step(m)
    m.set_matrix("layers.0.down", np.zeros((32, 64), np.float32), W.F32)
    assert step(m).shape == (1,)


@pytest.mark.parametrize(
    "bad, error, match",
    [
        (ids(2**32 + 5, dtype=np.int64), ValueError, "does not fit in int32"),
        (np.array([1.7]), TypeError, "int32 or int64"),
        (np.array([1], np.uint8), TypeError, "int32 or int64"),
        (np.array([[1]], np.int32), ValueError, "1-D"),
        ([1], TypeError, "numpy array"),
        (ids(50), ValueError, "outside the vocabulary"),
        (ids(-1), ValueError, "outside the vocabulary"),
    ],
)
def test_bad_token_ids_are_refused_and_the_model_still_steps(bad, error, match):
    m = tiny_model()
    good = step(m, (3,))
    with pytest.raises(error, match=match):
        m.step(bad, ids(0), ids(0), ids(0))
    assert np.array_equal(step(m, (3,)), good)


def test_int64_ids_that_fit_are_taken_as_they_are():
    m = tiny_model()
    assert np.array_equal(step(m, (3, 7), np.int64), step(m, (3, 7), np.int32))


def test_a_float32_array_whose_dtype_is_another_object_is_taken():
    """gguf's reader gives arrays viewed from a file's bytes, whose float32 descriptor is equal to
    numpy's but another object: they are float32 all the same."""
    other = np.dtype("<f4").newbyteorder("=")
    assert other is not np.dtype(np.float32) and other == np.float32
    x = np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)
    assert np.array_equal(
        _native.ggml_quantize_q4_k(x.astype(other)), _native.ggml_quantize_q4_k(x)
    )
    w = x[:, :64].copy()
    assert np.array_equal(_native.kernel_weights(w.astype(other), W.Q8),
                          _native.kernel_weights(w, W.Q8))  # fmt: skip


def test_bad_slots_positions_and_rows_are_refused():
    m = tiny_model()
    with pytest.raises(ValueError, match="slot 1 out of range"):
        m.step(ids(1), ids(1), ids(0), ids(0))
    with pytest.raises(ValueError, match="position 16 outside the cache"):
        m.step(ids(1), ids(0), ids(16), ids(0))
    with pytest.raises(ValueError, match="output row"):
        m.step(ids(1), ids(0), ids(0), ids(1))
    with pytest.raises(ValueError, match="differ in length"):
        m.step(ids(1, 2), ids(0), ids(0, 1), ids(0))
    with pytest.raises(ValueError, match="a step takes"):
        m.step(ids(*[1] * 9), ids(*[0] * 9), ids(*range(9)), ids(0))


def test_weights_of_the_wrong_dtype_rank_or_size_are_refused():
    m = tiny_model()
    with pytest.raises(TypeError, match="float32"):
        m.set_matrix("layers.0.q", np.zeros((32, 32), np.uint8), W.F32)
    with pytest.raises(TypeError, match="uint16"):
        m.set_matrix("layers.0.q", np.zeros((32, 32), np.float32), W.BF16)
    with pytest.raises(ValueError, match="2-D"):
        m.set_matrix("layers.0.q", np.zeros(32, np.float32), W.F32)
    with pytest.raises(ValueError, match="expected"):
        m.set_matrix("layers.0.q", np.zeros((31, 32), np.float32), W.Q8)
    with pytest.raises(ValueError, match="bias of layers.0.q has 31 values"):
        m.set_matrix("layers.0.q", np.zeros((32, 32), np.float32), W.F32, np.zeros(31, np.float32))
    with pytest.raises(TypeError):  # weight types are the enum, not ints
        m.set_matrix("layers.0.q", np.zeros((32, 32), np.float32), 0)
    with pytest.raises(ValueError, match="wrong size"):
        m.set_norm("norm", np.ones(31, np.float32))
    with pytest.raises(ValueError, match="unknown weight"):
        m.set_matrix("layers.0.qq", np.zeros((32, 32), np.float32), W.F32)


def test_the_kernel_entry_points_check_before_reading():
    with pytest.raises(TypeError, match="float32"):
        _native.kernel_weights(np.zeros((4, 8), np.uint8), W.F32)  # used to read 4x past the array
    x, w = np.ones((2, 8), np.float32), np.ones((5, 8), np.float32)
    with pytest.raises(ValueError, match="bias has 4 values, expected 5"):
        _native.kernel_matmul("generic", x, w, W.F32, np.zeros(4, np.float32))  # used to over-read
    with pytest.raises(ValueError, match="2-D"):
        _native.kernel_attend(
            "generic",
            np.ones(8, np.float32),
            np.ones((3, 8), np.float32),
            np.ones((3, 8), np.float32),
            0.1,
        )
    with pytest.raises(TypeError):
        _native.kernel_glu("generic", np.ones(8, np.float32), np.ones(8, np.float32), 1)


def test_the_precision_table_knows_the_native_formats_sizes():
    from kwker.precision import FORMATS

    assert set(FORMATS) == set(W.__members__)
    for name, fmt in FORMATS.items():
        assert fmt.bytes_per_weight * 8 == _native.bits_per_weight(W.__members__[name]), name


def test_thread_counts_are_capped():
    assert _native.max_threads == 256
    for bad in (0, -3, 400):
        with pytest.raises(ValueError, match="threads must be between 1 and 256"):
            _native.Pool(bad)
        with pytest.raises(ValueError, match="threads must be between 1 and 256"):
            _native.Model(tiny_config(), *rope(), 16, 1, 8, 4, bad)


def test_sizes_that_would_overflow_a_buffer_are_refused():
    for kw, match in (
        (dict(n_layer=10**6), "n_layer"),
        (dict(vocab=2**30), "vocab"),
        (dict(n_head=3, n_kv_head=2), "multiple of n_kv_head"),
        (dict(head_dim=17), "head_dim"),
    ):
        with pytest.raises(ValueError, match=match):
            _native.Model(tiny_config(**kw), *rope(), 16, 1, 8, 4, 1)
    with pytest.raises(ValueError, match="max_cache_len"):
        _native.Model(tiny_config(), *rope(2**25), 2**25, 1, 8, 4, 1)
    with pytest.raises(ValueError, match="rope tables"):
        _native.Model(tiny_config(), *rope(15), 16, 1, 8, 4, 1)


def test_a_pool_whose_threads_cannot_start_fails_cleanly():
    """With the address space capped, thread stacks cannot be mapped: the pool must stop the workers
    it did start and raise, not hang in its cleanup (run in a child, with a timeout)."""
    code = """
import resource
from kwker import _native
soft, hard = resource.getrlimit(resource.RLIMIT_AS)
with open('/proc/self/statm') as f:
    used = int(f.read().split()[0]) * resource.getpagesize()
resource.setrlimit(resource.RLIMIT_AS, (used + (64 << 20), hard))
try:
    _native.Pool(200)
except (RuntimeError, MemoryError) as e:
    print('refused:', e)
else:
    print('started')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused:"), out.stdout


# --------------------------------------------------------------------------------------------- fuzz
DTYPES = [np.float32, np.float64, np.int32, np.int64, np.uint8, np.uint16, np.int16, np.bool_]


def random_array(rng, shape, dtype=None):
    """An array of `shape` (or a neighbour of it), usually of `dtype`, sometimes non-contiguous."""
    if rng.random() < 0.2:
        shape = tuple(max(0, s + int(rng.integers(-2, 3))) for s in shape)
    if rng.random() < 0.1:
        shape = shape[:-1] if len(shape) > 1 else shape + (2,)
    dtype = dtype if dtype is not None and rng.random() < 0.8 else DTYPES[rng.integers(len(DTYPES))]
    a = (rng.standard_normal(shape) * 3).astype(dtype)
    if rng.random() < 0.15 and a.ndim >= 1 and a.shape[-1] > 1:
        a = np.repeat(a, 2, axis=-1)[..., ::2]  # same values, a stride of two
    return a


def random_ids(rng, n, high):
    values = rng.integers(-2, high + 3, n) if rng.random() < 0.3 else rng.integers(0, high, n)
    dtype = (
        [np.int32, np.int64, np.int64, np.uint8, np.float32][rng.integers(5)]
        if rng.random() < 0.3
        else np.int32
    )
    return values.astype(dtype)


def fuzz_kernels(rng, isa):
    m, k, n = (int(rng.integers(1, 40)) for _ in range(3))
    wt = list(W.__members__.values())[rng.integers(5)]
    wdtype = np.uint16 if wt in (W.BF16, W.F16) else np.float32
    call = rng.integers(7)
    if call == 0:
        bias = random_array(rng, (n,), np.float32) if rng.random() < 0.5 else None
        panels = (int(rng.integers(-1, 4)), int(rng.integers(-1, 4)))
        _native.kernel_matmul(
            isa,
            random_array(rng, (m, k), np.float32),
            random_array(rng, (n, k), wdtype),
            wt,
            bias,
            panels,
        )
    elif call == 1:
        _native.kernel_weights(random_array(rng, (n, k), wdtype), wt)
    elif call == 2:
        _native.kernel_quantize(isa, random_array(rng, (m, k), np.float32))
    elif call == 3:
        g, nt = int(rng.integers(1, 5)), int(rng.integers(1, 3))
        ends = sorted(int(e) for e in rng.integers(-1, n + 2, nt)) if rng.random() < 0.5 else []
        first = (
            int(rng.integers(-1, n + 1))
            if rng.random() < 0.5
            else [int(f) for f in rng.integers(0, 3, nt)]
        )
        _native.kernel_attend(
            isa,
            random_array(rng, (g * max(1, len(ends)), k), np.float32),
            random_array(rng, (n, k), np.float32),
            random_array(rng, (n, k), np.float32),
            0.1,
            first,
            bool(rng.random() < 0.5),
            ends,
            int(rng.integers(-1, 4)),
        )
    elif call == 4:
        _native.kernel_glu(
            isa,
            random_array(rng, (n,), np.float32),
            random_array(rng, (n,), np.float32),
            _native.Activation.GeluTanh,
        )
    elif call == 5:
        _native.kernel_to_f16(isa, random_array(rng, (n,), np.float32))
    else:
        t = float(rng.choice([0.7, 1.0, 0.0, -1.0, np.inf, np.nan]))
        _native.kernel_softmax_stats(isa, random_array(rng, (n,), np.float32), t, 9.0)
        _native.softmax_stats(
            random_array(rng, (n,), np.float32), t, float(rng.choice([9.0, -1.0]))
        )


def fuzz_model(rng, model):
    """A step, a weight or a norm, with random ids and arrays, on a complete tiny model; then a good
    step."""
    call = rng.integers(3)
    if call == 0:
        t = int(rng.integers(0, 10))
        model.step(
            random_ids(rng, t, 50),
            random_ids(rng, t, 1),
            random_ids(rng, t, 16),
            random_ids(rng, int(rng.integers(0, 3)), max(t, 1)),
        )
    elif call == 1:
        name = str(
            rng.choice(
                ["layers.0.q", "layers.0.down", "embed", "lm_head", "layers.1.q", "layers.x.q"]
            )
        )
        wt = list(W.__members__.values())[rng.integers(5)]
        shape = {"layers.0.down": (32, 64), "layers.0.q": (32, 32)}.get(name, (50, 32))
        model.set_matrix(
            name, random_array(rng, shape, np.uint16 if wt in (W.BF16, W.F16) else np.float32), wt
        )
    else:
        model.set_norm(
            str(rng.choice(["norm", "layers.0.attn_norm", "layers.3.mlp_norm"])),
            random_array(rng, (32,), np.float32),
        )


def test_fuzz_the_bindings_never_crash():
    """Seeded random calls of every binding: each returns or raises a Python error, and the model
    still steps afterwards. KWKER_FUZZ_ITERATIONS sets the length (the sanitizer run takes
    thousands)."""
    iterations = int(os.environ.get("KWKER_FUZZ_ITERATIONS", "400"))
    rng = np.random.default_rng(int(os.environ.get("KWKER_FUZZ_SEED", "2026")))
    isas = [i for i in ("generic", "avx2", "avx512", "avx512-emulated") if _native.isa_supported(i)]
    model = tiny_model(threads=2)
    outcomes = {"ok": 0, "refused": 0}
    for i in range(iterations):
        try:
            if rng.random() < 0.6:
                fuzz_kernels(rng, isas[rng.integers(len(isas))])
            else:
                fuzz_model(rng, model)
            outcomes["ok"] += 1
        except ERRORS:
            outcomes["refused"] += 1
        # the model survives whatever came before (a weight replaced by another is fine)
        if i % 50 == 49:
            if model is not None:
                try:
                    model.check_complete()
                    step(model)
                except ERRORS:
                    model = tiny_model(threads=2)
    assert outcomes["ok"] > iterations // 10 and outcomes["refused"] > iterations // 10, outcomes
