"""A repo's file as the Hub lists it (RepoFile), and the checks of that file on disk: its exact
size and its hash (mismatch), and the partial files that killed downloads of it left behind
(sweep_partials). kwker.models.hub checks each file it fetches with them, and passes mismatch
to kwker.models.resumable."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import NamedTuple

CHUNK = 1 << 20  # bytes read at a time when hashing a file


class RepoFile(NamedTuple):
    name: str
    size: int
    sha256: str | None  # an LFS file's
    blob_id: str | None  # its git blob id: sha1 of b"blob <size>\0" + its bytes


# A transfer writes its file every second or so: one untouched this long belongs to a dead process
STALE_PARTIAL_S = 3600.0


def sweep_partials(blobs: Path, commit: str, f: RepoFile) -> None:
    """Deletes what killed downloads of f left behind: huggingface_hub's temporary files
    (<etag>.<8 hex digits>.incomplete, which a kill -9 leaves) untouched for STALE_PARTIAL_S, and
    the files Kwker's downloader before huggingface_hub kept to resume (<sha256>.incomplete,
    <commit>-<name>.incomplete), which nothing writes any more. Called under f's lock: no Kwker
    download of f is writing them."""
    etag = f.sha256 or f.blob_id  # the Hub's ETag, which huggingface_hub names the blob after
    for path in blobs.glob(f"{etag}.*.incomplete") if etag else []:
        try:
            if time.time() - path.stat().st_mtime > STALE_PARTIAL_S:
                path.unlink()
        except FileNotFoundError:  # its own process finished or removed it meanwhile
            pass
    (blobs / f"{commit}-{f.name}.incomplete").unlink(missing_ok=True)
    if f.sha256:
        (blobs / f"{f.sha256}.incomplete").unlink(missing_ok=True)


def mismatch(path: Path, f: RepoFile, size_only: bool = False) -> str | None:
    """What is wrong with the file at path, or None: its size must be the Hub's exactly, and its
    hash the Hub's (the sha256 of an LFS file, the git blob id of any other)."""
    have = path.stat().st_size
    if have != f.size:
        return f"has {have} bytes where the Hub lists {f.size}"
    if size_only:
        return None
    if f.sha256:
        if _digest(path, hashlib.sha256()) != f.sha256:
            return "does not match its sha256"
    elif f.blob_id:  # git hashes the size, then the bytes
        blob = hashlib.sha1(b"blob %d\0" % f.size, usedforsecurity=False)
        if _digest(path, blob) != f.blob_id:
            return "does not match its git blob id"
    # (the Hub's file list always gives one of the two; without either, the size was checked)
    return None


def _digest(path: Path, h) -> str:
    with open(path, "rb") as file:
        while block := file.read(CHUNK):
            h.update(block)
    return h.hexdigest()
