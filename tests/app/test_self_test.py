"""`kwker-chat --self-test`, as the installers' smoke tests run it: a fresh process answers through
the real window and exits 0, or exits 1 with the reason."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def self_test(*args, tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "KWKER_DATA_DIR": str(tmp_path / "d")}
    code = "import sys; from kwker.app import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, "--self-test", *args],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip


def test_the_self_test_answers_and_passes(tmp_path):
    r = self_test(tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in r.stdout.splitlines() if ": " in line)
    assert "4" in lines["answer"]
    status, answer = lines["serve"].split(", ", 1)  # kwker serve's server, on the same model
    assert status == "200" and "4" in answer
    assert " tokens/s" in r.stdout and r.stdout.rstrip().endswith("self-test passed")
    assert (tmp_path / "d" / "chats.db").exists()  # its own data folder, not the user's


def test_the_self_test_fails_with_the_reason(tmp_path):
    r = self_test("--model", str(tmp_path / "missing.gguf"), tmp_path=tmp_path)
    assert r.returncode == 1
    assert "self-test failed: the model did not load: no such GGUF file" in r.stderr
