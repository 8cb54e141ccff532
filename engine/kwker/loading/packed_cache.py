"""The packed-weights cache: the second load of a model file at a precision maps nothing and
quantizes nothing, it reads the native step's packed panels back from one file.

An entry is one file, `<cache>/packed/<name>-<precision>-<key>.kwk`:

    b"KWKPACK\\0"  uint64 header length  header (JSON)  padding  data ...

The header holds the entry's key (what it was built from, below), and for every weight its native
name, format, shape, and where its bytes are. Matrices' packed panels are 4096-byte aligned, so that
they read straight into the step's weight space (`Model.set_matrix_packed`), norms and biases are
float32. The data's BLAKE2b digest is in the header and is checked on every read.

The key covers the source files (path, size, modification time), the precision and KV options that
shape the packing, the model's configuration, and the native module itself (its file's size and
time: a rebuilt module may pack differently). An entry whose key, version, size or digest does not
match is removed and rebuilt, never trusted. Entries are written to a temporary file and renamed,
so a crash or a full disk leaves no half-written entry.

The header also names the entry's lineage: the model's files and the precision, without what
changes between versions of one entry (the files' size and time, the native module, kwker's
version). Writing an entry removes the other entries of its lineage, which no load will ask for
again: else every kwker update, and every edit of a model file, would leave a copy of the packed
model behind (1-7 GB for the 1.5B-class models).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kwker import _native

MAGIC = b"KWKPACK\0"
VERSION = 1
ALIGN = 4096


class StaleEntry(Exception):
    """A cache entry that cannot be used (and has been removed)."""


@dataclass
class Weight:
    """One weight as the native step took it."""

    name: str  # the native name: embed, layers.3.q, layers.3.attn_norm, ...
    kind: str  # "matrix" or "norm"
    values: np.ndarray | None = None  # a norm's float32 values
    wtype: str | None = None  # a matrix's format (a kwker._native.WType name)
    shape: tuple[int, int] | None = None
    bias: np.ndarray | None = None  # a matrix's float32 bias


@dataclass
class Recording:
    """What a load set on the step, in order: enough to set it again without the source."""

    weights: list[Weight] = field(default_factory=list)

    def matrix(self, name, wtype, shape, bias):
        self.weights.append(Weight(name, "matrix", wtype=wtype, shape=tuple(shape), bias=bias))

    def norm(self, name, values):
        self.weights.append(Weight(name, "norm", values=values))


@functools.cache
def native_identity() -> str:
    """The native module's bytes, as a digest (~10 ms, once a process): its packing is what an entry
    holds. Not its modification time: an installer's copy of the same build has another."""
    with open(_native.__file__, "rb") as f:
        return hashlib.file_digest(f, "blake2b").hexdigest()[:24]


def _digest(desc: dict) -> str:
    return hashlib.blake2b(json.dumps(desc, sort_keys=True).encode(), digest_size=12).hexdigest()


def entry_key(description: dict) -> str:
    """The key of what an entry was built from (`description`: JSON-able, see the module doc)."""
    return _digest({**description, "native": native_identity(), "version": VERSION})


def lineage_key(files: list, precision: str) -> str:
    """The lineage of an entry (see the module doc): `files` names the model's files."""
    return _digest({"files": files, "precision": precision})


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def write_entry(path: Path, key: str, step, recording: Recording, lineage: str = "") -> None:
    """Writes the packed weights of `step` (as `recording` lists them) to `path`, whole or not at
    all, then removes the other entries of its lineage (see the module doc; "": none). Raises
    OSError (a full disk, a read-only cache) after removing the partial file."""
    entries, blobs, offset = [], [], 0

    def place(blob: np.ndarray) -> int:
        nonlocal offset
        start = offset = _aligned(offset)
        blobs.append((start, blob))
        offset += blob.nbytes
        return start

    for w in recording.weights:
        if w.kind == "norm":
            entries.append(
                {"name": w.name, "kind": "norm", "at": place(w.values), "n": w.values.size}
            )
            continue
        packed = step.packed(w.name)
        e = {"name": w.name, "kind": "matrix", "wtype": w.wtype, "shape": list(w.shape)}
        if w.bias is not None:  # before the panels: the digest takes the blobs in the order
            e["bias"] = place(w.bias)  # _read reads them, and it needs the bias first
        e["at"], e["bytes"] = place(packed), packed.nbytes
        entries.append(e)
    digest = hashlib.blake2b(digest_size=16)
    for _, blob in blobs:
        digest.update(memoryview(blob).cast("B"))
    header = json.dumps(
        {
            "version": VERSION,
            "key": key,
            "lineage": lineage,
            "data_bytes": offset,
            "digest": digest.hexdigest(),
            "weights": entries,
        }  # fmt: skip
    ).encode()
    data_start = _aligned(len(MAGIC) + 8 + len(header))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(MAGIC + len(header).to_bytes(8, "little") + header)
            for start, blob in blobs:
                f.seek(data_start + start)
                f.write(memoryview(blob).cast("B"))
            f.truncate(data_start + offset)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    if lineage:
        for other in path.parent.glob("*.kwk"):
            if other != path and _header(other).get("lineage") == lineage:
                other.unlink(missing_ok=True)


