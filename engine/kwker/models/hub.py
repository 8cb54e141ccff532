"""Downloads from the Hugging Face Hub into the standard HF cache, with what huggingface_hub leaves to us:

* each LFS file is checked against the sha256 that `model_info` lists (a corrupted file is fetched again, never
  cached under its name);
* a cut transfer resumes where it stopped, across processes too, with Range requests into the same
  `blobs/<sha256>.incomplete` file;
* progress (bytes, speed, ETA), cancel from another thread, clear errors for disk full and gated repos.

Metadata, search, the cache layout and listing/deleting cached repos stay with huggingface_hub.
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from urllib.parse import quote

WANTED = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja", "*.tiktoken"]
CHUNK = 1 << 20


class DownloadError(RuntimeError):
    pass


class GatedRepoError(DownloadError):
    pass


class DiskFullError(DownloadError):
    pass


class Cancelled(DownloadError):
    pass


@dataclass
class Progress:
    file: str
    done: int  # bytes of all files, including those already on disk
    total: int
    speed: float  # bytes/s over this session
    eta_s: float | None


def _endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


OFFLINE_PROBE_S = 2.0  # how long a Hub call waits to learn that there is no connection


class Offline(DownloadError):
    """The Hub cannot be reached at all: said at once, not after the client's retries."""


def check_reachable() -> None:
    """Raises Offline within OFFLINE_PROBE_S when the Hub's host takes no connection (no
    network, no DNS, a firewall): huggingface_hub's client retries a dead connection for ~20 s
    before it says so, and the window waited on that."""
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(_endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname, port), timeout=OFFLINE_PROBE_S).close()
    except OSError as e:
        raise Offline(f"cannot reach the Hub at {_endpoint()}: no internet connection ({e})") from e


def _repo_dir(repo_id: str) -> Path:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type="model")


def _token(token: str | None) -> str | None:
    if token:
        return token
    from huggingface_hub import get_token

    return get_token()


