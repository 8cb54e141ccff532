"""Repos of GGUF files on the Hub (kwker.models.gguf_repo) against the hub look-alike: search
marks them, a repo's quants are listed with their sizes and a memory estimate read from their
header over range requests (not the whole file), OWNER/REPO:QUANT downloads one quant (without
a quant, Q4_K_M or the nearest), a split quant downloads as its parts and loads as one model, a
cancelled download resumes (the parts it finished and the bytes of the one it cut are kept), and
a repo without GGUF files says so."""

import os
import subprocess
import sys
import threading

import hub_server
import huggingface_hub.constants as hf_constants
import numpy as np
import pytest
import synthetic_gguf as sg

import kwker
from kwker.loading import memory
from kwker.loading.errors import BadModelFile
from kwker.loading.load import load_files
from kwker.models import gguf_repo, hub, loader

REPO, SPLIT_ONLY, README_ONLY = "tiny/Tiny-GGUF", "tiny/Split-GGUF", "tiny/readme"
PROMPT = [1, 2, 3, 4, 5]


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """Folders of three repos: several quants (one split in a folder of its own, a vision
    projector that is not a quant), a repo whose only quant is split, and a README alone."""
    root = tmp_path_factory.mktemp("gguf-repos")
    repo = root / "repo"
    repo.mkdir()
    for i, kind in enumerate(["Q4_K_M", "Q8_0", "F16"]):
        sg.write_gguf(repo / f"Tiny-{kind}.gguf", "tiny", kind, seed=i)
    (repo / "mmproj-Tiny-F16.gguf").write_bytes(b"GGUF not the model")
    single = sg.write_gguf(root / "Tiny-Q4_0.gguf", "tiny", "Q4_0", seed=7)
    (repo / "Tiny-Q4_0").mkdir()
    sg.split_gguf(single, repo / "Tiny-Q4_0" / "Tiny-Q4_0.gguf", max_tensors=8)
    (repo / "README.md").write_text("# Tiny\n")
    split_only = root / "split-only"
    split_only.mkdir()
    sg.split_gguf(single, split_only / "Tiny-IQ4_XS.gguf", max_tensors=8)  # named, not IQ4_XS
    readme = root / "readme"
    readme.mkdir()
    (readme / "README.md").write_text("# nothing here\n")
    return {REPO: repo, SPLIT_ONLY: split_only, README_ONLY: readme}, single


@pytest.fixture
def hubsrv(repos, tmp_path, monkeypatch):
    folders, single = repos
    state = hub_server.HubState(folders)
    server, url = hub_server.start(state)
    monkeypatch.setenv("HF_ENDPOINT", url)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # conftest keeps the tests offline
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(hf_constants, "DOWNLOAD_CHUNK_SIZE", 1 << 16)
    yield state, url, folders, single, tmp_path / "hf-cache"
    server.shutdown()


def test_search_marks_gguf_repos(hubsrv):
    hits = {h.id: h.gguf for h in hub.search("tiny")}
    assert hits == {REPO: True, SPLIT_ONLY: True, README_ONLY: False}


def test_the_quants_of_a_repo_with_their_sizes(hubsrv):
    _, _, folders, _, _ = hubsrv
    _, found = gguf_repo.list_quants(REPO)
    by_name = {q.name: q for q in found}
    assert sorted(by_name) == ["F16", "Q4_0", "Q4_K_M", "Q8_0"]  # no vision projector
    assert [q.size for q in found] == sorted(q.size for q in found)  # smallest first
    for kind in ("Q4_K_M", "Q8_0", "F16"):
        assert by_name[kind].size == (folders[REPO] / f"Tiny-{kind}.gguf").stat().st_size
    split = by_name["Q4_0"]
    assert [f.name for f in split.files] == [
        f"Tiny-Q4_0/Tiny-Q4_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)
    ]
    assert split.size == sum((folders[REPO] / f.name).stat().st_size for f in split.files)


def test_a_quant_is_picked_by_name_else_q4_k_m_else_the_nearest(hubsrv):
    _, found = gguf_repo.list_quants(REPO)
    assert gguf_repo.pick(found, "q8_0").name == "Q8_0"
    assert gguf_repo.pick(found, None).name == "Q4_K_M"
    without = [q for q in found if q.name != "Q4_K_M"]
    assert gguf_repo.pick(without, None).name == "Q4_0"  # 4.34 bits: the nearest to 4.58
    with pytest.raises(hub.DownloadError, match="has no IQ2_XS quant; it has"):
        gguf_repo.pick(found, "IQ2_XS", REPO)


