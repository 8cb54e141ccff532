"""A stand-in for the Hugging Face Hub on 127.0.0.1 that answers huggingface_hub's client as the
Hub does: the model-info API (sizes, git blob ids, LFS sha256s), search, and HEAD and GET on
`resolve` (ETag and X-Repo-Commit; an LFS file redirects to a "CDN" under another host name,
localhost, as the Hub's do), with Range support. Faults on request: cut a transfer, corrupt a file,
answer a resume with the file's first bytes, answer HTTP errors, throttle, require a token. Every
request is logged with its Host and Authorization headers."""

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def is_lfs(name: str) -> bool:
    return name.endswith((".safetensors", ".gguf"))


def repo_files(folder: Path) -> list[Path]:
    """A repo's files, subfolders included (GGUF repos keep split quants in one each)."""
    return sorted(f for f in folder.rglob("*") if f.is_file())


def tags(folder: Path) -> list[str]:
    return ["gguf"] if any(f.suffix == ".gguf" for f in repo_files(folder)) else []


def git_blob_id(data: bytes) -> str:
    """The id git gives a file's bytes, which the Hub lists as a file's blobId."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubState:
    def __init__(self, repos: dict[str, Path]):
        self.repos = repos  # repo id -> folder with its files
        self.cdn_host = "localhost"  # where LFS files are served from (the server's own port)
        # (method, path, Host header, Authorization header or None) of every request
        self.requests: list[tuple[str, str, str, str | None]] = []
        self.served: dict[str, int] = {}  # filename -> bytes sent
        # (filename, first byte asked for) of every request that was sent a file's bytes
        self.starts: list[tuple[str, int]] = []
        # filename -> close the connection after this many bytes (once)
        self.cut_after: dict[str, int] = {}
        self.corrupt_once: set[str] = set()
        self.corrupt_always: set[str] = set()  # a mirror that keeps a damaged copy
        # filenames whose next Range request is answered 206 with the file's first bytes instead
        # (a proxy or mirror that ignores where the range starts), once
        self.wrong_resume: set[str] = set()
        # filename (its GETs for bytes) or "api" (model info) -> HTTP statuses to answer its next
        # requests with, one each, before answering normally
        self.faults: dict[str, list[int]] = {}
        self.gated: dict[str, str] = {}  # repo id -> the token it needs
        self.delay_per_chunk = 0.0
        self.lock = threading.Lock()

    def seen(self, method: str, prefix: str) -> list[tuple[str, str, str, str | None]]:
        """The logged requests of this method whose path starts with prefix."""
        with self.lock:
            return [r for r in self.requests if r[0] == method and r[1].startswith(prefix)]


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

        def _empty(self, code, headers=()):
            self.send_response(code)
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _fault(self, key) -> bool:
            """Answers the next injected HTTP error for key, if any is left."""
            with state.lock:
                statuses = state.faults.get(key)
                code = statuses.pop(0) if statuses else None
            if code is None:
                return False
            self._empty(code)
            return True

        def _authorized(self, repo):
            need = state.gated.get(repo)
            return need is None or self.headers.get("Authorization") == f"Bearer {need}"

        def do_HEAD(self):  # noqa: N802
            self._route(head=True)

        def do_GET(self):  # noqa: N802
            self._route(head=False)

        def _route(self, head):
            path = self.path.split("?")[0]
            host, auth = self.headers.get("Host"), self.headers.get("Authorization")
            with state.lock:
                state.requests.append((self.command, path, host, auth))
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                return self._resolve(m.group(1), m.group(3), head)
            m = re.fullmatch(r"/cdn/([^/]+/[^/]+)/(.+)", path)
            if m:
                return self._send_file(m.group(1), m.group(2), head)
            if head:
                return self._empty(404)
            if path == "/api/models":  # search: every repo whose id contains the text
                text = re.search(r"search=([^&]*)", self.path)
                text = text.group(1) if text else ""
                return self._json(
                    200,
                    [{"id": r, "modelId": r, "tags": tags(f)}
                     for r, f in state.repos.items() if text in r],
                )  # fmt: skip
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
            if m:
                return self._info(m.group(1))
            self._json(404, {"error": "not found"})

        def _info(self, repo):
            if self._fault("api"):
                return
            folder = state.repos.get(repo)
            if folder is None:
                return self._empty(404, [("X-Error-Code", "RepoNotFound")])
            if not self._authorized(repo):
                return self._empty(
                    401,
                    [("X-Error-Code", "GatedRepo"),
                     ("X-Error-Message", "Access to this model is restricted")],
                )  # fmt: skip
            siblings = []
            for f in repo_files(folder):
                data = f.read_bytes()
                sib = {
                    "rfilename": f.relative_to(folder).as_posix(),
                    "size": len(data),
                    "blobId": git_blob_id(data),
                }
                if is_lfs(f.name):
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
                    "tags": tags(folder),
                    "downloads": 0,
                    "likes": 0,
                },
            )

        def _resolve(self, repo, name, head):
            """The Hub's answer for a file: an LFS file's metadata and a redirect to the CDN (which
            needs no token), any other file itself."""
            folder = state.repos.get(repo)
            if folder is None:
                return self._empty(404, [("X-Error-Code", "RepoNotFound")])
            if not self._authorized(repo):
                return self._empty(401, [("X-Error-Code", "GatedRepo")])
            if not (folder / name).is_file():
                return self._empty(
                    404, [("X-Error-Code", "EntryNotFound"), ("X-Repo-Commit", COMMIT)]
                )
            if not is_lfs(name):
                return self._send_file(repo, name, head)
            data = (folder / name).read_bytes()
            port = self.server.server_address[1]
            self._empty(
                302,
                [("Location", f"http://{state.cdn_host}:{port}/cdn/{repo}/{name}"),
                 ("X-Repo-Commit", COMMIT),
                 ("X-Linked-Etag", f'"{hashlib.sha256(data).hexdigest()}"'),
                 ("X-Linked-Size", str(len(data))),
                 ("ETag", f'"{git_blob_id(data)}"')],
            )  # fmt: skip

        def _send_file(self, repo, name, head):
            data = (state.repos[repo] / name).read_bytes()
            headers = [
                ("ETag", f'"{git_blob_id(data)}"'),
                ("X-Repo-Commit", COMMIT),
                ("Accept-Ranges", "bytes"),
            ]
            if head:  # the headers a GET would have, no body
                self.send_response(200)
                for key, value in headers:
                    self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                return
            if self._fault(name):
                return
            with state.lock:
                if name in state.corrupt_once or name in state.corrupt_always:
                    state.corrupt_once.discard(name)
                    data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
                wrong = name in state.wrong_resume
            start = 0
            rng = self.headers.get("Range")
            if rng:
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
                start = int(m.group(1))
                end = min(int(m.group(2)), len(data) - 1) if m.group(2) else len(data) - 1
                body = data[start : end + 1]
                if wrong:  # the right length and Content-Range, the wrong bytes
                    with state.lock:
                        state.wrong_resume.discard(name)
                    body = data[: len(body)]
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
            else:
                body = data
                self.send_response(200)
            with state.lock:
                state.starts.append((name, start))
            for key, value in headers:
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
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
