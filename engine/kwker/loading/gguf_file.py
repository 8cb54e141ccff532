"""Reading a GGUF file's header: its metadata, its tensor table and where each tensor's data lies.

GGUF (v2/v3, little-endian) is a header followed by aligned tensor data:

    magic "GGUF" | version u32 | tensor_count u64 | kv_count u64
    kv_count x (key: string, value_type u32, value)
    tensor_count x (name: string, n_dims u32, ne u64 x n_dims, ggml_type u32, offset u64)
    padding to `general.alignment` (32 unless stated), then the tensor data

where a string is a u64 byte length and UTF-8 bytes. This module reads the header only, with the
standard library and numpy (no torch, no `gguf` package: its reader builds a Python object per array
element, which takes seconds on a 151k-token vocabulary). The tensor data is left for whoever maps
it; every tensor's byte range is checked against the file and the other tensors here, so a truncated
or corrupt file fails at open, naming the file and the tensor, instead of as garbage weights later.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from math import prod
from pathlib import Path

import numpy as np

from kwker.loading.errors import BadModelFile

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)  # v1 counted in 32 bits and predates every file still in circulation
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS: llama.cpp rejects more, so no writer produces them
# Arrays of arrays nest one level in the files llama.cpp writes; a deeper nesting is corruption, and
# refused before reading it would recurse once per level
MAX_ARRAY_NESTING = 8


class GgufError(BadModelFile):
    """A file that is not a GGUF this reader can take, or a corrupt one; the message names the
    file."""


@dataclass(frozen=True)
class GgmlType:
    name: str
    block_elements: int  # elements per block (1 for plain floats)
    block_bytes: int  # bytes per block


# The storage types Kwker can load, as ggml numbers them (ggml.h `enum ggml_type`). Block sizes from
# ggml-common.h.
GGML_TYPES: dict[int, GgmlType] = {
    0: GgmlType("F32", 1, 4),
    1: GgmlType("F16", 1, 2),
    2: GgmlType("Q4_0", 32, 18),
    3: GgmlType("Q4_1", 32, 20),
    6: GgmlType("Q5_0", 32, 22),
    7: GgmlType("Q5_1", 32, 24),
    8: GgmlType("Q8_0", 32, 34),
    10: GgmlType("Q2_K", 256, 84),
    11: GgmlType("Q3_K", 256, 110),
    12: GgmlType("Q4_K", 256, 144),
    13: GgmlType("Q5_K", 256, 176),
    14: GgmlType("Q6_K", 256, 210),
    15: GgmlType("Q8_K", 256, 292),
    16: GgmlType("IQ2_XXS", 256, 66),
    17: GgmlType("IQ2_XS", 256, 74),
    18: GgmlType("IQ3_XXS", 256, 98),
    19: GgmlType("IQ1_S", 256, 50),
    20: GgmlType("IQ4_NL", 32, 18),
    21: GgmlType("IQ3_S", 256, 110),
    22: GgmlType("IQ2_S", 256, 82),
    23: GgmlType("IQ4_XS", 256, 136),
    29: GgmlType("IQ1_M", 256, 56),
    30: GgmlType("BF16", 1, 2),
    34: GgmlType("TQ1_0", 256, 54),
    35: GgmlType("TQ2_0", 256, 66),
}

# Every ggml type id there is or was, so an error can say what a file holds rather than just a
# number.
GGML_TYPE_NAMES: dict[int, str] = {
    **{type_id: t.name for type_id, t in GGML_TYPES.items()},
    4: "Q4_2 (removed from ggml)",
    5: "Q4_3 (removed from ggml)",
    9: "Q8_1",
    24: "I8",
    25: "I16",
    26: "I32",
    27: "I64",
    28: "F64",
    31: "Q4_0_4_4 (removed from ggml)",
    32: "Q4_0_4_8 (removed from ggml)",
    33: "Q4_0_8_8 (removed from ggml)",
    36: "IQ4_NL_4_4 (removed from ggml)",
    37: "IQ4_NL_4_8 (removed from ggml)",
    38: "IQ4_NL_8_8 (removed from ggml)",
    39: "MXFP4",
    40: "NVFP4",
    41: "Q1_0",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy/torch order, rows first (GGUF stores ne fastest-moving first)
    ggml_type: int
    offset: int  # absolute file offset of the data
    nbytes: int
    path: Path | None = None  # the file it is in (a split model's tensors are in several)

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.ggml_type].name


@dataclass
class GgufFile:
    path: Path
    # strings as str, numbers as int/float/bool, arrays as (nested) lists
    metadata: dict[str, object]
    tensors: dict[str, TensorInfo]  # in file order
    file_size: int
    version: int = 3
    alignment: int = DEFAULT_ALIGNMENT
    data_start: int = 0  # where the tensor data section begins

    def tensor_bytes(self, info: TensorInfo) -> bytes:
        """The bytes of a (small) tensor, read from its file: for values the config needs."""
        with open(info.path or self.path, "rb") as f:
            f.seek(info.offset)
            return f.read(info.nbytes)


# Value type ids of GGUF metadata (gguf.md, `gguf_metadata_value_type`): the fixed-size ones, as
# struct formats for single values and numpy dtypes for arrays.
STRING, ARRAY = 8, 9
SCALAR_FORMATS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_SCALARS = {t: struct.Struct(f) for t, f in SCALAR_FORMATS.items()}
_ARRAY_DTYPES = {t: np.dtype(f.replace("?", "u1")) for t, f in SCALAR_FORMATS.items()}
_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_HEADER = struct.Struct("<4sIQQ")


def type_name(type_id: int) -> str:
    return GGML_TYPE_NAMES.get(type_id, f"unknown ({type_id})")


class _Header:
    """A cursor over the mapped file that checks every read against its end."""

    def __init__(self, buf, path: Path, size: int):
        self.buf, self.path, self.size, self.pos = buf, path, size, 0

    def error(self, message: str) -> GgufError:
        return GgufError(f"{self.path}: {message}")

    def need(self, n: int, what: str) -> None:
        if self.pos + n > self.size:
            raise self.error(
                f"the header is truncated: {what} at byte {self.pos} needs {n} bytes, past the end of "
                f"the file ({self.size} bytes)"
            )

    def unpack(self, fmt: struct.Struct, what: str):
        self.need(fmt.size, what)
        (value,) = fmt.unpack_from(self.buf, self.pos)
        self.pos += fmt.size
        return value

    def string(self, what: str) -> str:
        n = self.unpack(_U64, what)
        self.need(n, what)
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise self.error(f"{what} is not valid UTF-8 ({e})") from None

    def value(self, value_type: int, what: str):
        if value_type in _SCALARS:
            return self.unpack(_SCALARS[value_type], what)
        if value_type == STRING:
            return self.string(what)
        if value_type == ARRAY:
            element_type = self.unpack(_U32, what)
            count = self.unpack(_U64, what)
            return self.array(element_type, count, what)
        raise self.error(f"{what} has unknown value type {value_type}")

    def array(self, element_type: int, count: int, what: str, depth: int = 1) -> list:
        if element_type in _ARRAY_DTYPES:
            dtype = _ARRAY_DTYPES[element_type]
            self.need(count * dtype.itemsize, what)
            # tolist() right away: the numpy view must not outlive the map, and callers want plain
            # values
            values = np.frombuffer(self.buf, dtype, count, self.pos).tolist()
            self.pos += count * dtype.itemsize
            return [bool(v) for v in values] if element_type == 7 else values
        if element_type == STRING:
            return self.string_array(count, what)
        if element_type == ARRAY:
            if depth >= MAX_ARRAY_NESTING:
                raise self.error(f"{what} nests arrays more than {MAX_ARRAY_NESTING} deep")
            self.need(count * 12, what)  # each nested array has at least its type and count
            return [
                self.array(
                    self.unpack(_U32, what), self.unpack(_U64, what), f"{what}[{i}]", depth + 1
                )
                for i in range(count)
            ]
        raise self.error(f"{what} is an array of unknown value type {element_type}")

    def string_array(self, count: int, what: str) -> list[str]:
        """A vocabulary or merge table: the hot path, 150k+ strings on Qwen. Once the position of
        every 8-byte length is known, numpy swaps each length for a NUL and one decode and one split
        in C make the strings."""
        self.need(count * 8, what)  # every element has its length at least
        begin = self.pos
        starts = self.find_lengths(count)
        if starts is None:
            starts = self.walk_lengths(count, what)
        if count == 0:
            return []
        region = np.frombuffer(self.buf, np.uint8, self.pos - begin, begin)
        keep = np.ones(region.size, bool)
        # each length's first byte stays, as the separator; the other seven go
        keep[(starts[:, None] + np.arange(1, 8)).ravel()] = False
        joined = region[keep]
        del region  # the view pins the map
        joined[starts - 7 * np.arange(count)] = 0
        if np.count_nonzero(joined == 0) == count:  # no string holds a NUL itself
            try:
                return joined.tobytes().decode("utf-8")[1:].split("\0")
            except UnicodeDecodeError:
                pass  # name the bad element below
        return self.decode_each(begin + starts, what)

    def find_lengths(self, count: int) -> np.ndarray | None:
        """Where the count string lengths are (relative to the cursor), found with numpy; None when
        the strings are not the kind this finds. Then the cursor is left alone.

        Each string starts where the previous one ends, which a loop can only follow one at a time.
        But a length below 65536 has six zero bytes on top, followed by the string's first byte,
        nonzero in text: every such position is a candidate, and the candidates are exactly the
        strings when each one's length leads to the next. A NUL run inside a string, an empty or
        very long one breaks that chain (caught by the check), and the caller walks the lengths
        instead."""
        begin = self.pos
        window = count * 32
        while count:
            n = min(window, self.size - begin)
            w = np.frombuffer(self.buf, np.uint8, n, begin)
            zero = w == 0
            candidate = ~zero[8:]
            for k in range(2, 8):
                candidate &= zero[k : n - 8 + k]
            starts = np.flatnonzero(candidate)[:count]
            lengths = w[starts].astype(np.int64) | w[starts + 1].astype(np.int64) << 8
            del w, zero, candidate
            if len(starts) == count:
                ends = starts + 8 + lengths
                chained = starts[0] == 0 and np.array_equal(ends[:-1], starts[1:])
                if chained and begin + ends[-1] <= self.size:  # else the walk names the cut
                    self.pos = begin + int(ends[-1])
                    return starts
                return None
            if n == self.size - begin or window >= count * 256:  # too few in any likely span
                return None
            window *= 2
        return np.zeros(0, np.int64)

    def walk_lengths(self, count: int, what: str) -> np.ndarray:
        """Where the count string lengths are (relative to the cursor), one at a time; the cursor
        moves past the strings."""
        begin = pos = self.pos
        starts = [0] * count
        unpack = _U64.unpack_from
        for i in range(count):
            starts[i] = pos - begin
            if pos + 8 > self.size:
                self.pos = pos
                self.need(8, f"{what}[{i}]")
            pos += 8 + unpack(self.buf, pos)[0]
        if pos > self.size:
            self.pos = begin + starts[-1] + 8
            self.need(pos - self.pos, f"{what}[{count - 1}]")
        self.pos = pos
        return np.asarray(starts, np.int64)

    def decode_each(self, prefixes: np.ndarray, what: str) -> list[str]:
        """The slow path: strings holding NULs, or one that is not UTF-8 (named in the error)."""
        out = []
        for i, prefix in enumerate(prefixes.tolist()):
            (n,) = _U64.unpack_from(self.buf, prefix)
            try:
                out.append(self.buf[prefix + 8 : prefix + 8 + n].decode("utf-8"))
            except UnicodeDecodeError as e:
                raise self.error(f"{what}[{i}] is not valid UTF-8 ({e})") from None
        return out


def read_gguf(path: str | os.PathLike) -> GgufFile:
    """The header of the GGUF file at `path`, validated (see GgufError); tensor data is not read."""
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < len(GGUF_MAGIC):
            raise GgufError(f"{path}: not a GGUF file: it is only {size} bytes long")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(_Header(buf, path, size))


def parse_buffer(buf, path: Path, size: int) -> tuple[GgufFile, int]:
    """(header, the bytes it took) of a GGUF of `size` bytes whose first bytes are in `buf` (a
    buffer of `size` bytes; kwker.models.gguf_repo reads a Hub file's first bytes into one). A
    GgufError says at `.at` where it was found, so a caller that holds only the file's first
    bytes can tell a corrupt header from one that runs past them."""
    h = _Header(buf, path, size)
    try:
        gguf = _parse(h)
    except GgufError as e:
        e.at = h.pos
        raise
    return gguf, h.pos


def _parse(h: _Header) -> GgufFile:
    magic = bytes(h.buf[:4])
    if magic != GGUF_MAGIC:
        raise h.error(f"not a GGUF file: it starts with {magic!r}, not {GGUF_MAGIC!r}")
    h.need(_HEADER.size, "the file header")
    _, version, tensor_count, kv_count = _HEADER.unpack_from(h.buf, 0)
    h.pos = _HEADER.size
    if version not in SUPPORTED_VERSIONS:
        swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
        if swapped in SUPPORTED_VERSIONS:
            raise h.error(f"a big-endian GGUF (v{swapped}); only little-endian files are supported")
        raise h.error(
            f"GGUF version {version} is not supported (supported: "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}); re-convert it with a current llama.cpp"
        )
    # Counts from a corrupt header can be astronomically large; each entry takes at least 12 bytes.
    for count, what in ((kv_count, "metadata entries"), (tensor_count, "tensors")):
        if count * 12 > h.size - h.pos:
            raise h.error(
                f"the header is truncated or corrupt: it claims {count} {what}, more than the rest of "
                f"the file ({h.size} bytes) can hold"
            )

    metadata: dict[str, object] = {}
    for i in range(kv_count):
        key = h.string(f"metadata key #{i}")
        if key in metadata:
            raise h.error(f"metadata key {key!r} appears twice")
        value_type = h.unpack(_U32, f"the value type of metadata {key!r}")
        metadata[key] = h.value(value_type, f"metadata {key!r}")

    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise h.error(f"general.alignment is {alignment!r}, not a positive power of two")

    table = [_read_tensor_info(h, i) for i in range(tensor_count)]
    data_start = -(-h.pos // alignment) * alignment
    tensors: dict[str, TensorInfo] = {}
    for name, shape, ggml_type, relative in table:
        if name in tensors:
            raise h.error(f"tensor {name} appears twice in the tensor table")
        tensors[name] = _tensor(h, name, shape, ggml_type, relative, data_start, alignment)
    _check_no_overlap(h, tensors.values())
    return GgufFile(h.path, metadata, tensors, h.size, version, alignment, data_start)


def _read_tensor_info(h: _Header, index: int) -> tuple[str, tuple[int, ...], int, int]:
    name = h.string(f"the name of tensor #{index}")
    what = f"the tensor info of {name}"
    n_dims = h.unpack(_U32, what)
    if not 1 <= n_dims <= MAX_DIMS:
        raise h.error(f"tensor {name}: {n_dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
    h.need(8 * n_dims, what)
    ne = struct.unpack_from(f"<{n_dims}Q", h.buf, h.pos)
    h.pos += 8 * n_dims
    ggml_type = h.unpack(_U32, what)
    relative = h.unpack(_U64, what)
    return name, tuple(reversed(ne)), ggml_type, relative


def _tensor(h, name, shape, ggml_type, relative, data_start, alignment) -> TensorInfo:
    kind = GGML_TYPES.get(ggml_type)
    if kind is None:
        supported = ", ".join(t.name for t in GGML_TYPES.values())
        what = "an unknown ggml type" if ggml_type not in GGML_TYPE_NAMES else "ggml type"
        raise h.error(
            f"tensor {name}: {what} {ggml_type} ({type_name(ggml_type)}) is not supported "
            f"(supported: {supported})"
        )
    if shape[-1] % kind.block_elements:
        raise h.error(
            f"tensor {name}: rows of {shape[-1]} elements are not a whole number of {kind.name} blocks "
            f"({kind.block_elements} elements each)"
        )
    if relative % alignment:
        raise h.error(
            f"tensor {name}: data offset {relative} is not a multiple of the alignment {alignment}"
        )
    nbytes = prod(shape) // kind.block_elements * kind.block_bytes
    offset = data_start + relative
    if offset + nbytes > h.size:
        raise h.error(
            f"tensor {name}: data ends at byte {offset + nbytes}, past the end of the file "
            f"({h.size} bytes): the file is truncated"
        )
    return TensorInfo(name, shape, ggml_type, offset, nbytes, h.path)


def _check_no_overlap(h: _Header, tensors) -> None:
    previous = None
    for t in sorted(tensors, key=lambda t: (t.offset, t.nbytes)):
        if previous is not None and t.offset < previous.offset + previous.nbytes:
            raise h.error(
                f"tensor {t.name} (bytes {t.offset}..{t.offset + t.nbytes}) overlaps tensor {previous.name} "
                f"(bytes {previous.offset}..{previous.offset + previous.nbytes})"
            )
        if previous is None or t.offset + t.nbytes > previous.offset + previous.nbytes:
            previous = t