def test_the_fit_read_over_range_requests_matches_the_files(hubsrv, monkeypatch):
    """The header is read in pieces, growing until it is whole; the estimate equals the one of
    the downloaded files, for one file and for a split model."""
    state, _, folders, _, _ = hubsrv
    monkeypatch.setattr(gguf_repo, "FIRST_READ", 4096)  # several reads, as a big vocabulary takes
    commit, found = gguf_repo.list_quants(REPO)
    for quant in found:
        remote = gguf_repo.facts(REPO, commit, quant)
        local = memory.facts_from_files(folders[REPO] / quant.first)
        for precision in ("int4", None):
            a = remote.estimate(precision, 4096).total
            b = local.estimate(precision, 4096).total
            assert abs(a - b) <= 0.15 * b and a == b
    assert sum(state.served.values()) < sum(q.size for q in found) / 4  # headers, not files
    ranges = state.seen("GET", "/cdn/")
    assert len(ranges) > len(found)  # the first 4 KB were not enough


def test_a_corrupt_header_is_said_at_once(hubsrv, tmp_path):
    state, _, folders, _, _ = hubsrv
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "Bad-Q8_0.gguf").write_bytes(b"GGML" + bytes(5000))
    state.repos["tiny/bad"] = bad
    commit, found = gguf_repo.list_quants("tiny/bad")
    with pytest.raises(BadModelFile, match="not a GGUF file"):
        gguf_repo.facts("tiny/bad", commit, found[0])


def test_download_by_spec_then_resolve_offline(hubsrv, monkeypatch):
    state, _, folders, _, _ = hubsrv
    path = loader.download(f"{REPO}:q8_0")
    assert path.name == "Tiny-Q8_0.gguf"
    assert path.read_bytes() == (folders[REPO] / "Tiny-Q8_0.gguf").read_bytes()
    assert set(state.served) == {"Tiny-Q8_0.gguf"}  # that quant alone
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert loader.resolve_model(f"{REPO}:Q8_0") == path
    with pytest.raises(loader.ModelNotFound):
        loader.resolve_model(f"{REPO}:F16")  # not downloaded, and offline


def test_a_gguf_repo_named_without_a_quant_gets_q4_k_m(hubsrv):
    path = loader.download(REPO)
    assert path.name == "Tiny-Q4_K_M.gguf"
    assert loader.resolve_model(REPO) == path  # the one quant of the snapshot


def test_kwker_load_takes_owner_repo_quant(hubsrv, tmp_path, monkeypatch):
    """kwker.load("OWNER/REPO:QUANT") downloads that quant alone and gives the decoder its file
    gives: the same tokens, greedy, as the repo's own file loaded directly."""
    state, _, folders, _, _ = hubsrv
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "kwker-cache"))
    dec = kwker.load(f"{REPO}:Q8_0", max_cache_len=64)
    assert set(state.served) == {"Tiny-Q8_0.gguf"} and dec.path.name == "Tiny-Q8_0.gguf"
    assert dec.precision == "balanced"
    ids = dec.tokenizer("hello there")["input_ids"]
    theirs = load_files(folders[REPO] / "Tiny-Q8_0.gguf", max_cache_len=64, cache=False)
    ours, want = (d.generate(ids, max_new_tokens=16, min_new_tokens=16)[0] for d in (dec, theirs))
    assert ours.tolist() == want.tolist() and len(ours) == len(ids) + 16


def test_a_split_quant_downloads_and_answers_as_the_single_file(hubsrv):
    _, _, _, single, _ = hubsrv
    path = loader.resolve_model(SPLIT_ONLY)  # no Q4_K_M: its only quant
    assert path.name == "Tiny-IQ4_XS-00001-of-00003.gguf"
    whole = load_files(single, max_cache_len=64)
    split = load_files(path, max_cache_len=64)
    assert np.array_equal(
        whole.generate(PROMPT, max_new_tokens=12), split.generate(PROMPT, max_new_tokens=12)
    )


def test_a_split_model_with_a_part_missing_is_refused(hubsrv, tmp_path):
    _, _, _, single, _ = hubsrv
    parts = sg.split_gguf(single, tmp_path / "M.gguf", max_tensors=8)
    parts[1].unlink()
    with pytest.raises(BadModelFile, match="M-00002-of-00003.gguf is missing"):
        load_files(parts[0], max_cache_len=64)
    with pytest.raises(BadModelFile, match="is part 3 of a split model: open"):
        load_files(parts[2], max_cache_len=64)


