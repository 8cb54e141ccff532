"""The Hub downloads under the faults of issue 45, against the hub look-alike (hub_server.py): the
token never follows a redirect to another host, two downloads of one repo at once both work, an
empty file downloads, a non-LFS file resumed from the wrong byte is caught by its git blob id and
fetched again, and HTTP 429, 500 and 503 are retried. Each test checks the bytes in the cache and
that no partial file is left behind."""

import hashlib
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import hub_server
import huggingface_hub.constants as hf_constants
import pytest

from kwker.models import hub

REPO = "tiny/faults"
PIECE = 1 << 16  # huggingface_hub's read size here (10 MB by default): small files come in pieces


@pytest.fixture
def hubsrv(tmp_path, monkeypatch):
    """A repo of plain bytes (no model is loaded here): LFS weights, a config.json big enough to be
    cut in the middle (a non-LFS file), a small JSON file and an empty one."""
    folder = tmp_path / "repo"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(os.urandom(1_500_000))
    padding = hashlib.sha256(b"kwker").hexdigest() * 6_000  # ~380 kB of text
    (folder / "config.json").write_text(f'{{"model_type": "llama", "note": "{padding}"}}')
    (folder / "generation_config.json").write_text('{"do_sample": false}')
    (folder / "empty.txt").write_bytes(b"")
    state = hub_server.HubState({REPO: folder})
    server, url = hub_server.start(state)
    cache = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", PIECE)
    monkeypatch.setattr(hub, "RETRY_WAITS_S", (0.05,) * len(hub.RETRY_WAITS_S))
    yield state, url, folder, cache
    server.shutdown()


def same_files(snapshot, folder) -> bool:
    names = sorted(p.name for p in folder.iterdir())
    return sorted(p.name for p in snapshot.iterdir()) == names and all(
        (snapshot / n).read_bytes() == (folder / n).read_bytes() for n in names
    )


def nothing_left_behind(cache) -> bool:
    return list(cache.rglob("*.incomplete")) == []


def test_a_redirect_to_another_host_never_carries_the_token(hubsrv, monkeypatch):
    """The Hub sends LFS files to a CDN under another name: the token goes to the Hub
    (127.0.0.1), never to the CDN (localhost), where the urllib loop of before sent it too."""
    state, _, folder, cache = hubsrv
    state.gated[REPO] = "hf_secret"
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    snap = hub.download(REPO)
    assert same_files(snap, folder) and nothing_left_behind(cache)
    resolved = state.seen("HEAD", f"/{REPO}/resolve/")
    assert resolved and all(auth == "Bearer hf_secret" for _, _, _, auth in resolved)
    cdn = state.seen("GET", "/cdn/")
    assert [path for _, path, _, _ in cdn] == [f"/cdn/{REPO}/model.safetensors"]
    assert all(host.startswith("localhost:") and auth is None for _, _, host, auth in cdn)


def start_in_the_weights(state, start):
    """start()s a download and returns once it is receiving the weights, which are sent slowly
    until let_the_weights_go: a second download started meanwhile overlaps it, however slowly
    its process starts."""
    state.delay_per_chunk = 0.05
    start()
    deadline = time.monotonic() + 120
    while not state.served.get("model.safetensors") and time.monotonic() < deadline:
        time.sleep(0.02)


def let_the_weights_go(state):
    """Once the second download has asked for the repo's files, and had time to reach the
    weights' lock, the weights go at full speed."""
    deadline = time.monotonic() + 120
    while len(state.seen("GET", f"/api/models/{REPO}")) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.5)
    state.delay_per_chunk = 0.0


def test_two_downloads_of_one_repo_at_once_both_work(hubsrv):
    """Two `kwker models download` processes, the second started while the first is in the
    weights: both end with the same files, and the weights were sent once (the second waited on
    the file's lock, then found it done)."""
    state, url, folder, cache = hubsrv
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(cache)}
    command = [sys.executable, "-m", "kwker.cli", "models", "download", REPO]
    procs = []

    def start():
        procs.append(
            subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        )

    start_in_the_weights(state, start)
    assert procs[0].poll() is None, procs[0].communicate()  # still in the weights
    start()
    let_the_weights_go(state)
    outs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err.decode() for _, err in outs]
    snapshots = {out.decode().strip().splitlines()[-1] for out, _ in outs}
    assert len(snapshots) == 1
    assert same_files(Path(snapshots.pop()), folder) and nothing_left_behind(cache)
    assert state.served["model.safetensors"] == (folder / "model.safetensors").stat().st_size


def test_two_downloads_in_one_process_both_work(hubsrv):
    """The same from two threads (the app's download beside a `kwker` call in one process)."""
    state, _, folder, cache = hubsrv
    results, errors = [], []

    def run():
        try:
            results.append(hub.download(REPO))
        except Exception as e:  # noqa: BLE001  (reported by the assert below)
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(2)]
    start_in_the_weights(state, threads[0].start)
    threads[1].start()
    let_the_weights_go(state)
    for t in threads:
        t.join(120)
    assert errors == [] and len(results) == 2 and results[0] == results[1]
    assert same_files(results[0], folder) and nothing_left_behind(cache)
    assert state.served["model.safetensors"] == (folder / "model.safetensors").stat().st_size


