"""Downloads from the Hugging Face Hub into the standard HF cache, through huggingface_hub's
`hf_hub_download`: a lock per file, the cache's layout (blobs linked into snapshots), redirects
that leave the Hub without the token, 408 and 429 answers retried. Around it, what it leaves to
us:

* the weights (LFS files) are fetched by kwker.models.resumable: a cancel, a dropped connection,
  a full disk or a killed process keeps the bytes received, and the next call asks for the rest
  (huggingface_hub 2 deletes its partial file on any failure, so a 5 GB GGUF would start over);
  hf_hub_download then finds the checked blob and links it, and fetches the small files itself;
* each file fetched is checked against the Hub's file list: its exact size, and its hash (the
  sha256 of an LFS file, the git blob id of any other); one that differs is fetched once more;
* HTTP 5xx answers (and 408/429 ones from the API) are retried, after each of RETRY_WAITS_S;
* progress in bytes over the whole repo (speed, ETA), cancel from another thread, and clear
  errors for a full disk, a gated repo and an unreachable Hub.

Metadata, search, the cache layout and listing/deleting cached repos stay with huggingface_hub.

A file's checks are kwker.models.hub_files, the progress kwker.models.hub_progress and the errors
kwker.models.hub_errors; their names are importable from here too.
"""

from __future__ import annotations

import errno
import os
import threading
import time
from collections.abc import Callable
from fnmatch import fnmatch
from pathlib import Path
from typing import NamedTuple

from kwker.models import resumable
from kwker.models.hub_errors import (
    Cancelled,
    DiskFullError,
    DownloadError,
    GatedRepoError,
    GgufRepo,
    Offline,
)
from kwker.models.hub_files import CHUNK, STALE_PARTIAL_S, RepoFile, mismatch, sweep_partials
from kwker.models.hub_progress import Progress, Tally

__all__ = [
    "CHUNK",
    "OFFLINE_PROBE_S",
    "RETRY_STATUSES",
    "RETRY_WAITS_S",
    "STALE_PARTIAL_S",
    "WANTED",
    "Cancelled",
    "DiskFullError",
    "DownloadError",
    "GatedRepoError",
    "GgufRepo",
    "Hit",
    "Offline",
    "Progress",
    "RepoFile",
    "cached_models",
    "check_reachable",
    "config",
    "download",
    "listing",
    "model_files",
    "remove",
    "search",
]

WANTED = ["*.json", "*.safetensors", "tokenizer.model", "*.txt", "*.jinja", "*.tiktoken"]

# Answers the Hub may not give a moment later: a timeout, a rate limit, an overload, a restart
RETRY_STATUSES = (408, 429, 500, 502, 503, 504)
RETRY_WAITS_S = (1.0, 2.0, 4.0, 8.0, 16.0)  # before each retry; the tests shorten them


def _endpoint() -> str:
    from huggingface_hub import constants

    return os.environ.get("HF_ENDPOINT", constants.ENDPOINT).rstrip("/")


OFFLINE_PROBE_S = 2.0  # how long a Hub call waits to learn that there is no connection


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


