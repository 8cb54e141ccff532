"""The app's MCP host: the configured servers (kwker.app.mcp_config), their tools, and calls to
them.

The mcp client is asyncio: one event loop runs on its own thread for the whole app, each server's
session in one task on it (the session's context is entered and left by the same task, as anyio
wants). The GUI thread only reads snapshots (`states`, `tools`) and asks for changes (`apply`,
`restart`), which return at once; `call` blocks, and is made from the generation worker's thread,
never the GUI's. `changed` is emitted from the loop's thread, so it reaches the window queued.

A stdio server's environment is what its entry's `env` gives over the mcp package's minimal
inherited set (PATH, HOME, USER, LOGNAME, SHELL, TERM; their Windows equivalents): a program
cannot be found or run without them, and nothing else of the app's environment (API keys, tokens)
reaches a server. Its stderr goes to a file in the data folder, whose last lines say why it
failed. Nothing starts a server that is not in mcp.json and switched on.

Failures are said in plain words (`ServerState.error`, a ToolResult's text) and never raise into
the chat: a server that cannot start, one that stops, a call that times out or fails."""

from __future__ import annotations

import asyncio
import contextlib
import re
import threading
import time
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

from PySide6.QtCore import QObject, Signal

from kwker.app.mcp_config import ServerSpec

CALL_TIMEOUT_S = 30.0  # a tool call's default time limit
START_TIMEOUT_S = 60.0  # a server's start and tool list (an `npx` server may download first)
MAX_RESULT_CHARS = 6000  # what of a result the model gets: the context holds a few thousand tokens
OFF, STARTING, RUNNING, FAILED = "off", "starting", "running", "failed"


@dataclass
class ToolInfo:
    server: str
    name: str
    description: str
    schema: dict  # its arguments' JSON schema


@dataclass
class ServerState:
    spec: ServerSpec
    status: str = OFF
    error: str = ""  # why it failed, in words after its name ("could not start: …")
    tools: list[ToolInfo] = field(default_factory=list)
    client: object = None
    stop: asyncio.Event | None = None


@dataclass
class ToolResult:
    text: str  # the result (or what went wrong), as the model and the chat get it
    status: str  # "done", "error" (the tool said so, or the call failed), "timeout"
    seconds: float = 0.0


