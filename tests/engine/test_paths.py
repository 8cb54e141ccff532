"""Kwker's folders (kwker.loading.paths): the cache, made where KWKER_CACHE_DIR says, and the
installer's bundled models, only when that folder exists; and the old kwker.models.cache path."""

import importlib
import sys

import pytest

from kwker.loading import paths


def test_the_cache_is_made_where_the_environment_says(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "a" / "cache"))
    assert paths.cache_dir() == tmp_path / "a" / "cache"
    assert (tmp_path / "a" / "cache").is_dir()


def test_the_bundled_folder_only_when_it_exists(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_BUNDLED_DIR", str(tmp_path / "models"))
    assert paths.bundled_dir() is None
    (tmp_path / "models").mkdir()
    assert paths.bundled_dir() == tmp_path / "models"
    monkeypatch.delenv("KWKER_BUNDLED_DIR")
    assert paths.bundled_dir() is None  # not a frozen app: no folder beside the code


def test_the_old_path_warns_and_still_works(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "kwker.models.cache", raising=False)  # import it afresh
    with pytest.warns(DeprecationWarning, match="kwker.loading.paths"):
        old = importlib.import_module("kwker.models.cache")
    assert old.cache_dir is paths.cache_dir and old.bundled_dir is paths.bundled_dir
    monkeypatch.setenv("KWKER_CACHE_DIR", str(tmp_path / "cache"))
    assert old.cache_dir() == tmp_path / "cache"