def test_an_empty_file_downloads(hubsrv):
    state, _, folder, cache = hubsrv
    seen = []
    snap = hub.download(REPO, progress=seen.append)
    assert (snap / "empty.txt").is_file() and (snap / "empty.txt").read_bytes() == b""
    assert same_files(snap, folder) and nothing_left_behind(cache)
    assert seen[-1].done == seen[-1].total == sum(f.stat().st_size for f in folder.iterdir())


def test_a_non_lfs_file_resumed_from_the_wrong_byte_is_caught_and_fetched_again(hubsrv):
    """config.json is cut, and the resume is answered 206 with the file's first bytes (right
    length, wrong content): its git blob id catches it, and it is fetched again whole."""
    state, _, folder, cache = hubsrv
    state.cut_after["config.json"] = PIECE
    state.wrong_resume.add("config.json")
    snap = hub.download(REPO)
    assert [b for name, b in state.starts if name == "config.json"] == [0, PIECE, 0]
    assert (snap / "config.json").read_bytes() == (folder / "config.json").read_bytes()
    assert same_files(snap, folder) and nothing_left_behind(cache)


def test_a_file_that_stays_wrong_is_an_error_and_is_not_kept(hubsrv):
    state, _, folder, cache = hubsrv
    state.corrupt_always.add("config.json")
    with pytest.raises(hub.DownloadError, match="config.json of tiny/faults does not match"):
        hub.download(REPO)
    assert [b for name, b in state.starts if name == "config.json"] == [0, 0]
    assert not list(cache.rglob("config.json")) and nothing_left_behind(cache)


@pytest.mark.parametrize("status", [429, 500, 503])
def test_an_http_error_then_success_is_retried(hubsrv, status):
    state, _, folder, cache = hubsrv
    state.faults["model.safetensors"] = [status]
    state.faults["config.json"] = [status, status]
    state.faults["api"] = [status]
    snap = hub.download(REPO)
    assert same_files(snap, folder) and nothing_left_behind(cache)
    assert len(state.seen("GET", f"/cdn/{REPO}/model.safetensors")) == 2
    assert len(state.seen("GET", f"/{REPO}/resolve/{hub_server.COMMIT}/config.json")) == 3
    assert len(state.seen("GET", f"/api/models/{REPO}")) == 2


def test_429_500_and_503_in_a_row_then_success(hubsrv):
    state, _, folder, cache = hubsrv
    state.faults["model.safetensors"] = [429, 500, 503]
    snap = hub.download(REPO)
    assert same_files(snap, folder) and nothing_left_behind(cache)
    assert len(state.seen("GET", f"/cdn/{REPO}/model.safetensors")) == 4


def test_an_error_that_lasts_is_a_clear_error(hubsrv):
    state, _, _, cache = hubsrv
    state.faults["model.safetensors"] = [503] * 10
    with pytest.raises(
        hub.DownloadError, match="model.safetensors of tiny/faults failed: HTTP 503"
    ):
        hub.download(REPO)
    assert len(state.seen("GET", "/cdn/")) == 1 + len(hub.RETRY_WAITS_S)
    assert nothing_left_behind(cache) and not list(cache.rglob("model.safetensors"))


def test_a_cancel_cuts_a_retry_wait_short(hubsrv, monkeypatch):
    """cancel may be any callable; a cancel during the backoff is said at once."""
    state, _, _, _ = hubsrv
    monkeypatch.setattr(hub, "RETRY_WAITS_S", (60.0,))
    state.faults["model.safetensors"] = [503]
    began = time.monotonic()
    with pytest.raises(hub.Cancelled):
        hub.download(REPO, cancel=lambda: len(state.seen("GET", "/cdn/")) > 0)
    assert time.monotonic() - began < 10


def test_partial_files_of_killed_downloads_are_swept(hubsrv):
    """What killed downloads leave in blobs/ is deleted: huggingface_hub's temporary files once
    untouched for an hour (a kill -9 skips its clean-up) and the resumable files of the downloader
    before it; a recent temporary file may be another process's transfer, and is left to it."""
    state, _, folder, cache = hubsrv
    blobs = cache / "models--tiny--faults" / "blobs"
    blobs.mkdir(parents=True)
    weights = hashlib.sha256((folder / "model.safetensors").read_bytes()).hexdigest()
    config = hub_server.git_blob_id((folder / "config.json").read_bytes())
    dead = [
        blobs / f"{weights}.0badc0de.incomplete",
        blobs / f"{weights}.incomplete",
        blobs / f"{hub_server.COMMIT}-config.json.incomplete",
    ]
    live = blobs / f"{config}.feedf00d.incomplete"
    for path in [*dead, live]:
        path.write_bytes(b"partial")
    hour_ago = time.time() - hub.STALE_PARTIAL_S - 60
    os.utime(dead[0], (hour_ago, hour_ago))
    snap = hub.download(REPO)
    assert same_files(snap, folder)
    assert sorted(blobs.glob("*.incomplete")) == [live]
