"""kwker.loading.gguf_file: every metadata value type, the tensor table, the fast string arrays, and
the errors a corrupt file gets; the real GGUFs read as transformers' and gguf-py's readers read
them."""

import struct
import time

import numpy as np
import pytest
from loading_files import Tensor, gguf_bytes, write

from kwker.loading.gguf_file import GGML_TYPES, GgufError, read_gguf
from kwker.models.pypi_source import fetch_gguf

REPOS = [
    "HuggingFaceTB/SmolLM2-135M-Instruct",
    "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "Qwen/Qwen2.5-Coder-1.5B-Instruct",
    "google/gemma-3-270m",
]

STRINGS = ["", "a", "ab c", "Ġhello", "▁▁", "日本語", "🤖🎉", "é", "\n", "x" * 300, "<|im_start|>"]
METADATA = [
    ("general.architecture", 8, "llama"),
    ("u8", 0, 200),
    ("i8", 1, -100),
    ("u16", 2, 60000),
    ("i16", 3, -30000),
    ("u32", 4, 4_000_000_000),
    ("i32", 5, -2_000_000_000),
    ("f32", 6, 1e-5),
    ("bool", 7, True),
    ("string", 8, "héllo wörld 🤖"),
    ("u64", 10, 2**63 + 5),
    ("i64", 11, -(2**62)),
    ("f64", 12, 0.1),
    ("array.u8", 9, (0, [1, 2, 255])),
    ("array.i32", 9, (5, [-1, 0, 7])),
    ("array.f32", 9, (6, [0.5, -1.25])),
    ("array.bool", 9, (7, [True, False, True])),
    ("array.u64", 9, (10, [2**64 - 1])),
    ("array.f64", 9, (12, [1.5, 2.5])),
    ("array.empty", 9, (4, [])),
    ("array.strings", 9, (8, STRINGS)),
    ("array.no_strings", 9, (8, [])),
    ("array.nested", 9, (9, [(4, [1, 2]), (8, ["x", "yz"]), (9, [(0, [3])])])),
]
EXPECTED = {
    "general.architecture": "llama",
    "u8": 200,
    "i8": -100,
    "u16": 60000,
    "i16": -30000,
    "u32": 4_000_000_000,
    "i32": -2_000_000_000,
    "f32": float(np.float32(1e-5)),  # what a float32 holds, as Python reads it
    "bool": True,
    "string": "héllo wörld 🤖",
    "u64": 2**63 + 5,
    "i64": -(2**62),
    "f64": 0.1,
    "array.u8": [1, 2, 255],
    "array.i32": [-1, 0, 7],
    "array.f32": [0.5, -1.25],
    "array.bool": [True, False, True],
    "array.u64": [2**64 - 1],
    "array.f64": [1.5, 2.5],
    "array.empty": [],
    "array.strings": STRINGS,
    "array.no_strings": [],
    "array.nested": [[1, 2], ["x", "yz"], [[3]]],
}
TENSORS = [
    Tensor("token_embd.weight", (16, 64), 0),
    Tensor("blk.0.attn_q.weight", (8, 256), 12),  # Q4_K
    Tensor("blk.0.attn_norm.weight", (64,), 1),
    Tensor("blk.0.ffn_up.weight", (4, 2, 32), 8),  # Q8_0, 3-D
    Tensor("output.weight", (3, 512), 14),  # Q6_K
    Tensor("blk.0.bf16", (5, 7), 30),
]


def test_every_value_type_and_the_tensor_table(tmp_path):
    built = write(tmp_path / "m.gguf", METADATA, TENSORS)
    g = read_gguf(tmp_path / "m.gguf")
    assert g.metadata == EXPECTED and list(g.metadata) == list(EXPECTED)
    assert all(type(g.metadata[k]) is type(v) for k, v in EXPECTED.items())
    assert g.version == 3 and g.alignment == 32 and g.data_start == built.data_start
    assert g.file_size == len(built.raw) and list(g.tensors) == [t.name for t in TENSORS]
    for t in TENSORS:
        info = g.tensors[t.name]
        assert info.shape == t.shape and info.ggml_type == t.ggml_type
        assert info.offset == built.data_start + built.offsets[t.name] and info.nbytes == t.nbytes
        assert (
            built.raw[info.offset : info.offset + info.nbytes]
            == bytes([built.raw[info.offset]]) * t.nbytes
        )
        assert info.type_name == GGML_TYPES[t.ggml_type].name