def test_cancel_keeps_the_finished_parts_and_the_next_call_resumes(hubsrv):
    state, _, folders, _, _ = hubsrv
    state.delay_per_chunk = 0.01
    cancel = threading.Event()
    seen = []

    def progress(p):
        seen.append(p)
        in_second = [q.done for q in seen if q.file.endswith("00002-of-00003.gguf")]
        if len(in_second) > 1 and in_second[-1] > in_second[0]:
            cancel.set()  # once the second part has some of its bytes, not all

    with pytest.raises(hub.Cancelled):
        loader.download(f"{REPO}:Q4_0", hub_progress=progress, cancel=cancel)
    first, second = (f"Tiny-Q4_0/Tiny-Q4_0-0000{i}-of-00003.gguf" for i in (1, 2))
    sent = dict(state.served)
    state.delay_per_chunk = 0.0
    state.starts.clear()
    path = loader.download(f"{REPO}:Q4_0")
    assert state.served[first] == sent[first]  # the finished part was not fetched again
    (resumed,) = [start for name, start in state.starts if name == second]
    assert 0 < resumed <= sent[second]  # the cut one from where it stopped
    for part in sorted(path.parent.glob("Tiny-Q4_0-*.gguf")):
        assert part.read_bytes() == (folders[REPO] / "Tiny-Q4_0" / part.name).read_bytes()


def test_a_repo_without_gguf_or_safetensors_says_so(hubsrv):
    with pytest.raises(hub.DownloadError, match="has no safetensors weights"):
        loader.download(README_ONLY)
    with pytest.raises(hub.DownloadError, match="holds no GGUF model files"):
        loader.download(f"{README_ONLY}:Q4_K_M")


def test_the_cli_downloads_and_generates_from_a_repo_and_quant(hubsrv):
    _, url, _, _, cache = hubsrv
    env = {**os.environ, "HF_ENDPOINT": url, "HF_HUB_CACHE": str(cache), "HF_TOKEN": ""}
    run = [sys.executable, "-m", "kwker.cli"]
    got = subprocess.run([*run, "models", "download", f"{REPO}:Q8_0"], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip().endswith("Tiny-Q8_0.gguf")
    got = subprocess.run([*run, "models", "quants", REPO], env=env,
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr
    lines = got.stdout.splitlines()
    assert [line.split()[0] for line in lines[1:]] == ["Q4_0", "Q4_K_M", "Q8_0", "F16"]
    assert "Q4_K_M" in lines[2] and "default" in lines[2]
    got = subprocess.run([*run, "generate", "--no-chat", "--max-new-tokens", "6",
                          f"{REPO}:Q8_0", "hello"], env={**env, "HF_HUB_OFFLINE": "1"},
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert got.returncode == 0, got.stderr
    dec = load_files(cache_file(cache, "Tiny-Q8_0.gguf"), max_cache_len=64)
    ids = dec.tokenizer("hello")["input_ids"]
    text = dec.tokenizer.decode(dec.generate(ids, max_new_tokens=6)[0][len(ids) :])
    assert text.strip() and text.strip() in got.stdout  # the same answer as the file's own


def cache_file(cache, name):
    return next(p for p in cache.rglob(name) if "snapshots" in p.parts)


def test_a_downloaded_quant_is_deleted_alone(hubsrv):
    """Deleting REPO:QUANT frees that quant's files; the repo's other quants stay, and the last
    one's deletion takes the repo out of the cache."""
    _, _, folders, _, _ = hubsrv
    q8 = loader.download(f"{REPO}:Q8_0")
    q4 = loader.download(f"{REPO}:Q4_0")  # a split one: three parts
    blob = q8.resolve()
    assert gguf_repo.remove(f"{REPO}:Q8_0") == (folders[REPO] / "Tiny-Q8_0.gguf").stat().st_size
    assert not q8.exists() and not blob.exists() and q4.exists()
    parts = sum(p.stat().st_size for p in (folders[REPO] / "Tiny-Q4_0").iterdir())
    assert gguf_repo.remove(f"{REPO}:Q4_0") == parts
    assert REPO not in [repo for repo, _, _ in hub.cached_models()]
    with pytest.raises(hub.DownloadError, match="is not downloaded"):
        gguf_repo.remove(f"{REPO}:Q4_0")
