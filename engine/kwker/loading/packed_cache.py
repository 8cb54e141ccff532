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
match, or that fails to read in any other way, is stale: it is removed where it can be (not in a
read-only cache, nor in an installer's read-only folder) and the model is packed again, never
trusted. Entries are written to a temporary file and renamed, so a crash or a full disk leaves no
half-written entry; the temporary files of writes that were killed are swept (`sweep_debris`).

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
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kwker import _native

MAGIC = b"KWKPACK\0"
VERSION = 1
ALIGN = 4096
DEBRIS = ".*.partial"  # the names of a write's temporary files and folders (a leading dot: hidden)
# Debris older than this is removed (seconds). Not sooner: a write under way in another process
# (nine processes may pack one model at once) has a temporary file that looks just the same, and a
# large model's entry can take minutes to write and sync to a slow disk. Its modification time
# moves with every write, so only a write that was killed grows this old.
DEBRIS_AGE = 30 * 60


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
                _remove(other)


def sweep_debris(folder: Path, age: float = DEBRIS_AGE) -> None:
    """Removes the temporary files and folders (DEBRIS) in `folder` that are older than `age`
    seconds: what the writes of killed processes left (see DEBRIS_AGE for why not younger)."""
    try:
        found = list(folder.glob(DEBRIS))
    except OSError:
        return  # no folder yet, or one that cannot be listed: nothing to sweep
    now = time.time()
    for item in found:
        try:
            if now - item.lstat().st_mtime < age:
                continue
            if item.is_dir() and not item.is_symlink():
                shutil.rmtree(item)
            else:
                item.unlink()
        except OSError:
            pass  # a read-only cache, or another process swept it first


def _remove(path: Path) -> None:
    """Removes a stale or replaced entry where that can be done: a read-only cache keeps it (and
    every load skips it), which must not stop the model from loading."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


def _header(path: Path) -> dict:
    """An entry's header ({} for a file that is not a readable entry)."""
    try:
        with open(path, "rb") as f:
            header = _read_header(f, path, path.stat().st_size)[0]
    except Exception:  # whatever is wrong with it, it is not an entry to match
        return {}
    return header if isinstance(header, dict) else {}


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
    """Sets every weight of `step` from the entry at `path` and checks that the step is complete;
    returns what it set. Raises StaleEntry (after removing the entry where it can be) when the
    entry does not match `key` or cannot be read; the step is then incomplete and must be
    discarded."""
    try:
        return _read(path, key, step)
    except StaleEntry:
        _remove(path)
        raise
    except MemoryError:
        raise  # the machine is short of memory (every size was checked against the file's size)
    except Exception as e:
        # Anything else the reading raises means the entry is not one this kwker can read: one
        # flipped bit in its header is a format name the native module lacks (AttributeError), a
        # JSON list for an object, a shape the model refuses (the native ValueError), a weight
        # left unset (check_complete). Such an entry is packed again, never a failed load. (Ctrl+C
        # and the other BaseExceptions pass: they are not about the entry.)
        _remove(path)
        raise StaleEntry(f"{path}: unreadable ({type(e).__name__}: {e})") from None


def _read(path: Path, key: str, step) -> Recording:
    size = path.stat().st_size
    recording = Recording()
    with open(path, "rb", buffering=0) as f:
        header, n = _read_header(f, path, size)
        if header.get("version") != VERSION or header.get("key") != key:
            raise StaleEntry(f"{path}: built from another source, precision or kwker version")
        data_start = _aligned(len(MAGIC) + 8 + n)
        data_bytes = header["data_bytes"]
        if data_start + data_bytes != size:
            raise StaleEntry(
                f"{path}: {size} bytes, the header describes {data_start + data_bytes}"
            )
        digest = hashlib.blake2b(digest_size=16)

        def fits(at: int, count: int) -> int:
            """`count`, once `count` float32 values at `at` are known to lie inside the data: a
            lying header cannot size an allocation past the file's size."""
            if not (0 <= at and 0 <= count and at + 4 * count <= data_bytes):
                raise StaleEntry(f"{path}: a weight lies outside the data")
            return count

        def read_into(at: int, view: np.ndarray) -> None:
            f.seek(data_start + at)
            mv = memoryview(view).cast("B")
            if f.readinto(mv) != mv.nbytes:
                raise StaleEntry(f"{path}: truncated")
            digest.update(mv)

        for e in header["weights"]:
            if e["kind"] == "norm":
                values = np.empty(fits(e["at"], e["n"]), np.float32)
                read_into(e["at"], values)
                step.set_norm(e["name"], values)
                recording.norm(e["name"], values)
                continue
            bias = None
            if "bias" in e:
                bias = np.empty(fits(e["bias"], e["shape"][0]), np.float32)
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
    step.check_complete()  # an entry that leaves a weight unset is as stale as a damaged one
    return recording
