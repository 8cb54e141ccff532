"""A GGUF's Q4_K and Q6_K matrices run at int4 as Q4K and Q6K (issue 49): the file's blocks are held
bit for bit, packed without quantizing, and a token's logits are the same bits alone, in a multi-row
step, from the packed cache, on every ISA and thread count. Its Q5_0 and Q8_0 matrices are held
exactly as Q8.

int4 also quantizes float weights to Q4K where a matrix's rows are whole super-blocks
(kwker.precision.QUANTIZED_FORMATS): its bytes are those llama.cpp's quantizer writes, and gguf's
own dequantizer reads the numbers the kernels run; its error is Q4's, in fewer bytes; weights on
Q4's grid stay Q4; and the logits keep the same bits everywhere."""

import gguf
import numpy as np
import pytest
from synthetic_gguf import write_gguf

from kwker import _native
from kwker.loading.build import family_of, is_tied
from kwker.loading.load import load_files, open_files
from kwker.models.gguf_tools import llama_quantize

ISAS = [i for i in ("generic", "avx2", "avx512", "avx512-emulated") if _native.isa_supported(i)]
SEQ = [int(t) for t in np.random.default_rng(49).integers(16, 1000, 24)]


@pytest.fixture(scope="module")
def q4_k_m(tmp_path_factory):
    """The tiny llama shape as a Q4_K_M file: Q4_K matrices, Q6_K attn_v, ffn_down and output."""
    return write_gguf(tmp_path_factory.mktemp("q4k") / "tiny-Q4_K_M.gguf", "tiny", "Q4_K_M", seed=4)


@pytest.fixture(scope="module")
def float_file(tmp_path_factory):
    """The tiny llama shape (hidden 256, intermediate 512) in float32."""
    return write_gguf(tmp_path_factory.mktemp("f32") / "tiny-F32.gguf", "tiny", "F32", seed=8)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))


def file_matrices(path):
    """{native name: (the file's rows as uint8 [n, row bytes] in Hugging Face order, type)}."""
    config, source, *_ = open_files(path)
    out = {}
    for spec in family_of(config).weights(config, tied=is_tied(config, source)):
        if spec.kind == "norm":
            continue
        t = source.tensor(spec.source)
        rows = np.asarray(t.raw).reshape(t.shape[0], -1)
        out[spec.native] = (rows if t.row_order is None else rows[t.row_order], t.type_name)
    return out


def test_the_files_blocks_are_held_bit_for_bit(q4_k_m):
    step = load_files(q4_k_m, max_cache_len=64, precision="int4", cache=False).runner._step
    held = []
    for name, (rows, type_name) in file_matrices(q4_k_m).items():
        n, k = rows.shape[0], rows.shape[1] // {"Q4_K": 144, "Q6_K": 210}[type_name] * 256
        back = np.asarray(_native.k_unpack(step.packed(name), type_name, n, k)).reshape(n, -1)
        assert np.array_equal(back, rows), name
        held.append(type_name)
    # the Q4_K embedding; per layer Q4_K q and k (their rows permuted in the file), o, gate, up,
    # and Q6_K v and down; the Q6_K output
    assert sorted(held) == ["Q4_K"] * 11 + ["Q6_K"] * 5