def _header(path: Path) -> dict:
    """An entry's header ({} for a file that is not a readable entry)."""
    try:
        with open(path, "rb") as f:
            return _read_header(f, path, path.stat().st_size)[0]
    except (StaleEntry, OSError, ValueError):
        return {}


def _read_header(f, path: Path, size: int) -> tuple[dict, int]:
    """(the header, its length) of the entry open as f, `size` bytes long."""
    head = f.read(len(MAGIC) + 8)
    if head[: len(MAGIC)] != MAGIC:
        raise StaleEntry(f"{path}: not a packed-weights file")
    n = int.from_bytes(head[len(MAGIC) :], "little")
    if n > size:
        raise StaleEntry(f"{path}: header runs past the end of the file")
    return json.loads(f.read(n)), n


def read_entry(path: Path, key: str, step) -> Recording:
    """Sets every weight of `step` from the entry at `path`; returns what it set. Raises
    StaleEntry (after removing the entry) when the entry does not match `key` or is damaged; the
    step is then incomplete and must be discarded."""
    try:
        return _read(path, key, step)
    except StaleEntry:
        path.unlink(missing_ok=True)
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        path.unlink(missing_ok=True)
        raise StaleEntry(f"{path}: unreadable ({e})") from None


def _read(path: Path, key: str, step) -> Recording:
    size = path.stat().st_size
    recording = Recording()
    with open(path, "rb", buffering=0) as f:
        header, n = _read_header(f, path, size)
        if header.get("version") != VERSION or header.get("key") != key:
            raise StaleEntry(f"{path}: built from another source, precision or kwker version")
        data_start = _aligned(len(MAGIC) + 8 + n)
        if data_start + header["data_bytes"] != size:
            raise StaleEntry(
                f"{path}: {size} bytes, the header describes {data_start + header['data_bytes']}"
            )
        digest = hashlib.blake2b(digest_size=16)

        def read_into(at: int, view: np.ndarray) -> None:
            f.seek(data_start + at)
            mv = memoryview(view).cast("B")
            if f.readinto(mv) != mv.nbytes:
                raise StaleEntry(f"{path}: truncated")
            digest.update(mv)

        for e in header["weights"]:
            if e["kind"] == "norm":
                values = np.empty(e["n"], np.float32)
                read_into(e["at"], values)
                step.set_norm(e["name"], values)
                recording.norm(e["name"], values)
                continue
            bias = None
            if "bias" in e:
                bias = np.empty(e["shape"][0], np.float32)
                read_into(e["bias"], bias)
            # the room is allocated first (with the bias); the panels are read straight into it
            room = step.set_matrix_packed(
                e["name"], getattr(_native.WType, e["wtype"]), *e["shape"], bias=bias
            )
            if room.nbytes != e["bytes"]:
                raise StaleEntry(f"{path}: {e['name']} has another packed size in this kwker")
            read_into(e["at"], room)
            recording.matrix(e["name"], e["wtype"], e["shape"], bias)
        if digest.hexdigest() != header["digest"]:
            raise StaleEntry(f"{path}: checksum mismatch (the file is damaged)")
    return recording
