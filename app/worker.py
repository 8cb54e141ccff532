"""The generation worker: one QObject living on a QThread. It loads a backend (a model here or on a
server, kwker.app.backends) and drives its answers; the GUI talks to it through queued signals,
except Stop, which is a thread-safe flag checked between pieces.

Tools: when the window gave the worker an MCP host (`host`, kwker.app.mcp_host) with tools running,
an answer is offered them. A call the model makes is shown (`tool_call`), asked about (`approval`:
the worker waits here until the GUI thread replies through `approvals`, or Stop), run on the host
with its time limit, and its result given back to the model, which goes on writing the same
answer; a denied call is not run, and the model answers on without tools."""

from __future__ import annotations

import json
import logging
import threading

from PySide6.QtCore import QObject, Signal, Slot

from kwker.app import tool_calls as tc
from kwker.app.backends import backend_for
from kwker.remote import CUT, RemoteError

log = logging.getLogger(__name__)  # to the app's log file (kwker.app.logs)


class GenerationWorker(QObject):
    loading = Signal(str)  # progress message
    loaded = Signal(dict)  # model info: model, server, precision, isa, threads, draft, ...
    load_failed = Signal(str)
    # the index of the first message the model sees (the rolling window's start), before an answer
    window = Signal(int)
    # text piece, token id (-1 from a server), source ("" / "lookup" / "draft"), stats ({} between
    # fresh ones)
    chunk = Signal(str, int, str, dict)
    # a thinking model's thinking (kwker.thinking), sent before the same piece's chunk
    thought = Signal(str)
    # finish reason ("eos", "length", "stopped"; a server's "stop"; "cut": the stream ended midway,
    # its text so far kept, the reason in the stats' "error"), final stats
    finished = Signal(str, dict)
    failed = Signal(str)
    # the exactness split view (kwker.app.views.split_view): column (0 plain decoding,
    # 1 speculation), text piece, token id; a column's final stats; a failure; the end of both
    compare_chunk = Signal(int, str, int)
    compare_done = Signal(int, dict)
    compare_failed = Signal(str)
    compare_finished = Signal()
    # a tool call's record as it goes (kwker.app.tool_calls), and one to approve: the worker
    # waits for approvals.reply(its id, ALLOW_ONCE / ALLOW_ALWAYS / DENY)
    tool_call = Signal(dict)
    approval = Signal(dict)

    def __init__(self):
        super().__init__()
        self._stop = threading.Event()
        self.backend = None
        self.info: dict = {}
        self.host = None  # the window's McpHost: its running servers' tools are offered
        self.approvals = tc.Approvals()
        self.call_timeout = 30.0  # seconds (kwker.app.mcp_host.CALL_TIMEOUT_S; tests shorten it)

    # a local backend's parts, for tests and measurements on the loaded model (None for a server)
    @property
    def decoder(self):
        return getattr(self.backend, "decoder", None)

    @property
    def tokenizer(self):
        return getattr(self.backend, "tokenizer", None)

    @property
    def last_prompt(self) -> list[int]:
        return getattr(self.backend, "last_prompt", [])

    def request_stop(self) -> None:
        """Called from the GUI thread: the running answer ends after the current piece."""
        self._stop.set()

    @Slot(dict)
    def load(self, opts: dict) -> None:
        try:
            # Dropping the reference frees the previous decoders' memory (they hold no reference
            # cycles). No gc.collect() here: a collection on this thread can destroy Qt objects of
            # the GUI thread that sit in garbage cycles, which crashed the process (seen in CI).
            self.backend = None
            self.backend = backend_for(opts).load(opts, self.loading.emit)
            self.info = self.backend.info
            self.loaded.emit(self.info)
        except RemoteError as e:  # a server's refusal, said in words: no traceback to print
            self.load_failed.emit(str(e))
        except Exception as e:  # noqa: BLE001  (any load failure is reported in the window)
            log.exception("%s", e)
            self.load_failed.emit(str(e))

    @Slot(list, dict, int, list)
    def generate(self, messages: list, settings: dict, start: int = 0, documents=()) -> None:
        """Answers messages (role/content dicts) from the window's start so far (see
        kwker.app.context_window), with the conversation's documents ({name, text} dicts; see
        kwker.app.documents)."""
        self._stop.clear()
        if self.backend is None:
            self.failed.emit("no model is loaded")
            return
        answer = None
        try:
            named = tc.offered(self.host.tools()) if self.host is not None else {}
            # the answer being written, as the next round's prompt ends with it
            current = dict(messages[-1]) if messages[-1]["role"] == "assistant" else None
            history = messages[:-1] if current else list(messages)
            current = current or {"role": "assistant", "content": "", "tool_calls": []}
            current["tool_calls"] = list(current.get("tool_calls") or [])
            rounds, limit = 0, tc.TOOL_ROUNDS
            while True:
                asked = history + ([current] if current["content"] or current["tool_calls"] else [])
                tools = tc.functions(named) if named and rounds < limit else None
                answer = self.backend.answer(
                    asked, settings, start, list(documents) if rounds == 0 else [], tools=tools
                )
                if rounds == 0:
                    self.window.emit(answer.start)
                reason = self._stream(answer, current)
                calls = getattr(answer, "tool_calls", [])
                if reason == "stopped" or not calls:
                    break
                if not self._run_calls(calls, named, current):
                    named = {}  # denied: the model answers on without tools
                if self._stop.is_set():
                    reason = "stopped"
                    break
                rounds += 1
            self.finished.emit(reason, answer.stats())
        except RemoteError as e:
            if e.kind == CUT and answer is not None:  # what arrived stays, marked as cut
                self.finished.emit("cut", {**answer.stats(), "error": str(e)})
            else:
                self.failed.emit(str(e))
        except Exception as e:  # noqa: BLE001
            log.exception("%s", e)
            self.failed.emit(str(e))

    def _stream(self, answer, current: dict) -> str:
        """Streams one round of an answer to the window; its finish reason ("stopped": Stop)."""
        for piece in answer:
            if piece.thinking:
                current["thinking"] = current.get("thinking", "") + piece.thinking
                self.thought.emit(piece.thinking)
            current["content"] += piece.text
            self.chunk.emit(piece.text, piece.token, piece.source, piece.stats or {})
            if piece.finish_reason:
                return piece.finish_reason
            if self._stop.is_set():
                answer.close()
                return "stopped"
        return "stopped"

    def _run_calls(self, calls, named: dict, current: dict) -> bool:
        """Asks for and runs a round's calls, each shown as it goes and kept in `current` (the
        answer's message); False when the user denied one (or pressed Stop)."""
        allowed = True
        for call in calls:
            tool = named.get(call.name)
            record = {
                "id": call.id, "server": tool.server if tool else "", "name": call.name,
                "tool": tool.name if tool else call.name, "arguments": _arguments(call.arguments),
                "status": "asking", "result": "", "seconds": 0.0, "at": len(current["content"]),
            }  # fmt: skip
            current["tool_calls"].append(record)
            if tool is None:
                record.update(status="error", result=f"There is no tool named “{call.name}”.")
            elif not allowed:
                record["status"] = "denied"
            else:
                self.tool_call.emit(dict(record))
                self.approvals.open(record["id"])
                self.approval.emit(dict(record))
                if self.approvals.wait(self._stop) == tc.DENY or self._stop.is_set():
                    record["status"], allowed = "denied", False
                else:
                    record["status"] = "running"
                    self.tool_call.emit(dict(record))
                    result = self.host.call(tool.server, tool.name, record["arguments"],
                                            self.call_timeout, self._stop)  # fmt: skip
                    record.update(status=result.status, result=result.text,
                                  seconds=round(result.seconds, 3))  # fmt: skip
            self.tool_call.emit(dict(record))
        return allowed and not self._stop.is_set()

    @Slot(list, dict, int)
    def compare(self, messages: list, settings: dict, start: int = 0) -> None:
        """Answers messages twice, one run after the other: plain decoding (no lookup, no draft),
        then speculation (lookup, and the draft if one is loaded), with the same settings (and so
        the same seed). A local model's only: a server decodes as it does."""
        self._stop.clear()
        try:
            if self.backend is None or self.backend.remote:
                raise RuntimeError("the split view needs a model loaded on this machine")
            runs = ((0, {**settings, "lookup": False}, False), (1, settings, True))
            for column, run_settings, draft in runs:
                answer = self.backend.answer(messages, run_settings, start, draft=draft)
                for piece in answer:
                    self.compare_chunk.emit(column, piece.text, piece.token)
                    if piece.finish_reason:
                        break
                    if self._stop.is_set():
                        answer.close()
                        break
                self.compare_done.emit(column, answer.stats())
                if self._stop.is_set():
                    break
        except Exception as e:  # noqa: BLE001  (said in the split view)
            log.exception("%s", e)
            self.compare_failed.emit(str(e))
        finally:
            self.compare_finished.emit()


def _arguments(text: str) -> dict:
    """A call's arguments (JSON text) as an object: what is not one goes as {"input": text}, for
    the tool to refuse in its own words."""
    try:
        value = json.loads(text or "{}")
    except json.JSONDecodeError:
        return {"input": text}
    return value if isinstance(value, dict) else {"input": value}
