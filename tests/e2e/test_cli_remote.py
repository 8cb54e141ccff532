"""`kwker generate --server URL` as a user runs it, against real servers on 127.0.0.1 (`kwker serve`
and llama-cpp-python's own server, both with an API key): the answer streams to stdout, the key
comes from --api-key-file or KWKER_API_KEY, Ctrl+C closes the stream (and kwker serve stops
generating), and every refusal is one clear line on stderr with a non-zero exit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest
from remote_servers import (
    LONG_PROMPT,
    generated_tokens,
    refused_port,
)

QUESTION = "What is the capital of France?"


def kwker(*args, env=None, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "kwker.cli", "generate", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None},
    )


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.mark.slow
def test_the_answer_streams_to_stdout(server):
    r = kwker("--server", server.url, "--api-key-file", str(server.key_file), QUESTION,
              "--max-new-tokens", "16", env={"KWKER_API_KEY": None})  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.strip()) > 10
    stats = one_line(r.stderr)
    assert "tokens/s" in stats and f"on {server.url}" in stats
    if server.name == "kwker":  # its own figures, as the local engine prints them
        assert "measured here" not in stats and "prompt" in stats
    else:
        assert "measured here" in stats and "first token after" in stats
    # the same answer with the key from the environment, the address without /v1
    by_env = kwker("--server", server.url.removesuffix("/v1"), QUESTION, "--max-new-tokens", "16",
                   env={"KWKER_API_KEY": server.key})  # fmt: skip
    assert by_env.returncode == 0, by_env.stderr
    assert by_env.stdout == r.stdout  # greedy


@pytest.mark.slow
@pytest.mark.parametrize("key", [None, "a-wrong-key"], ids=["no key", "wrong key"])
def test_a_missing_or_wrong_key_is_one_clear_line(server, key, tmp_path):
    args = ["--server", server.url, QUESTION]
    if key:
        (tmp_path / "key").write_text(key)
        args += ["--api-key-file", str(tmp_path / "key")]
    r = kwker(*args, env={"KWKER_API_KEY": None})
    verdict = "refused the API key" if key else "needs an API key"
    assert r.returncode != 0 and r.stdout.strip() == ""
    assert one_line(r.stderr).startswith(f"kwker: The server at {server.url} {verdict} (401: ")


@pytest.mark.slow
def test_an_unknown_model_is_one_clear_line(kwker_server):
    r = kwker("--server", kwker_server.url, "--model", "no-such-model", QUESTION,
              env={"KWKER_API_KEY": kwker_server.key})  # fmt: skip
    assert r.returncode != 0
    assert one_line(r.stderr).startswith(
        f"kwker: The server at {kwker_server.url} has no model “no-such-model” (404: "
    )


def test_an_unreachable_server_is_one_clear_line():
    url = refused_port()
    r = kwker("--server", url, QUESTION)
    assert r.returncode != 0
    assert one_line(r.stderr) == (
        f"kwker: Cannot reach the server at {url} (connection refused). Is it running, and is "
        "the address right?"
    )


@pytest.mark.slow
def test_ctrl_c_closes_the_stream_and_the_server_stops(server):
    before = server.metrics()
    proc = subprocess.Popen(
        [sys.executable, "-m", "kwker.cli", "generate", "--server", server.url, LONG_PROMPT,
         "--max-new-tokens", "1000"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "KWKER_API_KEY": server.key},
        # Ctrl+C as a terminal delivers it: a suite started in the background (`cmd &` in a
        # script) hands its children SIGINT ignored, and Python then keeps it ignored
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    streamed = proc.stdout.read(40)  # the answer is arriving
    assert len(streamed) == 40
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=20)
    assert proc.returncode == 130, err
    if before is not None:  # kwker serve: no slot taken, far fewer tokens than asked
        deadline = time.monotonic() + 5
        while server.metrics()["kwker_active_slots"] != 0:
            assert time.monotonic() < deadline, "a slot stayed taken"
            time.sleep(0.1)
        assert generated_tokens(server.metrics()) - generated_tokens(before) < 200
    time.sleep(0.5)
    cpu = server.cpu_seconds()
    time.sleep(1.5)
    assert server.cpu_seconds() - cpu < 0.3  # idle: not generating for nobody


def test_the_remote_client_imports_neither_torch_nor_qt():
    """kwker generate --server runs where only the client's packages are: no torch, no Qt."""
    code = (
        "import sys\n"
        "from kwker import cli, remote\n"
        f"try: remote.list_models({refused_port()!r})\n"
        "except remote.RemoteError as e: assert e.kind == remote.UNREACHABLE\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('torch', 'PySide6', 'transformers')]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