def repo_files(repo_id: str, revision: str | None = None, token: str | None = None):
    """(commit sha, [(filename, size, sha256 or None)]) of the files a model needs: weights as safetensors, config
    and tokenizer; never pickled .bin files or code."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError as HfGated
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    check_reachable()
    try:
        info = HfApi(endpoint=_endpoint()).model_info(
            repo_id, revision=revision, files_metadata=True, token=_token(token)
        )
    except HfGated as e:
        raise GatedRepoError(
            f"{repo_id} is gated: accept its license on the Hub and give a token "
            f"(HF_TOKEN or `hf auth login`)"
        ) from e
    except RepositoryNotFoundError as e:
        raise DownloadError(
            f"{repo_id} was not found on the Hub (or it is private: give a token)"
        ) from e
    except HfHubHTTPError as e:
        raise DownloadError(f"the Hub refused {repo_id}: {e}") from e
    except Exception as e:  # noqa: BLE001  (the HTTP client's own errors: connection, timeout, TLS;
        # huggingface_hub 2's client (httpx2) raises ones that are not OSErrors)
        raise DownloadError(f"cannot reach the Hub at {_endpoint()}: {e}") from e
    files = []
    for s in info.siblings or []:
        if any(fnmatch(s.rfilename, p) for p in WANTED) and "/" not in s.rfilename:
            files.append(
                (
                    s.rfilename,
                    s.size or (s.lfs.size if s.lfs else 0),
                    s.lfs.sha256 if s.lfs else None,
                )
            )
    if not any(f[0].endswith(".safetensors") for f in files):
        raise DownloadError(
            f"{repo_id} has no safetensors weights (pickled .bin files are never downloaded)"
        )
    return info.sha, files


def download(
    repo_id: str,
    revision: str | None = None,
    token: str | None = None,
    progress=None,
    cancel: threading.Event | None = None,
) -> Path:
    """Downloads (or completes) repo_id into the HF cache and returns its snapshot folder."""
    commit, files = repo_files(repo_id, revision, token)
    root = _repo_dir(repo_id)
    (root / "blobs").mkdir(parents=True, exist_ok=True)
    snapshot = root / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    total = sum(size for _, size, _ in files)
    state = {"done": 0, "start": time.monotonic(), "fetched": 0}
    for name, size, sha in files:
        blob = root / "blobs" / (sha or f"{commit}-{name}")
        if not blob.exists():
            _fetch(repo_id, commit, name, size, sha, blob, token, state, total, progress, cancel)
        else:
            state["done"] += size
        link = snapshot / name
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(os.path.relpath(blob, snapshot))
    (root / "refs").mkdir(exist_ok=True)
    (root / "refs" / (revision or "main")).write_text(commit)
    return snapshot


def _fetch(repo_id, commit, name, size, sha, blob: Path, token, state, total, progress, cancel):
    partial = blob.with_name(blob.name + ".incomplete")
    for _attempt in range(2):  # a file whose hash is wrong is fetched once more, from scratch
        have = partial.stat().st_size if partial.exists() else 0
        if have > size:
            partial.unlink()
            have = 0
        state["done"] += have
        if have < size:
            _stream(
                repo_id, commit, name, size, partial, have, token, state, total, progress, cancel
            )
        if sha is None or _sha256(partial) == sha:
            partial.replace(blob)
            return
        state["done"] -= size
        partial.unlink()
    raise DownloadError(f"{name} of {repo_id} does not match its sha256 after a second download")


def _stream(
    repo_id, commit, name, size, partial: Path, have: int, token, state, total, progress, cancel
):
    url = f"{_endpoint()}/{repo_id}/resolve/{commit}/{quote(name)}"
    headers = {"User-Agent": "kwker"}
    if have:
        headers["Range"] = f"bytes={have}-"
    tok = _token(token)
    if tok:
        headers["Authorization"] = f"Bearer {tok}"
    retries = 0
    while True:
        try:
            with (
                urllib.request.urlopen(
                    urllib.request.Request(url, headers=headers), timeout=60
                ) as r,
                open(partial, "ab" if have else "wb") as out,
            ):
                if have and r.status != 206:  # the server ignored the range: start over
                    out.truncate(0)
                    state["done"] -= have
                    have = 0
                while block := r.read(CHUNK):
                    if cancel is not None and cancel.is_set():
                        raise Cancelled(f"download of {repo_id} cancelled; run it again to resume")
                    try:
                        out.write(block)
                        out.flush()
                    except OSError as e:
                        if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
                            raise DiskFullError(
                                f"the disk is full while downloading {name} of {repo_id} "
                                f"({size - have} more bytes needed); free space and run it "
                                f"again to resume"
                            ) from e
                        raise
                    have += len(block)
                    state["done"] += len(block)
                    state["fetched"] += len(block)
                    if progress:
                        elapsed = max(time.monotonic() - state["start"], 1e-6)
                        speed = state["fetched"] / elapsed
                        progress(
                            Progress(
                                name,
                                state["done"],
                                total,
                                speed,
                                (total - state["done"]) / speed if speed else None,
                            )
                        )
            if have >= size:
                return
            raise ConnectionError("the connection closed early")
        except urllib.error.HTTPError as e:
            if e.code in (401, 403):
                raise GatedRepoError(f"{repo_id} needs a token with access (HTTP {e.code})") from e
            raise DownloadError(f"downloading {name} of {repo_id} failed: HTTP {e.code}") from e
        except (ConnectionError, TimeoutError, urllib.error.URLError) as e:
            retries += 1  # network drop: retry from where the file stops
            if retries > 5:
                raise DownloadError(
                    f"downloading {name} of {repo_id} failed after {retries} tries: {e}"
                ) from e
            time.sleep(min(2.0**retries * 0.1, 5.0))
            headers["Range"] = f"bytes={have}-"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def config(repo_id: str, revision: str | None = None, token: str | None = None) -> dict:
    """A repo's config.json from the Hub, read into memory: never into the HF cache, where a repo
    holding its config alone would list as downloaded (cached_models) and resolve as a model."""
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = hf_hub_url(repo_id, "config.json", revision=revision, endpoint=_endpoint())
    check_reachable()
    try:
        r = get_session().get(
            url, headers=build_hf_headers(token=_token(token)), follow_redirects=True, timeout=30
        )
        hf_raise_for_status(r)
        return r.json()
    except Exception as e:  # noqa: BLE001  (network, HTTP, JSON: one message that names the repo)
        raise DownloadError(f"cannot read config.json of {repo_id} from {_endpoint()}: {e}") from e


def search(text: str, limit: int = 20) -> list[str]:
    from huggingface_hub import HfApi

    check_reachable()
    return [
        m.id
        for m in HfApi(endpoint=_endpoint()).list_models(
            search=text, limit=limit, pipeline_tag=None
        )
    ]


def cached_models() -> list[tuple[str, int, Path]]:
    """(repo id, bytes on disk, newest snapshot) of the models in the HF cache."""
    from huggingface_hub import constants, scan_cache_dir

    try:
        # the cache in force now (HF_HUB_CACHE may have moved)
        info = scan_cache_dir(constants.HF_HUB_CACHE)
    except Exception:  # noqa: BLE001  (no cache yet)
        return []
    out = []
    for repo in info.repos:
        if repo.repo_type == "model" and repo.revisions:
            newest = max(repo.revisions, key=lambda r: r.last_modified)
            out.append((repo.repo_id, repo.size_on_disk, Path(newest.snapshot_path)))
    return sorted(out)


def remove(repo_id: str) -> int:
    """Deletes a cached model; returns the bytes freed."""
    from huggingface_hub import constants, scan_cache_dir

    info = scan_cache_dir(constants.HF_HUB_CACHE)
    for repo in info.repos:
        if repo.repo_id == repo_id and repo.repo_type == "model":
            strategy = info.delete_revisions(*[r.commit_hash for r in repo.revisions])
            strategy.execute()
            return strategy.expected_freed_size
    raise DownloadError(f"{repo_id} is not in the Hugging Face cache")
