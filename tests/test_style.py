"""The Python sources pass `ruff check` with the configuration in pyproject.toml (ruff is in the test extra)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ["engine", "app", "tests", "packaging"]


def test_ruff_check_finds_nothing():
    r = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", *SOURCES],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr
