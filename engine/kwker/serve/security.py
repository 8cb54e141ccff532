"""What stands between the network and the routes: one ASGI middleware (Guard) that every request
passes, the unknown routes too, in this order:

1. Host: bound to loopback, the Host header must name loopback (localhost, 127.0.0.1, [::1]) or
   an allowed host. Else a page on some other name that resolves to 127.0.0.1 (DNS rebinding)
   could read the replies.
2. Origin: a request from a web page carries an Origin; it is served only if the origin is on the
   allow-list (empty by default), which also answers the allowed origins' CORS preflights.
3. The API key, when one is set: "Authorization: Bearer KEY", compared in constant time with
   every key of the server's (each key a tenant: see kwker.serve.engine).
4. Bodies: a POST must be application/json (a web page can send text/plain without a preflight)
   and at most max_body bytes (413), counted as it arrives, so a body without a Content-Length
   is cut off too; the whole body must arrive within BODY_TIMEOUT_S (408). The request's head
   has its deadline in kwker.serve.connections.

Each refusal is an OpenAI-shaped error. The middleware also reports every response's status to
the metrics."""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
from collections.abc import Callable, Iterable

DEFAULT_MAX_BODY = 4 * 1024 * 1024  # bytes: a long conversation is a few hundred KB
BODY_TIMEOUT_S = 30.0  # a whole body's deadline: a slow sender holds no connection for good
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict:
    """OpenAI's error shape."""
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def is_loopback(host: str) -> bool:
    """Whether a bind address is loopback only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name in a Host header, without its port: "[::1]:8000" -> "::1"."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    def __init__(
        self,
        app,
        api_key: str | dict[str, str] | None = None,
        allowed_origins: Iterable[str] = (),
        allowed_hosts: Iterable[str] | None = None,
        max_body: int = DEFAULT_MAX_BODY,
        on_response: Callable[[str, int], None] | None = None,
    ):
        """api_key: the key every request must bring, or {key: tenant name} for several keys (a
        request's tenant goes to the app as scope["kwker.tenant"]); None: no key.
        allowed_hosts: None checks no Host (bound beyond loopback); else the names allowed.
        on_response(path, status) is called for every response."""
        self.app = app
        keys = {api_key: "default"} if isinstance(api_key, str) else (api_key or {})
        self.keys = [(k.encode(), name) for k, name in keys.items()]
        self.origins = {o.rstrip("/").lower() for o in allowed_origins}
        self.hosts = None if allowed_hosts is None else {h.lower() for h in allowed_hosts}
        self.max_body = max_body
        self.on_response = on_response or (lambda path, status: None)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        origin = headers.get("origin", "").rstrip("/").lower()
        cors = origin in self.origins if origin else False

        async def reply(status: int, message: str, type_: str, code: str, param=None, extra=()):
            body = json.dumps(error_body(message, type_, param, code)).encode()
            await self._send(send, path, status, body, [*extra, *self._cors_headers(origin, cors)])

        if self.hosts is not None and host_name(headers.get("host", "")) not in self.hosts:
            await reply(
                403,
                f"this server answers only to {', '.join(sorted(self.hosts))} (Host header "
                f"{headers.get('host', '')!r}); start it with --allowed-host to add a name",
                "permission_error",
                "host_not_allowed",
            )
            return
        if origin and not cors:
            await reply(
                403,
                f"requests from web pages of {origin} are not allowed; start the server with "
                f"--allow-origin {origin} to allow them",
                "permission_error",
                "origin_not_allowed",
            )
            return
        if scope["method"] == "OPTIONS" and cors:  # an allowed origin's preflight: no key on it
            await self._send(send, path, 204, b"", self._cors_headers(origin, True, preflight=True))
            return
        tenant = self._tenant(headers.get("authorization", ""))
        if self.keys and tenant is None:
            await reply(
                401,
                "missing or wrong API key: send it as 'Authorization: Bearer KEY'",
                "authentication_error",
                "invalid_api_key",
                extra=[(b"www-authenticate", b"Bearer")],
            )
            return
        if scope["method"] == "POST":
            kind = headers.get("content-type", "").split(";")[0].strip().lower()
            if kind != "application/json":
                await reply(
                    415,
                    f"the request body must be application/json, got {kind or 'no content type'}",
                    "invalid_request_error",
                    "unsupported_media_type",
                )
                return
            try:
                async with asyncio.timeout(BODY_TIMEOUT_S):
                    body = await self._read_body(receive, headers)
            except TimeoutError:
                await reply(
                    408,
                    f"the request body did not arrive within {BODY_TIMEOUT_S:.0f} s",
                    "invalid_request_error",
                    "request_timeout",
                    extra=[(b"connection", b"close")],
                )
                return
            if body is None:
                await reply(
                    413,
                    f"the request body is larger than this server's limit of {self.max_body} "
                    "bytes (--max-body-bytes)",
                    "invalid_request_error",
                    "request_too_large",
                )
                return
            receive = _replay(body, receive)
        scope = {**scope, "kwker.tenant": tenant}

        async def send_and_count(message):
            if message["type"] == "http.response.start":
                self.on_response(path, message["status"])
                if cors:
                    message = {
                        **message,
                        "headers": [*message.get("headers", []), *self._cors_headers(origin, True)],
                    }
            await send(message)

        await self.app(scope, receive, send_and_count)

    def _tenant(self, authorization: str) -> str | None:
        """The name of the key the request brings, None for none or a wrong one."""
        scheme, _, key = authorization.partition(" ")
        given, found = key.strip().encode(), None
        # compare_digest takes as long for every wrong key of a length, and every key is tried:
        # no timing oracle
        for k, name in self.keys:
            if hmac.compare_digest(given, k) and scheme.lower() == "bearer":
                found = name
        return found

    async def _read_body(self, receive, headers) -> bytes | None:
        """The whole body, or None as soon as it passes max_body."""
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.max_body:
            return None
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(parts)

    def _cors_headers(self, origin: str, allowed: bool, preflight: bool = False):
        if not allowed:
            return []
        out = [(b"access-control-allow-origin", origin.encode()), (b"vary", b"Origin")]
        if preflight:
            out += [
                (b"access-control-allow-methods", b"GET, POST, OPTIONS"),
                (b"access-control-allow-headers", b"authorization, content-type"),
                (b"access-control-max-age", b"600"),
            ]
        return out

    async def _send(self, send, path: str, status: int, body: bytes, headers) -> None:
        self.on_response(path, status)
        head = [(b"content-length", str(len(body)).encode())]
        if body:
            head.append((b"content-type", b"application/json"))
        await send({"type": "http.response.start", "status": status, "headers": head + headers})
        await send({"type": "http.response.body", "body": body})


def _replay(body: bytes, receive):
    """A receive that gives the app the body already read, then the connection's own messages
    (http.disconnect, which the routes watch to cancel the generation of a client gone)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed
