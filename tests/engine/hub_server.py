"""A stand-in for the Hugging Face Hub on 127.0.0.1: the model-info API and `resolve` downloads with Range
support, plus faults on request (cut a transfer, corrupt a file once, throttle, require a token)."""

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class HubState:
    def __init__(self, repos: dict[str, Path]):
        self.repos = repos  # repo id -> folder with its files
        self.served: dict[str, int] = {}  # filename -> bytes sent
        self.starts: list[
            tuple[str, int]
        ] = []  # (filename, first byte asked for) of every download request
        self.cut_after: dict[
            str, int
        ] = {}  # filename -> close the connection after this many bytes (once)
        self.corrupt_once: set[str] = set()
        self.gated: dict[str, str] = {}  # repo id -> the token it needs
        self.delay_per_chunk = 0.0
        self.lock = threading.Lock()


def make_handler(state: HubState):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def _json(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _authorized(self, repo):
            need = state.gated.get(repo)
            return need is None or self.headers.get("Authorization") == f"Bearer {need}"

        def do_GET(self):  # noqa: N802
            path = self.path.split("?")[0]
            if path == "/api/models":  # search: every repo whose id contains the text
                text = re.search(r"search=([^&]*)", self.path)
                text = text.group(1) if text else ""
                return self._json(200, [{"id": r, "modelId": r} for r in state.repos if text in r])
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
            if m:
                return self._info(m.group(1))
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                return self._file(m.group(1), m.group(3))
            self._json(404, {"error": "not found"})

        def _info(self, repo):
            folder = state.repos.get(repo)
            if folder is None:
                self.send_response(404)
                self.send_header("X-Error-Code", "RepoNotFound")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if not self._authorized(repo):
                self.send_response(401)
                self.send_header("X-Error-Code", "GatedRepo")
                self.send_header("X-Error-Message", "Access to this model is restricted")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            siblings = []
            for f in sorted(folder.iterdir()):
                data = f.read_bytes()
                sib = {
                    "rfilename": f.name,
                    "size": len(data),
                    "blobId": hashlib.sha1(data).hexdigest(),
                }
                if f.suffix == ".safetensors":
                    sib["lfs"] = {
                        "sha256": hashlib.sha256(data).hexdigest(),
                        "size": len(data),
                        "pointerSize": 130,
                    }
                siblings.append(sib)
            self._json(
                200,
                {
                    "id": repo,
                    "modelId": repo,
                    "sha": COMMIT,
                    "siblings": siblings,
                    "private": False,
                    "gated": repo in state.gated,
                    "tags": [],
                    "downloads": 0,
                    "likes": 0,
                },
            )

        def _file(self, repo, name):
            if not self._authorized(repo):
                self.send_response(401)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            data = (state.repos[repo] / name).read_bytes()
            with state.lock:
                if name in state.corrupt_once:
                    state.corrupt_once.discard(name)
                    data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
            start = 0
            rng = self.headers.get("Range")
            if rng:
                start = int(re.fullmatch(r"bytes=(\d+)-", rng).group(1))
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            else:
                self.send_response(200)
            with state.lock:
                state.starts.append((name, start))
            body = data[start:]
            self.send_header("Content-Length", str(len(body)))
            self.send_header("ETag", hashlib.sha256(data).hexdigest())
            self.end_headers()
            with state.lock:
                cut = state.cut_after.pop(name, None)
            sent = 0
            for i in range(0, len(body), 16384):
                piece = body[i : i + 16384]
                if cut is not None and sent + len(piece) > cut:
                    piece = piece[: cut - sent]
                    self.wfile.write(piece)
                    with state.lock:
                        state.served[name] = state.served.get(name, 0) + len(piece)
                    self.close_connection = True
                    self.wfile.flush()
                    self.connection.shutdown(2)
                    return
                self.wfile.write(piece)
                sent += len(piece)
                with state.lock:
                    state.served[name] = state.served.get(name, 0) + len(piece)
                if state.delay_per_chunk:
                    import time

                    time.sleep(state.delay_per_chunk)

    return Handler


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address):
        pass  # clients that go away mid-file (cancel, cut) are part of the tests


def start(state: HubState):
    server = QuietServer(("127.0.0.1", 0), make_handler(state))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"