def _transient(e: BaseException) -> bool:
    """Whether trying again may help: an answer in RETRY_STATUSES, or a connection that failed,
    timed out or dropped (huggingface_hub 2's client is httpx2, 1's is httpx)."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(e, HfHubHTTPError):
        return getattr(getattr(e, "response", None), "status_code", None) in RETRY_STATUSES
    try:
        from httpx2 import TransportError
    except ImportError:
        from httpx import TransportError
    return isinstance(e, (TransportError, ConnectionError, TimeoutError))


def _retrying(call: Callable, check: Callable[[], None] = lambda: None):
    """call(), tried again after each of RETRY_WAITS_S while it fails in a way that may pass
    (_transient). huggingface_hub retries a download's 408 and 429 and its dropped connections,
    but not its 5xx, and nothing of the API. check() is called during the waits: it raises
    Cancelled when the download is cancelled."""
    for wait in RETRY_WAITS_S:
        try:
            return call()
        except Exception as e:  # noqa: BLE001  (sorted by _transient; the others are raised)
            if not _transient(e):
                raise
        deadline = time.monotonic() + wait
        while (left := deadline - time.monotonic()) > 0:
            check()
            time.sleep(min(left, 0.1))
    return call()  # the last try: its error is the one raised


def listing(
    repo_id: str, revision: str | None = None, token: str | None = None
) -> tuple[str, list[RepoFile]]:
    """(commit sha, [RepoFile]) of every file in repo_id at revision, from the Hub's model info;
    DownloadError saying why not (gated, unknown, unreachable)."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError as HfGated
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    check_reachable()
    try:
        info = _retrying(
            lambda: HfApi(endpoint=_endpoint()).model_info(
                repo_id, revision=revision, files_metadata=True, token=_token(token)
            )
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
        size = s.size if s.size is not None else (s.lfs.size if s.lfs else 0)
        files.append(RepoFile(s.rfilename, size, s.lfs.sha256 if s.lfs else None, s.blob_id))
    return info.sha, files


def model_files(repo_id: str, files: list[RepoFile]) -> list[RepoFile]:
    """The files of a safetensors model among a repo's: weights, config and tokenizer at its top
    level; never pickled .bin files or code. A repo of GGUF files alone is a GgufRepo's
    (kwker.models.gguf_repo): its error says so."""
    wanted = [f for f in files if any(fnmatch(f.name, p) for p in WANTED) and "/" not in f.name]
    if not any(f.name.endswith(".safetensors") for f in wanted):
        if any(f.name.endswith(".gguf") for f in files):
            raise GgufRepo(f"{repo_id} holds GGUF files: name one of its quants as {repo_id}:QUANT")
        raise DownloadError(
            f"{repo_id} has no safetensors weights (pickled .bin files are never downloaded)"
        )
    return wanted


def download(
    repo_id: str,
    revision: str | None = None,
    token: str | None = None,
    progress: Callable[[Progress], object] | None = None,
    cancel: threading.Event | Callable[[], bool] | None = None,
    select: Callable[[list[RepoFile]], list[RepoFile]] | None = None,
) -> Path:
    """Downloads (or completes) repo_id into the HF cache and returns its snapshot folder.
    progress gets a Progress as bytes arrive and after each file; cancel (an Event, or a callable
    that says True) stops the download with Cancelled, from another thread. select: which of the
    repo's files to fetch (default: a safetensors model's, model_files)."""
    if cancel is None:
        cancelled = lambda: False  # noqa: E731
    else:
        cancelled = cancel.is_set if isinstance(cancel, threading.Event) else cancel
    token = _token(token)
    commit, files = listing(repo_id, revision, token)
    files = select(files) if select else model_files(repo_id, files)
    tally = Tally(repo_id, sum(f.size for f in files), progress, cancelled)
    for f in files:
        tally.begin(f)
        try:
            _fetch_checked(repo_id, commit, f, token, tally)
        except DownloadError:  # Kwker's own: Cancelled, a file that stays wrong
            raise
        except Exception as e:  # noqa: BLE001  (huggingface_hub's and the OS's, said as Kwker's)
            said = _said(e, repo_id, f)
            if said is None:  # not a download's error: a bug, shown as it is
                raise
            raise said from e
        tally.end()
    root = _repo_dir(repo_id)
    if (revision or "main") != commit:  # a branch or tag names the commit, as the HF cache does
        (root / "refs").mkdir(exist_ok=True)
        (root / "refs" / (revision or "main")).write_text(commit)
    return root / "snapshots" / commit


def _fetch_checked(repo_id: str, commit: str, f: RepoFile, token: str | None, tally: Tally) -> None:
    """f of commit into the repo's snapshot through hf_hub_download, checked (mismatch): a file
    fetched now for its size and hash, one found in the snapshot for its size (it was checked
    when it came). A file that differs is deleted and fetched once more.

    Kwker's own lock per file, around huggingface_hub's, covers the check too: another download
    of the same file waits until it is checked (or deleted), never using it before."""
    from huggingface_hub import constants, hf_hub_download, hf_hub_url
    from huggingface_hub.file_download import repo_folder_name
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    def fetch() -> Path:
        return Path(
            hf_hub_download(
                repo_id,
                f.name,
                revision=commit,
                token=token,
                endpoint=_endpoint(),
                library_name="kwker",
                tqdm_class=tally.bar_class,
            )
        )

    locks = Path(constants.HF_HUB_CACHE) / ".locks"
    locks = locks / repo_folder_name(repo_id=repo_id, repo_type="model")
    locks.mkdir(parents=True, exist_ok=True)
    pointer = _repo_dir(repo_id) / "snapshots" / commit / f.name
    blobs = _repo_dir(repo_id) / "blobs"
    with WeakFileLock(locks / f"{f.sha256 or f.blob_id or f.name}.kwker.lock"):
        sweep_partials(blobs, commit, f)
        checked_before = pointer.exists()
        for _ in range(2):
            wrong = None
            if f.sha256 and not checked_before:  # an LFS file: a transfer that can resume
                url = hf_hub_url(repo_id, f.name, revision=commit, endpoint=_endpoint())
                headers = build_hf_headers(token=token, library_name="kwker")
                wrong = resumable.fetch_blob(url, headers, blobs, f, tally, _retrying, mismatch)
                checked_before = wrong is None  # a blob checked just now is not hashed again
            if wrong in (None, "was there before"):
                path = _retrying(fetch, tally.check)  # links the blob, or fetches a small file
                wrong = mismatch(path, f, size_only=checked_before)
                if wrong is None:
                    return
                path.resolve().unlink(missing_ok=True)  # the blob: never used under its name
                path.unlink(missing_ok=True)
            checked_before = False
            tally.restart()
    raise DownloadError(f"{f.name} of {repo_id} {wrong}, downloaded twice: try again later")


def _said(e: Exception, repo_id: str, f: RepoFile) -> DownloadError | None:
    """An error of hf_hub_download or of the disk as the DownloadError that says what to do, or
    None for any other exception."""
    from huggingface_hub.errors import GatedRepoError as HfGated
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{f.name} of {repo_id}"
    status = getattr(getattr(e, "response", None), "status_code", None)
    if isinstance(e, HfGated) or (
        isinstance(e, HfHubHTTPError)
        and status in (401, 403)
        and not isinstance(e, RepositoryNotFoundError)
    ):
        return GatedRepoError(f"{repo_id} needs a token with access ({where}: {e})")
    if isinstance(e, (RepositoryNotFoundError, RemoteEntryNotFoundError, RevisionNotFoundError)):
        return DownloadError(f"{where} is no longer on the Hub: {e}")
    if isinstance(e, LocalEntryNotFoundError):  # huggingface_hub's word for "no answer"
        return DownloadError(f"cannot reach the Hub at {_endpoint()} for {where}: {e}")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return DiskFullError(
            f"the disk is full while downloading {where} ({f.size} bytes); free space and run "
            f"it again (the files finished so far are kept)"
        )
    if isinstance(e, HfHubHTTPError):
        return DownloadError(f"downloading {where} failed: HTTP {status}: {e}")
    if _transient(e) or isinstance(e, OSError):  # the connection, or huggingface_hub's size check
        return DownloadError(f"downloading {where} failed: {e}")
    return None


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


class Hit(NamedTuple):
    id: str
    gguf: bool  # a repo of GGUF files (its "gguf" tag): its quants are chosen by name


def search(text: str, limit: int = 20) -> list[Hit]:
    from huggingface_hub import HfApi

    check_reachable()
    return [
        Hit(m.id, "gguf" in (m.tags or []))
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
