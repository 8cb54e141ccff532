"""The chat app and a file-path `kwker serve` never import torch or transformers (issue 50): the
base install and the chat extra do not carry them. Each runs in a fresh process where importing
either fails, and does its real work there: the app's self-test answers through the window, the
server answers a chat completion over HTTP."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kwker.models.loader import resolve_model

pytestmark = pytest.mark.slow

# Run first in the child: an import of either raises ImportError, and at exit the child says
# whether anything imported them (a module object, not the None placed here).
BLOCK = (
    "import atexit, sys\n"
    "for name in ('torch', 'transformers', 'accelerate'):\n"
    "    sys.modules[name] = None\n"
    "atexit.register(lambda: print('heavy imports:', sorted(n for n in sys.modules\n"
    "    if n.split('.')[0] in ('torch', 'transformers') and sys.modules[n] is not None)))\n"
)


def child(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", BLOCK + code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, **kw,
    )  # fmt: skip


def test_the_app_answers_without_torch_or_transformers(tmp_path):
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "KWKER_DATA_DIR": str(tmp_path)}
    gguf = resolve_model(None)  # SmolLM2-135M: the window's path is the same for every model
    p = child(
        f"from kwker.app import main\nrc = main(['--self-test', '--model', {str(gguf)!r}])\n"
        "sys.stdout.flush()\nsys.exit(rc)",
        env=env,
    )
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    assert "self-test passed" in out and "serve: 200" in out
    assert out.rstrip().endswith("heavy imports: []")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_kwker_serve_answers_without_torch_or_transformers(tmp_path):
    port, gguf = free_port(), resolve_model(None)
    env = {**os.environ, "KWKER_CACHE_DIR": str(tmp_path)}
    code = (
        "import signal\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
        f"from kwker.cli import main\nmain(['serve', {str(gguf)!r}, '--port', '{port}'])\n"
    )
    p = child(code, env=env)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                assert p.poll() is None, p.stderr.read()[-3000:]
                time.sleep(0.2)
        body = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
        request = urllib.request.Request(
            f"{url}/v1/chat/completions", json.dumps(body).encode(),
            {"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(request, timeout=120) as r:
            assert r.status == 200
            reply = json.load(r)
        assert reply["choices"][0]["message"]["content"].strip()
        assert reply["usage"]["completion_tokens"] > 0
    finally:
        p.terminate()
        out, err = p.communicate(timeout=60)
    assert "heavy imports: []" in out, (out, err[-3000:])