def test_agrees_with_gguf_py_on_a_synthetic_file(tmp_path):
    """gguf-py's reader (an independent implementation) on the same bytes."""
    from gguf import GGUFReader

    write(tmp_path / "m.gguf", METADATA, TENSORS)
    ours = read_gguf(tmp_path / "m.gguf")
    theirs = GGUFReader(tmp_path / "m.gguf")
    for key, field in theirs.fields.items():
        if key.startswith("GGUF.") or key == "array.nested":  # the header counts; nested: below
            continue
        expected = field.contents()
        if isinstance(expected, float) or (
            expected and isinstance(expected, list) and isinstance(expected[0], float)
        ):
            assert np.allclose(ours.metadata[key], expected, rtol=0, atol=0), key
        else:
            assert ours.metadata[key] == expected, key
    for t in theirs.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(n) for n in reversed(t.shape))
        assert (info.ggml_type, info.offset, info.nbytes) == (
            int(t.tensor_type),
            t.data_offset,
            t.n_bytes,
        )


def test_alignment_and_version_2(tmp_path):
    meta = [("general.alignment", 4, 64), ("general.architecture", 8, "llama")]
    built = write(tmp_path / "m.gguf", meta, TENSORS[:3], alignment=64, version=2)
    g = read_gguf(tmp_path / "m.gguf")
    assert g.version == 2 and g.alignment == 64 and g.data_start % 64 == 0
    assert [g.tensors[t.name].offset for t in TENSORS[:3]] == [
        built.data_start + built.offsets[t.name] for t in TENSORS[:3]
    ]


@pytest.mark.parametrize(
    "strings",
    [
        ["a\0b", "c"],  # a NUL inside a string: not the separator trick
        ["x" * 70_000, "y"],  # a length past 16 bits: not the six-zero-bytes search
        ["", "", "a"],  # empty strings: their length is followed by the next length
        ["\0lead", "b"],
        [str(i) for i in range(5000)],
    ],
)
def test_string_arrays_of_every_shape(tmp_path, strings):
    write(tmp_path / "m.gguf", [("s", 9, (8, strings)), ("after", 4, 7)])
    g = read_gguf(tmp_path / "m.gguf")
    assert g.metadata == {"s": strings, "after": 7}


def test_a_string_that_is_not_utf8_is_named(tmp_path):
    built = gguf_bytes([("tokenizer.ggml.tokens", 9, (8, ["ok", "fine"]))])
    bad = built.raw.replace(b"fine", b"f\xffne")
    (tmp_path / "m.gguf").write_bytes(bad)
    with pytest.raises(
        GgufError, match=r"m\.gguf: metadata 'tokenizer\.ggml\.tokens'\[1\] is not valid UTF-8"
    ):
        read_gguf(tmp_path / "m.gguf")


def expect_error(tmp_path, raw: bytes, pattern: str):
    path = tmp_path / "bad.gguf"
    path.write_bytes(raw)
    with pytest.raises(GgufError, match=pattern) as info:
        read_gguf(path)
    assert str(path) in str(info.value)
    return str(info.value)


def test_not_a_gguf(tmp_path):
    expect_error(tmp_path, b"", "only 0 bytes long")
    expect_error(
        tmp_path, b"PK\x03\x04" + bytes(40), r"not a GGUF file: it starts with b'PK\\x03\\x04'"
    )
    expect_error(tmp_path, gguf_bytes([], version=1).raw, "GGUF version 1 is not supported")
    expect_error(tmp_path, gguf_bytes([], version=7).raw, "GGUF version 7 is not supported")
    big_endian = b"GGUF" + struct.pack(">IQQ", 3, 0, 0)
    expect_error(tmp_path, big_endian, "big-endian GGUF")


def test_every_truncation_of_the_header_is_named(tmp_path):
    built = gguf_bytes(METADATA, TENSORS)
    header_end = built.data_start - 1  # the table ends at or before the padding
    for cut in range(4, header_end, 7):
        message = expect_error(tmp_path, built.raw[:cut], "truncated")
        assert f"({cut} bytes)" in message


def test_truncated_tensor_data_names_the_tensor(tmp_path):
    built = gguf_bytes([("general.architecture", 8, "llama")], TENSORS)
    last = TENSORS[-1]
    end = built.data_start + built.offsets[last.name] + last.nbytes
    raw = built.raw[: end - 1]
    expect_error(
        tmp_path,
        raw,
        rf"tensor {last.name}: data ends at byte {end}, past the end of the file \({len(raw)} bytes\): "
        "the file is truncated",
    )


def test_a_real_header_with_its_data_cut_off(tmp_path):
    """The real SmolLM2 header with only 1 MB of its tensor data: the first tensor past the cut is
    named."""
    source = read_gguf(fetch_gguf(REPOS[0]))
    cut = source.data_start + 1_000_000
    with open(source.path, "rb") as f:
        raw = f.read(cut)
    message = expect_error(tmp_path, raw, "the file is truncated")
    assert message.startswith(f"{tmp_path / 'bad.gguf'}: tensor ")
    named = message.split("tensor ")[1].split(":")[0]
    assert source.tensors[named].offset + source.tensors[named].nbytes > cut


