"""int4 quantizes float weights to Q4K (ggml's Q4_K) where a matrix's rows are whole super-blocks
(issue 49, kwker.precision.QUANTIZED_FORMATS): its bytes are those llama.cpp's quantizer writes,
and gguf's own dequantizer reads the numbers the kernels run; its error is Q4's, in fewer bytes;
and the logits are the same bits on every ISA and thread count, alone or in a multi-row step."""

import gguf
import numpy as np
import pytest
from synthetic_gguf import write_gguf

from kwker import _native
from kwker.loading.load import load_files
from kwker.models.gguf_tools import llama_quantize

ISAS = [i for i in ("generic", "avx2", "avx512", "avx512-emulated") if _native.isa_supported(i)]
SEQ = [int(t) for t in np.random.default_rng(48).integers(16, 1000, 20)]


@pytest.fixture(scope="module")
def float_file(tmp_path_factory):
    """The tiny llama shape (hidden 256, intermediate 512) in float32."""
    return write_gguf(tmp_path_factory.mktemp("f32") / "tiny-F32.gguf", "tiny", "F32", seed=8)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))


def float_matrices(path):
    """{GGUF tensor name: float32 [n, k]} of a file's layer matrices."""
    reader = gguf.GGUFReader(path)
    return {t.name: np.asarray(t.data, np.float32).reshape(int(t.shape[1]), int(t.shape[0]))
            for t in reader.tensors if len(t.shape) == 2 and t.name.startswith("blk.")}  # fmt: skip


def rel_error(w, q):
    return float(
        np.sqrt(((q.astype(np.float64) - w) ** 2).sum() / (w.astype(np.float64) ** 2).sum())
    )


def test_its_blocks_are_llama_cpps_q4_k_and_err_as_q4s_in_fewer_bytes(float_file, tmp_path):
    """The quantizer makes the search of ggml's reference Q4_K quantizer (kwker's own code): its
    blocks are those llama.cpp's quantizer writes from the same floats, byte for byte."""
    theirs = gguf.GGUFReader(llama_quantize(float_file, tmp_path / "tiny-Q4_K_M.gguf", "Q4_K_M"))
    q4_k = gguf.GGMLQuantizationType.Q4_K
    llama_q4k = {t.name: t for t in theirs.tensors if t.tensor_type == q4_k}
    assert len(llama_q4k) >= 8  # q, k, o, gate, up per layer at least
    vs_q4 = []
    for name, w in float_matrices(float_file).items():
        n, k = w.shape
        rows = _native.ggml_quantize_q4_k(w)
        assert rows.shape == (n, k // 256 * 144)
        if name in llama_q4k:
            assert np.array_equal(rows, np.asarray(llama_q4k[name].data).reshape(n, -1)), name
        # the kernels run those blocks' numbers, as gguf's own dequantizer reads them
        ours = _native.kernel_weights(w, _native.WType.Q4K)
        assert np.array_equal(ours, _native.kernel_weights(rows, _native.WType.Q4K)), name
        assert np.allclose(gguf.quants.dequantize(rows, q4_k), ours, rtol=1e-6, atol=0), name
        vs_q4.append(rel_error(w, ours) / rel_error(w, _native.kernel_weights(w, _native.WType.Q4)))
    # within 1% of Q4's error, in 4.625 bits a weight, not 5
    assert max(vs_q4) < 1.01, vs_q4


def test_weights_on_q4s_grid_stay_q4():
    """Q4 holds weights that lie on its grid (a Q4_0 or Q4_1 file's, dequantized by transformers)
    exactly: for them it is the better format for its bytes, and the loader keeps it."""
    w = np.random.default_rng(3).standard_normal((16, 512)).astype(np.float32) * 0.02
    assert _native.kernel_int4_format(w) == _native.WType.Q4K
    on_grid = _native.kernel_weights(w, _native.WType.Q4)
    assert _native.kernel_int4_format(on_grid) == _native.WType.Q4
    assert np.array_equal(_native.kernel_weights(on_grid, _native.WType.Q4), on_grid)


def logits(path, isa, threads, monkeypatch):
    monkeypatch.setenv("KWKER_ISA", isa)
    dec = load_files(path, max_cache_len=64, precision="int4", threads=threads, cache=False)
    prefill = dec.forward(SEQ[:-2])
    steps = [dec.forward([t], start=len(SEQ) - 2 + i) for i, t in enumerate(SEQ[-2:])]
    return np.concatenate([prefill, *steps]), dec


def test_float_weights_run_as_q4k_with_the_same_bits_everywhere(float_file, monkeypatch):
    ref, dec = logits(float_file, "generic", 1, monkeypatch)
    for name, (n, k) in {"layers.0.q": (256, 256), "layers.1.down": (256, 512)}.items():
        # Q4K's bytes: 16 rows x 256 values in 2368 (Q4 would take 16 x 32 in 320)
        assert dec.runner._step.packed(name).size == n // 16 * k // 256 * 2368, name
    alone = np.concatenate([dec.forward([t], start=i) for i, t in enumerate(SEQ[:-2])])
    assert np.array_equal(alone.view(np.uint32), ref[:-2].view(np.uint32))
    for isa in ISAS:
        for threads in (1, 2):
            out, _ = logits(float_file, isa, threads, monkeypatch)
            assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (isa, threads)
