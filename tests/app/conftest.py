import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"