def q8_values(packed, n: int, k: int) -> np.ndarray:
    """A Q8-packed matrix's numbers [n, k] (formats.h BlockQ8: per panel of 16 rows and block of 32
    columns, the rows' fp16 scales, then int8 [group of 4 columns][row][column of the group])."""
    blocks = np.frombuffer(packed, np.uint8).reshape(-1, k // 32, 544)
    scales = blocks[..., :32].copy().view(np.float16).astype(np.float32)  # [panel, block, row]
    q = blocks[..., 32:].copy().view(np.int8).reshape(*blocks.shape[:2], 8, 16, 4)
    values = q.astype(np.float32) * scales[:, :, None, :, None]  # [panel, block, group, row, col]
    return values.transpose(0, 3, 1, 2, 4).reshape(-1, k)[:n]


@pytest.mark.parametrize("matrix_type", ["Q5_0", "Q8_0"])
def test_q5_0_and_q8_0_are_held_exactly_as_q8(matrix_type, float_file, tmp_path):
    """A Q4_K_M file gives Q5_0 or Q8_0 to the matrices it keeps at more bits; int4 holds them in
    Q8, the file's numbers exactly, rather than losing those bits in a 4-bit format. Q5_0: random
    blocks (any largest level); Q8_0: llama.cpp's quantizer's (Q8 has no level -128)."""
    path = tmp_path / f"tiny-{matrix_type}.gguf"
    if matrix_type == "Q5_0":
        write_gguf(path, "tiny", matrix_type, seed=5)
    else:
        llama_quantize(float_file, path, matrix_type)
    step = load_files(path, max_cache_len=64, precision="int4", cache=False).runner._step
    held = 0
    for name, (rows, type_name) in file_matrices(path).items():
        if type_name != matrix_type:
            continue
        want = gguf.quants.dequantize(rows, gguf.GGMLQuantizationType[type_name])
        assert step.matrix_format(name) == _native.WType.Q8, name
        assert np.array_equal(q8_values(step.packed(name), *want.shape), want), name
        held += 1
    assert held >= 15  # the embedding and the two layers' seven matrices each, at least


def test_a_draft_takes_the_fewest_bytes(tmp_path):
    """A draft's Q5_0 matrices stay at 4 bits (fewest_bytes): its bytes decide whether it pays.
    The packed cache keeps the two packings apart."""
    path = write_gguf(tmp_path / "tiny-Q5_0.gguf", "tiny", "Q5_0", seed=5)
    formats = {}
    for _ in range(2):  # packed, then read back from the cache
        for draft in (False, True):
            dec = load_files(path, max_cache_len=64, precision="int4", fewest_bytes=draft)
            layer_matrices = [n for n in file_matrices(path) if n.startswith("layers.")]
            formats[draft] = {dec.runner._step.matrix_format(n).name for n in layer_matrices}
        assert formats == {False: {"Q8"}, True: {"Q4K"}}  # the tiny rows: whole super-blocks
    assert dec.from_cache


def logits(path, isa, threads, monkeypatch, cache=False):
    monkeypatch.setenv("KWKER_ISA", isa)
    dec = load_files(path, max_cache_len=64, precision="int4", threads=threads, cache=cache)
    prefill = dec.forward(SEQ[:-2])
    steps = [dec.forward([t], start=len(SEQ) - 2 + i) for i, t in enumerate(SEQ[-2:])]
    return np.concatenate([prefill, *steps]), dec


@pytest.mark.parametrize("source", ["q4_k_m", "float_file"])
def test_the_same_bits_alone_batched_on_every_isa_and_thread_count(source, request, monkeypatch):
    path = request.getfixturevalue(source)
    ref, dec = logits(path, "generic", 1, monkeypatch)
    # a token's logits alone (one-row steps) are its logits in the prefill
    alone = np.concatenate([dec.forward([t], start=i) for i, t in enumerate(SEQ[:-2])])
    assert np.array_equal(alone.view(np.uint32), ref[:-2].view(np.uint32))
    for isa in ISAS:
        for threads in (1, 2, 3):
            out, _ = logits(path, isa, threads, monkeypatch)
            assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), (isa, threads)


def test_the_packed_cache_gives_the_same_bits(q4_k_m, monkeypatch):
    first, a = logits(q4_k_m, ISAS[-1], 2, monkeypatch, cache=True)
    again, b = logits(q4_k_m, ISAS[-1], 2, monkeypatch, cache=True)
    assert (a.from_cache, b.from_cache) == (False, True)
    assert np.array_equal(first.view(np.uint32), again.view(np.uint32))


def test_the_logits_are_the_files_weights_on_quantized_activations(q4_k_m):
    """Q4K runs the file's own numbers: its logits stay near those of the file at fp32 (the
    dequantized weights on float32 activations)."""
    fp32 = load_files(q4_k_m, max_cache_len=64, precision="fp32", cache=False).forward(SEQ)
    int4 = load_files(q4_k_m, max_cache_len=64, precision="int4", cache=False).forward(SEQ)
    assert kl(fp32, int4) < 0.005  # 0.0012 when written; the Q4 of before: 0.0011


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean KL(p || q) of the rows' next-token distributions."""
    lp = p_logits - np.logaddexp.reduce(p_logits, axis=1, keepdims=True)
    lq = q_logits - np.logaddexp.reduce(q_logits, axis=1, keepdims=True)
    return float((np.exp(lp) * (lp - lq)).sum(1).mean())


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


def test_float_weights_pack_as_q4k(float_file):
    step = load_files(float_file, max_cache_len=64, precision="int4", cache=False).runner._step
    for name, (n, k) in {"layers.0.q": (256, 256), "layers.1.down": (256, 512)}.items():
        # Q4K's bytes: 16 rows x 256 values in 2368 (Q4 would take 16 x 32 in 320)
        assert step.packed(name).size == n // 16 * k // 256 * 2368, name
