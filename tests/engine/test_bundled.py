"""An installer's bundled folder (kwker.models.bundled): prepared once at build time, then copied
elsewhere (another path, new modification times, read-only), it gives the default model with its
packed weights and tokenizer: nothing is downloaded, packed or written to the user's cache."""

import os
import shutil
import stat

import pytest

from kwker.loading.load import load_files
from kwker.models import bundled
from kwker.models.loader import DEFAULT_MODEL, resolve_model

pytestmark = pytest.mark.slow


def read_only(folder):
    for p in folder.rglob("*"):
        p.chmod(p.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def test_a_bundled_folder_loads_without_packing_or_writing(tmp_path, monkeypatch):
    built = tmp_path / "build" / "models"
    # the tests' small model (the installers bundle the app's default, CHAT_MODEL, the same way)
    gguf = bundled.prepare(built, DEFAULT_MODEL, progress=lambda _: None)
    entries = sorted(p.name for p in (built / "packed").iterdir())
    assert any(n.endswith(".kwk") and "-int4-" in n for n in entries)
    assert any(n.endswith(".tokenizer") for n in entries)
    installed = tmp_path / "opt" / "kwker" / "models"
    shutil.copytree(built, installed, copy_function=shutil.copyfile)  # new mtimes
    read_only(installed)
    user_cache = tmp_path / "user-cache"
    monkeypatch.setenv("KWKER_BUNDLED_DIR", str(installed))
    monkeypatch.setenv("KWKER_CACHE_DIR", str(user_cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    path = resolve_model(DEFAULT_MODEL)
    assert path == installed / gguf.name
    dec = load_files(path, max_cache_len=256, precision="int4")
    assert dec.from_cache
    ids = dec.tokenizer("The capital of France is")["input_ids"]
    assert len(dec.generate(ids, max_new_tokens=4)[0]) == len(ids) + 4
    written = [p for p in user_cache.rglob("*") if p.is_file()] if user_cache.exists() else []
    assert written == []
    # the same bytes under the build's path give the same packed entry
    monkeypatch.setenv("KWKER_BUNDLED_DIR", str(built))
    assert load_files(built / gguf.name, max_cache_len=256, precision="int4").from_cache
    assert os.listdir(installed / "packed") == os.listdir(built / "packed")
