"""A large file's transfer that survives a cancel, a dropped connection or a killed process: the
bytes go to `blobs/<sha256>.resume` in the repo's HF cache folder, a later call asks for the rest
with a Range request, and only a whole file whose sha256 is the Hub's becomes the blob
`blobs/<sha256>`, which huggingface_hub's `hf_hub_download` then links into the snapshot as it
links any blob it finds (kwker.models.hub).

huggingface_hub 2 deletes its temporary file on any failure, so a cancelled 5 GB GGUF would start
over from its first byte. This keeps the partial file instead. It is written only under
kwker.models.hub's lock for that file; where file locks do not work and two processes append to
one partial file, the sha256 check catches the mix, and the file is fetched again from the start.
Nothing unchecked ever takes the blob's name.
"""

from __future__ import annotations

import os
import re
from pathlib import Path


def partial_path(blobs: Path, sha256: str) -> Path:
    return blobs / f"{sha256}.resume"


def fetch_blob(url: str, headers: dict, blobs: Path, f, tally, retrying, check) -> str | None:
    """Fetches the LFS file f (a kwker.models.hub.RepoFile with its sha256) from url into
    blobs/<sha256>, resuming a partial file, retried by `retrying` (kwker.models.hub's
    _retrying) while it fails in a way that may pass, and checked by `check` (hub's _mismatch:
    size and sha256). Returns None when the blob is in place and checked, or what was wrong with
    the bytes (the partial file is then deleted)."""
    blobs.mkdir(parents=True, exist_ok=True)
    blob, partial = blobs / f.sha256, partial_path(blobs, f.sha256)
    if blob.exists():
        return "was there before"  # a blob of another download: the caller hashes it
    retrying(lambda: _transfer(url, headers, partial, f.size, tally), tally.check)
    wrong = check(partial, f)
    if wrong is not None:
        partial.unlink(missing_ok=True)
        return wrong
    os.replace(partial, blob)
    return None


def _transfer(url: str, headers: dict, partial: Path, size: int, tally) -> None:
    """Appends the bytes after partial's to it (all of them when it is missing): one request."""
    from huggingface_hub.utils import get_session, hf_raise_for_status

    have = partial.stat().st_size if partial.exists() else 0
    if have > size:  # not this file's start: begin again
        partial.unlink()
        have = 0
    tally.resume_at(have)
    if have == size:
        return
    ask = {**headers, "Range": f"bytes={have}-"} if have else dict(headers)
    # httpx drops the Authorization header on a redirect to another host (the Hub's CDN)
    with get_session().stream("GET", url, headers=ask, follow_redirects=True, timeout=30) as r:
        hf_raise_for_status(r)
        start = _range_start(r.headers.get("Content-Range")) if r.status_code == 206 else 0
        if start != have:  # the server sent the whole file, or another range: take it from 0
            have = 0
            tally.resume_at(0)
        with open(partial, "r+b" if partial.exists() else "wb") as out:
            out.seek(have)
            out.truncate()
            for piece in r.iter_bytes():  # as they arrive: a cut loses none of them
                out.write(piece)
                tally.add(len(piece))  # raises Cancelled: what was written stays
    got = partial.stat().st_size
    if got < size:  # the connection closed early: the next try resumes
        raise ConnectionError(f"the transfer stopped at byte {got} of {size}")


def _range_start(content_range: str | None) -> int | None:
    m = re.match(r"bytes (\d+)-", content_range or "")
    return int(m.group(1)) if m else None
