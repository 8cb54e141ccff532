"""The sources are formatted and linted as configured: Python by ruff (pyproject.toml), C++ by
clang-format (.clang-format). Both tools are pinned in the test extra, so that a clean install
checks what CI checks."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = ["engine", "app", "tests", "packaging", "scripts"]


def run(*args):
    r = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_ruff_check_finds_nothing():
    run(sys.executable, "-m", "ruff", "check", "--no-cache", *PYTHON)


def test_python_is_formatted():
    run(sys.executable, "-m", "ruff", "format", "--check", "--no-cache", *PYTHON)


def test_cpp_is_formatted():
    sources = sorted(
        str(p.relative_to(ROOT)) for p in (ROOT / "native").rglob("*") if p.suffix in (".cpp", ".h")
    )
    assert len(sources) > 20
    # the clang-format wheel's script sits beside this Python
    run(str(Path(sys.executable).parent / "clang-format"), "--dry-run", "--Werror", *sources)