@pytest.mark.parametrize(
    ("ggml_type", "pattern"),
    [
        (99, r"tensor blk\.0\.x: an unknown ggml type 99 \(unknown \(99\)\) is not supported"),
        (
            39,
            r"tensor blk\.0\.x: ggml type 39 \(MXFP4\) is not supported \(supported: F32, F16, Q4_0",
        ),
        (4, r"ggml type 4 \(Q4_2 \(removed from ggml\)\) is not supported"),
    ],
)
def test_unsupported_types_name_the_tensor_and_the_id(tmp_path, ggml_type, pattern):
    raw = bytearray(gguf_bytes([], [Tensor("blk.0.x", (2, 32), 0)]).raw)
    type_field = 24 + 8 + len("blk.0.x") + 4 + 2 * 8  # header, name, n_dims, ne
    raw[type_field : type_field + 4] = struct.pack("<I", ggml_type)
    expect_error(tmp_path, bytes(raw), pattern)


def test_table_errors(tmp_path):
    def table(*tensors, **kw):
        return gguf_bytes([("general.architecture", 8, "llama")], list(tensors), **kw).raw

    expect_error(
        tmp_path,
        table(Tensor("w", (4, 48), 2)),
        r"tensor w: rows of 48 elements are not a whole number of Q4_0 blocks \(32 elements each\)",
    )
    expect_error(tmp_path, table(Tensor("w", (4,)), Tensor("w", (4,))), "tensor w appears twice")
    expect_error(
        tmp_path,
        table(Tensor("a", (8,), offset=0), Tensor("b", (8,), offset=0)),
        r"tensor b \(bytes \d+\.\.\d+\) overlaps tensor a",
    )
    expect_error(
        tmp_path,
        table(
            Tensor("a", (64,), offset=0),
            Tensor("b", (8,), offset=128),
            Tensor("c", (8,), offset=224),
        ),
        r"tensor b .* overlaps tensor a",
    )
    expect_error(
        tmp_path,
        table(Tensor("a", (8,), offset=16)),
        "data offset 16 is not a multiple of the alignment 32",
    )
    expect_error(
        tmp_path,
        table(Tensor("a", (1, 1, 1, 1, 1))),
        r"tensor a: 5 dimensions \(GGUF allows 1 to 4\)",
    )


def test_metadata_errors(tmp_path):
    expect_error(
        tmp_path, gguf_bytes([("k", 4, 1), ("k", 4, 2)]).raw, "metadata key 'k' appears twice"
    )
    expect_error(
        tmp_path, gguf_bytes([("general.alignment", 4, 48)]).raw, "general.alignment is 48"
    )
    expect_error(
        tmp_path, gguf_bytes([("general.alignment", 8, "32")]).raw, "general.alignment is '32'"
    )
    raw = gguf_bytes([("k", 4, 1)]).raw.replace(struct.pack("<I", 4), struct.pack("<I", 13), 1)
    expect_error(tmp_path, raw, "metadata 'k' has unknown value type 13")
    raw = bytearray(gguf_bytes([("k", 4, 1)]).raw)
    raw[16:24] = struct.pack("<Q", 2**40)  # kv_count
    expect_error(tmp_path, bytes(raw), "claims 1099511627776 metadata entries")


def string_array_keys(metadata):
    return {k for k, v in metadata.items() if isinstance(v, list) and v and isinstance(v[0], str)}


@pytest.mark.slow
@pytest.mark.parametrize("repo", REPOS)
def test_real_files_read_as_transformers_reads_them(repo):
    """Metadata as transformers' reader gives it; the tensor table from its table walk (its public
    header refuses Q5_0, which the Qwen files hold), sized with gguf-py's block table."""
    from gguf.constants import GGML_QUANT_SIZES
    from transformers.integrations.gguf import reader

    path = fetch_gguf(repo)
    start = time.perf_counter()
    ours = read_gguf(path)
    seconds = time.perf_counter() - start
    assert seconds < 1.0, f"{seconds:.2f} s to read the header of {path.name}"
    metadata, names = reader.read_gguf_metadata(str(path), string_array_keys(ours.metadata))
    assert ours.metadata == metadata and tuple(ours.tensors) == names
    blob = reader._mapped(str(path))
    _, count, pos = reader._read_metadata(blob, str(path))
    table, end = reader._read_tensor_table(blob, count, pos)
    data_start = -(-end // 32) * 32
    assert ours.data_start == data_start and ours.file_size == path.stat().st_size
    for name, shape, ggml_type, offset in table:
        elements, size = GGML_QUANT_SIZES[ggml_type]
        info = ours.tensors[name]
        assert (info.shape, info.ggml_type, info.offset, info.nbytes) == (
            shape,
            ggml_type,
            data_start + offset,
            int(np.prod(shape)) // elements * size,
        )
