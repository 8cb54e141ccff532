"""Imports point one way, app -> engine -> native: the engine never imports Qt."""

import subprocess
import sys


def test_engine_does_not_import_qt():
    code = (
        "import sys, kwker, kwker.hf.decoder, kwker.cli, kwker.bench.main, kwker.models, kwker.sampling\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'PyQt5', 'PyQt6', 'shiboken6')]\n"
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