class McpHost(QObject):
    changed = Signal()  # a server started, failed or stopped; its tools changed

    def __init__(self, log_folder: Path, parent=None):
        super().__init__(parent)
        self.log_folder = Path(log_folder)
        self._states: dict[str, ServerState] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tasks: dict[str, asyncio.Task] = {}

    # ---------------------------------------------------------------------------- GUI thread
    def states(self) -> list[ServerState]:
        return list(self._states.values())

    def tools(self) -> list[ToolInfo]:
        """The tools of the servers that run now (any thread)."""
        return [t for s in list(self._states.values()) if s.status == RUNNING for t in s.tools]

    def apply(self, specs: list[ServerSpec]) -> None:
        """Runs what `specs` switches on: a new or changed server (re)starts, a removed or
        switched-off one stops, an unchanged one runs on."""
        wanted = {s.name: s for s in specs}
        for name, state in list(self._states.items()):
            spec = wanted.get(name)
            if spec is None or not spec.enabled or spec != state.spec:
                self._stop(name)
                del self._states[name]
        for spec in specs:
            if spec.name not in self._states:
                self._states[spec.name] = ServerState(spec)
                if spec.enabled:
                    self._start(spec.name)
        self.changed.emit()

    def restart(self, name: str) -> None:
        state = self._states.get(name)
        if state is not None and state.spec.enabled:
            self._stop(name)
            self._states[name] = ServerState(state.spec)
            self._start(name)
            self.changed.emit()

    def close(self) -> None:
        """Stops every server (their processes end) and the loop."""
        for name in list(self._states):
            self._stop(name)
        if self._loop is not None:
            tasks = list(self._tasks.values())

            async def drain():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 8)

            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(drain(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)
            self._loop = None
        self._states.clear()

    # ------------------------------------------------------------------------- worker thread
    def call(self, server: str, tool: str, arguments: dict, timeout: float = CALL_TIMEOUT_S,
             stop: threading.Event | None = None) -> ToolResult:  # fmt: skip
        """Runs a tool and waits for its result, at most `timeout` seconds (or until `stop` is
        set: the user pressed Stop). Never raises: a failure is a result that says it."""
        state = self._states.get(server)
        t0 = time.perf_counter()
        if state is None or state.status != RUNNING or self._loop is None:
            why = f": it {state.error}." if state is not None and state.error else "."
            return ToolResult(f"The tool server “{server}” is not running{why}", "error")
        future = asyncio.run_coroutine_threadsafe(self._call(state, tool, arguments), self._loop)
        while True:
            try:
                result = future.result(0.1)
                break
            except FutureTimeout:
                elapsed = time.perf_counter() - t0
                if elapsed >= timeout or (stop is not None and stop.is_set()):
                    future.cancel()
                    if elapsed >= timeout:
                        result = ToolResult(
                            f"The tool “{tool}” of “{server}” did not answer within "
                            f"{timeout:g} s, so the call was given up.", "timeout",
                        )  # fmt: skip
                    else:
                        result = ToolResult("The call was stopped.", "error")
                    break
        result.seconds = time.perf_counter() - t0
        return result

    async def _call(self, state: ServerState, tool: str, arguments: dict) -> ToolResult:
        try:
            result = await state.client.call_tool(tool, arguments)
        except Exception as e:  # noqa: BLE001  (said to the model and in the chat)
            if _closed(e):  # the server's process ended (or its connection did)
                state.error = f"stopped while running “{tool}”{self._last_words(state)}"
                state.status = FAILED
                state.stop.set()
                self.changed.emit()
                return ToolResult(f"The tool server “{state.spec.name}” {state.error}.", "error")
            return ToolResult(f"The tool “{tool}” failed: {_words(e)}", "error")
        text = _result_text(result)
        if len(text) > MAX_RESULT_CHARS:
            text = text[:MAX_RESULT_CHARS] + f"\n[… cut at {MAX_RESULT_CHARS:,} characters]"
        return ToolResult(text, "error" if result.is_error else "done")

    # ---------------------------------------------------------------------------- loop thread
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(
                target=self._loop.run_forever, name="kwker-mcp", daemon=True
            )
            self._thread.start()
        return self._loop

    def _start(self, name: str) -> None:
        loop = self._ensure_loop()
        state = self._states[name]
        state.status = STARTING

        def begin():
            state.stop = asyncio.Event()
            task = loop.create_task(self._serve(state))
            self._tasks[name] = task
            loop.call_later(START_TIMEOUT_S, lambda: state.status == STARTING and task.cancel())

        loop.call_soon_threadsafe(begin)

    def _stop(self, name: str) -> None:
        state = self._states.get(name)
        if state is None or self._loop is None:
            return
        state.status = OFF

        def end():
            if state.stop is not None:
                state.stop.set()
            task = self._tasks.get(name)
            if task is not None and state.client is None:  # still starting: no session to close
                task.cancel()

        self._loop.call_soon_threadsafe(end)

    def _errlog(self, spec: ServerSpec) -> Path:
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", spec.name)
        return self.log_folder / f"mcp-{safe}.stderr.log"

    def _last_words(self, state: ServerState) -> str:
        """ ": <the last lines the server wrote to stderr>", or "" when it wrote none."""
        try:
            lines = self._errlog(state.spec).read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        tail = " / ".join(line.strip() for line in lines[-3:] if line.strip())
        return f" (it said: {tail[-400:]})" if tail else ""

    async def _serve(self, state: ServerState) -> None:
        from mcp import Client, StdioServerParameters

        spec = state.spec
        self.log_folder.mkdir(parents=True, exist_ok=True)
        try:
            with open(self._errlog(spec), "w", encoding="utf-8") as errlog:
                if spec.url:
                    target = _http_transport(spec)
                else:
                    params = StdioServerParameters(command=spec.command, args=spec.args,
                                                   env=spec.env or None)  # fmt: skip
                    target = _stdio_transport(params, errlog)
                async with Client(target) as client:
                    listed = await client.list_tools()
                    state.tools = [
                        ToolInfo(spec.name, t.name, t.description or "", dict(t.input_schema))
                        for t in listed.tools
                    ]
                    state.client, state.status = client, RUNNING
                    self.changed.emit()
                    await state.stop.wait()
        except asyncio.CancelledError:
            if state.status == STARTING:  # the start's time limit
                state.error = f"did not start within {START_TIMEOUT_S:.0f} s"
                state.status = FAILED
        except BaseException as e:  # noqa: BLE001  (an ExceptionGroup from anyio too)
            if state.status in (STARTING, RUNNING):
                state.error = _start_failure(spec, e) + self._last_words(state)
                state.status = FAILED
        finally:
            state.client = None
            if self._tasks.get(spec.name) is asyncio.current_task():
                del self._tasks[spec.name]
            self.changed.emit()


def _stdio_transport(params, errlog):
    from mcp.client.stdio import stdio_client

    return stdio_client(params, errlog=errlog)


def _http_transport(spec: ServerSpec):
    from mcp.client.streamable_http import streamable_http_client

    if not spec.headers:
        return streamable_http_client(spec.url)
    import httpx

    return streamable_http_client(spec.url, http_client=httpx.AsyncClient(headers=spec.headers))


def _leaf(e: BaseException) -> BaseException:
    """The first real exception in anyio's exception groups."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def _closed(e: BaseException) -> bool:
    e = _leaf(e)
    return "Connection closed" in str(e) or isinstance(e, (EOFError, BrokenPipeError))


def _words(e: BaseException) -> str:
    e = _leaf(e)
    message = getattr(e, "message", None) or str(e) or type(e).__name__
    return str(message)


def _start_failure(spec: ServerSpec, e: BaseException) -> str:
    """Why a server could not start, in words."""
    e = _leaf(e)
    if isinstance(e, FileNotFoundError) and not spec.url:
        return f"could not start: the program “{spec.command}” was not found"
    if isinstance(e, PermissionError) and not spec.url:
        return f"could not start: the program “{spec.command}” may not be run"
    if _closed(e):
        return "exited before it answered"
    if spec.url:
        return f"could not be reached at {spec.url}: {_words(e)}"
    return f"could not start: {_words(e)}"


def _result_text(result) -> str:
    """A tool result's content as text (what is not text is named)."""
    parts = []
    for block in result.content:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource" and hasattr(block.resource, "text"):
            parts.append(block.resource.text)
        else:
            parts.append(f"[{kind or 'content'} not shown]")
    if not parts and result.structured_content is not None:
        import json

        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    return "\n".join(parts)
