import os

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")


@pytest.fixture
def data_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KWKER_DATA_DIR", str(tmp_path / "data"))
    # the config folder too (mcp.json, the keys' file): a test never reads the user's
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path / "data"
